//! A lab that behaves like a Kubernetes cluster of several nodes, said
//! once: [`MultiNode`] is the network (a segment, an external client,
//! nodes with a pod bridge and pods that answer), [`Cluster`] runs the real
//! `rivorad -kubernetes` on every node against the shared API server and
//! writes the objects a cluster's controllers would.
//!
//! ```text
//!   client c0 10.N.1.2          router r0 10.N.1.1 (optional, for BGP)
//!      |                            |
//!   [br0 in the switch namespace]---+-----------------------+------ ...
//!      | pn1                        | pn2                   | pn3
//!   node-1 eth0 10.N.1.11        node-2 eth0 10.N.1.12    node-3 eth0 10.N.1.13
//!   cni0 10.N.11.1/24            cni0 10.N.12.1/24        cni0 10.N.13.1/24
//!      |          |                 |          |             ...
//!   n1-p1       n1-p2            n2-p1       n2-p2
//!   10.N.11.11  10.N.11.12       10.N.12.11  10.N.12.12
//! ```
//!
//! IPv6 is the same picture: segment fd00:N:1::/64 (client ::2, node i
//! ::(10+i)), pod CIDR fd00:N:(10+i)::/64 (cni0 ::1, pods ::11, ::12, ...),
//! written with the IPv4 digits so the two read alike; N is in hex. VIPs
//! are 10.N.100.k and fd00:N:100::k ([`MultiNode::vip4`],
//! [`MultiNode::vip6`]). Nodes are numbered from 1, as their names: every
//! method that takes a node takes its number.
//!
//! What the lab is for: the path of a request that one node receives and a
//! pod on another node serves. The client routes the VIP subnets via one
//! "receiving" node ([`MultiNode::route_vips_via`]) and has no route to
//! any pod CIDR, as an external client of a real cluster: a pod that
//! answers with its own address (a reply that bypassed the receiving
//! node's translation) is dropped or reset by the client, and the runner
//! ([`MultiNode::exchanges`]) reports it as a failure, naming the pod whose
//! stray reply came back (a packet socket on the client's `c0` sees it).
//!
//! What the lab configures, and why:
//! - nodes: `ip_forward=1`, IPv6 `forwarding=1` (`bpf_fib_lookup` needs
//!   forwarding, and the nodes route between the segment and their pods);
//!   `send_redirects=0`, or a node that forwards a request back out of
//!   `eth0` to another node would teach the client a direct path. Routes
//!   to every other node's pod CIDR via its `eth0` address, as a CNI in
//!   host-gateway mode installs them.
//! - `xdp_pass` on `pnI`, the switch-side peer of each node's `eth0`: a
//!   frame sent by XDP_TX or redirected into a veth is delivered only if
//!   the peer runs XDP.
//! - TX checksum offload off on the client's `c0` and on every node's
//!   `eth0`: on veths a locally generated or forwarded packet keeps a
//!   partial checksum, which does not survive another node's XDP_TX. Off
//!   on `eth0`, the node completes it in software as it leaves (after its
//!   TCX egress, which still meets the partial checksums real pods send):
//!   frames on the segment carry complete checksums, as on a real wire.
//!   Pods keep their offload, as real pods do.
//! - everyone: no DAD, no redirects or RAs accepted
//!   ([`base_sysctls`](super::topology::base_sysctls)).
//!
//! Each pod runs [`Servers`]: a dual-stack TCP line server and a UDP echo
//! per family on port [`POD_PORT`], answering `pod|local|peer|payload`
//! (the pod's name, the address the request was addressed to, the client
//! address and port it saw). Every guard is dropped in order, also when a
//! test panics: rivorads (logs printed), proxies, Kubernetes objects, XDP
//! links, servers, then the namespaces, which take their veths along.
//! Namespace names are unique per process and lab; interface names are
//! the same in every lab.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::{Deref, Range};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType};
use rivora::abi::{
    be16, be32, be32x4, ipv4_from_be32, ipv6_from_be32x4, rv_affinity_value, rv_backend,
    rv_backend6, rv_backend_health, rv_flow6_key, rv_flow_key, rv_health, rv_maglev_slot,
    rv_service, rv_vip6_key, rv_vip_key, rv_vip_value, MAGLEV_PROBES,
};
use rivora::dataplane::attach::ifindex;
use rivora::dataplane::{AttachedLink, Maps};
use rivora::decap::Decap;
use rivora_model::model::XdpMode;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use super::k8s::{
    endpoint_slice, lb_service, shared, tcp, udp, write_kubeconfig_with, ApiProxy, Ep, Identity,
    Kube, SvcPort, TestNs,
};
use super::netns::{spawn_in, Netns};
use super::require;
use super::rivorad::{Home, Rivorad};
use super::topology::base_sysctls;
pub use super::topology::VIP_PORT;
use super::traffic::{self, wait_for, Hit, Proto, Servers};
use super::{flow_hash, unique, PROTO_TCP, PROTO_UDP};

/// Where every pod listens: the Service's targetPort.
pub const POD_PORT: u16 = 8080;
/// Client threads of one run of exchanges: a failing attempt costs a
/// whole [`STEP`], so a run of 300 that fails two thirds of them takes
/// about 13 s with 16 at a time.
pub const WORKERS: usize = 16;
/// Each step of an attempt (connect, answer): short, since a failing
/// attempt costs one step and a run may fail most of its attempts.
pub const STEP: Duration = Duration::from_secs(1);
/// A Kubernetes change reaching every node's maps: a watch event, the
/// translation, the write, on two cores shared with the API server.
pub const PROGRAMMED: Duration = Duration::from_secs(30);
/// Source ports the runner binds on the client, one per attempt: below
/// Linux's ephemeral range, so no socket of the kernel's choice holds one.
const CLIENT_PORTS: Range<u32> = 10_000..32_000;
/// How long after a run the client's capture goes on: a stray reply to
/// the last attempts may still be on its way.
const CAPTURE_TAIL: Duration = Duration::from_millis(200);

static LABS: AtomicU32 = AtomicU32::new(0);

/// An address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    pub fn contains(&self, a: IpAddr) -> bool {
        match (self.addr, a) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// A pod: a namespace with `eth0` on its node's `cni0`.
pub struct Pod {
    /// `n2-p1`: pod 1 of node 2, what its servers answer with.
    pub name: String,
    /// Its node's name (`node-2`) and number.
    pub node: String,
    pub node_number: usize,
    pub ns: Netns,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

impl Pod {
    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            self.v6.into()
        } else {
            self.v4.into()
        }
    }

    /// Where its servers listen in `v6`'s family: an endpoint's address
    /// and port.
    pub fn target(&self, v6: bool) -> SocketAddr {
        SocketAddr::new(self.addr(v6), POD_PORT)
    }
}

/// A node: a namespace with `eth0` on the segment and the pod bridge
/// `cni0`.
pub struct Node {
    /// 1, 2, ...
    pub number: usize,
    /// `node-1`, ...: what reports print.
    pub name: String,
    /// Its Kubernetes name (EndpointSlices' `nodeName`, rivorad's
    /// `-node-name`): unique per lab, because every rivorad of a test
    /// process watches every Kubernetes namespace, the other labs' too.
    pub k8s_name: String,
    // Before `ns`: dropped first.
    pub pods: Vec<Pod>,
    pub ns: Netns,
    pub eth0_v4: Ipv4Addr,
    pub eth0_v6: Ipv6Addr,
    pub cni0_v4: Ipv4Addr,
    pub cni0_v6: Ipv6Addr,
    pub pod_cidr4: Cidr,
    pub pod_cidr6: Cidr,
}

