//! Full NAT through the real xdp_ingress (issue 27, item 1): maps filled
//! by the real writer, packets built with etherparse, every output byte
//! and checksum compared with a frame built from scratch, and the maps
//! after.
//!
//! - A request leaves from the node's source and a port of its range, to
//!   the backend; its reply, addressed there, comes back as VIP -> client
//!   out the way the request came in (TTL less one, the request's MACs
//!   swapped); an established flow keeps its port and inserts nothing;
//!   IPv4 and IPv6, TCP and UDP (a UDP checksum of 0 stays 0)
//!   (`request_and_reply_every_byte`).
//! - Ports: a range of eight and twenty flows: eight admitted on eight
//!   distinct ports, twelve dropped and counted (the drop reason and the
//!   VIP's own counter); flows idle past their timeout give their ports to
//!   new flows, and a flow whose port went to another gets a new one on its
//!   next packet instead of sharing it
//!   (`ports_exhaust_then_pass_to_new_flows_after_idle`).
//! - Two CPUs allocating at once (threads pinned to each, BPF_PROG_TEST_RUN
//!   runs on the caller's CPU), with ranges small and large, and rounds
//!   where every flow has gone idle so the cursor wraps: never two live
//!   flows on one tuple, never more flows than ports, every other flow
//!   dropped and counted (`concurrent_cpus_never_share_a_tuple`, a
//!   property test).
//! - A FIN or RST either way marks the flow closing (its shorter timeout);
//!   a SYN on the same tuple opens it again (`fin_and_rst_shorten_the_timeout`).
//! - ICMP errors both ways: from the client's side about a reply (to the
//!   backend, quote turned into backend -> source), and from the backend
//!   or a router about a request (to the client, quote turned into client
//!   -> VIP, the backend's own error from the VIP)
//!   (`icmp_errors_both_ways`).
//! - Fragments both ways (`fragments_both_ways`).
//! - A NAT VIP whose backends are reached two ways, as Kubernetes writes
//!   one (a backend's own mode): NAT keeps the client's address, full NAT
//!   does not, each reply turned back by its own program
//!   (`a_nat_vip_with_a_full_nat_backend`).
//! - clientIP affinity: one backend per client, a port per flow
//!   (`client_ip_affinity_keeps_a_port_per_flow`).
//! - No source for the backend: dropped and named (`no_source_is_a_named_drop`).

use crate::common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use common::fixture::{self, Fx};
use common::fixtures::*;
use common::netns::{InNetns, Netns};
use common::*;
use etherparse::{
    icmpv4, icmpv6, EtherType, Ethernet2Header, Icmpv4Header, Icmpv4Type, Icmpv6Header, Icmpv6Type,
    IpNumber, Ipv4Header, Ipv6Header,
};
use rivora::abi::*;
use rivora::model::{Affinity, Mode, Vip};

const CLIENT4: &str = "10.250.1.10";
const CLIENT6: &str = "fd00:fa:1::10";
const VIP4: &str = "10.0.9.100";
const VIP6: &str = "fd00:9::100";
/// The node's full-NAT sources (node.snat).
const SRC4: &str = "10.249.0.1";
const SRC6: &str = "fd00:f9::1";
const ROUTER4: &str = "10.248.0.1";
const ROUTER6: &str = "fd00:f8::1";
const BPORT: u16 = 8080;

fn fam_addrs(v6: bool) -> (&'static str, &'static str, &'static str) {
    if v6 {
        (CLIENT6, VIP6, SRC6)
    } else {
        (CLIENT4, VIP4, SRC4)
    }
}

fn mac(i: u8) -> [u8; 6] {
    [0x02, 0xbe, 0, 0, 0, i]
}

/// A loaded datapath in a namespace of its own (no route anywhere: a
/// request the FIB cannot send is left to the kernel, rewritten), with
/// full NAT's sources and `ports`.
fn setup(name: &str, ports: (u16, u16)) -> (Fx, Netns) {
    let fx = Fx::new();
    fx.edit_node(|n| {
        n.fullnat.src4 = Some(SRC4.parse().expect("SRC4"));
        n.fullnat.src6 = Some(SRC6.parse().expect("SRC6"));
        n.fullnat.port_min = ports.0;
        n.fullnat.port_max = ports.1;
    });
    let ns = Netns::new(&unique(name));
    (fx, ns)
}

fn fullnat_vip(addr: &str, port: u16, proto: u8, backends: &[&str]) -> Vip {
    let bs = backends
        .iter()
        .enumerate()
        .map(|(i, b)| fixture::backend(ip(b), BPORT, mac(i as u8 + 1)))
        .collect();
    fixture::vip(ip(addr), port, proto, Mode::FullNat, bs)
}

fn request(v6: bool, proto: u8, client: &str, sport: u16, vip: &str, vport: u16) -> Frame {
    match (v6, proto) {
        (false, PROTO_TCP) => Frame::tcp4(client, sport, vip, vport),
        (false, _) => Frame::udp4(client, sport, vip, vport),
        (true, PROTO_TCP) => Frame::tcp6(client, sport, vip, vport),
        (true, _) => Frame::udp6(client, sport, vip, vport),
    }
}

