//! Shared test harness: the real BPF objects loaded into a private pin
//! directory, packets run through BPF_PROG_TEST_RUN, maps filled and read
//! through the dataplane's typed map access.
#![allow(dead_code)]

pub mod apiserver;
pub mod bgp;
pub mod chart;
pub mod controller;
pub mod ecmp;
pub mod fixture;
pub mod k8s;
pub mod lab;
pub mod layouts;
pub mod multinode;
pub mod netns;
pub use rivora_testlab::require;
pub mod rivorad;
pub mod topology;
pub mod traffic;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use libbpf_rs::ProgramInput;
use rivora::abi::{self, *};
use rivora::dataplane::{Datapath, LoadOptions, Maps};

pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;
pub const TCX_NEXT: i32 = -1;
pub const TCX_PASS: i32 = 0;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// ingress_ifindex of a BPF_PROG_TEST_RUN without a context: loopback.
pub const TEST_RUN_IFINDEX: u32 = 1;

pub use rivora_testlab::unique;

/// The loaded datapath in its own pin directory, removed on drop (also
/// when the test panics).
pub struct TestDp {
    pub dp: Datapath,
    pub maps: Maps,
    pub pin_dir: PathBuf,
}

impl TestDp {
    pub fn new() -> Self {
        Self::with_maglev_size(abi::MAGLEV_DEFAULT_SIZE)
    }

    pub fn with_maglev_size(maglev_size: u32) -> Self {
        Self::with_options(LoadOptions {
            maglev_size,
            ..Default::default()
        })
    }

    /// Loaded with `opts`, into a pin directory of its own (whatever
    /// `opts.pin_dir` says).
    pub fn with_options(opts: LoadOptions) -> Self {
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/{}", unique("rivora-test-")));
        let opts = LoadOptions {
            pin_dir: pin_dir.clone(),
            ..opts
        };
        let dp = match Datapath::load(&opts) {
            Ok(dp) => dp,
            Err(e) => {
                let _ = Datapath::unpin_all(&pin_dir);
                panic!("loading the datapath: {e}");
            }
        };
        let maps = Maps::open(&pin_dir).expect("opening pinned maps");
        Self { dp, maps, pin_dir }
    }

    /// Run xdp_ingress once on `pkt`; returns the verdict and the packet
    /// as the program left it.
    pub fn run_xdp(&self, pkt: &[u8]) -> (u32, Vec<u8>) {
        run_prog(&self.dp.xdp().progs.xdp_ingress, pkt)
    }

    /// Run tc_nat once on `pkt`; returns the TCX verdict and the packet.
    pub fn run_tc(&self, pkt: &[u8]) -> (i32, Vec<u8>) {
        let (v, out) = run_prog(&self.dp.tc().progs.tc_nat, pkt);
        (v as i32, out)
    }

    pub fn drops(&self, reason: rv_drop_reason) -> u64 {
        self.maps
            .drop_stats_map
            .get_percpu::<u32, rv_drop_stats>(&reason.0)
            .expect("reading drop_stats_map")
            .iter()
            .map(|d| d.packets)
            .sum()
    }

    pub fn vip_stats(&self, svc_id: u32) -> rv_vip_stats {
        let per_cpu: Vec<rv_vip_stats> = self
            .maps
            .stats_map
            .get_percpu(&svc_id)
            .expect("reading stats_map");
        per_cpu.iter().fold(rv_vip_stats::default(), |mut a, s| {
            a.packets += s.packets;
            a.bytes += s.bytes;
            a.rate_limited += s.rate_limited;
            a.no_backend += s.no_backend;
            a
        })
    }

    /// Packets the VIP's source ranges kept out, every CPU's.
    pub fn source_refused(&self, svc_id: u32) -> u64 {
        let per_cpu: Vec<rv_source_refused> = self
            .maps
            .source_refused_map
            .get_percpu(&svc_id)
            .expect("reading source_refused_map");
        per_cpu.iter().map(|s| s.packets).sum()
    }

    // Direct map writes, for tests of the datapath alone.

    pub fn vip4(&self, addr: Ipv4Addr, port: u16, proto: u8, svc_id: u32) {
        let k = rv_vip_key {
            addr: be32(addr),
            port: be16(port),
            proto,
            pad: 0,
        };
        self.maps
            .vip_map
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_map");
    }

    pub fn vip6(&self, addr: Ipv6Addr, port: u16, proto: u8, svc_id: u32) {
        let k = rv_vip6_key {
            addr: be32x4(addr),
            port: be16(port),
            proto,
            pad: 0,
        };
        self.maps
            .vip_map6
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_map6");
    }

    /// A port-prefix entry in the v4 range trie: `port_bits` leading bits of `port`.
    pub fn vip4_range(&self, addr: Ipv4Addr, port: u16, port_bits: u32, proto: u8, svc_id: u32) {
        let k = rv_vip_range_key {
            prefixlen: 64 + port_bits,
            proto,
            addr: be32(addr),
            port: be16(port),
            ..Default::default()
        };
        self.maps
            .vip_range_map
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_range_map");
    }

    pub fn vip6_range(&self, addr: Ipv6Addr, port: u16, port_bits: u32, proto: u8, svc_id: u32) {
        let k = rv_vip_range6_key {
            prefixlen: 160 + port_bits,
            proto,
            addr: be32x4(addr),
            port: be16(port),
            ..Default::default()
        };
        self.maps
            .vip_range_map6
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_range_map6");
    }

    /// A service whose slice holds `slots` (backend ids) starting at `start`.
    pub fn service(
        &self,
        svc_id: u32,
        mode: rv_mode,
        family: rv_family,
        start: u32,
        slots: &[u32],
    ) {
        self.service_with(svc_id, start, slots, |s| {
            s.mode = mode.0 as u8;
            s.family = family.0 as u8;
        });
    }

