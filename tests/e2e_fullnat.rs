//! End to end, full NAT through the real rivorad: VIPs with `mode:
//! fullnat` in the static file, run in the node of a lab whose backends
//! have no route back to the client at all (`Mode::FullNat` in
//! `common::topology`: only their own subnet, on which the node's
//! `node_v4` and `node_v6` live). A reply reaches the client only if the
//! node rewrote the request's source to one of its own addresses and turns
//! the reply back into VIP -> client; the client's sockets are connected
//! to the VIP, so the kernel would deliver nothing else to them.
//!
//! One test each, every one in its own lab (they run in parallel):
//! - `snat_sources_tcp_udp_v4_v6`: with `node.snat` naming `node_v4`,
//!   `node_v6` and a port range, `FLOWS` TCP connections and UDP exchanges
//!   per family are all answered, every backend takes a fair share, and
//!   each backend saw the request addressed to its own address and port,
//!   from the configured source (never the client's), from a port of the
//!   range, no source tuple given to two client flows. The node's kernel
//!   forwarded almost nothing during the UDP exchanges (requests and
//!   replies are both turned around in XDP once the neighbours are
//!   known). `rivoractl -o json vip show` says mode fullnat for each VIP
//!   and for each backend (how it is reached), and no flow was dropped for
//!   want of a port. The TCP VIPs' probes, sent by the node from the same
//!   addresses (ports of the kernel's ephemeral range), find every
//!   backend healthy: full NAT leaves the node's own connections alone.
//! - `route_sources_then_snat_by_reload`: without `node.snat`, backends see
//!   the source the node's route to them prefers (`ip route get` in the
//!   node: its address on the backend subnet) and ports of the default
//!   range; a reload that sets `node.snat` to other addresses the node
//!   holds (host routes on `n0`) moves new flows to those.
//! - `snat_address_not_held_is_refused`: a `node.snat.ipv4` the node does
//!   not hold makes rivorad exit 1 at start naming the file, the line and
//!   the field, with nothing pinned or attached (`-check` run in the node
//!   says the same for `node.snat.ipv6`); on a running rivorad, a SIGHUP
//!   and a `POST /v1/reload` (`rivoractl reload`) of that file are
//!   refused, `rivoractl status` shows the failure, and so is a reload with
//!   `ports: "5000-4000"`. Meanwhile a long-lived connection through the
//!   VIP goes on untouched and new flows keep the running source.
//! - `snat_port_ranges_checked`: `rivorad -check` refuses "5000-4000",
//!   and timeouts outside 2s..30d, at their line and field (the bounds
//!   pass), and warns, naming both numbers, for a port range under a
//!   sixteenth of the flow table (the boundary exactly: 8,192 ports of
//!   131,072 pass, 8,191 warn; and with `-flow-table-size`).
//! - `long_lived_connection_survives_restarts_and_upgrade`: full-NAT TCP
//!   connections exchanging a line every 100 ms, IPv4 and IPv6, go on
//!   across a SIGKILL and a start with `-persist-datapath`, a SIGTERM and
//!   a hot swap to the variant build (`RIVORA_VARIANT_RIVORAD`), with
//!   every line echoed in order, no retransmission, one backend and one
//!   source tuple each; then across a restart without `-persist-datapath`
//!   (detached for a while, the flow state kept in the pinned maps): the
//!   same connections go on, on the same backend and source tuple, after a
//!   gap that is measured and printed. The client acknowledges each echo
//!   at once (`TCP_QUICKACK`): a backend segment sent while the datapath
//!   is detached would reach the node's own kernel, addressed to its
//!   source address and a port no socket holds, and be answered with a
//!   reset; this way the backend has nothing outstanding between lines.
//!
//! Needs root (namespaces, BPF). Every wait is bounded, every guard (lab,
//! rivorad and its pins, servers) cleans up when a test fails.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::rivorad::{attached, link_prog, rivorad_bin, variant_bin, Home, Rivorad, READY};
use common::topology::{Mode, Topology, VIP_PORT};
use common::traffic::{
    exchanges, long_lived_with, wait_for, ConnResult, LongLivedOpts, Proto, Servers,
};
use serde_json::Value;

/// Connections (TCP) or exchanges (UDP) per family and protocol.
const FLOWS: usize = 120;
/// A broken path fails within this per step (connect, reply).
const STEP: Duration = Duration::from_secs(2);
/// Each backend takes at least this share: a fair 1-in-3 split of 120
/// flows is Binomial(120, 1/3), mean 40, standard deviation 5.2; 15% is
/// 18, 4.3 deviations under the mean (P = 1.6e-6 per check).
const MIN_SHARE: f64 = 0.15;
/// The default `node.snat.ports`.
const DEFAULT_PORTS: RangeInclusive<u16> = 1024..=32767;
/// The range `snat_sources_tcp_udp_v4_v6` configures.
const SNAT_PORTS: RangeInclusive<u16> = 20000..=29999;
/// rivorad's default `-flow-table-size`.
const FLOW_TABLE: u32 = 131_072;
/// The long-lived connections' pace.
const INTERVAL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------
// The configuration file
// ---------------------------------------------------------------------

