//! The API server against a fake state: every route, every class of
//! malformed request (right 4xx, JSON body, no write reaches the state),
//! the Unix socket end to end through the client, the TCP bearer token and
//! the metrics listener, and each listener's limits against hostile
//! clients (unfinished headers, idle connections past the cap, stalled
//! bodies, oversized headers).

mod api_support;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_support::{Fake, B1, B2, B6, VIP4, VIP6};
use rivora::api::client::{Client, ClientError};
use rivora::api::{
    api_routes, metrics_routes, serve_api, serve_metrics, serve_metrics_with, ApiConfig, ApiError,
    BackendInfo, ConnLimits, DrainOutcome, Drops, ReloadResult, ServeError, ServerHandle, Status,
    TcpApiConfig, VipInfo, METRICS_CONTENT_TYPE,
};
use serde::de::DeserializeOwned;
use warp::http::StatusCode;

const LIMIT: u64 = 1024;

async fn send(fake: &Arc<Fake>, req: warp::test::RequestBuilder) -> (StatusCode, bytes::Bytes) {
    let routes = api_routes(fake.clone(), LIMIT);
    let res = req.reply(&routes).await;
    (res.status(), res.into_body())
}

fn json<T: DeserializeOwned>(body: &[u8]) -> T {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(body)))
}

fn get(path: &str) -> warp::test::RequestBuilder {
    warp::test::request().method("GET").path(path)
}

fn post(path: &str, body: &str) -> warp::test::RequestBuilder {
    warp::test::request().method("POST").path(path).body(body)
}

/// Asserts an error status with an `ApiError` body containing `needle`.
#[track_caller]
fn assert_api_error(got: (StatusCode, bytes::Bytes), status: StatusCode, needle: &str) {
    let (s, body) = got;
    assert_eq!(s, status, "body: {:?}", String::from_utf8_lossy(&body));
    let e: ApiError = json(&body);
    assert!(
        e.error.contains(needle),
        "error {:?} should contain {needle:?}",
        e.error
    );
}

#[tokio::test]
async fn read_routes_answer_json() {
    let fake = Arc::new(Fake::default());

    let (s, body) = send(&fake, get("/v1/status")).await;
    assert_eq!(s, StatusCode::OK);
    let status: Status = json(&body);
    assert_eq!(status.config_generation, 3);
    assert_eq!(status.interfaces.len(), 2);
    let raw: serde_json::Value = json(&body);
    assert_eq!(raw["interfaces"][1]["xdp_mode"], "generic");
    assert_eq!(raw["last_reload"]["ok"], false);

    let (s, body) = send(&fake, get("/v1/vips")).await;
    assert_eq!(s, StatusCode::OK);
    let vips: Vec<VipInfo> = json(&body);
    assert_eq!(vips, fake.all_vips());
    let raw: serde_json::Value = json(&body);
    assert_eq!(raw[0]["vip"], VIP4);
    assert_eq!(raw[0]["backends"][0]["target"], B1);
    assert_eq!(raw[1]["mode"], "dsr");
    assert_eq!(raw[1]["affinity"], "client_ip");

    let (s, body) = send(&fake, get("/v1/backends")).await;
    assert_eq!(s, StatusCode::OK);
    let backends: Vec<BackendInfo> = json(&body);
    assert_eq!(backends.len(), 3);
    let raw: serde_json::Value = json(&body);
    assert_eq!(raw[1]["probe"], "down");

    let (s, body) = send(&fake, get("/v1/drops")).await;
    assert_eq!(s, StatusCode::OK);
    let drops: Drops = json(&body);
    assert_eq!(drops.by_reason.get("rate_limited"), Some(&4));
    assert_eq!(drops.rate_limited_by_vip.get(VIP4), Some(&4));
    assert!(fake.calls().is_empty(), "reads never call writes");
}

