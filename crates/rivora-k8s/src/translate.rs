//! A Service, its EndpointSlices and its ServicePolicy to the VIPs one
//! node forwards. Pure: the watchers hand in what their stores hold, the
//! result goes to the reconciler as `SetDesired { owner: service ns/name }`
//! (an empty set withdraws the Service), and the warnings become Events on
//! the Service.
//!
//! The rules, each a row of the tests below:
//! - Only `type: LoadBalancer` Services whose `loadBalancerClass` is
//!   Rivora's ([`TranslateOptions::class`]), or unset when
//!   [`TranslateOptions::accept_unset_class`] says so.
//! - One VIP per (`status.loadBalancer.ingress[].ip`, port, protocol): a
//!   dual-stack Service with an IPv4 and an IPv6 ingress address gets one
//!   VIP of each family. TCP and UDP; any other protocol is a warning and
//!   nothing is programmed for that port.
//! - Backends come from the EndpointSlices labelled
//!   `kubernetes.io/service-name: <name>` in the Service's namespace, of
//!   the VIP's address family only. A slice port serves a Service port
//!   when name and protocol are equal; the backend port is the slice's.
//! - Ready endpoints are backends; terminating-but-serving ones drain:
//!   they stay with weight 0, which the dataplane reads as "no new flows"
//!   (no Maglev slots) while established flows keep their backend through
//!   the affinity table, as an operator drain does; not-ready ones are
//!   left out. When no endpoint in scope is ready (the Service's, or under
//!   `externalTrafficPolicy: Local` this node's), the terminating-but-
//!   serving ones take new flows instead, as KEP-1669 has kube-proxy do: a
//!   rollout that terminates every old pod before a new one is ready
//!   keeps answering. A Service with no usable endpoint keeps its VIPs
//!   with no backend (the dataplane counts `no_healthy_backend`).
//! - `externalTrafficPolicy: Local`: only endpoints whose `nodeName` is
//!   this node. `sessionAffinity: ClientIP` is clientIP affinity with its
//!   `timeoutSeconds` (default 10800).
//! - Each endpoint is reached the way its place allows ([`place_backends`]):
//!   under NAT (the default) this node's own endpoints by NAT, whose
//!   replies route back through this node (it is their pods' gateway), and
//!   every other endpoint by full NAT (an endpoint with no `nodeName` too),
//!   whose replies come back here whatever the other node routes: with NAT
//!   alone they left from their own node, from the pod's address, and the
//!   client reset them. A ServicePolicy's `fullnat` reaches every endpoint
//!   by full NAT; its `dsr`, `l3dsr` or `preserveClientIP` reaches the
//!   endpoints of other nodes by DSR across nodes (IP-in-IP to the
//!   endpoint, NAT'd by its node), which keeps the client's address.
//! - A [`ServicePolicy`] overrides mode, SYN limit, affinity, adds an
//!   active health check and weights endpoints by label. One that is
//!   invalid, or whose mode cannot reach an endpoint (DSR across nodes
//!   and an endpoint with no `nodeName`), is not applied at all and is
//!   reported in [`Translation::policy`].

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointSlice};
use kube::ResourceExt;
use rivora_model::desired::{DesiredVip, Owner, SourceKind, TrafficPolicy};
use rivora_model::health::HealthCheckSpec;
use rivora_model::model::{Affinity, Backend, Mode, Ports, Protocol, Vip, MAX_AFFINITY_TIMEOUT_S};

use crate::policy::{
    check_policy, EffectivePolicy, PolicyIssue, ServicePolicy, DEFAULT_AFFINITY_TIMEOUT_S,
    REASON_MODE_NOT_APPLICABLE,
};

/// Rivora's `spec.loadBalancerClass`.
pub const RIVORA_LB_CLASS: &str = "rivora.io/lb";
/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label an endpoint's `nodeName` is seen under by weight selectors.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The label an endpoint's `zone` is seen under by weight selectors.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Event reasons of the warnings.
pub const WARN_UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
pub const WARN_INVALID_ADDRESS: &str = "InvalidAddress";
pub const WARN_INVALID_PORT: &str = "InvalidPort";
pub const WARN_INVALID_POLICY: &str = "InvalidPolicy";
pub const WARN_INVALID_AFFINITY: &str = "InvalidSessionAffinity";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslateOptions {
    /// The `spec.loadBalancerClass` this node serves.
    pub class: String,
    /// Also serve LoadBalancer Services without a class (a cluster where
    /// Rivora is the only load balancer).
    pub accept_unset_class: bool,
}

