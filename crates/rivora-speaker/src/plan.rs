//! Who announces which VIP: pure rules from what this node knows (its
//! dataplane status, the AddressPools, its own labels) to the groups it
//! stands for. Each group is one Lease; its holder answers for the
//! group's VIPs that it serves.
//!
//! The rules, each a row of the tests below:
//! - Static (`announce: l2` without Kubernetes): one group, no Lease: the
//!   node answers for every VIP it serves, on its L2 interfaces.
//! - Kubernetes: a VIP whose address lies in an AddressPool with an
//!   `l2Announcement` belongs to that pool's group (Lease
//!   `rivora-l2-<pool>`), announced on the pool's interfaces (those of
//!   them this node answers on; all of them if the pool names none), from
//!   nodes its `nodeSelector` admits. A VIP in no such pool, on a node
//!   whose settings say `announce: l2`, belongs to one group per
//!   interface (`rivora-l2-<interface>`): one owner per segment. Any
//!   other VIP is not announced by this node (BGP, or the network's own
//!   routes, bring its traffic).
//! - A node stands for a group only while it serves at least one of its
//!   VIPs (a healthy backend with weight: `VipStatus::serving`), and the
//!   owner answers only for those it serves. With
//!   `externalTrafficPolicy: Cluster` every node sees the same endpoints,
//!   so every admitted node serves the same VIPs (health probes aside).
//! - `externalTrafficPolicy: Local` VIPs are served only by nodes with an
//!   endpoint of their own, which differ per VIP: one owner for the pool
//!   could hold none of them. Each such address gets its own group and
//!   Lease (`rivora-l2-<pool>-<address>`), stood for only by the nodes
//!   that serve it. Those Leases cost the API server a write per retry
//!   period each, the price Cilium pays for every Service; here only
//!   eTP Local addresses pay it.
//! - The node settings' `nodeSelector` applies to every group, beside the
//!   pool's own.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Every Lease the speaker writes is named with this.
pub const LEASE_PREFIX: &str = "rivora-l2-";
/// The one group of the static path.
pub const STATIC_GROUP: &str = "static";
/// Longest Kubernetes object name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// One VIP address as this node's dataplane serves it (all its ports
/// and protocols together: ARP and NDP know only the address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipView {
    pub addr: IpAddr,
    /// A new flow to it would find a backend here.
    pub serving: bool,
    /// `externalTrafficPolicy: Local`: only nodes with a backend of their
    /// own may announce it.
    pub local: bool,
    /// The AddressPool holding the address, if any.
    pub pool: Option<PoolView>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    pub name: String,
    /// The pool's `l2Announcement`, if it has one.
    pub l2: Option<PoolL2>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolL2 {
    /// Its `nodeSelector` admits this node (absent or empty: every node).
    pub selects_node: bool,
    /// Interfaces it names; empty: every one the node answers on.
    pub interfaces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The static path: no Lease, every served VIP.
    Static,
    Kubernetes {
        /// `announce: l2` in the node settings: VIPs of no L2 pool are
        /// announced too, one group per interface.
        interface_groups: bool,
        /// The node settings' `nodeSelector` admits this node.
        node_selected: bool,
    },
}

/// One group this node stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The Lease; None on the static path.
    pub lease: Option<String>,
    pub interfaces: Vec<String>,
    /// What its owner answers for: the group's VIPs this node serves.
    pub vips: BTreeSet<IpAddr>,
}

/// The groups, by name (the Lease's, or [`STATIC_GROUP`]).
pub type Plan = BTreeMap<String, Group>;

/// The groups this node stands for, given its `interfaces` (those it
/// answers on) and its `vips`.
pub fn plan(mode: &Mode, interfaces: &[String], vips: &[VipView]) -> Plan {
    let mut out = Plan::new();
    let mut add = |name: String, lease: bool, ifaces: Vec<String>, addr: IpAddr| {
        if ifaces.is_empty() {
            return;
        }
        out.entry(name.clone())
            .or_insert_with(|| Group {
                lease: lease.then_some(name),
                interfaces: ifaces,
                vips: BTreeSet::new(),
            })
            .vips
            .insert(addr);
    };
    for v in vips.iter().filter(|v| v.serving) {
        match mode {
            Mode::Static => add(STATIC_GROUP.into(), false, interfaces.to_vec(), v.addr),
            Mode::Kubernetes {
                interface_groups,
                node_selected,
            } => {
                if !node_selected {
                    continue;
                }
                let named = |base: &str| lease_name(base, v.local.then_some(v.addr));
                match v
                    .pool
                    .as_ref()
                    .and_then(|p| p.l2.as_ref().map(|l2| (p, l2)))
                {
                    Some((pool, l2)) => {
                        if !l2.selects_node {
                            continue;
                        }
                        let ifaces: Vec<String> = if l2.interfaces.is_empty() {
                            interfaces.to_vec()
                        } else {
                            interfaces
                                .iter()
                                .filter(|i| l2.interfaces.contains(i))
                                .cloned()
                                .collect()
                        };
                        add(named(&pool.name), true, ifaces, v.addr);
                    }
                    None if *interface_groups => {
                        for i in interfaces {
                            add(named(i), true, vec![i.clone()], v.addr);
                        }
                    }
                    None => {}
                }
            }
        }
    }
    out
}

