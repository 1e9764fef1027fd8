//! The real rivorad binary in a test, said once: [`Home`] is one
//! installation's files (config, API socket, logs, `-state-dir`, pin
//! directory), private to the test and removed on drop; [`Rivorad`] runs
//! the binary in a namespace (`nsenter --net`, which execs: the child's pid
//! is rivorad's) against its home, and on drop stops it (SIGTERM, then
//! SIGKILL), prints its log if the test is failing, and removes the pins.

use std::fs::{self, File};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use rivora::dataplane::attach::ifindex;
use rivora::dataplane::{AttachPoint, AttachedLink};
use serde_json::Value;

use super::netns::Netns;
use super::unique;

#[path = "../bins/mod.rs"]
pub mod bins;

/// rivorad must log "ready" within this unless the test says otherwise.
pub const READY: Duration = Duration::from_secs(30);

/// Where `RIVORA_BIN_DIR` says the binaries under test are: `make test`
/// runs one pass against target/release, what `make` builds and installs.
fn from_bin_dir(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("RIVORA_BIN_DIR").filter(|d| !d.is_empty())?;
    let bin = PathBuf::from(dir).join(name);
    // A wrong directory must not quietly test another build.
    assert!(
        bin.is_file(),
        "RIVORA_BIN_DIR names {}, which does not exist",
        bin.display()
    );
    Some(bin)
}

/// The rivorad under test: this build's, or `RIVORA_BIN_DIR`'s.
pub fn rivorad_bin() -> PathBuf {
    from_bin_dir("rivorad").unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_rivorad")))
}

/// The variant build of rivorad, whose XDP program differs from this
/// build's (`-DRV_BUILD_VARIANT`): an upgrade to swap in. Prebuilt
/// (`RIVORA_VARIANT_RIVORAD`, which `make test` sets) or built once here
/// into target/variant (a debug build of its own, a few minutes on 2
/// cores).
pub fn variant_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("RIVORA_VARIANT_RIVORAD") {
            let p = PathBuf::from(p);
            assert!(
                p.exists(),
                "RIVORA_VARIANT_RIVORAD={} does not exist",
                p.display()
            );
            return p;
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let target = root.join("target/variant");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .current_dir(&root)
            .env("RIVORA_BPF_CFLAGS", "-DRV_BUILD_VARIANT")
            .args(["build", "--bin", "rivorad", "--target-dir"])
            .arg(&target)
            .status()
            .expect("running cargo for the variant build");
        assert!(st.success(), "building the variant rivorad failed");
        target.join("debug/rivorad")
    })
    .clone()
}

/// The rivoractl under test: `RIVORA_BIN_DIR`'s, or the one beside this
/// build (a package of its own: see `tests/bins`).
pub fn rivoractl_bin() -> PathBuf {
    from_bin_dir("rivoractl").unwrap_or_else(bins::rivoractl)
}

/// One rivorad installation's files, private to the test: nothing is
/// shared with the machine's /var/lib/rivora or /sys/fs/bpf/rivora-lb, or
/// with a parallel test. Removed on drop, pins first (links detached: a
/// pinned link outlives its interface's namespace otherwise).
pub struct Home {
    dir: PathBuf,
    pins: PathBuf,
}

impl Home {
    /// Mode 0755: a permission test must meet the socket's own mode, not
    /// a closed directory.
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("rivorad-e2e-"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).expect("creating rivorad's home");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod home");
        let pins = PathBuf::from(format!("/sys/fs/bpf/{}", unique("rivorad-e2e-")));
        Self { dir, pins }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn config(&self) -> PathBuf {
        self.path("rivora.yaml")
    }

    /// The API socket the config must name (rivorad takes it from there).
    pub fn socket(&self) -> PathBuf {
        self.path("rivorad.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pins
    }

    /// A config of node settings alone (no `vips`), what `rivorad
    /// -kubernetes` takes: attach to `iface`, the API on [`Home::socket`],
    /// L3 DSR's tunnel sources.
    pub fn node_config(&self, iface: &str, tunnel4: Ipv4Addr, tunnel6: Ipv6Addr) -> String {
        format!(
            "interfaces:\n  - name: {iface}\n    xdpMode: native\n\
             node:\n  tunnelSource: {{ ipv4: {tunnel4}, ipv6: \"{tunnel6}\" }}\n\
             api:\n  socket: {}\n",
            self.socket().display()
        )
    }

    /// Uninstall as an operator would (`rivorad -cleanup`, in `ns`), then
    /// check nothing is left: no pin directory, and in the state directory
    /// nothing but the drain file (no half-written temporary).
    pub fn assert_no_leftovers(&self, ns: &Netns) {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", ns.path()))
            .arg(rivorad_bin())
            .args(["-cleanup", "-pin-dir"])
            .arg(&self.pins)
            .output()
            .expect("running rivorad -cleanup");
        assert!(
            out.status.success(),
            "rivorad -cleanup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!self.pins.exists(), "pins left after -cleanup");
        let state: Vec<String> = fs::read_dir(self.state_dir())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != "drains.json")
                    .collect()
            })
            .unwrap_or_default();
        assert!(state.is_empty(), "left in the state directory: {state:?}");
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = rivora::daemon::cleanup(&self.pins);
        let _ = fs::remove_dir_all(&self.pins);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// rivorad runs of one [`Home`] in one namespace, one at a time; each
/// run logs (JSON) to a file of its own.
pub struct Rivorad {
    child: Option<Child>,
    exited: Option<ExitStatus>,
    log: PathBuf,
    started: Instant,
    runs: usize,
    ns: String,
    /// Flags every run gets, before each run's own (`-kubernetes ...`).
    args: Vec<String>,
    /// A command between nsenter and rivorad that execs what follows
    /// (`setpriv --bounding-set ... --`: a run with fewer capabilities).
    wrapper: Vec<String>,
    pub home: Home,
}

impl Rivorad {
    /// Nothing runs yet: see [`Rivorad::spawn`].
    pub fn new(ns: &Netns, home: Home) -> Self {
        Self {
            child: None,
            exited: None,
            log: home.path("rivorad-0.log"),
            started: Instant::now(),
            runs: 0,
            ns: ns.path(),
            args: Vec::new(),
            wrapper: Vec::new(),
            home,
        }
    }

