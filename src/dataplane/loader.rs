//! Loading the BPF objects with every map pinned by name under one
//! directory, so that xdp_ingress, tc_nat, rivorad's writer and a later
//! rivorad all share the same maps.

use std::fs;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, OpenObject};

use crate::abi;
use crate::bpf::tc_nat::{TcNatSkel, TcNatSkelBuilder};
use crate::bpf::xdp_ingress::{XdpIngressSkel, XdpIngressSkelBuilder};
use crate::dataplane::DataplaneError;

/// Where rivorad pins everything by default.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/rivora-lb";

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub pin_dir: PathBuf,
    /// Slots in the shared Maglev table (a prime; 65,537 by default).
    pub maglev_size: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            maglev_size: abi::MAGLEV_DEFAULT_SIZE,
        }
    }
}

/// An owned skeleton: the generated skeleton borrows its object storage,
/// so the storage lives on the heap beside it and is freed after it.
struct Owned<S> {
    skel: Option<S>,
    storage: *mut MaybeUninit<OpenObject>,
}

impl<S> Owned<S> {
    fn storage() -> &'static mut MaybeUninit<OpenObject> {
        // Leaked here, reclaimed in Drop after the skeleton is gone.
        Box::leak(Box::new(MaybeUninit::uninit()))
    }
}

impl<S> Drop for Owned<S> {
    fn drop(&mut self) {
        drop(self.skel.take());
        // SAFETY: `storage` came from Box::leak in `storage()`, and the
        // skeleton that borrowed it was dropped just above.
        unsafe { drop(Box::from_raw(self.storage)) };
    }
}

/// The loaded programs. Maps are reached through [`crate::dataplane::Maps`],
/// which opens the pins; this holds the programs (and keeps the objects,
/// and so the maps, alive).
pub struct Datapath {
    xdp: Owned<XdpIngressSkel<'static>>,
    tc: Owned<TcNatSkel<'static>>,
    pin_dir: PathBuf,
}

// SAFETY: the skeletons hold raw libbpf pointers that are only used
// through &self/&mut self; nothing is shared with another thread.
unsafe impl Send for Datapath {}

fn pin_maps<'a>(
    maps: impl Iterator<Item = libbpf_rs::OpenMapMut<'a>>,
    opts: &LoadOptions,
) -> Result<(), DataplaneError> {
    for mut map in maps {
        let name = map.name().to_string_lossy().into_owned();
        // .rodata and friends belong to one object and are not shared.
        if name.contains('.') {
            continue;
        }
        if name == "maglev_table" {
            map.set_max_entries(opts.maglev_size)
                .map_err(|e| DataplaneError::load(format!("resizing maglev_table: {e}")))?;
        }
        map.set_pin_path(opts.pin_dir.join(&name))
            .map_err(|e| DataplaneError::load(format!("pin path for {name}: {e}")))?;
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
    let src = c"bpffs";
    let target = c"/sys/fs/bpf";
    let fstype = c"bpf";
    // SAFETY: plain mount(2) with NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(DataplaneError::load(format!(
            "mounting bpffs at /sys/fs/bpf: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

impl Datapath {
    pub fn load(opts: &LoadOptions) -> Result<Self, DataplaneError> {
        if opts.pin_dir.starts_with("/sys/fs/bpf") {
            ensure_bpffs()?;
        }
        fs::create_dir_all(&opts.pin_dir).map_err(|e| {
            DataplaneError::load(format!("creating {}: {e}", opts.pin_dir.display()))
        })?;

        let storage = Owned::<()>::storage();
        let storage_ptr: *mut MaybeUninit<OpenObject> = storage;
        let mut open = XdpIngressSkelBuilder::default()
            .open(storage)
            .map_err(|e| DataplaneError::load(format!("opening xdp_ingress: {e}")))?;
        pin_maps(open.open_object_mut().maps_mut(), opts)?;
        let xdp = open
            .load()
            .map_err(|e| DataplaneError::load(format!("loading xdp_ingress: {e}")))?;
        let xdp = Owned {
            skel: Some(xdp),
            storage: storage_ptr,
        };

        let storage = Owned::<()>::storage();
        let storage_ptr: *mut MaybeUninit<OpenObject> = storage;
        let mut open = TcNatSkelBuilder::default()
            .open(storage)
            .map_err(|e| DataplaneError::load(format!("opening tc_nat: {e}")))?;
        pin_maps(open.open_object_mut().maps_mut(), opts)?;
        let tc = open
            .load()
            .map_err(|e| DataplaneError::load(format!("loading tc_nat: {e}")))?;
        let tc = Owned {
            skel: Some(tc),
            storage: storage_ptr,
        };

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
        if m.abi_version != abi::ABI_VERSION {
            return Err(DataplaneError::AbiMismatch {
                pinned: m.abi_version,
                binary: abi::ABI_VERSION,
            });
        }
        Ok(())
    }

    pub fn xdp(&self) -> &XdpIngressSkel<'static> {
        self.xdp.skel.as_ref().expect("skeleton present until drop")
    }

    pub fn tc(&self) -> &TcNatSkel<'static> {
        self.tc.skel.as_ref().expect("skeleton present until drop")
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
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
