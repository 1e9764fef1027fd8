//! Packet shapes through xdp_ingress (issue 2, proof 1): VLAN tags, IPv4
//! options, IPv6 extension headers, exact and port-range matching, traffic
//! that is not rivora's, and malformed or truncated frames.
//!
//! Fixture tables in the spirit of Katran's `KatranBaseTestFixtures.h`:
//! each case has a description, an input frame, the exact expected frame
//! and the expected verdict. Expected frames are built with etherparse,
//! which computes lengths and checksums itself; the output's checksums
//! are checked again with etherparse's calculators. Map state (NAT
//! reverse entries, affinity entries, per-VIP and drop counters) is
//! asserted after the runs.

use crate::common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::fixture::{Fx, Named};
use common::fixtures::*;
use common::*;
use etherparse::{
    ArpHardwareId, ArpOperation, ArpPacket, EtherType, Ethernet2Header, Icmpv6Type, IpNumber,
    Ipv4Header, PacketBuilder, SingleVlanHeader, VlanId, VlanPcp,
};
use rivora::abi::*;
use rivora::model::{Mac, Mode, NodeSettings};

const VIP4: &str = "10.0.0.100";
const VIP6: &str = "fd00::100";
const CLIENT4: &str = "10.250.0.10";
const CLIENT6: &str = "fd00:fa::10";
/// The MAC iface_mac_map holds for the test-run ingress interface (lo).
const IFACE_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xee];

/// The service set most tests share, written by the writer, by the
/// name the tests give each VIP (1 to 6).
fn setup(fx: &mut Fx) -> Named {
    let list = [
        // (name, mode, vip, port, proto, backend addr, backend port)
        (1, Mode::Nat, VIP4, 80, PROTO_TCP, "10.1.0.1", 8080),
        (2, Mode::Nat, VIP4, 53, PROTO_UDP, "10.1.0.2", 0),
        (3, Mode::Nat, VIP6, 80, PROTO_TCP, "fd00:1::1", 8080),
        (4, Mode::Nat, VIP6, 53, PROTO_UDP, "fd00:1::2", 0),
        (5, Mode::Dsr, VIP4, 443, PROTO_TCP, "10.1.0.5", 0),
        (6, Mode::Dsr, VIP6, 443, PROTO_TCP, "fd00:1::6", 0),
    ];
    fx.node(&NodeSettings {
        interface_macs: [(TEST_RUN_IFINDEX, Mac(IFACE_MAC))].into(),
        ..Default::default()
    });
    let mut out = Named::default();
    for (name, mode, vip, port, proto, addr, bport) in list {
        let be = Be {
            id: 0,
            addr: ip(addr),
            port: bport,
            mac: be_mac(name),
        };
        fx.add_named(&mut out, name, mode, (ip(vip), port, proto), be);
    }
    out
}

/// What DSR must make of `f`: MACs only.
fn dsr_of(f: &Frame, be: &Be) -> Frame {
    f.clone().macs(IFACE_MAC, be.mac)
}

/// A forwarded request, checked whole: the fixture case, then the map
/// state it must leave, then (NAT) the backend's reply through tc_nat.
struct Forward {
    desc: String,
    frame: Frame,
    svc: u32,
}

fn run_forwards(t: &TestDp, svcs: &Named, list: &[Forward]) {
    let mut want_stats: HashMap<u32, (u64, u64)> = HashMap::new();
    for fw in list {
        let be = svcs[&fw.svc];
        let svc = svcs.id(fw.svc);
        let nat = fw.svc <= 4;
        let input = fw.frame.build();
        let (want, verdict) = if nat {
            (nat_of(&fw.frame, &be).build(), XDP_PASS)
        } else {
            (dsr_of(&fw.frame, &be).build(), XDP_TX)
        };
        let case = Case {
            desc: fw.desc.clone(),
            input: input.clone(),
            want,
            verdict,
            drop: None,
        };
        run_case(t, &case);
        let s = want_stats.entry(svc).or_default();
        s.0 += 1;
        s.1 += input.len() as u64;
        assert_eq!(
            affinity_of(t, svc, &fw.frame),
            Some(be.id),
            "{}: affinity entry",
            fw.desc
        );
        if !nat {
            continue;
        }
        assert_nat_entry(t, &fw.desc, &fw.frame, &be, svc);

        // The backend's reply leaves with the VIP restored, tags kept.
        let reply = nat_of(&fw.frame, &be).reply();
        let (v, out) = t.run_tc(&reply.build());
        assert_eq!(v, TCX_PASS, "{}: reply verdict", fw.desc);
        let want = reply.from(fw.frame.dst_ip(), fw.frame.dport()).build();
        assert_bytes(&format!("{} (reply)", fw.desc), &out, &want);
        assert_checksums(&out);
    }
    for (svc, (packets, bytes)) in want_stats {
        let s = t.vip_stats(svc);
        assert_eq!((s.packets, s.bytes), (packets, bytes), "stats of svc {svc}");
    }
}

