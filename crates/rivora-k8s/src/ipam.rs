//! The address allocator of rivora-controller: pools in, claims in,
//! assignments out. Pure and deterministic: no API server, no clock, no
//! randomness; the same pools and the same sequence of claims give the same
//! addresses on every replica.
//!
//! The rules, each a row of the tests below:
//! - Pools ([`PoolSet`]): a pool whose spec is invalid is not used; of two
//!   valid pools that overlap, the younger (creationTimestamp, then name)
//!   is refused, `Conflict=True` on it. Only pools in use claim address
//!   space: a pool overlapping only a refused pool is used.
//! - Never two owners of an address, except claims with the same
//!   `rivora.io/sharing-key`, no (protocol, port) in common and the same
//!   externalTrafficPolicy: they share it.
//! - What a claim already holds is kept while the claim still wants it:
//!   its family is still wanted, it is still requested (when addresses
//!   are requested), and its co-owners still allow sharing. Pools do not
//!   enter: an address that lies in no pool any more, or in one whose
//!   selectors no longer admit the claim, is kept and flagged ([`Flag`]),
//!   never silently changed; removed from the status, it is gone.
//! - What a claim holds is its status ([`Claim::current`]): the API
//!   server's is the truth. The table stands in for it only for the very
//!   version of the object it last assigned from ([`Claim::version`]),
//!   whose write may still be in flight; a claim read from any later
//!   version brings a status that replaces the table's (the write's
//!   result, the change that got the write refused, or a hand edit), and
//!   an address the table picked that this status lacks is free again.
//! - A requested address (`rivora.io/load-balancer-ips`, else the
//!   deprecated `spec.loadBalancerIP`) is given when it lies in a pool in
//!   use that admits the claim, is not skipped by avoidBuggyIPs, and is
//!   free or shareable; otherwise the [`AllocError`] says which. Pools
//!   with `autoAssign: false` serve requests only.
//! - Otherwise, per family: an address already held under the claim's
//!   sharing key that it may share, else the lowest free address of the
//!   first pool (priority, absent last, then name) that has one.
//! - Families: SingleStack takes the first of `spec.ipFamilies` (IPv4
//!   when unset); PreferDualStack takes what it can of `ipFamilies`;
//!   RequireDualStack needs both, and when one cannot be served nothing
//!   new is assigned (what it already held stays).
//! - [`Allocator::rebuild`] seeds the table from every claim's status
//!   before it assigns anything, oldest claim first, so a restart or a
//!   failover keeps every address.
//! - [`Allocator::release`] on delete, or when the object stops being
//!   Rivora's (type, class); a request that no longer names an address
//!   releases it.
//!
//! Used addresses are a sorted map of numbers per family: a free address
//! is found by walking the used ones from the start of a range, and
//! counts are arithmetic, so an IPv6 /64 is never enumerated.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::policy::merge_condition;
use crate::pool::{
    addr_key, by_age, check_pool, is_buggy, AddressPool, AddressPoolStatus, Family, FamilyCounts,
    ParsedPool, PoolIssue, SelectorKind, REASON_NO_CONFLICT, REASON_OVERLAP, REASON_READY,
};
use crate::translate::{is_ours, TranslateOptions, Warning};

/// Requested addresses, comma-separated, at most one per family.
pub const ANNOTATION_LOAD_BALANCER_IPS: &str = "rivora.io/load-balancer-ips";
/// Claims with the same key may share an address.
pub const ANNOTATION_SHARING_KEY: &str = "rivora.io/sharing-key";
/// The Service condition the controller writes from an [`Outcome`].
pub const CONDITION_ADDRESS_ASSIGNED: &str = "rivora.io/AddressAssigned";
pub const REASON_ASSIGNED: &str = "Assigned";

// ---------------------------------------------------------------------------
// Pools

/// The pools the allocator uses, in the order it tries them, and why the
/// others are not used.
#[derive(Debug, Clone, Default)]
pub struct PoolSet {
    /// In use, in allocation order: priority (absent last), then name.
    accepted: Vec<ParsedPool>,
    /// Every range of the pools in use, by (family, first): (last, index
    /// into `accepted`). Ranges in use never overlap.
    index: BTreeMap<(Family, u128), (u128, usize)>,
    /// Pools not used, by name.
    refused: BTreeMap<String, PoolIssue>,
}

impl PoolSet {
    /// Parse and check every pool; the younger of two that overlap is
    /// refused. The order pools are given in does not matter.
    pub fn new<'a>(pools: impl IntoIterator<Item = &'a AddressPool>) -> PoolSet {
        let mut order: Vec<&AddressPool> = pools.into_iter().collect();
        order.sort_by(|a, b| {
            by_age(
                a.metadata.creation_timestamp.as_ref(),
                b.metadata.creation_timestamp.as_ref(),
            )
            .then_with(|| a.name_any().cmp(&b.name_any()))
        });
        let mut set = PoolSet::default();
        // (family, first) -> (last, pool name), to name the older pool.
        let mut taken: BTreeMap<(Family, u128), (u128, String)> = BTreeMap::new();
        let mut accepted = Vec::new();
        for pool in order {
            let name = pool.name_any();
            let parsed = match check_pool(&name, &pool.spec) {
                Ok(p) => p,
                Err(issue) => {
                    set.refused.insert(name, issue);
                    continue;
                }
            };
            let overlap = parsed.ranges.iter().find_map(|r| {
                // Ranges in `taken` are disjoint and sorted: the last one
                // starting at or below r.last is the only candidate.
                taken
                    .range(..=(r.family, r.last))
                    .next_back()
                    .filter(|((f, _), (last, _))| *f == r.family && *last >= r.first)
                    .map(|((f, first), (last, older))| {
                        let theirs = crate::pool::IpRange {
                            family: *f,
                            first: *first,
                            last: *last,
                        };
                        (*r, theirs, older.clone())
                    })
            });
            if let Some((mine, theirs, older)) = overlap {
                set.refused.insert(
                    name,
                    PoolIssue {
                        reason: REASON_OVERLAP,
                        message: format!(
                            "addresses {mine} overlap {theirs} of the older AddressPool {older}: this pool is not used"
                        ),
                    },
                );
                continue;
            }
            for r in &parsed.ranges {
                taken.insert((r.family, r.first), (r.last, name.clone()));
            }
            accepted.push(parsed);
        }
        accepted.sort_by(|a: &ParsedPool, b: &ParsedPool| a.order_key().cmp(&b.order_key()));
        for (i, p) in accepted.iter().enumerate() {
            for r in &p.ranges {
                set.index.insert((r.family, r.first), (r.last, i));
            }
        }
        set.accepted = accepted;
        set
    }

    /// The pools in use, in allocation order.
    pub fn accepted(&self) -> &[ParsedPool] {
        &self.accepted
    }

    /// A pool in use, by name.
    pub fn pool(&self, name: &str) -> Option<&ParsedPool> {
        self.accepted.iter().find(|p| p.name == name)
    }

    /// Why a pool is not used, if it is not.
    pub fn refusal(&self, name: &str) -> Option<&PoolIssue> {
        self.refused.get(name)
    }

    /// The pool in use that holds an address.
    pub fn pool_of(&self, addr: IpAddr) -> Option<&ParsedPool> {
        let (f, n) = addr_key(addr);
        self.index
            .range(..=(f, n))
            .next_back()
            .filter(|((family, _), (last, _))| *family == f && n <= *last)
            .and_then(|(_, (_, i))| self.accepted.get(*i))
    }

    /// The pool's `Ready` and `Conflict` conditions.
    pub fn conditions(&self, pool: &AddressPool, now: &Time) -> Vec<Condition> {
        let generation = pool.metadata.generation;
        let cond = |type_: &str, ok: bool, reason: &str, message: String| Condition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        };
        let no_conflict = || {
            cond(
                "Conflict",
                false,
                REASON_NO_CONFLICT,
                "no older AddressPool overlaps this one".into(),
            )
        };
        match self.refused.get(&pool.name_any()) {
            None => vec![
                cond(
                    "Ready",
                    true,
                    REASON_READY,
                    "the pool is valid and in use".into(),
                ),
                no_conflict(),
            ],
            Some(issue) if issue.reason == REASON_OVERLAP => vec![
                cond("Ready", false, issue.reason, issue.message.clone()),
                cond("Conflict", true, issue.reason, issue.message.clone()),
            ],
            Some(issue) => vec![
                cond("Ready", false, issue.reason, issue.message.clone()),
                no_conflict(),
            ],
        }
    }
}

