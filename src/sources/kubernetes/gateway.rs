//! The Gateway half of the Kubernetes source: GatewayClasses, Gateways,
//! TCPRoutes, UDPRoutes, ReferenceGrants and Namespaces (for
//! `allowedRoutes` selectors) watched beside the Services, EndpointSlices
//! and ServicePolicies the Service half already holds (one copy of each,
//! shared), resolved by [`rivora_k8s::gateway::resolve`] and sent to the
//! reconciler, one owner per Gateway (`gateway ns/name`).
//!
//! The Gateway API kinds are read at whichever version the cluster serves,
//! newest first (v1, then TCPRoute/UDPRoute v1alpha2 or ReferenceGrant
//! v1beta1, Gateway API releases before v1.7), found by discovery and
//! found again when a watch says the version is gone. Without the CRDs the
//! watch says so (`the Gateway API CRDs ... are not installed`) and looks
//! again every [`NOT_INSTALLED_RETRY`] ([`rivora_k8s_client::versioned`]), quietly; after two such answers it
//! counts as listed (empty), so a cluster without Gateway API does not hold
//! back the prune of adopted VIPs. Two, not one: just after an API server
//! starts, discovery can briefly miss CRDs it serves a moment later.
//!
//! An object the types cannot read (a field of a release newer than the
//! types, say) is logged and counted on its watch, and its last readable
//! copy is kept: its VIPs keep forwarding as they were.
//!
//! Nothing is sent before every watch of both halves has listed; then
//! every Gateway is sent and `Synced(Gateway)` follows. After that a change
//! of a Gateway API object resolves every Gateway again (few, and a route
//! can move traffic between them), and a change of a Service or its
//! EndpointSlices only when a Gateway reads backends from it; only the
//! Gateways whose VIPs changed are sent. Status is rivora-controller's to
//! write; rivorad writes none on Gateway API objects. What only a node
//! knows, a VIP its dataplane refused (a key another owner holds, no
//! Maglev slots), is a Warning Event `NotProgrammed` on the Gateway, as on
//! a Service.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};
use rivora_k8s::gateway::api::gatewayclasses::GatewayClass;
use rivora_k8s::gateway::api::gateways::Gateway;
use rivora_k8s::gateway::api::referencegrants::ReferenceGrant;
use rivora_k8s::gateway::api::tcproutes::TcpRoute;
use rivora_k8s::gateway::api::udproutes::UdpRoute;
use rivora_k8s::gateway::{self as gw, Cluster, ListenerRef, Route, GROUP};
use rivora_k8s::ipam::ClaimRef;
use rivora_k8s::policy::{ObjectRef, ServicePolicy};
use rivora_k8s::translate::{endpoint_nodes, place_backends};
use rivora_k8s_client::versioned::{
    versioned, GwEvent, GATEWAYS, GATEWAY_CLASSES, REFERENCE_GRANTS, TCP_ROUTES, UDP_ROUTES,
};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use super::{now_secs, Change, Listed, Msg, State, Warner, Watch, WARN_NOT_PROGRAMMED};
use crate::desired::{DesiredVip, Owner, SourceKind};
use crate::reconciler::{Command, Sender};

/// The Gateway half's watches, merged into the source's stream.
pub fn streams(client: &Client) -> Vec<BoxStream<'static, Msg>> {
    let namespaces = watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|o| o.managed_fields_mut().clear())
    .map(Msg::Namespace)
    .boxed();
    vec![
        versioned::<Gateway, _>(client.clone(), GATEWAYS, Msg::Gateway),
        versioned::<GatewayClass, _>(client.clone(), GATEWAY_CLASSES, Msg::GatewayClass),
        versioned::<TcpRoute, _>(client.clone(), TCP_ROUTES, Msg::TcpRoute),
        versioned::<UdpRoute, _>(client.clone(), UDP_ROUTES, Msg::UdpRoute),
        versioned::<ReferenceGrant, _>(client.clone(), REFERENCE_GRANTS, Msg::Grant),
        namespaces,
    ]
}

