//! What a health check is: plain, serde-derivable data, its defaults, its
//! validation, and how a per-backend override is laid over a VIP's spec.
//!
//! The YAML shape is flat (`type: http` next to `path:`), the way operators
//! write it; the HTTP-only fields are `Option`s so that setting one on a TCP
//! check is an error rather than silently ignored.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// Default probe interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);
/// Default probe timeout (connect + request + status line, all together).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default consecutive successes for a down backend to become healthy.
pub const DEFAULT_RISE: u32 = 2;
/// Default consecutive failures for a healthy backend to go down.
pub const DEFAULT_FALL: u32 = 3;
/// Default HTTP path.
pub const DEFAULT_PATH: &str = "/";
/// Default accepted HTTP status codes: 2xx and 3xx, as HAProxy and most
/// load balancers do (a redirect still proves the application answers).
pub const DEFAULT_EXPECTED_STATUS: StatusRange = StatusRange { lo: 200, hi: 399 };

/// Longest accepted HTTP path or Host value. The probe writes them into one
/// request; a bound keeps a typo'd config from producing megabyte requests.
const MAX_HTTP_FIELD_LEN: usize = 1024;

/// The probe kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// A TCP connect: the handshake completing is success.
    #[default]
    Tcp,
    /// An HTTP/1.1 GET: success is an expected status code in the status line.
    Http,
}

/// One health check, as configured for a VIP (and, after
/// [`resolve`], as effective for one backend).
///
/// Every field has a default (see the `DEFAULT_*` constants), so `{}` is a
/// valid TCP check: every 2 s, 1 s timeout, rise 2, fall 3, on the backend's
/// own port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheckSpec {
    /// `tcp` (default) or `http`.
    #[serde(rename = "type")]
    pub kind: ProbeKind,
    /// Probe this port instead of the backend's own (e.g. a separate
    /// health endpoint). `None`: the backend's port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Time between the starts of two probes of one backend. Default 2s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Deadline for one probe, connect included; must be below `interval`.
    /// Default 1s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Consecutive successes for a down backend to become healthy. Default 2.
    pub rise: u32,
    /// Consecutive failures for a healthy backend to go down. Default 3.
    pub fall: u32,
    /// HTTP only: request path, starting with '/'. Default "/".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// HTTP only: Host header. Default: the probed address ("ip:port").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// HTTP only: accepted status codes, each `200`, `"200-299"` or `"2xx"`.
    /// Default `["200-399"]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_status: Option<Vec<StatusRange>>,
}

impl Default for HealthCheckSpec {
    fn default() -> Self {
        Self {
            kind: ProbeKind::Tcp,
            port: None,
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            rise: DEFAULT_RISE,
            fall: DEFAULT_FALL,
            path: None,
            host: None,
            expected_status: None,
        }
    }
}

impl HealthCheckSpec {
    /// A default HTTP check of `path`.
    pub fn http(path: impl Into<String>) -> Self {
        Self {
            kind: ProbeKind::Http,
            path: Some(path.into()),
            ..Self::default()
        }
    }

    /// The HTTP path to request (the default when unset).
    pub fn http_path(&self) -> &str {
        self.path.as_deref().unwrap_or(DEFAULT_PATH)
    }

    /// The accepted status ranges (the default when unset).
    pub fn expected(&self) -> &[StatusRange] {
        match &self.expected_status {
            Some(v) => v,
            None => std::slice::from_ref(&DEFAULT_EXPECTED_STATUS),
        }
    }

