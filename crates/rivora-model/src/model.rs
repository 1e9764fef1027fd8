//! The desired state: what the dataplane should forward, as plain data.
//! Sources (the static config, Kubernetes) build it; the writer turns it
//! into maps. Validation is here, so that invalid state is rejected whole
//! before anything reaches the maps, with errors that name the VIP and the
//! field.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::maglev;
use crate::source_range::{SourceRange, MAX_SOURCE_RANGES_PER_VIP};

/// Largest backend weight. Gateway API's backendRef weight goes to
/// 1,000,000, and Maglev shares are computed in 128-bit arithmetic, so
/// that range costs nothing.
pub const MAX_WEIGHT: u32 = 1_000_000;
/// SYN rate limits: the datapath's refill arithmetic is sized for this.
pub const MAX_RATE_PER_SEC: u32 = 10_000_000;
pub const MAX_BURST: u32 = 10_000_000;
/// ClientIP affinity timeout bounds (Kubernetes' sessionAffinityConfig).
pub const MAX_AFFINITY_TIMEOUT_S: u32 = 86_400;

// The datapath's capacities, mirrored from `rv_limits` in
// include/rivora/abi.h: this crate cannot link the BPF skeleton whose
// BTF carries them, so tests/abi_layout.rs asserts each equals the ABI's.

/// Services (`RV_MAX_VIPS`): one service id per VIP.
pub const MAX_VIPS: usize = 4096;
/// Backends (`RV_MAX_BACKENDS`): one backend id per distinct backend
/// identity (address, port, MAC), shared by every VIP that lists it.
pub const MAX_BACKENDS: usize = 8192;
/// Slots of the shared Maglev table unless rivorad is given
/// `-maglev-size` (`RV_MAGLEV_DEFAULT_SIZE`).
pub const MAGLEV_DEFAULT_SIZE: u32 = 65_537;
/// The flow tables' default size, `-flow-table-size`
/// (`RV_FLOW_TABLE_DEFAULT_SIZE`).
pub const FLOW_TABLE_DEFAULT_SIZE: u32 = 131_072;
/// Interfaces whose MAC the datapath keeps (`RV_MAX_IFACES`).
pub const MAX_IFACES: usize = 256;

/// What a desired state must fit in besides the fixed capacities: the
/// Maglev table's size is a load-time setting of the datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Slots in the shared Maglev table (rivorad's `-maglev-size`).
    pub maglev_size: u32,
    /// Entries in each per-flow table (rivorad's `-flow-table-size`).
    pub flow_table_size: u32,
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            maglev_size: MAGLEV_DEFAULT_SIZE,
            flow_table_size: FLOW_TABLE_DEFAULT_SIZE,
        }
    }
}

/// Why an address cannot be a VIP's or a backend's, if it cannot.
/// Checked for both: the datapath forwards between unicast hosts only.
fn unusable(addr: IpAddr) -> Option<&'static str> {
    if addr.is_unspecified() {
        return Some("the unspecified address, which no client can connect to");
    }
    if addr.is_multicast() {
        return Some("a multicast address; VIPs and backends are unicast");
    }
    if addr == IpAddr::V4(Ipv4Addr::BROADCAST) {
        return Some("the broadcast address; VIPs and backends are unicast");
    }
    None
}

/// Why an address cannot be a VIP's, on top of [`unusable`].
fn unusable_vip(addr: IpAddr) -> Option<String> {
    if let Some(why) = unusable(addr) {
        return Some(why.into());
    }
    if addr.is_loopback() {
        // Routers do not forward loopback destinations, and the kernel
        // drops them as martians when they arrive on an interface.
        return Some("a loopback address, which never arrives from another host".into());
    }
    if let IpAddr::V6(a) = addr {
        if let Some(v4) = a.to_ipv4_mapped() {
            // RFC 4291 2.5.5.2: never the destination of an IPv6 packet.
            return Some(format!(
                "an IPv4-mapped IPv6 address, which no packet carries; write the IPv4 address {v4}"
            ));
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Rewrite destination address and port; replies go back through tc_nat.
    Nat,
    /// Rewrite the destination MAC and bounce the frame (same L2 segment).
    Dsr,
    /// Encapsulate towards the backend (IP-in-IP), routed.
    L3Dsr,
    /// Rewrite source and destination: the source becomes an address and
    /// port of this node, so replies come back here wherever the backend
    /// is; xdp_ingress turns them back into the VIP's.
    #[serde(rename = "fullnat")]
    FullNat,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Nat => "nat",
            Mode::Dsr => "dsr",
            Mode::L3Dsr => "l3dsr",
            Mode::FullNat => "fullnat",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum Affinity {
    #[default]
    None,
    /// Every flow of one client address goes to one backend until
    /// `timeout_s` of silence.
    #[serde(rename = "clientIP")]
    ClientIp { timeout_s: u32 },
}

/// A per-source SYN token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RateLimit {
    pub rate_per_sec: u32,
    pub burst: u32,
}

/// One port, or an inclusive range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Ports {
    One(u16),
    Range { first: u16, last: u16 },
}

impl Ports {
    /// First and last port, inclusive.
    pub fn bounds(self) -> (u16, u16) {
        match self {
            Ports::One(p) => (p, p),
            Ports::Range { first, last } => (first, last),
        }
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ports::One(p) => write!(f, "{p}"),
            Ports::Range { first, last } => write!(f, "{first}-{last}"),
        }
    }
}

/// What identifies a VIP: two VIPs with the same key are the same VIP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VipKey {
    pub addr: IpAddr,
    pub ports: Ports,
    pub proto: Protocol,
}

