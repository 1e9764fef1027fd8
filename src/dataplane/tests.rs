//! Writer tests without root: the writer over `MemStore`. The invariant
//! checked after every step is that the maps equal a from-scratch
//! rendering of what the writer says it holds, with no id or slot shared.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use proptest::prelude::*;

use crate::abi;
use crate::dataplane::alloc::Slice;
use crate::dataplane::dump::dump;
use crate::dataplane::render::{self, Health, MapImage};
use crate::dataplane::{DataplaneError, MapStore, MemStore, Probe, Upsert, Writer};
use crate::model::*;

const TABLE: u32 = abi::MAGLEV_DEFAULT_SIZE;

fn be(addr: &str, port: u16, weight: u32) -> Backend {
    Backend {
        addr: addr.parse().unwrap(),
        port,
        weight,
        mac: None,
    }
}

fn vip(addr: &str, ports: Ports, backends: Vec<Backend>) -> Vip {
    Vip {
        addr: addr.parse().unwrap(),
        ports,
        proto: Protocol::Tcp,
        mode: Mode::Nat,
        affinity: Affinity::None,
        rate_limit: None,
        backends,
    }
}

/// The maps equal the rendering of the writer's VIPs; slices, service
/// ids and backend ids are each used once.
/// Reclaims first: what a switch retired is cleared only after a grace
/// period.
fn check<S: MapStore>(w: &mut Writer<S>) -> MapImage {
    w.reclaim().unwrap();
    assert_eq!(w.pending_reclaim(), 0);
    let live = w.read_maps().unwrap();
    let want = render::render(&w.specs(), w.node(), &w.allocations(), &|t| {
        w.health(t).unwrap_or(Health::Healthy)
    });
    assert_eq!(
        live,
        want,
        "maps:\n{}\nrendered:\n{}",
        dump(&live),
        dump(&want)
    );
    let vips = w.vips();
    let mut slots = BTreeSet::new();
    let mut svcs = BTreeSet::new();
    for v in &vips {
        assert!(svcs.insert(v.svc_id), "service id {} shared", v.svc_id);
        for s in v.slice.start..v.slice.end() {
            assert!(slots.insert(s), "slot {s} in two slices");
        }
    }
    let used_slots: u32 = vips.iter().map(|v| v.slice.len).sum();
    assert_eq!(w.free_slots() + used_slots, w.store().table_size());
    let backend_ids: BTreeSet<u32> = vips.iter().flat_map(|v| v.backend_ids.clone()).collect();
    assert_eq!(
        w.free_backend_ids() as usize + backend_ids.len(),
        abi::MAX_BACKENDS as usize
    );
    assert_eq!(
        w.free_service_ids() as usize + vips.len(),
        abi::MAX_VIPS as usize
    );
    // Distinct backend identities never share an id.
    let mut seen = BTreeMap::new();
    for (id, b) in &live.backends {
        assert!(
            seen.insert((b.addr, b.port, b.mac), *id).is_none(),
            "identity with two ids"
        );
    }
    live
}

#[test]
fn create_update_remove() {
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    let mut v = vip(
        "10.0.0.1",
        Ports::One(80),
        vec![be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1)],
    );
    assert_eq!(w.upsert_vip(&v).unwrap(), Upsert::Created);
    check(&mut w);
    assert_eq!(w.upsert_vip(&v).unwrap(), Upsert::Unchanged);
    v.backends.push(be("10.1.0.3", 8080, 2));
    assert_eq!(w.upsert_vip(&v).unwrap(), Upsert::Updated);
    check(&mut w);
    v.backends.remove(0);
    v.rate_limit = Some(RateLimit {
        rate_per_sec: 100,
        burst: 10,
    });
    w.upsert_vip(&v).unwrap();
    let img = check(&mut w);
    assert_eq!(img.backends.len(), 2, "the dropped backend is cleared");
    assert!(w.remove_vip(&v.key()).unwrap());
    let img = check(&mut w);
    assert_eq!(img, MapImage::default());
    assert_eq!(w.free_slots(), TABLE);
}