#[test]
fn vlan_shapes_are_forwarded_with_their_tags() {
    let mut fx = Fx::new();
    let svcs = setup(&mut fx);
    let t = &fx.t;
    let shapes = [
        ("untagged", Vlan::None),
        ("802.1Q", Vlan::Dot1q(100)),
        ("802.1ad+802.1Q", Vlan::QinQ(300, 100)),
    ];
    let mut list = Vec::new();
    for (sport, (name, vlan)) in (40000..).zip(shapes) {
        let flows = [
            ("NAT IPv4 TCP", 1, Frame::tcp4(CLIENT4, sport, VIP4, 80)),
            ("NAT IPv4 UDP", 2, Frame::udp4(CLIENT4, sport, VIP4, 53)),
            ("NAT IPv6 TCP", 3, Frame::tcp6(CLIENT6, sport, VIP6, 80)),
            ("NAT IPv6 UDP", 4, Frame::udp6(CLIENT6, sport, VIP6, 53)),
            ("DSR IPv4 TCP", 5, Frame::tcp4(CLIENT4, sport, VIP4, 443)),
            ("DSR IPv6 TCP", 6, Frame::tcp6(CLIENT6, sport, VIP6, 443)),
        ];
        for (what, svc, frame) in flows {
            list.push(Forward {
                desc: format!("{what}, {name}"),
                frame: frame.vlan(vlan),
                svc,
            });
        }
    }
    run_forwards(t, &svcs, &list);
    assert_eq!(nat_flows(t), 12);
}

/// Record Route (type 7), 39 bytes with room for nine addresses, then
/// End of Options: 40 bytes, IHL 15.
fn record_route() -> Vec<u8> {
    let mut o = vec![7, 39, 4];
    o.resize(39, 0);
    o.push(0);
    o
}

#[test]
fn ipv4_options_are_stepped_over() {
    let mut fx = Fx::new();
    let svcs = setup(&mut fx);
    let t = &fx.t;
    // Router Alert (RFC 2113): 4 bytes, IHL 6.
    let router_alert = vec![0x94, 0x04, 0x00, 0x00];
    let mut list = Vec::new();
    for (i, (name, opts)) in [("IHL 6", router_alert), ("IHL 15", record_route())]
        .into_iter()
        .enumerate()
    {
        let sport = 41000 + i as u16;
        let tcp = Frame::tcp4(CLIENT4, sport, VIP4, 80).ipv4_options(&opts);
        let udp = Frame::udp4(CLIENT4, sport, VIP4, 53).ipv4_options(&opts);
        let dsr = Frame::tcp4(CLIENT4, sport, VIP4, 443).ipv4_options(&opts);
        let tagged = Frame::tcp4(CLIENT4, sport + 100, VIP4, 80)
            .ipv4_options(&opts)
            .vlan(Vlan::QinQ(7, 8));
        assert_eq!(tcp.l3_len(), if i == 0 { 24 } else { 60 });
        list.push(Forward {
            desc: format!("NAT TCP, {name}"),
            frame: tcp,
            svc: 1,
        });
        list.push(Forward {
            desc: format!("NAT UDP, {name}"),
            frame: udp,
            svc: 2,
        });
        list.push(Forward {
            desc: format!("DSR TCP, {name}"),
            frame: dsr,
            svc: 5,
        });
        list.push(Forward {
            desc: format!("NAT TCP, {name}, 802.1ad+802.1Q"),
            frame: tagged,
            svc: 1,
        });
    }
    run_forwards(t, &svcs, &list);
}

