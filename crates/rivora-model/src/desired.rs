//! Desired state from many sources.
//!
//! Each source (the static file; later Services and Gateways) owns
//! objects, and each object wants some VIPs. The store keeps what every
//! object last said and merges it into one set, where a VIP key has one
//! owner: the object that claimed it first. A later claim of the same key
//! is a [`Conflict`] that names both owners and stays out of the merged
//! set, so the first owner's VIP keeps forwarding. When the owner lets
//! the key go, the oldest remaining claimant takes it.
//!
//! The store also knows which sources are active and which of them have
//! finished their first full pass ([`DesiredStore::all_synced`]): VIPs
//! adopted from the pinned maps that nothing claims may be removed only
//! then, since before it an unclaimed VIP may simply not have been listed
//! yet.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::health::HealthCheckSpec;
use crate::model::{Vip, VipKey};

/// Where desired state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// The static YAML file.
    File,
    /// Kubernetes Services and their EndpointSlices.
    Service,
    /// Kubernetes Gateways and their routes.
    Gateway,
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::File => "file",
            SourceKind::Service => "service",
            SourceKind::Gateway => "gateway",
        })
    }
}

/// One object of a source: the file's path, a Service's `ns/name`.
/// Cheap to clone: every VIP of an object names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub source: SourceKind,
    pub object: Arc<str>,
}

impl Owner {
    pub fn new(source: SourceKind, object: impl AsRef<str>) -> Self {
        Self {
            source,
            object: Arc::from(object.as_ref()),
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.source, self.object)
    }
}

/// A VIP as a source wants it, with what the dataplane does not hold:
/// its display name, the health check of each backend, and which nodes
/// can serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredVip {
    pub vip: Vip,
    /// A label for humans (rivoractl, metrics).
    pub name: String,
    /// The active check of each backend, index for index with
    /// `vip.backends` (None: not probed). Shared: many backends and VIPs
    /// use one spec, and unprobed ones cost a pointer.
    pub health: Vec<Option<Arc<HealthCheckSpec>>>,
    /// Whether the backends are this node's alone.
    pub traffic_policy: TrafficPolicy,
    /// Why its source will not have it served (an address no pool
    /// admits): the reconciler writes nothing of it, lists it as not
    /// applied with this reason, and never lets it hold a key another
    /// object claims.
    pub refused: Option<String>,
}

/// Which nodes can serve a VIP, as a Kubernetes Service's
/// `externalTrafficPolicy` says: the L2 speaker lets only a node that
/// serves a VIP announce it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    /// Every node forwards to every backend (the file's VIPs, Gateways,
    /// `externalTrafficPolicy: Cluster`).
    #[default]
    Cluster,
    /// `externalTrafficPolicy: Local`: this node's endpoints alone, so
    /// only a node with one may announce the VIP.
    Local,
}

impl DesiredVip {
    /// A VIP nobody probes, named by its key.
    pub fn unprobed(vip: Vip) -> Self {
        Self {
            name: vip.key().to_string(),
            health: vec![None; vip.backends.len()],
            vip,
            traffic_policy: TrafficPolicy::Cluster,
            refused: None,
        }
    }
}

/// A VIP key claimed by two objects: `refused` is kept out of the
/// dataplane while `owner` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    pub vip: VipKey,
    pub owner: Owner,
    pub refused: Owner,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VIP {} is claimed by {} and by {}: {} keeps it, {}'s claim is not applied",
            self.vip, self.owner, self.refused, self.owner, self.refused
        )
    }
}

/// Everything merged: one owner per VIP key. The VIPs are shared with
/// the store, not copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Merged {
    pub vips: BTreeMap<VipKey, (Owner, Arc<DesiredVip>)>,
    pub conflicts: Vec<Conflict>,
}

#[derive(Debug, Clone)]
struct Entry {
    /// When the object first said anything: older claims win.
    seq: u64,
    vips: Vec<Arc<DesiredVip>>,
}

/// What every object of every source wants.
#[derive(Debug, Clone, Default)]
pub struct DesiredStore {
    objects: BTreeMap<Owner, Entry>,
    next_seq: u64,
    /// Active sources, and whether each has finished its first pass.
    sources: BTreeMap<SourceKind, bool>,
}

