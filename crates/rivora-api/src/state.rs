//! The one seam between the API and the daemon.

use std::future::Future;

use crate::error::ApiRequestError;
use crate::types::{
    BackendInfo, BgpPeerInfo, BgpRouteInfo, DrainOutcome, DrainSpec, Drops, ReloadResult, Status,
    VipInfo, VipName,
};

/// What rivorad implements for the API server.
///
/// Methods return `Send` futures so a write can hand a command to the
/// reconciler task (the only owner of the dataplane) and await its answer,
/// without blocking a runtime thread. Implementations may write `async fn`.
///
/// The server has already checked the syntax of every argument: the state
/// only answers whether things exist and applies changes. A write must
/// either apply completely or return an error and change nothing.
pub trait ApiState: Send + Sync + 'static {
    fn status(&self) -> impl Future<Output = Result<Status, ApiRequestError>> + Send;

    fn vips(&self) -> impl Future<Output = Result<Vec<VipInfo>, ApiRequestError>> + Send;

    /// `Ok(None)` for a VIP that does not exist: the server answers 404.
    fn vip(
        &self,
        name: &VipName,
    ) -> impl Future<Output = Result<Option<VipInfo>, ApiRequestError>> + Send;

    fn backends(&self) -> impl Future<Output = Result<Vec<BackendInfo>, ApiRequestError>> + Send;

    fn drops(&self) -> impl Future<Output = Result<Drops, ApiRequestError>> + Send;

    /// Marks the backend draining for `spec.vip`, or for every VIP it serves.
    /// Expected errors: `UnknownBackend`, `UnknownVip`, `BackendNotInVip`.
    fn drain(
        &self,
        spec: &DrainSpec,
    ) -> impl Future<Output = Result<DrainOutcome, ApiRequestError>> + Send;

    /// Clears an operator drain. A drain the operator did not set (a
    /// terminating endpoint) is `DrainConflict`.
    fn undrain(
        &self,
        spec: &DrainSpec,
    ) -> impl Future<Output = Result<DrainOutcome, ApiRequestError>> + Send;

    /// Re-reads the configuration file. An invalid file is
    /// `Err(ConfigInvalid)` and leaves the running state as it was.
    fn reload(&self) -> impl Future<Output = Result<ReloadResult, ApiRequestError>> + Send;

    /// The Prometheus text exposition, usually `metrics::Metrics::encode`
    /// of a fresh `MetricsSnapshot`.
    fn metrics(&self) -> impl Future<Output = Result<String, ApiRequestError>> + Send;

    /// This node's BGP sessions (none without a `bgp` section).
    fn bgp_peers(&self) -> impl Future<Output = Result<Vec<BgpPeerInfo>, ApiRequestError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// The routes this node announces.
    fn bgp_routes(
        &self,
    ) -> impl Future<Output = Result<Vec<BgpRouteInfo>, ApiRequestError>> + Send {
        async { Ok(Vec::new()) }
    }
}