#[test]
fn ipv6_extension_headers_are_stepped_over() {
    /// (kind, body) of one extension header.
    type Ext = (u8, Vec<u8>);
    let mut fx = Fx::new();
    let svcs = setup(&mut fx);
    let t = &fx.t;
    // A Hop-by-Hop header longer than the minimum (hdrlen 1: 16 bytes).
    let long_hbh = (IPPROTO_HOPOPTS, {
        let mut b = vec![1, 12];
        b.resize(14, 0);
        b
    });
    let six = vec![
        ext(IPPROTO_HOPOPTS),
        ext(IPPROTO_DSTOPTS),
        ext(IPPROTO_ROUTING),
        ext(IPPROTO_DSTOPTS),
        ext(IPPROTO_ROUTING),
        ext(IPPROTO_DSTOPTS),
    ];
    let chains: Vec<(&str, Vec<Ext>)> = vec![
        ("Hop-by-Hop", vec![ext(IPPROTO_HOPOPTS)]),
        ("Destination Options", vec![ext(IPPROTO_DSTOPTS)]),
        ("Routing", vec![ext(IPPROTO_ROUTING)]),
        ("16-byte Hop-by-Hop", vec![long_hbh]),
        (
            "Hop-by-Hop, Destination Options, Routing, Destination Options",
            vec![
                ext(IPPROTO_HOPOPTS),
                ext(IPPROTO_DSTOPTS),
                ext(IPPROTO_ROUTING),
                ext(IPPROTO_DSTOPTS),
            ],
        ),
        ("six headers (as many as the parser walks)", six.clone()),
    ];
    let mut list = Vec::new();
    for (i, (name, exts)) in chains.iter().enumerate() {
        let sport = 42000 + i as u16;
        list.push(Forward {
            desc: format!("NAT TCP, {name}"),
            frame: Frame::tcp6(CLIENT6, sport, VIP6, 80).ipv6_exts(exts),
            svc: 3,
        });
        list.push(Forward {
            desc: format!("NAT UDP, {name}"),
            frame: Frame::udp6(CLIENT6, sport, VIP6, 53).ipv6_exts(exts),
            svc: 4,
        });
        list.push(Forward {
            desc: format!("DSR TCP, {name}, 802.1Q"),
            frame: Frame::tcp6(CLIENT6, sport, VIP6, 443)
                .ipv6_exts(exts)
                .vlan(Vlan::Dot1q(42)),
            svc: 6,
        });
    }
    run_forwards(t, &svcs, &list);

    // One more header than the parser walks: not a packet rivora will
    // forward, handed to the kernel as it came.
    let mut seven = six;
    seven.push(ext(IPPROTO_DSTOPTS));
    let before = t.vip_stats(svcs.id(3));
    for (desc, f) in [
        (
            "seven extension headers, TCP",
            Frame::tcp6(CLIENT6, 42100, VIP6, 80),
        ),
        (
            "seven extension headers, UDP",
            Frame::udp6(CLIENT6, 42100, VIP6, 53),
        ),
    ] {
        let f = f.ipv6_exts(&seven);
        run_case(t, &Case::untouched(desc, f.build(), XDP_PASS));
        let svc = svcs.id(if f.proto() == PROTO_TCP { 3 } else { 4 });
        assert_eq!(affinity_of(t, svc, &f), None, "{desc}: no affinity");
    }
    assert_eq!(t.vip_stats(svcs.id(3)).packets, before.packets);
}

/// Exact beats range; a longer port prefix beats a shorter one; the
/// protocol is part of the match.
///
/// Hand-filled maps, on purpose: nested port prefixes (8000-8007 inside
/// 7936-8191) and a range from port 0 are trie states the writer never
/// produces (it refuses overlapping ranges and port 0), yet the trie's
/// longest-prefix answer to them is what this test is about.
#[test]
fn exact_and_range_matches_and_their_precedence() {
    let t = &TestDp::new();
    let nat = rv_mode::RV_MODE_NAT;
    let vip4: Ipv4Addr = "10.0.0.200".parse().unwrap();
    let vip6: Ipv6Addr = "fd00::200".parse().unwrap();
    // (svc offset, what): exact :80/tcp; range 0-1023/tcp (port 0, 6 bits);
    // 7936-8191/tcp (0x1f00, 8 bits); 8000-8007/tcp (0x1f40, 13 bits);
    // every UDP port (0 bits).
    for (base, vip, backend) in [
        (10, IpAddr::V4(vip4), "10.2.0."),
        (20, IpAddr::V6(vip6), "fd00:2::"),
    ] {
        for k in 1..=5u32 {
            let be = Be {
                id: base + k,
                addr: ip(&format!("{backend}{}", base + k)),
                port: 0,
                mac: be_mac(base + k),
            };
            let exact = (k == 1).then_some((vip, 80, PROTO_TCP));
            add_service(t, base + k, nat, exact, be);
        }
        let ranges = [
            (2, 0u16, 6u32, PROTO_TCP),
            (3, 0x1f00, 8, PROTO_TCP),
            (4, 0x1f40, 13, PROTO_TCP),
            (5, 0, 0, PROTO_UDP),
        ];
        for (k, port, bits, proto) in ranges {
            match vip {
                IpAddr::V4(a) => t.vip4_range(a, port, bits, proto, base + k),
                IpAddr::V6(a) => t.vip6_range(a, port, bits, proto, base + k),
            }
        }
        // A range service also on port 80/tcp would lose to the exact entry:
        // 0-1023 covers 80.
    }

    let mut n = 0u16;
    for (base, vip, other, client) in [
        (10u32, "10.0.0.200", "10.0.0.201", CLIENT4),
        (20, "fd00::200", "fd00::201", CLIENT6),
    ] {
        let v4 = base == 10;
        let tcp = |dst: &str, port: u16, sport: u16| {
            if v4 {
                Frame::tcp4(client, sport, dst, port)
            } else {
                Frame::tcp6(client, sport, dst, port)
            }
        };
        let udp = |dst: &str, port: u16, sport: u16| {
            if v4 {
                Frame::udp4(client, sport, dst, port)
            } else {
                Frame::udp6(client, sport, dst, port)
            }
        };
        let matched = [
            ("exact :80 beats the 0-1023 range", tcp(vip, 80, 0), 1),
            ("range 0-1023 at 81", tcp(vip, 81, 0), 2),
            ("range 0-1023 at its first port", tcp(vip, 0, 0), 2),
            ("range 0-1023 at its last port", tcp(vip, 1023, 0), 2),
            ("8000-8007 beats 7936-8191 at 8001", tcp(vip, 8001, 0), 4),
            ("8000-8007 at 8007", tcp(vip, 8007, 0), 4),
            ("7936-8191 at 8008", tcp(vip, 8008, 0), 3),
            ("7936-8191 at 7936", tcp(vip, 7936, 0), 3),
            ("7936-8191 at 8191", tcp(vip, 8191, 0), 3),
            ("every UDP port, 80", udp(vip, 80, 0), 5),
            ("every UDP port, 65535", udp(vip, 65535, 0), 5),
        ];
        for (desc, f, k) in matched {
            n += 1;
            let f = f.from(ip(client), 43000 + n);
            let svc = base + k;
            let be = Be {
                id: svc,
                addr: ip(&format!(
                    "{}{}",
                    if v4 { "10.2.0." } else { "fd00:2::" },
                    svc
                )),
                port: 0,
                mac: be_mac(svc),
            };
            let desc = format!("{}: {desc}", if v4 { "IPv4" } else { "IPv6" });
            let before = t.vip_stats(svc).packets;
            run_case(
                t,
                &Case {
                    desc: desc.clone(),
                    input: f.build(),
                    want: nat_of(&f, &be).build(),
                    verdict: XDP_PASS,
                    drop: None,
                },
            );
            assert_nat_entry(t, &desc, &f, &be, svc);
            assert_eq!(affinity_of(t, svc, &f), Some(svc), "{desc}: affinity");
            assert_eq!(t.vip_stats(svc).packets, before + 1, "{desc}: stats");
        }
        let unmatched = [
            ("TCP 1024 is in no range", tcp(vip, 1024, 43500)),
            ("TCP 7935 is in no range", tcp(vip, 7935, 43501)),
            ("TCP 8192 is in no range", tcp(vip, 8192, 43502)),
            ("another address, exact port", tcp(other, 80, 43503)),
            ("another address, range port", udp(other, 80, 43504)),
        ];
        for (desc, f) in unmatched {
            let desc = format!("{}: {desc}", if v4 { "IPv4" } else { "IPv6" });
            run_case(t, &Case::untouched(&desc, f.build(), XDP_PASS));
        }
    }
    assert_eq!(nat_flows(t), 22);
}

