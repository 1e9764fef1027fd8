//! DSR across nodes, the endpoint's node (issue 27, item 3), through the
//! real xdp_ingress and tc_nat: maps filled by the real writer from a VIP
//! as Kubernetes writes one (L3 DSR, this node's endpoint reached by NAT,
//! another node's by the tunnel), tunnel packets built with etherparse and
//! every output byte compared with a frame built from scratch.
//!
//! - A client's packet that another node wrapped in IPIP or IPv6 in IPv6
//!   to an endpoint of this node comes out bare and NAT'd to that endpoint
//!   (the L2 header and any VLAN tags kept), the flow remembered as this
//!   node's own; the endpoint's reply leaves tc_nat as VIP -> client; TCP
//!   and UDP, IPv4 and IPv6, tagged or not
//!   (`a_tunnel_to_an_endpoint_here_is_natted_to_it`).
//! - The sending node's choice is kept, whatever this node's Maglev table
//!   or affinity entry says (`the_sending_nodes_choice_is_kept`).
//! - Tunnels that are not to one of this node's endpoints of the inner
//!   packet's VIP, or not of a shape taken (fragments, the other family
//!   inside, ICMP inside, an inner packet shorter than the outer), are
//!   passed untouched and drop nothing (`other_tunnels_pass_untouched`).
//! - The sending node rate-limited the SYN: a tunnelled one is not limited
//!   again (`tunnelled_syns_are_not_limited_twice`).
//! - Congestion marked on the outer header is kept on the inner
//!   (`outer_ce_marks_the_inner_packet`).
//! - An entry naming a backend not reached by NAT is refused and counted,
//!   never sent on (`a_tunnel_is_never_sent_on`); the VIP's removal takes
//!   its entries (`removing_the_vip_takes_its_tunnel_endpoints`).

use crate::common;

use std::net::IpAddr;

use common::fixture::{self, Fx};
use common::fixtures::*;
use common::netns::{InNetns, Netns};
use common::*;
use etherparse::{IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header};
use rivora::abi::*;
use rivora::model::{Mode, Vip};

const CLIENT4: &str = "10.250.2.10";
const CLIENT6: &str = "fd00:fa:2::10";
const VIP4: &str = "10.0.8.100";
const VIP6: &str = "fd00:8::100";
/// This node's endpoint, and another node's.
const HERE4: &str = "10.244.1.5";
const HERE6: &str = "fd00:244:1::5";
const THERE4: &str = "10.244.2.7";
const THERE6: &str = "fd00:244:2::7";
/// The sending node (the tunnel's outer source).
const SENDER4: &str = "10.249.0.2";
const SENDER6: &str = "fd00:f9::2";
const VPORT: u16 = 80;
const BPORT: u16 = 8080;

fn mac(i: u8) -> [u8; 6] {
    [0x02, 0xbe, 0, 0, 0, i]
}

fn addrs(v6: bool) -> (&'static str, &'static str, &'static str, &'static str) {
    if v6 {
        (CLIENT6, VIP6, HERE6, THERE6)
    } else {
        (CLIENT4, VIP4, HERE4, THERE4)
    }
}

/// The VIP as this node's rivorad holds it under DSR across nodes.
fn across(v6: bool, proto: u8, vport: u16) -> Vip {
    let (_, vip, here, there) = addrs(v6);
    let mut local = fixture::backend(ip(here), BPORT, mac(1));
    local.mode = Some(Mode::Nat);
    local.node = Some("node-1".into());
    let mut remote = fixture::backend(ip(there), BPORT, mac(2));
    remote.node = Some("node-2".into());
    fixture::vip(ip(vip), vport, proto, Mode::L3Dsr, vec![local, remote])
}

fn request(v6: bool, proto: u8, sport: u16, vport: u16) -> Frame {
    let (client, vip, ..) = addrs(v6);
    match (v6, proto) {
        (false, PROTO_TCP) => Frame::tcp4(client, sport, vip, vport),
        (false, _) => Frame::udp4(client, sport, vip, vport),
        (true, PROTO_TCP) => Frame::tcp6(client, sport, vip, vport),
        (true, _) => Frame::udp6(client, sport, vip, vport),
    }
}

