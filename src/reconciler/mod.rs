//! The one owner of the dataplane on a node.
//!
//! Sources (the static file, Kubernetes Services and Gateways) send what they
//! want as [`Command`]s; the reconciler keeps it in a
//! [`DesiredStore`](crate::desired::DesiredStore), merges it (one owner
//! per VIP key), and applies the difference through the map writer, on a
//! thread of its own: map writes, the grace period and neighbour
//! resolution never run on the async runtime, so the API, metrics and
//! probes stay responsive while 4,096 VIPs are applied. It also owns the
//! health checker's targets, operator drains and the node's facts, and
//! publishes a [`status::DataplaneStatus`] after every change; readers
//! never see its state directly.
//!
//! Pruning: VIPs adopted from the pinned maps stay, unclaimed, until
//! every registered source has reported its first full pass; only then is
//! whatever nothing claimed removed. A source that never syncs (an API
//! server that cannot be reached) therefore removes nothing.

mod grace;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;
use tracing::{debug, error, info, info_span, warn};

use crate::daemon::net::{self, NetError};
use crate::daemon::state::{DrainStore, Drains, StateError};
use crate::dataplane::render::Health;
use crate::dataplane::store::MapStore;
use crate::dataplane::writer::UnclaimedVip;
use crate::dataplane::{DataplaneError, Maps, Probe, Upsert, Writer, XdpMode};
use crate::desired::{Conflict, DesiredStore, DesiredVip, Owner, SourceKind, TrafficPolicy};
use crate::healthcheck::{HealthChecker, HealthEvent, HealthState, ProbeTarget};
use crate::model::{BackendTarget, Mac, Mode, NodeSettings, RateLimit, Vip, VipKey};
use status::{
    BackendStatus, Capacities, DataplaneStatus, InterfaceInfo, ProbeStatus, Publisher,
    SourceStatus, VipStatus,
};

/// A probe is one (VIP, backend) pair: a backend shared by VIPs on
/// different ports is probed on each.
pub type ProbeKey = (VipKey, BackendTarget);

/// How long to wait before applying again what could not be applied.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// How long a DSR backend's MAC may take to resolve.
const RESOLVE_WAIT: Duration = Duration::from_secs(1);
/// How often to look whether an asked-for grace period has ended (one
/// takes 10 to 20 ms here).
const GRACE_POLL: Duration = Duration::from_millis(5);

/// The node's own settings, from the node part of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeConf {
    /// Attached interfaces, by name (their MACs are DSR's source MACs).
    pub interfaces: Vec<String>,
    pub syn_rate_limit: Option<RateLimit>,
    pub tunnel_src4: Option<std::net::Ipv4Addr>,
    pub tunnel_src6: Option<std::net::Ipv6Addr>,
    /// Full NAT's sources, ports and timeouts.
    pub fullnat: crate::model::FullNatSettings,
}

/// What a source's update came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// VIPs of this update not in the maps as wanted, with the reason
    /// (conflicts included); empty when everything was applied.
    pub failed: Vec<(VipKey, String)>,
}

impl Applied {
    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }

    /// One line for a log or an API answer.
    pub fn summary(&self) -> String {
        let detail: Vec<String> = self
            .failed
            .iter()
            .map(|(k, e)| format!("{k}: {e}"))
            .collect();
        format!(
            "{} VIP(s) could not be applied: {}",
            self.failed.len(),
            detail.join("; ")
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("no VIP {vip}")]
    UnknownVip { vip: VipKey },
    #[error("no backend {target}")]
    UnknownBackend { target: SocketAddr },
    #[error("{target} is not a backend of {vip}")]
    BackendNotInVip { target: SocketAddr, vip: VipKey },
    #[error("saving the drain: {0}")]
    State(#[from] StateError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("{vip} could not be applied with the drain: {reason}")]
    NotApplied { vip: VipKey, reason: String },
}

/// The VIPs a drain named, and whether it changed anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainDone {
    pub vips: Vec<VipKey>,
    pub changed: bool,
}

pub enum Command {
    /// Everything `owner` wants now (an empty set: nothing any more).
    /// `ack` answers once it has been applied.
    SetDesired {
        owner: Owner,
        vips: Vec<DesiredVip>,
        ack: Option<oneshot::Sender<Applied>>,
    },
    /// The source's objects are exactly these: any other it owned is gone.
    Synced(SourceKind),
    /// A source could not produce its desired state (invalid input):
    /// counted and shown; nothing changes.
    SourceFailed {
        source: SourceKind,
        error: String,
    },
    SetNode(NodeConf),
    Health(HealthEvent<ProbeKey>),
    /// The next hop of every backend address (`crate::nexthop`): an
    /// address it does not list has none (the datapath asks the FIB).
    NextHops(std::collections::HashMap<IpAddr, crate::dataplane::render::NextHop>),
    Drain {
        target: SocketAddr,
        vip: Option<VipKey>,
        drain: bool,
        reply: oneshot::Sender<Result<DrainDone, DrainError>>,
    },
    Shutdown,
}

pub type Sender = mpsc::Sender<Command>;

