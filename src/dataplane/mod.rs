//! The dataplane: the only code that touches libbpf-rs and the BPF maps.

pub mod attach;
pub mod loader;
pub mod maps;

pub use attach::{AttachPoint, AttachedLink, XdpMode};
pub use loader::{Datapath, LoadOptions, DEFAULT_PIN_DIR};
pub use maps::Maps;

/// What can go wrong below the reconciler. Sources (config, Kubernetes)
/// never see these; the reconciler retries and reports them.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("loading the BPF objects: {0}")]
    Load(String),
    #[error("pinned maps have layout version {pinned}, this binary writes version {binary}: see README \"Upgrading\" for the migration")]
    AbiMismatch { pinned: u32, binary: u32 },
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
}

impl DataplaneError {
    pub(crate) fn load(msg: impl Into<String>) -> Self {
        Self::Load(msg.into())
    }
}