/// `node.snat` as the file writes it, one field a line (so that a test
/// can name a field's line); a field left None is left out, and with all
/// three None there is no `node` section.
#[derive(Clone, Default)]
struct Snat {
    ipv4: Option<String>,
    ipv6: Option<String>,
    ports: Option<String>,
}

impl Snat {
    /// The node's own addresses on the backend subnet.
    fn node(topo: &Topology) -> Self {
        Snat {
            ipv4: Some(topo.node_v4.to_string()),
            ipv6: Some(topo.node_v6.to_string()),
            ports: None,
        }
    }

    fn ports(mut self, p: &str) -> Self {
        self.ports = Some(p.to_string());
        self
    }

    fn yaml(&self) -> String {
        if self.ipv4.is_none() && self.ipv6.is_none() && self.ports.is_none() {
            return String::new();
        }
        let mut y = "node:\n  snat:\n".to_string();
        if let Some(a) = &self.ipv4 {
            y += &format!("    ipv4: {a}\n");
        }
        if let Some(a) = &self.ipv6 {
            y += &format!("    ipv6: \"{a}\"\n");
        }
        if let Some(p) = &self.ports {
            y += &format!("    ports: \"{p}\"\n");
        }
        y
    }
}

/// The VIPs of the traffic tests: every family and protocol.
const ALL_VIPS: [(bool, Proto); 4] = [
    (false, Proto::Tcp),
    (false, Proto::Udp),
    (true, Proto::Tcp),
    (true, Proto::Udp),
];

fn proto_name(p: Proto) -> &'static str {
    match p {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
    }
}

/// The file: n0, the API socket, `snat`, and a full-NAT VIP on
/// `VIP_PORT` per (IPv6?, protocol) of `vips` over every backend (on
/// `backend_port`). TCP VIPs are probed, from the node's own addresses
/// (full NAT's sources too) and ports of the kernel's ephemeral range;
/// UDP ones not. A probe ends with a reset, which the backends' servers
/// count as an error: the tests leave that count alone.
fn config(topo: &Topology, home: &Home, snat: &Snat, vips: &[(bool, Proto)]) -> String {
    let mut y = format!(
        "interfaces:\n  - name: n0\n    xdpMode: native\n{}api:\n  socket: {}\nvips:\n",
        snat.yaml(),
        home.socket().display()
    );
    for &(v6, proto) in vips {
        let (addr, fam) = if v6 {
            (format!("\"{}\"", topo.vip6), 6)
        } else {
            (topo.vip4.to_string(), 4)
        };
        let p = proto_name(proto);
        y += &format!(
            "  - name: {p}{fam}\n    address: {addr}\n    port: {VIP_PORT}\n    protocol: {p}\n    \
             mode: fullnat\n"
        );
        y += match proto {
            Proto::Tcp => "    healthCheck: { type: tcp, interval: 200ms, timeout: 150ms, rise: 2, fall: 2 }\n",
            Proto::Udp => "    healthCheck: false\n",
        };
        y += "    backends:\n";
        for b in &topo.backends {
            let a = if v6 {
                format!("\"{}\"", b.v6)
            } else {
                b.v4.to_string()
            };
            y += &format!(
                "      - {{ address: {a}, port: {} }}\n",
                topo.backend_port()
            );
        }
    }
    y
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the config"))
        + 1
}

fn vip_addr(topo: &Topology, v6: bool) -> SocketAddr {
    if v6 {
        SocketAddr::new(IpAddr::V6(topo.vip6), VIP_PORT)
    } else {
        SocketAddr::new(IpAddr::V4(topo.vip4), VIP_PORT)
    }
}

/// The API's name of a VIP (`tcp/10.0.0.1:80`, `udp/[fd00::1]:80`).
fn vip_name(topo: &Topology, v6: bool, proto: Proto) -> String {
    format!("{}/{}", proto_name(proto), vip_addr(topo, v6))
}

// ---------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------

/// The lab is what the tests rely on: no backend has a route to the
/// client's addresses, in either family.
fn assert_no_route_back(topo: &Topology) {
    for b in &topo.backends {
        for c in [IpAddr::V4(topo.client_v4), IpAddr::V6(topo.client_v6)] {
            let out = b.ns.exec(&format!("ip route get {c} 2>&1 || true"));
            assert!(
                out.contains("unreachable"),
                "backend {} has a route to the client {c}: {out}",
                b.name
            );
        }
    }
}

/// The source the node's route to `addr` prefers (`ip route get`).
fn route_src(topo: &Topology, addr: IpAddr) -> IpAddr {
    let out = topo.node.exec(&format!("ip -o route get {addr}"));
    out.split_whitespace()
        .skip_while(|w| *w != "src")
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no src in `ip route get {addr}`: {out}"))
}

