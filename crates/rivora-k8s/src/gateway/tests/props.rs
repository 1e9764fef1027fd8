//! Property tests over random clusters: Gateways with random listeners
//! (TCP, UDP, HTTP on shared ports, every `allowedRoutes` kind of
//! namespace filter, zero to two addresses), random TCPRoutes and
//! UDPRoutes (parentRefs with and without `sectionName` and `port`,
//! backendRefs to Services that exist, do not, or live in another
//! namespace, with random weights) and random ReferenceGrants. For every
//! cluster:
//! - the resolution does not depend on the order objects are listed in;
//! - every VIP is an accepted, unconflicted TCP or UDP listener's, on an
//!   address of its Gateway, at the listener's port and protocol;
//! - a listener's `attachedRoutes` is the number of route parents that
//!   name it as attached, and a parent is `Accepted=True` exactly when it
//!   attached somewhere;
//! - every backend is an endpoint of a Service the listener's first route
//!   names, in the route's namespace or admitted by a ReferenceGrant;
//! - each Service's share of the Maglev weights is its backendRef's
//!   weight (weight / ready endpoints each);
//! - status computed, written back and computed again: nothing to write.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const NAMESPACES: [&str; 3] = ["infra", "a", "b"];
const PORTS: [i32; 3] = [53, 80, 81];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "HTTP"];
const ADDRESSES: [&str; 2] = ["203.0.113.10", "2001:db8::10"];

/// Services: a/one (10.1.0.1, 10.1.0.2; fd00::1), b/two (10.2.0.1),
/// infra/three (10.3.0.1-3), each with TCP and UDP on every port of
/// PORTS; `missing` never exists.
const SERVICES: [(&str, &str, &[&str], &[&str]); 3] = [
    ("a", "one", &["10.1.0.1", "10.1.0.2"], &["fd00::1"]),
    ("b", "two", &["10.2.0.1"], &[]),
    ("infra", "three", &["10.3.0.1", "10.3.0.2", "10.3.0.3"], &[]),
];
const BACKEND_NAMES: [&str; 4] = ["one", "two", "three", "missing"];

#[derive(Debug, Clone)]
struct ListenerGen {
    protocol: usize,
    port: usize,
    /// 0 Same, 1 All, 2 Selector team=a.
    from: usize,
}

#[derive(Debug, Clone)]
struct GatewayGen {
    ns: usize,
    age: u32,
    listeners: Vec<ListenerGen>,
    addresses: Vec<usize>,
}

#[derive(Debug, Clone)]
struct ParentGen {
    gateway: usize,
    /// Index into the Gateway's listeners (may be past the end: no such
    /// listener).
    section: Option<usize>,
    port: Option<usize>,
}

#[derive(Debug, Clone)]
struct RouteGen {
    udp: bool,
    ns: usize,
    age: u32,
    parents: Vec<ParentGen>,
    /// (Service, namespace override, weight).
    backends: Vec<(usize, Option<usize>, i32)>,
}

#[derive(Debug, Clone)]
struct ClusterGen {
    gateways: Vec<GatewayGen>,
    routes: Vec<RouteGen>,
    /// (grant namespace, from namespace, kind udp?, to name)
    grants: Vec<(usize, usize, bool, Option<usize>)>,
}

fn arb_listener() -> impl Strategy<Value = ListenerGen> {
    (0..PROTOCOLS.len(), 0..PORTS.len(), 0usize..3).prop_map(|(protocol, port, from)| ListenerGen {
        protocol,
        port,
        from,
    })
}

fn arb_cluster() -> impl Strategy<Value = ClusterGen> {
    let gateway = (
        0..NAMESPACES.len(),
        0u32..4,
        prop::collection::vec(arb_listener(), 1..4),
        prop::collection::vec(0..ADDRESSES.len(), 0..3),
    )
        .prop_map(|(ns, age, listeners, addresses)| GatewayGen {
            ns,
            age,
            listeners,
            addresses,
        });
    let parent = (
        0usize..3,
        prop::option::of(0usize..4),
        prop::option::of(0..PORTS.len()),
    )
        .prop_map(|(gateway, section, port)| ParentGen {
            gateway,
            section,
            port,
        });
    let route = (
        any::<bool>(),
        0..NAMESPACES.len(),
        0u32..4,
        prop::collection::vec(parent, 1..3),
        prop::collection::vec(
            (
                0..BACKEND_NAMES.len(),
                prop::option::of(0..NAMESPACES.len()),
                0i32..4,
            ),
            1..4,
        ),
    )
        .prop_map(|(udp, ns, age, parents, backends)| RouteGen {
            udp,
            ns,
            age,
            parents,
            backends,
        });
    (
        prop::collection::vec(gateway, 1..4),
        prop::collection::vec(route, 0..7),
        prop::collection::vec(
            (
                0..NAMESPACES.len(),
                0..NAMESPACES.len(),
                any::<bool>(),
                prop::option::of(0usize..3),
            ),
            0..3,
        ),
    )
        .prop_map(|(gateways, routes, grants)| ClusterGen {
            gateways,
            routes,
            grants,
        })
}

