//! rivorad's start-up and shutdown: load and adopt the datapath, hand the
//! writer to the reconciler (the one owner of the maps from then on),
//! attach the programs, and start the file source. What the daemon keeps
//! itself is what outlives a reconcile: the loaded programs and the
//! attached links.

pub mod api;
pub mod leaving;
pub mod net;
pub mod preflight;
pub mod state;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use tracing::{info, warn};

use crate::config::{self, ConfigError, NodeRuntime};
use crate::dataplane::attach::xdp_attached_mode;
use crate::dataplane::{
    AttachPoint, AttachedLink, Datapath, DataplaneError, LoadOptions, Writer, XdpMode,
};
use crate::healthcheck::HealthChecker;
use crate::reconciler::status::{self as rstatus, Capacities, InterfaceInfo, StatusReader};
use crate::reconciler::{Command, KernelFacts, Reconciler};
use crate::sources::file::{self as file_source, FileSource};
use state::{DrainStore, Drains, StateError};

/// How often full NAT's idle flows are swept: often against the shortest
/// timeout (2 s) would only cost reads of maps that rarely fill.
const FULLNAT_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

pub use crate::reconciler::ProbeKey;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error(transparent)]
    Net(#[from] net::NetError),
    #[error(transparent)]
    Listener(#[from] crate::api::ServeError),
    #[error("{0}")]
    Apply(String),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("starting the reconciler thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    NotNodeOnly(#[from] file_source::NotNodeOnly),
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
    /// VIPs come from Kubernetes: the file holds only node settings, and
    /// nothing unclaimed is pruned before the Kubernetes source's first
    /// full pass.
    pub kubernetes: bool,
    /// Health probes a second in all (None: no bound); see
    /// [`HealthChecker::with_budget`].
    pub probe_budget: Option<f64>,
    /// Where the checker reports its demand and stretch (the metrics'
    /// gauges).
    pub probe_load: crate::healthcheck::ProbeLoad,
}

/// One attached interface.
pub struct Attached {
    pub name: String,
    pub ifindex: u32,
    pub xdp: AttachedLink,
    pub tc: AttachedLink,
}

pub struct Daemon {
    opts: Options,
    /// The node part of the file rivorad started with (interfaces,
    /// listeners): the VIPs live in the reconciler, once.
    pub node: NodeRuntime,
    dp: Datapath,
    attached: Vec<Attached>,
    tx: mpsc::Sender<Command>,
    status: StatusReader,
    file: Arc<FileSource>,
    reconciler: Option<std::thread::JoinHandle<()>>,
    /// The listeners checked at start, until the API server takes over.
    reserved: Option<preflight::Reserved>,
    /// The file's `bgp` section, read at start.
    pub bgp: Option<crate::config::bgp::BgpSettings>,
    /// The maps were pinned when this start began: a restart.
    pub restarted: bool,
}

impl Daemon {
    /// Load the configuration and check what the node must provide for
    /// it (see [`preflight`]; a failure is an error and nothing is
    /// touched), the BPF objects and the pinned maps (adopting what they
    /// hold), apply the file, attach, and start probing and reconciling.
    /// The listeners stay reserved until [`Daemon::release_listeners`].
    pub fn start(
        opts: Options,
        runtime: tokio::runtime::Handle,
        observer: crate::healthcheck::Observer<ProbeKey>,
    ) -> Result<Self, DaemonError> {
        let t0 = std::time::Instant::now();
        let restarted = opts.pin_dir.join("meta_map").exists();
        let load_opts = LoadOptions {
            pin_dir: opts.pin_dir.clone(),
            maglev_size: opts.maglev_size,
            flow_table_size: opts.flow_table_size,
        };
        let ms = |t: std::time::Instant| t.elapsed().as_millis() as u64;
        let capacity = config::Capacity {
            maglev_size: opts.maglev_size,
            flow_table_size: opts.flow_table_size,
        };
        // A restart spends most of its time in the verifier (xdp_ingress),
        // so over existing pins, once the preflight has shown they fit
        // this binary, the objects load on one thread while this one
        // parses the file and adopts the maps (reading, and repairing
        // only what no VIP can reach). Loading over existing pins creates
        // and writes nothing. On a first start the file is checked first,
        // so that an invalid one pins nothing.
        // Read before anything is written, like the checks below.
        let drain_store = DrainStore::new(&opts.state_dir);
        let stored_drains = drain_store.load()?;
        // Interfaces, token and listeners, checked before the first map
        // is created or written: the adoption below may repair entries.
        let check = |cfg: &config::Config| -> Result<_, DaemonError> {
            if opts.kubernetes {
                file_source::check_node_only(cfg)?;
            }
            file_source::check_host(cfg)?;
            let _in = runtime.enter();
            preflight::check(&cfg.node_settings())
        };
        // A layout the load upgrades in place gains maps the writer opens:
        // it waits for the load then.
        let upgrading = crate::dataplane::loader::upgradable(
            crate::dataplane::loader::pinned_abi_version(&opts.pin_dir)?,
        );
        let (cfg, reserved, config_ms, dp, load_ms, writer, adopt_ms) =
            if opts.pin_dir.join("meta_map").exists() && !upgrading {
                Datapath::preflight(&load_opts)?;
                std::thread::scope(|s| -> Result<_, DaemonError> {
                    let loader = s.spawn(|| {
                        let t = std::time::Instant::now();
                        Datapath::load(&load_opts).map(|d| (d, ms(t)))
                    });
                    // An early return here still joins the loader (the
                    // scope does).
                    let cfg = config::load_with(&opts.config, &capacity)?;
                    let reserved = check(&cfg)?;
                    let config_ms = ms(t0);
                    let t = std::time::Instant::now();
                    let writer = Writer::open_pinned(&opts.pin_dir)?;
                    let adopt_ms = ms(t);
                    let (dp, load_ms) = loader
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                    Ok((cfg, reserved, config_ms, dp, load_ms, writer, adopt_ms))
                })?
            } else {
                let cfg = config::load_with(&opts.config, &capacity)?;
                let reserved = check(&cfg)?;
                let config_ms = ms(t0);
                let t = std::time::Instant::now();
                let dp = Datapath::load(&load_opts)?;
                let load_ms = ms(t);
                let t = std::time::Instant::now();
                let writer = Writer::open_pinned(&opts.pin_dir)?;
                (cfg, reserved, config_ms, dp, load_ms, writer, ms(t))
            };
        let mut writer = writer;
        for w in &cfg.warnings {
            warn!(config = %opts.config.display(), "{w}");
        }
        let adopted = writer.vips().len();
        let drains = match stored_drains {
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
        let flow_table_size = dp.flow_table_size();
        info!(
            adopted,
            drains = drains.len(),
            file = %opts.config.display(),
            flow_table_size,
            config_ms,
            load_ms,
            adopt_ms,
            "adopted pinned maps"
        );
        // Each CPU keeps only its share of every flow table: a node that
        // declares many possible CPUs (hot-pluggable ones count) can leave
        // each a share too thin for the flows one CPU handles.
        let per_cpu = dp.flow_table_per_cpu()?;
        if per_cpu < 1024 {
            warn!(
                flow_table_size,
                per_cpu, "each CPU keeps only {per_cpu} flows: consider a larger -flow-table-size"
            );
        }

        let (checker, mut events) = HealthChecker::with_observer(runtime.clone(), observer);
        let checker = checker.with_budget(opts.probe_budget, opts.probe_load.clone());
        let (publisher, status) = rstatus::channel();
        let mut rec = Reconciler::new(writer, KernelFacts, checker, drains, drain_store, publisher);
        rec.register(crate::desired::SourceKind::File);
        if opts.kubernetes {
            rec.register(crate::desired::SourceKind::Service);
            rec.register(crate::desired::SourceKind::Gateway);
        }
        let t1 = std::time::Instant::now();
        let (ack, mut applied) = tokio::sync::oneshot::channel();
        rec.submit_all(file_source::commands(&cfg, Some(ack)));
        let applied = applied
            .try_recv()
            .map_err(|_| DaemonError::Apply("the first apply gave no answer".into()))?;
        if !applied.ok() {
            return Err(DaemonError::Apply(applied.summary()));
        }
        info!(
            apply_ms = t1.elapsed().as_millis() as u64,
            "configuration applied"
        );

        let mut d = Self {
            opts,
            node: cfg.node_settings(),
            dp,
            attached: Vec::new(),
            // Replaced below, once the reconciler's thread runs.
            tx: mpsc::channel().0,
            status,
            file: Arc::new(FileSource::new(
                PathBuf::new(),
                mpsc::channel().0,
                &cfg,
                false,
            )),
            reconciler: None,
            reserved: Some(reserved),
            bgp: cfg.bgp.clone(),
            restarted,
        };
        d.attach()?;
        rec.set_attached(
            d.attached
                .iter()
                .map(|a| InterfaceInfo {
                    name: a.name.clone(),
                    ifindex: a.ifindex,
                    xdp_mode: a.xdp.xdp_mode,
                })
                .collect(),
            Capacities {
                maglev_size: d.dp.maglev_size(),
                flow_table_size,
                flow_table_per_cpu: per_cpu,
            },
        );
        let (tx, rx) = mpsc::channel();
        d.reconciler = Some(
            std::thread::Builder::new()
                .name("reconciler".into())
                .spawn(move || rec.run(rx))
                .map_err(DaemonError::Thread)?,
        );
        d.file = Arc::new(FileSource::new(
            d.opts.config.clone(),
            tx.clone(),
            &cfg,
            d.opts.kubernetes,
        ));
        d.tx = tx.clone();
        // Next hops too: a source of facts the reconciler writes.
        crate::nexthop::Watcher {
            status: d.status.clone(),
            tx: tx.clone(),
            pin_dir: d.opts.pin_dir.clone(),
        }
        .spawn()
        .map_err(DaemonError::Thread)?;
        // Full NAT's ports of flows long idle, taken back.
        {
            use std::os::fd::AsFd;
            let prog =
                d.dp.xdp()
                    .progs
                    .fullnat_sweep
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(DaemonError::Thread)?;
            crate::dataplane::sweep::Sweeper {
                prog,
                status: d.status.clone(),
                every: FULLNAT_SWEEP_EVERY,
            }
            .spawn()
            .map_err(DaemonError::Thread)?;
        }
        // Probe verdicts go to the reconciler like everything else.
        runtime.spawn(async move {
            while let Some(ev) = events.recv().await {
                if tx.send(Command::Health(ev)).is_err() {
                    return;
                }
            }
        });
        Ok(d)
    }

    /// Close the listeners reserved at start, for the API server to bind
    /// them now.
    pub fn release_listeners(&mut self) {
        if let Some(r) = self.reserved.take() {
            r.release();
        }
    }

    /// Where commands for the reconciler go (drains).
    pub fn sender(&self) -> mpsc::Sender<Command> {
        self.tx.clone()
    }

    /// What readers read.
    pub fn status(&self) -> StatusReader {
        self.status.clone()
    }

    pub fn file_source(&self) -> Arc<FileSource> {
        self.file.clone()
    }

    /// The interfaces attached, as the L2 speaker answers on them: name,
    /// ifindex and MAC (asked of the kernel now).
    pub fn attached_interfaces(&self) -> Result<Vec<rivora_l2::responder::Interface>, DaemonError> {
        self.attached
            .iter()
            .map(|a| {
                let (ifindex, mac) = net::interface(&a.name)?;
                Ok(rivora_l2::responder::Interface {
                    name: a.name.clone(),
                    ifindex,
                    mac: mac.0,
                })
            })
            .collect()
    }

    fn attach(&mut self) -> Result<(), DaemonError> {
        let listed: BTreeSet<String> = self
            .node
            .interfaces
            .iter()
            .map(|i| i.name.clone())
            .collect();
        self.drop_unlisted_links(&listed);
        for ifc in self.node.interfaces.clone() {
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

    /// Detach (unless the links are pinned: then the datapath keeps
    /// forwarding without us, and closing our link fds leaves them be).
    /// The maps stay pinned either way.
    pub fn shutdown(mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.reconciler.take() {
            let _ = t.join();
        }
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
