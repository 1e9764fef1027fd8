//! A readable, stable text dump of a map image: one line per VIP, slice
//! and backend, in id order. Golden tests compare it; rivoractl prints it.
//! Anything the maps hold that no VIP explains (a stray slot, a match
//! entry without a service) gets its own line, so a dump never hides a
//! leak.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::abi;
use crate::dataplane::render::{mode_from_raw, MapImage, MatchKey, ServiceEntry};
use crate::maglev;
use crate::model::{Mac, Protocol};

fn addr_port(addr: IpAddr, ports: &str) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{ports}"),
        IpAddr::V6(a) => format!("[{a}]:{ports}"),
    }
}

fn proto_name(p: u8) -> String {
    Protocol::from_number(p).map_or_else(|| format!("proto{p}"), |p| p.to_string())
}

/// The VIP a service's match entries describe, as "tcp/10.0.0.1:80" or
/// "udp/[fd00::1]:1000-1999"; blocks that do not join up are listed.
fn describe_matches(ms: &[MatchKey]) -> String {
    let mut parts = Vec::new();
    let mut ranges: BTreeMap<(u8, IpAddr), Vec<(u32, u32)>> = BTreeMap::new();
    for m in ms {
        match *m {
            MatchKey::Exact { addr, port, proto } => parts.push(format!(
                "{}/{}",
                proto_name(proto),
                addr_port(addr, &port.to_string())
            )),
            MatchKey::Range {
                addr,
                proto,
                port,
                port_bits,
            } => {
                let lo = u32::from(port);
                let hi = lo + (1u32 << (16 - u32::from(port_bits).min(16))) - 1;
                ranges.entry((proto, addr)).or_default().push((lo, hi));
            }
        }
    }
    for ((proto, addr), mut rs) in ranges {
        rs.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::new();
        for (lo, hi) in rs {
            match merged.last_mut() {
                Some(last) if last.1 + 1 == lo => last.1 = hi,
                _ => merged.push((lo, hi)),
            }
        }
        for (lo, hi) in merged {
            parts.push(format!(
                "{}/{}",
                proto_name(proto),
                addr_port(addr, &format!("{lo}-{hi}"))
            ));
        }
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(",")
    }
}

fn flags(f: u32) -> String {
    let mut v = Vec::new();
    for (bit, name) in [
        (abi::rv_service_flags::RV_SVC_F_ACTIVE.0, "active"),
        (abi::rv_service_flags::RV_SVC_F_RATE_LIMIT.0, "rate_limit"),
        (abi::rv_service_flags::RV_SVC_F_PORT_RANGE.0, "port_range"),
        (abi::rv_service_flags::RV_SVC_F_FULLNAT.0, "fullnat"),
        (
            abi::rv_service_flags::RV_SVC_F_SOURCE_RANGES.0,
            "source_ranges",
        ),
    ] {
        if f & bit != 0 {
            v.push(name.to_string());
        }
    }
    let gen = f >> abi::RANGES_GEN_SHIFT;
    if gen != 0 {
        v.push(format!("ranges_gen={gen}"));
    }
    let known = abi::rv_service_flags::RV_SVC_F_ACTIVE.0
        | abi::rv_service_flags::RV_SVC_F_RATE_LIMIT.0
        | abi::rv_service_flags::RV_SVC_F_PORT_RANGE.0
        | abi::rv_service_flags::RV_SVC_F_FULLNAT.0
        | abi::rv_service_flags::RV_SVC_F_SOURCE_RANGES.0
        | (0xff << abi::RANGES_GEN_SHIFT);
    if f & !known != 0 {
        v.push(format!("{:#x}", f & !known));
    }
    if v.is_empty() {
        "-".into()
    } else {
        v.join("|")
    }
}

fn service_line(out: &mut String, id: u32, s: &ServiceEntry, ms: &[MatchKey], img: &MapImage) {
    let mode = mode_from_raw(s.mode).map_or_else(|| format!("mode{}", s.mode), |m| m.to_string());
    let affinity = if u32::from(s.affinity) == abi::rv_affinity::RV_AFFINITY_CLIENT_IP.0 {
        format!("clientIP/{}s", s.affinity_timeout_s)
    } else {
        "none".to_string()
    };
    let rl = img.svc_rate_limits.get(&id).map_or("-".to_string(), |r| {
        format!("{}/s+{}", r.rate_per_sec, r.burst)
    });
    let _ = writeln!(
        out,
        "vip svc={id} {} family={} mode={mode} affinity={affinity} flags={} rate_limit={rl} backends={} slice={}+{}",
        describe_matches(ms),
        s.family,
        flags(s.flags),
        s.backend_count,
        s.slice_start,
        s.slice_len
    );
}

