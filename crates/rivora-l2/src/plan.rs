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
//!   so every admitted node serves the same VIPs, health probes aside:
//!   each node probes for itself, and the owner's view can differ (its
//!   probes to one Service fail while the others' pass).
//! - So an address that a shared group's owner does not answer for may
//!   be *covered* ([`cover`]): the owner writes the group's addresses it
//!   knows and does not answer for on its Lease
//!   ([`UNCLAIMED_ANNOTATION`], with the renewals it writes anyway, and
//!   at once when they change), and a node that serves one of them
//!   stands for that address's own Lease (`rivora-l2-<pool>-<address>`,
//!   the name an eTP Local address's Lease has), whose holder answers for
//!   it. The owner stops answering before it says so, and answers again
//!   only once no other node holds the address's Lease (released, or
//!   expired by its own clock, the election's rule), so the two do not
//!   answer at once but for a watch event in one race (a node that takes
//!   the address's Lease on a copy of the owner's list older than the
//!   owner's claim answers until one of them reads the other's write). The owner claims a covered address back once it has served it
//!   without a break for [`RECLAIM_AFTER`] (a probe that flaps leaves the
//!   address where it is), then the covering node lets go of it. While the
//!   views agree nothing is published and no extra Lease exists; each
//!   address that is covered costs one Lease while it is.
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
use std::time::{Duration, Instant};

/// Every Lease the speaker writes is named with this.
pub const LEASE_PREFIX: &str = "rivora-l2-";
/// The one group of the static path.
pub const STATIC_GROUP: &str = "static";
/// Longest Kubernetes object name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// On a shared group's Lease, written by its holder: the group's
/// addresses it knows and does not answer for, comma-separated (empty:
/// none). A Lease without it (a holder that predates covering) is read as
/// saying nothing, and nobody covers.
pub const UNCLAIMED_ANNOTATION: &str = "rivora.io/l2-unclaimed";
/// A shared group's owner answers again for an address another node
/// covers only once it has served it without a break for this long: a
/// probe that flaps (several health-check intervals up, then down again)
/// must not move the address back and forth. Long beside rise/fall
/// cycles, short beside how long a covering Lease should cost writes.
pub const RECLAIM_AFTER: Duration = Duration::from_secs(10);
/// A node covers an address only once it has known it (in its own
/// status) for this long: a new Service reaches the nodes a watch event
/// apart, and an owner that has not programmed it yet, or has programmed
/// it a moment before its endpoints, would otherwise have it covered for
/// [`RECLAIM_AFTER`] for nothing.
pub const COVER_GRACE: Duration = Duration::from_secs(2);

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
    /// What its owner answers for: the group's VIPs this node serves
    /// (and, after [`cover`], that no other node covers).
    pub vips: BTreeSet<IpAddr>,
    /// A group of many addresses under one Lease (a pool's, an
    /// interface's Cluster VIPs); None for the static group and for an
    /// address's own Lease.
    pub shared: Option<Shared>,
}

/// What a shared group knows besides the addresses it answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shared {
    /// What its name was made of: an address's own Lease is
    /// `lease_name(base, Some(address))`.
    pub base: String,
    /// The group's addresses this node knows and does not serve.
    pub unserved: BTreeSet<IpAddr>,
    /// What its holder writes in [`UNCLAIMED_ANNOTATION`]: the addresses
    /// it knows and does not answer for (filled by [`cover`]).
    pub unclaimed: BTreeSet<IpAddr>,
}

/// The groups, by name (the Lease's, or [`STATIC_GROUP`]).
pub type Plan = BTreeMap<String, Group>;

