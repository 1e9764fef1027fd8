use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;

fn at(min: u32) -> Time {
    serde_json::from_value(json!(format!("2026-01-01T00:{min:02}:00Z"))).expect("a time")
}

fn pool(name: &str, addresses: &[&str]) -> AddressPool {
    let mut p = AddressPool::new(
        name,
        serde_json::from_value(json!({ "addresses": addresses })).expect("a pool spec"),
    );
    p.metadata.creation_timestamp = Some(at(0));
    p.metadata.generation = Some(1);
    p.metadata.resource_version = Some("1".into());
    p
}

/// A LoadBalancer Service in `ns`, created at minute `age`, with `status`.
fn svc(ns: &str, name: &str, age: u32, status: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {
            "namespace": ns, "name": name, "generation": 1, "resourceVersion": "10",
            "creationTimestamp": format!("2026-01-01T00:{age:02}:00Z"),
        },
        "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP" }] },
        "status": status,
    }))
    .expect("a Service")
}

fn ns(name: &str) -> Namespace {
    serde_json::from_value(json!({ "metadata": { "name": name } })).expect("a Namespace")
}

fn listed<K: kube::Resource>(items: Vec<K>) -> Listed<K> {
    let mut l = Listed::default();
    l.apply(Event::Init);
    for i in items {
        l.apply(Event::InitApply(i));
    }
    l.apply(Event::InitDone);
    l
}

fn ipam(pools: Vec<AddressPool>, services: Vec<Service>) -> Ipam {
    let mut i = Ipam::new(TranslateOptions::default());
    i.pools = listed(pools);
    i.namespaces = listed(vec![ns("a"), ns("b")]);
    i.services = listed(services);
    i
}

/// The ingress IPs a planned Service write gives.
fn ingress(w: &Write) -> Vec<String> {
    w.status["loadBalancer"]["ingress"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["ip"].as_str().expect("an ip").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn service_writes(p: &Plan) -> BTreeMap<String, &Write> {
    p.writes
        .iter()
        .filter_map(|w| match &w.target {
            Target::Service(k) => Some((k.to_string(), w)),
            Target::Pool(_) => None,
        })
        .collect()
}

/// The Service as the API server would have it after the write.
fn after(svc: &Service, w: &Write, rv: &str) -> Service {
    let mut v = serde_json::to_value(svc).expect("json");
    for (k, val) in w.status.as_object().expect("a status object") {
        if val.is_null() {
            v["status"].as_object_mut().map(|s| s.remove(k));
        } else if k == "loadBalancer" && val["ingress"].is_null() {
            v["status"]["loadBalancer"] = json!({});
        } else {
            v["status"][k] = val.clone();
        }
    }
    v["metadata"]["resourceVersion"] = json!(rv);
    serde_json::from_value(v).expect("a Service")
}

/// The plan's pool writes as the API server would store them, back
/// through the watch.
fn land_pool_writes(i: &mut Ipam, plan: &Plan) {
    for w in &plan.writes {
        let Target::Pool(name) = &w.target else {
            continue;
        };
        let mut p = (**i.pools.get(&Key::new("", name.as_str())).expect("the pool")).clone();
        p.status = Some(serde_json::from_value(w.status.clone()).expect("a pool status"));
        p.metadata.resource_version = Some("2".into());
        i.pools.apply(Event::Apply(p));
        i.written(&w.target, true);
    }
}

#[test]
fn nothing_is_planned_before_leading_or_before_every_watch_listed() {
    let mut i = ipam(
        vec![pool("p", &["10.0.0.0/30"])],
        vec![svc("a", "web", 1, json!({}))],
    );
    assert!(i.plan(&at(5)).writes.is_empty(), "not leading");
    i.namespaces = Listed::default();
    i.lead();
    assert!(i.plan(&at(5)).writes.is_empty(), "namespaces not listed");
}

#[test]
fn leading_assigns_writes_status_and_pool_counts_then_nothing_more() {
    let services = vec![svc("a", "web", 1, json!({})), svc("b", "db", 2, json!({}))];
    let mut i = ipam(vec![pool("p", &["10.0.0.8-10.0.0.9"])], services.clone());
    i.lead();
    let plan = i.plan(&at(5));
    let w = service_writes(&plan);
    assert_eq!(ingress(w["a/web"]), ["10.0.0.8"]);
    assert_eq!(ingress(w["b/db"]), ["10.0.0.9"]);
    assert_eq!(w["a/web"].resource_version, "10");
    let cond = &w["a/web"].status["conditions"][0];
    assert_eq!(cond["type"], CONDITION_ADDRESS_ASSIGNED);
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["reason"], "Assigned");
    assert_eq!(cond["observedGeneration"], 1);
    let pools: Vec<&Write> = plan
        .writes
        .iter()
        .filter(|w| w.target == Target::Pool("p".into()))
        .collect();
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].status["assigned"]["ipv4"], 2);
    assert_eq!(pools[0].status["available"]["ipv4"], 0);
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);

    // The same objects again while the writes are in flight: nothing.
    i.service_changed(Key::new("a", "web"));
    assert!(i.plan(&at(6)).writes.is_empty(), "in flight already");

    // The writes land and come back through the watch: nothing to do.
    for s in &services {
        let k = Key::of(s);
        let w = w[&k.to_string()];
        i.services.apply(Event::Apply(after(s, w, "11")));
        i.written(&Target::Service(k.clone()), true);
        i.service_changed(k);
    }
    assert!(i.plan(&at(7)).writes.is_empty());
}

