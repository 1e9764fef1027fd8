//! Typed access to the pinned maps. Keys and values are the skeleton's
//! BTF-generated structs; this module turns them into the bytes libbpf
//! wants and back.

use std::mem::size_of;
use std::path::Path;

use libbpf_rs::{MapCore, MapFlags, MapHandle};

use crate::abi::*;
use crate::dataplane::DataplaneError;

/// Plain-old-data ABI types: `repr(C)`, explicit padding, any bit pattern
/// valid. `tests/abi_layout.rs` checks there is no implicit padding.
///
/// # Safety
/// Implement only for the generated ABI structs and integers.
pub unsafe trait Pod: Copy + Default {}

macro_rules! pod {
    ($($t:ty),* $(,)?) => { $(unsafe impl Pod for $t {})* };
}
pod!(
    u32,
    rv_vip_key,
    rv_vip6_key,
    rv_vip_value,
    rv_vip_range_key,
    rv_vip_range6_key,
    rv_service,
    rv_maglev_slot,
    rv_backend,
    rv_backend6,
    rv_backend_health,
    rv_flow_key,
    rv_flow6_key,
    rv_affinity_value,
    rv_nat_key,
    rv_nat6_key,
    rv_nat_value,
    rv_nat6_value,
    rv_frag_key,
    rv_frag6_key,
    rv_frag_value,
    rv_frag_rev_value,
    rv_frag_rev6_value,
    rv_vip_stats,
    rv_drop_stats,
    rv_rl_config,
    rv_rl_key,
    rv_rl6_key,
    rv_rl_bucket,
    rv_iface_mac,
    rv_tunnel_config,
    rv_meta,
);

pub fn bytes_of<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: T is Pod: no implicit padding, so every byte is initialised.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

pub fn from_bytes<T: Pod>(b: &[u8]) -> Option<T> {
    if b.len() != size_of::<T>() {
        return None;
    }
    let mut v = T::default();
    // SAFETY: sizes match and any bit pattern is a valid T.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), (&mut v as *mut T).cast::<u8>(), b.len()) };
    Some(v)
}

/// One pinned map, with the name errors carry.
pub struct PinnedMap {
    pub name: &'static str,
    pub handle: MapHandle,
}

impl PinnedMap {
    fn open(dir: &Path, name: &'static str) -> Result<Self, DataplaneError> {
        let handle =
            MapHandle::from_pinned_path(dir.join(name)).map_err(|source| DataplaneError::Map {
                map: name,
                op: "open pin",
                source,
            })?;
        Ok(Self { name, handle })
    }

    pub fn get<K: Pod, V: Pod>(&self, key: &K) -> Result<Option<V>, DataplaneError> {
        let r = self
            .handle
            .lookup(bytes_of(key), MapFlags::ANY)
            .map_err(|source| DataplaneError::Map {
                map: self.name,
                op: "lookup",
                source,
            })?;
        Ok(r.and_then(|b| from_bytes(&b)))
    }

    pub fn put<K: Pod, V: Pod>(&self, key: &K, value: &V) -> Result<(), DataplaneError> {
        self.handle
            .update(bytes_of(key), bytes_of(value), MapFlags::ANY)
            .map_err(|source| DataplaneError::Map {
                map: self.name,
                op: "update",
                source,
            })
    }

    /// Delete; a missing key is not an error (removal is idempotent).
    pub fn remove<K: Pod>(&self, key: &K) -> Result<(), DataplaneError> {
        match self.handle.delete(bytes_of(key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(DataplaneError::Map {
                map: self.name,
                op: "delete",
                source,
            }),
        }
    }

    pub fn keys<K: Pod>(&self) -> Vec<K> {
        self.handle.keys().filter_map(|k| from_bytes(&k)).collect()
    }

    /// Every CPU's value of a per-CPU map entry.
    pub fn get_percpu<K: Pod, V: Pod>(&self, key: &K) -> Result<Vec<V>, DataplaneError> {
        let r = self
            .handle
            .lookup_percpu(bytes_of(key), MapFlags::ANY)
            .map_err(|source| DataplaneError::Map {
                map: self.name,
                op: "lookup",
                source,
            })?;
        Ok(r.unwrap_or_default()
            .iter()
            .filter_map(|b| from_bytes(b))
            .collect())
    }

    /// Zero a per-CPU entry on every CPU.
    pub fn zero_percpu<K: Pod, V: Pod>(&self, key: &K, ncpus: usize) -> Result<(), DataplaneError> {
        let zero = vec![bytes_of(&V::default()).to_vec(); ncpus];
        self.handle
            .update_percpu(bytes_of(key), &zero, MapFlags::ANY)
            .map_err(|source| DataplaneError::Map {
                map: self.name,
                op: "update",
                source,
            })
    }
}

macro_rules! maps {
    ($($field:ident),* $(,)?) => {
        /// Every pinned map, opened by name.
        pub struct Maps {
            $(pub $field: PinnedMap,)*
        }

        impl Maps {
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            pub fn open(dir: &Path) -> Result<Self, DataplaneError> {
                Ok(Self { $($field: PinnedMap::open(dir, stringify!($field))?,)* })
            }
        }
    };
}

maps!(
    meta_map,
    vip_map,
    vip_map6,
    vip_range_map,
    vip_range_map6,
    service_config_map,
    maglev_table,
    backend_map,
    backend_map6,
    backend_health_map,
    connection_affinity_map,
    connection_affinity_map6,
    nat_reverse_map,
    nat_reverse_map6,
    frag_map,
    frag_map6,
    frag_rev_map,
    frag_rev_map6,
    stats_map,
    drop_stats_map,
    rl_config_map,
    svc_rl_config_map,
    rl_buckets_map,
    rl_buckets_map6,
    iface_mac_map,
    tunnel_config_map,
);
