//! `rivora install`, `status`, `upgrade` and `uninstall` end to end: the
//! real binary, the pinned helm, and a real kube-apiserver and etcd of
//! this test's own (a fresh cluster: no CRD installed, and Rivora's
//! cluster-scoped objects have fixed names, so no other test may share
//! it). No kubelet or controller-manager runs there: the test checks the
//! objects themselves, the CRDs established, the RBAC of each
//! ServiceAccount rule by rule and by SubjectAccessReview, and it writes
//! the statuses the DaemonSet and Deployment controllers and the kubelet
//! would write to see `rivora status` report them as they are.
//!
//! Round one (namespace rivora-system, the default): install with --mode
//! l2; every object and its settings; the RBAC, exactly; status before and
//! after the controllers "ran", --wait returning once all is ready;
//! uninstall: nothing of Rivora's is left in the cluster.
//! Round two (namespace rivora-two): a wrong value refused before
//! anything is created; install with the Gateway API CRDs (the
//! GatewayClass appears); upgrade with changed values, which keeps the
//! values given before and puts back a CRD edited behind Helm's back;
//! uninstall --keep-crds keeps the CRDs and an AddressPool in them, and
//! nothing else.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::apiserver::ApiServer;
use common::chart::{path_with_helm, render, rivorad_capabilities};
use common::k8s::Kube;
use common::rivorad::bins;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::discovery::{verbs, Discovery, Scope};
use serde_json::{json, Value};

/// The `rivora` binary against one API server, with the pinned helm on
/// PATH and helm's caches in a directory of the test's own.
struct Cli {
    kubeconfig: PathBuf,
    helm_home: tempfile::TempDir,
}

impl Cli {
    fn command(&self, ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new(bins::rivora());
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", ns])
            .args(args)
            .env("PATH", path_with_helm())
            .env("HELM_CACHE_HOME", self.helm_home.path().join("cache"))
            .env("HELM_CONFIG_HOME", self.helm_home.path().join("config"))
            .env("HELM_DATA_HOME", self.helm_home.path().join("data"))
            .env_remove("RIVORA_HELM")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, ns: &str, args: &[&str]) -> Output {
        self.command(ns, args).output().expect("running rivora")
    }

