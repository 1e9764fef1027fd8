//! Restart figures, with the real rivorad binary (built beside
//! this one) run in network namespaces with -persist-datapath:
//!
//! - `hotswap_gap_packets`: a numbered UDP stream through a NAT VIP
//!   (client -> node -> backend, routed veths), while a second rivorad
//!   start swaps the programs behind the pinned links; the backend counts
//!   every sequence number, and the figure is how many never arrived.
//! - `restart_adopt_ms`: from process start to the "ready" log line with
//!   4,096 VIPs (2 backends each) pinned by an earlier run: the median of
//!   5 restarts.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use nix::sys::socket::{setsockopt, sockopt};

use rivora::dataplane::Datapath;
use rivora_testlab::netns::spawn_in_named;
use rivora_testlab::paced::{send_retrying, Pacer};
use rivora_testlab::try_sh;

use crate::{median, signal_child, Results};

/// Datagrams per second in the hot-swap stream.
const RATE: u64 = 20_000;
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Namespaces, a pin directory and a work directory, removed on drop
/// (also on error).
pub(crate) struct Lab {
    tag: String,
    namespaces: Vec<String>,
    pub(crate) pins: PathBuf,
    pub(crate) work: PathBuf,
}

impl Lab {
    pub(crate) fn new(kind: &str) -> Result<Self> {
        let tag = format!("rvb{kind}{}", std::process::id() % 100_000);
        let work = std::env::temp_dir().join(format!("rivora-bench-{tag}"));
        fs::create_dir_all(&work).context("work dir")?;
        Ok(Self {
            pins: PathBuf::from(format!("/sys/fs/bpf/rivora-bench-{tag}")),
            tag,
            namespaces: Vec::new(),
            work,
        })
    }

    pub(crate) fn ns(&mut self, name: &str) -> Result<String> {
        let full = format!("{}{name}", self.tag);
        let _ = try_sh(&format!("ip netns del {full} 2>/dev/null"));
        try_sh(&format!("ip netns add {full}"))?;
        self.namespaces.push(full.clone());
        in_ns(&full, "ip link set lo up")?;
        Ok(full)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = rivora::daemon::cleanup(&self.pins);
        let _ = Datapath::unpin_all(&self.pins);
        for ns in &self.namespaces {
            let _ = try_sh(&format!("ip netns del {ns}"));
        }
        let _ = fs::remove_dir_all(&self.work);
    }
}

pub(crate) fn in_ns(ns: &str, cmd: &str) -> Result<String> {
    Ok(try_sh(&format!(
        "nsenter --net=/run/netns/{ns} sh -c '{}'",
        cmd.replace('\'', "'\\''")
    ))?)
}

pub(crate) fn rivorad_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating rivora-bench")?;
    let bin = exe.with_file_name("rivorad");
    anyhow::ensure!(
        bin.exists(),
        "{} not found: build it (make bench builds every binary)",
        bin.display()
    );
    Ok(bin)
}

/// rivorad in `ns`, killed on drop.
pub(crate) struct Daemon(Child, PathBuf, Instant);

