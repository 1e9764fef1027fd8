use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::policy::{ServicePolicySpec, REASON_INVALID_SELECTOR};

/// RFC 7386 merge patch: rows say only how they differ from the base.
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

fn service(patch: Value) -> Service {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        // As rivora-controller writes it: the address and its condition.
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]},
                   "conditions": [{"type": "rivora.io/AddressAssigned", "status": "True",
                                   "reason": "Assigned", "message": "assigned",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    });
    merge(&mut v, &patch);
    serde_json::from_value(v).expect("a Service")
}

fn slice(patch: Value) -> EndpointSlice {
    let mut v = json!({
        "metadata": {"name": "web-a", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": []
    });
    merge(&mut v, &patch);
    serde_json::from_value(v).expect("an EndpointSlice")
}

/// A ready endpoint on node-a.
fn ep(addr: &str) -> Value {
    json!({"addresses": [addr], "conditions": {"ready": true, "serving": true, "terminating": false},
           "nodeName": "node-a", "zone": "zone-1"})
}

fn ep_with(addr: &str, patch: Value) -> Value {
    let mut v = ep(addr);
    merge(&mut v, &patch);
    v
}

fn policy(spec: Value) -> ServicePolicy {
    let spec: ServicePolicySpec = serde_json::from_value(spec).expect("a ServicePolicySpec");
    let mut p = ServicePolicy::new("pol", spec);
    p.metadata.namespace = Some("shop".into());
    p
}

/// One line per VIP: key, mode, affinity, rate limit, backends with
/// weights (and their own mode, when not the VIP's), `+hc` when probed.
fn summary(t: &Translation) -> Vec<String> {
    t.vips
        .iter()
        .map(|d| {
            let v = &d.vip;
            let aff = match v.affinity {
                Affinity::None => "none".to_string(),
                Affinity::ClientIp { timeout_s } => format!("clientIP/{timeout_s}"),
            };
            let rl = v.rate_limit.map_or("-".to_string(), |r| {
                format!("{}/{}", r.rate_per_sec, r.burst)
            });
            let bs = v
                .backends
                .iter()
                .map(|b| {
                    let mut s = match b.mode {
                        Some(m) => format!("{} w{} via {m}", b.target(), b.weight),
                        None => format!("{} w{}", b.target(), b.weight),
                    };
                    // Where DSR across nodes sends each one.
                    if let (Mode::L3Dsr, Some(n)) = (b.mode_in(v.mode), &b.node) {
                        s.push_str(&format!(" @{n}"));
                    }
                    s
                })
                .collect::<Vec<_>>()
                .join(", ");
            let hc = if d.health.iter().any(Option::is_some) {
                " +hc"
            } else {
                ""
            };
            format!("{} {} {aff} rl={rl} [{bs}]{hc}", v.key(), v.mode)
        })
        .collect()
}

struct Row {
    what: &'static str,
    svc: Service,
    slices: Vec<EndpointSlice>,
    policy: Option<ServicePolicy>,
    opts: TranslateOptions,
    want: Vec<&'static str>,
    warnings: Vec<&'static str>,
    policy_use: &'static str,
}

fn row(
    what: &'static str,
    svc: Service,
    slices: Vec<EndpointSlice>,
    want: Vec<&'static str>,
) -> Row {
    Row {
        what,
        svc,
        slices,
        policy: None,
        opts: TranslateOptions::default(),
        want,
        warnings: vec![],
        policy_use: "none",
    }
}

fn two_ready() -> Vec<EndpointSlice> {
    vec![slice(
        json!({"endpoints": [ep("10.1.0.1"), ep("10.1.0.2")]}),
    )]
}

#[test]
fn every_rule() {
    let rows = vec![
        row("a ClusterIP Service is not ours", service(json!({"spec": {"type": "ClusterIP"}})), two_ready(), vec![]),
        row(
            "another load balancer's class is not ours",
            service(json!({"spec": {"loadBalancerClass": "example.com/lb"}})),
            two_ready(),
            vec![],
        ),
        Row {
            opts: TranslateOptions { accept_unset_class: false, ..Default::default() },
            ..row("no class, when unset classes are refused", service(json!({})), two_ready(), vec![])
        },
        Row {
            opts: TranslateOptions { accept_unset_class: false, ..Default::default() },
            ..row(
                "Rivora's class",
                service(json!({"spec": {"loadBalancerClass": "rivora.io/lb"}})),
                two_ready(),
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
            )
        },
        row(
            "no class, and addresses another load balancer wrote (no condition of Rivora's): not ours",
            service(json!({"status": {"conditions": null}})),
            two_ready(),
            vec![],
        ),
        row(
            "no ingress address yet: nothing to program",
            service(json!({"status": {"loadBalancer": {"ingress": null}}})),
            two_ready(),
            vec![],
        ),
        row(
            "ready endpoints are backends on the endpoint port",
            service(json!({})),
            two_ready(),
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
        ),
        row(
            "one VIP per ingress address, port and protocol",
            service(json!({
                "spec": {"ports": [{"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                                   {"name": "dns-udp", "port": 53, "protocol": "UDP"}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}, {"ip": "203.0.113.11"}, {"hostname": "lb.example"}]}}
            })),
            vec![slice(json!({
                "ports": [{"name": "dns-tcp", "port": 5353, "protocol": "TCP"},
                          {"name": "dns-udp", "port": 5354, "protocol": "UDP"}],
                "endpoints": [ep("10.1.0.1")]
            }))],
            vec![
                "tcp/203.0.113.10:53 nat none rl=- [10.1.0.1:5353 w1]",
                "tcp/203.0.113.11:53 nat none rl=- [10.1.0.1:5353 w1]",
                "udp/203.0.113.10:53 nat none rl=- [10.1.0.1:5354 w1]",
                "udp/203.0.113.11:53 nat none rl=- [10.1.0.1:5354 w1]",
            ],
        ),
        Row {
            warnings: vec![WARN_UNSUPPORTED_PROTOCOL],
            ..row(
                "SCTP: a warning and nothing for that port, the others still served",
                service(json!({"spec": {"ports": [{"name": "sig", "port": 2905, "protocol": "SCTP"},
                                                   {"name": "http", "port": 80}]}})),
                two_ready(),
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
            )
        },
        row(
            "dual stack: a VIP per family, each with its own family's endpoints",
            service(json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}, {"ip": "2001:db8::10"}]}}})),
            vec![
                slice(json!({"endpoints": [ep("10.1.0.1")]})),
                slice(json!({"metadata": {"name": "web-b"}, "addressType": "IPv6", "endpoints": [ep("fd00::1")]})),
                // An IPv6 address in an IPv4 slice is not an IPv4 backend.
                slice(json!({"metadata": {"name": "web-c"}, "endpoints": [ep("fd00::2")]})),
                slice(json!({"metadata": {"name": "web-d"}, "addressType": "FQDN", "endpoints": [ep("db.example")]})),
            ],
            vec![
                "tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1]",
                "tcp/[2001:db8::10]:80 nat none rl=- [[fd00::1]:8080 w1]",
            ],
        ),
        row(
            "ports match by name and protocol; the backend port is the slice's",
            service(json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": "web"}]}})),
            vec![
                slice(json!({"ports": [{"name": "metrics", "port": 9090, "protocol": "TCP"},
                                       {"name": "http", "port": 8081, "protocol": "TCP"}],
                             "endpoints": [ep("10.1.0.1")]})),
                // Same name, other protocol: not this port.
                slice(json!({"metadata": {"name": "web-b"},
                             "ports": [{"name": "http", "port": 8082, "protocol": "UDP"}],
                             "endpoints": [ep("10.1.0.2")]})),
            ],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8081 w1]"],
        ),
        row(
            "an unnamed Service port matches the unnamed slice port",
            service(json!({"spec": {"ports": [{"port": 80}]}})),
            vec![slice(json!({"ports": [{"port": 8080}], "endpoints": [ep("10.1.0.1")]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1]"],
        ),
        row(
            "terminating but serving drains (weight 0); not serving or not ready is left out; no conditions is ready",
            service(json!({})),
            vec![slice(json!({"endpoints": [
                ep_with("10.1.0.1", json!({"conditions": {"ready": false, "serving": true, "terminating": true}})),
                ep_with("10.1.0.2", json!({"conditions": {"ready": false, "serving": false, "terminating": true}})),
                ep_with("10.1.0.3", json!({"conditions": {"ready": false, "serving": false, "terminating": false}})),
                ep_with("10.1.0.4", json!({"conditions": null})),
                // publishNotReadyAddresses: ready overrides terminating.
                ep_with("10.1.0.5", json!({"conditions": {"ready": true, "terminating": true}})),
                // serving unset on a terminating endpoint: not known to serve.
                ep_with("10.1.0.6", json!({"conditions": {"ready": false, "serving": null, "terminating": true}})),
            ]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w0, 10.1.0.4:8080 w1, 10.1.0.5:8080 w1]"],
        ),
        row(
            "no endpoint ready: the terminating-but-serving ones take new flows (KEP-1669)",
            service(json!({})),
            vec![slice(json!({"endpoints": [
                ep_with("10.1.0.1", json!({"conditions": {"ready": false, "serving": true, "terminating": true}})),
                ep_with("10.1.0.2", json!({"conditions": {"ready": false, "serving": true, "terminating": true}})),
                ep_with("10.1.0.3", json!({"conditions": {"ready": false, "serving": false, "terminating": true}})),
            ]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
        ),
        row(
            "Local: no endpoint of this node ready, its terminating-but-serving one takes new flows though another node's is ready",
            service(json!({"spec": {"externalTrafficPolicy": "Local"}})),
            vec![slice(json!({"endpoints": [
                ep_with("10.1.0.1", json!({"conditions": {"ready": false, "serving": true, "terminating": true}})),
                ep_with("10.1.0.2", json!({"nodeName": "node-b"})),
            ]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1]"],
        ),
        row(
            "no usable endpoint: the VIP stays, with no backend",
            service(json!({})),
            vec![slice(json!({"endpoints": [ep_with("10.1.0.1", json!({"conditions": {"ready": false}}))]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- []"],
        ),
        row(
            "no slice at all: the VIP stays, with no backend",
            service(json!({})),
            vec![],
            vec!["tcp/203.0.113.10:80 nat none rl=- []"],
        ),
        row(
            "externalTrafficPolicy Local: only this node's endpoints",
            service(json!({"spec": {"externalTrafficPolicy": "Local"}})),
            vec![slice(json!({"endpoints": [
                ep("10.1.0.1"),
                ep_with("10.1.0.2", json!({"nodeName": "node-b"})),
                ep_with("10.1.0.3", json!({"nodeName": null})),
            ]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1]"],
        ),
        row(
            "externalTrafficPolicy Cluster: every node's endpoints, another node's (or no node's) by full NAT",
            service(json!({"spec": {"externalTrafficPolicy": "Cluster"}})),
            vec![slice(json!({"endpoints": [
                ep("10.1.0.1"),
                ep_with("10.1.0.2", json!({"nodeName": "node-b"})),
                ep_with("10.1.0.3", json!({"nodeName": null})),
            ]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1 via fullnat, 10.1.0.3:8080 w1 via fullnat]"],
        ),
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "fullnat"}))),
            policy_use: "applied",
            ..row(
                "policy fullnat: every endpoint by full NAT, this node's too",
                service(json!({})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.2", json!({"nodeName": "node-b"}))]}))],
                vec!["tcp/203.0.113.10:80 fullnat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
            )
        },
        row(
            "sessionAffinity ClientIP with timeoutSeconds",
            service(json!({"spec": {"sessionAffinity": "ClientIP",
                                    "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}})),
            two_ready(),
            vec!["tcp/203.0.113.10:80 nat clientIP/60 rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
        ),
        row(
            "sessionAffinity ClientIP without a timeout: Kubernetes' 10800",
            service(json!({"spec": {"sessionAffinity": "ClientIP"}})),
            two_ready(),
            vec!["tcp/203.0.113.10:80 nat clientIP/10800 rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
        ),
        row(
            "slices of another Service or namespace are not this Service's",
            service(json!({})),
            vec![
                slice(json!({"endpoints": [ep("10.1.0.1")]})),
                slice(json!({"metadata": {"name": "api-a", "labels": {"kubernetes.io/service-name": "api"}},
                             "endpoints": [ep("10.1.0.2")]})),
                slice(json!({"metadata": {"namespace": "other"}, "endpoints": [ep("10.1.0.3")]})),
                slice(json!({"metadata": {"name": "x", "labels": null}, "endpoints": [ep("10.1.0.4")]})),
            ],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1]"],
        ),
        row(
            "an endpoint in two slices is one backend, ready if either copy is",
            service(json!({})),
            vec![
                slice(json!({"endpoints": [ep_with("10.1.0.1", json!({"conditions": {"ready": false, "serving": true, "terminating": true}}))]})),
                slice(json!({"metadata": {"name": "web-b"}, "endpoints": [ep("10.1.0.1")]})),
            ],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1]"],
        ),
        row(
            "endpoint addresses no packet can go to are left out",
            service(json!({})),
            vec![slice(json!({"endpoints": [
                ep("10.1.0.1"), ep("0.0.0.0"), ep("224.0.0.1"), ep("255.255.255.255"),
                ep("203.0.113.10"), ep("not-an-ip"), {"addresses": []}
            ]}))],
            vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1]"],
        ),
        Row {
            warnings: vec![WARN_INVALID_ADDRESS],
            ..row(
                "ingress addresses that cannot be VIPs are warned about, the others served",
                service(json!({"status": {"loadBalancer": {"ingress": [
                    {"ip": "not-an-ip"}, {"ip": "127.0.0.1"}, {"ip": "::ffff:203.0.113.10"},
                    {"ip": "203.0.113.10"}, {"ip": "203.0.113.10"}
                ]}}})),
                two_ready(),
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "dsr"}))),
            policy_use: "applied",
            ..row(
                "policy dsr: DSR across nodes, this node's endpoints by NAT, another node's by the tunnel to it, which NATs (the port may change)",
                service(json!({})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.2", json!({"nodeName": "node-b"}))]}))],
                vec!["tcp/203.0.113.10:80 dsr none rl=- [10.1.0.1:8080 w1 via nat, 10.1.0.2:8080 w1 via l3dsr @node-b]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "dsr"}))),
            policy_use: "applied",
            ..row(
                "policy dsr: an endpoint on no known node (a host named by hand) holds the VIP: DSR to it, the port kept",
                service(json!({})),
                vec![slice(json!({"ports": [{"name": "http", "port": 80}], "endpoints": [ep_with("10.1.0.1", json!({"nodeName": null}))]}))],
                vec!["tcp/203.0.113.10:80 dsr none rl=- [10.1.0.1:80 w1]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "l3dsr",
                                       "synRateLimit": {"ratePerSec": 100, "burst": 10}}))),
            policy_use: "applied",
            ..row(
                "policy l3dsr: the same, with every endpoint on another node",
                service(json!({})),
                vec![slice(json!({"endpoints": [
                    ep_with("10.1.0.1", json!({"nodeName": "node-b"})),
                    ep_with("10.1.0.2", json!({"nodeName": "node-c"})),
                ]}))],
                vec!["tcp/203.0.113.10:80 l3dsr none rl=100/10 [10.1.0.1:8080 w1 @node-b, 10.1.0.2:8080 w1 @node-c]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "dsr",
                                       "synRateLimit": {"ratePerSec": 100, "burst": 10}}))),
            policy_use: "rejected:ModeNotApplicable",
            warnings: vec![WARN_INVALID_POLICY],
            ..row(
                "policy dsr: an endpoint on no known node cannot remap the port (DSR keeps it): not applied at all",
                service(json!({})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.3", json!({"nodeName": null}))]}))],
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.3:8080 w1 via fullnat]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "preserveClientIP": true}))),
            policy_use: "applied",
            ..row(
                "policy preserveClientIP: DSR across nodes with externalTrafficPolicy Cluster",
                service(json!({})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.2", json!({"nodeName": "node-b"}))]}))],
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1 via l3dsr @node-b]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "preserveClientIP": true}))),
            policy_use: "rejected:ModeNotApplicable",
            warnings: vec![WARN_INVALID_POLICY],
            ..row(
                "policy preserveClientIP: an endpoint with no nodeName cannot keep its client's address: not applied",
                service(json!({})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.3", json!({"nodeName": null}))]}))],
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.3:8080 w1 via fullnat]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "preserveClientIP": false}))),
            policy_use: "applied",
            ..row(
                "policy preserveClientIP false: the default",
                service(json!({})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.2", json!({"nodeName": "node-b"}))]}))],
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1 via fullnat]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "fullnat", "preserveClientIP": true}))),
            policy_use: "rejected:InvalidValue",
            warnings: vec![WARN_INVALID_POLICY],
            ..row(
                "policy preserveClientIP with mode fullnat contradicts itself: not applied",
                service(json!({})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.2", json!({"nodeName": "node-b"}))]}))],
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1 via fullnat]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "dsr"}))),
            policy_use: "applied",
            ..row(
                "policy dsr with externalTrafficPolicy Local: this node's endpoints only, by NAT",
                service(json!({"spec": {"externalTrafficPolicy": "Local"}})),
                vec![slice(json!({"endpoints": [ep("10.1.0.1"), ep_with("10.1.0.2", json!({"nodeName": "node-b"}))]}))],
                vec!["tcp/203.0.113.10:80 dsr none rl=- [10.1.0.1:8080 w1 via nat]"],
            )
        },
        Row {
            policy: Some(policy(json!({
                "services": ["web"],
                "synRateLimit": {"ratePerSec": 100, "burst": 10},
                "affinity": {"type": "clientIP", "timeoutSeconds": 30},
                "healthCheck": {"type": "http", "path": "/healthz", "interval": "1s", "timeout": "500ms"},
            }))),
            policy_use: "applied",
            ..row(
                "policy: SYN limit, affinity over the Service's, health check",
                service(json!({"spec": {"sessionAffinity": "None"}})),
                two_ready(),
                vec!["tcp/203.0.113.10:80 nat clientIP/30 rl=100/10 [10.1.0.1:8080 w1, 10.1.0.2:8080 w1] +hc"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "affinity": {"type": "none"}}))),
            policy_use: "applied",
            ..row(
                "policy: affinity none overrides the Service's ClientIP",
                service(json!({"spec": {"sessionAffinity": "ClientIP"}})),
                two_ready(),
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "weights": [
                {"selector": {"matchLabels": {"topology.kubernetes.io/zone": "zone-2"}}, "weight": 5},
                {"selector": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-c"]}]}, "weight": 0},
                {"selector": {"matchLabels": {"tier": "canary"}}, "weight": 2},
                // Never reached for zone-2: the first match decides.
                {"selector": {"matchLabels": {"topology.kubernetes.io/zone": "zone-2"}}, "weight": 9},
            ]}))),
            policy_use: "applied",
            ..row(
                "policy: weights by zone, node and the slice's own labels; first match wins, others 1, draining stays 0",
                service(json!({})),
                vec![
                    slice(json!({"endpoints": [
                        ep("10.1.0.1"),
                        ep_with("10.1.0.2", json!({"zone": "zone-2"})),
                        ep_with("10.1.0.3", json!({"nodeName": "node-c"})),
                        ep_with("10.1.0.4", json!({"zone": "zone-2", "conditions": {"ready": false, "serving": true, "terminating": true}})),
                    ]})),
                    slice(json!({"metadata": {"name": "web-canary", "labels": {"tier": "canary"}},
                                 "endpoints": [ep("10.1.0.5")]})),
                ],
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w5, 10.1.0.3:8080 w0 via fullnat, 10.1.0.4:8080 w0, 10.1.0.5:8080 w2]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["web"], "mode": "dsr", "weights": [
                {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}, "weight": 3}
            ]}))),
            policy_use: "rejected:InvalidSelector",
            warnings: vec![WARN_INVALID_POLICY],
            ..row(
                "an invalid policy is not applied in part",
                service(json!({})),
                two_ready(),
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
            )
        },
        Row {
            policy: Some(policy(json!({"services": ["api"], "mode": "dsr"}))),
            ..row(
                "a policy that does not name the Service does not apply",
                service(json!({})),
                two_ready(),
                vec!["tcp/203.0.113.10:80 nat none rl=- [10.1.0.1:8080 w1, 10.1.0.2:8080 w1]"],
            )
        },
    ];
    let mut failures = Vec::new();
    for r in rows {
        let t = service_vips(&r.svc, &r.slices, r.policy.as_ref(), "node-a", &r.opts);
        let got = summary(&t);
        let warnings: Vec<&str> = t.warnings.iter().map(|w| w.reason).collect();
        let mut want_warnings = r.warnings.clone();
        want_warnings.sort();
        want_warnings.dedup();
        let mut got_warnings = warnings.clone();
        got_warnings.dedup();
        let policy_use = match &t.policy {
            PolicyUse::None => "none".to_string(),
            PolicyUse::Applied => "applied".to_string(),
            PolicyUse::Rejected(i) => format!("rejected:{}", i.reason),
        };
        if got != r.want || got_warnings != want_warnings || policy_use != r.policy_use {
            failures.push(format!(
                "{}:\n  got  {got:#?} warnings {:?} policy {policy_use}\n  want {:#?} warnings {want_warnings:?} policy {}",
                r.what, t.warnings, r.want, r.policy_use
            ));
        }
        for d in &t.vips {
            assert_eq!(d.vip.validate(), Ok(()), "{}: {}", r.what, d.vip.key());
            assert_eq!(d.health.len(), d.vip.backends.len(), "{}", r.what);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn names_owner_and_warning_text() {
    let svc = service(json!({"spec": {"ports": [{"name": "http", "port": 80},
                                                 {"port": 443},
                                                 {"name": "sig", "port": 2905, "protocol": "SCTP"}]}}));
    let t = service_vips(
        &svc,
        &two_ready(),
        None,
        "node-a",
        &TranslateOptions::default(),
    );
    assert_eq!(owner(&svc), Owner::new(SourceKind::Service, "shop/web"));
    let names: Vec<&str> = t.vips.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["shop/web:http", "shop/web:443"]);
    assert_eq!(t.warnings.len(), 1);
    let msg = t.warnings[0].to_string();
    assert!(
        msg.starts_with("UnsupportedProtocol: port sig uses SCTP"),
        "{msg}"
    );
}

#[test]
fn the_traffic_policy_goes_with_every_vip_for_the_l2_speaker() {
    for (etp, want) in [
        (json!("Local"), TrafficPolicy::Local),
        (json!("Cluster"), TrafficPolicy::Cluster),
        (json!(null), TrafficPolicy::Cluster),
    ] {
        let svc = service(json!({"spec": {"externalTrafficPolicy": etp,
                                          "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}}));
        let t = service_vips(
            &svc,
            &two_ready(),
            None,
            "node-a",
            &TranslateOptions::default(),
        );
        assert_eq!(t.vips.len(), 2, "{etp}");
        assert!(
            t.vips.iter().all(|v| v.traffic_policy == want),
            "{etp}: {:?}",
            t.vips.iter().map(|v| v.traffic_policy).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_rejected_policy_names_itself_and_its_reason() {
    let p = policy(json!({"services": ["web"], "weights": [
        {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}, "weight": 3}
    ]}));
    let t = service_vips(
        &service(json!({})),
        &two_ready(),
        Some(&p),
        "node-a",
        &TranslateOptions::default(),
    );
    match &t.policy {
        PolicyUse::Rejected(i) => assert_eq!(i.reason, REASON_INVALID_SELECTOR),
        other => panic!("{other:?}"),
    }
    let msg = t.warnings[0].to_string();
    assert!(
        msg.contains("ServicePolicy pol is not applied (InvalidSelector)"),
        "{msg}"
    );
}

/// The health check a policy gives is the file's parser's reading of the
/// same fields, shared by every backend.
#[test]
fn policy_health_check_is_the_files_spec() {
    let p = policy(json!({"services": ["web"], "healthCheck": {
        "type": "http", "path": "/ready", "interval": "1m30s", "timeout": "2s", "rise": 1, "fall": 5,
        "expectedStatus": [204, "300-302", "2xx"]}}));
    let t = service_vips(
        &service(json!({})),
        &two_ready(),
        Some(&p),
        "node-a",
        &TranslateOptions::default(),
    );
    let want: HealthCheckSpec = serde_json::from_value(json!({
        "type": "http", "path": "/ready", "interval": "90s", "timeout": "2s", "rise": 1, "fall": 5,
        "expectedStatus": [204, "300-302", "2xx"]}))
    .expect("the file's shape");
    let h = &t.vips[0].health;
    assert_eq!(h.len(), 2);
    let first = h[0].as_ref().expect("probed");
    assert_eq!(**first, want);
    assert!(
        Arc::ptr_eq(first, h[1].as_ref().expect("probed")),
        "one spec, shared"
    );
}

fn arb_ip() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u8..4).prop_map(|n| format!("203.0.113.{n}")),
        (1u8..4).prop_map(|n| format!("10.1.0.{n}")),
        (1u8..3).prop_map(|n| format!("2001:db8::{n}")),
        (1u8..3).prop_map(|n| format!("fd00::{n}")),
        Just("127.0.0.1".to_string()),
        Just("0.0.0.0".to_string()),
        Just("::".to_string()),
        Just("::ffff:10.1.0.1".to_string()),
        Just("ff02::1".to_string()),
        Just("garbage".to_string()),
    ]
}

fn arb_opt_bool() -> impl Strategy<Value = Value> {
    prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::Bool)]
}

fn arb_proto() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!("TCP")),
        Just(json!("UDP")),
        Just(json!("SCTP"))
    ]
}

