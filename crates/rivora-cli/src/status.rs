//! `rivora status`: what is ready and what is not, and why, from the
//! objects themselves: the DaemonSet's and the Deployment's rollout, each
//! pod (a node's rivorad, its doctor init container, a controller
//! replica), the leader Lease, the CRDs' `Established` condition, and each
//! node's BGP sessions as its rivorad reports them (its BGPNodeStatus).
//!
//! [`assess`] is pure (objects in, rows out) and unit-tested; [`gather`]
//! reads the objects.

use std::fmt::Write;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::Client;
use rivora_k8s::BgpNodeStatus;
use serde::Serialize;

use crate::names;

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// `daemonset`, `node`, `bgp`, `deployment`, `replica`, `leader`,
    /// `crd`.
    pub kind: String,
    pub name: String,
    pub ready: bool,
    /// What was seen; for what is not ready, why.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    pub namespace: String,
    /// The chart version the DaemonSet was installed from, if it says.
    pub version: Option<String>,
    pub ready: bool,
    pub rows: Vec<Row>,
}

/// The objects [`assess`] judges.
#[derive(Debug, Default, Clone)]
pub struct Objects {
    pub daemonset: Option<DaemonSet>,
    pub rivorad_pods: Vec<Pod>,
    pub deployment: Option<Deployment>,
    pub controller_pods: Vec<Pod>,
    pub lease: Option<Lease>,
    /// (name, the CRD if it exists): Rivora's, then whichever Gateway
    /// API ones exist.
    pub crds: Vec<(String, Option<CustomResourceDefinition>)>,
    /// Every node's BGPNodeStatus (none without BGP, or without the CRD).
    pub bgp: Vec<BgpNodeStatus>,
}

fn row(kind: &str, name: &str, ready: bool, detail: String) -> Row {
    Row {
        kind: kind.into(),
        name: name.into(),
        ready,
        detail,
    }
}

fn generation_seen(generation: Option<i64>, observed: Option<i64>) -> bool {
    observed.unwrap_or(0) >= generation.unwrap_or(0)
}

pub fn daemonset(ds: Option<&DaemonSet>) -> Row {
    let Some(ds) = ds else {
        return row(
            "daemonset",
            names::RIVORAD,
            false,
            "not found: is Rivora installed in this namespace?".into(),
        );
    };
    let st = ds.status.clone().unwrap_or_default();
    if !generation_seen(ds.metadata.generation, st.observed_generation) {
        return row(
            "daemonset",
            names::RIVORAD,
            false,
            format!(
                "generation {} not yet rolled out by the DaemonSet controller (it has seen {}): is kube-controller-manager running?",
                ds.metadata.generation.unwrap_or(0),
                st.observed_generation.unwrap_or(0)
            ),
        );
    }
    let desired = st.desired_number_scheduled;
    let ready = st.number_ready;
    let updated = st.updated_number_scheduled.unwrap_or(0);
    if desired == 0 {
        return row(
            "daemonset",
            names::RIVORAD,
            false,
            "no node to run on: no node matches rivorad's nodeSelector, affinity and tolerations"
                .into(),
        );
    }
    let detail = format!("{ready}/{desired} nodes ready, {updated}/{desired} up to date");
    if ready == desired && updated == desired {
        row("daemonset", names::RIVORAD, true, detail)
    } else {
        let mut d = detail;
        if st.number_unavailable.unwrap_or(0) > 0 {
            d += &format!(", {} unavailable", st.number_unavailable.unwrap_or(0));
        }
        row("daemonset", names::RIVORAD, false, d)
    }
}

