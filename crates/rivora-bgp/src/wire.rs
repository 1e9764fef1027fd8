//! BGP messages on the wire, through `netgauze-bgp-pkt`: framing and the
//! header checks of RFC 4271 6.1 (done here, before the parser, so each
//! malformed header gets its own NOTIFICATION), OPEN building and
//! checking (6.2), UPDATE building for IPv4 (classic NLRI) and IPv6
//! (MP_REACH_NLRI / MP_UNREACH_NLRI, RFC 4760), End-of-RIB (RFC 4724).
//!
//! Attribute errors in UPDATEs a peer sends are not fatal (RFC 7606's
//! spirit: this speaker announces and never installs what it receives);
//! structural errors (a length past the message, a bad withdrawn or
//! attribute length) are, with the RFC's code and subcode.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::{Buf, BytesMut};
use ipnet::{Ipv4Net, Ipv6Net};
use netgauze_bgp_pkt::capabilities::{
    BgpCapability, FourOctetAsCapability, GracefulRestartAddressFamily, GracefulRestartCapability,
    MultiProtocolExtensionsCapability,
};
use netgauze_bgp_pkt::community::{Community, LargeCommunity};
use netgauze_bgp_pkt::nlri::{Ipv4Unicast, Ipv4UnicastAddress, Ipv6Unicast, Ipv6UnicastAddress};
use netgauze_bgp_pkt::notification::BgpNotificationMessage;
use netgauze_bgp_pkt::open::{BgpOpenMessage, BgpOpenMessageParameter};
use netgauze_bgp_pkt::path_attribute::{
    As2PathSegment, As4Path, As4PathSegment, AsPath, AsPathSegmentType, Communities,
    LargeCommunities, LocalPreference, MpReach, MpUnreach, MultiExitDiscriminator, NextHop, Origin,
    PathAttribute, PathAttributeValue,
};
use netgauze_bgp_pkt::update::BgpUpdateMessage;
use netgauze_bgp_pkt::wire::deserializer::BgpParsingContext;
use netgauze_bgp_pkt::BgpMessage;
use netgauze_iana::address_family::AddressType;
use netgauze_parse_utils::reader::SliceReader;
use netgauze_parse_utils::traits::ParseFromWithOneInput;
use netgauze_parse_utils::WritablePdu;

use crate::fsm::{codes, Notification};

pub const HEADER_LEN: usize = 19;
pub const MAX_MESSAGE_LEN: usize = 4096;
/// The 2-octet AS a 4-octet AS number shows to an old speaker (RFC 6793).
pub const AS_TRANS: u16 = 23456;
const TYPE_OPEN: u8 = 1;
const TYPE_UPDATE: u8 = 2;
const TYPE_NOTIFICATION: u8 = 3;
const TYPE_KEEPALIVE: u8 = 4;
const TYPE_ROUTE_REFRESH: u8 = 5;

/// An address family this speaker announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Ipv4Unicast,
    Ipv6Unicast,
}

impl Family {
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::Ipv4Unicast,
            IpAddr::V6(_) => Family::Ipv6Unicast,
        }
    }

    fn address_type(self) -> AddressType {
        match self {
            Family::Ipv4Unicast => AddressType::Ipv4Unicast,
            Family::Ipv6Unicast => AddressType::Ipv6Unicast,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Ipv4Unicast => "ipv4-unicast",
            Family::Ipv6Unicast => "ipv6-unicast",
        }
    }
}

/// A message as the session needs it.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Open(BgpOpenMessage),
    Update(BgpUpdateMessage),
    Notification(Notification),
    Keepalive,
    RouteRefresh,
}

/// Why a received byte stream could not be read: the NOTIFICATION to
/// send, and whether it came from the header checks (event 21), an OPEN
/// (22) or an UPDATE (28).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Header(Notification),
    Open(Notification),
    Update(Notification),
    /// An UPDATE whose attribute list and NLRI are whole (every
    /// attribute's length adds up, no MP_REACH_NLRI or MP_UNREACH_NLRI)
    /// but an attribute's content is malformed: RFC 7606 has it treated as
    /// a withdraw, not a reset.
    Attribute(Notification),
    /// A NOTIFICATION or ROUTE-REFRESH too malformed to read (the session
    /// ends either way: answered as a header error).
    Other(Notification),
}

