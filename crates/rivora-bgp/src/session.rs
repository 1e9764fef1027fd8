//! One peer's session: the task that owns its TCP connection, its timers
//! and its Adj-RIB-Out, and feeds [`crate::fsm`] the events of RFC 4271
//! 8.1 and does what it answers.
//!
//! - Connections: active sessions connect (from `local_address` when set,
//!   with the TCP MD5 key when a password is set); every session also
//!   takes connections the speaker's listener hands it. A second
//!   connection is resolved as RFC 4271 6.8 says, by BGP identifier, where
//!   the peer's is known (OpenConfirm); in OpenSent the newcomer is
//!   refused (the peer retries), in Established it replaces the old one
//!   (a peer that restarted and reconnects before our hold timer noticed).
//! - Backoff: after a failure the IdleHoldTimer waits 1 s, doubling to
//!   30 s while failures repeat, with jitter; an established session that
//!   lasted resets it.
//! - Routes: the speaker's route set, watched; once Established, what
//!   differs from the Adj-RIB-Out is sent at once (no MRAI wait: a VIP's
//!   route follows its health within the same second), then End-of-RIB
//!   after the first full table.
//! - BFD: when configured, a BFD session that was Up and goes Down ends
//!   the BGP session with Cease/BFD Down (RFC 9384).
//! - Stop: a clean stop withdraws every route and sends Cease; a stop for
//!   a graceful restart (`keep_routes`) only closes the connection, so
//!   peers that negotiated RFC 4724 keep our routes as stale until we are
//!   back and send End-of-RIB.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::BytesMut;
use ipnet::IpNet;
use netgauze_bgp_pkt::BgpMessage;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::bfd::{BfdState, BfdStatus};
use crate::fsm::{codes, Action, Event, Fsm, FsmConfig, Notification, State};
use crate::speaker::{Global, PeerConfig, PeerStatus, Route};
use crate::wire::{self, DecodeError, Family, Message, Negotiated, RouteAttrs, UpdateParams};

/// What the speaker tells a session.
#[derive(Debug)]
pub enum Command {
    /// Stop and end the task. `keep_routes`: close without a word, for a
    /// graceful restart; otherwise withdraw everything and send Cease
    /// with this subcode.
    Stop { keep_routes: bool, cease: u8 },
}

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send>>;

struct Conn {
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    local: SocketAddr,
    buf: BytesMut,
}

/// The IdleHoldTimer after `fails` failures in a row: 1 s doubling to
/// 30 s, less up to a quarter (jitter, so peers that failed together do
/// not retry together). The first automatic start waits nothing.
pub fn backoff(fails: u32) -> Duration {
    if fails == 0 {
        return Duration::ZERO;
    }
    let base =
        Duration::from_secs(1 << fails.saturating_sub(1).min(5)).min(Duration::from_secs(30));
    let jitter = 75 + crate::bfd::rand_u32() % 26;
    base * jitter / 100
}

/// A session that stayed Established this long resets the backoff.
const STABLE: Duration = Duration::from_secs(30);