// ---------------------------------------------------------------------------
// Claims

/// What holds addresses: a Service, or (later) a Gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimKind {
    Service,
    Gateway,
}

/// A namespaced object that holds addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimRef {
    pub kind: ClaimKind,
    pub namespace: String,
    pub name: String,
}

impl ClaimRef {
    pub fn service(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            kind: ClaimKind::Service,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ClaimKind::Service => "Service",
            ClaimKind::Gateway => "Gateway",
        };
        write!(f, "{kind} {}/{}", self.namespace, self.name)
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FamilyPolicy {
    #[default]
    SingleStack,
    PreferDualStack,
    RequireDualStack,
}

/// Which addresses a claim asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Request {
    /// None in particular: from pools with autoAssign.
    #[default]
    Auto,
    /// These, at most one per family.
    Addresses(Vec<IpAddr>),
    /// The request could not be read; what the claim holds is kept.
    Invalid(RequestProblem),
}

/// Why a request could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestProblem {
    #[error("{ANNOTATION_LOAD_BALANCER_IPS}: {0:?} is not an IP address")]
    Unreadable(String),
    #[error("spec.loadBalancerIP: {0:?} is not an IP address")]
    UnreadableLoadBalancerIp(String),
    #[error("{ANNOTATION_LOAD_BALANCER_IPS} names two {family} addresses ({a} and {b}); at most one per family")]
    TwoOfOneFamily {
        family: Family,
        a: IpAddr,
        b: IpAddr,
    },
    #[error("spec.loadBalancerIP {lb_ip} is not among the {ANNOTATION_LOAD_BALANCER_IPS} addresses; remove the deprecated field or make them agree")]
    Disagree { lb_ip: IpAddr },
    #[error("no TCP or UDP port (only {protocols}): Rivora forwards TCP and UDP alone, so no address is assigned")]
    NoServablePort { protocols: String },
}

/// What decides whether two claims may share an address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sharing {
    /// `rivora.io/sharing-key`; without one a claim shares with no one.
    pub key: Option<String>,
    /// (protocol, port) of every port.
    pub ports: BTreeSet<(String, i32)>,
    /// `externalTrafficPolicy: Local`.
    pub local: bool,
}

/// Why one claim may not share an address with another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareRefusal {
    /// Keys differ, or one or both are unset.
    Key {
        mine: Option<String>,
        theirs: Option<String>,
    },
    /// Both use this (protocol, port).
    Port {
        protocol: String,
        port: i32,
    },
    TrafficPolicy {
        mine_local: bool,
    },
    /// Another namespace's, and the address's pool does not allow
    /// sharing across namespaces.
    Namespace {
        theirs: String,
    },
}

impl fmt::Display for ShareRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShareRefusal::Key { mine, theirs } => {
                let k =
                    |k: &Option<String>| k.as_deref().map_or("none".into(), |k| format!("{k:?}"));
                write!(
                    f,
                    "only claims with the same {ANNOTATION_SHARING_KEY} share an address; this one's is {}, theirs {}",
                    k(mine),
                    k(theirs)
                )
            }
            ShareRefusal::Port { protocol, port } => {
                write!(f, "both use port {port}/{protocol}")
            }
            ShareRefusal::Namespace { theirs } => write!(
                f,
                "it is held in namespace {theirs}, and its AddressPool does not set allowSharingAcrossNamespaces"
            ),
            ShareRefusal::TrafficPolicy { mine_local } => {
                let name = |local: bool| if local { "Local" } else { "Cluster" };
                write!(
                    f,
                    "externalTrafficPolicy differs ({} here, {} there)",
                    name(*mine_local),
                    name(!*mine_local)
                )
            }
        }
    }
}

impl Sharing {
    /// Why `self` may not share an address with `other`, if it may not.
    pub fn refusal(&self, other: &Sharing) -> Option<ShareRefusal> {
        match (&self.key, &other.key) {
            (Some(a), Some(b)) if a == b => {}
            _ => {
                return Some(ShareRefusal::Key {
                    mine: self.key.clone(),
                    theirs: other.key.clone(),
                })
            }
        }
        if self.local != other.local {
            return Some(ShareRefusal::TrafficPolicy {
                mine_local: self.local,
            });
        }
        self.ports
            .intersection(&other.ports)
            .next()
            .map(|(protocol, port)| ShareRefusal::Port {
                protocol: protocol.clone(),
                port: *port,
            })
    }
}

/// One object that wants addresses, as the allocator reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub object: ClaimRef,
    /// Orders [`Allocator::rebuild`]: the older claim keeps a disputed
    /// address.
    pub created: Option<Time>,
    pub labels: BTreeMap<String, String>,
    pub namespace_labels: BTreeMap<String, String>,
    /// `spec.ipFamilies` in order, without repeats; never empty.
    pub families: Vec<Family>,
    pub family_policy: FamilyPolicy,
    pub request: Request,
    pub sharing: Sharing,
    /// The addresses in its status now (`status.loadBalancer.ingress`).
    pub current: Vec<IpAddr>,
    /// The `resourceVersion` of the object it was read from: the table's
    /// addresses for the claim count instead of `current` only while it
    /// is the version they were assigned from. None for a caller that
    /// tracks no versions: the table then always counts.
    pub version: Option<String>,
}