impl Node {
    pub fn eth0(&self, v6: bool) -> IpAddr {
        if v6 {
            self.eth0_v6.into()
        } else {
            self.eth0_v4.into()
        }
    }
}

/// The optional router on the segment (10.N.1.1, fd00:N:1::1): forwarding
/// on, nothing else yet; BGP tests bring its daemons.
pub struct Router {
    pub ns: Netns,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

/// What to build; see the module doc.
pub struct MultiNodeBuilder {
    nodes: usize,
    pods_per_node: usize,
    router: bool,
    receiving: usize,
}

impl MultiNodeBuilder {
    /// Nodes in the lab (3 unless said); at most 80, so that no pod CIDR
    /// reaches the VIPs' 10.N.100.0/24.
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// Pods on each node (2 unless said).
    pub fn pods_per_node(mut self, k: usize) -> Self {
        self.pods_per_node = k;
        self
    }

    /// A router namespace on the segment too.
    pub fn router(mut self) -> Self {
        self.router = true;
        self
    }

    /// The node the client routes the VIPs via (node 1 unless said).
    pub fn receiving_node(mut self, i: usize) -> Self {
        self.receiving = i;
        self
    }

    pub fn build(self) -> MultiNode {
        MultiNode::build(self)
    }
}

/// The lab's namespaces, addresses, routes and pod servers; no datapath
/// on the nodes (see [`Cluster`]).
pub struct MultiNode {
    // Dropped in declaration order: the XDP links (detached), the program,
    // the pods' servers (their sockets keep a namespace alive), then the
    // namespaces.
    links: Vec<AttachedLink>,
    _pass: Decap,
    _servers: Servers,
    pub nodes: Vec<Node>,
    pub router: Option<Router>,
    pub client: Netns,
    pub switch: Netns,
    /// The lab's second octet (and IPv6 group, in hex).
    pub n: u32,
    pub client_v4: Ipv4Addr,
    pub client_v6: Ipv6Addr,
    receiving: AtomicUsize,
    removed: Mutex<BTreeSet<usize>>,
    /// Attempts so far: the next client source port.
    attempts: AtomicU32,
}

impl MultiNode {
    /// Three nodes of two pods, VIPs via node 1, no router.
    pub fn builder() -> MultiNodeBuilder {
        MultiNodeBuilder {
            nodes: 3,
            pods_per_node: 2,
            router: false,
            receiving: 1,
        }
    }

    fn build(b: MultiNodeBuilder) -> Self {
        require::root_and_tools("a multi-node lab");
        let MultiNodeBuilder {
            nodes: nn,
            pods_per_node: np,
            router,
            receiving,
        } = b;
        assert!((1..=80).contains(&nn), "1 to 80 nodes, not {nn}");
        assert!((1..=200).contains(&np), "1 to 200 pods a node, not {np}");
        assert!(
            (1..=nn).contains(&receiving),
            "receiving node {receiving} of {nn}"
        );
        // 220..=254: apart from the single-node labs' 20..=219, so that a
        // test process running both never gives two labs the same VIPs
        // (every rivorad of the process programs every lab's Services).
        let n = 220 + (std::process::id() + LABS.fetch_add(1, Ordering::Relaxed)) % 35;
        let n6 = format!("{n:x}");
        let a4 = |s: String| -> Ipv4Addr { s.parse().expect("an IPv4 literal") };
        let a6 = |s: String| -> Ipv6Addr { s.parse().expect("an IPv6 literal") };
        let client_v4 = a4(format!("10.{n}.1.2"));
        let client_v6 = a6(format!("fd00:{n6}:1::2"));

        // Each guard is a local until the struct is built: a panic on the
        // way unwinds through their Drop.
        let switch = Netns::new(&unique("rvmn-sw-"));
        let client = Netns::new(&unique("rvmn-cl-"));
        base_sysctls(&switch);
        base_sysctls(&client);
        // No STP (ports forward at once), no multicast snooping (NDP's
        // multicast must reach everyone without an MLD querier).
        let bridge = "type bridge stp_state 0 mcast_snooping 0";
        switch.exec(&format!("ip link add br0 {bridge} && ip link set br0 up"));
        let plug = |port: &str, ns: &Netns, dev: &str| {
            switch.exec(&format!(
                "ip link add {port} type veth peer name {dev} netns {peer} && \
                 ip link set {port} master br0 && ip link set {port} up",
                peer = ns.name
            ));
            ns.exec(&format!("ip link set {dev} up"));
        };

        let router = router.then(|| {
            let ns = Netns::new(&unique("rvmn-rt-"));
            base_sysctls(&ns);
            plug("pr", &ns, "r0");
            let (v4, v6) = (a4(format!("10.{n}.1.1")), a6(format!("fd00:{n6}:1::1")));
            ns.sysctls(&[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
            ]);
            ns.exec(&format!(
                "ip addr add {v4}/24 dev r0 && ip addr add {v6}/64 dev r0 nodad && \
                 ethtool -K r0 tx off >/dev/null"
            ));
            Router { ns, v4, v6 }
        });

        plug("pc", &client, "c0");
        client.exec(&format!(
            "ip addr add {client_v4}/24 dev c0 && ip addr add {client_v6}/64 dev c0 nodad && \
             ethtool -K c0 tx off >/dev/null"
        ));

        let mut nodes = Vec::new();
        for i in 1..=nn {
            let ns = Netns::new(&unique(&format!("rvmn-n{i}-")));
            base_sysctls(&ns);
            ns.sysctls(&[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
                ("net.ipv4.conf.all.send_redirects", "0"),
                ("net.ipv4.conf.default.send_redirects", "0"),
            ]);
            plug(&format!("pn{i}"), &ns, "eth0");
            let octet = 10 + i;
            let (eth0_v4, eth0_v6) = (
                a4(format!("10.{n}.1.{octet}")),
                a6(format!("fd00:{n6}:1::{octet}")),
            );
            let (cni0_v4, cni0_v6) = (
                a4(format!("10.{n}.{octet}.1")),
                a6(format!("fd00:{n6}:{octet}::1")),
            );
            ns.exec(&format!(
                "ip addr add {eth0_v4}/24 dev eth0 && \
                 ip addr add {eth0_v6}/64 dev eth0 nodad && ethtool -K eth0 tx off >/dev/null && \
                 ip link add cni0 {bridge} && ip link set cni0 up && \
                 ip addr add {cni0_v4}/24 dev cni0 && ip addr add {cni0_v6}/64 dev cni0 nodad"
            ));
            let mut pods = Vec::new();
            for j in 1..=np {
                let pns = Netns::new(&unique(&format!("rvmn-n{i}p{j}-")));
                base_sysctls(&pns);
                let (v4, v6) = (
                    a4(format!("10.{n}.{octet}.{}", 10 + j)),
                    a6(format!("fd00:{n6}:{octet}::{}", 10 + j)),
                );
                ns.exec(&format!(
                    "ip link add vp{j} type veth peer name eth0 netns {pod} && \
                     ip link set vp{j} master cni0 && ip link set vp{j} up",
                    pod = pns.name
                ));
                pns.exec(&format!(
                    "ip link set eth0 up && ip addr add {v4}/24 dev eth0 && \
                     ip addr add {v6}/64 dev eth0 nodad && \
                     ip route add default via {cni0_v4} && \
                     ip -6 route add default via {cni0_v6}"
                ));
                pods.push(Pod {
                    name: format!("n{i}-p{j}"),
                    node: format!("node-{i}"),
                    node_number: i,
                    ns: pns,
                    v4,
                    v6,
                });
            }
            nodes.push(Node {
                number: i,
                name: format!("node-{i}"),
                k8s_name: unique(&format!("node-{i}-")),
                pods,
                ns,
                eth0_v4,
                eth0_v6,
                cni0_v4,
                cni0_v6,
                pod_cidr4: Cidr {
                    addr: a4(format!("10.{n}.{octet}.0")).into(),
                    len: 24,
                },
                pod_cidr6: Cidr {
                    addr: a6(format!("fd00:{n6}:{octet}::")).into(),
                    len: 64,
                },
            });
        }
        // Each node reaches the others' pods via their eth0.
        for node in &nodes {
            let routes: Vec<String> = nodes
                .iter()
                .filter(|o| o.number != node.number)
                .flat_map(|o| {
                    [
                        format!("ip route add {} via {} dev eth0", o.pod_cidr4, o.eth0_v4),
                        format!("ip -6 route add {} via {} dev eth0", o.pod_cidr6, o.eth0_v6),
                    ]
                })
                .collect();
            if !routes.is_empty() {
                node.ns.exec(&routes.join(" && "));
            }
        }

        let pass = Decap::load().expect("loading the decap object (xdp_pass)");
        let progs = pass.progs().expect("decap program fds");
        let numbers: Vec<usize> = nodes.iter().map(|n| n.number).collect();
        let links = switch.run(move || {
            numbers
                .iter()
                .map(|i| {
                    let port = format!("pn{i}");
                    let idx = ifindex(&port).unwrap_or_else(|e| panic!("{port}: {e}"));
                    progs
                        .attach_pass(idx)
                        .unwrap_or_else(|e| panic!("xdp_pass on {port}: {e}"))
                })
                .collect::<Vec<_>>()
        });

        let mut servers = Servers::new();
        for p in nodes.iter().flat_map(|n| &n.pods) {
            // Dual-stack: IPv4 clients arrive as v4-mapped addresses.
            servers.tcp(&p.ns, &p.name, SocketAddr::from(([0u16; 8], POD_PORT)));
            // Bound to the pod's address: the reply leaves from it.
            for v6 in [false, true] {
                servers.udp_echo(&p.ns, &p.name, p.target(v6));
            }
        }

        let lab = MultiNode {
            links,
            _pass: pass,
            _servers: servers,
            nodes,
            router,
            client,
            switch,
            n,
            client_v4,
            client_v6,
            receiving: AtomicUsize::new(0),
            removed: Mutex::new(BTreeSet::new()),
            attempts: AtomicU32::new(0),
        };
        lab.route_vips_via(receiving);
        lab
    }

