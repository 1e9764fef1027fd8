//! Property tests: random pools and random sequences of Service
//! creates, changes, deletes and pool changes, run the way the controller
//! runs the allocator (each outcome written back as the Service's status;
//! every claim assigned again after the pools change). After every step:
//! - never two holders of an address, except claims that may share it;
//! - every address held lies in a pool in use that admits the claim, or
//!   its outcome flags it; one per family, of a family it wants, and
//!   among its requested addresses when it requests some;
//! - a step changes no other claim's addresses, and a claim whose spec
//!   did not change keeps every address it held (pool changes included);
//! - the table says what the outcomes say.
//!
//! At the end: a rebuild from the statuses keeps every status address,
//! and once every claim has been assigned again (what the leader's
//! passes do), the rebuild yields exactly the same assignments.

use proptest::prelude::*;

use super::*;

/// Pool address sets, some overlapping others, some dual-stack.
const TEMPLATES: &[&[&str]] = &[
    &["10.0.0.0/29"],
    &["10.0.0.4-10.0.0.12"],
    &["10.0.1.0/30", "2001:db8::/126"],
    &["2001:db8::2-2001:db8::9"],
    &["10.0.0.254-10.0.1.1"],
    &["2001:db8:1::/127", "10.0.2.0/31"],
];

#[derive(Debug, Clone)]
struct PoolGen {
    template: usize,
    age: u32,
    auto: bool,
    avoid: bool,
    priority: Option<i32>,
    tier_web: bool,
    prod_only: bool,
}

fn arb_pool() -> impl Strategy<Value = PoolGen> {
    (
        0..TEMPLATES.len(),
        0u32..5,
        prop_oneof![4 => Just(true), 1 => Just(false)],
        prop_oneof![3 => Just(false), 1 => Just(true)],
        prop_oneof![Just(None), (0i32..3).prop_map(Some)],
        prop_oneof![3 => Just(false), 1 => Just(true)],
        prop_oneof![3 => Just(false), 1 => Just(true)],
    )
        .prop_map(
            |(template, age, auto, avoid, priority, tier_web, prod_only)| PoolGen {
                template,
                age,
                auto,
                avoid,
                priority,
                tier_web,
                prod_only,
            },
        )
}

fn build_pools(gens: &[PoolGen]) -> Vec<AddressPool> {
    gens.iter()
        .enumerate()
        .map(|(i, g)| {
            let mut spec = json!({
                "addresses": TEMPLATES[g.template],
                "autoAssign": g.auto,
                "avoidBuggyIPs": g.avoid,
            });
            if let Some(p) = g.priority {
                spec["priority"] = json!(p);
            }
            if g.tier_web {
                spec["serviceSelector"] = json!({"matchLabels": {"tier": "web"}});
            }
            if g.prod_only {
                spec["namespaceSelector"] =
                    json!({"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]});
            }
            pool(&format!("p{i}"), g.age, spec)
        })
        .collect()
}

#[derive(Debug, Clone)]
enum ReqGen {
    Auto,
    Addresses(Vec<String>),
    LoadBalancerIp(String),
    Garbage,
}

#[derive(Debug, Clone)]
struct SvcGen {
    fams: Vec<Family>,
    policy: FamilyPolicy,
    request: ReqGen,
    key: Option<&'static str>,
    ports: Vec<(&'static str, i32)>,
    local: bool,
    tier: Option<&'static str>,
}

fn arb_addr() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..14).prop_map(|n| format!("10.0.0.{n}")),
        Just("10.0.0.254".to_string()),
        Just("10.0.0.255".to_string()),
        (0u8..3).prop_map(|n| format!("10.0.1.{n}")),
        Just("10.0.2.1".to_string()),
        Just("10.9.9.9".to_string()),
        (0u8..11).prop_map(|n| format!("2001:db8::{n:x}")),
        Just("2001:db8:1::1".to_string()),
        Just("2001:db9::1".to_string()),
    ]
}

