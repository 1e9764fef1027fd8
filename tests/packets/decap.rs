//! The backend-side decapsulator (bpf/decap.bpf.c) packet by packet,
//! through BPF_PROG_TEST_RUN.

use crate::common;

/// The decap program packet by packet (BPF_PROG_TEST_RUN): what it strips,
/// what it keeps, and what it leaves alone. The end-to-end L3 DSR test
/// relies on it; these cases cover the shapes the lab does not send.
mod decap_packets {
    use etherparse::{
        EtherType, Ethernet2Header, IpEcn, IpHeaders, IpNumber, Ipv4Header, Ipv4Options,
        Ipv6FlowLabel, Ipv6Header, PacketBuilder, SingleVlanHeader,
    };
    use rivora::decap::{Decap, DecapStats};

    use super::common::{run_prog, XDP_PASS};

    const SMAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const DMAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const CLIENT4: [u8; 4] = [10, 9, 0, 1];
    const VIP4: [u8; 4] = [10, 0, 0, 100];
    const OTHER4: [u8; 4] = [10, 0, 0, 101];
    const NODE4: [u8; 4] = [10, 2, 0, 1];
    const BACKEND4: [u8; 4] = [10, 2, 0, 11];
    const CLIENT6: [u8; 16] = [0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const VIP6: [u8; 16] = [0xfd, 0, 0, 0x64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const NODE6: [u8; 16] = [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const BACKEND6: [u8; 16] = [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11];

    /// Ethernet with `tags` VLAN tags (802.1ad outside 802.1Q for two).
    fn l2(tags: usize, inner: EtherType) -> Vec<u8> {
        let mut types = vec![inner];
        if tags >= 1 {
            types.insert(0, EtherType::VLAN_TAGGED_FRAME);
        }
        if tags >= 2 {
            types.insert(0, EtherType::PROVIDER_BRIDGING);
        }
        let mut out = Ethernet2Header {
            source: SMAC,
            destination: DMAC,
            ether_type: types[0],
        }
        .to_bytes()
        .to_vec();
        for (i, next) in types.iter().skip(1).enumerate() {
            let tag = SingleVlanHeader {
                vlan_id: (100 + i as u16).try_into().expect("vlan id"),
                ether_type: *next,
                ..Default::default()
            };
            out.extend_from_slice(&tag.to_bytes());
        }
        out
    }

    /// The client's UDP datagram to `dst`, as an IP packet.
    fn inner4(dst: [u8; 4], ecn: IpEcn) -> Vec<u8> {
        let mut h = Ipv4Header::new(0, 64, IpNumber::UDP, CLIENT4, dst).expect("ipv4 header");
        h.ecn = ecn;
        let mut out = Vec::new();
        PacketBuilder::ip(IpHeaders::Ipv4(h, Default::default()))
            .udp(40000, 80)
            .write(&mut out, b"hello")
            .expect("inner v4 packet");
        out
    }

    fn inner6(dst: [u8; 16], ecn: IpEcn) -> Vec<u8> {
        let h = Ipv6Header {
            traffic_class: ecn as u8,
            flow_label: Ipv6FlowLabel::ZERO,
            payload_length: 0,
            next_header: IpNumber::UDP,
            hop_limit: 64,
            source: CLIENT6,
            destination: dst,
        };
        let mut out = Vec::new();
        PacketBuilder::ip(IpHeaders::Ipv6(h, Default::default()))
            .udp(40000, 80)
            .write(&mut out, b"hello")
            .expect("inner v6 packet");
        out
    }

    /// IPIP as the node builds it (IP protocol 4; etherparse's IPIP
    /// constant is protocol 94, a different thing).
    fn ipip(tags: usize, inner: &[u8], ecn: IpEcn, options: &[u8], mf: bool) -> Vec<u8> {
        let mut h = Ipv4Header::new(0, 64, IpNumber::IPV4, NODE4, BACKEND4).expect("outer");
        h.ecn = ecn;
        h.more_fragments = mf;
        h.options = Ipv4Options::try_from(options).expect("outer options");
        h.set_payload_len(inner.len()).expect("outer length");
        h.header_checksum = h.calc_header_checksum();
        let mut out = l2(tags, EtherType::IPV4);
        out.extend_from_slice(&h.to_bytes());
        out.extend_from_slice(inner);
        out
    }

    /// IPv6 carrying `inner` as next header `next` (41: IPv6-in-IPv6, as
    /// the node builds it).
    fn ip6_tunnel(tags: usize, next: IpNumber, inner: &[u8], ecn: IpEcn) -> Vec<u8> {
        let h = Ipv6Header {
            traffic_class: ecn as u8,
            flow_label: Ipv6FlowLabel::ZERO,
            payload_length: inner.len() as u16,
            next_header: next,
            hop_limit: 64,
            source: NODE6,
            destination: BACKEND6,
        };
        let mut out = l2(tags, EtherType::IPV6);
        out.extend_from_slice(&h.to_bytes());
        out.extend_from_slice(inner);
        out
    }

    fn ip6ip6(tags: usize, inner: &[u8], ecn: IpEcn) -> Vec<u8> {
        ip6_tunnel(tags, IpNumber::IPV6, inner, ecn)
    }

    fn bare(tags: usize, ether: EtherType, ip: &[u8]) -> Vec<u8> {
        let mut out = l2(tags, ether);
        out.extend_from_slice(ip);
        out
    }

    fn decap() -> Decap {
        let d = Decap::load().expect("loading the decap object");
        d.add_vip(std::net::Ipv4Addr::from(VIP4).into())
            .expect("VIP v4");
        d.add_vip(std::net::Ipv6Addr::from(VIP6).into())
            .expect("VIP v6");
        d
    }

    /// What, input, expected output, counters after (decap4, decap6,
    /// not_vip, malformed).
    type Case = (&'static str, Vec<u8>, Vec<u8>, [u64; 4]);

    fn counts(s: &DecapStats) -> [u64; 4] {
        [s.decap4, s.decap6, s.not_vip, s.malformed]
    }

    #[test]
    fn decap_program_packets() {
        let v4 = |e| inner4(VIP4, e);
        let v6 = |e| inner6(VIP6, e);
        let none = IpEcn::NotEct;
        let ce = IpEcn::CongestionExperienced;
        let ect0 = IpEcn::Ect0;
        let (e4, e6) = (EtherType::IPV4, EtherType::IPV6);
        let cases: Vec<Case> = vec![
            (
                "IPIP to a held VIP",
                ipip(0, &v4(none), none, &[], false),
                bare(0, e4, &v4(none)),
                [1, 0, 0, 0],
            ),
            (
                "IPIP, one 802.1Q tag kept",
                ipip(1, &v4(none), none, &[], false),
                bare(1, e4, &v4(none)),
                [1, 0, 0, 0],
            ),
            (
                "IPIP, 802.1ad and 802.1Q tags kept",
                ipip(2, &v4(none), none, &[], false),
                bare(2, e4, &v4(none)),
                [1, 0, 0, 0],
            ),
            (
                "IPIP whose outer header has options (IHL 7)",
                ipip(0, &v4(none), none, &[1, 1, 1, 1, 1, 1, 1, 0], false),
                bare(0, e4, &v4(none)),
                [1, 0, 0, 0],
            ),
            (
                "IPIP: CE outside, ECT(0) inside: the inner is marked CE",
                ipip(0, &v4(ect0), ce, &[], false),
                bare(0, e4, &v4(ce)),
                [1, 0, 0, 0],
            ),
            (
                "IPIP: CE outside, not-ECT inside: left as it is",
                ipip(0, &v4(none), ce, &[], false),
                bare(0, e4, &v4(none)),
                [1, 0, 0, 0],
            ),
            (
                "IPv6-in-IPv6 to a held VIP",
                ip6ip6(0, &v6(none), none),
                bare(0, e6, &v6(none)),
                [0, 1, 0, 0],
            ),
            (
                "IPv6-in-IPv6, two tags kept",
                ip6ip6(2, &v6(none), none),
                bare(2, e6, &v6(none)),
                [0, 1, 0, 0],
            ),
            (
                "IPv6-in-IPv6: CE outside, ECT(0) inside: the inner is marked CE",
                ip6ip6(0, &v6(ect0), ce),
                bare(0, e6, &v6(ce)),
                [0, 1, 0, 0],
            ),
            (
                "IPIP to a VIP not held: untouched",
                ipip(0, &inner4(OTHER4, none), none, &[], false),
                ipip(0, &inner4(OTHER4, none), none, &[], false),
                [0, 0, 1, 0],
            ),
            (
                "IPv6-in-IPv6 to an address not held: untouched",
                ip6ip6(0, &inner6(NODE6, none), none),
                ip6ip6(0, &inner6(NODE6, none), none),
                [0, 0, 1, 0],
            ),
            (
                "IPIP outer fragment: left to the kernel",
                ipip(0, &v4(none), none, &[], true),
                ipip(0, &v4(none), none, &[], true),
                [0, 0, 0, 1],
            ),
            (
                "plain UDP to the VIP: not a tunnel, untouched",
                bare(0, e4, &v4(none)),
                bare(0, e4, &v4(none)),
                [0, 0, 0, 0],
            ),
            (
                "IPv4-in-IPv6 (not a shape the node sends): untouched",
                ip6_tunnel(0, IpNumber::IPV4, &v4(none), none),
                ip6_tunnel(0, IpNumber::IPV4, &v4(none), none),
                [0, 0, 0, 0],
            ),
        ];
        for (what, input, want, after) in cases {
            let d = decap();
            let (verdict, out) = run_prog(&d.skel().progs.xdp_decap, &input);
            assert_eq!(verdict, XDP_PASS, "{what}: verdict");
            assert_eq!(out, want, "{what}: output packet");
            let s = d.stats().expect("decap stats");
            assert_eq!(counts(&s), after, "{what}: counters {s:?}");
        }

        // Truncated tunnel packets, cut at every length from a bare
        // Ethernet header up: never decapsulated, never changed.
        for full in [
            ipip(2, &v4(none), none, &[], false),
            ip6ip6(2, &v6(none), none),
        ] {
            let d = decap();
            for len in 14..full.len() {
                let cut = &full[..len];
                let (verdict, out) = run_prog(&d.skel().progs.xdp_decap, cut);
                assert_eq!(verdict, XDP_PASS, "cut at {len} of {}", full.len());
                assert_eq!(out, cut, "cut at {len} of {}: output", full.len());
            }
            let s = d.stats().expect("decap stats");
            assert_eq!((s.decap4, s.decap6), (0, 0), "truncated: {s:?}");
        }
    }
}
