//! Packet fixtures for the load-balancing steps of xdp_ingress (issue 2,
//! packet path steps 4 and 5): SYN rate limits, affinity, clientIP
//! affinity and its timeout, draining and down backends, the Maglev probe
//! window, weights, and the per-VIP counters.
//!
//! Services here are NAT, so which backend a packet went to is visible in
//! the packet itself; every forwarded packet is compared byte for byte
//! with the translation etherparse builds for that backend (checksums
//! computed from scratch), and every dropped one with its input.

mod common;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::*;
use etherparse::PacketBuilder;
use rivora::abi::*;

const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const VPORT: u16 = 80;
const BPORT: u16 = 8080;

const HEALTHY: rv_health = rv_health::RV_HEALTH_HEALTHY;
const DRAINING: rv_health = rv_health::RV_HEALTH_DRAINING;
const DOWN: rv_health = rv_health::RV_HEALTH_DOWN;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fam {
    V4,
    V6,
}

impl Fam {
    fn abi(self) -> rv_family {
        match self {
            Fam::V4 => rv_family::RV_FAMILY_V4,
            Fam::V6 => rv_family::RV_FAMILY_V6,
        }
    }

    fn addr(self, net: u8, host: u16) -> IpAddr {
        match self {
            Fam::V4 => IpAddr::V4(Ipv4Addr::new(10, net, (host >> 8) as u8, host as u8)),
            Fam::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, u16::from(net), 0, 0, 0, 0, 0, host)),
        }
    }

    /// The VIP of service `svc`.
    fn vip(self, svc: u32) -> IpAddr {
        self.addr(0, 100 + svc as u16)
    }

    fn client(self, n: u16) -> IpAddr {
        self.addr(9, n)
    }

    fn backend(self, id: u32) -> IpAddr {
        self.addr(1, id as u16)
    }
}

#[derive(Clone, Copy, Debug)]
enum Tcp {
    Syn,
    Ack,
    SynAck,
    Rst,
}

fn tcp_frame(
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
    flags: Tcp,
    payload: &[u8],
) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(PEER_MAC, NODE_MAC);
    let b = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => b.ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => b.ipv6(s.octets(), d.octets(), 64),
        _ => panic!("mixed families"),
    };
    let b = b.tcp(sport, dport, 1000, 64240);
    let b = match flags {
        Tcp::Syn => b.syn(),
        Tcp::Ack => b.ack(1),
        Tcp::SynAck => b.syn().ack(1),
        Tcp::Rst => b.rst(),
    };
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out
}

/// Where a packet went.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Out {
    /// Translated to this backend (bytes checked).
    To(u32),
    /// XDP_DROP, bytes untouched.
    Drop,
}

/// A test datapath with NAT services on port 80 whose backends are
/// `fam.backend(id)`:8080.
struct Lb {
    t: TestDp,
    /// Every backend id, for recognising where a packet went.
    backends: Vec<u32>,
}

impl Lb {
    fn new() -> Self {
        Self {
            t: TestDp::new(),
            backends: Vec::new(),
        }
    }

    fn backend(&mut self, fam: Fam, id: u32) {
        match fam.backend(id) {
            IpAddr::V4(a) => self.t.backend4(id, a, BPORT, [2, 0, 0, 0, 1, id as u8]),
            IpAddr::V6(a) => self.t.backend6(id, a, BPORT, [2, 0, 0, 0, 1, id as u8]),
        }
        self.backends.push(id);
    }

    fn service(
        &self,
        fam: Fam,
        svc: u32,
        start: u32,
        slots: &[u32],
        f: impl FnOnce(&mut rv_service),
    ) {
        match fam.vip(svc) {
            IpAddr::V4(a) => self.t.vip4(a, VPORT, PROTO_TCP, svc),
            IpAddr::V6(a) => self.t.vip6(a, VPORT, PROTO_TCP, svc),
        }
        self.t.service_with(svc, start, slots, |s| {
            s.mode = rv_mode::RV_MODE_NAT.0 as u8;
            s.family = fam.abi().0 as u8;
            f(s);
        });
    }

    /// Replace a service's slice (same start), keeping its settings.
    fn slice(&self, svc: u32, slots: &[u32]) {
        let s: rv_service = self.t.maps.service_config_map.get(&svc).unwrap().unwrap();
        self.t.service_with(svc, s.slice_start, slots, |n| {
            *n = rv_service {
                slice_len: slots.len() as u32,
                ..s
            }
        });
    }

