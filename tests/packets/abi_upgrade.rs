//! Pinned maps of layouts 2 and 3 upgraded in place to this build's
//! layout (src/dataplane/loader.rs: `UPGRADABLE_ABI_VERSIONS`,
//! `ADDED_IN_V3`, `REPLACED_IN_V3`, `ADDED_IN_V4`), through the calls rivorad's start makes
//! (`Daemon::start`: the layout version read first; then the load, the
//! writer's adoption of the maps, and the file's VIPs upserted).
//!
//! The layout 2 set is built as a layout 2 rivorad left it
//! (`common::layouts::V2`, written down from the commit that last had it):
//! its 30 maps at their sizes, none of the maps layout 3 added,
//! drop_stats_map at layout 2's 14 entries (holding counts), meta_map
//! saying 2. Its entries are what the real writer and the real
//! xdp_ingress wrote: node settings (SYN limits, L3 DSR sources, an
//! interface MAC), four NAT VIPs (IPv4 and IPv6; two own their backends,
//! two share them, so both of NAT's reply records are there: affinity
//! entries and nat_reverse_map{,6}) and nine flows each; then a weight
//! change took each VIP's first flow's backend out of the Maglev table,
//! so those flows stay on it by their affinity entries alone. Nothing in
//! it is a byte layout 2 could not have written (`assert_v2_entries`).
//!
//! What layout 3 is comes from the code, never from this file: the maps
//! the loaded objects pin, `ADDED_IN_V3` and `REPLACED_IN_V3`.
//!
//! - `v2_set_upgrades_in_place_and_flows_stay`: after the load, meta_map
//!   says this build's version and keeps the Maglev size; the pins are
//!   exactly the loaded objects' pinned maps, which are layout 2's plus
//!   `ADDED_IN_V3`, and both objects use the pins; the replaced maps are
//!   new maps of the objects' definition, counting from zero; every other
//!   map is the same kernel map with every entry byte for byte, also
//!   after the writer adopted the maps and the same VIPs were upserted
//!   (none created anew, same service and backend ids). Only per-CPU
//!   counter maps may be in `REPLACED_IN_V3`. Then each established flow
//!   still goes to its old backend (every byte of the translated frame,
//!   through BPF_PROG_TEST_RUN), its reply is translated back by tc_nat,
//!   and a new flow goes where the Maglev table says.
//! - `v3_set_gains_the_source_range_maps_and_flows_stay`: a set of this
//!   build's with the maps layout 4 added unpinned and meta_map saying 3
//!   (what a layout 3 rivorad left) is upgraded by the load: the added
//!   maps pinned empty, every other map the same kernel map with the same
//!   entries, an established flow still on its backend, and a VIP written
//!   with source ranges after the upgrade enforces them.
//! - `other_layouts_are_refused_and_left_whole`: a layout 1 set, and a
//!   layout 2 set whose meta_map says a version this build does not know,
//!   are refused by the preflight, the load and rivorad's sequence with
//!   an error naming both versions and the migration, and every pin is
//!   left as it was (same maps, same entries, nothing added).
//! - `a_v2_set_the_upgrade_cannot_take_is_left_whole`: a layout 2 set
//!   pinned with another flow table size, or missing a map, is refused
//!   before the upgrade unpins anything (the replaced map is still layout
//!   2's, nothing was added, meta_map still says 2).
//! - `an_interrupted_upgrade_completes_on_the_next_load`: the states a
//!   crash can leave between unpinning the replaced maps and rewriting
//!   meta_map (replaced maps gone; replaced maps and part of the added
//!   ones created; every map created) are each finished by the next load,
//!   with the same checks as the first test.
//!
//! Needs root and bpffs. Each test pins under a directory of its own,
//! removed on drop, and runs its packets in a network namespace of its
//! own (there the FIB has no route, so a NAT'd request is handed to the
//! kernel with only the NAT rewrite done: XDP_PASS).

