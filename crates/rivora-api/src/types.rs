//! What the API carries on the wire. Plain data: the daemon fills these from
//! its desired state, the health checker and the stats maps; the server only
//! serialises them.
//!
//! Response types accept unknown fields on purpose, so an older `rivoractl`
//! keeps working against a newer `rivorad`. Request types deny them, so a
//! misspelt field is an error rather than a silently ignored option.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ApiRequestError;

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    /// Bumped each time a configuration is applied (start or reload).
    pub config_generation: u64,
    pub last_reload: ReloadResult,
    pub interfaces: Vec<InterfaceStatus>,
    pub vip_count: u64,
    pub backend_count: u64,
    /// Load-time capacities of the datapath (rivorad flags; changing one
    /// means `rivorad -cleanup`): Maglev slots, entries in each per-flow
    /// table, and the share of them each CPU keeps.
    #[serde(default)]
    pub maglev_size: u32,
    #[serde(default)]
    pub flow_table_size: u32,
    #[serde(default)]
    pub flow_table_per_cpu: u32,
    /// Map writes under way right now (the answer comes from the state
    /// before them: reads never wait for the reconciler).
    #[serde(default)]
    pub apply_in_progress: bool,
    /// VIPs adopted from the pinned maps that no source has claimed yet
    /// (kept forwarding until every source has synced).
    #[serde(default)]
    pub unclaimed_vips: u64,
    /// VIP keys two sources claim: the first keeps it.
    #[serde(default)]
    pub conflicts: Vec<String>,
    /// VIPs wanted but not in the maps as wanted, with the reason.
    #[serde(default)]
    pub failed_vips: Vec<String>,
    /// Each source of desired state this rivorad runs (the file, or the
    /// Kubernetes Services), in a fixed order.
    #[serde(default)]
    pub sources: Vec<SourceInfo>,
    /// The Kubernetes source's watches, in a fixed order; empty without
    /// `-kubernetes`.
    #[serde(default)]
    pub watches: Vec<WatchInfo>,
    /// The L2 speaker (ARP and NDP for the VIPs); absent when this node
    /// announces nothing by L2, and from an older rivorad.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<L2Info>,
}

/// The L2 speaker's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct L2Info {
    /// `static` (`announce: l2`: no Lease, this node answers) or
    /// `kubernetes` (one Lease per group).
    pub mode: String,
    /// This node's identity in the Leases (`<node>_<run>`).
    #[serde(default)]
    pub identity: Option<String>,
    /// The groups this node stands for.
    #[serde(default)]
    pub groups: Vec<L2Group>,
    /// The last error of the speaker's watches (AddressPools, this Node,
    /// the Leases), if any.
    #[serde(default)]
    pub last_error: Option<String>,
}

/// One group: a Lease (`rivora-l2-<pool or interface>[-<address>]`), or
/// `static`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct L2Group {
    pub name: String,
    /// This node answers for the group's VIPs now.
    pub owner: bool,
    /// Unix seconds since `owner` last changed (or since this node began
    /// to stand for the group).
    pub since: u64,
    /// The Lease's holder as last seen: this node's identity, another's,
    /// or null (free, or no Lease).
    #[serde(default)]
    pub holder: Option<String>,
    pub interfaces: Vec<String>,
    /// The VIP addresses the owner answers for (those this node serves).
    pub vips: Vec<IpAddr>,
}

/// One source of desired state, as the reconciler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// `file`, `service` (Kubernetes Services) or `gateway`. A string, not
    /// an enum, so an older `rivoractl` shows a kind it does not know.
    pub kind: String,
    /// Has finished its first full pass: until every source has, adopted
    /// VIPs nothing claims are kept.
    pub synced: bool,
    /// Objects it currently owns (the file; one per Service).
    pub objects: u64,
    /// Updates applied in full.
    pub updates_ok: u64,
    /// Updates refused (invalid input) or not applied in full.
    pub updates_failed: u64,
    /// Unix seconds of the last update, either way; 0: none yet.
    pub last_at: u64,
    /// Why the last update failed; null after a success.
    #[serde(default)]
    pub last_error: Option<String>,
}

