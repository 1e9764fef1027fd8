//! Per-field checks, run while deserialising: a bad value fails where it
//! is, so serde_yaml_ng gives its line and serde_path_to_error its path,
//! and the message quotes the value as written.
//!
//! Each function here is a `deserialize_with` for a field of the file's
//! types; the field keeps its plain type (`IpAddr`, `u32`...), which is
//! what the daemon reads.

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::model::{Mac, Ports, MAX_AFFINITY_TIMEOUT_S, MAX_BURST, MAX_RATE_PER_SEC, MAX_WEIGHT};

/// A value as the file wrote it, quoted; a long one shortened, so that
/// the message still reads as a sentence.
pub(super) fn quoted(v: &str) -> String {
    const KEEP: usize = 40;
    let n = v.chars().count();
    if n <= KEEP + 8 {
        return format!("{v:?}");
    }
    let head: String = v.chars().take(KEEP).collect();
    format!("{:?} ({n} characters)", format!("{head}…"))
}

/// A value written as a string and read with `FromStr`; `what` completes
/// "... is not {what}" and "expected {what}".
struct Parsed<T> {
    what: &'static str,
    _t: PhantomData<T>,
}

impl<T> Parsed<T> {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            _t: PhantomData,
        }
    }
}

impl<T: FromStr> Visitor<'_> for Parsed<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse()
            .map_err(|_| E::custom(format!("{} is not {}", quoted(v), self.what)))
    }
}

pub(super) fn ip<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
    d.deserialize_str(Parsed::new("an IP address"))
}

/// `key:` with no value (null) is the same as leaving the key out. The
/// flag says whether the value is read as any scalar (numbers) or as text.
struct Opt<V>(V, bool);

impl<'de, V: Visitor<'de>> Visitor<'de> for Opt<V> {
    type Value = Option<V::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if self.1 {
            d.deserialize_any(self.0).map(Some)
        } else {
            d.deserialize_str(self.0).map(Some)
        }
    }
}

pub(super) fn opt_ipv4<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Ipv4Addr>, D::Error> {
    d.deserialize_option(Opt(Parsed::new("an IPv4 address"), false))
}

pub(super) fn opt_ipv6<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Ipv6Addr>, D::Error> {
    d.deserialize_option(Opt(Parsed::new("an IPv6 address"), false))
}

pub(super) fn opt_mac<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Mac>, D::Error> {
    d.deserialize_option(Opt(
        Parsed::new("a MAC address like 02:00:5e:10:00:01"),
        false,
    ))
}

pub(super) fn opt_socket_addr<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    d.deserialize_option(Opt(
        Parsed::new("an address and port like 127.0.0.1:9440 or [::1]:9440"),
        false,
    ))
}

/// The kernel's rule (`dev_valid_name`): 1 to 15 bytes, not `.` or `..`,
/// no `/`, `:` or whitespace.
pub(super) fn interface_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an interface name")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            let ok = !v.is_empty()
                && v.len() <= 15
                && v != "."
                && v != ".."
                && !v.contains(|c: char| c == '/' || c == ':' || c.is_whitespace());
            if ok {
                Ok(v.to_string())
            } else {
                Err(E::custom(format!(
                    "{} is not an interface name (1 to 15 characters, no '/', ':' or spaces)",
                    quoted(v)
                )))
            }
        }
    }
    d.deserialize_str(V)
}

/// A whole number in `min..=max`. Strings (`"5"`), fractions and
/// negative numbers are refused with the value in the message.
struct Bounded {
    min: u64,
    max: u64,
}

impl Bounded {
    fn check<E: de::Error>(&self, v: u64) -> Result<u64, E> {
        if (self.min..=self.max).contains(&v) {
            Ok(v)
        } else {
            Err(E::custom(format!(
                "{v} is out of range {}..={}",
                self.min, self.max
            )))
        }
    }
}

impl Visitor<'_> for Bounded {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number from {} to {}", self.min, self.max)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        self.check(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        match u64::try_from(v) {
            Ok(v) => self.check(v),
            Err(_) => Err(E::custom(format!(
                "{v} is out of range {}..={}",
                self.min, self.max
            ))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        Err(E::custom(format!(
            "{v} is not a whole number from {} to {}",
            self.min, self.max
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        Err(E::custom(format!(
            "{} is not a number (want a whole number from {} to {})",
            quoted(v),
            self.min,
            self.max
        )))
    }
}

fn bounded_u32<'de, D: Deserializer<'de>>(d: D, min: u32, max: u32) -> Result<u32, D::Error> {
    let v = d.deserialize_any(Bounded {
        min: min.into(),
        max: max.into(),
    })?;
    u32::try_from(v).map_err(de::Error::custom)
}

pub(super) fn weight<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    bounded_u32(d, 0, MAX_WEIGHT)
}

pub(super) fn rate_per_sec<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    bounded_u32(d, 1, MAX_RATE_PER_SEC)
}

pub(super) fn burst<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    bounded_u32(d, 1, MAX_BURST)
}

