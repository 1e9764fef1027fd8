//! The source's bookkeeping without an API server: watch events in,
//! reconciler commands out. The translation itself is tested in
//! rivora-k8s; the whole path against a real API server in
//! tests/e2e_kubernetes.rs.

use std::sync::{mpsc, Mutex};

use serde_json::json;

use super::*;
use rivora_k8s_client::versioned::{GwEvent, Unreadable};

fn svc(ns: &str, name: &str, ip: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        // Rivora's class: its ingress was written by rivora-controller,
        // whatever this fixture leaves out of the status.
        "spec": {"type": "LoadBalancer", "loadBalancerClass": rivora_k8s::translate::RIVORA_LB_CLASS,
                 "ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "sctp", "port": 9, "protocol": "SCTP"}
        ]},
        "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}
    }))
    .expect("a Service")
}

fn slice(ns: &str, name: &str, service: &str, addrs: &[&str]) -> EndpointSlice {
    let endpoints: Vec<_> = addrs
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    }))
    .expect("an EndpointSlice")
}

fn policy(ns: &str, name: &str, created: &str, spec: serde_json::Value) -> ServicePolicy {
    serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
        "metadata": {"namespace": ns, "name": name, "creationTimestamp": created, "generation": 1},
        "spec": spec
    }))
    .expect("a ServicePolicy")
}

fn not_found() -> watcher::Error {
    watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
        serde_json::from_value(
            json!({"status": "Failure", "code": 404, "message": "404 page not found"}),
        )
        .expect("a Status"),
    )))
}

/// A warning as published: Service, reason, message.
type Warned = (String, &'static str, String);

/// A source with its commands and warnings captured.
struct Harness {
    state: State,
    tx: Sender,
    rx: mpsc::Receiver<Command>,
    out: KubeOutputs,
    warner: Warner,
    warnings: Arc<Mutex<Vec<Warned>>>,
}

/// What one step sent: Service owner -> the VIP keys it wants (empty:
/// withdrawn), and whether Synced(Service) followed; the same for
/// Gateways.
#[derive(Debug, Default, PartialEq)]
struct Sent {
    set: BTreeMap<String, Vec<String>>,
    synced: bool,
    gateways: BTreeMap<String, Vec<String>>,
    gateways_synced: bool,
    /// VIP key -> why its source refuses it, of what was sent.
    refused: BTreeMap<String, String>,
}

/// An AddressPool of these addresses, admitting every Service.
fn pool(name: &str, addrs: &[&str]) -> AddressPool {
    serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "AddressPool",
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"addresses": addrs}
    }))
    .expect("an AddressPool")
}

fn pools(items: Vec<AddressPool>) -> Vec<Msg> {
    listed(items).into_iter().map(Msg::Pool).collect()
}

fn namespaces(items: &[(&str, serde_json::Value)]) -> Vec<Msg> {
    let items = items
        .iter()
        .map(|(n, labels)| {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": n, "labels": labels}
            }))
            .expect("a Namespace")
        })
        .collect();
    listed(items).into_iter().map(Msg::Namespace).collect()
}

impl Harness {
    /// A source whose pools hold every address the tests use, its
    /// namespaces listed: what the other watches send decides.
    fn new() -> Self {
        let mut h = Self::bare();
        let now = Instant::now();
        let mut msgs = pools(vec![pool("all", &["10.0.0.0/16", "2001:db8::/64"])]);
        msgs.extend(namespaces(&[]));
        for m in msgs {
            h.state.handle(m, now);
        }
        h
    }

    /// A source nothing has reached yet.
    fn bare() -> Self {
        let (tx, rx) = mpsc::channel();
        let warnings: Arc<Mutex<Vec<Warned>>> = Arc::default();
        let w = warnings.clone();
        let ws = warnings.clone();
        let warner = Warner {
            services: rivora_k8s_client::Warner::new(
                Arc::new(move |o: Arc<Service>, reason, msg| {
                    ws.lock()
                        .unwrap()
                        .push((key_of(&*o).to_string(), reason, msg));
                }),
                EVENT_REPEAT,
            ),
            gateways: rivora_k8s_client::Warner::new(
                Arc::new(move |o: Arc<Gateway>, reason, msg| {
                    w.lock()
                        .unwrap()
                        .push((key_of(&*o).to_string(), reason, msg));
                }),
                EVENT_REPEAT,
            ),
        };
        Self {
            state: State::new(KubeOptions {
                node_name: "node-a".into(),
                translate: TranslateOptions::default(),
            }),
            tx,
            rx,
            out: KubeOutputs::new().0,
            warner,
            warnings,
        }
    }