/// The host's facts the reconciler needs. The kernel's in rivorad; a
/// fixed table in tests.
pub trait NodeFacts: Send {
    fn interface(&self, name: &str) -> Result<(u32, Mac), NetError>;
    fn resolve_mac(&self, addr: IpAddr, wait: Duration) -> Result<Mac, NetError>;
    /// The source the node's route to `addr` prefers: full NAT's source
    /// towards a backend when the node configures none.
    fn route_source(&self, addr: IpAddr) -> Result<IpAddr, NetError>;
    /// Host settings L3 DSR and full NAT rely on, for these interfaces.
    fn prepare_local_source(&self, interfaces: &[String]);
    /// The addresses the node holds on any interface: a Service or
    /// Gateway may not take one for a VIP.
    fn addresses(&self) -> BTreeSet<IpAddr>;
}

/// The running kernel's interfaces and neighbour tables.
pub struct KernelFacts;

impl NodeFacts for KernelFacts {
    fn interface(&self, name: &str) -> Result<(u32, Mac), NetError> {
        net::interface(name)
    }

    fn resolve_mac(&self, addr: IpAddr, wait: Duration) -> Result<Mac, NetError> {
        net::resolve_mac(addr, wait)
    }

    fn route_source(&self, addr: IpAddr) -> Result<IpAddr, NetError> {
        net::route_source(addr)
    }

    fn addresses(&self) -> BTreeSet<IpAddr> {
        match nix::ifaddrs::getifaddrs() {
            Ok(list) => list
                .filter_map(|i| i.address)
                .filter_map(|a| {
                    a.as_sockaddr_in()
                        .map(|v| IpAddr::V4(v.ip()))
                        .or_else(|| a.as_sockaddr_in6().map(|v| IpAddr::V6(v.ip())))
                })
                .collect(),
            Err(e) => {
                warn!(error = %e, "listing the node's addresses");
                BTreeSet::new()
            }
        }
    }

    fn prepare_local_source(&self, interfaces: &[String]) {
        // A tunnelled or full-NAT packet the FIB cannot send yet (no
        // neighbour entry, an egress rivorad is not attached to) goes to
        // the kernel with our own address as source: accept_local keeps
        // it from being dropped as martian.
        for name in interfaces {
            if let Err(e) = net::sysctl(&["net", "ipv4", "conf", name, "accept_local"], "1") {
                warn!(interface = %name, error = %e, "cannot set accept_local for L3 DSR and full NAT");
            }
        }
    }
}

/// What the writer was last given for a VIP. Kept small: at full scale
/// there are 4,096 of these.
#[derive(Debug, Clone)]
struct Written {
    owner: Owner,
    /// As the source wanted it (shared with the store).
    desired: Arc<DesiredVip>,
    /// With operator drains applied, when they change it: what decides
    /// whether the VIP must be written again. None: `desired.vip` as is.
    drained: Option<Vip>,
}

impl Written {
    /// The VIP as written, less the MACs resolved for it.
    fn effective(&self) -> &Vip {
        self.drained.as_ref().unwrap_or(&self.desired.vip)
    }
}

pub struct Reconciler<S: MapStore = Maps, F: NodeFacts = KernelFacts> {
    writer: Writer<S>,
    facts: F,
    store: DesiredStore,
    node: NodeConf,
    checker: HealthChecker<ProbeKey>,
    drains: Drains,
    drain_store: DrainStore,
    /// Probes that currently say down, by backend.
    probe_down: BTreeMap<BackendTarget, BTreeSet<VipKey>>,
    written: BTreeMap<VipKey, Written>,
    failed: BTreeMap<VipKey, String>,
    conflicts: Vec<Conflict>,
    sources: BTreeMap<SourceKind, SourceStatus>,
    interfaces: Vec<status::InterfaceInfo>,
    capacities: Capacities,
    publisher: Publisher,
    applies: u64,
    /// Desired state or node settings changed since the last apply.
    dirty: bool,
    node_dirty: bool,
    /// L3 DSR's outer sources when the node configures none (Kubernetes'
    /// DSR across nodes): the route's source towards the first backend of
    /// the family that needed one.
    tunnel_auto: (Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>),
    retry_at: Option<Instant>,
    /// Waits for grace periods beside the reconciler (in `run` only).
    grace: Option<grace::GraceWaiter>,
    /// The latest grace ticket asked for and not yet reclaimed.
    grace_outstanding: Option<u64>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Replies waiting for the next apply.
enum Waiting {
    Ack(Owner, oneshot::Sender<Applied>),
    /// Answered after the publish that follows, so that a reader asking
    /// next sees the drain (`vip`: the one VIP whose apply it waits for).
    Drain {
        vip: Option<VipKey>,
        done: DrainDone,
        reply: DrainReply,
    },
}

type DrainReply = oneshot::Sender<Result<DrainDone, DrainError>>;

#[derive(Default)]
struct Replies {
    acks: Vec<(oneshot::Sender<Applied>, Applied)>,
    drains: Vec<(DrainReply, Result<DrainDone, DrainError>)>,
}

impl Replies {
    fn deliver(self) {
        // A requester that went away no longer needs its answer.
        for (tx, v) in self.acks {
            let _ = tx.send(v);
        }
        for (tx, v) in self.drains {
            let _ = tx.send(v);
        }
    }
}

impl<S: MapStore, F: NodeFacts> Reconciler<S, F> {
    /// A reconciler over a writer that has adopted the maps, with the
    /// operator's drains (already reconciled with the maps by the caller).
    pub fn new(
        writer: Writer<S>,
        facts: F,
        checker: HealthChecker<ProbeKey>,
        drains: Drains,
        drain_store: DrainStore,
        publisher: Publisher,
    ) -> Self {
        Self {
            writer,
            facts,
            store: DesiredStore::new(),
            node: NodeConf::default(),
            checker,
            drains,
            drain_store,
            probe_down: BTreeMap::new(),
            written: BTreeMap::new(),
            failed: BTreeMap::new(),
            conflicts: Vec::new(),
            sources: BTreeMap::new(),
            interfaces: Vec::new(),
            capacities: Capacities::default(),
            publisher,
            applies: 0,
            dirty: false,
            node_dirty: true,
            tunnel_auto: (None, None),
            retry_at: None,
            grace: None,
            grace_outstanding: None,
        }
    }

