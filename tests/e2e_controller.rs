//! rivora-controller end to end: the real binary, two replicas, against a
//! real kube-apiserver and etcd (`common::k8s::shared`).
//!
//! Each test keeps to itself on the shared API server: its own namespace
//! (where its Lease lives too), its own `loadBalancerClass` (its
//! controllers run with `-require-class`, so they never touch another
//! test's Services), and its own AddressPool (its controllers run with
//! `-pool-selector` for its label) whose namespaceSelector admits only
//! its namespace, on addresses no other test's pool holds.
//!
//! - `a_hundred_services_at_once_then_failover_restart_and_a_pool_deleted`:
//!   a pool and 100 Services created at once (every tenth dual-stack) get
//!   distinct addresses within the pool, their status and condition; the
//!   Services that cannot be served (a requested address outside every
//!   pool, one already taken, only SCTP ports) get a False condition and a
//!   Warning Event;
//!   the pool's status counts what is held; SIGKILL of the leader: the
//!   other replica takes over, writes (a new Service gets an address),
//!   and no earlier Service's status changes (their resourceVersions stay);
//!   both replicas restarted: every Service keeps its address, nothing is
//!   rewritten; the pool deleted: every Service keeps its address, flagged
//!   `AddressNotInPool`.
//! - `graceful_stop_releases_the_lease`: SIGTERM of the leader hands over
//!   at the other's next look, long before the Lease would expire.
//! - `a_sharing_key_stays_within_its_namespace`: a Service of another
//!   namespace with the same sharing key gets an address of its own, and
//!   asking for the first one's is refused, until the pool sets
//!   `allowSharingAcrossNamespaces`.
//! - `a_refused_write_leaves_the_status_that_won`: a leader whose view runs
//!   behind the API server writes a Service's first address from a version
//!   older than a status written meanwhile; the write is refused (409),
//!   and the status that won stays, with Rivora's condition: the address
//!   the leader picked is neither written over it nor kept (the next
//!   Service gets it).
//! - `an_address_removed_from_the_status_by_hand_is_not_written_back`: an
//!   address flagged `AddressNotInPool` after the pool shrank, removed from
//!   the status as the flag advises, stays removed; the Service gets an
//!   address of the pool instead.
//! - `a_new_leader_from_a_stale_list_renumbers_nothing`: SIGKILL of the
//!   leader, and a status written the moment the Lease changes hands, which
//!   the list the new leader (its view behind the API server) starts from
//!   lacks: its write from that list is refused, the status written
//!   meanwhile stays, and no earlier Service's status changes.
//!
//! The metrics and health endpoints are read on every replica.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::controller::{Controller, FAST_LEASE};
use common::k8s::{shared, write_kubeconfig, Identity, Kube, TestNs};
use common::traffic::wait_for;
use common::unique;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use rivora_k8s::AddressPool;
use serde_json::{json, Value};

/// A status write, an Event: on two cores shared with other tests.
const WRITTEN: Duration = Duration::from_secs(30);
/// How long a test watches for something that must not happen.
const HOLD: Duration = Duration::from_secs(5);

static POOLS: AtomicU32 = AtomicU32::new(0);

/// How far behind the API server a replica behind [`Lagging`] runs.
const LAG: Duration = Duration::from_secs(2);

/// Lease settings for replicas of a test with a lagging one: each of its
/// Lease requests is bounded by the retry period and each status write
/// by min(duration - renew deadline, 5 s), and every answer comes [`LAG`]
/// late.
const LAGGED_LEASE: [&str; 6] = [
    "-lease-duration",
    "15s",
    "-lease-renew-deadline",
    "10s",
    "-lease-retry-period",
    "4s",
];

