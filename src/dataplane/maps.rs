//! Typed access to the pinned maps. Keys and values are the skeleton's
//! BTF-generated structs; this module turns them into the bytes libbpf
//! wants and back.

use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use libbpf_rs::{MapCore, MapFlags, MapHandle};
use nix::errno::Errno;

use crate::abi::*;
use crate::dataplane::DataplaneError;

/// Plain-old-data ABI types: `repr(C)`, explicit padding, any bit pattern
/// valid. `tests/abi_layout.rs` checks there is no implicit padding.
///
/// # Safety
/// Implement only for the generated ABI structs and integers.
pub unsafe trait Pod: Copy + Default {}

// SAFETY: every type listed is an integer or a struct libbpf-cargo
// generated from `include/rivora/abi.h` (the map keys and values libbpf
// copies in and out as bytes): fixed-width integer fields only, explicit
// padding, so any bit pattern is valid and no byte is uninitialised.
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
    rv_tunnel_ep_key,
    rv_tunnel_ep,
    rv_meta,
    rv_nh_miss,
    rv_nat_owner_key,
    rv_nat_owner6_key,
    rv_nat_owner,
    rv_vip_filter,
    rv_fullnat_config,
    rv_fullnat_src,
    rv_fullnat_key,
    rv_fullnat6_key,
    rv_fullnat_flow,
    rv_fullnat_cursor,
    rv_fullnat_stats,
    rv_fullnat_frag,
    rv_source_range_key,
    rv_source_range6_key,
    rv_source_range,
    rv_source_refused,
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

    pub fn max_entries(&self) -> u32 {
        self.handle.max_entries()
    }

    /// Write many entries in one syscall (BPF_MAP_UPDATE_BATCH). For an
    /// array the entries become visible one by one, in order, like single
    /// updates: callers must not rely on a batch being atomic.
    pub fn put_batch<K: Pod, V: Pod>(
        &self,
        keys: &[K],
        values: &[V],
    ) -> Result<(), DataplaneError> {
        if keys.is_empty() {
            return Ok(());
        }
        debug_assert_eq!(keys.len(), values.len());
        let kb: Vec<u8> = keys
            .iter()
            .flat_map(|k| bytes_of(k).iter().copied())
            .collect();
        let vb: Vec<u8> = values
            .iter()
            .flat_map(|v| bytes_of(v).iter().copied())
            .collect();
        self.handle
            .update_batch(&kb, &vb, keys.len() as u32, MapFlags::ANY, MapFlags::ANY)
            .map_err(|source| DataplaneError::Map {
                map: self.name,
                op: "update batch",
                source,
            })
    }

    /// Every entry, read with BPF_MAP_LOOKUP_BATCH (arrays and hashes).
    /// libbpf-rs's batch iterator ends quietly on an error, which would
    /// make adoption see a partial map, so this calls libbpf directly and
    /// reports every failure.
    pub fn entries<K: Pod, V: Pod>(&self) -> Result<Vec<(K, V)>, DataplaneError> {
        let err = |code: i32| DataplaneError::Map {
            map: self.name,
            op: "lookup batch",
            source: libbpf_rs::Error::from_raw_os_error(code),
        };
        let count = self.handle.max_entries().max(1);
        let mut keys = vec![K::default(); count as usize];
        let mut values = vec![V::default(); count as usize];
        // The batch cursor: a u32 bucket (hash) or key (array); 8 bytes
        // leaves room either way.
        let mut in_batch = [0u64; 1];
        let mut out_batch = [0u64; 1];
        let opts = libbpf_rs::libbpf_sys::bpf_map_batch_opts {
            sz: size_of::<libbpf_rs::libbpf_sys::bpf_map_batch_opts>() as _,
            ..Default::default()
        };
        let mut out = Vec::new();
        let mut first = true;
        loop {
            let mut n = count;
            // SAFETY: keys/values hold `count` elements of the map's key
            // and value sizes (K and V are the map's ABI types); the
            // cursors are 8 bytes, more than the kernel writes.
            let ret = unsafe {
                libbpf_rs::libbpf_sys::bpf_map_lookup_batch(
                    self.handle.as_fd().as_raw_fd(),
                    if first {
                        std::ptr::null_mut()
                    } else {
                        in_batch.as_mut_ptr().cast()
                    },
                    out_batch.as_mut_ptr().cast(),
                    keys.as_mut_ptr().cast(),
                    values.as_mut_ptr().cast(),
                    &mut n,
                    &opts,
                )
            };
            let done = match ret {
                0 => false,
                r if -r == Errno::ENOENT as i32 => true,
                r if -r == Errno::EINTR as i32 => continue,
                r => return Err(err(-r)),
            };
            out.extend(
                keys[..n as usize]
                    .iter()
                    .copied()
                    .zip(values[..n as usize].iter().copied()),
            );
            if done || n == 0 {
                return Ok(out);
            }
            in_batch = out_batch;
            first = false;
        }
    }

    /// Every entry by key walk: for maps without batch operations (LPM
    /// tries). An entry deleted between the walk and its lookup is skipped.
    /// Delete every entry `pred` selects (scrubbing a removed service's
    /// flow state out of the per-flow tables).
    pub fn remove_where<K: Pod, V: Pod>(
        &self,
        pred: impl Fn(&K, &V) -> bool,
    ) -> Result<(), DataplaneError> {
        for (k, v) in self.entries::<K, V>()? {
            if pred(&k, &v) {
                self.remove(&k)?;
            }
        }
        Ok(())
    }

    pub fn entries_by_walk<K: Pod, V: Pod>(&self) -> Result<Vec<(K, V)>, DataplaneError> {
        let mut out = Vec::new();
        for k in self.keys::<K>() {
            if let Some(v) = self.get::<K, V>(&k)? {
                out.push((k, v));
            }
        }
        Ok(out)
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
    nh_miss_map,
    nat_owner_map,
    nat_owner_map6,
    vip_filter_map,
    fullnat_config_map,
    fullnat_src_map,
    fullnat_rev_map,
    fullnat_rev_map6,
    fullnat_cursor_map,
    fullnat_stats_map,
    fullnat_frag_map,
    fullnat_frag_map6,
    tunnel_ep_map,
    source_range_map,
    source_range6_map,
    source_refused_map,
);
