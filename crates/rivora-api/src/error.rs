//! Errors a request can end in, each with its HTTP status. The state
//! (daemon) returns the domain ones; the server produces the protocol ones.

use std::net::SocketAddr;

use thiserror::Error;
use warp::http::StatusCode;

use crate::types::ApiError;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ApiRequestError {
    // 400: the request itself is wrong; nothing was changed.
    #[error("invalid request body: {reason}")]
    InvalidBody { reason: String },
    #[error("invalid backend target {input:?}: expected addr:port, [v6addr]:port for IPv6")]
    InvalidTarget { input: String },
    #[error("invalid VIP {input:?}: {reason}")]
    InvalidVip { input: String, reason: &'static str },

    // 401: TCP listener only.
    #[error("missing or wrong bearer token")]
    Unauthorized,

    // 404
    #[error("no VIP {vip}")]
    UnknownVip { vip: String },
    #[error("no backend {target}")]
    UnknownBackend { target: SocketAddr },
    #[error("backend {target} does not serve VIP {vip}")]
    BackendNotInVip { target: SocketAddr, vip: String },
    #[error("no such API route")]
    NoRoute,

    #[error("method not allowed")]
    MethodNotAllowed,

    // 409: valid, but the current state forbids it.
    #[error("cannot change drain state of {target}: {reason}")]
    DrainConflict { target: SocketAddr, reason: String },
    #[error("a reload is already in progress")]
    ReloadInProgress,

    #[error("request body needs a Content-Length")]
    LengthRequired,
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: u64 },

    // 422: the request was fine but the file it asked to load is not; the
    // running configuration stays.
    #[error("configuration rejected, running configuration kept: {error}")]
    ConfigInvalid { error: String },

    #[error("internal error: {reason}")]
    Internal { reason: String },
    #[error("the daemon is not ready yet")]
    NotReady,
}

impl ApiRequestError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidBody { .. } | Self::InvalidTarget { .. } | Self::InvalidVip { .. } => {
                StatusCode::BAD_REQUEST
            }
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::UnknownVip { .. }
            | Self::UnknownBackend { .. }
            | Self::BackendNotInVip { .. }
            | Self::NoRoute => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::DrainConflict { .. } | Self::ReloadInProgress => StatusCode::CONFLICT,
            Self::LengthRequired => StatusCode::LENGTH_REQUIRED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ConfigInvalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Self::NotReady => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn body(&self) -> ApiError {
        ApiError {
            error: self.to_string(),
        }
    }
}
