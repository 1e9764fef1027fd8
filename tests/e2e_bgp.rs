//! The BGP speaker against the real peers from Debian, each in its own
//! namespace: BIRD 2, FRR (zebra + bgpd) and GoBGP, one shared setup.
//! Sessions over IPv4 and IPv6 reach Established; the VIPs' /32 and /128
//! appear in each peer's RIB with the node's address as next hop and the
//! advertisement's communities; when every backend dies they are
//! withdrawn everywhere; `rivoractl bgp peers|routes` say so. A restart
//! of rivorad with `-persist-datapath` keeps the routes in every peer.
//!
//! `md5_and_bfd_against_frr_bird_and_gobgp`: per router, the IPv4
//! session has the router's TCP MD5 password and the IPv6 one a wrong
//! one: the first comes up and carries the route, the second never does
//! (the router's kernel counts the bad signatures). FRR (bfdd) and BIRD
//! run BFD on the IPv4 session at 300 ms x 3: both ends see it Up; a cut
//! link (the router's veth down) ends the BGP session with "BFD down"
//! long before the 90 s hold time could, GoBGP's session (no BFD, link
//! intact) stays up, and with the link back BFD and BGP come back.

mod common;

use std::time::Duration;

use common::bgp::{Kind, Router};
use common::rivorad::{Home, Rivorad};
use common::topology::{Mode, Topology, NAT_BACKEND_PORT};
use common::traffic::{wait_until, Servers};

const LONG: Duration = Duration::from_secs(60);
const PASSWORD: &str = "rivora-s3cret";

/// The session to `addr` as rivoractl shows it.
fn peer(rd: &Rivorad, addr: &str) -> serde_json::Value {
    rd.ctl_json(&["bgp", "peers"])
        .as_array()
        .and_then(|a| a.iter().find(|p| p["address"] == addr).cloned())
        .unwrap_or_default()
}

/// A password file rivorad accepts (mode 0600).
fn password_file(home: &Home, name: &str, pw: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let f = home.path(name);
    std::fs::write(&f, format!("{pw}\n")).expect("password file");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    f.display().to_string()
}

fn config(topo: &Topology, home: &Home, routers: &[Router]) -> String {
    let mut peers = String::new();
    for r in routers {
        for a in [&r.v4, &r.v6] {
            peers += &format!(
                "    - {{name: {:?}-{}, address: \"{a}\", asn: 65000, holdTime: 9s}}\n",
                r.kind,
                if a.contains(':') { "v6" } else { "v4" }
            );
        }
    }
    config_with_peers(topo, home, &peers)
}