/// A backend's port; 0 means the port the client connected to, as
/// leaving it out does.
pub(super) fn opt_backend_port<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    match d.deserialize_option(Opt(Bounded { min: 0, max: 65535 }, true))? {
        Some(v) => u16::try_from(v).map(Some).map_err(de::Error::custom),
        None => Ok(None),
    }
}

const PORT_SPEC: &str = "a port (1-65535) or a range like \"8000-8100\"";

/// A VIP's port: a number, or a string holding a number or a range.
pub(super) fn ports<'de, D: Deserializer<'de>>(d: D) -> Result<Ports, D::Error> {
    struct V;
    impl V {
        fn one<E: de::Error>(v: u64) -> Result<u16, E> {
            match u16::try_from(v) {
                Ok(0) => Err(E::custom(format!("port 0 is not a port: want {PORT_SPEC}"))),
                Ok(p) => Ok(p),
                Err(_) => Err(E::custom(format!("{v} is not {PORT_SPEC}"))),
            }
        }
    }
    impl Visitor<'_> for V {
        type Value = Ports;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(PORT_SPEC)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Ports, E> {
            V::one(v).map(Ports::One)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Ports, E> {
            Err(E::custom(format!("{v} is not {PORT_SPEC}")))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Ports, E> {
            Err(E::custom(format!("{v} is not {PORT_SPEC}")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Ports, E> {
            let bad = || E::custom(format!("{} is not {PORT_SPEC}", quoted(v)));
            let num = |s: &str| -> Result<u64, E> { s.trim().parse::<u64>().map_err(|_| bad()) };
            match v.split_once('-') {
                None => V::one(num(v)?).map(Ports::One),
                Some((a, b)) => {
                    let (first, last) = (V::one(num(a)?)?, V::one(num(b)?)?);
                    if first > last {
                        return Err(E::custom(format!(
                            "{} is an empty port range (the first port is after the last)",
                            quoted(v)
                        )));
                    }
                    Ok(Ports::Range { first, last })
                }
            }
        }
    }
    d.deserialize_any(V)
}

/// A humantime duration (like every duration in the file) that `check`
/// accepts. The check runs inside the visitor, so that its refusal
/// carries the value's own position: serde_yaml_ng gives an error made
/// after the value was read the position of the enclosing mapping's
/// first key, another line when the value is not on it.
struct CheckedDuration<F>(F);

impl<F: FnOnce(Duration) -> Result<Duration, String>> Visitor<'_> for CheckedDuration<F> {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // What humantime_serde says, completed in `yaml` with examples.
        f.write_str("a duration")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        let t = humantime::parse_duration(v)
            .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))?;
        (self.0)(t).map_err(E::custom)
    }
}

/// An affinity timeout: a humantime duration (like every duration in the
/// file) of whole seconds, since the datapath counts in seconds.
pub(super) fn affinity_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_str(CheckedDuration(|t: Duration| {
        let shown = humantime::format_duration(t);
        if t.subsec_nanos() != 0 {
            return Err(format!(
                "\"{shown}\": the affinity timeout takes whole seconds (like \"30s\", \"10m\" or \"3h\")"
            ));
        }
        let max = u64::from(MAX_AFFINITY_TIMEOUT_S);
        if t.as_secs() == 0 || t.as_secs() > max {
            return Err(format!(
                "\"{shown}\" is out of range: the affinity timeout is 1s to {} ({max}s)",
                humantime::format_duration(Duration::from_secs(max))
            ));
        }
        Ok(t)
    }))
}

/// The `type:` of an affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum AffinityType {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "clientIP")]
    ClientIp,
}

/// Wraps [`affinity_timeout`] for `MapAccess::next_value`.
pub(super) struct AffinityTimeout(pub Duration);

impl<'de> Deserialize<'de> for AffinityTimeout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        affinity_timeout(d).map(AffinityTimeout)
    }
}

/// A full-NAT idle timeout: a humantime duration of whole milliseconds
/// (the datapath counts in them), within the model's bounds. `key:` with
/// no value is the key left out, as for every optional field of the file.
pub(super) fn opt_fullnat_timeout<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    d.deserialize_option(Opt(CheckedDuration(fullnat_timeout), false))
}

fn fullnat_timeout(t: Duration) -> Result<Duration, String> {
    let shown = humantime::format_duration(t);
    let (min, max) = (
        Duration::from_millis(u64::from(crate::model::MIN_FULLNAT_TIMEOUT_MS)),
        Duration::from_millis(u64::from(crate::model::MAX_FULLNAT_TIMEOUT_MS)),
    );
    if t.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!(
            "\"{shown}\": full NAT's timeouts take whole milliseconds"
        ));
    }
    if t < min || t > max {
        let why = if t < min {
            " (a flow's port is checked once a second, so one given again sooner than 2s \
             could be shared)"
        } else {
            ""
        };
        return Err(format!(
            "\"{shown}\" is out of range: {} to {}{why}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(t)
}