fn time(age: u32) -> String {
    format!("2026-01-0{}T00:00:00Z", age + 1)
}

fn build(g: &ClusterGen) -> Snapshot {
    let mut s = Snapshot {
        classes: vec![class("rivora", CONTROLLER_NAME)],
        namespaces: ns_labels(&[
            ("infra", &[]),
            ("a", &[("team", "a")]),
            ("b", &[("team", "b")]),
        ]),
        ..Default::default()
    };
    let ports: Vec<Value> = PORTS
        .iter()
        .flat_map(|p| {
            [
                json!({"name": format!("t{p}"), "port": p, "protocol": "TCP"}),
                json!({"name": format!("u{p}"), "port": p, "protocol": "UDP"}),
            ]
        })
        .collect();
    for (ns, name, v4, v6) in SERVICES {
        s.services
            .push(service(ns, name, Value::Array(ports.clone())));
        for p in PORTS {
            for (proto, prefix) in [("TCP", "t"), ("UDP", "u")] {
                let port_name = format!("{prefix}{p}");
                s.slices
                    .push(slice(ns, name, "IPv4", &port_name, proto, p + 1000, v4));
                if !v6.is_empty() {
                    s.slices
                        .push(slice(ns, name, "IPv6", &port_name, proto, p + 1000, v6));
                }
            }
        }
    }
    for (i, gg) in g.gateways.iter().enumerate() {
        let listeners: Vec<Value> = gg
            .listeners
            .iter()
            .enumerate()
            .map(|(j, l)| {
                let from = match l.from {
                    0 => json!({"from": "Same"}),
                    1 => json!({"from": "All"}),
                    _ => json!({"from": "Selector", "selector": {"matchLabels": {"team": "a"}}}),
                };
                json!({"name": format!("l{j}"), "protocol": PROTOCOLS[l.protocol], "port": PORTS[l.port],
                       "allowedRoutes": {"namespaces": from}})
            })
            .collect();
        let addresses: Vec<Value> = gg
            .addresses
            .iter()
            .map(|a| json!({"type": "IPAddress", "value": ADDRESSES[*a]}))
            .collect();
        s.gateways.push(from(json!({
            "metadata": {"name": format!("gw{i}"), "namespace": NAMESPACES[gg.ns], "generation": 1,
                         "creationTimestamp": time(gg.age)},
            "spec": {"gatewayClassName": "rivora", "listeners": listeners},
            "status": {"addresses": addresses}
        })));
    }
    for (i, r) in g.routes.iter().enumerate() {
        let parents: Vec<Value> = r
            .parents
            .iter()
            .map(|p| {
                let gw_ns = g
                    .gateways
                    .get(p.gateway)
                    .map_or("infra", |gg| NAMESPACES[gg.ns]);
                let mut v = json!({"name": format!("gw{}", p.gateway), "namespace": gw_ns});
                if let Some(sec) = p.section {
                    v["sectionName"] = json!(format!("l{sec}"));
                }
                if let Some(port) = p.port {
                    v["port"] = json!(PORTS[port]);
                }
                v
            })
            .collect();
        let backends: Vec<Value> = r
            .backends
            .iter()
            .map(|(svc, ns, w)| {
                let mut v = json!({"name": BACKEND_NAMES[*svc], "port": 80, "weight": w});
                if let Some(ns) = ns {
                    v["namespace"] = json!(NAMESPACES[*ns]);
                }
                v
            })
            .collect();
        let name = format!("r{i}");
        let ns = NAMESPACES[r.ns];
        if r.udp {
            s.udp_routes.push(udp_route(
                ns,
                &name,
                &time(r.age),
                Value::Array(parents),
                Value::Array(backends),
            ));
        } else {
            s.tcp_routes.push(tcp_route(
                ns,
                &name,
                &time(r.age),
                Value::Array(parents),
                Value::Array(backends),
            ));
        }
    }
    for (i, (ns, from_ns, udp, to)) in g.grants.iter().enumerate() {
        let mut gr = grant(
            NAMESPACES[*ns],
            NAMESPACES[*from_ns],
            if *udp { "UDPRoute" } else { "TCPRoute" },
            to.map(|t| BACKEND_NAMES[t]),
        );
        gr.metadata.name = Some(format!("g{i}"));
        s.grants.push(gr);
    }
    s
}