/// `FLOWS` exchanges through the VIP of one family and protocol: every
/// one answered, each backend saw it addressed to its own address and
/// port, from `src` and a port of `ports` (so not from the client), no
/// source tuple given to two client flows, and every backend took a fair
/// share. Returns the per-backend counts.
fn check_flows(
    topo: &Topology,
    what: &str,
    v6: bool,
    proto: Proto,
    src: IpAddr,
    ports: &RangeInclusive<u16>,
) -> BTreeMap<String, usize> {
    let vip = vip_addr(topo, v6);
    let what = format!("{what}: {proto:?} to {vip}");
    let t0 = Instant::now();
    let results = exchanges(&topo.client, vip, proto, FLOWS, STEP);
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{what}: {} of {} flows failed (after {:?}); first: {:?}",
        failures.len(),
        results.len(),
        t0.elapsed(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(results.len(), FLOWS, "{what}: every flow ran");
    let mut counts: BTreeMap<String, usize> =
        topo.backends.iter().map(|b| (b.name.clone(), 0)).collect();
    // (backend, source tuple it saw) -> the client's tuple.
    let mut tuples: BTreeMap<(String, SocketAddr), SocketAddr> = BTreeMap::new();
    for h in results.into_iter().flatten() {
        let b = topo
            .backends
            .iter()
            .find(|b| b.name == h.backend)
            .unwrap_or_else(|| panic!("{what}: answer from unknown backend {h:?}"));
        assert_eq!(
            h.local,
            SocketAddr::new(topo.backend_local(b, v6), topo.backend_port()),
            "{what}: where {} saw the request addressed to",
            b.name
        );
        assert_eq!(
            h.peer.ip(),
            src,
            "{what}: {} saw the request from {} (the client is {}), not from the node's source",
            b.name,
            h.peer,
            h.me
        );
        assert!(
            ports.contains(&h.peer.port()),
            "{what}: {} saw source port {}, outside node.snat.ports {ports:?}",
            b.name,
            h.peer.port()
        );
        // A UDP client socket's port may repeat within a batch (fresh
        // sockets, ports picked at random): that is one flow again, and
        // keeps its tuple. Two different client flows never share one.
        let first = tuples.entry((b.name.clone(), h.peer)).or_insert(h.me);
        assert_eq!(
            *first, h.me,
            "{what}: {} saw two client flows from one source tuple {}",
            b.name, h.peer
        );
        *counts.entry(h.backend).or_default() += 1;
    }
    let min = (MIN_SHARE * FLOWS as f64).ceil() as usize;
    for (name, n) in &counts {
        assert!(
            *n >= min,
            "{what}: backend {name} got {n} of {FLOWS} flows, below {min}; spread {counts:?}"
        );
    }
    counts
}

/// Every VIP of `ALL_VIPS` through [`check_flows`], with the family's
/// source; the node's kernel must have forwarded almost nothing during
/// each family's UDP exchanges (the TCP flows before have resolved every
/// neighbour, so XDP sends requests and replies alike; slack for their
/// last segments still in flight). Returns the spreads.
fn check_all(
    topo: &Topology,
    what: &str,
    src4: IpAddr,
    src6: IpAddr,
    ports: &RangeInclusive<u16>,
) -> Vec<String> {
    let mut spread = Vec::new();
    for (v6, proto) in ALL_VIPS {
        let src = if v6 { src6 } else { src4 };
        let before = topo.node_forwarded();
        let counts = check_flows(topo, what, v6, proto, src, ports);
        let after = topo.node_forwarded();
        let fwd = if v6 {
            after.1 - before.1
        } else {
            after.0 - before.0
        };
        if proto == Proto::Udp {
            assert!(
                fwd <= (FLOWS / 4) as u64,
                "{what}: the node's kernel forwarded {fwd} datagrams during {FLOWS} full-NAT \
                 UDP exchanges (IPv6: {v6}): requests and replies should go by XDP"
            );
        }
        spread.push(format!(
            "{}{} {counts:?} (kernel forwarded {fwd})",
            proto_name(proto),
            if v6 { 6 } else { 4 }
        ));
    }
    spread
}

/// `rivoractl -o json vip show` for each VIP: mode fullnat, every
/// backend listed once with mode fullnat (how it is reached), the
/// requests counted, no new flow dropped for want of a port.
fn check_vip_show(rd: &Rivorad, topo: &Topology) {
    for (v6, proto) in ALL_VIPS {
        let name = vip_name(topo, v6, proto);
        let v: Value = rd.ctl_json(&["vip", "show", &name]);
        assert_eq!(v["vip"], name.as_str(), "{name}: {v}");
        assert_eq!(v["mode"], "fullnat", "{name}: the VIP's mode: {v}");
        let want: BTreeSet<String> = topo
            .backends
            .iter()
            .map(|b| SocketAddr::new(topo.backend_local(b, v6), topo.backend_port()).to_string())
            .collect();
        let backends = v["backends"].as_array().expect("backends is an array");
        let got: BTreeSet<String> = backends
            .iter()
            .map(|b| b["target"].as_str().expect("target").to_string())
            .collect();
        assert_eq!(got, want, "{name}: the backends listed: {v}");
        assert_eq!(backends.len(), want.len(), "{name}: each backend once: {v}");
        for b in backends {
            assert_eq!(
                b["mode"], "fullnat",
                "{name}: how backend {} is reached: {v}",
                b["target"]
            );
        }
        assert!(
            v["packets"].as_u64().expect("packets") >= FLOWS as u64,
            "{name}: requests counted: {v}"
        );
        assert_eq!(
            (&v["fullnat_ports_exhausted"], &v["fullnat_table_full"]),
            (&Value::from(0), &Value::from(0)),
            "{name}: new flows dropped for want of a port: {v}"
        );
    }
}

/// The probes of the TCP VIPs' backends, sent from the node's own
/// addresses beside full NAT's flows from the same addresses, succeed:
/// every backend's probe state becomes healthy (rise 2) within a few
/// seconds. Prints the list if not.
fn assert_probes_healthy(rd: &Rivorad) {
    let healthy = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        let list = rd.ctl_json(&["backend", "list"]);
        list.as_array()
            .expect("backend list is an array")
            .iter()
            .filter(|b| b["probe"] != "disabled")
            .all(|b| b["probe"] == "healthy" && b["health"] == "healthy")
            .then_some(())
    });
    if healthy.is_none() {
        panic!(
            "probes beside full NAT: not every backend healthy: {}",
            rd.ctl_json(&["backend", "list"])
        );
    }
}