    /// Send a TCP packet from client:sport to the VIP of `svc`.
    fn send(
        &self,
        fam: Fam,
        svc: u32,
        client: IpAddr,
        sport: u16,
        flags: Tcp,
        payload: &[u8],
    ) -> Out {
        let pkt = tcp_frame(client, sport, fam.vip(svc), VPORT, flags, payload);
        self.send_frame(
            &pkt,
            |b| tcp_frame(client, sport, b, BPORT, flags, payload),
            fam,
        )
    }

    fn send_frame(&self, pkt: &[u8], nat: impl Fn(IpAddr) -> Vec<u8>, fam: Fam) -> Out {
        let (v, out) = self.t.run_xdp(pkt);
        match v {
            XDP_DROP => {
                assert_eq!(out, pkt, "a dropped packet is not rewritten");
                Out::Drop
            }
            XDP_PASS => {
                for &id in &self.backends {
                    if out == nat(fam.backend(id)) {
                        return Out::To(id);
                    }
                }
                panic!("XDP_PASS, but not a NAT to any backend:\n in  {pkt:?}\n out {out:?}");
            }
            v => panic!("verdict {v}"),
        }
    }

    fn drops(&self, r: rv_drop_reason) -> u64 {
        self.t.drops(r)
    }
}

fn affinity(
    t: &TestDp,
    svc: u32,
    client: IpAddr,
    sport: u16,
    dport: u16,
    proto: u8,
) -> Option<rv_affinity_value> {
    match client {
        IpAddr::V4(c) => t
            .maps
            .connection_affinity_map
            .get(&rv_flow_key {
                svc_id: svc,
                saddr: be32(c),
                sport: be16(sport),
                dport: be16(dport),
                proto,
                ..Default::default()
            })
            .unwrap(),
        IpAddr::V6(c) => t
            .maps
            .connection_affinity_map6
            .get(&rv_flow6_key {
                svc_id: svc,
                saddr: be32x4(c),
                sport: be16(sport),
                dport: be16(dport),
                proto,
                ..Default::default()
            })
            .unwrap(),
    }
}

fn set_affinity(
    t: &TestDp,
    svc: u32,
    client: IpAddr,
    sport: u16,
    dport: u16,
    proto: u8,
    v: rv_affinity_value,
) {
    match client {
        IpAddr::V4(c) => t
            .maps
            .connection_affinity_map
            .put(
                &rv_flow_key {
                    svc_id: svc,
                    saddr: be32(c),
                    sport: be16(sport),
                    dport: be16(dport),
                    proto,
                    ..Default::default()
                },
                &v,
            )
            .unwrap(),
        IpAddr::V6(c) => t
            .maps
            .connection_affinity_map6
            .put(
                &rv_flow6_key {
                    svc_id: svc,
                    saddr: be32x4(c),
                    sport: be16(sport),
                    dport: be16(dport),
                    proto,
                    ..Default::default()
                },
                &v,
            )
            .unwrap(),
    }
}

/// The rate-limit bucket of (scope, source), scope 0 being node-wide.
fn bucket(t: &TestDp, scope: u32, src: IpAddr) -> Option<rv_rl_bucket> {
    match src {
        IpAddr::V4(a) => t
            .maps
            .rl_buckets_map
            .get(&rv_rl_key {
                svc_id: scope,
                saddr: be32(a),
            })
            .unwrap(),
        IpAddr::V6(a) => t
            .maps
            .rl_buckets_map6
            .get(&rv_rl6_key {
                svc_id: scope,
                saddr: be32x4(a),
            })
            .unwrap(),
    }
}

fn set_bucket(t: &TestDp, scope: u32, src: IpAddr, b: rv_rl_bucket) {
    match src {
        IpAddr::V4(a) => t
            .maps
            .rl_buckets_map
            .put(
                &rv_rl_key {
                    svc_id: scope,
                    saddr: be32(a),
                },
                &b,
            )
            .unwrap(),
        IpAddr::V6(a) => t
            .maps
            .rl_buckets_map6
            .put(
                &rv_rl6_key {
                    svc_id: scope,
                    saddr: be32x4(a),
                },
                &b,
            )
            .unwrap(),
    }
}

/// A small deterministic PRNG (xorshift64*), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

// ---------------------------------------------------------------------
// SYN rate limits

