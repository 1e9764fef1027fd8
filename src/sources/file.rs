//! The static YAML file as a source: its node part becomes the node's
//! settings, its VIPs one object's desired set. Reloads (SIGHUP, the
//! file changing, `POST /v1/reload`) read and validate the file on a
//! blocking thread and hand the result to the reconciler; an invalid file
//! is reported and changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::config::{self, Config, ConfigError, NodeRuntime};
use crate::desired::{self, DesiredVip, Owner, SourceKind};
use crate::reconciler::{Applied, Command, NodeConf, Sender};

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error(transparent)]
    NotNodeOnly(#[from] NotNodeOnly),
    #[error("{0}")]
    NotApplied(String),
    #[error("rivorad is shutting down")]
    Stopped,
}

/// A file with VIPs given to a node that runs Kubernetes VIPs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path} defines {count} VIP(s) (the first: {first}), but with -kubernetes a node runs the VIPs of its Services and never static ones too: keep only the node settings (interfaces, api, metrics, node) in the file, or run without -kubernetes"
)]
pub struct NotNodeOnly {
    pub path: String,
    pub count: usize,
    pub first: String,
}

/// With `-kubernetes` the file may hold only the node's settings.
pub fn check_node_only(cfg: &Config) -> Result<(), NotNodeOnly> {
    match cfg.desired.vips.first() {
        None => Ok(()),
        Some(v) => Err(NotNodeOnly {
            path: cfg.path.display().to_string(),
            count: cfg.desired.vips.len(),
            first: v.key().to_string(),
        }),
    }
}

/// What the file says that only the host can check: full NAT's sources
/// must be addresses of this node (replies come back to them; one the
/// node does not hold would be answered by nobody, or by its real owner).
/// Refused like an invalid file, at start and on reload: nothing changes.
pub fn check_host(cfg: &Config) -> Result<(), ConfigError> {
    let snat = &cfg.file.node.snat;
    let wanted = [
        ("node.snat.ipv4", snat.ipv4.map(std::net::IpAddr::V4)),
        ("node.snat.ipv6", snat.ipv6.map(std::net::IpAddr::V6)),
    ];
    for (field, addr) in wanted {
        let Some(addr) = addr else { continue };
        match crate::daemon::net::is_local(addr) {
            Ok(true) => {}
            Ok(false) => {
                return Err(cfg.error_at(
                    field,
                    format!(
                        "{addr} is not an address of this node: full NAT's replies come back \
                         to its source, so it must be one the node holds"
                    ),
                ))
            }
            Err(e) => {
                return Err(cfg.error_at(
                    field,
                    format!("cannot tell whether {addr} is this node's: {e}"),
                ))
            }
        }
    }
    Ok(())
}

/// The node's part of a configuration.
pub fn node_conf(cfg: &Config) -> NodeConf {
    NodeConf {
        interfaces: cfg.file.interfaces.iter().map(|i| i.name.clone()).collect(),
        syn_rate_limit: cfg.desired.node.syn_rate_limit,
        tunnel_src4: cfg.desired.node.tunnel_src4,
        tunnel_src6: cfg.desired.node.tunnel_src6,
        fullnat: cfg.desired.node.fullnat,
    }
}

/// The file's object in the desired-state store.
pub fn owner(path: &Path) -> Owner {
    Owner::new(SourceKind::File, path.display().to_string())
}

/// What to tell the reconciler for a valid file.
pub fn commands(cfg: &Config, ack: Option<oneshot::Sender<Applied>>) -> Vec<Command> {
    let vips: Vec<DesiredVip> = desired::from_config(cfg);
    vec![
        Command::SetNode(node_conf(cfg)),
        Command::SetDesired {
            owner: owner(&cfg.path),
            vips,
            ack,
        },
        // The file is the whole desired set: synced from its first parse.
        Command::Synced(SourceKind::File),
    ]
}

/// The settings of `now` that differ from those rivorad `started` with
/// and that a reload cannot change (what is attached, bound, and read
/// once at start): one sentence each, naming the setting and both values.
pub fn restart_only_changes(started: &NodeRuntime, now: &NodeRuntime) -> Vec<String> {
    fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
        v.as_ref()
            .map_or_else(|| "none".to_string(), |v| v.to_string())
    }
    fn interfaces(n: &NodeRuntime) -> String {
        let names: Vec<String> = n
            .interfaces
            .iter()
            .map(|i| {
                let mode = format!("{:?}", i.xdp_mode).to_lowercase();
                format!("{} (xdpMode {mode})", i.name)
            })
            .collect();
        format!("[{}]", names.join(", "))
    }
    let mut changed = Vec::new();
    let mut note = |setting: &str, was: String, is: String| {
        if was != is {
            changed.push(format!(
                "{setting} changed from {was} to {is}: it takes effect at the next restart"
            ));
        }
    };
    note("interfaces", interfaces(started), interfaces(now));
    note(
        "api.socket",
        started.api.socket.display().to_string(),
        now.api.socket.display().to_string(),
    );
    note("api.listen", opt(&started.api.listen), opt(&now.api.listen));
    note(
        "api.tokenFile",
        opt(&started.api.token_file.as_ref().map(|p| p.display())),
        opt(&now.api.token_file.as_ref().map(|p| p.display())),
    );
    note(
        "metrics.listen",
        opt(&started.metrics.listen),
        opt(&now.metrics.listen),
    );
    // The speaker is set up once, from the file rivorad started with.
    if (started.announce, &started.l2) != (now.announce, &now.l2) {
        changed.push(
            "node.announce or node.l2 changed: the L2 speaker takes it at the next restart"
                .to_string(),
        );
    }
    changed
}

