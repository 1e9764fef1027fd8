//! End to end with the real rivorad binary: it runs inside the node
//! namespace of a lab (see `common::lab`: client, node, three backends on
//! one switch), programs the datapath from a YAML file, probes the
//! backends, and is steered with the real rivoractl. Nothing here fills a
//! map or attaches a program on the node itself: what forwards is what
//! rivorad made of the file.
//!
//! Scenarios, one test each so that they run in parallel:
//! - each mode (NAT, DSR, L3 DSR) carries real TCP and UDP over IPv4 and
//!   IPv6 VIPs, spread over the three backends (`*_traffic`);
//! - a killed backend is out within fall x interval (+ timeout + slack),
//!   by the timestamp of rivorad's own log line, and no new connection
//!   fails once the maps hold it down (a reload meanwhile keeps it out);
//!   restored, it is back within rise x interval (+ timeout + slack)
//!   (`health_kill_and_restore`);
//! - a drain through rivoractl keeps a long-lived connection flowing while
//!   new connections go elsewhere, also across a reload; undrain restores
//!   (`drain_keeps_long_lived_connection`);
//! - a reload by SIGHUP and by editing the file applies a changed backend
//!   set (`reload_applies_changed_backends`);
//! - a reload of an invalid file keeps the old state forwarding, and shows
//!   and counts the failure (`invalid_reload_keeps_forwarding`);
//! - the API refuses a caller without permission or token
//!   (`api_refuses_unauthorised_callers`);
//! - an invalid file at start: non-zero exit naming file and line, nothing
//!   changed (`invalid_config_at_start_changes_nothing`);
//! - with -persist-datapath the datapath forwards while rivorad is down,
//!   and a restart on a changed file adopts the pinned state (IDs kept)
//!   and removes what the file dropped (`restart_persists_and_adopts`);
//! - drains persist in the state directory: with no file, the maps'
//!   "draining" is taken as a drain for every VIP and written; the file is
//!   written before the maps (a read-only state directory refuses a drain
//!   and changes nothing); drains survive `rivorad -cleanup` then a start;
//!   at start the file wins over the maps (`drains_persist_in_the_state_dir`).
//! - drain and undrain are idempotent in the daemon: a second call in a
//!   row reports unchanged and leaves the maps, the drain file and the API
//!   as they were (`drain_and_undrain_are_idempotent`).
//!
//! Every rivorad runs in an RAII guard (SIGTERM, then SIGKILL; its pins and
//! work directory removed; its log printed if the test panics), every wait
//! has a deadline, and every client step a timeout. Needs root.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use common::netns::{spawn_in, Netns};
use common::rivorad::{attached, Home, Rivorad};
use common::topology::{Mode, Topology, NAT_BACKEND_PORT, VIP_PORT};
use common::traffic::{
    canonical, exchanges, long_lived, tcp_once, wait_for, wait_until, Proto, Servers,
};
use common::unique;
use rivora::abi;
use rivora::dataplane::render::{Health, MapImage, MatchKey};
use rivora::dataplane::{MapStore, Maps};
use rivora::model::{BackendTarget, VipKey};
use serde_json::Value;

/// Connections (TCP) or exchanges (UDP) per spread measurement.
const FLOWS: usize = 120;
/// A broken path fails within this per step (connect, reply).
const STEP: Duration = Duration::from_secs(2);
/// Each serving backend takes at least this share: with a fair 1-in-3
/// split of 120 flows, a count is Binomial(120, 1/3), mean 40, standard
/// deviation 5.2; 15% is 18, 4.3 deviations under the mean (P = 1.6e-6 per
/// check). With two serving backends the margin is wider still.
const MIN_SHARE: f64 = 0.15;

/// Health-check timing of the health test, as in the config below.
const INTERVAL: Duration = Duration::from_millis(300);
const TIMEOUT: Duration = Duration::from_millis(200);
const RISE: u32 = 2;
const FALL: u32 = 2;
/// Scheduling, the apply through the writer and the API poll's period:
/// tests run in parallel on two cores.
const SLACK: Duration = Duration::from_millis(500);
const FAST_HEALTH: &str = "{ type: tcp, interval: 300ms, timeout: 200ms, rise: 2, fall: 2 }";
/// Health checks that stay out of the way (the traffic tests).
const SLOW_HEALTH: &str = "{ type: tcp, interval: 1s, timeout: 500ms, rise: 2, fall: 3 }";

// ---------------------------------------------------------------------
// rivorad, as the API reports it
// ---------------------------------------------------------------------

trait Report {
    fn health_of(&self, target: SocketAddr) -> String;
    fn vip_packets(&self, vip: &str) -> u64;
}

impl Report for Rivorad {
    /// The datapath health rivorad reports for `target` ("healthy",
    /// "draining", "down").
    fn health_of(&self, target: SocketAddr) -> String {
        let list = self.ctl_json(&["backend", "list"]);
        let want = target.to_string();
        list.as_array()
            .expect("backend list is an array")
            .iter()
            .find(|b| b["target"] == want.as_str())
            .unwrap_or_else(|| panic!("no backend {want} in {list}"))["health"]
            .as_str()
            .expect("health is a string")
            .to_string()
    }

    /// Packets rivorad counts for a VIP (`tcp/10.0.0.1:80`).
    fn vip_packets(&self, vip: &str) -> u64 {
        let list = self.ctl_json(&["vip", "list"]);
        list.as_array()
            .expect("vip list is an array")
            .iter()
            .find(|v| v["vip"] == vip)
            .unwrap_or_else(|| panic!("no VIP {vip} in {list}"))["packets"]
            .as_u64()
            .expect("packets")
    }
}

// ---------------------------------------------------------------------
// The configuration file
// ---------------------------------------------------------------------

/// What a test's config holds; `yaml` renders it.
struct Conf<'a> {
    topo: &'a Topology,
    socket: PathBuf,
    /// Serving backends, by index into `topo.backends`.
    backends: Vec<usize>,
    /// VIPs: (IPv6?, protocol).
    vips: Vec<(bool, &'static str)>,
    health: &'static str,
    /// Extra top-level YAML (metrics, API listener).
    extra: String,
    /// Pad the text to this many bytes (same-length rewrites).
    pad_to: Option<usize>,
}

impl<'a> Conf<'a> {
    fn new(topo: &'a Topology, home: &Home) -> Self {
        Self {
            topo,
            socket: home.socket(),
            backends: vec![0, 1, 2],
            vips: vec![(false, "tcp")],
            health: SLOW_HEALTH,
            extra: String::new(),
            pad_to: Some(4096),
        }
    }

    fn yaml(&self) -> String {
        let t = self.topo;
        let mode = match t.mode {
            Mode::Nat => "nat",
            Mode::Dsr => "dsr",
            Mode::L3Dsr => "l3dsr",
            Mode::FullNat => "fullnat",
        };
        let mut y = format!(
            "interfaces:\n  - name: n0\n    xdpMode: native\n\
             node:\n  tunnelSource: {{ ipv4: {}, ipv6: \"{}\" }}\n\
             healthCheck: {}\n\
             api:\n  socket: {}\n{}\
             vips:\n",
            t.node_v4,
            t.node_v6,
            self.health,
            self.socket.display(),
            self.extra
        );
        for &(v6, proto) in &self.vips {
            let (addr, fam) = if v6 {
                (format!("\"{}\"", t.vip6), "6")
            } else {
                (t.vip4.to_string(), "4")
            };
            y += &format!(
                "  - name: {proto}{fam}\n    address: {addr}\n    port: {VIP_PORT}\n    \
                 protocol: {proto}\n    mode: {mode}\n"
            );
            if proto == "udp" {
                y += "    healthCheck: false\n";
            }
            y += "    backends:\n";
            for &i in &self.backends {
                y += &format!("      - {}\n", self.backend_entry(i, v6));
            }
        }
        if let Some(n) = self.pad_to {
            assert!(y.len() < n, "config longer than its padding");
            y += "# padding, so that rewrites keep the length:";
            while y.len() < n - 1 {
                y.push('.');
            }
            y.push('\n');
        }
        y
    }

    /// One backend, on one line (so that a test can break it and know the
    /// line). NAT backends listen on their own port; under DSR the first
    /// backend's MAC is given, the others' are left to rivorad to resolve.
    fn backend_entry(&self, i: usize, v6: bool) -> String {
        let b = &self.topo.backends[i];
        let addr = if v6 {
            format!("\"{}\"", b.v6)
        } else {
            b.v4.to_string()
        };
        match self.topo.mode {
            Mode::Nat | Mode::FullNat => {
                format!("{{ address: {addr}, port: {NAT_BACKEND_PORT} }}")
            }
            Mode::Dsr if i == 0 => format!("{{ address: {addr}, mac: \"{}\" }}", b.mac_str()),
            _ => format!("{{ address: {addr} }}"),
        }
    }
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the config"))
        + 1
}

// ---------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------

/// `FLOWS` exchanges must all succeed, each backend in `serving` must take
/// a fair share and every other backend none; the backend must have seen
/// the client's own address. Returns the counts.
fn assert_spread(
    topo: &Topology,
    what: &str,
    vip: SocketAddr,
    proto: Proto,
    serving: &[usize],
) -> BTreeMap<String, usize> {
    let t0 = Instant::now();
    let results = exchanges(&topo.client, vip, proto, FLOWS, STEP);
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{what}: {proto:?} to {vip}: {} of {} failed (after {:?}); first: {:?}",
        failures.len(),
        results.len(),
        t0.elapsed(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(results.len(), FLOWS, "{what}: every flow ran");
    let mut counts: BTreeMap<String, usize> =
        topo.backends.iter().map(|b| (b.name.clone(), 0)).collect();
    for h in results.into_iter().flatten() {
        assert_eq!(
            h.peer,
            canonical(h.me),
            "{what}: backend {} did not see the client's own address",
            h.backend
        );
        *counts
            .get_mut(&h.backend)
            .unwrap_or_else(|| panic!("{what}: answer from unknown backend {h:?}")) += 1;
    }
    let min = (MIN_SHARE * FLOWS as f64).ceil() as usize;
    for (i, b) in topo.backends.iter().enumerate() {
        let n = counts[&b.name];
        if serving.contains(&i) {
            assert!(
                n >= min,
                "{what}: {proto:?} to {vip}: {} got {n} of {FLOWS}, below {min}; spread {counts:?}",
                b.name
            );
        } else {
            assert_eq!(
                n, 0,
                "{what}: {proto:?} to {vip}: {} is not serving but got {n}; spread {counts:?}",
                b.name
            );
        }
    }
    counts
}

fn vip4(topo: &Topology) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(topo.vip4), VIP_PORT)
}

