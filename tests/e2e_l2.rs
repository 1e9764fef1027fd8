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
//!   reported (`three_nodes_one_owner_failover_and_no_dual_owner`);
//! - the multi-node lab as a cluster (three nodes, two pods each, the
//!   shared real API server), two Services in one L2 pool, TCP health
//!   checks: when the pool's holder alone cannot reach one Service's pods
//!   (an nftables rule in its namespace drops its probes), that Service's
//!   VIPs are answered, within a second or two, by one node that serves
//!   them (its own Lease per address), the other Service's stay with the
//!   holder, and UDP from the client flows through the covered VIPs;
//!   once the holder can reach them again and has served them for the
//!   reclaim hold, it answers for them again and the per-address owners
//!   let go
//!   (`the_holders_unserved_vips_are_answered_by_a_node_that_serves_them`).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use common::k8s::{Kube, TestNs};
use common::multinode::{Cluster, EpState, MultiNode};
use common::netns::Netns;
use common::require;
use common::rivorad::{Home, Rivorad};
use common::traffic::{udp_once, wait_for, Proto, Servers};
use common::unique;
use kube::api::{Api, DeleteParams, PostParams};
use rivora::dataplane::attach::ifindex;
use rivora::decap::Decap;
use rivora_k8s::AddressPool;
use rivora_l2::plan::lease_name;
use serde_json::{json, Value};

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
    let run = Command::new(common::rivorad::bins::rivora_bench())
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

/// Every reply `arping` got for `vip` from `ns` on `dev` in two requests:
/// the MACs, in order (empty: nobody answered). Two nodes answering one
/// request show as two MACs.
fn arping_all(ns: &Netns, dev: &str, vip: Ipv4Addr) -> Vec<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.path()))
        .args(["arping", "-c", "2", "-w", "3", "-I", dev])
        .arg(vip.to_string())
        .output()
        .expect("running arping");
    String::from_utf8_lossy(&out.stdout)
        .to_lowercase()
        .lines()
        .filter_map(|l| {
            let start = l.find('[')?;
            let end = l[start..].find(']')?;
            Some(l[start + 1..start + end].to_string())
        })
        .collect()
}

/// A cluster-scoped AddressPool, deleted on drop.
struct PoolGuard {
    kube: Kube,
    name: String,
}

impl PoolGuard {
    fn create(kube: &Kube, name: &str, spec: Value) -> Self {
        let api: Api<AddressPool> = Api::all(kube.client.clone());
        let pool: AddressPool = serde_json::from_value(json!({
            "apiVersion": "rivora.io/v1alpha1",
            "kind": "AddressPool",
            "metadata": { "name": name },
            "spec": spec,
        }))
        .expect("an AddressPool");
        kube.block_on(api.create(&PostParams::default(), &pool))
            .unwrap_or_else(|e| panic!("creating AddressPool {name}: {e}"));
        Self {
            kube: kube.clone(),
            name: name.to_string(),
        }
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        let api: Api<AddressPool> = Api::all(self.kube.client.clone());
        if let Err(e) = self
            .kube
            .block_on(api.delete(&self.name, &DeleteParams::default()))
        {
            eprintln!("deleting AddressPool {}: {e}", self.name);
        }
    }
}

/// An nftables table in a node's namespace, deleted on drop.
struct NftGuard<'a> {
    ns: &'a Netns,
    table: &'static str,
    on: bool,
}

impl<'a> NftGuard<'a> {
    /// Drop what this node itself sends to TCP `port` of `addrs`: its
    /// health probes (the datapath's forwarding never passes `output`).
    fn drop_probes(ns: &'a Netns, addrs: &[IpAddr], port: u16) -> Self {
        let table = "rvl2probes";
        let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = addrs.iter().partition(|a| a.is_ipv4());
        let set = |a: &[IpAddr]| {
            a.iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        ns.exec(&format!(
            "nft add table inet {table} && \
             nft add chain inet {table} out '{{ type filter hook output priority 0; }}' && \
             nft add rule inet {table} out ip daddr '{{ {} }}' tcp dport {port} drop && \
             nft add rule inet {table} out ip6 daddr '{{ {} }}' tcp dport {port} drop",
            set(&v4),
            set(&v6)
        ));
        Self {
            ns,
            table,
            on: true,
        }
    }

    fn lift(&mut self) {
        if std::mem::take(&mut self.on) {
            self.ns
                .exec(&format!("nft delete table inet {}", self.table));
        }
    }
}

impl Drop for NftGuard<'_> {
    fn drop(&mut self) {
        if self.on {
            let _ = Command::new("nsenter")
                .arg(format!("--net={}", self.ns.path()))
                .args(["nft", "delete", "table", "inet", self.table])
                .output();
        }
    }
}