/// Services of the rate-limit test, per family: one with its own limit,
/// one under the node-wide limit.
fn rl_services(fam: Fam) -> (u32, u32, u32) {
    match fam {
        Fam::V4 => (1, 2, 10),
        Fam::V6 => (3, 4, 11),
    }
}

const OWN_BURST: u32 = 3;
const NODE_BURST: u32 = 2;

fn rl_setup(lb: &mut Lb, fam: Fam) {
    let (own, node, b) = rl_services(fam);
    lb.backend(fam, b);
    lb.service(fam, own, own * 16, &[b; 7], |s| {
        s.flags |= rv_service_flags::RV_SVC_F_RATE_LIMIT.0
    });
    // One SYN a second: no refill worth a token within a test's run.
    lb.t.svc_rate_limit(own, 1, OWN_BURST);
    lb.service(fam, node, node * 16, &[b; 7], |_| {});
}

/// Before the node-wide limit is enabled, a VIP without its own limit
/// takes any number of SYNs.
fn rl_node_disabled(lb: &Lb, fam: Fam) {
    let (_, node, b) = rl_services(fam);
    let w = fam.client(40);
    for sport in 1000..1010 {
        assert_eq!(
            lb.send(fam, node, w, sport, Tcp::Syn, b""),
            Out::To(b),
            "{fam:?}"
        );
    }
    assert!(bucket(&lb.t, 0, w).is_none(), "no bucket while disabled");
}

fn rl_enabled(lb: &Lb, fam: Fam) {
    let (own, node, b) = rl_services(fam);
    let t = &lb.t;
    let limited = |lb: &Lb| lb.drops(rv_drop_reason::RV_DROP_RATE_LIMITED);
    let before = limited(lb);
    let own_pkts = t.vip_stats(own).packets;
    let (x, y, z) = (fam.client(1), fam.client(2), fam.client(3));

    // Per-VIP limit: a burst of 3 SYNs from x, then drops.
    for sport in 2000..2003 {
        assert_eq!(
            lb.send(fam, own, x, sport, Tcp::Syn, b""),
            Out::To(b),
            "{fam:?} SYN {sport} under the limit"
        );
    }
    for sport in 2003..2005 {
        assert_eq!(
            lb.send(fam, own, x, sport, Tcp::Syn, b""),
            Out::Drop,
            "{fam:?} SYN {sport} over the limit"
        );
    }
    assert_eq!(
        limited(lb),
        before + 2,
        "{fam:?} drop_stats_map rate_limited"
    );
    let st = t.vip_stats(own);
    assert_eq!(st.rate_limited, 2, "{fam:?} stats_map rate_limited");
    assert_eq!(
        st.packets,
        own_pkts + 3,
        "{fam:?} only forwarded SYNs counted"
    );
    let bk = bucket(t, own, x).expect("per-VIP bucket");
    assert!(
        bk.tokens_milli < 1000,
        "{fam:?} bucket empty: {}",
        bk.tokens_milli
    );
    assert!(
        bucket(t, 0, x).is_none(),
        "{fam:?} own limit used no node-wide bucket"
    );

    // Non-SYN packets are never limited, from an empty bucket too.
    for (sport, flags) in [
        (2000, Tcp::Ack),
        (2001, Tcp::SynAck),
        (2002, Tcp::Rst),
        (2010, Tcp::Ack),
    ] {
        assert_eq!(
            lb.send(fam, own, x, sport, flags, b"data"),
            Out::To(b),
            "{fam:?} {flags:?} not limited"
        );
    }
    assert_eq!(limited(lb), before + 2);

    // Buckets are per source.
    assert_eq!(
        lb.send(fam, own, y, 2000, Tcp::Syn, b""),
        Out::To(b),
        "{fam:?} another source"
    );

    // Node-wide limit on the VIP without its own: burst 2.
    for sport in 3000..3002 {
        assert_eq!(
            lb.send(fam, node, x, sport, Tcp::Syn, b""),
            Out::To(b),
            "{fam:?} node-wide under"
        );
    }
    assert_eq!(
        lb.send(fam, node, x, 3002, Tcp::Syn, b""),
        Out::Drop,
        "{fam:?} node-wide over"
    );
    assert_eq!(t.vip_stats(node).rate_limited, 1, "{fam:?} counted per VIP");
    assert_eq!(limited(lb), before + 3);

    // Precedence: z exhausts its node-wide bucket, yet the VIP with its
    // own limit still gives z its own, larger burst.
    for sport in 4000..4002 {
        assert_eq!(lb.send(fam, node, z, sport, Tcp::Syn, b""), Out::To(b));
    }
    assert_eq!(lb.send(fam, node, z, 4002, Tcp::Syn, b""), Out::Drop);
    for sport in 4100..4100 + OWN_BURST as u16 {
        assert_eq!(
            lb.send(fam, own, z, sport, Tcp::Syn, b""),
            Out::To(b),
            "{fam:?} per-VIP limit takes precedence"
        );
    }
    assert_eq!(lb.send(fam, own, z, 4200, Tcp::Syn, b""), Out::Drop);
    assert!(bucket(t, own, z).is_some() && bucket(t, 0, z).is_some());
    assert!(
        bucket(t, node, z).is_none(),
        "{fam:?} node-wide buckets are scoped 0"
    );
    assert_eq!(limited(lb), before + 5);
    assert_eq!(t.vip_stats(own).rate_limited, 3);
    assert_eq!(t.vip_stats(node).rate_limited, 2);

    // Refill: 2.5 s ago with an empty bucket is 2.5 tokens at 1/s.
    set_bucket(
        t,
        own,
        x,
        rv_rl_bucket {
            tokens_milli: 0,
            last_ns: ktime_ns() - 2_500_000_000,
        },
    );
    for sport in 5000..5002 {
        assert_eq!(
            lb.send(fam, own, x, sport, Tcp::Syn, b""),
            Out::To(b),
            "{fam:?} refilled token"
        );
    }
    assert_eq!(
        lb.send(fam, own, x, 5002, Tcp::Syn, b""),
        Out::Drop,
        "{fam:?} refill spent"
    );
    assert_eq!(limited(lb), before + 6);
}