impl DecodeError {
    pub fn notification(&self) -> &Notification {
        match self {
            DecodeError::Header(n)
            | DecodeError::Open(n)
            | DecodeError::Update(n)
            | DecodeError::Attribute(n)
            | DecodeError::Other(n) => n,
        }
    }
}

/// The parser's settings for a session: 4-octet AS numbers once both
/// sides said so; unknown capabilities and attribute errors kept, not
/// fatal.
pub fn parsing_context(asn4: bool) -> BgpParsingContext {
    BgpParsingContext::new(
        asn4,
        HashMap::new(),
        HashMap::new(),
        false,
        false,
        false,
        false,
    )
}

fn header_err(sub: u8, data: &[u8]) -> DecodeError {
    DecodeError::Header(Notification::with_data(codes::MESSAGE_HEADER, sub, data))
}

/// Take one message off the front of `buf`, if a whole one is there.
/// Never panics, whatever the bytes.
pub fn decode(
    buf: &mut BytesMut,
    ctx: &mut BgpParsingContext,
) -> Result<Option<Message>, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if buf[..16].iter().any(|b| *b != 0xff) {
        return Err(header_err(codes::CONNECTION_NOT_SYNCHRONIZED, &[]));
    }
    let len = u16::from_be_bytes([buf[16], buf[17]]) as usize;
    let kind = buf[18];
    let len_bytes = [buf[16], buf[17]];
    if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&len) {
        return Err(header_err(codes::BAD_MESSAGE_LENGTH, &len_bytes));
    }
    let min = match kind {
        TYPE_OPEN => 29,
        TYPE_UPDATE => 23,
        TYPE_NOTIFICATION => 21,
        TYPE_KEEPALIVE => 19,
        TYPE_ROUTE_REFRESH => 23,
        _ => return Err(header_err(codes::BAD_MESSAGE_TYPE, &[kind])),
    };
    let exact = matches!(kind, TYPE_KEEPALIVE | TYPE_ROUTE_REFRESH);
    if len < min || (exact && len != min) {
        return Err(header_err(codes::BAD_MESSAGE_LENGTH, &len_bytes));
    }
    if buf.len() < len {
        return Ok(None);
    }
    let frame = buf.split_to(len);
    match kind {
        TYPE_KEEPALIVE => Ok(Some(Message::Keepalive)),
        TYPE_ROUTE_REFRESH => Ok(Some(Message::RouteRefresh)),
        TYPE_NOTIFICATION => Ok(Some(Message::Notification(Notification::with_data(
            frame[19],
            frame[20],
            &frame[21..],
        )))),
        _ => {
            let mut reader = SliceReader::new(&frame[..]);
            match BgpMessage::parse(&mut reader, ctx) {
                Ok(BgpMessage::Open(o)) => Ok(Some(Message::Open(o))),
                Ok(BgpMessage::Update(u)) => Ok(Some(Message::Update(u))),
                Ok(_) => Err(header_err(codes::BAD_MESSAGE_TYPE, &[kind])),
                Err(e) => {
                    let n = notification_of(&BgpNotificationMessage::from(e));
                    if kind == TYPE_UPDATE && update_routes_found(&frame[HEADER_LEN..]) {
                        let n = if n.code == codes::UPDATE_MESSAGE
                            && n.subcode != codes::MALFORMED_ATTRIBUTE_LIST
                        {
                            n
                        } else {
                            Notification::new(codes::UPDATE_MESSAGE, OPTIONAL_ATTRIBUTE_ERROR)
                        };
                        return Err(DecodeError::Attribute(n));
                    }
                    Err(match kind {
                        TYPE_OPEN if n.code == codes::OPEN_MESSAGE => DecodeError::Open(n),
                        TYPE_OPEN => DecodeError::Open(Notification::new(codes::OPEN_MESSAGE, 0)),
                        _ if n.code == codes::UPDATE_MESSAGE => DecodeError::Update(n),
                        // A structural error the library files under the
                        // header (a length that does not add up) is an
                        // UPDATE's malformed attribute list (RFC 4271 6.3).
                        _ => DecodeError::Update(Notification::new(
                            codes::UPDATE_MESSAGE,
                            codes::MALFORMED_ATTRIBUTE_LIST,
                        )),
                    })
                }
            }
        }
    }
}

