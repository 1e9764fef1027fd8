//! Real traffic through a lab, said once: the backends' servers (a TCP
//! line server, a UDP echo, a UDP sink for numbered streams) and the
//! client's flows (one-shot TCP and UDP exchanges, `WORKERS` at a time;
//! long-lived TCP connections exchanging numbered lines; numbered UDP
//! streams at a set rate). Every server thread stops and is joined when
//! its [`Servers`] drops; every client step has a timeout.
//!
//! What a backend answers, on TCP per line and on UDP per datagram:
//! `name|local|peer|payload`, where `local` is the address the request
//! was addressed to (its own under NAT, the VIP under DSR) and `peer` the
//! client's address as the backend saw it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage};

use rivora_testlab::paced::{send_retrying, Pacer};

use super::netns::{spawn_in, Netns};
use super::topology::Topology;

/// Client threads sharing a batch of exchanges.
pub const WORKERS: usize = 4;

/// Poll `f` every `period` until it returns Some or `limit` passes.
pub fn wait_for<T>(
    limit: Duration,
    period: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(period);
    }
}

/// Wait until `f` holds; panics naming `what` after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let held = wait_for(limit, Duration::from_millis(20), || f().then_some(()));
    assert!(held.is_some(), "timed out waiting for {what}");
}

pub fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Wait until `fd` is readable or 50 ms pass; true if readable.
fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 50) > 0 }
}

// ---------------------------------------------------------------------
// Backends' servers
// ---------------------------------------------------------------------

/// UDP sink arrivals: per flow, which backends saw it and which sequence
/// numbers arrived.
#[derive(Default)]
pub struct UdpLog {
    pub flows: BTreeMap<u32, (BTreeSet<String>, Vec<bool>)>,
    pub total: u64,
}

/// A TCP listener that can be closed (new connections are refused, as
/// when its process dies) and opened again.
struct Listener {
    name: String,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// Servers in the backends' namespaces; all stopped and joined on drop.
pub struct Servers {
    listeners: Vec<Listener>,
    handles: Vec<JoinHandle<()>>,
    /// Stops connection threads, UDP echoes and sinks.
    stop_all: Arc<AtomicBool>,
    /// Requests the servers failed to answer (an I/O error on their side).
    pub errors: Arc<AtomicUsize>,
    /// What the UDP sinks received.
    pub udp_log: Arc<Mutex<UdpLog>>,
}

impl Default for Servers {
    fn default() -> Self {
        Self::new()
    }
}

impl Servers {
    pub fn new() -> Self {
        Self {
            listeners: Vec::new(),
            handles: Vec::new(),
            stop_all: Arc::new(AtomicBool::new(false)),
            errors: Arc::new(AtomicUsize::new(0)),
            udp_log: Arc::new(Mutex::new(UdpLog::default())),
        }
    }

    /// A lab's usual servers: per backend a dual-stack TCP line server on
    /// the mode's port (listener `i` is backend `i`'s) and, with `udp`, a
    /// UDP echo on each family's [`Topology::backend_local`] address.
    pub fn for_topology(topo: &Topology, udp: bool) -> Self {
        let mut s = Self::new();
        let port = topo.backend_port();
        for b in &topo.backends {
            // Dual-stack: IPv4 clients arrive as v4-mapped addresses.
            s.tcp(&b.ns, &b.name, SocketAddr::from(([0u16; 8], port)));
        }
        if udp {
            for b in &topo.backends {
                for v6 in [false, true] {
                    let local = SocketAddr::new(topo.backend_local(b, v6), port);
                    s.udp_echo(&b.ns, &b.name, local);
                }
            }
        }
        s
    }

    /// A TCP line server on `addr` in `ns`; returns its listener index.
    pub fn tcp(&mut self, ns: &Netns, name: &str, addr: SocketAddr) -> usize {
        let l = self.listen(ns, name.to_string(), addr);
        self.listeners.push(l);
        self.listeners.len() - 1
    }

