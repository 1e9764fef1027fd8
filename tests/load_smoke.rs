//! The objects load, every map is pinned by name, and the pins carry BTF:
//! `bpftool map dump pinned` prints field names, not hex. The flow tables
//! take their size at load, and pins of another size are refused.

mod common;

use std::process::Command;

use common::{TestDp, PROTO_TCP};
use libbpf_rs::MapCore;
use rivora::abi::*;
use rivora::dataplane::{Datapath, LoadOptions, Maps, FLOW_TABLES};

#[test]
fn programs_load_and_share_pinned_maps() {
    let t = TestDp::new();
    for name in Maps::NAMES {
        assert!(t.pin_dir.join(name).exists(), "{name} pinned");
    }
}

#[test]
fn bpftool_dumps_named_fields() {
    let t = TestDp::new();
    t.service(
        7,
        rv_mode::RV_MODE_NAT,
        rv_family::RV_FAMILY_V4,
        100,
        &[1, 2],
    );
    t.vip4("10.0.0.1".parse().unwrap(), 80, PROTO_TCP, 7);
    for (map, fields) in [
        (
            "service_config_map",
            &["\"mode\"", "\"slice_start\"", "\"slice_len\""][..],
        ),
        ("vip_map", &["\"addr\"", "\"port\"", "\"svc_id\""][..]),
    ] {
        let out = Command::new("bpftool")
            .args(["-j", "map", "dump", "pinned"])
            .arg(t.pin_dir.join(map))
            .output()
            .expect("bpftool runs (make test installs it)");
        assert!(
            out.status.success(),
            "bpftool: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for f in fields {
            assert!(text.contains(f), "{map} dump lacks {f}: {text}");
        }
    }
}

fn possible_cpus() -> u32 {
    libbpf_rs::num_possible_cpus().expect("possible CPUs") as u32
}

/// max_entries of each flow table as pinned, and the pinned map's id (a
/// map recreated behind the pin would have another).
fn flow_tables(maps: &Maps) -> Vec<(&'static str, u32, u32)> {
    [
        &maps.connection_affinity_map,
        &maps.connection_affinity_map6,
        &maps.nat_reverse_map,
        &maps.nat_reverse_map6,
    ]
    .into_iter()
    .map(|m| {
        let id = m.handle.info().expect("map info").info.id;
        (m.name, m.max_entries(), id)
    })
    .collect()
}

#[test]
fn flow_tables_default_size() {
    let t = TestDp::new();
    // The kernel rounds per-CPU LRU sizes up to a multiple of the CPUs.
    let want = FLOW_TABLE_DEFAULT_SIZE.next_multiple_of(possible_cpus());
    for (name, size, _) in flow_tables(&t.maps) {
        assert_eq!(size, want, "{name}");
    }
    assert_eq!(t.dp.flow_table_size(), want);
}

