//! One row per rule of the module documentation: a cluster that differs
//! from a base one in one way, and the lines of the resolution's summary
//! it must (and must not) produce: conditions with the reasons the Gateway
//! API specification names, attached routes, VIPs and their backends.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{json, Value};

use super::status::{gateway_class_status, gateway_status, tcp_route_status, udp_route_status};
use super::*;

/// RFC 7386 merge patch.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

fn class(name: &str, controller: &str) -> GatewayClass {
    from(json!({"metadata": {"name": name, "generation": 1},
                "spec": {"controllerName": controller}}))
}

/// Gateway infra/gw of class rivora: listener `tcp` (TCP 5432, routes
/// from All namespaces), `udp` (UDP 53, routes from namespaces labelled
/// team=a), address 203.0.113.10. `patch` is merged in.
fn gateway(patch: Value) -> Gateway {
    let mut v = json!({
        "metadata": {"name": "gw", "namespace": "infra", "generation": 4,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"gatewayClassName": "rivora", "listeners": [
            {"name": "tcp", "protocol": "TCP", "port": 5432,
             "allowedRoutes": {"namespaces": {"from": "All"}}},
            {"name": "udp", "protocol": "UDP", "port": 53,
             "allowedRoutes": {"namespaces": {"from": "Selector",
                "selector": {"matchLabels": {"team": "a"}}}}}]},
        "status": {"addresses": [{"type": "IPAddress", "value": "203.0.113.10"}]}
    });
    merge(&mut v, &patch);
    from(v)
}

fn with_listeners(ls: Value) -> Value {
    json!({"spec": {"listeners": ls}})
}

fn route_json(ns: &str, name: &str, created: &str, parents: Value, backends: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": ns, "generation": 2,
                        "creationTimestamp": created},
           "spec": {"parentRefs": parents, "rules": [{"backendRefs": backends}]}})
}

fn tcp_route(ns: &str, name: &str, created: &str, parents: Value, backends: Value) -> TcpRoute {
    from(route_json(ns, name, created, parents, backends))
}

fn udp_route(ns: &str, name: &str, created: &str, parents: Value, backends: Value) -> UdpRoute {
    from(route_json(ns, name, created, parents, backends))
}

const T1: &str = "2026-02-01T00:00:00Z";
const T2: &str = "2026-03-01T00:00:00Z";

fn service(ns: &str, name: &str, ports: Value) -> Service {
    from(json!({"metadata": {"name": name, "namespace": ns},
                "spec": {"ports": ports}}))
}

/// A slice of Service ns/svc, port `port_name` at `port`, endpoints ready
/// unless prefixed with `~` (terminating, serving).
fn slice(
    ns: &str,
    svc: &str,
    family: &str,
    port_name: &str,
    proto: &str,
    port: i32,
    eps: &[&str],
) -> EndpointSlice {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|e| match e.strip_prefix('~') {
            Some(a) => json!({"addresses": [a], "conditions": {"ready": false, "serving": true, "terminating": true}}),
            None => json!({"addresses": [e], "conditions": {"ready": true}}),
        })
        .collect();
    from(
        json!({"metadata": {"name": format!("{svc}-{family}-{port_name}"), "namespace": ns,
                             "labels": {"kubernetes.io/service-name": svc}},
                "addressType": family,
                "ports": [{"name": port_name, "protocol": proto, "port": port}],
                "endpoints": endpoints}),
    )
}

/// Every endpoint of `s` on `node`.
fn on_node(mut s: EndpointSlice, node: &str) -> EndpointSlice {
    for ep in s.endpoints.iter_mut().flatten() {
        ep.node_name = Some(node.into());
    }
    s
}

fn grant(ns: &str, from_ns: &str, kind: &str, to_name: Option<&str>) -> ReferenceGrant {
    let mut to = json!({"group": "", "kind": "Service"});
    if let Some(n) = to_name {
        to["name"] = json!(n);
    }
    from(
        json!({"metadata": {"name": format!("from-{from_ns}"), "namespace": ns},
                "spec": {"from": [{"group": GROUP, "kind": kind, "namespace": from_ns}], "to": [to]}}),
    )
}

fn ns_labels(pairs: &[(&str, &[(&str, &str)])]) -> BTreeMap<String, BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|(n, ls)| {
            (
                n.to_string(),
                ls.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        })
        .collect()
}

/// The base cluster: Rivora's class and another controller's, the
/// Gateway above, namespaces infra, team-a (team=a), team-b (team=b);
/// Service team-a/db (TCP 5432 "pg", endpoints 10.1.0.1-2 on 6432, and
/// fd00::1 on 6432), team-a/dns (UDP 53 "dns", 10.1.1.1 on 5353),
/// team-b/db2 (TCP 5432 "pg", 10.2.0.1 and 10.2.0.2 on 6432). No routes.
fn base() -> Snapshot {
    Snapshot {
        classes: vec![
            class("rivora", CONTROLLER_NAME),
            class("other", "example.com/gw"),
        ],
        gateways: vec![gateway(json!({}))],
        namespaces: ns_labels(&[
            ("infra", &[]),
            ("team-a", &[("team", "a")]),
            ("team-b", &[("team", "b")]),
        ]),
        services: vec![
            service(
                "team-a",
                "db",
                json!([{"name": "pg", "port": 5432, "protocol": "TCP"}]),
            ),
            service(
                "team-a",
                "dns",
                json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
            ),
            service("team-b", "db2", json!([{"name": "pg", "port": 5432}])),
        ],
        slices: vec![
            slice(
                "team-a",
                "db",
                "IPv4",
                "pg",
                "TCP",
                6432,
                &["10.1.0.1", "10.1.0.2"],
            ),
            slice("team-a", "db", "IPv6", "pg", "TCP", 6432, &["fd00::1"]),
            slice("team-a", "dns", "IPv4", "dns", "UDP", 5353, &["10.1.1.1"]),
            slice(
                "team-b",
                "db2",
                "IPv4",
                "pg",
                "TCP",
                6432,
                &["10.2.0.1", "10.2.0.2"],
            ),
        ],
        ..Default::default()
    }
}

