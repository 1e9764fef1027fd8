//! `AddressPool` (rivora.io/v1alpha1, cluster-scoped): the addresses
//! rivora-controller hands to LoadBalancer Services, and which Services may
//! take them. The allocator is [`crate::ipam`].
//!
//! What the API server can check is in the schema: every `addresses` entry
//! is a CIDR without host bits, an address, or a range whose two ends are
//! addresses of one family (CEL's `ip`/`cidr` library, Kubernetes 1.31 or
//! newer), bounds on the lists and on `priority`. What it cannot (a range
//! that ends below its start, addresses no VIP can have, a selector
//! operator, an overlap with another pool) is checked here
//! ([`check_pool`]) and by [`crate::ipam::PoolSet`], and reported on the
//! pool as `Ready=False` (and `Conflict=True` for an overlap) with a
//! reason. Such a pool is not used at all: half a pool would hand out
//! addresses its owner did not mean.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::core::{Selector, SelectorExt};
use kube::{CustomResource, KubeSchema};
use schemars::transform::RecursiveTransform;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Addresses for LoadBalancer Services, with the rules for which Services
/// may take them.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rivora.io",
    version = "v1alpha1",
    kind = "AddressPool",
    status = "AddressPoolStatus",
    shortname = "addrpool",
    category = "rivora",
    doc = "Addresses rivora-controller assigns to LoadBalancer Services, and which Services may take them.",
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses"}"#,
    printcolumn = r#"{"name":"Auto Assign","type":"boolean","jsonPath":".spec.autoAssign"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority","priority":1}"#,
    printcolumn = r#"{"name":"IPv4 Assigned","type":"integer","jsonPath":".status.assigned.ipv4","priority":1}"#,
    printcolumn = r#"{"name":"IPv4 Available","type":"integer","jsonPath":".status.available.ipv4"}"#,
    printcolumn = r#"{"name":"IPv6 Assigned","type":"integer","jsonPath":".status.assigned.ipv6","priority":1}"#,
    printcolumn = r#"{"name":"IPv6 Available","type":"integer","jsonPath":".status.available.ipv6"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = RecursiveTransform(kubernetes_shapes))]
pub struct AddressPoolSpec {
    /// IPv4 and IPv6 addresses: CIDRs (`10.0.0.0/24`, `2001:db8::/64`),
    /// inclusive ranges (`10.0.0.10-10.0.0.50`) or single addresses. No
    /// two pools may share an address: of two that overlap, the younger
    /// is refused.
    #[schemars(length(min = 1, max = 128), extend("x-kubernetes-list-type" = "set"))]
    pub addresses: Vec<PoolAddress>,

    /// Skip IPv4 addresses ending in .0 or .255, which some clients and
    /// middleboxes take for network or broadcast addresses.
    #[serde(rename = "avoidBuggyIPs", default, skip_serializing_if = "is_false")]
    pub avoid_buggy_ips: bool,

    /// Hand addresses out to Services that ask for none. When false, only
    /// Services that request an address of this pool get one.
    #[serde(default = "yes")]
    pub auto_assign: bool,

    /// Services (by their labels) that may take addresses from this pool.
    /// Absent or empty: every Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelector>,

    /// Namespaces (by their labels) whose Services may take addresses
    /// from this pool. Absent or empty: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// When several pools may serve a Service, the lowest priority is
    /// tried first, then the next; equal priorities by pool name. A pool
    /// without a priority comes after every pool with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub priority: Option<i32>,

    /// Announce this pool's addresses on the local link: one node at a
    /// time (the holder of the Lease `rivora-l2-<pool>`) answers ARP and
    /// neighbour solicitations for them, among the nodes this selects.
    /// Absent: rivorad does not answer for them (BGP, or routes the
    /// network holds, bring their traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_announcement: Option<L2Announcement>,

    /// Let Services of different namespaces share one of this pool's
    /// addresses (same `rivora.io/sharing-key`, distinct ports). Off: a
    /// sharing key joins only Services of one namespace, so a tenant
    /// cannot join, and later take, another's address.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_sharing_across_namespaces: bool,
}