/// One watch of the Kubernetes source (`services`, `endpointslices`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchInfo {
    /// The resource, plural as the Kubernetes API names it.
    pub resource: String,
    /// Has finished its first full list.
    pub synced: bool,
    /// Objects it holds now.
    pub objects: u64,
    /// Failed lists and watches since rivorad started (each retried).
    pub errors: u64,
    /// The last of them; it stays after the watch recovers, with its time.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Unix seconds of `last_error`; 0: none.
    #[serde(default)]
    pub last_error_at: u64,
}

/// The outcome of the last configuration load (`POST /v1/reload` answers
/// with one too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadResult {
    pub ok: bool,
    /// Unix time, seconds.
    pub at: u64,
    /// Always present (null on success) so scripts see a stable shape.
    #[serde(default)]
    pub error: Option<String>,
    /// Settings the file changed that a reload does not apply (interfaces,
    /// listeners, the token file): one sentence each. Always present
    /// (empty when none); absent from an older rivorad's answer.
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceStatus {
    pub name: String,
    pub ifindex: u32,
    pub xdp_mode: XdpMode,
    /// Whether `tc_nat` is attached on TCX egress.
    pub tc_attached: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XdpMode {
    Native,
    Generic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VipMode {
    Nat,
    Dsr,
    L3dsr,
    Fullnat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Affinity {
    None,
    ClientIp,
}

/// The state `backend_health_map` holds for a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendHealth {
    Healthy,
    Draining,
    Down,
}

impl BackendHealth {
    pub const ALL: [BackendHealth; 3] = [Self::Healthy, Self::Draining, Self::Down];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Draining => "draining",
            Self::Down => "down",
        }
    }
}

/// What the active health checker last concluded, independent of drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeState {
    Healthy,
    Down,
    /// Checks are on but have not reached rise or fall yet.
    Unknown,
    Disabled,
}

impl ProbeState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Down => "down",
            Self::Unknown => "unknown",
            Self::Disabled => "disabled",
        }
    }
}

/// An inclusive port range; a single-port VIP has `first == last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Ports {
    pub first: u16,
    pub last: u16,
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// One entry of `GET /v1/vips` and the body of `GET /v1/vips/{vip}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipInfo {
    /// The VIP's name, as [`VipName`] displays it: `tcp/10.0.0.1:80`.
    pub vip: String,
    pub addr: IpAddr,
    pub ports: Ports,
    pub proto: Proto,
    pub mode: VipMode,
    pub affinity: Affinity,
    pub service_id: u32,
    /// The VIP's slice of the shared Maglev table.
    pub slice_start: u32,
    pub slice_len: u32,
    pub backends: Vec<VipBackend>,
    pub packets: u64,
    pub bytes: u64,
    /// SYNs dropped by the VIP's rate limit (or the node-wide one).
    pub rate_limited: u64,
    /// Packets dropped because no backend was healthy.
    pub no_backend: u64,
    /// New full-NAT flows dropped: every port tried towards their backend
    /// was held, or the port table was full.
    #[serde(default)]
    pub fullnat_ports_exhausted: u64,
    #[serde(default)]
    pub fullnat_table_full: u64,
    /// Who wants the VIP: `file` (the static file), `service ns/name` (a
    /// Kubernetes Service), `gateway ns/name`, or `unclaimed`: adopted
    /// from the pinned maps on start and not yet claimed by any source
    /// (it keeps forwarding until every source has synced; its backends'
    /// weights are then the Maglev slots each holds, as the maps keep no
    /// weights). Empty from an older rivorad.
    #[serde(default)]
    pub source: String,
    /// How its Maglev slice compares with what its weights need.
    #[serde(default)]
    pub slice_precision: SlicePrecision,
    /// The client prefixes it admits; absent: every client. A list with
    /// none of the VIP's family admits nobody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<String>>,
    /// Packets from clients outside its source ranges, dropped.
    #[serde(default)]
    pub source_refused: u64,
}