/// The lab's two NAT VIPs and a `bgp` section with `peers` (YAML list
/// items, indented four spaces).
fn config_with_peers(topo: &Topology, home: &Home, peers: &str) -> String {
    let n6 = format!("{:x}", topo.n);
    let backends = |v6: bool| {
        topo.backends
            .iter()
            .map(|b| {
                let a = if v6 {
                    format!("\"{}\"", b.v6)
                } else {
                    b.v4.to_string()
                };
                format!("{{address: {a}, port: {NAT_BACKEND_PORT}}}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "interfaces: [{{name: n0, xdpMode: native}}]\n\
         healthCheck: {{type: tcp, interval: 300ms, timeout: 200ms, rise: 1, fall: 1}}\n\
         api: {{socket: {}}}\n\
         vips:\n\
         \x20 - {{address: {}, port: 80, protocol: tcp, mode: nat, backends: [{}]}}\n\
         \x20 - {{address: \"{}\", port: 80, protocol: tcp, mode: nat, backends: [{}]}}\n\
         bgp:\n  asn: 65001\n  routerId: {}\n  peers:\n{peers}\
         \x20 advertisements:\n    - {{prefixes: [10.{}.100.0/24, \"fd00:{n6}:100::/64\"], communities: [\"65001:100\"], largeCommunities: [\"65001:7:8\"]}}\n",
        home.socket().display(),
        topo.vip4,
        backends(false),
        topo.vip6,
        backends(true),
        topo.node_v4,
        topo.n,
    )
}

#[test]
fn bird_frr_and_gobgp_get_the_vip_routes_and_lose_them_with_the_backends() {
    let topo = Topology::builder(Mode::Nat).backends(2).build();
    let mut servers = Servers::for_topology(&topo, false);
    let mut routers: Vec<Router> = [Kind::Bird, Kind::Frr, Kind::Gobgp]
        .into_iter()
        .enumerate()
        .map(|(i, k)| Router::new(k, &topo.node, topo.n, 21 + i as u32))
        .collect();
    for r in &mut routers {
        let (v4, v6) = (r.node_v4.clone(), r.node_v6.clone());
        r.start(&[(&v4, 65001, None, false), (&v6, 65001, None, false)]);
    }
    let home = Home::new();
    let yaml = config(&topo, &home, &routers);
    let mut rd = Rivorad::start(&topo.node, home, &yaml, &["-persist-datapath"]);

    let vip4 = format!("{}/32", topo.vip4);
    let vip6 = format!("{}/128", topo.vip6);
    // Every session Established, IPv4 and IPv6.
    wait_until("six Established sessions", LONG, || {
        let p = rd.ctl_json(&["bgp", "peers"]);
        p.as_array()
            .is_some_and(|a| a.len() == 6 && a.iter().all(|s| s["state"] == "Established"))
    });
    // The routes in every peer's RIB, with the next hop and communities.
    for r in &routers {
        wait_until(
            &format!("{:?} holding both VIP routes", r.kind),
            LONG,
            || {
                let rib = r.rib();
                rib.contains(&vip4) && rib.contains(&vip6)
            },
        );
        let (d4, d6) = (r.route(&vip4), r.route(&vip6));
        match r.kind {
            Kind::Bird => {
                assert!(d4.contains(&format!("BGP.next_hop: {}", r.node_v4)), "{d4}");
                assert!(d4.contains("(65001,100)"), "{d4}");
                assert!(d4.contains("(65001, 7, 8)"), "{d4}");
                assert!(d6.contains(&r.node_v6), "{d6}");
            }
            Kind::Frr => {
                assert!(d4.contains(&format!("\"ip\":\"{}\"", r.node_v4)), "{d4}");
                assert!(d4.contains("65001:100"), "{d4}");
                assert!(d4.contains("65001:7:8"), "{d4}");
                assert!(d6.contains(&format!("\"ip\":\"{}\"", r.node_v6)), "{d6}");
            }
            Kind::Gobgp => {
                assert!(
                    d4.contains(&format!("\"nexthop\":\"{}\"", r.node_v4)),
                    "{d4}"
                );
                // 65001:100 as a 32-bit value.
                assert!(d4.contains(&((65001u32 << 16) | 100).to_string()), "{d4}");
                assert!(d4.contains(&r.node_v6), "{d4}");
            }
        }
    }
    let routes = rd.ctl_json(&["bgp", "routes"]);
    let listed: Vec<&str> = routes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["prefix"].as_str())
        .collect();
    assert_eq!(listed, [vip4.as_str(), vip6.as_str()], "{routes}");
    assert_eq!(routes[0]["peers"].as_array().unwrap().len(), 3, "{routes}");
    let table = rd.ctl_ok(&["bgp", "peers"]);
    assert!(
        table.contains("Established") && table.contains("Bird-v4"),
        "{table}"
    );

    // RFC 4271 6.8: anyone who can send a SYN from a router's address
    // opens a connection while the session is Established and sends
    // garbage, no OPEN. The connection is refused (Cease, connection
    // collision resolution: graceful restart is negotiated here, so it
    // was read first for a valid OPEN); the session and the routes stay.
    let bird = &routers[0];
    let before = peer(&rd, &bird.v4);
    assert_eq!(before["state"], "Established", "{before}");
    let node4 = bird.node_v4.clone();
    let reply = bird.ns.run(move || -> Result<Vec<u8>, String> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect((node4.as_str(), 179))
            .map_err(|e| format!("connect: {e}"))?;
        c.set_read_timeout(Some(Duration::from_secs(15)))
            .map_err(|e| e.to_string())?;
        c.write_all(&[0x42; 64])
            .map_err(|e| format!("write: {e}"))?;
        let mut got = Vec::new();
        c.read_to_end(&mut got).map_err(|e| format!("read: {e}"))?;
        Ok(got)
    });
    let reply = reply.unwrap_or_else(|e| panic!("the intruding connection: {e}"));
    // A NOTIFICATION (type 3): Cease (6), connection collision (7).
    assert!(
        reply.len() >= 21 && reply[..16].iter().all(|b| *b == 0xff) && reply[18..21] == [3, 6, 7],
        "the intruding connection got {reply:02x?}"
    );
    let after = peer(&rd, &bird.v4);
    assert_eq!(after["state"], "Established", "{after}");
    assert_eq!(after["flaps"], before["flaps"], "{before}\n{after}");
    let rib = bird.rib();
    assert!(rib.contains(&vip4), "BIRD kept the route: {rib}");

    // Graceful restart (RFC 4724) with a pinned datapath: rivorad stops
    // (the sessions close without a NOTIFICATION), every peer keeps the
    // routes, and the next rivorad comes back Established with them.
    rd.stop();
    std::thread::sleep(Duration::from_secs(1));
    for r in &routers {
        let rib = r.rib();
        assert!(
            rib.contains(&vip4) && rib.contains(&vip6),
            "{:?} kept the routes: {rib}",
            r.kind
        );
    }
    rd.restart(&["-persist-datapath"]);
    wait_until("six Established sessions after the restart", LONG, || {
        let p = rd.ctl_json(&["bgp", "peers"]);
        p.as_array()
            .is_some_and(|a| a.len() == 6 && a.iter().all(|s| s["state"] == "Established"))
    });
    for r in &routers {
        let rib = r.rib();
        assert!(
            rib.contains(&vip4) && rib.contains(&vip6),
            "{:?} after the restart: {rib}",
            r.kind
        );
    }

    // A reload applies the section: GoBGP's IPv6 peer removed (its
    // session ends), the advertisement's community changed (the routes
    // are sent again), and the router ID, which only a restart applies,
    // named as such.
    let gobgp_v6 = routers[2].v6.clone();
    let reloaded = yaml
        .lines()
        .filter(|l| !l.contains(&format!("\"{gobgp_v6}\"")))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("65001:100", "65001:200")
        .replace(
            &format!("routerId: {}", topo.node_v4),
            "routerId: 192.0.2.77",
        );
    assert_ne!(reloaded, yaml);
    std::fs::write(rd.home.config(), reloaded + "\n").expect("writing the config");
    let res = rd.ctl_json(&["reload"]);
    assert_eq!(res["ok"], true, "{res}");
    let warnings = res["warnings"].to_string();
    assert!(
        warnings.contains("bgp.routerId changed") && warnings.contains("next restart"),
        "{res}"
    );
    assert_eq!(rd.ctl_json(&["bgp", "peers"]).as_array().unwrap().len(), 5);
    wait_until("GoBGP's IPv6 session gone", LONG, || {
        !routers[2].established(&routers[2].node_v6) && !routers[2].rib().contains(&vip6)
    });
    wait_until("FRR holding the new community", LONG, || {
        let d = routers[1].route(&vip4);
        d.contains("65001:200") && !d.contains("65001:100")
    });
    assert!(routers[2].established(&routers[2].node_v4));

    // Every backend dies: both routes leave every RIB.
    for i in 0..topo.backends.len() {
        servers.close(i);
    }
    for r in &routers {
        wait_until(
            &format!("{:?} dropping the VIP routes", r.kind),
            LONG,
            || {
                let rib = r.rib();
                !rib.contains(&vip4) && !rib.contains(&vip6)
            },
        );
    }
    assert_eq!(rd.ctl_json(&["bgp", "routes"]), serde_json::json!([]));
    // Metrics name every peer.
    drop(rd);
}

#[test]
fn md5_and_bfd_against_frr_bird_and_gobgp() {
    let topo = Topology::builder(Mode::Nat).backends(1).build();
    let _servers = Servers::for_topology(&topo, false);
    let mut routers: Vec<Router> = [Kind::Frr, Kind::Bird, Kind::Gobgp]
        .into_iter()
        .enumerate()
        .map(|(i, k)| Router::new(k, &topo.node, topo.n, 31 + i as u32))
        .collect();
    for r in &mut routers {
        let (v4, v6) = (r.node_v4.clone(), r.node_v6.clone());
        let bfd = r.kind != Kind::Gobgp;
        r.start(&[
            (&v4, 65001, Some(PASSWORD), bfd),
            (&v6, 65001, Some(PASSWORD), false),
        ]);
    }
    let home = Home::new();
    let right = password_file(&home, "right.key", PASSWORD);
    let wrong = password_file(&home, "wrong.key", "not-the-password");
    let mut peers = String::new();
    for r in &routers {
        let bfd = if r.kind == Kind::Gobgp {
            ""
        } else {
            ", bfd: {minRx: 300ms, minTx: 300ms, multiplier: 3}"
        };
        peers += &format!(
            "    - {{name: {:?}-v4, address: \"{}\", asn: 65000, connectRetry: 1s, passwordFile: {right}{bfd}}}\n\
             \x20   - {{name: {:?}-v6, address: \"{}\", asn: 65000, connectRetry: 1s, passwordFile: {wrong}}}\n",
            r.kind, r.v4, r.kind, r.v6
        );
    }
    let yaml = config_with_peers(&topo, &home, &peers);
    let rd = Rivorad::start(&topo.node, home, &yaml, &[]);
    let vip4 = format!("{}/32", topo.vip4);
    let vip6 = format!("{}/128", topo.vip6);

    // The right password: Established on both ends, the route held.
    for r in &routers {
        wait_until(&format!("{:?} over IPv4 with MD5", r.kind), LONG, || {
            peer(&rd, &r.v4)["state"] == "Established" && r.established(&r.node_v4)
        });
        wait_until(
            &format!("{:?} holding the IPv4 route", r.kind),
            LONG,
            || r.rib().contains(&vip4),
        );
    }
    // The wrong one: the router's kernel drops our signed segments, the
    // session never comes up, the IPv6 route never arrives.
    for r in &routers {
        wait_until(
            &format!("{:?} dropping segments with a wrong signature", r.kind),
            LONG,
            || r.md5_drops() > 0,
        );
    }
    for r in &routers {
        let p = peer(&rd, &r.v6);
        assert_ne!(p["state"], "Established", "{p}");
        assert_eq!(p["flaps"], 0, "{p}");
        assert!(!r.established(&r.node_v6), "{:?}", r.kind);
        assert!(!r.rib().contains(&vip6), "{:?}: {}", r.kind, r.rib());
    }

    // BFD Up at both ends of the FRR and BIRD sessions, at the fast rate
    // (detection time 3 x 300 ms once the Poll Sequence is done: short
    // against the hold time, long enough that a loaded machine's stalls
    // do not flap it; rivora-bench measures 100 ms x 3).
    let with_bfd: Vec<&Router> = routers.iter().filter(|r| r.kind != Kind::Gobgp).collect();
    for r in &with_bfd {
        wait_until(&format!("BFD Up with {:?}", r.kind), LONG, || {
            let p = peer(&rd, &r.v4);
            p["bfd_state"] == "Up" && p["bfd_detect_ms"] == 900 && r.bfd_up(&r.node_v4)
        });
    }
    assert_eq!(
        peer(&rd, &routers[2].v4)["bfd_state"],
        serde_json::Value::Null
    );

    // GTSM (RFC 5881 5): a BFD Down from FRR's address, sent with TTL
    // 254 (from further than one hop), is dropped; the same with TTL 255
    // is taken, and ends the session (a peer that restarted says Down
    // with no Your Discriminator).
    let frr = &routers[0];
    let forge = |ttl: u8| {
        frr.ns.exec(&format!(
            "python3 -c \"import socket,struct\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.setsockopt(socket.IPPROTO_IP,socket.IP_TTL,{ttl})\n\
             s.bind(('{}',49999))\n\
             p=bytes([0x20,0x40,3,24])+struct.pack('!IIIII',0x5eed,0,1000000,1000000,0)\n\
             [s.sendto(p,('{}',3784)) for _ in range(3)]\"",
            frr.v4, frr.node_v4
        ))
    };
    forge(254);
    std::thread::sleep(Duration::from_secs(1));
    let p = peer(&rd, &frr.v4);
    assert!(
        p["bfd_state"] == "Up" && p["state"] == "Established" && p["flaps"] == 0,
        "a TTL 254 packet was taken: {p}"
    );
    forge(255);
    wait_until("a TTL 255 Down taken", LONG, || {
        let p = peer(&rd, &frr.v4);
        p["flaps"] == 1 && p["last_error"] == "BFD down"
    });
    wait_until("FRR back with BFD after the forged Down", LONG, || {
        let p = peer(&rd, &frr.v4);
        p["state"] == "Established" && p["bfd_state"] == "Up" && frr.bfd_up(&frr.node_v4)
    });

    // Cut both links at once. The hold time is 90 s: only BFD can end the
    // sessions within the wait.
    let flaps_before: Vec<u64> = with_bfd
        .iter()
        .map(|r| peer(&rd, &r.v4)["flaps"].as_u64().unwrap_or(0))
        .collect();
    // Coming Up never flapped the session (FRR's one flap is the forged
    // Down): the faster rate announced by the Poll Sequence is the rate
    // sent at once (the peers' detection time counts on it).
    assert_eq!(flaps_before, [1, 0]);
    let t0 = std::time::Instant::now();
    for r in &with_bfd {
        r.ns.exec("ip link set r0 down");
    }
    for r in &with_bfd {
        wait_until(
            &format!("BFD ending the {:?} session", r.kind),
            Duration::from_secs(30),
            || {
                let p = peer(&rd, &r.v4);
                p["state"] != "Established" && p["bfd_state"] == "Down"
            },
        );
        let p = peer(&rd, &r.v4);
        assert_eq!(p["last_error"], "BFD down", "{p}");
        eprintln!("{:?}: BFD down after {:?}", r.kind, t0.elapsed());
    }
    // And at the routers' end, before the links come back: a router whose
    // own detection lags (bfdd on a loaded machine) would otherwise take
    // our reconnection and then end it for the BFD Down it sees late, a
    // second flap the link cut did not cause alone (seen once in CI).
    for r in &with_bfd {
        wait_until(
            &format!("{:?} seeing BFD and BGP down too", r.kind),
            Duration::from_secs(30),
            || !r.bfd_up(&r.node_v4) && !r.established(&r.node_v4),
        );
    }
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "the hold time (90 s) cannot have done it"
    );
    assert_eq!(peer(&rd, &routers[2].v4)["state"], "Established");

    // The link back: BFD and BGP come back, one flap each.
    for r in &with_bfd {
        r.ns.exec("ip link set r0 up");
    }
    for (r, before) in with_bfd.iter().zip(flaps_before) {
        wait_until(&format!("{:?} back with BFD", r.kind), LONG, || {
            let p = peer(&rd, &r.v4);
            p["state"] == "Established" && p["bfd_state"] == "Up" && r.bfd_up(&r.node_v4)
        });
        assert_eq!(peer(&rd, &r.v4)["flaps"], before + 1);
        wait_until(
            &format!("{:?} holding the route again", r.kind),
            LONG,
            || r.rib().contains(&vip4),
        );
    }
}

/// Packets node `rd` forwarded for its TCP VIPs (both families).
fn tcp_packets(rd: &Rivorad) -> u64 {
    rd.ctl_json(&["vip", "list"])
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|v| v["vip"].as_str().is_some_and(|s| s.starts_with("tcp/")))
                .filter_map(|v| v["packets"].as_u64())
                .sum()
        })
        .unwrap_or(0)
}

