//! Port ranges as the kernel writes them, and the arithmetic the full-NAT
//! port check needs: where two ranges meet, what of that a list of
//! reserved ranges leaves uncovered. Pure, so every case is a unit test.

use std::fmt;

use serde::Serialize;

/// An inclusive range of ports, `first <= last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// None when `first > last`.
    pub fn new(first: u16, last: u16) -> Option<Self> {
        (first <= last).then_some(Self { first, last })
    }

    /// The ports in both, if any.
    pub fn intersect(self, other: PortRange) -> Option<PortRange> {
        PortRange::new(self.first.max(other.first), self.last.min(other.last))
    }

    /// How many ports (never 0).
    pub fn count(self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Ranges as `ip_local_reserved_ports` takes and shows them:
/// `1024-2000,8080`, or `(none)` for none.
pub fn list(ranges: &[PortRange]) -> String {
    if ranges.is_empty() {
        return "(none)".into();
    }
    ranges
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn port(s: &str) -> Result<u16, String> {
    s.trim()
        .parse()
        .map_err(|e| format!("{:?} is not a port: {e}", s.trim()))
}

/// `net.ipv4.ip_local_port_range`: two ports, tab-separated
/// (`"32768\t60999"`).
pub fn parse_port_range(s: &str) -> Result<PortRange, String> {
    let mut it = s.split_whitespace();
    let (Some(a), Some(b), None) = (it.next(), it.next(), it.next()) else {
        return Err(format!("{:?}: not two ports", s.trim()));
    };
    let (first, last) = (port(a)?, port(b)?);
    PortRange::new(first, last).ok_or_else(|| format!("{first} {last}: the first above the last"))
}

/// `net.ipv4.ip_local_reserved_ports`: comma-separated ports and
/// `first-last` ranges, empty for none (`"1024-2000,8080"`). Sorted, with
/// overlapping and adjacent ranges merged.
pub fn parse_port_list(s: &str) -> Result<Vec<PortRange>, String> {
    let mut out = Vec::new();
    for item in s.trim().split(',').filter(|i| !i.trim().is_empty()) {
        let r = match item.split_once('-') {
            Some((a, b)) => {
                let (first, last) = (port(a)?, port(b)?);
                PortRange::new(first, last)
                    .ok_or_else(|| format!("{}: the first above the last", item.trim()))?
            }
            None => {
                let p = port(item)?;
                PortRange { first: p, last: p }
            }
        };
        out.push(r);
    }
    Ok(merge(out))
}

/// Sorted, overlapping and adjacent ranges joined.
pub fn merge(mut ranges: Vec<PortRange>) -> Vec<PortRange> {
    ranges.sort();
    let mut out: Vec<PortRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(l) if u32::from(r.first) <= u32::from(l.last) + 1 => l.last = l.last.max(r.last),
            _ => out.push(r),
        }
    }
    out
}

/// The ports of `range` that none of `covered` holds, as ranges in order.
pub fn uncovered(range: PortRange, covered: &[PortRange]) -> Vec<PortRange> {
    let mut out = Vec::new();
    // The next port not yet accounted for; u32 so that it can pass 65535.
    let mut next = u32::from(range.first);
    for c in merge(covered.to_vec()) {
        let Some(c) = c.intersect(range) else {
            continue;
        };
        if u32::from(c.first) > next {
            // `next` is at most c.first - 1 <= 65534 here.
            out.push(PortRange {
                first: next as u16,
                last: c.first - 1,
            });
        }
        next = next.max(u32::from(c.last) + 1);
    }
    if next <= u32::from(range.last) {
        out.push(PortRange {
            first: next as u16,
            last: range.last,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(first: u16, last: u16) -> PortRange {
        PortRange::new(first, last).expect("a range")
    }

    #[test]
    fn parses_what_the_kernel_writes() {
        assert_eq!(parse_port_range("32768\t60999\n"), Ok(r(32768, 60999)));
        assert_eq!(parse_port_range("1024 65535"), Ok(r(1024, 65535)));
        assert!(parse_port_range("32768").is_err());
        assert!(parse_port_range("1 2 3").is_err());
        assert!(parse_port_range("60999 32768").is_err());
        assert!(parse_port_range("x 2").is_err());

        assert_eq!(parse_port_list("\n"), Ok(vec![]));
        assert_eq!(parse_port_list(""), Ok(vec![]));
        assert_eq!(
            parse_port_list("8080,1024-2000\n"),
            Ok(vec![r(1024, 2000), r(8080, 8080)])
        );
        // Overlapping and adjacent entries are one range.
        assert_eq!(
            parse_port_list("1000-2000,1500-2500,2501,9000"),
            Ok(vec![r(1000, 2501), r(9000, 9000)])
        );
        assert!(parse_port_list("2000-1000").is_err());
        assert!(parse_port_list("70000").is_err());
        assert!(parse_port_list("a-b").is_err());
    }

    #[test]
    fn intersections() {
        assert_eq!(r(1024, 32767).intersect(r(32768, 60999)), None);
        assert_eq!(
            r(1024, 40000).intersect(r(32768, 60999)),
            Some(r(32768, 40000))
        );
        assert_eq!(
            r(1024, 65535).intersect(r(32768, 60999)),
            Some(r(32768, 60999))
        );
        assert_eq!(r(5, 5).intersect(r(5, 9)), Some(r(5, 5)));
        assert_eq!(r(1, 65535).count(), 65535);
    }

    #[test]
    fn what_reserved_ports_leave_uncovered() {
        let overlap = r(32768, 40000);
        assert_eq!(uncovered(overlap, &[]), vec![overlap]);
        assert_eq!(uncovered(overlap, &[r(32768, 40000)]), vec![]);
        assert_eq!(uncovered(overlap, &[r(1024, 65535)]), vec![]);
        assert_eq!(
            uncovered(overlap, &[r(33000, 34000), r(35000, 35000)]),
            vec![r(32768, 32999), r(34001, 34999), r(35001, 40000)]
        );
        // Out of order, overlapping, outside the range: the same answer.
        assert_eq!(
            uncovered(
                overlap,
                &[
                    r(39000, 45000),
                    r(100, 200),
                    r(32000, 33000),
                    r(32900, 33100)
                ]
            ),
            vec![r(33101, 38999)]
        );
        // Up to the last port there is.
        assert_eq!(
            uncovered(r(65000, 65535), &[r(65535, 65535)]),
            vec![r(65000, 65534)]
        );
        assert_eq!(uncovered(r(65000, 65535), &[r(65000, 65535)]), vec![]);
        assert_eq!(uncovered(r(1, 1), &[r(1, 1)]), vec![]);
    }

    #[test]
    fn lists_as_the_sysctl_takes_them() {
        assert_eq!(list(&[]), "(none)");
        assert_eq!(list(&[r(1024, 2000), r(8080, 8080)]), "1024-2000,8080");
    }
}
