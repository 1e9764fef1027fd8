//! Gateway API (Gateway, GatewayClass, ReferenceGrant, TCPRoute, UDPRoute)
//! to the VIPs every node forwards and the status every object should
//! carry. Pure: no API server and no clock. rivorad hands in what its
//! watches hold and sends [`GatewayResult::vips`] to its reconciler as
//! `SetDesired { owner: gateway ns/name }`; rivora-controller hands in the
//! same objects and writes what [`status`] computes. Both read one
//! [`Resolution`], so what a node forwards and what the status says come
//! from the same rules.
//!
//! The rules, each a row of the tests (`tests.rs`), as the Gateway API
//! specification (v1.7.0; GEP-2644 for TCPRoute) states them:
//!
//! - **Which Gateways.** A GatewayClass is Rivora's when its
//!   `controllerName` is [`CONTROLLER_NAME`]; a Gateway is Rivora's when its
//!   `gatewayClassName` names such a class. Rivora takes no parameters: a
//!   class with `parametersRef` is `Accepted=False InvalidParameters`, and
//!   so is a Gateway with `infrastructure.parametersRef`. A Gateway asking
//!   for a `spec.addresses` entry of a type other than `IPAddress` is
//!   `Accepted=False UnsupportedAddress`.
//! - **Listeners to VIPs.** One VIP per (address in `status.addresses` of
//!   type `IPAddress`, listener port, protocol) for each listener of
//!   protocol `TCP` or `UDP` that is accepted and not conflicted. Another
//!   protocol is `Accepted=False UnsupportedProtocol`. Two TCP listeners on
//!   one port, two UDP listeners on one port, or a TCP listener on the port
//!   of an HTTP, HTTPS or TLS listener are all `Conflicted=True
//!   ProtocolConflict` and get no VIP (they stay `Accepted=True`, as the
//!   GEP says); TCP and UDP on one port do not conflict. A listener of a
//!   younger Gateway on an (address, port, protocol) an older Gateway's
//!   listener holds is `Accepted=False PortUnavailable`. A Gateway with no
//!   address yet is `Programmed=False AddressNotAssigned`, its listeners
//!   `Programmed=False Pending`. A listener with no route still gets its
//!   VIPs, with no backend: its port is Rivora's, and a connection to it
//!   is dropped rather than handed to the node.
//! - **Route kinds.** A TCP listener takes TCPRoutes, a UDP listener
//!   UDPRoutes. `allowedRoutes.kinds` naming anything else is
//!   `ResolvedRefs=False InvalidRouteKinds`, and `supportedKinds` keeps the
//!   valid ones; a listener left with none is `Programmed=False Invalid`.
//! - **Attachment.** A route's `parentRef` (group `gateway.networking.k8s.io`,
//!   kind `Gateway`, namespace defaulting to the route's) to a Rivora
//!   Gateway selects the listeners whose name is `sectionName` and whose
//!   port is `port` (each when set). None: `Accepted=False
//!   NoMatchingParent`. Of those, the ones whose `allowedRoutes` admit the
//!   route's namespace (`Same`, the default; `All`; `Selector`, against the
//!   namespace's labels) and kind: none, `Accepted=False
//!   NotAllowedByListeners`; else the route is attached to each and
//!   `Accepted=True`. Listener status does not enter (a conflicted
//!   listener still counts its routes in `attachedRoutes`). A parentRef to
//!   anything else, or to a Gateway that is not Rivora's, is another
//!   controller's and gets no status from Rivora.
//! - **Several routes on one listener.** A TCP or UDP listener cannot tell
//!   connections apart, so the oldest route (`creationTimestamp`, then
//!   `namespace/name`) gets the traffic. GEP-2644 says every attached route
//!   stays `Accepted=True` (a future reason may say which is superseded),
//!   and every one counts in `attachedRoutes`.
//! - **Backends.** Each `backendRef` (every rule's: a v1alpha2 route may
//!   have several rules, and their backends are one weighted set) must be
//!   a core `Service` (else `ResolvedRefs=False InvalidKind`), with a
//!   `port` the Service has for the route's protocol (else
//!   `BackendNotFound`, as for a Service that does not exist), in the
//!   route's namespace or in one whose ReferenceGrant admits the route's
//!   kind and namespace to that Service (else `RefNotPermitted`). The
//!   Service's EndpointSlices give the backends as for a LoadBalancer
//!   Service ([`crate::translate`]: ready endpoints, terminating ones
//!   draining with weight 0, the VIP's family). `weight` (default 1) is
//!   the share of new connections for the whole Service, spread evenly
//!   over its ready endpoints, so the Maglev weights across Services are
//!   `weight / ready endpoints`, scaled to whole numbers. A route whose
//!   backends all fail keeps its VIPs with no backend.
//! - **ServicePolicy.** A policy's `listeners` entry (its own namespace's
//!   Gateway, by listener name) sets the listener's VIPs' mode, SYN rate
//!   limit, affinity and health check, as for a Service. Each node places
//!   the backends as for a Service ([`crate::translate::place_backends`]);
//!   a policy a listener's endpoints cannot be served under (a DSR mode
//!   and an endpoint on no known node on another port, or
//!   `preserveClientIP` and an endpoint on no known node) is not applied
//!   ([`ListenerResult::policy`]).
//!
//! Not done: the spec asks that the share of connections an invalid
//! backendRef would have taken be rejected; Rivora gives the valid
//! backends all of it (the dataplane has no "reject" backend), and rejects
//! only when no backend is valid. Hostnames do not apply to TCP and UDP.

pub mod api;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;
use rivora_model::desired::{DesiredVip, Owner, SourceKind, TrafficPolicy};
use rivora_model::health::HealthCheckSpec;
use rivora_model::model::{Affinity, Backend, Mode, Ports, Protocol, Vip, MAX_WEIGHT};

