//! BGP figures, with the real rivorad (built beside this
//! binary) and FRR (zebra, bgpd, bfdd from Debian) in namespaces:
//!
//! ```text
//!   client c0 10.211.1.2 -- rc 10.211.1.1 [router: FRR, AS 65000] r0 10.211.2.1
//!     -- n0 10.211.2.2 [node: rivorad, AS 65001] n1 10.211.3.1 -- b0 10.211.3.11 [backend]
//! ```
//!
//! The client reaches the VIPs only through the route the router learns
//! from the node.
//!
//! - `bgp_withdraw_ms`: the last (only) backend of a TCP VIP stops
//!   listening (its health check, every 100 ms, fails at once) until the
//!   VIP's /32 is gone from FRR's BGP table (`vtysh ... json`, polled):
//!   the median of 10. Target: at most 1,000 ms.
//! - `bgp_restart_lost_packets`: a numbered UDP stream (5,000/s) from the
//!   client through the router to a NAT VIP while rivorad
//!   (-persist-datapath) stops and starts again; the backend counts every
//!   sequence number. Graceful restart keeps the route in the router.
//!   Target: 0.
//! - `bgp_bfd_detect_ms`: BFD at 100 ms x 3 with FRR's bfdd; the router's
//!   link goes down until rivorad's session says BFD Down
//!   (`rivoractl bgp peers`, polled): the median of 5. Target: at most
//!   3 x 100 ms.

use std::fs;
use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use rivora_testlab::netns::spawn_in_named;
use rivora_testlab::try_sh;

use crate::restart::{in_ns, numbered_stream, Daemon, Lab};
use crate::{median, Results};

const RATE: u64 = 5_000;
const WAIT: Duration = Duration::from_secs(60);

/// FRR in `ns` as instance `name`; its daemons killed on drop.
struct Frr {
    ns: String,
    name: String,
    dir: PathBuf,
}

impl Frr {
    fn start(ns: &str, work: &std::path::Path, conf: &str) -> Result<Self> {
        let name = format!("rvbench{}", std::process::id() % 100_000);
        let dir = work.join("frr");
        fs::create_dir_all(&dir)?;
        fs::create_dir_all(format!("/var/run/frr/{name}"))?;
        try_sh(&format!(
            "chown frr:frr /var/run/frr/{name} {}",
            dir.display()
        ))?;
        let f = dir.join("frr.conf");
        fs::write(
            &f,
            format!("frr defaults traditional\nhostname {name}\n{conf}"),
        )?;
        try_sh(&format!("chown frr:frr {}", f.display()))?;
        let frr = Self {
            ns: ns.to_string(),
            name: name.clone(),
            dir: dir.clone(),
        };
        for d in ["zebra", "bgpd", "bfdd"] {
            in_ns(
                ns,
                &format!(
                    "/usr/lib/frr/{d} -N {name} -u frr -g frr -d -f {} -i {} >/dev/null 2>&1",
                    f.display(),
                    dir.join(format!("{d}.pid")).display()
                ),
            )
            .with_context(|| format!("starting FRR's {d} (apt-get install frr)"))?;
        }
        Ok(frr)
    }

    fn vtysh(&self, cmd: &str) -> String {
        in_ns(
            &self.ns,
            &format!("vtysh -N {} -c '{cmd}' 2>/dev/null", self.name),
        )
        .unwrap_or_default()
    }

