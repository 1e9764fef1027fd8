use kube::runtime::watcher::Event;
use rivora_k8s::gateway::api::gatewayclasses::GatewayClass;
use rivora_k8s::gateway::api::tcproutes::TcpRoute;
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

/// A LoadBalancer Service of Rivora's class in `ns`, created at minute
/// `age`, with `status` (written by whoever the test says: a Service of
/// Rivora's class is Rivora's whatever its status holds).
fn svc(ns: &str, name: &str, age: u32, status: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {
            "namespace": ns, "name": name, "generation": 1, "resourceVersion": "10",
            "creationTimestamp": format!("2026-01-01T00:{age:02}:00Z"),
        },
        "spec": {
            "type": "LoadBalancer", "loadBalancerClass": rivora_k8s::translate::RIVORA_LB_CLASS,
            "ports": [{ "port": 80, "protocol": "TCP" }],
        },
        "status": status,
    }))
    .expect("a Service")
}

/// [`svc`] without a class: Rivora's while unset classes are accepted and
/// no other implementation has given it addresses.
fn unclassed(ns: &str, name: &str, age: u32, status: Value) -> Service {
    let mut s = svc(ns, name, age, status);
    if let Some(spec) = s.spec.as_mut() {
        spec.load_balancer_class = None;
    }
    s
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

/// Pools and Services listed, and a Gateway API listed empty.
fn ipam(pools: Vec<AddressPool>, services: Vec<Service>) -> Ipam {
    let mut i = Ipam::new(TranslateOptions::default());
    i.pools = listed(pools);
    i.namespaces = listed(vec![ns("a"), ns("b")]);
    i.services = listed(services);
    with_gateways(i, vec![], vec![], vec![])
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
            _ => None,
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
        let k = key_of(s);
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
    i.written(&Target::Service(key_of(&web)), true);

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
            .any(|w| w.warning.reason == "AddressNotInPool"
                && w.object == Target::Service(Key::new("a", "web"))),
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
        .any(|w| w.object == Target::Service(Key::new("a", "late"))
            && w.warning.reason == "NoAddressAvailable"));
}

#[test]
fn a_service_that_stops_being_rivoras_loses_what_rivora_wrote() {
    let web = svc("a", "web", 1, json!({}));
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![web.clone()]);
    i.lead();
    let plan = i.plan(&at(5));
    let web = after(&web, service_writes(&plan)["a/web"], "11");
    i.services.apply(Event::Apply(web.clone()));
    i.written(&Target::Service(key_of(&web)), true);
    land_pool_writes(&mut i, &plan);

    // Its type changes to ClusterIP.
    let mut cluster_ip = web.clone();
    if let Some(s) = cluster_ip.spec.as_mut() {
        s.type_ = Some("ClusterIP".into());
    }
    i.services.apply(Event::Apply(cluster_ip));
    i.service_changed(key_of(&web));
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

/// `s` as the API server has it after someone else's change of its
/// `status` (merge-patched), at version `rv`.
fn edited(s: &Service, status: Value, rv: &str) -> Service {
    let w = Write {
        target: Target::Service(key_of(s)),
        resource_version: String::new(),
        status,
    };
    after(s, &w, rv)
}

fn assigned_condition(w: &Write) -> &Value {
    condition(&w.status["conditions"], CONDITION_ADDRESS_ASSIGNED)
}

#[test]
fn a_refused_write_leaves_the_status_that_won() {
    let web = svc("a", "web", 1, json!({}));
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![web.clone()]);
    i.lead();
    let plan = i.plan(&at(5));
    assert_eq!(ingress(service_writes(&plan)["a/web"]), ["10.0.0.0"]);

    // Someone else wrote the status first: the write from version 10 is
    // refused (409), and the watch brings the status that won.
    let k = Key::new("a", "web");
    i.refused(&Target::Service(k.clone()), "10");
    let won = edited(
        &web,
        json!({ "loadBalancer": { "ingress": [{ "ip": "10.0.0.5" }] } }),
        "11",
    );
    i.services.apply(Event::Apply(won));
    i.service_changed(k);
    let plan = i.plan(&at(6));
    let w = service_writes(&plan);
    assert_eq!(
        ingress(w["a/web"]),
        ["10.0.0.5"],
        "the address picked for the refused write is written over the status that won"
    );
    assert_eq!(w["a/web"].resource_version, "11");
    let cond = assigned_condition(w["a/web"]);
    assert_eq!(
        (&cond["status"], &cond["reason"]),
        (&json!("True"), &json!("Assigned"))
    );
    assert_eq!(cond["message"], "assigned 10.0.0.5");

    // The address picked and never written is no one's: the next Service
    // gets it.
    i.services.apply(Event::Apply(svc("a", "db", 2, json!({}))));
    i.service_changed(Key::new("a", "db"));
    let plan = i.plan(&at(7));
    assert_eq!(ingress(service_writes(&plan)["a/db"]), ["10.0.0.0"]);
}