    /// Whether `code` is an accepted HTTP status.
    pub fn status_ok(&self, code: u16) -> bool {
        self.expected().iter().any(|r| r.contains(code))
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.interval.is_zero() {
            return Err(SpecError::ZeroInterval);
        }
        if self.timeout.is_zero() {
            return Err(SpecError::ZeroTimeout);
        }
        // A timeout at or past the interval would let two probes of one
        // backend overlap, and makes "down within fall x interval" false.
        if self.timeout >= self.interval {
            return Err(SpecError::TimeoutNotBelowInterval {
                timeout: self.timeout,
                interval: self.interval,
            });
        }
        if self.rise == 0 {
            return Err(SpecError::ZeroRise);
        }
        if self.fall == 0 {
            return Err(SpecError::ZeroFall);
        }
        if self.port == Some(0) {
            return Err(SpecError::ZeroPort);
        }
        if self.kind == ProbeKind::Tcp {
            for (field, set) in [
                ("path", self.path.is_some()),
                ("host", self.host.is_some()),
                ("expectedStatus", self.expected_status.is_some()),
            ] {
                if set {
                    return Err(SpecError::HttpOnly { field });
                }
            }
            return Ok(());
        }
        if let Some(path) = &self.path {
            if !path.starts_with('/') {
                return Err(SpecError::PathNotAbsolute { path: path.clone() });
            }
            // The path goes verbatim into the request line: a space or a
            // control character would split or smuggle a request.
            if path.len() > MAX_HTTP_FIELD_LEN || !is_visible_ascii(path) {
                return Err(SpecError::PathInvalid { path: path.clone() });
            }
        }
        if let Some(host) = &self.host {
            if host.is_empty() || host.len() > MAX_HTTP_FIELD_LEN || !is_visible_ascii(host) {
                return Err(SpecError::HostInvalid { host: host.clone() });
            }
        }
        if let Some(list) = &self.expected_status {
            if list.is_empty() {
                return Err(SpecError::ExpectedStatusEmpty);
            }
            for (index, r) in list.iter().enumerate() {
                for code in [r.lo, r.hi] {
                    if !(100..=599).contains(&code) {
                        return Err(SpecError::StatusCode { index, code });
                    }
                }
                if r.lo > r.hi {
                    return Err(SpecError::StatusRangeReversed {
                        index,
                        lo: r.lo,
                        hi: r.hi,
                    });
                }
            }
        }
        Ok(())
    }
}

fn is_visible_ascii(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

/// A per-backend override: every field set replaces the VIP's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheckOverride {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<ProbeKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rise: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fall: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_status: Option<Vec<StatusRange>>,
}

/// The effective check for one backend: the VIP's spec with the backend's
/// override laid over it, validated.
///
/// An override that switches the kind drops the VIP's HTTP-only fields
/// (an HTTP VIP's `path` means nothing to a backend checked by TCP); HTTP
/// fields the override itself sets on a TCP check are still an error.
pub fn resolve(
    vip: &HealthCheckSpec,
    backend: Option<&HealthCheckOverride>,
) -> Result<HealthCheckSpec, SpecError> {
    let mut spec = vip.clone();
    if let Some(o) = backend {
        if let Some(kind) = o.kind {
            if kind != spec.kind {
                spec.path = None;
                spec.host = None;
                spec.expected_status = None;
            }
            spec.kind = kind;
        }
        if o.port.is_some() {
            spec.port = o.port;
        }
        if let Some(v) = o.interval {
            spec.interval = v;
        }
        if let Some(v) = o.timeout {
            spec.timeout = v;
        }
        if let Some(v) = o.rise {
            spec.rise = v;
        }
        if let Some(v) = o.fall {
            spec.fall = v;
        }
        if o.path.is_some() {
            spec.path.clone_from(&o.path);
        }
        if o.host.is_some() {
            spec.host.clone_from(&o.host);
        }
        if o.expected_status.is_some() {
            spec.expected_status.clone_from(&o.expected_status);
        }
    }
    spec.validate()?;
    Ok(spec)
}

/// Why a health-check spec is invalid. Each message starts with the field
/// name as written in the config file; the config layer prefixes the path
/// to the check (e.g. `vips[2].healthCheck.`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    #[error("interval: must be greater than 0")]
    ZeroInterval,
    #[error("timeout: must be greater than 0")]
    ZeroTimeout,
    #[error(
        "timeout: {timeout:?} must be less than interval ({interval:?}) so that probes of one backend never overlap"
    )]
    TimeoutNotBelowInterval {
        timeout: Duration,
        interval: Duration,
    },
    #[error("rise: must be at least 1")]
    ZeroRise,
    #[error("fall: must be at least 1")]
    ZeroFall,
    #[error("port: must be 1-65535, not 0")]
    ZeroPort,
    #[error("{field}: only applies to `type: http`")]
    HttpOnly { field: &'static str },
    #[error("path: {path:?} must start with '/'")]
    PathNotAbsolute { path: String },
    #[error("path: {path:?} must be printable ASCII without spaces, at most 1024 bytes")]
    PathInvalid { path: String },
    #[error("host: {host:?} must be non-empty printable ASCII without spaces, at most 1024 bytes")]
    HostInvalid { host: String },
    #[error("expectedStatus: must list at least one code or range")]
    ExpectedStatusEmpty,
    #[error("expectedStatus[{index}]: {code} is not an HTTP status code (100-599)")]
    StatusCode { index: usize, code: u16 },
    #[error("expectedStatus[{index}]: range {lo}-{hi} is reversed")]
    StatusRangeReversed { index: usize, lo: u16, hi: u16 },
}