use self::api::gatewayclasses::GatewayClass;
use self::api::gateways::{Gateway, GatewayListeners};
use self::api::referencegrants::ReferenceGrant;
use self::api::tcproutes::TcpRoute;
use self::api::udproutes::UdpRoute;
use crate::policy::{check_policy, ObjectRef, ServicePolicy, REASON_MODE_NOT_APPLICABLE};
use crate::translate::{endpoint_nodes, protocol, service_port_backends, vip_address, PolicyUse};

/// Rivora's GatewayClass `controllerName`.
pub const CONTROLLER_NAME: &str = "rivora.io/gateway-controller";
/// The Gateway API's group.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// Condition types, as the specification names them.
pub const ACCEPTED: &str = "Accepted";
pub const PROGRAMMED: &str = "Programmed";
pub const RESOLVED_REFS: &str = "ResolvedRefs";
pub const CONFLICTED: &str = "Conflicted";

/// Condition reasons, as the specification names them.
pub mod reason {
    pub const ACCEPTED: &str = "Accepted";
    pub const PROGRAMMED: &str = "Programmed";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    pub const INVALID: &str = "Invalid";
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
    pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
    pub const ADDRESS_NOT_ASSIGNED: &str = "AddressNotAssigned";
    pub const PENDING: &str = "Pending";
    pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    pub const PORT_UNAVAILABLE: &str = "PortUnavailable";
    pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
    pub const NO_CONFLICTS: &str = "NoConflicts";
    pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
    pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
    pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
    pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    pub const INVALID_KIND: &str = "InvalidKind";
    pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
}

/// A condition as the rules decide it: what [`status`] writes, with the
/// object's generation and a transition time added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    /// `True` or `False`.
    pub status: bool,
    /// CamelCase, one of [`reason`].
    pub reason: &'static str,
    pub message: String,
}

impl Cond {
    pub fn yes(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: true,
            reason,
            message: message.into(),
        }
    }

    pub fn no(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: false,
            reason,
            message: message.into(),
        }
    }
}

impl fmt::Display for Cond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.status { "True" } else { "False" };
        write!(f, "{s} {}: {}", self.reason, self.message)
    }
}

/// The two route kinds Rivora serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    Tcp,
    Udp,
}

impl RouteKind {
    /// The API's kind.
    pub fn kind(self) -> &'static str {
        match self {
            RouteKind::Tcp => "TCPRoute",
            RouteKind::Udp => "UDPRoute",
        }
    }

    /// The listener protocol that takes this kind.
    pub fn protocol(self) -> Protocol {
        match self {
            RouteKind::Tcp => Protocol::Tcp,
            RouteKind::Udp => Protocol::Udp,
        }
    }

    fn from_kind(group: &str, kind: &str) -> Option<Self> {
        match (group, kind) {
            (GROUP, "TCPRoute") => Some(RouteKind::Tcp),
            (GROUP, "UDPRoute") => Some(RouteKind::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for RouteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// A route by kind and namespaced name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteRef {
    pub kind: RouteKind,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for RouteRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A route's `parentRefs[]` entry as written (both kinds have the same
/// fields). Status echoes it unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParentRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub section_name: Option<String>,
    pub port: Option<i32>,
}

/// A `backendRefs[]` entry of any rule of a route.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackendRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub port: Option<i32>,
    pub weight: Option<i32>,
}

/// A TCPRoute or UDPRoute, as the rules read it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Route {
    pub kind: Option<RouteKind>,
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    pub created: Option<Time>,
    pub parent_refs: Vec<ParentRef>,
    /// Every rule's, in order, with where it was written
    /// (`rules[0].backendRefs[1]`).
    pub backend_refs: Vec<(String, BackendRef)>,
}

impl Route {
    pub fn key(&self) -> RouteRef {
        RouteRef {
            kind: self.kind.unwrap_or(RouteKind::Tcp),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

macro_rules! route_from {
    ($ty:ty, $kind:expr) => {
        impl From<&$ty> for Route {
            fn from(r: &$ty) -> Self {
                Route {
                    kind: Some($kind),
                    namespace: r.namespace().unwrap_or_default(),
                    name: r.name_any(),
                    generation: r.metadata.generation,
                    created: r.metadata.creation_timestamp.clone(),
                    parent_refs: r
                        .spec
                        .parent_refs
                        .iter()
                        .flatten()
                        .map(|p| ParentRef {
                            group: p.group.clone(),
                            kind: p.kind.clone(),
                            namespace: p.namespace.clone(),
                            name: p.name.clone(),
                            section_name: p.section_name.clone(),
                            port: p.port,
                        })
                        .collect(),
                    backend_refs: r
                        .spec
                        .rules
                        .iter()
                        .enumerate()
                        .flat_map(|(i, rule)| {
                            rule.backend_refs.iter().enumerate().map(move |(j, b)| {
                                (
                                    format!("rules[{i}].backendRefs[{j}]"),
                                    BackendRef {
                                        group: b.group.clone(),
                                        kind: b.kind.clone(),
                                        namespace: b.namespace.clone(),
                                        name: b.name.clone(),
                                        port: b.port,
                                        weight: b.weight,
                                    },
                                )
                            })
                        })
                        .collect(),
                }
            }
        }
    };
}
route_from!(TcpRoute, RouteKind::Tcp);
route_from!(UdpRoute, RouteKind::Udp);

/// What the rules read. rivorad implements it over its watches' stores,
/// rivora-controller over its own; [`Snapshot`] is a ready-made one.
pub trait Cluster {
    /// Every GatewayClass (any controller's).
    fn gateway_classes(&self) -> Vec<&GatewayClass>;
    /// Every Gateway (any class).
    fn gateways(&self) -> Vec<&Gateway>;
    /// Every TCPRoute and UDPRoute.
    fn routes(&self) -> Vec<Route>;
    /// A namespace's labels; None when the namespace is not known.
    fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>>;
    /// The ReferenceGrants of one namespace.
    fn reference_grants(&self, namespace: &str) -> Vec<&ReferenceGrant>;
    fn service(&self, namespace: &str, name: &str) -> Option<&Service>;
    /// The EndpointSlices of a Service (the rules check the label again).
    fn endpoint_slices(&self, namespace: &str, service: &str) -> Vec<&EndpointSlice>;
    /// The ServicePolicy that governs one listener (the oldest naming it,
    /// [`crate::policy::choose_policies`]).
    fn listener_policy(&self, listener: &ListenerRef) -> Option<&ServicePolicy>;
}

/// A listener of a Gateway: what a ServicePolicy names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListenerRef {
    pub namespace: String,
    pub gateway: String,
    pub listener: String,
}

impl fmt::Display for ListenerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Gateway {}/{} listener {}",
            self.namespace, self.gateway, self.listener
        )
    }
}