#[test]
fn a_refused_write_is_not_sent_again_from_the_same_version() {
    let web = svc("a", "web", 1, json!({}));
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![web.clone()]);
    i.lead();
    let first = i.plan(&at(5));
    assert_eq!(service_writes(&first).len(), 1);
    // Refused before the watch brings the newer version: planned again
    // from version 10 (a pool change replans every Service), it would
    // only be refused again.
    let k = Key::new("a", "web");
    i.refused(&Target::Service(k.clone()), "10");
    i.pools_changed();
    let again = i.plan(&at(6));
    assert!(
        service_writes(&again).is_empty(),
        "sent again from the refused version: {:#?}",
        again.writes
    );
    // The newer version (a label someone added, no status) is planned
    // and written: the address reserved meanwhile, which no status
    // holds, is given again by the usual rules.
    let mut newer = web.clone();
    newer.metadata.resource_version = Some("11".into());
    newer
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("team".into(), "x".into());
    i.services.apply(Event::Apply(newer));
    i.service_changed(k);
    let plan = i.plan(&at(7));
    let w = service_writes(&plan);
    assert_eq!(w["a/web"].resource_version, "11");
    assert_eq!(ingress(w["a/web"]), ["10.0.0.0"]);
}

#[test]
fn an_address_removed_from_the_status_by_hand_is_not_written_back() {
    let held = svc(
        "a",
        "web",
        1,
        json!({ "loadBalancer": { "ingress": [{ "ip": "10.0.0.2" }] } }),
    );
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![held.clone()]);
    i.lead();
    let plan = i.plan(&at(5));
    let web = after(&held, service_writes(&plan)["a/web"], "11");
    i.services.apply(Event::Apply(web.clone()));
    i.written(&Target::Service(key_of(&web)), true);
    land_pool_writes(&mut i, &plan);

    // The pool shrinks: 10.0.0.2 is in no pool, kept and flagged, and
    // the flag tells the owner how to get a new one.
    let mut smaller = pool("p", &["10.0.0.4/30"]);
    smaller.metadata.generation = Some(2);
    i.pools.apply(Event::Apply(smaller));
    i.pools_changed();
    let plan = i.plan(&at(6));
    let w = service_writes(&plan);
    assert_eq!(ingress(w["a/web"]), ["10.0.0.2"]);
    let cond = assigned_condition(w["a/web"]);
    assert_eq!(cond["reason"], "AddressNotInPool");
    let advice = "remove it from the status for a new one";
    assert!(
        cond["message"].as_str().unwrap_or("").contains(advice),
        "{cond}"
    );
    let web = after(&web, w["a/web"], "12");
    i.services.apply(Event::Apply(web.clone()));
    i.written(&Target::Service(key_of(&web)), true);

    // The owner takes the advice.
    let removed = edited(&web, json!({ "loadBalancer": { "ingress": null } }), "13");
    i.services.apply(Event::Apply(removed));
    i.service_changed(key_of(&web));
    let plan = i.plan(&at(7));
    let w = service_writes(&plan);
    assert_eq!(
        ingress(w["a/web"]),
        ["10.0.0.4"],
        "the address removed by hand is written back"
    );
    assert_eq!(w["a/web"].resource_version, "13");
    let cond = assigned_condition(w["a/web"]);
    assert_eq!(
        (&cond["status"], &cond["reason"]),
        (&json!("True"), &json!("Assigned"))
    );
    assert_eq!(i.gauges()[&("p".to_string(), "ipv4")], (1, 3));
}

