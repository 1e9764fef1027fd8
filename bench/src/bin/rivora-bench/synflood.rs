//! SYN flood figures, with the real rivorad in network
//! namespaces (client -> node -> backend, routed veths, a NAT VIP with its
//! own per-source SYN limit):
//!
//! - `synflood_established_loss_pct`: established TCP connections carry
//!   numbered messages, echoed by the backend, while a flood of SYNs from
//!   many spoofed sources hits the same VIP; a message is lost when its
//!   echo does not come back within a second or its connection breaks.
//!   The target is 0.
//! - `synflood_flood_pps`: the SYN rate the flood reached (one raw-socket
//!   sender thread, every SYN counted as sent by the kernel).
//! - `synflood_rate_limited`: SYNs the datapath dropped as rate_limited
//!   during the flood (drop_stats_map).
//!
//! RIVORA_SYNFLOOD_SECS (flood length, default 10) and
//! RIVORA_SYNFLOOD_CONNS (established connections, default 16) size the
//! run; the e2e test runs it small.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use etherparse::{IpNumber, Ipv4Header, TcpHeader};
use nix::sys::socket::{
    sendto, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn,
};

use rivora::abi::{rv_drop_reason, rv_drop_stats};
use rivora::dataplane::Maps;

use rivora_testlab::netns::spawn_in_named;
use rivora_testlab::try_sh;

use crate::restart::{in_ns, Daemon, Lab};
use crate::Results;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 211, 100, 1);
const PORT: u16 = 7000;
const BACKEND: &str = "10.211.2.11:7000";
/// Spoofed sources of the flood: 10.212.0.0/24.
const SOURCES: u32 = 256;
/// The VIP's per-source SYN limit: what a source may open per second.
const RATE_PER_SEC: u32 = 10;
const BURST: u32 = 20;
/// Messages per second on each established connection.
const MSG_RATE: u64 = 200;
/// An echo later than this counts as lost (TCP recovers a lost segment in
/// about 200 ms at best; a second means the connection stalled).
const ECHO_DEADLINE: Duration = Duration::from_secs(1);

fn env_num(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

pub fn run(results: &mut Results) -> Result<()> {
    let secs = env_num("RIVORA_SYNFLOOD_SECS", 10)?;
    let conns = env_num("RIVORA_SYNFLOOD_CONNS", 16)?;
    let mut lab = Lab::new("s")?;
    let (c, n, b) = (lab.ns("c")?, lab.ns("n")?, lab.ns("b")?);
    try_sh(&format!(
        "ip link add c0 netns {c} type veth peer name n0 netns {n} && \
         ip link add b0 netns {b} type veth peer name n1 netns {n}"
    ))?;
    in_ns(
        &c,
        "ip addr add 10.211.1.2/24 dev c0 && ip link set c0 up && \
         ip route add 10.211.100.0/24 via 10.211.1.1 && ethtool -K c0 tx off >/dev/null",
    )?;
    in_ns(
        &n,
        "ip addr add 10.211.1.1/24 dev n0 && ip addr add 10.211.2.1/24 dev n1 && \
         ip link set n0 up && ip link set n1 up && echo 1 > /proc/sys/net/ipv4/ip_forward",
    )?;
    in_ns(
        &b,
        "ip addr add 10.211.2.11/24 dev b0 && ip link set b0 up && \
         ip route add default via 10.211.2.1 && ethtool -K b0 tx off >/dev/null",
    )?;
    let cfg = lab.work.join("rivora.yaml");
    std::fs::write(
        &cfg,
        format!(
            "interfaces:\n  - name: n0\n    xdpMode: native\napi:\n  socket: {}\nvips:\n  - name: flooded\n    \
             address: {VIP}\n    port: {PORT}\n    protocol: tcp\n    mode: nat\n    healthCheck: false\n    \
             synRateLimit: {{ ratePerSec: {RATE_PER_SEC}, burst: {BURST} }}\n    \
             backends:\n      - {{ address: 10.211.2.11, port: {PORT} }}\n",
            lab.work.join("api.sock").display()
        ),
    )?;
    let mut d = Daemon::start(&n, &lab, &cfg, "rivorad.log")?;
    d.ready()?;
    let maps = Maps::open(&lab.pins).context("opening the pinned maps")?;
    let rate_limited = || -> Result<u64> {
        let r = rv_drop_reason::RV_DROP_RATE_LIMITED;
        Ok(maps
            .drop_stats_map
            .get_percpu::<u32, rv_drop_stats>(&r.0)?
            .iter()
            .map(|s| s.packets)
            .sum())
    };

    // The backend echoes every 8-byte message on every connection.
    let listener = spawn_in_named(&b, move || TcpListener::bind(BACKEND))
        .join()
        .map_err(|_| anyhow::anyhow!("bind thread panicked"))?
        .context("backend listen")?;
    listener.set_nonblocking(true)?;
    let stop_server = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop_server.clone();
        std::thread::spawn(move || serve(listener, stop))
    };

    // The established connections, opened before the flood (their SYNs
    // come from one source, well inside its burst).
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, lost) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut clients = Vec::new();
    for _ in 0..conns {
        let (stop, sent, lost) = (stop.clone(), sent.clone(), lost.clone());
        let stream = spawn_in_named(&c, || {
            TcpStream::connect_timeout(
                &SocketAddr::V4(SocketAddrV4::new(VIP, PORT)),
                Duration::from_secs(5),
            )
        })
        .join()
        .map_err(|_| anyhow::anyhow!("connect thread panicked"))?
        .context("an established connection through the VIP")?;
        clients.push(std::thread::spawn(move || {
            converse(stream, &stop, &sent, &lost)
        }));
    }
    // A second of traffic before the flood: what the connections carry
    // undisturbed.
    std::thread::sleep(Duration::from_secs(1));
    let limited_before = rate_limited()?;
    let stop_flood = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop_flood.clone();
        spawn_in_named(&c, move || flood(&stop))
    };
    std::thread::sleep(Duration::from_secs(secs));
    stop_flood.store(true, Ordering::Relaxed);
    let (syns, took) = flood
        .join()
        .map_err(|_| anyhow::anyhow!("flood thread panicked"))??;
    // The connections go on a little after the flood: a stall it caused
    // shows as a late echo.
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().map_err(|_| anyhow::anyhow!("client panicked"))?;
    }
    stop_server.store(true, Ordering::Relaxed);
    let _ = server.join();
    let limited = rate_limited()? - limited_before;
    d.stop()?;

    let (sent, lost) = (sent.load(Ordering::Relaxed), lost.load(Ordering::Relaxed));
    anyhow::ensure!(sent > 0, "the established connections carried nothing");
    let loss_pct = lost as f64 * 100.0 / sent as f64;
    let pps = syns as f64 / took.as_secs_f64();
    results.set("synflood_established_loss_pct", loss_pct);
    results.set("synflood_flood_pps", pps);
    results.set("synflood_rate_limited", limited as f64);
    results.note(format!(
        "synflood: {conns} established connections sent {sent} echoed messages ({MSG_RATE}/s each), {lost} lost, while {syns} SYNs from {SOURCES} spoofed sources ({pps:.0}/s for {:.1} s) hit the VIP; {limited} were dropped as rate_limited (limit {RATE_PER_SEC}/s, burst {BURST} per source)",
        took.as_secs_f64()
    ));
    Ok(())
}