#[test]
fn a_new_leader_rebuilds_from_statuses_and_writes_nothing() {
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![]);
    // Statuses as a previous leader wrote them, in no address order.
    let web = svc("a", "web", 1, json!({}));
    let db = svc("b", "db", 2, json!({}));
    i.services = listed(vec![web.clone(), db.clone()]);
    i.lead();
    let first = i.plan(&at(5));
    let w = service_writes(&first);
    let web = after(&web, w["a/web"], "11");
    let db = after(&db, w["b/db"], "11");
    let pool_w = first
        .writes
        .iter()
        .find(|w| matches!(w.target, Target::Pool(_)))
        .expect("a pool write");
    let mut p = pool("p", &["10.0.0.0/29"]);
    p.status = Some(serde_json::from_value(pool_w.status.clone()).expect("a pool status"));

    // Another replica (or this one after a restart) takes over.
    let mut j = ipam(vec![p], vec![db, web]);
    j.lead();
    let plan = j.plan(&at(9));
    assert!(plan.writes.is_empty(), "{:#?}", plan.writes);
}

#[test]
fn an_address_in_no_pool_is_kept_and_flagged_after_the_pool_goes() {
    let held = svc(
        "a",
        "web",
        1,
        json!({ "loadBalancer": { "ingress": [{ "ip": "10.0.0.2" }] } }),
    );
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![held.clone()]);
    i.lead();
    let w = i.plan(&at(5));
    let web = after(&held, service_writes(&w)["a/web"], "11");
    i.services.apply(Event::Apply(web.clone()));
    i.written(&Target::Service(Key::of(&web)), true);

    // The pool is deleted.
    i.pools.apply(Event::Delete(pool("p", &["10.0.0.0/29"])));
    i.pools_changed();
    let plan = i.plan(&at(6));
    let w = service_writes(&plan);
    assert_eq!(ingress(w["a/web"]), ["10.0.0.2"], "kept, not re-addressed");
    let cond = &w["a/web"].status["conditions"][0];
    assert_eq!(cond["status"], "True");
    assert_eq!(cond["reason"], "AddressNotInPool");
    assert!(
        plan.warnings
            .iter()
            .any(|w| w.warning.reason == "AddressNotInPool" && w.service == Key::new("a", "web")),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn no_address_left_is_a_false_condition_and_a_warning() {
    let services = vec![
        svc("a", "web", 1, json!({})),
        svc("a", "late", 2, json!({})),
    ];
    let mut i = ipam(vec![pool("p", &["10.0.0.9"])], services);
    i.lead();
    let plan = i.plan(&at(5));
    let w = service_writes(&plan);
    assert_eq!(ingress(w["a/web"]), ["10.0.0.9"]);
    assert!(ingress(w["a/late"]).is_empty());
    let cond = &w["a/late"].status["conditions"][0];
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "NoAddressAvailable");
    assert!(plan
        .warnings
        .iter()
        .any(|w| w.service == Key::new("a", "late") && w.warning.reason == "NoAddressAvailable"));
}

#[test]
fn a_service_that_stops_being_rivoras_loses_what_rivora_wrote() {
    let web = svc("a", "web", 1, json!({}));
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![web.clone()]);
    i.lead();
    let plan = i.plan(&at(5));
    let web = after(&web, service_writes(&plan)["a/web"], "11");
    i.services.apply(Event::Apply(web.clone()));
    i.written(&Target::Service(Key::of(&web)), true);
    land_pool_writes(&mut i, &plan);

    // Its type changes to ClusterIP.
    let mut cluster_ip = web.clone();
    if let Some(s) = cluster_ip.spec.as_mut() {
        s.type_ = Some("ClusterIP".into());
    }
    i.services.apply(Event::Apply(cluster_ip));
    i.service_changed(Key::of(&web));
    let plan = i.plan(&at(6));
    let w = service_writes(&plan);
    assert!(w["a/web"].status["loadBalancer"]["ingress"].is_null());
    assert!(w["a/web"].status["conditions"].is_null());
    let p = plan
        .writes
        .iter()
        .find(|w| w.target == Target::Pool("p".into()))
        .expect("the pool's counts move");
    assert_eq!(p.status["assigned"]["ipv4"], 0);
}