fn vip6(topo: &Topology) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(topo.vip6), VIP_PORT)
}

/// The API's name of a VIP (`tcp/10.0.0.1:80`).
fn vip_name(proto: &str, vip: SocketAddr) -> String {
    format!("{proto}/{vip}")
}

/// How the API names backend `i` (its target: address and serving port).
fn target(topo: &Topology, i: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(topo.backends[i].v4), topo.backend_port())
}

// ---------------------------------------------------------------------
// 1. Each mode and family carries real traffic
// ---------------------------------------------------------------------

fn traffic(mode: Mode) {
    common::require::root_and_tools("e2e_rivorad");
    let t0 = Instant::now();
    let topo = Topology::new(mode);
    let servers = Servers::for_topology(&topo, true);
    let home = Home::new();
    let mut conf = Conf::new(&topo, &home);
    conf.vips = vec![(false, "tcp"), (false, "udp"), (true, "tcp"), (true, "udp")];
    let mut rd = Rivorad::start(&topo.node, home, &conf.yaml(), &[]);
    let setup = t0.elapsed();
    let (x, t) = attached(&topo.node, "n0");
    assert!(x && t == 1, "{mode:?}: XDP id {x}, TCX egress programs {t}");

    let all = [0, 1, 2];
    let mut spread = Vec::new();
    // Datagrams the node's kernel forwarded during the UDP exchanges, per
    // family.
    let mut udp_forwarded = Vec::new();
    for (v6, vip) in [(false, vip4(&topo)), (true, vip6(&topo))] {
        for proto in [Proto::Tcp, Proto::Udp] {
            let what = format!("{mode:?}");
            let before = topo.node_forwarded();
            let counts = assert_spread(&topo, &what, vip, proto, &all);
            let after = topo.node_forwarded();
            if proto == Proto::Udp {
                udp_forwarded.push(if v6 {
                    after.1 - before.1
                } else {
                    after.0 - before.0
                });
            }
            spread.push((v6, proto, counts));
        }
    }
    // Where the backends saw the requests addressed to: their own address
    // and port under NAT, the VIP otherwise.
    let hits = exchanges(&topo.client, vip4(&topo), Proto::Tcp, 9, STEP);
    for h in hits {
        let h = h.expect("a TCP exchange");
        let b = topo
            .backends
            .iter()
            .find(|b| b.name == h.backend)
            .expect("known backend");
        assert_eq!(
            h.local,
            SocketAddr::new(topo.backend_local(b, false), topo.backend_port()),
            "{mode:?}: where {} saw the request addressed to",
            b.name
        );
    }

    // rivorad's own counters saw the traffic: every UDP request once, every
    // TCP connection at least twice (SYN, ACK).
    let n = FLOWS as u64;
    let p = |proto: &str, vip| rd.vip_packets(&vip_name(proto, vip));
    assert_eq!(p("udp", vip4(&topo)), n, "{mode:?}: v4 UDP packets counted");
    assert_eq!(p("udp", vip6(&topo)), n, "{mode:?}: v6 UDP packets counted");
    assert!(
        p("tcp", vip4(&topo)) >= 2 * (n + 9),
        "{mode:?}: v4 TCP packets"
    );
    assert!(p("tcp", vip6(&topo)) >= 2 * n, "{mode:?}: v6 TCP packets");

    match mode {
        Mode::Dsr => {
            // XDP_TX out, replies straight to the client: the node's kernel
            // forwarded nothing.
            assert_eq!(topo.node_forwarded(), (0, 0), "DSR: node kernel forwarded");
        }
        Mode::L3Dsr => {
            // Every packet rivorad's datapath tunnelled was decapsulated by
            // a backend's program, and each backend took part.
            let sent4 = p("tcp", vip4(&topo)) + p("udp", vip4(&topo));
            let sent6 = p("tcp", vip6(&topo)) + p("udp", vip6(&topo));
            let read = || -> Vec<_> {
                (0..topo.backends.len())
                    .map(|i| topo.decap_stats(i).expect("decap stats in an L3 DSR lab"))
                    .collect()
            };
            // The last FIN/ACKs may still be in flight: let them land.
            let stats = wait_for(Duration::from_secs(2), Duration::from_millis(20), || {
                let s = read();
                let d4: u64 = s.iter().map(|x| x.decap4).sum();
                let d6: u64 = s.iter().map(|x| x.decap6).sum();
                (d4 == sent4 && d6 == sent6).then_some(s)
            });
            let stats = stats.unwrap_or_else(|| {
                panic!(
                    "L3 DSR: decapsulated {:?} vs tunnelled ({sent4}, {sent6})",
                    read()
                )
            });
            for (b, s) in topo.backends.iter().zip(&stats) {
                assert!(s.decap4 > 0 && s.decap6 > 0, "{}: {s:?}", b.name);
                assert_eq!((s.not_vip, s.malformed), (0, 0), "{}: {s:?}", b.name);
            }
        }
        Mode::Nat => {
            // One request and one reply per UDP exchange: the kernel
            // forwards the replies, XDP the requests (the backends'
            // neighbours resolved by then), so about FLOWS per family,
            // not 2 * FLOWS. Slack for the TCP flows' last segments.
            let (least, most) = (FLOWS as u64, (FLOWS + FLOWS / 4) as u64);
            assert!(
                udp_forwarded.iter().all(|n| (least..=most).contains(n)),
                "NAT: the node's kernel forwarded {udp_forwarded:?} datagrams during \
                 {FLOWS} UDP exchanges per family, expected {least} to {most}"
            );
        }
        // Backends see the node's address there, not the client's:
        // tests/e2e_fullnat.rs.
        Mode::FullNat => unreachable!("full NAT's traffic is checked in e2e_fullnat"),
    }

    // A clean stop detaches.
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    assert_eq!(
        attached(&topo.node, "n0"),
        (false, 0),
        "{mode:?}: still attached after exit"
    );
    rd.home.assert_no_leftovers(&topo.node);
    drop(servers);
    eprintln!(
        "{mode:?}: lab and rivorad up in {setup:?}, traffic in {:?}; spread {spread:?}",
        t0.elapsed() - setup
    );
}

#[test]
fn nat_traffic() {
    traffic(Mode::Nat);
}

#[test]
fn dsr_traffic() {
    traffic(Mode::Dsr);
}

#[test]
fn l3dsr_traffic() {
    traffic(Mode::L3Dsr);
}

// ---------------------------------------------------------------------
// 2. Health: a killed backend goes out, a restored one comes back
// ---------------------------------------------------------------------

/// One connection of the background load.
#[derive(Debug)]
struct Attempt {
    start: Instant,
    result: Result<String, String>,
}

/// Every attempt so far, shared with the thread that makes them.
type Attempts = Arc<std::sync::Mutex<Vec<Attempt>>>;