impl Claim {
    /// An IPv4 single-stack claim that asks for nothing in particular.
    pub fn new(object: ClaimRef) -> Self {
        Self {
            object,
            created: None,
            labels: BTreeMap::new(),
            namespace_labels: BTreeMap::new(),
            families: vec![Family::V4],
            family_policy: FamilyPolicy::SingleStack,
            request: Request::Auto,
            sharing: Sharing::default(),
            current: Vec::new(),
            version: None,
        }
    }

    /// The families it wants, in its order.
    pub fn wanted(&self) -> Vec<Family> {
        let mut fams: Vec<Family> = Vec::with_capacity(2);
        for f in &self.families {
            if !fams.contains(f) {
                fams.push(*f);
            }
        }
        if fams.is_empty() {
            fams.push(Family::V4);
        }
        match self.family_policy {
            FamilyPolicy::SingleStack => fams.truncate(1),
            FamilyPolicy::PreferDualStack => {}
            FamilyPolicy::RequireDualStack => {
                let other = fams[0].other();
                if !fams.contains(&other) {
                    fams.push(other);
                }
            }
        }
        fams
    }

    fn required(&self, wanted: &[Family]) -> Vec<Family> {
        match self.family_policy {
            FamilyPolicy::SingleStack | FamilyPolicy::RequireDualStack => wanted.to_vec(),
            FamilyPolicy::PreferDualStack => Vec::new(),
        }
    }
}

/// The claim of a Service Rivora assigns addresses to, or None when it is
/// not one (type, class: [`is_ours`]). `namespace_labels` are the labels
/// of its Namespace, for pools' namespaceSelector.
pub fn service_claim(
    svc: &Service,
    namespace_labels: &BTreeMap<String, String>,
    opts: &TranslateOptions,
) -> Option<Claim> {
    if !is_ours(svc, opts) {
        return None;
    }
    let spec = svc.spec.as_ref()?;
    let mut claim = Claim::new(ClaimRef::service(
        svc.namespace().unwrap_or_default(),
        svc.name_any(),
    ));
    claim.created = svc.metadata.creation_timestamp.clone();
    claim.labels = svc.labels().clone();
    claim.namespace_labels = namespace_labels.clone();
    let families: Vec<Family> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| Family::parse(f))
        .collect();
    if !families.is_empty() {
        claim.families = families;
    }
    claim.family_policy = match spec.ip_family_policy.as_deref() {
        Some("PreferDualStack") => FamilyPolicy::PreferDualStack,
        Some("RequireDualStack") => FamilyPolicy::RequireDualStack,
        _ => FamilyPolicy::SingleStack,
    };
    claim.request = read_request(
        svc.annotations()
            .get(ANNOTATION_LOAD_BALANCER_IPS)
            .map(String::as_str),
        spec.load_balancer_ip.as_deref(),
    );
    // An address nothing would forward (SCTP alone) would be announced
    // and counted as served: refuse it, and say why.
    let protocols: BTreeSet<String> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| p.protocol.clone().unwrap_or_else(|| "TCP".into()))
        .collect();
    if !protocols.is_empty() && !protocols.iter().any(|p| p == "TCP" || p == "UDP") {
        claim.request = Request::Invalid(RequestProblem::NoServablePort {
            protocols: protocols.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    claim.sharing = Sharing {
        key: svc
            .annotations()
            .get(ANNOTATION_SHARING_KEY)
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty()),
        ports: spec
            .ports
            .iter()
            .flatten()
            .map(|p| (p.protocol.clone().unwrap_or_else(|| "TCP".into()), p.port))
            .collect(),
        local: spec.external_traffic_policy.as_deref() == Some("Local"),
    };
    claim.current = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or(&[])
        .iter()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    claim.version = svc.metadata.resource_version.clone();
    Some(claim)
}

/// The families a Gateway asks for (comma-separated, in order, e.g.
/// `IPv4,IPv6`): Gateways have no `ipFamilies`. Without it, or with only
/// requested addresses, the families of those addresses, else IPv4.
pub const ANNOTATION_IP_FAMILIES: &str = "rivora.io/ip-families";

impl ClaimRef {
    pub fn gateway(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            kind: ClaimKind::Gateway,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// The claim of a Gateway of Rivora's class (the caller says whether its
/// class is Rivora's), or None when it is not Rivora's. Requests are its
/// `spec.addresses` of type `IPAddress` (another type is the Gateway
/// rules' `UnsupportedAddress`, not the allocator's); sharing is by the
/// `rivora.io/sharing-key` annotation over its listeners' (protocol,
/// port); families by [`ANNOTATION_IP_FAMILIES`], else its requests'.
pub fn gateway_claim(
    gw: &crate::gateway::api::gateways::Gateway,
    rivoras_class: bool,
    namespace_labels: &BTreeMap<String, String>,
) -> Option<Claim> {
    if !rivoras_class {
        return None;
    }
    let mut claim = Claim::new(ClaimRef::gateway(
        gw.namespace().unwrap_or_default(),
        gw.name_any(),
    ));
    claim.created = gw.metadata.creation_timestamp.clone();
    claim.labels = gw.labels().clone();
    claim.namespace_labels = namespace_labels.clone();
    let mut requested: Vec<IpAddr> = Vec::new();
    for a in gw.spec.addresses.iter().flatten() {
        if a.r#type.as_deref().is_some_and(|t| t != "IPAddress") {
            continue;
        }
        let Some(v) = a.value.as_deref().map(str::trim).filter(|v| !v.is_empty()) else {
            continue;
        };
        match v.parse::<IpAddr>() {
            Ok(ip) if !requested.contains(&ip) => requested.push(ip),
            Ok(_) => {}
            Err(_) => {
                claim.request = Request::Invalid(RequestProblem::Unreadable(v.to_string()));
            }
        }
    }
    if !matches!(claim.request, Request::Invalid(_)) && !requested.is_empty() {
        let joined: Vec<String> = requested.iter().map(ToString::to_string).collect();
        claim.request = read_request(Some(&joined.join(",")), None);
    }
    let asked: Vec<Family> = gw
        .annotations()
        .get(ANNOTATION_IP_FAMILIES)
        .map(|v| {
            v.split(',')
                .filter_map(|f| Family::parse(f.trim()))
                .collect()
        })
        .unwrap_or_default();
    let families: Vec<Family> = if !asked.is_empty() {
        asked
    } else if !requested.is_empty() {
        requested.iter().map(|a| Family::of(*a)).collect()
    } else {
        vec![Family::V4]
    };
    claim.family_policy = if families.len() > 1 {
        FamilyPolicy::RequireDualStack
    } else {
        FamilyPolicy::SingleStack
    };
    claim.families = families;
    claim.sharing = Sharing {
        key: gw
            .annotations()
            .get(ANNOTATION_SHARING_KEY)
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty()),
        ports: gw
            .spec
            .listeners
            .iter()
            .map(|l| {
                let proto = if l.protocol == "UDP" { "UDP" } else { "TCP" };
                (proto.to_string(), l.port)
            })
            .collect(),
        local: false,
    };
    claim.current = gw
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.r#type.as_deref().is_none_or(|t| t == "IPAddress"))
        .filter_map(|a| a.value.parse().ok())
        .collect();
    claim.version = gw.metadata.resource_version.clone();
    Some(claim)
}

/// The request of the annotation (comma-separated addresses), else of the
/// deprecated `spec.loadBalancerIP`. Empty values are no request.
pub fn read_request(annotation: Option<&str>, load_balancer_ip: Option<&str>) -> Request {
    let lb_ip = match load_balancer_ip.map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match s.parse::<IpAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                return Request::Invalid(RequestProblem::UnreadableLoadBalancerIp(s.to_string()))
            }
        },
    };
    let mut addrs: Vec<IpAddr> = Vec::new();
    for part in annotation
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let Ok(a) = part.parse::<IpAddr>() else {
            return Request::Invalid(RequestProblem::Unreadable(part.to_string()));
        };
        if addrs.contains(&a) {
            continue;
        }
        if let Some(b) = addrs.iter().find(|b| Family::of(**b) == Family::of(a)) {
            return Request::Invalid(RequestProblem::TwoOfOneFamily {
                family: Family::of(a),
                a: *b,
                b: a,
            });
        }
        addrs.push(a);
    }
    match (addrs.is_empty(), lb_ip) {
        (true, None) => Request::Auto,
        (true, Some(a)) => Request::Addresses(vec![a]),
        (false, Some(a)) if !addrs.contains(&a) => {
            Request::Invalid(RequestProblem::Disagree { lb_ip: a })
        }
        (false, _) => Request::Addresses(addrs),
    }
}

