//! From the configuration file to the packet (issue 11, item 1): YAML text
//! through `rivora::config::parse` and `rivora::desired::from_config`,
//! written by the real `Writer` the way the reconciler writes it
//! (`set_node`, `upsert_vip` per VIP, `finish`), then packets built with
//! etherparse through xdp_ingress (BPF_PROG_TEST_RUN) as if they arrived on
//! an interface rivorad is attached to. Port ranges, clientIP affinity and
//! its timeout, SYN rate limits (per VIP and node-wide) and weights, for
//! every mode (NAT, DSR, L3 DSR, full NAT) and both families. Full NAT's
//! source port is the datapath's choice: read from the frame sent, checked
//! against `node.snat.ports`, every other byte built here.
//!
//! Nothing the test expects comes from the writer's renderer: which backend
//! a flow must reach is the hashed slot of the slice read back from
//! `maglev_table` (tests/common/fixture.rs `Fx::pick`, with the flow hash
//! written again in tests/common), and every forwarded frame is compared
//! byte for byte with one etherparse builds for that backend, its checksums
//! computed from scratch.
//!
//! Each test runs in a network namespace of its own in which the backend
//! prefixes are routed through a resolved gateway on `veth0`, and every
//! packet arrives on `veth0` (the XDP context's ingress ifindex), which the
//! node settings list as attached (its MAC), as rivorad lists the
//! interfaces it attaches to. So every mode sends from XDP: NAT and L3 DSR
//! out of `veth0` to the gateway, DSR to the backend's MAC.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use common::fixture::Fx;
use common::fixtures::*;
use common::netns::{InNetns, Netns};
use common::*;
use etherparse::{IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header};
use rivora::abi::*;
use rivora::desired::{from_config, DesiredVip};
use rivora::model::{Mac, Mode, Ports, Vip};

const VETH_MAC: [u8; 6] = [0x02, 0x0c, 0, 0, 0, 0x01];
const GW_MAC: [u8; 6] = [0x02, 0x0c, 0, 0, 0, 0x02];
/// veth0's addresses, which are also L3 DSR's outer sources.
const TUN4: &str = "10.250.0.1";
const TUN6: &str = "fd00:fa:ff::1";
/// Where a NAT VIP on one port sends: the port is translated.
const NAT_PORT: u16 = 8080;
const MODES: [Mode; 4] = [Mode::Nat, Mode::Dsr, Mode::L3Dsr, Mode::FullNat];
/// Full NAT's source ports (node.snat): the port a flow got is read from
/// the frame sent, and must be one of these.
const SNAT_PORTS: std::ops::RangeInclusive<u16> = 40000..=49999;
const FAMS: [Fam; 2] = [Fam::V4, Fam::V6];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fam {
    V4,
    V6,
}

impl Fam {
    fn client(self, n: u16) -> IpAddr {
        match self {
            Fam::V4 => IpAddr::V4(Ipv4Addr::new(10, 9, (n >> 8) as u8, n as u8)),
            Fam::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, n)),
        }
    }
}

fn mode_no(m: Mode) -> u8 {
    match m {
        Mode::Nat => 1,
        Mode::Dsr => 2,
        Mode::L3Dsr => 3,
        Mode::FullNat => 4,
    }
}

fn mode_yaml(m: Mode) -> &'static str {
    match m {
        Mode::Nat => "nat",
        Mode::Dsr => "dsr",
        Mode::L3Dsr => "l3dsr",
        Mode::FullNat => "fullnat",
    }
}

/// 10.{net}.{mode}.{host} or fd00:{net}::{mode}:{host}: VIPs in net 0,
/// backends in net 1 (routed through the gateway).
fn addr(fam: Fam, net: u8, mode: Mode, host: u8) -> IpAddr {
    match fam {
        Fam::V4 => IpAddr::V4(Ipv4Addr::new(10, net, mode_no(mode), host)),
        Fam::V6 => IpAddr::V6(Ipv6Addr::new(
            0xfd00,
            u16::from(net),
            0,
            0,
            0,
            0,
            u16::from(mode_no(mode)),
            u16::from(host),
        )),
    }
}

/// One VIP of a test's file.
#[derive(Clone, Debug)]
struct VipSpec {
    mode: Mode,
    fam: Fam,
    host: u8,
    ports: Ports,
    /// (backend host, weight).
    backends: Vec<(u8, u32)>,
    affinity_s: Option<u32>,
    /// (ratePerSec, burst).
    rate_limit: Option<(u32, u32)>,
}