/// One test's controllers at a time: a controller clears the
/// `rivora.io/AddressAssigned` condition of every Service that is not of
/// its class (it takes it for one that stopped being Rivora's), so two
/// tests' controllers would undo each other's conditions. The same holds
/// for two Rivora installations in one cluster (in the note).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One test's corner of the cluster: a namespace, a class, a pool, and a
/// directory for kubeconfig and logs.
struct Scope {
    k8s: TestNs,
    class: String,
    pool: String,
    /// The pool's IPv4 /24 and IPv6 /120, as (prefix, first octets).
    v4: [u8; 3],
    v6: String,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl Scope {
    fn new() -> Self {
        // A test that failed while holding it leaves nothing shared behind.
        let alone = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let kube = Kube::admin();
        let k8s = kube.namespace("ctl-");
        let dir = tempfile::tempdir().expect("a temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        write_kubeconfig(&kubeconfig, &shared().server.url, &Identity::admin());
        let n = POOLS.fetch_add(1, Ordering::Relaxed) as u8;
        let pool = unique("ctl-pool-");
        let s = Self {
            class: format!("test.rivora.io/{}", unique("c")),
            v4: [10, 200 + n, 7],
            v6: format!("fd00:c{n:x}::"),
            pool,
            k8s,
            dir,
            kubeconfig,
            _alone: alone,
        };
        s.create_pool();
        s
    }

    fn create_pool(&self) {
        let [a, b, c] = self.v4;
        let p: AddressPool = serde_json::from_value(json!({
            "apiVersion": "rivora.io/v1alpha1",
            "kind": "AddressPool",
            "metadata": { "name": self.pool, "labels": { "test.rivora.io/scope": self.pool } },
            "spec": {
                "addresses": [format!("{a}.{b}.{c}.0/24"), format!("{}/120", self.v6)],
                "namespaceSelector": {
                    "matchLabels": { "kubernetes.io/metadata.name": self.k8s.name },
                },
            },
        }))
        .expect("an AddressPool");
        let k = &self.k8s.kube;
        k.block_on(pools(k).create(&PostParams::default(), &p))
            .unwrap_or_else(|e| panic!("creating AddressPool {}: {e}", self.pool));
    }

    fn patch_pool(&self, patch: &Value) {
        let k = &self.k8s.kube;
        k.block_on(pools(k).patch(
            &self.pool,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        ))
        .unwrap_or_else(|e| panic!("patching AddressPool {}: {e}", self.pool));
    }

    fn delete_pool(&self) {
        let k = &self.k8s.kube;
        k.block_on(pools(k).delete(&self.pool, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("deleting AddressPool {}: {e}", self.pool));
    }

    fn in_pool(&self, a: IpAddr) -> bool {
        match a {
            IpAddr::V4(v) => v.octets()[..3] == self.v4,
            IpAddr::V6(v) => {
                let base: std::net::Ipv6Addr = self.v6.parse().expect("the pool's v6 base");
                v.segments()[..7] == base.segments()[..7] && v.segments()[7] < 0x100
            }
        }
    }

    fn controller(&self, identity: &str) -> Controller {
        self.controller_with(identity, &FAST_LEASE)
    }

    fn controller_with(&self, identity: &str, lease: &[&str]) -> Controller {
        self.controller_at(identity, &self.kubeconfig, lease)
    }

    /// A replica whose view of the API server runs [`LAG`] behind: it
    /// talks to it through `proxy`.
    fn lagging_controller(&self, identity: &str, proxy: &Lagging) -> Controller {
        let kubeconfig = self.dir.path().join(format!("{identity}.kubeconfig"));
        write_kubeconfig(&kubeconfig, &proxy.url, &Identity::admin());
        self.controller_at(identity, &kubeconfig, &LAGGED_LEASE)
    }

    fn controller_at(&self, identity: &str, kubeconfig: &Path, lease: &[&str]) -> Controller {
        self.controller_args(identity, kubeconfig, lease, true)
    }

    /// A replica that also serves Services of no class (the chart's
    /// `requireClass: false`): no other test makes a LoadBalancer Service
    /// without a class, so it meets only this test's.
    fn unclassed_controller(&self, identity: &str) -> Controller {
        self.controller_args(identity, &self.kubeconfig, &FAST_LEASE, false)
    }

    fn controller_args(
        &self,
        identity: &str,
        kubeconfig: &Path,
        lease: &[&str],
        require_class: bool,
    ) -> Controller {
        let selector = format!("test.rivora.io/scope={}", self.pool);
        let mut args = vec![
            "-namespace",
            &self.k8s.name,
            "-load-balancer-class",
            &self.class,
            "-pool-selector",
            &selector,
        ];
        if require_class {
            args.push("-require-class");
        }
        args.extend(lease);
        Controller::start(self.dir.path(), kubeconfig, identity, &args)
    }

    fn service(&self, name: &str, annotations: Value, spec: Value) -> Service {
        let mut s = json!({
            "type": "LoadBalancer",
            "loadBalancerClass": self.class,
            "ports": [{ "name": "tcp", "protocol": "TCP", "port": 80 }],
        });
        if let (Some(base), Value::Object(extra)) = (s.as_object_mut(), spec) {
            base.extend(extra);
        }
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": name, "namespace": self.k8s.name, "annotations": annotations },
            "spec": s,
        }))
        .expect("a Service")
    }

    /// Create all at once (concurrent requests).
    fn create_all(&self, svcs: Vec<Service>) {
        let k = &self.k8s.kube;
        let api: Api<Service> = Api::namespaced(k.client.clone(), &self.k8s.name);
        let pp = PostParams::default();
        let results = k.block_on(futures::future::join_all(
            svcs.iter().map(|s| api.create(&pp, s)),
        ));
        for (s, r) in svcs.iter().zip(results) {
            r.unwrap_or_else(|e| panic!("creating Service {:?}: {e}", s.metadata.name));
        }
    }

