//! Loading the BPF objects with every map pinned by name under one
//! directory, so that xdp_ingress, tc_nat, rivorad's writer and a later
//! rivorad all share the same maps.

use std::ffi::CString;
use std::fs;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{AsRawLibbpf, MapCore, OpenObject};

use crate::abi;
use crate::bpf::tc_nat::{TcNatSkel, TcNatSkelBuilder};
use crate::bpf::xdp_ingress::{XdpIngressSkel, XdpIngressSkelBuilder};
use crate::dataplane::DataplaneError;

/// Where rivorad pins everything by default.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/rivora-lb";

/// The per-flow tables, all sized by [`LoadOptions::flow_table_size`]:
/// affinity (and full NAT's forward state), NAT's reverse entries, full
/// NAT's port allocations.
pub const FLOW_TABLES: [&str; 6] = [
    "connection_affinity_map",
    "connection_affinity_map6",
    "nat_reverse_map",
    "nat_reverse_map6",
    "fullnat_rev_map",
    "fullnat_rev_map6",
];

/// The layout versions whose pinned maps this binary upgrades in place.
pub const UPGRADABLE_ABI_VERSIONS: [u32; 2] = [2, 3];

/// Whether a pinned set of layout `v` is one this binary upgrades.
pub fn upgradable(v: Option<u32>) -> bool {
    v.is_some_and(|v| UPGRADABLE_ABI_VERSIONS.contains(&v))
}

/// The maps an upgrade from layout `from` creates: those every later
/// layout added, and those it replaced.
pub fn created_upgrading_from(from: u32) -> Vec<&'static str> {
    let mut out = Vec::new();
    if from < 3 {
        out.extend(ADDED_IN_V3);
        out.extend(REPLACED_IN_V3);
    }
    if from < 4 {
        out.extend(ADDED_IN_V4);
    }
    out
}

/// Maps layout 4 added to layout 3's pinned set: source ranges and what
/// they refused. Created empty by the upgrade; nothing else changed.
pub const ADDED_IN_V4: [&str; 3] = [
    "source_range_map",
    "source_range6_map",
    "source_refused_map",
];
/// Maps layout 3 added to layout 2's pinned set: created empty when a
/// layout 2 set is upgraded in place (they hold full NAT's state, which
/// layout 2 had none of, and the endpoints other nodes tunnel to).
/// Everything else keeps its layout: three pad fields got names, a zero
/// in them meaning what layout 2 did.
pub const ADDED_IN_V3: [&str; 9] = [
    "fullnat_config_map",
    "fullnat_src_map",
    "fullnat_rev_map",
    "fullnat_rev_map6",
    "fullnat_cursor_map",
    "fullnat_stats_map",
    "fullnat_frag_map",
    "fullnat_frag_map6",
    "tunnel_ep_map",
];
/// Maps layout 3 made larger: drop_stats_map, for drop reasons added
/// later without another change of size. Counters only: a layout 2 one is
/// replaced, and the counts start again from zero.
pub const REPLACED_IN_V3: [&str; 1] = ["drop_stats_map"];

/// The smallest flow table size accepted. A fixed floor rather than one per
/// possible CPU: the lists are per CPU (BPF_F_NO_COMMON_LRU), but a floor of
/// CPUs x 1,024 would make one value valid on one node and not on the next,
/// and on a VM that declares many hot-pluggable CPUs (possible 0-255, 4
/// online) it would exceed the default. This one catches a size typed in
/// thousands (`131` for 131,072) and still leaves a 2-CPU test node 2,048
/// flows per CPU; the daemon warns when a node's per-CPU share is thin.
pub const FLOW_TABLE_MIN_SIZE: u32 = 4096;
/// The largest: the tables are preallocated kernel memory, 96 to 176
/// bytes per entry each and 760 for an entry in all six (bpftool's
/// memlock on 6.18, docs/datapath.md "Maps"), so 11.9 GiB at this size.
pub const FLOW_TABLE_MAX_SIZE: u32 = 1 << 24;

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub pin_dir: PathBuf,
    /// Slots in the shared Maglev table (a prime; 65,537 by default).
    pub maglev_size: u32,
    /// Entries in each per-flow table ([`FLOW_TABLES`]; 131,072 by
    /// default), within [`FLOW_TABLE_MIN_SIZE`]..=[`FLOW_TABLE_MAX_SIZE`].
    /// The kernel rounds it up to a multiple of the possible CPUs.
    pub flow_table_size: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            maglev_size: abi::MAGLEV_DEFAULT_SIZE,
            flow_table_size: abi::FLOW_TABLE_DEFAULT_SIZE,
        }
    }
}