/// UPDATE Message Error's subcode for a malformed optional attribute.
const OPTIONAL_ATTRIBUTE_ERROR: u8 = 9;

/// Whether an UPDATE's body (after the header) can be read for its routes
/// whatever its attributes say (RFC 7606 section 4): the withdrawn routes
/// and the attribute list end where their lengths say, each attribute's
/// own length adds up to the list's, the NLRI are whole prefixes, and no
/// MP_REACH_NLRI or MP_UNREACH_NLRI (types 14 and 15) carries routes of
/// its own.
fn update_routes_found(body: &[u8]) -> bool {
    let u16_at = |i: usize| -> Option<usize> {
        Some(usize::from(u16::from_be_bytes([
            *body.get(i)?,
            *body.get(i + 1)?,
        ])))
    };
    let prefixes = |mut p: &[u8]| -> bool {
        while let Some((&len, rest)) = p.split_first() {
            let n = usize::from(len).div_ceil(8);
            if len > 32 || rest.len() < n {
                return false;
            }
            p = &rest[n..];
        }
        true
    };
    let Some(withdrawn) = u16_at(0) else {
        return false;
    };
    let Some(w) = body.get(2..2 + withdrawn) else {
        return false;
    };
    let Some(attr_len) = u16_at(2 + withdrawn) else {
        return false;
    };
    let start = 4 + withdrawn;
    let Some(attrs) = body.get(start..start + attr_len) else {
        return false;
    };
    let mut p = 0;
    while p < attrs.len() {
        let Some(&[flags, kind]) = attrs.get(p..p + 2) else {
            return false;
        };
        if kind == 14 || kind == 15 {
            return false;
        }
        let (hdr, len) = if flags & 0x10 != 0 {
            match attrs.get(p + 2..p + 4) {
                Some(&[a, b]) => (4, usize::from(u16::from_be_bytes([a, b]))),
                _ => return false,
            }
        } else {
            match attrs.get(p + 2) {
                Some(&l) => (3, usize::from(l)),
                None => return false,
            }
        };
        p += hdr + len;
    }
    p == attrs.len() && prefixes(w) && prefixes(&body[start + attr_len..])
}

/// Code, subcode and data of a netgauze NOTIFICATION, read from its own
/// encoding (the library keeps them as enum variants).
pub fn notification_of(n: &BgpNotificationMessage) -> Notification {
    let mut out = Vec::new();
    match BgpMessage::Notification(n.clone()).write(&mut out) {
        Ok(()) if out.len() >= 21 => Notification::with_data(out[19], out[20], &out[21..]),
        _ => Notification::new(codes::MESSAGE_HEADER, 0),
    }
}

/// The bytes of a message.
pub fn encode(msg: &BgpMessage) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    // Writing into a Vec fails only on a message the library cannot
    // represent; every message built here is representable.
    if msg.write(&mut out).is_err() {
        out.clear();
    }
    out
}

/// A NOTIFICATION's bytes (written by hand: any code and subcode).
pub fn encode_notification(n: &Notification) -> Vec<u8> {
    let data = &n.data[..n.data.len().min(MAX_MESSAGE_LEN - 21)];
    let len = 21 + data.len();
    let mut out = vec![0xff; 16];
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&[TYPE_NOTIFICATION, n.code, n.subcode]);
    out.extend_from_slice(data);
    out
}

pub fn encode_keepalive() -> Vec<u8> {
    encode(&BgpMessage::KeepAlive)
}

