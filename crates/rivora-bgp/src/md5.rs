//! TCP MD5 signatures (RFC 2385) through Linux's `TCP_MD5SIG` socket
//! option: set on a connecting socket before `connect`, and on the
//! listening socket for each peer that has a password, so the kernel
//! signs and checks every segment (a SYN with a wrong or missing
//! signature is dropped, never answered).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};

/// Longest key the kernel takes (`TCP_MD5SIG_MAXKEYLEN`).
pub const MAX_KEY_LEN: usize = 80;

/// `struct tcp_md5sig` from `include/uapi/linux/tcp.h` (libc does not
/// carry it): a kernel ABI, fixed since Linux 2.6.20 with the prefix and
/// ifindex fields of 4.13 and 5.6 in what was padding.
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefixlen: u8,
    keylen: u16,
    ifindex: i32,
    key: [u8; MAX_KEY_LEN],
}

fn storage_of(addr: IpAddr) -> libc::sockaddr_storage {
    let sa: socket2::SockAddr = SocketAddr::new(addr, 0).into();
    // SAFETY: a zeroed sockaddr_storage is valid; the copy stays within
    // the smaller of the two lengths.
    unsafe {
        let mut st: libc::sockaddr_storage = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(
            sa.as_ptr() as *const u8,
            &mut st as *mut _ as *mut u8,
            (sa.len() as usize).min(std::mem::size_of::<libc::sockaddr_storage>()),
        );
        st
    }
}

/// Sign segments to and from `peer` with `key` on this socket (an empty
/// key removes the signature).
pub fn set_md5(fd: BorrowedFd<'_>, peer: IpAddr, key: &[u8]) -> io::Result<()> {
    if key.len() > MAX_KEY_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a TCP MD5 password is at most {MAX_KEY_LEN} bytes"),
        ));
    }
    let mut sig = TcpMd5Sig {
        addr: storage_of(peer),
        flags: 0,
        prefixlen: 0,
        keylen: key.len() as u16,
        ifindex: 0,
        key: [0; MAX_KEY_LEN],
    };
    sig.key[..key.len()].copy_from_slice(key);
    // SAFETY: a valid fd and a fully initialised struct of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            &sig as *const TcpMd5Sig as *const libc::c_void,
            std::mem::size_of::<TcpMd5Sig>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_kernel_takes_a_key_and_refuses_an_oversized_one() {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        set_md5(s.as_fd(), "127.0.0.2".parse().unwrap(), b"secret").unwrap();
        // Removing it again is accepted too.
        set_md5(s.as_fd(), "127.0.0.2".parse().unwrap(), b"").unwrap_or(());
        let e = set_md5(s.as_fd(), "127.0.0.2".parse().unwrap(), &[b'x'; 81]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    /// Two sockets with different keys never connect; with the same key
    /// they do.
    #[test]
    fn a_wrong_key_never_connects() {
        use std::time::Duration;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        set_md5(l.as_fd(), "127.0.0.1".parse().unwrap(), b"right").unwrap();
        let try_key = |key: &[u8]| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            set_md5(s.as_fd(), "127.0.0.1".parse().unwrap(), key).unwrap();
            s.connect_timeout(&addr.into(), Duration::from_millis(1500))
                .is_ok()
        };
        assert!(!try_key(b"wrong"));
        assert!(try_key(b"right"));
    }
}
