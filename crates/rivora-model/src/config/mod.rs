//! The static configuration file: YAML to desired state.
//!
//! The file is the whole desired set for a node. Parsing and validation
//! are pure: `load` either returns a complete [`Config`] or an error that
//! names the file, the line and the field, and nothing of a bad file ever
//! reaches the dataplane (the caller keeps its running state).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::health::{self as healthcheck, HealthCheckOverride, HealthCheckSpec};
use crate::model::XdpMode;
use crate::model::{
    Affinity, Backend, DesiredState, Mac, Mode, ModelError, NodeSettings, Ports, Protocol,
    RateLimit, Vip, VipKey,
};

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
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InterfaceConf {
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
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelConf {
    #[serde(default)]
    pub ipv4: Option<Ipv4Addr>,
    #[serde(default)]
    pub ipv6: Option<Ipv6Addr>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RateLimitConf {
    pub rate_per_sec: u32,
    pub burst: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiConf {
    /// Unix socket (mode 0600). Default /run/rivora/rivorad.sock.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Optional TCP listener; requires `tokenFile`.
    #[serde(default)]
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

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsConf {
    /// Prometheus endpoint (`GET /metrics`); none by default.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
}

/// `healthCheck: false` turns probing off for a VIP or backend; a mapping
/// overrides fields of the level above.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum HealthCheckField {
    Enabled(bool),
    Override(HealthCheckOverride),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VipConf {
    /// A label for humans (rivoractl, metrics); defaults to the VIP key.
    #[serde(default)]
    pub name: Option<String>,
    pub address: IpAddr,
    /// A port (`80`) or an inclusive range (`"8000-8100"`).
    pub port: PortSpec,
    pub protocol: Protocol,
    pub mode: Mode,
    #[serde(default)]
    pub affinity: Option<AffinityConf>,
    #[serde(default)]
    pub syn_rate_limit: Option<RateLimitConf>,
    #[serde(default)]
    pub health_check: Option<HealthCheckField>,
    #[serde(default)]
    pub backends: Vec<BackendConf>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", tag = "type")]
pub enum AffinityConf {
    #[serde(rename = "none")]
    None,
    /// Every flow of a client address to one backend until `timeout` of
    /// silence (default 3h, as Kubernetes' sessionAffinity).
    #[serde(rename = "clientIP")]
    ClientIp {
        #[serde(default = "default_affinity_timeout", with = "humantime_serde_compat")]
        timeout: Duration,
    },
}

fn default_affinity_timeout() -> Duration {
    Duration::from_secs(3 * 3600)
}

/// Durations written like "30s", "3h", "1h30m".
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
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
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u64),
            Text(String),
        }
        let bad = |s: &str| {
            serde::de::Error::custom(format!(
                "{s:?} is not a port (1-65535) or a range like \"8000-8100\""
            ))
        };
        let port =
            |s: &str| -> Result<u16, D::Error> { s.trim().parse::<u16>().map_err(|_| bad(s)) };
        match Raw::deserialize(d)? {
            Raw::Num(n) => u16::try_from(n)
                .map(|p| PortSpec(Ports::One(p)))
                .map_err(|_| bad(&n.to_string())),
            Raw::Text(t) => match t.split_once('-') {
                Some((a, b)) => Ok(PortSpec(Ports::Range {
                    first: port(a)?,
                    last: port(b)?,
                })),
                None => Ok(PortSpec(Ports::One(port(&t)?))),
            },
        }
    }
}

fn default_weight() -> u32 {
    1
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackendConf {
    pub address: IpAddr,
    /// Default: the port the client connected to.
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// DSR only: omitted, it is resolved from the neighbour table.
    #[serde(default)]
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
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        line: None,
        field: None,
        message: format!("cannot read: {e}"),
    })?;
    parse(path, &text)
}

