//! The BGP speaker against the real peers from Debian, each in its own
//! namespace: BIRD 2, FRR (zebra + bgpd) and GoBGP, one shared setup.
//! Sessions over IPv4 and IPv6 reach Established; the VIPs' /32 and /128
//! appear in each peer's RIB with the node's address as next hop and the
//! advertisement's communities; when every backend dies they are
//! withdrawn everywhere; `rivoractl bgp peers|routes` say so. A restart
//! of rivorad with `-persist-datapath` keeps the routes in every peer.

mod common;

use std::time::Duration;

use common::bgp::{Kind, Router};
use common::rivorad::{Home, Rivorad};
use common::topology::{Mode, Topology, NAT_BACKEND_PORT};
use common::traffic::{wait_until, Servers};

const LONG: Duration = Duration::from_secs(60);

fn config(topo: &Topology, home: &Home, routers: &[Router]) -> String {
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