/// The reverse entry of the flow whose reply is (backend, bport) ->
/// (src, port).
fn rev_entry(
    t: &TestDp,
    backend: IpAddr,
    src: IpAddr,
    port: u16,
    proto: u8,
) -> Option<rv_fullnat_flow> {
    match (backend, src) {
        (IpAddr::V4(b), IpAddr::V4(s)) => t
            .maps
            .fullnat_rev_map
            .get(&rv_fullnat_key {
                backend_addr: be32(b),
                src_addr: be32(s),
                backend_port: be16(BPORT),
                src_port: be16(port),
                proto,
                pad: [0; 3],
            })
            .expect("fullnat_rev_map"),
        (IpAddr::V6(b), IpAddr::V6(s)) => t
            .maps
            .fullnat_rev_map6
            .get(&rv_fullnat6_key {
                backend_addr: be32x4(b),
                src_addr: be32x4(s),
                backend_port: be16(BPORT),
                src_port: be16(port),
                proto,
                pad: [0; 3],
            })
            .expect("fullnat_rev_map6"),
        _ => panic!("family mismatch"),
    }
}

/// Every reverse entry: (backend, source port) -> the flow's client port.
fn rev_entries(t: &TestDp) -> Vec<(IpAddr, u16, rv_fullnat_flow)> {
    let mut out = Vec::new();
    for (k, v) in t
        .maps
        .fullnat_rev_map
        .entries::<rv_fullnat_key, rv_fullnat_flow>()
        .expect("fullnat_rev_map")
    {
        out.push((
            IpAddr::V4(ipv4_from_be32(k.backend_addr)),
            port_from_be16(k.src_port),
            v,
        ));
    }
    for (k, v) in t
        .maps
        .fullnat_rev_map6
        .entries::<rv_fullnat6_key, rv_fullnat_flow>()
        .expect("fullnat_rev_map6")
    {
        out.push((
            IpAddr::V6(ipv6_from_be32x4(k.backend_addr)),
            port_from_be16(k.src_port),
            v,
        ));
    }
    out
}

fn fullnat_drops(t: &TestDp, svc: u32) -> rv_fullnat_stats {
    let per_cpu: Vec<rv_fullnat_stats> = t
        .maps
        .fullnat_stats_map
        .get_percpu(&svc)
        .expect("fullnat_stats_map");
    per_cpu
        .iter()
        .fold(rv_fullnat_stats::default(), |mut a, s| {
            a.ports_exhausted += s.ports_exhausted;
            a.table_full += s.table_full;
            a
        })
}

/// The source port the flow `f` was given (its affinity entry's).
fn port_of(t: &TestDp, svc: u32, f: &Frame) -> u16 {
    let a = affinity_entry(t, svc, f).expect("the flow's affinity entry");
    assert_ne!(a.fullnat_port, 0, "the flow has a full-NAT port");
    assert_ne!(a.fullnat_src, 0, "the flow has a full-NAT source");
    port_from_be16(a.fullnat_port)
}

/// Send `f` and check it leaves as full NAT makes it: from `src` and the
/// port its affinity entry names, to the backend, left to the kernel (no
/// route here); returns that port.
fn send_request(t: &TestDp, desc: &str, svc: u32, f: &Frame, backend: IpAddr, src: IpAddr) -> u16 {
    let (v, out) = t.run_xdp(&f.build());
    assert_eq!(v, XDP_PASS, "{desc}: request verdict");
    let port = port_of(t, svc, f);
    let want = f.clone().from(src, port).to(backend, BPORT);
    assert_bytes(&format!("{desc}: request"), &out, &want.build());
    assert_checksums(&out);
    port
}

/// The reply of backend `backend` to the request `f` was sent as, and
/// what it must come out as: VIP -> client, out the way the request came
/// in (its MACs swapped), one hop less.
fn reply_pair(f: &Frame, backend: IpAddr, src: IpAddr, port: u16) -> (Frame, Frame) {
    let sent = f.clone().from(src, port).to(backend, BPORT).reply();
    let want = sent
        .clone()
        .from(f.dst_ip(), f.dport())
        .to(f.src_ip(), f.sport())
        .macs(f.dst_mac, f.src_mac)
        .ttl(63);
    (sent, want)
}

