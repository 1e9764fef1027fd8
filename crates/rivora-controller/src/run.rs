//! The controller's loop: watches in, status writes out, only while this
//! replica leads.
//!
//! Every replica watches AddressPools, Services and Namespaces all the
//! time, so a follower that becomes leader has everything at hand: it
//! rebuilds the allocation table from the statuses in its copies and
//! goes on ([`Ipam::lead`]). Writes are merge patches of `status` that
//! carry the `resourceVersion` they were computed from: the API server
//! refuses one whose object changed since (a late write of a replica that
//! lost the Lease meanwhile among them), and the object is planned again
//! from its newer version. Each write is sent only while the fence says
//! this replica leads, and is bounded in time.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::runtime::watcher::{self, Event};
use kube::Client;
use rivora_k8s::gateway::api::gatewayclasses::GatewayClass;
use rivora_k8s::gateway::api::gateways::Gateway;
use rivora_k8s::gateway::api::referencegrants::ReferenceGrant;
use rivora_k8s::gateway::api::tcproutes::TcpRoute;
use rivora_k8s::gateway::api::udproutes::UdpRoute;
use rivora_k8s::translate::SERVICE_NAME_LABEL;
use rivora_k8s::{AddressPool, ServicePolicy, TranslateOptions};
use rivora_k8s_client::versioned::{
    versioned, GwEvent, Kind, GATEWAYS, GATEWAY_CLASSES, REFERENCE_GRANTS, TCP_ROUTES, UDP_ROUTES,
};
use rivora_k8s_client::{watch_all, Change, Listed, Warner};
use rivora_lease::{Election, ElectionError, Leadership, LeaseSettings};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, info, warn};

use crate::gateways::GatewayApi;
use crate::ipam::{Ipam, Target, Write};
use crate::metrics::Metrics;

/// How often the same warning is repeated as an Event on one object.
pub const EVENT_REPEAT: Duration = Duration::from_secs(600);
/// Writes in flight at once.
const WRITES_AT_ONCE: usize = 32;
/// Events taken before a plan: a first list of 10,000 objects still
/// writes in steps.
const BATCH: usize = 4096;

#[derive(Debug, Clone)]
pub struct Options {
    pub lease: LeaseSettings,
    pub translate: TranslateOptions,
    /// How long one status write may take before it counts as failed.
    pub write_timeout: Duration,
    /// A label selector: only the AddressPools it selects are used (and
    /// have their status written).
    pub pool_selector: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Election(#[from] ElectionError),
}

/// How a write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// The object changed under it: planned again from the newer version
    /// when the watch brings it.
    Conflict,
    /// Not sent: the fence closed.
    NotLeader,
    Error,
}

#[allow(clippy::large_enum_variant)]
enum Msg {
    Pool(watcher::Result<Event<AddressPool>>),
    Service(watcher::Result<Event<Service>>),
    Namespace(watcher::Result<Event<Namespace>>),
    Policy(watcher::Result<Event<ServicePolicy>>),
    Slice(watcher::Result<Event<EndpointSlice>>),
    Class(GwEvent<GatewayClass>),
    Gateway(GwEvent<Gateway>),
    TcpRoute(GwEvent<TcpRoute>),
    UdpRoute(GwEvent<UdpRoute>),
    Grant(GwEvent<ReferenceGrant>),
    /// A write's target, the version it was computed from, its end.
    Written(Target, String, Outcome),
    Leads(bool),
}

/// The watches' names, in logs and in [`Ipam::listing`].
const POOLS: &str = "addresspools";
const SERVICES: &str = "services";
const NAMESPACES: &str = "namespaces";
const POLICIES: &str = "servicepolicies";
const SLICES: &str = "endpointslices";

/// "Not installed" answers after which a Gateway API kind counts as
/// listed, empty: discovery can briefly miss a CRD just after the API
/// server starts.
const NOT_INSTALLED_ANSWERS: u32 = 2;

