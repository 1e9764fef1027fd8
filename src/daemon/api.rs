//! The API as rivorad answers it. Reads come from the reconciler's
//! published status and the pinned counters, never from the reconciler
//! itself, so they answer during a long apply; writes are commands to the
//! reconciler (drains) or the file source (reload), answered once
//! applied.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{mpsc, Arc};

use tokio::sync::oneshot;

use crate::abi::{self, rv_drop_stats, rv_fullnat_stats, rv_source_refused, rv_vip_stats};
use crate::api::{
    Affinity as ApiAffinity, BackendHealth, BackendInfo, DrainOutcome, DrainSpec, Drops,
    InterfaceStatus, L2Group, L2Info, Ports as ApiPorts, ProbeState, Proto, ReloadResult,
    SlicePrecision, SourceInfo, Status, VipBackend, VipInfo, VipMode, VipName, WatchInfo,
    XdpMode as ApiXdpMode,
};
use crate::api::{ApiRequestError, ApiState};
use crate::dataplane::render::Health;
use crate::dataplane::{Maps, XdpMode};
use crate::desired::{Owner, SourceKind};
use crate::healthcheck::HealthState;
use crate::l2::L2State;
use crate::metrics::{BackendHealthSample, Metrics, MetricsSnapshot, VipCounters};
use crate::model::{Affinity, Mode, Ports, Protocol, VipKey};
use crate::reconciler::status::{DataplaneStatus, ProbeStatus, SourceStatus, StatusReader};
use crate::reconciler::{Command, DrainError};
use crate::sources::file::{FileSource, ReloadError};
use crate::sources::{WatchState, WatchStates};

pub struct DaemonApi {
    pub status: StatusReader,
    pub reconciler: std::sync::Mutex<mpsc::Sender<Command>>,
    pub file: Arc<FileSource>,
    /// Read-only view of the pinned counters.
    pub maps: Maps,
    /// Also fed by the health checker's observer (probe latencies).
    pub metrics: Arc<Metrics>,
    /// The Kubernetes source's watches (`-kubernetes`); None without.
    pub watches: Option<WatchStates>,
    /// The BGP speaker, when the file has a `bgp` section.
    pub bgp: Option<rivora_bgp::Speaker>,
    /// The L2 speaker's state; None when it does not run.
    pub l2: Option<tokio::sync::watch::Receiver<Arc<L2State>>>,
}

fn l2_info(s: &L2State) -> L2Info {
    L2Info {
        mode: s.mode.to_string(),
        identity: s.identity.clone(),
        groups: s
            .groups
            .iter()
            .map(|g| L2Group {
                name: g.name.clone(),
                owner: g.owner,
                since: g.since,
                holder: g.holder.clone(),
                interfaces: g.interfaces.clone(),
                vips: g.vips.clone(),
            })
            .collect(),
        last_error: s.last_error.clone(),
    }
}

fn internal(e: impl std::fmt::Display) -> ApiRequestError {
    ApiRequestError::Internal {
        reason: e.to_string(),
    }
}

fn key_of(name: &VipName) -> VipKey {
    VipKey {
        addr: name.addr,
        ports: if name.ports.first == name.ports.last {
            Ports::One(name.ports.first)
        } else {
            Ports::Range {
                first: name.ports.first,
                last: name.ports.last,
            }
        },
        proto: match name.proto {
            Proto::Tcp => Protocol::Tcp,
            Proto::Udp => Protocol::Udp,
        },
    }
}

fn health_of(h: Health) -> BackendHealth {
    match h {
        Health::Healthy => BackendHealth::Healthy,
        Health::Draining => BackendHealth::Draining,
        Health::Down => BackendHealth::Down,
    }
}

/// A VIP's source as the API shows it: the kind alone for the file (its
/// path is in the configuration, and the same on every VIP), the kind and
/// object for the others (`service ns/name`), `unclaimed` for an adopted
/// VIP no source has named yet.
fn source_of(owner: Option<&Owner>) -> String {
    match owner {
        None => "unclaimed".to_string(),
        Some(o) if o.source == SourceKind::File => o.source.to_string(),
        Some(o) => o.to_string(),
    }
}

fn source_info(kind: SourceKind, s: &SourceStatus) -> SourceInfo {
    SourceInfo {
        kind: kind.to_string(),
        synced: s.synced,
        objects: s.objects as u64,
        updates_ok: s.updates_ok,
        updates_failed: s.updates_failed,
        last_at: s.last_at,
        last_error: s.last_error.clone(),
    }
}