    fn feed(&mut self, msgs: Vec<Msg>) -> Sent {
        let now = Instant::now();
        for m in msgs {
            self.state.handle(m, now);
        }
        step(&mut self.state, &self.tx, &self.out, &self.warner).expect("the reconciler is there");
        let mut sent = Sent::default();
        while let Ok(c) = self.rx.try_recv() {
            match c {
                Command::SetDesired { owner, vips, ack } => {
                    for v in &vips {
                        if let Some(why) = &v.refused {
                            sent.refused.insert(v.vip.key().to_string(), why.clone());
                        }
                    }
                    let keys = vips
                        .iter()
                        .map(|v| {
                            let bs: Vec<String> = v
                                .vip
                                .backends
                                .iter()
                                .map(|b| format!("{}:{}*{}", b.addr, b.port, b.weight))
                                .collect();
                            if owner.source == SourceKind::Gateway {
                                format!("{} [{}]", v.vip.key(), bs.join(" "))
                            } else {
                                v.vip.key().to_string()
                            }
                        })
                        .collect();
                    if owner.source == SourceKind::Gateway {
                        assert!(
                            !sent.gateways_synced,
                            "a Gateway sent after Synced in one step"
                        );
                        sent.gateways.insert(owner.object.to_string(), keys);
                    } else {
                        assert_eq!(owner.source, SourceKind::Service);
                        assert!(!sent.synced, "a Service sent after Synced in one step");
                        sent.set.insert(owner.object.to_string(), keys);
                    }
                    // Answer as the reconciler would.
                    if let Some(ack) = ack {
                        let _ = ack.send(Applied { failed: Vec::new() });
                    }
                }
                Command::Synced(SourceKind::Service) => sent.synced = true,
                Command::Synced(SourceKind::Gateway) => sent.gateways_synced = true,
                _ => panic!("unexpected command"),
            }
        }
        sent
    }
}

fn listed<K>(items: Vec<K>) -> Vec<watcher::Result<Event<K>>> {
    let mut v = vec![Ok(Event::Init)];
    v.extend(items.into_iter().map(|i| Ok(Event::InitApply(i))));
    v.push(Ok(Event::InitDone));
    v
}

fn services(items: Vec<Service>) -> Vec<Msg> {
    listed(items).into_iter().map(Msg::Service).collect()
}
fn slices(items: Vec<EndpointSlice>) -> Vec<Msg> {
    listed(items).into_iter().map(Msg::Slice).collect()
}
fn policies(items: Vec<ServicePolicy>) -> Vec<Msg> {
    listed(items).into_iter().map(Msg::Policy).collect()
}

fn set(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    entries
        .iter()
        .map(|(o, k)| (o.to_string(), k.iter().map(|s| s.to_string()).collect()))
        .collect()
}

#[tokio::test]
async fn nothing_is_sent_until_every_watch_has_listed_then_all_and_synced() {
    let mut h = Harness::new();
    // Services and slices listed, policies not yet: a Service sent now
    // would be sent again when a policy changes its mode, and on a
    // restart its adopted VIP would be rewritten twice.
    let sent = h.feed(services(vec![svc("a", "web", "10.0.0.1")]));
    assert_eq!(sent, Sent::default());
    let sent = h.feed(slices(vec![slice("a", "web-1", "web", &["10.1.0.1"])]));
    assert_eq!(sent, Sent::default());
    assert!(!h.state.watches[Watch::ServicePolicies as usize].synced);
    let sent = h.feed(policies(vec![]));
    assert_eq!(
        sent,
        Sent {
            set: set(&[("a/web", &["tcp/10.0.0.1:80"])]),
            synced: true,
            ..Default::default()
        }
    );
    // The Service half's watches; the Gateway half has its own pass.
    assert!(h.state.watches[..3].iter().all(|w| w.synced));
    assert_eq!(h.state.watches[Watch::Services as usize].objects, 1);
    // Synced is said once.
    let sent = h.feed(vec![Msg::Slice(Ok(Event::Apply(slice(
        "a",
        "web-1",
        "web",
        &["10.1.0.1", "10.1.0.2"],
    ))))]);
    assert_eq!(
        sent,
        Sent {
            set: set(&[("a/web", &["tcp/10.0.0.1:80"])]),
            synced: false,
            ..Default::default()
        }
    );
}