/// An inclusive range of HTTP status codes. Written `200`, `"200-299"` or
/// `"2xx"` in config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusRange {
    pub lo: u16,
    pub hi: u16,
}

impl StatusRange {
    pub const fn new(lo: u16, hi: u16) -> Self {
        Self { lo, hi }
    }

    pub fn contains(&self, code: u16) -> bool {
        (self.lo..=self.hi).contains(&code)
    }
}

impl fmt::Display for StatusRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// A status code entry that is not a code, a range or a class.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{input:?} is not a status code, a range \"200-299\" or a class \"2xx\"")]
pub struct StatusRangeError {
    pub input: String,
}

/// A duration that humantime does not read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{input:?} is not a duration like \"500ms\", \"2s\", \"1m30s\" or \"3h\": {reason}")]
pub struct DurationError {
    pub input: String,
    pub reason: String,
}

impl FromStr for StatusRange {
    type Err = StatusRangeError;

    /// Parses only the shape; whether the codes are real status codes is
    /// [`HealthCheckSpec::validate`]'s job, so it can name the list index.
    fn from_str(s: &str) -> Result<Self, StatusRangeError> {
        let s = s.trim();
        let bad = || StatusRangeError {
            input: s.to_string(),
        };
        if let Some(class) = s.strip_suffix("xx").or_else(|| s.strip_suffix("XX")) {
            let d: u16 = class.parse().map_err(|_| bad())?;
            if class.len() != 1 {
                return Err(bad());
            }
            return Ok(Self::new(d * 100, d * 100 + 99));
        }
        match s.split_once('-') {
            Some((a, b)) => Ok(Self::new(
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            )),
            None => {
                let c = s.parse().map_err(|_| bad())?;
                Ok(Self::new(c, c))
            }
        }
    }
}

impl Serialize for StatusRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.lo == self.hi {
            s.serialize_u16(self.lo)
        } else {
            s.collect_str(self)
        }
    }
}

/// By hand rather than an untagged enum, so that a bad entry is refused
/// inside the visitor, where the YAML parser knows its line.
impl<'de> Deserialize<'de> for StatusRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = StatusRange;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status code, a range \"200-299\" or a class \"2xx\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<StatusRange, E> {
                u16::try_from(v)
                    .map(|c| StatusRange::new(c, c))
                    .map_err(|_| E::custom(format!("{v} is not an HTTP status code (100-599)")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<StatusRange, E> {
                Err(E::custom(format!(
                    "{v} is not an HTTP status code (100-599)"
                )))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<StatusRange, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Durations in config, the same syntax for every field of the file
/// (humantime's: `"500ms"`, `"2s"`, `"1m30s"`, `"3h"`).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    humantime::parse_duration(s.trim()).map_err(|e| DurationError {
        input: s.to_string(),
        reason: e.to_string(),
    })
}

