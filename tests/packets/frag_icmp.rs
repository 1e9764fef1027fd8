//! Packet fixtures for the special shapes (issue 2, "Special shapes"):
//! fragments in both directions and ICMP errors about VIP flows, in each
//! forwarding mode, for IPv4 and IPv6.
//!
//! Every expected packet is built independently with etherparse, whose
//! checksums are computed from scratch, and compared byte for byte with
//! what the program left. Each test runs in a fresh network namespace:
//! there the FIB lookup that L3 DSR makes cannot answer (forwarding is off
//! on its loopback, the test run's ingress interface), so an encapsulated
//! packet is handed to the kernel (XDP_PASS) whatever the host's routes.
//!
//! The maps are filled through the real writer from `Vip` values
//! (tests/common/fixture.rs). Where a new flow goes is the oracle's answer
//! (the slice read back from the maps and `flow_hash`); "the table changed
//! under a flow" is a weight change written through the writer, which
//! keeps the old backend's id and health so its established flows go on.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::fixture::{self, Fx};
use common::netns::Netns;
use common::*;
use etherparse::icmpv4::{DestUnreachableHeader, TimeExceededCode};
use etherparse::icmpv6::DestUnreachableCode;
use etherparse::{
    EtherType, Ethernet2Header, IcmpEchoHeader, Icmpv4Header, Icmpv4Type, Icmpv6Header, Icmpv6Type,
    IpFragOffset, IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6FragmentHeader, Ipv6Header, TcpHeader,
    UdpHeader,
};
use rivora::abi::*;
use rivora::model::{Mode, Vip};

/// The router in front of the node: source MAC of every frame sent in.
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
/// The node's own interface (the writer's interface MAC for the test
/// run's ifindex).
const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const B1_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xb1, 0x01];
const B2_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xb2, 0x02];
const TUN4: Ipv4Addr = Ipv4Addr::new(10, 255, 0, 1);
const TUN6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xff, 0, 0, 0, 0, 0, 1);

const PROTO_ICMP: u8 = 1;
const PROTO_ICMPV6: u8 = 58;

const NAT: Mode = Mode::Nat;
const DSR: Mode = Mode::Dsr;
const L3DSR: Mode = Mode::L3Dsr;

// ---------------------------------------------------------------------
// Addresses

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fam {
    V4,
    V6,
}

impl Fam {
    /// Host `n` of a /24 (v4) or /64-ish (v6) test prefix.
    fn addr(self, net: u8, host: u8) -> IpAddr {
        match self {
            Fam::V4 => IpAddr::V4(Ipv4Addr::new(10, net, 0, host)),
            Fam::V6 => IpAddr::V6(Ipv6Addr::new(
                0xfd00,
                u16::from(net),
                0,
                0,
                0,
                0,
                0,
                u16::from(host),
            )),
        }
    }

    fn client(self) -> IpAddr {
        self.addr(9, 1)
    }

    fn router(self) -> IpAddr {
        self.addr(8, 254)
    }

    /// The VIP of the service in forwarding mode `mode`.
    fn vip(self, mode: Mode) -> IpAddr {
        self.addr(0, 100 + mode_no(mode))
    }

    /// An address on the VIP's network that is not a VIP.
    fn other(self) -> IpAddr {
        self.addr(0, 200)
    }

    fn b1(self) -> IpAddr {
        self.addr(1, 1)
    }

    fn b2(self) -> IpAddr {
        self.addr(1, 2)
    }
}

/// A small number per mode, to tell the modes' addresses and ports apart.
fn mode_no(mode: Mode) -> u8 {
    match mode {
        Mode::Nat => 1,
        Mode::Dsr => 2,
        Mode::L3Dsr => 3,
        Mode::FullNat => 4,
    }
}

fn o4(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => panic!("{a} is not IPv4"),
    }
}

fn o6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(_) => panic!("{a} is not IPv6"),
    }
}

// ---------------------------------------------------------------------
// Packet builders (etherparse; every checksum computed from scratch)

/// A fragment's place in its datagram: id, byte offset, more to come.
#[derive(Clone, Copy)]
struct Frag {
    id: u32,
    offset: usize,
    more: bool,
}

/// An IP packet (no L2) carrying `payload` as protocol `proto`; IPv4
/// `options` and a fragment header if asked.
fn ip_packet_opts(
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    frag: Option<Frag>,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    match src {
        IpAddr::V4(s) => {
            let mut h = Ipv4Header {
                identification: 0x4242,
                time_to_live: 64,
                protocol: IpNumber(proto),
                source: s.octets(),
                destination: o4(dst),
                ..Default::default()
            };
            h.options = options.try_into().unwrap();
            h.set_payload_len(payload.len()).unwrap();
            if let Some(f) = frag {
                h.identification = f.id as u16;
                h.dont_fragment = false;
                h.more_fragments = f.more;
                h.fragment_offset = IpFragOffset::try_new((f.offset / 8) as u16).unwrap();
            }
            h.header_checksum = h.calc_header_checksum();
            h.write(&mut out).unwrap();
        }
        IpAddr::V6(s) => {
            assert!(options.is_empty());
            let mut h = Ipv6Header {
                next_header: IpNumber(proto),
                hop_limit: 64,
                source: s.octets(),
                destination: o6(dst),
                ..Default::default()
            };
            let ext = frag.map(|_| Ipv6FragmentHeader::LEN).unwrap_or(0);
            h.set_payload_length(ext + payload.len()).unwrap();
            if frag.is_some() {
                h.next_header = IpNumber::IPV6_FRAGMENTATION_HEADER;
            }
            h.write(&mut out).unwrap();
            if let Some(f) = frag {
                Ipv6FragmentHeader::new(
                    IpNumber(proto),
                    IpFragOffset::try_new((f.offset / 8) as u16).unwrap(),
                    f.more,
                    f.id,
                )
                .write(&mut out)
                .unwrap();
            }
        }
    }
    out.extend_from_slice(payload);
    out
}

fn ip_packet(src: IpAddr, dst: IpAddr, proto: u8, frag: Option<Frag>, payload: &[u8]) -> Vec<u8> {
    ip_packet_opts(src, dst, proto, frag, &[], payload)
}

/// An Ethernet frame from the router to the node around an IP packet.
fn frame(ip: &[u8]) -> Vec<u8> {
    let ether_type = match ip[0] >> 4 {
        4 => EtherType::IPV4,
        6 => EtherType::IPV6,
        v => panic!("IP version {v}"),
    };
    let mut out = Ethernet2Header {
        source: PEER_MAC,
        destination: NODE_MAC,
        ether_type,
    }
    .to_bytes()
    .to_vec();
    out.extend_from_slice(ip);
    out
}

/// A whole UDP datagram (header and payload), checksummed over the
/// family's pseudo-header.
fn udp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = UdpHeader::without_ipv4_checksum(sport, dport, payload.len()).unwrap();
    h.checksum = match src {
        IpAddr::V4(s) => h.calc_checksum_ipv4_raw(s.octets(), o4(dst), payload),
        IpAddr::V6(s) => h.calc_checksum_ipv6_raw(s.octets(), o6(dst), payload),
    }
    .unwrap();
    let mut out = h.to_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// UDP over IPv4 without a checksum (RFC 768 allows 0).
