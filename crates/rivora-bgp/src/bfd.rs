//! Single-hop BFD (RFC 5880 asynchronous mode, RFC 5881 over UDP): one
//! session per BGP peer that asks for it. A session that was Up and goes
//! Down (no packet within the detection time, or the peer says Down)
//! tears the BGP session down at once (Cease, BFD Down: RFC 9384),
//! rather than after the hold time.
//!
//! [`Session`] is the state machine and timer arithmetic, pure;
//! [`Bfd`] runs the sessions on two UDP sockets (port 3784, IPv4 and
//! IPv6), sends from a source port in 49152-65535 with TTL 255, and
//! drops what did not arrive with TTL 255 (RFC 5881 5: the peer is one
//! hop away). No authentication, no echo, no demand mode.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::watch;
use tracing::{debug, info, warn};

pub const PORT: u16 = 3784;
/// While not Up, a session sends at most once a second (RFC 5880 6.8.3).
pub const SLOW_TX_US: u32 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BfdState {
    AdminDown = 0,
    Down = 1,
    Init = 2,
    Up = 3,
}

impl BfdState {
    fn from_bits(b: u8) -> BfdState {
        match b & 3 {
            0 => BfdState::AdminDown,
            1 => BfdState::Down,
            2 => BfdState::Init,
            _ => BfdState::Up,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BfdState::AdminDown => "AdminDown",
            BfdState::Down => "Down",
            BfdState::Init => "Init",
            BfdState::Up => "Up",
        }
    }
}

/// Diagnostic codes (RFC 5880 4.1).
pub mod diag {
    pub const NONE: u8 = 0;
    pub const CONTROL_DETECTION_TIME_EXPIRED: u8 = 1;
    pub const NEIGHBOR_SIGNALED_DOWN: u8 = 3;
    pub const ADMIN_DOWN: u8 = 7;
}

/// A BFD Control packet's mandatory section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub diag: u8,
    pub state: BfdState,
    pub poll: bool,
    pub final_: bool,
    pub detect_mult: u8,
    pub my_discr: u32,
    pub your_discr: u32,
    pub desired_min_tx_us: u32,
    pub required_min_rx_us: u32,
}

pub const PACKET_LEN: usize = 24;

impl Packet {
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let mut b = [0u8; PACKET_LEN];
        b[0] = (1 << 5) | (self.diag & 0x1f);
        b[1] = ((self.state as u8) << 6)
            | if self.poll { 0x20 } else { 0 }
            | if self.final_ { 0x10 } else { 0 };
        b[2] = self.detect_mult;
        b[3] = PACKET_LEN as u8;
        b[4..8].copy_from_slice(&self.my_discr.to_be_bytes());
        b[8..12].copy_from_slice(&self.your_discr.to_be_bytes());
        b[12..16].copy_from_slice(&self.desired_min_tx_us.to_be_bytes());
        b[16..20].copy_from_slice(&self.required_min_rx_us.to_be_bytes());
        // Required Min Echo RX Interval: 0, no echo.
        b
    }

    /// The reception checks of RFC 5880 6.8.6 that need no session:
    /// version 1, a length that fits, a non-zero multiplier and My
    /// Discriminator, no multipoint bit, no authentication (not
    /// configured, so an authenticated packet is discarded), and a zero
    /// Your Discriminator only from a Down or AdminDown peer.
    pub fn decode(b: &[u8]) -> Option<Packet> {
        if b.len() < PACKET_LEN || b[0] >> 5 != 1 {
            return None;
        }
        let len = b[3] as usize;
        if len < PACKET_LEN || len > b.len() {
            return None;
        }
        let flags = b[1];
        if flags & 0x01 != 0 || flags & 0x04 != 0 {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let p = Packet {
            diag: b[0] & 0x1f,
            state: BfdState::from_bits(flags >> 6),
            poll: flags & 0x20 != 0,
            final_: flags & 0x10 != 0,
            detect_mult: b[2],
            my_discr: u32_at(4),
            your_discr: u32_at(8),
            desired_min_tx_us: u32_at(12),
            required_min_rx_us: u32_at(16),
        };
        if p.detect_mult == 0 || p.my_discr == 0 {
            return None;
        }
        if p.your_discr == 0 && !matches!(p.state, BfdState::Down | BfdState::AdminDown) {
            return None;
        }
        Some(p)
    }
}

