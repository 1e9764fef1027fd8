//! Rendering: desired state plus allocations (ids, slice positions) to a
//! map image, every entry each map should hold. Pure: no maps, no root,
//! so it is what golden tests and property tests compare against.
//!
//! The image is decoded (addresses, ports in host order), so that it can
//! be compared, dumped and read back from the live maps by the same code.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::abi;
use crate::maglev;
use crate::model::{
    Affinity, BackendTarget, FullNatSettings, Mac, Mode, NodeSettings, Ports, RateLimit, Vip,
    VipKey,
};
use crate::source_range::SourceRange;

/// backend_health_map states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Health {
    Healthy,
    Draining,
    Down,
}

impl Health {
    pub fn raw(self) -> u8 {
        (match self {
            Health::Healthy => abi::rv_health::RV_HEALTH_HEALTHY,
            Health::Draining => abi::rv_health::RV_HEALTH_DRAINING,
            Health::Down => abi::rv_health::RV_HEALTH_DOWN,
        })
        .0 as u8
    }

    /// Unknown values read as down, as the datapath treats them.
    pub fn from_raw(v: u8) -> Self {
        match u32::from(v) {
            x if x == abi::rv_health::RV_HEALTH_HEALTHY.0 => Health::Healthy,
            x if x == abi::rv_health::RV_HEALTH_DRAINING.0 => Health::Draining,
            _ => Health::Down,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Draining => "draining",
            Health::Down => "down",
        }
    }
}

/// A VIP match entry: exact (vip_map, vip_map6) or one prefix block of a
/// port range (vip_range_map, vip_range_map6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MatchKey {
    Exact {
        addr: IpAddr,
        port: u16,
        proto: u8,
    },
    /// Ports `port ..= port + 2^(16 - port_bits) - 1`; `port` is aligned.
    Range {
        addr: IpAddr,
        proto: u8,
        port: u16,
        port_bits: u8,
    },
}

impl MatchKey {
    pub fn addr(&self) -> IpAddr {
        match self {
            MatchKey::Exact { addr, .. } | MatchKey::Range { addr, .. } => *addr,
        }
    }

    /// The LPM prefix length of a range block: the protocol byte, the
    /// three pad bytes and the address always count, then the port bits.
    pub fn prefixlen(addr: IpAddr, port_bits: u8) -> u32 {
        let fixed = match addr {
            IpAddr::V4(_) => 8 + 24 + 32,
            IpAddr::V6(_) => 8 + 24 + 128,
        };
        fixed + u32::from(port_bits)
    }
}

/// Decompose an inclusive port range into the fewest aligned power-of-two
/// blocks (base, prefix bits of the port), in ascending order.
pub fn range_blocks(first: u16, last: u16) -> Vec<(u16, u8)> {
    let mut out = Vec::new();
    let mut lo = u32::from(first);
    let hi = u32::from(last);
    while lo <= hi {
        // Largest k with lo aligned to 2^k and the block inside [lo, hi].
        let mut k = if lo == 0 {
            16
        } else {
            lo.trailing_zeros().min(16)
        };
        while lo + (1 << k) - 1 > hi {
            k -= 1;
        }
        out.push((lo as u16, (16 - k) as u8));
        lo += 1 << k;
    }
    out
}

/// Every match entry of a VIP.
pub fn match_keys(key: &VipKey) -> Vec<MatchKey> {
    let proto = key.proto.number();
    match key.ports {
        Ports::One(port) => vec![MatchKey::Exact {
            addr: key.addr,
            port,
            proto,
        }],
        Ports::Range { first, last } => range_blocks(first, last)
            .into_iter()
            .map(|(port, port_bits)| MatchKey::Range {
                addr: key.addr,
                proto,
                port,
                port_bits,
            })
            .collect(),
    }
}

/// service_config_map's value, field for field (raw, so that whatever the
/// maps hold can be read back and compared).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceEntry {
    pub mode: u8,
    pub affinity: u8,
    pub family: u8,
    pub proto: u8,
    pub flags: u32,
    pub slice_start: u32,
    pub slice_len: u32,
    pub backend_count: u32,
    pub affinity_timeout_s: u32,
}

impl ServiceEntry {
    pub fn is_active(&self) -> bool {
        self.flags & abi::rv_service_flags::RV_SVC_F_ACTIVE.0 != 0
    }