/// The TCPRoute most rows use: team-a/r to listener tcp, backend db:5432.
fn db_route() -> TcpRoute {
    tcp_route(
        "team-a",
        "r",
        T1,
        json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp"}]),
        json!([{"name": "db", "port": 5432}]),
    )
}

fn c(name: &str, c: &Cond) -> String {
    format!("{name}={}", c)
}

/// The resolution as lines: classes, gateways, listeners, route parents,
/// VIPs with `addr:port*weight` backends and the policy's marks.
fn summary(res: &Resolution) -> Vec<String> {
    let mut out = Vec::new();
    for (name, r) in &res.classes {
        out.push(format!("class {name} {}", c("Accepted", &r.accepted)));
    }
    for (k, g) in &res.gateways {
        out.push(format!("gateway {k} {}", c("Accepted", &g.accepted)));
        out.push(format!("gateway {k} {}", c("Programmed", &g.programmed)));
        for l in &g.listeners {
            let kinds: Vec<&str> = l.supported_kinds.iter().map(|k| k.kind()).collect();
            out.push(format!(
                "listener {} {} {} {} {}",
                l.name,
                c("Accepted", &l.accepted),
                c("Conflicted", &l.conflicted),
                c("ResolvedRefs", &l.resolved_refs),
                c("Programmed", &l.programmed),
            ));
            out.push(format!(
                "listener {} attached={} kinds={} routes={}",
                l.name,
                l.attached_routes(),
                kinds.join(","),
                l.routes
                    .iter()
                    .map(|r| format!("{}/{}", r.namespace, r.name))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        for v in &g.vips {
            let bs: Vec<String> = v
                .vip
                .backends
                .iter()
                .map(|b| format!("{}*{}", SocketAddrText(b.addr, b.port), b.weight))
                .collect();
            let mut extra = String::new();
            if v.vip.mode != Mode::Nat {
                extra.push_str(&format!(" mode={}", v.vip.mode));
            }
            if let Some(rl) = v.vip.rate_limit {
                extra.push_str(&format!(" rl={}/{}", rl.rate_per_sec, rl.burst));
            }
            if v.health.iter().any(Option::is_some) {
                extra.push_str(" +hc");
            }
            if let Some(r) = &v.vip.source_ranges {
                let r: Vec<String> = r.iter().map(ToString::to_string).collect();
                extra.push_str(&format!(" from={}", r.join(",")));
            }
            out.push(format!("vip {} [{}]{extra}", v.vip.key(), bs.join(" ")));
        }
    }
    for (k, r) in &res.routes {
        for p in &r.parents {
            let target = match (&p.parent_ref.section_name, p.parent_ref.port) {
                (Some(s), _) => format!("{}/{s}", p.parent_ref.name),
                (None, Some(port)) => format!("{}:{port}", p.parent_ref.name),
                (None, None) => p.parent_ref.name.clone(),
            };
            out.push(format!(
                "route {k} -> {target} {} {}",
                c("Accepted", &p.accepted),
                c("ResolvedRefs", &p.resolved_refs)
            ));
        }
    }
    out
}

struct SocketAddrText(IpAddr, u16);

impl fmt::Display for SocketAddrText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        std::net::SocketAddr::new(self.0, self.1).fmt(f)
    }
}

/// A row: what it shows, how the cluster differs from [`base`], lines the
/// summary must hold (each a prefix of one of its lines), and prefixes no
/// line may start with.
struct Row {
    rule: &'static str,
    cluster: fn(&mut Snapshot),
    want: &'static [&'static str],
    not: &'static [&'static str],
}