pub fn deployment(d: Option<&Deployment>) -> Row {
    let Some(d) = d else {
        return row(
            "deployment",
            names::CONTROLLER,
            false,
            "not found: is Rivora installed in this namespace?".into(),
        );
    };
    let st = d.status.clone().unwrap_or_default();
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    if !generation_seen(d.metadata.generation, st.observed_generation) {
        return row(
            "deployment",
            names::CONTROLLER,
            false,
            format!(
                "generation {} not yet rolled out by the Deployment controller (it has seen {}): is kube-controller-manager running?",
                d.metadata.generation.unwrap_or(0),
                st.observed_generation.unwrap_or(0)
            ),
        );
    }
    let ready = st.ready_replicas.unwrap_or(0);
    let updated = st.updated_replicas.unwrap_or(0);
    let detail = format!("{ready}/{want} replicas ready, {updated}/{want} up to date");
    row(
        "deployment",
        names::CONTROLLER,
        ready >= want && updated >= want,
        detail,
    )
}

/// Why a pod is not ready, or that it is.
pub fn pod(p: &Pod, namespace: &str) -> (bool, String) {
    let name = p.metadata.name.clone().unwrap_or_default();
    let st = p.status.clone().unwrap_or_default();
    let cond = |t: &str| {
        st.conditions
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == t).cloned())
    };
    if p.metadata.deletion_timestamp.is_some() {
        return (false, format!("{name}: terminating"));
    }
    if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
        let why = cond("PodScheduled")
            .and_then(|c| c.message)
            .unwrap_or_else(|| "no node assigned yet".into());
        return (false, format!("{name}: not scheduled: {why}"));
    }
    // The doctor first: a node that fails it never starts rivorad.
    for c in st.init_container_statuses.iter().flatten() {
        let term = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.clone())
            .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.clone()));
        if let Some(t) = term.filter(|t| t.exit_code != 0) {
            return (
                false,
                format!(
                    "{name}: {} failed (exit {}): kubectl -n {namespace} logs {name} -c {}",
                    if c.name == "doctor" {
                        "rivora-doctor"
                    } else {
                        &c.name
                    },
                    t.exit_code,
                    c.name
                ),
            );
        }
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.clone()) {
            return (
                false,
                format!(
                    "{name}: init container {} waiting: {}{}",
                    c.name,
                    w.reason.unwrap_or_default(),
                    w.message.map(|m| format!(": {m}")).unwrap_or_default()
                ),
            );
        }
    }
    for c in st.container_statuses.iter().flatten() {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.clone()) {
            let last = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.clone())
                .map(|t| format!(" (last exit {})", t.exit_code))
                .unwrap_or_default();
            return (
                false,
                format!(
                    "{name}: {} {}{}{last}",
                    c.name,
                    w.reason.unwrap_or_else(|| "waiting".into()),
                    w.message.map(|m| format!(": {m}")).unwrap_or_default()
                ),
            );
        }
        if !c.ready {
            return (
                false,
                format!(
                    "{name}: {} running, not ready (its readiness probe, /readyz, fails: kubectl -n {namespace} logs {name} -c {})",
                    c.name, c.name
                ),
            );
        }
    }
    match cond("Ready") {
        Some(c) if c.status == "True" => (true, format!("{name}: ready")),
        Some(c) => (
            false,
            format!(
                "{name}: not ready{}",
                c.message.map(|m| format!(": {m}")).unwrap_or_default()
            ),
        ),
        None => (
            false,
            format!(
                "{name}: {} (no status from the kubelet yet)",
                st.phase.unwrap_or_else(|| "Pending".into())
            ),
        ),
    }
}