    pub fn service_with(
        &self,
        svc_id: u32,
        start: u32,
        slots: &[u32],
        f: impl FnOnce(&mut rv_service),
    ) {
        for (i, b) in slots.iter().enumerate() {
            self.maps
                .maglev_table
                .put(&(start + i as u32), &rv_maglev_slot { backend_id: *b })
                .expect("maglev_table");
        }
        let mut s = rv_service {
            flags: rv_service_flags::RV_SVC_F_ACTIVE.0,
            slice_start: start,
            slice_len: slots.len() as u32,
            backend_count: {
                let mut ids = slots.to_vec();
                ids.sort();
                ids.dedup();
                ids.len() as u32
            },
            ..Default::default()
        };
        f(&mut s);
        self.maps
            .service_config_map
            .put(&svc_id, &s)
            .expect("service_config_map");
    }

    pub fn backend4(&self, id: u32, addr: Ipv4Addr, port: u16, mac: [u8; 6]) {
        let b = rv_backend {
            addr: be32(addr),
            port: be16(port),
            mac,
            ..Default::default()
        };
        self.maps.backend_map.put(&id, &b).expect("backend_map");
        self.health(id, rv_health::RV_HEALTH_HEALTHY);
    }

    pub fn backend6(&self, id: u32, addr: Ipv6Addr, port: u16, mac: [u8; 6]) {
        let b = rv_backend6 {
            addr: be32x4(addr),
            port: be16(port),
            mac,
            ..Default::default()
        };
        self.maps.backend_map6.put(&id, &b).expect("backend_map6");
        self.health(id, rv_health::RV_HEALTH_HEALTHY);
    }

    pub fn health(&self, id: u32, state: rv_health) {
        let h = rv_backend_health {
            state: state.0 as u8,
            ..Default::default()
        };
        self.maps
            .backend_health_map
            .put(&id, &h)
            .expect("backend_health_map");
    }

    pub fn iface_mac(&self, ifindex: u32, mac: [u8; 6]) {
        self.maps
            .iface_mac_map
            .put(
                &ifindex,
                &rv_iface_mac {
                    mac,
                    flags: 0,
                    pad: 0,
                },
            )
            .expect("iface_mac_map");
    }

    pub fn tunnel(&self, src4: Ipv4Addr, src6: Ipv6Addr) {
        let t = rv_tunnel_config {
            src4: be32(src4),
            src6: be32x4(src6),
        };
        self.maps
            .tunnel_config_map
            .put(&0u32, &t)
            .expect("tunnel_config_map");
    }

    pub fn node_rate_limit(&self, rate_per_sec: u32, burst: u32) {
        let c = rv_rl_config {
            enabled: 1,
            rate_per_sec,
            burst,
            pad: 0,
        };
        self.maps
            .rl_config_map
            .put(&0u32, &c)
            .expect("rl_config_map");
    }

    pub fn svc_rate_limit(&self, svc_id: u32, rate_per_sec: u32, burst: u32) {
        let c = rv_rl_config {
            enabled: 1,
            rate_per_sec,
            burst,
            pad: 0,
        };
        self.maps
            .svc_rl_config_map
            .put(&svc_id, &c)
            .expect("svc_rl_config_map");
    }
}

impl Drop for TestDp {
    fn drop(&mut self) {
        let _ = Datapath::unpin_all(&self.pin_dir);
    }
}

pub fn run_prog(prog: &libbpf_rs::ProgramMut<'_>, pkt: &[u8]) -> (u32, Vec<u8>) {
    // Room for an outer header pushed in front (L3 DSR) or a grown packet.
    let mut out = vec![0u8; pkt.len() + 256];
    let input = ProgramInput {
        data_in: Some(pkt),
        data_out: Some(&mut out),
        ..Default::default()
    };
    let output = prog.test_run(input).expect("BPF_PROG_TEST_RUN");
    let len = output.data.as_ref().map(|d| d.len()).unwrap_or(0);
    let verdict = output.return_value;
    out.truncate(len);
    (verdict, out)
}

// Packet fixtures for fragments, ICMP errors and backend selection
// (tests/packets/frag_icmp.rs, tests/packets/lb.rs).

