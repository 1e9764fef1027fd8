//! End to end with `rivorad -kubernetes`: a real kube-apiserver and etcd
//! (one per test process, shared: `common::k8s::shared`), the real rivorad
//! in the node namespace of a lab (`common::topology`: client, node, three
//! backends on one switch), reaching the API server through a proxy in
//! that namespace (`common::k8s::ApiProxy`), which a test can hang or take
//! down for its own rivorad alone. The tests write what the cluster's
//! controllers would: `status.loadBalancer.ingress` through the status
//! subresource (rivora-controller's job; rivorad never writes it) and the
//! EndpointSlices (the EndpointSlice controller's; no controller-manager
//! runs). Nothing fills a map on the node: what forwards is what rivorad
//! made of the API's objects.
//!
//! Scenarios, one test each so that they run in parallel, each in its own
//! Kubernetes namespace (emptied and deleted at the end, so that the other
//! tests' rivorads, which watch every namespace, stop programming it) and
//! its own network namespaces:
//! - a LoadBalancer Service with a TCP and a UDP port and an EndpointSlice
//!   of three ready endpoints: `vip list` shows both VIPs, NAT, the three
//!   backends; TCP and UDP through the VIP reach every backend
//!   (`service_tcp_and_udp_reach_every_backend`);
//! - endpoints scaled up and down under a loop of new connections: none
//!   fails, the added backend takes connections, the removed one none after
//!   it went (`scaling_endpoints_under_traffic_fails_no_connection`);
//! - an endpoint marked terminating (serving): its long-lived connection
//!   goes on exchanging data after the change, new connections go to the
//!   others (`terminating_endpoint_keeps_its_connection`);
//! - every endpoint terminating but serving: they take new connections
//!   (KEP-1669); one ready again, the others drain
//!   (`every_endpoint_terminating_still_answers`);
//! - a Service whose status names the node's own address: refused and
//!   not captured (`a_service_may_not_capture_the_nodes_own_address`);
//! - a Service whose status names an address no AddressPool holds: not
//!   served until a pool holds it, and not again once the pool is gone
//!   (`an_address_in_no_pool_is_not_served`);
//! - a deleted Service: its VIPs leave `vip list` and are no longer
//!   answered (`deleted_service_loses_its_vips`);
//! - a ServicePolicy switches a Service from NAT to DSR: `vip list` says
//!   dsr and the backends now see the requests addressed to the VIP
//!   (`service_policy_switches_the_service_to_dsr`); policies the CRD
//!   schema refuses are refused by the API server with its message
//!   (`invalid_service_policies_are_refused_by_the_api_server`);
//! - restarts (with -persist-datapath) while the API server is stopped
//!   (hung) or dead (resets): nothing pruned, the adopted VIPs forward;
//!   then a start with the API reachable but the ServicePolicy watch
//!   forbidden (RBAC): no first pass, so nothing is sent or pruned and the
//!   leftover VIP of a Service deleted meanwhile still forwards; once the
//!   policies can be listed, the pass reconciles the Service and prunes
//!   the leftover; the Service's VIP forwards throughout
//!   (`restarts_without_the_api_prune_nothing_and_leftovers_go_after_the_first_pass`);
//! - a dual-stack Service: an IPv4 and an IPv6 VIP per port, traffic on
//!   both (`dual_stack_service_gets_a_vip_per_family`);
//! - externalTrafficPolicy Local: only this node's endpoints
//!   (`local_traffic_policy_keeps_this_nodes_endpoints`);
//! - `-config` with VIPs and `-kubernetes`: refused at start
//!   (`static_vips_and_kubernetes_are_refused_together`);
//! - the Gateway API CRDs the chart ships install, serve every version
//!   rivorad reads and read back as the generated types
//!   (`gateway_api_crds_install_and_read_as_the_generated_types`);
//! - a Gateway with a TCP and a UDP listener: routes in two namespaces
//!   (one admitted by a Selector, one refused), a cross-namespace
//!   backendRef without and with a ReferenceGrant, weights 1:3 in the
//!   spread of 2,000 connections, IPv4 and IPv6, a listener's route
//!   deleted under traffic to the other
//!   (`gateway_listeners_routes_grants_and_weights`);
//! - ServicePolicies on Gateway listeners: DSR and a health check on one,
//!   a SYN limit on another, DSR refused where the backends' port differs
//!   (`service_policy_sets_a_gateway_listeners_mode_limit_and_health_check`);
//! - adopted Gateway VIPs pruned only after the Gateway half's first pass
//!   (`gateway_vips_are_pruned_only_after_the_gateway_pass`);
//! - the status rivora-controller is to write, computed by rivora-k8s from
//!   the objects as stored, written through the CRDs' status subresources
//!   and read back field by field; read again, nothing more to write
//!   (`gateway_status_as_computed_is_what_the_crds_accept`), and the same
//!   objects' status as the real rivora-controller writes it, on an API
//!   server of the test's own: every field as the specification names
//!   it, nothing rewritten while nothing changes, a ReferenceGrant
//!   flipping ResolvedRefs
//!   (`the_controller_writes_every_gateway_status_field_by_field`);
//! - a Gateway listener whose VIP a Service holds: the Service keeps it,
//!   the Gateway gets a Warning Event
//!   (`a_gateway_refused_by_the_dataplane_gets_an_event`);
//! - an API server without the Gateway API CRDs: the watches say so,
//!   sync empty and warn once; installed later, a Gateway forwards
//!   (`without_the_gateway_api_crds_the_watches_say_so_and_gateways_come_once_installed`);
//! - the whole path: a Service created as a user writes it (no address)
//!   gets its IPv4 and IPv6 addresses from the real rivora-controller and
//!   an AddressPool, and TCP and UDP through both reach every backend
//!   (`a_service_gets_its_address_from_the_controller_and_forwards`).
//!
//! Every rivorad runs in an RAII guard (SIGTERM, then SIGKILL; its pins and
//! files removed; its log printed if the test panics), every wait has a
//! deadline, every client step a timeout. Needs root.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::k8s::{
    cluster_service, endpoint_slice, lb_service, shared, tcp, udp, write_kubeconfig_with, ApiProxy,
    ApiState, Ep, Identity, Kube, Rbac, SvcPort, TestGatewayClass, TestNs,
};
use common::netns::{spawn_in, Netns};
use common::rivorad::{attached, rivorad_bin, Home, Rivorad};
use common::topology::{Mode, Topology, NAT_BACKEND_PORT, VIP_PORT};
use common::traffic::{canonical, exchanges, long_lived, tcp_once, wait_for, Hit, Proto, Servers};
use common::unique;
use rivora::dataplane::render::MatchKey;
use rivora::dataplane::{MapStore, Maps};
use serde_json::{json, Value};

/// Connections (TCP) or exchanges (UDP) per spread measurement.
const FLOWS: usize = 120;
/// A broken path fails within this per step (connect, reply).
const STEP: Duration = Duration::from_secs(2);
/// Each serving backend takes at least this share: with a fair 1-in-3
/// split of 120 flows, a count is Binomial(120, 1/3), mean 40, standard
/// deviation 5.2; 15% is 18, 4.3 deviations under the mean (P = 1.6e-6 per
/// check).
const MIN_SHARE: f64 = 0.15;
/// An API change to the maps: a watch event, the translation, the write;
/// on two cores shared with the other tests and the API server.
const PROGRAMMED: Duration = Duration::from_secs(20);
/// How long a test watches for something that must not happen (a prune).
const HOLD: Duration = Duration::from_secs(4);

// ---------------------------------------------------------------------
// One test's world
// ---------------------------------------------------------------------

/// A lab, its backends' servers, a Kubernetes namespace, the proxy to the
/// API server in the node and rivorad -kubernetes there. Dropped in
/// declaration order: rivorad first (its log shown if the test failed),
/// then the proxy, the Kubernetes objects, the servers, the namespaces.
struct World {
    rd: Rivorad,
    proxy: ApiProxy,
    k8s: TestNs,
    _servers: Servers,
    topo: Topology,
    /// rivorad's -node-name.
    node: String,
    /// Whether the slices name the backends as hosts on no node (a
    /// selectorless Service's hand-written endpoints) rather than as pods
    /// on this node: DSR reaches a host by DSR itself, a pod by NAT.
    hosts: bool,
}

impl World {
    /// rivorad -kubernetes as the admin, with `extra` flags on its first
    /// run.
    fn new(topo: Topology, servers: Servers, extra: &[&str]) -> Self {
        Self::as_identity(topo, servers, None, extra)
    }

    /// With `who` (a certificate in the home, made by the caller) instead
    /// of the admin.
    fn as_identity(
        topo: Topology,
        servers: Servers,
        who: Option<(Home, Identity)>,
        extra: &[&str],
    ) -> Self {
        let s = shared();
        Self::on_server(
            topo,
            servers,
            (&Kube::admin(), s.addr, &s.server.ca_cert),
            who,
            extra,
        )
    }

    /// On an API server of the test's own: its admin client, address
    /// and CA.
    fn on_server(
        topo: Topology,
        servers: Servers,
        (kube, addr, ca): (&Kube, SocketAddr, &Path),
        who: Option<(Home, Identity)>,
        extra: &[&str],
    ) -> Self {
        let k8s = kube.namespace("e2ek-");
        let proxy = ApiProxy::start(&topo.node, addr);
        let (home, id) = match who {
            Some((h, id)) => (h, id),
            None => (Home::new(), Identity::admin()),
        };
        let kubeconfig = home.path("kubeconfig");
        write_kubeconfig_with(&kubeconfig, &proxy.url(), ca, &id);
        let node = unique("node-");
        let yaml = home.node_config("n0", topo.node_v4, topo.node_v6);
        let rd = Rivorad::start_kubernetes(&topo.node, home, &yaml, &kubeconfig, &node, extra);
        Self {
            rd,
            proxy,
            k8s,
            _servers: servers,
            topo,
            node,
            hosts: false,
        }
    }

    /// The backends are hosts holding the VIP, not pods: see `hosts`.
    fn hosts(self) -> Self {
        Self {
            hosts: true,
            ..self
        }
    }

    /// Service `name` on `vips` (its ingress addresses) with `ports`, and
    /// one EndpointSlice per family holding `backends` (indexes into the
    /// lab's), ready and on this node.
    fn service(&self, name: &str, vips: &[IpAddr], ports: &[SvcPort], backends: &[usize]) {
        self.k8s.create_service(&lb_service(name, ports, json!({})));
        self.k8s.set_ingress(name, vips);
        self.slices(name, vips, ports, backends, &[]);
    }

    /// Write Service `name`'s EndpointSlices (one per family of `vips`):
    /// `ready` endpoints ready, `terminating` ones terminating.
    fn slices(
        &self,
        name: &str,
        vips: &[IpAddr],
        ports: &[SvcPort],
        ready: &[usize],
        terminating: &[usize],
    ) {
        self.slices_in(&self.k8s, name, vips, ports, ready, terminating);
    }

    /// [`World::slices`] for a Service of another namespace.
    fn slices_in(
        &self,
        k8s: &TestNs,
        name: &str,
        vips: &[IpAddr],
        ports: &[SvcPort],
        ready: &[usize],
        terminating: &[usize],
    ) {
        for v6 in [false, true] {
            if !vips.iter().any(|v| v.is_ipv6() == v6) {
                continue;
            }
            let addr = |i: usize| -> IpAddr {
                let b = &self.topo.backends[i];
                if v6 {
                    b.v6.into()
                } else {
                    b.v4.into()
                }
            };
            let mut eps: Vec<Ep> = ready.iter().map(|&i| Ep::ready(addr(i))).collect();
            eps.extend(terminating.iter().map(|&i| Ep::terminating(addr(i))));
            let eps: Vec<Ep> = eps
                .into_iter()
                .map(|e| if self.hosts { e } else { e.on(&self.node) })
                .collect();
            let slice = format!("{name}-v{}", if v6 { 6 } else { 4 });
            k8s.apply_slice(&endpoint_slice(&slice, name, v6, ports, &eps));
        }
    }

    /// Backend `i`'s target under NAT: its address and the NAT port.
    fn target(&self, i: usize, v6: bool) -> SocketAddr {
        let b = &self.topo.backends[i];
        let a: IpAddr = if v6 { b.v6.into() } else { b.v4.into() };
        SocketAddr::new(a, NAT_BACKEND_PORT)
    }

    fn targets(&self, idx: &[usize], v6: bool) -> BTreeSet<String> {
        idx.iter()
            .map(|&i| self.target(i, v6).to_string())
            .collect()
    }
}

// ---------------------------------------------------------------------
// rivorad's VIPs, as `rivoractl vip list` shows them
// ---------------------------------------------------------------------

/// The API's name of a VIP (`tcp/10.0.0.1:80`).
fn vip_name(proto: &str, vip: SocketAddr) -> String {
    format!("{proto}/{vip}")
}

fn sa(addr: impl Into<IpAddr>) -> SocketAddr {
    SocketAddr::new(addr.into(), VIP_PORT)
}

/// The VIPs rivorad shows on `addrs`, by name: every rivorad watches every
/// namespace, so it also programs the other tests' Services, on their
/// labs' addresses.
fn vips_on(rd: &Rivorad, addrs: &[IpAddr]) -> BTreeMap<String, Value> {
    rd.ctl_json(&["vip", "list"])
        .as_array()
        .expect("vip list is an array")
        .iter()
        .filter(|v| {
            v["addr"]
                .as_str()
                .and_then(|a| a.parse::<IpAddr>().ok())
                .is_some_and(|a| addrs.contains(&a))
        })
        .map(|v| (v["vip"].as_str().expect("vip name").to_string(), v.clone()))
        .collect()
}

/// A VIP's backends: target -> weight.
fn weights(v: &Value) -> BTreeMap<String, u64> {
    v["backends"]
        .as_array()
        .unwrap_or_else(|| panic!("no backends in {v}"))
        .iter()
        .map(|b| {
            (
                b["target"].as_str().expect("target").to_string(),
                b["weight"].as_u64().expect("weight"),
            )
        })
        .collect()
}

/// The backends (`addr:port`) in the Maglev slice of TCP VIP `vip` as
/// the pinned maps hold it; None when the maps hold no such VIP. Read from
/// the maps, not the API: an adopted VIP no source has claimed forwards
/// but is not in `vip list`.
fn tcp_in_maps(pins: &Path, vip: SocketAddr) -> Option<BTreeSet<String>> {
    let img = Maps::open(pins)
        .and_then(|m| m.read())
        .expect("reading the pinned maps");
    let key = MatchKey::Exact {
        addr: vip.ip(),
        port: vip.port(),
        proto: libc::IPPROTO_TCP as u8,
    };
    let svc = img.matches.get(&key)?;
    let entry = img.services.get(svc)?;
    Some(
        img.slice_of(entry)
            .iter()
            .filter_map(|id| img.backends.get(id))
            .map(|b| SocketAddr::new(b.addr, b.port).to_string())
            .collect(),
    )
}

/// Whether `name` is in `vips` with exactly `serving` (weight > 0) and
/// `draining` (weight 0) as backends.
fn has(
    vips: &BTreeMap<String, Value>,
    name: &str,
    serving: &BTreeSet<String>,
    draining: &BTreeSet<String>,
) -> bool {
    let Some(v) = vips.get(name) else {
        return false;
    };
    let w = weights(v);
    let up: BTreeSet<String> = w
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(t, _)| t.clone())
        .collect();
    let zero: BTreeSet<String> = w
        .iter()
        .filter(|(_, &n)| n == 0)
        .map(|(t, _)| t.clone())
        .collect();
    up == *serving && zero == *draining
}

/// Poll `vip list` until `ok` holds for the VIPs on `addrs`; returns them
/// and when it first held. Panics with the last list after `limit`.
fn wait_vips(
    rd: &Rivorad,
    what: &str,
    addrs: &[IpAddr],
    limit: Duration,
    ok: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> (BTreeMap<String, Value>, Instant) {
    let t0 = Instant::now();
    let mut last = BTreeMap::new();
    let got = wait_for(limit, Duration::from_millis(50), || {
        last = vips_on(rd, addrs);
        ok(&last).then(|| (last.clone(), Instant::now()))
    });
    got.unwrap_or_else(|| {
        panic!(
            "{what}: not so within {limit:?}; vip list on {addrs:?}:\n{}",
            serde_json::to_string_pretty(&last).unwrap_or_default()
        )
    })
    .tap(|_| eprintln!("{what}: after {:?}", t0.elapsed()))
}

/// `tap` for a value on its way out.
trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&Self)) -> Self {
        f(&self);
        self
    }
}

impl<T> Tap for T {}

// ---------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------

/// `FLOWS` exchanges must all succeed, each backend in `serving` must take
/// a fair share and every other backend none; the backend must have seen
/// the client's own address. Returns every answer.
fn assert_spread(
    topo: &Topology,
    what: &str,
    vip: SocketAddr,
    proto: Proto,
    serving: &[usize],
) -> Vec<Hit> {
    assert_spread_from(topo, what, vip, proto, serving, None)
}