use crate::common;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use common::fixture::{backend, vip, with_rate_limit, Fx};
use common::fixtures::*;
use common::layouts::{
    self, create_pinned, create_set, pinned_def, read_meta, snapshot, Def, PinDir, Pinned, Sizes,
    V2, V2_DROP_MAX,
};
use common::netns::{InNetns, Netns};
use common::*;
use libbpf_rs::skel::Skel;
use libbpf_rs::{MapCore, MapFlags, MapType};
use rivora::abi::*;
use rivora::dataplane::loader::{
    pinned_abi_version, upgradable, ADDED_IN_V3, ADDED_IN_V4, REPLACED_IN_V3,
};
use rivora::dataplane::maps::{bytes_of, from_bytes};
use rivora::dataplane::{
    Datapath, DataplaneError, LoadOptions, Maps, Upsert, Writer, FLOW_TABLE_MIN_SIZE,
};
use rivora::model::{Mac, Mode, RateLimit, Vip};

const CLIENT4: &str = "10.250.0.10";
const CLIENT6: &str = "fd00:fa::10";
const VIP_PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;

/// Small flow tables (the floor): the sets here hold a few dozen flows.
const SIZES: Sizes = Sizes {
    flow_table: FLOW_TABLE_MIN_SIZE,
    maglev: MAGLEV_DEFAULT_SIZE,
};

fn opts(dir: &Path) -> LoadOptions {
    LoadOptions {
        pin_dir: dir.to_path_buf(),
        maglev_size: SIZES.maglev,
        flow_table_size: SIZES.flow_table,
    }
}

/// The NAT VIPs of the layout 2 set: the first two own their backends
/// (their flows' affinity entries are what tc_nat translates replies
/// by), the last two share them (their flows write nat_reverse_map{,6}).
fn vips() -> Vec<Vip> {
    let nat = |addr: &str, backends: [&str; 2]| {
        vip(
            ip(addr),
            VIP_PORT,
            PROTO_TCP,
            Mode::Nat,
            backends
                .iter()
                .enumerate()
                .map(|(i, b)| backend(ip(b), BACKEND_PORT, be_mac(i as u32 + 1)))
                .collect(),
        )
    };
    vec![
        nat("10.0.0.100", ["10.1.0.1", "10.1.0.2"]),
        nat("fd00::100", ["fd00:1::1", "fd00:1::2"]),
        nat("10.0.0.101", ["10.1.0.1", "10.1.0.2"]),
        nat("fd00::101", ["fd00:1::1", "fd00:1::2"]),
    ]
}

fn request(vip: &Vip, sport: u16) -> Frame {
    match vip.addr {
        IpAddr::V4(a) => Frame::tcp4(CLIENT4, sport, &a.to_string(), VIP_PORT),
        IpAddr::V6(a) => Frame::tcp6(CLIENT6, sport, &a.to_string(), VIP_PORT),
    }
}

/// A flow established before the upgrade on a backend the Maglev table
/// no longer picks for it.
struct Established {
    desc: String,
    vip: Vip,
    svc: u32,
    /// An established segment of the flow.
    frame: Frame,
    /// Where its affinity entry sends it.
    old: Be,
}

/// A layout 2 set with its live state, and what the test needs to know
/// of it.
struct V2Set {
    dir: PinDir,
    /// The VIPs as last written (the file's VIPs a restart upserts).
    vips: Vec<Vip>,
    /// Per VIP: (service id, backend ids), as the writer placed them.
    placed: Vec<(u32, Vec<u32>)>,
    flows: Vec<Established>,
    /// The definition this build pins each map with, by name.
    v3_defs: BTreeMap<String, Def>,
}

/// A NAT'd request through xdp_ingress must come out for `be`, byte for
/// byte, with no drop counted.
fn assert_forwarded(t: &TestDp, desc: &str, f: &Frame, be: &Be) {
    run_case(
        t,
        &Case {
            desc: desc.to_string(),
            input: f.build(),
            want: nat_of(f, be).build(),
            verdict: XDP_PASS,
            drop: None,
        },
    );
}