/// What was last sent for a Gateway.
struct SentGateway {
    vips: Vec<DesiredVip>,
}

/// The Gateway half's state, inside [`State`].
#[derive(Default)]
pub struct GatewayState {
    pub gateways: Listed<Gateway>,
    pub classes: Listed<GatewayClass>,
    pub tcp_routes: Listed<TcpRoute>,
    pub udp_routes: Listed<UdpRoute>,
    pub grants: Listed<ReferenceGrant>,
    pub namespaces: Listed<PartialObjectMeta<Namespace>>,
    /// "Not installed" answers in a row, per watch.
    not_installed: HashMap<Watch, u32>,
    /// Every Gateway must be resolved again.
    dirty: bool,
    sent: HashMap<ObjectRef, SentGateway>,
    /// Service -> the Gateways that read backends from it.
    readers: HashMap<ObjectRef, BTreeSet<ObjectRef>>,
    synced_sent: bool,
}

impl GatewayState {
    /// Whether every Gateway API watch has listed (or found its CRD
    /// missing twice).
    pub fn listed(&self) -> bool {
        self.gateways.synced
            && self.classes.synced
            && self.tcp_routes.synced
            && self.udp_routes.synced
            && self.grants.synced
            && self.namespaces.synced
    }

    /// A Service or its EndpointSlices changed.
    pub fn service_changed(&mut self, svc: &ObjectRef) {
        if self.readers.contains_key(svc) {
            self.dirty = true;
        }
    }

    /// A ServicePolicy changed: a listener may have gained or lost one.
    pub fn policies_changed(&mut self) {
        self.dirty = true;
    }

    /// The AddressPools changed: a Gateway's address may be served now,
    /// or no longer.
    pub fn pools_changed(&mut self) {
        self.dirty = true;
    }

    pub fn counts(&self) -> [(Watch, usize, bool); 6] {
        [
            (
                Watch::Gateways,
                self.gateways.items.len(),
                self.gateways.synced,
            ),
            (
                Watch::GatewayClasses,
                self.classes.items.len(),
                self.classes.synced,
            ),
            (
                Watch::TcpRoutes,
                self.tcp_routes.items.len(),
                self.tcp_routes.synced,
            ),
            (
                Watch::UdpRoutes,
                self.udp_routes.items.len(),
                self.udp_routes.synced,
            ),
            (
                Watch::ReferenceGrants,
                self.grants.items.len(),
                self.grants.synced,
            ),
            (
                Watch::Namespaces,
                self.namespaces.items.len(),
                self.namespaces.synced,
            ),
        ]
    }
}

impl State {
    /// One event of a Gateway API watch.
    pub(super) fn handle_gateway<K: Resource>(
        &mut self,
        watch: Watch,
        ev: GwEvent<K>,
        listed: impl Fn(&mut GatewayState) -> &mut Listed<K>,
    ) {
        match ev {
            // The version is the controller's to write at; rivorad reads
            // whichever it is.
            GwEvent::Serving(_) => {}
            GwEvent::Watch(Err(e)) => self.failed(watch, &e),
            GwEvent::Failed(e) => self.failed_text(watch, e),
            GwEvent::NotInstalled => {
                let n = {
                    let n = self.gw.not_installed.entry(watch).or_insert(0);
                    *n += 1;
                    *n
                };
                let w = &mut self.watches[watch as usize];
                w.last_error = Some(format!(
                    "the Gateway API CRDs ({} {GROUP}) are not installed: no Gateway VIPs",
                    w.resource
                ));
                w.last_error_at = now_secs();
                let l = listed(&mut self.gw);
                if n >= 2 && !l.synced {
                    // As an empty list; kept, should objects be cached.
                    l.synced = true;
                    self.gw.dirty = true;
                    self.watches[watch as usize].errors += 1;
                    warn!(
                        resource = self.watches[watch as usize].resource,
                        "the Gateway API CRDs are not installed: no Gateway VIPs until they are"
                    );
                } else {
                    debug!(
                        resource = self.watches[watch as usize].resource,
                        "the Gateway API CRDs are still not installed"
                    );
                }
            }
            GwEvent::Watch(Ok(ev)) => {
                self.gw.not_installed.remove(&watch);
                let mut bad = Vec::new();
                let change = listed(&mut self.gw).apply_read(ev, &mut bad);
                for u in bad {
                    let w = &mut self.watches[watch as usize];
                    w.errors += 1;
                    w.last_error = Some(format!(
                        "{} {} cannot be read: {}",
                        w.resource, u.key, u.error
                    ));
                    w.last_error_at = now_secs();
                    warn!(resource = w.resource, object = %u.key, error = %u.error, "an object the types cannot read: its last readable copy is kept");
                }
                if !matches!(change, Change::None) {
                    self.gw.dirty = true;
                }
            }
        }
    }

