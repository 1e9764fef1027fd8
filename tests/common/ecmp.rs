//! Two Rivora nodes behind an FRR router, as BGP next hops of the same
//! VIPs (ECMP), for the DSR, path-move and graceful-restart tests.
//!
//! ```text
//!   client c0 10.N.9.2/24 fd00:N:9::2/64   (default via the router)
//!      |
//!   router rc 10.N.9.1   r0 10.N.1.1 fd00:N:1::1   FRR (zebra + bgpd), AS 65000,
//!      |                                          maximum-paths 2, L4 multipath hash
//!   [br0 in the switch namespace]
//!      |            |             |
//!   node A n0    node B n0     backends b0 10.N.1.11+ (the VIPs on lo;
//!   10.N.1.2     10.N.1.3      default via the router: DSR replies)
//! ```
//!
//! Each node runs its own rivorad (the test starts it: [`Ecmp::config`])
//! in DSR mode with the same VIPs and backends, and one BGP session to
//! the router (IPv4, carrying both families). The router learns each VIP
//! from both nodes and installs a multipath route; its L4 hash
//! (`fib_multipath_hash_policy=1`) spreads connections over both. The
//! switch-side veth of each node runs `xdp_pass` (XDP_TX out of a veth
//! needs XDP on its peer); the client sends complete checksums (its
//! partial ones would not survive the node's XDP_TX).

use std::net::{Ipv4Addr, Ipv6Addr};

use rivora::dataplane::attach::ifindex;
use rivora::dataplane::AttachedLink;
use rivora::decap::Decap;

use super::bgp::{Kind, Router};
use super::netns::{sh, Netns};
use super::topology::Backend;
use super::unique;

pub struct Ecmp {
    // Dropped in declaration order: the XDP links, the router's daemons,
    // then the namespaces.
    links: Vec<AttachedLink>,
    _pass: Decap,
    pub router: Router,
    pub backends: Vec<Backend>,
    pub nodes: Vec<Netns>,
    pub client: Netns,
    pub switch: Netns,
    pub n: u32,
    pub vip4: Ipv4Addr,
    pub vip6: Ipv6Addr,
    /// Each node's address (A, B).
    pub node_v4: Vec<Ipv4Addr>,
    pub node_v6: Vec<Ipv6Addr>,
}

fn quiet(ns: &Netns) {
    let mut s = Vec::new();
    for scope in ["all", "default"] {
        s.push(format!(
            "echo 0 > /proc/sys/net/ipv6/conf/{scope}/accept_dad"
        ));
        s.push(format!(
            "echo 0 > /proc/sys/net/ipv6/conf/{scope}/accept_ra"
        ));
        s.push(format!(
            "echo 0 > /proc/sys/net/ipv4/conf/{scope}/accept_redirects"
        ));
        s.push(format!(
            "echo 0 > /proc/sys/net/ipv6/conf/{scope}/accept_redirects"
        ));
    }
    ns.exec(&s.join(" && "));
}