    /// Run rivorad behind `wrapper` (it must exec its arguments).
    pub fn with_wrapper(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Flags every later run gets, before its own.
    pub fn with_args(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// `rivorad -kubernetes`: `node_yaml` (node settings only, see
    /// [`Home::node_config`]) as the config, the API server and identity
    /// of `kubeconfig`, this node's name; `extra` for this run only.
    /// Waits until it is ready (not until it has synced).
    pub fn start_kubernetes(
        ns: &Netns,
        home: Home,
        node_yaml: &str,
        kubeconfig: &Path,
        node_name: &str,
        extra: &[&str],
    ) -> Self {
        fs::write(home.config(), node_yaml).expect("writing the node config");
        let kubeconfig = kubeconfig.display().to_string();
        let mut rd = Self::new(ns, home).with_args(&[
            "-kubernetes",
            "-kubeconfig",
            &kubeconfig,
            "-node-name",
            node_name,
        ]);
        rd.restart(extra);
        rd
    }

    /// Write `yaml` as the config, start this build's rivorad in `ns`
    /// with `extra` flags and wait until it is ready.
    pub fn start(ns: &Netns, home: Home, yaml: &str, extra: &[&str]) -> Self {
        fs::write(home.config(), yaml).expect("writing the config");
        let mut rd = Self::new(ns, home);
        rd.restart(extra);
        rd
    }

    /// Start this build's rivorad again and wait until it is ready.
    pub fn restart(&mut self, extra: &[&str]) {
        self.spawn(&rivorad_bin(), extra);
        self.wait_ready(READY);
    }

    /// Start `bin` on the home's config, pins and state with `extra`
    /// flags; returns at once.
    pub fn spawn(&mut self, bin: &Path, extra: &[&str]) {
        assert!(
            self.child.is_none() || self.exited.is_some(),
            "a second rivorad while one runs"
        );
        self.runs += 1;
        self.log = self.home.path(&format!("rivorad-{}.log", self.runs));
        let out = File::create(&self.log).expect("creating the rivorad log");
        let err = out.try_clone().expect("cloning the log fd");
        let mut cmd = Command::new("nsenter");
        // SAFETY: prctl is async-signal-safe. If the test process dies
        // without running its guards (killed by a timeout), rivorad gets
        // SIGTERM and detaches rather than forwarding on in a leftover lab.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.arg(format!("--net={}", self.ns))
            .args(&self.wrapper)
            .arg(bin)
            .arg("-config")
            .arg(self.home.config())
            .arg("-pin-dir")
            .arg(self.home.pin_dir())
            .arg("-state-dir")
            .arg(self.home.state_dir())
            .args(["-log-format", "json"])
            .args(&self.args)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        self.started = Instant::now();
        self.child = Some(cmd.spawn().expect("spawning nsenter rivorad"));
        self.exited = None;
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("rivorad was started")
    }

    /// The current run's log.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for the current run's "ready" line; panics if rivorad exits
    /// or `timeout` passes first. Returns the time from spawn to ready.
    pub fn wait_ready(&mut self, timeout: Duration) -> Duration {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log_text().contains(r#""message":"ready""#) {
                return self.started.elapsed();
            }
            if let Ok(Some(st)) = self.child().try_wait() {
                self.exited = Some(st);
                panic!("rivorad exited ({st}) before it was ready");
            }
            assert!(
                Instant::now() < deadline,
                "rivorad not ready within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait (bounded) for the current run to exit; returns how.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child().try_wait().expect("waiting for rivorad") {
                self.exited = Some(st);
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "rivorad did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("rivorad was started").id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child's pid.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    pub fn sighup(&self) {
        self.signal(libc::SIGHUP);
    }

    /// Send `sig` and wait (bounded) for the exit.
    pub fn stop_with(&mut self, sig: i32, timeout: Duration) -> ExitStatus {
        self.signal(sig);
        self.wait_exit(timeout)
    }

    /// SIGTERM, and the exit within 10 s.
    pub fn stop(&mut self) -> ExitStatus {
        self.stop_with(libc::SIGTERM, Duration::from_secs(10))
    }

    /// rivoractl against this rivorad's socket.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(rivoractl_bin())
            .arg("--socket")
            .arg(self.home.socket())
            .args(args)
            .output()
            .expect("running rivoractl")
    }

    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "rivoractl {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn ctl_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let text = self.ctl_ok(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("rivoractl {all:?}: {e}: {text}"))
    }

    pub fn status(&self) -> Value {
        self.ctl_json(&["status"])
    }

    pub fn generation(&self) -> u64 {
        self.status()["config_generation"]
            .as_u64()
            .expect("config_generation in status")
    }

    /// Replace the config so that the file watcher cannot see it (same
    /// length, same mtime, swapped in by rename): only SIGHUP applies it.
    pub fn write_config_unseen(&self, yaml: &str) {
        let config = self.home.config();
        let old = fs::metadata(&config).expect("config metadata");
        assert_eq!(
            old.len(),
            yaml.len() as u64,
            "an unseen rewrite needs a config of the same length"
        );
        self.replace_config(yaml, old.modified().expect("config mtime"));
    }

    /// Replace the config as an editor would (new mtime): the watcher
    /// reloads it within about a second.
    pub fn write_config(&self, yaml: &str) {
        // A whole second later than the old mtime, whatever the
        // filesystem's timestamp granularity.
        let old = fs::metadata(self.home.config())
            .and_then(|m| m.modified())
            .expect("config mtime");
        self.replace_config(yaml, old + Duration::from_secs(1));
    }

    fn replace_config(&self, yaml: &str, mtime: SystemTime) {
        let config = self.home.config();
        let tmp = config.with_extension("yaml.new");
        fs::write(&tmp, yaml).expect("writing the new config");
        File::options()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.set_modified(mtime))
            .expect("setting the new config's mtime");
        fs::rename(&tmp, &config).expect("renaming the new config into place");
    }
}

/// SIGTERM, up to 5 s to exit, then SIGKILL.
pub fn terminate(child: &mut Child) -> ExitStatus {
    if let Ok(Some(st)) = child.try_wait() {
        return st;
    }
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return st;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().expect("reaping rivorad")
}

impl Drop for Rivorad {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if self.exited.is_none() {
                self.exited = Some(terminate(c));
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "--- rivorad in {} ({:?}), log {}:\n{}--- end of rivorad log",
                self.ns,
                self.exited,
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// (XDP attached?, TCX egress program count) on `dev` in `ns`, asked of
/// the kernel through libbpf (Debian's bpftool does not know TCX).
pub fn attached(ns: &Netns, dev: &'static str) -> (bool, u32) {
    ns.run(move || {
        let idx = ifindex(dev).expect("interface in the namespace");
        let mut xdp_id = 0u32;
        // SAFETY: plain query with a valid out pointer.
        let rc = unsafe { libbpf_sys::bpf_xdp_query_id(idx as i32, 0, &mut xdp_id) };
        assert_eq!(rc, 0, "bpf_xdp_query_id on {dev}: {rc}");
        // SAFETY: an all-zero opts struct is its documented initial state.
        let mut opts: libbpf_sys::bpf_prog_query_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<libbpf_sys::bpf_prog_query_opts>() as _;
        // SAFETY: valid opts (no id arrays: only the count is filled).
        let rc = unsafe {
            libbpf_sys::bpf_prog_query_opts(idx as i32, libbpf_sys::BPF_TCX_EGRESS, &mut opts)
        };
        assert_eq!(rc, 0, "bpf_prog_query_opts(TCX egress) on {dev}: {rc}");
        // SAFETY: `count` is the member of this union the kernel fills
        // (`prog_cnt` is its older name for the same u32).
        (xdp_id != 0, unsafe { opts.__bindgen_anon_1.count })
    })
}

/// The program behind a pinned link: (program id, tag as hex).
pub fn link_prog(pin: &Path) -> Option<(u32, String)> {
    let link = AttachedLink::open_pinned(pin, AttachPoint::Xdp, 0).ok()?;
    let info = link.info().ok()?;
    if info.prog_id == 0 {
        return None;
    }
    // SAFETY: plain syscall wrappers with valid arguments; the fd returned
    // is closed below.
    unsafe {
        let fd = libbpf_sys::bpf_prog_get_fd_by_id(info.prog_id);
        if fd < 0 {
            return None;
        }
        let mut p: libbpf_sys::bpf_prog_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
        let rc = libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut p, &mut len);
        libc::close(fd);
        if rc < 0 {
            return None;
        }
        let tag: String = p.tag.iter().map(|b| format!("{b:02x}")).collect();
        Some((info.prog_id, tag))
    }
}