/// Which Service (namespace, name) an endpoint address belongs to.
fn owner_of(addr: IpAddr) -> (&'static str, &'static str) {
    for (ns, name, v4, v6) in SERVICES {
        if v4
            .iter()
            .chain(v6.iter())
            .any(|a| a.parse::<IpAddr>().ok() == Some(addr))
        {
            return (ns, name);
        }
    }
    panic!("{addr} is nobody's endpoint")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn resolutions_keep_the_rules(g in arb_cluster()) {
        let s = build(&g);
        let res = resolve(&s);

        let mut shuffled = s.clone();
        shuffled.gateways.reverse();
        shuffled.tcp_routes.reverse();
        shuffled.udp_routes.reverse();
        shuffled.grants.reverse();
        shuffled.slices.reverse();
        prop_assert_eq!(&res, &resolve(&shuffled));

        let routes: BTreeMap<RouteRef, Route> = s.routes().into_iter().map(|r| (r.key(), r)).collect();
        for (key, gr) in &res.gateways {
            let gw = s.gateways.iter().find(|x| x.name_any() == key.name && x.namespace().as_deref() == Some(&key.namespace)).expect("the Gateway");
            // attachedRoutes is what the route parents say.
            for (i, l) in gr.listeners.iter().enumerate() {
                let named = res.routes.iter().filter(|(_, r)| r.parents.iter().any(|p| {
                    p.parent_ref.name == key.name
                        && p.parent_ref.namespace.as_deref() == Some(&key.namespace)
                        && p.listeners.contains(&l.name)
                })).count();
                prop_assert_eq!(l.routes.len(), named, "listener {} of {}", l.name, key);
                prop_assert_eq!(&l.name, &gw.spec.listeners[i].name);
            }
            for v in &gr.vips {
                let port = match v.vip.ports { Ports::One(p) => i32::from(p), _ => -1 };
                let l = gr.listeners.iter().find(|l| l.port == port && listener_protocol(&l.protocol) == Some(v.vip.proto));
                let l = l.expect("a VIP has its listener");
                prop_assert!(gr.accepted.status && l.accepted.status && !l.conflicted.status, "{:?}", l);
                prop_assert!(gr.addresses.contains(&v.vip.addr));
                // Backends: the first route's Services, reachable by it.
                let first = l.routes.first();
                if v.vip.backends.is_empty() { continue; }
                let route = &routes[first.expect("backends come from a route")];
                let mut sums: BTreeMap<(&str, &str), u64> = BTreeMap::new();
                for b in &v.vip.backends {
                    prop_assert_eq!(b.addr.is_ipv4(), v.vip.addr.is_ipv4());
                    let (ns, name) = owner_of(b.addr);
                    let named = route.backend_refs.iter().any(|(_, r)| {
                        r.name == name && r.namespace.as_deref().unwrap_or(&route.namespace) == ns
                    });
                    prop_assert!(named, "{} is not named by {}", b.addr, route.name);
                    if ns != route.namespace {
                        prop_assert!(s.reference_grants(ns).iter().any(|gr| {
                            gr.spec.from.iter().any(|f| f.namespace == route.namespace && f.kind == route.kind.unwrap_or(RouteKind::Tcp).kind())
                                && gr.spec.to.iter().any(|t| t.name.as_deref().is_none_or(|n| n == name))
                        }), "{} from another namespace without a grant", b.addr);
                    }
                    *sums.entry((ns, name)).or_insert(0) += u64::from(b.weight);
                }
                // Each Service's share is its refs' weight.
                let mut want: BTreeMap<(&str, &str), u64> = BTreeMap::new();
                for (_, r) in &route.backend_refs {
                    let ns = r.namespace.as_deref().unwrap_or(&route.namespace);
                    if let Some(k) = sums.keys().find(|(n, m)| *n == ns && *m == r.name) {
                        *want.entry(*k).or_insert(0) += u64::try_from(r.weight.unwrap_or(1)).unwrap_or(0);
                    }
                }
                let pairs: Vec<(u64, u64)> = sums.iter().map(|(k, s)| (*s, want[k])).collect();
                for w in pairs.windows(2) {
                    let ((s1, w1), (s2, w2)) = (w[0], w[1]);
                    prop_assert_eq!(s1 * w2, s2 * w1, "shares {:?} against weights", pairs);
                }
            }
        }
        for r in res.routes.values() {
            for p in &r.parents {
                prop_assert_eq!(p.accepted.status, !p.listeners.is_empty(), "{:?}", p);
            }
        }

        // Status: computed, written back, nothing more to write.
        let now = at("2026-04-01T00:00:00Z");
        let mut written = s.clone();
        for gw in &mut written.gateways {
            if let Some(st) = gateway_status(gw, &res, &now) { gw.status = Some(st); }
        }
        for r in &mut written.tcp_routes {
            if let Some(st) = tcp_route_status(r, &res, &now) { r.status = Some(st); }
        }
        for r in &mut written.udp_routes {
            if let Some(st) = udp_route_status(r, &res, &now) { r.status = Some(st); }
        }
        let res2 = resolve(&written);
        let later = at("2026-04-02T00:00:00Z");
        for gw in &written.gateways {
            prop_assert_eq!(gateway_status(gw, &res2, &later), None);
        }
        for r in &written.tcp_routes {
            prop_assert_eq!(tcp_route_status(r, &res2, &later), None);
        }
        for r in &written.udp_routes {
            prop_assert_eq!(udp_route_status(r, &res2, &later), None);
        }
    }
}