    /// Every Service of the namespace: name -> (resourceVersion, ingress
    /// IPs, the AddressAssigned condition).
    fn statuses(&self) -> BTreeMap<String, Seen> {
        let k = &self.k8s.kube;
        let api: Api<Service> = Api::namespaced(k.client.clone(), &self.k8s.name);
        k.block_on(api.list(&Default::default()))
            .expect("listing Services")
            .into_iter()
            .map(|s| {
                let v = serde_json::to_value(&s).expect("JSON");
                let ingress = v["status"]["loadBalancer"]["ingress"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|i| i["ip"].as_str()?.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default();
                let cond = v["status"]["conditions"]
                    .as_array()
                    .and_then(|c| {
                        c.iter()
                            .find(|c| c["type"] == "rivora.io/AddressAssigned")
                            .cloned()
                    })
                    .unwrap_or(Value::Null);
                (
                    v["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    Seen {
                        rv: v["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        ingress,
                        cond,
                    },
                )
            })
            .collect()
    }

    fn pool_status(&self) -> Value {
        let k = &self.k8s.kube;
        let p = k
            .block_on(pools(k).get(&self.pool))
            .unwrap_or_else(|e| panic!("reading AddressPool {}: {e}", self.pool));
        serde_json::to_value(p.status).expect("JSON")
    }

    fn lease_holder(&self) -> Option<String> {
        let k = &self.k8s.kube;
        let api: Api<Lease> = Api::namespaced(k.client.clone(), &self.k8s.name);
        k.block_on(api.get_opt("rivora-controller"))
            .expect("reading the Lease")
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    }

    /// Wait until the Lease names one of `who`; returns it.
    fn wait_holder(&self, who: &[&str], within: Duration) -> String {
        wait_for(within, Duration::from_millis(50), || {
            self.lease_holder().filter(|h| who.contains(&h.as_str()))
        })
        .unwrap_or_else(|| {
            panic!(
                "the Lease never named one of {who:?} within {within:?} (holder {:?})",
                self.lease_holder()
            )
        })
    }

    /// Wait until `ok` holds for the namespace's Services.
    fn wait_services(
        &self,
        what: &str,
        ok: impl Fn(&BTreeMap<String, Seen>) -> bool,
    ) -> BTreeMap<String, Seen> {
        let t0 = Instant::now();
        let mut last = BTreeMap::new();
        let got = wait_for(WRITTEN, Duration::from_millis(100), || {
            last = self.statuses();
            ok(&last).then(|| last.clone())
        });
        match got {
            Some(s) => {
                eprintln!("{what}: after {:?}", t0.elapsed());
                s
            }
            None => panic!("{what}: not so within {WRITTEN:?}; the Services: {last:#?}"),
        }
    }
}

/// Wait until a replica's log says a write of Service `ns/name`'s status
/// was refused because the Service had changed (409): the proof that a
/// test made the race it is about. A lagging replica hears the answer
/// [`LAG`] after its write landed.
fn wait_refused(c: &Controller, ns: &str, name: &str) {
    let target = format!("target=Service {ns}/{name} ");
    wait_for(WRITTEN, Duration::from_millis(100), || {
        c.log_text()
            .lines()
            .any(|l| l.contains("status changed under the write") && l.contains(&target))
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{} had no write of {ns}/{name}'s status refused: the race the test is about did not happen",
            c.identity
        )
    });
}

/// Wait until a replica's metrics say it leads.
fn wait_leads(m: SocketAddr, who: &str) {
    wait_for(WRITTEN, Duration::from_millis(100), || {
        (metric(&get(m, "/metrics").1, "rivora_controller_is_leader", &[]) == Some(1.0))
            .then_some(())
    })
    .unwrap_or_else(|| panic!("{who} never led"));
}

/// A TCP proxy to the API server that passes what the client sends at
/// once and what the server sends `lag` late: a replica behind it sees
/// every watch event and every answer `lag` after the API server had it
/// (a loaded API server, a slow link), while its writes land at once. The
/// lists it leads from are that old. Its threads stop on drop.
struct Lagging {
    url: String,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Lagging {
    fn start(upstream: SocketAddr, lag: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the lagging proxy");
        listener
            .set_nonblocking(true)
            .expect("a nonblocking listener");
        let url = format!("https://{}", listener.local_addr().expect("its address"));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let acceptor = {
            let (stop, conns) = (stop.clone(), conns.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((client, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let threads = lag_conn(client, upstream, lag, &stop);
                    let mut c = conns.lock().unwrap_or_else(PoisonError::into_inner);
                    c.retain(|h| !h.is_finished());
                    c.extend(threads);
                }
            })
        };
        Self {
            url,
            stop,
            acceptor: Some(acceptor),
            conns,
        }
    }
}

impl Drop for Lagging {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(PoisonError::into_inner));
        for h in conns {
            let _ = h.join();
        }
    }
}

/// One proxied connection: the client's bytes to the server at once; the
/// server's into a queue, stamped with when they are due; the queue to the
/// client, each chunk when due. Either side closing closes both, once
/// what the server sent before it closed has been delivered.
fn lag_conn(
    client: TcpStream,
    upstream: SocketAddr,
    lag: Duration,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
        return Vec::new();
    };
    for s in [&client, &server] {
        let _ = s.set_nonblocking(false);
        let _ = s.set_nodelay(true);
        // Reads wake up to look at `stop`.
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    }
    let pair = || Some((client.try_clone().ok()?, server.try_clone().ok()?));
    let (Some((c_up, s_up)), Some((c_down, s_down))) = (pair(), pair()) else {
        return Vec::new();
    };
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let up = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            copy_while(&c_up, &stop, |b| (&s_up).write_all(b).is_ok());
            close_both(&c_up, &s_up);
        })
    };
    let read_down = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            copy_while(&server, &stop, |b| {
                tx.send((Instant::now() + lag, b.to_vec())).is_ok()
            });
        })
    };
    let deliver = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            'queue: loop {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok((due, bytes)) => {
                        while let Some(wait) = due.checked_duration_since(Instant::now()) {
                            if stop.load(Ordering::Relaxed) {
                                break 'queue;
                            }
                            std::thread::sleep(wait.min(Duration::from_millis(50)));
                        }
                        if (&c_down).write_all(&bytes).is_err() {
                            break;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) if !stop.load(Ordering::Relaxed) => {}
                    Err(_) => break,
                }
            }
            close_both(&c_down, &s_down);
        })
    };
    vec![up, read_down, deliver]
}