/// A session's configured intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    pub min_tx: Duration,
    pub min_rx: Duration,
    pub multiplier: u8,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            min_tx: Duration::from_millis(300),
            min_rx: Duration::from_millis(300),
            multiplier: 3,
        }
    }
}

fn us(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// One session's state variables (RFC 5880 6.8.1) and what the timers
/// derive from them.
#[derive(Debug, Clone)]
pub struct Session {
    pub state: BfdState,
    pub remote_state: BfdState,
    pub local_discr: u32,
    pub remote_discr: u32,
    pub local_diag: u8,
    pub timers: Timers,
    remote_min_rx_us: u32,
    remote_desired_tx_us: u32,
    remote_mult: u8,
    /// A Poll Sequence is under way: packets carry Poll until a Final.
    polling: bool,
    /// Answer the peer's Poll with Final on the next packet.
    pub send_final: bool,
    pub last_rx: Option<Instant>,
}

impl Session {
    pub fn new(local_discr: u32, timers: Timers) -> Self {
        Self {
            state: BfdState::Down,
            remote_state: BfdState::Down,
            local_discr,
            remote_discr: 0,
            local_diag: diag::NONE,
            timers,
            remote_min_rx_us: 1,
            remote_desired_tx_us: 0,
            remote_mult: 0,
            polling: false,
            send_final: false,
            last_rx: None,
        }
    }

    /// bfd.DesiredMinTxInterval now: the configured one once Up
    /// (announced with a Poll Sequence), at least one second otherwise
    /// (6.8.3).
    pub fn desired_min_tx_us(&self) -> u32 {
        if self.state == BfdState::Up {
            us(self.timers.min_tx)
        } else {
            SLOW_TX_US.max(us(self.timers.min_tx))
        }
    }

    fn required_min_rx_us(&self) -> u32 {
        us(self.timers.min_rx)
    }

    /// How often to send: the larger of what we announce and what the
    /// peer can take (6.8.7); None when the peer asks for no packets.
    /// The rate follows the announced DesiredMinTx at once, not after the
    /// Poll Sequence: the peer's detection time is computed from what we
    /// announce, so a faster value announced but not yet used (the Poll
    /// Sequence takes a round trip) gets the session declared Down. FRR's
    /// bfdd did just that, 300 ms after the session came Up.
    pub fn tx_interval(&self) -> Option<Duration> {
        if self.remote_min_rx_us == 0 {
            return None;
        }
        Some(Duration::from_micros(u64::from(
            self.desired_min_tx_us().max(self.remote_min_rx_us),
        )))
    }

    /// Detection time (6.8.4): the peer's multiplier times the larger of
    /// our RequiredMinRx and its DesiredMinTx. None before the first
    /// packet.
    pub fn detection_time(&self) -> Option<Duration> {
        if self.remote_mult == 0 {
            return None;
        }
        let agreed = self.required_min_rx_us().max(self.remote_desired_tx_us);
        Some(Duration::from_micros(
            u64::from(agreed) * u64::from(self.remote_mult),
        ))
    }

    /// The packet to send now.
    pub fn packet(&mut self) -> Packet {
        let p = Packet {
            diag: self.local_diag,
            state: self.state,
            poll: self.polling && !self.send_final,
            final_: self.send_final,
            detect_mult: self.timers.multiplier,
            my_discr: self.local_discr,
            your_discr: self.remote_discr,
            desired_min_tx_us: self.desired_min_tx_us(),
            required_min_rx_us: self.required_min_rx_us(),
        };
        self.send_final = false;
        p
    }

    /// Take a received packet (6.8.6); returns the state before it.
    pub fn receive(&mut self, p: &Packet, now: Instant) -> BfdState {
        let before = self.state;
        self.remote_discr = p.my_discr;
        self.remote_state = p.state;
        self.remote_min_rx_us = p.required_min_rx_us;
        self.remote_desired_tx_us = p.desired_min_tx_us;
        self.remote_mult = p.detect_mult;
        self.last_rx = Some(now);
        if p.final_ {
            self.polling = false;
        }
        if p.poll {
            self.send_final = true;
        }
        if self.state == BfdState::AdminDown {
            return before;
        }
        if p.state == BfdState::AdminDown {
            if self.state != BfdState::Down {
                self.down(diag::NEIGHBOR_SIGNALED_DOWN);
            }
            return before;
        }
        match (self.state, p.state) {
            (BfdState::Down, BfdState::Down) => self.state = BfdState::Init,
            (BfdState::Down, BfdState::Init) | (BfdState::Init, BfdState::Init | BfdState::Up) => {
                self.up()
            }
            (BfdState::Up, BfdState::Down) => self.down(diag::NEIGHBOR_SIGNALED_DOWN),
            _ => {}
        }
        before
    }

    fn up(&mut self) {
        self.state = BfdState::Up;
        self.local_diag = diag::NONE;
        // The faster intervals are announced by a Poll Sequence (6.8.3).
        self.polling = us(self.timers.min_tx) < SLOW_TX_US;
    }

    fn down(&mut self, d: u8) {
        self.state = BfdState::Down;
        self.local_diag = d;
        self.remote_discr = 0;
        self.polling = false;
    }

    /// When the detection time runs out if nothing arrives (Init or Up).
    pub fn expires_at(&self) -> Option<Instant> {
        if !matches!(self.state, BfdState::Init | BfdState::Up) {
            return None;
        }
        Some(self.last_rx? + self.detection_time()?)
    }

    /// Call when nothing arrived for the detection time: Down (6.8.4).
    pub fn check_expiry(&mut self, now: Instant) -> bool {
        if !matches!(self.state, BfdState::Init | BfdState::Up) {
            return false;
        }
        match (self.detection_time(), self.last_rx) {
            (Some(t), Some(at)) if now.duration_since(at) > t => {
                self.down(diag::CONTROL_DETECTION_TIME_EXPIRED);
                true
            }
            _ => false,
        }
    }
}

/// What a BGP session sees of its BFD session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfdStatus {
    pub state: BfdState,
    pub remote_state: BfdState,
    pub diag: u8,
    /// Detection time in force, milliseconds (0: none yet).
    pub detect_ms: u64,
    /// Times it went from Up to Down.
    pub downs: u64,
}