/// What this side puts in its OPEN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenParams {
    pub asn: u32,
    pub hold_time: u16,
    pub router_id: Ipv4Addr,
    pub families: Vec<Family>,
    /// Graceful restart (RFC 4724): the restart time and the flags.
    pub graceful_restart: Option<GracefulRestart>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GracefulRestart {
    /// Seconds the peer keeps our routes after the session drops.
    pub restart_time: u16,
    /// R: this speaker has restarted (peers need not wait for its EoR).
    pub restarting: bool,
    /// F: forwarding survived the restart (the datapath is pinned).
    pub forwarding_preserved: bool,
}

pub fn open_message(p: &OpenParams) -> BgpMessage {
    let my_as = u16::try_from(p.asn).unwrap_or(AS_TRANS);
    let mut caps: Vec<BgpCapability> = p
        .families
        .iter()
        .map(|f| {
            BgpCapability::MultiProtocolExtensions(MultiProtocolExtensionsCapability::new(
                f.address_type(),
            ))
        })
        .collect();
    caps.push(BgpCapability::RouteRefresh);
    caps.push(BgpCapability::FourOctetAs(FourOctetAsCapability::new(
        p.asn,
    )));
    if let Some(gr) = p.graceful_restart {
        caps.push(BgpCapability::GracefulRestartCapability(
            GracefulRestartCapability::new(
                gr.restarting,
                false,
                gr.restart_time.min(4095),
                p.families
                    .iter()
                    .map(|f| {
                        GracefulRestartAddressFamily::new(gr.forwarding_preserved, f.address_type())
                    })
                    .collect::<Vec<_>>(),
            ),
        ));
    }
    BgpMessage::Open(BgpOpenMessage::new(
        my_as,
        p.hold_time,
        p.router_id,
        vec![BgpOpenMessageParameter::Capabilities(caps.into())],
    ))
}

/// What a valid OPEN from the peer settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub peer_asn: u32,
    pub peer_id: Ipv4Addr,
    /// min(ours, theirs); 0: no keepalives.
    pub hold_time: u16,
    pub asn4: bool,
    /// The families both sides announced (IPv4 unicast alone when the
    /// peer sent no multiprotocol capability, RFC 4760).
    pub families: Vec<Family>,
    pub peer_graceful_restart: bool,
    pub route_refresh: bool,
}

/// Check the peer's OPEN against what is configured (RFC 4271 6.2).
pub fn check_open(
    o: &BgpOpenMessage,
    ours: &OpenParams,
    expected_peer_asn: u32,
) -> Result<Negotiated, Notification> {
    if o.version() != 4 {
        return Err(Notification::with_data(
            codes::OPEN_MESSAGE,
            codes::UNSUPPORTED_VERSION,
            &[0, 4],
        ));
    }
    let peer_asn = o.my_asn4();
    if peer_asn != expected_peer_asn {
        return Err(Notification::with_data(
            codes::OPEN_MESSAGE,
            codes::BAD_PEER_AS,
            &o.my_as().to_be_bytes(),
        ));
    }
    let id = o.bgp_id();
    let ibgp = peer_asn == ours.asn;
    if id.is_unspecified()
        || id.is_broadcast()
        || id.is_multicast()
        || (ibgp && id == ours.router_id)
    {
        return Err(Notification::with_data(
            codes::OPEN_MESSAGE,
            codes::BAD_BGP_IDENTIFIER,
            &id.octets(),
        ));
    }
    let theirs = o.hold_time();
    if theirs == 1 || theirs == 2 {
        return Err(Notification::with_data(
            codes::OPEN_MESSAGE,
            codes::UNACCEPTABLE_HOLD_TIME,
            &theirs.to_be_bytes(),
        ));
    }
    let caps = o.capabilities();
    let asn4 = caps
        .iter()
        .any(|c| matches!(c, BgpCapability::FourOctetAs(_)));
    let mp: Vec<AddressType> = caps
        .iter()
        .filter_map(|c| match c {
            BgpCapability::MultiProtocolExtensions(m) => Some(m.address_type()),
            _ => None,
        })
        .collect();
    let families = ours
        .families
        .iter()
        .copied()
        .filter(|f| {
            if mp.is_empty() {
                *f == Family::Ipv4Unicast
            } else {
                mp.contains(&f.address_type())
            }
        })
        .collect();
    Ok(Negotiated {
        peer_asn,
        peer_id: id,
        hold_time: if theirs == 0 || ours.hold_time == 0 {
            0
        } else {
            theirs.min(ours.hold_time)
        },
        asn4,
        families,
        peer_graceful_restart: caps
            .iter()
            .any(|c| matches!(c, BgpCapability::GracefulRestartCapability(_))),
        route_refresh: caps.iter().any(|c| {
            matches!(
                c,
                BgpCapability::RouteRefresh | BgpCapability::EnhancedRouteRefresh
            )
        }),
    })
}