#[test]
fn clearing_touches_only_what_rivora_wrote() {
    // Another implementation's Service: neither condition nor our address.
    let theirs = svc(
        "a",
        "x",
        1,
        json!({ "loadBalancer": { "ingress": [{ "ip": "192.0.2.1" }] } }),
    );
    assert_eq!(cleared_status(&theirs, &[], |_| false), None);
    // Our condition, an address of our pools (after a restart).
    let ours = svc(
        "a",
        "x",
        1,
        json!({
            "loadBalancer": { "ingress": [{ "ip": "10.0.0.1" }] },
            "conditions": [
                { "type": CONDITION_ADDRESS_ASSIGNED, "status": "True", "reason": "Assigned",
                  "message": "assigned 10.0.0.1", "lastTransitionTime": "2026-01-01T00:00:00Z" },
                { "type": "Other", "status": "True", "reason": "R", "message": "m",
                  "lastTransitionTime": "2026-01-01T00:00:00Z" },
            ],
        }),
    );
    let s = cleared_status(&ours, &[], |a| a.to_string() == "10.0.0.1").expect("a clear");
    assert!(s["loadBalancer"]["ingress"].is_null());
    assert_eq!(s["conditions"].as_array().expect("kept").len(), 1);
    assert_eq!(s["conditions"][0]["type"], "Other");
    // Our condition, but an address another wrote since: the condition
    // goes, the address stays.
    let s = cleared_status(&ours, &[], |_| false).expect("a clear");
    assert!(s.get("loadBalancer").is_none());
}

#[test]
fn a_namespace_label_change_replans_its_services_only() {
    let mut i = ipam(
        vec![pool("p", &["10.0.0.0/29"])],
        vec![svc("a", "web", 1, json!({})), svc("b", "db", 2, json!({}))],
    );
    i.lead();
    let _ = i.plan(&at(5));
    i.follow();
    i.lead();
    let _ = i.plan(&at(5));
    i.namespace_changed("a");
    assert_eq!(
        i.dirty.iter().cloned().collect::<Vec<_>>(),
        vec![Key::new("a", "web")]
    );
}

#[test]
fn a_failed_write_is_planned_again() {
    let mut i = ipam(
        vec![pool("p", &["10.0.0.0/29"])],
        vec![svc("a", "web", 1, json!({}))],
    );
    i.lead();
    let plan = i.plan(&at(5));
    assert_eq!(service_writes(&plan).len(), 1);
    i.written(&Target::Service(Key::new("a", "web")), false);
    let again = i.plan(&at(5));
    assert_eq!(
        service_writes(&again)["a/web"].status,
        service_writes(&plan)["a/web"].status
    );
}

#[test]
fn counts_that_move_while_a_pool_write_is_in_flight_are_written_after_it() {
    let mut i = ipam(
        vec![pool("p", &["10.0.0.0/29"])],
        vec![svc("a", "web", 1, json!({}))],
    );
    i.lead();
    let first = i.plan(&at(5));
    let count = |p: &Plan| {
        p.writes
            .iter()
            .find(|w| w.target == Target::Pool("p".into()))
            .map(|w| w.status["assigned"]["ipv4"].clone())
    };
    assert_eq!(count(&first), Some(json!(1)));
    // A second Service while the pool's write is in flight: its count
    // cannot be written from the same pool version.
    i.services.apply(Event::Apply(svc("a", "db", 2, json!({}))));
    i.service_changed(Key::new("a", "db"));
    assert_eq!(count(&i.plan(&at(6))), None);
    // The first write lands: the count moved since is written.
    land_pool_writes(&mut i, &first);
    i.pool_status_changed();
    assert_eq!(count(&i.plan(&at(7))), Some(json!(2)));
}

#[test]
fn gauges_count_per_pool_and_family() {
    let mut i = ipam(
        vec![pool("p", &["10.0.0.8-10.0.0.11", "fd00::/126"])],
        vec![svc("a", "web", 1, json!({}))],
    );
    assert!(i.gauges().is_empty(), "a follower counts nothing");
    i.lead();
    let _ = i.plan(&at(5));
    let g = i.gauges();
    assert_eq!(g[&("p".to_string(), "ipv4")], (1, 3));
    assert_eq!(g[&("p".to_string(), "ipv6")], (0, 4));
}
