//! The HTTP API (warp) on a Unix socket and optionally TCP, and the metrics
//! endpoint.
//!
//! Every route first matches its path and then its method, so an unknown
//! path is a 404 and a known path with the wrong method a 405 (warp prefers
//! the most specific rejection). Once a route has matched, the handler
//! always answers: a malformed request gets its 4xx with an [`ApiError`]
//! body and never reaches the state's write methods.

use std::convert::Infallible;
use std::fs;
use std::io::{self, Read as _};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use warp::filters::BoxedFilter;
use warp::http::{header, HeaderMap, HeaderValue, StatusCode};
use warp::path::Tail;
use warp::reply::Response;
use warp::{Filter, Rejection, Reply};

use crate::error::ApiRequestError;
use crate::listener::{self, ConnCount, ConnLimits};
use crate::state::ApiState;
use crate::types::{DrainRequest, DrainSpec, ReloadRequest, VipName};

pub const DEFAULT_SOCKET_PATH: &str = "/run/rivora/rivorad.sock";
/// The largest request body accepted. A drain request is well under 1 KiB;
/// the margin is for long VIP names, not for payloads.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 16 * 1024;
/// Content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The Unix socket; its directory is created if missing.
    pub socket_path: PathBuf,
    /// An extra TCP listener; it always requires the bearer token.
    pub tcp: Option<TcpApiConfig>,
    pub max_body_bytes: u64,
    /// Applied to the Unix socket and to the TCP listener, each with its
    /// own connection count.
    pub limits: ConnLimits,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            socket_path: PathBuf::from(DEFAULT_SOCKET_PATH),
            tcp: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            limits: ConnLimits::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TcpApiConfig {
    pub addr: SocketAddr,
    /// Holds the bearer token; surrounding whitespace is ignored. It must
    /// be a regular file that neither group nor others can read or write.
    pub token_file: PathBuf,
}

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("creating socket directory {path}: {source}")]
    SocketDir { path: PathBuf, source: io::Error },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("another process is already serving on {path}")]
    SocketInUse { path: PathBuf },
    #[error("removing stale socket {path}: {source}")]
    RemoveStale { path: PathBuf, source: io::Error },
    #[error("binding Unix socket {path}: {source}")]
    BindUnix { path: PathBuf, source: io::Error },
    #[error("binding TCP {addr}: {source}")]
    BindTcp { addr: SocketAddr, source: io::Error },
    #[error("cannot read API token file {path}: {error}")]
    TokenFile { path: PathBuf, error: io::Error },
    #[error("API token file {path} is empty: refusing to serve TCP without a token")]
    TokenEmpty { path: PathBuf },
    #[error(
        "API token file {path} has mode {mode:04o}: group and others must not read or write it \
         (chmod 600 {path})"
    )]
    TokenFileMode { path: PathBuf, mode: u32 },
    #[error("API token file {path} is not a regular file")]
    TokenNotAFile { path: PathBuf },
    #[error("API token file {path} is larger than {limit} bytes")]
    TokenTooLarge { path: PathBuf, limit: u64 },
}

