//! The `bgp:` section: this node's AS and router ID, its peers, and what
//! its VIP routes carry. Validated into [`BgpSettings`] (plain data: the
//! daemon turns it into the speaker's configuration); a bad value names
//! its field and line like the rest of the file.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The 2-octet AS that stands in for 4-octet ones (RFC 6793): never an
/// AS of its own.
pub const AS_TRANS: u32 = 23456;
/// The longest TCP MD5 key the kernel takes.
pub const MAX_PASSWORD: usize = 80;
/// Peers per node.
pub const MAX_PEERS: usize = 64;
/// Communities of each kind per peer or advertisement.
pub const MAX_COMMUNITIES: usize = 64;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BgpConf {
    pub asn: u64,
    #[serde(default)]
    pub router_id: Option<String>,
    #[serde(default)]
    pub listen_port: Option<u64>,
    /// Graceful restart's restart time (how long peers keep our routes
    /// while we restart). Default 120s.
    #[serde(default, with = "humantime_serde")]
    pub restart_time: Option<Duration>,
    #[serde(default)]
    pub peers: Vec<PeerConf>,
    #[serde(default)]
    pub advertisements: Vec<AdvertisementConf>,
}

/// `bfd: true` (defaults) or the intervals.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum BfdField {
    Enabled(bool),
    Timers(BfdConf),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BfdConf {
    #[serde(default, with = "humantime_serde")]
    pub min_rx: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub min_tx: Option<Duration>,
    #[serde(default)]
    pub multiplier: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerConf {
    #[serde(default)]
    pub name: Option<String>,
    pub address: String,
    pub asn: u64,
    #[serde(default)]
    pub port: Option<u64>,
    #[serde(default)]
    pub local_address: Option<String>,
    #[serde(default)]
    pub passive: bool,
    #[serde(default, with = "humantime_serde")]
    pub hold_time: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub connect_retry: Option<Duration>,
    /// A file holding the TCP MD5 password (mode 0600 or 0400; one line,
    /// surrounding whitespace ignored).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// `ipv4`, `ipv6`; default: the peer address's family.
    #[serde(default)]
    pub families: Option<Vec<String>>,
    #[serde(default)]
    pub next_hop_ipv4: Option<String>,
    #[serde(default)]
    pub next_hop_ipv6: Option<String>,
    #[serde(default)]
    pub graceful_restart: Option<bool>,
    #[serde(default)]
    pub bfd: Option<BfdField>,
    #[serde(default)]
    pub communities: Vec<String>,
    #[serde(default)]
    pub large_communities: Vec<String>,
    #[serde(default)]
    pub local_pref: Option<u64>,
    #[serde(default)]
    pub med: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AdvertisementConf {
    /// The VIPs it applies to: CIDRs (an address pool's range).
    pub prefixes: Vec<String>,
    #[serde(default)]
    pub communities: Vec<String>,
    #[serde(default)]
    pub large_communities: Vec<String>,
    #[serde(default)]
    pub local_pref: Option<u64>,
    #[serde(default)]
    pub med: Option<u64>,
}

/// What routes carry, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutePolicy {
    pub communities: Vec<u32>,
    pub large_communities: Vec<(u32, u32, u32)>,
    pub local_pref: Option<u32>,
    pub med: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfdSettings {
    pub min_rx: Duration,
    pub min_tx: Duration,
    pub multiplier: u8,
}

impl Default for BfdSettings {
    fn default() -> Self {
        Self {
            min_rx: Duration::from_millis(300),
            min_tx: Duration::from_millis(300),
            multiplier: 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSettings {
    pub name: String,
    pub address: IpAddr,
    pub asn: u32,
    pub port: u16,
    pub local_address: Option<IpAddr>,
    pub passive: bool,
    /// Seconds; 0 or 3 to 65535.
    pub hold_time: u16,
    pub connect_retry: Duration,
    pub password: Option<Vec<u8>>,
    pub ipv4: bool,
    pub ipv6: bool,
    pub next_hop_ipv4: Option<Ipv4Addr>,
    pub next_hop_ipv6: Option<Ipv6Addr>,
    pub graceful_restart: bool,
    pub bfd: Option<BfdSettings>,
    pub policy: RoutePolicy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertisement {
    /// (network address, prefix length).
    pub prefixes: Vec<(IpAddr, u8)>,
    pub policy: RoutePolicy,
}

impl Advertisement {
    pub fn matches(&self, addr: IpAddr) -> bool {
        self.prefixes
            .iter()
            .any(|(net, len)| in_prefix(addr, *net, *len))
    }
}

/// Whether `addr` lies in `net/len`.
pub fn in_prefix(addr: IpAddr, net: IpAddr, len: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpSettings {
    pub asn: u32,
    pub router_id: Option<Ipv4Addr>,
    pub listen_port: u16,
    /// Seconds.
    pub restart_time: u16,
    pub peers: Vec<PeerSettings>,
    pub advertisements: Vec<Advertisement>,
}

impl BgpSettings {
    /// What a VIP's route carries: every advertisement that matches it,
    /// merged (communities added up, the first local preference and MED).
    pub fn policy_for(&self, vip: IpAddr) -> RoutePolicy {
        let mut p = RoutePolicy::default();
        for a in self.advertisements.iter().filter(|a| a.matches(vip)) {
            p.communities.extend(&a.policy.communities);
            p.large_communities.extend(&a.policy.large_communities);
            p.local_pref = p.local_pref.or(a.policy.local_pref);
            p.med = p.med.or(a.policy.med);
        }
        p.communities.sort_unstable();
        p.communities.dedup();
        p.large_communities.sort_unstable();
        p.large_communities.dedup();
        p
    }
}

/// A failed check: the field (as the file writes it) and the message.
pub type Fail = (String, String);

fn fail<T>(field: impl Into<String>, msg: impl Into<String>) -> Result<T, Fail> {
    Err((field.into(), msg.into()))
}

pub fn parse_asn(v: u64, field: &str) -> Result<u32, Fail> {
    match u32::try_from(v) {
        Ok(0) => fail(field, "AS 0 is reserved (RFC 7607)"),
        Ok(AS_TRANS) => fail(
            field,
            "AS 23456 is AS_TRANS (RFC 6793), not an AS of its own",
        ),
        Ok(a) => Ok(a),
        Err(_) => fail(field, format!("{v} is not an AS number (1 to 4294967295)")),
    }
}

/// `65000:100`, or `no-export`, `no-advertise`, `no-export-subconfed`,
/// `blackhole` (RFC 1997, RFC 7999).
pub fn parse_community(s: &str) -> Option<u32> {
    match s {
        "no-export" => return Some(0xFFFF_FF01),
        "no-advertise" => return Some(0xFFFF_FF02),
        "no-export-subconfed" => return Some(0xFFFF_FF03),
        "blackhole" => return Some(0xFFFF_029A),
        _ => {}
    }
    let (a, b) = s.split_once(':')?;
    let a: u16 = a.trim().parse().ok()?;
    let b: u16 = b.trim().parse().ok()?;
    Some((u32::from(a) << 16) | u32::from(b))
}

/// `4200000001:1:2` (RFC 8092).
pub fn parse_large_community(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s.split(':').map(|p| p.trim().parse::<u32>());
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c)), None) => Some((a, b, c)),
        _ => None,
    }
}

/// `10.0.0.0/24`, `fd00::/64`, or an address (a host prefix).
pub fn parse_prefix(s: &str) -> Option<(IpAddr, u8)> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a.parse::<IpAddr>().ok()?, l.parse::<u8>().ok()?),
        None => {
            let a: IpAddr = s.parse().ok()?;
            (a, if a.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if a.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((a, len))
}

fn policy(
    base: &str,
    communities: &[String],
    large: &[String],
    local_pref: Option<u64>,
    med: Option<u64>,
) -> Result<RoutePolicy, Fail> {
    if communities.len() > MAX_COMMUNITIES {
        return fail(
            format!("{base}.communities"),
            format!("at most {MAX_COMMUNITIES} communities"),
        );
    }
    if large.len() > MAX_COMMUNITIES {
        return fail(
            format!("{base}.largeCommunities"),
            format!("at most {MAX_COMMUNITIES} large communities"),
        );
    }
    let mut p = RoutePolicy::default();
    for (i, c) in communities.iter().enumerate() {
        match parse_community(c) {
            Some(v) => p.communities.push(v),
            None => {
                return fail(
                    format!("{base}.communities[{i}]"),
                    format!("{c:?} is not a community (like \"65000:100\", each half 0 to 65535, or no-export, no-advertise, no-export-subconfed, blackhole)"),
                )
            }
        }
    }
    for (i, c) in large.iter().enumerate() {
        match parse_large_community(c) {
            Some(v) => p.large_communities.push(v),
            None => {
                return fail(
                    format!("{base}.largeCommunities[{i}]"),
                    format!("{c:?} is not a large community (like \"4200000001:1:2\", three numbers 0 to 4294967295)"),
                )
            }
        }
    }
    let u32_of = |v: Option<u64>, f: &str| -> Result<Option<u32>, Fail> {
        match v {
            None => Ok(None),
            Some(v) => u32::try_from(v).map(Some).map_err(|_| {
                (
                    format!("{base}.{f}"),
                    format!("{v} is out of range 0..=4294967295"),
                )
            }),
        }
    };
    p.local_pref = u32_of(local_pref, "localPref")?;
    p.med = u32_of(med, "med")?;
    Ok(p)
}

/// Read a password file: a regular file only its owner may read, at
/// most 80 bytes once trimmed, not empty.
pub fn read_password(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {mode:04o}: group and others must not read it (chmod 600 {})",
            path.display(),
            path.display()
        ));
    }
    if meta.len() > 4096 {
        return Err(format!(
            "{} is larger than 4096 bytes: not a password",
            path.display()
        ));
    }
    let raw = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let key = raw.trim_ascii().to_vec();
    if key.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    if key.len() > MAX_PASSWORD {
        return Err(format!(
            "the password in {} is {} bytes, over TCP MD5's limit of {MAX_PASSWORD}",
            path.display(),
            key.len()
        ));
    }
    Ok(key)
}