    /// Node number `i` (`node-i`).
    pub fn node(&self, i: usize) -> &Node {
        assert!(
            (1..=self.nodes.len()).contains(&i),
            "node {i} of {}",
            self.nodes.len()
        );
        &self.nodes[i - 1]
    }

    /// Every pod, node by node.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.nodes.iter().flat_map(|n| &n.pods)
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    /// The pod holding `addr`, if any.
    pub fn pod_at(&self, addr: IpAddr) -> Option<&Pod> {
        let addr = addr.to_canonical();
        self.pods().find(|p| p.addr(addr.is_ipv6()) == addr)
    }

    /// The IPv4 VIP 10.N.100.k.
    pub fn vip4(&self, k: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.n as u8, 100, k)
    }

    /// The IPv6 VIP fd00:N:100::k.
    pub fn vip6(&self, k: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, self.n as u16, 0x100, 0, 0, 0, 0, k)
    }

    /// The VIP subnets, 10.N.100.0/24 and fd00:N:100::/64.
    pub fn vip_nets(&self) -> [Cidr; 2] {
        [
            Cidr {
                addr: self.vip4(0).into(),
                len: 24,
            },
            Cidr {
                addr: self.vip6(0).into(),
                len: 64,
            },
        ]
    }

    /// Whether `a` is in the VIP subnets.
    pub fn is_vip(&self, a: IpAddr) -> bool {
        self.vip_nets().iter().any(|c| c.contains(a.to_canonical()))
    }

    pub fn client_addr(&self, v6: bool) -> IpAddr {
        if v6 {
            self.client_v6.into()
        } else {
            self.client_v4.into()
        }
    }

    /// The node the client sends VIP traffic to.
    pub fn receiving(&self) -> usize {
        self.receiving.load(Ordering::Relaxed)
    }

    /// Route the client's VIP subnets via node `i`'s eth0.
    pub fn route_vips_via(&self, i: usize) {
        let node = self.node(i);
        self.route_vips(node.eth0_v4, node.eth0_v6);
        self.receiving.store(i, Ordering::Relaxed);
    }

    /// Route the client's VIP subnets via the router (which must know
    /// them, from BGP).
    pub fn route_vips_via_router(&self) {
        let r = self.router.as_ref().expect("a lab built with .router()");
        self.route_vips(r.v4, r.v6);
        self.receiving.store(0, Ordering::Relaxed);
    }

    fn route_vips(&self, v4: Ipv4Addr, v6: Ipv6Addr) {
        let n = self.n;
        self.client.exec(&format!(
            "ip route replace 10.{n}.100.0/24 via {v4} && \
             ip -6 route replace fd00:{n:x}:100::/64 via {v6}"
        ));
    }

    /// Node `i` fails: its switch port goes down, so its eth0 loses carrier
    /// and nothing crosses either way. Its rivorad, if any, runs on (it
    /// still reaches the API server through its proxy) but nobody reaches
    /// it. Kubernetes would mark its endpoints not ready some 40 s later:
    /// that is the test's to say ([`Cluster::set_node_endpoints`]).
    pub fn remove_node(&self, i: usize) {
        self.node(i);
        self.switch.exec(&format!("ip link set pn{i} down"));
        self.removed.lock().expect("removed nodes").insert(i);
    }

    /// Node `i` back on the segment, once no address resolution on the
    /// segment is still in flight (no INCOMPLETE neighbour entry on any
    /// node's `eth0` or the client's `c0`). While a node is away its kernel
    /// keeps resolving whoever it was sending to (a pod's SYN-ACK to the
    /// client under DSR, to the receiving node under full NAT): an entry
    /// stays INCOMPLETE, its next probe up to a second away (retrans_time),
    /// and once its probes run out the queued packets are dropped and the
    /// pods told "host unreachable", which aborts their half-open
    /// connections. A node that was really gone for the lease timeout
    /// (40 s) has long given those up, and resolves afresh on its first
    /// packet; the lab's outage lasts a second or two, so the lab waits
    /// for the resolutions in flight to end (the node's kernel, not
    /// Rivora, is what is waited for). Panics after 10 s.
    pub fn restore_node(&self, i: usize) {
        self.node(i);
        self.switch.exec(&format!("ip link set pn{i} up"));
        self.removed.lock().expect("removed nodes").remove(&i);
        let on_segment: Vec<(&Netns, &str)> = self
            .nodes
            .iter()
            .map(|n| (&n.ns, "eth0"))
            .chain([(&self.client, "c0")])
            .collect();
        let t0 = Instant::now();
        let mut last = String::new();
        let settled = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
            last = on_segment
                .iter()
                .map(|(ns, dev)| ns.exec(&format!("ip neigh show dev {dev} nud incomplete")))
                .collect::<String>();
            last.trim().is_empty().then_some(())
        });
        assert!(
            settled.is_some(),
            "node-{i} back, but address resolution still in flight after 10 s:\n{last}"
        );
        eprintln!(
            "node-{i} back; address resolutions in flight ended {:?} later",
            t0.elapsed()
        );
    }

    pub fn is_removed(&self, i: usize) -> bool {
        self.removed.lock().expect("removed nodes").contains(&i)
    }

    /// `count` attempts from the client to `vip`:[`VIP_PORT`], each from a
    /// source port of its own: a TCP connection with one line exchanged,
    /// or a UDP request and its answer; [`WORKERS`] at a time, each step
    /// bounded by [`STEP`]. Every attempt runs, whatever the others did.
    pub fn exchanges(&self, vip: IpAddr, proto: Proto, count: usize) -> Exchanges {
        self.exchanges_while(vip, proto, count, |_| ()).0
    }

    /// [`MultiNode::exchanges`], with `during` run on the calling thread
    /// while the attempts go on (it may wait for them to get somewhere:
    /// [`Running::wait_started`]): a node failing, endpoints moving, in
    /// the middle of a run. Returns the run and what `during` returned.
    pub fn exchanges_while<T>(
        &self,
        vip: IpAddr,
        proto: Proto,
        count: usize,
        during: impl FnOnce(&Running) -> T,
    ) -> (Exchanges, T) {
        let dst = SocketAddr::new(vip, VIP_PORT);
        let me = self.client_addr(vip.is_ipv6());
        let srcs: Vec<SocketAddr> = (0..count)
            .map(|_| {
                let k = self.attempts.fetch_add(1, Ordering::Relaxed);
                let span = CLIENT_PORTS.end - CLIENT_PORTS.start;
                let port = CLIENT_PORTS.start + k % span;
                SocketAddr::new(me, u16::try_from(port).expect("ports below 65536"))
            })
            .collect();
        let capture = Capture::start(&self.client, me, self.vip_nets());
        let t0 = Instant::now();
        let running = Running {
            next: Arc::new(AtomicUsize::new(0)),
            count,
        };
        let handle = {
            let (srcs, next) = (srcs.clone(), running.next.clone());
            spawn_in(&self.client, move || run_attempts(srcs, dst, proto, next))
        };
        let out = during(&running);
        let results = handle.join().expect("the client's run panicked");
        let took = t0.elapsed();
        std::thread::sleep(CAPTURE_TAIL);
        let strays = capture.finish();
        let attempts = results
            .into_iter()
            .map(|(src, r)| Attempt {
                proto,
                src,
                result: r.map(|h| Answer {
                    pod: h.backend,
                    local: h.local,
                    peer: h.peer,
                }),
                strays: strays
                    .iter()
                    .filter(|s| s.to_port == src.port())
                    .map(|s| Stray {
                        pod: self.pod_at(s.from.ip()).map(|p| p.name.clone()),
                        ..s.clone()
                    })
                    .collect(),
            })
            .collect();
        let run = Exchanges {
            vip: dst,
            proto,
            receiving: self.receiving(),
            pods: self
                .pods()
                .map(|p| (p.name.clone(), p.node.clone()))
                .collect(),
            attempts,
            took,
        };
        (run, out)
    }
}