/// A VIP's Maglev slice against its weights (docs/datapath.md "Maglev").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlicePrecision {
    /// Slots its weights need for every backend's share of the slice to
    /// be within 5 % of its weight's share (0.05 points for shares under
    /// 1 %). 0 when unknown: an unclaimed VIP (the maps keep no weights),
    /// or an older rivorad.
    pub needed: u32,
    /// Slots it gets when the Maglev table has room.
    pub wanted: u32,
    /// The slice is smaller than `needed`: the table is too full to give
    /// this VIP the precision its weights ask for.
    pub reduced: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipBackend {
    pub target: SocketAddr,
    pub backend_id: u32,
    /// As written: 0 while drained for this VIP. For an `unclaimed` VIP,
    /// whose weights the maps do not keep, the Maglev slots the backend
    /// holds in the VIP's slice (0 still means no new flows).
    pub weight: u32,
    pub health: BackendHealth,
    /// Drained for this VIP by an operator (or a terminating endpoint).
    pub drained: bool,
    /// How it is reached: its own mode (Kubernetes reaches endpoints on
    /// other nodes by full NAT), else the VIP's. Absent from an older
    /// rivorad: the VIP's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<VipMode>,
    /// The node it lives behind, when its source says (a Kubernetes
    /// endpoint's nodeName).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// One entry of `GET /v1/backends`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendInfo {
    pub target: SocketAddr,
    pub backend_id: u32,
    /// What the datapath sees: a failed probe wins over a drain.
    pub health: BackendHealth,
    pub probe: ProbeState,
    pub drained_by_operator: bool,
    /// Names of the VIPs this backend serves.
    pub vips: Vec<String>,
}

/// `GET /v1/drops`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drops {
    /// Keyed by the drop reason's metric label (`abi::drop_reason_label`).
    pub by_reason: BTreeMap<String, u64>,
    /// Keyed by VIP name.
    pub rate_limited_by_vip: BTreeMap<String, u64>,
}

/// Body of `POST /v1/drain` and `POST /v1/undrain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// The backend, `addr:port` (`[v6]:port` for IPv6).
    pub target: String,
    /// Limit the drain to one VIP; every VIP the backend serves if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<String>,
}

impl DrainRequest {
    /// Checks the syntax; whether the backend and VIP exist is the state's
    /// business.
    pub fn validate(&self) -> Result<DrainSpec, ApiRequestError> {
        let target = SocketAddr::from_str(self.target.trim()).map_err(|_| {
            ApiRequestError::InvalidTarget {
                input: self.target.clone(),
            }
        })?;
        let vip = self.vip.as_deref().map(VipName::from_str).transpose()?;
        Ok(DrainSpec { target, vip })
    }
}

/// A [`DrainRequest`] whose syntax has been checked: what the state sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainSpec {
    pub target: SocketAddr,
    pub vip: Option<VipName>,
}

/// What a drain or undrain did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainOutcome {
    pub target: SocketAddr,
    /// The VIPs whose drain state the request concerns.
    pub vips: Vec<String>,
    /// False when every VIP was already in the requested state: drains are
    /// idempotent so scripts can retry.
    pub changed: bool,
}

/// Body of `POST /v1/reload`: empty, or an empty JSON object. A type so that
/// fields added later are refused by older daemons rather than ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadRequest {}

/// Every 4xx and 5xx answer carries this body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

/// A VIP's identity, `proto/addr:port` or `proto/addr:first-last`, with an
/// IPv6 address in brackets: `udp/[2001:db8::1]:53`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VipName {
    pub proto: Proto,
    pub addr: IpAddr,
    pub ports: Ports,
}

impl fmt::Display for VipName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let proto = match self.proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        match self.addr {
            IpAddr::V4(a) => write!(f, "{proto}/{a}:{}", self.ports),
            IpAddr::V6(a) => write!(f, "{proto}/[{a}]:{}", self.ports),
        }
    }
}