fn udp_no_csum(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let h = UdpHeader::without_ipv4_checksum(sport, dport, payload.len()).unwrap();
    let mut out = h.to_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// A TCP segment; `reply` makes it the SYN-ACK a server sends.
fn tcp(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, reply: bool, payload: &[u8]) -> Vec<u8> {
    let mut h = TcpHeader::new(sport, dport, 0x0102_0304, 64240);
    h.syn = true;
    if reply {
        h.ack = true;
        h.acknowledgment_number = 0x0a0b_0c0d;
    }
    h.checksum = match src {
        IpAddr::V4(s) => h.calc_checksum_ipv4_raw(s.octets(), o4(dst), payload),
        IpAddr::V6(s) => h.calc_checksum_ipv6_raw(s.octets(), o6(dst), payload),
    }
    .unwrap();
    let mut out = h.to_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// A client's first packet of a flow: a UDP datagram or a TCP SYN.
fn request(proto: u8, src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    let l4 = match proto {
        PROTO_UDP => udp(src, sport, dst, dport, b"request"),
        _ => tcp(src, sport, dst, dport, false, b""),
    };
    frame(&ip_packet(src, dst, proto, None, &l4))
}

/// Cut `datagram` into pieces of the given sizes (multiples of 8 but the
/// last): (offset, more, bytes) per fragment.
fn split<'a>(datagram: &'a [u8], sizes: &[usize]) -> Vec<(usize, bool, &'a [u8])> {
    assert_eq!(sizes.iter().sum::<usize>(), datagram.len());
    let mut off = 0;
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            assert!(i + 1 == sizes.len() || n % 8 == 0);
            let piece = (off, i + 1 < sizes.len(), &datagram[off..off + n]);
            off += n;
            piece
        })
        .collect()
}

/// The fragment frames of a datagram.
fn fragment_frames(
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    id: u32,
    datagram: &[u8],
    sizes: &[usize],
) -> Vec<Vec<u8>> {
    split(datagram, sizes)
        .into_iter()
        .map(|(offset, more, bytes)| {
            frame(&ip_packet(
                src,
                dst,
                proto,
                Some(Frag { id, offset, more }),
                bytes,
            ))
        })
        .collect()
}

/// What DSR makes of a frame: the backend's MAC as destination, the
/// node's as source, nothing else touched.
fn dsr(frame: &[u8], backend_mac: [u8; 6]) -> Vec<u8> {
    let (mut eth, rest) = Ethernet2Header::from_slice(frame).unwrap();
    eth.destination = backend_mac;
    eth.source = NODE_MAC;
    let mut out = eth.to_bytes().to_vec();
    out.extend_from_slice(rest);
    out
}

/// What L3 DSR makes of a frame when the FIB lookup cannot answer: the
/// outer header (IPIP, RFC 2003, or IPv6-in-IPv6, RFC 2473) from the
/// tunnel source to the backend between the unchanged Ethernet header and
/// the packet. The outer IPv4 id is 0 when the inner packet carries DF (an
/// atomic datagram, RFC 6864), else random per packet: then the id is taken
/// from `actual` (and asserted to vary elsewhere) and the header checksum
/// recomputed here. The outer IPv6 flow label is `label` (`flow_label`).
fn encap(frame: &[u8], backend: IpAddr, label: u32, actual: &[u8]) -> Vec<u8> {
    let (eth, inner) = Ethernet2Header::from_slice(frame).unwrap();
    let mut out = eth.to_bytes().to_vec();
    match backend {
        IpAddr::V4(b) => {
            let (ih, _) = Ipv4Header::from_slice(inner).unwrap();
            let mut h = Ipv4Header {
                dscp: ih.dscp,
                ecn: ih.ecn,
                identification: if ih.dont_fragment {
                    0
                } else {
                    Ipv4Header::from_slice(&actual[out.len()..])
                        .map(|(h, _)| h.identification)
                        .unwrap_or(0)
                },
                dont_fragment: ih.dont_fragment,
                time_to_live: 64,
                protocol: IpNumber::IPV4,
                source: TUN4.octets(),
                destination: b.octets(),
                ..Default::default()
            };
            h.set_payload_len(inner.len()).unwrap();
            h.header_checksum = h.calc_header_checksum();
            h.write(&mut out).unwrap();
        }
        IpAddr::V6(b) => {
            let mut h = Ipv6Header {
                flow_label: Ipv6FlowLabel::try_new(label).unwrap(),
                next_header: IpNumber::IPV6,
                hop_limit: 64,
                source: TUN6.octets(),
                destination: b.octets(),
                ..Default::default()
            };
            h.set_payload_length(inner.len()).unwrap();
            h.write(&mut out).unwrap();
        }
    }
    out.extend_from_slice(inner);
    out
}

// ---------------------------------------------------------------------
// Map set-up and state

/// One backend of a `Svc` as the packets must show it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct To {
    addr: IpAddr,
    port: u16,
    mac: [u8; 6],
    id: u32,
}

/// A VIP with two backends, b1 (`fam.b1()`) and b2 (`fam.b2()`), written
/// through the writer with weights (1, 0): new flows reach b1 until the
/// weights change.
struct Svc {
    vip: IpAddr,
    port: u16,
    proto: u8,
    spec: Vip,
    b1: To,
    b2: To,
    id: u32,
}

impl Svc {
    /// Write (or write again, unchanged) the VIP of `mode` on
    /// `port`/`proto` with backends on ports `bports` (NAT's; the other
    /// modes cannot rewrite ports, so there the backends listen on the
    /// VIP's).
    fn write(fx: &Fx, fam: Fam, mode: Mode, port: u16, proto: u8, bports: (u16, u16)) -> Self {
        let vip = fam.vip(mode);
        let bports = if mode == Mode::Nat {
            bports
        } else {
            (port, port)
        };
        let spec = fixture::vip(
            vip,
            port,
            proto,
            mode,
            vec![
                fixture::backend(fam.b1(), bports.0, B1_MAC),
                fixture::weighted(fixture::backend(fam.b2(), bports.1, B2_MAC), 0),
            ],
        );
        let placed = fx.apply(&spec);
        let to = |i: usize, addr, port, mac| {
            let id = placed.ids[i];
            assert_eq!(
                fx.backend_entry(id),
                Some((addr, port)),
                "{vip}: backend id {id} in the backend maps"
            );
            To {
                addr,
                port,
                mac,
                id,
            }
        };
        Svc {
            vip,
            port,
            proto,
            b1: to(0, fam.b1(), bports.0, B1_MAC),
            b2: to(1, fam.b2(), bports.1, B2_MAC),
            spec,
            id: placed.svc,
        }
    }

    /// New flows by weight: (b1's, b2's).
    fn weights(&mut self, fx: &Fx, w1: u32, w2: u32) {
        fx.reweight(&mut self.spec, &[w1, w2]);
    }

    /// Where a new flow from `client:cport` must go, by the oracle (the
    /// slice read back from the maps and the flow hash).
    fn new_flow(&self, fx: &Fx, client: IpAddr, cport: u16) -> To {
        match fx.pick_flow(self.id, client, cport, self.port, self.proto) {
            Some(id) if id == self.b1.id => self.b1,
            Some(id) if id == self.b2.id => self.b2,
            other => panic!("{}: the oracle picks {other:?}", self.vip),
        }
    }

