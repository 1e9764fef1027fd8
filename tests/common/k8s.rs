//! Kubernetes for the end-to-end tests of `rivorad -kubernetes`, said once:
//!
//! - [`shared`]: one real kube-apiserver + etcd per test process
//!   ([`ApiServer`]), started by the first test that asks, with Rivora's
//!   CRDs installed from `helm/crds/` and the Gateway API's from
//!   `helm/gateway-api-crds/experimental/` (as the chart would, before any
//!   rivorad runs). The watchdog of `scripts/apiserver.sh` stops it when
//!   the test process ends. Tests keep apart by Kubernetes namespace.
//! - [`Kube`]: a blocking client for the tests themselves (an admin,
//!   straight to the API server), and [`TestNs`], a namespace whose
//!   Services, EndpointSlices and ServicePolicies are deleted on drop, then
//!   the namespace itself, its finalizer cleared (no namespace controller
//!   runs). Every rivorad watches every namespace: what a test leaves would
//!   be programmed by the others' rivorads.
//! - [`ApiProxy`]: rivorad runs in a lab's node namespace, where the API
//!   server's loopback address is not reachable. The proxy listens on
//!   127.0.0.1 inside that namespace (the address the server certificate
//!   names) and forwards to the API server; a test can hang it (accepted
//!   connections, no answer: as a SIGSTOPped API server) or take it down
//!   (connections reset) for its own rivorad alone, while the shared API
//!   server goes on serving the other tests.
//! - Builders for the objects the tests write: LoadBalancer Services,
//!   EndpointSlices (as the EndpointSlice controller would write them: no
//!   controller-manager runs), ServicePolicies.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ApiResource;
use kube::Client;
use rivora_k8s::{AddressPool, ServicePolicy};
use serde_json::{json, Value};

use super::apiserver::ApiServer;
use super::netns::{spawn_in, Netns};
use super::unique;

/// Rivora's `spec.loadBalancerClass`.
pub const LB_CLASS: &str = "rivora.io/lb";
/// The label of the AddressPools a [`TestNs`] makes: its name.
pub const POOL_NAMESPACE_LABEL: &str = "test.rivora.io/namespace";
/// Who writes the test's EndpointSlices (the label the EndpointSlice
/// controller sets to its own name).
pub const MANAGED_BY: &str = "rivora-e2e";

// ---------------------------------------------------------------------
// The shared API server
// ---------------------------------------------------------------------

/// The process's API server, with the CRDs installed.
pub struct Shared {
    pub server: ApiServer,
    /// Where the server listens, for proxies.
    pub addr: SocketAddr,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// The API server every test of this process uses, started (and the CRDs
/// installed) by the first caller; the others wait for it. A failed start
/// fails the caller; the next caller tries again.
pub fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        let t0 = Instant::now();
        let server = ApiServer::start();
        // From here a panic drops `server`, which stops it.
        let addr: SocketAddr = server.addr();
        let kube = Kube::new(&server.kubeconfig);
        install_crds(&kube);
        eprintln!(
            "API server {} up with Rivora's CRDs in {:?}",
            server.url,
            t0.elapsed()
        );
        Shared { server, addr }
    })
}

/// The CRDs as `helm/crds/` ships them. The checked-in YAML must be what
/// the types generate (a unit test of rivora-k8s says so too); what is
/// installed is that same object. Then the Gateway API's, as
/// `helm/gateway-api-crds/experimental/` ships them (the channel that
/// serves TCPRoute and UDPRoute at v1alpha2 as well as v1).
pub fn install_crds(kube: &Kube) {
    for f in rivora_k8s::crd_files() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(f.path);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert!(
            on_disk == f.yaml,
            "{} is not what Rivora's types generate: the tests would install another schema than the chart",
            path.display()
        );
    }
    for crd in rivora_k8s::crds() {
        install_crd(kube, &crd);
    }
    install_gateway_api_crds(kube);
}

/// The Gateway API CRDs, installed and served, on `kube`'s server (one of
/// a test's own: the shared one has them from the start).
pub fn install_gateway_api_crds(kube: &Kube) {
    for crd in gateway_api_crds() {
        install_crd(kube, &crd);
    }
}