    /// Paths of `prefix` in the BGP table, with whether each is stale.
    fn paths(&self, prefix: &str) -> Vec<bool> {
        let v: serde_json::Value =
            serde_json::from_str(&self.vtysh(&format!("show bgp ipv4 unicast {prefix} json")))
                .unwrap_or_default();
        v["paths"]
            .as_array()
            .map(|a| a.iter().map(|p| p["stale"] == true).collect())
            .unwrap_or_default()
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        for d in ["zebra", "bgpd", "bfdd"] {
            if let Ok(pid) = fs::read_to_string(self.dir.join(format!("{d}.pid"))) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let _ = fs::remove_dir_all(format!("/var/run/frr/{}", self.name));
    }
}

fn wait(what: &str, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The backend's TCP listener: accepts (and drops) until stopped, then
/// closes, so that health checks are refused.
struct Listener {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn open(ns: &str, addr: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = spawn_in_named(ns, move || {
            let l = TcpListener::bind(addr).expect("bench listener");
            l.set_nonblocking(true).expect("nonblocking");
            let _ = tx.send(());
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        let _ = rx.recv_timeout(Duration::from_secs(5));
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn close(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn rivoractl() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating rivora-bench")?;
    Ok(exe.with_file_name("rivoractl"))
}

/// rivorad's one BGP session, as `rivoractl -o json bgp peers` gives it.
fn session(sock: &std::path::Path) -> serde_json::Value {
    let Ok(bin) = rivoractl() else {
        return serde_json::Value::Null;
    };
    Command::new(bin)
        .arg("--socket")
        .arg(sock)
        .args(["-o", "json", "bgp", "peers"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .map(|v| v[0].clone())
        .unwrap_or_default()
}

pub fn run(results: &mut Results) -> Result<()> {
    let mut lab = Lab::new("g")?;
    let (c, r, n, b) = (lab.ns("c")?, lab.ns("r")?, lab.ns("n")?, lab.ns("b")?);
    try_sh(&format!(
        "ip link add c0 netns {c} type veth peer name rc netns {r} && \
         ip link add r0 netns {r} type veth peer name n0 netns {n} && \
         ip link add b0 netns {b} type veth peer name n1 netns {n}"
    ))?;
    in_ns(
        &c,
        "ip addr add 10.211.1.2/24 dev c0 && ip link set c0 up && \
         ip route add default via 10.211.1.1 && ethtool -K c0 tx off >/dev/null",
    )?;
    in_ns(
        &r,
        "ip addr add 10.211.1.1/24 dev rc && ip addr add 10.211.2.1/24 dev r0 && \
         ip link set rc up && ip link set r0 up && echo 1 > /proc/sys/net/ipv4/ip_forward",
    )?;
    in_ns(
        &n,
        "ip addr add 10.211.2.2/24 dev n0 && ip addr add 10.211.3.1/24 dev n1 && \
         ip link set n0 up && ip link set n1 up && echo 1 > /proc/sys/net/ipv4/ip_forward && \
         ip route add default via 10.211.2.1",
    )?;
    in_ns(
        &b,
        "ip addr add 10.211.3.11/24 dev b0 && ip link set b0 up && \
         ip route add default via 10.211.3.1",
    )?;
    let frr = Frr::start(
        &r,
        &lab.work,
        "router bgp 65000\n bgp router-id 10.211.2.1\n no bgp ebgp-requires-policy\n bgp graceful-restart\n \
         neighbor 10.211.2.2 remote-as 65001\n neighbor 10.211.2.2 timers connect 1\n neighbor 10.211.2.2 bfd\n\
         bfd\n peer 10.211.2.2\n  receive-interval 100\n  transmit-interval 100\n  detect-multiplier 3\n exit\n",
    )?;
    let sock = lab.work.join("api.sock");
    let cfg = lab.work.join("rivora.yaml");
    fs::write(
        &cfg,
        format!(
            "interfaces:\n  - name: n0\n    xdpMode: native\napi:\n  socket: {}\nvips:\n  - name: stream\n    \
             address: 10.211.100.1\n    port: 5000\n    protocol: udp\n    mode: nat\n    healthCheck: false\n    \
             backends:\n      - {{ address: 10.211.3.11, port: 6000 }}\n  - name: web\n    address: 10.211.100.2\n    \
             port: 80\n    protocol: tcp\n    mode: nat\n    \
             healthCheck: {{ type: tcp, interval: 100ms, timeout: 80ms, rise: 1, fall: 1 }}\n    \
             backends:\n      - {{ address: 10.211.3.11, port: 8080 }}\n\
             bgp:\n  asn: 65001\n  routerId: 10.211.2.2\n  peers:\n    - {{ address: 10.211.2.1, asn: 65000, \
             holdTime: 9s, connectRetry: 1s, bfd: {{ minRx: 100ms, minTx: 100ms, multiplier: 3 }} }}\n",
            sock.display()
        ),
    )?;
    let mut listener = Some(Listener::open(&b, "10.211.3.11:8080"));
    let mut d = Daemon::start(&n, &lab, &cfg, "1.log")?;
    d.ready()?;
    let up = |frr: &Frr| -> Result<()> {
        wait("both routes in FRR, not stale", || {
            [frr.paths("10.211.100.1/32"), frr.paths("10.211.100.2/32")]
                .iter()
                .all(|p| p == &[false])
        })
    };
    up(&frr)?;

    // bgp_withdraw_ms.
    let mut samples = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        if let Some(l) = listener.take() {
            l.close();
        }
        wait("the TCP VIP's route withdrawn", || {
            frr.paths("10.211.100.2/32").is_empty()
        })?;
        samples.push(t0.elapsed().as_secs_f64() * 1e3);
        listener = Some(Listener::open(&b, "10.211.3.11:8080"));
        up(&frr)?;
    }
    results.set("bgp_withdraw_ms", median(samples.clone()));
    results.note(format!(
        "bgp_withdraw_ms: median of 10 (min {:.0}, max {:.0}): the last backend refusing connections (TCP check every 100 ms, fall 1) until the /32 left FRR's BGP table, polled with vtysh (each poll costs ~10-30 ms)",
        samples.iter().copied().fold(f64::MAX, f64::min),
        samples.iter().copied().fold(0.0, f64::max)
    ));

    // bgp_restart_lost_packets.
    // The sender stops first; the sink a moment later, once what was in
    // flight has landed (stopped together, the last few datagrams read
    // as lost).
    let stop = Arc::new(AtomicBool::new(false));
    let sink_stop = Arc::new(AtomicBool::new(false));
    let sink = {
        let stop = sink_stop.clone();
        let sock = spawn_in_named(&b, || UdpSocket::bind("10.211.3.11:6000"))
            .join()
            .map_err(|_| anyhow::anyhow!("bind thread"))??;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let _ = nix::sys::socket::setsockopt(
            &sock,
            nix::sys::socket::sockopt::RcvBufForce,
            &(16 << 20),
        );
        spawn_in_named(&b, move || {
            let mut seen: Vec<bool> = Vec::new();
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    if n >= 8 {
                        let seq = u64::from_be_bytes(buf[..8].try_into().expect("8")) as usize;
                        if seen.len() <= seq {
                            seen.resize(seq + 1, false);
                        }
                        seen[seq] = true;
                    }
                }
            }
            seen
        })
    };
    let sender = {
        let stop = stop.clone();
        spawn_in_named(&c, move || {
            numbered_stream("10.211.100.1:5000", RATE, &stop).map(|(sent, _)| sent)
        })
    };
    let stream_t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let stopped_at = stream_t0.elapsed().as_millis();
    d.stop()?;
    let kept = frr.paths("10.211.100.1/32");
    let started_at = stream_t0.elapsed().as_millis();
    let mut d = Daemon::start(&n, &lab, &cfg, "2.log")?;
    d.ready()?;
    up(&frr)?;
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let sent = sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    std::thread::sleep(Duration::from_millis(200));
    sink_stop.store(true, Ordering::Relaxed);
    let seen = sink.join().map_err(|_| anyhow::anyhow!("sink panicked"))?;
    let missing: Vec<usize> = (0..sent as usize)
        .filter(|&i| !seen.get(i).copied().unwrap_or(false))
        .collect();
    let lost = missing.len();
    results.set("bgp_restart_lost_packets", lost as f64);
    results.note(format!(
        "bgp_restart_lost_packets: {lost} of {sent} datagrams ({RATE}/s through the router) lost across a stop and start of rivorad -persist-datapath (lost: {:?}, the 5,000th sent at 1 s; the stop began at {stopped_at} ms, the start at {started_at} ms); while it was down FRR held the route as {kept:?} (stale: graceful restart)",
        &missing[..missing.len().min(10)]
    ));

    // bgp_bfd_detect_ms.
    let mut samples = Vec::new();
    for _ in 0..5 {
        wait("BFD Up at 300 ms detection", || {
            let s = session(&sock);
            s["state"] == "Established" && s["bfd_state"] == "Up" && s["bfd_detect_ms"] == 300
        })?;
        // Let the fast rate settle on both ends.
        std::thread::sleep(Duration::from_millis(500));
        let t0 = Instant::now();
        in_ns(&r, "ip link set r0 down")?;
        wait("BFD Down", || session(&sock)["bfd_state"] == "Down")?;
        samples.push(t0.elapsed().as_secs_f64() * 1e3);
        in_ns(&r, "ip link set r0 up")?;
    }
    results.set("bgp_bfd_detect_ms", median(samples.clone()));
    results.note(format!(
        "bgp_bfd_detect_ms: median of 5 (min {:.0}, max {:.0}): the router's link down until rivorad's BFD said Down (100 ms x 3 with FRR's bfdd; the API polled, each poll a few ms)",
        samples.iter().copied().fold(f64::MAX, f64::min),
        samples.iter().copied().fold(0.0, f64::max)
    ));
    d.stop()?;
    drop(listener);
    drop(frr);
    Ok(())
}