/// The backend: accept and echo, one thread a connection.
fn serve(listener: TcpListener, stop: Arc<AtomicBool>) {
    let mut threads = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let stop = stop.clone();
                threads.push(std::thread::spawn(move || {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
                    let mut buf = [0u8; 8];
                    while !stop.load(Ordering::Relaxed) {
                        match s.read_exact(&mut buf) {
                            Ok(()) => {
                                if s.write_all(&buf).is_err() {
                                    return;
                                }
                            }
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    ErrorKind::WouldBlock | ErrorKind::TimedOut
                                ) => {}
                            Err(_) => return,
                        }
                    }
                }));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    for t in threads {
        let _ = t.join();
    }
}

/// One established connection: numbered messages at MSG_RATE, each
/// waiting for its echo. A message whose echo is not back within the
/// deadline is lost; a broken connection loses the message in flight and
/// ends.
fn converse(mut s: TcpStream, stop: &AtomicBool, sent: &AtomicU64, lost: &AtomicU64) {
    let _ = s.set_nodelay(true);
    let t0 = Instant::now();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = t0 + Duration::from_nanos(seq * 1_000_000_000 / MSG_RATE);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        sent.fetch_add(1, Ordering::Relaxed);
        if s.write_all(&seq.to_be_bytes()).is_err() {
            lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let deadline = Instant::now() + ECHO_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
                lost.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let mut buf = [0u8; 8];
            match s.read_exact(&mut buf) {
                // An echo of an earlier message, already counted lost.
                Ok(()) if u64::from_be_bytes(buf) < seq => continue,
                Ok(()) => break,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    lost.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(_) => {
                    lost.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        seq += 1;
    }
}

/// SYNs from SOURCES spoofed addresses (and many ports each) to the VIP
/// through a raw socket, as fast as one thread sends them. Returns how
/// many the kernel took, and for how long.
fn flood(stop: &AtomicBool) -> Result<(u64, Duration)> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::empty(),
        SockProtocol::Raw,
    )
    .context("raw socket (IPPROTO_RAW)")?;
    let mut frames = Vec::new();
    for i in 0..SOURCES * 8 {
        let src = Ipv4Addr::new(10, 212, 0, (i % SOURCES) as u8);
        let sport = 10_000 + (i / SOURCES) as u16 * 997 + i as u16 % 13;
        let mut tcp = TcpHeader::new(sport, PORT, i.wrapping_mul(2_654_435_761), 64240);
        tcp.syn = true;
        let mut ip = Ipv4Header::new(20, 64, IpNumber::TCP, src.octets(), VIP.octets())
            .context("IPv4 header")?;
        ip.header_checksum = ip.calc_header_checksum();
        tcp.checksum = tcp.calc_checksum_ipv4(&ip, &[]).context("TCP checksum")?;
        let mut f = Vec::with_capacity(40);
        ip.write(&mut f).context("IPv4 header")?;
        tcp.write(&mut f).context("TCP header")?;
        frames.push(f);
    }
    let dst = SockaddrIn::from(SocketAddrV4::new(VIP, 0));
    let t0 = Instant::now();
    let mut n = 0u64;
    let mut k = 0usize;
    while !stop.load(Ordering::Relaxed) {
        // Check the flag once per batch: the loop is the measurement.
        for _ in 0..256 {
            match sendto(fd.as_raw_fd(), &frames[k], &dst, MsgFlags::empty()) {
                Ok(_) => n += 1,
                // A full queue: the flood is as fast as the path takes it.
                Err(nix::errno::Errno::ENOBUFS | nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(e).context("sending a SYN"),
            }
            k = (k + 1) % frames.len();
        }
    }
    Ok((n, t0.elapsed()))
}
