//! Kubernetes as a source: LoadBalancer Services, their EndpointSlices
//! and Rivora's `ServicePolicy`, watched, translated by
//! [`rivora_k8s::service_vips`] and sent to the reconciler, one owner per
//! Service (`service ns/name`); and beside them, sharing those stores,
//! Gateways and their routes ([`gateway`], one owner per Gateway,
//! `gateway ns/name`), which say `Synced(Gateway)` after their own first
//! pass.
//!
//! The three watches keep full copies of what they list. Nothing is sent
//! until each has finished its first full list: a Service translated
//! before its EndpointSlices arrive would lose its backends for a moment,
//! which on a restart would reset flows the adopted maps still carry.
//! Then every Service is sent and `Synced(Service)` follows, which is what
//! lets the reconciler prune what nothing claimed. A watch that fails
//! (API server unreachable) retries with backoff and keeps its last copy;
//! before its first list nothing is sent at all, so nothing is pruned.
//!
//! After that, events are taken in batches (all that are ready at once),
//! the Services they touch are translated again, and only a Service whose
//! VIPs changed is sent. The time from an EndpointSlice change seen to
//! its map write is the `rivora_network_programming_seconds` histogram.
//!
//! What the Service's owner must fix (an unsupported protocol, an invalid
//! policy, a VIP that could not be programmed) becomes a Warning Event on
//! the Service, repeated at most every [`EVENT_REPEAT`], and published
//! once for the cluster however many nodes find it ([`publish_once`]).
//! rivorad writes no status: rivora-controller writes the Services', the
//! Gateway API's and the ServicePolicies'.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use prometheus_client::metrics::histogram::Histogram;
use rivora_k8s::gateway::api::gatewayclasses::GatewayClass;
use rivora_k8s::gateway::api::gateways::Gateway;
use rivora_k8s::gateway::api::referencegrants::ReferenceGrant;
use rivora_k8s::gateway::api::tcproutes::TcpRoute;
use rivora_k8s::gateway::api::udproutes::UdpRoute;
use rivora_k8s::ipam::{admitted, ClaimRef, PoolSet};
use rivora_k8s::policy::{choose_policies, ObjectRef, PolicyChoice};
use rivora_k8s::translate::SERVICE_NAME_LABEL;
use rivora_k8s::{service_vips, AddressPool, ServicePolicy, TranslateOptions};
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

use rivora_k8s_client::versioned::GwEvent;
pub use rivora_k8s_client::{client, KubeError};
use rivora_k8s_client::{is_not_found, key_of, watch_all, Change, Listed};

use self::gateway::GatewayState;
use super::WatchState;
use crate::desired::{DesiredVip, Owner, SourceKind};
use crate::reconciler::{Applied, Command, Sender};

/// How often the same warning is repeated as an Event on one Service.
pub const EVENT_REPEAT: Duration = Duration::from_secs(600);
/// The Event reason of a VIP the dataplane could not take.
pub const WARN_NOT_PROGRAMMED: &str = "NotProgrammed";
/// Buckets of `rivora_network_programming_seconds`: 1 ms to 30 s, with
/// 10 ms steps up to 100 ms, where the target (50 ms at p99) lies.
pub const PROGRAMMING_BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 20.0, 30.0,
];
/// At most this many events are taken before the Services they touched
/// are sent: a first list of 10,000 objects still programs in steps.
const BATCH: usize = 4096;

mod gateway;

/// The watches, in the order their states are published.
pub const RESOURCES: [&str; 10] = [
    "services",
    "endpointslices",
    "servicepolicies",
    "gateways",
    "gatewayclasses",
    "tcproutes",
    "udproutes",
    "referencegrants",
    "namespaces",
    "addresspools",
];

/// A watch, by its index in [`RESOURCES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Watch {
    Services = 0,
    EndpointSlices = 1,
    ServicePolicies = 2,
    Gateways = 3,
    GatewayClasses = 4,
    TcpRoutes = 5,
    UdpRoutes = 6,
    ReferenceGrants = 7,
    Namespaces = 8,
    AddressPools = 9,
}

#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// This node's name: `externalTrafficPolicy: Local` keeps the
    /// endpoints whose `nodeName` it is.
    pub node_name: String,
    pub translate: TranslateOptions,
}

/// The source's outputs besides commands.
#[derive(Clone)]
pub struct KubeOutputs {
    /// `rivora_network_programming_seconds`.
    pub programming: Histogram,
    pub watches: Arc<watch::Sender<Vec<WatchState>>>,
}