/// The outer header another node's L3 DSR adds, as bytes: IPIP (RFC 2003,
/// TTL 64, DF, the inner TOS) or IPv6 in IPv6 (RFC 2473), from `src` to
/// `dst`, around `inner` (an IP packet). `next` overrides the protocol
/// field (the other family inside), `tos` the outer TOS / traffic class.
fn outer(src: IpAddr, dst: IpAddr, inner: &[u8], next: Option<u8>, tos: u8) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let proto = IpNumber(next.unwrap_or(4));
            let mut h = Ipv4Header::new(inner.len() as u16, 64, proto, s.octets(), d.octets())
                .expect("outer IPv4 header");
            h.dont_fragment = true;
            h.dscp = etherparse::IpDscp::try_new(tos >> 2).expect("dscp");
            h.ecn = etherparse::IpEcn::try_new(tos & 3).expect("ecn");
            h.header_checksum = h.calc_header_checksum();
            h.to_bytes().to_vec()
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => Ipv6Header {
            traffic_class: tos,
            flow_label: Ipv6FlowLabel::ZERO,
            payload_length: inner.len() as u16,
            next_header: IpNumber(next.unwrap_or(41)),
            hop_limit: 64,
            source: s.octets(),
            destination: d.octets(),
        }
        .to_bytes()
        .to_vec(),
        _ => panic!("one family"),
    }
}

/// `f` as it arrives here from the sending node: its L2 header (tags
/// included) and then the outer header to `to`.
fn tunnelled(f: &Frame, to: &str) -> Vec<u8> {
    tunnelled_with(f, to, None, 0)
}

fn tunnelled_with(f: &Frame, to: &str, next: Option<u8>, tos: u8) -> Vec<u8> {
    let bytes = f.build();
    let l3 = f.l3_off();
    let from = if f.dst_ip().is_ipv6() {
        SENDER6
    } else {
        SENDER4
    };
    let mut out = bytes[..l3].to_vec();
    out.extend(outer(ip(from), ip(to), &bytes[l3..], next, tos));
    out.extend_from_slice(&bytes[l3..]);
    out
}

/// A datapath in an empty namespace (no route: a request is left to the
/// kernel, NAT'd) with the node's tunnel sources.
fn setup(name: &str) -> (Fx, Netns) {
    let fx = Fx::new();
    fx.tunnel(
        Some("10.249.0.1".parse().expect("src4")),
        Some("fd00:f9::1".parse().expect("src6")),
    );
    (fx, Netns::new(&unique(name)))
}

fn here(v6: bool, id: u32) -> Be {
    let (_, _, h, _) = addrs(v6);
    Be {
        id,
        addr: ip(h),
        port: BPORT,
        mac: mac(1),
    }
}

#[test]
fn a_tunnel_to_an_endpoint_here_is_natted_to_it() {
    let (fx, ns) = setup("rvtunin");
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let mut sport = 41000u16;
    for v6 in [false, true] {
        for proto in [PROTO_TCP, PROTO_UDP] {
            let vip = across(v6, proto, VPORT);
            let placed = fx.apply(&vip);
            let be = here(v6, placed.ids[0]);
            for vlan in [Vlan::None, Vlan::Dot1q(7), Vlan::QinQ(8, 9)] {
                sport += 1;
                let desc = format!("v6={v6} proto={proto} {vlan:?}");
                let f = request(v6, proto, sport, VPORT).vlan(vlan);
                let before = t.vip_stats(placed.svc).packets;
                run_case(
                    t,
                    &Case {
                        desc: format!("{desc}: tunnelled request"),
                        input: tunnelled(&f, &be.addr.to_string()),
                        want: nat_of(&f, &be).build(),
                        verdict: XDP_PASS,
                        drop: None,
                    },
                );
                assert_eq!(
                    t.vip_stats(placed.svc).packets,
                    before + 1,
                    "{desc}: counted for the VIP"
                );
                assert_eq!(
                    affinity_of(t, placed.svc, &f),
                    Some(be.id),
                    "{desc}: remembered as this node's flow"
                );
                assert_nat_entry(t, &desc, &f, &be, placed.svc);
                // The endpoint's reply, routed out by this node (its
                // gateway): tc_nat makes it VIP -> client.
                let reply = nat_of(&f, &be).reply();
                let (v, out) = t.run_tc(&reply.build());
                assert_eq!(v, TCX_PASS, "{desc}: reply verdict");
                assert_bytes(
                    &format!("{desc}: reply"),
                    &out,
                    &reply.from(f.dst_ip(), VPORT).build(),
                );
                // The next packet of the flow, tunnelled again: the same.
                if proto == PROTO_TCP {
                    let next = f.clone().established(1);
                    run_case(
                        t,
                        &Case {
                            desc: format!("{desc}: established"),
                            input: tunnelled(&next, &be.addr.to_string()),
                            want: nat_of(&next, &be).build(),
                            verdict: XDP_PASS,
                            drop: None,
                        },
                    );
                }
            }
        }
    }
}