/// Which nodes may answer for a pool's addresses, and on which
/// interfaces. An address of an `externalTrafficPolicy: Local` Service is
/// answered only by a node with an endpoint of that Service, under a
/// Lease of its own (`rivora-l2-<pool>-<address>`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct L2Announcement {
    /// Nodes (by their labels) that may answer. Absent or empty: every
    /// node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Interfaces to answer on, of those rivorad attached to (its
    /// `interfaces`). Empty: every one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "set"))]
    pub interfaces: Vec<InterfaceName>,
}

/// A network interface's name, as the kernel allows it (1 to 15 bytes,
/// no `/`, no whitespace, not `.` or `..`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(transparent)]
pub struct InterfaceName(pub String);

impl JsonSchema for InterfaceName {
    fn schema_name() -> Cow<'static, str> {
        "InterfaceName".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A network interface's name (eth0).",
            "minLength": 1,
            "maxLength": 15,
            "pattern": r"^[^/\s:]+$"
        })
    }
}

/// The checked `l2Announcement` of a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedL2 {
    pub node_selector: Selector,
    /// Empty: every interface the node answers on.
    pub interfaces: Vec<String>,
}

fn yes() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One `addresses` entry: a CIDR, an inclusive range `first-last`, or an
/// address. Kept as written; [`parse_pool_address`] reads it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(transparent)]
pub struct PoolAddress(pub String);

impl From<&str> for PoolAddress {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl fmt::Display for PoolAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Two IPv6 addresses of 39 characters and a dash fit in 79: a longer
/// entry is no address. The bound also keeps CEL's cost estimate small.
const POOL_ADDRESS_MAX: u64 = 96;

impl JsonSchema for PoolAddress {
    fn schema_name() -> Cow<'static, str> {
        "PoolAddress".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// The CEL rules use Kubernetes' `ip` and `cidr` library (1.31 and
    /// newer): `isCIDR` and `isIP` refuse leading zeros, zones and
    /// IPv4-mapped IPv6 addresses, as the Rust parser does. Messages name
    /// the entry but compute nothing: the API server refuses a CRD whose
    /// message would call `cidr()` (its cost estimate is over budget).
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A CIDR (10.0.0.0/24), an inclusive range (10.0.0.10-10.0.0.50) or an address.",
            "minLength": 2,
            "maxLength": POOL_ADDRESS_MAX,
            "pattern": r"^[0-9A-Fa-f.:]+([/-][0-9A-Fa-f.:]+)?$",
            "x-kubernetes-validations": [
                {
                    "rule": "self.contains('/') ? isCIDR(self) : (self.contains('-') ? (self.split('-').size() == 2 && isIP(self.split('-')[0]) && isIP(self.split('-')[1])) : isIP(self))",
                    "messageExpression": "self + ' is not a CIDR (10.0.0.0/24), an inclusive range (10.0.0.10-10.0.0.50) or an address'"
                },
                {
                    "rule": "!self.contains('/') || !isCIDR(self) || cidr(self) == cidr(self).masked()",
                    "messageExpression": "self + ' has host bits set: a CIDR starts at its network address (10.0.0.0/24, 2001:db8::/64)'"
                },
                {
                    "rule": "!self.contains('-') || self.split('-').size() != 2 || !isIP(self.split('-')[0]) || !isIP(self.split('-')[1]) || ip(self.split('-')[0]).family() == ip(self.split('-')[1]).family()",
                    "messageExpression": "self + ': the two ends of a range must be of one family'"
                }
            ]
        })
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AddressPoolStatus {
    /// Addresses of this pool held by Services, per family (an address
    /// that Services share counts once).
    #[serde(default)]
    pub assigned: FamilyCounts,
    /// Addresses of this pool free to assign, per family (without .0 and
    /// .255 under avoidBuggyIPs). 9223372036854775807 means that many or
    /// more, as in an IPv6 /64.
    #[serde(default)]
    pub available: FamilyCounts,
    /// `Ready` (True: the pool is in use; False with reason
    /// `InvalidAddresses`, `InvalidSelector` or `Overlap`) and `Conflict`
    /// (True when the pool overlaps an older one, and is not used).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A count per address family, saturating at `i64::MAX` (the API's
/// integers are int64; an IPv6 pool can hold 2^128 addresses).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FamilyCounts {
    #[schemars(range(min = 0))]
    pub ipv4: i64,
    #[schemars(range(min = 0))]
    pub ipv6: i64,
}

