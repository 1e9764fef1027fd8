//! The API server against a fake state: every route, every class of
//! malformed request (right 4xx, JSON body, no write reaches the state),
//! the Unix socket end to end through the client, the TCP bearer token and
//! the metrics listener.

mod api_support;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use api_support::{Fake, B1, B2, B6, VIP4, VIP6};
use rivora::api::client::{Client, ClientError};
use rivora::api::{
    api_routes, metrics_routes, serve_api, serve_metrics, ApiConfig, ApiError, BackendInfo,
    DrainOutcome, Drops, ReloadResult, ServeError, Status, TcpApiConfig, VipInfo,
    METRICS_CONTENT_TYPE,
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
}

fn config(socket: &Path) -> ApiConfig {
    ApiConfig {
        socket_path: socket.to_path_buf(),
        tcp: None,
        max_body_bytes: LIMIT,
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
    assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
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
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let fake = Arc::new(Fake::default());
    let mut cfg = config(&dir.path().join("rivorad.sock"));
    cfg.tcp = Some(TcpApiConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        token_file: token_file.clone(),
    });
    let handle = serve_api(cfg, fake.clone()).await.unwrap();
    let addr = handle.tcp_addr().unwrap();

    let (none, wrong, prefix, longer, right, from_file, unknown_route) = blocking(move || {
        let get = |auth: &str| {
            raw_tcp(
                addr,
                &format!("GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n"),
            )
        };
        (
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
    std::fs::write(&empty, " \n").unwrap();
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