#[test]
fn the_sending_nodes_choice_is_kept() {
    let (fx, ns) = setup("rvtunchoice");
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    for v6 in [false, true] {
        let vip = across(v6, PROTO_TCP, VPORT);
        let placed = fx.apply(&vip);
        let be = here(v6, placed.ids[0]);
        let remote = placed.ids[1];
        // A flow this node's own table gives the other node's endpoint.
        let f = (43000u16..44000)
            .map(|p| request(v6, PROTO_TCP, p, VPORT))
            .find(|f| {
                fx.pick_flow(placed.svc, f.src_ip(), f.sport(), VPORT, PROTO_TCP) == Some(remote)
            })
            .expect("a flow this node sends to the other node");
        // Bare, it goes to the other node in a tunnel, remembered so.
        let (v, _) = t.run_xdp(&f.build());
        assert_eq!(v, XDP_PASS, "v6={v6}: the bare request, tunnelled");
        assert_eq!(affinity_of(t, placed.svc, &f), Some(remote));
        // Tunnelled here by a node that chose this node's endpoint: that
        // choice, and the affinity entry says so from now on.
        run_case(
            t,
            &Case {
                desc: format!("v6={v6}: tunnelled to the endpoint here"),
                input: tunnelled(&f, &be.addr.to_string()),
                want: nat_of(&f, &be).build(),
                verdict: XDP_PASS,
                drop: None,
            },
        );
        assert_eq!(affinity_of(t, placed.svc, &f), Some(be.id), "v6={v6}");
    }
}

