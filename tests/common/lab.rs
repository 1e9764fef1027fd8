//! A traffic lab in network namespaces: one client, one load-balancer node
//! and three backends, held in RAII guards so that a failing test still
//! removes everything. [`Lab::new`] also loads the real datapath, attaches
//! it to the node and fills its maps itself; [`Lab::topology`] builds only
//! the namespaces (with what the switch and backends need), for tests that
//! run the real rivorad on the node instead.
//!
//! Topology: one L2 segment, a bridge in a namespace of its own (the
//! "switch"), carrying two subnets.
//!
//! ```text
//!   client c0 10.N.1.2/24 fd00:N:1::2/64
//!      |                                  routes: VIPs and 10.N.2/24 via 10.N.1.1
//!   [br0 in the switch namespace] --- b0 of b1, b2, b3: 10.N.2.11-13, fd00:N:2::11-13
//!      |
//!   node n0 10.N.1.1/24 10.N.2.1/24 fd00:N:1::1/64 fd00:N:2::1/64
//!      xdp_ingress (native XDP) and tc_nat (TCX egress) on n0
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
//!
//! What the lab configures, and why:
//! - node: `ip_forward=1`, IPv6 `forwarding=1` (`bpf_fib_lookup` needs
//!   forwarding, and the kernel forwards what XDP leaves to it: NAT
//!   requests to a backend whose neighbour entry it has not resolved yet,
//!   NAT replies); `send_redirects=0`; under L3 DSR `accept_local=1` (see
//!   `Lab::new`).
//! - `xdp_pass` on `pn`, the switch-side peer of the node's `n0`, in every
//!   mode: the only veth that receives XDP_TX frames (DSR, L3 DSR, and NAT
//!   requests once the FIB answers), which veth delivers only to a peer
//!   running XDP. Backend-side peers receive ordinary bridge traffic and
//!   need nothing.
//! - client: TX checksum offload off (`ethtool -K c0 tx off`): its
//!   partial checksums would arrive broken after the node's XDP_TX.
//! - everyone: no DAD, no redirects or RAs accepted (IPv6 has no knob to
//!   stop the node sending redirects).
//!
//! Interface names are the same in every lab (each lab has its own
//! namespaces, and veths are created directly inside them); namespace and
//! pin names are unique per process and per lab.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

use rivora::abi::{rv_family, rv_mode};
use rivora::dataplane::attach::ifindex;
use rivora::dataplane::{AttachedLink, XdpMode};
use rivora::decap::{Decap, DecapProgs, DecapStats};

use super::netns::Netns;
use super::{flow_hash, unique, TestDp, PROTO_TCP, PROTO_UDP};

static LABS: AtomicU32 = AtomicU32::new(0);

/// Forwarding modes as the lab sets them up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Nat,
    Dsr,
    L3Dsr,
}

impl Mode {
    fn rv(self) -> rv_mode {
        match self {
            Mode::Nat => rv_mode::RV_MODE_NAT,
            Mode::Dsr => rv_mode::RV_MODE_DSR,
            Mode::L3Dsr => rv_mode::RV_MODE_L3DSR,
        }
    }
}

/// The VIP's port (TCP and UDP alike).
pub const VIP_PORT: u16 = 80;
/// Where NAT backends listen: the datapath translates the port too.
pub const NAT_BACKEND_PORT: u16 = 8080;
/// Backends per lab.
pub const BACKENDS: usize = 3;
/// Maglev slots per backend in each service's slice.
pub const SLOTS_PER_BACKEND: usize = 7;

/// Service ids: one per (family, protocol).
pub const SVC_V4_TCP: u32 = 1;
pub const SVC_V4_UDP: u32 = 2;
pub const SVC_V6_TCP: u32 = 3;
pub const SVC_V6_UDP: u32 = 4;

pub struct LabBackend {
    /// "b1", "b2", "b3": what its servers answer with.
    pub name: String,
    pub ns: Netns,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub mac: [u8; 6],
    /// Backend ids in backend_map and backend_map6 (they share the health
    /// map, so the families use distinct ids).
    pub id4: u32,
    pub id6: u32,
}

/// The namespaces, addresses and routes of a lab, with what the backends
/// and the switch need in each mode (`xdp_pass` on `pn`, the decap program
/// on L3 DSR backends), but no datapath on the node: for tests that bring
/// their own (the real rivorad), or as the base of [`Lab`].
pub struct Topology {
    // Dropped in declaration order: links first (detach), then the
    // programs and the namespaces.
    links: Vec<AttachedLink>,
    /// The decap object of each backend (L3 DSR only), same order.
    decaps: Vec<Decap>,
    _pass: Decap,
    pub backends: Vec<LabBackend>,
    pub client: Netns,
    pub node: Netns,
    pub switch: Netns,
    pub mode: Mode,
    pub vip4: Ipv4Addr,
    pub vip6: Ipv6Addr,
    /// The node's addresses on the backend subnet: the tunnel sources.
    pub node_v4: Ipv4Addr,
    pub node_v6: Ipv6Addr,
    /// The client's addresses.
    pub client_v4: Ipv4Addr,
    pub client_v6: Ipv6Addr,
}

