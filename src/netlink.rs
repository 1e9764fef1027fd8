//! Links, neighbours and routes, asked of the kernel over rtnetlink.
//!
//! Synchronous on purpose: the daemon asks from blocking code (a reload,
//! an attach), and the later readers (the ARP/NDP speaker, BGP's next-hop
//! cache) can call it from a blocking thread. One request at a time on one
//! socket; a socket answers for the network namespace of the thread that
//! opened it, so open it on the thread (and in the namespace) that asks.
//!
//! Built on `netlink-sys` (the socket) and `netlink-packet-route` (the
//! messages) rather than `rtnetlink`, which is async and would need a
//! runtime under every caller.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use netlink_packet_core::{
    DecodeError, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteType,
};
use netlink_packet_route::rule::{RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::protocols::NETLINK_ROUTE;
use nix::errno::Errno;
use nix::sys::socket::sockopt::ReceiveTimeout;
use nix::sys::time::TimeVal;

use crate::model::Mac;

/// Longest interface name the kernel stores, NUL excluded (IFNAMSIZ - 1).
/// A longer name sent in IFLA_IFNAME is silently truncated by the kernel,
/// which could find another interface, so it is refused here.
pub const MAX_IFNAME_LEN: usize = 15;

/// How long one reply may take before the request fails: the kernel
/// answers these at once, so this only bounds a lost reply.
const REPLY_TIMEOUT: TimeVal = TimeVal::new(5, 0);

/// How often `resolve` looks at the neighbour table while the kernel
/// resolves.
const RESOLVE_POLL: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("opening a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("netlink {request}: {source}")]
    Io {
        request: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("netlink {request}: undecodable reply: {source}")]
    Decode {
        request: &'static str,
        #[source]
        source: DecodeError,
    },
    #[error("interface name {0:?}: empty, longer than 15 bytes, or holds a NUL")]
    BadName(String),
}

/// A network interface as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// The link-layer address when it is an Ethernet-sized one (None for
    /// L3 devices such as tun or wireguard, which have none).
    pub mac: Option<Mac>,
    pub mtu: Option<u32>,
}

/// One neighbour table (ARP or NDP) entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub addr: IpAddr,
    pub ifindex: u32,
    pub mac: Option<Mac>,
    pub state: NeighbourState,
}

impl Neighbour {
    /// Whether the entry holds a MAC that frames may be sent to: the states
    /// `ip neigh show` lists (it hides NOARP and NONE) less FAILED and
    /// INCOMPLETE, which have no valid address.
    pub fn usable(&self) -> bool {
        self.mac.is_some()
            && matches!(
                self.state,
                NeighbourState::Reachable
                    | NeighbourState::Stale
                    | NeighbourState::Delay
                    | NeighbourState::Probe
                    | NeighbourState::Permanent
            )
    }
}

/// Where the kernel would send a packet to a destination (`ip route get`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub destination: IpAddr,
    /// The output interface.
    pub oif: Option<u32>,
    /// The next hop, when the destination is not on a connected segment.
    pub gateway: Option<IpAddr>,
    /// The source address the kernel would pick.
    pub prefsrc: Option<IpAddr>,
    /// A unicast route (not blackhole, unreachable, prohibit, local...).
    pub unicast: bool,
    /// A local route: the destination is an address of this host.
    pub local: bool,
    /// The route's MTU when locked (`mtu lock N`): the one
    /// bpf_fib_lookup checks instead of the device's.
    pub locked_mtu: Option<u32>,
}

impl Route {
    fn empty(destination: IpAddr) -> Self {
        Self {
            destination,
            oif: None,
            gateway: None,
            prefsrc: None,
            unicast: false,
            local: false,
            locked_mtu: None,
        }
    }
}

impl Route {
    /// The address whose MAC a frame to `destination` is sent to.
    pub fn next_hop(&self) -> IpAddr {
        self.gateway.unwrap_or(self.destination)
    }
}

/// An rtnetlink socket in the calling thread's network namespace.
pub struct Netlink {
    socket: netlink_sys::Socket,
    seq: u32,
}