/// What applies a reloaded `bgp` section (the speaker's, once it runs):
/// returns what only a restart can apply.
pub type BgpReload =
    Box<dyn Fn(Option<&crate::config::bgp::BgpSettings>) -> Vec<String> + Send + Sync>;

pub struct FileSource {
    path: PathBuf,
    /// Set once the BGP speaker runs.
    bgp: Mutex<Option<BgpReload>>,
    tx: Mutex<Sender>,
    /// What rivorad attached to and listens on: a reload cannot change it.
    started: NodeRuntime,
    /// What the last valid file asked that only a restart applies.
    pending_restart: Mutex<Vec<String>>,
    /// What a reload must fit: the datapath's, as checked at start.
    capacity: config::Capacity,
    /// One reload at a time, so their answers come in order.
    reloading: tokio::sync::Mutex<()>,
    /// The file as last read (by any reload, or at start): the watcher
    /// reloads only what differs from it.
    loaded: Mutex<Option<Stamp>>,
    /// The node runs Kubernetes VIPs: a file with VIPs is refused.
    node_only: bool,
}

/// What the watcher compares: modification time and length.
type Stamp = (SystemTime, u64);

/// How often the watcher looks at the file.
const POLL: Duration = Duration::from_secs(1);

fn stamp(p: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Whether the file, seen as `now`, should be reloaded: it differs from
/// what was last loaded and has stopped changing (the same stamp at two
/// polls in a row), so a file written in several steps is read once, whole.
/// `pending` carries the previous poll's stamp.
fn settled(pending: &mut Option<Stamp>, now: Option<Stamp>, loaded: Option<Stamp>) -> bool {
    match now {
        // Gone (an editor's rename in progress) or as loaded: nothing to do.
        None => {
            *pending = None;
            false
        }
        Some(s) if Some(s) == loaded => {
            *pending = None;
            false
        }
        Some(s) if *pending == Some(s) => {
            *pending = None;
            true
        }
        Some(s) => {
            *pending = Some(s);
            false
        }
    }
}

impl FileSource {
    pub fn new(path: PathBuf, tx: Sender, started_with: &Config, node_only: bool) -> Self {
        let loaded = Mutex::new(stamp(&path));
        Self {
            bgp: Mutex::new(None),
            node_only,
            loaded,
            path,
            tx: Mutex::new(tx),
            started: started_with.node_settings(),
            pending_restart: Mutex::new(Vec::new()),
            capacity: started_with.capacity,
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Hand every valid reload's `bgp` section to `f`.
    pub fn on_bgp_reload(&self, f: BgpReload) {
        if let Ok(mut b) = self.bgp.lock() {
            *b = Some(f);
        }
    }

    fn send(&self, cmd: Command) -> Result<(), ReloadError> {
        self.tx
            .lock()
            .map_err(|_| ReloadError::Stopped)?
            .send(cmd)
            .map_err(|_| ReloadError::Stopped)
    }

    /// The settings the last valid file changed that take effect at the
    /// next restart only (see [`restart_only_changes`]).
    pub fn pending_restart(&self) -> Vec<String> {
        self.pending_restart
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default()
    }

    /// Read the file again and apply it. Parsing runs off the async
    /// workers; the answer comes once the reconciler has applied it. On
    /// success, the warnings: settings changed that only a restart applies.
    pub async fn reload(&self) -> Result<Vec<String>, ReloadError> {
        let _one = self.reloading.lock().await;
        // Taken before reading: a change made while we read is seen anew.
        let seen = stamp(&self.path);
        if let Ok(mut l) = self.loaded.lock() {
            *l = seen;
        }
        let path = self.path.clone();
        let capacity = self.capacity;
        let parsed = tokio::task::spawn_blocking(move || config::load_with(&path, &capacity))
            .await
            .map_err(|_| ReloadError::Stopped)?;
        let checked = parsed.map_err(ReloadError::from).and_then(|c| {
            if self.node_only {
                check_node_only(&c)?;
            }
            check_host(&c)?;
            Ok(c)
        });
        let cfg = match checked {
            Ok(c) => c,
            Err(e) => {
                error!(error = %e, "reload refused: the file is invalid; the running state stays");
                self.send(Command::SourceFailed {
                    source: SourceKind::File,
                    error: e.to_string(),
                })?;
                return Err(e);
            }
        };
        let mut restart = restart_only_changes(&self.started, &cfg.node_settings());
        if let Ok(b) = self.bgp.lock() {
            match &*b {
                Some(apply) => restart.extend(apply(cfg.bgp.as_ref())),
                None if cfg.bgp.is_some() => restart
                    .push("bgp was added: the BGP speaker starts at the next restart".to_string()),
                None => {}
            }
        }
        if let Ok(mut p) = self.pending_restart.lock() {
            p.clone_from(&restart);
        }
        // The validator's warnings too (VIPs the Maglev table cannot give
        // the precision their weights need): the reload's answer says so.
        let mut warnings = restart;
        warnings.extend(cfg.warnings.iter().cloned());
        for w in &warnings {
            warn!(file = %self.path.display(), "{w}");
        }
        let (ack, done) = oneshot::channel();
        for c in commands(&cfg, Some(ack)) {
            self.send(c)?;
        }
        let applied = done.await.map_err(|_| ReloadError::Stopped)?;
        if applied.ok() {
            info!(file = %self.path.display(), "reloaded");
            Ok(warnings)
        } else {
            let msg = applied.summary();
            error!(error = %msg, "reload applied in part; the VIPs named keep their previous state");
            Err(ReloadError::NotApplied(msg))
        }
    }

    /// Reload whenever the file changes and has settled (checked every
    /// second; see [`settled`]).
    pub async fn watch(&self) {
        let mut pending = None;
        loop {
            tokio::time::sleep(POLL).await;
            let loaded = self.loaded.lock().ok().and_then(|l| *l);
            if settled(&mut pending, stamp(&self.path), loaded) {
                info!(file = %self.path.display(), "configuration file changed");
                if let Err(ReloadError::Stopped) = self.reload().await {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiConf, InterfaceConf, MetricsConf};
    use crate::model::XdpMode;

    fn node(ifs: &[(&str, XdpMode)], api: ApiConf, metrics: Option<&str>) -> NodeRuntime {
        NodeRuntime {
            interfaces: ifs
                .iter()
                .map(|(name, xdp_mode)| InterfaceConf {
                    name: name.to_string(),
                    xdp_mode: *xdp_mode,
                })
                .collect(),
            api,
            metrics: MetricsConf {
                listen: metrics.map(|m| m.parse().expect("literal")),
            },
            announce: Default::default(),
            l2: Default::default(),
        }
    }

    #[test]
    fn settings_only_a_restart_applies_are_named_with_both_values() {
        let api = ApiConf {
            socket: "/run/rivora/rivorad.sock".into(),
            listen: None,
            token_file: None,
        };
        let started = node(&[("eth0", XdpMode::Auto)], api.clone(), None);
        assert_eq!(
            restart_only_changes(&started, &started),
            Vec::<String>::new()
        );

        let now = node(
            &[("eth0", XdpMode::Generic), ("eth1", XdpMode::Auto)],
            ApiConf {
                socket: "/run/other.sock".into(),
                listen: Some("127.0.0.1:9441".parse().expect("literal")),
                token_file: Some("/etc/rivora/token".into()),
            },
            Some("127.0.0.1:9440"),
        );
        assert_eq!(
            restart_only_changes(&started, &now),
            [
                "interfaces changed from [eth0 (xdpMode auto)] to [eth0 (xdpMode generic), \
                 eth1 (xdpMode auto)]: it takes effect at the next restart",
                "api.socket changed from /run/rivora/rivorad.sock to /run/other.sock: it takes \
                 effect at the next restart",
                "api.listen changed from none to 127.0.0.1:9441: it takes effect at the next restart",
                "api.tokenFile changed from none to /etc/rivora/token: it takes effect at the next \
                 restart",
                "metrics.listen changed from none to 127.0.0.1:9440: it takes effect at the next \
                 restart",
            ]
        );
        // Back as started: nothing pending.
        assert!(restart_only_changes(&started, &started.clone()).is_empty());
    }

    fn at(secs: u64, len: u64) -> Option<Stamp> {
        Some((SystemTime::UNIX_EPOCH + Duration::from_secs(secs), len))
    }

    #[test]
    fn a_change_is_taken_once_it_holds_for_a_poll() {
        let loaded = at(1, 100);
        let mut p = None;
        assert!(!settled(&mut p, loaded, loaded), "unchanged");
        // Written in two steps a poll apart: neither half is taken.
        assert!(!settled(&mut p, at(2, 40), loaded));
        assert!(!settled(&mut p, at(3, 120), loaded));
        // The same at the next poll: taken, once.
        assert!(settled(&mut p, at(3, 120), loaded));
        assert!(!settled(&mut p, at(3, 120), at(3, 120)));
    }

    #[test]
    fn a_missing_file_or_what_a_reload_already_read_is_not_reloaded() {
        let loaded = at(1, 100);
        let mut p = None;
        assert!(!settled(&mut p, at(2, 50), loaded));
        assert!(!settled(&mut p, None, loaded), "gone for a moment");
        assert!(!settled(&mut p, at(2, 50), loaded), "back: starts over");
        assert!(settled(&mut p, at(2, 50), loaded));
        // A SIGHUP or API reload read it already: the watcher leaves it.
        let mut p = None;
        assert!(!settled(&mut p, at(4, 60), at(4, 60)));
        assert!(!settled(&mut p, at(4, 60), at(4, 60)));
    }
}