#[test]
fn syn_rate_limit_per_vip_and_node_wide() {
    let mut lb = Lb::new();
    for fam in [Fam::V4, Fam::V6] {
        rl_setup(&mut lb, fam);
        rl_node_disabled(&lb, fam);
    }
    lb.t.node_rate_limit(1, NODE_BURST);
    for fam in [Fam::V4, Fam::V6] {
        rl_enabled(&lb, fam);
    }
}

// ---------------------------------------------------------------------
// Affinity

/// A flow's later packets follow its affinity entry after the Maglev
/// slice has been pointed elsewhere; a new flow follows the new slice.
/// The VIP's packet and byte counters see every forwarded frame.
#[test]
fn affinity_keeps_established_flows_across_a_table_change() {
    let mut lb = Lb::new();
    for (fam, svc, b1, b2) in [(Fam::V4, 1, 11, 12), (Fam::V6, 2, 21, 22)] {
        lb.backend(fam, b1);
        lb.backend(fam, b2);
        lb.service(fam, svc, svc * 32, &[b1; 16], |_| {});
        let x = fam.client(1);
        let mut bytes = 0u64;
        let mut count = |lb: &Lb, sport, flags, payload: &[u8]| {
            bytes += tcp_frame(x, sport, fam.vip(svc), VPORT, flags, payload).len() as u64;
            lb.send(fam, svc, x, sport, flags, payload)
        };

        let t0 = ktime_ns();
        assert_eq!(count(&lb, 1234, Tcp::Syn, b""), Out::To(b1));
        let t1 = ktime_ns();
        let a = affinity(&lb.t, svc, x, 1234, VPORT, PROTO_TCP).expect("affinity recorded");
        assert_eq!(a.backend_id, b1);
        assert!(
            (t0..=t1).contains(&a.last_seen_ns),
            "{fam:?} last_seen_ns is now"
        );

        lb.slice(svc, &[b2; 16]);
        for payload in [&b""[..], &[7u8; 100][..], &[9u8; 1000][..]] {
            assert_eq!(
                count(&lb, 1234, Tcp::Ack, payload),
                Out::To(b1),
                "{fam:?} established flow kept"
            );
        }
        assert_eq!(
            count(&lb, 1235, Tcp::Syn, b""),
            Out::To(b2),
            "{fam:?} new flow takes the new table"
        );
        assert_eq!(
            affinity(&lb.t, svc, x, 1234, VPORT, PROTO_TCP)
                .unwrap()
                .backend_id,
            b1
        );
        assert_eq!(
            affinity(&lb.t, svc, x, 1235, VPORT, PROTO_TCP)
                .unwrap()
                .backend_id,
            b2
        );

        let st = lb.t.vip_stats(svc);
        assert_eq!((st.packets, st.bytes), (5, bytes), "{fam:?} stats_map");
        assert_eq!((st.rate_limited, st.no_backend), (0, 0));
    }
}