    /// Run, and panic with its output unless it exits 0.
    fn ok(&self, ns: &str, args: &[&str]) -> String {
        let out = self.run(ns, args);
        assert!(
            out.status.success(),
            "rivora {args:?} ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn status(&self, ns: &str) -> (i32, Value) {
        let out = self.run(ns, &["status", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "rivora status -o json: {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), v)
    }
}

fn row<'a>(status: &'a Value, kind: &str, name: &str) -> &'a Value {
    status["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["kind"] == kind && r["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} row in {status:#}"))
}

// ---------------------------------------------------------------------
// RBAC, rule by rule
// ---------------------------------------------------------------------

/// One permission: (namespace or "*" for cluster-wide, API group,
/// resource[/subresource], verb, resource name or "*").
type Grant = (String, String, String, String, String);

fn expand(scope: &str, rules: &[PolicyRule], out: &mut BTreeSet<Grant>) {
    for r in rules {
        let names: Vec<String> = match &r.resource_names {
            Some(n) if !n.is_empty() => n.clone(),
            _ => vec!["*".into()],
        };
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    for n in &names {
                        out.insert((scope.into(), g.clone(), res.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
        assert!(r.non_resource_urls.is_none(), "a non-resource rule: {r:?}");
    }
}

/// Everything bound to ServiceAccount `ns/sa`, from the bindings
/// themselves.
fn grants_of(kube: &Kube, ns: &str, sa: &str) -> BTreeSet<Grant> {
    let is_sa = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(ns)
        })
    };
    let mut out = BTreeSet::new();
    let crbs: Api<ClusterRoleBinding> = Api::all(kube.client.clone());
    let crs: Api<ClusterRole> = Api::all(kube.client.clone());
    for b in kube
        .block_on(crbs.list(&ListParams::default()))
        .expect("CRBs")
        .items
    {
        if is_sa(&b.subjects) {
            let role = kube
                .block_on(crs.get(&b.role_ref.name))
                .expect("the ClusterRole");
            expand("*", role.rules.as_deref().unwrap_or_default(), &mut out);
        }
    }
    let rbs: Api<RoleBinding> = Api::all(kube.client.clone());
    for b in kube
        .block_on(rbs.list(&ListParams::default()))
        .expect("RBs")
        .items
    {
        if !is_sa(&b.subjects) {
            continue;
        }
        let bns = b.metadata.namespace.clone().expect("a namespaced binding");
        let rules = if b.role_ref.kind == "Role" {
            let roles: Api<Role> = Api::namespaced(kube.client.clone(), &bns);
            kube.block_on(roles.get(&b.role_ref.name))
                .expect("the Role")
                .rules
        } else {
            kube.block_on(crs.get(&b.role_ref.name))
                .expect("the ClusterRole")
                .rules
        };
        expand(&bns, rules.as_deref().unwrap_or_default(), &mut out);
    }
    out
}

fn grants(scope: &str, group: &str, resources: &[&str], verbs: &[&str], name: &str) -> Vec<Grant> {
    let mut v = Vec::new();
    for r in resources {
        for vb in verbs {
            v.push((
                scope.into(),
                group.into(),
                (*r).into(),
                (*vb).into(),
                name.into(),
            ));
        }
    }
    v
}

const GATEWAY_KINDS: &[&str] = &[
    "gatewayclasses",
    "gateways",
    "tcproutes",
    "udproutes",
    "referencegrants",
];

/// What docs/kubernetes.md says rivorad needs (and the announcement mode adds:
/// `bgp`, the BGP speaker's, from its "BGP" section).
fn rivorad_needs(ns: &str, bgp: bool) -> BTreeSet<Grant> {
    let mut s = BTreeSet::new();
    s.extend(grants(
        "*",
        "",
        &["services", "namespaces"],
        &["get", "list", "watch"],
        "*",
    ));
    s.extend(grants(
        "*",
        "discovery.k8s.io",
        &["endpointslices"],
        &["get", "list", "watch"],
        "*",
    ));
    // AddressPools: only their addresses are served (and the L2
    // speaker reads which ask for L2).
    s.extend(grants(
        "*",
        "rivora.io",
        &["servicepolicies", "addresspools"],
        &["get", "list", "watch"],
        "*",
    ));
    s.extend(grants(
        "*",
        "gateway.networking.k8s.io",
        GATEWAY_KINDS,
        &["get", "list", "watch"],
        "*",
    ));
    s.extend(grants(
        "*",
        "events.k8s.io",
        &["events"],
        &["create", "patch"],
        "*",
    ));
    // The L2 speaker's (it runs with Kubernetes whatever the mode).
    s.extend(grants("*", "", &["nodes"], &["get", "list", "watch"], "*"));
    s.extend(grants(
        ns,
        "coordination.k8s.io",
        &["leases"],
        &["get", "list", "watch", "create", "update"],
        "*",
    ));
    // persistDatapath (the default): its own DaemonSet, at a stop.
    s.extend(grants(ns, "apps", &["daemonsets"], &["get"], "rivorad"));
    if bgp {
        s.extend(grants(
            "*",
            "rivora.io",
            &["bgppeers"],
            &["get", "list", "watch"],
            "*",
        ));
        s.extend(grants(
            "*",
            "rivora.io",
            &["bgpnodestatuses", "bgpnodestatuses/status"],
            &["get", "create", "patch"],
            "*",
        ));
        // The BGPPeers' password Secrets, in the release's namespace.
        s.extend(grants(ns, "", &["secrets"], &["get"], "*"));
    }
    s
}

/// What docs/kubernetes.md says the controller needs.
fn controller_needs(ns: &str) -> BTreeSet<Grant> {
    let mut s = BTreeSet::new();
    s.extend(grants(
        "*",
        "",
        &["services", "namespaces"],
        &["get", "list", "watch"],
        "*",
    ));
    s.extend(grants(
        "*",
        "rivora.io",
        &["addresspools", "servicepolicies"],
        &["get", "list", "watch"],
        "*",
    ));
    s.extend(grants(
        "*",
        "discovery.k8s.io",
        &["endpointslices"],
        &["get", "list", "watch"],
        "*",
    ));
    s.extend(grants(
        "*",
        "gateway.networking.k8s.io",
        GATEWAY_KINDS,
        &["get", "list", "watch"],
        "*",
    ));
    s.extend(grants("*", "", &["services/status"], &["patch"], "*"));
    s.extend(grants(
        "*",
        "rivora.io",
        &["addresspools/status", "servicepolicies/status"],
        &["patch"],
        "*",
    ));
    s.extend(grants(
        "*",
        "gateway.networking.k8s.io",
        &[
            "gatewayclasses/status",
            "gateways/status",
            "tcproutes/status",
            "udproutes/status",
        ],
        &["update"],
        "*",
    ));
    s.extend(grants(
        ns,
        "coordination.k8s.io",
        &["leases"],
        &["create"],
        "*",
    ));
    s.extend(grants(
        ns,
        "coordination.k8s.io",
        &["leases"],
        &["get", "update"],
        "rivora-controller",
    ));
    s.extend(grants(
        "*",
        "events.k8s.io",
        &["events"],
        &["create", "patch"],
        "*",
    ));
    s
}

/// The API server's own answer for ServiceAccount `ns/sa`.
fn allowed(kube: &Kube, ns: &str, sa: &str, g: &Grant) -> bool {
    let (scope, group, resource, verb, name) = g;
    let (res, sub) = resource.split_once('/').unwrap_or((resource, ""));
    let mut attrs = json!({ "verb": verb, "group": group, "resource": res });
    if !sub.is_empty() {
        attrs["subresource"] = json!(sub);
    }
    if name != "*" {
        attrs["name"] = json!(name);
    }
    // A cluster-wide grant holds in any namespace: ask in a user's.
    attrs["namespace"] = json!(if scope == "*" {
        "default"
    } else {
        scope.as_str()
    });
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{ns}:{sa}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "resourceAttributes": attrs,
        },
    }))
    .expect("a SubjectAccessReview");
    let api: Api<SubjectAccessReview> = Api::all(kube.client.clone());
    kube.block_on(api.create(&PostParams::default(), &review))
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

