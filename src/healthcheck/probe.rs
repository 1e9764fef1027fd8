//! One probe: a TCP connect, or an HTTP/1.1 GET that reads only the status
//! line. A hand-written request over a tokio `TcpStream` is all a health
//! check needs; an HTTP client stack would cost more CPU and memory per
//! probe than the probe itself, at thousands of probes a second.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::spec::{HealthCheckSpec, ProbeKind};

/// The longest status line read. "HTTP/1.1 200 " is all that is parsed;
/// the rest of the line (the reason phrase) is allowed up to this much.
const MAX_STATUS_LINE: usize = 1024;

/// Why a probe failed. `Clone` so one failure can be both reported in an
/// event and kept as the target's last result.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProbeError {
    #[error("connect: {message}")]
    Connect {
        kind: io::ErrorKind,
        message: String,
    },
    #[error("sending the request: {message}")]
    Send {
        kind: io::ErrorKind,
        message: String,
    },
    #[error("reading the status line: {message}")]
    Receive {
        kind: io::ErrorKind,
        message: String,
    },
    #[error("no answer within the {after:?} timeout")]
    Timeout { after: Duration },
    #[error("connection closed before a status line")]
    ClosedBeforeStatus,
    #[error("malformed status line {line:?}")]
    MalformedStatusLine { line: String },
    #[error("status {code} is not an expected status")]
    UnexpectedStatus { code: u16 },
    /// This node, not the backend, could not run the probe: out of file
    /// descriptors, memory, socket buffers or local ports. It says
    /// nothing about the backend (see [`Verdict::Unknown`]).
    #[error("not probed: this node is out of {resource} ({message})")]
    LocalExhaustion {
        resource: &'static str,
        message: String,
    },
}

/// What one probe says about the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    Up,
    Down,
    /// The probe could not be run for a reason of this node's own (see
    /// [`ProbeError::LocalExhaustion`]). It counts neither way: when 1,000
    /// idle connections to a listener used up rivorad's descriptors,
    /// every probe failed at `socket()` and healthy backends were taken
    /// out of the datapath, an outage caused by the checker itself.
    Unknown,
}

impl ProbeError {
    pub fn verdict(&self) -> Verdict {
        match self {
            Self::LocalExhaustion { .. } => Verdict::Unknown,
            _ => Verdict::Down,
        }
    }
}

/// The resource an errno says this node ran out of, if it says so.
/// EADDRNOTAVAIL from connect() on Linux means no free local port (the
/// ephemeral range is used up), not anything about the peer.
fn exhausted_resource(e: &io::Error) -> Option<&'static str> {
    match e.raw_os_error()? {
        libc::EMFILE => Some("file descriptors (EMFILE)"),
        libc::ENFILE => Some("file descriptors system-wide (ENFILE)"),
        libc::ENOMEM => Some("memory (ENOMEM)"),
        libc::ENOBUFS => Some("socket buffers (ENOBUFS)"),
        libc::EADDRNOTAVAIL => Some("local ports (EADDRNOTAVAIL)"),
        _ => None,
    }
}

/// A probe step's I/O error: the node's own exhaustion, or `step`'s
/// failure (which is the backend's).
fn io_error(e: io::Error, step: fn(io::ErrorKind, String) -> ProbeError) -> ProbeError {
    match exhausted_resource(&e) {
        Some(resource) => ProbeError::LocalExhaustion {
            resource,
            message: e.to_string(),
        },
        None => step(e.kind(), e.to_string()),
    }
}

fn connect_error(kind: io::ErrorKind, message: String) -> ProbeError {
    ProbeError::Connect { kind, message }
}

fn send_error(kind: io::ErrorKind, message: String) -> ProbeError {
    ProbeError::Send { kind, message }
}

fn receive_error(kind: io::ErrorKind, message: String) -> ProbeError {
    ProbeError::Receive { kind, message }
}

/// What a successful probe saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOk {
    /// The HTTP status code; `None` for a TCP probe.
    pub status: Option<u16>,
}

pub type ProbeResult = Result<ProbeOk, ProbeError>;

/// One finished probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub result: ProbeResult,
    /// From the start of connect to the verdict (the timeout, on timeout).
    pub latency: Duration,
}

impl Observation {
    pub fn success(&self) -> bool {
        self.result.is_ok()
    }