/// A run of exchanges going on (see [`MultiNode::exchanges_while`]).
pub struct Running {
    /// The next attempt a worker takes: attempts started so far.
    next: Arc<AtomicUsize>,
    count: usize,
}

impl Running {
    /// Attempts started so far (the run's size once it is over).
    pub fn started(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.count)
    }

    /// Wait until `k` attempts of the run have started (all of them, if
    /// `k` is more than the run has).
    pub fn wait_started(&self, k: usize) {
        while self.started() < k.min(self.count) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The attempts of one run, `WORKERS` threads of the calling thread's
/// namespace taking the next source from a shared cursor (`next`, which
/// others may watch); in `srcs` order.
fn run_attempts(
    srcs: Vec<SocketAddr>,
    dst: SocketAddr,
    proto: Proto,
    next: Arc<AtomicUsize>,
) -> Vec<(SocketAddr, Result<Hit, String>)> {
    let srcs = Arc::new(srcs);
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (srcs, next) = (srcs.clone(), next.clone());
            // Threads started here inherit the client's namespace.
            std::thread::spawn(move || {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&src) = srcs.get(i) else {
                        break;
                    };
                    let r = match proto {
                        Proto::Tcp => traffic::tcp_once_from(src, dst, STEP),
                        Proto::Udp => traffic::udp_once_from(src, dst, &format!("req-{i}"), STEP),
                    };
                    out.push((i, src, r));
                }
                out
            })
        })
        .collect();
    let mut all: Vec<(usize, SocketAddr, Result<Hit, String>)> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("a client worker panicked"))
        .collect();
    all.sort_by_key(|(i, _, _)| *i);
    all.into_iter().map(|(_, s, r)| (s, r)).collect()
}

// ---------------------------------------------------------------------
// What came back
// ---------------------------------------------------------------------

/// An answer through the VIP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub pod: String,
    /// The address the pod saw the request addressed to.
    pub local: SocketAddr,
    /// The client address and port the pod saw.
    pub peer: SocketAddr,
}

/// A packet that reached the client's port from outside the VIP subnets:
/// a reply that bypassed the translation, which the client drops (UDP)
/// or resets (TCP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stray {
    pub from: SocketAddr,
    /// The pod holding `from`, if one does.
    pub pod: Option<String>,
    pub to_port: u16,
    /// `SYN-ACK`, `RST`, `ACK`, `UDP`, ...
    pub what: &'static str,
}

#[derive(Debug, Clone)]
pub struct Attempt {
    pub proto: Proto,
    /// The client's own address and port.
    pub src: SocketAddr,
    pub result: Result<Answer, String>,
    /// What reached `src` from elsewhere than the VIP meanwhile.
    pub strays: Vec<Stray>,
}

impl Attempt {
    /// The pod that served the attempt: the answer's, or for a failure
    /// the pod whose stray reply reached the client.
    pub fn pod(&self) -> Option<&str> {
        match &self.result {
            Ok(a) => Some(&a.pod),
            Err(_) => self.strays.iter().find_map(|s| s.pod.as_deref()),
        }
    }
}

/// One run of [`MultiNode::exchanges`]; `Display` prints its summary.
pub struct Exchanges {
    pub vip: SocketAddr,
    pub proto: Proto,
    /// The node the client routed the VIPs via (0: the router).
    pub receiving: usize,
    /// Every pod of the lab and its node, in order.
    pub pods: Vec<(String, String)>,
    pub attempts: Vec<Attempt>,
    pub took: Duration,
}

impl Exchanges {
    pub fn answered(&self) -> Vec<&Answer> {
        self.attempts
            .iter()
            .filter_map(|a| a.result.as_ref().ok())
            .collect()
    }

    pub fn failed(&self) -> Vec<&Attempt> {
        self.attempts.iter().filter(|a| a.result.is_err()).collect()
    }

    /// Answers per pod (every pod of the lab, zeros included).
    pub fn per_pod(&self) -> BTreeMap<String, usize> {
        let mut m: BTreeMap<String, usize> =
            self.pods.iter().map(|(p, _)| (p.clone(), 0)).collect();
        for a in self.answered() {
            *m.entry(a.pod.clone()).or_default() += 1;
        }
        m
    }

    /// Failures per pod, by the pod whose stray reply came back; failures
    /// without one under `"-"`.
    pub fn failed_per_pod(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for a in self.failed() {
            *m.entry(a.pod().unwrap_or("-").to_string()).or_default() += 1;
        }
        m
    }

