//! The Gateway API half of the controller's plan: addresses for Rivora's
//! Gateways from the same allocator as Services (one table: an address
//! is never a Service's and a Gateway's, unless both share it by key),
//! and the status of GatewayClasses, Gateways, listeners and routes as
//! `rivora_k8s::gateway::status` computes it from one
//! [`rivora_k8s::gateway::resolve`], the rules every node forwards by.
//!
//! The controller resolves with each Gateway's `status.addresses` as it
//! is about to write them, so the listeners' conditions and the
//! addresses go out in one write. Gateway API status never depends on
//! endpoints or policies: that view answers with none. The ServicePolicy
//! status reads both ([`crate::policies`]).
//! Gateway API objects are written whole (their status replaced, at the
//! version the cluster serves, with the `resourceVersion` read): a merge
//! patch cannot remove a list entry the rules dropped.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use rivora_k8s::gateway::api::gatewayclasses::GatewayClass;
use rivora_k8s::gateway::api::gateways::{Gateway, GatewayStatus, GatewayStatusAddresses};
use rivora_k8s::gateway::api::referencegrants::ReferenceGrant;
use rivora_k8s::gateway::api::tcproutes::TcpRoute;
use rivora_k8s::gateway::api::udproutes::UdpRoute;
use rivora_k8s::gateway::{self as gw, reason, Cluster, ListenerRef, Route};
use rivora_k8s::ipam::Outcome;
use rivora_k8s::ServicePolicy;
use rivora_k8s_client::versioned::{Kind, GATEWAYS, GATEWAY_CLASSES, TCP_ROUTES, UDP_ROUTES};
use rivora_k8s_client::{key_of, Key, Listed};
use serde_json::Value;

use crate::policies::Policies;

/// The Gateway API objects the controller holds, and the version each
/// kind is served at (what it writes at).
#[derive(Default)]
pub struct GatewayApi {
    pub classes: Listed<GatewayClass>,
    pub gateways: Listed<Gateway>,
    pub tcp_routes: Listed<TcpRoute>,
    pub udp_routes: Listed<UdpRoute>,
    pub grants: Listed<ReferenceGrant>,
    pub versions: BTreeMap<&'static str, &'static str>,
}

impl GatewayApi {
    pub fn listed(&self) -> bool {
        self.classes.synced
            && self.gateways.synced
            && self.tcp_routes.synced
            && self.udp_routes.synced
            && self.grants.synced
    }

    /// Whether `gw`'s class is Rivora's.
    pub fn rivoras(&self, gw: &Gateway) -> bool {
        self.classes
            .get(&Key::new("", gw.spec.gateway_class_name.as_str()))
            .is_some_and(|c| gw::is_rivora_class(c))
    }
}

/// What the rules read: the controller's copies, Gateways with the
/// addresses about to be written.
pub struct View<'a> {
    pub api: &'a GatewayApi,
    pub gateways: Vec<Gateway>,
    pub services: &'a Listed<Service>,
    pub namespaces: &'a Listed<Namespace>,
    /// Endpoints and policies, for the policies' answers; None for the
    /// Gateway API's own status.
    pub policies: Option<&'a Policies>,
}

impl Cluster for View<'_> {
    fn gateway_classes(&self) -> Vec<&GatewayClass> {
        self.api.classes.items.values().map(|c| &**c).collect()
    }

    fn gateways(&self) -> Vec<&Gateway> {
        self.gateways.iter().collect()
    }

    fn routes(&self) -> Vec<Route> {
        self.api
            .tcp_routes
            .items
            .values()
            .map(|r| Route::from(&**r))
            .chain(
                self.api
                    .udp_routes
                    .items
                    .values()
                    .map(|r| Route::from(&**r)),
            )
            .collect()
    }

    fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces
            .get(&Key::new("", namespace))
            .map(|n| n.labels())
    }

    fn reference_grants(&self, namespace: &str) -> Vec<&ReferenceGrant> {
        self.api
            .grants
            .items
            .values()
            .filter(|g| g.namespace().as_deref() == Some(namespace))
            .map(|g| &**g)
            .collect()
    }

    fn service(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.services.get(&Key::new(namespace, name)).map(|s| &**s)
    }

    fn endpoint_slices(&self, namespace: &str, service: &str) -> Vec<&EndpointSlice> {
        match self.policies {
            Some(p) => p.slices_for(&Key::new(namespace, service)),
            None => Vec::new(),
        }
    }

    fn listener_policy(&self, listener: &ListenerRef) -> Option<&ServicePolicy> {
        let p = self.policies?;
        p.policies
            .get(p.choice.policy_for_listener(listener)?)
            .map(|p| &**p)
    }
}