fn vtysh_conf(r: &Router, lines: &[&str]) {
    let mut cmd = String::from("conf t' -c 'router bgp 65000");
    for l in lines {
        cmd += &format!("' -c '{l}");
    }
    r.vtysh(&cmd);
}

#[test]
fn ecmp_two_nodes_paths_move_and_graceful_restart_lose_nothing() {
    use common::ecmp::Ecmp;
    use common::topology::VIP_PORT;
    use common::traffic::{exchanges, long_lived, udp_streams, Proto};
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let lab = Ecmp::new(3);
    let mut servers = Servers::new();
    for b in &lab.backends {
        let any = SocketAddr::from(([0u16; 8], VIP_PORT));
        servers.tcp(&b.ns, &b.name, any);
        servers.udp_sink(&b.ns, &b.name, any);
    }
    let mut rds: Vec<Rivorad> = (0..2)
        .map(|i| {
            let home = Home::new();
            let yaml = lab.config(i, &home.socket());
            Rivorad::start(&lab.nodes[i], home, &yaml, &["-persist-datapath"])
        })
        .collect();
    let r = &lab.router;
    let prefixes = [format!("{}/32", lab.vip4), format!("{}/128", lab.vip6)];
    let hops = |prefix: &str| -> Vec<String> {
        let mut v: Vec<String> = if prefix.contains(':') {
            lab.node_v6.iter().map(|a| a.to_string()).collect()
        } else {
            lab.node_v4.iter().map(|a| a.to_string()).collect()
        };
        v.sort();
        v
    };
    let both_paths = |what: &str| {
        for p in &prefixes {
            wait_until(&format!("{p} over both nodes ({what})"), LONG, || {
                r.fib_nexthops(p) == hops(p)
                    && r.bgp_paths(p).len() == 2
                    && r.bgp_paths(p).iter().all(|(_, stale)| !stale)
            });
        }
    };
    both_paths("start");
    let vip4 = SocketAddr::new(lab.vip4.into(), VIP_PORT);
    let vip6 = SocketAddr::new(lab.vip6.into(), VIP_PORT);

    // Many connections through the router: all complete, both nodes
    // carry some.
    let before: Vec<u64> = rds.iter().map(tcp_packets).collect();
    for (vip, n) in [(vip4, 200), (vip6, 100)] {
        let res = exchanges(&lab.client, vip, Proto::Tcp, n, Duration::from_secs(5));
        let failed: Vec<_> = res.iter().filter(|r| r.is_err()).collect();
        assert!(failed.is_empty(), "{vip}: {failed:?}");
        assert_eq!(res.len(), n);
    }
    let after: Vec<u64> = rds.iter().map(tcp_packets).collect();
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "both nodes forward: {before:?} -> {after:?}"
    );

    // Long-lived connections while the router moves every path to one
    // node, then to the other: each keeps its backend and survives.
    let stop = Arc::new(AtomicBool::new(false));
    let echoed = Arc::new(AtomicU64::new(0));
    let conns: Vec<_> = [vip4, vip6]
        .into_iter()
        .flat_map(|v| std::iter::repeat_n(v, 4))
        .map(|v| {
            long_lived(
                &lab.client,
                v,
                Duration::from_millis(20),
                Duration::from_secs(5),
                stop.clone(),
                echoed.clone(),
            )
        })
        .collect();
    for c in &conns {
        c.first
            .recv_timeout(Duration::from_secs(10))
            .expect("a first echo");
    }
    let (a4, b4) = (lab.node_v4[0].to_string(), lab.node_v4[1].to_string());
    for (down, up, only) in [(&a4, None, 1usize), (&b4, Some(&a4), 0usize)] {
        let mut lines = vec![format!("neighbor {down} shutdown")];
        if let Some(u) = up {
            lines.push(format!("no neighbor {u} shutdown"));
        }
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        vtysh_conf(r, &lines);
        for p in &prefixes {
            let want = if p.contains(':') {
                lab.node_v6[only].to_string()
            } else {
                lab.node_v4[only].to_string()
            };
            wait_until(&format!("{p} only via node {only}"), LONG, || {
                r.fib_nexthops(p) == [want.clone()]
            });
        }
        let (e0, pk0) = (echoed.load(Ordering::Relaxed), tcp_packets(&rds[only]));
        wait_until(&format!("echoes through node {only} alone"), LONG, || {
            echoed.load(Ordering::Relaxed) >= e0 + 8 * 20
        });
        assert!(tcp_packets(&rds[only]) > pk0, "node {only} carried them");
    }
    vtysh_conf(r, &[&format!("no neighbor {b4} shutdown")]);
    both_paths("both neighbours back");
    stop.store(true, Ordering::Relaxed);
    for c in conns {
        let res = c.handle.join().expect("connection thread");
        assert!(res.error.is_none(), "{res:?}");
        assert_eq!(res.backends.len(), 1, "{res:?}");
    }

    // Graceful restart of node A under numbered UDP streams through the
    // router: the router keeps A's paths (stale) while it is down, A
    // comes back (restart and forwarding-state bits) with End-of-RIB, and
    // not a datagram is lost.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let streams = [(vip4, 0u32), (vip6, 100u32)].map(|(v, first)| {
        udp_streams(
            &lab.client,
            SocketAddr::new(v.ip(), VIP_PORT),
            first,
            8,
            1000,
            stop.clone(),
            sent.clone(),
        )
    });
    wait_until("the streams arriving", LONG, || {
        servers.udp_log.lock().unwrap().total > 500
    });
    rds[0].stop();
    for p in &prefixes {
        let a = if p.contains(':') {
            lab.node_v6[0].to_string()
        } else {
            a4.clone()
        };
        wait_until(&format!("{p}: node A's path stale"), LONG, || {
            r.bgp_paths(p).contains(&(a.clone(), true))
        });
        assert_eq!(r.fib_nexthops(p), hops(p), "{p} kept in the FIB");
    }
    let arrived = servers.udp_log.lock().unwrap().total;
    wait_until("datagrams while node A is down", LONG, || {
        servers.udp_log.lock().unwrap().total > arrived + 1000
    });
    rds[0].restart(&["-persist-datapath"]);
    both_paths("after node A's restart");
    let p = peer(&rds[0], &r.v4);
    assert_eq!(p["state"], "Established", "{p}");
    // FRR's view: the restart bit and the forwarding-state bit for both
    // families, and End-of-RIB received for both.
    let nb: serde_json::Value =
        serde_json::from_str(&r.vtysh(&format!("show bgp neighbors {a4} json")))
            .unwrap_or_default();
    let gr = &nb[&a4]["gracefulRestartInfo"];
    for fam in ["ipv4Unicast", "ipv6Unicast"] {
        assert_eq!(gr[fam]["fBit"], true, "{fam}: {gr}");
        assert_eq!(gr["endOfRibRecv"][fam], true, "{fam}: {gr}");
    }
    assert_eq!(gr["rBit"], true, "{gr}");
    stop.store(true, Ordering::Relaxed);
    let per_flow: Vec<Vec<u64>> = streams
        .into_iter()
        .map(|h| h.join().expect("stream thread"))
        .collect();
    // What is in flight lands.
    std::thread::sleep(Duration::from_millis(500));
    let log = servers.udp_log.lock().unwrap();
    for (k, first) in [0u32, 100].into_iter().enumerate() {
        for (i, &n) in per_flow[k].iter().enumerate() {
            let flow = first + i as u32;
            let (backends, seen) = log.flows.get(&flow).expect("flow arrived");
            let lost = (0..n as usize)
                .filter(|&s| !seen.get(s).copied().unwrap_or(false))
                .count();
            assert_eq!(lost, 0, "flow {flow}: {lost} of {n} lost");
            assert_eq!(backends.len(), 1, "flow {flow}: {backends:?}");
        }
    }
    drop(log);
    for rd in &mut rds {
        rd.stop();
    }
}