/// Exactly what each ServiceAccount needs, and refused what it must not
/// have. `secret_namespaces`: announce.bgp.secretNamespaces, where rivorad
/// also gets (only gets) Secrets.
fn check_rbac(kube: &Kube, ns: &str, bgp: bool, secret_namespaces: &[&str]) {
    let mut rivorad_want = rivorad_needs(ns, bgp);
    let mut rivorad_refused = Vec::new();
    for sns in secret_namespaces {
        rivorad_want.insert((
            sns.to_string(),
            String::new(),
            "secrets".into(),
            "get".into(),
            "*".into(),
        ));
        rivorad_refused.push((*sns, "", "secrets", "list", "*"));
        rivorad_refused.push((*sns, "", "secrets", "watch", "*"));
    }
    for (sa, want, refused) in [
        (
            "rivorad",
            rivorad_want,
            [
                rivorad_refused,
                vec![
                    ("default", "", "secrets", "get", "*"),
                    (ns, "", "secrets", "list", "*"),
                    (ns, "", "secrets", "watch", "*"),
                    ("*", "rivora.io", "bgppeers", "create", "*"),
                    ("*", "rivora.io", "bgppeers/status", "patch", "*"),
                    ("*", "rivora.io", "bgpnodestatuses", "delete", "*"),
                    ("*", "rivora.io", "bgpnodestatuses", "update", "*"),
                    ("*", "", "services", "update", "*"),
                    ("*", "", "services/status", "patch", "*"),
                    ("*", "", "secrets", "get", "*"),
                    ("*", "", "pods", "list", "*"),
                    ("*", "", "nodes", "patch", "*"),
                    ("*", "rivora.io", "addresspools/status", "patch", "*"),
                    ("default", "coordination.k8s.io", "leases", "create", "*"),
                    (ns, "coordination.k8s.io", "leases", "delete", "*"),
                    ("*", "rivora.io", "servicepolicies", "update", "*"),
                    // The controller is the one writer of policy status.
                    ("*", "rivora.io", "servicepolicies/status", "patch", "*"),
                    (
                        "*",
                        "gateway.networking.k8s.io",
                        "gateways/status",
                        "update",
                        "*",
                    ),
                    ("*", "events.k8s.io", "events", "delete", "*"),
                ],
            ]
            .concat(),
        ),
        (
            "rivora-controller",
            controller_needs(ns),
            vec![
                ("*", "", "services", "update", "*"),
                ("*", "", "services", "patch", "*"),
                ("*", "", "secrets", "get", "*"),
                ("*", "discovery.k8s.io", "endpointslices", "update", "*"),
                ("*", "rivora.io", "servicepolicies", "update", "*"),
                ("*", "rivora.io", "addresspools", "update", "*"),
                ("*", "coordination.k8s.io", "leases", "create", "*"),
                (
                    ns,
                    "coordination.k8s.io",
                    "leases",
                    "update",
                    "someone-else",
                ),
                (
                    ns,
                    "coordination.k8s.io",
                    "leases",
                    "delete",
                    "rivora-controller",
                ),
                (ns, "coordination.k8s.io", "leases", "list", "*"),
            ],
        ),
    ] {
        let got = grants_of(kube, ns, sa);
        let missing: Vec<&Grant> = want.difference(&got).collect();
        let extra: Vec<&Grant> = got.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{sa}: RBAC is not exactly what it needs\nmissing: {missing:#?}\nextra: {extra:#?}"
        );
        for g in &want {
            assert!(allowed(kube, ns, sa, g), "{sa} may not {g:?}");
        }
        for (scope, group, res, verb, name) in refused {
            let g: Grant = (
                scope.into(),
                group.into(),
                res.into(),
                verb.into(),
                name.into(),
            );
            assert!(!allowed(kube, ns, sa, &g), "{sa} may {g:?}");
        }
        eprintln!("{sa}: {} grants, exactly what it needs", want.len());
    }
}

// ---------------------------------------------------------------------
// What the controllers and the kubelet would write
// ---------------------------------------------------------------------

fn patch_status<K>(api: &Api<K>, name: &str, kube: &Kube, status: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    kube.block_on(api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": status })),
    ))
    .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}

/// A rivorad pod on `node`, as the DaemonSet controller creates it (the
/// template's labels, bound to the node).
fn rivorad_pod(kube: &Kube, ns: &str, ds: &DaemonSet, node: &str) -> String {
    let name = format!("rivorad-{node}");
    let labels = ds
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "spec": { "nodeName": node, "serviceAccountName": "rivorad", "automountServiceAccountToken": false,
                  "containers": [{ "name": "rivorad", "image": "rivora:test" }] },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(kube.client.clone(), ns);
    kube.block_on(pods.create(&PostParams::default(), &pod))
        .expect("a pod");
    name
}

/// Now, as a Lease's MicroTime (microseconds, as the API server wants).
fn now_micro() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .expect("a MicroTime")
}

fn renew_lease(kube: &Kube, ns: &str, holder: &str) {
    let leases: Api<DynamicObject> = Api::namespaced_with(
        kube.client.clone(),
        ns,
        &ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&()),
    );
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": "rivora-controller", "namespace": ns },
        "spec": { "holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": now_micro() },
    });
    kube.block_on(leases.patch(
        "rivora-controller",
        &PatchParams::apply("e2e-test").force(),
        &Patch::Apply(&lease),
    ))
    .expect("the Lease");
}

