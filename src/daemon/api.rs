//! The API as the daemon answers it: reads come from the daemon's state and
//! the pinned counters, writes go through the daemon (and so through the
//! map writer, under the one lock).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::abi::{self, rv_drop_stats, rv_vip_stats};
use crate::api::{
    Affinity as ApiAffinity, BackendHealth, BackendInfo, DrainOutcome, DrainSpec, Drops,
    InterfaceStatus, Ports as ApiPorts, ProbeState, Proto, ReloadResult, Status, VipBackend,
    VipInfo, VipMode, VipName, XdpMode as ApiXdpMode,
};
use crate::api::{ApiRequestError, ApiState};
use crate::daemon::{Daemon, DaemonError};
use crate::dataplane::render::Health;
use crate::dataplane::{Maps, XdpMode};
use crate::metrics::{BackendHealthSample, Metrics, MetricsSnapshot, VipCounters};
use crate::model::{Affinity, BackendTarget, Mode, Ports, Protocol, VipKey};

pub struct DaemonApi {
    pub daemon: Arc<Mutex<Daemon>>,
    /// Read-only view of the pinned counters.
    pub maps: Maps,
    /// Also fed by the health checker's observer (probe latencies).
    pub metrics: Arc<Metrics>,
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

fn health_of(h: Option<Health>) -> BackendHealth {
    match h {
        Some(Health::Draining) => BackendHealth::Draining,
        Some(Health::Down) => BackendHealth::Down,
        _ => BackendHealth::Healthy,
    }
}

/// The probe port of a backend with port 0 is the VIP's.
fn service_port(key: &VipKey, port: u16) -> u16 {
    if port != 0 {
        return port;
    }
    match key.ports {
        Ports::One(p) => p,
        Ports::Range { first, .. } => first,
    }
}

impl DaemonApi {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Daemon>, ApiRequestError> {
        self.daemon
            .lock()
            .map_err(|_| internal("daemon state lock poisoned"))
    }

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

    fn vip_infos(&self, d: &Daemon) -> Vec<VipInfo> {
        let specs: BTreeMap<VipKey, crate::model::Vip> =
            d.writer.specs().into_iter().map(|v| (v.key(), v)).collect();
        let mut out = Vec::new();
        for info in d.writer.vips() {
            let Some(key) = info.key else { continue };
            let Some(spec) = specs.get(&key) else {
                continue;
            };
            let st = self.vip_stats(info.svc_id);
            let (first, last) = key.ports.bounds();
            out.push(VipInfo {
                vip: key.to_string(),
                addr: key.addr,
                ports: ApiPorts { first, last },
                proto: match key.proto {
                    Protocol::Tcp => Proto::Tcp,
                    Protocol::Udp => Proto::Udp,
                },
                mode: match spec.mode {
                    Mode::Nat => VipMode::Nat,
                    Mode::Dsr => VipMode::Dsr,
                    Mode::L3Dsr => VipMode::L3dsr,
                },
                affinity: match spec.affinity {
                    Affinity::None => ApiAffinity::None,
                    Affinity::ClientIp { .. } => ApiAffinity::ClientIp,
                },
                service_id: info.svc_id,
                slice_start: info.slice.start,
                slice_len: info.slice.len,
                backends: spec
                    .backends
                    .iter()
                    .zip(info.backend_ids.iter())
                    .map(|(b, id)| {
                        let t = BackendTarget {
                            addr: b.addr,
                            port: b.port,
                        };
                        VipBackend {
                            target: SocketAddr::new(b.addr, service_port(&key, b.port)),
                            backend_id: *id,
                            weight: b.weight,
                            health: health_of(d.writer.health(&t)),
                            drained: d.drains.contains(&(None, t))
                                || d.drains.contains(&(Some(key), t)),
                        }
                    })
                    .collect(),
                packets: st.packets,
                bytes: st.bytes,
                rate_limited: st.rate_limited,
                no_backend: st.no_backend,
            });
        }
        out
    }