impl Daemon {
    pub(crate) fn start(ns: &str, lab: &Lab, cfg: &Path, log: &str) -> Result<Self> {
        let log = lab.work.join(log);
        let err = File::create(&log).context("log file")?;
        let t = Instant::now();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .arg(rivorad_bin()?)
            .arg("-config")
            .arg(cfg)
            .arg("-pin-dir")
            .arg(&lab.pins)
            .arg("-state-dir")
            .arg(lab.work.join("state"))
            .args(["-log-format", "json", "-persist-datapath"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .context("starting rivorad")?;
        Ok(Self(child, log, t))
    }

    /// Time from spawn to the "ready" line.
    pub(crate) fn ready(&mut self) -> Result<Duration> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(f) = File::open(&self.1) {
                if BufReader::new(f)
                    .lines()
                    .map_while(Result::ok)
                    .any(|l| l.contains(r#""message":"ready""#))
                {
                    return Ok(self.2.elapsed());
                }
            }
            if let Some(st) = self.0.try_wait()? {
                bail!(
                    "rivorad exited ({st}):\n{}",
                    fs::read_to_string(&self.1).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("rivorad not ready after {READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub(crate) fn stop(mut self) -> Result<()> {
        signal_child(&self.0, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.0.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("rivorad did not stop");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn run(results: &mut Results) -> Result<()> {
    hotswap(results).context("hotswap_gap_packets")?;
    adopt(results).context("restart_adopt_ms")?;
    Ok(())
}

/// Send datagrams numbered 0, 1, 2, ... (8 bytes, big-endian) to `to` at
/// `rate` a second, paced against the clock, until `stop`: how many were
/// sent and over how long. A receiver that counts the numbers it saw
/// finds every loss.
pub(crate) fn numbered_stream(
    to: &str,
    rate: u64,
    stop: &AtomicBool,
) -> std::io::Result<(u64, Duration)> {
    let s = UdpSocket::bind("0.0.0.0:0")?;
    s.connect(to)?;
    let mut pacer = Pacer::new(rate);
    while !stop.load(Ordering::Relaxed) {
        let k = pacer.wait();
        send_retrying(&s, &k.to_be_bytes())?;
    }
    Ok(pacer.sent())
}

fn hotswap(results: &mut Results) -> Result<()> {
    let mut lab = Lab::new("h")?;
    let (c, n, b) = (lab.ns("c")?, lab.ns("n")?, lab.ns("b")?);
    try_sh(&format!(
        "ip link add c0 netns {c} type veth peer name n0 netns {n} && \
         ip link add b0 netns {b} type veth peer name n1 netns {n}"
    ))?;
    in_ns(
        &c,
        "ip addr add 10.210.1.2/24 dev c0 && ip link set c0 up && \
         ip route add 10.210.100.0/24 via 10.210.1.1 && ethtool -K c0 tx off >/dev/null",
    )?;
    in_ns(
        &n,
        "ip addr add 10.210.1.1/24 dev n0 && ip addr add 10.210.2.1/24 dev n1 && \
         ip link set n0 up && ip link set n1 up && echo 1 > /proc/sys/net/ipv4/ip_forward",
    )?;
    in_ns(
        &b,
        "ip addr add 10.210.2.11/24 dev b0 && ip link set b0 up && \
         ip route add default via 10.210.2.1",
    )?;
    let cfg = lab.work.join("rivora.yaml");
    fs::write(
        &cfg,
        format!(
            "interfaces:\n  - name: n0\n    xdpMode: native\napi:\n  socket: {}\nvips:\n  - name: stream\n    \
             address: 10.210.100.1\n    port: 5000\n    protocol: udp\n    mode: nat\n    healthCheck: false\n    \
             backends:\n      - {{ address: 10.210.2.11, port: 6000 }}\n",
            lab.work.join("api.sock").display()
        ),
    )?;

    let mut d = Daemon::start(&n, &lab, &cfg, "1.log")?;
    d.ready()?;

    // The backend: a bitmap of the sequence numbers seen. The sender stops
    // first and the sink a moment later, once what was in flight has
    // arrived: a sink stopped with the sender missed the stream's last few
    // datagrams and counted them lost (3-12 of them in about half the runs).
    let stop = Arc::new(AtomicBool::new(false));
    let sink_stop = Arc::new(AtomicBool::new(false));
    let sink = {
        let stop = sink_stop.clone();
        let sock = UdpSocket::bind_in(&b, "10.210.2.11:6000")?;
        spawn_in_named(&b, move || {
            let mut seen: Vec<bool> = Vec::new();
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                match sock.recv(&mut buf) {
                    Ok(n) if n >= 8 => {
                        let seq = u64::from_be_bytes(buf[..8].try_into().expect("8")) as usize;
                        if seen.len() <= seq {
                            seen.resize(seq + 1, false);
                        }
                        seen[seq] = true;
                    }
                    _ => {}
                }
            }
            seen
        })
    };
    // The client: RATE datagrams/s, paced against the clock.
    let sender = {
        let stop = stop.clone();
        spawn_in_named(&c, move || {
            numbered_stream("10.210.100.1:5000", RATE, &stop)
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    // The swap: a second start takes the pinned links over.
    d.stop()?;
    let mut d2 = Daemon::start(&n, &lab, &cfg, "2.log")?;
    d2.ready()?;
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let (sent, took) = sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    std::thread::sleep(Duration::from_millis(200));
    sink_stop.store(true, Ordering::Relaxed);
    let seen = sink.join().map_err(|_| anyhow::anyhow!("sink panicked"))?;
    let lost: Vec<usize> = (0..sent as usize)
        .filter(|&i| !seen.get(i).copied().unwrap_or(false))
        .collect();
    let log2 = fs::read_to_string(&d2.1).unwrap_or_default();
    anyhow::ensure!(
        log2.contains("took over the pinned link"),
        "the second start did not take over the pinned links"
    );
    d2.stop()?;
    results.set("hotswap_gap_packets", lost.len() as f64);
    results.note(format!(
        "hotswap_gap_packets: {} of {sent} UDP datagrams lost at {:.0}/s offered ({RATE}/s target) across a stop and a start that swapped the programs behind the pinned links (lost: {:?})",
        lost.len(),
        sent as f64 / took.as_secs_f64(),
        &lost[..lost.len().min(20)]
    ));
    Ok(())
}

/// `UdpSocket::bind` inside a namespace (the socket then lives there).
trait BindIn: Sized {
    fn bind_in(ns: &str, addr: &str) -> Result<Self>;
}

impl BindIn for UdpSocket {
    fn bind_in(ns: &str, addr: &str) -> Result<Self> {
        let addr = addr.to_string();
        let s = spawn_in_named(ns, move || UdpSocket::bind(addr))
            .join()
            .map_err(|_| anyhow::anyhow!("bind thread panicked"))??;
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        // The backend must not drop for want of buffer while the client
        // bursts. Best effort, as before: a smaller buffer only shows as
        // loss in the figure.
        let _ = setsockopt(&s, sockopt::RcvBufForce, &(16 << 20));
        Ok(s)
    }
}

fn adopt(results: &mut Results) -> Result<()> {
    let mut lab = Lab::new("a")?;
    let n = lab.ns("n")?;
    in_ns(
        &n,
        "ip link add n0 type veth peer name n1 && ip link set n0 up && ip link set n1 up",
    )?;
    let vips = rivora::abi::MAX_VIPS;
    let mut y = format!(
        "interfaces:\n  - name: n0\n    xdpMode: native\napi:\n  socket: {}\nvips:\n",
        lab.work.join("api.sock").display()
    );
    for i in 0..vips {
        let (hi, lo) = (i >> 8, i & 0xff);
        y += &format!(
            "  - {{ name: v{i}, address: 10.0.{hi}.{lo}, port: 80, protocol: tcp, mode: nat, healthCheck: false, \
             backends: [{{ address: 10.1.{hi}.{lo}, port: 8080 }}, {{ address: 10.2.{hi}.{lo}, port: 8080 }}] }}\n"
        );
    }
    let cfg = lab.work.join("rivora.yaml");
    fs::write(&cfg, y)?;
    let mut d = Daemon::start(&n, &lab, &cfg, "first.log")?;
    let first = d.ready()?;
    d.stop()?;
    let mut samples = Vec::new();
    for i in 0..5 {
        let mut d = Daemon::start(&n, &lab, &cfg, &format!("again{i}.log"))?;
        samples.push(d.ready()?.as_secs_f64() * 1e3);
        d.stop()?;
    }
    results.set("restart_adopt_ms", median(samples));
    results.note(format!(
        "restart_adopt_ms: median of 5 starts to ready over {vips} pinned VIPs x 2 backends (-persist-datapath); the first start, writing them all, took {:.0} ms",
        first.as_secs_f64() * 1e3
    ));
    Ok(())
}