#[tokio::test]
async fn one_vip_by_encoded_or_plain_name() {
    let fake = Arc::new(Fake::default());
    for path in [
        "/v1/vips/tcp%2F10.0.0.1%3A80",
        "/v1/vips/tcp/10.0.0.1:80",
        "/v1/vips/TCP%2F10%2E0%2E0%2E1%3A80",
    ] {
        let (s, body) = send(&fake, get(path)).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        let v: VipInfo = json(&body);
        assert_eq!(v.vip, VIP4, "{path}");
    }
    let path = rivora::api::client::vip_path(VIP6);
    let (s, body) = send(&fake, get(&path)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json::<VipInfo>(&body).vip, VIP6);

    assert_api_error(
        send(&fake, get("/v1/vips/tcp%2F10.9.9.9%3A80")).await,
        StatusCode::NOT_FOUND,
        "no VIP tcp/10.9.9.9:80",
    );
    for bad in [
        "/v1/vips/nonsense",
        "/v1/vips/tcp%2F10.0.0.1",
        "/v1/vips/icmp%2F10.0.0.1%3A80",
        "/v1/vips/%FF%FE",
    ] {
        assert_api_error(
            send(&fake, get(bad)).await,
            StatusCode::BAD_REQUEST,
            "invalid VIP",
        );
    }
}