/// The groups this node stands for, given its `interfaces` (those it
/// answers on) and its `vips`, before [`cover`].
pub fn plan(mode: &Mode, interfaces: &[String], vips: &[VipView]) -> Plan {
    let mut out = Plan::new();
    // A shared group's unserved addresses are remembered too (its holder
    // says which it leaves to others); a group none of whose addresses
    // this node serves is dropped at the end.
    let mut add =
        |name: String, lease: bool, shared: Option<&str>, ifaces: Vec<String>, v: &VipView| {
            if ifaces.is_empty() || !(v.serving || shared.is_some()) {
                return;
            }
            let g = out.entry(name.clone()).or_insert_with(|| Group {
                lease: lease.then_some(name),
                interfaces: ifaces,
                vips: BTreeSet::new(),
                shared: shared.map(|base| Shared {
                    base: base.to_string(),
                    unserved: BTreeSet::new(),
                    unclaimed: BTreeSet::new(),
                }),
            });
            match (&mut g.shared, v.serving) {
                (_, true) => {
                    g.vips.insert(v.addr);
                }
                (Some(sh), false) => {
                    sh.unserved.insert(v.addr);
                }
                (None, false) => {}
            }
        };
    for v in vips {
        match mode {
            Mode::Static => add(STATIC_GROUP.into(), false, None, interfaces.to_vec(), v),
            Mode::Kubernetes {
                interface_groups,
                node_selected,
            } => {
                if !node_selected {
                    continue;
                }
                let named = |base: &str| lease_name(base, v.local.then_some(v.addr));
                // eTP Local addresses have a Lease each already.
                let shared = |base: &str| (!v.local).then(|| base.to_string());
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
                        let base = shared(&pool.name);
                        add(named(&pool.name), true, base.as_deref(), ifaces, v);
                    }
                    None if *interface_groups => {
                        for i in interfaces {
                            let base = shared(i);
                            add(named(i), true, base.as_deref(), vec![i.clone()], v);
                        }
                    }
                    None => {}
                }
            }
        }
    }
    out.retain(|_, g| !g.vips.is_empty());
    out
}

/// What this node sees of the Leases and of its own past, for [`cover`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// By shared group (its Lease's name): the addresses its holder wrote
    /// as unclaimed, as last seen. Absent: no Lease yet, or one without
    /// the annotation.
    pub unclaimed: BTreeMap<String, BTreeSet<IpAddr>>,
    /// Leases another node holds now, as this node judges them (a
    /// released one, or one unrenewed for its duration, is not held).
    pub held_by_others: BTreeSet<String>,
    /// Leases this node holds now.
    pub held: BTreeSet<String>,
    /// Leases this node stands for now.
    pub standing: BTreeSet<String>,
    /// Since when this node has served each address without a break.
    pub served_since: BTreeMap<IpAddr, Instant>,
    /// Since when this node has known each address.
    pub known_since: BTreeMap<IpAddr, Instant>,
}

/// The plan with covering applied (see the module's rules): each shared
/// group answers only for what it claims and no other node covers, says
/// what it leaves (`unclaimed`), and this node stands for the own Lease
/// of each address it serves that the group's holder leaves.
pub fn cover(base: Plan, seen: &Seen, now: Instant) -> Plan {
    let since = |m: &BTreeMap<IpAddr, Instant>, a: &IpAddr, d: Duration| {
        m.get(a)
            .is_some_and(|t| now.saturating_duration_since(*t) >= d)
    };
    let mut out = Plan::new();
    let mut covers = Vec::new();
    for (name, mut g) in base {
        let Some(sh) = g.shared.as_mut() else {
            out.insert(name, g);
            continue;
        };
        let own = |a: IpAddr| lease_name(&sh.base, Some(a));
        let covered = |a: &IpAddr| seen.held_by_others.contains(&own(*a));
        // Claimed: served, and covered by nobody else, or served long
        // enough to take back from whoever covers it.
        let claims: BTreeSet<IpAddr> = g
            .vips
            .iter()
            .copied()
            .filter(|a| !covered(a) || since(&seen.served_since, a, RECLAIM_AFTER))
            .collect();
        let published = seen.unclaimed.get(&name);
        let holds = seen.held.contains(&name);
        for a in &g.vips {
            let lease = own(*a);
            let standing = seen.standing.contains(&lease);
            let left = published.is_some_and(|p| p.contains(a));
            // The holder starts no covering of its own group's addresses
            // (it answers what it claims), but keeps one it stands for
            // until its Lease says it claims the address: let go before,
            // another node that has not seen the claim yet could take
            // the address's Lease while this one answers for it already.
            let stand = left && (standing || (!holds && since(&seen.known_since, a, COVER_GRACE)));
            if stand {
                covers.push((lease, g.interfaces.clone(), *a));
            }
        }
        sh.unclaimed = sh
            .unserved
            .iter()
            .chain(g.vips.iter().filter(|a| !claims.contains(a)))
            .copied()
            .collect();
        g.vips = claims.into_iter().filter(|a| !covered(a)).collect();
        out.insert(name, g);
    }
    for (lease, interfaces, a) in covers {
        out.entry(lease.clone()).or_insert_with(|| Group {
            lease: Some(lease),
            interfaces,
            vips: BTreeSet::from([a]),
            shared: None,
        });
    }
    out
}

