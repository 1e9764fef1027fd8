//! Pinned map sets as rivorads of earlier layouts left them, for the
//! upgrade tests (tests/packets/abi_upgrade.rs, tests/e2e_restart.rs), and what
//! those tests compare before and after: every pin's definition, kernel
//! map id and entries.
//!
//! Layout 2's set ([`V2`]) is written down from the last commit that had
//! it (8f6df55: bpf/lib/maps.h, and the sizes tests/golden/abi_layout.txt
//! recorded for version 2), not derived from this tree: a past layout
//! does not change, and a map whose shape layout 3 changed without
//! listing it in `loader::REPLACED_IN_V3` must make the upgrade fail in
//! the tests rather than be mirrored into the "layout 2" set. Layout 1's
//! ([`v1`]) is layout 2's without what 3f25df5 added. The current layout
//! is never written down here: it is whatever the loaded objects pin.
//!
//! The maps are created with bpf_map_create, without BTF: libbpf reuses a
//! pin when its type, key and value sizes, max_entries, flags and
//! map_extra match (`map_is_reuse_compat`) and never compares BTF, and
//! neither does the kernel for these plain structs; nothing in the
//! upgrade reads BTF.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};
use rivora::abi;
use rivora::dataplane::loader::{ADDED_IN_V3, ADDED_IN_V4, REPLACED_IN_V3};
use rivora::dataplane::maps::{bytes_of, from_bytes};
use MapType::{Array, Hash, LpmTrie, LruHash, PercpuArray};
use Size::{FlowTable, Maglev};

use super::unique;

/// BPF_F_NO_PREALLOC and BPF_F_NO_COMMON_LRU.
const NO_PREALLOC: u32 = libbpf_sys::BPF_F_NO_PREALLOC;
const NO_COMMON_LRU: u32 = libbpf_sys::BPF_F_NO_COMMON_LRU;

/// A map's definition as the kernel reports it, which is what libbpf
/// compares when it reuses a pin.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Def {
    pub map_type: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

impl fmt::Debug for Def {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} key {} value {} max {} flags {:#x}",
            self.map_type, self.key_size, self.value_size, self.max_entries, self.flags
        )
    }
}

/// max_entries of a past layout's map: fixed, or one of the load-time
/// settings.
#[derive(Clone, Copy, Debug)]
pub enum Size {
    Fixed(u32),
    /// rivorad -flow-table-size.
    FlowTable,
    /// rivorad -maglev-size.
    Maglev,
}

/// One map of a past layout, as its bpf/lib/maps.h declared it.
#[derive(Clone, Copy, Debug)]
pub struct PastMap {
    pub name: &'static str,
    pub map_type: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub size: Size,
    pub flags: u32,
}

/// The load-time settings a set was pinned with.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub flow_table: u32,
    pub maglev: u32,
}

impl PastMap {
    /// The definition as requested at creation (the kernel rounds a
    /// per-CPU LRU's max_entries up to a multiple of the possible CPUs,
    /// as it did for the rivorad that pinned it).
    pub fn requested(&self, sizes: Sizes) -> Def {
        Def {
            map_type: self.map_type,
            key_size: self.key_size,
            value_size: self.value_size,
            max_entries: match self.size {
                Size::Fixed(n) => n,
                Size::FlowTable => sizes.flow_table,
                Size::Maglev => sizes.maglev,
            },
            flags: self.flags,
        }
    }

    /// The definition the kernel reports once created.
    pub fn pinned(&self, sizes: Sizes) -> Def {
        let mut d = self.requested(sizes);
        if d.flags & NO_COMMON_LRU != 0 {
            d.max_entries = d.max_entries.next_multiple_of(possible_cpus());
        }
        d
    }
}

const fn map(
    name: &'static str,
    map_type: MapType,
    key_size: u32,
    value_size: u32,
    size: Size,
    flags: u32,
) -> PastMap {
    PastMap {
        name,
        map_type,
        key_size,
        value_size,
        size,
        flags,
    }
}