impl Netlink {
    pub fn open() -> Result<Self, NetlinkError> {
        let mut socket = netlink_sys::Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .connect(&netlink_sys::SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        nix::sys::socket::setsockopt(&socket, ReceiveTimeout, &REPLY_TIMEOUT)
            .map_err(|e| NetlinkError::Socket(e.into()))?;
        Ok(Self { socket, seq: 0 })
    }

    /// The interface called `name`, or None if there is none.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>, NetlinkError> {
        check_ifname(name)?;
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.link(msg)
    }

    /// The interface with index `index`, or None if there is none.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.link(msg)
    }

    fn link(&mut self, msg: LinkMessage) -> Result<Option<Link>, NetlinkError> {
        const REQ: &str = "get link";
        match self.request(REQ, RouteNetlinkMessage::GetLink(msg), false) {
            Ok(replies) => Ok(replies.iter().find_map(|r| match r {
                RouteNetlinkMessage::NewLink(l) => Some(link_from(l)),
                _ => None,
            })),
            Err(NetlinkError::Io { source, .. })
                if source.raw_os_error() == Some(Errno::ENODEV as i32) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Every neighbour table entry of one family (IPv4: ARP, IPv6: NDP),
    /// whatever its state.
    pub fn neighbours(&mut self, ipv6: bool) -> Result<Vec<Neighbour>, NetlinkError> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = if ipv6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let replies = self.request(
            "dump neighbours",
            RouteNetlinkMessage::GetNeighbour(msg),
            true,
        )?;
        Ok(replies
            .iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewNeighbour(n) => neighbour_from(n),
                _ => None,
            })
            .collect())
    }

    /// The first usable entry for `addr` on any interface (what
    /// `ip neigh show ADDR` would list with a MAC).
    pub fn neighbour(&mut self, addr: IpAddr) -> Result<Option<Neighbour>, NetlinkError> {
        Ok(self
            .neighbours(addr.is_ipv6())?
            .into_iter()
            .find(|n| n.addr == addr && n.usable()))
    }

    /// A usable entry for `addr`: from the table, else after making the
    /// kernel resolve it (a datagram to the discard port, which needs the
    /// neighbour's MAC before it can leave), waiting at most `wait`. None
    /// when it is still unresolved then.
    pub fn resolve(
        &mut self,
        addr: IpAddr,
        wait: Duration,
    ) -> Result<Option<Neighbour>, NetlinkError> {
        if let Some(n) = self.neighbour(addr)? {
            return Ok(Some(n));
        }
        let start = Instant::now();
        probe(addr);
        while start.elapsed() < wait {
            std::thread::sleep(RESOLVE_POLL);
            if let Some(n) = self.neighbour(addr)? {
                return Ok(Some(n));
            }
        }
        Ok(None)
    }

    /// The route the kernel would use for `destination` (`ip route get`).
    /// None when there is none (unreachable).
    pub fn route_get(&mut self, destination: IpAddr) -> Result<Option<Route>, NetlinkError> {
        self.route_query(destination, false)
            .map(|r| r.map(|m| route_from(&m, destination)))
    }

    /// Whether the routing table entry `destination` matches has more than
    /// one next hop (`ip route get fibmatch`): then the path depends on the
    /// flow's hash, not the destination alone.
    pub fn route_is_multipath(&mut self, destination: IpAddr) -> Result<bool, NetlinkError> {
        Ok(self.route_query(destination, true)?.is_some_and(|m| {
            m.attributes
                .iter()
                .any(|a| matches!(a, RouteAttribute::MultiPath(_)))
        }))
    }

    fn route_query(
        &mut self,
        destination: IpAddr,
        fib_match: bool,
    ) -> Result<Option<RouteMessage>, NetlinkError> {
        let mut msg = RouteMessage::default();
        if fib_match {
            msg.header.flags = netlink_packet_route::route::RouteFlags::FibMatch;
        }
        let (family, len) = match destination {
            IpAddr::V4(_) => (AddressFamily::Inet, 32),
            IpAddr::V6(_) => (AddressFamily::Inet6, 128),
        };
        msg.header.address_family = family;
        msg.header.destination_prefix_length = len;
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(destination)));
        match self.request("get route", RouteNetlinkMessage::GetRoute(msg), false) {
            Ok(replies) => Ok(replies.into_iter().find_map(|r| match r {
                RouteNetlinkMessage::NewRoute(m) => Some(m),
                _ => None,
            })),
            Err(NetlinkError::Io { source, .. })
                if matches!(
                    source.raw_os_error().map(Errno::from_raw),
                    Some(Errno::ENETUNREACH | Errno::EHOSTUNREACH)
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether routing depends on more than the destination: policy
    /// rules beyond the kernel's defaults (local, main, default). Then the
    /// kernel's answer for a forwarded packet may differ from
    /// `route_get`'s for its destination.
    pub fn policy_rules(&mut self, ipv6: bool) -> Result<bool, NetlinkError> {
        let family = if ipv6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let mut rule = RuleMessage::default();
        rule.header.family = family;
        let rules = self.request("dump rules", RouteNetlinkMessage::GetRule(rule), true)?;
        let defaults: &[(u32, u32)] = if ipv6 {
            &[(0, 255), (32766, 254)]
        } else {
            &[(0, 255), (32766, 254), (32767, 253)]
        };
        for r in &rules {
            let RouteNetlinkMessage::NewRule(m) = r else {
                continue;
            };
            let mut prio = 0;
            let mut table = u32::from(m.header.table);
            let mut other = false;
            for a in &m.attributes {
                match a {
                    RuleAttribute::Priority(p) => prio = *p,
                    RuleAttribute::Table(t) => table = *t,
                    // Present on every rule, "none" (-1) by default.
                    RuleAttribute::Protocol(_) => {}
                    RuleAttribute::SuppressPrefixLen(v) | RuleAttribute::SuppressIfGroup(v)
                        if *v == u32::MAX => {}
                    _ => other = true,
                }
            }
            if other || !defaults.contains(&(prio, table)) {
                if std::env::var_os("RIVORA_NEXTHOP_DEBUG").is_some() {
                    eprintln!("policy rule: {m:?}");
                }
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Send one request and collect its replies: every message up to
    /// NLMSG_DONE for a dump, else the one answer.
    fn request(
        &mut self,
        request: &'static str,
        msg: RouteNetlinkMessage,
        dump: bool,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let io = |source: std::io::Error| NetlinkError::Io { request, source };
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = self.seq;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.socket.send(&buf, 0).map_err(io)?;

        let mut out = Vec::new();
        loop {
            let (datagram, _) = self.socket.recv_from_full().map_err(io)?;
            if parse_replies(request, &datagram, self.seq, dump, &mut out)? {
                return Ok(out);
            }
        }
    }
}

/// Walk the netlink messages in one datagram, appending those that answer
/// request `seq` to `out`. True when the answer is complete (NLMSG_DONE, an
/// acknowledgement, or the single reply to a non-dump request).
fn parse_replies(
    request: &'static str,
    mut datagram: &[u8],
    seq: u32,
    dump: bool,
    out: &mut Vec<RouteNetlinkMessage>,
) -> Result<bool, NetlinkError> {
    while !datagram.is_empty() {
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(datagram)
            .map_err(|source| NetlinkError::Decode { request, source })?;
        // Messages are padded to 4 bytes (NLMSG_ALIGN); the last may not be.
        let len = (msg.header.length as usize + 3) & !3;
        if len == 0 {
            return Err(NetlinkError::Decode {
                request,
                source: DecodeError::from("zero-length netlink message"),
            });
        }
        datagram = datagram.get(len..).unwrap_or_default();
        if msg.header.sequence_number != seq {
            // A late answer to an earlier request that timed out.
            continue;
        }
        match msg.payload {
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => match e.code {
                None => return Ok(true),
                Some(_) => {
                    return Err(NetlinkError::Io {
                        request,
                        source: e.to_io(),
                    })
                }
            },
            NetlinkPayload::InnerMessage(m) => {
                out.push(m);
                if !dump {
                    return Ok(true);
                }
            }
            NetlinkPayload::Overrun(_) => {
                return Err(NetlinkError::Io {
                    request,
                    source: std::io::Error::from_raw_os_error(Errno::ENOBUFS as i32),
                })
            }
            _ => {}
        }
    }
    Ok(false)
}

fn check_ifname(name: &str) -> Result<(), NetlinkError> {
    if name.is_empty() || name.len() > MAX_IFNAME_LEN || name.contains('\0') {
        return Err(NetlinkError::BadName(name.to_string()));
    }
    Ok(())
}

fn mac_from(bytes: &[u8]) -> Option<Mac> {
    bytes.try_into().ok().map(Mac)
}

fn link_from(msg: &LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mac: None,
        mtu: None,
    };
    for a in &msg.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(b) => link.mac = mac_from(b),
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            _ => {}
        }
    }
    link
}

/// None for entries without an IP destination (bridge FDB entries come
/// through the same message type).
fn neighbour_from(msg: &NeighbourMessage) -> Option<Neighbour> {
    let mut addr = None;
    let mut mac = None;
    for a in &msg.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                addr = Some(IpAddr::V4(*a))
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                addr = Some(IpAddr::V6(*a))
            }
            NeighbourAttribute::LinkLayerAddress(b) => mac = mac_from(b),
            _ => {}
        }
    }
    Some(Neighbour {
        addr: addr?,
        ifindex: msg.header.ifindex,
        mac,
        state: msg.header.state,
    })
}