#[test]
fn request_and_reply_every_byte() {
    let (fx, ns) = setup("rvfnatbytes", (40000, 40999));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    for v6 in [false, true] {
        for proto in [PROTO_TCP, PROTO_UDP] {
            let (client, vip, src) = fam_addrs(v6);
            let backend = if v6 { "fd00:9:5::1" } else { "10.9.5.1" };
            let port = if proto == PROTO_TCP { 80 } else { 53 };
            let placed = fx.apply(&fullnat_vip(vip, port, proto, &[backend]));
            let svc = placed.svc;
            let mut cases = vec![(
                format!("v6={v6} proto={proto}"),
                request(v6, proto, client, 50000, vip, port),
            )];
            if !v6 && proto == PROTO_UDP {
                cases.push((
                    "UDP without a checksum".into(),
                    request(v6, proto, client, 50001, vip, port).udp_zero_csum(),
                ));
            }
            for (desc, f) in cases {
                let before = rev_entries(t).len();
                let fport = send_request(t, &desc, svc, &f, ip(backend), ip(src));
                assert!(
                    (40000..=40999).contains(&fport),
                    "{desc}: port {fport} in range"
                );
                assert_eq!(
                    rev_entries(t).len(),
                    before + 1,
                    "{desc}: one reverse entry"
                );
                let e = rev_entry(t, ip(backend), ip(src), fport, proto).expect("reverse entry");
                assert_eq!(e.svc_id, svc, "{desc}: reverse entry's service");
                assert_eq!(
                    e.backend_id, placed.ids[0],
                    "{desc}: reverse entry's backend"
                );
                assert_eq!(port_from_be16(e.client_port), f.sport());
                assert_eq!(port_from_be16(e.vip_port), port);
                assert_eq!(
                    e.dmac, f.src_mac,
                    "{desc}: the way back: the request's source MAC"
                );
                assert_eq!(e.smac, f.dst_mac, "{desc}: from the MAC it was sent to");
                assert_ne!(
                    e.flags & rv_fullnat_flags::RV_FULLNAT_F_RETURN_PATH.0 as u8,
                    0
                );

                // Established: the same port, nothing inserted.
                let again = if proto == PROTO_TCP {
                    f.clone().established(7)
                } else {
                    f.clone()
                };
                let p2 = send_request(
                    t,
                    &format!("{desc}, established"),
                    svc,
                    &again,
                    ip(backend),
                    ip(src),
                );
                assert_eq!(p2, fport, "{desc}: an established flow keeps its port");
                assert_eq!(
                    rev_entries(t).len(),
                    before + 1,
                    "{desc}: nothing more inserted"
                );

                // The reply, back into the VIP's, out the way it came.
                let (sent, want) = reply_pair(&f, ip(backend), ip(src), fport);
                let sent = if f.proto() == PROTO_UDP && desc.contains("without") {
                    sent.udp_zero_csum()
                } else {
                    sent
                };
                let want = if desc.contains("without") {
                    want.udp_zero_csum()
                } else {
                    want
                };
                let (v, out) = t.run_xdp(&sent.build());
                assert_eq!(v, XDP_TX, "{desc}: reply verdict");
                assert_bytes(&format!("{desc}: reply"), &out, &want.build());
                assert_checksums(&out);
            }
            // A reply to a port no flow holds is not ours.
            let stray = request(v6, proto, backend, BPORT, src, 40999);
            let (v, out) = t.run_xdp(&stray.build());
            assert_eq!(
                (v, out),
                (XDP_PASS, stray.build()),
                "a stray reply passes untouched"
            );
            fx.remove(&fullnat_vip(vip, port, proto, &[backend]));
        }
    }
}

/// Make every reverse entry and affinity entry look idle since `ago`.
fn age_everything(t: &TestDp, ago: Duration) {
    let then = ktime_ns().saturating_sub(ago.as_nanos() as u64);
    for (k, mut v) in t
        .maps
        .fullnat_rev_map
        .entries::<rv_fullnat_key, rv_fullnat_flow>()
        .expect("rev")
    {
        v.last_seen_ns = then;
        t.maps.fullnat_rev_map.put(&k, &v).expect("rev put");
    }
    for (k, mut v) in t
        .maps
        .connection_affinity_map
        .entries::<rv_flow_key, rv_affinity_value>()
        .expect("aff")
    {
        v.last_seen_ns = then;
        t.maps.connection_affinity_map.put(&k, &v).expect("aff put");
    }
}

#[test]
fn ports_exhaust_then_pass_to_new_flows_after_idle() {
    let (fx, ns) = setup("rvfnatexh", (41000, 41007));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let placed = fx.apply(&fullnat_vip(VIP4, 81, PROTO_UDP, &["10.9.6.1"]));
    let svc = placed.svc;
    let drops_before = t.drops(rv_drop_reason::RV_DROP_FULLNAT_PORTS_EXHAUSTED);
    let mut admitted = Vec::new();
    for i in 0..20u16 {
        let f = request(false, PROTO_UDP, CLIENT4, 52000 + i, VIP4, 81);
        let (v, out) = t.run_xdp(&f.build());
        if admitted.len() < 8 {
            assert_eq!(v, XDP_PASS, "flow {i} fits in the range");
            let port = port_of(t, svc, &f);
            let want = f.clone().from(ip(SRC4), port).to(ip("10.9.6.1"), BPORT);
            assert_bytes(&format!("flow {i}"), &out, &want.build());
            admitted.push((f, port));
        } else {
            assert_eq!(v, XDP_DROP, "flow {i}: every port is held");
            assert!(
                affinity_entry(t, svc, &f).is_none(),
                "flow {i}: nothing remembered"
            );
        }
    }
    let mut ports: Vec<u16> = admitted.iter().map(|a| a.1).collect();
    ports.sort_unstable();
    assert_eq!(
        ports,
        (41000..=41007).collect::<Vec<_>>(),
        "eight distinct ports, the range"
    );
    assert_eq!(
        t.drops(rv_drop_reason::RV_DROP_FULLNAT_PORTS_EXHAUSTED) - drops_before,
        12,
        "twelve drops under their reason"
    );
    assert_eq!(
        fullnat_drops(t, svc).ports_exhausted,
        12,
        "and under the VIP"
    );
    assert_eq!(rev_entries(t).len(), 8);

    // Every flow idle past UDP's timeout (60 s): new flows take the ports.
    age_everything(t, Duration::from_secs(61));
    assert_eq!(
        rev_entries(t).len(),
        8,
        "idle entries stay until taken or swept"
    );
    let mut fresh = Vec::new();
    for i in 0..3u16 {
        let f = request(false, PROTO_UDP, CLIENT4, 53000 + i, VIP4, 81);
        let (v, _) = t.run_xdp(&f.build());
        assert_eq!(v, XDP_PASS, "new flow {i} takes an idle flow's port");
        fresh.push((f.clone(), port_of(t, svc, &f)));
    }
    assert_eq!(rev_entries(t).len(), 8, "ports taken back, none added");
    // An old flow whose port went to a new one speaks again: its affinity
    // time is refreshed (idle over a second), its port checked, and it is
    // given another (one of the five still idle) rather than the new
    // flow's.
    let taken: Vec<u16> = fresh.iter().map(|x| x.1).collect();
    let (old, old_port) = admitted
        .iter()
        .find(|(_, p)| taken.contains(p))
        .expect("an old flow lost its port")
        .clone();
    let (v, out) = t.run_xdp(&old.build());
    assert_eq!(v, XDP_PASS, "the old flow goes on");
    let now_port = port_of(t, svc, &old);
    assert_ne!(now_port, old_port, "not the port a live flow holds now");
    assert!(!taken.contains(&now_port), "nor any new flow's");
    let want = old
        .clone()
        .from(ip(SRC4), now_port)
        .to(ip("10.9.6.1"), BPORT);
    assert_bytes("the old flow, re-ported", &out, &want.build());
    // Every live tuple has one flow.
    let mut live: Vec<(u16, u16)> = rev_entries(t)
        .iter()
        .map(|(_, p, e)| (*p, port_from_be16(e.client_port)))
        .collect();
    live.sort_unstable();
    let mut seen = std::collections::BTreeSet::new();
    for (p, _) in &live {
        assert!(seen.insert(*p), "port {p} held twice: {live:?}");
    }
}