/// [`assert_spread`], the backend having seen the request from `source`
/// (full NAT's source address) when it is given, else from the client.
fn assert_spread_from(
    topo: &Topology,
    what: &str,
    vip: SocketAddr,
    proto: Proto,
    serving: &[usize],
    source: Option<IpAddr>,
) -> Vec<Hit> {
    let t0 = Instant::now();
    let results = exchanges(&topo.client, vip, proto, FLOWS, STEP);
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{what}: {proto:?} to {vip}: {} of {} failed (after {:?}); first: {:?}",
        failures.len(),
        results.len(),
        t0.elapsed(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(results.len(), FLOWS, "{what}: every flow ran");
    let hits: Vec<Hit> = results.into_iter().flatten().collect();
    let mut counts: BTreeMap<String, usize> =
        topo.backends.iter().map(|b| (b.name.clone(), 0)).collect();
    for h in &hits {
        match source {
            None => assert_eq!(
                h.peer,
                canonical(h.me),
                "{what}: backend {} did not see the client's own address",
                h.backend
            ),
            Some(src) => assert_eq!(
                h.peer.ip(),
                src,
                "{what}: backend {} did not see full NAT's source (client {})",
                h.backend,
                h.me
            ),
        }
        *counts
            .get_mut(&h.backend)
            .unwrap_or_else(|| panic!("{what}: answer from unknown backend {h:?}")) += 1;
    }
    let min = (MIN_SHARE * FLOWS as f64).ceil() as usize;
    for (i, b) in topo.backends.iter().enumerate() {
        let n = counts[&b.name];
        if serving.contains(&i) {
            assert!(
                n >= min,
                "{what}: {proto:?} to {vip}: {} got {n} of {FLOWS}, below {min}; spread {counts:?}",
                b.name
            );
        } else {
            assert_eq!(
                n, 0,
                "{what}: {proto:?} to {vip}: {} is not serving but got {n}; spread {counts:?}",
                b.name
            );
        }
    }
    hits
}

/// Nothing answers `vip` any more: a TCP and a UDP exchange both fail.
fn assert_unanswered(topo: &Topology, what: &str, vip: SocketAddr, protos: &[Proto]) {
    for &p in protos {
        let r = exchanges(&topo.client, vip, p, 1, STEP);
        assert!(
            r.iter().all(|r| r.is_err()),
            "{what}: {p:?} to {vip} still answered: {r:?}"
        );
    }
}

/// One connection of the background load.
#[derive(Debug)]
struct Attempt {
    start: Instant,
    result: Result<String, String>,
}

/// New TCP connections to a VIP from the client, one every 10 ms, until
/// stopped; every attempt recorded.
struct Load {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Attempt>>>,
    handle: Option<JoinHandle<()>>,
}

impl Load {
    fn start(client: &Netns, vip: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let handle = {
            let (stop, log) = (stop.clone(), log.clone());
            spawn_in(client, move || {
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let result = tcp_once(vip, STEP).map(|h| h.backend);
                    log.lock()
                        .expect("attempts")
                        .push(Attempt { start, result });
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        Self {
            stop,
            log,
            handle: Some(handle),
        }
    }

    /// Attempts started at or after `since`: (all, answered by `backend`).
    fn count(&self, since: Instant, backend: &str) -> (usize, usize) {
        let log = self.log.lock().expect("attempts");
        let after: Vec<&Attempt> = log.iter().filter(|a| a.start >= since).collect();
        let to = after
            .iter()
            .filter(|a| a.result.as_deref() == Ok(backend))
            .count();
        (after.len(), to)
    }

    /// Wait until `n` attempts started at or after `since`.
    fn wait(&self, what: &str, since: Instant, n: usize) {
        let done = wait_for(Duration::from_secs(30), Duration::from_millis(10), || {
            (self.count(since, "").0 >= n).then_some(())
        });
        assert!(
            done.is_some(),
            "{what}: {n} connections did not start within 30 s"
        );
    }

    /// Stop, and every attempt made.
    fn finish(mut self) -> Vec<Attempt> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().expect("the load thread");
        }
        std::mem::take(&mut *self.log.lock().expect("attempts"))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// No attempt failed; the failures listed with their start relative to
/// `t0` otherwise.
fn assert_no_failure(what: &str, attempts: &[Attempt], t0: Instant) {
    let failed: Vec<(Duration, &String)> = attempts
        .iter()
        .filter_map(|a| {
            a.result
                .as_ref()
                .err()
                .map(|e| (a.start.saturating_duration_since(t0), e))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{what}: {} of {} connections failed; first (start after the test began, error): {:?}",
        failed.len(),
        attempts.len(),
        &failed[..failed.len().min(5)]
    );
}

// ---------------------------------------------------------------------
// 1. A Service and its endpoints: TCP and UDP reach every backend
// ---------------------------------------------------------------------

fn nat_ports() -> [SvcPort; 2] {
    [
        tcp(VIP_PORT, NAT_BACKEND_PORT),
        udp(VIP_PORT, NAT_BACKEND_PORT),
    ]
}

#[test]
fn service_tcp_and_udp_reach_every_backend() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    w.service("web", &v, &nat_ports(), &[0, 1, 2]);
    let (tcp4, udp4) = (vip_name("tcp", sa(t.vip4)), vip_name("udp", sa(t.vip4)));
    let all = w.targets(&[0, 1, 2], false);
    let none = BTreeSet::new();
    let (vips, _) = wait_vips(&w.rd, "web programmed", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &all, &none) && has(m, &udp4, &all, &none)
    });
    assert_eq!(
        vips.keys().collect::<Vec<_>>(),
        [&tcp4, &udp4],
        "one VIP per (ingress address, port, protocol), nothing else on the address"
    );
    for (name, vip) in &vips {
        assert_eq!(vip["mode"], "nat", "{name}: {vip}");
        assert_eq!(vip["affinity"], "none", "{name}: {vip}");
        for b in vip["backends"].as_array().expect("backends") {
            assert_eq!(b["health"], "healthy", "{name}: {b}");
            assert_eq!(b["drained"], false, "{name}: {b}");
        }
    }

    let all_idx = [0, 1, 2];
    assert_spread(t, "web", sa(t.vip4), Proto::Tcp, &all_idx);
    assert_spread(t, "web", sa(t.vip4), Proto::Udp, &all_idx);
    // rivorad's own counters saw it: every UDP request once.
    let udp_packets = vips_on(&w.rd, &v)[&udp4]["packets"]
        .as_u64()
        .expect("packets");
    assert_eq!(udp_packets, FLOWS as u64, "UDP packets counted for {udp4}");
}

// ---------------------------------------------------------------------
// 2. Scaling under a loop of new connections
// ---------------------------------------------------------------------

/// Up: an endpoint added to the slice. Down, as the EndpointSlice
/// controller shows a Pod being deleted: first terminating (still
/// serving: no new connections, the ones it has go on), then gone from the
/// slice once the Pod is. Through both, no connection of the loop fails.
#[test]
fn scaling_endpoints_under_traffic_fails_no_connection() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    let tcp4 = vip_name("tcp", sa(t.vip4));
    let none = BTreeSet::new();
    w.service("web", &v, &ports, &[0, 1]);
    wait_vips(&w.rd, "b1 b2", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[0, 1], false), &none)
    });
    let (b1, b3) = (t.backends[0].name.clone(), t.backends[2].name.clone());

    let t0 = Instant::now();
    let load = Load::start(&t.client, sa(t.vip4));
    load.wait("before scaling", t0, 20);

    // Up: b3 added.
    w.slices("web", &v, &ports, &[0, 1, 2], &[]);
    let (_, up) = wait_vips(&w.rd, "scaled up: b1 b2 b3", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[0, 1, 2], false), &none)
    });
    let reached = wait_for(Duration::from_secs(20), Duration::from_millis(10), || {
        (load.count(up, &b3).1 >= 5).then_some(())
    });
    assert!(
        reached.is_some(),
        "the added backend {b3} took {} of {} connections in 20 s",
        load.count(up, &b3).1,
        load.count(up, &b3).0
    );

    // Down: b1 terminating, then gone.
    w.slices("web", &v, &ports, &[1, 2], &[0]);
    let (_, drained) = wait_vips(&w.rd, "b1 terminating", &v, PROGRAMMED, |m| {
        has(
            m,
            &tcp4,
            &w.targets(&[1, 2], false),
            &w.targets(&[0], false),
        )
    });
    load.wait("b1 terminating", drained, 30);
    w.slices("web", &v, &ports, &[1, 2], &[]);
    let (_, removed) = wait_vips(&w.rd, "scaled down: b2 b3", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[1, 2], false), &none)
    });
    load.wait("scaled down", removed, 40);
    let attempts = load.finish();

    assert_no_failure("scaling up and down", &attempts, t0);
    let after = |since: Instant, who: &str| {
        attempts
            .iter()
            .filter(|a| a.start >= since && a.result.as_deref() == Ok(who))
            .count()
    };
    assert_eq!(
        after(drained, &b1),
        0,
        "{b1} took new connections after it was terminating in the maps"
    );
    let last: Vec<&Attempt> = attempts.iter().filter(|a| a.start >= removed).collect();
    for i in [1, 2] {
        let name = &t.backends[i].name;
        let n = last
            .iter()
            .filter(|a| a.result.as_deref() == Ok(name.as_str()))
            .count();
        // Binomial(40+, 1/2): under 5 is 4.7 deviations away.
        assert!(
            n >= 5,
            "{name} took {n} of the {} connections after the scale-down",
            last.len()
        );
    }
    eprintln!("{} connections, none failed", attempts.len());
}

/// Every endpoint terminating but still serving (a rollout that ends the
/// old pods before a new one is ready): they take new connections, as
/// KEP-1669 has kube-proxy do, instead of none at all. Once one endpoint
/// is ready again, the terminating ones drain (weight 0, no new flow).
#[test]
fn every_endpoint_terminating_still_answers() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    let tcp4 = vip_name("tcp", sa(t.vip4));
    let none = BTreeSet::new();
    w.service("web", &v, &ports, &[0, 1, 2]);
    wait_vips(&w.rd, "web programmed", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[0, 1, 2], false), &none)
    });

    w.slices("web", &v, &ports, &[], &[0, 1, 2]);
    wait_vips(&w.rd, "all terminating, all serving", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[0, 1, 2], false), &none)
    });
    assert_spread(t, "all terminating", sa(t.vip4), Proto::Tcp, &[0, 1, 2]);

    w.slices("web", &v, &ports, &[1], &[0, 2]);
    wait_vips(&w.rd, "b2 ready, b1 and b3 draining", &v, PROGRAMMED, |m| {
        has(
            m,
            &tcp4,
            &w.targets(&[1], false),
            &w.targets(&[0, 2], false),
        )
    });
    assert_spread(t, "b2 ready again", sa(t.vip4), Proto::Tcp, &[1]);
}

// ---------------------------------------------------------------------
// 3. A terminating endpoint keeps its long-lived connection
// ---------------------------------------------------------------------

#[test]
fn terminating_endpoint_keeps_its_connection() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    let tcp4 = vip_name("tcp", sa(t.vip4));
    let none = BTreeSet::new();
    w.service("web", &v, &ports, &[0, 1, 2]);
    wait_vips(&w.rd, "web programmed", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[0, 1, 2], false), &none)
    });

    let stop = Arc::new(AtomicBool::new(false));
    let echoed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // A line every 20 ms, each echo checked.
    let ll = long_lived(
        &t.client,
        sa(t.vip4),
        Duration::from_millis(20),
        STEP,
        stop.clone(),
        echoed.clone(),
    );
    // Stopped whatever happens below, so the thread ends.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop_guard = StopOnDrop(stop.clone());
    let first = ll
        .first
        .recv_timeout(STEP * 2)
        .expect("the long-lived connection got no first answer");
    let x = t
        .backends
        .iter()
        .position(|b| b.name == first)
        .expect("the long-lived connection's backend");
    let others: Vec<usize> = (0..3).filter(|i| *i != x).collect();
    // At least 5 more exchanges (20 ms apart) from `before`.
    let progress = |phase: &str, before: u64| {
        let now = wait_for(Duration::from_secs(3), Duration::from_millis(10), || {
            let now = echoed.load(Ordering::Relaxed);
            (now >= before + 5).then_some(now)
        });
        now.unwrap_or_else(|| {
            panic!(
                "{phase}: the long-lived connection stalled after {} exchanges",
                echoed.load(Ordering::Relaxed) - before
            )
        })
    };
    let n = progress("before", echoed.load(Ordering::Relaxed));

    // Terminating but serving: drained, weight 0.
    w.slices("web", &v, &ports, &others, &[x]);
    let (vips, _) = wait_vips(&w.rd, "terminating", &v, PROGRAMMED, |m| {
        has(
            m,
            &tcp4,
            &w.targets(&others, false),
            &w.targets(&[x], false),
        )
    });
    let xt = w.target(x, false).to_string();
    let shown = vips[&tcp4]["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .find(|b| b["target"] == xt.as_str())
        .cloned()
        .expect("the terminating backend stays listed");
    assert_ne!(
        shown["health"], "down",
        "a terminating endpoint is drained, not down: {shown}"
    );
    // Data sent over the connection after the change still arrives and is
    // answered.
    let n = progress("terminating", n);
    assert_spread(t, "terminating", sa(t.vip4), Proto::Tcp, &others);
    progress("after new connections", n);

    stop.store(true, Ordering::Relaxed);
    let seen = ll.handle.join().expect("long-lived thread");
    if let Some(e) = &seen.error {
        panic!("the long-lived connection broke: {e}");
    }
    assert_eq!(
        seen.backends,
        BTreeSet::from([first.clone()]),
        "the long-lived connection stayed on {first}"
    );
}

/// Whoever can write a Service's status can name any address: one the
/// node itself holds (here its address on the backends' subnet; on a real
/// node its API server's or kubelet's) is refused, named in `rivoractl
/// status` and in a Warning Event on the Service, and not captured: a connection to it from the client reaches
/// the node's own kernel (nothing listens: refused), not a backend. The
/// same Service's other address is served.
#[test]
fn a_service_may_not_capture_the_nodes_own_address() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let own = IpAddr::V4(t.node_v4);
    let v = [own, IpAddr::V4(t.vip4)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    w.service("grab", &v, &ports, &[0, 1, 2]);
    let (good, bad) = (vip_name("tcp", sa(t.vip4)), vip_name("tcp", sa(own)));
    let none = BTreeSet::new();
    wait_vips(&w.rd, "the Service's other address", &v, PROGRAMMED, |m| {
        has(m, &good, &w.targets(&[0, 1, 2], false), &none)
    });
    let refused = wait_for(PROGRAMMED, Duration::from_millis(50), || {
        let st = w.rd.status();
        st["failed_vips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str())
            .find(|f| f.starts_with(&bad) && f.contains("is an address of this node"))
            .map(str::to_string)
    });
    assert!(refused.is_some(), "{bad} not refused: {}", w.rd.status());
    assert!(!vips_on(&w.rd, &[own]).contains_key(&bad), "{bad} listed");
    let event = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        w.k8s.events_about("grab").into_iter().find(|(t, r, m)| {
            t == "Warning" && r == "NotProgrammed" && m.contains("is an address of this node")
        })
    });
    assert!(
        event.is_some(),
        "no Warning Event on the Service: {:?}",
        w.k8s.events_about("grab")
    );
    let r = t.client.run(move || tcp_once(sa(own), STEP));
    assert!(
        matches!(&r, Err(e) if e.contains("refused")),
        "a connection to the node's own address reached {r:?}"
    );
    assert_spread(t, "the other address", sa(t.vip4), Proto::Tcp, &[0, 1, 2]);
}

/// Whoever can write a Service's status can name any address: one no
/// AddressPool holds is not served. `rivoractl vip list` (and status)
/// name it `NOT APPLIED` with why, the Service gets a Warning Event, and
/// nothing answers it. A pool made for it: served, to every backend. The
/// pool deleted: the VIP leaves the maps and is refused again, while the
/// Service's status still names it.
#[test]
fn an_address_in_no_pool_is_not_served() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    w.k8s.create_service(&lb_service("grab", &ports, json!({})));
    w.k8s.set_ingress_by_hand("grab", &v);
    w.slices("grab", &v, &ports, &[0, 1, 2], &[]);
    let name = vip_name("tcp", sa(t.vip4));
    let why = format!("{} is in no AddressPool in use", t.vip4);
    let refused = |what: &str| {
        let listed = wait_for(PROGRAMMED, Duration::from_millis(50), || {
            let out = w.rd.ctl_ok(&["vip", "list"]);
            out.lines()
                .any(|l| l.starts_with("NOT APPLIED") && l.contains(&name) && l.contains(&why))
                .then_some(out)
        });
        assert!(
            listed.is_some(),
            "{what}: {name} not listed NOT APPLIED ({why}):\n{}",
            w.rd.ctl_ok(&["vip", "list"])
        );
        assert!(
            !vips_on(&w.rd, &v).contains_key(&name),
            "{what}: {name} in the maps"
        );
        assert_unanswered(t, what, sa(t.vip4), &[Proto::Tcp]);
    };
    refused("no pool");
    let event = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        w.k8s
            .events_about("grab")
            .into_iter()
            .find(|(t, r, m)| t == "Warning" && r == "NotProgrammed" && m.contains(&why))
    });
    assert!(
        event.is_some(),
        "no Warning Event on the Service: {:?}",
        w.k8s.events_about("grab")
    );

    // A pool holds it: served.
    w.k8s.pool_for(&v);
    let none = BTreeSet::new();
    wait_vips(&w.rd, "once a pool holds it", &v, PROGRAMMED, |m| {
        has(m, &name, &w.targets(&[0, 1, 2], false), &none)
    });
    // (Other tests' Services are this rivorad's to refuse too.)
    let list = w.rd.ctl_ok(&["vip", "list"]);
    assert!(
        !list
            .lines()
            .any(|l| l.starts_with("NOT APPLIED") && l.contains(&name)),
        "still refused: {list}"
    );
    assert_spread(t, "in a pool", sa(t.vip4), Proto::Tcp, &[0, 1, 2]);

    // The pool deleted: out of the maps, though the status keeps it.
    w.k8s.delete_pools();
    refused("the pool deleted");
    let ingress = w
        .k8s
        .service("grab")
        .and_then(|s| s.status?.load_balancer?.ingress)
        .unwrap_or_default();
    assert_eq!(
        ingress.first().and_then(|i| i.ip.clone()),
        Some(t.vip4.to_string()),
        "the status keeps the address"
    );
}

/// Merge-patch a Service's spec.
fn patch_spec(k8s: &TestNs, name: &str, spec: Value) {
    k8s.patch_service(name, &json!({ "spec": spec }));
}

