//! What the reconciler publishes for readers (the API, metrics, and later
//! the speakers and BGP): a snapshot of the dataplane as last applied,
//! replaced whole after every change. Readers hold an `Arc` to one
//! snapshot and never wait for the reconciler.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::dataplane::alloc::Slice;
use crate::dataplane::render::Health;
use crate::dataplane::XdpMode;
use crate::desired::{Conflict, Owner, SourceKind, TrafficPolicy};
use crate::healthcheck::HealthState;
use crate::maglev::SliceNeed;
use crate::model::{Affinity, BackendTarget, Mode, VipKey};

/// A backend's probe, as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStatus {
    /// No active check for this (VIP, backend).
    Disabled,
    /// Checked, no verdict yet.
    Unknown,
    Is(HealthState),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    pub target: BackendTarget,
    /// The port it serves on (its own, or the VIP's for port 0).
    pub service_port: u16,
    pub backend_id: u32,
    /// As written: 0 while drained for this VIP. For an unclaimed VIP
    /// (the maps keep no weights) the Maglev slots it holds in the VIP's
    /// slice: still 0 exactly when no new flow reaches it.
    pub weight: u32,
    pub health: Health,
    /// An operator drain, for every VIP or this one.
    pub drained: bool,
    pub probe: ProbeStatus,
    /// How it is reached: its own mode, else its VIP's.
    pub mode: Mode,
    /// The node it lives behind, when its source says (Kubernetes).
    pub node: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipStatus {
    pub key: VipKey,
    pub name: String,
    /// Who wants it; None for a VIP adopted from the pinned maps that no
    /// source has claimed yet (kept forwarding until every source has
    /// synced, then pruned).
    pub owner: Option<Owner>,
    /// Whether its backends are this node's alone (`externalTrafficPolicy:
    /// Local`): the L2 speaker lets only a node that serves it announce it.
    pub traffic_policy: TrafficPolicy,
    pub svc_id: u32,
    pub slice: Slice,
    pub mode: Mode,
    pub affinity: Affinity,
    /// The clients it admits (None: every one); None for an unclaimed
    /// VIP too, whose ranges are read from its source once claimed.
    pub source_ranges: Option<Vec<crate::source_range::SourceRange>>,
    pub backends: Vec<BackendStatus>,
    /// How big its slice may be, from its weights (docs/datapath.md "Maglev");
    /// None for an unclaimed VIP, whose weights the maps do not keep.
    pub slice_need: Option<SliceNeed>,
}

impl VipStatus {
    /// Its slice is smaller than its weights need: the Maglev table is
    /// too full to give it the precision its weights ask for.
    pub fn reduced_precision(&self) -> bool {
        self.slice_need.is_some_and(|n| self.slice.len < n.need)
    }

    /// Whether a new flow would find a backend: the speakers and BGP
    /// announce only such VIPs.
    pub fn serving(&self) -> bool {
        self.backends
            .iter()
            .any(|b| b.health == Health::Healthy && b.weight > 0)
    }
}

/// One source's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceStatus {
    /// Finished its first full pass.
    pub synced: bool,
    /// Objects it currently owns.
    pub objects: usize,
    /// Updates applied in full.
    pub updates_ok: u64,
    /// Updates refused (invalid input) or not applied in full.
    pub updates_failed: u64,
    /// Unix seconds of the last update, either way.
    pub last_at: u64,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    pub name: String,
    pub ifindex: u32,
    pub xdp_mode: Option<XdpMode>,
}

/// Fixed when the datapath is loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacities {
    pub maglev_size: u32,
    pub flow_table_size: u32,
    pub flow_table_per_cpu: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataplaneStatus {
    /// Applies done (each one a consistent state of the maps).
    pub applies: u64,
    /// VIPs the writer holds as some source wants them, and those adopted
    /// from the pinned maps that no source has claimed yet (`owner`
    /// None), in service id order.
    pub vips: Vec<VipStatus>,
    /// Adopted from the pinned maps and not claimed yet: the unclaimed
    /// entries of `vips`, and leftovers whose match entries no longer
    /// form a VIP (which `vips` cannot list).
    pub unclaimed: usize,
    /// VIPs wanted but not in the maps as wanted, with the reason.
    pub failed: BTreeMap<VipKey, String>,
    pub conflicts: Vec<Conflict>,
    pub sources: BTreeMap<SourceKind, SourceStatus>,
    pub interfaces: Vec<InterfaceInfo>,
    pub capacities: Capacities,
}

/// The publishing side, owned by the reconciler.
pub struct Publisher {
    tx: watch::Sender<Arc<DataplaneStatus>>,
    applying: Arc<AtomicBool>,
}

/// What readers hold: cheap to clone, never blocks on the reconciler.
#[derive(Clone)]
pub struct StatusReader {
    rx: watch::Receiver<Arc<DataplaneStatus>>,
    applying: Arc<AtomicBool>,
}

pub fn channel() -> (Publisher, StatusReader) {
    let (tx, rx) = watch::channel(Arc::new(DataplaneStatus::default()));
    let applying = Arc::new(AtomicBool::new(false));
    (
        Publisher {
            tx,
            applying: applying.clone(),
        },
        StatusReader { rx, applying },
    )
}

impl Publisher {
    pub fn publish(&self, status: DataplaneStatus) {
        self.tx.send_replace(Arc::new(status));
    }

    /// Set while map writes are under way, so a reader can tell that the
    /// snapshot it holds is about to be replaced.
    pub fn set_applying(&self, on: bool) {
        self.applying.store(on, Ordering::Release);
    }
}

impl StatusReader {
    pub fn current(&self) -> Arc<DataplaneStatus> {
        self.rx.borrow().clone()
    }

    pub fn applying(&self) -> bool {
        self.applying.load(Ordering::Acquire)
    }

    /// The reconciler is gone: no snapshot will follow this one.
    pub fn closed(&self) -> bool {
        self.rx.has_changed().is_err()
    }

    /// Wait for the next snapshot (for speakers that react to changes).
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}
