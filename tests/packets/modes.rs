//! The three forwarding modes through xdp_ingress, and tc_nat's reply
//! translation (issue 2, proof 1): NAT (IPv4 and IPv6, TCP and UDP, port
//! translation and port keeping), DSR, and L3 DSR (IPIP, IPv6-in-IPv6)
//! with the FIB lookup answering, not answering and refusing, plus the
//! per-VIP counters.
//!
//! Every case asserts the verdict and every output byte against a frame
//! built independently with etherparse, the output's checksums with
//! etherparse's calculators, and the map state the run leaves.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::fixture::{self, Fx, Named};
use common::fixtures::*;
use common::netns::{InNetns, Netns};
use common::*;
use etherparse::{IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header};
use rivora::abi::*;
use rivora::model::Mode;

const CLIENT4: &str = "10.250.0.10";
const CLIENT6: &str = "fd00:fa::10";
const VIP4: &str = "10.0.0.100";
const VIP6: &str = "fd00::100";
const IFACE_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0xee];

fn backend(id: u32, addr: &str, port: u16) -> Be {
    Be {
        id,
        addr: ip(addr),
        port,
        mac: be_mac(id),
    }
}

/// NAT services: (svc, VIP, port, proto, backend address, backend port).
const NAT_SERVICES: &NatServices = &[
    (1, VIP4, 80, PROTO_TCP, "10.1.0.1", 8080),
    (2, VIP4, 53, PROTO_UDP, "10.1.0.2", 5353),
    (3, VIP4, 81, PROTO_TCP, "10.1.0.3", 0),
    (4, VIP4, 54, PROTO_UDP, "10.1.0.4", 0),
    (5, VIP6, 80, PROTO_TCP, "fd00:1::5", 8080),
    (6, VIP6, 53, PROTO_UDP, "fd00:1::6", 5353),
    (7, VIP6, 81, PROTO_TCP, "fd00:1::7", 0),
    (8, VIP6, 54, PROTO_UDP, "fd00:1::8", 0),
];

/// NAT services as (svc, VIP, port, proto, backend address, backend port).
type NatServices = [(u32, &'static str, u16, u8, &'static str, u16)];

/// Write each service of `services` with its one backend, through the
/// writer.
fn nat_services_setup(fx: &Fx, services: &NatServices) -> Named {
    let mut named = Named::default();
    for &(svc, vip, port, proto, addr, bport) in services {
        fx.add_named(
            &mut named,
            svc,
            Mode::Nat,
            (ip(vip), port, proto),
            backend(svc, addr, bport),
        );
    }
    named
}

fn nat_setup(fx: &Fx) -> Named {
    nat_services_setup(fx, NAT_SERVICES)
}

/// A request from the client to service `svc` of `services`.
fn nat_request(services: &NatServices, svc: u32, sport: u16) -> Frame {
    let &(_, vip, port, proto, _, _) = services.iter().find(|s| s.0 == svc).expect("a NAT service");
    match (vip == VIP4, proto) {
        (true, PROTO_TCP) => Frame::tcp4(CLIENT4, sport, vip, port),
        (true, _) => Frame::udp4(CLIENT4, sport, vip, port),
        (false, PROTO_TCP) => Frame::tcp6(CLIENT6, sport, vip, port),
        (false, _) => Frame::udp6(CLIENT6, sport, vip, port),
    }
}

fn request(svc: u32, sport: u16) -> Frame {
    nat_request(NAT_SERVICES, svc, sport)
}

/// NAT in both directions: each request rewritten to its backend (port
/// translated, or kept when the backend's port is 0), the flow recorded in
/// nat_reverse_map and the affinity map, then the backend's reply turned
/// back into the VIP's by tc_nat. A second, established packet of each
/// flow takes the same path without a new entry.
///
/// The FIB does not answer here: the test runs in a namespace of its own
/// with no route to any backend, so xdp_ingress leaves every request to
/// the kernel (XDP_PASS) with only the NAT rewrite done. The outcomes
/// where it does answer are `nat_*_fib_*` below.
#[test]
fn nat_forward_and_tc_nat_reply() {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_setup(&fx);
    let ns = Netns::new(&unique("rvnatpass"));
    let _in = InNetns::enter(&ns);
    let mut flows = Vec::new();
    for (i, &(svc, _, _, proto, _, _)) in NAT_SERVICES.iter().enumerate() {
        let sport = 50000 + i as u16;
        flows.push((format!("svc {svc}"), svc, request(svc, sport)));
        if proto == PROTO_UDP && svc <= 4 {
            // UDP over IPv4 without a checksum: 0 stays 0 both ways.
            flows.push((
                format!("svc {svc}, UDP checksum 0"),
                svc,
                request(svc, sport + 100).udp_zero_csum(),
            ));
        }
    }
    let mut bytes = [0u64; 9];
    let mut packets = [0u64; 9];
    for (desc, svc, f) in &flows {
        let be = bes[svc];
        let want = nat_of(f, &be);
        for (n, f) in [f.clone(), f.clone().established(2).payload(b"data")]
            .iter()
            .enumerate()
        {
            let desc = format!("{desc}, packet {}", n + 1);
            let input = f.build();
            let want = if n == 0 { want.clone() } else { nat_of(f, &be) };
            let out = run_case(
                t,
                &Case {
                    desc: desc.clone(),
                    input: input.clone(),
                    want: want.build(),
                    verdict: XDP_PASS,
                    drop: None,
                },
            );
            packets[*svc as usize] += 1;
            bytes[*svc as usize] += input.len() as u64;
            if matches!(
                f.l4,
                L4::Udp {
                    zero_csum: true,
                    ..
                }
            ) {
                let at = f.l4_off() + 6;
                assert_eq!(&out[at..at + 2], &[0, 0], "{desc}: UDP checksum stays 0");
            }
            assert_nat_entry(t, &desc, f, &be, bes.id(*svc));
            assert_eq!(
                affinity_of(t, bes.id(*svc), f),
                Some(be.id),
                "{desc}: affinity"
            );
        }

        // The backend answers; tc_nat restores the VIP as the source.
        let reply = want.reply();
        let (v, out) = t.run_tc(&reply.build());
        assert_eq!(v, TCX_PASS, "{desc}: reply verdict");
        let restored = reply.from(f.dst_ip(), f.dport());
        assert_bytes(&format!("{desc}, reply"), &out, &restored.build());
        assert_checksums(&out);
        if matches!(
            f.l4,
            L4::Udp {
                zero_csum: true,
                ..
            }
        ) {
            let at = f.l4_off() + 6;
            assert_eq!(&out[at..at + 2], &[0, 0], "{desc}: reply checksum stays 0");
        }
    }
    // Every backend serves one NAT VIP, which owns it: the flows' affinity
    // entries are what tc_nat translated by, and no flow inserted a
    // second entry.
    assert_eq!(nat_entries(t), 0, "no nat_reverse_map entry");
    for svc in 1..=8u32 {
        let s = t.vip_stats(bes.id(svc));
        assert_eq!(
            (s.packets, s.bytes),
            (packets[svc as usize], bytes[svc as usize]),
            "svc {svc} stats"
        );
    }
}

/// Replies tc_nat has no entry for leave as they came (TCX_NEXT).
#[test]
fn tc_nat_leaves_unknown_replies_untouched() {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_setup(&fx);
    let f4 = request(1, 51000);
    let f6 = request(5, 51000);
    for (svc, f) in [(1, &f4), (5, &f6)] {
        let (v, _) = t.run_xdp(&f.build());
        assert_eq!(v, XDP_PASS);
        assert_nat_entry(t, "setup", f, &bes[&svc], bes.id(svc));
    }
    let r4 = nat_of(&f4, &bes[&1]).reply();
    let r6 = nat_of(&f6, &bes[&5]).reply();
    let other4: IpAddr = ip("10.250.0.11");
    let other6: IpAddr = ip("fd00:fa::11");
    let cases = [
        (
            "IPv4: another client port",
            r4.clone().to(f4.src_ip(), 51001),
        ),
        ("IPv4: another client", r4.clone().to(other4, 51000)),
        (
            "IPv4: another backend port",
            r4.clone().from(bes[&1].addr, 8081),
        ),
        (
            "IPv4: the backend's VIP-port, not its own",
            r4.clone().from(bes[&1].addr, 80),
        ),
        (
            "IPv6: another client port",
            r6.clone().to(f6.src_ip(), 51001),
        ),
        ("IPv6: another client", r6.clone().to(other6, 51000)),
        (
            "IPv6: another backend",
            r6.clone().from(ip("fd00:1::99"), 8080),
        ),
        ("IPv4: the request itself", f4.clone()),
        ("IPv6: the request itself", f6.clone()),
    ];
    for (desc, f) in cases {
        let pkt = f.build();
        let (v, out) = t.run_tc(&pkt);
        assert_eq!(v, TCX_NEXT, "{desc}: verdict");
        assert_bytes(desc, &out, &pkt);
    }
    // The same 5-tuple over UDP: the protocol is part of the key.
    let mut udp = Frame::udp4("10.1.0.1", 8080, CLIENT4, 51000);
    udp.src_mac = r4.src_mac;
    udp.dst_mac = r4.dst_mac;
    let pkt = udp.build();
    let (v, out) = t.run_tc(&pkt);
    assert_eq!(v, TCX_NEXT, "UDP with a TCP flow's tuple");
    assert_bytes("UDP with a TCP flow's tuple", &out, &pkt);
    assert_eq!(nat_entries(t), 0, "tc_nat creates no entries");
    assert_eq!(
        t.maps.connection_affinity_map.keys::<rv_flow_key>().len()
            + t.maps.connection_affinity_map6.keys::<rv_flow6_key>().len(),
        2,
        "tc_nat creates no entries"
    );
}

