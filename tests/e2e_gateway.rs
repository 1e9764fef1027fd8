//! Gateway API end to end: the upstream CRDs (`helm/gateway-api-crds/`)
//! on the shared real kube-apiserver, the generated Rust types reading
//! what it stores.

mod common;

use common::k8s::{shared, Kube};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use rivora_k8s::gateway::api::gateways::Gateway;
use rivora_k8s::gateway::api::referencegrants::ReferenceGrant;
use rivora_k8s::gateway::api::tcproutes::TcpRoute;
use rivora_k8s::gateway::api::udproutes::UdpRoute;
use serde_json::{json, Value};

const GROUP: &str = "gateway.networking.k8s.io";

fn api(kube: &Kube, ns: &str, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, version, kind), plural);
    Api::namespaced_with(kube.client.clone(), ns, &ar)
}

/// Create `obj` through `version` and read it back as the Rust type `K`.
fn round_trip<K: serde::de::DeserializeOwned>(
    kube: &Kube,
    ns: &str,
    (version, kind, plural): (&str, &str, &str),
    obj: Value,
) -> K {
    let api = api(kube, ns, version, kind, plural);
    let obj: DynamicObject = serde_json::from_value(obj).expect("an object");
    let name = obj.metadata.name.clone().unwrap_or_default();
    let got = kube
        .block_on(api.create(&PostParams::default(), &obj))
        .unwrap_or_else(|e| panic!("creating {kind} {ns}/{name} through {version}: {e}"));
    let v = serde_json::to_value(&got).expect("JSON");
    serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{kind} as stored does not read as the Rust type: {e}\n{v}"))
}

/// The CRDs the chart ships install and serve every version Rivora reads
/// (Gateway v1, ReferenceGrant v1 and v1beta1, the routes v1 and
/// v1alpha2), and what the API server stores (defaults filled in) reads
/// as the generated types.
#[test]
fn gateway_api_crds_install_and_read_as_the_generated_types() {
    shared();
    let kube = Kube::admin();
    let ns = kube.namespace("gwcrd-");
    let n = &ns.name;
    let gw: Gateway = round_trip(
        &kube,
        n,
        ("v1", "Gateway", "gateways"),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": n},
            "spec": {"gatewayClassName": "rivora", "listeners": [
                {"name": "tcp", "protocol": "TCP", "port": 5432},
                {"name": "udp", "protocol": "UDP", "port": 53,
                 "allowedRoutes": {"namespaces": {"from": "Selector",
                    "selector": {"matchLabels": {"team": "a"}}}}}]}
        }),
    );
    assert_eq!(gw.spec.listeners.len(), 2);
    // The API server fills in the defaults: allowedRoutes from Same.
    let from = gw.spec.listeners[0]
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.clone());
    assert_eq!(format!("{from:?}"), "Some(Same)");
    for (version, name) in [("v1", "r1"), ("v1alpha2", "r2")] {
        let route: TcpRoute = round_trip(
            &kube,
            n,
            (version, "TCPRoute", "tcproutes"),
            json!({
                "apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": "TCPRoute",
                "metadata": {"name": name, "namespace": n},
                "spec": {"parentRefs": [{"name": "gw", "sectionName": "tcp"}],
                         "rules": [{"backendRefs": [{"name": "db", "port": 5432, "weight": 3}]}]}
            }),
        );
        let p = &route.spec.parent_refs.as_deref().unwrap_or_default()[0];
        // Defaults again: the parent is a Gateway of the Gateway API group.
        assert_eq!(
            (p.group.as_deref(), p.kind.as_deref()),
            (Some(GROUP), Some("Gateway"))
        );
        assert_eq!(route.spec.rules[0].backend_refs[0].weight, Some(3));
        let udp: UdpRoute = round_trip(
            &kube,
            n,
            (version, "UDPRoute", "udproutes"),
            json!({
                "apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": "UDPRoute",
                "metadata": {"name": name, "namespace": n},
                "spec": {"parentRefs": [{"name": "gw", "port": 53}],
                         "rules": [{"backendRefs": [{"name": "dns", "port": 53}]}]}
            }),
        );
        assert_eq!(
            udp.spec.parent_refs.as_deref().unwrap_or_default()[0].port,
            Some(53)
        );
    }
    for (version, name) in [("v1", "g1"), ("v1beta1", "g2")] {
        let g: ReferenceGrant = round_trip(
            &kube,
            n,
            (version, "ReferenceGrant", "referencegrants"),
            json!({
                "apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": "ReferenceGrant",
                "metadata": {"name": name, "namespace": n},
                "spec": {"from": [{"group": GROUP, "kind": "TCPRoute", "namespace": "other"}],
                         "to": [{"group": "", "kind": "Service"}]}
            }),
        );
        assert_eq!(g.spec.from[0].kind, "TCPRoute");
    }
    // The schema refuses a Service backendRef without a port.
    let api = api(&kube, n, "v1alpha2", "TCPRoute", "tcproutes");
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "TCPRoute",
        "metadata": {"name": "no-port", "namespace": n},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "db"}]}]}
    }))
    .expect("an object");
    let err = kube
        .block_on(api.create(&PostParams::default(), &bad))
        .expect_err("a Service backendRef without a port is refused");
    assert!(err.to_string().contains("port"), "{err}");
}
