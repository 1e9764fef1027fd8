//! What the daemon learns from the host: interface indexes and MACs, and
//! DSR backends' MACs from the kernel's neighbour table.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::model::Mac;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("interface {name}: {why}")]
    Interface { name: String, why: String },
    #[error(
        "neighbour {addr}: no MAC after {waited_ms} ms (is it on a directly connected segment?)"
    )]
    Unresolved { addr: IpAddr, waited_ms: u128 },
}

/// An interface's ifindex and MAC. Asked of the kernel through a socket
/// (not sysfs, which shows the namespace it was mounted in, not ours).
pub fn interface(name: &str) -> Result<(u32, Mac), NetError> {
    let err = |why: String| NetError::Interface {
        name: name.to_string(),
        why,
    };
    let ifindex = crate::dataplane::attach::ifindex(name).map_err(|e| err(e.to_string()))?;
    if name.len() >= libc::IFNAMSIZ {
        return Err(err("name too long".into()));
    }
    // SAFETY: a plain datagram socket for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err(format!("socket: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: ifreq is plain data; the name fits (checked above) and stays
    // NUL-terminated; SIOCGIFHWADDR fills ifr_hwaddr.
    let mac = unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
            *d = *s as libc::c_char;
        }
        let rc = libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req);
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if rc < 0 {
            return Err(err(format!("SIOCGIFHWADDR: {e}")));
        }
        let sa = req.ifr_ifru.ifru_hwaddr.sa_data;
        Mac([
            sa[0] as u8,
            sa[1] as u8,
            sa[2] as u8,
            sa[3] as u8,
            sa[4] as u8,
            sa[5] as u8,
        ])
    };
    Ok((ifindex, mac))
}

/// The neighbour table's MAC for `addr`, if it has a usable one.
fn lookup(addr: IpAddr) -> Option<Mac> {
    let fam = if addr.is_ipv4() { "-4" } else { "-6" };
    let out = Command::new("ip")
        .args([fam, "neigh", "show", &addr.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        // "10.0.0.2 dev eth0 lladdr 02:..:.. REACHABLE"
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.iter().any(|w| *w == "FAILED" || *w == "INCOMPLETE") {
            continue;
        }
        if let Some(i) = words.iter().position(|w| *w == "lladdr") {
            if let Some(m) = words.get(i + 1).and_then(|m| m.parse().ok()) {
                return Some(m);
            }
        }
    }
    None
}

/// Resolve a DSR backend's MAC: from the neighbour table, else after
/// making the kernel ask (a datagram to the discard port), for at most
/// `wait`.
pub fn resolve_mac(addr: IpAddr, wait: Duration) -> Result<Mac, NetError> {
    if let Some(m) = lookup(addr) {
        return Ok(m);
    }
    let start = Instant::now();
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("constant");
    if let Ok(s) = UdpSocket::bind(bind) {
        let _ = s.send_to(b"", SocketAddr::new(addr, 9));
    }
    while start.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(20));
        if let Some(m) = lookup(addr) {
            return Ok(m);
        }
    }
    Err(NetError::Unresolved {
        addr,
        waited_ms: start.elapsed().as_millis(),
    })
}

/// Write a sysctl under /proc/sys given as path parts (an interface name
/// may hold a dot), e.g. `["net", "ipv4", "conf", "eth0", "accept_local"]`.
pub fn sysctl(parts: &[&str], value: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/sys/{}", parts.join("/")), value)
}