/// A GatewayClass of Rivora's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassResult {
    pub generation: Option<i64>,
    pub accepted: Cond,
}

/// One listener of a Rivora Gateway, in spec order.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerResult {
    pub name: String,
    pub port: i32,
    /// As written (`TCP`, `HTTP`, ...).
    pub protocol: String,
    pub accepted: Cond,
    pub conflicted: Cond,
    pub resolved_refs: Cond,
    pub programmed: Cond,
    /// The route kinds it takes (for `supportedKinds`).
    pub supported_kinds: Vec<RouteKind>,
    /// Routes attached to it (`attachedRoutes` is their number), oldest
    /// first: the first gets the traffic.
    pub routes: Vec<RouteRef>,
    /// The ServicePolicy applied to its VIPs, or why not.
    pub policy: PolicyUse,
    /// The policy that names it, if any.
    pub policy_ref: Option<ObjectRef>,
}

impl ListenerResult {
    /// What `attachedRoutes` should say.
    pub fn attached_routes(&self) -> i32 {
        i32::try_from(self.routes.len()).unwrap_or(i32::MAX)
    }
}

/// One Rivora Gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayResult {
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    pub accepted: Cond,
    pub programmed: Cond,
    /// The usable addresses of `status.addresses`.
    pub addresses: Vec<IpAddr>,
    pub listeners: Vec<ListenerResult>,
    /// What every node forwards for it, sorted by VIP key.
    pub vips: Vec<DesiredVip>,
    /// The Services its listeners' routes name, found or not (to know
    /// what a Service or EndpointSlice change touches).
    pub services: BTreeSet<ObjectRef>,
}

impl GatewayResult {
    /// The owner its VIPs are claimed under (`gateway ns/name`).
    pub fn owner(&self) -> Owner {
        Owner::new(
            SourceKind::Gateway,
            format!("{}/{}", self.namespace, self.name),
        )
    }
}

/// A route's verdict for one of its parentRefs to a Rivora Gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentResult {
    /// The index in `spec.parentRefs`.
    pub index: usize,
    pub parent_ref: ParentRef,
    pub accepted: Cond,
    pub resolved_refs: Cond,
    /// The listeners it is attached to.
    pub listeners: Vec<String>,
}

/// A route with at least one parentRef to a Rivora Gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteResult {
    pub generation: Option<i64>,
    pub parents: Vec<ParentResult>,
}

/// Everything the rules decided, for one moment of the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolution {
    /// Rivora's GatewayClasses, by name.
    pub classes: BTreeMap<String, ClassResult>,
    /// Rivora's Gateways.
    pub gateways: BTreeMap<ObjectRef, GatewayResult>,
    /// Routes with a parentRef to a Rivora Gateway.
    pub routes: BTreeMap<RouteRef, RouteResult>,
}

/// The order of precedence: older first, then by namespace/name, so every
/// node and every controller replica agrees. An object not yet stored (no
/// timestamp) is the youngest.
fn age_order(a: (Option<&Time>, &str, &str), b: (Option<&Time>, &str, &str)) -> std::cmp::Ordering {
    let ta = a.0.map(|t| &t.0);
    let tb = b.0.map(|t| &t.0);
    match (ta, tb) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
    .then_with(|| (a.1, a.2).cmp(&(b.1, b.2)))
}

/// Whether a GatewayClass is Rivora's.
pub fn is_rivora_class(class: &GatewayClass) -> bool {
    class.spec.controller_name == CONTROLLER_NAME
}

fn class_result(class: &GatewayClass) -> ClassResult {
    let accepted = match &class.spec.parameters_ref {
        Some(p) => Cond::no(
            reason::INVALID_PARAMETERS,
            format!(
                "Rivora's GatewayClass takes no parameters, but parametersRef names {} {}",
                p.kind, p.name
            ),
        ),
        None => Cond::yes(reason::ACCEPTED, "handled by rivora.io/gateway-controller"),
    };
    ClassResult {
        generation: class.metadata.generation,
        accepted,
    }
}

/// The TCP-based protocols a TCP listener cannot share a port with.
fn tcp_based(protocol: &str) -> bool {
    matches!(protocol, "TCP" | "HTTP" | "HTTPS" | "TLS")
}

fn listener_protocol(protocol: &str) -> Option<Protocol> {
    match protocol {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        _ => None,
    }
}

