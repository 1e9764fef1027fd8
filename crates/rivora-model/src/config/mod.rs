//! The static configuration file: YAML to desired state.
//!
//! The file is the whole desired set for a node. Parsing and validation
//! are pure: `load` either returns a complete [`Config`] or an error that
//! names the file, the line and the field, and nothing of a bad file ever
//! reaches the dataplane (the caller keeps its running state).
//!
//! One YAML parser, serde_yaml_ng: values are checked while deserialising
//! (see `fields`), so a bad one fails at its own line and path; checks that
//! need the whole file run after, and find their field's line in the text
//! again (see `yaml`). Every duration in the file is humantime's syntax.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::health::{self as healthcheck, HealthCheckOverride, HealthCheckSpec};
use crate::lease::{LeaseTimings, Precision};
use crate::model::XdpMode;
use crate::model::{
    Affinity, Backend, CapacityError, DesiredState, FullNatSettings, Mac, Mode, ModelError,
    NodeSettings, Ports, Protocol, RateLimit, Vip, VipKey, MAX_IFACES,
};
use crate::source_range::SourceRange;

pub mod bgp;
mod fields;
mod yaml;

/// What a file is checked to fit (the datapath's load-time sizes).
pub use crate::model::Capacity;
pub use yaml::{MAX_BYTES, MAX_DEPTH};

/// Default API socket.
pub const DEFAULT_SOCKET: &str = "/run/rivora/rivorad.sock";

/// The configuration as written (camelCase keys, unknown keys refused).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct File {
    #[serde(default)]
    pub interfaces: Vec<InterfaceConf>,
    #[serde(default)]
    pub node: NodeConf,
    /// Defaults for every VIP's health check.
    #[serde(default)]
    pub health_check: HealthCheckSpec,
    #[serde(default)]
    pub api: ApiConf,
    #[serde(default)]
    pub metrics: MetricsConf,
    #[serde(default)]
    pub vips: Vec<VipConf>,
    /// The BGP speaker: this node's AS, its peers, what routes carry.
    #[serde(default)]
    pub bgp: Option<bgp::BgpConf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InterfaceConf {
    #[serde(deserialize_with = "fields::interface_name")]
    pub name: String,
    /// native (fail if the driver cannot), generic, or auto (native,
    /// falling back to generic with a warning). Default auto.
    #[serde(default = "default_xdp_mode")]
    pub xdp_mode: XdpMode,
}

fn default_xdp_mode() -> XdpMode {
    XdpMode::Auto
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeConf {
    /// Node-wide per-source SYN limit for VIPs without their own.
    #[serde(default)]
    pub syn_rate_limit: Option<RateLimitConf>,
    /// Outer source addresses for L3 DSR.
    #[serde(default)]
    pub tunnel_source: TunnelConf,
    /// How this node's VIPs reach the link: `l2` (answer ARP and NDP for
    /// them) or `none` (the default: BGP or the network's own routes).
    /// With `-kubernetes`, AddressPools with an `l2Announcement` are
    /// announced either way; `l2` announces the VIPs of no such pool too.
    #[serde(default)]
    pub announce: Announce,
    /// The L2 speaker's settings.
    #[serde(default)]
    pub l2: L2Conf,
    /// Full NAT's source addresses, ports and timeouts.
    #[serde(default)]
    pub snat: SnatConf,
}

/// `node.snat`: what full NAT rewrites a request's source to.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnatConf {
    /// The source of every full-NAT flow of the family; an address this
    /// node holds (rivorad checks). Unset: the address the node's route to
    /// each backend prefers.
    #[serde(default, deserialize_with = "fields::opt_ipv4")]
    pub ipv4: Option<Ipv4Addr>,
    #[serde(default, deserialize_with = "fields::opt_ipv6")]
    pub ipv6: Option<Ipv6Addr>,
    /// Source ports, an inclusive range (`"1024-32767"`, the default).
    #[serde(default)]
    pub ports: Option<PortSpec>,
    /// Idle time after which a flow's port is given again (default 6h).
    #[serde(
        default,
        deserialize_with = "fields::opt_fullnat_timeout",
        serialize_with = "humantime_serde::serialize"
    )]
    pub tcp_timeout: Option<Duration>,
    /// The same once a FIN or RST was seen (default 10s).
    #[serde(
        default,
        deserialize_with = "fields::opt_fullnat_timeout",
        serialize_with = "humantime_serde::serialize"
    )]
    pub tcp_closing_timeout: Option<Duration>,
    /// For UDP (default 60s).
    #[serde(
        default,
        deserialize_with = "fields::opt_fullnat_timeout",
        serialize_with = "humantime_serde::serialize"
    )]
    pub udp_timeout: Option<Duration>,
}

