//! Serving one listener with bounded connections: hyper's HTTP/1 driven
//! per accepted connection (warp's own server has no header timeout, no
//! connection cap and a ~400 KiB buffer per connection), so a client that
//! opens connections and sends nothing, or sends headers a byte at a time,
//! costs a bounded number of file descriptors and bytes, for a bounded time.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;
use warp::filters::BoxedFilter;
use warp::reply::Response;

/// Limits on one listener. Each listener (the Unix socket, the TCP API,
/// metrics) counts its own connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// From a connection's start, or from the end of the previous
    /// response, to the end of the next request's headers. Bytes arriving
    /// do not extend it, so headers sent a byte at a time are cut off too.
    pub header_read_timeout: Duration,
    /// A connection on which no byte moved either way for this long is
    /// closed, except while a request is being handled (from the end of
    /// its body to its response: then the client is waiting on us). This
    /// covers a stalled body upload, a client that stopped reading its
    /// response, an idle keep-alive (which the header timeout also bounds:
    /// the shorter wins).
    pub idle_timeout: Duration,
    /// Connections served at once. One more is answered `503` with
    /// `Connection: close` and closed at once, without being read: there
    /// is no backlog of our own beyond the kernel's listen queue, so file
    /// descriptors in use stay at this number.
    pub max_connections: usize,
    /// The request line and headers, in bytes; more is answered `431`.
    pub max_header_bytes: usize,
}

impl ConnLimits {
    /// The metrics listener's: one connection per scraper is the norm.
    pub const METRICS: ConnLimits = ConnLimits {
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        max_connections: 16,
        max_header_bytes: 8 * 1024,
    };
}

impl Default for ConnLimits {
    /// For each API listener. rivoractl opens one connection per call; 64
    /// leaves room for scripts in parallel while the descriptors held
    /// stay well under a default `ulimit -n` of 1024 that the health
    /// checker shares.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_connections: 64,
            max_header_bytes: 8 * 1024,
        }
    }
}

/// hyper's floor for its buffer size.
const MIN_BUF: usize = 8 * 1024;
/// The read/write buffer a connection may grow to: headers (capped above)
/// plus a request body (capped by the routes at 16 KiB by default) fit.
const MAX_BUF: usize = 64 * 1024;

const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\ncontent-length: 68\r\nconnection: close\r\n\r\n\
{\"error\":\"rivorad is serving too many connections; try again later\"}";

/// The connections a listener holds, for tests and the log.
#[derive(Debug, Clone)]
pub(crate) struct ConnCount {
    permits: Arc<Semaphore>,
    max: usize,
}

impl ConnCount {
    fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    pub(crate) fn open(&self) -> usize {
        self.max - self.permits.available_permits()
    }
}

/// A listener whose connections can be served.
pub(crate) trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
    /// Writes what fits without waiting; for the refusal only.
    fn try_write(io: &Self::Io, buf: &[u8]) -> io::Result<usize>;
}

impl Accept for TcpListener {
    type Io = TcpStream;
    async fn accept(&self) -> io::Result<TcpStream> {
        let (s, _) = TcpListener::accept(self).await?;
        // Responses are written whole; Nagle would only delay the last bytes.
        let _ = s.set_nodelay(true);
        Ok(s)
    }
    fn try_write(io: &TcpStream, buf: &[u8]) -> io::Result<usize> {
        io.try_write(buf)
    }
}