impl Default for TranslateOptions {
    fn default() -> Self {
        Self {
            class: RIVORA_LB_CLASS.into(),
            accept_unset_class: true,
        }
    }
}

/// Something the Service's owner must fix, for an Event on the Service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Warning {
    /// CamelCase, the Event's reason.
    pub reason: &'static str,
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// What became of the policy handed in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PolicyUse {
    /// None was given, or it does not name this Service.
    #[default]
    None,
    Applied,
    /// Not applied at all; the reason is for its `Accepted=False`.
    Rejected(PolicyIssue),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Translation {
    /// What the Service wants; empty when it is not Rivora's.
    pub vips: Vec<DesiredVip>,
    /// Sorted and without repeats.
    pub warnings: Vec<Warning>,
    pub policy: PolicyUse,
}

/// The owner a Service's VIPs are claimed under.
pub fn owner(svc: &Service) -> Owner {
    Owner::new(
        SourceKind::Service,
        format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any()),
    )
}

/// Whether this node serves the Service at all (type and class). A
/// Service of no class is Rivora's (when unset classes are accepted)
/// unless another load balancer has given it addresses first
/// ([`written_by_another`]).
pub fn is_ours(svc: &Service, opts: &TranslateOptions) -> bool {
    let Some(spec) = &svc.spec else {
        return false;
    };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return false;
    }
    match &spec.load_balancer_class {
        Some(c) => *c == opts.class,
        None => opts.accept_unset_class && !written_by_another(svc),
    }
}

/// A Service whose status holds addresses (`status.loadBalancer.ingress`)
/// that Rivora did not give: rivora-controller writes its
/// `rivora.io/AddressAssigned` condition in the same patch as the
/// addresses, so ingress without it is another implementation's (a
/// cloud's, kube-vip). For a Service of no class, which every
/// implementation may take, the first to answer keeps it.
pub fn written_by_another(svc: &Service) -> bool {
    let Some(status) = &svc.status else {
        return false;
    };
    let has_ingress = status
        .load_balancer
        .as_ref()
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    let ours = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == crate::ipam::CONDITION_ADDRESS_ASSIGNED);
    has_ingress && !ours
}

/// See the module documentation for the rules.
pub fn service_vips<S: Borrow<EndpointSlice>>(
    svc: &Service,
    slices: &[S],
    policy: Option<&ServicePolicy>,
    node: &str,
    opts: &TranslateOptions,
) -> Translation {
    if !is_ours(svc, opts) {
        return Translation::default();
    }
    let mut warnings = BTreeSet::new();
    let namespace = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let policy = policy.filter(|p| {
        p.namespace().unwrap_or_default() == namespace && p.spec.services.contains(&name)
    });
    let (effective, mut used) = match policy.map(|p| check_policy(&p.spec)) {
        None => (None, PolicyUse::None),
        Some(Ok(e)) => (Some(e), PolicyUse::Applied),
        Some(Err(issue)) => (None, PolicyUse::Rejected(issue)),
    };
    let mut ranges_warnings = Vec::new();
    let ranges = crate::source_ranges::service_ranges(svc, policy, &mut ranges_warnings);
    let mut vips = match translate(svc, slices, effective.as_ref(), node, &mut warnings) {
        Ok(v) => v,
        Err(issue) => {
            used = PolicyUse::Rejected(issue);
            let mut again = BTreeSet::new();
            let v = translate(svc, slices, None, node, &mut again)
                .unwrap_or_else(|_| unreachable!("NAT serves every port"));
            warnings = again;
            v
        }
    };
    for v in &mut vips {
        v.vip.source_ranges.clone_from(&ranges);
    }
    warnings.extend(ranges_warnings);
    if let (PolicyUse::Rejected(issue), Some(p)) = (&used, policy) {
        warnings.insert(Warning {
            reason: WARN_INVALID_POLICY,
            message: format!(
                "ServicePolicy {} is not applied ({}): {}",
                p.name_any(),
                issue.reason,
                issue.message
            ),
        });
    }
    Translation {
        vips,
        warnings: warnings.into_iter().collect(),
        policy: used,
    }
}

/// What an endpoint's conditions make of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EndpointState {
    /// Takes no new flows while another endpoint is ready, keeps its
    /// established ones.
    Draining,
    Ready,
}