/// `spec.loadBalancerSourceRanges` is enforced in XDP, both families,
/// every packet: a client outside the ranges gets nothing (and is
/// counted), one inside is served, none listed serves everyone; the
/// older annotation is read when the spec lists none, and ranges of one
/// family only admit nobody to the other's VIP.
#[test]
fn load_balancer_source_ranges_keep_other_clients_out() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4), IpAddr::V6(t.vip6)];
    let client = [
        format!("{}/32", t.client_v4),
        format!("{}/128", t.client_v6),
    ];
    let elsewhere = ["198.51.100.0/24".to_string(), "fd00:ffff::/64".to_string()];
    w.k8s.create_service(&lb_service(
        "web",
        &nat_ports(),
        json!({ "ipFamilyPolicy": "PreferDualStack", "loadBalancerSourceRanges": client }),
    ));
    w.k8s.set_ingress("web", &v);
    w.slices("web", &v, &nat_ports(), &[0, 1, 2], &[]);
    let names: Vec<String> = [sa(t.vip4), sa(t.vip6)]
        .iter()
        .flat_map(|a| ["tcp", "udp"].map(|p| vip_name(p, *a)))
        .collect();
    let ranges_are = |want: Option<&[String]>| {
        let names = names.clone();
        let want: Option<Vec<String>> = want.map(|l| l.to_vec());
        move |m: &BTreeMap<String, Value>| {
            names.iter().all(|n| {
                m.get(n).is_some_and(|vip| {
                    let got: Option<Vec<String>> =
                        serde_json::from_value(vip["source_ranges"].clone()).ok();
                    got == want
                })
            })
        }
    };
    wait_vips(
        &w.rd,
        "ranges holding the client",
        &v,
        PROGRAMMED,
        ranges_are(Some(&client)),
    );
    for vip in [sa(t.vip4), sa(t.vip6)] {
        for p in [Proto::Tcp, Proto::Udp] {
            assert_spread(t, "the client inside the ranges", vip, p, &[0, 1, 2]);
        }
    }
    let refused = |rd: &Rivorad| -> u64 {
        vips_on(rd, &v)
            .values()
            .map(|x| x["source_refused"].as_u64().expect("source_refused"))
            .sum()
    };
    assert_eq!(refused(&w.rd), 0);

    // Ranges that leave the client out: nothing answers it, a long-lived
    // connection included.
    let stop = Arc::new(AtomicBool::new(false));
    let echoed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ll = long_lived(
        &t.client,
        sa(t.vip4),
        Duration::from_millis(20),
        STEP,
        stop.clone(),
        echoed.clone(),
    );
    ll.first
        .recv_timeout(STEP * 2)
        .expect("the long-lived connection's first answer");
    patch_spec(
        &w.k8s,
        "web",
        json!({ "loadBalancerSourceRanges": elsewhere }),
    );
    wait_vips(
        &w.rd,
        "ranges elsewhere",
        &v,
        PROGRAMMED,
        ranges_are(Some(&elsewhere)),
    );
    let at = echoed.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        echoed.load(Ordering::Relaxed) <= at + 1,
        "the established connection went on outside the ranges"
    );
    stop.store(true, Ordering::Relaxed);
    for vip in [sa(t.vip4), sa(t.vip6)] {
        assert_unanswered(
            t,
            "the client outside the ranges",
            vip,
            &[Proto::Tcp, Proto::Udp],
        );
    }
    assert!(
        refused(&w.rd) >= 4,
        "refusals counted per VIP: {:?}",
        vips_on(&w.rd, &v)
    );
    let drops = w.rd.ctl_json(&["stats"]);
    assert!(
        drops["drops"]["by_reason"]["source_range"]
            .as_u64()
            .unwrap_or(0)
            >= 4,
        "the source_range drop reason: {drops}"
    );

    // None listed: everyone again.
    patch_spec(&w.k8s, "web", json!({ "loadBalancerSourceRanges": null }));
    wait_vips(&w.rd, "no ranges", &v, PROGRAMMED, ranges_are(None));
    assert_spread(t, "no ranges", sa(t.vip4), Proto::Tcp, &[0, 1, 2]);
    assert_spread(t, "no ranges", sa(t.vip6), Proto::Udp, &[0, 1, 2]);

    // The annotation (the API server refuses one that is no prefix),
    // when the spec lists none: an IPv4 range only, so the IPv6 VIP
    // admits nobody rather than everybody.
    let annotated = json!({ "metadata": { "annotations": {
        rivora_k8s::source_ranges::SOURCE_RANGES_ANNOTATION: elsewhere[0].clone()
    } } });
    w.k8s.patch_service("web", &annotated);
    wait_vips(
        &w.rd,
        "the annotation's ranges",
        &v,
        PROGRAMMED,
        ranges_are(Some(&elsewhere[..1])),
    );
    for vip in [sa(t.vip4), sa(t.vip6)] {
        assert_unanswered(t, "the annotation's ranges", vip, &[Proto::Tcp]);
    }
}

/// A Node object a test made (no kubelet runs it), deleted when the test
/// ends.
struct TestNode {
    kube: Kube,
    name: String,
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.kube.client.clone());
        let _ = self
            .kube
            .block_on(nodes.delete(&self.name, &kube::api::DeleteParams::default()));
    }
}

/// With -persist-datapath and -owner-daemonset, a stop asks whether the
/// DaemonSet goes on here: while it does (an upgrade, a restart) the
/// datapath keeps forwarding; when it no longer selects the node, or is
/// deleted (uninstalled), the links and pins go, and nothing is left to
/// forward old VIPs to pod addresses that get reused.
#[test]
fn uninstall_takes_the_datapath_away_and_an_upgrade_leaves_it() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Node;
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::builder(Mode::Nat).ipv4_only().build();
    let servers = Servers::for_topology(&topo, false);
    let mut w = World::new(topo, servers, &[]);
    let label = "rivora.io/e2e-lb";
    let kube = Kube::admin();
    let nodes: kube::Api<Node> = kube::Api::all(kube.client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": w.node, "labels": { label: "yes" } },
    }))
    .expect("a Node");
    kube.block_on(nodes.create(&kube::api::PostParams::default(), &node))
        .expect("creating this node's Node");
    let _node = TestNode {
        kube: Kube::admin(),
        name: w.node.clone(),
    };
    let dss: kube::Api<DaemonSet> = kube::Api::namespaced(kube.client.clone(), &w.k8s.name);
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": { "name": "rivorad" },
        "spec": {
            "selector": { "matchLabels": { "app": "rivorad" } },
            "template": {
                "metadata": { "labels": { "app": "rivorad" } },
                "spec": {
                    "nodeSelector": { label: "yes" },
                    "containers": [{ "name": "rivorad", "image": "rivora:test" }],
                },
            },
        },
    }))
    .expect("a DaemonSet");
    kube.block_on(dss.create(&kube::api::PostParams::default(), &ds))
        .expect("creating the DaemonSet");
    let owner = format!("{}/rivorad", w.k8s.name);
    let flags = ["-persist-datapath", "-owner-daemonset", owner.as_str()];

    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    w.service("web", &v, &nat_ports(), &[0, 1, 2]);
    let tcp4 = vip_name("tcp", sa(t.vip4));
    let all = w.targets(&[0, 1, 2], false);
    let none = BTreeSet::new();
    w.rd.stop();
    let pins = w.rd.home.pin_dir().to_path_buf();
    let run = |w: &mut World, what: &str| {
        w.rd.restart(&flags);
        wait_vips(&w.rd, what, &v, PROGRAMMED, |m| has(m, &tcp4, &all, &none));
        assert_spread(&w.topo, what, sa(w.topo.vip4), Proto::Tcp, &[0, 1, 2]);
    };

    // An upgrade: the DaemonSet goes on here.
    run(&mut w, "before an upgrade");
    w.rd.stop();
    assert!(
        w.rd.log_text()
            .contains("stopping for an upgrade or a restart"),
        "{}",
        w.rd.log_text()
    );
    assert!(
        attached(&w.topo.node, "n0").0,
        "XDP detached by an upgrade's stop"
    );
    assert!(
        pins.join("links").exists(),
        "links unpinned by an upgrade's stop"
    );
    assert_spread(
        &w.topo,
        "between two rivorads",
        sa(w.topo.vip4),
        Proto::Tcp,
        &[0, 1, 2],
    );

    // The node leaves the DaemonSet.
    run(&mut w, "before the node leaves");
    let relabel = |value: &str| {
        kube.block_on(nodes.patch(
            &w.node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({ "metadata": { "labels": { label: value } } })),
        ))
        .expect("relabelling the node");
    };
    relabel("no");
    w.rd.stop();
    let log = w.rd.log_text();
    assert!(
        log.contains("stopping for good") && log.contains("no longer selects node"),
        "{log}"
    );
    assert_eq!(
        attached(&w.topo.node, "n0"),
        (false, 0),
        "the datapath left behind"
    );
    assert!(
        !pins.exists(),
        "pins left behind: {:?}",
        std::fs::read_dir(&pins).map(|d| d.count())
    );

    // The DaemonSet is deleted: uninstalled.
    relabel("yes");
    run(&mut w, "before the uninstall");
    kube.block_on(dss.delete("rivorad", &kube::api::DeleteParams::default()))
        .expect("deleting the DaemonSet");
    w.rd.stop();
    let log = w.rd.log_text();
    assert!(
        log.contains("stopping for good") && log.contains("is gone: uninstalled"),
        "{log}"
    );
    assert_eq!(
        attached(&w.topo.node, "n0"),
        (false, 0),
        "the datapath left behind"
    );
    assert!(!pins.exists(), "pins left behind");
}

// ---------------------------------------------------------------------
// 4. A deleted Service loses its VIPs
// ---------------------------------------------------------------------

#[test]
fn deleted_service_loses_its_vips() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    w.service("web", &v, &nat_ports(), &[0, 1, 2]);
    let (tcp4, udp4) = (vip_name("tcp", sa(t.vip4)), vip_name("udp", sa(t.vip4)));
    let all = w.targets(&[0, 1, 2], false);
    let none = BTreeSet::new();
    wait_vips(&w.rd, "web programmed", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &all, &none) && has(m, &udp4, &all, &none)
    });
    assert_spread(t, "before the delete", sa(t.vip4), Proto::Tcp, &[0, 1, 2]);

    // The Service alone: its EndpointSlices stay (no garbage collector
    // runs), and must not keep the VIP.
    w.k8s.delete_service("web");
    wait_vips(&w.rd, "web deleted", &v, PROGRAMMED, |m| m.is_empty());
    assert_unanswered(t, "web deleted", sa(t.vip4), &[Proto::Tcp, Proto::Udp]);
    let st = w.rd.status();
    assert_eq!(st["unclaimed_vips"], 0, "{st}");
}

// ---------------------------------------------------------------------
// 5. ServicePolicy: NAT to DSR; what the schema refuses
// ---------------------------------------------------------------------

/// The lab runs NAT with a DSR VIP beside it (`vip(2)` on every backend's
/// `lo`, replies from it sent straight to the client): the Service on that
/// address works in both modes. Its ports keep the port (DSR cannot
/// change it), so the backends listen on the VIP port. The slices name
/// the backends as hosts on no node, since a pod on a node does not hold
/// the VIP and is reached by NAT whatever the mode (`place_backends`);
/// under NAT such hosts are reached by full NAT (their replies may not
/// come back through this node), so each still sees its own address.
#[test]
fn service_policy_switches_the_service_to_dsr() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::builder(Mode::Nat)
        .dsr_vips_beside_nat()
        .full_nat_too()
        .build();
    let vip4 = topo.vip(2);
    let mut servers = Servers::new();
    for b in &topo.backends {
        // TCP on every address; UDP echoes on the backend's own address
        // (NAT) and on the VIP (DSR: replies must leave from it).
        servers.tcp(&b.ns, &b.name, SocketAddr::from(([0u16; 8], VIP_PORT)));
        servers.udp_echo(&b.ns, &b.name, SocketAddr::new(b.v4.into(), VIP_PORT));
        servers.udp_echo(&b.ns, &b.name, sa(vip4));
    }
    // The policies' status is the controller's to write.
    let own = with_controller(topo, servers, true);
    let w = &own.w;
    let t = &w.topo;
    let v = [IpAddr::V4(vip4)];
    let ports = [tcp(VIP_PORT, VIP_PORT), udp(VIP_PORT, VIP_PORT)];
    w.service("web", &v, &ports, &[0, 1, 2]);
    let (tcp4, udp4) = (vip_name("tcp", sa(vip4)), vip_name("udp", sa(vip4)));
    let all: BTreeSet<String> = t
        .backends
        .iter()
        .map(|b| SocketAddr::new(b.v4.into(), VIP_PORT).to_string())
        .collect();
    let none = BTreeSet::new();
    let mode_is = |m: &BTreeMap<String, Value>, mode: &str| {
        has(m, &tcp4, &all, &none)
            && has(m, &udp4, &all, &none)
            && m.values().all(|v| v["mode"] == mode)
    };
    wait_vips(&w.rd, "web, NAT", &v, PROGRAMMED, |m| mode_is(m, "nat"));
    // Where the backends saw the requests addressed to: their own address
    // under NAT, the VIP under DSR.
    let local_is = |what: &str, hits: &[Hit], dsr: bool| {
        for h in hits {
            let b = t
                .backends
                .iter()
                .find(|b| b.name == h.backend)
                .expect("a known backend");
            let want = if dsr {
                sa(vip4)
            } else {
                SocketAddr::new(b.v4.into(), VIP_PORT)
            };
            assert_eq!(
                canonical(h.local),
                want,
                "{what}: where {} saw the request addressed to",
                b.name
            );
        }
    };
    for p in [Proto::Tcp, Proto::Udp] {
        let from = Some(IpAddr::V4(t.node_v4));
        let hits = assert_spread_from(t, "NAT (full NAT)", sa(vip4), p, &[0, 1, 2], from);
        local_is("NAT", &hits, false);
    }

    w.k8s
        .create_policy("web-dsr", json!({ "services": ["web"], "mode": "dsr" }))
        .unwrap_or_else(|e| panic!("creating ServicePolicy web-dsr: {e}"));
    wait_vips(&w.rd, "web, DSR by policy", &v, PROGRAMMED, |m| {
        mode_is(m, "dsr")
    });
    for p in [Proto::Tcp, Proto::Udp] {
        let hits = assert_spread(t, "DSR", sa(vip4), p, &[0, 1, 2]);
        local_is("DSR", &hits, true);
    }
    // rivora-controller says so on the policy.
    wait_condition(&w.k8s, "web-dsr", "Accepted", "True", "Accepted");

    // What the schema cannot refuse: DSR for a Service whose port remaps
    // (80 to 8080; DSR keeps the destination port). Not applied: the
    // Service stays NAT, the policy says why, the Service gets an Event.
    let remap = t.vip(3);
    let rv = [IpAddr::V4(remap)];
    w.service("remap", &rv, &[tcp(VIP_PORT, NAT_BACKEND_PORT)], &[0, 1, 2]);
    w.k8s
        .create_policy("remap-dsr", json!({ "services": ["remap"], "mode": "dsr" }))
        .unwrap_or_else(|e| panic!("creating ServicePolicy remap-dsr: {e}"));
    let nr = vip_name("tcp", sa(remap));
    let remapped = w.targets(&[0, 1, 2], false);
    wait_condition(
        &w.k8s,
        "remap-dsr",
        "Accepted",
        "False",
        "ModeNotApplicable",
    );
    let (m, _) = wait_vips(
        &w.rd,
        "remap, NAT despite its policy",
        &rv,
        PROGRAMMED,
        |m| has(m, &nr, &remapped, &none),
    );
    assert_eq!(m[&nr]["mode"], "nat", "{}", m[&nr]);
    let warned = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        let evs = w.k8s.events_about("remap");
        evs.iter()
            .any(|(ty, reason, note)| {
                ty == "Warning" && reason == "InvalidPolicy" && note.contains("remap-dsr")
            })
            .then_some(evs)
    });
    assert!(
        warned.is_some(),
        "no Warning InvalidPolicy Event on Service remap naming remap-dsr: {:?}",
        w.k8s.events_about("remap")
    );
    // The good policy is untouched by the bad one.
    wait_condition(&w.k8s, "web-dsr", "Accepted", "True", "Accepted");
    let m = vips_on(&w.rd, &v);
    assert!(m.values().all(|v| v["mode"] == "dsr"), "web: {m:?}");
}

/// Wait until ServicePolicy `name` has condition `type_` with `status`
/// and `reason` (rivorad writes them).
/// The admin of an API server of the test's own.
fn admin_of(server: &common::apiserver::ApiServer) -> Identity {
    Identity {
        cert: server.client_cert.clone(),
        key: server.client_key.clone(),
    }
}

/// rivorad -kubernetes on an API server of the test's own, as its admin.
fn world_on(
    server: &common::apiserver::ApiServer,
    kube: &Kube,
    topo: Topology,
    servers: Servers,
) -> World {
    World::on_server(
        topo,
        servers,
        (kube, server.addr(), &server.ca_cert),
        Some((Home::new(), admin_of(server))),
        &[],
    )
}

/// rivora-controller on an API server of the test's own, as its admin,
/// its Lease in `namespace`; its kubeconfig and log in `dir`.
fn controller_on(
    server: &common::apiserver::ApiServer,
    dir: &Path,
    namespace: &str,
) -> common::controller::Controller {
    let kubeconfig = dir.join("kubeconfig");
    write_kubeconfig_with(&kubeconfig, &server.url, &server.ca_cert, &admin_of(server));
    let mut args = vec!["-namespace", namespace];
    args.extend(common::controller::FAST_LEASE);
    common::controller::Controller::start(dir, &kubeconfig, "ctl", &args)
}

/// A World on an API server of the test's own, its CRDs installed, with
/// rivora-controller beside rivorad: the controller is the one writer of
/// ServicePolicy status, and it serves every Service and Gateway of its
/// cluster (on the shared server it would write other tests' objects).
/// Fields drop in order: rivorad and the objects, the controller, the
/// server.
struct WithController {
    w: World,
    kube: Kube,
    _ctl: common::controller::Controller,
    _dir: tempfile::TempDir,
    _server: common::apiserver::ApiServer,
}

fn with_controller(topo: Topology, servers: Servers, hosts: bool) -> WithController {
    let server = common::apiserver::ApiServer::start();
    let kube = Kube::new(&server.kubeconfig);
    common::k8s::install_crds(&kube);
    let w = world_on(&server, &kube, topo, servers);
    let w = if hosts { w.hosts() } else { w };
    let dir = tempfile::tempdir().expect("a temp dir");
    let ctl = controller_on(&server, dir.path(), &w.k8s.name);
    WithController {
        w,
        kube,
        _ctl: ctl,
        _dir: dir,
        _server: server,
    }
}