pub fn leader(l: Option<&Lease>, now: Timestamp) -> Row {
    let Some(spec) = l.and_then(|l| l.spec.as_ref()) else {
        return row(
            "leader",
            names::CONTROLLER,
            false,
            "no Lease: no rivora-controller replica has led yet".into(),
        );
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder.is_empty() {
        return row(
            "leader",
            names::CONTROLLER,
            false,
            "the Lease is released: no replica leads".into(),
        );
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let age = spec
        .renew_time
        .as_ref()
        .map(|t| now.as_second() - t.0.as_second());
    match age {
        Some(a) if a <= duration => row(
            "leader",
            names::CONTROLLER,
            true,
            format!("{holder}, renewed {a}s ago"),
        ),
        Some(a) => row(
            "leader",
            names::CONTROLLER,
            false,
            format!("{holder} last renewed {a}s ago, more than the lease's {duration}s: no replica is leading"),
        ),
        None => row(
            "leader",
            names::CONTROLLER,
            false,
            format!("{holder} never renewed"),
        ),
    }
}

pub fn crd(name: &str, c: Option<&CustomResourceDefinition>) -> Row {
    let Some(c) = c else {
        return row(
            "crd",
            name,
            false,
            "not installed: `rivora crds | kubectl apply -f -`, or `rivora upgrade`".into(),
        );
    };
    let est = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|x| x.type_ == "Established"));
    match est {
        Some(e) if e.status == "True" => row("crd", name, true, "established".into()),
        Some(e) => row(
            "crd",
            name,
            false,
            format!(
                "not established: {}",
                e.message
                    .clone()
                    .unwrap_or_else(|| e.reason.clone().unwrap_or_default())
            ),
        ),
        None => row("crd", name, false, "not established yet".into()),
    }
}

/// A node's BGP sessions, as its rivorad last wrote them: ready when every
/// session is Established and no BGPPeer that selects the node was
/// refused. What is not says which peer, its state and its last error.
pub fn bgp_node(s: &BgpNodeStatus) -> Row {
    let node = s
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| s.spec.node_name.clone());
    let Some(st) = &s.status else {
        return row(
            "bgp",
            &node,
            false,
            "no sessions reported yet by this node's rivorad".into(),
        );
    };
    let mut detail = format!(
        "{}/{} sessions established",
        st.established_count, st.session_count
    );
    let mut ready = st.established_count == st.session_count && st.refused.is_empty();
    let mut sessions: Vec<_> = st.sessions.iter().collect();
    sessions.sort_by(|a, b| a.name.cmp(&b.name));
    for p in sessions.iter().filter(|p| p.state != "Established") {
        ready = false;
        let _ = write!(
            detail,
            "; {} ({} AS {}) {}",
            p.name, p.address, p.asn, p.state
        );
        if let Some(e) = &p.last_error {
            let _ = write!(detail, ": {e}");
        }
    }
    for r in &st.refused {
        let _ = write!(detail, "; refused {}: {}", r.name, r.reason);
    }
    row("bgp", &node, ready, detail)
}

/// Every row, and whether all is ready.
pub fn assess(namespace: &str, o: &Objects, now: Timestamp) -> Status {
    let mut rows = vec![daemonset(o.daemonset.as_ref())];
    let mut pods: Vec<&Pod> = o.rivorad_pods.iter().collect();
    pods.sort_by_key(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()));
    for p in pods {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| "(unscheduled)".into());
        let (ready, detail) = pod(p, namespace);
        rows.push(row("node", &node, ready, detail));
    }
    let mut bgp: Vec<&BgpNodeStatus> = o.bgp.iter().collect();
    bgp.sort_by_key(|s| s.metadata.name.clone());
    rows.extend(bgp.into_iter().map(bgp_node));
    rows.push(deployment(o.deployment.as_ref()));
    for p in &o.controller_pods {
        let (ready, detail) = pod(p, namespace);
        rows.push(row(
            "replica",
            &p.metadata.name.clone().unwrap_or_default(),
            ready,
            detail,
        ));
    }
    rows.push(leader(o.lease.as_ref(), now));
    for (name, c) in &o.crds {
        rows.push(crd(name, c.as_ref()));
    }
    let version = o.daemonset.as_ref().and_then(|d| {
        d.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/version").cloned())
    });
    Status {
        namespace: namespace.into(),
        version,
        ready: rows.iter().all(|r| r.ready),
        rows,
    }
}