/// Run until `shutdown` resolves; then stop writing and release the
/// Lease.
pub async fn run(
    client: Client,
    opts: Options,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let (election, leadership) = Election::start(client.clone(), &opts.lease).await?;
    let mut pool_cfg = watcher::Config::default();
    if let Some(sel) = &opts.pool_selector {
        pool_cfg = pool_cfg.labels(sel);
    }
    let pools = watch_all::<AddressPool>(&client, pool_cfg)
        .map(Msg::Pool)
        .boxed();
    let services = watch_all::<Service>(&client, watcher::Config::default())
        .map(Msg::Service)
        .boxed();
    let namespaces = watch_all::<Namespace>(&client, watcher::Config::default())
        .map(Msg::Namespace)
        .boxed();
    let policies = watch_all::<ServicePolicy>(&client, watcher::Config::default())
        .map(Msg::Policy)
        .boxed();
    // Only slices that belong to a Service.
    let slices = watch_all::<EndpointSlice>(
        &client,
        watcher::Config::default().labels(SERVICE_NAME_LABEL),
    )
    .map(Msg::Slice)
    .boxed();
    let leads = futures::stream::unfold(leadership.receiver(), |mut rx| async move {
        rx.changed().await.ok()?;
        let v = *rx.borrow_and_update();
        Some((Msg::Leads(v), rx))
    })
    .boxed();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let done = futures::stream::unfold(done_rx, |mut rx| async move {
        let (t, rv, o) = rx.recv().await?;
        Some((Msg::Written(t, rv, o), rx))
    })
    .boxed();
    let mut streams = vec![pools, services, namespaces, policies, slices, leads, done];
    streams.extend([
        versioned(client.clone(), GATEWAY_CLASSES, Msg::Class),
        versioned(client.clone(), GATEWAYS, Msg::Gateway),
        versioned(client.clone(), TCP_ROUTES, Msg::TcpRoute),
        versioned(client.clone(), UDP_ROUTES, Msg::UdpRoute),
        versioned(client.clone(), REFERENCE_GRANTS, Msg::Grant),
    ]);
    let mut events = futures::stream::select_all(streams);
    let reporter = Reporter {
        controller: "rivora-controller".into(),
        instance: Some(opts.lease.identity.clone()),
    };
    let warn_services =
        Warner::<Service>::events(client.clone(), reporter.clone(), "Assign", EVENT_REPEAT);
    let warn_gateways = Warner::<Gateway>::events(client.clone(), reporter, "Assign", EVENT_REPEAT);
    let mut not_installed: BTreeMap<&'static str, u32> = BTreeMap::new();
    let writer = Writer {
        client: client.clone(),
        leadership: leadership.clone(),
        slots: Arc::new(Semaphore::new(WRITES_AT_ONCE)),
        timeout: opts.write_timeout,
        done: done_tx,
        metrics: metrics.clone(),
    };
    let mut ipam = Ipam::new(opts.translate.clone());
    let mut wants_lead = leadership.leads();
    info!(identity = %opts.lease.identity, "watching AddressPools, Services, Namespaces, ServicePolicies, EndpointSlices and the Gateway API");
    let shutdown = shutdown.fuse();
    futures::pin_mut!(shutdown);
    loop {
        let first = tokio::select! {
            m = events.next() => match m { Some(m) => m, None => break },
            _ = &mut shutdown => break,
        };
        handle(&mut ipam, first, &mut wants_lead, &mut not_installed);
        let mut n = 1;
        while n < BATCH {
            match events.next().now_or_never() {
                Some(Some(m)) => {
                    handle(&mut ipam, m, &mut wants_lead, &mut not_installed);
                    n += 1;
                }
                _ => break,
            }
        }
        if wants_lead && !ipam.leads() && ipam.may_lead() && leadership.leads() {
            info!("leading: rebuilding the address table from the Services' statuses");
            ipam.lead();
        } else if !wants_lead && ipam.leads() {
            info!("no longer leading: writing nothing");
            ipam.follow();
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let plan = ipam.plan(&now);
        for w in plan.writes {
            writer.send(w);
        }
        for w in plan.warnings {
            match &w.object {
                Target::Service(k) => {
                    if let Some(svc) = ipam.services.get(k) {
                        warn_services.warn(svc, w.warning.reason, w.warning.message);
                    }
                }
                Target::Gateway(k) => {
                    if let Some(g) = ipam.gateway.gateways.get(k) {
                        warn_gateways.warn(g, w.warning.reason, w.warning.message);
                    }
                }
                _ => {}
            }
        }
        metrics.is_leader.set(i64::from(ipam.leads()));
        metrics.set_pools(&ipam.gauges());
        let ready = ipam.all_listed();
        metrics.set_ready(ready, &not_listed(&ipam));
    }
    info!("stopping: releasing the Lease");
    metrics.is_leader.set(0);
    election.stop().await;
    Ok(())
}

fn not_listed(ipam: &Ipam) -> String {
    let mut w = Vec::new();
    let g = &ipam.gateway;
    for (synced, what) in [
        (ipam.pools.synced, POOLS),
        (ipam.services.synced, SERVICES),
        (ipam.namespaces.synced, NAMESPACES),
        (g.classes.synced, "gatewayclasses"),
        (g.gateways.synced, "gateways"),
        (g.tcp_routes.synced, "tcproutes"),
        (g.udp_routes.synced, "udproutes"),
        (g.grants.synced, "referencegrants"),
    ] {
        if !synced {
            w.push(what);
        }
    }
    format!("not listed yet: {}", w.join(", "))
}

/// One event of a Gateway API watch into `listed` (picked from `ipam`).
fn handle_gw<K: kube::Resource>(
    ipam: &mut Ipam,
    kind: &'static str,
    ev: GwEvent<K>,
    not_installed: &mut BTreeMap<&'static str, u32>,
    listed: fn(&mut GatewayApi) -> &mut Listed<K>,
) {
    match ev {
        GwEvent::Serving(v) => {
            ipam.gateway.versions.insert(kind, v);
        }
        GwEvent::Watch(Err(e)) => warn!(kind, error = %e, "watch failed; retrying"),
        GwEvent::Failed(e) => warn!(kind, error = %e, "discovery failed; retrying"),
        GwEvent::NotInstalled => {
            let n = not_installed.entry(kind).or_insert(0);
            *n += 1;
            let l = listed(&mut ipam.gateway);
            if *n >= NOT_INSTALLED_ANSWERS && !l.synced {
                warn!(
                    kind,
                    "the Gateway API CRD is not installed: no such objects until it is"
                );
                l.synced = true;
                ipam.gateways_changed();
            }
            if *n >= NOT_INSTALLED_ANSWERS {
                ipam.not_installed(kind);
            }
        }
        GwEvent::Watch(Ok(ev)) => {
            not_installed.remove(kind);
            ipam.listing(kind, &ev);
            let mut bad = Vec::new();
            let change = listed(&mut ipam.gateway).apply_read(ev, &mut bad);
            for u in bad {
                warn!(kind, object = %u.key, error = %u.error, "an object the types cannot read: its last readable copy is kept");
            }
            if !matches!(change, Change::None) {
                ipam.gateways_changed();
            }
        }
    }
}

fn handle(
    ipam: &mut Ipam,
    msg: Msg,
    wants_lead: &mut bool,
    not_installed: &mut BTreeMap<&'static str, u32>,
) {
    match msg {
        Msg::Class(ev) => handle_gw(ipam, GATEWAY_CLASSES.kind, ev, not_installed, |g| {
            &mut g.classes
        }),
        Msg::Gateway(ev) => handle_gw(ipam, GATEWAYS.kind, ev, not_installed, |g| &mut g.gateways),
        Msg::TcpRoute(ev) => handle_gw(ipam, TCP_ROUTES.kind, ev, not_installed, |g| {
            &mut g.tcp_routes
        }),
        Msg::UdpRoute(ev) => handle_gw(ipam, UDP_ROUTES.kind, ev, not_installed, |g| {
            &mut g.udp_routes
        }),
        Msg::Grant(ev) => handle_gw(ipam, REFERENCE_GRANTS.kind, ev, not_installed, |g| {
            &mut g.grants
        }),
        Msg::Leads(l) => *wants_lead = l,
        Msg::Written(t, rv, o) => match o {
            Outcome::Conflict => ipam.refused(&t, &rv),
            Outcome::Ok | Outcome::NotLeader => ipam.written(&t, true),
            Outcome::Error => ipam.written(&t, false),
        },
        Msg::Pool(Err(e)) if rivora_k8s_client::is_not_found(&e) => {
            debug!(error = %e, "the AddressPool CRD is not installed: no addresses to give");
            // No pools is an answer: Services are told so.
            if !ipam.pools.synced {
                warn!("the AddressPool CRD (addresspools.rivora.io) is not installed");
                ipam.pools.synced = true;
                ipam.pools_changed();
            }
            ipam.not_installed(POOLS);
        }
        Msg::Policy(Err(e)) if rivora_k8s_client::is_not_found(&e) => {
            // No policies is an answer: nothing to write.
            if !ipam.policies.policies.synced {
                warn!("the ServicePolicy CRD (servicepolicies.rivora.io) is not installed");
                ipam.policies.policies.synced = true;
                ipam.policies_changed();
            }
            ipam.not_installed(POLICIES);
        }
        Msg::Pool(Err(e))
        | Msg::Service(Err(e))
        | Msg::Namespace(Err(e))
        | Msg::Policy(Err(e))
        | Msg::Slice(Err(e)) => {
            warn!(error = %e, "watch failed; retrying");
        }
        Msg::Policy(Ok(ev)) => {
            ipam.listing(POLICIES, &ev);
            if !matches!(ipam.policies.policies.apply(ev), Change::None) {
                ipam.policies.policies_changed();
                ipam.policies_changed();
            }
        }
        Msg::Slice(Ok(ev)) => {
            ipam.listing(SLICES, &ev);
            let ch = ipam.policies.slices.apply(ev);
            if !matches!(ch, Change::None) {
                ipam.policies.slices_changed(ch);
                ipam.policies_changed();
            }
        }
        Msg::Pool(Ok(ev)) => {
            ipam.listing(POOLS, &ev);
            match ipam.pools.apply(ev) {
                Change::None => {}
                // The pool's own status written back: no pool changed (a
                // status write does not move the generation).
                Change::One(Some(old), Some(new))
                    if old.metadata.generation == new.metadata.generation =>
                {
                    ipam.pool_status_changed()
                }
                _ => ipam.pools_changed(),
            }
        }
        Msg::Service(Ok(ev)) => {
            ipam.listing(SERVICES, &ev);
            let ch = ipam.services.apply(ev);
            for k in ch.keys(&ipam.services) {
                ipam.service_changed(k);
            }
        }
        Msg::Namespace(Ok(ev)) => {
            ipam.listing(NAMESPACES, &ev);
            let ch = ipam.namespaces.apply(ev);
            for k in ch.keys(&ipam.namespaces) {
                ipam.namespace_changed(&k.name);
            }
        }
    }
}

#[derive(Clone)]
struct Writer {
    client: Client,
    leadership: Leadership,
    slots: Arc<Semaphore>,
    timeout: Duration,
    done: mpsc::UnboundedSender<(Target, String, Outcome)>,
    metrics: Arc<Metrics>,
}

impl Writer {
    fn send(&self, w: Write) {
        let this = self.clone();
        tokio::spawn(async move {
            let Ok(_slot) = this.slots.clone().acquire_owned().await else {
                return;
            };
            let target = w.target.clone();
            let rv = w.resource_version.clone();
            let outcome = this.write(w).await;
            let kind = match target {
                Target::Service(_) => "service",
                Target::Pool(_) => "pool",
                Target::GatewayClass(_) => "gatewayclass",
                Target::Gateway(_) => "gateway",
                Target::TcpRoute(_) => "tcproute",
                Target::UdpRoute(_) => "udproute",
                Target::Policy(_) => "servicepolicy",
            };
            match outcome {
                Outcome::Ok => this.metrics.wrote(kind, "ok"),
                Outcome::Conflict => this.metrics.wrote(kind, "conflict"),
                Outcome::Error => {
                    this.metrics.wrote(kind, "error");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Outcome::NotLeader => {}
            }
            let _ = this.done.send((target, rv, outcome));
        });
    }

    async fn write(&self, w: Write) -> Outcome {
        // The fence, checked as late as possible: the write then lands
        // within the timeout, which is below the Lease's margin.
        if !self.leadership.leads() {
            return Outcome::NotLeader;
        }
        let patch = json!({
            "metadata": { "resourceVersion": w.resource_version },
            "status": w.status,
        });
        let pp = PatchParams::default();
        let req = async {
            match &w.target {
                Target::Service(k) => Api::<Service>::namespaced(self.client.clone(), &k.namespace)
                    .patch_status(&k.name, &pp, &Patch::Merge(&patch))
                    .await
                    .map(drop),
                Target::Pool(name) => Api::<AddressPool>::all(self.client.clone())
                    .patch_status(name, &pp, &Patch::Merge(&patch))
                    .await
                    .map(drop),
                Target::Policy(k) => {
                    Api::<ServicePolicy>::namespaced(self.client.clone(), &k.namespace)
                        .patch_status(&k.name, &pp, &Patch::Merge(&patch))
                        .await
                        .map(drop)
                }
                Target::GatewayClass(name) => {
                    self.replace(&GATEWAY_CLASSES, None, name, &w.status).await
                }
                Target::Gateway(k) => {
                    self.replace(&GATEWAYS, Some(&k.namespace), &k.name, &w.status)
                        .await
                }
                Target::TcpRoute(k) => {
                    self.replace(&TCP_ROUTES, Some(&k.namespace), &k.name, &w.status)
                        .await
                }
                Target::UdpRoute(k) => {
                    self.replace(&UDP_ROUTES, Some(&k.namespace), &k.name, &w.status)
                        .await
                }
            }
        };
        match tokio::time::timeout(self.timeout, req).await {
            Ok(Ok(())) => {
                debug!(target = %target_name(&w.target), rv = %w.resource_version, status = %w.status, "status written");
                Outcome::Ok
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                debug!(target = %target_name(&w.target), rv = %w.resource_version, "status changed under the write");
                Outcome::Conflict
            }
            // Deleted meanwhile: the watch says so.
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Outcome::Ok,
            Ok(Err(e)) => {
                warn!(target = %target_name(&w.target), error = %e, "writing status");
                Outcome::Error
            }
            Err(_) => {
                warn!(target = %target_name(&w.target), timeout = ?self.timeout, "writing status timed out");
                Outcome::Error
            }
        }
    }
}

impl Writer {
    /// Replace the status of a Gateway API object with `body` (the whole
    /// object, its `resourceVersion` the one read), at the version its
    /// `apiVersion` names.
    async fn replace(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        name: &str,
        body: &Value,
    ) -> kube::Result<()> {
        let version = body["apiVersion"]
            .as_str()
            .and_then(|v| v.rsplit('/').next())
            .unwrap_or("v1");
        let obj: DynamicObject =
            serde_json::from_value(body.clone()).map_err(kube::Error::SerdeError)?;
        let ar = kind.at(version);
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        };
        api.replace_status(name, &PostParams::default(), &obj)
            .await
            .map(drop)
    }
}

fn target_name(t: &Target) -> String {
    match t {
        Target::Service(k) => format!("Service {k}"),
        Target::Pool(p) => format!("AddressPool {p}"),
        Target::GatewayClass(c) => format!("GatewayClass {c}"),
        Target::Gateway(k) => format!("Gateway {k}"),
        Target::TcpRoute(k) => format!("TCPRoute {k}"),
        Target::UdpRoute(k) => format!("UDPRoute {k}"),
        Target::Policy(k) => format!("ServicePolicy {k}"),
    }
}