impl KubeOutputs {
    pub fn new() -> (Self, super::WatchStates) {
        let initial = RESOURCES
            .iter()
            .map(|r| WatchState {
                resource: r,
                ..Default::default()
            })
            .collect();
        let (tx, rx) = watch::channel(initial);
        (
            Self {
                programming: Histogram::new(PROGRAMMING_BUCKETS.iter().copied()),
                watches: Arc::new(tx),
            },
            rx,
        )
    }
}

/// One event of one watch. Each is moved once, from the stream to
/// [`State::handle`]: boxing would cost more than the copy.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Service(watcher::Result<Event<Service>>),
    Slice(watcher::Result<Event<EndpointSlice>>),
    Policy(watcher::Result<Event<ServicePolicy>>),
    Gateway(GwEvent<Gateway>),
    GatewayClass(GwEvent<GatewayClass>),
    TcpRoute(GwEvent<TcpRoute>),
    UdpRoute(GwEvent<UdpRoute>),
    Grant(GwEvent<ReferenceGrant>),
    Namespace(watcher::Result<Event<PartialObjectMeta<Namespace>>>),
    Pool(watcher::Result<Event<AddressPool>>),
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The Service an EndpointSlice belongs to.
fn service_of(slice: &EndpointSlice) -> Option<ObjectRef> {
    let name = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some(ObjectRef::new(
        slice.namespace().unwrap_or_default(),
        name.clone(),
    ))
}

/// What was last sent for a Service.
struct Sent {
    vips: Vec<DesiredVip>,
}

/// The source's whole state; lives on one task.
struct State {
    opts: KubeOptions,
    services: Listed<Service>,
    slices: Listed<EndpointSlice>,
    policies: Listed<ServicePolicy>,
    pools: Listed<AddressPool>,
    /// The pools as the allocator uses them: an address no pool in use
    /// admits is not served, whoever wrote it into a status.
    pool_set: PoolSet,
    /// Service -> its slices (by slice key).
    slices_of: HashMap<ObjectRef, BTreeSet<ObjectRef>>,
    choice: PolicyChoice,
    /// Services to translate again, with when an EndpointSlice change for
    /// it was first seen (the programming latency's start).
    dirty: HashMap<ObjectRef, Option<Instant>>,
    sent: HashMap<ObjectRef, Sent>,
    watches: Vec<WatchState>,
    synced_sent: bool,
    /// The Gateway half.
    gw: GatewayState,
}

impl State {
    fn new(opts: KubeOptions) -> Self {
        Self {
            opts,
            services: Listed::default(),
            slices: Listed::default(),
            policies: Listed::default(),
            pools: Listed::default(),
            pool_set: PoolSet::default(),
            slices_of: HashMap::new(),
            choice: PolicyChoice::default(),
            dirty: HashMap::new(),
            sent: HashMap::new(),
            watches: RESOURCES
                .iter()
                .map(|r| WatchState {
                    resource: r,
                    ..Default::default()
                })
                .collect(),
            synced_sent: false,
            gw: GatewayState::default(),
        }
    }

    /// Whether the Service half may send: its watches have listed, and
    /// the pools and namespaces that decide which addresses are served.
    fn all_listed(&self) -> bool {
        self.services.synced
            && self.slices.synced
            && self.policies.synced
            && self.pools.synced
            && self.gw.namespaces.synced
    }

    /// Every Service and Gateway is looked at again (the pools, which
    /// decide what is served, changed).
    fn touch_all(&mut self) {
        let keys: Vec<ObjectRef> = self.services.items.keys().cloned().collect();
        for k in keys {
            self.touch(k, None);
        }
        self.gw.pools_changed();
    }

    /// Why an address of an object is not served, if it is not: no pool
    /// in use admits it.
    fn not_served(
        &self,
        object: &ClaimRef,
        labels: &BTreeMap<String, String>,
        addr: std::net::IpAddr,
    ) -> Option<String> {
        let ns = self
            .gw
            .namespaces
            .items
            .get(&ObjectRef::new("", object.namespace.clone()))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        admitted(&self.pool_set, object, labels, &ns, addr)
            .err()
            .map(|f| f.not_served())
    }

    fn touch(&mut self, svc: ObjectRef, seen: Option<Instant>) {
        self.gw.service_changed(&svc);
        let e = self.dirty.entry(svc).or_insert(seen);
        if e.is_none() {
            *e = seen;
        }
    }