/// A clean stop detaches, and `rivorad -cleanup` leaves nothing.
fn stop_clean(mut rd: Rivorad, topo: &Topology) {
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    assert_eq!(attached(&topo.node, "n0"), (false, 0), "detached on exit");
    rd.home.assert_no_leftovers(&topo.node);
}

// ---------------------------------------------------------------------
// 1. node.snat: the configured source, ports of the configured range
// ---------------------------------------------------------------------

#[test]
fn snat_sources_tcp_udp_v4_v6() {
    common::require::root_and_tools("e2e_fullnat");
    let t0 = Instant::now();
    let topo = Topology::new(Mode::FullNat);
    assert_no_route_back(&topo);
    let servers = Servers::for_topology(&topo, true);
    let home = Home::new();
    let snat = Snat::node(&topo).ports(&format!("{}-{}", SNAT_PORTS.start(), SNAT_PORTS.end()));
    let yaml = config(&topo, &home, &snat, &ALL_VIPS);
    let rd = Rivorad::start(&topo.node, home, &yaml, &[]);
    assert_eq!(
        attached(&topo.node, "n0"),
        (true, 1),
        "XDP and tc_nat on n0"
    );
    let setup = t0.elapsed();

    let (src4, src6) = (IpAddr::V4(topo.node_v4), IpAddr::V6(topo.node_v6));
    let spread = check_all(&topo, "node.snat", src4, src6, &SNAT_PORTS);
    check_vip_show(&rd, &topo);
    assert_probes_healthy(&rd);
    stop_clean(rd, &topo);
    drop(servers);
    eprintln!(
        "node.snat: lab and rivorad up in {setup:?}, traffic in {:?}; {spread:?}",
        t0.elapsed() - setup
    );
}

// ---------------------------------------------------------------------
// 2. No node.snat: the routes' sources; then node.snat by a reload
// ---------------------------------------------------------------------