/// Create `crd` (an existing one is kept) and wait until it is served,
/// at every version it serves.
pub fn install_crd(kube: &Kube, crd: &CustomResourceDefinition) {
    let name = crd.metadata.name.clone().expect("the CRD's name");
    let api: Api<CustomResourceDefinition> = Api::all(kube.client.clone());
    kube.block_on(async {
        match api.create(&PostParams::default(), crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("installing CRD {name}: {e}"),
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = kube
            .block_on(api.get(&name))
            .unwrap_or_else(|e| panic!("reading CRD {name}: {e}"));
        let established = got
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "CRD {name} not Established within 30 s: {:?}",
            got.status
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Served too (Established comes a moment before discovery serves it),
    // at every version: rivorad reads the Gateway API kinds at whichever.
    let served: Vec<String> = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.clone())
        .collect();
    assert!(!served.is_empty(), "CRD {name} serves no version");
    for version in served {
        let ar = ApiResource {
            group: crd.spec.group.clone(),
            version: version.clone(),
            api_version: format!("{}/{version}", crd.spec.group),
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
        };
        let objects: Api<DynamicObject> = Api::all_with(kube.client.clone(), &ar);
        let ok =
            super::traffic::wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
                kube.block_on(objects.list(&ListParams::default())).ok()
            });
        assert!(ok.is_some(), "{name} {version} never served");
    }
}

/// The namespaced Gateway API kinds Rivora reads: (kind, plural).
pub const GATEWAY_API_NAMESPACED: [(&str, &str); 4] = [
    ("Gateway", "gateways"),
    ("TCPRoute", "tcproutes"),
    ("UDPRoute", "udproutes"),
    ("ReferenceGrant", "referencegrants"),
];

/// A Gateway API kind at v1.
pub fn gateway_api_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind),
        plural,
    )
}

/// Where the Gateway API CRDs the tests install are checked in.
pub const GATEWAY_API_CRDS: &str = "helm/gateway-api-crds/experimental";

/// The Gateway API CRDs Rivora reads, as the chart ships them.
pub fn gateway_api_crds() -> Vec<CustomResourceDefinition> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(GATEWAY_API_CRDS);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        5,
        "the five Gateway API CRDs in {}",
        dir.display()
    );
    files
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            serde_yaml_ng::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not a CRD: {e}", p.display()))
        })
        .collect()
}

// ---------------------------------------------------------------------
// A blocking client
// ---------------------------------------------------------------------

/// A kube client on a runtime of its own, called from plain threads.
#[derive(Clone)]
pub struct Kube {
    rt: Arc<tokio::runtime::Runtime>,
    pub client: Client,
}

impl Kube {
    /// A client from a kubeconfig file.
    pub fn new(kubeconfig: &Path) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for the kube client");
        let kc = Kubeconfig::read_from(kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", kubeconfig.display()));
        let client = rt.block_on(async {
            let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", kubeconfig.display()));
            Client::try_from(config).expect("a kube client")
        });
        Self {
            rt: Arc::new(rt),
            client,
        }
    }

    /// An admin client of the shared API server.
    pub fn admin() -> Self {
        Self::new(&shared().server.kubeconfig)
    }

    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// A fresh namespace, emptied and deleted on drop.
    pub fn namespace(&self, prefix: &str) -> TestNs {
        self.namespace_labelled(prefix, json!({}))
    }

    /// A fresh namespace with `labels` (a JSON object), emptied and
    /// deleted on drop.
    pub fn namespace_labelled(&self, prefix: &str, labels: Value) -> TestNs {
        let name = unique(prefix);
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": name, "labels": labels },
        }))
        .expect("a Namespace");
        let api: Api<Namespace> = Api::all(self.client.clone());
        self.block_on(api.create(&PostParams::default(), &ns))
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        TestNs {
            kube: self.clone(),
            name,
        }
    }

    fn services(&self, ns: &str) -> Api<Service> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn slices(&self, ns: &str) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Gateway API objects of `kind` (v1, which every kind Rivora reads
    /// serves) as raw objects.
    /// A cluster-scoped Gateway API kind (GatewayClass), at v1.
    pub fn gateway_api_all(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &gateway_api_resource(kind, plural))
    }

    pub fn gateway_api(&self, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &gateway_api_resource(kind, plural))
    }

    /// ServicePolicies as raw objects: what the schema refuses cannot be
    /// said with the Rust type.
    fn policies(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            ns,
            &ApiResource::erase::<ServicePolicy>(&()),
        )
    }
}

/// A namespace of Kubernetes objects for one test. Dropped: its Services,
/// EndpointSlices, ServicePolicies, Gateway API objects and the
/// AddressPools made for its addresses are deleted (so no other test's
/// rivorad keeps programming them), then the namespace, whose finalizer
/// is cleared by hand.
pub struct TestNs {
    pub kube: Kube,
    pub name: String,
}

impl TestNs {
    /// Create a Service.
    pub fn create_service(&self, svc: &Service) {
        let name = svc.metadata.name.clone().unwrap_or_default();
        self.kube
            .block_on(
                self.kube
                    .services(&self.name)
                    .create(&PostParams::default(), svc),
            )
            .unwrap_or_else(|e| panic!("creating Service {}/{name}: {e}", self.name));
    }

