//! What the speaker reads from the published status: one view per
//! address, served if any of its VIPs is, Local if any is, unclaimed VIPs
//! left out.

use std::net::IpAddr;

use super::*;
use crate::dataplane::alloc::Slice;
use crate::dataplane::render::Health;
use crate::desired::{Owner, SourceKind};
use crate::model::{Affinity, BackendTarget, Mode as VipMode, Ports, Protocol, VipKey};
use crate::reconciler::status::{BackendStatus, ProbeStatus, VipStatus};

fn vip(addr: &str, port: u16, backends: &[(Health, u32)], policy: TrafficPolicy) -> VipStatus {
    let a: IpAddr = addr.parse().unwrap();
    VipStatus {
        key: VipKey {
            addr: a,
            ports: Ports::One(port),
            proto: Protocol::Tcp,
        },
        name: format!("{addr}:{port}"),
        owner: Some(Owner::new(SourceKind::Service, "ns/svc")),
        traffic_policy: policy,
        svc_id: 1,
        slice: Slice { start: 0, len: 12 },
        mode: VipMode::Nat,
        affinity: Affinity::None,
        source_ranges: None,
        backends: backends
            .iter()
            .enumerate()
            .map(|(i, (health, weight))| BackendStatus {
                target: BackendTarget {
                    addr: "10.9.0.1".parse().unwrap(),
                    port: 8000 + i as u16,
                },
                service_port: 80,
                backend_id: i as u32 + 1,
                weight: *weight,
                health: *health,
                drained: false,
                probe: ProbeStatus::Disabled,
                mode: VipMode::Nat,
                node: None,
            })
            .collect(),
        slice_need: None,
    }
}

#[test]
fn one_view_per_address_served_if_any_port_is() {
    let cluster = TrafficPolicy::Cluster;
    let mut unclaimed = vip("10.0.0.9", 80, &[(Health::Healthy, 1)], cluster);
    unclaimed.owner = None;
    let st = DataplaneStatus {
        vips: vec![
            // Port 80 has no healthy backend, 443 does: the address is served.
            vip("10.0.0.1", 80, &[(Health::Down, 1)], cluster),
            vip("10.0.0.1", 443, &[(Health::Healthy, 1)], cluster),
            // Only drained (weight 0) or draining: not served.
            vip(
                "10.0.0.2",
                80,
                &[(Health::Healthy, 0), (Health::Draining, 1)],
                cluster,
            ),
            // eTP Local with a backend here.
            vip("fd00::3", 80, &[(Health::Healthy, 1)], TrafficPolicy::Local),
            unclaimed,
        ],
        ..Default::default()
    };
    let views = vip_views(&st, |a| {
        (a == "10.0.0.1".parse::<IpAddr>().unwrap()).then(|| PoolView {
            name: "web".into(),
            l2: None,
        })
    });
    let got: Vec<(String, bool, bool, Option<String>)> = views
        .iter()
        .map(|v| {
            (
                v.addr.to_string(),
                v.serving,
                v.local,
                v.pool.as_ref().map(|p| p.name.clone()),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("10.0.0.1".into(), true, false, Some("web".into())),
            ("10.0.0.2".into(), false, false, None),
            ("fd00::3".into(), true, true, None),
        ]
    );
}

#[test]
fn identities_name_the_node_and_differ_per_run() {
    let a = identity("node-1");
    assert!(a.starts_with("node-1_"), "{a}");
    std::thread::sleep(Duration::from_millis(2));
    assert_ne!(a, identity("node-1"));
}