#[tokio::test]
async fn an_unreachable_api_server_sends_nothing_and_never_syncs() {
    let mut h = Harness::new();
    let err = || watcher::Error::WatchFailed(kube::Error::LinesCodecMaxLineLengthExceeded);
    let sent = h.feed(vec![
        Msg::Service(Err(err())),
        Msg::Slice(Err(err())),
        Msg::Policy(Err(err())),
    ]);
    assert_eq!(sent, Sent::default());
    for w in &h.state.watches[..3] {
        assert!(!w.synced, "{w:?}");
        assert_eq!(w.errors, 1, "{w:?}");
        assert!(w.last_error.is_some() && w.last_error_at > 0, "{w:?}");
    }
}

#[tokio::test]
async fn a_missing_policy_crd_means_no_policies_not_no_sync() {
    let mut h = Harness::new();
    h.feed(services(vec![svc("a", "web", "10.0.0.1")]));
    h.feed(slices(vec![]));
    let sent = h.feed(vec![Msg::Policy(Err(not_found()))]);
    assert!(sent.synced);
    assert_eq!(sent.set, set(&[("a/web", &["tcp/10.0.0.1:80"])]));
    let w = &h.state.watches[Watch::ServicePolicies as usize];
    assert!(w.synced);
    assert!(
        w.last_error
            .as_deref()
            .unwrap_or("")
            .contains("not installed"),
        "{w:?}"
    );
    // Retries that find it still missing change nothing.
    let sent = h.feed(vec![Msg::Policy(Err(not_found()))]);
    assert_eq!(sent, Sent::default());
    // Installed later: its policies apply.
    let sent = h.feed(policies(vec![policy(
        "a",
        "p",
        "2026-01-01T00:00:00Z",
        json!({"services": ["web"], "mode": "dsr"}),
    )]));
    assert_eq!(sent.set, set(&[("a/web", &["tcp/10.0.0.1:80"])]));
}

#[tokio::test]
async fn a_relist_withdraws_what_is_gone_and_only_then() {
    let mut h = Harness::new();
    h.feed(services(vec![
        svc("a", "web", "10.0.0.1"),
        svc("a", "db", "10.0.0.2"),
    ]));
    h.feed(slices(vec![]));
    let sent = h.feed(policies(vec![]));
    assert_eq!(sent.set.len(), 2);
    // The watch restarts: while it lists again, the old copy stands.
    let sent = h.feed(vec![
        Msg::Service(Ok(Event::Init)),
        Msg::Service(Ok(Event::InitApply(svc("a", "web", "10.0.0.1")))),
    ]);
    assert_eq!(sent, Sent::default());
    assert_eq!(h.state.services.items.len(), 2);
    let sent = h.feed(vec![Msg::Service(Ok(Event::InitDone))]);
    // web is unchanged: not sent again; db is gone: withdrawn.
    assert_eq!(sent.set, set(&[("a/db", &[])]));
}

#[tokio::test]
async fn unchanged_services_are_not_sent_again() {
    let mut h = Harness::new();
    h.feed(services(vec![svc("a", "web", "10.0.0.1")]));
    h.feed(slices(vec![slice("a", "web-1", "web", &["10.1.0.1"])]));
    h.feed(policies(vec![]));
    // A Service update that changes nothing the dataplane holds (a new
    // resourceVersion, an annotation).
    let mut s = svc("a", "web", "10.0.0.1");
    s.metadata.annotations = Some([("x".to_string(), "y".to_string())].into());
    let sent = h.feed(vec![Msg::Service(Ok(Event::Apply(s)))]);
    assert_eq!(sent, Sent::default());
}