/// Why `route_ns` may not attach to `listener` of a Gateway in `gw_ns`,
/// or None when it may (namespaces only: kinds are checked apart).
fn namespace_refusal(
    cluster: &impl Cluster,
    listener: &GatewayListeners,
    gw_ns: &str,
    route_ns: &str,
) -> Option<String> {
    use self::api::gateways::GatewayListenersAllowedRoutesNamespacesFrom as From;
    let ns = listener
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    match ns.and_then(|n| n.from.clone()).unwrap_or(From::Same) {
        From::All => None,
        From::Same if route_ns == gw_ns => None,
        From::Same => Some(format!(
            "listener {} admits routes of its own namespace {gw_ns} only",
            listener.name
        )),
        From::Selector => {
            let sel = ns.and_then(|n| n.selector.as_ref()).map(|s| LabelSelector {
                match_labels: s.match_labels.clone(),
                match_expressions: s.match_expressions.as_ref().map(|es| {
                    es.iter()
                        .map(|e| k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                            key: e.key.clone(),
                            operator: e.operator.clone(),
                            values: e.values.clone(),
                        })
                        .collect()
                }),
            });
            let sel = match sel.map(Selector::try_from) {
                None => {
                    return Some(format!(
                        "listener {} admits namespaces by selector but has none",
                        listener.name
                    ))
                }
                Some(Err(e)) => {
                    return Some(format!(
                        "listener {}'s namespace selector is invalid: {}",
                        listener.name, e.0
                    ))
                }
                Some(Ok(s)) => s,
            };
            let empty = BTreeMap::new();
            let labels = cluster.namespace_labels(route_ns).unwrap_or(&empty);
            if sel.matches(labels) {
                None
            } else {
                Some(format!(
                    "listener {}'s namespace selector does not select namespace {route_ns}",
                    listener.name
                ))
            }
        }
    }
}

/// The kinds a listener takes, and what its `allowedRoutes.kinds` names
/// that it cannot take.
fn listener_kinds(l: &GatewayListeners) -> (Vec<RouteKind>, Vec<String>) {
    let native: Vec<RouteKind> = match l.protocol.as_str() {
        "TCP" => vec![RouteKind::Tcp],
        "UDP" => vec![RouteKind::Udp],
        _ => Vec::new(),
    };
    let listed = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.kinds.as_deref())
        .unwrap_or(&[]);
    if listed.is_empty() {
        return (native, Vec::new());
    }
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for k in listed {
        let group = k.group.as_deref().unwrap_or(GROUP);
        match RouteKind::from_kind(group, &k.kind) {
            Some(rk) if native.contains(&rk) => {
                if !ok.contains(&rk) {
                    ok.push(rk)
                }
            }
            _ => bad.push(if group == GROUP {
                k.kind.clone()
            } else {
                format!("{}.{group}", k.kind)
            }),
        }
    }
    (ok, bad)
}

/// One backendRef resolved: the Service port to read endpoints from.
#[derive(Debug, Clone)]
struct Resolved<'a> {
    service: &'a Service,
    key: ObjectRef,
    port_name: String,
    weight: u32,
}