#[test]
fn shared_backend_is_one_id_with_one_health() {
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    let a = vip("10.0.0.1", Ports::One(80), vec![be("10.1.0.1", 8080, 1)]);
    let b = vip("10.0.0.2", Ports::One(80), vec![be("10.1.0.1", 8080, 5)]);
    w.upsert_vip(&a).unwrap();
    w.upsert_vip(&b).unwrap();
    let ids: Vec<Vec<u32>> = w.vips().iter().map(|v| v.backend_ids.clone()).collect();
    assert_eq!(ids[0], ids[1]);
    let t = BackendTarget {
        addr: "10.1.0.1".parse().unwrap(),
        port: 8080,
    };
    assert_eq!(w.set_drain(&t, true).unwrap(), 1);
    assert_eq!(w.set_health(&t, Probe::Down).unwrap(), 1);
    assert_eq!(w.health(&t), Some(Health::Down));
    // Undraining does not hide the failed probe.
    w.set_drain(&t, false).unwrap();
    assert_eq!(w.health(&t), Some(Health::Down));
    w.set_health(&t, Probe::Up).unwrap();
    assert_eq!(w.health(&t), Some(Health::Healthy));
    check(&mut w);
    w.remove_vip(&a.key()).unwrap();
    assert_eq!(check(&mut w).backends.len(), 1, "still listed by b");
    w.remove_vip(&b.key()).unwrap();
    assert!(check(&mut w).backends.is_empty());
}

#[test]
fn golden_dump() {
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    let mut dsr = vip("10.0.0.2", Ports::One(443), vec![]);
    dsr.mode = Mode::Dsr;
    dsr.affinity = Affinity::ClientIp { timeout_s: 600 };
    dsr.backends = vec![Backend {
        mac: Some("02:00:00:00:00:01".parse().unwrap()),
        ..be("10.1.0.9", 0, 1)
    }];
    let mut range = vip(
        "fd00::10",
        Ports::Range {
            first: 1000,
            last: 1999,
        },
        vec![be("fd00:1::1", 0, 1), be("fd00:1::2", 0, 3)],
    );
    range.proto = Protocol::Udp;
    range.rate_limit = Some(RateLimit {
        rate_per_sec: 1000,
        burst: 50,
    });
    let desired = DesiredState {
        node: NodeSettings {
            syn_rate_limit: Some(RateLimit {
                rate_per_sec: 200,
                burst: 20,
            }),
            tunnel_src4: Some("192.0.2.1".parse().unwrap()),
            tunnel_src6: None,
            interface_macs: BTreeMap::from([(2, "02:00:00:00:00:ff".parse().unwrap())]),
        },
        vips: vec![
            vip(
                "10.0.0.1",
                Ports::One(80),
                vec![be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1)],
            ),
            dsr,
            range,
            vip("10.0.0.3", Ports::One(53), vec![]),
        ],
    };
    let r = w.reconcile(&desired).unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let img = check(&mut w);
    let got = dump(&img);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/dataplane/testdata/basic.dump"
    );
    if std::env::var_os("RIVORA_UPDATE_GOLDEN").is_some() {
        std::fs::write(path, &got).unwrap();
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
    assert_eq!(
        got, want,
        "golden dump differs (RIVORA_UPDATE_GOLDEN=1 rewrites it)"
    );
}

#[test]
fn invalid_state_is_rejected_whole() {
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    let good = vip("10.0.0.1", Ports::One(80), vec![be("10.1.0.1", 0, 1)]);
    let bad = vip("10.0.0.2", Ports::One(80), vec![be("fd00::1", 0, 1)]);
    let err = w
        .reconcile(&DesiredState {
            node: NodeSettings::default(),
            vips: vec![good, bad],
        })
        .unwrap_err();
    assert!(
        matches!(err, DataplaneError::Invalid(ModelError::Vip { .. })),
        "{err}"
    );
    assert_eq!(check(&mut w), MapImage::default(), "nothing written");
    let mut dsr = vip("10.0.0.3", Ports::One(80), vec![be("10.1.0.1", 0, 1)]);
    dsr.mode = Mode::Dsr;
    let err = w.upsert_vip(&dsr).unwrap_err();
    assert!(err.to_string().contains("backends[0].mac"), "{err}");
}