// Layout 2's limits (include/rivora/abi.h at 8f6df55).
const V2_MAX_VIPS: u32 = 4096;
const V2_SVC_ID_SLOTS: u32 = V2_MAX_VIPS + 1;
const V2_BACKEND_ID_SLOTS: u32 = 8192 + 1;
const V2_MAX_FRAGS: u32 = 16_384;
const V2_MAX_RL_BUCKETS: u32 = 65_536;
const V2_MAX_IFACES: u32 = 256;
const V2_MAX_NAT_OWNERS: u32 = 16_384;
/// RV_DROP_MAX of layout 2: reasons 0 to 13 (RV_DROP_NO_TUNNEL_SRC).
pub const V2_DROP_MAX: u32 = 14;

const fn fixed(n: u32) -> Size {
    Size::Fixed(n)
}

/// Layout 2's pinned maps, in bpf/lib/maps.h's order (8f6df55); sizes
/// from tests/golden/abi_layout.txt's version 2.
pub const V2: &[PastMap] = &[
    map("meta_map", Array, 4, 8, fixed(1), 0),
    map("vip_map", Hash, 8, 4, fixed(V2_MAX_VIPS), 0),
    map("vip_map6", Hash, 20, 4, fixed(V2_MAX_VIPS), 0),
    map(
        "vip_range_map",
        LpmTrie,
        16,
        4,
        fixed(V2_MAX_VIPS * 4),
        NO_PREALLOC,
    ),
    map(
        "vip_range_map6",
        LpmTrie,
        28,
        4,
        fixed(V2_MAX_VIPS * 4),
        NO_PREALLOC,
    ),
    map(
        "service_config_map",
        Array,
        4,
        24,
        fixed(V2_SVC_ID_SLOTS),
        0,
    ),
    map("maglev_table", Array, 4, 4, Maglev, 0),
    map("backend_map", Array, 4, 36, fixed(V2_BACKEND_ID_SLOTS), 0),
    map("backend_map6", Array, 4, 48, fixed(V2_BACKEND_ID_SLOTS), 0),
    map(
        "backend_health_map",
        Array,
        4,
        4,
        fixed(V2_BACKEND_ID_SLOTS),
        0,
    ),
    map(
        "connection_affinity_map",
        LruHash,
        16,
        16,
        FlowTable,
        NO_COMMON_LRU,
    ),
    map(
        "connection_affinity_map6",
        LruHash,
        28,
        16,
        FlowTable,
        NO_COMMON_LRU,
    ),
    map("nat_reverse_map", LruHash, 16, 12, FlowTable, NO_COMMON_LRU),
    map(
        "nat_reverse_map6",
        LruHash,
        40,
        24,
        FlowTable,
        NO_COMMON_LRU,
    ),
    map(
        "frag_map",
        LruHash,
        12,
        8,
        fixed(V2_MAX_FRAGS),
        NO_COMMON_LRU,
    ),
    map(
        "frag_map6",
        LruHash,
        40,
        8,
        fixed(V2_MAX_FRAGS),
        NO_COMMON_LRU,
    ),
    map(
        "frag_rev_map",
        LruHash,
        12,
        8,
        fixed(V2_MAX_FRAGS),
        NO_COMMON_LRU,
    ),
    map(
        "frag_rev_map6",
        LruHash,
        40,
        20,
        fixed(V2_MAX_FRAGS),
        NO_COMMON_LRU,
    ),
    map("stats_map", PercpuArray, 4, 32, fixed(V2_SVC_ID_SLOTS), 0),
    map("drop_stats_map", PercpuArray, 4, 8, fixed(V2_DROP_MAX), 0),
    map("rl_config_map", Array, 4, 16, fixed(1), 0),
    map("svc_rl_config_map", Array, 4, 16, fixed(V2_SVC_ID_SLOTS), 0),
    map(
        "rl_buckets_map",
        LruHash,
        8,
        16,
        fixed(V2_MAX_RL_BUCKETS),
        NO_COMMON_LRU,
    ),
    map(
        "rl_buckets_map6",
        LruHash,
        20,
        16,
        fixed(V2_MAX_RL_BUCKETS),
        NO_COMMON_LRU,
    ),
    map("iface_mac_map", Hash, 4, 8, fixed(V2_MAX_IFACES), 0),
    map("tunnel_config_map", Array, 4, 20, fixed(1), 0),
    map(
        "nh_miss_map",
        PercpuArray,
        4,
        8,
        fixed(V2_BACKEND_ID_SLOTS),
        0,
    ),
    map("nat_owner_map", Hash, 8, 28, fixed(V2_MAX_NAT_OWNERS), 0),
    map("nat_owner_map6", Hash, 20, 28, fixed(V2_MAX_NAT_OWNERS), 0),
    map("vip_filter_map", Array, 4, 520, fixed(1), 0),
];