/// A [`Topology`] with the real datapath loaded by the test itself and
/// attached to the node's `n0`, its maps filled for one TCP and one UDP
/// service per family. Dereferences to its topology.
pub struct Lab {
    // Dropped in declaration order: the node's links first (detach), then
    // the datapath pins, then the topology.
    links: Vec<AttachedLink>,
    pub dp: TestDp,
    /// Each service's Maglev slice as written: (service id, backend ids).
    pub slices: Vec<(u32, Vec<u32>)>,
    topo: Topology,
}

impl std::ops::Deref for Lab {
    type Target = Topology;

    fn deref(&self) -> &Topology {
        &self.topo
    }
}

/// Run `f` on a new thread inside namespace `ns` and return its handle:
/// for servers that outlive the call. The thread enters the namespace
/// before `f` runs, so every socket it opens lives there.
pub fn spawn_in<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = format!("/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        let file = File::open(&path).expect("opening netns");
        // SAFETY: setns on this thread only; the fd is valid.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
}

fn parse_mac(s: &str) -> [u8; 6] {
    let bytes: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).expect("hex MAC octet"))
        .collect();
    bytes.try_into().expect("six MAC octets")
}

/// The MAC of `dev` in `ns` (sysfs would show the test's own namespace).
fn mac_of(ns: &Netns, dev: &str) -> [u8; 6] {
    let out = ns.exec(&format!("ip -o link show dev {dev}"));
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no link/ether in `{out}`"));
    parse_mac(mac)
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().expect("duplicating a program fd")
}

/// Set sysctls inside `ns` by writing /proc/sys, which shows the writer's
/// network namespace (no dependence on procps' `sysctl`).
fn sysctls(ns: &Netns, settings: &[(&str, &str)]) {
    let cmd: Vec<String> = settings
        .iter()
        .map(|(k, v)| format!("echo {v} > /proc/sys/{}", k.replace('.', "/")))
        .collect();
    ns.exec(&cmd.join(" && "));
}

/// Sysctls for a namespace before its interfaces exist, so that `default`
/// reaches them: no DAD (addresses usable at once), no ICMP redirects
/// taken from anyone (a redirect would teach a NAT backend to answer the
/// client directly, past tc_nat), no router advertisements.
fn base_sysctls(ns: &Netns) {
    let mut s = Vec::new();
    for scope in ["all", "default"] {
        s.push((format!("net.ipv6.conf.{scope}.accept_dad"), "0"));
        s.push((format!("net.ipv6.conf.{scope}.accept_redirects"), "0"));
        s.push((format!("net.ipv4.conf.{scope}.accept_redirects"), "0"));
        s.push((format!("net.ipv6.conf.{scope}.accept_ra"), "0"));
    }
    let s: Vec<(&str, &str)> = s.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    sysctls(ns, &s);
}

/// A slice of `BACKENDS * SLOTS_PER_BACKEND` slots holding each of `ids`
/// equally often in a shuffled order (a fixed-seed Fisher-Yates), as a real
/// Maglev table would rather than a tidy round robin.
pub fn maglev_slice(ids: &[u32], seed: u64) -> Vec<u32> {
    let mut slots: Vec<u32> = ids
        .iter()
        .flat_map(|&id| std::iter::repeat_n(id, SLOTS_PER_BACKEND))
        .collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..slots.len()).rev() {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        slots.swap(i, j);
    }
    slots
}