/// Two NAT VIPs (per family) on one backend's (address, port, proto).
const SHARED_SERVICES: &NatServices = &[
    (51, VIP4, 80, PROTO_TCP, "10.9.0.51", 8080),
    (52, VIP4, 81, PROTO_TCP, "10.9.0.51", 8080),
    (53, VIP6, 80, PROTO_TCP, "fd00:9::51", 8080),
    (54, VIP6, 81, PROTO_TCP, "fd00:9::51", 8080),
];

/// One LRU insert per new NAT flow, yet every reply translated when two
/// VIPs share a backend: the VIP that owns it (nat_owner_map) records
/// nothing and its replies are proven by its flows' affinity entries; the
/// other records reverse entries. A client port reused from one VIP's
/// flow for the other's (the backend sees the same connection) gets the
/// new flow's VIP back, either way round.
#[test]
fn nat_two_vips_sharing_a_backend_translate_every_reply() {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_services_setup(&fx, SHARED_SERVICES);
    let ns = Netns::new(&unique("rvnatshare"));
    let _in = InNetns::enter(&ns);
    for pair in [[51, 52], [53, 54]] {
        let be = bes[&pair[0]];
        let o = nat_owner(t, be.addr, 8080, PROTO_TCP).expect("the backend has an owner");
        let owner = *pair
            .iter()
            .find(|n| bes.id(**n) == o.svc_id)
            .expect("one of the two VIPs owns the backend");
        let other = if owner == pair[0] { pair[1] } else { pair[0] };
        let entries_before = nat_entries(t);
        // (VIP, client port): the last two reuse the first two's ports
        // for the other VIP.
        let flows = [
            (owner, 60001),
            (other, 60002),
            (other, 60001),
            (owner, 60002),
        ];
        for (svc, sport) in flows {
            let f = nat_request(SHARED_SERVICES, svc, sport);
            let desc = format!("svc {svc} (owner {owner}), client port {sport}");
            run_case(
                t,
                &Case {
                    desc: desc.clone(),
                    input: f.build(),
                    want: nat_of(&f, &bes[&svc]).build(),
                    verdict: XDP_PASS,
                    drop: None,
                },
            );
            if (svc, sport) == (owner, 60002) {
                // The other VIP's earlier flow left its reverse entry for
                // this tuple: the owner's check comes first, and this
                // flow inserted nothing (counted below).
                assert_eq!(
                    affinity_of(t, bes.id(svc), &f),
                    Some(bes[&svc].id),
                    "{desc}: affinity"
                );
            } else {
                assert_nat_entry(t, &desc, &f, &bes[&svc], bes.id(svc));
            }
            let reply = nat_of(&f, &bes[&svc]).reply();
            let (v, out) = t.run_tc(&reply.build());
            assert_eq!(v, TCX_PASS, "{desc}: reply verdict");
            let restored = reply.from(f.dst_ip(), f.dport());
            assert_bytes(&format!("{desc}, reply"), &out, &restored.build());
            assert_checksums(&out);
        }
        assert_eq!(
            nat_entries(t) - entries_before,
            2,
            "reverse entries for the other VIP's two flows alone"
        );
    }
}

/// A backend taken out of a NAT VIP and put back before the writer has
/// reclaimed what the removal retired (the reconciler reclaims after a
/// grace period, on a ticket, while it goes on applying): every reply of a
/// flow opened from then on must be translated (issue 27, item 0: before
/// the fix the client got the backend's own address). Three moments:
///
/// 1. Between the service switch and the owner rewrite: the VIP's owner
///    entry for the backend's (address, port, proto) still names the id
///    the backend had, and the backend is back under a new one (written
///    here as the maps hold it in that window). xdp_ingress used to see an
///    owner of its own VIP and record nothing, while tc_nat's owner check
///    (the flow's affinity entry names the new id) failed with no reverse
///    entry behind it. Now such a flow records its reverse entry.
/// 2. After the writer's claim and before the reclaim: the owner names the
///    new id.
/// 3. After the reclaim of the removal: the VIP still owns the key (the
///    removal's queued deletion used to run after the claim and take it).
#[test]
fn nat_backend_back_before_the_reclaim_keeps_every_reply_translated() {
    let fx = Fx::new();
    let t = &fx.t;
    let ns = Netns::new(&unique("rvnatback"));
    let _in = InNetns::enter(&ns);
    let mac = |i: u8| [0x02, 0xbb, 0, 0, 0, i];
    for (family, vip_addr, b1_addr, b2_addr) in [
        ("IPv4", VIP4, "10.9.2.1", "10.9.2.2"),
        ("IPv6", VIP6, "fd00:9:2::1", "fd00:9:2::2"),
    ] {
        let b1 = fixture::backend(ip(b1_addr), 8080, mac(1));
        let b2 = fixture::backend(ip(b2_addr), 8080, mac(2));
        let both = fixture::vip(ip(vip_addr), 82, PROTO_TCP, Mode::Nat, vec![b1, b2.clone()]);
        let first = fx.apply(&both);
        let svc = first.svc;
        let old_id = first.ids[0];
        let owner_of_b1 =
            || nat_owner(t, ip(b1_addr), 8080, PROTO_TCP).map(|o| (o.svc_id, o.backend_id));
        assert_eq!(
            owner_of_b1(),
            Some((svc, old_id)),
            "{family}: the VIP owns b1"
        );
        // Out and back in, with no reclaim between or after.
        let only_b2 = fixture::vip(ip(vip_addr), 82, PROTO_TCP, Mode::Nat, vec![b2]);
        fx.w.borrow_mut().upsert_vip(&only_b2).expect("b1 out");
        fx.w.borrow_mut().upsert_vip(&both).expect("b1 back");
        let back = fx.placed(&both);
        assert_ne!(back.ids[0], old_id, "{family}: b1 is back under a new id");
        assert_eq!(
            owner_of_b1(),
            Some((svc, back.ids[0])),
            "{family}: the VIP took its key back under the new id"
        );
        let b1_be = Be {
            id: back.ids[0],
            addr: ip(b1_addr),
            port: 8080,
            mac: mac(1),
        };
        // Moment 1: the owner entry as it was before the writer's claim.
        let set_owner_id = |id: u32| {
            let mut o = nat_owner(t, ip(b1_addr), 8080, PROTO_TCP).expect("b1's owner entry");
            o.backend_id = id;
            match ip(b1_addr) {
                IpAddr::V4(a) => t.maps.nat_owner_map.put(
                    &rv_nat_owner_key {
                        backend_addr: be32(a),
                        backend_port: be16(8080),
                        proto: PROTO_TCP,
                        pad: 0,
                    },
                    &o,
                ),
                IpAddr::V6(a) => t.maps.nat_owner_map6.put(
                    &rv_nat_owner6_key {
                        backend_addr: be32x4(a),
                        backend_port: be16(8080),
                        proto: PROTO_TCP,
                        pad: 0,
                    },
                    &o,
                ),
            }
            .expect("writing b1's owner entry")
        };
        set_owner_id(old_id);
        let client = if vip_addr == VIP4 { CLIENT4 } else { CLIENT6 };
        let flows: Vec<u16> = (41000u16..43000)
            .filter(|sport| fx.pick_flow(svc, ip(client), *sport, 82, PROTO_TCP) == Some(b1_be.id))
            .take(9)
            .collect();
        assert_eq!(flows.len(), 9, "{family}: nine flows to b1");
        for (i, sport) in flows.into_iter().enumerate() {
            let moment = i / 3 + 1;
            if i == 3 {
                set_owner_id(b1_be.id);
            }
            if i == 6 {
                fx.w.borrow_mut().reclaim().expect("reclaim");
                assert_eq!(
                    owner_of_b1(),
                    Some((svc, b1_be.id)),
                    "{family}: after the reclaim the VIP still owns b1 under the new id"
                );
            }
            let f = if vip_addr == VIP4 {
                Frame::tcp4(client, sport, vip_addr, 82)
            } else {
                Frame::tcp6(client, sport, vip_addr, 82)
            };
            let desc = format!("{family}, moment {moment}, client port {sport}");
            run_case(
                t,
                &Case {
                    desc: desc.clone(),
                    input: f.build(),
                    want: nat_of(&f, &b1_be).build(),
                    verdict: XDP_PASS,
                    drop: None,
                },
            );
            assert_eq!(
                has_nat_reverse(t, &f, b1_be.addr, 8080),
                moment == 1,
                "{desc}: a reverse entry only while the owner names another id"
            );
            let reply = nat_of(&f, &b1_be).reply();
            let (v, out) = t.run_tc(&reply.build());
            assert_eq!(v, TCX_PASS, "{desc}: reply verdict");
            assert_bytes(
                &format!("{desc}, reply"),
                &out,
                &reply.from(f.dst_ip(), f.dport()).build(),
            );
        }
        fx.remove(&both);
    }
}

