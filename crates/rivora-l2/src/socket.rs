//! AF_PACKET sockets on one interface, read through tokio's `AsyncFd`.
//!
//! XDP runs before these sockets see a frame: `xdp_ingress` passes ARP
//! and ICMPv6 neighbour discovery to the stack untouched, so they arrive
//! here and at the kernel alike (the kernel answers neither: a VIP is on
//! no interface).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// Frames of one protocol on one interface: received as they arrived
/// (not this host's own outgoing ones), sent as given (a whole Ethernet
/// frame).
pub struct PacketSocket {
    fd: AsyncFd<OwnedFd>,
}

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;

/// Classic BPF for the IPv6 socket: only ICMPv6 (next header 58 right
/// after the 40-byte header, at byte 20 of the frame) of type 135,
/// neighbour solicitation (byte 54). Everything else stays in the kernel:
/// without it every IPv6 packet on the link would be copied up.
const NS_FILTER: [libc::sock_filter; 6] = [
    // ldb [20]
    libc::sock_filter {
        code: 0x30,
        jt: 0,
        jf: 0,
        k: 20,
    },
    // jeq #58, next, drop
    libc::sock_filter {
        code: 0x15,
        jt: 0,
        jf: 3,
        k: 58,
    },
    // ldb [54]
    libc::sock_filter {
        code: 0x30,
        jt: 0,
        jf: 0,
        k: 54,
    },
    // jeq #135, accept, drop
    libc::sock_filter {
        code: 0x15,
        jt: 0,
        jf: 1,
        k: 135,
    },
    // accept the whole frame
    libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0x0004_0000,
    },
    // drop
    libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    },
];

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points at a live T of the size given.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

impl PacketSocket {
    /// ARP requests (and everything else ARP) on `ifindex`.
    pub fn arp(ifindex: u32) -> io::Result<Self> {
        Self::open(ifindex, ETH_P_ARP, None)
    }

    /// ICMPv6 neighbour solicitations on `ifindex`.
    pub fn neighbour_solicitations(ifindex: u32) -> io::Result<Self> {
        Self::open(ifindex, ETH_P_IPV6, Some(&NS_FILTER))
    }

    fn open(ifindex: u32, protocol: u16, filter: Option<&[libc::sock_filter]>) -> io::Result<Self> {
        // Protocol 0 receives nothing until bound: the filter is in place
        // before the first frame can queue.
        // SAFETY: a plain socket(2); the descriptor is owned at once.
        let raw = check(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if let Some(f) = filter {
            let prog = libc::sock_fprog {
                len: f.len() as u16,
                filter: f.as_ptr().cast_mut(),
            };
            setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)?;
        }
        // Our own frames (replies, announcements) are not questions.
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &1i32)?;
        let ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ifindex out of range"))?;
        // SAFETY: an all-zero sockaddr_ll is valid; the fields are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol.to_be();
        addr.sll_ifindex = ifindex;
        // SAFETY: `addr` is a sockaddr_ll of the size given.
        check(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        // SAFETY: an OwnedFd returns the one descriptor it owns for as
        // long as it lives, and the AsyncFd owns it.
        let fd = unsafe { AsyncFd::register(fd) }?;
        Ok(Self { fd })
    }

    /// The next frame, into `buf`; its length.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let r = guard.try_io(|fd| {
                // SAFETY: `buf` is writable for its length.
                let n = unsafe {
                    libc::recv(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_TRUNC,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match r {
                Ok(Ok(n)) => return Ok(n.min(buf.len())),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Send one whole frame out of the bound interface. It is handed to
    /// the device's queue before this returns; a full socket buffer is an
    /// error, never a wait, so a frame checked against its fence is not
    /// sent long after.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is readable for its length.
        let n = unsafe {
            libc::send(
                self.fd.get_ref().as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != frame.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sent {n} of {} bytes", frame.len()),
            ));
        }
        Ok(())
    }
}