/// The Lease of a group: `rivora-l2-<base>`, with `-<address>` for an
/// eTP Local address. Lowercase letters, digits, `-` and `.` are kept;
/// anything else (an interface named `br_0`) becomes `-`, and then a hash
/// of the original is appended so that two names cannot meet; a name past
/// 253 characters is cut and hashed the same way.
pub fn lease_name(base: &str, addr: Option<IpAddr>) -> String {
    let mut raw = format!("{LEASE_PREFIX}{base}");
    if let Some(a) = addr {
        raw.push('-');
        raw.push_str(&address_label(a));
    }
    let clean: String = raw
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        })
        .collect();
    if clean == raw && clean.len() <= MAX_NAME {
        return clean;
    }
    let suffix = format!("-{:08x}", fnv1a(raw.as_bytes()));
    let keep = MAX_NAME - suffix.len();
    let mut head: String = clean.chars().take(keep).collect();
    while head.ends_with(['-', '.']) {
        head.pop();
    }
    head + &suffix
}

/// An address as a name part: `10-0-0-1`, `fd00-0-0-0-0-0-0-1`.
fn address_label(a: IpAddr) -> String {
    match a {
        IpAddr::V4(v4) => v4
            .octets()
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join("-"),
        IpAddr::V6(v6) => v6
            .segments()
            .iter()
            .map(|s| format!("{s:x}"))
            .collect::<Vec<_>>()
            .join("-"),
    }
}

