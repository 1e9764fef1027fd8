//! Sources of desired state. A source only says what it wants
//! ([`crate::reconciler::Command::SetDesired`], `Synced`, `SourceFailed`);
//! it never touches the writer or the maps.

pub mod file;
pub mod kubernetes;

/// One watch of a source (Services, EndpointSlices, ...), as the source
/// publishes it for readers (`rivoractl status`, metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchState {
    /// The resource, plural as the API names it (`services`).
    pub resource: &'static str,
    /// Has finished its first full list.
    pub synced: bool,
    /// Objects it holds now.
    pub objects: usize,
    /// Errors since start (each failed list or watch, before a retry).
    pub errors: u64,
    pub last_error: Option<String>,
    /// Unix seconds of the last error (0: none).
    pub last_error_at: u64,
}

/// What a source's watches publish: the current state of each, in a
/// fixed order. Readers clone it out; the source alone writes.
pub type WatchStates = tokio::sync::watch::Receiver<Vec<WatchState>>;