/// The attributes a route carries beyond the session's own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteAttrs {
    /// RFC 1997 communities, as 32-bit values (`65000:100` is
    /// `65000 << 16 | 100`).
    pub communities: Vec<u32>,
    /// RFC 8092 large communities.
    pub large_communities: Vec<(u32, u32, u32)>,
    /// Sent to iBGP peers only (RFC 4271 5.1.5); 100 when unset.
    pub local_pref: Option<u32>,
    pub med: Option<u32>,
}

/// The session's side of every UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateParams {
    pub local_asn: u32,
    pub ebgp: bool,
    pub asn4: bool,
    pub next_hop4: Option<Ipv4Addr>,
    pub next_hop6: Option<Ipv6Addr>,
}

fn attr(
    optional: bool,
    transitive: bool,
    extended: bool,
    v: PathAttributeValue,
) -> Option<PathAttribute> {
    PathAttribute::from(optional, transitive, false, extended, v).ok()
}

fn common_attrs(a: &RouteAttrs, p: &UpdateParams) -> Vec<PathAttribute> {
    let mut out = Vec::new();
    out.extend(attr(
        false,
        true,
        false,
        PathAttributeValue::Origin(Origin::IGP),
    ));
    let path = if !p.ebgp {
        if p.asn4 {
            AsPath::As4PathSegments(Box::new([]))
        } else {
            AsPath::As2PathSegments(Box::new([]))
        }
    } else if p.asn4 {
        AsPath::As4PathSegments(
            vec![As4PathSegment::new(
                AsPathSegmentType::AsSequence,
                vec![p.local_asn],
            )]
            .into(),
        )
    } else {
        let two = u16::try_from(p.local_asn).unwrap_or(AS_TRANS);
        AsPath::As2PathSegments(
            vec![As2PathSegment::new(
                AsPathSegmentType::AsSequence,
                vec![two],
            )]
            .into(),
        )
    };
    out.extend(attr(false, true, false, PathAttributeValue::AsPath(path)));
    // An old speaker learns the real 4-octet AS from AS4_PATH.
    if p.ebgp && !p.asn4 && p.local_asn > u32::from(u16::MAX) {
        out.extend(attr(
            true,
            true,
            false,
            PathAttributeValue::As4Path(As4Path::new(vec![As4PathSegment::new(
                AsPathSegmentType::AsSequence,
                vec![p.local_asn],
            )])),
        ));
    }
    if let Some(m) = a.med {
        out.extend(attr(
            true,
            false,
            false,
            PathAttributeValue::MultiExitDiscriminator(MultiExitDiscriminator::new(m)),
        ));
    }
    if !p.ebgp {
        out.extend(attr(
            false,
            true,
            false,
            PathAttributeValue::LocalPreference(LocalPreference::new(a.local_pref.unwrap_or(100))),
        ));
    }
    if !a.communities.is_empty() {
        out.extend(attr(
            true,
            true,
            true,
            PathAttributeValue::Communities(Communities::new(
                a.communities
                    .iter()
                    .map(|c| Community::new(*c))
                    .collect::<Vec<_>>(),
            )),
        ));
    }
    if !a.large_communities.is_empty() {
        out.extend(attr(
            true,
            true,
            true,
            PathAttributeValue::LargeCommunities(LargeCommunities::new(
                a.large_communities
                    .iter()
                    .map(|(g, l1, l2)| LargeCommunity::new(*g, *l1, *l2))
                    .collect::<Vec<_>>(),
            )),
        ));
    }
    out
}

