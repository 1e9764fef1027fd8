use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{json, Value};

use super::*;
use crate::pool::{AddressPool, Family};

mod props;

fn at(n: u32) -> Time {
    serde_json::from_value(json!(format!(
        "2026-01-01T{:02}:{:02}:00Z",
        (n / 60) % 24,
        n % 60
    )))
    .expect("a time")
}

/// A pool created at minute `age`.
fn pool(name: &str, age: u32, spec: Value) -> AddressPool {
    let mut p = AddressPool::new(name, serde_json::from_value(spec).expect("a pool spec"));
    p.metadata.creation_timestamp = Some(at(age));
    p.metadata.generation = Some(2);
    p
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn svc(r: &str) -> Claim {
    let (ns, name) = r.split_once('/').expect("ns/name");
    Claim::new(ClaimRef::service(ns, name))
}

fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
    l.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Claim builders for the tables.
trait Build: Sized {
    fn with(self, f: impl FnOnce(&mut Claim)) -> Self;
    fn req(self, a: &str) -> Self {
        self.with(|c| c.request = read_request(Some(a), None))
    }
    fn key(self, k: &str) -> Self {
        self.with(|c| c.sharing.key = Some(k.into()))
    }
    fn ports(self, p: &[(&str, i32)]) -> Self {
        self.with(|c| c.sharing.ports = p.iter().map(|(pr, n)| (pr.to_string(), *n)).collect())
    }
    fn local(self) -> Self {
        self.with(|c| c.sharing.local = true)
    }
    fn fams(self, f: &[Family], p: FamilyPolicy) -> Self {
        self.with(|c| {
            c.families = f.to_vec();
            c.family_policy = p;
        })
    }
    fn labels(self, l: &[(&str, &str)]) -> Self {
        self.with(|c| c.labels = labels(l))
    }
    fn ns_labels(self, l: &[(&str, &str)]) -> Self {
        self.with(|c| c.namespace_labels = labels(l))
    }
    fn current(self, a: &[&str]) -> Self {
        self.with(|c| c.current = a.iter().map(|s| ip(s)).collect())
    }
    fn created(self, n: u32) -> Self {
        self.with(|c| c.created = Some(at(n)))
    }
    /// Read from this `resourceVersion` of the object.
    fn at_version(self, v: &str) -> Self {
        self.with(|c| c.version = Some(v.into()))
    }
}

impl Build for Claim {
    fn with(mut self, f: impl FnOnce(&mut Claim)) -> Self {
        f(&mut self);
        self
    }
}

use Family::{V4, V6};
use FamilyPolicy::{PreferDualStack as Prefer, RequireDualStack as Require, SingleStack as Single};

/// One rule: pools, claims assigned first (each must be served), the
/// claim under test, and what it must get: addresses, and the problems
/// and flags as "Reason: part of the message".
struct Case {
    what: &'static str,
    pools: Vec<AddressPool>,
    before: Vec<Claim>,
    claim: Claim,
    addrs: &'static [&'static str],
    problems: &'static [&'static str],
    flags: &'static [&'static str],
}

fn check_notes(what: &str, kind: &str, got: Vec<(&'static str, String)>, want: &[&str]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {kind} {got:?}, want {want:?}"
    );
    for ((reason, message), w) in got.iter().zip(want) {
        let (wr, wm) = w.split_once(": ").expect("Reason: message");
        assert_eq!(*reason, wr, "{what}: {kind} {message}");
        assert!(
            message.contains(wm),
            "{what}: {kind} {message:?} lacks {wm:?}"
        );
    }
}

fn run(cases: Vec<Case>) {
    for c in cases {
        let mut a = Allocator::new(PoolSet::new(&c.pools));
        for b in &c.before {
            let o = a.assign(b);
            assert!(o.served, "{}: setup {}: {:?}", c.what, b.object, o.problems);
        }
        let o = a.assign(&c.claim);
        let got: Vec<String> = o.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(got, c.addrs, "{}: {:?}", c.what, o.problems);
        check_notes(
            c.what,
            "problems",
            o.problems
                .iter()
                .map(|p| (p.reason(), p.to_string()))
                .collect(),
            c.problems,
        );
        check_notes(
            c.what,
            "flags",
            o.flags
                .iter()
                .map(|f| (f.reason(), f.to_string()))
                .collect(),
            c.flags,
        );
        // The table says what the outcome says.
        assert_eq!(
            a.addresses(&c.claim.object),
            o.addresses.as_slice(),
            "{}",
            c.what
        );
    }
}

fn p4(name: &str, age: u32, addrs: &[&str]) -> AddressPool {
    pool(name, age, json!({ "addresses": addrs }))
}

#[test]
fn automatic_assignment_order() {
    run(vec![
        Case {
            what: "the lowest free address of the only pool",
            pools: vec![p4("a", 1, &["10.0.0.0/30"])],
            before: vec![svc("s/one")],
            claim: svc("s/two"),
            addrs: &["10.0.0.1"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "a hole left by a deletion is found first",
            pools: vec![p4("a", 1, &["10.0.0.0/30"])],
            before: vec![svc("s/one").req("10.0.0.1")],
            claim: svc("s/two"),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "ranges of a pool in address order, past a full one",
            pools: vec![p4("a", 1, &["10.0.2.0/31", "10.0.1.7"])],
            before: vec![svc("s/one")],
            claim: svc("s/two"),
            addrs: &["10.0.2.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "lower priority first, whatever the name",
            pools: vec![
                pool("a", 1, json!({"addresses": ["10.0.0.0/30"], "priority": 5})),
                pool("b", 2, json!({"addresses": ["10.0.1.0/30"], "priority": 1})),
            ],
            before: vec![],
            claim: svc("s/x"),
            addrs: &["10.0.1.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "a pool without priority comes after every pool with one",
            pools: vec![
                p4("a", 1, &["10.0.0.0/30"]),
                pool("z", 2, json!({"addresses": ["10.0.1.0/30"], "priority": 1000})),
            ],
            before: vec![],
            claim: svc("s/x"),
            addrs: &["10.0.1.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "equal priority: by name, not by age",
            pools: vec![
                pool("b", 1, json!({"addresses": ["10.0.0.0/30"], "priority": 1})),
                pool("a", 2, json!({"addresses": ["10.0.1.0/30"], "priority": 1})),
            ],
            before: vec![],
            claim: svc("s/x"),
            addrs: &["10.0.1.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "the next pool when the first is full",
            pools: vec![
                pool("a", 1, json!({"addresses": ["10.0.0.0/31"], "priority": 0})),
                pool("b", 2, json!({"addresses": ["10.0.1.0/30"], "priority": 1})),
            ],
            before: vec![svc("s/one"), svc("s/two")],
            claim: svc("s/three"),
            addrs: &["10.0.1.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "autoAssign false: not for claims that ask for nothing",
            pools: vec![
                pool("a", 1, json!({"addresses": ["10.0.0.0/30"], "autoAssign": false, "priority": 0})),
                p4("b", 2, &["10.0.1.0/30"]),
            ],
            before: vec![],
            claim: svc("s/x"),
            addrs: &["10.0.1.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "autoAssign false: for a request",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.0/30"], "autoAssign": false}),
            )],
            before: vec![],
            claim: svc("s/x").req("10.0.0.2"),
            addrs: &["10.0.0.2"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "autoAssign false only: no pool for the rest",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.0/30"], "autoAssign": false}),
            )],
            before: vec![],
            claim: svc("s/x"),
            addrs: &[],
            problems: &["NoPool: Service s/x: no AddressPool in use with autoAssign has IPv4 addresses for it"],
            flags: &[],
        },
        Case {
            what: "avoidBuggyIPs skips .0 and .255",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.254-10.0.1.2"], "avoidBuggyIPs": true}),
            )],
            before: vec![svc("s/one")],
            claim: svc("s/two"),
            addrs: &["10.0.1.1"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "avoidBuggyIPs refuses a request for .255",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.0/24"], "avoidBuggyIPs": true}),
            )],
            before: vec![],
            claim: svc("s/x").req("10.0.0.255"),
            addrs: &[],
            problems: &["AddressAvoided: Service s/x: requested address 10.0.0.255 ends in .0 or .255, which AddressPool a avoids"],
            flags: &[],
        },
        Case {
            what: "avoidBuggyIPs leaves IPv6 alone",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["2001:db8::/120"], "avoidBuggyIPs": true}),
            )],
            before: vec![],
            claim: svc("s/x").fams(&[V6], Single),
            addrs: &["2001:db8::"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "exhausted: names every pool tried",
            pools: vec![
                p4("a", 1, &["10.0.0.0/32"]),
                p4("b", 2, &["10.0.1.0/32"]),
                pool("c", 3, json!({"addresses": ["10.0.2.0/24"], "serviceSelector": {"matchLabels": {"tier": "db"}}})),
            ],
            before: vec![svc("s/one"), svc("s/two")],
            claim: svc("s/three"),
            addrs: &[],
            problems: &["NoAddressAvailable: Service s/three: no free IPv4 address in AddressPool a, b"],
            flags: &[],
        },
    ]);
}

