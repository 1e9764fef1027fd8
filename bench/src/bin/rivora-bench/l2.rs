//! The L2 speaker with the real rivorad `-kubernetes` on three
//! node namespaces, a real kube-apiserver (`scripts/apiserver.sh`), and a
//! client that uses the kernel's own neighbour table:
//!
//! ```text
//!   client c0 .2   prober p0 .3        10.201.1.0/24, fd00:201:1::/64
//!        |             |               VIPs .200 and ::200, on-link
//!   [br0 in the switch namespace, MLD snooping on]
//!     |        |        |       |      |
//!   node-1  node-2  node-3   b1 .21  b2 .22   (DSR: the VIPs on lo)
//!    .11     .12     .13
//! ```
//!
//! One LoadBalancer Service (UDP echo) on both VIPs, DSR through a
//! ServicePolicy, in an AddressPool with `l2Announcement: {}`; each node
//! reaches the API server through a proxy of its own that the bench can
//! hang (a partition).
//!
//! What it checks (any failure stops it with the reason) and measures:
//! - one node owns the pool's Lease; `arping` and `ndisc6` from the
//!   client resolve both VIPs to that node's MAC, the client's kernel
//!   resolves them the same, and UDP goes through both;
//! - failovers: under a ping of both VIPs every 10 ms, the owner's
//!   rivorad is SIGKILLed; another takes the Lease; the client, whose
//!   neighbour timings are slowed so that it would not ask again for ten
//!   minutes, sends no ARP request or solicitation for the VIPs, its
//!   neighbour entries now hold the new owner's MAC (the gratuitous
//!   announcement did it), and the ping resumes. `l2_failover_ms`: the
//!   median, over the failovers, of the time from the SIGKILL to the
//!   first answered ping sent after it, the later of the two families;
//! - forced handovers, alternately a partition (the owner's proxy to the
//!   API server hangs: the owner lives on and hears every question) and a
//!   freeze (SIGSTOP, then SIGCONT once another owns the Lease);
//! - `l2_dual_owner_intervals`: a prober asks for both VIPs every 10 ms
//!   (broadcast ARP, solicited-node NS) throughout, captured on its
//!   bridge port by tcpdump; between two consecutive questions, the MACs
//!   that claimed a VIP (an answer, a gratuitous ARP, an advertisement)
//!   are counted, and a maximal run of windows with two or more is an
//!   interval in which two nodes answered when a MAC claimed again after
//!   another had (`rivora_l2::audit`: a handover quicker than one
//!   window, the old owner silent after the new one's first claim, is
//!   not one). Target 0.
//!
//! - `l2_sigterm_handover_ms`: at the end, the owner is SIGTERMed: it goes
//!   quiet and releases its Lease, and the time to another node's owning
//!   it is this figure (no expiry waited for).
//!
//! The Lease timings are the defaults (800 ms, 500 ms, 200 ms).
//! `RIVORA_L2_FAILOVERS` (default 10) and `RIVORA_L2_HANDOVERS` (default
//! 20) make it smaller (the end-to-end test runs it so).

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, CustomResourceExt};
use nix::sys::signal::Signal;
use rivora::dataplane::attach::ifindex;
use rivora::dataplane::AttachedLink;
use rivora::decap::Decap;
use rivora_api::client::Client as ApiClient;
use rivora_l2::frames::{self, Mac};
use rivora_l2::socket::PacketSocket;
use rivora_l2::{audit, pcap};
use serde_json::json;

use crate::k8s::{client, install_crd, runtime, start_api_server};
use rivora_testlab::netns::spawn_in_named;

use crate::restart::{in_ns, rivorad_bin, Lab};
use crate::{median, signal_child, Results};

const NODES: usize = 3;
const BACKENDS: usize = 2;
const VIP4: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 200);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x201, 1, 0, 0, 0, 0, 0x200);
const PORT: u16 = 7000;
const K8S_NS: &str = "rivora-bench-l2";
const POOL: &str = "rivora-bench-l2";
const PING_EVERY: Duration = Duration::from_millis(10);
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// Generous: two cores shared with the API server, etcd and builds.
const READY: Duration = Duration::from_secs(90);
const SETTLE: Duration = Duration::from_secs(30);
/// The client's neighbour timings: an entry stays usable for longer than
/// the run without the client asking again (no reachability probe within
/// ten minutes), so only an announcement can move it.
const CLIENT_NEIGH: &str = "base_reachable_time_ms=600000 delay_first_probe_time=600";

fn lease_name() -> String {
    rivora_l2::plan::lease_name(POOL, None)
}

