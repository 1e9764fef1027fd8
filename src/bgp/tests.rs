use std::net::IpAddr;

use rivora_model::config::bgp::{Advertisement, BgpSettings, RoutePolicy};

use super::*;
use crate::dataplane::alloc::Slice;
use crate::dataplane::render::Health;
use crate::model::{Affinity, BackendTarget, Mode, Ports, Protocol, VipKey};
use crate::reconciler::status::{BackendStatus, ProbeStatus, VipStatus};

fn vip(addr: &str, port: u16, backends: &[(Health, u32)]) -> VipStatus {
    VipStatus {
        key: VipKey {
            addr: addr.parse().unwrap(),
            ports: Ports::One(port),
            proto: Protocol::Tcp,
        },
        name: String::new(),
        owner: None,
        svc_id: 1,
        slice: Slice { start: 0, len: 12 },
        mode: Mode::Nat,
        affinity: Affinity::None,
        source_ranges: None,
        traffic_policy: crate::desired::TrafficPolicy::Cluster,
        slice_need: None,
        backends: backends
            .iter()
            .enumerate()
            .map(|(i, (health, weight))| BackendStatus {
                target: BackendTarget {
                    addr: format!("10.9.0.{}", i + 1).parse().unwrap(),
                    port: 80,
                },
                service_port: 80,
                backend_id: i as u32 + 1,
                weight: *weight,
                health: *health,
                drained: false,
                probe: ProbeStatus::Disabled,
                mode: Mode::Nat,
                node: None,
            })
            .collect(),
    }
}

fn settings() -> BgpSettings {
    BgpSettings {
        asn: 65001,
        router_id: Some("10.0.0.2".parse().unwrap()),
        listen_port: 179,
        restart_time: 120,
        peers: vec![],
        advertisements: vec![Advertisement {
            prefixes: vec![("10.0.100.0".parse().unwrap(), 24)],
            policy: RoutePolicy {
                communities: vec![(65000 << 16) | 7],
                ..RoutePolicy::default()
            },
        }],
    }
}

fn prefixes(r: &[Route]) -> Vec<String> {
    r.iter().map(|r| r.prefix.to_string()).collect()
}

#[test]
fn a_vip_address_is_announced_while_one_of_its_vips_serves() {
    let st = DataplaneStatus {
        vips: vec![
            // Two ports of one address: one serving is enough.
            vip("10.0.100.1", 80, &[(Health::Down, 1)]),
            vip("10.0.100.1", 443, &[(Health::Healthy, 1)]),
            // All down: withdrawn.
            vip("10.0.100.2", 80, &[(Health::Down, 1), (Health::Down, 1)]),
            // Healthy but drained (weight 0) or draining: takes no new flow.
            vip(
                "10.0.100.3",
                80,
                &[(Health::Healthy, 0), (Health::Draining, 1)],
            ),
            // No backend at all.
            vip("10.0.100.4", 80, &[]),
            vip("fd00::1", 80, &[(Health::Healthy, 1)]),
        ],
        ..DataplaneStatus::default()
    };
    let r = routes_of(&st, &settings());
    assert_eq!(prefixes(&r), ["10.0.100.1/32", "fd00::1/128"]);
    assert_eq!(
        r[0].attrs.communities,
        vec![(65000 << 16) | 7],
        "the advertisement matched"
    );
    assert!(
        r[1].attrs.communities.is_empty(),
        "outside the advertisement's prefix"
    );
}

#[test]
fn the_router_id_is_configured_or_the_address_toward_a_peer() {
    assert_eq!(router_id(&settings()), Some("10.0.0.2".parse().unwrap()));
    let mut s = settings();
    s.router_id = None;
    s.peers = vec![];
    // Toward loopback the kernel picks a loopback address: still an
    // IPv4 address of this host.
    let _ = router_id(&s);
    let p: IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(rivora_bgp::speaker::local_toward(p), Some(p));
}

#[test]
fn only_the_speakers_identity_waits_for_a_restart() {
    let was = BgpSettings {
        asn: 65001,
        router_id: None,
        listen_port: 179,
        restart_time: 120,
        peers: Vec::new(),
        advertisements: Vec::new(),
    };
    // Peers and advertisements are applied: no warning.
    let mut now = was.clone();
    now.advertisements.push(Advertisement {
        prefixes: vec![("10.0.0.0".parse().unwrap(), 24)],
        policy: RoutePolicy::default(),
    });
    assert!(restart_only(&was, &now).is_empty());
    now.asn = 65002;
    now.router_id = Some("10.0.0.9".parse().unwrap());
    now.restart_time = 30;
    let w = restart_only(&was, &now);
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(
        w[0].starts_with("bgp.asn changed from 65001 to 65002"),
        "{w:?}"
    );
    assert!(w[1].contains("bgp.routerId changed from none (from the peers) to 10.0.0.9"));
    assert!(w[2]
        .contains("bgp.restartTime changed from 120s to 30s: it takes effect at the next restart"));
}