impl FromStr for VipName {
    type Err = ApiRequestError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &'static str| ApiRequestError::InvalidVip {
            input: input.to_string(),
            reason,
        };
        let (proto, rest) = input
            .split_once('/')
            .ok_or_else(|| bad("expected proto/addr:port"))?;
        let proto = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            _ => return Err(bad("protocol must be tcp or udp")),
        };
        let (addr, ports) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected proto/addr:port"))?;
        let addr = if let Some(inner) = addr.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| bad("unclosed '[' in IPv6 address"))?;
            match IpAddr::from_str(inner) {
                Ok(a @ IpAddr::V6(_)) => a,
                _ => return Err(bad("invalid IPv6 address")),
            }
        } else {
            match IpAddr::from_str(addr) {
                Ok(a @ IpAddr::V4(_)) => a,
                Ok(IpAddr::V6(_)) => return Err(bad("an IPv6 address must be in brackets")),
                Err(_) => return Err(bad("invalid IP address")),
            }
        };
        let port = |s: &str| u16::from_str(s).map_err(|_| bad("invalid port"));
        let ports = match ports.split_once('-') {
            Some((a, b)) => Ports {
                first: port(a)?,
                last: port(b)?,
            },
            None => {
                let p = port(ports)?;
                Ports { first: p, last: p }
            }
        };
        if ports.first == 0 || ports.first > ports.last {
            return Err(bad("ports must be 1-65535 with first <= last"));
        }
        Ok(VipName { proto, addr, ports })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vip_names_round_trip() {
        for s in [
            "tcp/10.0.0.1:80",
            "udp/[2001:db8::1]:53",
            "tcp/10.0.0.1:8000-8100",
            "udp/[::1]:1-65535",
        ] {
            let v: VipName = s.parse().expect(s);
            assert_eq!(v.to_string(), s);
        }
        let v: VipName = "TCP/[2001:DB8:0::1]:80".parse().unwrap();
        assert_eq!(v.to_string(), "tcp/[2001:db8::1]:80", "canonical form");
    }

    #[test]
    fn vip_names_reject_bad_syntax() {
        for s in [
            "",
            "10.0.0.1:80",
            "sctp/10.0.0.1:80",
            "tcp/10.0.0.1",
            "tcp/10.0.0.1:0",
            "tcp/10.0.0.1:65536",
            "tcp/10.0.0.1:90-80",
            "tcp/2001:db8::1:80",
            "tcp/[10.0.0.1]:80",
            "tcp/[2001:db8::1:80",
            "tcp/host.example:80",
            "tcp/10.0.0.1:80-",
        ] {
            let err = s.parse::<VipName>().expect_err(s);
            assert!(
                matches!(err, ApiRequestError::InvalidVip { .. }),
                "{s}: {err:?}"
            );
        }
    }

    #[test]
    fn drain_request_validation() {
        let ok = DrainRequest {
            target: "[2001:db8::2]:8080".into(),
            vip: Some("tcp/10.0.0.1:80".into()),
        }
        .validate()
        .unwrap();
        assert_eq!(ok.target, "[2001:db8::2]:8080".parse().unwrap());
        assert_eq!(ok.vip.unwrap().to_string(), "tcp/10.0.0.1:80");

        for target in ["10.0.0.2", "10.0.0.2:x", "backend:80", ""] {
            let err = DrainRequest {
                target: target.into(),
                vip: None,
            }
            .validate()
            .expect_err(target);
            assert!(matches!(err, ApiRequestError::InvalidTarget { .. }));
        }
        let err = DrainRequest {
            target: "10.0.0.2:80".into(),
            vip: Some("nope".into()),
        }
        .validate()
        .unwrap_err();
        assert!(matches!(err, ApiRequestError::InvalidVip { .. }));
    }

    /// A VIP as an older rivorad sent it: no `source`.
    const OLD_VIP: &str = r#"{"vip":"tcp/10.0.0.1:80","addr":"10.0.0.1",
        "ports":{"first":80,"last":80},"proto":"tcp","mode":"nat","affinity":"none",
        "service_id":1,"slice_start":0,"slice_len":7,
        "backends":[{"target":"10.0.1.1:8080","backend_id":1,"weight":1,"health":"healthy","drained":false}],
        "packets":1,"bytes":2,"rate_limited":0,"no_backend":0}"#;

    /// A status as an older rivorad sent it: no `sources`, no `watches`.
    const OLD_STATUS: &str = r#"{"version":"0.1.0","config_generation":2,
        "last_reload":{"ok":true,"at":5,"error":null,"warnings":[]},
        "interfaces":[{"name":"eth0","ifindex":2,"xdp_mode":"native","tc_attached":true}],
        "vip_count":1,"backend_count":1,"maglev_size":65537,"flow_table_size":131072,
        "flow_table_per_cpu":65536,"apply_in_progress":false,"unclaimed_vips":0,
        "conflicts":[],"failed_vips":[]}"#;

    #[test]
    fn vip_info_source_defaults_and_round_trips() {
        let old: VipInfo = serde_json::from_str(OLD_VIP).expect("an older rivorad's VIP");
        assert_eq!(old.source, "");
        for source in ["file", "service shop/web", "unclaimed"] {
            let v = VipInfo {
                source: source.into(),
                ..old.clone()
            };
            let json = serde_json::to_value(&v).unwrap();
            assert_eq!(json["source"], source);
            let back: VipInfo = serde_json::from_value(json).unwrap();
            assert_eq!(back, v);
        }
    }

    #[test]
    fn status_sources_and_watches_default_and_round_trip() {
        let old: Status = serde_json::from_str(OLD_STATUS).expect("an older rivorad's status");
        assert!(old.sources.is_empty());
        assert!(old.watches.is_empty());
        assert_eq!(old.l2, None);
        // Absent, it is not written either (what an older rivoractl reads).
        assert!(serde_json::to_value(&old).unwrap().get("l2").is_none());

        let new = Status {
            sources: vec![SourceInfo {
                kind: "service".into(),
                synced: true,
                objects: 3,
                updates_ok: 7,
                updates_failed: 1,
                last_at: 1_700_000_000,
                last_error: Some("shop/web: no free Maglev space".into()),
            }],
            watches: vec![WatchInfo {
                resource: "endpointslices".into(),
                synced: false,
                objects: 30,
                errors: 2,
                last_error: Some("connection refused".into()),
                last_error_at: 1_699_999_990,
            }],
            ..old
        };
        let json = serde_json::to_value(&new).unwrap();
        // The names scripts read.
        assert_eq!(
            json["sources"][0],
            serde_json::json!({"kind": "service", "synced": true, "objects": 3,
                "updates_ok": 7, "updates_failed": 1, "last_at": 1_700_000_000u64,
                "last_error": "shop/web: no free Maglev space"})
        );
        assert_eq!(
            json["watches"][0],
            serde_json::json!({"resource": "endpointslices", "synced": false, "objects": 30,
                "errors": 2, "last_error": "connection refused",
                "last_error_at": 1_699_999_990u64})
        );
        let back: Status = serde_json::from_value(json).unwrap();
        assert_eq!(back, new);

        // A watch or source without an error: null, and null parses.
        let w: WatchInfo = serde_json::from_str(
            r#"{"resource":"services","synced":true,"objects":1,"errors":0,"last_error":null}"#,
        )
        .unwrap();
        assert_eq!((w.last_error, w.last_error_at), (None, 0));
    }

    #[test]
    fn drain_request_denies_unknown_fields() {
        let r: Result<DrainRequest, _> =
            serde_json::from_str(r#"{"target":"10.0.0.2:80","vips":"tcp/10.0.0.1:80"}"#);
        assert!(r.is_err());
    }
}

