//! rivorad's API: the wire types, the [`ApiState`] seam the daemon
//! implements, the warp server (Unix socket, optional TCP with a bearer
//! token, metrics) and the client `rivoractl` uses.
//!
//! Routes (JSON in and out; every error is an [`ApiError`] body):
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/status` | [`Status`] |
//! | `GET /v1/vips` | `[VipInfo]` |
//! | `GET /v1/vips/{vip}` | [`VipInfo`]; `{vip}` is a [`VipName`], percent-encoded or not |
//! | `GET /v1/backends` | `[BackendInfo]` |
//! | `GET /v1/drops` | [`Drops`] |
//! | `POST /v1/drain` | [`DrainRequest`] in, [`DrainOutcome`] out |
//! | `POST /v1/undrain` | [`DrainRequest`] in, [`DrainOutcome`] out |
//! | `POST /v1/reload` | empty body or `{}` in, [`ReloadResult`] out |
//! | `GET /metrics` | Prometheus text, on the separate metrics listener |

pub mod client;
mod error;
mod listener;
pub mod render;
mod server;
mod state;
mod types;

pub use error::ApiRequestError;
pub use listener::ConnLimits;
pub use server::{
    api_routes, metrics_routes, serve_api, serve_metrics, serve_metrics_with, serve_routes,
    ApiConfig, BearerToken, ServeError, ServerHandle, TcpApiConfig, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SOCKET_PATH, METRICS_CONTENT_TYPE,
};
pub use state::ApiState;
pub use types::{
    Affinity, ApiError, BackendHealth, BackendInfo, DrainOutcome, DrainRequest, DrainSpec, Drops,
    InterfaceStatus, L2Group, L2Info, Ports, ProbeState, Proto, ReloadRequest, ReloadResult,
    SourceInfo, Status, VipBackend, VipInfo, VipMode, VipName, WatchInfo, XdpMode,
};
