//! The speaker: the peers' sessions, the listener that hands each
//! incoming connection to its peer's session, BFD, and the route set they
//! all announce, behind [`Speaker`]. Routes and peers are replaced whole
//! (`set_routes`, `set_peers`); each session sends only what changed.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ipnet::IpNet;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::bfd::{self, Bfd, BfdStatus};
use crate::fsm::{codes, State};
use crate::session::{Command, Session};
use crate::wire::{Family, GracefulRestart, OpenParams, RouteAttrs};

pub const BGP_PORT: u16 = 179;

/// One route this node announces: a VIP as a /32 or /128.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub prefix: IpNet,
    pub attrs: RouteAttrs,
}

impl Route {
    /// The host route of `addr`.
    pub fn host(addr: IpAddr, attrs: RouteAttrs) -> Self {
        Self {
            prefix: IpNet::from(addr),
            attrs,
        }
    }
}

/// One peer as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// For humans (status, metrics): the configuration's name, or the
    /// address.
    pub name: String,
    pub address: IpAddr,
    pub asn: u32,
    /// Where the peer listens (179).
    pub port: u16,
    /// Connect from this address (default: as the kernel routes).
    pub local_address: Option<IpAddr>,
    /// Wait for the peer to connect.
    pub passive: bool,
    /// Offered hold time, seconds (0: none; else at least 3).
    pub hold_time: u16,
    pub connect_retry: Duration,
    pub delay_open: Option<Duration>,
    /// TCP MD5 key.
    pub password: Option<Vec<u8>>,
    /// Families offered; routes of others are not sent.
    pub families: Vec<Family>,
    /// Next hops for a family the session's own address is not of (an
    /// IPv6 route over an IPv4 session), or to override it.
    pub next_hop4: Option<Ipv4Addr>,
    pub next_hop6: Option<Ipv6Addr>,
    pub bfd: Option<bfd::Timers>,
    /// Advertise graceful restart to this peer.
    pub graceful_restart: bool,
    /// Communities, large communities, local preference and MED on every
    /// route to this peer.
    pub attrs: RouteAttrs,
}

impl PeerConfig {
    pub fn new(address: IpAddr, asn: u32) -> Self {
        Self {
            name: address.to_string(),
            address,
            asn,
            port: BGP_PORT,
            local_address: None,
            passive: false,
            hold_time: 90,
            connect_retry: Duration::from_secs(5),
            delay_open: None,
            password: None,
            families: vec![Family::of(address)],
            next_hop4: None,
            next_hop6: None,
            bfd: None,
            graceful_restart: true,
            attrs: RouteAttrs::default(),
        }
    }
}

/// The speaker's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeakerConfig {
    pub asn: u32,
    pub router_id: Ipv4Addr,
    /// Where to listen (179; 0: do not listen, active sessions only).
    pub listen_port: u16,
    /// Graceful restart's restart time, seconds.
    pub restart_time: u16,
    /// F bit: forwarding survives a restart (the datapath is pinned).
    pub forwarding_preserved: bool,
    /// R bit: this start is a restart.
    pub restarting: bool,
}

/// What every session shares.
#[derive(Debug)]
pub struct Global {
    pub asn: u32,
    pub router_id: Ipv4Addr,
    pub restart_time: u16,
    pub forwarding_preserved: bool,
    pub restarting: bool,
}

impl Global {
    pub fn open_params(&self, p: &PeerConfig) -> OpenParams {
        OpenParams {
            asn: self.asn,
            hold_time: p.hold_time,
            router_id: self.router_id,
            families: p.families.clone(),
            graceful_restart: p.graceful_restart.then_some(GracefulRestart {
                restart_time: self.restart_time,
                restarting: self.restarting,
                forwarding_preserved: self.forwarding_preserved,
            }),
        }
    }
}

/// One session as the API and metrics show it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerStatus {
    pub name: String,
    pub address: IpAddr,
    pub asn: u32,
    pub state: State,
    pub local_address: Option<IpAddr>,
    /// Wall clock of the last transition to Established; None unless
    /// Established now.
    pub established_since: Option<SystemTime>,
    pub established_instant: Option<Instant>,
    /// Times the session reached Established.
    pub established_transitions: u64,
    /// Times it left Established.
    pub flaps: u64,
    pub updates_sent: u64,
    pub updates_received: u64,
    pub messages_sent: u64,
    pub messages_received: u64,
    pub hold_time: u16,
    pub families: Vec<Family>,
    pub peer_graceful_restart: bool,
    pub last_error: Option<String>,
    pub bfd: Option<BfdStatus>,
    /// The prefixes the peer holds from us.
    pub advertised: Vec<IpNet>,
}