fn secs(d: Duration) -> u64 {
    d.as_secs()
}

/// Validate the section.
pub fn validate(c: &BgpConf) -> Result<BgpSettings, Fail> {
    let asn = parse_asn(c.asn, "bgp.asn")?;
    let router_id = match &c.router_id {
        None => None,
        Some(s) => match s.parse::<Ipv4Addr>() {
            Ok(a) if !a.is_unspecified() && !a.is_broadcast() && !a.is_multicast() => Some(a),
            _ => {
                return fail(
                    "bgp.routerId",
                    format!("{s:?} is not a router ID (an IPv4 address, not 0.0.0.0, broadcast or multicast)"),
                )
            }
        },
    };
    let listen_port = match c.listen_port {
        None => 179,
        Some(p) => u16::try_from(p).map_err(|_| {
            (
                "bgp.listenPort".to_string(),
                format!("{p} is not a port (0 to 65535; 0: do not listen)"),
            )
        })?,
    };
    let restart_time = match c.restart_time {
        None => 120,
        Some(d) if d.as_secs() >= 1 && d.as_secs() <= 4095 && d.subsec_nanos() == 0 => {
            d.as_secs() as u16
        }
        Some(d) => {
            return fail(
                "bgp.restartTime",
                format!(
                    "\"{}\" is out of range: whole seconds, 1s to 4095s (RFC 4724's 12 bits)",
                    humantime::format_duration(d)
                ),
            )
        }
    };
    if c.peers.len() > MAX_PEERS {
        return fail(
            format!("bgp.peers[{MAX_PEERS}]"),
            format!("{} peers, over the limit of {MAX_PEERS}", c.peers.len()),
        );
    }
    let mut peers: Vec<PeerSettings> = Vec::new();
    for (i, p) in c.peers.iter().enumerate() {
        let base = format!("bgp.peers[{i}]");
        let address: IpAddr = p.address.parse().map_err(|_| {
            (
                format!("{base}.address"),
                format!("{:?} is not an IP address", p.address),
            )
        })?;
        if address.is_unspecified() || address.is_multicast() {
            return fail(
                format!("{base}.address"),
                format!("{address} cannot be a peer"),
            );
        }
        let address = address.to_canonical();
        if let Some(j) = peers.iter().position(|o| o.address == address) {
            return fail(
                format!("{base}.address"),
                format!("peer {address} is listed twice (first as bgp.peers[{j}])"),
            );
        }
        let peer_asn = parse_asn(p.asn, &format!("{base}.asn"))?;
        let port = match p.port {
            None => 179,
            Some(v) => match u16::try_from(v) {
                Ok(0) | Err(_) => {
                    return fail(
                        format!("{base}.port"),
                        format!("{v} is not a port (1 to 65535)"),
                    )
                }
                Ok(v) => v,
            },
        };
        let local_address = match &p.local_address {
            None => None,
            Some(s) => match s.parse::<IpAddr>() {
                Ok(a) if a.is_ipv4() == address.is_ipv4() => Some(a),
                Ok(a) => {
                    return fail(
                        format!("{base}.localAddress"),
                        format!("{a} is not of the peer's family ({address})"),
                    )
                }
                Err(_) => {
                    return fail(
                        format!("{base}.localAddress"),
                        format!("{s:?} is not an IP address"),
                    )
                }
            },
        };
        let hold_time = match p.hold_time {
            None => 90,
            Some(d) if d.subsec_nanos() == 0 && (secs(d) == 0 || (3..=65535).contains(&secs(d))) => secs(d) as u16,
            Some(d) => {
                return fail(
                    format!("{base}.holdTime"),
                    format!(
                        "\"{}\" is not a hold time: 0s (no keepalives) or whole seconds from 3s to 65535s (RFC 4271)",
                        humantime::format_duration(d)
                    ),
                )
            }
        };
        let connect_retry = match p.connect_retry {
            None => Duration::from_secs(5),
            Some(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(3600) => d,
            Some(d) => {
                return fail(
                    format!("{base}.connectRetry"),
                    format!(
                        "\"{}\" is out of range 1s to 1h",
                        humantime::format_duration(d)
                    ),
                )
            }
        };
        let password = match &p.password_file {
            None => None,
            Some(f) => Some(read_password(f).map_err(|e| (format!("{base}.passwordFile"), e))?),
        };
        let (mut ipv4, mut ipv6) = (address.is_ipv4(), address.is_ipv6());
        if let Some(fams) = &p.families {
            if fams.is_empty() {
                return fail(
                    format!("{base}.families"),
                    "at least one family (ipv4, ipv6)",
                );
            }
            ipv4 = false;
            ipv6 = false;
            for (j, f) in fams.iter().enumerate() {
                match f.as_str() {
                    "ipv4" => ipv4 = true,
                    "ipv6" => ipv6 = true,
                    other => {
                        return fail(
                            format!("{base}.families[{j}]"),
                            format!("{other:?} is not a family: ipv4 or ipv6"),
                        )
                    }
                }
            }
        }
        let next_hop_ipv4 = match &p.next_hop_ipv4 {
            None => None,
            Some(s) => Some(s.parse::<Ipv4Addr>().map_err(|_| {
                (
                    format!("{base}.nextHopIpv4"),
                    format!("{s:?} is not an IPv4 address"),
                )
            })?),
        };
        let next_hop_ipv6 = match &p.next_hop_ipv6 {
            None => None,
            Some(s) => Some(s.parse::<Ipv6Addr>().map_err(|_| {
                (
                    format!("{base}.nextHopIpv6"),
                    format!("{s:?} is not an IPv6 address"),
                )
            })?),
        };
        // A route's next hop is of its own family: over a session of the
        // other family it must be given.
        if ipv6 && address.is_ipv4() && next_hop_ipv6.is_none() {
            return fail(
                format!("{base}.nextHopIpv6"),
                "IPv6 routes over an IPv4 session need nextHopIpv6 (the session's own address is IPv4)",
            );
        }
        if ipv4 && address.is_ipv6() && next_hop_ipv4.is_none() {
            return fail(
                format!("{base}.nextHopIpv4"),
                "IPv4 routes over an IPv6 session need nextHopIpv4 (the session's own address is IPv6)",
            );
        }
        let bfd = match &p.bfd {
            None | Some(BfdField::Enabled(false)) => None,
            Some(BfdField::Enabled(true)) => Some(BfdSettings::default()),
            Some(BfdField::Timers(t)) => {
                let d = BfdSettings::default();
                let iv = |v: Option<Duration>, def: Duration, f: &str| -> Result<Duration, Fail> {
                    match v {
                        None => Ok(def),
                        Some(v)
                            if v >= Duration::from_millis(10) && v <= Duration::from_secs(60) =>
                        {
                            Ok(v)
                        }
                        Some(v) => fail(
                            format!("{base}.bfd.{f}"),
                            format!(
                                "\"{}\" is out of range 10ms to 60s",
                                humantime::format_duration(v)
                            ),
                        ),
                    }
                };
                let multiplier = match t.multiplier {
                    None => d.multiplier,
                    Some(m @ 1..=255) => m as u8,
                    Some(m) => {
                        return fail(
                            format!("{base}.bfd.multiplier"),
                            format!("{m} is out of range 1..=255"),
                        )
                    }
                };
                Some(BfdSettings {
                    min_rx: iv(t.min_rx, d.min_rx, "minRx")?,
                    min_tx: iv(t.min_tx, d.min_tx, "minTx")?,
                    multiplier,
                })
            }
        };
        peers.push(PeerSettings {
            name: p.name.clone().unwrap_or_else(|| address.to_string()),
            address,
            asn: peer_asn,
            port,
            local_address,
            passive: p.passive,
            hold_time,
            connect_retry,
            password,
            ipv4,
            ipv6,
            next_hop_ipv4,
            next_hop_ipv6,
            graceful_restart: p.graceful_restart.unwrap_or(true),
            bfd,
            policy: policy(
                &base,
                &p.communities,
                &p.large_communities,
                p.local_pref,
                p.med,
            )?,
        });
    }
    let mut advertisements = Vec::new();
    for (i, a) in c.advertisements.iter().enumerate() {
        let base = format!("bgp.advertisements[{i}]");
        if a.prefixes.is_empty() {
            return fail(
                format!("{base}.prefixes"),
                "at least one prefix (the VIPs it applies to)",
            );
        }
        let mut prefixes = Vec::new();
        for (j, s) in a.prefixes.iter().enumerate() {
            match parse_prefix(s) {
                Some(p) => prefixes.push(p),
                None => {
                    return fail(
                        format!("{base}.prefixes[{j}]"),
                        format!("{s:?} is not a prefix (like 10.0.0.0/24 or fd00::/64)"),
                    )
                }
            }
        }
        advertisements.push(Advertisement {
            prefixes,
            policy: policy(
                &base,
                &a.communities,
                &a.large_communities,
                a.local_pref,
                a.med,
            )?,
        });
    }
    Ok(BgpSettings {
        asn,
        router_id,
        listen_port,
        restart_time,
        peers,
        advertisements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communities_and_prefixes_parse() {
        assert_eq!(parse_community("65000:100"), Some((65000 << 16) | 100));
        assert_eq!(parse_community("no-export"), Some(0xFFFF_FF01));
        assert_eq!(parse_community("65536:1"), None);
        assert_eq!(parse_community("1"), None);
        assert_eq!(
            parse_large_community("4200000001:1:2"),
            Some((4_200_000_001, 1, 2))
        );
        assert_eq!(parse_large_community("1:2"), None);
        assert_eq!(parse_large_community("1:2:3:4"), None);
        assert_eq!(
            parse_prefix("10.0.0.0/24"),
            Some(("10.0.0.0".parse().unwrap(), 24))
        );
        assert_eq!(parse_prefix("10.0.0.0/33"), None);
        assert_eq!(
            parse_prefix("fd00::1"),
            Some(("fd00::1".parse().unwrap(), 128))
        );
        assert!(in_prefix(
            "10.0.0.9".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            24
        ));
        assert!(!in_prefix(
            "10.0.1.9".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            24
        ));
        assert!(in_prefix(
            "10.0.1.9".parse().unwrap(),
            "0.0.0.0".parse().unwrap(),
            0
        ));
        assert!(!in_prefix(
            "fd00::1".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            0
        ));
    }

    #[test]
    fn as_numbers_refuse_0_as_trans_and_overflow() {
        assert!(parse_asn(0, "x").is_err());
        assert!(parse_asn(23456, "x").is_err());
        assert!(parse_asn(1 << 32, "x").is_err());
        assert_eq!(parse_asn(4_200_000_001, "x"), Ok(4_200_000_001));
    }

    const HEAD: &str = "interfaces: [{name: eth0}]\n";

    fn parse(bgp: &str) -> Result<BgpSettings, crate::config::ConfigError> {
        let text = format!("{HEAD}{bgp}");
        crate::config::parse(std::path::Path::new("r.yaml"), &text)
            .map(|c| c.bgp.expect("a bgp section"))
    }

    #[test]
    fn a_full_section_validates() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret\n").unwrap();
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let b = parse(&format!(
            "bgp:\n  asn: 4200000001\n  routerId: 10.0.0.2\n  peers:\n\
             \x20   - {{address: 10.0.0.1, asn: 65000, holdTime: 9s, passwordFile: {}, bfd: {{minRx: 100ms, minTx: 100ms, multiplier: 3}}, communities: [\"65000:1\"], families: [ipv4, ipv6], nextHopIpv6: \"fd00::2\"}}\n\
             \x20   - {{address: \"fd00::1\", asn: 65000, passive: true, bfd: true, localPref: 200}}\n\
             \x20 advertisements:\n    - {{prefixes: [10.0.100.0/24], largeCommunities: [\"1:2:3\"], med: 5}}\n",
            pw.display()
        ))
        .unwrap();
        assert_eq!(
            (b.asn, b.router_id),
            (4_200_000_001, Some("10.0.0.2".parse().unwrap()))
        );
        let p = &b.peers[0];
        assert_eq!(p.password.as_deref(), Some(&b"s3cret"[..]));
        assert_eq!(p.hold_time, 9);
        assert!(p.ipv4 && p.ipv6);
        assert_eq!(p.bfd.unwrap().min_rx, Duration::from_millis(100));
        assert_eq!(p.policy.communities, vec![(65000 << 16) | 1]);
        assert!(b.peers[1].passive && b.peers[1].bfd == Some(BfdSettings::default()));
        let pol = b.policy_for("10.0.100.7".parse().unwrap());
        assert_eq!((pol.large_communities, pol.med), (vec![(1, 2, 3)], Some(5)));
        assert_eq!(
            b.policy_for("10.0.101.7".parse().unwrap()),
            RoutePolicy::default()
        );
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let cases = [
            ("bgp:\n  asn: 0\n", "r.yaml:3: bgp.asn: AS 0"),
            ("bgp:\n  asn: 65001\n  routerId: 0.0.0.0\n", "r.yaml:4: bgp.routerId"),
            (
                "bgp:\n  asn: 65001\n  peers:\n    - address: 10.0.0.1\n      asn: 65000\n      holdTime: 2s\n",
                "r.yaml:7: bgp.peers[0].holdTime",
            ),
            (
                "bgp:\n  asn: 65001\n  peers:\n    - address: 10.0.0.1\n      asn: 65000\n      communities: [\"1:70000\"]\n",
                "bgp.peers[0].communities[0]",
            ),
            (
                "bgp:\n  asn: 65001\n  peers:\n    - {address: 10.0.0.1, asn: 1}\n    - {address: 10.0.0.1, asn: 2}\n",
                "bgp.peers[1].address: peer 10.0.0.1 is listed twice",
            ),
            (
                "bgp:\n  asn: 65001\n  peers:\n    - {address: 10.0.0.1, asn: 1, families: [ipv6]}\n",
                "bgp.peers[0].nextHopIpv6",
            ),
            (
                "bgp:\n  asn: 65001\n  peers:\n    - {address: 10.0.0.1, asn: 1, passwordFile: /nonexistent/pw}\n",
                "bgp.peers[0].passwordFile: cannot read /nonexistent/pw",
            ),
            (
                "bgp:\n  asn: 65001\n  peers:\n    - {address: 10.0.0.1, asn: 1, bfd: {minRx: 1ms}}\n",
                "bgp.peers[0].bfd.minRx",
            ),
            ("bgp:\n  asn: 65001\n  typo: 1\n", "unknown field `typo`"),
        ];
        for (yaml, want) in cases {
            let e = parse(yaml).expect_err(yaml).to_string();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }

    #[test]
    fn a_password_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "x").unwrap();
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let e = read_password(&pw).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::fs::write(&pw, [b'x'; 81]).unwrap();
        assert!(read_password(&pw).unwrap_err().contains("80"));
    }
}