/// The backend's reply to `f` must leave tc_nat from the VIP.
fn assert_reply_translated(t: &TestDp, desc: &str, f: &Frame, be: &Be) {
    let reply = nat_of(f, be).reply();
    let (v, out) = t.run_tc(&reply.build());
    assert_eq!(v, TCX_PASS, "{desc}: reply verdict");
    assert_bytes(
        &format!("{desc}, reply"),
        &out,
        &reply.from(f.dst_ip(), f.dport()).build(),
    );
    assert_checksums(&out);
}

fn be_of(fx: &Fx, id: u32) -> Be {
    let (addr, port) = fx
        .backend_entry(id)
        .unwrap_or_else(|| panic!("backend {id} in the maps"));
    Be {
        id,
        addr,
        port,
        mac: [0; 6],
    }
}

/// Build the layout 2 set: the state written into a set this build
/// loaded (the real writer, the real xdp_ingress), then copied into
/// layout 2's maps. The calling thread must be in a namespace of its own
/// (the FIB lookups).
///
/// Nine flows per VIP, each a SYN then an established segment. Then the
/// table changes under them: the backend of each VIP's first flow goes to
/// weight 0 (out of the slice, its id and health kept, as a weight change
/// leaves it), so the Maglev table sends every flow to the other one and
/// only the affinity entries keep the first flow, and any other on that
/// backend, where it was.
fn v2_set() -> V2Set {
    // Its own pin directory (TestDp's), removed when it goes.
    let scratch = Fx::with_options(LoadOptions {
        maglev_size: SIZES.maglev,
        flow_table_size: SIZES.flow_table,
        ..Default::default()
    });
    let t = &scratch.t;
    // The node's settings as a layout 2 file could give them (node-wide
    // SYN limit, L3 DSR sources, an interface's MAC); the limits loose
    // enough for every packet here.
    scratch.edit_node(|n| {
        n.syn_rate_limit = Some(RateLimit {
            rate_per_sec: 100_000,
            burst: 1_000,
        });
        n.tunnel_src4 = Some("192.0.2.1".parse().unwrap());
        n.tunnel_src6 = Some("2001:db8::1".parse().unwrap());
        n.interface_macs.insert(7, Mac([0x02, 0x1b, 0, 0, 0, 7]));
    });
    let mut vips = vips();
    vips[0] = with_rate_limit(vips[0].clone(), 100_000, 1_000);
    let placed: Vec<(u32, Vec<u32>)> = vips
        .iter()
        .map(|v| {
            let p = scratch.apply(v);
            (p.svc, p.ids)
        })
        .collect();

    let mut flows = Vec::new();
    for (i, (v, (svc, ids))) in vips.iter_mut().zip(&placed).enumerate() {
        // Client ports of each VIP its own: a new flow to a shared backend
        // from a client's (address, port) ends the owner's flow from there.
        let frames: Vec<Frame> = (0..9)
            .map(|j| request(v, 40_000 + 100 * i as u16 + j))
            .collect();
        for f in &frames {
            for p in [f.clone(), f.clone().established(2)] {
                let (verdict, _) = t.run_xdp(&p.build());
                assert_eq!(verdict, XDP_PASS, "{}: a flow of the layout 2 set", v.key());
            }
        }
        let old = affinity_of(t, *svc, &frames[0]).expect("the first flow's affinity entry");
        let weights: Vec<u32> = ids.iter().map(|&id| u32::from(id != old)).collect();
        scratch.reweight(v, &weights);
        let old = be_of(&scratch, old);
        for f in frames {
            if affinity_of(t, *svc, &f) != Some(old.id) {
                continue;
            }
            let (c, sport, dport, proto) = (f.src_ip(), f.sport(), f.dport(), f.proto());
            assert_ne!(
                scratch.pick_flow(*svc, c, sport, dport, proto),
                Some(old.id),
                "{}: the table no longer picks the flow's backend",
                v.key()
            );
            let desc = format!("{} flow from port {sport}", v.key());
            let f = f.established(3);
            assert_forwarded(t, &format!("{desc}, before the upgrade"), &f, &old);
            flows.push(Established {
                desc,
                vip: v.clone(),
                svc: *svc,
                frame: f,
                old,
            });
        }
    }
    let v3_defs: BTreeMap<String, Def> = layouts::pin_names(&t.pin_dir)
        .into_iter()
        .map(|n| {
            let d = pinned_def(&t.pin_dir.join(&n)).1;
            (n, d)
        })
        .collect();

    let dir = PinDir::new("rivora-v2-");
    create_set(&dir.path, V2, SIZES, 2);
    // Every map's entries, whatever the upgrade does with it, where this
    // build's map has layout 2's shape (one that has not is the upgrade's
    // to refuse or replace, not this copy's).
    for m in V2 {
        let same_shape = v3_defs
            .get(m.name)
            .is_some_and(|d| (d.key_size, d.value_size) == (m.key_size, m.value_size));
        if m.name != "meta_map" && same_shape {
            layouts::copy_entries(&t.pin_dir, &dir.path, m.name);
        }
    }
    // Counters in layout 2's drop_stats_map, which the upgrade replaces.
    let drops = layouts::open(&dir.pin("drop_stats_map"));
    let cpus = layouts::possible_cpus() as usize;
    for reason in 0..V2_DROP_MAX {
        let per_cpu = vec![bytes_of(&rv_drop_stats { packets: 1000 }).to_vec(); cpus];
        drops
            .update_percpu(&reason.to_ne_bytes(), &per_cpu, MapFlags::ANY)
            .expect("drop_stats_map");
    }
    layouts::assert_v2_entries(&dir.path);
    let set = snapshot(&dir.path);
    for (map, want) in [
        ("vip_map", 2),
        ("vip_map6", 2),
        // Every flow's (each VIP's nine).
        ("connection_affinity_map", 18),
        ("connection_affinity_map6", 18),
        // The sharing VIPs' flows.
        ("nat_reverse_map", 9),
        ("nat_reverse_map6", 9),
        ("nat_owner_map", 2),
        ("nat_owner_map6", 2),
    ] {
        assert_eq!(
            set[map].non_zero(),
            want,
            "the layout 2 set's live state: {map}"
        );
    }
    for map in [
        "backend_map",
        "backend_map6",
        "stats_map",
        "rl_config_map",
        "svc_rl_config_map",
        "rl_buckets_map",
        "rl_buckets_map6",
        "tunnel_config_map",
        "iface_mac_map",
        "vip_filter_map",
    ] {
        assert!(set[map].non_zero() > 0, "the layout 2 set's {map}");
    }
    assert!(
        vips.iter()
            .all(|v| flows.iter().any(|f| f.vip.key() == v.key())),
        "every VIP has an established flow the table no longer picks"
    );
    V2Set {
        dir,
        vips,
        placed,
        flows,
        v3_defs,
    }
}

