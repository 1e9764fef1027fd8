//! A small blocking HTTP/1.1 client for rivorad's API, for `rivoractl`.
//!
//! One request per connection (`Connection: close`): a CLI makes a handful
//! of calls, and this keeps the client a page of code with no runtime.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::de::DeserializeOwned;
use thiserror::Error;

use crate::types::{
    ApiError, BackendInfo, DrainOutcome, DrainRequest, Drops, ReloadResult, Status, VipInfo,
};

/// Responses larger than this are refused rather than buffered; a full
/// node (4,096 VIPs, 8,192 backends) answers in a few MiB.
const MAX_RESPONSE_BYTES: u64 = 256 << 20;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp { addr: String, token: String },
}

/// The socket's path or the TCP address, as the user gave it.
impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp { addr, .. } => f.write_str(addr),
        }
    }
}

/// Each message is a whole sentence for the user: the I/O error inside is
/// printed by the message itself and is deliberately not a `source`, so
/// an error chain (`{:#}`) does not print it twice.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The socket file is missing or stale, or the port is closed.
    #[error("no rivorad is listening on {endpoint}")]
    NotListening { endpoint: String },
    #[error("permission denied on {endpoint}{hint}")]
    PermissionDenied { endpoint: String, hint: String },
    #[error("rivorad did not answer within {} on {endpoint}", fmt_secs(*timeout))]
    Timeout { endpoint: String, timeout: Duration },
    /// The connection ended before a response: rivorad stopped, or it
    /// dropped the connection (a timeout of its own, a limit).
    #[error("rivorad closed the connection on {endpoint} without answering")]
    Closed { endpoint: String },
    #[error("cannot connect to rivorad on {endpoint}: {error}")]
    Connect { endpoint: String, error: io::Error },
    #[error("talking to rivorad on {endpoint}: {error}")]
    Io { endpoint: String, error: io::Error },
    #[error("malformed HTTP response from {endpoint}: {reason}")]
    Malformed {
        endpoint: String,
        reason: &'static str,
    },
    /// rivorad answered with an error; `message` is its `ApiError`.
    #[error("{message}")]
    Api { status: u16, message: String },
    #[error("decoding rivorad's answer: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("cannot read token file {path}: {error}")]
    TokenFile { path: PathBuf, error: io::Error },
    #[error("token file {path} is empty")]
    TokenEmpty { path: PathBuf },
}

/// A response as received, before any status check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    timeout: Duration,
}

