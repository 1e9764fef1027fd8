//! The writer against real pinned maps (needs root and bpffs), and the
//! datapath reading them through BPF_PROG_TEST_RUN.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use etherparse::{NetSlice, PacketBuilder, SlicedPacket};
use libbpf_rs::ProgramInput;

use rivora::dataplane::dump::dump;
use rivora::dataplane::render::{self, Health, MapImage};
use rivora::dataplane::{Datapath, DataplaneError, LoadOptions, MapStore, Maps, Writer};
use rivora::model::*;

const XDP_PASS: u32 = 2;

/// A pin directory of its own, removed on drop even if the test panics.
struct PinDir(PathBuf);

impl PinDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Self(PathBuf::from(format!(
            "/sys/fs/bpf/rivora-test-writer-{}-{n}",
            std::process::id()
        )))
    }

    fn load(&self) -> Datapath {
        Datapath::load(&LoadOptions {
            pin_dir: self.0.clone(),
            ..Default::default()
        })
        .expect("load the datapath (root and bpffs needed)")
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = Datapath::unpin_all(&self.0);
    }
}

fn be(addr: &str, port: u16) -> Backend {
    Backend::new(addr.parse().unwrap(), port)
}

fn nat(addr: &str, port: u16, backends: Vec<Backend>) -> Vip {
    Vip {
        addr: addr.parse().unwrap(),
        ports: Ports::One(port),
        proto: Protocol::Tcp,
        mode: Mode::Nat,
        affinity: Affinity::None,
        rate_limit: None,
        source_ranges: None,
        backends,
    }
}

/// What the maps hold with no VIP: an active VIP filter with no bits.
/// Maps a writer has opened and holds no VIP in: the VIP filter active
/// and empty, full NAT's default ports and timeouts.
fn empty_image() -> MapImage {
    let mut img = MapImage {
        vip_filter: Some([0; rivora::abi::VIP_FILTER_WORDS]),
        ..Default::default()
    };
    img.node.fullnat = render::FullNatConfig::new(&Default::default(), &Default::default());
    img
}

fn check(w: &mut Writer<Maps>) -> MapImage {
    w.reclaim().unwrap();
    let live = w.read_maps().unwrap();
    let want = render::render(
        &w.specs(),
        w.node(),
        w.fullnat_srcs(),
        &w.allocations(),
        &|t| w.health(t).unwrap_or(Health::Healthy),
        &|a| w.next_hop(a),
        &|a| w.fullnat_src_index(a),
    );
    assert_eq!(
        live,
        want,
        "maps:\n{}\nrendered:\n{}",
        dump(&live),
        dump(&want)
    );
    live
}

