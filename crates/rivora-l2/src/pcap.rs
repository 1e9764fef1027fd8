//! Just enough of the pcap file format (what `tcpdump -w` writes) to read
//! Ethernet captures back: the unit tests' captured frames, and the
//! end-to-end tests' capture of a bridge during handovers.

use std::time::Duration;

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// When it was captured (since the Unix epoch).
    pub at: Duration,
    pub frame: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PcapError {
    #[error("not a pcap file (magic {0:#010x})")]
    Magic(u32),
    #[error("the capture's link type is {0}, not Ethernet (1)")]
    LinkType(u32),
    #[error("the file ends inside a record (at byte {0})")]
    Truncated(usize),
}

/// Read a whole capture. A file cut short inside its last record (a
/// capture stopped mid-write) is an error.
pub fn read(bytes: &[u8]) -> Result<Vec<Captured>, PcapError> {
    let word = |at: usize, big: bool| -> Option<u32> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(if big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    };
    let magic = word(0, false).ok_or(PcapError::Truncated(0))?;
    // Microsecond or nanosecond timestamps, in either byte order.
    let (big, nanos) = match magic {
        0xa1b2_c3d4 => (false, false),
        0xa1b2_3c4d => (false, true),
        0xd4c3_b2a1 => (true, false),
        0x4d3c_b2a1 => (true, true),
        other => return Err(PcapError::Magic(other)),
    };
    let link = word(20, big).ok_or(PcapError::Truncated(20))?;
    if link != 1 {
        return Err(PcapError::LinkType(link));
    }
    let mut out = Vec::new();
    let mut at = 24;
    while at < bytes.len() {
        let field = |off: usize| word(at + off, big).ok_or(PcapError::Truncated(at));
        let (secs, frac, len) = (field(0)?, field(4)?, field(8)? as usize);
        let data = bytes
            .get(at + 16..at + 16 + len)
            .ok_or(PcapError::Truncated(at))?;
        let frac = if nanos {
            Duration::from_nanos(u64::from(frac))
        } else {
            Duration::from_micros(u64::from(frac))
        };
        out.push(Captured {
            at: Duration::from_secs(u64::from(secs)) + frac,
            frame: data.to_vec(),
        });
        at += 16 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_tcpdump_wrote_and_refuses_the_rest() {
        let f = read(include_bytes!("../testdata/kernel-arp-reply.pcap")).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].frame.len(), 42);
        assert!(f[0].at > Duration::from_secs(1_700_000_000));
        let mut cut = include_bytes!("../testdata/kernel-arp-reply.pcap").to_vec();
        cut.truncate(cut.len() - 1);
        assert_eq!(read(&cut), Err(PcapError::Truncated(24)));
        assert_eq!(read(b"nope"), Err(PcapError::Magic(0x65706f6e)));
        let mut other_link = include_bytes!("../testdata/kernel-arp-reply.pcap").to_vec();
        other_link[20] = 113;
        assert_eq!(read(&other_link), Err(PcapError::LinkType(113)));
        // No records: an empty capture.
        assert_eq!(read(&cut[..24]).unwrap(), vec![]);
    }
}