    fn failed(&mut self, watch: Watch, e: &watcher::Error) {
        self.failed_text(watch, e.to_string());
    }

    fn failed_text(&mut self, watch: Watch, e: String) {
        let w = &mut self.watches[watch as usize];
        w.errors += 1;
        warn!(resource = w.resource, error = %e, "watch failed; retrying");
        w.last_error = Some(e);
        w.last_error_at = now_secs();
    }

    fn handle(&mut self, msg: Msg, now: Instant) {
        match msg {
            Msg::Service(Err(e)) => self.failed(Watch::Services, &e),
            Msg::Slice(Err(e)) => self.failed(Watch::EndpointSlices, &e),
            Msg::Gateway(ev) => self.handle_gateway(Watch::Gateways, ev, |g| &mut g.gateways),
            Msg::GatewayClass(ev) => {
                self.handle_gateway(Watch::GatewayClasses, ev, |g| &mut g.classes)
            }
            Msg::TcpRoute(ev) => self.handle_gateway(Watch::TcpRoutes, ev, |g| &mut g.tcp_routes),
            Msg::UdpRoute(ev) => self.handle_gateway(Watch::UdpRoutes, ev, |g| &mut g.udp_routes),
            Msg::Grant(ev) => self.handle_gateway(Watch::ReferenceGrants, ev, |g| &mut g.grants),
            Msg::Namespace(ev) => self.handle_namespace(ev),
            Msg::Pool(Err(e)) if is_not_found(&e) => {
                let w = &mut self.watches[Watch::AddressPools as usize];
                w.last_error = Some(
                    "the AddressPool CRD (addresspools.rivora.io) is not installed: no Service or Gateway address is served"
                        .into(),
                );
                w.last_error_at = now_secs();
                if !self.pools.synced {
                    self.pools.synced = true;
                    w.errors += 1;
                    warn!("the AddressPool CRD is not installed: no Service or Gateway address is served until it is");
                }
            }
            Msg::Pool(Err(e)) => self.failed(Watch::AddressPools, &e),
            Msg::Pool(Ok(ev)) => {
                let changed = match self.pools.apply(ev) {
                    Change::None => false,
                    Change::One(old, new) => {
                        old.map(|p| p.spec.clone()) != new.map(|p| p.spec.clone())
                    }
                    Change::All(_) => true,
                };
                if changed {
                    self.pool_set = PoolSet::new(self.pools.items.values().map(|p| &**p));
                    self.touch_all();
                }
            }
            // Without the CRD there are no policies to wait for: go on
            // with none, and pick them up once it is installed (the
            // watcher keeps retrying the list, quietly).
            Msg::Policy(Err(e)) if is_not_found(&e) => {
                let w = &mut self.watches[Watch::ServicePolicies as usize];
                w.last_error = Some(
                    "the ServicePolicy CRD (servicepolicies.rivora.io) is not installed: Services get no policy"
                        .into(),
                );
                w.last_error_at = now_secs();
                if !self.policies.synced {
                    self.policies.synced = true;
                    w.errors += 1;
                    warn!("the ServicePolicy CRD is not installed: Services get no policy until it is");
                } else {
                    debug!(error = %e, "the ServicePolicy CRD is still not installed");
                }
            }
            Msg::Policy(Err(e)) => self.failed(Watch::ServicePolicies, &e),
            Msg::Service(Ok(ev)) => match self.services.apply(ev) {
                Change::None => {}
                Change::One(old, new) => {
                    let key = old.as_ref().or(new.as_ref()).map(|s| key_of(&**s));
                    if let Some(k) = key {
                        self.touch(k, None);
                    }
                }
                Change::All(old) => {
                    let keys: Vec<ObjectRef> = old
                        .into_keys()
                        .chain(self.services.items.keys().cloned())
                        .collect();
                    for k in keys {
                        self.touch(k, None);
                    }
                }
            },
            Msg::Slice(Ok(ev)) => match self.slices.apply(ev) {
                Change::None => {}
                Change::One(old, new) => {
                    for (s, present) in [(old, false), (new, true)] {
                        let Some(s) = s else { continue };
                        let key = key_of(&*s);
                        let Some(svc) = service_of(&s) else { continue };
                        let set = self.slices_of.entry(svc.clone()).or_default();
                        if present {
                            set.insert(key);
                        } else {
                            set.remove(&key);
                            if set.is_empty() {
                                self.slices_of.remove(&svc);
                            }
                        }
                        self.touch(svc, Some(now));
                    }
                }
                Change::All(old) => {
                    let mut svcs: BTreeSet<ObjectRef> =
                        old.values().filter_map(|s| service_of(s)).collect();
                    self.slices_of.clear();
                    for (key, s) in &self.slices.items {
                        if let Some(svc) = service_of(s) {
                            self.slices_of
                                .entry(svc.clone())
                                .or_default()
                                .insert(key.clone());
                            svcs.insert(svc);
                        }
                    }
                    // A list is a reading, not a change: not timed.
                    for svc in svcs {
                        self.touch(svc, None);
                    }
                }
            },
            Msg::Policy(Ok(ev)) => {
                let namespaces: BTreeSet<String> = match self.policies.apply(ev) {
                    Change::None => return,
                    Change::One(old, new) => old
                        .iter()
                        .chain(new.iter())
                        .map(|p| p.namespace().unwrap_or_default())
                        .collect(),
                    Change::All(old) => old
                        .values()
                        .chain(self.policies.items.values())
                        .map(|p| p.namespace().unwrap_or_default())
                        .collect(),
                };
                self.choice = choose_policies(self.policies.items.values().map(|p| &**p));
                self.gw.policies_changed();
                // A policy can only name Services of its own namespace.
                let touched: Vec<ObjectRef> = self
                    .services
                    .items
                    .keys()
                    .filter(|k| namespaces.contains(&k.namespace))
                    .cloned()
                    .collect();
                for k in touched {
                    self.touch(k, None);
                }
            }
        }
        for (w, n, synced) in [
            (
                Watch::Services,
                self.services.items.len(),
                self.services.synced,
            ),
            (
                Watch::EndpointSlices,
                self.slices.items.len(),
                self.slices.synced,
            ),
            (
                Watch::ServicePolicies,
                self.policies.items.len(),
                self.policies.synced,
            ),
            (
                Watch::AddressPools,
                self.pools.items.len(),
                self.pools.synced,
            ),
        ]
        .into_iter()
        .chain(self.gw.counts())
        {
            self.watches[w as usize].objects = n;
            self.watches[w as usize].synced = synced;
        }
    }