    /// An event of the Namespace watch (labels, for `Selector`).
    pub(super) fn handle_namespace(
        &mut self,
        ev: watcher::Result<Event<PartialObjectMeta<Namespace>>>,
    ) {
        match ev {
            Err(e) => self.failed(Watch::Namespaces, &e),
            Ok(ev) => {
                // Pools' namespaceSelectors read the labels too: the
                // namespace's Services are looked at again.
                match self.gw.namespaces.apply(ev) {
                    Change::None => {}
                    Change::One(old, new) => {
                        if old.as_ref().map(|o| o.labels()) != new.as_ref().map(|n| n.labels()) {
                            let ns = old.or(new).map(|n| n.name_any()).unwrap_or_default();
                            let touched: Vec<ObjectRef> = self
                                .services
                                .items
                                .keys()
                                .filter(|k| k.namespace == ns)
                                .cloned()
                                .collect();
                            for k in touched {
                                self.touch(k, None);
                            }
                            self.gw.dirty = true;
                        }
                    }
                    Change::All(_) => self.touch_all(),
                }
            }
        }
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// The stores of both halves, as the Gateway rules read them.
struct View<'a>(&'a State);

impl Cluster for View<'_> {
    fn gateway_classes(&self) -> Vec<&GatewayClass> {
        self.0.gw.classes.items.values().map(|c| &**c).collect()
    }

    fn gateways(&self) -> Vec<&Gateway> {
        self.0.gw.gateways.items.values().map(|g| &**g).collect()
    }

    fn routes(&self) -> Vec<Route> {
        let g = &self.0.gw;
        g.tcp_routes
            .items
            .values()
            .map(|r| Route::from(&**r))
            .chain(g.udp_routes.items.values().map(|r| Route::from(&**r)))
            .collect()
    }

    fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        let ns = self
            .0
            .gw
            .namespaces
            .items
            .get(&ObjectRef::new("", namespace))?;
        Some(ns.metadata.labels.as_ref().unwrap_or(&NO_LABELS))
    }

    fn reference_grants(&self, namespace: &str) -> Vec<&ReferenceGrant> {
        self.0
            .gw
            .grants
            .items
            .iter()
            .filter(|(k, _)| k.namespace == namespace)
            .map(|(_, g)| &**g)
            .collect()
    }

    fn service(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.0
            .services
            .items
            .get(&ObjectRef::new(namespace, name))
            .map(|s| &**s)
    }

    fn endpoint_slices(&self, namespace: &str, service: &str) -> Vec<&EndpointSlice> {
        let st = self.0;
        st.slices_of
            .get(&ObjectRef::new(namespace, service))
            .into_iter()
            .flatten()
            .filter_map(|k| st.slices.items.get(k).map(|s| &**s))
            .collect()
    }

    fn listener_policy(&self, listener: &ListenerRef) -> Option<&ServicePolicy> {
        let p = self.0.choice.policy_for_listener(listener)?;
        self.0.policies.items.get(p).map(|p| &**p)
    }
}