/// What rivorad's start does with the pins (`Daemon::start`): the layout
/// version read before anything; a set the load upgrades is loaded before
/// the writer opens the maps (it opens the maps the upgrade adds), any
/// other pinned set is preflighted first (there the load runs beside the
/// adoption; one after the other here); then the writer adopts the maps.
fn start_like_rivorad(dir: &Path) -> Result<(Datapath, Writer<Maps>), DataplaneError> {
    let opts = opts(dir);
    let upgrading = upgradable(pinned_abi_version(dir)?);
    if dir.join("meta_map").exists() && !upgrading {
        Datapath::preflight(&opts)?;
    }
    let dp = Datapath::load(&opts)?;
    let w = Writer::open_pinned(dir)?;
    Ok((dp, w))
}

/// The pinned maps the loaded objects declare, by name (from the
/// objects, not from a list): each must be pinned under `dir`, and each
/// object's map of that name must be the pinned map.
fn loaded_pinned_maps(dp: &Datapath, dir: &Path) -> BTreeMap<String, Def> {
    let mut out = BTreeMap::new();
    for (what, object) in [
        ("xdp_ingress", dp.xdp().object()),
        ("tc_nat", dp.tc().object()),
    ] {
        for m in object.maps() {
            let name = m.name().to_string_lossy().into_owned();
            let Some(pin) = m.get_pin_path() else {
                continue;
            };
            assert_eq!(Path::new(pin), dir.join(&name), "{what}'s {name} pin path");
            let info = m.info().expect("map info").info;
            let (pinned_id, def) = pinned_def(&dir.join(&name));
            assert_eq!(
                info.id, pinned_id,
                "{what}'s {name} is the map pinned as {name}"
            );
            out.insert(name, def);
        }
    }
    out
}