fn arb_svc() -> impl Strategy<Value = SvcGen> {
    (
        prop_oneof![
            Just(vec![V4]),
            Just(vec![V6]),
            Just(vec![V4, V6]),
            Just(vec![V6, V4])
        ],
        prop_oneof![2 => Just(Single), 1 => Just(Prefer), 1 => Just(Require)],
        prop_oneof![
            4 => Just(ReqGen::Auto),
            3 => proptest::collection::vec(arb_addr(), 1..3).prop_map(ReqGen::Addresses),
            1 => arb_addr().prop_map(ReqGen::LoadBalancerIp),
            1 => Just(ReqGen::Garbage),
        ],
        prop_oneof![2 => Just(None), 1 => Just(Some("k1")), 1 => Just(Some("k2"))],
        proptest::collection::vec(
            prop_oneof![Just(("TCP", 80)), Just(("TCP", 443)), Just(("UDP", 53))],
            0..3,
        ),
        prop_oneof![3 => Just(false), 1 => Just(true)],
        prop_oneof![Just(None), Just(Some("web")), Just(Some("db"))],
    )
        .prop_map(|(fams, policy, request, key, ports, local, tier)| SvcGen {
            fams,
            policy,
            request,
            key,
            ports,
            local,
            tier,
        })
}

const SERVICES: usize = 8;

fn object(i: usize) -> ClaimRef {
    ClaimRef::service(format!("n{}", i % 2), format!("s{i}"))
}

fn build_claim(i: usize, g: &SvcGen) -> Claim {
    let mut c = Claim::new(object(i))
        .created(100 + i as u32)
        .fams(&g.fams, g.policy)
        .ports(&g.ports)
        .ns_labels(&[("env", if i.is_multiple_of(2) { "prod" } else { "dev" })]);
    c.request = match &g.request {
        ReqGen::Auto => Request::Auto,
        ReqGen::Addresses(a) => read_request(Some(&a.join(",")), None),
        ReqGen::LoadBalancerIp(a) => read_request(None, Some(a)),
        ReqGen::Garbage => read_request(Some("not-an-address"), None),
    };
    if let Some(k) = g.key {
        c = c.key(k);
    }
    if g.local {
        c = c.local();
    }
    if let Some(t) = g.tier {
        c = c.labels(&[("tier", t)]);
    }
    c
}

#[derive(Debug, Clone)]
enum Op {
    Upsert(usize, SvcGen),
    Delete(usize),
    Pools(Vec<PoolGen>),
    Reassess,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SERVICES, arb_svc()).prop_map(|(i, g)| Op::Upsert(i, g)),
        2 => (0..SERVICES).prop_map(Op::Delete),
        1 => proptest::collection::vec(arb_pool(), 0..5).prop_map(Op::Pools),
        1 => Just(Op::Reassess),
    ]
}

struct World {
    pools: Vec<AddressPool>,
    alloc: Allocator,
    /// Live claims, without their status.
    live: BTreeMap<ClaimRef, Claim>,
    /// The last outcome of each live claim: what its status says.
    last: BTreeMap<ClaimRef, Outcome>,
}

fn set(a: &[IpAddr]) -> BTreeSet<IpAddr> {
    a.iter().copied().collect()
}

impl World {
    fn new(gens: &[PoolGen]) -> Self {
        let pools = build_pools(gens);
        Self {
            alloc: Allocator::new(PoolSet::new(&pools)),
            pools,
            live: BTreeMap::new(),
            last: BTreeMap::new(),
        }
    }

    fn status(&self, o: &ClaimRef) -> Vec<IpAddr> {
        self.last
            .get(o)
            .map(|o| o.addresses.clone())
            .unwrap_or_default()
    }

    fn with_status(&self, c: &Claim) -> Claim {
        let mut c = c.clone();
        c.current = self.status(&c.object);
        c
    }