/// Validate text as if it were the file at `path`.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let err = |line: Option<usize>, field: Option<String>, message: String| ConfigError {
        file: path.to_path_buf(),
        line,
        field,
        message,
    };
    let file: File = match serde_yaml_ng::from_str(text) {
        Ok(f) => f,
        Err(e) => {
            let line = e.location().map(|l| l.line());
            // serde_yaml puts the field path first: "vips[0].port: ...".
            let msg = e.to_string();
            let msg = match msg.find(" at line ") {
                Some(i) => msg[..i].to_string(),
                None => msg,
            };
            let (field, message) = match msg.split_once(": ") {
                Some((f, m)) if !f.contains(' ') => (Some(f.to_string()), m.to_string()),
                _ => (None, msg),
            };
            return Err(err(line, field, message));
        }
    };
    let lines = LineIndex::build(text);
    let at = |field: &str| err(lines.line_of(field), Some(field.to_string()), String::new());
    let fail = |field: &str, message: String| ConfigError {
        message,
        ..at(field)
    };

    if file.interfaces.is_empty() {
        return Err(fail(
            "interfaces",
            "at least one interface is needed".into(),
        ));
    }
    for (i, ifc) in file.interfaces.iter().enumerate() {
        if ifc.name.is_empty() || ifc.name.len() > 15 || ifc.name.contains(['/', ' ']) {
            return Err(fail(
                &format!("interfaces[{i}].name"),
                format!("{:?} is not an interface name", ifc.name),
            ));
        }
        if file.interfaces[..i].iter().any(|o| o.name == ifc.name) {
            return Err(fail(
                &format!("interfaces[{i}].name"),
                format!("interface {} is listed twice", ifc.name),
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
        .map_err(|e| fail("healthCheck", e.to_string()))?;

    let node = NodeSettings {
        syn_rate_limit: file.node.syn_rate_limit.map(rate_limit),
        tunnel_src4: file.node.tunnel_source.ipv4,
        tunnel_src6: file.node.tunnel_source.ipv6,
        interface_macs: BTreeMap::new(),
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
            backends: v
                .backends
                .iter()
                .map(|b| Backend {
                    addr: b.address,
                    port: b.port.unwrap_or(0),
                    weight: b.weight,
                    mac: b.mac,
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
                    .map_err(|e| fail(&format!("vips[{i}].healthCheck"), e.to_string()))?,
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
                        fail(
                            &format!("vips[{i}].backends[{j}].healthCheck"),
                            e.to_string(),
                        )
                    })?,
                ),
                (None, _) => None,
                (Some(s), Some(HealthCheckField::Override(o))) => {
                    Some(healthcheck::resolve(s, Some(o)).map_err(|e| {
                        fail(
                            &format!("vips[{i}].backends[{j}].healthCheck"),
                            e.to_string(),
                        )
                    })?)
                }
                (Some(s), _) => Some(s.clone()),
            };
            health.insert((key, target), spec);
        }
        vips.push(vip);
    }
    let desired = DesiredState { node, vips };
    // DSR MACs may still be missing here (resolved later from the
    // neighbour table): check everything else.
    validate_shapes(&desired).map_err(|e| model_error(&e, &file, &fail))?;
    Ok(Config {
        path: path.to_path_buf(),
        file,
        desired,
        health,
        names,
    })
}

fn rate_limit(r: RateLimitConf) -> RateLimit {
    RateLimit {
        rate_per_sec: r.rate_per_sec,
        burst: r.burst,
    }
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
            let i = file
                .vips
                .iter()
                .enumerate()
                .filter(|(_, v)| {
                    v.address == k.addr && v.port.0 == k.ports && v.protocol == k.proto
                })
                .map(|(i, _)| i)
                .nth(1);
            fail(
                &i.map(|i| format!("vips[{i}]"))
                    .unwrap_or_else(|| "vips".into()),
                e.to_string(),
            )
        }
        ModelError::OverlappingRanges { vip, .. } => fail(
            &index_of(vip)
                .map(|i| format!("vips[{i}].port"))
                .unwrap_or_else(|| "vips".into()),
            e.to_string(),
        ),
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
        f if f.starts_with("syn_rate_limit") => f
            .replacen("syn_rate_limit", "synRateLimit", 1)
            .replace("rate_per_sec", "ratePerSec"),
        f => f.to_string(),
    }
}

/// Where each field path (`vips[1].backends[0].weight`) starts in the text:
/// built from the YAML event stream, since serde's data model has no spans.
struct LineIndex(BTreeMap<String, usize>);

impl LineIndex {
    fn build(text: &str) -> Self {
        use yaml_rust2::parser::{Event, Parser};

        enum Frame {
            Map {
                key: Option<String>,
                expecting_key: bool,
            },
            Seq {
                index: usize,
            },
        }
        let mut out = BTreeMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        let path = |stack: &[Frame]| -> String {
            let mut s = String::new();
            for f in stack {
                match f {
                    Frame::Map { key: Some(k), .. } => {
                        if !s.is_empty() {
                            s.push('.');
                        }
                        s.push_str(k);
                    }
                    Frame::Map { key: None, .. } => {}
                    Frame::Seq { index } => s.push_str(&format!("[{index}]")),
                }
            }
            s
        };
        let mut parser = Parser::new_from_str(text);
        // A value (scalar or collection) was consumed in the current frame.
        fn value_done(stack: &mut [Frame]) {
            match stack.last_mut() {
                Some(Frame::Map { expecting_key, key }) => {
                    *expecting_key = true;
                    *key = None;
                }
                Some(Frame::Seq { index }) => *index += 1,
                None => {}
            }
        }
        while let Ok((ev, mark)) = parser.next_token() {
            let line = mark.line();
            match ev {
                Event::StreamEnd => break,
                Event::Scalar(v, ..) => {
                    if let Some(Frame::Map {
                        expecting_key: true,
                        ..
                    }) = stack.last()
                    {
                        if let Some(Frame::Map { key, expecting_key }) = stack.last_mut() {
                            *key = Some(v);
                            *expecting_key = false;
                        }
                        out.entry(path(&stack)).or_insert(line);
                    } else {
                        out.entry(path(&stack)).or_insert(line);
                        value_done(&mut stack);
                    }
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    if let Some(Frame::Seq { .. }) = stack.last() {
                        out.entry(path(&stack)).or_insert(line);
                    }
                    stack.push(if matches!(ev, Event::MappingStart(..)) {
                        Frame::Map {
                            key: None,
                            expecting_key: true,
                        }
                    } else {
                        Frame::Seq { index: 0 }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    value_done(&mut stack);
                }
                _ => {}
            }
        }
        Self(out)
    }

    /// The line of `field`, or of its nearest ancestor the file has.
    fn line_of(&self, field: &str) -> Option<usize> {
        let mut f = field.to_string();
        loop {
            if let Some(l) = self.0.get(&f) {
                return Some(*l);
            }
            let cut = f.rfind(['.', '['])?;
            f.truncate(cut);
        }
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
