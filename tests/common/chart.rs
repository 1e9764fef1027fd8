//! The Helm chart in tests: the pinned helm (`scripts/chart.sh tools`
//! puts it in target/tools/bin; `make test` does that first) and the
//! chart rendered into objects, as `helm template` renders them.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The helm the tests drive: `$RIVORA_HELM`, else target/tools/bin/helm.
pub fn helm() -> PathBuf {
    let p = std::env::var_os("RIVORA_HELM")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/bin/helm"));
    assert!(
        p.is_file(),
        "{} is missing: `scripts/chart.sh tools` (make test runs it) installs the pinned helm",
        p.display()
    );
    p
}

/// A PATH with the pinned helm first, for `rivora`, which finds helm there.
pub fn path_with_helm() -> std::ffi::OsString {
    let dir = helm().parent().expect("helm's directory").to_path_buf();
    let old = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&old))).expect("a PATH")
}

/// `helm template` of helm/ with `args`, as JSON objects.
pub fn render(args: &[&str]) -> Vec<Value> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("helm");
    let out = Command::new(helm())
        .args(["template", "rivora"])
        .arg(&chart)
        .args(["--namespace", "rivora-system"])
        .args(args)
        .output()
        .expect("running helm template");
    assert!(
        out.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("a rendered document"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The one rendered object of `kind` called `name`.
pub fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// The capabilities a container of the rivorad DaemonSet is granted (it
/// drops every other), in the chart's order.
pub fn rivorad_capabilities(objects: &[Value], container: &str) -> Vec<String> {
    let ds = object(objects, "DaemonSet", "rivorad");
    let spec = &ds["spec"]["template"]["spec"];
    let c = spec["containers"]
        .as_array()
        .into_iter()
        .chain(spec["initContainers"].as_array())
        .flatten()
        .find(|c| c["name"] == container)
        .unwrap_or_else(|| panic!("no container {container} in the DaemonSet"));
    let caps = &c["securityContext"]["capabilities"];
    assert_eq!(
        caps["drop"],
        serde_json::json!(["ALL"]),
        "{container} drops every capability first"
    );
    caps["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .map(|v| v.as_str().expect("a capability name").to_string())
        .collect()
}