#[test]
fn other_tunnels_pass_untouched() {
    let (fx, ns) = setup("rvtunother");
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    for v6 in [false, true] {
        let placed = fx.apply(&across(v6, PROTO_TCP, VPORT));
        let (_, vip, here, there) = addrs(v6);
        // A NAT VIP with the same endpoint: no tunnel reaches it.
        let nat = fixture::vip(
            ip(vip),
            81,
            PROTO_TCP,
            Mode::Nat,
            vec![fixture::backend(ip(here), BPORT, mac(1))],
        );
        fx.apply(&nat);
        let f = request(v6, PROTO_TCP, 45000, VPORT);
        let mut cases = vec![
            ("to the other node's endpoint", tunnelled(&f, there)),
            (
                "inner packet to no VIP (another port)",
                tunnelled(&request(v6, PROTO_TCP, 45001, 82), here),
            ),
            (
                "inner packet to a NAT VIP",
                tunnelled(&request(v6, PROTO_TCP, 45002, 81), here),
            ),
            (
                "the other family inside",
                tunnelled_with(&f, here, Some(if v6 { 4 } else { 41 }), 0),
            ),
        ];
        // The inner packet ends before the outer one does.
        let mut short = tunnelled(&f, here);
        short.extend_from_slice(&[0; 8]);
        let l3 = f.l3_off();
        if v6 {
            let len = u16::from_be_bytes([short[l3 + 4], short[l3 + 5]]) + 8;
            short[l3 + 4..l3 + 6].copy_from_slice(&len.to_be_bytes());
        } else {
            let len = u16::from_be_bytes([short[l3 + 2], short[l3 + 3]]) + 8;
            short[l3 + 2..l3 + 4].copy_from_slice(&len.to_be_bytes());
            let sum = Ipv4Header::from_slice(&short[l3..])
                .expect("outer")
                .0
                .calc_header_checksum();
            short[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
        }
        cases.push(("inner packet shorter than the outer", short));
        if !v6 {
            // An outer fragment (MF set): the kernel's to reassemble.
            let mut frag = tunnelled(&f, here);
            frag[l3 + 6] = 0x20;
            let sum = Ipv4Header::from_slice(&frag[l3..])
                .expect("outer")
                .0
                .calc_header_checksum();
            frag[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
            cases.push(("outer fragment", frag));
            // An inner fragment: its later fragments would carry no ports.
            let inner_frag = tunnelled(&f.clone().ip_id(9), here);
            let mut inner_frag = inner_frag;
            let i3 = l3 + 20;
            inner_frag[i3 + 6] = 0x20;
            let sum = Ipv4Header::from_slice(&inner_frag[i3..])
                .expect("inner")
                .0
                .calc_header_checksum();
            inner_frag[i3 + 10..i3 + 12].copy_from_slice(&sum.to_be_bytes());
            cases.push(("inner fragment", inner_frag));
        }
        for (what, input) in cases {
            run_case(
                t,
                &Case::untouched(&format!("v6={v6}: {what}"), input, XDP_PASS),
            );
        }
        assert_eq!(
            affinity_of(t, placed.svc, &f),
            None,
            "v6={v6}: nothing remembered"
        );
    }
}

#[test]
fn tunnelled_syns_are_not_limited_twice() {
    let (fx, ns) = setup("rvtunsyn");
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let vip = fixture::with_rate_limit(across(false, PROTO_TCP, VPORT), 1, 1);
    let placed = fx.apply(&vip);
    let be = here(false, placed.ids[0]);
    for sport in 46000u16..46005 {
        let f = request(false, PROTO_TCP, sport, VPORT);
        run_case(
            t,
            &Case {
                desc: format!("tunnelled SYN from port {sport}"),
                input: tunnelled(&f, HERE4),
                want: nat_of(&f, &be).build(),
                verdict: XDP_PASS,
                drop: None,
            },
        );
    }
    // The same client's bare SYNs meet the VIP's bucket: one, then none.
    let (v, _) = t.run_xdp(&request(false, PROTO_TCP, 46010, VPORT).build());
    assert_eq!(v, XDP_PASS, "the first bare SYN");
    let before = t.drops(rv_drop_reason::RV_DROP_RATE_LIMITED);
    let (v, _) = t.run_xdp(&request(false, PROTO_TCP, 46011, VPORT).build());
    assert_eq!(v, XDP_DROP, "the second bare SYN");
    assert_eq!(t.drops(rv_drop_reason::RV_DROP_RATE_LIMITED), before + 1);
}

#[test]
fn outer_ce_marks_the_inner_packet() {
    let (fx, ns) = setup("rvtunecn");
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    for v6 in [false, true] {
        let placed = fx.apply(&across(v6, PROTO_UDP, VPORT));
        let be = here(v6, placed.ids[0]);
        let f = request(v6, PROTO_UDP, 47000, VPORT);
        // The inner packet ECT(0) (as the sender copies the inner TOS out,
        // a router on the way marked the outer CE).
        let mut input = tunnelled_with(&f, &be.addr.to_string(), None, 3);
        let inner = f.l3_off() + if v6 { 40 } else { 20 };
        if v6 {
            input[inner + 1] |= 0x2 << 4;
        } else {
            input[inner + 1] |= 0x2;
            input[inner + 10..inner + 12].copy_from_slice(&[0, 0]);
            let sum = Ipv4Header::from_slice(&input[inner..])
                .expect("inner")
                .0
                .calc_header_checksum();
            input[inner + 10..inner + 12].copy_from_slice(&sum.to_be_bytes());
        }
        let (v, out) = t.run_xdp(&input);
        assert_eq!(v, XDP_PASS, "v6={v6}");
        let l3 = f.l3_off();
        let ecn = if v6 {
            (out[l3 + 1] >> 4) & 3
        } else {
            out[l3 + 1] & 3
        };
        assert_eq!(ecn, 3, "v6={v6}: the inner packet carries CE");
        assert_checksums(&out);
        assert_eq!(affinity_of(t, placed.svc, &f), Some(be.id), "v6={v6}");
    }
}

#[test]
fn a_tunnel_is_never_sent_on() {
    let (fx, ns) = setup("rvtunloop");
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let placed = fx.apply(&across(false, PROTO_TCP, VPORT));
    // An entry naming the other node's endpoint (reached by the tunnel
    // itself), as no writer writes one: refused, not tunnelled again.
    t.maps
        .tunnel_ep_map
        .put(
            &rv_tunnel_ep_key {
                svc_id: placed.svc,
                addr: [be32(THERE4.parse().expect("there")), 0, 0, 0],
            },
            &rv_tunnel_ep {
                backend_id: placed.ids[1],
            },
        )
        .expect("tunnel_ep_map");
    let f = request(false, PROTO_TCP, 48000, VPORT);
    let (v, _) = t.run_xdp(&tunnelled(&f, THERE4));
    assert_eq!(v, XDP_DROP);
    assert_eq!(t.drops(rv_drop_reason::RV_DROP_NO_BACKEND), 1);
}

#[test]
fn removing_the_vip_takes_its_tunnel_endpoints() {
    let (fx, ns) = setup("rvtunrm");
    let t = &fx.t;
    let _in = InNetns::enter(&ns);
    let mut vip = across(false, PROTO_TCP, VPORT);
    let placed = fx.apply(&vip);
    let entries = |t: &TestDp| {
        t.maps
            .tunnel_ep_map
            .entries::<rv_tunnel_ep_key, rv_tunnel_ep>()
            .expect("tunnel_ep_map")
    };
    let want_key = rv_tunnel_ep_key {
        svc_id: placed.svc,
        addr: [be32(HERE4.parse().expect("here")), 0, 0, 0],
    };
    let got = entries(t);
    assert_eq!(got.len(), 1, "one endpoint here");
    assert_eq!(got[0].0.svc_id, want_key.svc_id);
    assert_eq!(got[0].0.addr, want_key.addr);
    assert_eq!(got[0].1.backend_id, placed.ids[0]);
    // The endpoint moves to another node: no longer one of this node's.
    vip.backends[0].mode = None;
    vip.backends[0].node = Some("node-3".into());
    fx.apply(&vip);
    assert!(entries(t).is_empty(), "the endpoint moved away");
    let f = request(false, PROTO_TCP, 49000, VPORT);
    run_case(
        t,
        &Case::untouched(
            "to an endpoint no longer here",
            tunnelled(&f, HERE4),
            XDP_PASS,
        ),
    );
    vip.backends[0].mode = Some(Mode::Nat);
    vip.backends[0].node = Some("node-1".into());
    fx.apply(&vip);
    assert_eq!(entries(t).len(), 1, "back");
    // Reached by NAT but on no node (a static file's backend): no tunnel
    // reaches it.
    vip.backends[0].node = None;
    fx.apply(&vip);
    assert!(entries(t).is_empty(), "a NAT backend on no node");
    fx.remove(&vip);
    assert!(entries(t).is_empty(), "the VIP's removal takes them");
    // preserveClientIP as Kubernetes writes it: a NAT VIP, this node's
    // endpoint by NAT on this node, another node's by the tunnel.
    let mut nat = across(false, PROTO_TCP, VPORT);
    nat.mode = Mode::Nat;
    nat.backends[0].mode = None;
    nat.backends[1].mode = Some(Mode::L3Dsr);
    let placed = fx.apply(&nat);
    let got = entries(t);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].1.backend_id, placed.ids[0]);
    let f = request(false, PROTO_TCP, 49001, VPORT);
    run_case(
        t,
        &Case {
            desc: "a NAT VIP's endpoint here, tunnelled to".into(),
            input: tunnelled(&f, HERE4),
            want: nat_of(&f, &here(false, placed.ids[0])).build(),
            verdict: XDP_PASS,
            drop: None,
        },
    );
    fx.remove(&nat);
    assert!(entries(t).is_empty());
}