/// Read `from` until it ends or fails, `sink` refuses, or `stop`.
fn copy_while(mut from: &TcpStream, stop: &AtomicBool, mut sink: impl FnMut(&[u8]) -> bool) {
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if !sink(&buf[..n]) {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

fn close_both(a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

fn pools(k: &Kube) -> Api<AddressPool> {
    Api::all(k.client.clone())
}

#[derive(Debug, Clone, PartialEq)]
struct Seen {
    rv: String,
    ingress: Vec<IpAddr>,
    cond: Value,
}

impl Seen {
    fn cond_is(&self, status: &str, reason: &str) -> bool {
        self.cond["status"] == status && self.cond["reason"] == reason
    }
}

/// GET `path` from a replica's metrics listener: (status code, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut r = String::new();
    s.read_to_string(&mut r).expect("response");
    let code = r
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = r.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}

/// A metric's value in a scrape (the first sample whose line starts with
/// `name` and contains every label in `labels`).
fn metric(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split([' ', '{']).next() == Some(name) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_hundred_services_at_once_then_failover_restart_and_a_pool_deleted() {
    let sc = Scope::new();
    let mut c1 = sc.controller("c1");
    let mut c2 = sc.controller("c2");
    let first = sc.wait_holder(&["c1", "c2"], WRITTEN);
    let m1 = c1.metrics_addr(WRITTEN);
    let m2 = c2.metrics_addr(WRITTEN);

    // 100 Services at once, every tenth dual stack, and three that cannot
    // be served as asked.
    let mut svcs: Vec<Service> = (0..100)
        .map(|i| {
            let spec = if i % 10 == 0 {
                json!({ "ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv4", "IPv6"] })
            } else {
                json!({})
            };
            sc.service(&format!("s{i:03}"), json!({}), spec)
        })
        .collect();
    let [a, b, c] = sc.v4;
    svcs.push(sc.service(
        "outside",
        json!({ "rivora.io/load-balancer-ips": "192.0.2.10" }),
        json!({}),
    ));
    // Nothing forwards SCTP: no address, and the condition says why.
    svcs.push(sc.service(
        "only-sctp",
        json!({}),
        json!({ "ports": [{ "name": "sctp", "protocol": "SCTP", "port": 9000 }] }),
    ));
    svcs.push(sc.service(
        "wants-taken",
        json!({ "rivora.io/load-balancer-ips": format!("{a}.{b}.{c}.250") }),
        json!({}),
    ));
    let holder = sc.service(
        "holds-250",
        json!({ "rivora.io/load-balancer-ips": format!("{a}.{b}.{c}.250") }),
        json!({}),
    );
    // The older Service keeps a disputed address: create it first.
    sc.create_all(vec![holder]);
    sc.wait_services("holds-250 assigned", |m| {
        m.get("holds-250")
            .is_some_and(|s| s.ingress == [IpAddr::from([a, b, c, 250])])
    });
    sc.create_all(svcs);
    let all = sc.wait_services("100 Services assigned, 3 refused", |m| {
        (0..100).all(|i| {
            m.get(&format!("s{i:03}"))
                .is_some_and(|s| s.ingress.len() == if i % 10 == 0 { 2 } else { 1 })
        }) && m
            .get("outside")
            .is_some_and(|s| s.cond_is("False", "AddressOutsidePools"))
            && m.get("wants-taken")
                .is_some_and(|s| s.cond_is("False", "AddressTaken"))
            && m.get("only-sctp")
                .is_some_and(|s| s.cond_is("False", "NoServablePort"))
    });
    let mut seen: BTreeSet<IpAddr> = BTreeSet::new();
    for (name, s) in &all {
        for ip in &s.ingress {
            assert!(sc.in_pool(*ip), "{name}: {ip} is outside the pool");
            assert!(seen.insert(*ip), "{ip} was given twice (again to {name})");
        }
        if name.starts_with('s') || name == "holds-250" {
            assert!(s.cond_is("True", "Assigned"), "{name}: {:?}", s.cond);
        }
    }
    for i in (0..100).step_by(10) {
        let s = &all[&format!("s{i:03}")];
        assert!(
            s.ingress[0].is_ipv4() && s.ingress[1].is_ipv6(),
            "s{i:03}: one address per family, in ipFamilies order: {:?}",
            s.ingress
        );
    }
    assert!(
        all["outside"].ingress.is_empty()
            && all["wants-taken"].ingress.is_empty()
            && all["only-sctp"].ingress.is_empty()
    );
    for (name, reason) in [
        ("outside", "AddressOutsidePools"),
        ("wants-taken", "AddressTaken"),
        ("only-sctp", "NoServablePort"),
    ] {
        let evs = wait_for(WRITTEN, Duration::from_millis(200), || {
            let e = sc.k8s.events_about(name);
            e.iter()
                .any(|(t, r, _)| t == "Warning" && r == reason)
                .then_some(e)
        })
        .unwrap_or_else(|| panic!("no Warning {reason} Event on {name}"));
        eprintln!("{name}: {evs:?}");
    }
    // The pool counts what is held: 101 IPv4 (the 100 and holds-250) and
    // 10 IPv6 of 256 each.
    let counted = wait_for(WRITTEN, Duration::from_millis(200), || {
        let p = sc.pool_status();
        (p["assigned"]["ipv4"] == 101 && p["assigned"]["ipv6"] == 10).then_some(p)
    })
    .unwrap_or_else(|| panic!("pool status: {}", sc.pool_status()));
    assert_eq!(counted["available"]["ipv4"], 256 - 101);
    assert_eq!(counted["available"]["ipv6"], 256 - 10);

    // Metrics and health on both replicas; one leader.
    for (m, who) in [(m1, "c1"), (m2, "c2")] {
        assert_eq!(get(m, "/healthz").0, 200, "{who} /healthz");
        assert_eq!(get(m, "/readyz").0, 200, "{who} /readyz");
        let body = get(m, "/metrics").1;
        let leads = metric(&body, "rivora_controller_is_leader", &[]);
        assert_eq!(
            leads,
            Some(if who == first { 1.0 } else { 0.0 }),
            "{who}:\n{body}"
        );
        if who == first {
            let pool = format!("pool=\"{}\"", sc.pool);
            let assigned = metric(
                &body,
                "rivora_controller_pool_addresses_assigned",
                &[&pool, "family=\"ipv4\""],
            );
            assert_eq!(assigned, Some(101.0), "{body}");
        }
    }

    // SIGKILL the leader: the other takes over, and writes nothing that
    // was already right.
    let (dead, alive) = if first == "c1" {
        (&mut c1, "c2")
    } else {
        (&mut c2, "c1")
    };
    let killed = Instant::now();
    dead.kill();
    sc.wait_holder(&[alive], WRITTEN);
    eprintln!(
        "{alive} holds the Lease {:?} after the kill",
        killed.elapsed()
    );
    sc.create_all(vec![sc.service("after-failover", json!({}), json!({}))]);
    let after = sc.wait_services("the new leader assigns", |m| {
        m.get("after-failover")
            .is_some_and(|s| s.ingress.len() == 1)
    });
    assert!(
        !seen.contains(&after["after-failover"].ingress[0]),
        "the new leader gave out a held address: {:?}",
        after["after-failover"]
    );
    std::thread::sleep(HOLD);
    let now = sc.statuses();
    for (name, s) in &all {
        assert_eq!(&now[name], s, "{name} changed across the failover");
    }

    // Both restarted (the survivor gracefully): every address kept.
    drop(c1);
    drop(c2);
    let _c3 = sc.controller("c3");
    let _c4 = sc.controller("c4");
    sc.wait_holder(&["c3", "c4"], WRITTEN);
    sc.create_all(vec![sc.service("after-restart", json!({}), json!({}))]);
    sc.wait_services("the restarted leader assigns", |m| {
        m.get("after-restart").is_some_and(|s| s.ingress.len() == 1)
    });
    std::thread::sleep(HOLD);
    let now = sc.statuses();
    for (name, s) in &after {
        assert_eq!(&now[name], s, "{name} changed across the restart");
    }

    // The pool goes: every Service keeps its address, flagged.
    sc.delete_pool();
    let flagged = sc.wait_services("addresses flagged", |m| {
        m.iter()
            .filter(|(_, s)| !s.ingress.is_empty())
            .all(|(_, s)| s.cond_is("True", "AddressNotInPool"))
    });
    for (name, s) in &now {
        assert_eq!(flagged[name].ingress, s.ingress, "{name} was re-addressed");
    }
    let evs = sc.k8s.events_about("s001");
    assert!(
        evs.iter()
            .any(|(t, r, _)| t == "Warning" && r == "AddressNotInPool"),
        "{evs:?}"
    );
}

#[test]
fn graceful_stop_releases_the_lease() {
    let sc = Scope::new();
    // A Lease that a dead holder keeps for 30 s: a hand-over within a
    // few seconds is a release.
    let slow = [
        "-lease-duration",
        "30s",
        "-lease-renew-deadline",
        "20s",
        "-lease-retry-period",
        "1s",
    ];
    let mut c1 = sc.controller_with("g1", &slow);
    sc.wait_holder(&["g1"], WRITTEN);
    let c2 = sc.controller_with("g2", &slow);
    // g2 is up and watching before g1 goes.
    let m2 = c2.metrics_addr(WRITTEN);
    wait_for(WRITTEN, Duration::from_millis(100), || {
        (get(m2, "/readyz").0 == 200).then_some(())
    })
    .expect("g2 ready");
    let t0 = Instant::now();
    let st = c1.stop().expect("g1 exited");
    assert!(st.success(), "g1 exited {st:?}:\n{}", c1.log_text());
    sc.wait_holder(&["g2"], Duration::from_secs(20));
    eprintln!("g2 took the Lease {:?} after g1's SIGTERM", t0.elapsed());
    let body = get(m2, "/metrics").1;
    let leads = wait_for(WRITTEN, Duration::from_millis(100), || {
        let b = get(m2, "/metrics").1;
        (metric(&b, "rivora_controller_is_leader", &[]) == Some(1.0)).then_some(())
    });
    assert!(
        leads.is_some(),
        "g2 holds the Lease but says it does not lead:\n{body}"
    );
}

/// The sharing key stays within a namespace: a tenant's Service in
/// another namespace with the same `rivora.io/sharing-key` and distinct
/// ports gets an address of its own, and asking for the first one's
/// address by name is `AddressTaken`, with a Warning Event. Once the
/// pool sets `allowSharingAcrossNamespaces`, a Service of the other
/// namespace joins it.
#[test]
fn a_sharing_key_stays_within_its_namespace() {
    let sc = Scope::new();
    let other = sc.k8s.kube.namespace("ctl-b-");
    let k = &sc.k8s.kube;
    // The pool admits both namespaces.
    let both = json!({ "spec": { "namespaceSelector": { "matchLabels": null, "matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In",
        "values": [sc.k8s.name, other.name] }] } } });
    let patch_pool = |p: &Value| {
        k.block_on(pools(k).patch(
            &sc.pool,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(p),
        ))
        .unwrap_or_else(|e| panic!("patching AddressPool {}: {e}", sc.pool));
    };
    patch_pool(&both);
    let _c = sc.controller("c1");
    sc.wait_holder(&["c1"], WRITTEN);

    let in_ns = |ns: &TestNs, name: &str, annotations: Value, port: (&str, i32)| {
        let mut s = sc.service(
            name,
            annotations,
            json!({
                "ports": [{ "name": "p", "protocol": port.0, "port": port.1 }],
            }),
        );
        s.metadata.namespace = Some(ns.name.clone());
        ns.create_service(&s);
    };
    let ingress = |ns: &TestNs, name: &str| -> Vec<IpAddr> {
        ns.service(name)
            .and_then(|s| s.status?.load_balancer?.ingress)
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i.ip.as_deref()?.parse().ok())
            .collect()
    };
    let wait_ingress = |ns: &TestNs, name: &str| -> IpAddr {
        wait_for(WRITTEN, Duration::from_millis(100), || {
            ingress(ns, name).first().copied()
        })
        .unwrap_or_else(|| panic!("{}/{name} got no address", ns.name))
    };
    let key = json!({ "rivora.io/sharing-key": "shared" });

    in_ns(&sc.k8s, "owner", key.clone(), ("TCP", 443));
    let a = wait_ingress(&sc.k8s, "owner");
    in_ns(&other, "joiner", key.clone(), ("UDP", 53));
    let b = wait_ingress(&other, "joiner");
    assert_ne!(a, b, "a Service of another namespace joined {a}");

    let mut asks = key.clone();
    asks["rivora.io/load-balancer-ips"] = json!(a.to_string());
    in_ns(&other, "asks", asks, ("UDP", 54));
    let evs = wait_for(WRITTEN, Duration::from_millis(200), || {
        let e = other.events_about("asks");
        e.iter()
            .any(|(t, r, m)| t == "Warning" && r == "AddressTaken" && m.contains("namespace"))
            .then_some(e)
    })
    .unwrap_or_else(|| {
        panic!(
            "no Warning AddressTaken naming the namespace on asks: {:?}",
            other.events_about("asks")
        )
    });
    eprintln!("asks: {evs:?}");
    assert!(ingress(&other, "asks").is_empty());

    // The pool allows it: a new Service of the other namespace joins.
    patch_pool(&json!({ "spec": { "allowSharingAcrossNamespaces": true } }));
    in_ns(&other, "welcome", key, ("UDP", 55));
    assert_eq!(wait_ingress(&other, "welcome"), a);
    assert_eq!(
        ingress(&sc.k8s, "owner"),
        [a],
        "the owner keeps its address"
    );
}

