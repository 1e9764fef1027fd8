//! rivora-controller under test: the real binary against the shared API
//! server, one process per replica, in an RAII guard (SIGTERM, then
//! SIGKILL; its log printed if the test panics).

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::rivorad::{bins, terminate};

/// The rivora-controller under test: `RIVORA_BIN_DIR`'s, or the one
/// beside this build.
pub fn controller_bin() -> PathBuf {
    match std::env::var_os("RIVORA_BIN_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("rivora-controller"),
        None => bins::rivora_controller(),
    }
}

/// Lease settings short enough for a test: others take over 4 s after
/// the last renewal they saw, the holder stops writing 3 s after its
/// last renewal was sent, renewals every second.
pub const FAST_LEASE: [&str; 6] = [
    "-lease-duration",
    "4s",
    "-lease-renew-deadline",
    "3s",
    "-lease-retry-period",
    "1s",
];

pub struct Controller {
    child: Option<Child>,
    exited: Option<ExitStatus>,
    pub identity: String,
    log: PathBuf,
}

impl Controller {
    /// Start replica `identity` with `args` after -kubeconfig and
    /// -identity; its log goes to `dir`.
    pub fn start(dir: &Path, kubeconfig: &Path, identity: &str, args: &[&str]) -> Self {
        let log = dir.join(format!("{identity}.log"));
        let out = File::create(&log).expect("the controller's log file");
        let err = out.try_clone().expect("the log file twice");
        let child = Command::new(controller_bin())
            .arg("-kubeconfig")
            .arg(kubeconfig)
            .args(["-identity", identity, "-metrics-addr", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info,rivora_controller=debug")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", controller_bin().display()));
        Self {
            child: Some(child),
            exited: None,
            identity: identity.into(),
            log,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where it serves /metrics, /healthz and /readyz (from its log).
    pub fn metrics_addr(&self, within: Duration) -> SocketAddr {
        let t0 = Instant::now();
        loop {
            if let Some(a) = self
                .log_text()
                .lines()
                .filter(|l| l.contains("metrics and health listening"))
                .find_map(|l| {
                    let i = l.find("addr=")? + 5;
                    l[i..].split_whitespace().next()?.parse().ok()
                })
            {
                return a;
            }
            assert!(
                t0.elapsed() < within,
                "{} did not say where it listens within {within:?}:\n{}",
                self.identity,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no Lease released, nothing flushed.
    pub fn kill(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            self.exited = c.wait().ok();
        }
    }

    /// SIGTERM and wait (SIGKILL after 5 s).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if let Some(c) = self.child.as_mut() {
            if self.exited.is_none() {
                self.exited = Some(terminate(c));
            }
        }
        self.exited
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "--- rivora-controller {} ({:?}), log {}:\n{}--- end of its log",
                self.identity,
                self.exited,
                self.log.display(),
                self.log_text()
            );
        }
    }
}