/// Read the objects `assess` needs. `gateway_crds`: the Gateway API CRD
/// names to report on if they exist.
pub async fn gather(
    client: &Client,
    namespace: &str,
    release: &str,
    rivora_crds: &[String],
    gateway_crds: &[String],
) -> kube::Result<Objects> {
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let dep: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let selector = |component: &str| {
        ListParams::default().labels(&format!(
            "app.kubernetes.io/name=rivora,app.kubernetes.io/instance={release},app.kubernetes.io/component={component}"
        ))
    };
    let mut o = Objects {
        daemonset: ds.get_opt(names::RIVORAD).await?,
        rivorad_pods: pods.list(&selector("rivorad")).await?.items,
        deployment: dep.get_opt(names::CONTROLLER).await?,
        controller_pods: pods.list(&selector("controller")).await?.items,
        lease: leases.get_opt(names::CONTROLLER).await?,
        crds: Vec::new(),
        bgp: Vec::new(),
    };
    let statuses: Api<BgpNodeStatus> = Api::all(client.clone());
    o.bgp = match statuses.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // No such CRD: no node speaks BGP.
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(e) => return Err(e),
    };
    for n in rivora_crds {
        o.crds.push((n.clone(), crds.get_opt(n).await?));
    }
    for n in gateway_crds {
        if let Some(c) = crds.get_opt(n).await? {
            o.crds.push((n.clone(), Some(c)));
        }
    }
    Ok(o)
}