/// A token is a line of text; anything larger is not a token file.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// A bearer token, compared in constant time and never printed.
#[derive(Clone)]
pub struct BearerToken(Arc<[u8]>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl BearerToken {
    /// Reads the token, refusing a file that others could read (the token
    /// would be theirs) or write (the token would be theirs to choose).
    /// Mode and content come from the same open file, so a swap between
    /// the check and the read cannot slip past.
    pub fn from_file(path: &Path) -> Result<Self, ServeError> {
        let read_err = |error| ServeError::TokenFile {
            path: path.to_path_buf(),
            error,
        };
        let file = fs::File::open(path).map_err(read_err)?;
        let md = file.metadata().map_err(read_err)?;
        if !md.is_file() {
            return Err(ServeError::TokenNotAFile {
                path: path.to_path_buf(),
            });
        }
        let mode = md.mode() & 0o7777;
        if mode & 0o066 != 0 {
            return Err(ServeError::TokenFileMode {
                path: path.to_path_buf(),
                mode,
            });
        }
        let mut raw = Vec::new();
        file.take(MAX_TOKEN_FILE_BYTES + 1)
            .read_to_end(&mut raw)
            .map_err(read_err)?;
        if raw.len() as u64 > MAX_TOKEN_FILE_BYTES {
            return Err(ServeError::TokenTooLarge {
                path: path.to_path_buf(),
                limit: MAX_TOKEN_FILE_BYTES,
            });
        }
        let token = raw.trim_ascii();
        if token.is_empty() {
            return Err(ServeError::TokenEmpty {
                path: path.to_path_buf(),
            });
        }
        Ok(Self(token.into()))
    }

    /// Whether `candidate` is the token. The time taken depends only on the
    /// token's length, not on where a wrong guess first differs.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        let expected = &self.0;
        let mut diff = (expected.len() ^ candidate.len()) as u64;
        for (i, e) in expected.iter().enumerate() {
            let c = candidate.get(i).copied().unwrap_or(0);
            diff |= u64::from(e ^ c);
        }
        std::hint::black_box(diff) == 0
    }
}

/// Running listeners. `shutdown` stops accepting, lets requests in flight
/// finish and removes the Unix socket. Dropping the handle shuts down too,
/// so a server cannot outlive the daemon part that owns it.
#[derive(Debug)]
pub struct ServerHandle {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    counts: Vec<ConnCount>,
    tcp_addr: Option<SocketAddr>,
    socket_path: Option<PathBuf>,
}

impl ServerHandle {
    /// Connections open now, over all of this handle's listeners.
    pub fn open_connections(&self) -> usize {
        self.counts.iter().map(ConnCount::open).sum()
    }

    /// The bound TCP address (useful with port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    pub fn socket_path(&self) -> Option<&Path> {
        self.socket_path.as_deref()
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Binds the Unix socket (and the TCP listener, if configured) and serves
/// the API on the current tokio runtime. Fails without serving anything if
/// any listener cannot be set up, including a missing or empty token file.
pub async fn serve_api<S: ApiState>(
    config: ApiConfig,
    state: Arc<S>,
) -> Result<ServerHandle, ServeError> {
    // Everything that can fail happens before the first task is spawned.
    let tcp = match &config.tcp {
        Some(tcp) => {
            let token = BearerToken::from_file(&tcp.token_file)?;
            let listener =
                TcpListener::bind(tcp.addr)
                    .await
                    .map_err(|source| ServeError::BindTcp {
                        addr: tcp.addr,
                        source,
                    })?;
            let addr = listener
                .local_addr()
                .map_err(|source| ServeError::BindTcp {
                    addr: tcp.addr,
                    source,
                })?;
            Some((listener, addr, token))
        }
        None => None,
    };
    let (unix, identity) = bind_unix_socket(&config.socket_path)?;

    let (stop, rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut counts = Vec::new();

    let routes = api_routes(state.clone(), config.max_body_bytes);
    let (unix_task, count) = listener::spawn(unix, routes, config.limits, rx.clone(), "unix");
    counts.push(count);
    let socket_path = config.socket_path.clone();
    tasks.push(tokio::spawn(async move {
        let _ = unix_task.await;
        remove_socket_if_ours(&socket_path, identity);
    }));

    let mut tcp_addr = None;
    if let Some((listener, addr, token)) = tcp {
        tcp_addr = Some(addr);
        let routes = authenticated(token)
            .and(api_routes(state, config.max_body_bytes))
            .recover(recover)
            .unify()
            .boxed();
        let (task, count) = listener::spawn(listener, routes, config.limits, rx, "tcp");
        tasks.push(task);
        counts.push(count);
    }
    tracing::info!(
        socket = %config.socket_path.display(),
        tcp = ?tcp_addr,
        limits = ?config.limits,
        "API listening"
    );

    Ok(ServerHandle {
        stop,
        tasks,
        counts,
        tcp_addr,
        socket_path: Some(config.socket_path),
    })
}

/// Serves `GET /metrics` on its own TCP address, without authentication
/// (as Prometheus scrapes expect); keep it on a trusted network. Limits
/// are [`ConnLimits::METRICS`].
pub async fn serve_metrics<S: ApiState>(
    addr: SocketAddr,
    state: Arc<S>,
) -> Result<ServerHandle, ServeError> {
    serve_metrics_with(addr, state, ConnLimits::METRICS).await
}

/// [`serve_metrics`] with other limits.
pub async fn serve_metrics_with<S: ApiState>(
    addr: SocketAddr,
    state: Arc<S>,
    limits: ConnLimits,
) -> Result<ServerHandle, ServeError> {
    serve_routes(addr, metrics_routes(state), limits, "metrics").await
}

/// Any routes on a TCP listener with the same bounded connections as the
/// API's (rivora-controller's metrics and health endpoints use it).
pub async fn serve_routes(
    addr: SocketAddr,
    routes: BoxedFilter<(Response,)>,
    limits: ConnLimits,
    name: &'static str,
) -> Result<ServerHandle, ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::BindTcp { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::BindTcp { addr, source })?;
    let (stop, rx) = watch::channel(false);
    let (task, count) = listener::spawn(listener, routes, limits, rx, name);
    tracing::info!(addr = %bound, ?limits, "{name} listening");
    Ok(ServerHandle {
        stop,
        tasks: vec![task],
        counts: vec![count],
        tcp_addr: Some(bound),
        socket_path: None,
    })
}

/// The file identity of the socket we bound, so shutdown never removes a
/// socket another daemon has since put at the same path.
type SocketIdentity = (u64, u64);

fn bind_unix_socket(path: &Path) -> Result<(UnixListener, SocketIdentity), ServeError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .map_err(|source| ServeError::SocketDir {
            path: dir.clone(),
            source,
        })?;