#[test]
fn fin_and_rst_shorten_the_timeout() {
    let (fx, ns) = setup("rvfnatfin", (42000, 42999));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let svc = fx
        .apply(&fullnat_vip(VIP4, 82, PROTO_TCP, &["10.9.7.1"]))
        .svc;
    let closing = rv_fullnat_flags::RV_FULLNAT_F_CLOSING.0 as u8;
    let backend = ip("10.9.7.1");
    // The client closes.
    let f = request(false, PROTO_TCP, CLIENT4, 54000, VIP4, 82);
    let port = send_request(t, "SYN", svc, &f, backend, ip(SRC4));
    let flags = |port| {
        rev_entry(t, backend, ip(SRC4), port, PROTO_TCP)
            .expect("entry")
            .flags
    };
    assert_eq!(flags(port) & closing, 0, "open");
    send_request(t, "FIN", svc, &f.clone().fin(), backend, ip(SRC4));
    assert_ne!(flags(port) & closing, 0, "the client's FIN: closing");
    // A new connection on the same tuple: open again.
    send_request(t, "SYN again", svc, &f, backend, ip(SRC4));
    assert_eq!(flags(port) & closing, 0, "a SYN reopens it");
    // The backend resets.
    let (sent, _) = reply_pair(&f, backend, ip(SRC4), port);
    let (v, _) = t.run_xdp(&sent.rst().build());
    assert_eq!(v, XDP_TX, "the RST goes to the client");
    assert_ne!(flags(port) & closing, 0, "the backend's RST: closing");
}

#[test]
fn no_source_is_a_named_drop() {
    let fx = Fx::new();
    let t = &fx.t;
    let ns = Netns::new(&unique("rvfnatnosrc"));
    let _in = InNetns::enter(&ns);
    // No node.snat and no route source given: the backend has none.
    let svc = fx
        .apply(&fullnat_vip(VIP4, 83, PROTO_TCP, &["10.9.8.1"]))
        .svc;
    let f = request(false, PROTO_TCP, CLIENT4, 55000, VIP4, 83);
    run_case(
        t,
        &Case {
            desc: "a full-NAT backend with no source".into(),
            input: f.build(),
            want: f.build(),
            verdict: XDP_DROP,
            drop: Some(rv_drop_reason::RV_DROP_NO_FULLNAT_SRC),
        },
    );
    assert!(affinity_entry(t, svc, &f).is_none(), "nothing remembered");
    // Given the route's source, the same flow goes.
    fx.w.borrow_mut()
        .set_fullnat_source(ip("10.9.8.1"), ip(SRC4))
        .expect("set_fullnat_source");
    send_request(t, "with a source", svc, &f, ip("10.9.8.1"), ip(SRC4));
}