/// DSR: the backend holds the VIP; only the MACs change (source from
/// iface_mac_map, destination the backend's), out the way it came.
#[test]
fn dsr_rewrites_the_macs_only() {
    let fx = Fx::new();
    let t = &fx.t;
    let list = [
        (11, VIP4, 443, PROTO_TCP, "10.1.0.11"),
        (12, VIP4, 443, PROTO_UDP, "10.1.0.12"),
        (13, VIP6, 443, PROTO_TCP, "fd00:1::13"),
        (14, VIP6, 443, PROTO_UDP, "fd00:1::14"),
    ];
    fx.iface_mac(TEST_RUN_IFINDEX, IFACE_MAC);
    let mut svcs = Named::default();
    for &(svc, vip, port, proto, addr) in &list {
        fx.add_named(
            &mut svcs,
            svc,
            Mode::Dsr,
            (ip(vip), port, proto),
            backend(svc, addr, 0),
        );
    }
    let frames = [
        (11, Frame::tcp4(CLIENT4, 52000, VIP4, 443)),
        (12, Frame::udp4(CLIENT4, 52000, VIP4, 443)),
        (13, Frame::tcp6(CLIENT6, 52000, VIP6, 443)),
        (14, Frame::udp6(CLIENT6, 52000, VIP6, 443)),
        (
            11,
            Frame::tcp4(CLIENT4, 52001, VIP4, 443).vlan(Vlan::Dot1q(12)),
        ),
        (
            14,
            Frame::udp6(CLIENT6, 52001, VIP6, 443).vlan(Vlan::QinQ(1, 2)),
        ),
    ];
    for (svc, f) in &frames {
        let desc = format!("DSR svc {svc}, {:?}", f.vlan);
        let want = f.clone().macs(IFACE_MAC, be_mac(*svc)).build();
        let input = f.build();
        let out = run_case(
            t,
            &Case {
                desc: desc.clone(),
                input: input.clone(),
                want,
                verdict: XDP_TX,
                drop: None,
            },
        );
        // Nothing but the 12 MAC bytes moved.
        assert_eq!(out[12..], input[12..], "{desc}: past the MACs");
        assert_eq!(
            affinity_of(t, svcs.id(*svc), f),
            Some(svcs[svc].id),
            "{desc}: affinity"
        );
    }
    assert_eq!(nat_entries(t), 0, "DSR keeps no NAT state");
    assert_eq!(t.vip_stats(svcs.id(11)).packets, 2);
    assert_eq!(t.vip_stats(svcs.id(14)).packets, 2);

    // Without the interface's MAC there is no source to send from.
    fx.no_iface_mac(TEST_RUN_IFINDEX);
    for (svc, f) in &frames[..4] {
        let f = f.clone().from(f.src_ip(), 52100);
        run_case(
            t,
            &Case::dropped(
                &format!("DSR svc {svc} without an iface MAC"),
                f.build(),
                rv_drop_reason::RV_DROP_NO_IFACE_MAC,
            ),
        );
    }
}

const VETH_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x01];
const GW_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x02];
const TUN4: &str = "10.250.0.1";
const TUN6: &str = "fd00:fa:ff::1";

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A namespace whose routing gives each L3 DSR outcome a backend prefix:
/// 10.1/16 and fd00:1::/64 through a resolved gateway, 10.2/16 and
/// fd00:2::/64 through one with no neighbour entry, 10.3/16 and
/// fd00:3::/64 unreachable. Returns the namespace and veth0's ifindex.
fn l3dsr_netns() -> (Netns, u32) {
    let ns = Netns::new(&unique("rvmodes"));
    ns.exec(&format!(
        "ip link add veth0 address {} type veth peer name veth1 && \
         ip link set veth0 up && ip link set veth1 up && \
         ip addr add {TUN4}/24 dev veth0 && \
         ip -6 addr add {TUN6}/64 dev veth0 nodad && \
         ip neigh add 10.250.0.2 lladdr {gw} dev veth0 nud permanent && \
         ip -6 neigh add fd00:fa:ff::2 lladdr {gw} dev veth0 nud permanent && \
         ip route add 10.1.0.0/16 via 10.250.0.2 && \
         ip route add 10.2.0.0/16 via 10.250.0.3 && \
         ip route add unreachable 10.3.0.0/16 && \
         ip -6 route add fd00:1::/64 via fd00:fa:ff::2 && \
         ip -6 route add fd00:2::/64 via fd00:fa:ff::3 && \
         ip -6 route add unreachable fd00:3::/64 && \
         sysctl -qw net.ipv4.ip_forward=1 && \
         sysctl -qw net.ipv6.conf.all.forwarding=1",
        mac_str(VETH_MAC),
        gw = mac_str(GW_MAC),
    ));
    let ifindex = ifindex_of(&ns, "veth0");
    (ns, ifindex)
}

fn ifindex_of(ns: &Netns, dev: &str) -> u32 {
    let line = ns.exec(&format!("ip -o link show {dev}"));
    line.split(':')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{dev} ifindex in `{line}`"))
}

/// L3 DSR services: (svc, VIP, port, proto, backend).
const L3DSR_SERVICES: &[(u32, &str, u16, u8, &str)] = &[
    (21, VIP4, 80, PROTO_TCP, "10.1.0.21"),
    (22, VIP4, 53, PROTO_UDP, "10.1.0.22"),
    (23, VIP4, 81, PROTO_TCP, "10.2.0.23"),
    (24, VIP4, 82, PROTO_TCP, "10.3.0.24"),
    (25, VIP6, 80, PROTO_TCP, "fd00:1::25"),
    (26, VIP6, 53, PROTO_UDP, "fd00:1::26"),
    (27, VIP6, 81, PROTO_TCP, "fd00:2::27"),
    (28, VIP6, 82, PROTO_TCP, "fd00:3::28"),
];

/// The L3 DSR services, through the writer (which wants the tunnel
/// sources first: an L3 DSR VIP without one is refused).
fn l3dsr_setup(fx: &Fx) -> Named {
    fx.tunnel(Some(TUN4.parse().unwrap()), Some(TUN6.parse().unwrap()));
    let mut named = Named::default();
    for &(svc, vip, port, proto, addr) in L3DSR_SERVICES {
        fx.add_named(
            &mut named,
            svc,
            Mode::L3Dsr,
            (ip(vip), port, proto),
            backend(svc, addr, 0),
        );
    }
    named
}

fn l3dsr_request(svc: u32, sport: u16) -> Frame {
    let &(_, vip, port, proto, _) = L3DSR_SERVICES
        .iter()
        .find(|s| s.0 == svc)
        .expect("an L3 DSR service");
    match (vip == VIP4, proto) {
        (true, PROTO_TCP) => Frame::tcp4(CLIENT4, sport, vip, port),
        (true, _) => Frame::udp4(CLIENT4, sport, vip, port),
        (false, PROTO_TCP) => Frame::tcp6(CLIENT6, sport, vip, port),
        (false, _) => Frame::udp6(CLIENT6, sport, vip, port),
    }
}