fn wait_condition(k8s: &TestNs, name: &str, type_: &str, status: &str, reason: &str) {
    let mut last = Value::Null;
    let got = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        last = k8s.policy(name).unwrap_or(Value::Null);
        last["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == type_ && c["status"] == status && c["reason"] == reason)
            .then_some(())
    });
    assert!(
        got.is_some(),
        "ServicePolicy {name}: no condition {type_}={status} ({reason}) within {PROGRAMMED:?}: {}",
        last["status"]
    );
}

/// ServicePolicy status has one writer, rivora-controller: rivorad
/// applies a policy (its VIP takes the policy's client affinity) and writes
/// nothing on it, so nodes whose views differ cannot write over each
/// other. And a warning every node finds is one Event, not one per node:
/// the same Event published by two nodes in one period is created once.
#[test]
fn rivorad_writes_no_policy_status_and_a_warning_is_one_event() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    w.service("web", &v, &[tcp(VIP_PORT, NAT_BACKEND_PORT)], &[0, 1, 2]);
    w.k8s
        .create_policy(
            "sticky",
            json!({ "services": ["web"], "affinity": { "type": "clientIP" } }),
        )
        .unwrap_or_else(|e| panic!("creating ServicePolicy sticky: {e}"));
    let name = vip_name("tcp", sa(t.vip4));
    let applied = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        let m = vips_on(&w.rd, &v);
        (m.get(&name)?["affinity"] == "client_ip").then_some(())
    });
    assert!(
        applied.is_some(),
        "the policy's affinity never reached {name}: {:?}",
        vips_on(&w.rd, &v)
    );
    // Time for a write that would have followed the pass that applied it.
    std::thread::sleep(Duration::from_secs(3));
    let p = w.k8s.policy("sticky").expect("the policy");
    assert!(
        p["status"]["conditions"]
            .as_array()
            .is_none_or(|c| c.is_empty()),
        "rivorad wrote the policy's status: {}",
        p["status"]
    );

    // Two nodes find the same thing to say about the Service.
    let svc = w.k8s.service("web").expect("the Service");
    let obj = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: svc.metadata.namespace.clone(),
        name: svc.metadata.name.clone(),
        uid: svc.metadata.uid.clone(),
        ..Default::default()
    };
    let note = "VIP tcp/10.9.9.9:80 is not programmed: said by every node";
    let at = std::time::SystemTime::now();
    let made: Vec<bool> = ["node-a", "node-b", "node-a"]
        .iter()
        .map(|node| {
            let reporter = kube::runtime::events::Reporter {
                controller: "rivorad".into(),
                instance: Some(node.to_string()),
            };
            let ev = rivora_k8s_client::OnceEvent {
                reason: "NotProgrammed",
                note,
                action: "Program",
                reporter: &reporter,
                period: Duration::from_secs(600),
            };
            w.k8s
                .kube
                .block_on(rivora_k8s_client::publish_once(
                    &w.k8s.kube.client,
                    &obj,
                    &ev,
                    at,
                ))
                .unwrap_or_else(|e| panic!("publishing as {node}: {e}"))
        })
        .collect();
    assert_eq!(made, [true, false, false], "created by the first node only");
    let events: Vec<_> = w
        .k8s
        .events_about("web")
        .into_iter()
        .filter(|(_, _, m)| m == note)
        .collect();
    assert_eq!(
        events,
        [(
            "Warning".to_string(),
            "NotProgrammed".to_string(),
            note.to_string()
        )],
        "one Event for the cluster"
    );
}

/// The API server refuses what the CRD's schema refuses (OpenAPI and CEL
/// rules), with its message, and stores nothing.
#[test]
fn invalid_service_policies_are_refused_by_the_api_server() {
    let kube = Kube::admin();
    let k8s = kube.namespace("e2ek-pol-");
    let cases = [
        (
            "bad-mode",
            json!({ "services": ["web"], "mode": "bogus" }),
            vec!["spec.mode", "Unsupported value", "\"bogus\""],
        ),
        (
            "bad-timeout",
            json!({ "services": ["web"], "healthCheck": { "interval": "1s", "timeout": "2s" } }),
            vec!["spec.healthCheck", "timeout must be less than interval"],
        ),
        (
            "no-services",
            json!({ "services": [], "mode": "dsr" }),
            // Neither Services nor listeners: nothing to govern.
            vec!["a policy names at least one Service or listener"],
        ),
        (
            "bad-rate",
            json!({ "services": ["web"], "synRateLimit": { "ratePerSec": 0, "burst": 10 } }),
            vec!["spec.synRateLimit.ratePerSec"],
        ),
        (
            // A tenant making every node flood its endpoints.
            "too-often",
            json!({ "services": ["web"], "healthCheck": { "interval": "2ms", "timeout": "1ms" } }),
            vec!["spec.healthCheck.interval", "at least 100ms"],
        ),
    ];
    for (name, spec, want) in cases {
        match k8s.create_policy(name, spec.clone()) {
            Ok(()) => panic!("ServicePolicy {name} ({spec}) was accepted"),
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{name}: {s:?}");
                assert_eq!(s.reason, "Invalid", "{name}: {s:?}");
                for w in want {
                    assert!(
                        s.message.contains(w),
                        "{name}: the refusal does not say {w:?}: {}",
                        s.message
                    );
                }
                eprintln!("{name}: refused: {}", s.message);
            }
            Err(e) => panic!("{name}: not a refusal by the API server: {e}"),
        }
        assert!(k8s.policy(name).is_none(), "{name} was stored");
    }
    // And a valid one is taken, so the refusals were about the values.
    k8s.create_policy("fine", json!({ "services": ["web"], "mode": "dsr" }))
        .unwrap_or_else(|e| panic!("a valid ServicePolicy was refused: {e}"));
    assert!(k8s.policy("fine").is_some(), "the valid policy is stored");
}

// ---------------------------------------------------------------------
// 6. Restarts without the API server, leftovers after the first pass
// ---------------------------------------------------------------------

/// What rivorad -kubernetes reads, for a user whose rights the test
/// changes. Events are what it writes on Services.
fn rivorad_rules() -> Value {
    json!([
        { "apiGroups": [""], "resources": ["services", "nodes", "namespaces"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"] },
        { "apiGroups": ["rivora.io"], "resources": ["addresspools"], "verbs": ["get", "list", "watch"] },
    ])
}

/// What the Gateway half reads.
fn gateway_rules() -> Value {
    json!([
        { "apiGroups": ["gateway.networking.k8s.io"],
          "resources": ["gateways", "gatewayclasses", "tcproutes", "udproutes", "referencegrants"],
          "verbs": ["get", "list", "watch"] },
    ])
}

/// What the ServicePolicy watch reads (their status is
/// rivora-controller's to write, not rivorad's).
fn policy_rules() -> Value {
    json!([
        { "apiGroups": ["rivora.io"], "resources": ["servicepolicies"], "verbs": ["get", "list", "watch"] },
    ])
}

/// rivorad's own user, for a test that takes its rights away and gives
/// them back: its identity under `home`, and every grant rivorad needs
/// ("watch", "gateway", "policies").
fn rivorad_user(kube: &Kube, home: &Home) -> (Identity, Rbac) {
    let id_dir = home.path("identity");
    std::fs::create_dir(&id_dir).expect("creating the identity dir");
    let user = unique("rivorad-e2e-");
    let id = Identity::user(&id_dir, &user);
    let rbac = Rbac::new(kube, &user);
    rbac.grant("watch", rivorad_rules());
    rbac.grant("gateway", gateway_rules());
    rbac.grant("policies", policy_rules());
    (id, rbac)
}

/// Each VIP's source as `rivoractl vip list -o json` gives it, by VIP name.
fn sources_on(rd: &Rivorad, addrs: &[IpAddr]) -> BTreeMap<String, String> {
    vips_on(rd, addrs)
        .into_iter()
        .map(|(k, v)| (k, v["source"].as_str().unwrap_or_default().to_string()))
        .collect()
}

/// The watches `rivoractl status -o json` shows, by resource: (synced,
/// errors, last error).
fn watches_of(rd: &Rivorad) -> BTreeMap<String, (bool, u64, Option<String>)> {
    let st = rd.status();
    st["watches"]
        .as_array()
        .unwrap_or_else(|| panic!("no watches in {st}"))
        .iter()
        .map(|w| {
            (
                w["resource"].as_str().unwrap_or_default().to_string(),
                (
                    w["synced"].as_bool().unwrap_or_default(),
                    w["errors"].as_u64().unwrap_or_default(),
                    w["last_error"].as_str().map(str::to_string),
                ),
            )
        })
        .collect()
}

const WATCHES: [&str; 10] = [
    "services",
    "endpointslices",
    "servicepolicies",
    "gateways",
    "gatewayclasses",
    "tcproutes",
    "udproutes",
    "referencegrants",
    "namespaces",
    "addresspools",
];

/// Two Services: `keep` (vip(1)) and `gone` (vip(2)), with -persist-datapath
/// so that the datapath forwards while rivorad is down. A loop of new
/// connections to `keep` runs from the first restart to the end: none may
/// fail.
///
/// 1. The API server hung (accepts, never answers: SIGSTOP), rivorad
///    restarted, then `gone` deleted behind its back: both VIPs adopted,
///    unclaimed, nothing pruned, both forward.
/// 2. The API server dead (connections reset), rivorad restarted: the
///    same.
/// 3. The API server reachable, but this rivorad's user may not list
///    ServicePolicies (RBAC), and `keep` got a third endpoint while rivorad
///    was down: Services and EndpointSlices list, the ServicePolicy watch
///    cannot finish its first list, so there is no pass: nothing is sent
///    (`keep` forwards as adopted, with two backends) and `gone`'s
///    leftover VIP still forwards. Once the user may list them: the first
///    pass programs `keep` with three backends and prunes `gone`.
#[test]
fn restarts_without_the_api_prune_nothing_and_leftovers_go_after_the_first_pass() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::builder(Mode::Nat).ipv4_only().build();
    let servers = Servers::for_topology(&topo, false);
    let kube = Kube::admin();
    let home = Home::new();
    let (id, rbac) = rivorad_user(&kube, &home);
    rbac.wait_until(true, "list", "rivora.io", "servicepolicies");
    let persist = ["-persist-datapath"];
    let mut w = World::as_identity(topo, servers, Some((home, id)), &persist);
    let t = &w.topo;
    let (keep, gone) = (t.vip(1), t.vip(2));
    let v = [IpAddr::V4(keep), IpAddr::V4(gone)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    w.service("keep", &[keep.into()], &ports, &[0, 1]);
    w.service("gone", &[gone.into()], &ports, &[0, 1, 2]);
    let (nk, ng) = (vip_name("tcp", sa(keep)), vip_name("tcp", sa(gone)));
    let none = BTreeSet::new();
    let (k2, k3) = (w.targets(&[0, 1], false), w.targets(&[0, 1, 2], false));
    let both = |m: &BTreeMap<String, Value>| has(m, &nk, &k2, &none) && has(m, &ng, &k3, &none);
    wait_vips(&w.rd, "keep and gone programmed", &v, PROGRAMMED, both);
    assert_spread(t, "first run", sa(gone), Proto::Tcp, &[0, 1, 2]);

    let t0 = Instant::now();
    let load = Load::start(&t.client, sa(keep));
    load.wait("first run", t0, 10);

    // Nothing pruned or changed, however long: the maps checked for HOLD,
    // every 100 ms; both adopted and unclaimed; and `gone` still answers.
    let pins = w.rd.home.pin_dir().to_path_buf();
    let as_first = |what: &str| {
        let (k, g) = (tcp_in_maps(&pins, sa(keep)), tcp_in_maps(&pins, sa(gone)));
        assert!(
            k.as_ref() == Some(&k2) && g.as_ref() == Some(&k3),
            "{what}: an adopted VIP changed or went: keep {k:?}, gone {g:?}"
        );
    };
    let hold = |w: &World, what: &str| {
        let deadline = Instant::now() + HOLD;
        while Instant::now() < deadline {
            as_first(what);
            std::thread::sleep(Duration::from_millis(100));
        }
        let st = w.rd.status();
        assert!(
            st["unclaimed_vips"].as_u64().is_some_and(|n| n >= 2),
            "{what}: keep and gone are adopted and unclaimed: {st}"
        );
        // And rivoractl names them so.
        let unclaimed = BTreeMap::from([
            (nk.clone(), "unclaimed".to_string()),
            (ng.clone(), "unclaimed".to_string()),
        ]);
        assert_eq!(sources_on(&w.rd, &v), unclaimed, "{what}: vip list");
        let watches = watches_of(&w.rd);
        assert_eq!(
            watches.keys().map(String::as_str).collect::<Vec<_>>(),
            {
                let mut r = WATCHES.to_vec();
                r.sort_unstable();
                r
            },
            "{what}: the watches rivoractl status shows"
        );
        assert!(
            watches.values().any(|(synced, _, _)| !synced),
            "{what}: every watch synced, yet no pass: {watches:?}"
        );
        assert!(
            !w.rd.log_text().contains("pruned adopted VIPs"),
            "{what}: rivorad pruned:\n{}",
            w.rd.log_text()
        );
        assert_spread(&w.topo, what, sa(gone), Proto::Tcp, &[0, 1, 2]);
    };

    // 1. Hung.
    w.proxy.set(ApiState::Hung);
    let st = w.rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    w.k8s.delete_service("gone");
    let tried = w.proxy.accepted();
    w.rd.restart(&persist);
    hold(&w, "restarted, API server hung");
    assert!(
        w.proxy.accepted() > tried,
        "rivorad never tried to reach the hung API server"
    );

    // 2. Dead.
    w.proxy.set(ApiState::Down);
    let st = w.rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    w.rd.restart(&persist);
    hold(&w, "restarted, API server dead");
    // It did try, and failed: the watches say so and retry.
    let log = w.rd.log_text();
    assert!(
        log.contains("watch failed; retrying"),
        "no failed watch in rivorad's log with the API server dead:\n{log}"
    );
    // rivoractl status: no watch synced, each with its error.
    for (r, (synced, errors, last)) in watches_of(&w.rd) {
        assert!(
            !synced && errors > 0 && last.is_some(),
            "API server dead: watch {r} synced {synced}, {errors} errors, last {last:?}"
        );
    }

    // 3. Reachable, ServicePolicies forbidden; keep scaled up meanwhile.
    let st = w.rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    rbac.revoke("policies");
    rbac.wait_until(false, "list", "rivora.io", "servicepolicies");
    w.slices("keep", &[keep.into()], &ports, &[0, 1, 2], &[]);
    w.proxy.set(ApiState::Up);
    w.rd.restart(&persist);
    // Services and EndpointSlices list, ServicePolicies cannot: no pass
    // yet, so nothing is sent (keep stays as adopted, without its third
    // endpoint) and nothing pruned.
    let failing = wait_for(PROGRAMMED, Duration::from_millis(50), || {
        w.rd.log_text()
            .lines()
            .any(|l| {
                l.contains("watch failed; retrying")
                    && l.contains("servicepolicies")
                    && l.to_lowercase().contains("forbidden")
            })
            .then_some(())
    });
    assert!(
        failing.is_some(),
        "no forbidden ServicePolicy watch in rivorad's log:\n{}",
        w.rd.log_text()
    );
    hold(&w, "restarted, ServicePolicies forbidden");
    let watches = watches_of(&w.rd);
    for r in ["services", "endpointslices"] {
        assert!(
            watches[r].0,
            "ServicePolicies forbidden: {r} is listed, yet not synced: {watches:?}"
        );
    }
    let (synced, _, last) = &watches["servicepolicies"];
    assert!(
        !synced
            && last
                .as_deref()
                .is_some_and(|e| e.to_lowercase().contains("forbidden")),
        "ServicePolicies forbidden: the watch says so: {watches:?}"
    );
    let log = w.rd.log_text();
    assert!(
        !log.contains("first full pass sent"),
        "a pass without the ServicePolicy list:\n{log}"
    );

    // The policies watch can list: the first pass completes, gone goes.
    rbac.grant("policies", policy_rules());
    let (m, pruned) = wait_vips(
        &w.rd,
        "the first pass: keep reconciled, the leftover pruned",
        &v,
        Duration::from_secs(60),
        // The maps are read after the list: the list must have caught up
        // with the prune too (it shows unclaimed VIPs).
        |m| has(m, &nk, &k3, &none) && tcp_in_maps(&pins, sa(gone)).is_none() && m.len() == 1,
    );
    assert_eq!(
        tcp_in_maps(&pins, sa(keep)).as_ref(),
        Some(&k3),
        "keep in the maps after the pass"
    );
    assert_eq!(m.len(), 1, "keep alone on the lab's addresses: {m:?}");
    let log = w.rd.log_text();
    assert!(
        log.contains("first full pass sent") && log.contains("pruned adopted VIPs"),
        "the pass and the prune in rivorad's log:\n{log}"
    );
    assert_unanswered(t, "gone pruned", sa(gone), &[Proto::Tcp]);
    let st = w.rd.status();
    assert_eq!(st["unclaimed_vips"], 0, "after the first pass: {st}");
    let watches = watches_of(&w.rd);
    assert!(
        WATCHES.iter().all(|r| watches[*r].0),
        "after the first pass every watch is synced: {watches:?}"
    );
    assert_eq!(
        sources_on(&w.rd, &v),
        BTreeMap::from([(nk.clone(), format!("service {}/keep", w.k8s.name))]),
        "after the first pass keep is its Service's"
    );
    load.wait("after the prune", pruned, 20);
    let attempts = load.finish();
    assert_no_failure("keep, through every restart", &attempts, t0);
    eprintln!(
        "{} connections to keep through three restarts, none failed",
        attempts.len()
    );
    drop(rbac);
}

// ---------------------------------------------------------------------
// 7. Dual stack
// ---------------------------------------------------------------------

#[test]
fn dual_stack_service_gets_a_vip_per_family() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4), IpAddr::V6(t.vip6)];
    // The Service asks for dual stack where available (the API server
    // has both service ranges); its ingress holds both.
    w.k8s.create_service(&lb_service(
        "web",
        &nat_ports(),
        json!({ "ipFamilyPolicy": "PreferDualStack" }),
    ));
    w.k8s.set_ingress("web", &v);
    w.slices("web", &v, &nat_ports(), &[0, 1, 2], &[]);
    let none = BTreeSet::new();
    let names: Vec<(String, bool)> = [false, true]
        .into_iter()
        .flat_map(|v6| {
            let vip = if v6 { sa(t.vip6) } else { sa(t.vip4) };
            ["tcp", "udp"].map(|p| (vip_name(p, vip), v6))
        })
        .collect();
    let (vips, _) = wait_vips(&w.rd, "dual stack programmed", &v, PROGRAMMED, |m| {
        names
            .iter()
            .all(|(n, v6)| has(m, n, &w.targets(&[0, 1, 2], *v6), &none))
    });
    assert_eq!(vips.len(), 4, "two VIPs per family: {:?}", vips.keys());
    for vip in [sa(t.vip4), sa(t.vip6)] {
        for p in [Proto::Tcp, Proto::Udp] {
            assert_spread(t, "dual stack", vip, p, &[0, 1, 2]);
        }
    }
}