/// Everything the upgrade promises, checked on `dir` after the load and
/// the adoption; `before` is the set as the load found it.
fn assert_upgraded(set: &V2Set, before: &BTreeMap<String, Pinned>, dp: Datapath, w: Writer<Maps>) {
    let dir = &set.dir.path;
    let meta = read_meta(dir);
    assert_eq!(
        (meta.abi_version, meta.maglev_size),
        (ABI_VERSION, SIZES.maglev),
        "meta_map says this build's layout and keeps the Maglev size"
    );
    assert_eq!(pinned_abi_version(dir).unwrap(), Some(ABI_VERSION));

    // The set pinned is what the objects pin: layout 2's and the added.
    let loaded = loaded_pinned_maps(&dp, dir);
    let names: BTreeSet<&str> = loaded.keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = V2
        .iter()
        .map(|m| m.name)
        .chain(ADDED_IN_V3.iter().chain(&ADDED_IN_V4).copied())
        .collect();
    assert_eq!(
        names, want,
        "the objects' pinned maps are layout 2's, ADDED_IN_V3 and ADDED_IN_V4"
    );
    let after = snapshot(dir);
    assert_eq!(
        after.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        want,
        "the pins are the objects' pinned maps, nothing else"
    );
    for (name, def) in &loaded {
        assert_eq!(&after[name].def, def, "{name} pinned with its definition");
        assert_eq!(
            Some(def),
            set.v3_defs.get(name),
            "{name} as a fresh load of this build pins it"
        );
    }
    for name in REPLACED_IN_V3 {
        let v2 = layouts::v2_map(name).expect("a replaced map is layout 2's");
        // Replacing loses the entries: only counters may go (per-CPU
        // arrays of them), never a map of flows, VIPs or settings.
        assert_eq!(
            v2.map_type,
            MapType::PercpuArray,
            "{name} in REPLACED_IN_V3: the upgrade keeps every map that holds state"
        );
        assert_ne!(
            after[name].def,
            v2.pinned(SIZES),
            "{name} has layout 3's shape"
        );
        if let Some(b) = before.get(name).filter(|b| b.def == v2.pinned(SIZES)) {
            assert_ne!(after[name].id, b.id, "{name} is a new map");
        }
        assert_eq!(after[name].non_zero(), 0, "{name} counts from zero");
    }
    // Every map layout 2 had and layout 3 kept: the same map, every
    // entry byte for byte. meta_map's one entry is the version, above.
    let kept: Vec<&str> = V2
        .iter()
        .map(|m| m.name)
        .filter(|n| *n != "meta_map" && !REPLACED_IN_V3.contains(n))
        .collect();
    let only_kept = |s: &BTreeMap<String, Pinned>| -> BTreeMap<String, Pinned> {
        s.iter()
            .filter(|(n, _)| kept.contains(&n.as_str()))
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    };
    let kept_before = only_kept(before);
    assert_eq!(kept_before.len(), kept.len(), "every kept map was there");
    let assert_kept = |when: &str, now: &BTreeMap<String, Pinned>| {
        let moved = layouts::diff(&kept_before, &only_kept(now));
        assert!(
            moved.is_empty(),
            "{when}: maps layout 3 keeps are not the same maps with the same entries: {moved:#?}"
        );
    };
    assert_kept("after the load and the adoption", &after);

    // The writer adopted every VIP with its ids; the file's VIPs, upserted
    // again, change nothing.
    let fx = Fx {
        t: TestDp {
            dp,
            maps: Maps::open(dir).expect("every map the writer knows is pinned"),
            pin_dir: dir.clone(),
        },
        w: RefCell::new(w),
    };
    assert_eq!(fx.w.borrow().vips().len(), set.placed.len(), "VIPs adopted");
    for (v, placed) in set.vips.iter().zip(&set.placed) {
        let r =
            fx.w.borrow_mut()
                .upsert_vip(v)
                .expect("upsert after upgrade");
        assert!(
            !matches!(r, Upsert::Created),
            "{}: the file's VIP is the adopted one",
            v.key()
        );
        let p = fx.placed(v);
        assert_eq!(&(p.svc, p.ids), placed, "{}: same ids", v.key());
    }
    fx.w.borrow_mut().reclaim().expect("reclaim");
    assert_kept("after the VIPs were upserted", &snapshot(dir));

    // Established flows still go to their old backend; their replies are
    // translated back; a new flow goes where the table says.
    let t = &fx.t;
    for e in &set.flows {
        assert_forwarded(
            t,
            &format!("{}, after the upgrade", e.desc),
            &e.frame,
            &e.old,
        );
        assert_reply_translated(t, &e.desc, &e.frame, &e.old);
        let f = request(&e.vip, 60_000);
        let id = fx
            .pick_flow(e.svc, f.src_ip(), f.sport(), f.dport(), f.proto())
            .expect("a healthy backend");
        assert_forwarded(
            t,
            &format!("{}: a new flow", e.vip.key()),
            &f,
            &be_of(&fx, id),
        );
    }
}

