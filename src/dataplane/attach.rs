//! Attaching programs as BPF links: XDP (native, generic, or native with a
//! fallback) and TCX egress. libbpf-rs 0.27 has neither an XDP flags
//! argument nor a TCX attach, so links are made with `bpf_link_create` and
//! held as file descriptors: closing an unpinned link detaches it, a pinned
//! one outlives the process, and `update` swaps the program behind it with
//! no gap.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::dataplane::DataplaneError;

pub use crate::model::XdpMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachPoint {
    Xdp,
    TcxEgress,
}

/// An attached program, held as its link's file descriptor.
#[derive(Debug)]
pub struct AttachedLink {
    fd: OwnedFd,
    pub point: AttachPoint,
    pub ifindex: u32,
    /// The XDP mode actually in use (None for TCX).
    pub xdp_mode: Option<XdpMode>,
}

fn errno_err(what: String, rc: i32) -> DataplaneError {
    DataplaneError::Attach {
        what,
        source: std::io::Error::from_raw_os_error(-rc),
    }
}

fn link_create(prog_fd: i32, ifindex: u32, attach: u32, flags: u32) -> Result<OwnedFd, i32> {
    // Zeroed opts with sz set is the libbpf convention; bindgen's Default
    // zeroes.
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        flags,
        ..Default::default()
    };
    // SAFETY: valid fd and opts; the return is a new fd or -errno.
    let rc = unsafe { libbpf_sys::bpf_link_create(prog_fd, ifindex as i32, attach, &opts) };
    if rc < 0 {
        return Err(rc);
    }
    // SAFETY: rc is a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(rc) })
}