    match fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            // A socket nobody answers on is left over from a crash.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::SocketInUse {
                    path: path.to_path_buf(),
                });
            }
            fs::remove_file(path).map_err(|source| ServeError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(_) => {
            return Err(ServeError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ServeError::BindUnix {
                path: path.to_path_buf(),
                source,
            })
        }
    }

    // bind() creates the socket with the process umask, and a client that
    // connects before a later chmod stays connected. So bind inside a
    // private 0700 directory (nobody else can reach the socket there), make
    // the socket 0600, then rename it into place.
    let bind_err = |source| ServeError::BindUnix {
        path: path.to_path_buf(),
        source,
    };
    let private = dir.join(format!(".rivorad-bind.{}", std::process::id()));
    let _ = fs::remove_dir_all(&private);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(bind_err)?;
    let staged = private.join("sock");
    let result = (|| {
        let listener = std::os::unix::net::UnixListener::bind(&staged)?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(0o600))?;
        fs::rename(&staged, path)?;
        listener.set_nonblocking(true)?;
        let md = fs::symlink_metadata(path)?;
        Ok::<_, io::Error>((listener, (md.dev(), md.ino())))
    })();
    let _ = fs::remove_dir_all(&private);
    let (listener, identity) = result.map_err(bind_err)?;
    let listener = UnixListener::from_std(listener).map_err(bind_err)?;
    Ok((listener, identity))
}

fn remove_socket_if_ours(path: &Path, identity: SocketIdentity) {
    if let Ok(md) = fs::symlink_metadata(path) {
        if (md.dev(), md.ino()) == identity {
            if let Err(e) = fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e, "removing API socket");
            }
        }
    }
}

/// A rejection carrying our own error, turned into JSON by [`recover`].
#[derive(Debug)]
struct Reject(ApiRequestError);

impl warp::reject::Reject for Reject {}

fn reject(e: ApiRequestError) -> Rejection {
    warp::reject::custom(Reject(e))
}