/// A flow table size, checked against the bounds (u64 so that a figure
/// too large for a u32 gets this error too, not a parse error).
pub fn check_flow_table_size(size: u64) -> Result<u32, DataplaneError> {
    match u32::try_from(size) {
        Ok(n) if (FLOW_TABLE_MIN_SIZE..=FLOW_TABLE_MAX_SIZE).contains(&n) => Ok(n),
        _ => Err(DataplaneError::FlowTableSize {
            size,
            min: FLOW_TABLE_MIN_SIZE,
            max: FLOW_TABLE_MAX_SIZE,
        }),
    }
}

/// The max_entries the kernel gives a hash map with per-CPU LRU lists
/// (BPF_F_NO_COMMON_LRU): rounded up to a multiple of the possible CPUs
/// (down if that overflows) so each CPU's list gets an equal share
/// (htab_map_alloc). The pinned map reports the rounded figure, so the
/// definition it is compared with must be rounded alike, or every restart
/// on a node with, say, 6 possible CPUs is refused as a mismatch (by our
/// check or libbpf's). Cilium rounds its distributed LRU maps the same way.
pub fn per_cpu_lru_entries(max_entries: u32, possible_cpus: u32) -> u32 {
    if possible_cpus <= 1 {
        return max_entries;
    }
    max_entries
        .checked_next_multiple_of(possible_cpus)
        .unwrap_or(max_entries - max_entries % possible_cpus)
}

fn possible_cpus() -> Result<u32, DataplaneError> {
    libbpf_rs::num_possible_cpus()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| DataplaneError::load("reading the number of possible CPUs"))
}

/// An owned skeleton: a libbpf-cargo skeleton borrows its object storage
/// (libbpf's `bpf_object` lives there), so the storage lives on the heap
/// beside it and is freed after it. The one place that frees it, for the
/// node's objects and the backend's decap object alike.
pub struct Owned<S> {
    skel: Option<S>,
    storage: *mut MaybeUninit<OpenObject>,
}

impl<S> Owned<S> {
    /// Open and load a skeleton with `open_load`, which is given storage
    /// that outlives the skeleton it returns and must not keep the
    /// reference anywhere else.
    pub fn load(
        open_load: impl FnOnce(&'static mut MaybeUninit<OpenObject>) -> Result<S, DataplaneError>,
    ) -> Result<Self, DataplaneError> {
        // Leaked here, reclaimed in Drop after the skeleton is gone (or
        // below if there is no skeleton).
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let storage_ptr: *mut MaybeUninit<OpenObject> = storage;
        match open_load(storage) {
            Ok(skel) => Ok(Self {
                skel: Some(skel),
                storage: storage_ptr,
            }),
            Err(e) => {
                // SAFETY: from Box::leak above; the open or loaded skeleton
                // that borrowed it was dropped inside `open_load`, and the
                // error (owned data only) holds no reference to it.
                unsafe { drop(Box::from_raw(storage_ptr)) };
                Err(e)
            }
        }
    }

    pub fn get(&self) -> &S {
        self.skel.as_ref().expect("skeleton present until drop")
    }
}

impl<S> Drop for Owned<S> {
    fn drop(&mut self) {
        drop(self.skel.take());
        // SAFETY: `storage` came from Box::leak in `load`, and the
        // skeleton that borrowed it was dropped just above.
        unsafe { drop(Box::from_raw(self.storage)) };
    }
}

// SAFETY: the skeleton is Send (libbpf-cargo implements it for every
// skeleton it generates); the storage pointer is only dereferenced in Drop,
// after the skeleton is gone, by whichever thread owns this then.
unsafe impl<S: Send> Send for Owned<S> {}

/// The loaded programs. Maps are reached through [`crate::dataplane::Maps`],
/// which opens the pins; this holds the programs (and keeps the objects,
/// and so the maps, alive).
pub struct Datapath {
    xdp: Owned<XdpIngressSkel<'static>>,
    tc: Owned<TcNatSkel<'static>>,
    pin_dir: PathBuf,
}

fn pin_maps<'a>(
    maps: impl Iterator<Item = libbpf_rs::OpenMapMut<'a>>,
    opts: &LoadOptions,
    pinned_version: Option<u32>,
) -> Result<(), DataplaneError> {
    let cpus = possible_cpus()?;
    for mut map in maps {
        let name = map.name().to_string_lossy().into_owned();
        // .rodata and friends belong to one object and are not shared,
        // nor are maps declared without pinning (per-CPU scratch, which
        // holds nothing between program runs).
        if name.contains('.') || !declared_pinned(&map) {
            continue;
        }
        let resize = |map: &mut libbpf_rs::OpenMapMut<'_>, n: u32| {
            map.set_max_entries(n)
                .map_err(|e| DataplaneError::load(format!("resizing {name}: {e}")))
        };
        if name == "maglev_table" {
            resize(&mut map, opts.maglev_size)?;
        }
        if FLOW_TABLES.contains(&name.as_str()) {
            resize(&mut map, opts.flow_table_size)?;
        }
        if map.map_flags() & libbpf_sys::BPF_F_NO_COMMON_LRU != 0 {
            let n = per_cpu_lru_entries(map.max_entries(), cpus);
            if n != map.max_entries() {
                resize(&mut map, n)?;
            }
        }
        let pin = opts.pin_dir.join(&name);
        check_pinned_def(&map, &name, &pin, pinned_version)?;
        map.set_pin_path(&pin)
            .map_err(|e| DataplaneError::load(format!("pin path for {name}: {e}")))?;
    }
    Ok(())
}