// ---------------------------------------------------------------------
// 8. externalTrafficPolicy: Local
// ---------------------------------------------------------------------

#[test]
fn local_traffic_policy_keeps_this_nodes_endpoints() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::builder(Mode::Nat).ipv4_only().build();
    let servers = Servers::for_topology(&topo, false);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    w.k8s.create_service(&lb_service(
        "local",
        &ports,
        json!({ "externalTrafficPolicy": "Local" }),
    ));
    w.k8s.set_ingress("local", &v);
    // b1 and b3 on this node, b2 on another.
    let eps: Vec<Ep> = t
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let node = if i == 1 { "another-node" } else { &w.node };
            Ep::ready(b.v4).on(node)
        })
        .collect();
    w.k8s
        .apply_slice(&endpoint_slice("local-v4", "local", false, &ports, &eps));
    let tcp4 = vip_name("tcp", sa(t.vip4));
    let none = BTreeSet::new();
    wait_vips(&w.rd, "local programmed", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[0, 2], false), &none)
    });
    assert_spread(t, "Local", sa(t.vip4), Proto::Tcp, &[0, 2]);
}

// ---------------------------------------------------------------------
// 9. Static VIPs and Kubernetes VIPs, never both
// ---------------------------------------------------------------------

#[test]
fn static_vips_and_kubernetes_are_refused_together() {
    common::require::root_and_tools("e2e_kubernetes");
    let node = Netns::new(&unique("rvk8s-both-"));
    node.exec("ip link add n0 type veth peer name n1 && ip link set n0 up && ip link set n1 up");
    let home = Home::new();
    let yaml = format!(
        "interfaces:\n  - name: n0\n    xdpMode: native\napi:\n  socket: {}\nvips:\n  \
         - address: 10.9.100.1\n    port: 80\n    protocol: tcp\n    mode: nat\n    \
         healthCheck: false\n    backends:\n      - {{ address: 10.9.2.11, port: 8080 }}\n",
        home.socket().display()
    );
    std::fs::write(home.config(), yaml).expect("writing the config");
    // Valid credentials for an API server nobody listens for: the
    // refusal must come before any connection.
    let kubeconfig = home.path("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
         server: https://127.0.0.1:1\nusers:\n- name: u\n  user:\n    token: not-a-secret\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
    )
    .expect("writing the kubeconfig");
    let out = Command::new("nsenter")
        .arg(format!("--net={}", node.path()))
        .arg(rivorad_bin())
        .arg("-config")
        .arg(home.config())
        .arg("-pin-dir")
        .arg(home.pin_dir())
        .arg("-state-dir")
        .arg(home.state_dir())
        .args(["-kubernetes", "-kubeconfig"])
        .arg(&kubeconfig)
        .args(["-node-name", "node-both"])
        .output()
        .expect("running rivorad");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "rivorad started with static VIPs and -kubernetes: {text}"
    );
    // The file, how many VIPs and which, and what to do about it.
    for w in [
        home.config().display().to_string(),
        "defines 1 VIP(s)".into(),
        "tcp/10.9.100.1:80".into(),
        "-kubernetes".into(),
        "never static ones too".into(),
        "keep only the node settings".into(),
    ] {
        assert!(
            text.contains(&w),
            "the refusal does not say {w:?} (a node runs static VIPs or Kubernetes VIPs, never both): {text}"
        );
    }
    assert!(
        !home.pin_dir().exists(),
        "a refused start pinned something at {}",
        home.pin_dir().display()
    );
    assert!(!home.socket().exists(), "a refused start opened its API");
}

// ---------------------------------------------------------------------
// 10. Gateway API: the CRDs, and Gateways with their routes as VIPs
// ---------------------------------------------------------------------

const GATEWAY_CONTROLLER: &str = "rivora.io/gateway-controller";

/// Create `obj` (kind, plural at the version its `apiVersion` says) and
/// read it back as the Rust type `K`.
fn round_trip<K: serde::de::DeserializeOwned>(
    k8s: &TestNs,
    kind: &str,
    plural: &str,
    obj: Value,
) -> K {
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    k8s.create_gateway_api(kind, plural, obj.clone());
    let version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
    let ar = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "gateway.networking.k8s.io",
            version.rsplit('/').next().unwrap_or("v1"),
            kind,
        ),
        plural,
    );
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(k8s.kube.client.clone(), &k8s.name, &ar);
    let got = k8s
        .kube
        .block_on(api.get(&name))
        .unwrap_or_else(|e| panic!("reading {kind} {name} through {version}: {e}"));
    let v = serde_json::to_value(&got).expect("JSON");
    serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{kind} as stored does not read as the Rust type: {e}\n{v}"))
}

/// The CRDs the chart ships (helm/gateway-api-crds/experimental) install
/// and serve every version rivorad reads (Gateway v1, ReferenceGrant v1
/// and v1beta1, the routes v1 and v1alpha2); what the API server stores,
/// defaults filled in, reads as the generated types; the schema refuses a
/// Service backendRef without a port; and the ServicePolicy schema now
/// takes listeners but refuses a policy that names nothing.
#[test]
fn gateway_api_crds_install_and_read_as_the_generated_types() {
    use rivora_k8s::gateway::api::{
        gateways::Gateway, referencegrants::ReferenceGrant, tcproutes::TcpRoute,
        udproutes::UdpRoute,
    };
    shared();
    let kube = Kube::admin();
    let ns = kube.namespace("gwcrd-");
    let gw: Gateway = round_trip(
        &ns,
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw"},
            "spec": {"gatewayClassName": "rivora", "listeners": [
                {"name": "tcp", "protocol": "TCP", "port": 5432},
                {"name": "udp", "protocol": "UDP", "port": 53,
                 "allowedRoutes": {"namespaces": {"from": "Selector",
                    "selector": {"matchLabels": {"team": "a"}}}}}]}
        }),
    );
    assert_eq!(gw.spec.listeners.len(), 2);
    // The API server fills in the defaults: routes from the same namespace.
    let from = gw.spec.listeners[0]
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.clone());
    assert_eq!(format!("{from:?}"), "Some(Same)");
    for (version, name) in [("v1", "r1"), ("v1alpha2", "r2")] {
        let route: TcpRoute = round_trip(
            &ns,
            "TCPRoute",
            "tcproutes",
            json!({
                "apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": "TCPRoute",
                "metadata": {"name": name},
                "spec": {"parentRefs": [{"name": "gw", "sectionName": "tcp"}],
                         "rules": [{"backendRefs": [{"name": "db", "port": 5432, "weight": 3}]}]}
            }),
        );
        let p = &route.spec.parent_refs.as_deref().unwrap_or_default()[0];
        assert_eq!(
            (p.group.as_deref(), p.kind.as_deref()),
            (Some("gateway.networking.k8s.io"), Some("Gateway")),
            "{version}: parentRef defaults"
        );
        assert_eq!(route.spec.rules[0].backend_refs[0].weight, Some(3));
        let udp: UdpRoute = round_trip(
            &ns,
            "UDPRoute",
            "udproutes",
            json!({
                "apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": "UDPRoute",
                "metadata": {"name": name},
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
            &ns,
            "ReferenceGrant",
            "referencegrants",
            json!({
                "apiVersion": format!("gateway.networking.k8s.io/{version}"), "kind": "ReferenceGrant",
                "metadata": {"name": name},
                "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "TCPRoute", "namespace": "other"}],
                         "to": [{"group": "", "kind": "Service"}]}
            }),
        );
        assert_eq!(g.spec.from[0].kind, "TCPRoute");
    }
    let api = ns.kube.gateway_api(&ns.name, "TCPRoute", "tcproutes");
    let bad: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
        "metadata": {"name": "no-port", "namespace": ns.name},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "db"}]}]}
    }))
    .expect("an object");
    let err = kube
        .block_on(api.create(&kube::api::PostParams::default(), &bad))
        .expect_err("a Service backendRef without a port is refused");
    assert!(err.to_string().contains("port"), "{err}");
    // ServicePolicy: listeners accepted, nothing named refused.
    ns.create_policy(
        "l",
        json!({"listeners": [{"gateway": "gw", "listener": "tcp"}], "mode": "dsr"}),
    )
    .unwrap_or_else(|e| panic!("a policy naming a listener was refused: {e}"));
    let err = ns
        .create_policy("empty", json!({"mode": "dsr"}))
        .expect_err("a policy naming nothing is refused");
    assert!(
        err.to_string()
            .contains("a policy names at least one Service or listener"),
        "{err}"
    );
}

/// A VIP's backends by target, with their weights, from `vip list`.
fn backends_of(m: &BTreeMap<String, Value>, name: &str) -> Option<BTreeMap<String, u64>> {
    m.get(name).map(weights)
}

/// A Gateway of Rivora's class with a TCP and a UDP listener (port 80,
/// routes from namespaces labelled with this test's team), its
/// addresses written as rivora-controller would (an IPv4 and an IPv6
/// VIP), Services `one` (backend 0) in namespace A, labelled for the team,
/// and `two` (backends 1 and 2) in namespace B, labelled for another.
///
/// - Routes in two namespaces: B's UDPRoute (the older) is refused by the
///   Selector, so the UDP listener carries A's UDPRoute (backend 0); were
///   B's admitted, it would win and UDP would reach backends 1 and 2.
/// - A's TCPRoute names `one` (weight 1) and B's `two` (weight 3): without
///   a ReferenceGrant in B only `one` is resolved (every connection to
///   backend 0); with one, `vip list` shows Maglev weights 2:3:3 and of
///   2,000 connections backend 0 takes 25 % (within 5 points), backends 1
///   and 2 the rest.
/// - `vip list` names the source `gateway NS/gw`; IPv6 VIPs carry the
///   IPv6 endpoints and forward.
/// - A's UDPRoute deleted under a loop of TCP connections: the UDP VIPs
///   stay with no backend and stop answering, the TCP listener's VIP
///   fails no connection.
#[test]
fn gateway_listeners_routes_grants_and_weights() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let kube = Kube::admin();
    let class = TestGatewayClass::new(&kube, GATEWAY_CONTROLLER);
    let team = unique("team-");
    let a = kube.namespace_labelled("e2eka-", json!({ "rivora-e2e-team": team }));
    let b = kube.namespace_labelled("e2ekb-", json!({ "rivora-e2e-team": "someone-else" }));
    let ports = nat_ports();
    let vips = [IpAddr::V4(t.vip4), IpAddr::V6(t.vip6)];
    a.create_service(&cluster_service("one", &ports));
    w.slices_in(&a, "one", &vips, &ports, &[0], &[]);
    b.create_service(&cluster_service("two", &ports));
    w.slices_in(&b, "two", &vips, &ports, &[1, 2], &[]);

    let selector =
        json!({ "from": "Selector", "selector": { "matchLabels": { "rivora-e2e-team": team } } });
    w.k8s.create_gateway_api(
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": "gw" },
            "spec": { "gatewayClassName": class.name, "listeners": [
                { "name": "tcp", "protocol": "TCP", "port": VIP_PORT,
                  "allowedRoutes": { "namespaces": selector } },
                { "name": "udp", "protocol": "UDP", "port": VIP_PORT,
                  "allowedRoutes": { "namespaces": selector } },
            ] },
        }),
    );
    w.k8s.set_gateway_addresses("gw", &vips);
    let parent =
        |section: &str| json!([{ "name": "gw", "namespace": w.k8s.name, "sectionName": section }]);
    b.create_gateway_api(
        "UDPRoute",
        "udproutes",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "UDPRoute",
            "metadata": { "name": "refused" },
            "spec": { "parentRefs": parent("udp"),
                      "rules": [{ "backendRefs": [{ "name": "two", "port": VIP_PORT }] }] },
        }),
    );
    // creationTimestamp has whole seconds: A's routes are younger.
    std::thread::sleep(Duration::from_millis(1100));
    a.create_gateway_api(
        "UDPRoute",
        "udproutes",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "UDPRoute",
            "metadata": { "name": "dns" },
            "spec": { "parentRefs": parent("udp"),
                      "rules": [{ "backendRefs": [{ "name": "one", "port": VIP_PORT }] }] },
        }),
    );
    a.create_gateway_api(
        "TCPRoute",
        "tcproutes",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
            "metadata": { "name": "db" },
            "spec": { "parentRefs": parent("tcp"),
                      "rules": [{ "backendRefs": [
                          { "name": "one", "port": VIP_PORT, "weight": 1 },
                          { "name": "two", "namespace": b.name, "port": VIP_PORT, "weight": 3 },
                      ] }] },
        }),
    );

    let (tcp4, udp4) = (vip_name("tcp", sa(t.vip4)), vip_name("udp", sa(t.vip4)));
    let (tcp6, udp6) = (
        vip_name("tcp", SocketAddr::new(t.vip6.into(), VIP_PORT)),
        vip_name("udp", SocketAddr::new(t.vip6.into(), VIP_PORT)),
    );
    let none = BTreeSet::new();
    let b0 = w.targets(&[0], false);
    let b0v6 = w.targets(&[0], true);
    let (m, _) = wait_vips(
        &w.rd,
        "the Gateway's VIPs, two without a grant",
        &vips,
        PROGRAMMED,
        |m| {
            has(m, &tcp4, &b0, &none)
                && has(m, &udp4, &b0, &none)
                && has(m, &tcp6, &b0v6, &none)
                && has(m, &udp6, &b0v6, &none)
        },
    );
    assert_eq!(
        m.len(),
        4,
        "one VIP per (address, listener port, protocol): {m:?}"
    );
    let source = format!("gateway {}/gw", w.k8s.name);
    for (name, v) in &m {
        assert_eq!(v["source"], source, "{name}: {v}");
        assert_eq!(v["mode"], "nat", "{name}: {v}");
    }
    assert_spread(
        t,
        "no ReferenceGrant: `one` alone",
        sa(t.vip4),
        Proto::Tcp,
        &[0],
    );
    assert_spread(
        t,
        "B's UDPRoute refused by the Selector",
        sa(t.vip4),
        Proto::Udp,
        &[0],
    );
    let v6 = exchanges(
        &t.client,
        SocketAddr::new(t.vip6.into(), VIP_PORT),
        Proto::Tcp,
        10,
        STEP,
    );
    assert!(
        v6.iter()
            .all(|r| r.as_ref().is_ok_and(|h| h.backend == t.backends[0].name)),
        "TCP over IPv6 to backend 0: {v6:?}"
    );

    // The ReferenceGrant in B: `two` resolved, weights 1:3 across the
    // Services, spread over their ready endpoints.
    b.create_gateway_api(
        "ReferenceGrant",
        "referencegrants",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": { "name": "from-a" },
            "spec": { "from": [{ "group": "gateway.networking.k8s.io", "kind": "TCPRoute", "namespace": a.name }],
                      "to": [{ "group": "", "kind": "Service", "name": "two" }] },
        }),
    );
    let want: BTreeMap<String, u64> = [(0, 2), (1, 3), (2, 3)]
        .into_iter()
        .map(|(i, wt)| (w.target(i, false).to_string(), wt))
        .collect();
    wait_vips(&w.rd, "granted: weights 2:3:3", &vips, PROGRAMMED, |m| {
        backends_of(m, &tcp4).as_ref() == Some(&want)
    });
    const N: usize = 2000;
    let results = exchanges(&t.client, sa(t.vip4), Proto::Tcp, N, STEP);
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {N} connections failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(results.len(), N);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for h in results.iter().flatten() {
        *counts.entry(h.backend.clone()).or_default() += 1;
    }
    let share = |i: usize| counts.get(&t.backends[i].name).copied().unwrap_or(0) as f64 / N as f64;
    let (s0, s12) = (share(0), share(1) + share(2));
    eprintln!("weights 1:3 over {N} connections: {counts:?} (Service one {s0:.3}, two {s12:.3})");
    assert!(
        (s0 - 0.25).abs() <= 0.05 && (s12 - 0.75).abs() <= 0.05,
        "Service one (weight 1) took {s0:.3} and two (weight 3) {s12:.3} of {N} connections, not 0.25 and 0.75 within 0.05: {counts:?}"
    );
    // Within `two` both endpoints take a share. Not an even one to 5
    // points: a slice of 12 Maglev slots gives weights 2:3:3 as 3:5:4
    // slots (0.417 and 0.333), exact only for the Services' 3:9.
    for i in [1, 2] {
        assert!(
            share(i) >= 0.25,
            "backend {i}: {:.3} of {N}: {counts:?}",
            share(i)
        );
    }

    // A's UDPRoute deleted under TCP load: UDP loses its backends, TCP
    // fails nothing.
    let t0 = Instant::now();
    let load = Load::start(&t.client, sa(t.vip4));
    load.wait("before the UDPRoute goes", t0, 20);
    a.delete_gateway_api("UDPRoute", "udproutes", "dns");
    let (m, gone) = wait_vips(
        &w.rd,
        "UDPRoute deleted: UDP VIPs without backends",
        &vips,
        PROGRAMMED,
        |m| has(m, &udp4, &none, &none) && has(m, &udp6, &none, &none) && m.contains_key(&tcp4),
    );
    assert_eq!(
        backends_of(&m, &tcp4).as_ref(),
        Some(&want),
        "the TCP listener's VIP unchanged"
    );
    load.wait("after the UDPRoute went", gone, 50);
    let attempts = load.finish();
    assert_no_failure("TCP while the UDP listener's route went", &attempts, t0);
    assert_unanswered(t, "UDP without a route", sa(t.vip4), &[Proto::Udp]);

    // rivoractl status: the gateway source synced and owning one object;
    // every watch synced.
    let st = w.rd.status();
    let gw_source = st["sources"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["kind"] == "gateway"))
        .unwrap_or_else(|| panic!("no gateway source in {st}"));
    assert_eq!(gw_source["synced"], true, "{gw_source}");
    assert!(
        gw_source["objects"].as_u64().is_some_and(|n| n >= 1),
        "{gw_source}"
    );
    let watches = watches_of(&w.rd);
    assert!(
        WATCHES.iter().all(|r| watches[*r].0),
        "every watch synced: {watches:?}"
    );
    eprintln!(
        "{} TCP connections while the UDPRoute went, none failed",
        attempts.len()
    );
}