/// The encapsulated frame L3 DSR must produce: `l2` (the MACs it should
/// carry), the outer header (source from tunnel_config_map, TTL/hop limit
/// 64, IPv4 id 0 (DF) or the IPv6 flow label (`flow_label`), TOS and DF from the
/// inner IPv4 header), then the original IP packet byte for byte.
fn encapsulated(f: &Frame, backend: IpAddr, macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let input = f.build();
    let mut out = f.clone().macs(macs.0, macs.1).build()[..f.l3_off()].to_vec();
    let inner = &input[f.l3_off()..];
    let label = flow_label(f.src_ip(), f.sport(), f.dport(), f.proto());
    match backend {
        IpAddr::V4(b) => {
            let src: Ipv4Addr = TUN4.parse().unwrap();
            let mut h = Ipv4Header::new(
                inner.len() as u16,
                64,
                IpNumber::IPV4,
                src.octets(),
                b.octets(),
            )
            .expect("outer IPv4");
            // The inner header carries DF: an atomic datagram, whose id
            // is 0 (RFC 6864).
            h.identification = 0;
            h.dont_fragment = true; // the inner header's DF
            h.header_checksum = h.calc_header_checksum();
            h.write(&mut out).expect("outer IPv4");
        }
        IpAddr::V6(b) => {
            let src: Ipv6Addr = TUN6.parse().unwrap();
            Ipv6Header {
                traffic_class: 0,
                flow_label: Ipv6FlowLabel::try_new(label).unwrap(),
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

/// L3 DSR with every FIB outcome, for IPv4 (IPIP) and IPv6
/// (IPv6-in-IPv6), in a namespace of its own.
#[test]
fn l3dsr_encapsulates_and_follows_the_fib() {
    let fx = Fx::new();
    let t = &fx.t;
    let svcs = l3dsr_setup(&fx);
    let (ns, veth) = l3dsr_netns();
    let _in = InNetns::enter(&ns);
    let backend_of = |svc: u32| ip(L3DSR_SERVICES.iter().find(|s| s.0 == svc).unwrap().4);
    let mut sport = 53000;

    // The lookup answers: the frame goes out of veth0 to the gateway.
    // Without a context the ingress device is lo. While veth0 is not an
    // interface rivorad is attached to (not in iface_mac_map) a redirect
    // there could be lost, so the kernel gets the encapsulated packet.
    // The kernel's to finish: encapsulated, MACs as they came.
    let to_kernel = |svc: u32, sport: u16, why: &str| {
        let f = l3dsr_request(svc, sport);
        let want = encapsulated(&f, backend_of(svc), (f.src_mac, f.dst_mac));
        let out = run_case(
            t,
            &Case {
                desc: format!("L3 DSR svc {svc}, {why}"),
                input: f.build(),
                want,
                verdict: XDP_PASS,
                drop: None,
            },
        );
        assert_checksums(&out);
    };
    for svc in [21, 25] {
        sport += 1;
        to_kernel(svc, sport, "egress not attached");
    }
    // Once it is, the frame is redirected there; arriving on veth0
    // itself, it is sent back out with XDP_TX.
    fx.iface_mac(veth, VETH_MAC);
    for svc in [21, 22, 25, 26] {
        for vlan in [Vlan::None, Vlan::Dot1q(5), Vlan::QinQ(6, 7)] {
            sport += 1;
            let f = l3dsr_request(svc, sport).vlan(vlan);
            let input = f.build();
            let want = encapsulated(&f, backend_of(svc), (VETH_MAC, GW_MAC));
            let desc = format!("L3 DSR svc {svc}, {vlan:?}, lookup answers");
            let before = drop_counts(t);
            let (v, out) = try_run_xdp(t, &input, None).expect("test_run");
            assert_eq!(v, XDP_REDIRECT, "{desc}: from lo, verdict");
            assert_bytes(&desc, &out, &want);
            assert_eq!(
                assert_checksums(&out),
                if f.dst_ip().is_ipv4() { 3 } else { 1 }
            );
            assert_eq!(
                out[out.len() - (input.len() - f.l3_off())..],
                input[f.l3_off()..]
            );

            let mut md = xdp_md(input.len(), veth);
            let (v, out) = try_run_xdp(t, &input, Some(&mut md)).expect("test_run with ctx");
            assert_eq!(v, XDP_TX, "{desc}: from veth0, verdict");
            assert_bytes(&format!("{desc}, from veth0"), &out, &want);
            assert_eq!(drop_counts(t), before, "{desc}: nothing dropped");
            assert_eq!(
                affinity_of(t, svcs.id(svc), &f),
                Some(svcs[&svc].id),
                "{desc}: affinity"
            );
        }
    }

    // No neighbour entry for the gateway: the kernel gets the encapsulated
    // packet (MACs as they came) and resolves it.
    for svc in [23, 27] {
        sport += 1;
        to_kernel(svc, sport, "no neighbour");
    }

    // An unreachable route: dropped, counted, not encapsulated.
    for svc in [24, 28] {
        sport += 1;
        let f = l3dsr_request(svc, sport);
        run_case(
            t,
            &Case::dropped(
                &format!("L3 DSR svc {svc}, unreachable"),
                f.build(),
                rv_drop_reason::RV_DROP_FIB_UNREACHABLE,
            ),
        );
    }
    assert_eq!(nat_entries(t), 0, "L3 DSR keeps no NAT state");
    assert_eq!(
        t.vip_stats(svcs.id(21)).packets,
        7,
        "one run while veth0 is not attached, then two per shape"
    );
}

/// Without an outer source address configured, L3 DSR cannot build the
/// outer header: dropped and counted, for each family on its own.
#[test]
fn l3dsr_without_a_tunnel_source_is_dropped() {
    let fx = Fx::new();
    let t = &fx.t;
    l3dsr_setup(&fx);
    let (ns, veth) = l3dsr_netns();
    fx.iface_mac(veth, VETH_MAC);
    let _in = InNetns::enter(&ns);
    let no_src = rv_drop_reason::RV_DROP_NO_TUNNEL_SRC;

    // No IPv6 source: IPv6 drops, IPv4 still encapsulates.
    fx.tunnel(Some(TUN4.parse().unwrap()), None);
    let f6 = l3dsr_request(25, 54000);
    run_case(t, &Case::dropped("IPv6 without src6", f6.build(), no_src));
    let f4 = l3dsr_request(21, 54000);
    let (v, _) = t.run_xdp(&f4.build());
    assert_eq!(v, XDP_REDIRECT, "IPv4 with src4 still forwarded");

    // No IPv4 source: IPv4 drops, IPv6 encapsulates.
    fx.tunnel(None, Some(TUN6.parse().unwrap()));
    run_case(t, &Case::dropped("IPv4 without src4", f4.build(), no_src));
    let (v, _) = t.run_xdp(&f6.build());
    assert_eq!(v, XDP_REDIRECT, "IPv6 with src6 still forwarded");

    // No entry at all (the array's zeroed slot).
    fx.tunnel(None, None);
    for (desc, f) in [("IPv4, no tunnel", &f4), ("IPv6, no tunnel", &f6)] {
        run_case(t, &Case::dropped(desc, f.build(), no_src));
    }
}

/// stats_map counts each VIP's packets and frame bytes, per VIP, on
/// every CPU summed; traffic that is not a VIP's is not counted.
#[test]
fn per_vip_stats_count_packets_and_bytes() {
    let fx = Fx::new();
    let t = &fx.t;
    let mut bes = nat_setup(&fx);
    fx.iface_mac(TEST_RUN_IFINDEX, IFACE_MAC);
    fx.add_named(
        &mut bes,
        11,
        Mode::Dsr,
        (ip(VIP4), 443, PROTO_TCP),
        backend(11, "10.1.0.11", 0),
    );
    let sends: Vec<(u32, Frame)> = vec![
        (1, request(1, 55000)),
        (1, request(1, 55000).established(2).payload(&[7; 300])),
        (
            1,
            request(1, 55001).vlan(Vlan::QinQ(1, 2)).payload(&[1; 1000]),
        ),
        (6, request(6, 55000).payload(&[0; 64])),
        (6, request(6, 55000).payload(&[0; 1])),
        (11, Frame::tcp4(CLIENT4, 55000, VIP4, 443).payload(b"")),
    ];
    let mut want = std::collections::HashMap::<u32, (u64, u64)>::new();
    for (svc, f) in &sends {
        let pkt = f.build();
        let (v, _) = t.run_xdp(&pkt);
        assert!(v == XDP_PASS || v == XDP_TX, "svc {svc}: forwarded");
        let e = want.entry(*svc).or_default();
        e.0 += 1;
        e.1 += pkt.len() as u64;
    }
    // Not a VIP's: not counted anywhere.
    for f in [
        Frame::tcp4(CLIENT4, 55000, "10.0.0.1", 80),
        Frame::udp6(CLIENT6, 55000, VIP6, 9),
    ] {
        let (v, _) = t.run_xdp(&f.build());
        assert_eq!(v, XDP_PASS);
    }
    for svc in [1u32, 2, 3, 4, 5, 6, 7, 8, 11] {
        let s = t.vip_stats(bes.id(svc));
        let (p, b) = want.get(&svc).copied().unwrap_or_default();
        assert_eq!((s.packets, s.bytes), (p, b), "svc {svc}: packets, bytes");
        assert_eq!((s.rate_limited, s.no_backend), (0, 0), "svc {svc}: drops");
    }
}

/// An outer IPv4 header that may be fragmented on the way (inner DF clear)
/// needs an id not reused within the reassembly window (RFC 6864): the
/// flow's packets must not all carry one id. With DF the id is 0.
#[test]
fn l3dsr_outer_id_varies_unless_atomic() {
    let fx = Fx::new();
    let t = &fx.t;
    l3dsr_setup(&fx);
    let (ns, veth) = l3dsr_netns();
    fx.iface_mac(veth, VETH_MAC);
    let _in = InNetns::enter(&ns);
    let outer_id = |df: bool| -> u16 {
        let mut h =
            Ipv4Header::new(8 + 4, 64, IpNumber::UDP, ip4(CLIENT4), ip4(VIP4)).expect("ipv4");
        h.dont_fragment = df;
        let mut pkt = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ip(etherparse::IpHeaders::Ipv4(h, Default::default()))
            .udp(40123, 53)
            .write(&mut pkt, b"ping")
            .expect("packet");
        let (v, out) = t.run_xdp(&pkt);
        assert!(
            v == XDP_TX || v == XDP_REDIRECT,
            "encapsulated and sent: verdict {v}"
        );
        let (outer, _) = Ipv4Header::from_slice(&out[14..]).expect("outer IPv4");
        assert_eq!(outer.protocol, IpNumber::IPV4);
        assert_eq!(outer.dont_fragment, df, "DF copied from the inner header");
        assert_eq!(outer.header_checksum, outer.calc_header_checksum());
        outer.identification
    };
    for _ in 0..4 {
        assert_eq!(outer_id(true), 0, "an atomic datagram carries id 0");
    }
    let ids: Vec<u16> = (0..4).map(|_| outer_id(false)).collect();
    // Four equal random ids: odds of 1 in 2^48.
    assert!(
        ids.iter().any(|&i| i != ids[0]),
        "outer ids of one flow all equal: {ids:?}"
    );
}

fn ip4(s: &str) -> [u8; 4] {
    s.parse::<Ipv4Addr>().expect("an IPv4 constant").octets()
}

// ---------------------------------------------------------------------
// NAT with the FIB answering: sent from XDP as a router would, or left
// to the kernel with the rewrite done.

const VETH2_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x03];
const GW2_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x04];
/// veth0's second gateway, for the multipath routes.
const GW3_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x07];
const VETH4_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x05];
const GW4_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x06];
/// veth4's MTU: the IP packets NAT sends out of it must fit.
const SMALL_MTU: usize = 1300;

/// The namespace NAT's FIB outcomes need, on top of `l3dsr_netns`
/// (10.1/16 and fd00:1::/64 through a resolved gateway on veth0, 10.2/16
/// and fd00:2::/64 through one with no neighbour entry): 10.4/16 and
/// fd00:4::/64 through a resolved gateway on a second interface, veth2;
/// 10.5/16 and fd00:5::/64 through a resolved gateway on veth4, whose MTU
/// is 1300; 10.6/16 and fd00:6::/64 through veth0's resolved gateway with
/// a locked route MTU of 1300 (bpf_fib_lookup, unlike the kernel's own
/// forwarding, ignores a route MTU that is not locked); 10.7/16 and
/// fd00:7::/64 over two resolved gateways on veth0, hashed on addresses
/// and ports (`fib_multipath_hash_policy=1`). Returns the namespace and
/// the ifindexes of veth0, veth2 and veth4.
fn nat_netns() -> (Netns, u32, u32, u32) {
    let (ns, veth0) = l3dsr_netns();
    ns.exec(&format!(
        "ip link add veth2 address {v2} type veth peer name veth3 && \
         ip link set veth2 up && ip link set veth3 up && \
         ip addr add 10.251.0.1/24 dev veth2 && \
         ip -6 addr add fd00:fb:ff::1/64 dev veth2 nodad && \
         ip neigh add 10.251.0.2 lladdr {gw2} dev veth2 nud permanent && \
         ip -6 neigh add fd00:fb:ff::2 lladdr {gw2} dev veth2 nud permanent && \
         ip route add 10.4.0.0/16 via 10.251.0.2 && \
         ip -6 route add fd00:4::/64 via fd00:fb:ff::2 && \
         ip link add veth4 address {v4} mtu {SMALL_MTU} type veth peer name veth5 && \
         ip link set veth4 up && ip link set veth5 up && \
         ip addr add 10.252.0.1/24 dev veth4 && \
         ip -6 addr add fd00:fc:ff::1/64 dev veth4 nodad && \
         ip neigh add 10.252.0.2 lladdr {gw4} dev veth4 nud permanent && \
         ip -6 neigh add fd00:fc:ff::2 lladdr {gw4} dev veth4 nud permanent && \
         ip route add 10.5.0.0/16 via 10.252.0.2 && \
         ip -6 route add fd00:5::/64 via fd00:fc:ff::2 && \
         ip route add 10.6.0.0/16 via 10.250.0.2 mtu lock {SMALL_MTU} && \
         ip -6 route add fd00:6::/64 via fd00:fa:ff::2 mtu lock {SMALL_MTU} && \
         ip neigh add 10.250.0.4 lladdr {gw3} dev veth0 nud permanent && \
         ip -6 neigh add fd00:fa:ff::4 lladdr {gw3} dev veth0 nud permanent && \
         ip route add 10.7.0.0/16 nexthop via 10.250.0.2 nexthop via 10.250.0.4 && \
         ip -6 route add fd00:7::/64 nexthop via fd00:fa:ff::2 nexthop via fd00:fa:ff::4 && \
         sysctl -qw net.ipv4.fib_multipath_hash_policy=1 && \
         sysctl -qw net.ipv6.fib_multipath_hash_policy=1",
        v2 = mac_str(VETH2_MAC),
        gw2 = mac_str(GW2_MAC),
        v4 = mac_str(VETH4_MAC),
        gw4 = mac_str(GW4_MAC),
        gw3 = mac_str(GW3_MAC),
    ));
    let veth2 = ifindex_of(&ns, "veth2");
    let veth4 = ifindex_of(&ns, "veth4");
    (ns, veth0, veth2, veth4)
}