pub struct Session {
    cfg: PeerConfig,
    global: Arc<Global>,
    fsm: Fsm,
    conn: Option<Conn>,
    connecting: Option<Connecting>,
    connect_retry: Option<Instant>,
    hold: Option<Instant>,
    keepalive: Option<Instant>,
    idle_hold: Option<Instant>,
    delay_open: Option<Instant>,
    fails: u32,
    negotiated: Option<Negotiated>,
    /// What the peer holds from us: prefix to the attributes sent.
    rib_out: BTreeMap<IpNet, RouteAttrs>,
    routes: watch::Receiver<Arc<Vec<Route>>>,
    incoming: mpsc::Receiver<TcpStream>,
    /// A connection from the peer while Established that has sent a valid
    /// OPEN (the peer restarted, graceful restart negotiated), with what
    /// was read from it.
    reopened: mpsc::Receiver<(TcpStream, BytesMut)>,
    reopened_tx: mpsc::Sender<(TcpStream, BytesMut)>,
    commands: mpsc::Receiver<Command>,
    bfd: Option<watch::Receiver<BfdStatus>>,
    bfd_was_up: bool,
    status: watch::Sender<PeerStatus>,
    established_at: Option<Instant>,
    stopping: bool,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: PeerConfig,
        global: Arc<Global>,
        routes: watch::Receiver<Arc<Vec<Route>>>,
        incoming: mpsc::Receiver<TcpStream>,
        commands: mpsc::Receiver<Command>,
        bfd: Option<watch::Receiver<BfdStatus>>,
        status: watch::Sender<PeerStatus>,
    ) -> Self {
        let fsm = Fsm::new(FsmConfig {
            passive: cfg.passive,
            delay_open: cfg.delay_open.is_some(),
        });
        let (reopened_tx, reopened) = mpsc::channel(1);
        Self {
            cfg,
            global,
            fsm,
            conn: None,
            connecting: None,
            connect_retry: None,
            hold: None,
            keepalive: None,
            idle_hold: None,
            delay_open: None,
            fails: 0,
            negotiated: None,
            rib_out: BTreeMap::new(),
            routes,
            incoming,
            reopened,
            reopened_tx,
            commands,
            bfd,
            bfd_was_up: false,
            status,
            established_at: None,
            stopping: false,
        }
    }

    fn peer(&self) -> IpAddr {
        self.cfg.address
    }

    /// The task: start, then events until told to stop.
    pub async fn run(mut self) {
        self.event(if self.cfg.passive {
            Event::AutomaticStartPassive
        } else {
            Event::AutomaticStart
        })
        .await;
        loop {
            let deadline = [
                self.connect_retry,
                self.hold,
                self.keepalive,
                self.idle_hold,
                self.delay_open,
            ]
            .into_iter()
            .flatten()
            .min();
            let sleep = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            // Disjoint borrows of the fields each branch waits on.
            let conn = &mut self.conn;
            let connecting = &mut self.connecting;
            let bfd_rx = &mut self.bfd;
            let read = async move {
                match conn.as_mut() {
                    Some(c) => c.rd.read_buf(&mut c.buf).await,
                    None => std::future::pending().await,
                }
            };
            let connect = async move {
                match connecting.as_mut() {
                    Some(f) => f.await,
                    None => std::future::pending().await,
                }
            };
            let bfd = async move {
                match bfd_rx.as_mut() {
                    Some(b) => b.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = self.commands.recv() => {
                    let (keep_routes, cease) = match cmd {
                        Some(Command::Stop { keep_routes, cease }) => (keep_routes, cease),
                        None => (false, codes::PEER_DECONFIGURED),
                    };
                    self.stop(keep_routes, cease).await;
                    return;
                }
                n = read => self.on_read(n).await,
                r = connect => {
                    self.connecting = None;
                    match r {
                        Ok(s) => {
                            self.adopt(s);
                            self.event(Event::TcpCrAcked).await;
                        }
                        Err(e) => {
                            debug!(peer = %self.peer(), error = %e, "connect failed");
                            self.set_error(format!("connect: {e}"));
                            self.event(Event::TcpConnectionFails).await;
                        }
                    }
                }
                Some(s) = self.incoming.recv() => self.on_incoming(s).await,
                Some((s, buf)) = self.reopened.recv() => self.on_reopened(s, buf).await,
                _ = self.routes.changed() => {
                    if self.fsm.state() == State::Established {
                        self.sync_routes(false).await;
                    }
                }
                ok = bfd => {
                    if ok {
                        self.on_bfd().await;
                    } else {
                        self.bfd = None;
                    }
                }
                _ = sleep => self.on_timer().await,
            }
        }
    }

    async fn on_timer(&mut self) {
        let now = Instant::now();
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        if due(self.hold) {
            self.hold = None;
            self.set_error("hold timer expired".into());
            self.event(Event::HoldTimerExpires).await;
        } else if due(self.keepalive) {
            self.keepalive = None;
            self.event(Event::KeepaliveTimerExpires).await;
        } else if due(self.connect_retry) {
            self.connect_retry = None;
            self.event(Event::ConnectRetryTimerExpires).await;
        } else if due(self.delay_open) {
            self.delay_open = None;
            self.event(Event::DelayOpenTimerExpires).await;
        } else if due(self.idle_hold) {
            self.idle_hold = None;
            self.event(Event::IdleHoldTimerExpires).await;
        }
    }

    async fn on_bfd(&mut self) {
        let st = match &self.bfd {
            Some(b) => *b.borrow(),
            None => return,
        };
        self.status.send_modify(|s| s.bfd = Some(st));
        if st.state == BfdState::Up {
            self.bfd_was_up = true;
            return;
        }
        if self.bfd_was_up {
            self.bfd_was_up = false;
            if self.fsm.state() != State::Idle {
                info!(peer = %self.peer(), "BFD down: closing the session");
                self.set_error("BFD down".into());
                self.event(Event::AutomaticStop(codes::BFD_DOWN)).await;
                self.schedule_restart();
            }
        }
    }

    fn schedule_restart(&mut self) {
        self.fails += 1;
        self.idle_hold = Some(Instant::now() + backoff(self.fails));
    }

    async fn on_read(&mut self, n: std::io::Result<usize>) {
        match n {
            Ok(0) | Err(_) => {
                if let Err(e) = &n {
                    self.set_error(format!("connection: {e}"));
                } else {
                    self.set_error("connection closed by the peer".into());
                }
                self.event(Event::TcpConnectionFails).await;
                return;
            }
            Ok(_) => {}
        }
        // Every whole message in the buffer, in order.
        loop {
            let Some(c) = self.conn.as_mut() else {
                return;
            };
            let asn4 = self.negotiated.as_ref().is_some_and(|n| n.asn4);
            let mut ctx = wire::parsing_context(asn4);
            let msg = match wire::decode(&mut c.buf, &mut ctx) {
                Ok(Some(m)) => m,
                Ok(None) => return,
                // RFC 7606: an UPDATE whose attributes are malformed but
                // whose NLRI can still be found is treated as a withdraw
                // of its routes. This speaker keeps none of what it
                // receives, so that is to drop it and go on: one bad
                // attribute from a router must not reset every node's
                // session at every reconnect. A malformed attribute list
                // or NLRI (the routes cannot be found) still resets.
                Err(DecodeError::Attribute(n)) => {
                    warn!(peer = %self.peer(), error = %n, "malformed UPDATE treated as a withdraw (RFC 7606), the session kept");
                    self.set_error(format!("treated an UPDATE as a withdraw: {n}"));
                    self.status.send_modify(|s| {
                        s.messages_received += 1;
                        s.updates_received += 1;
                    });
                    self.event(Event::UpdateMsg).await;
                    continue;
                }
                Err(e) => {
                    let n = e.notification().clone();
                    warn!(peer = %self.peer(), notification = %n, "malformed message");
                    self.set_error(format!("sent NOTIFICATION {n}"));
                    let ev = match e {
                        DecodeError::Header(n) | DecodeError::Other(n) => Event::BgpHeaderErr(n),
                        DecodeError::Open(n) => Event::BgpOpenMsgErr(n),
                        DecodeError::Update(n) | DecodeError::Attribute(n) => {
                            Event::UpdateMsgErr(n)
                        }
                    };
                    self.event(ev).await;
                    return;
                }
            };
            self.status.send_modify(|s| s.messages_received += 1);
            let ev = match msg {
                Message::Open(o) => {
                    match wire::check_open(&o, &self.global.open_params(&self.cfg), self.cfg.asn) {
                        Ok(neg) => {
                            let hold_time = neg.hold_time;
                            self.negotiated = Some(neg);
                            if self.fsm.delay_open_running() {
                                Event::BgpOpenWithDelayOpenTimer { hold_time }
                            } else {
                                Event::BgpOpen { hold_time }
                            }
                        }
                        Err(n) => {
                            self.set_error(format!("sent NOTIFICATION {n}"));
                            Event::BgpOpenMsgErr(n)
                        }
                    }
                }
                Message::Update(_) => {
                    self.status.send_modify(|s| s.updates_received += 1);
                    Event::UpdateMsg
                }
                Message::Keepalive => Event::KeepAliveMsg,
                Message::Notification(n) => {
                    info!(peer = %self.peer(), notification = %n, "NOTIFICATION received");
                    self.set_error(format!("received NOTIFICATION {n}"));
                    if n.code == codes::OPEN_MESSAGE && n.subcode == codes::UNSUPPORTED_VERSION {
                        Event::NotifMsgVerErr
                    } else {
                        Event::NotifMsg
                    }
                }
                Message::RouteRefresh => {
                    // RFC 2918: send the Adj-RIB-Out again.
                    if self.fsm.state() == State::Established {
                        self.rib_out.clear();
                        self.sync_routes(false).await;
                    }
                    continue;
                }
            };
            self.event(ev).await;
        }
    }

    /// A connection the listener accepted from this peer.
    async fn on_incoming(&mut self, s: TcpStream) {
        match self.fsm.state() {
            State::Idle => {
                // Not started (backing off): take it as the start.
                self.idle_hold = None;
                self.event(if self.cfg.passive {
                    Event::AutomaticStartPassive
                } else {
                    Event::AutomaticStart
                })
                .await;
                self.connecting = None;
                self.adopt(s);
                self.event(Event::TcpConnectionConfirmed).await;
            }
            State::Connect | State::Active => {
                self.connecting = None;
                self.adopt(s);
                self.event(Event::TcpConnectionConfirmed).await;
            }
            State::OpenSent => reject(s).await,
            State::OpenConfirm => {
                // 6.8: the connection opened by the speaker with the
                // higher identifier survives; this one was opened by
                // the peer.
                let peer_id = self.negotiated.as_ref().map(|n| n.peer_id);
                if peer_id.is_some_and(|p| u32::from(p) > u32::from(self.global.router_id)) {
                    self.event(Event::OpenCollisionDump).await;
                    self.idle_hold = None;
                    self.event(Event::AutomaticStart).await;
                    self.connecting = None;
                    self.adopt(s);
                    self.event(Event::TcpConnectionConfirmed).await;
                } else {
                    reject(s).await;
                }
            }
            State::Established => {
                // 6.8: an Established session wins a collision. Anyone
                // who can send a SYN from the peer's address could
                // otherwise flap it (every route withdrawn at the router
                // while the new connection goes nowhere).
                let gr = self
                    .negotiated
                    .as_ref()
                    .is_some_and(|n| n.peer_graceful_restart);
                if !gr {
                    warn!(peer = %self.peer(), "a new connection from the peer while Established: refused (Cease, connection collision), the session kept");
                    reject(s).await;
                    return;
                }
                // With graceful restart the peer may have restarted and
                // lost the old session (RFC 4724 4.2): its new connection
                // replaces it once it has sent a valid OPEN, read aside
                // so that the session goes on meanwhile.
                let tx = self.reopened_tx.clone();
                let ours = self.global.open_params(&self.cfg);
                let (asn, peer) = (self.cfg.asn, self.peer());
                tokio::spawn(async move {
                    match tokio::time::timeout(OPEN_WAIT, first_open(s, &ours, asn)).await {
                        Ok(Ok(got)) => {
                            let _ = tx.send(got).await;
                        }
                        Ok(Err((s, why))) => {
                            warn!(%peer, %why, "a new connection from the peer while Established sent no valid OPEN: refused, the session kept");
                            reject(s).await;
                        }
                        Err(_) => {
                            warn!(%peer, "a new connection from the peer while Established sent no OPEN in {OPEN_WAIT:?}: closed, the session kept");
                        }
                    }
                });
            }
        }
    }

    /// The peer's new connection, with its valid OPEN already read: it
    /// restarted, so the old session is gone on its side.
    async fn on_reopened(&mut self, s: TcpStream, buf: BytesMut) {
        if self.fsm.state() != State::Established {
            // The session went meanwhile: the connection is an incoming
            // one like any other, its OPEN already read.
            self.on_incoming(s).await;
            if let Some(c) = self.conn.as_mut() {
                c.buf = buf;
            }
            return;
        }
        info!(peer = %self.peer(), "the peer restarted (a valid OPEN on a new connection): replacing the session");
        self.set_error("the peer opened a new connection with a valid OPEN".into());
        self.event(Event::TcpConnectionFails).await;
        self.idle_hold = None;
        self.event(Event::AutomaticStart).await;
        self.connecting = None;
        self.adopt(s);
        if let Some(c) = self.conn.as_mut() {
            c.buf = buf;
        }
        self.event(Event::TcpConnectionConfirmed).await;
    }

    fn adopt(&mut self, s: TcpStream) {
        let _ = s.set_nodelay(true);
        let local = s
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
        let local = SocketAddr::new(local.ip().to_canonical(), local.port());
        let (rd, wr) = s.into_split();
        self.conn = Some(Conn {
            rd,
            wr,
            local,
            buf: BytesMut::with_capacity(8192),
        });
        self.status
            .send_modify(|st| st.local_address = Some(local.ip()));
    }

    fn set_error(&self, e: String) {
        self.status.send_modify(|s| s.last_error = Some(e));
    }

    /// Feed one event to the FSM and carry out its actions.
    async fn event(&mut self, ev: Event) {
        let before = self.fsm.state();
        let num = ev.number();
        let actions = self.fsm.handle(ev);
        let after = self.fsm.state();
        if before != after {
            debug!(peer = %self.peer(), event = num, from = %before, to = %after, "BGP FSM");
            if after == State::Established {
                info!(peer = %self.peer(), "BGP session established");
            } else if before == State::Established {
                info!(peer = %self.peer(), state = %after, "BGP session down");
            }
        }
        for a in actions {
            self.act(a).await;
        }
        let now_state = self.fsm.state();
        if before == State::Established && now_state != State::Established {
            if self.established_at.is_some_and(|t| t.elapsed() >= STABLE) {
                self.fails = 0;
            }
            self.established_at = None;
        }
        let established_at = self.established_at;
        self.status.send_modify(|s| {
            if s.state != now_state {
                s.state = now_state;
                if before == State::Established {
                    s.flaps += 1;
                    s.established_since = None;
                }
                if now_state == State::Established {
                    s.established_transitions += 1;
                    s.established_since = Some(SystemTime::now());
                    s.established_instant = established_at;
                }
            }
        });
    }

    async fn act(&mut self, a: Action) {
        let now = Instant::now();
        match a {
            Action::StartConnectRetryTimer => {
                self.connect_retry = Some(now + self.cfg.connect_retry)
            }
            Action::StopConnectRetryTimer => self.connect_retry = None,
            Action::StartDelayOpenTimer => {
                self.delay_open = Some(now + self.cfg.delay_open.unwrap_or(Duration::from_secs(5)))
            }
            Action::StopDelayOpenTimer => self.delay_open = None,
            Action::StartHoldTimer(s) => {
                self.hold = (s != 0).then(|| now + Duration::from_secs(u64::from(s)));
            }
            Action::StartKeepaliveTimer => {
                let hold = self.fsm.hold_time;
                self.keepalive =
                    (hold != 0).then(|| now + Duration::from_secs(u64::from(hold)) / 3);
            }
            Action::InitiateTcp => self.connecting = Some(self.connect()),
            Action::ListenTcp
            | Action::AcceptTcp
            | Action::RejectTcp
            | Action::TrackSecondConnection => {}
            Action::DropTcp => {
                self.conn = None;
                self.connecting = None;
                self.hold = None;
                self.keepalive = None;
            }
            Action::SendOpen => {
                let open = wire::open_message(&self.global.open_params(&self.cfg));
                self.send(&wire::encode(&open)).await;
            }
            Action::SendKeepalive => self.send(&wire::encode_keepalive()).await,
            Action::SendNotification(n) => {
                self.send(&wire::encode_notification(&n)).await;
                if let Some(c) = self.conn.as_mut() {
                    let _ = c.wr.flush().await;
                }
            }
            Action::ProcessUpdate => {}
            Action::SessionUp => {
                self.established_at = Some(now);
                self.rib_out.clear();
                self.sync_routes(true).await;
            }
            Action::ReleaseResources => {
                self.rib_out.clear();
                self.negotiated = None;
                self.status.send_modify(|s| {
                    s.advertised.clear();
                    s.families.clear();
                    s.hold_time = 0;
                    s.peer_graceful_restart = false;
                });
            }
            Action::StartIdleHoldTimer => {
                if !self.stopping {
                    self.schedule_restart();
                }
            }
        }
    }

    fn connect(&self) -> Connecting {
        let peer = SocketAddr::new(self.cfg.address, self.cfg.port);
        let local = self.cfg.local_address;
        let password = self.cfg.password.clone();
        let timeout = self.cfg.connect_retry;
        Box::pin(async move {
            let sock = if peer.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            if let Some(key) = &password {
                crate::md5::set_md5(sock.as_fd(), peer.ip(), key)?;
            }
            if let Some(l) = local {
                sock.bind(SocketAddr::new(l, 0))?;
            }
            match tokio::time::timeout(timeout, sock.connect(peer)).await {
                Ok(r) => r,
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer to the connection",
                )),
            }
        })
    }

    async fn send(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let Some(c) = self.conn.as_mut() else {
            return;
        };
        match c.wr.write_all(bytes).await {
            Ok(()) => self.status.send_modify(|s| s.messages_sent += 1),
            Err(e) => debug!(peer = %self.cfg.address, error = %e, "write"),
        }
    }

    async fn send_update(&mut self, m: BgpMessage) {
        self.send(&wire::encode(&m)).await;
        self.status.send_modify(|s| s.updates_sent += 1);
    }

    fn update_params(&self) -> Option<(UpdateParams, Vec<Family>)> {
        let neg = self.negotiated.as_ref()?;
        let local = self.conn.as_ref()?.local.ip();
        let next_hop4 = self.cfg.next_hop4.or(match local {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        });
        let next_hop6: Option<Ipv6Addr> = self.cfg.next_hop6.or(match local {
            IpAddr::V6(a) if !a.is_unspecified() => Some(a),
            _ => None,
        });
        Some((
            UpdateParams {
                local_asn: self.global.asn,
                ebgp: neg.peer_asn != self.global.asn,
                asn4: neg.asn4,
                next_hop4,
                next_hop6,
            },
            neg.families.clone(),
        ))
    }

    /// Make the peer hold exactly the current routes: announce what is
    /// new or changed, withdraw what is gone. `initial`: the first table
    /// of the session, followed by End-of-RIB for every family.
    async fn sync_routes(&mut self, initial: bool) {
        let Some((p, families)) = self.update_params() else {
            return;
        };
        let routes = self.routes.borrow_and_update().clone();
        let mut want: BTreeMap<IpNet, RouteAttrs> = BTreeMap::new();
        for r in routes.iter() {
            let fam = Family::of(r.prefix.addr());
            if !families.contains(&fam) {
                continue;
            }
            let hop_ok = match fam {
                Family::Ipv4Unicast => p.next_hop4.is_some(),
                Family::Ipv6Unicast => p.next_hop6.is_some(),
            };
            if hop_ok {
                want.insert(r.prefix, merge(&r.attrs, &self.cfg.attrs));
            }
        }
        let withdraw4: Vec<_> = self
            .rib_out
            .keys()
            .filter(|k| !want.contains_key(k))
            .filter_map(|k| match k {
                IpNet::V4(n) => Some(*n),
                IpNet::V6(_) => None,
            })
            .collect();
        let withdraw6: Vec<_> = self
            .rib_out
            .keys()
            .filter(|k| !want.contains_key(k))
            .filter_map(|k| match k {
                IpNet::V6(n) => Some(*n),
                IpNet::V4(_) => None,
            })
            .collect();
        // Group what changed by attributes: one UPDATE per group (and per
        // size limit).
        let mut groups: BTreeMap<RouteAttrs, (Vec<ipnet::Ipv4Net>, Vec<ipnet::Ipv6Net>)> =
            BTreeMap::new();
        for (k, a) in &want {
            if self.rib_out.get(k) == Some(a) {
                continue;
            }
            let g = groups.entry(a.clone()).or_default();
            match k {
                IpNet::V4(n) => g.0.push(*n),
                IpNet::V6(n) => g.1.push(*n),
            }
        }
        for chunk in withdraw4.chunks(wire::V4_PER_UPDATE) {
            self.send_update(wire::withdraw_v4(chunk)).await;
        }
        for chunk in withdraw6.chunks(wire::V6_PER_UPDATE) {
            self.send_update(wire::withdraw_v6(chunk)).await;
        }
        for (a, (v4, v6)) in &groups {
            if let Some(nh) = p.next_hop4 {
                for chunk in v4.chunks(wire::V4_PER_UPDATE) {
                    self.send_update(wire::announce_v4(chunk, a, &p, nh)).await;
                }
            }
            if let Some(nh) = p.next_hop6 {
                for chunk in v6.chunks(wire::V6_PER_UPDATE) {
                    self.send_update(wire::announce_v6(chunk, a, &p, nh)).await;
                }
            }
        }
        if initial {
            for f in &families {
                self.send_update(wire::end_of_rib(*f)).await;
            }
        }
        let changed = !withdraw4.is_empty() || !withdraw6.is_empty() || !groups.is_empty();
        if changed {
            debug!(peer = %self.peer(), announced = groups.values().map(|g| g.0.len() + g.1.len()).sum::<usize>(), withdrawn = withdraw4.len() + withdraw6.len(), "routes sent");
        }
        self.rib_out = want;
        let advertised: Vec<IpNet> = self.rib_out.keys().copied().collect();
        let neg = self.negotiated.clone();
        self.status.send_modify(|s| {
            s.advertised = advertised;
            if let Some(n) = &neg {
                s.families = n.families.clone();
                s.hold_time = n.hold_time;
                s.peer_graceful_restart = n.peer_graceful_restart;
            }
        });
    }

    async fn stop(&mut self, keep_routes: bool, cease: u8) {
        self.stopping = true;
        if keep_routes {
            // Close without NOTIFICATION: the peer's graceful restart
            // keeps our routes (RFC 4724 4.2).
            info!(peer = %self.peer(), "closing for a graceful restart: the peer keeps the routes");
            self.conn = None;
            self.connecting = None;
            return;
        }
        if self.fsm.state() == State::Established {
            self.routes_withdraw_all().await;
        }
        let ev = if cease == codes::ADMINISTRATIVE_SHUTDOWN {
            Event::ManualStop
        } else {
            Event::AutomaticStop(cease)
        };
        self.event(ev).await;
        self.status.send_modify(|s| s.state = State::Idle);
    }

    async fn routes_withdraw_all(&mut self) {
        let v4: Vec<_> = self
            .rib_out
            .keys()
            .filter_map(|k| match k {
                IpNet::V4(n) => Some(*n),
                _ => None,
            })
            .collect();
        let v6: Vec<_> = self
            .rib_out
            .keys()
            .filter_map(|k| match k {
                IpNet::V6(n) => Some(*n),
                _ => None,
            })
            .collect();
        for chunk in v4.chunks(wire::V4_PER_UPDATE) {
            self.send_update(wire::withdraw_v4(chunk)).await;
        }
        for chunk in v6.chunks(wire::V6_PER_UPDATE) {
            self.send_update(wire::withdraw_v6(chunk)).await;
        }
        self.rib_out.clear();
    }
}

