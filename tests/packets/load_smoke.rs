//! The objects load, every map is pinned by name and both programs use the
//! pinned maps, and the pins carry BTF:
//! `bpftool map dump pinned` prints field names, not hex. The flow tables
//! take their size at load, and pins of another size are refused.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::process::Command;

use common::{TestDp, PROTO_TCP};
use libbpf_rs::skel::Skel;
use libbpf_rs::{MapCore, MapFlags, MapHandle, Program};
use rivora::abi::*;
use rivora::dataplane::maps::{bytes_of, from_bytes};
use rivora::dataplane::{Datapath, LoadOptions, Maps, FLOW_TABLES};

/// The id of the map pinned at `pin`.
fn pinned_id(pin: &Path) -> u32 {
    MapHandle::from_pinned_path(pin)
        .and_then(|m| m.info())
        .unwrap_or_else(|e| panic!("{}: {e}", pin.display()))
        .info
        .id
}

/// The ids of the maps a loaded program uses, as the verifier recorded
/// them: what the program's instructions really reach.
fn prog_map_ids(prog: &Program<'_>) -> BTreeSet<u32> {
    let fd = prog.as_fd().as_raw_fd();
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: a valid program fd, info buffer and length; no arrays asked
    // for, so the kernel fills only the counts.
    let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) };
    assert_eq!(rc, 0, "bpf_prog_get_info_by_fd");
    let mut ids = vec![0u32; info.nr_map_ids as usize];
    let mut again = libbpf_sys::bpf_prog_info {
        nr_map_ids: info.nr_map_ids,
        map_ids: ids.as_mut_ptr() as u64,
        ..Default::default()
    };
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: as above; `map_ids` points at `nr_map_ids` u32s that outlive
    // the call.
    let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut again, &mut len) };
    assert_eq!(rc, 0, "bpf_prog_get_info_by_fd (map ids)");
    assert_eq!(again.nr_map_ids, info.nr_map_ids, "map count changed");
    ids.into_iter().collect()
}