/// sessionAffinity clientIP: one entry per client address (ports and
/// protocol zeroed), every source port to one backend, refreshed by use,
/// and a new choice once idle past the timeout.
#[test]
fn client_ip_affinity_and_its_timeout() {
    let mut lb = Lb::new();
    for (fam, svc, b1, b2) in [(Fam::V4, 1, 11, 12), (Fam::V6, 2, 21, 22)] {
        lb.backend(fam, b1);
        lb.backend(fam, b2);
        lb.service(fam, svc, svc * 32, &[b1; 16], |s| {
            s.affinity = rv_affinity::RV_AFFINITY_CLIENT_IP.0 as u8;
            s.affinity_timeout_s = 30;
        });
        let (x, y) = (fam.client(1), fam.client(2));
        assert_eq!(lb.send(fam, svc, x, 3000, Tcp::Syn, b""), Out::To(b1));
        let a = affinity(&lb.t, svc, x, 0, 0, 0).expect("clientIP entry");
        assert_eq!(a.backend_id, b1);
        assert!(
            affinity(&lb.t, svc, x, 3000, VPORT, PROTO_TCP).is_none(),
            "no 5-tuple entry"
        );

        lb.slice(svc, &[b2; 16]);
        for sport in 3001..3006 {
            assert_eq!(
                lb.send(fam, svc, x, sport, Tcp::Syn, b""),
                Out::To(b1),
                "{fam:?} port {sport}"
            );
        }
        assert_eq!(
            lb.send(fam, svc, y, 3000, Tcp::Syn, b""),
            Out::To(b2),
            "{fam:?} another client"
        );

        // Idle 20 s of 30: kept, and the use refreshes the timestamp.
        let now = ktime_ns();
        set_affinity(
            &lb.t,
            svc,
            x,
            0,
            0,
            0,
            rv_affinity_value {
                backend_id: b1,
                pad: 0,
                last_seen_ns: now - 20_000_000_000,
            },
        );
        assert_eq!(
            lb.send(fam, svc, x, 3006, Tcp::Syn, b""),
            Out::To(b1),
            "{fam:?} within the timeout"
        );
        let a = affinity(&lb.t, svc, x, 0, 0, 0).unwrap();
        assert!(a.last_seen_ns >= now, "{fam:?} refreshed by use");

        // Idle 31 s: expired; a new choice is made and remembered.
        let now = ktime_ns();
        set_affinity(
            &lb.t,
            svc,
            x,
            0,
            0,
            0,
            rv_affinity_value {
                backend_id: b1,
                pad: 0,
                last_seen_ns: now - 31_000_000_000,
            },
        );
        assert_eq!(
            lb.send(fam, svc, x, 3007, Tcp::Syn, b""),
            Out::To(b2),
            "{fam:?} after the timeout"
        );
        let a = affinity(&lb.t, svc, x, 0, 0, 0).unwrap();
        assert_eq!(a.backend_id, b2);
        assert!(a.last_seen_ns >= now);
        assert_eq!(
            lb.send(fam, svc, x, 3000, Tcp::Ack, b""),
            Out::To(b2),
            "{fam:?} the client moved whole"
        );
    }

    // Timeout 0: never expires.
    let (fam, svc, b1, b2) = (Fam::V4, 3, 11, 12);
    lb.service(fam, svc, svc * 32, &[b1; 16], |s| {
        s.affinity = rv_affinity::RV_AFFINITY_CLIENT_IP.0 as u8;
        s.affinity_timeout_s = 0;
    });
    let x = fam.client(1);
    assert_eq!(lb.send(fam, svc, x, 3000, Tcp::Syn, b""), Out::To(b1));
    lb.slice(svc, &[b2; 16]);
    let old = ktime_ns().saturating_sub(3_600_000_000_000);
    set_affinity(
        &lb.t,
        svc,
        x,
        0,
        0,
        0,
        rv_affinity_value {
            backend_id: b1,
            pad: 0,
            last_seen_ns: old,
        },
    );
    assert_eq!(
        lb.send(fam, svc, x, 3001, Tcp::Syn, b""),
        Out::To(b1),
        "no timeout, no expiry"
    );
}