// ---------------------------------------------------------------------------
// Outcomes

/// Why a claim did not get an address it wanted. Each names the claim
/// and the reason; [`AllocError::reason`] is the Event and condition
/// reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("{object}: requested address {addr} is outside every AddressPool in use")]
    OutsidePools { object: ClaimRef, addr: IpAddr },
    #[error("{object}: requested address {addr} is in AddressPool {pool}, whose {selector} does not select it")]
    PoolNotAllowed {
        object: ClaimRef,
        addr: IpAddr,
        pool: String,
        selector: SelectorKind,
    },
    #[error("{object}: requested address {addr} ends in .0 or .255, which AddressPool {pool} avoids (avoidBuggyIPs)")]
    Avoided {
        object: ClaimRef,
        addr: IpAddr,
        pool: String,
    },
    #[error("{object}: requested address {addr} is taken by {holder}: {why}")]
    Taken {
        object: ClaimRef,
        addr: IpAddr,
        holder: ClaimRef,
        why: ShareRefusal,
    },
    #[error("{object}: requested address {addr} is {family}, but its ipFamilies are {wanted}")]
    FamilyNotWanted {
        object: ClaimRef,
        addr: IpAddr,
        family: Family,
        wanted: FamilyList,
    },
    #[error(
        "{object}: needs an {family} address ({policy}), and its requested addresses have none"
    )]
    NotRequested {
        object: ClaimRef,
        family: Family,
        policy: &'static str,
    },
    #[error(
        "{object}: no AddressPool in use with autoAssign has {family} addresses for it{}",
        refused_text(refused_by)
    )]
    NoPool {
        object: ClaimRef,
        family: Family,
        /// Pools with autoAssign and the family whose selectors turned it
        /// away.
        refused_by: Vec<(String, SelectorKind)>,
    },
    #[error("{object}: no free {family} address in AddressPool {}", pools.join(", "))]
    Exhausted {
        object: ClaimRef,
        family: Family,
        pools: Vec<String>,
    },
    #[error("{object}: {problem}; addresses it already holds are kept")]
    InvalidRequest {
        object: ClaimRef,
        problem: RequestProblem,
    },
}

fn refused_text(refused_by: &[(String, SelectorKind)]) -> String {
    if refused_by.is_empty() {
        return String::new();
    }
    let list = refused_by
        .iter()
        .map(|(p, s)| format!("{p}'s {s}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(" (not selected by {list})")
}

/// Families for a message: `IPv4`, `IPv4, IPv6`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyList(pub Vec<Family>);

impl fmt::Display for FamilyList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&names.join(", "))
    }
}

impl AllocError {
    /// CamelCase, for the Event and the condition.
    pub fn reason(&self) -> &'static str {
        match self {
            AllocError::OutsidePools { .. } => "AddressOutsidePools",
            AllocError::PoolNotAllowed { .. } => "PoolNotAllowed",
            AllocError::Avoided { .. } => "AddressAvoided",
            AllocError::Taken { .. } => "AddressTaken",
            AllocError::FamilyNotWanted { .. } => "FamilyNotWanted",
            AllocError::NotRequested { .. } => "FamilyNotRequested",
            AllocError::NoPool { .. } => "NoPool",
            AllocError::Exhausted { .. } => "NoAddressAvailable",
            AllocError::InvalidRequest {
                problem: RequestProblem::NoServablePort { .. },
                ..
            } => "NoServablePort",
            AllocError::InvalidRequest { .. } => "InvalidRequest",
        }
    }

    /// Whether it is about what the claim asked for (as opposed to what
    /// the pools could give).
    fn about_request(&self) -> bool {
        !matches!(
            self,
            AllocError::NoPool { .. } | AllocError::Exhausted { .. }
        )
    }
}

/// An address a claim keeps that a new assignment would not give it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Flag {
    #[error("{object}: address {addr} is in no AddressPool in use; it is kept and given to no one else, but no node serves it (add it to a pool, or remove it from the status for a new one)")]
    NotInPool { object: ClaimRef, addr: IpAddr },
    #[error("{object}: address {addr} is in AddressPool {pool}, whose {selector} no longer selects it; it is kept, but no node serves it (remove it from the status for a new one)")]
    PoolNotAllowed {
        object: ClaimRef,
        addr: IpAddr,
        pool: String,
        selector: SelectorKind,
    },
    #[error("{object}: address {addr} ends in .0 or .255, which AddressPool {pool} now avoids (avoidBuggyIPs); it is kept (remove it from the status for a new one)")]
    Avoided {
        object: ClaimRef,
        addr: IpAddr,
        pool: String,
    },
}