impl Topology {
    /// Build the namespaces, links, addresses and routes for `mode`.
    pub fn new(mode: Mode) -> Self {
        // The lab's second octet: only for reading addresses in a dump;
        // the namespaces already keep labs apart.
        let n = (std::process::id() + LABS.fetch_add(1, Ordering::Relaxed)) % 200 + 20;
        let n6 = format!("{n:x}");
        let node_c4: Ipv4Addr = format!("10.{n}.1.1").parse().expect("addr");
        let node_v4: Ipv4Addr = format!("10.{n}.2.1").parse().expect("addr");
        let client_v4: Ipv4Addr = format!("10.{n}.1.2").parse().expect("addr");
        let node_c6: Ipv6Addr = format!("fd00:{n6}:1::1").parse().expect("addr");
        let node_v6: Ipv6Addr = format!("fd00:{n6}:2::1").parse().expect("addr");
        let client_v6: Ipv6Addr = format!("fd00:{n6}:1::2").parse().expect("addr");
        let vip4: Ipv4Addr = format!("10.{n}.100.1").parse().expect("addr");
        let vip6: Ipv6Addr = format!("fd00:{n6}:100::1").parse().expect("addr");

        // Each guard is a local until the struct is built: a panic on the
        // way unwinds through their Drop.
        let switch = Netns::new(&unique("rvlab-sw-"));
        let node = Netns::new(&unique("rvlab-node-"));
        let client = Netns::new(&unique("rvlab-cl-"));
        let bns: Vec<Netns> = (1..=BACKENDS)
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
        sysctls(
            &node,
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
                ("net.ipv4.conf.all.send_redirects", "0"),
                ("net.ipv4.conf.default.send_redirects", "0"),
                ("net.ipv4.conf.n0.send_redirects", "0"),
            ],
        );
        node.exec(&format!(
            "ip addr add {node_c4}/24 dev n0 && ip addr add {node_v4}/24 dev n0 && \
             ip addr add {node_c6}/64 dev n0 nodad && ip addr add {node_v6}/64 dev n0 nodad"
        ));

        // The client: VIPs and the backend subnet through the node. Its
        // TX checksum offload is off: a partial checksum does not survive
        // the node's XDP_TX.
        client.exec(&format!(
            "ip addr add {client_v4}/24 dev c0 && ip addr add {client_v6}/64 dev c0 nodad && \
             ip route add {vip4}/32 via {node_c4} && ip route add 10.{n}.2.0/24 via {node_c4} && \
             ip -6 route add {vip6}/128 via {node_c6} && \
             ip -6 route add fd00:{n6}:2::/64 via {node_c6} && \
             ethtool -K c0 tx off >/dev/null"
        ));