    pub fn to_abi(&self) -> abi::rv_service {
        abi::rv_service {
            mode: self.mode,
            affinity: self.affinity,
            family: self.family,
            proto: self.proto,
            flags: self.flags,
            slice_start: self.slice_start,
            slice_len: self.slice_len,
            backend_count: self.backend_count,
            affinity_timeout_s: self.affinity_timeout_s,
        }
    }

    pub fn from_abi(s: &abi::rv_service) -> Self {
        Self {
            mode: s.mode,
            affinity: s.affinity,
            family: s.family,
            proto: s.proto,
            flags: s.flags,
            slice_start: s.slice_start,
            slice_len: s.slice_len,
            backend_count: s.backend_count,
            affinity_timeout_s: s.affinity_timeout_s,
        }
    }
}

pub fn mode_raw(m: Mode) -> u8 {
    (match m {
        Mode::Nat => abi::rv_mode::RV_MODE_NAT,
        Mode::Dsr => abi::rv_mode::RV_MODE_DSR,
        Mode::L3Dsr => abi::rv_mode::RV_MODE_L3DSR,
        Mode::FullNat => abi::rv_mode::RV_MODE_FULLNAT,
    })
    .0 as u8
}

pub fn mode_from_raw(v: u8) -> Option<Mode> {
    match u32::from(v) {
        x if x == abi::rv_mode::RV_MODE_NAT.0 => Some(Mode::Nat),
        x if x == abi::rv_mode::RV_MODE_DSR.0 => Some(Mode::Dsr),
        x if x == abi::rv_mode::RV_MODE_L3DSR.0 => Some(Mode::L3Dsr),
        x if x == abi::rv_mode::RV_MODE_FULLNAT.0 => Some(Mode::FullNat),
        _ => None,
    }
}

/// A backend's cached next hop (`struct rv_nexthop`): what
/// bpf_fib_lookup would answer for its address. The default (flags 0) is
/// none: the datapath asks the FIB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NextHop {
    pub ifindex: u32,
    pub mtu: u32,
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    pub flags: u8,
}

impl NextHop {
    pub const VALID: u8 = abi::rv_nexthop_flags::RV_NH_F_VALID.0 as u8;
    pub const KERNEL: u8 = abi::rv_nexthop_flags::RV_NH_F_KERNEL.0 as u8;
    pub const STALE: u8 = abi::rv_nexthop_flags::RV_NH_F_STALE.0 as u8;
    pub const TX_ONLY: u8 = abi::rv_nexthop_flags::RV_NH_F_TX_ONLY.0 as u8;

    /// Send out of `ifindex` to `dmac` from `smac`; larger than `mtu`:
    /// the kernel's.
    pub fn send(ifindex: u32, mtu: u32, dmac: [u8; 6], smac: [u8; 6]) -> Self {
        Self {
            ifindex,
            mtu,
            dmac,
            smac,
            flags: Self::VALID,
        }
    }

    /// The FIB's egress is not an interface rivorad is attached to.
    pub fn kernel(ifindex: u32) -> Self {
        Self {
            ifindex,
            flags: Self::KERNEL,
            ..Default::default()
        }
    }

    /// The same next hop, no longer to be used (the FIB is asked).
    pub fn stale(self) -> Self {
        Self {
            flags: self.flags | Self::STALE,
            ..self
        }
    }

    pub fn is_none(&self) -> bool {
        self.flags == 0
    }

    /// The next hop's own fields (the two bytes the backend's mode and
    /// full-NAT source share with it are [`BackendEntry::nexthop_abi`]'s).
    pub fn to_abi(&self) -> abi::rv_nexthop {
        abi::rv_nexthop {
            ifindex: self.ifindex,
            mtu: self.mtu,
            dmac: self.dmac,
            smac: self.smac,
            flags: self.flags,
            ..Default::default()
        }
    }

    pub fn from_abi(n: &abi::rv_nexthop) -> Self {
        Self {
            ifindex: n.ifindex,
            mtu: n.mtu,
            dmac: n.dmac,
            smac: n.smac,
            flags: n.flags,
        }
    }
}

