//! A fake `ApiState` for the API and rivoractl tests: two VIPs, three
//! backends, and a record of every write the server let through.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use rivora::api::{
    Affinity, ApiRequestError, ApiState, BackendHealth, BackendInfo, DrainOutcome, DrainSpec,
    Drops, InterfaceStatus, Ports, ProbeState, Proto, ReloadResult, SlicePrecision, SourceInfo,
    Status, VipBackend, VipInfo, VipMode, VipName, WatchInfo, XdpMode,
};
use rivora::metrics::{BackendHealthSample, Metrics, MetricsSnapshot, VipCounters};

pub const VIP4: &str = "tcp/10.0.0.1:80";
pub const VIP6: &str = "udp/[2001:db8::1]:53";
pub const B1: &str = "10.0.1.1:8080";
pub const B2: &str = "10.0.1.2:8080";
pub const B6: &str = "[2001:db8::10]:53";

/// The endpointslices watch's last error, and how long before the status
/// request it happened (hours: a test that straddles a second still reads
/// the same age).
pub const WATCH_ERROR: &str = "failed to list endpointslices: connection refused";
pub const WATCH_ERROR_AGE_S: u64 = 5 * 3600;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// With [`Fake::advance`] set, what each `vips` read adds to VIP4's
/// counters (VIP6's stay): a watch's rate is then known up to the time
/// between its samples.
pub const STEP_PACKETS: u64 = 1000;
pub const STEP_BYTES: u64 = 64_000;

#[derive(Default)]
pub struct Fake {
    /// Every write method call that reached the state, in order.
    pub calls: Mutex<Vec<String>>,
    /// (backend, vip) pairs drained by the operator.
    pub drained: Mutex<BTreeSet<(SocketAddr, String)>>,
    pub fail_reload: AtomicBool,
    pub fail_reads: AtomicBool,
    /// Each `vips` call advances VIP4's counters by one step.
    pub advance: AtomicBool,
    /// `vips` calls made while `advance` was set.
    pub steps: AtomicU64,
}

impl Fake {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    pub fn drained(&self) -> BTreeSet<(SocketAddr, String)> {
        self.drained.lock().unwrap().clone()
    }

    fn membership() -> Vec<(SocketAddr, &'static str)> {
        vec![
            (B1.parse().unwrap(), VIP4),
            (B2.parse().unwrap(), VIP4),
            (B6.parse().unwrap(), VIP6),
        ]
    }

    fn is_drained(&self, b: SocketAddr, vip: &str) -> bool {
        self.drained.lock().unwrap().contains(&(b, vip.to_string()))
    }