    fn stats(&self, t: &TestDp) -> rv_vip_stats {
        t.vip_stats(self.id)
    }
}

fn affinity(
    t: &TestDp,
    svc: u32,
    client: IpAddr,
    cport: u16,
    vport: u16,
    proto: u8,
) -> Option<rv_affinity_value> {
    match client {
        IpAddr::V4(c) => t
            .maps
            .connection_affinity_map
            .get(&rv_flow_key {
                svc_id: svc,
                saddr: be32(c),
                sport: be16(cport),
                dport: be16(vport),
                proto,
                ..Default::default()
            })
            .unwrap(),
        IpAddr::V6(c) => t
            .maps
            .connection_affinity_map6
            .get(&rv_flow6_key {
                svc_id: svc,
                saddr: be32x4(c),
                sport: be16(cport),
                dport: be16(vport),
                proto,
                ..Default::default()
            })
            .unwrap(),
    }
}

fn forget_affinity(t: &TestDp, svc: u32, client: IpAddr, cport: u16, vport: u16, proto: u8) {
    match client {
        IpAddr::V4(c) => t
            .maps
            .connection_affinity_map
            .remove(&rv_flow_key {
                svc_id: svc,
                saddr: be32(c),
                sport: be16(cport),
                dport: be16(vport),
                proto,
                ..Default::default()
            })
            .unwrap(),
        IpAddr::V6(c) => t
            .maps
            .connection_affinity_map6
            .remove(&rv_flow6_key {
                svc_id: svc,
                saddr: be32x4(c),
                sport: be16(cport),
                dport: be16(vport),
                proto,
                ..Default::default()
            })
            .unwrap(),
    }
}

/// frag_map / frag_map6 entry: (svc, backend).
fn frag_entry(t: &TestDp, src: IpAddr, dst: IpAddr, id: u32, proto: u8) -> Option<(u32, u32)> {
    let v: Option<rv_frag_value> = match src {
        IpAddr::V4(s) => t
            .maps
            .frag_map
            .get(&rv_frag_key {
                saddr: be32(s),
                daddr: be32(match dst {
                    IpAddr::V4(d) => d,
                    IpAddr::V6(_) => unreachable!(),
                }),
                id: be16(id as u16),
                proto,
                ..Default::default()
            })
            .unwrap(),
        IpAddr::V6(s) => t
            .maps
            .frag_map6
            .get(&rv_frag6_key {
                saddr: be32x4(s),
                daddr: be32x4(match dst {
                    IpAddr::V6(d) => d,
                    IpAddr::V4(_) => unreachable!(),
                }),
                id: id.to_be(),
                proto,
                ..Default::default()
            })
            .unwrap(),
    };
    v.map(|v| (v.svc_id, v.backend_id))
}

/// frag_rev_map / frag_rev_map6 entry: (VIP, svc).
fn frag_rev_entry(
    t: &TestDp,
    src: IpAddr,
    dst: IpAddr,
    id: u32,
    proto: u8,
) -> Option<(IpAddr, u32)> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let v: Option<rv_frag_rev_value> = t
                .maps
                .frag_rev_map
                .get(&rv_frag_key {
                    saddr: be32(s),
                    daddr: be32(d),
                    id: be16(id as u16),
                    proto,
                    ..Default::default()
                })
                .unwrap();
            v.map(|v| (IpAddr::V4(ipv4_from_be32(v.vip_addr)), v.svc_id))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let v: Option<rv_frag_rev6_value> = t
                .maps
                .frag_rev_map6
                .get(&rv_frag6_key {
                    saddr: be32x4(s),
                    daddr: be32x4(d),
                    id: id.to_be(),
                    proto,
                    ..Default::default()
                })
                .unwrap();
            v.map(|v| (IpAddr::V6(ipv6_from_be32x4(v.vip_addr)), v.svc_id))
        }
        _ => unreachable!(),
    }
}

/// What tc_nat finds for a reply from (backend, bport) to (client, cport):
/// (VIP, VIP port, svc). The backend's owner when the owner's affinity
/// entry for the client's flow names the owner's backend (as lib/nat.h
/// checks), else the nat_reverse_map / nat_reverse_map6 entry.
fn nat_entry(
    t: &TestDp,
    backend: IpAddr,
    bport: u16,
    client: IpAddr,
    cport: u16,
    proto: u8,
) -> Option<(IpAddr, u16, u32)> {
    if let Some(o) = common::fixtures::nat_owner(t, backend, bport, proto) {
        let vport = port_from_be16(o.vip_port);
        let a: Option<rv_affinity_value> = match client {
            IpAddr::V4(c) => t
                .maps
                .connection_affinity_map
                .get(&rv_flow_key {
                    svc_id: o.svc_id,
                    saddr: be32(c),
                    sport: be16(cport),
                    dport: o.vip_port,
                    proto,
                    ..Default::default()
                })
                .unwrap(),
            IpAddr::V6(c) => t
                .maps
                .connection_affinity_map6
                .get(&rv_flow6_key {
                    svc_id: o.svc_id,
                    saddr: be32x4(c),
                    sport: be16(cport),
                    dport: o.vip_port,
                    proto,
                    ..Default::default()
                })
                .unwrap(),
        };
        if a.is_some_and(|a| a.backend_id == o.backend_id) {
            let vip = match backend {
                IpAddr::V4(_) => IpAddr::V4(ipv4_from_be32(o.vip_addr[0])),
                IpAddr::V6(_) => IpAddr::V6(ipv6_from_be32x4(o.vip_addr)),
            };
            return Some((vip, vport, o.svc_id));
        }
    }
    match (backend, client) {
        (IpAddr::V4(b), IpAddr::V4(c)) => {
            let v: Option<rv_nat_value> = t
                .maps
                .nat_reverse_map
                .get(&rv_nat_key {
                    backend_addr: be32(b),
                    client_addr: be32(c),
                    backend_port: be16(bport),
                    client_port: be16(cport),
                    proto,
                    ..Default::default()
                })
                .unwrap();
            v.map(|v| {
                (
                    IpAddr::V4(ipv4_from_be32(v.vip_addr)),
                    port_from_be16(v.vip_port),
                    v.svc_id,
                )
            })
        }
        (IpAddr::V6(b), IpAddr::V6(c)) => {
            let v: Option<rv_nat6_value> = t
                .maps
                .nat_reverse_map6
                .get(&rv_nat6_key {
                    backend_addr: be32x4(b),
                    client_addr: be32x4(c),
                    backend_port: be16(bport),
                    client_port: be16(cport),
                    proto,
                    ..Default::default()
                })
                .unwrap();
            v.map(|v| {
                (
                    IpAddr::V6(ipv6_from_be32x4(v.vip_addr)),
                    port_from_be16(v.vip_port),
                    v.svc_id,
                )
            })
        }
        _ => unreachable!(),
    }
}

fn all_drops(t: &TestDp) -> Vec<u64> {
    DROP_REASONS.iter().map(|r| t.drops(*r)).collect()
}

fn frag_no_first(t: &TestDp) -> u64 {
    t.drops(rv_drop_reason::RV_DROP_FRAG_NO_FIRST)
}