#[tokio::test]
async fn slices_follow_their_service_label_and_deletes() {
    let mut h = Harness::new();
    h.feed(services(vec![
        svc("a", "web", "10.0.0.1"),
        svc("a", "api", "10.0.0.2"),
    ]));
    h.feed(slices(vec![slice("a", "s1", "web", &["10.1.0.1"])]));
    h.feed(policies(vec![]));
    assert_eq!(h.state.slices_of[&ObjectRef::new("a", "web")].len(), 1);
    // The slice is relabelled to another Service: both are sent.
    let sent = h.feed(vec![Msg::Slice(Ok(Event::Apply(slice(
        "a",
        "s1",
        "api",
        &["10.1.0.1"],
    ))))]);
    assert_eq!(sent.set.keys().collect::<Vec<_>>(), ["a/api", "a/web"]);
    assert!(!h.state.slices_of.contains_key(&ObjectRef::new("a", "web")));
    let vips = |h: &Harness, s: &str| h.state.sent[&ObjectRef::new("a", s)].vips.clone();
    assert!(vips(&h, "web")[0].vip.backends.is_empty());
    assert_eq!(vips(&h, "api")[0].vip.backends.len(), 1);
    // Deleted: the Service keeps its VIP with no backend.
    let sent = h.feed(vec![Msg::Slice(Ok(Event::Delete(slice(
        "a",
        "s1",
        "api",
        &[],
    ))))]);
    assert_eq!(sent.set, set(&[("a/api", &["tcp/10.0.0.2:80"])]));
    assert!(vips(&h, "api")[0].vip.backends.is_empty());
    assert!(h.state.slices_of.is_empty());
}

#[tokio::test]
async fn a_deleted_service_is_withdrawn() {
    let mut h = Harness::new();
    h.feed(services(vec![svc("a", "web", "10.0.0.1")]));
    h.feed(slices(vec![]));
    h.feed(policies(vec![]));
    let sent = h.feed(vec![Msg::Service(Ok(Event::Delete(svc(
        "a", "web", "10.0.0.1",
    ))))]);
    assert_eq!(sent.set, set(&[("a/web", &[])]));
    assert!(h.state.sent.is_empty());
    // Deleting what was never sent sends nothing.
    let sent = h.feed(vec![Msg::Service(Ok(Event::Delete(svc(
        "a", "other", "10.0.0.9",
    ))))]);
    assert_eq!(sent, Sent::default());
}

#[tokio::test]
async fn a_policy_resends_the_services_of_its_namespace_only() {
    let mut h = Harness::new();
    h.feed(services(vec![
        svc("a", "web", "10.0.0.1"),
        svc("b", "web", "10.0.0.2"),
    ]));
    h.feed(slices(vec![]));
    h.feed(policies(vec![]));
    let p = policy(
        "a",
        "p",
        "2026-01-01T00:00:00Z",
        json!({"services": ["web"], "mode": "dsr"}),
    );
    let sent = h.feed(vec![Msg::Policy(Ok(Event::Apply(p)))]);
    assert_eq!(sent.set, set(&[("a/web", &["tcp/10.0.0.1:80"])]));
    let mode = h.state.sent[&ObjectRef::new("a", "web")].vips[0].vip.mode;
    assert_eq!(mode, crate::model::Mode::Dsr);
}

#[tokio::test]
async fn warnings_become_events_once_per_repeat_period() {
    let mut h = Harness::new();
    h.feed(services(vec![svc("a", "web", "10.0.0.1")]));
    h.feed(slices(vec![]));
    h.feed(policies(vec![]));
    let got = h.warnings.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "a/web");
    assert_eq!(got[0].1, rivora_k8s::translate::WARN_UNSUPPORTED_PROTOCOL);
    assert!(got[0].2.contains("SCTP"), "{got:?}");
    // The Service changes (a new ingress address): translated again, the
    // same warning is not repeated.
    h.feed(vec![Msg::Service(Ok(Event::Apply(svc(
        "a", "web", "10.0.0.3",
    ))))]);
    assert_eq!(h.warnings.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_refused_vip_is_a_not_programmed_event() {
    let h = Harness::new();
    let s = Arc::new(svc("a", "web", "10.0.0.1"));
    report_applied(
        &ObjectRef::new("a", "web"),
        Some(s),
        &Applied {
            failed: vec![(
                crate::model::VipKey {
                    addr: "10.0.0.1".parse().expect("an address"),
                    ports: crate::model::Ports::One(80),
                    proto: crate::model::Protocol::Tcp,
                },
                "no free Maglev slots".into(),
            )],
        },
        &h.warner,
    );
    let got = h.warnings.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, WARN_NOT_PROGRAMMED);
    assert!(
        got[0].2.contains("tcp/10.0.0.1:80") && got[0].2.contains("no free Maglev slots"),
        "{got:?}"
    );
}