impl FamilyCounts {
    /// From exact counts, saturating.
    pub fn saturating(ipv4: u128, ipv6: u128) -> Self {
        let sat = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
        Self {
            ipv4: sat(ipv4),
            ipv6: sat(ipv6),
        }
    }
}

/// What schemars writes that the API server reads differently (as in
/// [`crate::policy`]): `format: uint*` becomes int64, and `null` leaves an
/// optional enum's values.
fn kubernetes_shapes(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::String(f)) = obj.get("format") {
        if f.starts_with("uint") {
            obj.insert("format".into(), Value::String("int64".into()));
        }
    }
    if let Some(Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
}

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The other family.
    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    /// Kubernetes' spelling (`spec.ipFamilies`).
    pub fn parse(s: &str) -> Option<Family> {
        match s {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }

    fn bits(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    fn max(self) -> u128 {
        match self {
            Family::V4 => u128::from(u32::MAX),
            Family::V6 => u128::MAX,
        }
    }

    /// The address with this number (below [`Family::max`]).
    pub fn addr(self, n: u128) -> IpAddr {
        match self {
            // Within max() by construction; the mask keeps it total.
            Family::V4 => IpAddr::V4(Ipv4Addr::from((n & 0xffff_ffff) as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// An address as its family and number: what the allocator sorts and
/// scans, so a /64 is two numbers and never a list.
pub fn addr_key(addr: IpAddr) -> (Family, u128) {
    match addr {
        IpAddr::V4(a) => (Family::V4, u128::from(u32::from(a))),
        IpAddr::V6(a) => (Family::V6, u128::from(a)),
    }
}

/// Whether avoidBuggyIPs skips this address: IPv4 ending in .0 or .255.
pub fn is_buggy(family: Family, n: u128) -> bool {
    family == Family::V4 && matches!(n & 0xff, 0 | 0xff)
}

/// An inclusive range of addresses of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpRange {
    pub family: Family,
    pub first: u128,
    pub last: u128,
}

impl IpRange {
    pub fn contains(&self, addr: IpAddr) -> bool {
        let (f, n) = addr_key(addr);
        f == self.family && self.first <= n && n <= self.last
    }

    pub fn overlaps(&self, other: &IpRange) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// How many addresses, saturating at `u128::MAX` (only `::/0` has
    /// one more).
    pub fn size(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    /// How many addresses avoidBuggyIPs would hand out (all of them for
    /// IPv6 or without it).
    pub fn usable_size(&self, avoid_buggy_ips: bool) -> u128 {
        if !avoid_buggy_ips || self.family == Family::V6 {
            return self.size();
        }
        // Count in [0, n] of x with x % 256 == r.
        let upto = |n: u128, r: u128| if n < r { 0 } else { (n - r) / 256 + 1 };
        let in_range = |r: u128| {
            upto(self.last, r) - self.first.checked_sub(1).map_or(0, |below| upto(below, r))
        };
        self.size() - in_range(0) - in_range(255)
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (self.family.addr(self.first), self.family.addr(self.last));
        if a == b {
            write!(f, "{a}")
        } else {
            write!(f, "{a}-{b}")
        }
    }
}

/// Why one `addresses` entry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error(
        "{0:?} is not a CIDR (10.0.0.0/24), an inclusive range (10.0.0.10-10.0.0.50) or an address"
    )]
    Unreadable(String),
    #[error("{entry} has prefix length {len}, over {max} for {family}")]
    PrefixTooLong {
        entry: String,
        len: u32,
        max: u32,
        family: Family,
    },
    #[error("{entry} has host bits set: the network is {network}")]
    HostBits { entry: String, network: String },
    #[error("{entry}: the range ends below its start")]
    Reversed { entry: String },
    #[error("{entry}: the two ends of a range must be of one family")]
    MixedFamilies { entry: String },
    #[error("{entry} is an IPv4-mapped IPv6 address; write the IPv4 address {v4}")]
    Ipv4Mapped { entry: String, v4: Ipv4Addr },
    #[error("{entry} includes {block} ({what}), which cannot be a VIP")]
    Unusable {
        entry: String,
        block: &'static str,
        what: &'static str,
    },
}

/// Blocks no VIP may come from, by family: what the model refuses as a
/// VIP address ([`rivora_model::model::Vip::validate`]).
const UNUSABLE: &[(Family, u128, u128, &str, &str)] = &[
    (Family::V4, 0, 0, "0.0.0.0", "the unspecified address"),
    (
        Family::V4,
        0x7f00_0000,
        0x7fff_ffff,
        "127.0.0.0/8",
        "loopback",
    ),
    (
        Family::V4,
        0xe000_0000,
        0xefff_ffff,
        "224.0.0.0/4",
        "multicast",
    ),
    (
        Family::V4,
        0xffff_ffff,
        0xffff_ffff,
        "255.255.255.255",
        "broadcast",
    ),
    (Family::V6, 0, 0, "::", "the unspecified address"),
    (Family::V6, 1, 1, "::1", "loopback"),
    (
        Family::V6,
        0xffff_0000_0000,
        0xffff_ffff_ffff,
        "::ffff:0:0/96",
        "IPv4-mapped",
    ),
    (
        Family::V6,
        0xff00_u128 << 112,
        u128::MAX,
        "ff00::/8",
        "multicast",
    ),
];

fn parse_ip(entry: &str, s: &str) -> Result<IpAddr, AddressError> {
    let ip: IpAddr = s
        .parse()
        .map_err(|_| AddressError::Unreadable(entry.to_string()))?;
    if let IpAddr::V6(a) = ip {
        if let Some(v4) = a.to_ipv4_mapped() {
            return Err(AddressError::Ipv4Mapped {
                entry: entry.to_string(),
                v4,
            });
        }
    }
    Ok(ip)
}

/// Read one `addresses` entry. Spaces around the parts are not allowed
/// (the schema's pattern refuses them too).
pub fn parse_pool_address(entry: &str) -> Result<IpRange, AddressError> {
    let range = if let Some((addr, len)) = entry.split_once('/') {
        let ip = parse_ip(entry, addr)?;
        let (family, n) = addr_key(ip);
        let len: u32 = match len.parse() {
            Ok(l) if !len.starts_with('+') => l,
            _ => return Err(AddressError::Unreadable(entry.to_string())),
        };
        if len > family.bits() {
            return Err(AddressError::PrefixTooLong {
                entry: entry.to_string(),
                len,
                max: family.bits(),
                family,
            });
        }
        let host_bits = family.bits() - len;
        let host_mask = if host_bits == 0 {
            0
        } else {
            family.max() >> (family.bits() - host_bits)
        };
        if n & host_mask != 0 {
            return Err(AddressError::HostBits {
                entry: entry.to_string(),
                network: format!("{}/{len}", family.addr(n & !host_mask)),
            });
        }
        IpRange {
            family,
            first: n,
            last: n | host_mask,
        }
    } else if let Some((a, b)) = entry.split_once('-') {
        let (fa, first) = addr_key(parse_ip(entry, a)?);
        let (fb, last) = addr_key(parse_ip(entry, b)?);
        if fa != fb {
            return Err(AddressError::MixedFamilies {
                entry: entry.to_string(),
            });
        }
        if last < first {
            return Err(AddressError::Reversed {
                entry: entry.to_string(),
            });
        }
        IpRange {
            family: fa,
            first,
            last,
        }
    } else {
        let (family, n) = addr_key(parse_ip(entry, entry)?);
        IpRange {
            family,
            first: n,
            last: n,
        }
    };
    for &(family, first, last, block, what) in UNUSABLE {
        if range.overlaps(&IpRange {
            family,
            first,
            last,
        }) {
            return Err(AddressError::Unusable {
                entry: entry.to_string(),
                block,
                what,
            });
        }
    }
    Ok(range)
}

/// Condition reasons of a pool.
pub const REASON_READY: &str = "Ready";
pub const REASON_INVALID_ADDRESSES: &str = "InvalidAddresses";
pub const REASON_INVALID_SELECTOR: &str = "InvalidSelector";
pub const REASON_INVALID_INTERFACE: &str = "InvalidInterface";
pub const REASON_OVERLAP: &str = "Overlap";
pub const REASON_NO_CONFLICT: &str = "NoConflict";

/// Why a pool is not used: the `Ready=False` condition's reason and
/// message (the message names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct PoolIssue {
    pub reason: &'static str,
    pub message: String,
}

/// A pool as the allocator uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedPool {
    pub name: String,
    /// Sorted, merged where entries overlap or touch, so no two share an
    /// address.
    pub ranges: Vec<IpRange>,
    pub avoid_buggy_ips: bool,
    pub auto_assign: bool,
    pub service_selector: Selector,
    pub namespace_selector: Selector,
    pub priority: Option<i32>,
    /// Its `l2Announcement`, if any.
    pub l2: Option<ParsedL2>,
    /// `allowSharingAcrossNamespaces`.
    pub share_across_namespaces: bool,
}

/// Which of a pool's selectors turned a Service away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SelectorKind {
    Service,
    Namespace,
}