#[test]
fn a_nat_vip_with_a_full_nat_backend() {
    let (fx, ns) = setup("rvfnatmix", (43000, 43999));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    // As Kubernetes writes a Service: this node's endpoint by NAT, another
    // node's by full NAT.
    let local = fixture::backend(ip("10.9.9.1"), BPORT, mac(1));
    let mut remote = fixture::backend(ip("10.9.9.2"), BPORT, mac(2));
    remote.mode = Some(Mode::FullNat);
    let vip = fixture::vip(ip(VIP4), 84, PROTO_TCP, Mode::Nat, vec![local, remote]);
    let placed = fx.apply(&vip);
    let svc = placed.svc;
    let mut seen = [false, false];
    for sport in 56000u16..56100 {
        let f = request(false, PROTO_TCP, CLIENT4, sport, VIP4, 84);
        let Some(id) = fx.pick_flow(svc, f.src_ip(), sport, 84, PROTO_TCP) else {
            panic!("no backend for {sport}");
        };
        let i = placed
            .ids
            .iter()
            .position(|x| *x == id)
            .expect("a placed id");
        if seen[i] {
            continue;
        }
        seen[i] = true;
        if i == 0 {
            // NAT: the client's address kept; tc_nat turns the reply back.
            let be = Be {
                id,
                addr: ip("10.9.9.1"),
                port: BPORT,
                mac: mac(1),
            };
            run_case(
                t,
                &Case {
                    desc: "the NAT backend".into(),
                    input: f.build(),
                    want: nat_of(&f, &be).build(),
                    verdict: XDP_PASS,
                    drop: None,
                },
            );
            let reply = nat_of(&f, &be).reply();
            let (v, out) = t.run_tc(&reply.build());
            assert_eq!(v, TCX_PASS, "the NAT reply");
            assert_bytes("the NAT reply", &out, &reply.from(f.dst_ip(), 84).build());
            assert_eq!(affinity_entry(t, svc, &f).expect("entry").fullnat_port, 0);
        } else {
            let port = send_request(t, "the full-NAT backend", svc, &f, ip("10.9.9.2"), ip(SRC4));
            let (sent, want) = reply_pair(&f, ip("10.9.9.2"), ip(SRC4), port);
            let (v, out) = t.run_xdp(&sent.build());
            assert_eq!(v, XDP_TX, "the full-NAT reply");
            assert_bytes("the full-NAT reply", &out, &want.build());
        }
        if seen == [true, true] {
            break;
        }
    }
    assert_eq!(seen, [true, true], "flows reached both backends");
}

#[test]
fn client_ip_affinity_keeps_a_port_per_flow() {
    let (fx, ns) = setup("rvfnataff", (44000, 44999));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let vip = fixture::with_affinity(
        fullnat_vip(
            VIP4,
            85,
            PROTO_TCP,
            &["10.9.10.1", "10.9.10.2", "10.9.10.3"],
        ),
        600,
    );
    assert!(matches!(vip.affinity, Affinity::ClientIp { .. }));
    let placed = fx.apply(&vip);
    let mut backends = std::collections::BTreeSet::new();
    let mut ports = std::collections::BTreeSet::new();
    for sport in 57000u16..57010 {
        let f = request(false, PROTO_TCP, CLIENT4, sport, VIP4, 85);
        let (v, out) = t.run_xdp(&f.build());
        assert_eq!(v, XDP_PASS);
        let a = affinity_entry(t, placed.svc, &f).expect("the flow's own entry");
        let port = port_from_be16(a.fullnat_port);
        let backend = fx.backend_entry(a.backend_id).expect("backend").0;
        let want = f.clone().from(ip(SRC4), port).to(backend, BPORT);
        assert_bytes(&format!("flow {sport}"), &out, &want.build());
        backends.insert(backend);
        ports.insert(port);
    }
    assert_eq!(backends.len(), 1, "one backend for the client");
    assert_eq!(ports.len(), 10, "a port per flow");
}

/// An ICMP error frame: `kind` from `src` to `dst`, quoting `quote` (an
/// IP packet), every checksum computed here.
fn icmp_frame(
    src: IpAddr,
    dst: IpAddr,
    too_big: bool,
    quote: &[u8],
    macs: ([u8; 6], [u8; 6]),
) -> Vec<u8> {
    let mut msg = Vec::new();
    let mut out = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ty = if too_big {
                Icmpv4Type::DestinationUnreachable(
                    icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
                )
            } else {
                Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Port)
            };
            Icmpv4Header::with_checksum(ty, quote)
                .write(&mut msg)
                .expect("ICMP");
            msg.extend_from_slice(quote);
            Ethernet2Header {
                source: macs.0,
                destination: macs.1,
                ether_type: EtherType::IPV4,
            }
            .write(&mut out)
            .expect("eth");
            let mut h =
                Ipv4Header::new(msg.len() as u16, 64, IpNumber::ICMP, s.octets(), d.octets())
                    .expect("IPv4");
            h.header_checksum = h.calc_header_checksum();
            h.write(&mut out).expect("IPv4");
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ty = if too_big {
                Icmpv6Type::PacketTooBig { mtu: 1280 }
            } else {
                Icmpv6Type::DestinationUnreachable(icmpv6::DestUnreachableCode::Port)
            };
            Icmpv6Header::with_checksum(ty, s.octets(), d.octets(), quote)
                .expect("ICMPv6")
                .write(&mut msg)
                .expect("ICMPv6");
            msg.extend_from_slice(quote);
            Ethernet2Header {
                source: macs.0,
                destination: macs.1,
                ether_type: EtherType::IPV6,
            }
            .write(&mut out)
            .expect("eth");
            Ipv6Header {
                traffic_class: 0,
                flow_label: Default::default(),
                payload_length: msg.len() as u16,
                next_header: IpNumber::IPV6_ICMP,
                hop_limit: 64,
                source: s.octets(),
                destination: d.octets(),
            }
            .write(&mut out)
            .expect("IPv6");
        }
        _ => panic!("family mismatch"),
    }
    out.extend_from_slice(&msg);
    out
}

/// The IP packet of a frame.
fn ip_of(f: &Frame) -> Vec<u8> {
    f.build()[f.l3_off()..].to_vec()
}