// ---------------------------------------------------------------------
// Nothing left
// ---------------------------------------------------------------------

/// Every object of a namespaced kind left in `ns`, by discovery.
fn left_in(kube: &Kube, ns: &str) -> Vec<String> {
    let d = kube
        .block_on(Discovery::new(kube.client.clone()).run())
        .expect("discovery");
    let mut left = Vec::new();
    for g in d.groups() {
        for (ar, caps) in g.recommended_resources() {
            if caps.scope != Scope::Namespaced || !caps.supports_operation(verbs::LIST) {
                continue;
            }
            // Events are the API server's own record and expire.
            if ar.kind == "Event" {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(kube.client.clone(), ns, &ar);
            if let Ok(list) = kube.block_on(api.list(&ListParams::default())) {
                for o in list.items {
                    left.push(format!(
                        "{} {}",
                        ar.kind,
                        o.metadata.name.unwrap_or_default()
                    ));
                }
            }
        }
    }
    left
}

fn cluster_leftovers(kube: &Kube) -> Vec<String> {
    let mut left = Vec::new();
    let crs: Api<ClusterRole> = Api::all(kube.client.clone());
    for r in kube
        .block_on(crs.list(&ListParams::default()))
        .unwrap()
        .items
    {
        let n = r.metadata.name.unwrap_or_default();
        if n.starts_with("rivora") {
            left.push(format!("ClusterRole {n}"));
        }
    }
    let crbs: Api<ClusterRoleBinding> = Api::all(kube.client.clone());
    for r in kube
        .block_on(crbs.list(&ListParams::default()))
        .unwrap()
        .items
    {
        let n = r.metadata.name.unwrap_or_default();
        if n.starts_with("rivora") {
            left.push(format!("ClusterRoleBinding {n}"));
        }
    }
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    for c in kube
        .block_on(crds.list(&ListParams::default()))
        .unwrap()
        .items
    {
        left.push(format!("CRD {}", c.metadata.name.unwrap_or_default()));
    }
    left
}

/// Gone, or deleted and waiting for the namespace controller (none runs).
fn namespace_gone(kube: &Kube, ns: &str) -> bool {
    let api: Api<Namespace> = Api::all(kube.client.clone());
    match kube
        .block_on(api.get_opt(ns))
        .expect("reading the namespace")
    {
        None => true,
        Some(n) => n.metadata.deletion_timestamp.is_some(),
    }
}

fn crd(kube: &Kube, name: &str) -> Option<CustomResourceDefinition> {
    let api: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    kube.block_on(api.get_opt(name)).expect("reading a CRD")
}

// ---------------------------------------------------------------------
// The rounds
// ---------------------------------------------------------------------

fn round_one(cli: &Cli, kube: &Kube) {
    let ns = "rivora-system";
    let out = cli.ok(ns, &["install", "--mode", "l2"]);
    assert!(
        out.contains("rivora status --namespace rivora-system --wait"),
        "NOTES: {out}"
    );

    // The namespace, made for the host's network and paths.
    let nsapi: Api<Namespace> = Api::all(kube.client.clone());
    let n = kube.block_on(nsapi.get(ns)).expect("the namespace");
    let labels = n.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged")
    );
    assert_eq!(
        labels.get("rivora.io/created-by").map(String::as_str),
        Some("rivora")
    );

    // rivorad: host network, the chart's capabilities and no others, the
    // host paths, persistence, one node at a time, readiness from /readyz,
    // the doctor first.
    let dss: Api<DaemonSet> = Api::namespaced(kube.client.clone(), ns);
    let ds = kube
        .block_on(dss.get("rivorad"))
        .expect("the rivorad DaemonSet");
    let v = serde_json::to_value(&ds).unwrap();
    let pod = &v["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["serviceAccountName"], "rivorad");
    let rendered = render(&["--set", "announce.mode=l2"]);
    let caps = rivorad_capabilities(&rendered, "rivorad");
    let c = &pod["containers"][0];
    assert_eq!(
        c["securityContext"]["capabilities"],
        json!({ "drop": ["ALL"], "add": caps })
    );
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for a in ["-kubernetes", "-persist-datapath", "-config"] {
        assert!(args.contains(&a), "rivorad args {args:?} lack {a}");
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], 9441);
    // On the host's network, metrics listen on the node's own address
    // (the pod's, where the probes go), not on every address it has.
    let at = args
        .iter()
        .position(|a| *a == "-metrics-listen")
        .unwrap_or_else(|| panic!("rivorad args {args:?} lack -metrics-listen"));
    assert_eq!(args.get(at + 1), Some(&"$(RIVORA_HOST_IP):9441"));
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "RIVORA_HOST_IP"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"),
        "{}",
        c["env"]
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        assert!(
            c[probe]["httpGet"]["host"].is_null(),
            "{probe}: {}",
            c[probe]
        );
    }
    let mounts: BTreeSet<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(
        mounts,
        BTreeSet::from(["/sys/fs/bpf", "/run/rivora", "/var/lib/rivora"])
    );
    assert_eq!(
        v["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        1
    );
    assert_eq!(v["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"], 0);
    let doctor = &pod["initContainers"][0];
    assert_eq!(doctor["name"], "doctor");
    let dargs: Vec<&str> = doctor["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        dargs.windows(2).any(|w| w == ["--announce", "l2"]),
        "{dargs:?}"
    );
    // The node configuration is one rivorad's own parser accepts.
    let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), ns);
    let cm = kube
        .block_on(cms.get("rivorad-config"))
        .expect("the node configuration");
    let text = cm.data.unwrap()["rivora.yaml"].clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rivora.yaml");
    std::fs::write(&file, &text).unwrap();
    let cfg = rivora_model::config::load(&file).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(cfg.file.interfaces[0].name, "eth0");
    assert!(cfg.desired.vips.is_empty(), "node settings only");

    // The controller: two replicas apart, a disruption budget.
    let deps: Api<Deployment> = Api::namespaced(kube.client.clone(), ns);
    let dep = serde_json::to_value(
        kube.block_on(deps.get("rivora-controller"))
            .expect("the Deployment"),
    )
    .unwrap();
    assert_eq!(dep["spec"]["replicas"], 2);
    let anti = &dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    assert_eq!(
        anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"],
        "kubernetes.io/hostname"
    );
    let pdbs: Api<DynamicObject> = Api::namespaced_with(
        kube.client.clone(),
        ns,
        &ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&()),
    );
    let pdb = kube
        .block_on(pdbs.get("rivora-controller"))
        .expect("the PDB");
    assert_eq!(pdb.data["spec"]["minAvailable"], 1);
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(kube.client.clone(), ns);
    for (s, port) in [
        ("rivorad-metrics", 9441),
        ("rivora-controller-metrics", 9442),
    ] {
        let svc = serde_json::to_value(kube.block_on(svcs.get(s)).expect(s)).unwrap();
        assert_eq!(svc["spec"]["ports"][0]["port"], port, "{s}");
    }

    // The CRDs: established, and marked as this release's.
    for name in ["addresspools.rivora.io", "servicepolicies.rivora.io"] {
        let c = crd(kube, name).unwrap_or_else(|| panic!("{name} installed"));
        let est = c
            .status
            .unwrap()
            .conditions
            .unwrap()
            .into_iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(est, "{name} established");
        assert_eq!(
            c.metadata
                .annotations
                .unwrap()
                .get("rivora.io/installed-by")
                .map(String::as_str),
            Some("rivora-system/rivora")
        );
    }
    // No Gateway API here: no GatewayClass was attempted, and NOTES said so.
    assert!(out.contains("No GatewayClass was created"), "{out}");

    check_rbac(kube, ns, false, &[]);

    // Status, honestly: nothing has run.
    let (code, st) = cli.status(ns);
    assert_eq!(code, 1, "{st:#}");
    assert_eq!(st["ready"], false);
    assert!(row(&st, "daemonset", "rivorad")["detail"]
        .as_str()
        .unwrap()
        .contains("not yet rolled out"));
    assert!(row(&st, "deployment", "rivora-controller")["detail"]
        .as_str()
        .unwrap()
        .contains("not yet rolled out"));
    assert_eq!(
        row(&st, "leader", "rivora-controller")["detail"],
        "no Lease: no rivora-controller replica has led yet"
    );
    assert_eq!(row(&st, "crd", "addresspools.rivora.io")["ready"], true);

    // The controllers and kubelets, as they would write: two nodes, one
    // of which failed the doctor; both controller replicas ready; a leader.
    let generation = ds.metadata.generation.unwrap();
    patch_status(
        &dss,
        "rivorad",
        kube,
        json!({
            "observedGeneration": generation, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
            "numberMisscheduled": 0, "numberReady": 1, "updatedNumberScheduled": 2, "numberAvailable": 1,
            "numberUnavailable": 1,
        }),
    );
    let pods: Api<Pod> = Api::namespaced(kube.client.clone(), ns);
    let p1 = rivorad_pod(kube, ns, &ds, "node-a");
    let p2 = rivorad_pod(kube, ns, &ds, "node-b");
    let ready_pod = json!({
        "phase": "Running",
        "conditions": [{ "type": "Ready", "status": "True" }],
        "initContainerStatuses": [{ "name": "doctor", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "state": { "terminated": { "exitCode": 0, "reason": "Completed" } } }],
        "containerStatuses": [{ "name": "rivorad", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "state": { "running": {} } }],
    });
    patch_status(&pods, &p1, kube, ready_pod.clone());
    patch_status(
        &pods,
        &p2,
        kube,
        json!({
            "phase": "Pending",
            "conditions": [{ "type": "Ready", "status": "False" }],
            "initContainerStatuses": [{ "name": "doctor", "image": "i", "imageID": "", "ready": false, "restartCount": 4,
                "state": { "waiting": { "reason": "CrashLoopBackOff" } },
                "lastState": { "terminated": { "exitCode": 1, "reason": "Error" } } }],
        }),
    );
    let dgen = dep["metadata"]["generation"].as_i64().unwrap();
    patch_status(
        &deps,
        "rivora-controller",
        kube,
        json!({
            "observedGeneration": dgen, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2,
        }),
    );
    renew_lease(kube, ns, "rivora-controller-0");
    let (code, st) = cli.status(ns);
    assert_eq!(code, 1, "{st:#}");
    assert_eq!(
        row(&st, "daemonset", "rivorad")["detail"],
        "1/2 nodes ready, 2/2 up to date, 1 unavailable"
    );
    assert_eq!(row(&st, "node", "node-a")["ready"], true);
    assert_eq!(
        row(&st, "node", "node-b")["detail"],
        "rivorad-node-b: rivora-doctor failed (exit 1): kubectl -n rivora-system logs rivorad-node-b -c doctor"
    );
    assert_eq!(
        row(&st, "deployment", "rivora-controller")["detail"],
        "2/2 replicas ready, 2/2 up to date"
    );
    assert!(row(&st, "leader", "rivora-controller")["detail"]
        .as_str()
        .unwrap()
        .starts_with("rivora-controller-0, renewed"));

    // --wait returns once the node is fixed and its rivorad ready.
    let mut waiting: Child = cli
        .command(ns, &["status", "--wait", "--timeout", "90s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rivora status --wait");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "status --wait returned while not ready"
    );
    patch_status(&pods, &p2, kube, ready_pod);
    patch_status(
        &dss,
        "rivorad",
        kube,
        json!({ "numberReady": 2, "numberAvailable": 2, "numberUnavailable": 0 }),
    );
    renew_lease(kube, ns, "rivora-controller-0");
    let t0 = Instant::now();
    let out = waiting.wait_with_output().expect("status --wait");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.starts_with("Rivora 0.1.0 in namespace rivora-system: ready"),
        "{table}"
    );
    eprintln!(
        "status --wait returned {:?} after the last fix",
        t0.elapsed()
    );

    // Uninstall: nothing of Rivora's is left.
    let out = cli.ok(ns, &["uninstall"]);
    for line in [
        "removed release rivora from rivora-system",
        "removed Lease rivora-controller",
        "removed CRD addresspools.rivora.io",
        "removed CRD servicepolicies.rivora.io",
        "removed namespace rivora-system",
    ] {
        assert!(out.contains(line), "uninstall said: {out}");
    }
    // The pods the test wrote as the DaemonSet controller would: the
    // garbage collector's to remove and the kubelet's to confirm, and
    // neither runs here.
    for p in [&p1, &p2] {
        kube.block_on(pods.delete(p, &DeleteParams::default().grace_period(0)))
            .expect("a pod");
    }
    let left = left_in(kube, ns);
    assert!(left.is_empty(), "left in {ns}: {left:?}");
    let left = cluster_leftovers(kube);
    assert!(left.is_empty(), "left in the cluster: {left:?}");
    assert!(namespace_gone(kube, ns));
}

