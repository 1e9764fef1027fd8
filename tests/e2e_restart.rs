//! Restarts and upgrades under traffic, with the real rivorad binary run
//! inside the node namespace of a lab (see `common::topology`: NAT and
//! DSR VIPs side by side, IPv4 only).
//!
//! `restart_under_traffic_keeps_every_flow`: 64 long-lived TCP
//! connections (32 through a NAT VIP, 32 through a DSR VIP), each sending
//! a numbered message every 50 ms and reading its echo, and a numbered UDP
//! stream of 2,000 datagrams/s (8 flows, 4 per VIP), while rivorad (with
//! -persist-datapath) is SIGKILLed, started again, stopped with SIGTERM,
//! upgraded to a build whose XDP program differs (`-DRV_BUILD_VARIANT`),
//! SIGKILLed again, and started with a changed file (a VIP removed, one
//! added). Asserted: no TCP connection sees a reset, a timeout or a wrong
//! echo; every connection and every UDP flow stays on one backend; every
//! UDP datagram sent reached a backend (by sequence number, per flow);
//! the service and backend ids of every VIP that stayed are unchanged;
//! the removed VIP was pruned, the added one got a service id no adopted
//! VIP held; the program behind the pinned XDP link changed at every
//! start (and its tag with the variant); a backend down before the
//! restarts was never seen healthy in the maps (sampled every 2 ms), and
//! operator drains (one for every VIP, one for a single VIP) survived.
//! Then `rivorad -cleanup` detaches and removes every pin.
//!
//! `without_persist_clean_exit_detaches_and_start_adopts`: without
//! -persist-datapath a SIGTERM detaches (XDP and TCX gone) and leaves the
//! maps pinned, and the next start adopts them (same ids). Starting without
//! the flag over pinned links takes them over and unpins them. A pinned
//! link whose interface was deleted and recreated is replaced.
//!
//! `incompatible_pins_refuse_to_start_and_touch_nothing`: another layout
//! version in meta_map, another -maglev-size and another -flow-table-size
//! each make rivorad exit non-zero with a message naming the pinned and
//! expected values and the migration, with the pins, the maps and the
//! attached program unchanged; an out-of-range -flow-table-size is refused
//! as a bad flag.
//!
//! The variant build: `RIVORA_VARIANT_RIVORAD` names a prebuilt binary
//! (`make test` builds it); without it the test builds one into
//! target/variant (a debug build of its own, a few minutes on 2 cores).
//!
//! Needs root (namespaces, BPF). Every wait is bounded.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use common::rivorad::{attached, link_prog, rivorad_bin, Home, Rivorad, READY};
use common::topology::{Mode, Topology};
use common::traffic::{long_lived, tcp_once, udp_streams, wait_until, ConnResult, Servers};
use rivora::abi;
use rivora::dataplane::adopt::adopt;
use rivora::dataplane::render::Health;
use rivora::dataplane::{MapStore, Maps};
use rivora::model::{Ports, Protocol, VipKey};

const TCP_CONNS_PER_VIP: usize = 32;
const UDP_FLOWS_PER_VIP: usize = 4;
/// Datagrams per second per VIP (2,000/s in all).
const UDP_RATE_PER_VIP: u64 = 1_000;
const TCP_INTERVAL: Duration = Duration::from_millis(50);
/// A reply later than this is a failure (a gap would show here first).
const TCP_REPLY_TIMEOUT: Duration = Duration::from_secs(3);

/// The variant build of rivorad: prebuilt (RIVORA_VARIANT_RIVORAD) or
/// built once here.
fn variant_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("RIVORA_VARIANT_RIVORAD") {
            let p = PathBuf::from(p);
            assert!(
                p.exists(),
                "RIVORA_VARIANT_RIVORAD={} does not exist",
                p.display()
            );
            return p;
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let target = root.join("target/variant");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .current_dir(&root)
            .env("RIVORA_BPF_CFLAGS", "-DRV_BUILD_VARIANT")
            .args(["build", "--bin", "rivorad", "--target-dir"])
            .arg(&target)
            .status()
            .expect("running cargo for the variant build");
        assert!(st.success(), "building the variant rivorad failed");
        target.join("debug/rivorad")
    })
    .clone()
}