impl fmt::Display for VipKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{}/{}:{}", self.proto, a, self.ports),
            IpAddr::V6(a) => write!(f, "{}/[{}]:{}", self.proto, a, self.ports),
        }
    }
}

/// An Ethernet address; serialised as "aa:bb:cc:dd:ee:ff".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address (want aa:bb:cc:dd:ee:ff)")]
pub struct BadMac(String);

impl FromStr for Mac {
    type Err = BadMac;
    fn from_str(s: &str) -> Result<Self, BadMac> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next().ok_or_else(|| BadMac(s.to_string()))?;
            if p.len() != 2 {
                return Err(BadMac(s.to_string()));
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| BadMac(s.to_string()))?;
        }
        if parts.next().is_some() {
            return Err(BadMac(s.to_string()));
        }
        Ok(Mac(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn default_weight() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Backend {
    pub addr: IpAddr,
    /// 0 (or absent): the port the client connected to.
    #[serde(default)]
    pub port: u16,
    /// Share of new flows relative to the VIP's other backends,
    /// 0..=[`MAX_WEIGHT`]; 0 takes no new flows (established ones stay).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Needed in DSR mode. `None` means not resolved yet: the model
    /// accepts it, the writer refuses a DSR backend without one.
    #[serde(default)]
    pub mac: Option<Mac>,
    /// How this backend is reached when not by its VIP's mode: Kubernetes
    /// reaches a Service's endpoints on other nodes by full NAT and its
    /// own node's by NAT, in one VIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The node this backend lives behind (Kubernetes' `nodeName`), when
    /// that node runs Rivora too: reached by L3 DSR, it is that node that
    /// takes the tunnel off and NATs the packet to the backend, so the
    /// backend's port may differ from the VIP's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Backend {
    pub fn new(addr: IpAddr, port: u16) -> Self {
        Self {
            addr,
            port,
            weight: 1,
            mac: None,
            mode: None,
            node: None,
        }
    }

    /// The dataplane identity of this backend: one backend id per
    /// identity, shared by every VIP that lists it.
    pub fn key(&self) -> BackendKey {
        BackendKey {
            addr: self.addr,
            port: self.port,
            mac: self.mac,
            mode: self.mode,
        }
    }

    /// How the backend is reached in a VIP of mode `vip`.
    pub fn mode_in(&self, vip: Mode) -> Mode {
        self.mode.unwrap_or(vip)
    }

    /// What health checks and drains address.
    pub fn target(&self) -> BackendTarget {
        BackendTarget {
            addr: self.addr,
            port: self.port,
        }
    }

    /// The port it serves on: its own, or (port 0) the VIP's first.
    pub fn service_port(&self, vip_ports: &Ports) -> u16 {
        if self.port != 0 {
            return self.port;
        }
        vip_ports.bounds().0
    }
}

/// A backend's identity in the dataplane (what one backend id stands for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BackendKey {
    pub addr: IpAddr,
    pub port: u16,
    pub mac: Option<Mac>,
    /// Its own mode, when not its VIP's: part of the backend's entry,
    /// so a backend reached two ways is two ids. Not hashed by Maglev:
    /// every node builds the same slices whichever way it reaches them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
}

impl BackendKey {
    /// Bytes Maglev hashes: family, address, port. Stable across
    /// processes and versions (the table depends on it).
    pub fn identity(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(19);
        match self.addr {
            IpAddr::V4(a) => {
                v.push(4);
                v.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                v.push(6);
                v.extend_from_slice(&a.octets());
            }
        }
        v.extend_from_slice(&self.port.to_be_bytes());
        v
    }

    /// Address and port: what a health probe targets.
    pub fn target(&self) -> BackendTarget {
        BackendTarget {
            addr: self.addr,
            port: self.port,
        }
    }
}

impl fmt::Display for BackendKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.target())?;
        if let Some(m) = self.mac {
            write!(f, " mac={m}")?;
        }
        if let Some(m) = self.mode {
            write!(f, " via {m}")?;
        }
        Ok(())
    }
}

/// What health checks and drains address: every backend id with this
/// address and port (whatever its MAC) shares the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BackendTarget {
    pub addr: IpAddr,
    pub port: u16,
}

impl fmt::Display for BackendTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vip {
    pub addr: IpAddr,
    pub ports: Ports,
    pub proto: Protocol,
    pub mode: Mode,
    #[serde(default)]
    pub affinity: Affinity,
    /// This VIP's own SYN limit; without one the node-wide limit applies.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// The clients it admits: None admits every one; Some admits only
    /// those in a range of the VIP's family, and so none when it holds
    /// no such range ([`crate::source_range`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<SourceRange>>,
    #[serde(default)]
    pub backends: Vec<Backend>,
}

impl Vip {
    /// How big its Maglev slice may be, from its backends' weights.
    pub fn slice_need(&self) -> maglev::SliceNeed {
        let weights: Vec<u32> = self.backends.iter().map(|b| b.weight).collect();
        maglev::slice_need(&weights)
    }

    pub fn key(&self) -> VipKey {
        VipKey {
            addr: self.addr,
            ports: self.ports,
            proto: self.proto,
        }
    }