impl fmt::Display for SelectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SelectorKind::Service => "serviceSelector",
            SelectorKind::Namespace => "namespaceSelector",
        })
    }
}

impl ParsedPool {
    /// Whether a Service with these labels, in a namespace with these,
    /// may take addresses from the pool; else the selector that refuses.
    pub fn admits(
        &self,
        service_labels: &BTreeMap<String, String>,
        namespace_labels: &BTreeMap<String, String>,
    ) -> Result<(), SelectorKind> {
        if !self.namespace_selector.matches(namespace_labels) {
            return Err(SelectorKind::Namespace);
        }
        if !self.service_selector.matches(service_labels) {
            return Err(SelectorKind::Service);
        }
        Ok(())
    }

    pub fn has_family(&self, family: Family) -> bool {
        self.ranges.iter().any(|r| r.family == family)
    }

    /// The order pools are tried in: priority (absent last), then name.
    pub fn order_key(&self) -> (bool, i32, &str) {
        (
            self.priority.is_none(),
            self.priority.unwrap_or(0),
            &self.name,
        )
    }
}

/// What the schema could not check, checked (and what it could, again:
/// a pool stored before a schema change, or written past it, is never
/// used half-valid). The pool's name is the object's.
pub fn check_pool(name: &str, spec: &AddressPoolSpec) -> Result<ParsedPool, PoolIssue> {
    if spec.addresses.is_empty() {
        return Err(PoolIssue {
            reason: REASON_INVALID_ADDRESSES,
            message: "addresses is empty".into(),
        });
    }
    let mut ranges = Vec::with_capacity(spec.addresses.len());
    for (i, a) in spec.addresses.iter().enumerate() {
        let r = parse_pool_address(&a.0).map_err(|e| PoolIssue {
            reason: REASON_INVALID_ADDRESSES,
            message: format!("addresses[{i}]: {e}"),
        })?;
        ranges.push(r);
    }
    if let Some(p) = spec.priority.filter(|p| *p < 0) {
        return Err(PoolIssue {
            reason: REASON_INVALID_ADDRESSES,
            message: format!("priority: {p} is below 0"),
        });
    }
    let selector = |field: SelectorKind, s: &Option<LabelSelector>| {
        s.clone()
            .map_or(Ok(Selector::default()), Selector::try_from)
            .map_err(|e| PoolIssue {
                reason: REASON_INVALID_SELECTOR,
                message: format!("{field}: {}", e.0),
            })
    };
    Ok(ParsedPool {
        name: name.to_string(),
        ranges: merge(ranges),
        avoid_buggy_ips: spec.avoid_buggy_ips,
        auto_assign: spec.auto_assign,
        service_selector: selector(SelectorKind::Service, &spec.service_selector)?,
        namespace_selector: selector(SelectorKind::Namespace, &spec.namespace_selector)?,
        priority: spec.priority,
        l2: spec.l2_announcement.as_ref().map(check_l2).transpose()?,
        share_across_namespaces: spec.allow_sharing_across_namespaces,
    })
}