    /// A source that will report: nothing unclaimed is pruned until it
    /// has synced.
    pub fn register(&mut self, source: SourceKind) {
        self.store.register(source);
        self.sources.entry(source).or_default();
    }

    pub fn set_attached(&mut self, interfaces: Vec<InterfaceInfo>, capacities: Capacities) {
        let generic = |l: &[InterfaceInfo]| -> BTreeSet<u32> {
            l.iter()
                .filter(|i| i.xdp_mode == Some(XdpMode::Generic))
                .map(|i| i.ifindex)
                .collect()
        };
        let regeneric = generic(&self.interfaces) != generic(&interfaces);
        self.interfaces = interfaces;
        self.capacities = capacities;
        // The node settings say which interfaces run generic XDP, never a
        // redirect target (iface_mac_map's flag): the daemon's first apply
        // wrote them before it attached, with no interface known.
        if regeneric {
            if let Err(e) = self
                .node_settings()
                .map_err(|e| e.to_string())
                .and_then(|n| self.writer.set_node(&n).map_err(|e| e.to_string()))
            {
                error!(error = %e, "node settings not applied");
                self.node_dirty = true;
                self.dirty = true;
            }
        }
        self.publish();
    }

    pub fn writer(&self) -> &Writer<S> {
        &self.writer
    }

    /// Handle one command now (replies that need an apply wait in
    /// `waiting`). False on shutdown.
    fn handle(&mut self, cmd: Command, waiting: &mut Vec<Waiting>) -> bool {
        match cmd {
            Command::SetDesired { owner, vips, ack } => {
                let _s = info_span!("set", owner = %owner).entered();
                self.sources.entry(owner.source).or_default();
                self.store.set(owner.clone(), vips);
                self.dirty = true;
                if let Some(ack) = ack {
                    waiting.push(Waiting::Ack(owner, ack));
                }
            }
            Command::Synced(source) => {
                self.store.mark_synced(source);
                self.sources.entry(source).or_default().synced = true;
                self.dirty = true;
            }
            Command::SourceFailed { source, error } => {
                let s = self.sources.entry(source).or_default();
                s.updates_failed += 1;
                s.last_at = now_secs();
                s.last_error = Some(error);
            }
            Command::SetNode(node) => {
                if node != self.node {
                    self.node = node;
                    self.node_dirty = true;
                    self.dirty = true;
                }
            }
            Command::Health(ev) => {
                let up = ev.state == HealthState::Healthy;
                info!(vip = %ev.key.0, backend = %ev.key.1, up, "health changed");
                if let Err(e) = self.set_probe(&ev.key, up) {
                    error!(error = %e, "applying a health change");
                }
            }
            Command::NextHops(hops) => match self.writer.set_next_hops(hops) {
                Ok(0) => {}
                Ok(n) => debug!(backends = n, "next hops rewritten"),
                Err(e) => error!(error = %e, "writing next hops"),
            },
            Command::Drain {
                target,
                vip,
                drain,
                reply,
            } => match self.drain(target, vip, drain) {
                Ok((done, vip)) => waiting.push(Waiting::Drain { vip, done, reply }),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::Shutdown => return false,
        }
        true
    }

    /// Serve commands until `Shutdown` (or every sender is gone). Runs on
    /// a thread of its own: every map write happens here. Grace periods
    /// are waited for on another thread (`grace`), so an apply ends with
    /// its map writes.
    pub fn run(mut self, rx: mpsc::Receiver<Command>) {
        self.serve(&rx);
        // Leave nothing retired behind in the pinned maps.
        self.grace = None;
        self.grace_outstanding = None;
        if let Err(e) = self.writer.reclaim() {
            error!(error = %e, "reclaiming retired map entries at shutdown");
        }
    }

    fn serve(&mut self, rx: &mpsc::Receiver<Command>) {
        match grace::GraceWaiter::spawn(S::grace_period) {
            Ok(g) => self.grace = Some(g),
            Err(e) => {
                warn!(error = %e, "no grace-period thread: every apply waits for its own");
            }
        }
        let mut waiting = Vec::new();
        loop {
            let deadline = [
                self.retry_at,
                self.grace_outstanding.map(|_| Instant::now() + GRACE_POLL),
            ]
            .into_iter()
            .flatten()
            .min();
            let first = match deadline {
                Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(c) => Some(c),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
                None => match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                },
            };
            let mut go_on = true;
            let mut handled = false;
            if let Some(c) = first {
                handled = true;
                go_on = self.handle(c, &mut waiting);
            }
            // What queued meanwhile is applied together: a burst of
            // updates costs one apply.
            while go_on {
                match rx.try_recv() {
                    Ok(c) => {
                        handled = true;
                        go_on = self.handle(c, &mut waiting);
                    }
                    Err(_) => break,
                }
            }
            self.reclaim_after_grace();
            if self.retry_at.is_some_and(|at| at <= Instant::now()) {
                self.dirty = true;
            }
            let applied = self.dirty;
            if applied {
                self.apply();
            }
            // A wake-up only to look at the grace period changes nothing
            // readers see: no publish (speakers react to every one).
            if handled || applied {
                let replies = self.answer(&mut waiting);
                self.publish();
                replies.deliver();
            }
            if !go_on {
                break;
            }
        }
    }

