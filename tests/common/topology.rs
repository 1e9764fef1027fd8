//! The lab's network namespaces, said once: one client, one load-balancer
//! node and N backends, every guard dropped in order so that a failing
//! test still removes everything. Built with [`Topology::builder`].
//!
//! Topology: one L2 segment, a bridge in a namespace of its own (the
//! "switch"), carrying two subnets.
//!
//! ```text
//!   client c0 10.N.1.2/24 fd00:N:1::2/64
//!      |                                  routes: VIPs (10.N.100/24,
//!      |                                  fd00:N:100::/64) and the backend
//!      |                                  subnet via the node
//!   [br0 in the switch namespace] --- b0 of b1, b2, ...: 10.N.2.11+, fd00:N:2::11+
//!      |
//!   node n0 10.N.1.1/24 10.N.2.1/24 fd00:N:1::1/64 fd00:N:2::1/64
//! ```
//!
//! Why one segment rather than routed links: it is the shape L2 DSR needs
//! (the node hands the frame to the backend's MAC), and with two subnets on
//! it the same lab also carries NAT (replies routed back through the node,
//! whose egress restores the VIP) and L3 DSR (routed IPIP to the backend's
//! own address). The node has one interface, so everything it forwards goes
//! out where it came in: ICMP redirects are off on the node and ignored by
//! everyone else, or a redirect would teach a NAT backend to answer the
//! client directly, past tc_nat.
//!
//! Per mode:
//! - NAT: the VIP lives on no backend; backends route the client subnet via
//!   the node, so every reply crosses the node's egress. Backends listen on
//!   a different port than the VIP's, so the port is translated too.
//! - DSR and L3 DSR: backends hold the VIP on `lo` (`arp_ignore=1`,
//!   `arp_announce=2`; IPv6 `nodad`) and reach the client subnet on-link:
//!   replies go straight to the client and never touch the node. L3 DSR
//!   backends also run the decap program (no ipip / ip6_tunnel modules
//!   here).
//! - Full NAT: backends have no route to the client subnet at all, only
//!   their own subnet (on which the node's `node_v4` and `node_v6` live):
//!   a reply reaches the client only if the node rewrote the request's
//!   source to one of its own addresses and turns the reply back. As
//!   under NAT, backends listen on [`NAT_BACKEND_PORT`] and the request
//!   arrives addressed to the backend's own address. Backends' TX
//!   checksum offload is off, as the client's: their replies leave the
//!   node by XDP_TX, which a partial checksum does not survive.
//! - NAT with DSR and L3 DSR VIPs beside it
//!   ([`TopologyBuilder::dsr_vips_beside_nat`]): backends serve all three
//!   at once, so their replies must leave two ways. A source-address rule
//!   does it: replies from the DSR VIP (`vip(2)`, `vip6_at(2)`) and the L3
//!   DSR VIP (`vip(3)`, `vip6_at(3)`), both on `lo`, use a table where the
//!   client subnet is on-link. Backends run the decap program for the L3
//!   DSR VIP; it passes everything else.
//!
//! What the lab configures, and why:
//! - node: `ip_forward=1`, IPv6 `forwarding=1` (`bpf_fib_lookup` needs
//!   forwarding, and the kernel forwards what XDP leaves to it: NAT
//!   requests to a backend whose neighbour entry it has not resolved yet,
//!   NAT replies); `send_redirects=0`.
//! - `xdp_pass` on `pn`, the switch-side peer of the node's `n0`, in every
//!   mode: the only veth that receives XDP_TX frames (DSR, L3 DSR, and NAT
//!   requests once the FIB answers), which veth delivers only to a peer
//!   running XDP. Backend-side peers receive ordinary bridge traffic and
//!   need nothing.
//! - client (and full-NAT backends): TX checksum offload off (`ethtool
//!   -K c0 tx off`): its partial checksums would arrive broken after the
//!   node's XDP_TX. A veth carries a locally sent packet with only the
//!   pseudo-header summed (the checksum is left to a NIC that never
//!   comes); a packet from another host arrives whole.
//! - everyone: no DAD, no redirects or RAs accepted (IPv6 has no knob to
//!   stop the node sending redirects).
//!
//! Interface names are the same in every lab (each lab has its own
//! namespaces, and veths are created directly inside them); namespace
//! names are unique per process and per lab.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU32, Ordering};