/// Whether the object declares the map pinned by name (libbpf gives such
/// a map its pin path when it opens the object).
fn declared_pinned(map: &libbpf_rs::OpenMapMut<'_>) -> bool {
    // SAFETY: the pointer is the open object's live map; libbpf returns a
    // string it owns or NULL, and nothing is kept.
    !unsafe { libbpf_sys::bpf_map__pin_path(map.as_libbpf_object().as_ptr()) }.is_null()
}

/// A map's definition as the kernel compares it when libbpf reuses a pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MapDef {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
}

/// The definition of the map pinned at `pin`, if something is pinned there.
fn pinned_def(pin: &Path) -> Result<Option<MapDef>, DataplaneError> {
    let Some(fd) = open_pin(pin)? else {
        return Ok(None);
    };
    let mut info = libbpf_sys::bpf_map_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_map_info>() as u32;
    // SAFETY: valid fd, buffer and length.
    let rc = unsafe { libbpf_sys::bpf_map_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len) };
    if rc < 0 {
        return Err(DataplaneError::load(format!(
            "{} is pinned but is not a readable map: {}",
            pin.display(),
            std::io::Error::from_raw_os_error(-rc)
        )));
    }
    Ok(Some(MapDef {
        map_type: info.type_,
        key_size: info.key_size,
        value_size: info.value_size,
        max_entries: info.max_entries,
        flags: info.map_flags,
    }))
}

fn open_pin(pin: &Path) -> Result<Option<OwnedFd>, DataplaneError> {
    if !pin.exists() {
        return Ok(None);
    }
    let c = CString::new(pin.as_os_str().as_encoded_bytes())
        .map_err(|_| DataplaneError::load(format!("pin path {} has a NUL", pin.display())))?;
    // SAFETY: NUL-terminated path; the return is a new fd or -errno.
    let rc = unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) };
    if rc < 0 {
        return Err(DataplaneError::load(format!(
            "opening {}: {}",
            pin.display(),
            std::io::Error::from_raw_os_error(-rc)
        )));
    }
    // SAFETY: rc is a fresh fd we own.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(rc) }))
}