/// backend_map / backend_map6 value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendEntry {
    pub addr: IpAddr,
    /// 0: the port the client connected to.
    pub port: u16,
    pub mac: [u8; 6],
    /// Written beside the backend; the writer keeps it current
    /// ([`crate::dataplane::Writer::set_next_hops`]).
    pub nexthop: NextHop,
    /// Its own mode, when not its VIP's (`rv_nexthop.mode`).
    pub mode: Option<Mode>,
    /// Full NAT's source towards it: an index of fullnat_src_map, 0 for
    /// none (`rv_nexthop.fullnat_src`).
    pub fullnat_src: u8,
}

impl BackendEntry {
    /// The next hop as the map holds it, with the two bytes it shares
    /// with the backend's mode and full-NAT source.
    pub fn nexthop_abi(&self) -> abi::rv_nexthop {
        abi::rv_nexthop {
            mode: self.mode.map_or(0, mode_raw),
            fullnat_src: self.fullnat_src,
            ..self.nexthop.to_abi()
        }
    }
}

/// nat_owner_map{,6} key: a backend's address, the port a NAT VIP sends
/// to it on, the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NatOwnerKey {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: u8,
}

/// nat_owner_map{,6} value: the VIP whose flows to that backend record
/// no reverse entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NatOwner {
    pub svc_id: u32,
    pub backend_id: u32,
    pub vip: IpAddr,
    pub vip_port: u16,
}

/// The owner key a NAT VIP would hold for its `i`-th backend, if it can
/// own one: an exact port (a range's port-0 backends see many ports) and
/// no clientIP affinity (its affinity entries name the client, not the
/// flow, so they could not prove a reply belongs to one).
pub fn nat_owner_key(vip: &Vip, b: &crate::model::Backend) -> Option<NatOwnerKey> {
    let Ports::One(vport) = vip.ports else {
        return None;
    };
    if b.mode_in(vip.mode) != Mode::Nat || vip.affinity != Affinity::None {
        return None;
    }
    Some(NatOwnerKey {
        addr: b.addr,
        port: if b.port == 0 { vport } else { b.port },
        proto: vip.proto.number(),
    })
}

/// tunnel_ep_map's entries of a VIP whose backends got `ids`: the
/// backends this node reaches by NAT that a source placed on a node
/// (Kubernetes' endpoints on this node), by address. Another node's DSR
/// across nodes tunnels to their addresses through this one. The first
/// backend at an address takes it: the tunnel's outer destination names an
/// address, not a port.
pub fn tunnel_eps(vip: &Vip, ids: &[u32]) -> BTreeMap<IpAddr, u32> {
    let mut eps = BTreeMap::new();
    for (b, id) in vip.backends.iter().zip(ids) {
        if b.node.is_some() && b.mode_in(vip.mode) == Mode::Nat {
            eps.entry(b.addr).or_insert(*id);
        }
    }
    eps
}

/// vip_filter_map's bits for a set of VIP addresses.
pub fn vip_filter(addrs: impl IntoIterator<Item = IpAddr>) -> [u64; abi::VIP_FILTER_WORDS] {
    let mut w = [0u64; abi::VIP_FILTER_WORDS];
    for a in addrs {
        let b = abi::vip_filter_bit(a) as usize;
        w[b / 64] |= 1 << (b % 64);
    }
    w
}

/// fullnat_config_map's entry: the ports and timeouts of the node's
/// settings, and the filter of the sources in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FullNatConfig {
    pub port_min: u16,
    pub port_max: u16,
    pub tcp_timeout_ms: u32,
    pub tcp_closing_timeout_ms: u32,
    pub udp_timeout_ms: u32,
    pub src_filter: u64,
}

impl FullNatConfig {
    /// The settings' entry, with the filter of `srcs`.
    pub fn new(f: &FullNatSettings, srcs: &BTreeMap<u8, IpAddr>) -> Self {
        Self {
            port_min: f.port_min,
            port_max: f.port_max,
            tcp_timeout_ms: f.tcp_timeout_ms,
            tcp_closing_timeout_ms: f.tcp_closing_timeout_ms,
            udp_timeout_ms: f.udp_timeout_ms,
            src_filter: srcs
                .values()
                .fold(0, |bits, a| bits | 1 << abi::fullnat_src_bit(*a)),
        }
    }

    pub fn to_abi(&self) -> abi::rv_fullnat_config {
        abi::rv_fullnat_config {
            port_min: self.port_min,
            port_max: self.port_max,
            tcp_timeout_ms: self.tcp_timeout_ms,
            tcp_closing_timeout_ms: self.tcp_closing_timeout_ms,
            udp_timeout_ms: self.udp_timeout_ms,
            src_filter: self.src_filter,
        }
    }

