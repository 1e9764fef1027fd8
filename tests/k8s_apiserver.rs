//! The test harness's real kube-apiserver (tests/common/apiserver.rs) does
//! what the Kubernetes tests will rely on: client-certificate
//! authentication as `system:masters`, RBAC refusing anyone else, objects
//! stored in etcd and read back, and EndpointSlices served.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::apiserver::ApiServer;
use common::unique;
use serde_json::{json, Value};

/// One HTTP exchange through curl: the status code and the JSON body.
/// `client` false sends no client certificate (an anonymous request).
fn request(
    api: &ApiServer,
    method: &str,
    path: &str,
    body: Option<&Value>,
    client: bool,
) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-X", method, "-w", "\n%{http_code}", "--cacert"])
        .arg(&api.ca_cert);
    if client {
        cmd.arg("--cert")
            .arg(&api.client_cert)
            .arg("--key")
            .arg(&api.client_key);
    }
    if body.is_some() {
        cmd.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
        ]);
    }
    cmd.arg(format!("{}{path}", api.url))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning curl (scripts/deps.sh curl)");
    {
        let mut stdin = child.stdin.take().expect("curl's stdin");
        if let Some(b) = body {
            stdin
                .write_all(b.to_string().as_bytes())
                .expect("writing the request body to curl");
        }
    }
    let out = child.wait_with_output().expect("waiting for curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "curl {method} {path} failed ({}): {}{}",
        out.status,
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let (body, code) = text
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("curl {method} {path}: no status line in {text:?}"));
    let code: u16 = code
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("curl {method} {path}: status {code:?}: {e}"));
    let body: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{method} {path} -> {code}: not JSON ({e}): {body}"));
    (code, body)
}

#[test]
fn real_apiserver_serves_core_and_discovery() {
    let api = ApiServer::start();
    assert!(
        api.kubeconfig.is_file(),
        "no kubeconfig at {:?}",
        api.kubeconfig
    );

    // RBAC is on: an anonymous client is refused, the admin is not.
    let (code, body) = request(&api, "GET", "/api/v1/namespaces", None, false);
    assert!(
        code == 401 || code == 403,
        "anonymous list of namespaces answered {code}: {body}"
    );

    let ns = unique("smoke-");
    let (code, body) = request(
        &api,
        "POST",
        "/api/v1/namespaces",
        Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
        true,
    );
    assert_eq!(code, 201, "creating namespace {ns}: {body}");

    let (code, body) = request(&api, "GET", "/api/v1/namespaces", None, true);
    assert_eq!(code, 200, "listing namespaces: {body}");
    assert_eq!(body["kind"], "NamespaceList", "{body}");
    let names: Vec<&str> = body["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items in {body}"))
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&ns.as_str()), "{ns} not in {names:?}");

    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "smoke"},
        "data": {"vip": "10.0.0.1:80"},
    });
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let (code, body) = request(&api, "POST", &path, Some(&cm), true);
    assert_eq!(code, 201, "creating a ConfigMap: {body}");
    let (code, body) = request(&api, "GET", &format!("{path}/smoke"), None, true);
    assert_eq!(code, 200, "reading the ConfigMap back: {body}");
    assert_eq!(body["data"], json!({"vip": "10.0.0.1:80"}), "{body}");
    assert!(
        body["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty()),
        "the stored ConfigMap has no uid: {body}"
    );

    // The EndpointSlice API the service source will watch.
    let (code, body) = request(&api, "GET", "/apis/discovery.k8s.io/v1", None, true);
    assert_eq!(code, 200, "discovery.k8s.io/v1: {body}");
    let served = body["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("no resources in {body}"))
        .iter()
        .any(|r| r["name"] == "endpointslices" && r["kind"] == "EndpointSlice");
    assert!(served, "endpointslices not served: {body}");
}
