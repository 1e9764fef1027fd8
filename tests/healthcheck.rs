//! The health checker against real servers on loopback: TCP listeners that
//! come and go, an HTTP server whose status code the test sets, a server
//! that accepts and never answers, and `set_targets` diffs.
//!
//! Intervals are tens of milliseconds so the suite is fast; every timing
//! bound is the documented one plus a fixed slack for a loaded 2-core CI
//! machine, so a checker that is slower than documented (or faster than
//! its hysteresis allows) still fails.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use rivora::healthcheck::{
    HealthCheckSpec, HealthChecker, HealthEvent, HealthState, ProbeError, ProbeKind, ProbeLoad,
    ProbeOk, ProbeTarget, StatusRange, TargetDiff,
};

/// Scheduling slack added to every documented bound.
const SLACK: Duration = Duration::from_millis(250);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn tcp_spec(interval: u64, timeout: u64, rise: u32, fall: u32) -> HealthCheckSpec {
    HealthCheckSpec {
        kind: ProbeKind::Tcp,
        interval: ms(interval),
        timeout: ms(timeout),
        rise,
        fall,
        ..HealthCheckSpec::default()
    }
}

/// What a test server does with a connection.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Accept and close (enough for a TCP probe).
    Close,
    /// Read an HTTP request head, answer with the current status.
    Http,
    /// Accept and hold the connection open without a byte.
    Silent,
}

/// A loopback server that can be stopped (port refuses connections) and
/// started again on the same port.
struct Server {
    addr: SocketAddr,
    behaviour: Behaviour,
    status: Arc<AtomicU16>,
    /// Request heads received (HTTP).
    requests: Arc<Mutex<Vec<String>>>,
    accepted: Arc<AtomicU64>,
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Server {
    async fn start(bind: &str, behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind(bind)
            .await
            .unwrap_or_else(|e| panic!("binding {bind}: {e}"));
        let addr = listener.local_addr().expect("local addr");
        let mut s = Server {
            addr,
            behaviour,
            status: Arc::new(AtomicU16::new(200)),
            requests: Arc::default(),
            accepted: Arc::default(),
            running: None,
        };
        s.serve(listener);
        s
    }

    fn serve(&mut self, listener: TcpListener) {
        let (stop_tx, mut stop_rx) = oneshot::channel();
        let behaviour = self.behaviour;
        let status = Arc::clone(&self.status);
        let requests = Arc::clone(&self.requests);
        let accepted = Arc::clone(&self.accepted);
        let task = tokio::spawn(async move {
            // Connections the silent server holds; dropped with the task.
            let mut held = Vec::new();
            loop {
                let conn = tokio::select! {
                    _ = &mut stop_rx => return,
                    c = listener.accept() => c,
                };
                let Ok((stream, _)) = conn else { continue };
                accepted.fetch_add(1, Ordering::Relaxed);
                match behaviour {
                    Behaviour::Close => drop(stream),
                    Behaviour::Silent => held.push(stream),
                    Behaviour::Http => {
                        let code = status.load(Ordering::Relaxed);
                        let requests = Arc::clone(&requests);
                        tokio::spawn(answer_http(stream, code, requests));
                    }
                }
            }
        });
        self.running = Some((stop_tx, task));
    }

    /// Stops accepting and closes the listener: connects are refused.
    async fn stop(&mut self) {
        if let Some((tx, task)) = self.running.take() {
            let _ = tx.send(());
            task.await.expect("server task");
        }
    }

    /// Listens again on the same port.
    async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .unwrap_or_else(|e| panic!("rebinding {}: {e}", self.addr));
        self.serve(listener);
    }

    fn set_status(&self, code: u16) {
        self.status.store(code, Ordering::Relaxed);
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("requests lock").clone()
    }
}