    pub fn verdict(&self) -> Verdict {
        match &self.result {
            Ok(_) => Verdict::Up,
            Err(e) => e.verdict(),
        }
    }

    /// Latency in seconds, the Prometheus base unit.
    pub fn latency_secs(&self) -> f64 {
        self.latency.as_secs_f64()
    }
}

/// A probe ready to run repeatedly against one address: the HTTP request
/// is rendered once, not per probe.
#[derive(Debug, Clone)]
pub struct Prober {
    addr: SocketAddr,
    spec: HealthCheckSpec,
    /// The whole HTTP request; `None` for TCP.
    request: Option<Box<[u8]>>,
}

impl Prober {
    /// `addr` is the address actually probed (the backend's, with the
    /// spec's port override already applied).
    pub fn new(addr: SocketAddr, spec: HealthCheckSpec) -> Self {
        let request = (spec.kind == ProbeKind::Http).then(|| {
            // Host is mandatory in HTTP/1.1 (RFC 9112 3.2). The default is
            // the probed address; an IPv6 literal is bracketed and never
            // carries a zone ID, which a Host header cannot express.
            let host = match &spec.host {
                Some(h) => h.clone(),
                None => match addr {
                    SocketAddr::V4(a) => a.to_string(),
                    SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
                },
            };
            format!(
                "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: rivora-healthcheck/{}\r\n\
                 Accept: */*\r\nConnection: close\r\n\r\n",
                spec.http_path(),
                env!("CARGO_PKG_VERSION"),
            )
            .into_bytes()
            .into_boxed_slice()
        });
        Self {
            addr,
            spec,
            request,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Runs one probe under the spec's timeout (connect included).
    pub async fn probe(&self) -> Observation {
        let start = Instant::now();
        let result = match tokio::time::timeout(self.spec.timeout, self.run()).await {
            Ok(r) => r,
            Err(_) => Err(ProbeError::Timeout {
                after: self.spec.timeout,
            }),
        };
        Observation {
            result,
            latency: start.elapsed(),
        }
    }

    async fn run(&self) -> ProbeResult {
        let mut stream = connect(self.addr).await?;
        let Some(request) = &self.request else {
            return Ok(ProbeOk { status: None });
        };
        stream
            .write_all(request)
            .await
            .map_err(|e| io_error(e, send_error))?;
        let code = read_status(&mut stream).await?;
        if self.spec.status_ok(code) {
            Ok(ProbeOk { status: Some(code) })
        } else {
            Err(ProbeError::UnexpectedStatus { code })
        }
    }
}

async fn connect(addr: SocketAddr) -> Result<TcpStream, ProbeError> {
    let err = |e: io::Error| io_error(e, connect_error);
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(err)?;
    // Close with RST rather than FIN (HAProxy does the same for checks):
    // a FIN leaves the prober's side in TIME_WAIT for 60 s, which at 1,000
    // backends probed every second is 60,000 sockets held for nothing.
    socket.set_zero_linger().map_err(err)?;
    socket.connect(addr).await.map_err(err)
}

/// Reads up to the end of the status line and returns its status code.
/// The headers and body are never read: the verdict needs only the code.
async fn read_status(stream: &mut TcpStream) -> Result<u16, ProbeError> {
    let mut buf = [0u8; MAX_STATUS_LINE];
    let mut len = 0;
    loop {
        let n = stream
            .read(&mut buf[len..])
            .await
            .map_err(|e| io_error(e, receive_error))?;
        len += n;
        let eol = buf[..len].iter().position(|&b| b == b'\n');
        if let Some(eol) = eol {
            return parse_status_line(&buf[..eol]);
        }
        if n == 0 || len == buf.len() {
            if len == 0 {
                return Err(ProbeError::ClosedBeforeStatus);
            }
            // A truncated or over-long line still carries its code up front.
            return parse_status_line(&buf[..len]);
        }
    }
}

/// `HTTP/1.x SP 3DIGIT [SP reason]` (RFC 9112 4).
pub fn parse_status_line(line: &[u8]) -> Result<u16, ProbeError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let malformed = || ProbeError::MalformedStatusLine {
        line: String::from_utf8_lossy(&line[..line.len().min(64)]).into_owned(),
    };
    let rest = line.strip_prefix(b"HTTP/1.").ok_or_else(malformed)?;
    // One version digit, a space, three code digits, then end or a space.
    match rest {
        [v, b' ', a, b, c, tail @ ..]
            if v.is_ascii_digit()
                && [a, b, c].iter().all(|d| d.is_ascii_digit())
                && (tail.is_empty() || tail[0] == b' ') =>
        {
            Ok(u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0'))
        }
        _ => Err(malformed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK\r"), Ok(200));
        assert_eq!(
            parse_status_line(b"HTTP/1.0 503 Service Unavailable"),
            Ok(503)
        );
        assert_eq!(parse_status_line(b"HTTP/1.1 204"), Ok(204));
        assert_eq!(parse_status_line(b"HTTP/1.1 302 "), Ok(302));
        for bad in [
            &b""[..],
            b"HTTP/2 200 OK",
            b"HTTP/1.1 20 OK",
            b"HTTP/1.1 2000 OK",
            b"HTTP/1.1 abc OK",
            b"SSH-2.0-OpenSSH_9.6",
            b"HTTP/1.1  200 OK",
        ] {
            assert!(
                matches!(
                    parse_status_line(bad),
                    Err(ProbeError::MalformedStatusLine { .. })
                ),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_nodes_own_exhaustion_is_unknown_not_down() {
        for (errno, resource) in [
            (libc::EMFILE, "EMFILE"),
            (libc::ENFILE, "ENFILE"),
            (libc::ENOMEM, "ENOMEM"),
            (libc::ENOBUFS, "ENOBUFS"),
            (libc::EADDRNOTAVAIL, "EADDRNOTAVAIL"),
        ] {
            for step in [connect_error, send_error, receive_error] {
                let e = io_error(io::Error::from_raw_os_error(errno), step);
                assert_eq!(e.verdict(), Verdict::Unknown, "{resource}: {e:?}");
                let text = e.to_string();
                assert!(
                    text.starts_with("not probed: this node is out of") && text.contains(resource),
                    "{text}"
                );
            }
        }
        // The backend's doing, or the path's: down.
        for errno in [
            libc::ECONNREFUSED,
            libc::ECONNRESET,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::ETIMEDOUT,
            libc::EPIPE,
        ] {
            let e = io_error(io::Error::from_raw_os_error(errno), connect_error);
            assert!(matches!(e, ProbeError::Connect { .. }), "{e:?}");
            assert_eq!(e.verdict(), Verdict::Down, "{e:?}");
        }
        // No errno at all (a timeout, a bad status): down.
        let e = io_error(io::Error::other("no errno"), receive_error);
        assert_eq!(e.verdict(), Verdict::Down);
        assert_eq!(
            ProbeError::UnexpectedStatus { code: 500 }.verdict(),
            Verdict::Down
        );
        let obs = |result| Observation {
            result,
            latency: Duration::ZERO,
        };
        assert_eq!(obs(Ok(ProbeOk { status: None })).verdict(), Verdict::Up);
        assert_eq!(
            obs(Err(io_error(
                io::Error::from_raw_os_error(libc::EMFILE),
                connect_error
            )))
            .verdict(),
            Verdict::Unknown
        );
    }

    #[test]
    fn request_is_rendered_once_with_host_and_path() {
        let addr: SocketAddr = "[::1]:8080".parse().expect("literal");
        let p = Prober::new(addr, HealthCheckSpec::http("/healthz?x=1"));
        let req = String::from_utf8(p.request.clone().expect("http").into_vec()).expect("ascii");
        assert!(
            req.starts_with("GET /healthz?x=1 HTTP/1.1\r\nHost: [::1]:8080\r\n"),
            "{req}"
        );
        assert!(req.ends_with("Connection: close\r\n\r\n"), "{req}");
        let spec = HealthCheckSpec {
            host: Some("api.example".into()),
            ..HealthCheckSpec::http("/")
        };
        let p = Prober::new("10.0.0.1:80".parse().expect("literal"), spec);
        let req = String::from_utf8(p.request.clone().expect("http").into_vec()).expect("ascii");
        assert!(req.contains("\r\nHost: api.example\r\n"), "{req}");
        let p = Prober::new(addr, HealthCheckSpec::default());
        assert!(p.request.is_none());
    }
}
