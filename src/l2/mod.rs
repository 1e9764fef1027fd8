//! The L2 speaker, rivorad's side: it reads the reconciler's published
//! status (never its lock), the interfaces rivorad attached and, with
//! `-kubernetes`, the AddressPools, this node's labels and the speaker's
//! Leases; decides the groups this node stands for
//! ([`rivora_l2::plan`]); runs one election per group
//! ([`rivora_lease`], milliseconds precision, fed by one watch of the
//! Leases); and tells each interface's responder what to answer for and
//! until when.
//!
//! Ownership, per group:
//! - static path (`announce: l2`): always the owner, no Lease;
//! - Kubernetes: the holder of the group's Lease, while its fence holds.
//!   The responder checks that fence against the clock before every
//!   frame, so a node whose renewals stop is quiet by its renew deadline,
//!   before anyone else may take the Lease.
//!
//! Covering ([`plan::cover`]): the holder of a shared group's Lease
//! writes on it the addresses it leaves (those it does not serve, by its
//! own probes), and a node that serves one stands for that address's own
//! Lease. So the speaker also reads the other Leases of the feed: what
//! their holders wrote, and whether another node holds an address's
//! Lease now (judged as the election judges expiry, by this node's clock
//! from when it saw the version). It does not start any election before
//! the feed has listed the Leases once: until then it cannot know that
//! another node covers an address it would answer for.
//!
//! On winning a group (and for a VIP that joins an owned group) the
//! speaker announces every VIP at once: gratuitous ARP in both forms and
//! an unsolicited neighbour advertisement, on each of the group's
//! interfaces; again a second later, in case a frame was lost; then every
//! `gratuitousInterval`. Stopping (SIGTERM) releases every Lease it
//! holds, so the next owner takes over at once rather than at expiry.

pub mod kube;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::kube::core::SelectorExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rivora_l2::plan::{self, Group, Mode, PoolL2, PoolView, Seen, VipView};
use rivora_l2::responder::{Answers, Counters, Fence, Interface, Responder};
use rivora_lease::{Election, Leadership, LeaseFeed, LeaseSettings, Observed, Record};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::{Announce, L2Conf, DEFAULT_LEASE_NAMESPACE};
use crate::desired::TrafficPolicy;
use crate::reconciler::status::{DataplaneStatus, StatusReader};

/// The labels every speaker Lease carries; the Lease watch selects by
/// them.
pub const LEASE_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/managed-by", "rivorad"),
    ("rivora.io/component", "l2-speaker"),
];
/// After the first announcement of a win, one more this much later: a
/// lost frame would otherwise leave a client on the old owner until its
/// own neighbour probes time out.
const REPEAT_AFTER_WIN: Duration = Duration::from_secs(1);
/// How often the published state is refreshed without a change (the
/// Leases' holders, as the watch sees them).
const REFRESH: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    #[error("the L2 speaker cannot answer on {interface}: {source}")]
    Socket {
        interface: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the L2 speaker's Lease settings: {0}")]
    Lease(#[from] rivora_lease::ElectionError),
}

/// The speaker's metrics, registered into rivorad's one registry before
/// anything runs, so that every family shows from the first scrape.
#[derive(Clone, Default)]
pub struct SpeakerMetrics {
    owner: Family<Vec<(String, String)>, Gauge>,
    replies: Family<Vec<(String, String)>, Counter>,
    gratuitous: Counter,
}

fn family_label(f: &str) -> Vec<(String, String)> {
    vec![("family".to_string(), f.to_string())]
}

fn lease_label(name: &str) -> Vec<(String, String)> {
    vec![("lease".to_string(), name.to_string())]
}

impl SpeakerMetrics {
    pub fn register(&self, r: &mut Registry) {
        // Both series from the first scrape, at zero.
        for f in ["ipv4", "ipv6"] {
            drop(self.replies.get_or_create(&family_label(f)));
        }
        r.register(
            "rivora_l2_owner",
            "Whether this node owns an L2 group (1) or stands for it without owning it (0), by Lease (static: no Lease)",
            self.owner.clone(),
        );
        r.register(
            "rivora_l2_replies",
            "ARP replies (ipv4) and neighbour advertisements (ipv6) sent in answer to a question for a VIP",
            self.replies.clone(),
        );
        r.register(
            "rivora_l2_gratuitous",
            "Gratuitous ARP frames (both forms) and unsolicited neighbour advertisements sent",
            self.gratuitous.clone(),
        );
    }

    fn counters(&self) -> Counters {
        Counters {
            replies_v4: self.replies.get_or_create(&family_label("ipv4")).clone(),
            replies_v6: self.replies.get_or_create(&family_label("ipv6")).clone(),
            gratuitous: self.gratuitous.clone(),
        }
    }
}

/// One group as `rivoractl status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    /// The Lease's name, or `static`.
    pub name: String,
    pub lease: bool,
    /// This node answers for the group now.
    pub owner: bool,
    /// Unix seconds since `owner` last changed (or the group appeared).
    pub since: u64,
    /// The Lease's holder as last seen (None: nobody, or no Lease).
    pub holder: Option<String>,
    pub interfaces: Vec<String>,
    /// What the owner answers for (this node's served VIPs of the group).
    pub vips: Vec<IpAddr>,
}