#[tokio::test]
async fn slice_changes_are_timed_to_their_map_write() {
    let mut h = Harness::new();
    h.feed(services(vec![svc("a", "web", "10.0.0.1")]));
    h.feed(slices(vec![slice("a", "s1", "web", &["10.1.0.1"])]));
    h.feed(policies(vec![]));
    h.feed(vec![Msg::Slice(Ok(Event::Apply(slice(
        "a",
        "s1",
        "web",
        &["10.1.0.1", "10.1.0.2"],
    ))))]);
    // The acks were answered; the tasks that time them run now.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let mut enc = String::new();
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register("p", "p", h.out.programming.clone());
    prometheus_client::encoding::text::encode(&mut enc, &reg).expect("encodes");
    // The change, not the initial list (nothing changed: it was read).
    assert!(enc.contains("p_count 1\n"), "{enc}");
}

// ---------------------------------------------------------------------
// The Gateway half
// ---------------------------------------------------------------------

fn gw_listed<K>(items: Vec<K>) -> Vec<GwEvent<K>> {
    let mut v = vec![GwEvent::Watch(Ok(Event::Init))];
    v.extend(
        items
            .into_iter()
            .map(|i| GwEvent::Watch(Ok(Event::InitApply(Ok(i))))),
    );
    v.push(GwEvent::Watch(Ok(Event::InitDone)));
    v
}

fn gw_class() -> GatewayClass {
    serde_json::from_value(json!({"metadata": {"name": "rivora"},
        "spec": {"controllerName": rivora_k8s::gateway::CONTROLLER_NAME}}))
    .expect("a GatewayClass")
}

fn gw(addr: &str) -> Gateway {
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": "gw", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"gatewayClassName": "rivora", "listeners": [
            {"name": "tcp", "protocol": "TCP", "port": 5432},
            {"name": "udp", "protocol": "UDP", "port": 53}]},
        "status": {"addresses": [{"type": "IPAddress", "value": addr}]}
    }))
    .expect("a Gateway")
}

fn route(backend: &str) -> TcpRoute {
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": "r", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"parentRefs": [{"name": "gw", "sectionName": "tcp"}],
                 "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}
    }))
    .expect("a TCPRoute")
}

/// A ClusterIP Service `a/db` (TCP 80, "http"), the backend of routes.
fn db() -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": "db"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .expect("a Service")
}

/// Everything listed: the Service half (with `a/db` and its slice) and
/// every Gateway API watch with the given objects.
fn gateway_world(h: &mut Harness, gateways: Vec<Gateway>, routes: Vec<TcpRoute>) -> Sent {
    let mut msgs = services(vec![db()]);
    msgs.extend(slices(vec![slice(
        "a",
        "db-1",
        "db",
        &["10.1.0.1", "10.1.0.2"],
    )]));
    msgs.extend(policies(vec![]));
    msgs.extend(
        gw_listed(vec![gw_class()])
            .into_iter()
            .map(Msg::GatewayClass),
    );
    msgs.extend(gw_listed(gateways).into_iter().map(Msg::Gateway));
    msgs.extend(gw_listed(routes).into_iter().map(Msg::TcpRoute));
    msgs.extend(gw_listed(vec![]).into_iter().map(Msg::UdpRoute));
    msgs.extend(gw_listed(vec![]).into_iter().map(Msg::Grant));
    msgs.extend(listed(vec![]).into_iter().map(Msg::Namespace));
    h.feed(msgs)
}