    /// Shape checks that need nothing but the VIP itself.
    pub fn validate(&self) -> Result<(), ModelError> {
        let vip = self.key();
        let err = |field: String, problem: Problem| ModelError::Vip {
            vip,
            field,
            problem,
        };
        match self.ports {
            Ports::One(0) => return Err(err("port".into(), Problem::PortZero)),
            Ports::Range { first, last } => {
                if first == 0 {
                    return Err(err("ports.first".into(), Problem::PortZero));
                }
                if first > last {
                    return Err(err("ports".into(), Problem::EmptyPortRange { first, last }));
                }
            }
            Ports::One(_) => {}
        }
        if let Some(why) = unusable_vip(self.addr) {
            return Err(err(
                "addr".into(),
                Problem::Unusable {
                    addr: self.addr,
                    why,
                },
            ));
        }
        if let Affinity::ClientIp { timeout_s } = self.affinity {
            if timeout_s == 0 || timeout_s > MAX_AFFINITY_TIMEOUT_S {
                return Err(err(
                    "affinity.timeout_s".into(),
                    Problem::OutOfRange {
                        value: u64::from(timeout_s),
                        min: 1,
                        max: u64::from(MAX_AFFINITY_TIMEOUT_S),
                    },
                ));
            }
        }
        if let Some(rl) = self.rate_limit {
            check_rate_limit(&rl).map_err(|(f, p)| err(format!("rate_limit.{f}"), p))?;
        }
        let ranges = self.source_ranges.as_deref().unwrap_or(&[]);
        if ranges.len() > MAX_SOURCE_RANGES_PER_VIP {
            return Err(err(
                "source_ranges".into(),
                Problem::OutOfRange {
                    value: ranges.len() as u64,
                    min: 0,
                    max: MAX_SOURCE_RANGES_PER_VIP as u64,
                },
            ));
        }
        let mut seen = HashSet::new();
        for (i, b) in self.backends.iter().enumerate() {
            let field = |f: &str| format!("backends[{i}].{f}");
            if b.addr.is_ipv4() != self.addr.is_ipv4() {
                return Err(err(
                    field("addr"),
                    Problem::FamilyMismatch {
                        vip: self.addr,
                        backend: b.addr,
                    },
                ));
            }
            if let Some(why) = unusable(b.addr) {
                return Err(err(
                    field("addr"),
                    Problem::Unusable {
                        addr: b.addr,
                        why: why.into(),
                    },
                ));
            }
            if b.addr == self.addr {
                // The datapath would send the VIP's traffic back to the
                // VIP: a loop in NAT, a frame to ourselves in DSR.
                return Err(err(field("addr"), Problem::BackendIsVip(b.addr)));
            }
            if b.weight > MAX_WEIGHT {
                return Err(err(
                    field("weight"),
                    Problem::OutOfRange {
                        value: u64::from(b.weight),
                        min: 0,
                        max: u64::from(MAX_WEIGHT),
                    },
                ));
            }
            let mode = b.mode_in(self.mode);
            if b.port != 0 {
                match (mode, self.ports) {
                    (Mode::Nat | Mode::FullNat, Ports::Range { .. }) => {
                        return Err(err(field("port"), Problem::PortOnRangeVip(b.port)))
                    }
                    // Another node's endpoint: that node NATs.
                    (Mode::L3Dsr, Ports::One(_)) if b.node.is_some() => {}
                    (Mode::Dsr | Mode::L3Dsr, Ports::One(p)) if p != b.port => {
                        return Err(err(
                            field("port"),
                            Problem::PortRemapNeedsNat { mode, port: b.port },
                        ))
                    }
                    (Mode::Dsr | Mode::L3Dsr, Ports::Range { .. }) => {
                        return Err(err(
                            field("port"),
                            Problem::PortRemapNeedsNat { mode, port: b.port },
                        ))
                    }
                    _ => {}
                }
            }
            // Port 0 and the VIP's own port reach the same socket.
            let effective = match (b.port, self.ports) {
                (0, Ports::One(p)) => p,
                (p, _) => p,
            };
            if !seen.insert((b.addr, effective)) {
                return Err(err(
                    field("addr"),
                    Problem::DuplicateBackend(BackendTarget {
                        addr: b.addr,
                        port: effective,
                    }),
                ));
            }
        }
        Ok(())
    }

    /// What the writer needs on top of [`Vip::validate`]: every MAC that
    /// DSR rewrites to is known.
    pub fn check_resolved(&self) -> Result<(), ModelError> {
        for (i, b) in self.backends.iter().enumerate() {
            if b.mode_in(self.mode) == Mode::Dsr && b.mac.is_none() {
                return Err(ModelError::Vip {
                    vip: self.key(),
                    field: format!("backends[{i}].mac"),
                    problem: Problem::DsrWithoutMac(b.addr),
                });
            }
        }
        Ok(())
    }
}

fn check_rate_limit(rl: &RateLimit) -> Result<(), (&'static str, Problem)> {
    if rl.rate_per_sec == 0 || rl.rate_per_sec > MAX_RATE_PER_SEC {
        return Err((
            "rate_per_sec",
            Problem::OutOfRange {
                value: u64::from(rl.rate_per_sec),
                min: 1,
                max: u64::from(MAX_RATE_PER_SEC),
            },
        ));
    }
    if rl.burst == 0 || rl.burst > MAX_BURST {
        return Err((
            "burst",
            Problem::OutOfRange {
                value: u64::from(rl.burst),
                min: 1,
                max: u64::from(MAX_BURST),
            },
        ));
    }
    Ok(())
}

/// Settings of the node rather than of a VIP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSettings {
    /// Node-wide SYN limit for VIPs without their own.
    #[serde(default)]
    pub syn_rate_limit: Option<RateLimit>,
    /// Outer source addresses for L3 DSR.
    #[serde(default)]
    pub tunnel_src4: Option<Ipv4Addr>,
    #[serde(default)]
    pub tunnel_src6: Option<Ipv6Addr>,
    /// ifindex to the interface's MAC (DSR's source MAC).
    #[serde(default)]
    pub interface_macs: BTreeMap<u32, Mac>,
    /// Those of `interface_macs` rivorad runs on as generic XDP: they
    /// have no XDP transmit (a bridge), so nothing is redirected into
    /// them.
    #[serde(default)]
    pub generic_xdp: BTreeSet<u32>,
    /// Full NAT's sources, ports and timeouts.
    #[serde(default)]
    pub fullnat: FullNatSettings,
}