/// Frames that are not a VIP's, or not IP at all, go to the kernel as
/// they came: no rewrite, no counter, no state.
#[test]
fn traffic_that_is_not_ours_is_passed_untouched() {
    let mut fx = Fx::new();
    let svcs = setup(&mut fx);
    let t = &fx.t;

    let mut cases = vec![
        Case::untouched(
            "IPv4 TCP to a non-VIP address",
            Frame::tcp4(CLIENT4, 44000, "10.0.0.1", 80).build(),
            XDP_PASS,
        ),
        Case::untouched(
            "IPv4 TCP to the VIP on a port it does not serve",
            Frame::tcp4(CLIENT4, 44000, VIP4, 22).build(),
            XDP_PASS,
        ),
        Case::untouched(
            "IPv4 UDP to a TCP-only VIP port",
            Frame::udp4(CLIENT4, 44000, VIP4, 80).build(),
            XDP_PASS,
        ),
        Case::untouched(
            "IPv6 TCP to a non-VIP address",
            Frame::tcp6(CLIENT6, 44000, "fd00::1", 80).build(),
            XDP_PASS,
        ),
        Case::untouched(
            "IPv6 UDP to the VIP on a port it does not serve",
            Frame::udp6(CLIENT6, 44000, VIP6, 54).build(),
            XDP_PASS,
        ),
        Case::untouched(
            "IPv4 TCP to a non-VIP address, 802.1ad+802.1Q",
            Frame::tcp4(CLIENT4, 44000, "10.0.0.1", 80)
                .vlan(Vlan::QinQ(1, 2))
                .build(),
            XDP_PASS,
        ),
    ];

    let mut icmp4 = Vec::new();
    PacketBuilder::ethernet2(MAC_PEER, MAC_LB)
        .ipv4([192, 0, 2, 10], [10, 0, 0, 100], 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut icmp4, b"ping")
        .unwrap();
    cases.push(Case::untouched("ICMP echo to the VIP", icmp4, XDP_PASS));

    let c6: Ipv6Addr = CLIENT6.parse().unwrap();
    let v6: Ipv6Addr = VIP6.parse().unwrap();
    let mut icmp6 = Vec::new();
    PacketBuilder::ethernet2(MAC_PEER, MAC_LB)
        .ipv6(c6.octets(), v6.octets(), 64)
        .icmpv6_echo_request(7, 1)
        .write(&mut icmp6, b"ping")
        .unwrap();
    cases.push(Case::untouched("ICMPv6 echo to the VIP", icmp6, XDP_PASS));

    // SCTP (132) to the VIP: an L4 protocol rivora does not balance.
    let mut sctp = Vec::new();
    PacketBuilder::ethernet2(MAC_PEER, MAC_LB)
        .ipv4([192, 0, 2, 10], [10, 0, 0, 100], 64)
        .write(&mut sctp, IpNumber(132), &[0x9c, 0x40, 0, 80, 0, 0, 0, 0])
        .unwrap();
    cases.push(Case::untouched("SCTP to the VIP", sctp, XDP_PASS));

    for (op, name) in [
        (ArpOperation::REQUEST, "request"),
        (ArpOperation::REPLY, "reply"),
    ] {
        let mut arp = Vec::new();
        PacketBuilder::ethernet2(MAC_PEER, [0xff; 6])
            .arp(
                ArpPacket::new(
                    ArpHardwareId::ETHERNET,
                    EtherType::IPV4,
                    op,
                    &MAC_PEER,
                    &[192, 0, 2, 10],
                    &[0; 6],
                    &[10, 0, 0, 100],
                )
                .unwrap(),
            )
            .write(&mut arp)
            .unwrap();
        cases.push(Case::untouched(
            &format!("ARP {name} for the VIP"),
            arp,
            XDP_PASS,
        ));
    }

    // Neighbour solicitation (to the VIP's solicited-node group) and
    // advertisement, each with a link-layer address option.
    let mut ns_body = v6.octets().to_vec();
    ns_body.extend_from_slice(&[1, 1]);
    ns_body.extend_from_slice(&MAC_PEER);
    let sn: Ipv6Addr = "ff02::1:ff00:100".parse().unwrap();
    let mut ns = Vec::new();
    PacketBuilder::ethernet2(MAC_PEER, [0x33, 0x33, 0xff, 0, 1, 0])
        .ipv6(c6.octets(), sn.octets(), 255)
        .icmpv6(Icmpv6Type::NeighborSolicitation)
        .write(&mut ns, &ns_body)
        .unwrap();
    cases.push(Case::untouched(
        "ICMPv6 neighbour solicitation for the VIP",
        ns,
        XDP_PASS,
    ));
    let mut na_body = v6.octets().to_vec();
    na_body.extend_from_slice(&[2, 1]);
    na_body.extend_from_slice(&MAC_LB);
    let mut na = Vec::new();
    PacketBuilder::ethernet2(MAC_LB, MAC_PEER)
        .ipv6(v6.octets(), c6.octets(), 255)
        .icmpv6_raw(136, 0, [0x60, 0, 0, 0])
        .write(&mut na, &na_body)
        .unwrap();
    cases.push(Case::untouched(
        "ICMPv6 neighbour advertisement for the VIP",
        na,
        XDP_PASS,
    ));

    // Other EtherTypes: LLDP, MPLS unicast, and an 802.3 length field.
    for (et, name) in [(0x88cc, "LLDP"), (0x8847, "MPLS"), (0x002e, "802.3 length")] {
        let mut f = Vec::new();
        Ethernet2Header {
            source: MAC_PEER,
            destination: MAC_LB,
            ether_type: EtherType(et),
        }
        .write(&mut f)
        .unwrap();
        f.extend_from_slice(&[0xaa; 46]);
        cases.push(Case::untouched(&format!("EtherType {name}"), f, XDP_PASS));
    }

    // Three tags (more than the two the parser steps over), then an IPv4
    // packet to a VIP: not looked into.
    let mut triple = Vec::new();
    Ethernet2Header {
        source: MAC_PEER,
        destination: MAC_LB,
        ether_type: EtherType::PROVIDER_BRIDGING,
    }
    .write(&mut triple)
    .unwrap();
    for (id, next) in [
        (10, EtherType::VLAN_TAGGED_FRAME),
        (20, EtherType::VLAN_TAGGED_FRAME),
        (30, EtherType::IPV4),
    ] {
        SingleVlanHeader {
            pcp: VlanPcp::ZERO,
            drop_eligible_indicator: false,
            vlan_id: VlanId::try_new(id).unwrap(),
            ether_type: next,
        }
        .write(&mut triple)
        .unwrap();
    }
    triple.extend_from_slice(&Frame::tcp4(CLIENT4, 44001, VIP4, 80).build()[14..]);
    cases.push(Case::untouched(
        "three VLAN tags before a VIP packet",
        triple,
        XDP_PASS,
    ));

    for c in &cases {
        run_case(t, c);
    }
    assert_eq!(nat_flows(t), 0, "no NAT state");
    for name in 1..=6 {
        let svc = svcs.id(name);
        assert_eq!(t.vip_stats(svc).packets, 0, "no VIP counted (svc {svc})");
    }
    assert!(t
        .maps
        .connection_affinity_map
        .keys::<rv_flow_key>()
        .is_empty());
    assert!(t
        .maps
        .connection_affinity_map6
        .keys::<rv_flow6_key>()
        .is_empty());
}