    /// End an apply's writes: have what it retired reclaimed after a
    /// grace period, waited for beside the reconciler when it can be.
    fn close_batch(&mut self) {
        if let Some(g) = &self.grace {
            if !g.failed() {
                let (ticket, failed) = self.writer.finish_deferred();
                for e in failed {
                    error!(error = %e, "resizing a Maglev slice to the plan (retried on the next apply)");
                }
                match ticket {
                    None => return,
                    Some(t) if g.request(t) => {
                        self.grace_outstanding = Some(t);
                        return;
                    }
                    // The thread is gone: wait here.
                    Some(_) => {}
                }
            }
        }
        if let Err(e) = self.writer.finish() {
            error!(error = %e, "resizing Maglev slices or reclaiming retired map entries");
        }
        self.grace_outstanding = None;
    }

    /// Clear what ended grace periods cover.
    fn reclaim_after_grace(&mut self) {
        let (Some(g), Some(want)) = (&self.grace, self.grace_outstanding) else {
            return;
        };
        if g.failed() {
            if let Err(e) = self.writer.reclaim() {
                error!(error = %e, "reclaiming retired map entries");
            }
            self.grace_outstanding = None;
            return;
        }
        let Some(covered) = g.covered() else { return };
        if let Err(e) = self.writer.reclaim_covered(covered) {
            error!(error = %e, "reclaiming retired map entries");
        }
        if covered >= want {
            self.grace_outstanding = None;
        }
    }

    /// Take commands outside `run` (start-up, tests): handle them all,
    /// apply once, answer.
    pub fn submit_all(&mut self, cmds: impl IntoIterator<Item = Command>) {
        let mut waiting = Vec::new();
        for c in cmds {
            self.handle(c, &mut waiting);
        }
        if self.dirty {
            self.apply();
        }
        let replies = self.answer(&mut waiting);
        self.publish();
        replies.deliver();
    }

    pub fn submit(&mut self, cmd: Command) {
        self.submit_all([cmd]);
    }

    /// What the waiting replies get, with the sources' counters updated.
    /// Delivered after the status is published, so an answer is never
    /// ahead of what readers see.
    fn answer(&mut self, waiting: &mut Vec<Waiting>) -> Replies {
        let mut replies = Replies::default();
        let merged = self.store.merged();
        for w in waiting.drain(..) {
            match w {
                Waiting::Ack(owner, ack) => {
                    // This owner's VIPs that did not make it, and its
                    // claims another owner holds.
                    let mut failed: Vec<(VipKey, String)> = self
                        .failed
                        .iter()
                        .filter(|(k, _)| merged.vips.get(k).is_some_and(|(o, _)| *o == owner))
                        .map(|(k, e)| (*k, e.clone()))
                        .collect();
                    failed.extend(
                        self.conflicts
                            .iter()
                            .filter(|c| c.refused == owner)
                            .map(|c| (c.vip, c.to_string())),
                    );
                    let s = self.sources.entry(owner.source).or_default();
                    s.last_at = now_secs();
                    if failed.is_empty() {
                        s.updates_ok += 1;
                        s.last_error = None;
                    } else {
                        s.updates_failed += 1;
                        s.last_error = Some(
                            Applied {
                                failed: failed.clone(),
                            }
                            .summary(),
                        );
                    }
                    replies.acks.push((ack, Applied { failed }));
                }
                Waiting::Drain { vip, done, reply } => {
                    let r = match vip.and_then(|v| Some((v, self.failed.get(&v)?))) {
                        Some((vip, reason)) => Err(DrainError::NotApplied {
                            vip,
                            reason: reason.clone(),
                        }),
                        None => Ok(done),
                    };
                    replies.drains.push((reply, r));
                }
            }
        }
        replies
    }