    pub fn from_abi(c: &abi::rv_fullnat_config) -> Self {
        Self {
            port_min: c.port_min,
            port_max: c.port_max,
            tcp_timeout_ms: c.tcp_timeout_ms,
            tcp_closing_timeout_ms: c.tcp_closing_timeout_ms,
            udp_timeout_ms: c.udp_timeout_ms,
            src_filter: c.src_filter,
        }
    }

    /// The settings these ports and timeouts stand for (the sources are
    /// fullnat_src_map's, not settings).
    pub fn settings(&self) -> FullNatSettings {
        FullNatSettings {
            src4: None,
            src6: None,
            port_min: self.port_min,
            port_max: self.port_max,
            tcp_timeout_ms: self.tcp_timeout_ms,
            tcp_closing_timeout_ms: self.tcp_closing_timeout_ms,
            udp_timeout_ms: self.udp_timeout_ms,
        }
    }
}

/// Node-wide map contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeImage {
    pub syn_rate_limit: Option<RateLimit>,
    pub tunnel_src4: Option<Ipv4Addr>,
    pub tunnel_src6: Option<Ipv6Addr>,
    pub interface_macs: BTreeMap<u32, Mac>,
    /// Of those, the ones attached as generic XDP (not redirect targets).
    pub generic_xdp: BTreeSet<u32>,
    pub fullnat: FullNatConfig,
    /// fullnat_src_map: the sources full NAT sends from, by index.
    pub fullnat_srcs: BTreeMap<u8, IpAddr>,
}

impl NodeImage {
    /// The settings' image with full NAT's sources `srcs`.
    pub fn from_settings(n: &NodeSettings, srcs: &BTreeMap<u8, IpAddr>) -> Self {
        Self {
            syn_rate_limit: n.syn_rate_limit,
            tunnel_src4: n.tunnel_src4,
            tunnel_src6: n.tunnel_src6,
            interface_macs: n.interface_macs.clone(),
            generic_xdp: n.generic_xdp.clone(),
            fullnat: FullNatConfig::new(&n.fullnat, srcs),
            fullnat_srcs: srcs.clone(),
        }
    }
}

/// Every entry the maps should hold (arrays: every entry that is not the
/// cleared value). Unallocated backend ids are cleared as "no backend,
/// down" so that a stale affinity entry naming one re-picks instead of
/// forwarding to nothing; they are not listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapImage {
    pub matches: BTreeMap<MatchKey, u32>,
    pub services: BTreeMap<u32, ServiceEntry>,
    /// Non-empty Maglev slots: slot -> backend id.
    pub slots: BTreeMap<u32, u32>,
    pub backends: BTreeMap<u32, BackendEntry>,
    pub health: BTreeMap<u32, Health>,
    pub svc_rate_limits: BTreeMap<u32, RateLimit>,
    pub nat_owners: BTreeMap<NatOwnerKey, NatOwner>,
    /// tunnel_ep_map: (service id, endpoint address) to backend id.
    pub tunnel_eps: BTreeMap<(u32, IpAddr), u32>,
    /// source_range_map{,6}: (service id, range).
    pub source_ranges: BTreeSet<(u32, SourceRange)>,
    /// vip_filter_map's bits: those of every match entry's address (None:
    /// inactive, every packet goes on to the lookups).
    pub vip_filter: Option<[u64; abi::VIP_FILTER_WORDS]>,
    pub node: NodeImage,
}

impl MapImage {
    /// The slot contents of a service's slice, empty slots as 0.
    pub fn slice_of(&self, svc: &ServiceEntry) -> Vec<u32> {
        (svc.slice_start..svc.slice_start.saturating_add(svc.slice_len))
            .map(|s| self.slots.get(&s).copied().unwrap_or(0))
            .collect()
    }
}

/// One VIP's own entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipImage {
    pub matches: Vec<MatchKey>,
    pub service: ServiceEntry,
    pub slots: Vec<u32>,
    pub rate_limit: Option<RateLimit>,
}