/// The pool in use that holds `addr` and admits an object with these
/// labels, or why there is none. The allocator keeps such an address
/// flagged; rivorad does not serve it, whoever wrote it into the status.
pub fn admitted<'a>(
    pools: &'a PoolSet,
    object: &ClaimRef,
    labels: &BTreeMap<String, String>,
    namespace_labels: &BTreeMap<String, String>,
    addr: IpAddr,
) -> Result<&'a ParsedPool, Flag> {
    let object = object.clone();
    let Some(pool) = pools.pool_of(addr) else {
        return Err(Flag::NotInPool { object, addr });
    };
    if let Err(selector) = pool.admits(labels, namespace_labels) {
        return Err(Flag::PoolNotAllowed {
            object,
            addr,
            pool: pool.name.clone(),
            selector,
        });
    }
    Ok(pool)
}

impl Flag {
    /// Why a node does not serve the address (the flag's own text is the
    /// allocator's advice).
    pub fn not_served(&self) -> String {
        match self {
            Flag::NotInPool { object, addr } => format!(
                "{addr} is in no AddressPool in use: only pool addresses are served, whoever writes {object}'s status (add it to a pool)"
            ),
            Flag::PoolNotAllowed {
                object,
                addr,
                pool,
                selector,
            } => format!(
                "{addr} is in AddressPool {pool}, whose {selector} does not select {object}: not served"
            ),
            // Admitted, so served: only the allocator's advice.
            Flag::Avoided { .. } => self.to_string(),
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            Flag::NotInPool { .. } => "AddressNotInPool",
            Flag::PoolNotAllowed { .. } => "PoolNoLongerAllows",
            Flag::Avoided { .. } => "AddressAvoided",
        }
    }

    pub fn addr(&self) -> IpAddr {
        match self {
            Flag::NotInPool { addr, .. }
            | Flag::PoolNotAllowed { addr, .. }
            | Flag::Avoided { addr, .. } => *addr,
        }
    }
}

/// Why an address a claim held is no longer its.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseReason {
    /// Its family is not among the claim's families any more.
    FamilyNotWanted,
    /// The claim held a second address of one family.
    SecondOfFamily,
    /// The claim requests other addresses.
    NotRequested,
    /// Another holder of the address refuses to share it.
    Conflict { holder: ClaimRef, why: ShareRefusal },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub addr: IpAddr,
    pub why: ReleaseReason,
}

impl fmt::Display for Released {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = self.addr;
        match &self.why {
            ReleaseReason::FamilyNotWanted => write!(
                f,
                "address {addr} released: its family is not among ipFamilies"
            ),
            ReleaseReason::SecondOfFamily => {
                write!(f, "address {addr} released: a second address of one family")
            }
            ReleaseReason::NotRequested => {
                write!(f, "address {addr} released: no longer requested")
            }
            ReleaseReason::Conflict { holder, why } => {
                write!(
                    f,
                    "address {addr} released: {holder} holds it too, and {why}"
                )
            }
        }
    }
}

/// What one claim holds after [`Allocator::assign`], and why not more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub object: ClaimRef,
    /// What its status should say, in the order of its ipFamilies.
    pub addresses: Vec<IpAddr>,
    /// What it wanted and did not get.
    pub problems: Vec<AllocError>,
    /// Addresses it keeps that lie outside what its pools offer it now.
    pub flags: Vec<Flag>,
    /// Addresses it held before this call and no longer does.
    pub released: Vec<Released>,
    /// Claims that lost an address to this one: later joiners of its
    /// sharing key that its new ports or traffic policy no longer fit
    /// beside. Plan them again: the address is this claim's.
    pub displaced: Vec<ClaimRef>,
    /// Whether every family it needs has an address (SingleStack: its
    /// family; PreferDualStack: one; RequireDualStack: both).
    pub served: bool,
}

impl Outcome {
    fn new(object: ClaimRef) -> Self {
        Self {
            object,
            addresses: Vec::new(),
            problems: Vec::new(),
            flags: Vec::new(),
            released: Vec::new(),
            displaced: Vec::new(),
            served: false,
        }
    }