    fn snapshot(&self) -> BTreeMap<ClaimRef, Vec<IpAddr>> {
        self.alloc
            .assignments()
            .map(|(k, a)| (k.clone(), a.to_vec()))
            .collect()
    }

    /// Assign one claim as the controller does; check what it may change.
    fn assign(&mut self, claim: Claim, unchanged: bool) -> Result<(), TestCaseError> {
        let before = self.snapshot();
        let claim = self.with_status(&claim);
        let held = self.alloc.addresses(&claim.object).to_vec();
        let o = self.alloc.assign(&claim);
        let after = self.snapshot();
        for (k, a) in &before {
            if *k == claim.object {
                continue;
            }
            if o.displaced.contains(k) {
                // A later joiner of its key loses what the claim keeps,
                // nothing else.
                let now = after.get(k).cloned().unwrap_or_default();
                let lost: BTreeSet<IpAddr> = set(a).difference(&set(&now)).copied().collect();
                prop_assert!(
                    set(&now).is_subset(&set(a)),
                    "{} gave {} {:?}",
                    claim.object,
                    k,
                    now
                );
                prop_assert!(
                    !lost.is_empty() && lost.iter().all(|x| o.addresses.contains(x)),
                    "{} displaced {} from {:?}, holding {:?}",
                    claim.object,
                    k,
                    lost,
                    o.addresses
                );
            } else {
                prop_assert_eq!(after.get(k), Some(a), "{} changed {}", claim.object, k);
            }
        }
        if unchanged {
            prop_assert!(
                set(&held).is_subset(&set(&o.addresses)),
                "{} unchanged, held {:?}, now {:?}",
                claim.object,
                held,
                o
            );
        }
        for a in &o.addresses {
            if !held.contains(a) && !claim.current.contains(a) {
                prop_assert!(
                    o.flags.iter().all(|f| f.addr() != *a),
                    "new address {} flagged: {:?}",
                    a,
                    o
                );
            }
        }
        self.live.insert(claim.object.clone(), {
            let mut c = claim.clone();
            c.current.clear();
            c
        });
        let displaced = o.displaced.clone();
        self.last.insert(claim.object.clone(), o);
        // As the controller does: those displaced are planned again.
        for d in displaced {
            if let Some(c) = self.live.get(&d).cloned() {
                self.assign(c, false)?;
            }
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Upsert(i, g) => {
                let claim = build_claim(*i, g);
                let unchanged = self.live.get(&claim.object) == Some(&claim);
                self.assign(claim, unchanged)?;
            }
            Op::Delete(i) => {
                let o = object(*i);
                let before = self.snapshot();
                self.alloc.release(&o);
                self.live.remove(&o);
                self.last.remove(&o);
                let after = self.snapshot();
                for (k, a) in &before {
                    if *k != o {
                        prop_assert_eq!(after.get(k), Some(a));
                    }
                }
                prop_assert!(!after.contains_key(&o));
            }
            Op::Pools(gens) => {
                self.pools = build_pools(gens);
                self.alloc.set_pools(PoolSet::new(&self.pools));
                self.reassess()?;
            }
            Op::Reassess => self.reassess()?,
        }
        self.check()
    }