/// The API's reading of unset conditions: ready unknown is ready,
/// terminating unknown is not terminating, serving unknown is as ready
/// (what a controller older than `serving` meant).
fn endpoint_state(c: Option<&EndpointConditions>) -> Option<EndpointState> {
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let serving = c.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    if ready {
        Some(EndpointState::Ready)
    } else if terminating && serving {
        Some(EndpointState::Draining)
    } else {
        None
    }
}

pub(crate) fn protocol(p: Option<&str>) -> Result<Protocol, &str> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        other => Err(other),
    }
}

fn port_label(p: &ServicePort) -> String {
    match p.name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => p.port.to_string(),
    }
}

/// The VIP-independent part of the work: ingress addresses, ports,
/// affinity. Err only when the policy's mode cannot serve a port.
fn translate<S: Borrow<EndpointSlice>>(
    svc: &Service,
    slices: &[S],
    policy: Option<&EffectivePolicy>,
    node: &str,
    warnings: &mut BTreeSet<Warning>,
) -> Result<Vec<DesiredVip>, PolicyIssue> {
    let namespace = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let Some(spec) = &svc.spec else {
        return Ok(Vec::new());
    };
    let mut warn = |reason, message: String| {
        warnings.insert(Warning { reason, message });
    };

    let mut addrs: Vec<IpAddr> = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or(&[]);
    for ip in ingress.iter().filter_map(|i| i.ip.as_deref()) {
        match ip.parse::<IpAddr>() {
            Ok(a) => {
                if let Err(e) = vip_address(a) {
                    warn(
                        WARN_INVALID_ADDRESS,
                        format!("ingress address {ip} cannot be a VIP: {e}"),
                    );
                } else if !addrs.contains(&a) {
                    addrs.push(a);
                }
            }
            Err(_) => warn(
                WARN_INVALID_ADDRESS,
                format!("ingress address {ip:?} is not an IP address"),
            ),
        }
    }

    let mode = policy.and_then(|p| p.mode).unwrap_or(Mode::Nat);
    let preserve = policy.is_some_and(|p| p.preserve_client_ip);
    let affinity = match policy.and_then(|p| p.affinity) {
        Some(a) => a,
        None if spec.session_affinity.as_deref() == Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            let timeout_s = match t {
                None => DEFAULT_AFFINITY_TIMEOUT_S,
                Some(t) => match u32::try_from(t) {
                    Ok(t) if (1..=MAX_AFFINITY_TIMEOUT_S).contains(&t) => t,
                    _ => {
                        warn(
                            WARN_INVALID_AFFINITY,
                            format!(
                                "sessionAffinityConfig.clientIP.timeoutSeconds {t} is not 1-{MAX_AFFINITY_TIMEOUT_S}: using {DEFAULT_AFFINITY_TIMEOUT_S}"
                            ),
                        );
                        DEFAULT_AFFINITY_TIMEOUT_S
                    }
                },
            };
            Affinity::ClientIp { timeout_s }
        }
        None => Affinity::None,
    };
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let health = policy.and_then(|p| p.health.clone());

    let ours: Vec<&EndpointSlice> = slices
        .iter()
        .map(Borrow::borrow)
        .filter(|s| {
            s.metadata
                .namespace
                .as_deref()
                .is_none_or(|n| n == namespace)
                && s.labels().get(SERVICE_NAME_LABEL) == Some(&name)
        })
        .collect();

    let nodes = endpoint_nodes(&ours);
    let mut out = Vec::new();
    let mut keys = BTreeSet::new();
    for sp in spec.ports.as_deref().unwrap_or(&[]) {
        let proto = match protocol(sp.protocol.as_deref()) {
            Ok(p) => p,
            Err(other) => {
                warn(
                    WARN_UNSUPPORTED_PROTOCOL,
                    format!(
                        "port {} uses {other}: Rivora balances TCP and UDP only, nothing is programmed for it",
                        port_label(sp)
                    ),
                );
                continue;
            }
        };
        let port = match u16::try_from(sp.port) {
            Ok(p) if p != 0 => p,
            _ => {
                warn(
                    WARN_INVALID_PORT,
                    format!("port {} is not 1-65535", sp.port),
                );
                continue;
            }
        };
        let port_name = sp.name.as_deref().unwrap_or("");
        for &addr in &addrs {
            if !keys.insert((addr, port, proto)) {
                continue;
            }
            let backends = backends(&ours, addr, port_name, proto, local.then_some(node), policy);
            let checks: Vec<Option<Arc<HealthCheckSpec>>> = vec![health.clone(); backends.len()];
            let mut vip = Vip {
                addr,
                ports: Ports::One(port),
                proto,
                mode,
                affinity,
                rate_limit: policy.and_then(|p| p.rate_limit),
                // Set by the caller, the same for every VIP.
                source_ranges: None,
                backends,
            };
            place_backends(&mut vip, node, &nodes, preserve).map_err(|why| PolicyIssue {
                reason: REASON_MODE_NOT_APPLICABLE,
                message: format!(
                    "mode {mode} cannot serve Service {namespace}/{name} port {}: {why}",
                    port_label(sp)
                ),
            })?;
            out.push(DesiredVip {
                name: format!("{namespace}/{name}:{}", port_label(sp)),
                health: checks,
                vip,
                traffic_policy: if local {
                    TrafficPolicy::Local
                } else {
                    TrafficPolicy::Cluster
                },
                // Pools are the node's to check (rivorad's source).
                refused: None,
            });
        }
    }
    Ok(out)
}