#[test]
fn v2_set_upgrades_in_place_and_flows_stay() {
    common::require::root_and_tools("abi_upgrade");
    let ns = Netns::new(&unique("rvupgrade"));
    let _in = InNetns::enter(&ns);
    let set = v2_set();
    let before = snapshot(&set.dir.path);
    assert_eq!(pinned_abi_version(&set.dir.path).unwrap(), Some(2));
    let (dp, w) = start_like_rivorad(&set.dir.path)
        .unwrap_or_else(|e| panic!("upgrading a layout 2 set: {e}"));
    assert_upgraded(&set, &before, dp, w);
}

#[test]
fn v3_set_gains_the_source_range_maps_and_flows_stay() {
    common::require::root_and_tools("abi_upgrade");
    let ns = Netns::new(&unique("rvupgrade"));
    let _in = InNetns::enter(&ns);
    // Its own pin directory (TestDp's), removed when it goes.
    let scratch = Fx::with_options(LoadOptions {
        maglev_size: SIZES.maglev,
        flow_table_size: SIZES.flow_table,
        ..Default::default()
    });
    let dir = scratch.t.pin_dir.clone();
    let v = vips()[0].clone();
    let svc = scratch.apply(&v).svc;
    let f = request(&v, 41_000);
    let (verdict, _) = scratch.t.run_xdp(&f.build());
    assert_eq!(verdict, XDP_PASS, "the flow's first packet");
    let old = affinity_of(&scratch.t, svc, &f).expect("the flow's affinity entry");
    let old = be_of(&scratch, old);
    let f = f.established(2);
    assert_forwarded(&scratch.t, "before the upgrade", &f, &old);

    // What a layout 3 rivorad leaves: the same maps, less layout 4's.
    for name in ADDED_IN_V4 {
        std::fs::remove_file(dir.join(name)).expect("unpinning a map layout 4 added");
    }
    layouts::write_meta(&dir, 3, SIZES.maglev);
    let before = snapshot(&dir);
    let (dp, w) =
        start_like_rivorad(&dir).unwrap_or_else(|e| panic!("upgrading a layout 3 set: {e}"));
    let meta = read_meta(&dir);
    assert_eq!(
        (meta.abi_version, meta.maglev_size),
        (ABI_VERSION, SIZES.maglev)
    );
    let after = snapshot(&dir);
    for name in ADDED_IN_V4 {
        assert_eq!(after[name].non_zero(), 0, "{name} pinned, empty");
    }
    let kept = |s: &BTreeMap<String, Pinned>| -> BTreeMap<String, Pinned> {
        s.iter()
            .filter(|(n, _)| n.as_str() != "meta_map" && !ADDED_IN_V4.contains(&n.as_str()))
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    };
    let moved = layouts::diff(&kept(&before), &kept(&after));
    assert!(moved.is_empty(), "maps layout 4 keeps moved: {moved:#?}");

    let fx = Fx {
        t: TestDp {
            dp,
            maps: Maps::open(&dir).expect("every map the writer knows is pinned"),
            pin_dir: dir.clone(),
        },
        w: RefCell::new(w),
    };
    assert_forwarded(&fx.t, "after the upgrade", &f, &old);
    // The new maps work: ranges that leave the client out end its flow.
    let mut restricted = v.clone();
    restricted.source_ranges = Some(vec!["192.0.2.0/24".parse().unwrap()]);
    assert_eq!(fx.apply(&restricted).svc, svc);
    let (verdict, out) = fx.t.run_xdp(&f.build());
    assert_eq!(
        (verdict, out),
        (XDP_DROP, f.build()),
        "outside the ranges now"
    );
    assert_eq!(fx.t.source_refused(svc), 1);
    // Both datapaths over the same pins: one unpins them when it goes.
    std::mem::forget(fx.t);
}

