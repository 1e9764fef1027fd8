//! The address assignment loop's state, apart from the API server: what
//! the watches hold, the allocator while this replica leads, and what to
//! write. [`Ipam::plan`] turns the objects touched since the last plan
//! into status writes and warnings; the caller sends them (only while it
//! leads) and feeds the watches' events back in. Pure given its inputs
//! and the time passed in, so every rule is tested here without a server.
//!
//! - Leading starts with [`Ipam::lead`], only from lists that are whole
//!   and current ([`Ipam::may_lead`]: no watch listing again): the
//!   allocation table is rebuilt from every Service's status before
//!   anything is assigned, so a restart or a failover keeps every address
//!   (the allocator's rule).
//! - The API server's status is the truth: a Service's version that the
//!   table did not assign from (its write's result, the change that got
//!   the write refused, a status edited by hand, the first news of a
//!   status after leading from an old list) replaces what the table holds
//!   for it, and an address picked for a write that did not land is free
//!   again unless that status has it.
//! - A Service that is Rivora's gets `status.loadBalancer.ingress` and the
//!   `rivora.io/AddressAssigned` condition from its outcome; one that
//!   stops being Rivora's (type, class) or is deleted releases its
//!   addresses, and a Service that still exists loses the ingress Rivora
//!   wrote and the condition.
//! - A pool change re-assigns every Service (flags for addresses no pool
//!   holds any more, Services that can now be served) and rewrites the
//!   pools' counts and conditions.
//! - A write is planned only when the status would change, and not again
//!   from the same object version while one is in flight or after one
//!   was refused (409): the watch brings the newer version, planned then.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Namespace, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::watcher::Event;
use kube::ResourceExt;
use rivora_k8s::gateway::api::gateways::Gateway;
use rivora_k8s::ipam::{gateway_claim, ClaimKind, ClaimRef, Outcome, CONDITION_ADDRESS_ASSIGNED};
use rivora_k8s::policy::merge_condition;
use rivora_k8s::{service_claim, AddressPool, Allocator, PoolSet};
use rivora_k8s::{TranslateOptions, Warning};
use rivora_k8s_client::{key_of, Key, Listed};

use crate::gateways::{explain_unassigned, status_writes, with_addresses, GatewayApi, View};
use crate::policies::Policies;
use serde_json::{json, Value};

/// A status to write, with the version it was computed from: the write is
/// refused (409) if the object changed since, and planned again from the
/// newer version.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub target: Target,
    pub resource_version: String,
    /// The merge patch's `status`.
    pub status: Value,
}

/// What a write is for. Services and pools get a merge patch of their
/// `status`; Gateway API objects are replaced whole (`Write::status`
/// then holds the object).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Service(Key),
    Pool(String),
    GatewayClass(String),
    Gateway(Key),
    TcpRoute(Key),
    UdpRoute(Key),
    Policy(Key),
}

/// A Warning Event to publish on a Service or a Gateway (a
/// [`Target::Service`] or [`Target::Gateway`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectWarning {
    pub object: Target,
    pub warning: Warning,
}

#[derive(Debug, Default)]
pub struct Plan {
    pub writes: Vec<Write>,
    pub warnings: Vec<ObjectWarning>,
}