impl Client {
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Self {
            endpoint: Endpoint::Unix(path.into()),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn tcp(addr: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            endpoint: Endpoint::Tcp {
                addr: addr.into(),
                token: token.into(),
            },
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Reads the token the way the server does: surrounding whitespace
    /// trimmed, empty refused.
    pub fn tcp_with_token_file(addr: impl Into<String>, path: &Path) -> Result<Self, ClientError> {
        let raw = std::fs::read_to_string(path).map_err(|error| ClientError::TokenFile {
            path: path.to_path_buf(),
            error,
        })?;
        let token = raw.trim();
        if token.is_empty() {
            return Err(ClientError::TokenEmpty {
                path: path.to_path_buf(),
            });
        }
        Ok(Self::tcp(addr, token))
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn status(&self) -> Result<Status, ClientError> {
        self.get("/v1/status")
    }

    pub fn vips(&self) -> Result<Vec<VipInfo>, ClientError> {
        self.get("/v1/vips")
    }

    pub fn vip(&self, name: &str) -> Result<VipInfo, ClientError> {
        self.get(&vip_path(name))
    }

    pub fn backends(&self) -> Result<Vec<BackendInfo>, ClientError> {
        self.get("/v1/backends")
    }

    pub fn drops(&self) -> Result<Drops, ClientError> {
        self.get("/v1/drops")
    }

    pub fn drain(&self, req: &DrainRequest) -> Result<DrainOutcome, ClientError> {
        decode(&self.call("POST", "/v1/drain", Some(&serde_json::to_vec(req)?))?)
    }

    pub fn undrain(&self, req: &DrainRequest) -> Result<DrainOutcome, ClientError> {
        decode(&self.call("POST", "/v1/undrain", Some(&serde_json::to_vec(req)?))?)
    }

    pub fn reload(&self) -> Result<ReloadResult, ClientError> {
        decode(&self.call("POST", "/v1/reload", Some(b""))?)
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        decode(&self.call("GET", path, None)?)
    }

    /// Sends a request and returns the body of a 2xx answer; any other
    /// status becomes `ClientError::Api` with the server's message.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Vec<u8>, ClientError> {
        let res = self.request(method, path, body)?;
        if (200..300).contains(&res.status) {
            return Ok(res.body);
        }
        let message = match serde_json::from_slice::<ApiError>(&res.body) {
            Ok(e) => e.error,
            Err(_) => format!(
                "HTTP {}: {}",
                res.status,
                String::from_utf8_lossy(&res.body).trim()
            ),
        };
        Err(ClientError::Api {
            status: res.status,
            message,
        })
    }

    /// One exchange on a fresh connection. `body: Some` sends it with a
    /// Content-Length (also for an empty body, as POST wants one).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<RawResponse, ClientError> {
        let endpoint = self.endpoint.to_string();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: rivoractl/{}\r\n\
             Accept: application/json\r\nConnection: close\r\n",
            env!("CARGO_PKG_VERSION")
        );
        if let Endpoint::Tcp { token, .. } = &self.endpoint {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(b) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body.unwrap_or_default());

        let exchange_err = |e| self.exchange_error(e);
        let raw = match &self.endpoint {
            Endpoint::Unix(p) => {
                let s = UnixStream::connect(p).map_err(|e| self.connect_error(e))?;
                s.set_read_timeout(Some(self.timeout))
                    .map_err(exchange_err)?;
                s.set_write_timeout(Some(self.timeout))
                    .map_err(exchange_err)?;
                exchange(s, &request).map_err(exchange_err)?
            }
            Endpoint::Tcp { addr, .. } => {
                let s = connect_tcp(addr, self.timeout).map_err(|e| self.connect_error(e))?;
                s.set_read_timeout(Some(self.timeout))
                    .map_err(exchange_err)?;
                s.set_write_timeout(Some(self.timeout))
                    .map_err(exchange_err)?;
                exchange(s, &request).map_err(exchange_err)?
            }
        };
        if raw.is_empty() {
            return Err(ClientError::Closed { endpoint });
        }
        parse_response(&raw).map_err(|reason| ClientError::Malformed { endpoint, reason })
    }

    fn connect_error(&self, error: io::Error) -> ClientError {
        let endpoint = self.endpoint.to_string();
        match error.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                ClientError::NotListening { endpoint }
            }
            io::ErrorKind::PermissionDenied => ClientError::PermissionDenied {
                endpoint,
                hint: self.permission_hint(),
            },
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ClientError::Timeout {
                endpoint,
                timeout: self.timeout,
            },
            _ => ClientError::Connect { endpoint, error },
        }
    }

    fn exchange_error(&self, error: io::Error) -> ClientError {
        let endpoint = self.endpoint.to_string();
        match error.kind() {
            // A socket read timeout surfaces as EAGAIN.
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ClientError::Timeout {
                endpoint,
                timeout: self.timeout,
            },
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => ClientError::Closed { endpoint },
            _ => ClientError::Io { endpoint, error },
        }
    }

    /// Who may connect, when the socket can be looked at.
    fn permission_hint(&self) -> String {
        let Endpoint::Unix(path) = &self.endpoint else {
            return String::new();
        };
        match std::fs::metadata(path) {
            Ok(md) => {
                let user = match md.uid() {
                    0 => "root".to_string(),
                    uid => format!("uid {uid}"),
                };
                format!(
                    ": the socket has mode {:04o} and belongs to {user}; run rivoractl as {user}",
                    md.mode() & 0o7777
                )
            }
            Err(_) => ": its directory is closed to this user; run rivoractl as the user rivorad \
                 runs as (usually root)"
                .to_string(),
        }
    }
}

/// `30 s`, `0.5 s`.
fn fmt_secs(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// The path of one VIP; the name is percent-encoded whole, since it holds
/// a `/` and, for IPv6, brackets and colons.
pub fn vip_path(name: &str) -> String {
    format!("/v1/vips/{}", utf8_percent_encode(name, NON_ALPHANUMERIC))
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ClientError> {
    Ok(serde_json::from_slice(body)?)
}

fn connect_tcp(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn exchange<S: Read + Write>(mut s: S, request: &[u8]) -> io::Result<Vec<u8>> {
    // A server that refuses the connection may answer and close before
    // reading the request (rivorad does at its connection limit): the
    // write then fails, but the answer is there to read.
    let written = s.write_all(request).and_then(|()| s.flush());
    let mut raw = Vec::new();
    let read = s.take(MAX_RESPONSE_BYTES + 1).read_to_end(&mut raw);
    // Closing a socket with our request unread makes the kernel report a
    // reset after the queued answer: a complete answer still counts.
    let answered = !raw.is_empty() && (read.is_ok() || parse_response(&raw).is_ok());
    if !answered {
        written?;
        read?;
    }
    if raw.len() as u64 > MAX_RESPONSE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "response larger than 256 MiB",
        ));
    }
    Ok(raw)
}

