//! Writer tests without root: the writer over `MemStore`. The invariant
//! checked after every step is that the maps equal a from-scratch
//! rendering of what the writer says it holds, with no id or slot shared.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
        mode: None,
        node: None,
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
        source_ranges: None,
        backends,
    }
}

/// What the maps hold with no VIP: an active VIP filter with no bits.
/// What a writer leaves in fresh maps before any VIP: the VIP filter
/// active and empty, full NAT's default ports and timeouts.
fn empty_image() -> MapImage {
    let mut img = MapImage {
        vip_filter: Some([0; crate::abi::VIP_FILTER_WORDS]),
        ..Default::default()
    };
    img.node.fullnat =
        render::FullNatConfig::new(&Default::default(), &std::collections::BTreeMap::new());
    img
}

/// The maps equal the rendering of the writer's VIPs; slices, service
/// ids and backend ids are each used once.
/// Reclaims first: what a switch retired is cleared only after a grace
/// period.
fn check<S: MapStore>(w: &mut Writer<S>) -> MapImage {
    w.reclaim().unwrap();
    assert_eq!(w.pending_reclaim(), 0);
    assert!(
        w.health_index_consistent(),
        "the health index names exactly the targets some backend id has"
    );
    let live = w.read_maps().unwrap();
    let want = render::render(
        &w.specs(),
        w.node(),
        w.fullnat_srcs(),
        &w.allocations(),
        &|t| w.health(t).unwrap_or(Health::Healthy),
        &|a| w.next_hop(a),
        &|a| w.fullnat_src_index(a),
    );
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
    // Distinct backend identities never share an id (a backend's own
    // mode is part of its identity: its entry says it).
    let mut seen = BTreeMap::new();
    for (id, b) in &live.backends {
        assert!(
            seen.insert((b.addr, b.port, b.mac, b.mode), *id).is_none(),
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
    assert_eq!(img, empty_image());
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
    // DSR across nodes: another node's endpoint by tunnel, this node's
    // own by NAT (a tunnel endpoint here).
    let mut across = vip(
        "10.0.0.4",
        Ports::One(80),
        vec![be("10.244.1.5", 8080, 1), be("10.244.2.7", 8080, 1)],
    );
    across.mode = Mode::L3Dsr;
    across.backends[0].mode = Some(Mode::Nat);
    across.backends[0].node = Some("node-1".into());
    across.backends[1].node = Some("node-2".into());
    let desired = DesiredState {
        node: NodeSettings {
            syn_rate_limit: Some(RateLimit {
                rate_per_sec: 200,
                burst: 20,
            }),
            tunnel_src4: Some("192.0.2.1".parse().unwrap()),
            tunnel_src6: None,
            interface_macs: BTreeMap::from([
                (2, "02:00:00:00:00:ff".parse().unwrap()),
                (3, "02:00:00:00:00:fe".parse().unwrap()),
            ]),
            generic_xdp: BTreeSet::from([3]),
            fullnat: Default::default(),
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
            across,
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
    assert_eq!(check(&mut w), empty_image(), "nothing written");
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
        assert_eq!(check(&mut w), empty_image());
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

/// A VIP that does not fit even at its smallest slice (with room kept to
/// rebuild the largest) is refused whole, before anything is written; a
/// VIP that fits can always be rebuilt.
#[test]
fn full_table_is_an_error_for_that_vip() {
    // 100 slots: seven VIPs of five backends at 12 slots each, and 12 to
    // rebuild one, fit; an eighth does not.
    let mut w = Writer::open(MemStore::new(100)).unwrap();
    let backends: Vec<Backend> = (1..=5).map(|i| be(&format!("10.1.0.{i}"), 0, 1)).collect();
    for i in 1..=7 {
        w.upsert_vip(&vip(
            &format!("10.0.0.{i}"),
            Ports::One(80),
            backends.clone(),
        ))
        .unwrap();
    }
    assert!(w.vips().iter().all(|v| v.slice.len == 12));
    let before = w.read_maps().unwrap();
    let err = w
        .upsert_vip(&vip("10.0.0.8", Ports::One(80), backends.clone()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            DataplaneError::MaglevNoRoom {
                needed: 108,
                size: 100,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(w.read_maps().unwrap(), before, "nothing written");
    // Rebuilding one needs 12 free slots next to the live slice: kept.
    let mut v1 = vip("10.0.0.1", Ports::One(80), backends.clone());
    v1.backends[0].weight = 3;
    assert_eq!(w.upsert_vip(&v1).unwrap(), Upsert::Updated);
    assert!(w.vips().iter().all(|v| v.reduced_precision()));
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
    let first = w.finish_deferred().0.expect("the old slice is retired");
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
    // 32 one-backend VIPs of 12 slots fill a 400-slot table (and 12 to
    // rebuild one), then every other one goes: 208 slots free, in holes
    // of 12 and one of 16. A VIP of five backends needs 96.
    let mut w = Writer::open(MemStore::new(400)).unwrap();
    let small = |i: u32| {
        vip(
            &format!("10.0.0.{i}"),
            Ports::One(80),
            vec![be("10.1.0.1", 0, 1)],
        )
    };
    for i in 1..=32 {
        w.upsert_vip(&small(i)).unwrap();
    }
    assert!(w.vips().iter().all(|v| v.slice.len == 12));
    for i in (1..=32).step_by(2) {
        w.remove_vip(&small(i).key()).unwrap();
    }
    w.reclaim().unwrap();
    assert!(
        w.vips().iter().all(|v| v.slice.len == 12),
        "no room to grow"
    );
    let five: Vec<Backend> = (1..=5).map(|i| be(&format!("10.2.0.{i}"), 0, 1)).collect();
    assert!(w.largest_free_run() < 96 && w.free_slots() >= 96);
    w.upsert_vip(&vip("10.0.1.1", Ports::One(80), five))
        .unwrap();
    assert_eq!(w.vips().last().map(|v| v.slice.len), Some(96));
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

/// Sizes follow the set of VIPs held: as a table fills, each new VIP
/// lowers the water level and bigger slices are rebuilt smaller (each an
/// atomic switch); past the point where the VIPs' needs fit, every VIP
/// runs with reduced precision, which `vips()` reports; as VIPs go, the
/// others grow back. At every step the sizes are the plan's for what is
/// held, the maps match the rendering, and nothing leaks.
#[test]
fn slices_shrink_as_the_table_fills_and_grow_back() {
    let table = 8192;
    let mut w = Writer::open(MemStore::new(table)).unwrap();
    let backends: Vec<Backend> = (1..=10).map(|i| be(&format!("10.1.0.{i}"), 0, 1)).collect();
    let need = crate::maglev::slice_need(&[1; 10]);
    assert_eq!((need.need, need.want), (192, 3072));
    let v = |i: usize| {
        vip(
            &format!("10.0.{}.{}", i / 256, i % 256),
            Ports::One(80),
            backends.clone(),
        )
    };
    let planned = |n: usize| crate::maglev::plan(&vec![need; n], table).unwrap()[0];
    let mut seen = Vec::new();
    for n in 1..=45 {
        w.upsert_vip(&v(n)).unwrap();
        let lens: BTreeSet<u32> = w.vips().iter().map(|x| x.slice.len).collect();
        assert_eq!(lens, BTreeSet::from([planned(n)]), "{n} VIPs");
        let reduced = w.vips().iter().filter(|x| x.reduced_precision()).count();
        assert_eq!(reduced, if planned(n) < 192 { n } else { 0 }, "{n} VIPs");
        if seen.last() != Some(&planned(n)) {
            seen.push(planned(n));
            check(&mut w);
        }
    }
    assert_eq!(
        seen,
        vec![3072, 1536, 768, 384, 192, 96],
        "the level came down"
    );
    for n in (1..=44).rev() {
        w.remove_vip(&v(n + 1).key()).unwrap();
        let lens: BTreeSet<u32> = w.vips().iter().map(|x| x.slice.len).collect();
        assert_eq!(lens, BTreeSet::from([planned(n)]), "{n} VIPs left");
    }
    assert_eq!(w.vips()[0].slice.len, 3072, "alone again: its wanted size");
    check(&mut w);
    w.remove_vip(&v(1).key()).unwrap();
    assert_eq!(check(&mut w), empty_image());
    assert_eq!(w.free_slots(), table);
}

/// One reconcile, VIP-by-VIP upserts in another order, and the
/// validator's plan for the same VIPs agree on every slice's length and
/// contents: every node holding the same VIPs builds the same slices.
#[test]
fn batch_and_single_upserts_agree_with_the_validator() {
    let table = 20_000;
    let mut vips = Vec::new();
    for i in 0..12u8 {
        let n = 1 + (i as usize * 7) % 40;
        let backends = (0..n)
            .map(|k| {
                be(
                    &format!("10.{}.0.{}", 1 + i, k + 1),
                    0,
                    1 + (k as u32 * i as u32) % 5,
                )
            })
            .collect();
        vips.push(vip(&format!("10.0.0.{}", i + 1), Ports::One(80), backends));
    }
    let desired = DesiredState {
        node: NodeSettings::default(),
        vips: vips.clone(),
    };
    let plan = desired
        .maglev_sizes(&Capacity {
            maglev_size: table,
            ..Capacity::default()
        })
        .expect("fits");
    let slices = |w: &Writer<MemStore>| {
        let img = w.read_maps().unwrap();
        let mut out = BTreeMap::new();
        for v in w.vips() {
            let svc = img.services[&v.svc_id];
            let names: Vec<IpAddr> = img
                .slice_of(&svc)
                .iter()
                .map(|id| img.backends[id].addr)
                .collect();
            out.insert(v.key.unwrap(), names);
        }
        out
    };
    let mut batch = Writer::open(MemStore::new(table)).unwrap();
    let r = batch.reconcile(&desired).unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    check(&mut batch);
    let mut single = Writer::open(MemStore::new(table)).unwrap();
    for v in vips.iter().rev() {
        single.upsert_vip(v).unwrap();
    }
    single.finish().unwrap();
    check(&mut single);
    let a = slices(&batch);
    assert_eq!(a, slices(&single));
    for (v, p) in vips.iter().zip(&plan) {
        assert_eq!(a[&v.key()].len() as u32, p.len, "{}", v.key());
    }
    assert!(
        plan.iter().any(|p| p.len < p.need.want),
        "the table was short"
    );
}

/// A store that, after every map write, checks what a packet would find:
/// each VIP match names an active service whose whole slice names
/// backends that exist. Records the first write after which it did not.
struct GapCheck {
    inner: MemStore,
    gap: Option<String>,
    /// Backend writes (id, next-hop flags, destination MAC's last byte)
    /// and grace periods, in order.
    log: Vec<String>,
}

impl GapCheck {
    fn after(&mut self, r: Result<(), DataplaneError>, what: &str) -> Result<(), DataplaneError> {
        let img = self.inner.read().expect("read");
        for (m, svc) in &img.matches {
            let Some(s) = img.services.get(svc).filter(|s| s.is_active()) else {
                self.gap
                    .get_or_insert(format!("after {what}: {m:?} names no service"));
                continue;
            };
            let slots = img.slice_of(s);
            if slots.is_empty() || slots.iter().any(|id| !img.backends.contains_key(id)) {
                self.gap.get_or_insert(format!(
                    "after {what}: {m:?}'s slice {}+{} is not whole",
                    s.slice_start, s.slice_len
                ));
            }
        }
        // A tunnelled packet is forced to the backend its entry names.
        for ((svc, addr), id) in &img.tunnel_eps {
            if !img.backends.contains_key(id) {
                self.gap.get_or_insert(format!(
                    "after {what}: tunnel_ep svc {svc} {addr} names backend {id}, which has no entry"
                ));
            }
        }
        r
    }
}

impl MapStore for GapCheck {
    fn table_size(&self) -> u32 {
        self.inner.table_size()
    }
    fn put_backends(&mut self, e: &[(u32, render::BackendEntry)]) -> Result<(), DataplaneError> {
        for (id, b) in e {
            self.log.push(format!(
                "backend {id} flags {} dmac {}",
                b.nexthop.flags, b.nexthop.dmac[5]
            ));
        }
        let r = self.inner.put_backends(e);
        self.after(r, "put_backends")
    }
    fn clear_backends(&mut self, ids: &[u32]) -> Result<(), DataplaneError> {
        let r = self.inner.clear_backends(ids);
        self.after(r, "clear_backends")
    }
    fn put_health(&mut self, e: &[(u32, Health)]) -> Result<(), DataplaneError> {
        let r = self.inner.put_health(e);
        self.after(r, "put_health")
    }
    fn put_slots(&mut self, start: u32, ids: &[u32]) -> Result<(), DataplaneError> {
        let r = self.inner.put_slots(start, ids);
        self.after(r, "put_slots")
    }
    fn put_service(&mut self, svc: u32, e: &render::ServiceEntry) -> Result<(), DataplaneError> {
        let r = self.inner.put_service(svc, e);
        self.after(r, "put_service")
    }
    fn put_svc_rate_limit(
        &mut self,
        svc: u32,
        rl: Option<RateLimit>,
    ) -> Result<(), DataplaneError> {
        let r = self.inner.put_svc_rate_limit(svc, rl);
        self.after(r, "put_svc_rate_limit")
    }
    fn put_match(&mut self, m: &render::MatchKey, svc: u32) -> Result<(), DataplaneError> {
        let r = self.inner.put_match(m, svc);
        self.after(r, "put_match")
    }
    fn remove_match(&mut self, m: &render::MatchKey) -> Result<(), DataplaneError> {
        let r = self.inner.remove_match(m);
        self.after(r, "remove_match")
    }
    fn zero_stats(&mut self, svc: u32) -> Result<(), DataplaneError> {
        self.inner.zero_stats(svc)
    }
    fn scrub_flows(&mut self, svcs: &BTreeSet<u32>) -> Result<(), DataplaneError> {
        self.inner.scrub_flows(svcs)
    }
    fn put_nat_owner(
        &mut self,
        k: &render::NatOwnerKey,
        o: Option<&render::NatOwner>,
    ) -> Result<(), DataplaneError> {
        self.inner.put_nat_owner(k, o)
    }
    fn put_tunnel_ep(
        &mut self,
        svc: u32,
        addr: std::net::IpAddr,
        backend: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let r = self.inner.put_tunnel_ep(svc, addr, backend);
        self.after(r, "put_tunnel_ep")
    }
    fn put_source_range(
        &mut self,
        svc: u32,
        r: &crate::source_range::SourceRange,
        on: bool,
    ) -> Result<(), DataplaneError> {
        let res = self.inner.put_source_range(svc, r, on);
        self.after(res, "put_source_range")
    }
    fn put_vip_filter(
        &mut self,
        bits: &[u64; crate::abi::VIP_FILTER_WORDS],
    ) -> Result<(), DataplaneError> {
        self.inner.put_vip_filter(bits)
    }
    fn put_node(
        &mut self,
        n: &render::NodeImage,
        p: &render::NodeImage,
    ) -> Result<(), DataplaneError> {
        self.inner.put_node(n, p)
    }
    fn read(&self) -> Result<MapImage, DataplaneError> {
        self.inner.read()
    }
    fn synchronize(&mut self) -> Result<(), DataplaneError> {
        self.log.push("grace period".into());
        self.inner.synchronize()
    }
    fn grace_period() -> Result<(), DataplaneError> {
        MemStore::grace_period()
    }
}

/// The slice length the writer before issue 20 gave a VIP of `n`
/// backends: 12 up to four, else 20 per backend with `n` rounded up to a
/// power of two, at most 32,768.
pub fn old_slice_size(n: usize) -> u32 {
    match n {
        0 => 1,
        1..=4 => 12,
        _ => (20 * n.next_power_of_two() as u32).min(32_768),
    }
}

/// Write `vips` as the writer before issue 20 did: slices of the old size
/// rule, filled by the paper's population, one after the other.
pub fn write_old_rule<S: MapStore>(store: &mut S, vips: &[Vip]) {
    let mut ids: BTreeMap<BackendKey, u32> = BTreeMap::new();
    let mut start = 0u32;
    for (i, v) in vips.iter().enumerate() {
        let svc = i as u32 + 1;
        let mut mine = Vec::new();
        for b in &v.backends {
            let next = ids.len() as u32 + 1;
            let id = *ids.entry(b.key()).or_insert(next);
            mine.push(id);
            store
                .put_backends(&[(id, render::backend_entry(b, Default::default(), 0))])
                .unwrap();
            store.put_health(&[(id, Health::Healthy)]).unwrap();
        }
        let identities: Vec<Vec<u8>> = v.backends.iter().map(|b| b.key().identity()).collect();
        let entries: Vec<crate::maglev::Entry<'_>> = v
            .backends
            .iter()
            .zip(&identities)
            .zip(&mine)
            .map(|((b, ident), id)| crate::maglev::Entry {
                identity: ident,
                weight: b.weight,
                id: *id,
            })
            .collect();
        let len = old_slice_size(v.backends.len());
        store
            .put_slots(start, &crate::maglev::populate_paper(&entries, len))
            .unwrap();
        store
            .put_service(svc, &render::service_entry(v, start, len))
            .unwrap();
        for m in render::match_keys(&v.key()) {
            store.put_match(&m, svc).unwrap();
        }
        start += len;
    }
}

/// Maps written by the writer before issue 20 (old slice sizes, the
/// paper's population) are adopted and converge to the new rule: every
/// VIP's slice is rebuilt and switched, and after every single map write
/// each VIP still leads to a whole slice of live backends (no gap).
#[test]
fn adopting_old_rule_maps_converges_without_a_gap() {
    let vips: Vec<Vip> = (0..6u8)
        .map(|i| {
            let n = [2usize, 3, 5, 9, 1, 30][i as usize];
            vip(
                &format!("10.0.0.{}", i + 1),
                Ports::One(80),
                (0..n)
                    .map(|k| be(&format!("10.{}.0.{}", 1 + i, k + 1), 0, 1 + k as u32 % 3))
                    .collect(),
            )
        })
        .collect();
    let mut store = GapCheck {
        log: Vec::new(),
        inner: MemStore::new(TABLE),
        gap: None,
    };
    write_old_rule(&mut store, &vips);
    assert_eq!(store.gap, None, "the old image is whole");
    let old = store.read().unwrap();
    let mut w = Writer::open(store).unwrap();
    let desired = DesiredState {
        node: NodeSettings::default(),
        vips: vips.clone(),
    };
    let r = w.reconcile(&desired).unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(r.updated, vips.len(), "every slice rebuilt");
    assert_eq!(w.store().gap, None);
    let plan = desired.maglev_sizes(&Capacity::default()).unwrap();
    for (v, p) in w.vips().iter().zip(&plan) {
        assert_eq!(v.slice.len, p.len);
    }
    w.reclaim().unwrap();
    let img = w.read_maps().unwrap();
    assert_eq!(img.backends, old.backends, "backend ids kept");
    let want = render::render(
        &w.specs(),
        w.node(),
        w.fullnat_srcs(),
        &w.allocations(),
        &|t| w.health(t).unwrap_or(Health::Healthy),
        &|a| w.next_hop(a),
        &|a| w.fullnat_src_index(a),
    );
    assert_eq!(img, want);
}

// ---- property test ----

#[derive(Debug, Clone)]
enum Op {
    Upsert {
        vip: usize,
        members: u8,
        weights: [u8; 8],
        rl: bool,
        /// Backends placed on a node (bit per backend), and whether the
        /// VIP is L3 DSR (those then reached by NAT: DSR across nodes as
        /// Kubernetes writes it) or NAT: tunnel endpoints either way.
        on_node: u8,
        l3dsr: bool,
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
        4 => (0..6usize, any::<u8>(), any::<[u8; 8]>(), any::<bool>(), any::<u8>(), any::<bool>())
            .prop_map(|(vip, members, weights, rl, on_node, l3dsr)| Op::Upsert { vip, members, weights, rl, on_node, l3dsr }),
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
        let opened = w.node().clone();
        let mut node = opened.clone();
        node.tunnel_src4 = Some("192.0.2.1".parse().unwrap());
        node.tunnel_src6 = Some("2001:db8::1".parse().unwrap());
        w.set_node(&node).unwrap();
        let mut desired: BTreeMap<usize, Vip> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Upsert { vip: i, members, weights, rl, on_node, l3dsr } => {
                    let (addr, ports, v6) = vip_shape(i);
                    let backends: Vec<Backend> = (0..8)
                        .filter(|b| members & (1 << b) != 0)
                        .map(|b| {
                            let here = on_node & (1 << b) != 0;
                            Backend {
                                addr: pool(b, v6),
                                port: 0,
                                weight: u32::from(weights[b] % 4),
                                mac: None,
                                mode: (here && l3dsr).then_some(Mode::Nat),
                                node: here.then(|| "node-1".to_string()),
                            }
                        })
                        .collect();
                    let mut v = vip("10.0.0.1", ports, backends);
                    v.addr = addr;
                    if l3dsr {
                        v.mode = Mode::L3Dsr;
                    }
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
                    let state = DesiredState { node: node.clone(), vips: desired.values().cloned().collect() };
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
        w.set_node(&opened).unwrap();
        let img = check(&mut w);
        prop_assert_eq!(img, empty_image());
        prop_assert_eq!(w.free_slots(), table);
        prop_assert_eq!(w.free_backend_ids(), abi::MAX_BACKENDS);
        prop_assert_eq!(w.free_service_ids(), abi::MAX_VIPS);
    }
}

/// A usable next hop that changes is marked STALE first and rewritten
/// after a grace period, so no program run mixes the old and the new
/// (docs/datapath.md "The next-hop cache"); turning STALE, or a first next hop,
/// is one write.
#[test]
fn changed_next_hops_go_stale_for_a_grace_period_first() {
    use crate::dataplane::render::NextHop;
    let mut w = Writer::open(GapCheck {
        log: Vec::new(),
        inner: MemStore::new(TABLE),
        gap: None,
    })
    .unwrap();
    let v = vip("10.0.0.1", Ports::One(80), vec![be("10.1.0.1", 8080, 1)]);
    w.upsert_vip(&v).unwrap();
    let id = w
        .read_maps()
        .unwrap()
        .backends
        .keys()
        .copied()
        .next()
        .unwrap();
    let addr: IpAddr = "10.1.0.1".parse().unwrap();
    let hop = |mac: u8| NextHop::send(7, 1500, [2, 0, 0, 0, 0, mac], [2, 0, 0, 0, 1, 1]);
    let (valid, stale) = (NextHop::VALID, NextHop::VALID | NextHop::STALE);
    let step = |w: &mut Writer<GapCheck>, nh: NextHop| -> Vec<String> {
        w.store_mut().log.clear();
        w.set_next_hops(HashMap::from([(addr, nh)])).unwrap();
        assert_eq!(w.read_maps().unwrap().backends[&id].nexthop, nh);
        std::mem::take(&mut w.store_mut().log)
    };
    assert_eq!(
        step(&mut w, hop(1)),
        [format!("backend {id} flags {valid} dmac 1")]
    );
    assert_eq!(
        step(&mut w, hop(2)),
        [
            format!("backend {id} flags {stale} dmac 1"),
            "grace period".to_string(),
            format!("backend {id} flags {valid} dmac 2"),
        ]
    );
    assert_eq!(
        step(&mut w, hop(2).stale()),
        [format!("backend {id} flags {stale} dmac 2")]
    );
    // From STALE nothing reads the old next hop: one write.
    assert_eq!(
        step(&mut w, hop(3)),
        [format!("backend {id} flags {valid} dmac 3")]
    );
    assert!(w.store().gap.is_none(), "{:?}", w.store().gap);
}