/// Run `f` on a thread inside a fresh network namespace (see the module
/// comment), with the datapath loaded there and the node settings (the
/// interface MAC, the tunnel sources) written.
fn in_fresh_netns(f: impl FnOnce(&Fx) + Send + 'static) {
    let ns = Netns::new(&unique("rvfi"));
    ns.run(move || {
        let fx = Fx::new();
        fx.iface_mac(TEST_RUN_IFINDEX, NODE_MAC);
        fx.tunnel(Some(TUN4), Some(TUN6));
        f(&fx);
    });
}

// ---------------------------------------------------------------------
// Fragments

/// The UDP/53 VIP of `mode` the fragment tests send to.
fn frag_svc(fx: &Fx, fam: Fam, mode: Mode) -> Svc {
    Svc::write(fx, fam, mode, 53, PROTO_UDP, (5353, 6363))
}

/// A datagram of 56 bytes (8 UDP + 48 payload) in three fragments.
const FRAG_SIZES: [usize; 3] = [24, 16, 16];

fn payload(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
        .collect()
}

/// NAT: the first fragment picks the backend and is translated whole
/// (address, port, UDP checksum over the datagram); later fragments get
/// the address only; the reply comes back through tc_nat likewise.
fn fragments_nat(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let s = frag_svc(fx, fam, NAT);
    let client = fam.client();
    let b = s.new_flow(fx, client, 40000);
    assert_eq!(b, s.b1, "{fam:?} set-up: new flows reach b1");
    let body = payload(1, 48);
    let dgram = udp(client, 40000, s.vip, 53, &body);
    let dgram_nat = udp(client, 40000, b.addr, b.port, &body);
    let input = fragment_frames(client, s.vip, PROTO_UDP, 0x1234, &dgram, &FRAG_SIZES);
    let want = fragment_frames(client, b.addr, PROTO_UDP, 0x1234, &dgram_nat, &FRAG_SIZES);
    let mut bytes = 0;

    // In order: first, middle, last.
    for (i, (pkt, want)) in input.iter().zip(&want).enumerate() {
        let (v, out) = t.run_xdp(pkt);
        assert_eq!(v, XDP_PASS, "{fam:?} NAT fragment {i}");
        assert_eq!(&out, want, "{fam:?} NAT fragment {i}");
        bytes += pkt.len() as u64;
        assert_eq!(
            frag_entry(t, client, s.vip, 0x1234, PROTO_UDP),
            Some((s.id, b.id)),
            "{fam:?} frag_map after fragment {i}"
        );
    }
    // A later fragment's payload is the original bytes, untouched.
    for (i, (want, piece)) in want
        .iter()
        .zip(split(&dgram, &FRAG_SIZES))
        .enumerate()
        .skip(1)
    {
        assert!(want.ends_with(piece.2), "{fam:?} fragment {i} payload");
    }
    assert_eq!(
        nat_entry(t, b.addr, b.port, client, 40000, PROTO_UDP),
        Some((s.vip, 53, s.id)),
        "{fam:?} nat_reverse_map"
    );

    // Out of order: the last fragment of another datagram first.
    let input = fragment_frames(client, s.vip, PROTO_UDP, 0x2345, &dgram, &FRAG_SIZES);
    let want = fragment_frames(client, b.addr, PROTO_UDP, 0x2345, &dgram_nat, &FRAG_SIZES);
    let before = frag_no_first(t);
    let (v, out) = t.run_xdp(&input[2]);
    assert_eq!(v, XDP_PASS, "{fam:?} out-of-order fragment");
    assert_eq!(out, input[2], "{fam:?} out-of-order fragment untouched");
    assert_eq!(
        frag_no_first(t),
        before + 1,
        "{fam:?} frag_no_first counted"
    );
    assert_eq!(frag_entry(t, client, s.vip, 0x2345, PROTO_UDP), None);
    // Then its first and the rest follow it.
    for i in [0, 1, 2] {
        let (v, out) = t.run_xdp(&input[i]);
        assert_eq!(v, XDP_PASS, "{fam:?} after out-of-order, fragment {i}");
        assert_eq!(out, want[i], "{fam:?} after out-of-order, fragment {i}");
        bytes += input[i].len() as u64;
    }
    assert_eq!(frag_no_first(t), before + 1);
    let st = s.stats(t);
    assert_eq!((st.packets, st.bytes), (6, bytes), "{fam:?} NAT stats");

    // The reply, through tc_nat: the backend's datagram in fragments.
    let body = payload(9, 48);
    let reply = udp(b.addr, b.port, client, 40000, &body);
    let reply_vip = udp(s.vip, 53, client, 40000, &body);
    let input = fragment_frames(b.addr, client, PROTO_UDP, 0x3456, &reply, &FRAG_SIZES);
    let want = fragment_frames(s.vip, client, PROTO_UDP, 0x3456, &reply_vip, &FRAG_SIZES);
    // A later reply fragment before its first is left alone.
    let (v, out) = t.run_tc(&input[1]);
    assert_eq!(v, TCX_NEXT, "{fam:?} reply fragment before its first");
    assert_eq!(out, input[1], "{fam:?} reply fragment before its first");
    assert_eq!(frag_rev_entry(t, b.addr, client, 0x3456, PROTO_UDP), None);
    for i in [0, 1, 2] {
        let (v, out) = t.run_tc(&input[i]);
        assert_eq!(v, TCX_PASS, "{fam:?} reply fragment {i}");
        assert_eq!(out, want[i], "{fam:?} reply fragment {i}");
        assert_eq!(
            frag_rev_entry(t, b.addr, client, 0x3456, PROTO_UDP),
            Some((s.vip, s.id)),
            "{fam:?} frag_rev_map after reply fragment {i}"
        );
    }
}

/// DSR: every fragment leaves with the backend's MAC, bytes otherwise
/// untouched.
fn fragments_dsr(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let s = frag_svc(fx, fam, DSR);
    let client = fam.client();
    let b = s.new_flow(fx, client, 40001);
    assert_eq!(b, s.b1, "{fam:?} set-up: new flows reach b1");
    let dgram = udp(client, 40001, s.vip, 53, &payload(3, 48));
    let input = fragment_frames(client, s.vip, PROTO_UDP, 0x4567, &dgram, &FRAG_SIZES);

    let before = frag_no_first(t);
    let (v, out) = t.run_xdp(&input[1]);
    assert_eq!(v, XDP_PASS, "{fam:?} DSR fragment before its first");
    assert_eq!(out, input[1]);
    assert_eq!(frag_no_first(t), before + 1);

    for (i, pkt) in input.iter().enumerate() {
        let (v, out) = t.run_xdp(pkt);
        assert_eq!(v, XDP_TX, "{fam:?} DSR fragment {i}");
        assert_eq!(out, dsr(pkt, b.mac), "{fam:?} DSR fragment {i}");
    }
    assert_eq!(
        frag_entry(t, client, s.vip, 0x4567, PROTO_UDP),
        Some((s.id, b.id))
    );
    let bytes: usize = input.iter().map(Vec::len).sum();
    let st = s.stats(t);
    assert_eq!(
        (st.packets, st.bytes),
        (3, bytes as u64),
        "{fam:?} DSR stats"
    );
}