    /// Write `status.loadBalancer.ingress` through the status subresource,
    /// as rivora-controller does once it has assigned the addresses: from
    /// an AddressPool ([`TestNs::pool_for`]), as rivorad serves no other.
    pub fn set_ingress(&self, service: &str, ips: &[IpAddr]) {
        self.pool_for(ips);
        self.set_ingress_by_hand(service, ips);
    }

    /// An AddressPool for each of `ips` that no pool in use holds yet (a
    /// test's own pool, made first, is left to decide: an L2 pool must
    /// not lose its addresses to a younger one), of exactly that address,
    /// labelled with this namespace (deleted with it) and with no
    /// `test.rivora.io/scope`, so that the controllers of
    /// tests/e2e_controller.rs (`-pool-selector` on that label) never
    /// assign from it.
    pub fn pool_for(&self, ips: &[IpAddr]) {
        let typed: Api<AddressPool> = Api::all(self.kube.client.clone());
        let existing = self
            .kube
            .block_on(typed.list(&ListParams::default()))
            .unwrap_or_else(|e| panic!("listing the AddressPools: {e}"));
        let in_use = rivora_k8s::ipam::PoolSet::new(existing.items.iter());
        for ip in ips.iter().filter(|ip| in_use.pool_of(**ip).is_none()) {
            let name = format!("{}-{}", self.name, ip.to_string().replace([':', '.'], "-"))
                .trim_end_matches('-')
                .to_string();
            let pool: AddressPool = serde_json::from_value(json!({
                "apiVersion": "rivora.io/v1alpha1",
                "kind": "AddressPool",
                "metadata": { "name": name, "labels": { POOL_NAMESPACE_LABEL: self.name } },
                "spec": { "addresses": [ip.to_string()] },
            }))
            .expect("an AddressPool");
            match self
                .kube
                .block_on(typed.create(&PostParams::default(), &pool))
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("creating AddressPool {name} for {ip}: {e}"),
            }
        }
    }

    /// Delete the AddressPools [`TestNs::pool_for`] made.
    pub fn delete_pools(&self) {
        let pools: Api<AddressPool> = Api::all(self.kube.client.clone());
        self.kube
            .block_on(pools.delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("{POOL_NAMESPACE_LABEL}={}", self.name)),
            ))
            .unwrap_or_else(|e| panic!("deleting the AddressPools of {}: {e}", self.name));
    }

    /// Write `status.loadBalancer.ingress` as anyone who may patch
    /// `services/status` can: no pool is made for the addresses.
    pub fn set_ingress_by_hand(&self, service: &str, ips: &[IpAddr]) {
        let ingress: Vec<Value> = ips
            .iter()
            .map(|ip| json!({ "ip": ip.to_string() }))
            .collect();
        let patch = json!({ "status": { "loadBalancer": { "ingress": ingress } } });
        let got = self
            .kube
            .block_on(self.kube.services(&self.name).patch_status(
                service,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ))
            .unwrap_or_else(|e| panic!("patching the status of {}/{service}: {e}", self.name));
        let written: Vec<String> = got
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.ip)
            .collect();
        let want: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
        assert_eq!(written, want, "{}/{service}: ingress as stored", self.name);
    }

    /// Merge-patch a Service (its spec, its metadata), as its owner does.
    pub fn patch_service(&self, name: &str, patch: &Value) {
        self.kube
            .block_on(self.kube.services(&self.name).patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(patch),
            ))
            .unwrap_or_else(|e| panic!("patching Service {}/{name}: {e}", self.name));
    }

    /// The stored Service, if any.
    pub fn service(&self, name: &str) -> Option<Service> {
        self.kube
            .block_on(self.kube.services(&self.name).get_opt(name))
            .unwrap_or_else(|e| panic!("reading Service {}/{name}: {e}", self.name))
    }

    pub fn delete_service(&self, name: &str) {
        self.kube
            .block_on(
                self.kube
                    .services(&self.name)
                    .delete(name, &DeleteParams::default()),
            )
            .unwrap_or_else(|e| panic!("deleting Service {}/{name}: {e}", self.name));
    }

    /// Create or replace an EndpointSlice (server-side apply, forced: the
    /// whole endpoint list is the one given).
    pub fn apply_slice(&self, slice: &EndpointSlice) {
        let name = slice.metadata.name.clone().expect("a named slice");
        self.kube
            .block_on(self.kube.slices(&self.name).patch(
                &name,
                &PatchParams::apply(MANAGED_BY).force(),
                &Patch::Apply(slice),
            ))
            .unwrap_or_else(|e| panic!("applying EndpointSlice {}/{name}: {e}", self.name));
    }

    /// Create a ServicePolicy from its `spec`; the API server's refusal is
    /// returned, not a panic.
    pub fn create_policy(&self, name: &str, spec: Value) -> Result<(), kube::Error> {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "rivora.io/v1alpha1",
            "kind": "ServicePolicy",
            "metadata": { "name": name, "namespace": self.name },
            "spec": spec,
        }))
        .expect("a ServicePolicy object");
        self.kube
            .block_on(
                self.kube
                    .policies(&self.name)
                    .create(&PostParams::default(), &obj),
            )
            .map(|_| ())
    }

    /// Delete ServicePolicy `name`; panics if it is not there.
    pub fn delete_policy(&self, name: &str) {
        self.kube
            .block_on(
                self.kube
                    .policies(&self.name)
                    .delete(name, &DeleteParams::default()),
            )
            .unwrap_or_else(|e| panic!("deleting ServicePolicy {}/{name}: {e}", self.name));
    }

    /// The stored ServicePolicy, if any.
    pub fn policy(&self, name: &str) -> Option<Value> {
        self.kube
            .block_on(self.kube.policies(&self.name).get_opt(name))
            .unwrap_or_else(|e| panic!("reading ServicePolicy {}/{name}: {e}", self.name))
            .map(|o| serde_json::to_value(o).expect("JSON"))
    }

    /// Create a Gateway API object of `kind` (`plural`) from its JSON, at
    /// the version its `apiVersion` names; the namespace is this one.
    pub fn create_gateway_api(&self, kind: &str, plural: &str, mut obj: Value) {
        obj["metadata"]["namespace"] = json!(self.name);
        let version = obj["apiVersion"]
            .as_str()
            .and_then(|v| v.rsplit('/').next())
            .unwrap_or("v1")
            .to_string();
        let ar = ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("gateway.networking.k8s.io", &version, kind),
            plural,
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.kube.client.clone(), &self.name, &ar);
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let o: DynamicObject = serde_json::from_value(obj).expect("an object");
        self.kube
            .block_on(api.create(&PostParams::default(), &o))
            .unwrap_or_else(|e| panic!("creating {kind} {}/{name}: {e}", self.name));
    }

    /// Delete a Gateway API object.
    pub fn delete_gateway_api(&self, kind: &str, plural: &str, name: &str) {
        self.kube
            .block_on(
                self.kube
                    .gateway_api(&self.name, kind, plural)
                    .delete(name, &DeleteParams::default()),
            )
            .unwrap_or_else(|e| panic!("deleting {kind} {}/{name}: {e}", self.name));
    }

    /// A Gateway API object as stored, if any.
    pub fn gateway_api_object(&self, kind: &str, plural: &str, name: &str) -> Option<Value> {
        self.kube
            .block_on(
                self.kube
                    .gateway_api(&self.name, kind, plural)
                    .get_opt(name),
            )
            .unwrap_or_else(|e| panic!("reading {kind} {}/{name}: {e}", self.name))
            .map(|o| serde_json::to_value(o).expect("JSON"))
    }

    /// Write a Gateway's `status.addresses` through the status subresource,
    /// as rivora-controller does once it has assigned them (from a pool:
    /// [`TestNs::pool_for`]).
    pub fn set_gateway_addresses(&self, gateway: &str, ips: &[IpAddr]) {
        self.pool_for(ips);
        let addresses: Vec<Value> = ips
            .iter()
            .map(|ip| json!({ "type": "IPAddress", "value": ip.to_string() }))
            .collect();
        let patch = json!({ "status": { "addresses": addresses } });
        self.kube
            .block_on(
                self.kube
                    .gateway_api(&self.name, "Gateway", "gateways")
                    .patch_status(gateway, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .unwrap_or_else(|e| {
                panic!(
                    "patching the status of Gateway {}/{gateway}: {e}",
                    self.name
                )
            });
    }

    /// The Events about object `name` (any kind) in this namespace:
    /// (type, reason, note), from events.k8s.io and the core API alike.
    pub fn events_about(&self, name: &str) -> Vec<(String, String, String)> {
        let k = &self.kube;
        let lp = ListParams::default();
        let mut out = Vec::new();
        let new: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(k.client.clone(), &self.name);
        for e in k
            .block_on(new.list(&lp))
            .unwrap_or_else(|e| panic!("listing the Events of {}: {e}", self.name))
        {
            if e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) {
                out.push((
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                ));
            }
        }
        let old: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(k.client.clone(), &self.name);
        for e in k
            .block_on(old.list(&lp))
            .unwrap_or_else(|e| panic!("listing the core Events of {}: {e}", self.name))
        {
            if e.involved_object.name.as_deref() == Some(name) {
                out.push((
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                ));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn cleanup(&self) -> Result<(), String> {
        let dp = DeleteParams::default();
        let lp = ListParams::default();
        let k = &self.kube;
        k.block_on(k.services(&self.name).delete_collection(&dp, &lp))
            .map_err(|e| format!("deleting the Services: {e}"))?;
        k.block_on(k.slices(&self.name).delete_collection(&dp, &lp))
            .map_err(|e| format!("deleting the EndpointSlices: {e}"))?;
        // CRD kinds: a server of a test's own may not have them (404).
        let absent_ok = |r: Result<(), kube::Error>, what: &str| match r {
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            r => r.map_err(|e| format!("deleting the {what}: {e}")),
        };
        absent_ok(
            k.block_on(k.policies(&self.name).delete_collection(&dp, &lp))
                .map(|_| ()),
            "ServicePolicies",
        )?;
        for (kind, plural) in GATEWAY_API_NAMESPACED {
            absent_ok(
                k.block_on(
                    k.gateway_api(&self.name, kind, plural)
                        .delete_collection(&dp, &lp),
                )
                .map(|_| ()),
                plural,
            )?;
        }
        let pools: Api<AddressPool> = Api::all(k.client.clone());
        absent_ok(
            k.block_on(pools.delete_collection(
                &dp,
                &ListParams::default().labels(&format!("{POOL_NAMESPACE_LABEL}={}", self.name)),
            ))
            .map(|_| ()),
            "AddressPools",
        )?;
        let api: Api<Namespace> = Api::all(k.client.clone());
        k.block_on(api.delete(&self.name, &dp))
            .map_err(|e| format!("deleting the namespace: {e}"))?;
        // No namespace controller: clear its finalizer, which deletes it.
        let mut ns = match k.block_on(api.get_opt(&self.name)) {
            Ok(Some(ns)) => ns,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("reading the namespace: {e}")),
        };
        if let Some(spec) = ns.spec.as_mut() {
            spec.finalizers = Some(Vec::new());
        }
        match k.block_on(api.replace_subresource(
            "finalize",
            &self.name,
            &PostParams::default(),
            &ns,
        )) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!("finalizing the namespace: {e}")),
        }
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        // Not a panic: this may run while the test is already unwinding.
        if let Err(e) = self.cleanup() {
            eprintln!("cleaning up Kubernetes namespace {}: {e}", self.name);
        }
    }
}

