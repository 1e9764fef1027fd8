//! Restarts and upgrades under traffic, with the real rivorad binary run
//! inside the node namespace of a lab (see `common::topology`: NAT, DSR
//! and L3 DSR VIPs side by side, IPv4 and IPv6).
//!
//! The traffic ([`Client`]), per lane (each mode over each family: one TCP
//! and one UDP VIP on port 80): 8 long-lived TCP connections, each sending
//! a numbered message every 50 ms and reading its echo, and 4 numbered UDP
//! flows at 400 datagrams/s. At the end of a window ([`Client::finish`]):
//! no TCP connection saw a reset, a timeout or a wrong echo; every
//! connection and every UDP flow stayed on one backend; every UDP datagram
//! sent reached a backend (by sequence number, per flow).
//!
//! `restart_under_traffic_keeps_every_flow`: under one window, rivorad
//! (with -persist-datapath) is SIGKILLed, started again, stopped with
//! SIGTERM, upgraded to a build whose XDP program differs
//! (`-DRV_BUILD_VARIANT`), SIGKILLed again, and started with a changed file
//! (a VIP removed, one added). Also asserted: the service and backend ids
//! of every VIP that stayed are unchanged; the removed VIP was pruned, the
//! added one got a service id no adopted VIP held; the program behind the
//! pinned XDP link changed at every start (and its tag with the variant);
//! a backend down before the restarts was never seen healthy in the maps
//! (sampled every 2 ms), and operator drains (one for every VIP, one for a
//! single VIP) survived. Then `rivorad -cleanup` detaches and removes
//! every pin.
//!
//! `without_persist_clean_exit_detaches_and_start_adopts`: without
//! -persist-datapath a SIGTERM detaches (XDP and TCX gone) and leaves the
//! maps pinned, and the next start adopts them (same ids). A SIGKILL
//! detaches too (nothing pinned the links: they go with the process), and
//! the next start adopts the maps and attaches: a new window of traffic
//! flows without a loss. Starting without the flag over pinned links takes
//! them over under a window of traffic (no loss: no gap), swaps its own
//! program in behind them and unpins them. A pinned link whose interface
//! was deleted and recreated is replaced.
//!
//! `xdp_modes_generic_and_auto`: `xdpMode: generic` and `auto` on the
//! veth attach, the API and the kernel agree on the mode used (generic;
//! native for auto, veth has a driver mode), and a window of traffic
//! through every lane loses nothing.
//!
//! `incompatible_pins_refuse_to_start_and_touch_nothing`: another layout
//! version in meta_map, another -maglev-size and another -flow-table-size
//! each make rivorad exit non-zero with a message naming the pinned and
//! expected values and the migration, with the pins, the maps and the
//! attached program unchanged; an out-of-range -flow-table-size is refused
//! as a bad flag.
//!
//! `layout_2_pins_upgraded_under_traffic`: rivorad (with
//! -persist-datapath) is SIGKILLed under a window of traffic, its pins
//! are turned into what a layout 2 rivorad leaves
//! (`common::layouts::downgrade_to_v2`: the maps layout 3 added unpinned,
//! drop_stats_map pinned again at layout 2's size, meta_map saying 2; the
//! program behind the link runs on), and this build starts over them with
//! a file that adds a backend to every lane, so that only the affinity
//! entries keep the flows the Maglev table now sends elsewhere. The window
//! ends with no loss, no reset and no connection moved; meta_map says this
//! build's version, the pins are layout 2's and `ADDED_IN_V3`, every map
//! not replaced is the same kernel map, the link runs the new program and
//! every VIP kept its service and backend ids. (Not a layout 2 binary: the
//! program behind the link before the start is this build's; what a
//! layout 2 one held is in the kept maps, checked entry by entry in
//! tests/packets/abi_upgrade.rs.)
//!
//! The variant build: `RIVORA_VARIANT_RIVORAD` names a prebuilt binary
//! (`make test` builds it); without it the test builds one into
//! target/variant (a debug build of its own, a few minutes on 2 cores).
//!
//! Needs root (namespaces, BPF). Every wait is bounded.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::layouts;
use common::netns::Netns;
use common::rivorad::{attached, link_prog, rivorad_bin, variant_bin, Home, Rivorad, READY};
use common::topology::{Mode, Topology, NAT_BACKEND_PORT, VIP_PORT};
use common::traffic::{
    long_lived, tcp_once, udp_streams, wait_for, wait_until, ConnResult, Servers,
};
use rivora::abi;
use rivora::dataplane::adopt::adopt;
use rivora::dataplane::attach::ifindex;
use rivora::dataplane::loader::{ADDED_IN_V3, ADDED_IN_V4, REPLACED_IN_V3};
use rivora::dataplane::render::Health;
use rivora::dataplane::{MapStore, Maps};
use rivora::model::{Ports, Protocol, VipKey};