/// L3 DSR: every fragment is encapsulated to the first fragment's
/// backend. The first carries ports and its outer flow label is the
/// 5-tuple's; a later fragment has only addresses, and its label is the
/// client address's.
fn fragments_l3dsr(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let s = frag_svc(fx, fam, L3DSR);
    let client = fam.client();
    let b = s.new_flow(fx, client, 40002);
    assert_eq!(b, s.b1, "{fam:?} set-up: new flows reach b1");
    let dgram = udp(client, 40002, s.vip, 53, &payload(5, 48));
    let input = fragment_frames(client, s.vip, PROTO_UDP, 0x5678, &dgram, &FRAG_SIZES);

    let before = frag_no_first(t);
    let (v, out) = t.run_xdp(&input[2]);
    assert_eq!(v, XDP_PASS, "{fam:?} L3 DSR fragment before its first");
    assert_eq!(out, input[2]);
    assert_eq!(frag_no_first(t), before + 1);

    let first_label = flow_label(client, 40002, 53, PROTO_UDP);
    let later_label = flow_label(client, 0, 0, 0);
    for (i, pkt) in input.iter().enumerate() {
        let (v, out) = t.run_xdp(pkt);
        assert_eq!(v, XDP_PASS, "{fam:?} L3 DSR fragment {i}");
        let label = if i == 0 { first_label } else { later_label };
        assert_eq!(
            out,
            encap(pkt, b.addr, label, &out),
            "{fam:?} L3 DSR fragment {i}"
        );
    }
    assert_eq!(
        frag_entry(t, client, s.vip, 0x5678, PROTO_UDP),
        Some((s.id, b.id))
    );
}

/// A later fragment of a datagram whose first fragment went to a backend
/// follows that backend even when the table has changed since: b1's
/// weight goes to 0, which takes it out of the slice but not out of
/// service.
fn fragments_follow_first_after_table_change(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let mut s = frag_svc(fx, fam, NAT);
    let client = fam.client();
    let b = s.new_flow(fx, client, 40003);
    assert_eq!(b, s.b1, "{fam:?} set-up: new flows reach b1");
    let dgram = udp(client, 40003, s.vip, 53, &payload(7, 48));
    let dgram_nat = udp(client, 40003, b.addr, b.port, &payload(7, 48));
    let input = fragment_frames(client, s.vip, PROTO_UDP, 0x6789, &dgram, &FRAG_SIZES);
    let want = fragment_frames(client, b.addr, PROTO_UDP, 0x6789, &dgram_nat, &FRAG_SIZES);
    let (v, out) = t.run_xdp(&input[0]);
    assert_eq!((v, &out), (XDP_PASS, &want[0]));
    s.weights(fx, 0, 1);
    assert_eq!(
        s.new_flow(fx, client, 40003),
        s.b2,
        "{fam:?} set-up: the same flow, new, would now reach b2"
    );
    for i in [1, 2] {
        let (v, out) = t.run_xdp(&input[i]);
        assert_eq!(v, XDP_PASS);
        assert_eq!(out, want[i], "{fam:?} fragment {i} after the table changed");
    }
    s.weights(fx, 1, 0);
}

#[test]
fn ipv4_fragments_first_later_out_of_order_both_directions() {
    in_fresh_netns(|fx| {
        fragments_nat(fx, Fam::V4);
        fragments_dsr(fx, Fam::V4);
        fragments_l3dsr(fx, Fam::V4);
        fragments_follow_first_after_table_change(fx, Fam::V4);
        fragments_not_ours(fx, Fam::V4);
    });
}

#[test]
fn ipv6_fragments_first_later_out_of_order_both_directions() {
    in_fresh_netns(|fx| {
        fragments_nat(fx, Fam::V6);
        fragments_dsr(fx, Fam::V6);
        fragments_l3dsr(fx, Fam::V6);
        fragments_follow_first_after_table_change(fx, Fam::V6);
        fragments_not_ours(fx, Fam::V6);
    });
}

// ---------------------------------------------------------------------
// ICMP errors

/// Which error, as each family spells it.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// v4 port unreachable (3/3), v6 port unreachable (1/4).
    PortUnreach,
    /// v4 fragmentation needed (3/4, MTU 1400), v6 packet too big (MTU 1280).
    TooBig,
    /// v4 host unreachable (3/1), v6 address unreachable (1/3).
    HostUnreach,
    /// Not steered: v4 time exceeded (11/0), v6 time exceeded (3/0).
    TimeExceeded,
    /// Not an error at all: echo request.
    Echo,
}

/// The ICMP message (header and quote) as an IP packet from `src` to `dst`.
fn icmp_ip(kind: Kind, src: IpAddr, dst: IpAddr, quote: &[u8]) -> Vec<u8> {
    let mut msg = Vec::new();
    match src {
        IpAddr::V4(_) => {
            let ty =
                match kind {
                    Kind::PortUnreach => {
                        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Port)
                    }
                    Kind::TooBig => Icmpv4Type::DestinationUnreachable(
                        DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
                    ),
                    Kind::HostUnreach => {
                        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Host)
                    }
                    Kind::TimeExceeded => {
                        Icmpv4Type::TimeExceeded(TimeExceededCode::TtlExceededInTransit)
                    }
                    Kind::Echo => Icmpv4Type::EchoRequest(IcmpEchoHeader { id: 7, seq: 1 }),
                };
            Icmpv4Header::with_checksum(ty, quote)
                .write(&mut msg)
                .unwrap();
        }
        IpAddr::V6(s) => {
            let ty = match kind {
                Kind::PortUnreach => Icmpv6Type::DestinationUnreachable(DestUnreachableCode::Port),
                Kind::TooBig => Icmpv6Type::PacketTooBig { mtu: 1280 },
                Kind::HostUnreach => {
                    Icmpv6Type::DestinationUnreachable(DestUnreachableCode::Address)
                }
                Kind::TimeExceeded => {
                    Icmpv6Type::TimeExceeded(etherparse::icmpv6::TimeExceededCode::HopLimitExceeded)
                }
                Kind::Echo => Icmpv6Type::EchoRequest(IcmpEchoHeader { id: 7, seq: 1 }),
            };
            Icmpv6Header::with_checksum(ty, s.octets(), o6(dst), quote)
                .unwrap()
                .write(&mut msg)
                .unwrap();
        }
    }
    msg.extend_from_slice(quote);
    let proto = if src.is_ipv4() {
        PROTO_ICMP
    } else {
        PROTO_ICMPV6
    };
    ip_packet(src, dst, proto, None, &msg)
}

/// How much of the offending packet the error quotes.
#[derive(Clone, Copy, Debug)]
enum Quote {
    /// All of it.
    Whole,
    /// The IP header and this many bytes of L4 (8: RFC 792's minimum).
    L4(usize),
}

struct IcmpCase {
    name: &'static str,
    proto: u8,
    kind: Kind,
    quote: Quote,
    /// IPv4 only: the quoted UDP datagram carries no checksum (0).
    udp_no_csum: bool,
    /// IPv4 only: options in the quoted IP header.
    ip_options: &'static [u8],
}

const fn case(name: &'static str, proto: u8, kind: Kind, quote: Quote) -> IcmpCase {
    IcmpCase {
        name,
        proto,
        kind,
        quote,
        udp_no_csum: false,
        ip_options: &[],
    }
}