/// A TCP SYN from `src:sport` to `dst:dport`, through xdp_ingress; the
/// verdict and the destination address of the packet that comes out.
fn syn_through(
    dp: &Datapath,
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
) -> (u32, IpAddr) {
    let mut pkt = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src.octets(), dst.octets(), 64)
        .tcp(sport, dport, 1, 64240)
        .syn()
        .write(&mut pkt, &[])
        .unwrap();
    let mut out = vec![0u8; pkt.len() + 256];
    let r = dp
        .xdp()
        .progs
        .xdp_ingress
        .test_run(ProgramInput {
            data_in: Some(&pkt),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .expect("test_run");
    let verdict = r.return_value;
    let data = r.data.expect("output packet");
    let parsed = SlicedPacket::from_ethernet(data).expect("parse the output");
    let dst = match parsed.net {
        Some(NetSlice::Ipv4(ip)) => IpAddr::V4(ip.header().destination_addr()),
        other => panic!("not IPv4 out: {other:?}"),
    };
    (verdict, dst)
}

#[test]
fn upsert_update_remove() {
    let pins = PinDir::new();
    let dp = pins.load();
    let mut w = Writer::open_pinned(&pins.0).unwrap();
    let mut v = nat(
        "10.0.0.1",
        80,
        vec![be("10.1.0.1", 8080), be("10.1.0.2", 8080)],
    );
    w.upsert_vip(&v).unwrap();
    let mut range = nat("fd00::1", 80, vec![be("fd00:1::1", 0)]);
    range.ports = Ports::Range {
        first: 1000,
        last: 1999,
    };
    range.proto = Protocol::Udp;
    range.rate_limit = Some(RateLimit {
        rate_per_sec: 100,
        burst: 10,
    });
    w.upsert_vip(&range).unwrap();
    check(&mut w);

    let vip: Ipv4Addr = "10.0.0.1".parse().unwrap();
    let client: Ipv4Addr = "192.0.2.7".parse().unwrap();
    let (verdict, dst) = syn_through(&dp, client, 40000, vip, 80);
    assert_eq!(verdict, XDP_PASS);
    assert!(
        ["10.1.0.1", "10.1.0.2"].contains(&dst.to_string().as_str()),
        "{dst}"
    );

    v.backends = vec![be("10.1.0.3", 8080)];
    w.upsert_vip(&v).unwrap();
    check(&mut w);
    let (_, dst) = syn_through(&dp, client, 40001, vip, 80);
    assert_eq!(dst.to_string(), "10.1.0.3");

    // The flows left state behind; removal (after its grace period)
    // scrubs every per-flow table of the removed service.
    let maps = rivora::dataplane::Maps::open(&pins.0).unwrap();
    let flows = |m: &rivora::dataplane::Maps| {
        (
            m.connection_affinity_map
                .keys::<rivora::abi::rv_flow_key>()
                .len(),
            m.nat_reverse_map.keys::<rivora::abi::rv_nat_key>().len(),
        )
    };
    // Two flows, one entry each: the VIP owns its backends, so their
    // affinity entries are all tc_nat needs (no nat_reverse_map insert).
    assert_eq!(flows(&maps), (2, 0), "two flows went through the VIP");
    assert_eq!(check(&mut w).nat_owners.len(), 1, "10.1.0.3:8080 owned");
    w.remove_vip(&v.key()).unwrap();
    w.remove_vip(&range.key()).unwrap();
    let img = check(&mut w);
    assert_eq!(img, empty_image(), "{}", dump(&img));
    assert_eq!(flows(&maps), (0, 0), "flow state of removed VIPs scrubbed");
    let (verdict, dst) = syn_through(&dp, client, 40002, vip, 80);
    assert_eq!(
        (verdict, dst),
        (XDP_PASS, IpAddr::V4(vip)),
        "no VIP: untouched"
    );
    assert_eq!(w.free_service_ids(), 4096);
    assert_eq!(w.free_backend_ids(), 8192);
    assert_eq!(w.free_slots(), 65_537);
}

#[test]
fn adoption_keeps_ids_and_leaks_nothing() {
    let pins = PinDir::new();
    let _dp = pins.load();
    let desired = DesiredState {
        node: NodeSettings {
            syn_rate_limit: Some(RateLimit {
                rate_per_sec: 50,
                burst: 5,
            }),
            ..Default::default()
        },
        vips: vec![
            nat("10.0.0.1", 80, vec![be("10.1.0.1", 0), be("10.1.0.2", 0)]),
            nat("10.0.0.2", 443, vec![be("10.1.0.1", 0), be("10.1.0.9", 0)]),
            nat(
                "10.0.0.3",
                53,
                (1..=7).map(|i| be(&format!("10.3.0.{i}"), 0)).collect(),
            ),
        ],
    };
    let mut w = Writer::open_pinned(&pins.0).unwrap();
    w.reconcile(&desired).unwrap();
    w.set_drain(
        &BackendTarget {
            addr: "10.1.0.9".parse().unwrap(),
            port: 0,
        },
        true,
    )
    .unwrap();
    let before = check(&mut w);
    let ids = w.vips();
    drop(w);

    let mut w = Writer::open_pinned(&pins.0).unwrap();
    let adopted = w.vips();
    assert!(adopted.iter().all(|v| !v.claimed));
    let strip = |v: &[rivora::dataplane::VipInfo]| {
        v.iter()
            .map(|v| (v.svc_id, v.key, v.slice, v.backend_ids.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(&adopted),
        strip(&ids),
        "ids, slices and backends kept"
    );
    // Static config: the file is the whole set; one VIP is gone from it.
    let mut fewer = desired.clone();
    fewer.vips.pop();
    let r = w.reconcile(&fewer).unwrap();
    assert_eq!(r.removed, 1);
    let img = check(&mut w);
    assert_eq!(img.services.len(), 2);
    assert_eq!(img.node, before.node);
    assert_eq!(
        img.health
            .values()
            .filter(|h| **h == Health::Draining)
            .count(),
        1
    );
    // A new VIP gets an id no adopted VIP holds.
    w.upsert_vip(&nat("10.0.0.4", 80, vec![be("10.4.0.1", 0)]))
        .unwrap();
    let svcs: BTreeSet<u32> = w.vips().iter().map(|v| v.svc_id).collect();
    assert_eq!(svcs.len(), 3);
    check(&mut w);
    w.reconcile(&DesiredState::default()).unwrap();
    let img = check(&mut w);
    assert_eq!(img, empty_image(), "{}", dump(&img));
    assert_eq!(w.free_service_ids(), 4096);
    assert_eq!(w.free_backend_ids(), 8192);
    assert_eq!(w.free_slots(), 65_537);
}

/// While one thread rebuilds a VIP's slice over and over (alternating two
/// backend sets of different sizes, so the slice moves and changes
/// length), xdp_ingress on new flows only ever forwards to a backend of
/// one set or the other: never drops, never a cleared or foreign backend.
#[test]
fn rebuilds_are_atomic_for_the_datapath() {
    let pins = PinDir::new();
    let dp = pins.load();
    let set_a: Vec<Backend> = (1..=4).map(|i| be(&format!("10.1.0.{i}"), 0)).collect();
    let set_b: Vec<Backend> = (1..=6).map(|i| be(&format!("10.2.0.{i}"), 0)).collect();
    let allowed: BTreeSet<IpAddr> = set_a.iter().chain(&set_b).map(|b| b.addr).collect();
    let mut w = Writer::open_pinned(&pins.0).unwrap();
    let a = nat("10.0.0.1", 80, set_a.clone());
    let b = nat("10.0.0.1", 80, set_b.clone());
    w.upsert_vip(&a).unwrap();

    // Both sides run until each has done enough: the writer rebuilds
    // until the reader has sent its packets, so they overlap whatever the
    // scheduler does.
    let stop = Arc::new(AtomicBool::new(false));
    let rebuilt = Arc::new(AtomicU32::new(0));
    let writer = {
        let (stop, rebuilt) = (stop.clone(), rebuilt.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let v = if n % 2 == 0 { &b } else { &a };
                w.upsert_vip(v).expect("rebuild");
                n += 1;
                rebuilt.store(n, Ordering::Relaxed);
            }
            w.reclaim().expect("reclaim");
            w
        })
    };
    let vip: Ipv4Addr = "10.0.0.1".parse().unwrap();
    let mut seen = BTreeSet::new();
    let mut runs = 0u32;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while runs < 20_000 || rebuilt.load(Ordering::Relaxed) < 300 {
        assert!(std::time::Instant::now() < deadline, "no progress");
        let client = Ipv4Addr::new(192, 0, 2, (runs / 512 % 250) as u8 + 1);
        let sport = 1024 + (runs % 512) as u16;
        let (verdict, dst) = syn_through(&dp, client, sport, vip, 80);
        assert_eq!(verdict, XDP_PASS, "run {runs}: dropped");
        assert!(allowed.contains(&dst), "run {runs}: forwarded to {dst}");
        seen.insert(dst);
        runs += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut w = writer.join().expect("writer thread");
    let rebuilds = rebuilt.load(Ordering::Relaxed);
    println!("{rebuilds} rebuilds, {runs} packets, saw {seen:?}");
    assert!(
        set_a.iter().any(|x| seen.contains(&x.addr))
            && set_b.iter().any(|x| seen.contains(&x.addr)),
        "saw both sets: {seen:?}"
    );
    check(&mut w);
}

/// A store over the real pinned maps that, after every map write, sends
/// new flows to every VIP through xdp_ingress: each must be forwarded to
/// one of its VIP's backends. Whatever the writer is in the middle of,
/// a packet finds the old slice or the new one, never a gap.
struct Probed<'a> {
    maps: Maps,
    dp: &'a Datapath,
    vips: Vec<(Ipv4Addr, BTreeSet<IpAddr>)>,
    writes: u16,
}

impl Probed<'_> {
    fn probe(&mut self, what: &str) {
        self.writes += 1;
        for (i, (vip, allowed)) in self.vips.iter().enumerate() {
            for k in 0..4u16 {
                let client = Ipv4Addr::new(192, 0, 2, 1 + i as u8);
                let sport = 1024 + self.writes * 4 + k;
                let (verdict, dst) = syn_through(self.dp, client, sport, *vip, 80);
                assert_eq!(
                    verdict, XDP_PASS,
                    "after write {} ({what}): {vip} dropped",
                    self.writes
                );
                assert!(
                    allowed.contains(&dst),
                    "after write {} ({what}): {vip} forwarded to {dst}",
                    self.writes
                );
            }
        }
    }

    fn after<T>(&mut self, r: Result<T, DataplaneError>, what: &str) -> Result<T, DataplaneError> {
        self.probe(what);
        r
    }
}