#[test]
fn icmp_errors_both_ways() {
    let (fx, ns) = setup("rvfnaticmp", (45000, 45999));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    for v6 in [false, true] {
        for proto in [PROTO_TCP, PROTO_UDP] {
            let (client, vip, src) = fam_addrs(v6);
            let router = if v6 { ROUTER6 } else { ROUTER4 };
            let backend = if v6 { "fd00:9:11::1" } else { "10.9.11.1" };
            let vport = if proto == PROTO_TCP { 86 } else { 87 };
            let svc = fx.apply(&fullnat_vip(vip, vport, proto, &[backend])).svc;
            let f = request(v6, proto, client, 58000, vip, vport);
            let port = send_request(t, "set-up", svc, &f, ip(backend), ip(src));
            let desc = format!("v6={v6} proto={proto}");

            // From the client's side, about the VIP's reply: to the
            // backend, about what the backend sent, from this node.
            let vip_reply = f.reply();
            let err = icmp_frame(
                ip(router),
                ip(vip),
                true,
                &ip_of(&vip_reply),
                (MAC_PEER, MAC_LB),
            );
            let backend_sent = vip_reply.clone().from(ip(backend), BPORT).to(ip(src), port);
            let want = icmp_frame(
                ip(src),
                ip(backend),
                true,
                &ip_of(&backend_sent),
                (MAC_PEER, MAC_LB),
            );
            let (v, out) = t.run_xdp(&err);
            assert_eq!(
                v, XDP_PASS,
                "{desc}: an error for the backend (no route: the kernel's)"
            );
            assert_bytes(&format!("{desc}: error to the backend"), &out, &want);

            // From the backend, about the request it got: to the client,
            // about what the client sent, from the VIP.
            let sent = f.clone().from(ip(src), port).to(ip(backend), BPORT);
            let err = icmp_frame(ip(backend), ip(src), false, &ip_of(&sent), (mac(9), MAC_LB));
            let want = icmp_frame(ip(vip), ip(client), false, &ip_of(&f), (MAC_LB, MAC_PEER));
            let (v, out) = t.run_xdp(&err);
            assert_eq!(v, XDP_TX, "{desc}: the backend's error goes to the client");
            let mut want = want;
            dec_ttl(&mut want, v6);
            assert_bytes(&format!("{desc}: the backend's error"), &out, &want);

            // From a router on the way to the backend: its address stays.
            let err = icmp_frame(ip(router), ip(src), true, &ip_of(&sent), (mac(9), MAC_LB));
            let mut want = icmp_frame(ip(router), ip(client), true, &ip_of(&f), (MAC_LB, MAC_PEER));
            dec_ttl(&mut want, v6);
            let (v, out) = t.run_xdp(&err);
            assert_eq!(v, XDP_TX, "{desc}: a router's error goes to the client");
            assert_bytes(&format!("{desc}: a router's error"), &out, &want);
            fx.remove(&fullnat_vip(vip, vport, proto, &[backend]));
        }
    }
}

/// One hop less on a frame built with TTL 64, its IPv4 checksum fixed.
fn dec_ttl(frame: &mut [u8], v6: bool) {
    if v6 {
        frame[14 + 7] -= 1;
        return;
    }
    frame[14 + 8] -= 1;
    let (mut h, _) = Ipv4Header::from_slice(&frame[14..]).expect("IPv4");
    h.header_checksum = h.calc_header_checksum();
    let bytes = h.to_bytes();
    frame[14..14 + bytes.len()].copy_from_slice(&bytes);
}

#[test]
fn fragments_both_ways() {
    let (fx, ns) = setup("rvfnatfrag", (46000, 46999));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let backend = ip("10.9.12.1");
    let svc = fx
        .apply(&fullnat_vip(VIP4, 88, PROTO_UDP, &["10.9.12.1"]))
        .svc;
    // A request in two fragments: the first has the ports.
    let whole = request(false, PROTO_UDP, CLIENT4, 59000, VIP4, 88).payload(&[7u8; 64]);
    let (first, later) = ipv4_fragments(&whole.build(), 0x1234, 24);
    let (v, out) = t.run_xdp(&first);
    assert_eq!(v, XDP_PASS, "first fragment");
    let port = port_of(t, svc, &whole);
    let rewritten = whole
        .clone()
        .from(ip(SRC4), port)
        .to(backend, BPORT)
        .build();
    let (want_first, want_later) = ipv4_fragments(&rewritten, 0x1234, 24);
    assert_bytes("first fragment", &out, &want_first);
    let (v, out) = t.run_xdp(&later);
    assert_eq!(v, XDP_PASS, "later fragment");
    assert_bytes("later fragment: the first's addresses", &out, &want_later);

    // The reply in two fragments.
    let reply = whole
        .clone()
        .from(ip(SRC4), port)
        .to(backend, BPORT)
        .reply()
        .payload(&[9u8; 64]);
    let (first, later) = ipv4_fragments(&reply.build(), 0x4321, 24);
    let restored = reply
        .clone()
        .from(ip(VIP4), 88)
        .to(ip(CLIENT4), 59000)
        .macs(whole.dst_mac, whole.src_mac)
        .build();
    let (mut want_first, want_later) = ipv4_fragments(&restored, 0x4321, 24);
    dec_ttl(&mut want_first, false);
    let (v, out) = t.run_xdp(&first);
    assert_eq!(v, XDP_TX, "the reply's first fragment");
    assert_bytes("the reply's first fragment", &out, &want_first);
    let (v, out) = t.run_xdp(&later);
    assert_eq!(
        v, XDP_PASS,
        "the reply's later fragment: the kernel routes it"
    );
    // The reply's later fragment keeps the MACs it came with.
    let mut want_later = want_later;
    want_later[..12].copy_from_slice(&later[..12]);
    assert_bytes("the reply's later fragment", &out, &want_later);
}

