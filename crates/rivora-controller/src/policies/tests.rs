//! The policies' answers, without an API server: the cluster's, the same
//! whatever order the objects came in, and only for this installation's.

use std::collections::BTreeMap;

use kube::runtime::watcher::Event;
use serde_json::{json, Value};

use super::*;

fn svc(name: &str, class: &str, local: bool) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": name},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": class,
                 "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}
    }))
    .expect("a Service")
}

/// A slice of `service`: (address, node) endpoints on port 8080.
fn slice(service: &str, eps: &[(&str, Option<&str>)]) -> EndpointSlice {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|(a, n)| json!({"addresses": [a], "conditions": {"ready": true}, "nodeName": n}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": format!("{service}-1"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    }))
    .expect("an EndpointSlice")
}

fn policy(name: &str, spec: Value) -> ServicePolicy {
    serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
        "metadata": {"namespace": "a", "name": name, "generation": 1, "resourceVersion": "7",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec
    }))
    .expect("a ServicePolicy")
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("a time"))
}

/// The world, its objects applied in the order given.
fn world(
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    policies: Vec<ServicePolicy>,
) -> (Policies, Listed<Service>) {
    let mut svcs = Listed::default();
    for s in services {
        svcs.apply(Event::Apply(s));
    }
    let mut p = Policies::default();
    for s in slices {
        let ch = p.slices.apply(Event::Apply(s));
        p.slices_changed(ch);
    }
    for x in policies {
        p.policies.apply(Event::Apply(x));
    }
    p.policies_changed();
    (p, svcs)
}

/// Policy -> (status, reason) of its Accepted condition, as written.
fn accepted(
    p: &Policies,
    svcs: &Listed<Service>,
    opts: &TranslateOptions,
) -> BTreeMap<String, (String, String)> {
    p.updates(svcs, &BTreeMap::new(), opts, &now())
        .into_iter()
        .map(|(k, rv, st)| {
            assert_eq!(rv, "7", "written at the version read");
            let c = st
                .conditions
                .iter()
                .find(|c| c.type_ == "Accepted")
                .expect("an Accepted condition");
            (k.name, (c.status.clone(), c.reason.clone()))
        })
        .collect()
}

fn answer(status: &str, reason: &str) -> (String, String) {
    (status.to_string(), reason.to_string())
}

#[test]
fn a_policy_refused_anywhere_is_refused_once_for_the_cluster() {
    let lb = rivora_k8s::translate::RIVORA_LB_CLASS;
    let opts = TranslateOptions::default();
    // DSR keeps the destination port: an endpoint on no known node, on
    // 8080 behind port 80, cannot take it, on whichever node it is read.
    // The endpoint on node-b alone would (DSR across nodes NATs there).
    let eps = [("10.1.0.1", Some("node-b")), ("10.1.0.2", None)];
    let mk = || {
        (
            vec![svc("web", lb, false), svc("local", lb, true)],
            vec![slice("web", &eps), slice("local", &eps)],
            vec![
                policy("dsr", json!({"services": ["web"], "mode": "dsr"})),
                policy("local-dsr", json!({"services": ["local"], "mode": "dsr"})),
                policy("nothing", json!({"services": ["gone"]})),
            ],
        )
    };
    let (s, sl, p) = mk();
    let (pol, svcs) = world(s, sl, p);
    let got = accepted(&pol, &svcs, &opts);
    assert_eq!(
        got,
        BTreeMap::from([
            ("dsr".into(), answer("False", "ModeNotApplicable")),
            // Each node keeps its own endpoints, and NATs to them.
            ("local-dsr".into(), answer("True", "Accepted")),
            ("nothing".into(), answer("True", "Accepted")),
        ])
    );
    // The other order: the same answer, word for word.
    let (mut s, mut sl, mut p) = mk();
    s.reverse();
    sl.reverse();
    p.reverse();
    let (pol2, svcs2) = world(s, sl, p);
    assert_eq!(
        pol.updates(&svcs, &BTreeMap::new(), &opts, &now()),
        pol2.updates(&svcs2, &BTreeMap::new(), &opts, &now())
    );
}

#[test]
fn an_installation_answers_for_its_own_policies_and_writes_only_changes() {
    let eps = [("10.1.0.1", Some("node-b"))];
    let (pol, svcs) = world(
        vec![
            svc("theirs", "example.com/other", false),
            svc("ours", "test/mine", false),
        ],
        vec![slice("theirs", &eps), slice("ours", &eps)],
        vec![
            policy("p-theirs", json!({"services": ["theirs"]})),
            policy("p-ours", json!({"services": ["ours"]})),
            policy("p-nothing", json!({"services": ["gone"]})),
        ],
    );
    // A second installation, of its own class only: its Service's policy.
    let mine = TranslateOptions {
        class: "test/mine".into(),
        accept_unset_class: false,
    };
    assert_eq!(
        accepted(&pol, &svcs, &mine).into_keys().collect::<Vec<_>>(),
        ["p-ours"]
    );
    // The default installation: what names nothing of another's.
    let default = TranslateOptions {
        class: "example.com/default".into(),
        accept_unset_class: true,
    };
    assert_eq!(
        accepted(&pol, &svcs, &default)
            .into_keys()
            .collect::<Vec<_>>(),
        ["p-nothing"]
    );
    // Written: nothing more to write.
    let mut written = Policies::default();
    for (k, _, st) in pol.updates(&svcs, &BTreeMap::new(), &mine, &now()) {
        let mut p = (**pol.policies.get(&k).expect("the policy")).clone();
        p.status = Some(st);
        written.policies.apply(Event::Apply(p));
    }
    for (k, p) in &pol.policies.items {
        if written.policies.get(k).is_none() {
            written.policies.apply(Event::Apply((**p).clone()));
        }
    }
    written.slices = Listed::default();
    for s in pol.slices.items.values() {
        let ch = written.slices.apply(Event::Apply((**s).clone()));
        written.slices_changed(ch);
    }
    written.policies_changed();
    assert!(written
        .updates(&svcs, &BTreeMap::new(), &mine, &now())
        .is_empty());
}

#[test]
fn the_younger_of_two_policies_on_one_service_is_conflicted() {
    let lb = rivora_k8s::translate::RIVORA_LB_CLASS;
    let mut newer = policy("newer", json!({"services": ["web"]}));
    newer.metadata.creation_timestamp =
        serde_json::from_value(json!("2026-02-01T00:00:00Z")).expect("a time");
    let (pol, svcs) = world(
        vec![svc("web", lb, false)],
        vec![slice("web", &[("10.1.0.1", Some("node-b"))])],
        vec![newer, policy("older", json!({"services": ["web"]}))],
    );
    let ups = pol.updates(
        &svcs,
        &BTreeMap::new(),
        &TranslateOptions::default(),
        &now(),
    );
    let cond = |name: &str, t: &str| {
        ups.iter()
            .find(|(k, _, _)| k.name == name)
            .and_then(|(_, _, st)| st.conditions.iter().find(|c| c.type_ == t))
            .map(|c| answer(&c.status, &c.reason))
    };
    assert_eq!(cond("older", "Accepted"), Some(answer("True", "Accepted")));
    assert_eq!(
        cond("newer", "Accepted"),
        Some(answer("False", "Conflicted"))
    );
    assert_eq!(
        cond("newer", "Conflicted"),
        Some(answer("True", "Conflicted"))
    );
}