    fn read_guard(&self) -> Result<(), ApiRequestError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(ApiRequestError::Internal {
                reason: "stats map read failed".into(),
            });
        }
        Ok(())
    }

    pub fn all_vips(&self) -> Vec<VipInfo> {
        let steps = self.steps.load(Ordering::SeqCst);
        let backend = |t: &str, id, weight, health| {
            let target: SocketAddr = t.parse().unwrap();
            VipBackend {
                target,
                backend_id: id,
                weight,
                health,
                drained: false,
                mode: None,
                node: None,
            }
        };
        let mut v4 = VipInfo {
            vip: VIP4.into(),
            addr: "10.0.0.1".parse().unwrap(),
            ports: Ports {
                first: 80,
                last: 80,
            },
            proto: Proto::Tcp,
            mode: VipMode::Nat,
            affinity: Affinity::None,
            service_id: 1,
            slice_start: 0,
            slice_len: 13,
            backends: vec![
                backend(B1, 1, 1, BackendHealth::Healthy),
                backend(B2, 2, 2, BackendHealth::Down),
            ],
            packets: 1500 + steps * STEP_PACKETS,
            bytes: 96000 + steps * STEP_BYTES,
            rate_limited: 4,
            no_backend: 0,
            fullnat_ports_exhausted: 0,
            fullnat_table_full: 0,
            source: "service shop/web".into(),
            slice_precision: SlicePrecision {
                needed: 12,
                wanted: 768,
                reduced: false,
            },
            source_ranges: Some(vec!["192.0.2.0/24".into(), "198.51.100.0/24".into()]),
            source_refused: 6,
        };
        let mut v6 = VipInfo {
            vip: VIP6.into(),
            addr: "2001:db8::1".parse().unwrap(),
            ports: Ports {
                first: 53,
                last: 53,
            },
            proto: Proto::Udp,
            mode: VipMode::Dsr,
            affinity: Affinity::ClientIp,
            service_id: 2,
            slice_start: 13,
            slice_len: 7,
            backends: vec![backend(B6, 3, 1, BackendHealth::Healthy)],
            packets: 20,
            bytes: 1600,
            rate_limited: 0,
            no_backend: 2,
            fullnat_ports_exhausted: 0,
            fullnat_table_full: 0,
            // Adopted from the maps on a restart, not claimed yet.
            source: "unclaimed".into(),
            slice_precision: SlicePrecision::default(),
            source_ranges: None,
            source_refused: 0,
        };
        for v in [&mut v4, &mut v6] {
            let name = v.vip.clone();
            for b in &mut v.backends {
                if self.is_drained(b.target, &name) {
                    b.drained = true;
                    if b.health == BackendHealth::Healthy {
                        b.health = BackendHealth::Draining;
                    }
                }
            }
        }
        vec![v4, v6]
    }

    fn change(
        &self,
        verb: &str,
        spec: &DrainSpec,
        drain: bool,
    ) -> Result<DrainOutcome, ApiRequestError> {
        self.calls.lock().unwrap().push(format!(
            "{verb} {} {}",
            spec.target,
            spec.vip
                .map(|v| v.to_string())
                .unwrap_or_else(|| "*".into())
        ));
        let members: Vec<&str> = Self::membership()
            .into_iter()
            .filter(|(b, _)| *b == spec.target)
            .map(|(_, v)| v)
            .collect();
        if members.is_empty() {
            return Err(ApiRequestError::UnknownBackend {
                target: spec.target,
            });
        }
        let vips: Vec<String> = match &spec.vip {
            Some(v) => {
                let name = v.to_string();
                if !Self::membership().iter().any(|(_, m)| *m == name) {
                    return Err(ApiRequestError::UnknownVip { vip: name });
                }
                if !members.contains(&name.as_str()) {
                    return Err(ApiRequestError::BackendNotInVip {
                        target: spec.target,
                        vip: name,
                    });
                }
                vec![name]
            }
            None => members.iter().map(|s| s.to_string()).collect(),
        };
        let mut set = self.drained.lock().unwrap();
        let mut changed = false;
        for v in &vips {
            let key = (spec.target, v.clone());
            changed |= if drain {
                set.insert(key)
            } else {
                set.remove(&key)
            };
        }
        Ok(DrainOutcome {
            target: spec.target,
            vips,
            changed,
        })
    }
}

impl ApiState for Fake {
    async fn status(&self) -> Result<Status, ApiRequestError> {
        self.read_guard()?;
        Ok(Status {
            version: "0.1.0-test".into(),
            config_generation: 3,
            last_reload: ReloadResult {
                ok: false,
                at: 1_700_000_000,
                error: Some("rivora.yaml:12: vips[1].port: must be 1-65535".into()),
                warnings: vec![],
            },
            interfaces: vec![
                InterfaceStatus {
                    name: "eth0".into(),
                    ifindex: 2,
                    xdp_mode: XdpMode::Native,
                    tc_attached: true,
                },
                InterfaceStatus {
                    name: "veth-long-name".into(),
                    ifindex: 17,
                    xdp_mode: XdpMode::Generic,
                    tc_attached: false,
                },
            ],
            vip_count: 2,
            backend_count: 3,
            maglev_size: 65_537,
            flow_table_size: 131_072,
            flow_table_per_cpu: 65_536,
            apply_in_progress: false,
            unclaimed_vips: 0,
            conflicts: Vec::new(),
            failed_vips: Vec::new(),
            // A Kubernetes node: the file holds node settings only.
            sources: vec![
                SourceInfo {
                    kind: "file".into(),
                    synced: true,
                    objects: 1,
                    updates_ok: 3,
                    updates_failed: 1,
                    last_at: 1_700_000_000,
                    last_error: Some("rivora.yaml:12: vips[1].port: must be 1-65535".into()),
                },
                SourceInfo {
                    kind: "service".into(),
                    synced: false,
                    objects: 1,
                    updates_ok: 4,
                    updates_failed: 0,
                    last_at: now_secs() - 2 * 3600,
                    last_error: None,
                },
            ],
            watches: vec![
                WatchInfo {
                    resource: "services".into(),
                    synced: true,
                    objects: 1,
                    errors: 0,
                    last_error: None,
                    last_error_at: 0,
                },
                WatchInfo {
                    resource: "endpointslices".into(),
                    synced: false,
                    objects: 0,
                    errors: 2,
                    last_error: Some(WATCH_ERROR.into()),
                    last_error_at: now_secs() - WATCH_ERROR_AGE_S,
                },
            ],
            l2: None,
        })
    }