/// NAT services by where nat_netns routes their backend: (svc, VIP, port,
/// proto, backend address, backend port).
const NAT_FIB_SERVICES: &NatServices = &[
    // Resolved, out of veth0.
    (31, VIP4, 80, PROTO_TCP, "10.1.0.31", 8080),
    (32, VIP4, 53, PROTO_UDP, "10.1.0.32", 5353),
    (33, VIP6, 80, PROTO_TCP, "fd00:1::33", 8080),
    (34, VIP6, 53, PROTO_UDP, "fd00:1::34", 5353),
    // Resolved, out of veth2.
    (35, VIP4, 81, PROTO_TCP, "10.4.0.35", 0),
    (36, VIP6, 81, PROTO_UDP, "fd00:4::36", 0),
    // No neighbour entry.
    (37, VIP4, 82, PROTO_TCP, "10.2.0.37", 8082),
    (38, VIP6, 82, PROTO_UDP, "fd00:2::38", 8082),
    // Resolved, out of veth4 (MTU 1300).
    (39, VIP4, 83, PROTO_TCP, "10.5.0.39", 8083),
    (40, VIP6, 83, PROTO_UDP, "fd00:5::40", 8083),
    // Resolved, out of veth0, route MTU 1300 (locked).
    (41, VIP4, 84, PROTO_UDP, "10.6.0.41", 8084),
    (42, VIP6, 84, PROTO_TCP, "fd00:6::42", 8084),
    // Resolved, out of veth0, two paths.
    (43, VIP4, 85, PROTO_UDP, "10.7.0.43", 5353),
    (44, VIP6, 85, PROTO_UDP, "fd00:7::44", 5353),
];

fn nat_fib_setup(fx: &Fx) -> Named {
    nat_services_setup(fx, NAT_FIB_SERVICES)
}

fn nat_fib_request(svc: u32, sport: u16) -> Frame {
    nat_request(NAT_FIB_SERVICES, svc, sport)
}

/// The frame a request arriving with TTL (hop limit) 64 must leave as when
/// xdp_ingress sends it itself: NAT'd, TTL 63, the MACs of the FIB's
/// answer, VLAN tags as they came. Built by etherparse from scratch, so
/// every checksum in it is computed, not updated.
fn nat_routed(f: &Frame, be: &Be, macs: ([u8; 6], [u8; 6])) -> Frame {
    nat_of(f, be).macs(macs.0, macs.1).ttl(63)
}

/// xdp_ingress once, as if `input` arrived on `ifindex`: the verdict and
/// the output, asserted to drop nothing.
fn run_on(t: &TestDp, desc: &str, ifindex: u32, input: &[u8]) -> (u32, Vec<u8>) {
    let before = drop_counts(t);
    let mut md = xdp_md(input.len(), ifindex);
    let r = try_run_xdp(t, input, Some(&mut md)).expect("test_run with ctx");
    assert_eq!(
        drop_delta(&before, &drop_counts(t)),
        vec![],
        "{desc}: drop counters"
    );
    r
}

/// Run `f` as arriving on `ifindex`; assert the verdict, every byte of the
/// output against `want`, and the output's checksums independently.
fn expect_on(t: &TestDp, desc: &str, ifindex: u32, f: &Frame, verdict: u32, want: &Frame) {
    let (v, out) = run_on(t, desc, ifindex, &f.build());
    assert_eq!(v, verdict, "{desc}: verdict");
    assert_bytes(desc, &out, &want.build());
    // IPv4: header and L4; IPv6: L4.
    let checked = if f.dst_ip().is_ipv4() { 2 } else { 1 };
    assert_eq!(assert_checksums(&out), checked, "{desc}: checksums checked");
}

/// Cache the next hops the rivorad watcher would resolve in the current
/// namespace for every backend the writer holds, as it would (through the
/// writer), for the interfaces the node lists as attached. Returns the
/// table.
fn cache_next_hops(
    fx: &Fx,
) -> std::collections::HashMap<IpAddr, rivora::dataplane::render::NextHop> {
    let node = fx.w.borrow().node().clone();
    let attached = rivora::nexthop::Attached {
        all: node.interface_macs.keys().copied().collect(),
        generic: node.generic_xdp.clone(),
    };
    let addrs: std::collections::BTreeSet<IpAddr> =
        fx.w.borrow()
            .specs()
            .iter()
            .flat_map(|v| v.backends.iter().map(|b| b.addr))
            .collect();
    let table = rivora::nexthop::resolve_now_with(&attached, &addrs).expect("resolving next hops");
    fx.w.borrow_mut()
        .set_next_hops(table.clone())
        .expect("writing next hops");
    table
}

/// Packets that asked the FIB for lack of a cached next hop, for backend
/// id `id`, over every CPU.
fn nh_misses(t: &TestDp, id: u32) -> u64 {
    t.maps
        .nh_miss_map
        .get_percpu::<u32, rv_nh_miss>(&id)
        .expect("nh_miss_map")
        .iter()
        .map(|m| m.packets)
        .sum()
}

/// The FIB answers with a resolved next hop out of the interface the
/// request came in on: xdp_ingress sends it back out itself (XDP_TX),
/// rewritten as a router would (TTL / hop limit less one, the IPv4 header
/// checksum updated, the egress MAC as source and the gateway's as
/// destination), for both families and both protocols, tagged or not; the
/// flow is recorded for tc_nat as before and counted for its VIP.
#[test]
fn nat_fib_answers_xdp_tx() {
    nat_fib_answers_xdp_tx_with(false);
}

/// The same with the next hops cached by the control plane: every verdict
/// and every byte as the FIB's answer makes them.
#[test]
fn nat_fib_answers_xdp_tx_cached() {
    nat_fib_answers_xdp_tx_with(true);
}

fn nat_fib_answers_xdp_tx_with(cached: bool) {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_fib_setup(&fx);
    let (ns, veth0, _, _) = nat_netns();
    let _in = InNetns::enter(&ns);
    fx.iface_mac(veth0, VETH_MAC);
    if cached {
        let table = cache_next_hops(&fx);
        for svc in [31, 32, 33, 34] {
            let nh = table.get(&bes[&svc].addr).copied().unwrap_or_default();
            assert_eq!(
                (nh.flags, nh.ifindex, nh.dmac, nh.smac),
                (
                    rivora::dataplane::render::NextHop::VALID,
                    veth0,
                    GW_MAC,
                    VETH_MAC
                ),
                "svc {svc}: cached next hop"
            );
        }
    }
    let misses: Vec<u64> = [31, 32, 33, 34]
        .iter()
        .map(|s| nh_misses(t, bes.id(*s)))
        .collect();
    let mut sport = 56000;
    for svc in [31, 32, 33, 34] {
        let be = bes[&svc];
        for vlan in [Vlan::None, Vlan::Dot1q(5), Vlan::QinQ(6, 7)] {
            sport += 1;
            let first = nat_fib_request(svc, sport).vlan(vlan);
            let next = first.clone().established(2).payload(b"more data");
            for (n, f) in [first, next].iter().enumerate() {
                let desc = format!("NAT svc {svc}, {vlan:?}, packet {}", n + 1);
                let want = nat_routed(f, &be, (VETH_MAC, GW_MAC));
                expect_on(t, &desc, veth0, f, XDP_TX, &want);
                assert_nat_entry(t, &desc, f, &be, bes.id(svc));
                assert_eq!(
                    affinity_of(t, bes.id(svc), f),
                    Some(be.id),
                    "{desc}: affinity"
                );
            }
        }
        assert_eq!(
            t.vip_stats(bes.id(svc)).packets,
            6,
            "svc {svc}: packets counted"
        );
    }

    // The reply to one of them still comes back through tc_nat.
    let f = nat_fib_request(31, 56001);
    let be = bes[&31];
    let reply = nat_of(&f, &be).reply();
    let (v, out) = t.run_tc(&reply.build());
    assert_eq!(v, TCX_PASS, "reply verdict");
    assert_bytes("reply", &out, &reply.from(f.dst_ip(), f.dport()).build());

    // Cached: none of them asked the FIB; else each packet did, counted
    // for rivorad to resolve.
    for (svc, before) in [31, 32, 33, 34].iter().zip(misses) {
        let after = nh_misses(t, bes.id(*svc));
        let want = if cached { before } else { before + 6 };
        assert_eq!(after, want, "svc {svc}: next-hop misses");
    }
}

