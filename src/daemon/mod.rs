//! rivorad's core: the one owner of the dataplane on a node. Sources (the
//! static file here) produce desired state; this applies it through the
//! map writer, attaches the programs, runs the health checker and answers
//! the API. Every change goes through one `Daemon` behind one lock, so map
//! writes never interleave.

pub mod api;
pub mod net;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{error, info, warn};

use crate::config::{self, Config, ConfigError};
use crate::dataplane::{
    AttachPoint, AttachedLink, Datapath, DataplaneError, LoadOptions, Probe, ReconcileReport,
    Writer, XdpMode,
};
use crate::healthcheck::{HealthChecker, HealthEvent, HealthState, ProbeTarget};
use crate::model::{BackendTarget, DesiredState, Mode, VipKey};

/// A probe is one (VIP, backend) pair: a backend shared by VIPs on
/// different ports is probed on each.
pub type ProbeKey = (VipKey, BackendTarget);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error(transparent)]
    Net(#[from] net::NetError),
    #[error("health checker: {0}")]
    Health(String),
    #[error("{vips} VIP(s) could not be applied: {detail}")]
    Apply { vips: usize, detail: String },
}

#[derive(Debug, Clone)]
pub struct Options {
    pub config: PathBuf,
    pub pin_dir: PathBuf,
    /// Pin the XDP and TCX links so the datapath outlives rivorad.
    pub persist_datapath: bool,
    pub maglev_size: u32,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadStatus {
    pub ok: bool,
    /// Unix seconds.
    pub at: u64,
    pub error: Option<String>,
}

/// One attached interface.
pub struct Attached {
    pub name: String,
    pub ifindex: u32,
    pub xdp: AttachedLink,
    pub tc: AttachedLink,
}

pub struct Daemon {
    pub opts: Options,
    pub config: Config,
    pub dp: Datapath,
    pub writer: Writer,
    pub attached: Vec<Attached>,
    pub checker: HealthChecker<ProbeKey>,
    pub generation: u64,
    pub last_reload: ReloadStatus,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// Operator drains: a backend everywhere (None) or for one VIP.
    pub drains: BTreeSet<(Option<VipKey>, BackendTarget)>,
    /// Probes that currently say down, by backend.
    probe_down: BTreeMap<BackendTarget, BTreeSet<VipKey>>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The probe targets a configuration asks for.
fn probe_targets(cfg: &Config, writer: &Writer) -> Vec<ProbeTarget<ProbeKey>> {
    let mut out = Vec::new();
    for ((vip, addr), spec) in &cfg.health {
        let Some(spec) = spec else { continue };
        let Some(target) = backend_target(cfg, vip, *addr) else {
            continue;
        };
        // A backend the pinned maps say is down stays down until a probe
        // says otherwise (restarts must not resurrect it).
        let initial = match writer.health(&target) {
            Some(crate::dataplane::render::Health::Down) => HealthState::Down,
            _ => HealthState::Healthy,
        };
        out.push(ProbeTarget {
            key: (*vip, target),
            addr: *addr,
            spec: spec.clone(),
            initial,
        });
    }
    out
}

/// The dataplane identity of the backend probed at `addr` for `vip`.
fn backend_target(cfg: &Config, vip: &VipKey, addr: SocketAddr) -> Option<BackendTarget> {
    let v = cfg.desired.vips.iter().find(|v| v.key() == *vip)?;
    let b = v
        .backends
        .iter()
        .find(|b| b.addr == addr.ip() && (b.port == addr.port() || b.port == 0))?;
    Some(BackendTarget {
        addr: b.addr,
        port: b.port,
    })
}

impl Daemon {
    /// Load the configuration (an invalid file is an error, nothing is
    /// touched), the BPF objects and the pinned maps (adopting what they
    /// hold), apply the file, attach, and start probing.
    pub fn start(
        opts: Options,
        runtime: tokio::runtime::Handle,
        observer: crate::healthcheck::Observer<ProbeKey>,
    ) -> Result<
        (
            Self,
            tokio::sync::mpsc::UnboundedReceiver<HealthEvent<ProbeKey>>,
        ),
        DaemonError,
    > {
        let cfg = config::load(&opts.config)?;
        let dp = Datapath::load(&LoadOptions {
            pin_dir: opts.pin_dir.clone(),
            maglev_size: opts.maglev_size,
        })?;
        let writer = Writer::open_pinned(&opts.pin_dir)?;
        let adopted = writer.vips().len();
        let (checker, events) = HealthChecker::with_observer(runtime, observer);
        let mut d = Self {
            opts,
            config: cfg.clone(),
            dp,
            writer,
            attached: Vec::new(),
            checker,
            generation: 0,
            last_reload: ReloadStatus {
                ok: true,
                at: now_secs(),
                error: None,
            },
            reloads_ok: 0,
            reloads_failed: 0,
            drains: BTreeSet::new(),
            probe_down: BTreeMap::new(),
        };
        info!(adopted, file = %d.opts.config.display(), "adopted pinned maps");
        let report = d.apply(&cfg)?;
        d.generation = 1;
        info!(
            created = report.created,
            updated = report.updated,
            unchanged = report.unchanged,
            removed = report.removed,
            "configuration applied"
        );
        d.attach()?;
        Ok((d, events))
    }