#[test]
fn a_relist_holds_off_leading_until_it_is_done() {
    let web = svc(
        "a",
        "web",
        1,
        json!({ "loadBalancer": { "ingress": [{ "ip": "10.0.0.3" }] } }),
    );
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![web.clone()]);
    assert!(i.may_lead());
    // The Service watch fell too far behind (410 Gone) and lists again:
    // until the list is done its copies are older than the API server,
    // and a table rebuilt from them would hand out addresses that
    // statuses it has not seen hold.
    let ev = |e: Event<Service>, i: &mut Ipam| {
        i.listing("services", &e);
        i.services.apply(e);
    };
    ev(Event::Init, &mut i);
    assert!(!i.may_lead(), "leads from a list in progress");
    ev(Event::InitApply(web), &mut i);
    assert!(!i.may_lead(), "leads from a list in progress");
    ev(Event::InitDone, &mut i);
    assert!(i.may_lead());
    // Any watch: a Namespace list in progress too.
    i.listing("namespaces", &Event::<Namespace>::Init);
    assert!(!i.may_lead());
    i.listing("namespaces", &Event::<Namespace>::InitDone);
    assert!(i.may_lead());
}

#[test]
fn a_leader_that_started_from_a_stale_list_takes_the_newer_statuses() {
    let web = svc(
        "a",
        "web",
        1,
        json!({ "loadBalancer": { "ingress": [{ "ip": "10.0.0.0" }] } }),
    );
    // In the copy this replica leads from, "late" has no address; the
    // API server has a newer version whose status gives it 10.0.0.3,
    // which the watch has not brought yet.
    let late = svc("a", "late", 2, json!({}));
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![web, late.clone()]);
    i.lead();
    let plan = i.plan(&at(5));
    assert_eq!(ingress(service_writes(&plan)["a/late"]), ["10.0.0.1"]);

    // The watch brings the newer version before the write's answer.
    let k = Key::new("a", "late");
    let newer = edited(
        &late,
        json!({ "loadBalancer": { "ingress": [{ "ip": "10.0.0.3" }] } }),
        "12",
    );
    i.services.apply(Event::Apply(newer));
    i.service_changed(k.clone());
    let plan = i.plan(&at(6));
    let w = service_writes(&plan);
    assert_eq!(
        ingress(w["a/late"]),
        ["10.0.0.3"],
        "renumbered to the stale list's guess"
    );
    assert_eq!(w["a/late"].resource_version, "12");
    // Then the answer: version 10 was refused. The write from 12 is in
    // flight: nothing is sent twice.
    i.refused(&Target::Service(k), "10");
    i.pools_changed();
    let plan = i.plan(&at(7));
    assert!(
        !service_writes(&plan).contains_key("a/late"),
        "{:#?}",
        plan.writes
    );
    // The guess is no one's.
    i.services
        .apply(Event::Apply(svc("a", "new", 3, json!({}))));
    i.service_changed(Key::new("a", "new"));
    let plan = i.plan(&at(8));
    assert_eq!(ingress(service_writes(&plan)["a/new"]), ["10.0.0.1"]);
}

// ---------------------------------------------------------------------
// Gateways

fn class(name: &str, controller: &str) -> GatewayClass {
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": { "name": name, "generation": 1, "resourceVersion": "5",
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": { "controllerName": controller },
    }))
    .expect("a GatewayClass")
}

fn gateway(ns: &str, name: &str, class: &str, age: u32, extra: Value) -> Gateway {
    let mut v = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": { "namespace": ns, "name": name, "generation": 1, "resourceVersion": "20",
                      "creationTimestamp": format!("2026-01-01T00:{age:02}:00Z") },
        "spec": {
            "gatewayClassName": class,
            "listeners": [
                { "name": "tcp", "protocol": "TCP", "port": 80 },
                { "name": "udp", "protocol": "UDP", "port": 53 },
            ],
        },
    });
    if let (Some(spec), Value::Object(e)) = (v["spec"].as_object_mut(), extra) {
        spec.extend(e);
    }
    serde_json::from_value(v).expect("a Gateway")
}

fn tcp_route(ns: &str, name: &str, gw_ns: &str, gw: &str) -> TcpRoute {
    serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "TCPRoute",
        "metadata": { "namespace": ns, "name": name, "generation": 1, "resourceVersion": "30",
                      "creationTimestamp": "2026-01-01T00:03:00Z" },
        "spec": {
            "parentRefs": [{ "name": gw, "namespace": gw_ns, "sectionName": "tcp" }],
            "rules": [{ "backendRefs": [{ "name": "web", "port": 80 }] }],
        },
    }))
    .expect("a TCPRoute")
}