    async fn vips(&self) -> Result<Vec<VipInfo>, ApiRequestError> {
        self.read_guard()?;
        if self.advance.load(Ordering::SeqCst) {
            self.steps.fetch_add(1, Ordering::SeqCst);
        }
        Ok(self.all_vips())
    }

    async fn vip(&self, name: &VipName) -> Result<Option<VipInfo>, ApiRequestError> {
        self.read_guard()?;
        let name = name.to_string();
        Ok(self.all_vips().into_iter().find(|v| v.vip == name))
    }

    async fn backends(&self) -> Result<Vec<BackendInfo>, ApiRequestError> {
        self.read_guard()?;
        Ok(Self::membership()
            .into_iter()
            .enumerate()
            .map(|(i, (target, vip))| BackendInfo {
                target,
                backend_id: i as u32 + 1,
                health: if target.to_string() == B2 {
                    BackendHealth::Down
                } else if self.is_drained(target, vip) {
                    BackendHealth::Draining
                } else {
                    BackendHealth::Healthy
                },
                probe: if target.to_string() == B2 {
                    ProbeState::Down
                } else {
                    ProbeState::Healthy
                },
                drained_by_operator: self.is_drained(target, vip),
                vips: vec![vip.to_string()],
            })
            .collect())
    }

    async fn drops(&self) -> Result<Drops, ApiRequestError> {
        self.read_guard()?;
        let mut by_reason = BTreeMap::new();
        by_reason.insert("no_healthy_backend".to_string(), 2);
        by_reason.insert("no_service".to_string(), 0);
        by_reason.insert("rate_limited".to_string(), 4);
        let mut rate_limited_by_vip = BTreeMap::new();
        rate_limited_by_vip.insert(VIP4.to_string(), 4);
        Ok(Drops {
            by_reason,
            rate_limited_by_vip,
        })
    }

    async fn drain(&self, spec: &DrainSpec) -> Result<DrainOutcome, ApiRequestError> {
        self.change("drain", spec, true)
    }

    async fn undrain(&self, spec: &DrainSpec) -> Result<DrainOutcome, ApiRequestError> {
        self.change("undrain", spec, false)
    }

    async fn reload(&self) -> Result<ReloadResult, ApiRequestError> {
        self.calls.lock().unwrap().push("reload".into());
        if self.fail_reload.load(Ordering::SeqCst) {
            return Err(ApiRequestError::ConfigInvalid {
                error: "rivora.yaml:3: interfaces: must not be empty".into(),
            });
        }
        Ok(ReloadResult {
            ok: true,
            at: 1_700_000_100,
            error: None,
            warnings: vec![],
        })
    }

    async fn metrics(&self) -> Result<String, ApiRequestError> {
        self.read_guard()?;
        let vips = self.all_vips();
        let snap = MetricsSnapshot {
            version: "0.1.0-test".into(),
            vips: vips
                .iter()
                .map(|v| VipCounters {
                    vip: v.vip.clone(),
                    packets: v.packets,
                    bytes: v.bytes,
                    rate_limited_syns: v.rate_limited,
                    no_healthy_backend_drops: v.no_backend,
                    source_refused: v.source_refused,
                    maglev_slots: u64::from(v.slice_len),
                    maglev_reduced_precision: v.slice_precision.reduced,
                })
                .collect(),
            backends: vec![BackendHealthSample {
                backend: B1.into(),
                state: BackendHealth::Healthy,
            }],
            ..Default::default()
        };
        Metrics::new()
            .encode(snap)
            .map_err(|e| ApiRequestError::Internal {
                reason: e.to_string(),
            })
    }
}