/// Fail every write of an update in turn: the maps always match what the
/// writer says it holds, and before the switch the old VIP is intact.
#[test]
fn failed_writes_leave_old_state_forwarding() {
    let old = vip(
        "10.0.0.1",
        Ports::One(80),
        vec![be("10.1.0.1", 0, 1), be("10.1.0.2", 0, 1)],
    );
    let mut new = old.clone();
    new.backends = vec![be("10.1.0.3", 0, 1), be("10.1.0.2", 0, 2)];
    new.rate_limit = Some(RateLimit {
        rate_per_sec: 5,
        burst: 5,
    });
    let fresh = vip(
        "10.0.0.9",
        Ports::Range {
            first: 10,
            last: 20,
        },
        vec![be("10.1.0.1", 0, 1)],
    );
    let mut saw_old = 0;
    for k in 0..40 {
        let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
        w.upsert_vip(&old).unwrap();
        w.store_mut().fail_at = Some(k);
        let r1 = w.upsert_vip(&new);
        w.store_mut().fail_at = None;
        check(&mut w);
        if r1.is_err() {
            let specs = w.specs();
            if specs == vec![old.clone()] {
                saw_old += 1;
            } else {
                assert_eq!(specs, vec![new.clone()], "old or new, never a mix");
            }
        }
        w.store_mut().fail_at = Some(k);
        let r2 = w.upsert_vip(&fresh);
        w.store_mut().fail_at = None;
        check(&mut w);
        if r2.is_err() {
            assert!(!w.specs().contains(&fresh));
        }
        // Whatever failed, the next attempt succeeds and nothing leaked.
        w.store_mut().fail_at = None;
        w.upsert_vip(&new).unwrap();
        w.upsert_vip(&fresh).unwrap();
        w.remove_vip(&new.key()).unwrap();
        w.remove_vip(&fresh.key()).unwrap();
        assert_eq!(check(&mut w), MapImage::default());
        assert_eq!(w.free_slots(), TABLE);
    }
    assert!(saw_old > 0, "some failures hit before the switch");
}

#[test]
fn capacity_errors_hit_one_vip_only() {
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    let mut vips = Vec::new();
    for i in 0..=abi::MAX_VIPS {
        let a = IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
        let b1 = IpAddr::from([10, 1, (i >> 8) as u8, i as u8]);
        let b2 = IpAddr::from([10, 2, (i >> 8) as u8, i as u8]);
        let mut v = vip(
            "10.0.0.1",
            Ports::One(80),
            vec![be("10.0.0.1", 0, 1), be("10.0.0.2", 0, 1)],
        );
        v.addr = a;
        v.backends[0].addr = b1;
        v.backends[1].addr = b2;
        vips.push(v);
    }
    let last = vips.pop().unwrap();
    let desired = DesiredState {
        node: NodeSettings::default(),
        vips: vips.clone(),
    };
    let r = w.reconcile(&desired).unwrap();
    assert!(r.failed.is_empty());
    assert_eq!(r.created, abi::MAX_VIPS as usize);
    let before = w.read_maps().unwrap();
    let err = w.upsert_vip(&last).unwrap_err();
    assert!(
        matches!(err, DataplaneError::ServiceIdsExhausted { .. }),
        "{err}"
    );
    assert_eq!(w.read_maps().unwrap(), before, "every other VIP as it was");
    // Backend ids: 8,190 used, one left; removing a VIP frees two more
    // (and a service id), so a VIP needing four new ones fails whole.
    w.remove_vip(&vips[0].key()).unwrap();
    w.reclaim().unwrap();
    let mut two_new = last.clone();
    two_new.backends = (1..=4).map(|i| be(&format!("10.9.0.{i}"), 0, 1)).collect();
    let before = w.read_maps().unwrap();
    let err = w.upsert_vip(&two_new).unwrap_err();
    assert!(
        matches!(err, DataplaneError::BackendIdsExhausted { .. }),
        "{err}"
    );
    assert_eq!(w.read_maps().unwrap(), before);
    check(&mut w);
}