fn check_l2(l2: &L2Announcement) -> Result<ParsedL2, PoolIssue> {
    let node_selector = l2
        .node_selector
        .clone()
        .map_or(Ok(Selector::default()), Selector::try_from)
        .map_err(|e| PoolIssue {
            reason: REASON_INVALID_SELECTOR,
            message: format!("l2Announcement.nodeSelector: {}", e.0),
        })?;
    let mut interfaces = Vec::with_capacity(l2.interfaces.len());
    for (i, InterfaceName(name)) in l2.interfaces.iter().enumerate() {
        let bad = name.is_empty()
            || name.len() > 15
            || name == "."
            || name == ".."
            || name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace());
        if bad {
            return Err(PoolIssue {
                reason: REASON_INVALID_INTERFACE,
                message: format!(
                    "l2Announcement.interfaces[{i}]: {name:?} is not an interface name (1 to 15 characters, no '/', ':' or spaces)"
                ),
            });
        }
        interfaces.push(name.clone());
    }
    Ok(ParsedL2 {
        node_selector,
        interfaces,
    })
}

/// Sort and join ranges that overlap or touch. One pool listing an
/// address twice is harmless: it is one address of the pool.
fn merge(mut ranges: Vec<IpRange>) -> Vec<IpRange> {
    ranges.sort();
    let mut out: Vec<IpRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(prev) if prev.family == r.family && r.first <= prev.last.saturating_add(1) => {
                prev.last = prev.last.max(r.last);
            }
            _ => out.push(r),
        }
    }
    out
}