/// Gateway `name` in the World's namespace with one TCP listener on
/// VIP_PORT at `vip`, and a TCPRoute to Service `name` (ClusterIP) whose
/// endpoints are `backends`.
fn gateway_with_route(w: &World, class: &str, name: &str, vip: IpAddr, backends: &[usize]) {
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    w.k8s.create_service(&cluster_service(name, &ports));
    w.slices(name, &[vip], &ports, backends, &[]);
    w.k8s.create_gateway_api(
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": name },
            "spec": { "gatewayClassName": class, "listeners": [
                { "name": "tcp", "protocol": "TCP", "port": VIP_PORT } ] },
        }),
    );
    w.k8s.set_gateway_addresses(name, &[vip]);
    w.k8s.create_gateway_api(
        "TCPRoute",
        "tcproutes",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
            "metadata": { "name": name },
            "spec": { "parentRefs": [{ "name": name, "sectionName": "tcp" }],
                      "rules": [{ "backendRefs": [{ "name": name, "port": VIP_PORT }] }] },
        }),
    );
}

/// initsync with Gateways: two Gateways, `keep` (vip(1)) and `gone`
/// (vip(2)), with -persist-datapath and a loop of connections to `keep`
/// from the first restart to the end. rivorad stopped, `gone` deleted,
/// the Gateway API watches forbidden (RBAC), rivorad started: the Service
/// half completes its pass, the Gateway half cannot, so both VIPs stay
/// adopted and unclaimed and `gone` still forwards. Once the watches may
/// list, the Gateway pass claims `keep` (`gateway NS/keep`) and prunes
/// `gone`; no connection to `keep` fails throughout.
#[test]
fn gateway_vips_are_pruned_only_after_the_gateway_pass() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::builder(Mode::Nat).ipv4_only().build();
    let servers = Servers::for_topology(&topo, false);
    let kube = Kube::admin();
    let home = Home::new();
    let (id, rbac) = rivorad_user(&kube, &home);
    rbac.wait_until(true, "list", "gateway.networking.k8s.io", "gateways");
    let persist = ["-persist-datapath"];
    let mut w = World::as_identity(topo, servers, Some((home, id)), &persist);
    let class = TestGatewayClass::new(&kube, GATEWAY_CONTROLLER);
    let t = &w.topo;
    let (keep, gone) = (t.vip(1), t.vip(2));
    let v = [IpAddr::V4(keep), IpAddr::V4(gone)];
    gateway_with_route(&w, &class.name, "keep", keep.into(), &[0, 1]);
    gateway_with_route(&w, &class.name, "gone", gone.into(), &[2]);
    let (nk, ng) = (vip_name("tcp", sa(keep)), vip_name("tcp", sa(gone)));
    let none = BTreeSet::new();
    let (k2, g1) = (w.targets(&[0, 1], false), w.targets(&[2], false));
    wait_vips(&w.rd, "keep and gone programmed", &v, PROGRAMMED, |m| {
        has(m, &nk, &k2, &none) && has(m, &ng, &g1, &none)
    });
    assert_eq!(
        sources_on(&w.rd, &v),
        BTreeMap::from([
            (nk.clone(), format!("gateway {}/keep", w.k8s.name)),
            (ng.clone(), format!("gateway {}/gone", w.k8s.name)),
        ])
    );

    let t0 = Instant::now();
    let load = Load::start(&t.client, sa(keep));
    load.wait("first run", t0, 10);

    let st = w.rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    w.k8s.delete_gateway_api("Gateway", "gateways", "gone");
    rbac.revoke("gateway");
    rbac.wait_until(false, "list", "gateway.networking.k8s.io", "gateways");
    w.rd.restart(&persist);
    // The Service half's pass is done; the Gateway half's cannot be.
    let passed = wait_for(PROGRAMMED, Duration::from_millis(50), || {
        let log = w.rd.log_text();
        (log.contains("Kubernetes: first full pass sent")
            && log.lines().any(|l| {
                l.contains("watch failed; retrying")
                    && l.contains("gateways")
                    && l.to_lowercase().contains("forbidden")
            }))
        .then_some(())
    });
    assert!(
        passed.is_some(),
        "no Service pass, or no forbidden Gateway watch:\n{}",
        w.rd.log_text()
    );
    let pins = w.rd.home.pin_dir().to_path_buf();
    let deadline = Instant::now() + HOLD;
    while Instant::now() < deadline {
        assert_eq!(
            tcp_in_maps(&pins, sa(gone)).as_ref(),
            Some(&g1),
            "gone's adopted VIP changed or went"
        );
        assert_eq!(
            tcp_in_maps(&pins, sa(keep)).as_ref(),
            Some(&k2),
            "keep's adopted VIP changed or went"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        sources_on(&w.rd, &v),
        BTreeMap::from([
            (nk.clone(), "unclaimed".to_string()),
            (ng.clone(), "unclaimed".to_string())
        ]),
        "before the Gateway pass both are adopted and unclaimed"
    );
    assert!(
        !w.rd.log_text().contains("pruned adopted VIPs"),
        "pruned before the Gateway pass:\n{}",
        w.rd.log_text()
    );
    let st = w.rd.status();
    let gw_source = st["sources"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["kind"] == "gateway"))
        .unwrap_or_else(|| panic!("no gateway source in {st}"));
    assert_eq!(gw_source["synced"], false, "{gw_source}");
    let watches = watches_of(&w.rd);
    let (synced, _, last) = &watches["gateways"];
    assert!(
        !synced
            && last
                .as_deref()
                .is_some_and(|e| e.to_lowercase().contains("forbidden")),
        "the gateways watch says it is forbidden: {watches:?}"
    );
    assert_spread(&w.topo, "gone, adopted", sa(gone), Proto::Tcp, &[2]);

    // The Gateway watches may list: the pass claims keep, prunes gone.
    rbac.grant("gateway", gateway_rules());
    let (_, pruned) = wait_vips(
        &w.rd,
        "the Gateway pass: keep claimed, gone pruned",
        &v,
        Duration::from_secs(60),
        |m| has(m, &nk, &k2, &none) && m.len() == 1 && tcp_in_maps(&pins, sa(gone)).is_none(),
    );
    assert_eq!(
        sources_on(&w.rd, &v),
        BTreeMap::from([(nk.clone(), format!("gateway {}/keep", w.k8s.name))])
    );
    let log = w.rd.log_text();
    assert!(
        log.contains("Gateway API: first full pass sent") && log.contains("pruned adopted VIPs"),
        "the Gateway pass and the prune in rivorad's log:\n{log}"
    );
    assert_unanswered(&w.topo, "gone pruned", sa(gone), &[Proto::Tcp]);
    load.wait("after the prune", pruned, 20);
    let attempts = load.finish();
    assert_no_failure("keep, through the restart and the prune", &attempts, t0);
    eprintln!(
        "{} connections to keep through the restart, none failed",
        attempts.len()
    );
}

/// A ServicePolicy names Gateway listeners: `web-dsr` makes the TCP
/// listener DSR with a TCP health check (the UDP listener on the same
/// port, same Service, stays NAT), `limited` gives another listener a SYN
/// limit (its VIP counts rate-limited SYNs, the DSR one none), and
/// `remap-dsr` asks DSR for a listener whose backends listen on another
/// port: not applied (the VIP stays NAT) and the policy says
/// `Accepted=False ModeNotApplicable`. The backends are hosts on no node,
/// as in `service_policy_switches_the_service_to_dsr`.
#[test]
fn service_policy_sets_a_gateway_listeners_mode_limit_and_health_check() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::builder(Mode::Nat)
        .dsr_vips_beside_nat()
        .full_nat_too()
        .build();
    let vip4 = topo.vip(2);
    let mut servers = Servers::new();
    for b in &topo.backends {
        servers.tcp(&b.ns, &b.name, SocketAddr::from(([0u16; 8], VIP_PORT)));
        servers.udp_echo(&b.ns, &b.name, SocketAddr::new(b.v4.into(), VIP_PORT));
        servers.udp_echo(&b.ns, &b.name, sa(vip4));
    }
    // The policies' status is the controller's to write.
    let own = with_controller(topo, servers, true);
    let w = &own.w;
    let t = &w.topo;
    let class = TestGatewayClass::new(&own.kube, GATEWAY_CONTROLLER);
    let v = [IpAddr::V4(vip4)];
    let port = |name: &'static str, proto: &'static str, port: u16| SvcPort {
        name,
        proto,
        port,
        target: VIP_PORT,
    };
    let ports = [
        port("tcp", "TCP", VIP_PORT),
        port("udp", "UDP", VIP_PORT),
        port("remap", "TCP", VIP_PORT + 1),
        port("limited", "TCP", VIP_PORT + 2),
    ];
    w.k8s.create_service(&cluster_service("web", &ports));
    w.slices("web", &v, &ports, &[0, 1, 2], &[]);
    let listener = |name: &str, proto: &str, port: u16| json!({ "name": name, "protocol": proto, "port": port });
    w.k8s.create_gateway_api(
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": "gw" },
            "spec": { "gatewayClassName": class.name, "listeners": [
                listener("tcp", "TCP", VIP_PORT), listener("udp", "UDP", VIP_PORT),
                listener("remap", "TCP", VIP_PORT + 1), listener("limited", "TCP", VIP_PORT + 2) ] },
        }),
    );
    w.k8s.set_gateway_addresses("gw", &v);
    for (kind, plural, section, svc_port) in [
        ("TCPRoute", "tcproutes", "tcp", VIP_PORT),
        ("UDPRoute", "udproutes", "udp", VIP_PORT),
        ("TCPRoute", "tcproutes", "remap", VIP_PORT + 1),
        ("TCPRoute", "tcproutes", "limited", VIP_PORT + 2),
    ] {
        w.k8s.create_gateway_api(
            kind,
            plural,
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
                "metadata": { "name": section },
                "spec": { "parentRefs": [{ "name": "gw", "sectionName": section }],
                          "rules": [{ "backendRefs": [{ "name": "web", "port": svc_port }] }] },
            }),
        );
    }
    let at = |p: u16| SocketAddr::new(vip4.into(), p);
    let (tcp4, udp4) = (vip_name("tcp", sa(vip4)), vip_name("udp", sa(vip4)));
    let (remap4, limited4) = (
        vip_name("tcp", at(VIP_PORT + 1)),
        vip_name("tcp", at(VIP_PORT + 2)),
    );
    let all: BTreeSet<String> = t
        .backends
        .iter()
        .map(|b| SocketAddr::new(b.v4.into(), VIP_PORT).to_string())
        .collect();
    let none = BTreeSet::new();
    let modes = |m: &BTreeMap<String, Value>| -> Vec<String> {
        [&tcp4, &udp4, &remap4, &limited4]
            .iter()
            .map(|n| {
                m.get(*n).map_or("-".to_string(), |v| {
                    v["mode"].as_str().unwrap_or("?").to_string()
                })
            })
            .collect()
    };
    let everyone = |m: &BTreeMap<String, Value>| {
        [&tcp4, &udp4, &remap4, &limited4]
            .iter()
            .all(|n| has(m, n, &all, &none))
    };
    wait_vips(&w.rd, "four listeners, NAT", &v, PROGRAMMED, |m| {
        everyone(m) && modes(m) == ["nat", "nat", "nat", "nat"]
    });
    let probes = || -> BTreeMap<String, String> {
        w.rd.ctl_json(&["backend", "list"])
            .as_array()
            .expect("backend list is an array")
            .iter()
            .filter(|b| b["target"].as_str().is_some_and(|x| all.contains(x)))
            .map(|b| {
                (
                    b["target"].as_str().unwrap_or_default().to_string(),
                    b["probe"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    assert!(
        probes().values().all(|p| p == "disabled"),
        "no health check yet: {:?}",
        probes()
    );

    for (name, spec) in [
        (
            "web-dsr",
            json!({ "listeners": [{ "gateway": "gw", "listener": "tcp" }], "mode": "dsr",
                            "healthCheck": { "type": "tcp", "interval": "500ms", "timeout": "250ms" } }),
        ),
        (
            "limited",
            json!({ "listeners": [{ "gateway": "gw", "listener": "limited" }],
                            "synRateLimit": { "ratePerSec": 1, "burst": 1 } }),
        ),
        (
            "remap-dsr",
            json!({ "listeners": [{ "gateway": "gw", "listener": "remap" }], "mode": "dsr" }),
        ),
    ] {
        w.k8s
            .create_policy(name, spec)
            .unwrap_or_else(|e| panic!("creating ServicePolicy {name}: {e}"));
    }
    wait_vips(
        &w.rd,
        "the TCP listener DSR, the others NAT",
        &v,
        PROGRAMMED,
        |m| everyone(m) && modes(m) == ["dsr", "nat", "nat", "nat"],
    );
    wait_condition(&w.k8s, "web-dsr", "Accepted", "True", "Accepted");
    wait_condition(&w.k8s, "limited", "Accepted", "True", "Accepted");
    wait_condition(
        &w.k8s,
        "remap-dsr",
        "Accepted",
        "False",
        "ModeNotApplicable",
    );
    // Where the backends saw the requests addressed to: the VIP under
    // DSR, their own address under NAT.
    for (p, dsr) in [(Proto::Tcp, true), (Proto::Udp, false)] {
        // The NAT listener's hosts by full NAT, from the node's address
        // on their subnet.
        let from = (!dsr).then_some(IpAddr::V4(t.node_v4));
        for h in assert_spread_from(t, "by policy", sa(vip4), p, &[0, 1, 2], from) {
            let b = t
                .backends
                .iter()
                .find(|b| b.name == h.backend)
                .expect("a known backend");
            let want = if dsr {
                sa(vip4)
            } else {
                SocketAddr::new(b.v4.into(), VIP_PORT)
            };
            assert_eq!(
                canonical(h.local),
                want,
                "{p:?}: where {} saw the request addressed to",
                b.name
            );
        }
    }
    // The health check runs on the listener's backends.
    let probed = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        probes().values().all(|p| p == "healthy").then_some(())
    });
    assert!(
        probed.is_some(),
        "the listener policy's health check: {:?}",
        probes()
    );
    // The SYN limit: a burst of 1 at 1/s, five connections at once.
    let r = exchanges(
        &t.client,
        at(VIP_PORT + 2),
        Proto::Tcp,
        5,
        Duration::from_millis(500),
    );
    let limited = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        let m = vips_on(&w.rd, &v);
        let n = m
            .get(&limited4)
            .and_then(|x| x["rate_limited"].as_u64())
            .unwrap_or(0);
        (n > 0).then_some((n, m))
    });
    let (n, m) = limited.unwrap_or_else(|| panic!("no rate-limited SYN on {limited4}: {r:?}"));
    assert_eq!(
        m[&tcp4]["rate_limited"], 0,
        "the DSR listener has no limit: {}",
        m[&tcp4]
    );
    eprintln!("{n} SYNs rate-limited on {limited4}");
}

/// Every `K` of namespace `ns`.
fn list_in<K>(kube: &Kube, ns: &str) -> Vec<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    kube.block_on(
        kube::Api::<K>::namespaced(kube.client.clone(), ns).list(&kube::api::ListParams::default()),
    )
    .unwrap_or_else(|e| panic!("listing {} in {ns}: {e}", K::plural(&Default::default())))
    .items
}

/// The objects of Gateway API and the Services and EndpointSlices of
/// `namespaces`, as the API server has them now: what rivora-controller
/// will resolve.
fn snapshot_of(kube: &Kube, namespaces: &[&str]) -> rivora_k8s::gateway::Snapshot {
    use rivora_k8s::gateway::api::{gatewayclasses::GatewayClass, referencegrants::ReferenceGrant};
    let lp = kube::api::ListParams::default();
    let c = &kube.client;
    let mut s = rivora_k8s::gateway::Snapshot {
        classes: kube
            .block_on(kube::Api::<GatewayClass>::all(c.clone()).list(&lp))
            .expect("listing GatewayClasses")
            .items,
        ..Default::default()
    };
    for ns in namespaces {
        s.gateways.extend(list_in(kube, ns));
        s.tcp_routes.extend(list_in(kube, ns));
        s.udp_routes.extend(list_in(kube, ns));
        s.grants.extend(list_in::<ReferenceGrant>(kube, ns));
        s.services.extend(list_in(kube, ns));
        s.slices.extend(list_in(kube, ns));
        let n = kube
            .block_on(kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(c.clone()).get(ns))
            .unwrap_or_else(|e| panic!("reading namespace {ns}: {e}"));
        s.namespaces
            .insert(ns.to_string(), n.metadata.labels.unwrap_or_default());
    }
    s
}

/// One status subresource write of `obj` with `status`, conditioned on
/// the resourceVersion read (a concurrent writer's change is never lost).
fn write_status<K>(api: &kube::Api<K>, kube: &Kube, obj: &K, status: Value)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut v = serde_json::to_value(obj).expect("JSON");
    v["status"] = status;
    let o: K = serde_json::from_value(v).expect("the object with its status");
    let name = obj.meta().name.clone().unwrap_or_default();
    kube.block_on(api.replace_status(&name, &kube::api::PostParams::default(), &o))
        .unwrap_or_else(|e| panic!("writing the status of {name}: {e}"));
}

/// Conditions as `type=status reason gN`.
fn conditions_of(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} {} g{}",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["observedGeneration"].as_i64().unwrap_or(-1)
            )
        })
        .collect()
}