async fn answer_http(mut stream: TcpStream, code: u16, requests: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    requests
        .lock()
        .expect("requests lock")
        .push(String::from_utf8_lossy(&head).into_owned());
    let resp = format!("HTTP/1.1 {code} Test\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    let _ = stream.write_all(resp.as_bytes()).await;
}

/// The next event, or a panic naming what was awaited.
async fn next_event(
    rx: &mut mpsc::UnboundedReceiver<HealthEvent>,
    within: Duration,
    what: &str,
) -> HealthEvent {
    match tokio::time::timeout(within, rx.recv()).await {
        Ok(Some(e)) => e,
        Ok(None) => panic!("{what}: event channel closed"),
        Err(_) => panic!("{what}: no event within {within:?}"),
    }
}

/// Asserts that no event arrives for `d`.
async fn no_event(rx: &mut mpsc::UnboundedReceiver<HealthEvent>, d: Duration, what: &str) {
    if let Ok(e) = tokio::time::timeout(d, rx.recv()).await {
        panic!("{what}: unexpected event {e:?}");
    }
}

fn probes_of(hc: &HealthChecker, key: SocketAddr) -> u64 {
    hc.status()
        .into_iter()
        .find(|s| s.key == key)
        .map(|s| s.probes)
        .unwrap_or_else(|| panic!("{key} not in status"))
}

/// Every probe result with when it finished, recorded by the observer.
type Log = Arc<Mutex<Vec<(std::time::Instant, bool)>>>;

/// Every "health changed" the checker logged: (probed address, when),
/// captured by [`Capture`] in the probe task itself, after the observer's
/// call for the probe that completed the streak and before the next probe.
static TRANSITIONS: Mutex<Vec<(String, std::time::Instant)>> = Mutex::new(Vec::new());

/// A tracing layer that records the checker's "health changed" events
/// into [`TRANSITIONS`].
struct Capture;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let at = std::time::Instant::now();
        #[derive(Default)]
        struct Fields {
            changed: bool,
            addr: Option<String>,
        }
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                match f.name() {
                    "message" => self.changed = format!("{v:?}") == "health changed",
                    "addr" => self.addr = Some(format!("{v:?}")),
                    _ => {}
                }
            }
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if let (true, Some(addr)) = (f.changed, f.addr) {
            TRANSITIONS
                .lock()
                .expect("transitions lock")
                .push((addr, at));
        }
    }
}

fn capture_transitions() {
    use tracing_subscriber::layer::SubscriberExt;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("the only global subscriber");
    });
}

/// Asserts that the checker changed `addr`'s state (its first change
/// logged after `since`) with the `n`-th result of a streak: exactly `n`
/// results equal to `success` in a row, no more, no fewer, ending with
/// the change. Counted from the observer's records, not timed: the
/// transition's place among the probes is exact whatever the load.
fn assert_streak(
    log: &Log,
    addr: SocketAddr,
    since: std::time::Instant,
    success: bool,
    n: u32,
    what: &str,
) {
    let want = addr.to_string();
    let at = TRANSITIONS
        .lock()
        .expect("transitions lock")
        .iter()
        .find(|(a, t)| *a == want && *t >= since)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("{what}: no transition of {addr} logged"));
    let results: Vec<bool> = log
        .lock()
        .expect("log lock")
        .iter()
        .filter(|(t, _)| *t <= at)
        .map(|(_, ok)| *ok)
        .collect();
    let streak = results
        .iter()
        .rev()
        .take_while(|ok| **ok == success)
        .count();
    assert_eq!(
        streak, n as usize,
        "{what}: the change came after {streak} results of {success} in a row, want {n}; \
         results up to it: {results:?}"
    );
}

