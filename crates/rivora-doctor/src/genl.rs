//! The `netdev` generic netlink family (Linux 6.3+): what XDP each
//! interface's driver supports natively (`xdp-features`), the kernel's own
//! answer to "native or generic?" (`ip` and ethtool do not show it).
//!
//! Generic netlink is a header of its own (command, version) after
//! netlink's, then attributes; the family's id is asked of the
//! controller (`nlctrl`) by name first.

use std::collections::BTreeMap;
use std::io;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable, Nla, NlaBuffer, NlasIterator, Parseable, NLA_F_NESTED,
    NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_sys::protocols::NETLINK_GENERIC;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;

/// enum netdev_xdp_act (linux/netdev.h).
pub const XDP_ACT_BASIC: u64 = 1;
pub const XDP_ACT_REDIRECT: u64 = 2;
pub const XDP_ACT_NDO_XMIT: u64 = 4;

/// One generic netlink message: the family (netlink's message type), its
/// command and version, and attributes.
#[derive(Debug, Clone)]
struct Genl {
    family: u16,
    cmd: u8,
    version: u8,
    nlas: Vec<DefaultNla>,
}

impl NetlinkSerializable for Genl {
    fn message_type(&self) -> u16 {
        self.family
    }
    fn buffer_len(&self) -> usize {
        4 + self.nlas.as_slice().buffer_len()
    }
    fn serialize(&self, buffer: &mut [u8]) {
        buffer[0] = self.cmd;
        buffer[1] = self.version;
        buffer[2] = 0;
        buffer[3] = 0;
        self.nlas.as_slice().emit(&mut buffer[4..]);
    }
}

impl NetlinkDeserializable for Genl {
    type Error = DecodeError;
    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        if payload.len() < 4 {
            return Err(DecodeError::from("a generic netlink header is 4 bytes"));
        }
        let mut nlas = Vec::new();
        for nla in NlasIterator::new(&payload[4..]) {
            let nla: NlaBuffer<&[u8]> = nla?;
            nlas.push(DefaultNla::parse(&nla)?);
        }
        Ok(Self {
            family: header.message_type,
            cmd: payload[0],
            version: payload[1],
            nlas,
        })
    }
}

fn value(nla: &DefaultNla) -> Vec<u8> {
    let mut v = vec![0u8; nla.value_len()];
    nla.emit_value(&mut v);
    v
}

fn kind(nla: &DefaultNla) -> u16 {
    nla.kind() & !NLA_F_NESTED
}

struct Socket {
    socket: netlink_sys::Socket,
    seq: u32,
}

impl Socket {
    fn open() -> io::Result<Self> {
        let mut socket = netlink_sys::Socket::new(NETLINK_GENERIC)?;
        socket.bind_auto()?;
        socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        Ok(Self { socket, seq: 0 })
    }

    fn request(&mut self, msg: Genl, dump: bool) -> io::Result<Vec<Genl>> {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        let mut out = Vec::new();
        loop {
            let (data, _) = self.socket.recv_from_full()?;
            let mut offset = 0;
            while offset < data.len() {
                let reply = NetlinkMessage::<Genl>::deserialize(&data[offset..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = reply.header.length as usize;
                match reply.payload {
                    NetlinkPayload::InnerMessage(m) => {
                        out.push(m);
                        if !dump {
                            return Ok(out);
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                            None => Ok(out),
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

    /// A family's id by name; None when the kernel has no such family.
    fn family(&mut self, name: &str) -> io::Result<Option<u16>> {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let req = Genl {
            family: GENL_ID_CTRL,
            cmd: CTRL_CMD_GETFAMILY,
            version: 1,
            nlas: vec![DefaultNla::new(CTRL_ATTR_FAMILY_NAME, n)],
        };
        let replies = match self.request(req, false) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(replies
            .iter()
            .flat_map(|m| m.nlas.iter())
            .find(|a| kind(a) == CTRL_ATTR_FAMILY_ID)
            .and_then(|a| {
                let v = value(a);
                (v.len() >= 2).then(|| u16::from_ne_bytes([v[0], v[1]]))
            }))
    }
}

/// Each interface's `xdp-features` (NETDEV_XDP_ACT_* bits) by ifindex, in
/// the calling thread's network namespace. None when the kernel has no
/// `netdev` family (before 6.3).
pub fn xdp_features() -> io::Result<Option<BTreeMap<u32, u64>>> {
    let mut s = Socket::open()?;
    let Some(family) = s.family("netdev")? else {
        return Ok(None);
    };
    let replies = s.request(
        Genl {
            family,
            cmd: NETDEV_CMD_DEV_GET,
            version: 1,
            nlas: Vec::new(),
        },
        true,
    )?;
    let mut out = BTreeMap::new();
    for m in replies {
        let mut ifindex = None;
        let mut features = 0u64;
        for a in &m.nlas {
            let v = value(a);
            match kind(a) {
                NETDEV_A_DEV_IFINDEX if v.len() >= 4 => {
                    ifindex = Some(u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
                }
                NETDEV_A_DEV_XDP_FEATURES if v.len() >= 8 => {
                    features = u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]))
                }
                _ => {}
            }
        }
        if let Some(i) = ifindex {
            out.insert(i, features);
        }
    }
    Ok(Some(out))
}