        let mut backends = Vec::new();
        for (i, ns) in bns.into_iter().enumerate() {
            let v4: Ipv4Addr = format!("10.{n}.2.{}", 11 + i).parse().expect("addr");
            let v6: Ipv6Addr = format!("fd00:{n6}:2::{}", 11 + i).parse().expect("addr");
            // TX checksum offload stays on here: backend replies are never
            // XDP_TX'd, and under NAT they reach tc_nat as CHECKSUM_PARTIAL,
            // the state real backends send and the one tc_nat's skb
            // checksum helpers must get right.
            ns.exec(&format!(
                "ip addr add {v4}/24 dev b0 && ip addr add {v6}/64 dev b0 nodad"
            ));
            match mode {
                Mode::Nat => ns.exec(&format!(
                    "ip route add 10.{n}.1.0/24 via {node_v4} && \
                     ip -6 route add fd00:{n6}:1::/64 via {node_v6}"
                )),
                Mode::Dsr | Mode::L3Dsr => ns.exec(&format!(
                    "echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore && \
                     echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce && \
                     ip addr add {vip4}/32 dev lo && ip addr add {vip6}/128 dev lo nodad && \
                     ip route add 10.{n}.1.0/24 dev b0 && \
                     ip -6 route add fd00:{n6}:1::/64 dev b0"
                )),
            };
            let mac = mac_of(&ns, "b0");
            backends.push(LabBackend {
                name: format!("b{}", i + 1),
                ns,
                v4,
                v6,
                mac,
                id4: 1 + i as u32,
                id6: 1 + (BACKENDS + i) as u32,
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
        if mode == Mode::L3Dsr {
            for b in &backends {
                let d = Decap::load().expect("loading the decap object");
                d.add_vip(IpAddr::V4(vip4)).expect("decap VIP v4");
                d.add_vip(IpAddr::V6(vip6)).expect("decap VIP v6");
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
            vip4,
            vip6,
            node_v4,
            node_v6,
            client_v4,
            client_v6,
        }
    }

    /// The port backends listen on in this mode.
    pub fn backend_port(&self) -> u16 {
        match self.mode {
            Mode::Nat => NAT_BACKEND_PORT,
            Mode::Dsr | Mode::L3Dsr => VIP_PORT,
        }
    }

    /// The address a backend's server sees the request addressed to: its
    /// own address under NAT, the VIP otherwise.
    pub fn backend_local(&self, b: &LabBackend, v6: bool) -> IpAddr {
        match (self.mode, v6) {
            (Mode::Nat, false) => IpAddr::V4(b.v4),
            (Mode::Nat, true) => IpAddr::V6(b.v6),
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

    /// Decap counters of backend `i` (L3 DSR labs only).
    pub fn decap_stats(&self, i: usize) -> Option<DecapStats> {
        self.decaps
            .get(i)
            .map(|d| d.stats().expect("reading decap_stats"))
    }
}

impl Lab {
    /// The lab's namespaces with no datapath on the node (see
    /// [`Topology`]).
    pub fn topology(mode: Mode) -> Topology {
        Topology::new(mode)
    }

    /// A topology with the test's own datapath attached to the node's n0
    /// and its maps filled.
    pub fn new(mode: Mode) -> Self {
        let topo = Topology::new(mode);
        let (node, backends) = (&topo.node, &topo.backends);
        let (vip4, vip6) = (topo.vip4, topo.vip6);

        // The datapath, loaded here and attached from a thread inside the
        // node (an ifindex is per namespace).
        let dp = TestDp::new();
        let xdp_fd = dup(dp.dp.xdp().progs.xdp_ingress.as_fd());
        let tc_fd = dup(dp.dp.tc().progs.tc_nat.as_fd());
        let (links, n0_index) = node.run(move || {
            let idx = ifindex("n0").expect("n0 in the node");
            let x =
                AttachedLink::attach_xdp(&xdp_fd, idx, XdpMode::Native).expect("xdp_ingress on n0");
            let t = AttachedLink::attach_tcx_egress(&tc_fd, idx).expect("tc_nat on n0");
            (vec![x, t], idx)
        });

        if mode == Mode::L3Dsr {
            // While the node has no neighbour entry for a backend,
            // bpf_fib_lookup answers NO_NEIGH and xdp_ingress hands the
            // tunnelled packet to the kernel, whose source is one of the
            // node's own addresses: without accept_local the kernel drops
            // it as a martian, and since XDP never triggers neighbour
            // resolution itself, the entry never appears and every packet
            // to that backend is lost. The lab leaves the neighbour table
            // cold on purpose, so the first packets take that kernel path
            // and the rest XDP_TX.
            sysctls(
                node,
                &[
                    ("net.ipv4.conf.all.accept_local", "1"),
                    ("net.ipv4.conf.n0.accept_local", "1"),
                ],
            );
        }

        // Maps: backends, then slices and services, then the VIPs.
        let bport = match mode {
            Mode::Nat => NAT_BACKEND_PORT,
            Mode::Dsr | Mode::L3Dsr => 0,
        };
        for b in backends {
            dp.backend4(b.id4, b.v4, bport, b.mac);
            dp.backend6(b.id6, b.v6, bport, b.mac);
        }
        let ids4: Vec<u32> = backends.iter().map(|b| b.id4).collect();
        let ids6: Vec<u32> = backends.iter().map(|b| b.id6).collect();
        let slice_len = (BACKENDS * SLOTS_PER_BACKEND) as u32;
        let mut slices = Vec::new();
        for (svc, family, ids) in [
            (SVC_V4_TCP, rv_family::RV_FAMILY_V4, &ids4),
            (SVC_V4_UDP, rv_family::RV_FAMILY_V4, &ids4),
            (SVC_V6_TCP, rv_family::RV_FAMILY_V6, &ids6),
            (SVC_V6_UDP, rv_family::RV_FAMILY_V6, &ids6),
        ] {
            let start = (svc - 1) * slice_len;
            let slice = maglev_slice(ids, u64::from(svc));
            dp.service(svc, mode.rv(), family, start, &slice);
            slices.push((svc, slice));
        }
        dp.iface_mac(n0_index, mac_of(node, "n0"));
        dp.tunnel(topo.node_v4, topo.node_v6);
        dp.vip4(vip4, VIP_PORT, PROTO_TCP, SVC_V4_TCP);
        dp.vip4(vip4, VIP_PORT, PROTO_UDP, SVC_V4_UDP);
        dp.vip6(vip6, VIP_PORT, PROTO_TCP, SVC_V6_TCP);
        dp.vip6(vip6, VIP_PORT, PROTO_UDP, SVC_V6_UDP);

        Lab {
            links,
            dp,
            slices,
            topo,
        }
    }

    /// The backend Maglev assigns to a new flow from `client` to service
    /// `svc` on the VIP port (every backend healthy, so the hashed slot
    /// itself): the datapath's flow hash, modulo the slice.
    pub fn maglev_backend(&self, svc: u32, client: SocketAddr, proto: u8) -> &LabBackend {
        let (_, slice) = self
            .slices
            .iter()
            .find(|(id, _)| *id == svc)
            .unwrap_or_else(|| panic!("no service {svc} in the lab"));
        let hash = flow_hash(client.ip(), client.port(), VIP_PORT, proto, false);
        let id = slice[hash as usize % slice.len()];
        self.backends
            .iter()
            .find(|b| b.id4 == id || b.id6 == id)
            .unwrap_or_else(|| panic!("slot holds unknown backend id {id}"))
    }
}
