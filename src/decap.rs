//! The backend's side of L3 DSR: strip the IPIP / IPv6-in-IPv6 header the
//! node added, in XDP, for packets to the VIPs this backend holds.
//!
//! A backend normally decapsulates with the kernel's `ipip` and
//! `ip6_tunnel` modules (a tunnel device with the VIP on it). Many hosts
//! have neither module, and loading modules is not always ours to do
//! (containers, locked-down kernels): `bpf/decap.bpf.c` does the same work
//! with nothing but XDP, so a backend needs only this program on the
//! interface the tunnel arrives on and the VIP on `lo` (`arp_ignore=1`,
//! `arp_announce=2`, as for L2 DSR). The decapsulated packet is passed to
//! the stack as if it had arrived bare; the reply leaves from the VIP,
//! straight to the client.
//!
//! The object also carries `xdp_pass`, a program that does nothing: a frame
//! sent into a veth with `XDP_TX` or `XDP_REDIRECT` is delivered only when
//! the peer end has an XDP program, so labs (and veth-based deployments)
//! attach it there.
//!
//! The decap maps belong to this object and are not pinned: they are the
//! backend's state, not part of the node's `rivora-lb` ABI.

use std::mem::size_of;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use crate::bpf::decap::types::rv_decap_stats;
use crate::bpf::decap::{DecapSkel, DecapSkelBuilder};
use crate::dataplane::loader::Owned;
use crate::dataplane::{AttachedLink, DataplaneError, XdpMode};

/// Decapsulation counters, summed over CPUs.
pub type DecapStats = rv_decap_stats;

/// The loaded decap object. Dropping it does not detach links made from
/// it: a link holds its program.
pub struct Decap {
    skel: Owned<DecapSkel<'static>>,
}

/// The two programs as file descriptors of their own, so they can be
/// attached from another thread: an ifindex means something only in the
/// network namespace of the thread that attaches.
#[derive(Debug)]
pub struct DecapProgs {
    pub decap: OwnedFd,
    pub pass: OwnedFd,
}

impl DecapProgs {
    /// Attach the decapsulator to `ifindex` (native XDP).
    pub fn attach_decap(&self, ifindex: u32) -> Result<AttachedLink, DataplaneError> {
        AttachedLink::attach_xdp(&self.decap, ifindex, XdpMode::Native)
    }

    /// Attach `xdp_pass` to `ifindex` (native XDP), so that frames sent
    /// into this veth's peer with XDP_TX or XDP_REDIRECT are delivered.
    pub fn attach_pass(&self, ifindex: u32) -> Result<AttachedLink, DataplaneError> {
        AttachedLink::attach_xdp(&self.pass, ifindex, XdpMode::Native)
    }
}

fn map_err(map: &'static str, op: &'static str, source: libbpf_rs::Error) -> DataplaneError {
    DataplaneError::Map { map, op, source }
}

/// The map key for a VIP: the address octets, which is how the kernel
/// stores `__be32` and `__be32[4]`.
fn vip_key(vip: IpAddr) -> (&'static str, Vec<u8>) {
    match vip {
        IpAddr::V4(a) => ("decap_vips", a.octets().to_vec()),
        IpAddr::V6(a) => ("decap_vips6", a.octets().to_vec()),
    }
}

impl Decap {
    pub fn load() -> Result<Self, DataplaneError> {
        let skel = Owned::load(|storage| {
            DecapSkelBuilder::default()
                .open(storage)
                .map_err(|e| DataplaneError::Load(format!("opening decap: {e}")))?
                .load()
                .map_err(|e| DataplaneError::Load(format!("loading decap: {e}")))
        })?;
        Ok(Self { skel })
    }