#[test]
fn full_table_is_an_error_for_that_vip() {
    // 1,000 slots: six 160-slot slices fit, a seventh does not.
    let mut w = Writer::open(MemStore::new(1000)).unwrap();
    let backends: Vec<Backend> = (1..=5).map(|i| be(&format!("10.1.0.{i}"), 0, 1)).collect();
    for i in 1..=6 {
        w.upsert_vip(&vip(
            &format!("10.0.0.{i}"),
            Ports::One(80),
            backends.clone(),
        ))
        .unwrap();
    }
    let err = w
        .upsert_vip(&vip("10.0.0.7", Ports::One(80), backends.clone()))
        .unwrap_err();
    assert!(
        matches!(err, DataplaneError::MaglevTableFull { .. }),
        "{err}"
    );
    // Rebuilding one needs 160 free slots next to the live slice: there
    // are 40, so the update fails and the old slice keeps forwarding.
    let mut v1 = vip("10.0.0.1", Ports::One(80), backends.clone());
    v1.backends[0].weight = 3;
    assert!(w.upsert_vip(&v1).is_err());
    check(&mut w);
}

#[test]
fn a_grace_ticket_covers_what_was_retired_before_it_and_nothing_after() {
    let slice_of = |w: &Writer<MemStore>, v: &Vip| {
        w.vips()
            .iter()
            .find(|x| x.key == Some(v.key()))
            .map(|x| x.slice.len)
            .expect("the VIP is held")
    };
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    assert_eq!(
        w.grace_ticket(),
        None,
        "nothing retired, nothing to wait for"
    );
    let a = vip("10.0.0.1", Ports::One(80), vec![be("10.1.0.1", 0, 1)]);
    w.upsert_vip(&a).unwrap();
    w.finish().unwrap();

    // An update switches to a new slice; the old one stays reserved
    // until the ticket's grace period has ended.
    let mut a2 = a.clone();
    a2.backends.push(be("10.1.0.2", 0, 1));
    w.upsert_vip(&a2).unwrap();
    let len2 = slice_of(&w, &a2);
    let first = w.finish_deferred().expect("the old slice is retired");
    assert_eq!(
        w.grace_ticket(),
        None,
        "already covered by the first ticket"
    );

    // Retired after the ticket was given: not covered by it.
    let mut a3 = a2.clone();
    a3.backends.extend([
        be("10.1.0.3", 0, 1),
        be("10.1.0.4", 0, 1),
        be("10.1.0.5", 0, 1),
    ]);
    w.upsert_vip(&a3).unwrap();
    let len3 = slice_of(&w, &a3);
    w.reclaim_covered(first).unwrap();
    assert!(
        w.pending_reclaim() > 0,
        "the second switch's slice still waits"
    );
    assert_eq!(
        w.free_slots(),
        TABLE - len3 - len2,
        "the first old slice is free, the second still reserved"
    );
    let second = w.grace_ticket().expect("the second batch");
    assert!(second > first);
    w.reclaim_covered(second).unwrap();
    assert_eq!(w.pending_reclaim(), 0);
    assert_eq!(w.free_slots(), TABLE - len3);
    check(&mut w);
}

#[test]
fn fragmentation_is_handled_by_moving_slices() {
    // 12-slot slices fill a 100-slot table (8 of them), then every other
    // one goes: 48 slots free in 12-slot holes, a 160-slot... too big;
    // use a 5-backend VIP in a 400-slot table instead.
    let mut w = Writer::open(MemStore::new(400)).unwrap();
    let small = |i: u32| {
        vip(
            &format!("10.0.0.{i}"),
            Ports::One(80),
            vec![be("10.1.0.1", 0, 1)],
        )
    };
    for i in 1..=33 {
        w.upsert_vip(&small(i)).unwrap();
    }
    // 396 used; free every other one: 17 holes of 12 (and 4 at the end).
    for i in (1..=33).step_by(2) {
        w.remove_vip(&small(i).key()).unwrap();
    }
    w.reclaim().unwrap();
    assert!(w.largest_free_run() < 160 && w.free_slots() >= 160);
    let five: Vec<Backend> = (1..=5).map(|i| be(&format!("10.2.0.{i}"), 0, 1)).collect();
    w.upsert_vip(&vip("10.0.1.1", Ports::One(80), five))
        .unwrap();
    check(&mut w);
}

