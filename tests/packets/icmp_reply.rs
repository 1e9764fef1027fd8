//! tc_nat and ICMP errors on their way to a NAT VIP's client: the error
//! quotes the client's packet as it left the node (to the backend), so the
//! quote must be turned back into client -> VIP:port, and an error the
//! backend itself sent must come from the VIP. Expected packets are built
//! independently with etherparse (which computes every checksum).

use crate::common;

use std::net::IpAddr;

use common::fixture::{self, Fx};
use common::*;
use etherparse::icmpv4::DestUnreachableHeader;
use etherparse::{Icmpv4Type, Icmpv6Type, PacketBuilder};
use rivora::model::Mode;

const CMAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const NMAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address constant")
}

/// The IP packet a client sent, as quoted: `payload` bytes of UDP or TCP.
fn quote(proto: u8, src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    let b = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 63),
        (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 63),
        _ => panic!("one family"),
    };
    let mut v = Vec::new();
    if proto == PROTO_UDP {
        b.udp(sport, dport)
            .write(&mut v, b"request bytes")
            .expect("quote");
    } else {
        b.tcp(sport, dport, 1000, 64000)
            .ack(1)
            .write(&mut v, b"request bytes")
            .expect("quote");
    }
    v
}

/// An ICMP error (frag needed / packet too big) from `src` to `dst`.
fn error(src: IpAddr, dst: IpAddr, quoted: &[u8]) -> Vec<u8> {
    let e = PacketBuilder::ethernet2(NMAC, CMAC);
    let mut v = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => e
            .ipv4(s.octets(), d.octets(), 64)
            .icmpv4(Icmpv4Type::DestinationUnreachable(
                DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
            ))
            .write(&mut v, quoted),
        (IpAddr::V6(s), IpAddr::V6(d)) => e
            .ipv6(s.octets(), d.octets(), 64)
            .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1400 })
            .write(&mut v, quoted),
        _ => panic!("one family"),
    }
    .expect("error packet");
    v
}

/// A NAT flow client:cport -> vip:80 that xdp_ingress sent to backend:8080,
/// the VIP written by the writer.
fn nat_flow(fx: &Fx, proto: u8, client: IpAddr, vip: IpAddr, backend: IpAddr) {
    let b = fixture::backend(backend, 8080, [2, 0, 0, 0, 0, 9]);
    fx.apply(&fixture::vip(vip, 80, proto, Mode::Nat, vec![b]));
    let t = &fx.t;
    let req = quote(proto, client, 40000, vip, 80);
    let mut frame = Vec::new();
    frame.extend_from_slice(&NMAC);
    frame.extend_from_slice(&CMAC);
    frame.extend_from_slice(if client.is_ipv4() {
        &[0x08, 0x00]
    } else {
        &[0x86, 0xdd]
    });
    frame.extend_from_slice(&req);
    let (v, out) = t.run_xdp(&frame);
    assert_eq!(v, XDP_PASS, "the flow's own packet is NATed");
    assert_eq!(
        &out[14..],
        &quote(proto, client, 40000, backend, 8080)[..],
        "NATed to the backend"
    );
}

#[test]
fn icmp_errors_towards_nat_clients_are_translated() {
    let cases = [
        (
            "v4 udp",
            PROTO_UDP,
            "10.9.0.1",
            "10.0.0.100",
            "10.1.0.1",
            "10.9.0.254",
        ),
        (
            "v4 tcp",
            PROTO_TCP,
            "10.9.0.1",
            "10.0.0.100",
            "10.1.0.1",
            "10.9.0.254",
        ),
        (
            "v6 udp",
            PROTO_UDP,
            "fd00:9::1",
            "fd00:100::1",
            "fd00:1::1",
            "fd00:9::fe",
        ),
        (
            "v6 tcp",
            PROTO_TCP,
            "fd00:9::1",
            "fd00:100::1",
            "fd00:1::1",
            "fd00:9::fe",
        ),
    ];
    for (name, proto, client, vip, backend, router) in cases {
        let (client, vip, backend, router) = (ip(client), ip(vip), ip(backend), ip(router));
        let fx = Fx::new();
        nat_flow(&fx, proto, client, vip, backend);
        let t = &fx.t;
        let as_sent = quote(proto, client, 40000, backend, 8080);
        let as_client_knows = quote(proto, client, 40000, vip, 80);

        // From a router on the way (this node, say): the quote is fixed,
        // the source is left alone.
        let (v, out) = t.run_tc(&error(router, client, &as_sent));
        assert_eq!(v, TCX_PASS, "{name}: router's error translated");
        assert_eq!(
            out,
            error(router, client, &as_client_knows),
            "{name}: router's error"
        );

        // From the backend itself: it must come from the VIP.
        let (v, out) = t.run_tc(&error(backend, client, &as_sent));
        assert_eq!(v, TCX_PASS, "{name}: backend's error translated");
        assert_eq!(
            out,
            error(vip, client, &as_client_knows),
            "{name}: backend's error"
        );

        // Not a NAT flow (another client port): untouched.
        let other = quote(proto, client, 40001, backend, 8080);
        let pkt = error(router, client, &other);
        assert_eq!(
            t.run_tc(&pkt),
            (TCX_NEXT, pkt.clone()),
            "{name}: unknown flow untouched"
        );

        // A quote that is not the client's own packet: untouched.
        let pkt = error(router, router, &as_sent);
        assert_eq!(
            t.run_tc(&pkt),
            (TCX_NEXT, pkt.clone()),
            "{name}: error not to the client"
        );
    }
}