/// Where each endpoint address lives: the slices' `nodeName`s (an
/// endpoint without one is left out).
pub fn endpoint_nodes<S: Borrow<EndpointSlice>>(slices: &[S]) -> BTreeMap<IpAddr, String> {
    let mut nodes = BTreeMap::new();
    for ep in slices
        .iter()
        .flat_map(|s| s.borrow().endpoints.iter().flatten())
    {
        let Some(node) = &ep.node_name else {
            continue;
        };
        for a in ep.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()) {
            nodes.entry(a).or_insert_with(|| node.clone());
        }
    }
    nodes
}

/// How this node (`node`) reaches each backend of `vip`, from where each
/// lives (`nodes`, [`endpoint_nodes`]):
/// - `nat`: this node's endpoints by NAT (their replies come back through
///   this node, their gateway), every other one (an endpoint with no node
///   known too) by full NAT, whose replies come back here whatever the
///   other node routes. With `preserve_client_ip`, another node's
///   endpoints by DSR across nodes instead (below), and an endpoint on no
///   known node cannot be served: the error names it;
/// - `fullnat`: every endpoint by full NAT;
/// - `dsr`, `l3dsr`: an endpoint on another node by DSR across nodes:
///   IP-in-IP to its own address, which routes to its node, whose Rivora
///   takes the tunnel off and NATs the packet to it (so its port may
///   differ from the VIP's), the client's address kept; this node's own
///   endpoints by NAT. An endpoint on no known node (a host the Service's
///   slices name by hand) is reached by the mode itself: it holds the VIP
///   and serves the VIP's port, or the error says why not.
///
/// Each backend is told its node: `vip show` says it, the model lets an
/// L3 DSR backend on a node remap the port, and the writer makes this
/// node's own endpoints (reached by NAT, on a node) the ones other nodes'
/// tunnels may reach here.
pub fn place_backends(
    vip: &mut Vip,
    node: &str,
    nodes: &BTreeMap<IpAddr, String>,
    preserve_client_ip: bool,
) -> Result<(), String> {
    let vport = match vip.ports {
        Ports::One(p) => p,
        Ports::Range { first, .. } => first,
    };
    for b in &mut vip.backends {
        b.node = nodes.get(&b.addr).cloned();
        let local = b.node.as_deref() == Some(node);
        let known = b.node.is_some();
        b.mode = match (vip.mode, local, known) {
            (Mode::FullNat, ..) | (Mode::Nat, true, _) => None,
            (_, true, _) => Some(Mode::Nat),
            (Mode::Nat, false, true) if preserve_client_ip => Some(Mode::L3Dsr),
            (Mode::Nat, false, false) if preserve_client_ip => {
                return Err(format!(
                    "endpoint {} has no nodeName: its client's address can only be kept by DSR across nodes, to the endpoint's node",
                    b.addr
                ))
            }
            (Mode::Nat, false, _) => Some(Mode::FullNat),
            (Mode::Dsr, false, true) => Some(Mode::L3Dsr),
            (Mode::Dsr | Mode::L3Dsr, false, false) if b.port != 0 && b.port != vport => {
                return Err(format!(
                    "endpoint {} is on no known node, so it is reached by {} itself, which keeps the destination port; it listens on port {}, not {vport}",
                    b.addr, vip.mode, b.port
                ))
            }
            _ => None,
        };
    }
    Ok(())
}