/// A refusal's message and a set left whole, for each way in.
fn assert_refused_untouched(dir: &Path, desc: &str, want: &[String]) {
    let before = snapshot(dir);
    let o = opts(dir);
    let ways: [(&str, &dyn Fn() -> Option<DataplaneError>); 3] = [
        ("preflight", &|| Datapath::preflight(&o).err()),
        ("load", &|| Datapath::load(&o).err()),
        ("rivorad's start", &|| start_like_rivorad(dir).err()),
    ];
    for (what, way) in ways {
        let e = way()
            .unwrap_or_else(|| panic!("{desc}: the {what} accepted the set"))
            .to_string();
        for w in want {
            assert!(e.contains(w.as_str()), "{desc}: {what}: `{w}` in: {e}");
        }
        let moved = layouts::diff(&before, &snapshot(dir));
        assert!(
            moved.is_empty(),
            "{desc}: the {what} changed the set: {moved:#?}"
        );
    }
}

#[test]
fn other_layouts_are_refused_and_left_whole() {
    common::require::root_and_tools("abi_upgrade");
    let migration = "rivorad -cleanup".to_string();
    let ours = format!("expects version {ABI_VERSION}");
    for (desc, layout, version) in [
        ("layout 1", layouts::v1(), 1),
        (
            "a layout this build does not know",
            V2.to_vec(),
            ABI_VERSION + 1,
        ),
        ("a version never used", V2.to_vec(), 0xdead),
    ] {
        let dir = PinDir::new("rivora-old-");
        create_set(&dir.path, &layout, SIZES, version);
        // Some state, to find again: a VIP and a flow.
        let vip = rv_vip_key {
            addr: be32("10.0.0.100".parse().unwrap()),
            port: be16(80),
            proto: PROTO_TCP,
            pad: 0,
        };
        layouts::open(&dir.pin("vip_map"))
            .update(
                bytes_of(&vip),
                bytes_of(&rv_vip_value { svc_id: 1 }),
                MapFlags::ANY,
            )
            .unwrap();
        let flow = rv_flow_key {
            svc_id: 1,
            saddr: be32(CLIENT4.parse().unwrap()),
            sport: be16(40_000),
            dport: be16(80),
            proto: PROTO_TCP,
            ..Default::default()
        };
        let aff = rv_affinity_value {
            backend_id: 2,
            last_seen_ns: ktime_ns(),
            ..Default::default()
        };
        layouts::open(&dir.pin("connection_affinity_map"))
            .update(bytes_of(&flow), bytes_of(&aff), MapFlags::ANY)
            .unwrap();
        assert_refused_untouched(
            &dir.path,
            desc,
            &[
                format!("layout version {version}"),
                ours.clone(),
                migration.clone(),
            ],
        );
        assert_eq!(read_meta(&dir.path).abi_version, version, "{desc}");
        let got = layouts::open(&dir.pin("connection_affinity_map"))
            .lookup(bytes_of(&flow), MapFlags::ANY)
            .unwrap()
            .and_then(|v| from_bytes::<rv_affinity_value>(&v));
        assert_eq!(got.map(|a| a.backend_id), Some(2), "{desc}: the flow kept");
    }
}