    /// Every claim assigned again, unchanged, oldest first.
    fn reassess(&mut self) -> Result<(), TestCaseError> {
        let mut claims: Vec<Claim> = self.live.values().cloned().collect();
        claims.sort_by(|a, b| {
            by_age(a.created.as_ref(), b.created.as_ref()).then_with(|| a.object.cmp(&b.object))
        });
        for c in claims {
            self.assign(c, true)?;
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        check_table(&self.alloc, &self.live, &self.last)
    }
}

fn check_table(
    alloc: &Allocator,
    live: &BTreeMap<ClaimRef, Claim>,
    last: &BTreeMap<ClaimRef, Outcome>,
) -> Result<(), TestCaseError> {
    for (k, addrs) in alloc.assignments() {
        let claim = live.get(k);
        prop_assert!(claim.is_some(), "{} holds {:?} but is gone", k, addrs);
        let Some(claim) = claim else {
            continue;
        };
        let o = &last[k];
        prop_assert_eq!(set(addrs), set(&o.addresses), "{}", k);
        let wanted = claim.wanted();
        let fams: Vec<Family> = addrs.iter().map(|a| Family::of(*a)).collect();
        prop_assert_eq!(
            fams.iter().collect::<BTreeSet<_>>().len(),
            fams.len(),
            "{} holds two of one family: {:?}",
            k,
            addrs
        );
        for &a in addrs {
            prop_assert!(wanted.contains(&Family::of(a)), "{}: {} not wanted", k, a);
            if let Request::Addresses(req) = &claim.request {
                prop_assert!(req.contains(&a), "{}: {} not requested", k, a);
            }
            let in_pool = alloc.pools().pool_of(a).is_some_and(|p| {
                let (f, n) = addr_key(a);
                p.admits(&claim.labels, &claim.namespace_labels).is_ok()
                    && !(p.avoid_buggy_ips && is_buggy(f, n))
            });
            prop_assert!(
                in_pool || o.flags.iter().any(|f| f.addr() == a),
                "{}: {} outside its pools and not flagged: {:?}",
                k,
                a,
                o
            );
            let holders = alloc.holders(a);
            prop_assert!(holders.contains(k));
            for h1 in holders {
                for h2 in holders {
                    if h1 < h2 {
                        let why = live[h1].sharing.refusal(&live[h2].sharing);
                        prop_assert!(
                            why.is_none(),
                            "{} and {} both hold {}: {:?}",
                            h1,
                            h2,
                            a,
                            why
                        );
                    }
                }
            }
        }
    }
    for k in live.keys() {
        prop_assert_eq!(
            set(alloc.addresses(k)),
            set(&last[k].addresses),
            "{} table and outcome differ",
            k
        );
    }
    Ok(())
}

fn rebuild(w: &World) -> (Allocator, Vec<Outcome>) {
    let claims: Vec<Claim> = w.live.values().map(|c| w.with_status(c)).collect();
    let mut fresh = Allocator::new(PoolSet::new(&w.pools));
    let out = fresh.rebuild(&claims);
    (fresh, out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn allocation_invariants_hold_through_any_sequence(
        pools in proptest::collection::vec(arb_pool(), 0..5),
        ops in proptest::collection::vec(arb_op(), 1..40),
    ) {
        let mut w = World::new(&pools);
        for op in &ops {
            w.step(op)?;
        }

        // A rebuild from the statuses as they are keeps every address.
        let (fresh, out) = rebuild(&w);
        let outcomes: BTreeMap<ClaimRef, Outcome> =
            out.into_iter().map(|o| (o.object.clone(), o)).collect();
        for k in w.live.keys() {
            let status = set(&w.status(k));
            prop_assert!(status.is_subset(&set(fresh.addresses(k))), "{} lost part of {:?}", k, status);
        }
        check_table(&fresh, &w.live, &outcomes)?;

        // Settled (every claim assigned again), a rebuild is the same table.
        w.reassess()?;
        let (fresh, out) = rebuild(&w);
        for o in &out {
            prop_assert_eq!(&o.addresses, &w.last[&o.object].addresses, "{}", o.object);
            prop_assert!(o.released.is_empty(), "{:?}", o);
        }
        prop_assert_eq!(fresh.snapshot_for_tests(), w.snapshot_sets());
    }
}

impl Allocator {
    fn snapshot_for_tests(&self) -> BTreeMap<ClaimRef, BTreeSet<IpAddr>> {
        self.assignments()
            .map(|(k, a)| (k.clone(), set(a)))
            .collect()
    }
}

impl World {
    fn snapshot_sets(&self) -> BTreeMap<ClaimRef, BTreeSet<IpAddr>> {
        self.alloc.snapshot_for_tests()
    }
}
