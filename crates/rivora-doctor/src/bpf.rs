//! The few bpf(2) commands the doctor needs, straight to the syscall:
//! which programs TCX holds on an interface (BPF_PROG_QUERY), a program's
//! name by id (BPF_PROG_GET_FD_BY_ID, then BPF_OBJ_GET_INFO_BY_FD), and the
//! program behind a pinned link (BPF_OBJ_GET). libbpf would bring clang
//! and libelf into a binary that runs in an init container; these four
//! commands are a page of code.
//!
//! The attribute layouts are the kernel's UAPI (`union bpf_attr`,
//! `struct bpf_prog_info`, `struct bpf_link_info` in linux/bpf.h): a
//! command reads only its own fields and requires the rest of the size
//! passed to be zero, so each struct here is its command's prefix.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const BPF_OBJ_GET: libc::c_int = 7;
const BPF_PROG_GET_FD_BY_ID: libc::c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_PROG_QUERY: libc::c_int = 16;

/// enum bpf_attach_type (since 6.6).
pub const BPF_TCX_INGRESS: u32 = 46;
pub const BPF_TCX_EGRESS: u32 = 47;

/// `struct bpf_prog_info`: the name's offset and length.
const PROG_INFO_NAME: std::ops::Range<usize> = 64..80;
/// `struct bpf_link_info`: `type`, `id`, `prog_id`.
const LINK_INFO_PROG_ID: std::ops::Range<usize> = 8..12;

fn sys_bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, fully initialised repr(C) prefix of
    // union bpf_attr for `cmd`, and its size is what is passed; pointers
    // inside it (set by the callers) point to buffers that outlive the
    // call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned_fd(r: libc::c_long) -> OwnedFd {
    // SAFETY: bpf(2) returned a new file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(r as libc::c_int) }
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The program ids TCX runs at `attach_type` on `ifindex`, in order.
pub fn tcx_programs(ifindex: u32, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    let mut attr = QueryAttr {
        target_ifindex: ifindex,
        attach_type,
        prog_ids: ids.as_mut_ptr() as u64,
        count: ids.len() as u32,
        ..QueryAttr::default()
    };
    sys_bpf(BPF_PROG_QUERY, &mut attr)?;
    ids.truncate((attr.count as usize).min(64));
    Ok(ids)
}

#[repr(C)]
#[derive(Default)]
struct GetIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

fn info(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: buf.len() as u32,
        info: buf.as_mut_ptr() as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

/// A program's name (what its C function is called, up to 15 bytes).
/// Needs CAP_SYS_ADMIN (the kernel's rule for opening a program by id).
pub fn prog_name(id: u32) -> io::Result<String> {
    let mut attr = GetIdAttr {
        id,
        ..GetIdAttr::default()
    };
    let fd = owned_fd(sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?);
    let mut buf = [0u8; PROG_INFO_NAME.end];
    info(&fd, &mut buf)?;
    let name = &buf[PROG_INFO_NAME];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

#[repr(C)]
#[derive(Default)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// The id of the program behind the link pinned at `path` (needs only
/// access to the pin).
pub fn pinned_link_prog(path: &Path) -> io::Result<u32> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    let mut attr = ObjGetAttr {
        pathname: c.as_ptr() as u64,
        ..ObjGetAttr::default()
    };
    let fd = owned_fd(sys_bpf(BPF_OBJ_GET, &mut attr)?);
    let mut buf = [0u8; 16];
    info(&fd, &mut buf)?;
    let id = &buf[LINK_INFO_PROG_ID];
    Ok(u32::from_ne_bytes([id[0], id[1], id[2], id[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes and offsets of linux/bpf.h (6.6+): the query command's
    /// fields end with `revision`, at 56.
    #[test]
    fn uapi_layouts() {
        assert_eq!(std::mem::size_of::<QueryAttr>(), 64);
        assert_eq!(std::mem::offset_of!(QueryAttr, prog_ids), 16);
        assert_eq!(std::mem::offset_of!(QueryAttr, count), 24);
        assert_eq!(std::mem::offset_of!(QueryAttr, link_ids), 40);
        assert_eq!(std::mem::size_of::<GetIdAttr>(), 12);
        assert_eq!(std::mem::size_of::<InfoAttr>(), 16);
        assert_eq!(std::mem::size_of::<ObjGetAttr>(), 16);
    }
}