impl Default for BfdStatus {
    fn default() -> Self {
        Self {
            state: BfdState::Down,
            remote_state: BfdState::Down,
            diag: 0,
            detect_ms: 0,
            downs: 0,
        }
    }
}

struct Entry {
    peer: IpAddr,
    session: Session,
    tx: watch::Sender<BfdStatus>,
    wake: Arc<tokio::sync::Notify>,
}

/// The BFD sessions of one speaker, and their sockets.
#[derive(Clone)]
pub struct Bfd {
    sessions: Arc<Mutex<HashMap<u32, Entry>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum BfdError {
    #[error("binding BFD's UDP port {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn recv_socket(addr: SocketAddr) -> Result<UdpSocket, BfdError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let err = |source| BfdError::Bind { addr, source };
    let s =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(err)?;
    s.set_reuse_address(true).map_err(err)?;
    if addr.is_ipv6() {
        s.set_only_v6(true).map_err(err)?;
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Ipv6RecvHopLimit, &true)
            .map_err(|e| err(e.into()))?;
    } else {
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Ipv4RecvTtl, &true)
            .map_err(|e| err(e.into()))?;
    }
    s.set_nonblocking(true).map_err(err)?;
    s.bind(&addr.into()).map_err(err)?;
    UdpSocket::from_std(s.into()).map_err(err)
}