/// The routes hand the state's outcome through (changed or not, the VIPs)
/// and the read side shows the drain. Whether the daemon's drains are
/// idempotent is its own test: `e2e_rivorad::drain_and_undrain_are_idempotent`.
#[tokio::test]
async fn drain_and_undrain_routes_carry_the_outcome() {
    let fake = Arc::new(Fake::default());
    let body = format!(r#"{{"target":"{B1}","vip":"{VIP4}"}}"#);

    let (s, out) = send(&fake, post("/v1/drain", &body)).await;
    assert_eq!(s, StatusCode::OK, "{:?}", String::from_utf8_lossy(&out));
    let o: DrainOutcome = json(&out);
    assert!(o.changed);
    assert_eq!(o.vips, vec![VIP4.to_string()]);
    assert!(fake
        .drained()
        .contains(&(B1.parse().unwrap(), VIP4.to_string())));

    let (s, out) = send(&fake, post("/v1/drain", &body)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        !json::<DrainOutcome>(&out).changed,
        "the state's changed=false reaches the caller"
    );

    // The read side shows it.
    let (_, out) = send(&fake, get("/v1/vips/tcp%2F10.0.0.1%3A80")).await;
    let v: VipInfo = json(&out);
    assert!(v.backends[0].drained);

    let (s, out) = send(&fake, post("/v1/undrain", &body)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(json::<DrainOutcome>(&out).changed);
    assert!(fake.drained().is_empty());

    // Without a VIP: every VIP the backend serves; IPv6 target.
    let (s, out) = send(&fake, post("/v1/drain", &format!(r#"{{"target":"{B6}"}}"#))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json::<DrainOutcome>(&out).vips, vec![VIP6.to_string()]);
    assert_eq!(
        fake.calls(),
        vec![
            format!("drain {B1} {VIP4}"),
            format!("drain {B1} {VIP4}"),
            format!("undrain {B1} {VIP4}"),
            format!("drain {B6} *"),
        ]
    );
}

#[tokio::test]
async fn malformed_writes_are_4xx_json_and_never_reach_the_state() {
    let fake = Arc::new(Fake::default());
    let too_big = format!(
        r#"{{"target":"{B1}","vip":"{VIP4}","pad":"{}"}}"#,
        "x".repeat(LIMIT as usize)
    );
    for path in ["/v1/drain", "/v1/undrain"] {
        let cases: Vec<(warp::test::RequestBuilder, StatusCode, &str)> = vec![
            (
                post(path, "{"),
                StatusCode::BAD_REQUEST,
                "invalid request body",
            ),
            (
                post(path, "not json"),
                StatusCode::BAD_REQUEST,
                "invalid request body",
            ),
            (post(path, ""), StatusCode::BAD_REQUEST, "empty body"),
            (
                post(path, "[]"),
                StatusCode::BAD_REQUEST,
                "invalid request body",
            ),
            (
                post(path, r#"{"vip":"tcp/10.0.0.1:80"}"#),
                StatusCode::BAD_REQUEST,
                "missing field `target`",
            ),
            (
                post(path, r#"{"target":5}"#),
                StatusCode::BAD_REQUEST,
                "invalid type",
            ),
            (
                post(path, &format!(r#"{{"target":"{B1}","force":true}}"#)),
                StatusCode::BAD_REQUEST,
                "unknown field `force`",
            ),
            (
                post(path, r#"{"target":"10.0.1.1"}"#),
                StatusCode::BAD_REQUEST,
                "invalid backend target",
            ),
            (
                post(path, r#"{"target":"backend-1:8080"}"#),
                StatusCode::BAD_REQUEST,
                "invalid backend target",
            ),
            (
                post(path, r#"{"target":"10.0.1.1:99999"}"#),
                StatusCode::BAD_REQUEST,
                "invalid backend target",
            ),
            (
                post(path, &format!(r#"{{"target":"{B1}","vip":"10.0.0.1:80"}}"#)),
                StatusCode::BAD_REQUEST,
                "invalid VIP",
            ),
            (
                post(path, &too_big),
                StatusCode::PAYLOAD_TOO_LARGE,
                "larger than 1024 bytes",
            ),
            (
                warp::test::request()
                    .method("POST")
                    .path(path)
                    .header("content-length", "1000000000"),
                StatusCode::PAYLOAD_TOO_LARGE,
                "larger than",
            ),
            (
                warp::test::request()
                    .method("POST")
                    .path(path)
                    .header("transfer-encoding", "chunked"),
                StatusCode::LENGTH_REQUIRED,
                "Content-Length",
            ),
            (
                post(path, "{}").header("content-length", "two"),
                StatusCode::BAD_REQUEST,
                "Content-Length",
            ),
            (
                get(path),
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed",
            ),
        ];
        for (i, (req, status, needle)) in cases.into_iter().enumerate() {
            let got = send(&fake, req).await;
            eprintln!("{path} case {i}");
            assert_api_error(got, status, needle);
        }
    }
    assert!(fake.calls().is_empty(), "calls: {:?}", fake.calls());
    assert!(fake.drained().is_empty());
}

#[tokio::test]
async fn unknown_things_are_404_and_change_nothing() {
    let fake = Arc::new(Fake::default());
    let cases = [
        (
            r#"{"target":"10.9.9.9:80"}"#.to_string(),
            "no backend 10.9.9.9:80",
        ),
        (
            format!(r#"{{"target":"{B1}","vip":"tcp/10.9.9.9:80"}}"#),
            "no VIP tcp/10.9.9.9:80",
        ),
        (
            format!(r#"{{"target":"{B1}","vip":"{VIP6}"}}"#),
            "does not serve VIP",
        ),
    ];
    for (body, needle) in &cases {
        assert_api_error(
            send(&fake, post("/v1/drain", body)).await,
            StatusCode::NOT_FOUND,
            needle,
        );
    }
    assert!(fake.drained().is_empty());
    // The state decided these, so it was asked, but changed nothing.
    assert_eq!(fake.calls().len(), cases.len());
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json() {
    let fake = Arc::new(Fake::default());
    for path in [
        "/",
        "/nope",
        "/v2/status",
        "/v1/status/extra",
        "/v1",
        "/metrics",
    ] {
        assert_api_error(
            send(&fake, get(path)).await,
            StatusCode::NOT_FOUND,
            "no such API route",
        );
    }
    for (method, path) in [
        ("POST", "/v1/status"),
        ("DELETE", "/v1/vips"),
        ("PUT", "/v1/vips/tcp%2F10.0.0.1%3A80"),
        ("GET", "/v1/reload"),
    ] {
        let req = warp::test::request().method(method).path(path);
        assert_api_error(
            send(&fake, req).await,
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        );
    }
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn reload_outcomes() {
    let fake = Arc::new(Fake::default());
    let (s, body) = send(
        &fake,
        warp::test::request().method("POST").path("/v1/reload"),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(json::<ReloadResult>(&body).ok);
    let (s, _) = send(&fake, post("/v1/reload", "{}")).await;
    assert_eq!(s, StatusCode::OK);

    assert_api_error(
        send(&fake, post("/v1/reload", r#"{"force":true}"#)).await,
        StatusCode::BAD_REQUEST,
        "unknown field `force`",
    );
    assert_api_error(
        send(&fake, post("/v1/reload", "{")).await,
        StatusCode::BAD_REQUEST,
        "invalid request body",
    );
    assert_eq!(fake.calls(), vec!["reload", "reload"]);

    fake.fail_reload.store(true, Ordering::SeqCst);
    assert_api_error(
        send(&fake, post("/v1/reload", "")).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "running configuration kept: rivora.yaml:3",
    );
}

#[tokio::test]
async fn state_errors_keep_their_status() {
    let fake = Arc::new(Fake::default());
    fake.fail_reads.store(true, Ordering::SeqCst);
    for path in [
        "/v1/status",
        "/v1/vips",
        "/v1/backends",
        "/v1/drops",
        "/v1/vips/tcp%2F10.0.0.1%3A80",
    ] {
        assert_api_error(
            send(&fake, get(path)).await,
            StatusCode::INTERNAL_SERVER_ERROR,
            "stats map read failed",
        );
    }
}

#[tokio::test]
async fn metrics_route() {
    let fake = Arc::new(Fake::default());
    let routes = metrics_routes(fake.clone());
    let res = get("/metrics").reply(&routes).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], METRICS_CONTENT_TYPE);
    let text = String::from_utf8(res.body().to_vec()).unwrap();
    assert!(text.contains("rivora_vip_packets_total{vip=\"tcp/10.0.0.1:80\"} 1500\n"));

    let res = get("/v1/status").reply(&routes).await;
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "the API is not on the metrics port"
    );
    let res = post("/metrics", "").reply(&routes).await;
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);

    // The probes: alive whatever the status says; ready only with every
    // interface attached and every source synced, else why not.
    let res = get("/healthz").reply(&routes).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = get("/readyz").reply(&routes).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        String::from_utf8(res.body().to_vec()).unwrap(),
        "not ready: veth-long-name: tc_nat not attached; source service: first pass not done\n"
    );
    fake.fail_reads.store(true, Ordering::Relaxed);
    let res = get("/readyz").reply(&routes).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let res = get("/healthz").reply(&routes).await;
    assert_eq!(res.status(), StatusCode::OK);
    fake.fail_reads.store(false, Ordering::Relaxed);
}

fn config(socket: &Path) -> ApiConfig {
    ApiConfig {
        socket_path: socket.to_path_buf(),
        tcp: None,
        max_body_bytes: LIMIT,
        limits: ConnLimits::default(),
    }
}

/// The blocking client on a runtime-free thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/rivora/rivorad.sock");
    let fake = Arc::new(Fake::default());
    let handle = serve_api(config(&socket), fake.clone()).await.unwrap();

    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let leftovers: Vec<_> = std::fs::read_dir(socket.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec!["rivorad.sock"],
        "no staging directory left behind"
    );

    let client = Client::unix(&socket);
    let c = client.clone();
    let (status, vips, vip6, drained, unknown) = blocking(move || {
        (
            c.status().unwrap(),
            c.vips().unwrap(),
            c.vip(VIP6).unwrap(),
            c.drain(&rivora::api::DrainRequest {
                target: B2.into(),
                vip: None,
            })
            .unwrap(),
            c.vip("tcp/10.9.9.9:80").unwrap_err(),
        )
    })
    .await;
    assert_eq!(status.version, "0.1.0-test");
    assert_eq!(vips.len(), 2);
    assert_eq!(vip6.vip, VIP6);
    assert!(drained.changed);
    assert_eq!(fake.calls(), vec![format!("drain {B2} *")]);
    match unknown {
        ClientError::Api { status, message } => {
            assert_eq!(status, 404);
            assert_eq!(message, "no VIP tcp/10.9.9.9:80");
        }
        other => panic!("{other:?}"),
    }

    // A declared body over the limit is refused before it is sent.
    let s = socket.clone();
    let raw = blocking(move || {
        let mut conn = UnixStream::connect(&s).unwrap();
        // A server that waited for the body would hang the test instead
        // of failing it.
        conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        conn.write_all(
            b"POST /v1/drain HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10000000\r\n\r\n",
        )
        .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).unwrap();
        out
    })
    .await;
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(
        raw.contains(r#"{"error":"request body larger than 1024 bytes"}"#),
        "{raw}"
    );

    handle.shutdown().await;
    assert!(!socket.exists(), "shutdown removes the socket");
    let err = blocking(move || client.status().unwrap_err()).await;
    assert!(matches!(err, ClientError::NotListening { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_stale_in_use_and_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rivorad.sock");

    // A socket left by a crashed daemon: nobody listens, so it is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let fake = Arc::new(Fake::default());
    let first = serve_api(config(&socket), fake.clone()).await.unwrap();

    // A live daemon on the path is never displaced.
    match serve_api(config(&socket), fake.clone()).await {
        Err(ServeError::SocketInUse { .. }) => {}
        other => panic!("{other:?}"),
    }
    let c = Client::unix(&socket);
    blocking(move || c.status().unwrap()).await;
    first.shutdown().await;

    // A regular file at the path is not ours to delete.
    std::fs::write(&socket, "keep me").unwrap();
    match serve_api(config(&socket), fake).await {
        Err(ServeError::NotASocket { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "keep me");
}

fn raw_tcp(addr: std::net::SocketAddr, head: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    conn.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_listener_requires_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    write_token(&token_file, "s3cret-token\n");
    let fake = Arc::new(Fake::default());
    let mut cfg = config(&dir.path().join("rivorad.sock"));
    cfg.tcp = Some(TcpApiConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        token_file: token_file.clone(),
    });
    let handle = serve_api(cfg, fake.clone()).await.unwrap();
    let addr = handle.tcp_addr().unwrap();

    let (schemes, none, wrong, prefix, longer, right, from_file, unknown_route) =
        blocking(move || {
            let get = |auth: &str| {
                raw_tcp(
                    addr,
                    &format!(
                        "GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n"
                    ),
                )
            };
            let schemes: Vec<(String, String)> = [
                "authorization: bearer s3cret-token\r\n",
                "Authorization: BEARER   s3cret-token\r\n",
                "Authorization: Basic s3cret-token\r\n",
                "Authorization: Bearers3cret-token\r\n",
                "Authorization: s3cret-token\r\n",
            ]
            .iter()
            .map(|h| (h.to_string(), get(h)))
            .collect();
            (
                schemes,
                get(""),
                Client::tcp(addr.to_string(), "s3cret-tokem")
                    .status()
                    .unwrap_err(),
                Client::tcp(addr.to_string(), "s3cret")
                    .status()
                    .unwrap_err(),
                Client::tcp(addr.to_string(), "s3cret-token2")
                    .status()
                    .unwrap_err(),
                Client::tcp(addr.to_string(), "s3cret-token").status(),
                Client::tcp_with_token_file(addr.to_string(), &token_file)
                    .unwrap()
                    .vips(),
                raw_tcp(
                    addr,
                    "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                ),
            )
        })
        .await;
    // RFC 7235: the scheme is case-insensitive; another scheme, or none, is not.
    for (header, out) in &schemes {
        let want = if header.to_ascii_lowercase().contains("bearer ") {
            "HTTP/1.1 200"
        } else {
            "HTTP/1.1 401"
        };
        assert!(out.starts_with(want), "{header:?}: {out}");
    }
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert!(
        none.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{none}"
    );
    assert!(
        none.contains(r#"{"error":"missing or wrong bearer token"}"#),
        "{none}"
    );
    for err in [wrong, prefix, longer] {
        match err {
            ClientError::Api { status: 401, .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(right.unwrap().config_generation, 3);
    assert_eq!(from_file.unwrap().len(), 2);
    assert!(
        unknown_route.starts_with("HTTP/1.1 401"),
        "routes are not revealed before authentication: {unknown_route}"
    );
    // A drain without the token does not reach the state.
    let drain = blocking(move || {
        Client::tcp(addr.to_string(), "nope")
            .drain(&rivora::api::DrainRequest {
                target: B1.into(),
                vip: None,
            })
            .unwrap_err()
    })
    .await;
    assert!(matches!(drain, ClientError::Api { status: 401, .. }));
    assert!(fake.calls().is_empty());
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_listener_refuses_to_start_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rivorad.sock");
    let empty = dir.path().join("empty");
    write_token(&empty, " \n");
    for (file, want_empty) in [(dir.path().join("missing"), false), (empty, true)] {
        let mut cfg = config(&socket);
        cfg.tcp = Some(TcpApiConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            token_file: file,
        });
        match serve_api(cfg, Arc::new(Fake::default())).await {
            Err(ServeError::TokenEmpty { .. }) if want_empty => {}
            Err(ServeError::TokenFile { .. }) if !want_empty => {}
            other => panic!("{other:?}"),
        }
        assert!(!socket.exists(), "nothing is served when TCP cannot start");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rivorad.sock");
    let token = dir.path().join("token");
    write_token(&token, "s3cret-token\n");
    for mode in [0o644, 0o640, 0o604, 0o666] {
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut cfg = config(&socket);
        cfg.tcp = Some(TcpApiConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            token_file: token.clone(),
        });
        let err = serve_api(cfg, Arc::new(Fake::default()))
            .await
            .expect_err("a token others can read must be refused");
        let msg = err.to_string();
        assert!(
            matches!(err, ServeError::TokenFileMode { .. }),
            "{mode:o}: {msg}"
        );
        assert!(msg.contains(&token.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("mode {mode:04o}")), "{msg}");
        assert!(!socket.exists(), "nothing is served");
    }
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cfg = config(&socket);
    cfg.tcp = Some(TcpApiConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        token_file: token,
    });
    serve_api(cfg, Arc::new(Fake::default()))
        .await
        .unwrap()
        .shutdown()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listener() {
    let fake = Arc::new(Fake::default());
    let handle = serve_metrics("127.0.0.1:0".parse().unwrap(), fake)
        .await
        .unwrap();
    let addr = handle.tcp_addr().unwrap();
    let out = blocking(move || {
        raw_tcp(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    })
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
        "{out}"
    );
    assert!(out.contains("# TYPE rivora_health_probe_duration_seconds histogram\n"));
    handle.shutdown().await;
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "listener closed"
    );
}

fn write_token(path: &Path, token: &str) {
    std::fs::write(path, token).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Where a hostile or a normal client connects.
#[derive(Debug, Clone)]
enum Target {
    Unix(std::path::PathBuf),
    Tcp(std::net::SocketAddr),
}

enum Conn {
    Unix(UnixStream),
    Tcp(std::net::TcpStream),
}

impl Target {
    fn connect(&self) -> Conn {
        match self {
            Target::Unix(p) => Conn::Unix(UnixStream::connect(p).unwrap()),
            Target::Tcp(a) => Conn::Tcp(std::net::TcpStream::connect(a).unwrap()),
        }
    }
}

impl Conn {
    fn set_read_timeout(&self, t: Duration) {
        match self {
            Conn::Unix(s) => s.set_read_timeout(Some(t)).unwrap(),
            Conn::Tcp(s) => s.set_read_timeout(Some(t)).unwrap(),
        }
    }

    /// Everything the server sends until it closes, or `Err` if it has
    /// not closed within `within` (per read). A reset after the answer
    /// (the server closed with our bytes unread) counts as closed.
    fn read_until_closed(&mut self, within: Duration) -> Result<String, String> {
        self.set_read_timeout(within);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.read(&mut buf) {
                Ok(0) => return Ok(String::from_utf8_lossy(&out).into_owned()),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Ok(String::from_utf8_lossy(&out).into_owned())
                }
                Err(e) => {
                    return Err(format!(
                        "still open after {within:?} ({e}); received {:?}",
                        String::from_utf8_lossy(&out)
                    ))
                }
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One complete request on a fresh connection; the whole answer.
fn exchange(target: &Target, request: &str) -> String {
    let mut c = target.connect();
    c.write_all(request.as_bytes()).unwrap();
    c.read_until_closed(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{target:?}: {e}"))
}

async fn wait_until(what: &str, within: Duration, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Short timeouts so a test waits seconds, not the defaults' minutes.
fn test_limits(header: u64, idle: u64, max_connections: usize) -> ConnLimits {
    ConnLimits {
        header_read_timeout: Duration::from_secs(header),
        idle_timeout: Duration::from_secs(idle),
        max_connections,
        ..ConnLimits::default()
    }
}

/// 200 connections that never finish their headers, and one that sends a
/// header line every 100 ms: the server answers a normal client
/// meanwhile and closes every one of them at the header timeout (1 s,
/// while the idle timeout is a minute), whatever trickles in.
async fn unfinished_headers_are_cut_off(target: Target, handle: &ServerHandle, good: &'static str) {
    let t = target.clone();
    let (held, answer, trickled_for) = blocking(move || {
        let held: Vec<Conn> = (0..200)
            .map(|_| {
                let mut c = t.connect();
                c.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
                c
            })
            .collect();
        let answer = exchange(&t, good);
        let mut slow = t.connect();
        let start = Instant::now();
        let mut result = slow.write_all(b"GET /v1/status HTTP/1.1\r\n");
        while result.is_ok() && start.elapsed() < Duration::from_secs(8) {
            std::thread::sleep(Duration::from_millis(100));
            result = slow.write_all(b"X-Slow: 1\r\n");
        }
        (held, answer, start.elapsed())
    })
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{target:?}: {answer}");
    assert!(
        trickled_for < Duration::from_secs(5),
        "{target:?}: headers sent a line at a time were not cut off ({trickled_for:?})"
    );
    let t = target.clone();
    blocking(move || {
        for (i, mut c) in held.into_iter().enumerate() {
            if let Err(e) = c.read_until_closed(Duration::from_secs(5)) {
                panic!("{t:?}: connection {i} with unfinished headers {e}");
            }
        }
    })
    .await;
    wait_until(
        "the server holds no connection",
        Duration::from_secs(5),
        || handle.open_connections() == 0,
    )
    .await;
    let t = target.clone();
    let after = blocking(move || exchange(&t, good)).await;
    assert!(after.starts_with("HTTP/1.1 200"), "{target:?}: {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_headers_are_cut_off_on_every_listener() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rivorad.sock");
    let token = dir.path().join("token");
    write_token(&token, "tok");
    let fake = Arc::new(Fake::default());
    // The cap is above 200: here only the header timeout may close them.
    let limits = test_limits(1, 60, 256);
    let mut cfg = config(&socket);
    cfg.limits = limits;
    cfg.tcp = Some(TcpApiConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        token_file: token,
    });
    let api = serve_api(cfg, fake.clone()).await.unwrap();
    let metrics = serve_metrics_with("127.0.0.1:0".parse().unwrap(), fake.clone(), limits)
        .await
        .unwrap();

    unfinished_headers_are_cut_off(
        Target::Unix(socket),
        &api,
        "GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    unfinished_headers_are_cut_off(
        Target::Tcp(api.tcp_addr().unwrap()),
        &api,
        "GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\nConnection: close\r\n\r\n",
    )
    .await;
    unfinished_headers_are_cut_off(
        Target::Tcp(metrics.tcp_addr().unwrap()),
        &metrics,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(fake.calls().is_empty());
    api.shutdown().await;
    metrics.shutdown().await;
}

/// Connections past the cap are answered 503 and closed at once, without
/// waiting; the held ones stay at the cap; once the idle ones are dropped
/// a normal request succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rivorad.sock");
    let mut cfg = config(&socket);
    // Timeouts out of the way: only the cap acts here.
    cfg.limits = test_limits(60, 60, 8);
    let handle = serve_api(cfg, Arc::new(Fake::default())).await.unwrap();
    let target = Target::Unix(socket.clone());

    let t = target.clone();
    let idle: Vec<Conn> = blocking(move || (0..8).map(|_| t.connect()).collect()).await;
    wait_until("8 connections held", Duration::from_secs(5), || {
        handle.open_connections() == 8
    })
    .await;

    let t = target.clone();
    let (refusals, client) = blocking(move || {
        let refusals: Vec<Result<String, String>> = (0..20)
            .map(|_| t.connect().read_until_closed(Duration::from_secs(5)))
            .collect();
        (refusals, Client::unix(&socket).status())
    })
    .await;
    for r in refusals {
        let out = r.expect("a connection past the cap is closed at once");
        assert!(out.starts_with("HTTP/1.1 503"), "{out}");
        assert!(out.contains("too many connections"), "{out}");
    }
    match client {
        Err(ClientError::Api {
            status: 503,
            message,
        }) => {
            assert!(message.contains("too many connections"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(handle.open_connections(), 8, "never more than the cap");

    drop(idle);
    wait_until(
        "the dropped connections are released",
        Duration::from_secs(5),
        || handle.open_connections() == 0,
    )
    .await;
    let s = handle.socket_path().unwrap().to_path_buf();
    blocking(move || Client::unix(&s).status().unwrap()).await;
    handle.shutdown().await;
}

/// The metrics port, as in the report: many idle connections. At most
/// the cap is held, the rest are refused at once, the held ones are
/// closed by the idle timeout, and a scrape succeeds afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_metrics_are_capped_and_time_out() {
    let fake = Arc::new(Fake::default());
    let limits = test_limits(60, 2, 16);
    let handle = serve_metrics_with("127.0.0.1:0".parse().unwrap(), fake, limits)
        .await
        .unwrap();
    let target = Target::Tcp(handle.tcp_addr().unwrap());

    let t = target.clone();
    let conns: Vec<Conn> = blocking(move || (0..300).map(|_| t.connect()).collect()).await;
    wait_until("the cap is reached", Duration::from_secs(5), || {
        handle.open_connections() == 16
    })
    .await;
    let (refused, elapsed) = blocking(move || {
        let start = Instant::now();
        let mut refused = 0;
        for (i, mut c) in conns.into_iter().enumerate() {
            // The first one still open fails the test at once, rather
            // than after 300 waits.
            match c.read_until_closed(Duration::from_secs(6)) {
                Ok(out) if out.starts_with("HTTP/1.1 503") => refused += 1,
                // Held, then closed for idleness without a word.
                Ok(out) if out.is_empty() => {}
                other => panic!("connection {i}: {other:?}"),
            }
        }
        (refused, start.elapsed())
    })
    .await;
    assert!(
        refused >= 300 - 2 * 16,
        "only {refused} of 300 refused with a cap of 16"
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    wait_until("no connection held", Duration::from_secs(5), || {
        handle.open_connections() == 0
    })
    .await;
    let t = target.clone();
    let scrape = blocking(move || {
        exchange(
            &t,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    })
    .await;
    assert!(scrape.starts_with("HTTP/1.1 200"), "{scrape}");
    handle.shutdown().await;
}

/// The idle timeout, apart from the header timeout (a minute here): a
/// body that stops arriving, and a kept-alive connection after its
/// answer, are closed after about a second of silence; the stalled
/// request never reaches the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_and_idle_keepalives_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rivorad.sock");
    let mut cfg = config(&socket);
    cfg.limits = test_limits(60, 1, 64);
    let fake = Arc::new(Fake::default());
    let handle = serve_api(cfg, fake.clone()).await.unwrap();
    let target = Target::Unix(socket);

    let t = target.clone();
    let (stalled, keepalive) = blocking(move || {
        let timed = |request: &str| {
            let mut c = t.connect();
            c.write_all(request.as_bytes()).unwrap();
            let start = Instant::now();
            let out = c.read_until_closed(Duration::from_secs(5));
            (out, start.elapsed())
        };
        (
            timed("POST /v1/drain HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"target\":"),
            timed("GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
    })
    .await;
    let (out, took) = stalled;
    out.expect("a stalled body is closed");
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");
    let (out, took) = keepalive;
    let out = out.expect("an idle keep-alive connection is closed");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("rivorad.sock");
    let handle = serve_api(config(&socket), Arc::new(Fake::default()))
        .await
        .unwrap();
    let target = Target::Unix(socket);
    let (big, fits) = blocking(move || {
        let with = |n: usize| {
            exchange(
                &target,
                &format!(
                    "GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
                    "a".repeat(n)
                ),
            )
        };
        (with(64 * 1024), with(4 * 1024))
    })
    .await;
    assert!(big.starts_with("HTTP/1.1 431"), "{big}");
    assert!(fits.starts_with("HTTP/1.1 200"), "{fits}");
    handle.shutdown().await;
}