impl MapStore for Probed<'_> {
    fn table_size(&self) -> u32 {
        self.maps.table_size()
    }
    fn put_backends(&mut self, e: &[(u32, render::BackendEntry)]) -> Result<(), DataplaneError> {
        let r = self.maps.put_backends(e);
        self.after(r, "backends")
    }
    fn clear_backends(&mut self, ids: &[u32]) -> Result<(), DataplaneError> {
        let r = self.maps.clear_backends(ids);
        self.after(r, "clear backends")
    }
    fn put_health(&mut self, e: &[(u32, Health)]) -> Result<(), DataplaneError> {
        let r = self.maps.put_health(e);
        self.after(r, "health")
    }
    fn put_slots(&mut self, start: u32, ids: &[u32]) -> Result<(), DataplaneError> {
        let r = self.maps.put_slots(start, ids);
        self.after(r, "slots")
    }
    fn put_service(&mut self, svc: u32, e: &render::ServiceEntry) -> Result<(), DataplaneError> {
        let r = self.maps.put_service(svc, e);
        self.after(r, "service")
    }
    fn put_svc_rate_limit(
        &mut self,
        svc: u32,
        rl: Option<RateLimit>,
    ) -> Result<(), DataplaneError> {
        let r = self.maps.put_svc_rate_limit(svc, rl);
        self.after(r, "rate limit")
    }
    fn put_match(&mut self, m: &render::MatchKey, svc: u32) -> Result<(), DataplaneError> {
        let r = self.maps.put_match(m, svc);
        self.after(r, "match")
    }
    fn remove_match(&mut self, m: &render::MatchKey) -> Result<(), DataplaneError> {
        let r = self.maps.remove_match(m);
        self.after(r, "remove match")
    }
    fn zero_stats(&mut self, svc: u32) -> Result<(), DataplaneError> {
        self.maps.zero_stats(svc)
    }
    fn put_nat_owner(
        &mut self,
        k: &render::NatOwnerKey,
        o: Option<&render::NatOwner>,
    ) -> Result<(), DataplaneError> {
        let r = self.maps.put_nat_owner(k, o);
        self.after(r, "nat owner")
    }
    fn put_tunnel_ep(
        &mut self,
        svc: u32,
        addr: std::net::IpAddr,
        backend: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let r = self.maps.put_tunnel_ep(svc, addr, backend);
        self.after(r, "tunnel endpoint")
    }
    fn put_source_range(
        &mut self,
        svc: u32,
        r: &rivora::source_range::SourceRange,
        on: bool,
    ) -> Result<(), DataplaneError> {
        let res = self.maps.put_source_range(svc, r, on);
        self.after(res, "source range")
    }
    fn put_vip_filter(
        &mut self,
        bits: &[u64; rivora::abi::VIP_FILTER_WORDS],
    ) -> Result<(), DataplaneError> {
        let r = self.maps.put_vip_filter(bits);
        self.after(r, "vip filter")
    }
    fn scrub_flows(&mut self, svcs: &BTreeSet<u32>) -> Result<(), DataplaneError> {
        self.maps.scrub_flows(svcs)
    }
    fn put_node(
        &mut self,
        n: &render::NodeImage,
        p: &render::NodeImage,
    ) -> Result<(), DataplaneError> {
        self.maps.put_node(n, p)
    }
    fn read(&self) -> Result<MapImage, DataplaneError> {
        self.maps.read()
    }
    fn synchronize(&mut self) -> Result<(), DataplaneError> {
        self.maps.synchronize()
    }
    fn grace_period() -> Result<(), DataplaneError> {
        Maps::grace_period()
    }
}