    fn backend_infos(&self, d: &Daemon) -> Vec<BackendInfo> {
        let mut by_target: BTreeMap<SocketAddr, BackendInfo> = BTreeMap::new();
        for v in self.vip_infos(d) {
            let key = key_of(&v.vip.parse().unwrap_or(VipName {
                proto: v.proto,
                addr: v.addr,
                ports: v.ports,
            }));
            for b in v.backends {
                let model_port = d
                    .config
                    .desired
                    .vips
                    .iter()
                    .find(|x| x.key() == key)
                    .and_then(|x| {
                        x.backends.iter().find(|y| {
                            y.addr == b.target.ip() && service_port(&key, y.port) == b.target.port()
                        })
                    })
                    .map(|y| y.port)
                    .unwrap_or(b.target.port());
                let t = BackendTarget {
                    addr: b.target.ip(),
                    port: model_port,
                };
                let probe = match d.config.health.get(&(key, b.target)) {
                    Some(None) | None => ProbeState::Disabled,
                    Some(Some(_)) => match d.checker.state(&(key, t)) {
                        Some(crate::healthcheck::HealthState::Healthy) => ProbeState::Healthy,
                        Some(crate::healthcheck::HealthState::Down) => ProbeState::Down,
                        None => ProbeState::Unknown,
                    },
                };
                let e = by_target.entry(b.target).or_insert_with(|| BackendInfo {
                    target: b.target,
                    backend_id: b.backend_id,
                    health: b.health,
                    probe,
                    drained_by_operator: d.drains.iter().any(|(_, dt)| *dt == t),
                    vips: Vec::new(),
                });
                if probe == ProbeState::Down {
                    e.probe = ProbeState::Down;
                }
                e.vips.push(v.vip.clone());
            }
        }
        by_target.into_values().collect()
    }

    /// The dataplane target for an API target (addr:port where the port
    /// may be the VIP's own for a backend configured without one).
    fn resolve_target(
        d: &Daemon,
        target: SocketAddr,
        vip: Option<&VipKey>,
    ) -> Vec<(VipKey, BackendTarget)> {
        let mut out = Vec::new();
        for v in &d.config.desired.vips {
            let key = v.key();
            if vip.is_some_and(|k| *k != key) {
                continue;
            }
            for b in &v.backends {
                if b.addr == target.ip() && service_port(&key, b.port) == target.port() {
                    out.push((
                        key,
                        BackendTarget {
                            addr: b.addr,
                            port: b.port,
                        },
                    ));
                }
            }
        }
        out
    }

    fn drain_common(&self, spec: &DrainSpec, drain: bool) -> Result<DrainOutcome, ApiRequestError> {
        let mut d = self.lock()?;
        let vip = spec.vip.as_ref().map(key_of);
        if let Some(k) = &vip {
            if !d.config.desired.vips.iter().any(|v| v.key() == *k) {
                return Err(ApiRequestError::UnknownVip { vip: k.to_string() });
            }
        }
        let matches = Self::resolve_target(&d, spec.target, vip.as_ref());
        if matches.is_empty() {
            return Err(
                match (&vip, Self::resolve_target(&d, spec.target, None).is_empty()) {
                    (Some(k), false) => ApiRequestError::BackendNotInVip {
                        target: spec.target,
                        vip: k.to_string(),
                    },
                    _ => ApiRequestError::UnknownBackend {
                        target: spec.target,
                    },
                },
            );
        }
        let target = matches[0].1;
        let before = d.drains.contains(&(vip, target));
        d.set_drain(target, vip, drain).map_err(|e| match e {
            DaemonError::Config(c) => ApiRequestError::ConfigInvalid {
                error: c.to_string(),
            },
            other => internal(other),
        })?;
        Ok(DrainOutcome {
            target: spec.target,
            vips: matches.iter().map(|(k, _)| k.to_string()).collect(),
            changed: before != drain,
        })
    }
}

impl ApiState for DaemonApi {
    async fn status(&self) -> Result<Status, ApiRequestError> {
        let d = self.lock()?;
        let backends: std::collections::BTreeSet<_> = d
            .config
            .desired
            .vips
            .iter()
            .flat_map(|v| v.backends.iter().map(|b| (b.addr, b.port)))
            .collect();
        Ok(Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_generation: d.generation,
            last_reload: ReloadResult {
                ok: d.last_reload.ok,
                at: d.last_reload.at,
                error: d.last_reload.error.clone(),
            },
            interfaces: d
                .attached
                .iter()
                .map(|a| InterfaceStatus {
                    name: a.name.clone(),
                    ifindex: a.ifindex,
                    xdp_mode: match a.xdp.xdp_mode {
                        Some(XdpMode::Generic) => ApiXdpMode::Generic,
                        _ => ApiXdpMode::Native,
                    },
                    tc_attached: true,
                })
                .collect(),
            vip_count: d.writer.vips().len() as u64,
            backend_count: backends.len() as u64,
            maglev_size: d.dp.maglev_size(),
            flow_table_size: d.dp.flow_table_size(),
            // Shown, not relied on: a failed read of the possible CPUs
            // is not worth failing the status call for.
            flow_table_per_cpu: d.dp.flow_table_per_cpu().unwrap_or(0),
        })
    }