#[tokio::test]
async fn gateways_are_sent_after_both_halves_listed_then_synced() {
    let mut h = Harness::new();
    // The Service half alone: Services go, Gateways wait.
    let mut msgs = services(vec![db()]);
    msgs.extend(slices(vec![slice("a", "db-1", "db", &["10.1.0.1"])]));
    msgs.extend(policies(vec![]));
    msgs.extend(
        gw_listed(vec![gw("10.0.0.9")])
            .into_iter()
            .map(Msg::Gateway),
    );
    let sent = h.feed(msgs);
    assert!(
        sent.synced && sent.gateways.is_empty() && !sent.gateways_synced,
        "{sent:?}"
    );
    assert!(!h.state.watches[Watch::TcpRoutes as usize].synced);

    let mut h = Harness::new();
    let sent = gateway_world(&mut h, vec![gw("10.0.0.9")], vec![route("db")]);
    assert_eq!(
        sent.gateways,
        set(&[(
            "a/gw",
            &[
                "udp/10.0.0.9:53 []",
                "tcp/10.0.0.9:5432 [10.1.0.1:8080*1 10.1.0.2:8080*1]"
            ]
        )])
    );
    assert!(sent.gateways_synced);
    assert!(
        h.state.watches.iter().all(|w| w.synced),
        "{:?}",
        h.state.watches
    );
    assert_eq!(h.state.watches[Watch::Gateways as usize].objects, 1);

    // An EndpointSlice change of a Service a Gateway reads: sent again.
    let sent = h.feed(vec![Msg::Slice(Ok(Event::Apply(slice(
        "a",
        "db-1",
        "db",
        &["10.1.0.1"],
    ))))]);
    assert_eq!(
        sent.gateways,
        set(&[(
            "a/gw",
            &["udp/10.0.0.9:53 []", "tcp/10.0.0.9:5432 [10.1.0.1:8080*1]"]
        )])
    );
    assert!(!sent.gateways_synced, "Synced is said once");
    // A Service no Gateway reads: the Gateway is not sent.
    let sent = h.feed(services(vec![db(), svc("b", "web", "10.0.0.1")]));
    assert!(sent.gateways.is_empty(), "{sent:?}");
    // The route deleted: the VIP stays, with no backend.
    let sent = h.feed(vec![Msg::TcpRoute(GwEvent::Watch(Ok(Event::Delete(Ok(
        route("db"),
    )))))]);
    assert_eq!(
        sent.gateways,
        set(&[("a/gw", &["udp/10.0.0.9:53 []", "tcp/10.0.0.9:5432 []"])])
    );
    // The Gateway deleted: withdrawn.
    let sent = h.feed(vec![Msg::Gateway(GwEvent::Watch(Ok(Event::Delete(Ok(
        gw("10.0.0.9"),
    )))))]);
    assert_eq!(sent.gateways, set(&[("a/gw", &[])]));
}

#[tokio::test]
async fn without_the_gateway_api_crds_the_half_says_so_and_syncs_on_the_second_look() {
    let mut h = Harness::new();
    let mut msgs = services(vec![]);
    msgs.extend(slices(vec![]));
    msgs.extend(policies(vec![]));
    msgs.extend(listed(vec![]).into_iter().map(Msg::Namespace));
    let not_installed = || {
        vec![
            Msg::Gateway(GwEvent::NotInstalled),
            Msg::GatewayClass(GwEvent::NotInstalled),
            Msg::TcpRoute(GwEvent::NotInstalled),
            Msg::UdpRoute(GwEvent::NotInstalled),
            Msg::Grant(GwEvent::NotInstalled),
        ]
    };
    msgs.extend(not_installed());
    let sent = h.feed(msgs);
    // One answer is not enough: discovery can lag just after a start.
    assert!(sent.synced && !sent.gateways_synced, "{sent:?}");
    let w = &h.state.watches[Watch::TcpRoutes as usize];
    assert!(!w.synced);
    assert!(
        w.last_error
            .as_deref()
            .unwrap_or("")
            .contains("tcproutes gateway.networking.k8s.io) are not installed"),
        "{w:?}"
    );
    let sent = h.feed(not_installed());
    assert!(sent.gateways_synced && sent.gateways.is_empty(), "{sent:?}");
    assert!(
        h.state.watches.iter().all(|w| w.synced),
        "{:?}",
        h.state.watches
    );
    // Installed later: Gateways are picked up.
    let mut msgs: Vec<Msg> = gw_listed(vec![gw_class()])
        .into_iter()
        .map(Msg::GatewayClass)
        .collect();
    msgs.extend(
        gw_listed(vec![gw("10.0.0.9")])
            .into_iter()
            .map(Msg::Gateway),
    );
    let sent = h.feed(msgs);
    assert_eq!(
        sent.gateways,
        set(&[("a/gw", &["udp/10.0.0.9:53 []", "tcp/10.0.0.9:5432 []"])])
    );
}