/// What rivorad needs for BGPPeers, as docs/kubernetes.md and docs/bgp.md list it (beside its
/// Service rules, of which the Node watch uses `nodes`).
fn bgp_rules() -> serde_json::Value {
    serde_json::json!([
        { "apiGroups": [""], "resources": ["services", "nodes", "namespaces"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"] },
        { "apiGroups": ["rivora.io"], "resources": ["bgppeers", "addresspools"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["rivora.io"], "resources": ["bgpnodestatuses", "bgpnodestatuses/status"], "verbs": ["get", "create", "patch"] },
        { "apiGroups": [""], "resources": ["secrets"], "verbs": ["get"] },
    ])
}

/// BGPPeers against the real API server drive sessions with a real FRR:
/// the one whose selector picks the node comes up with the password of
/// its Secret; the one whose selector excludes the node opens nothing
/// until the selector changes; a node relabelled out of both ends both.
/// The node's BGPNodeStatus follows, written by its rivorad as a user
/// with only the documented rules.
#[test]
fn bgp_peers_from_kubernetes_select_nodes_and_the_node_status_follows() {
    use common::k8s::{shared, write_kubeconfig_with, ApiProxy, Identity, Kube, Rbac};
    use k8s_openapi::api::core::v1::{Node, Secret};
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use rivora_k8s::{BgpNodeStatus, BgpPeer};

    let s = shared();
    let kube = Kube::admin();
    let topo = Topology::builder(Mode::Nat).backends(1).build();
    let _servers = Servers::for_topology(&topo, false);
    let mut router = Router::new(Kind::Frr, &topo.node, topo.n, 41);
    let (nv4, nv6) = (router.node_v4.clone(), router.node_v6.clone());
    router.start(&[
        (&nv4, 65001, Some(PASSWORD), false),
        (&nv6, 65001, None, false),
    ]);

    // The cluster: this node (labelled), a Secret, two BGPPeers.
    let node = common::unique("bgpnode-");
    let k8s = kube.namespace("e2ebgp-");
    let nodes: Api<Node> = Api::all(kube.client.clone());
    let node_obj: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": node, "labels": { "rack": "r1" } },
    }))
    .unwrap();
    kube.block_on(nodes.create(&PostParams::default(), &node_obj))
        .expect("creating the Node");
    let secrets: Api<Secret> = Api::namespaced(kube.client.clone(), &k8s.name);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "tor-pw" },
        "stringData": { "password": PASSWORD },
    }))
    .unwrap();
    kube.block_on(secrets.create(&PostParams::default(), &secret))
        .expect("creating the Secret");
    let peers: Api<BgpPeer> = Api::all(kube.client.clone());
    let (p4, p6) = (common::unique("tor-v4-"), common::unique("tor-v6-"));
    let bad = common::unique("tor-bad-");
    for (name, addr, rack, pw) in [
        (&p4, &router.v4, "r1", true),
        (&p6, &router.v6, "r2", false),
    ] {
        let mut spec = serde_json::json!({
            "address": addr, "asn": 65000, "holdTime": "9s", "connectRetry": "1s",
            "nodeSelector": { "matchLabels": { "rack": rack } },
        });
        if pw {
            spec["passwordSecretRef"] =
                serde_json::json!({ "name": "tor-pw", "namespace": k8s.name });
        }
        let p: BgpPeer = serde_json::from_value(serde_json::json!({
            "apiVersion": "rivora.io/v1alpha1", "kind": "BGPPeer",
            "metadata": { "name": name }, "spec": spec,
        }))
        .unwrap();
        kube.block_on(peers.create(&PostParams::default(), &p))
            .expect("creating a BGPPeer");
    }
    struct Cleanup(Kube, Vec<String>, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let dp = DeleteParams::default();
            let peers: Api<BgpPeer> = Api::all(self.0.client.clone());
            for p in &self.1 {
                let _ = self.0.block_on(peers.delete(p, &dp));
            }
            let nodes: Api<Node> = Api::all(self.0.client.clone());
            let _ = self.0.block_on(nodes.delete(&self.2, &dp));
            let st: Api<BgpNodeStatus> = Api::all(self.0.client.clone());
            let _ = self.0.block_on(st.delete(&self.2, &dp));
        }
    }
    let _cleanup = Cleanup(
        kube.clone(),
        vec![p4.clone(), p6.clone(), bad.clone()],
        node.clone(),
    );

    // rivorad -kubernetes as a user with the documented rules only.
    let home = Home::new();
    let user = common::unique("rivorad-bgp-");
    let id = Identity::user(&home.path(""), &user);
    let rbac = Rbac::new(&kube, &user);
    rbac.grant("bgp", bgp_rules());
    let proxy = ApiProxy::start(&topo.node, s.addr);
    let kubeconfig = home.path("kubeconfig");
    write_kubeconfig_with(&kubeconfig, &proxy.url(), &s.server.ca_cert, &id);
    let yaml = format!(
        "{}bgp:\n  asn: 65001\n  routerId: {}\n",
        home.node_config("n0", topo.node_v4, topo.node_v6),
        topo.node_v4
    );
    let rd = Rivorad::start_kubernetes(&topo.node, home, &yaml, &kubeconfig, &node, &[]);
    let sessions = |rd: &Rivorad| -> Vec<(String, String)> {
        rd.ctl_json(&["bgp", "peers"])
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap_or("").to_string(),
                    p["state"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    let statuses: Api<BgpNodeStatus> = Api::all(kube.client.clone());
    let node_status = || -> serde_json::Value {
        kube.block_on(statuses.get_opt(&node))
            .ok()
            .flatten()
            .map(|o| serde_json::to_value(o).unwrap())
            .unwrap_or_default()
    };

    // The selected peer: Established with the Secret's password; the
    // other opens nothing.
    wait_until("the selected BGPPeer Established", LONG, || {
        sessions(&rd) == [(p4.clone(), "Established".to_string())] && router.established(&nv4)
    });
    assert!(!router.established(&nv6));
    wait_until("the node status saying so", LONG, || {
        let st = node_status();
        st["spec"]["nodeName"] == node.as_str()
            && st["status"]["establishedCount"] == 1
            && st["status"]["sessionCount"] == 1
            && st["status"]["sessions"][0]["name"] == p4.as_str()
            && st["status"]["sessions"][0]["state"] == "Established"
    });
    let w = rd.status()["watches"].clone();
    let bgppeers = w
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["resource"] == "bgppeers")
        .cloned()
        .unwrap_or_else(|| panic!("no bgppeers watch: {w}"));
    assert_eq!(bgppeers["synced"], true, "{bgppeers}");
    assert!(bgppeers["objects"].as_u64().unwrap() >= 2, "{bgppeers}");

    // A BGPPeer the schema takes but the validator refuses (a hold time
    // of 2 s) opens nothing and is named, with why, in the node status
    // and the watch's last error.
    let p: BgpPeer = serde_json::from_value(serde_json::json!({
        "apiVersion": "rivora.io/v1alpha1", "kind": "BGPPeer",
        "metadata": { "name": bad },
        "spec": { "address": "10.250.0.1", "asn": 65000, "holdTime": "2s" },
    }))
    .unwrap();
    kube.block_on(peers.create(&PostParams::default(), &p))
        .expect("creating a BGPPeer");
    wait_until("the refused BGPPeer in the node status", LONG, || {
        let st = node_status();
        st["status"]["refused"].as_array().is_some_and(|a| {
            a.iter().any(|r| {
                r["name"] == bad.as_str()
                    && r["reason"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("spec.holdTime:"))
            })
        })
    });
    assert_eq!(sessions(&rd), [(p4.clone(), "Established".to_string())]);
    let w = rd.status()["watches"].to_string();
    assert!(w.contains(&format!("BGPPeer {bad}: spec.holdTime")), "{w}");
    kube.block_on(peers.delete(&bad, &DeleteParams::default()))
        .expect("deleting the BGPPeer");

    // The second BGPPeer's selector now picks the node: its session too.
    kube.block_on(peers.patch(
        &p6,
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"spec": {"nodeSelector": {"matchLabels": {"rack": "r1"}}}}),
        ),
    ))
    .expect("patching the BGPPeer");
    wait_until("both BGPPeers Established", LONG, || {
        let mut s = sessions(&rd);
        s.sort();
        let mut want = vec![
            (p4.clone(), "Established".to_string()),
            (p6.clone(), "Established".to_string()),
        ];
        want.sort();
        s == want && router.established(&nv6)
    });
    wait_until("the node status with two sessions", LONG, || {
        node_status()["status"]["establishedCount"] == 2
    });

    // The node relabelled out of both selectors: no session at all.
    kube.block_on(nodes.patch(
        &node,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"rack": "r3"}}})),
    ))
    .expect("relabelling the Node");
    wait_until("no session once the node is not selected", LONG, || {
        sessions(&rd).is_empty() && !router.established(&nv4) && !router.established(&nv6)
    });
    wait_until("the node status empty", LONG, || {
        node_status()["status"]["sessionCount"] == 0
    });
    drop(rd);
    drop(proxy);
    drop(rbac);
}