fn check(rows: &[Row]) {
    let mut failed = Vec::new();
    for row in rows {
        let mut s = base();
        (row.cluster)(&mut s);
        let res = resolve(&s);
        let lines = summary(&res);
        for w in row.want {
            if !lines.iter().any(|l| l.starts_with(w)) {
                failed.push(format!(
                    "{}: missing {w:?}\n  got:\n    {}",
                    row.rule,
                    lines.join("\n    ")
                ));
            }
        }
        for n in row.not {
            if let Some(l) = lines.iter().find(|l| l.starts_with(n)) {
                failed.push(format!("{}: unexpected {l:?}", row.rule));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn classes_and_gateways() {
    check(&[
        Row {
            rule: "a class is Rivora's by controllerName; another controller's class and its Gateways are not",
            cluster: |s| {
                let mut g = gateway(json!({"spec": {"gatewayClassName": "other"}}));
                g.metadata.name = Some("theirs".into());
                s.gateways.push(g);
            },
            want: &[
                "class rivora Accepted=True Accepted",
                "gateway infra/gw Accepted=True Accepted",
                "gateway infra/gw Programmed=True Programmed: forwarding on 203.0.113.10",
                "vip tcp/203.0.113.10:5432 []",
                "vip udp/203.0.113.10:53 []",
            ],
            not: &["class other", "gateway infra/theirs"],
        },
        Row {
            rule: "a class with parametersRef: InvalidParameters, its Gateways not accepted and not programmed",
            cluster: |s| {
                s.classes[0].spec.parameters_ref = Some(from(json!({"group": "example.com", "kind": "Config", "name": "x"})));
            },
            want: &[
                "class rivora Accepted=False InvalidParameters",
                "gateway infra/gw Accepted=False Invalid",
                "gateway infra/gw Programmed=False Invalid",
                "listener tcp Accepted=True Accepted: the listener is valid Conflicted=False NoConflicts: no other listener shares its port ResolvedRefs=True ResolvedRefs: every route kind is supported Programmed=False Invalid",
            ],
            not: &["vip "],
        },
        Row {
            rule: "a Gateway with infrastructure.parametersRef: InvalidParameters",
            cluster: |s| {
                s.gateways[0] = gateway(json!({"spec": {"infrastructure": {"parametersRef": {"group": "", "kind": "ConfigMap", "name": "x"}}}}));
            },
            want: &["gateway infra/gw Accepted=False InvalidParameters"],
            not: &["vip "],
        },
        Row {
            rule: "a Gateway asking for a Hostname address: UnsupportedAddress",
            cluster: |s| {
                s.gateways[0] = gateway(json!({"spec": {"addresses": [{"type": "Hostname", "value": "lb.example.com"}]}}));
            },
            want: &["gateway infra/gw Accepted=False UnsupportedAddress"],
            not: &["vip "],
        },
        Row {
            rule: "no address in status yet: Programmed=False AddressNotAssigned, listeners Pending, no VIP",
            cluster: |s| {
                s.gateways[0].status = None;
            },
            want: &[
                "gateway infra/gw Accepted=True Accepted",
                "gateway infra/gw Programmed=False AddressNotAssigned",
                "listener tcp Accepted=True Accepted: the listener is valid Conflicted=False NoConflicts: no other listener shares its port ResolvedRefs=True ResolvedRefs: every route kind is supported Programmed=False Pending",
            ],
            not: &["vip "],
        },
        Row {
            rule: "addresses that cannot be VIPs (a hostname, loopback) are not used",
            cluster: |s| {
                s.gateways[0] = gateway(json!({"status": {"addresses": [
                    {"type": "Hostname", "value": "lb.example.com"}, {"value": "127.0.0.1"}]}}));
            },
            want: &["gateway infra/gw Programmed=False AddressNotAssigned: no usable address: lb.example.com, 127.0.0.1"],
            not: &["vip "],
        },
        Row {
            rule: "one VIP per (address, port, protocol): an IPv6 address gets the IPv6 endpoints",
            cluster: |s| {
                s.gateways[0] = gateway(json!({"status": {"addresses": [
                    {"type": "IPAddress", "value": "203.0.113.10"}, {"type": "IPAddress", "value": "2001:db8::10"}]}}));
                s.tcp_routes.push(db_route());
            },
            want: &[
                "vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]",
                "vip tcp/[2001:db8::10]:5432 [[fd00::1]:6432*1]",
                "vip udp/203.0.113.10:53 []",
                "vip udp/[2001:db8::10]:53 []",
            ],
            not: &[],
        },
    ]);
}

#[test]
fn listeners() {
    check(&[
        Row {
            rule: "an HTTP listener: UnsupportedProtocol, no VIP; the Gateway stays accepted with ListenersNotValid",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([
                    {"name": "tcp", "protocol": "TCP", "port": 5432},
                    {"name": "web", "protocol": "HTTP", "port": 80}])));
            },
            want: &[
                "gateway infra/gw Accepted=True ListenersNotValid: listeners not valid: web",
                "listener web Accepted=False UnsupportedProtocol: Rivora balances TCP and UDP: protocol HTTP is not supported",
                "listener web attached=0 kinds= routes=",
                "vip tcp/203.0.113.10:5432 []",
            ],
            not: &["vip tcp/203.0.113.10:80"],
        },
        Row {
            rule: "no valid listener at all: the Gateway is not accepted",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([
                    {"name": "web", "protocol": "HTTPS", "port": 443}])));
            },
            want: &["gateway infra/gw Accepted=False ListenersNotValid"],
            not: &["vip "],
        },
        Row {
            rule: "two TCP listeners on one port: both Conflicted=True ProtocolConflict, still Accepted, no VIP",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([
                    {"name": "a", "protocol": "TCP", "port": 5432},
                    {"name": "b", "protocol": "TCP", "port": 5432}])));
            },
            want: &[
                "listener a Accepted=True Accepted: the listener is valid Conflicted=True ProtocolConflict: TCP port 5432 is also listener b (TCP)'s",
                "listener b Accepted=True Accepted: the listener is valid Conflicted=True ProtocolConflict",
            ],
            not: &["vip "],
        },
        Row {
            rule: "a TCP listener on an HTTPS listener's port: both conflicted",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([
                    {"name": "tcp", "protocol": "TCP", "port": 443},
                    {"name": "web", "protocol": "HTTPS", "port": 443}])));
            },
            want: &[
                "listener tcp Accepted=True Accepted: the listener is valid Conflicted=True ProtocolConflict",
                "listener web Accepted=False UnsupportedProtocol: Rivora balances TCP and UDP: protocol HTTPS is not supported Conflicted=True ProtocolConflict",
            ],
            not: &["vip "],
        },
        Row {
            rule: "two UDP listeners on one port conflict; TCP and UDP on one port do not",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([
                    {"name": "t", "protocol": "TCP", "port": 53},
                    {"name": "u1", "protocol": "UDP", "port": 53},
                    {"name": "u2", "protocol": "UDP", "port": 53}])));
            },
            want: &[
                "listener t Accepted=True Accepted: the listener is valid Conflicted=False NoConflicts",
                "listener u1 Accepted=True Accepted: the listener is valid Conflicted=True ProtocolConflict: UDP port 53 is also listener u2 (UDP)'s",
                "vip tcp/203.0.113.10:53 []",
            ],
            not: &["vip udp/"],
        },
        Row {
            rule: "allowedRoutes.kinds naming a kind the listener cannot take: InvalidRouteKinds, supportedKinds keeps the valid ones",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([
                    {"name": "mixed", "protocol": "TCP", "port": 5432,
                     "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}, {"kind": "HTTPRoute"}]}},
                    {"name": "none", "protocol": "TCP", "port": 5433,
                     "allowedRoutes": {"kinds": [{"kind": "UDPRoute"}]}}])));
            },
            want: &[
                "listener mixed Accepted=True Accepted: the listener is valid Conflicted=False NoConflicts: no other listener shares its port ResolvedRefs=False InvalidRouteKinds: a TCP listener does not take HTTPRoute Programmed=True",
                "listener mixed attached=0 kinds=TCPRoute",
                "listener none Accepted=True Accepted: the listener is valid Conflicted=False NoConflicts: no other listener shares its port ResolvedRefs=False InvalidRouteKinds: a TCP listener does not take UDPRoute Programmed=False Invalid",
                "listener none attached=0 kinds= routes=",
                "vip tcp/203.0.113.10:5432 []",
            ],
            not: &["vip tcp/203.0.113.10:5433"],
        },
        Row {
            rule: "a younger Gateway on an older one's address and port: PortUnavailable; the older keeps it",
            cluster: |s| {
                let mut g = gateway(json!({"metadata": {"name": "late", "creationTimestamp": "2026-06-01T00:00:00Z"}}));
                g.spec.listeners.truncate(1);
                s.gateways.insert(0, g);
            },
            want: &[
                "listener tcp Accepted=False PortUnavailable: TCP port 5432 is already held on 203.0.113.10 by Gateway infra/gw listener tcp",
                "vip tcp/203.0.113.10:5432 []",
            ],
            not: &[],
        },
        Row {
            rule: "an older Gateway that is not accepted holds no port",
            cluster: |s| {
                s.gateways[0] = gateway(json!({"spec": {"infrastructure": {"parametersRef": {"group": "", "kind": "ConfigMap", "name": "x"}}}}));
                let mut g = gateway(json!({"metadata": {"name": "late", "creationTimestamp": "2026-06-01T00:00:00Z"}}));
                g.spec.listeners.truncate(1);
                s.gateways.push(g);
            },
            want: &[
                "gateway infra/gw Accepted=False InvalidParameters",
                "gateway infra/late Accepted=True Accepted",
                "listener tcp Accepted=True Accepted",
                "vip tcp/203.0.113.10:5432 []",
            ],
            not: &["listener tcp Accepted=False PortUnavailable"],
        },
    ]);
}