fn vip_key(addr: Ipv4Addr, port: u16, proto: Protocol) -> VipKey {
    VipKey {
        addr: IpAddr::V4(addr),
        ports: Ports::One(port),
        proto,
    }
}

/// Per VIP, what the pinned maps hold: (service id, backend ids sorted).
fn ids_in_maps(pin_dir: &Path) -> BTreeMap<VipKey, (u32, Vec<u32>)> {
    let maps = Maps::open(pin_dir).expect("opening the pinned maps");
    let img = maps.read().expect("reading the maps");
    let a = adopt(&img, maps.table_size());
    a.vips
        .into_iter()
        .filter_map(|v| {
            let mut ids = v.backend_ids.clone();
            ids.sort_unstable();
            v.key.map(|k| (k, (v.svc_id, ids)))
        })
        .collect()
}

/// Backend id of addr:port in the maps, and its health.
fn backend_health(maps: &Maps, addr: Ipv4Addr, port: u16) -> Option<(u32, Health)> {
    let img = maps.read().ok()?;
    let (id, _) = img
        .backends
        .iter()
        .find(|(_, b)| b.addr == IpAddr::V4(addr) && b.port == port)?;
    Some((*id, img.health.get(id).copied().unwrap_or(Health::Down)))
}

/// The lab: NAT and DSR VIPs side by side (`vip(1)` NAT, `vip(2)` DSR,
/// `vip(3)` the health VIP), IPv4 only.
fn lab() -> Topology {
    Topology::builder(Mode::Nat)
        .ipv4_only()
        .dsr_vip_beside_nat()
        .build()
}

struct Cfg<'a> {
    lab: &'a Topology,
    socket: PathBuf,
    /// The VIP removed while rivorad is down.
    doomed: bool,
    /// The VIP added while rivorad is down.
    added: bool,
}

impl Cfg<'_> {
    fn write(&self, path: &Path) {
        let lab = self.lab;
        let nat = lab.vip(1);
        let dsr = lab.vip(2);
        let hc = lab.vip(3);
        let be = |port: Option<u16>, mac: bool| -> String {
            lab.backends
                .iter()
                .map(|b| {
                    let mut s = format!("      - {{ address: {}", b.v4);
                    if let Some(p) = port {
                        s += &format!(", port: {p}");
                    }
                    if mac {
                        s += &format!(", mac: \"{}\"", b.mac_str());
                    }
                    s + " }\n"
                })
                .collect()
        };
        let mut y = format!(
            "interfaces:\n  - name: n0\n    xdpMode: native\napi:\n  socket: {sock}\nvips:\n",
            sock = self.socket.display()
        );
        for proto in ["tcp", "udp"] {
            y += &format!(
                "  - name: nat-{proto}\n    address: {nat}\n    port: 80\n    protocol: {proto}\n    mode: nat\n    healthCheck: false\n    backends:\n{}",
                be(Some(8080), false)
            );
            y += &format!(
                "  - name: dsr-{proto}\n    address: {dsr}\n    port: 80\n    protocol: {proto}\n    mode: dsr\n    healthCheck: false\n    backends:\n{}",
                be(None, true)
            );
        }
        y += &format!(
            "  - name: hc\n    address: {hc}\n    port: 90\n    protocol: tcp\n    mode: nat\n    \
             healthCheck: {{ type: tcp, interval: 200ms, timeout: 150ms, rise: 2, fall: 1 }}\n    backends:\n{}",
            be(Some(9090), false)
        );
        if self.doomed {
            y += &format!(
                "  - name: doomed\n    address: {nat}\n    port: 443\n    protocol: tcp\n    mode: nat\n    healthCheck: false\n    backends:\n{}",
                be(Some(8443), false)
            );
        }
        if self.added {
            y += &format!(
                "  - name: added\n    address: {nat}\n    port: 81\n    protocol: tcp\n    mode: nat\n    healthCheck: false\n    backends:\n{}",
                be(Some(8081), false)
            );
        }
        std::fs::write(path, y).expect("writing the config");
    }
}