/// The datapath's flow hash (bpf/lib/hash.h: MurmurHash3 over whole
/// words, seed "RIVR"), written again from its description so the tests
/// can predict a Maglev slot, an IPIP id or an IPv6 flow label without
/// asking the program. Ports are host order here; the program mixes them
/// as the `__be16` words it reads.
pub fn flow_hash(
    client: std::net::IpAddr,
    sport: u16,
    dport: u16,
    proto: u8,
    addr_only: bool,
) -> u32 {
    fn mix(h: u32, k: u32) -> u32 {
        let k = k
            .wrapping_mul(0xcc9e_2d51)
            .rotate_left(15)
            .wrapping_mul(0x1b87_3593);
        (h ^ k)
            .rotate_left(13)
            .wrapping_mul(5)
            .wrapping_add(0xe654_6b64)
    }
    let mut h = 0x5249_5652u32;
    let mut len = match client {
        std::net::IpAddr::V4(a) => {
            h = mix(h, be32(a));
            4
        }
        std::net::IpAddr::V6(a) => {
            for w in be32x4(a) {
                h = mix(h, w);
            }
            16
        }
    };
    if !addr_only {
        h = mix(h, (u32::from(be16(sport)) << 16) | u32::from(be16(dport)));
        h = mix(h, u32::from(proto));
        len += 8;
    }
    h ^= len;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The outer flow label of an IPv6 L3 DSR tunnel (bpf/lib/hash.h,
/// `rv_flow_label`), written again from its description: the tuple's words
/// as the program reads them, folded by XOR, times 0x9e3779b1, top 20 bits.
/// Later fragments carry no ports: the program passes 0 for ports and
/// protocol.
pub fn flow_label(client: std::net::IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
    let words = match client {
        std::net::IpAddr::V4(a) => [be32(a), 0, 0, 0],
        std::net::IpAddr::V6(a) => be32x4(a),
    };
    let h = words.iter().fold(0u32, |h, w| h ^ w)
        ^ ((u32::from(be16(sport)) << 16) | u32::from(be16(dport)))
        ^ u32::from(proto);
    h.wrapping_mul(0x9e37_79b1) >> 12
}

/// bpf_ktime_get_coarse_ns(): CLOCK_MONOTONIC_COARSE, for writing
/// timestamps the datapath compares against (affinity last_seen_ns,
/// bucket last_ns).
pub fn ktime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; the clock always exists.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Packet fixtures shared by the packet suites (`tests/packets/`: shapes,
/// modes): frames composed from etherparse's header types (which
/// compute lengths and checksums independently of the datapath), checksum
/// checks of any output frame, runs that report kernel refusals instead of
/// panicking, and Katran-style fixture cases.
pub mod fixtures {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use etherparse::{
        EtherType, Ethernet2Header, Ethernet2HeaderSlice, IpNumber, Ipv4Header, Ipv4HeaderSlice,
        Ipv6FlowLabel, Ipv6Header, Ipv6HeaderSlice, Ipv6RawExtHeader, Ipv6RawExtHeaderSlice,
        SingleVlanHeader, SingleVlanHeaderSlice, TcpHeader, TcpSlice, UdpHeader, UdpSlice, VlanId,
        VlanPcp,
    };
    use libbpf_rs::ProgramInput;
    use rivora::abi::{self, *};

    use super::{TestDp, XDP_DROP};

    pub const IPPROTO_HOPOPTS: u8 = 0;
    pub const IPPROTO_ROUTING: u8 = 43;
    pub const IPPROTO_DSTOPTS: u8 = 60;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Vlan {
        None,
        /// One 802.1Q tag.
        Dot1q(u16),
        /// 802.1ad outer tag (S-tag), 802.1Q inner tag (C-tag).
        QinQ(u16, u16),
    }

    impl Vlan {
        pub fn len(self) -> usize {
            match self {
                Vlan::None => 0,
                Vlan::Dot1q(_) => 4,
                Vlan::QinQ(..) => 8,
            }
        }
    }

    #[derive(Clone, Debug)]
    pub enum Net {
        V4 {
            src: Ipv4Addr,
            dst: Ipv4Addr,
            ttl: u8,
            id: u16,
            df: bool,
            /// IPv4 options, a multiple of 4 bytes (IHL = 5 + len / 4).
            options: Vec<u8>,
        },
        V6 {
            src: Ipv6Addr,
            dst: Ipv6Addr,
            hop_limit: u8,
            flow_label: u32,
            /// Extension headers in order: (kind, body after the next-header
            /// and length bytes; 6 + 8n bytes).
            exts: Vec<(u8, Vec<u8>)>,
        },
    }

    #[derive(Clone, Debug)]
    pub enum L4 {
        Tcp {
            sport: u16,
            dport: u16,
            syn: bool,
            ack: Option<u32>,
            fin: bool,
            rst: bool,
            /// Raw TCP options, a multiple of 4 bytes.
            options: Vec<u8>,
        },
        Udp {
            sport: u16,
            dport: u16,
            /// IPv4 only: send without a checksum (0).
            zero_csum: bool,
        },
    }

    /// One frame, described field by field; `build` writes it with
    /// etherparse's headers.
    #[derive(Clone, Debug)]
    pub struct Frame {
        pub src_mac: [u8; 6],
        pub dst_mac: [u8; 6],
        pub vlan: Vlan,
        pub net: Net,
        pub l4: L4,
        pub payload: Vec<u8>,
    }

    pub const MAC_PEER: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 0x01];
    pub const MAC_LB: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0x01];

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().expect("IPv4 literal")
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().expect("IPv6 literal")
    }

    impl Frame {
        fn new(net: Net, l4: L4) -> Self {
            Self {
                src_mac: MAC_PEER,
                dst_mac: MAC_LB,
                vlan: Vlan::None,
                net,
                l4,
                payload: b"rivora".to_vec(),
            }
        }

        fn net4(src: &str, dst: &str) -> Net {
            Net::V4 {
                src: v4(src),
                dst: v4(dst),
                ttl: 64,
                id: 0x1234,
                df: true,
                options: Vec::new(),
            }
        }

        fn net6(src: &str, dst: &str) -> Net {
            Net::V6 {
                src: v6(src),
                dst: v6(dst),
                hop_limit: 64,
                flow_label: 0x12345,
                exts: Vec::new(),
            }
        }

        fn tcp(sport: u16, dport: u16) -> L4 {
            L4::Tcp {
                sport,
                dport,
                syn: true,
                ack: None,
                fin: false,
                rst: false,
                options: Vec::new(),
            }
        }

        fn udp(sport: u16, dport: u16) -> L4 {
            L4::Udp {
                sport,
                dport,
                zero_csum: false,
            }
        }

        /// A TCP SYN over IPv4.
        pub fn tcp4(src: &str, sport: u16, dst: &str, dport: u16) -> Self {
            Self::new(Self::net4(src, dst), Self::tcp(sport, dport))
        }

        pub fn udp4(src: &str, sport: u16, dst: &str, dport: u16) -> Self {
            Self::new(Self::net4(src, dst), Self::udp(sport, dport))
        }

        /// A TCP SYN over IPv6.
        pub fn tcp6(src: &str, sport: u16, dst: &str, dport: u16) -> Self {
            Self::new(Self::net6(src, dst), Self::tcp(sport, dport))
        }

        pub fn udp6(src: &str, sport: u16, dst: &str, dport: u16) -> Self {
            Self::new(Self::net6(src, dst), Self::udp(sport, dport))
        }

        pub fn vlan(mut self, vlan: Vlan) -> Self {
            self.vlan = vlan;
            self
        }

        pub fn macs(mut self, src: [u8; 6], dst: [u8; 6]) -> Self {
            self.src_mac = src;
            self.dst_mac = dst;
            self
        }

        pub fn payload(mut self, p: &[u8]) -> Self {
            self.payload = p.to_vec();
            self
        }

        pub fn ipv4_options(mut self, opts: &[u8]) -> Self {
            if let Net::V4 { options, .. } = &mut self.net {
                *options = opts.to_vec();
            }
            self
        }

        pub fn ipv6_exts(mut self, list: &[(u8, Vec<u8>)]) -> Self {
            if let Net::V6 { exts, .. } = &mut self.net {
                *exts = list.to_vec();
            }
            self
        }

        /// IPv4 TTL or IPv6 hop limit.
        pub fn ttl(mut self, n: u8) -> Self {
            match &mut self.net {
                Net::V4 { ttl, .. } => *ttl = n,
                Net::V6 { hop_limit, .. } => *hop_limit = n,
            }
            self
        }

        /// IPv4 identification (IPv6: no such field, unchanged).
        pub fn ip_id(mut self, n: u16) -> Self {
            if let Net::V4 { id, .. } = &mut self.net {
                *id = n;
            }
            self
        }

        pub fn tcp_options(mut self, opts: &[u8]) -> Self {
            if let L4::Tcp { options, .. } = &mut self.l4 {
                *options = opts.to_vec();
            }
            self
        }

        /// A TCP segment with ACK set and SYN clear (an established flow).
        pub fn established(mut self, ack_no: u32) -> Self {
            if let L4::Tcp { syn, ack, .. } = &mut self.l4 {
                *syn = false;
                *ack = Some(ack_no);
            }
            self
        }

        /// A TCP segment with FIN (and ACK) set, SYN clear.
        pub fn fin(mut self) -> Self {
            if let L4::Tcp { syn, ack, fin, .. } = &mut self.l4 {
                *syn = false;
                *fin = true;
                ack.get_or_insert(1);
            }
            self
        }

        /// A TCP segment with RST set, SYN clear.
        pub fn rst(mut self) -> Self {
            if let L4::Tcp { syn, rst, .. } = &mut self.l4 {
                *syn = false;
                *rst = true;
            }
            self
        }

        pub fn udp_zero_csum(mut self) -> Self {
            if let L4::Udp { zero_csum, .. } = &mut self.l4 {
                *zero_csum = true;
            }
            self
        }

        /// The same frame with another destination (what a NAT must produce).
        pub fn to(mut self, addr: IpAddr, port: u16) -> Self {
            match (&mut self.net, addr) {
                (Net::V4 { dst, .. }, IpAddr::V4(a)) => *dst = a,
                (Net::V6 { dst, .. }, IpAddr::V6(a)) => *dst = a,
                _ => panic!("address family mismatch"),
            }
            match &mut self.l4 {
                L4::Tcp { dport, .. } | L4::Udp { dport, .. } => *dport = port,
            }
            self
        }

        /// The same frame with another source (what a reverse NAT must produce).
        pub fn from(mut self, addr: IpAddr, port: u16) -> Self {
            match (&mut self.net, addr) {
                (Net::V4 { src, .. }, IpAddr::V4(a)) => *src = a,
                (Net::V6 { src, .. }, IpAddr::V6(a)) => *src = a,
                _ => panic!("address family mismatch"),
            }
            match &mut self.l4 {
                L4::Tcp { sport, .. } | L4::Udp { sport, .. } => *sport = port,
            }
            self
        }

        /// The reply a backend sends to this request: addresses, ports and
        /// MACs swapped, a SYN turned into a SYN-ACK.
        pub fn reply(&self) -> Self {
            let mut r = self.clone();
            r.src_mac = self.dst_mac;
            r.dst_mac = self.src_mac;
            match &mut r.net {
                Net::V4 { src, dst, .. } => std::mem::swap(src, dst),
                Net::V6 { src, dst, .. } => std::mem::swap(src, dst),
            }
            match &mut r.l4 {
                L4::Tcp {
                    sport, dport, ack, ..
                } => {
                    std::mem::swap(sport, dport);
                    *ack = Some(2);
                }
                L4::Udp { sport, dport, .. } => std::mem::swap(sport, dport),
            }
            r.payload = b"reply".to_vec();
            r
        }

        pub fn src_ip(&self) -> IpAddr {
            match &self.net {
                Net::V4 { src, .. } => IpAddr::V4(*src),
                Net::V6 { src, .. } => IpAddr::V6(*src),
            }
        }

        pub fn dst_ip(&self) -> IpAddr {
            match &self.net {
                Net::V4 { dst, .. } => IpAddr::V4(*dst),
                Net::V6 { dst, .. } => IpAddr::V6(*dst),
            }
        }

        pub fn sport(&self) -> u16 {
            match &self.l4 {
                L4::Tcp { sport, .. } | L4::Udp { sport, .. } => *sport,
            }
        }

        pub fn dport(&self) -> u16 {
            match &self.l4 {
                L4::Tcp { dport, .. } | L4::Udp { dport, .. } => *dport,
            }
        }

        pub fn proto(&self) -> u8 {
            match &self.l4 {
                L4::Tcp { .. } => super::PROTO_TCP,
                L4::Udp { .. } => super::PROTO_UDP,
            }
        }

        /// Offset of the IP header.
        pub fn l3_off(&self) -> usize {
            14 + self.vlan.len()
        }

        /// Length of the IP header and its options or extension headers.
        pub fn l3_len(&self) -> usize {
            match &self.net {
                Net::V4 { options, .. } => 20 + options.len(),
                Net::V6 { exts, .. } => 40 + exts.iter().map(|e| 2 + e.1.len()).sum::<usize>(),
            }
        }

        pub fn l4_off(&self) -> usize {
            self.l3_off() + self.l3_len()
        }

        /// Length of the L4 header (TCP options included).
        pub fn l4_len(&self) -> usize {
            match &self.l4 {
                L4::Tcp { options, .. } => 20 + options.len(),
                L4::Udp { .. } => 8,
            }
        }

        pub fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            let ip_type = match self.net {
                Net::V4 { .. } => EtherType::IPV4,
                Net::V6 { .. } => EtherType::IPV6,
            };
            let tag = |id: u16, ether_type: EtherType| SingleVlanHeader {
                pcp: VlanPcp::ZERO,
                drop_eligible_indicator: false,
                vlan_id: VlanId::try_new(id).expect("VLAN id"),
                ether_type,
            };
            let eth = Ethernet2Header {
                source: self.src_mac,
                destination: self.dst_mac,
                ether_type: match self.vlan {
                    Vlan::None => ip_type,
                    Vlan::Dot1q(_) => EtherType::VLAN_TAGGED_FRAME,
                    Vlan::QinQ(..) => EtherType::PROVIDER_BRIDGING,
                },
            };
            eth.write(&mut out).expect("ethernet");
            match self.vlan {
                Vlan::None => {}
                Vlan::Dot1q(id) => tag(id, ip_type).write(&mut out).expect("tag"),
                Vlan::QinQ(outer, inner) => {
                    tag(outer, EtherType::VLAN_TAGGED_FRAME)
                        .write(&mut out)
                        .expect("outer tag");
                    tag(inner, ip_type).write(&mut out).expect("inner tag");
                }
            }

            let (sport, dport) = (self.sport(), self.dport());
            let mut tcp = TcpHeader::new(sport, dport, 1000, 64240);
            let mut udp = UdpHeader {
                source_port: sport,
                destination_port: dport,
                length: (8 + self.payload.len()) as u16,
                checksum: 0,
            };
            if let L4::Tcp {
                syn,
                ack,
                fin,
                rst,
                options,
                ..
            } = &self.l4
            {
                tcp.syn = *syn;
                tcp.fin = *fin;
                tcp.rst = *rst;
                if let Some(a) = ack {
                    tcp.ack = true;
                    tcp.acknowledgment_number = *a;
                }
                tcp.set_options_raw(options).expect("TCP options");
            }
            let l4_total = self.l4_len() + self.payload.len();
            let proto = IpNumber(self.proto());

            match &self.net {
                Net::V4 {
                    src,
                    dst,
                    ttl,
                    id,
                    df,
                    options,
                } => {
                    let mut ip = Ipv4Header::new(0, *ttl, proto, src.octets(), dst.octets())
                        .expect("IPv4 header");
                    ip.identification = *id;
                    ip.dont_fragment = *df;
                    ip.options = options[..].try_into().expect("IPv4 options");
                    ip.set_payload_len(l4_total).expect("IPv4 length");
                    ip.header_checksum = ip.calc_header_checksum();
                    ip.write(&mut out).expect("IPv4");
                    match &self.l4 {
                        L4::Tcp { .. } => {
                            tcp.checksum =
                                tcp.calc_checksum_ipv4(&ip, &self.payload).expect("csum");
                            tcp.write(&mut out).expect("TCP");
                        }
                        L4::Udp { zero_csum, .. } => {
                            if !zero_csum {
                                udp.checksum =
                                    udp.calc_checksum_ipv4(&ip, &self.payload).expect("csum");
                            }
                            udp.write(&mut out).expect("UDP");
                        }
                    }
                }
                Net::V6 {
                    src,
                    dst,
                    hop_limit,
                    flow_label,
                    exts,
                } => {
                    let ext_len: usize = exts.iter().map(|e| 2 + e.1.len()).sum();
                    let ip = Ipv6Header {
                        traffic_class: 0,
                        flow_label: Ipv6FlowLabel::try_new(*flow_label).expect("flow label"),
                        payload_length: (ext_len + l4_total) as u16,
                        next_header: exts.first().map(|e| IpNumber(e.0)).unwrap_or(proto),
                        hop_limit: *hop_limit,
                        source: src.octets(),
                        destination: dst.octets(),
                    };
                    ip.write(&mut out).expect("IPv6");
                    for (i, (_, body)) in exts.iter().enumerate() {
                        let next = exts.get(i + 1).map(|e| IpNumber(e.0)).unwrap_or(proto);
                        Ipv6RawExtHeader::new_raw(next, body)
                            .expect("extension header")
                            .write(&mut out)
                            .expect("extension header");
                    }
                    match &self.l4 {
                        L4::Tcp { .. } => {
                            tcp.checksum =
                                tcp.calc_checksum_ipv6(&ip, &self.payload).expect("csum");
                            tcp.write(&mut out).expect("TCP");
                        }
                        L4::Udp { .. } => {
                            udp.checksum =
                                udp.calc_checksum_ipv6(&ip, &self.payload).expect("csum");
                            udp.write(&mut out).expect("UDP");
                        }
                    }
                }
            }
            out.extend_from_slice(&self.payload);
            out
        }
    }

    /// An extension header body of the minimum size: a PadN option
    /// (Hop-by-Hop, Destination Options) or routing type 253 (RFC 4727,
    /// experimental) with no segments left.
    pub fn ext(kind: u8) -> (u8, Vec<u8>) {
        match kind {
            IPPROTO_ROUTING => (kind, vec![253, 0, 0, 0, 0, 0]),
            _ => (kind, vec![1, 4, 0, 0, 0, 0]),
        }
    }

    /// Check every checksum in a frame with etherparse's calculators:
    /// IPv4 header, TCP and UDP (over IPv4 or IPv6, stepping over any
    /// IPv6 extension headers), and the inner packet of IPIP or
    /// IPv6-in-IPv6. Returns how many checksums were verified.
    pub fn assert_checksums(frame: &[u8]) -> usize {
        let eth = Ethernet2HeaderSlice::from_slice(frame).expect("Ethernet header");
        let mut et = eth.ether_type();
        let mut off = 14;
        while et == EtherType::VLAN_TAGGED_FRAME || et == EtherType::PROVIDER_BRIDGING {
            let tag = SingleVlanHeaderSlice::from_slice(&frame[off..]).expect("VLAN tag");
            et = tag.ether_type();
            off += 4;
        }
        match et {
            EtherType::IPV4 => check_ipv4(&frame[off..]),
            EtherType::IPV6 => check_ipv6(&frame[off..]),
            other => panic!("no IP in frame (EtherType {other:?})"),
        }
    }

    fn check_ipv4(ip: &[u8]) -> usize {
        let h = Ipv4HeaderSlice::from_slice(ip).expect("IPv4 header");
        assert_eq!(
            h.to_header().calc_header_checksum(),
            h.header_checksum(),
            "IPv4 header checksum"
        );
        let body = &ip[h.slice().len()..usize::from(h.total_len())];
        let (src, dst) = (h.source(), h.destination());
        1 + match h.protocol().0 {
            4 => check_ipv4(body),
            6 => {
                let t = TcpSlice::from_slice(body).expect("TCP header");
                assert_eq!(
                    t.calc_checksum_ipv4(src, dst).expect("TCP csum"),
                    t.checksum(),
                    "TCP checksum (IPv4)"
                );
                1
            }
            17 => {
                let u = UdpSlice::from_slice(body).expect("UDP header");
                if u.checksum() == 0 {
                    return 1; // no checksum: allowed over IPv4
                }
                let want = u
                    .to_header()
                    .calc_checksum_ipv4_raw(src, dst, u.payload())
                    .expect("UDP csum");
                assert_eq!(want, u.checksum(), "UDP checksum (IPv4)");
                1
            }
            _ => 0,
        }
    }

    fn check_ipv6(ip: &[u8]) -> usize {
        let h = Ipv6HeaderSlice::from_slice(ip).expect("IPv6 header");
        let end = 40 + usize::from(h.payload_length());
        let (src, dst) = (h.source(), h.destination());
        let mut nh = h.next_header().0;
        let mut off = 40;
        while matches!(nh, IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS) {
            let e = Ipv6RawExtHeaderSlice::from_slice(&ip[off..end]).expect("extension header");
            nh = e.next_header().0;
            off += e.slice().len();
        }
        let body = &ip[off..end];
        match nh {
            41 => check_ipv6(body),
            6 => {
                let t = TcpSlice::from_slice(body).expect("TCP header");
                assert_eq!(
                    t.calc_checksum_ipv6(src, dst).expect("TCP csum"),
                    t.checksum(),
                    "TCP checksum (IPv6)"
                );
                1
            }
            17 => {
                let u = UdpSlice::from_slice(body).expect("UDP header");
                let want = u
                    .to_header()
                    .calc_checksum_ipv6_raw(src, dst, u.payload())
                    .expect("UDP csum");
                assert_eq!(want, u.checksum(), "UDP checksum (IPv6)");
                1
            }
            _ => 0,
        }
    }

    /// Byte-exact comparison that names the first differing offset.
    pub fn assert_bytes(desc: &str, got: &[u8], want: &[u8]) {
        if got == want {
            return;
        }
        let first = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{desc}: output differs at byte {first} (got {} bytes, want {})\n got: {:02x?}\nwant: {:02x?}",
            got.len(),
            want.len(),
            got,
            want
        );
    }

    /// struct xdp_md for BPF_PROG_TEST_RUN: data, data_end, data_meta,
    /// ingress_ifindex, rx_queue_index, egress_ifindex. data_end must be
    /// the packet length (all zeros silently runs nothing useful).
    pub fn xdp_md(len: usize, ingress_ifindex: u32) -> [u8; 24] {
        let mut md = [0u8; 24];
        md[4..8].copy_from_slice(&(len as u32).to_ne_bytes());
        md[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
        md
    }

    /// xdp_ingress once, returning the kernel's refusal as an error
    /// rather than panicking; `ctx` is an optional struct xdp_md.
    pub fn try_run_xdp(
        t: &TestDp,
        pkt: &[u8],
        ctx: Option<&mut [u8]>,
    ) -> Result<(u32, Vec<u8>), libbpf_rs::Error> {
        let mut out = vec![0u8; pkt.len() + 256];
        let input = ProgramInput {
            context_in: ctx,
            data_in: Some(pkt),
            data_out: Some(&mut out),
            ..Default::default()
        };
        let output = t.dp.xdp().progs.xdp_ingress.test_run(input)?;
        let len = output.data.as_ref().map(|d| d.len()).unwrap_or(0);
        let verdict = output.return_value;
        out.truncate(len);
        Ok((verdict, out))
    }

    /// Every drop reason's count, in `drop_stats_map` order.
    pub fn drop_counts(t: &TestDp) -> Vec<u64> {
        DROP_REASONS.iter().map(|r| t.drops(*r)).collect()
    }

    /// The drop counters that moved between two snapshots, by label.
    pub fn drop_delta(before: &[u64], after: &[u64]) -> Vec<(&'static str, u64)> {
        DROP_REASONS
            .iter()
            .zip(before.iter().zip(after))
            .filter(|(_, (b, a))| a != b)
            .map(|(r, (b, a))| (abi::drop_reason_label(*r).unwrap_or("?"), a - b))
            .collect()
    }

    pub fn label(r: rv_drop_reason) -> &'static str {
        abi::drop_reason_label(r).unwrap_or("?")
    }

    // Services, backends and the map state a forwarded flow leaves.

    /// A backend as the tests program it.
    #[derive(Clone, Copy)]
    pub struct Be {
        pub id: u32,
        pub addr: IpAddr,
        /// 0: keep the VIP's port.
        pub port: u16,
        pub mac: [u8; 6],
    }

    pub fn ip(s: &str) -> IpAddr {
        s.parse().expect("address literal")
    }

    pub fn be_mac(id: u32) -> [u8; 6] {
        [0x02, 0xbe, 0, 0, 0, id as u8]
    }

    /// Program a service with a single backend: VIP entry (exact, unless the
    /// caller adds range entries itself), backend, health and a 7-slot slice.
    pub fn add_service(
        t: &TestDp,
        svc: u32,
        mode: rv_mode,
        vip: Option<(IpAddr, u16, u8)>,
        be: Be,
    ) {
        let family = match be.addr {
            IpAddr::V4(a) => {
                t.backend4(be.id, a, be.port, be.mac);
                rv_family::RV_FAMILY_V4
            }
            IpAddr::V6(a) => {
                t.backend6(be.id, a, be.port, be.mac);
                rv_family::RV_FAMILY_V6
            }
        };
        match vip {
            Some((IpAddr::V4(a), port, proto)) => t.vip4(a, port, proto, svc),
            Some((IpAddr::V6(a), port, proto)) => t.vip6(a, port, proto, svc),
            None => {}
        }
        t.service(svc, mode, family, svc * 8, &[be.id; 7]);
    }

    /// What NAT must make of `f`: destination rewritten to the backend (its
    /// port, or the VIP's when the backend's is 0), everything else kept.
    pub fn nat_of(f: &Frame, be: &Be) -> Frame {
        let port = if be.port == 0 { f.dport() } else { be.port };
        f.clone().to(be.addr, port)
    }

    /// The nat_owner_map{,6} entry for a backend's (address, port, proto).
    pub fn nat_owner(t: &TestDp, addr: IpAddr, port: u16, proto: u8) -> Option<rv_nat_owner> {
        match addr {
            IpAddr::V4(a) => t
                .maps
                .nat_owner_map
                .get(&rv_nat_owner_key {
                    backend_addr: be32(a),
                    backend_port: be16(port),
                    proto,
                    pad: 0,
                })
                .expect("nat_owner_map"),
            IpAddr::V6(a) => t
                .maps
                .nat_owner_map6
                .get(&rv_nat_owner6_key {
                    backend_addr: be32x4(a),
                    backend_port: be16(port),
                    proto,
                    pad: 0,
                })
                .expect("nat_owner_map6"),
        }
    }

    /// What a NAT'd request leaves for tc_nat to translate its replies by:
    /// when service `svc` owns the backend's (address, port, proto), the
    /// owner entry names the VIP and the flow's own affinity entry names
    /// the backend (and no reverse entry is written: one insert per new
    /// flow); otherwise the nat_reverse_map entry keyed by the reply's
    /// (backend, client, ports, proto), holding the VIP and the service id.
    pub fn assert_nat_entry(t: &TestDp, desc: &str, f: &Frame, be: &Be, svc: u32) {
        let bport = if be.port == 0 { f.dport() } else { be.port };
        if let Some(o) = nat_owner(t, be.addr, bport, f.proto()).filter(|o| o.svc_id == svc) {
            let vip = match f.dst_ip() {
                IpAddr::V4(_) => IpAddr::V4(ipv4_from_be32(o.vip_addr[0])),
                IpAddr::V6(_) => IpAddr::V6(ipv6_from_be32x4(o.vip_addr)),
            };
            assert_eq!(vip, f.dst_ip(), "{desc}: owner's VIP");
            assert_eq!(
                port_from_be16(o.vip_port),
                f.dport(),
                "{desc}: owner's port"
            );
            assert_eq!(
                affinity_of(t, svc, f),
                Some(o.backend_id),
                "{desc}: the flow's affinity entry names the owner's backend"
            );
            assert!(
                !has_nat_reverse(t, f, be.addr, bport),
                "{desc}: an owned flow writes no nat_reverse_map entry"
            );
            return;
        }
        match (f.src_ip(), f.dst_ip(), be.addr) {
            (IpAddr::V4(c), IpAddr::V4(vip), IpAddr::V4(b)) => {
                let k = rv_nat_key {
                    backend_addr: be32(b),
                    client_addr: be32(c),
                    backend_port: be16(bport),
                    client_port: be16(f.sport()),
                    proto: f.proto(),
                    ..Default::default()
                };
                let v: rv_nat_value = t
                    .maps
                    .nat_reverse_map
                    .get(&k)
                    .expect("nat_reverse_map")
                    .unwrap_or_else(|| panic!("{desc}: no nat_reverse_map entry"));
                assert_eq!(ipv4_from_be32(v.vip_addr), vip, "{desc}: NAT VIP");
                assert_eq!(port_from_be16(v.vip_port), f.dport(), "{desc}: NAT port");
                assert_eq!(v.svc_id, svc, "{desc}: NAT service");
            }
            (IpAddr::V6(c), IpAddr::V6(vip), IpAddr::V6(b)) => {
                let k = rv_nat6_key {
                    backend_addr: be32x4(b),
                    client_addr: be32x4(c),
                    backend_port: be16(bport),
                    client_port: be16(f.sport()),
                    proto: f.proto(),
                    ..Default::default()
                };
                let v: rv_nat6_value = t
                    .maps
                    .nat_reverse_map6
                    .get(&k)
                    .expect("nat_reverse_map6")
                    .unwrap_or_else(|| panic!("{desc}: no nat_reverse_map6 entry"));
                assert_eq!(ipv6_from_be32x4(v.vip_addr), vip, "{desc}: NAT VIP");
                assert_eq!(port_from_be16(v.vip_port), f.dport(), "{desc}: NAT port");
                assert_eq!(v.svc_id, svc, "{desc}: NAT service");
            }
            _ => panic!("{desc}: mixed address families"),
        }
    }

    /// Whether the flow left a nat_reverse_map{,6} entry.
    pub fn has_nat_reverse(t: &TestDp, f: &Frame, baddr: IpAddr, bport: u16) -> bool {
        match (f.src_ip(), baddr) {
            (IpAddr::V4(c), IpAddr::V4(b)) => t
                .maps
                .nat_reverse_map
                .get::<_, rv_nat_value>(&rv_nat_key {
                    backend_addr: be32(b),
                    client_addr: be32(c),
                    backend_port: be16(bport),
                    client_port: be16(f.sport()),
                    proto: f.proto(),
                    ..Default::default()
                })
                .expect("nat_reverse_map")
                .is_some(),
            (IpAddr::V6(c), IpAddr::V6(b)) => t
                .maps
                .nat_reverse_map6
                .get::<_, rv_nat6_value>(&rv_nat6_key {
                    backend_addr: be32x4(b),
                    client_addr: be32x4(c),
                    backend_port: be16(bport),
                    client_port: be16(f.sport()),
                    proto: f.proto(),
                    ..Default::default()
                })
                .expect("nat_reverse_map6")
                .is_some(),
            _ => false,
        }
    }

    /// The whole connection_affinity_map entry of the flow `f` belongs to
    /// (its 5-tuple as the client sent it), if any.
    pub fn affinity_entry(t: &TestDp, svc: u32, f: &Frame) -> Option<rv_affinity_value> {
        match f.src_ip() {
            IpAddr::V4(c) => t
                .maps
                .connection_affinity_map
                .get(&rv_flow_key {
                    svc_id: svc,
                    saddr: be32(c),
                    sport: be16(f.sport()),
                    dport: be16(f.dport()),
                    proto: f.proto(),
                    ..Default::default()
                })
                .expect("affinity"),
            IpAddr::V6(c) => t
                .maps
                .connection_affinity_map6
                .get(&rv_flow6_key {
                    svc_id: svc,
                    saddr: be32x4(c),
                    sport: be16(f.sport()),
                    dport: be16(f.dport()),
                    proto: f.proto(),
                    ..Default::default()
                })
                .expect("affinity6"),
        }
    }

    /// The connection_affinity_map entry for the flow, if any.
    pub fn affinity_of(t: &TestDp, svc: u32, f: &Frame) -> Option<u32> {
        match f.src_ip() {
            IpAddr::V4(c) => {
                let k = rv_flow_key {
                    svc_id: svc,
                    saddr: be32(c),
                    sport: be16(f.sport()),
                    dport: be16(f.dport()),
                    proto: f.proto(),
                    ..Default::default()
                };
                let v: Option<rv_affinity_value> =
                    t.maps.connection_affinity_map.get(&k).expect("affinity");
                v.map(|a| a.backend_id)
            }
            IpAddr::V6(c) => {
                let k = rv_flow6_key {
                    svc_id: svc,
                    saddr: be32x4(c),
                    sport: be16(f.sport()),
                    dport: be16(f.dport()),
                    proto: f.proto(),
                    ..Default::default()
                };
                let v: Option<rv_affinity_value> =
                    t.maps.connection_affinity_map6.get(&k).expect("affinity6");
                v.map(|a| a.backend_id)
            }
        }
    }

    /// NAT flows recorded for tc_nat either way: reverse entries, and the
    /// affinity entries of services that own a backend (their flows'
    /// proof, see lib/nat.h).
    pub fn nat_flows(t: &TestDp) -> usize {
        let owners: std::collections::BTreeSet<u32> = t
            .maps
            .nat_owner_map
            .entries::<rv_nat_owner_key, rv_nat_owner>()
            .expect("nat_owner_map")
            .into_iter()
            .map(|(_, o)| o.svc_id)
            .chain(
                t.maps
                    .nat_owner_map6
                    .entries::<rv_nat_owner6_key, rv_nat_owner>()
                    .expect("nat_owner_map6")
                    .into_iter()
                    .map(|(_, o)| o.svc_id),
            )
            .collect();
        let owned = t
            .maps
            .connection_affinity_map
            .keys::<rv_flow_key>()
            .iter()
            .filter(|k| owners.contains(&k.svc_id))
            .count()
            + t.maps
                .connection_affinity_map6
                .keys::<rv_flow6_key>()
                .iter()
                .filter(|k| owners.contains(&k.svc_id))
                .count();
        owned + nat_entries(t)
    }

    pub fn nat_entries(t: &TestDp) -> usize {
        t.maps.nat_reverse_map.keys::<rv_nat_key>().len()
            + t.maps.nat_reverse_map6.keys::<rv_nat6_key>().len()
    }

    /// A Katran-style fixture: what goes in, what must come out.
    pub struct Case {
        pub desc: String,
        pub input: Vec<u8>,
        pub want: Vec<u8>,
        pub verdict: u32,
        /// The one drop counter this case must move by one, if any.
        pub drop: Option<rv_drop_reason>,
    }

    impl Case {
        /// A packet that must come out exactly as it went in.
        pub fn untouched(desc: &str, input: Vec<u8>, verdict: u32) -> Self {
            Self {
                desc: desc.to_string(),
                want: input.clone(),
                input,
                verdict,
                drop: None,
            }
        }

        pub fn dropped(desc: &str, input: Vec<u8>, reason: rv_drop_reason) -> Self {
            Self {
                desc: desc.to_string(),
                want: input.clone(),
                input,
                verdict: XDP_DROP,
                drop: Some(reason),
            }
        }
    }

    /// Run one case through xdp_ingress: verdict, every output byte, the
    /// drop counters (exactly the expected one moved, by one), and the
    /// checksums of any rewritten frame.
    pub fn run_case(t: &TestDp, c: &Case) -> Vec<u8> {
        let before = drop_counts(t);
        let (v, out) = t.run_xdp(&c.input);
        let after = drop_counts(t);
        assert_eq!(v, c.verdict, "{}: verdict", c.desc);
        assert_bytes(&c.desc, &out, &c.want);
        let want_delta: Vec<(&str, u64)> = c.drop.map(|r| (label(r), 1)).into_iter().collect();
        assert_eq!(
            drop_delta(&before, &after),
            want_delta,
            "{}: drop counters",
            c.desc
        );
        if out != c.input {
            assert_checksums(&out);
        }
        out
    }
}