/// An IPv4 frame split into two fragments at `at` bytes of payload (a
/// multiple of 8), with identification `id`; checksums computed here.
fn ipv4_fragments(frame: &[u8], id: u16, at: usize) -> (Vec<u8>, Vec<u8>) {
    let (eth, rest) = frame.split_at(14);
    let (h, payload) = Ipv4Header::from_slice(rest).expect("IPv4");
    let payload = &payload[..usize::from(h.total_len) - h.header_len()];
    let mut out = Vec::new();
    for (i, part) in [&payload[..at], &payload[at..]].iter().enumerate() {
        let mut f = eth.to_vec();
        let mut hh = h.clone();
        hh.identification = id;
        hh.dont_fragment = false;
        hh.more_fragments = i == 0;
        hh.fragment_offset =
            etherparse::IpFragOffset::try_new((i * at / 8) as u16).expect("offset");
        hh.set_payload_len(part.len()).expect("len");
        hh.header_checksum = hh.calc_header_checksum();
        hh.write(&mut f).expect("IPv4");
        f.extend_from_slice(part);
        out.push(f);
    }
    let later = out.pop().expect("two");
    (out.pop().expect("two"), later)
}

/// xdp_ingress once on `pkt` through its fd (the skeleton is not Sync;
/// an fd is): the verdict.
fn run_fd(fd: std::os::fd::RawFd, pkt: &[u8]) -> u32 {
    let mut out = vec![0u8; pkt.len() + 256];
    let mut opts = libbpf_sys::bpf_test_run_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as u64,
        data_in: pkt.as_ptr().cast(),
        data_size_in: pkt.len() as u32,
        data_out: out.as_mut_ptr().cast(),
        data_size_out: out.len() as u32,
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: valid program fd; buffers outlive the call and their sizes
    // are the ones given.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(fd, &mut opts) };
    assert_eq!(
        rc,
        0,
        "BPF_PROG_TEST_RUN: {}",
        std::io::Error::last_os_error()
    );
    opts.retval
}

/// Flows offered from two CPUs at once (threads pinned to each; a test
/// run executes on its caller's CPU): their allocations race for real.
/// With `sweep`, a third thread runs the sweep program over and over
/// meanwhile.
fn offer_from_cpus(t: &TestDp, frames: Vec<Vec<Vec<u8>>>, sweep: bool) -> Vec<Vec<u32>> {
    use std::os::fd::{AsFd, AsRawFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    let fd = t.dp.xdp().progs.xdp_ingress.as_fd().as_raw_fd();
    let sweep_fd = t.dp.xdp().progs.fullnat_sweep.as_fd().as_raw_fd();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let done = &done;
        if sweep {
            s.spawn(move || {
                let pkt = [0u8; 64];
                while !done.load(Ordering::Relaxed) {
                    run_fd(sweep_fd, &pkt);
                }
            });
        }
        let handles: Vec<_> = frames
            .into_iter()
            .enumerate()
            .map(|(cpu, fs)| {
                s.spawn(move || {
                    let mut set = nix::sched::CpuSet::new();
                    set.set(cpu).expect("cpu");
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                        .expect("pinning the thread");
                    fs.iter().map(|f| run_fd(fd, f)).collect::<Vec<u32>>()
                })
            })
            .collect();
        let out = handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect();
        done.store(true, Ordering::Relaxed);
        out
    })
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

        /// Ranges from 1 port to 96, up to 4 times as many flows as ports
        /// offered from two CPUs, then (`rounds` times) every flow idle and
        /// as many new ones again: the cursor wraps and idle flows' entries
        /// are taken over. Each round: no tuple held twice, every flow
        /// admitted or dropped and counted, never more admitted than ports,
        /// and, with no sweep running, never fewer (every port of a round
        /// is free or idle, and each allocation tries ports no other
        /// tries). With the sweep deleting idle entries meanwhile, a port
        /// an allocation lost to the sweep's retirement may stay unused
        /// for the round: the other checks hold.
        #[test]
        fn concurrent_cpus_never_share_a_tuple(
            ports in 1u16..=96,
            factor in 1u16..=4,
            rounds in 1usize..=3,
            sweep in any::<bool>(),
        ) {
            concurrent_rounds(ports, factor, rounds, sweep);
        }
    }
}