/// Before libbpf reuses a pinned map, check that it can: libbpf's own
/// check fails with a bare "couldn't reuse pinned map: parameter
/// mismatch", and a map missing from a complete pinned set would be
/// created empty beside maps that hold live flows (half-migrated). Either
/// way nothing has been created or written yet when this fails.
fn check_pinned_def(
    map: &libbpf_rs::OpenMapMut<'_>,
    name: &str,
    pin: &Path,
    pinned_version: Option<u32>,
) -> Result<(), DataplaneError> {
    let want = MapDef {
        map_type: u32::from(map.map_type()),
        key_size: map.key_size(),
        value_size: map.value_size(),
        max_entries: map.max_entries(),
        flags: map.map_flags(),
    };
    let from_v2 = pinned_version == Some(2);
    let Some(have) = pinned_def(pin)? else {
        let created_by_upgrade = pinned_version
            .filter(|v| upgradable(Some(*v)))
            .is_some_and(|v| created_upgrading_from(v).contains(&name));
        if pinned_version.is_some() && !created_by_upgrade {
            return Err(DataplaneError::PinnedMapMissing {
                map: name.to_string(),
                pin_dir: pin.parent().unwrap_or(pin).display().to_string(),
            });
        }
        return Ok(());
    };
    if from_v2 && REPLACED_IN_V3.contains(&name) && have != want {
        return Ok(());
    }
    let fields = [
        ("type", have.map_type, want.map_type),
        ("key size", have.key_size, want.key_size),
        ("value size", have.value_size, want.value_size),
        ("max entries", have.max_entries, want.max_entries),
        ("flags", have.flags, want.flags),
    ];
    for (field, pinned, binary) in fields {
        if pinned != binary {
            let hint = if name == "maglev_table" && field == "max entries" {
                format!(
                    " (the pinned Maglev table has {pinned} slots: start with -maglev-size {pinned}, \
                     or migrate to {binary})"
                )
            } else if FLOW_TABLES.contains(&name) && field == "max entries" {
                format!(
                    " (the pinned flow tables have {pinned} entries: start with \
                     -flow-table-size {pinned}, or migrate to {binary})"
                )
            } else {
                String::new()
            };
            return Err(DataplaneError::PinnedMapMismatch {
                map: name.to_string(),
                field,
                pinned,
                binary,
                hint,
            });
        }
    }
    Ok(())
}

/// The layout version recorded in the pinned meta_map, if a complete
/// pinned set is there (None: nothing pinned yet, or a first start that
/// never finished). `abi_version` is rv_meta's first field in every
/// layout, so it reads whatever the value size.
pub fn pinned_abi_version(pin_dir: &Path) -> Result<Option<u32>, DataplaneError> {
    let pin = pin_dir.join("meta_map");
    let Some(def) = pinned_def(&pin)? else {
        return Ok(None);
    };
    let Some(fd) = open_pin(&pin)? else {
        return Ok(None);
    };
    let mut buf = vec![0u8; def.value_size.max(4) as usize];
    let key = 0u32;
    // SAFETY: valid map fd; key is 4 bytes (meta_map's key in every
    // layout) and buf holds the map's whole value.
    let rc = unsafe {
        libbpf_sys::bpf_map_lookup_elem(
            fd.as_raw_fd(),
            (&key as *const u32).cast(),
            buf.as_mut_ptr().cast(),
        )
    };
    if rc < 0 {
        return Err(DataplaneError::load(format!(
            "reading {}: {}",
            pin.display(),
            std::io::Error::from_raw_os_error(-rc)
        )));
    }
    let v = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    Ok((v != 0).then_some(v))
}

/// This binary's layout, or the one it upgrades in place; anything else is
/// refused before anything is touched.
fn check_version(pinned: Option<u32>) -> Result<(), DataplaneError> {
    match pinned {
        Some(v) if v != abi::ABI_VERSION && !upgradable(Some(v)) => {
            Err(DataplaneError::AbiMismatch {
                pinned: v,
                binary: abi::ABI_VERSION,
            })
        }
        _ => Ok(()),
    }
}

/// Layout 2 or 3 to this one, in place: the maps 3 made larger and which
/// hold counters only are unpinned (from 2), so that the load creates them
/// anew (programs still running from the old ones keep theirs until the
/// swap); the maps later layouts added are created by the load; meta_map
/// is rewritten after it. Every map that holds flows or VIPs keeps its pin
/// and its entries.
fn upgrade_in_place(pin_dir: &Path, from: u32) -> Result<(), DataplaneError> {
    if from >= 3 {
        return Ok(());
    }
    for name in REPLACED_IN_V3 {
        let pin = pin_dir.join(name);
        match fs::remove_file(&pin) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(DataplaneError::load(format!(
                    "unpinning {} to upgrade it: {e}",
                    pin.display()
                )))
            }
        }
    }
    Ok(())
}