/// Layout 1's pinned maps: layout 2's without the next-hop cache, the NAT
/// owners and the VIP filter, with the backends before their next hop
/// (rv_backend 12 bytes, rv_backend6 24; 3f25df5^).
pub fn v1() -> Vec<PastMap> {
    V2.iter()
        .filter(|m| {
            !matches!(
                m.name,
                "nh_miss_map" | "nat_owner_map" | "nat_owner_map6" | "vip_filter_map"
            )
        })
        .map(|m| match m.name {
            "backend_map" => PastMap {
                value_size: 12,
                ..*m
            },
            "backend_map6" => PastMap {
                value_size: 24,
                ..*m
            },
            _ => *m,
        })
        .collect()
}

/// Layout 2's map of that name.
pub fn v2_map(name: &str) -> Option<&'static PastMap> {
    V2.iter().find(|m| m.name == name)
}

pub fn possible_cpus() -> u32 {
    libbpf_rs::num_possible_cpus().expect("possible CPUs") as u32
}

/// A pin directory of the test's own under /sys/fs/bpf, removed with
/// everything in it on drop (also when the test panics).
pub struct PinDir {
    pub path: PathBuf,
}

impl PinDir {
    pub fn new(prefix: &str) -> Self {
        let path = PathBuf::from(format!("/sys/fs/bpf/{}", unique(prefix)));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { path }
    }

    pub fn pin(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Create a map of `def` and pin it at `dir/name`.
pub fn create_pinned(dir: &Path, name: &str, def: Def) {
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        map_flags: def.flags,
        ..Default::default()
    };
    // libbpf cuts the name to the kernel's 15 characters, as it did for
    // the rivorad that created the original.
    let mut m = MapHandle::create(
        def.map_type,
        Some(name),
        def.key_size,
        def.value_size,
        def.max_entries,
        &opts,
    )
    .unwrap_or_else(|e| panic!("creating {name} ({def:?}): {e}"));
    m.pin(dir.join(name))
        .unwrap_or_else(|e| panic!("pinning {name}: {e}"));
}

/// Pin `layout`'s maps in `dir`, empty but for meta_map, which says
/// `abi_version` and the Maglev size (rv_meta is the same 8 bytes in
/// every layout).
pub fn create_set(dir: &Path, layout: &[PastMap], sizes: Sizes, abi_version: u32) {
    for m in layout {
        create_pinned(dir, m.name, m.requested(sizes));
    }
    write_meta(dir, abi_version, sizes.maglev);
}

/// meta_map's entry: (abi_version, maglev_size).
pub fn write_meta(dir: &Path, abi_version: u32, maglev_size: u32) {
    let meta = abi::rv_meta {
        abi_version,
        maglev_size,
    };
    open(&dir.join("meta_map"))
        .update(&0u32.to_ne_bytes(), bytes_of(&meta), MapFlags::ANY)
        .expect("writing meta_map");
}

pub fn read_meta(dir: &Path) -> abi::rv_meta {
    let v = open(&dir.join("meta_map"))
        .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
        .expect("reading meta_map")
        .expect("meta_map has its entry");
    from_bytes(&v).expect("meta_map's value is an rv_meta")
}

pub fn open(pin: &Path) -> MapHandle {
    MapHandle::from_pinned_path(pin).unwrap_or_else(|e| panic!("opening {}: {e}", pin.display()))
}

/// The kernel id and definition of the map pinned at `pin`.
pub fn pinned_def(pin: &Path) -> (u32, Def) {
    let info = open(pin)
        .info()
        .unwrap_or_else(|e| panic!("{}: {e}", pin.display()))
        .info;
    (
        info.id,
        Def {
            map_type: MapType::from(info.type_),
            key_size: info.key_size,
            value_size: info.value_size,
            max_entries: info.max_entries,
            flags: info.map_flags,
        },
    )
}

fn is_percpu(t: MapType) -> bool {
    matches!(
        t,
        MapType::PercpuArray | MapType::PercpuHash | MapType::LruPercpuHash
    )
}

/// One pinned map as found: its kernel id, definition and every entry
/// (an array's every index; a per-CPU value is the CPUs' values one
/// after the other).
#[derive(Clone, PartialEq, Eq)]
pub struct Pinned {
    pub id: u32,
    pub def: Def,
    pub entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl fmt::Debug for Pinned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "map id {} ({:?}), {} entries",
            self.id,
            self.def,
            self.entries.len()
        )
    }
}