/// Write `vips` as rivorad before issue 20 did: slices of its size rule
/// (12 slots up to four backends, else 20 per backend with the count
/// rounded up to a power of two, at most 32,768), filled by the paper's
/// population, one after the other; backends, slots, the service entry,
/// then the match entry.
fn write_old_rule<S: MapStore>(store: &mut S, vips: &[Vip]) {
    let old_size = |n: usize| match n {
        0 => 1,
        1..=4 => 12,
        _ => (20 * n.next_power_of_two() as u32).min(32_768),
    };
    let mut ids: Vec<BackendKey> = Vec::new();
    let mut start = 0u32;
    for (i, v) in vips.iter().enumerate() {
        let mut mine = Vec::new();
        for b in &v.backends {
            let id = match ids.iter().position(|k| *k == b.key()) {
                Some(p) => p as u32 + 1,
                None => {
                    ids.push(b.key());
                    ids.len() as u32
                }
            };
            mine.push(id);
            store
                .put_backends(&[(id, render::backend_entry(b, Default::default(), 0))])
                .unwrap();
            store.put_health(&[(id, Health::Healthy)]).unwrap();
        }
        let identities: Vec<Vec<u8>> = v.backends.iter().map(|b| b.key().identity()).collect();
        let entries: Vec<rivora::maglev::Entry<'_>> = v
            .backends
            .iter()
            .zip(&identities)
            .zip(&mine)
            .map(|((b, identity), id)| rivora::maglev::Entry {
                identity,
                weight: b.weight,
                id: *id,
            })
            .collect();
        let len = old_size(v.backends.len());
        let slots = rivora::maglev::populate_paper(&entries, len);
        store.put_slots(start, &slots).unwrap();
        let svc = i as u32 + 1;
        store
            .put_service(svc, &render::service_entry(v, start, len))
            .unwrap();
        for m in render::match_keys(&v.key()) {
            store.put_match(&m, svc).unwrap();
        }
        start += len;
    }
}