fn arb_name() -> impl Strategy<Value = Value> {
    prop_oneof![Just(Value::Null), Just(json!("http")), Just(json!("dns"))]
}

fn arb_port() -> impl Strategy<Value = i32> {
    prop_oneof![
        Just(80),
        Just(8080),
        Just(53),
        Just(0),
        Just(70000),
        Just(-1)
    ]
}

fn arb_endpoint() -> impl Strategy<Value = Value> {
    (
        proptest::collection::vec(arb_ip(), 0..2),
        arb_opt_bool(),
        arb_opt_bool(),
        arb_opt_bool(),
        prop_oneof![
            Just(Value::Null),
            Just(json!("node-a")),
            Just(json!("node-b"))
        ],
        prop_oneof![Just(Value::Null), Just(json!("z1")), Just(json!("z2"))],
    )
        .prop_map(|(addrs, ready, serving, terminating, node, zone)| {
            json!({"addresses": addrs,
                   "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
                   "nodeName": node, "zone": zone})
        })
}

fn arb_slice() -> impl Strategy<Value = EndpointSlice> {
    (
        prop_oneof![Just("IPv4"), Just("IPv6"), Just("FQDN")],
        proptest::collection::vec(
            (
                arb_name(),
                arb_proto(),
                prop_oneof![Just(Value::Null), arb_port().prop_map(|p| json!(p))],
            ),
            0..3,
        ),
        proptest::collection::vec(arb_endpoint(), 0..6),
        prop_oneof![Just("web"), Just("api")],
        prop_oneof![Just(Value::Null), Just(json!({"tier": "canary"}))],
    )
        .prop_map(|(family, ports, endpoints, owner, extra)| {
            let ports: Vec<Value> = ports
                .into_iter()
                .map(|(n, p, port)| json!({"name": n, "protocol": p, "port": port}))
                .collect();
            let mut labels = json!({"kubernetes.io/service-name": owner});
            merge(&mut labels, &extra);
            serde_json::from_value(json!({
                "metadata": {"name": "s", "namespace": "shop", "labels": labels},
                "addressType": family, "ports": ports, "endpoints": endpoints
            }))
            .expect("an EndpointSlice")
        })
}