/// A write refused (409) because the Service changed under it leaves the
/// status that won. The leader runs [`LAG`] behind the API server, so it
/// computes the Service's first address from a version older than a
/// status written in between, and its write of it is refused: the address
/// it picked is neither written over the status that won nor kept for the
/// Service (the next Service gets it).
#[test]
fn a_refused_write_leaves_the_status_that_won() {
    let sc = Scope::new();
    let proxy = Lagging::start(shared().addr, LAG);
    let r1 = sc.lagging_controller("r1", &proxy);
    sc.wait_holder(&["r1"], WRITTEN);
    wait_leads(r1.metrics_addr(WRITTEN), "r1");
    let [a, b, c] = sc.v4;
    let won = IpAddr::from([a, b, c, 9]);
    sc.create_all(vec![sc.service("x", json!({}), json!({}))]);
    // Apart from the create by more than r1 takes to plan, well within
    // LAG: r1 writes x's first address from the version without it.
    std::thread::sleep(Duration::from_millis(500));
    sc.k8s.set_ingress("x", &[won]);
    let settled = sc.wait_services(
        "x keeps the status that won, with Rivora's condition",
        |m| {
            m.get("x")
                .is_some_and(|s| s.ingress == [won] && s.cond_is("True", "Assigned"))
        },
    );
    wait_refused(&r1, &sc.k8s.name, "x");
    std::thread::sleep(HOLD);
    assert_eq!(
        sc.statuses()["x"],
        settled["x"],
        "x changed after it settled"
    );

    // The address r1 picked for the refused write is free: the lowest.
    sc.create_all(vec![sc.service("y", json!({}), json!({}))]);
    let now = sc.wait_services("y assigned", |m| {
        m.get("y").is_some_and(|s| s.ingress.len() == 1)
    });
    assert_eq!(now["y"].ingress, [IpAddr::from([a, b, c, 0])]);
    assert_eq!(now["x"].ingress, [won]);
}

