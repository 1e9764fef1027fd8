//! The dataplane: the only code that touches libbpf-rs and the BPF maps.

pub mod adopt;
pub mod alloc;
pub mod attach;
pub mod dump;
pub mod loader;
pub mod maps;
pub mod render;
pub mod store;
pub mod sweep;
pub mod writer;

#[cfg(test)]
mod tests;

pub use attach::{AttachPoint, AttachedLink, XdpMode};
pub use loader::{
    check_flow_table_size, Datapath, LoadOptions, DEFAULT_PIN_DIR, FLOW_TABLES,
    FLOW_TABLE_MAX_SIZE, FLOW_TABLE_MIN_SIZE,
};
pub use maps::Maps;
pub use store::{MapStore, MemStore};
pub use writer::{Probe, ReconcileReport, Upsert, VipInfo, Writer};

use crate::model::{ModelError, VipKey};

/// What can go wrong below the reconciler. Sources (config, Kubernetes)
/// never see these; the reconciler retries and reports them.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("loading the BPF objects: {0}")]
    Load(String),
    #[error("the pinned maps have layout version {pinned}, this binary expects version {binary}: it cannot reuse them and changed nothing. Migrate with `rivorad -cleanup` (detaches and removes the pinned maps: every established flow is reset), then start this binary (docs/upgrades.md)")]
    AbiMismatch { pinned: u32, binary: u32 },
    #[error(
        "flow table size {size} is out of range: each per-flow table holds {min} to {max} entries"
    )]
    FlowTableSize { size: u64, min: u32, max: u32 },
    #[error("pinned map {map} has {field} {pinned}, this binary expects {binary}{hint}: it cannot reuse the pinned maps and changed nothing. Migrate with `rivorad -cleanup` (resets every flow), then start (docs/upgrades.md)")]
    PinnedMapMismatch {
        map: String,
        field: &'static str,
        pinned: u32,
        binary: u32,
        hint: String,
    },
    #[error("{pin_dir} holds a pinned map set without {map}, which this binary needs (a layout change without a version bump, or a pin removed by hand): it changed nothing. Migrate with `rivorad -cleanup` (resets every flow), then start (docs/upgrades.md)")]
    PinnedMapMissing { map: String, pin_dir: String },
    #[error("attaching {what}: {source}")]
    Attach {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("map {map}: {op}: {source}")]
    Map {
        map: &'static str,
        op: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error(transparent)]
    Invalid(#[from] ModelError),
    #[error("VIP {vip}: all {capacity} service ids are in use")]
    ServiceIdsExhausted { vip: VipKey, capacity: u32 },
    #[error("VIP {vip}: all {capacity} backend ids are in use")]
    BackendIdsExhausted { vip: VipKey, capacity: u32 },
    #[error("full NAT's source {src} needs an entry of fullnat_src_map, whose {capacity} are all in use (one per source address the node sends full NAT from)")]
    FullNatSourcesFull {
        src: std::net::IpAddr,
        capacity: u32,
    },
    #[error("VIP {vip}: no room for a {needed}-slot Maglev slice ({free} slots free, largest run {largest}, even after moving slices)")]
    MaglevTableFull {
        vip: VipKey,
        needed: u32,
        free: u32,
        largest: u32,
    },
    #[error("VIP {vip}: no room in the Maglev table: with the VIPs it holds, the smallest slices and room to rebuild the largest need {needed} slots, over the table's {size} (rivorad -maglev-size)")]
    MaglevNoRoom { vip: VipKey, needed: u64, size: u32 },
    #[error("VIP {vip}: {source}")]
    Vip {
        vip: VipKey,
        #[source]
        source: Box<DataplaneError>,
    },
    #[error("waiting for in-flight datapath runs (membarrier): {0}")]
    GracePeriod(#[source] std::io::Error),
    #[error("slice allocator disagrees with the writer at slot {slice_start} (a bug)")]
    SliceBookkeeping { slice_start: u32 },
}

impl DataplaneError {
    pub(crate) fn load(msg: impl Into<String>) -> Self {
        Self::Load(msg.into())
    }
}