const ICMP4_CASES: &[IcmpCase] = &[
    case(
        "udp port unreachable, whole datagram",
        PROTO_UDP,
        Kind::PortUnreach,
        Quote::Whole,
    ),
    case(
        "udp fragmentation needed, 8-byte quote",
        PROTO_UDP,
        Kind::TooBig,
        Quote::L4(8),
    ),
    IcmpCase {
        udp_no_csum: true,
        ..case(
            "udp without checksum, frag needed",
            PROTO_UDP,
            Kind::TooBig,
            Quote::Whole,
        )
    },
    case(
        "tcp fragmentation needed, 8-byte quote",
        PROTO_TCP,
        Kind::TooBig,
        Quote::L4(8),
    ),
    case(
        "tcp host unreachable, whole segment",
        PROTO_TCP,
        Kind::HostUnreach,
        Quote::Whole,
    ),
    IcmpCase {
        ip_options: &[1, 1, 1, 1, 1, 1, 1, 0],
        ..case(
            "tcp frag needed, quote with IP options",
            PROTO_TCP,
            Kind::TooBig,
            Quote::Whole,
        )
    },
];

const ICMP6_CASES: &[IcmpCase] = &[
    case(
        "udp packet too big, whole datagram",
        PROTO_UDP,
        Kind::TooBig,
        Quote::Whole,
    ),
    case(
        "udp port unreachable, 8-byte quote",
        PROTO_UDP,
        Kind::PortUnreach,
        Quote::L4(8),
    ),
    case(
        "tcp packet too big, whole segment",
        PROTO_TCP,
        Kind::TooBig,
        Quote::Whole,
    ),
    case(
        "tcp address unreachable, 8-byte quote",
        PROTO_TCP,
        Kind::HostUnreach,
        Quote::L4(8),
    ),
];

/// The reply a VIP (or a backend) sent to the client, as an IP packet:
/// what an ICMP error about the flow quotes.
fn reply_ip(c: &IcmpCase, src: IpAddr, sport: u16, client: IpAddr, cport: u16) -> Vec<u8> {
    reply_ip_body(c, src, sport, client, cport, &payload(11, 24))
}

fn reply_ip_body(
    c: &IcmpCase,
    src: IpAddr,
    sport: u16,
    client: IpAddr,
    cport: u16,
    body: &[u8],
) -> Vec<u8> {
    let l4 = match (c.proto, c.udp_no_csum) {
        (PROTO_UDP, true) => udp_no_csum(sport, cport, body),
        (PROTO_UDP, false) => udp(src, sport, client, cport, body),
        _ => tcp(src, sport, client, cport, true, body),
    };
    ip_packet_opts(src, client, c.proto, None, c.ip_options, &l4)
}

fn cut(c: &IcmpCase, ip: &[u8]) -> Vec<u8> {
    match c.quote {
        Quote::Whole => ip.to_vec(),
        Quote::L4(n) => {
            let ip_hdr = if ip[0] >> 4 == 4 {
                usize::from(ip[0] & 0xf) * 4
            } else {
                40
            };
            ip[..ip_hdr + n].to_vec()
        }
    }
}

/// Check, from the bytes alone, every checksum of an ICMP error frame:
/// the outer IPv4 header, the ICMP checksum over the whole message (with
/// the pseudo-header for ICMPv6), the quoted IPv4 header, and the quoted
/// UDP or TCP checksum when the quote holds the whole datagram.
fn check_icmp_checksums(frame: &[u8], whole_quote: bool) {
    let (_, ip) = Ethernet2Header::from_slice(frame).unwrap();
    let quote = if ip[0] >> 4 == 4 {
        let (outer, rest) = Ipv4Header::from_slice(ip).unwrap();
        assert_eq!(
            outer.header_checksum,
            outer.calc_header_checksum(),
            "outer IPv4 checksum"
        );
        let (ih, quote) = Icmpv4Header::from_slice(rest).unwrap();
        let again = Icmpv4Header::with_checksum(ih.icmp_type.clone(), quote);
        assert_eq!(ih.checksum, again.checksum, "ICMP checksum");
        quote
    } else {
        let (outer, rest) = Ipv6Header::from_slice(ip).unwrap();
        let (ih, quote) = Icmpv6Header::from_slice(rest).unwrap();
        let again =
            Icmpv6Header::with_checksum(ih.icmp_type, outer.source, outer.destination, quote)
                .unwrap();
        assert_eq!(ih.checksum, again.checksum, "ICMPv6 checksum");
        quote
    };
    let (src, dst, proto, l4): (IpAddr, IpAddr, u8, &[u8]) = if quote[0] >> 4 == 4 {
        let (qh, l4) = Ipv4Header::from_slice(quote).unwrap();
        assert_eq!(
            qh.header_checksum,
            qh.calc_header_checksum(),
            "quoted IPv4 checksum"
        );
        (qh.source.into(), qh.destination.into(), qh.protocol.0, l4)
    } else {
        let (qh, l4) = Ipv6Header::from_slice(quote).unwrap();
        (
            qh.source.into(),
            qh.destination.into(),
            qh.next_header.0,
            l4,
        )
    };
    if !whole_quote {
        return;
    }
    if proto == PROTO_UDP {
        let (uh, data) = UdpHeader::from_slice(l4).unwrap();
        let want = match (src, dst) {
            (IpAddr::V4(_), _) if uh.checksum == 0 => 0,
            (IpAddr::V4(s), IpAddr::V4(d)) => uh
                .calc_checksum_ipv4_raw(s.octets(), d.octets(), data)
                .unwrap(),
            (IpAddr::V6(s), IpAddr::V6(d)) => uh
                .calc_checksum_ipv6_raw(s.octets(), d.octets(), data)
                .unwrap(),
            _ => unreachable!(),
        };
        assert_eq!(uh.checksum, want, "quoted UDP checksum");
    } else {
        let (th, data) = TcpHeader::from_slice(l4).unwrap();
        let want = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => th
                .calc_checksum_ipv4_raw(s.octets(), d.octets(), data)
                .unwrap(),
            (IpAddr::V6(s), IpAddr::V6(d)) => th
                .calc_checksum_ipv6_raw(s.octets(), d.octets(), data)
                .unwrap(),
            _ => unreachable!(),
        };
        assert_eq!(th.checksum, want, "quoted TCP checksum");
    }
}

/// The VIP of `mode` for `proto` the ICMP tests quote: TCP on 80 (b1 on
/// 8080), UDP on 53 (b1 on 5353); b2 on 9999.
fn icmp_svc(fx: &Fx, fam: Fam, mode: Mode, proto: u8) -> Svc {
    let (port, b1_port) = if proto == PROTO_TCP {
        (80, 8080)
    } else {
        (53, 5353)
    };
    Svc::write(fx, fam, mode, port, proto, (b1_port, 9999))
}