/// An address removed from a Service's status by hand stays removed: the
/// leader takes the status as the API server has it, which makes the
/// advice of the `AddressNotInPool` flag ("remove it from the status for
/// a new one") work, and assigns again by the usual rules.
#[test]
fn an_address_removed_from_the_status_by_hand_is_not_written_back() {
    let sc = Scope::new();
    let _c = sc.controller("h1");
    sc.wait_holder(&["h1"], WRITTEN);
    let [a, b, c] = sc.v4;
    let first = IpAddr::from([a, b, c, 0]);
    sc.create_all(vec![sc.service("x", json!({}), json!({}))]);
    sc.wait_services("x assigned", |m| {
        m.get("x")
            .is_some_and(|s| s.ingress == [first] && s.cond_is("True", "Assigned"))
    });

    // The pool shrinks to its upper half: x's address is in no pool, kept
    // and flagged, and the Warning says how to get a new one.
    sc.patch_pool(&json!({ "spec": { "addresses": [
        format!("{a}.{b}.{c}.128/25"), format!("{}/120", sc.v6),
    ] } }));
    sc.wait_services("x flagged", |m| {
        m.get("x")
            .is_some_and(|s| s.ingress == [first] && s.cond_is("True", "AddressNotInPool"))
    });
    let advice = "remove it from the status for a new one";
    wait_for(WRITTEN, Duration::from_millis(200), || {
        sc.k8s
            .events_about("x")
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "AddressNotInPool" && m.contains(advice))
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "no Warning AddressNotInPool with the advice on x: {:?}",
            sc.k8s.events_about("x")
        )
    });

    // The owner takes the advice.
    sc.k8s.set_ingress("x", &[]);
    let upper = IpAddr::from([a, b, c, 128]);
    let settled = sc.wait_services("x gets an address of the pool instead", |m| {
        m.get("x")
            .is_some_and(|s| s.ingress == [upper] && s.cond_is("True", "Assigned"))
    });
    std::thread::sleep(HOLD);
    assert_eq!(
        sc.statuses()["x"],
        settled["x"],
        "x changed after it settled"
    );
    let counted = wait_for(WRITTEN, Duration::from_millis(200), || {
        let p = sc.pool_status();
        (p["assigned"]["ipv4"] == 1).then_some(p)
    });
    assert!(counted.is_some(), "pool status: {}", sc.pool_status());
}