/// [`UNCLAIMED_ANNOTATION`]'s value for `addrs`.
pub fn format_unclaimed(addrs: &BTreeSet<IpAddr>) -> String {
    addrs
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// [`UNCLAIMED_ANNOTATION`]'s value read back; None if any part is not
/// an address (not ours to guess at: nobody covers on its word).
pub fn parse_unclaimed(value: &str) -> Option<BTreeSet<IpAddr>> {
    value
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().ok())
        .collect()
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

    /// A "now" with an hour's past behind it whatever the uptime (an
    /// `Instant` cannot go below the boot).
    fn clock() -> Instant {
        Instant::now() + Duration::from_secs(7200)
    }

    fn set(addrs: &[&str]) -> BTreeSet<IpAddr> {
        addrs.iter().map(|a| ip(a)).collect()
    }

    const WEB: &str = "rivora-l2-web";

    /// Two Cluster VIPs of pool `web` (10.0.0.1 served or not as said,
    /// 10.0.0.2 served) and an eTP Local one, as this node's plan before
    /// covering.
    fn web(a_served: bool) -> Plan {
        plan(
            &K8S,
            &ifs(&["eth0"]),
            &[
                vip("10.0.0.1", a_served, false, l2_pool("web", true, &[])),
                vip("10.0.0.2", true, false, l2_pool("web", true, &[])),
                vip("10.0.0.7", false, true, l2_pool("web", true, &[])),
            ],
        )
    }

    /// Known and served for an hour, as of `now`.
    fn long_ago(now: Instant, addrs: &[&str]) -> BTreeMap<IpAddr, Instant> {
        addrs
            .iter()
            .map(|a| (ip(a), now - Duration::from_secs(3600)))
            .collect()
    }

    fn unclaimed_of(p: &Plan, name: &str) -> BTreeSet<IpAddr> {
        p[name]
            .shared
            .as_ref()
            .map(|s| s.unclaimed.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_shared_group_remembers_what_it_knows_and_does_not_serve() {
        let p = web(false);
        let sh = p[WEB].shared.as_ref().expect("a shared group");
        assert_eq!(sh.base, "web");
        // eTP Local addresses are never a shared group's.
        assert_eq!(sh.unserved, set(&["10.0.0.1"]));
        assert_eq!(p[WEB].vips, set(&["10.0.0.2"]));
        // An address's own Lease, and the static group, are not shared.
        let local = plan(
            &K8S,
            &ifs(&["eth0"]),
            &[vip("10.0.0.7", true, true, l2_pool("web", true, &[]))],
        );
        assert_eq!(local["rivora-l2-web-10-0-0-7"].shared, None);
        let st = plan(
            &Mode::Static,
            &ifs(&["eth0"]),
            &[vip("10.0.0.1", true, false, None)],
        );
        assert_eq!(st[STATIC_GROUP].shared, None);
    }

    #[test]
    fn views_that_agree_publish_nothing_and_cover_nothing() {
        let now = clock();
        let seen = Seen {
            unclaimed: BTreeMap::from([(WEB.to_string(), BTreeSet::new())]),
            served_since: long_ago(now, &["10.0.0.1", "10.0.0.2"]),
            known_since: long_ago(now, &["10.0.0.1", "10.0.0.2", "10.0.0.7"]),
            ..Seen::default()
        };
        for held in [false, true] {
            let seen = Seen {
                held: if held {
                    BTreeSet::from([WEB.to_string()])
                } else {
                    BTreeSet::new()
                },
                ..seen.clone()
            };
            let p = cover(web(true), &seen, now);
            assert_eq!(p.keys().collect::<Vec<_>>(), [WEB], "{p:?}");
            assert_eq!(p[WEB].vips, set(&["10.0.0.1", "10.0.0.2"]));
            assert!(unclaimed_of(&p, WEB).is_empty());
        }
    }

    #[test]
    fn the_owner_leaves_what_it_does_not_serve_and_a_node_that_serves_it_covers_it() {
        let now = clock();
        // The holder's view: 10.0.0.1 unserved. It answers for the rest
        // and says it leaves 10.0.0.1.
        let holder = Seen {
            held: BTreeSet::from([WEB.to_string()]),
            served_since: long_ago(now, &["10.0.0.2"]),
            known_since: long_ago(now, &["10.0.0.1", "10.0.0.2", "10.0.0.7"]),
            ..Seen::default()
        };
        let p = cover(web(false), &holder, now);
        assert_eq!(p.keys().collect::<Vec<_>>(), [WEB]);
        assert_eq!(p[WEB].vips, set(&["10.0.0.2"]));
        assert_eq!(unclaimed_of(&p, WEB), set(&["10.0.0.1"]));

        // Another node serves both and reads that on the Lease: it stands
        // for 10.0.0.1's own Lease, on the group's interfaces.
        let other = Seen {
            unclaimed: BTreeMap::from([(WEB.to_string(), set(&["10.0.0.1"]))]),
            served_since: long_ago(now, &["10.0.0.1", "10.0.0.2"]),
            known_since: long_ago(now, &["10.0.0.1", "10.0.0.2", "10.0.0.7"]),
            ..Seen::default()
        };
        let p = cover(web(true), &other, now);
        let own = lease_name("web", Some(ip("10.0.0.1")));
        assert_eq!(own, "rivora-l2-web-10-0-0-1");
        assert_eq!(p.keys().collect::<Vec<_>>(), [WEB, own.as_str()]);
        assert_eq!(
            p[&own],
            Group {
                lease: Some(own.clone()),
                interfaces: ifs(&["eth0"]),
                vips: set(&["10.0.0.1"]),
                shared: None,
            }
        );
        // Its own claim on the shared group is unchanged: were it to win
        // the group's Lease, it would answer for both.
        assert_eq!(p[WEB].vips, set(&["10.0.0.1", "10.0.0.2"]));

        // A node that does not serve it does not stand for it.
        let p = cover(web(false), &other, now);
        assert!(!p.contains_key(&own), "{p:?}");
        // Nor does anyone while the Lease says nothing (no annotation: a
        // holder that predates covering, or no Lease yet).
        let silent = Seen {
            unclaimed: BTreeMap::new(),
            ..other.clone()
        };
        assert!(!cover(web(true), &silent, now).contains_key(&own));

        // Whoever holds the address's Lease, the shared group's owner does
        // not answer for it.
        let covered = Seen {
            held_by_others: BTreeSet::from([own.clone()]),
            ..other
        };
        let p = cover(web(true), &covered, now);
        assert_eq!(p[WEB].vips, set(&["10.0.0.2"]));
        assert_eq!(p[&own].vips, set(&["10.0.0.1"]));
    }

    #[test]
    fn a_new_address_is_covered_only_after_the_grace() {
        let now = clock();
        let own = lease_name("web", Some(ip("10.0.0.1")));
        let mut seen = Seen {
            unclaimed: BTreeMap::from([(WEB.to_string(), set(&["10.0.0.1"]))]),
            served_since: long_ago(now, &["10.0.0.2"]),
            known_since: long_ago(now, &["10.0.0.2"]),
            ..Seen::default()
        };
        let just = now - COVER_GRACE + Duration::from_millis(1);
        seen.served_since.insert(ip("10.0.0.1"), just);
        seen.known_since.insert(ip("10.0.0.1"), just);
        assert!(!cover(web(true), &seen, now).contains_key(&own));
        assert!(cover(web(true), &seen, now + Duration::from_millis(1)).contains_key(&own));
        // A node already standing for it keeps standing.
        seen.standing.insert(own.clone());
        assert!(cover(web(true), &seen, now).contains_key(&own));
        // Never an address this node does not know at all.
        seen.known_since.remove(&ip("10.0.0.1"));
        seen.standing.clear();
        assert!(!cover(web(true), &seen, now + Duration::from_secs(60)).contains_key(&own));
    }

    #[test]
    fn the_owner_takes_a_covered_address_back_only_after_serving_it_for_the_hold() {
        let now = clock();
        let own = lease_name("web", Some(ip("10.0.0.1")));
        let mut seen = Seen {
            held: BTreeSet::from([WEB.to_string()]),
            unclaimed: BTreeMap::from([(WEB.to_string(), set(&["10.0.0.1"]))]),
            held_by_others: BTreeSet::from([own.clone()]),
            served_since: long_ago(now, &["10.0.0.2"]),
            known_since: long_ago(now, &["10.0.0.1", "10.0.0.2"]),
            ..Seen::default()
        };
        // Serving it again, but not yet for the hold: still left to the
        // node that covers it (a probe that flaps starts the hold again).
        seen.served_since.insert(
            ip("10.0.0.1"),
            now - RECLAIM_AFTER + Duration::from_millis(1),
        );
        let p = cover(web(true), &seen, now);
        assert_eq!(p[WEB].vips, set(&["10.0.0.2"]));
        assert_eq!(unclaimed_of(&p, WEB), set(&["10.0.0.1"]));
        // The holder does not stand for the address's own Lease.
        assert!(!p.contains_key(&own), "{p:?}");
        // After the hold it claims it (the covering node reads that and
        // lets go), but answers only once nobody else holds its Lease.
        let later = now + Duration::from_millis(1);
        let p = cover(web(true), &seen, later);
        assert!(unclaimed_of(&p, WEB).is_empty());
        assert_eq!(p[WEB].vips, set(&["10.0.0.2"]));
        seen.held_by_others.clear();
        let p = cover(web(true), &seen, later);
        assert_eq!(p[WEB].vips, set(&["10.0.0.1", "10.0.0.2"]));
        // An address nobody covers is claimed and answered at once (a
        // Service back from an outage every node saw).
        seen.served_since.insert(ip("10.0.0.1"), now);
        let p = cover(web(true), &seen, now);
        assert_eq!(p[WEB].vips, set(&["10.0.0.1", "10.0.0.2"]));
        assert!(unclaimed_of(&p, WEB).is_empty());
    }

    #[test]
    fn a_node_that_wins_the_group_lets_its_cover_go_only_once_its_claim_is_written() {
        let now = clock();
        let own = lease_name("web", Some(ip("10.0.0.1")));
        // It covered 10.0.0.1, then won the group's Lease: the Lease still
        // says the old holder's list.
        let mut seen = Seen {
            held: BTreeSet::from([WEB.to_string(), own.clone()]),
            standing: BTreeSet::from([WEB.to_string(), own.clone()]),
            unclaimed: BTreeMap::from([(WEB.to_string(), set(&["10.0.0.1"]))]),
            served_since: long_ago(now, &["10.0.0.1", "10.0.0.2"]),
            known_since: long_ago(now, &["10.0.0.1", "10.0.0.2"]),
            ..Seen::default()
        };
        let p = cover(web(true), &seen, now);
        // Both groups answer for it (one fence or the other), its claim
        // is to be written, and the cover stays until it is.
        assert_eq!(p[WEB].vips, set(&["10.0.0.1", "10.0.0.2"]));
        assert!(unclaimed_of(&p, WEB).is_empty());
        assert_eq!(p[&own].vips, set(&["10.0.0.1"]));
        seen.unclaimed.insert(WEB.to_string(), BTreeSet::new());
        let p = cover(web(true), &seen, now);
        assert!(!p.contains_key(&own), "{p:?}");
        assert_eq!(p[WEB].vips, set(&["10.0.0.1", "10.0.0.2"]));
    }

    #[test]
    fn interface_groups_are_covered_by_address_too() {
        let now = clock();
        let mode = Mode::Kubernetes {
            interface_groups: true,
            node_selected: true,
        };
        let base = plan(
            &mode,
            &ifs(&["eth0"]),
            &[
                vip("10.0.0.1", true, false, None),
                vip("10.0.0.2", true, false, None),
            ],
        );
        let seen = Seen {
            unclaimed: BTreeMap::from([("rivora-l2-eth0".to_string(), set(&["10.0.0.1"]))]),
            served_since: long_ago(now, &["10.0.0.1", "10.0.0.2"]),
            known_since: long_ago(now, &["10.0.0.1", "10.0.0.2"]),
            ..Seen::default()
        };
        let p = cover(base, &seen, now);
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            ["rivora-l2-eth0", "rivora-l2-eth0-10-0-0-1"]
        );
        assert_eq!(p["rivora-l2-eth0-10-0-0-1"].interfaces, ifs(&["eth0"]));
    }

    #[test]
    fn unclaimed_lists_read_back_and_refuse_what_is_not_an_address() {
        let a = set(&["10.0.0.1", "fd00::1"]);
        assert_eq!(format_unclaimed(&a), "10.0.0.1,fd00::1");
        assert_eq!(parse_unclaimed(&format_unclaimed(&a)), Some(a));
        assert_eq!(parse_unclaimed(""), Some(BTreeSet::new()));
        assert_eq!(parse_unclaimed(" 10.0.0.1 , "), Some(set(&["10.0.0.1"])));
        assert_eq!(parse_unclaimed("10.0.0.1,web"), None);
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