    /// The loaded skeleton: its programs (for BPF_PROG_TEST_RUN) and maps.
    pub fn skel(&self) -> &DecapSkel<'static> {
        self.skel.get()
    }

    /// Duplicates of the program descriptors, to attach from any thread.
    pub fn progs(&self) -> Result<DecapProgs, DataplaneError> {
        let dup = |what: &str, fd: std::os::fd::BorrowedFd<'_>| {
            fd.try_clone_to_owned()
                .map_err(|source| DataplaneError::Attach {
                    what: format!("duplicating the {what} program fd"),
                    source,
                })
        };
        let progs = &self.skel().progs;
        Ok(DecapProgs {
            decap: dup("xdp_decap", progs.xdp_decap.as_fd())?,
            pass: dup("xdp_pass", progs.xdp_pass.as_fd())?,
        })
    }

    /// Attach the decapsulator to `ifindex` in this thread's namespace.
    pub fn attach(&self, ifindex: u32) -> Result<AttachedLink, DataplaneError> {
        AttachedLink::attach_xdp(&self.skel().progs.xdp_decap, ifindex, XdpMode::Native)
    }

    /// Attach `xdp_pass` to `ifindex` in this thread's namespace.
    pub fn attach_pass(&self, ifindex: u32) -> Result<AttachedLink, DataplaneError> {
        AttachedLink::attach_xdp(&self.skel().progs.xdp_pass, ifindex, XdpMode::Native)
    }

    /// Accept L3 DSR traffic for `vip` (the VIP must also be on `lo`).
    pub fn add_vip(&self, vip: IpAddr) -> Result<(), DataplaneError> {
        let maps = &self.skel().maps;
        let (name, key) = vip_key(vip);
        let map = match vip {
            IpAddr::V4(_) => &maps.decap_vips,
            IpAddr::V6(_) => &maps.decap_vips6,
        };
        map.update(&key, &[1u8], MapFlags::ANY)
            .map_err(|e| map_err(name, "update", e))
    }

    /// Stop decapsulating for `vip`; absent is not an error.
    pub fn remove_vip(&self, vip: IpAddr) -> Result<(), DataplaneError> {
        let maps = &self.skel().maps;
        let (name, key) = vip_key(vip);
        let map = match vip {
            IpAddr::V4(_) => &maps.decap_vips,
            IpAddr::V6(_) => &maps.decap_vips6,
        };
        match map.delete(&key) {
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            r => r.map_err(|e| map_err(name, "delete", e)),
        }
    }

    /// The counters, summed over CPUs.
    pub fn stats(&self) -> Result<DecapStats, DataplaneError> {
        const NAME: &str = "decap_stats";
        let per_cpu = self
            .skel()
            .maps
            .decap_stats
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| map_err(NAME, "lookup", e))?
            .unwrap_or_default();
        let mut sum = DecapStats::default();
        for bytes in per_cpu {
            let s = parse_stats(&bytes).ok_or_else(|| {
                map_err(
                    NAME,
                    "lookup",
                    libbpf_rs::Error::from(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("value of {} bytes", bytes.len()),
                    )),
                )
            })?;
            sum.decap4 += s.decap4;
            sum.decap6 += s.decap6;
            sum.not_vip += s.not_vip;
            sum.malformed += s.malformed;
        }
        Ok(sum)
    }
}

/// One CPU's `rv_decap_stats`: four native-endian u64s, in field order.
fn parse_stats(bytes: &[u8]) -> Option<DecapStats> {
    if bytes.len() != size_of::<DecapStats>() {
        return None;
    }
    let mut words = bytes
        .chunks_exact(8)
        .map(|c| c.try_into().map(u64::from_ne_bytes));
    let mut next = || words.next()?.ok();
    Some(DecapStats {
        decap4: next()?,
        decap6: next()?,
        not_vip: next()?,
        malformed: next()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_parse_in_field_order() {
        let mut b = Vec::new();
        for v in [1u64, 2, 3, 4] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        let s = parse_stats(&b).expect("32 bytes parse");
        assert_eq!((s.decap4, s.decap6, s.not_vip, s.malformed), (1, 2, 3, 4));
        assert!(parse_stats(&b[..31]).is_none());
    }
}