// ---------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------

/// One port of a Service and of its EndpointSlices: the Service's `port`,
/// the endpoints' `target`.
#[derive(Clone, Copy, Debug)]
pub struct SvcPort {
    pub name: &'static str,
    pub proto: &'static str,
    pub port: u16,
    pub target: u16,
}

pub fn tcp(port: u16, target: u16) -> SvcPort {
    SvcPort {
        name: "tcp",
        proto: "TCP",
        port,
        target,
    }
}

pub fn udp(port: u16, target: u16) -> SvcPort {
    SvcPort {
        name: "udp",
        proto: "UDP",
        port,
        target,
    }
}

/// A ClusterIP Service (what a route's backendRefs name), both families
/// when the cluster has them.
pub fn cluster_service(name: &str, ports: &[SvcPort]) -> Service {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| {
            json!({ "name": p.name, "protocol": p.proto, "port": p.port, "targetPort": p.target })
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "spec": { "ports": ports },
    }))
    .expect("a Service")
}

/// A GatewayClass of a unique name, deleted on drop (cluster-scoped:
/// no namespace takes it along).
pub struct TestGatewayClass {
    kube: Kube,
    pub name: String,
}

impl TestGatewayClass {
    pub fn new(kube: &Kube, controller: &str) -> Self {
        let name = unique("rivora-e2e-");
        let api: Api<DynamicObject> = Api::all_with(
            kube.client.clone(),
            &gateway_api_resource("GatewayClass", "gatewayclasses"),
        );
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": { "name": name },
            "spec": { "controllerName": controller },
        }))
        .expect("a GatewayClass");
        kube.block_on(api.create(&PostParams::default(), &obj))
            .unwrap_or_else(|e| panic!("creating GatewayClass {name}: {e}"));
        Self {
            kube: kube.clone(),
            name,
        }
    }
}