/// The speaker's state, published after every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct L2State {
    /// `static` or `kubernetes`.
    pub mode: &'static str,
    /// This node's identity in the Leases.
    pub identity: Option<String>,
    pub groups: Vec<GroupState>,
    /// The last error of the speaker's own watches, if any.
    pub last_error: Option<String>,
}

/// The Kubernetes side of the speaker.
pub struct KubeSide {
    pub client: ::kube::Client,
    pub node_name: String,
}

pub struct SpeakerConfig {
    pub announce: Announce,
    pub l2: L2Conf,
    /// Interfaces rivorad attached to (name, ifindex, MAC).
    pub attached: Vec<Interface>,
    pub kube: Option<KubeSide>,
}

/// The running speaker.
pub struct Speaker {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    state: watch::Receiver<Arc<L2State>>,
}

impl Speaker {
    /// Start on the current runtime. None when this node has nothing to
    /// announce by L2 at all: the static path without `announce: l2`.
    pub fn start(
        cfg: SpeakerConfig,
        status: StatusReader,
        metrics: SpeakerMetrics,
    ) -> Result<Option<Self>, SpeakerError> {
        if cfg.kube.is_none() && cfg.announce != Announce::L2 {
            return Ok(None);
        }
        let wanted: Vec<String> = cfg.l2.interfaces.iter().map(|i| i.0.clone()).collect();
        let counters = metrics.counters();
        let mut responders = BTreeMap::new();
        for iface in cfg
            .attached
            .iter()
            .filter(|i| wanted.is_empty() || wanted.contains(&i.name))
        {
            let r = Responder::open(iface.clone(), counters.clone()).map_err(|source| {
                SpeakerError::Socket {
                    interface: iface.name.clone(),
                    source,
                }
            })?;
            tokio::spawn(r.clone().run());
            responders.insert(iface.name.clone(), r);
        }
        let (state_tx, state) = watch::channel(Arc::new(L2State::default()));
        let (events_tx, events) = mpsc::unbounded_channel();
        let (errors_tx, errors) = watch::channel(kube::WatchErrors::default());
        let mut watches = Vec::new();
        let kube = match cfg.kube {
            None => None,
            Some(k) => {
                let (pools, t1) = kube::pools(k.client.clone(), errors_tx.clone());
                let (labels, t2) = kube::node_labels(k.client.clone(), &k.node_name, errors_tx);
                watches.extend([t1, t2]);
                let namespace = cfg
                    .l2
                    .lease
                    .namespace
                    .clone()
                    .or_else(|| {
                        std::env::var("POD_NAMESPACE")
                            .ok()
                            .filter(|n| !n.is_empty())
                    })
                    .unwrap_or_else(|| DEFAULT_LEASE_NAMESPACE.to_string());
                let feed = LeaseFeed::start(k.client.clone(), &namespace, &lease_labels());
                Some(KubeCore {
                    identity: identity(&k.node_name),
                    client: k.client,
                    namespace,
                    pools,
                    labels,
                    lease_changes: feed.changes(),
                    feed,
                })
            }
        };
        let core = Core {
            mode_name: if kube.is_some() {
                "kubernetes"
            } else {
                "static"
            },
            announce: cfg.announce,
            l2: cfg.l2,
            status,
            responders,
            kube,
            errors,
            groups: BTreeMap::new(),
            generation: 0,
            observed: BTreeMap::new(),
            served_since: BTreeMap::new(),
            known_since: BTreeMap::new(),
            next_expiry: None,
            unreadable: BTreeMap::new(),
            events: events_tx,
            metrics,
            state: state_tx,
            stopping: Vec::new(),
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            core.run(events, stop_rx).await;
            for w in watches {
                w.abort();
            }
        });
        Ok(Some(Self {
            stop: Some(stop_tx),
            task,
            state,
        }))
    }

    pub fn state(&self) -> watch::Receiver<Arc<L2State>> {
        self.state.clone()
    }

    /// Stop answering and release every Lease held.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if tokio::time::timeout(Duration::from_secs(15), &mut self.task)
            .await
            .is_err()
        {
            warn!("the L2 speaker did not stop within 15s");
            self.task.abort();
        }
    }
}