fn error_response(e: &ApiRequestError) -> Response {
    let mut res =
        warp::reply::with_status(warp::reply::json(&e.body()), e.status()).into_response();
    if matches!(e, ApiRequestError::Unauthorized) {
        res.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    res
}

fn respond<T: Serialize>(result: Result<T, ApiRequestError>) -> Response {
    match result {
        Ok(v) => warp::reply::json(&v).into_response(),
        Err(e) => {
            if e.status().is_server_error() {
                tracing::warn!(error = %e, "API request failed");
            }
            error_response(&e)
        }
    }
}

async fn recover(err: Rejection) -> Result<Response, Infallible> {
    let e = if let Some(Reject(e)) = err.find::<Reject>() {
        e.clone()
    } else if err.find::<warp::reject::MethodNotAllowed>().is_some() {
        ApiRequestError::MethodNotAllowed
    } else if err.is_not_found() {
        ApiRequestError::NoRoute
    } else {
        // warp's remaining rejections are all about malformed headers or
        // bodies, i.e. the client's doing.
        ApiRequestError::InvalidBody {
            reason: format!("{err:?}"),
        }
    };
    Ok(error_response(&e))
}

fn authenticated(token: BearerToken) -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::header::headers_cloned()
        .and_then(move |headers: HeaderMap| {
            let token = token.clone();
            async move {
                let presented = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| bearer_credentials(v.as_bytes()));
                match presented {
                    Some(t) if token.matches(t) => Ok(()),
                    _ => Err(reject(ApiRequestError::Unauthorized)),
                }
            }
        })
        .untuple_one()
}

/// The token in an `Authorization` value: the scheme is case-insensitive
/// and followed by one or more spaces (RFC 7235 section 2.1).
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

/// Reads the body up to `limit` bytes. A declared length over the limit is
/// refused before anything is read; a body without a length (chunked) is
/// refused because it could not be bounded up front.
fn limited_body(limit: u64) -> impl Filter<Extract = (Bytes,), Error = Rejection> + Clone {
    warp::header::headers_cloned()
        .and_then(move |headers: HeaderMap| async move {
            let length = match headers.get(header::CONTENT_LENGTH) {
                None => None,
                Some(v) => Some(
                    v.to_str()
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .ok_or_else(|| {
                            reject(ApiRequestError::InvalidBody {
                                reason: "unparsable Content-Length".into(),
                            })
                        })?,
                ),
            };
            match length {
                Some(n) if n > limit => Err(reject(ApiRequestError::PayloadTooLarge { limit })),
                None if headers.contains_key(header::TRANSFER_ENCODING) => {
                    Err(reject(ApiRequestError::LengthRequired))
                }
                _ => Ok(()),
            }
        })
        .untuple_one()
        .and(warp::body::bytes())
}

fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiRequestError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiRequestError::InvalidBody {
            reason: "empty body, expected a JSON object".into(),
        });
    }
    serde_json::from_slice(body).map_err(|e| ApiRequestError::InvalidBody {
        reason: e.to_string(),
    })
}

fn parse_drain(body: &[u8]) -> Result<DrainSpec, ApiRequestError> {
    parse_json::<DrainRequest>(body)?.validate()
}