/// The status rivora-controller is to write (rivora-k8s's status
/// functions, over the objects as the API server has them), written
/// through the status subresources of the upstream CRDs: the schema takes
/// every field, and what is read back says, field by field, what the
/// Gateway API specification names: the class `Accepted`; the Gateway
/// `Accepted=True ListenersNotValid` (one listener HTTP) and `Programmed`;
/// each listener's `supportedKinds`, `attachedRoutes` and conditions (an
/// UnsupportedProtocol one, it and a TCP one on its port in
/// ProtocolConflict); each route's parent
/// entry with Rivora's controllerName, `Accepted` (Accepted,
/// NotAllowedByListeners for the namespace the Selector refuses,
/// NoMatchingParent) and `ResolvedRefs` (ResolvedRefs, RefNotPermitted,
/// BackendNotFound), all at the objects' generations. Read again, the
/// status already says it all: nothing more to write.
#[test]
fn gateway_status_as_computed_is_what_the_crds_accept() {
    use rivora_k8s::gateway::api::{
        gatewayclasses::GatewayClass, gateways::Gateway, tcproutes::TcpRoute, udproutes::UdpRoute,
    };
    use rivora_k8s::gateway::{resolve, status};
    shared();
    let kube = Kube::admin();
    let class = TestGatewayClass::new(&kube, GATEWAY_CONTROLLER);
    let w = status_world(&kube, &class.name);
    let (g, a, b) = (&w.g, &w.a, &w.b);
    g.set_gateway_addresses("gw", &[STATUS_VIP.parse().expect("an address")]);

    let names = [g.name.as_str(), a.name.as_str(), b.name.as_str()];
    let snap = snapshot_of(&kube, &names);
    let res = resolve(&snap);
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let c = &kube.client;
    let mine = |name: &str| name == class.name;
    let mut written = 0;
    for cl in snap
        .classes
        .iter()
        .filter(|c| mine(&c.metadata.name.clone().unwrap_or_default()))
    {
        let st = status::gateway_class_status(cl, &res, &now).expect("the class needs a status");
        write_status(
            &kube::Api::<GatewayClass>::all(c.clone()),
            &kube,
            cl,
            serde_json::to_value(st).expect("JSON"),
        );
        written += 1;
    }
    for gw in &snap.gateways {
        let st = status::gateway_status(gw, &res, &now).expect("the Gateway needs a status");
        write_status(
            &kube::Api::<Gateway>::namespaced(c.clone(), &g.name),
            &kube,
            gw,
            serde_json::to_value(st).expect("JSON"),
        );
        written += 1;
    }
    for r in &snap.tcp_routes {
        let st = status::tcp_route_status(r, &res, &now).expect("a TCPRoute needs a status");
        let ns = r.metadata.namespace.clone().unwrap_or_default();
        write_status(
            &kube::Api::<TcpRoute>::namespaced(c.clone(), &ns),
            &kube,
            r,
            serde_json::to_value(st).expect("JSON"),
        );
        written += 1;
    }
    for r in &snap.udp_routes {
        let st = status::udp_route_status(r, &res, &now).expect("a UDPRoute needs a status");
        let ns = r.metadata.namespace.clone().unwrap_or_default();
        write_status(
            &kube::Api::<UdpRoute>::namespaced(c.clone(), &ns),
            &kube,
            r,
            serde_json::to_value(st).expect("JSON"),
        );
        written += 1;
    }
    assert_eq!(
        written, 6,
        "one class, one Gateway, three TCPRoutes, one UDPRoute"
    );
    let wrong = status_mismatches(&kube, &w, &class.name, "False RefNotPermitted");
    assert!(
        wrong.is_empty(),
        "the status as read back:\n{}",
        wrong.join("\n")
    );

    // The status already says it: nothing more to write.
    let snap = snapshot_of(&kube, &names);
    let res = resolve(&snap);
    let later =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    for cl in snap
        .classes
        .iter()
        .filter(|c| mine(&c.metadata.name.clone().unwrap_or_default()))
    {
        assert_eq!(
            status::gateway_class_status(cl, &res, &later),
            None,
            "the class"
        );
    }
    for gw in &snap.gateways {
        assert_eq!(
            status::gateway_status(gw, &res, &later),
            None,
            "the Gateway"
        );
    }
    for r in &snap.tcp_routes {
        assert_eq!(
            status::tcp_route_status(r, &res, &later),
            None,
            "{:?}",
            r.metadata.name
        );
    }
    for r in &snap.udp_routes {
        assert_eq!(
            status::udp_route_status(r, &res, &later),
            None,
            "{:?}",
            r.metadata.name
        );
    }
    // A ReferenceGrant appears: only db's status changes.
    grant_from(&w);
    let snap = snapshot_of(&kube, &names);
    let res = resolve(&snap);
    let changed: Vec<String> = snap
        .tcp_routes
        .iter()
        .filter(|r| status::tcp_route_status(r, &res, &later).is_some())
        .map(|r| r.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(changed, ["db"]);
    assert!(snap
        .gateways
        .iter()
        .all(|gw| status::gateway_status(gw, &res, &later).is_none()));
}

/// The address the status tests' Gateway has.
const STATUS_VIP: &str = "10.250.100.1";

/// The objects of the status tests, in three namespaces: `g` holds
/// Gateway `gw` (listeners `tcp` and `udp` on port 80 admitting the
/// namespaces labelled with this test's team, `web` HTTP 8080, `clash`
/// TCP 8080); `a` (the team's) Service `one` and TCPRoutes `db` (to `one`
/// and to b's `two`), `missing` (to a Service that does not exist) and
/// `nomatch` (to a listener that does not exist); `b` (another team's)
/// Service `two` and UDPRoute `refused`.
struct StatusWorld {
    g: TestNs,
    a: TestNs,
    b: TestNs,
}

fn status_world(kube: &Kube, class: &str) -> StatusWorld {
    let g = kube.namespace("e2ekg-");
    let team = unique("team-");
    let a = kube.namespace_labelled("e2eka-", json!({ "rivora-e2e-team": team }));
    let b = kube.namespace_labelled("e2ekb-", json!({ "rivora-e2e-team": "someone-else" }));
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    a.create_service(&cluster_service("one", &ports));
    a.apply_slice(&endpoint_slice(
        "one-v4",
        "one",
        false,
        &ports,
        &[Ep::ready(std::net::Ipv4Addr::new(10, 250, 0, 1))],
    ));
    b.create_service(&cluster_service("two", &nat_ports()));
    let selector =
        json!({ "from": "Selector", "selector": { "matchLabels": { "rivora-e2e-team": team } } });
    g.create_gateway_api(
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": "gw" },
            "spec": { "gatewayClassName": class, "listeners": [
                { "name": "tcp", "protocol": "TCP", "port": 80, "allowedRoutes": { "namespaces": selector } },
                { "name": "udp", "protocol": "UDP", "port": 80, "allowedRoutes": { "namespaces": selector } },
                { "name": "web", "protocol": "HTTP", "port": 8080 },
                // TCP beside HTTP on one port: both conflicted (two TCP
                // listeners on one port the v1.7.0 schema refuses itself).
                { "name": "clash", "protocol": "TCP", "port": 8080 },
            ] },
        }),
    );
    let parent =
        |section: &str| json!([{ "name": "gw", "namespace": g.name, "sectionName": section }]);
    let route =
        |ns: &TestNs, kind: &str, plural: &str, name: &str, section: &str, backends: Value| {
            ns.create_gateway_api(
            kind,
            plural,
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
                "metadata": { "name": name },
                "spec": { "parentRefs": parent(section), "rules": [{ "backendRefs": backends }] },
            }),
        );
        };
    route(
        &a,
        "TCPRoute",
        "tcproutes",
        "db",
        "tcp",
        json!([
        { "name": "one", "port": VIP_PORT, "weight": 1 },
        { "name": "two", "namespace": b.name, "port": VIP_PORT, "weight": 3 }]),
    );
    route(
        &a,
        "TCPRoute",
        "tcproutes",
        "missing",
        "tcp",
        json!([{ "name": "nosuch", "port": VIP_PORT }]),
    );
    route(
        &a,
        "TCPRoute",
        "tcproutes",
        "nomatch",
        "nope",
        json!([{ "name": "one", "port": VIP_PORT }]),
    );
    route(
        &b,
        "UDPRoute",
        "udproutes",
        "refused",
        "udp",
        json!([{ "name": "two", "port": VIP_PORT }]),
    );

    StatusWorld { g, a, b }
}

/// A ReferenceGrant in b admitting a's TCPRoutes to its Services.
fn grant_from(w: &StatusWorld) {
    w.b.create_gateway_api(
        "ReferenceGrant",
        "referencegrants",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
            "metadata": { "name": "from-a" },
            "spec": { "from": [{ "group": "gateway.networking.k8s.io", "kind": "TCPRoute", "namespace": w.a.name }],
                      "to": [{ "group": "", "kind": "Service" }] },
        }),
    );
}

/// What the status of every object of a [`StatusWorld`] says unlike the
/// Gateway API specification, field by field; empty when all is as it
/// names it. `db_refs` is what route db's ResolvedRefs should say
/// (`False RefNotPermitted` before the grant, `True ResolvedRefs` after).
fn status_mismatches(kube: &Kube, w: &StatusWorld, class: &str, db_refs: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: String, got: Value, want: Value| {
        if got != want {
            out.push(format!("{what}: {got} instead of {want}"));
        }
    };
    let get = |ns: &TestNs, kind: &str, plural: &str, name: &str| {
        ns.gateway_api_object(kind, plural, name)
            .unwrap_or(Value::Null)
    };
    let gen = |v: &Value| v["metadata"]["generation"].as_i64().unwrap_or(-1);
    let conds = |v: &Value| json!(conditions_of(v));
    let cls: Value = {
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
            kube.client.clone(),
            &common::k8s::gateway_api_resource("GatewayClass", "gatewayclasses"),
        );
        serde_json::to_value(kube.block_on(api.get(class)).expect("the class")).expect("JSON")
    };
    check(
        "GatewayClass conditions".into(),
        conds(&cls["status"]["conditions"]),
        json!([format!("Accepted=True Accepted g{}", gen(&cls))]),
    );
    check(
        "GatewayClass supportedFeatures".into(),
        cls["status"]["supportedFeatures"].clone(),
        json!([{"name": "Gateway"}, {"name": "ReferenceGrant"}, {"name": "TCPRoute"}, {"name": "UDPRoute"}]),
    );
    let gw = get(&w.g, "Gateway", "gateways", "gw");
    let gg = gen(&gw);
    check(
        "Gateway addresses".into(),
        gw["status"]["addresses"].clone(),
        json!([{ "type": "IPAddress", "value": STATUS_VIP }]),
    );
    check(
        "Gateway conditions".into(),
        conds(&gw["status"]["conditions"]),
        json!([
            format!("Accepted=True ListenersNotValid g{gg}"),
            format!("Programmed=True Programmed g{gg}")
        ]),
    );
    let listeners: BTreeMap<String, Value> = gw["status"]["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            (
                l["name"].as_str().unwrap_or_default().to_string(),
                json!([
                    l["attachedRoutes"],
                    l["supportedKinds"],
                    conditions_of(&l["conditions"])
                ]),
            )
        })
        .collect();
    check(
        "listener names".into(),
        json!(listeners.keys().collect::<Vec<_>>()),
        json!(["clash", "tcp", "udp", "web"]),
    );
    let kinds = |k: &str| json!([{ "group": "gateway.networking.k8s.io", "kind": k }]);
    let four = |a: &str, c: &str, r: &str, p: &str| {
        json!([
            format!("Accepted={a} g{gg}"),
            format!("Conflicted={c} g{gg}"),
            format!("ResolvedRefs={r} g{gg}"),
            format!("Programmed={p} g{gg}")
        ])
    };
    for (name, attached, k, want) in [
        // db and missing attached; refused not admitted, nomatch nowhere.
        (
            "tcp",
            2,
            kinds("TCPRoute"),
            four(
                "True Accepted",
                "False NoConflicts",
                "True ResolvedRefs",
                "True Programmed",
            ),
        ),
        (
            "udp",
            0,
            kinds("UDPRoute"),
            four(
                "True Accepted",
                "False NoConflicts",
                "True ResolvedRefs",
                "True Programmed",
            ),
        ),
        (
            "web",
            0,
            json!([]),
            four(
                "False UnsupportedProtocol",
                "True ProtocolConflict",
                "True ResolvedRefs",
                "False Invalid",
            ),
        ),
        (
            "clash",
            0,
            kinds("TCPRoute"),
            four(
                "True Accepted",
                "True ProtocolConflict",
                "True ResolvedRefs",
                "False Invalid",
            ),
        ),
    ] {
        check(
            format!("listener {name}"),
            listeners.get(name).cloned().unwrap_or(Value::Null),
            json!([attached, k, want]),
        );
    }
    for (ns, kind, plural, name, section, accepted, resolved) in [
        (
            &w.a,
            "TCPRoute",
            "tcproutes",
            "db",
            "tcp",
            "True Accepted",
            db_refs,
        ),
        (
            &w.a,
            "TCPRoute",
            "tcproutes",
            "missing",
            "tcp",
            "True Accepted",
            "False BackendNotFound",
        ),
        (
            &w.a,
            "TCPRoute",
            "tcproutes",
            "nomatch",
            "nope",
            "False NoMatchingParent",
            "True ResolvedRefs",
        ),
        (
            &w.b,
            "UDPRoute",
            "udproutes",
            "refused",
            "udp",
            "False NotAllowedByListeners",
            "True ResolvedRefs",
        ),
    ] {
        let r = get(ns, kind, plural, name);
        let rg = gen(&r);
        let parents: Vec<Value> = r["status"]["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                json!([
                    p["controllerName"],
                    p["parentRef"]["name"],
                    p["parentRef"]["namespace"],
                    p["parentRef"]["sectionName"],
                    conditions_of(&p["conditions"])
                ])
            })
            .collect();
        check(
            format!("{kind} {name} parents"),
            json!(parents),
            json!([[
                GATEWAY_CONTROLLER,
                "gw",
                w.g.name,
                section,
                [
                    format!("Accepted={accepted} g{rg}"),
                    format!("ResolvedRefs={resolved} g{rg}")
                ]
            ]]),
        );
    }
    out
}

/// The same objects, on an API server of the test's own, with the real
/// rivora-controller: it assigns the Gateway its address from a pool of
/// one and writes every status, field by field as the specification
/// names it (what `gateway_status_as_computed_is_what_the_crds_accept`
/// checks of the status functions alone); it writes only on change (no
/// object's resourceVersion moves while nothing changes); a
/// ReferenceGrant turns db's ResolvedRefs to True.
#[test]
fn the_controller_writes_every_gateway_status_field_by_field() {
    let server = common::apiserver::ApiServer::start();
    let kube = Kube::new(&server.kubeconfig);
    common::k8s::install_crds(&kube);
    let pools: kube::Api<rivora_k8s::AddressPool> = kube::Api::all(kube.client.clone());
    let p: rivora_k8s::AddressPool = serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "AddressPool",
        "metadata": { "name": "one" },
        "spec": { "addresses": [STATUS_VIP] },
    }))
    .expect("an AddressPool");
    kube.block_on(pools.create(&Default::default(), &p))
        .expect("creating the AddressPool");
    let class = TestGatewayClass::new(&kube, GATEWAY_CONTROLLER);
    let w = status_world(&kube, &class.name);
    let dir = tempfile::tempdir().expect("a temp dir");
    let ctl = controller_on(&server, dir.path(), &w.g.name);

    let mut last = Vec::new();
    let done = wait_for(Duration::from_secs(60), Duration::from_millis(200), || {
        last = status_mismatches(&kube, &w, &class.name, "False RefNotPermitted");
        last.is_empty().then_some(())
    });
    assert!(
        done.is_some(),
        "the controller's status, 60 s after its start:\n{}\ncontroller log:\n{}",
        last.join("\n"),
        ctl.log_text()
    );

    // Only on change: nothing moves while nothing changes.
    let versions = || -> Vec<String> {
        let mut v: Vec<String> = [
            (&w.g, "Gateway", "gateways", "gw"),
            (&w.a, "TCPRoute", "tcproutes", "db"),
            (&w.a, "TCPRoute", "tcproutes", "missing"),
            (&w.a, "TCPRoute", "tcproutes", "nomatch"),
            (&w.b, "UDPRoute", "udproutes", "refused"),
        ]
        .iter()
        .map(|(ns, k, p, n)| {
            ns.gateway_api_object(k, p, n).map_or(String::new(), |o| {
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
        })
        .collect();
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
            kube.client.clone(),
            &common::k8s::gateway_api_resource("GatewayClass", "gatewayclasses"),
        );
        let c = kube.block_on(api.get(&class.name)).expect("the class");
        v.push(c.metadata.resource_version.unwrap_or_default());
        v
    };
    let before = versions();
    std::thread::sleep(HOLD);
    assert_eq!(
        versions(),
        before,
        "an object was written while nothing changed"
    );

    grant_from(&w);
    let done = wait_for(PROGRAMMED, Duration::from_millis(200), || {
        last = status_mismatches(&kube, &w, &class.name, "True ResolvedRefs");
        last.is_empty().then_some(())
    });
    assert!(
        done.is_some(),
        "after the ReferenceGrant:\n{}\ncontroller log:\n{}",
        last.join("\n"),
        ctl.log_text()
    );
}