    /// Node settings with this node's facts filled in.
    fn node_settings(&self) -> Result<NodeSettings, NetError> {
        let mut n = NodeSettings {
            syn_rate_limit: self.node.syn_rate_limit,
            tunnel_src4: self.node.tunnel_src4.or(self.tunnel_auto.0),
            tunnel_src6: self.node.tunnel_src6.or(self.tunnel_auto.1),
            interface_macs: BTreeMap::new(),
            generic_xdp: BTreeSet::new(),
            fullnat: self.node.fullnat,
        };
        for name in &self.node.interfaces {
            let (ifindex, mac) = self.facts.interface(name)?;
            n.interface_macs.insert(ifindex, mac);
        }
        for i in &self.interfaces {
            if i.xdp_mode == Some(XdpMode::Generic) && n.interface_macs.contains_key(&i.ifindex) {
                n.generic_xdp.insert(i.ifindex);
            }
        }
        Ok(n)
    }

    fn has_tunnel_source(&self, v6: bool) -> bool {
        if v6 {
            self.node.tunnel_src6.or(self.tunnel_auto.1).is_some()
        } else {
            self.node.tunnel_src4.or(self.tunnel_auto.0).is_some()
        }
    }

    /// Take the route's source towards `backend` as L3 DSR's outer source
    /// for its family (the node configures none) and write it.
    fn auto_tunnel_source(&mut self, backend: IpAddr) -> Result<(), String> {
        let src = self
            .facts
            .route_source(backend)
            .map_err(|e| format!("no L3 DSR tunnel source (node.tunnelSource unset): {e}"))?;
        match src {
            IpAddr::V4(a) if backend.is_ipv4() => self.tunnel_auto.0 = Some(a),
            IpAddr::V6(a) if backend.is_ipv6() => self.tunnel_auto.1 = Some(a),
            other => {
                return Err(format!(
                    "no L3 DSR tunnel source: the route to {backend} prefers {other}, of the other family"
                ))
            }
        }
        info!(source = %src, towards = %backend, "L3 DSR tunnel source from the route (node.tunnelSource unset)");
        let n = self.node_settings().map_err(|e| e.to_string())?;
        self.writer.set_node(&n).map_err(|e| e.to_string())
    }

    /// The VIP as the writer should hold it, before MACs, when operator
    /// drains for this VIP change it: a weight of 0 (no new flows for
    /// that VIP; established ones continue through the affinity table).
    fn drained(&self, d: &DesiredVip) -> Option<Vip> {
        let key = d.vip.key();
        let hit = |b: &crate::model::Backend| self.drains.contains(&(Some(key), b.target()));
        if !d.vip.backends.iter().any(|b| hit(b) && b.weight != 0) {
            return None;
        }
        let mut v = d.vip.clone();
        for b in &mut v.backends {
            if hit(b) {
                b.weight = 0;
            }
        }
        Some(v)
    }