/// 32-bit FNV-1a: short, stable across builds (std's hasher is neither).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ifs(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn vip(addr: &str, serving: bool, local: bool, pool: Option<PoolView>) -> VipView {
        VipView {
            addr: ip(addr),
            serving,
            local,
            pool,
        }
    }

    fn l2_pool(name: &str, selects_node: bool, interfaces: &[&str]) -> Option<PoolView> {
        Some(PoolView {
            name: name.into(),
            l2: Some(PoolL2 {
                selects_node,
                interfaces: ifs(interfaces),
            }),
        })
    }

    fn plain_pool(name: &str) -> Option<PoolView> {
        Some(PoolView {
            name: name.into(),
            l2: None,
        })
    }

    const K8S: Mode = Mode::Kubernetes {
        interface_groups: false,
        node_selected: true,
    };

    fn vips_of(p: &Plan, name: &str) -> Vec<IpAddr> {
        p.get(name)
            .unwrap_or_else(|| panic!("no group {name} in {p:?}"))
            .vips
            .iter()
            .copied()
            .collect()
    }

    #[test]
    fn static_answers_every_served_vip_without_a_lease() {
        let p = plan(
            &Mode::Static,
            &ifs(&["eth0", "eth1"]),
            &[
                vip("10.0.0.1", true, false, None),
                vip("fd00::1", true, false, None),
                vip("10.0.0.2", false, false, None),
            ],
        );
        assert_eq!(p.len(), 1);
        let g = &p[STATIC_GROUP];
        assert_eq!(g.lease, None);
        assert_eq!(g.interfaces, ifs(&["eth0", "eth1"]));
        assert_eq!(
            vips_of(&p, STATIC_GROUP),
            vec![ip("10.0.0.1"), ip("fd00::1")]
        );
        // Nothing served: no group at all.
        assert!(plan(
            &Mode::Static,
            &ifs(&["eth0"]),
            &[vip("10.0.0.2", false, false, None)]
        )
        .is_empty());
    }

    #[test]
    fn one_lease_per_l2_pool_for_cluster_vips() {
        let p = plan(
            &K8S,
            &ifs(&["eth0"]),
            &[
                vip("10.0.0.1", true, false, l2_pool("web", true, &[])),
                vip("10.0.0.2", true, false, l2_pool("web", true, &[])),
                vip("10.0.1.1", true, false, l2_pool("db", true, &[])),
                // In a pool without l2Announcement, or in none: not ours.
                vip("10.0.2.1", true, false, plain_pool("bgp")),
                vip("10.0.3.1", true, false, None),
            ],
        );
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            ["rivora-l2-db", "rivora-l2-web"]
        );
        assert_eq!(p["rivora-l2-web"].lease.as_deref(), Some("rivora-l2-web"));
        assert_eq!(
            vips_of(&p, "rivora-l2-web"),
            vec![ip("10.0.0.1"), ip("10.0.0.2")]
        );
        assert_eq!(p["rivora-l2-web"].interfaces, ifs(&["eth0"]));
    }

    #[test]
    fn the_owner_answers_only_what_it_serves_and_stands_only_while_it_serves_one() {
        let p = plan(
            &K8S,
            &ifs(&["eth0"]),
            &[
                vip("10.0.0.1", true, false, l2_pool("web", true, &[])),
                vip("10.0.0.2", false, false, l2_pool("web", true, &[])),
            ],
        );
        assert_eq!(vips_of(&p, "rivora-l2-web"), vec![ip("10.0.0.1")]);
        let none = plan(
            &K8S,
            &ifs(&["eth0"]),
            &[vip("10.0.0.2", false, false, l2_pool("web", true, &[]))],
        );
        assert!(none.is_empty(), "{none:?}");
    }

    #[test]
    fn local_addresses_get_a_lease_each_stood_for_by_the_nodes_that_serve_them() {
        let vips = [
            vip("10.0.0.1", true, false, l2_pool("web", true, &[])),
            vip("10.0.0.7", true, true, l2_pool("web", true, &[])),
            vip("10.0.0.8", false, true, l2_pool("web", true, &[])),
            vip("fd00::7", true, true, l2_pool("web", true, &[])),
        ];
        let p = plan(&K8S, &ifs(&["eth0"]), &vips);
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            [
                "rivora-l2-web",
                "rivora-l2-web-10-0-0-7",
                "rivora-l2-web-fd00-0-0-0-0-0-0-7"
            ]
        );
        assert_eq!(vips_of(&p, "rivora-l2-web"), vec![ip("10.0.0.1")]);
        assert_eq!(vips_of(&p, "rivora-l2-web-10-0-0-7"), vec![ip("10.0.0.7")]);
        // 10.0.0.8 has no endpoint here: this node does not stand for it.
        assert!(!p.keys().any(|k| k.contains("10-0-0-8")));
    }

    #[test]
    fn node_selectors_of_the_pool_and_of_the_settings_both_apply() {
        let vips = [
            vip("10.0.0.1", true, false, l2_pool("web", false, &[])),
            vip("10.0.1.1", true, false, l2_pool("db", true, &[])),
        ];
        let p = plan(&K8S, &ifs(&["eth0"]), &vips);
        assert_eq!(p.keys().collect::<Vec<_>>(), ["rivora-l2-db"]);
        let unselected = Mode::Kubernetes {
            interface_groups: true,
            node_selected: false,
        };
        assert!(plan(&unselected, &ifs(&["eth0"]), &vips).is_empty());
    }

    #[test]
    fn a_pools_interfaces_are_those_it_names_that_the_node_answers_on() {
        let vips = [
            vip(
                "10.0.0.1",
                true,
                false,
                l2_pool("web", true, &["eth1", "eth9"]),
            ),
            vip("10.0.1.1", true, false, l2_pool("db", true, &["eth9"])),
        ];
        let p = plan(&K8S, &ifs(&["eth0", "eth1"]), &vips);
        assert_eq!(p["rivora-l2-web"].interfaces, ifs(&["eth1"]));
        // None of its interfaces here: nothing to stand for.
        assert!(!p.contains_key("rivora-l2-db"));
    }

    #[test]
    fn announce_l2_groups_the_rest_by_interface() {
        let mode = Mode::Kubernetes {
            interface_groups: true,
            node_selected: true,
        };
        let p = plan(
            &mode,
            &ifs(&["eth0", "eth1"]),
            &[
                vip("10.0.0.1", true, false, None),
                vip("10.0.2.1", true, false, plain_pool("other")),
                vip("10.0.3.1", true, false, l2_pool("web", true, &["eth0"])),
                vip("10.0.4.4", true, true, None),
            ],
        );
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            [
                "rivora-l2-eth0",
                "rivora-l2-eth0-10-0-4-4",
                "rivora-l2-eth1",
                "rivora-l2-eth1-10-0-4-4",
                "rivora-l2-web"
            ]
        );
        assert_eq!(
            vips_of(&p, "rivora-l2-eth0"),
            vec![ip("10.0.0.1"), ip("10.0.2.1")]
        );
        assert_eq!(p["rivora-l2-eth1"].interfaces, ifs(&["eth1"]));
        assert_eq!(vips_of(&p, "rivora-l2-web"), vec![ip("10.0.3.1")]);
    }

    #[test]
    fn lease_names_are_valid_and_distinct() {
        assert_eq!(lease_name("web", None), "rivora-l2-web");
        assert_eq!(lease_name("pools.example", None), "rivora-l2-pools.example");
        let a = lease_name("br_0", None);
        let b = lease_name("br-0", None);
        assert_ne!(a, b);
        assert!(a.starts_with("rivora-l2-br-0-"), "{a}");
        let long = lease_name(&"p".repeat(300), Some(ip("fd00::1")));
        assert_eq!(long.len(), MAX_NAME, "{long}");
        assert_ne!(long, lease_name(&"p".repeat(301), Some(ip("fd00::1"))));
        for n in [a, b, long, lease_name("Eth0", Some(ip("10.1.2.3")))] {
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                    && n.ends_with(|c: char| c.is_ascii_alphanumeric()),
                "{n}"
            );
        }
    }
}
