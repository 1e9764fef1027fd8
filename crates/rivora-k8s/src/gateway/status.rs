//! The status rivora-controller writes on Gateway API objects, computed
//! from a [`Resolution`]: GatewayClass `Accepted` (and `supportedFeatures`),
//! Gateway `Accepted` and `Programmed`, each listener's `Accepted`,
//! `Conflicted`, `ResolvedRefs`, `Programmed`, `supportedKinds` and
//! `attachedRoutes`, and each route's `status.parents[]` entries for
//! Rivora's Gateways (`Accepted`, `ResolvedRefs`).
//!
//! Each function takes the object as last read and returns `Some(status)`
//! only when the object's status does not already say it: the controller
//! writes exactly that, as a replace of the status subresource carrying
//! the resourceVersion it read (a concurrent writer's change then fails
//! the write instead of being lost; a merge patch would replace the
//! `parents[]` and `listeners[]` lists whole), and writes nothing on
//! `None`. Which is how it
//! writes only on change, with no memory of its own:
//!
//! ```text
//! let res = rivora_k8s::gateway::resolve(&cluster);
//! let now = Time(k8s_openapi::jiff::Timestamp::now());
//! for gw in cluster.gateways() {
//!     if let Some(status) = gateway_status(gw, &res, &now) {
//!         let mut new = gw.clone();          // resourceVersion as read
//!         new.status = Some(status);
//!         api.replace_status(&name, &PostParams::default(), &new).await?; // 409: read again
//!     }
//! }
//! ```
//!
//! What they keep, as the specification asks of every implementation:
//! - Conditions of other types (another controller's, or a future
//!   version's) stay where they are; a condition of a type Rivora owns is
//!   updated in place, never duplicated.
//! - `lastTransitionTime` changes only when a condition's status does;
//!   `observedGeneration` is the object's `metadata.generation`.
//! - When the object's status holds a condition Rivora owns with an
//!   `observedGeneration` newer than the object read (the caller's copy is
//!   stale), nothing is written: the newer copy's event will come.
//! - `Gateway.status.addresses` is the controller's IPAM's to write and is
//!   kept as it is; [`super::resolve`] reads it (a controller writing
//!   addresses and conditions at once sets them on its copy of the Gateway
//!   before resolving).
//! - On routes, `parents[]` entries of other controllers are kept in their
//!   place; Rivora's are updated in place, added at the end, and removed
//!   when their parentRef no longer names a Rivora Gateway.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use super::api::gatewayclasses::{
    GatewayClass, GatewayClassStatus, GatewayClassStatusSupportedFeatures,
};
use super::api::gateways::{
    Gateway, GatewayStatus, GatewayStatusListeners, GatewayStatusListenersSupportedKinds,
};
use super::api::tcproutes::{
    TcpRoute, TcpRouteStatus, TcpRouteStatusParents, TcpRouteStatusParentsParentRef,
};
use super::api::udproutes::{
    UdpRoute, UdpRouteStatus, UdpRouteStatusParents, UdpRouteStatusParentsParentRef,
};
use super::{
    Cond, ParentRef, Resolution, RouteKind, RouteRef, ACCEPTED, CONFLICTED, CONTROLLER_NAME, GROUP,
    PROGRAMMED, RESOLVED_REFS,
};
use crate::policy::{merge_condition, ObjectRef};

/// The features Rivora's GatewayClass reports (`supportedFeatures`,
/// sorted as the specification asks).
pub const SUPPORTED_FEATURES: [&str; 4] = ["Gateway", "ReferenceGrant", "TCPRoute", "UDPRoute"];

/// A condition message is at most this long (the API allows 32768; a
/// route with many broken refs would otherwise grow without bound).
const MAX_MESSAGE: usize = 1024;

