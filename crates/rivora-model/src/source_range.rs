//! Source ranges: the client prefixes a VIP admits (Kubernetes'
//! `loadBalancerSourceRanges`, the file's `sourceRanges`). An empty list
//! admits everyone; a non-empty one admits only its prefixes, of either
//! family: a VIP with ranges of the other family only admits nobody (its
//! owner asked for a restriction, and none reads as "open").

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most ranges one VIP may carry: more is a list nobody reviews, and
/// every VIP shares the datapath's table (`RV_MAX_SOURCE_RANGES`).
pub const MAX_SOURCE_RANGES_PER_VIP: usize = 1024;

/// A prefix of client addresses: its network address (host bits clear)
/// and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceRange {
    addr: IpAddr,
    len: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceRangeError {
    #[error("{0:?} is not a prefix (an address, '/', a length: 10.0.0.0/8, fd00::/64)")]
    Syntax(String),
    #[error("{input:?}: length {len} is longer than the address ({max} bits)")]
    Length { input: String, len: u8, max: u8 },
    #[error("{input:?} has host bits set: did you mean {masked}?")]
    HostBits { input: String, masked: SourceRange },
}

impl SourceRange {
    /// `addr/len` with the host bits cleared (as Kubernetes and
    /// kube-proxy read `loadBalancerSourceRanges`).
    pub fn masked(addr: IpAddr, len: u8) -> Option<Self> {
        let max = max_len(addr);
        (len <= max).then(|| Self {
            addr: mask(addr, len),
            len,
        })
    }

    /// Like [`FromStr`], but host bits are cleared rather than refused.
    pub fn parse_lenient(s: &str) -> Result<Self, SourceRangeError> {
        let (addr, len) = split(s)?;
        Self::masked(addr, len).ok_or_else(|| SourceRangeError::Length {
            input: s.to_string(),
            len,
            max: max_len(addr),
        })
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    pub fn contains(&self, a: IpAddr) -> bool {
        a.is_ipv4() == self.addr.is_ipv4() && mask(a, self.len) == self.addr
    }
}

fn max_len(a: IpAddr) -> u8 {
    if a.is_ipv4() {
        32
    } else {
        128
    }
}

fn mask(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4((u32::from(v) & m).into())
        }
        IpAddr::V6(v) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6((u128::from(v) & m).into())
        }
    }
}

fn split(s: &str) -> Result<(IpAddr, u8), SourceRangeError> {
    let syntax = || SourceRangeError::Syntax(s.to_string());
    let (a, l) = s.trim().split_once('/').ok_or_else(syntax)?;
    let addr: IpAddr = a.parse().map_err(|_| syntax())?;
    // Digits only: "+8" and " 8" are not lengths.
    if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) {
        return Err(syntax());
    }
    let len: u8 = l.parse().map_err(|_| syntax())?;
    Ok((addr, len))
}

impl FromStr for SourceRange {
    type Err = SourceRangeError;

    /// Strict: a prefix whose host bits are set is refused, naming the
    /// one meant (a typo there would admit the wrong clients).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let r = Self::parse_lenient(s)?;
        let (addr, _) = split(s)?;
        if r.addr != addr {
            return Err(SourceRangeError::HostBits {
                input: s.to_string(),
                masked: r,
            });
        }
        Ok(r)
    }
}

impl fmt::Display for SourceRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Serialize for SourceRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SourceRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_parse_and_print() {
        for s in [
            "10.0.0.0/8",
            "192.0.2.7/32",
            "0.0.0.0/0",
            "fd00::/64",
            "::/0",
        ] {
            let r: SourceRange = s.parse().unwrap();
            assert_eq!(r.to_string(), s);
        }
    }

    #[test]
    fn bad_prefixes_name_what_is_wrong() {
        let e = "10.1.2.3/8".parse::<SourceRange>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"10.1.2.3/8\" has host bits set: did you mean 10.0.0.0/8?"
        );
        for s in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0/8",
            "x/8",
            "10.0.0.0/8/8",
        ] {
            assert!(
                matches!(s.parse::<SourceRange>(), Err(SourceRangeError::Syntax(_))),
                "{s}"
            );
        }
        assert!(matches!(
            "10.0.0.0/33".parse::<SourceRange>(),
            Err(SourceRangeError::Length { max: 32, .. })
        ));
        assert!(matches!(
            "fd00::/129".parse::<SourceRange>(),
            Err(SourceRangeError::Length { max: 128, .. })
        ));
    }

    #[test]
    fn lenient_clears_host_bits_as_kubernetes_does() {
        let r = SourceRange::parse_lenient("10.1.2.3/8").unwrap();
        assert_eq!(r.to_string(), "10.0.0.0/8");
        let r = SourceRange::parse_lenient("fd00::1:2/112").unwrap();
        assert_eq!(r.to_string(), "fd00::1:0/112");
    }

    #[test]
    fn contains_is_by_prefix_and_family() {
        let r: SourceRange = "10.2.0.0/16".parse().unwrap();
        assert!(r.contains("10.2.255.1".parse().unwrap()));
        assert!(!r.contains("10.3.0.1".parse().unwrap()));
        assert!(!r.contains("::ffff:10.2.0.1".parse().unwrap()));
        let all: SourceRange = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        assert!(!all.contains("fd00::1".parse().unwrap()));
    }
}