/// The slice contents of a VIP whose backends got `ids` (parallel to
/// `vip.backends`): weighted Maglev over a slice of `len` slots (the
/// length the writer planned, [`maglev::plan`]).
pub fn maglev_slots(vip: &Vip, ids: &[u32], len: u32) -> Vec<u32> {
    let identities: Vec<Vec<u8>> = vip.backends.iter().map(|b| b.key().identity()).collect();
    let entries: Vec<maglev::Entry<'_>> = vip
        .backends
        .iter()
        .zip(ids)
        .zip(&identities)
        .map(|((b, id), ident)| maglev::Entry {
            identity: ident,
            weight: b.weight,
            id: *id,
        })
        .collect();
    maglev::populate(&entries, len)
}

/// The service entry for a VIP whose slice is `slice_len` slots from
/// `slice_start`.
pub fn service_entry(vip: &Vip, slice_start: u32, slice_len: u32) -> ServiceEntry {
    let mut flags = abi::rv_service_flags::RV_SVC_F_ACTIVE.0;
    if vip.rate_limit.is_some() {
        flags |= abi::rv_service_flags::RV_SVC_F_RATE_LIMIT.0;
    }
    if vip
        .backends
        .iter()
        .any(|b| b.mode_in(vip.mode) == Mode::FullNat)
        || vip.mode == Mode::FullNat
    {
        flags |= abi::rv_service_flags::RV_SVC_F_FULLNAT.0;
    }
    if matches!(vip.ports, Ports::Range { .. }) {
        flags |= abi::rv_service_flags::RV_SVC_F_PORT_RANGE.0;
    }
    if vip.source_ranges.is_some() {
        flags |= abi::rv_service_flags::RV_SVC_F_SOURCE_RANGES.0;
    }
    let (affinity, timeout) = match vip.affinity {
        Affinity::None => (abi::rv_affinity::RV_AFFINITY_NONE.0 as u8, 0),
        Affinity::ClientIp { timeout_s } => {
            (abi::rv_affinity::RV_AFFINITY_CLIENT_IP.0 as u8, timeout_s)
        }
    };
    ServiceEntry {
        mode: mode_raw(vip.mode),
        affinity,
        family: abi::ip_family(vip.addr),
        proto: vip.proto.number(),
        flags,
        slice_start,
        slice_len,
        backend_count: vip.backends.len() as u32,
        affinity_timeout_s: timeout,
    }
}

pub fn render_vip(vip: &Vip, slice: (u32, u32), ids: &[u32]) -> VipImage {
    vip_image(vip, slice.0, maglev_slots(vip, ids, slice.1))
}

/// [`render_vip`] with the slice already populated (`slots`, as long as
/// the slice): populating a big slice is the costly part of a rebuild.
pub fn vip_image(vip: &Vip, slice_start: u32, slots: Vec<u32>) -> VipImage {
    VipImage {
        matches: match_keys(&vip.key()),
        service: service_entry(vip, slice_start, slots.len() as u32),
        slots,
        rate_limit: vip.rate_limit,
    }
}

/// The source_range_map{,6} entries of a VIP: its ranges of its own
/// family (the others cannot match a packet to it).
pub fn source_ranges(vip: &Vip) -> BTreeSet<SourceRange> {
    vip.source_ranges
        .iter()
        .flatten()
        .filter(|r| r.is_ipv4() == vip.addr.is_ipv4())
        .copied()
        .collect()
}

/// A backend's entry; `fullnat_src` is the index of full NAT's source
/// towards it (0: none).
pub fn backend_entry(b: &crate::model::Backend, nexthop: NextHop, fullnat_src: u8) -> BackendEntry {
    BackendEntry {
        addr: b.addr,
        port: b.port,
        mac: b.mac.map_or([0; 6], |m| m.0),
        nexthop,
        mode: b.mode,
        fullnat_src,
    }
}

/// Where a VIP lives: its service id, slice and backend ids (parallel to
/// its backends).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub svc_id: u32,
    pub slice_start: u32,
    pub slice_len: u32,
    pub backend_ids: Vec<u32>,
    /// The nat_owner_map keys this VIP owns (an allocation: the first
    /// NAT VIP to use a key keeps it while it does).
    pub nat_owned: Vec<NatOwnerKey>,
}