fn watch_info(w: &WatchState) -> WatchInfo {
    WatchInfo {
        resource: w.resource.to_string(),
        synced: w.synced,
        objects: w.objects as u64,
        errors: w.errors,
        last_error: w.last_error.clone(),
        last_error_at: w.last_error_at,
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl DaemonApi {
    fn vip_stats(&self, svc_id: u32) -> rv_vip_stats {
        let per_cpu: Vec<rv_vip_stats> =
            self.maps.stats_map.get_percpu(&svc_id).unwrap_or_default();
        per_cpu.iter().fold(rv_vip_stats::default(), |mut a, s| {
            a.packets += s.packets;
            a.bytes += s.bytes;
            a.rate_limited += s.rate_limited;
            a.no_backend += s.no_backend;
            a
        })
    }

    /// Packets the VIP's source ranges kept out, summed over the CPUs.
    fn source_refused(&self, svc_id: u32) -> u64 {
        let per_cpu: Vec<rv_source_refused> = self
            .maps
            .source_refused_map
            .get_percpu(&svc_id)
            .unwrap_or_default();
        per_cpu.iter().map(|s| s.packets).sum()
    }

    /// A VIP's full-NAT drops, summed over the CPUs.
    fn fullnat_stats(&self, svc_id: u32) -> rv_fullnat_stats {
        let per_cpu: Vec<rv_fullnat_stats> = self
            .maps
            .fullnat_stats_map
            .get_percpu(&svc_id)
            .unwrap_or_default();
        per_cpu
            .iter()
            .fold(rv_fullnat_stats::default(), |mut a, s| {
                a.ports_exhausted += s.ports_exhausted;
                a.table_full += s.table_full;
                a
            })
    }

    fn vip_infos(&self, st: &DataplaneStatus) -> Vec<VipInfo> {
        st.vips
            .iter()
            .map(|v| {
                let key = v.key;
                let c = self.vip_stats(v.svc_id);
                let f = self.fullnat_stats(v.svc_id);
                let (first, last) = key.ports.bounds();
                VipInfo {
                    vip: key.to_string(),
                    addr: key.addr,
                    ports: ApiPorts { first, last },
                    proto: match key.proto {
                        Protocol::Tcp => Proto::Tcp,
                        Protocol::Udp => Proto::Udp,
                    },
                    mode: vip_mode(v.mode),
                    affinity: match v.affinity {
                        Affinity::None => ApiAffinity::None,
                        Affinity::ClientIp { .. } => ApiAffinity::ClientIp,
                    },
                    service_id: v.svc_id,
                    slice_start: v.slice.start,
                    slice_len: v.slice.len,
                    backends: v
                        .backends
                        .iter()
                        .map(|b| VipBackend {
                            target: SocketAddr::new(b.target.addr, b.service_port),
                            backend_id: b.backend_id,
                            weight: b.weight,
                            health: health_of(b.health),
                            drained: b.drained,
                            mode: Some(vip_mode(b.mode)),
                            node: b.node.clone(),
                        })
                        .collect(),
                    packets: c.packets,
                    bytes: c.bytes,
                    rate_limited: c.rate_limited,
                    no_backend: c.no_backend,
                    fullnat_ports_exhausted: f.ports_exhausted,
                    fullnat_table_full: f.table_full,
                    source: source_of(v.owner.as_ref()),
                    source_ranges: v
                        .source_ranges
                        .as_ref()
                        .map(|l| l.iter().map(ToString::to_string).collect()),
                    source_refused: self.source_refused(v.svc_id),
                    slice_precision: v.slice_need.map_or_else(Default::default, |n| {
                        SlicePrecision {
                            needed: n.need,
                            wanted: n.want,
                            reduced: v.reduced_precision(),
                        }
                    }),
                }
            })
            .collect()
    }

    fn backend_infos(st: &DataplaneStatus) -> Vec<BackendInfo> {
        let mut by_target: BTreeMap<SocketAddr, BackendInfo> = BTreeMap::new();
        for v in &st.vips {
            for b in &v.backends {
                let at = SocketAddr::new(b.target.addr, b.service_port);
                let probe = match b.probe {
                    ProbeStatus::Disabled => ProbeState::Disabled,
                    ProbeStatus::Unknown => ProbeState::Unknown,
                    ProbeStatus::Is(HealthState::Healthy) => ProbeState::Healthy,
                    ProbeStatus::Is(HealthState::Down) => ProbeState::Down,
                };
                let e = by_target.entry(at).or_insert_with(|| BackendInfo {
                    target: at,
                    backend_id: b.backend_id,
                    health: health_of(b.health),
                    probe,
                    drained_by_operator: false,
                    vips: Vec::new(),
                });
                // Down if any VIP's probe says so; drained if any drain
                // names it.
                if probe == ProbeState::Down {
                    e.probe = ProbeState::Down;
                }
                e.drained_by_operator |= b.drained;
                e.vips.push(v.key.to_string());
            }
        }
        by_target.into_values().collect()
    }

    fn file_status(st: &DataplaneStatus) -> SourceStatus {
        st.sources
            .get(&SourceKind::File)
            .cloned()
            .unwrap_or_default()
    }

    async fn drain_common(
        &self,
        spec: &DrainSpec,
        drain: bool,
    ) -> Result<DrainOutcome, ApiRequestError> {
        let (reply, answer) = oneshot::channel();
        self.reconciler
            .lock()
            .map_err(|_| internal("reconciler channel lock poisoned"))?
            .send(Command::Drain {
                target: spec.target,
                vip: spec.vip.as_ref().map(key_of),
                drain,
                reply,
            })
            .map_err(|_| internal("rivorad is shutting down"))?;
        let done = answer
            .await
            .map_err(|_| internal("rivorad is shutting down"))?
            .map_err(|e| match e {
                DrainError::UnknownVip { vip } => ApiRequestError::UnknownVip {
                    vip: vip.to_string(),
                },
                DrainError::UnknownBackend { target } => ApiRequestError::UnknownBackend { target },
                DrainError::BackendNotInVip { target, vip } => ApiRequestError::BackendNotInVip {
                    target,
                    vip: vip.to_string(),
                },
                other => internal(other),
            })?;
        Ok(DrainOutcome {
            target: spec.target,
            vips: done.vips.iter().map(|k| k.to_string()).collect(),
            changed: done.changed,
        })
    }
}

impl ApiState for DaemonApi {
    async fn status(&self) -> Result<Status, ApiRequestError> {
        let apply_in_progress = self.status.applying();
        let st = self.status.current();
        let file = Self::file_status(&st);
        let backends: BTreeSet<_> = st
            .vips
            .iter()
            .flat_map(|v| v.backends.iter().map(|b| b.target))
            .collect();
        Ok(Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_generation: file.updates_ok,
            last_reload: ReloadResult {
                ok: file.last_error.is_none(),
                at: file.last_at,
                error: file.last_error.clone(),
                warnings: self.file.pending_restart(),
            },
            interfaces: st
                .interfaces
                .iter()
                .map(|a| InterfaceStatus {
                    name: a.name.clone(),
                    ifindex: a.ifindex,
                    xdp_mode: match a.xdp_mode {
                        Some(XdpMode::Generic) => ApiXdpMode::Generic,
                        _ => ApiXdpMode::Native,
                    },
                    tc_attached: true,
                })
                .collect(),
            // `vips` lists unclaimed VIPs too; `unclaimed` also counts
            // the leftovers it cannot list.
            vip_count: (st.vips.iter().filter(|v| v.owner.is_some()).count() + st.unclaimed) as u64,
            backend_count: backends.len() as u64,
            maglev_size: st.capacities.maglev_size,
            flow_table_size: st.capacities.flow_table_size,
            flow_table_per_cpu: st.capacities.flow_table_per_cpu,
            apply_in_progress,
            unclaimed_vips: st.unclaimed as u64,
            conflicts: st.conflicts.iter().map(|c| c.to_string()).collect(),
            failed_vips: st.failed.iter().map(|(k, e)| format!("{k}: {e}")).collect(),
            sources: st
                .sources
                .iter()
                .map(|(kind, s)| source_info(*kind, s))
                .collect(),
            watches: self
                .watches
                .as_ref()
                .map(|w| w.borrow().iter().map(watch_info).collect())
                .unwrap_or_default(),
            l2: self.l2.as_ref().map(|s| l2_info(&s.borrow())),
        })
    }

    async fn vips(&self) -> Result<Vec<VipInfo>, ApiRequestError> {
        Ok(self.vip_infos(&self.status.current()))
    }

    async fn vip(&self, name: &VipName) -> Result<Option<VipInfo>, ApiRequestError> {
        let want = key_of(name).to_string();
        Ok(self
            .vip_infos(&self.status.current())
            .into_iter()
            .find(|v| v.vip == want))
    }

    async fn backends(&self) -> Result<Vec<BackendInfo>, ApiRequestError> {
        Ok(Self::backend_infos(&self.status.current()))
    }

    async fn drops(&self) -> Result<Drops, ApiRequestError> {
        let mut by_reason = BTreeMap::new();
        for r in abi::DROP_REASONS.iter().skip(1) {
            let per_cpu: Vec<rv_drop_stats> = self
                .maps
                .drop_stats_map
                .get_percpu(&r.0)
                .map_err(internal)?;
            let label = abi::drop_reason_label(*r).unwrap_or("unknown");
            by_reason.insert(label.to_string(), per_cpu.iter().map(|s| s.packets).sum());
        }
        let rate_limited_by_vip = self
            .status
            .current()
            .vips
            .iter()
            .map(|v| (v.key.to_string(), self.vip_stats(v.svc_id).rate_limited))
            .collect();
        Ok(Drops {
            by_reason,
            rate_limited_by_vip,
        })
    }

    async fn drain(&self, spec: &DrainSpec) -> Result<DrainOutcome, ApiRequestError> {
        self.drain_common(spec, true).await
    }

    async fn undrain(&self, spec: &DrainSpec) -> Result<DrainOutcome, ApiRequestError> {
        self.drain_common(spec, false).await
    }

    async fn reload(&self) -> Result<ReloadResult, ApiRequestError> {
        match self.file.reload().await {
            Ok(warnings) => Ok(ReloadResult {
                ok: true,
                at: Self::file_status(&self.status.current())
                    .last_at
                    .max(now_secs()),
                error: None,
                warnings,
            }),
            Err(e @ (ReloadError::Invalid(_) | ReloadError::NotNodeOnly(_))) => {
                Err(ApiRequestError::ConfigInvalid {
                    error: e.to_string(),
                })
            }
            Err(e) => Err(internal(e)),
        }
    }

    async fn bgp_peers(&self) -> Result<Vec<crate::api::BgpPeerInfo>, ApiRequestError> {
        Ok(self
            .bgp
            .as_ref()
            .map(|b| b.status().iter().map(bgp_peer_info).collect())
            .unwrap_or_default())
    }

    async fn bgp_routes(&self) -> Result<Vec<crate::api::BgpRouteInfo>, ApiRequestError> {
        let Some(b) = &self.bgp else {
            return Ok(Vec::new());
        };
        let peers = b.status();
        Ok(b.routes()
            .iter()
            .map(|r| crate::api::BgpRouteInfo {
                prefix: r.prefix.to_string(),
                communities: r
                    .attrs
                    .communities
                    .iter()
                    .map(|c| format!("{}:{}", c >> 16, c & 0xffff))
                    .collect(),
                large_communities: r
                    .attrs
                    .large_communities
                    .iter()
                    .map(|(a, b, c)| format!("{a}:{b}:{c}"))
                    .collect(),
                local_pref: r.attrs.local_pref,
                med: r.attrs.med,
                peers: peers
                    .iter()
                    .filter(|p| p.advertised.contains(&r.prefix))
                    .map(|p| p.address.to_string())
                    .collect(),
            })
            .collect())
    }

    async fn metrics(&self) -> Result<String, ApiRequestError> {
        let drops = self.drops().await?.by_reason;
        let st = self.status.current();
        let file = Self::file_status(&st);
        let snap = MetricsSnapshot {
            version: env!("CARGO_PKG_VERSION").to_string(),
            vips: self
                .vip_infos(&st)
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
            backends: Self::backend_infos(&st)
                .iter()
                .map(|b| BackendHealthSample {
                    backend: b.target.to_string(),
                    state: b.health,
                })
                .collect(),
            drops,
            // The start's apply is not a reload.
            reloads_success: file.updates_ok.saturating_sub(1),
            reloads_failure: file.updates_failed,
            vip_conflicts: st.conflicts.len() as u64,
            vips_not_applied: st.failed.len() as u64,
        };
        self.metrics.encode(snap).map_err(internal)
    }
}

/// A BGP session as the API shows it.
pub fn bgp_peer_info(p: &rivora_bgp::PeerStatus) -> crate::api::BgpPeerInfo {
    crate::api::BgpPeerInfo {
        name: p.name.clone(),
        address: p.address,
        asn: p.asn,
        state: p.state.to_string(),
        local_address: p.local_address,
        uptime_seconds: p.uptime().as_secs(),
        established_at: p
            .established_since
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
            .unwrap_or(0),
        flaps: p.flaps,
        updates_sent: p.updates_sent,
        updates_received: p.updates_received,
        hold_time: u32::from(p.hold_time),
        families: p.families.iter().map(|f| f.as_str().to_string()).collect(),
        graceful_restart: p.peer_graceful_restart,
        advertised: p.advertised.len() as u64,
        bfd_state: p.bfd.map(|b| b.state.as_str().to_string()),
        bfd_detect_ms: p.bfd.map(|b| b.detect_ms).unwrap_or(0),
        last_error: p.last_error.clone(),
    }
}

fn vip_mode(m: Mode) -> VipMode {
    match m {
        Mode::Nat => VipMode::Nat,
        Mode::Dsr => VipMode::Dsr,
        Mode::L3Dsr => VipMode::L3dsr,
        Mode::FullNat => VipMode::Fullnat,
    }
}
