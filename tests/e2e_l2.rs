//! The L2 speaker end to end:
//!
//! - the static path (`announce: l2`, one node, no Kubernetes): `arping`
//!   and `ndisc6` from a client on the segment resolve both VIPs to the
//!   node's MAC, a VIP without a serving backend is not answered, the
//!   client's own kernel resolves the VIPs and UDP goes through them (DSR
//!   to a backend holding the VIPs on `lo`), the node announces every
//!   VIP again each `gratuitousInterval`, and `rivoractl status` and the
//!   metrics say so (`static_announce_l2_answers_for_served_vips`);
//! - three nodes with `rivorad -kubernetes` against the real API server:
//!   `rivora-bench l2` run small (its checks are assertions: one owner,
//!   arping/ndisc6/the client's kernel resolve to it, traffic, SIGKILL
//!   failovers under a 10 ms ping with the client's neighbour entries
//!   moved by the gratuitous announcements alone, forced handovers by
//!   partition and freeze, a SIGTERMed owner releasing its Lease), then
//!   its figures: no interval in which two
//!   MACs answered for one VIP in the capture, and the failover gaps
//!   reported (`three_nodes_one_owner_failover_and_no_dual_owner`).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use common::netns::Netns;
use common::require;
use common::rivorad::{Home, Rivorad};
use common::traffic::{udp_once, wait_for, Servers};
use common::unique;
use rivora::dataplane::attach::ifindex;
use rivora::decap::Decap;

const PORT: u16 = 7000;
const L2_TOOLS: &[&str] = &["arping", "ndisc6", "tcpdump"];

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `arping` once from `ns` on `dev`: the MAC that answered, if any.
fn arping(ns: &Netns, dev: &str, vip: Ipv4Addr) -> Option<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.path()))
        .args(["arping", "-c", "1", "-w", "3", "-I", dev])
        .arg(vip.to_string())
        .output()
        .expect("running arping");
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let start = text.find('[')?;
    let end = text[start..].find(']')?;
    Some(text[start + 1..start + end].to_string())
}

/// `ndisc6` from `ns` on `dev`: the MAC that answered, if any.
fn ndisc6(ns: &Netns, dev: &str, vip: Ipv6Addr) -> Option<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.path()))
        .args(["ndisc6", "-q", "-1", "-r", "3"])
        .arg(vip.to_string())
        .arg(dev)
        .output()
        .expect("running ndisc6");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_lowercase();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// A metric's value as rivorad's listener in `ns` serves it.