/// The whole image for `vips` placed by `alloc`; `health` gives each
/// backend target's state, `nexthop` each backend address's next hop,
/// `fullnat_src` its full-NAT source's index in `srcs` (0: none). VIPs
/// without an allocation are skipped (the caller's allocations decide
/// what exists).
pub fn render(
    vips: &[Vip],
    node: &NodeSettings,
    srcs: &BTreeMap<u8, IpAddr>,
    alloc: &BTreeMap<VipKey, Allocation>,
    health: &dyn Fn(&BackendTarget) -> Health,
    nexthop: &dyn Fn(IpAddr) -> NextHop,
    fullnat_src: &dyn Fn(IpAddr) -> u8,
) -> MapImage {
    let mut img = MapImage {
        node: NodeImage::from_settings(node, srcs),
        ..Default::default()
    };
    for vip in vips {
        let Some(a) = alloc.get(&vip.key()) else {
            continue;
        };
        let v = render_vip(vip, (a.slice_start, a.slice_len), &a.backend_ids);
        for m in v.matches {
            img.matches.insert(m, a.svc_id);
        }
        for (i, id) in v.slots.iter().enumerate() {
            if *id != 0 {
                img.slots.insert(a.slice_start + i as u32, *id);
            }
        }
        img.services.insert(a.svc_id, v.service);
        if let Some(rl) = v.rate_limit {
            img.svc_rate_limits.insert(a.svc_id, rl);
        }
        for (addr, id) in tunnel_eps(vip, &a.backend_ids) {
            img.tunnel_eps.insert((a.svc_id, addr), id);
        }
        for r in source_ranges(vip) {
            img.source_ranges.insert((a.svc_id, r));
        }
        for (b, id) in vip.backends.iter().zip(&a.backend_ids) {
            img.backends
                .insert(*id, backend_entry(b, nexthop(b.addr), fullnat_src(b.addr)));
            img.health.insert(*id, health(&b.key().target()));
            if let Some(k) = nat_owner_key(vip, b).filter(|k| a.nat_owned.contains(k)) {
                img.nat_owners.insert(
                    k,
                    NatOwner {
                        svc_id: a.svc_id,
                        backend_id: *id,
                        vip: vip.addr,
                        vip_port: vip_port(vip),
                    },
                );
            }
        }
    }
    img.vip_filter = Some(vip_filter(img.matches.keys().map(|m| m.addr())));
    img
}

/// The VIP's port (a range's first, for completeness: ranges own no keys).
pub fn vip_port(vip: &Vip) -> u16 {
    match vip.ports {
        Ports::One(p) => p,
        Ports::Range { first, .. } => first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_blocks_are_minimal_and_cover() {
        assert_eq!(range_blocks(80, 80), vec![(80, 16)]);
        assert_eq!(range_blocks(0, 65535), vec![(0, 0)]);
        assert_eq!(range_blocks(1, 65535).len(), 16);
        assert_eq!(range_blocks(8000, 8003), vec![(8000, 14)]);
        assert_eq!(range_blocks(1000, 1999).len(), 7);
        for (first, last) in [
            (1u16, 65535u16),
            (1000, 1999),
            (2, 65534),
            (443, 443),
            (30000, 32767),
        ] {
            let blocks = range_blocks(first, last);
            let mut covered = 0u32;
            let mut next = u32::from(first);
            for (base, bits) in &blocks {
                let size = 1u32 << (16 - bits);
                assert_eq!(u32::from(*base), next, "contiguous, ascending");
                assert_eq!(u32::from(*base) % size, 0, "aligned");
                covered += size;
                next += size;
            }
            assert_eq!(covered, u32::from(last) - u32::from(first) + 1);
            assert!(blocks.len() <= 30);
        }
    }

    #[test]
    fn prefixlen_counts_proto_pad_addr_port() {
        // The kernel looks up with the full key: 80 bits (v4), 176 (v6).
        assert_eq!(MatchKey::prefixlen("10.0.0.1".parse().unwrap(), 16), 80);
        assert_eq!(MatchKey::prefixlen("fd00::1".parse().unwrap(), 16), 176);
        assert_eq!(MatchKey::prefixlen("10.0.0.1".parse().unwrap(), 0), 64);
    }

    #[test]
    fn health_raw_round_trips() {
        for h in [Health::Healthy, Health::Draining, Health::Down] {
            assert_eq!(Health::from_raw(h.raw()), h);
        }
        assert_eq!(Health::from_raw(77), Health::Down);
    }
}