impl Drop for TestGatewayClass {
    fn drop(&mut self) {
        let api: Api<DynamicObject> = Api::all_with(
            self.kube.client.clone(),
            &gateway_api_resource("GatewayClass", "gatewayclasses"),
        );
        if let Err(e) = self
            .kube
            .block_on(api.delete(&self.name, &DeleteParams::default()))
        {
            eprintln!("deleting GatewayClass {}: {e}", self.name);
        }
    }
}

/// A LoadBalancer Service of Rivora's class; `spec` is merged into its
/// spec (externalTrafficPolicy, ipFamilyPolicy, ...).
pub fn lb_service(name: &str, ports: &[SvcPort], spec: Value) -> Service {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| {
            json!({ "name": p.name, "protocol": p.proto, "port": p.port, "targetPort": p.target })
        })
        .collect();
    let mut s = json!({
        "type": "LoadBalancer",
        "loadBalancerClass": LB_CLASS,
        "ports": ports,
    });
    if let (Some(base), Value::Object(extra)) = (s.as_object_mut(), spec) {
        base.extend(extra);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "spec": s,
    }))
    .expect("a Service")
}

/// One endpoint of an EndpointSlice with its conditions.
#[derive(Clone, Debug)]
pub struct Ep {
    pub addr: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node: Option<String>,
}