pub fn table(s: &Status) -> String {
    let head = ["KIND", "NAME", "READY", "DETAIL"];
    let cells: Vec<[String; 4]> = s
        .rows
        .iter()
        .map(|r| {
            [
                r.kind.clone(),
                r.name.clone(),
                if r.ready { "yes" } else { "no" }.into(),
                r.detail.clone(),
            ]
        })
        .collect();
    let mut w = [head[0].len(), head[1].len(), head[2].len()];
    for c in &cells {
        for i in 0..3 {
            w[i] = w[i].max(c[i].len());
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Rivora {} in namespace {}: {}",
        s.version.as_deref().unwrap_or("(version unknown)"),
        s.namespace,
        if s.ready { "ready" } else { "NOT READY" }
    );
    let _ = writeln!(out);
    let line = |out: &mut String, c: [&str; 4]| {
        let _ = writeln!(
            out,
            "{:<a$}  {:<b$}  {:<d$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            a = w[0],
            b = w[1],
            d = w[2]
        );
    };
    line(&mut out, head);
    for c in &cells {
        line(&mut out, [&c[0], &c[1], &c[2], &c[3]]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(v: serde_json::Value) -> DaemonSet {
        serde_json::from_value(v).unwrap()
    }

    fn now() -> Timestamp {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn daemonset_rollout() {
        let r = daemonset(None);
        assert!(!r.ready && r.detail.contains("not found"), "{r:?}");
        // Created, never seen by a controller: honest about why.
        let fresh = ds(json!({"metadata": {"name": "rivorad", "generation": 1}}));
        let r = daemonset(Some(&fresh));
        assert!(!r.ready);
        assert!(r.detail.contains("not yet rolled out"), "{}", r.detail);
        let none = ds(json!({"metadata": {"name": "rivorad", "generation": 2},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": 0, "currentNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0}}));
        assert!(daemonset(Some(&none)).detail.contains("no node"));
        let partial = ds(json!({"metadata": {"name": "rivorad", "generation": 2},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberMisscheduled": 0,
                       "numberReady": 2, "updatedNumberScheduled": 3, "numberUnavailable": 1}}));
        let r = daemonset(Some(&partial));
        assert!(!r.ready);
        assert_eq!(r.detail, "2/3 nodes ready, 3/3 up to date, 1 unavailable");
        let done = ds(json!({"metadata": {"name": "rivorad", "generation": 2},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberMisscheduled": 0,
                       "numberReady": 3, "updatedNumberScheduled": 3}}));
        assert!(daemonset(Some(&done)).ready);
    }

    #[test]
    fn pods_say_why() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "rivorad-x"},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"initContainerStatuses": [{"name": "doctor", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
        }))
        .unwrap();
        let (ready, why) = pod(&p, "rivora-system");
        assert!(!ready);
        assert_eq!(
            why,
            "rivorad-x: rivora-doctor failed (exit 1): kubectl -n rivora-system logs rivorad-x -c doctor"
        );
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "rivorad-y"},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "message": "0/3 nodes are available"}]}
        }))
        .unwrap();
        assert_eq!(
            pod(&p, "ns").1,
            "rivorad-y: not scheduled: 0/3 nodes are available"
        );
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "rivorad-z"},
            "spec": {"nodeName": "n2", "containers": []},
            "status": {"containerStatuses": [{"name": "rivorad", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}}}]}
        }))
        .unwrap();
        assert_eq!(
            pod(&p, "ns").1,
            "rivorad-z: rivorad ImagePullBackOff: pull access denied"
        );
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "rivorad-w"},
            "spec": {"nodeName": "n3", "containers": []},
            "status": {"containerStatuses": [{"name": "rivorad", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"running": {}}}]}
        }))
        .unwrap();
        assert!(pod(&p, "ns").1.contains("running, not ready"));
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "rivorad-v"},
            "spec": {"nodeName": "n4", "containers": []},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "rivorad", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
        }))
        .unwrap();
        assert_eq!(pod(&p, "ns"), (true, "rivorad-v: ready".into()));
    }

    #[test]
    fn bgp_sessions_say_which_peer_and_why() {
        let st = |status: serde_json::Value| -> BgpNodeStatus {
            serde_json::from_value(json!({
                "apiVersion": "rivora.io/v1alpha1", "kind": "BGPNodeStatus",
                "metadata": {"name": "node-a"}, "spec": {"nodeName": "node-a"},
                "status": status
            }))
            .unwrap()
        };
        let up = |name: &str, addr: &str| {
            json!({"name": name, "address": addr, "asn": 65000, "state": "Established",
                   "flaps": 0, "advertised": 2})
        };
        let r = bgp_node(&st(json!({"sessionCount": 2, "establishedCount": 2,
            "sessions": [up("tor-a", "10.0.0.1"), up("tor-b", "10.0.0.2")]})));
        assert_eq!(
            r,
            row("bgp", "node-a", true, "2/2 sessions established".into())
        );
        let r = bgp_node(&st(json!({"sessionCount": 2, "establishedCount": 1,
            "sessions": [
                {"name": "tor-b", "address": "10.0.0.2", "asn": 65001, "state": "Active",
                 "flaps": 3, "advertised": 0, "lastError": "connection refused"},
                up("tor-a", "10.0.0.1")],
            "refused": [{"name": "tor-c", "reason": "Secret bgp-c not found"}]})));
        assert!(!r.ready);
        assert_eq!(
            r.detail,
            "1/2 sessions established; tor-b (10.0.0.2 AS 65001) Active: connection refused; \
             refused tor-c: Secret bgp-c not found"
        );
        // Every session up, but a peer refused: not ready either.
        let r = bgp_node(&st(json!({"sessionCount": 1, "establishedCount": 1,
            "sessions": [up("tor-a", "10.0.0.1")],
            "refused": [{"name": "tor-c", "reason": "bad asn"}]})));
        assert!(!r.ready, "{r:?}");
        // Written before any session: says so.
        let mut none = st(json!({"sessionCount": 0, "establishedCount": 0}));
        none.status = None;
        assert!(!bgp_node(&none).ready);
    }

    #[test]
    fn the_leader() {
        assert!(!leader(None, now()).ready);
        let l = |holder: &str, renewed: &str| -> Lease {
            serde_json::from_value(json!({"metadata": {"name": "rivora-controller"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed}}))
            .unwrap()
        };
        let r = leader(Some(&l("c-1", "2026-12-01T11:59:58.000000Z")), now());
        assert!(r.ready);
        assert_eq!(r.detail, "c-1, renewed 2s ago");
        let r = leader(Some(&l("c-1", "2026-12-01T11:58:00.000000Z")), now());
        assert!(!r.ready && r.detail.contains("120s ago"), "{r:?}");
        assert!(!leader(Some(&l("", "2026-12-01T11:59:58.000000Z")), now()).ready);
    }
}