    /// `status.loadBalancer` for a Service.
    pub fn load_balancer_status(&self) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(
                self.addresses
                    .iter()
                    .map(|a| LoadBalancerIngress {
                        ip: Some(a.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    /// What to tell the owner as Warning Events: problems, flags and
    /// addresses taken away because another holder would not share.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut w: Vec<Warning> = self
            .problems
            .iter()
            .map(|p| Warning {
                reason: p.reason(),
                message: p.to_string(),
            })
            .chain(self.flags.iter().map(|f| Warning {
                reason: f.reason(),
                message: f.to_string(),
            }))
            .chain(self.released.iter().filter_map(|r| match r.why {
                ReleaseReason::Conflict { .. } => Some(Warning {
                    reason: "AddressConflict",
                    message: format!("{}: {r}", self.object),
                }),
                _ => None,
            }))
            .collect();
        w.sort();
        w.dedup();
        w
    }

    /// The [`CONDITION_ADDRESS_ASSIGNED`] condition: True when served
    /// (reason `Assigned`, or the first flag's or problem's reason when
    /// something is off), else False with the first problem's reason.
    pub fn condition(&self, observed_generation: Option<i64>, now: &Time) -> Condition {
        let addrs = self
            .addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let notes: Vec<String> = self
            .problems
            .iter()
            .map(ToString::to_string)
            .chain(self.flags.iter().map(ToString::to_string))
            .collect();
        let first_reason = self
            .flags
            .first()
            .map(Flag::reason)
            .or_else(|| self.problems.first().map(AllocError::reason));
        let (status, reason, message) = if self.served {
            let mut m = format!("assigned {addrs}");
            if !notes.is_empty() {
                m = format!("{m}; {}", notes.join("; "));
            }
            ("True", first_reason.unwrap_or(REASON_ASSIGNED), m)
        } else {
            let mut m = notes.join("; ");
            if !addrs.is_empty() {
                m = format!("{m} (holds {addrs})");
            }
            (
                "False",
                self.problems
                    .first()
                    .map(AllocError::reason)
                    .unwrap_or("NoAddressAvailable"),
                m,
            )
        };
        Condition {
            type_: CONDITION_ADDRESS_ASSIGNED.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation,
            last_transition_time: now.clone(),
        }
    }
}

// ---------------------------------------------------------------------------
// The allocator

#[derive(Debug, Clone)]
struct Held {
    addrs: Vec<IpAddr>,
    sharing: Sharing,
    /// The claim's creation time: of co-holders whose ports come to clash,
    /// the older keeps the address.
    created: Option<Time>,
    /// Addresses an older co-holder took back since its last placement
    /// ([`Outcome::displaced`]): reported as released at the next.
    lost: Vec<Released>,
    /// The claim's version these were assigned from ([`Claim::version`]).
    version: Option<String>,
}

/// Address counts of one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolCounts {
    /// [IPv4, IPv6]: addresses of the pool held by claims.
    pub assigned: [u128; 2],
    /// [IPv4, IPv6]: addresses free to assign (saturating).
    pub available: [u128; 2],
}

fn fi(f: Family) -> usize {
    match f {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

/// The allocation table: who holds which address. One per leader; it
/// starts with [`Allocator::rebuild`].
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    pools: PoolSet,
    /// Address -> its holders, sorted (more than one only when shared).
    used: BTreeMap<(Family, u128), Vec<ClaimRef>>,
    held: BTreeMap<ClaimRef, Held>,
    /// Sharing key -> addresses held under it.
    by_key: BTreeMap<String, BTreeSet<(Family, u128)>>,
}

impl Allocator {
    pub fn new(pools: PoolSet) -> Self {
        Self {
            pools,
            ..Default::default()
        }
    }

    pub fn pools(&self) -> &PoolSet {
        &self.pools
    }

    /// New pools. Nothing held changes; run [`Allocator::assign`] for
    /// every claim afterwards, for the flags of addresses no pool holds
    /// any more and for claims that can now be served.
    pub fn set_pools(&mut self, pools: PoolSet) {
        self.pools = pools;
    }

    /// What a claim holds.
    pub fn addresses(&self, object: &ClaimRef) -> &[IpAddr] {
        self.held.get(object).map_or(&[], |h| &h.addrs)
    }

    /// Who holds an address.
    pub fn holders(&self, addr: IpAddr) -> &[ClaimRef] {
        self.used.get(&addr_key(addr)).map_or(&[], Vec::as_slice)
    }

    /// Every claim and what it holds.
    pub fn assignments(&self) -> impl Iterator<Item = (&ClaimRef, &[IpAddr])> {
        self.held.iter().map(|(k, h)| (k, h.addrs.as_slice()))
    }

    /// Start over from what the statuses say: every claim first keeps
    /// what its status holds (oldest claim first, so the older keeps an
    /// address two statuses dispute), then each is assigned. Returns
    /// every claim's outcome, oldest first.
    pub fn rebuild<'a>(&mut self, claims: impl IntoIterator<Item = &'a Claim>) -> Vec<Outcome> {
        self.used.clear();
        self.held.clear();
        self.by_key.clear();
        let mut order: Vec<&Claim> = claims.into_iter().collect();
        order.sort_by(|a, b| {
            by_age(a.created.as_ref(), b.created.as_ref()).then_with(|| a.object.cmp(&b.object))
        });
        order.dedup_by(|a, b| a.object == b.object);
        let mut seeded: BTreeMap<ClaimRef, Vec<Released>> = BTreeMap::new();
        for c in &order {
            let o = self.place(c, &c.current, false);
            seeded.insert(c.object.clone(), o.released);
        }
        order
            .iter()
            .map(|c| {
                // What the seed kept, not the status again: what it
                // released is said once.
                let prev = self.addresses(&c.object).to_vec();
                let mut o = self.place(c, &prev, true);
                if let Some(mut r) = seeded.remove(&c.object) {
                    r.append(&mut o.released);
                    o.released = r;
                }
                o
            })
            .collect()
    }

    /// Assign (or confirm) a claim's addresses: on create and on every
    /// change of the object, and for every claim after the pools change.
    /// What it holds is kept while it still wants it; see the module
    /// documentation for the rules.
    pub fn assign(&mut self, claim: &Claim) -> Outcome {
        // From the version the table assigned from, its status cannot
        // show yet what was assigned (the write is in flight, or failed
        // and is sent again): the table's. From any other, the status.
        let prev = match self.held.get(&claim.object) {
            Some(h) if h.version == claim.version => h.addrs.clone(),
            _ => claim.current.clone(),
        };
        self.place(claim, &prev, true)
    }

    /// Forget a claim (deleted, or no longer Rivora's); the addresses it
    /// held, now free unless shared.
    pub fn release(&mut self, object: &ClaimRef) -> Vec<IpAddr> {
        self.unhold(object).map(|h| h.addrs).unwrap_or_default()
    }

    /// Address counts of a pool in use.
    pub fn pool_counts(&self, name: &str) -> Option<PoolCounts> {
        let pool = self.pools.pool(name)?;
        let mut c = PoolCounts::default();
        for r in &pool.ranges {
            let f = fi(r.family);
            let mut held = 0u128;
            let mut held_usable = 0u128;
            for ((_, n), _) in self.used.range((r.family, r.first)..=(r.family, r.last)) {
                held += 1;
                if !(pool.avoid_buggy_ips && is_buggy(r.family, *n)) {
                    held_usable += 1;
                }
            }
            c.assigned[f] = c.assigned[f].saturating_add(held);
            let free = r
                .usable_size(pool.avoid_buggy_ips)
                .saturating_sub(held_usable);
            c.available[f] = c.available[f].saturating_add(free);
        }
        Some(c)
    }

    /// The status a pool should have: its counts (zero when not in use)
    /// and its conditions, merged into what it has so a condition keeps
    /// its transition time while its status holds.
    pub fn pool_status(&self, pool: &AddressPool, now: &Time) -> AddressPoolStatus {
        let counts = self.pool_counts(&pool.name_any()).unwrap_or_default();
        let mut conditions = pool
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        for c in self.pools.conditions(pool, now) {
            merge_condition(&mut conditions, c);
        }
        AddressPoolStatus {
            assigned: FamilyCounts::saturating(counts.assigned[0], counts.assigned[1]),
            available: FamilyCounts::saturating(counts.available[0], counts.available[1]),
            conditions,
        }
    }

    // -- internals ---------------------------------------------------------

    fn hold(&mut self, object: &ClaimRef, addr: IpAddr, sharing: &Sharing) {
        let key = addr_key(addr);
        let holders = self.used.entry(key).or_default();
        if let Err(i) = holders.binary_search(object) {
            holders.insert(i, object.clone());
        }
        if let Some(k) = &sharing.key {
            self.by_key.entry(k.clone()).or_default().insert(key);
        }
        let h = self.held.entry(object.clone()).or_insert_with(|| Held {
            addrs: Vec::new(),
            sharing: sharing.clone(),
            created: None,
            lost: Vec::new(),
            version: None,
        });
        h.sharing = sharing.clone();
        if !h.addrs.contains(&addr) {
            h.addrs.push(addr);
        }
    }

    fn unhold(&mut self, object: &ClaimRef) -> Option<Held> {
        let h = self.held.remove(object)?;
        for a in &h.addrs {
            let key = addr_key(*a);
            let empty = match self.used.get_mut(&key) {
                Some(holders) => {
                    holders.retain(|o| o != object);
                    holders.is_empty()
                }
                None => false,
            };
            if empty {
                self.used.remove(&key);
                // Co-holders share one key: with none left, no one holds
                // the address under it.
                if let Some(k) = &h.sharing.key {
                    if let Some(set) = self.by_key.get_mut(k) {
                        set.remove(&key);
                        if set.is_empty() {
                            self.by_key.remove(k);
                        }
                    }
                }
            }
        }
        Some(h)
    }

    /// The first holder of `addr` (other than the claim) that will not
    /// share it with `sharing`, and why.
    fn refusal_at(
        &self,
        addr: IpAddr,
        object: &ClaimRef,
        sharing: &Sharing,
    ) -> Option<(ClaimRef, ShareRefusal)> {
        let across = self
            .pools
            .pool_of(addr)
            .is_some_and(|p| p.share_across_namespaces);
        self.holders(addr)
            .iter()
            .filter(|h| *h != object)
            .find_map(|h| {
                let theirs = &self.held.get(h)?.sharing;
                let why = sharing.refusal(theirs).or_else(|| {
                    (!across && h.namespace != object.namespace).then(|| ShareRefusal::Namespace {
                        theirs: h.namespace.clone(),
                    })
                });
                why.map(|why| (h.clone(), why))
            })
    }

    /// Whether `claim` keeps `addr` over its co-holders that refuse to
    /// share it now: when each is a later joiner of its own sharing key
    /// (same key and namespace rules; only ports or traffic policy clash,
    /// so the clash is the claim's change) and younger than it. Those
    /// lose the address; returned for the caller to plan again.
    fn evict_joiners(&mut self, addr: IpAddr, claim: &Claim) -> Option<Vec<ClaimRef>> {
        let mine = claim.created.as_ref()?;
        let mut younger = Vec::new();
        for h in self.holders(addr).iter().filter(|h| **h != claim.object) {
            let held = self.held.get(h)?;
            let why = claim.sharing.refusal(&held.sharing);
            let joined = matches!(
                why,
                Some(ShareRefusal::Port { .. } | ShareRefusal::TrafficPolicy { .. })
            );
            let is_younger = held.created.as_ref().is_some_and(|t| {
                (&t.0, &h.namespace, &h.name)
                    > (&mine.0, &claim.object.namespace, &claim.object.name)
            });
            match why {
                None => {}
                Some(_) if joined && is_younger => younger.push(h.clone()),
                Some(_) => return None,
            }
        }
        if younger.is_empty() {
            return None;
        }
        let key = addr_key(addr);
        for h in &younger {
            if let Some(held) = self.held.get_mut(h) {
                held.addrs.retain(|a| *a != addr);
                // Its side of the clash: the same (protocol, port) or
                // traffic policy, seen from it.
                let why = held.sharing.refusal(&claim.sharing);
                if let Some(why) = why {
                    held.lost.push(Released {
                        addr,
                        why: ReleaseReason::Conflict {
                            holder: claim.object.clone(),
                            why,
                        },
                    });
                }
            }
            if let Some(holders) = self.used.get_mut(&key) {
                holders.retain(|o| o != h);
            }
        }
        Some(younger)
    }

    fn place(&mut self, claim: &Claim, prev: &[IpAddr], fill: bool) -> Outcome {
        let object = &claim.object;
        let lost = self.unhold(object).map(|h| h.lost).unwrap_or_default();
        let wanted = claim.wanted();
        let mut out = Outcome::new(object.clone());
        out.released.extend(lost);
        let mut got: BTreeMap<Family, IpAddr> = BTreeMap::new();

        // What it holds, kept while it still wants it.
        let mut seen = BTreeSet::new();
        for &a in prev {
            if !seen.insert(a) {
                continue;
            }
            let fam = Family::of(a);
            let why = if !wanted.contains(&fam) {
                Some(ReleaseReason::FamilyNotWanted)
            } else if got.contains_key(&fam) {
                Some(ReleaseReason::SecondOfFamily)
            } else if matches!(&claim.request, Request::Addresses(req) if !req.contains(&a)) {
                Some(ReleaseReason::NotRequested)
            } else {
                match self.refusal_at(a, object, &claim.sharing) {
                    None => None,
                    Some((holder, why)) => match self.evict_joiners(a, claim) {
                        Some(gone) => {
                            out.displaced.extend(gone);
                            None
                        }
                        None => Some(ReleaseReason::Conflict { holder, why }),
                    },
                }
            };
            match why {
                None => {
                    got.insert(fam, a);
                    self.hold(object, a, &claim.sharing);
                }
                Some(why) => out.released.push(Released { addr: a, why }),
            }
        }
        for &a in got.values() {
            if let Some(flag) = self.flag(claim, a) {
                out.flags.push(flag);
            }
        }

        if fill {
            self.fill(claim, &wanted, &mut got, &mut out);
        }
        out.addresses = wanted.iter().filter_map(|f| got.get(f).copied()).collect();
        if let Some(h) = self.held.get_mut(object) {
            h.version = claim.version.clone();
            h.created = claim.created.clone();
        }
        let required = claim.required(&wanted);
        out.served = if required.is_empty() {
            !got.is_empty()
        } else {
            required.iter().all(|f| got.contains_key(f))
        };
        out
    }

    /// Families it wants and does not hold: from its request, else from
    /// the pools.
    fn fill(
        &mut self,
        claim: &Claim,
        wanted: &[Family],
        got: &mut BTreeMap<Family, IpAddr>,
        out: &mut Outcome,
    ) {
        let object = &claim.object;
        let mut failures: Vec<AllocError> = Vec::new();
        let mut new: Vec<IpAddr> = Vec::new();
        match &claim.request {
            Request::Invalid(problem) => failures.push(AllocError::InvalidRequest {
                object: object.clone(),
                problem: problem.clone(),
            }),
            Request::Addresses(req) => {
                for &a in req {
                    let family = Family::of(a);
                    if !wanted.contains(&family) {
                        failures.push(AllocError::FamilyNotWanted {
                            object: object.clone(),
                            addr: a,
                            family,
                            wanted: FamilyList(wanted.to_vec()),
                        });
                    }
                }
                for &fam in wanted {
                    if got.contains_key(&fam) {
                        continue;
                    }
                    let Some(&a) = req.iter().find(|a| Family::of(**a) == fam) else {
                        if claim.family_policy != FamilyPolicy::PreferDualStack {
                            failures.push(AllocError::NotRequested {
                                object: object.clone(),
                                family: fam,
                                policy: policy_name(claim.family_policy),
                            });
                        }
                        continue;
                    };
                    match self.check_requested(claim, a) {
                        Ok(()) => {
                            got.insert(fam, a);
                            new.push(a);
                            self.hold(object, a, &claim.sharing);
                        }
                        Err(e) => failures.push(*e),
                    }
                }
            }
            Request::Auto => {
                for &fam in wanted {
                    if got.contains_key(&fam) {
                        continue;
                    }
                    match self.find_auto(claim, fam) {
                        Ok(a) => {
                            got.insert(fam, a);
                            new.push(a);
                            self.hold(object, a, &claim.sharing);
                        }
                        Err(e) => failures.push(*e),
                    }
                }
            }
        }
        let missing_required = claim.required(wanted).iter().any(|f| !got.contains_key(f));
        if claim.family_policy == FamilyPolicy::RequireDualStack && missing_required {
            // All or nothing for what this call would add.
            for a in new {
                got.remove(&Family::of(a));
                self.drop_one(object, a);
            }
        }
        if claim.family_policy == FamilyPolicy::PreferDualStack && !got.is_empty() {
            // Prefer takes what it can: pools that have nothing for the
            // other family are not a problem, a request that failed is.
            failures.retain(AllocError::about_request);
        }
        out.problems.extend(failures);
    }

    fn drop_one(&mut self, object: &ClaimRef, addr: IpAddr) {
        let Some(mut h) = self.unhold(object) else {
            return;
        };
        h.addrs.retain(|a| *a != addr);
        for a in h.addrs.clone() {
            self.hold(object, a, &h.sharing);
        }
    }

    fn flag(&self, claim: &Claim, addr: IpAddr) -> Option<Flag> {
        let object = claim.object.clone();
        let pool = match admitted(
            &self.pools,
            &object,
            &claim.labels,
            &claim.namespace_labels,
            addr,
        ) {
            Ok(p) => p,
            Err(f) => return Some(f),
        };
        let (f, n) = addr_key(addr);
        if pool.avoid_buggy_ips && is_buggy(f, n) {
            return Some(Flag::Avoided {
                object,
                addr,
                pool: pool.name.clone(),
            });
        }
        None
    }

    // The errors are boxed: they are built rarely, and a Result this wide
    // would be copied on every call.
    fn check_requested(&self, claim: &Claim, addr: IpAddr) -> Result<(), Box<AllocError>> {
        let object = claim.object.clone();
        let Some(pool) = self.pools.pool_of(addr) else {
            return Err(Box::new(AllocError::OutsidePools { object, addr }));
        };
        if let Err(selector) = pool.admits(&claim.labels, &claim.namespace_labels) {
            return Err(Box::new(AllocError::PoolNotAllowed {
                object,
                addr,
                pool: pool.name.clone(),
                selector,
            }));
        }
        let (f, n) = addr_key(addr);
        if pool.avoid_buggy_ips && is_buggy(f, n) {
            return Err(Box::new(AllocError::Avoided {
                object,
                addr,
                pool: pool.name.clone(),
            }));
        }
        if let Some((holder, why)) = self.refusal_at(addr, &object, &claim.sharing) {
            return Err(Box::new(AllocError::Taken {
                object,
                addr,
                holder,
                why,
            }));
        }
        Ok(())
    }

    fn find_auto(&self, claim: &Claim, family: Family) -> Result<IpAddr, Box<AllocError>> {
        let object = &claim.object;
        let mut refused_by = Vec::new();
        let mut pools: Vec<&ParsedPool> = Vec::new();
        for p in self.pools.accepted() {
            if !p.auto_assign || !p.has_family(family) {
                continue;
            }
            match p.admits(&claim.labels, &claim.namespace_labels) {
                Ok(()) => pools.push(p),
                Err(s) => refused_by.push((p.name.clone(), s)),
            }
        }
        if pools.is_empty() {
            return Err(Box::new(AllocError::NoPool {
                object: object.clone(),
                family,
                refused_by,
            }));
        }
        // An address its sharing key already holds, if it may join: in
        // pool order, then the lowest.
        if let Some(shared) = claim.sharing.key.as_ref().and_then(|k| self.by_key.get(k)) {
            let mut best: Option<(usize, u128)> = None;
            for &(f, n) in shared.range((family, 0)..=(family, u128::MAX)) {
                let a = f.addr(n);
                let Some(pool) = self.pools.pool_of(a) else {
                    continue;
                };
                let Some(rank) = pools.iter().position(|p| p.name == pool.name) else {
                    continue;
                };
                if pool.avoid_buggy_ips && is_buggy(f, n) {
                    continue;
                }
                if self.refusal_at(a, object, &claim.sharing).is_some() {
                    continue;
                }
                if best.is_none_or(|b| (rank, n) < b) {
                    best = Some((rank, n));
                }
            }
            if let Some((_, n)) = best {
                return Ok(family.addr(n));
            }
        }
        for p in &pools {
            if let Some(n) = self.lowest_free(p, family) {
                return Ok(family.addr(n));
            }
        }
        Err(Box::new(AllocError::Exhausted {
            object: object.clone(),
            family,
            pools: pools.iter().map(|p| p.name.clone()).collect(),
        }))
    }

    /// The lowest address of the pool's ranges of this family that no one
    /// holds (and that avoidBuggyIPs allows): a walk over the used
    /// addresses from the start of each range, never over the range.
    fn lowest_free(&self, pool: &ParsedPool, family: Family) -> Option<u128> {
        let skip = |n: u128| -> Option<u128> {
            if pool.avoid_buggy_ips && is_buggy(family, n) {
                // .0 -> .1; .255 -> the next .1.
                n.checked_add(if n & 0xff == 0 { 1 } else { 2 })
            } else {
                Some(n)
            }
        };
        for r in pool.ranges.iter().filter(|r| r.family == family) {
            let mut used = self
                .used
                .range((family, r.first)..=(family, r.last))
                .map(|((_, n), _)| *n)
                .peekable();
            let mut c = Some(r.first);
            while let Some(n) = c.and_then(skip) {
                if n > r.last {
                    break;
                }
                while used.next_if(|u| *u < n).is_some() {}
                if used.peek() != Some(&n) {
                    return Some(n);
                }
                c = n.checked_add(1);
            }
        }
        None
    }
}

fn policy_name(p: FamilyPolicy) -> &'static str {
    match p {
        FamilyPolicy::SingleStack => "SingleStack",
        FamilyPolicy::PreferDualStack => "PreferDualStack",
        FamilyPolicy::RequireDualStack => "RequireDualStack",
    }
}

#[cfg(test)]
mod tests;