    /// Desired state for `cfg` with this node's facts filled in: the
    /// interfaces' MACs, DSR backends' MACs from the neighbour table, and
    /// operator drains for one VIP as weight 0 (no new flows for that VIP,
    /// established ones continue through the affinity table).
    fn desired(&self, cfg: &Config) -> Result<DesiredState, DaemonError> {
        let mut d = cfg.desired.clone();
        for ifc in &cfg.file.interfaces {
            let (ifindex, mac) = net::interface(&ifc.name)?;
            d.node.interface_macs.insert(ifindex, mac);
        }
        for v in &mut d.vips {
            let key = v.key();
            for b in &mut v.backends {
                if v.mode == Mode::Dsr && b.mac.is_none() {
                    b.mac = Some(net::resolve_mac(b.addr, Duration::from_secs(1))?);
                }
                if self.drains.contains(&(
                    Some(key),
                    BackendTarget {
                        addr: b.addr,
                        port: b.port,
                    },
                )) {
                    b.weight = 0;
                }
            }
        }
        d.validate().map_err(|e| {
            DaemonError::Config(ConfigError {
                file: cfg.path.clone(),
                line: None,
                field: None,
                message: e.to_string(),
            })
        })?;
        Ok(d)
    }

    /// Make the maps hold `cfg`: the file is the whole desired set, so
    /// VIPs it does not list (adopted or not) are removed.
    fn apply(&mut self, cfg: &Config) -> Result<ReconcileReport, DaemonError> {
        let desired = self.desired(cfg)?;
        self.writer.set_node(&desired.node)?;
        let report = self.writer.reconcile(&desired)?;
        // Adopted VIPs the file no longer lists were removed by reconcile;
        // any adopted leftover it could not name goes too.
        let pruned = self.writer.prune_unclaimed()?;
        if !pruned.is_empty() {
            info!(
                count = pruned.len(),
                "pruned adopted VIPs the file does not list"
            );
        }
        if cfg.desired.vips.iter().any(|v| v.mode == Mode::L3Dsr) {
            // A tunnelled packet the FIB cannot send yet (no neighbour
            // entry) goes to the kernel with our own address as source:
            // accept_local keeps it from being dropped as martian.
            for ifc in &cfg.file.interfaces {
                if let Err(e) =
                    net::sysctl(&["net", "ipv4", "conf", &ifc.name, "accept_local"], "1")
                {
                    warn!(interface = %ifc.name, error = %e, "cannot set accept_local for L3 DSR");
                }
            }
        }
        let targets = probe_targets(cfg, &self.writer);
        self.checker
            .set_targets(targets)
            .map_err(|e| DaemonError::Health(e.to_string()))?;
        // Probes that no longer exist no longer hold a backend down.
        let live: BTreeSet<ProbeKey> = self.checker.status().into_iter().map(|s| s.key).collect();
        let stale: Vec<(BackendTarget, VipKey)> = self
            .probe_down
            .iter()
            .flat_map(|(t, vips)| vips.iter().map(move |v| (*t, *v)))
            .filter(|(t, v)| !live.contains(&(*v, *t)))
            .collect();
        for (t, v) in stale {
            self.set_probe(&(v, t), true)?;
        }
        if !report.failed.is_empty() {
            for (vip, e) in &report.failed {
                error!(%vip, error = %e, "VIP not applied; its previous state (if any) keeps forwarding");
            }
            let detail = report
                .failed
                .iter()
                .map(|(v, e)| format!("{v}: {e}"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(DaemonError::Apply {
                vips: report.failed.len(),
                detail,
            });
        }
        Ok(report)
    }

    fn attach(&mut self) -> Result<(), DaemonError> {
        for ifc in self.config.file.interfaces.clone() {
            let (ifindex, _) = net::interface(&ifc.name)?;
            let (xdp, tc) = self.attach_one(&ifc.name, ifindex, ifc.xdp_mode)?;
            info!(interface = %ifc.name, ifindex, xdp = ?xdp.xdp_mode, "attached");
            self.attached.push(Attached {
                name: ifc.name.clone(),
                ifindex,
                xdp,
                tc,
            });
        }
        Ok(())
    }

    fn link_pin(&self, name: &str, kind: &str) -> PathBuf {
        self.opts
            .pin_dir
            .join("links")
            .join(format!("{kind}_{name}"))
    }

    /// Attach to one interface, or with -persist-datapath take over the
    /// pinned links and swap the program behind them (no gap).
    fn attach_one(
        &self,
        name: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(AttachedLink, AttachedLink), DaemonError> {
        let xdp_prog = &self.dp.xdp().progs.xdp_ingress;
        let tc_prog = &self.dp.tc().progs.tc_nat;
        if self.opts.persist_datapath {
            let xp = self.link_pin(name, "xdp");
            let tp = self.link_pin(name, "tcx");
            if xp.exists() && tp.exists() {
                let xdp = AttachedLink::open_pinned(&xp, AttachPoint::Xdp, ifindex)?;
                let tc = AttachedLink::open_pinned(&tp, AttachPoint::TcxEgress, ifindex)?;
                xdp.update(xdp_prog)?;
                tc.update(tc_prog)?;
                info!(interface = name, "took over pinned links (program swapped)");
                return Ok((xdp, tc));
            }
        }
        let xdp = AttachedLink::attach_xdp(xdp_prog, ifindex, mode)?;
        let tc = AttachedLink::attach_tcx_egress(tc_prog, ifindex)?;
        if self.opts.persist_datapath {
            let _ = std::fs::create_dir_all(self.opts.pin_dir.join("links"));
            xdp.pin(&self.link_pin(name, "xdp"))?;
            tc.pin(&self.link_pin(name, "tcx"))?;
        }
        Ok((xdp, tc))
    }

    /// Re-read the file. An invalid file changes nothing (the running state
    /// keeps forwarding) and is counted and reported.
    pub fn reload(&mut self) -> Result<ReconcileReport, DaemonError> {
        let result = config::load(&self.opts.config)
            .map_err(DaemonError::from)
            .and_then(|cfg| {
                if cfg.file.interfaces.iter().map(|i| &i.name).ne(self
                    .config
                    .file
                    .interfaces
                    .iter()
                    .map(|i| &i.name))
                {
                    warn!("interface changes take effect at the next restart");
                }
                let r = self.apply(&cfg)?;
                self.config = cfg;
                Ok(r)
            });
        match &result {
            Ok(r) => {
                self.generation += 1;
                self.reloads_ok += 1;
                self.last_reload = ReloadStatus {
                    ok: true,
                    at: now_secs(),
                    error: None,
                };
                info!(
                    generation = self.generation,
                    created = r.created,
                    updated = r.updated,
                    removed = r.removed,
                    "reloaded"
                );
            }
            Err(e) => {
                self.reloads_failed += 1;
                self.last_reload = ReloadStatus {
                    ok: false,
                    at: now_secs(),
                    error: Some(e.to_string()),
                };
                error!(error = %e, "reload failed; the running configuration stays");
            }
        }
        result
    }

    /// A probe's verdict. A backend is down while any of its probes says
    /// so; a failed probe wins over a drain (the writer's rule).
    pub fn on_health(&mut self, ev: &HealthEvent<ProbeKey>) -> Result<(), DaemonError> {
        let up = ev.state == HealthState::Healthy;
        info!(vip = %ev.key.0, backend = %ev.key.1, up, "health changed");
        self.set_probe(&ev.key, up)
    }

    fn set_probe(&mut self, key: &ProbeKey, up: bool) -> Result<(), DaemonError> {
        let (vip, target) = key;
        let downs = self.probe_down.entry(*target).or_default();
        if up {
            downs.remove(vip);
        } else {
            downs.insert(*vip);
        }
        let down = !downs.is_empty();
        if !down {
            self.probe_down.remove(target);
        }
        self.writer
            .set_health(target, if down { Probe::Down } else { Probe::Up })?;
        Ok(())
    }

    /// Drain (or undrain) a backend everywhere, or for one VIP.
    pub fn set_drain(
        &mut self,
        target: BackendTarget,
        vip: Option<VipKey>,
        drain: bool,
    ) -> Result<(), DaemonError> {
        let k = (vip, target);
        let changed = if drain {
            self.drains.insert(k)
        } else {
            self.drains.remove(&k)
        };
        if !changed {
            return Ok(());
        }
        match vip {
            None => {
                self.writer.set_drain(&target, drain)?;
            }
            Some(_) => {
                let cfg = self.config.clone();
                self.apply(&cfg)?;
            }
        }
        Ok(())
    }

    /// Detach (unless the links are pinned: then the datapath keeps
    /// forwarding without us). The maps stay pinned either way.
    pub fn shutdown(self) {
        if !self.opts.persist_datapath {
            for a in &self.attached {
                let _ = a.xdp.detach();
                let _ = a.tc.detach();
                info!(interface = %a.name, "detached");
            }
        }
    }

    pub fn config_path(&self) -> &Path {
        &self.opts.config
    }
}

/// Remove everything Rivora pinned under `pin_dir`: links first (which
/// detaches them), then the maps.
pub fn cleanup(pin_dir: &Path) -> std::io::Result<()> {
    let links = pin_dir.join("links");
    if let Ok(entries) = std::fs::read_dir(&links) {
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(l) = AttachedLink::open_pinned(&p, AttachPoint::Xdp, 0) {
                let _ = l.detach();
            }
        }
    }
    Datapath::unpin_all(pin_dir)
}