fn metric(ns: &Netns, port: u16, series: &str) -> Option<f64> {
    let text = ns.run(move || -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    });
    text.ok()?
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn static_announce_l2_answers_for_served_vips() {
    require::root_and_tools("e2e_l2");
    require::tools("e2e_l2", L2_TOOLS);
    // One segment: a switch, the node, a client and a DSR backend, with
    // the VIPs on the client's own subnet (so it asks for them).
    let n = std::process::id() % 200 + 20;
    let a4 = |h: u8| Ipv4Addr::new(10, n as u8, 1, h);
    let a6 = |h: u16| Ipv6Addr::new(0xfd00, n as u16, 1, 0, 0, 0, 0, h);
    let (vip4, vip6, unserved4) = (a4(200), a6(0x200), a4(201));
    let switch = Netns::new(&unique("rvl2-sw-"));
    let node = Netns::new(&unique("rvl2-n-"));
    let client = Netns::new(&unique("rvl2-c-"));
    let backend = Netns::new(&unique("rvl2-b-"));
    for ns in [&switch, &node, &client, &backend] {
        ns.sysctls(&[
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_ra", "0"),
        ]);
    }
    switch.exec("ip link add br0 type bridge stp_state 0 && ip link set br0 up");
    for (port, ns, dev) in [
        ("pn", &node, "n0"),
        ("pc", &client, "c0"),
        ("pb", &backend, "b0"),
    ] {
        switch.exec(&format!(
            "ip link add {port} type veth peer name {dev} netns {} && \
             ip link set {port} master br0 && ip link set {port} up",
            ns.name
        ));
        ns.exec(&format!("ip link set {dev} up"));
    }
    node.exec(&format!(
        "ip addr add {}/24 dev n0 && ip addr add {}/64 dev n0 nodad",
        a4(1),
        a6(1)
    ));
    // The client's partial checksums would not survive the node's XDP_TX.
    client.exec(&format!(
        "ip addr add {}/24 dev c0 && ip addr add {}/64 dev c0 nodad && ethtool -K c0 tx off >/dev/null",
        a4(2),
        a6(2)
    ));
    backend.exec(&format!(
        "echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore && \
         echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce && \
         ip addr add {}/24 dev b0 && ip addr add {}/64 dev b0 nodad && \
         ip addr add {vip4}/32 dev lo && ip addr add {vip6}/128 dev lo nodad",
        a4(21),
        a6(0x21)
    ));
    // XDP_TX out of n0 reaches pn only if pn runs XDP itself.
    let pass = Decap::load().expect("loading the decap object");
    let progs = pass.progs().expect("decap program fds");
    let _pass_link = switch.run(move || {
        progs
            .attach_pass(ifindex("pn").expect("pn"))
            .expect("xdp_pass on pn")
    });
    let mut servers = Servers::new();
    servers.udp_echo(&backend, "b1", SocketAddr::new(vip4.into(), PORT));
    servers.udp_echo(&backend, "b1", SocketAddr::new(vip6.into(), PORT));
    let bmac = mac_str(backend.mac_of("b0"));
    let node_mac = mac_str(node.mac_of("n0"));

    let home = Home::new();
    // The node's own loopback: no other test shares it.
    let metrics_port = 9477;
    let yaml = format!(
        "interfaces:\n  - name: n0\n    xdpMode: native\n\
         node:\n  announce: l2\n  l2:\n    gratuitousInterval: 1s\n\
         api:\n  socket: {sock}\n\
         metrics:\n  listen: 127.0.0.1:{metrics_port}\n\
         vips:\n\
         \x20 - {{ address: {vip4}, port: {PORT}, protocol: udp, mode: dsr, healthCheck: false,\n\
         \x20     backends: [{{ address: {b4}, mac: \"{bmac}\" }}] }}\n\
         \x20 - {{ address: \"{vip6}\", port: {PORT}, protocol: udp, mode: dsr, healthCheck: false,\n\
         \x20     backends: [{{ address: \"{b6}\", mac: \"{bmac}\" }}] }}\n\
         \x20 - {{ address: {unserved4}, port: {PORT}, protocol: udp, mode: dsr, healthCheck: false,\n\
         \x20     backends: [{{ address: {b4}, mac: \"{bmac}\", weight: 0 }}] }}\n",
        sock = home.socket().display(),
        b4 = a4(21),
        b6 = a6(0x21),
    );
    let rd = Rivorad::start(&node, home, &yaml, &[]);

    assert_eq!(
        arping(&client, "c0", vip4).as_deref(),
        Some(node_mac.as_str()),
        "arping {vip4}"
    );
    assert_eq!(
        ndisc6(&client, "c0", vip6).as_deref(),
        Some(node_mac.as_str()),
        "ndisc6 {vip6}"
    );
    assert_eq!(
        arping(&client, "c0", unserved4),
        None,
        "{unserved4} has no backend that takes new flows: not answered"
    );
    // The client's own kernel resolves them, and traffic goes through.
    let step = Duration::from_secs(2);
    let from = |ns: &Netns, vip: IpAddr| {
        let vip = SocketAddr::new(vip, PORT);
        ns.run(move || {
            wait_for(Duration::from_secs(15), step, || {
                udp_once(vip, "hello", step).ok()
            })
        })
    };
    for vip in [IpAddr::from(vip4), vip6.into()] {
        let hit = from(&client, vip).unwrap_or_else(|| panic!("no UDP answer through {vip}"));
        assert_eq!(hit.backend, "b1");
        let neigh = client.exec(&format!("ip neigh show {vip} dev c0"));
        assert!(
            neigh.contains(&format!("lladdr {node_mac}")),
            "the client's entry for {vip}: {neigh:?}"
        );
    }

    // Status and metrics; the announcements repeat every second.
    let st = rd.status();
    let l2 = &st["l2"];
    assert_eq!(l2["mode"], "static", "{st}");
    let g = &l2["groups"][0];
    assert_eq!(
        (g["name"].as_str(), g["owner"].as_bool()),
        (Some("static"), Some(true)),
        "{st}"
    );
    let vips: Vec<&str> = g["vips"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(vips, [vip4.to_string(), vip6.to_string()], "{st}");
    let table = rd.ctl_ok(&["status"]);
    assert!(
        table.contains("L2 announcements") && table.contains("static  yes"),
        "{table}"
    );
    let series = |s: &str| metric(&node, metrics_port, s).unwrap_or_else(|| panic!("no {s}"));
    assert_eq!(series("rivora_l2_owner{lease=\"static\"}"), 1.0);
    assert!(series("rivora_l2_replies_total{family=\"ipv4\"}") >= 1.0);
    assert!(series("rivora_l2_replies_total{family=\"ipv6\"}") >= 1.0);
    let before = series("rivora_l2_gratuitous_total");
    // Three frames per round (two forms of gratuitous ARP, one
    // advertisement); at least two rounds in 3.5 s.
    std::thread::sleep(Duration::from_millis(3_500));
    let after = series("rivora_l2_gratuitous_total");
    assert!(
        after - before >= 6.0,
        "gratuitous frames {before} -> {after} in 3.5 s at a 1 s interval"
    );
    drop(rd);
    drop(servers);
}

#[test]
fn three_nodes_one_owner_failover_and_no_dual_owner() {
    require::root_and_tools("e2e_l2");
    require::tools("e2e_l2", L2_TOOLS);
    let out = tempfile::tempdir().expect("a temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_rivora-bench"))
        .arg("l2")
        .env("RIVORA_BENCH_OUT", out.path())
        .env("RIVORA_L2_FAILOVERS", "2")
        .env("RIVORA_L2_HANDOVERS", "4")
        .output()
        .expect("running rivora-bench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    // The measured gaps, for the log of the run.
    eprintln!("{text}");
    let logs = || {
        ["node-1", "node-2", "node-3"]
            .iter()
            .map(|n| {
                let log = std::fs::read_to_string(out.path().join(format!("l2-{n}.log")))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- {n}\n{}",
                    lines[lines.len().saturating_sub(30)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        run.status.success(),
        "rivora-bench l2 failed:\n{text}\n{}",
        logs()
    );
    let json = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let r: BTreeMap<String, f64> = serde_json::from_str(&json).expect("results as JSON");
    let get = |k: &str| {
        *r.get(k)
            .unwrap_or_else(|| panic!("no {k} in the results:\n{text}"))
    };
    assert_eq!(
        get("l2_dual_owner_intervals"),
        0.0,
        "two MACs answered for one VIP:\n{text}\n{}",
        logs()
    );
    let gap = get("l2_failover_ms");
    assert!(gap > 0.0, "a failover of {gap} ms:\n{text}");
    // The SIGTERMed owner released its Lease (the bench checks its log)
    // and another took it.
    assert!(get("l2_sigterm_handover_ms") > 0.0, "{text}");
    assert!(
        text.contains("failover 2:") && text.contains("7 handovers"),
        "{text}"
    );
}