/// New connections to `vip` from the client, one every 10 ms, until
/// `stop`, recorded into `log` as they finish.
fn background_load(
    topo: &Topology,
    vip: SocketAddr,
    stop: Arc<AtomicBool>,
    log: Attempts,
) -> JoinHandle<()> {
    spawn_in(&topo.client, move || {
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            let result = tcp_once(vip, STEP).map(|h| h.backend);
            log.lock()
                .expect("attempts")
                .push(Attempt { start, result });
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// A UTC RFC 3339 timestamp as rivorad's JSON log writes it
/// (`2026-01-02T03:04:05.123456Z`).
fn log_time(ts: &str) -> SystemTime {
    let (date, time) = ts
        .strip_suffix('Z')
        .and_then(|t| t.split_once('T'))
        .unwrap_or_else(|| bad(ts));
    let d: Vec<i64> = date
        .split('-')
        .map(|x| x.parse().unwrap_or_else(|_| bad(ts)))
        .collect();
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<u64> = hms
        .split(':')
        .map(|x| x.parse().unwrap_or_else(|_| bad(ts)))
        .collect();
    if d.len() != 3 || t.len() != 3 {
        bad::<()>(ts);
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard
    // Hinnant's days_from_civil).
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).unwrap_or_else(|_| bad(ts));
    let nanos: u64 = format!("{frac:0<9}")[..9]
        .parse()
        .unwrap_or_else(|_| bad(ts));
    SystemTime::UNIX_EPOCH
        + Duration::from_secs(days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2])
        + Duration::from_nanos(nanos)
}

fn bad<T>(ts: &str) -> T {
    panic!("timestamp {ts:?}")
}

/// When rivorad's reconciler took `target` down (`up` false) or up, by
/// its log line's own timestamp: the first such line after `since`.
fn health_logged(
    rd: &Rivorad,
    target: SocketAddr,
    up: bool,
    since: SystemTime,
) -> Option<SystemTime> {
    let want = target.to_string();
    rd.log_text().lines().find_map(|l| {
        let v: Value = serde_json::from_str(l).ok()?;
        let f = &v["fields"];
        let hit = f["message"] == "health changed"
            && f["backend"] == want.as_str()
            && f["up"] == up
            && v["target"] == "rivora::reconciler";
        if !hit {
            return None;
        }
        let at = log_time(v["timestamp"].as_str()?);
        (at >= since).then_some(at)
    })
}

/// Every change of `target`'s state in backend_health_map, sampled every
/// 2 ms by lookups in the pinned maps: when the datapath was told, not
/// when a poll of the API noticed.
struct MapHealth {
    stop: Arc<AtomicBool>,
    changes: Arc<std::sync::Mutex<Vec<(Instant, Health)>>>,
    handle: Option<JoinHandle<()>>,
}

impl MapHealth {
    fn start(pins: &Path, target: SocketAddr) -> Self {
        let maps = Maps::open(pins).expect("opening the pinned maps");
        let img = maps.read().expect("reading the maps");
        let ids: Vec<u32> = img
            .backends
            .iter()
            .filter(|(_, b)| b.addr == target.ip() && b.port == target.port())
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(ids.len(), 1, "one backend id for {target}: {ids:?}");
        let id = ids[0];
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (st, ch) = (stop.clone(), changes.clone());
        let handle = std::thread::spawn(move || {
            let mut last = None;
            while !st.load(Ordering::Relaxed) {
                let h = maps
                    .backend_health_map
                    .get::<u32, abi::rv_backend_health>(&id)
                    .ok()
                    .flatten()
                    .map(|h| Health::from_raw(h.state));
                if h != last {
                    if let Some(h) = h {
                        ch.lock().expect("changes").push((Instant::now(), h));
                    }
                    last = h;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Self {
            stop,
            changes,
            handle: Some(handle),
        }
    }

    /// The first time the maps held `h` at or after `since`, waiting up to
    /// `limit` for it.
    fn wait(&self, h: Health, since: Instant, limit: Duration) -> Option<Instant> {
        wait_for(limit, Duration::from_millis(5), || {
            self.changes
                .lock()
                .expect("changes")
                .iter()
                .find(|(t, x)| *x == h && *t >= since)
                .map(|(t, _)| *t)
        })
    }

    fn changes(&self) -> Vec<(Instant, Health)> {
        self.changes.lock().expect("changes").clone()
    }
}

impl Drop for MapHealth {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// `rivora_health_probe_duration_seconds_count{result="failure"}`: probes
/// that failed so far.
fn failed_probes(ns: &Netns, metrics: SocketAddr) -> u64 {
    let (code, text) = http_get(ns, metrics, "/metrics", None);
    assert_eq!(code, 200, "GET /metrics: {text}");
    let prefix = "rivora_health_probe_duration_seconds_count{result=\"failure\"} ";
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix:?} in the metrics:\n{text}"))
}

#[test]
fn health_kill_and_restore() {
    common::require::root_and_tools("e2e_rivorad");
    let topo = Topology::new(Mode::Nat);
    let mut servers = Servers::for_topology(&topo, false);
    let home = Home::new();
    let mut conf = Conf::new(&topo, &home);
    conf.health = FAST_HEALTH;
    let metrics: SocketAddr = "127.0.0.1:9440".parse().expect("literal");
    conf.extra = format!("metrics:\n  listen: {metrics}\n");
    let rd = Rivorad::start(&topo.node, home, &conf.yaml(), &[]);
    let vip = vip4(&topo);
    let victim = 1;
    let vt = target(&topo, victim);
    let vname = topo.backends[victim].name.clone();
    // Probes have run: the backends are up by the checker's own word.
    let probed = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        let list = rd.ctl_json(&["backend", "list"]);
        list.as_array()
            .expect("array")
            .iter()
            .all(|b| b["probe"] == "healthy")
            .then_some(())
    });
    assert!(
        probed.is_some(),
        "probes never reported every backend healthy"
    );
    // The probe budget's gauges: some demand, far within the default
    // budget, so no interval is stretched.
    let (code, text) = http_get(&topo.node, metrics, "/metrics", None);
    assert_eq!(code, 200, "GET /metrics: {text}");
    let gauge = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in the metrics:\n{text}"))
    };
    assert!(gauge("rivora_health_probe_demand_per_second") > 0.0);
    assert_eq!(gauge("rivora_health_probe_interval_stretch"), 1.0);
    let health = MapHealth::start(rd.home.pin_dir(), vt);

    let stop = Arc::new(AtomicBool::new(false));
    let attempts: Attempts = Arc::default();
    let load = background_load(&topo, vip, stop.clone(), attempts.clone());
    // Attempts that started at or after `since`, by result.
    let tally = |since: Instant| -> (usize, usize, usize) {
        let a = attempts.lock().expect("attempts");
        let after: Vec<&Attempt> = a.iter().filter(|x| x.start >= since).collect();
        let to_victim = after
            .iter()
            .filter(|x| x.result.as_deref() == Ok(vname.as_str()))
            .count();
        let failed = after.iter().filter(|x| x.result.is_err()).count();
        (after.len(), to_victim, failed)
    };
    // The load reaches the victim before it is killed.
    let t0 = Instant::now();
    wait_until(
        "connections to reach the victim",
        Duration::from_secs(10),
        || tally(t0).1 >= 3,
    );

    // Kill: the listener is closed when this returns; the clocks are read
    // before, so that nothing after the kill is counted before it.
    let killed_wall = SystemTime::now();
    let killed = Instant::now();
    servers.close(victim);
    let out_bound = INTERVAL * FALL + TIMEOUT + SLACK;
    let out_at = wait_for(Duration::from_secs(5), Duration::from_millis(10), || {
        health_logged(&rd, vt, false, killed_wall)
    })
    .unwrap_or_else(|| panic!("{vname} never went down"));
    let took_out = out_at.duration_since(killed_wall).unwrap_or_default();
    let seen_down = health
        .wait(Health::Down, killed, Duration::from_secs(2))
        .unwrap_or_else(|| panic!("{vname} reported down, but not so in the maps"));

    // A reload while it is down does not bring it back, while the checker
    // goes on failing it (FALL + 1 more failed probes).
    rd.sighup();
    let g = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "SIGHUP reload while a backend is down");
    let failed = failed_probes(&topo.node, metrics);
    wait_until(
        "more failed probes after the reload",
        Duration::from_secs(5),
        || failed_probes(&topo.node, metrics) > failed + u64::from(FALL),
    );
    assert_eq!(rd.health_of(vt), "down", "{vname} after a reload");

    let restored_wall = SystemTime::now();
    let restored = Instant::now();
    servers.reopen(&topo.backends[victim].ns, victim);
    let back_bound = INTERVAL * RISE + TIMEOUT + SLACK;
    let back_at = wait_for(Duration::from_secs(5), Duration::from_millis(10), || {
        health_logged(&rd, vt, true, restored_wall)
    })
    .unwrap_or_else(|| panic!("{vname} never came back"));
    let took_back = back_at.duration_since(restored_wall).unwrap_or_default();
    let seen_up = health
        .wait(Health::Healthy, restored, Duration::from_secs(2))
        .unwrap_or_else(|| panic!("{vname} reported healthy, but not so in the maps"));
    // Enough connections after its return to judge its share: with a fair
    // 1-in-3 split of 60, the victim's count is Binomial(60, 1/3), mean
    // 20, standard deviation 3.7; 6 (10%) is 3.8 deviations under.
    wait_until(
        "60 connections after the victim came back",
        Duration::from_secs(20),
        || tally(seen_up).0 >= 60,
    );
    stop.store(true, Ordering::Relaxed);
    load.join().expect("load thread");
    let changes = health.changes();
    drop(health);
    let attempts = std::mem::take(&mut *attempts.lock().expect("attempts"));

    eprintln!(
        "health: out after {took_out:?} (bound {out_bound:?}), back after {took_back:?} \
         (bound {back_bound:?}), by rivorad's log; {} connections",
        attempts.len()
    );
    assert!(
        took_out <= out_bound,
        "{vname} taken out after {took_out:?}, over fall x interval + timeout + slack = {out_bound:?}"
    );
    assert!(
        took_back <= back_bound,
        "{vname} back after {took_back:?}, over rise x interval + timeout + slack = {back_bound:?}"
    );
    // The maps held it down from the moment they said so until it was
    // restored: the reload never let it back in, not even briefly.
    let between: Vec<&(Instant, Health)> = changes
        .iter()
        .filter(|(t, _)| *t > seen_down && *t < seen_up)
        .collect();
    assert!(
        between.is_empty(),
        "{vname}'s health changed in the maps while it was down: {between:?}"
    );

    // The kill was real: connections hashed to the victim failed while the
    // checker had not yet taken it out...
    let failed: Vec<&Attempt> = attempts.iter().filter(|a| a.result.is_err()).collect();
    assert!(
        failed.iter().any(|a| a.start >= killed),
        "no connection failed after the kill: was the backend really stopped?"
    );
    // ...and from the moment the maps held it down, none failed.
    let late: Vec<&&Attempt> = failed.iter().filter(|a| a.start >= seen_down).collect();
    assert!(
        late.is_empty(),
        "{} new connection(s) failed after {vname} was down in the maps: {:?}",
        late.len(),
        late.iter().take(3).map(|a| &a.result).collect::<Vec<_>>()
    );
    // Out means out: nothing reached it until it was restored.
    let leaked = attempts
        .iter()
        .filter(|a| a.start >= seen_down && a.start < restored)
        .filter(|a| a.result.as_deref() == Ok(vname.as_str()))
        .count();
    assert_eq!(leaked, 0, "{vname} got new connections while down");
    // Back means back: a fair share of the connections after it.
    let after: Vec<&Attempt> = attempts.iter().filter(|a| a.start >= seen_up).collect();
    let to_victim = after
        .iter()
        .filter(|a| a.result.as_deref() == Ok(vname.as_str()))
        .count();
    assert!(
        to_victim * 10 >= after.len(),
        "{vname} got {to_victim} of the {} connections after it came back",
        after.len()
    );
}

// ---------------------------------------------------------------------
// 3. Drain: a long-lived connection keeps flowing, new ones go elsewhere
// ---------------------------------------------------------------------

#[test]
fn drain_keeps_long_lived_connection() {
    common::require::root_and_tools("e2e_rivorad");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let home = Home::new();
    let conf = Conf::new(&topo, &home);
    let rd = Rivorad::start(&topo.node, home, &conf.yaml(), &[]);
    let vip = vip4(&topo);
    let all = [0, 1, 2];

    let stop = Arc::new(AtomicBool::new(false));
    // A line every 20 ms, each echo checked.
    let echoed = Arc::new(AtomicU64::new(0));
    let ll = long_lived(
        &topo.client,
        vip,
        Duration::from_millis(20),
        STEP,
        stop.clone(),
        echoed.clone(),
    );
    let first = ll
        .first
        .recv_timeout(STEP * 2)
        .expect("the long-lived connection got no first answer");
    let x = topo
        .backends
        .iter()
        .position(|b| b.name == first)
        .expect("the long-lived connection's backend");
    let others: Vec<usize> = all.iter().copied().filter(|i| *i != x).collect();
    let xt = target(&topo, x).to_string();
    // The long-lived connection keeps exchanging through each phase: at
    // least 5 more exchanges (20 ms apart) before the phase ends.
    let progress = |phase: &str, before: u64| {
        let now = wait_for(Duration::from_secs(3), Duration::from_millis(10), || {
            let now = echoed.load(Ordering::Relaxed);
            (now >= before + 5).then_some(now)
        });
        now.unwrap_or_else(|| {
            panic!(
                "{phase}: the long-lived connection stalled after {} exchanges",
                echoed.load(Ordering::Relaxed) - before
            )
        })
    };

    let mut n = echoed.load(Ordering::Relaxed);
    assert_spread(&topo, "before the drain", vip, Proto::Tcp, &all);
    n = progress("before the drain", n);

    // Drained everywhere: the datapath marks it draining.
    rd.ctl_ok(&["drain", &xt]);
    assert_eq!(rd.health_of(target(&topo, x)), "draining");
    assert_spread(&topo, "drained", vip, Proto::Tcp, &others);
    n = progress("drained", n);
    // An operator drain outlives a reload.
    rd.sighup();
    let g = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "SIGHUP reload while drained");
    assert_eq!(rd.health_of(target(&topo, x)), "draining", "after a reload");
    assert_spread(&topo, "drained, reloaded", vip, Proto::Tcp, &others);
    n = progress("drained, reloaded", n);
    rd.ctl_ok(&["undrain", &xt]);
    assert_eq!(rd.health_of(target(&topo, x)), "healthy");
    assert_spread(&topo, "undrained", vip, Proto::Tcp, &all);
    n = progress("undrained", n);

    // Drained for this VIP only (weight 0 in its Maglev slice).
    let vn = vip_name("tcp", vip);
    rd.ctl_ok(&["drain", &xt, "--vip", &vn]);
    let shown = rd.ctl_json(&["vip", "show", &vn]);
    let drained: Vec<&Value> = shown["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter(|b| b["drained"] == true)
        .collect();
    assert_eq!(drained.len(), 1, "one backend drained for {vn}: {shown}");
    assert_eq!(drained[0]["target"], xt.as_str());
    assert_spread(&topo, "drained for the VIP", vip, Proto::Tcp, &others);
    n = progress("drained for the VIP", n);
    rd.ctl_ok(&["undrain", &xt, "--vip", &vn]);
    assert_spread(&topo, "undrained for the VIP", vip, Proto::Tcp, &all);
    progress("undrained for the VIP", n);

    stop.store(true, Ordering::Relaxed);
    let seen = ll.handle.join().expect("long-lived thread");
    if let Some(e) = &seen.error {
        panic!("the long-lived connection broke: {e}");
    }
    assert!(
        seen.backends.iter().all(|b| *b == first),
        "the long-lived connection moved between backends"
    );
    // The drains went to this test's own -state-dir, not the machine's.
    assert!(
        rd.home.state_dir().join("drains.json").exists(),
        "no drain file in the test's state directory"
    );
    let mut rd = rd;
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    rd.home.assert_no_leftovers(&topo.node);
    drop(servers);
}

// ---------------------------------------------------------------------
// 4. Reload: SIGHUP and a file edit apply a changed backend set
// ---------------------------------------------------------------------

#[test]
fn reload_applies_changed_backends() {
    common::require::root_and_tools("e2e_rivorad");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let home = Home::new();
    let mut conf = Conf::new(&topo, &home);
    conf.backends = vec![0, 1];
    let rd = Rivorad::start(&topo.node, home, &conf.yaml(), &[]);
    let vip = vip4(&topo);
    assert_eq!(rd.generation(), 1);
    assert_spread(&topo, "initial b1 b2", vip, Proto::Tcp, &[0, 1]);

    // b1 out, b3 in, by SIGHUP alone: the watcher cannot see this rewrite.
    conf.backends = vec![1, 2];
    rd.write_config_unseen(&conf.yaml());
    rd.sighup();
    let g = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "SIGHUP reload");
    assert_spread(&topo, "after SIGHUP: b2 b3", vip, Proto::Tcp, &[1, 2]);
    let st = rd.status();
    assert_eq!(st["last_reload"]["ok"], true, "{st}");
    // The datapath's load-time capacities, as loaded (defaults here).
    assert_eq!(st["maglev_size"], 65_537, "{st}");
    assert_eq!(st["flow_table_size"], 131_072, "{st}");
    let per_cpu = st["flow_table_per_cpu"].as_u64().unwrap_or(0);
    assert!(
        per_cpu > 0 && per_cpu <= 131_072 && 131_072 % per_cpu == 0,
        "each CPU keeps an equal share: {st}"
    );

    // b2 out, b1 back, by editing the file (no signal).
    conf.backends = vec![0, 2];
    rd.write_config(&conf.yaml());
    let g = wait_for(Duration::from_secs(4), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 3).then_some(g)
    });
    assert_eq!(g, Some(3), "file-change reload");
    assert_spread(&topo, "after the edit: b1 b3", vip, Proto::Tcp, &[0, 2]);
    // The SIGHUP rewrite was never picked up by the watcher as well.
    assert_eq!(rd.generation(), 3, "one reload per change");
    drop(servers);
}