#[test]
fn route_sources_then_snat_by_reload() {
    common::require::root_and_tools("e2e_fullnat");
    let t0 = Instant::now();
    let topo = Topology::new(Mode::FullNat);
    assert_no_route_back(&topo);
    let servers = Servers::for_topology(&topo, true);
    let home = Home::new();
    let yaml = config(&topo, &home, &Snat::default(), &ALL_VIPS);
    let rd = Rivorad::start(&topo.node, home, &yaml, &[]);

    // What the node's routes prefer towards each backend, asked of the
    // kernel: the node's address on the backend subnet.
    for b in &topo.backends {
        assert_eq!(
            route_src(&topo, IpAddr::V4(b.v4)),
            IpAddr::V4(topo.node_v4),
            "the node's route source towards {}",
            b.v4
        );
        assert_eq!(
            route_src(&topo, IpAddr::V6(b.v6)),
            IpAddr::V6(topo.node_v6),
            "the node's route source towards {}",
            b.v6
        );
    }
    let (src4, src6) = (IpAddr::V4(topo.node_v4), IpAddr::V6(topo.node_v6));
    let spread = check_all(&topo, "route sources", src4, src6, &DEFAULT_PORTS);
    check_vip_show(&rd, &topo);

    // Other addresses of the node on the backend subnet (host routes, so
    // the routes' sources stay as they were), named by node.snat in a
    // reload: new flows come from them.
    let (alt4, alt6): (IpAddr, IpAddr) = (
        format!("10.{}.2.2", topo.n).parse().expect("addr"),
        format!("fd00:{:x}:2::2", topo.n).parse().expect("addr"),
    );
    topo.node.exec(&format!(
        "ip addr add {alt4}/32 dev n0 && ip addr add {alt6}/128 dev n0 nodad"
    ));
    // The kernel puts an IPv6 address's local route in from a work queue,
    // after `ip addr add` returns (even with nodad): until then rivorad,
    // which asks the routes, rightly refuses the address (seen once).
    let local = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        [alt4, alt6]
            .iter()
            .all(|a| {
                topo.node
                    .exec(&format!("ip -o route get {a}"))
                    .starts_with("local ")
            })
            .then_some(())
    });
    assert!(local.is_some(), "{alt4} and {alt6} never became local");
    let snat = Snat {
        ipv4: Some(alt4.to_string()),
        ipv6: Some(alt6.to_string()),
        ports: None,
    };
    // A flow keeps the source it was given for as long as its flow entry
    // lives (a UDP flow 60 s after its last datagram), and a fresh
    // socket's port may repeat one of the first round's: the client
    // takes its ports from another range from here on, so that every
    // flow of the second round is new to the datapath.
    topo.client
        .sysctls(&[("net.ipv4.ip_local_port_range", "61000 65000")]);
    rd.write_config(&config(&topo, &rd.home, &snat, &ALL_VIPS));
    let out = rd.ctl_ok(&["reload"]);
    assert!(!out.contains("warning"), "rivoractl reload: {out}");
    let st = rd.status();
    assert_eq!(st["last_reload"]["ok"], true, "{st}");
    let spread2 = check_all(&topo, "node.snat by reload", alt4, alt6, &DEFAULT_PORTS);
    assert_probes_healthy(&rd);
    stop_clean(rd, &topo);
    drop(servers);
    eprintln!(
        "route sources: {:?} in all; {spread:?}; after the reload {spread2:?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------
// 3. Bad input: a source the node does not hold, a backwards range
// ---------------------------------------------------------------------

/// `rivorad -check -config FILE` in `ns` (check_host asks the namespace's
/// routes), with `extra` flags.
fn check_in(ns: Option<&common::netns::Netns>, file: &Path, extra: &[&str]) -> Output {
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.path())).arg(rivorad_bin());
            c
        }
        None => Command::new(rivorad_bin()),
    };
    cmd.arg("-check")
        .args(extra)
        .arg("-config")
        .arg(file)
        .output()
        .expect("running rivorad -check")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A long-lived connection through `vip`, its echo counter and stop flag.
struct Conn {
    handle: Option<JoinHandle<ConnResult>>,
    echoed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// The first answer's backend.
    backend: String,
}

impl Conn {
    fn start(topo: &Topology, v6: bool, step: Duration) -> Self {
        let (echoed, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let opts = LongLivedOpts {
            interval: INTERVAL,
            step,
            quick_ack: true,
        };
        let vip = vip_addr(topo, v6);
        let ll = long_lived_with(&topo.client, vip, opts, stop.clone(), echoed.clone());
        let backend = ll
            .first
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("no first answer through {vip}: {e}"));
        Conn {
            handle: Some(ll.handle),
            echoed,
            stop,
            backend,
        }
    }