/// A route's attributes with the peer's: communities of both, the
/// route's local preference and MED over the peer's.
pub fn merge(route: &RouteAttrs, peer: &RouteAttrs) -> RouteAttrs {
    let mut communities = peer.communities.clone();
    communities.extend(&route.communities);
    communities.sort_unstable();
    communities.dedup();
    let mut large = peer.large_communities.clone();
    large.extend(&route.large_communities);
    large.sort_unstable();
    large.dedup();
    RouteAttrs {
        communities,
        large_communities: large,
        local_pref: route.local_pref.or(peer.local_pref),
        med: route.med.or(peer.med),
    }
}

/// How long a new connection from an Established peer (graceful restart
/// negotiated) has to send its OPEN.
const OPEN_WAIT: Duration = Duration::from_secs(10);

/// Read `s` until its first message: Ok with the stream and everything
/// read (the OPEN still in it) when it is an OPEN that `check_open`
/// accepts, else the stream and why not.
async fn first_open(
    mut s: TcpStream,
    ours: &wire::OpenParams,
    asn: u32,
) -> Result<(TcpStream, BytesMut), (TcpStream, String)> {
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        let mut probe = buf.clone();
        let mut ctx = wire::parsing_context(false);
        match wire::decode(&mut probe, &mut ctx) {
            Ok(Some(Message::Open(o))) => {
                return match wire::check_open(&o, ours, asn) {
                    Ok(_) => Ok((s, buf)),
                    Err(n) => Err((s, format!("its OPEN: {n}"))),
                };
            }
            Ok(Some(_)) => return Err((s, "its first message is not an OPEN".into())),
            Err(e) => return Err((s, format!("{}", e.notification()))),
            Ok(None) => {}
        }
        match s.read_buf(&mut buf).await {
            Ok(0) => return Err((s, "closed before an OPEN".into())),
            Ok(_) => {}
            Err(e) => return Err((s, format!("reading: {e}"))),
        }
    }
}