impl Ecmp {
    /// The lab with `backends` backends; FRR is running, the nodes have
    /// no rivorad yet.
    pub fn new(backends: usize) -> Self {
        super::require::root_and_tools("the ECMP lab");
        let n = std::process::id() % 150 + 60;
        let n6 = format!("{n:x}");
        let a4 = |s: String| -> Ipv4Addr { s.parse().expect("addr") };
        let a6 = |s: String| -> Ipv6Addr { s.parse().expect("addr") };
        let (r4, r6) = (format!("10.{n}.1.1"), format!("fd00:{n6}:1::1"));
        let node_v4 = vec![a4(format!("10.{n}.1.2")), a4(format!("10.{n}.1.3"))];
        let node_v6 = vec![a6(format!("fd00:{n6}:1::2")), a6(format!("fd00:{n6}:1::3"))];
        let vip4 = a4(format!("10.{n}.100.1"));
        let vip6 = a6(format!("fd00:{n6}:100::1"));

        let mut router = Router::bare(Kind::Frr, &r4, &r6, "", "", "");
        let switch = Netns::new(&unique("rvecmp-sw-"));
        let client = Netns::new(&unique("rvecmp-cl-"));
        let nodes: Vec<Netns> = (0..2)
            .map(|i| Netns::new(&unique(&format!("rvecmp-n{i}-"))))
            .collect();
        let bns: Vec<Netns> = (1..=backends)
            .map(|i| Netns::new(&unique(&format!("rvecmp-b{i}-"))))
            .collect();
        for ns in [&switch, &client, &router.ns]
            .into_iter()
            .chain(nodes.iter())
            .chain(bns.iter())
        {
            quiet(ns);
        }
        switch
            .exec("ip link add br0 type bridge stp_state 0 mcast_snooping 0 && ip link set br0 up");
        let plug = |port: &str, ns: &Netns, dev: &str| {
            switch.exec(&format!(
                "ip link add {port} type veth peer name {dev} netns {peer} && \
                 ip link set {port} master br0 && ip link set {port} up",
                peer = ns.name
            ));
            ns.exec(&format!("ip link set {dev} up"));
        };
        plug("pr", &router.ns, "r0");
        for (i, ns) in nodes.iter().enumerate() {
            plug(&format!("pn{i}"), ns, "n0");
        }
        for (i, ns) in bns.iter().enumerate() {
            plug(&format!("pb{}", i + 1), ns, "b0");
        }
        // The router: the segment, the client link, forwarding, and an L4
        // multipath hash (the default hashes addresses only: one client
        // would always take one path).
        sh(&format!(
            "ip link add rc netns {} type veth peer name c0 netns {}",
            router.ns.name, client.name
        ));
        router.ns.exec(&format!(
            "ip addr add {r4}/24 dev r0 && ip addr add {r6}/64 dev r0 nodad && \
             ip link set rc up && ip addr add 10.{n}.9.1/24 dev rc && ip addr add fd00:{n6}:9::1/64 dev rc nodad && \
             echo 1 > /proc/sys/net/ipv4/ip_forward && echo 1 > /proc/sys/net/ipv6/conf/all/forwarding && \
             echo 1 > /proc/sys/net/ipv4/fib_multipath_hash_policy && \
             echo 1 > /proc/sys/net/ipv6/fib_multipath_hash_policy"
        ));
        client.exec(&format!(
            "ip link set c0 up && ip addr add 10.{n}.9.2/24 dev c0 && ip addr add fd00:{n6}:9::2/64 dev c0 nodad && \
             ip route add default via 10.{n}.9.1 && ip -6 route add default via fd00:{n6}:9::1 && \
             ethtool -K c0 tx off >/dev/null"
        ));
        for (i, ns) in nodes.iter().enumerate() {
            ns.exec(&format!(
                "ip addr add {}/24 dev n0 && ip addr add {}/64 dev n0 nodad",
                node_v4[i], node_v6[i]
            ));
        }
        let mut bes = Vec::new();
        for (i, ns) in bns.into_iter().enumerate() {
            let (bv4, bv6) = (
                a4(format!("10.{n}.1.{}", 11 + i)),
                a6(format!("fd00:{n6}:1::{}", 11 + i)),
            );
            ns.exec(&format!(
                "echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore && \
                 echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce && \
                 ip addr add {bv4}/24 dev b0 && ip addr add {bv6}/64 dev b0 nodad && \
                 ip addr add {vip4}/32 dev lo && ip addr add {vip6}/128 dev lo nodad && \
                 ip route add default via {r4} && ip -6 route add default via {r6}"
            ));
            let mac = ns.mac_of("b0");
            bes.push(Backend {
                name: format!("b{}", i + 1),
                ns,
                v4: bv4,
                v6: bv6,
                mac,
                id4: 1 + i as u32,
                id6: 1 + (backends + i) as u32,
            });
        }
        let pass = Decap::load().expect("loading the decap object");
        let mut links = Vec::new();
        for i in 0..nodes.len() {
            let progs = pass.progs().expect("decap program fds");
            let port = format!("pn{i}");
            links.push(switch.run(move || {
                progs
                    .attach_pass(ifindex(&port).expect("node port in the switch"))
                    .expect("xdp_pass on a node's port")
            }));
        }

        // FRR: both nodes as eBGP neighbours (AS 65001, IPv4 sessions
        // carrying IPv6 too), two paths per prefix, graceful restart.
        let mut conf = format!(
            "router bgp 65000\n bgp router-id {r4}\n no bgp ebgp-requires-policy\n bgp graceful-restart\n"
        );
        for a in &node_v4 {
            conf += &format!(" neighbor {a} remote-as 65001\n neighbor {a} timers connect 1\n");
        }
        for fam in ["ipv4", "ipv6"] {
            conf += &format!(" address-family {fam} unicast\n  maximum-paths 2\n");
            for a in &node_v4 {
                conf += &format!("  neighbor {a} activate\n");
            }
            conf += " exit-address-family\n";
        }
        let name = unique("rvf");
        router.start_frr(&name, &conf, false);

        Self {
            links,
            _pass: pass,
            router,
            backends: bes,
            nodes,
            client,
            switch,
            n,
            vip4,
            vip6,
            node_v4,
            node_v6,
        }
    }

    /// Node `i`'s rivorad configuration: TCP and UDP VIPs on port 80 over
    /// both families in DSR mode to every backend, no health checks (the
    /// backends are up throughout), the session to the router.
    pub fn config(&self, i: usize, socket: &std::path::Path) -> String {
        let be = |v6: bool| -> String {
            self.backends
                .iter()
                .map(|b| {
                    let a = if v6 {
                        format!("\"{}\"", b.v6)
                    } else {
                        b.v4.to_string()
                    };
                    format!("{{address: {a}, mac: \"{}\"}}", b.mac_str())
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut y = format!(
            "interfaces: [{{name: n0, xdpMode: native}}]\napi: {{socket: {}}}\nvips:\n",
            socket.display()
        );
        for (fam, addr) in [
            (false, self.vip4.to_string()),
            (true, format!("\"{}\"", self.vip6)),
        ] {
            for proto in ["tcp", "udp"] {
                y += &format!(
                    "  - {{name: {proto}{}, address: {addr}, port: 80, protocol: {proto}, mode: dsr, healthCheck: false, backends: [{}]}}\n",
                    if fam { "6" } else { "4" },
                    be(fam)
                );
            }
        }
        y += &format!(
            "bgp:\n  asn: 65001\n  routerId: {}\n  peers:\n    - {{name: router, address: {}, asn: 65000, families: [ipv4, ipv6], nextHopIpv6: \"{}\", holdTime: 9s, connectRetry: 1s}}\n",
            self.node_v4[i], self.router.v4, self.node_v6[i]
        );
        y
    }
}