/// Mount bpffs at /sys/fs/bpf if nothing is mounted there yet.
pub fn ensure_bpffs() -> Result<(), DataplaneError> {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf"))
    {
        return Ok(());
    }
    fs::create_dir_all("/sys/fs/bpf")
        .map_err(|e| DataplaneError::load(format!("mkdir /sys/fs/bpf: {e}")))?;
    nix::mount::mount(
        Some("bpffs"),
        "/sys/fs/bpf",
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| {
        DataplaneError::load(format!(
            "mounting bpffs at /sys/fs/bpf: {}",
            std::io::Error::from(e)
        ))
    })
}

impl Datapath {
    /// The checks `load` makes before it touches anything (layout version,
    /// every pinned map's definition), without loading: after this, the
    /// pinned maps can be read with this binary's layout while the
    /// verifier runs. Parses the objects only (a few ms).
    pub fn preflight(opts: &LoadOptions) -> Result<(), DataplaneError> {
        check_flow_table_size(u64::from(opts.flow_table_size))?;
        let pinned_version = pinned_abi_version(&opts.pin_dir)?;
        check_version(pinned_version)?;
        let mut storage = MaybeUninit::uninit();
        let mut open = XdpIngressSkelBuilder::default()
            .open(&mut storage)
            .map_err(|e| DataplaneError::load(format!("opening xdp_ingress: {e}")))?;
        pin_maps(open.open_object_mut().maps_mut(), opts, pinned_version)?;
        drop(open);
        let mut storage = MaybeUninit::uninit();
        let mut open = TcNatSkelBuilder::default()
            .open(&mut storage)
            .map_err(|e| DataplaneError::load(format!("opening tc_nat: {e}")))?;
        pin_maps(open.open_object_mut().maps_mut(), opts, pinned_version)?;
        Ok(())
    }

    pub fn load(opts: &LoadOptions) -> Result<Self, DataplaneError> {
        check_flow_table_size(u64::from(opts.flow_table_size))?;
        if opts.pin_dir.starts_with("/sys/fs/bpf") {
            ensure_bpffs()?;
        }
        fs::create_dir_all(&opts.pin_dir).map_err(|e| {
            DataplaneError::load(format!("creating {}: {e}", opts.pin_dir.display()))
        })?;

        // The layout version first: a binary that cannot use the pinned
        // maps stops here, before libbpf creates, pins or writes anything.
        let pinned_version = pinned_abi_version(&opts.pin_dir)?;
        check_version(pinned_version)?;
        if let Some(v) = pinned_version.filter(|v| upgradable(Some(*v))) {
            // Every pin checked first (a map of another size, a missing
            // one), so that a set this binary cannot take is left whole.
            Self::preflight(opts)?;
            upgrade_in_place(&opts.pin_dir, v)?;
        }

        let xdp = Owned::load(|storage| {
            let mut open = XdpIngressSkelBuilder::default()
                .open(storage)
                .map_err(|e| DataplaneError::load(format!("opening xdp_ingress: {e}")))?;
            pin_maps(open.open_object_mut().maps_mut(), opts, pinned_version)?;
            open.load()
                .map_err(|e| DataplaneError::load(format!("loading xdp_ingress: {e}")))
        })?;

        let tc = Owned::load(|storage| {
            let mut open = TcNatSkelBuilder::default()
                .open(storage)
                .map_err(|e| DataplaneError::load(format!("opening tc_nat: {e}")))?;
            pin_maps(open.open_object_mut().maps_mut(), opts, pinned_version)?;
            open.load()
                .map_err(|e| DataplaneError::load(format!("loading tc_nat: {e}")))
        })?;

        let dp = Self {
            xdp,
            tc,
            pin_dir: opts.pin_dir.clone(),
        };
        dp.check_meta(opts)?;
        Ok(dp)
    }