// ---------------------------------------------------------------------
// 5. An invalid reload keeps the running state, shows and counts it
// ---------------------------------------------------------------------

/// GET `path` over HTTP/1.1 from inside `ns`; (status, headers + body).
fn http_get(ns: &Netns, addr: SocketAddr, path: &str, auth: Option<&str>) -> (u16, String) {
    http(ns, addr, "GET", path, auth)
}

fn http(
    ns: &Netns,
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
) -> (u16, String) {
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, STEP)
            .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        s.set_read_timeout(Some(STEP)).expect("timeout");
        s.write_all(req.as_bytes()).expect("writing the request");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("reading the response");
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        (code, text)
    })
}

/// `rivora_config_reloads_total{result="…"}` from the metrics endpoint.
fn reloads_metric(ns: &Netns, addr: SocketAddr, result: &str) -> u64 {
    let (code, text) = http_get(ns, addr, "/metrics", None);
    assert_eq!(code, 200, "GET /metrics: {text}");
    let prefix = format!("rivora_config_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix:?} in the metrics:\n{text}"))
}

#[test]
fn invalid_reload_keeps_forwarding() {
    common::require::root_and_tools("e2e_rivorad");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let home = Home::new();
    let mut conf = Conf::new(&topo, &home);
    let metrics: SocketAddr = "127.0.0.1:9440".parse().expect("literal");
    conf.extra = format!("metrics:\n  listen: {metrics}\n");
    let good = conf.yaml();
    let rd = Rivorad::start(&topo.node, home, &good, &[]);
    let vip = vip4(&topo);
    let all = [0, 1, 2];
    let cfg = rd.home.config().display().to_string();
    assert_spread(&topo, "valid config", vip, Proto::Tcp, &all);
    assert_eq!(reloads_metric(&topo.node, metrics, "failure"), 0);

    // A type error (a parse failure) on b2's line, seen by SIGHUP only.
    let b2 = topo.backends[1].v4.to_string();
    let b2_entry = conf.backend_entry(1, false);
    // Same length as the good file (the padding gives way).
    let bad1 = pad_like(
        &good.replacen(&b2_entry, &b2_entry.replace(" }", ", weight: heavy }"), 1),
        good.len(),
    );
    let line1 = line_of(&bad1, &format!("address: {b2}"));
    rd.write_config_unseen(&bad1);
    rd.sighup();
    let st = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let st = rd.status();
        (st["last_reload"]["ok"] == false).then_some(st)
    })
    .expect("status never showed the failed reload");
    let err = st["last_reload"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        err.contains(&format!("{cfg}:{line1}")),
        "the reload error names {cfg}:{line1}: {err:?}"
    );
    assert_eq!(st["config_generation"], 1, "nothing applied: {st}");
    assert_eq!(reloads_metric(&topo.node, metrics, "failure"), 1);
    assert_spread(&topo, "after a failed SIGHUP reload", vip, Proto::Tcp, &all);

    // A validation error (weight over the maximum) on b3's line, by edit:
    // the watcher's reload fails the same way.
    let b3 = topo.backends[2].v4.to_string();
    let b3_entry = conf.backend_entry(2, false);
    let bad2 = good.replacen(&b3_entry, &b3_entry.replace(" }", ", weight: 5000000 }"), 1);
    let line2 = line_of(&bad2, &format!("address: {b3}"));
    rd.write_config(&bad2);
    let failures = wait_for(Duration::from_secs(4), Duration::from_millis(100), || {
        let n = reloads_metric(&topo.node, metrics, "failure");
        (n >= 2).then_some(n)
    });
    assert_eq!(failures, Some(2), "failed reloads counted after the edit");
    let st = rd.status();
    let err = st["last_reload"]["error"].as_str().unwrap_or_default();
    assert_eq!(st["last_reload"]["ok"], false, "{st}");
    assert!(
        err.contains(&format!("{cfg}:{line2}")) && err.contains("weight"),
        "the reload error names {cfg}:{line2} and the field: {err:?}"
    );
    assert_spread(&topo, "after a failed edit reload", vip, Proto::Tcp, &all);

    // Through the API as well: rivoractl reload fails, naming the file.
    let out = rd.ctl(&["reload"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "rivoractl reload of an invalid file"
    );
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains(&format!("{cfg}:{line2}")),
        "rivoractl reload: {msg}"
    );
    assert_eq!(reloads_metric(&topo.node, metrics, "failure"), 3);
    assert_eq!(reloads_metric(&topo.node, metrics, "success"), 0);
    assert_eq!(rd.generation(), 1);

    // A valid file again (b2 removed) applies.
    conf.backends = vec![0, 2];
    rd.write_config(&conf.yaml());
    let g = wait_for(Duration::from_secs(4), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "a valid file after failures applies");
    assert_eq!(rd.status()["last_reload"]["ok"], true);
    assert_eq!(reloads_metric(&topo.node, metrics, "success"), 1);
    assert_spread(&topo, "valid again: b1 b3", vip, Proto::Tcp, &[0, 2]);
    drop(servers);
}