impl Pinned {
    /// Entries whose value is not all zeros (an array's empty slots
    /// left out).
    pub fn non_zero(&self) -> usize {
        self.entries
            .values()
            .filter(|v| v.iter().any(|b| *b != 0))
            .count()
    }
}

pub fn read_pinned(pin: &Path) -> Pinned {
    let (id, def) = pinned_def(pin);
    let m = open(pin);
    let mut entries = BTreeMap::new();
    for k in m.keys() {
        let v = if is_percpu(def.map_type) {
            m.lookup_percpu(&k, MapFlags::ANY)
                .unwrap_or_else(|e| panic!("{}: {e}", pin.display()))
                .map(|per_cpu| per_cpu.concat())
        } else {
            m.lookup(&k, MapFlags::ANY)
                .unwrap_or_else(|e| panic!("{}: {e}", pin.display()))
        };
        // An LRU entry may go between the walk and the lookup; nothing
        // runs the datapath while the tests read.
        if let Some(v) = v {
            entries.insert(k, v);
        }
    }
    Pinned { id, def, entries }
}

/// Every map pinned directly under `dir` (subdirectories, such as the
/// pinned links', are not maps), by name.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Pinned> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let e = e.expect("directory entry");
        if e.file_type().expect("file type").is_dir() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        out.insert(name, read_pinned(&e.path()));
    }
    out
}