/// The shortest idle timeout a full-NAT port may have before it is given
/// to another flow: the datapath checks a flow's port when it refreshes
/// the flow's affinity time, at most once a second, so a port given again
/// sooner could be sent from by two flows for up to that second.
pub const MIN_FULLNAT_TIMEOUT_MS: u32 = 2_000;
/// The longest: 30 days.
pub const MAX_FULLNAT_TIMEOUT_MS: u32 = 30 * 24 * 3_600_000;

/// Full NAT's node settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FullNatSettings {
    /// The source address of every full-NAT flow of the family. None:
    /// the address the node's route to each backend prefers (its egress
    /// interface's), as MASQUERADE picks it.
    #[serde(default)]
    pub src4: Option<Ipv4Addr>,
    #[serde(default)]
    pub src6: Option<Ipv6Addr>,
    /// Source ports given to full-NAT flows, inclusive. Per (source
    /// address, backend address, backend port, protocol): a backend may
    /// hold this many full-NAT flows from one source at a time.
    pub port_min: u16,
    pub port_max: u16,
    /// Idle time after which a flow's port may be given again: TCP, TCP
    /// once a FIN or RST was seen, UDP.
    pub tcp_timeout_ms: u32,
    pub tcp_closing_timeout_ms: u32,
    pub udp_timeout_ms: u32,
}

/// The default source ports: below Linux's default ephemeral range
/// (`ip_local_port_range`, 32768-60999), which the node's own
/// connections take their ports from, so no connection of the node's can
/// hold a tuple full NAT gives out. rivora-doctor checks the host's range.
pub const DEFAULT_FULLNAT_PORTS: (u16, u16) = (1024, 32767);

impl Default for FullNatSettings {
    fn default() -> Self {
        Self {
            src4: None,
            src6: None,
            port_min: DEFAULT_FULLNAT_PORTS.0,
            port_max: DEFAULT_FULLNAT_PORTS.1,
            // Cilium's connection-tracking lifetimes: 6 h for TCP, 10 s
            // after a close, 60 s for UDP.
            tcp_timeout_ms: 6 * 3_600_000,
            tcp_closing_timeout_ms: 10_000,
            udp_timeout_ms: 60_000,
        }
    }
}

impl FullNatSettings {
    /// Ports in the range.
    pub fn ports(&self) -> u32 {
        u32::from(self.port_max).saturating_sub(u32::from(self.port_min)) + 1
    }

    /// The configured source of a family, if any.
    pub fn src_for(&self, ipv6: bool) -> Option<IpAddr> {
        if ipv6 {
            self.src6.map(IpAddr::V6)
        } else {
            self.src4.map(IpAddr::V4)
        }
    }

    fn validate(&self) -> Result<(), ModelError> {
        let node = |field: &str, problem| ModelError::Node {
            field: format!("fullnat.{field}"),
            problem,
        };
        if self.port_min == 0 {
            return Err(node("port_min", Problem::PortZero));
        }
        if self.port_min > self.port_max {
            return Err(node(
                "ports",
                Problem::EmptyPortRange {
                    first: self.port_min,
                    last: self.port_max,
                },
            ));
        }
        for (field, ms) in [
            ("tcp_timeout_ms", self.tcp_timeout_ms),
            ("tcp_closing_timeout_ms", self.tcp_closing_timeout_ms),
            ("udp_timeout_ms", self.udp_timeout_ms),
        ] {
            if !(MIN_FULLNAT_TIMEOUT_MS..=MAX_FULLNAT_TIMEOUT_MS).contains(&ms) {
                return Err(node(
                    field,
                    Problem::OutOfRange {
                        value: u64::from(ms),
                        min: u64::from(MIN_FULLNAT_TIMEOUT_MS),
                        max: u64::from(MAX_FULLNAT_TIMEOUT_MS),
                    },
                ));
            }
        }
        // A source is where the backends send their replies, as a VIP is
        // where clients send: a loopback or IPv4-mapped one never gets
        // them (the backend drops a loopback source as a martian).
        for (field, addr) in [
            ("src4", self.src4.map(IpAddr::V4)),
            ("src6", self.src6.map(IpAddr::V6)),
        ] {
            if let Some(addr) = addr {
                if let Some(why) = unusable_vip(addr) {
                    return Err(node(field, Problem::Unusable { addr, why }));
                }
            }
        }
        Ok(())
    }
}

impl NodeSettings {
    pub fn validate(&self) -> Result<(), ModelError> {
        if let Some(rl) = self.syn_rate_limit {
            check_rate_limit(&rl).map_err(|(f, problem)| ModelError::Node {
                field: format!("syn_rate_limit.{f}"),
                problem,
            })?;
        }
        let sources = [
            ("tunnel_src4", self.tunnel_src4.map(IpAddr::V4)),
            ("tunnel_src6", self.tunnel_src6.map(IpAddr::V6)),
        ];
        for (field, addr) in sources {
            if let Some(addr) = addr {
                if let Some(why) = unusable(addr) {
                    return Err(ModelError::Node {
                        field: field.into(),
                        problem: Problem::Unusable {
                            addr,
                            why: why.into(),
                        },
                    });
                }
            }
        }
        if self.interface_macs.contains_key(&0) {
            return Err(ModelError::Node {
                field: "interface_macs".into(),
                problem: Problem::IfindexZero,
            });
        }
        self.fullnat.validate()
    }