fn arb_service() -> impl Strategy<Value = Service> {
    (
        proptest::collection::vec(arb_ip(), 0..4),
        proptest::collection::vec((arb_name(), arb_proto(), arb_port()), 0..4),
        prop_oneof![
            Just(json!("Local")),
            Just(json!("Cluster")),
            Just(Value::Null)
        ],
        prop_oneof![
            Just(json!("ClientIP")),
            Just(json!("None")),
            Just(Value::Null)
        ],
        prop_oneof![Just(Value::Null), (-5i32..100_000).prop_map(|t| json!(t))],
    )
        .prop_map(|(ips, ports, etp, aff, timeout)| {
            let ingress: Vec<Value> = ips.into_iter().map(|ip| json!({"ip": ip})).collect();
            let ports: Vec<Value> = ports
                .into_iter()
                .map(|(n, p, port)| json!({"name": n, "protocol": p, "port": port}))
                .collect();
            service(json!({
                "spec": {"ports": ports, "externalTrafficPolicy": etp, "sessionAffinity": aff,
                         "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}}},
                "status": {"loadBalancer": {"ingress": ingress}}
            }))
        })
}

fn arb_policy() -> impl Strategy<Value = Option<ServicePolicy>> {
    proptest::option::of(
        (
            prop_oneof![Just("nat"), Just("dsr"), Just("l3dsr")],
            any::<bool>(),
            0u32..4,
        )
            .prop_map(|(mode, zone_weight, w)| {
                let mut spec = json!({"services": ["web"], "mode": mode});
                if zone_weight {
                    merge(
                        &mut spec,
                        &json!({"weights": [{"selector": {"matchLabels": {"topology.kubernetes.io/zone": "z1"}}, "weight": w}]}),
                    );
                }
                policy(spec)
            }),
    )
}

proptest! {
    /// Whatever the API server holds, the translation answers (no panic)
    /// with VIPs the model accepts: the reconciler never refuses a
    /// Service for its shape.
    #[test]
    fn any_input_gives_valid_vips(
        svc in arb_service(),
        slices in proptest::collection::vec(arb_slice(), 0..4),
        pol in arb_policy(),
    ) {
        let t = service_vips(&svc, &slices, pol.as_ref(), "node-a", &TranslateOptions::default());
        let mut keys = BTreeSet::new();
        let ingress: Vec<String> = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref()).into_iter().flatten()
            .filter_map(|i| i.ip.clone()).collect();
        for d in &t.vips {
            prop_assert_eq!(d.vip.validate(), Ok(()));
            prop_assert_eq!(d.health.len(), d.vip.backends.len());
            prop_assert!(keys.insert(d.vip.key()), "{} twice", d.vip.key());
            prop_assert!(ingress.iter().any(|i| i.parse::<IpAddr>().ok() == Some(d.vip.addr)));
            if d.vip.mode != Mode::Nat {
                prop_assert!(matches!(t.policy, PolicyUse::Applied));
            }
        }
    }
}