impl VipSpec {
    fn new(mode: Mode, fam: Fam, host: u8, backends: &[(u8, u32)]) -> Self {
        Self {
            mode,
            fam,
            host,
            ports: Ports::One(80),
            backends: backends.to_vec(),
            affinity_s: None,
            rate_limit: None,
        }
    }

    fn addr(&self) -> IpAddr {
        addr(self.fam, 0, self.mode, self.host)
    }

    fn backend_addr(&self, host: u8) -> IpAddr {
        addr(self.fam, 1, self.mode, host)
    }

    fn backend_mac(&self, host: u8) -> [u8; 6] {
        let fam = if self.fam == Fam::V4 { 4 } else { 6 };
        [0x02, 0xbe, mode_no(self.mode), fam, self.host, host]
    }

    /// The port a backend is written with: NAT translates a single-port
    /// VIP's; a range (NAT) and DSR keep the client's.
    fn backend_port(&self) -> Option<u16> {
        match (self.mode, self.ports) {
            (Mode::Nat | Mode::FullNat, Ports::One(_)) => Some(NAT_PORT),
            _ => None,
        }
    }

    fn desc(&self) -> String {
        format!(
            "{:?} {:?} {}:{}",
            self.mode,
            self.fam,
            self.addr(),
            self.ports
        )
    }

    fn yaml(&self) -> String {
        let port = match self.ports {
            Ports::One(p) => p.to_string(),
            Ports::Range { first, last } => format!("\"{first}-{last}\""),
        };
        let mut y = format!(
            "  - address: \"{}\"\n    port: {port}\n    protocol: tcp\n    mode: {}\n",
            self.addr(),
            mode_yaml(self.mode)
        );
        if let Some(s) = self.affinity_s {
            y += &format!("    affinity: {{ type: clientIP, timeout: {s}s }}\n");
        }
        if let Some((rate, burst)) = self.rate_limit {
            y += &format!("    synRateLimit: {{ ratePerSec: {rate}, burst: {burst} }}\n");
        }
        y += "    backends:\n";
        for &(h, w) in &self.backends {
            y += &format!(
                "      - {{ address: \"{}\", weight: {w}",
                self.backend_addr(h)
            );
            if let Some(p) = self.backend_port() {
                y += &format!(", port: {p}");
            }
            if self.mode == Mode::Dsr {
                y += &format!(", mac: \"{}\"", Mac(self.backend_mac(h)));
            }
            y += " }\n";
        }
        y
    }

    /// A TCP SYN from `client:sport` to this VIP's `dport`.
    fn syn(&self, client: IpAddr, sport: u16, dport: u16) -> Frame {
        let (c, v) = (client.to_string(), self.addr().to_string());
        match self.fam {
            Fam::V4 => Frame::tcp4(&c, sport, &v, dport),
            Fam::V6 => Frame::tcp6(&c, sport, &v, dport),
        }
    }

    /// The frame xdp_ingress must send for `f` to backend `host`. Full
    /// NAT's source port is the datapath's choice: the one `sent` carries
    /// (checked against the range by the caller); every other byte is
    /// built here.
    fn forwarded(&self, f: &Frame, host: u8, sent: &[u8]) -> Vec<u8> {
        let b = self.backend_addr(host);
        match self.mode {
            // Routed from XDP: TTL less one, the FIB's MACs.
            Mode::Nat => {
                let port = self.backend_port().unwrap_or(f.dport());
                f.clone().to(b, port).macs(VETH_MAC, GW_MAC).ttl(63).build()
            }
            Mode::Dsr => f.clone().macs(VETH_MAC, self.backend_mac(host)).build(),
            Mode::L3Dsr => encapsulated(f, b),
            // Routed from XDP, from the node's source.
            Mode::FullNat => {
                let port = self.backend_port().unwrap_or(f.dport());
                let src: IpAddr = match self.fam {
                    Fam::V4 => TUN4.parse().expect("TUN4"),
                    Fam::V6 => TUN6.parse().expect("TUN6"),
                };
                f.clone()
                    .from(src, sent_sport(f, sent))
                    .to(b, port)
                    .macs(VETH_MAC, GW_MAC)
                    .ttl(63)
                    .build()
            }
        }
    }
}

/// The source port of a frame `f` came out as (0 if too short).
fn sent_sport(f: &Frame, sent: &[u8]) -> u16 {
    let at = f.l4_off();
    sent.get(at..at + 2)
        .map_or(0, |p| u16::from_be_bytes([p[0], p[1]]))
}