/// rivorad's flags beside the home's config, pins and state.
fn flags<'a>(persist: bool, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = Vec::new();
    if persist {
        a.push("-persist-datapath");
    }
    a.extend_from_slice(extra);
    a
}

/// Start `bin` and wait until it is ready.
fn run(rd: &mut Rivorad, bin: &Path, persist: bool, extra: &[&str]) {
    rd.spawn(bin, &flags(persist, extra));
    rd.wait_ready(READY);
}

// ---- backends' servers and the client ---------------------------------

fn start_servers(lab: &Topology) -> Servers {
    let mut s = Servers::new();
    for (i, b) in lab.backends.iter().enumerate() {
        // NAT on 8080 (and the added VIP's 8081), DSR on 80; the health
        // VIP's 9090 everywhere but on b2, which its probe finds down.
        let mut tcp_ports = vec![8080u16, 8081, 80];
        if i != 1 {
            tcp_ports.push(9090);
        }
        for port in tcp_ports {
            s.tcp(&b.ns, &b.name, SocketAddr::from(([0, 0, 0, 0], port)));
        }
        for port in [8080u16, 80] {
            s.udp_sink(&b.ns, &b.name, SocketAddr::from(([0, 0, 0, 0], port)));
        }
    }
    s
}

struct Client {
    stop: Arc<AtomicBool>,
    tcp: Vec<JoinHandle<ConnResult>>,
    udp: Vec<JoinHandle<Vec<u64>>>,
    echoed: Arc<AtomicU64>,
    udp_sent: Arc<AtomicU64>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn start_client(lab: &Topology) -> Client {
    let stop = Arc::new(AtomicBool::new(false));
    let echoed = Arc::new(AtomicU64::new(0));
    let udp_sent = Arc::new(AtomicU64::new(0));
    let mut tcp = Vec::new();
    for vip in [lab.vip(1), lab.vip(2)] {
        for _ in 0..TCP_CONNS_PER_VIP {
            let ll = long_lived(
                &lab.client,
                SocketAddr::from((vip, 80)),
                TCP_INTERVAL,
                TCP_REPLY_TIMEOUT,
                stop.clone(),
                echoed.clone(),
            );
            tcp.push(ll.handle);
        }
    }
    let mut udp = Vec::new();
    for (i, vip) in [lab.vip(1), lab.vip(2)].into_iter().enumerate() {
        udp.push(udp_streams(
            &lab.client,
            SocketAddr::from((vip, 80)),
            (i * UDP_FLOWS_PER_VIP) as u32,
            UDP_FLOWS_PER_VIP,
            UDP_RATE_PER_VIP,
            stop.clone(),
            udp_sent.clone(),
        ));
    }
    Client {
        stop,
        tcp,
        udp,
        echoed,
        udp_sent,
    }
}

/// Traffic keeps flowing: both counters grow within a second.
fn assert_flowing(c: &Client, servers: &Servers, when: &str) {
    let (e0, u0) = (
        c.echoed.load(Ordering::Relaxed),
        servers.udp_log.lock().expect("udp log").total,
    );
    std::thread::sleep(Duration::from_millis(500));
    let (e1, u1) = (
        c.echoed.load(Ordering::Relaxed),
        servers.udp_log.lock().expect("udp log").total,
    );
    assert!(e1 > e0 + 100, "{when}: TCP echoes stalled ({e0} -> {e1})");
    assert!(u1 > u0 + 500, "{when}: UDP arrivals stalled ({u0} -> {u1})");
}

/// Samples a backend's health in the maps until stopped; returns every
/// state seen.
fn sample_health(
    pin_dir: PathBuf,
    addr: Ipv4Addr,
    port: u16,
    stop: Arc<AtomicBool>,
) -> JoinHandle<BTreeMap<&'static str, u64>> {
    std::thread::spawn(move || {
        let maps = Maps::open(&pin_dir).expect("opening the maps");
        let mut seen = BTreeMap::new();
        while !stop.load(Ordering::Relaxed) {
            let h = backend_health(&maps, addr, port).map_or("absent", |(_, h)| h.name());
            *seen.entry(h).or_insert(0) += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        seen
    })
}

#[test]
fn restart_under_traffic_keeps_every_flow() {
    common::require::root_and_tools("e2e_restart");
    let variant = variant_bin();
    let lab = lab();
    let mut d = Rivorad::new(&lab.node, Home::new());
    let cfg = d.home.config();
    let pins = d.home.pin_dir().to_path_buf();
    Cfg {
        lab: &lab,
        socket: d.home.socket(),
        doomed: true,
        added: false,
    }
    .write(&cfg);
    let servers = start_servers(&lab);
    let xdp_pin = pins.join("links/xdp_n0");
    let b = |i: usize| lab.backends[i].v4;

    // 1. First start: pins maps and links.
    run(&mut d, &rivorad_bin(), true, &[]);
    let (prog1, tag1) = link_prog(&xdp_pin).expect("a pinned XDP link after the first start");

    // The health VIP: b2 has no listener on 9090, its probe takes it down.
    let maps = Maps::open(&pins).expect("maps");
    wait_until("b2:9090 down", Duration::from_secs(10), || {
        matches!(backend_health(&maps, b(1), 9090), Some((_, Health::Down)))
    });
    // Operator drains: b3:9090 everywhere, b1:9090 for the health VIP only.
    let hc_vip = format!("tcp/{}:90", lab.vip(3));
    d.ctl_ok(&["drain", &format!("{}:9090", b(2))]);
    d.ctl_ok(&["drain", &format!("{}:9090", b(0)), "--vip", &hc_vip]);
    assert!(matches!(
        backend_health(&maps, b(2), 9090),
        Some((_, Health::Draining))
    ));

    let mut client = start_client(&lab);
    wait_until(
        "every TCP connection to echo",
        Duration::from_secs(10),
        || client.echoed.load(Ordering::Relaxed) >= (2 * TCP_CONNS_PER_VIP) as u64 * 3,
    );
    assert_flowing(&client, &servers, "first start");
    let before = ids_in_maps(&pins);
    let doomed = vip_key(lab.vip(1), 443, Protocol::Tcp);
    assert!(before.contains_key(&doomed), "doomed VIP programmed");
    assert_eq!(before.len(), 6, "six VIPs in the maps: {before:?}");

    let sampler_stop = Arc::new(AtomicBool::new(false));
    let down_sampler = sample_health(pins.clone(), b(1), 9090, sampler_stop.clone());
    let drain_sampler = sample_health(pins.clone(), b(2), 9090, sampler_stop.clone());

    // 2. SIGKILL: the datapath keeps forwarding with nobody home.
    let st = d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    assert!(!st.success());
    assert_flowing(&client, &servers, "rivorad SIGKILLed");

    // 3. Start again (same build): adopts, swaps the program in place.
    run(&mut d, &rivorad_bin(), true, &[]);
    let (prog2, tag2) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_ne!(prog2, prog1, "the second start swapped its own program in");
    assert_eq!(tag2, tag1, "same build, same instructions");
    assert!(d.log_text().contains("took over the pinned link"));
    assert_eq!(ids_in_maps(&pins), before, "ids after SIGKILL + start");
    assert_flowing(&client, &servers, "after the second start");

    // 4. SIGTERM with -persist-datapath detaches nothing.
    let st = d.stop_with(libc::SIGTERM, Duration::from_secs(10));
    assert!(st.success(), "clean exit: {st}\n{}", d.log_text());
    assert_eq!(
        attached(&lab.node, "n0"),
        (true, 1),
        "still attached after SIGTERM"
    );
    assert_flowing(&client, &servers, "rivorad stopped with SIGTERM");

    // 5. Upgrade to a build whose XDP program differs.
    run(&mut d, &variant, true, &[]);
    let (prog3, tag3) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_ne!(prog3, prog2);
    assert_ne!(tag3, tag1, "the variant build runs different instructions");
    assert_eq!(ids_in_maps(&pins), before, "ids after the upgrade");
    assert_flowing(&client, &servers, "after the upgrade");

    // 6. SIGKILL, change the file while rivorad is down (a VIP removed,
    //    one added), start the default build again.
    let st = d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    assert!(!st.success());
    Cfg {
        lab: &lab,
        socket: d.home.socket(),
        doomed: false,
        added: true,
    }
    .write(&cfg);
    run(&mut d, &rivorad_bin(), true, &[]);
    let (_, tag4) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_eq!(tag4, tag1, "back on the default build");
    let after = ids_in_maps(&pins);
    let added = vip_key(lab.vip(1), 81, Protocol::Tcp);
    assert!(!after.contains_key(&doomed), "the removed VIP was pruned");
    let (added_id, _) = after
        .get(&added)
        .expect("the added VIP is programmed")
        .clone();
    let adopted_ids: BTreeSet<u32> = before.values().map(|(id, _)| *id).collect();
    assert!(
        !adopted_ids.contains(&added_id),
        "added VIP got service id {added_id}, held by an adopted VIP ({adopted_ids:?})"
    );
    for (k, v) in &before {
        if *k != doomed {
            assert_eq!(after.get(k), Some(v), "ids of {k} after the config change");
        }
    }
    // The added VIP forwards.
    let added_vip = lab.vip(1);
    let hit = lab
        .client
        .run(move || tcp_once(SocketAddr::from((added_vip, 81)), TCP_REPLY_TIMEOUT))
        .unwrap_or_else(|e| panic!("echo through the added VIP: {e}"));
    assert!(
        hit.backend.starts_with('b'),
        "echo through the added VIP: {hit:?}"
    );
    assert_flowing(&client, &servers, "after the config change");

    // Health and drains survived all of it.
    sampler_stop.store(true, Ordering::Relaxed);
    let down_seen = down_sampler.join().expect("sampler");
    let drain_seen = drain_sampler.join().expect("sampler");
    assert_eq!(
        down_seen.keys().copied().collect::<Vec<_>>(),
        vec!["down"],
        "b2:9090 must stay down across the restarts: {down_seen:?}"
    );
    assert_eq!(
        drain_seen.keys().copied().collect::<Vec<_>>(),
        vec!["draining"],
        "b3:9090 must stay drained across the restarts: {drain_seen:?}"
    );
    let vips: Vec<rivora::api::VipInfo> =
        serde_json::from_str(&d.ctl_ok(&["-o", "json", "vip", "list"])).expect("vip list");
    let hc = vips
        .iter()
        .find(|v| v.vip == hc_vip)
        .expect("the health VIP");
    let drained: BTreeSet<String> = hc
        .backends
        .iter()
        .filter(|x| x.drained)
        .map(|x| x.target.to_string())
        .collect();
    assert_eq!(
        drained,
        [format!("{}:9090", b(0)), format!("{}:9090", b(2))]
            .into_iter()
            .collect(),
        "drains as the API reports them after the restarts"
    );
    let b1 = hc
        .backends
        .iter()
        .find(|x| x.target == SocketAddr::from((b(0), 9090)))
        .expect("b1:9090 listed");
    assert_eq!(b1.weight, 0, "the per-VIP drain is weight 0 again");

    // 7. Stop the traffic and count.
    client.stop.store(true, Ordering::Relaxed);
    let mut conns = Vec::new();
    for h in std::mem::take(&mut client.tcp) {
        conns.push(h.join().expect("tcp client thread"));
    }
    let mut sent = Vec::new();
    for h in std::mem::take(&mut client.udp) {
        sent.extend(h.join().expect("udp client thread"));
    }
    std::thread::sleep(Duration::from_millis(500));
    let errors: Vec<String> = conns
        .iter()
        .filter_map(|c| c.error.as_ref().map(|e| format!("{}: {e}", c.vip)))
        .collect();
    assert!(errors.is_empty(), "TCP connections failed: {errors:?}");
    for c in &conns {
        assert_eq!(c.backends.len(), 1, "a connection moved: {c:?}");
        assert!(c.echoed >= 20, "a connection barely ran: {c:?}");
    }
    let log = servers.udp_log.lock().expect("udp log");
    let total_sent: u64 = sent.iter().sum();
    let mut lost = 0u64;
    for (flow, n) in sent.iter().enumerate() {
        let (backends, seen) = log
            .flows
            .get(&(flow as u32))
            .unwrap_or_else(|| panic!("UDP flow {flow} never arrived"));
        assert_eq!(backends.len(), 1, "UDP flow {flow} moved: {backends:?}");
        let missing: Vec<usize> = (0..*n as usize)
            .filter(|&s| !seen.get(s).copied().unwrap_or(false))
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "flow {flow}: {} of {n} missing, first {:?}",
                missing.len(),
                &missing[..missing.len().min(10)]
            );
        }
        lost += missing.len() as u64;
    }
    eprintln!(
        "{} TCP connections, {} echoes; {total_sent} UDP datagrams sent, {lost} lost",
        conns.len(),
        conns.iter().map(|c| c.echoed).sum::<u64>()
    );
    assert_eq!(
        total_sent,
        client.udp_sent.load(Ordering::Relaxed),
        "per-flow and total send counts agree"
    );
    assert_eq!(lost, 0, "UDP datagrams lost across the restarts");
    drop(log);

    // 8. Uninstall: -cleanup detaches and removes every pin.
    let st = d.stop_with(libc::SIGTERM, Duration::from_secs(10));
    assert!(st.success());
    assert_eq!(attached(&lab.node, "n0"), (true, 1));
    // `rivorad -cleanup` succeeds and removes every pin; the state
    // directory holds nothing else than the drain file.
    d.home.assert_no_leftovers(&lab.node);
    assert_eq!(
        attached(&lab.node, "n0"),
        (false, 0),
        "links detached by -cleanup"
    );
    drop(maps);
    drop(servers);
}