fn round_two(cli: &Cli, kube: &Kube) {
    let ns = "rivora-two";
    // A wrong value: refused with its path, and nothing created.
    let out = cli.run("rivora-bad", &["install", "--set", "announce.mode=ospf"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("at '/announce/mode': value must be one of 'l2', 'bgp', 'none'"),
        "{err}"
    );
    assert!(
        namespace_gone(kube, "rivora-bad"),
        "the namespace made for it was removed"
    );
    assert!(
        cluster_leftovers(kube).is_empty(),
        "{:?}",
        cluster_leftovers(kube)
    );

    let out = cli.ok(
        ns,
        &["install", "--mode", "l2", "--gateway-api-crds", "standard"],
    );
    assert!(!out.contains("No GatewayClass"), "{out}");
    let classes: Api<DynamicObject> = Api::all_with(
        kube.client.clone(),
        &common::k8s::gateway_api_resource("GatewayClass", "gatewayclasses"),
    );
    let gc = kube
        .block_on(classes.get("rivora"))
        .expect("the GatewayClass");
    assert_eq!(
        gc.data["spec"]["controllerName"],
        "rivora.io/gateway-controller"
    );
    let gw = crd(kube, "gateways.gateway.networking.k8s.io").expect("the Gateway CRD");
    let ann = gw.metadata.annotations.unwrap_or_default();
    assert_eq!(
        ann.get("gateway.networking.k8s.io/channel")
            .map(String::as_str),
        Some("standard")
    );
    assert_eq!(
        ann.get("rivora.io/installed-by").map(String::as_str),
        Some("rivora-two/rivora")
    );

    // A CRD edited behind Helm's back (Helm never touches crds/ again).
    let crds: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    kube.block_on(
        crds.patch(
            "addresspools.rivora.io",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{ "op": "remove", "path": "/spec/names/shortNames" }]),
                )
                .unwrap(),
            ),
        ),
    )
    .expect("editing the CRD");
    assert!(crd(kube, "addresspools.rivora.io")
        .unwrap()
        .spec
        .names
        .short_names
        .is_none());

    let dss: Api<DaemonSet> = Api::namespaced(kube.client.clone(), ns);
    let before = kube.block_on(dss.get("rivorad")).unwrap();
    let out = cli.ok(
        ns,
        &[
            "upgrade",
            "--set",
            "controller.replicas=3",
            "--set",
            "rivorad.interfaces[0].name=ens5",
        ],
    );
    assert!(
        out.contains("CRDs applied: addresspools.rivora.io"),
        "{out}"
    );
    let deps: Api<Deployment> = Api::namespaced(kube.client.clone(), ns);
    let dep = kube.block_on(deps.get("rivora-controller")).unwrap();
    assert_eq!(dep.spec.unwrap().replicas, Some(3));
    let cms: Api<ConfigMap> = Api::namespaced(kube.client.clone(), ns);
    let text = kube
        .block_on(cms.get("rivorad-config"))
        .unwrap()
        .data
        .unwrap()["rivora.yaml"]
        .clone();
    assert!(text.contains("name: \"ens5\""), "{text}");
    // The pods roll for the new configuration; the values given at install
    // (the mode) are kept.
    let after = kube.block_on(dss.get("rivorad")).unwrap();
    let ann = |d: &DaemonSet| {
        d.spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .clone()
            .unwrap()["rivora.io/config-checksum"]
            .clone()
    };
    assert_ne!(
        ann(&before),
        ann(&after),
        "the configuration checksum changed"
    );
    assert_eq!(
        after.metadata.generation,
        Some(before.metadata.generation.unwrap() + 1)
    );
    let v = serde_json::to_value(&after).unwrap();
    let dargs = v["spec"]["template"]["spec"]["initContainers"][0]["args"].to_string();
    assert!(dargs.contains(r#""--announce","l2""#), "{dargs}");
    assert!(
        crd(kube, "addresspools.rivora.io")
            .unwrap()
            .spec
            .names
            .short_names
            .is_some(),
        "the CRD put back"
    );
    let (_, st) = cli.status(ns);
    assert!(
        row(&st, "daemonset", "rivorad")["detail"]
            .as_str()
            .unwrap()
            .contains("generation 2 not yet rolled out"),
        "{st:#}"
    );

    // Mode bgp: without an AS, refused by the schema and nothing changed;
    // with one, rivorad's bgp section, its rights (exactly: the documented
    // "BGP" list), NET_BIND_SERVICE for port 179, the doctor told.
    let out = cli.run(ns, &["upgrade", "--mode", "bgp"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("at '/announce/bgp': missing property 'asn'"),
        "{err}"
    );
    assert_eq!(
        kube.block_on(dss.get("rivorad"))
            .unwrap()
            .metadata
            .generation,
        after.metadata.generation,
        "a refused upgrade changed the DaemonSet"
    );
    cli.ok(
        ns,
        &[
            "upgrade",
            "--mode",
            "bgp",
            "--set",
            "announce.bgp.asn=65001",
        ],
    );
    check_rbac(kube, ns, true, &[]);
    let text = kube
        .block_on(cms.get("rivorad-config"))
        .unwrap()
        .data
        .unwrap()["rivora.yaml"]
        .clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rivora.yaml");
    std::fs::write(&file, &text).unwrap();
    let cfg = rivora_model::config::load(&file).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let bgp = cfg.bgp.unwrap_or_else(|| panic!("no bgp section: {text}"));
    assert_eq!((bgp.asn, bgp.listen_port), (65001, 179));
    let v = serde_json::to_value(kube.block_on(dss.get("rivorad")).unwrap()).unwrap();
    let pod = &v["spec"]["template"]["spec"];
    let caps = pod["containers"][0]["securityContext"]["capabilities"]["add"].to_string();
    assert!(caps.contains("NET_BIND_SERVICE"), "{caps}");
    let dargs = pod["initContainers"][0]["args"].to_string();
    assert!(
        dargs.contains(r#""--announce","bgp","--bgp-listen-port","179""#),
        "{dargs}"
    );

    // BGPPeers' password Secrets in another namespace: rivorad may get
    // them there once it is listed, and still nothing more.
    let other = "rivora-two-secrets";
    let namespaces: Api<Namespace> = Api::all(kube.client.clone());
    let made: Namespace = serde_json::from_value(json!({ "metadata": { "name": other } })).unwrap();
    kube.block_on(namespaces.create(&PostParams::default(), &made))
        .expect("the Secrets' namespace");
    let grant = |scope: &str, verb: &str| -> Grant {
        (
            scope.into(),
            String::new(),
            "secrets".into(),
            verb.into(),
            "*".into(),
        )
    };
    assert!(!allowed(kube, ns, "rivorad", &grant(other, "get")));
    cli.ok(
        ns,
        &[
            "upgrade",
            "--mode",
            "bgp",
            "--set",
            "announce.bgp.asn=65001",
            "--set",
            &format!("announce.bgp.secretNamespaces={{{other}}}"),
        ],
    );
    check_rbac(kube, ns, true, &[other]);

    // What the user keeps: the CRDs and an AddressPool in them.
    let pools: Api<DynamicObject> = Api::all_with(
        kube.client.clone(),
        &ApiResource::erase::<rivora_k8s::AddressPool>(&()),
    );
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "AddressPool",
        "metadata": { "name": "kept" }, "spec": { "addresses": ["192.0.2.0/28"] },
    }))
    .unwrap();
    kube.block_on(pools.create(&PostParams::default(), &pool))
        .expect("an AddressPool");
    // A BGPPeer (the user's, kept) and the BGPNodeStatus a node's rivorad
    // wrote (the release's run-time state, removed like its Leases).
    let peers: Api<DynamicObject> = Api::all_with(
        kube.client.clone(),
        &ApiResource::erase::<rivora_k8s::BgpPeer>(&()),
    );
    let peer: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "BGPPeer",
        "metadata": { "name": "tor" }, "spec": { "address": "192.0.2.1", "asn": 65000 },
    }))
    .unwrap();
    kube.block_on(peers.create(&PostParams::default(), &peer))
        .expect("a BGPPeer");
    let statuses: Api<DynamicObject> = Api::all_with(
        kube.client.clone(),
        &ApiResource::erase::<rivora_k8s::BgpNodeStatus>(&()),
    );
    let st: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "BGPNodeStatus",
        "metadata": { "name": "node-a" }, "spec": { "nodeName": "node-a" },
    }))
    .unwrap();
    kube.block_on(statuses.create(&PostParams::default(), &st))
        .expect("a BGPNodeStatus");
    // `rivora status` reports each node's sessions from it: none yet,
    // then one of two down, with the peer's state and last error.
    let (_, st) = cli.status(ns);
    let bgp = row(&st, "bgp", "node-a");
    assert_eq!(bgp["ready"], false, "{st:#}");
    assert_eq!(
        bgp["detail"],
        "no sessions reported yet by this node's rivorad"
    );
    patch_status(
        &statuses,
        "node-a",
        kube,
        json!({
            "sessionCount": 2, "establishedCount": 1,
            "sessions": [
                { "name": "tor", "address": "192.0.2.1", "asn": 65000, "state": "Established",
                  "flaps": 0, "advertised": 3 },
                { "name": "tor-b", "address": "192.0.2.2", "asn": 65001, "state": "Active",
                  "flaps": 2, "advertised": 0, "lastError": "connection refused" },
            ],
        }),
    );
    let (code, st) = cli.status(ns);
    assert_eq!(code, 1, "{st:#}");
    assert_eq!(
        row(&st, "bgp", "node-a")["detail"],
        "1/2 sessions established; tor-b (192.0.2.2 AS 65001) Active: connection refused"
    );
    let out = cli.ok(ns, &["uninstall", "--keep-crds"]);
    assert!(out.contains("removed BGPNodeStatus node-a"), "{out}");
    let roles: Api<Role> = Api::namespaced(kube.client.clone(), "rivora-two-secrets");
    let bindings: Api<RoleBinding> = Api::namespaced(kube.client.clone(), "rivora-two-secrets");
    assert!(
        kube.block_on(roles.list(&ListParams::default()))
            .unwrap()
            .items
            .is_empty()
            && kube
                .block_on(bindings.list(&ListParams::default()))
                .unwrap()
                .items
                .is_empty(),
        "rivorad's Role in the Secrets' namespace left behind"
    );
    let namespaces: Api<Namespace> = Api::all(kube.client.clone());
    kube.block_on(namespaces.delete("rivora-two-secrets", &DeleteParams::default()))
        .expect("removing the Secrets' namespace");
    assert!(
        kube.block_on(statuses.list(&ListParams::default()))
            .unwrap()
            .items
            .is_empty(),
        "BGPNodeStatuses left"
    );
    assert!(
        kube.block_on(peers.get_opt("tor")).unwrap().is_some(),
        "the BGPPeer kept"
    );
    assert!(
        out.contains("kept CRD addresspools.rivora.io (--keep-crds)"),
        "{out}"
    );
    let mut kept: Vec<String> = cluster_leftovers(kube);
    kept.sort();
    let mut want: Vec<String> = [
        "addresspools.rivora.io",
        "bgpnodestatuses.rivora.io",
        "bgppeers.rivora.io",
        "servicepolicies.rivora.io",
        "gatewayclasses.gateway.networking.k8s.io",
        "gateways.gateway.networking.k8s.io",
        "referencegrants.gateway.networking.k8s.io",
        "tcproutes.gateway.networking.k8s.io",
        "udproutes.gateway.networking.k8s.io",
    ]
    .iter()
    .map(|n| format!("CRD {n}"))
    .collect();
    want.sort();
    assert_eq!(kept, want, "only the CRDs are left");
    assert!(
        kube.block_on(pools.get_opt("kept")).unwrap().is_some(),
        "the AddressPool kept"
    );
    assert!(
        kube.block_on(classes.get_opt("rivora")).unwrap().is_none(),
        "the GatewayClass was the release's"
    );
    let left = left_in(kube, ns);
    assert!(left.is_empty(), "left in {ns}: {left:?}");
    assert!(namespace_gone(kube, ns));
}

#[test]
fn install_status_upgrade_uninstall() {
    let t0 = Instant::now();
    let server = ApiServer::start();
    let kube = Kube::new(&server.kubeconfig);
    let cli = Cli {
        kubeconfig: server.kubeconfig.clone(),
        helm_home: tempfile::tempdir().expect("helm's home"),
    };
    round_one(&cli, &kube);
    eprintln!("round one in {:?}", t0.elapsed());
    round_two(&cli, &kube);
    eprintln!("both rounds in {:?}", t0.elapsed());
}