#[test]
fn restart_adopts_ids_and_writes_nothing() {
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    let mut desired = DesiredState::default();
    for i in 1..=5u8 {
        desired.vips.push(vip(
            &format!("10.0.0.{i}"),
            Ports::One(80),
            vec![
                be("10.1.0.1", 0, 1),
                be(&format!("10.1.1.{i}"), 0, i.into()),
                be("10.1.0.3", 0, 0),
            ],
        ));
    }
    desired.vips.push(vip(
        "10.0.0.9",
        Ports::Range {
            first: 5,
            last: 700,
        },
        vec![be("10.1.0.1", 0, 1)],
    ));
    w.reconcile(&desired).unwrap();
    let t = BackendTarget {
        addr: "10.1.0.1".parse().unwrap(),
        port: 0,
    };
    w.set_drain(&t, true).unwrap();
    let before = check(&mut w);
    let ids_before = w.vips();
    let store = w.store().clone();
    drop(w);

    let mut w = Writer::open(store).unwrap();
    assert!(w.vips().iter().all(|v| !v.claimed));
    assert_eq!(w.health(&t), Some(Health::Draining), "health adopted");
    let ops = w.store().ops;
    let r = w.reconcile(&desired).unwrap();
    assert_eq!(r.removed, 0);
    assert_eq!(w.store().ops, ops, "same desired state: no map writes");
    assert_eq!(check(&mut w), before);
    let ids_after = w.vips();
    assert_eq!(ids_before, ids_after, "ids and slices kept");

    // A new VIP after adoption gets fresh ids.
    let extra = vip("10.0.0.77", Ports::One(80), vec![be("10.1.9.9", 0, 1)]);
    w.upsert_vip(&extra).unwrap();
    check(&mut w);
}

#[test]
fn unclaimed_vips_pruned_only_on_request() {
    let mut w = Writer::open(MemStore::new(TABLE)).unwrap();
    let a = vip("10.0.0.1", Ports::One(80), vec![be("10.1.0.1", 0, 1)]);
    let b = vip(
        "10.0.0.2",
        Ports::One(80),
        vec![be("10.1.0.2", 0, 0), be("10.1.0.3", 0, 1)],
    );
    w.upsert_vip(&a).unwrap();
    w.upsert_vip(&b).unwrap();
    let store = w.store().clone();
    let mut w = Writer::open(store).unwrap();
    // Kubernetes: a reconciler names a; b stays forwarding until prune.
    w.upsert_vip(&a).unwrap();
    assert_eq!(w.read_maps().unwrap().matches.len(), 2);
    let pruned = w.prune_unclaimed().unwrap();
    assert_eq!(pruned, vec![Some(b.key())]);
    check(&mut w);
    // The weight-0 backend of b was an orphan: gone too.
    assert_eq!(w.read_maps().unwrap().backends.len(), 1);
}

// ---- property test ----

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        vip: usize,
        members: u8,
        weights: [u8; 8],
        rl: bool,
    },
    Remove(usize),
    Health(usize, bool),
    Drain(usize, bool),
    Restart,
}

fn pool(i: usize, v6: bool) -> IpAddr {
    if v6 {
        format!("fd00:1::{}", i + 1).parse().unwrap()
    } else {
        format!("10.1.0.{}", i + 1).parse().unwrap()
    }
}