    /// A VIP with a backend it tunnels to (by its mode or the backend's)
    /// needs a tunnel source of its family. One with none (no backend yet,
    /// or Kubernetes' DSR across nodes with every endpoint on this node,
    /// reached by NAT) sends nothing in a tunnel.
    pub fn check_vip(&self, vip: &Vip) -> Result<(), ModelError> {
        let tunnels = vip
            .backends
            .iter()
            .any(|b| b.mode_in(vip.mode) == Mode::L3Dsr);
        if !tunnels {
            return Ok(());
        }
        let have = match vip.addr {
            IpAddr::V4(_) => self.tunnel_src4.is_some(),
            IpAddr::V6(_) => self.tunnel_src6.is_some(),
        };
        if have {
            Ok(())
        } else {
            Err(ModelError::Vip {
                vip: vip.key(),
                field: "mode".into(),
                problem: Problem::NoTunnelSource {
                    ipv6: vip.addr.is_ipv6(),
                },
            })
        }
    }
}

/// Everything the dataplane should hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    #[serde(default)]
    pub node: NodeSettings,
    #[serde(default)]
    pub vips: Vec<Vip>,
}

impl DesiredState {
    /// Every check, including the cross-VIP ones (duplicates, ports
    /// claimed twice) and readiness for the writer. The first problem
    /// found rejects the whole state. Capacities are apart, in
    /// [`DesiredState::check_capacity`].
    pub fn validate(&self) -> Result<(), ModelError> {
        self.node.validate()?;
        let mut keys = BTreeSet::new();
        // The VIPs on each (address, protocol), to find a port claimed
        // twice: the datapath gives each port to one VIP only.
        let mut claims: BTreeMap<(IpAddr, Protocol), Vec<VipKey>> = BTreeMap::new();
        for vip in &self.vips {
            vip.validate()?;
            vip.check_resolved()?;
            self.node.check_vip(vip)?;
            let key = vip.key();
            if !keys.insert(key) {
                return Err(ModelError::DuplicateVip(key));
            }
            let (first, last) = vip.ports.bounds();
            let list = claims.entry((vip.addr, vip.proto)).or_default();
            for other in list.iter() {
                let (f, l) = other.ports.bounds();
                if first <= l && f <= last {
                    return Err(match (vip.ports, other.ports) {
                        (Ports::Range { .. }, Ports::Range { .. }) => {
                            ModelError::OverlappingRanges {
                                vip: key,
                                other: *other,
                            }
                        }
                        _ => ModelError::PortInRange {
                            vip: key,
                            other: *other,
                        },
                    });
                }
            }
            list.push(key);
        }
        Ok(())
    }

    /// Whether the state fits the datapath's maps: service ids, backend
    /// ids and the shared Maglev table. Checked before anything is
    /// written, so that a state too big is refused whole rather than
    /// applied in part. Names the first VIP (or backend) past the limit.
    pub fn check_capacity(&self, cap: &Capacity) -> Result<(), CapacityError> {
        if self.vips.len() > MAX_VIPS {
            return Err(CapacityError::Vips {
                count: self.vips.len(),
                index: MAX_VIPS,
                first: self.vips[MAX_VIPS].key(),
            });
        }
        // One backend id per identity. A DSR MAC still to be resolved
        // counts as its own identity: it may resolve to a MAC another VIP
        // gives, so this errs by at most one id per such backend.
        let mut ids: HashSet<(IpAddr, u16, Option<Mac>, bool)> = HashSet::new();
        let mut first_past: Option<(usize, usize)> = None;
        for (i, v) in self.vips.iter().enumerate() {
            for (j, b) in v.backends.iter().enumerate() {
                let unresolved = v.mode == Mode::Dsr && b.mac.is_none();
                if ids.insert((b.addr, b.port, b.mac, unresolved))
                    && ids.len() > MAX_BACKENDS
                    && first_past.is_none()
                {
                    first_past = Some((i, j));
                }
            }
        }
        if let Some((i, j)) = first_past {
            return Err(CapacityError::Backends {
                count: ids.len(),
                vip: self.vips[i].key(),
                index: i,
                backend_index: j,
                backend: self.vips[i].backends[j].target(),
            });
        }
        let needs: Vec<maglev::SliceNeed> = self.vips.iter().map(Vip::slice_need).collect();
        if let Err(s) = maglev::plan(&needs, cap.maglev_size) {
            let v = &self.vips[s.index];
            return Err(CapacityError::MaglevSlots {
                needed: s.needed,
                size: cap.maglev_size,
                vip: v.key(),
                index: s.index,
                backends: v.backends.iter().filter(|b| b.weight > 0).count(),
                slice: needs[s.index].min,
            });
        }
        Ok(())
    }

    /// The Maglev slice each VIP gets in a table of `cap` (the writer
    /// plans the same for the same VIPs), or None when they do not fit
    /// (`check_capacity` says why).
    pub fn maglev_sizes(&self, cap: &Capacity) -> Option<Vec<PlannedSlice>> {
        let needs: Vec<maglev::SliceNeed> = self.vips.iter().map(Vip::slice_need).collect();
        let sizes = maglev::plan(&needs, cap.maglev_size).ok()?;
        Some(
            needs
                .into_iter()
                .zip(sizes)
                .map(|(need, len)| PlannedSlice { need, len })
                .collect(),
        )
    }
}

/// A VIP's planned Maglev slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedSlice {
    pub need: maglev::SliceNeed,
    pub len: u32,
}

impl PlannedSlice {
    /// Below the size its weights need: some share is off its weight's
    /// share by more than the precision rule allows.
    pub fn reduced_precision(&self) -> bool {
        self.len < self.need.need
    }
}

