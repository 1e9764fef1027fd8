//! From the configuration file to what the operator sees, with the real
//! rivorad and rivoractl (issue 11, item 1): a VIP's `synRateLimit` in the
//! file, burst + 1 SYNs from the lab's client, and exactly one
//! `rate_limited` drop in `rivoractl stats` (table and JSON) and in the
//! metrics, for an IPv4 and an IPv6 VIP.
//!
//! The SYNs are sent from raw sockets, one segment each: a TCP connect
//! whose SYN is dropped retransmits it (1 s later, then 3 s), and every
//! retransmission meets the limiter again, so the count would depend on
//! timing. Nothing else in the lab sends a SYN to a VIP (the VIPs are not
//! probed: `healthCheck: false`), so the counters hold exactly these. The
//! backends listen on nothing: each forwarded SYN is answered with a RST
//! that the client's kernel, which has no socket for it, drops.
//!
//! Needs root. rivorad runs in an RAII guard with its own state and pin
//! directories (`common::rivorad::Home`), checked empty of leftovers at
//! the end.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use common::netns::Netns;
use common::rivorad::{Home, Rivorad};
use common::topology::{Mode, Topology, NAT_BACKEND_PORT, VIP_PORT};
use common::traffic::wait_for;
use etherparse::TcpHeader;
use serde_json::Value;

const BURST: u32 = 5;
const METRICS: &str = "127.0.0.1:9441";

/// The file: two NAT VIPs (IPv4, IPv6) with their own SYN limit of one a
/// second, burst 5, over the lab's three backends; metrics on.
fn config(topo: &Topology, home: &Home) -> String {
    let mut y = format!(
        "interfaces:\n  - name: n0\n    xdpMode: native\n\
         api:\n  socket: {}\n\
         metrics:\n  listen: {METRICS}\n\
         vips:\n",
        home.socket().display()
    );
    for v6 in [false, true] {
        let addr = if v6 {
            topo.vip6.to_string()
        } else {
            topo.vip4.to_string()
        };
        y += &format!(
            "  - address: \"{addr}\"\n    port: {VIP_PORT}\n    protocol: tcp\n    mode: nat\n    \
             healthCheck: false\n    synRateLimit: {{ ratePerSec: 1, burst: {BURST} }}\n    \
             backends:\n"
        );
        for b in &topo.backends {
            let a = if v6 {
                b.v6.to_string()
            } else {
                b.v4.to_string()
            };
            y += &format!("      - {{ address: \"{a}\", port: {NAT_BACKEND_PORT} }}\n");
        }
    }
    y
}

/// One TCP SYN per source port in `sports`, from `src` to `dst:dport`,
/// each a single segment written to a raw socket in `ns` (the kernel adds
/// the IP header; the checksum is computed here over `src`, the client's
/// only address, which the kernel chooses as the source).
fn raw_syns(ns: &Netns, src: IpAddr, dst: IpAddr, dport: u16, sports: Vec<u16>) {
    ns.run(move || {
        let domain = if dst.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(domain, libc::SOCK_RAW, libc::IPPROTO_TCP) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        for sport in sports {
            let mut tcp = TcpHeader::new(sport, dport, u32::from(sport) << 8, 64240);
            tcp.syn = true;
            tcp.checksum = match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    tcp.calc_checksum_ipv4_raw(s.octets(), d.octets(), &[])
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => {
                    tcp.calc_checksum_ipv6_raw(s.octets(), d.octets(), &[])
                }
                _ => panic!("mixed families"),
            }
            .expect("TCP checksum");
            let seg = tcp.to_bytes();
            // SAFETY: zeroed sockaddrs are valid; each is filled for its
            // family and passed with its own size. A raw socket's port
            // must be 0 (IPv6) or is ignored (IPv4).
            let rc = unsafe {
                match dst {
                    IpAddr::V4(d) => {
                        let mut sa: libc::sockaddr_in = std::mem::zeroed();
                        sa.sin_family = libc::AF_INET as _;
                        sa.sin_addr.s_addr = u32::from_ne_bytes(d.octets());
                        libc::sendto(
                            fd.as_raw_fd(),
                            seg.as_ptr().cast(),
                            seg.len(),
                            0,
                            (&sa as *const libc::sockaddr_in).cast(),
                            std::mem::size_of::<libc::sockaddr_in>() as _,
                        )
                    }
                    IpAddr::V6(d) => {
                        let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                        sa.sin6_family = libc::AF_INET6 as _;
                        sa.sin6_addr.s6_addr = d.octets();
                        libc::sendto(
                            fd.as_raw_fd(),
                            seg.as_ptr().cast(),
                            seg.len(),
                            0,
                            (&sa as *const libc::sockaddr_in6).cast(),
                            std::mem::size_of::<libc::sockaddr_in6>() as _,
                        )
                    }
                }
            };
            assert_eq!(
                rc,
                seg.len() as isize,
                "sendto {dst}: {}",
                std::io::Error::last_os_error()
            );
        }
    });
}