/// `GET /v1/bgp/peers`: one BGP session of this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpPeerInfo {
    pub name: String,
    pub address: IpAddr,
    pub asn: u32,
    /// `Idle`, `Connect`, `Active`, `OpenSent`, `OpenConfirm`,
    /// `Established`.
    pub state: String,
    #[serde(default)]
    pub local_address: Option<IpAddr>,
    /// Seconds Established; 0 when not.
    pub uptime_seconds: u64,
    /// Unix seconds it became Established; 0 when not.
    #[serde(default)]
    pub established_at: u64,
    /// Times it left Established.
    pub flaps: u64,
    pub updates_sent: u64,
    pub updates_received: u64,
    /// Negotiated hold time, seconds.
    pub hold_time: u32,
    /// Negotiated families (`ipv4-unicast`, `ipv6-unicast`).
    #[serde(default)]
    pub families: Vec<String>,
    /// The peer speaks graceful restart (RFC 4724).
    #[serde(default)]
    pub graceful_restart: bool,
    /// Routes the peer holds from this node.
    pub advertised: u64,
    /// BFD: `Up`, `Down`, `Init`, `AdminDown`; null when not configured.
    #[serde(default)]
    pub bfd_state: Option<String>,
    /// BFD detection time in force, milliseconds.
    #[serde(default)]
    pub bfd_detect_ms: u64,
    #[serde(default)]
    pub last_error: Option<String>,
}

/// `GET /v1/bgp/routes`: one route this node announces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpRouteInfo {
    /// `10.0.0.1/32`, `fd00::1/128`.
    pub prefix: String,
    /// `65000:100`.
    #[serde(default)]
    pub communities: Vec<String>,
    /// `4200000001:1:2`.
    #[serde(default)]
    pub large_communities: Vec<String>,
    #[serde(default)]
    pub local_pref: Option<u32>,
    #[serde(default)]
    pub med: Option<u32>,
    /// The peers (by address) that hold it now.
    #[serde(default)]
    pub peers: Vec<String>,
}
