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
    HealthCheckSpec, HealthChecker, HealthEvent, HealthState, ProbeError, ProbeKind, ProbeOk,
    ProbeTarget, StatusRange, TargetDiff,
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

/// The first recorded result equal to `success` at or after `since`.
fn first_result(log: &Log, since: std::time::Instant, success: bool) -> std::time::Instant {
    log.lock()
        .expect("log lock")
        .iter()
        .find(|(t, ok)| *t >= since && *ok == success)
        .map(|(t, _)| *t)
        .unwrap_or_else(|| panic!("no {success} result recorded"))
}

/// Asserts that a transition came `n - 1` intervals after the first probe
/// of its streak: exactly `n` probes, not one more, not one fewer. Half an
/// interval of tolerance; an extra or missing probe is a whole interval.
fn assert_streak(
    first: std::time::Instant,
    at: std::time::Instant,
    n: u32,
    interval: Duration,
    what: &str,
) {
    let took = at.saturating_duration_since(first);
    let want = interval * (n - 1);
    assert!(
        took + ms(10) >= want && took <= want + interval / 2,
        "{what}: {took:?} from the first probe of the streak, want {want:?} ({n} probes)"
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
    let spec = tcp_spec(interval, timeout, rise, fall);
    hc.set_targets(vec![ProbeTarget::new(server.addr, spec)])
        .expect("valid targets");

    no_event(&mut rx, ms(450), "healthy backend").await;
    assert!(probes_of(&hc, server.addr) >= 3, "probing is running");
    assert!(server.accepted.load(Ordering::Relaxed) >= 3);
    assert_eq!(hc.state(&server.addr), Some(HealthState::Healthy));

    // Taken before the stop: a probe may fail between the stop returning
    // and the next line, and the streak starts with that failure.
    let killed = std::time::Instant::now();
    server.stop().await;
    let bound = ms(fall as u64 * interval + timeout) + SLACK;
    let ev = next_event(&mut rx, bound, "killed backend").await;
    let at = std::time::Instant::now();
    assert_eq!(ev.key, server.addr);
    assert_eq!(ev.state, HealthState::Down);
    assert!(
        matches!(&ev.detail, Err(ProbeError::Connect { kind, .. }) if *kind == std::io::ErrorKind::ConnectionRefused),
        "{:?}",
        ev.detail
    );
    assert_streak(
        first_result(&log, killed, false),
        at,
        fall,
        ms(interval),
        "down",
    );
    assert_eq!(hc.state(&server.addr), Some(HealthState::Down));

    let restored = std::time::Instant::now();
    server.restart().await;
    let bound = ms(rise as u64 * interval) + SLACK;
    let ev = next_event(&mut rx, bound, "restored backend").await;
    let at = std::time::Instant::now();
    assert_eq!(ev.state, HealthState::Healthy);
    assert_eq!(ev.detail, Ok(ProbeOk { status: None }));
    assert_streak(
        first_result(&log, restored, true),
        at,
        rise,
        ms(interval),
        "up",
    );
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
    let (mut hc, mut rx) = HealthChecker::new(tokio::runtime::Handle::current());
    hc.set_targets(vec![ProbeTarget::new(server.addr, tcp_spec(30, 10, 1, 1))])
        .expect("valid targets");
    tokio::time::sleep(ms(150)).await;
    assert!(server.accepted.load(Ordering::Relaxed) >= 2);
    drop(hc);
    tokio::time::sleep(ms(50)).await;
    let after = server.accepted.load(Ordering::Relaxed);
    tokio::time::sleep(ms(200)).await;
    assert_eq!(
        server.accepted.load(Ordering::Relaxed),
        after,
        "probes after drop"
    );
    // Every sender is gone with the tasks: the channel closes.
    assert!(tokio::time::timeout(ms(500), rx.recv())
        .await
        .expect("closes")
        .is_none());
}
