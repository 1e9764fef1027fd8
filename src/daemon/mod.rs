//! rivorad's core: the one owner of the dataplane on a node. Sources (the
//! static file here) produce desired state; this applies it through the
//! map writer, attaches the programs, runs the health checker and answers
//! the API. Every change goes through one `Daemon` behind one lock, so map
//! writes never interleave.

pub mod api;
pub mod net;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{error, info, warn};

use crate::config::{self, Config, ConfigError};
use crate::dataplane::attach::xdp_attached_mode;
use crate::dataplane::{
    AttachPoint, AttachedLink, Datapath, DataplaneError, LoadOptions, Probe, ReconcileReport,
    Writer, XdpMode,
};
use crate::healthcheck::{HealthChecker, HealthEvent, HealthState, ProbeTarget};
use crate::model::{BackendTarget, DesiredState, Mode, VipKey};
use state::{DrainStore, Drains, StateError};

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
    #[error(transparent)]
    State(#[from] StateError),
}

#[derive(Debug, Clone)]
pub struct Options {
    pub config: PathBuf,
    pub pin_dir: PathBuf,
    /// Pin the XDP and TCX links so the datapath outlives rivorad.
    pub persist_datapath: bool,
    pub maglev_size: u32,
    /// Entries in each per-flow table (must match the pinned tables).
    pub flow_table_size: u32,
    /// Where the daemon keeps what the maps cannot say (operator drains).
    pub state_dir: PathBuf,
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
    pub drains: Drains,
    drain_store: DrainStore,
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
        let t0 = std::time::Instant::now();
        let load_opts = LoadOptions {
            pin_dir: opts.pin_dir.clone(),
            maglev_size: opts.maglev_size,
            flow_table_size: opts.flow_table_size,
        };
        let ms = |t: std::time::Instant| t.elapsed().as_millis() as u64;
        // A restart spends most of its time in the verifier (xdp_ingress),
        // so over existing pins, once the preflight has shown they fit
        // this binary, the objects load on one thread while this one
        // parses the file and adopts the maps (reading, and repairing
        // only what no VIP can reach). Loading over existing pins creates
        // and writes nothing. On a first start the file is checked first,
        // so that an invalid one pins nothing.
        let (cfg, config_ms, dp, load_ms, writer, adopt_ms) =
            if opts.pin_dir.join("meta_map").exists() {
                Datapath::preflight(&load_opts)?;
                std::thread::scope(|s| -> Result<_, DaemonError> {
                    let loader = s.spawn(|| {
                        let t = std::time::Instant::now();
                        Datapath::load(&load_opts).map(|d| (d, ms(t)))
                    });
                    // An early return here still joins the loader (the
                    // scope does).
                    let cfg = config::load(&opts.config)?;
                    let config_ms = ms(t0);
                    let t = std::time::Instant::now();
                    let writer = Writer::open_pinned(&opts.pin_dir)?;
                    let adopt_ms = ms(t);
                    let (dp, load_ms) = loader
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                    Ok((cfg, config_ms, dp, load_ms, writer, adopt_ms))
                })?
            } else {
                let cfg = config::load(&opts.config)?;
                let config_ms = ms(t0);
                let t = std::time::Instant::now();
                let dp = Datapath::load(&load_opts)?;
                let load_ms = ms(t);
                let t = std::time::Instant::now();
                let writer = Writer::open_pinned(&opts.pin_dir)?;
                (cfg, config_ms, dp, load_ms, writer, ms(t))
            };
        let mut writer = writer;
        let adopted = writer.vips().len();
        let drain_store = DrainStore::new(&opts.state_dir);
        let drains = match drain_store.load()? {
            Some(d) => d,
            None => {
                // No file yet (first start, or an upgrade from a binary
                // that kept none): backend_health_map's "draining" is an
                // operator drain for every VIP, the one kind it can state
                // unambiguously.
                let d: Drains = writer
                    .draining_targets()
                    .into_iter()
                    .map(|t| (None, t))
                    .collect();
                if !d.is_empty() {
                    info!(
                        count = d.len(),
                        "no drain file: took operator drains from backend_health_map"
                    );
                    drain_store.save(&d)?;
                }
                d
            }
        };
        // A target the maps hold as draining that no drain names any more
        // (undrained while a write was lost in a crash) is undrained: the
        // file, written before the maps, is the operator's last word.
        for t in writer.draining_targets() {
            if !drains.contains(&(None, t)) {
                writer.set_drain(&t, false)?;
            }
        }
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
            drains,
            drain_store,
            probe_down: BTreeMap::new(),
        };
        let flow_table_size = d.dp.flow_table_size();
        info!(
            adopted,
            drains = d.drains.len(),
            file = %d.opts.config.display(),
            flow_table_size,
            config_ms,
            load_ms,
            adopt_ms,
            "adopted pinned maps"
        );
        // Each CPU keeps only its share of every flow table: a node that
        // declares many possible CPUs (hot-pluggable ones count) can leave
        // each a share too thin for the flows one CPU handles.
        let per_cpu = d.dp.flow_table_per_cpu()?;
        if per_cpu < 1024 {
            warn!(
                flow_table_size,
                per_cpu, "each CPU keeps only {per_cpu} flows: consider a larger -flow-table-size"
            );
        }
        let t1 = std::time::Instant::now();
        let report = d.apply(&cfg)?;
        d.generation = 1;
        info!(
            created = report.created,
            updated = report.updated,
            unchanged = report.unchanged,
            removed = report.removed,
            apply_ms = t1.elapsed().as_millis() as u64,
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
        // Global drains again: a backend id this reconcile created for a
        // drained target starts healthy.
        for (vip, t) in &self.drains {
            if vip.is_none() {
                self.writer.set_drain(t, true)?;
            }
        }
        let targets = probe_targets(cfg, &self.writer);
        self.checker
            .set_targets(targets)
            .map_err(|e| DaemonError::Health(e.to_string()))?;
        // A probe that starts down (adopted as down from the maps) sends
        // no event until it changes: record it, or another VIP's probe of
        // the same backend coming up would mark it healthy too early.
        for st in self.checker.status() {
            if st.state == HealthState::Down {
                self.probe_down
                    .entry(st.key.1)
                    .or_default()
                    .insert(st.key.0);
            }
        }
        // A backend the maps hold as down that no probe watches any more
        // would stay down for ever: without a probe a backend is healthy.
        let probed: BTreeSet<BackendTarget> =
            self.checker.status().into_iter().map(|s| s.key.1).collect();
        for t in self.writer.down_targets() {
            if !probed.contains(&t) && !self.probe_down.contains_key(&t) {
                info!(backend = %t, "no probe watches this backend any more: healthy");
                self.writer.set_health(&t, Probe::Up)?;
            }
        }
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
        let listed: BTreeSet<String> = self
            .config
            .file
            .interfaces
            .iter()
            .map(|i| i.name.clone())
            .collect();
        self.drop_unlisted_links(&listed);
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

    fn link_pin(&self, name: &str, point: AttachPoint) -> PathBuf {
        let kind = match point {
            AttachPoint::Xdp => "xdp",
            AttachPoint::TcxEgress => "tcx",
        };
        self.opts
            .pin_dir
            .join("links")
            .join(format!("{kind}_{name}"))
    }

    /// Pinned links of interfaces the file no longer lists: the file is
    /// the whole desired set, so they are detached and unpinned.
    fn drop_unlisted_links(&self, listed: &BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(self.opts.pin_dir.join("links")) else {
            return;
        };
        for e in entries.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let ifname = file
                .strip_prefix("xdp_")
                .or_else(|| file.strip_prefix("tcx_"))
                .unwrap_or(&file);
            if listed.contains(ifname) {
                continue;
            }
            let p = e.path();
            if let Ok(l) = AttachedLink::open_pinned(&p, AttachPoint::Xdp, 0) {
                // A defunct link (its interface gone) cannot be detached
                // and needs not be.
                let _ = l.detach();
            }
            match std::fs::remove_file(&p) {
                Ok(()) => {
                    info!(pin = %p.display(), "detached a pinned link of an interface the file no longer lists")
                }
                Err(e) => warn!(pin = %p.display(), error = %e, "cannot remove a pinned link"),
            }
        }
    }

    /// Attach to one interface. Pinned links (left by a run with
    /// -persist-datapath) are taken over and their program swapped in
    /// place, so packets never see the interface without a program.
    fn attach_one(
        &self,
        name: &str,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(AttachedLink, AttachedLink), DaemonError> {
        let xdp = self.take_or_attach(name, ifindex, AttachPoint::Xdp, mode)?;
        // If this fails, a fresh (unpinned) XDP link detaches as `xdp` is
        // dropped; a pinned one keeps forwarding.
        let tc = self.take_or_attach(name, ifindex, AttachPoint::TcxEgress, mode)?;
        Ok((xdp, tc))
    }

    fn take_or_attach(
        &self,
        name: &str,
        ifindex: u32,
        point: AttachPoint,
        mode: XdpMode,
    ) -> Result<AttachedLink, DaemonError> {
        let pin = self.link_pin(name, point);
        if pin.exists() {
            match self.take_over(&pin, name, ifindex, point, mode)? {
                Some(link) => {
                    if !self.opts.persist_datapath {
                        // Unpinned, this process holds the link's last
                        // reference: it detaches when rivorad exits, as
                        // it must without -persist-datapath. Taking it
                        // over first (rather than detaching and attaching
                        // anew) leaves no gap now.
                        std::fs::remove_file(&pin).map_err(|e| {
                            DaemonError::Dataplane(DataplaneError::Attach {
                                what: format!("unpinning {}", pin.display()),
                                source: e,
                            })
                        })?;
                        info!(
                            interface = name,
                            ?point,
                            "took over a pinned link and unpinned it (no -persist-datapath)"
                        );
                    }
                    return Ok(link);
                }
                None => {
                    std::fs::remove_file(&pin).map_err(|e| {
                        DaemonError::Dataplane(DataplaneError::Attach {
                            what: format!("removing the stale pin {}", pin.display()),
                            source: e,
                        })
                    })?;
                }
            }
        }
        let link = match point {
            AttachPoint::Xdp => {
                AttachedLink::attach_xdp(&self.dp.xdp().progs.xdp_ingress, ifindex, mode)?
            }
            AttachPoint::TcxEgress => {
                AttachedLink::attach_tcx_egress(&self.dp.tc().progs.tc_nat, ifindex)?
            }
        };
        if self.opts.persist_datapath {
            let dir = self.opts.pin_dir.join("links");
            std::fs::create_dir_all(&dir).map_err(|e| {
                DaemonError::Dataplane(DataplaneError::Attach {
                    what: format!("creating {}", dir.display()),
                    source: e,
                })
            })?;
            link.pin(&pin)?;
        }
        Ok(link)
    }

    /// Take over the link pinned at `pin` and swap this binary's program
    /// in behind it. None when the pin is stale: the link is defunct (its
    /// interface went away, perhaps to come back under the same name with
    /// a new ifindex) or not the kind of link the name says; the caller
    /// then attaches anew.
    fn take_over(
        &self,
        pin: &Path,
        name: &str,
        ifindex: u32,
        point: AttachPoint,
        mode: XdpMode,
    ) -> Result<Option<AttachedLink>, DaemonError> {
        let mut link = match AttachedLink::open_pinned(pin, point, ifindex) {
            Ok(l) => l,
            Err(e) => {
                warn!(pin = %pin.display(), error = %e, "pinned link unusable; attaching anew");
                return Ok(None);
            }
        };
        let info = link.info()?;
        if info.point != Some(point) || info.ifindex != ifindex {
            warn!(
                pin = %pin.display(),
                interface = name,
                ifindex,
                link_ifindex = info.ifindex,
                "stale pinned link (interface gone or recreated); attaching anew"
            );
            return Ok(None);
        }
        match point {
            AttachPoint::Xdp => link.update(&self.dp.xdp().progs.xdp_ingress)?,
            AttachPoint::TcxEgress => link.update(&self.dp.tc().progs.tc_nat)?,
        }
        if point == AttachPoint::Xdp {
            let attached = xdp_attached_mode(ifindex)?;
            link.xdp_mode = attached;
            if let Some(have) = attached {
                if mode != XdpMode::Auto && have != mode {
                    // Native and generic XDP cannot be attached at once:
                    // changing the mode means a detach, a gap this start
                    // does not take on its own.
                    warn!(
                        interface = name,
                        configured = ?mode,
                        attached = ?have,
                        "the pinned XDP link keeps its mode; to change it: rivorad -cleanup, then start (a short gap)"
                    );
                }
            }
        }
        info!(
            interface = name,
            ?point,
            prog_id = info.prog_id,
            "took over the pinned link: program swapped in place"
        );
        Ok(Some(link))
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
        // The file first: if the maps then fail, the next reload or start
        // applies what the operator asked for.
        if let Err(e) = self.drain_store.save(&self.drains) {
            if drain {
                self.drains.remove(&k);
            } else {
                self.drains.insert(k);
            }
            return Err(e.into());
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
    /// forwarding without us, and closing our link fds leaves them be).
    /// The maps stay pinned either way.
    pub fn shutdown(self) {
        if self.opts.persist_datapath {
            info!("links stay pinned: the datapath keeps forwarding");
        } else {
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

/// Remove everything Rivora pinned under `pin_dir`: links first,
/// detached explicitly (unpinning alone would leave a link attached for
/// as long as a running rivorad holds it), then the maps. Returns the
/// links detached. The drain file under the state directory is kept: it
/// is the operator's intent, and the upgrade migration (cleanup, then
/// start) must not forget it.
pub fn cleanup(pin_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut detached = Vec::new();
    if let Ok(entries) = std::fs::read_dir(pin_dir.join("links")) {
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(l) = AttachedLink::open_pinned(&p, AttachPoint::Xdp, 0) {
                match l.detach() {
                    Ok(()) => detached.push(p),
                    // Defunct (its interface is gone): nothing to detach.
                    Err(e) => warn!(pin = %p.display(), error = %e, "link not detached"),
                }
            }
        }
    }
    Datapath::unpin_all(pin_dir)?;
    Ok(detached)
}