/// The dump of an image.
pub fn dump(img: &MapImage) -> String {
    let mut out = String::new();
    let n = &img.node;
    let _ = writeln!(
        out,
        "node syn_rate_limit={} tunnel_src4={} tunnel_src6={}",
        n.syn_rate_limit.map_or("-".to_string(), |r| format!(
            "{}/s+{}",
            r.rate_per_sec, r.burst
        )),
        n.tunnel_src4.map_or("-".to_string(), |a| a.to_string()),
        n.tunnel_src6.map_or("-".to_string(), |a| a.to_string()),
    );
    for (ifindex, mac) in &n.interface_macs {
        let generic = if n.generic_xdp.contains(ifindex) {
            " generic"
        } else {
            ""
        };
        let _ = writeln!(out, "iface {ifindex} mac={mac}{generic}");
    }

    let mut by_svc: BTreeMap<u32, Vec<MatchKey>> = BTreeMap::new();
    for (m, svc) in &img.matches {
        by_svc.entry(*svc).or_default().push(*m);
    }
    for (id, s) in &img.services {
        service_line(&mut out, *id, s, by_svc.get(id).map_or(&[][..], |v| v), img);
    }
    for (id, ms) in &by_svc {
        if !img.services.contains_key(id) {
            let _ = writeln!(
                out,
                "vip svc={id} {} (no service entry)",
                describe_matches(ms)
            );
        }
    }
    for (id, rl) in &img.svc_rate_limits {
        if !img.services.contains_key(id) {
            let _ = writeln!(
                out,
                "rate_limit svc={id} {}/s+{} (no service entry)",
                rl.rate_per_sec, rl.burst
            );
        }
    }

    let mut in_slice = BTreeSet::new();
    for (id, s) in &img.services {
        let content = img.slice_of(s);
        let mut held: BTreeMap<u32, u32> = BTreeMap::new();
        for b in &content {
            *held.entry(*b).or_default() += 1;
        }
        let empty = held.remove(&0).unwrap_or(0);
        let held: Vec<String> = held.iter().map(|(b, c)| format!("{b}:{c}")).collect();
        let bytes: Vec<u8> = content.iter().flat_map(|b| b.to_le_bytes()).collect();
        let _ = writeln!(
            out,
            "slice svc={id} start={} len={} held={} empty={empty} hash={:016x}",
            s.slice_start,
            s.slice_len,
            if held.is_empty() {
                "-".to_string()
            } else {
                held.join(",")
            },
            maglev::hash64(0, &bytes)
        );
        in_slice.extend(s.slice_start..s.slice_start.saturating_add(s.slice_len));
    }
    for (slot, b) in &img.slots {
        if !in_slice.contains(slot) {
            let _ = writeln!(out, "stray slot={slot} backend={b}");
        }
    }

    for (id, b) in &img.backends {
        let mac = if b.mac == [0; 6] {
            "-".to_string()
        } else {
            Mac(b.mac).to_string()
        };
        let health = img.health.get(id).map_or("down", |h| h.name());
        let nh = &b.nexthop;
        let nh = if nh.is_none() {
            String::new()
        } else {
            format!(
                " nh=if{} mtu={} {}<-{} flags={:#x}",
                nh.ifindex,
                nh.mtu,
                Mac(nh.dmac),
                Mac(nh.smac),
                nh.flags
            )
        };
        let _ = writeln!(
            out,
            "backend {id} {} mac={mac} health={health}{nh}",
            addr_port(b.addr, &b.port.to_string())
        );
    }
    for (k, o) in &img.nat_owners {
        let _ = writeln!(
            out,
            "nat_owner {}/{} svc={} backend={} vip={}",
            addr_port(k.addr, &k.port.to_string()),
            k.proto,
            o.svc_id,
            o.backend_id,
            addr_port(o.vip, &o.vip_port.to_string())
        );
    }
    for ((svc, addr), id) in &img.tunnel_eps {
        let _ = writeln!(out, "tunnel_ep svc={svc} {addr} backend={id}");
    }
    for (id, h) in &img.health {
        if !img.backends.contains_key(id) {
            let _ = writeln!(out, "health {id} {} (no backend entry)", h.name());
        }
    }
    out
}