fn route_from(msg: &RouteMessage, destination: IpAddr) -> Route {
    let ip = |a: &RouteAddress| match a {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    };
    let mut route = Route {
        unicast: msg.header.kind == RouteType::Unicast,
        local: msg.header.kind == RouteType::Local,
        ..Route::empty(destination)
    };
    let (mut mtu, mut lock) = (None, 0u32);
    for a in &msg.attributes {
        match a {
            RouteAttribute::Oif(i) => route.oif = Some(*i),
            RouteAttribute::Gateway(g) => route.gateway = ip(g),
            RouteAttribute::PrefSource(s) => route.prefsrc = ip(s),
            RouteAttribute::Metrics(ms) => {
                for m in ms {
                    match m {
                        RouteMetric::Mtu(v) => mtu = Some(*v),
                        RouteMetric::Lock(v) => lock = *v,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    // RTAX_LOCK's bit for RTAX_MTU (2).
    if lock & (1 << 2) != 0 {
        route.locked_mtu = mtu;
    }
    route
}

/// rtnetlink multicast groups (legacy bit masks, RTNLGRP_* - 1).
const GROUPS: u32 = (1 << 0) // RTNLGRP_LINK
    | (1 << 2) // RTNLGRP_NEIGH
    | (1 << 4) // RTNLGRP_IPV4_IFADDR
    | (1 << 6) // RTNLGRP_IPV4_ROUTE
    | (1 << 7) // RTNLGRP_IPV4_RULE
    | (1 << 8) // RTNLGRP_IPV6_IFADDR
    | (1 << 10) // RTNLGRP_IPV6_ROUTE
    | (1 << 18) // RTNLGRP_IPV6_RULE
    | (1 << 23) // RTNLGRP_IPV4_NETCONF
    | (1 << 24); // RTNLGRP_IPV6_NETCONF

/// A socket that hears the kernel's link, address, neighbour, route,
/// rule and forwarding-setting changes in the calling thread's network
/// namespace.
pub struct Changes {
    socket: netlink_sys::Socket,
}

impl Changes {
    pub fn open() -> Result<Self, NetlinkError> {
        let mut socket = netlink_sys::Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket
            .bind(&netlink_sys::SocketAddr::new(0, GROUPS))
            .map_err(NetlinkError::Socket)?;
        Ok(Self { socket })
    }

    /// Wait up to `timeout` for notifications; how many arrived (an
    /// overrun counts as one: something changed). Their content is not
    /// decoded: any change means asking again.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, NetlinkError> {
        let io = |source: std::io::Error| NetlinkError::Io {
            request: "notifications",
            source,
        };
        let tv = TimeVal::new(
            timeout.as_secs() as i64,
            i64::from(timeout.subsec_micros()).max(1),
        );
        nix::sys::socket::setsockopt(&self.socket, ReceiveTimeout, &tv)
            .map_err(|e| io(e.into()))?;
        let mut n = 0;
        loop {
            match self.socket.recv_from_full() {
                Ok(_) => {
                    n += 1;
                    // Take what else is queued without waiting again.
                    let zero = TimeVal::new(0, 1);
                    nix::sys::socket::setsockopt(&self.socket, ReceiveTimeout, &zero)
                        .map_err(|e| io(e.into()))?;
                }
                Err(e)
                    if matches!(
                        e.raw_os_error().map(Errno::from_raw),
                        Some(Errno::EAGAIN | Errno::EINTR)
                    ) =>
                {
                    return Ok(n);
                }
                Err(e) if e.raw_os_error() == Some(Errno::ENOBUFS as i32) => n += 1,
                Err(e) => return Err(io(e)),
            }
        }
    }
}

/// Make the kernel resolve `addr`: a datagram to it cannot leave before
/// the neighbour's MAC is known, so sending one starts ARP or NDP. Port 9
/// (discard) so that a backend that does receive it does nothing.
pub fn probe(addr: IpAddr) {
    let bind: SocketAddr = match addr {
        IpAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    // Best effort: if it cannot be sent, the wait ends in the caller's
    // "unresolved" error, which names the address.
    if let Ok(s) = UdpSocket::bind(bind) {
        let _ = s.send_to(b"", SocketAddr::new(addr, 9));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use netlink_packet_core::{DoneMessage, ErrorMessage};

    fn frame(seq: u32, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        let mut m = NetlinkMessage::new(header, payload);
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        buf
    }

    fn neigh(addr: IpAddr, mac: Option<[u8; 6]>, state: NeighbourState) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = if addr.is_ipv6() {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        m.header.ifindex = 7;
        m.header.state = state;
        m.attributes
            .push(NeighbourAttribute::Destination(match addr {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        if let Some(mac) = mac {
            m.attributes
                .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        }
        m
    }

    fn new_neigh(m: NeighbourMessage) -> NetlinkPayload<RouteNetlinkMessage> {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(m))
    }

    fn parse_all(datagrams: &[Vec<u8>], seq: u32, dump: bool) -> (bool, Vec<RouteNetlinkMessage>) {
        let mut out = Vec::new();
        for d in datagrams {
            if parse_replies("test", d, seq, dump, &mut out).expect("parses") {
                return (true, out);
            }
        }
        (false, out)
    }

    #[test]
    fn dump_spans_datagrams_until_done() {
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let b = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2));
        let mut first = frame(
            5,
            new_neigh(neigh(
                a,
                Some([2, 0, 0, 0, 0, 2]),
                NeighbourState::Reachable,
            )),
        );
        first.extend(frame(
            5,
            new_neigh(neigh(b, None, NeighbourState::Incomplete)),
        ));
        let second = frame(5, NetlinkPayload::Done(DoneMessage::default()));

        let (done, out) = parse_all(&[first.clone()], 5, true);
        assert!(!done, "a dump is not complete before NLMSG_DONE");
        assert_eq!(out.len(), 2);

        let (done, out) = parse_all(&[first, second], 5, true);
        assert!(done);
        let ns: Vec<Neighbour> = out
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => neighbour_from(n),
                _ => None,
            })
            .collect();
        assert_eq!(
            ns,
            vec![
                Neighbour {
                    addr: a,
                    ifindex: 7,
                    mac: Some(Mac([2, 0, 0, 0, 0, 2])),
                    state: NeighbourState::Reachable,
                },
                Neighbour {
                    addr: b,
                    ifindex: 7,
                    mac: None,
                    state: NeighbourState::Incomplete,
                },
            ]
        );
    }

    #[test]
    fn replies_to_other_requests_are_skipped() {
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let mut d = frame(4, new_neigh(neigh(a, Some([1; 6]), NeighbourState::Stale)));
        d.extend(frame(4, NetlinkPayload::Done(DoneMessage::default())));
        let (done, out) = parse_all(&[d], 5, true);
        assert!(!done);
        assert!(out.is_empty());
    }

    #[test]
    fn kernel_error_becomes_io_error_and_ack_ends() {
        let mut err = ErrorMessage::default();
        err.code = std::num::NonZeroI32::new(-(Errno::ENODEV as i32));
        let d = frame(9, NetlinkPayload::Error(err));
        let mut out = Vec::new();
        match parse_replies("get link", &d, 9, false, &mut out) {
            Err(NetlinkError::Io { request, source }) => {
                assert_eq!(request, "get link");
                assert_eq!(source.raw_os_error(), Some(Errno::ENODEV as i32));
            }
            other => panic!("want an io error, got {other:?}"),
        }

        let ack = frame(9, NetlinkPayload::Error(ErrorMessage::default()));
        assert!(parse_replies("get link", &ack, 9, false, &mut out).expect("ack parses"));
        assert!(out.is_empty());
    }

    #[test]
    fn truncated_datagram_is_a_decode_error() {
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let d = frame(
            1,
            new_neigh(neigh(a, Some([1; 6]), NeighbourState::Reachable)),
        );
        let mut out = Vec::new();
        assert!(matches!(
            parse_replies("dump neighbours", &d[..d.len() - 5], 1, true, &mut out),
            Err(NetlinkError::Decode { .. })
        ));
    }

    #[test]
    fn usable_states_match_ip_neigh_show() {
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let n = |mac: Option<Mac>, state| Neighbour {
            addr: a,
            ifindex: 1,
            mac,
            state,
        };
        let m = Some(Mac([2, 0, 0, 0, 0, 9]));
        for s in [
            NeighbourState::Reachable,
            NeighbourState::Stale,
            NeighbourState::Delay,
            NeighbourState::Probe,
            NeighbourState::Permanent,
        ] {
            assert!(n(m, s).usable(), "{s:?}");
            assert!(!n(None, s).usable(), "{s:?} without a MAC");
        }
        for s in [
            NeighbourState::Incomplete,
            NeighbourState::Failed,
            NeighbourState::Noarp,
            NeighbourState::None,
        ] {
            assert!(!n(m, s).usable(), "{s:?}");
        }
    }

    #[test]
    fn link_attributes() {
        let mut m = LinkMessage::default();
        m.header.index = 3;
        m.attributes.push(LinkAttribute::IfName("eth0".into()));
        m.attributes
            .push(LinkAttribute::Address(vec![2, 0xaa, 0, 0, 0, 1]));
        m.attributes.push(LinkAttribute::Mtu(1500));
        assert_eq!(
            link_from(&m),
            Link {
                index: 3,
                name: "eth0".into(),
                mac: Some(Mac([2, 0xaa, 0, 0, 0, 1])),
                mtu: Some(1500),
            }
        );
        // An L3 device has no link-layer address; an odd-sized one is not
        // an Ethernet MAC.
        let mut tun = LinkMessage::default();
        tun.attributes
            .push(LinkAttribute::Address(vec![1, 2, 3, 4]));
        assert_eq!(link_from(&tun).mac, None);
    }

    #[test]
    fn route_gateway_is_next_hop() {
        let dst = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));
        let gw = Ipv4Addr::new(10, 0, 0, 1);
        let mut m = RouteMessage::default();
        m.attributes.push(RouteAttribute::Oif(4));
        m.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(gw)));
        let r = route_from(&m, dst);
        assert_eq!(r.oif, Some(4));
        assert_eq!(r.next_hop(), IpAddr::V4(gw));
        assert_eq!(route_from(&RouteMessage::default(), dst).next_hop(), dst);
    }

    #[test]
    fn interface_names_the_kernel_would_truncate_are_refused() {
        assert!(check_ifname("eth0").is_ok());
        assert!(check_ifname(&"a".repeat(15)).is_ok());
        assert!(check_ifname(&"a".repeat(16)).is_err());
        assert!(check_ifname("").is_err());
        assert!(check_ifname("a\0b").is_err());
    }
}