fn v4_nlri(prefixes: &[Ipv4Net]) -> Vec<Ipv4UnicastAddress> {
    prefixes
        .iter()
        .filter_map(|p| Ipv4Unicast::from_net(*p).ok())
        .map(Ipv4UnicastAddress::new_no_path_id)
        .collect()
}

fn v6_nlri(prefixes: &[Ipv6Net]) -> Vec<Ipv6UnicastAddress> {
    prefixes
        .iter()
        .filter_map(|p| Ipv6Unicast::from_net(*p).ok())
        .map(|n| Ipv6UnicastAddress::new(None, n))
        .collect()
}

/// Prefixes per UPDATE, so a message stays under 4,096 bytes with any
/// attributes this speaker sends (up to 64 communities of each kind).
pub const V4_PER_UPDATE: usize = 400;
pub const V6_PER_UPDATE: usize = 120;

/// IPv4 routes with the same attributes, classic NLRI and NEXT_HOP.
pub fn announce_v4(
    prefixes: &[Ipv4Net],
    a: &RouteAttrs,
    p: &UpdateParams,
    next_hop: Ipv4Addr,
) -> BgpMessage {
    let mut attrs = common_attrs(a, p);
    attrs.extend(attr(
        false,
        true,
        false,
        PathAttributeValue::NextHop(NextHop::new(next_hop)),
    ));
    BgpMessage::Update(BgpUpdateMessage::new(vec![], attrs, v4_nlri(prefixes)))
}

/// IPv6 routes with the same attributes, in MP_REACH_NLRI.
pub fn announce_v6(
    prefixes: &[Ipv6Net],
    a: &RouteAttrs,
    p: &UpdateParams,
    next_hop: Ipv6Addr,
) -> BgpMessage {
    let mut attrs = common_attrs(a, p);
    // A link-local next hop goes in the second slot, with the global one
    // first (RFC 2545); a global one alone.
    attrs.extend(attr(
        true,
        false,
        true,
        PathAttributeValue::MpReach(MpReach::Ipv6Unicast {
            next_hop_global: next_hop,
            next_hop_local: None,
            nlri: v6_nlri(prefixes).into(),
        }),
    ));
    BgpMessage::Update(BgpUpdateMessage::new(vec![], attrs, vec![]))
}

pub fn withdraw_v4(prefixes: &[Ipv4Net]) -> BgpMessage {
    BgpMessage::Update(BgpUpdateMessage::new(v4_nlri(prefixes), vec![], vec![]))
}

pub fn withdraw_v6(prefixes: &[Ipv6Net]) -> BgpMessage {
    let attrs: Vec<PathAttribute> = attr(
        true,
        false,
        true,
        PathAttributeValue::MpUnreach(MpUnreach::Ipv6Unicast {
            nlri: v6_nlri(prefixes).into(),
        }),
    )
    .into_iter()
    .collect();
    BgpMessage::Update(BgpUpdateMessage::new(vec![], attrs, vec![]))
}

/// End-of-RIB (RFC 4724 2): an empty UPDATE for IPv4 unicast, an empty
/// MP_UNREACH_NLRI for the others.
pub fn end_of_rib(f: Family) -> BgpMessage {
    match f {
        Family::Ipv4Unicast => BgpMessage::Update(BgpUpdateMessage::new(vec![], vec![], vec![])),
        Family::Ipv6Unicast => withdraw_v6(&[]),
    }
}

/// Skip what a decoder left in a buffer after an error (the session is
/// closed anyway; this keeps a fuzz loop going).
pub fn discard(buf: &mut BytesMut) {
    buf.advance(buf.len());
}

#[cfg(test)]
mod tests;