    /// (answered, failed) per node, failures placed by their stray reply.
    pub fn per_node(&self) -> BTreeMap<String, (usize, usize)> {
        let node_of: BTreeMap<&str, &str> = self
            .pods
            .iter()
            .map(|(p, n)| (p.as_str(), n.as_str()))
            .collect();
        let mut m: BTreeMap<String, (usize, usize)> =
            self.pods.iter().map(|(_, n)| (n.clone(), (0, 0))).collect();
        for a in &self.attempts {
            let node = a.pod().and_then(|p| node_of.get(p)).copied().unwrap_or("-");
            let e = m.entry(node.to_string()).or_default();
            if a.result.is_ok() {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
        m
    }

    /// The client addresses each pod saw.
    pub fn peers_seen(&self) -> BTreeMap<String, BTreeSet<IpAddr>> {
        let mut m: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        for a in self.answered() {
            m.entry(a.pod.clone()).or_default().insert(a.peer.ip());
        }
        m
    }
}

impl fmt::Display for Exchanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.failed();
        let via = match self.receiving {
            0 => "the router".to_string(),
            i => format!("node-{i}"),
        };
        writeln!(
            f,
            "{:?} to {} via {via}: {} attempts, {} answered, {} failed, in {:.1?}",
            self.proto,
            self.vip,
            self.attempts.len(),
            self.attempts.len() - failed.len(),
            failed.len(),
            self.took
        )?;
        let nodes: Vec<String> = self
            .per_node()
            .iter()
            .map(|(n, (ok, bad))| format!("{n} {ok} answered/{bad} failed"))
            .collect();
        writeln!(f, "  per node: {}", nodes.join(", "))?;
        let (ok, bad, peers) = (self.per_pod(), self.failed_per_pod(), self.peers_seen());
        for (pod, node) in &self.pods {
            let stray = self
                .attempts
                .iter()
                .filter(|a| a.result.is_err())
                .flat_map(|a| &a.strays)
                .find(|s| s.pod.as_deref() == Some(pod.as_str()));
            let seen: Vec<String> = peers
                .get(pod)
                .map(|s| s.iter().map(|a| a.to_string()).collect())
                .unwrap_or_default();
            write!(
                f,
                "  {node:8} {pod:7} answered {:4}  failed {:4}",
                ok.get(pod).copied().unwrap_or(0),
                bad.get(pod).copied().unwrap_or(0),
            )?;
            if !seen.is_empty() {
                write!(f, "  saw the client as {}", seen.join(", "))?;
            }
            if let Some(s) = stray {
                write!(f, "  its replies came from {} ({})", s.from, s.what)?;
            }
            writeln!(f)?;
        }
        if let Some(n) = bad.get("-") {
            writeln!(f, "  failed with no stray reply seen: {n}")?;
        }
        for a in failed.iter().take(3) {
            if let Err(e) = &a.result {
                writeln!(f, "  e.g. {}: {e}", a.src)?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------
// The client's capture of stray replies
// ---------------------------------------------------------------------

/// A packet socket in the client's namespace, recording every TCP or UDP
/// packet to the client's address from outside the VIP subnets until
/// finished.
struct Capture {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Stray>>>,
}

impl Capture {
    fn start(client: &Netns, me: IpAddr, vips: [Cidr; 2]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<()>();
        let st = stop.clone();
        let handle = spawn_in(client, move || {
            let fd = socket::socket(
                AddressFamily::Packet,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::EthAll,
            )
            .expect("a packet socket in the client");
            let _ = tx.send(());
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 2048];
            loop {
                let stopping = st.load(Ordering::Relaxed);
                // Once stopping, drain what is queued without waiting.
                if !stopping && !readable(fd.as_raw_fd()) {
                    continue;
                }
                match socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                    Ok(len) => {
                        if let Some(s) = stray(&buf[..len], me, &vips) {
                            seen.push(s);
                        }
                    }
                    Err(_) if stopping => return seen,
                    Err(_) => {}
                }
            }
        });
        // The sender is dropped without sending if the thread panicked.
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the client's capture did not start");
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> Vec<Stray> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .map(|h| h.join().expect("the client's capture panicked"))
            .unwrap_or_default()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Wait until `fd` is readable or 50 ms pass; true if readable.
fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 50) > 0 }
}

/// `frame` as a stray: TCP or UDP to `me` from outside `vips`.
fn stray(frame: &[u8], me: IpAddr, vips: &[Cidr]) -> Option<Stray> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let (src, dst): (IpAddr, IpAddr) = match p.net.as_ref()? {
        NetSlice::Ipv4(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
        ),
        NetSlice::Ipv6(ip) => (
            ip.header().source_addr().into(),
            ip.header().destination_addr().into(),
        ),
        NetSlice::Arp(_) => return None,
    };
    if dst != me || vips.iter().any(|v| v.contains(src)) {
        return None;
    }
    let (sport, dport, what) = match p.transport.as_ref()? {
        TransportSlice::Tcp(t) => {
            let what = match (t.syn(), t.ack(), t.rst(), t.fin()) {
                (true, true, _, _) => "SYN-ACK",
                (true, false, _, _) => "SYN",
                (_, _, true, _) => "RST",
                (_, _, _, true) => "FIN",
                _ => "ACK",
            };
            (t.source_port(), t.destination_port(), what)
        }
        TransportSlice::Udp(u) => (u.source_port(), u.destination_port(), "UDP"),
        _ => return None,
    };
    Some(Stray {
        from: SocketAddr::new(src, sport),
        pod: None,
        to_port: dport,
        what,
    })
}

// ---------------------------------------------------------------------
// Kubernetes: rivorad on every node, the cluster's objects
// ---------------------------------------------------------------------

/// An endpoint's state in its EndpointSlice, as the EndpointSlice
/// controller writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpState {
    /// Running and passing readiness.
    Ready,
    /// Failing readiness, or on a node that stopped reporting.
    NotReady,
    /// Being deleted, still serving.
    Terminating,
    /// Not in the slice (the pod is gone).
    Gone,
}

type NodeYaml = Box<dyn Fn(&Node) -> String>;

/// How to run rivorad on the nodes.
pub struct ClusterBuilder {
    lab: MultiNode,
    yaml: Option<NodeYaml>,
    interfaces: Vec<(String, XdpMode)>,
    args: Vec<String>,
}

impl ClusterBuilder {
    /// More node config for each node, merged into the usual one (mappings
    /// merged key by key, lists appended, scalars replaced): e.g.
    /// `|n| format!("node:\n  snat: {{ ipv4: {} }}\n", n.eth0_v4)`.
    pub fn node_yaml(mut self, f: impl Fn(&Node) -> String + 'static) -> Self {
        self.yaml = Some(Box::new(f));
        self
    }

    /// Attach rivorad to `name` too (after `eth0`) on every node.
    pub fn interface(mut self, name: &str, mode: XdpMode) -> Self {
        self.interfaces.push((name.to_string(), mode));
        self
    }

    /// Flags for every rivorad's first run.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    pub fn start(self) -> Cluster {
        Cluster::start(self)
    }
}

/// What the test wrote about one Service.
struct Svc {
    vips: Vec<IpAddr>,
    /// By pod name.
    eps: BTreeMap<String, EpState>,
}

