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
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::lab::{spawn_in, Lab, Mode, SVC_V4_TCP, SVC_V4_UDP, SVC_V6_TCP, SVC_V6_UDP};

/// Connections (TCP) or exchanges (UDP) per mode, family and protocol.
const FLOWS: usize = 120;
/// Client threads sharing them.
const WORKERS: usize = 4;
/// A broken path fails within this per step (connect, reply).
const STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// At least this share of the flows per backend (see the module doc).
const MIN_SHARE: f64 = 0.15;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "e2e_modes needs root (network namespaces, BPF); run it as root"
    );
}

/// What a backend says about one request: "name|local|peer[|payload]".
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    backend: String,
    local: SocketAddr,
    peer: SocketAddr,
    payload: String,
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

fn parse_reply(s: &str) -> Result<Reply, String> {
    let mut it = s.trim_end().splitn(4, '|');
    let (Some(backend), Some(local), Some(peer)) = (it.next(), it.next(), it.next()) else {
        return Err(format!("malformed reply {s:?}"));
    };
    let addr = |a: &str| {
        a.parse::<SocketAddr>()
            .map_err(|e| format!("reply {s:?}: address {a:?}: {e}"))
    };
    Ok(Reply {
        backend: backend.to_string(),
        local: addr(local)?,
        peer: addr(peer)?,
        payload: it.next().unwrap_or("").to_string(),
    })
}

/// The servers of all backends, stopped and joined on drop.
struct Servers {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    /// Requests the servers failed to answer (an I/O error on their side).
    errors: Arc<AtomicUsize>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
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

fn tcp_server(name: String, stop: Arc<AtomicBool>, errors: Arc<AtomicUsize>, l: TcpListener) {
    while !stop.load(Ordering::Relaxed) {
        if !readable(l.as_raw_fd()) {
            continue;
        }
        let Ok((mut s, peer)) = l.accept() else {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let answer = s.local_addr().and_then(|local| {
            let msg = format!("{name}|{}|{}\n", canonical(local), canonical(peer));
            s.write_all(msg.as_bytes())
        });
        if answer.is_err() {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A UDP echo bound to one address: replies then leave from that address
/// (the VIP under DSR), whatever the routing would pick.
fn udp_server(name: String, stop: Arc<AtomicBool>, errors: Arc<AtomicUsize>, sock: UdpSocket) {
    let local = sock.local_addr().expect("bound UDP socket");
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        if !readable(sock.as_raw_fd()) {
            continue;
        }
        let Ok((n, peer)) = sock.recv_from(&mut buf) else {
            errors.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let msg = format!(
            "{name}|{}|{}|{}",
            canonical(local),
            canonical(peer),
            String::from_utf8_lossy(&buf[..n])
        );
        if sock.send_to(msg.as_bytes(), peer).is_err() {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn start_servers(lab: &Lab) -> Servers {
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicUsize::new(0));
    let port = lab.backend_port();
    let mut handles = Vec::new();
    let mut ready = Vec::new();
    for b in &lab.backends {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (name, st, er) = (b.name.clone(), stop.clone(), errors.clone());
        handles.push(spawn_in(&b.ns, move || {
            // Dual-stack: IPv4 clients arrive as v4-mapped addresses.
            let l = TcpListener::bind(("::", port)).expect("binding the TCP server");
            let _ = tx.send(());
            tcp_server(name, st, er, l)
        }));
        ready.push(rx);
        for v6 in [false, true] {
            let local = SocketAddr::new(lab.backend_local(b, v6), port);
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (name, st, er) = (b.name.clone(), stop.clone(), errors.clone());
            handles.push(spawn_in(&b.ns, move || {
                let sock = UdpSocket::bind(local)
                    .unwrap_or_else(|e| panic!("binding the UDP server on {local}: {e}"));
                let _ = tx.send(());
                udp_server(name, st, er, sock)
            }));
            ready.push(rx);
        }
    }
    let servers = Servers {
        stop,
        handles,
        errors,
    };
    for rx in ready {
        // The sender is dropped without sending if the thread panicked.
        rx.recv_timeout(Duration::from_secs(5))
            .expect("a backend server did not start");
    }
    servers
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

fn tcp_exchange(vip: SocketAddr) -> Result<(SocketAddr, Reply), String> {
    let mut s =
        TcpStream::connect_timeout(&vip, STEP_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    let me = s.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    s.set_read_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            format!("connected from {me}, but no reply within {STEP_TIMEOUT:?}")
        }
        _ => format!("reading the reply on {me}: {e}"),
    })?;
    Ok((me, parse_reply(&buf)?))
}

fn udp_exchange(vip: SocketAddr, token: &str) -> Result<(SocketAddr, Reply), String> {
    let any: SocketAddr = match vip {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("literal"),
    };
    let s = UdpSocket::bind(any).map_err(|e| format!("bind: {e}"))?;
    // Connected: only datagrams from the VIP's address and port reach us.
    s.connect(vip).map_err(|e| format!("connect: {e}"))?;
    let me = s.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    s.set_read_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    s.send(token.as_bytes())
        .map_err(|e| format!("send from {me}: {e}"))?;
    let mut buf = [0u8; 1500];
    let n = s.recv(&mut buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            format!("no reply to {me} within {STEP_TIMEOUT:?}")
        }
        _ => format!("recv on {me}: {e}"),
    })?;
    let reply = parse_reply(&String::from_utf8_lossy(&buf[..n]))?;
    if reply.payload != token {
        return Err(format!(
            "echo of {token:?} came back as {:?} (from {})",
            reply.payload, reply.backend
        ));
    }
    Ok((me, reply))
}

/// `FLOWS` exchanges to `vip` from the client namespace, `WORKERS` at a
/// time. A failure stops the others from starting new ones, so a broken
/// path costs one timeout per worker, not one per flow.
fn run_flows(lab: &Lab, vip: SocketAddr, proto: Proto) -> Vec<Result<(SocketAddr, Reply), String>> {
    lab.client.run(move || {
        let failed = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (failed, next) = (failed.clone(), next.clone());
                // Threads started here inherit the client namespace.
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= FLOWS || failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let r = match proto {
                            Proto::Tcp => tcp_exchange(vip),
                            Proto::Udp => udp_exchange(vip, &format!("flow-{i}")),
                        };
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        out.push(r);
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("client worker panicked"))
            .collect()
    })
}

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
    let results = run_flows(lab, vip, proto);
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
    for (me, reply) in results.into_iter().flatten() {
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

fn run_mode(mode: Mode) {
    require_root();
    let t0 = Instant::now();
    let lab = Lab::new(mode);
    let servers = start_servers(&lab);
    let setup = t0.elapsed();

    let mut spread = Vec::new();
    // Datagrams the node's kernel forwarded during each family's UDP
    // exchanges: (IPv4, IPv6).
    let mut udp_forwarded = (0, 0);
    for v6 in [false, true] {
        for proto in [Proto::Tcp, Proto::Udp] {
            let before = lab.node_forwarded();
            spread.push((v6, proto, check_flows(&lab, v6, proto)));
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
