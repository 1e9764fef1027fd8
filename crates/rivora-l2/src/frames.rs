//! ARP and NDP frames, read and written with `smoltcp::wire`'s
//! representations (which lay out the fields and compute the ICMPv6
//! checksum), never by offset arithmetic.
//!
//! What is answered, and how:
//! - an ARP request (not a gratuitous one: sender and target addresses
//!   differ) for a VIP: a unicast reply to the requester's hardware
//!   address, `sender = VIP at our MAC`. An ARP probe (sender 0.0.0.0,
//!   RFC 5227) is answered the same way: the VIP is in use.
//! - a neighbour solicitation for an IPv6 VIP (hop limit 255, a valid
//!   checksum, code 0, a unicast target: RFC 4861 7.1.1): a solicited
//!   advertisement with the override flag and our MAC as the target
//!   link-layer option, sourced from the VIP itself (ndisc6 ignores an
//!   advertisement for a global target sourced from a link-local
//!   address), to the solicitor; a solicitation from the unspecified
//!   address (duplicate address detection) is answered to all-nodes,
//!   unsolicited (RFC 4861 7.2.4).
//!
//! And announced, on winning and then periodically:
//! - gratuitous ARP in both forms: a request (`sender = target = VIP`,
//!   target hardware zero, as the kernel's own and RFC 5227's
//!   announcement) and a reply whose target hardware address is our MAC
//!   too (Linux takes a gratuitous *reply* only in that form,
//!   `arp_is_garp`), both broadcast;
//! - an unsolicited neighbour advertisement to all-nodes (override set,
//!   solicited clear), from the VIP.

use std::net::{Ipv4Addr, Ipv6Addr};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, Icmpv6Packet, Icmpv6Repr, IpProtocol, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags,
    NdiscRepr, RawHardwareAddress,
};

pub type Mac = [u8; 6];

pub const BROADCAST: Mac = [0xff; 6];
/// ff02::1, all nodes on the link.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// Neighbour discovery is sent, and accepted, only with this hop limit:
/// proof that it did not cross a router.
pub const ND_HOP_LIMIT: u8 = 255;

/// What a frame asks that a speaker may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    /// An ARP request for `target`.
    Arp {
        sender_mac: Mac,
        sender_ip: Ipv4Addr,
        target: Ipv4Addr,
    },
    /// A neighbour solicitation for `target`.
    Ns {
        /// The Ethernet source, where no source link-layer option says
        /// otherwise.
        src_mac: Mac,
        /// Unspecified (`::`) for duplicate address detection.
        src_ip: Ipv6Addr,
        target: Ipv6Addr,
        /// The source link-layer address option, if any.
        lladdr: Option<Mac>,
    },
}

impl Query {
    /// The address asked about.
    pub fn target(&self) -> std::net::IpAddr {
        match self {
            Query::Arp { target, .. } => (*target).into(),
            Query::Ns { target, .. } => (*target).into(),
        }
    }
}

fn mac_of(a: EthernetAddress) -> Mac {
    a.0
}

fn raw_mac(r: RawHardwareAddress) -> Option<Mac> {
    r.as_bytes().try_into().ok()
}

/// Read a frame as a question a speaker may answer; None for anything
/// else (other protocols, replies, gratuitous announcements, malformed or
/// truncated frames, a solicitation that RFC 4861 says to drop).
pub fn parse(frame: &[u8]) -> Option<Query> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let eth_repr = EthernetRepr::parse(&eth).ok()?;
    match eth_repr.ethertype {
        EthernetProtocol::Arp => parse_arp(eth.payload()),
        EthernetProtocol::Ipv6 => parse_ns(mac_of(eth_repr.src_addr), eth.payload()),
        _ => None,
    }
}

fn parse_arp(payload: &[u8]) -> Option<Query> {
    let arp = ArpPacket::new_checked(payload).ok()?;
    match ArpRepr::parse(&arp).ok()? {
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } if source_protocol_addr != target_protocol_addr => Some(Query::Arp {
            sender_mac: mac_of(source_hardware_addr),
            sender_ip: source_protocol_addr,
            target: target_protocol_addr,
        }),
        _ => None,
    }
}

fn parse_ns(src_mac: Mac, payload: &[u8]) -> Option<Query> {
    let ip = Ipv6Packet::new_checked(payload).ok()?;
    let ip_repr = Ipv6Repr::parse(&ip).ok()?;
    // A solicitation with extension headers is legal but never seen in
    // practice; the socket filter passes none either.
    if ip_repr.next_header != IpProtocol::Icmpv6 || ip_repr.hop_limit != ND_HOP_LIMIT {
        return None;
    }
    let icmp = Icmpv6Packet::new_checked(ip.payload()).ok()?;
    let repr = Icmpv6Repr::parse(
        &ip_repr.src_addr,
        &ip_repr.dst_addr,
        &icmp,
        &ChecksumCapabilities::default(),
    )
    .ok()?;
    let Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr,
        lladdr,
    }) = repr
    else {
        return None;
    };
    if target_addr.is_multicast() {
        return None;
    }
    let lladdr = lladdr.and_then(raw_mac);
    if ip_repr.src_addr.is_unspecified() {
        // Duplicate address detection: to the target's solicited-node
        // group, without a source link-layer option.
        if ip_repr.dst_addr != solicited_node(target_addr) || lladdr.is_some() {
            return None;
        }
    }
    Some(Query::Ns {
        src_mac,
        src_ip: ip_repr.src_addr,
        target: target_addr,
        lladdr,
    })
}