/// Six VIP keys: v4 and v6, single ports and ranges.
fn vip_shape(i: usize) -> (IpAddr, Ports, bool) {
    let v6 = i % 2 == 1;
    let addr: IpAddr = if v6 {
        format!("fd00::{}", i + 1).parse().unwrap()
    } else {
        format!("10.0.0.{}", i + 1).parse().unwrap()
    };
    let ports = if i >= 4 {
        Ports::Range {
            first: 1000 + i as u16,
            last: 3000,
        }
    } else {
        Ports::One(80)
    };
    (addr, ports, v6)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..6usize, any::<u8>(), any::<[u8; 8]>(), any::<bool>())
            .prop_map(|(vip, members, weights, rl)| Op::Upsert { vip, members, weights, rl }),
        2 => (0..6usize).prop_map(Op::Remove),
        1 => (0..8usize, any::<bool>()).prop_map(|(b, up)| Op::Health(b, up)),
        1 => (0..8usize, any::<bool>()).prop_map(|(b, d)| Op::Drain(b, d)),
        1 => Just(Op::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_maps_equal_to_rendering(ops in proptest::collection::vec(op(), 1..25)) {
        // A small table so that compaction and full-table errors happen.
        let table = 700;
        let mut w = Writer::open(MemStore::new(table)).unwrap();
        let mut desired: BTreeMap<usize, Vip> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Upsert { vip: i, members, weights, rl } => {
                    let (addr, ports, v6) = vip_shape(i);
                    let backends: Vec<Backend> = (0..8)
                        .filter(|b| members & (1 << b) != 0)
                        .map(|b| Backend { addr: pool(b, v6), port: 0, weight: u32::from(weights[b] % 4), mac: None })
                        .collect();
                    let mut v = vip("10.0.0.1", ports, backends);
                    v.addr = addr;
                    if rl {
                        v.rate_limit = Some(RateLimit { rate_per_sec: 10, burst: 3 });
                    }
                    match w.upsert_vip(&v) {
                        Ok(_) => { desired.insert(i, v); }
                        Err(DataplaneError::MaglevTableFull { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Remove(i) => {
                    let (addr, ports, _) = vip_shape(i);
                    let key = VipKey { addr, ports, proto: Protocol::Tcp };
                    let existed = w.remove_vip(&key).unwrap();
                    prop_assert_eq!(existed, desired.remove(&i).is_some());
                }
                Op::Health(b, up) => {
                    for v6 in [false, true] {
                        let t = BackendTarget { addr: pool(b, v6), port: 0 };
                        w.set_health(&t, if up { Probe::Up } else { Probe::Down }).unwrap();
                    }
                }
                Op::Drain(b, d) => {
                    for v6 in [false, true] {
                        let t = BackendTarget { addr: pool(b, v6), port: 0 };
                        w.set_drain(&t, d).unwrap();
                    }
                }
                Op::Restart => {
                    let before: Vec<(Option<VipKey>, u32, Slice)> =
                        w.vips().iter().map(|v| (v.key, v.svc_id, v.slice)).collect();
                    let store = w.store().clone();
                    w = Writer::open(store).unwrap();
                    let state = DesiredState { node: NodeSettings::default(), vips: desired.values().cloned().collect() };
                    let r = w.reconcile(&state).unwrap();
                    prop_assert!(r.failed.is_empty(), "{:?}", r.failed);
                    let after: Vec<(Option<VipKey>, u32, Slice)> =
                        w.vips().iter().map(|v| (v.key, v.svc_id, v.slice)).collect();
                    prop_assert_eq!(before, after, "adoption keeps ids and slices");
                }
            }
            check(&mut w);
            let mut specs = w.specs();
            specs.sort_by_key(|v| v.key());
            let mut want: Vec<Vip> = desired.values().cloned().collect();
            want.sort_by_key(|v| v.key());
            prop_assert_eq!(specs, want);
        }
        for v in desired.values() {
            w.remove_vip(&v.key()).unwrap();
        }
        let img = check(&mut w);
        prop_assert_eq!(img, MapImage::default());
        prop_assert_eq!(w.free_slots(), table);
        prop_assert_eq!(w.free_backend_ids(), abi::MAX_BACKENDS);
        prop_assert_eq!(w.free_service_ids(), abi::MAX_VIPS);
    }
}