impl AttachedLink {
    pub fn attach_xdp(
        prog: &impl AsFd,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<Self, DataplaneError> {
        let fd = prog.as_fd().as_raw_fd();
        let try_mode = |m: XdpMode| {
            let flags = match m {
                XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
                _ => libbpf_sys::XDP_FLAGS_DRV_MODE,
            };
            link_create(fd, ifindex, libbpf_sys::BPF_XDP, flags)
        };
        let (link, used) = match mode {
            XdpMode::Auto => match try_mode(XdpMode::Native) {
                Ok(l) => (l, XdpMode::Native),
                Err(native_rc) => {
                    let l = try_mode(XdpMode::Generic).map_err(|rc| {
                        errno_err(
                            format!(
                                "XDP on ifindex {ifindex} (native failed: {}; generic)",
                                std::io::Error::from_raw_os_error(-native_rc)
                            ),
                            rc,
                        )
                    })?;
                    tracing::warn!(ifindex, "native XDP unavailable, attached in generic mode");
                    (l, XdpMode::Generic)
                }
            },
            m => (
                try_mode(m)
                    .map_err(|rc| errno_err(format!("XDP ({m:?}) on ifindex {ifindex}"), rc))?,
                m,
            ),
        };
        Ok(Self {
            fd: link,
            point: AttachPoint::Xdp,
            ifindex,
            xdp_mode: Some(used),
        })
    }

    pub fn attach_tcx_egress(prog: &impl AsFd, ifindex: u32) -> Result<Self, DataplaneError> {
        let link = link_create(
            prog.as_fd().as_raw_fd(),
            ifindex,
            libbpf_sys::BPF_TCX_EGRESS,
            0,
        )
        .map_err(|rc| errno_err(format!("TCX egress on ifindex {ifindex}"), rc))?;
        Ok(Self {
            fd: link,
            point: AttachPoint::TcxEgress,
            ifindex,
            xdp_mode: None,
        })
    }

    /// Pin the link so it outlives this process.
    pub fn pin(&self, path: &Path) -> Result<(), DataplaneError> {
        let c = path_cstr(path)?;
        // SAFETY: valid fd and NUL-terminated path.
        let rc = unsafe { libbpf_sys::bpf_obj_pin(self.fd.as_raw_fd(), c.as_ptr()) };
        if rc < 0 {
            return Err(errno_err(format!("pinning link at {}", path.display()), rc));
        }
        Ok(())
    }

    /// Open a pinned link (the point and ifindex are the caller's record).
    pub fn open_pinned(
        path: &Path,
        point: AttachPoint,
        ifindex: u32,
    ) -> Result<Self, DataplaneError> {
        let c = path_cstr(path)?;
        // SAFETY: NUL-terminated path; the return is a new fd or -errno.
        let rc = unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) };
        if rc < 0 {
            return Err(errno_err(
                format!("opening pinned link {}", path.display()),
                rc,
            ));
        }
        // SAFETY: rc is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(rc) };
        Ok(Self {
            fd,
            point,
            ifindex,
            xdp_mode: None,
        })
    }

    /// Swap the program behind the link atomically: packets see the old
    /// program or the new one, and the link never detaches.
    pub fn update(&self, prog: &impl AsFd) -> Result<(), DataplaneError> {
        // SAFETY: valid fds; null opts means no expected-old-program check.
        let rc = unsafe {
            libbpf_sys::bpf_link_update(
                self.fd.as_raw_fd(),
                prog.as_fd().as_raw_fd(),
                std::ptr::null(),
            )
        };
        if rc < 0 {
            return Err(errno_err(
                format!(
                    "updating the {:?} link on ifindex {}",
                    self.point, self.ifindex
                ),
                rc,
            ));
        }
        Ok(())
    }

    /// What the kernel says about this link: its type, the program behind
    /// it and the interface it is attached to (0 once the interface is
    /// gone: the link then still exists but is defunct).
    pub fn info(&self) -> Result<LinkInfo, DataplaneError> {
        let mut info = libbpf_sys::bpf_link_info::default();
        let mut len = std::mem::size_of::<libbpf_sys::bpf_link_info>() as u32;
        // SAFETY: valid fd, buffer and length.
        let rc = unsafe {
            libbpf_sys::bpf_link_get_info_by_fd(self.fd.as_raw_fd(), &mut info, &mut len)
        };
        if rc < 0 {
            return Err(errno_err(
                format!("reading the {:?} link's info", self.point),
                rc,
            ));
        }
        // SAFETY: the union member read is the one the kernel filled for
        // this link type (both start with the ifindex).
        let (point, ifindex) = unsafe {
            match info.type_ {
                libbpf_sys::BPF_LINK_TYPE_XDP => {
                    (Some(AttachPoint::Xdp), info.__bindgen_anon_1.xdp.ifindex)
                }
                libbpf_sys::BPF_LINK_TYPE_TCX
                    if info.__bindgen_anon_1.tcx.attach_type == libbpf_sys::BPF_TCX_EGRESS =>
                {
                    (
                        Some(AttachPoint::TcxEgress),
                        info.__bindgen_anon_1.tcx.ifindex,
                    )
                }
                _ => (None, 0),
            }
        };
        Ok(LinkInfo {
            point,
            prog_id: info.prog_id,
            ifindex,
        })
    }

    /// Detach now, even if pinned.
    pub fn detach(&self) -> Result<(), DataplaneError> {
        // SAFETY: valid link fd.
        let rc = unsafe { libbpf_sys::bpf_link_detach(self.fd.as_raw_fd()) };
        if rc < 0 {
            return Err(errno_err(
                format!(
                    "detaching the {:?} link on ifindex {}",
                    self.point, self.ifindex
                ),
                rc,
            ));
        }
        Ok(())
    }
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    /// None: not an XDP or TCX egress link.
    pub point: Option<AttachPoint>,
    pub prog_id: u32,
    /// 0 when the interface it was attached to is gone.
    pub ifindex: u32,
}

/// The mode of the XDP program attached to `ifindex` (in this network
/// namespace), if any: a pinned link does not record its flags, the
/// interface does.
pub fn xdp_attached_mode(ifindex: u32) -> Result<Option<XdpMode>, DataplaneError> {
    let mut opts = libbpf_sys::bpf_xdp_query_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_xdp_query_opts>() as _,
        ..Default::default()
    };
    // SAFETY: valid opts; the return is 0 or -errno.
    let rc = unsafe { libbpf_sys::bpf_xdp_query(ifindex as i32, 0, &mut opts) };
    if rc < 0 {
        return Err(errno_err(format!("querying XDP on ifindex {ifindex}"), rc));
    }
    Ok(match u32::from(opts.attach_mode) {
        libbpf_sys::XDP_ATTACHED_DRV => Some(XdpMode::Native),
        libbpf_sys::XDP_ATTACHED_SKB => Some(XdpMode::Generic),
        libbpf_sys::XDP_ATTACHED_NONE => None,
        // Offloaded or several modes at once: not something rivorad makes.
        _ => Some(XdpMode::Auto),
    })
}

fn path_cstr(path: &Path) -> Result<CString, DataplaneError> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| DataplaneError::Attach {
        what: format!("path {} contains a NUL byte", path.display()),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })
}

/// The ifindex of a named interface in this network namespace.
pub fn ifindex(name: &str) -> Result<u32, DataplaneError> {
    nix::net::if_::if_nametoindex(name).map_err(|e| DataplaneError::Attach {
        what: format!("interface {name}"),
        source: e.into(),
    })
}