#[tokio::test]
async fn an_unreadable_gateway_keeps_its_last_copy() {
    let mut h = Harness::new();
    gateway_world(&mut h, vec![gw("10.0.0.9")], vec![route("db")]);
    let bad = || Unreadable {
        key: ObjectRef::new("a", "gw"),
        error: "unknown variant `Somewhere`".into(),
    };
    // An update that cannot be read changes nothing.
    let sent = h.feed(vec![Msg::Gateway(GwEvent::Watch(Ok(Event::Apply(Err(
        bad(),
    )))))]);
    assert!(sent.gateways.is_empty(), "{sent:?}");
    let w = &h.state.watches[Watch::Gateways as usize];
    assert!(
        w.last_error
            .as_deref()
            .unwrap_or("")
            .contains("gateways a/gw cannot be read"),
        "{w:?}"
    );
    // Nor does a relist that cannot read it: the old copy stays.
    let sent = h.feed(vec![
        Msg::Gateway(GwEvent::Watch(Ok(Event::Init))),
        Msg::Gateway(GwEvent::Watch(Ok(Event::InitApply(Err(bad()))))),
        Msg::Gateway(GwEvent::Watch(Ok(Event::InitDone))),
    ]);
    assert!(sent.gateways.is_empty(), "{sent:?}");
    assert_eq!(h.state.watches[Watch::Gateways as usize].objects, 1);
}

/// A route naming a Service that does not exist yet: the Gateway is sent
/// without backends, and again with them once the Service and its slice
/// appear (the Gateway reads it even while it is missing).
#[tokio::test]
async fn a_backend_service_that_appears_later_is_picked_up() {
    let mut h = Harness::new();
    let sent = gateway_world(&mut h, vec![gw("10.0.0.9")], vec![route("later")]);
    assert_eq!(
        sent.gateways,
        set(&[("a/gw", &["udp/10.0.0.9:53 []", "tcp/10.0.0.9:5432 []"])])
    );
    let later: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": "later"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .expect("a Service");
    let sent = h.feed(vec![Msg::Service(Ok(Event::Apply(later)))]);
    // No endpoints yet: nothing changed, nothing sent.
    assert!(sent.gateways.is_empty(), "{sent:?}");
    let sent = h.feed(vec![Msg::Slice(Ok(Event::Apply(slice(
        "a",
        "later-1",
        "later",
        &["10.1.0.7"],
    ))))]);
    assert_eq!(
        sent.gateways,
        set(&[(
            "a/gw",
            &["udp/10.0.0.9:53 []", "tcp/10.0.0.9:5432 [10.1.0.7:8080*1]"]
        )])
    );
}

// ---------------------------------------------------------------------
// Addresses only from pools
// ---------------------------------------------------------------------

fn team_pool(name: &str, addrs: &[&str], team: &str) -> AddressPool {
    let mut p = pool(name, addrs);
    p.spec.namespace_selector =
        Some(serde_json::from_value(json!({"matchLabels": {"team": team}})).expect("a selector"));
    p
}

fn ns_event(name: &str, labels: serde_json::Value) -> Msg {
    Msg::Namespace(Ok(Event::Apply(
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}
        }))
        .expect("a Namespace"),
    )))
}