    fn finish(mut self) -> ConnResult {
        self.stop.store(true, Ordering::Relaxed);
        let h = self.handle.take().expect("finished once");
        h.join().expect("long-lived client thread")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Every connection gets `n` more echoes within `limit`; panics naming
/// `when` and the counts otherwise. Returns how long it took.
fn assert_flowing(conns: &[&Conn], n: u64, limit: Duration, when: &str) -> Duration {
    let t0 = Instant::now();
    let start: Vec<u64> = conns
        .iter()
        .map(|c| c.echoed.load(Ordering::Relaxed))
        .collect();
    let grew = wait_for(limit, Duration::from_millis(10), || {
        conns
            .iter()
            .zip(&start)
            .all(|(c, s)| c.echoed.load(Ordering::Relaxed) >= s + n)
            .then_some(())
    });
    if grew.is_none() {
        let now: Vec<u64> = conns
            .iter()
            .map(|c| c.echoed.load(Ordering::Relaxed))
            .collect();
        panic!("{when}: connections stalled: echoes {start:?} -> {now:?} in {limit:?}");
    }
    t0.elapsed()
}

/// A connection that ran to the end: no error, every line echoed in
/// order (checked as it ran), one backend (the first answer's), one
/// source tuple seen by it: `src` and a port of `ports`.
fn assert_one_flow(
    c: &ConnResult,
    backend: &str,
    src: IpAddr,
    ports: &RangeInclusive<u16>,
    when: &str,
) {
    assert!(c.error.is_none(), "{when}: the connection failed: {c:?}");
    let one: BTreeSet<String> = [backend.to_string()].into();
    assert_eq!(c.backends, one, "{when}: the connection moved: {c:?}");
    assert_eq!(
        c.peers.len(),
        1,
        "{when}: the backend saw the connection from more than one source: {c:?}"
    );
    let peer = c.peers.first().expect("one peer");
    assert!(
        peer.ip() == src && ports.contains(&peer.port()),
        "{when}: the backend saw the connection from {peer}, not {src} and a port of {ports:?}"
    );
}

#[test]
fn snat_address_not_held_is_refused() {
    common::require::root_and_tools("e2e_fullnat");
    let t0 = Instant::now();
    let topo = Topology::new(Mode::FullNat);
    let servers = Servers::for_topology(&topo, false);
    let home = Home::new();
    let cfg = home.config();
    let cfg_s = cfg.display().to_string();
    let vips = [(false, Proto::Tcp)];
    let good = config(&topo, &home, &Snat::node(&topo), &vips);
    // An address on the backend subnet that nobody holds, as long as
    // node_v4 (10.N.2.1): the bad file can replace the good one unseen.
    let absent4 = format!("10.{}.2.9", topo.n);
    let absent6 = format!("fd00:{:x}:2::9", topo.n);
    let bad4 = good.replacen(
        &format!("ipv4: {}\n", topo.node_v4),
        &format!("ipv4: {absent4}\n"),
        1,
    );
    assert_eq!(bad4.len(), good.len(), "same length");
    let bad6 = good.replacen(
        &format!("ipv6: \"{}\"\n", topo.node_v6),
        &format!("ipv6: \"{absent6}\"\n"),
        1,
    );
    let line4 = line_of(&bad4, "ipv4:");
    let line6 = line_of(&bad6, "ipv6:");
    let at4 = format!("{cfg_s}:{line4}: node.snat.ipv4: {absent4} is not an address of this node");
    let at6 = format!("{cfg_s}:{line6}: node.snat.ipv6: {absent6} is not an address of this node");

    // At start: exit 1, naming file, line and field; nothing created.
    fs::write(&cfg, &bad4).expect("writing the config");
    let mut rd = Rivorad::new(&topo.node, home);
    rd.spawn(&rivorad_bin(), &[]);
    let st = rd.wait_exit(Duration::from_secs(10));
    let log = rd.log_text();
    assert_eq!(
        st.code(),
        Some(1),
        "rivorad on a foreign node.snat.ipv4:\n{log}"
    );
    assert!(log.contains(&at4), "the refusal names {at4:?}:\n{log}");
    assert!(!rd.home.pin_dir().exists(), "rivorad created its pins");
    assert!(!rd.home.socket().exists(), "rivorad created its socket");
    assert_eq!(attached(&topo.node, "n0"), (false, 0), "attached to n0");
    // `-check` in the node says the same, for either family.
    let file6 = rd.home.path("bad6.yaml");
    fs::write(&file6, &bad6).expect("writing the file");
    for (file, want) in [
        (cfg.as_path(), at4.clone()),
        (
            file6.as_path(),
            at6.replace(&cfg_s, &file6.display().to_string()),
        ),
    ] {
        let out = check_in(Some(&topo.node), file, &[]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "-check {}: {}",
            file.display(),
            text(&out)
        );
        assert!(
            text(&out).contains(&want),
            "-check names {want:?}: {}",
            text(&out)
        );
    }

    // A good file starts; a connection and new flows run through it.
    fs::write(&cfg, &good).expect("writing the config");
    rd.restart(&[]);
    let src4 = IpAddr::V4(topo.node_v4);
    check_flows(&topo, "started", false, Proto::Tcp, src4, &DEFAULT_PORTS);
    let conn = Conn::start(&topo, false, STEP);
    assert_flowing(&[&conn], 5, Duration::from_secs(5), "before the reloads");

    // SIGHUP with the bad file (swapped in unseen by the watcher).
    rd.write_config_unseen(&bad4);
    rd.sighup();
    let st = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        let st = rd.status();
        (st["last_reload"]["ok"] == false).then_some(st)
    })
    .expect("status never showed the failed SIGHUP reload");
    let err = st["last_reload"]["error"].as_str().unwrap_or_default();
    assert!(
        err.contains(&at4),
        "the SIGHUP reload error names {at4:?}: {st}"
    );
    assert_eq!(st["config_generation"], 1, "nothing applied: {st}");