/// A state bigger than the datapath holds. `index` is the position in
/// [`DesiredState::vips`] of the first VIP past the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    #[error(
        "{count} VIPs, over the datapath's limit of {MAX_VIPS}; the first past it is VIP {first}"
    )]
    Vips {
        count: usize,
        index: usize,
        first: VipKey,
    },
    #[error(
        "{count} distinct backends (address, port, MAC) over all VIPs, over the datapath's \
         limit of {MAX_BACKENDS}; the first past it is backend {} of VIP {vip}",
        as_written(.backend)
    )]
    Backends {
        count: usize,
        vip: VipKey,
        index: usize,
        backend_index: usize,
        backend: BackendTarget,
    },
    #[error(
        "the VIPs need at least {needed} Maglev slots (their smallest slices and room to \
         rebuild the largest), over the table's {size} (rivorad -maglev-size); the first that \
         does not fit is VIP {vip}, whose {backends} weighted backend(s) take at least {slice} \
         slots"
    )]
    MaglevSlots {
        needed: u64,
        size: u32,
        vip: VipKey,
        index: usize,
        backends: usize,
        slice: u32,
    },
}

/// A backend as a file writes it: port 0 (the client's port) left out.
fn as_written(t: &BackendTarget) -> String {
    if t.port == 0 {
        t.addr.to_string()
    } else {
        t.to_string()
    }
}

impl CapacityError {
    /// Position of the first VIP past the limit.
    pub fn index(&self) -> usize {
        match self {
            CapacityError::Vips { index, .. }
            | CapacityError::Backends { index, .. }
            | CapacityError::MaglevSlots { index, .. } => *index,
        }
    }
}

/// A single port inside a range on the same address and protocol: which
/// VIP should have it is ambiguous, so both are named and the range's
/// split suggested. `where_other` follows the other VIP's name (the
/// configuration file puts its index there).
pub(crate) fn port_in_range(vip: &VipKey, other: &VipKey, where_other: &str) -> String {
    let (single, range, this_is_single) = match vip.ports {
        Ports::One(_) => (vip, other, true),
        Ports::Range { .. } => (other, vip, false),
    };
    let port = single.ports.bounds().0;
    let (f, l) = range.ports.bounds();
    let part = |a: u16, b: u16| {
        if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        }
    };
    let mut parts = Vec::new();
    if port > f {
        parts.push(part(f, port - 1));
    }
    if port < l {
        parts.push(part(port + 1, l));
    }
    let fix = if parts.is_empty() {
        "remove one of them".to_string()
    } else {
        format!(
            "split the range around it ({}) or remove one",
            parts.join(" and ")
        )
    };
    let clash = if this_is_single {
        format!("port {port} is also inside the range of VIP {range}{where_other}")
    } else {
        format!("the range holds port {port}, which VIP {single}{where_other} has")
    };
    format!("VIP {vip}: {clash}; a port belongs to one VIP: {fix}")
}

/// What is wrong, independent of where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("port 0 is not a port")]
    PortZero,
    #[error("port range {first}-{last} is empty (first after last)")]
    EmptyPortRange { first: u16, last: u16 },
    #[error("{addr} is {why}")]
    Unusable { addr: IpAddr, why: String },
    #[error("backend {0} is the VIP's own address: the VIP would forward to itself")]
    BackendIsVip(IpAddr),
    #[error("backend {backend} is not of the VIP's address family ({vip})")]
    FamilyMismatch { vip: IpAddr, backend: IpAddr },
    #[error("{value} is out of range {min}..={max}")]
    OutOfRange { value: u64, min: u64, max: u64 },
    #[error("backend port {0} on a NAT or full-NAT port-range VIP: each port forwards to itself, leave the port unset")]
    PortOnRangeVip(u16),
    #[error(
        "backend port {port} differs from the VIP's: {mode} cannot rewrite ports, only NAT can"
    )]
    PortRemapNeedsNat { mode: Mode, port: u16 },
    #[error("backend {0} is listed twice")]
    DuplicateBackend(BackendTarget),
    #[error("DSR backend {0} has no MAC (not resolved yet)")]
    DsrWithoutMac(IpAddr),
    #[error(
        "mode l3dsr needs the node's {} tunnel source (node.tunnelSource.{}): the outer \
         source address of the encapsulated packets",
        if *.ipv6 { "IPv6" } else { "IPv4" },
        if *.ipv6 { "ipv6" } else { "ipv4" }
    )]
    NoTunnelSource { ipv6: bool },
    #[error("ifindex 0 is not an interface")]
    IfindexZero,
}

/// Why a desired state (or one VIP) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("VIP {vip}: {field}: {problem}")]
    Vip {
        vip: VipKey,
        field: String,
        #[source]
        problem: Problem,
    },
    #[error("VIP {0} is listed twice")]
    DuplicateVip(VipKey),
    #[error("VIP {vip}: port range overlaps VIP {other}")]
    OverlappingRanges { vip: VipKey, other: VipKey },
    /// One VIP's single port inside the other's range (`vip` is the later
    /// of the two).
    #[error("{}", port_in_range(.vip, .other, ""))]
    PortInRange { vip: VipKey, other: VipKey },
    #[error("node settings: {field}: {problem}")]
    Node {
        field: String,
        #[source]
        problem: Problem,
    },
}