/// The inverse of [`parse_duration`], as the spec serialises (`"1s 500ms"`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn default_is_valid_tcp() {
        let s = HealthCheckSpec::default();
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.kind, ProbeKind::Tcp);
        assert_eq!(
            (s.interval, s.timeout, s.rise, s.fall),
            (ms(2000), ms(1000), 2, 3)
        );
        let h = HealthCheckSpec::http("/healthz");
        assert_eq!(h.validate(), Ok(()));
        assert_eq!(h.expected(), &[StatusRange::new(200, 399)]);
        assert!(h.status_ok(200) && h.status_ok(302) && h.status_ok(399));
        assert!(!h.status_ok(199) && !h.status_ok(400) && !h.status_ok(500));
    }

    /// Each invalid field is reported with its own message naming it.
    #[test]
    fn each_invalid_field_has_its_own_message() {
        let tcp = HealthCheckSpec::default;
        let http = || HealthCheckSpec::http("/");
        let cases: Vec<(HealthCheckSpec, SpecError, &str)> = vec![
            (
                HealthCheckSpec {
                    interval: ms(0),
                    ..tcp()
                },
                SpecError::ZeroInterval,
                "interval: must be greater than 0",
            ),
            (
                HealthCheckSpec {
                    timeout: ms(0),
                    ..tcp()
                },
                SpecError::ZeroTimeout,
                "timeout: must be greater than 0",
            ),
            (
                HealthCheckSpec {
                    interval: ms(100),
                    timeout: ms(100),
                    ..tcp()
                },
                SpecError::TimeoutNotBelowInterval {
                    timeout: ms(100),
                    interval: ms(100),
                },
                "timeout: 100ms must be less than interval (100ms)",
            ),
            (
                HealthCheckSpec {
                    interval: ms(100),
                    timeout: ms(150),
                    ..tcp()
                },
                SpecError::TimeoutNotBelowInterval {
                    timeout: ms(150),
                    interval: ms(100),
                },
                "timeout: 150ms must be less than interval",
            ),
            (
                HealthCheckSpec { rise: 0, ..tcp() },
                SpecError::ZeroRise,
                "rise: must be at least 1",
            ),
            (
                HealthCheckSpec { fall: 0, ..tcp() },
                SpecError::ZeroFall,
                "fall: must be at least 1",
            ),
            (
                HealthCheckSpec {
                    port: Some(0),
                    ..tcp()
                },
                SpecError::ZeroPort,
                "port: must be 1-65535",
            ),
            (
                HealthCheckSpec {
                    path: Some("/x".into()),
                    ..tcp()
                },
                SpecError::HttpOnly { field: "path" },
                "path: only applies to `type: http`",
            ),
            (
                HealthCheckSpec {
                    host: Some("a".into()),
                    ..tcp()
                },
                SpecError::HttpOnly { field: "host" },
                "host: only applies",
            ),
            (
                HealthCheckSpec {
                    expected_status: Some(vec![]),
                    ..tcp()
                },
                SpecError::HttpOnly {
                    field: "expectedStatus",
                },
                "expectedStatus: only applies",
            ),
            (
                HealthCheckSpec::http("healthz"),
                SpecError::PathNotAbsolute {
                    path: "healthz".into(),
                },
                "path: \"healthz\" must start with '/'",
            ),
            (
                HealthCheckSpec::http("/a b"),
                SpecError::PathInvalid {
                    path: "/a b".into(),
                },
                "path: \"/a b\" must be printable ASCII",
            ),
            (
                HealthCheckSpec::http("/a\r\nX-Evil: 1"),
                SpecError::PathInvalid {
                    path: "/a\r\nX-Evil: 1".into(),
                },
                "path: ",
            ),
            (
                HealthCheckSpec {
                    host: Some(String::new()),
                    ..http()
                },
                SpecError::HostInvalid {
                    host: String::new(),
                },
                "host: \"\" must be non-empty",
            ),
            (
                HealthCheckSpec {
                    host: Some("a\nb".into()),
                    ..http()
                },
                SpecError::HostInvalid {
                    host: "a\nb".into(),
                },
                "host: ",
            ),
            (
                HealthCheckSpec {
                    expected_status: Some(vec![]),
                    ..http()
                },
                SpecError::ExpectedStatusEmpty,
                "expectedStatus: must list at least one",
            ),
            (
                HealthCheckSpec {
                    expected_status: Some(vec![
                        StatusRange::new(200, 200),
                        StatusRange::new(99, 99),
                    ]),
                    ..http()
                },
                SpecError::StatusCode { index: 1, code: 99 },
                "expectedStatus[1]: 99 is not an HTTP status code",
            ),
            (
                HealthCheckSpec {
                    expected_status: Some(vec![StatusRange::new(200, 600)]),
                    ..http()
                },
                SpecError::StatusCode {
                    index: 0,
                    code: 600,
                },
                "expectedStatus[0]: 600 is not",
            ),
            (
                HealthCheckSpec {
                    expected_status: Some(vec![StatusRange::new(399, 200)]),
                    ..http()
                },
                SpecError::StatusRangeReversed {
                    index: 0,
                    lo: 399,
                    hi: 200,
                },
                "expectedStatus[0]: range 399-200 is reversed",
            ),
        ];
        let mut messages = std::collections::HashSet::new();
        for (spec, want, prefix) in cases {
            let got = spec.validate().expect_err(prefix);
            assert_eq!(got, want, "{spec:?}");
            let msg = got.to_string();
            assert!(
                msg.starts_with(prefix),
                "{msg:?} does not start with {prefix:?}"
            );
            messages.insert(msg);
        }
        assert_eq!(messages.len(), 19, "messages must be distinct");
    }

    #[test]
    fn yaml_shape_round_trips_via_json() {
        let j = r#"{"type":"http","path":"/healthz","interval":"500ms","timeout":"200ms",
                    "rise":1,"fall":2,"host":"api.example","expectedStatus":[200,"300-302","2xx"]}"#;
        let s: HealthCheckSpec = serde_json::from_str(j).expect("parses");
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.interval, ms(500));
        assert_eq!(s.timeout, ms(200));
        assert_eq!(
            s.expected(),
            &[
                StatusRange::new(200, 200),
                StatusRange::new(300, 302),
                StatusRange::new(200, 299)
            ]
        );
        let back: HealthCheckSpec =
            serde_json::from_str(&serde_json::to_string(&s).expect("encodes")).expect("re-parses");
        assert_eq!(back, s);
        // `{}` is the documented default.
        let d: HealthCheckSpec = serde_json::from_str("{}").expect("parses");
        assert_eq!(d, HealthCheckSpec::default());
    }

    #[test]
    fn bad_shapes_are_rejected_at_parse() {
        for bad in [
            r#"{"interval":"2"}"#,
            r#"{"interval":"2 parsecs"}"#,
            r#"{"interval":2}"#,
            r#"{"interval":"-1s"}"#,
            r#"{"type":"udp"}"#,
            r#"{"expectedStatus":["2x"]}"#,
            r#"{"expectedStatus":["abc"]}"#,
            r#"{"expectedStatus":[70000]}"#,
            r#"{"intervall":"1s"}"#,
        ] {
            assert!(
                serde_json::from_str::<HealthCheckSpec>(bad).is_err(),
                "{bad} parsed"
            );
        }
    }

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration("1500ms"), Ok(ms(1500)));
        assert_eq!(parse_duration("3s"), Ok(ms(3000)));
        assert_eq!(parse_duration("2m"), Ok(ms(120_000)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("3h"), Ok(ms(3 * 3_600_000)));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("2").is_err());
        assert!(parse_duration("99999999999999999999999m").is_err());
        assert_eq!(format_duration(ms(1500)), "1s 500ms");
        assert_eq!(format_duration(ms(3000)), "3s");
        for d in [ms(1500), ms(3000), ms(90_000), ms(3 * 3_600_000)] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "round trip");
        }
    }

    #[test]
    fn override_resolution() {
        let vip = HealthCheckSpec {
            expected_status: Some(vec![StatusRange::new(200, 200)]),
            ..HealthCheckSpec::http("/healthz")
        };
        // No override: the VIP's spec.
        assert_eq!(resolve(&vip, None), Ok(vip.clone()));
        // Scalars and HTTP fields replace the VIP's one by one.
        let o = HealthCheckOverride {
            port: Some(8081),
            fall: Some(5),
            path: Some("/ready".into()),
            ..Default::default()
        };
        let eff = resolve(&vip, Some(&o)).expect("valid");
        assert_eq!(eff.port, Some(8081));
        assert_eq!(eff.fall, 5);
        assert_eq!(eff.rise, vip.rise);
        assert_eq!(eff.http_path(), "/ready");
        assert_eq!(eff.expected(), &[StatusRange::new(200, 200)]);
        // Switching to TCP drops the VIP's HTTP fields...
        let o = HealthCheckOverride {
            kind: Some(ProbeKind::Tcp),
            ..Default::default()
        };
        let eff = resolve(&vip, Some(&o)).expect("valid");
        assert_eq!(eff.kind, ProbeKind::Tcp);
        assert_eq!(
            (eff.path, eff.host, eff.expected_status),
            (None, None, None)
        );
        // ...but HTTP fields the override sets on TCP are an error.
        let o = HealthCheckOverride {
            kind: Some(ProbeKind::Tcp),
            path: Some("/x".into()),
            ..Default::default()
        };
        assert_eq!(
            resolve(&vip, Some(&o)),
            Err(SpecError::HttpOnly { field: "path" })
        );
        // The result is validated as a whole: an override timeout that
        // passes on its own but not against the VIP's interval.
        let o = HealthCheckOverride {
            timeout: Some(ms(5000)),
            ..Default::default()
        };
        assert!(matches!(
            resolve(&vip, Some(&o)),
            Err(SpecError::TimeoutNotBelowInterval { .. })
        ));
        let o: HealthCheckOverride =
            serde_json::from_str(r#"{"interval":"10s","timeout":"3s"}"#).expect("parses");
        let eff = resolve(&vip, Some(&o)).expect("valid");
        assert_eq!((eff.interval, eff.timeout), (ms(10_000), ms(3000)));
    }
}