/// The solicited-node multicast group of `addr` (RFC 4291 2.7.1):
/// ff02::1:ff00:0/104 and its last 24 bits.
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet address of an IPv6 multicast group (RFC 2464 7):
/// 33:33 and its last 32 bits.
pub fn multicast_mac(group: Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

fn ethernet(src: Mac, dst: Mac, ethertype: EthernetProtocol, payload_len: usize) -> Vec<u8> {
    let repr = EthernetRepr {
        src_addr: EthernetAddress(src),
        dst_addr: EthernetAddress(dst),
        ethertype,
    };
    let mut buf = vec![0u8; repr.buffer_len() + payload_len];
    repr.emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
    buf
}

fn arp_frame(eth_dst: Mac, repr: ArpRepr) -> Vec<u8> {
    let ArpRepr::EthernetIpv4 {
        source_hardware_addr,
        ..
    } = repr
    else {
        unreachable!("the one ARP representation");
    };
    let mut buf = ethernet(
        source_hardware_addr.0,
        eth_dst,
        EthernetProtocol::Arp,
        repr.buffer_len(),
    );
    let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
    repr.emit(&mut ArpPacket::new_unchecked(frame.payload_mut()));
    buf
}

/// The answer to `Query::Arp`: `vip` is at `mac`, to the requester.
pub fn arp_reply(mac: Mac, vip: Ipv4Addr, sender_mac: Mac, sender_ip: Ipv4Addr) -> Vec<u8> {
    arp_frame(
        sender_mac,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: EthernetAddress(mac),
            source_protocol_addr: vip,
            target_hardware_addr: EthernetAddress(sender_mac),
            target_protocol_addr: sender_ip,
        },
    )
}

/// Gratuitous ARP, request form: broadcast, sender and target `vip`,
/// target hardware address zero.
pub fn garp_request(mac: Mac, vip: Ipv4Addr) -> Vec<u8> {
    arp_frame(
        BROADCAST,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress(mac),
            source_protocol_addr: vip,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: vip,
        },
    )
}

/// Gratuitous ARP, reply form: broadcast, sender and target `vip` at
/// `mac` both.
pub fn garp_reply(mac: Mac, vip: Ipv4Addr) -> Vec<u8> {
    arp_frame(
        BROADCAST,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: EthernetAddress(mac),
            source_protocol_addr: vip,
            target_hardware_addr: EthernetAddress(mac),
            target_protocol_addr: vip,
        },
    )
}

/// A neighbour advertisement for `vip` at `mac`, from `vip` to `dst`.
fn na(mac: Mac, vip: Ipv6Addr, eth_dst: Mac, dst: Ipv6Addr, solicited: bool) -> Vec<u8> {
    let mut flags = NdiscNeighborFlags::OVERRIDE;
    if solicited {
        flags |= NdiscNeighborFlags::SOLICITED;
    }
    let icmp = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
        flags,
        target_addr: vip,
        lladdr: Some(RawHardwareAddress::from(EthernetAddress(mac))),
    });
    let ip = Ipv6Repr {
        src_addr: vip,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: icmp.buffer_len(),
        hop_limit: ND_HOP_LIMIT,
    };
    let mut buf = ethernet(
        mac,
        eth_dst,
        EthernetProtocol::Ipv6,
        ip.buffer_len() + icmp.buffer_len(),
    );
    let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
    let mut packet = Ipv6Packet::new_unchecked(frame.payload_mut());
    ip.emit(&mut packet);
    icmp.emit(
        &vip,
        &dst,
        &mut Icmpv6Packet::new_unchecked(packet.payload_mut()),
        &ChecksumCapabilities::default(),
    );
    buf
}

/// A broadcast ARP request for `target` from `sender_ip` at `mac`, as the
/// kernel writes one (target hardware address zero). For probing.
pub fn arp_request(mac: Mac, sender_ip: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    arp_frame(
        BROADCAST,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress(mac),
            source_protocol_addr: sender_ip,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: target,
        },
    )
}