impl DesiredStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A source that will report: until it is synced, nothing unclaimed
    /// is pruned.
    pub fn register(&mut self, source: SourceKind) {
        self.sources.entry(source).or_insert(false);
    }

    /// The source has listed everything it owns once.
    pub fn mark_synced(&mut self, source: SourceKind) {
        self.sources.insert(source, true);
    }

    /// Every active source has finished its first pass (and there is at
    /// least one: with none, nobody has said what is wanted).
    pub fn all_synced(&self) -> bool {
        !self.sources.is_empty() && self.sources.values().all(|s| *s)
    }

    pub fn sources(&self) -> impl Iterator<Item = (SourceKind, bool)> + '_ {
        self.sources.iter().map(|(k, v)| (*k, *v))
    }

    /// Replace what `owner` wants. An object keeps its age across
    /// updates; an empty set removes it.
    pub fn set(&mut self, owner: Owner, vips: Vec<DesiredVip>) {
        if vips.is_empty() {
            self.objects.remove(&owner);
            return;
        }
        let vips: Vec<Arc<DesiredVip>> = vips.into_iter().map(Arc::new).collect();
        match self.objects.get_mut(&owner) {
            Some(e) => e.vips = vips,
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.objects.insert(owner, Entry { seq, vips });
            }
        }
    }

    pub fn remove(&mut self, owner: &Owner) {
        self.objects.remove(owner);
    }

    /// The objects of `source`, for a source that replaces its whole set.
    pub fn objects_of(&self, source: SourceKind) -> BTreeSet<Owner> {
        self.objects
            .keys()
            .filter(|o| o.source == source)
            .cloned()
            .collect()
    }

    /// One owner per VIP key, oldest claim first; a refused claim only
    /// after every other (a status written by hand cannot displace an
    /// address's owner).
    pub fn merged(&self) -> Merged {
        let mut order: Vec<(bool, &Owner, &Arc<DesiredVip>, u64)> = self
            .objects
            .iter()
            .flat_map(|(o, e)| {
                e.vips
                    .iter()
                    .map(move |v| (v.refused.is_some(), o, v, e.seq))
            })
            .collect();
        order.sort_by(|a, b| (a.0, a.3, a.1).cmp(&(b.0, b.3, b.1)));
        let mut out = Merged::default();
        for (_, owner, v, _) in order {
            let key = v.vip.key();
            match out.vips.get(&key) {
                Some((first, _)) => out.conflicts.push(Conflict {
                    vip: key,
                    owner: first.clone(),
                    refused: owner.clone(),
                }),
                None => {
                    out.vips.insert(key, (owner.clone(), Arc::clone(v)));
                }
            }
        }
        out
    }
}