/// The API routes with JSON errors, for the Unix socket as they are and
/// behind [`authenticated`] for TCP. Public so the daemon's tests can drive
/// them with `warp::test`.
pub fn api_routes<S: ApiState>(state: Arc<S>, max_body_bytes: u64) -> BoxedFilter<(Response,)> {
    let st = warp::any().map(move || state.clone());

    let status = warp::path!("v1" / "status")
        .and(warp::get())
        .and(st.clone())
        .then(|s: Arc<S>| async move { respond(s.status().await) });

    let vips = warp::path!("v1" / "vips")
        .and(warp::get())
        .and(st.clone())
        .then(|s: Arc<S>| async move { respond(s.vips().await) });

    // The tail, not a single segment: `tcp/10.0.0.1:80` has a slash, which
    // a client may or may not have percent-encoded.
    let vip = warp::path("v1")
        .and(warp::path("vips"))
        .and(warp::path::tail())
        .and_then(|tail: Tail| async move {
            if tail.as_str().is_empty() {
                Err(warp::reject::not_found())
            } else {
                Ok(tail)
            }
        })
        .and(warp::get())
        .and(st.clone())
        .then(|tail: Tail, s: Arc<S>| async move {
            let name = match percent_encoding::percent_decode_str(tail.as_str()).decode_utf8() {
                Ok(n) => n.into_owned(),
                Err(_) => {
                    return error_response(&ApiRequestError::InvalidVip {
                        input: tail.as_str().to_string(),
                        reason: "not UTF-8 after percent-decoding",
                    })
                }
            };
            let result = async {
                let parsed: VipName = name.parse()?;
                s.vip(&parsed)
                    .await?
                    .ok_or(ApiRequestError::UnknownVip { vip: name.clone() })
            }
            .await;
            respond(result)
        });

    let backends = warp::path!("v1" / "backends")
        .and(warp::get())
        .and(st.clone())
        .then(|s: Arc<S>| async move { respond(s.backends().await) });

    let drops = warp::path!("v1" / "drops")
        .and(warp::get())
        .and(st.clone())
        .then(|s: Arc<S>| async move { respond(s.drops().await) });

    let drain = warp::path!("v1" / "drain")
        .and(warp::post())
        .and(limited_body(max_body_bytes))
        .and(st.clone())
        .then(|body: Bytes, s: Arc<S>| async move {
            let result = async {
                let spec = parse_drain(&body)?;
                tracing::info!(target = %spec.target, vip = ?spec.vip.map(|v| v.to_string()), "drain requested");
                s.drain(&spec).await
            }
            .await;
            respond(result)
        });

    let undrain = warp::path!("v1" / "undrain")
        .and(warp::post())
        .and(limited_body(max_body_bytes))
        .and(st.clone())
        .then(|body: Bytes, s: Arc<S>| async move {
            let result = async {
                let spec = parse_drain(&body)?;
                tracing::info!(target = %spec.target, vip = ?spec.vip.map(|v| v.to_string()), "undrain requested");
                s.undrain(&spec).await
            }
            .await;
            respond(result)
        });

    let bgp_peers = warp::path!("v1" / "bgp" / "peers")
        .and(warp::get())
        .and(st.clone())
        .then(|s: Arc<S>| async move { respond(s.bgp_peers().await) });

    let bgp_routes = warp::path!("v1" / "bgp" / "routes")
        .and(warp::get())
        .and(st.clone())
        .then(|s: Arc<S>| async move { respond(s.bgp_routes().await) });

    let reload = warp::path!("v1" / "reload")
        .and(warp::post())
        .and(limited_body(max_body_bytes))
        .and(st)
        .then(|body: Bytes, s: Arc<S>| async move {
            let result = async {
                // No body is the usual call; `{}` is accepted for clients
                // that always send JSON.
                if !body.iter().all(u8::is_ascii_whitespace) {
                    parse_json::<ReloadRequest>(&body)?;
                }
                tracing::info!("reload requested");
                s.reload().await
            }
            .await;
            respond(result)
        });

    status
        .or(vips)
        .unify()
        .or(vip)
        .unify()
        .or(backends)
        .unify()
        .or(drops)
        .unify()
        .or(drain)
        .unify()
        .or(undrain)
        .unify()
        .or(reload)
        .unify()
        .or(bgp_peers)
        .unify()
        .or(bgp_routes)
        .unify()
        .recover(recover)
        .unify()
        .boxed()
}

/// Why rivorad is not ready to serve, from its status: an interface
/// without its TCX program, or a source whose first full pass is not done
/// (until then its VIPs are not all programmed, and adopted ones are
/// kept). Empty: ready.
pub fn not_ready(status: &crate::types::Status) -> Vec<String> {
    let mut why = Vec::new();
    if status.interfaces.is_empty() {
        why.push("no interface attached".to_string());
    }
    for i in status.interfaces.iter().filter(|i| !i.tc_attached) {
        why.push(format!("{}: tc_nat not attached", i.name));
    }
    for s in status.sources.iter().filter(|s| !s.synced) {
        why.push(format!("source {}: first pass not done", s.kind));
    }
    why
}

