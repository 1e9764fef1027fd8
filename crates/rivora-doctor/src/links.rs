//! Every interface of the calling thread's network namespace, with its
//! MTU and the XDP program attached to it, from one rtnetlink dump.

use std::io;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage, LinkXdp, XdpAttached};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;

/// An interface as the dump describes it.
#[derive(Debug, Clone, Default)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: Option<u32>,
    pub up: bool,
    pub loopback: bool,
    /// The XDP programs attached: (program id, "native", "generic" or
    /// "offload").
    pub xdp: Vec<(u32, &'static str)>,
}

pub fn dump() -> io::Result<Vec<Link>> {
    let mut socket = netlink_sys::Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetLink(LinkMessage::default())),
    );
    packet.finalize();
    let mut buf = vec![0u8; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let mut links = Vec::new();
    loop {
        let (data, _) = socket.recv_from_full()?;
        let mut offset = 0;
        while offset < data.len() {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = reply.header.length as usize;
            match reply.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                    links.push(link_from(&l))
                }
                NetlinkPayload::Done(_) => return Ok(links),
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        return Err(io::Error::from_raw_os_error(-code.get()));
                    }
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
    }
}

fn link_from(m: &LinkMessage) -> Link {
    let mut l = Link {
        index: m.header.index,
        up: m.header.flags.contains(LinkFlags::Up),
        loopback: m.header.flags.contains(LinkFlags::Loopback),
        ..Link::default()
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Mtu(mtu) => l.mtu = Some(*mtu),
            LinkAttribute::Xdp(xdp) => l.xdp = xdp_progs(xdp),
            _ => {}
        }
    }
    l
}

/// IFLA_XDP: one program (`ProgId` with its mode in `Attached`) or, in
/// several modes at once, one id per mode.
fn xdp_progs(xdp: &[LinkXdp]) -> Vec<(u32, &'static str)> {
    let mut out = Vec::new();
    let mut single = None;
    let mut mode = None;
    for a in xdp {
        match a {
            LinkXdp::DrvProgId(id) => out.push((*id, "native")),
            LinkXdp::SkbProgId(id) => out.push((*id, "generic")),
            LinkXdp::HwProgId(id) => out.push((*id, "offload")),
            LinkXdp::ProgId(id) => single = Some(*id),
            LinkXdp::Attached(a) => {
                mode = match a {
                    XdpAttached::Driver => Some("native"),
                    XdpAttached::SocketBuffer => Some("generic"),
                    XdpAttached::Hardware => Some("offload"),
                    _ => None,
                }
            }
            _ => {}
        }
    }
    if out.is_empty() {
        if let (Some(id), Some(mode)) = (single, mode) {
            if id != 0 {
                out.push((id, mode));
            }
        }
    }
    out
}