fn condition(type_: &str, c: &Cond, generation: Option<i64>, now: &Time) -> Condition {
    let mut message = c.message.clone();
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    Condition {
        type_: type_.into(),
        status: if c.status { "True" } else { "False" }.into(),
        reason: c.reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// `current` with `wanted` merged in: see the module documentation.
pub fn merge_conditions(current: &[Condition], wanted: Vec<Condition>) -> Vec<Condition> {
    let mut out = current.to_vec();
    for c in wanted {
        merge_condition(&mut out, c);
    }
    out
}

/// Whether `current` holds one of `types` written for a newer generation
/// than `generation`.
fn stale(current: &[Condition], types: &[&str], generation: Option<i64>) -> bool {
    current.iter().any(|c| {
        types.contains(&c.type_.as_str())
            && matches!((c.observed_generation, generation), (Some(seen), Some(g)) if seen > g)
    })
}

/// A GatewayClass of Rivora's: `Accepted` and `supportedFeatures`. None
/// when the class is not Rivora's or its status already says so.
pub fn gateway_class_status(
    class: &GatewayClass,
    res: &Resolution,
    now: &Time,
) -> Option<GatewayClassStatus> {
    let r = res.classes.get(&class.name_any())?;
    let g = class.metadata.generation;
    let current = class.status.clone().unwrap_or_default();
    let conds = current.conditions.clone().unwrap_or_default();
    if stale(&conds, &[ACCEPTED], g) {
        return None;
    }
    let wanted = GatewayClassStatus {
        conditions: Some(merge_conditions(
            &conds,
            vec![condition(ACCEPTED, &r.accepted, g, now)],
        )),
        supported_features: Some(
            SUPPORTED_FEATURES
                .iter()
                .map(|f| GatewayClassStatusSupportedFeatures {
                    name: f.to_string(),
                })
                .collect(),
        ),
    };
    (class.status.as_ref() != Some(&wanted)).then_some(wanted)
}

/// A Gateway of Rivora's: `Accepted`, `Programmed` and one entry per
/// listener (in spec order: `supportedKinds`, `attachedRoutes`,
/// `Accepted`, `Conflicted`, `ResolvedRefs`, `Programmed`). Addresses are
/// kept as the object has them. None when the Gateway is not Rivora's or
/// its status already says so.
pub fn gateway_status(gw: &Gateway, res: &Resolution, now: &Time) -> Option<GatewayStatus> {
    let key = ObjectRef::new(gw.namespace().unwrap_or_default(), gw.name_any());
    let r = res.gateways.get(&key)?;
    let g = gw.metadata.generation;
    let current = gw.status.clone().unwrap_or_default();
    let conds = current.conditions.clone().unwrap_or_default();
    let listener_types = [ACCEPTED, CONFLICTED, RESOLVED_REFS, PROGRAMMED];
    let old_listeners = current.listeners.clone().unwrap_or_default();
    if stale(&conds, &[ACCEPTED, PROGRAMMED], g)
        || old_listeners
            .iter()
            .any(|l| stale(&l.conditions, &listener_types, g))
    {
        return None;
    }
    let listeners = r
        .listeners
        .iter()
        .map(|l| {
            let old = old_listeners
                .iter()
                .find(|o| o.name == l.name)
                .map(|o| o.conditions.as_slice())
                .unwrap_or(&[]);
            GatewayStatusListeners {
                name: l.name.clone(),
                attached_routes: l.attached_routes(),
                supported_kinds: Some(
                    l.supported_kinds
                        .iter()
                        .map(|k| GatewayStatusListenersSupportedKinds {
                            group: Some(GROUP.into()),
                            kind: k.kind().into(),
                        })
                        .collect(),
                ),
                conditions: merge_conditions(
                    old,
                    vec![
                        condition(ACCEPTED, &l.accepted, g, now),
                        condition(CONFLICTED, &l.conflicted, g, now),
                        condition(RESOLVED_REFS, &l.resolved_refs, g, now),
                        condition(PROGRAMMED, &l.programmed, g, now),
                    ],
                ),
            }
        })
        .collect();
    let wanted = GatewayStatus {
        addresses: current.addresses.clone(),
        attached_listener_sets: current.attached_listener_sets,
        conditions: Some(merge_conditions(
            &conds,
            vec![
                condition(ACCEPTED, &r.accepted, g, now),
                condition(PROGRAMMED, &r.programmed, g, now),
            ],
        )),
        listeners: Some(listeners),
    };
    (gw.status.as_ref() != Some(&wanted)).then_some(wanted)
}

/// One `status.parents[]` entry, the same for both route kinds.
#[derive(Debug, Clone, PartialEq)]
struct Parent {
    controller: String,
    parent_ref: ParentRef,
    conditions: Vec<Condition>,
}

/// The route's parents as they should be: see the module documentation.
/// None when they already are, or the copy is stale.
fn route_parents(
    route: RouteRef,
    generation: Option<i64>,
    current: &[Parent],
    res: &Resolution,
    now: &Time,
) -> Option<Vec<Parent>> {
    let ours: Vec<Parent> = res
        .routes
        .get(&route)
        .map(|r| {
            r.parents
                .iter()
                .map(|p| Parent {
                    controller: CONTROLLER_NAME.into(),
                    parent_ref: p.parent_ref.clone(),
                    conditions: vec![
                        condition(ACCEPTED, &p.accepted, generation, now),
                        condition(RESOLVED_REFS, &p.resolved_refs, generation, now),
                    ],
                })
                .collect()
        })
        .unwrap_or_default();
    if current.iter().any(|p| {
        p.controller == CONTROLLER_NAME
            && stale(&p.conditions, &[ACCEPTED, RESOLVED_REFS], generation)
    }) {
        return None;
    }
    let mut out = Vec::with_capacity(current.len() + ours.len());
    let mut placed = vec![false; ours.len()];
    for p in current {
        if p.controller != CONTROLLER_NAME {
            out.push(p.clone());
            continue;
        }
        // Ours: kept in place while still wanted, else dropped.
        if let Some(i) = ours
            .iter()
            .enumerate()
            .position(|(i, o)| !placed[i] && o.parent_ref == p.parent_ref)
        {
            placed[i] = true;
            out.push(Parent {
                conditions: merge_conditions(&p.conditions, ours[i].conditions.clone()),
                ..p.clone()
            });
        }
    }
    for (i, o) in ours.into_iter().enumerate() {
        if !placed[i] {
            out.push(o);
        }
    }
    (out != current).then_some(out)
}

macro_rules! route_status {
    ($fn:ident, $route:ty, $status:ty, $parent:ident, $pref:ident, $kind:expr) => {
        /// A route's `status.parents[]`: one entry per parentRef that
        /// names a Rivora Gateway (`Accepted`, `ResolvedRefs`), other
        /// controllers' entries kept, Rivora's stale ones removed. None
        /// when its status already says so.
        pub fn $fn(route: &$route, res: &Resolution, now: &Time) -> Option<$status> {
            let key = RouteRef {
                kind: $kind,
                namespace: route.namespace().unwrap_or_default(),
                name: route.name_any(),
            };
            let current: Vec<Parent> = route
                .status
                .iter()
                .flat_map(|s| s.parents.iter())
                .map(|p| Parent {
                    controller: p.controller_name.clone(),
                    parent_ref: ParentRef {
                        group: p.parent_ref.group.clone(),
                        kind: p.parent_ref.kind.clone(),
                        namespace: p.parent_ref.namespace.clone(),
                        name: p.parent_ref.name.clone(),
                        section_name: p.parent_ref.section_name.clone(),
                        port: p.parent_ref.port,
                    },
                    conditions: p.conditions.clone(),
                })
                .collect();
            let parents = route_parents(key, route.metadata.generation, &current, res, now)?;
            Some(<$status>::default_with(
                parents
                    .into_iter()
                    .map(|p| $parent {
                        conditions: p.conditions,
                        controller_name: p.controller,
                        parent_ref: $pref {
                            group: p.parent_ref.group,
                            kind: p.parent_ref.kind,
                            namespace: p.parent_ref.namespace,
                            name: p.parent_ref.name,
                            section_name: p.parent_ref.section_name,
                            port: p.parent_ref.port,
                        },
                    })
                    .collect(),
            ))
        }
    };
}

trait WithParents<P> {
    fn default_with(parents: Vec<P>) -> Self;
}

impl WithParents<TcpRouteStatusParents> for TcpRouteStatus {
    fn default_with(parents: Vec<TcpRouteStatusParents>) -> Self {
        TcpRouteStatus { parents }
    }
}

impl WithParents<UdpRouteStatusParents> for UdpRouteStatus {
    fn default_with(parents: Vec<UdpRouteStatusParents>) -> Self {
        UdpRouteStatus { parents }
    }
}

route_status!(
    tcp_route_status,
    TcpRoute,
    TcpRouteStatus,
    TcpRouteStatusParents,
    TcpRouteStatusParentsParentRef,
    RouteKind::Tcp
);
route_status!(
    udp_route_status,
    UdpRoute,
    UdpRouteStatus,
    UdpRouteStatusParents,
    UdpRouteStatusParentsParentRef,
    RouteKind::Udp
);