/// Steered errors: for each mode and case, the flow's own packet first,
/// then the table changed (b1's weight to 0, b2's to 1: a new pick lands
/// on b2, b1's established flows go on), then the error. The error must
/// reach the backend the flow reached (found in the affinity map),
/// translated as the mode requires, and change no state.
fn icmp_steered(fx: &Fx, fam: Fam, cases: &[IcmpCase]) {
    let t = &fx.t;
    let client = fam.client();
    for (ci, c) in cases.iter().enumerate() {
        for mode in [NAT, DSR, L3DSR] {
            let mut s = icmp_svc(fx, fam, mode, c.proto);
            let what = format!("{fam:?} {mode:?} {}", c.name);
            let cport = 41000 + 10 * ci as u16 + u16::from(mode_no(mode));
            let label = flow_label(client, cport, s.port, c.proto);
            let b = s.new_flow(fx, client, cport);
            assert_eq!(b, s.b1, "{what}: set-up: new flows reach b1");

            // The flow's own first packet reaches b1.
            let data = request(c.proto, client, cport, s.vip, s.port);
            let (v, out) = t.run_xdp(&data);
            let want = match mode {
                Mode::Nat => (XDP_PASS, request(c.proto, client, cport, b.addr, b.port)),
                Mode::Dsr => (XDP_TX, dsr(&data, b.mac)),
                Mode::L3Dsr => (XDP_PASS, encap(&data, b.addr, label, &out)),
                Mode::FullNat => panic!("full NAT's errors are packets_fullnat's"),
            };
            assert_eq!((v, out), want, "{what}: the flow's own packet");
            let aff = affinity(t, s.id, client, cport, s.port, c.proto).expect("affinity recorded");
            assert_eq!(aff.backend_id, b.id);

            // A new pick would now land on b2.
            s.weights(fx, 0, 1);
            assert_eq!(
                s.new_flow(fx, client, cport),
                s.b2,
                "{what}: set-up: the same flow, new, would reach b2"
            );
            let quote = cut(c, &reply_ip(c, s.vip, s.port, client, cport));
            let err = frame(&icmp_ip(c.kind, fam.router(), s.vip, &quote));
            let stats = s.stats(t);
            let drops = all_drops(t);
            let (v, out) = t.run_xdp(&err);
            let want = match mode {
                Mode::Nat => {
                    let quote_b = cut(c, &reply_ip(c, b.addr, b.port, client, cport));
                    (
                        XDP_PASS,
                        frame(&icmp_ip(c.kind, fam.router(), b.addr, &quote_b)),
                    )
                }
                Mode::Dsr => (XDP_TX, dsr(&err, b.mac)),
                Mode::L3Dsr => (XDP_PASS, encap(&err, b.addr, label, &out)),
                Mode::FullNat => panic!("full NAT's errors are packets_fullnat's"),
            };
            assert_eq!((v, &out), (want.0, &want.1), "{what}: the error");
            if mode == NAT {
                check_icmp_checksums(&out, matches!(c.quote, Quote::Whole));
            }
            let aff2 = affinity(t, s.id, client, cport, s.port, c.proto).unwrap();
            assert_eq!(aff2.backend_id, b.id, "{what}: affinity unchanged");
            assert_eq!(all_drops(t), drops, "{what}: no drop counted");
            let st = s.stats(t);
            assert_eq!(
                (st.packets, st.bytes),
                (stats.packets + 1, stats.bytes + err.len() as u64),
                "{what}: counted for the VIP"
            );
            s.weights(fx, 1, 0);
        }
    }
}

/// With no state for the flow, an error goes where the table says (the
/// flow's own next packet would go there too), and records nothing:
/// no affinity entry, no NAT entry.
fn icmp_without_state(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let client = fam.client();
    for proto in [PROTO_UDP, PROTO_TCP] {
        let mut s = icmp_svc(fx, fam, NAT, proto);
        let c = case("no state", proto, Kind::TooBig, Quote::Whole);
        let cport = 42000;
        s.weights(fx, 0, 1);
        let b = s.new_flow(fx, client, cport);
        assert_eq!(b, s.b2, "{fam:?} proto {proto}: set-up: new flows reach b2");
        let quote = cut(&c, &reply_ip(&c, s.vip, s.port, client, cport));
        let err = frame(&icmp_ip(c.kind, fam.router(), s.vip, &quote));
        let (v, out) = t.run_xdp(&err);
        let quote_b = cut(&c, &reply_ip(&c, b.addr, b.port, client, cport));
        let want = frame(&icmp_ip(c.kind, fam.router(), b.addr, &quote_b));
        assert_eq!(
            (v, &out),
            (XDP_PASS, &want),
            "{fam:?} proto {proto}: error without state"
        );
        check_icmp_checksums(&out, true);
        assert!(
            affinity(t, s.id, client, cport, s.port, proto).is_none(),
            "{fam:?} proto {proto}: an ICMP error created affinity state"
        );
        assert_eq!(nat_entry(t, b.addr, b.port, client, cport, proto), None);
        s.weights(fx, 1, 0);
    }
}

/// After the flow's affinity entry is gone (LRU eviction), the error and
/// the flow's packets still agree: both hash the same client-side flow,
/// and both reach the backend the oracle picks.
fn icmp_agrees_with_hash(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let client = fam.client();
    for proto in [PROTO_UDP, PROTO_TCP] {
        let mut s = icmp_svc(fx, fam, NAT, proto);
        // Equal weights: a slice that holds both.
        s.weights(fx, 1, 1);
        let c = case("hash", proto, Kind::TooBig, Quote::Whole);
        let mut seen = [false; 2];
        for cport in 43000..43016u16 {
            let b = s.new_flow(fx, client, cport);
            seen[usize::from(b == s.b2)] = true;
            let data = request(proto, client, cport, s.vip, s.port);
            let (v, out) = t.run_xdp(&data);
            assert_eq!(
                (v, out),
                (XDP_PASS, request(proto, client, cport, b.addr, b.port)),
                "{fam:?} proto {proto} port {cport}: the flow's own packet"
            );
            // The datapath's own state: eviction, which no writer call
            // does, is a removal by hand.
            forget_affinity(t, s.id, client, cport, s.port, proto);
            let quote = cut(&c, &reply_ip(&c, s.vip, s.port, client, cport));
            let err = frame(&icmp_ip(c.kind, fam.router(), s.vip, &quote));
            let (v, out) = t.run_xdp(&err);
            let quote_b = cut(&c, &reply_ip(&c, b.addr, b.port, client, cport));
            let want = frame(&icmp_ip(c.kind, fam.router(), b.addr, &quote_b));
            assert_eq!(
                (v, out),
                (XDP_PASS, want),
                "{fam:?} proto {proto} port {cport}: the error"
            );
        }
        assert_eq!(seen, [true, true], "both backends used");
        s.weights(fx, 1, 0);
    }
}

/// A payload of `n` (even) bytes that makes the UDP datagram from
/// src:sport to dst:dport sum to zero, so that its checksum is sent as
/// 0xffff (RFC 768): the last word is chosen to cancel the rest.
fn payload_for_ffff(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, n: usize) -> Vec<u8> {
    let mut body = payload(13, n - 2);
    body.extend_from_slice(&[0, 0]);
    let dg = udp(src, sport, dst, dport, &body);
    let (h, _) = UdpHeader::from_slice(&dg).unwrap();
    body[n - 2..].copy_from_slice(&h.checksum.to_be_bytes());
    let (h, _) = UdpHeader::from_slice(&udp(src, sport, dst, dport, &body)).unwrap();
    assert_eq!(h.checksum, 0xffff);
    body
}