/// GET /metrics from inside `ns`.
fn metrics(ns: &Netns) -> String {
    let addr: SocketAddr = METRICS.parse().expect("METRICS");
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
            .expect("request");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("response");
        assert!(text.starts_with("HTTP/1.1 200"), "GET /metrics: {text}");
        text
    })
}

/// The value of the sample `name{labels}` in a metrics text.
fn sample(text: &str, series: &str) -> u64 {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in the metrics:\n{text}"))
}

/// The counters of VIP `name` in `rivoractl -o json stats`.
fn vip_json<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["vips"]
        .as_array()
        .expect("vips is an array")
        .iter()
        .find(|v| v["vip"] == name)
        .unwrap_or_else(|| panic!("no VIP {name} in {stats}"))
}

/// burst + 1 SYNs to each VIP: burst forwarded, one counted rate_limited
/// drop per VIP, in every view the operator has.
#[test]
fn syn_rate_limit_burst_plus_one_in_stats_and_metrics() {
    let topo = Topology::new(Mode::Nat);
    let home = Home::new();
    let yaml = config(&topo, &home);
    let mut rd = Rivorad::start(&topo.node, home, &yaml, &[]);
    let vips = [
        (
            IpAddr::V4(topo.vip4),
            IpAddr::V4(topo.client_v4),
            format!("tcp/{}:{VIP_PORT}", topo.vip4),
        ),
        (
            IpAddr::V6(topo.vip6),
            IpAddr::V6(topo.client_v6),
            format!("tcp/[{}]:{VIP_PORT}", topo.vip6),
        ),
    ];
    for (vip, client, _) in &vips {
        let sports: Vec<u16> = (0..=BURST as u16).map(|i| 33000 + i).collect();
        raw_syns(&topo.client, *client, *vip, VIP_PORT, sports);
    }

    // Until every SYN has been seen (forwarded or limited), then exact.
    let seen = |s: &Value, name: &str| {
        let v = vip_json(s, name);
        v["packets"].as_u64().unwrap_or(0) + v["rate_limited"].as_u64().unwrap_or(0)
    };
    let stats = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let s = rd.ctl_json(&["stats"]);
        vips.iter()
            .all(|(_, _, n)| seen(&s, n) > u64::from(BURST))
            .then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "the SYNs did not all reach the datapath: {}",
            rd.ctl_ok(&["-o", "json", "stats"])
        )
    });
    for (_, _, name) in &vips {
        let v = vip_json(&stats, name);
        assert_eq!(
            (
                v["packets"].as_u64(),
                v["rate_limited"].as_u64(),
                v["no_backend"].as_u64()
            ),
            (Some(u64::from(BURST)), Some(1), Some(0)),
            "{name}: rivoractl -o json stats: {v}"
        );
        assert_eq!(
            stats["drops"]["rate_limited_by_vip"][name].as_u64(),
            Some(1),
            "{name}: drops.rate_limited_by_vip: {stats}"
        );
    }
    assert_eq!(
        stats["drops"]["by_reason"]["rate_limited"].as_u64(),
        Some(2),
        "drops.by_reason: {stats}"
    );

    // The table: VIP, PACKETS, BYTES, RATE_LIMITED, NO_BACKEND; then the
    // drop reasons that moved.
    let table = rd.ctl_ok(&["stats"]);
    for (_, _, name) in &vips {
        let row: Vec<&str> = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no row for {name} in\n{table}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            (row[1], row[3], row[4]),
            (BURST.to_string().as_str(), "1", "0"),
            "{name}: rivoractl stats row {row:?}"
        );
    }
    let reason: Vec<&str> = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some("rate_limited"))
        .unwrap_or_else(|| panic!("no rate_limited drop row in\n{table}"))
        .split_whitespace()
        .collect();
    assert_eq!(reason, ["rate_limited", "2"], "drop reasons in\n{table}");

    let text = metrics(&topo.node);
    for (_, _, name) in &vips {
        assert_eq!(
            sample(
                &text,
                &format!("rivora_vip_rate_limited_syns_total{{vip=\"{name}\"}}")
            ),
            1,
            "{name}"
        );
        assert_eq!(
            sample(
                &text,
                &format!("rivora_vip_packets_total{{vip=\"{name}\"}}")
            ),
            u64::from(BURST),
            "{name}"
        );
    }
    assert_eq!(
        sample(&text, "rivora_drops_total{reason=\"rate_limited\"}"),
        2
    );

    rd.stop();
    rd.home.assert_no_leftovers(&topo.node);
}