    async fn vips(&self) -> Result<Vec<VipInfo>, ApiRequestError> {
        let d = self.lock()?;
        Ok(self.vip_infos(&d))
    }

    async fn vip(&self, name: &VipName) -> Result<Option<VipInfo>, ApiRequestError> {
        let d = self.lock()?;
        let want = key_of(name).to_string();
        Ok(self.vip_infos(&d).into_iter().find(|v| v.vip == want))
    }

    async fn backends(&self) -> Result<Vec<BackendInfo>, ApiRequestError> {
        let d = self.lock()?;
        Ok(self.backend_infos(&d))
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
        let d = self.lock()?;
        let rate_limited_by_vip = self
            .vip_infos(&d)
            .into_iter()
            .map(|v| (v.vip, v.rate_limited))
            .collect();
        Ok(Drops {
            by_reason,
            rate_limited_by_vip,
        })
    }

    async fn drain(&self, spec: &DrainSpec) -> Result<DrainOutcome, ApiRequestError> {
        self.drain_common(spec, true)
    }

    async fn undrain(&self, spec: &DrainSpec) -> Result<DrainOutcome, ApiRequestError> {
        self.drain_common(spec, false)
    }

    async fn reload(&self) -> Result<ReloadResult, ApiRequestError> {
        let mut d = self.lock()?;
        match d.reload() {
            Ok(_) => Ok(ReloadResult {
                ok: true,
                at: d.last_reload.at,
                error: None,
            }),
            Err(e @ DaemonError::Config(_)) => Err(ApiRequestError::ConfigInvalid {
                error: e.to_string(),
            }),
            Err(e) => Err(internal(e)),
        }
    }

    async fn metrics(&self) -> Result<String, ApiRequestError> {
        let drops = self.drops().await?.by_reason;
        let (vips, backends, reloads_success, reloads_failure) = {
            let d = self.lock()?;
            (
                self.vip_infos(&d),
                self.backend_infos(&d),
                d.reloads_ok,
                d.reloads_failed,
            )
        };
        let snap = MetricsSnapshot {
            version: env!("CARGO_PKG_VERSION").to_string(),
            vips: vips
                .iter()
                .map(|v| VipCounters {
                    vip: v.vip.clone(),
                    packets: v.packets,
                    bytes: v.bytes,
                    rate_limited_syns: v.rate_limited,
                    no_healthy_backend_drops: v.no_backend,
                })
                .collect(),
            backends: backends
                .iter()
                .map(|b| BackendHealthSample {
                    backend: b.target.to_string(),
                    state: b.health,
                })
                .collect(),
            drops,
            reloads_success,
            reloads_failure,
        };
        self.metrics.encode(snap).map_err(internal)
    }
}