/// Starts `bin` and expects it to refuse: non-zero exit, stderr returned.
fn start_expect_refusal(d: &mut Rivorad, extra: &[&str]) -> String {
    d.spawn(&rivorad_bin(), &flags(true, extra));
    let st = d.wait_exit(READY);
    assert!(!st.success(), "rivorad should refuse:\n{}", d.log_text());
    d.log_text()
}

/// Per VIP: (service id, backend ids sorted).
type Ids = BTreeMap<VipKey, (u32, Vec<u32>)>;

/// The pins' names, the program behind the XDP link and the ids: what
/// "touching nothing" is checked against.
type Snapshot = (Vec<String>, Option<(u32, String)>, Ids);

fn pin_snapshot(pins: &Path) -> Snapshot {
    let mut names: Vec<String> = walk(pins);
    names.sort();
    (
        names,
        link_prog(&pins.join("links/xdp_n0")),
        ids_in_maps(pins),
    )
}

fn walk(p: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            out.push(path.display().to_string());
            if path.is_dir() {
                out.extend(walk(&path));
            }
        }
    }
    out
}

#[test]
fn incompatible_pins_refuse_to_start_and_touch_nothing() {
    common::require::root_and_tools("e2e_restart");
    let lab = lab();
    let mut d = Rivorad::new(&lab.node, Home::new());
    let cfg = d.home.config();
    let pins = d.home.pin_dir().to_path_buf();
    Cfg {
        lab: &lab,
        socket: d.home.socket(),
        doomed: false,
        added: false,
    }
    .write(&cfg);
    run(&mut d, &rivorad_bin(), true, &[]);
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    let snap = pin_snapshot(&pins);
    assert!(snap.1.is_some(), "a pinned XDP link");

    // Another layout version in meta_map.
    let maps = Maps::open(&pins).expect("maps");
    let meta: abi::rv_meta = maps
        .meta_map
        .get(&0u32)
        .expect("meta_map")
        .expect("meta entry");
    let mut future = meta;
    future.abi_version = abi::ABI_VERSION + 1;
    maps.meta_map.put(&0u32, &future).expect("writing meta_map");
    let err = start_expect_refusal(&mut d, &[]);
    let (pinned, ours) = (
        format!("layout version {}", abi::ABI_VERSION + 1),
        format!("expects version {}", abi::ABI_VERSION),
    );
    assert!(
        err.contains(&pinned) && err.contains(&ours) && err.contains("rivorad -cleanup"),
        "the refusal names both versions and the migration:\n{err}"
    );
    let got: abi::rv_meta = maps.meta_map.get(&0u32).expect("meta").expect("meta");
    assert_eq!(got.abi_version, abi::ABI_VERSION + 1, "meta_map untouched");
    assert_eq!(pin_snapshot(&pins), snap, "pins, program and ids untouched");
    maps.meta_map.put(&0u32, &meta).expect("restoring meta_map");

    // Another Maglev table size: libbpf would say "parameter mismatch".
    let err = start_expect_refusal(&mut d, &["-maglev-size", "131071"]);
    assert!(
        err.contains("maglev_table")
            && err.contains(&format!("-maglev-size {}", abi::MAGLEV_DEFAULT_SIZE))
            && err.contains("131071")
            && err.contains("rivorad -cleanup"),
        "the refusal names the map, both sizes and the migration:\n{err}"
    );
    assert_eq!(pin_snapshot(&pins), snap, "pins, program and ids untouched");
    assert_eq!(attached(&lab.node, "n0"), (true, 1), "still attached");

    // Another flow table size: the same refusal, naming the first flow
    // table it meets. The pinned size is the kernel's figure.
    let pinned = maps.connection_affinity_map.max_entries();
    let err = start_expect_refusal(&mut d, &["-flow-table-size", "65536"]);
    assert!(
        err.contains(&format!(
            "pinned map connection_affinity_map has max entries {pinned}"
        )) && err.contains("expects 65536")
            && err.contains(&format!("-flow-table-size {pinned}"))
            && err.contains("rivorad -cleanup"),
        "the refusal names the map, both sizes and the migration:\n{err}"
    );
    let bad = start_expect_refusal(&mut d, &["-flow-table-size", "100"]);
    assert!(
        bad.contains("--flow-table-size") && bad.contains("4096") && bad.contains("16777216"),
        "a size out of range is a bad flag:\n{bad}"
    );
    assert_eq!(pin_snapshot(&pins), snap, "pins, program and ids untouched");
    let again = Maps::open(&pins).expect("maps");
    assert_eq!(
        again.connection_affinity_map.max_entries(),
        pinned,
        "flow tables keep their size"
    );
    assert_eq!(attached(&lab.node, "n0"), (true, 1), "still attached");

    // And the original build still starts over them.
    run(&mut d, &rivorad_bin(), true, &[]);
    assert_eq!(ids_in_maps(&pins), snap.2);
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
}