/// The names pinned directly under `dir` (maps; not the links'
/// subdirectory), sorted.
pub fn pin_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry"))
        .filter(|e| !e.file_type().expect("file type").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Copy every entry of the map `name` pinned under `from` to the one
/// under `to` (same key and value sizes; an array's all-zero slots are
/// left as they are).
pub fn copy_entries(from: &Path, to: &Path, name: &str) {
    let src = read_pinned(&from.join(name));
    let dst = open(&to.join(name));
    let (_, def) = pinned_def(&to.join(name));
    assert_eq!(
        (src.def.key_size, src.def.value_size),
        (def.key_size, def.value_size),
        "{name}: copying between maps of one shape"
    );
    let ncpus = libbpf_rs::num_possible_cpus().expect("possible CPUs");
    for (k, v) in &src.entries {
        if v.iter().all(|b| *b == 0) && matches!(def.map_type, Array | PercpuArray) {
            continue;
        }
        if is_percpu(def.map_type) {
            let per_cpu: Vec<Vec<u8>> = v.chunks(v.len() / ncpus).map(<[u8]>::to_vec).collect();
            dst.update_percpu(k, &per_cpu, MapFlags::ANY)
        } else {
            dst.update(k, v, MapFlags::ANY)
        }
        .unwrap_or_else(|e| panic!("copying an entry of {name}: {e}"));
    }
}

/// What layout 3 gave a meaning to in entries that layout 2 had as pad
/// (zero then): a layout 2 set holds no such byte. Checked on a set
/// built for the tests, so that it is one layout 2 could have written.
pub fn assert_v2_entries(dir: &Path) {
    let v3_flags = abi::rv_service_flags::RV_SVC_F_FULLNAT.0;
    for (k, v) in read_pinned(&dir.join("service_config_map")).entries {
        let s: abi::rv_service = from_bytes(&v).expect("rv_service");
        assert_eq!(
            s.flags & v3_flags,
            0,
            "service {k:?}: a layout 3 flag in a layout 2 set"
        );
        assert_ne!(
            u32::from(s.mode),
            abi::rv_mode::RV_MODE_FULLNAT.0,
            "service {k:?}: full NAT in a layout 2 set"
        );
    }
    for (k, v) in read_pinned(&dir.join("backend_map")).entries {
        let b: abi::rv_backend = from_bytes(&v).expect("rv_backend");
        assert_eq!(
            (b.nh.mode, b.nh.fullnat_src, b.nh.pad),
            (0, 0, 0),
            "backend {k:?}: layout 2's next-hop pad holds something"
        );
    }
    for (k, v) in read_pinned(&dir.join("backend_map6")).entries {
        let b: abi::rv_backend6 = from_bytes(&v).expect("rv_backend6");
        assert_eq!(
            (b.nh.mode, b.nh.fullnat_src, b.nh.pad),
            (0, 0, 0),
            "backend6 {k:?}: layout 2's next-hop pad holds something"
        );
    }
    for map in ["connection_affinity_map", "connection_affinity_map6"] {
        for (k, v) in read_pinned(&dir.join(map)).entries {
            let a: abi::rv_affinity_value = from_bytes(&v).expect("rv_affinity_value");
            assert_eq!(
                (a.fullnat_port, a.fullnat_src, a.ranges_gen),
                (0, 0, 0),
                "{map} {k:?}: layout 2's pad word holds something"
            );
        }
    }
}

/// Turn a set pinned by this build into the set a layout 2 rivorad would
/// have left with the same entries: the maps layout 3 added unpinned,
/// the maps it replaced pinned again in layout 2's shape (empty: they
/// hold counters only), meta_map saying 2. Every other map must already
/// have layout 2's definition (checked), and its entries what layout 2
/// could have written ([`assert_v2_entries`]). Programs still running
/// from the unpinned maps keep them.
pub fn downgrade_to_v2(dir: &Path, sizes: Sizes) {
    for name in pin_names(dir) {
        let pin = dir.join(&name);
        match v2_map(&name) {
            None => {
                assert!(
                    ADDED_IN_V3.contains(&name.as_str()) || ADDED_IN_V4.contains(&name.as_str()),
                    "{name} is neither layout 2's nor in ADDED_IN_V3 or ADDED_IN_V4"
                );
                std::fs::remove_file(&pin).expect("unpinning a map a later layout added");
            }
            Some(m) if REPLACED_IN_V3.contains(&m.name) => {
                std::fs::remove_file(&pin).expect("unpinning a map layout 3 replaced");
                create_pinned(dir, m.name, m.requested(sizes));
            }
            Some(m) => {
                assert_eq!(
                    pinned_def(&pin).1,
                    m.pinned(sizes),
                    "{name}: layout 3 keeps layout 2's definition"
                );
            }
        }
    }
    assert_v2_entries(dir);
    let maglev = read_meta(dir).maglev_size;
    write_meta(dir, 2, maglev);
}

/// How two snapshots differ, one line per pin (empty: the same pins,
/// maps, definitions and entries), for a failure message that names what
/// moved rather than printing every map.
pub fn diff(before: &BTreeMap<String, Pinned>, after: &BTreeMap<String, Pinned>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, b) in before {
        match after.get(name) {
            None => out.push(format!("{name}: unpinned")),
            Some(a) if (a.id, a.def) != (b.id, b.def) => {
                out.push(format!("{name}: was {b:?}, now {a:?}"))
            }
            Some(a) if a.entries != b.entries => {
                let changed = b
                    .entries
                    .iter()
                    .filter(|(k, v)| a.entries.get(*k) != Some(*v))
                    .count();
                let added = a
                    .entries
                    .keys()
                    .filter(|k| !b.entries.contains_key(*k))
                    .count();
                out.push(format!(
                    "{name}: {changed} entries changed or gone, {added} added"
                ));
            }
            Some(_) => {}
        }
    }
    for name in after.keys().filter(|n| !before.contains_key(*n)) {
        out.push(format!("{name}: pinned"));
    }
    out
}