/// Per pool and family: (assigned, available), for the metrics.
pub type PoolGauges = BTreeMap<(String, &'static str), (u128, u128)>;

pub struct Ipam {
    opts: TranslateOptions,
    pub pools: Listed<AddressPool>,
    pub services: Listed<Service>,
    pub namespaces: Listed<Namespace>,
    pub gateway: GatewayApi,
    /// ServicePolicies and the EndpointSlices their answers read.
    pub policies: Policies,
    /// Every policy's status is looked at again.
    policies_dirty: bool,
    /// Some while this replica leads.
    alloc: Option<Allocator>,
    /// Outcomes [`Ipam::lead`] computed, used by the next plan instead of
    /// assigning again (they carry what the rebuild released).
    rebuilt: HashMap<ClaimRef, Outcome>,
    dirty: BTreeSet<Key>,
    /// Every Gateway (and its routes' status) is planned again: a Gateway
    /// API object, a Service (a route's backend), a Namespace (a
    /// listener's selector) or a pool changed.
    gateways_dirty: bool,
    /// A pool's spec changed: assign every Service again.
    pools_dirty: bool,
    /// Some pool's status may be out of date (counts moved, a write of it
    /// answered, its status changed under us).
    pool_status_dirty: bool,
    /// What was sent and not answered yet, or refused: the object
    /// version each write was computed from.
    in_flight: HashMap<Target, String>,
    /// The watches listing now (the first time, or again), by name.
    lists_running: BTreeSet<&'static str>,
}

impl Ipam {
    pub fn new(opts: TranslateOptions) -> Self {
        Self {
            opts,
            pools: Listed::default(),
            services: Listed::default(),
            namespaces: Listed::default(),
            gateway: GatewayApi::default(),
            policies: Policies::default(),
            policies_dirty: false,
            alloc: None,
            rebuilt: HashMap::new(),
            dirty: BTreeSet::new(),
            gateways_dirty: false,
            pools_dirty: false,
            pool_status_dirty: false,
            in_flight: HashMap::new(),
            lists_running: BTreeSet::new(),
        }
    }

    pub fn all_listed(&self) -> bool {
        self.pools.synced
            && self.services.synced
            && self.namespaces.synced
            && self.gateway.listed()
            && self.policies.listed()
    }

    pub fn leads(&self) -> bool {
        self.alloc.is_some()
    }

    /// Whether this replica may start leading: every watch has listed and
    /// none is listing again. During a list the copies stay as old as the
    /// watch's last event (kept whole until the list is done), and a
    /// table rebuilt from them would give out addresses that statuses it
    /// has not seen hold.
    pub fn may_lead(&self) -> bool {
        self.all_listed() && self.lists_running.is_empty()
    }

    /// A watch's event, before it is applied: from `Init` to `InitDone`
    /// the watch `watch` is listing, the first time or again after it
    /// fell too far behind (410 Gone).
    pub fn listing<K>(&mut self, watch: &'static str, ev: &Event<K>) {
        match ev {
            Event::Init => {
                self.lists_running.insert(watch);
            }
            Event::InitDone => {
                self.lists_running.remove(watch);
            }
            Event::InitApply(_) | Event::Apply(_) | Event::Delete(_) => {}
        }
    }

    /// A watch whose resource is not installed: it lists nothing, and
    /// counts as listed.
    pub fn not_installed(&mut self, watch: &'static str) {
        self.lists_running.remove(watch);
    }

    /// A Service changed (or was listed again).
    pub fn service_changed(&mut self, key: Key) {
        self.dirty.insert(key);
        self.gateways_dirty = true;
        self.policies_dirty = true;
    }

    /// A Gateway API object changed.
    pub fn gateways_changed(&mut self) {
        self.gateways_dirty = true;
        self.policies_dirty = true;
    }

    /// A ServicePolicy or an EndpointSlice changed: the policies'
    /// answers may have.
    pub fn policies_changed(&mut self) {
        self.policies_dirty = true;
    }

    pub fn pools_changed(&mut self) {
        self.pools_dirty = true;
    }

    /// A pool's status changed (its spec did not): only its status is
    /// looked at again.
    pub fn pool_status_changed(&mut self) {
        self.pool_status_dirty = true;
    }

    /// A Namespace's labels may have changed: its Services again.
    pub fn namespace_changed(&mut self, namespace: &str) {
        let keys: Vec<Key> = self
            .services
            .items
            .keys()
            .filter(|k| k.namespace == namespace)
            .cloned()
            .collect();
        self.dirty.extend(keys);
        self.gateways_dirty = true;
    }

    /// A write is done (or failed): forget it, and on failure look at the
    /// object again at the next plan.
    pub fn written(&mut self, target: &Target, ok: bool) {
        self.in_flight.remove(target);
        match target {
            Target::Service(k) if !ok => {
                self.dirty.insert(k.clone());
            }
            Target::Service(_) => {}
            // Counts may have moved while it was in flight, when a plan
            // could not write it again.
            Target::Pool(_) => self.pool_status_dirty = true,
            // One resolution writes them all: look again.
            Target::GatewayClass(_)
            | Target::Gateway(_)
            | Target::TcpRoute(_)
            | Target::UdpRoute(_) => self.gateways_dirty = true,
            Target::Policy(_) => self.policies_dirty = true,
        }
    }

    /// A write computed from `resource_version` was refused (409): the
    /// object changed since. Nothing is planned from that version again;
    /// the watch brings the newer one, and with it the status that won,
    /// which the next plan starts from ([`Allocator::assign`]). Until
    /// then the address picked for the write stays reserved: the newer
    /// status may be this replica's own earlier write, holding it.
    pub fn refused(&mut self, target: &Target, resource_version: &str) {
        if let Target::Service(k) = target {
            if self.services.get(k).is_none() {
                return;
            }
        }
        // A write from a newer version may be in flight already (the
        // watch was quicker than this answer): that one stays.
        self.in_flight
            .entry(target.clone())
            .or_insert_with(|| resource_version.to_string());
    }

    fn gateway_claim(&self, g: &Gateway) -> Option<rivora_k8s::Claim> {
        let empty = BTreeMap::new();
        let labels = self
            .namespaces
            .get(&Key::new("", g.namespace().unwrap_or_default()))
            .map(|n| n.labels())
            .unwrap_or(&empty);
        gateway_claim(g, self.gateway.rivoras(g), labels)
    }

    fn pool_set(&self) -> PoolSet {
        PoolSet::new(self.pools.items.values().map(|p| &**p))
    }

    fn claim(&self, svc: &Service) -> Option<rivora_k8s::Claim> {
        let ns = svc.namespace().unwrap_or_default();
        let empty = BTreeMap::new();
        let labels = self
            .namespaces
            .get(&Key::new("", ns))
            .map(|n| n.labels())
            .unwrap_or(&empty);
        service_claim(svc, labels, &self.opts)
    }

    /// Start leading (when [`Ipam::may_lead`]): rebuild the table from the
    /// statuses as the watches have them. Every Service and pool is
    /// planned next.
    pub fn lead(&mut self) {
        let mut alloc = Allocator::new(self.pool_set());
        let claims: Vec<rivora_k8s::Claim> = self
            .services
            .items
            .values()
            .filter_map(|s| self.claim(s))
            .chain(
                self.gateway
                    .gateways
                    .items
                    .values()
                    .filter_map(|g| self.gateway_claim(g)),
            )
            .collect();
        self.rebuilt = alloc
            .rebuild(&claims)
            .into_iter()
            .map(|o| (o.object.clone(), o))
            .collect();
        self.alloc = Some(alloc);
        self.in_flight.clear();
        self.dirty.extend(self.services.items.keys().cloned());
        self.gateways_dirty = true;
        self.pools_dirty = true;
        self.policies_dirty = true;
    }

    /// Stop leading: the table is rebuilt from the statuses next time.
    pub fn follow(&mut self) {
        self.alloc = None;
        self.rebuilt.clear();
        self.in_flight.clear();
    }

    /// What to write and warn now, for everything touched since the last
    /// plan. Nothing unless leading and every watch has listed.
    pub fn plan(&mut self, now: &Time) -> Plan {
        let mut plan = Plan::default();
        if self.alloc.is_none() || !self.all_listed() {
            return plan;
        }
        if self.pools_dirty {
            let pools = self.pool_set();
            if let Some(a) = self.alloc.as_mut() {
                a.set_pools(pools);
            }
            self.dirty.extend(self.services.items.keys().cloned());
            self.gateways_dirty = true;
        }
        let mut counts_moved = self.pools_dirty || self.pool_status_dirty;
        // A claim can displace another (a later joiner of its sharing key
        // whose ports now clash): that one is planned again in the same
        // pass. Each displacement moves an address to an older claim, so
        // the passes end; the bound is a guard, not a rule.
        for _ in 0..8 {
            let dirty = std::mem::take(&mut self.dirty);
            if dirty.is_empty() && !self.gateways_dirty {
                break;
            }
            for key in dirty {
                counts_moved |= self.plan_service(&key, now, &mut plan);
            }
            if std::mem::take(&mut self.gateways_dirty) {
                counts_moved |= self.plan_gateways(now, &mut plan);
            }
        }
        self.rebuilt.clear();
        if counts_moved {
            self.plan_pools(now, &mut plan);
        }
        if std::mem::take(&mut self.policies_dirty) {
            self.plan_policies(now, &mut plan);
        }
        self.pools_dirty = false;
        self.pool_status_dirty = false;
        plan
    }

    /// One Service's write and warnings; whether what it holds changed.
    fn plan_service(&mut self, key: &Key, now: &Time, plan: &mut Plan) -> bool {
        let svc = self.services.get(key).cloned();
        let claim = svc.as_deref().and_then(|s| self.claim(s));
        let Some(alloc) = self.alloc.as_mut() else {
            return false;
        };
        let object = ClaimRef::service(&key.namespace, &key.name);
        let before = alloc.addresses(&object).to_vec();
        let Some(svc) = svc else {
            alloc.release(&object);
            self.in_flight.remove(&Target::Service(key.clone()));
            return !before.is_empty();
        };
        let status = match claim {
            Some(claim) => {
                let outcome = match self.rebuilt.remove(&object) {
                    Some(o) => o,
                    None => alloc.assign(&claim),
                };
                for w in outcome.warnings() {
                    plan.warnings.push(ObjectWarning {
                        object: Target::Service(key.clone()),
                        warning: w,
                    });
                }
                displaced(
                    &outcome.displaced,
                    &mut self.dirty,
                    &mut self.gateways_dirty,
                );
                assigned_status(&svc, &outcome, now)
            }
            None => {
                let released = alloc.release(&object);
                let pools = alloc.pools();
                if left_to_another(&svc, &self.opts) {
                    plan.warnings.push(ObjectWarning {
                        object: Target::Service(key.clone()),
                        warning: Warning {
                            reason: WARN_LEFT_TO_ANOTHER,
                            message: format!(
                                "another load balancer gave this Service its addresses ({}): Rivora leaves it; set spec.loadBalancerClass: {} for Rivora to serve it",
                                ingress_of(&svc)
                                    .iter()
                                    .map(ToString::to_string)
                                    .collect::<Vec<_>>()
                                    .join(", "),
                                self.opts.class
                            ),
                        },
                    });
                }
                // Another class is another installation's (a second
                // Rivora with a class of its own): what it wrote, its
                // condition included, is not this one's to clear, unless
                // this one held the Service until now.
                if released.is_empty() && other_class(&svc, &self.opts) {
                    None
                } else {
                    cleared_status(&svc, &released, |a| pools.pool_of(a).is_some())
                }
            }
        };
        let moved = alloc.addresses(&object) != before.as_slice();
        if let Some(status) = status {
            self.push(plan, Target::Service(key.clone()), &svc.metadata, status);
        }
        moved
    }

    /// Every Gateway's addresses, then the status of every Gateway API
    /// object from one resolution; whether what Gateways hold changed.
    fn plan_gateways(&mut self, now: &Time, plan: &mut Plan) -> bool {
        let mut moved = false;
        let mut outcomes: BTreeMap<Key, Outcome> = BTreeMap::new();
        let gateways: Vec<Arc<Gateway>> = self.gateway.gateways.items.values().cloned().collect();
        for g in &gateways {
            let key = key_of(&**g);
            let object = ClaimRef::gateway(&key.namespace, &key.name);
            let claim = self.gateway_claim(g);
            let Some(alloc) = self.alloc.as_mut() else {
                return false;
            };
            let before = alloc.addresses(&object).to_vec();
            match claim {
                Some(claim) => {
                    let outcome = match self.rebuilt.remove(&object) {
                        Some(o) => o,
                        None => alloc.assign(&claim),
                    };
                    for w in outcome.warnings() {
                        plan.warnings.push(ObjectWarning {
                            object: Target::Gateway(key.clone()),
                            warning: w,
                        });
                    }
                    let gone = outcome.displaced.clone();
                    outcomes.insert(key, outcome);
                    displaced(&gone, &mut self.dirty, &mut self.gateways_dirty);
                }
                None => {
                    alloc.release(&object);
                }
            }
            moved |= alloc.addresses(&object) != before.as_slice();
        }
        // Deleted Gateways release what they held.
        if let Some(alloc) = self.alloc.as_mut() {
            let gone: Vec<ClaimRef> = alloc
                .assignments()
                .map(|(c, _)| c.clone())
                .filter(|c| {
                    c.kind == ClaimKind::Gateway
                        && self
                            .gateway
                            .gateways
                            .get(&Key::new(&c.namespace, &c.name))
                            .is_none()
                })
                .collect();
            for c in gone {
                moved |= !alloc.release(&c).is_empty();
            }
        }
        let copies: Vec<Gateway> = gateways
            .iter()
            .map(|g| with_addresses(g, outcomes.get(&key_of(&**g))))
            .collect();
        let view = View {
            api: &self.gateway,
            gateways: copies,
            services: &self.services,
            namespaces: &self.namespaces,
            policies: None,
        };
        let mut res = rivora_k8s::gateway::resolve(&view);
        explain_unassigned(&mut res, &outcomes);
        let writes = status_writes(&self.gateway, &view, &res, now);
        for (target, rv, body) in writes {
            self.push_rv(plan, target, rv, body);
        }
        moved
    }

    /// Every ServicePolicy's status this installation answers for.
    fn plan_policies(&mut self, now: &Time, plan: &mut Plan) {
        let view = View {
            api: &self.gateway,
            gateways: self
                .gateway
                .gateways
                .items
                .values()
                .map(|g| (**g).clone())
                .collect(),
            services: &self.services,
            namespaces: &self.namespaces,
            policies: Some(&self.policies),
        };
        let res = rivora_k8s::gateway::resolve(&view);
        let listeners = res
            .gateways
            .values()
            .flat_map(|g| {
                g.listeners.iter().map(|l| {
                    let r = rivora_k8s::gateway::ListenerRef {
                        namespace: g.namespace.clone(),
                        gateway: g.name.clone(),
                        listener: l.name.clone(),
                    };
                    (r, l.policy.clone())
                })
            })
            .collect();
        let updates = self
            .policies
            .updates(&self.services, &listeners, &self.opts, now);
        for (key, rv, status) in updates {
            if let Ok(v) = serde_json::to_value(&status) {
                self.push_rv(plan, Target::Policy(key), rv, v);
            }
        }
    }

    fn plan_pools(&mut self, now: &Time, plan: &mut Plan) {
        let Some(alloc) = self.alloc.as_ref() else {
            return;
        };
        let mut writes = Vec::new();
        for pool in self.pools.items.values() {
            let wanted = alloc.pool_status(pool, now);
            let have = pool.status.clone().unwrap_or_default();
            if have == wanted {
                continue;
            }
            if let Ok(v) = serde_json::to_value(&wanted) {
                writes.push((pool.clone(), v));
            }
        }
        writes.sort_by_key(|(p, _)| p.name_any());
        for (pool, status) in writes {
            self.push(plan, Target::Pool(pool.name_any()), &pool.metadata, status);
        }
    }

    fn push(
        &mut self,
        plan: &mut Plan,
        target: Target,
        meta: &kube::api::ObjectMeta,
        status: Value,
    ) {
        let rv = meta.resource_version.clone().unwrap_or_default();
        self.push_rv(plan, target, rv, status);
    }

    fn push_rv(&mut self, plan: &mut Plan, target: Target, rv: String, status: Value) {
        // A write computed from this version is on its way: a second one
        // would only conflict with it. Its answer (the new version
        // through the watch, or a failure) plans the object again.
        if self.in_flight.get(&target) == Some(&rv) {
            return;
        }
        self.in_flight.insert(target.clone(), rv.clone());
        plan.writes.push(Write {
            target,
            resource_version: rv,
            status,
        });
    }

    /// Per pool in use and family: (assigned, available).
    pub fn gauges(&self) -> PoolGauges {
        let mut g = PoolGauges::new();
        let Some(alloc) = self.alloc.as_ref() else {
            return g;
        };
        for p in alloc.pools().accepted() {
            if let Some(c) = alloc.pool_counts(&p.name) {
                g.insert((p.name.clone(), "ipv4"), (c.assigned[0], c.available[0]));
                g.insert((p.name.clone(), "ipv6"), (c.assigned[1], c.available[1]));
            }
        }
        g
    }
}

fn ingress_of(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or(&[])
        .iter()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

fn conditions_of(svc: &Service) -> Vec<Condition> {
    svc.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
}

/// The `status` patch that gives a Service its outcome, or None when its
/// status says so already. Other conditions are kept as they are; the
/// ingress list is Rivora's alone for a Service that is Rivora's.
pub fn assigned_status(svc: &Service, outcome: &Outcome, now: &Time) -> Option<Value> {
    let mut conditions = conditions_of(svc);
    let before = conditions.clone();
    merge_condition(
        &mut conditions,
        outcome.condition(svc.metadata.generation, now),
    );
    let ingress_same = ingress_of(svc) == outcome.addresses && !has_ingress_extras(svc);
    if ingress_same && conditions == before {
        return None;
    }
    let lb: LoadBalancerStatus = outcome.load_balancer_status();
    Some(json!({
        "loadBalancer": lb,
        "conditions": conditions,
    }))
}

/// Whether an ingress entry carries more than an IP (a hostname, ports,
/// an ipMode other than the `VIP` the API server fills in): rewritten to
/// Rivora's plain form.
fn has_ingress_extras(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or(&[])
        .iter()
        .any(|i| {
            i.ip.is_none()
                || i.hostname.is_some()
                || i.ports.is_some()
                || i.ip_mode.as_deref().is_some_and(|m| m != "VIP")
        })
}

/// The `status` patch for a Service that is no longer Rivora's: without
/// Rivora's condition, and without the ingress when Rivora held it (what
/// it released now, or, after a restart, addresses of Rivora's pools
/// under Rivora's condition). None when there is nothing of Rivora's.
/// Claims that lost an address to another: planned again.
fn displaced(gone: &[ClaimRef], dirty: &mut BTreeSet<Key>, gateways_dirty: &mut bool) {
    for c in gone {
        match c.kind {
            ClaimKind::Service => {
                dirty.insert(Key::new(&c.namespace, &c.name));
            }
            ClaimKind::Gateway => *gateways_dirty = true,
        }
    }
}

/// Event reason on a Service of no class another implementation serves.
pub const WARN_LEFT_TO_ANOTHER: &str = "LeftToAnotherLoadBalancer";

/// A LoadBalancer Service of no class, which Rivora would take, whose
/// addresses another implementation wrote first.
fn left_to_another(svc: &Service, opts: &TranslateOptions) -> bool {
    let spec = svc.spec.as_ref();
    opts.accept_unset_class
        && spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        && spec.is_some_and(|s| s.load_balancer_class.is_none())
        && rivora_k8s::translate::written_by_another(svc)
}

/// A Service that names a class other than this installation's.
fn other_class(svc: &Service, opts: &TranslateOptions) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.load_balancer_class.as_deref())
        .is_some_and(|c| c != opts.class)
}

pub fn cleared_status(
    svc: &Service,
    released: &[IpAddr],
    in_pools: impl Fn(IpAddr) -> bool,
) -> Option<Value> {
    let mut conditions = conditions_of(svc);
    let had_condition = conditions
        .iter()
        .any(|c| c.type_ == CONDITION_ADDRESS_ASSIGNED);
    conditions.retain(|c| c.type_ != CONDITION_ADDRESS_ASSIGNED);
    let ingress = ingress_of(svc);
    let ours = !ingress.is_empty()
        && ingress
            .iter()
            .all(|a| released.contains(a) || (had_condition && in_pools(*a)));
    if !had_condition && !ours {
        return None;
    }
    let mut status = json!({ "conditions": if conditions.is_empty() { Value::Null } else { json!(conditions) } });
    if ours {
        status["loadBalancer"] = json!({ "ingress": null });
    }
    Some(status)
}

#[cfg(test)]
mod tests;