/// `text` with its padding dots trimmed or extended to `len` bytes.
fn pad_like(text: &str, len: usize) -> String {
    let (head, pad) = text.split_once("# padding").expect("a padded config");
    let comment = pad.trim_end_matches(['.', '\n']);
    let mut out = format!("{head}# padding{comment}");
    assert!(out.len() < len, "no room in the padding");
    while out.len() < len - 1 {
        out.push('.');
    }
    out.push('\n');
    out
}

// ---------------------------------------------------------------------
// 6. The API refuses callers without permission or token
// ---------------------------------------------------------------------

/// A namespace with one veth pair (`v0` up): enough for rivorad to attach.
fn small_ns(prefix: &str) -> Netns {
    let ns = Netns::new(&unique(prefix));
    ns.exec("ip link add v0 type veth peer name v1 && ip link set v1 up && ip link set v0 up");
    ns
}

const NOBODY: u32 = 65534;

/// Connect to the Unix socket at `path` from a child that dropped to uid
/// and gid 65534 first. Returns 0 if it connected, else the errno of
/// connect; 101-104 mean the child could not even try (setup).
fn connect_as_nobody(path: &Path) -> i32 {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: an all-zero sockaddr_un is valid; the path fits (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let cpath = CString::new(bytes).expect("no NUL in the path");
    // SAFETY: fork in a threaded process; the child only makes
    // async-signal-safe calls (setgroups, setgid, setuid, stat, socket,
    // connect, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
                || libc::geteuid() != NOBODY
            {
                libc::_exit(101);
            }
            // The path itself is reachable: a refusal is the socket's mode.
            let mut st: libc::stat = std::mem::zeroed();
            if libc::stat(cpath.as_ptr(), &mut st) != 0 {
                libc::_exit(102);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                libc::_exit(103);
            }
            let rc = libc::connect(
                fd,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            if rc == 0 {
                libc::_exit(0);
            }
            let e = *libc::__errno_location();
            libc::_exit(if (1..100).contains(&e) { e } else { 104 });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status),
        "the uid-65534 child did not exit normally"
    );
    libc::WEXITSTATUS(status)
}

#[test]
fn api_refuses_unauthorised_callers() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-api-");
    let home = Home::new();
    let token = "s3cret-token-of-the-test";
    let token_file = home.path("token");
    fs::write(&token_file, format!("{token}\n")).expect("writing the token");
    fs::set_permissions(&token_file, fs::Permissions::from_mode(0o600)).expect("chmod token");
    let listen: SocketAddr = "127.0.0.1:9441".parse().expect("literal");
    let yaml = format!(
        "interfaces:\n  - name: v0\napi:\n  socket: {}\n  listen: {listen}\n  tokenFile: {}\nvips: []\n",
        home.socket().display(),
        token_file.display()
    );
    let mut rd = Rivorad::start(&ns, home, &yaml, &[]);
    let (x, t) = attached(&ns, "v0");
    assert!(x && t == 1, "attached: XDP id {x}, TCX {t}");

    // The Unix socket: root gets in, uid 65534 is refused by its mode.
    let st = rd.status();
    assert_eq!(st["config_generation"], 1, "{st}");
    assert_eq!(
        connect_as_nobody(&rd.home.socket()),
        libc::EACCES,
        "connect as uid 65534 (0: it got in; 101-104: the child could not try)"
    );
    let mode = fs::metadata(rd.home.socket())
        .expect("socket metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");

    // The TCP listener: 401 without a token or with a wrong one, for reads
    // and writes alike; the right token gets in.
    let (code, text) = http_get(&ns, listen, "/v1/status", None);
    assert_eq!(code, 401, "no token: {text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "401 names the scheme: {text}"
    );
    let (code, text) = http_get(&ns, listen, "/v1/status", Some("Bearer wrong-token"));
    assert_eq!(code, 401, "wrong token: {text}");
    let (code, text) = http_get(&ns, listen, "/v1/status", Some(token));
    assert_eq!(code, 401, "token without the Bearer scheme: {text}");
    let (code, text) = http(
        &ns,
        listen,
        "POST",
        "/v1/reload",
        Some("Bearer wrong-token"),
    );
    assert_eq!(code, 401, "a write with a wrong token: {text}");
    assert_eq!(rd.generation(), 1, "the refused reload did not run");
    let (code, text) = http_get(&ns, listen, "/v1/status", Some(&format!("Bearer {token}")));
    assert_eq!(code, 200, "right token: {text}");
    assert!(
        text.contains("\"config_generation\":1"),
        "status body: {text}"
    );

    // A clean stop detaches from v0.
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st}");
    assert_eq!(attached(&ns, "v0"), (false, 0), "still attached after exit");
}

// ---------------------------------------------------------------------
// 7. An invalid file at start: non-zero exit naming it, nothing changed
// ---------------------------------------------------------------------

#[test]
fn invalid_config_at_start_changes_nothing() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-bad-");
    let base = |home: &Home| {
        format!(
            "interfaces:\n  - name: v0\napi:\n  socket: {}\nvips:\n  - name: web\n    address: 10.9.0.1\n    \
             port: 80\n    protocol: tcp\n    mode: nat\n    backends:\n      - {{ address: 10.9.1.1, port: 8080 }}\n",
            home.socket().display()
        )
    };
    type Case = (&'static str, fn(String) -> String, &'static str);
    let cases: [Case; 2] = [
        // A parse error: an unknown mode.
        (
            "mode: bogus",
            |y| y.replace("mode: nat", "mode: bogus"),
            "mode: bogus",
        ),
        // A validation error: a weight over the maximum.
        (
            "weight 5000000",
            |y| y.replace("port: 8080 }", "port: 8080, weight: 5000000 }"),
            "address: 10.9.1.1",
        ),
    ];
    for (what, edit, needle) in cases {
        // Each case its own home: fresh pins, state and socket to check.
        let home = Home::new();
        let yaml = edit(base(&home));
        let config = home.config();
        fs::write(&config, &yaml).expect("writing the config");
        let line = line_of(&yaml, needle);
        let mut rd = Rivorad::new(&ns, home);
        rd.spawn(&common::rivorad::rivorad_bin(), &[]);
        // Panics after 10 s; the guard then stops rivorad and cleans up.
        let status = rd.wait_exit(Duration::from_secs(10));
        let text = rd.log_text();
        let created = rd.home.pin_dir().exists();
        assert!(
            !status.success(),
            "{what}: rivorad exited {status}:\n{text}"
        );
        let at = format!("{}:{line}", config.display());
        assert!(text.contains(&at), "{what}: the error names {at}:\n{text}");
        assert!(!created, "{what}: rivorad created its pin directory");
        assert!(
            !rd.home.socket().exists(),
            "{what}: rivorad created its socket"
        );
        assert_eq!(
            attached(&ns, "v0"),
            (false, 0),
            "{what}: something attached to v0"
        );
    }
}

/// Every pinned map's entries as raw bytes (per-CPU values for each CPU),
/// by pin name: equal means byte-identical. A map that cannot be read
/// whole is recorded as its error, so a difference there shows too.
type RawMaps = BTreeMap<String, Result<Vec<(Vec<u8>, Vec<Vec<u8>>)>, String>>;

fn raw_maps(pins: &Path) -> RawMaps {
    use libbpf_rs::{MapCore, MapFlags, MapHandle};
    let mut out = BTreeMap::new();
    for e in fs::read_dir(pins)
        .expect("reading the pin directory")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            continue;
        }
        let entries = MapHandle::from_pinned_path(e.path())
            .map_err(|e| e.to_string())
            .and_then(|m| {
                m.keys()
                    .map(|k| {
                        let v = if m.map_type().is_percpu() {
                            m.lookup_percpu(&k, MapFlags::ANY)
                        } else {
                            m.lookup(&k, MapFlags::ANY).map(|v| v.map(|v| vec![v]))
                        };
                        v.map(|v| (k, v.unwrap_or_default()))
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Result<Vec<_>, String>>()
            });
        out.insert(name, entries);
    }
    out
}

/// A port nothing listens on in `ns` (bound, noted, closed).
fn free_port(ns: &Netns) -> u16 {
    ns.run(|| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    })
}

/// One thing the node lacks, for [`start_refused_changes_nothing`].
struct NodeCase {
    what: &'static str,
    /// The `interfaces:` list, and extra `api:` and top-level lines.
    interfaces: String,
    api: String,
    metrics: String,
    /// Every one must be in rivorad's output.
    says: Vec<String>,
}

const V0: &str = "  - name: v0\n";

impl NodeCase {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            interfaces: V0.into(),
            api: String::new(),
            metrics: String::new(),
            says: vec![],
        }
    }

    /// The file: this case's node settings and one VIP (two with
    /// `new_vip`).
    fn yaml(&self, home: &Home, new_vip: bool) -> String {
        let mut y = format!(
            "interfaces:\n{}api:\n  socket: {}\n{}{}vips:\n  - name: web\n    \
             address: 10.9.0.1\n    port: 80\n    protocol: tcp\n    mode: nat\n    backends:\n      \
             - {{ address: 10.9.1.1, port: 8080 }}\n",
            self.interfaces,
            home.socket().display(),
            self.api,
            self.metrics
        );
        if new_vip {
            y.push_str(
                "  - name: new\n    address: 10.9.0.2\n    port: 80\n    protocol: tcp\n    \
                 mode: nat\n    backends:\n      - { address: 10.9.1.2, port: 8080 }\n",
            );
        }
        y
    }
}