/// A socket bound to `local` and a source port of 49152-65535 (RFC 5881
/// 4), sending with TTL 255.
fn send_socket(local: IpAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut last = None;
    let start = 49152 + (rand_u32() % 16384) as u16;
    for i in 0..64u16 {
        let port = 49152 + (start - 49152 + i * 257) % 16384;
        let addr = SocketAddr::new(local, port);
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if local.is_ipv6() {
            s.set_unicast_hops_v6(255)?;
        } else {
            s.set_ttl_v4(255)?;
        }
        s.set_nonblocking(true)?;
        match s.bind(&addr.into()) {
            Ok(()) => return UdpSocket::from_std(s.into()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free BFD source port")))
}

/// A random number from the kernel's generator, for discriminators,
/// ports and jitter: nothing here needs more than unpredictability.
pub fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a 4-byte buffer we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n != 4 {
        // The clock's low bits: good enough for jitter.
        return Instant::now().elapsed().subsec_nanos() ^ std::process::id();
    }
    u32::from_ne_bytes(b)
}

impl Bfd {
    /// Bind the receive sockets (both families, all addresses) and start
    /// reading them on the current runtime.
    pub fn start() -> Result<Self, BfdError> {
        let bfd = Bfd {
            sessions: Arc::default(),
        };
        for addr in [
            SocketAddr::from(([0, 0, 0, 0], PORT)),
            SocketAddr::from(([0u16; 8], PORT)),
        ] {
            let sock = recv_socket(addr)?;
            let me = bfd.clone();
            tokio::spawn(async move { me.read(sock).await });
        }
        Ok(bfd)
    }

    async fn read(self, sock: UdpSocket) {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, SockaddrStorage};
        use std::io::IoSliceMut;
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 128];
        loop {
            let got = sock
                .async_io(tokio::io::Interest::READABLE, || {
                    let mut iov = [IoSliceMut::new(&mut buf)];
                    let mut cmsg = nix::cmsg_space!(libc::c_int);
                    let r = recvmsg::<SockaddrStorage>(
                        sock.as_raw_fd(),
                        &mut iov,
                        Some(&mut cmsg),
                        nix::sys::socket::MsgFlags::empty(),
                    )
                    .map_err(std::io::Error::from)?;
                    let mut ttl = None;
                    if let Ok(cms) = r.cmsgs() {
                        for c in cms {
                            match c {
                                ControlMessageOwned::Ipv4Ttl(t) => ttl = Some(t),
                                ControlMessageOwned::Ipv6HopLimit(t) => ttl = Some(t),
                                _ => {}
                            }
                        }
                    }
                    let from = r.address.and_then(|a: SockaddrStorage| {
                        a.as_sockaddr_in()
                            .map(|s| IpAddr::V4(s.ip()))
                            .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
                    });
                    Ok((r.bytes, ttl, from))
                })
                .await;
            let (n, ttl, from) = match got {
                Ok(v) => v,
                Err(e) => {
                    warn!(error = %e, "BFD receive");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if ttl != Some(255) {
                debug!(?ttl, ?from, "BFD packet not from one hop away: dropped");
                continue;
            }
            let (Some(p), Some(from)) = (Packet::decode(&buf[..n]), from) else {
                continue;
            };
            self.deliver(&p, from.to_canonical());
        }
    }

    fn deliver(&self, p: &Packet, from: IpAddr) {
        let mut map = lock(&self.sessions);
        let entry = if p.your_discr != 0 {
            map.get_mut(&p.your_discr)
        } else {
            map.values_mut().find(|e| e.peer == from)
        };
        let Some(e) = entry else {
            return;
        };
        if e.peer != from {
            return;
        }
        let before = e.session.receive(p, Instant::now());
        let after = e.session.state;
        if before != after || e.session.send_final {
            e.wake.notify_one();
        }
        publish(e, before);
    }

    /// A session to `peer` from `local`; its status on the returned
    /// channel. It runs until [`Bfd::remove`].
    pub fn add(
        &self,
        peer: IpAddr,
        local: IpAddr,
        timers: Timers,
    ) -> std::io::Result<watch::Receiver<BfdStatus>> {
        let sock = send_socket(local)?;
        let mut discr = rand_u32();
        let (tx, rx) = watch::channel(BfdStatus::default());
        let wake = Arc::new(tokio::sync::Notify::new());
        {
            let mut map = lock(&self.sessions);
            while discr == 0 || map.contains_key(&discr) {
                discr = rand_u32();
            }
            map.insert(
                discr,
                Entry {
                    peer,
                    session: Session::new(discr, timers),
                    tx,
                    wake: wake.clone(),
                },
            );
        }
        info!(%peer, %local, discr, ?timers, "BFD session");
        let me = self.clone();
        tokio::spawn(async move { me.run(discr, sock, peer, wake).await });
        Ok(rx)
    }

    pub fn remove(&self, peer: IpAddr) {
        lock(&self.sessions).retain(|_, e| e.peer != peer);
    }

    /// Send on the session's schedule, check its detection time.
    async fn run(self, discr: u32, sock: UdpSocket, peer: IpAddr, wake: Arc<tokio::sync::Notify>) {
        let dst = SocketAddr::new(peer, PORT);
        let mut next_tx = Instant::now();
        loop {
            let (pkt, interval, expires, mult) = {
                let mut map = lock(&self.sessions);
                let Some(e) = map.get_mut(&discr) else {
                    return;
                };
                let now = Instant::now();
                let before = e.session.state;
                if e.session.check_expiry(now) {
                    info!(%peer, "BFD: detection time expired: Down");
                }
                publish(e, before);
                let interval = e.session.tx_interval();
                let pkt = if now >= next_tx || e.session.send_final {
                    Some(e.session.packet())
                } else {
                    None
                };
                (
                    pkt,
                    interval,
                    e.session.expires_at(),
                    e.session.timers.multiplier,
                )
            };
            if let Some(p) = pkt {
                if let Err(err) = sock.send_to(&p.encode(), dst).await {
                    debug!(%peer, error = %err, "BFD send");
                }
                // 75-100% of the interval (RFC 5880 6.8.7), 75-90% with a
                // multiplier of 1.
                let iv = interval.unwrap_or(Duration::from_secs(1));
                let jitter = if mult == 1 {
                    75 + rand_u32() % 16
                } else {
                    75 + rand_u32() % 26
                };
                next_tx = Instant::now() + iv * jitter / 100;
            }
            // Wake for the next send or the moment the detection time
            // runs out (just past it: check_expiry wants "more than"),
            // whichever comes first; a packet pushes the expiry back and
            // a state change wakes at once. Waking at the expiry itself,
            // not at a fraction of the detection time, keeps the
            // detection within it.
            let now = Instant::now();
            let mut until = next_tx.saturating_duration_since(now);
            if let Some(x) = expires {
                until = until.min(x.saturating_duration_since(now) + Duration::from_micros(200));
            }
            let until = until.max(Duration::from_micros(200));
            tokio::select! {
                _ = tokio::time::sleep(until) => {}
                _ = wake.notified() => { next_tx = next_tx.min(Instant::now()); }
            }
        }
    }
}

fn publish(e: &mut Entry, before: BfdState) {
    let s = &e.session;
    e.tx.send_if_modified(|st| {
        let downs = st.downs + u64::from(before == BfdState::Up && s.state != BfdState::Up);
        let new = BfdStatus {
            state: s.state,
            remote_state: s.remote_state,
            diag: s.local_diag,
            detect_ms: s
                .detection_time()
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            downs,
        };
        if *st != new {
            *st = new;
            true
        } else {
            false
        }
    });
}

#[cfg(test)]
mod tests;
