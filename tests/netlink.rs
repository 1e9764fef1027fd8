//! The netlink lookups against the kernel, in two namespaces joined by a
//! veth pair: links agree with `ip -j link`, a permanent neighbour is
//! found, an unresolved one times out with an error naming it, and a
//! neighbour not yet in the table is resolved by asking the kernel. Needs
//! root; the namespaces (and with them the veths) go on drop.

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::netns::Netns;
use common::unique;
use rivora::daemon::net::{self, NetError};
use rivora::model::Mac;
use rivora::netlink::Netlink;

/// Two namespaces, `a` holding veth end `a_if` (10.77.0.1/24, fd77::1/64),
/// `b` holding `b_if` (10.77.0.2/24, fd77::2/64).
struct Pair {
    a: Netns,
    b: Netns,
    a_if: String,
    b_if: String,
}

impl Pair {
    fn new() -> Self {
        let a = Netns::new(&unique("rvnla"));
        let b = Netns::new(&unique("rvnlb"));
        let a_if = unique("nla");
        let b_if = unique("nlb");
        common::netns::sh(&format!(
            "ip link add {a_if} netns {} type veth peer name {b_if} netns {}",
            a.name, b.name
        ));
        for (ns, ifc, host) in [(&a, &a_if, 1), (&b, &b_if, 2)] {
            ns.exec(&format!(
                "ip addr add 10.77.0.{host}/24 dev {ifc} && \
                 ip addr add fd77::{host}/64 dev {ifc} nodad && \
                 ip link set {ifc} up"
            ));
        }
        Self { a, b, a_if, b_if }
    }
}

/// What `ip -j link show` says about `ifc` in `ns`: ifindex, MAC, MTU.
fn ip_link(ns: &Netns, ifc: &str) -> (u32, Mac, u32) {
    let out = ns.exec(&format!("ip -j link show {ifc}"));
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j link is JSON");
    let l = &v[0];
    (
        l["ifindex"].as_u64().expect("ifindex") as u32,
        l["address"]
            .as_str()
            .expect("address")
            .parse()
            .expect("a MAC"),
        l["mtu"].as_u64().expect("mtu") as u32,
    )
}

#[test]
fn link_matches_ip_link() {
    let p = Pair::new();
    p.a.exec(&format!("ip link set {} mtu 1400", p.a_if));
    let (index, mac, mtu) = ip_link(&p.a, &p.a_if);
    let name = p.a_if.clone();
    let (by_name, by_index, missing, iface, iface_missing) = p.a.run(move || {
        let mut nl = Netlink::open().expect("netlink socket");
        (
            nl.link_by_name(&name).expect("link by name"),
            nl.link_by_index(index).expect("link by index"),
            nl.link_by_name("rvnl-none").expect("missing link"),
            net::interface(&name).expect("net::interface"),
            net::interface("rvnl-none"),
        )
    });
    let link = by_name.expect("the veth is there");
    assert_eq!(link.index, index);
    assert_eq!(link.name, p.a_if);
    assert_eq!(link.mac, Some(mac));
    assert_eq!(link.mtu, Some(mtu));
    assert_eq!(mtu, 1400);
    assert_eq!(by_index, Some(link));
    assert_eq!(missing, None);
    assert_eq!(iface, (index, mac));
    let err = iface_missing.expect_err("no such interface");
    assert!(
        matches!(err, NetError::NoInterface { ref name } if name == "rvnl-none"),
        "{err}"
    );
}

#[test]
fn permanent_neighbours_are_found() {
    let p = Pair::new();
    let mac4: Mac = "02:77:00:00:00:09".parse().expect("mac");
    let mac6: Mac = "02:77:00:00:00:0a".parse().expect("mac");
    p.a.exec(&format!(
        "ip neigh add 10.77.0.9 lladdr {mac4} dev {ifc} nud permanent && \
         ip -6 neigh add fd77::9 lladdr {mac6} dev {ifc} nud permanent",
        ifc = p.a_if
    ));
    let (index, _, _) = ip_link(&p.a, &p.a_if);
    let (n4, n6, r4, r6) = p.a.run(|| {
        let mut nl = Netlink::open().expect("netlink socket");
        let v4: IpAddr = "10.77.0.9".parse().expect("addr");
        let v6: IpAddr = "fd77::9".parse().expect("addr");
        (
            nl.neighbour(v4).expect("lookup v4"),
            nl.neighbour(v6).expect("lookup v6"),
            net::resolve_mac(v4, Duration::from_millis(200)),
            net::resolve_mac(v6, Duration::from_millis(200)),
        )
    });
    let n4 = n4.expect("the IPv4 entry");
    assert_eq!((n4.mac, n4.ifindex), (Some(mac4), index));
    let n6 = n6.expect("the IPv6 entry");
    assert_eq!((n6.mac, n6.ifindex), (Some(mac6), index));
    assert_eq!(r4.expect("resolve v4"), mac4);
    assert_eq!(r6.expect("resolve v6"), mac6);
}

#[test]
fn missing_neighbour_times_out_naming_it() {
    let p = Pair::new();
    let wait = Duration::from_millis(300);
    for addr in ["10.77.0.66", "fd77::66"] {
        let addr: IpAddr = addr.parse().expect("addr");
        let (res, took) = p.a.run(move || {
            let t = Instant::now();
            (net::resolve_mac(addr, wait), t.elapsed())
        });
        let err = res.expect_err("nobody holds that address");
        assert!(
            matches!(err, NetError::Unresolved { addr: a, .. } if a == addr),
            "{err}"
        );
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
        assert!(took >= wait, "gave up after {took:?}, before {wait:?}");
        assert!(
            took < wait + Duration::from_secs(1),
            "took {took:?} for a {wait:?} wait"
        );
    }
}

#[test]
fn unknown_neighbour_is_resolved_by_the_kernel() {
    let p = Pair::new();
    let (_, b_mac, _) = ip_link(&p.b, &p.b_if);
    for addr in ["10.77.0.2", "fd77::2"] {
        let addr: IpAddr = addr.parse().expect("addr");
        let (before, resolved) = p.a.run(move || {
            let mut nl = Netlink::open().expect("netlink socket");
            (
                nl.neighbour(addr).expect("lookup"),
                net::resolve_mac(addr, Duration::from_secs(3)),
            )
        });
        assert_eq!(before, None, "{addr} was already in the table");
        assert_eq!(resolved.expect("b answers"), b_mac, "{addr}");
    }
}

#[test]
fn route_get_gives_interface_and_gateway() {
    let p = Pair::new();
    p.a.exec("ip route add 198.51.100.0/24 via 10.77.0.2");
    let (index, _, _) = ip_link(&p.a, &p.a_if);
    let (direct, via, none) = p.a.run(|| {
        let mut nl = Netlink::open().expect("netlink socket");
        (
            nl.route_get("10.77.0.2".parse().expect("addr"))
                .expect("route get"),
            nl.route_get("198.51.100.7".parse().expect("addr"))
                .expect("route get"),
            nl.route_get("203.0.113.1".parse().expect("addr"))
                .expect("route get"),
        )
    });
    let direct = direct.expect("a connected route");
    assert_eq!(direct.oif, Some(index));
    assert_eq!(direct.gateway, None);
    assert_eq!(
        direct.next_hop(),
        "10.77.0.2".parse::<IpAddr>().expect("addr")
    );
    let via = via.expect("the static route");
    assert_eq!(via.oif, Some(index));
    assert_eq!(via.next_hop(), "10.77.0.2".parse::<IpAddr>().expect("addr"));
    assert_eq!(none, None, "no default route in the namespace");
}