/// The API's TCP listener on a free port of `ns`, with `home`'s token.
fn api_with_token(ns: &Netns, home: &Home, what: &'static str) -> NodeCase {
    let token = home.path("token");
    NodeCase {
        api: format!(
            "  listen: 127.0.0.1:{}\n  tokenFile: {}\n",
            free_port(ns),
            token.display()
        ),
        says: vec![token.display().to_string()],
        ..NodeCase::new(what)
    }
}

/// The case `make` builds for a home, refused on a first start and on a
/// start over the maps a valid start pinned, with a new VIP in the file:
/// a non-zero exit whose message says every `says`, the pinned maps
/// absent or byte-identical, no socket, nothing attached.
fn start_refused_changes_nothing(ns: &Netns, make: &dyn Fn(&Home) -> NodeCase) {
    let refused = |rd: &mut Rivorad, c: &NodeCase, when: &str| {
        rd.spawn(&common::rivorad::rivorad_bin(), &[]);
        let status = rd.wait_exit(Duration::from_secs(10));
        let text = rd.log_text();
        assert!(
            !status.success(),
            "{} ({when}): rivorad exited {status}:\n{text}",
            c.what
        );
        for s in &c.says {
            assert!(
                text.contains(s.as_str()),
                "{} ({when}): the error names {s:?}:\n{text}",
                c.what
            );
        }
        assert!(
            !rd.home.socket().exists(),
            "{} ({when}): rivorad created its socket",
            c.what
        );
        assert_eq!(
            attached(ns, "v0"),
            (false, 0),
            "{} ({when}): something attached to v0",
            c.what
        );
    };

    // A first start: nothing pinned.
    let home = Home::new();
    let c = make(&home);
    fs::write(home.config(), c.yaml(&home, false)).expect("writing the config");
    let mut rd = Rivorad::new(ns, home);
    refused(&mut rd, &c, "first start");
    assert!(
        !rd.home.pin_dir().exists(),
        "{} (first start): rivorad created its pin directory",
        c.what
    );
    drop(rd);

    // Over the maps a valid start pinned, with a new VIP in the file.
    let home = Home::new();
    let good = NodeCase::new("valid").yaml(&home, false);
    let mut rd = Rivorad::start(ns, home, &good, &[]);
    let c = make(&rd.home);
    assert!(rd.stop().success(), "{}: the valid start", c.what);
    let before = raw_maps(rd.home.pin_dir());
    assert!(
        before
            .get("vip_map")
            .is_some_and(|m| m.as_ref().is_ok_and(|m| !m.is_empty())),
        "{}: the valid start pinned its VIP: {:?}",
        c.what,
        before.keys()
    );
    fs::write(rd.home.config(), c.yaml(&rd.home, true)).expect("writing the config");
    refused(&mut rd, &c, "over pinned maps");
    assert!(
        raw_maps(rd.home.pin_dir()) == before,
        "{} (over pinned maps): the maps changed",
        c.what
    );
}

/// What the node must provide is checked at start before any map or
/// link is touched: the token file (present), the listeners (bindable),
/// the interfaces (present). A missing token file once exited only after
/// a new VIP was in the pinned maps and the programs attached.
#[test]
fn unusable_node_settings_at_start_change_nothing() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-node-");
    start_refused_changes_nothing(&ns, &|home| api_with_token(&ns, home, "missing token file"));

    // Held until the cases ran: the metrics address taken.
    let taken = ns.run(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"));
    let addr = taken.local_addr().expect("addr");
    start_refused_changes_nothing(&ns, &|_| NodeCase {
        metrics: format!("metrics:\n  listen: {addr}\n"),
        says: vec![addr.to_string(), "in use".into()],
        ..NodeCase::new("metrics address in use")
    });
    // The API's TCP listener on the same taken address.
    start_refused_changes_nothing(&ns, &|home| {
        fs::write(home.path("token"), "s3cret\n").expect("writing the token");
        fs::set_permissions(home.path("token"), fs::Permissions::from_mode(0o600)).expect("chmod");
        NodeCase {
            api: format!(
                "  listen: {addr}\n  tokenFile: {}\n",
                home.path("token").display()
            ),
            says: vec![addr.to_string(), "in use".into()],
            ..NodeCase::new("API address in use")
        }
    });
    drop(taken);

    start_refused_changes_nothing(&ns, &|_| NodeCase {
        interfaces: format!("{V0}  - name: rvnosuch0\n"),
        says: vec!["interface rvnosuch0: no such interface".into()],
        ..NodeCase::new("no such interface")
    });
}

/// A token file others can read is refused at start (by the API's token
/// loader, which start-up calls before touching anything), and nothing
/// changes.
#[test]
fn world_readable_token_at_start_changes_nothing() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-tok-");
    start_refused_changes_nothing(&ns, &|home| {
        let token = home.path("token");
        fs::write(&token, "s3cret\n").expect("writing the token");
        fs::set_permissions(&token, fs::Permissions::from_mode(0o644)).expect("chmod");
        let mut c = api_with_token(&ns, home, "world-readable token file");
        c.says.push("0644".into());
        c
    });
}

/// Settings a reload cannot change (what is attached and listened on) are
/// not ignored silently: the reload's answer, the status and the log name
/// each, with both values, and say it takes effect at the next restart.
#[test]
fn reload_names_settings_only_a_restart_applies() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-rst-");
    let home = Home::new();
    let started = NodeCase::new("started").yaml(&home, false);
    let rd = Rivorad::start(&ns, home, &started, &[]);
    let port = free_port(&ns);
    let changed = NodeCase {
        interfaces: format!("{V0}  - name: v1\n"),
        metrics: format!("metrics:\n  listen: 127.0.0.1:{port}\n"),
        ..NodeCase::new("changed")
    }
    .yaml(&rd.home, false);
    fs::write(rd.home.config(), &changed).expect("writing the config");
    let out = rd.ctl_ok(&["reload"]);
    let want = [
        "interfaces changed from [v0 (xdpMode auto)] to [v0 (xdpMode auto), v1 (xdpMode auto)]: \
         it takes effect at the next restart"
            .to_string(),
        format!(
            "metrics.listen changed from none to 127.0.0.1:{port}: it takes effect at the next restart"
        ),
    ];
    for w in &want {
        assert!(
            out.contains(&format!("warning: {w}")),
            "rivoractl reload: {out}"
        );
        assert!(rd.log_text().contains(w.as_str()), "the log names {w:?}");
    }
    assert_eq!(
        rd.status()["last_reload"]["warnings"],
        Value::from(want.to_vec()),
        "the status"
    );
    // Indeed not applied: nothing listens there, nothing is on v1.
    assert!(
        ns.run(move || TcpStream::connect(("127.0.0.1", port)).is_err()),
        "metrics listening after a reload"
    );
    assert_eq!(attached(&ns, "v1"), (false, 0));

    // The file as started: nothing pending any more.
    fs::write(rd.home.config(), &started).expect("writing the config");
    let out = rd.ctl_ok(&["reload"]);
    assert!(!out.contains("warning"), "rivoractl reload: {out}");
    assert_eq!(
        rd.status()["last_reload"]["warnings"],
        Value::from(Vec::<String>::new())
    );
}

/// A Maglev table too small for every VIP's weights (issue 20): `rivorad
/// -check` accepts the file with a warning; started on it, the VIPs run
/// with reduced precision and `rivoractl vip show` and the metrics say
/// so; a reload with fewer VIPs gives each the slots its weights need
/// (every slice rebuilt and switched), and both say that too.
#[test]
fn reduced_precision_shows_in_vip_show_and_metrics() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-mgl-");
    let home = Home::new();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port(&ns))
        .parse()
        .expect("an address");
    let socket = home.socket();
    // Canaries at 1 of 1,000: 768 slots each for 0.1 % within 0.05
    // points; five of them and room to rebuild one do not fit 4,096.
    let yaml = |n: u8| {
        let mut y = format!(
            "interfaces:\n  - name: v0\napi:\n  socket: {}\nmetrics:\n  listen: {metrics}\nvips:\n",
            socket.display()
        );
        for i in 1..=n {
            y.push_str(&format!(
                "  - {{address: 10.9.0.{i}, port: 80, protocol: tcp, mode: nat, backends: \
                 [{{address: 10.9.1.1, port: 8080, weight: 1}}, {{address: 10.9.1.2, port: 8080, weight: 999}}]}}\n"
            ));
        }
        y
    };
    let file = home.path("check.yaml");
    fs::write(&file, yaml(5)).expect("writing the file");
    let out = std::process::Command::new(common::rivorad::rivorad_bin())
        .args(["-check", "-maglev-size", "4096", "-config"])
        .arg(&file)
        .output()
        .expect("running rivorad -check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "rivorad -check: {text}");
    assert!(
        text.contains(
            "warning: the Maglev table (4096 slots, rivorad -maglev-size) is too small for every VIP's weights: 5 VIP(s) will run with reduced precision"
        ),
        "rivorad -check: {text}"
    );

    let rd = Rivorad::start(&ns, home, &yaml(5), &["-maglev-size", "4096"]);
    let vip = "tcp/10.9.0.1:80";
    let show = rd.ctl_ok(&["vip", "show", vip]);
    assert!(
        show.contains("(384 slots; weights need 768, wants 768)\nprecision     reduced: 384 of the 768 slots its weights need"),
        "{show}"
    );
    let metric = |name: &str| {
        let (code, text) = http_get(&ns, metrics, "/metrics", None);
        assert_eq!(code, 200, "GET /metrics: {text}");
        let prefix = format!("{name}{{vip=\"{vip}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in the metrics:\n{text}"))
    };
    assert_eq!(metric("rivora_vip_maglev_reduced_precision"), 1);
    assert_eq!(metric("rivora_vip_maglev_slots"), 384);

    fs::write(rd.home.config(), yaml(2)).expect("writing the config");
    let out = rd.ctl_ok(&["reload"]);
    assert!(!out.contains("warning"), "rivoractl reload: {out}");
    let show = rd.ctl_ok(&["vip", "show", vip]);
    assert!(
        show.contains("(768 slots; weights need 768, wants 768)\npackets"),
        "{show}"
    );
    assert_eq!(metric("rivora_vip_maglev_reduced_precision"), 0);
    assert_eq!(metric("rivora_vip_maglev_slots"), 768);
}