#[test]
fn attachment() {
    check(&[
        Row {
            rule: "sectionName selects one listener",
            cluster: |s| s.tcp_routes.push(db_route()),
            want: &[
                "listener tcp attached=1 kinds=TCPRoute routes=team-a/r",
                "listener udp attached=0 kinds=UDPRoute routes=",
                "route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=True ResolvedRefs",
                "vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]",
            ],
            not: &[],
        },
        Row {
            rule: "port selects the listeners on that port",
            cluster: |s| s.tcp_routes.push(tcp_route("team-a", "r", T1,
                json!([{"name": "gw", "namespace": "infra", "port": 5432}]), json!([{"name": "db", "port": 5432}]))),
            want: &["route TCPRoute team-a/r -> gw:5432 Accepted=True Accepted: attached to listener tcp"],
            not: &[],
        },
        Row {
            rule: "sectionName and port must both match: NoMatchingParent",
            cluster: |s| s.tcp_routes.push(tcp_route("team-a", "r", T1,
                json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp", "port": 5433}]), json!([{"name": "db", "port": 5432}]))),
            want: &[
                "route TCPRoute team-a/r -> gw/tcp Accepted=False NoMatchingParent: Gateway infra/gw has no listener named tcp on port 5433",
                "listener tcp attached=0",
                "vip tcp/203.0.113.10:5432 []",
            ],
            not: &[],
        },
        Row {
            rule: "no sectionName or port: every listener that takes the kind",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([
                    {"name": "a", "protocol": "TCP", "port": 5432, "allowedRoutes": {"namespaces": {"from": "All"}}},
                    {"name": "b", "protocol": "TCP", "port": 9092, "allowedRoutes": {"namespaces": {"from": "All"}}},
                    {"name": "u", "protocol": "UDP", "port": 53, "allowedRoutes": {"namespaces": {"from": "All"}}}])));
                s.tcp_routes.push(tcp_route("team-a", "r", T1,
                    json!([{"name": "gw", "namespace": "infra"}]), json!([{"name": "db", "port": 5432}])));
            },
            want: &[
                "route TCPRoute team-a/r -> gw Accepted=True Accepted: attached to listener a, b",
                "listener u attached=0",
                "vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]",
                "vip tcp/203.0.113.10:9092 [10.1.0.1:6432*1 10.1.0.2:6432*1]",
                "vip udp/203.0.113.10:53 []",
            ],
            not: &[],
        },
        Row {
            rule: "a TCPRoute naming a UDP listener: NotAllowedByListeners",
            cluster: |s| s.tcp_routes.push(tcp_route("team-a", "r", T1,
                json!([{"name": "gw", "namespace": "infra", "sectionName": "udp"}]), json!([{"name": "db", "port": 5432}]))),
            want: &["route TCPRoute team-a/r -> gw/udp Accepted=False NotAllowedByListeners: listener udp (UDP) does not take TCPRoutes"],
            not: &[],
        },
        Row {
            rule: "from Same (the default): a route of another namespace is NotAllowedByListeners",
            cluster: |s| {
                s.gateways[0] = gateway(with_listeners(json!([{"name": "tcp", "protocol": "TCP", "port": 5432}])));
                s.tcp_routes.push(db_route());
                s.tcp_routes.push(tcp_route("infra", "local", T2,
                    json!([{"name": "gw"}]), json!([{"name": "db", "namespace": "team-a", "port": 5432}])));
            },
            want: &[
                "route TCPRoute team-a/r -> gw/tcp Accepted=False NotAllowedByListeners: listener tcp admits routes of its own namespace infra only",
                "route TCPRoute infra/local -> gw Accepted=True Accepted",
                "listener tcp attached=1 kinds=TCPRoute routes=infra/local",
            ],
            not: &[],
        },
        Row {
            rule: "from Selector: the namespace's labels decide",
            cluster: |s| {
                s.udp_routes.push(udp_route("team-a", "dns", T1,
                    json!([{"name": "gw", "namespace": "infra", "sectionName": "udp"}]), json!([{"name": "dns", "port": 53}])));
                s.udp_routes.push(udp_route("team-b", "dns", T1,
                    json!([{"name": "gw", "namespace": "infra", "sectionName": "udp"}]), json!([{"name": "dns", "port": 53}])));
            },
            want: &[
                "route UDPRoute team-a/dns -> gw/udp Accepted=True Accepted",
                "route UDPRoute team-b/dns -> gw/udp Accepted=False NotAllowedByListeners: listener udp's namespace selector does not select namespace team-b",
                "listener udp attached=1 kinds=UDPRoute routes=team-a/dns",
                "vip udp/203.0.113.10:53 [10.1.1.1:5353*1]",
            ],
            not: &[],
        },
        Row {
            rule: "a parentRef to another controller's Gateway, or to a Service (mesh), gets no status from Rivora",
            cluster: |s| {
                let mut g = gateway(json!({"spec": {"gatewayClassName": "other"}}));
                g.metadata.name = Some("theirs".into());
                s.gateways.push(g);
                s.tcp_routes.push(tcp_route("team-a", "r", T1,
                    json!([{"name": "theirs", "namespace": "infra"}, {"group": "", "kind": "Service", "name": "db"}]),
                    json!([{"name": "db", "port": 5432}])));
            },
            want: &[],
            not: &["route "],
        },
        Row {
            rule: "several routes on one listener: the oldest gets the traffic, all are Accepted and counted",
            cluster: |s| {
                s.tcp_routes.push(tcp_route("team-b", "newer", T2,
                    json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp"}]), json!([{"name": "db2", "port": 5432}])));
                s.tcp_routes.push(db_route());
                // Same second as team-a/r: namespace/name decides.
                s.tcp_routes.push(tcp_route("team-b", "twin", T1,
                    json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp"}]), json!([{"name": "db2", "port": 5432}])));
            },
            want: &[
                "listener tcp attached=3 kinds=TCPRoute routes=team-a/r,team-b/twin,team-b/newer",
                "route TCPRoute team-b/newer -> gw/tcp Accepted=True Accepted",
                "route TCPRoute team-b/twin -> gw/tcp Accepted=True Accepted",
                "vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]",
            ],
            not: &[],
        },
    ]);
}

fn with_backends(s: &mut Snapshot, backends: Value) {
    s.tcp_routes.push(tcp_route(
        "team-a",
        "r",
        T1,
        json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp"}]),
        backends,
    ));
}

#[test]
fn backends() {
    check(&[
        Row {
            rule: "a backendRef to another kind: InvalidKind; the others still serve",
            cluster: |s| with_backends(s, json!([{"group": "example.com", "kind": "Bucket", "name": "x", "port": 1},
                                                 {"name": "db", "port": 5432}])),
            want: &[
                "route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=False InvalidKind: rules[0].backendRefs[0]: Bucket.example.com is not a kind Rivora forwards to",
                "vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]",
            ],
            not: &[],
        },
        Row {
            rule: "a missing Service: BackendNotFound; the route keeps its VIP with no backend",
            cluster: |s| with_backends(s, json!([{"name": "gone", "port": 5432}])),
            want: &[
                "route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=False BackendNotFound: rules[0].backendRefs[0]: Service team-a/gone does not exist",
                "vip tcp/203.0.113.10:5432 []",
            ],
            not: &[],
        },
        Row {
            rule: "a port the Service does not have for the route's protocol: BackendNotFound",
            cluster: |s| with_backends(s, json!([{"name": "dns", "port": 53}])),
            want: &["route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=False BackendNotFound: rules[0].backendRefs[0]: Service team-a/dns has no TCP port 53"],
            not: &[],
        },
        Row {
            rule: "no port (the schema refuses it; a stored one is still refused): BackendNotFound",
            cluster: |s| with_backends(s, json!([{"name": "db"}])),
            want: &["route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=False BackendNotFound: rules[0].backendRefs[0]: Service team-a/db has no port given"],
            not: &[],
        },
        Row {
            rule: "another namespace's Service without a ReferenceGrant: RefNotPermitted, not forwarded to",
            cluster: |s| with_backends(s, json!([{"name": "db", "port": 5432}, {"name": "db2", "namespace": "team-b", "port": 5432}])),
            want: &[
                "route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=False RefNotPermitted: rules[0].backendRefs[1]: Service team-b/db2 is in another namespace and no ReferenceGrant in team-b admits TCPRoutes from team-a",
                "vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]",
            ],
            not: &[],
        },
        Row {
            rule: "a ReferenceGrant for another kind, or another Service, does not admit it",
            cluster: |s| {
                with_backends(s, json!([{"name": "db2", "namespace": "team-b", "port": 5432}]));
                s.grants.push(grant("team-b", "team-a", "UDPRoute", None));
                s.grants.push(grant("team-b", "team-a", "TCPRoute", Some("other")));
                s.grants.push(grant("team-a", "team-a", "TCPRoute", None));
            },
            want: &["route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=False RefNotPermitted"],
            not: &[],
        },
        Row {
            rule: "with a ReferenceGrant in the target namespace: resolved; weights 1:3 across Services of 2 endpoints each",
            cluster: |s| {
                with_backends(s, json!([{"name": "db", "port": 5432, "weight": 1},
                                        {"name": "db2", "namespace": "team-b", "port": 5432, "weight": 3}]));
                s.grants.push(grant("team-b", "team-a", "TCPRoute", Some("db2")));
            },
            want: &[
                "route TCPRoute team-a/r -> gw/tcp Accepted=True Accepted: attached to listener tcp ResolvedRefs=True ResolvedRefs",
                "vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1 10.2.0.1:6432*3 10.2.0.2:6432*3]",
            ],
            not: &[],
        },
        Row {
            rule: "weights are per Service, spread over its ready endpoints: 1 endpoint at 1, 2 at 3 make 2:3:3",
            cluster: |s| {
                with_backends(s, json!([{"name": "db", "port": 5432, "weight": 1},
                                        {"name": "db2", "namespace": "team-b", "port": 5432, "weight": 3}]));
                s.grants.push(grant("team-b", "team-a", "TCPRoute", None));
                s.slices[0] = slice("team-a", "db", "IPv4", "pg", "TCP", 6432, &["10.1.0.1", "~10.1.0.2"]);
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*2 10.1.0.2:6432*0 10.2.0.1:6432*3 10.2.0.2:6432*3]"],
            not: &[],
        },
        Row {
            rule: "weight 0: its endpoints take no new flows",
            cluster: |s| with_backends(s, json!([{"name": "db", "port": 5432, "weight": 0}])),
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*0 10.1.0.2:6432*0]"],
            not: &[],
        },
        Row {
            rule: "every rule's backends are one weighted set; an endpoint behind two refs takes both shares",
            cluster: |s| {
                let mut r = db_route();
                r.spec.rules.push(from(json!({"backendRefs": [{"name": "db", "port": 5432, "weight": 2}]})));
                s.tcp_routes.push(r);
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]"],
            not: &[],
        },
    ]);
}

#[test]
fn service_policy_on_a_listener() {
    check(&[
        Row {
            rule: "a ServicePolicy naming a listener sets its VIPs' mode, rate limit and health check (the other listener's untouched)",
            cluster: |s| {
                s.tcp_routes.push(tcp_route("team-a", "r", T1,
                    json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp"}]), json!([{"name": "db", "port": 5432}])));
                s.slices[0] =
                    on_node(slice("team-a", "db", "IPv4", "pg", "TCP", 5432, &["10.1.0.1"]), "node-b");
                s.policies.push(from(json!({
                    "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
                    "metadata": {"name": "p", "namespace": "infra"},
                    "spec": {"listeners": [{"gateway": "gw", "listener": "tcp"}], "mode": "dsr",
                             "synRateLimit": {"ratePerSec": 100, "burst": 10},
                             "healthCheck": {"type": "tcp"}}})));
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:5432*1] mode=dsr rl=100/10 +hc", "vip udp/203.0.113.10:53 []"],
            not: &["vip udp/203.0.113.10:53 [] mode"],
        },
        Row {
            rule: "a ServicePolicy's source ranges restrict the listener's VIPs, even when the rest of it is not applied",
            cluster: |s| {
                s.tcp_routes.push(db_route());
                s.policies.push(from(json!({
                    "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
                    "metadata": {"name": "p", "namespace": "infra"},
                    "spec": {"listeners": [{"gateway": "gw", "listener": "tcp"}], "mode": "dsr",
                             "sourceRanges": ["192.0.2.0/24", "fd00::/64"]}})));
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1] from=192.0.2.0/24,fd00::/64", "vip udp/203.0.113.10:53 []"],
            not: &["vip udp/203.0.113.10:53 [] from"],
        },
        Row {
            rule: "DSR across nodes: the backends may listen on another port (their node NATs)",
            cluster: |s| {
                s.tcp_routes.push(db_route());
                for sl in &mut s.slices {
                    *sl = on_node(sl.clone(), "node-b");
                }
                s.policies.push(from(json!({
                    "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
                    "metadata": {"name": "p", "namespace": "infra"},
                    "spec": {"listeners": [{"gateway": "gw", "listener": "tcp"}], "mode": "dsr"}})));
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1] mode=dsr"],
            not: &[],
        },
        Row {
            rule: "preserveClientIP: DSR across nodes, said by the VIP's mode",
            cluster: |s| {
                s.tcp_routes.push(db_route());
                for sl in &mut s.slices {
                    *sl = on_node(sl.clone(), "node-b");
                }
                s.policies.push(from(json!({
                    "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
                    "metadata": {"name": "p", "namespace": "infra"},
                    "spec": {"listeners": [{"gateway": "gw", "listener": "tcp"}], "preserveClientIP": true}})));
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1] mode=l3dsr"],
            not: &[],
        },
        Row {
            rule: "preserveClientIP with an endpoint on no known node is not applied",
            cluster: |s| {
                s.tcp_routes.push(db_route());
                s.policies.push(from(json!({
                    "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
                    "metadata": {"name": "p", "namespace": "infra"},
                    "spec": {"listeners": [{"gateway": "gw", "listener": "tcp"}], "preserveClientIP": true}})));
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]"],
            not: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1] mode"],
        },
        Row {
            rule: "a DSR policy on a listener whose endpoints are on no known node and on another port is not applied",
            cluster: |s| {
                s.tcp_routes.push(db_route());
                s.policies.push(from(json!({
                    "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
                    "metadata": {"name": "p", "namespace": "infra"},
                    "spec": {"listeners": [{"gateway": "gw", "listener": "tcp"}], "mode": "dsr"}})));
            },
            want: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1]"],
            not: &["vip tcp/203.0.113.10:5432 [10.1.0.1:6432*1 10.1.0.2:6432*1] mode"],
        },
    ]);
    // And the rejection says why, for the policy's condition.
    let mut s = base();
    s.tcp_routes.push(db_route());
    s.policies.push(from(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "ServicePolicy",
        "metadata": {"name": "p", "namespace": "infra"},
        "spec": {"listeners": [{"gateway": "gw", "listener": "tcp"}], "mode": "dsr"}})));
    let res = resolve(&s);
    let l = &res.gateways[&ObjectRef::new("infra", "gw")].listeners[0];
    match &l.policy {
        PolicyUse::Rejected(i) => {
            assert_eq!(i.reason, REASON_MODE_NOT_APPLICABLE);
            assert!(
                i.message
                    .contains("keeps the destination port for an endpoint on no known node, but Gateway infra/gw listener tcp (port 5432) sends to 10.1.0.1 port 6432"),
                "{i}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(l.policy_ref, Some(ObjectRef::new("infra", "p")));
}

#[test]
fn input_order_does_not_matter() {
    let mut a = base();
    a.tcp_routes.push(db_route());
    a.tcp_routes.push(tcp_route(
        "team-b",
        "late",
        T2,
        json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp"}]),
        json!([{"name": "db2", "port": 5432}]),
    ));
    let mut b = a.clone();
    b.tcp_routes.reverse();
    b.slices.reverse();
    b.services.reverse();
    b.classes.reverse();
    assert_eq!(resolve(&a), resolve(&b));
}

// ---------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------

fn at(t: &str) -> Time {
    from(json!(t))
}

fn conds(cs: &[Condition]) -> Vec<String> {
    cs.iter()
        .map(|c| {
            format!(
                "{}={} {} g{}",
                c.type_,
                c.status,
                c.reason,
                c.observed_generation.unwrap_or(-1)
            )
        })
        .collect()
}

/// The whole Gateway status, field by field; written back, the status
/// already says it (None), and a later change keeps the transition times
/// of the conditions whose status held.
#[test]
fn gateway_and_class_status_and_write_only_on_change() {
    let mut s = base();
    s.tcp_routes.push(db_route());
    s.tcp_routes.push(tcp_route(
        "team-b",
        "late",
        T2,
        json!([{"name": "gw", "namespace": "infra", "sectionName": "tcp"}]),
        json!([{"name": "db2", "port": 5432}]),
    ));
    let res = resolve(&s);
    let t0 = at("2026-04-01T00:00:00Z");
    let st = gateway_status(&s.gateways[0], &res, &t0).expect("a first status");
    assert_eq!(
        st.addresses,
        s.gateways[0]
            .status
            .as_ref()
            .and_then(|s| s.addresses.clone()),
        "addresses kept"
    );
    assert_eq!(
        conds(st.conditions.as_deref().unwrap_or_default()),
        ["Accepted=True Accepted g4", "Programmed=True Programmed g4"]
    );
    let ls = st.listeners.as_deref().unwrap_or_default();
    assert_eq!(ls.len(), 2);
    assert_eq!((ls[0].name.as_str(), ls[0].attached_routes), ("tcp", 2));
    assert_eq!(
        ls[0]
            .supported_kinds
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|k| (k.group.as_deref().unwrap_or_default(), k.kind.as_str()))
            .collect::<Vec<_>>(),
        [(GROUP, "TCPRoute")]
    );
    assert_eq!(
        conds(&ls[0].conditions),
        [
            "Accepted=True Accepted g4",
            "Conflicted=False NoConflicts g4",
            "ResolvedRefs=True ResolvedRefs g4",
            "Programmed=True Programmed g4"
        ]
    );
    assert_eq!((ls[1].name.as_str(), ls[1].attached_routes), ("udp", 0));
    assert!(ls[0]
        .conditions
        .iter()
        .all(|c| c.last_transition_time == t0));

    // Written: nothing more to write.
    let mut gw = s.gateways[0].clone();
    gw.status = Some(st.clone());
    assert_eq!(
        gateway_status(&gw, &resolve(&s), &at("2026-04-02T00:00:00Z")),
        None
    );

    // A condition of another controller's type is kept in place.
    let mut foreign = st.clone();
    let mut extra = foreign.conditions.clone().unwrap_or_default();
    extra.insert(
        0,
        Condition {
            type_: "example.com/Audited".into(),
            status: "True".into(),
            reason: "Seen".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: t0.clone(),
        },
    );
    foreign.conditions = Some(extra);
    gw.status = Some(foreign.clone());
    assert_eq!(
        gateway_status(&gw, &resolve(&s), &at("2026-04-02T00:00:00Z")),
        None
    );

    // The address goes: Programmed flips (new transition time), Accepted
    // holds (its time kept), the foreign condition stays first.
    let mut gw2 = gw.clone();
    gw2.status.as_mut().expect("status").addresses = Some(Vec::new());
    s.gateways[0] = gw2.clone();
    let t1 = at("2026-04-03T00:00:00Z");
    let st2 = gateway_status(&gw2, &resolve(&s), &t1).expect("a change");
    let cs = st2.conditions.as_deref().unwrap_or_default();
    assert_eq!(
        conds(cs),
        [
            "example.com/Audited=True Seen g1",
            "Accepted=True Accepted g4",
            "Programmed=False AddressNotAssigned g4"
        ]
    );
    assert_eq!(cs[1].last_transition_time, t0);
    assert_eq!(cs[2].last_transition_time, t1);
    let l0 = &st2.listeners.as_deref().unwrap_or_default()[0];
    assert_eq!(conds(&l0.conditions)[3], "Programmed=False Pending g4");

    // A copy older than what the status was written for: write nothing.
    let mut old = gw2.clone();
    old.metadata.generation = Some(3);
    assert_eq!(gateway_status(&old, &resolve(&s), &t1), None);

    // Not Rivora's: nothing.
    let mut theirs = gw2.clone();
    theirs.spec.gateway_class_name = "other".into();
    s.gateways[0] = theirs.clone();
    assert_eq!(gateway_status(&theirs, &resolve(&s), &t1), None);

    // The class.
    let s = base();
    let res = resolve(&s);
    let cst = gateway_class_status(&s.classes[0], &res, &t0).expect("class status");
    assert_eq!(
        conds(cst.conditions.as_deref().unwrap_or_default()),
        ["Accepted=True Accepted g1"]
    );
    assert_eq!(
        cst.supported_features
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["Gateway", "ReferenceGrant", "TCPRoute", "UDPRoute"]
    );
    let mut c0 = s.classes[0].clone();
    c0.status = Some(cst);
    assert_eq!(gateway_class_status(&c0, &res, &t0), None);
    assert_eq!(
        gateway_class_status(&s.classes[1], &res, &t0),
        None,
        "another controller's class"
    );
}

/// Route parents: one entry per parentRef to a Rivora Gateway with the
/// route's generation; another controller's entry kept in its place;
/// Rivora's entry for a parent no longer Rivora's removed.
#[test]
fn route_status_parents() {
    let mut s = base();
    let mut r = tcp_route(
        "team-a",
        "r",
        T1,
        json!([{"group": GROUP, "kind": "Gateway", "name": "gw", "namespace": "infra", "sectionName": "tcp"},
               {"group": GROUP, "kind": "Gateway", "name": "gw", "namespace": "infra", "sectionName": "udp"},
               {"group": GROUP, "kind": "Gateway", "name": "theirs", "namespace": "infra"}]),
        json!([{"name": "db", "port": 5432}, {"name": "db2", "namespace": "team-b", "port": 5432}]),
    );
    r.status = Some(from(json!({"parents": [
        {"controllerName": "example.com/gw", "parentRef": {"name": "theirs", "namespace": "infra"},
         "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        {"controllerName": CONTROLLER_NAME, "parentRef": {"name": "gone", "namespace": "infra"},
         "conditions": []}]})));
    s.tcp_routes.push(r.clone());
    let t0 = at("2026-04-01T00:00:00Z");
    let st = tcp_route_status(&r, &resolve(&s), &t0).expect("a status");
    let show: Vec<String> = st
        .parents
        .iter()
        .map(|p| {
            format!(
                "{} {}/{} {:?}",
                p.controller_name,
                p.parent_ref.name,
                p.parent_ref.section_name.as_deref().unwrap_or("-"),
                conds(&p.conditions)
            )
        })
        .collect();
    assert_eq!(
        show,
        [
            r#"example.com/gw theirs/- ["Accepted=True Accepted g-1"]"#.to_string(),
            format!(
                r#"{CONTROLLER_NAME} gw/tcp ["Accepted=True Accepted g2", "ResolvedRefs=False RefNotPermitted g2"]"#
            ),
            format!(
                r#"{CONTROLLER_NAME} gw/udp ["Accepted=False NotAllowedByListeners g2", "ResolvedRefs=False RefNotPermitted g2"]"#
            ),
        ]
    );
    // The parentRef is echoed as written.
    assert_eq!(st.parents[1].parent_ref.group.as_deref(), Some(GROUP));
    assert_eq!(st.parents[1].parent_ref.kind.as_deref(), Some("Gateway"));
    // Written back: nothing to write.
    r.status = Some(st.clone());
    s.tcp_routes[0] = r.clone();
    assert_eq!(tcp_route_status(&r, &resolve(&s), &t0), None);
    // A ReferenceGrant appears: ResolvedRefs flips in place, Accepted's
    // time is kept.
    s.grants.push(grant("team-b", "team-a", "TCPRoute", None));
    let t1 = at("2026-04-02T00:00:00Z");
    let st2 = tcp_route_status(&r, &resolve(&s), &t1).expect("a change");
    assert_eq!(
        conds(&st2.parents[1].conditions),
        [
            "Accepted=True Accepted g2",
            "ResolvedRefs=True ResolvedRefs g2"
        ]
    );
    assert_eq!(st2.parents[1].conditions[0].last_transition_time, t0);
    assert_eq!(st2.parents[1].conditions[1].last_transition_time, t1);
    // The route leaves Rivora's Gateways: Rivora's entries go, the other
    // controller's stays.
    r.status = Some(st2);
    r.spec.parent_refs = Some(vec![from(json!({"name": "theirs", "namespace": "infra"}))]);
    s.tcp_routes[0] = r.clone();
    let st3 = tcp_route_status(&r, &resolve(&s), &t1).expect("a change");
    assert_eq!(st3.parents.len(), 1);
    assert_eq!(st3.parents[0].controller_name, "example.com/gw");

    // UDP routes the same way.
    let mut s = base();
    let u = udp_route(
        "team-a",
        "dns",
        T1,
        json!([{"name": "gw", "namespace": "infra", "sectionName": "udp"}]),
        json!([{"name": "dns", "port": 53}]),
    );
    s.udp_routes.push(u.clone());
    let st = udp_route_status(&u, &resolve(&s), &t0).expect("a status");
    assert_eq!(
        conds(&st.parents[0].conditions),
        [
            "Accepted=True Accepted g2",
            "ResolvedRefs=True ResolvedRefs g2"
        ]
    );
    // A route that never named a Rivora Gateway and has no status: nothing.
    let other = udp_route("team-a", "x", T1, json!([{"name": "nope"}]), json!([]));
    assert_eq!(udp_route_status(&other, &resolve(&s), &t0), None);
}

// ---------------------------------------------------------------------
// The checked-in CRDs and types
// ---------------------------------------------------------------------

/// `helm/gateway-api-crds/` holds, per channel, the five CRDs of the
/// pinned release (the annotations upstream stamps say which), and the
/// version each generated type speaks is one the experimental CRD serves.
/// Whether they are still byte for byte the release's is
/// `scripts/gateway-api.sh --check` (it needs the module proxy).
#[test]
fn checked_in_gateway_api_crds_are_the_pinned_release() {
    use kube::Resource;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../helm/gateway-api-crds");
    let mut served: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for channel in ["standard", "experimental"] {
        let mut kinds = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(dir.join(channel))
            .unwrap_or_else(|e| panic!("reading {channel}: {e}"))
            .map(|e| e.expect("an entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let text = std::fs::read_to_string(&p).expect("a CRD file");
            let v: Value =
                serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let ann = &v["metadata"]["annotations"];
            assert_eq!(
                ann["gateway.networking.k8s.io/bundle-version"],
                api::BUNDLE_VERSION,
                "{}",
                p.display()
            );
            assert_eq!(
                ann["gateway.networking.k8s.io/channel"],
                channel,
                "{}",
                p.display()
            );
            let kind = v["spec"]["names"]["kind"]
                .as_str()
                .expect("a kind")
                .to_string();
            if channel == "experimental" {
                let versions = v["spec"]["versions"]
                    .as_array()
                    .expect("versions")
                    .iter()
                    .filter(|x| x["served"] == true)
                    .map(|x| x["name"].as_str().unwrap_or_default().to_string())
                    .collect();
                served.insert(kind.clone(), versions);
            }
            kinds.push(kind);
        }
        kinds.sort();
        assert_eq!(
            kinds,
            [
                "Gateway",
                "GatewayClass",
                "ReferenceGrant",
                "TCPRoute",
                "UDPRoute"
            ],
            "{channel}"
        );
    }
    for (kind, version) in [
        (GatewayClass::kind(&()), GatewayClass::version(&())),
        (Gateway::kind(&()), Gateway::version(&())),
        (ReferenceGrant::kind(&()), ReferenceGrant::version(&())),
        (TcpRoute::kind(&()), TcpRoute::version(&())),
        (UdpRoute::kind(&()), UdpRoute::version(&())),
    ] {
        assert!(
            served[kind.as_ref()].iter().any(|v| *v == version),
            "the {kind} type speaks {version}, which the CRD does not serve: {:?}",
            served[kind.as_ref()]
        );
    }
}

mod props;