/// Whether `a` can be a VIP: the address checks of the model, with no
/// port or backend to fail on.
pub(crate) fn vip_address(a: IpAddr) -> Result<(), rivora_model::model::ModelError> {
    Vip {
        addr: a,
        ports: Ports::One(1),
        proto: Protocol::Tcp,
        mode: Mode::Nat,
        affinity: Affinity::None,
        rate_limit: None,
        source_ranges: None,
        backends: Vec::new(),
    }
    .validate()
}

/// The backends behind one port of a Service for a VIP on `vip`, as a
/// route's backendRef sees them: its EndpointSlices (those labelled for
/// `service` in its namespace), the VIP's family, ready endpoints with
/// weight 1 and terminating-but-serving ones with weight 0 (1 when none
/// is ready). The same
/// reading as a LoadBalancer Service's own VIPs, without its traffic
/// policy or ServicePolicy weights.
pub(crate) fn service_port_backends<S: Borrow<EndpointSlice>>(
    service: &Service,
    slices: &[S],
    vip: IpAddr,
    port_name: &str,
    proto: Protocol,
) -> Vec<Backend> {
    let namespace = service.namespace().unwrap_or_default();
    let name = service.name_any();
    let ours: Vec<&EndpointSlice> = slices
        .iter()
        .map(Borrow::borrow)
        .filter(|s| {
            s.metadata
                .namespace
                .as_deref()
                .is_none_or(|n| n == namespace)
                && s.labels().get(SERVICE_NAME_LABEL) == Some(&name)
        })
        .collect();
    backends(&ours, vip, port_name, proto, None, None)
}

/// The backends of one VIP, ordered by address and port. An endpoint
/// listed twice (slices overlap while the controller moves endpoints) is
/// one backend, ready if either copy is.
fn backends(
    slices: &[&EndpointSlice],
    vip: IpAddr,
    port_name: &str,
    proto: Protocol,
    only_node: Option<&str>,
    policy: Option<&EffectivePolicy>,
) -> Vec<Backend> {
    let family = if vip.is_ipv4() { "IPv4" } else { "IPv6" };
    let mut found: BTreeMap<(IpAddr, u16), (EndpointState, u32)> = BTreeMap::new();
    for slice in slices {
        if slice.address_type != family {
            continue;
        }
        let port = slice.ports.as_deref().unwrap_or(&[]).iter().find_map(|p| {
            let same = p.name.as_deref().unwrap_or("") == port_name
                && protocol(p.protocol.as_deref()) == Ok(proto);
            same.then_some(p.port)
                .flatten()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n != 0)
        });
        let Some(port) = port else {
            continue;
        };
        for ep in slice.endpoints.iter().flatten() {
            if let Some(node) = only_node {
                if ep.node_name.as_deref() != Some(node) {
                    continue;
                }
            }
            let Some(state) = endpoint_state(ep.conditions.as_ref()) else {
                continue;
            };
            // Every address of an endpoint is the same Pod: the first
            // stands for it, as kube-proxy reads it.
            let Some(addr) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            if addr.is_ipv4() != vip.is_ipv4() || !usable_backend(addr, vip) {
                continue;
            }
            // A draining endpoint's weight is what it would have if it
            // were ready: it serves new flows when no endpoint is ready
            // (below).
            let weight = match state {
                EndpointState::Draining | EndpointState::Ready => policy.map_or(1, |p| {
                    let mut labels = slice.labels().clone();
                    if let Some(n) = &ep.node_name {
                        labels.insert(HOSTNAME_LABEL.into(), n.clone());
                    }
                    if let Some(z) = &ep.zone {
                        labels.insert(ZONE_LABEL.into(), z.clone());
                    }
                    p.weight(&labels)
                }),
            };
            let e = found.entry((addr, port)).or_insert((state, weight));
            if state > e.0 {
                *e = (state, weight);
            }
        }
    }
    let any_ready = found.values().any(|(s, _)| *s == EndpointState::Ready);
    found
        .into_iter()
        .map(|((addr, port), (state, weight))| Backend {
            addr,
            port,
            weight: if any_ready && state == EndpointState::Draining {
                0
            } else {
                weight
            },
            mac: None,
            mode: None,
            node: None,
        })
        .collect()
}

/// What the model refuses as a backend of `vip`: an endpoint address
/// no packet can be forwarded to.
fn usable_backend(addr: IpAddr, vip: IpAddr) -> bool {
    !(addr.is_unspecified()
        || addr.is_multicast()
        || addr == IpAddr::V4(std::net::Ipv4Addr::BROADCAST)
        || addr == vip)
}

#[cfg(test)]
mod tests;