    /// Translate one Service as the watches have it now.
    /// Translate one Service as the watches have it now; an address no
    /// pool admits is marked refused.
    fn translate(&self, key: &ObjectRef) -> rivora_k8s::Translation {
        let Some(svc) = self.services.items.get(key) else {
            return rivora_k8s::Translation::default();
        };
        let mut t = self.translate_service(key, svc);
        let object = ClaimRef::service(key.namespace.clone(), key.name.clone());
        for v in &mut t.vips {
            v.refused = self.not_served(&object, svc.labels(), v.vip.addr);
        }
        t
    }

    fn translate_service(&self, key: &ObjectRef, svc: &Service) -> rivora_k8s::Translation {
        let slices: Vec<Arc<EndpointSlice>> = self
            .slices_of
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.items.get(s).cloned())
            .collect();
        let policy = self
            .choice
            .policy_for(key)
            .and_then(|p| self.policies.items.get(p))
            .map(|p| &**p);
        service_vips(
            svc,
            &slices,
            policy,
            &self.opts.node_name,
            &self.opts.translate,
        )
    }
}

/// Warnings on Services and on Gateways, each (object, reason, message)
/// at most once per [`EVENT_REPEAT`] from this node, and once for the
/// cluster ([`rivora_k8s_client::publish_once`]). Shared by the pass and the
/// tasks that wait for the reconciler's answers.
#[derive(Clone)]
struct Warner {
    services: rivora_k8s_client::Warner<Service>,
    gateways: rivora_k8s_client::Warner<Gateway>,
}

impl Warner {
    fn events(client: &Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: "rivorad".into(),
            instance: Some(node.to_string()),
        };
        Self {
            services: rivora_k8s_client::Warner::events(
                client.clone(),
                reporter.clone(),
                "Program",
                EVENT_REPEAT,
            ),
            gateways: rivora_k8s_client::Warner::events(
                client.clone(),
                reporter,
                "Program",
                EVENT_REPEAT,
            ),
        }
    }
}