const TCP_CONNS_PER_VIP: usize = 8;
const UDP_FLOWS_PER_VIP: usize = 4;
/// Datagrams per second per UDP VIP (2,400/s over the six lanes).
const UDP_RATE_PER_VIP: u64 = 400;
const TCP_INTERVAL: Duration = Duration::from_millis(50);
/// A reply later than this is a failure (a gap would show here first).
const TCP_REPLY_TIMEOUT: Duration = Duration::from_secs(3);
/// Echoes every connection must have had by the end of a window: it ran
/// through the window, not only at its start.
const MIN_ECHOES: u64 = 5;
/// What "traffic flows" waits for, per lane: this many more echoes (twice
/// MIN_ECHOES rounds of every connection: about half a second) and
/// datagrams.
const FLOWING_ECHOES: u64 = 2 * MIN_ECHOES * TCP_CONNS_PER_VIP as u64;
const FLOWING_DATAGRAMS: u64 = 100;
/// Bound on any wait for traffic: far above the few hundred milliseconds
/// it takes, so that only a stall fails it.
const TRAFFIC_WAIT: Duration = Duration::from_secs(10);
/// Ports on the backends: NAT VIPs translate to NAT_BACKEND_PORT, the
/// added VIP to ADDED_PORT, the health VIP to HC_PORT; DSR and L3 DSR
/// keep the VIP's port.
const ADDED_PORT: u16 = 8081;
const HC_PORT: u16 = 9090;

/// One mode over one family: a TCP and a UDP VIP on `VIP_PORT` at
/// `vip(last)` or `vip6_at(last)` (the lab puts NAT, DSR and L3 DSR at 1,
/// 2 and 3).
#[derive(Debug, Clone, Copy)]
struct Lane {
    mode: &'static str,
    v6: bool,
    last: u8,
}

const LANES: [Lane; 6] = [
    Lane {
        mode: "nat",
        v6: false,
        last: 1,
    },
    Lane {
        mode: "nat",
        v6: true,
        last: 1,
    },
    Lane {
        mode: "dsr",
        v6: false,
        last: 2,
    },
    Lane {
        mode: "dsr",
        v6: true,
        last: 2,
    },
    Lane {
        mode: "l3dsr",
        v6: false,
        last: 3,
    },
    Lane {
        mode: "l3dsr",
        v6: true,
        last: 3,
    },
];

impl Lane {
    fn name(&self) -> String {
        format!("{}{}", self.mode, if self.v6 { 6 } else { 4 })
    }

    fn addr(&self, lab: &Topology) -> IpAddr {
        if self.v6 {
            IpAddr::V6(lab.vip6_at(u16::from(self.last)))
        } else {
            IpAddr::V4(lab.vip(self.last))
        }
    }

    fn vip(&self, lab: &Topology) -> SocketAddr {
        SocketAddr::new(self.addr(lab), VIP_PORT)
    }
}

/// Every VIP of the file: the lanes' TCP and UDP VIPs and the health VIP.
const VIPS: usize = 2 * LANES.len() + 1;