#[test]
fn selectors_choose_pools() {
    let web = || {
        pool(
            "web",
            1,
            json!({"addresses": ["10.0.0.0/30"], "priority": 0,
                   "serviceSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}}),
        )
    };
    let prod = || {
        pool(
            "prod",
            2,
            json!({"addresses": ["10.0.1.0/30"], "priority": 1,
                   "namespaceSelector": {"matchLabels": {"env": "prod"}}}),
        )
    };
    run(vec![
        Case {
            what: "serviceSelector admits",
            pools: vec![web(), prod()],
            before: vec![],
            claim: svc("s/x").labels(&[("tier", "web")]),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "namespaceSelector admits the next pool",
            pools: vec![web(), prod()],
            before: vec![],
            claim: svc("s/x").ns_labels(&[("env", "prod")]),
            addrs: &["10.0.1.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "no pool selects it: the message says whose selector",
            pools: vec![web(), prod()],
            before: vec![],
            claim: svc("s/x").labels(&[("tier", "db")]),
            addrs: &[],
            problems: &["NoPool: (not selected by web's serviceSelector, prod's namespaceSelector)"],
            flags: &[],
        },
        Case {
            what: "a request in a pool that does not select it",
            pools: vec![web(), prod()],
            before: vec![],
            claim: svc("s/x").req("10.0.0.1"),
            addrs: &[],
            problems: &["PoolNotAllowed: Service s/x: requested address 10.0.0.1 is in AddressPool web, whose serviceSelector does not select it"],
            flags: &[],
        },
        Case {
            what: "a request in a pool whose namespaceSelector refuses",
            pools: vec![web(), prod()],
            before: vec![],
            claim: svc("s/x").req("10.0.1.1").ns_labels(&[("env", "dev")]),
            addrs: &[],
            problems: &["PoolNotAllowed: AddressPool prod, whose namespaceSelector does not select it"],
            flags: &[],
        },
    ]);
}

#[test]
fn requests() {
    let pools = || vec![p4("a", 1, &["10.0.0.0/29", "2001:db8::/64"])];
    run(vec![
        Case {
            what: "a free requested address is given, not the lowest",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").req("10.0.0.5"),
            addrs: &["10.0.0.5"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "outside every pool",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").req("192.0.2.1"),
            addrs: &[],
            problems: &["AddressOutsidePools: Service s/x: requested address 192.0.2.1 is outside every AddressPool in use"],
            flags: &[],
        },
        Case {
            what: "taken: names the holder and why",
            pools: pools(),
            before: vec![svc("other/web").req("10.0.0.5")],
            claim: svc("s/x").req("10.0.0.5"),
            addrs: &[],
            problems: &["AddressTaken: Service s/x: requested address 10.0.0.5 is taken by Service other/web: only claims with the same rivora.io/sharing-key share an address; this one's is none, theirs none"],
            flags: &[],
        },
        Case {
            what: "the deprecated spec.loadBalancerIP",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").with(|c| c.request = read_request(None, Some("10.0.0.3"))),
            addrs: &["10.0.0.3"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "a requested address of a family it does not have",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").req("10.0.0.3,2001:db8::5"),
            addrs: &["10.0.0.3"],
            problems: &["FamilyNotWanted: requested address 2001:db8::5 is IPv6, but its ipFamilies are IPv4"],
            flags: &[],
        },
        Case {
            what: "an unreadable request, nothing held: nothing",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").req("10.0.0.3,ten"),
            addrs: &[],
            problems: &["InvalidRequest: Service s/x: rivora.io/load-balancer-ips: \"ten\" is not an IP address; addresses it already holds are kept"],
            flags: &[],
        },
        Case {
            what: "an unreadable request keeps what its status holds",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").req("10.0.0.3,ten").current(&["10.0.0.6"]),
            addrs: &["10.0.0.6"],
            problems: &["InvalidRequest: \"ten\" is not an IP address"],
            flags: &[],
        },
        Case {
            what: "a new request releases what the status held",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").req("10.0.0.3").current(&["10.0.0.6"]),
            addrs: &["10.0.0.3"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "a request the status already holds: kept",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").req("10.0.0.6").current(&["10.0.0.6"]),
            addrs: &["10.0.0.6"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "no request any more: what it holds stays",
            pools: pools(),
            before: vec![],
            claim: svc("s/x").current(&["10.0.0.6"]),
            addrs: &["10.0.0.6"],
            problems: &[],
            flags: &[],
        },
    ]);
}

#[test]
fn read_request_table() {
    let a = |s: &[&str]| Request::Addresses(s.iter().map(|s| ip(s)).collect());
    let rows: Vec<(Option<&str>, Option<&str>, Request)> = vec![
        (None, None, Request::Auto),
        (Some(""), Some(" "), Request::Auto),
        (
            Some(" 10.0.0.1 , 2001:db8::1 "),
            None,
            a(&["10.0.0.1", "2001:db8::1"]),
        ),
        (Some("10.0.0.1,10.0.0.1"), None, a(&["10.0.0.1"])),
        (None, Some("10.0.0.2"), a(&["10.0.0.2"])),
        (Some("10.0.0.2"), Some("10.0.0.2"), a(&["10.0.0.2"])),
        (
            Some("10.0.0.1"),
            Some("10.0.0.2"),
            Request::Invalid(RequestProblem::Disagree {
                lb_ip: ip("10.0.0.2"),
            }),
        ),
        (
            Some("10.0.0.1,10.0.0.2"),
            None,
            Request::Invalid(RequestProblem::TwoOfOneFamily {
                family: V4,
                a: ip("10.0.0.1"),
                b: ip("10.0.0.2"),
            }),
        ),
        (
            Some("10.0.0.1/32"),
            None,
            Request::Invalid(RequestProblem::Unreadable("10.0.0.1/32".into())),
        ),
        (
            None,
            Some("x"),
            Request::Invalid(RequestProblem::UnreadableLoadBalancerIp("x".into())),
        ),
    ];
    for (ann, lb, want) in rows {
        assert_eq!(read_request(ann, lb), want, "{ann:?} {lb:?}");
    }
}

#[test]
fn sharing() {
    let pools = || vec![p4("a", 1, &["10.0.0.0/29"])];
    let dns = |name: &str, proto: &str| svc(&format!("s/{name}")).key("dns").ports(&[(proto, 53)]);
    run(vec![
        Case {
            what: "same key, disjoint ports: the address its key holds",
            pools: pools(),
            before: vec![svc("s/first"), dns("tcp", "TCP")],
            claim: dns("udp", "UDP"),
            addrs: &["10.0.0.1"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "same key, disjoint ports: a request shares",
            pools: pools(),
            before: vec![dns("tcp", "TCP").req("10.0.0.4")],
            claim: dns("udp", "UDP").req("10.0.0.4"),
            addrs: &["10.0.0.4"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "same key, a port in common: its own address",
            pools: pools(),
            before: vec![dns("one", "TCP")],
            claim: dns("two", "TCP"),
            addrs: &["10.0.0.1"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "same key, a port in common: a request is refused",
            pools: pools(),
            before: vec![dns("one", "TCP").req("10.0.0.4")],
            claim: dns("two", "TCP").req("10.0.0.4"),
            addrs: &[],
            problems: &["AddressTaken: is taken by Service s/one: both use port 53/TCP"],
            flags: &[],
        },
        Case {
            what: "same key, another externalTrafficPolicy: refused",
            pools: pools(),
            before: vec![dns("tcp", "TCP").req("10.0.0.4")],
            claim: dns("udp", "UDP").local().req("10.0.0.4"),
            addrs: &[],
            problems: &["AddressTaken: externalTrafficPolicy differs (Local here, Cluster there)"],
            flags: &[],
        },
        Case {
            what: "another key: refused",
            pools: pools(),
            before: vec![dns("tcp", "TCP").req("10.0.0.4")],
            claim: svc("s/other")
                .key("web")
                .ports(&[("TCP", 80)])
                .req("10.0.0.4"),
            addrs: &[],
            problems: &["AddressTaken: this one's is \"web\", theirs \"dns\""],
            flags: &[],
        },
        Case {
            what: "no key on the newcomer: refused",
            pools: pools(),
            before: vec![dns("tcp", "TCP").req("10.0.0.4")],
            claim: svc("s/other").ports(&[("TCP", 80)]).req("10.0.0.4"),
            addrs: &[],
            problems: &["AddressTaken: this one's is none, theirs \"dns\""],
            flags: &[],
        },
        Case {
            what: "same key, another namespace: refused (the pool does not allow it)",
            pools: pools(),
            before: vec![dns("tcp", "TCP").req("10.0.0.4")],
            claim: svc("t/udp").key("dns").ports(&[("UDP", 53)]).req("10.0.0.4"),
            addrs: &[],
            problems: &["AddressTaken: it is held in namespace s, and its AddressPool does not set allowSharingAcrossNamespaces"],
            flags: &[],
        },
        Case {
            what: "same key, another namespace, automatic: not joined, an address of its own",
            pools: pools(),
            before: vec![dns("tcp", "TCP")],
            claim: svc("t/udp").key("dns").ports(&[("UDP", 53)]),
            addrs: &["10.0.0.1"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "same key, another namespace, the pool allows it: shared",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.0/29"], "allowSharingAcrossNamespaces": true}),
            )],
            before: vec![dns("tcp", "TCP")],
            claim: svc("t/udp").key("dns").ports(&[("UDP", 53)]),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "three share when every pair may",
            pools: pools(),
            before: vec![dns("tcp", "TCP"), dns("udp", "UDP")],
            claim: svc("s/web").key("dns").ports(&[("TCP", 80)]),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "a shared address outside the pools it may use is not joined",
            pools: vec![
                p4("a", 1, &["10.0.0.0/29"]),
                pool(
                    "b",
                    2,
                    json!({"addresses": ["10.0.1.0/29"], "serviceSelector": {"matchLabels": {"x": "y"}}}),
                ),
            ],
            before: vec![dns("tcp", "TCP").labels(&[("x", "y")]).req("10.0.1.3")],
            claim: dns("udp", "UDP"),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
    ]);
}

#[test]
fn families() {
    let both = || vec![p4("a", 1, &["10.0.0.0/29", "2001:db8::/64"])];
    let v4_only = || vec![p4("a", 1, &["10.0.0.0/29"])];
    run(vec![
        Case {
            what: "SingleStack takes the first of ipFamilies",
            pools: both(),
            before: vec![],
            claim: svc("s/x").fams(&[V6, V4], Single),
            addrs: &["2001:db8::"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "unset ipFamilies is IPv4",
            pools: both(),
            before: vec![],
            claim: svc("s/x").fams(&[], Single),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "PreferDualStack, both families: both, in ipFamilies order",
            pools: both(),
            before: vec![],
            claim: svc("s/x").fams(&[V6, V4], Prefer),
            addrs: &["2001:db8::", "10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "PreferDualStack takes what it can",
            pools: v4_only(),
            before: vec![],
            claim: svc("s/x").fams(&[V4, V6], Prefer),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "PreferDualStack with ipFamilies of one family: one",
            pools: both(),
            before: vec![],
            claim: svc("s/x").fams(&[V4], Prefer),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "PreferDualStack, nothing at all: says why",
            pools: vec![p4("a", 1, &["10.0.0.0/32"])],
            before: vec![svc("s/first")],
            claim: svc("s/x").fams(&[V4, V6], Prefer),
            addrs: &[],
            problems: &[
                "NoAddressAvailable: no free IPv4 address in AddressPool a",
                "NoPool: no AddressPool in use with autoAssign has IPv6 addresses",
            ],
            flags: &[],
        },
        Case {
            what: "PreferDualStack, a request for one family: that one",
            pools: both(),
            before: vec![],
            claim: svc("s/x").fams(&[V4, V6], Prefer).req("10.0.0.4"),
            addrs: &["10.0.0.4"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "PreferDualStack, a taken request is still a problem",
            pools: both(),
            before: vec![svc("s/first").fams(&[V6], Single).req("2001:db8::9")],
            claim: svc("s/x").fams(&[V4, V6], Prefer).req("10.0.0.4,2001:db8::9"),
            addrs: &["10.0.0.4"],
            problems: &["AddressTaken: requested address 2001:db8::9 is taken by Service s/first"],
            flags: &[],
        },
        Case {
            what: "RequireDualStack: both",
            pools: both(),
            before: vec![],
            claim: svc("s/x").fams(&[V4, V6], Require),
            addrs: &["10.0.0.0", "2001:db8::"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "RequireDualStack without an IPv6 pool: nothing",
            pools: v4_only(),
            before: vec![],
            claim: svc("s/x").fams(&[V4, V6], Require),
            addrs: &[],
            problems: &["NoPool: Service s/x: no AddressPool in use with autoAssign has IPv6 addresses for it"],
            flags: &[],
        },
        Case {
            what: "RequireDualStack with ipFamilies of one: the other is needed too",
            pools: v4_only(),
            before: vec![],
            claim: svc("s/x").fams(&[V4], Require),
            addrs: &[],
            problems: &["NoPool: has IPv6 addresses"],
            flags: &[],
        },
        Case {
            what: "RequireDualStack, a request for one family: nothing",
            pools: both(),
            before: vec![],
            claim: svc("s/x").fams(&[V4, V6], Require).req("10.0.0.4"),
            addrs: &[],
            problems: &["FamilyNotRequested: Service s/x: needs an IPv6 address (RequireDualStack), and its requested addresses have none"],
            flags: &[],
        },
        Case {
            what: "RequireDualStack keeps what it held when the other family fails",
            pools: v4_only(),
            before: vec![],
            claim: svc("s/x").fams(&[V4, V6], Require).current(&["10.0.0.5"]),
            addrs: &["10.0.0.5"],
            problems: &["NoPool: has IPv6 addresses"],
            flags: &[],
        },
        Case {
            what: "a family dropped from ipFamilies is released",
            pools: both(),
            before: vec![],
            claim: svc("s/x")
                .fams(&[V4], Single)
                .current(&["10.0.0.5", "2001:db8::7"]),
            addrs: &["10.0.0.5"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "a second address of one family in the status: the first stays",
            pools: both(),
            before: vec![],
            claim: svc("s/x").current(&["10.0.0.5", "10.0.0.2"]),
            addrs: &["10.0.0.5"],
            problems: &[],
            flags: &[],
        },
    ]);
}

#[test]
fn kept_addresses_are_flagged_not_moved() {
    run(vec![
        Case {
            what: "a status address in no pool",
            pools: vec![p4("a", 1, &["10.0.0.0/29"])],
            before: vec![],
            claim: svc("s/x").current(&["192.0.2.7"]),
            addrs: &["192.0.2.7"],
            problems: &[],
            flags: &["AddressNotInPool: Service s/x: address 192.0.2.7 is in no AddressPool in use; it is kept"],
        },
        Case {
            what: "a status address in a pool that no longer selects it",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.0/29"], "serviceSelector": {"matchLabels": {"t": "web"}}}),
            )],
            before: vec![],
            claim: svc("s/x").current(&["10.0.0.3"]),
            addrs: &["10.0.0.3"],
            problems: &[],
            flags: &["PoolNoLongerAllows: address 10.0.0.3 is in AddressPool a, whose serviceSelector no longer selects it; it is kept"],
        },
        Case {
            what: "a status address avoidBuggyIPs now skips",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.0/24"], "avoidBuggyIPs": true}),
            )],
            before: vec![],
            claim: svc("s/x").current(&["10.0.0.0"]),
            addrs: &["10.0.0.0"],
            problems: &[],
            flags: &["AddressAvoided: address 10.0.0.0 ends in .0 or .255"],
        },
        Case {
            what: "a status address in an autoAssign=false pool, without request: kept, no flag",
            pools: vec![pool(
                "a",
                1,
                json!({"addresses": ["10.0.0.0/24"], "autoAssign": false}),
            )],
            before: vec![],
            claim: svc("s/x").current(&["10.0.0.9"]),
            addrs: &["10.0.0.9"],
            problems: &[],
            flags: &[],
        },
        Case {
            what: "a status address another claim holds and will not share: a new one",
            pools: vec![p4("a", 1, &["10.0.0.0/29"])],
            before: vec![svc("s/holder").req("10.0.0.0")],
            claim: svc("s/x").current(&["10.0.0.0"]),
            addrs: &["10.0.0.1"],
            problems: &[],
            flags: &[],
        },
    ]);
}

#[test]
fn pool_changes_keep_every_assignment() {
    let a_pool = p4("a", 1, &["10.0.0.0/29"]);
    let b_pool = p4("b", 2, &["10.0.1.0/29"]);
    let mut alloc = Allocator::new(PoolSet::new([&a_pool, &b_pool]));
    let x = svc("s/x").req("10.0.0.3");
    let y = svc("s/y");
    assert_eq!(alloc.assign(&x).addresses, [ip("10.0.0.3")]);
    assert_eq!(alloc.assign(&y).addresses, [ip("10.0.0.0")]);

    // Pool a is deleted: both keep their address, flagged.
    alloc.set_pools(PoolSet::new([&b_pool]));
    for c in [&x, &y] {
        let o = alloc.assign(c);
        assert_eq!(o.addresses, alloc.addresses(&c.object), "{}", c.object);
        assert_eq!(o.flags.len(), 1, "{o:?}");
        assert_eq!(o.flags[0].reason(), "AddressNotInPool");
        assert!(o.served);
        assert!(o.problems.is_empty(), "{o:?}");
        let cond = o.condition(Some(4), &at(9));
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("True", "AddressNotInPool")
        );
    }
    assert_eq!(alloc.addresses(&y.object), [ip("10.0.0.0")]);
    // A newcomer never gets an address outside the pools, flagged or not.
    assert_eq!(alloc.assign(&svc("s/z")).addresses, [ip("10.0.1.0")]);
    // A new pool over them: the flags go, the addresses stay.
    alloc.set_pools(PoolSet::new([&b_pool, &p4("c", 3, &["10.0.0.0/24"])]));
    let o = alloc.assign(&y);
    assert_eq!(
        (o.addresses.as_slice(), o.flags.len()),
        ([ip("10.0.0.0")].as_slice(), 0)
    );
    // ... and is counted in it.
    let counts = alloc.pool_counts("c").expect("in use");
    assert_eq!(counts.assigned, [2, 0]);
    assert_eq!(counts.available, [254, 0]);
}

#[test]
fn release_frees_and_a_request_change_releases() {
    let p = p4("a", 1, &["10.0.0.0/30"]);
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let x = svc("s/x");
    assert_eq!(alloc.assign(&x).addresses, [ip("10.0.0.0")]);
    assert_eq!(alloc.release(&x.object), [ip("10.0.0.0")]);
    assert!(alloc.holders(ip("10.0.0.0")).is_empty());
    assert!(alloc.release(&x.object).is_empty(), "twice is harmless");
    assert_eq!(alloc.assign(&svc("s/y")).addresses, [ip("10.0.0.0")]);

    // A request for another address: the old one is released at once.
    let z = svc("s/z");
    assert_eq!(alloc.assign(&z).addresses, [ip("10.0.0.1")]);
    let o = alloc.assign(&z.clone().req("10.0.0.3"));
    assert_eq!(o.addresses, [ip("10.0.0.3")]);
    assert_eq!(
        o.released,
        [Released {
            addr: ip("10.0.0.1"),
            why: ReleaseReason::NotRequested
        }]
    );
    assert!(alloc.holders(ip("10.0.0.1")).is_empty());
    // A request that cannot be served still releases the old address.
    let o = alloc.assign(&z.clone().req("10.0.0.0"));
    assert!(o.addresses.is_empty());
    assert!(alloc.holders(ip("10.0.0.3")).is_empty());
    assert_eq!(o.problems[0].reason(), "AddressTaken");
    let cond = o.condition(None, &at(1));
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "AddressTaken")
    );
}

#[test]
fn an_owner_that_changes_its_ports_keeps_the_address_over_a_later_joiner() {
    let p = p4("a", 1, &["10.0.0.0/30"]);
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let owner = svc("s/owner").key("k").ports(&[("TCP", 53)]).created(1);
    let joiner = svc("s/joiner").key("k").ports(&[("UDP", 53)]).created(2);
    assert_eq!(alloc.assign(&owner).addresses, [ip("10.0.0.0")]);
    assert_eq!(alloc.assign(&joiner).addresses, [ip("10.0.0.0")]);
    // The owner now also serves UDP 53: the joiner cannot stay beside it.
    let o = alloc.assign(&owner.clone().ports(&[("TCP", 53), ("UDP", 53)]));
    assert_eq!(o.addresses, [ip("10.0.0.0")], "{o:?}");
    assert!(o.released.is_empty(), "{o:?}");
    assert_eq!(o.displaced, std::slice::from_ref(&joiner.object));
    assert_eq!(
        alloc.holders(ip("10.0.0.0")),
        std::slice::from_ref(&owner.object)
    );
    // The joiner, planned again, moves, and is told why.
    let j = alloc.assign(&joiner);
    assert_eq!(j.addresses, [ip("10.0.0.1")]);
    let w = j.warnings();
    assert!(
        w.iter().any(|w| w.reason == "AddressConflict"
            && w.message.contains(
                "address 10.0.0.0 released: Service s/owner holds it too, and both use port 53/UDP"
            )),
        "{w:?}"
    );
    // Without creation times, nobody is known to be older: the one that
    // changed moves, as before.
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let a = svc("s/a").key("k").ports(&[("TCP", 53)]);
    let b = svc("s/b").key("k").ports(&[("UDP", 53)]);
    alloc.assign(&a);
    alloc.assign(&b);
    let o = alloc.assign(&a.clone().ports(&[("TCP", 53), ("UDP", 53)]));
    assert_eq!(o.addresses, [ip("10.0.0.1")]);
    assert!(o.displaced.is_empty());
}

#[test]
fn a_sharer_that_changes_its_ports_loses_the_address() {
    let p = p4("a", 1, &["10.0.0.0/30"]);
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let tcp = svc("s/tcp").key("k").ports(&[("TCP", 53)]);
    let udp = svc("s/udp").key("k").ports(&[("UDP", 53)]);
    assert_eq!(alloc.assign(&tcp).addresses, [ip("10.0.0.0")]);
    assert_eq!(alloc.assign(&udp).addresses, [ip("10.0.0.0")]);
    assert_eq!(
        alloc.holders(ip("10.0.0.0")),
        [tcp.object.clone(), udp.object.clone()]
    );
    // udp now also wants TCP 53: it cannot share any more; tcp keeps it.
    let clash = udp.clone().ports(&[("UDP", 53), ("TCP", 53)]);
    let o = alloc.assign(&clash);
    assert_eq!(o.addresses, [ip("10.0.0.1")]);
    assert_eq!(o.released.len(), 1);
    let w = o.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].reason, "AddressConflict");
    assert!(
        w[0].message.contains(
            "address 10.0.0.0 released: Service s/tcp holds it too, and both use port 53/TCP"
        ),
        "{w:?}"
    );
    assert_eq!(
        alloc.holders(ip("10.0.0.0")),
        std::slice::from_ref(&tcp.object)
    );
    assert_eq!(alloc.assign(&tcp).addresses, [ip("10.0.0.0")]);
    // The key stays with the address while one holder is left.
    let dns2 = svc("s/dns2").key("k").ports(&[("UDP", 53)]);
    assert_eq!(alloc.assign(&dns2).addresses, [ip("10.0.0.0")]);
}

#[test]
fn rebuild_keeps_statuses_and_the_older_keeps_a_disputed_address() {
    let p = p4("a", 1, &["10.0.0.0/29"]);
    let claims = vec![
        svc("s/young").created(30).current(&["10.0.0.2"]),
        svc("s/old").created(10).current(&["10.0.0.2"]),
        svc("s/gone-pool").created(20).current(&["192.0.2.1"]),
        svc("s/new").created(40),
        svc("s/mid").created(25).current(&["10.0.0.0"]),
    ];
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let out = alloc.rebuild(&claims);
    let got: Vec<(String, Vec<IpAddr>)> = out
        .iter()
        .map(|o| (o.object.name.clone(), o.addresses.clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("old".to_string(), vec![ip("10.0.0.2")]),
            ("gone-pool".into(), vec![ip("192.0.2.1")]),
            ("mid".into(), vec![ip("10.0.0.0")]),
            // Not 10.0.0.0: every status is seeded before anything is
            // assigned.
            ("young".into(), vec![ip("10.0.0.1")]),
            ("new".into(), vec![ip("10.0.0.3")]),
        ]
    );
    assert_eq!(out[1].flags[0].reason(), "AddressNotInPool");
    let young = &out[3];
    assert!(matches!(
        &young.released[..],
        [Released { why: ReleaseReason::Conflict { holder, .. }, .. }] if holder.name == "old"
    ));
    assert_eq!(young.warnings()[0].reason, "AddressConflict");

    // A second rebuild from what the first produced changes nothing.
    let again: Vec<Claim> = claims
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.current = alloc.addresses(&c.object).to_vec();
            c
        })
        .collect();
    let mut fresh = Allocator::new(PoolSet::new([&p]));
    let out2 = fresh.rebuild(&again);
    for o in &out2 {
        assert_eq!(o.addresses, alloc.addresses(&o.object), "{}", o.object);
        assert!(o.released.is_empty(), "{o:?}");
    }
}

/// The API server's status is the truth: the table's addresses stand
/// for the version of the object they were assigned from (a write of
/// them may be in flight), and a claim read from any other version
/// brings a status that replaces them.
#[test]
fn a_newer_status_wins_over_the_table() {
    let p = p4("a", 1, &["10.0.0.0/29"]);
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let x = || svc("s/x");
    assert_eq!(
        alloc.assign(&x().at_version("1")).addresses,
        [ip("10.0.0.0")]
    );
    // The same version again (its write in flight): what the table picked.
    assert_eq!(
        alloc.assign(&x().at_version("1")).addresses,
        [ip("10.0.0.0")]
    );

    // The write was refused: the status that won says 10.0.0.5. The pick
    // was never written: it is free again, not kept beside the status.
    let o = alloc.assign(&x().at_version("2").current(&["10.0.0.5"]));
    assert_eq!(o.addresses, [ip("10.0.0.5")]);
    assert!(o.released.is_empty(), "{o:?}");
    assert!(alloc.holders(ip("10.0.0.0")).is_empty());
    assert_eq!(alloc.addresses(&x().object), [ip("10.0.0.5")]);
    assert_eq!(alloc.assign(&svc("s/y")).addresses, [ip("10.0.0.0")]);

    // An address in no pool, kept and flagged while the status has it ...
    let o = alloc.assign(&x().at_version("3").current(&["192.0.2.7"]));
    assert_eq!(o.addresses, [ip("192.0.2.7")]);
    assert_eq!(o.flags[0].reason(), "AddressNotInPool");
    assert!(
        o.flags[0].to_string().contains("remove it from the status"),
        "{}",
        o.flags[0]
    );
    // ... and removed from the status by hand, as the flag advises: gone
    // from the table too, and a pool address instead.
    let o = alloc.assign(&x().at_version("4"));
    assert_eq!(o.addresses, [ip("10.0.0.1")]);
    assert!(o.flags.is_empty(), "{o:?}");
    assert!(alloc.holders(ip("192.0.2.7")).is_empty());

    // A status naming an address another claim holds (and will not
    // share): the holder keeps it, the newcomer is told and served anew.
    let o = alloc.assign(&x().at_version("5").current(&["10.0.0.0"]));
    assert_eq!(o.addresses, [ip("10.0.0.1")]);
    assert_eq!(alloc.holders(ip("10.0.0.0")), [svc("s/y").object]);
    assert_eq!(o.warnings()[0].reason, "AddressConflict");

    // A claim read without a version keeps what the table holds.
    assert_eq!(
        alloc.assign(&svc("s/y").current(&["10.0.0.6"])).addresses,
        [ip("10.0.0.0")]
    );
}

#[test]
fn pool_set_refuses_the_younger_of_two_that_overlap() {
    let pools = [
        p4("young", 30, &["10.0.0.128/25"]),
        p4("old", 10, &["10.0.0.0/25", "10.0.0.200"]),
        p4("apart", 20, &["10.0.1.0/24"]),
        // Overlaps only the refused pool: used.
        p4("after-young", 40, &["10.0.0.129"]),
        p4("bad", 5, &["10.0.0.5/24"]),
        // Same age as apart: the name decides.
        p4("aardvark", 20, &["10.0.1.255-10.0.2.3"]),
    ];
    let set = PoolSet::new(&pools);
    let used: Vec<&str> = set.accepted().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        used,
        ["aardvark", "after-young", "old"],
        "{:?}",
        set.refused
    );
    let young = set.refusal("young").expect("refused");
    assert_eq!(young.reason, "Overlap");
    assert_eq!(
        young.message,
        "addresses 10.0.0.128-10.0.0.255 overlap 10.0.0.200 of the older AddressPool old: this pool is not used"
    );
    assert_eq!(
        set.refusal("apart").expect("refused").message,
        "addresses 10.0.1.0-10.0.1.255 overlap 10.0.1.255-10.0.2.3 of the older AddressPool aardvark: this pool is not used"
    );
    assert_eq!(
        set.refusal("bad").expect("refused").reason,
        "InvalidAddresses"
    );
    assert_eq!(
        set.pool_of(ip("10.0.0.129")).map(|p| p.name.as_str()),
        Some("after-young")
    );
    assert_eq!(set.pool_of(ip("10.0.0.130")).map(|p| p.name.as_str()), None);
    assert_eq!(
        set.pool_of(ip("10.0.0.127")).map(|p| p.name.as_str()),
        Some("old")
    );
    assert_eq!(
        set.pool_of(ip("10.0.0.200")).map(|p| p.name.as_str()),
        Some("old")
    );
    assert_eq!(set.pool_of(ip("10.0.2.4")).map(|p| p.name.as_str()), None);
    // The order the pools are listed in does not matter.
    let mut rev = pools.to_vec();
    rev.reverse();
    let set2 = PoolSet::new(&rev);
    assert_eq!(
        set2.accepted().iter().map(|p| &p.name).collect::<Vec<_>>(),
        used
    );
}

#[test]
fn pool_status_counts_and_conditions() {
    let now = at(50);
    let p = pool(
        "a",
        1,
        json!({"addresses": ["10.0.0.0/24", "2001:db8::/64"], "avoidBuggyIPs": true}),
    );
    let late = p4("late", 2, &["10.0.0.7"]);
    let bad = p4("bad", 3, &["10.0.9.9-10.0.9.1"]);
    let set = PoolSet::new([&p, &late, &bad]);
    let mut alloc = Allocator::new(set);
    let shared = |n: &str, proto: &str| svc(n).key("k").ports(&[(proto, 1)]);
    alloc.assign(&shared("s/a", "TCP"));
    alloc.assign(&shared("s/b", "UDP"));
    alloc.assign(&svc("s/c").fams(&[V4, V6], Require));
    // Kept from a status although avoidBuggyIPs skips it.
    alloc.assign(&svc("s/d").current(&["10.0.0.255"]));
    let st = alloc.pool_status(&p, &now);
    assert_eq!(st.assigned, FamilyCounts { ipv4: 3, ipv6: 1 });
    assert_eq!(
        st.available,
        FamilyCounts {
            ipv4: 254 - 2,
            ipv6: i64::MAX
        }
    );
    let show = |s: &AddressPoolStatus| {
        s.conditions
            .iter()
            .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        show(&st),
        [
            "Ready=True Ready: the pool is valid and in use",
            "Conflict=False NoConflict: no older AddressPool overlaps this one"
        ]
    );
    assert!(st
        .conditions
        .iter()
        .all(|c| c.observed_generation == Some(2)));
    let late_st = alloc.pool_status(&late, &now);
    assert_eq!(late_st.assigned, FamilyCounts::default());
    assert_eq!(
        show(&late_st),
        [
            "Ready=False Overlap: addresses 10.0.0.7 overlap 10.0.0.0-10.0.0.255 of the older AddressPool a: this pool is not used",
            "Conflict=True Overlap: addresses 10.0.0.7 overlap 10.0.0.0-10.0.0.255 of the older AddressPool a: this pool is not used"
        ]
    );
    assert_eq!(
        show(&alloc.pool_status(&bad, &now)),
        [
            "Ready=False InvalidAddresses: addresses[0]: 10.0.9.9-10.0.9.1: the range ends below its start",
            "Conflict=False NoConflict: no older AddressPool overlaps this one"
        ]
    );
    // Written back, a later status keeps the transition times.
    let mut p2 = p.clone();
    p2.status = Some(st);
    let st2 = alloc.pool_status(&p2, &at(99));
    assert!(st2.conditions.iter().all(|c| c.last_transition_time == now));
}

#[test]
fn outcome_condition_and_status() {
    let p = p4("a", 1, &["10.0.0.0/30", "2001:db8::/126"]);
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let o = alloc.assign(&svc("s/x").fams(&[V6, V4], Require));
    let c = o.condition(Some(7), &at(3));
    assert_eq!(c.type_, "rivora.io/AddressAssigned");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("True", "Assigned", "assigned 2001:db8::, 10.0.0.0")
    );
    assert_eq!(c.observed_generation, Some(7));
    let ips: Vec<Option<String>> = o
        .load_balancer_status()
        .ingress
        .unwrap_or_default()
        .into_iter()
        .map(|i| i.ip)
        .collect();
    assert_eq!(ips, [Some("2001:db8::".into()), Some("10.0.0.0".into())]);
    assert!(o.warnings().is_empty());

    let o = alloc.assign(&svc("s/y").req("192.0.2.1"));
    let c = o.condition(None, &at(3));
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        (
            "False",
            "AddressOutsidePools",
            "Service s/y: requested address 192.0.2.1 is outside every AddressPool in use"
        )
    );
    assert_eq!(o.warnings()[0].reason, "AddressOutsidePools");
}

fn service(v: Value) -> Service {
    serde_json::from_value(v).expect("a Service")
}

#[test]
fn service_claim_reads_the_service() {
    let opts = TranslateOptions::default();
    let ns = labels(&[("env", "prod")]);
    let s = service(json!({
        "metadata": {"namespace": "shop", "name": "web", "labels": {"tier": "web"},
                     "creationTimestamp": "2026-01-01T00:05:00Z",
                     "annotations": {"rivora.io/load-balancer-ips": "10.0.0.1, 2001:db8::1",
                                     "rivora.io/sharing-key": " k "}},
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6", "IPv4", "IPv6"],
                 "ipFamilyPolicy": "RequireDualStack", "externalTrafficPolicy": "Local",
                 "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}, {"hostname": "lb.example"}, {"ip": "nope"}]},
                   "conditions": [{"type": CONDITION_ADDRESS_ASSIGNED, "status": "True", "reason": "Assigned",
                                   "message": "assigned", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    }));
    let c = service_claim(&s, &ns, &opts).expect("ours");
    assert_eq!(c.object, ClaimRef::service("shop", "web"));
    assert_eq!(c.object.to_string(), "Service shop/web");
    assert_eq!(c.created, Some(at(5)));
    assert_eq!(c.labels, labels(&[("tier", "web")]));
    assert_eq!(c.namespace_labels, ns);
    assert_eq!(c.wanted(), [V6, V4]);
    assert_eq!(c.family_policy, Require);
    assert_eq!(
        c.request,
        Request::Addresses(vec![ip("10.0.0.1"), ip("2001:db8::1")])
    );
    assert_eq!(
        c.sharing,
        Sharing {
            key: Some("k".into()),
            ports: [("TCP".to_string(), 80), ("UDP".to_string(), 53)].into(),
            local: true
        }
    );
    assert_eq!(c.current, [ip("10.0.0.1")]);

    let plain = service(
        json!({"metadata": {"namespace": "a", "name": "b"}, "spec": {"type": "LoadBalancer"}}),
    );
    let c = service_claim(&plain, &BTreeMap::new(), &opts).expect("ours");
    assert_eq!(
        (c.wanted(), c.family_policy, &c.request),
        (vec![V4], Single, &Request::Auto)
    );
    assert_eq!(c.sharing, Sharing::default());

    // SCTP alone: nothing would forward it, so the claim says so (an SCTP
    // port beside a TCP one is fine: the TCP one is served).
    let sctp = |ports: Value| {
        service(json!({"metadata": {"namespace": "a", "name": "b"},
                       "spec": {"type": "LoadBalancer", "ports": ports}}))
    };
    let c = service_claim(
        &sctp(json!([{"protocol": "SCTP", "port": 9000}])),
        &BTreeMap::new(),
        &opts,
    )
    .expect("ours");
    assert_eq!(
        c.request,
        Request::Invalid(RequestProblem::NoServablePort {
            protocols: "SCTP".into()
        })
    );
    let mut alloc = Allocator::new(PoolSet::new([&pool(
        "p",
        1,
        json!({"addresses": ["10.0.0.0/24"]}),
    )]));
    let out = alloc.assign(&c);
    assert!(out.addresses.is_empty(), "{out:?}");
    assert_eq!(
        out.problems
            .iter()
            .map(AllocError::reason)
            .collect::<Vec<_>>(),
        ["NoServablePort"]
    );
    let c = service_claim(
        &sctp(json!([{"protocol": "SCTP", "port": 9000}, {"protocol": "TCP", "port": 80}])),
        &BTreeMap::new(),
        &opts,
    )
    .expect("ours");
    assert_eq!(c.request, Request::Auto);

    for not_ours in [
        json!({"metadata": {"name": "b"}, "spec": {"type": "ClusterIP"}}),
        json!({"metadata": {"name": "b"}, "spec": {"type": "LoadBalancer", "loadBalancerClass": "other.io/lb"}}),
        json!({"metadata": {"name": "b"}}),
    ] {
        assert_eq!(
            service_claim(&service(not_ours.clone()), &ns, &opts),
            None,
            "{not_ours}"
        );
    }
}

/// 1,000 dual-stack Services from a /22 and a /64, then pool counts: fast
/// because nothing walks a range, only the used addresses.
#[test]
fn a_thousand_dual_stack_services_from_large_pools() {
    let p = pool(
        "big",
        1,
        json!({"addresses": ["10.8.0.0/22", "2001:db8:1::/64"], "avoidBuggyIPs": true}),
    );
    let mut alloc = Allocator::new(PoolSet::new([&p]));
    let mut seen = BTreeSet::new();
    for i in 0..1000 {
        let o = alloc.assign(&svc(&format!("n{}/s{i}", i % 7)).fams(&[V4, V6], Require));
        assert!(o.served && o.problems.is_empty(), "{o:?}");
        for a in &o.addresses {
            assert!(seen.insert(*a), "{a} given twice");
        }
    }
    let counts = alloc.pool_counts("big").expect("in use");
    assert_eq!(counts.assigned, [1000, 1000]);
    assert_eq!(counts.available, [1016 - 1000, (1u128 << 64) - 1000]);
    // The 1,001st IPv4 address skips .255 and .0 of each /24 on the way.
    assert!(!seen
        .iter()
        .any(|a| matches!(a, IpAddr::V4(v) if matches!(v.octets()[3], 0 | 255))));
    // Freeing one in the middle: the next claim gets exactly it.
    let mid = alloc.addresses(&ClaimRef::service("n3", "s500")).to_vec();
    alloc.release(&ClaimRef::service("n3", "s500"));
    let o = alloc.assign(&svc("x/y").fams(&[V4, V6], Require));
    assert_eq!(o.addresses, mid);
}

#[test]
fn the_top_of_the_address_space() {
    let p = p4("top", 1, &["2001:db8::fffe-2001:db8::ffff", "fe80::/10"]);
    let q = p4("v4top", 2, &["255.255.255.253-255.255.255.254"]);
    let mut alloc = Allocator::new(PoolSet::new([&p, &q]));
    let mut got = Vec::new();
    for i in 0..3 {
        got.extend(alloc.assign(&svc(&format!("s/v4-{i}"))).addresses);
    }
    assert_eq!(got, [ip("255.255.255.253"), ip("255.255.255.254")]);
    let st = alloc.pool_counts("top").expect("in use");
    assert_eq!(st.available[1], 2 + (1u128 << 118));
}

#[test]
fn a_gateways_claim_reads_requests_families_and_listener_ports() {
    use crate::gateway::api::gateways::Gateway;
    let gw = |extra: Value| -> Gateway {
        let mut v = json!({
            "metadata": { "namespace": "n", "name": "g", "annotations": {} },
            "spec": { "gatewayClassName": "rivora", "listeners": [
                { "name": "a", "protocol": "TCP", "port": 80 },
                { "name": "b", "protocol": "UDP", "port": 53 } ] },
        });
        if let Value::Object(e) = extra {
            for (k, val) in e {
                match k.as_str() {
                    "annotations" => v["metadata"]["annotations"] = val,
                    _ => v["spec"][k] = val,
                }
            }
        }
        serde_json::from_value(v).expect("a Gateway")
    };
    let none = BTreeMap::new();
    assert!(
        gateway_claim(&gw(json!({})), false, &none).is_none(),
        "not Rivora's class"
    );
    let c = gateway_claim(&gw(json!({})), true, &none).expect("a claim");
    assert_eq!(c.object, ClaimRef::gateway("n", "g"));
    assert_eq!(c.wanted(), vec![Family::V4]);
    assert_eq!(c.request, Request::Auto);
    let ports: BTreeSet<(String, i32)> = [("TCP".to_string(), 80), ("UDP".to_string(), 53)].into();
    assert_eq!(c.sharing.ports, ports);
    // Requested addresses give the families; another address type is not
    // the allocator's (the rules refuse it).
    let c = gateway_claim(
        &gw(json!({ "addresses": [
            { "type": "IPAddress", "value": "fd00::5" },
            { "type": "Hostname", "value": "lb.example" } ] })),
        true,
        &none,
    )
    .expect("a claim");
    assert_eq!(c.request, Request::Addresses(vec![ip("fd00::5")]));
    assert_eq!(c.wanted(), vec![Family::V6]);
    // Dual stack by annotation; a sharing key.
    let c = gateway_claim(
        &gw(json!({ "annotations": {
            "rivora.io/ip-families": "IPv4,IPv6", "rivora.io/sharing-key": "k" } })),
        true,
        &none,
    )
    .expect("a claim");
    assert_eq!(c.wanted(), vec![Family::V4, Family::V6]);
    assert_eq!(c.sharing.key.as_deref(), Some("k"));
    // An unreadable request is a problem of the request, said as such.
    let c = gateway_claim(
        &gw(json!({ "addresses": [{ "value": "not-an-ip" }] })),
        true,
        &none,
    )
    .expect("a claim");
    assert!(matches!(c.request, Request::Invalid(_)), "{:?}", c.request);
}

#[test]
fn claims_carry_the_version_they_were_read_from() {
    let s = service(json!({
        "metadata": {"namespace": "a", "name": "b", "resourceVersion": "42"},
        "spec": {"type": "LoadBalancer"}
    }));
    let c = service_claim(&s, &BTreeMap::new(), &TranslateOptions::default()).expect("ours");
    assert_eq!(c.version.as_deref(), Some("42"));
    let g: crate::gateway::api::gateways::Gateway = serde_json::from_value(json!({
        "metadata": {"namespace": "n", "name": "g", "resourceVersion": "43"},
        "spec": {"gatewayClassName": "rivora", "listeners": []},
    }))
    .expect("a Gateway");
    let c = gateway_claim(&g, true, &BTreeMap::new()).expect("ours");
    assert_eq!(c.version.as_deref(), Some("43"));
}

/// What a node serves: an address of a pool in use whose selectors admit
/// the object, whoever wrote it into the status. The rest is named.
#[test]
fn a_node_serves_only_addresses_a_pool_in_use_admits() {
    let pools = [
        pool(
            "team-a",
            1,
            json!({"addresses": ["10.0.0.0/29"],
                   "namespaceSelector": {"matchLabels": {"team": "a"}}}),
        ),
        pool(
            "web",
            2,
            json!({"addresses": ["2001:db8::/126"],
                   "serviceSelector": {"matchLabels": {"app": "web"}}}),
        ),
        // Overlaps team-a, and is younger: not in use, so its address
        // outside team-a's is no pool's either.
        p4("late", 3, &["10.0.0.4/30", "10.0.0.9"]),
    ];
    let set = PoolSet::new(&pools);
    let obj = ClaimRef::service("b", "x");
    let team_a = labels(&[("team", "a")]);
    let web = labels(&[("app", "web")]);
    let none = labels(&[]);
    let check = |l: &BTreeMap<String, String>, ns: &BTreeMap<String, String>, a: &str| {
        admitted(&set, &obj, l, ns, ip(a))
            .map(|p| p.name.clone())
            .map_err(|f| f.not_served())
    };
    assert_eq!(check(&none, &team_a, "10.0.0.3"), Ok("team-a".into()));
    assert_eq!(check(&web, &none, "2001:db8::2"), Ok("web".into()));
    assert_eq!(
        check(&none, &none, "10.0.0.3"),
        Err("10.0.0.3 is in AddressPool team-a, whose namespaceSelector does not select Service b/x: not served".into())
    );
    assert_eq!(
        check(&none, &team_a, "2001:db8::2"),
        Err("2001:db8::2 is in AddressPool web, whose serviceSelector does not select Service b/x: not served".into())
    );
    for a in ["10.0.0.9", "10.0.0.8", "192.0.2.1", "2001:db8::4"] {
        assert_eq!(
            check(&web, &team_a, a),
            Err(format!("{a} is in no AddressPool in use: only pool addresses are served, whoever writes Service b/x's status (add it to a pool)")),
        );
    }
    // No pools at all: nothing is served.
    let empty = PoolSet::default();
    assert!(admitted(&empty, &obj, &none, &none, ip("10.0.0.3")).is_err());
}