/// A [`MultiNode`] lab as a cluster: on each node `rivorad -kubernetes`
/// (its own [`Home`], so pins, sockets and state never meet; its own
/// [`ApiProxy`] to the shared API server), attached to `eth0`; a
/// Kubernetes namespace for the test's objects. Dereferences to the lab.
pub struct Cluster {
    // Dropped in declaration order: the rivorads (stopped, pins removed,
    // logs printed if the test failed), the proxies, the Kubernetes
    // objects (so no other test's rivorad goes on programming them), then
    // the lab.
    rivorads: Vec<Rivorad>,
    _proxies: Vec<ApiProxy>,
    pub k8s: TestNs,
    services: Mutex<BTreeMap<String, Svc>>,
    pub lab: MultiNode,
}

impl Deref for Cluster {
    type Target = MultiNode;

    fn deref(&self) -> &MultiNode {
        &self.lab
    }
}

/// Merge `extra` into `base`: mappings key by key, lists appended,
/// anything else replaced.
fn merge(base: &mut Yaml, extra: Yaml) {
    match (base, extra) {
        (Yaml::Mapping(b), Yaml::Mapping(e)) => {
            for (k, v) in e {
                match b.get_mut(&k) {
                    Some(old) => merge(old, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (Yaml::Sequence(b), Yaml::Sequence(e)) => b.extend(e),
        (b, e) => *b = e,
    }
}

fn parse_yaml(what: &str, text: &str) -> Yaml {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{what} is not YAML: {e}\n{text}"))
}

/// The Service's ports: TCP and UDP, [`VIP_PORT`] to [`POD_PORT`].
pub fn ports() -> [SvcPort; 2] {
    [tcp(VIP_PORT, POD_PORT), udp(VIP_PORT, POD_PORT)]
}

impl Cluster {
    /// rivorad on every node of `lab`, attached to `eth0` alone unless
    /// said.
    pub fn builder(lab: MultiNode) -> ClusterBuilder {
        ClusterBuilder {
            lab,
            yaml: None,
            interfaces: Vec::new(),
            args: Vec::new(),
        }
    }

    fn start(b: ClusterBuilder) -> Self {
        let ClusterBuilder {
            lab,
            yaml,
            interfaces,
            args,
        } = b;
        let s = shared();
        let k8s = Kube::admin().namespace("e2emn-");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut proxies = Vec::new();
        let mut rivorads = Vec::new();
        for node in &lab.nodes {
            let proxy = ApiProxy::start(&node.ns, s.addr);
            let home = Home::new();
            let kubeconfig = home.path("kubeconfig");
            write_kubeconfig_with(
                &kubeconfig,
                &proxy.url(),
                &s.server.ca_cert,
                &Identity::admin(),
            );
            let mut config = parse_yaml(
                "the node config",
                &home.node_config("eth0", node.eth0_v4, node.eth0_v6),
            );
            let extra: Vec<Value> = interfaces
                .iter()
                .map(|(name, mode)| json!({ "name": name, "xdpMode": mode }))
                .collect();
            merge(
                &mut config,
                serde_yaml_ng::to_value(json!({ "interfaces": extra }))
                    .expect("interfaces as YAML"),
            );
            if let Some(f) = &yaml {
                merge(&mut config, parse_yaml("the extra node config", &f(node)));
            }
            let config = serde_yaml_ng::to_string(&config).expect("the node config as YAML");
            proxies.push(proxy);
            rivorads.push(Rivorad::start_kubernetes(
                &node.ns,
                home,
                &config,
                &kubeconfig,
                &node.k8s_name,
                &args,
            ));
        }
        Self {
            rivorads,
            _proxies: proxies,
            k8s,
            services: Mutex::new(BTreeMap::new()),
            lab,
        }
    }

    /// Node `i`'s rivorad.
    pub fn rivorad(&self, i: usize) -> &Rivorad {
        self.node(i);
        &self.rivorads[i - 1]
    }

    /// A LoadBalancer Service `name` of [`ports`] on the VIPs `vip4(k)` and
    /// `vip6(k)`, `spec` merged into its spec (externalTrafficPolicy, ...);
    /// its ingress written as rivora-controller would, and EndpointSlices
    /// (one per family) with every pod ready on its node. Returns the
    /// VIPs.
    pub fn create_service(&self, name: &str, k: u8, spec: Value) -> [IpAddr; 2] {
        let vips = [self.vip4(k).into(), self.vip6(k.into()).into()];
        let mut full = json!({ "ipFamilyPolicy": "PreferDualStack" });
        if let (Some(base), Value::Object(extra)) = (full.as_object_mut(), spec) {
            base.extend(extra);
        }
        self.k8s.create_service(&lb_service(name, &ports(), full));
        self.k8s.set_ingress(name, &vips);
        let eps = self
            .pods()
            .map(|p| (p.name.clone(), EpState::Ready))
            .collect();
        self.services.lock().expect("services").insert(
            name.to_string(),
            Svc {
                vips: vips.to_vec(),
                eps,
            },
        );
        self.apply_slices(name);
        vips
    }

    /// Set pod `pod`'s endpoint of Service `service` to `state` and write
    /// the slices.
    pub fn set_endpoint(&self, service: &str, pod: &str, state: EpState) {
        self.lab.pod(pod);
        self.with_service(service, |s| {
            s.eps.insert(pod.to_string(), state);
        });
        self.apply_slices(service);
    }

    /// Set the endpoints of every pod of node `i` to `state` at once (one
    /// write per slice): what Kubernetes does when a node dies
    /// ([`EpState::NotReady`] once it stops reporting, [`EpState::Gone`]
    /// once its pods are evicted).
    pub fn set_node_endpoints(&self, service: &str, i: usize, state: EpState) {
        let pods: Vec<String> = self.node(i).pods.iter().map(|p| p.name.clone()).collect();
        self.with_service(service, |s| {
            for p in pods {
                s.eps.insert(p, state);
            }
        });
        self.apply_slices(service);
    }

    /// Pod `pod` fails its readiness probe.
    pub fn mark_not_ready(&self, service: &str, pod: &str) {
        self.set_endpoint(service, pod, EpState::NotReady);
    }

    /// Node `i`'s pods leave Service `service`'s slices.
    pub fn delete_node_endpoints(&self, service: &str, i: usize) {
        self.set_node_endpoints(service, i, EpState::Gone);
    }

    fn with_service<T>(&self, service: &str, f: impl FnOnce(&mut Svc) -> T) -> T {
        let mut all = self.services.lock().expect("services");
        let s = all
            .get_mut(service)
            .unwrap_or_else(|| panic!("no Service {service} created"));
        f(s)
    }

    /// Write Service `service`'s slices (`NAME-v4`, `NAME-v6`) as the test
    /// last said.
    fn apply_slices(&self, service: &str) {
        let eps: Vec<(&Pod, EpState)> = self.with_service(service, |s| {
            self.pods()
                .map(|p| (p, s.eps.get(&p.name).copied().unwrap_or(EpState::Gone)))
                .collect()
        });
        for v6 in [false, true] {
            let list: Vec<Ep> = eps
                .iter()
                .filter_map(|(p, st)| {
                    let a = p.addr(v6);
                    let ep = match st {
                        EpState::Ready => Ep::ready(a),
                        EpState::NotReady => Ep::not_ready(a),
                        EpState::Terminating => Ep::terminating(a),
                        EpState::Gone => return None,
                    };
                    Some(ep.on(&self.node(p.node_number).k8s_name))
                })
                .collect();
            let name = format!("{service}-v{}", if v6 { 6 } else { 4 });
            self.k8s
                .apply_slice(&endpoint_slice(&name, service, v6, &ports(), &list));
        }
    }

    /// Wait until every node still on the segment serves Service
    /// `service` as the test last wrote it: each VIP and protocol in
    /// `rivoractl vip list` with the ready pods, and only them, as
    /// backends of non-zero weight. Returns how long it took.
    pub fn wait_programmed(&self, service: &str) -> Duration {
        let (vips, ready) = self.with_service(service, |s| {
            let ready: BTreeSet<String> = s
                .eps
                .iter()
                .filter(|(_, st)| **st == EpState::Ready)
                .map(|(p, _)| p.clone())
                .collect();
            (s.vips.clone(), ready)
        });
        let want = |v6: bool| -> BTreeSet<String> {
            self.pods()
                .filter(|p| ready.contains(&p.name))
                .map(|p| p.target(v6).to_string())
                .collect()
        };
        let t0 = Instant::now();
        let mut last = String::new();
        for node in &self.nodes {
            if self.is_removed(node.number) {
                continue;
            }
            let rd = &self.rivorads[node.number - 1];
            let ok = wait_for(PROGRAMMED, Duration::from_millis(100), || {
                let got = serving(rd, &vips);
                let all = vips.iter().all(|v| {
                    ["tcp", "udp"].iter().all(|p| {
                        let name = format!("{p}/{}", SocketAddr::new(*v, VIP_PORT));
                        got.get(&name) == Some(&want(v.is_ipv6()))
                    })
                });
                last = format!("{got:#?}");
                all.then_some(())
            });
            assert!(
                ok.is_some(),
                "{service} not programmed on {} within {PROGRAMMED:?}; its VIPs there:\n{last}",
                node.name
            );
        }
        let took = t0.elapsed();
        eprintln!("{service} programmed on every node in {took:?}");
        took
    }
}

/// How a node reaches a backend, as `rivoractl vip show` names it (each
/// backend's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Way {
    Nat,
    FullNat,
    L3Dsr,
}

impl Way {
    pub fn name(self) -> &'static str {
        match self {
            Way::Nat => "nat",
            Way::FullNat => "fullnat",
            Way::L3Dsr => "l3dsr",
        }
    }
}

impl fmt::Display for Way {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One backend of a VIP as `rivoractl vip list` shows it: (target, mode,
/// node).
pub type Placed = (String, String, String);

/// Each VIP's backends (by VIP name, `tcp/10.0.0.1:80`), as [`Placed`].
pub type Placement = BTreeMap<String, BTreeSet<Placed>>;

impl Cluster {
    /// Create ServicePolicy `name` in the test's namespace with `spec`,
    /// as an operator would (`kubectl apply`); panics if the API server
    /// refuses it.
    pub fn apply_policy(&self, name: &str, spec: Value) {
        self.k8s
            .create_policy(name, spec)
            .unwrap_or_else(|e| panic!("creating ServicePolicy {name}: {e}"));
    }

    /// Delete ServicePolicy `name`.
    pub fn delete_policy(&self, name: &str) {
        self.k8s.delete_policy(name);
    }

    /// What each node should hold for Service `service`: for every node
    /// on the segment, its VIPs (each family, TCP and UDP) with, as
    /// backends of non-zero weight, each ready pod for which `how` (this
    /// node, the pod) names a way, shown with that way as its mode and
    /// the pod's node as its node.
    fn placement(
        &self,
        service: &str,
        how: &dyn Fn(&Node, &Pod) -> Option<Way>,
    ) -> (Vec<IpAddr>, BTreeMap<usize, Placement>) {
        let (vips, ready) = self.with_service(service, |s| {
            let ready: BTreeSet<String> = s
                .eps
                .iter()
                .filter(|(_, st)| **st == EpState::Ready)
                .map(|(p, _)| p.clone())
                .collect();
            (s.vips.clone(), ready)
        });
        let mut want = BTreeMap::new();
        for node in self.nodes.iter().filter(|n| !self.is_removed(n.number)) {
            let mut per_vip = BTreeMap::new();
            for vip in &vips {
                let backends: BTreeSet<Placed> = self
                    .pods()
                    .filter(|p| ready.contains(&p.name))
                    .filter_map(|p| {
                        how(node, p).map(|w| {
                            (
                                p.target(vip.is_ipv6()).to_string(),
                                w.name().to_string(),
                                self.node(p.node_number).k8s_name.clone(),
                            )
                        })
                    })
                    .collect();
                for proto in ["tcp", "udp"] {
                    let name = format!("{proto}/{}", SocketAddr::new(*vip, VIP_PORT));
                    per_vip.insert(name, backends.clone());
                }
            }
            want.insert(node.number, per_vip);
        }
        (vips, want)
    }

    /// Wait until every node on the segment reaches Service `service`'s
    /// ready pods as `how` says (see [`Cluster::placement`]): the backends,
    /// the mode each is reached by and the node each is on, as `rivoractl
    /// vip list` shows them. [`Cluster::wait_programmed`] with the way
    /// checked too, and the backends a node leaves out
    /// (externalTrafficPolicy Local). Returns how long it took.
    pub fn wait_placed(&self, service: &str, how: impl Fn(&Node, &Pod) -> Option<Way>) -> Duration {
        let (vips, want) = self.placement(service, &how);
        let t0 = Instant::now();
        for (i, want) in &want {
            let node = self.node(*i);
            let rd = &self.rivorads[i - 1];
            let mut last = String::new();
            let ok = wait_for(PROGRAMMED, Duration::from_millis(100), || {
                let got = placed(rd, &vips);
                let done = want.iter().all(|(name, b)| got.get(name) == Some(b));
                last = format!("{got:#?}");
                done.then_some(())
            });
            assert!(
                ok.is_some(),
                "{service} not placed on {} within {PROGRAMMED:?}; wanted:\n{want:#?}\nits VIPs there:\n{last}",
                node.name
            );
        }
        let took = t0.elapsed();
        eprintln!("{service} placed on every node in {took:?}");
        took
    }

    /// `rivoractl -o json vip show` of `vip`:[`VIP_PORT`] on node `i`.
    pub fn vip_show(&self, i: usize, vip: IpAddr, proto: Proto) -> Value {
        let p = match proto {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        };
        let name = format!("{p}/{}", SocketAddr::new(vip, VIP_PORT));
        self.rivorad(i).ctl_json(&["vip", "show", &name])
    }

    /// `vip`:[`VIP_PORT`] as node `i`'s datapath holds it, read from its
    /// pinned maps (see [`FlowTable`]).
    pub fn flow_table(&self, i: usize, vip: IpAddr, proto: Proto) -> FlowTable<'_> {
        FlowTable::read(
            &self.lab,
            i,
            self.rivorad(i).home.pin_dir(),
            SocketAddr::new(vip, VIP_PORT),
            proto,
        )
    }
}

/// The VIPs `rd` serves on `addrs`, by name: every backend of non-zero
/// weight as (target, mode, node).
fn placed(rd: &Rivorad, addrs: &[IpAddr]) -> Placement {
    let list = rd.ctl_json(&["vip", "list"]);
    let Some(list) = list.as_array() else {
        return BTreeMap::new();
    };
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    list.iter()
        .filter(|v| {
            v["addr"]
                .as_str()
                .and_then(|a| a.parse::<IpAddr>().ok())
                .is_some_and(|a| addrs.contains(&a))
        })
        .filter_map(|v| {
            let name = v["vip"].as_str()?.to_string();
            let backends = v["backends"]
                .as_array()
                .map(|bs| {
                    bs.iter()
                        .filter(|b| b["weight"].as_u64().is_some_and(|w| w > 0))
                        .map(|b| (text(&b["target"]), text(&b["mode"]), text(&b["node"])))
                        .collect()
                })
                .unwrap_or_default();
            Some((name, backends))
        })
        .collect()
}

/// One VIP as a node's datapath holds it, read from the node's pinned
/// maps rather than asked of its rivorad: the service id (`vip_map`), the
/// service's slice of `maglev_table` (`service_config_map`), the
/// backends' addresses (`backend_map`) and health, as they were when read
/// (a snapshot: a later change of the slice is not seen). Enough to say
/// which pod a new flow must get, as `rv_maglev_pick` (bpf/lib/lb.h)
/// chooses it from the flow hash (`common::flow_hash`, written again from
/// the datapath's description): an oracle independent of the writer and
/// of the answers. And the affinity entry a flow left, read when asked.
pub struct FlowTable<'a> {
    lab: &'a MultiNode,
    maps: Maps,
    /// The node's number.
    pub node: usize,
    pub vip: SocketAddr,
    pub proto: Proto,
    pub svc_id: u32,
    pub svc: rv_service,
    /// The service's slice: a backend id per slot (0: empty).
    pub slice: Vec<u32>,
    /// Each backend id of the slice: its address (`backend_map`), and
    /// whether it is healthy (`backend_health_map`).
    pub backends: BTreeMap<u32, (Option<IpAddr>, bool)>,
}

impl<'a> FlowTable<'a> {
    fn read(lab: &'a MultiNode, node: usize, pins: &Path, vip: SocketAddr, proto: Proto) -> Self {
        let maps = Maps::open(pins)
            .unwrap_or_else(|e| panic!("node-{node}'s pinned maps in {}: {e}", pins.display()));
        let p = proto_number(proto);
        let value: Option<rv_vip_value> = match vip.ip() {
            IpAddr::V4(a) => maps.vip_map.get(&rv_vip_key {
                addr: be32(a),
                port: be16(vip.port()),
                proto: p,
                ..Default::default()
            }),
            IpAddr::V6(a) => maps.vip_map6.get(&rv_vip6_key {
                addr: be32x4(a),
                port: be16(vip.port()),
                proto: p,
                ..Default::default()
            }),
        }
        .expect("vip_map");
        let svc_id = value
            .unwrap_or_else(|| panic!("{proto:?} {vip} not in node-{node}'s vip_map"))
            .svc_id;
        let svc: rv_service = maps
            .service_config_map
            .get(&svc_id)
            .expect("service_config_map")
            .unwrap_or_else(|| panic!("node-{node}: no service {svc_id} for {proto:?} {vip}"));
        assert!(
            svc.slice_len > 0,
            "node-{node}: service {svc_id} ({proto:?} {vip}) has an empty slice"
        );
        let slice: Vec<u32> = (svc.slice_start..svc.slice_start + svc.slice_len)
            .map(|i| {
                let s: Option<rv_maglev_slot> = maps.maglev_table.get(&i).expect("maglev_table");
                s.map_or(0, |s| s.backend_id)
            })
            .collect();
        let ids: BTreeSet<u32> = slice.iter().copied().filter(|&id| id != 0).collect();
        let backends = ids
            .into_iter()
            .map(|id| {
                let addr = if vip.is_ipv6() {
                    let b: Option<rv_backend6> = maps.backend_map6.get(&id).expect("backend_map6");
                    b.map(|b| IpAddr::V6(ipv6_from_be32x4(b.addr)))
                } else {
                    let b: Option<rv_backend> = maps.backend_map.get(&id).expect("backend_map");
                    b.map(|b| IpAddr::V4(ipv4_from_be32(b.addr)))
                };
                let h: Option<rv_backend_health> = maps
                    .backend_health_map
                    .get(&id)
                    .expect("backend_health_map");
                let healthy =
                    h.is_some_and(|h| u32::from(h.state) == rv_health::RV_HEALTH_HEALTHY.0);
                (id, (addr, healthy))
            })
            .collect();
        Self {
            lab,
            maps,
            node,
            vip,
            proto,
            svc_id,
            svc,
            slice,
            backends,
        }
    }

    /// The pod backend `id` of the slice is, by its address.
    pub fn pod_of(&self, id: u32) -> Option<&'a Pod> {
        let lab = self.lab;
        self.backends
            .get(&id)
            .and_then(|(a, _)| *a)
            .and_then(|a| lab.pod_at(a))
    }

    /// The backend a new flow from `client` gets: the slot its flow hash
    /// names in the service's slice, or the first healthy one of the
    /// [`MAGLEV_PROBES`] from there. None: no backend (a counted drop).
    pub fn pick(&self, client: SocketAddr) -> Option<u32> {
        let len = self.slice.len();
        let hash = flow_hash(
            client.ip(),
            client.port(),
            self.vip.port(),
            proto_number(self.proto),
            false,
        ) as usize;
        (0..MAGLEV_PROBES as usize)
            .map(|k| self.slice[(hash % len + k) % len])
            .find(|id| self.backends.get(id).is_some_and(|(_, healthy)| *healthy))
    }

    /// The pod [`FlowTable::pick`] names, if any.
    pub fn pick_pod(&self, client: SocketAddr) -> Option<&'a Pod> {
        self.pick(client).and_then(|id| self.pod_of(id))
    }

    /// The entry the flow from `client` left in `connection_affinity_map`
    /// (or its IPv6 twin), read now.
    pub fn affinity(&self, client: SocketAddr) -> Option<rv_affinity_value> {
        let p = proto_number(self.proto);
        match client.ip() {
            IpAddr::V4(a) => self.maps.connection_affinity_map.get(&rv_flow_key {
                svc_id: self.svc_id,
                saddr: be32(a),
                sport: be16(client.port()),
                dport: be16(self.vip.port()),
                proto: p,
                ..Default::default()
            }),
            IpAddr::V6(a) => self.maps.connection_affinity_map6.get(&rv_flow6_key {
                svc_id: self.svc_id,
                saddr: be32x4(a),
                sport: be16(client.port()),
                dport: be16(self.vip.port()),
                proto: p,
                ..Default::default()
            }),
        }
        .expect("connection_affinity_map")
    }
}

pub fn proto_number(p: Proto) -> u8 {
    match p {
        Proto::Tcp => PROTO_TCP,
        Proto::Udp => PROTO_UDP,
    }
}

/// The VIPs `rd` serves on `addrs`, by name (`tcp/10.0.0.1:80`): the
/// targets of weight above zero. Every rivorad watches every namespace,
/// so it also programs the other tests' Services, on their labs' VIPs.
fn serving(rd: &Rivorad, addrs: &[IpAddr]) -> BTreeMap<String, BTreeSet<String>> {
    let list = rd.ctl_json(&["vip", "list"]);
    let Some(list) = list.as_array() else {
        return BTreeMap::new();
    };
    list.iter()
        .filter(|v| {
            v["addr"]
                .as_str()
                .and_then(|a| a.parse::<IpAddr>().ok())
                .is_some_and(|a| addrs.contains(&a))
        })
        .filter_map(|v| {
            let name = v["vip"].as_str()?.to_string();
            let targets = v["backends"]
                .as_array()
                .map(|bs| {
                    bs.iter()
                        .filter(|b| b["weight"].as_u64().is_some_and(|w| w > 0))
                        .filter_map(|b| b["target"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            Some((name, targets))
        })
        .collect()
}