impl Ep {
    /// Ready and serving (a running Pod that passes its readiness probe).
    pub fn ready(addr: impl Into<IpAddr>) -> Self {
        Self {
            addr: addr.into(),
            ready: true,
            serving: true,
            terminating: false,
            node: None,
        }
    }

    /// Being deleted but still passing readiness: what the EndpointSlice
    /// controller writes for a Pod with a deletion timestamp.
    pub fn terminating(addr: impl Into<IpAddr>) -> Self {
        Self {
            ready: false,
            serving: true,
            terminating: true,
            ..Self::ready(addr)
        }
    }

    /// Failing readiness, not terminating.
    pub fn not_ready(addr: impl Into<IpAddr>) -> Self {
        Self {
            ready: false,
            serving: false,
            terminating: false,
            ..Self::ready(addr)
        }
    }

    pub fn on(self, node: &str) -> Self {
        Self {
            node: Some(node.to_string()),
            ..self
        }
    }
}

/// An EndpointSlice `name` of Service `service`: the family is the first
/// endpoint's (IPv4 when empty, unless `v6`), the ports the targets of
/// `ports`.
pub fn endpoint_slice(
    name: &str,
    service: &str,
    v6: bool,
    ports: &[SvcPort],
    endpoints: &[Ep],
) -> EndpointSlice {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|e| {
            assert_eq!(e.addr.is_ipv6(), v6, "an endpoint of the other family");
            let mut v = json!({
                "addresses": [e.addr.to_string()],
                "conditions": {
                    "ready": e.ready,
                    "serving": e.serving,
                    "terminating": e.terminating,
                },
            });
            if let Some(n) = &e.node {
                v["nodeName"] = json!(n);
            }
            v
        })
        .collect();
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({ "name": p.name, "protocol": p.proto, "port": p.target }))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "endpoints": eps,
        "ports": ports,
    }))
    .expect("an EndpointSlice")
}

// ---------------------------------------------------------------------
// A kubeconfig and identities for rivorad
// ---------------------------------------------------------------------

/// A client identity: certificate and key signed by the test CA.
#[derive(Clone, Debug)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Identity {
    /// The shared server's `system:masters` admin.
    pub fn admin() -> Self {
        let s = &shared().server;
        Self {
            cert: s.client_cert.clone(),
            key: s.client_key.clone(),
        }
    }

    /// A user `user` (in no group but system:authenticated) with a
    /// certificate made in `dir`: RBAC gives it only what is bound to it.
    pub fn user(dir: &Path, user: &str) -> Self {
        let s = &shared().server;
        let (key, csr, cert) = (
            dir.join(format!("{user}.key")),
            dir.join(format!("{user}.csr")),
            dir.join(format!("{user}.crt")),
        );
        let ext = dir.join(format!("{user}.ext"));
        std::fs::write(&ext, "extendedKeyUsage=clientAuth\n").expect("writing the cert extension");
        // A random serial: -CAcreateserial would write beside the CA, in
        // the shared server's directory.
        let serial = format!(
            "0x{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos()
        );
        for args in [
            vec![
                "req".into(),
                "-newkey".into(),
                "rsa:2048".into(),
                "-nodes".into(),
                "-subj".into(),
                format!("/CN={user}"),
                "-keyout".into(),
                key.display().to_string(),
                "-out".into(),
                csr.display().to_string(),
            ],
            vec![
                "x509".into(),
                "-req".into(),
                "-in".into(),
                csr.display().to_string(),
                "-CA".into(),
                s.ca_cert.display().to_string(),
                "-CAkey".into(),
                s.dir.join("ca.key").display().to_string(),
                "-set_serial".into(),
                serial,
                "-days".into(),
                "1".into(),
                "-extfile".into(),
                ext.display().to_string(),
                "-out".into(),
                cert.display().to_string(),
            ],
        ] {
            let out = Command::new("openssl")
                .args(&args)
                .output()
                .expect("running openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self { cert, key }
    }
}

/// Write a kubeconfig for `server` (an https URL) as `who`.
pub fn write_kubeconfig(path: &Path, server: &str, who: &Identity) {
    write_kubeconfig_with(path, server, &shared().server.ca_cert, who);
}

/// [`write_kubeconfig`] for a server of another CA (an [`ApiServer`] of
/// the test's own).
pub fn write_kubeconfig_with(path: &Path, server: &str, ca: &Path, who: &Identity) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: rivora-test\n  cluster:\n    \
         server: {server}\n    certificate-authority: {}\nusers:\n- name: rivorad\n  user:\n    \
         client-certificate: {}\n    client-key: {}\ncontexts:\n- name: rivora-test\n  context:\n    \
         cluster: rivora-test\n    user: rivorad\ncurrent-context: rivora-test\n",
        ca.display(),
        who.cert.display(),
        who.key.display()
    );
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// The RBAC of one rivorad identity: a ClusterRole and its binding per
/// grant, all deleted on drop.
pub struct Rbac {
    kube: Kube,
    user: String,
    /// (ClusterRole = ClusterRoleBinding name) per grant.
    names: Mutex<BTreeMap<&'static str, String>>,
}