/// An Ipam with the Gateway API listed (served at v1, routes v1alpha2).
fn with_gateways(
    mut i: Ipam,
    classes: Vec<GatewayClass>,
    gateways: Vec<Gateway>,
    routes: Vec<TcpRoute>,
) -> Ipam {
    i.gateway.classes = listed(classes);
    i.gateway.gateways = listed(gateways);
    i.gateway.tcp_routes = listed(routes);
    i.gateway.udp_routes = listed(Vec::new());
    i.gateway.grants = listed(Vec::new());
    // And no ServicePolicies (policies.rs has their own tests).
    i.policies.policies = listed(Vec::new());
    i.policies.slices = listed(Vec::new());
    for (k, v) in [
        ("GatewayClass", "v1"),
        ("Gateway", "v1"),
        ("TCPRoute", "v1alpha2"),
        ("UDPRoute", "v1alpha2"),
    ] {
        i.gateway.versions.insert(k, v);
    }
    i
}

fn writes_to<'a>(p: &'a Plan, t: &Target) -> Vec<&'a Write> {
    p.writes.iter().filter(|w| &w.target == t).collect()
}

fn condition<'a>(conds: &'a Value, type_: &str) -> &'a Value {
    conds
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} in {conds}"))
}

#[test]
fn a_gateway_of_rivoras_class_gets_an_address_and_its_status_in_one_write() {
    let i = ipam(
        vec![pool("p", &["10.0.0.8-10.0.0.9"])],
        vec![svc("a", "web", 1, json!({}))],
    );
    let mut i = with_gateways(
        i,
        vec![
            class("rivora", "rivora.io/gateway-controller"),
            class("other", "x.io/gw"),
        ],
        vec![
            gateway("a", "gw", "rivora", 2, json!({})),
            gateway("a", "theirs", "other", 2, json!({})),
        ],
        vec![tcp_route("a", "r", "a", "gw")],
    );
    i.lead();
    let plan = i.plan(&at(5));
    // The Service is older: .8; the Gateway .9; the other class's nothing.
    assert_eq!(ingress(service_writes(&plan)["a/web"]), ["10.0.0.8"]);
    let g = writes_to(&plan, &Target::Gateway(Key::new("a", "gw")));
    assert_eq!(g.len(), 1, "{:#?}", plan.writes);
    let body = &g[0].status;
    assert_eq!(g[0].resource_version, "20");
    assert_eq!(body["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(
        body["status"]["addresses"],
        json!([{ "type": "IPAddress", "value": "10.0.0.9" }])
    );
    assert_eq!(
        condition(&body["status"]["conditions"], "Programmed")["status"],
        "True"
    );
    assert_eq!(
        condition(&body["status"]["conditions"], "Accepted")["status"],
        "True"
    );
    let tcp = &body["status"]["listeners"][0];
    assert_eq!(tcp["name"], "tcp");
    assert_eq!(tcp["attachedRoutes"], 1);
    assert!(writes_to(&plan, &Target::Gateway(Key::new("a", "theirs"))).is_empty());
    // The class, and the route's parent.
    let c = writes_to(&plan, &Target::GatewayClass("rivora".into()));
    assert_eq!(
        condition(&c[0].status["status"]["conditions"], "Accepted")["status"],
        "True"
    );
    assert!(writes_to(&plan, &Target::GatewayClass("other".into())).is_empty());
    let r = writes_to(&plan, &Target::TcpRoute(Key::new("a", "r")));
    assert_eq!(
        r[0].status["apiVersion"],
        "gateway.networking.k8s.io/v1alpha2"
    );
    let parent = &r[0].status["status"]["parents"][0];
    assert_eq!(parent["controllerName"], "rivora.io/gateway-controller");
    assert_eq!(
        condition(&parent["conditions"], "Accepted")["status"],
        "True"
    );
    assert_eq!(
        condition(&parent["conditions"], "ResolvedRefs")["status"],
        "True"
    );
    // The pool counts both.
    let p = writes_to(&plan, &Target::Pool("p".into()));
    assert_eq!(p[0].status["assigned"]["ipv4"], 2);
}

#[test]
fn a_gateway_without_a_free_address_says_why_and_is_warned() {
    let i = ipam(
        vec![pool("p", &["10.0.0.8"])],
        vec![svc("a", "web", 1, json!({}))],
    );
    let mut i = with_gateways(
        i,
        vec![class("rivora", "rivora.io/gateway-controller")],
        vec![gateway("a", "gw", "rivora", 2, json!({}))],
        vec![],
    );
    i.lead();
    let plan = i.plan(&at(5));
    let g = writes_to(&plan, &Target::Gateway(Key::new("a", "gw")));
    let st = &g[0].status["status"];
    assert!(st.get("addresses").is_none_or(Value::is_null), "{st}");
    let prog = condition(&st["conditions"], "Programmed");
    assert_eq!(prog["status"], "False");
    assert_eq!(prog["reason"], "AddressNotAssigned");
    assert!(
        prog["message"]
            .as_str()
            .unwrap_or("")
            .contains("no free IPv4 address"),
        "{prog}"
    );
    assert!(plan
        .warnings
        .iter()
        .any(|w| w.object == Target::Gateway(Key::new("a", "gw"))
            && w.warning.reason == "NoAddressAvailable"));
}

#[test]
fn a_gateway_asks_for_its_address_and_releases_it_when_deleted() {
    let i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![]);
    let gw = gateway(
        "a",
        "gw",
        "rivora",
        2,
        json!({ "addresses": [{ "type": "IPAddress", "value": "10.0.0.5" }] }),
    );
    let mut i = with_gateways(
        i,
        vec![class("rivora", "rivora.io/gateway-controller")],
        vec![gw.clone()],
        vec![],
    );
    i.lead();
    let plan = i.plan(&at(5));
    let g = writes_to(&plan, &Target::Gateway(Key::new("a", "gw")));
    assert_eq!(
        g[0].status["status"]["addresses"],
        json!([{ "type": "IPAddress", "value": "10.0.0.5" }])
    );
    land_pool_writes(&mut i, &plan);
    i.written(&Target::Gateway(Key::new("a", "gw")), true);
    // Deleted: the address is free, the pool says so.
    i.gateway.gateways.apply(Event::Delete(gw));
    i.gateways_changed();
    let plan = i.plan(&at(6));
    let p = writes_to(&plan, &Target::Pool("p".into()));
    assert_eq!(p[0].status["assigned"]["ipv4"], 0, "{:#?}", plan.writes);
    // A Service may have it now.
    i.services
        .apply(Event::Apply(svc("a", "web", 9, json!({}))));
    i.service_changed(Key::new("a", "web"));
    let plan = i.plan(&at(7));
    assert_eq!(ingress(service_writes(&plan)["a/web"]), ["10.0.0.0"]);
}