/// Loaded with a size of its own, all four flow tables (shared by
/// xdp_ingress and tc_nat) are pinned at it, and nothing else changes
/// size. A preflight or load over those pins with another size is
/// refused, naming the map, both sizes and the migration, and leaves the
/// pins alone: same maps, same size, entries kept.
#[test]
fn flow_table_size_is_set_at_load_and_checked_against_the_pins() {
    const SIZE: u32 = 65_536;
    let want = SIZE.next_multiple_of(possible_cpus());
    let t = TestDp::with_options(LoadOptions {
        flow_table_size: SIZE,
        ..Default::default()
    });
    let before = flow_tables(&t.maps);
    assert_eq!(
        before.iter().map(|f| f.0).collect::<Vec<_>>(),
        FLOW_TABLES,
        "the four flow tables"
    );
    for (name, size, _) in &before {
        assert_eq!(*size, want, "{name} sized at load");
    }
    // Both objects declare the flow tables and see the one size.
    let tc = &t.dp.tc().maps;
    for m in [
        &tc.connection_affinity_map,
        &tc.connection_affinity_map6,
        &tc.nat_reverse_map,
        &tc.nat_reverse_map6,
    ] {
        assert_eq!(m.max_entries(), want, "tc_nat's view");
    }
    assert_eq!(t.maps.maglev_table.max_entries(), MAGLEV_DEFAULT_SIZE);
    assert_eq!(
        t.maps.frag_map.max_entries(),
        16_384u32.next_multiple_of(possible_cpus()),
        "other LRU maps keep their size"
    );

    // One entry in each table, to find again after the refusals.
    let flow = rv_flow_key {
        svc_id: 7,
        saddr: be32("192.0.2.1".parse().unwrap()),
        sport: be16(40_000),
        dport: be16(80),
        proto: PROTO_TCP,
        ..Default::default()
    };
    let flow6 = rv_flow6_key {
        svc_id: 7,
        saddr: be32x4("2001:db8::1".parse().unwrap()),
        sport: be16(40_000),
        dport: be16(80),
        proto: PROTO_TCP,
        ..Default::default()
    };
    let aff = rv_affinity_value {
        backend_id: 3,
        last_seen_ns: 12_345,
        ..Default::default()
    };
    let nat = rv_nat_key {
        backend_addr: be32("10.1.0.2".parse().unwrap()),
        client_addr: be32("192.0.2.1".parse().unwrap()),
        backend_port: be16(8080),
        client_port: be16(40_000),
        proto: PROTO_TCP,
        ..Default::default()
    };
    let nat_v = rv_nat_value {
        vip_addr: be32("10.0.0.1".parse().unwrap()),
        vip_port: be16(80),
        svc_id: 7,
        ..Default::default()
    };
    let nat6 = rv_nat6_key {
        backend_addr: be32x4("fd00::2".parse().unwrap()),
        client_addr: be32x4("2001:db8::1".parse().unwrap()),
        backend_port: be16(8080),
        client_port: be16(40_000),
        proto: PROTO_TCP,
        ..Default::default()
    };
    let nat6_v = rv_nat6_value {
        vip_addr: be32x4("fd00::100".parse().unwrap()),
        vip_port: be16(80),
        svc_id: 7,
        ..Default::default()
    };
    t.maps.connection_affinity_map.put(&flow, &aff).unwrap();
    t.maps.connection_affinity_map6.put(&flow6, &aff).unwrap();
    t.maps.nat_reverse_map.put(&nat, &nat_v).unwrap();
    t.maps.nat_reverse_map6.put(&nat6, &nat6_v).unwrap();

    let other = LoadOptions {
        pin_dir: t.pin_dir.clone(),
        flow_table_size: FLOW_TABLE_DEFAULT_SIZE,
        ..Default::default()
    };
    let other_size = FLOW_TABLE_DEFAULT_SIZE.next_multiple_of(possible_cpus());
    let refusals = [
        ("preflight", Datapath::preflight(&other).err()),
        ("load", Datapath::load(&other).err()),
    ];
    for (what, err) in refusals {
        let e = err
            .unwrap_or_else(|| panic!("{what} with another size accepted"))
            .to_string();
        assert!(
            e.contains(&format!(
                "pinned map connection_affinity_map has max entries {want}, \
                 this binary expects {other_size}"
            )) && e.contains(&format!("-flow-table-size {want}"))
                && e.contains("rivorad -cleanup"),
            "{what}: the refusal names the map, both sizes and the migration: {e}"
        );
    }

    let maps = Maps::open(&t.pin_dir).expect("the pins are still there");
    assert_eq!(flow_tables(&maps), before, "same maps, same sizes");
    let got: Option<rv_affinity_value> = maps.connection_affinity_map.get(&flow).unwrap();
    assert_eq!(
        got.map(|v| (v.backend_id, v.last_seen_ns)),
        Some((3, 12_345))
    );
    let got: Option<rv_affinity_value> = maps.connection_affinity_map6.get(&flow6).unwrap();
    assert_eq!(got.map(|v| v.backend_id), Some(3));
    let got: Option<rv_nat_value> = maps.nat_reverse_map.get(&nat).unwrap();
    assert_eq!(
        got.map(|v| (v.vip_addr, v.svc_id)),
        Some((nat_v.vip_addr, 7))
    );
    let got: Option<rv_nat6_value> = maps.nat_reverse_map6.get(&nat6).unwrap();
    assert_eq!(
        got.map(|v| (v.vip_addr, v.svc_id)),
        Some((nat6_v.vip_addr, 7))
    );

    // Out of bounds is refused before anything else.
    let tiny = LoadOptions {
        flow_table_size: 1024,
        ..other
    };
    let e = Datapath::preflight(&tiny)
        .expect_err("1024 refused")
        .to_string();
    assert!(e.contains("1024") && e.contains("4096"), "{e}");
}
