//! What the daemon learns from the host: interface indexes and MACs, and
//! DSR backends' MACs from the kernel's neighbour table.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::model::Mac;
use crate::netlink::{Netlink, NetlinkError};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("interface {name}: {source}")]
    Interface {
        name: String,
        #[source]
        source: NetlinkError,
    },
    #[error("interface {name}: no such interface")]
    NoInterface { name: String },
    #[error("neighbour {addr}: {source}")]
    Neighbour {
        addr: IpAddr,
        #[source]
        source: NetlinkError,
    },
    #[error(
        "neighbour {addr}: no MAC after {waited_ms} ms (is it on a directly connected segment?)"
    )]
    Unresolved { addr: IpAddr, waited_ms: u128 },
    #[error("route to {addr}: {source}")]
    Route {
        addr: IpAddr,
        #[source]
        source: NetlinkError,
    },
    #[error("route to {addr}: {why}")]
    NoSource { addr: IpAddr, why: &'static str },
}

/// An interface's ifindex and MAC, asked of the kernel over netlink (not
/// sysfs, which shows the namespace it was mounted in, not ours). A device
/// without an Ethernet address (tun, wireguard) gets the zero MAC, as the
/// SIOCGIFHWADDR ioctl this replaced gave.
pub fn interface(name: &str) -> Result<(u32, Mac), NetError> {
    let err = |source| NetError::Interface {
        name: name.to_string(),
        source,
    };
    let link = Netlink::open()
        .and_then(|mut nl| nl.link_by_name(name))
        .map_err(err)?
        .ok_or_else(|| NetError::NoInterface {
            name: name.to_string(),
        })?;
    Ok((link.index, link.mac.unwrap_or_default()))
}

/// Resolve a DSR backend's MAC: from the neighbour table, else after
/// making the kernel ask (a datagram to the discard port), for at most
/// `wait`.
pub fn resolve_mac(addr: IpAddr, wait: Duration) -> Result<Mac, NetError> {
    let start = Instant::now();
    let found = Netlink::open()
        .and_then(|mut nl| nl.resolve(addr, wait))
        .map_err(|source| NetError::Neighbour { addr, source })?;
    found
        .and_then(|n| n.mac)
        .ok_or_else(|| NetError::Unresolved {
            addr,
            waited_ms: start.elapsed().as_millis(),
        })
}

/// The source address the node's route to `addr` prefers (`ip route get`'s
/// `src`): full NAT's source towards a backend when the node configures
/// none, as MASQUERADE picks it.
pub fn route_source(addr: IpAddr) -> Result<IpAddr, NetError> {
    let route = Netlink::open()
        .and_then(|mut nl| nl.route_get(addr))
        .map_err(|source| NetError::Route { addr, source })?
        .ok_or(NetError::NoSource {
            addr,
            why: "no route",
        })?;
    if !route.unicast {
        return Err(NetError::NoSource {
            addr,
            why: "the route is not a unicast one (blackhole, unreachable, local...)",
        });
    }
    route.prefsrc.ok_or(NetError::NoSource {
        addr,
        why: "the route names no source address (does the egress interface have one?)",
    })
}

/// Whether `addr` is an address of this node (its route is a local one).
pub fn is_local(addr: IpAddr) -> Result<bool, NetError> {
    Ok(Netlink::open()
        .and_then(|mut nl| nl.route_get(addr))
        .map_err(|source| NetError::Route { addr, source })?
        .is_some_and(|r| r.local))
}

/// Write a sysctl under /proc/sys given as path parts (an interface name
/// may hold a dot), e.g. `["net", "ipv4", "conf", "eth0", "accept_local"]`.
pub fn sysctl(parts: &[&str], value: &str) -> std::io::Result<()> {
    std::fs::write(format!("/proc/sys/{}", parts.join("/")), value)
}