use rivora::dataplane::attach::ifindex;
use rivora::dataplane::AttachedLink;
use rivora::decap::{Decap, DecapProgs, DecapStats};

use super::netns::Netns;
use super::require;
use super::unique;

static LABS: AtomicU32 = AtomicU32::new(0);

/// Forwarding modes as the lab sets the backends up for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Nat,
    Dsr,
    L3Dsr,
    FullNat,
}

/// The VIP's port (TCP and UDP alike).
pub const VIP_PORT: u16 = 80;
/// Where NAT and full-NAT backends listen: the datapath translates the
/// port too.
pub const NAT_BACKEND_PORT: u16 = 8080;

pub struct Backend {
    /// "b1", "b2", ...: what its servers answer with.
    pub name: String,
    pub ns: Netns,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub mac: [u8; 6],
    /// Backend ids for a datapath the test fills itself (backend_map and
    /// backend_map6 share the health map, so the families use distinct
    /// ids).
    pub id4: u32,
    pub id6: u32,
}

impl Backend {
    /// The MAC as `ip link` and the config file write it.
    pub fn mac_str(&self) -> String {
        let m = self.mac;
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// What to build; see the module doc.
pub struct TopologyBuilder {
    mode: Mode,
    backends: usize,
    ipv6: bool,
    dsr_beside_nat: bool,
    full_nat_too: bool,
}

impl TopologyBuilder {
    /// Backends in the lab (3 unless said).
    pub fn backends(mut self, n: usize) -> Self {
        self.backends = n;
        self
    }

    /// No IPv6 addresses or routes.
    pub fn ipv4_only(mut self) -> Self {
        self.ipv6 = false;
        self
    }

    /// Under NAT, backends also hold the DSR VIP `vip(2)` and the L3 DSR
    /// VIP `vip(3)` (with IPv6, `vip6_at(2)` and `vip6_at(3)` too) on `lo`,
    /// decapsulate what is tunnelled to the L3 DSR VIP, and send the
    /// replies of both straight to the client.
    pub fn dsr_vips_beside_nat(mut self) -> Self {
        assert_eq!(self.mode, Mode::Nat, "DSR VIPs beside NAT need NAT");
        self.dsr_beside_nat = true;
        self
    }

    /// Backends that may also be reached by full NAT (Kubernetes sends a
    /// NAT VIP's hosts on no node there): TX checksum offload off on them,
    /// as under `Mode::FullNat` (see the module's notes).
    pub fn full_nat_too(mut self) -> Self {
        self.full_nat_too = true;
        self
    }

    pub fn build(self) -> Topology {
        Topology::build(self)
    }
}

/// The namespaces, addresses and routes of a lab, with what the backends
/// and the switch need in each mode (`xdp_pass` on `pn`, the decap program
/// on L3 DSR backends), but no datapath on the node: the test brings its
/// own (`common::lab::Lab`) or runs the real rivorad there.
pub struct Topology {
    // Dropped in declaration order: links first (detach), then the
    // programs and the namespaces (which take the veths with them).
    links: Vec<AttachedLink>,
    /// The decap object of each backend (L3 DSR only), same order.
    decaps: Vec<Decap>,
    _pass: Decap,
    pub backends: Vec<Backend>,
    pub client: Netns,
    pub node: Netns,
    pub switch: Netns,
    pub mode: Mode,
    /// The lab's second octet (and IPv6 group, in hex).
    pub n: u32,
    pub vip4: Ipv4Addr,
    pub vip6: Ipv6Addr,
    /// The node's addresses on the backend subnet: the tunnel sources.
    pub node_v4: Ipv4Addr,
    pub node_v6: Ipv6Addr,
    /// The client's addresses.
    pub client_v4: Ipv4Addr,
    pub client_v6: Ipv6Addr,
}

/// Sysctls for a namespace before its interfaces exist, so that `default`
/// reaches them: no DAD (addresses usable at once), no ICMP redirects
/// taken from anyone (a redirect would teach a NAT backend to answer the
/// client directly, past tc_nat), no router advertisements.
pub fn base_sysctls(ns: &Netns) {
    let mut s = Vec::new();
    for scope in ["all", "default"] {
        s.push((format!("net.ipv6.conf.{scope}.accept_dad"), "0"));
        s.push((format!("net.ipv6.conf.{scope}.accept_redirects"), "0"));
        s.push((format!("net.ipv4.conf.{scope}.accept_redirects"), "0"));
        s.push((format!("net.ipv6.conf.{scope}.accept_ra"), "0"));
    }
    let s: Vec<(&str, &str)> = s.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    ns.sysctls(&s);
}

impl Topology {
    /// A lab for `mode`: three backends, both families.
    pub fn builder(mode: Mode) -> TopologyBuilder {
        TopologyBuilder {
            mode,
            backends: 3,
            ipv6: true,
            dsr_beside_nat: false,
            full_nat_too: false,
        }
    }

    /// `Topology::builder(mode).build()`.
    pub fn new(mode: Mode) -> Self {
        Self::builder(mode).build()
    }

    fn build(b: TopologyBuilder) -> Self {
        require::root_and_tools("a namespace lab");
        let TopologyBuilder {
            mode,
            backends: nb,
            ipv6,
            dsr_beside_nat,
            full_nat_too,
        } = b;
        // The lab's second octet: only for reading addresses in a dump;
        // the namespaces already keep labs apart.
        let n = (std::process::id() + LABS.fetch_add(1, Ordering::Relaxed)) % 200 + 20;
        let n6 = format!("{n:x}");
        let a4 = |s: String| -> Ipv4Addr { s.parse().expect("addr") };
        let a6 = |s: String| -> Ipv6Addr { s.parse().expect("addr") };
        let node_c4 = a4(format!("10.{n}.1.1"));
        let node_v4 = a4(format!("10.{n}.2.1"));
        let client_v4 = a4(format!("10.{n}.1.2"));
        let node_c6 = a6(format!("fd00:{n6}:1::1"));
        let node_v6 = a6(format!("fd00:{n6}:2::1"));
        let client_v6 = a6(format!("fd00:{n6}:1::2"));
        let vip4 = a4(format!("10.{n}.100.1"));
        let vip6 = a6(format!("fd00:{n6}:100::1"));
        // Run only the IPv6 half of a command when the lab has IPv6.
        let v6 = |cmd: String| {
            if ipv6 {
                format!(" && {cmd}")
            } else {
                String::new()
            }
        };

        // Each guard is a local until the struct is built: a panic on the
        // way unwinds through their Drop.
        let switch = Netns::new(&unique("rvlab-sw-"));
        let node = Netns::new(&unique("rvlab-node-"));
        let client = Netns::new(&unique("rvlab-cl-"));
        let bns: Vec<Netns> = (1..=nb)
            .map(|i| Netns::new(&unique(&format!("rvlab-b{i}-"))))
            .collect();
        for ns in [&switch, &node, &client].into_iter().chain(bns.iter()) {
            base_sysctls(ns);
        }

        // The switch: a bridge, no STP, no multicast snooping (NDP's
        // multicast must reach everyone without an MLD querier).
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
        plug("pn", &node, "n0");
        plug("pc", &client, "c0");
        for (i, ns) in bns.iter().enumerate() {
            plug(&format!("pb{}", i + 1), ns, "b0");
        }

        // The node: a router on one interface, redirects off, reachable
        // on both subnets.
        node.sysctls(&[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
            ("net.ipv4.conf.n0.send_redirects", "0"),
        ]);
        node.exec(&format!(
            "ip addr add {node_c4}/24 dev n0 && ip addr add {node_v4}/24 dev n0{}",
            v6(format!(
                "ip addr add {node_c6}/64 dev n0 nodad && ip addr add {node_v6}/64 dev n0 nodad"
            ))
        ));

        // The client: VIPs and the backend subnet through the node. Its
        // TX checksum offload is off: a partial checksum does not survive
        // the node's XDP_TX.
        client.exec(&format!(
            "ip addr add {client_v4}/24 dev c0 && \
             ip route add 10.{n}.100.0/24 via {node_c4} && \
             ip route add 10.{n}.2.0/24 via {node_c4}{} && \
             ethtool -K c0 tx off >/dev/null",
            v6(format!(
                "ip addr add {client_v6}/64 dev c0 nodad && \
                 ip -6 route add fd00:{n6}:100::/64 via {node_c6} && \
                 ip -6 route add fd00:{n6}:2::/64 via {node_c6}"
            ))
        ));

        // Beside NAT: the DSR VIP and the L3 DSR VIP, per family.
        let beside4 = [a4(format!("10.{n}.100.2")), a4(format!("10.{n}.100.3"))];
        let beside6 = [
            a6(format!("fd00:{n6}:100::2")),
            a6(format!("fd00:{n6}:100::3")),
        ];
        let mut backends = Vec::new();
        for (i, ns) in bns.into_iter().enumerate() {
            let bv4 = a4(format!("10.{n}.2.{}", 11 + i));
            let bv6 = a6(format!("fd00:{n6}:2::{}", 11 + i));
            // TX checksum offload stays on here but under full NAT: other
            // backend replies are never XDP_TX'd, and under NAT they reach
            // tc_nat as CHECKSUM_PARTIAL, the state real backends send and
            // the one tc_nat's skb checksum helpers must get right. Full
            // NAT's replies leave the node by XDP_TX, whose incremental
            // update of a partial checksum arrives broken (seen here: every
            // SYN-ACK dropped by the client for a bad checksum).
            ns.exec(&format!(
                "ip addr add {bv4}/24 dev b0{}{}",
                v6(format!("ip addr add {bv6}/64 dev b0 nodad")),
                if mode == Mode::FullNat || full_nat_too {
                    " && ethtool -K b0 tx off >/dev/null"
                } else {
                    ""
                }
            ));
            let arp = "echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore && \
                       echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce";
            match mode {
                Mode::Nat => ns.exec(&format!(
                    "ip route add 10.{n}.1.0/24 via {node_v4}{}",
                    v6(format!("ip -6 route add fd00:{n6}:1::/64 via {node_v6}"))
                )),
                Mode::Dsr | Mode::L3Dsr => ns.exec(&format!(
                    "{arp} && ip addr add {vip4}/32 dev lo && \
                     ip route add 10.{n}.1.0/24 dev b0{}",
                    v6(format!(
                        "ip addr add {vip6}/128 dev lo nodad && \
                         ip -6 route add fd00:{n6}:1::/64 dev b0"
                    ))
                )),
                // Nothing beyond the connected routes of b0's own subnet.
                Mode::FullNat => String::new(),
            };
            if dsr_beside_nat {
                let mut cmd = format!("{arp} && ip route add 10.{n}.1.0/24 dev b0 table 100");
                for v in beside4 {
                    cmd += &format!(
                        " && ip addr add {v}/32 dev lo && ip rule add from {v} lookup 100"
                    );
                }
                if ipv6 {
                    cmd += &format!(" && ip -6 route add fd00:{n6}:1::/64 dev b0 table 100");
                    for v in beside6 {
                        cmd += &format!(
                            " && ip addr add {v}/128 dev lo nodad && \
                             ip -6 rule add from {v} lookup 100"
                        );
                    }
                }
                ns.exec(&cmd);
            }
            let mac = ns.mac_of("b0");
            backends.push(Backend {
                name: format!("b{}", i + 1),
                ns,
                v4: bv4,
                v6: bv6,
                mac,
                id4: 1 + i as u32,
                id6: 1 + (nb + i) as u32,
            });
        }

        let mut links = Vec::new();
        // XDP_TX out of n0 lands on its peer, which must run XDP itself.
        let pass = Decap::load().expect("loading the decap object");
        let pass_progs = pass.progs().expect("decap program fds");
        links.push(switch.run(move || {
            pass_progs
                .attach_pass(ifindex("pn").expect("pn in the switch"))
                .expect("xdp_pass on pn")
        }));

        let mut decaps = Vec::new();
        // The VIPs tunnelled to the backends, if any.
        let l3 = match (mode, dsr_beside_nat) {
            (Mode::L3Dsr, _) => Some((vip4, vip6)),
            (Mode::Nat, true) => Some((beside4[1], beside6[1])),
            _ => None,
        };
        if let Some((l3v4, l3v6)) = l3 {
            for b in &backends {
                let d = Decap::load().expect("loading the decap object");
                d.add_vip(IpAddr::V4(l3v4)).expect("decap VIP v4");
                if ipv6 {
                    d.add_vip(IpAddr::V6(l3v6)).expect("decap VIP v6");
                }
                let progs: DecapProgs = d.progs().expect("decap program fds");
                links.push(b.ns.run(move || {
                    progs
                        .attach_decap(ifindex("b0").expect("b0 in a backend"))
                        .expect("xdp_decap on b0")
                }));
                decaps.push(d);
            }
        }

        Topology {
            links,
            decaps,
            _pass: pass,
            backends,
            client,
            node,
            switch,
            mode,
            n,
            vip4,
            vip6,
            node_v4,
            node_v6,
            client_v4,
            client_v6,
        }
    }

    /// The IPv4 VIP `10.N.100.last` (`vip4` is `vip(1)`).
    pub fn vip(&self, last: u8) -> Ipv4Addr {
        format!("10.{}.100.{last}", self.n).parse().expect("addr")
    }

    /// The IPv6 VIP `fd00:N:100::last` (`vip6` is `vip6_at(1)`).
    pub fn vip6_at(&self, last: u16) -> Ipv6Addr {
        format!("fd00:{:x}:100::{last:x}", self.n)
            .parse()
            .expect("addr")
    }

    /// The port backends listen on in this mode.
    pub fn backend_port(&self) -> u16 {
        match self.mode {
            Mode::Nat | Mode::FullNat => NAT_BACKEND_PORT,
            Mode::Dsr | Mode::L3Dsr => VIP_PORT,
        }
    }

    /// The address a backend's server sees the request addressed to: its
    /// own address under NAT and full NAT, the VIP otherwise.
    pub fn backend_local(&self, b: &Backend, v6: bool) -> IpAddr {
        match (self.mode, v6) {
            (Mode::Nat | Mode::FullNat, false) => IpAddr::V4(b.v4),
            (Mode::Nat | Mode::FullNat, true) => IpAddr::V6(b.v6),
            (_, false) => IpAddr::V4(self.vip4),
            (_, true) => IpAddr::V6(self.vip6),
        }
    }

    /// Datagrams the node's kernel forwarded so far: (IPv4, IPv6), from
    /// its `/proc/net/snmp` and `/proc/net/snmp6` (which show the reading
    /// process's namespace).
    pub fn node_forwarded(&self) -> (u64, u64) {
        let snmp = self.node.exec("cat /proc/net/snmp");
        let mut ip = snmp.lines().filter(|l| l.starts_with("Ip: "));
        let (head, vals) = (
            ip.next().expect("Ip: header in /proc/net/snmp"),
            ip.next().expect("Ip: values in /proc/net/snmp"),
        );
        let v4 = head
            .split_whitespace()
            .zip(vals.split_whitespace())
            .find(|(k, _)| *k == "ForwDatagrams")
            .and_then(|(_, v)| v.parse().ok())
            .expect("Ip ForwDatagrams");
        let snmp6 = self.node.exec("cat /proc/net/snmp6");
        let v6 = snmp6
            .lines()
            .filter_map(|l| l.split_once(char::is_whitespace))
            .find(|(k, _)| *k == "Ip6OutForwDatagrams")
            .and_then(|(_, v)| v.trim().parse().ok())
            .expect("Ip6OutForwDatagrams");
        (v4, v6)
    }

    /// Decap counters of backend `i` (labs with an L3 DSR VIP only).
    pub fn decap_stats(&self, i: usize) -> Option<DecapStats> {
        self.decaps
            .get(i)
            .map(|d| d.stats().expect("reading decap_stats"))
    }
}