/// Resolve the Gateways again if anything they read changed, and send
/// those whose VIPs changed; after the first such pass, `Synced(Gateway)`.
/// None when the reconciler is gone.
pub(super) fn flush(state: &mut State, tx: &Sender, warner: &Warner) -> Option<()> {
    if !state.gw.dirty && state.gw.synced_sent {
        return Some(());
    }
    state.gw.dirty = false;
    let res = gw::resolve(&View(state));
    let mut wanted: HashMap<ObjectRef, (Vec<DesiredVip>, BTreeSet<ObjectRef>)> = res
        .gateways
        .into_iter()
        .filter(|(_, g)| !g.vips.is_empty())
        .map(|(k, mut g)| {
            // Which endpoints are this node's: every node resolves the
            // same Gateways, and each reaches them its own way.
            let view = View(state);
            let slices: Vec<&EndpointSlice> = g
                .services
                .iter()
                .flat_map(|s| view.endpoint_slices(&s.namespace, &s.name))
                .collect();
            let nodes = endpoint_nodes(&slices);
            let object = ClaimRef::gateway(k.namespace.clone(), k.name.clone());
            let labels = state
                .gw
                .gateways
                .items
                .get(&k)
                .map(|gw| gw.labels().clone())
                .unwrap_or_default();
            for d in &mut g.vips {
                d.refused = state.not_served(&object, &labels, d.vip.addr);
                // The resolution refused a mode that cannot reach every
                // endpoint, so this places them all; were it not so, the
                // VIP is kept with no backend rather than half broken.
                if let Err(why) = place_backends(&mut d.vip, &state.opts.node_name, &nodes, false) {
                    warn!(vip = %d.name, %why, "not programmed");
                    d.vip.backends.clear();
                    d.health.clear();
                }
            }
            (k, (g.vips, g.services))
        })
        .collect();
    let mut keys: BTreeSet<ObjectRef> = wanted.keys().cloned().collect();
    keys.extend(state.gw.sent.keys().cloned());
    let mut readers: HashMap<ObjectRef, BTreeSet<ObjectRef>> = HashMap::new();
    for key in keys {
        let (vips, services) = wanted.remove(&key).unwrap_or_default();
        for s in &services {
            readers.entry(s.clone()).or_default().insert(key.clone());
        }
        let unchanged = match state.gw.sent.get(&key) {
            Some(s) => s.vips == vips,
            None => vips.is_empty(),
        };
        if unchanged {
            continue;
        }
        if vips.is_empty() {
            state.gw.sent.remove(&key);
        } else {
            state
                .gw
                .sent
                .insert(key.clone(), SentGateway { vips: vips.clone() });
        }
        let (ack, applied) = oneshot::channel();
        tx.send(Command::SetDesired {
            owner: Owner::new(SourceKind::Gateway, key.to_string()),
            vips,
            ack: Some(ack),
        })
        .ok()?;
        let gateway = state.gw.gateways.items.get(&key).cloned();
        let warner = warner.clone();
        tokio::spawn(async move {
            let Ok(applied) = applied.await else { return };
            if applied.ok() {
                debug!(gateway = %key, "programmed");
                return;
            }
            warn!(gateway = %key, error = %applied.summary(), "not programmed in full");
            // What the Gateway's owner must know: the controller cannot
            // see a node's dataplane refuse a VIP.
            if let Some(gw) = gateway {
                for (vip, reason) in &applied.failed {
                    warner.gateways.warn(
                        &gw,
                        WARN_NOT_PROGRAMMED,
                        format!("VIP {vip} is not programmed: {reason}"),
                    );
                }
            }
        });
    }
    state.gw.readers = readers;
    if !state.gw.synced_sent {
        tx.send(Command::Synced(SourceKind::Gateway)).ok()?;
        state.gw.synced_sent = true;
        info!(
            gateways = state.gw.sent.len(),
            "Gateway API: first full pass sent; leftovers may now be pruned"
        );
    }
    Some(())
}