/// A neighbour solicitation for `target` from `src` at `mac`, to the
/// target's solicited-node group, with a source link-layer option. For
/// probing.
pub fn neighbour_solicitation(mac: Mac, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let group = solicited_node(target);
    let icmp = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: Some(RawHardwareAddress::from(EthernetAddress(mac))),
    });
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: group,
        next_header: IpProtocol::Icmpv6,
        payload_len: icmp.buffer_len(),
        hop_limit: ND_HOP_LIMIT,
    };
    let mut buf = ethernet(
        mac,
        multicast_mac(group),
        EthernetProtocol::Ipv6,
        ip.buffer_len() + icmp.buffer_len(),
    );
    let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
    let mut packet = Ipv6Packet::new_unchecked(frame.payload_mut());
    ip.emit(&mut packet);
    icmp.emit(
        &src,
        &group,
        &mut Icmpv6Packet::new_unchecked(packet.payload_mut()),
        &ChecksumCapabilities::default(),
    );
    buf
}

/// The answer to `Query::Ns`: solicited, to the solicitor (at its source
/// link-layer option's address if it gave one); for duplicate address
/// detection, unsolicited to all-nodes.
pub fn na_reply(mac: Mac, vip: Ipv6Addr, q: &Query) -> Option<Vec<u8>> {
    let Query::Ns {
        src_mac,
        src_ip,
        lladdr,
        ..
    } = *q
    else {
        return None;
    };
    Some(if src_ip.is_unspecified() {
        na_unsolicited(mac, vip)
    } else {
        na(mac, vip, lladdr.unwrap_or(src_mac), src_ip, true)
    })
}

/// An unsolicited neighbour advertisement to all-nodes.
pub fn na_unsolicited(mac: Mac, vip: Ipv6Addr) -> Vec<u8> {
    na(mac, vip, multicast_mac(ALL_NODES), ALL_NODES, false)
}

/// The frames that announce `vip` at `mac`: gratuitous ARP in both forms
/// for IPv4, an unsolicited advertisement for IPv6.
pub fn announcements(mac: Mac, vip: std::net::IpAddr) -> Vec<Vec<u8>> {
    match vip {
        std::net::IpAddr::V4(a) => vec![garp_request(mac, a), garp_reply(mac, a)],
        std::net::IpAddr::V6(a) => vec![na_unsolicited(mac, a)],
    }
}

/// The answer to a query for `vip` (the query's target), if it is one a
/// speaker gives.
pub fn answer(mac: Mac, q: &Query) -> Option<Vec<u8>> {
    match *q {
        Query::Arp {
            sender_mac,
            sender_ip,
            target,
        } => Some(arp_reply(mac, target, sender_mac, sender_ip)),
        Query::Ns { target, .. } => na_reply(mac, target, q),
    }
}

/// A frame that says "`addr` is at `mac`": an ARP reply or a gratuitous
/// ARP request for `addr`, or a neighbour advertisement for it. What a
/// capture is read for, to see who answered for a VIP and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub addr: std::net::IpAddr,
    pub mac: Mac,
    /// Unsolicited: gratuitous ARP (either form) or an advertisement
    /// without the solicited flag.
    pub gratuitous: bool,
}

/// Read a frame as a claim, if it is one.
pub fn claim(frame: &[u8]) -> Option<Claim> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    match EthernetRepr::parse(&eth).ok()?.ethertype {
        EthernetProtocol::Arp => {
            let arp = ArpPacket::new_checked(eth.payload()).ok()?;
            let ArpRepr::EthernetIpv4 {
                operation,
                source_hardware_addr,
                source_protocol_addr,
                target_protocol_addr,
                ..
            } = ArpRepr::parse(&arp).ok()?
            else {
                return None;
            };
            let gratuitous = source_protocol_addr == target_protocol_addr;
            let claims = match operation {
                ArpOperation::Reply => true,
                ArpOperation::Request => gratuitous,
                _ => false,
            };
            claims.then_some(Claim {
                addr: source_protocol_addr.into(),
                mac: mac_of(source_hardware_addr),
                gratuitous,
            })
        }
        EthernetProtocol::Ipv6 => {
            let ip = Ipv6Packet::new_checked(eth.payload()).ok()?;
            let ip_repr = Ipv6Repr::parse(&ip).ok()?;
            if ip_repr.next_header != IpProtocol::Icmpv6 {
                return None;
            }
            let icmp = Icmpv6Packet::new_checked(ip.payload()).ok()?;
            let repr = Icmpv6Repr::parse(
                &ip_repr.src_addr,
                &ip_repr.dst_addr,
                &icmp,
                &ChecksumCapabilities::default(),
            )
            .ok()?;
            let Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
                flags,
                target_addr,
                lladdr,
            }) = repr
            else {
                return None;
            };
            Some(Claim {
                addr: target_addr.into(),
                mac: lladdr
                    .and_then(raw_mac)
                    .unwrap_or(mac_of(EthernetRepr::parse(&eth).ok()?.src_addr)),
                gratuitous: !flags.contains(NdiscNeighborFlags::SOLICITED),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