// ---------------------------------------------------------------------
// 8. Restart: -persist-datapath forwards while rivorad is down; the next
//    start adopts (IDs kept) and removes what the file no longer lists
// ---------------------------------------------------------------------

/// Service id of each VIP rivorad reports, by VIP name.
fn service_ids(rd: &Rivorad) -> BTreeMap<String, u64> {
    rd.ctl_json(&["vip", "list"])
        .as_array()
        .expect("vip list is an array")
        .iter()
        .map(|v| {
            (
                v["vip"].as_str().expect("vip name").to_string(),
                v["service_id"].as_u64().expect("service_id"),
            )
        })
        .collect()
}

#[test]
fn restart_persists_and_adopts() {
    common::require::root_and_tools("e2e_rivorad");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let home = Home::new();
    let mut conf = Conf::new(&topo, &home);
    conf.vips = vec![(false, "tcp"), (true, "tcp")];
    let persist = ["-persist-datapath"];
    let mut rd = Rivorad::start(&topo.node, home, &conf.yaml(), &persist);
    let all = [0, 1, 2];
    let (tcp4, tcp6, udp4) = (
        vip_name("tcp", vip4(&topo)),
        vip_name("tcp", vip6(&topo)),
        vip_name("udp", vip4(&topo)),
    );
    let before = service_ids(&rd);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        [&tcp4, &tcp6],
        "VIPs at the first start"
    );

    // Down, with its links pinned: the datapath still forwards.
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st}");
    let (x, t) = attached(&topo.node, "n0");
    assert!(x && t == 1, "pinned links stay attached: XDP {x}, TCX {t}");
    assert_spread(&topo, "rivorad down", vip4(&topo), Proto::Tcp, &all);
    assert_spread(&topo, "rivorad down", vip6(&topo), Proto::Tcp, &all);

    // Started again on a changed file: the IPv6 VIP is gone, a UDP VIP new.
    conf.vips = vec![(false, "tcp"), (false, "udp")];
    fs::write(rd.home.config(), conf.yaml()).expect("rewriting the config");
    rd.restart(&persist);
    assert!(
        rd.log_text()
            .contains("took over the pinned link: program swapped in place"),
        "the restart swapped the programs behind the pinned links"
    );
    let after = service_ids(&rd);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        [&tcp4, &udp4],
        "VIPs after the restart"
    );
    assert_eq!(after[&tcp4], before[&tcp4], "the adopted VIP kept its id");
    // The file claimed every adopted VIP it lists before the API served:
    // each is the file's, none unclaimed; the file is the one source and
    // there are no Kubernetes watches.
    let sources: Vec<Value> = rd
        .ctl_json(&["vip", "list"])
        .as_array()
        .expect("vip list is an array")
        .iter()
        .map(|v| v["source"].clone())
        .collect();
    assert_eq!(sources, [Value::from("file"), Value::from("file")]);
    let st = rd.status();
    assert_eq!(st["unclaimed_vips"], 0, "{st}");
    let kinds: Vec<(&str, bool, u64)> = st["sources"]
        .as_array()
        .unwrap_or_else(|| panic!("no sources in {st}"))
        .iter()
        .map(|s| {
            (
                s["kind"].as_str().unwrap_or_default(),
                s["synced"].as_bool().unwrap_or_default(),
                s["objects"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(kinds, [("file", true, 1)], "{st}");
    assert_eq!(st["watches"], Value::from(Vec::<Value>::new()), "{st}");
    assert_spread(&topo, "restarted", vip4(&topo), Proto::Tcp, &all);
    assert_spread(&topo, "restarted", vip4(&topo), Proto::Udp, &all);
    // The VIP the file dropped no longer reaches any backend.
    let gone = exchanges(&topo.client, vip6(&topo), Proto::Tcp, 1, STEP);
    assert!(
        gone.iter().all(|r| r.is_err()),
        "the removed IPv6 VIP still answers: {gone:?}"
    );
    drop(servers);
}

// ---------------------------------------------------------------------
// 9. Drains persist in the state directory: the file is written before
//    the maps, taken from the maps when there is none, and survives
//    `rivorad -cleanup` then a start
// ---------------------------------------------------------------------

/// The drain file under `home`'s state directory as names (VIP, or None
/// for every VIP; backend); None if there is no file.
fn drain_file(home: &Home) -> Option<BTreeSet<(Option<String>, String)>> {
    let path = home.state_dir().join("drains.json");
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("reading {}: {e}", path.display()),
    };
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(v["format"], 1, "{text}");
    let entries = v["drains"].as_array().unwrap_or_else(|| panic!("{text}"));
    Some(
        entries
            .iter()
            .map(|e| {
                let vip: Option<VipKey> =
                    serde_json::from_value(e["vip"].clone()).unwrap_or_else(|x| panic!("{e}: {x}"));
                let b: BackendTarget = serde_json::from_value(e["backend"].clone())
                    .unwrap_or_else(|x| panic!("{e}: {x}"));
                (vip.map(|k| k.to_string()), b.to_string())
            })
            .collect(),
    )
}

/// (VIP, backend) pairs the API reports drained.
fn drained_in_api(rd: &Rivorad) -> BTreeSet<(String, String)> {
    let vips: Vec<rivora::api::VipInfo> =
        serde_json::from_value(rd.ctl_json(&["vip", "list"])).expect("vip list");
    vips.iter()
        .flat_map(|v| {
            v.backends
                .iter()
                .filter(|b| b.drained)
                .map(|b| (v.vip.clone(), b.target.to_string()))
        })
        .collect()
}

/// The pinned maps once what the last apply retired has been cleared:
/// the reconciler clears old slices after a grace period waited for
/// beside it, so right after an answer the maps may still hold slots no
/// service's slice covers (unreachable by any packet). Waits for them to
/// go, so two images compare what the datapath can see, and fails if they
/// never do.
fn map_image(pins: &Path) -> MapImage {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let img = Maps::open(pins)
            .and_then(|m| m.read())
            .expect("reading the pinned maps");
        let live: BTreeSet<u32> = img
            .services
            .values()
            .flat_map(|e| e.slice_start..e.slice_start.saturating_add(e.slice_len))
            .collect();
        let retired: Vec<u32> = img
            .slots
            .keys()
            .filter(|s| !live.contains(s))
            .copied()
            .collect();
        if retired.is_empty() {
            return img;
        }
        assert!(
            Instant::now() < deadline,
            "slots {retired:?} outside every slice were never cleared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Health of every backend id the maps hold for `t`.
fn health_in_maps(img: &MapImage, t: SocketAddr) -> Vec<Health> {
    img.backends
        .iter()
        .filter(|(_, b)| b.addr == t.ip() && b.port == t.port())
        .map(|(id, _)| img.health.get(id).copied().unwrap_or(Health::Down))
        .collect()
}

/// Slots of the TCP VIP `vip`'s Maglev slice that hold `t`.
fn slots_of(img: &MapImage, vip: SocketAddr, t: SocketAddr) -> usize {
    let key = MatchKey::Exact {
        addr: vip.ip(),
        port: vip.port(),
        proto: libc::IPPROTO_TCP as u8,
    };
    let svc = img.matches.get(&key).expect("the VIP in the maps");
    let entry = img.services.get(svc).expect("the VIP's service entry");
    img.slice_of(entry)
        .iter()
        .filter(|id| {
            img.backends
                .get(id)
                .is_some_and(|b| b.addr == t.ip() && b.port == t.port())
        })
        .count()
}

/// `dir` read-only until drop, through a read-only bind mount over
/// itself: root writes through mode bits, not through a read-only mount.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn new(dir: &Path) -> Self {
        let mount = |args: &[&str]| {
            let st = std::process::Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .status()
                .expect("running mount");
            assert!(st.success(), "mount {args:?} {}", dir.display());
        };
        mount(&["--bind"]);
        // From here on the guard unmounts, whatever fails next.
        let guard = Self(dir.to_path_buf());
        mount(&["-o", "remount,bind,ro"]);
        guard
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Two NAT VIPs sharing three backends, probes off (nothing answers at
/// these addresses), for the drain tests.
fn two_vips_three_backends(home: &Home) -> (SocketAddr, SocketAddr, Vec<SocketAddr>, String) {
    let (vip1, vip2): (SocketAddr, SocketAddr) = (
        "10.9.0.1:80".parse().expect("literal"),
        "10.9.0.2:80".parse().expect("literal"),
    );
    let t: Vec<SocketAddr> = (1..=3)
        .map(|i| format!("10.9.1.{i}:8080").parse().expect("literal"))
        .collect();
    let mut yaml = format!(
        "interfaces:\n  - name: v0\napi:\n  socket: {}\nvips:\n",
        home.socket().display()
    );
    for (name, vip) in [("one", vip1), ("two", vip2)] {
        yaml += &format!(
            "  - name: {name}\n    address: {}\n    port: 80\n    protocol: tcp\n    mode: nat\n    \
             healthCheck: false\n    backends:\n",
            vip.ip()
        );
        for b in &t {
            yaml += &format!("      - {{ address: {}, port: 8080 }}\n", b.ip());
        }
    }
    (vip1, vip2, t, yaml)
}

#[test]
fn drains_persist_in_the_state_dir() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-drain-");
    let home = Home::new();
    let pins = home.pin_dir().to_path_buf();
    // No probes: a failed probe would hide a drain (down wins).
    let (vip1, vip2, t, yaml) = two_vips_three_backends(&home);
    let mut rd = Rivorad::start(&ns, home, &yaml, &[]);
    let (n1, n2) = (vip_name("tcp", vip1), vip_name("tcp", vip2));
    let s = |x: &SocketAddr| x.to_string();
    let pair = |v: &str, b: &SocketAddr| (v.to_string(), s(b));

    // A drain for every VIP (b1) and one for one VIP (b2), in the file.
    rd.ctl_ok(&["drain", &s(&t[0])]);
    rd.ctl_ok(&["drain", &s(&t[1]), "--vip", &n1]);
    assert_eq!(
        drain_file(&rd.home),
        Some([(None, s(&t[0])), (Some(n1.clone()), s(&t[1]))].into()),
        "the drain file after two drains"
    );
    assert!(rd.stop().success());

    // 1. No file, maps holding a draining backend (an upgrade from a
    //    binary that kept none): the maps' "draining" is taken as a drain
    //    for every VIP, and written to the file. A drain for one VIP is a
    //    weight of 0 the maps cannot tell from a configured one: not
    //    taken.
    fs::remove_file(rd.home.state_dir().join("drains.json")).expect("removing the drain file");
    assert_eq!(
        health_in_maps(&map_image(&pins), t[0]),
        [Health::Draining],
        "the maps still hold b1 draining"
    );
    rd.restart(&[]);
    assert!(
        rd.log_text()
            .contains("no drain file: took operator drains from backend_health_map"),
        "{}",
        rd.log_text()
    );
    assert_eq!(
        drain_file(&rd.home),
        Some([(None, s(&t[0]))].into()),
        "the drain taken from the maps, written to the file"
    );
    assert_eq!(
        drained_in_api(&rd),
        [pair(&n1, &t[0]), pair(&n2, &t[0])].into(),
        "b1 drained for every VIP, b2's drain for one VIP not taken"
    );
    let img = map_image(&pins);
    assert_eq!(health_in_maps(&img, t[0]), [Health::Draining]);
    assert!(slots_of(&img, vip1, t[1]) > 0, "b2 has its slots again");

    // 2. The file is written before the maps: with the state directory
    //    read-only, drains and undrains are refused and change nothing.
    rd.ctl_ok(&["drain", &s(&t[2]), "--vip", &n2]);
    let want_file = drain_file(&rd.home);
    let want_api = drained_in_api(&rd);
    let img = map_image(&pins);
    assert_eq!(slots_of(&img, vip2, t[2]), 0, "b3 drained for {n2}");
    {
        let _ro = ReadOnly::new(&rd.home.state_dir());
        for (args, what) in [
            (vec!["drain", &s(&t[1])], "a drain for every VIP"),
            (
                vec!["drain", &s(&t[1]), "--vip", &n2],
                "a drain for one VIP",
            ),
            (vec!["undrain", &s(&t[0])], "an undrain for every VIP"),
            (
                vec!["undrain", &s(&t[2]), "--vip", &n2],
                "an undrain for one VIP",
            ),
        ] {
            let out = rd.ctl(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{what} refused: {err}");
            assert!(
                err.contains("saving the drain") && err.contains("drains.json"),
                "{what}: the refusal names the drain file: {err}"
            );
            assert_eq!(map_image(&pins), img, "{what}: the maps unchanged");
            assert_eq!(
                drained_in_api(&rd),
                want_api,
                "{what}: the drains unchanged"
            );
            assert_eq!(
                drain_file(&rd.home),
                want_file,
                "{what}: the file unchanged"
            );
        }
    }
    // Writable again: the same undrain goes through.
    rd.ctl_ok(&["undrain", &s(&t[2]), "--vip", &n2]);
    assert!(slots_of(&map_image(&pins), vip2, t[2]) > 0, "b3 undrained");
    rd.ctl_ok(&["drain", &s(&t[2]), "--vip", &n2]);
    assert!(rd.stop().success());

    // 3. `rivorad -cleanup` removes the maps, not the drains: the next
    //    start writes them into the new maps.
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", ns.path()))
        .arg(common::rivorad::rivorad_bin())
        .args(["-cleanup", "-pin-dir"])
        .arg(&pins)
        .output()
        .expect("running rivorad -cleanup");
    assert!(
        out.status.success(),
        "rivorad -cleanup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!pins.exists(), "pins left after -cleanup");
    assert_eq!(drain_file(&rd.home), want_file, "the file after -cleanup");
    rd.restart(&[]);
    assert_eq!(
        drained_in_api(&rd),
        want_api,
        "drains after -cleanup and a start"
    );
    let img = map_image(&pins);
    assert_eq!(
        health_in_maps(&img, t[0]),
        [Health::Draining],
        "b1 in new maps"
    );
    assert_eq!(
        slots_of(&img, vip2, t[2]),
        0,
        "b3 drained for {n2} in new maps"
    );
    assert!(slots_of(&img, vip1, t[2]) > 0, "b3 serves {n1}");
    assert!(rd.stop().success());

    // 4. The file is the operator's last word: a drain the maps hold but
    //    the file no longer names (an undrain whose map write was lost)
    //    is undone at the next start.
    fs::write(
        rd.home.state_dir().join("drains.json"),
        "{ \"format\": 1, \"drains\": [] }\n",
    )
    .expect("writing an empty drain file");
    rd.restart(&[]);
    assert!(drained_in_api(&rd).is_empty(), "no drains after the start");
    let img = map_image(&pins);
    assert_eq!(
        health_in_maps(&img, t[0]),
        [Health::Healthy],
        "b1 undrained"
    );
    assert!(slots_of(&img, vip2, t[2]) > 0, "b3 serves {n2} again");
    assert!(rd.stop().success());
    rd.home.assert_no_leftovers(&ns);
}

// ---------------------------------------------------------------------
// 10. Drain and undrain are idempotent in the daemon itself
// ---------------------------------------------------------------------

/// `rivoractl -o json VERB ARGS` for a drain or undrain: (changed, the
/// VIPs it applied to).
fn drain_call(rd: &Rivorad, verb: &str, args: &[&str]) -> (bool, BTreeSet<String>) {
    let mut all = vec![verb];
    all.extend_from_slice(args);
    let v = rd.ctl_json(&all);
    let changed = v["changed"]
        .as_bool()
        .unwrap_or_else(|| panic!("{all:?}: no changed: {v}"));
    let vips = serde_json::from_value(v["vips"].clone())
        .unwrap_or_else(|e| panic!("{all:?}: vips: {e}: {v}"));
    (changed, vips)
}

/// Each drain and undrain twice in a row against rivorad: the first call
/// reports changed and changes the maps, the drain file and the API's
/// view; the second reports unchanged and leaves all three exactly as the
/// first left them. An undrain of what was never drained is unchanged
/// from the start. (`api_server` checks only that the routes carry the
/// outcome, against a fake.)
#[test]
fn drain_and_undrain_are_idempotent() {
    common::require::root_and_tools("e2e_rivorad");
    let ns = small_ns("rvd-idem-");
    let home = Home::new();
    let pins = home.pin_dir().to_path_buf();
    // No probes: a verdict would change the maps between two calls.
    let (vip1, vip2, t, yaml) = two_vips_three_backends(&home);
    let mut rd = Rivorad::start(&ns, home, &yaml, &[]);
    let (n1, n2) = (vip_name("tcp", vip1), vip_name("tcp", vip2));
    let (t1, t2) = (t[0], t[1]);
    let (b1, b2) = (t1.to_string(), t2.to_string());
    let both: BTreeSet<String> = [n1.clone(), n2.clone()].into();
    let one: BTreeSet<String> = [n1.clone()].into();
    let state = |rd: &Rivorad| (map_image(&pins), drain_file(&rd.home), drained_in_api(rd));

    // Never drained: an undrain changes nothing, not even the file.
    let before = state(&rd);
    assert_eq!(before.1, None, "no drain file yet");
    assert_eq!(
        drain_call(&rd, "undrain", &[&b1]),
        (false, both.clone()),
        "an undrain of a backend never drained"
    );
    assert_eq!(state(&rd), before, "nothing changed by a no-op undrain");

    struct Step<'a> {
        verb: &'a str,
        args: Vec<&'a str>,
        vips: &'a BTreeSet<String>,
        /// What the first call must have done to the maps.
        effect: &'a str,
        applied: Box<dyn Fn(&MapImage) -> bool>,
    }
    let steps = [
        Step {
            verb: "drain",
            args: vec![&b1],
            vips: &both,
            effect: "b1 draining",
            applied: Box::new(move |img| health_in_maps(img, t1) == [Health::Draining]),
        },
        Step {
            verb: "drain",
            args: vec![&b2, "--vip", &n1],
            vips: &one,
            effect: "b2 out of one's slice only",
            applied: Box::new(move |img| {
                slots_of(img, vip1, t2) == 0 && slots_of(img, vip2, t2) > 0
            }),
        },
        Step {
            verb: "undrain",
            args: vec![&b2, "--vip", &n1],
            vips: &one,
            effect: "b2 back in one's slice",
            applied: Box::new(move |img| slots_of(img, vip1, t2) > 0),
        },
        Step {
            verb: "undrain",
            args: vec![&b1],
            vips: &both,
            effect: "b1 healthy",
            applied: Box::new(move |img| health_in_maps(img, t1) == [Health::Healthy]),
        },
    ];
    let mut prev = before;
    for Step {
        verb,
        args,
        vips,
        effect,
        applied,
    } in steps
    {
        let what = format!("{verb} {args:?}");
        assert_eq!(
            drain_call(&rd, verb, &args),
            (true, vips.clone()),
            "{what}, the first time"
        );
        let after = state(&rd);
        assert_ne!(after, prev, "{what} changed something");
        assert!(applied(&after.0), "{what}: {effect} in the maps");
        assert_eq!(
            drain_call(&rd, verb, &args),
            (false, vips.clone()),
            "{what}, the second time"
        );
        assert_eq!(
            state(&rd),
            after,
            "{what} again: maps, drain file and API as the first left them"
        );
        prev = after;
    }
    assert!(
        prev.2.is_empty(),
        "nothing drained at the end: {:?}",
        prev.2
    );
    assert_eq!(prev.1, Some(BTreeSet::new()), "an empty drain file");

    assert!(rd.stop().success());
    rd.home.assert_no_leftovers(&ns);
}