#[test]
fn without_persist_clean_exit_detaches_and_start_adopts() {
    common::require::root_and_tools("e2e_restart");
    let lab = lab();
    let mut d = Rivorad::new(&lab.node, Home::new());
    let cfg = d.home.config();
    let pins = d.home.pin_dir().to_path_buf();
    Cfg {
        lab: &lab,
        socket: d.home.socket(),
        doomed: false,
        added: false,
    }
    .write(&cfg);
    // Without the flag: a clean exit detaches, the maps stay.
    run(&mut d, &rivorad_bin(), false, &[]);
    assert_eq!(attached(&lab.node, "n0"), (true, 1));
    assert!(!pins.join("links").join("xdp_n0").exists());
    let ids = ids_in_maps(&pins);
    assert_eq!(ids.len(), 5);
    assert!(d
        .stop_with(libc::SIGTERM, Duration::from_secs(10))
        .success());
    assert_eq!(
        attached(&lab.node, "n0"),
        (false, 0),
        "detached on a clean exit"
    );
    assert!(pins.join("vip_map").exists(), "maps stay pinned");
    // The next start adopts.
    run(&mut d, &rivorad_bin(), false, &[]);
    assert_eq!(ids_in_maps(&pins), ids, "adopted ids");
    assert!(d
        .stop_with(libc::SIGTERM, Duration::from_secs(10))
        .success());

    // With the flag, then without: the second start takes the pinned
    // links over (no gap) and unpins them, so its exit detaches.
    run(&mut d, &rivorad_bin(), true, &[]);
    let xdp_pin = pins.join("links/xdp_n0");
    let (p1, _) = link_prog(&xdp_pin).expect("pinned link");
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    assert_eq!(
        attached(&lab.node, "n0"),
        (true, 1),
        "pinned links outlive SIGKILL"
    );
    run(&mut d, &rivorad_bin(), false, &[]);
    assert!(!xdp_pin.exists(), "unpinned by a start without the flag");
    assert!(!pins.join("links/tcx_n0").exists());
    assert_eq!(
        attached(&lab.node, "n0"),
        (true, 1),
        "one program each, not two"
    );
    assert!(d
        .log_text()
        .contains("took over a pinned link and unpinned it"));
    assert!(d
        .stop_with(libc::SIGTERM, Duration::from_secs(10))
        .success());
    assert_eq!(attached(&lab.node, "n0"), (false, 0));
    let _ = p1;

    // A stale pinned link: its interface deleted and recreated under the
    // same name while rivorad was down (a second interface, s0, so the
    // lab's own n0 stays).
    lab.node
        .exec("ip link add s0 type veth peer name s1 && ip link set s0 up && ip link set s1 up");
    // The file lists s0 too while rivorad 5 and 6 run; the original
    // comes back for the last start.
    let text = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(
        &cfg,
        text.replacen(
            "  - name: n0\n    xdpMode: native\n",
            "  - name: n0\n    xdpMode: native\n  - name: s0\n    xdpMode: native\n",
            1,
        ),
    )
    .expect("config");
    run(&mut d, &rivorad_bin(), true, &[]);
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    lab.node.exec(
        "ip link del s0 && ip link add s0 type veth peer name s1 && ip link set s0 up && ip link set s1 up",
    );
    assert_eq!(
        attached(&lab.node, "s0"),
        (false, 0),
        "a new s0 has nothing"
    );
    run(&mut d, &rivorad_bin(), true, &[]);
    assert!(
        d.log_text().contains("stale pinned link"),
        "{}",
        d.log_text()
    );
    assert_eq!(attached(&lab.node, "s0"), (true, 1), "attached anew");
    assert_eq!(attached(&lab.node, "n0"), (true, 1));
    // Dropping s0 from the file detaches its pinned links at the next start.
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    std::fs::write(&cfg, &text).expect("config");
    run(&mut d, &rivorad_bin(), true, &[]);
    assert_eq!(
        attached(&lab.node, "s0"),
        (false, 0),
        "unlisted interface detached"
    );
    assert!(!pins.join("links/xdp_s0").exists());
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
}