/// A healthy backend stays quiet; killed, it is reported down within
/// fall x interval + timeout, after exactly `fall` failed probes;
/// restored, it is healthy again within rise x interval, after exactly
/// `rise` successful ones.
async fn up_down_up(bind: &str) {
    let (interval, timeout, rise, fall) = (100, 40, 3, 2);
    let mut server = Server::start(bind, Behaviour::Close).await;
    let log: Log = Arc::default();
    let sink = Arc::clone(&log);
    let (mut hc, mut rx) = HealthChecker::with_observer(
        tokio::runtime::Handle::current(),
        Arc::new(
            move |_key: &SocketAddr, obs: &rivora::healthcheck::Observation| {
                sink.lock()
                    .expect("log lock")
                    .push((std::time::Instant::now(), obs.success()));
            },
        ),
    );
    capture_transitions();
    let spec = tcp_spec(interval, timeout, rise, fall);
    hc.set_targets(vec![ProbeTarget::new(server.addr, spec)])
        .expect("valid targets");

    // Probing runs (three successes recorded) and a healthy backend
    // stays quiet.
    let ran = tokio::time::timeout(ms(2000), async {
        while log.lock().expect("log lock").iter().filter(|r| r.1).count() < 3 {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    assert!(ran.is_ok(), "three successful probes within 2 s");
    assert!(rx.try_recv().is_err(), "healthy backend: no event");
    assert!(probes_of(&hc, server.addr) >= 3, "probing is running");
    // A probe succeeds when the kernel completes the handshake, which can
    // be before the server's task has run accept on it.
    let seen = tokio::time::timeout(ms(1000), async {
        while server.accepted.load(Ordering::Relaxed) < 3 {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    assert!(seen.is_ok(), "the server accepted the three probes");
    assert_eq!(hc.state(&server.addr), Some(HealthState::Healthy));

    // Taken before the stop: a probe may fail between the stop returning
    // and the next line, and the streak starts with that failure.
    let killed = std::time::Instant::now();
    server.stop().await;
    let bound = ms(fall as u64 * interval + timeout) + SLACK;
    let ev = next_event(&mut rx, bound, "killed backend").await;
    assert_eq!(ev.key, server.addr);
    assert_eq!(ev.state, HealthState::Down);
    assert!(
        matches!(&ev.detail, Err(ProbeError::Connect { kind, .. }) if *kind == std::io::ErrorKind::ConnectionRefused),
        "{:?}",
        ev.detail
    );
    assert_streak(&log, server.addr, killed, false, fall, "down");
    assert_eq!(hc.state(&server.addr), Some(HealthState::Down));

    let restored = std::time::Instant::now();
    server.restart().await;
    let bound = ms(rise as u64 * interval) + SLACK;
    let ev = next_event(&mut rx, bound, "restored backend").await;
    assert_eq!(ev.state, HealthState::Healthy);
    assert_eq!(ev.detail, Ok(ProbeOk { status: None }));
    assert_streak(&log, server.addr, restored, true, rise, "up");
    no_event(&mut rx, ms(300), "healthy again").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_backend_down_and_up_v4() {
    up_down_up("127.0.0.1:0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_backend_down_and_up_v6() {
    up_down_up("[::1]:0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_status_host_and_path() {
    let server = Server::start("127.0.0.1:0", Behaviour::Http).await;
    let (mut hc, mut rx) = HealthChecker::new(tokio::runtime::Handle::current());
    let spec = HealthCheckSpec {
        interval: ms(40),
        timeout: ms(30),
        rise: 2,
        fall: 2,
        host: Some("svc.example".into()),
        expected_status: Some(vec![StatusRange::new(200, 204)]),
        ..HealthCheckSpec::http("/healthz?probe=1")
    };
    hc.set_targets(vec![ProbeTarget::new(server.addr, spec)])
        .expect("valid targets");

    no_event(&mut rx, ms(250), "200 OK").await;
    let reqs = server.requests();
    assert!(reqs.len() >= 3, "{} requests", reqs.len());
    for r in &reqs {
        assert!(r.starts_with("GET /healthz?probe=1 HTTP/1.1\r\n"), "{r:?}");
        assert!(r.contains("\r\nHost: svc.example\r\n"), "{r:?}");
    }

    server.set_status(500);
    let ev = next_event(&mut rx, ms(2 * 40 + 30) + SLACK, "500").await;
    assert_eq!(ev.state, HealthState::Down);
    assert_eq!(ev.detail, Err(ProbeError::UnexpectedStatus { code: 500 }));

    // 302 is outside this spec's 200-204: still down.
    server.set_status(302);
    no_event(&mut rx, ms(250), "302 against 200-204").await;
    assert_eq!(hc.state(&server.addr), Some(HealthState::Down));

    server.set_status(204);
    let ev = next_event(&mut rx, ms(2 * 40) + SLACK, "204").await;
    assert_eq!(ev.state, HealthState::Healthy);
    assert_eq!(ev.detail, Ok(ProbeOk { status: Some(204) }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_defaults_host_path_and_2xx_3xx() {
    let server = Server::start("[::1]:0", Behaviour::Http).await;
    let (mut hc, mut rx) = HealthChecker::new(tokio::runtime::Handle::current());
    let spec = HealthCheckSpec {
        kind: ProbeKind::Http,
        ..tcp_spec(40, 30, 1, 1)
    };
    hc.set_targets(vec![ProbeTarget::new(server.addr, spec)])
        .expect("valid targets");
    server.set_status(301);
    no_event(&mut rx, ms(200), "301 is in the default 200-399").await;
    let host = format!("\r\nHost: [::1]:{}\r\n", server.addr.port());
    let reqs = server.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert!(r.starts_with("GET / HTTP/1.1\r\n"), "{r:?}");
        assert!(r.contains(&host), "{r:?} lacks {host:?}");
    }
    server.set_status(404);
    let ev = next_event(&mut rx, ms(40 + 30) + SLACK, "404").await;
    assert_eq!(ev.state, HealthState::Down);
    assert_eq!(ev.detail, Err(ProbeError::UnexpectedStatus { code: 404 }));
}

/// A server that accepts but never answers: each probe times out, which is
/// a failure, and the observed latency is the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_times_out() {
    let server = Server::start("127.0.0.1:0", Behaviour::Silent).await;
    let latencies: Arc<Mutex<Vec<(f64, bool)>>> = Arc::default();
    let sink = Arc::clone(&latencies);
    let (mut hc, mut rx) = HealthChecker::with_observer(
        tokio::runtime::Handle::current(),
        Arc::new(
            move |_key: &SocketAddr, obs: &rivora::healthcheck::Observation| {
                sink.lock()
                    .expect("sink lock")
                    .push((obs.latency_secs(), obs.success()));
            },
        ),
    );
    let spec = HealthCheckSpec {
        interval: ms(80),
        timeout: ms(40),
        rise: 1,
        fall: 2,
        ..HealthCheckSpec::http("/")
    };
    hc.set_targets(vec![ProbeTarget::new(server.addr, spec)])
        .expect("valid targets");
    let ev = next_event(&mut rx, ms(2 * 80 + 40) + SLACK, "silent server").await;
    assert_eq!(ev.state, HealthState::Down);
    assert_eq!(ev.detail, Err(ProbeError::Timeout { after: ms(40) }));
    assert!(
        server.accepted.load(Ordering::Relaxed) >= 2,
        "it did connect"
    );

    let seen = latencies.lock().expect("latencies lock").clone();
    assert!(seen.len() >= 2, "{seen:?}");
    for (secs, ok) in &seen {
        assert!(!ok);
        assert!(
            (0.040..0.040 + SLACK.as_secs_f64()).contains(secs),
            "latency {secs}"
        );
    }
    let status = hc.status();
    assert_eq!(status.len(), 1);
    assert!(status[0].failures >= 2 && status[0].failures == status[0].probes);
    assert_eq!(
        status[0].last.as_ref().map(|o| o.result.clone()),
        Some(Err(ProbeError::Timeout { after: ms(40) }))
    );
}

/// A target added as down (e.g. adopted from the pinned health map) is
/// reported healthy only after rise successes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_down_rises() {
    let server = Server::start("127.0.0.1:0", Behaviour::Close).await;
    let (mut hc, mut rx) = HealthChecker::new(tokio::runtime::Handle::current());
    let target = ProbeTarget {
        initial: HealthState::Down,
        ..ProbeTarget::new(server.addr, tcp_spec(40, 20, 3, 1))
    };
    // Before the call: probing may start before it returns.
    let added = Instant::now();
    hc.set_targets(vec![target]).expect("valid targets");
    assert_eq!(hc.state(&server.addr), Some(HealthState::Down));
    // First probe within one interval (jitter), then rise - 1 more.
    let ev = next_event(&mut rx, ms(3 * 40) + SLACK, "initially down").await;
    assert_eq!(ev.state, HealthState::Healthy);
    assert!(
        added.elapsed() >= ms(2 * 40),
        "rose after {:?}",
        added.elapsed()
    );
    assert!(probes_of(&hc, server.addr) >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_targets_diff() {
    let (interval, timeout) = (40, 20);
    let mut live = Server::start("127.0.0.1:0", Behaviour::Close).await;
    let dead = {
        // A port nothing listens on: bind, note it, close.
        let mut s = Server::start("127.0.0.1:0", Behaviour::Close).await;
        s.stop().await;
        s.addr
    };
    let spec = tcp_spec(interval, timeout, 2, 2);
    let (mut hc, mut rx) = HealthChecker::new(tokio::runtime::Handle::current());

    let diff = hc
        .set_targets(vec![
            ProbeTarget::new(live.addr, spec.clone()),
            ProbeTarget::new(dead, spec.clone()),
        ])
        .expect("valid targets");
    assert_eq!(
        diff,
        TargetDiff {
            added: 2,
            ..TargetDiff::default()
        }
    );
    let ev = next_event(&mut rx, ms(3 * interval + timeout) + SLACK, "dead").await;
    assert_eq!((ev.key, ev.state), (dead, HealthState::Down));

    // Unchanged targets keep their state and counts; a new one starts.
    let third = Server::start("127.0.0.1:0", Behaviour::Close).await;
    let before = probes_of(&hc, dead);
    let diff = hc
        .set_targets(vec![
            ProbeTarget::new(dead, spec.clone()),
            ProbeTarget::new(live.addr, spec.clone()),
            ProbeTarget::new(third.addr, spec.clone()),
        ])
        .expect("valid targets");
    assert_eq!(
        diff,
        TargetDiff {
            added: 1,
            unchanged: 2,
            ..TargetDiff::default()
        }
    );
    assert_eq!(hc.state(&dead), Some(HealthState::Down));
    assert!(probes_of(&hc, dead) >= before, "counts were reset");
    no_event(&mut rx, ms(200), "unchanged set").await;
    assert!(
        probes_of(&hc, dead) > before,
        "unchanged target stopped probing"
    );

    // A changed spec restarts probing with the state carried over: the
    // dead target, now probed on the live port, rises from Down.
    let moved = HealthCheckSpec {
        port: Some(live.addr.port()),
        ..spec.clone()
    };
    let diff = hc
        .set_targets(vec![
            ProbeTarget::new(dead, moved),
            ProbeTarget::new(live.addr, spec.clone()),
        ])
        .expect("valid targets");
    assert_eq!(
        diff,
        TargetDiff {
            removed: 1,
            restarted: 1,
            unchanged: 1,
            ..TargetDiff::default()
        }
    );
    assert_eq!(
        hc.state(&dead),
        Some(HealthState::Down),
        "restart keeps the state"
    );
    assert_eq!(hc.state(&third.addr), None);
    let ev = next_event(&mut rx, ms(2 * interval) + SLACK, "restarted").await;
    assert_eq!(ev.key, dead);
    assert_eq!(ev.addr, live.addr, "probes go to the override port");
    assert_eq!(ev.state, HealthState::Healthy);
    assert_eq!(hc.len(), 2);

    // Removed targets stop: killing the live server reports nothing once
    // nothing probes it.
    let diff = hc.set_targets(Vec::new()).expect("empty set");
    assert_eq!(
        diff,
        TargetDiff {
            removed: 2,
            ..TargetDiff::default()
        }
    );
    assert!(hc.is_empty());
    let accepted = live.accepted.load(Ordering::Relaxed);
    live.stop().await;
    no_event(
        &mut rx,
        ms(3 * interval + timeout) + SLACK,
        "removed targets",
    )
    .await;
    assert!(rx.try_recv().is_err());
    assert_eq!(
        live.accepted.load(Ordering::Relaxed),
        accepted,
        "removed target still probed"
    );
}

/// Dropping the checker stops every probe task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_stops_probing() {
    let server = Server::start("127.0.0.1:0", Behaviour::Close).await;
    let probes = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&probes);
    let (mut hc, mut rx) = HealthChecker::with_observer(
        tokio::runtime::Handle::current(),
        Arc::new(
            move |_: &SocketAddr, _: &rivora::healthcheck::Observation| {
                counter.fetch_add(1, Ordering::Relaxed);
            },
        ),
    );
    hc.set_targets(vec![ProbeTarget::new(server.addr, tcp_spec(30, 10, 1, 1))])
        .expect("valid targets");
    let ran = tokio::time::timeout(ms(2000), async {
        while probes.load(Ordering::Relaxed) < 2 || server.accepted.load(Ordering::Relaxed) < 2 {
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await;
    assert!(ran.is_ok(), "two probes within 2 s");
    drop(hc);
    // Every probe task holds a sender: the channel closes once they are
    // all gone.
    assert!(tokio::time::timeout(ms(2000), rx.recv())
        .await
        .expect("the channel closes within 2 s of the drop")
        .is_none());
    let (done, accepted) = (
        probes.load(Ordering::Relaxed),
        server.accepted.load(Ordering::Relaxed),
    );
    // Ten intervals: a probe task left running would probe again.
    tokio::time::sleep(ms(300)).await;
    assert_eq!(probes.load(Ordering::Relaxed), done, "probes after drop");
    // A connect the kernel completed just before its task went may be
    // accepted by the server only now: one, not more.
    let late = server.accepted.load(Ordering::Relaxed) - accepted;
    assert!(late <= 1, "{late} connections accepted after the drop");
}

/// Set in the child process [`own_fd_exhaustion_never_takes_a_backend_down`]
/// runs this test binary as.
const EXHAUSTION_CHILD: &str = "RIVORA_HC_EXHAUSTION_CHILD";

/// When this node runs out of file descriptors (1,000 idle connections to
/// a listener did it), a probe fails at `socket()`: that says nothing
/// about the backend, which must stay healthy. The descriptors are used
/// up in a child process (this binary again, running only
/// [`fd_exhaustion_child`]), so that no other test meets the limit.
#[test]
fn own_fd_exhaustion_never_takes_a_backend_down() {
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "fd_exhaustion_child",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(EXHAUSTION_CHILD, "1")
        .output()
        .expect("running the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    // A filter that matched nothing would pass too.
    assert!(
        text.contains("1 passed"),
        "the child test did not run:\n{text}"
    );
}

/// The child's part of [`own_fd_exhaustion_never_takes_a_backend_down`];
/// outside that child it does nothing.
#[test]
#[ignore = "run by own_fd_exhaustion_never_takes_a_backend_down, in a process of its own"]
fn fd_exhaustion_child() {
    if std::env::var_os(EXHAUSTION_CHILD).is_none() {
        return;
    }
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    // A low soft limit, so that using it up takes few files.
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, 256.min(hard), hard).expect("setrlimit");

    // The live backend: a plain thread accepting and closing, which waits
    // out its own EMFILE rather than spinning on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let live = listener.local_addr().expect("local addr");
    std::thread::spawn(move || loop {
        match listener.accept() {
            Ok((s, _)) => drop(s),
            Err(_) => std::thread::sleep(ms(5)),
        }
    });
    // A port nothing listens on: a real failure, once probes run again.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (interval, fall) = (30, 2);
        let spec = tcp_spec(interval, 20, 2, fall);
        let (mut hc, mut rx) = HealthChecker::new(tokio::runtime::Handle::current());
        hc.set_targets(vec![ProbeTarget::new(live, spec.clone())])
            .expect("valid targets");
        let t0 = Instant::now();
        while probes_of(&hc, live) < 3 {
            assert!(t0.elapsed() < ms(2000), "no probes");
            tokio::time::sleep(ms(10)).await;
        }

        // Use up every descriptor.
        let mut hoard = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => hoard.push(f),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                Err(e) => panic!("opening /dev/null: {e}"),
            }
        }
        // A target added now cannot even be probed once: it must not go
        // down either, though nothing listens on it.
        hc.set_targets(vec![
            ProbeTarget::new(live, spec.clone()),
            ProbeTarget::new(dead, spec.clone()),
        ])
        .expect("valid targets");
        let unknown_of = |hc: &HealthChecker, key| {
            let s = hc
                .status()
                .into_iter()
                .find(|s| s.key == key)
                .expect("a target");
            (s.unknown, s.failures, s.last)
        };
        // Far more than `fall` probes go unrun.
        no_event(&mut rx, ms(12 * interval), "out of descriptors").await;
        for key in [live, dead] {
            let (unknown, failures, last) = unknown_of(&hc, key);
            assert!(unknown > 2 * u64::from(fall), "{key}: {unknown} unknown");
            assert_eq!(failures, 0, "{key}");
            assert!(
                matches!(
                    last.map(|o| o.result),
                    Some(Err(ProbeError::LocalExhaustion { .. }))
                ),
                "{key}"
            );
            assert_eq!(hc.state(&key), Some(HealthState::Healthy), "{key}");
        }

        // Descriptors back: probes run again, and a real failure counts.
        drop(hoard);
        let ev = next_event(&mut rx, ms(3 * interval) * fall + SLACK, "dead, probed").await;
        assert_eq!((ev.key, ev.state), (dead, HealthState::Down));
        assert!(
            matches!(ev.detail, Err(ProbeError::Connect { .. })),
            "{:?}",
            ev.detail
        );
        assert_eq!(hc.state(&live), Some(HealthState::Healthy));
        let before = probes_of(&hc, live);
        tokio::time::sleep(ms(4 * interval)).await;
        let (unknown, failures, last) = unknown_of(&hc, live);
        assert!(probes_of(&hc, live) > before, "live probed again");
        assert_eq!(failures, 0);
        assert!(unknown > 0);
        assert!(
            matches!(last.map(|o| o.result), Some(Ok(ProbeOk { .. }))),
            "live answers again"
        );
    });
}

/// A node's probe budget: 20 targets every 50 ms ask for 400 probes a
/// second; with a budget of 100, every interval runs 4 times as long
/// (200 ms), each target keeping an equal share, and the gauges say so.
/// Raising the budget past the demand brings the intervals back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_budget_stretches_every_interval_alike() {
    let server = Server::start("127.0.0.1:0", Behaviour::Close).await;
    let load = ProbeLoad::default();
    let (hc, _rx) = HealthChecker::<u32>::new(tokio::runtime::Handle::current());
    let mut hc = hc.with_budget(Some(100.0), load.clone());
    let targets = |n: u32| -> Vec<ProbeTarget<u32>> {
        (0..n)
            .map(|key| ProbeTarget {
                key,
                addr: server.addr,
                spec: tcp_spec(50, 20, 1, 1),
                initial: HealthState::Healthy,
            })
            .collect()
    };
    let probes = |hc: &HealthChecker<u32>| -> Vec<u64> {
        let mut v: Vec<(u32, u64)> = hc.status().iter().map(|s| (s.key, s.probes)).collect();
        v.sort();
        v.into_iter().map(|(_, p)| p).collect()
    };
    hc.set_targets(targets(20)).expect("valid targets");
    assert_eq!(load.demand.get(), 400.0);
    assert_eq!(load.stretch.get(), 4.0);
    // 2 s at 200 ms: 10 probes each (one more or less at the edges);
    // unstretched it would be 40.
    let window = Duration::from_secs(2);
    let before = probes(&hc);
    tokio::time::sleep(window).await;
    let got: Vec<u64> = probes(&hc)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    let total: u64 = got.iter().sum();
    assert!(
        got.iter().all(|n| (8..=12).contains(n)),
        "probes per target in {window:?} at 200 ms: {got:?}"
    );
    assert!(
        (160..=240).contains(&total),
        "{total} probes in {window:?} within a budget of 100 a second"
    );

    // The factor moves in eighths: 19 targets ask 380 a second (3.8, run
    // at 3.875); one more every second asks 381 (3.81, the same step), so
    // it starts and no other target's schedule is touched.
    let mut few = targets(19);
    let diff = hc.set_targets(few.clone()).expect("valid targets");
    assert_eq!(load.stretch.get(), 3.875);
    assert_eq!(diff.restarted, 19, "{diff:?}");
    few.push(ProbeTarget {
        key: 99,
        addr: server.addr,
        spec: tcp_spec(1_000, 20, 1, 1),
        initial: HealthState::Healthy,
    });
    let diff = hc.set_targets(few).expect("valid targets");
    assert_eq!(load.stretch.get(), 3.875);
    assert_eq!((diff.added, diff.restarted), (1, 0), "{diff:?}");
    hc.set_targets(targets(20)).expect("valid targets");
    assert_eq!(load.stretch.get(), 4.0);

    // A budget above the demand: every target at its own 50 ms again.
    let mut hc = hc.with_budget(Some(1_000.0), load.clone());
    let diff = hc.set_targets(targets(20)).expect("valid targets");
    assert_eq!(diff.restarted, 20, "{diff:?}");
    assert_eq!(load.stretch.get(), 1.0);
    let before = probes(&hc);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let total: u64 = probes(&hc).iter().zip(&before).map(|(a, b)| a - b).sum();
    assert!(
        total >= 300,
        "{total} probes in 1 s of 20 targets at 50 ms (400 expected)"
    );
}