/// Every map is pinned by name, and both objects use the pinned maps
/// themselves, not copies: each object's map of a name is the pinned map
/// (same kernel id), every map either program really uses is a pinned one
/// or its own object's private data, the NAT reverse maps that xdp_ingress
/// writes and tc_nat reads are used by both programs, and an entry
/// written through one object's handle is there through the other's.
/// (A packet through both, sharing an entry, is
/// `packets_modes::nat_forward_and_tc_nat_reply`.)
#[test]
fn programs_load_and_share_pinned_maps() {
    let t = TestDp::new();
    let pinned: BTreeMap<u32, &str> = Maps::NAMES
        .iter()
        .map(|&name| {
            let pin = t.pin_dir.join(name);
            assert!(pin.exists(), "{name} pinned");
            (pinned_id(&pin), name)
        })
        .collect();
    assert_eq!(pinned.len(), Maps::NAMES.len(), "one map behind each pin");

    let objects = [
        (
            "xdp_ingress",
            t.dp.xdp().object(),
            &t.dp.xdp().progs.xdp_ingress,
        ),
        ("tc_nat", t.dp.tc().object(), &t.dp.tc().progs.tc_nat),
    ];
    let mut used = Vec::new();
    for (what, object, prog) in objects {
        let mut private = BTreeSet::new();
        let mut shared = 0;
        for m in object.maps() {
            let name = m.name().to_string_lossy().into_owned();
            let id = m.info().expect("map info").info.id;
            // .rodata and friends belong to the object alone, and so do
            // the per-CPU scratch maps, pinned by no one (rivorad's maps
            // are Maps::NAMES, each pinned).
            if name.contains('.') || !Maps::NAMES.contains(&name.as_str()) {
                private.insert(id);
                continue;
            }
            assert_eq!(
                pinned.get(&id),
                Some(&name.as_str()),
                "{what}'s {name} (map id {id}) is the map pinned as {name}"
            );
            shared += 1;
        }
        assert!(shared > 0, "{what} has pinned maps");
        let mut names = BTreeSet::new();
        for id in prog_map_ids(prog) {
            match pinned.get(&id) {
                Some(name) => {
                    names.insert(*name);
                }
                None => assert!(
                    private.contains(&id),
                    "{what} uses map id {id}, neither pinned nor its own"
                ),
            }
        }
        used.push(names);
    }
    let both: BTreeSet<&str> = used[0].intersection(&used[1]).copied().collect();
    for name in ["nat_reverse_map", "nat_reverse_map6"] {
        assert!(
            both.contains(name),
            "{name} used by both programs; xdp_ingress uses {:?}, tc_nat {:?}",
            used[0],
            used[1]
        );
    }

    // Written through xdp_ingress's handle, read through tc_nat's and the
    // pin; deleted through tc_nat's, gone for xdp_ingress.
    let key = rv_nat_key {
        backend_addr: be32("10.1.0.2".parse().unwrap()),
        client_addr: be32("192.0.2.1".parse().unwrap()),
        backend_port: be16(8080),
        client_port: be16(40_000),
        proto: PROTO_TCP,
        ..Default::default()
    };
    let value = rv_nat_value {
        vip_addr: be32("10.0.0.1".parse().unwrap()),
        vip_port: be16(80),
        svc_id: 7,
        ..Default::default()
    };
    let (xdp_map, tc_map) = (
        &t.dp.xdp().maps.nat_reverse_map,
        &t.dp.tc().maps.nat_reverse_map,
    );
    xdp_map
        .update(bytes_of(&key), bytes_of(&value), MapFlags::NO_EXIST)
        .expect("writing through xdp_ingress's map");
    let seen = tc_map
        .lookup(bytes_of(&key), MapFlags::ANY)
        .expect("reading through tc_nat's map")
        .and_then(|b| from_bytes::<rv_nat_value>(&b));
    assert_eq!(
        seen.map(|v| (v.vip_addr, v.vip_port, v.svc_id)),
        Some((value.vip_addr, value.vip_port, 7)),
        "tc_nat sees xdp_ingress's entry"
    );
    let pinned_value: Option<rv_nat_value> = t.maps.nat_reverse_map.get(&key).unwrap();
    assert_eq!(
        pinned_value.map(|v| v.svc_id),
        Some(7),
        "and so does the pin"
    );
    tc_map
        .delete(bytes_of(&key))
        .expect("deleting through tc_nat's map");
    assert_eq!(
        xdp_map.lookup(bytes_of(&key), MapFlags::ANY).unwrap(),
        None,
        "xdp_ingress sees tc_nat's delete"
    );
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
        &maps.fullnat_rev_map,
        &maps.fullnat_rev_map6,
    ]
    .into_iter()
    .map(|m| {
        let id = m.handle.info().expect("map info").info.id;
        (m.name, m.max_entries(), id)
    })
    .collect()
}

/// The size a flow table loaded with `size` has: the kernel rounds a
/// per-CPU LRU's up to a multiple of the CPUs; full NAT's port tables are
/// plain hashes (an entry is a port's allocation, never evicted), taken
/// as they are.
fn sized(name: &str, size: u32) -> u32 {
    if name.starts_with("fullnat_rev_map") {
        size
    } else {
        size.next_multiple_of(possible_cpus())
    }
}

#[test]
fn flow_tables_default_size() {
    let t = TestDp::new();
    for (name, size, _) in flow_tables(&t.maps) {
        assert_eq!(size, sized(name, FLOW_TABLE_DEFAULT_SIZE), "{name}");
    }
    assert_eq!(
        t.dp.flow_table_size(),
        FLOW_TABLE_DEFAULT_SIZE.next_multiple_of(possible_cpus())
    );
}

/// Loaded with a size of its own, all six flow tables (shared by
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
        "the six flow tables"
    );
    for (name, size, _) in &before {
        assert_eq!(*size, sized(name, SIZE), "{name} sized at load");
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
    let refusals = [
        ("preflight", Datapath::preflight(&other).err()),
        ("load", Datapath::load(&other).err()),
    ];
    for (what, err) in refusals {
        let e = err
            .unwrap_or_else(|| panic!("{what} with another size accepted"))
            .to_string();
        // The first flow table the loader meets (the object's order).
        let named = FLOW_TABLES
            .iter()
            .find(|m| e.contains(&format!("pinned map {m} has max entries ")))
            .unwrap_or_else(|| panic!("{what}: the refusal names no flow table: {e}"));
        assert!(
            e.contains(&format!(
                "pinned map {named} has max entries {}, this binary expects {}",
                sized(named, SIZE),
                sized(named, FLOW_TABLE_DEFAULT_SIZE)
            )) && e.contains(&format!("-flow-table-size {}", sized(named, SIZE)))
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