/// Parses a whole response read until the server closed the connection.
fn parse_response(raw: &[u8]) -> Result<RawResponse, &'static str> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| "headers are not UTF-8")?;
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or("empty response")?;
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err("not an HTTP/1.x status line");
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or("bad status code")?;

    let mut content_length = None;
    let mut chunked = false;
    let mut content_type = None;
    for line in lines {
        let (name, value) = line.split_once(':').ok_or("header without ':'")?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.to_string());
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = content_length {
        rest.get(..n)
            .ok_or("body shorter than Content-Length")?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(RawResponse {
        status,
        content_type,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let size_line = std::str::from_utf8(&data[..eol]).map_err(|_| "bad chunk size")?;
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| "bad chunk size")?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = data.get(..size).ok_or("truncated chunk")?;
        out.extend_from_slice(chunk);
        data = data
            .get(size..)
            .and_then(|d| d.strip_prefix(b"\r\n"))
            .ok_or("chunk not followed by CRLF")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_response() {
        let raw = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 17\r\n\r\n{\"error\":\"no x\"}\nEXTRA";
        let r = parse_response(raw).unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
        assert_eq!(r.body, b"{\"error\":\"no x\"}\n");
    }

    #[test]
    fn parses_chunked_response() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap().body, b"hello, world");
    }

    #[test]
    fn rejects_malformed_responses() {
        for raw in [
            &b"garbage"[..],
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhi",
        ] {
            assert!(
                parse_response(raw).is_err(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn vip_paths_are_one_segment() {
        assert_eq!(
            vip_path("tcp/10.0.0.1:80"),
            "/v1/vips/tcp%2F10%2E0%2E0%2E1%3A80"
        );
        assert!(!vip_path("udp/[2001:db8::1]:53")["/v1/vips/".len()..].contains(['/', '[', ':']));
    }

    fn fast(path: &Path) -> Client {
        Client::unix(path).with_timeout(Duration::from_millis(300))
    }

    #[test]
    fn connection_failures_are_sentences() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rivorad.sock");

        let missing = fast(&path).status().unwrap_err();
        assert!(
            matches!(missing, ClientError::NotListening { .. }),
            "{missing:?}"
        );
        assert_eq!(
            missing.to_string(),
            format!("no rivorad is listening on {}", path.display())
        );

        // A socket file nobody listens on, as a crashed daemon leaves.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let stale = fast(&path).status().unwrap_err();
        assert!(
            matches!(stale, ClientError::NotListening { .. }),
            "{stale:?}"
        );

        // Bound, never accepted: the connection is queued and nobody answers.
        std::fs::remove_file(&path).unwrap();
        let _silent = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let timeout = fast(&path).status().unwrap_err();
        assert_eq!(
            timeout.to_string(),
            format!("rivorad did not answer within 0.3 s on {}", path.display())
        );
        assert!(!format!("{timeout:?}").contains("os error"), "{timeout:?}");
    }

    #[test]
    fn closed_without_answer_and_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rivorad.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            drop(listener.accept().unwrap());
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 20\r\nconnection: close\r\n\r\n{\"error\":\"too many\"}")
                .unwrap();
        });
        let closed = fast(&path).status().unwrap_err();
        assert!(matches!(closed, ClientError::Closed { .. }), "{closed:?}");
        assert_eq!(
            closed.to_string(),
            format!(
                "rivorad closed the connection on {} without answering",
                path.display()
            )
        );
        match fast(&path).status().unwrap_err() {
            ClientError::Api {
                status: 503,
                message,
            } => assert_eq!(message, "too many"),
            other => panic!("{other:?}"),
        }
        server.join().unwrap();
    }

    #[test]
    fn seconds_read_naturally() {
        assert_eq!(fmt_secs(Duration::from_secs(30)), "30 s");
        assert_eq!(fmt_secs(Duration::from_millis(1500)), "1.5 s");
    }
}