/// The TTL goes down without a fold of the IPv4 checksum (its word goes
/// down by 0x0100, the checksum up by as much, with the end-around carry):
/// the header checksums that carry, or sit next to it, come out as a
/// computation from scratch makes them. The IP IDs are chosen so that the
/// NAT'd header's checksum before the TTL changes is each of 0xfdff,
/// 0xfe00, 0xfeff and 0xff00 (0xfeff + 0x0100 carries into negative zero,
/// which a computed checksum never is).
#[test]
fn nat_ttl_decrement_checksum_carries() {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_fib_setup(&fx);
    let (ns, veth0, _, _) = nat_netns();
    let _in = InNetns::enter(&ns);
    fx.iface_mac(veth0, VETH_MAC);
    cache_next_hops(&fx);
    let be = bes[&31];
    // The checksum of the NAT'd header, TTL 64, for each IP ID.
    let csum_for = |id: u16| -> u16 {
        let b = nat_of(&nat_fib_request(31, 57000).ip_id(id), &be).build();
        u16::from_be_bytes([b[24], b[25]])
    };
    let wanted = [0xfdff_u16, 0xfe00, 0xfeff, 0xff00];
    let mut found = std::collections::BTreeMap::new();
    for id in 0..=u16::MAX {
        let c = csum_for(id);
        if wanted.contains(&c) {
            found.entry(c).or_insert(id);
        }
    }
    assert_eq!(
        found.keys().copied().collect::<Vec<_>>(),
        wanted.to_vec(),
        "an IP ID for each checksum"
    );
    for (sport, (c, id)) in (57001..).zip(found) {
        let f = nat_fib_request(31, sport).ip_id(id);
        let desc = format!("NAT'd checksum {c:#06x} before the TTL (IP ID {id:#06x})");
        expect_on(
            t,
            &desc,
            veth0,
            &f,
            XDP_TX,
            &nat_routed(&f, &be, (VETH_MAC, GW_MAC)),
        );
    }
}

/// The route's egress is another interface: redirected there only when it
/// is one rivorad attaches to (listed in iface_mac_map), since a redirect
/// into a device without XDP is dropped silently by veth and many drivers;
/// otherwise left to the kernel with the NAT rewrite alone (TTL and MACs
/// as they came).
#[test]
fn nat_fib_redirects_only_to_attached_interfaces() {
    nat_fib_redirects_only_to_attached_interfaces_with(false);
}

/// The same with the next hops cached by the control plane: every verdict
/// and every byte as the FIB's answer makes them.
#[test]
fn nat_fib_redirects_only_to_attached_interfaces_cached() {
    nat_fib_redirects_only_to_attached_interfaces_with(true);
}

fn nat_fib_redirects_only_to_attached_interfaces_with(cached: bool) {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_fib_setup(&fx);
    let (ns, veth0, veth2, _) = nat_netns();
    let _in = InNetns::enter(&ns);
    fx.iface_mac(veth0, VETH_MAC);
    if cached {
        cache_next_hops(&fx);
    }
    for svc in [35, 36] {
        let be = bes[&svc];
        let f = nat_fib_request(svc, 57000);
        let desc = format!("NAT svc {svc}, egress veth2 not attached");
        expect_on(t, &desc, veth0, &f, XDP_PASS, &nat_of(&f, &be));
        assert_nat_entry(t, &desc, &f, &be, bes.id(svc));
    }

    fx.iface_mac(veth2, VETH2_MAC);
    if cached {
        cache_next_hops(&fx);
    }
    for svc in [35, 36] {
        let be = bes[&svc];
        let f = nat_fib_request(svc, 57001);
        let desc = format!("NAT svc {svc}, egress veth2 attached");
        let want = nat_routed(&f, &be, (VETH2_MAC, GW2_MAC));
        expect_on(t, &desc, veth0, &f, XDP_REDIRECT, &want);
        assert_nat_entry(t, &desc, &f, &be, bes.id(svc));
        // Arriving on veth2 itself, the same request goes back out of it.
        let f = nat_fib_request(svc, 57002);
        let desc = format!("NAT svc {svc}, from veth2");
        let want = nat_routed(&f, &be, (VETH2_MAC, GW2_MAC));
        expect_on(t, &desc, veth2, &f, XDP_TX, &want);
    }

    // Attached as generic XDP (a bridge has no XDP transmit, and a frame
    // redirected into it is lost without a trace): the kernel's to send,
    // as if not attached. Arriving on it, XDP_TX still sends it back out.
    fx.generic_xdp(veth2, true);
    if cached {
        cache_next_hops(&fx);
    }
    for svc in [35, 36] {
        let be = bes[&svc];
        let f = nat_fib_request(svc, 57003);
        let desc = format!("NAT svc {svc}, egress veth2 attached generic");
        expect_on(t, &desc, veth0, &f, XDP_PASS, &nat_of(&f, &be));
        assert_nat_entry(t, &desc, &f, &be, bes.id(svc));
        let f = nat_fib_request(svc, 57004);
        let desc = format!("NAT svc {svc}, from veth2 attached generic");
        let want = nat_routed(&f, &be, (VETH2_MAC, GW2_MAC));
        expect_on(t, &desc, veth2, &f, XDP_TX, &want);
    }
}

/// Whenever the FIB does not hand over a next hop we can send to, the
/// request goes to the kernel exactly as before this path existed: NAT'd,
/// TTL and MACs as they came, the flow recorded. No neighbour entry yet
/// (the kernel resolves it); a TTL / hop limit of 1 (the kernel sends Time
/// Exceeded; checked before the lookup, the TTL is not decremented);
/// larger than the egress device's MTU or a locked route MTU (FRAG_NEEDED:
/// the kernel fragments or sends frag-needed / Packet Too Big), while a
/// request that fits the same route is sent from XDP; IPv4 options and IPv6 Hop-by-Hop options, which
/// routers act on.
#[test]
fn nat_fib_leaves_the_rest_to_the_kernel() {
    nat_fib_leaves_the_rest_to_the_kernel_with(false);
}

/// The same with the next hops cached by the control plane: every verdict
/// and every byte as the FIB's answer makes them.
#[test]
fn nat_fib_leaves_the_rest_to_the_kernel_cached() {
    nat_fib_leaves_the_rest_to_the_kernel_with(true);
}

fn nat_fib_leaves_the_rest_to_the_kernel_with(cached: bool) {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_fib_setup(&fx);
    let (ns, veth0, _, veth4) = nat_netns();
    let _in = InNetns::enter(&ns);
    fx.iface_mac(veth0, VETH_MAC);
    fx.iface_mac(veth4, VETH4_MAC);
    if cached {
        cache_next_hops(&fx);
    }
    let be_of = |svc: u32| bes[&svc];
    let passed = |desc: &str, ifindex: u32, svc: u32, f: &Frame| {
        let be = be_of(svc);
        expect_on(t, desc, ifindex, f, XDP_PASS, &nat_of(f, &be));
        assert_nat_entry(t, desc, f, &be, bes.id(svc));
    };

    for svc in [37, 38] {
        let f = nat_fib_request(svc, 58000);
        passed(&format!("svc {svc}, no neighbour"), veth0, svc, &f);
    }

    for svc in [31, 32, 33, 34] {
        let f = nat_fib_request(svc, 58001).ttl(1);
        let desc = format!("svc {svc}, TTL 1");
        passed(&desc, veth0, svc, &f);
        // And 2 is forwarded, leaving with 1.
        let f = nat_fib_request(svc, 58002).ttl(2);
        let want = nat_of(&f, &be_of(svc)).macs(VETH_MAC, GW_MAC).ttl(1);
        expect_on(t, &format!("svc {svc}, TTL 2"), veth0, &f, XDP_TX, &want);
    }

    // The device's MTU (veth4), then a locked route MTU (out of veth0).
    for (svc, dev, macs) in [
        (39, veth4, (VETH4_MAC, GW4_MAC)),
        (40, veth4, (VETH4_MAC, GW4_MAC)),
        (41, veth0, (VETH_MAC, GW_MAC)),
        (42, veth0, (VETH_MAC, GW_MAC)),
    ] {
        let be = be_of(svc);
        let small = nat_fib_request(svc, 58003);
        let want = nat_routed(&small, &be, macs);
        let desc = format!("svc {svc}, fits the MTU");
        expect_on(t, &desc, dev, &small, XDP_TX, &want);
        // An IP packet of exactly the MTU still fits.
        let hdrs = small.l4_off() - small.l3_off() + small.l4_len();
        let exact = nat_fib_request(svc, 58004).payload(&vec![0x5a; SMALL_MTU - hdrs]);
        assert_eq!(exact.build().len() - 14, SMALL_MTU);
        let want = nat_routed(&exact, &be, macs);
        let desc = format!("svc {svc}, IP packet of the MTU");
        expect_on(t, &desc, dev, &exact, XDP_TX, &want);
        let big = nat_fib_request(svc, 58005).payload(&vec![0x5a; SMALL_MTU + 1 - hdrs]);
        passed(&format!("svc {svc}, one byte over the MTU"), dev, svc, &big);
    }

    let f = nat_fib_request(31, 58006).ipv4_options(&[1, 1, 1, 0]);
    passed("svc 31, IPv4 options", veth0, 31, &f);
    let f = nat_fib_request(33, 58006).ipv6_exts(&[(IPPROTO_HOPOPTS, vec![1, 4, 0, 0, 0, 0])]);
    passed("svc 33, Hop-by-Hop options", veth0, 33, &f);
    // Destination options are for the backend alone: sent from XDP.
    let f = nat_fib_request(33, 58007).ipv6_exts(&[(IPPROTO_DSTOPTS, vec![1, 4, 0, 0, 0, 0])]);
    let want = nat_routed(&f, &be_of(33), (VETH_MAC, GW_MAC));
    expect_on(t, "svc 33, Destination options", veth0, &f, XDP_TX, &want);
}