#[test]
fn a_new_leader_keeps_the_gateways_addresses_and_writes_nothing() {
    let i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![]);
    let classes = vec![class("rivora", "rivora.io/gateway-controller")];
    let gw = gateway("a", "gw", "rivora", 2, json!({}));
    let mut i = with_gateways(i, classes.clone(), vec![gw.clone()], vec![]);
    i.lead();
    let plan = i.plan(&at(5));
    // As stored after the writes.
    let stored = |t: &Target| -> Value {
        writes_to(&plan, t)
            .first()
            .map(|w| w.status.clone())
            .expect("a write")
    };
    let gw: Gateway = serde_json::from_value(stored(&Target::Gateway(Key::new("a", "gw"))))
        .expect("the Gateway as written");
    let c: GatewayClass = serde_json::from_value(stored(&Target::GatewayClass("rivora".into())))
        .expect("the class as written");
    let mut p = pool("p", &["10.0.0.0/29"]);
    p.status = Some(
        serde_json::from_value(stored(&Target::Pool("p".into()))).expect("the pool as written"),
    );
    let j = ipam(vec![p], vec![]);
    let mut j = with_gateways(j, vec![c], vec![gw], vec![]);
    j.lead();
    let again = j.plan(&at(9));
    assert!(again.writes.is_empty(), "{:#?}", again.writes);
}