/// `GET /metrics`, `/healthz` (the daemon answers) and `/readyz` (200
/// once [`not_ready`] says nothing, else 503 with the reasons: a
/// Kubernetes readiness probe), for [`serve_metrics`]; public for tests.
pub fn metrics_routes<S: ApiState>(state: Arc<S>) -> BoxedFilter<(Response,)> {
    let text = |code: StatusCode, body: String| {
        let mut r = Response::new(body.into());
        *r.status_mut() = code;
        r
    };
    let st = {
        let state = state.clone();
        warp::any().map(move || state.clone())
    };
    let metrics = warp::path!("metrics")
        .and(warp::get())
        .and(st.clone())
        .then(|s: Arc<S>| async move {
            match s.metrics().await {
                Ok(text) => {
                    let mut res = Response::new(text.into());
                    res.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static(METRICS_CONTENT_TYPE),
                    );
                    res
                }
                Err(e) => respond::<()>(Err(e)),
            }
        });
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(move || text(StatusCode::OK, "ok\n".into()));
    let readyz = warp::path!("readyz")
        .and(warp::get())
        .and(st)
        .then(move |s: Arc<S>| async move {
            match s.status().await {
                Ok(status) => {
                    let why = not_ready(&status);
                    if why.is_empty() {
                        text(StatusCode::OK, "ok\n".into())
                    } else {
                        text(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {}\n", why.join("; ")),
                        )
                    }
                }
                Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
            }
        });
    metrics
        .or(healthz)
        .unify()
        .or(readyz)
        .unify()
        .recover(recover)
        .unify()
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        let t = BearerToken(Arc::from(&b"s3cret"[..]));
        assert!(t.matches(b"s3cret"));
        for wrong in [
            &b""[..],
            b"s3cre",
            b"s3cret ",
            b"s3cres",
            b"S3cret",
            b"s3cret\0",
        ] {
            assert!(!t.matches(wrong), "{:?}", String::from_utf8_lossy(wrong));
        }
        assert_eq!(format!("{t:?}"), "BearerToken(<redacted>)");
    }

    #[test]
    fn token_file_is_trimmed_and_must_not_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        fs::write(&p, "  abc\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(BearerToken::from_file(&p).unwrap().matches(b"abc"));
        fs::write(&p, "\n\t ").unwrap();
        assert!(matches!(
            BearerToken::from_file(&p),
            Err(ServeError::TokenEmpty { .. })
        ));
    }

    #[test]
    fn token_file_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        fs::write(&p, "abc\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660] {
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            let err = BearerToken::from_file(&p).unwrap_err();
            assert!(
                matches!(err, ServeError::TokenFileMode { mode: m, .. } if m == mode),
                "{mode:o}: {err:?}"
            );
            let msg = err.to_string();
            assert!(msg.contains(&p.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("{mode:04o}")), "{msg}");
        }
        for mode in [0o600, 0o400] {
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            assert!(
                BearerToken::from_file(&p).unwrap().matches(b"abc"),
                "{mode:o}"
            );
        }
    }

    #[test]
    fn token_file_must_be_a_small_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            BearerToken::from_file(dir.path()),
            Err(ServeError::TokenNotAFile { .. })
        ));
        let p = dir.path().join("big");
        fs::write(&p, "x".repeat(MAX_TOKEN_FILE_BYTES as usize + 1)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            BearerToken::from_file(&p),
            Err(ServeError::TokenTooLarge { .. })
        ));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        for (value, want) in [
            (&b"Bearer abc"[..], Some(&b"abc"[..])),
            (b"bearer abc", Some(b"abc")),
            (b"BEARER   abc ", Some(b"abc")),
            (b"Bearer", None),
            (b"Bearerabc", None),
            (b"Basic abc", None),
            (b"Bearer ", Some(b"")),
        ] {
            assert_eq!(
                bearer_credentials(value),
                want,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }
}