/// A new leader that starts from a list older than the API server keeps
/// the statuses written meanwhile. The leader is SIGKILLed; a Service is
/// created while no one leads; the moment the Lease names the other
/// replica, whose view runs [`LAG`] behind, the Service's status is
/// written: the list that replica leads from has the Service without an
/// address. Its write from that list is refused, the status written
/// meanwhile stays, and no earlier Service's status changes.
#[test]
fn a_new_leader_from_a_stale_list_renumbers_nothing() {
    let sc = Scope::new();
    let mut n1 = sc.controller_with("n1", &LAGGED_LEASE);
    sc.wait_holder(&["n1"], WRITTEN);
    let proxy = Lagging::start(shared().addr, LAG);
    let n2 = sc.lagging_controller("n2", &proxy);
    let m2 = n2.metrics_addr(WRITTEN);
    wait_for(WRITTEN, Duration::from_millis(100), || {
        (get(m2, "/readyz").0 == 200).then_some(())
    })
    .expect("n2 ready");
    sc.create_all(
        (0..4)
            .map(|i| sc.service(&format!("s{i}"), json!({}), json!({})))
            .collect(),
    );
    let before = sc.wait_services("n1 assigns", |m| {
        (0..4).all(|i| {
            m.get(&format!("s{i}"))
                .is_some_and(|s| s.ingress.len() == 1 && s.cond_is("True", "Assigned"))
        })
    });

    n1.kill();
    sc.create_all(vec![sc.service("late", json!({}), json!({}))]);
    // The API server has n2's write of the Lease; n2 hears of it LAG
    // later and leads from the list it has then, as old.
    sc.wait_holder(&["n2"], Duration::from_secs(60));
    let [a, b, c] = sc.v4;
    let meanwhile = IpAddr::from([a, b, c, 200]);
    sc.k8s.set_ingress("late", &[meanwhile]);
    let settled = sc.wait_services("late keeps the status written meanwhile", |m| {
        m.get("late")
            .is_some_and(|s| s.ingress == [meanwhile] && s.cond_is("True", "Assigned"))
    });
    wait_refused(&n2, &sc.k8s.name, "late");
    std::thread::sleep(HOLD);
    let now = sc.statuses();
    for (name, s) in &before {
        assert_eq!(&now[name], s, "{name} changed across the takeover");
    }
    assert_eq!(
        now["late"], settled["late"],
        "late changed after it settled"
    );
}