/// A file with `vips`, the node's tunnel and full-NAT sources and
/// `node_extra` (more keys of `node:`).
fn yaml(node_extra: &str, vips: &[VipSpec]) -> String {
    let mut y = format!(
        "interfaces:\n  - name: veth0\n\
         node:\n  tunnelSource: {{ ipv4: {TUN4}, ipv6: \"{TUN6}\" }}\n\
         \x20 snat: {{ ipv4: {TUN4}, ipv6: \"{TUN6}\", ports: \"{}-{}\" }}\n{node_extra}\
         vips:\n",
        SNAT_PORTS.start(),
        SNAT_PORTS.end()
    );
    for v in vips {
        y += &v.yaml();
    }
    y
}

/// What L3 DSR must make of `f` for backend `b`: the FIB's MACs, an outer
/// header from the tunnel source (TTL / hop limit 64; IPv4: id 0 and DF,
/// the inner header carrying DF; IPv6: `flow_label` as flow label), then
/// the original IP packet byte for byte.
fn encapsulated(f: &Frame, b: IpAddr) -> Vec<u8> {
    let input = f.build();
    let mut out = f.clone().macs(VETH_MAC, GW_MAC).build()[..f.l3_off()].to_vec();
    let inner = &input[f.l3_off()..];
    match b {
        IpAddr::V4(b) => {
            let src: Ipv4Addr = TUN4.parse().expect("TUN4");
            let mut h = Ipv4Header::new(
                inner.len() as u16,
                64,
                IpNumber::IPV4,
                src.octets(),
                b.octets(),
            )
            .expect("outer IPv4");
            h.identification = 0;
            h.dont_fragment = true;
            h.header_checksum = h.calc_header_checksum();
            h.write(&mut out).expect("outer IPv4");
        }
        IpAddr::V6(b) => {
            let src: Ipv6Addr = TUN6.parse().expect("TUN6");
            let label = flow_label(f.src_ip(), f.sport(), f.dport(), f.proto());
            Ipv6Header {
                traffic_class: 0,
                flow_label: Ipv6FlowLabel::try_new(label).expect("20 bits"),
                payload_length: inner.len() as u16,
                next_header: IpNumber::IPV6,
                hop_limit: 64,
                source: src.octets(),
                destination: b.octets(),
            }
            .write(&mut out)
            .expect("outer IPv6");
        }
    }
    out.extend_from_slice(inner);
    out
}

fn mac_str(m: [u8; 6]) -> String {
    Mac(m).to_string()
}

/// A loaded datapath, its writer, and a namespace whose `veth0` reaches
/// every backend through a resolved gateway. Dropped in field order: the
/// pins, then back to the test's namespace, then the namespace.
struct Rig {
    fx: Fx,
    veth0: u32,
    _in: InNetns,
    _ns: Netns,
}