/// This process's identity in the Leases: the node, and something of this
/// run, so that two rivorads wrongly started under one node name do not
/// both take one Lease for theirs (and a restarted rivorad waits out its
/// predecessor's Lease like any other node).
fn identity(node: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{node}_{:x}{:05x}", std::process::id(), nanos & 0xfffff)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

struct KubeCore {
    client: ::kube::Client,
    identity: String,
    namespace: String,
    pools: watch::Receiver<kube::Pools>,
    labels: watch::Receiver<kube::Labels>,
    /// The speaker's Leases, every node's: the elections read their own
    /// from it, the planner what the others' holders wrote.
    feed: LeaseFeed,
    lease_changes: watch::Receiver<u64>,
}

fn lease_labels() -> BTreeMap<String, String> {
    LEASE_LABELS
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// One group this node stands for.
struct Running {
    group: Group,
    generation: u64,
    fence: Fence,
    election: Option<(Election, Leadership, JoinHandle<()>)>,
    owner: bool,
    since: u64,
    /// When the next announcement is due (while owner).
    next_announce: Option<Instant>,
}

struct Core {
    mode_name: &'static str,
    announce: Announce,
    l2: L2Conf,
    status: StatusReader,
    responders: BTreeMap<String, Arc<Responder>>,
    kube: Option<KubeCore>,
    errors: watch::Receiver<kube::WatchErrors>,
    groups: BTreeMap<String, Running>,
    generation: u64,
    /// Every Lease of the feed as this node first saw its current version
    /// (the clock that judges another node's holding).
    observed: BTreeMap<String, Observed>,
    /// Since when each address has been served without a break, and
    /// known at all (claimed by a source).
    served_since: BTreeMap<IpAddr, Instant>,
    known_since: BTreeMap<IpAddr, Instant>,
    /// When another node's holding of a Lease expires next, by this
    /// node's clock (a covered address may be answered again then).
    next_expiry: Option<Instant>,
    /// The unreadable unclaimed lists already warned of, by Lease.
    unreadable: BTreeMap<String, String>,
    /// (group, generation, leads) from each election.
    events: mpsc::UnboundedSender<(String, u64, bool)>,
    metrics: SpeakerMetrics,
    state: watch::Sender<Arc<L2State>>,
    /// Elections being stopped (each releases its Lease).
    stopping: Vec<JoinHandle<()>>,
}

/// The VIP addresses of a status, as the planner reads them: one per
/// address (ports and protocols together), served if any of its VIPs is,
/// Local if any is. Unclaimed VIPs (adopted, no source has named them
/// yet) are left out: their traffic policy is not known.
pub fn vip_views(
    st: &DataplaneStatus,
    pool_of: impl Fn(IpAddr) -> Option<PoolView>,
) -> Vec<VipView> {
    let mut by_addr: BTreeMap<IpAddr, (bool, bool)> = BTreeMap::new();
    for v in st.vips.iter().filter(|v| v.owner.is_some()) {
        let e = by_addr.entry(v.key.addr).or_default();
        e.0 |= v.serving();
        e.1 |= v.traffic_policy == TrafficPolicy::Local;
    }
    by_addr
        .into_iter()
        .map(|(addr, (serving, local))| VipView {
            addr,
            serving,
            local,
            pool: pool_of(addr),
        })
        .collect()
}

impl Core {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<(String, u64, bool)>,
        mut stop: oneshot::Receiver<()>,
    ) {
        info!(mode = self.mode_name, interfaces = ?self.responders.keys().collect::<Vec<_>>(), "L2 speaker started");
        loop {
            self.replan().await;
            self.publish();
            let due = self
                .groups
                .values()
                .filter_map(|g| g.next_announce)
                .chain(self.next_expiry)
                .min()
                .unwrap_or_else(|| Instant::now() + REFRESH)
                .min(Instant::now() + REFRESH);
            let (pools, labels, leases) = match self.kube.as_mut() {
                Some(k) => (
                    Some(&mut k.pools),
                    Some(&mut k.labels),
                    Some(&mut k.lease_changes),
                ),
                None => (None, None, None),
            };
            tokio::select! {
                _ = &mut stop => break,
                alive = self.status.changed() => {
                    if !alive {
                        // The reconciler is gone: rivorad is stopping.
                        break;
                    }
                }
                ev = events.recv() => {
                    if let Some((name, generation, leads)) = ev {
                        self.leadership(&name, generation, leads);
                    }
                }
                _ = changed(pools) => {}
                _ = changed(labels) => {}
                // What another node's holder wrote, or whether it still
                // holds: this node's answers may depend on it.
                _ = changed(leases) => {}
                _ = tokio::time::sleep_until(due.into()) => self.announce_due(),
            }
        }
        self.shutdown().await;
    }

    /// The groups this node stands for now, from what it reads.
    fn plan(&mut self) -> plan::Plan {
        let st = self.status.current();
        let interfaces: Vec<String> = self.responders.keys().cloned().collect();
        let Some(k) = &self.kube else {
            let views = vip_views(&st, |_| None);
            return plan::plan(&Mode::Static, &interfaces, &views);
        };
        if !k.feed.state().0 {
            return plan::Plan::new();
        }
        let pools = k.pools.borrow().clone();
        let labels = k.labels.borrow().clone();
        let node_selected = self
            .l2
            .node_selector
            .iter()
            .all(|(key, v)| labels.get(key) == Some(v));
        let views = vip_views(&st, |addr| {
            pools.pool_of(addr).map(|p| PoolView {
                name: p.name.clone(),
                l2: p.l2.as_ref().map(|l2| PoolL2 {
                    selects_node: l2.node_selector.matches(&labels),
                    interfaces: l2.interfaces.clone(),
                }),
            })
        });
        let mode = Mode::Kubernetes {
            interface_groups: self.announce == Announce::L2,
            node_selected,
        };
        let now = Instant::now();
        self.track(&views, now);
        let base = plan::plan(&mode, &interfaces, &views);
        let seen = self.seen(&base, now);
        plan::cover(base, &seen, now)
    }

    /// Since when each address has been known and served.
    fn track(&mut self, views: &[VipView], now: Instant) {
        let known: BTreeSet<IpAddr> = views.iter().map(|v| v.addr).collect();
        let served: BTreeSet<IpAddr> = views.iter().filter(|v| v.serving).map(|v| v.addr).collect();
        self.known_since.retain(|a, _| known.contains(a));
        self.served_since.retain(|a, _| served.contains(a));
        for a in known {
            self.known_since.entry(a).or_insert(now);
        }
        for a in served {
            self.served_since.entry(a).or_insert(now);
        }
    }

    /// What the planner needs to know of the Leases: each version timed
    /// from when this node first saw it, as the election times them.
    fn seen(&mut self, base: &plan::Plan, now: Instant) -> Seen {
        let Some(k) = &self.kube else {
            return Seen::default();
        };
        let current = k.feed.current();
        let mut observed = BTreeMap::new();
        for (name, lease) in &current {
            let prev = self.observed.remove(name);
            observed.insert(name.clone(), Observed::update(prev, Record::of(lease), now));
        }
        self.observed = observed;
        let mut seen = Seen {
            served_since: self.served_since.clone(),
            known_since: self.known_since.clone(),
            ..Seen::default()
        };
        let mut next_expiry = None;
        for (name, o) in &self.observed {
            if o.holder_at(now).is_some_and(|h| h != k.identity) {
                seen.held_by_others.insert(name.clone());
                next_expiry = next_expiry.into_iter().chain(o.expires()).min();
            }
        }
        self.next_expiry = next_expiry;
        for name in base
            .iter()
            .filter(|(_, g)| g.shared.is_some())
            .map(|(n, _)| n)
        {
            let said = current
                .get(name)
                .and_then(|l| l.metadata.annotations.as_ref())
                .and_then(|a| a.get(plan::UNCLAIMED_ANNOTATION));
            match said.map(|v| (v, plan::parse_unclaimed(v))) {
                Some((_, Some(addrs))) => {
                    seen.unclaimed.insert(name.clone(), addrs);
                }
                // Warned once per value: this runs at every change of the
                // feed.
                Some((v, None)) if self.unreadable.get(name) != Some(v) => {
                    warn!(lease = %name, value = %v, "the L2 Lease's list of unclaimed addresses does not read: nobody covers them");
                    self.unreadable.insert(name.clone(), v.clone());
                }
                Some((_, None)) | None => {}
            }
        }
        for (name, r) in &self.groups {
            if r.election.is_some() {
                seen.standing.insert(name.clone());
            }
            if r.owner {
                seen.held.insert(name.clone());
            }
        }
        seen
    }

    /// Bring the running groups to the plan: stop what left (its answers
    /// first, then its election, which releases the Lease), start what
    /// came, update the rest; then hand the responders their answers and
    /// announce what an owned group gained.
    async fn replan(&mut self) {
        let wanted = self.plan();
        let gone: Vec<String> = self
            .groups
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        let mut stopped = Vec::new();
        for name in gone {
            if let Some(r) = self.groups.remove(&name) {
                info!(group = %name, "no longer standing for this L2 group");
                self.metrics.owner.remove(&lease_label(&name));
                stopped.push(r);
            }
        }
        let mut announce: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for (name, group) in wanted {
            match self.groups.get_mut(&name) {
                Some(r) => {
                    let added: Vec<IpAddr> =
                        group.vips.difference(&r.group.vips).copied().collect();
                    r.group = group;
                    if r.owner && !added.is_empty() {
                        announce.push((name.clone(), added));
                    }
                }
                None => {
                    let r = self.start_group(&name, group).await;
                    if r.owner {
                        announce.push((name.clone(), r.group.vips.iter().copied().collect()));
                    }
                    self.groups.insert(name, r);
                }
            }
        }
        self.set_answers();
        // Only now, with the answers already narrowed, say what is left
        // to others: no node covers an address this one still answers.
        self.publish_unclaimed();
        // Answers no longer hold the stopped groups' addresses; their
        // elections may now stop and release.
        for r in stopped {
            if let Some((election, _, forward)) = r.election {
                forward.abort();
                self.stopping.push(tokio::spawn(election.stop()));
            }
        }
        self.stopping.retain(|t| !t.is_finished());
        for (name, vips) in announce {
            self.announce(&name, &vips);
        }
    }

    async fn start_group(&mut self, name: &str, group: Group) -> Running {
        self.generation += 1;
        let generation = self.generation;
        let now = unix_now();
        let Some(lease) = group.lease.clone() else {
            info!(
                group = name,
                vips = group.vips.len(),
                "answering (static: no Lease)"
            );
            return Running {
                group,
                generation,
                fence: Fence::Always,
                election: None,
                owner: true,
                since: now,
                next_announce: Some(Instant::now() + REPEAT_AFTER_WIN),
            };
        };
        let Some(k) = self.kube.as_ref() else {
            unreachable!("a Lease group without Kubernetes");
        };
        let t = self.l2.lease.timings();
        let settings = LeaseSettings {
            duration: t.duration,
            renew_deadline: t.renew_deadline,
            retry_period: t.retry_period,
            precise: true,
            labels: lease_labels(),
            ..LeaseSettings::new(k.namespace.clone(), lease.clone(), k.identity.clone())
        };
        // The settings were checked with the file; a failure here is a
        // bug, and the group simply stays unowned.
        match Election::start_with(
            k.client.clone(),
            &settings,
            Some(&k.feed),
            unclaimed_annotation(&group),
        )
        .await
        {
            Ok((election, leadership)) => {
                info!(lease = %lease, vips = group.vips.len(), "standing for the L2 Lease");
                let forward = forward_leadership(
                    leadership.receiver(),
                    name.to_string(),
                    generation,
                    self.events.clone(),
                );
                Running {
                    fence: Fence::Until(leadership.fence()),
                    group,
                    generation,
                    election: Some((election, leadership, forward)),
                    owner: false,
                    since: now,
                    next_announce: None,
                }
            }
            Err(e) => {
                warn!(lease = %lease, error = %e, "cannot stand for the L2 Lease");
                Running {
                    fence: Fence::Until(watch::channel(None).1),
                    group,
                    generation,
                    election: None,
                    owner: false,
                    since: now,
                    next_announce: None,
                }
            }
        }
    }

    /// Every responder's answers: each address of each group on each of
    /// its interfaces, with the group's fence (either group's, for an
    /// address in two: a shared group's and its own Lease's).
    fn set_answers(&self) {
        let mut per_iface: HashMap<&str, Answers> = HashMap::new();
        for r in self.groups.values() {
            for iface in &r.group.interfaces {
                let a = per_iface.entry(iface.as_str()).or_default();
                for v in &r.group.vips {
                    let fence = match a.remove(v) {
                        Some(f) => f.or(r.fence.clone()),
                        None => r.fence.clone(),
                    };
                    a.insert(*v, fence);
                }
            }
        }
        for (name, resp) in &self.responders {
            resp.set_answers(per_iface.remove(name.as_str()).unwrap_or_default());
        }
    }

    /// Each shared group's unclaimed addresses, to its election: its
    /// holder writes them (at once, when they change).
    fn publish_unclaimed(&self) {
        for (name, r) in &self.groups {
            let (Some(sh), Some((election, _, _))) = (&r.group.shared, &r.election) else {
                continue;
            };
            if election.set_annotations(unclaimed_annotation(&r.group)) && r.owner {
                info!(
                    group = %name,
                    unclaimed = %plan::format_unclaimed(&sh.unclaimed),
                    "L2 group: addresses left to nodes that serve them"
                );
            }
        }
    }

    fn leadership(&mut self, name: &str, generation: u64, leads: bool) {
        let Some(r) = self.groups.get_mut(name) else {
            return;
        };
        if r.generation != generation || r.owner == leads {
            return;
        }
        r.owner = leads;
        r.since = unix_now();
        if leads {
            info!(
                group = name,
                vips = r.group.vips.len(),
                "won the L2 Lease: announcing"
            );
            r.next_announce = Some(Instant::now() + REPEAT_AFTER_WIN);
            let vips: Vec<IpAddr> = r.group.vips.iter().copied().collect();
            self.announce(name, &vips);
        } else {
            info!(group = name, "lost the L2 Lease: quiet");
            r.next_announce = None;
        }
    }

    /// Announce `vips` of group `name` on each of its interfaces (each
    /// frame only while the group's fence is open).
    fn announce(&self, name: &str, vips: &[IpAddr]) {
        let Some(r) = self.groups.get(name) else {
            return;
        };
        let mut sent = 0;
        for iface in &r.group.interfaces {
            if let Some(resp) = self.responders.get(iface) {
                sent += resp.announce(vips);
            }
        }
        tracing::debug!(group = name, vips = vips.len(), frames = sent, "announced");
    }

    /// Periodic announcements that are due.
    fn announce_due(&mut self) {
        let now = Instant::now();
        let interval = self.l2.gratuitous_interval;
        let due: Vec<String> = self
            .groups
            .iter_mut()
            .filter(|(_, r)| r.owner && r.next_announce.is_some_and(|t| t <= now))
            .map(|(name, r)| {
                r.next_announce = Some(now + interval);
                name.clone()
            })
            .collect();
        for name in due {
            let vips: Vec<IpAddr> = self.groups[&name].group.vips.iter().copied().collect();
            self.announce(&name, &vips);
        }
    }

    fn publish(&self) {
        let holders: BTreeMap<String, Option<String>> = self
            .kube
            .as_ref()
            .map(|k| {
                k.feed
                    .current()
                    .into_iter()
                    .map(|(n, l)| {
                        let h = l
                            .spec
                            .as_ref()
                            .and_then(|s| s.holder_identity.clone())
                            .filter(|h| !h.is_empty());
                        (n, h)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let groups: Vec<GroupState> = self
            .groups
            .iter()
            .map(|(name, r)| {
                self.metrics
                    .owner
                    .get_or_create(&lease_label(name))
                    .set(i64::from(r.owner));
                GroupState {
                    name: name.clone(),
                    lease: r.group.lease.is_some(),
                    owner: r.owner,
                    since: r.since,
                    holder: holders.get(name).cloned().flatten(),
                    interfaces: r.group.interfaces.clone(),
                    vips: r.group.vips.iter().copied().collect(),
                }
            })
            .collect();
        let errors = self.errors.borrow().clone();
        let feed_error = self.kube.as_ref().and_then(|k| k.feed.state().1);
        let last_error = [
            errors.pools.map(|e| format!("watching AddressPools: {e}")),
            errors.node.map(|e| format!("watching this node: {e}")),
            feed_error.map(|e| format!("watching the Leases: {e}")),
        ]
        .into_iter()
        .flatten()
        .next();
        let state = L2State {
            mode: self.mode_name,
            identity: self.kube.as_ref().map(|k| k.identity.clone()),
            groups,
            last_error,
        };
        self.state.send_if_modified(|s| {
            if **s == state {
                false
            } else {
                *s = Arc::new(state);
                true
            }
        });
    }

    /// Quiet first (no answers), then every election stopped, each
    /// releasing the Lease it holds.
    async fn shutdown(mut self) {
        for r in self.responders.values() {
            r.set_answers(Answers::new());
        }
        let mut stops = std::mem::take(&mut self.stopping);
        for (_, r) in std::mem::take(&mut self.groups) {
            if let Some((election, _, forward)) = r.election {
                forward.abort();
                stops.push(tokio::spawn(election.stop()));
            }
        }
        for s in stops {
            let _ = s.await;
        }
        info!("L2 speaker stopped: Leases released");
    }
}

/// What a group's holder writes on its Lease: a shared group's unclaimed
/// addresses (even none: the annotation then says so), nothing for
/// another.
fn unclaimed_annotation(g: &Group) -> BTreeMap<String, String> {
    g.shared
        .iter()
        .map(|sh| {
            (
                plan::UNCLAIMED_ANNOTATION.to_string(),
                plan::format_unclaimed(&sh.unclaimed),
            )
        })
        .collect()
}

/// Wait for a change of an optional watch (never, without one).
async fn changed<T>(rx: Option<&mut watch::Receiver<T>>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Forward an election's leadership changes to the speaker's loop.
fn forward_leadership(
    mut rx: watch::Receiver<bool>,
    name: String,
    generation: u64,
    tx: mpsc::UnboundedSender<(String, u64, bool)>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let leads = *rx.borrow_and_update();
            if tx.send((name.clone(), generation, leads)).is_err() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests;