/// A UDP datagram of 48 bytes from the client's `sport` to (dst, dport) in two
/// fragments of 24 (the first carrying the UDP header, its checksum over
/// the whole datagram), as frames with `macs` and TTL (hop limit) `ttl`.
fn udp_fragments(
    sport: u16,
    dst: IpAddr,
    dport: u16,
    ttl: u8,
    macs: ([u8; 6], [u8; 6]),
) -> Vec<Vec<u8>> {
    use etherparse::{EtherType, Ethernet2Header, IpFragOffset, Ipv6FragmentHeader, UdpHeader};
    let body: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(7)).collect();
    let mut udp = UdpHeader::without_ipv4_checksum(sport, dport, body.len()).unwrap();
    let (src, ether_type) = match dst {
        IpAddr::V4(d) => {
            let s = ip4(CLIENT4);
            udp.checksum = udp.calc_checksum_ipv4_raw(s, d.octets(), &body).unwrap();
            (ip(CLIENT4), EtherType::IPV4)
        }
        IpAddr::V6(d) => {
            let s: Ipv6Addr = CLIENT6.parse().unwrap();
            udp.checksum = udp
                .calc_checksum_ipv6_raw(s.octets(), d.octets(), &body)
                .unwrap();
            (ip(CLIENT6), EtherType::IPV6)
        }
    };
    let mut dgram = udp.to_bytes().to_vec();
    dgram.extend_from_slice(&body);
    [(0usize, true), (24, false)]
        .iter()
        .map(|&(off, more)| {
            let bytes = &dgram[off..off + 24];
            let frag_off = IpFragOffset::try_new((off / 8) as u16).unwrap();
            let mut out = Ethernet2Header {
                source: macs.0,
                destination: macs.1,
                ether_type,
            }
            .to_bytes()
            .to_vec();
            match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    let mut h = Ipv4Header {
                        identification: 0x4321,
                        more_fragments: more,
                        fragment_offset: frag_off,
                        time_to_live: ttl,
                        protocol: IpNumber::UDP,
                        source: s.octets(),
                        destination: d.octets(),
                        ..Default::default()
                    };
                    h.set_payload_len(bytes.len()).unwrap();
                    h.header_checksum = h.calc_header_checksum();
                    h.write(&mut out).unwrap();
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => {
                    let mut h = Ipv6Header {
                        next_header: IpNumber::IPV6_FRAGMENTATION_HEADER,
                        hop_limit: ttl,
                        source: s.octets(),
                        destination: d.octets(),
                        ..Default::default()
                    };
                    h.set_payload_length(Ipv6FragmentHeader::LEN + bytes.len())
                        .unwrap();
                    h.write(&mut out).unwrap();
                    Ipv6FragmentHeader::new(IpNumber::UDP, frag_off, more, 0x4321)
                        .write(&mut out)
                        .unwrap();
                }
                _ => unreachable!(),
            }
            out.extend_from_slice(bytes);
            out
        })
        .collect()
}

/// A fragmented request of a NAT flow whose backend the FIB resolves: the
/// first fragment (address, port, checksum over the datagram) and the
/// later one (address only, following frag_map) are both sent from XDP,
/// TTL less one, with the FIB's MACs; the flow is recorded. The expected
/// frames are built from the whole datagram addressed to the backend, so
/// the first fragment's bytes carry the datagram's checksum as the backend
/// will check it.
#[test]
fn nat_fib_answers_fragments() {
    let fx = Fx::new();
    let t = &fx.t;
    let bes = nat_fib_setup(&fx);
    let (ns, veth0, _, _) = nat_netns();
    let _in = InNetns::enter(&ns);
    for (svc, vip) in [(32, VIP4), (34, VIP6)] {
        let be = bes[&svc];
        let input = udp_fragments(40000, ip(vip), 53, 64, (MAC_PEER, MAC_LB));
        let want = udp_fragments(40000, be.addr, be.port, 63, (VETH_MAC, GW_MAC));
        for (i, (pkt, want)) in input.iter().zip(&want).enumerate() {
            let desc = format!("svc {svc}, fragment {i}");
            let (v, out) = run_on(t, &desc, veth0, pkt);
            assert_eq!(v, XDP_TX, "{desc}: verdict");
            assert_bytes(&desc, &out, want);
            if vip == VIP4 {
                let (h, _) = Ipv4Header::from_slice(&out[14..]).expect("IPv4");
                assert_eq!(h.header_checksum, h.calc_header_checksum(), "{desc}");
            }
        }
        let f = if vip == VIP4 {
            Frame::udp4(CLIENT4, 40000, VIP4, 53)
        } else {
            Frame::udp6(CLIENT6, 40000, VIP6, 53)
        };
        assert_nat_entry(t, &format!("svc {svc}, fragments"), &f, &be, bes.id(svc));
        assert_eq!(
            t.vip_stats(bes.id(svc)).packets,
            2,
            "svc {svc}: both fragments counted"
        );
    }
}

/// Over a multipath route hashed on ports, every fragment of a datagram,
/// the first included, takes one path, as in the kernel (whose flow
/// dissector gives a fragment no ports): the lookup is made without them.
/// Unfragmented requests of the same service spread over both paths, so
/// the hash does use ports here.
#[test]
fn nat_fib_fragments_take_one_path() {
    let fx = Fx::new();
    let t = &fx.t;
    nat_fib_setup(&fx);
    let (ns, veth0, _, _) = nat_netns();
    let _in = InNetns::enter(&ns);
    for (svc, vip) in [(43, VIP4), (44, VIP6)] {
        let mut gateways = std::collections::BTreeSet::new();
        for sport in 41000..41016 {
            let f = nat_fib_request(svc, sport);
            let (v, out) = run_on(t, &format!("svc {svc}, port {sport}"), veth0, &f.build());
            assert_eq!(v, XDP_TX, "svc {svc}, port {sport}: verdict");
            gateways.insert(out[..6].to_vec());
        }
        assert_eq!(
            gateways.len(),
            2,
            "svc {svc}: unfragmented requests over both gateways"
        );

        for sport in 42000..42016 {
            let input = udp_fragments(sport, ip(vip), 85, 64, (MAC_PEER, MAC_LB));
            let macs: Vec<Vec<u8>> = input
                .iter()
                .enumerate()
                .map(|(i, pkt)| {
                    let desc = format!("svc {svc}, port {sport}, fragment {i}");
                    let (v, out) = run_on(t, &desc, veth0, pkt);
                    assert_eq!(v, XDP_TX, "{desc}: verdict");
                    out[..6].to_vec()
                })
                .collect();
            assert_eq!(
                macs[0], macs[1],
                "svc {svc}, port {sport}: the fragments took different paths"
            );
        }
    }
}

/// A VIP as the reconciler publishes it (what the watcher reads: each
/// backend's id and address), its backends' ids from `id_of`.
fn status_of(
    v: &rivora::model::Vip,
    id_of: impl Fn(IpAddr) -> u32,
) -> rivora::reconciler::status::VipStatus {
    use rivora::dataplane::alloc::Slice;
    use rivora::dataplane::render::Health;
    use rivora::desired::TrafficPolicy;
    use rivora::model::BackendTarget;
    use rivora::reconciler::status::{BackendStatus, ProbeStatus, VipStatus};
    VipStatus {
        key: v.key(),
        name: v.key().to_string(),
        owner: None,
        traffic_policy: TrafficPolicy::Cluster,
        svc_id: 0,
        slice: Slice { start: 0, len: 0 },
        mode: v.mode,
        affinity: v.affinity,
        source_ranges: None,
        slice_need: None,
        backends: v
            .backends
            .iter()
            .map(|b| BackendStatus {
                target: BackendTarget {
                    addr: b.addr,
                    port: b.port,
                },
                service_port: b.port,
                backend_id: id_of(b.addr),
                weight: 1,
                health: Health::Healthy,
                drained: false,
                probe: ProbeStatus::Disabled,
                mode: b.mode_in(v.mode),
                node: None,
            })
            .collect(),
    }
}

/// The gateway's MAC after `ip neigh replace` in the watcher test.
const NEW_GW_MAC: [u8; 6] = [0x02, 0x0e, 0, 0, 0, 0x09];

/// The watcher test's services: NAT over IPv4 and IPv6 to backends behind
/// veth0's gateway (nat_netns), and L3 DSR the same way.
const WATCHED_NAT: &NatServices = &[
    (61, VIP4, 80, PROTO_TCP, "10.1.0.61", 8080),
    (63, VIP6, 80, PROTO_TCP, "fd00:1::63", 8080),
];
const WATCHED_L3DSR: &[(u32, &str, u16, &str)] =
    &[(65, VIP4, 90, "10.1.0.65"), (66, VIP6, 90, "fd00:1::66")];