#[test]
fn a_v2_set_the_upgrade_cannot_take_is_left_whole() {
    common::require::root_and_tools("abi_upgrade");
    let migration = "rivorad -cleanup".to_string();

    // Pinned with other flow tables than this start asks for.
    let dir = PinDir::new("rivora-v2-");
    let other = Sizes {
        flow_table: 2 * SIZES.flow_table,
        ..SIZES
    };
    create_set(&dir.path, V2, other, 2);
    let pinned = layouts::v2_map("connection_affinity_map")
        .unwrap()
        .pinned(other)
        .max_entries;
    assert_refused_untouched(
        &dir.path,
        "other flow table size",
        &[
            format!("pinned map connection_affinity_map has max entries {pinned}"),
            format!("-flow-table-size {pinned}"),
            migration.clone(),
        ],
    );
    assert_eq!(read_meta(&dir.path).abi_version, 2);

    // A map missing (removed by hand, or never there).
    for missing in ["nat_owner_map", "connection_affinity_map6"] {
        let dir = PinDir::new("rivora-v2-");
        create_set(&dir.path, V2, SIZES, 2);
        std::fs::remove_file(dir.pin(missing)).unwrap();
        assert_refused_untouched(
            &dir.path,
            &format!("{missing} missing"),
            &[format!("without {missing}"), migration.clone()],
        );
        assert_eq!(read_meta(&dir.path).abi_version, 2);
    }
}

#[test]
fn an_interrupted_upgrade_completes_on_the_next_load() {
    common::require::root_and_tools("abi_upgrade");
    let ns = Netns::new(&unique("rvupgrade"));
    let _in = InNetns::enter(&ns);
    // libbpf creates and pins an object's maps in their declaration
    // order, before any program is loaded; meta_map is rewritten once
    // both objects have loaded.
    let half = ADDED_IN_V3.len() / 2;
    let stages: [(&str, Vec<&str>); 3] = [
        ("the replaced maps unpinned, nothing created", Vec::new()),
        (
            "the replaced maps and part of the added ones created",
            REPLACED_IN_V3
                .iter()
                .chain(&ADDED_IN_V3[..half])
                .copied()
                .collect(),
        ),
        (
            "every map created, meta_map still saying 2",
            REPLACED_IN_V3
                .iter()
                .chain(ADDED_IN_V3.iter())
                .copied()
                .collect(),
        ),
    ];
    for (desc, created) in stages {
        let set = v2_set();
        let dir = &set.dir.path;
        for name in REPLACED_IN_V3 {
            std::fs::remove_file(dir.join(name)).unwrap();
        }
        for name in &created {
            create_pinned(dir, name, set.v3_defs[*name]);
        }
        assert_eq!(read_meta(dir).abi_version, 2, "{desc}");
        let before = snapshot(dir);
        let (dp, w) =
            start_like_rivorad(dir).unwrap_or_else(|e| panic!("{desc}: the next load: {e}"));
        assert_upgraded(&set, &before, dp, w);
    }
}