// ---------------------------------------------------------------------
// Health

/// Draining keeps a backend's flows and takes no new ones; down moves its
/// flows (and rewrites their affinity); nothing usable is a counted drop.
#[test]
fn draining_down_and_nothing_healthy() {
    let mut lb = Lb::new();
    let (fam, svc, b1, b2) = (Fam::V4, 1, 11, 12);
    lb.backend(fam, b1);
    lb.backend(fam, b2);
    // Seven slots of b1, one of b2: the probe window (8) covers the slice,
    // so with b1 unusable every new flow must find b2.
    let mut slots = vec![b1; 7];
    slots.push(b2);
    lb.service(fam, svc, 0, &slots, |_| {});
    let x = fam.client(1);
    let t = &lb.t;

    // Two flows on b1.
    let on_b1: Vec<u16> = (5000..5100)
        .filter(|&p| lb.send(fam, svc, x, p, Tcp::Syn, b"") == Out::To(b1))
        .take(2)
        .collect();
    let (f, h) = (on_b1[0], on_b1[1]);

    // Draining: established flows stay, new flows go elsewhere.
    t.health(b1, DRAINING);
    assert_eq!(
        lb.send(fam, svc, x, f, Tcp::Ack, b""),
        Out::To(b1),
        "draining keeps its flow"
    );
    assert_eq!(lb.send(fam, svc, x, h, Tcp::Ack, b""), Out::To(b1));
    for p in 5200..5220 {
        assert_eq!(
            lb.send(fam, svc, x, p, Tcp::Syn, b""),
            Out::To(b2),
            "no new flow on a draining backend"
        );
    }
    assert_eq!(
        affinity(t, svc, x, f, VPORT, PROTO_TCP).unwrap().backend_id,
        b1
    );

    // Down: the established flow is re-picked and its entry rewritten.
    t.health(b1, DOWN);
    assert_eq!(
        lb.send(fam, svc, x, f, Tcp::Ack, b""),
        Out::To(b2),
        "down loses its flow"
    );
    assert_eq!(
        affinity(t, svc, x, f, VPORT, PROTO_TCP).unwrap().backend_id,
        b2
    );

    // Nothing healthy: b1 draining, b2 down. h keeps b1; a new flow and
    // f (whose backend is down) have nowhere to go.
    t.health(b1, DRAINING);
    t.health(b2, DOWN);
    let nhb = |lb: &Lb| lb.drops(rv_drop_reason::RV_DROP_NO_HEALTHY_BACKEND);
    let before = nhb(&lb);
    let st = t.vip_stats(svc);
    assert_eq!(
        lb.send(fam, svc, x, h, Tcp::Ack, b""),
        Out::To(b1),
        "draining still serves its flow"
    );
    assert_eq!(
        lb.send(fam, svc, x, 5300, Tcp::Syn, b""),
        Out::Drop,
        "no healthy backend"
    );
    assert_eq!(
        lb.send(fam, svc, x, f, Tcp::Ack, b""),
        Out::Drop,
        "re-pick finds nothing"
    );
    assert!(
        affinity(t, svc, x, 5300, VPORT, PROTO_TCP).is_none(),
        "a drop records nothing"
    );

    // Everything down: even h is dropped.
    t.health(b1, DOWN);
    assert_eq!(lb.send(fam, svc, x, h, Tcp::Ack, b""), Out::Drop);
    assert_eq!(nhb(&lb), before + 3, "drop_stats_map no_healthy_backend");
    let st2 = t.vip_stats(svc);
    assert_eq!(st2.no_backend, st.no_backend + 3, "stats_map no_backend");
    assert_eq!(
        st2.packets,
        st.packets + 1,
        "drops are not forwarded packets"
    );

    // Recovery: a healthy backend serves again.
    t.health(b2, HEALTHY);
    assert_eq!(lb.send(fam, svc, x, 5301, Tcp::Syn, b""), Out::To(b2));
}

// ---------------------------------------------------------------------
// Maglev