/// Resolve every backendRef of a route: ResolvedRefs and the refs that
/// passed.
fn resolve_backends<'a>(cluster: &'a impl Cluster, route: &Route) -> (Cond, Vec<Resolved<'a>>) {
    let kind = route.kind.unwrap_or(RouteKind::Tcp);
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    let mut out = Vec::new();
    for (at, b) in &route.backend_refs {
        let group = b.group.as_deref().unwrap_or("");
        let k = b.kind.as_deref().unwrap_or("Service");
        if !group.is_empty() || k != "Service" {
            let gk = if group.is_empty() {
                k.to_string()
            } else {
                format!("{k}.{group}")
            };
            problems.push((
                reason::INVALID_KIND,
                format!("{at}: {gk} is not a kind Rivora forwards to (Service only)"),
            ));
            continue;
        }
        let ns = b
            .namespace
            .clone()
            .unwrap_or_else(|| route.namespace.clone());
        if ns != route.namespace && !granted(cluster, kind, &route.namespace, &ns, &b.name) {
            problems.push((
                reason::REF_NOT_PERMITTED,
                format!(
                    "{at}: Service {ns}/{} is in another namespace and no ReferenceGrant in {ns} admits {kind}s from {}",
                    b.name, route.namespace
                ),
            ));
            continue;
        }
        let Some(port) = b.port else {
            problems.push((
                reason::BACKEND_NOT_FOUND,
                format!(
                    "{at}: Service {ns}/{} has no port given (port is required)",
                    b.name
                ),
            ));
            continue;
        };
        let Some(svc) = cluster.service(&ns, &b.name) else {
            problems.push((
                reason::BACKEND_NOT_FOUND,
                format!("{at}: Service {ns}/{} does not exist", b.name),
            ));
            continue;
        };
        let want = kind.protocol();
        let sp = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .find(|p| p.port == port && protocol(p.protocol.as_deref()) == Ok(want));
        let Some(sp) = sp else {
            problems.push((
                reason::BACKEND_NOT_FOUND,
                format!(
                    "{at}: Service {ns}/{} has no {} port {port}",
                    b.name,
                    if want == Protocol::Udp { "UDP" } else { "TCP" }
                ),
            ));
            continue;
        };
        out.push(Resolved {
            service: svc,
            key: ObjectRef::new(ns.clone(), b.name.clone()),
            port_name: sp.name.clone().unwrap_or_default(),
            weight: u32::try_from(b.weight.unwrap_or(1))
                .unwrap_or(0)
                .min(MAX_WEIGHT),
        });
    }
    let cond = match problems.first() {
        None => Cond::yes(reason::RESOLVED_REFS, "every backendRef is resolved"),
        Some((r, _)) => Cond::no(
            r,
            problems
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    (cond, out)
}

/// Whether a ReferenceGrant in `target_ns` lets `kind`s of `from_ns` name
/// Service `name` there.
fn granted(
    cluster: &impl Cluster,
    kind: RouteKind,
    from_ns: &str,
    target_ns: &str,
    name: &str,
) -> bool {
    cluster.reference_grants(target_ns).iter().any(|g| {
        let from = g
            .spec
            .from
            .iter()
            .any(|f| f.group == GROUP && f.kind == kind.kind() && f.namespace == from_ns);
        let to = g.spec.to.iter().any(|t| {
            t.group.is_empty() && t.kind == "Service" && t.name.as_deref().is_none_or(|n| n == name)
        });
        from && to
    })
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The backends of one VIP from a route's resolved refs: each ref's
/// weight is its Service's share, spread evenly over its ready endpoints
/// (`weight / ready`, made whole with the least common multiple of the
/// ready counts, then scaled under [`MAX_WEIGHT`] if it must be).
/// Draining endpoints and those of a weight-0 ref stay with weight 0: no
/// new flows, established ones keep their backend.
fn route_backends(
    cluster: &impl Cluster,
    refs: &[Resolved<'_>],
    vip: IpAddr,
    proto: Protocol,
) -> Vec<Backend> {
    let per_ref: Vec<(u32, Vec<Backend>)> = refs
        .iter()
        .map(|r| {
            let slices = cluster.endpoint_slices(&r.key.namespace, &r.key.name);
            (
                r.weight,
                service_port_backends(r.service, &slices, vip, &r.port_name, proto),
            )
        })
        .collect();
    let ready = |bs: &[Backend]| bs.iter().filter(|b| b.weight > 0).count() as u64;
    let mut lcm: u64 = 1;
    for (w, bs) in &per_ref {
        let n = ready(bs);
        if *w > 0 && n > 0 {
            lcm = lcm / gcd(lcm, n) * n;
            // Past this the exact form is too big to matter: scaled below.
            lcm = lcm.min(1 << 40);
        }
    }
    let mut raw: BTreeMap<(IpAddr, u16), u128> = BTreeMap::new();
    for (w, bs) in &per_ref {
        let n = ready(bs);
        for b in bs {
            let share = if b.weight > 0 && *w > 0 && n > 0 {
                u128::from(*w) * u128::from(lcm / n)
            } else {
                0
            };
            // The same endpoint behind two refs takes both shares.
            *raw.entry((b.addr, b.port)).or_insert(0) += share;
        }
    }
    let max = raw.values().copied().max().unwrap_or(0);
    let g = raw
        .values()
        .copied()
        .filter(|w| *w > 0)
        .fold(0u128, |a, b| {
            if a == 0 {
                b
            } else {
                u128::from(gcd(a as u64, b as u64))
            }
        });
    raw.into_iter()
        .map(|((addr, port), w)| {
            let weight = if w == 0 {
                0
            } else if max / g.max(1) <= u128::from(MAX_WEIGHT) {
                (w / g.max(1)) as u32
            } else {
                ((w * u128::from(MAX_WEIGHT)) / max).max(1) as u32
            };
            Backend {
                addr,
                port,
                weight,
                mac: None,
                mode: None,
                node: None,
            }
        })
        .collect()
}

/// Settle everything: which objects are Rivora's, attachment, conflicts,
/// backends, VIPs and every condition. Deterministic for a given cluster
/// (input order does not matter), so every node and every controller
/// replica computes the same.
pub fn resolve(cluster: &impl Cluster) -> Resolution {
    let mut res = Resolution::default();
    for c in cluster.gateway_classes() {
        if is_rivora_class(c) {
            res.classes.insert(c.name_any(), class_result(c));
        }
    }
    let mut gateways: Vec<&Gateway> = cluster
        .gateways()
        .into_iter()
        .filter(|g| res.classes.contains_key(&g.spec.gateway_class_name))
        .collect();
    let gw_ns = |g: &Gateway| g.namespace().unwrap_or_default();
    gateways.sort_by(|a, b| {
        age_order(
            (
                a.metadata.creation_timestamp.as_ref(),
                &gw_ns(a),
                &a.name_any(),
            ),
            (
                b.metadata.creation_timestamp.as_ref(),
                &gw_ns(b),
                &b.name_any(),
            ),
        )
    });

    // Routes, oldest first: attachment fills each listener's list in
    // precedence order.
    let mut routes = cluster.routes();
    routes.sort_by(|a, b| {
        age_order(
            (a.created.as_ref(), &a.namespace, &a.name),
            (b.created.as_ref(), &b.namespace, &b.name),
        )
    });

    // (address, port, protocol) -> the Gateway and listener that hold it:
    // the oldest Gateway's.
    let mut held: BTreeMap<(IpAddr, i32, Protocol), (ObjectRef, String)> = BTreeMap::new();
    for gw in &gateways {
        let key = ObjectRef::new(gw_ns(gw), gw.name_any());
        let class = &res.classes[&gw.spec.gateway_class_name];
        let result = gateway_result(gw, class, &gw.spec.gateway_class_name, &mut held, &key);
        res.gateways.insert(key, result);
    }

    // Attachment.
    let mut resolved: BTreeMap<RouteRef, (Cond, Vec<Resolved<'_>>)> = BTreeMap::new();
    for route in &routes {
        let rkey = route.key();
        let kind = route.kind.unwrap_or(RouteKind::Tcp);
        let mut parents = Vec::new();
        for (index, p) in route.parent_refs.iter().enumerate() {
            let group = p.group.as_deref().unwrap_or(GROUP);
            let pk = p.kind.as_deref().unwrap_or("Gateway");
            if group != GROUP || pk != "Gateway" {
                continue;
            }
            let ns = p
                .namespace
                .clone()
                .unwrap_or_else(|| route.namespace.clone());
            let gkey = ObjectRef::new(ns.clone(), p.name.clone());
            let Some(gw) = gateways
                .iter()
                .find(|g| gw_ns(g) == ns && g.name_any() == p.name)
            else {
                continue;
            };
            let Some(result) = res.gateways.get_mut(&gkey) else {
                continue;
            };
            let (resolved_refs, _) = resolved
                .entry(rkey.clone())
                .or_insert_with(|| resolve_backends(cluster, route))
                .clone();
            let candidates: Vec<usize> = gw
                .spec
                .listeners
                .iter()
                .enumerate()
                .filter(|(_, l)| {
                    p.section_name.as_deref().is_none_or(|s| s == l.name)
                        && p.port.is_none_or(|port| port == l.port)
                })
                .map(|(i, _)| i)
                .collect();
            let mut attached = Vec::new();
            let mut refusals = Vec::new();
            for &i in &candidates {
                let l = &gw.spec.listeners[i];
                let lr = &result.listeners[i];
                if !lr.supported_kinds.contains(&kind) {
                    refusals.push(format!(
                        "listener {} ({}) does not take {kind}s",
                        l.name, l.protocol
                    ));
                    continue;
                }
                if let Some(why) = namespace_refusal(cluster, l, &ns, &route.namespace) {
                    refusals.push(why);
                    continue;
                }
                attached.push(i);
            }
            let accepted = if candidates.is_empty() {
                let mut what = Vec::new();
                if let Some(s) = &p.section_name {
                    what.push(format!("named {s}"));
                }
                if let Some(port) = p.port {
                    what.push(format!("on port {port}"));
                }
                Cond::no(
                    reason::NO_MATCHING_PARENT,
                    format!("Gateway {gkey} has no listener {}", what.join(" ")),
                )
            } else if attached.is_empty() {
                Cond::no(reason::NOT_ALLOWED_BY_LISTENERS, refusals.join("; "))
            } else {
                let names: Vec<&str> = attached
                    .iter()
                    .map(|&i| gw.spec.listeners[i].name.as_str())
                    .collect();
                Cond::yes(
                    reason::ACCEPTED,
                    format!("attached to listener {}", names.join(", ")),
                )
            };
            for &i in &attached {
                let lr = &mut result.listeners[i];
                if !lr.routes.contains(&rkey) {
                    lr.routes.push(rkey.clone());
                }
            }
            parents.push(ParentResult {
                index,
                parent_ref: p.clone(),
                accepted,
                resolved_refs,
                listeners: attached
                    .iter()
                    .map(|&i| gw.spec.listeners[i].name.clone())
                    .collect(),
            });
        }
        if !parents.is_empty() {
            res.routes.insert(
                rkey,
                RouteResult {
                    generation: route.generation,
                    parents,
                },
            );
        }
    }

    // VIPs, from each listener's first route.
    let by_key: BTreeMap<RouteRef, &Route> = routes.iter().map(|r| (r.key(), r)).collect();
    for gw in &gateways {
        let key = ObjectRef::new(gw_ns(gw), gw.name_any());
        let Some(result) = res.gateways.get_mut(&key) else {
            continue;
        };
        if !result.accepted.status {
            continue;
        }
        let mut vips = Vec::new();
        let mut services = BTreeSet::new();
        for (i, l) in gw.spec.listeners.iter().enumerate() {
            let lr = &mut result.listeners[i];
            let Some(proto) = listener_protocol(&l.protocol) else {
                continue;
            };
            if !lr.accepted.status || lr.conflicted.status || lr.supported_kinds.is_empty() {
                continue;
            }
            let Ok(port) = u16::try_from(l.port) else {
                continue;
            };
            let refs: &[Resolved<'_>] = lr
                .routes
                .first()
                .and_then(|r| resolved.get(r))
                .map_or(&[], |(_, refs)| refs.as_slice());
            // Every Service the route names, resolved or not: one that
            // appears, or gains endpoints, must bring the Gateway back.
            if let Some(route) = lr.routes.first().and_then(|r| by_key.get(r)) {
                for (_, b) in &route.backend_refs {
                    if b.group.as_deref().unwrap_or("").is_empty()
                        && b.kind.as_deref().unwrap_or("Service") == "Service"
                    {
                        let ns = b
                            .namespace
                            .clone()
                            .unwrap_or_else(|| route.namespace.clone());
                        services.insert(ObjectRef::new(ns, b.name.clone()));
                    }
                }
            }
            let lref = ListenerRef {
                namespace: key.namespace.clone(),
                gateway: key.name.clone(),
                listener: l.name.clone(),
            };
            let policy = cluster.listener_policy(&lref);
            lr.policy_ref =
                policy.map(|p| ObjectRef::new(p.namespace().unwrap_or_default(), p.name_any()));
            let (effective, mut used) = match policy.map(|p| check_policy(&p.spec)) {
                None => (None, PolicyUse::None),
                Some(Ok(e)) => (Some(e), PolicyUse::Applied),
                Some(Err(issue)) => (None, PolicyUse::Rejected(issue)),
            };
            // Whether the rest of the policy applies or not. Its CRD
            // admits prefixes only, so there is nothing to warn of here.
            let source_ranges =
                policy.and_then(|p| crate::source_ranges::policy_ranges(p, &mut Vec::new()));
            let mut built = Vec::new();
            for &addr in &result.addresses {
                let backends = route_backends(cluster, refs, addr, proto);
                built.push((addr, backends));
            }
            let mut effective = effective;
            if let Some(e) = &mut effective {
                // Each node places the backends (translate::place_backends):
                // an endpoint on a node by DSR across nodes, which NATs
                // there; an endpoint on no known node by the mode itself,
                // so it must serve the listener's port, and cannot have
                // its client's address kept under NAT. Every node reads
                // the same slices, so all of them agree on a refusal.
                let mode = e.mode.unwrap_or(Mode::Nat);
                let nodes: BTreeMap<IpAddr, String> = refs
                    .iter()
                    .flat_map(|r| {
                        endpoint_nodes(&cluster.endpoint_slices(&r.key.namespace, &r.key.name))
                    })
                    .collect();
                let homeless = |b: &&Backend| !nodes.contains_key(&b.addr);
                let mut all = built.iter().flat_map(|(_, bs)| bs.iter());
                let issue = if e.preserve_client_ip && mode == Mode::Nat {
                    all.find(homeless).map(|b| {
                        format!(
                            "preserveClientIP cannot serve {lref}: endpoint {} has no nodeName, and its client's address can only be kept by DSR across nodes, to the endpoint's node",
                            b.addr
                        )
                    })
                } else if matches!(mode, Mode::Dsr | Mode::L3Dsr) {
                    all.find(|b| homeless(b) && b.port != port).map(|b| {
                        format!(
                            "mode {mode} keeps the destination port for an endpoint on no known node, but {lref} (port {port}) sends to {} port {}",
                            b.addr, b.port
                        )
                    })
                } else {
                    None
                };
                if let Some(message) = issue {
                    used = PolicyUse::Rejected(crate::policy::PolicyIssue {
                        reason: REASON_MODE_NOT_APPLICABLE,
                        message,
                    });
                    effective = None;
                } else if e.preserve_client_ip && mode == Mode::Nat {
                    // The VIP says it: this node's endpoints by NAT, the
                    // others' by the tunnel to their node.
                    e.mode = Some(Mode::L3Dsr);
                }
            }
            lr.policy = used;
            let mode = effective.as_ref().and_then(|e| e.mode).unwrap_or(Mode::Nat);
            let affinity = effective
                .as_ref()
                .and_then(|e| e.affinity)
                .unwrap_or(Affinity::None);
            let rate_limit = effective.as_ref().and_then(|e| e.rate_limit);
            let health: Option<Arc<HealthCheckSpec>> =
                effective.as_ref().and_then(|e| e.health.clone());
            for (addr, backends) in built {
                vips.push(DesiredVip {
                    name: format!("{}/{}:{}", key.namespace, key.name, l.name),
                    health: vec![health.clone(); backends.len()],
                    traffic_policy: TrafficPolicy::Cluster,
                    // Pools are the node's to check (rivorad's source).
                    refused: None,
                    vip: Vip {
                        addr,
                        ports: Ports::One(port),
                        proto,
                        mode,
                        affinity,
                        rate_limit,
                        source_ranges: source_ranges.clone(),
                        backends,
                    },
                });
            }
        }
        vips.sort_by_key(|a| a.vip.key());
        result.vips = vips;
        result.services = services;
    }
    res
}

/// One Gateway's own verdicts and its listeners before attachment.
fn gateway_result(
    gw: &Gateway,
    class: &ClassResult,
    class_name: &str,
    held: &mut BTreeMap<(IpAddr, i32, Protocol), (ObjectRef, String)>,
    key: &ObjectRef,
) -> GatewayResult {
    // Addresses the controller wrote; what cannot be a VIP is left out
    // and said in Programmed.
    let mut addresses = Vec::new();
    let mut unusable = Vec::new();
    for a in gw
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or(&[])
    {
        let ip_type = a.r#type.as_deref().is_none_or(|t| t == "IPAddress");
        match a.value.parse::<IpAddr>() {
            Ok(ip) if ip_type && vip_address(ip).is_ok() => {
                if !addresses.contains(&ip) {
                    addresses.push(ip)
                }
            }
            _ => unusable.push(a.value.clone()),
        }
    }

    let listeners = &gw.spec.listeners;
    let mut results: Vec<ListenerResult> = listeners
        .iter()
        .map(|l| {
            let (kinds, bad) = listener_kinds(l);
            let accepted = match listener_protocol(&l.protocol) {
                Some(_) if (1..=65535).contains(&l.port) => {
                    Cond::yes(reason::ACCEPTED, "the listener is valid")
                }
                Some(_) => Cond::no(
                    reason::PORT_UNAVAILABLE,
                    format!("port {} is not 1-65535", l.port),
                ),
                None => Cond::no(
                    reason::UNSUPPORTED_PROTOCOL,
                    format!(
                        "Rivora balances TCP and UDP: protocol {} is not supported",
                        l.protocol
                    ),
                ),
            };
            let resolved_refs = if bad.is_empty() {
                Cond::yes(reason::RESOLVED_REFS, "every route kind is supported")
            } else {
                Cond::no(
                    reason::INVALID_ROUTE_KINDS,
                    format!("a {} listener does not take {}", l.protocol, bad.join(", ")),
                )
            };
            ListenerResult {
                name: l.name.clone(),
                port: l.port,
                protocol: l.protocol.clone(),
                accepted,
                conflicted: Cond::no(reason::NO_CONFLICTS, "no other listener shares its port"),
                resolved_refs,
                programmed: Cond::no(reason::PENDING, ""),
                supported_kinds: kinds,
                routes: Vec::new(),
                policy: PolicyUse::None,
                policy_ref: None,
            }
        })
        .collect();

    // Protocol conflicts within the Gateway.
    for i in 0..listeners.len() {
        let (li, mut with) = (&listeners[i], Vec::new());
        for (j, lj) in listeners.iter().enumerate() {
            if i == j || li.port != lj.port {
                continue;
            }
            let (a, b) = (li.protocol.as_str(), lj.protocol.as_str());
            let clash = (a == "TCP" && tcp_based(b))
                || (b == "TCP" && tcp_based(a))
                || (a == "UDP" && b == "UDP");
            if clash {
                with.push(format!("{} ({b})", lj.name));
            }
        }
        if !with.is_empty() {
            results[i].conflicted = Cond::yes(
                reason::PROTOCOL_CONFLICT,
                format!(
                    "{} port {} is also listener {}'s: neither is programmed",
                    li.protocol,
                    li.port,
                    with.join(", ")
                ),
            );
        }
    }

    // Ports an older Gateway holds on a shared address.
    for (i, l) in listeners.iter().enumerate() {
        let Some(proto) = listener_protocol(&l.protocol) else {
            continue;
        };
        if !results[i].accepted.status || results[i].conflicted.status {
            continue;
        }
        let taken: Vec<String> = addresses
            .iter()
            .filter_map(|a| match held.get(&(*a, l.port, proto)) {
                Some((other, ol)) if other != key => {
                    Some(format!("{a} by Gateway {other} listener {ol}"))
                }
                _ => None,
            })
            .collect();
        if taken.is_empty() {
            for a in &addresses {
                held.insert((*a, l.port, proto), (key.clone(), l.name.clone()));
            }
        } else {
            results[i].accepted = Cond::no(
                reason::PORT_UNAVAILABLE,
                format!(
                    "{} port {} is already held on {}",
                    l.protocol,
                    l.port,
                    taken.join(", ")
                ),
            );
        }
    }

    // The Gateway's own verdict.
    let requested_other: Vec<String> = gw
        .spec
        .addresses
        .iter()
        .flatten()
        .filter(|a| a.r#type.as_deref().is_some_and(|t| t != "IPAddress"))
        .map(|a| {
            format!(
                "{} {}",
                a.r#type.as_deref().unwrap_or_default(),
                a.value.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let invalid: Vec<&str> = results
        .iter()
        .filter(|l| !l.accepted.status)
        .map(|l| l.name.as_str())
        .collect();
    let accepted = if !class.accepted.status {
        Cond::no(
            reason::INVALID,
            format!(
                "GatewayClass {class_name} is not accepted: {}",
                class.accepted.message
            ),
        )
    } else if let Some(p) = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    {
        Cond::no(
            reason::INVALID_PARAMETERS,
            format!(
                "Rivora takes no infrastructure parameters, but parametersRef names {} {}",
                p.kind, p.name
            ),
        )
    } else if !requested_other.is_empty() {
        Cond::no(
            reason::UNSUPPORTED_ADDRESS,
            format!(
                "Rivora assigns IP addresses only: {} cannot be served",
                requested_other.join(", ")
            ),
        )
    } else if !listeners.is_empty() && invalid.len() == listeners.len() {
        Cond::no(
            reason::LISTENERS_NOT_VALID,
            format!("no listener is valid: {}", invalid.join(", ")),
        )
    } else if !invalid.is_empty() {
        Cond::yes(
            reason::LISTENERS_NOT_VALID,
            format!("listeners not valid: {}", invalid.join(", ")),
        )
    } else {
        Cond::yes(reason::ACCEPTED, "the Gateway is valid")
    };

    // A Gateway that is not accepted forwards nothing, so it holds no
    // port a younger one could use.
    if !accepted.status {
        held.retain(|_, (g, _)| g != key);
    }

    let programmed = if !accepted.status {
        Cond::no(
            reason::INVALID,
            format!("not accepted: {}", accepted.message),
        )
    } else if addresses.is_empty() {
        let mut m = "no address assigned yet (rivora-controller assigns one from an AddressPool)"
            .to_string();
        if !unusable.is_empty() {
            m = format!("no usable address: {} cannot be a VIP", unusable.join(", "));
        }
        Cond::no(reason::ADDRESS_NOT_ASSIGNED, m)
    } else {
        let a: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
        Cond::yes(
            reason::PROGRAMMED,
            format!("forwarding on {}", a.join(", ")),
        )
    };

    for lr in &mut results {
        lr.programmed = if !accepted.status {
            Cond::no(reason::INVALID, "the Gateway is not accepted")
        } else if !lr.accepted.status {
            Cond::no(reason::INVALID, lr.accepted.message.clone())
        } else if lr.conflicted.status {
            Cond::no(reason::INVALID, lr.conflicted.message.clone())
        } else if lr.supported_kinds.is_empty() {
            Cond::no(
                reason::INVALID,
                "the listener takes no route kind Rivora serves",
            )
        } else if addresses.is_empty() {
            Cond::no(reason::PENDING, "the Gateway has no address yet")
        } else {
            Cond::yes(
                reason::PROGRAMMED,
                format!("{} port {}", lr.protocol, lr.port),
            )
        };
    }

    GatewayResult {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        generation: gw.metadata.generation,
        accepted,
        programmed,
        addresses,
        listeners: results,
        vips: Vec::new(),
        services: BTreeSet::new(),
    }
}

/// A [`Cluster`] over plain lists, for tests and for callers that keep
/// their objects in vectors.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub classes: Vec<GatewayClass>,
    pub gateways: Vec<Gateway>,
    pub tcp_routes: Vec<TcpRoute>,
    pub udp_routes: Vec<UdpRoute>,
    pub grants: Vec<ReferenceGrant>,
    /// Namespace -> labels.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub policies: Vec<ServicePolicy>,
}

impl Cluster for Snapshot {
    fn gateway_classes(&self) -> Vec<&GatewayClass> {
        self.classes.iter().collect()
    }

    fn gateways(&self) -> Vec<&Gateway> {
        self.gateways.iter().collect()
    }

    fn routes(&self) -> Vec<Route> {
        self.tcp_routes
            .iter()
            .map(Route::from)
            .chain(self.udp_routes.iter().map(Route::from))
            .collect()
    }

    fn namespace_labels(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(namespace)
    }

    fn reference_grants(&self, namespace: &str) -> Vec<&ReferenceGrant> {
        self.grants
            .iter()
            .filter(|g| g.namespace().as_deref() == Some(namespace))
            .collect()
    }

    fn service(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.services
            .iter()
            .find(|s| s.namespace().as_deref() == Some(namespace) && s.name_any() == name)
    }

    fn endpoint_slices(&self, namespace: &str, service: &str) -> Vec<&EndpointSlice> {
        self.slices
            .iter()
            .filter(|s| {
                s.namespace().as_deref() == Some(namespace)
                    && s.labels()
                        .get(crate::translate::SERVICE_NAME_LABEL)
                        .map(String::as_str)
                        == Some(service)
            })
            .collect()
    }

    fn listener_policy(&self, listener: &ListenerRef) -> Option<&ServicePolicy> {
        let choice = crate::policy::choose_policies(&self.policies);
        let winner = choice.policy_for_listener(listener)?;
        self.policies.iter().find(|p| {
            p.namespace().as_deref() == Some(&winner.namespace) && p.name_any() == winner.name
        })
    }
}

#[cfg(test)]
mod tests;