/// Node `i`'s L2 groups as its `rivoractl status` shows them, by name:
/// (owner, the VIPs it answers for or would).
fn l2_groups(c: &Cluster, i: usize) -> BTreeMap<String, (bool, Vec<IpAddr>)> {
    let st = c.rivorad(i).status();
    st["l2"]["groups"]
        .as_array()
        .map(|gs| {
            gs.iter()
                .filter_map(|g| {
                    let vips = g["vips"]
                        .as_array()?
                        .iter()
                        .filter_map(|v| v.as_str()?.parse().ok())
                        .collect();
                    Some((
                        g["name"].as_str()?.to_string(),
                        (g["owner"].as_bool()?, vips),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The nodes that say they own group `name`.
fn owners_of(c: &Cluster, name: &str) -> Vec<usize> {
    (1..=c.nodes.len())
        .filter(|i| l2_groups(c, *i).get(name).is_some_and(|g| g.0))
        .collect()
}

/// Everyone's L2 groups, for a failure message.
fn l2_report(c: &Cluster) -> String {
    (1..=c.nodes.len())
        .map(|i| format!("node-{i}: {:?}", l2_groups(c, i)))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_holders_unserved_vips_are_answered_by_a_node_that_serves_them() {
    require::root_and_tools("e2e_l2");
    require::tools("e2e_l2", &["arping", "ndisc6", "nft"]);
    let kube = Kube::admin();
    // The Leases' namespace, known before the nodes' config is written.
    let leases: TestNs = kube.namespace("e2el2-leases-");
    let lease_ns = leases.name.clone();
    let lab = MultiNode::builder().nodes(3).pods_per_node(2).build();
    let pool = unique("e2el2-pool-");
    let [net4, net6] = lab.vip_nets();
    let _pool = PoolGuard::create(
        &kube,
        &pool,
        json!({ "addresses": [net4.to_string(), net6.to_string()], "l2Announcement": {} }),
    );
    // The client asks for the VIPs on its link, as a client of an L2
    // segment does, instead of routing them via a node.
    let n = lab.n;
    lab.client.exec(&format!(
        "ip route replace 10.{n}.100.0/24 dev c0 && ip -6 route replace fd00:{n:x}:100::/64 dev c0"
    ));
    let c = Cluster::builder(lab)
        .node_yaml(move |_| format!("node:\n  l2:\n    lease: {{ namespace: {lease_ns} }}\n"))
        .start();
    let macs: Vec<String> = (1..=c.nodes.len())
        .map(|i| mac_str(c.node(i).ns.mac_of("eth0")))
        .collect();
    let node_of = |mac: &str| macs.iter().position(|m| m == mac).map(|i| i + 1);

    // Service `a` on the pods p1 of every node, `b` on the pods p2.
    let [a4, a6] = c.create_service("a", 1, json!({}));
    let [b4, b6] = c.create_service("b", 2, json!({}));
    for node in 1..=c.nodes.len() {
        c.set_endpoint("a", &format!("n{node}-p2"), EpState::Gone);
        c.set_endpoint("b", &format!("n{node}-p1"), EpState::Gone);
    }
    c.apply_policy(
        "probed",
        json!({ "services": ["a", "b"],
                "healthCheck": { "type": "tcp", "interval": "500ms", "timeout": "400ms",
                                 "rise": 2, "fall": 2 } }),
    );
    c.wait_programmed("a");
    c.wait_programmed("b");
    let (IpAddr::V4(a4), IpAddr::V6(a6)) = (a4, a6) else {
        panic!("the lab's VIPs: {a4} {a6}");
    };
    let IpAddr::V4(b4) = b4 else {
        panic!("the lab's VIP {b4}");
    };
    let all: Vec<IpAddr> = vec![a4.into(), a6.into(), b4.into(), b6];
    let group = lease_name(&pool, None);

    // One holder of the pool's Lease answers for all four.
    let settle = Duration::from_secs(30);
    let holder = wait_for(settle, Duration::from_millis(200), || {
        let owners = owners_of(&c, &group);
        let [h] = owners[..] else { return None };
        let mut vips = l2_groups(&c, h).get(&group)?.1.clone();
        vips.sort();
        let mut want = all.clone();
        want.sort();
        (vips == want).then_some(h)
    })
    .unwrap_or_else(|| {
        panic!(
            "no single owner of {group} answering for {all:?}:\n{}",
            l2_report(&c)
        )
    });
    for vip in [a4, b4] {
        assert_eq!(
            arping_all(&c.client, "c0", vip),
            [macs[holder - 1].clone(), macs[holder - 1].clone()],
            "arping {vip}: the holder node-{holder} answers alone"
        );
    }
    assert_eq!(
        ndisc6(&c.client, "c0", a6).as_deref(),
        Some(macs[holder - 1].as_str()),
        "ndisc6 {a6}"
    );

    // The holder alone can no longer reach `a`'s pods: its probes fail,
    // the other nodes' do not.
    let a_pods: Vec<IpAddr> = c
        .pods()
        .filter(|p| p.name.ends_with("-p1"))
        .flat_map(|p| [p.addr(false), p.addr(true)])
        .collect();
    let mut blocked =
        NftGuard::drop_probes(&c.node(holder).ns, &a_pods, common::multinode::POD_PORT);
    let t0 = std::time::Instant::now();
    let unserved = wait_for(settle, Duration::from_millis(100), || {
        let g = l2_groups(&c, holder);
        let vips = &g.get(&group)?.1;
        (!vips.contains(&a4.into()) && !vips.contains(&a6.into())).then_some(())
    });
    assert!(
        unserved.is_some(),
        "node-{holder} still serves {a4} and {a6} with its probes to them dropped:\n{}",
        l2_report(&c)
    );
    eprintln!(
        "node-{holder} stopped serving `a` {:?} after the block",
        t0.elapsed()
    );

    // `a` is answered by one node that serves it, within a few Lease
    // durations; `b` stays with the holder.
    let t1 = std::time::Instant::now();
    let coverer = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let m = arping_all(&c.client, "c0", a4);
        let first = m.first()?;
        (m.iter().all(|x| x == first) && node_of(first) != Some(holder)).then(|| first.clone())
    })
    .unwrap_or_else(|| {
        panic!(
            "{a4}, which node-{holder} no longer serves and the others do, is not answered by one of them: {:?}\n{}",
            arping_all(&c.client, "c0", a4),
            l2_report(&c)
        )
    });
    eprintln!(
        "{a4} answered by {coverer} {:?} after node-{holder} stopped serving it",
        t1.elapsed()
    );
    let cover = node_of(&coverer).expect("a node's MAC");
    let a4_lease = lease_name(&pool, Some(a4.into()));
    let a6_lease = lease_name(&pool, Some(a6.into()));
    let covered6 = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let m = ndisc6(&c.client, "c0", a6)?;
        (node_of(&m) != Some(holder)).then_some(m)
    });
    assert!(
        covered6.is_some(),
        "{a6} is not answered by a node that serves it:\n{}",
        l2_report(&c)
    );
    assert_eq!(owners_of(&c, &a4_lease), [cover], "{}", l2_report(&c));
    assert_eq!(owners_of(&c, &a6_lease).len(), 1, "{}", l2_report(&c));
    assert_eq!(
        arping_all(&c.client, "c0", b4),
        [macs[holder - 1].clone(), macs[holder - 1].clone()],
        "{b4} stays with the holder node-{holder}"
    );
    assert_eq!(owners_of(&c, &group), [holder], "{}", l2_report(&c));
    // Traffic to `a` through the node that answers for it, resolved by
    // the client's own kernel.
    for vip in [IpAddr::from(a4), a6.into()] {
        let run = c.exchanges(vip, Proto::Udp, 20);
        assert!(run.failed().is_empty(), "{run}");
        assert!(
            run.answered().iter().all(|a| a.pod.ends_with("-p1")),
            "{run}"
        );
    }

    // The holder reaches `a` again: once it has served it for the reclaim
    // hold, it answers for it again and the per-address Leases let go.
    blocked.lift();
    drop(blocked);
    let t2 = std::time::Instant::now();
    let back = wait_for(Duration::from_secs(40), Duration::from_millis(200), || {
        let m = arping_all(&c.client, "c0", a4);
        (m.len() == 2
            && m.iter().all(|x| node_of(x) == Some(holder))
            && owners_of(&c, &a4_lease).is_empty()
            && owners_of(&c, &a6_lease).is_empty())
        .then_some(())
    });
    assert!(
        back.is_some(),
        "node-{holder} did not answer for {a4} again once it served it: {:?}\n{}",
        arping_all(&c.client, "c0", a4),
        l2_report(&c)
    );
    eprintln!(
        "node-{holder} answers for `a` again {:?} after the block was lifted",
        t2.elapsed()
    );
    assert_eq!(
        ndisc6(&c.client, "c0", a6).as_deref(),
        Some(macs[holder - 1].as_str()),
        "ndisc6 {a6} after the handback"
    );
    drop(c);
    drop(leases);
}