    /// Make the maps hold the merged desired state, touching only the
    /// VIPs that changed.
    fn apply(&mut self) {
        self.dirty = false;
        self.retry_at = None;
        self.publisher.set_applying(true);
        let t0 = Instant::now();
        let merged = self.store.merged();
        for c in &merged.conflicts {
            if !self.conflicts.contains(c) {
                error!(vip = %c.vip, owner = %c.owner, refused = %c.refused, "{c}");
            }
        }
        self.conflicts = merged.conflicts.clone();
        let mut failed: BTreeMap<VipKey, String> = BTreeMap::new();

        if self.node_dirty {
            match self
                .node_settings()
                .map_err(|e| e.to_string())
                .and_then(|n| self.writer.set_node(&n).map_err(|e| e.to_string()))
            {
                Ok(()) => self.node_dirty = false,
                Err(e) => {
                    // Every VIP waits for the node (DSR needs its MACs).
                    error!(error = %e, "node settings not applied");
                    for k in merged.vips.keys() {
                        failed.insert(*k, format!("node settings: {e}"));
                    }
                    self.finish_apply(failed, t0, 0, 0, 0);
                    return;
                }
            }
        }

        // What is claimed but may not be served: what its source refuses
        // (an address no pool admits), and the node's own addresses,
        // which a Service or Gateway may not capture (its API server's
        // 6443, the kubelet's 10250 would be forwarded to someone's
        // pods). The file is the operator's word.
        let node_addrs = if merged
            .vips
            .values()
            .any(|(o, _)| o.source != SourceKind::File)
        {
            self.facts.addresses()
        } else {
            BTreeSet::new()
        };
        let refused: BTreeMap<VipKey, String> = merged
            .vips
            .iter()
            .filter_map(|(key, (owner, d))| {
                let why = match &d.refused {
                    Some(why) => why.clone(),
                    None if owner.source != SourceKind::File
                        && node_addrs.contains(&d.vip.addr) =>
                    {
                        format!(
                            "{} is an address of this node: {} {} may not take it for a VIP",
                            d.vip.addr,
                            match owner.source {
                                SourceKind::Gateway => "gateway",
                                _ => "service",
                            },
                            owner.object
                        )
                    }
                    None => return None,
                };
                Some((*key, why))
            })
            .collect();

        // Slices are planned for the whole set before anything is
        // written (sizes follow the set, not the order of the writes).
        let planned: Vec<Vip> = merged
            .vips
            .iter()
            .filter(|(k, _)| !refused.contains_key(k))
            .map(|(_, (_, d))| self.drained(d).unwrap_or_else(|| d.vip.clone()))
            .collect();
        self.writer.begin(&planned);

        // Removals first: they free ids and slots for what comes next. A
        // VIP written before its refusal (its pool deleted) goes too.
        let gone: Vec<VipKey> = self
            .written
            .keys()
            .filter(|k| !merged.vips.contains_key(k) || refused.contains_key(k))
            .copied()
            .collect();
        let mut removed = 0;
        for k in gone {
            match self.writer.remove_vip(&k) {
                Ok(_) => {
                    self.written.remove(&k);
                    removed += 1;
                }
                Err(e) => {
                    failed.insert(k, format!("not removed: {e}"));
                }
            }
        }

        let (mut created, mut updated) = (0, 0);
        let mut resolved: BTreeMap<IpAddr, Result<Mac, String>> = BTreeMap::new();
        let mut sources: BTreeMap<IpAddr, Result<IpAddr, String>> = BTreeMap::new();
        let mut local_source = false;
        for (key, (owner, d)) in &merged.vips {
            if let Some(why) = refused.get(key) {
                failed.insert(*key, why.clone());
                continue;
            }
            local_source |= d.vip.mode == Mode::L3Dsr
                || d.vip.mode == Mode::FullNat
                || d.vip
                    .backends
                    .iter()
                    .any(|b| matches!(b.mode, Some(Mode::L3Dsr) | Some(Mode::FullNat)));
            let drained = self.drained(d);
            let effective = drained.as_ref().unwrap_or(&d.vip);
            if let Some(w) = self.written.get_mut(key) {
                if w.effective() == effective {
                    // Unchanged for the maps; the owner, name or probes
                    // may still have changed.
                    w.owner = owner.clone();
                    w.desired = Arc::clone(d);
                    w.drained = drained;
                    continue;
                }
            }
            let _s = info_span!("vip", vip = %key, owner = %owner).entered();
            let mut vip = effective.clone();
            let mut unresolved = None;
            let vip_mode = vip.mode;
            for b in &mut vip.backends {
                match b.mode_in(vip_mode) {
                    Mode::Dsr if b.mac.is_none() => {
                        let r = resolved.entry(b.addr).or_insert_with(|| {
                            self.facts
                                .resolve_mac(b.addr, RESOLVE_WAIT)
                                .map_err(|e| e.to_string())
                        });
                        match r {
                            Ok(mac) => b.mac = Some(*mac),
                            Err(e) => {
                                unresolved = Some(e.clone());
                                break;
                            }
                        }
                    }
                    // L3 DSR's outer source, when the node configures
                    // none for the family: the route's towards the first
                    // backend that needs one.
                    Mode::L3Dsr if !self.has_tunnel_source(b.addr.is_ipv6()) => {
                        if let Err(e) = self.auto_tunnel_source(b.addr) {
                            unresolved = Some(e);
                            break;
                        }
                    }
                    // Full NAT's source towards the backend, when the
                    // node configures none for its family: the route's.
                    Mode::FullNat if self.node.fullnat.src_for(b.addr.is_ipv6()).is_none() => {
                        let r = sources.entry(b.addr).or_insert_with(|| {
                            self.facts
                                .route_source(b.addr)
                                .map_err(|e| format!("no full-NAT source address: {e}"))
                        });
                        let set = match r {
                            Ok(src) => self
                                .writer
                                .set_fullnat_source(b.addr, *src)
                                .map_err(|e| e.to_string()),
                            Err(e) => Err(e.clone()),
                        };
                        if let Err(e) = set {
                            unresolved = Some(e);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            if let Some(e) = unresolved {
                failed.insert(*key, e);
                continue;
            }
            match self.writer.upsert_vip(&vip) {
                Ok(u) => {
                    match u {
                        Upsert::Created => created += 1,
                        Upsert::Updated => updated += 1,
                        Upsert::Unchanged => {}
                    }
                    self.written.insert(
                        *key,
                        Written {
                            owner: owner.clone(),
                            desired: Arc::clone(d),
                            drained,
                        },
                    );
                }
                Err(e) => {
                    error!(error = %e, "VIP not applied; its previous state (if any) keeps forwarding");
                    failed.insert(*key, e.to_string());
                }
            }
        }
        if local_source {
            self.facts.prepare_local_source(&self.node.interfaces);
        }
        self.close_batch();
        if self.store.all_synced() {
            match self.writer.prune_unclaimed() {
                Ok(pruned) if !pruned.is_empty() => info!(
                    count = pruned.len(),
                    "pruned adopted VIPs no source claims (every source has synced)"
                ),
                Ok(_) => {}
                Err(e) => error!(error = %e, "pruning unclaimed VIPs"),
            }
        }
        // Operator drains for every VIP again: a backend id created just
        // now for a drained target starts healthy.
        let global: Vec<BackendTarget> = self
            .drains
            .iter()
            .filter(|(v, _)| v.is_none())
            .map(|(_, t)| *t)
            .collect();
        for t in global {
            if let Err(e) = self.writer.set_drain(&t, true) {
                error!(backend = %t, error = %e, "re-applying a drain");
            }
        }
        self.update_probes();
        self.finish_apply(failed, t0, created, updated, removed);
    }

    fn finish_apply(
        &mut self,
        failed: BTreeMap<VipKey, String>,
        t0: Instant,
        created: usize,
        updated: usize,
        removed: usize,
    ) {
        if !failed.is_empty() {
            self.retry_at = Some(Instant::now() + RETRY_AFTER);
        }
        self.failed = failed;
        self.applies += 1;
        self.publisher.set_applying(false);
        info!(
            created,
            updated,
            removed,
            failed = self.failed.len(),
            conflicts = self.conflicts.len(),
            apply_ms = t0.elapsed().as_millis() as u64,
            "applied"
        );
    }

    /// Probe what the written VIPs ask for, and settle what probes that
    /// came or went mean for each backend.
    fn update_probes(&mut self) {
        let mut targets = Vec::new();
        for (key, w) in &self.written {
            for (b, spec) in w.desired.vip.backends.iter().zip(&w.desired.health) {
                let Some(spec) = spec else { continue };
                let target = b.target();
                // A backend the pinned maps say is down stays down until
                // a probe says otherwise (restarts must not resurrect it).
                let initial = match self.writer.health(&target) {
                    Some(Health::Down) => HealthState::Down,
                    _ => HealthState::Healthy,
                };
                targets.push(ProbeTarget {
                    key: (*key, target),
                    addr: SocketAddr::new(b.addr, b.service_port(&key.ports)),
                    spec: (**spec).clone(),
                    initial,
                });
            }
        }
        if let Err(e) = self.checker.set_targets(targets) {
            error!(error = %e, "health checker targets");
        }
        // A probe that starts down (adopted as down from the maps) sends
        // no event until it changes: record it, or another VIP's probe of
        // the same backend coming up would mark it healthy too early.
        let statuses = self.checker.status();
        for st in &statuses {
            if st.state == HealthState::Down {
                self.probe_down
                    .entry(st.key.1)
                    .or_default()
                    .insert(st.key.0);
            }
        }
        // A backend the maps hold as down that no probe watches any more
        // would stay down for ever: without a probe a backend is healthy.
        // Only a backend some source has named counts: one known only
        // from the adopted maps may belong to a VIP whose source has not
        // spoken yet, and its probe will come with it.
        let probed: BTreeSet<BackendTarget> = statuses.iter().map(|s| s.key.1).collect();
        let named: BTreeSet<BackendTarget> = self
            .written
            .values()
            .flat_map(|w| w.desired.vip.backends.iter().map(|b| b.target()))
            .collect();
        for t in self.writer.down_targets() {
            if named.contains(&t) && !probed.contains(&t) && !self.probe_down.contains_key(&t) {
                info!(backend = %t, "no probe watches this backend any more: healthy");
                if let Err(e) = self.writer.set_health(&t, Probe::Up) {
                    error!(backend = %t, error = %e, "marking healthy");
                }
            }
        }
        // Probes that no longer exist no longer hold a backend down.
        let live: BTreeSet<ProbeKey> = statuses.into_iter().map(|s| s.key).collect();
        let stale: Vec<ProbeKey> = self
            .probe_down
            .iter()
            .flat_map(|(t, vips)| vips.iter().map(move |v| (*v, *t)))
            .filter(|k| !live.contains(k))
            .collect();
        for k in stale {
            if let Err(e) = self.set_probe(&k, true) {
                error!(error = %e, "releasing a stale probe");
            }
        }
    }

    /// A probe's verdict. A backend is down while any of its probes says
    /// so; a failed probe wins over a drain (the writer's rule).
    fn set_probe(&mut self, key: &ProbeKey, up: bool) -> Result<(), DataplaneError> {
        let (vip, target) = key;
        let downs = self.probe_down.entry(*target).or_default();
        if up {
            downs.remove(vip);
        } else {
            downs.insert(*vip);
        }
        let down = !downs.is_empty();
        if !down {
            self.probe_down.remove(target);
        }
        self.writer
            .set_health(target, if down { Probe::Down } else { Probe::Up })?;
        Ok(())
    }

    /// The (VIP, backend) pairs an API target names: `target`'s port may
    /// be the VIP's own for a backend configured without one.
    fn resolve_target(&self, target: SocketAddr, vip: Option<&VipKey>) -> Vec<ProbeKey> {
        let mut out = Vec::new();
        for (key, w) in &self.written {
            if vip.is_some_and(|k| k != key) {
                continue;
            }
            for b in &w.desired.vip.backends {
                if b.addr == target.ip() && b.service_port(&key.ports) == target.port() {
                    out.push((*key, b.target()));
                }
            }
        }
        out
    }

    /// Drain (or undrain) a backend everywhere, or for one VIP. A drain
    /// for one VIP changes that VIP alone: the caller waits for the apply
    /// when the second value names it.
    fn drain(
        &mut self,
        target: SocketAddr,
        vip: Option<VipKey>,
        drain: bool,
    ) -> Result<(DrainDone, Option<VipKey>), DrainError> {
        if let Some(k) = &vip {
            if !self.written.contains_key(k) {
                return Err(DrainError::UnknownVip { vip: *k });
            }
        }
        let matches = self.resolve_target(target, vip.as_ref());
        if matches.is_empty() {
            return Err(match (vip, self.resolve_target(target, None).is_empty()) {
                (Some(vip), false) => DrainError::BackendNotInVip { target, vip },
                _ => DrainError::UnknownBackend { target },
            });
        }
        let bt = matches[0].1;
        let k = (vip, bt);
        let changed = if drain {
            self.drains.insert(k)
        } else {
            self.drains.remove(&k)
        };
        let done = DrainDone {
            vips: matches.iter().map(|(v, _)| *v).collect(),
            changed,
        };
        if !changed {
            return Ok((done, None));
        }
        // The file first: if the maps then fail, the next apply or start
        // does what the operator asked for.
        if let Err(e) = self.drain_store.save(&self.drains) {
            if drain {
                self.drains.remove(&k);
            } else {
                self.drains.insert(k);
            }
            return Err(e.into());
        }
        match vip {
            None => {
                self.writer.set_drain(&bt, drain)?;
                Ok((done, None))
            }
            Some(v) => {
                self.dirty = true;
                Ok((done, Some(v)))
            }
        }
    }

    fn publish(&mut self) {
        for (source, synced) in self.store.sources() {
            self.sources.entry(source).or_default().synced = synced;
        }
        for (source, s) in self.sources.iter_mut() {
            s.objects = self.store.objects_of(*source).len();
        }
        let live = self.writer.vips();
        let mut unclaimed: BTreeMap<u32, _> = self
            .writer
            .unclaimed()
            .into_iter()
            .map(|u| (u.svc_id, u))
            .collect();
        let mut vips = Vec::with_capacity(live.len());
        for info in &live {
            let Some(key) = info.key else { continue };
            let Some(w) = self.written.get(&key) else {
                if let Some(u) = unclaimed.remove(&info.svc_id) {
                    vips.extend(self.unclaimed_status(u));
                }
                continue;
            };
            let vip = w.effective();
            let backends = vip
                .backends
                .iter()
                .zip(info.backend_ids.iter())
                .zip(w.desired.health.iter())
                .map(|((b, id), spec)| {
                    let t = b.target();
                    BackendStatus {
                        target: t,
                        mode: b.mode_in(vip.mode),
                        node: b.node.clone(),
                        service_port: b.service_port(&key.ports),
                        backend_id: *id,
                        weight: b.weight,
                        health: self.writer.health(&t).unwrap_or(Health::Healthy),
                        drained: self.drains.contains(&(None, t))
                            || self.drains.contains(&(Some(key), t)),
                        probe: match spec {
                            None => ProbeStatus::Disabled,
                            Some(_) => match self.checker.state(&(key, t)) {
                                Some(s) => ProbeStatus::Is(s),
                                None => ProbeStatus::Unknown,
                            },
                        },
                    }
                })
                .collect();
            vips.push(VipStatus {
                key,
                name: w.desired.name.clone(),
                owner: Some(w.owner.clone()),
                traffic_policy: w.desired.traffic_policy,
                svc_id: info.svc_id,
                slice: info.slice,
                mode: vip.mode,
                affinity: vip.affinity,
                source_ranges: vip.source_ranges.clone(),
                backends,
                slice_need: Some(info.need),
            });
        }
        self.publisher.publish(DataplaneStatus {
            applies: self.applies,
            unclaimed: live.iter().filter(|v| !v.claimed).count(),
            vips,
            failed: self.failed.clone(),
            conflicts: self.conflicts.clone(),
            sources: self.sources.clone(),
            interfaces: self.interfaces.clone(),
            capacities: self.capacities.clone(),
        });
        debug!(applies = self.applies, "status published");
    }

    /// An adopted VIP no source has claimed, as the maps hold it: mode,
    /// affinity and backends, with slots for weights. None when its mode
    /// is one this build does not know (it is still counted unclaimed).
    fn unclaimed_status(&self, u: UnclaimedVip) -> Option<VipStatus> {
        let key = u.key;
        let backends = u
            .backends
            .iter()
            .map(|(id, b, slots)| {
                let t = b.target();
                BackendStatus {
                    target: t,
                    mode: b.mode.or(u.mode).unwrap_or(Mode::Nat),
                    node: None,
                    service_port: if b.port != 0 {
                        b.port
                    } else {
                        key.ports.bounds().0
                    },
                    backend_id: *id,
                    weight: *slots,
                    health: self.writer.health(&t).unwrap_or(Health::Healthy),
                    drained: self.drains.contains(&(None, t))
                        || self.drains.contains(&(Some(key), t)),
                    probe: ProbeStatus::Disabled,
                }
            })
            .collect();
        Some(VipStatus {
            key,
            name: key.to_string(),
            owner: None,
            // Not known until a source claims it; the speakers skip
            // unclaimed VIPs anyway.
            traffic_policy: TrafficPolicy::Cluster,
            svc_id: u.svc_id,
            slice: u.slice,
            mode: u.mode?,
            affinity: u.affinity,
            source_ranges: None,
            backends,
            slice_need: None,
        })
    }
}

#[cfg(test)]
mod tests;