/// A Gateway whose TCP listener's VIP key a LoadBalancer Service already
/// holds: the Service keeps it (the first claim wins), `rivoractl status`
/// names both in its conflicts, and the Gateway gets a Warning Event
/// `NotProgrammed` naming the VIP, the only way its owner can learn what a
/// node's dataplane refused; its UDP listener, on a free key, forwards.
#[test]
fn a_gateway_refused_by_the_dataplane_gets_an_event() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let w = World::new(topo, servers, &[]);
    let t = &w.topo;
    let kube = Kube::admin();
    let class = TestGatewayClass::new(&kube, GATEWAY_CONTROLLER);
    let v = [IpAddr::V4(t.vip4)];
    w.service("squatter", &v, &[tcp(VIP_PORT, NAT_BACKEND_PORT)], &[0]);
    let tcp4 = vip_name("tcp", sa(t.vip4));
    let udp4 = vip_name("udp", sa(t.vip4));
    let none = BTreeSet::new();
    wait_vips(&w.rd, "the Service holds the key", &v, PROGRAMMED, |m| {
        has(m, &tcp4, &w.targets(&[0], false), &none)
    });
    let ports = nat_ports();
    w.k8s.create_service(&cluster_service("web", &ports));
    w.slices("web", &v, &ports, &[1, 2], &[]);
    w.k8s.create_gateway_api(
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": "late" },
            "spec": { "gatewayClassName": class.name, "listeners": [
                { "name": "tcp", "protocol": "TCP", "port": VIP_PORT },
                { "name": "udp", "protocol": "UDP", "port": VIP_PORT } ] },
        }),
    );
    w.k8s.set_gateway_addresses("late", &v);
    for (kind, plural, section) in [
        ("TCPRoute", "tcproutes", "tcp"),
        ("UDPRoute", "udproutes", "udp"),
    ] {
        w.k8s.create_gateway_api(
            kind,
            plural,
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
                "metadata": { "name": section },
                "spec": { "parentRefs": [{ "name": "late", "sectionName": section }],
                          "rules": [{ "backendRefs": [{ "name": "web", "port": VIP_PORT }] }] },
            }),
        );
    }
    let (m, _) = wait_vips(
        &w.rd,
        "UDP the Gateway's, TCP still the Service's",
        &v,
        PROGRAMMED,
        |m| {
            has(m, &udp4, &w.targets(&[1, 2], false), &none)
                && has(m, &tcp4, &w.targets(&[0], false), &none)
        },
    );
    assert_eq!(
        m[&tcp4]["source"],
        format!("service {}/squatter", w.k8s.name)
    );
    assert_eq!(m[&udp4]["source"], format!("gateway {}/late", w.k8s.name));
    let evs = wait_for(PROGRAMMED, Duration::from_millis(200), || {
        let evs = w.k8s.events_about("late");
        evs.iter()
            .any(|(ty, reason, note)| {
                ty == "Warning" && reason == "NotProgrammed" && note.contains(&tcp4)
            })
            .then_some(evs)
    });
    assert!(
        evs.is_some(),
        "no Warning NotProgrammed Event on Gateway late naming {tcp4}: {:?}",
        w.k8s.events_about("late")
    );
    let st = w.rd.status();
    let conflicts = st["conflicts"].to_string();
    assert!(
        conflicts.contains(&format!("{}/squatter", w.k8s.name))
            && conflicts.contains(&format!("{}/late", w.k8s.name)),
        "rivoractl status names both claimants: {conflicts}"
    );
    assert_spread(t, "the Service keeps TCP", sa(t.vip4), Proto::Tcp, &[0]);
    assert_spread(t, "the Gateway has UDP", sa(t.vip4), Proto::Udp, &[1, 2]);
}

/// On an API server of the test's own with no CRD but the AddressPool's
/// (only pool addresses are served): Services are
/// served as ever; the five Gateway API watches say the CRDs are not
/// installed, count as listed after their second look (the Gateway source
/// is synced, so nothing waits on it) and warn once each, not on every
/// retry. The CRDs installed later, a Gateway is picked up within the
/// retry period and forwards.
#[test]
fn without_the_gateway_api_crds_the_watches_say_so_and_gateways_come_once_installed() {
    common::require::root_and_tools("e2e_kubernetes");
    let server = common::apiserver::ApiServer::start();
    let kube = Kube::new(&server.kubeconfig);
    let pools = rivora_k8s::crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("addresspools.rivora.io"))
        .expect("the AddressPool CRD");
    common::k8s::install_crd(&kube, &pools);
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, false);
    let w = world_on(&server, &kube, topo, servers);
    let t = &w.topo;
    let v = [IpAddr::V4(t.vip4)];
    let ports = [tcp(VIP_PORT, NAT_BACKEND_PORT)];
    w.service("web", &v, &ports, &[0, 1, 2]);
    let none = BTreeSet::new();
    wait_vips(&w.rd, "the Service without any CRD", &v, PROGRAMMED, |m| {
        has(
            m,
            &vip_name("tcp", sa(t.vip4)),
            &w.targets(&[0, 1, 2], false),
            &none,
        )
    });
    let gateway_watches = [
        "gateways",
        "gatewayclasses",
        "tcproutes",
        "udproutes",
        "referencegrants",
    ];
    let synced = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        let st = w.rd.status();
        let gw = st["sources"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["kind"] == "gateway"))
            .cloned();
        gw.is_some_and(|g| g["synced"] == true).then_some(())
    });
    assert!(
        synced.is_some(),
        "the Gateway source never synced without its CRDs: {}",
        w.rd.status()
    );
    let watches = watches_of(&w.rd);
    for r in gateway_watches {
        let (synced, _, last) = &watches[r];
        assert!(
            *synced
                && last.as_deref().is_some_and(|e| e.contains(&format!(
                    "the Gateway API CRDs ({r} gateway.networking.k8s.io) are not installed"
                ))),
            "{r}: {watches:?}"
        );
    }
    // Quietly: one warning each, whatever the retries since.
    std::thread::sleep(Duration::from_secs(12));
    let warned =
        w.rd.log_text()
            .lines()
            .filter(|l| l.contains("the Gateway API CRDs are not installed"))
            .count();
    assert_eq!(
        warned,
        gateway_watches.len(),
        "warnings about the missing CRDs:\n{}",
        w.rd.log_text()
    );

    // Installed: the next look finds them.
    common::k8s::install_gateway_api_crds(&kube);
    let class = TestGatewayClass::new(&kube, GATEWAY_CONTROLLER);
    let vip = t.vip(2);
    gateway_with_route(&w, &class.name, "late", vip.into(), &[1]);
    let (m, _) = wait_vips(
        &w.rd,
        "the Gateway once the CRDs are there",
        &[IpAddr::V4(vip)],
        Duration::from_secs(40),
        |m| has(m, &vip_name("tcp", sa(vip)), &w.targets(&[1], false), &none),
    );
    assert_eq!(
        m[&vip_name("tcp", sa(vip))]["source"],
        format!("gateway {}/late", w.k8s.name)
    );
    assert_spread(t, "the late Gateway", sa(vip), Proto::Tcp, &[1]);
}

// ---------------------------------------------------------------------
// 11. rivora-controller assigns, rivorad forwards
// ---------------------------------------------------------------------

#[test]
fn a_service_gets_its_address_from_the_controller_and_forwards() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    // A class of this test's own: the other tests' rivorads leave this
    // Service alone, and this test's controller touches no other.
    let class = format!("test.rivora.io/{}", unique("c"));
    let w = World::new(
        topo,
        servers,
        &["-load-balancer-class", &class, "-require-class"],
    );
    let t = &w.topo;
    let vips = [IpAddr::V4(t.vip4), IpAddr::V6(t.vip6)];
    // A pool of exactly the lab's VIPs (the client routes them to the
    // node), for this namespace only.
    let pool = unique("e2ek-pool-");
    let p: rivora_k8s::AddressPool = serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1",
        "kind": "AddressPool",
        "metadata": { "name": pool, "labels": { "test.rivora.io/scope": pool } },
        "spec": {
            "addresses": [t.vip4.to_string(), t.vip6.to_string()],
            "namespaceSelector": {
                "matchLabels": { "kubernetes.io/metadata.name": w.k8s.name },
            },
        },
    }))
    .expect("an AddressPool");
    let kube = &w.k8s.kube;
    let pools: kube::Api<rivora_k8s::AddressPool> = kube::Api::all(kube.client.clone());
    kube.block_on(pools.create(&Default::default(), &p))
        .unwrap_or_else(|e| panic!("creating AddressPool {pool}: {e}"));
    let _pool_gone = PoolGuard {
        kube: kube.clone(),
        name: pool.clone(),
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    common::k8s::write_kubeconfig(&kubeconfig, &shared().server.url, &Identity::admin());
    let selector = format!("test.rivora.io/scope={pool}");
    let mut args = vec![
        "-namespace",
        &w.k8s.name,
        "-load-balancer-class",
        &class,
        "-require-class",
        "-pool-selector",
        &selector,
    ];
    args.extend(common::controller::FAST_LEASE);
    let _ctl = common::controller::Controller::start(dir.path(), &kubeconfig, "ctl", &args);

    // The Service as a user writes it: no address, Rivora's class.
    let mut svc = lb_service(
        "web",
        &nat_ports(),
        json!({ "ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv4", "IPv6"] }),
    );
    if let Some(s) = svc.spec.as_mut() {
        s.load_balancer_class = Some(class.clone());
    }
    w.k8s.create_service(&svc);
    w.slices("web", &vips, &nat_ports(), &[0, 1, 2], &[]);
    let want: Vec<String> = vips.iter().map(ToString::to_string).collect();
    let assigned = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        let s = w.k8s.service("web")?;
        let got: Vec<String> = s
            .status?
            .load_balancer?
            .ingress?
            .into_iter()
            .filter_map(|i| i.ip)
            .collect();
        (got == want).then_some(got)
    });
    assert!(
        assigned.is_some(),
        "the controller never wrote {want:?} into web's status: {:?}",
        w.k8s.service("web").and_then(|s| s.status)
    );
    let none = BTreeSet::new();
    let names: Vec<(String, bool)> = [false, true]
        .into_iter()
        .flat_map(|v6| {
            let vip = if v6 { sa(t.vip6) } else { sa(t.vip4) };
            ["tcp", "udp"].map(|p| (vip_name(p, vip), v6))
        })
        .collect();
    wait_vips(
        &w.rd,
        "the assigned VIPs programmed",
        &vips,
        PROGRAMMED,
        |m| {
            names
                .iter()
                .all(|(n, v6)| has(m, n, &w.targets(&[0, 1, 2], *v6), &none))
        },
    );
    for vip in [sa(t.vip4), sa(t.vip6)] {
        for p in [Proto::Tcp, Proto::Udp] {
            assert_spread(t, "controller-assigned VIP", vip, p, &[0, 1, 2]);
        }
    }
}

/// Deletes a cluster-scoped AddressPool on drop.
struct PoolGuard {
    kube: Kube,
    name: String,
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        let api: kube::Api<rivora_k8s::AddressPool> = kube::Api::all(self.kube.client.clone());
        if let Err(e) = self
            .kube
            .block_on(api.delete(&self.name, &Default::default()))
        {
            eprintln!("deleting AddressPool {}: {e}", self.name);
        }
    }
}

// ---------------------------------------------------------------------
// 12. rivora-controller gives a Gateway its address and status
// ---------------------------------------------------------------------

/// The whole Gateway path on an API server of the test's own (the
/// controller serves every Gateway of Rivora's class in its cluster, and
/// the other Gateway tests write those statuses themselves): a
/// GatewayClass, a Gateway with a TCP and a UDP listener and a route on
/// each, and a pool of the lab's one VIP. rivora-controller assigns the
/// address and writes every status (class, Gateway, listeners, routes);
/// rivorad forwards TCP and UDP through it to every backend. A second
/// Gateway, for which no address is left, is `Programmed=False
/// AddressNotAssigned` with the allocator's reason and a Warning Event.
#[test]
fn a_gateway_gets_its_address_and_status_from_the_controller_and_forwards() {
    common::require::root_and_tools("e2e_kubernetes");
    let topo = Topology::new(Mode::Nat);
    let servers = Servers::for_topology(&topo, true);
    let own = with_controller(topo, servers, false);
    let (w, kube) = (&own.w, &own.kube);
    let t = &w.topo;
    let vip = IpAddr::V4(t.vip4);
    let pools: kube::Api<rivora_k8s::AddressPool> = kube::Api::all(kube.client.clone());
    let p: rivora_k8s::AddressPool = serde_json::from_value(json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "AddressPool",
        "metadata": { "name": "lab" },
        "spec": { "addresses": [t.vip4.to_string()] },
    }))
    .expect("an AddressPool");
    kube.block_on(pools.create(&Default::default(), &p))
        .expect("creating the AddressPool");

    let classes = kube.gateway_api_all("GatewayClass", "gatewayclasses");
    let class: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": { "name": "rivora" },
        "spec": { "controllerName": GATEWAY_CONTROLLER },
    }))
    .expect("a GatewayClass");
    kube.block_on(classes.create(&Default::default(), &class))
        .expect("creating the GatewayClass");
    let ports = nat_ports();
    w.k8s.create_service(&cluster_service("web", &ports));
    w.slices("web", &[vip], &ports, &[0, 1, 2], &[]);
    w.k8s.create_gateway_api(
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": "gw" },
            "spec": { "gatewayClassName": "rivora", "listeners": [
                { "name": "tcp", "protocol": "TCP", "port": VIP_PORT },
                { "name": "udp", "protocol": "UDP", "port": VIP_PORT } ] },
        }),
    );
    for (kind, plural, section) in [
        ("TCPRoute", "tcproutes", "tcp"),
        ("UDPRoute", "udproutes", "udp"),
    ] {
        w.k8s.create_gateway_api(
            kind,
            plural,
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
                "metadata": { "name": section },
                "spec": { "parentRefs": [{ "name": "gw", "sectionName": section }],
                          "rules": [{ "backendRefs": [{ "name": "web", "port": VIP_PORT }] }] },
            }),
        );
    }
    let get = |kind: &str, plural: &str, name: &str| -> Value {
        let api = kube.gateway_api(&w.k8s.name, kind, plural);
        kube.block_on(api.get_opt(name))
            .unwrap_or_else(|e| panic!("reading {kind} {name}: {e}"))
            .map(|o| serde_json::to_value(o).expect("JSON"))
            .unwrap_or(Value::Null)
    };
    let cond = |conds: &Value, type_: &str| -> (String, String) {
        conds
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == type_))
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["reason"].as_str().unwrap_or_default().to_string(),
                )
            })
            .unwrap_or_default()
    };
    let yes = |r: &str| ("True".to_string(), r.to_string());
    let gw = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        let g = get("Gateway", "gateways", "gw");
        let st = &g["status"];
        let ok = st["addresses"] == json!([{ "type": "IPAddress", "value": vip.to_string() }])
            && cond(&st["conditions"], "Programmed") == yes("Programmed")
            && st["listeners"]
                .as_array()
                .is_some_and(|l| l.len() == 2 && l.iter().all(|l| l["attachedRoutes"] == 1));
        ok.then_some(g)
    })
    .unwrap_or_else(|| {
        panic!(
            "the controller never wrote gw's address and status: {:#}",
            get("Gateway", "gateways", "gw")["status"]
        )
    });
    let st = &gw["status"];
    assert_eq!(cond(&st["conditions"], "Accepted"), yes("Accepted"));
    for l in st["listeners"].as_array().expect("listeners") {
        for (type_, want) in [
            ("Accepted", yes("Accepted")),
            ("Programmed", yes("Programmed")),
            ("ResolvedRefs", yes("ResolvedRefs")),
            ("Conflicted", ("False".into(), "NoConflicts".into())),
        ] {
            assert_eq!(
                cond(&l["conditions"], type_),
                want,
                "listener {}: {l:#}",
                l["name"]
            );
        }
    }
    let c = kube
        .block_on(classes.get("rivora"))
        .map(|o| serde_json::to_value(o).expect("JSON"))
        .expect("the class");
    assert_eq!(
        cond(&c["status"]["conditions"], "Accepted"),
        yes("Accepted")
    );
    for (kind, plural, name) in [
        ("TCPRoute", "tcproutes", "tcp"),
        ("UDPRoute", "udproutes", "udp"),
    ] {
        let parents = wait_for(PROGRAMMED, Duration::from_millis(100), || {
            let r = get(kind, plural, name);
            let p = r["status"]["parents"].as_array()?.first()?.clone();
            (cond(&p["conditions"], "ResolvedRefs") == yes("ResolvedRefs")).then_some(p)
        })
        .unwrap_or_else(|| {
            panic!(
                "{kind} {name}: no parent status: {}",
                get(kind, plural, name)
            )
        });
        assert_eq!(parents["controllerName"], GATEWAY_CONTROLLER);
        assert_eq!(cond(&parents["conditions"], "Accepted"), yes("Accepted"));
    }

    // rivorad forwards what the controller addressed.
    let none = BTreeSet::new();
    let names = [vip_name("tcp", sa(vip)), vip_name("udp", sa(vip))];
    wait_vips(
        &w.rd,
        "the Gateway's VIPs programmed",
        &[vip],
        PROGRAMMED,
        |m| {
            names
                .iter()
                .all(|n| has(m, n, &w.targets(&[0, 1, 2], false), &none))
        },
    );
    for p in [Proto::Tcp, Proto::Udp] {
        assert_spread(t, "controller-addressed Gateway", sa(vip), p, &[0, 1, 2]);
    }

    // No address left for a second Gateway.
    w.k8s.create_gateway_api(
        "Gateway",
        "gateways",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": "gw2" },
            "spec": { "gatewayClassName": "rivora", "listeners": [
                { "name": "tcp", "protocol": "TCP", "port": VIP_PORT } ] },
        }),
    );
    let gw2 = wait_for(PROGRAMMED, Duration::from_millis(100), || {
        let g = get("Gateway", "gateways", "gw2");
        (cond(&g["status"]["conditions"], "Programmed")
            == ("False".into(), "AddressNotAssigned".into()))
            .then_some(g)
    })
    .unwrap_or_else(|| panic!("gw2: {:#}", get("Gateway", "gateways", "gw2")["status"]));
    let msg = gw2["status"]["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == "Programmed"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("no free IPv4 address"), "{msg}");
    let ev = wait_for(PROGRAMMED, Duration::from_millis(200), || {
        let e = w.k8s.events_about("gw2");
        e.iter()
            .any(|(t, r, _)| t == "Warning" && r == "NoAddressAvailable")
            .then_some(e)
    });
    assert!(
        ev.is_some(),
        "no Warning Event on gw2: {:?}",
        w.k8s.events_about("gw2")
    );
    // gw kept its address.
    assert_eq!(
        get("Gateway", "gateways", "gw")["status"]["addresses"],
        json!([{ "type": "IPAddress", "value": vip.to_string() }])
    );
}