/// Whoever can write a Service's status can name any address: only one
/// an AddressPool in use admits is served. Nothing is sent before the
/// pools and namespaces are listed (a first pass without them would
/// refuse, and on a restart withdraw, every address); an address of no
/// pool is sent refused, with why (the reconciler lists it and writes
/// nothing of it); a pool that covers it, a namespace label its selector
/// asks for, each is looked at again, and a pool deleted refuses again.
#[tokio::test]
async fn only_addresses_a_pool_admits_are_served() {
    let mut h = Harness::bare();
    let mut msgs = services(vec![
        svc("a", "web", "10.0.0.1"),
        svc("a", "grab", "10.9.0.1"),
    ]);
    msgs.extend(slices(vec![]));
    msgs.extend(policies(vec![]));
    assert_eq!(h.feed(msgs), Sent::default());
    assert_eq!(
        h.feed(pools(vec![pool("p", &["10.0.0.0/24"])])),
        Sent::default(),
        "sent before the namespaces were listed"
    );
    let sent = h.feed(namespaces(&[("a", json!({}))]));
    assert!(sent.synced, "{sent:?}");
    assert_eq!(
        sent.set,
        set(&[
            ("a/web", &["tcp/10.0.0.1:80"]),
            ("a/grab", &["tcp/10.9.0.1:80"])
        ])
    );
    assert_eq!(
        sent.refused,
        BTreeMap::from([(
            "tcp/10.9.0.1:80".to_string(),
            "10.9.0.1 is in no AddressPool in use: only pool addresses are served, whoever writes Service a/grab's status (add it to a pool)".to_string()
        )])
    );
    assert_eq!(h.state.watches[Watch::AddressPools as usize].objects, 1);

    // A pool for team b's namespaces: a/grab's namespace is not one.
    let sent = h.feed(vec![Msg::Pool(Ok(Event::Apply(team_pool(
        "q",
        &["10.9.0.0/24"],
        "b",
    ))))]);
    assert_eq!(
        sent.set,
        set(&[("a/grab", &["tcp/10.9.0.1:80"])]),
        "{sent:?}"
    );
    assert_eq!(
        sent.refused.get("tcp/10.9.0.1:80").map(String::as_str),
        Some("10.9.0.1 is in AddressPool q, whose namespaceSelector does not select Service a/grab: not served")
    );
    // Namespace a becomes team b's: served.
    let sent = h.feed(vec![ns_event("a", json!({"team": "b"}))]);
    assert_eq!(
        sent.set,
        set(&[("a/grab", &["tcp/10.9.0.1:80"])]),
        "{sent:?}"
    );
    assert!(sent.refused.is_empty(), "{sent:?}");
    // A pool status written (the controller's counts) changes nothing.
    let mut counted = team_pool("q", &["10.9.0.0/24"], "b");
    counted.status = Some(
        serde_json::from_value(json!({"assigned": {"ipv4": 1, "ipv6": 0}})).expect("a pool status"),
    );
    assert_eq!(
        h.feed(vec![Msg::Pool(Ok(Event::Apply(counted.clone())))]),
        Sent::default()
    );
    // The pool deleted: refused again.
    let sent = h.feed(vec![Msg::Pool(Ok(Event::Delete(counted)))]);
    assert_eq!(sent.set, set(&[("a/grab", &["tcp/10.9.0.1:80"])]));
    assert!(
        sent.refused["tcp/10.9.0.1:80"].contains("in no AddressPool in use"),
        "{sent:?}"
    );
}

/// Without the AddressPool CRD nothing is served, and the watch says why.
#[tokio::test]
async fn without_the_pool_crd_no_address_is_served() {
    let mut h = Harness::bare();
    let mut msgs = services(vec![svc("a", "web", "10.0.0.1")]);
    msgs.extend(slices(vec![]));
    msgs.extend(policies(vec![]));
    msgs.extend(namespaces(&[]));
    msgs.push(Msg::Pool(Err(not_found())));
    let sent = h.feed(msgs);
    assert!(sent.synced);
    assert!(
        sent.refused["tcp/10.0.0.1:80"].contains("in no AddressPool in use"),
        "{sent:?}"
    );
    let w = &h.state.watches[Watch::AddressPools as usize];
    assert!(
        w.synced
            && w.last_error
                .as_deref()
                .unwrap_or("")
                .contains("not installed"),
        "{w:?}"
    );
}

/// A Gateway's address is held to the pools as a Service's is.
#[tokio::test]
async fn a_gateway_address_outside_the_pools_is_refused() {
    let mut h = Harness::new();
    let sent = gateway_world(&mut h, vec![gw("10.9.0.9")], vec![route("db")]);
    assert_eq!(sent.gateways.len(), 1, "{sent:?}");
    for k in ["tcp/10.9.0.9:5432", "udp/10.9.0.9:53"] {
        assert_eq!(
            sent.refused.get(k).map(String::as_str),
            Some("10.9.0.9 is in no AddressPool in use: only pool addresses are served, whoever writes Gateway a/gw's status (add it to a pool)"),
            "{sent:?}"
        );
    }
}