impl Rbac {
    pub fn new(kube: &Kube, user: &str) -> Self {
        Self {
            kube: kube.clone(),
            user: user.to_string(),
            names: Mutex::new(BTreeMap::new()),
        }
    }

    /// Bind `rules` (RBAC PolicyRules as JSON) to the user, under `grant`.
    pub fn grant(&self, grant: &'static str, rules: Value) {
        let name = unique(&format!("rivora-e2e-{grant}-"));
        let role: ClusterRole = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": { "name": name },
            "rules": rules,
        }))
        .expect("a ClusterRole");
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": self.user }],
        }))
        .expect("a ClusterRoleBinding");
        let k = &self.kube;
        let roles: Api<ClusterRole> = Api::all(k.client.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(k.client.clone());
        k.block_on(roles.create(&PostParams::default(), &role))
            .unwrap_or_else(|e| panic!("creating ClusterRole {name}: {e}"));
        self.names.lock().expect("rbac").insert(grant, name.clone());
        k.block_on(bindings.create(&PostParams::default(), &binding))
            .unwrap_or_else(|e| panic!("creating ClusterRoleBinding {name}: {e}"));
    }

    /// Remove what `grant` bound.
    pub fn revoke(&self, grant: &'static str) {
        let name = self
            .names
            .lock()
            .expect("rbac")
            .remove(grant)
            .unwrap_or_else(|| panic!("nothing granted as {grant}"));
        self.delete(&name).unwrap_or_else(|e| panic!("{e}"));
    }

    fn delete(&self, name: &str) -> Result<(), String> {
        let k = &self.kube;
        let dp = DeleteParams::default();
        let bindings: Api<ClusterRoleBinding> = Api::all(k.client.clone());
        let roles: Api<ClusterRole> = Api::all(k.client.clone());
        for r in [
            k.block_on(bindings.delete(name, &dp)).map(|_| ()),
            k.block_on(roles.delete(name, &dp)).map(|_| ()),
        ] {
            match r {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(format!("deleting RBAC {name}: {e}")),
            }
        }
        Ok(())
    }

    /// Whether the API server lets the user `verb` `resource` (of `group`)
    /// now, by a SubjectAccessReview: RBAC changes reach the authorizer a
    /// moment after they are written.
    pub fn allowed(&self, verb: &str, group: &str, resource: &str) -> bool {
        let review = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": self.user,
                "groups": ["system:authenticated"],
                "resourceAttributes": { "verb": verb, "group": group, "resource": resource },
            },
        });
        let review: SubjectAccessReview =
            serde_json::from_value(review).expect("a SubjectAccessReview");
        let api: Api<SubjectAccessReview> = Api::all(self.kube.client.clone());
        let got = self
            .kube
            .block_on(api.create(&PostParams::default(), &review))
            .unwrap_or_else(|e| panic!("SubjectAccessReview: {e}"));
        got.status.is_some_and(|s| s.allowed)
    }

    /// Wait (10 s at most) until the API server's authorizer answers
    /// `allowed` for `verb` on `group/resource`: a grant or a revoke takes
    /// a moment to reach it.
    pub fn wait_until(&self, allowed: bool, verb: &str, group: &str, resource: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.allowed(verb, group, resource) != allowed {
            assert!(
                std::time::Instant::now() < deadline,
                "{} is still {} to {verb} {group}/{resource} after 10 s",
                self.user,
                if allowed { "not allowed" } else { "allowed" }
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Rbac {
    fn drop(&mut self) {
        let names: Vec<String> = std::mem::take(&mut *self.names.lock().expect("rbac"))
            .into_values()
            .collect();
        for n in names {
            if let Err(e) = self.delete(&n) {
                eprintln!("{e}");
            }
        }
    }
}

// ---------------------------------------------------------------------
// The proxy into a node namespace
// ---------------------------------------------------------------------

/// What the proxy does with rivorad's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiState {
    /// Forwards both ways.
    Up,
    /// Accepts, but forwards nothing either way: a stopped (SIGSTOP) API
    /// server, whose kernel still accepts. Connections held meanwhile are
    /// served once it is up again.
    Hung,
    /// Resets every connection, and every new one at once: a dead server.
    Down,
}

impl ApiState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Up,
            1 => Self::Hung,
            _ => Self::Down,
        }
    }
}

