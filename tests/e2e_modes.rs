//! End to end, in network namespaces: real TCP and UDP traffic from a
//! client to IPv4 and IPv6 VIPs through the node's xdp_ingress (and
//! tc_nat), in each forwarding mode, over three backends that answer with
//! their identity. See `common::lab` for the topology.
//!
//! For each mode, family and protocol: `FLOWS` connections (TCP) or
//! exchanges (UDP, each from a fresh socket, so from its own source port)
//! must all complete, each reply must come from the VIP (the client socket
//! is connected to the VIP, so the kernel would not deliver anything else
//! to it), the backend must have seen the client's own address (no source
//! NAT in any mode) and the address it expects for the mode (its own under
//! NAT, with the port translated; the VIP under DSR and L3 DSR), each flow
//! must have landed on the backend its Maglev slot names (the datapath's
//! flow hash, recomputed by `common::flow_hash`), and every backend must
//! have taken a fair share. xdp_ingress must have counted every request.
//! Under NAT the node's kernel must have forwarded the replies but not
//! the requests (XDP_TX out once the backends' neighbours are resolved).
//! Under DSR the node's kernel must have forwarded nothing (XDP_TX out,
//! replies straight to the client); under L3 DSR the node's kernel must
//! have carried the first packets (cold neighbour table, the NO_NEIGH
//! fallback) and every packet the node tunnelled must have been
//! decapsulated by a backend's program.
//!
//! The share bound: each backend holds 7 of the 21 slots of every slice,
//! so with a uniform flow hash its count is Binomial(120, 1/3): mean 40,
//! standard deviation 5.2. At least 15% means at least 18 of 120, 4.3
//! standard deviations under the mean: P(X < 18) = 1.6e-6 per backend, so
//! about 6e-5 over the 36 checks (3 modes, 2 families, 2 protocols, 3
//! backends) of a run. A datapath that starves or favours a backend (a
//! wrong slice, a broken hash) fails it.
//!
//! The share bound is kept beside the exact check on purpose: it holds
//! for any uniform hash, so it still says something if the hash changes.
//!
//! Needs root (namespaces, BPF). Each mode gets its own lab, so the three
//! tests run in parallel and stay independent. A broken path fails within
//! a couple of seconds (per-step timeouts, and the first failure stops the
//! other client workers).

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::lab::{Lab, Mode, SVC_V4_TCP, SVC_V4_UDP, SVC_V6_TCP, SVC_V6_UDP};
use common::traffic::{canonical, exchanges, Proto, Servers};

/// Connections (TCP) or exchanges (UDP) per mode, family and protocol.
const FLOWS: usize = 120;
/// A broken path fails within this per step (connect, reply).
const STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// At least this share of the flows per backend (see the module doc).
const MIN_SHARE: f64 = 0.15;