/// `gw` with `status.addresses` as the outcome gives them.
pub fn with_addresses(gw: &Gateway, outcome: Option<&Outcome>) -> Gateway {
    let mut g = gw.clone();
    let Some(o) = outcome else {
        return g;
    };
    let status = g.status.get_or_insert_with(GatewayStatus::default);
    let addrs: Vec<GatewayStatusAddresses> = o
        .addresses
        .iter()
        .map(|a| GatewayStatusAddresses {
            r#type: Some("IPAddress".into()),
            value: a.to_string(),
            routability: None,
        })
        .collect();
    status.addresses = (!addrs.is_empty()).then_some(addrs);
    g
}

/// A Gateway that got no address says why in `Programmed`, in the
/// allocator's words rather than the rules' generic ones.
pub fn explain_unassigned(res: &mut gw::Resolution, outcomes: &BTreeMap<Key, Outcome>) {
    for (key, r) in res.gateways.iter_mut() {
        let Some(o) = outcomes.get(key) else { continue };
        if r.programmed.status || r.programmed.reason != reason::ADDRESS_NOT_ASSIGNED {
            continue;
        }
        let why: Vec<String> = o.problems.iter().map(ToString::to_string).collect();
        if !why.is_empty() {
            r.programmed.message = why.join("; ");
        }
    }
}

/// A Gateway API object whole, with `status` as given, at `version` of
/// `kind`: the body of a status replace.
pub fn body<K: serde::Serialize>(
    o: &K,
    kind: &Kind,
    version: &str,
    status: &impl serde::Serialize,
) -> Option<Value> {
    let mut v = serde_json::to_value(o).ok()?;
    v["apiVersion"] = Value::String(format!("{}/{version}", kind.group));
    v["kind"] = Value::String(kind.kind.into());
    v["status"] = serde_json::to_value(status).ok()?;
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    Some(v)
}

/// The statuses to write: (target, resourceVersion, body), for Rivora's
/// classes, Gateways and the routes that name them.
pub fn status_writes(
    api: &GatewayApi,
    view: &View<'_>,
    res: &gw::Resolution,
    now: &Time,
) -> Vec<(crate::ipam::Target, String, Value)> {
    use crate::ipam::Target;
    let mut out = Vec::new();
    let rv = |m: &kube::api::ObjectMeta| m.resource_version.clone().unwrap_or_default();
    if let Some(v) = api.versions.get(GATEWAY_CLASSES.kind) {
        for c in api.classes.items.values() {
            if let Some(s) = gw::status::gateway_class_status(c, res, now) {
                if let Some(b) = body(&**c, &GATEWAY_CLASSES, v, &s) {
                    out.push((Target::GatewayClass(c.name_any()), rv(&c.metadata), b));
                }
            }
        }
    }
    if let Some(v) = api.versions.get(GATEWAYS.kind) {
        for g in &view.gateways {
            let key = key_of(g);
            let Some(orig) = api.gateways.get(&key) else {
                continue;
            };
            if !res.gateways.contains_key(&key) {
                continue;
            }
            // The copy carries the addresses to write: compare what it
            // would say with what the object says.
            let wanted = gw::status::gateway_status(g, res, now).or_else(|| g.status.clone());
            if wanted.is_some() && wanted != orig.status {
                if let Some(b) = body(&**orig, &GATEWAYS, v, &wanted) {
                    out.push((Target::Gateway(key), rv(&orig.metadata), b));
                }
            }
        }
    }
    if let Some(v) = api.versions.get(TCP_ROUTES.kind) {
        for r in api.tcp_routes.items.values() {
            if let Some(s) = gw::status::tcp_route_status(r, res, now) {
                if let Some(b) = body(&**r, &TCP_ROUTES, v, &s) {
                    out.push((Target::TcpRoute(key_of(&**r)), rv(&r.metadata), b));
                }
            }
        }
    }
    if let Some(v) = api.versions.get(UDP_ROUTES.kind) {
        for r in api.udp_routes.items.values() {
            if let Some(s) = gw::status::udp_route_status(r, res, now) {
                if let Some(b) = body(&**r, &UDP_ROUTES, v, &s) {
                    out.push((Target::UdpRoute(key_of(&**r)), rv(&r.metadata), b));
                }
            }
        }
    }
    out
}