/// A TCP proxy listening on 127.0.0.1 in a namespace, forwarding to the
/// API server; its threads stop and are joined on drop.
pub struct ApiProxy {
    /// Where it listens, in the namespace.
    pub addr: SocketAddr,
    state: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    acceptor: Option<JoinHandle<()>>,
}

fn poll_in(fds: &[i32], ms: i32) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid array of pollfds.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter()
        .map(|x| x.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect()
}

/// Close with a reset (SO_LINGER 0), as a dead peer's kernel answers.
fn reset(s: TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt with a valid linger struct on an open socket.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        );
    }
    drop(s);
}

impl ApiProxy {
    pub fn start(ns: &Netns, upstream: SocketAddr) -> Self {
        let listener = spawn_in(ns, || TcpListener::bind("127.0.0.1:0"))
            .join()
            .expect("the proxy's bind thread")
            .expect("binding the API proxy on 127.0.0.1 in the node");
        Self::serve(listener, upstream)
    }

    /// A proxy in the test's own namespace: for a client of this process
    /// whose API server should hang or die alone.
    pub fn start_here(upstream: SocketAddr) -> Self {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("binding the API proxy on 127.0.0.1");
        Self::serve(listener, upstream)
    }

    fn serve(listener: TcpListener, upstream: SocketAddr) -> Self {
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(AtomicU8::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let acceptor = {
            let (state, stop, accepted, conns) =
                (state.clone(), stop.clone(), accepted.clone(), conns.clone());
            // A thread of the test's own namespace: it connects upstream.
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if !poll_in(&[listener.as_raw_fd()], 50)[0] {
                        continue;
                    }
                    let Ok((s, _)) = listener.accept() else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::Relaxed);
                    if ApiState::from_u8(state.load(Ordering::Relaxed)) == ApiState::Down {
                        reset(s);
                        continue;
                    }
                    let (state, stop) = (state.clone(), stop.clone());
                    let h = std::thread::spawn(move || pump(s, upstream, &state, &stop));
                    let mut c = conns.lock().expect("proxy conns");
                    c.retain(|h| !h.is_finished());
                    c.push(h);
                }
            })
        };
        Self {
            addr,
            state,
            stop,
            accepted,
            conns,
            acceptor: Some(acceptor),
        }
    }

    pub fn set(&self, s: ApiState) {
        let v = match s {
            ApiState::Up => 0,
            ApiState::Hung => 1,
            ApiState::Down => 2,
        };
        self.state.store(v, Ordering::Relaxed);
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// The API server's URL as seen from the namespace.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

/// One proxied connection, until either side closes, the proxy goes down
/// or stops.
fn pump(client: TcpStream, upstream: SocketAddr, state: &AtomicU8, stop: &AtomicBool) {
    let now = || ApiState::from_u8(state.load(Ordering::Relaxed));
    // Accepted while hung: held unanswered, served once up.
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match now() {
            ApiState::Up => break,
            ApiState::Hung => std::thread::sleep(Duration::from_millis(20)),
            ApiState::Down => return reset(client),
        }
    }
    let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
        return reset(client);
    };
    for s in [&client, &up] {
        let _ = s.set_nodelay(true);
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    }
    let (mut a, mut b) = (client, up);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match now() {
            ApiState::Up => {}
            ApiState::Hung => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            ApiState::Down => {
                reset(a);
                reset(b);
                return;
            }
        }
        let ready = poll_in(&[a.as_raw_fd(), b.as_raw_fd()], 50);
        for (i, r) in ready.into_iter().enumerate() {
            if !r {
                continue;
            }
            let (from, to) = if i == 0 {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        let conns = std::mem::take(&mut *self.conns.lock().expect("proxy conns"));
        for h in conns {
            let _ = h.join();
        }
    }
}