/// How the XDP program is attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// Driver mode; fail if the driver cannot.
    Native,
    /// Generic (skb) mode: slower, works everywhere.
    Generic,
    /// Native, falling back to generic with a warning.
    Auto,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip(addr: &str, ports: Ports, mode: Mode) -> Vip {
        Vip {
            addr: addr.parse().unwrap(),
            ports,
            proto: Protocol::Tcp,
            mode,
            affinity: Affinity::None,
            rate_limit: None,
            source_ranges: None,
            backends: vec![],
        }
    }

    fn be(addr: &str, port: u16) -> Backend {
        Backend::new(addr.parse().unwrap(), port)
    }

    #[test]
    fn errors_name_vip_and_field() {
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
        v.backends = vec![be("10.1.0.1", 0), be("fd00::1", 0)];
        let e = v.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "VIP tcp/10.0.0.1:80: backends[1].addr: backend fd00::1 is not of the VIP's address family (10.0.0.1)"
        );
    }

    #[test]
    fn l3_dsr_keeps_the_port_unless_the_backends_node_nats() {
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::L3Dsr);
        v.backends = vec![be("10.1.0.1", 8080)];
        let e = v.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "VIP tcp/10.0.0.1:80: backends[0].port: backend port 8080 differs from the VIP's: l3dsr cannot rewrite ports, only NAT can"
        );
        // Another node's endpoint (DSR across nodes): that node NATs.
        v.backends[0].node = Some("node-2".into());
        v.validate()
            .expect("a port remap to another node's endpoint");
        // Not so for L2 DSR, which has no node to NAT.
        let mut d = vip("10.0.0.1", Ports::One(80), Mode::Dsr);
        d.backends = vec![Backend {
            node: Some("node-2".into()),
            mac: Some(Mac([2, 0, 0, 0, 0, 1])),
            ..be("10.1.0.1", 8080)
        }];
        assert!(d.validate().is_err());
    }

    #[test]
    fn rejects_bad_shapes() {
        let cases: Vec<(Vip, &str)> = vec![
            (vip("10.0.0.1", Ports::One(0), Mode::Nat), "port"),
            (
                vip(
                    "10.0.0.1",
                    Ports::Range {
                        first: 90,
                        last: 80,
                    },
                    Mode::Nat,
                ),
                "ports",
            ),
            (
                {
                    let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
                    v.backends = vec![Backend {
                        weight: MAX_WEIGHT + 1,
                        ..be("10.1.0.1", 0)
                    }];
                    v
                },
                "backends[0].weight",
            ),
            (
                {
                    let mut v = vip(
                        "10.0.0.1",
                        Ports::Range {
                            first: 80,
                            last: 90,
                        },
                        Mode::Nat,
                    );
                    v.backends = vec![be("10.1.0.1", 8080)];
                    v
                },
                "backends[0].port",
            ),
            (
                {
                    let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
                    v.backends = vec![be("10.1.0.1", 0), be("10.1.0.1", 80)];
                    v
                },
                "backends[1].addr",
            ),
            (
                {
                    let mut v = vip("10.0.0.1", Ports::One(80), Mode::Dsr);
                    v.backends = vec![be("10.1.0.1", 81)];
                    v
                },
                "backends[0].port",
            ),
            (
                {
                    let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
                    v.rate_limit = Some(RateLimit {
                        rate_per_sec: MAX_RATE_PER_SEC + 1,
                        burst: 1,
                    });
                    v
                },
                "rate_limit.rate_per_sec",
            ),
            (
                {
                    let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
                    v.affinity = Affinity::ClientIp { timeout_s: 0 };
                    v
                },
                "affinity.timeout_s",
            ),
        ];
        for (v, want) in cases {
            match v.validate() {
                Err(ModelError::Vip { field, .. }) => assert_eq!(field, want, "{v:?}"),
                other => panic!("{v:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn dsr_needs_mac_only_when_writing() {
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::Dsr);
        v.backends = vec![be("10.1.0.1", 0)];
        assert!(v.validate().is_ok(), "the model allows an unresolved MAC");
        let e = v.check_resolved().unwrap_err();
        assert!(e.to_string().contains("backends[0].mac"), "{e}");
        v.backends[0].mac = Some("02:00:00:00:00:01".parse().unwrap());
        assert!(v.check_resolved().is_ok());
    }

    #[test]
    fn duplicates_and_overlaps_reject_the_whole_state() {
        let a = vip(
            "10.0.0.1",
            Ports::Range {
                first: 100,
                last: 200,
            },
            Mode::Nat,
        );
        let b = vip(
            "10.0.0.1",
            Ports::Range {
                first: 200,
                last: 300,
            },
            Mode::Nat,
        );
        let s = DesiredState {
            node: NodeSettings::default(),
            vips: vec![a.clone(), b],
        };
        assert!(matches!(
            s.validate(),
            Err(ModelError::OverlappingRanges { .. })
        ));
        let s = DesiredState {
            node: NodeSettings::default(),
            vips: vec![a.clone(), a],
        };
        assert!(matches!(s.validate(), Err(ModelError::DuplicateVip(_))));
    }

    #[test]
    fn l3dsr_needs_a_tunnel_source() {
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::L3Dsr);
        // Nothing to tunnel to yet: nothing needed.
        let mut s = DesiredState {
            node: NodeSettings::default(),
            vips: vec![v.clone()],
        };
        assert!(s.validate().is_ok());
        // Every backend this node's own, reached by NAT (DSR across
        // nodes): nothing tunnelled either.
        v.backends = vec![Backend {
            mode: Some(Mode::Nat),
            node: Some("node-1".into()),
            ..be("10.1.0.1", 8080)
        }];
        s.vips = vec![v.clone()];
        assert!(s.validate().is_ok());
        v.backends.push(be("10.1.0.2", 0));
        s.vips = vec![v];
        assert!(s.validate().is_err());
        s.node.tunnel_src4 = Some("192.0.2.1".parse().unwrap());
        assert!(s.validate().is_ok());
    }

    /// A backend's own mode (Kubernetes': a Service's endpoints on other
    /// nodes by full NAT) is checked as the way it is reached, not as its
    /// VIP's, and makes it a backend id of its own.
    #[test]
    fn a_backends_own_mode_is_checked_as_its_way() {
        let own = |addr: &str, port: u16, mode: Mode| Backend {
            mode: Some(mode),
            ..be(addr, port)
        };
        let range = Ports::Range {
            first: 8000,
            last: 8100,
        };
        let problem = |v: &Vip| match v.validate() {
            Err(ModelError::Vip { field, problem, .. }) => Some((field, problem)),
            Err(e) => panic!("{e}"),
            Ok(()) => None,
        };

        // A port of its own, under a range: refused for full NAT as for NAT.
        let mut v = vip("10.0.0.1", range, Mode::Nat);
        v.backends = vec![be("10.1.0.1", 0), own("10.1.0.2", 9000, Mode::FullNat)];
        assert_eq!(
            problem(&v),
            Some(("backends[1].port".into(), Problem::PortOnRangeVip(9000)))
        );
        // In a DSR VIP, a backend reached by NAT or full NAT may take
        // another port; one reached by DSR may not, in a NAT VIP either.
        for way in [Mode::Nat, Mode::FullNat] {
            let mut v = vip("10.0.0.1", Ports::One(80), Mode::Dsr);
            v.backends = vec![own("10.1.0.1", 8080, way)];
            assert_eq!(problem(&v), None, "{way} in a DSR VIP");
        }
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
        v.backends = vec![be("10.1.0.1", 8080), own("10.1.0.2", 8080, Mode::Dsr)];
        assert_eq!(
            problem(&v),
            Some((
                "backends[1].port".into(),
                Problem::PortRemapNeedsNat {
                    mode: Mode::Dsr,
                    port: 8080
                }
            ))
        );

        // A MAC is needed where the backend is reached by DSR, whatever
        // its VIP's mode, and only there.
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
        v.backends = vec![own("10.1.0.1", 0, Mode::Dsr)];
        let e = v.check_resolved().unwrap_err();
        assert!(e.to_string().contains("backends[0].mac"), "{e}");
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::Dsr);
        v.backends = vec![own("10.1.0.1", 0, Mode::FullNat)];
        assert!(v.check_resolved().is_ok(), "full NAT needs no MAC");

        // A backend that tunnels needs the tunnel source, in a NAT VIP too.
        let mut v = vip("10.0.0.1", Ports::One(80), Mode::Nat);
        v.backends = vec![own("10.1.0.1", 0, Mode::L3Dsr)];
        let mut s = DesiredState {
            node: NodeSettings::default(),
            vips: vec![v],
        };
        assert!(matches!(
            s.validate(),
            Err(ModelError::Vip {
                problem: Problem::NoTunnelSource { ipv6: false },
                ..
            })
        ));
        s.node.tunnel_src4 = Some("192.0.2.1".parse().unwrap());
        s.validate().expect("with a tunnel source");

        // The same address and port reached two ways: two backend ids,
        // one Maglev identity, one health target.
        let (nat, fnat) = (be("10.1.0.1", 80), own("10.1.0.1", 80, Mode::FullNat));
        assert_ne!(nat.key(), fnat.key());
        assert_eq!(nat.key().identity(), fnat.key().identity());
        assert_eq!(nat.target(), fnat.target());
        assert_eq!(fnat.mode_in(Mode::Nat), Mode::FullNat);
        assert_eq!(nat.mode_in(Mode::Dsr), Mode::Dsr);
        assert_eq!(fnat.key().to_string(), "10.1.0.1:80 via fullnat");
    }

    /// Full NAT's sources: an address the backends' replies can reach.
    #[test]
    fn fullnat_sources_are_unicast_and_not_loopback() {
        for (src4, src6, field) in [
            (Some("127.0.0.1"), None, "fullnat.src4"),
            (Some("0.0.0.0"), None, "fullnat.src4"),
            (Some("224.0.0.1"), None, "fullnat.src4"),
            (None, Some("::1"), "fullnat.src6"),
            (None, Some("::ffff:10.0.0.1"), "fullnat.src6"),
            (None, Some("ff02::1"), "fullnat.src6"),
        ] {
            let n = NodeSettings {
                fullnat: FullNatSettings {
                    src4: src4.map(|a| a.parse().unwrap()),
                    src6: src6.map(|a| a.parse().unwrap()),
                    ..FullNatSettings::default()
                },
                ..NodeSettings::default()
            };
            match n.validate() {
                Err(ModelError::Node { field: f, .. }) => {
                    assert_eq!(f, field, "{src4:?} {src6:?}")
                }
                other => panic!("{src4:?} {src6:?}: {other:?}"),
            }
        }
        let n = NodeSettings {
            fullnat: FullNatSettings {
                src4: Some("10.9.0.1".parse().unwrap()),
                src6: Some("fd00:9::1".parse().unwrap()),
                ..FullNatSettings::default()
            },
            ..NodeSettings::default()
        };
        n.validate().expect("unicast sources");
    }

    #[test]
    fn serde_round_trip() {
        let json = r#"{"vips":[{"addr":"10.0.0.1","ports":80,"proto":"tcp","mode":"dsr",
            "affinity":{"type":"clientIP","timeout_s":60},
            "backends":[{"addr":"10.1.0.1","mac":"02:00:00:00:00:01"}]}]}"#;
        let s: DesiredState = serde_json::from_str(json).unwrap();
        assert_eq!(s.vips[0].backends[0].weight, 1);
        assert_eq!(s.vips[0].affinity, Affinity::ClientIp { timeout_s: 60 });
        s.validate().unwrap();
        let back: DesiredState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!("02:00:00:00:00".parse::<Mac>().is_err());
    }
}