/// The quoted UDP checksum at the edge of ones' complement arithmetic: a
/// translation whose result sums to zero must send 0xffff (never 0, which
/// means "no checksum"), and a quote that carries 0xffff translates like
/// any other.
fn icmp_udp_checksum_edge(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let client = fam.client();
    let s = icmp_svc(fx, fam, NAT, PROTO_UDP);
    let c = case("edge", PROTO_UDP, Kind::TooBig, Quote::Whole);
    let b = s.b1;
    for cport in [45000, 45001] {
        assert_eq!(
            s.new_flow(fx, client, cport),
            b,
            "{fam:?} set-up: new flows reach b1"
        );
    }
    for (name, cport, body) in [
        (
            "translated checksum is 0xffff",
            45000,
            payload_for_ffff(b.addr, b.port, client, 45000, 24),
        ),
        (
            "quoted checksum is 0xffff",
            45001,
            payload_for_ffff(s.vip, s.port, client, 45001, 24),
        ),
    ] {
        let quote = reply_ip_body(&c, s.vip, s.port, client, cport, &body);
        let err = frame(&icmp_ip(c.kind, fam.router(), s.vip, &quote));
        let (v, out) = t.run_xdp(&err);
        let quote_b = reply_ip_body(&c, b.addr, b.port, client, cport, &body);
        let want = frame(&icmp_ip(c.kind, fam.router(), b.addr, &quote_b));
        assert_eq!((v, &out), (XDP_PASS, &want), "{fam:?} {name}");
        check_icmp_checksums(&out, true);
    }
}

/// Fragments of a datagram to no VIP are the node's own business: the
/// first passes untouched and records nothing; the later ones pass
/// untouched too, and, addressed to no VIP's address (the VIP filter
/// says so before anything is looked up), are not counted as having no
/// first: that count is for fragments that may be a VIP's.
fn fragments_not_ours(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let (client, other) = (fam.client(), fam.other());
    let dgram = udp(client, 40009, other, 53, &payload(21, 48));
    let input = fragment_frames(client, other, PROTO_UDP, 0x789a, &dgram, &FRAG_SIZES);
    let before = frag_no_first(t);
    for (i, pkt) in input.iter().enumerate() {
        let (v, out) = t.run_xdp(pkt);
        assert_eq!((v, &out), (XDP_PASS, pkt), "{fam:?} non-VIP fragment {i}");
    }
    assert_eq!(frag_entry(t, client, other, 0x789a, PROTO_UDP), None);
    assert_eq!(frag_no_first(t), before);
}

/// Errors that are not rivora's to steer are passed untouched and change
/// nothing.
fn icmp_not_steered(fx: &Fx, fam: Fam) {
    let t = &fx.t;
    let client = fam.client();
    let s = icmp_svc(fx, fam, NAT, PROTO_UDP);
    let (vip, other, router) = (s.vip, fam.other(), fam.router());
    let udp_c = case("", PROTO_UDP, Kind::TooBig, Quote::Whole);
    let tcp_c = case("", PROTO_TCP, Kind::TooBig, Quote::Whole);
    // An ICMP packet the VIP sent the client, quoted in turn.
    let icmp_quote = icmp_ip(Kind::Echo, vip, client, b"ping");
    // A later fragment of a reply the VIP sent: no L4 header, but its
    // payload happens to begin with bytes that read as VIP port 53 to a
    // client port. Deliberately odd bytes, so written out.
    let mut look_alike = Vec::new();
    look_alike.extend_from_slice(&53u16.to_be_bytes());
    look_alike.extend_from_slice(&44006u16.to_be_bytes());
    look_alike.extend_from_slice(&payload(17, 28));
    let later_frag = ip_packet(
        vip,
        client,
        PROTO_UDP,
        Some(Frag {
            id: 0x777,
            offset: 1480,
            more: false,
        }),
        &look_alike,
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "quote of a later fragment whose payload looks like VIP ports",
            icmp_ip(Kind::HostUnreach, router, vip, &later_frag),
        ),
        (
            "quote from a non-VIP address",
            icmp_ip(
                Kind::TooBig,
                router,
                other,
                &reply_ip(&udp_c, other, 53, client, 44000),
            ),
        ),
        (
            "quote from the VIP address, not a VIP port",
            icmp_ip(
                Kind::TooBig,
                router,
                vip,
                &reply_ip(&udp_c, vip, 5454, client, 44001),
            ),
        ),
        (
            "quote from the VIP port, not the VIP's protocol",
            icmp_ip(
                Kind::TooBig,
                router,
                vip,
                &reply_ip(&tcp_c, vip, 53, client, 44002),
            ),
        ),
        (
            "quoted source is the VIP, error sent elsewhere",
            icmp_ip(
                Kind::TooBig,
                router,
                other,
                &reply_ip(&udp_c, vip, 53, client, 44003),
            ),
        ),
        (
            "error sent to the VIP, quoted source elsewhere",
            icmp_ip(
                Kind::TooBig,
                router,
                vip,
                &reply_ip(&udp_c, other, 53, client, 44004),
            ),
        ),
        (
            "quoted packet is ICMP",
            icmp_ip(Kind::PortUnreach, router, vip, &icmp_quote),
        ),
        (
            "time exceeded quoting a VIP flow",
            icmp_ip(
                Kind::TimeExceeded,
                router,
                vip,
                &reply_ip(&udp_c, vip, 53, client, 44005),
            ),
        ),
        (
            "echo request to the VIP",
            icmp_ip(Kind::Echo, client, vip, b"ping"),
        ),
    ];
    let flows = |t: &TestDp| {
        (
            t.maps.connection_affinity_map.keys::<rv_flow_key>().len(),
            t.maps.connection_affinity_map6.keys::<rv_flow6_key>().len(),
        )
    };
    for (name, ip) in cases {
        let pkt = frame(&ip);
        let state = flows(t);
        let drops = all_drops(t);
        let st = s.stats(t);
        let (v, out) = t.run_xdp(&pkt);
        assert_eq!(v, XDP_PASS, "{fam:?} {name}");
        assert_eq!(out, pkt, "{fam:?} {name}: untouched");
        assert_eq!(all_drops(t), drops, "{fam:?} {name}: nothing counted");
        assert_eq!(s.stats(t).packets, st.packets, "{fam:?} {name}");
        assert_eq!(flows(t), state, "{fam:?} {name}: no affinity state");
    }
}

#[test]
fn icmpv4_errors_steered_in_each_mode() {
    in_fresh_netns(|fx| {
        icmp_steered(fx, Fam::V4, ICMP4_CASES);
        icmp_without_state(fx, Fam::V4);
        icmp_agrees_with_hash(fx, Fam::V4);
        icmp_udp_checksum_edge(fx, Fam::V4);
        icmp_not_steered(fx, Fam::V4);
    });
}

#[test]
fn icmpv6_errors_steered_in_each_mode() {
    in_fresh_netns(|fx| {
        icmp_steered(fx, Fam::V6, ICMP6_CASES);
        icmp_without_state(fx, Fam::V6);
        icmp_agrees_with_hash(fx, Fam::V6);
        icmp_udp_checksum_edge(fx, Fam::V6);
        icmp_not_steered(fx, Fam::V6);
    });
}
