//! The reconciler over an in-memory map store: sources, ownership,
//! pruning and what each change writes. No root needed.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;

use super::*;
use crate::dataplane::MemStore;
use crate::healthcheck::HealthCheckSpec;
use crate::model::{Affinity, Backend, Ports, Protocol};

/// MACs made from the address; `.99` never resolves. Counts lookups.
#[derive(Default, Clone)]
struct FixedFacts {
    resolves: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FixedFacts {
    fn resolves(&self) -> usize {
        self.resolves.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl NodeFacts for FixedFacts {
    fn interface(&self, _name: &str) -> Result<(u32, Mac), NetError> {
        Ok((7, Mac([2, 0, 0, 0, 0, 7])))
    }

    fn resolve_mac(&self, addr: IpAddr, _wait: Duration) -> Result<Mac, NetError> {
        self.resolves
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match addr {
            IpAddr::V4(a) if a.octets()[3] == 99 => {
                Err(NetError::Unresolved { addr, waited_ms: 0 })
            }
            IpAddr::V4(a) => Ok(Mac([2, 0, 0, 0, 1, a.octets()[3]])),
            IpAddr::V6(_) => Ok(Mac([2, 0, 0, 0, 2, 1])),
        }
    }

    fn route_source(&self, addr: IpAddr) -> Result<IpAddr, NetError> {
        match addr {
            IpAddr::V4(_) => Ok(IpAddr::V4([10, 0, 0, 254].into())),
            IpAddr::V6(_) => Ok("fd00::254".parse().expect("address")),
        }
    }

    fn prepare_local_source(&self, _interfaces: &[String]) {}

    /// `.253` of the test's networks is the node's own.
    fn addresses(&self) -> BTreeSet<IpAddr> {
        BTreeSet::from([IpAddr::V4([10, 0, 0, 253].into())])
    }
}

struct Harness {
    rec: Reconciler<MemStore, FixedFacts>,
    facts: FixedFacts,
    events: tokio::sync::mpsc::UnboundedReceiver<HealthEvent<ProbeKey>>,
    reader: status::StatusReader,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn harness_over(store: MemStore) -> Harness {
    // A worker of its own, so the checker's probes run while the test
    // thread waits.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (checker, events) = HealthChecker::new(rt.handle().clone());
    let dir = tempfile::tempdir().unwrap();
    let (publisher, reader) = status::channel();
    let writer = Writer::open(store).unwrap();
    let facts = FixedFacts::default();
    let mut rec = Reconciler::new(
        writer,
        facts.clone(),
        checker,
        Drains::new(),
        DrainStore::new(dir.path()),
        publisher,
    );
    rec.submit(Command::SetNode(NodeConf {
        interfaces: vec!["eth0".into()],
        ..Default::default()
    }));
    Harness {
        rec,
        facts,
        events,
        reader,
        _rt: rt,
        _dir: dir,
    }
}

fn harness() -> Harness {
    harness_over(MemStore::new(crate::abi::MAGLEV_DEFAULT_SIZE))
}

fn vip(addr: &str, port: u16, backends: &[&str]) -> DesiredVip {
    DesiredVip::unprobed(Vip {
        addr: addr.parse().unwrap(),
        ports: Ports::One(port),
        proto: Protocol::Tcp,
        mode: Mode::Nat,
        affinity: Default::default(),
        rate_limit: None,
        source_ranges: None,
        backends: backends
            .iter()
            .map(|b| Backend::new(b.parse().unwrap(), 8080))
            .collect(),
    })
}

fn file() -> Owner {
    Owner::new(SourceKind::File, "/etc/rivora/rivora.yaml")
}

fn svc(name: &str) -> Owner {
    Owner::new(SourceKind::Service, name)
}

impl Harness {
    /// Send `vips` for `owner` and return what the reconciler answered.
    fn set(&mut self, owner: Owner, vips: Vec<DesiredVip>) -> Applied {
        let (tx, mut rx) = oneshot::channel();
        self.rec.submit(Command::SetDesired {
            owner,
            vips,
            ack: Some(tx),
        });
        rx.try_recv().expect("answered after the apply")
    }

    /// Backend addresses the maps hold for `key`, through its Maglev slice.
    fn backends_in_maps(&self, key: &VipKey) -> BTreeSet<IpAddr> {
        let img = &self.rec.writer().store().image;
        let info = self
            .rec
            .writer()
            .vips()
            .into_iter()
            .find(|v| v.key == Some(*key))
            .expect("the VIP is in the maps");
        let svc = img.services.get(&info.svc_id).expect("service entry");
        (svc.slice_start..svc.slice_start + svc.slice_len)
            .filter_map(|slot| img.slots.get(&slot))
            .map(|id| img.backends.get(id).expect("backend entry").addr)
            .collect()
    }

    fn status(&self) -> std::sync::Arc<DataplaneStatus> {
        self.reader.current()
    }

    fn health(&self, t: &BackendTarget) -> Option<Health> {
        self.rec.writer().health(t)
    }

    /// Hand the checker's next verdict to the reconciler, as rivorad's
    /// forwarding task does.
    fn next_verdict(&mut self, within: Duration) -> HealthEvent<ProbeKey> {
        let deadline = Instant::now() + within;
        loop {
            match self.events.try_recv() {
                Ok(ev) => {
                    self.rec.submit(Command::Health(ev.clone()));
                    return ev;
                }
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("no health verdict within {within:?}: {e}"),
            }
        }
    }

    fn verdict(&mut self, key: ProbeKey, up: bool) {
        self.rec.submit(Command::Health(HealthEvent {
            key,
            addr: SocketAddr::new(key.1.addr, key.1.port),
            state: if up {
                HealthState::Healthy
            } else {
                HealthState::Down
            },
            detail: Ok(crate::healthcheck::ProbeOk { status: None }),
        }));
    }
}

/// A VIP on the loopback whose one backend is `backend`, probed by
/// `spec` (or not).
fn local_vip(port: u16, backend: SocketAddr, spec: Option<HealthCheckSpec>) -> DesiredVip {
    let mut v = vip("10.0.0.1", port, &[]);
    v.vip.backends = vec![Backend::new(backend.ip(), backend.port())];
    v.health = vec![spec.map(Arc::new)];
    v
}

fn quick_probe() -> HealthCheckSpec {
    HealthCheckSpec {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(50),
        rise: 2,
        fall: 2,
        ..Default::default()
    }
}

/// Maps left by a run in which `backend` (of one VIP on `port`) was down.
fn maps_with_backend_down(port: u16, backend: SocketAddr) -> MemStore {
    let mut before = harness();
    assert!(before
        .set(file(), vec![local_vip(port, backend, None)])
        .ok());
    let t = BackendTarget {
        addr: backend.ip(),
        port: backend.port(),
    };
    before.rec.writer.set_health(&t, Probe::Down).unwrap();
    before.rec.writer().store().clone()
}

/// The daemon applies its first configuration before it attaches: the
/// node settings written then know no interface. Once attached, an
/// interface run as generic XDP must be marked so in them (the datapath
/// never redirects into it), without waiting for another change.
#[test]
fn a_generic_xdp_interface_is_marked_once_attached() {
    let mut h = harness();
    assert!(h.set(file(), vec![vip("10.0.0.1", 80, &["10.1.0.1"])]).ok());
    let node = |h: &Harness| h.rec.writer().store().image.node.clone();
    assert_eq!(node(&h).interface_macs.keys().collect::<Vec<_>>(), [&7]);
    assert!(node(&h).generic_xdp.is_empty(), "nothing attached yet");
    let info = |mode| InterfaceInfo {
        name: "eth0".into(),
        ifindex: 7,
        xdp_mode: Some(mode),
    };
    h.rec
        .set_attached(vec![info(XdpMode::Generic)], Capacities::default());
    assert_eq!(node(&h).generic_xdp, BTreeSet::from([7]));
    h.rec
        .set_attached(vec![info(XdpMode::Native)], Capacities::default());
    assert!(node(&h).generic_xdp.is_empty(), "native again");
}

#[test]
fn an_adopted_down_backend_comes_back_after_rise_successes() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = listener.local_addr().unwrap();
    let t = BackendTarget {
        addr: backend.ip(),
        port: backend.port(),
    };
    let mut h = harness_over(maps_with_backend_down(80, backend));
    assert_eq!(
        h.health(&t),
        Some(Health::Down),
        "applied before any source spoke: an adopted-down backend stays down"
    );
    assert!(h
        .set(file(), vec![local_vip(80, backend, Some(quick_probe()))])
        .ok());
    assert_eq!(
        h.health(&t),
        Some(Health::Down),
        "a restart does not resurrect a backend the maps held as down"
    );
    let key = (h.status().vips[0].key, t);
    assert_eq!(
        h.status().vips[0].backends[0].probe,
        ProbeStatus::Is(HealthState::Down)
    );
    let ev = h.next_verdict(Duration::from_secs(10));
    assert_eq!((ev.key, ev.state), (key, HealthState::Healthy));
    assert_eq!(h.health(&t), Some(Health::Healthy));
    let probes = h
        .rec
        .checker
        .status()
        .iter()
        .find(|s| s.key == key)
        .map(|s| s.probes)
        .unwrap();
    assert!(
        probes >= 2,
        "healthy only after rise (2) successes: {probes} probes"
    );
    drop(listener);
}

#[test]
fn a_backend_whose_probe_is_removed_becomes_healthy() {
    let backend: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let t = BackendTarget {
        addr: backend.ip(),
        port: backend.port(),
    };
    let mut h = harness_over(maps_with_backend_down(80, backend));
    // The file no longer probes it: nothing would ever bring it back.
    assert!(h.set(file(), vec![local_vip(80, backend, None)]).ok());
    assert_eq!(h.health(&t), Some(Health::Healthy));
    assert_eq!(h.status().vips[0].backends[0].probe, ProbeStatus::Disabled);
}

#[test]
fn a_backend_of_two_vips_is_down_while_either_probe_fails() {
    // Always up: the real probes agree with the initial state and send
    // nothing, so the verdicts below are the only ones.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = listener.local_addr().unwrap();
    let t = BackendTarget {
        addr: backend.ip(),
        port: backend.port(),
    };
    let mut h = harness();
    let slow = HealthCheckSpec {
        interval: Duration::from_secs(30),
        ..Default::default()
    };
    let a = local_vip(80, backend, Some(slow.clone()));
    let mut b = local_vip(443, backend, Some(HealthCheckSpec { rise: 1, ..slow }));
    b.vip.addr = "10.0.0.2".parse().unwrap();
    let (ka, kb) = ((a.vip.key(), t), (b.vip.key(), t));
    assert!(h.set(file(), vec![a, b]).ok());
    assert_eq!(h.health(&t), Some(Health::Healthy));
    h.verdict(ka, false);
    assert_eq!(h.health(&t), Some(Health::Down));
    h.verdict(kb, false);
    h.verdict(ka, true);
    assert_eq!(h.health(&t), Some(Health::Down), "B's probe still fails");
    h.verdict(kb, true);
    assert_eq!(h.health(&t), Some(Health::Healthy));
    // A failed probe wins over a drain: drained and down reads as down,
    // and the drain survives the probe's recovery.
    let (tx, mut rx) = oneshot::channel();
    h.rec.submit(Command::Drain {
        target: backend,
        vip: None,
        drain: true,
        reply: tx,
    });
    assert!(rx.try_recv().unwrap().is_ok());
    assert_eq!(h.health(&t), Some(Health::Draining));
    h.verdict(ka, false);
    assert_eq!(h.health(&t), Some(Health::Down));
    h.verdict(ka, true);
    assert_eq!(h.health(&t), Some(Health::Draining));
    drop(listener);
}

#[test]
fn a_second_claim_is_one_error_naming_both_owners_and_the_first_keeps_forwarding() {
    let mut h = harness();
    let a = vip("10.0.0.1", 80, &["10.1.0.1"]);
    let key = a.vip.key();
    assert!(h.set(file(), vec![a]).ok());
    let refused = h.set(svc("ns/web"), vec![vip("10.0.0.1", 80, &["10.1.0.2"])]);
    assert_eq!(refused.failed.len(), 1, "{refused:?}");
    let msg = &refused.failed[0].1;
    assert!(
        msg.contains("file /etc/rivora/rivora.yaml") && msg.contains("service ns/web"),
        "{msg}"
    );
    assert_eq!(
        h.backends_in_maps(&key),
        BTreeSet::from(["10.1.0.1".parse().unwrap()]),
        "the first owner's VIP is what the maps hold"
    );
    let st = h.status();
    assert_eq!(st.conflicts.len(), 1);
    assert_eq!(st.conflicts[0].owner, file());
    assert_eq!(st.conflicts[0].refused, svc("ns/web"));
    assert_eq!(st.vips.len(), 1);
    assert_eq!(st.vips[0].owner, Some(file()));
    let service = &st.sources[&SourceKind::Service];
    assert_eq!((service.updates_ok, service.updates_failed), (0, 1));
    assert!(service
        .last_error
        .as_deref()
        .unwrap()
        .contains("claimed by"));

    // The owner lets go: the waiting claim takes over, conflict gone.
    assert!(h.set(file(), vec![]).ok());
    assert_eq!(
        h.backends_in_maps(&key),
        BTreeSet::from(["10.1.0.2".parse().unwrap()])
    );
    let st = h.status();
    assert!(st.conflicts.is_empty());
    assert_eq!(st.vips[0].owner, Some(svc("ns/web")));
}

#[test]
fn adopted_vips_stay_until_every_source_has_synced() {
    // A previous run left two VIPs in the maps.
    let mut before = harness();
    let mut old = vip("10.0.0.1", 80, &["10.1.0.1", "10.1.0.2"]);
    old.vip.backends[1].weight = 3;
    old.vip.affinity = Affinity::ClientIp { timeout_s: 300 };
    let kept = vip("10.0.0.2", 80, &["10.1.0.1"]);
    assert!(before.set(file(), vec![old.clone(), kept.clone()]).ok());
    let store = before.rec.writer().store().clone();

    let mut h = harness_over(store);
    h.rec.register(SourceKind::Service);
    h.rec.register(SourceKind::Gateway);
    assert!(h.set(svc("ns/kept"), vec![kept.clone()]).ok());
    let live = |h: &Harness| -> BTreeSet<VipKey> {
        h.rec.writer().vips().iter().filter_map(|v| v.key).collect()
    };
    assert!(
        live(&h).contains(&old.vip.key()),
        "nothing synced yet: the unclaimed VIP keeps forwarding"
    );
    assert_eq!(h.status().unclaimed, 1);
    // The status lists it, unowned, as the maps hold it: mode, affinity,
    // backends, and for weights the slots each holds (the maps keep no
    // weights), in service id order with the claimed one.
    let st = h.status();
    let owners: Vec<_> = st.vips.iter().map(|v| (v.key, v.owner.clone())).collect();
    assert_eq!(
        owners,
        [
            (old.vip.key(), None),
            (kept.vip.key(), Some(svc("ns/kept")))
        ]
    );
    let u = &st.vips[0];
    assert_eq!(
        (u.mode, u.affinity),
        (Mode::Nat, Affinity::ClientIp { timeout_s: 300 })
    );
    let targets: Vec<_> = u
        .backends
        .iter()
        .map(|b| (b.target.addr, b.service_port))
        .collect();
    assert_eq!(
        targets,
        [
            ("10.1.0.1".parse().unwrap(), 8080),
            ("10.1.0.2".parse().unwrap(), 8080)
        ]
    );
    let (w1, w3) = (u.backends[0].weight, u.backends[1].weight);
    assert_eq!(w1 + w3, u.slice.len, "every slot is one backend's");
    assert!(
        w3 > 2 * w1,
        "weight 3 holds about 3x the slots of weight 1: {w1} {w3}"
    );
    assert!(u.serving());
    h.rec.submit(Command::Synced(SourceKind::Service));
    assert!(
        live(&h).contains(&old.vip.key()),
        "the Gateway source has not synced: still kept"
    );
    h.rec.submit(Command::Synced(SourceKind::Gateway));
    assert_eq!(live(&h), BTreeSet::from([kept.vip.key()]));
    assert_eq!(h.status().unclaimed, 0);
    assert_eq!(h.status().vips.len(), 1, "pruned: no longer listed");
}

#[test]
fn a_drain_for_one_vip_rewrites_that_vip_alone() {
    let mut h = harness();
    // DSR, so that rendering a VIP also means resolving its backends'
    // MACs: a re-render of every VIP would show in the count.
    let vips: Vec<DesiredVip> = (1..=50)
        .map(|i| {
            let mut v = vip(&format!("10.0.0.{i}"), 80, &["10.1.0.1", "10.1.0.2"]);
            v.vip.mode = Mode::Dsr;
            v.vip.backends.iter_mut().for_each(|b| b.port = 0);
            v
        })
        .collect();
    let key = vips[6].vip.key();
    assert!(h.set(file(), vips).ok());
    let svc_id = h
        .rec
        .writer()
        .vips()
        .into_iter()
        .find(|v| v.key == Some(key))
        .unwrap()
        .svc_id;
    h.rec.writer.store_mut().service_writes.clear();
    let resolves = h.facts.resolves();

    let (tx, mut rx) = oneshot::channel();
    h.rec.submit(Command::Drain {
        target: "10.1.0.1:80".parse().unwrap(),
        vip: Some(key),
        drain: true,
        reply: tx,
    });
    let done = rx.try_recv().unwrap().expect("drained");
    assert_eq!(done.vips, vec![key]);
    assert!(done.changed);
    assert_eq!(
        h.rec.writer().store().service_writes,
        vec![svc_id],
        "only the drained VIP's service entry is written"
    );
    assert!(
        h.facts.resolves() - resolves <= 2,
        "only the drained VIP's backends were resolved again ({} lookups)",
        h.facts.resolves() - resolves
    );
    assert_eq!(
        h.backends_in_maps(&key),
        BTreeSet::from(["10.1.0.2".parse().unwrap()]),
        "no new flows to the drained backend for this VIP"
    );
    let other = VipKey {
        addr: "10.0.0.8".parse().unwrap(),
        ports: Ports::One(80),
        proto: Protocol::Tcp,
    };
    assert_eq!(h.backends_in_maps(&other).len(), 2, "other VIPs untouched");
    let st = h.status();
    let b = st
        .vips
        .iter()
        .find(|v| v.key == key)
        .unwrap()
        .backends
        .iter()
        .find(|b| b.target.addr.to_string() == "10.1.0.1")
        .unwrap()
        .clone();
    assert!(b.drained);
    assert_eq!(b.weight, 0);
}

#[test]
fn sending_the_same_state_again_writes_nothing() {
    let mut h = harness();
    let vips: Vec<DesiredVip> = (1..=20)
        .map(|i| vip(&format!("10.0.0.{i}"), 80, &["10.1.0.1"]))
        .collect();
    assert!(h.set(file(), vips.clone()).ok());
    let ops = h.rec.writer().store().ops;
    assert!(h.set(file(), vips).ok());
    assert_eq!(h.rec.writer().store().ops, ops);
    assert_eq!(h.status().sources[&SourceKind::File].updates_ok, 2);
}

#[test]
fn an_unresolvable_dsr_backend_fails_its_vip_only_and_the_old_state_stays() {
    let mut h = harness();
    let mut dsr = vip("10.0.0.1", 80, &["10.1.0.1"]);
    dsr.vip.mode = Mode::Dsr;
    // DSR cannot change the port: the backend serves the VIP's.
    dsr.vip.backends[0].port = 0;
    let nat = vip("10.0.0.2", 80, &["10.1.0.1"]);
    let r = h.set(file(), vec![dsr.clone(), nat.clone()]);
    assert!(r.ok(), "{r:?}");
    // The DSR VIP gains a backend whose MAC cannot be found.
    let mut dsr2 = dsr.clone();
    dsr2.vip
        .backends
        .push(Backend::new("10.1.0.99".parse().unwrap(), 0));
    dsr2.health.push(None);
    let mut nat2 = nat.clone();
    nat2.vip
        .backends
        .push(Backend::new("10.1.0.3".parse().unwrap(), 8080));
    nat2.health.push(None);
    let r = h.set(file(), vec![dsr2, nat2]);
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert_eq!(r.failed[0].0, dsr.vip.key());
    assert!(r.failed[0].1.contains("10.1.0.99"), "{:?}", r.failed);
    assert_eq!(
        h.backends_in_maps(&dsr.vip.key()),
        BTreeSet::from(["10.1.0.1".parse().unwrap()]),
        "the DSR VIP keeps its previous state"
    );
    assert_eq!(
        h.backends_in_maps(&nat.vip.key()).len(),
        2,
        "the rest applied"
    );
    assert!(h.status().failed.contains_key(&dsr.vip.key()));
}

#[test]
fn run_serves_a_channel_and_coalesces_a_burst_into_one_apply() {
    let h = harness();
    let reader = h.reader.clone();
    let applies_before = reader.current().applies;
    let (tx, rx) = mpsc::channel();
    let mut acks = Vec::new();
    for i in 1..=10 {
        let (a, r) = oneshot::channel();
        acks.push(r);
        tx.send(Command::SetDesired {
            owner: svc(&format!("ns/s{i}")),
            vips: vec![vip(&format!("10.0.0.{i}"), 80, &["10.1.0.1"])],
            ack: Some(a),
        })
        .unwrap();
    }
    tx.send(Command::Shutdown).unwrap();
    let Harness { rec, _rt, _dir, .. } = h;
    rec.run(rx);
    for r in acks {
        assert!(r.blocking_recv().unwrap().ok());
    }
    let st = reader.current();
    assert_eq!(st.vips.len(), 10);
    assert_eq!(st.applies, applies_before + 1, "one apply for the burst");
}

#[test]
fn run_reclaims_what_an_apply_retired_after_a_grace_period_waited_for_beside_it() {
    let h = harness();
    let (tx, rx) = mpsc::channel();
    let Harness {
        mut rec, _rt, _dir, ..
    } = h;
    let server = std::thread::spawn(move || {
        rec.serve(&rx);
        rec
    });
    // Each update switches the VIP to a new slice and retires the old.
    for n in 1..=3 {
        let (a, r) = oneshot::channel();
        let backends: Vec<String> = (1..=n).map(|i| format!("10.1.0.{i}")).collect();
        let backends: Vec<&str> = backends.iter().map(String::as_str).collect();
        tx.send(Command::SetDesired {
            owner: svc("ns/web"),
            vips: vec![vip("10.0.0.1", 80, &backends)],
            ack: Some(a),
        })
        .unwrap();
        assert!(r.blocking_recv().unwrap().ok());
    }
    // The grace periods (instant over MemStore) end beside the reconciler,
    // which looks every few milliseconds while one is asked for.
    std::thread::sleep(Duration::from_secs(1));
    tx.send(Command::Shutdown).unwrap();
    let rec = server.join().unwrap();
    assert_eq!(
        rec.writer().pending_reclaim(),
        0,
        "retired slices reclaimed without the shutdown's own wait"
    );
    let live: u32 = rec.writer().vips().iter().map(|v| v.slice.len).sum();
    assert_eq!(
        rec.writer().free_slots() + live,
        rec.writer().store().table_size()
    );
}

/// A Service or Gateway may not take an address the node holds (its API
/// server, its kubelet would be forwarded to someone's pods): the VIP is
/// refused, named, and nothing of it reaches the maps; another VIP of the
/// same Service is applied. The file may (the operator's word).
#[test]
fn a_service_may_not_capture_the_nodes_own_address() {
    let mut h = harness();
    let own = vip("10.0.0.253", 6443, &["10.1.0.1"]);
    let fine = vip("10.0.0.20", 80, &["10.1.0.1"]);
    let r = h.set(svc("team-a/grab"), vec![own.clone(), fine.clone()]);
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert_eq!(r.failed[0].0, own.vip.key());
    assert!(
        r.failed[0]
            .1
            .contains("10.0.0.253 is an address of this node: service team-a/grab"),
        "{:?}",
        r.failed
    );
    let in_maps = |h: &Harness, k: VipKey| h.rec.writer().vips().iter().any(|v| v.key == Some(k));
    assert!(
        !in_maps(&h, own.vip.key()),
        "the node's address in the maps"
    );
    assert_eq!(h.backends_in_maps(&fine.vip.key()).len(), 1);

    let mut h = harness();
    let r = h.set(file(), vec![own.clone()]);
    assert!(r.ok(), "{r:?}");
    assert_eq!(h.backends_in_maps(&own.vip.key()).len(), 1);
}

/// A VIP its source refuses (its address left every pool) leaves the
/// maps, is listed as not applied with the source's reason, and comes
/// back when the refusal is lifted.
#[test]
fn a_vip_its_source_refuses_leaves_the_maps() {
    let mut h = harness();
    let v = vip("10.0.0.20", 80, &["10.1.0.1"]);
    assert!(h.set(svc("team-a/web"), vec![v.clone()]).ok());
    assert_eq!(h.backends_in_maps(&v.vip.key()).len(), 1);
    let mut refused = v.clone();
    refused.refused = Some("10.0.0.20 is in no AddressPool in use".into());
    let r = h.set(svc("team-a/web"), vec![refused]);
    assert_eq!(
        r.failed,
        vec![(v.vip.key(), "10.0.0.20 is in no AddressPool in use".into())]
    );
    assert!(
        !h.rec
            .writer()
            .vips()
            .iter()
            .any(|w| w.key == Some(v.vip.key())),
        "a refused VIP still in the maps"
    );
    assert!(h.set(svc("team-a/web"), vec![v.clone()]).ok());
    assert_eq!(h.backends_in_maps(&v.vip.key()).len(), 1);
}

#[test]
fn a_drain_is_answered_only_once_readers_see_it() {
    // rivoractl drains, then lists: the list must show the drain. The
    // answer waits in `waiting` for the publish, for every drain.
    let mut h = harness();
    assert!(h.set(file(), vec![vip("10.0.0.1", 80, &["10.1.0.1"])]).ok());
    let target: SocketAddr = "10.1.0.1:8080".parse().unwrap();
    for (drain, vip) in [
        (true, None),
        (false, None),
        (true, Some(vip("10.0.0.1", 80, &[]).vip.key())),
    ] {
        let (tx, mut rx) = oneshot::channel();
        let mut waiting = Vec::new();
        assert!(h.rec.handle(
            Command::Drain {
                target,
                vip,
                drain,
                reply: tx
            },
            &mut waiting
        ));
        assert!(
            rx.try_recv().is_err(),
            "drain {drain} of {vip:?} answered before the publish"
        );
        assert_eq!(waiting.len(), 1);
        if h.rec.dirty {
            h.rec.apply();
        }
        let replies = h.rec.answer(&mut waiting);
        h.rec.publish();
        replies.deliver();
        assert!(rx.try_recv().expect("answered after the publish").is_ok());
        let b = &h.status().vips[0].backends[0];
        assert_eq!(b.drained, drain, "{b:?} after drain {drain} of {vip:?}");
        // Everywhere: the datapath's health; for one VIP: its weight.
        let (health, weight) = match (drain, vip) {
            (true, None) => (Health::Draining, 1),
            (true, Some(_)) => (Health::Healthy, 0),
            (false, _) => (Health::Healthy, 1),
        };
        assert_eq!(
            (b.health, b.weight),
            (health, weight),
            "{b:?} after drain {drain} of {vip:?}"
        );
    }
}