    // POST /v1/reload: refused, naming the same.
    let out = rd.ctl(&["reload"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "rivoractl reload: {}",
        text(&out)
    );
    assert!(
        text(&out).contains(&at4),
        "rivoractl reload names {at4:?}: {}",
        text(&out)
    );
    // `rivoractl status`, JSON and text, shows the failure.
    let st = rd.status();
    assert_eq!(st["last_reload"]["ok"], false, "{st}");
    assert!(
        st["last_reload"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains(&at4),
        "{st}"
    );
    let shown = rd.ctl_ok(&["status"]);
    let line = shown
        .lines()
        .find(|l| l.starts_with("last reload"))
        .unwrap_or_else(|| panic!("no last reload in rivoractl status:\n{shown}"));
    assert!(
        line.contains("FAILED") && line.contains(&at4),
        "rivoractl status: {line}"
    );

    // A backwards port range: refused at its line and field.
    let backwards = config(
        &topo,
        &rd.home,
        &Snat::node(&topo).ports("5000-4000"),
        &vips,
    );
    let at_ports = format!(
        "{cfg_s}:{}: node.snat.ports",
        line_of(&backwards, "ports: \"5000-4000\"")
    );
    rd.write_config(&backwards);
    let out = rd.ctl(&["reload"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "rivoractl reload: {}",
        text(&out)
    );
    assert!(
        text(&out).contains(&at_ports),
        "rivoractl reload names {at_ports:?}: {}",
        text(&out)
    );
    let st = rd.status();
    assert_eq!(st["last_reload"]["ok"], false, "{st}");
    assert_eq!(st["config_generation"], 1, "nothing applied: {st}");

    // Traffic through the running VIP went on unchanged: the connection
    // flows on the same backend and source, new flows from node_v4 (not
    // the refused address) spread over every backend.
    assert_flowing(
        &[&conn],
        5,
        Duration::from_secs(5),
        "after the refused reloads",
    );
    check_flows(
        &topo,
        "after the refused reloads",
        false,
        Proto::Tcp,
        src4,
        &DEFAULT_PORTS,
    );
    let backend = conn.backend.clone();
    let c = conn.finish();
    assert_one_flow(
        &c,
        &backend,
        src4,
        &DEFAULT_PORTS,
        "across the refused reloads",
    );
    stop_clean(rd, &topo);
    drop(servers);
    eprintln!("refusals: {:?} in all; the connection: {c:?}", t0.elapsed());
}

#[test]
fn snat_port_ranges_checked() {
    let home = Home::new();
    let file = home.path("snat.yaml");
    // The file with `field` under node.snat.
    let yaml = |field: &str| {
        format!(
            "interfaces:\n  - name: n0\napi:\n  socket: {}\nnode:\n  snat:\n    {field}\n\
             vips:\n  - name: web\n    address: 10.9.0.1\n    port: 80\n    protocol: tcp\n    \
             mode: fullnat\n    backends:\n      - {{ address: 10.9.1.1, port: 8080 }}\n",
            home.socket().display()
        )
    };
    let ports = |p: &str| yaml(&format!("ports: \"{p}\""));
    let f = file.display().to_string();

    // Refused, exit 1, at the field's line: a backwards range, and
    // timeouts out of their 2s..30d.
    for (field, name) in [
        ("ports: \"5000-4000\"", "ports"),
        ("udpTimeout: 1s", "udpTimeout"),
        ("tcpClosingTimeout: 1500ms", "tcpClosingTimeout"),
        ("tcpTimeout: 31d", "tcpTimeout"),
    ] {
        let y = yaml(field);
        fs::write(&file, &y).expect("writing the file");
        let out = check_in(None, &file, &[]);
        let at = format!("{f}:{}: node.snat.{name}", line_of(&y, field));
        assert_eq!(out.status.code(), Some(1), "-check {field}: {}", text(&out));
        assert!(
            text(&out).contains(&at),
            "-check {field} names {at:?}: {}",
            text(&out)
        );
    }
    // The bounds themselves pass.
    for field in ["udpTimeout: 2s", "tcpTimeout: 30d"] {
        fs::write(&file, yaml(field)).expect("writing the file");
        let out = check_in(None, &file, &[]);
        assert!(out.status.success(), "-check {field}: {}", text(&out));
    }

    // Under a sixteenth of the flow table: accepted, with a warning that
    // names the range's size and the table's; exactly a sixteenth passes
    // without one.
    // (range, rivorad flags, the warning's (ports, flows) if one).
    type Case = (&'static str, &'static [&'static str], Option<(u32, u32)>);
    let cases: [Case; 4] = [
        ("61000-61063", &[], Some((64, FLOW_TABLE))),
        ("20000-28190", &[], Some((8191, FLOW_TABLE))),
        ("20000-28191", &[], None),
        (
            "61000-61063",
            &["-flow-table-size", "4096"],
            Some((64, 4096)),
        ),
    ];
    for (range, extra, warn) in cases {
        fs::write(&file, ports(range)).expect("writing the file");
        let out = check_in(None, &file, extra);
        let t = text(&out);
        assert!(out.status.success(), "-check {range} {extra:?}: {t}");
        match warn {
            Some((n, table)) => {
                let want = format!(
                    "warning: node.snat.ports {range} holds {n} ports, under a sixteenth of the \
                     {table} flows the flow table holds"
                );
                assert!(
                    t.contains(&want),
                    "-check {range} {extra:?} warns {want:?}: {t}"
                );
            }
            None => assert!(!t.contains("warning"), "-check {range} {extra:?}: {t}"),
        }
    }
}

// ---------------------------------------------------------------------
// 4. Restarts and a hot swap under a long-lived full-NAT connection
// ---------------------------------------------------------------------

#[test]
fn long_lived_connection_survives_restarts_and_upgrade() {
    common::require::root_and_tools("e2e_fullnat");
    let variant = variant_bin();
    let t0 = Instant::now();
    let topo = Topology::new(Mode::FullNat);
    let servers = Servers::for_topology(&topo, false);
    let home = Home::new();
    let vips = [(false, Proto::Tcp), (true, Proto::Tcp)];
    let yaml = config(&topo, &home, &Snat::node(&topo), &vips);
    fs::write(home.config(), yaml).expect("writing the config");
    let mut rd = Rivorad::new(&topo.node, home);
    let pins = rd.home.pin_dir().to_path_buf();
    let xdp_pin = pins.join("links/xdp_n0");
    let persist = ["-persist-datapath"];
    rd.restart(&persist);
    let (prog1, tag1) = link_prog(&xdp_pin).expect("a pinned XDP link");
    let (src4, src6) = (IpAddr::V4(topo.node_v4), IpAddr::V6(topo.node_v6));

    // `a4`, `a6` live through the persistent restarts and the swap; `b4`,
    // `b6` through everything, the restart without the flag too (whose
    // gap they measure). A late echo (a loss's retransmission) fails
    // `a*`; `b*` wait out the detached datapath.
    let a4 = Conn::start(&topo, false, Duration::from_secs(3));
    let a6 = Conn::start(&topo, true, Duration::from_secs(3));
    let b4 = Conn::start(&topo, false, Duration::from_secs(15));
    let b6 = Conn::start(&topo, true, Duration::from_secs(15));
    let all = [&a4, &a6, &b4, &b6];
    let flowing = |when: &str| assert_flowing(&all, 5, Duration::from_secs(5), when);
    flowing("first start");

    // SIGKILL: the pinned datapath forwards with nobody home.
    assert!(!rd
        .stop_with(libc::SIGKILL, Duration::from_secs(5))
        .success());
    assert_eq!(attached(&topo.node, "n0"), (true, 1), "pinned links stay");
    flowing("rivorad SIGKILLed");
    // Start again: adopts, swaps its own program in behind the link.
    rd.restart(&persist);
    let (prog2, tag2) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_ne!(prog2, prog1, "the second start swapped its program in");
    assert_eq!(tag2, tag1, "same build, same instructions");
    flowing("after the restart");
    // SIGTERM with the flag detaches nothing; the variant build swaps in.
    assert!(rd.stop().success(), "clean exit:\n{}", rd.log_text());
    assert_eq!(attached(&topo.node, "n0"), (true, 1), "still attached");
    flowing("rivorad stopped");
    rd.spawn(&variant, &persist);
    rd.wait_ready(READY);
    let (prog3, tag3) = link_prog(&xdp_pin).expect("pinned XDP link");
    assert_ne!(prog3, prog2, "the variant's program swapped in");
    assert_ne!(tag3, tag1, "the variant runs different instructions");
    flowing("after the hot swap to the variant");

    // The `a*` connections end here: nothing lost on the way.
    let (ba4, ba6) = (a4.backend.clone(), a6.backend.clone());
    let (ra4, ra6) = (a4.finish(), a6.finish());
    for (c, b, src, fam) in [(&ra4, &ba4, src4, "IPv4"), (&ra6, &ba6, src6, "IPv6")] {
        let when = format!("{fam}, across the persistent restarts and the swap");
        assert_one_flow(c, b, src, &DEFAULT_PORTS, &when);
        assert_eq!(
            c.retransmits,
            Some(0),
            "{when}: the client retransmitted (a segment or its ACK lost): {c:?}"
        );
    }

    // The variant stops (still attached); the default build starts
    // without the flag: it takes the pinned links over (no gap) and
    // unpins them, so its SIGTERM detaches.
    assert!(rd.stop().success(), "clean exit:\n{}", rd.log_text());
    rd.restart(&[]);
    assert!(!xdp_pin.exists(), "unpinned by a start without the flag");
    let b = [&b4, &b6];
    assert_flowing(&b, 5, Duration::from_secs(5), "after the takeover");
    let detach = Instant::now();
    assert!(rd.stop().success(), "clean exit:\n{}", rd.log_text());
    assert_eq!(
        attached(&topo.node, "n0"),
        (false, 0),
        "detached on SIGTERM"
    );
    assert!(pins.join("vip_map").exists(), "the maps stay pinned");
    // Straight back, as `systemctl restart` would.
    rd.restart(&[]);
    let down = detach.elapsed();
    assert_eq!(attached(&topo.node, "n0"), (true, 1), "attached again");
    let resumed = assert_flowing(&b, 1, Duration::from_secs(15), "after the detached restart");
    assert_flowing(&b, 5, Duration::from_secs(5), "after the detached restart");
    let (bb4, bb6) = (b4.backend.clone(), b6.backend.clone());
    let (rb4, rb6) = (b4.finish(), b6.finish());
    for (c, b, src, fam) in [(&rb4, &bb4, src4, "IPv4"), (&rb6, &bb6, src6, "IPv6")] {
        let when = format!("{fam}, across a restart without -persist-datapath");
        assert_one_flow(c, b, src, &DEFAULT_PORTS, &when);
    }
    stop_clean(rd, &topo);
    drop(servers);
    eprintln!(
        "restarts: {:?} in all. Persistent restarts and swap: slowest echo {:?} (IPv4), {:?} \
         (IPv6), retransmits {:?} {:?}. Without the flag: detached from SIGTERM to ready for \
         {down:?}, first echo {resumed:?} after ready; slowest echo {:?} (IPv4), {:?} (IPv6), \
         retransmits {:?} {:?}",
        t0.elapsed(),
        ra4.slowest_echo,
        ra6.slowest_echo,
        ra4.retransmits,
        ra6.retransmits,
        rb4.slowest_echo,
        rb6.slowest_echo,
        rb4.retransmits,
        rb6.retransmits
    );
}