impl Accept for UnixListener {
    type Io = UnixStream;
    async fn accept(&self) -> io::Result<UnixStream> {
        Ok(UnixListener::accept(self).await?.0)
    }
    fn try_write(io: &UnixStream, buf: &[u8]) -> io::Result<usize> {
        io.try_write(buf)
    }
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    // An error means the handle was dropped: stop as well.
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Starts serving `listener` with `routes`; the returned count follows the
/// open connections. The task ends once `stop` is set (or its sender
/// dropped) and every connection has finished: idle ones close at once,
/// a request in flight is answered first.
pub(crate) fn spawn<L: Accept>(
    listener: L,
    routes: BoxedFilter<(Response,)>,
    limits: ConnLimits,
    stop: watch::Receiver<bool>,
    name: &'static str,
) -> (tokio::task::JoinHandle<()>, ConnCount) {
    let count = ConnCount::new(limits.max_connections);
    let task = tokio::spawn(accept_loop(
        listener,
        routes,
        limits,
        stop,
        name,
        count.clone(),
    ));
    (task, count)
}

async fn accept_loop<L: Accept>(
    listener: L,
    routes: BoxedFilter<(Response,)>,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
    name: &'static str,
    count: ConnCount,
) {
    let refusals = Refusals::default();
    loop {
        let accepted = tokio::select! {
            biased;
            () = stopped(&mut stop) => break,
            r = listener.accept() => r,
        };
        let io = match accepted {
            Ok(io) => io,
            Err(e) => {
                if is_resource_exhaustion(&e) {
                    // The pending connection stays in the kernel's queue;
                    // retrying at once would spin.
                    tracing::warn!(listener = name, error = %e, "accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let Ok(permit) = count.permits.clone().try_acquire_owned() else {
            // Best effort: a fresh socket's send buffer is empty, so the
            // whole answer fits unless the peer is already gone.
            let _ = L::try_write(&io, REFUSED);
            drop(io);
            refusals.note(name, count.max);
            continue;
        };
        let routes = routes.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            serve_connection(io, routes, limits, stop).await;
            drop(permit);
        });
    }
    drop(listener);
    // Each connection holds a permit until it ends.
    let _ = count.permits.acquire_many(count.max as u32).await;
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

/// Logs refusals at most every ten seconds: a flood must not become a
/// flood of log lines.
#[derive(Default)]
struct Refusals {
    state: Mutex<(Option<Instant>, u64)>,
}

impl Refusals {
    fn note(&self, name: &'static str, max: usize) {
        let Ok(mut s) = self.state.lock() else { return };
        s.1 += 1;
        let now = Instant::now();
        if s.0
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(10))
        {
            tracing::warn!(
                listener = name,
                max_connections = max,
                refused = s.1,
                "connection limit reached: refusing new connections"
            );
            *s = (Some(now), 0);
        }
    }
}

async fn serve_connection<I>(
    io: I,
    routes: BoxedFilter<(Response,)>,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: io,
        activity: activity.clone(),
    });
    let inner = TowerToHyperService::new(warp::service(routes));
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let request = Arc::new(RequestState::new(act.clone()));
        let req = req.map(|body| {
            if body.is_end_stream() {
                request.handling();
            }
            TrackedBody {
                inner: body,
                request: request.clone(),
            }
        });
        let fut = inner.call(req);
        // Made before the future, so that dropping it unpolled finishes too.
        let done = Finished(request);
        async move {
            let _done = done;
            fut.await
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.saturating_add(MIN_BUF).max(MAX_BUF))
        .serve_connection(io, svc);
    tokio::pin!(conn);
    let idle = activity.idle_for(limits.idle_timeout);
    tokio::pin!(idle);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "API connection ended");
                }
                return;
            }
            () = &mut idle => {
                tracing::debug!(timeout = ?limits.idle_timeout, "closing an idle API connection");
                return;
            }
            () = stopped(&mut stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// When bytes last moved on a connection, and whether a request is being
/// handled (the client then waits on us, which is not idleness).
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
    done: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            done: Notify::new(),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once the connection has been idle for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            if self.in_flight.load(Ordering::SeqCst) > 0 {
                let done = self.done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if self.in_flight.load(Ordering::SeqCst) > 0 {
                    done.await;
                }
                continue;
            }
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = self.start + last + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One request: while its body is still arriving the client is the one
/// to wait on (idle time counts); from the body's end to the response the
/// client waits on us (it does not).
struct RequestState {
    activity: Arc<Activity>,
    phase: AtomicU8,
}

const RECEIVING: u8 = 0;
const HANDLING: u8 = 1;
const FINISHED: u8 = 2;

impl RequestState {
    fn new(activity: Arc<Activity>) -> Self {
        Self {
            activity,
            phase: AtomicU8::new(RECEIVING),
        }
    }

    fn handling(&self) {
        if self
            .phase
            .compare_exchange(RECEIVING, HANDLING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.activity.in_flight.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn finish(&self) {
        if self.phase.swap(FINISHED, Ordering::SeqCst) == HANDLING {
            self.activity.touch();
            self.activity.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.activity.done.notify_waiters();
        }
    }
}

/// Finishes the request when the response is ready, or when the
/// connection is dropped mid-request.
struct Finished(Arc<RequestState>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// The request body, noting when it has all arrived.
struct TrackedBody {
    inner: Incoming,
    request: Arc<RequestState>,
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.request.handling();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's I/O, noting each byte that moves.
struct Tracked<I> {
    inner: I,
    activity: Arc<Activity>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_is_well_formed() {
        let text = std::str::from_utf8(REFUSED).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let declared: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(declared, body.len());
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"]
            .as_str()
            .unwrap()
            .contains("too many connections"));
    }
}