/// Older first by creationTimestamp; an object not yet stored (no
/// timestamp) is the youngest. Ties go to the caller's next key.
pub fn by_age(a: Option<&Time>, b: Option<&Time>) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => x.0.cmp(&y.0),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn r(s: &str) -> Result<String, String> {
        parse_pool_address(s)
            .map(|r| format!("{}:{r}", r.family))
            .map_err(|e| e.to_string())
    }

    /// Every form the schema lets through, and what only Rust catches,
    /// one row each.
    #[test]
    fn address_entries_parse_or_say_why_not() {
        let rows: &[(&str, Result<&str, &str>)] = &[
            ("10.0.0.0/24", Ok("IPv4:10.0.0.0-10.0.0.255")),
            ("10.0.0.7/32", Ok("IPv4:10.0.0.7")),
            ("10.0.0.7", Ok("IPv4:10.0.0.7")),
            ("10.0.0.10-10.0.0.50", Ok("IPv4:10.0.0.10-10.0.0.50")),
            ("10.0.0.10-10.0.0.10", Ok("IPv4:10.0.0.10")),
            (
                "2001:db8::/64",
                Ok("IPv6:2001:db8::-2001:db8::ffff:ffff:ffff:ffff"),
            ),
            (
                "2001:db8::10-2001:db8::20",
                Ok("IPv6:2001:db8::10-2001:db8::20"),
            ),
            ("2001:db8::1/128", Ok("IPv6:2001:db8::1")),
            (
                "10.0.0.5/24",
                Err("10.0.0.5/24 has host bits set: the network is 10.0.0.0/24"),
            ),
            (
                "2001:db8::1/64",
                Err("2001:db8::1/64 has host bits set: the network is 2001:db8::/64"),
            ),
            (
                "10.0.0.50-10.0.0.10",
                Err("10.0.0.50-10.0.0.10: the range ends below its start"),
            ),
            (
                "10.0.0.1-2001:db8::1",
                Err("10.0.0.1-2001:db8::1: the two ends of a range must be of one family"),
            ),
            (
                "10.0.0.0/33",
                Err("10.0.0.0/33 has prefix length 33, over 32 for IPv4"),
            ),
            ("10.0.0.0/+8", Err("\"10.0.0.0/+8\" is not a CIDR")),
            ("10.0.0.0/", Err("is not a CIDR")),
            ("10.0.0", Err("is not a CIDR")),
            ("010.0.0.1", Err("is not a CIDR")),
            ("fe80::1%eth0", Err("is not a CIDR")),
            ("10.0.0.1-10.0.0.2-10.0.0.3", Err("is not a CIDR")),
            (" 10.0.0.1", Err("is not a CIDR")),
            (
                "::ffff:10.0.0.1",
                Err("IPv4-mapped IPv6 address; write the IPv4 address 10.0.0.1"),
            ),
            (
                "0.0.0.0/0",
                Err("0.0.0.0/0 includes 0.0.0.0 (the unspecified address), which cannot be a VIP"),
            ),
            (
                "126.255.255.0-127.0.0.1",
                Err("includes 127.0.0.0/8 (loopback)"),
            ),
            ("224.0.0.0/24", Err("includes 224.0.0.0/4 (multicast)")),
            (
                "255.255.255.0/24",
                Err("includes 255.255.255.255 (broadcast)"),
            ),
            ("::/0", Err("includes :: (the unspecified address)")),
            ("::1", Err("includes ::1 (loopback)")),
            ("ff02::/16", Err("includes ff00::/8 (multicast)")),
            ("::fffe:0:0/95", Err("includes ::ffff:0:0/96 (IPv4-mapped)")),
        ];
        for (entry, want) in rows {
            let got = r(entry);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(g, w, "{entry}"),
                (Err(w), Err(g)) => assert!(g.contains(w), "{entry}: {g:?} lacks {w:?}"),
                _ => panic!("{entry}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn range_sizes_count_what_avoid_buggy_ips_leaves() {
        let size = |s: &str, avoid: bool| parse_pool_address(s).expect("valid").usable_size(avoid);
        assert_eq!(size("10.0.0.0/24", false), 256);
        assert_eq!(size("10.0.0.0/24", true), 254);
        assert_eq!(size("10.0.0.0/23", true), 508);
        assert_eq!(size("10.0.0.255-10.0.1.0", true), 0);
        assert_eq!(size("10.0.0.254-10.0.1.1", true), 2);
        assert_eq!(size("10.0.0.5", true), 1);
        assert_eq!(size("1.0.0.0/8", true), (1 << 24) - 2 * (1 << 16));
        assert_eq!(size("2001:db8::/64", true), 1 << 64);
        assert_eq!(size("2000::/3", false), 1 << 125);
        let all6 = IpRange {
            family: Family::V6,
            first: 0,
            last: u128::MAX,
        };
        assert_eq!(all6.size(), u128::MAX, "saturates");
        assert_eq!(
            FamilyCounts::saturating(3, 1 << 64),
            FamilyCounts {
                ipv4: 3,
                ipv6: i64::MAX
            }
        );
    }

    fn spec(v: serde_json::Value) -> AddressPoolSpec {
        serde_json::from_value(v).expect("a spec")
    }

    #[test]
    fn check_pool_merges_entries_and_reads_selectors() {
        let p = check_pool(
            "a",
            &spec(json!({
                "addresses": ["10.0.0.8-10.0.0.20", "10.0.0.0/29", "2001:db8::/120", "10.0.0.21"],
                "serviceSelector": {"matchLabels": {"tier": "web"}},
                "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
                "priority": 3
            })),
        )
        .expect("valid");
        assert_eq!(
            p.ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.0.0.0-10.0.0.21", "2001:db8::-2001:db8::ff"]
        );
        assert!(p.auto_assign, "autoAssign defaults to true");
        assert!(!p.avoid_buggy_ips);
        let l = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(p.admits(&l("tier", "web"), &l("env", "prod")), Ok(()));
        assert_eq!(
            p.admits(&l("tier", "db"), &l("env", "prod")),
            Err(SelectorKind::Service)
        );
        assert_eq!(
            p.admits(&l("tier", "web"), &l("env", "dev")),
            Err(SelectorKind::Namespace)
        );
        let open = check_pool(
            "b",
            &spec(json!({"addresses": ["10.1.0.0/24"], "serviceSelector": {}})),
        )
        .expect("valid");
        assert_eq!(open.admits(&BTreeMap::new(), &BTreeMap::new()), Ok(()));
        assert_eq!(p.l2, None, "no l2Announcement: not announced");
    }

    #[test]
    fn check_pool_reads_the_l2_announcement() {
        let p = check_pool(
            "l2",
            &spec(json!({
                "addresses": ["10.0.0.0/24"],
                "l2Announcement": {"nodeSelector": {"matchLabels": {"lb": "yes"}}, "interfaces": ["eth0", "eth1.100"]}
            })),
        )
        .expect("valid");
        let l2 = p.l2.expect("an l2Announcement");
        assert_eq!(l2.interfaces, ["eth0", "eth1.100"]);
        let l = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(l2.node_selector.matches(&l("lb", "yes")));
        assert!(!l2.node_selector.matches(&l("lb", "no")));
        // Empty: every node, every interface.
        let all = check_pool(
            "l2",
            &spec(json!({"addresses": ["10.0.0.0/24"], "l2Announcement": {}})),
        )
        .expect("valid")
        .l2
        .expect("an l2Announcement");
        assert!(all.interfaces.is_empty());
        assert!(all.node_selector.matches(&BTreeMap::new()));
    }

    #[test]
    fn check_pool_refuses_with_the_field_and_reason() {
        let rows = [
            (
                json!({"addresses": ["10.0.0.0/24", "10.0.1.9/24"]}),
                REASON_INVALID_ADDRESSES,
                "addresses[1]: 10.0.1.9/24 has host bits set",
            ),
            (
                json!({"addresses": []}),
                REASON_INVALID_ADDRESSES,
                "addresses is empty",
            ),
            (
                json!({"addresses": ["10.0.0.0/24"], "serviceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
                REASON_INVALID_SELECTOR,
                "serviceSelector: ",
            ),
            (
                json!({"addresses": ["10.0.0.0/24"], "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}),
                REASON_INVALID_SELECTOR,
                "namespaceSelector: ",
            ),
            (
                json!({"addresses": ["10.0.0.0/24"], "l2Announcement": {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}}),
                REASON_INVALID_SELECTOR,
                "l2Announcement.nodeSelector: ",
            ),
            (
                json!({"addresses": ["10.0.0.0/24"], "l2Announcement": {"interfaces": ["eth0", "a/b"]}}),
                REASON_INVALID_INTERFACE,
                "l2Announcement.interfaces[1]: \"a/b\" is not an interface name",
            ),
            (
                json!({"addresses": ["10.0.0.0/24"], "l2Announcement": {"interfaces": ["a-very-long-name0"]}}),
                REASON_INVALID_INTERFACE,
                "l2Announcement.interfaces[0]: ",
            ),
        ];
        for (s, reason, message) in rows {
            let err = check_pool("p", &spec(s.clone())).expect_err(&s.to_string());
            assert_eq!(err.reason, reason, "{err}");
            assert!(err.message.starts_with(message), "{err}");
        }
    }

    /// What the chart installs: cluster-scoped, a status subresource,
    /// the printer columns, CEL on every address entry, and nothing the
    /// API server reads differently. (Checked against kube-apiserver
    /// 1.36 by hand: installed, the rules refuse host bits, mixed
    /// families, bad addresses, and `cidr()` in a message is over the
    /// cost budget, so messages compute nothing.)
    #[test]
    fn crd_is_cluster_scoped_with_status_columns_and_rules() {
        use kube::CustomResourceExt;
        let v = serde_json::to_value(AddressPool::crd()).expect("a CRD is JSON");
        assert_eq!(v["metadata"]["name"], "addresspools.rivora.io");
        assert_eq!(v["spec"]["scope"], "Cluster");
        let ver = &v["spec"]["versions"][0];
        assert_eq!(ver["name"], "v1alpha1");
        assert!(ver["subresources"]["status"].is_object(), "{ver}");
        let cols: Vec<&str> = ver["additionalPrinterColumns"]
            .as_array()
            .expect("columns")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "Addresses",
                "Auto Assign",
                "Priority",
                "IPv4 Assigned",
                "IPv4 Available",
                "IPv6 Assigned",
                "IPv6 Available",
                "Ready",
                "Age"
            ]
        );
        let schema = &ver["schema"]["openAPIV3Schema"]["properties"];
        let spec = &schema["spec"]["properties"];
        let item = &spec["addresses"]["items"];
        assert_eq!(item["maxLength"], POOL_ADDRESS_MAX);
        let rules = item["x-kubernetes-validations"].as_array().expect("rules");
        assert_eq!(rules.len(), 3);
        for r in rules {
            let m = r["messageExpression"].as_str().expect("a message");
            assert!(!m.contains("cidr(") && !m.contains("ip("), "{m}");
        }
        assert_eq!(spec["autoAssign"]["default"], true);
        assert!(spec["avoidBuggyIPs"].is_object());
        assert_eq!(spec["priority"]["minimum"], 0.0);
        assert_eq!(
            schema["status"]["properties"]["conditions"]["x-kubernetes-list-type"],
            "map"
        );
        let y = serde_yaml_ng::to_string(&AddressPool::crd()).expect("YAML");
        assert!(
            !y.contains("uint"),
            "unsigned formats are unknown to the API server"
        );
    }

    #[test]
    fn the_spec_round_trips_with_kubernetes_names() {
        let s =
            spec(json!({"addresses": ["10.0.0.0/24"], "avoidBuggyIPs": true, "autoAssign": false}));
        assert!(s.avoid_buggy_ips && !s.auto_assign);
        let back = serde_json::to_value(&s).expect("json");
        assert_eq!(
            back,
            json!({"addresses": ["10.0.0.0/24"], "avoidBuggyIPs": true, "autoAssign": false})
        );
    }
}