/// Header fields that make a packet invalid: dropped, counted under the
/// layer's reason, never rewritten.
#[test]
fn malformed_headers_are_dropped_and_counted() {
    let mut fx = Fx::new();
    let _svcs = setup(&mut fx);
    let t = &fx.t;
    let malformed_l4 = rv_drop_reason::RV_DROP_MALFORMED_L4;
    let malformed_v4 = rv_drop_reason::RV_DROP_MALFORMED_IPV4;
    let malformed_v6 = rv_drop_reason::RV_DROP_MALFORMED_IPV6;

    let tcp4 = Frame::tcp4(CLIENT4, 45000, VIP4, 80).vlan(Vlan::Dot1q(5));
    let l3 = tcp4.l3_off();
    let base4 = tcp4.build();
    // Deliberately malformed bytes: each case patches one field of a valid
    // frame (the only offset arithmetic in this file).
    let patch = |f: &[u8], at: usize, bytes: &[u8]| {
        let mut v = f.to_vec();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    let tot_len = |len: usize| (len as u16).to_be_bytes();
    let mut cases = Vec::new();
    for ihl in 0..5u8 {
        cases.push(Case::dropped(
            &format!("IPv4 IHL {ihl}"),
            patch(&base4, l3, &[0x40 | ihl]),
            malformed_v4,
        ));
    }
    cases.push(Case::dropped(
        "IPv4 EtherType carrying version 6",
        patch(&base4, l3, &[0x65]),
        malformed_v4,
    ));
    let ip_len = base4.len() - l3;
    cases.push(Case::dropped(
        "IPv4 total length one past the frame",
        patch(&base4, l3 + 2, &tot_len(ip_len + 1)),
        malformed_v4,
    ));
    cases.push(Case::dropped(
        "IPv4 total length below the header length",
        patch(&base4, l3 + 2, &tot_len(19)),
        malformed_v4,
    ));
    cases.push(Case::dropped(
        "IPv4 IHL 15 with a 20-byte header (options run past the total length)",
        patch(&base4, l3, &[0x4f]),
        malformed_v4,
    ));
    let l4 = tcp4.l4_off();
    cases.push(Case::dropped(
        "TCP data offset 4",
        patch(&base4, l4 + 12, &[0x40]),
        malformed_l4,
    ));
    cases.push(Case::dropped(
        "TCP data offset 15 past the end of the IPv4 packet",
        patch(&base4, l4 + 12, &[0xf0]),
        malformed_l4,
    ));

    let tcp6 = Frame::tcp6(CLIENT6, 45000, VIP6, 80).ipv6_exts(&[ext(IPPROTO_HOPOPTS)]);
    let l3 = tcp6.l3_off();
    let base6 = tcp6.build();
    let payload_len = (base6.len() - l3 - 40) as u16;
    cases.push(Case::dropped(
        "IPv6 EtherType carrying version 4",
        patch(&base6, l3, &[0x45]),
        malformed_v6,
    ));
    cases.push(Case::dropped(
        "IPv6 payload length one past the frame",
        patch(&base6, l3 + 4, &(payload_len + 1).to_be_bytes()),
        malformed_v6,
    ));
    cases.push(Case::dropped(
        "IPv6 Hop-by-Hop header running past the packet",
        patch(&base6, l3 + 41, &[200]),
        malformed_v6,
    ));
    let l4 = tcp6.l4_off();
    cases.push(Case::dropped(
        "IPv6 TCP data offset 15 past the end of the packet",
        patch(&base6, l4 + 12, &[0xf0]),
        malformed_l4,
    ));
    let udp6 = Frame::udp6(CLIENT6, 45000, VIP6, 53);
    // A UDP header claiming less than itself.
    cases.push(Case::dropped(
        "IPv6 payload length shorter than the UDP header",
        patch(&udp6.build(), udp6.l3_off() + 4, &4u16.to_be_bytes()),
        malformed_l4,
    ));

    for c in &cases {
        run_case(t, c);
    }
    assert_eq!(nat_flows(t), 0, "nothing malformed was translated");
}

/// One's-complement addition (RFC 1071).
fn ones_add(a: u16, b: u16) -> u16 {
    let s = u32::from(a) + u32::from(b);
    ((s & 0xffff) + (s >> 16)) as u16
}

/// A VIP packet whose IPv4 header checksum does not add up. parse.h
/// makes ip_rcv_core()'s checks of version, IHL and total length, but not
/// its header checksum check (ip_fast_csum): such a packet is translated
/// like any other, NAT's incremental update (RFC 1624) carrying the error
/// along, and handed to the kernel, which drops it after XDP_PASS. This
/// pins what the datapath does today; whether it should drop and count
/// the packet itself, as docs/datapath.md's "the checks of the kernel's own ip_rcv"
/// suggests, is an open question (issue 11).
#[test]
fn ipv4_header_checksum_is_not_verified() {
    let mut fx = Fx::new();
    let svcs = setup(&mut fx);
    let t = &fx.t;
    let desc = "IPv4 TCP to a NAT VIP, header checksum off by 0x0101";
    let f = Frame::tcp4(CLIENT4, 45100, VIP4, 80).vlan(Vlan::Dot1q(5));
    let csum_at = f.l3_off() + 10;
    let field = |v: &[u8]| u16::from_be_bytes([v[csum_at], v[csum_at + 1]]);
    let set_field =
        |v: &mut Vec<u8>, c: u16| v[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());

    let mut input = f.build();
    let good_in = field(&input);
    let bad_in = good_in ^ 0x0101;
    set_field(&mut input, bad_in);
    // The error in the header's sum: ~bad - ~good.
    let err = ones_add(!bad_in, good_in);
    let be = svcs[&1];
    let mut want = nat_of(&f, &be).build();
    let good_out = field(&want);
    set_field(&mut want, !ones_add(!good_out, err));

    let before = drop_counts(t);
    let (v, out) = t.run_xdp(&input);
    assert_eq!(v, XDP_PASS, "{desc}: verdict");
    assert_bytes(desc, &out, &want);
    assert_eq!(
        drop_delta(&before, &drop_counts(t)),
        vec![],
        "{desc}: drops"
    );
    assert_ne!(
        field(&out),
        good_out,
        "{desc}: the header checksum stays wrong"
    );
    let ip = Ipv4Header::from_slice(&out[f.l3_off()..]).expect("IPv4").0;
    assert_ne!(ip.calc_header_checksum(), ip.header_checksum, "{desc}");
    assert_nat_entry(t, desc, &f, &be, svcs.id(1));
    assert_eq!(
        t.vip_stats(svcs.id(1)).packets,
        1,
        "{desc}: counted as forwarded"
    );
}

/// Ethernet padding after a short IP packet is not part of it: the packet
/// is forwarded, the padding kept as it was.
#[test]
fn ethernet_padding_after_the_ip_packet_is_kept() {
    let mut fx = Fx::new();
    let svcs = setup(&mut fx);
    let t = &fx.t;
    for (desc, f, svc) in [
        (
            "IPv4 UDP",
            Frame::udp4(CLIENT4, 46000, VIP4, 53).payload(b""),
            2,
        ),
        (
            "IPv4 TCP",
            Frame::tcp4(CLIENT4, 46000, VIP4, 80).payload(b""),
            1,
        ),
        (
            "IPv6 UDP",
            Frame::udp6(CLIENT6, 46000, VIP6, 53).payload(b""),
            4,
        ),
    ] {
        let pad = [0u8; 24];
        let mut input = f.build();
        input.extend_from_slice(&pad);
        let mut want = nat_of(&f, &svcs[&svc]).build();
        want.extend_from_slice(&pad);
        run_case(
            t,
            &Case {
                desc: format!("{desc} with 24 bytes of padding"),
                input: input.clone(),
                want,
                verdict: XDP_PASS,
                drop: None,
            },
        );
        assert_eq!(
            t.vip_stats(svcs.id(svc)).bytes,
            input.len() as u64,
            "{desc}: bytes"
        );
    }
}

/// Base frames for the truncation tests: every header shape, each a VIP
/// flow a complete frame would have rewritten.
fn truncation_bases() -> Vec<(&'static str, Frame)> {
    // MSS, SACK permitted, timestamps: a SYN's usual 20 bytes of options.
    let syn_opts = [
        2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ];
    vec![
        (
            "IPv4 TCP with options, untagged",
            Frame::tcp4(CLIENT4, 47000, VIP4, 80).tcp_options(&syn_opts),
        ),
        (
            "IPv4 UDP, 802.1Q",
            Frame::udp4(CLIENT4, 47001, VIP4, 53).vlan(Vlan::Dot1q(9)),
        ),
        (
            "IPv4 IHL 15 TCP, 802.1ad+802.1Q",
            Frame::tcp4(CLIENT4, 47002, VIP4, 80)
                .ipv4_options(&record_route())
                .vlan(Vlan::QinQ(1, 2)),
        ),
        (
            "IPv4 IHL 6 UDP, untagged",
            Frame::udp4(CLIENT4, 47003, VIP4, 53).ipv4_options(&[0x94, 4, 0, 0]),
        ),
        (
            "IPv6 TCP, 802.1ad+802.1Q",
            Frame::tcp6(CLIENT6, 47004, VIP6, 80).vlan(Vlan::QinQ(3, 4)),
        ),
        (
            "IPv6 Hop-by-Hop, Destination Options, Routing, UDP, 802.1Q",
            Frame::udp6(CLIENT6, 47005, VIP6, 53)
                .ipv6_exts(&[
                    ext(IPPROTO_HOPOPTS),
                    ext(IPPROTO_DSTOPTS),
                    ext(IPPROTO_ROUTING),
                ])
                .vlan(Vlan::Dot1q(10)),
        ),
        (
            "IPv6 Destination Options, TCP with options, untagged",
            Frame::tcp6(CLIENT6, 47006, VIP6, 80)
                .ipv6_exts(&[ext(IPPROTO_DSTOPTS)])
                .tcp_options(&syn_opts),
        ),
    ]
}

fn is_v6(f: &Frame) -> bool {
    matches!(f.net, common::fixtures::Net::V6 { .. })
}

/// Run a truncated or inconsistent frame that must be dropped untouched
/// under `reason`. Returns nothing; panics with the case description.
fn expect_drop(t: &TestDp, desc: &str, input: &[u8], reason: rv_drop_reason) {
    let before = drop_counts(t);
    let (v, out) = match try_run_xdp(t, input, None) {
        Ok(r) => r,
        Err(e) => panic!("{desc}: test_run failed: {e}"),
    };
    let after = drop_counts(t);
    assert_eq!(
        (v, drop_delta(&before, &after)),
        (XDP_DROP, vec![(label(reason), 1)]),
        "{desc}: verdict and drop counter"
    );
    assert_bytes(desc, &out, input);
}

/// Every frame cut at every length: the kernel refuses frames shorter
/// than an Ethernet header; from there on the program never fails, never
/// rewrites, and drops with the reason of the first header that is cut
/// (a cut anywhere past the IP header leaves the IP length pointing past
/// the frame).
#[test]
fn frames_cut_at_every_length() {
    let mut fx = Fx::new();
    let svcs = setup(&mut fx);
    let t = &fx.t;
    let mut runs = 0;
    let mut want_runs = 0;
    for (name, f) in truncation_bases() {
        let full = f.build();
        want_runs += full.len() - 14;
        let l3 = f.l3_off();
        let ip_reason = if is_v6(&f) {
            rv_drop_reason::RV_DROP_MALFORMED_IPV6
        } else {
            rv_drop_reason::RV_DROP_MALFORMED_IPV4
        };
        for len in 0..full.len() {
            let cut = &full[..len];
            let desc = format!("{name}, cut at {len} of {}", full.len());
            if len < 14 {
                let before = drop_counts(t);
                assert!(
                    try_run_xdp(t, cut, None).is_err(),
                    "{desc}: the kernel runs XDP only on a whole Ethernet header"
                );
                assert_eq!(drop_counts(t), before, "{desc}: nothing counted");
                continue;
            }
            let reason = if len < l3 {
                rv_drop_reason::RV_DROP_MALFORMED_L2
            } else {
                ip_reason
            };
            expect_drop(t, &desc, cut, reason);
            runs += 1;
        }
        // The whole frame is forwarded.
        let svc = match (is_v6(&f), f.proto()) {
            (false, PROTO_TCP) => 1,
            (false, _) => 2,
            (true, PROTO_TCP) => 3,
            (true, _) => 4,
        };
        run_case(
            t,
            &Case {
                desc: format!("{name}, whole"),
                input: full.clone(),
                want: nat_of(&f, &svcs[&svc]).build(),
                verdict: XDP_PASS,
                drop: None,
            },
        );
    }
    assert_eq!(runs, want_runs, "every cut from 14 bytes on was run");
    assert_eq!(nat_flows(t), truncation_bases().len());
}

/// Cut inside the headers with the IP length fields made to agree with
/// the cut, so that the parser reaches the header that is actually
/// short; then the same with trailing padding (as Ethernet pads short
/// frames), so that the header's missing bytes are present in the frame
/// but not in the IP packet. Either way: dropped under the reason of the
/// cut header, no byte changed.
#[test]
fn headers_cut_inside_a_consistent_ip_packet() {
    let mut fx = Fx::new();
    let _svcs = setup(&mut fx);
    let t = &fx.t;
    let mut runs = 0;
    for (name, f) in truncation_bases() {
        let full = f.build();
        let l3 = f.l3_off();
        let l4 = f.l4_off();
        let l4_end = l4 + f.l4_len();
        let v6 = is_v6(&f);
        // Where the length field ends: from there on it can be patched.
        let first = if v6 { l3 + 40 } else { l3 + 4 };
        for len in first..l4_end {
            let mut cut = full[..len].to_vec();
            let reason = if v6 {
                let pl = (len - l3 - 40) as u16;
                cut[l3 + 4..l3 + 6].copy_from_slice(&pl.to_be_bytes());
                if len < l4 {
                    rv_drop_reason::RV_DROP_MALFORMED_IPV6
                } else {
                    rv_drop_reason::RV_DROP_MALFORMED_L4
                }
            } else {
                cut[l3 + 2..l3 + 4].copy_from_slice(&((len - l3) as u16).to_be_bytes());
                if len >= l3 + 20 {
                    // A consistent header checksum, so that only the cut
                    // is wrong with it.
                    let h = Ipv4Header::from_slice(&cut[l3..]).map(|(h, _)| h);
                    if let Ok(h) = h {
                        let c = h.calc_header_checksum().to_be_bytes();
                        cut[l3 + 10..l3 + 12].copy_from_slice(&c);
                    }
                }
                if len < l4 {
                    rv_drop_reason::RV_DROP_MALFORMED_IPV4
                } else {
                    rv_drop_reason::RV_DROP_MALFORMED_L4
                }
            };
            let desc = format!("{name}, consistent cut at {len} (headers end at {l4_end})");
            expect_drop(t, &desc, &cut, reason);
            let mut padded = cut.clone();
            padded.resize(cut.len() + 64, 0);
            expect_drop(t, &format!("{desc}, padded"), &padded, reason);
            runs += 2;
        }
    }
    assert!(runs > 300, "{runs} cut headers run");
    assert_eq!(nat_flows(t), 0, "nothing cut was translated");
}