fn vip_key(addr: IpAddr, port: u16, proto: Protocol) -> VipKey {
    VipKey {
        addr,
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

/// The id of the program attached at XDP on `dev` in `ns` (0: none), as
/// the kernel reports it: a link that is no longer pinned is still seen.
fn xdp_prog_on(ns: &Netns, dev: &'static str) -> u32 {
    ns.run(move || {
        let idx = ifindex(dev).expect("interface in the namespace");
        let mut id = 0u32;
        // SAFETY: plain query with a valid out pointer.
        let rc = unsafe { libbpf_sys::bpf_xdp_query_id(idx as i32, 0, &mut id) };
        assert_eq!(rc, 0, "bpf_xdp_query_id on {dev}: {rc}");
        id
    })
}

/// The mode the kernel says XDP on `dev` in `ns` is attached in.
fn kernel_xdp_mode(ns: &Netns, dev: &'static str) -> &'static str {
    ns.run(move || {
        let idx = ifindex(dev).expect("interface in the namespace");
        // SAFETY: zeroed opts with sz set is libbpf's convention.
        let mut opts: libbpf_sys::bpf_xdp_query_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<libbpf_sys::bpf_xdp_query_opts>() as _;
        // SAFETY: valid opts; the return is 0 or -errno.
        let rc = unsafe { libbpf_sys::bpf_xdp_query(idx as i32, 0, &mut opts) };
        assert_eq!(rc, 0, "bpf_xdp_query on {dev}: {rc}");
        match u32::from(opts.attach_mode) {
            libbpf_sys::XDP_ATTACHED_DRV => "native",
            libbpf_sys::XDP_ATTACHED_SKB => "generic",
            libbpf_sys::XDP_ATTACHED_NONE => "none",
            _ => "other",
        }
    })
}

/// The lab: NAT, DSR and L3 DSR VIPs side by side, both families.
fn lab() -> Topology {
    Topology::builder(Mode::Nat).dsr_vips_beside_nat().build()
}

/// An address as the YAML file writes it (IPv6 quoted).
fn yaml_addr(a: IpAddr) -> String {
    match a {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("\"{a}\""),
    }
}

struct Cfg<'a> {
    lab: &'a Topology,
    socket: PathBuf,
    xdp_mode: &'static str,
    /// The VIP removed while rivorad is down.
    doomed: bool,
    /// The VIP added while rivorad is down.
    added: bool,
    /// How many of the lab's backends the lanes' VIPs list (the first
    /// ones).
    lane_backends: usize,
}

impl<'a> Cfg<'a> {
    fn new(lab: &'a Topology, home: &Home) -> Self {
        Self {
            lab,
            socket: home.socket(),
            xdp_mode: "native",
            doomed: false,
            added: false,
            lane_backends: lab.backends.len(),
        }
    }

    fn write(&self, path: &Path) {
        let lab = self.lab;
        let be_n = |n: usize, v6: bool, port: Option<u16>, mac: bool| -> String {
            lab.backends
                .iter()
                .take(n)
                .map(|b| {
                    let a = if v6 {
                        IpAddr::V6(b.v6)
                    } else {
                        IpAddr::V4(b.v4)
                    };
                    let mut s = format!("      - {{ address: {}", yaml_addr(a));
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
        let be = |v6: bool, port: Option<u16>, mac: bool| be_n(lab.backends.len(), v6, port, mac);
        let vip = |name: &str, addr: IpAddr, port: u16, proto: &str, mode: &str| {
            format!(
                "  - name: {name}\n    address: {}\n    port: {port}\n    protocol: {proto}\n    \
                 mode: {mode}\n",
                yaml_addr(addr)
            )
        };
        let mut y = format!(
            "interfaces:\n  - name: n0\n    xdpMode: {}\n\
             node:\n  tunnelSource: {{ ipv4: {}, ipv6: \"{}\" }}\n\
             api:\n  socket: {}\nvips:\n",
            self.xdp_mode,
            lab.node_v4,
            lab.node_v6,
            self.socket.display()
        );
        for lane in LANES {
            let (port, mac) = match lane.mode {
                "nat" => (Some(NAT_BACKEND_PORT), false),
                "dsr" => (None, true),
                _ => (None, false),
            };
            for proto in ["tcp", "udp"] {
                let name = format!("{}-{proto}", lane.name());
                y += &vip(&name, lane.addr(lab), VIP_PORT, proto, lane.mode);
                y += "    healthCheck: false\n    backends:\n";
                y += &be_n(self.lane_backends, lane.v6, port, mac);
            }
        }
        y += &vip("hc", IpAddr::V4(lab.vip(4)), 90, "tcp", "nat");
        y += "    healthCheck: { type: tcp, interval: 200ms, timeout: 150ms, rise: 2, fall: 1 }\n    \
              backends:\n";
        y += &be(false, Some(HC_PORT), false);
        let v1 = IpAddr::V4(lab.vip(1));
        if self.doomed {
            y += &vip("doomed", v1, 443, "tcp", "nat");
            y += "    healthCheck: false\n    backends:\n";
            y += &be(false, Some(8443), false);
        }
        if self.added {
            y += &vip("added", v1, 81, "tcp", "nat");
            y += "    healthCheck: false\n    backends:\n";
            y += &be(false, Some(ADDED_PORT), false);
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

/// Dual-stack servers on every backend: TCP lines on the NAT port, the
/// added VIP's port and the VIP port (DSR, L3 DSR); the health VIP's port
/// everywhere but on b2, which its probe finds down; UDP sinks on the NAT
/// port and the VIP port.
fn start_servers(lab: &Topology) -> Servers {
    let any = |port| SocketAddr::from(([0u16; 8], port));
    let mut s = Servers::new();
    for (i, b) in lab.backends.iter().enumerate() {
        let mut tcp_ports = vec![NAT_BACKEND_PORT, ADDED_PORT, VIP_PORT];
        if i != 1 {
            tcp_ports.push(HC_PORT);
        }
        for port in tcp_ports {
            s.tcp(&b.ns, &b.name, any(port));
        }
        for port in [NAT_BACKEND_PORT, VIP_PORT] {
            s.udp_sink(&b.ns, &b.name, any(port));
        }
    }
    s
}

/// One window of traffic through every lane; see the module doc.
struct Client {
    stop: Arc<AtomicBool>,
    /// (lane, first answer's backend, the connection).
    tcp: Vec<(
        usize,
        std::sync::mpsc::Receiver<String>,
        JoinHandle<ConnResult>,
    )>,
    /// (lane, the lane's UDP flows).
    udp: Vec<(usize, JoinHandle<Vec<u64>>)>,
    /// Echoes per lane.
    echoed: Vec<Arc<AtomicU64>>,
    /// UDP flow ids start here (lane i's follow lane i - 1's): each
    /// window in a test its own, as the servers' log is shared.
    first_flow: u32,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Client {
    /// Start the window and wait until every connection had its first
    /// answer.
    fn start(lab: &Topology, first_flow: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut c = Client {
            stop: stop.clone(),
            tcp: Vec::new(),
            udp: Vec::new(),
            echoed: Vec::new(),
            first_flow,
        };
        for (i, lane) in LANES.iter().enumerate() {
            let echoed = Arc::new(AtomicU64::new(0));
            for _ in 0..TCP_CONNS_PER_VIP {
                let ll = long_lived(
                    &lab.client,
                    lane.vip(lab),
                    TCP_INTERVAL,
                    TCP_REPLY_TIMEOUT,
                    stop.clone(),
                    echoed.clone(),
                );
                c.tcp.push((i, ll.first, ll.handle));
            }
            c.echoed.push(echoed);
            let flows = c.flows(i);
            c.udp.push((
                i,
                udp_streams(
                    &lab.client,
                    lane.vip(lab),
                    flows.start,
                    UDP_FLOWS_PER_VIP,
                    UDP_RATE_PER_VIP,
                    stop.clone(),
                    Arc::new(AtomicU64::new(0)),
                ),
            ));
        }
        for (i, first, _) in &c.tcp {
            if let Err(e) = first.recv_timeout(TRAFFIC_WAIT) {
                panic!("a {} connection had no first answer: {e}", LANES[*i].name());
            }
        }
        c
    }

    fn flows(&self, lane: usize) -> Range<u32> {
        let n = UDP_FLOWS_PER_VIP as u32;
        let start = self.first_flow + lane as u32 * n;
        start..start + n
    }

    /// Per lane: (echoes, datagrams the sinks have seen up to).
    fn progress(&self, servers: &Servers) -> Vec<(u64, u64)> {
        let log = servers.udp_log.lock().expect("udp log");
        (0..LANES.len())
            .map(|i| {
                let udp = self
                    .flows(i)
                    .map(|f| log.flows.get(&f).map_or(0, |(_, seen)| seen.len() as u64))
                    .sum();
                (self.echoed[i].load(Ordering::Relaxed), udp)
            })
            .collect()
    }

    /// Traffic keeps flowing: every lane's echoes and datagrams grow.
    fn assert_flowing(&self, servers: &Servers, when: &str) {
        let p0 = self.progress(servers);
        let grew = wait_for(TRAFFIC_WAIT, Duration::from_millis(20), || {
            let p = self.progress(servers);
            p.iter()
                .zip(&p0)
                .all(|(now, then)| {
                    now.0 >= then.0 + FLOWING_ECHOES && now.1 >= then.1 + FLOWING_DATAGRAMS
                })
                .then_some(())
        });
        if grew.is_none() {
            let p = self.progress(servers);
            let stalled: Vec<String> = LANES
                .iter()
                .zip(p.iter().zip(&p0))
                .map(|(l, (now, then))| format!("{}: {then:?} -> {now:?}", l.name()))
                .collect();
            panic!("{when}: traffic stalled (echoes, datagrams per lane): {stalled:?}");
        }
    }

    /// End the window and check it: no TCP error, every connection and
    /// UDP flow on one backend, every datagram arrived. Every connection
    /// must have had `MIN_ECHOES`: the caller lets the window run.
    fn finish(mut self, servers: &Servers, when: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let mut conns = Vec::new();
        for (i, _, h) in std::mem::take(&mut self.tcp) {
            conns.push((i, h.join().expect("tcp client thread")));
        }
        // (flow id, lane, datagrams sent)
        let mut sent = Vec::new();
        for (i, h) in std::mem::take(&mut self.udp) {
            let per_flow = h.join().expect("udp client thread");
            sent.extend(self.flows(i).zip(per_flow).map(|(f, n)| (f, i, n)));
        }
        let errors: Vec<String> = conns
            .iter()
            .filter_map(|(i, c)| {
                c.error
                    .as_ref()
                    .map(|e| format!("{} {}: {e}", LANES[*i].name(), c.vip))
            })
            .collect();
        assert!(
            errors.is_empty(),
            "{when}: TCP connections failed: {errors:?}"
        );
        for (i, c) in &conns {
            let lane = LANES[*i].name();
            assert_eq!(
                c.backends.len(),
                1,
                "{when}: a {lane} connection moved: {c:?}"
            );
            assert!(
                c.echoed >= MIN_ECHOES,
                "{when}: a {lane} connection barely ran: {c:?}"
            );
        }
        // The last datagrams may still be on their way: wait for them
        // (bounded), then count what is missing.
        let missing = |log: &common::traffic::UdpLog| -> Vec<(u32, usize, u64, Vec<usize>)> {
            sent.iter()
                .map(|&(f, i, n)| {
                    let seen = log.flows.get(&f).map(|(_, s)| s.as_slice()).unwrap_or(&[]);
                    let gone: Vec<usize> = (0..n as usize)
                        .filter(|&s| !seen.get(s).copied().unwrap_or(false))
                        .collect();
                    (f, i, n, gone)
                })
                .filter(|(.., gone)| !gone.is_empty())
                .collect()
        };
        let _ = wait_for(Duration::from_secs(3), Duration::from_millis(20), || {
            missing(&servers.udp_log.lock().expect("udp log"))
                .is_empty()
                .then_some(())
        });
        let log = servers.udp_log.lock().expect("udp log");
        for &(f, i, n) in &sent {
            let lane = LANES[i].name();
            assert!(n > 0, "{when}: {lane} UDP flow {f} sent nothing");
            let (backends, _) = log
                .flows
                .get(&f)
                .unwrap_or_else(|| panic!("{when}: {lane} UDP flow {f} never arrived"));
            assert_eq!(
                backends.len(),
                1,
                "{when}: {lane} UDP flow {f} moved: {backends:?}"
            );
        }
        let lost = missing(&log);
        let report: Vec<String> = lost
            .iter()
            .map(|(f, i, n, gone)| {
                format!(
                    "{} flow {f}: {} of {n} missing, first {:?}",
                    LANES[*i].name(),
                    gone.len(),
                    &gone[..gone.len().min(10)]
                )
            })
            .collect();
        eprintln!(
            "{when}: {} TCP connections, {} echoes; {} UDP datagrams sent, {} lost",
            conns.len(),
            conns.iter().map(|(_, c)| c.echoed).sum::<u64>(),
            sent.iter().map(|s| s.2).sum::<u64>(),
            lost.iter().map(|l| l.3.len()).sum::<usize>()
        );
        assert!(report.is_empty(), "{when}: UDP datagrams lost: {report:?}");
    }
}

/// Samples a backend's health in the maps until stopped; returns every
/// state seen. Two lookups per sample (its backend entry, its health), not
/// a read of every map: the sampler must not starve what it watches.
fn sample_health(
    pin_dir: PathBuf,
    addr: Ipv4Addr,
    port: u16,
    stop: Arc<AtomicBool>,
) -> JoinHandle<BTreeMap<&'static str, u64>> {
    std::thread::spawn(move || {
        let maps = Maps::open(&pin_dir).expect("opening the maps");
        let (id, _) = backend_health(&maps, addr, port).expect("the sampled backend in the maps");
        let mut seen = BTreeMap::new();
        while !stop.load(Ordering::Relaxed) {
            let entry = maps
                .backend_map
                .get::<u32, abi::rv_backend>(&id)
                .ok()
                .flatten()
                .filter(|b| {
                    abi::ipv4_from_be32(b.addr) == addr && abi::port_from_be16(b.port) == port
                });
            let h = match entry {
                None => "absent",
                Some(_) => maps
                    .backend_health_map
                    .get::<u32, abi::rv_backend_health>(&id)
                    .ok()
                    .flatten()
                    .map_or("absent", |h| Health::from_raw(h.state).name()),
            };
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
        doomed: true,
        ..Cfg::new(&lab, &d.home)
    }
    .write(&cfg);
    let servers = start_servers(&lab);
    let xdp_pin = pins.join("links/xdp_n0");
    let b = |i: usize| lab.backends[i].v4;

    // 1. First start: pins maps and links.
    run(&mut d, &rivorad_bin(), true, &[]);
    let (prog1, tag1) = link_prog(&xdp_pin).expect("a pinned XDP link after the first start");

    // The health VIP: b2 has no listener on its port, its probe takes it
    // down.
    let maps = Maps::open(&pins).expect("maps");
    wait_until("b2 down", Duration::from_secs(10), || {
        matches!(
            backend_health(&maps, b(1), HC_PORT),
            Some((_, Health::Down))
        )
    });
    // Operator drains: b3 everywhere, b1 for the health VIP only.
    let hc_vip = format!("tcp/{}:90", lab.vip(4));
    d.ctl_ok(&["drain", &format!("{}:{HC_PORT}", b(2))]);
    d.ctl_ok(&["drain", &format!("{}:{HC_PORT}", b(0)), "--vip", &hc_vip]);
    assert!(matches!(
        backend_health(&maps, b(2), HC_PORT),
        Some((_, Health::Draining))
    ));

    let client = Client::start(&lab, 0);
    client.assert_flowing(&servers, "first start");
    let before = ids_in_maps(&pins);
    let doomed = vip_key(IpAddr::V4(lab.vip(1)), 443, Protocol::Tcp);
    assert!(before.contains_key(&doomed), "doomed VIP programmed");
    assert_eq!(before.len(), VIPS + 1, "every VIP in the maps: {before:?}");

    let sampler_stop = Arc::new(AtomicBool::new(false));
    let down_sampler = sample_health(pins.clone(), b(1), HC_PORT, sampler_stop.clone());
    let drain_sampler = sample_health(pins.clone(), b(2), HC_PORT, sampler_stop.clone());

    // 2. SIGKILL: the datapath keeps forwarding with nobody home.
    let st = d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    assert!(!st.success());
    client.assert_flowing(&servers, "rivorad SIGKILLed");

    // 3. Start again (same build): adopts, swaps the program in place.
    run(&mut d, &rivorad_bin(), true, &[]);
    let (prog2, tag2) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_ne!(prog2, prog1, "the second start swapped its own program in");
    assert_eq!(tag2, tag1, "same build, same instructions");
    assert!(d.log_text().contains("took over the pinned link"));
    assert_eq!(ids_in_maps(&pins), before, "ids after SIGKILL + start");
    client.assert_flowing(&servers, "after the second start");

    // 4. SIGTERM with -persist-datapath detaches nothing.
    let st = d.stop_with(libc::SIGTERM, Duration::from_secs(10));
    assert!(st.success(), "clean exit: {st}\n{}", d.log_text());
    assert_eq!(
        attached(&lab.node, "n0"),
        (true, 1),
        "still attached after SIGTERM"
    );
    client.assert_flowing(&servers, "rivorad stopped with SIGTERM");

    // 5. Upgrade to a build whose XDP program differs.
    run(&mut d, &variant, true, &[]);
    let (prog3, tag3) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_ne!(prog3, prog2);
    assert_ne!(tag3, tag1, "the variant build runs different instructions");
    assert_eq!(ids_in_maps(&pins), before, "ids after the upgrade");
    client.assert_flowing(&servers, "after the upgrade");

    // 6. SIGKILL, change the file while rivorad is down (a VIP removed,
    //    one added), start the default build again.
    let st = d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    assert!(!st.success());
    Cfg {
        added: true,
        ..Cfg::new(&lab, &d.home)
    }
    .write(&cfg);
    run(&mut d, &rivorad_bin(), true, &[]);
    let (_, tag4) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_eq!(tag4, tag1, "back on the default build");
    let after = ids_in_maps(&pins);
    let added = vip_key(IpAddr::V4(lab.vip(1)), 81, Protocol::Tcp);
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
    client.assert_flowing(&servers, "after the config change");

    // Health and drains survived all of it.
    sampler_stop.store(true, Ordering::Relaxed);
    let down_seen = down_sampler.join().expect("sampler");
    let drain_seen = drain_sampler.join().expect("sampler");
    assert_eq!(
        down_seen.keys().copied().collect::<Vec<_>>(),
        vec!["down"],
        "b2 must stay down across the restarts: {down_seen:?}"
    );
    assert_eq!(
        drain_seen.keys().copied().collect::<Vec<_>>(),
        vec!["draining"],
        "b3 must stay drained across the restarts: {drain_seen:?}"
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
        [format!("{}:{HC_PORT}", b(0)), format!("{}:{HC_PORT}", b(2))]
            .into_iter()
            .collect(),
        "drains as the API reports them after the restarts"
    );
    let b1 = hc
        .backends
        .iter()
        .find(|x| x.target == SocketAddr::from((b(0), HC_PORT)))
        .expect("b1 listed");
    assert_eq!(b1.weight, 0, "the per-VIP drain is weight 0 again");

    // 7. Stop the traffic and count.
    client.finish(&servers, "across the restarts and the upgrade");

    // 8. Uninstall: -cleanup detaches and removes every pin.
    let st = d.stop_with(libc::SIGTERM, Duration::from_secs(10));
    assert!(st.success());
    assert_eq!(attached(&lab.node, "n0"), (true, 1));
    // `rivorad -cleanup` succeeds and removes every pin; the state
    // directory holds nothing else than the drain file.
    drop(maps);
    d.home.assert_no_leftovers(&lab.node);
    assert_eq!(
        attached(&lab.node, "n0"),
        (false, 0),
        "links detached by -cleanup"
    );
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

/// Every flow table's size as the kernel reports it, by name: all of
/// `FLOW_TABLES` (a table added there and not here fails the check).
fn flow_table_sizes(m: &Maps) -> BTreeMap<&'static str, u32> {
    let sizes = BTreeMap::from([
        (
            "connection_affinity_map",
            m.connection_affinity_map.max_entries(),
        ),
        (
            "connection_affinity_map6",
            m.connection_affinity_map6.max_entries(),
        ),
        ("nat_reverse_map", m.nat_reverse_map.max_entries()),
        ("nat_reverse_map6", m.nat_reverse_map6.max_entries()),
        ("fullnat_rev_map", m.fullnat_rev_map.max_entries()),
        ("fullnat_rev_map6", m.fullnat_rev_map6.max_entries()),
    ]);
    assert_eq!(
        sizes.keys().copied().collect::<BTreeSet<_>>(),
        rivora::dataplane::FLOW_TABLES.into_iter().collect(),
        "the flow tables"
    );
    sizes
}

#[test]
fn incompatible_pins_refuse_to_start_and_touch_nothing() {
    common::require::root_and_tools("e2e_restart");
    let lab = lab();
    let mut d = Rivorad::new(&lab.node, Home::new());
    let cfg = d.home.config();
    let pins = d.home.pin_dir().to_path_buf();
    Cfg::new(&lab, &d.home).write(&cfg);
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
    // table it meets (the object's order decides: full NAT's port table
    // since it came, which nothing rounds per CPU) with the kernel's
    // figure for it, which the flag to start with repeats.
    let sizes = flow_table_sizes(&maps);
    let err = start_expect_refusal(&mut d, &["-flow-table-size", "65536"]);
    let (named, pinned) = sizes
        .iter()
        .find(|(m, _)| err.contains(&format!("pinned map {m} has max entries ")))
        .unwrap_or_else(|| panic!("the refusal names no flow table:\n{err}"));
    assert!(
        err.contains(&format!("pinned map {named} has max entries {pinned}"))
            && err.contains("expects 65536")
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
        flow_table_sizes(&again),
        sizes,
        "flow tables keep their size"
    );
    assert_eq!(attached(&lab.node, "n0"), (true, 1), "still attached");

    // And the original build still starts over them.
    run(&mut d, &rivorad_bin(), true, &[]);
    assert_eq!(ids_in_maps(&pins), snap.2);
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
}

#[test]
fn layout_2_pins_upgraded_under_traffic() {
    common::require::root_and_tools("e2e_restart");
    let lab = lab();
    let mut d = Rivorad::new(&lab.node, Home::new());
    let cfg = d.home.config();
    let pins = d.home.pin_dir().to_path_buf();
    let xdp_pin = pins.join("links/xdp_n0");
    // The lanes on all but the last backend: the file rivorad is
    // upgraded with adds it, so the Maglev table moves flows that only
    // their affinity entries keep where they are.
    let all = lab.backends.len();
    Cfg {
        lane_backends: all - 1,
        ..Cfg::new(&lab, &d.home)
    }
    .write(&cfg);
    let servers = start_servers(&lab);
    run(&mut d, &rivorad_bin(), true, &[]);
    let before = ids_in_maps(&pins);
    assert_eq!(before.len(), VIPS);
    let client = Client::start(&lab, 0);
    client.assert_flowing(&servers, "first start");

    // Down with the datapath left running, then the pins turned into
    // what a layout 2 rivorad leaves (the program behind the link keeps
    // the maps it was loaded with, the unpinned ones too).
    let st = d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    assert!(!st.success());
    let sizes = layouts::Sizes {
        flow_table: abi::FLOW_TABLE_DEFAULT_SIZE,
        maglev: abi::MAGLEV_DEFAULT_SIZE,
    };
    layouts::downgrade_to_v2(&pins, sizes);
    let v2_names: BTreeSet<String> = layouts::V2.iter().map(|m| m.name.to_string()).collect();
    let pinned = || -> BTreeSet<String> { layouts::pin_names(&pins).into_iter().collect() };
    assert_eq!(pinned(), v2_names, "layout 2's pins");
    let kept_ids: BTreeMap<String, u32> = layouts::V2
        .iter()
        .filter(|m| !REPLACED_IN_V3.contains(&m.name))
        .map(|m| {
            (
                m.name.to_string(),
                layouts::pinned_def(&pins.join(m.name)).0,
            )
        })
        .collect();
    let (prog1, _) = link_prog(&xdp_pin).expect("a pinned XDP link");
    client.assert_flowing(&servers, "over layout 2's pins");

    // This build over them, with the backend added: the upgrade in place.
    Cfg::new(&lab, &d.home).write(&cfg);
    run(&mut d, &rivorad_bin(), true, &[]);
    let meta = layouts::read_meta(&pins);
    assert_eq!(
        (meta.abi_version, meta.maglev_size),
        (abi::ABI_VERSION, abi::MAGLEV_DEFAULT_SIZE),
        "meta_map upgraded"
    );
    let want: BTreeSet<String> = v2_names
        .iter()
        .cloned()
        .chain(
            ADDED_IN_V3
                .iter()
                .chain(&ADDED_IN_V4)
                .map(|n| n.to_string()),
        )
        .collect();
    assert_eq!(pinned(), want, "layout 2's pins and the added ones");
    for (name, id) in &kept_ids {
        let now = layouts::pinned_def(&pins.join(name)).0;
        assert_eq!(now, *id, "{name} is the same map");
    }
    let (prog2, _) = link_prog(&xdp_pin).expect("a pinned XDP link");
    assert_ne!(prog2, prog1, "the upgraded build's program behind the link");
    let after = ids_in_maps(&pins);
    for (vip, (svc, ids)) in &before {
        let (svc2, ids2) = after.get(vip).expect("every VIP kept");
        assert_eq!(svc2, svc, "{vip}: same service id");
        assert!(
            ids.iter().all(|id| ids2.contains(id)),
            "{vip}: its backends keep their ids ({ids:?} -> {ids2:?})"
        );
    }
    client.assert_flowing(&servers, "after the upgrade");
    client.finish(&servers, "across the upgrade from layout 2");
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    drop(servers);
}

#[test]
fn without_persist_clean_exit_detaches_and_start_adopts() {
    common::require::root_and_tools("e2e_restart");
    let lab = lab();
    let mut d = Rivorad::new(&lab.node, Home::new());
    let cfg = d.home.config();
    let pins = d.home.pin_dir().to_path_buf();
    Cfg::new(&lab, &d.home).write(&cfg);
    let servers = start_servers(&lab);
    // Without the flag: a clean exit detaches, the maps stay.
    run(&mut d, &rivorad_bin(), false, &[]);
    assert_eq!(attached(&lab.node, "n0"), (true, 1));
    assert!(!pins.join("links").join("xdp_n0").exists());
    let ids = ids_in_maps(&pins);
    assert_eq!(ids.len(), VIPS);
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

    // SIGKILL without the flag: nothing pinned the links, so they go with
    // the process; the maps stay pinned.
    let gone = Client::start(&lab, 0);
    gone.assert_flowing(&servers, "before a SIGKILL without persistence");
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    // The kernel releases the links as it closes the dead process's files.
    wait_until(
        "the links to go with the SIGKILLed rivorad",
        Duration::from_secs(5),
        || attached(&lab.node, "n0") == (false, 0),
    );
    assert!(pins.join("vip_map").exists(), "maps stay pinned");
    // Its flows broke with the datapath: nothing to check but that they
    // stop.
    drop(gone);
    // The next start adopts the maps and attaches; a new window of
    // traffic flows through every lane without a loss.
    run(&mut d, &rivorad_bin(), false, &[]);
    assert_eq!(attached(&lab.node, "n0"), (true, 1), "attached again");
    assert_eq!(ids_in_maps(&pins), ids, "adopted ids after the SIGKILL");
    let client = Client::start(&lab, 100);
    client.assert_flowing(&servers, "after a SIGKILL without persistence");
    client.finish(&servers, "after a SIGKILL without persistence and a start");
    assert!(d
        .stop_with(libc::SIGTERM, Duration::from_secs(10))
        .success());

    // With the flag, then without, under traffic: the second start takes
    // the pinned links over (no gap, so no loss), swaps its own program in
    // behind them and unpins them, so its exit detaches.
    run(&mut d, &rivorad_bin(), true, &[]);
    let xdp_pin = pins.join("links/xdp_n0");
    let (p1, _) = link_prog(&xdp_pin).expect("pinned link");
    assert_eq!(
        xdp_prog_on(&lab.node, "n0"),
        p1,
        "the pinned link's program runs"
    );
    let client = Client::start(&lab, 200);
    client.assert_flowing(&servers, "before the takeover");
    d.stop_with(libc::SIGKILL, Duration::from_secs(5));
    assert_eq!(
        attached(&lab.node, "n0"),
        (true, 1),
        "pinned links outlive SIGKILL"
    );
    client.assert_flowing(&servers, "pinned links, nobody home");
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
    let p2 = xdp_prog_on(&lab.node, "n0");
    assert!(
        p2 != 0 && p2 != p1,
        "the takeover swapped its own program in behind the link: {p1} -> {p2}"
    );
    client.assert_flowing(&servers, "after the takeover");
    client.finish(&servers, "across the takeover of the pinned links");
    assert!(d
        .stop_with(libc::SIGTERM, Duration::from_secs(10))
        .success());
    assert_eq!(attached(&lab.node, "n0"), (false, 0));

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
    drop(servers);
}

/// `xdpMode: generic` and `auto` on the lab's veth: the attach succeeds,
/// the API reports the mode the kernel reports (auto: native, which veth
/// has), and a window of traffic through every lane loses nothing.
#[test]
fn xdp_modes_generic_and_auto() {
    common::require::root_and_tools("e2e_restart");
    let lab = lab();
    let servers = start_servers(&lab);
    for (i, (mode, used)) in [("generic", "generic"), ("auto", "native")]
        .into_iter()
        .enumerate()
    {
        let mut d = Rivorad::new(&lab.node, Home::new());
        Cfg {
            xdp_mode: mode,
            ..Cfg::new(&lab, &d.home)
        }
        .write(&d.home.config());
        run(&mut d, &rivorad_bin(), false, &[]);
        assert_eq!(attached(&lab.node, "n0"), (true, 1), "xdpMode {mode}");
        assert_eq!(
            kernel_xdp_mode(&lab.node, "n0"),
            used,
            "xdpMode {mode}: the kernel's attach mode"
        );
        let st: rivora::api::Status =
            serde_json::from_value(d.status()).expect("status as the API's type");
        let n0 = st
            .interfaces
            .iter()
            .find(|f| f.name == "n0")
            .unwrap_or_else(|| panic!("n0 in the status: {st:?}"));
        assert_eq!(
            serde_json::to_value(n0.xdp_mode).expect("xdp_mode"),
            used,
            "xdpMode {mode}: the mode the API reports"
        );
        assert!(n0.tc_attached, "xdpMode {mode}: tc_nat attached");
        let client = Client::start(&lab, 100 * i as u32);
        client.assert_flowing(&servers, &format!("xdpMode {mode}"));
        client.finish(&servers, &format!("xdpMode {mode}"));
        assert!(d.stop().success(), "xdpMode {mode}: clean exit");
        assert_eq!(attached(&lab.node, "n0"), (false, 0), "xdpMode {mode}");
        d.home.assert_no_leftovers(&lab.node);
    }
    drop(servers);
}