/// With unset classes accepted, a Service of no class that another load
/// balancer answered first (its status holds an address and no condition
/// of Rivora's) is left as it is, and an Event says so; one of no class
/// that nobody answered is Rivora's.
#[test]
fn a_service_another_load_balancer_answered_is_left_to_it() {
    let sc = Scope::new();
    let no_class = json!({ "loadBalancerClass": null });
    sc.k8s
        .create_service(&sc.service("theirs", json!({}), no_class.clone()));
    let foreign: IpAddr = "192.0.2.77".parse().expect("an address");
    sc.k8s.set_ingress("theirs", &[foreign]);
    let _c = sc.unclassed_controller("c1");
    sc.wait_holder(&["c1"], WRITTEN);
    sc.k8s
        .create_service(&sc.service("mine", json!({}), no_class));
    let mine = wait_for(WRITTEN, Duration::from_millis(100), || {
        sc.k8s
            .service("mine")
            .and_then(|s| s.status?.load_balancer?.ingress)
            .and_then(|i| i.first()?.ip.clone())
    });
    assert!(
        mine.is_some(),
        "a Service of no class nobody answered got no address"
    );
    let event = wait_for(WRITTEN, Duration::from_millis(100), || {
        sc.k8s.events_about("theirs").into_iter().find(|(t, r, m)| {
            t == "Warning" && r == "LeftToAnotherLoadBalancer" && m.contains("192.0.2.77")
        })
    });
    assert!(
        event.is_some(),
        "no Event on theirs: {:?}",
        sc.k8s.events_about("theirs")
    );
    // As that implementation wrote it (the API server adds ipMode).
    let theirs = sc.k8s.service("theirs").expect("theirs");
    let status = serde_json::to_value(theirs.status).expect("json");
    assert_eq!(
        status,
        json!({ "loadBalancer": { "ingress": [{ "ip": "192.0.2.77", "ipMode": "VIP" }] } }),
        "Rivora wrote on another implementation's Service"
    );
}

/// Two installations, each with a class of its own, in one cluster: one
/// never clears the other's condition (the Services' status as the other
/// wrote it stays).
#[test]
fn another_installations_condition_is_left_alone() {
    let sc = Scope::new();
    let other_class = json!({ "loadBalancerClass": unique("other.example/lb-") });
    sc.k8s
        .create_service(&sc.service("its", json!({}), other_class));
    let status = json!({
        "loadBalancer": { "ingress": [{ "ip": "192.0.2.78" }] },
        "conditions": [{ "type": "rivora.io/AddressAssigned", "status": "True",
            "reason": "Assigned", "message": "assigned 192.0.2.78 (the other installation)",
            "lastTransitionTime": "2026-01-01T00:00:00Z" }],
    });
    let k = &sc.k8s.kube;
    let api: Api<Service> = Api::namespaced(k.client.clone(), &sc.k8s.name);
    k.block_on(api.patch_status(
        "its",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&json!({ "status": status })),
    ))
    .expect("the other installation's status");
    let _c = sc.controller("c1");
    sc.wait_holder(&["c1"], WRITTEN);
    sc.k8s
        .create_service(&sc.service("mine", json!({}), json!({})));
    let mine = wait_for(WRITTEN, Duration::from_millis(100), || {
        sc.k8s
            .service("mine")
            .and_then(|s| s.status?.load_balancer?.ingress)
            .and_then(|i| i.first()?.ip.clone())
    });
    assert!(mine.is_some(), "this installation's Service got no address");
    let conditions = sc
        .k8s
        .service("its")
        .and_then(|s| s.status?.conditions)
        .unwrap_or_default();
    assert_eq!(
        conditions
            .iter()
            .map(|c| c.message.as_str())
            .collect::<Vec<_>>(),
        ["assigned 192.0.2.78 (the other installation)"],
        "the other installation's condition was cleared"
    );
}

/// The owner of a shared address that changes its own ports to clash with
/// a later joiner keeps the address; the joiner moves, told why.
#[test]
fn an_owner_changing_its_ports_keeps_its_address() {
    let sc = Scope::new();
    let _c = sc.controller("c1");
    sc.wait_holder(&["c1"], WRITTEN);
    let key = json!({ "rivora.io/sharing-key": "k" });
    let ingress = |name: &str| -> Option<String> {
        sc.k8s
            .service(name)
            .and_then(|s| s.status?.load_balancer?.ingress)
            .and_then(|i| i.first()?.ip.clone())
    };
    let wait_ingress = |name: &str, not: Option<&str>| -> String {
        wait_for(WRITTEN, Duration::from_millis(100), || {
            ingress(name).filter(|a| Some(a.as_str()) != not)
        })
        .unwrap_or_else(|| panic!("{name} got no (new) address: {:?}", ingress(name)))
    };
    sc.k8s.create_service(&sc.service(
        "owner",
        key.clone(),
        json!({ "ports": [{ "name": "tcp", "protocol": "TCP", "port": 53 }] }),
    ));
    let a = wait_ingress("owner", None);
    // Created later: a joiner.
    std::thread::sleep(Duration::from_millis(1100));
    sc.k8s.create_service(&sc.service(
        "joiner",
        key,
        json!({ "ports": [{ "name": "udp", "protocol": "UDP", "port": 53 }] }),
    ));
    assert_eq!(
        wait_ingress("joiner", None),
        a,
        "the joiner shares the owner's address"
    );
    sc.k8s.patch_service(
        "owner",
        &json!({ "spec": { "ports": [
            { "name": "tcp", "protocol": "TCP", "port": 53 },
            { "name": "udp", "protocol": "UDP", "port": 53 },
        ] } }),
    );
    let b = wait_ingress("joiner", Some(&a));
    assert_ne!(a, b);
    assert_eq!(
        ingress("owner").as_deref(),
        Some(a.as_str()),
        "the owner lost its address"
    );
    let told = wait_for(WRITTEN, Duration::from_millis(100), || {
        sc.k8s
            .events_about("joiner")
            .into_iter()
            .find(|(t, r, m)| t == "Warning" && r == "AddressConflict" && m.contains("owner"))
    });
    assert!(told.is_some(), "{:?}", sc.k8s.events_about("joiner"));
}