fn node_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 1, 11 + i as u8)
}

fn node_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x201, 1, 0, 0, 0, 0, 0x11 + i as u16)
}

fn backend_v4(j: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 1, 21 + j as u8)
}

fn backend_v6(j: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x201, 1, 0, 0, 0, 0, 0x21 + j as u16)
}

fn env_count(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a count")),
        Err(_) => Ok(default),
    }
}

fn mac_str(m: Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn parse_mac(s: &str) -> Option<Mac> {
    let v: Vec<u8> = s
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    v.try_into().ok()
}

fn mac_in(ns: &str, dev: &str) -> Result<Mac> {
    let out = in_ns(ns, &format!("ip -o link show dev {dev}"))?;
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .and_then(parse_mac)
        .with_context(|| format!("no MAC for {dev} in {ns}: {out:?}"))
}

// ---------------------------------------------------------------------
// A proxy to the API server that can hang
// ---------------------------------------------------------------------

/// A TCP proxy from `127.0.0.1:port` in a namespace to the API server on
/// the host's loopback. While `hung`, bytes are held in both directions:
/// connections stay open and requests get no answer, as across a
/// partition.
struct HangingProxy {
    stop: Arc<AtomicBool>,
    hung: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl HangingProxy {
    fn start(ns: &str, port: u16) -> Result<Self> {
        let listener = spawn_in_named(ns, move || TcpListener::bind(("127.0.0.1", port)))
            .join()
            .map_err(|_| anyhow::anyhow!("the proxy's bind thread panicked"))?
            .with_context(|| format!("binding the proxy to 127.0.0.1:{port} in {ns}"))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let hung = Arc::new(AtomicBool::new(false));
        let accept = {
            let (stop, hung) = (stop.clone(), hung.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((inner, _)) => {
                            let _ = inner.set_nonblocking(false);
                            let _ = inner.set_nodelay(true);
                            if let Ok(outer) = TcpStream::connect(("127.0.0.1", port)) {
                                let _ = outer.set_nodelay(true);
                                pipe(inner, outer, hung.clone(), stop.clone());
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Ok(Self {
            stop,
            hung,
            accept: Some(accept),
        })
    }

    fn hang(&self, on: bool) {
        self.hung.store(on, Ordering::SeqCst);
    }
}

fn pipe(a: TcpStream, b: TcpStream, hung: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let one = |mut from: TcpStream, mut to: TcpStream| {
        let (hung, stop) = (hung.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                while hung.load(Ordering::SeqCst) && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })
    };
    one(a, b2);
    one(b, a2);
}

impl Drop for HangingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.hung.store(false, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------
// The nodes
// ---------------------------------------------------------------------

struct Node {
    name: String,
    ns: String,
    home: PathBuf,
    mac: Mac,
    config: PathBuf,
    socket: PathBuf,
    pins: PathBuf,
    state: PathBuf,
    log: PathBuf,
    proxy: HangingProxy,
    child: Option<Child>,
    runs: usize,
}

impl Node {
    fn spawn(&mut self, kubeconfig: &PathBuf) -> Result<()> {
        self.runs += 1;
        let log = self.home.join(format!("rivorad-{}.log", self.runs));
        let out = fs::File::create(&log).context("creating rivorad's log")?;
        let err = out.try_clone()?;
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .arg(rivorad_bin()?)
            .arg("-kubernetes")
            .arg("-kubeconfig")
            .arg(kubeconfig)
            .args(["-node-name", &self.name])
            .arg("-config")
            .arg(&self.config)
            .arg("-pin-dir")
            .arg(&self.pins)
            .arg("-state-dir")
            .arg(&self.state)
            .args(["-log-format", "json"])
            .env("RUST_LOG", "info,rivora_lease=debug")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .context("starting rivorad")?;
        self.child = Some(child);
        self.log = log;
        Ok(())
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY;
        loop {
            if fs::read_to_string(&self.log)
                .unwrap_or_default()
                .contains(r#""message":"ready""#)
            {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait()? {
                    bail!("{} exited ({st}): {}", self.name, self.log_tail());
                }
            }
            ensure!(
                Instant::now() < deadline,
                "{} not ready in {READY:?}: {}",
                self.name,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn signal(&self, sig: Signal) {
        if let Some(c) = &self.child {
            signal_child(c, sig);
        }
    }

    fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            signal_child(&c, Signal::SIGKILL);
            c.wait().context("reaping rivorad")?;
        }
        // No -persist-datapath: the links went with the process; the maps
        // stay pinned for the next start to adopt, as on a real node.
        Ok(())
    }

    /// Whether this node says it owns the pool's group; None when it does
    /// not answer (frozen, dead) or does not stand for the group.
    fn owns(&self) -> Option<bool> {
        let st = ApiClient::unix(&self.socket)
            .with_timeout(Duration::from_millis(500))
            .status()
            .ok()?;
        let name = lease_name();
        st.l2?
            .groups
            .into_iter()
            .find(|g| g.name == name)
            .map(|g| g.owner)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal_child(&c, Signal::SIGCONT);
            signal_child(&c, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = rivora::daemon::cleanup(&self.pins);
        let _ = fs::remove_dir_all(&self.pins);
        let _ = fs::copy(
            &self.log,
            crate::out_dir().join(format!("l2-{}.log", self.name)),
        );
    }
}

/// The node that says it owns the group, once exactly one does (the
/// others standing by), within `limit`.
fn wait_owner(nodes: &[Node], skip: &[usize], limit: Duration) -> Result<usize> {
    let deadline = Instant::now() + limit;
    loop {
        let owners: Vec<usize> = (0..nodes.len())
            .filter(|i| !skip.contains(i))
            .filter(|i| nodes[*i].owns() == Some(true))
            .collect();
        if owners.len() == 1 {
            return Ok(owners[0]);
        }
        ensure!(
            Instant::now() < deadline,
            "no single owner of {} within {limit:?} (owners: {owners:?}); logs:\n{}",
            lease_name(),
            nodes
                .iter()
                .map(|n| format!("--- {}\n{}", n.name, n.log_tail()))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait until node `i` says it stands for the group without owning it.
fn wait_standing(nodes: &[Node], i: usize, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while nodes[i].owns() != Some(false) {
        ensure!(
            Instant::now() < deadline,
            "{} does not stand for {} within {limit:?}: {}",
            nodes[i].name,
            lease_name(),
            nodes[i].log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

// ---------------------------------------------------------------------
// Traffic: UDP echo on the backends, a 10 ms ping from the client
// ---------------------------------------------------------------------

struct Echo {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Echo {
    fn start(backends: &[String]) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for ns in backends {
            for addr in [
                SocketAddr::new(VIP4.into(), PORT),
                SocketAddr::new(VIP6.into(), PORT),
            ] {
                let sock = spawn_in_named(ns, move || UdpSocket::bind(addr))
                    .join()
                    .map_err(|_| anyhow::anyhow!("bind thread panicked"))?
                    .with_context(|| format!("binding the echo to {addr} in {ns}"))?;
                sock.set_read_timeout(Some(Duration::from_millis(50)))?;
                let stop = stop.clone();
                threads.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 1500];
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                            let _ = sock.send_to(&buf[..n], peer);
                        }
                    }
                }));
            }
        }
        Ok(Self { stop, threads })
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Sequence numbers sent and answered, with when.
#[derive(Default)]
struct PingLog {
    sent: Vec<Instant>,
    answered: BTreeMap<u64, Instant>,
}

/// A ping of one VIP every [`PING_EVERY`] from the client's namespace,
/// through its kernel (its neighbour table resolves the VIP).
struct Pinger {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<PingLog>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Pinger {
    fn start(client: &str, vip: IpAddr) -> Result<Self> {
        let any: SocketAddr = if vip.is_ipv4() {
            "0.0.0.0:0".parse()?
        } else {
            "[::]:0".parse()?
        };
        let target = SocketAddr::new(vip, PORT);
        let sock = spawn_in_named(client, move || -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind(any)?;
            s.connect(target)?;
            Ok(s)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("bind thread panicked"))??;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let recv = sock.try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(PingLog::default()));
        let sender = {
            let (stop, log) = (stop.clone(), log.clone());
            std::thread::spawn(move || {
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let seq = {
                        let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                        l.sent.push(Instant::now());
                        l.sent.len() as u64 - 1
                    };
                    // An error (a refused or unreachable answer to an
                    // earlier one) is the gap being measured: go on.
                    let _ = sock.send(&seq.to_be_bytes());
                    next += PING_EVERY;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else {
                        next = now;
                    }
                }
            })
        };
        let receiver = {
            let (stop, log) = (stop.clone(), log.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(8) = recv.recv(&mut buf) {
                        let seq = u64::from_be_bytes(buf[..8].try_into().unwrap_or_default());
                        let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                        l.answered.entry(seq).or_insert_with(Instant::now);
                    }
                }
            })
        };
        Ok(Self {
            stop,
            log,
            threads: vec![sender, receiver],
        })
    }

    /// When the first ping sent after `t` was answered.
    fn first_answer_after(&self, t: Instant) -> Option<Instant> {
        let l = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let first = l.sent.iter().position(|s| *s > t)? as u64;
        l.answered.range(first..).map(|(_, at)| *at).min()
    }

    /// Wait (bounded) for the first ping sent after `t` to be answered.
    fn wait_answer_after(&self, t: Instant, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(a) = self.first_answer_after(t) {
                return Some(a);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The prober: a broadcast ARP request for VIP4 and a solicitation for
/// VIP6 every [`PROBE_EVERY`], from its own namespace.
struct Prober {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prober {
    fn start(ns: &str, mac: Mac) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = spawn_in_named(ns, move || {
            // The socket is registered with a reactor, though only sent on.
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _in = rt.enter();
            let opened = ifindex("p0")
                .map_err(|e| e.to_string())
                .and_then(|i| PacketSocket::arp(i).map_err(|e| e.to_string()));
            let sock = match opened {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let arp = frames::arp_request(mac, Ipv4Addr::new(10, 201, 1, 3), VIP4);
            let ns = frames::neighbour_solicitation(
                mac,
                Ipv6Addr::new(0xfd00, 0x201, 1, 0, 0, 0, 0, 3),
                VIP6,
            );
            while !st.load(Ordering::Relaxed) {
                let _ = sock.send(&arp);
                let _ = sock.send(&ns);
                std::thread::sleep(PROBE_EVERY);
            }
        });
        ready_rx
            .recv()
            .context("the prober did not start")?
            .map_err(|e| anyhow::anyhow!("the prober's socket: {e}"))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// tcpdump on one of the switch's ports, `arp or icmp6`, into a file.
struct Capture {
    child: Option<Child>,
    file: PathBuf,
}

impl Capture {
    fn start(switch: &str, port: &str, file: PathBuf) -> Result<Self> {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{switch}"))
            // Immediate mode: each frame as it comes, not in batches of up
            // to a second that SIGINT would lose.
            .args(["tcpdump", "-i", port, "--immediate-mode", "-U", "-n", "-w"])
            .arg(&file)
            .arg("arp or icmp6")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting tcpdump (apt-get install tcpdump)")?;
        // It says "listening on" once it captures.
        let stderr = child.stderr.take().context("tcpdump's stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("listening on") => break,
                Some(Ok(_)) => {}
                _ => bail!("tcpdump on {port} did not start"),
            }
            ensure!(Instant::now() < deadline, "tcpdump on {port} did not start");
        }
        // Keep its stderr drained.
        std::thread::spawn(move || for _ in lines {});
        Ok(Self {
            child: Some(child),
            file,
        })
    }

    fn stop(mut self) -> Result<Vec<pcap::Captured>> {
        if let Some(mut c) = self.child.take() {
            signal_child(&c, Signal::SIGINT);
            c.wait().context("waiting for tcpdump")?;
        }
        let bytes =
            fs::read(&self.file).with_context(|| format!("reading {}", self.file.display()))?;
        // Kept beside the results, to be read again with tcpdump -r.
        if let Some(name) = self.file.file_name() {
            let _ = fs::write(
                crate::out_dir().join(format!("l2-{}", name.to_string_lossy())),
                &bytes,
            );
        }
        Ok(pcap::read(&bytes)?)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------
// Reading the captures
// ---------------------------------------------------------------------

fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// The client's neighbour entry for `vip`: its MAC, if it has one.
fn client_neighbour(client: &str, vip: IpAddr) -> Result<Option<Mac>> {
    let out = in_ns(client, &format!("ip neigh show {vip} dev c0"))?;
    Ok(out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .and_then(parse_mac))
}

// ---------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------

/// One failover's record.
struct Failover {
    killed: usize,
    new_owner: usize,
    at: SystemTime,
    v4: Duration,
    v6: Duration,
}

pub fn run(results: &mut Results) -> Result<()> {
    let failovers = env_count("RIVORA_L2_FAILOVERS", 10)?;
    let handovers = env_count("RIVORA_L2_HANDOVERS", 20)?;
    for tool in ["arping", "ndisc6", "tcpdump"] {
        ensure!(
            Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {tool}"))
                .output()?
                .status
                .success(),
            "{tool} is missing (make bench installs iputils-arping, ndisc6 and tcpdump)"
        );
    }
    let api = start_api_server().context("starting the API server")?;
    let rt = runtime()?;
    let client = rt.block_on(client(&api.kubeconfig))?;
    rt.block_on(write_fixture(&client))?;

    // The lab.
    let mut lab = Lab::new("l2")?;
    let sw = lab.ns("sw")?;
    let c = lab.ns("c")?;
    let p = lab.ns("p")?;
    let nss: Vec<String> = (1..=NODES)
        .map(|i| lab.ns(&format!("n{i}")))
        .collect::<Result<_>>()?;
    let bss: Vec<String> = (1..=BACKENDS)
        .map(|j| lab.ns(&format!("b{j}")))
        .collect::<Result<_>>()?;
    for ns in [&sw, &c, &p].into_iter().chain(&nss).chain(&bss) {
        in_ns(
            ns,
            "for s in all default; do echo 0 > /proc/sys/net/ipv6/conf/$s/accept_dad; \
             echo 0 > /proc/sys/net/ipv6/conf/$s/accept_ra; done",
        )?;
    }
    // A bridge as a switch would be: MLD snooping on (the speaker must
    // join the VIPs' solicited-node groups for solicitations to reach it).
    in_ns(
        &sw,
        "ip link add br0 type bridge stp_state 0 && ip link set br0 up",
    )?;
    let plug = |port: &str, ns: &str, dev: &str| -> Result<()> {
        in_ns(
            &sw,
            &format!(
                "ip link add {port} type veth peer name {dev} netns {ns} && \
                 ip link set {port} master br0 && ip link set {port} up"
            ),
        )?;
        in_ns(ns, &format!("ip link set {dev} up"))?;
        Ok(())
    };
    plug("pc", &c, "c0")?;
    plug("pp", &p, "p0")?;
    for (i, ns) in nss.iter().enumerate() {
        plug(&format!("pn{}", i + 1), ns, "n0")?;
        in_ns(
            ns,
            &format!(
                // No forwarding: a node whose rivorad died must not route
                // the VIPs' packets on (to the new owner), which would hide
                // a client's stale neighbour entry.
                "echo 0 > /proc/sys/net/ipv4/ip_forward && \
                 echo 0 > /proc/sys/net/ipv6/conf/all/forwarding && \
                 ip addr add {}/24 dev n0 && ip addr add {}/64 dev n0 nodad",
                node_v4(i),
                node_v6(i)
            ),
        )?;
    }
    for (j, ns) in bss.iter().enumerate() {
        plug(&format!("pb{}", j + 1), ns, "b0")?;
        // DSR: the VIPs on lo, never answered for here.
        in_ns(
            ns,
            &format!(
                "echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore && \
                 echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce && \
                 ip addr add {}/24 dev b0 && ip addr add {}/64 dev b0 nodad && \
                 ip addr add {VIP4}/32 dev lo && ip addr add {VIP6}/128 dev lo nodad",
                backend_v4(j),
                backend_v6(j)
            ),
        )?;
    }
    in_ns(
        &c,
        &format!(
            "ip addr add 10.201.1.2/24 dev c0 && ip addr add fd00:201:1::2/64 dev c0 nodad && \
             ethtool -K c0 tx off >/dev/null && \
             for k in {CLIENT_NEIGH}; do echo ${{k#*=}} > /proc/sys/net/ipv4/neigh/c0/${{k%%=*}}; \
             echo ${{k#*=}} > /proc/sys/net/ipv6/neigh/c0/${{k%%=*}}; done"
        ),
    )?;
    in_ns(
        &p,
        "ip addr add 10.201.1.3/24 dev p0 && ip addr add fd00:201:1::3/64 dev p0 nodad",
    )?;
    // DSR frames leave a node by XDP_TX out of n0: veth delivers them only
    // to a peer that runs XDP itself.
    let pass = Decap::load().context("loading the decap object")?;
    let _pass_links: Vec<AttachedLink> = (1..=NODES)
        .map(|i| {
            let progs = pass.progs()?;
            let port = format!("pn{i}");
            spawn_in_named(&sw, move || -> Result<AttachedLink> {
                Ok(progs.attach_pass(ifindex(&port)?)?)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("attach thread panicked"))?
        })
        .collect::<Result<_>>()?;
    let client_mac = mac_in(&c, "c0")?;
    let prober_mac = mac_in(&p, "p0")?;
    let _echo = Echo::start(&bss)?;

    // The nodes.
    let mut nodes = Vec::new();
    for (i, ns) in nss.iter().enumerate() {
        let home = lab.work.join(format!("node-{}", i + 1));
        fs::create_dir_all(&home)?;
        let socket = home.join("api.sock");
        let config = home.join("node.yaml");
        fs::write(
            &config,
            format!(
                "interfaces:\n  - name: n0\n    xdpMode: native\n\
                 node:\n  l2:\n    lease: {{ namespace: {K8S_NS} }}\n\
                 api:\n  socket: {}\n",
                socket.display()
            ),
        )?;
        nodes.push(Node {
            name: format!("node-{}", i + 1),
            ns: ns.clone(),
            home: home.clone(),
            mac: mac_in(ns, "n0")?,
            config,
            socket,
            pins: PathBuf::from(format!("{}-n{}", lab.pins.display(), i + 1)),
            state: home.join("state"),
            log: home.join("rivorad-0.log"),
            proxy: HangingProxy::start(ns, api.port())?,
            child: None,
            runs: 0,
        });
    }
    let t = Instant::now();
    for n in &mut nodes {
        n.spawn(&api.kubeconfig)?;
    }
    for n in &mut nodes {
        n.wait_ready()?;
    }
    let mut owner = wait_owner(&nodes, &[], SETTLE)?;
    for i in (0..NODES).filter(|i| *i != owner) {
        wait_standing(&nodes, i, SETTLE)?;
    }
    println!(
        "  ({NODES} nodes ready, {} owns {} after {:.1} s)",
        nodes[owner].name,
        lease_name(),
        t.elapsed().as_secs_f64()
    );

    // Resolution by the tools, then by the client's kernel, and traffic.
    let want = mac_str(nodes[owner].mac);
    let arping = in_ns(&c, &format!("arping -c 1 -w 5 -I c0 {VIP4}"))?;
    ensure!(
        arping.to_lowercase().contains(&format!("[{want}]")),
        "arping resolved {VIP4} to another MAC than the owner's {want}:\n{arping}"
    );
    let ndisc = in_ns(&c, &format!("ndisc6 -q -1 -r 5 {VIP6} c0"))?;
    ensure!(
        parse_mac(&ndisc.to_lowercase()) == Some(nodes[owner].mac),
        "ndisc6 resolved {VIP6} to {ndisc:?}, not the owner's {want}"
    );
    // (The client's TX checksum offload is off: a partial checksum does
    // not survive the owner's XDP_TX.)
    let ping4 = Pinger::start(&c, VIP4.into())?;
    let ping6 = Pinger::start(&c, VIP6.into())?;
    let t0 = Instant::now();
    for (fam, p) in [("IPv4", &ping4), ("IPv6", &ping6)] {
        ensure!(
            p.wait_answer_after(t0, Duration::from_secs(10)).is_some(),
            "no UDP answer through the {fam} VIP from the client"
        );
    }
    for vip in [IpAddr::from(VIP4), VIP6.into()] {
        let m = client_neighbour(&c, vip)?;
        ensure!(
            m == Some(nodes[owner].mac),
            "the client's kernel resolved {vip} to {:?}, not the owner's {want}",
            m.map(mac_str)
        );
    }

    let client_cap = Capture::start(&sw, "pc", lab.work.join("client.pcap"))?;
    let prober_cap = Capture::start(&sw, "pp", lab.work.join("prober.pcap"))?;
    let _prober = Prober::start(&p, prober_mac)?;
    std::thread::sleep(Duration::from_millis(300));

    // Failovers: SIGKILL the owner.
    let mut records = Vec::new();
    for k in 0..failovers {
        let killed = owner;
        let at = SystemTime::now();
        let t_kill = Instant::now();
        nodes[killed].kill()?;
        // Pings sent before the process was gone may have been answered
        // through it: the first answered one sent after went through the
        // new owner.
        let t_dead = Instant::now();
        let new_owner = wait_owner(&nodes, &[killed], SETTLE)?;
        let a4 = ping4.wait_answer_after(t_dead, SETTLE);
        let a6 = ping6.wait_answer_after(t_dead, SETTLE);
        let (Some(a4), Some(a6)) = (a4, a6) else {
            bail!(
                "failover {k}: the ping did not resume within {SETTLE:?} (IPv4 {a4:?}, IPv6 {a6:?})"
            );
        };
        for vip in [IpAddr::from(VIP4), VIP6.into()] {
            let m = client_neighbour(&c, vip)?;
            ensure!(
                m == Some(nodes[new_owner].mac),
                "failover {k}: the client's entry for {vip} is {:?}, not the new owner's {}",
                m.map(mac_str),
                mac_str(nodes[new_owner].mac)
            );
        }
        let r = Failover {
            killed,
            new_owner,
            at,
            v4: a4 - t_kill,
            v6: a6 - t_kill,
        };
        println!(
            "  failover {}: {} killed, {} took over; first answered ping after {:.0} ms (IPv4) / {:.0} ms (IPv6)",
            k + 1,
            nodes[killed].name,
            nodes[new_owner].name,
            r.v4.as_secs_f64() * 1e3,
            r.v6.as_secs_f64() * 1e3
        );
        records.push(r);
        owner = new_owner;
        nodes[killed].spawn(&api.kubeconfig)?;
        nodes[killed].wait_ready()?;
        wait_standing(&nodes, killed, SETTLE)?;
    }

    // Forced handovers: a partition, then a freeze, in turn.
    let mut takeovers = Vec::new();
    for k in 0..handovers {
        let old = owner;
        let partition = k % 2 == 0;
        let t = Instant::now();
        if partition {
            nodes[old].proxy.hang(true);
        } else {
            nodes[old].signal(Signal::SIGSTOP);
        }
        let new_owner = wait_owner(&nodes, &[old], SETTLE);
        takeovers.push(t.elapsed());
        if partition {
            nodes[old].proxy.hang(false);
        } else {
            nodes[old].signal(Signal::SIGCONT);
        }
        let new_owner = new_owner.with_context(|| {
            format!(
                "handover {} ({})",
                k + 1,
                if partition { "partition" } else { "freeze" }
            )
        })?;
        wait_standing(&nodes, old, SETTLE)?;
        owner = new_owner;
    }
    // A clean stop: SIGTERM makes the owner go quiet and release its
    // Lease, so another takes it at once rather than at expiry.
    let last = owner;
    let t = Instant::now();
    nodes[last].signal(Signal::SIGTERM);
    let after_term = wait_owner(&nodes, &[last], SETTLE)?;
    let sigterm_ms = t.elapsed().as_secs_f64() * 1e3;
    if let Some(c) = nodes[last].child.as_mut() {
        let deadline = Instant::now() + Duration::from_secs(15);
        while c.try_wait()?.is_none() {
            ensure!(
                Instant::now() < deadline,
                "{} did not exit on SIGTERM",
                nodes[last].name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    ensure!(
        fs::read_to_string(&nodes[last].log)
            .unwrap_or_default()
            .contains("released the Lease"),
        "{} stopped without releasing its Lease: {}",
        nodes[last].name,
        nodes[last].log_tail()
    );
    println!(
        "  SIGTERM of {}: {} owns the Lease after {sigterm_ms:.0} ms",
        nodes[last].name, nodes[after_term].name
    );
    // A few more questions to the last owner, then stop.
    std::thread::sleep(Duration::from_millis(300));
    drop(_prober);
    std::thread::sleep(Duration::from_millis(200));
    let client_frames = client_cap.stop()?;
    let prober_frames = prober_cap.stop()?;

    // The client asked nothing while failing over: the gratuitous
    // announcements moved it.
    for (k, r) in records.iter().enumerate() {
        for (vip, gap) in [(IpAddr::from(VIP4), r.v4), (VIP6.into(), r.v6)] {
            let from = since_epoch(r.at);
            let (asked, claimed) = audit::asked_and_claimed(
                &client_frames,
                client_mac,
                nodes[r.new_owner].mac,
                vip,
                from,
                from + gap,
            );
            ensure!(
                asked == 0,
                "failover {k} ({} killed): the client asked for {vip} {asked} time(s) before its ping resumed: its entry was not moved by an announcement",
                nodes[r.killed].name
            );
            ensure!(
                claimed > 0,
                "failover {k} ({} killed): no announcement of {vip} by the new owner {} reached the client before its ping resumed",
                nodes[r.killed].name,
                nodes[r.new_owner].name
            );
        }
    }
    let (mut dual, mut changes, mut questions) = (0, 0, 0);
    for vip in [IpAddr::from(VIP4), VIP6.into()] {
        let v = audit::judge(&prober_frames, prober_mac, vip);
        let (d, ch) = (v.dual_intervals, v.changes);
        questions += v.questions;
        // Every handover moves the VIP to another MAC: a capture that saw
        // fewer moves missed some of what it is to judge.
        ensure!(
            ch > (failovers + handovers) as u64,
            "the prober's capture shows {ch} changes of the MAC answering for {vip}, fewer than the {} handovers",
            failovers + handovers + 1
        );
        dual += d;
        changes += ch;
    }

    let total: Vec<f64> = records
        .iter()
        .map(|r| r.v4.max(r.v6).as_secs_f64() * 1e3)
        .collect();
    if !total.is_empty() {
        results.set("l2_failover_ms", median(total));
        results.note(format!(
            "l2_failover_ms: SIGKILL of the owner to the first answered 10 ms ping sent after it, the later of IPv4 and IPv6, median of {failovers}; IPv4 alone {:.0} ms, IPv6 alone {:.0} ms. Lease timings: the defaults, duration 800 ms, renew deadline 500 ms, retry period 200 ms",
            median(records.iter().map(|r| r.v4.as_secs_f64() * 1e3).collect()),
            median(records.iter().map(|r| r.v6.as_secs_f64() * 1e3).collect()),
        ));
    }
    results.set("l2_sigterm_handover_ms", sigterm_ms);
    results.set("l2_dual_owner_intervals", dual as f64);
    let takeover = if takeovers.is_empty() {
        String::new()
    } else {
        format!(
            "; a partition or freeze to another node's owning it, median {:.0} ms",
            median(takeovers.iter().map(|d| d.as_secs_f64() * 1e3).collect())
        )
    };
    results.note(format!(
        "l2_dual_owner_intervals: {} handovers ({failovers} SIGKILLs, {handovers} forced: partitions and freezes in turn, one SIGTERM), {questions} prober questions captured, {changes} changes of answering MAC seen{takeover}",
        failovers + handovers + 1,
    ));
    drop(ping4);
    drop(ping6);
    drop(nodes);
    drop(lab);
    Ok(())
}

/// The CRDs, the namespace, the pool, the Service (its addresses written
/// as rivora-controller would), its policy (DSR) and its EndpointSlices.
async fn write_fixture(client: &Client) -> Result<()> {
    install_crd(client, rivora_k8s::ServicePolicy::crd()).await?;
    install_crd(client, rivora_k8s::AddressPool::crd()).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": K8S_NS}}))?,
    )
    .await
    .context("creating the namespace")?;
    let pools: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rivora.io", "v1alpha1", "AddressPool"),
            "addresspools",
        ),
    );
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "rivora.io/v1alpha1",
                "kind": "AddressPool",
                "metadata": {"name": POOL},
                "spec": {
                    "addresses": [format!("{VIP4}/32"), format!("{VIP6}/128")],
                    "l2Announcement": {},
                },
            }))?,
        )
        .await
        .context("creating the AddressPool")?;
    let svcs: Api<Service> = Api::namespaced(client.clone(), K8S_NS);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "echo"},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": rivora_k8s::translate::RIVORA_LB_CLASS,
            "allocateLoadBalancerNodePorts": false,
            "ipFamilyPolicy": "PreferDualStack",
            "ports": [{"name": "echo", "port": PORT, "targetPort": PORT, "protocol": "UDP"}],
        },
    }))?;
    svcs.create(&PostParams::default(), &svc)
        .await
        .context("creating the Service")?;
    let status = json!({"status": {"loadBalancer": {"ingress": [
        {"ip": VIP4.to_string()}, {"ip": VIP6.to_string()}
    ]}}});
    svcs.patch_status("echo", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("writing the Service's ingress IPs")?;
    let policies: Api<rivora_k8s::ServicePolicy> = Api::namespaced(client.clone(), K8S_NS);
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "rivora.io/v1alpha1",
                "kind": "ServicePolicy",
                "metadata": {"name": "echo-dsr"},
                "spec": {"services": ["echo"], "mode": "dsr"},
            }))?,
        )
        .await
        .context("creating the ServicePolicy")?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), K8S_NS);
    for (family, addrs) in [
        (
            "IPv4",
            (0..BACKENDS)
                .map(|j| backend_v4(j).to_string())
                .collect::<Vec<_>>(),
        ),
        (
            "IPv6",
            (0..BACKENDS).map(|j| backend_v6(j).to_string()).collect(),
        ),
    ] {
        let eps: Vec<_> = addrs
            .iter()
            .map(|a| {
                json!({"addresses": [a], "conditions": {"ready": true, "serving": true, "terminating": false}})
            })
            .collect();
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {
                "name": format!("echo-{}", family.to_lowercase()),
                "labels": {"kubernetes.io/service-name": "echo"},
            },
            "addressType": family,
            "ports": [{"name": "echo", "port": PORT, "protocol": "UDP"}],
            "endpoints": eps,
        }))?;
        slices
            .create(&PostParams::default(), &slice)
            .await
            .with_context(|| format!("creating the {family} EndpointSlice"))?;
    }
    Ok(())
}