/// Refuse a connection the session does not take: Cease, connection
/// collision resolution (RFC 4271 6.8, RFC 4486), then close.
async fn reject(mut s: TcpStream) {
    let n = Notification::new(codes::CEASE, codes::CONNECTION_COLLISION_RESOLUTION);
    let _ = s.write_all(&wire::encode_notification(&n)).await;
    let _ = s.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_thirty_seconds_with_jitter() {
        assert_eq!(backoff(0), Duration::ZERO);
        for (n, base) in [(1u32, 1u64), (2, 2), (3, 4), (5, 16), (6, 30), (20, 30)] {
            let b = backoff(n);
            let base = Duration::from_secs(base);
            assert!(b <= base && b >= base * 3 / 4, "{n}: {b:?}");
        }
    }

    #[test]
    fn merged_attributes_take_both_communities_and_the_routes_preferences() {
        let route = RouteAttrs {
            communities: vec![2, 1],
            large_communities: vec![(1, 2, 3)],
            local_pref: Some(200),
            med: None,
        };
        let peer = RouteAttrs {
            communities: vec![1, 3],
            large_communities: vec![],
            local_pref: Some(50),
            med: Some(7),
        };
        let m = merge(&route, &peer);
        assert_eq!(m.communities, vec![1, 2, 3]);
        assert_eq!(m.large_communities, vec![(1, 2, 3)]);
        assert_eq!((m.local_pref, m.med), (Some(200), Some(7)));
    }
}