/// Restarts across the change of rule: a rivorad with this population
/// and these slice sizes adopts maps the one before wrote (other sizes,
/// the paper's population, a canary at weight 1 of 100 holding no slot)
/// and converges: every VIP's slice is rebuilt and switched, and after
/// every single map write every VIP still forwards new flows to one of
/// its backends (xdp_ingress, BPF_PROG_TEST_RUN).
#[test]
fn adopting_maps_of_the_old_rule_keeps_forwarding() {
    let pins = PinDir::new();
    let dp = pins.load();
    let mut canary = nat("10.0.0.3", 80, vec![be("10.3.0.1", 0), be("10.3.0.2", 0)]);
    canary.backends[1].weight = 99;
    let vips = vec![
        nat("10.0.0.1", 80, vec![be("10.1.0.1", 0), be("10.1.0.2", 0)]),
        nat(
            "10.0.0.2",
            80,
            (1..=5).map(|i| be(&format!("10.2.0.{i}"), 0)).collect(),
        ),
        canary,
    ];
    let allowed: Vec<(Ipv4Addr, BTreeSet<IpAddr>)> = vips
        .iter()
        .map(|v| {
            let IpAddr::V4(a) = v.addr else {
                unreachable!()
            };
            (a, v.backends.iter().map(|b| b.addr).collect())
        })
        .collect();
    let mut store = Probed {
        maps: Maps::open(&pins.0).unwrap(),
        dp: &dp,
        vips: Vec::new(),
        writes: 0,
    };
    write_old_rule(&mut store, &vips);
    let old = store.read().unwrap();
    let canary_id = old
        .backends
        .iter()
        .find(|(_, b)| b.addr.to_string() == "10.3.0.1")
        .map(|(id, _)| *id);
    let old_canary = old
        .slots
        .values()
        .filter(|id| Some(**id) == canary_id)
        .count();
    assert_eq!(old_canary, 0, "the old rule gave the canary no slot of 12");
    store.vips = allowed;
    store.probe("the old maps");

    let mut w = Writer::open(store).unwrap();
    let desired = DesiredState {
        node: NodeSettings::default(),
        vips: vips.clone(),
    };
    let r = w.reconcile(&desired).unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(r.updated, vips.len(), "every slice rebuilt to the new rule");
    w.reclaim().unwrap();
    let writes = w.store().writes;
    assert!(writes > 10, "{writes} writes, each followed by packets");
    let plan = desired.maglev_sizes(&Capacity::default()).unwrap();
    for (v, p) in w.vips().iter().zip(&plan) {
        assert_eq!(v.slice.len, p.len, "{:?}", v.key);
        assert!(v.claimed);
    }
    let img = w.read_maps().unwrap();
    let want = render::render(
        &w.specs(),
        w.node(),
        w.fullnat_srcs(),
        &w.allocations(),
        &|t| w.health(t).unwrap_or(Health::Healthy),
        &|a| w.next_hop(a),
        &|a| w.fullnat_src_index(a),
    );
    assert_eq!(
        img,
        want,
        "maps:\n{}\nrendered:\n{}",
        dump(&img),
        dump(&want)
    );
    assert!(
        img.slots.values().any(|id| Some(*id) == canary_id),
        "the canary has slots now"
    );
}