/// Every flow of one (family, protocol) completed, from the right places,
/// with a fair share per backend. Returns the per-backend counts.
fn check_flows(lab: &Lab, v6: bool, proto: Proto) -> BTreeMap<String, usize> {
    let vip = if v6 {
        SocketAddr::new(IpAddr::V6(lab.vip6), common::lab::VIP_PORT)
    } else {
        SocketAddr::new(IpAddr::V4(lab.vip4), common::lab::VIP_PORT)
    };
    let what = format!("{:?} {proto:?} to {vip}", lab.mode);
    let started = Instant::now();
    let results = exchanges(&lab.client, vip, proto, FLOWS, STEP_TIMEOUT);
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{what}: {} of {} flows failed (after {:?}); first: {:?}",
        failures.len(),
        results.len(),
        started.elapsed(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(results.len(), FLOWS, "{what}: every flow ran");

    let mut counts: BTreeMap<String, usize> =
        lab.backends.iter().map(|b| (b.name.clone(), 0)).collect();
    for reply in results.into_iter().flatten() {
        let me = reply.me;
        let b = lab
            .backends
            .iter()
            .find(|b| b.name == reply.backend)
            .unwrap_or_else(|| panic!("{what}: reply from unknown backend {reply:?}"));
        let (svc, proto_nr) = match (v6, proto) {
            (false, Proto::Tcp) => (SVC_V4_TCP, common::PROTO_TCP),
            (false, Proto::Udp) => (SVC_V4_UDP, common::PROTO_UDP),
            (true, Proto::Tcp) => (SVC_V6_TCP, common::PROTO_TCP),
            (true, Proto::Udp) => (SVC_V6_UDP, common::PROTO_UDP),
        };
        assert_eq!(
            b.name,
            lab.maglev_backend(svc, me, proto_nr).name,
            "{what}: the flow from {me} did not land on the backend its Maglev slot names"
        );
        let expect_local = SocketAddr::new(lab.backend_local(b, v6), lab.backend_port());
        assert_eq!(
            reply.local, expect_local,
            "{what}: backend {} saw the request addressed to the wrong place",
            b.name
        );
        assert_eq!(
            reply.peer,
            canonical(me),
            "{what}: backend {} did not see the client's own address and port",
            b.name
        );
        *counts.entry(reply.backend).or_default() += 1;
    }
    let min = (MIN_SHARE * FLOWS as f64).ceil() as usize;
    for (name, n) in &counts {
        assert!(
            *n >= min,
            "{what}: backend {name} got {n} of {FLOWS} flows, below {min}; spread {counts:?}"
        );
    }
    counts
}

/// The next hops rivorad's watcher resolves in the node's namespace for
/// the family's backends, checked against the lab (out of n0, to each
/// backend's own MAC, from n0's) and written into their backend entries
/// as the writer writes them. Returns the backend ids and their miss
/// count so far.
fn cache_next_hops(lab: &Lab, v6: bool) -> (Vec<u32>, u64) {
    use rivora::dataplane::render::NextHop;
    use std::collections::BTreeSet;
    // `ip -o link show n0`: "7: n0@if6: <...": sysfs is the test's own
    // namespace's.
    let n0: u32 = lab
        .node
        .exec("ip -o link show n0")
        .split(':')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .expect("n0's ifindex");
    let addr = |b: &common::topology::Backend| -> IpAddr {
        if v6 {
            IpAddr::V6(b.v6)
        } else {
            IpAddr::V4(b.v4)
        }
    };
    let addrs: BTreeSet<IpAddr> = lab.backends.iter().map(addr).collect();
    let table = lab
        .node
        .run(move || rivora::nexthop::resolve_now(&BTreeSet::from([n0]), &addrs))
        .expect("resolving next hops");
    let n0_mac = lab.node.mac_of("n0");
    let mut ids = Vec::new();
    for b in &lab.backends {
        let nh = table
            .get(&addr(b))
            .unwrap_or_else(|| panic!("no next hop for {}", addr(b)));
        assert_eq!(
            (nh.flags, nh.ifindex, nh.dmac, nh.smac),
            (NextHop::VALID, n0, b.mac, n0_mac),
            "next hop of {}",
            addr(b)
        );
        let maps = &lab.dp.maps;
        if v6 {
            let mut e: rivora::abi::rv_backend6 =
                maps.backend_map6.get(&b.id6).unwrap().expect("entry");
            e.nh = nh.to_abi();
            maps.backend_map6.put(&b.id6, &e).unwrap();
            ids.push(b.id6);
        } else {
            let mut e: rivora::abi::rv_backend =
                maps.backend_map.get(&b.id4).unwrap().expect("entry");
            e.nh = nh.to_abi();
            maps.backend_map.put(&b.id4, &e).unwrap();
            ids.push(b.id4);
        }
    }
    let misses = nh_misses(lab, &ids);
    (ids, misses)
}

/// Packets that found no cached next hop, for backends `ids`.
fn nh_misses(lab: &Lab, ids: &[u32]) -> u64 {
    ids.iter()
        .flat_map(|id| {
            lab.dp
                .maps
                .nh_miss_map
                .get_percpu::<u32, rivora::abi::rv_nh_miss>(id)
                .expect("nh_miss_map")
        })
        .map(|m| m.packets)
        .sum()
}

fn run_mode(mode: Mode) {
    common::require::root_and_tools("e2e_modes");
    let t0 = Instant::now();
    let lab = Lab::new(mode);
    let servers = Servers::for_topology(&lab, true);
    let setup = t0.elapsed();

    let mut spread = Vec::new();
    // Datagrams the node's kernel forwarded during each family's UDP
    // exchanges: (IPv4, IPv6).
    let mut udp_forwarded = (0, 0);
    for v6 in [false, true] {
        for proto in [Proto::Tcp, Proto::Udp] {
            // NAT and L3 DSR: the UDP flows go by the next hops rivorad's
            // watcher resolves, once the TCP flows have made the kernel
            // resolve the backends' neighbours.
            let cached =
                (proto == Proto::Udp && mode != Mode::Dsr).then(|| cache_next_hops(&lab, v6));
            let before = lab.node_forwarded();
            spread.push((v6, proto, check_flows(&lab, v6, proto)));
            if let Some((ids, misses)) = cached {
                assert_eq!(
                    nh_misses(&lab, &ids),
                    misses,
                    "{mode:?} v6 {v6}: every UDP request went by the cached next hop"
                );
            }
            let after = lab.node_forwarded();
            if proto == Proto::Udp {
                if v6 {
                    udp_forwarded.1 = after.1 - before.1;
                } else {
                    udp_forwarded.0 = after.0 - before.0;
                }
            }
        }
    }
    assert_eq!(
        servers.errors.load(Ordering::Relaxed),
        0,
        "{mode:?}: backend servers hit I/O errors"
    );

    // The traffic went through xdp_ingress: every UDP request once (one
    // datagram each), every TCP connection at least twice (SYN, ACK).
    let packets = |svc| lab.dp.vip_stats(svc).packets;
    let n = FLOWS as u64;
    assert_eq!(
        packets(SVC_V4_UDP),
        n,
        "{mode:?}: v4 UDP packets at the node"
    );
    assert_eq!(
        packets(SVC_V6_UDP),
        n,
        "{mode:?}: v6 UDP packets at the node"
    );
    assert!(
        packets(SVC_V4_TCP) >= 2 * n,
        "{mode:?}: v4 TCP packets at the node"
    );
    assert!(
        packets(SVC_V6_TCP) >= 2 * n,
        "{mode:?}: v6 TCP packets at the node"
    );

    let (fwd4, fwd6) = lab.node_forwarded();
    if mode == Mode::Nat {
        // Each UDP exchange is one request and one reply. Replies are the
        // node kernel's to forward (tc_nat restores the VIP on its way
        // out); requests leave by XDP_TX, the backends' neighbour entries
        // having been resolved by the kernel during the TCP flows before.
        // So the kernel forwarded about FLOWS datagrams per family, not
        // the 2 * FLOWS of every request going through it too. The slack
        // is for the previous flows' last TCP segments still in flight.
        // At least FLOWS, the replies: the counter does see this traffic.
        let (least, most) = (FLOWS as u64, (FLOWS + FLOWS / 4) as u64);
        assert!(
            [udp_forwarded.0, udp_forwarded.1]
                .iter()
                .all(|n| (least..=most).contains(n)),
            "NAT: the node's kernel forwarded {udp_forwarded:?} datagrams during {FLOWS} \
             UDP exchanges per family, expected {least} to {most} (the replies, and \
             requests only when not forwarded in XDP)"
        );
    }
    if mode == Mode::Dsr {
        // Requests left the node by XDP_TX and replies went straight from
        // the backends to the client: the node's kernel forwarded nothing.
        assert_eq!(
            (fwd4, fwd6),
            (0, 0),
            "DSR: datagrams the node's kernel forwarded"
        );
    }
    if mode == Mode::L3Dsr {
        // The lab starts with a cold neighbour table, so the first packet
        // to each backend found no neighbour in bpf_fib_lookup and went
        // through the node's kernel (accept_local, see common::lab); the
        // rest left by XDP_TX. Both paths carried traffic.
        let nb = lab.backends.len() as u64;
        assert!(
            fwd4 >= nb && fwd6 >= nb,
            "L3 DSR: the kernel fallback forwarded ({fwd4}, {fwd6}), expected at least {nb} each"
        );

        // Every packet the node tunnelled was decapsulated by a backend's
        // program (this host has no ipip / ip6_tunnel module to do it),
        // each backend took part, and nothing was left undone.
        let read = || -> Vec<_> {
            (0..lab.backends.len())
                .map(|i| lab.decap_stats(i).expect("decap stats in an L3 DSR lab"))
                .collect()
        };
        let sent = |a, b| packets(a) + packets(b);
        // A connection's last packets (the client's FIN and ACK) may still
        // be in flight when its reply has been read: let them land.
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut stats = read();
        while Instant::now() < deadline
            && (stats.iter().map(|s| s.decap4).sum::<u64>() != sent(SVC_V4_TCP, SVC_V4_UDP)
                || stats.iter().map(|s| s.decap6).sum::<u64>() != sent(SVC_V6_TCP, SVC_V6_UDP))
        {
            std::thread::sleep(Duration::from_millis(20));
            stats = read();
        }
        for (b, s) in lab.backends.iter().zip(&stats) {
            assert!(
                s.decap4 > 0 && s.decap6 > 0,
                "backend {} decapsulated nothing in one family: {s:?}",
                b.name
            );
            assert_eq!(
                (s.not_vip, s.malformed),
                (0, 0),
                "backend {}: {s:?}",
                b.name
            );
        }
        assert_eq!(
            stats.iter().map(|s| s.decap4).sum::<u64>(),
            sent(SVC_V4_TCP, SVC_V4_UDP),
            "IPv4: packets decapsulated by the backends vs tunnelled by the node"
        );
        assert_eq!(
            stats.iter().map(|s| s.decap6).sum::<u64>(),
            sent(SVC_V6_TCP, SVC_V6_UDP),
            "IPv6: packets decapsulated by the backends vs tunnelled by the node"
        );
    }

    drop(servers);
    eprintln!(
        "{mode:?}: lab set up in {setup:?}, all flows in {:?}; spread {spread:?}; \
         kernel-forwarded during the UDP flows {udp_forwarded:?}",
        t0.elapsed() - setup
    );
}

#[test]
fn nat_tcp_udp_v4_v6() {
    run_mode(Mode::Nat);
}

#[test]
fn dsr_tcp_udp_v4_v6() {
    run_mode(Mode::Dsr);
}

#[test]
fn l3dsr_tcp_udp_v4_v6() {
    run_mode(Mode::L3Dsr);
}