#[test]
fn a_service_of_no_class_another_load_balancer_answered_is_left_alone() {
    // kube-vip (or a cloud) gave "theirs" an address first: no condition
    // of Rivora's beside it. "mine" has no status yet: Rivora's.
    let theirs = unclassed(
        "a",
        "theirs",
        1,
        json!({ "loadBalancer": { "ingress": [{ "ip": "192.0.2.7" }] } }),
    );
    let mine = unclassed("a", "mine", 2, json!({}));
    let mut i = ipam(
        vec![pool("p", &["10.0.0.0/29"])],
        vec![theirs, mine.clone()],
    );
    i.lead();
    let plan = i.plan(&at(5));
    let w = service_writes(&plan);
    assert!(
        !w.contains_key("a/theirs"),
        "its status was written: {:?}",
        w.get("a/theirs")
    );
    assert_eq!(ingress(w["a/mine"]), ["10.0.0.0"]);
    let said: Vec<&ObjectWarning> = plan
        .warnings
        .iter()
        .filter(|w| w.object == Target::Service(Key::new("a", "theirs")))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", plan.warnings);
    assert_eq!(said[0].warning.reason, WARN_LEFT_TO_ANOTHER);
    assert!(
        said[0].warning.message.contains("192.0.2.7"),
        "{}",
        said[0].warning.message
    );
    // What Rivora wrote carries its condition: still Rivora's after.
    let mine = after(&mine, w["a/mine"], "11");
    assert!(!rivora_k8s::translate::written_by_another(&mine));
    i.services.apply(Event::Apply(mine.clone()));
    i.written(&Target::Service(key_of(&mine)), true);
    i.service_changed(key_of(&mine));
    let plan = i.plan(&at(6));
    assert!(service_writes(&plan).is_empty(), "{:?}", plan.writes);
    // With -require-class nothing of no class is Rivora's, and nothing
    // is said about it either.
    let mut strict = Ipam::new(TranslateOptions {
        accept_unset_class: false,
        ..TranslateOptions::default()
    });
    strict.pools = listed(vec![pool("p", &["10.0.0.0/29"])]);
    strict.namespaces = listed(vec![ns("a")]);
    strict.services = listed(vec![unclassed(
        "a",
        "theirs",
        1,
        json!({ "loadBalancer": { "ingress": [{ "ip": "192.0.2.7" }] } }),
    )]);
    let mut strict = with_gateways(strict, vec![], vec![], vec![]);
    strict.lead();
    let plan = strict.plan(&at(5));
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    assert!(service_writes(&plan).is_empty());
}

#[test]
fn another_installations_services_keep_what_it_wrote() {
    // A second Rivora, class "other.example/lb", assigned "its" and wrote
    // its condition: this one neither clears nor flags it.
    let mut its = svc(
        "a",
        "its",
        1,
        json!({
            "loadBalancer": { "ingress": [{ "ip": "10.9.0.1" }] },
            "conditions": [{ "type": CONDITION_ADDRESS_ASSIGNED, "status": "True",
                "reason": "Assigned", "message": "assigned 10.9.0.1",
                "lastTransitionTime": "2026-01-01T00:00:00Z" }],
        }),
    );
    if let Some(s) = its.spec.as_mut() {
        s.load_balancer_class = Some("other.example/lb".into());
    }
    let mut i = ipam(vec![pool("p", &["10.0.0.0/29"])], vec![its]);
    i.lead();
    let plan = i.plan(&at(5));
    assert!(service_writes(&plan).is_empty(), "{:?}", plan.writes);

    // One of this installation's that moves to the other class loses
    // what this one wrote.
    let web = svc("a", "web", 2, json!({}));
    i.services.apply(Event::Apply(web.clone()));
    i.service_changed(key_of(&web));
    let plan = i.plan(&at(6));
    let web = after(&web, service_writes(&plan)["a/web"], "11");
    i.services.apply(Event::Apply(web.clone()));
    i.written(&Target::Service(key_of(&web)), true);
    let mut moved = web.clone();
    if let Some(s) = moved.spec.as_mut() {
        s.load_balancer_class = Some("other.example/lb".into());
    }
    moved.metadata.resource_version = Some("12".into());
    i.services.apply(Event::Apply(moved));
    i.service_changed(key_of(&web));
    let plan = i.plan(&at(7));
    let w = service_writes(&plan);
    assert!(
        w["a/web"].status["loadBalancer"]["ingress"].is_null(),
        "{:?}",
        w["a/web"]
    );
    assert!(w["a/web"].status["conditions"].is_null());
}