/// Watch and send until the reconciler is gone. Runs on the async
/// runtime; everything it sends is a [`Command`].
pub async fn run(client: Client, opts: KubeOptions, tx: Sender, out: KubeOutputs) {
    let services = watch_all::<Service>(&client, watcher::Config::default())
        .map(Msg::Service)
        .boxed();
    // Only slices that belong to a Service.
    let slices = watch_all::<EndpointSlice>(
        &client,
        watcher::Config::default().labels(SERVICE_NAME_LABEL),
    )
    .map(Msg::Slice)
    .boxed();
    let policies = watch_all::<ServicePolicy>(&client, watcher::Config::default())
        .map(Msg::Policy)
        .boxed();
    let pools = watch_all::<AddressPool>(&client, watcher::Config::default())
        .map(Msg::Pool)
        .boxed();
    let mut streams = vec![services, slices, policies, pools];
    streams.extend(gateway::streams(&client));
    let mut events = futures::stream::select_all(streams);
    let warner = Warner::events(&client, &opts.node_name);
    let mut state = State::new(opts);
    info!(node = %state.opts.node_name, "watching Services, EndpointSlices, ServicePolicies, AddressPools, Gateways and their routes");
    while let Some(first) = events.next().await {
        let now = Instant::now();
        state.handle(first, now);
        let mut n = 1;
        while n < BATCH {
            match events.next().now_or_never() {
                Some(Some(m)) => {
                    state.handle(m, now);
                    n += 1;
                }
                _ => break,
            }
        }
        if step(&mut state, &tx, &out, &warner).is_none() {
            return;
        }
        // Only this source's own entries: the BGP watches follow them.
        out.watches.send_modify(|w| {
            let n = state.watches.len();
            if w.len() < n {
                w.clone_from(&state.watches);
            } else {
                w[..n].clone_from_slice(&state.watches);
            }
        });
    }
}

/// After a batch of events: once every watch has listed, send what
/// changed, and after the first such pass say the source is synced.
/// None when the reconciler is gone.
fn step(state: &mut State, tx: &Sender, out: &KubeOutputs, warner: &Warner) -> Option<()> {
    if !state.all_listed() {
        return Some(());
    }
    flush(state, tx, out, warner)?;
    // Gateways read the Services, EndpointSlices and policies above, so
    // they wait for those lists as well as their own.
    if state.gw.listed() {
        gateway::flush(state, tx, warner)?;
    }
    if !state.synced_sent {
        tx.send(Command::Synced(SourceKind::Service)).ok()?;
        state.synced_sent = true;
        info!(
            services = state.sent.len(),
            "Kubernetes: first full pass sent; leftovers may now be pruned"
        );
    }
    Some(())
}

/// Send every dirty Service whose VIPs changed. None when the reconciler
/// is gone.
fn flush(state: &mut State, tx: &Sender, out: &KubeOutputs, warner: &Warner) -> Option<()> {
    let dirty: Vec<(ObjectRef, Option<Instant>)> = state.dirty.drain().collect();
    for (key, seen) in dirty {
        let t = state.translate(&key);
        if let Some(svc) = state.services.items.get(&key) {
            for w in &t.warnings {
                warner.services.warn(svc, w.reason, w.message.clone());
            }
        }
        let unchanged = match state.sent.get(&key) {
            Some(s) => s.vips == t.vips,
            None => t.vips.is_empty(),
        };
        if unchanged {
            continue;
        }
        if t.vips.is_empty() {
            state.sent.remove(&key);
        } else {
            state.sent.insert(
                key.clone(),
                Sent {
                    vips: t.vips.clone(),
                },
            );
        }
        let owner = Owner::new(SourceKind::Service, key.to_string());
        let (ack, applied) = oneshot::channel();
        tx.send(Command::SetDesired {
            owner,
            vips: t.vips,
            ack: Some(ack),
        })
        .ok()?;
        let programming = out.programming.clone();
        let svc = state.services.items.get(&key).cloned();
        let warner = warner.clone();
        tokio::spawn(async move {
            let Ok(applied) = applied.await else { return };
            if let Some(seen) = seen {
                programming.observe(seen.elapsed().as_secs_f64());
            }
            report_applied(&key, svc, &applied, &warner);
        });
    }
    Some(())
}

/// A VIP the dataplane refused (no free capacity, a conflict with
/// another owner) is the Service owner's to know about.
fn report_applied(key: &ObjectRef, svc: Option<Arc<Service>>, applied: &Applied, warner: &Warner) {
    if applied.ok() {
        debug!(service = %key, "programmed");
        return;
    }
    warn!(service = %key, error = %applied.summary(), "not programmed in full");
    if let Some(svc) = svc {
        for (vip, reason) in &applied.failed {
            warner.services.warn(
                &svc,
                WARN_NOT_PROGRAMMED,
                format!("VIP {vip} is not programmed: {reason}"),
            );
        }
    }
}

#[cfg(test)]
mod tests;