impl PeerStatus {
    fn new(p: &PeerConfig) -> Self {
        Self {
            name: p.name.clone(),
            address: p.address,
            asn: p.asn,
            state: State::Idle,
            local_address: None,
            established_since: None,
            established_instant: None,
            established_transitions: 0,
            flaps: 0,
            updates_sent: 0,
            updates_received: 0,
            messages_sent: 0,
            messages_received: 0,
            hold_time: 0,
            families: Vec::new(),
            peer_graceful_restart: false,
            last_error: None,
            bfd: p.bfd.map(|_| BfdStatus::default()),
            advertised: Vec::new(),
        }
    }

    /// Seconds Established, 0 when not.
    pub fn uptime(&self) -> Duration {
        match (self.state, self.established_instant) {
            (State::Established, Some(t)) => t.elapsed(),
            _ => Duration::ZERO,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    #[error("listening for BGP on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Bfd(#[from] bfd::BfdError),
    #[error("setting the TCP MD5 key for {peer} on the listener: {source}")]
    Md5 {
        peer: IpAddr,
        source: std::io::Error,
    },
}

struct PeerHandle {
    cfg: PeerConfig,
    commands: mpsc::Sender<Command>,
    incoming: mpsc::Sender<TcpStream>,
    status: watch::Receiver<PeerStatus>,
    task: JoinHandle<()>,
}

struct Inner {
    global: Arc<Global>,
    peers: HashMap<IpAddr, PeerHandle>,
    listeners: Vec<std::os::fd::OwnedFd>,
    bfd: Option<Bfd>,
}

/// The running speaker. Cheap to clone.
#[derive(Clone)]
pub struct Speaker {
    inner: Arc<Mutex<Inner>>,
    routes: Arc<watch::Sender<Arc<Vec<Route>>>>,
}

impl std::fmt::Debug for Speaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speaker")
            .field("routes", &self.routes().len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn listener(addr: SocketAddr) -> Result<TcpListener, SpeakerError> {
    use socket2::{Domain, Socket, Type};
    let err = |source| SpeakerError::Listen { addr, source };
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(err)?;
    s.set_reuse_address(true).map_err(err)?;
    if addr.is_ipv6() {
        s.set_only_v6(true).map_err(err)?;
    }
    s.set_nonblocking(true).map_err(err)?;
    s.bind(&addr.into()).map_err(err)?;
    s.listen(128).map_err(err)?;
    TcpListener::from_std(s.into()).map_err(err)
}

impl Speaker {
    /// Listen (unless `listen_port` is 0) and start no session yet: see
    /// [`Speaker::set_peers`]. Needs a tokio runtime.
    pub fn start(cfg: &SpeakerConfig) -> Result<Self, SpeakerError> {
        let (routes, _) = watch::channel(Arc::new(Vec::new()));
        let sp = Speaker {
            inner: Arc::new(Mutex::new(Inner {
                global: Arc::new(Global {
                    asn: cfg.asn,
                    router_id: cfg.router_id,
                    restart_time: cfg.restart_time,
                    forwarding_preserved: cfg.forwarding_preserved,
                    restarting: cfg.restarting,
                }),
                peers: HashMap::new(),
                listeners: Vec::new(),
                bfd: None,
            })),
            routes: Arc::new(routes),
        };
        if cfg.listen_port != 0 {
            for addr in [
                SocketAddr::from(([0, 0, 0, 0], cfg.listen_port)),
                SocketAddr::from(([0u16; 8], cfg.listen_port)),
            ] {
                let l = listener(addr)?;
                let fd = l
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|source| SpeakerError::Listen { addr, source })?;
                lock(&sp.inner).listeners.push(fd);
                let me = sp.clone();
                tokio::spawn(async move { me.accept(l).await });
            }
        }
        info!(asn = cfg.asn, router_id = %cfg.router_id, port = cfg.listen_port, "BGP speaker");
        Ok(sp)
    }

    async fn accept(self, l: TcpListener) {
        loop {
            let (s, from) = match l.accept().await {
                Ok(v) => v,
                Err(e) => {
                    warn!(error = %e, "BGP accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let ip = from.ip().to_canonical();
            let tx = lock(&self.inner).peers.get(&ip).map(|p| p.incoming.clone());
            match tx {
                Some(tx) => {
                    let _ = tx.send(s).await;
                }
                None => debug!(%from, "BGP connection from no configured peer: closed"),
            }
        }
    }

    /// Replace the peers: new ones start, removed ones withdraw and stop
    /// (Cease, peer de-configured), changed ones restart.
    pub fn set_peers(&self, peers: Vec<PeerConfig>) -> Result<(), SpeakerError> {
        let mut inner = lock(&self.inner);
        let want: HashMap<IpAddr, PeerConfig> = peers.into_iter().map(|p| (p.address, p)).collect();
        let gone: Vec<IpAddr> = inner
            .peers
            .iter()
            .filter(|(a, h)| want.get(a) != Some(&h.cfg))
            .map(|(a, _)| *a)
            .collect();
        for a in gone {
            if let Some(h) = inner.peers.remove(&a) {
                let cease = if want.contains_key(&a) {
                    codes::OTHER_CONFIGURATION_CHANGE
                } else {
                    codes::PEER_DECONFIGURED
                };
                info!(peer = %a, "BGP peer removed or changed");
                let _ = h.commands.try_send(Command::Stop {
                    keep_routes: false,
                    cease,
                });
                if let Some(b) = &inner.bfd {
                    b.remove(a);
                }
                self.set_listener_key(&inner, a, &[])?;
            }
        }
        for (a, cfg) in want {
            if inner.peers.contains_key(&a) {
                continue;
            }
            self.set_listener_key(&inner, a, cfg.password.as_deref().unwrap_or(&[]))?;
            let bfd_rx = match cfg.bfd {
                Some(t) => {
                    if inner.bfd.is_none() {
                        inner.bfd = Some(Bfd::start()?);
                    }
                    let local = cfg
                        .local_address
                        .or_else(|| local_toward(a))
                        .unwrap_or(match a {
                            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                        });
                    match inner.bfd.as_ref().map(|b| b.add(a, local, t)) {
                        Some(Ok(rx)) => Some(rx),
                        Some(Err(e)) => {
                            warn!(peer = %a, error = %e, "BFD session not started");
                            None
                        }
                        None => None,
                    }
                }
                None => None,
            };
            let (ctx, crx) = mpsc::channel(4);
            let (itx, irx) = mpsc::channel(4);
            let (stx, srx) = watch::channel(PeerStatus::new(&cfg));
            let session = Session::new(
                cfg.clone(),
                inner.global.clone(),
                self.routes.subscribe(),
                irx,
                crx,
                bfd_rx,
                stx,
            );
            let task = tokio::spawn(session.run());
            inner.peers.insert(
                a,
                PeerHandle {
                    cfg,
                    commands: ctx,
                    incoming: itx,
                    status: srx,
                    task,
                },
            );
        }
        Ok(())
    }

    fn set_listener_key(
        &self,
        inner: &Inner,
        peer: IpAddr,
        key: &[u8],
    ) -> Result<(), SpeakerError> {
        for fd in &inner.listeners {
            let v6 = matches!(
                socket2::SockRef::from(fd)
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_socket()),
                Some(SocketAddr::V6(_))
            );
            if v6 != peer.is_ipv6() {
                continue;
            }
            match crate::md5::set_md5(fd.as_fd(), peer, key) {
                Ok(()) => {}
                // Removing a key that was never set.
                Err(e) if key.is_empty() && e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => return Err(SpeakerError::Md5 { peer, source }),
            }
        }
        Ok(())
    }

    /// Replace the routes every session announces.
    pub fn set_routes(&self, mut routes: Vec<Route>) {
        routes.sort();
        routes.dedup_by(|a, b| a.prefix == b.prefix);
        self.routes.send_if_modified(|cur| {
            if **cur == routes {
                false
            } else {
                *cur = Arc::new(routes);
                true
            }
        });
    }

    pub fn routes(&self) -> Arc<Vec<Route>> {
        self.routes.borrow().clone()
    }

    /// Every peer's session, by address.
    pub fn status(&self) -> Vec<PeerStatus> {
        let inner = lock(&self.inner);
        let mut v: Vec<PeerStatus> = inner
            .peers
            .values()
            .map(|h| h.status.borrow().clone())
            .collect();
        v.sort_by_key(|s| s.address);
        v
    }

    /// Stop every session and wait (at most `limit`) for them to finish.
    /// `keep_routes`: close the connections without a word, for peers'
    /// graceful restart to keep the routes; otherwise withdraw every route
    /// and send Cease (administrative shutdown).
    pub async fn shutdown(&self, keep_routes: bool, limit: Duration) {
        let handles: Vec<PeerHandle> = lock(&self.inner).peers.drain().map(|(_, h)| h).collect();
        for h in &handles {
            let _ = h
                .commands
                .send(Command::Stop {
                    keep_routes,
                    cease: codes::ADMINISTRATIVE_SHUTDOWN,
                })
                .await;
        }
        let all = futures::future::join_all(handles.into_iter().map(|h| h.task));
        if tokio::time::timeout(limit, all).await.is_err() {
            warn!("BGP sessions did not stop in time");
        }
    }
}

/// The address this host would send from toward `peer` (a connected UDP
/// socket sends nothing): the router ID and BFD's source when none is
/// configured.
pub fn local_toward(peer: IpAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match peer {
        IpAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        IpAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(peer, BGP_PORT)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}