fn concurrent_rounds(ports: u16, factor: u16, rounds: usize, sweep: bool) {
    let ncpu = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    let (fx, ns) = setup("rvfnatcpu", (47000, 47000 + ports - 1));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let svc = fx
        .apply(&fullnat_vip(VIP4, 89, PROTO_UDP, &["10.9.13.1"]))
        .svc;
    let offered = usize::from(ports) * usize::from(factor);
    let mut next_sport = 1024u16;
    for round in 0..rounds {
        if round > 0 {
            age_everything(t, Duration::from_secs(61));
        }
        let drops0 = t.drops(rv_drop_reason::RV_DROP_FULLNAT_PORTS_EXHAUSTED);
        let mut flows: Vec<Vec<Frame>> = vec![Vec::new(); ncpu];
        for i in 0..offered {
            flows[i % ncpu].push(request(false, PROTO_UDP, CLIENT4, next_sport, VIP4, 89));
            next_sport += 1;
        }
        let frames = flows
            .iter()
            .map(|fs| fs.iter().map(Frame::build).collect())
            .collect();
        let verdicts = offer_from_cpus(t, frames, sweep);
        let mut admitted = 0usize;
        let mut held = std::collections::BTreeMap::new();
        for (fs, vs) in flows.iter().zip(&verdicts) {
            for (f, v) in fs.iter().zip(vs) {
                match *v {
                    XDP_PASS => {
                        admitted += 1;
                        let p = port_of(t, svc, f);
                        assert!(
                            (47000..47000 + ports).contains(&p),
                            "round {round}: port {p} outside the range"
                        );
                        if let Some(other) = held.insert(p, f.sport()) {
                            panic!(
                                "round {round}: port {p} given to client ports {other} and {}",
                                f.sport()
                            );
                        }
                        let e = rev_entry(t, ip("10.9.13.1"), ip(SRC4), p, PROTO_UDP)
                            .expect("the admitted flow's reverse entry");
                        assert_eq!(
                            port_from_be16(e.client_port),
                            f.sport(),
                            "round {round}: the tuple's entry names its flow"
                        );
                    }
                    XDP_DROP => {}
                    other => panic!("round {round}: verdict {other}"),
                }
            }
        }
        let dropped = t.drops(rv_drop_reason::RV_DROP_FULLNAT_PORTS_EXHAUSTED) - drops0;
        assert_eq!(
            admitted as u64 + dropped,
            offered as u64,
            "round {round}: each flow admitted or counted"
        );
        assert!(
            admitted <= usize::from(ports),
            "round {round}: no more flows than ports"
        );
        if !sweep {
            assert_eq!(
                admitted,
                usize::from(ports),
                "round {round}: the range's ports, every one ({offered} offered, {dropped} dropped)"
            );
        }
    }
}

// Quiet the unused-import lint for the families' literals kept for the
// reader beside the constants.
const _: (Ipv4Addr, Ipv6Addr) = (Ipv4Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED);

/// The sweep deletes the entries of flows idle past their timeout (TCP,
/// TCP closing, UDP each by its own), and only those.
#[test]
fn the_sweep_deletes_idle_entries_only() {
    let (fx, ns) = setup("rvfnatsweep", (48000, 48999));
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    fx.edit_node(|n| {
        n.fullnat.tcp_timeout_ms = 100_000;
        n.fullnat.tcp_closing_timeout_ms = 5_000;
        n.fullnat.udp_timeout_ms = 30_000;
    });
    let tcp = fx
        .apply(&fullnat_vip(VIP4, 90, PROTO_TCP, &["10.9.14.1"]))
        .svc;
    let udp = fx
        .apply(&fullnat_vip(VIP4, 91, PROTO_UDP, &["10.9.14.1"]))
        .svc;
    let open = request(false, PROTO_TCP, CLIENT4, 60000, VIP4, 90);
    let closing = request(false, PROTO_TCP, CLIENT4, 60001, VIP4, 90);
    let dgram = request(false, PROTO_UDP, CLIENT4, 60002, VIP4, 91);
    let p_open = send_request(t, "open", tcp, &open, ip("10.9.14.1"), ip(SRC4));
    let p_closing = send_request(t, "closing", tcp, &closing, ip("10.9.14.1"), ip(SRC4));
    send_request(
        t,
        "FIN",
        tcp,
        &closing.clone().fin(),
        ip("10.9.14.1"),
        ip(SRC4),
    );
    let p_dgram = send_request(t, "UDP", udp, &dgram, ip("10.9.14.1"), ip(SRC4));
    let sweep = |t: &TestDp| {
        use std::os::fd::{AsFd, AsRawFd};
        run_fd(
            t.dp.xdp().progs.fullnat_sweep.as_fd().as_raw_fd(),
            &[0u8; 64],
        )
    };
    let ports = |t: &TestDp| {
        let mut p: Vec<u16> = rev_entries(t).iter().map(|e| e.1).collect();
        p.sort_unstable();
        p
    };
    let mut all = vec![p_open, p_closing, p_dgram];
    all.sort_unstable();
    // Idle 10 s: only the closing flow (5 s) is past its timeout.
    age_everything(t, Duration::from_secs(10));
    assert_eq!(sweep(t), 1, "the closing flow's entry");
    let mut left = vec![p_open, p_dgram];
    left.sort_unstable();
    assert_eq!(ports(t), left);
    // Idle 40 s: the UDP flow too (30 s), not the open TCP one (100 s).
    age_everything(t, Duration::from_secs(40));
    assert_eq!(sweep(t), 1, "the UDP flow's entry");
    assert_eq!(ports(t), vec![p_open]);
    age_everything(t, Duration::from_secs(101));
    assert_eq!(sweep(t), 1, "the TCP flow's entry");
    assert!(ports(t).is_empty());
    assert_eq!(sweep(t), 0, "nothing left");
    let _ = all;
}