    /// The maps remember which layout and table size wrote them; a binary
    /// that disagrees must not write into them.
    fn check_meta(&self, opts: &LoadOptions) -> Result<(), DataplaneError> {
        let xdp = self.xdp();
        let meta = &xdp.maps.meta_map;
        let key = 0u32.to_ne_bytes();
        let cur = meta
            .lookup(&key, libbpf_rs::MapFlags::ANY)
            .map_err(|e| DataplaneError::load(format!("reading meta_map: {e}")))?
            .unwrap_or_default();
        let mut m = abi::rv_meta::default();
        if cur.len() == std::mem::size_of::<abi::rv_meta>() {
            m.abi_version = u32::from_ne_bytes(cur[0..4].try_into().expect("4 bytes"));
            m.maglev_size = u32::from_ne_bytes(cur[4..8].try_into().expect("4 bytes"));
        }
        if m.abi_version == 0 {
            let mut v = Vec::with_capacity(8);
            v.extend_from_slice(&abi::ABI_VERSION.to_ne_bytes());
            v.extend_from_slice(&opts.maglev_size.to_ne_bytes());
            meta.update(&key, &v, libbpf_rs::MapFlags::ANY)
                .map_err(|e| DataplaneError::load(format!("writing meta_map: {e}")))?;
            return Ok(());
        }
        if upgradable(Some(m.abi_version)) {
            // Upgraded in place: the new maps exist and are pinned now.
            let mut v = Vec::with_capacity(8);
            v.extend_from_slice(&abi::ABI_VERSION.to_ne_bytes());
            v.extend_from_slice(&m.maglev_size.to_ne_bytes());
            meta.update(&key, &v, libbpf_rs::MapFlags::ANY)
                .map_err(|e| DataplaneError::load(format!("writing meta_map: {e}")))?;
            return Ok(());
        }
        if m.abi_version != abi::ABI_VERSION {
            return Err(DataplaneError::AbiMismatch {
                pinned: m.abi_version,
                binary: abi::ABI_VERSION,
            });
        }
        Ok(())
    }

    pub fn xdp(&self) -> &XdpIngressSkel<'static> {
        self.xdp.get()
    }

    pub fn tc(&self) -> &TcNatSkel<'static> {
        self.tc.get()
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Entries in each per-flow table as loaded (the kernel's figure:
    /// the requested size rounded up to a multiple of the possible CPUs).
    pub fn flow_table_size(&self) -> u32 {
        self.xdp().maps.connection_affinity_map.max_entries()
    }

    /// Slots in the shared Maglev table as loaded.
    pub fn maglev_size(&self) -> u32 {
        self.xdp().maps.maglev_table.max_entries()
    }

    /// The flow entries each CPU keeps (the lists are per CPU).
    pub fn flow_table_per_cpu(&self) -> Result<u32, DataplaneError> {
        Ok(self.flow_table_size() / possible_cpus()?)
    }

    /// Remove every pin under the directory (the maps then live only as
    /// long as something holds them).
    pub fn unpin_all(pin_dir: &Path) -> std::io::Result<()> {
        match fs::remove_dir_all(pin_dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_lru_entries_round_as_the_kernel_does() {
        // A multiple of the CPUs stays; anything else goes up to the next.
        assert_eq!(per_cpu_lru_entries(131_072, 2), 131_072);
        assert_eq!(per_cpu_lru_entries(131_072, 6), 131_076);
        assert_eq!(per_cpu_lru_entries(16_384, 96), 16_416);
        assert_eq!(per_cpu_lru_entries(4_096, 8_192), 8_192);
        assert_eq!(per_cpu_lru_entries(100_001, 1), 100_001);
        // Down where up would overflow (htab_map_alloc's rounddown).
        assert_eq!(per_cpu_lru_entries(u32::MAX, 6), u32::MAX - u32::MAX % 6);
    }

    #[test]
    fn flow_table_size_bounds() {
        assert_eq!(
            check_flow_table_size(u64::from(abi::FLOW_TABLE_DEFAULT_SIZE)).unwrap(),
            131_072
        );
        assert_eq!(check_flow_table_size(4_096).unwrap(), 4_096);
        assert_eq!(check_flow_table_size(16_777_216).unwrap(), 16_777_216);
        for bad in [0, 4_095, 16_777_217, u64::from(u32::MAX) + 1] {
            let e = check_flow_table_size(bad).unwrap_err().to_string();
            assert!(
                e.contains(&bad.to_string()) && e.contains("4096") && e.contains("16777216"),
                "{e}"
            );
        }
    }
}