/// rivorad's next-hop watcher (src/nexthop.rs), run on the reconciler's
/// published status as rivorad runs it, against the kernel's own
/// neighbour table: each table it sends is written through the writer as
/// the reconciler does, and every packet of NAT and L3 DSR, IPv4 and
/// IPv6, is checked byte for byte at each step.
///
/// - resolved: sent from the cache (no FIB lookup: no miss counted);
/// - the gateway's MAC changed (`ip neigh replace`): a new table with the
///   new MAC follows by itself (its delay is printed; the deadline is
///   only generous), and packets go to the new MAC;
/// - the neighbour deleted: the entries turn STALE, and the datapath
///   asks the FIB (which leaves the packet to the kernel), counting a
///   miss per packet;
/// - the neighbour back, before the watcher's next table is written: the
///   stale entry (holding the old MAC) is not used, the FIB's answer is;
///   then the cache holds it again.
///
/// Between a change in the kernel and the writer's rewrite, the cache
/// still holds what it held: the watcher's delay printed here bounds it.
#[test]
fn next_hop_watcher_follows_neighbour_changes() {
    use rivora::dataplane::render::NextHop;
    use rivora::reconciler::status::{self, DataplaneStatus, InterfaceInfo};
    use rivora::reconciler::Command;
    use std::time::{Duration, Instant};

    let fx = Fx::new();
    let t = &fx.t;
    fx.tunnel(Some(TUN4.parse().unwrap()), Some(TUN6.parse().unwrap()));
    let mut bes = nat_services_setup(&fx, WATCHED_NAT);
    for &(svc, vip, port, addr) in WATCHED_L3DSR {
        fx.add_named(
            &mut bes,
            svc,
            Mode::L3Dsr,
            (ip(vip), port, PROTO_TCP),
            backend(svc, addr, 0),
        );
    }
    let (ns, veth0, _, _) = nat_netns();
    let _in = InNetns::enter(&ns);
    fx.iface_mac(veth0, VETH_MAC);
    let svcs: Vec<u32> = [61, 63, 65, 66].to_vec();

    // What the reconciler publishes: the backends and the interface.
    let (publisher, reader) = status::channel();
    let mut st = DataplaneStatus {
        interfaces: vec![InterfaceInfo {
            name: "veth0".into(),
            ifindex: veth0,
            xdp_mode: None,
        }],
        ..Default::default()
    };
    for v in fx.w.borrow().specs() {
        st.vips.push(status_of(&v, |a| {
            let name = svcs
                .iter()
                .find(|n| bes[n].addr == a)
                .expect("a watched backend");
            bes[name].id
        }));
    }
    publisher.publish(st);
    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = rivora::nexthop::Watcher {
        status: reader,
        tx,
        pin_dir: t.pin_dir.clone(),
    }
    .spawn()
    .expect("spawning the watcher");

    let addrs: Vec<IpAddr> = svcs.iter().map(|s| bes[s].addr).collect();
    // The next table the watcher sends for which `ok` holds of every
    // backend's next hop; written as the reconciler writes it.
    let next_table = |what: &str, ok: &dyn Fn(&NextHop) -> bool| -> Duration {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Command::NextHops(table)) => {
                    let fits = addrs.iter().all(|a| table.get(a).is_some_and(ok));
                    if fits {
                        fx.w.borrow_mut()
                            .set_next_hops(table)
                            .expect("writing next hops");
                        return start.elapsed();
                    }
                }
                Ok(_) => panic!("the watcher sends next hops alone"),
                Err(e) => panic!("no table with {what} within 20 s: {e}"),
            }
        }
    };
    let misses = || -> u64 { svcs.iter().map(|s| nh_misses(t, bes[s].id)).sum() };
    let mut sport = 59000;
    // Every watched service's packet, as it must leave: sent to `gw` out
    // of veth0, or (None) left to the kernel.
    let mut check = |desc: &str, gw: Option<[u8; 6]>| {
        sport += 1;
        for &(svc, ..) in WATCHED_NAT {
            let be = bes[&svc];
            let f = nat_request(WATCHED_NAT, svc, sport);
            let desc = format!("{desc}: NAT svc {svc}");
            match gw {
                Some(m) => expect_on(
                    t,
                    &desc,
                    veth0,
                    &f,
                    XDP_TX,
                    &nat_routed(&f, &be, (VETH_MAC, m)),
                ),
                None => expect_on(t, &desc, veth0, &f, XDP_PASS, &nat_of(&f, &be)),
            }
        }
        for &(svc, vip, port, addr) in WATCHED_L3DSR {
            let f = if vip == VIP4 {
                Frame::tcp4(CLIENT4, sport, vip, port)
            } else {
                Frame::tcp6(CLIENT6, sport, vip, port)
            };
            let desc = format!("{desc}: L3 DSR svc {svc}");
            let (verdict, macs) = match gw {
                Some(m) => (XDP_TX, (VETH_MAC, m)),
                None => (XDP_PASS, (f.src_mac, f.dst_mac)),
            };
            let (v, out) = run_on(t, &desc, veth0, &f.build());
            assert_eq!(v, verdict, "{desc}: verdict");
            assert_bytes(&desc, &out, &encapsulated(&f, ip(addr), macs));
        }
    };
    let n = svcs.len() as u64;

    let valid = |mac: [u8; 6]| {
        move |nh: &NextHop| {
            (nh.flags, nh.ifindex, nh.dmac, nh.smac) == (NextHop::VALID, veth0, mac, VETH_MAC)
        }
    };
    let took = next_table("the gateway's MAC", &valid(GW_MAC));
    eprintln!("first table: {took:?}");
    let m = misses();
    check("resolved", Some(GW_MAC));
    assert_eq!(misses(), m, "cached: no FIB lookup");

    ns.exec(&format!(
        "ip neigh replace 10.250.0.2 lladdr {mac} dev veth0 nud permanent && \
         ip -6 neigh replace fd00:fa:ff::2 lladdr {mac} dev veth0 nud permanent",
        mac = mac_str(NEW_GW_MAC)
    ));
    let took = next_table("the new MAC", &valid(NEW_GW_MAC));
    eprintln!("a changed MAC reached the table after {took:?}");
    check("MAC changed", Some(NEW_GW_MAC));
    assert_eq!(misses(), m, "cached: no FIB lookup");

    ns.exec(
        "ip neigh del 10.250.0.2 dev veth0 && \
         ip -6 neigh del fd00:fa:ff::2 dev veth0",
    );
    let took = next_table("stale entries", &|nh: &NextHop| {
        nh.flags == NextHop::VALID | NextHop::STALE && nh.dmac == NEW_GW_MAC
    });
    eprintln!("a deleted neighbour made the entries stale after {took:?}");
    check("neighbour gone", None);
    assert_eq!(misses(), m + n, "stale: each packet asked the FIB");

    ns.exec(&format!(
        "ip neigh replace 10.250.0.2 lladdr {mac} dev veth0 nud permanent && \
         ip -6 neigh replace fd00:fa:ff::2 lladdr {mac} dev veth0 nud permanent",
        mac = mac_str(GW_MAC)
    ));
    // The maps still hold the stale entries (the old MAC): the FIB's
    // answer is what goes out.
    check("neighbour back, entries still stale", Some(GW_MAC));
    assert_eq!(misses(), m + 2 * n, "stale: each packet asked the FIB");
    next_table("the gateway's MAC again", &valid(GW_MAC));
    check("resolved again", Some(GW_MAC));
    assert_eq!(misses(), m + 2 * n, "cached: no FIB lookup");

    // The reconciler gone, the watcher ends.
    drop(publisher);
    watcher.join().expect("the watcher thread");
}

/// L3 DSR services behind veth0's gateway with a locked route MTU of
/// `SMALL_MTU` (nat_netns's 10.6/16 and fd00:6::/64).
const L3DSR_MTU: &[(u32, &str, u16, &str)] =
    &[(71, VIP4, 91, "10.6.0.71"), (72, VIP6, 91, "fd00:6::72")];

/// L3 DSR keeps the FIB's MTU rule with a cached next hop as without
/// one: an encapsulated packet of exactly the route's MTU is sent, one
/// byte more is the kernel's (to fragment or refuse), byte for byte the
/// same either way.
#[test]
fn l3dsr_mtu_rule_with_and_without_a_cached_next_hop() {
    let fx = Fx::new();
    let t = &fx.t;
    fx.tunnel(Some(TUN4.parse().unwrap()), Some(TUN6.parse().unwrap()));
    let mut bes = Named::default();
    for &(svc, vip, port, addr) in L3DSR_MTU {
        fx.add_named(
            &mut bes,
            svc,
            Mode::L3Dsr,
            (ip(vip), port, PROTO_TCP),
            backend(svc, addr, 0),
        );
    }
    let (ns, veth0, _, _) = nat_netns();
    let _in = InNetns::enter(&ns);
    fx.iface_mac(veth0, VETH_MAC);
    let mut sport = 61000;
    for cached in [false, true] {
        if cached {
            let table = cache_next_hops(&fx);
            for &(svc, ..) in L3DSR_MTU {
                let nh = table.get(&bes[&svc].addr).copied().unwrap_or_default();
                assert_eq!(
                    (nh.flags, nh.ifindex, nh.mtu, nh.dmac),
                    (
                        rivora::dataplane::render::NextHop::VALID,
                        veth0,
                        SMALL_MTU as u32,
                        GW_MAC
                    ),
                    "svc {svc}: cached next hop with the locked MTU"
                );
            }
        }
        let misses: u64 = L3DSR_MTU.iter().map(|s| nh_misses(t, bes[&s.0].id)).sum();
        for &(svc, vip, port, addr) in L3DSR_MTU {
            for extra in [0usize, 1] {
                sport += 1;
                let f = if vip == VIP4 {
                    Frame::tcp4(CLIENT4, sport, vip, port)
                } else {
                    Frame::tcp6(CLIENT6, sport, vip, port)
                };
                let outer = if vip == VIP4 { 20 } else { 40 };
                let hdrs = f.l4_off() - f.l3_off() + f.l4_len();
                let f = f.payload(&vec![0x5a; SMALL_MTU - outer - hdrs + extra]);
                let desc = format!("svc {svc}, cached {cached}, {extra} over the MTU");
                let (verdict, macs) = if extra == 0 {
                    (XDP_TX, (VETH_MAC, GW_MAC))
                } else {
                    (XDP_PASS, (f.src_mac, f.dst_mac))
                };
                let want = encapsulated(&f, ip(addr), macs);
                assert_eq!(want.len() - f.l3_off(), SMALL_MTU + extra, "{desc}: size");
                let (v, out) = run_on(t, &desc, veth0, &f.build());
                assert_eq!(v, verdict, "{desc}: verdict");
                assert_bytes(&desc, &out, &want);
            }
        }
        let after: u64 = L3DSR_MTU.iter().map(|s| nh_misses(t, bes[&s.0].id)).sum();
        let want = if cached { misses } else { misses + 4 };
        assert_eq!(after, want, "cached {cached}: next-hop misses");
    }
}