    fn listen(&self, ns: &Netns, name: String, addr: SocketAddr) -> Listener {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<()>();
        let (n, st, conns_stop, errors) = (
            name.clone(),
            stop.clone(),
            self.stop_all.clone(),
            self.errors.clone(),
        );
        let handle = spawn_in(ns, move || {
            let l = TcpListener::bind(addr)
                .unwrap_or_else(|e| panic!("binding a TCP server on {addr}: {e}"));
            let _ = tx.send(());
            let mut conns = Vec::new();
            while !st.load(Ordering::Relaxed) {
                if !readable(l.as_raw_fd()) {
                    continue;
                }
                match l.accept() {
                    Ok((s, _)) => {
                        let (n, cs, er) = (n.clone(), conns_stop.clone(), errors.clone());
                        // Inherits the backend's namespace (a thread of this one).
                        conns.push(std::thread::spawn(move || serve_conn(s, &n, &cs, &er)));
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            drop(l);
            // Connections outlive a closed listener (as when a backend's
            // listening socket goes but its connections stay): only the
            // servers' stop ends them.
            if conns_stop.load(Ordering::Relaxed) {
                for c in conns {
                    let _ = c.join();
                }
            }
        });
        // The sender is dropped without sending if the thread panicked.
        rx.recv_timeout(Duration::from_secs(5))
            .expect("a backend's TCP server did not start");
        Listener {
            name,
            addr,
            stop,
            handle: Some(handle),
        }
    }

    /// Close listener `i`; returns once it is closed.
    pub fn close(&mut self, i: usize) {
        let l = &mut self.listeners[i];
        l.stop.store(true, Ordering::Relaxed);
        if let Some(h) = l.handle.take() {
            h.join().expect("backend listener thread panicked");
        }
    }

    /// Open closed listener `i` again, in `ns` (where it was).
    pub fn reopen(&mut self, ns: &Netns, i: usize) {
        assert!(self.listeners[i].handle.is_none(), "listener {i} is open");
        let (name, addr) = (self.listeners[i].name.clone(), self.listeners[i].addr);
        self.listeners[i] = self.listen(ns, name, addr);
    }

    /// A UDP echo bound to `addr` in `ns`: replies leave from that address
    /// (the VIP under DSR), whatever the routing would pick.
    pub fn udp_echo(&mut self, ns: &Netns, name: &str, addr: SocketAddr) {
        let (name, st, errors) = (name.to_string(), self.stop_all.clone(), self.errors.clone());
        self.udp(ns, addr, move |sock| {
            let mut buf = [0u8; 1500];
            while !st.load(Ordering::Relaxed) {
                if !readable(sock.as_raw_fd()) {
                    continue;
                }
                let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let msg = answer(&name, addr, peer, &String::from_utf8_lossy(&buf[..n]));
                if sock.send_to(msg.as_bytes(), peer).is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }

    /// A sink for numbered UDP streams ([`udp_streams`]) on `addr` in
    /// `ns`, recording into `udp_log`. Its receive buffer is large: a loss
    /// must be the datapath's, not the sink's.
    pub fn udp_sink(&mut self, ns: &Netns, name: &str, addr: SocketAddr) {
        let (name, st, log) = (
            name.to_string(),
            self.stop_all.clone(),
            self.udp_log.clone(),
        );
        self.udp(ns, addr, move |s| {
            let bytes: i32 = 4 << 20;
            // SAFETY: setsockopt with a valid int.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&bytes as *const i32).cast(),
                    std::mem::size_of::<i32>() as u32,
                );
            }
            s.set_nonblocking(true).expect("nonblocking");
            let mut buf = [0u8; 64];
            while !st.load(Ordering::Relaxed) {
                if !readable(s.as_raw_fd()) {
                    continue;
                }
                while let Ok(n) = s.recv(&mut buf) {
                    if n < 12 {
                        continue;
                    }
                    let flow = u32::from_be_bytes(buf[0..4].try_into().expect("4"));
                    let seq = u64::from_be_bytes(buf[4..12].try_into().expect("8")) as usize;
                    let mut g = log.lock().expect("udp log");
                    g.total += 1;
                    let e = g.flows.entry(flow).or_default();
                    e.0.insert(name.clone());
                    if e.1.len() <= seq {
                        e.1.resize(seq + 1, false);
                    }
                    e.1[seq] = true;
                }
            }
        });
    }

    fn udp(
        &mut self,
        ns: &Netns,
        addr: SocketAddr,
        serve: impl FnOnce(UdpSocket) + Send + 'static,
    ) {
        let (tx, rx) = mpsc::channel::<()>();
        self.handles.push(spawn_in(ns, move || {
            let sock =
                UdpSocket::bind(addr).unwrap_or_else(|e| panic!("binding UDP on {addr}: {e}"));
            let _ = tx.send(());
            serve(sock)
        }));
        rx.recv_timeout(Duration::from_secs(5))
            .expect("a backend's UDP server did not start");
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop_all.store(true, Ordering::Relaxed);
        for l in &mut self.listeners {
            l.stop.store(true, Ordering::Relaxed);
            if let Some(h) = l.handle.take() {
                let _ = h.join();
            }
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn answer(name: &str, local: SocketAddr, peer: SocketAddr, payload: &str) -> String {
    format!("{name}|{}|{}|{payload}", canonical(local), canonical(peer))
}

/// One connection: every line gets an answer, until EOF or the servers
/// stop.
fn serve_conn(s: TcpStream, name: &str, stop: &AtomicBool, errors: &AtomicUsize) {
    let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else {
        errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let Ok(mut w) = s.try_clone() else {
        errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) if line.ends_with('\n') => {
                let msg = answer(name, local, peer, line.trim_end()) + "\n";
                line.clear();
                if w.write_all(msg.as_bytes()).is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------

/// One answer: which backend, and what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub backend: String,
    /// The client's own socket address.
    pub me: SocketAddr,
    /// Where the backend saw the request addressed to, and from.
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub payload: String,
}

pub fn parse_answer(s: &str, me: SocketAddr) -> Result<Hit, String> {
    let mut it = s.trim_end_matches('\n').splitn(4, '|');
    let (Some(backend), Some(local), Some(peer)) = (it.next(), it.next(), it.next()) else {
        return Err(format!("malformed answer {s:?}"));
    };
    let addr = |a: &str| {
        a.parse::<SocketAddr>()
            .map_err(|e| format!("answer {s:?}: address {a:?}: {e}"))
    };
    Ok(Hit {
        backend: backend.to_string(),
        me,
        local: addr(local)?,
        peer: addr(peer)?,
        payload: it.next().unwrap_or("").to_string(),
    })
}

/// A fresh TCP connection: one line out, its answer back.
pub fn tcp_once(vip: SocketAddr, step: Duration) -> Result<Hit, String> {
    let s = TcpStream::connect_timeout(&vip, step).map_err(|e| format!("connect: {e}"))?;
    tcp_exchange(s, step)
}

/// [`tcp_once`] from `src`, an address and port the caller chose: a run
/// of many connections then never reuses a source port, which the kernel's
/// choice does not promise once a failed connection has freed its port.
pub fn tcp_once_from(src: SocketAddr, vip: SocketAddr, step: Duration) -> Result<Hit, String> {
    let s = connect_from(src, vip, step).map_err(|e| format!("connect from {src}: {e}"))?;
    tcp_exchange(s, step)
}

/// A TCP connection from `src` to `dst` within `timeout` (std connects
/// only from a port of the kernel's choice).
pub fn connect_from(src: SocketAddr, dst: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let family = match dst {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket::socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(src))?;
    match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst)) {
        Ok(()) | Err(Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd.
    match unsafe { libc::poll(&mut p, 1, ms) } {
        0 => return Err(io::Error::new(ErrorKind::TimedOut, "connection timed out")),
        n if n < 0 => return Err(io::Error::last_os_error()),
        _ => {}
    }
    match socket::getsockopt(&fd, sockopt::SocketError)? {
        0 => {}
        e => return Err(io::Error::from_raw_os_error(e)),
    }
    let s = TcpStream::from(fd);
    s.set_nonblocking(false)?;
    Ok(s)
}

/// One line out on a connected stream, its answer back.
fn tcp_exchange(s: TcpStream, step: Duration) -> Result<Hit, String> {
    let me = s.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    s.set_read_timeout(Some(step))
        .and_then(|_| s.set_write_timeout(Some(step)))
        .map_err(|e| format!("timeouts: {e}"))?;
    let mut w = s.try_clone().map_err(|e| format!("clone: {e}"))?;
    w.write_all(b"hello\n")
        .map_err(|e| format!("write from {me}: {e}"))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                format!("connected from {me}, but no answer within {step:?}")
            }
            _ => format!("reading the answer on {me}: {e}"),
        })?;
    if line.is_empty() {
        return Err(format!("connection from {me} closed without an answer"));
    }
    let hit = parse_answer(&line, me)?;
    if hit.payload != "hello" {
        return Err(format!("echo of \"hello\" came back as {:?}", hit.payload));
    }
    Ok(hit)
}

/// A UDP exchange from a fresh socket (so from its own source port),
/// connected to the VIP: only datagrams from the VIP's address and port
/// reach it.
pub fn udp_once(vip: SocketAddr, token: &str, step: Duration) -> Result<Hit, String> {
    let any: SocketAddr = match vip {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("literal"),
    };
    udp_once_from(any, vip, token, step)
}

/// [`udp_once`] from `src`, an address and port the caller chose.
pub fn udp_once_from(
    src: SocketAddr,
    vip: SocketAddr,
    token: &str,
    step: Duration,
) -> Result<Hit, String> {
    let s = UdpSocket::bind(src).map_err(|e| format!("bind: {e}"))?;
    s.connect(vip).map_err(|e| format!("connect: {e}"))?;
    let me = s.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    s.set_read_timeout(Some(step))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    s.send(token.as_bytes())
        .map_err(|e| format!("send from {me}: {e}"))?;
    let mut buf = [0u8; 1500];
    let n = s.recv(&mut buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            format!("no answer to {me} within {step:?}")
        }
        _ => format!("recv on {me}: {e}"),
    })?;
    let hit = parse_answer(&String::from_utf8_lossy(&buf[..n]), me)?;
    if hit.payload != token {
        return Err(format!(
            "echo of {token:?} came back as {:?} (from {})",
            hit.payload, hit.backend
        ));
    }
    Ok(hit)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// `n` exchanges to `vip` from namespace `client`, `WORKERS` at a time,
/// each step bounded by `step`. A failure stops the others from starting
/// new ones, so a broken path costs one timeout per worker, not one per
/// flow.
pub fn exchanges(
    client: &Netns,
    vip: SocketAddr,
    proto: Proto,
    n: usize,
    step: Duration,
) -> Vec<Result<Hit, String>> {
    client.run(move || {
        let failed = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (failed, next) = (failed.clone(), next.clone());
                // Threads started here inherit the client namespace.
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n || failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let r = match proto {
                            Proto::Tcp => tcp_once(vip, step),
                            Proto::Udp => udp_once(vip, &format!("flow-{i}"), step),
                        };
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        out.push(r);
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("client worker panicked"))
            .collect()
    })
}

/// How a long-lived connection went.
#[derive(Debug)]
pub struct ConnResult {
    pub vip: SocketAddr,
    /// Every backend that answered.
    pub backends: BTreeSet<String>,
    /// Every address and port a backend saw the connection come from: the
    /// client's own, unless the node rewrote the source (full NAT).
    pub peers: BTreeSet<SocketAddr>,
    pub echoed: u64,
    /// The longest a message waited for its echo: a loss, or a gap in
    /// the path, shows here as the retransmission's delay.
    pub slowest_echo: Duration,
    /// Segments the client's TCP retransmitted (`tcpi_total_retrans`),
    /// read as the connection ends; None if it could not be read.
    pub retransmits: Option<u32>,
    /// Why it gave up (a reset, a timeout, a wrong echo), if it did.
    pub error: Option<String>,
}

/// How a [`long_lived_with`] connection paces itself.
#[derive(Debug, Clone, Copy)]
pub struct LongLivedOpts {
    /// Between an echo and the next message.
    pub interval: Duration,
    /// An echo later than this (and the connect) is a failure.
    pub step: Duration,
    /// Acknowledge each echo at once (`TCP_QUICKACK` after every read)
    /// rather than when the delayed-ACK timer fires: the backend then
    /// holds nothing unacknowledged between messages, so a path that
    /// stops for a while (a datapath detached) meets no retransmission
    /// from the backend's side.
    pub quick_ack: bool,
}

/// `TCP_QUICKACK` on: a pending ACK leaves now.
fn quick_ack(fd: i32) {
    let one: i32 = 1;
    // SAFETY: setsockopt with a valid int on a socket we own.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&one as *const i32).cast(),
            std::mem::size_of::<i32>() as u32,
        );
    }
}

/// The socket's `tcpi_total_retrans`.
fn total_retrans(fd: i32) -> Option<u32> {
    // SAFETY: a zeroed tcp_info is a valid out buffer of the given length.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: as above; the fd is a TCP socket we own.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info.tcpi_total_retrans)
}

/// A long-lived connection running in its own thread.
pub struct LongLived {
    /// The backend of the first answer, sent once it arrived.
    pub first: Receiver<String>,
    pub handle: JoinHandle<ConnResult>,
}

/// A TCP connection from `client` to `vip` that sends a numbered line
/// every `interval` and checks each echo (a reply later than `step` is a
/// failure), until `stop`; `echoed` counts echoes across connections. It
/// gives up, recording why, at the first error.
pub fn long_lived(
    client: &Netns,
    vip: SocketAddr,
    interval: Duration,
    step: Duration,
    stop: Arc<AtomicBool>,
    echoed: Arc<AtomicU64>,
) -> LongLived {
    let opts = LongLivedOpts {
        interval,
        step,
        quick_ack: false,
    };
    long_lived_with(client, vip, opts, stop, echoed)
}

/// [`long_lived`], paced by `opts`.
pub fn long_lived_with(
    client: &Netns,
    vip: SocketAddr,
    opts: LongLivedOpts,
    stop: Arc<AtomicBool>,
    echoed: Arc<AtomicU64>,
) -> LongLived {
    let LongLivedOpts {
        interval,
        step,
        quick_ack: ack_at_once,
    } = opts;
    let (tx, first) = mpsc::channel::<String>();
    let handle = spawn_in(client, move || {
        let mut r = ConnResult {
            vip,
            backends: BTreeSet::new(),
            peers: BTreeSet::new(),
            echoed: 0,
            slowest_echo: Duration::ZERO,
            retransmits: None,
            error: None,
        };
        let s = match TcpStream::connect_timeout(&vip, step) {
            Ok(s) => s,
            Err(e) => {
                r.error = Some(format!("connect: {e}"));
                return r;
            }
        };
        let fd = s.as_raw_fd();
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(step));
        let me = s.local_addr().unwrap_or(vip);
        let Ok(mut w) = s.try_clone() else {
            r.error = Some("clone".into());
            return r;
        };
        let mut rd = BufReader::new(s);
        let mut seq = 0u64;
        let mut line = String::new();
        while !stop.load(Ordering::Relaxed) {
            let sent = Instant::now();
            if let Err(e) = w.write_all(format!("{seq}\n").as_bytes()) {
                r.error = Some(format!("send {seq}: {e}"));
                break;
            }
            line.clear();
            match rd.read_line(&mut line) {
                Ok(0) => {
                    r.error = Some(format!("closed by the peer at {seq}"));
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    r.error = Some(format!("reply {seq}: {e}"));
                    break;
                }
            }
            r.slowest_echo = r.slowest_echo.max(sent.elapsed());
            if ack_at_once {
                quick_ack(fd);
            }
            let hit = match parse_answer(&line, me) {
                Ok(h) => h,
                Err(e) => {
                    r.error = Some(e);
                    break;
                }
            };
            if hit.payload != seq.to_string() {
                r.error = Some(format!("echo {:?} for message {seq}", hit.payload));
                break;
            }
            if r.backends.is_empty() {
                let _ = tx.send(hit.backend.clone());
            }
            r.backends.insert(hit.backend);
            r.peers.insert(hit.peer);
            r.echoed += 1;
            echoed.fetch_add(1, Ordering::Relaxed);
            seq += 1;
            std::thread::sleep(interval);
        }
        // `w` still holds the socket open.
        r.retransmits = total_retrans(w.as_raw_fd());
        r
    });
    LongLived { first, handle }
}

/// `flows` UDP flows from `client` to `vip`, numbered from `first_flow`,
/// paced together at `rate` datagrams/s until `stop`; each datagram holds
/// its flow and sequence number (for [`Servers::udp_sink`]). Returns the
/// count sent per flow.
pub fn udp_streams(
    client: &Netns,
    vip: SocketAddr,
    first_flow: u32,
    flows: usize,
    rate: u64,
    stop: Arc<AtomicBool>,
    sent_total: Arc<AtomicU64>,
) -> JoinHandle<Vec<u64>> {
    spawn_in(client, move || {
        let any: SocketAddr = match vip {
            SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
            SocketAddr::V6(_) => "[::]:0".parse().expect("literal"),
        };
        let socks: Vec<UdpSocket> = (0..flows)
            .map(|_| {
                let s = UdpSocket::bind(any).expect("udp bind");
                s.connect(vip).expect("udp connect");
                s
            })
            .collect();
        let mut sent = vec![0u64; socks.len()];
        let mut pacer = Pacer::new(rate);
        while !stop.load(Ordering::Relaxed) {
            let i = (pacer.wait() as usize) % socks.len();
            let mut msg = [0u8; 12];
            msg[0..4].copy_from_slice(&(first_flow + i as u32).to_be_bytes());
            msg[4..12].copy_from_slice(&sent[i].to_be_bytes());
            send_retrying(&socks[i], &msg).expect("UDP send keeps failing");
            sent[i] += 1;
            sent_total.fetch_add(1, Ordering::Relaxed);
        }
        sent
    })
}