/// The slot is the flow hash modulo the slice length (the hash every node
/// computes alike), and a pick steps over draining, down and empty slots
/// for at most RV_MAGLEV_PROBES slots, wrapping around the slice.
#[test]
fn maglev_slot_and_bounded_probe_window() {
    let mut lb = Lb::new();
    let fam = Fam::V4;
    let svc = 1;
    let ids: Vec<u32> = (101..117).collect();
    for &id in &ids {
        lb.backend(fam, id);
    }
    lb.service(fam, svc, 100, &ids, |_| {});
    let x = fam.client(1);
    let slot = |sport: u16| (flow_hash(x, sport, VPORT, PROTO_TCP, false) % 16) as usize;

    for sport in 6000..6064 {
        assert_eq!(
            lb.send(fam, svc, x, sport, Tcp::Syn, b""),
            Out::To(ids[slot(sport)]),
            "port {sport}"
        );
    }

    let probes = MAGLEV_PROBES as usize;
    assert_eq!(probes, 8);
    let mut sport = 7000u16;
    // k unusable slots from the hashed one; k = probes exhausts the window
    // although healthy backends sit just past it.
    for k in 1..=probes {
        sport += 1;
        let start = slot(sport);
        for i in 0..k {
            lb.t.health(
                ids[(start + i) % 16],
                if i % 2 == 0 { DOWN } else { DRAINING },
            );
        }
        let want = if k < probes {
            Out::To(ids[(start + k) % 16])
        } else {
            Out::Drop
        };
        assert_eq!(
            lb.send(fam, svc, x, sport, Tcp::Syn, b""),
            want,
            "{k} unusable slots from slot {start}"
        );
        for &id in &ids {
            lb.t.health(id, HEALTHY);
        }
    }

    // Wrapping: a flow hashed to the last slot, with 3 slots unusable.
    let sport = (8000..u16::MAX).find(|&p| slot(p) == 15).unwrap();
    for i in [15, 0, 1] {
        lb.t.health(ids[i], DOWN);
    }
    assert_eq!(
        lb.send(fam, svc, x, sport, Tcp::Syn, b""),
        Out::To(ids[2]),
        "probe wraps around"
    );
    for &id in &ids {
        lb.t.health(id, HEALTHY);
    }

    // An empty slot (backend id 0) is stepped over too.
    let sport = (9000..u16::MAX).find(|&p| slot(p) == 5).unwrap();
    let mut with_hole = ids.clone();
    with_hole[5] = 0;
    lb.slice(svc, &with_hole);
    assert_eq!(
        lb.send(fam, svc, x, sport, Tcp::Syn, b""),
        Out::To(ids[6]),
        "empty slot skipped"
    );
}

/// Weights are slots: a backend with 3x the slots of another gets about
/// 3x the flows. Thousands of flows from one client, random source ports:
/// a hash that ignored the ports, or spread badly, fails the tolerance.
#[test]
fn weights_show_in_the_spread() {
    let mut lb = Lb::new();
    let fam = Fam::V4;
    let (svc, a, b) = (1, 11, 12);
    lb.backend(fam, a);
    lb.backend(fam, b);
    // A hand-made 40-slot slice: A A A B, ten times.
    let slots: Vec<u32> = (0..40).map(|i| if i % 4 == 3 { b } else { a }).collect();
    lb.service(fam, svc, 0, &slots, |_| {});
    let x = fam.client(1);

    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut ports = HashSet::new();
    while ports.len() < 4000 {
        ports.insert(1024 + (rng.next() % (65536 - 1024)) as u16);
    }
    let (mut to_a, mut predicted_a) = (0usize, 0usize);
    let mut bytes = 0u64;
    for &p in &ports {
        bytes += tcp_frame(x, p, fam.vip(svc), VPORT, Tcp::Syn, b"").len() as u64;
        match lb.send(fam, svc, x, p, Tcp::Syn, b"") {
            Out::To(id) if id == a => to_a += 1,
            Out::To(id) if id == b => {}
            o => panic!("{o:?}"),
        }
        if slots[(flow_hash(x, p, VPORT, PROTO_TCP, false) % 40) as usize] == a {
            predicted_a += 1;
        }
    }
    let n = ports.len();
    let share = to_a as f64 / n as f64;
    // 0.75 expected; the binomial standard deviation at n = 4000 is 0.007.
    assert!(
        (share - 0.75).abs() < 0.035,
        "A's share {share:.3} (A {to_a}, B {})",
        n - to_a
    );
    assert_eq!(to_a, predicted_a, "every flow on its hashed slot");
    let st = lb.t.vip_stats(svc);
    assert_eq!((st.packets, st.bytes), (n as u64, bytes), "stats_map");
}