impl Rig {
    fn new() -> Self {
        let fx = Fx::new();
        let ns = Netns::new(&unique("rvcfgpkt"));
        ns.exec(&format!(
            "ip link add veth0 address {} type veth peer name veth1 && \
             ip link set veth0 up && ip link set veth1 up && \
             ip addr add {TUN4}/24 dev veth0 && \
             ip -6 addr add {TUN6}/64 dev veth0 nodad && \
             ip neigh add 10.250.0.2 lladdr {gw} dev veth0 nud permanent && \
             ip -6 neigh add fd00:fa:ff::2 lladdr {gw} dev veth0 nud permanent && \
             ip route add 10.1.0.0/16 via 10.250.0.2 && \
             ip -6 route add fd00:1::/64 via fd00:fa:ff::2",
            mac_str(VETH_MAC),
            gw = mac_str(GW_MAC),
        ));
        ns.sysctls(&[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
        ]);
        let line = ns.exec("ip -o link show veth0");
        let veth0 = line
            .split(':')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("veth0's ifindex in `{line}`"));
        let _in = InNetns::enter(&ns);
        Self {
            fx,
            veth0,
            _in,
            _ns: ns,
        }
    }

    fn t(&self) -> &TestDp {
        &self.fx.t
    }

    /// Parse `text` as the configuration file and write what it wants as
    /// the reconciler does: the node settings (with veth0 as an attached
    /// interface), each VIP, then the batch closed. Returns the file's
    /// VIPs.
    fn apply(&self, text: &str) -> Vec<DesiredVip> {
        let cfg = rivora::config::parse(Path::new("/test/config_to_packets.yaml"), text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let vips = from_config(&cfg);
        let mut node = cfg.desired.node.clone();
        node.interface_macs.insert(self.veth0, Mac(VETH_MAC));
        let mut w = self.fx.w.borrow_mut();
        w.set_node(&node).expect("set_node");
        for d in &vips {
            w.upsert_vip(&d.vip)
                .unwrap_or_else(|e| panic!("upsert {}: {e}", d.vip.key()));
        }
        w.finish().expect("finish");
        vips
    }

    /// The written VIP of `spec` and its service id.
    fn placed(&self, vips: &[DesiredVip], spec: &VipSpec) -> (Vip, u32) {
        let v = vips
            .iter()
            .find(|d| d.vip.addr == spec.addr() && d.vip.ports == spec.ports)
            .unwrap_or_else(|| panic!("{} not in the file", spec.desc()))
            .vip
            .clone();
        let svc = self.fx.placed(&v).svc;
        (v, svc)
    }

    /// The backend host of a backend id, from the backend maps.
    fn host_of(&self, spec: &VipSpec, id: u32) -> u8 {
        let (a, _) = self
            .fx
            .backend_entry(id)
            .unwrap_or_else(|| panic!("backend id {id} has no entry"));
        spec.backends
            .iter()
            .map(|&(h, _)| h)
            .find(|&h| spec.backend_addr(h) == a)
            .unwrap_or_else(|| panic!("backend id {id} ({a}) is not one of {}", spec.desc()))
    }

    /// The slice of `svc` as backend hosts.
    fn slice_hosts(&self, spec: &VipSpec, svc: u32) -> Vec<u8> {
        self.fx
            .slice(svc)
            .into_iter()
            .map(|id| {
                assert_ne!(id, 0, "{}: an empty slot in a live slice", spec.desc());
                self.host_of(spec, id)
            })
            .collect()
    }

    /// xdp_ingress once on `input`, arriving on veth0: the verdict, the
    /// output, and the drop counters that moved.
    fn run(&self, input: &[u8]) -> (u32, Vec<u8>, Vec<(&'static str, u64)>) {
        let before = drop_counts(self.t());
        let mut md = xdp_md(input.len(), self.veth0);
        let (v, out) = try_run_xdp(self.t(), input, Some(&mut md)).expect("test_run with ctx");
        (v, out, drop_delta(&before, &drop_counts(self.t())))
    }

    /// `f` must be sent from XDP to backend `host`, every byte as built
    /// here, checksums valid, nothing dropped.
    fn expect_forward(&self, desc: &str, spec: &VipSpec, f: &Frame, host: u8) {
        let input = f.build();
        let (v, out, drops) = self.run(&input);
        let want = spec.forwarded(f, host, &out);
        if out != want {
            let went = spec
                .backends
                .iter()
                .map(|&(h, _)| h)
                .find(|&h| spec.forwarded(f, h, &out) == out);
            panic!(
                "{desc}: verdict {v}, expected backend {host}, went to {went:?}\n got: {out:02x?}\nwant: {want:02x?}"
            );
        }
        assert_eq!(v, XDP_TX, "{desc}: verdict");
        assert_eq!(drops, vec![], "{desc}: drop counters");
        assert!(assert_checksums(&out) > 0, "{desc}: no checksum checked");
        if spec.mode == Mode::FullNat {
            let port = sent_sport(f, &out);
            assert!(SNAT_PORTS.contains(&port), "{desc}: source port {port}");
        }
    }

    /// `f` must be left alone: XDP_PASS, untouched, nothing counted.
    fn expect_untouched(&self, desc: &str, f: &Frame) {
        let input = f.build();
        let (v, out, drops) = self.run(&input);
        assert_eq!(v, XDP_PASS, "{desc}: verdict");
        assert_bytes(desc, &out, &input);
        assert_eq!(drops, vec![], "{desc}: drop counters");
    }

    /// The backend host a new flow must reach, by the oracle; `addr_only`
    /// for clientIP affinity, whose hash is of the address alone.
    fn oracle(&self, spec: &VipSpec, svc: u32, f: &Frame, addr_only: bool) -> u8 {
        let hash = flow_hash(f.src_ip(), f.sport(), f.dport(), f.proto(), addr_only);
        let id = self
            .fx
            .pick(svc, hash)
            .unwrap_or_else(|| panic!("{}: the oracle finds no backend", spec.desc()));
        self.host_of(spec, id)
    }
}

// ---------------------------------------------------------------------
// Port ranges

/// A range VIP takes every port from its first to its last and nothing
/// either side. Its edges are not prefix-aligned (1001 and 2999), so the
/// writer splits it into many port prefixes of the LPM trie: every port
/// from 995 to 3005 is sent, each in-range one to the oracle's backend
/// with the client's port kept, each outside one untouched and uncounted.
/// First (1001), middle (2000) and last (2999) and one either side (1000,
/// 3000) are among them.
#[test]
fn port_range_first_middle_last_and_either_side() {
    let rig = Rig::new();
    let (first, last) = (1001u16, 2999u16);
    let specs: Vec<VipSpec> = MODES
        .iter()
        .flat_map(|&m| FAMS.iter().map(move |&f| (m, f)))
        .map(|(m, f)| VipSpec {
            ports: Ports::Range { first, last },
            ..VipSpec::new(m, f, 10, &[(1, 1), (2, 1), (3, 1)])
        })
        .collect();
    let vips = rig.apply(&yaml("", &specs));
    for spec in &specs {
        let (_, svc) = rig.placed(&vips, spec);
        let client = spec.fam.client(1);
        let mut seen = BTreeSet::new();
        let mut forwarded = 0u64;
        let mut bytes = 0u64;
        for dport in (first - 6)..=(last + 6) {
            let f = spec.syn(client, 40000, dport);
            let desc = format!("{}, port {dport}", spec.desc());
            if (first..=last).contains(&dport) {
                let host = rig.oracle(spec, svc, &f, false);
                rig.expect_forward(&desc, spec, &f, host);
                seen.insert(host);
                forwarded += 1;
                bytes += f.build().len() as u64;
            } else {
                rig.expect_untouched(&desc, &f);
            }
        }
        let st = rig.t().vip_stats(svc);
        assert_eq!(
            (st.packets, st.bytes),
            (forwarded, bytes),
            "{}: stats_map counts the in-range packets only",
            spec.desc()
        );
        // The port is in the hash: 1,999 ports over three backends reach
        // all three (a range read as one port would not spread).
        assert_eq!(seen.len(), 3, "{}: backends reached {seen:?}", spec.desc());
    }
}

// ---------------------------------------------------------------------
// clientIP affinity

/// The clientIP entry of `client` for `svc` (ports and protocol zeroed).
fn client_entry(t: &TestDp, svc: u32, client: IpAddr) -> Option<rv_affinity_value> {
    match client {
        IpAddr::V4(c) => t
            .maps
            .connection_affinity_map
            .get(&rv_flow_key {
                svc_id: svc,
                saddr: be32(c),
                ..Default::default()
            })
            .expect("connection_affinity_map"),
        IpAddr::V6(c) => t
            .maps
            .connection_affinity_map6
            .get(&rv_flow6_key {
                svc_id: svc,
                saddr: be32x4(c),
                ..Default::default()
            })
            .expect("connection_affinity_map6"),
    }
}

/// Make `client`'s entry `idle_s` seconds old. The datapath reads
/// CLOCK_MONOTONIC_COARSE, which a test cannot move, so the entry is
/// moved back instead (as tests/packets_lb.rs does): the state the map
/// would hold after `idle_s` seconds of silence.
fn age_client_entry(t: &TestDp, svc: u32, client: IpAddr, idle_s: u64) {
    let mut a = client_entry(t, svc, client).expect("a clientIP entry to age");
    a.last_seen_ns = ktime_ns() - idle_s * 1_000_000_000;
    match client {
        IpAddr::V4(c) => t.maps.connection_affinity_map.put(
            &rv_flow_key {
                svc_id: svc,
                saddr: be32(c),
                ..Default::default()
            },
            &a,
        ),
        IpAddr::V6(c) => t.maps.connection_affinity_map6.put(
            &rv_flow6_key {
                svc_id: svc,
                saddr: be32x4(c),
                ..Default::default()
            },
            &a,
        ),
    }
    .expect("connection_affinity_map");
}

const AFFINITY_S: u32 = 30;
const CLIENTS: u16 = 24;
const PORTS_PER_CLIENT: u16 = 12;

/// `affinity: { type: clientIP, timeout: 30s }`: every source port of a
/// client reaches one backend, the one the address-only hash picks, and
/// the clients spread over the backends. The file then gives that backend
/// weight 0 (no slots): within the timeout the client stays (29 s idle:
/// kept, and the use refreshes the entry); past it (31 s idle) the next
/// SYN is a new choice from the new slice, another backend, remembered
/// for every port after it.
#[test]
fn client_ip_affinity_one_backend_then_another_after_the_timeout() {
    let rig = Rig::new();
    let specs: Vec<VipSpec> = MODES
        .iter()
        .flat_map(|&m| FAMS.iter().map(move |&f| (m, f)))
        .map(|(m, f)| VipSpec {
            affinity_s: Some(AFFINITY_S),
            ..VipSpec::new(m, f, 20, &[(1, 1), (2, 1), (3, 1), (4, 1)])
        })
        .collect();
    let vips = rig.apply(&yaml("", &specs));
    let mut moved = Vec::new();
    for spec in &specs {
        let (_, svc) = rig.placed(&vips, spec);
        let s = rig.fx.service(svc);
        assert_eq!(
            (s.affinity, s.affinity_timeout_s),
            (rv_affinity::RV_AFFINITY_CLIENT_IP.0 as u8, AFFINITY_S),
            "{}: the service entry",
            spec.desc()
        );
        let mut by_client = BTreeMap::new();
        for c in 1..=CLIENTS {
            let client = spec.fam.client(c);
            let want = rig.oracle(spec, svc, &spec.syn(client, 0, 80), true);
            for p in 0..PORTS_PER_CLIENT {
                let sport = 30000 + p * 1009;
                let f = spec.syn(client, sport, 80);
                let desc = format!("{}, client {client} port {sport}", spec.desc());
                rig.expect_forward(&desc, spec, &f, want);
            }
            let e = client_entry(rig.t(), svc, client).expect("a clientIP entry");
            assert_eq!(rig.host_of(spec, e.backend_id), want, "{}", spec.desc());
            by_client.insert(c, want);
        }
        let used: BTreeSet<u8> = by_client.values().copied().collect();
        assert!(
            used.len() >= 2,
            "{}: {CLIENTS} clients all on one backend ({used:?}): one backend per client \
             would prove nothing",
            spec.desc()
        );
        moved.push((spec.clone(), svc, by_client[&1]));
    }

    // The file again, client 1's backend at weight 0 in each VIP.
    let specs2: Vec<VipSpec> = moved
        .iter()
        .map(|(spec, _, old)| VipSpec {
            backends: spec
                .backends
                .iter()
                .map(|&(h, w)| (h, if h == *old { 0 } else { w }))
                .collect(),
            ..spec.clone()
        })
        .collect();
    let vips2 = rig.apply(&yaml("", &specs2));
    for ((_, svc, old), spec) in moved.iter().zip(&specs2) {
        let (svc, old) = (*svc, *old);
        assert_eq!(rig.placed(&vips2, spec).1, svc, "an update keeps the id");
        assert!(
            !rig.slice_hosts(spec, svc).contains(&old),
            "{}: weight 0 takes no slots",
            spec.desc()
        );
        let client = spec.fam.client(1);
        let new = rig.oracle(spec, svc, &spec.syn(client, 0, 80), true);
        assert_ne!(new, old);
        let d = spec.desc();

        rig.expect_forward(
            &format!("{d}: new slice, entry fresh"),
            spec,
            &spec.syn(client, 41000, 80),
            old,
        );

        age_client_entry(rig.t(), svc, client, u64::from(AFFINITY_S) - 1);
        let t0 = ktime_ns();
        rig.expect_forward(
            &format!("{d}: idle 29 s of 30"),
            spec,
            &spec.syn(client, 41001, 80),
            old,
        );
        let e = client_entry(rig.t(), svc, client).expect("entry");
        assert!(e.last_seen_ns >= t0, "{d}: refreshed by the use");

        age_client_entry(rig.t(), svc, client, u64::from(AFFINITY_S) + 1);
        rig.expect_forward(
            &format!("{d}: idle 31 s of 30"),
            spec,
            &spec.syn(client, 41002, 80),
            new,
        );
        let e = client_entry(rig.t(), svc, client).expect("entry");
        assert_eq!(
            rig.host_of(spec, e.backend_id),
            new,
            "{d}: the new choice remembered"
        );
        for sport in 41003..41008 {
            rig.expect_forward(
                &format!("{d}: after the move, port {sport}"),
                spec,
                &spec.syn(client, sport, 80),
                new,
            );
        }
    }
}

// ---------------------------------------------------------------------
// SYN rate limits

const OWN_BURST: u32 = 4;
const NODE_BURST: u32 = 2;

/// Send `burst + 1` SYNs from `client` (distinct source ports) to `spec`:
/// the first `burst` forwarded to the oracle's backends, the last dropped
/// as rate_limited, counted once in drop_stats_map and once in the VIP's
/// stats. At one token a second no token can come back within the burst
/// unless the sender stalls for a second: the bucket fills at the first
/// SYN, and the last finds a token only if a second has passed on the
/// datapath's clock, which `ktime_ns` reads before the first run and
/// after the last. A stalled attempt is not judged: it returns the
/// rate_limited drops it caused, for a retry from another client (a fresh
/// bucket).
fn burst_plus_one(
    rig: &Rig,
    spec: &VipSpec,
    svc: u32,
    client: IpAddr,
    burst: u32,
) -> Result<(), u64> {
    let before = rig.t().vip_stats(svc);
    let t0 = ktime_ns();
    let mut outcomes = Vec::new();
    for i in 0..=burst {
        let f = spec.syn(client, 20000 + i as u16, 80);
        let input = f.build();
        let (v, out, drops) = rig.run(&input);
        outcomes.push((f, v, out, drops));
    }
    if ktime_ns() - t0 >= 1_000_000_000 {
        return Err(rig.t().vip_stats(svc).rate_limited - before.rate_limited);
    }
    let d = spec.desc();
    let mut bytes = 0u64;
    for (i, (f, v, out, drops)) in outcomes.iter().enumerate() {
        let desc = format!("{d}, SYN {} of {}", i + 1, burst + 1);
        if (i as u32) < burst {
            // The oracle is asked after the run: a SYN changes no slice.
            let host = rig.oracle(spec, svc, f, false);
            assert_bytes(&desc, out, &spec.forwarded(f, host, out));
            assert_eq!(*v, XDP_TX, "{desc}: verdict");
            assert_eq!(drops, &vec![], "{desc}: drop counters");
            bytes += f.build().len() as u64;
        } else {
            assert_eq!(*v, XDP_DROP, "{desc}: verdict");
            assert_bytes(&desc, out, &f.build());
            assert_eq!(
                drops,
                &vec![(label(rv_drop_reason::RV_DROP_RATE_LIMITED), 1)],
                "{desc}: exactly one rate_limited"
            );
        }
    }
    let st = rig.t().vip_stats(svc);
    assert_eq!(
        (
            st.packets - before.packets,
            st.bytes - before.bytes,
            st.rate_limited - before.rate_limited,
            st.no_backend - before.no_backend
        ),
        (u64::from(burst), bytes, 1, 0),
        "{d}: stats_map (packets, bytes, rate_limited, no_backend)"
    );
    Ok(())
}

/// `synRateLimit` on a VIP (burst 4) and on the node (burst 2, for a VIP
/// without its own), at one SYN a second: burst + 1 SYNs from one client
/// are burst forwards and exactly one counted rate_limited drop. A
/// non-SYN of the same client is not limited from the empty bucket, and
/// another client has a bucket of its own.
#[test]
fn syn_rate_limit_burst_plus_one() {
    let rig = Rig::new();
    let mut specs = Vec::new();
    for m in MODES {
        for f in FAMS {
            specs.push(VipSpec {
                rate_limit: Some((1, OWN_BURST)),
                ..VipSpec::new(m, f, 30, &[(1, 1), (2, 1)])
            });
            specs.push(VipSpec::new(m, f, 31, &[(1, 1), (2, 1)]));
        }
    }
    let node = format!("  synRateLimit: {{ ratePerSec: 1, burst: {NODE_BURST} }}\n");
    let vips = rig.apply(&yaml(&node, &specs));
    let mut next_client = 100u16;
    let mut stalled_drops = 0u64;
    for spec in &specs {
        let (_, svc) = rig.placed(&vips, spec);
        let s = rig.fx.service(svc);
        let own = spec.rate_limit.is_some();
        assert_eq!(
            s.flags & rv_service_flags::RV_SVC_F_RATE_LIMIT.0 != 0,
            own,
            "{}: the service's own-limit flag",
            spec.desc()
        );
        let burst = if own { OWN_BURST } else { NODE_BURST };
        let d = spec.desc();
        let mut judged = None;
        let mut stalled = 0u64;
        for _ in 0..3 {
            next_client += 1;
            let c = spec.fam.client(next_client);
            match burst_plus_one(&rig, spec, svc, c, burst) {
                Ok(()) => {
                    judged = Some(c);
                    break;
                }
                Err(n) => stalled += n,
            }
        }
        let client = judged.unwrap_or_else(|| panic!("{d}: three attempts stalled for a second"));
        stalled_drops += stalled;
        // The bucket is empty; an established segment still passes.
        let ack = spec.syn(client, 20000, 80).established(2);
        let host = rig.oracle(spec, svc, &spec.syn(client, 20000, 80), false);
        rig.expect_forward(
            &format!("{d}: an ACK from the empty bucket"),
            spec,
            &ack,
            host,
        );
        let other = spec.fam.client(9000 + next_client);
        let f = spec.syn(other, 20000, 80);
        let host = rig.oracle(spec, svc, &f, false);
        rig.expect_forward(&format!("{d}: another client"), spec, &f, host);
        assert_eq!(
            rig.t().vip_stats(svc).rate_limited,
            1 + stalled,
            "{d}: rate_limited, nothing after the burst + 1"
        );
    }
    assert_eq!(
        rig.t().drops(rv_drop_reason::RV_DROP_RATE_LIMITED),
        specs.len() as u64 + stalled_drops,
        "drop_stats_map rate_limited: one per VIP"
    );
}

// ---------------------------------------------------------------------
// Weights

const FLOWS: usize = 4000;
/// The "within 5 %", read as percentage points of share.
const SHARE_PP: f64 = 0.05;

/// Weights 1:3. Weights are Maglev slots: the slice read back must give
/// the two backends 1:3 of its slots to within 5 % of each share
/// (relative), and 4,000 distinct flows (40 clients x 100 source ports)
/// must each reach the backend of their hashed slot (every frame checked
/// byte for byte), which makes the flow shares follow the slot shares.
///
/// On the flow shares: if the flow hash is a good hash, the weight-3
/// backend's count over n distinct flows is Binomial(n, p), p its slot
/// share; at n = 4,000 and p = 0.75 the standard deviation of the share
/// is 0.0068. The flow share must be within 4 of those of the slot share
/// (a hash that ignored ports or addresses, or spread badly, fails: P of a
/// good hash failing is 6e-5) and within 5 percentage points of the
/// configured 0.75 (7 deviations). The flows are fixed, so the outcome is
/// deterministic: these are the odds that a correct datapath meets an
/// unlucky flow set, not a flake rate.
#[test]
fn weights_one_to_three_over_4000_flows() {
    let rig = Rig::new();
    let specs: Vec<VipSpec> = MODES
        .iter()
        .flat_map(|&m| FAMS.iter().map(move |&f| (m, f)))
        .map(|(m, f)| VipSpec::new(m, f, 40, &[(1, 1), (2, 3)]))
        .collect();
    let vips = rig.apply(&yaml("", &specs));
    let mut report = Vec::new();
    for spec in &specs {
        let d = spec.desc();
        let (_, svc) = rig.placed(&vips, spec);
        let slice = rig.slice_hosts(spec, svc);
        let len = slice.len();
        let heavy_slots = slice.iter().filter(|&&h| h == 2).count();
        let slot_share = heavy_slots as f64 / len as f64;
        for (share, want) in [(slot_share, 0.75), (1.0 - slot_share, 0.25)] {
            assert!(
                (share - want).abs() <= 0.05 * want,
                "{d}: a slot share of {share:.4} for a weight share of {want} \
                 ({heavy_slots} of {len} slots for weight 3): not within 5 %"
            );
        }
        let mut heavy = 0usize;
        let before = rig.t().vip_stats(svc);
        for i in 0..FLOWS {
            let client = spec.fam.client(1 + (i / 100) as u16);
            let sport = 10000 + (i % 100) as u16 * 541;
            let f = spec.syn(client, sport, 80);
            let host = rig.oracle(spec, svc, &f, false);
            rig.expect_forward(&format!("{d}, flow {i}"), spec, &f, host);
            if host == 2 {
                heavy += 1;
            }
        }
        let st = rig.t().vip_stats(svc);
        assert_eq!(
            st.packets - before.packets,
            FLOWS as u64,
            "{d}: every flow counted"
        );
        let share = heavy as f64 / FLOWS as f64;
        let sd = (slot_share * (1.0 - slot_share) / FLOWS as f64).sqrt();
        assert!(
            (share - slot_share).abs() <= 4.0 * sd,
            "{d}: weight 3 took {share:.4} of the flows, {slot_share:.4} of the slots \
             (4 sd = {:.4})",
            4.0 * sd
        );
        assert!(
            (share - 0.75).abs() <= SHARE_PP,
            "{d}: weight 3 took {share:.4} of the flows, not 0.75 within 5 points"
        );
        report.push(format!(
            "{d}: slots {heavy_slots}/{len} = {slot_share:.4}, flows {heavy}/{FLOWS} = {share:.4}"
        ));
    }
    println!(
        "weights 1:3, share of the weight-3 backend:\n{}",
        report.join("\n")
    );
}