impl SnatConf {
    /// The model's settings: the file's, defaults for what it leaves out.
    pub fn settings(&self) -> FullNatSettings {
        let d = FullNatSettings::default();
        let ms = |t: Option<Duration>, default: u32| {
            t.map_or(default, |t| {
                u32::try_from(t.as_millis()).unwrap_or(u32::MAX)
            })
        };
        let (port_min, port_max) = match self.ports.map(|p| p.0) {
            Some(Ports::One(p)) => (p, p),
            Some(Ports::Range { first, last }) => (first, last),
            None => (d.port_min, d.port_max),
        };
        FullNatSettings {
            src4: self.ipv4,
            src6: self.ipv6,
            port_min,
            port_max,
            tcp_timeout_ms: ms(self.tcp_timeout, d.tcp_timeout_ms),
            tcp_closing_timeout_ms: ms(self.tcp_closing_timeout, d.tcp_closing_timeout_ms),
            udp_timeout_ms: ms(self.udp_timeout, d.udp_timeout_ms),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Announce {
    #[default]
    None,
    L2,
}

/// Default period of gratuitous ARP and unsolicited advertisements.
pub const DEFAULT_GRATUITOUS_INTERVAL: Duration = Duration::from_secs(30);
/// Default namespace of the L2 speaker's Leases (then `$POD_NAMESPACE`
/// wins over it when set).
pub const DEFAULT_LEASE_NAMESPACE: &str = "rivora-system";

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct L2Conf {
    /// Interfaces to answer on, of `interfaces`. Empty: all of them.
    #[serde(default)]
    pub interfaces: Vec<L2Interface>,
    /// How often the owner repeats its gratuitous ARP and unsolicited
    /// advertisements (it also sends them at once on winning). 1s to 1h.
    #[serde(default = "default_gratuitous", with = "humantime_serde")]
    pub gratuitous_interval: Duration,
    /// `-kubernetes`: the labels this node's Node object must carry for
    /// it to announce anything (beside each pool's own `nodeSelector`).
    /// Empty: every node.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// `-kubernetes`: the Leases' namespace and timings.
    #[serde(default)]
    pub lease: L2LeaseConf,
}

fn default_gratuitous() -> Duration {
    DEFAULT_GRATUITOUS_INTERVAL
}

impl Default for L2Conf {
    fn default() -> Self {
        Self {
            interfaces: Vec::new(),
            gratuitous_interval: DEFAULT_GRATUITOUS_INTERVAL,
            node_selector: BTreeMap::new(),
            lease: L2LeaseConf::default(),
        }
    }
}

/// One of `node.l2.interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct L2Interface(#[serde(deserialize_with = "fields::interface_name")] pub String);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct L2LeaseConf {
    /// Default: `$POD_NAMESPACE`, else `rivora-system`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// How long the others wait from the owner's last renewal they saw.
    #[serde(default = "default_lease_duration", with = "humantime_serde")]
    pub duration: Duration,
    /// The owner goes quiet this long after it sent its last renewal
    /// that succeeded. Below `duration` by at least 100ms.
    #[serde(default = "default_renew_deadline", with = "humantime_serde")]
    pub renew_deadline: Duration,
    /// How often the owner renews (and the others look, though they
    /// watch the Lease too).
    #[serde(default = "default_retry_period", with = "humantime_serde")]
    pub retry_period: Duration,
}

fn default_lease_duration() -> Duration {
    LeaseTimings::L2.duration
}

fn default_renew_deadline() -> Duration {
    LeaseTimings::L2.renew_deadline
}

fn default_retry_period() -> Duration {
    LeaseTimings::L2.retry_period
}

impl Default for L2LeaseConf {
    fn default() -> Self {
        Self {
            namespace: None,
            duration: LeaseTimings::L2.duration,
            renew_deadline: LeaseTimings::L2.renew_deadline,
            retry_period: LeaseTimings::L2.retry_period,
        }
    }
}

impl L2LeaseConf {
    pub fn timings(&self) -> LeaseTimings {
        LeaseTimings {
            duration: self.duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelConf {
    #[serde(default, deserialize_with = "fields::opt_ipv4")]
    pub ipv4: Option<Ipv4Addr>,
    #[serde(default, deserialize_with = "fields::opt_ipv6")]
    pub ipv6: Option<Ipv6Addr>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitConf {
    #[serde(deserialize_with = "fields::rate_per_sec")]
    pub rate_per_sec: u32,
    #[serde(deserialize_with = "fields::burst")]
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiConf {
    /// Unix socket (mode 0600). Default /run/rivora/rivorad.sock.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Optional TCP listener; requires `tokenFile`.
    #[serde(default, deserialize_with = "fields::opt_socket_addr")]
    pub listen: Option<SocketAddr>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

fn default_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}

impl Default for ApiConf {
    fn default() -> Self {
        Self {
            socket: default_socket(),
            listen: None,
            token_file: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsConf {
    /// Prometheus endpoint (`GET /metrics`); none by default.
    #[serde(default, deserialize_with = "fields::opt_socket_addr")]
    pub listen: Option<SocketAddr>,
}

/// `healthCheck: false` turns probing off for a VIP or backend; a mapping
/// overrides fields of the level above.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum HealthCheckField {
    Enabled(bool),
    Override(HealthCheckOverride),
}

/// By hand rather than `untagged`: an untagged enum buffers the value and
/// can only say "did not match any variant", without the line or the
/// field inside the mapping that was wrong.
impl<'de> Deserialize<'de> for HealthCheckField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HealthCheckField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "true, false, or a mapping of health-check settings \
                     (type, port, interval, timeout, rise, fall, path, host, expectedStatus)",
                )
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<HealthCheckField, E> {
                Ok(HealthCheckField::Enabled(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<HealthCheckField, A::Error> {
                HealthCheckOverride::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(HealthCheckField::Override)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VipConf {
    /// A label for humans (rivoractl, metrics); defaults to the VIP key.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(deserialize_with = "fields::ip")]
    pub address: IpAddr,
    /// A port (`80`) or an inclusive range (`"8000-8100"`).
    pub port: PortSpec,
    pub protocol: Protocol,
    pub mode: Mode,
    #[serde(default)]
    pub affinity: Option<AffinityConf>,
    #[serde(default)]
    pub syn_rate_limit: Option<RateLimitConf>,
    /// The client prefixes admitted (`10.0.0.0/8`, `fd00::/64`); none
    /// listed admits every client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<SourceRange>,
    #[serde(default)]
    pub health_check: Option<HealthCheckField>,
    #[serde(default)]
    pub backends: Vec<BackendConf>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum AffinityConf {
    #[serde(rename = "none")]
    None,
    /// Every flow of a client address to one backend until `timeout` of
    /// silence (default 3h, as Kubernetes' sessionAffinity). Whole seconds.
    #[serde(rename = "clientIP")]
    ClientIp {
        #[serde(with = "humantime_serde")]
        timeout: Duration,
    },
}

fn default_affinity_timeout() -> Duration {
    Duration::from_secs(3 * 3600)
}

/// By hand rather than internally tagged: serde buffers a tagged enum's
/// content, which loses the line and the path of a bad `timeout`.
impl<'de> Deserialize<'de> for AffinityConf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AffinityConf;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("{type: none} or {type: clientIP, timeout: 3h}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AffinityConf, A::Error> {
                const FIELDS: &[&str] = &["type", "timeout"];
                let mut kind = None;
                let mut timeout = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "type" if kind.is_some() => return Err(de::Error::duplicate_field("type")),
                        "type" => kind = Some(map.next_value::<fields::AffinityType>()?),
                        "timeout" if timeout.is_some() => {
                            return Err(de::Error::duplicate_field("timeout"))
                        }
                        "timeout" => timeout = Some(map.next_value::<fields::AffinityTimeout>()?.0),
                        other => return Err(de::Error::unknown_field(other, FIELDS)),
                    }
                }
                match (kind, timeout) {
                    (None, _) => Err(de::Error::missing_field("type")),
                    (Some(fields::AffinityType::None), Some(_)) => Err(de::Error::custom(
                        "timeout only applies to `type: clientIP`",
                    )),
                    (Some(fields::AffinityType::None), None) => Ok(AffinityConf::None),
                    (Some(fields::AffinityType::ClientIp), t) => Ok(AffinityConf::ClientIp {
                        timeout: t.unwrap_or_else(default_affinity_timeout),
                    }),
                }
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec(pub Ports);

impl Serialize for PortSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Ports::One(p) => s.serialize_u16(p),
            Ports::Range { first, last } => s.collect_str(&format_args!("{first}-{last}")),
        }
    }
}

impl<'de> Deserialize<'de> for PortSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fields::ports(d).map(PortSpec)
    }
}

fn default_weight() -> u32 {
    1
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendConf {
    #[serde(deserialize_with = "fields::ip")]
    pub address: IpAddr,
    /// Default: the port the client connected to.
    #[serde(default, deserialize_with = "fields::opt_backend_port")]
    pub port: Option<u16>,
    #[serde(default = "default_weight", deserialize_with = "fields::weight")]
    pub weight: u32,
    /// DSR only: omitted, it is resolved from the neighbour table.
    #[serde(default, deserialize_with = "fields::opt_mac")]
    pub mac: Option<Mac>,
    #[serde(default)]
    pub health_check: Option<HealthCheckField>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub file: File,
    /// What the dataplane should hold (DSR MACs not given in the file are
    /// still to be resolved: see `needs_mac`).
    pub desired: DesiredState,
    /// Effective health check per VIP key and backend target (None: off).
    pub health: BTreeMap<(VipKey, SocketAddr), Option<HealthCheckSpec>>,
    /// Display names, by VIP key.
    pub names: BTreeMap<VipKey, String>,
    /// What the file was checked to fit: a reload is checked against
    /// the same.
    pub capacity: Capacity,
    /// The `bgp` section, validated (password files read).
    pub bgp: Option<bgp::BgpSettings>,
    /// What is accepted but worth saying: VIPs the Maglev table cannot
    /// give the slots their weights need.
    pub warnings: Vec<String>,
    /// The file's text, for errors the daemon finds against the host
    /// ([`Config::error_at`]).
    text: std::sync::Arc<str>,
}

/// The node's runtime settings, apart from the VIPs: what the daemon
/// attaches to and listens on (and cannot change by a reload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRuntime {
    pub interfaces: Vec<InterfaceConf>,
    pub api: ApiConf,
    pub metrics: MetricsConf,
    pub announce: Announce,
    pub l2: L2Conf,
}

impl Config {
    /// An error about `field` (as the file writes it, `node.snat.ipv4`)
    /// found against the host rather than by the validator, at its line.
    pub fn error_at(&self, field: &str, message: String) -> ConfigError {
        ConfigError::new(
            &self.path,
            yaml::line_of(&self.text, field).map(|f| f.line),
            Some(field.to_string()),
            message,
        )
    }

    /// The interfaces, API and metrics settings; the VIPs and the node's
    /// datapath settings are in `desired`.
    pub fn node_settings(&self) -> NodeRuntime {
        NodeRuntime {
            interfaces: self.file.interfaces.clone(),
            api: self.file.api.clone(),
            metrics: self.file.metrics.clone(),
            announce: self.file.node.announce,
            l2: self.file.node.l2.clone(),
        }
    }
}

/// A configuration error: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The field path, like `vips[1].backends[0].weight`.
    pub field: Option<String>,
    pub message: String,
}

/// Longest message and field path kept: a file can quote a value or name
/// a key of any length, and one error once came to 70 KB.
const MAX_MESSAGE: usize = 400;
const MAX_FIELD: usize = 160;

/// `s` at most `max` bytes: its start and its end (which often says
/// what was expected) around an ellipsis.
fn elide(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let floor = |mut i: usize| {
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let ceil = |mut i: usize| {
        while !s.is_char_boundary(i) {
            i += 1;
        }
        i
    };
    let head = floor(max * 3 / 4);
    let tail = ceil(s.len() - max / 4 + 3);
    format!("{}…{}", &s[..head], &s[tail..])
}

impl ConfigError {
    /// An error whose message and field are bounded in length.
    pub fn new(file: &Path, line: Option<usize>, field: Option<String>, message: String) -> Self {
        Self {
            file: file.to_path_buf(),
            line,
            field: field.map(|f| elide(f, MAX_FIELD)),
            message: elide(message, MAX_MESSAGE),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Read and validate a configuration file.
///
/// Only a regular file of at most [`MAX_BYTES`] is read: a FIFO in the
/// file's place would block the reader until something writes to it, and
/// a huge file would hold the caller for as long as it takes to parse.
/// The datapath's default capacities apply (see [`load_with`]).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, &Capacity::default())
}

/// [`load`], for a datapath of the given capacity (rivorad's
/// `-maglev-size`).
pub fn load_with(path: &Path, capacity: &Capacity) -> Result<Config, ConfigError> {
    let text = read_bounded(path).map_err(|message| ConfigError::new(path, None, None, message))?;
    parse_with(path, &text, capacity)
}

fn read_bounded(path: &Path) -> Result<String, String> {
    let regular = |m: &fs::Metadata| -> Result<(), String> {
        let t = m.file_type();
        let what = match () {
            () if t.is_file() => return Ok(()),
            () if t.is_dir() => "a directory",
            () if t.is_fifo() => "a FIFO",
            () if t.is_socket() => "a socket",
            () if t.is_block_device() || t.is_char_device() => "a device",
            () => "something else",
        };
        Err(format!("cannot read: it is {what}, not a regular file"))
    };
    let too_big = |n: u64| format!("the file is {n} bytes, over the limit of {MAX_BYTES} (1 MiB)");
    let meta = fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    regular(&meta)?;
    if meta.len() > MAX_BYTES {
        return Err(too_big(meta.len()));
    }
    // Non-blocking, in case the path became a FIFO since the check above.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot read: {e}"))?;
    regular(&file.metadata().map_err(|e| format!("cannot read: {e}"))?)?;
    let mut bytes = Vec::new();
    // One byte past the limit tells a file that grew since it was checked.
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))
}

/// Validate text as if it were the file at `path`, for a datapath of the
/// default capacities.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    parse_with(path, text, &Capacity::default())
}

/// [`parse`], for a datapath of the given capacity.
pub fn parse_with(path: &Path, text: &str, capacity: &Capacity) -> Result<Config, ConfigError> {
    let err = |line: Option<usize>, field: Option<String>, message: String| {
        ConfigError::new(path, line, field, message)
    };
    // Before the parser sees it: its time grows faster than linearly with
    // nesting.
    if text.len() as u64 > MAX_BYTES {
        return Err(err(
            None,
            None,
            format!(
                "the file is {} bytes, over the limit of {MAX_BYTES} (1 MiB)",
                text.len()
            ),
        ));
    }
    if let Some(line) = yaml::too_deep(text, MAX_DEPTH) {
        return Err(err(
            Some(line),
            None,
            format!("nested deeper than {MAX_DEPTH} levels; refused before parsing"),
        ));
    }
    let file: File = yaml::from_str(text).map_err(|e| err(e.line, e.field, e.message))?;
    let fail = |field: &str, message: String| {
        err(
            yaml::line_of(text, field).map(|f| f.line),
            Some(field.to_string()),
            message,
        )
    };
    // A spec error starts with the check's own field ("timeout: ..."):
    // name that field when the file sets it there, else the whole check
    // (the value came from the level above).
    let spec_fail = |base: &str, e: healthcheck::SpecError| {
        let msg = e.to_string();
        if let Some((sub, rest)) = msg.split_once(": ") {
            let field = format!("{base}.{sub}");
            if let Some(found) = yaml::line_of(text, &field).filter(|f| f.exact) {
                return err(Some(found.line), Some(field), rest.to_string());
            }
        }
        fail(base, msg)
    };

    if file.interfaces.is_empty() {
        return Err(fail(
            "interfaces",
            "at least one interface is needed".into(),
        ));
    }
    if file.interfaces.len() > MAX_IFACES {
        return Err(fail(
            &format!("interfaces[{MAX_IFACES}]"),
            format!(
                "{} interfaces, over the datapath's limit of {MAX_IFACES}",
                file.interfaces.len()
            ),
        ));
    }
    for (i, ifc) in file.interfaces.iter().enumerate() {
        if let Some(first) = file.interfaces[..i].iter().position(|o| o.name == ifc.name) {
            return Err(fail(
                &format!("interfaces[{i}].name"),
                format!(
                    "interface {:?} is listed twice (first as interfaces[{first}])",
                    ifc.name
                ),
            ));
        }
    }
    if file.api.listen.is_some() && file.api.token_file.is_none() {
        return Err(fail(
            "api.listen",
            "a TCP listener needs api.tokenFile (a bearer token)".into(),
        ));
    }
    file.health_check
        .validate()
        .map_err(|e| spec_fail("healthCheck", e))?;
    check_l2(&file, &fail)?;

    let node = NodeSettings {
        syn_rate_limit: file.node.syn_rate_limit.map(rate_limit),
        tunnel_src4: file.node.tunnel_source.ipv4,
        tunnel_src6: file.node.tunnel_source.ipv6,
        interface_macs: BTreeMap::new(),
        generic_xdp: Default::default(),
        fullnat: file.node.snat.settings(),
    };
    node.validate().map_err(|e| model_error(&e, &file, &fail))?;

    let mut vips = Vec::with_capacity(file.vips.len());
    let mut health = BTreeMap::new();
    let mut names = BTreeMap::new();
    for (i, v) in file.vips.iter().enumerate() {
        let vip = Vip {
            addr: v.address,
            ports: v.port.0,
            proto: v.protocol,
            mode: v.mode,
            affinity: match v.affinity {
                None | Some(AffinityConf::None) => Affinity::None,
                Some(AffinityConf::ClientIp { timeout }) => Affinity::ClientIp {
                    timeout_s: u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX),
                },
            },
            rate_limit: v.syn_rate_limit.map(rate_limit),
            // An empty list admits everyone, as Kubernetes reads one.
            source_ranges: (!v.source_ranges.is_empty()).then(|| v.source_ranges.clone()),
            backends: v
                .backends
                .iter()
                .map(|b| Backend {
                    addr: b.address,
                    port: b.port.unwrap_or(0),
                    weight: b.weight,
                    mac: b.mac,
                    mode: None,
                    node: None,
                })
                .collect(),
        };
        let key = vip.key();
        names.insert(key, v.name.clone().unwrap_or_else(|| key.to_string()));
        let vip_hc = match &v.health_check {
            Some(HealthCheckField::Enabled(false)) => None,
            None | Some(HealthCheckField::Enabled(true)) => Some(file.health_check.clone()),
            Some(HealthCheckField::Override(o)) => Some(
                healthcheck::resolve(&file.health_check, Some(o))
                    .map_err(|e| spec_fail(&format!("vips[{i}].healthCheck"), e))?,
            ),
        };
        for (j, b) in v.backends.iter().enumerate() {
            let port = b.port.filter(|p| *p != 0).unwrap_or(match v.port.0 {
                Ports::One(p) => p,
                Ports::Range { first, .. } => first,
            });
            let target = SocketAddr::new(b.address, port);
            let spec = match (&vip_hc, &b.health_check) {
                (_, Some(HealthCheckField::Enabled(false))) => None,
                (None, Some(HealthCheckField::Override(o))) => Some(
                    healthcheck::resolve(&file.health_check, Some(o)).map_err(|e| {
                        spec_fail(&format!("vips[{i}].backends[{j}].healthCheck"), e)
                    })?,
                ),
                (None, _) => None,
                (Some(s), Some(HealthCheckField::Override(o))) => {
                    Some(healthcheck::resolve(s, Some(o)).map_err(|e| {
                        spec_fail(&format!("vips[{i}].backends[{j}].healthCheck"), e)
                    })?)
                }
                (Some(s), _) => Some(s.clone()),
            };
            health.insert((key, target), spec);
        }
        vips.push(vip);
    }
    let desired = DesiredState { node, vips };
    // Before the shapes: its cost is bounded by the limits it checks,
    // while the cross-VIP checks grow with the square of a file's VIPs.
    desired
        .check_capacity(capacity)
        .map_err(|e| capacity_error(&e, &fail))?;
    // DSR MACs may still be missing here (resolved later from the
    // neighbour table): check everything else.
    validate_shapes(&desired).map_err(|e| model_error(&e, &file, &fail))?;
    no_loopback_backends(&file, &fail)?;
    let bgp = match &file.bgp {
        None => None,
        Some(b) => Some(bgp::validate(b).map_err(|(field, msg)| fail(&field, msg))?),
    };
    let mut warnings = precision_warnings(&desired, capacity);
    warnings.extend(snat_warning(&desired.node.fullnat, capacity));
    Ok(Config {
        path: path.to_path_buf(),
        file,
        desired,
        health,
        names,
        capacity: *capacity,
        bgp,
        warnings,
        text: std::sync::Arc::from(text),
    })
}

/// VIPs listed past this many are counted, not named.
const NAMED_REDUCED: usize = 3;

/// A warning when the table cannot give every VIP the slots its weights
/// need: those VIPs run with reduced precision (the slices the writer
/// plans for the same VIPs; docs/datapath.md "Maglev").
fn precision_warnings(desired: &DesiredState, capacity: &Capacity) -> Vec<String> {
    let Some(plan) = desired.maglev_sizes(capacity) else {
        return Vec::new();
    };
    let reduced: Vec<String> = plan
        .iter()
        .enumerate()
        .filter(|(_, p)| p.reduced_precision())
        .map(|(i, p)| {
            format!(
                "vips[{i}] ({}) gets {} of the {} slots its weights need",
                desired.vips[i].key(),
                p.len,
                p.need.need
            )
        })
        .collect();
    if reduced.is_empty() {
        return Vec::new();
    }
    let more = reduced.len().saturating_sub(NAMED_REDUCED);
    let mut named = reduced[..reduced.len().min(NAMED_REDUCED)].join("; ");
    if more > 0 {
        named.push_str(&format!("; and {more} more"));
    }
    vec![format!(
        "the Maglev table ({} slots, rivorad -maglev-size) is too small for every VIP's \
         weights: {} VIP(s) will run with reduced precision (a share off its weight's by more \
         than 5 %): {named}",
        capacity.maglev_size,
        reduced.len()
    )]
}

/// A full-NAT port range this much smaller than the flow table is worth a
/// warning: a backend takes at most the range's ports in full-NAT flows
/// from one source, so the range runs out long before the table fills
/// unless the flows spread over more backends than this.
pub const SNAT_PORTS_WARN_DIVISOR: u32 = 16;

/// The warning for a port range too small for the flow table, if it is.
pub fn snat_warning(f: &FullNatSettings, capacity: &Capacity) -> Option<String> {
    let ports = f.ports();
    (ports < capacity.flow_table_size / SNAT_PORTS_WARN_DIVISOR).then(|| {
        format!(
            "node.snat.ports {}-{} holds {ports} ports, under a sixteenth of the {} flows \
             the flow table holds (rivorad -flow-table-size): a backend can take at most \
             {ports} full-NAT flows from one source address, and the rest of its new flows \
             are dropped (fullnat_ports_exhausted)",
            f.port_min, f.port_max, capacity.flow_table_size
        )
    })
}

/// `node.l2`: what serde could not check field by field.
fn check_l2(file: &File, fail: &impl Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
    let l2 = &file.node.l2;
    for (i, L2Interface(name)) in l2.interfaces.iter().enumerate() {
        if !file.interfaces.iter().any(|f| &f.name == name) {
            return Err(fail(
                &format!("node.l2.interfaces[{i}]"),
                format!("{name:?} is not one of `interfaces`: the speaker answers only where rivorad attaches"),
            ));
        }
    }
    let g = l2.gratuitous_interval;
    if g < Duration::from_secs(1) || g > Duration::from_secs(3600) {
        return Err(fail(
            "node.l2.gratuitousInterval",
            format!("{} is not between 1s and 1h", humantime::format_duration(g)),
        ));
    }
    for (k, v) in &l2.node_selector {
        if !label_key(k) || !label_value(v) {
            return Err(fail(
                "node.l2.nodeSelector",
                format!("{k:?}: {v:?} is not a Kubernetes label (key [prefix/]name, value up to 63 characters of letters, digits, '-', '_', '.')"),
            ));
        }
    }
    if let Some(ns) = &l2.lease.namespace {
        if !dns_label(ns) {
            return Err(fail(
                "node.l2.lease.namespace",
                format!(
                    "{ns:?} is not a namespace name (lowercase letters, digits and '-', up to 63)"
                ),
            ));
        }
    }
    l2.lease
        .timings()
        .check(Precision::Milliseconds)
        .map_err(|e| fail("node.l2.lease", e.to_string()))?;
    Ok(())
}

/// RFC 1123 label, as a namespace name.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A label value: empty, or up to 63 of `[A-Za-z0-9-_.]` starting and
/// ending alphanumeric.
fn label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// A label key: `[prefix/]name`, the name a non-empty label value, the
/// prefix a DNS subdomain.
fn label_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let prefix_ok =
        prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && p.split('.').all(dns_label));
    prefix_ok && !name.is_empty() && label_value(name)
}

fn rate_limit(r: RateLimitConf) -> RateLimit {
    RateLimit {
        rate_per_sec: r.rate_per_sec,
        burst: r.burst,
    }
}

/// A loopback backend cannot be reached through the datapath: NAT and
/// L3 DSR would send to it out of an interface, where the kernel drops a
/// loopback destination as a martian, and DSR finds no MAC for it. Here
/// rather than in the model, whose reconciler tests probe real listeners
/// on loopback without a datapath.
fn no_loopback_backends(
    file: &File,
    fail: &impl Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    for (i, v) in file.vips.iter().enumerate() {
        for (j, b) in v.backends.iter().enumerate() {
            if b.address.is_loopback() {
                let key = VipKey {
                    addr: v.address,
                    ports: v.port.0,
                    proto: v.protocol,
                };
                return Err(fail(
                    &format!("vips[{i}].backends[{j}].address"),
                    format!(
                        "VIP {key}: backend {} is a loopback address, which the datapath \
                         cannot forward to; give the backend's address on the network",
                        b.address
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A capacity error at the first VIP (or backend) past the limit.
fn capacity_error(e: &CapacityError, fail: &impl Fn(&str, String) -> ConfigError) -> ConfigError {
    let field = match e {
        CapacityError::Backends {
            index,
            backend_index,
            ..
        } => format!("vips[{index}].backends[{backend_index}]"),
        _ => format!("vips[{}]", e.index()),
    };
    fail(&field, e.to_string())
}

/// The model's checks, less "a DSR backend has a MAC", which the daemon
/// settles from the neighbour table before applying.
fn validate_shapes(d: &DesiredState) -> Result<(), ModelError> {
    let mut with_macs = d.clone();
    for v in &mut with_macs.vips {
        for b in &mut v.backends {
            b.mac.get_or_insert(Mac([2, 0, 0, 0, 0, 1]));
        }
    }
    with_macs.validate()
}

/// Turn a model error (which names the VIP and its own field) into one
/// that names the file's field and line.
fn model_error(
    e: &ModelError,
    file: &File,
    fail: &impl Fn(&str, String) -> ConfigError,
) -> ConfigError {
    let index_of = |key: &VipKey| {
        file.vips
            .iter()
            .position(|v| v.address == key.addr && v.port.0 == key.ports && v.protocol == key.proto)
    };
    match e {
        ModelError::Vip {
            vip,
            field,
            problem,
        } => {
            let base = index_of(vip)
                .map(|i| format!("vips[{i}]"))
                .unwrap_or_else(|| "vips".into());
            fail(
                &format!("{base}.{}", file_field(field)),
                format!("VIP {vip}: {problem}"),
            )
        }
        ModelError::DuplicateVip(k) => {
            // The second occurrence is the one to point at.
            let mut at = file
                .vips
                .iter()
                .enumerate()
                .filter(|(_, v)| {
                    v.address == k.addr && v.port.0 == k.ports && v.protocol == k.proto
                })
                .map(|(i, _)| i);
            match (at.next(), at.next()) {
                (Some(first), Some(i)) => fail(
                    &format!("vips[{i}]"),
                    format!("{e} (first as vips[{first}])"),
                ),
                _ => fail("vips", e.to_string()),
            }
        }
        ModelError::OverlappingRanges { vip, other } => match (index_of(vip), index_of(other)) {
            (Some(i), Some(j)) => fail(&format!("vips[{i}].port"), format!("{e} (vips[{j}])")),
            _ => fail("vips", e.to_string()),
        },
        ModelError::PortInRange { vip, other } => match (index_of(vip), index_of(other)) {
            (Some(i), Some(j)) => fail(
                &format!("vips[{i}].port"),
                crate::model::port_in_range(vip, other, &format!(" (vips[{j}])")),
            ),
            _ => fail("vips", e.to_string()),
        },
        ModelError::Node { field, problem } => {
            fail(&format!("node.{}", node_field(field)), problem.to_string())
        }
    }
}

/// The model's field names are Rust's; the file's are camelCase.
fn file_field(model: &str) -> String {
    let mut out = Vec::new();
    for part in model.split('.') {
        let (name, idx) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        let name = match name {
            "addr" => "address",
            "ports" | "first" | "last" => "port",
            "rate_limit" => "synRateLimit",
            "source_ranges" => "sourceRanges",
            "rate_per_sec" => "ratePerSec",
            "proto" => "protocol",
            "timeout_s" => "timeout",
            other => other,
        };
        if out.last().map(|l: &String| l == "port") == Some(true) && name == "port" {
            continue;
        }
        out.push(format!("{name}{idx}"));
    }
    out.join(".")
}

fn node_field(model: &str) -> String {
    match model {
        "tunnel_src4" => "tunnelSource.ipv4".into(),
        "tunnel_src6" => "tunnelSource.ipv6".into(),
        "fullnat.src4" => "snat.ipv4".into(),
        "fullnat.src6" => "snat.ipv6".into(),
        "fullnat.port_min" | "fullnat.ports" => "snat.ports".into(),
        "fullnat.tcp_timeout_ms" => "snat.tcpTimeout".into(),
        "fullnat.tcp_closing_timeout_ms" => "snat.tcpClosingTimeout".into(),
        "fullnat.udp_timeout_ms" => "snat.udpTimeout".into(),
        f if f.starts_with("syn_rate_limit") => f
            .replacen("syn_rate_limit", "synRateLimit", 1)
            .replace("rate_per_sec", "ratePerSec"),
        f => f.to_string(),
    }
}

/// What `rivoractl config validate` prints for a good file.
pub fn summary(c: &Config) -> String {
    let backends: usize = c.desired.vips.iter().map(|v| v.backends.len()).sum();
    format!(
        "{}: ok: {} interface(s), {} VIP(s), {} backend(s)",
        c.path.display(),
        c.file.interfaces.len(),
        c.desired.vips.len(),
        backends
    )
}

#[cfg(test)]
mod tests;