/// The static file's VIPs, each with its name and its backends' checks.
pub fn from_config(cfg: &Config) -> Vec<DesiredVip> {
    let mut shared: Vec<Arc<HealthCheckSpec>> = Vec::new();
    cfg.desired
        .vips
        .iter()
        .map(|v| {
            let key = v.key();
            let health = v
                .backends
                .iter()
                .map(|b| {
                    let probe = SocketAddr::new(b.addr, b.service_port(&key.ports));
                    cfg.health.get(&(key, probe)).cloned().flatten()
                })
                .collect::<Vec<_>>();
            // One allocation per distinct spec, shared by every backend
            // that uses it (a file's default check is usually all of them).
            let health = health
                .into_iter()
                .map(|spec| {
                    spec.map(|s| match shared.iter().find(|x| ***x == s) {
                        Some(x) => Arc::clone(x),
                        None => {
                            let a = Arc::new(s);
                            shared.push(Arc::clone(&a));
                            a
                        }
                    })
                })
                .collect();
            DesiredVip {
                vip: v.clone(),
                name: cfg
                    .names
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| key.to_string()),
                health,
                traffic_policy: TrafficPolicy::Cluster,
                refused: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Backend, Mode, Ports, Protocol};

    fn vip(addr: &str, port: u16, backend: &str) -> DesiredVip {
        DesiredVip::unprobed(Vip {
            addr: addr.parse().unwrap(),
            ports: Ports::One(port),
            proto: Protocol::Tcp,
            mode: Mode::Nat,
            affinity: Default::default(),
            rate_limit: None,
            source_ranges: None,
            backends: vec![Backend {
                addr: backend.parse().unwrap(),
                port: 8080,
                weight: 1,
                mac: None,
                mode: None,
                node: None,
            }],
        })
    }

    fn svc(name: &str) -> Owner {
        Owner::new(SourceKind::Service, name)
    }

    /// A claim its source refuses (an address written into a status by
    /// hand) holds a key only while nobody else claims it, however old.
    #[test]
    fn a_refused_claim_never_displaces_another() {
        let mut s = DesiredStore::new();
        let mut grab = vip("10.0.0.1", 80, "10.1.0.9");
        grab.refused = Some("in no pool".into());
        s.set(svc("b/grab"), vec![grab.clone()]);
        let m = s.merged();
        assert_eq!(m.vips.values().next().map(|(o, _)| o), Some(&svc("b/grab")));
        s.set(svc("a/owner"), vec![vip("10.0.0.1", 80, "10.1.0.1")]);
        let m = s.merged();
        let (owner, v) = m.vips.values().next().unwrap();
        assert_eq!(*owner, svc("a/owner"));
        assert!(v.refused.is_none());
        assert_eq!(
            m.conflicts,
            vec![Conflict {
                vip: grab.vip.key(),
                owner: svc("a/owner"),
                refused: svc("b/grab"),
            }]
        );
    }

    #[test]
    fn the_first_claim_keeps_the_key_and_the_second_is_a_conflict() {
        let mut s = DesiredStore::new();
        s.set(svc("a/one"), vec![vip("10.0.0.1", 80, "10.1.0.1")]);
        s.set(svc("a/two"), vec![vip("10.0.0.1", 80, "10.1.0.2")]);
        let m = s.merged();
        assert_eq!(m.vips.len(), 1);
        let (owner, v) = m.vips.values().next().unwrap();
        assert_eq!(owner, &svc("a/one"));
        let v = &**v;
        assert_eq!(v.vip.backends[0].addr.to_string(), "10.1.0.1");
        assert_eq!(
            m.conflicts,
            vec![Conflict {
                vip: v.vip.key(),
                owner: svc("a/one"),
                refused: svc("a/two"),
            }]
        );
        let msg = m.conflicts[0].to_string();
        assert!(
            msg.contains("service a/one") && msg.contains("service a/two"),
            "{msg}"
        );
    }

    #[test]
    fn age_survives_updates_and_the_next_claimant_takes_over_a_released_key() {
        let mut s = DesiredStore::new();
        s.set(svc("a/one"), vec![vip("10.0.0.1", 80, "10.1.0.1")]);
        s.set(svc("a/two"), vec![vip("10.0.0.1", 80, "10.1.0.2")]);
        // An update of the older object does not make it younger.
        s.set(svc("a/one"), vec![vip("10.0.0.1", 80, "10.1.0.9")]);
        assert_eq!(s.merged().vips.values().next().unwrap().0, svc("a/one"));
        // Released (an empty set removes the object): a/two takes it.
        s.set(svc("a/one"), vec![]);
        let m = s.merged();
        assert!(m.conflicts.is_empty());
        assert_eq!(m.vips.values().next().unwrap().0, svc("a/two"));
    }

    #[test]
    fn age_not_name_decides() {
        let mut s = DesiredStore::new();
        // "z" sorts after "a" but claimed first.
        s.set(svc("z/first"), vec![vip("10.0.0.1", 80, "10.1.0.1")]);
        s.set(svc("a/second"), vec![vip("10.0.0.1", 80, "10.1.0.2")]);
        assert_eq!(s.merged().vips.values().next().unwrap().0, svc("z/first"));
    }

    #[test]
    fn distinct_keys_from_many_sources_merge() {
        let mut s = DesiredStore::new();
        s.set(
            Owner::new(SourceKind::File, "/etc/rivora/rivora.yaml"),
            vec![vip("10.0.0.1", 80, "10.1.0.1")],
        );
        s.set(svc("a/one"), vec![vip("10.0.0.1", 443, "10.1.0.1")]);
        s.set(
            Owner::new(SourceKind::Gateway, "a/gw"),
            vec![vip("10.0.0.2", 80, "10.1.0.1")],
        );
        let m = s.merged();
        assert_eq!(m.vips.len(), 3);
        assert!(m.conflicts.is_empty());
        assert_eq!(s.objects_of(SourceKind::Service), [svc("a/one")].into());
    }

    #[test]
    fn synced_only_when_every_registered_source_is() {
        let mut s = DesiredStore::new();
        assert!(!s.all_synced(), "no source has said anything");
        s.register(SourceKind::Service);
        s.register(SourceKind::Gateway);
        s.mark_synced(SourceKind::Service);
        assert!(!s.all_synced());
        s.mark_synced(SourceKind::Gateway);
        assert!(s.all_synced());
        // Registering again does not forget a pass already made.
        s.register(SourceKind::Gateway);
        assert!(s.all_synced());
    }
}
