//! End to end with the real rivorad binary: it runs inside the node
//! namespace of a lab (see `common::lab`: client, node, three backends on
//! one switch), programs the datapath from a YAML file, probes the
//! backends, and is steered with the real rivoractl. Nothing here fills a
//! map or attaches a program on the node itself: what forwards is what
//! rivorad made of the file.
//!
//! Scenarios, one test each so that they run in parallel:
//! - each mode (NAT, DSR, L3 DSR) carries real TCP and UDP over IPv4 and
//!   IPv6 VIPs, spread over the three backends (`*_traffic`);
//! - a killed backend is out within fall x interval (+ timeout + slack) and
//!   no new connection fails after that (a reload meanwhile keeps it out);
//!   restored, it is back within rise x interval (+ timeout + slack)
//!   (`health_kill_and_restore`);
//! - a drain through rivoractl keeps a long-lived connection flowing while
//!   new connections go elsewhere, also across a reload; undrain restores
//!   (`drain_keeps_long_lived_connection`);
//! - a reload by SIGHUP and by editing the file applies a changed backend
//!   set (`reload_applies_changed_backends`);
//! - a reload of an invalid file keeps the old state forwarding, and shows
//!   and counts the failure (`invalid_reload_keeps_forwarding`);
//! - the API refuses a caller without permission or token
//!   (`api_refuses_unauthorised_callers`);
//! - an invalid file at start: non-zero exit naming file and line, nothing
//!   changed (`invalid_config_at_start_changes_nothing`);
//! - with -persist-datapath the datapath forwards while rivorad is down,
//!   and a restart on a changed file adopts the pinned state (IDs kept)
//!   and removes what the file dropped (`restart_persists_and_adopts`).
//!
//! Every rivorad runs in an RAII guard (SIGTERM, then SIGKILL; its pins and
//! work directory removed; its log printed if the test panics), every wait
//! has a deadline, and every client step a timeout. Needs root.

mod bins;
mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use common::lab::{spawn_in, Lab, Mode, Topology, VIP_PORT};
use common::netns::Netns;
use common::unique;
use serde_json::Value;

/// Connections (TCP) or exchanges (UDP) per spread measurement.
const FLOWS: usize = 120;
/// Client threads sharing them.
const WORKERS: usize = 4;
/// A broken path fails within this per step (connect, reply).
const STEP: Duration = Duration::from_secs(2);
/// Each serving backend takes at least this share: with a fair 1-in-3
/// split of 120 flows, a count is Binomial(120, 1/3), mean 40, standard
/// deviation 5.2; 15% is 18, 4.3 deviations under the mean (P = 1.6e-6 per
/// check). With two serving backends the margin is wider still.
const MIN_SHARE: f64 = 0.15;
/// rivorad must log "ready" within this.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Health-check timing of the health test, as in the config below.
const INTERVAL: Duration = Duration::from_millis(300);
const TIMEOUT: Duration = Duration::from_millis(200);
const RISE: u32 = 2;
const FALL: u32 = 2;
/// Scheduling, the apply through the writer and the API poll's period:
/// tests run in parallel on two cores.
const SLACK: Duration = Duration::from_millis(500);
const FAST_HEALTH: &str = "{ type: tcp, interval: 300ms, timeout: 200ms, rise: 2, fall: 2 }";
/// Health checks that stay out of the way (the traffic tests).
const SLOW_HEALTH: &str = "{ type: tcp, interval: 1s, timeout: 500ms, rise: 2, fall: 3 }";

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "e2e_rivorad needs root (namespaces, BPF)");
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Poll `f` every `period` until it returns Some or `limit` passes.
fn wait_for<T>(limit: Duration, period: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(period);
    }
}

// ---------------------------------------------------------------------
// rivorad and its files
// ---------------------------------------------------------------------

/// A directory for one rivorad's config, socket, token and log, removed
/// on drop. Mode 0755: the permission test must meet the socket's own
/// mode, not a closed directory.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Self {
        let p = std::env::temp_dir().join(unique("rivorad-e2e-"));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir(&p).expect("creating the work directory");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod work dir");
        Self(p)
    }

    fn socket(&self) -> PathBuf {
        self.0.join("rivorad.sock")
    }

    fn config(&self) -> PathBuf {
        self.0.join("rivora.yaml")
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Start rivorad inside `ns` (`nsenter --net`, which execs: the child's pid
/// is rivorad's), appending its JSON log to `log`.
fn spawn_rivorad(ns: &str, config: &Path, pin_dir: &Path, log: &Path, extra: &[&str]) -> Child {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .expect("opening the rivorad log");
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
    cmd.arg(format!("--net=/run/netns/{ns}"))
        .arg(env!("CARGO_BIN_EXE_rivorad"))
        .arg("-config")
        .arg(config)
        .arg("-pin-dir")
        .arg(pin_dir)
        .args(["-log-format", "json"])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawning nsenter rivorad")
}

/// SIGTERM, up to 5 s to exit, then SIGKILL. Returns the exit status.
fn terminate(child: &mut Child) -> ExitStatus {
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

/// A running rivorad: stopped, its pins removed and its work directory
/// deleted on drop; its log printed when the test is failing.
struct Rivorad {
    child: Child,
    ns: String,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    pin_dir: PathBuf,
    exited: Option<ExitStatus>,
    _dir: WorkDir,
}

impl Rivorad {
    /// Write `yaml` as the config in `dir`, start rivorad in `ns` (with
    /// `extra` flags) and wait until it logs "ready".
    fn start(ns: &Netns, dir: WorkDir, yaml: &str, extra: &[&str]) -> Self {
        let config = dir.config();
        fs::write(&config, yaml).expect("writing the config");
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/{}", unique("rivorad-e2e-")));
        let log = dir.0.join("rivorad.log");
        let child = spawn_rivorad(&ns.name, &config, &pin_dir, &log, extra);
        let mut rd = Rivorad {
            child,
            ns: ns.name.clone(),
            config,
            socket: dir.socket(),
            log,
            pin_dir,
            exited: None,
            _dir: dir,
        };
        rd.wait_ready(0);
        rd
    }

    /// Wait until the log holds more than `before` "ready" lines.
    fn wait_ready(&mut self, before: usize) {
        let t0 = Instant::now();
        loop {
            if self.log_text().matches("\"message\":\"ready\"").count() > before {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exited = Some(st);
                panic!("rivorad exited ({st}) before it was ready");
            }
            assert!(
                t0.elapsed() < READY_TIMEOUT,
                "rivorad not ready within {READY_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start a stopped rivorad again: same namespace, config, pins and
    /// socket, with `extra` flags.
    fn restart(&mut self, extra: &[&str]) {
        assert!(self.exited.is_some(), "restart of a running rivorad");
        let before = self.log_text().matches("\"message\":\"ready\"").count();
        self.child = spawn_rivorad(&self.ns, &self.config, &self.pin_dir, &self.log, extra);
        self.exited = None;
        self.wait_ready(before);
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn sighup(&self) {
        // SAFETY: a signal to our own running child.
        let rc = unsafe { libc::kill(self.pid(), libc::SIGHUP) };
        assert_eq!(rc, 0, "SIGHUP: {}", std::io::Error::last_os_error());
    }

    /// rivoractl against this rivorad's socket.
    fn ctl(&self, args: &[&str]) -> Output {
        Command::new(bins::rivoractl())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("running rivoractl")
    }

    fn ctl_ok(&self, args: &[&str]) -> String {
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

    fn ctl_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let text = self.ctl_ok(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("rivoractl {all:?}: {e}: {text}"))
    }

    fn status(&self) -> Value {
        self.ctl_json(&["status"])
    }

    fn generation(&self) -> u64 {
        self.status()["config_generation"]
            .as_u64()
            .expect("config_generation in status")
    }

    /// The datapath health rivorad reports for `target` ("healthy",
    /// "draining", "down").
    fn health_of(&self, target: SocketAddr) -> String {
        let list = self.ctl_json(&["backend", "list"]);
        let want = target.to_string();
        list.as_array()
            .expect("backend list is an array")
            .iter()
            .find(|b| b["target"] == want.as_str())
            .unwrap_or_else(|| panic!("no backend {want} in {list}"))["health"]
            .as_str()
            .expect("health is a string")
            .to_string()
    }

    /// Packets rivorad counts for a VIP (`tcp/10.0.0.1:80`).
    fn vip_packets(&self, vip: &str) -> u64 {
        let list = self.ctl_json(&["vip", "list"]);
        list.as_array()
            .expect("vip list is an array")
            .iter()
            .find(|v| v["vip"] == vip)
            .unwrap_or_else(|| panic!("no VIP {vip} in {list}"))["packets"]
            .as_u64()
            .expect("packets")
    }

    /// Replace the config so that the file watcher cannot see it (same
    /// length, same mtime, swapped in by rename): only SIGHUP applies it.
    fn write_config_unseen(&self, yaml: &str) {
        let old = fs::metadata(&self.config).expect("config metadata");
        assert_eq!(
            old.len(),
            yaml.len() as u64,
            "an unseen rewrite needs a config of the same length"
        );
        let mtime: SystemTime = old.modified().expect("config mtime");
        let tmp = self.config.with_extension("yaml.new");
        fs::write(&tmp, yaml).expect("writing the new config");
        File::options()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.set_modified(mtime))
            .expect("setting the new config's mtime");
        fs::rename(&tmp, &self.config).expect("renaming the new config into place");
    }

    /// Replace the config as an editor would (new mtime): the watcher
    /// reloads it within about a second.
    fn write_config(&self, yaml: &str) {
        // A whole second later than the old mtime, whatever the
        // filesystem's timestamp granularity.
        let old = fs::metadata(&self.config)
            .and_then(|m| m.modified())
            .expect("config mtime");
        let tmp = self.config.with_extension("yaml.new");
        fs::write(&tmp, yaml).expect("writing the new config");
        File::options()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.set_modified(old + Duration::from_secs(1)))
            .expect("setting the new config's mtime");
        fs::rename(&tmp, &self.config).expect("renaming the new config into place");
    }

    /// Stop rivorad (SIGTERM) and return how it exited.
    fn stop(&mut self) -> ExitStatus {
        let st = terminate(&mut self.child);
        self.exited = Some(st);
        st
    }
}

impl Drop for Rivorad {
    fn drop(&mut self) {
        if self.exited.is_none() {
            self.exited = Some(terminate(&mut self.child));
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
        let _ = rivora::daemon::cleanup(&self.pin_dir);
        let _ = fs::remove_dir_all(&self.pin_dir);
    }
}

/// (XDP program id, TCX egress program count) on `dev` in `ns`, asked of
/// the kernel through libbpf (Debian's bpftool does not know TCX).
fn attached(ns: &Netns, dev: &'static str) -> (u32, u32) {
    ns.run(move || {
        let idx = rivora::dataplane::attach::ifindex(dev).expect("interface in the namespace");
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
        (xdp_id, unsafe { opts.__bindgen_anon_1.count })
    })
}

// ---------------------------------------------------------------------
// The configuration file
// ---------------------------------------------------------------------

/// What a test's config holds; `yaml` renders it.
struct Conf<'a> {
    topo: &'a Topology,
    socket: PathBuf,
    /// Serving backends, by index into `topo.backends`.
    backends: Vec<usize>,
    /// VIPs: (IPv6?, protocol).
    vips: Vec<(bool, &'static str)>,
    health: &'static str,
    /// Extra top-level YAML (metrics, API listener).
    extra: String,
    /// Pad the text to this many bytes (same-length rewrites).
    pad_to: Option<usize>,
}

impl<'a> Conf<'a> {
    fn new(topo: &'a Topology, dir: &WorkDir) -> Self {
        Self {
            topo,
            socket: dir.socket(),
            backends: vec![0, 1, 2],
            vips: vec![(false, "tcp")],
            health: SLOW_HEALTH,
            extra: String::new(),
            pad_to: Some(4096),
        }
    }

    fn yaml(&self) -> String {
        let t = self.topo;
        let mode = match t.mode {
            Mode::Nat => "nat",
            Mode::Dsr => "dsr",
            Mode::L3Dsr => "l3dsr",
        };
        let mut y = format!(
            "interfaces:\n  - name: n0\n    xdpMode: native\n\
             node:\n  tunnelSource: {{ ipv4: {}, ipv6: \"{}\" }}\n\
             healthCheck: {}\n\
             api:\n  socket: {}\n{}\
             vips:\n",
            t.node_v4,
            t.node_v6,
            self.health,
            self.socket.display(),
            self.extra
        );
        for &(v6, proto) in &self.vips {
            let (addr, fam) = if v6 {
                (format!("\"{}\"", t.vip6), "6")
            } else {
                (t.vip4.to_string(), "4")
            };
            y += &format!(
                "  - name: {proto}{fam}\n    address: {addr}\n    port: {VIP_PORT}\n    \
                 protocol: {proto}\n    mode: {mode}\n"
            );
            if proto == "udp" {
                y += "    healthCheck: false\n";
            }
            y += "    backends:\n";
            for &i in &self.backends {
                y += &format!("      - {}\n", self.backend_entry(i, v6));
            }
        }
        if let Some(n) = self.pad_to {
            assert!(y.len() < n, "config longer than its padding");
            y += "# padding, so that rewrites keep the length:";
            while y.len() < n - 1 {
                y.push('.');
            }
            y.push('\n');
        }
        y
    }

    /// One backend, on one line (so that a test can break it and know the
    /// line). NAT backends listen on their own port; under DSR the first
    /// backend's MAC is given, the others' are left to rivorad to resolve.
    fn backend_entry(&self, i: usize, v6: bool) -> String {
        let b = &self.topo.backends[i];
        let addr = if v6 {
            format!("\"{}\"", b.v6)
        } else {
            b.v4.to_string()
        };
        match self.topo.mode {
            Mode::Nat => format!(
                "{{ address: {addr}, port: {} }}",
                common::lab::NAT_BACKEND_PORT
            ),
            Mode::Dsr if i == 0 => {
                let m = b.mac;
                format!(
                    "{{ address: {addr}, mac: \"{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}\" }}",
                    m[0], m[1], m[2], m[3], m[4], m[5]
                )
            }
            _ => format!("{{ address: {addr} }}"),
        }
    }
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the config"))
        + 1
}

// ---------------------------------------------------------------------
// Backend servers
// ---------------------------------------------------------------------

/// Wait until `fd` is readable or 50 ms pass; true if readable.
fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 50) > 0 }
}

/// One connection: every line gets "name|local|peer\n" back, until EOF or
/// the servers stop.
fn serve_conn(s: TcpStream, name: String, stop: Arc<AtomicBool>) {
    let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) if line.ends_with('\n') => {
                line.clear();
                let msg = format!("{name}|{}|{}\n", canonical(local), canonical(peer));
                if w.write_all(msg.as_bytes()).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// A UDP echo bound to one address (replies leave from it: the VIP under
/// DSR): "name|local|peer|payload".
fn udp_echo(name: String, stop: Arc<AtomicBool>, sock: UdpSocket) {
    let Ok(local) = sock.local_addr() else { return };
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        if !readable(sock.as_raw_fd()) {
            continue;
        }
        let Ok((n, peer)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let msg = format!(
            "{name}|{}|{}|{}",
            canonical(local),
            canonical(peer),
            String::from_utf8_lossy(&buf[..n])
        );
        let _ = sock.send_to(msg.as_bytes(), peer);
    }
}

/// A backend's TCP listener, which can be closed (new connections are
/// refused, as when its process dies) and opened again.
struct Listener {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// The servers of every backend; all stopped on drop.
struct Servers {
    listeners: Vec<Listener>,
    udp: Vec<JoinHandle<()>>,
    /// Stops connection threads and UDP echoes.
    stop_all: Arc<AtomicBool>,
}

fn start_listener(topo: &Topology, i: usize, stop_all: &Arc<AtomicBool>) -> Listener {
    let b = &topo.backends[i];
    let port = topo.backend_port();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<()>();
    let (name, st, conns_stop) = (b.name.clone(), stop.clone(), stop_all.clone());
    let handle = spawn_in(&b.ns, move || {
        // Dual-stack: IPv4 clients arrive as v4-mapped addresses.
        let l = TcpListener::bind(("::", port)).expect("binding a backend's TCP server");
        let _ = tx.send(());
        while !st.load(Ordering::Relaxed) {
            if !readable(l.as_raw_fd()) {
                continue;
            }
            if let Ok((s, _)) = l.accept() {
                let (name, cs) = (name.clone(), conns_stop.clone());
                // Inherits the backend's namespace (a thread of this one).
                std::thread::spawn(move || serve_conn(s, name, cs));
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("a backend's TCP server did not start");
    Listener {
        stop,
        handle: Some(handle),
    }
}

impl Servers {
    fn start(topo: &Topology, udp: bool) -> Self {
        let stop_all = Arc::new(AtomicBool::new(false));
        let listeners = (0..topo.backends.len())
            .map(|i| start_listener(topo, i, &stop_all))
            .collect();
        let mut handles = Vec::new();
        if udp {
            for b in &topo.backends {
                for v6 in [false, true] {
                    let local = SocketAddr::new(topo.backend_local(b, v6), topo.backend_port());
                    let (tx, rx) = mpsc::channel::<()>();
                    let (name, st) = (b.name.clone(), stop_all.clone());
                    handles.push(spawn_in(&b.ns, move || {
                        let sock = UdpSocket::bind(local)
                            .unwrap_or_else(|e| panic!("binding UDP on {local}: {e}"));
                        let _ = tx.send(());
                        udp_echo(name, st, sock)
                    }));
                    rx.recv_timeout(Duration::from_secs(5))
                        .expect("a backend's UDP echo did not start");
                }
            }
        }
        Self {
            listeners,
            udp: handles,
            stop_all,
        }
    }

    /// Close backend `i`'s listener; returns once it is closed.
    fn kill(&mut self, i: usize) {
        let l = &mut self.listeners[i];
        l.stop.store(true, Ordering::Relaxed);
        if let Some(h) = l.handle.take() {
            h.join().expect("backend listener thread panicked");
        }
    }

    fn restore(&mut self, topo: &Topology, i: usize) {
        assert!(self.listeners[i].handle.is_none(), "backend {i} is running");
        self.listeners[i] = start_listener(topo, i, &self.stop_all);
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop_all.store(true, Ordering::Relaxed);
        for l in &mut self.listeners {
            l.stop.store(true, Ordering::Relaxed);
            if let Some(h) = l.handle.take() {
                let _ = h.join();
            }
        }
        for h in self.udp.drain(..) {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------

/// One answer: which backend, and what it saw.
#[derive(Debug, Clone)]
struct Hit {
    backend: String,
    /// The client's own socket address.
    me: SocketAddr,
    /// Where the backend saw the request addressed to, and from.
    local: SocketAddr,
    peer: SocketAddr,
}

fn parse_answer(s: &str, me: SocketAddr) -> Result<Hit, String> {
    let mut it = s.trim_end().splitn(4, '|');
    let (Some(backend), Some(local), Some(peer)) = (it.next(), it.next(), it.next()) else {
        return Err(format!("malformed answer {s:?}"));
    };
    let addr = |a: &str| {
        a.parse::<SocketAddr>()
            .map_err(|e| format!("answer {s:?}: {a:?}: {e}"))
    };
    Ok(Hit {
        backend: backend.to_string(),
        me,
        local: addr(local)?,
        peer: addr(peer)?,
    })
}

/// A fresh TCP connection: one line out, one answer back.
fn tcp_once(vip: SocketAddr) -> Result<Hit, String> {
    let s = TcpStream::connect_timeout(&vip, STEP).map_err(|e| format!("connect: {e}"))?;
    let me = s.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    s.set_read_timeout(Some(STEP))
        .and_then(|_| s.set_write_timeout(Some(STEP)))
        .map_err(|e| format!("timeouts: {e}"))?;
    let mut w = s.try_clone().map_err(|e| format!("clone: {e}"))?;
    w.write_all(b"hello\n")
        .map_err(|e| format!("write from {me}: {e}"))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("no answer on {me}: {e}"))?;
    if line.is_empty() {
        return Err(format!("connection from {me} closed without an answer"));
    }
    parse_answer(&line, me)
}

/// A UDP exchange from a fresh socket, connected to the VIP (only the
/// VIP's answers reach it).
fn udp_once(vip: SocketAddr, token: &str) -> Result<Hit, String> {
    let any: SocketAddr = match vip {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("literal"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("literal"),
    };
    let s = UdpSocket::bind(any).map_err(|e| format!("bind: {e}"))?;
    s.connect(vip).map_err(|e| format!("connect: {e}"))?;
    let me = s.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    s.set_read_timeout(Some(STEP))
        .map_err(|e| format!("timeout: {e}"))?;
    s.send(token.as_bytes())
        .map_err(|e| format!("send from {me}: {e}"))?;
    let mut buf = [0u8; 1500];
    let n = s
        .recv(&mut buf)
        .map_err(|e| format!("no answer to {me}: {e}"))?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    if !text.ends_with(&format!("|{token}")) {
        return Err(format!("echo of {token:?} came back as {text:?}"));
    }
    parse_answer(&text, me)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

/// `n` exchanges from the client, `WORKERS` at a time; the first failure
/// stops new ones (a broken path costs one timeout per worker).
fn exchanges(topo: &Topology, vip: SocketAddr, proto: Proto, n: usize) -> Vec<Result<Hit, String>> {
    topo.client.run(move || {
        let failed = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (failed, next) = (failed.clone(), next.clone());
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n || failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let r = match proto {
                            Proto::Tcp => tcp_once(vip),
                            Proto::Udp => udp_once(vip, &format!("flow-{i}")),
                        };
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        out.push(r);
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("client worker panicked"))
            .collect()
    })
}

/// `FLOWS` exchanges must all succeed, each backend in `serving` must take
/// a fair share and every other backend none; the backend must have seen
/// the client's own address. Returns the counts.
fn assert_spread(
    topo: &Topology,
    what: &str,
    vip: SocketAddr,
    proto: Proto,
    serving: &[usize],
) -> BTreeMap<String, usize> {
    let t0 = Instant::now();
    let results = exchanges(topo, vip, proto, FLOWS);
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{what}: {proto:?} to {vip}: {} of {} failed (after {:?}); first: {:?}",
        failures.len(),
        results.len(),
        t0.elapsed(),
        &failures[..failures.len().min(3)]
    );
    assert_eq!(results.len(), FLOWS, "{what}: every flow ran");
    let mut counts: BTreeMap<String, usize> =
        topo.backends.iter().map(|b| (b.name.clone(), 0)).collect();
    for h in results.into_iter().flatten() {
        assert_eq!(
            h.peer,
            canonical(h.me),
            "{what}: backend {} did not see the client's own address",
            h.backend
        );
        *counts
            .get_mut(&h.backend)
            .unwrap_or_else(|| panic!("{what}: answer from unknown backend {h:?}")) += 1;
    }
    let min = (MIN_SHARE * FLOWS as f64).ceil() as usize;
    for (i, b) in topo.backends.iter().enumerate() {
        let n = counts[&b.name];
        if serving.contains(&i) {
            assert!(
                n >= min,
                "{what}: {proto:?} to {vip}: {} got {n} of {FLOWS}, below {min}; spread {counts:?}",
                b.name
            );
        } else {
            assert_eq!(
                n, 0,
                "{what}: {proto:?} to {vip}: {} is not serving but got {n}; spread {counts:?}",
                b.name
            );
        }
    }
    counts
}

fn vip4(topo: &Topology) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(topo.vip4), VIP_PORT)
}

fn vip6(topo: &Topology) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(topo.vip6), VIP_PORT)
}

/// The API's name of a VIP (`tcp/10.0.0.1:80`).
fn vip_name(proto: &str, vip: SocketAddr) -> String {
    format!("{proto}/{vip}")
}

/// How the API names backend `i` (its target: address and serving port).
fn target(topo: &Topology, i: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(topo.backends[i].v4), topo.backend_port())
}

// ---------------------------------------------------------------------
// 1. Each mode and family carries real traffic
// ---------------------------------------------------------------------

fn traffic(mode: Mode) {
    require_root();
    let t0 = Instant::now();
    let topo = Lab::topology(mode);
    let servers = Servers::start(&topo, true);
    let dir = WorkDir::new();
    let mut conf = Conf::new(&topo, &dir);
    conf.vips = vec![(false, "tcp"), (false, "udp"), (true, "tcp"), (true, "udp")];
    let mut rd = Rivorad::start(&topo.node, dir, &conf.yaml(), &[]);
    let setup = t0.elapsed();
    let (x, t) = attached(&topo.node, "n0");
    assert!(
        x != 0 && t == 1,
        "{mode:?}: XDP id {x}, TCX egress programs {t}"
    );

    let all = [0, 1, 2];
    let mut spread = Vec::new();
    // Datagrams the node's kernel forwarded during the UDP exchanges, per
    // family.
    let mut udp_forwarded = Vec::new();
    for (v6, vip) in [(false, vip4(&topo)), (true, vip6(&topo))] {
        for proto in [Proto::Tcp, Proto::Udp] {
            let what = format!("{mode:?}");
            let before = topo.node_forwarded();
            let counts = assert_spread(&topo, &what, vip, proto, &all);
            let after = topo.node_forwarded();
            if proto == Proto::Udp {
                udp_forwarded.push(if v6 {
                    after.1 - before.1
                } else {
                    after.0 - before.0
                });
            }
            spread.push((v6, proto, counts));
        }
    }
    // Where the backends saw the requests addressed to: their own address
    // and port under NAT, the VIP otherwise.
    let hits = exchanges(&topo, vip4(&topo), Proto::Tcp, 9);
    for h in hits {
        let h = h.expect("a TCP exchange");
        let b = topo
            .backends
            .iter()
            .find(|b| b.name == h.backend)
            .expect("known backend");
        assert_eq!(
            h.local,
            SocketAddr::new(topo.backend_local(b, false), topo.backend_port()),
            "{mode:?}: where {} saw the request addressed to",
            b.name
        );
    }

    // rivorad's own counters saw the traffic: every UDP request once, every
    // TCP connection at least twice (SYN, ACK).
    let n = FLOWS as u64;
    let p = |proto: &str, vip| rd.vip_packets(&vip_name(proto, vip));
    assert_eq!(p("udp", vip4(&topo)), n, "{mode:?}: v4 UDP packets counted");
    assert_eq!(p("udp", vip6(&topo)), n, "{mode:?}: v6 UDP packets counted");
    assert!(
        p("tcp", vip4(&topo)) >= 2 * (n + 9),
        "{mode:?}: v4 TCP packets"
    );
    assert!(p("tcp", vip6(&topo)) >= 2 * n, "{mode:?}: v6 TCP packets");

    match mode {
        Mode::Dsr => {
            // XDP_TX out, replies straight to the client: the node's kernel
            // forwarded nothing.
            assert_eq!(topo.node_forwarded(), (0, 0), "DSR: node kernel forwarded");
        }
        Mode::L3Dsr => {
            // Every packet rivorad's datapath tunnelled was decapsulated by
            // a backend's program, and each backend took part.
            let sent4 = p("tcp", vip4(&topo)) + p("udp", vip4(&topo));
            let sent6 = p("tcp", vip6(&topo)) + p("udp", vip6(&topo));
            let read = || -> Vec<_> {
                (0..topo.backends.len())
                    .map(|i| topo.decap_stats(i).expect("decap stats in an L3 DSR lab"))
                    .collect()
            };
            // The last FIN/ACKs may still be in flight: let them land.
            let stats = wait_for(Duration::from_secs(2), Duration::from_millis(20), || {
                let s = read();
                let d4: u64 = s.iter().map(|x| x.decap4).sum();
                let d6: u64 = s.iter().map(|x| x.decap6).sum();
                (d4 == sent4 && d6 == sent6).then_some(s)
            });
            let stats = stats.unwrap_or_else(|| {
                panic!(
                    "L3 DSR: decapsulated {:?} vs tunnelled ({sent4}, {sent6})",
                    read()
                )
            });
            for (b, s) in topo.backends.iter().zip(&stats) {
                assert!(s.decap4 > 0 && s.decap6 > 0, "{}: {s:?}", b.name);
                assert_eq!((s.not_vip, s.malformed), (0, 0), "{}: {s:?}", b.name);
            }
        }
        Mode::Nat => {
            // One request and one reply per UDP exchange: the kernel
            // forwards the replies, XDP the requests (the backends'
            // neighbours resolved by then), so about FLOWS per family,
            // not 2 * FLOWS. Slack for the TCP flows' last segments.
            let (least, most) = (FLOWS as u64, (FLOWS + FLOWS / 4) as u64);
            assert!(
                udp_forwarded.iter().all(|n| (least..=most).contains(n)),
                "NAT: the node's kernel forwarded {udp_forwarded:?} datagrams during \
                 {FLOWS} UDP exchanges per family, expected {least} to {most}"
            );
        }
    }

    // A clean stop detaches.
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st} on SIGTERM");
    assert_eq!(
        attached(&topo.node, "n0"),
        (0, 0),
        "{mode:?}: still attached after exit"
    );
    drop(servers);
    eprintln!(
        "{mode:?}: lab and rivorad up in {setup:?}, traffic in {:?}; spread {spread:?}",
        t0.elapsed() - setup
    );
}

#[test]
fn nat_traffic() {
    traffic(Mode::Nat);
}

#[test]
fn dsr_traffic() {
    traffic(Mode::Dsr);
}

#[test]
fn l3dsr_traffic() {
    traffic(Mode::L3Dsr);
}

// ---------------------------------------------------------------------
// 2. Health: a killed backend goes out, a restored one comes back
// ---------------------------------------------------------------------

/// One connection of the background load.
#[derive(Debug)]
struct Attempt {
    start: Instant,
    result: Result<String, String>,
}

/// New connections to `vip` from the client, one every 10 ms, until
/// `stop`.
fn background_load(
    topo: &Topology,
    vip: SocketAddr,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<Attempt>> {
    spawn_in(&topo.client, move || {
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            let result = tcp_once(vip).map(|h| h.backend);
            out.push(Attempt { start, result });
            std::thread::sleep(Duration::from_millis(10));
        }
        out
    })
}

#[test]
fn health_kill_and_restore() {
    require_root();
    let topo = Lab::topology(Mode::Nat);
    let mut servers = Servers::start(&topo, false);
    let dir = WorkDir::new();
    let mut conf = Conf::new(&topo, &dir);
    conf.health = FAST_HEALTH;
    let rd = Rivorad::start(&topo.node, dir, &conf.yaml(), &[]);
    let vip = vip4(&topo);
    let victim = 1;
    let vt = target(&topo, victim);
    let vname = topo.backends[victim].name.clone();
    // Probes have run: the backends are up by the checker's own word.
    let probed = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let list = rd.ctl_json(&["backend", "list"]);
        list.as_array()
            .expect("array")
            .iter()
            .all(|b| b["probe"] == "healthy")
            .then_some(())
    });
    assert!(
        probed.is_some(),
        "probes never reported every backend healthy"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let load = background_load(&topo, vip, stop.clone());
    std::thread::sleep(Duration::from_millis(800));

    // Kill: the listener is closed when this returns.
    servers.kill(victim);
    let killed = Instant::now();
    let out_bound = INTERVAL * FALL + TIMEOUT + SLACK;
    let seen_down = wait_for(Duration::from_secs(5), Duration::from_millis(25), || {
        (rd.health_of(vt) == "down").then(Instant::now)
    });
    let seen_down = seen_down.unwrap_or_else(|| panic!("{vname} never went down"));
    let took_out = seen_down - killed;

    // A reload while it is down does not bring it back.
    rd.sighup();
    let g = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "SIGHUP reload while a backend is down");
    assert_eq!(rd.health_of(vt), "down", "{vname} after a reload");
    std::thread::sleep(Duration::from_millis(1000));
    servers.restore(&topo, victim);
    let restored = Instant::now();
    let back_bound = INTERVAL * RISE + TIMEOUT + SLACK;
    let seen_up = wait_for(Duration::from_secs(5), Duration::from_millis(25), || {
        (rd.health_of(vt) == "healthy").then(Instant::now)
    });
    let seen_up = seen_up.unwrap_or_else(|| panic!("{vname} never came back"));
    let took_back = seen_up - restored;
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let attempts = load.join().expect("load thread");

    eprintln!(
        "health: out after {took_out:?} (bound {out_bound:?}), back after {took_back:?} \
         (bound {back_bound:?}); {} connections",
        attempts.len()
    );
    assert!(
        took_out <= out_bound,
        "{vname} taken out after {took_out:?}, over fall x interval + timeout + slack = {out_bound:?}"
    );
    assert!(
        took_back <= back_bound,
        "{vname} back after {took_back:?}, over rise x interval + timeout + slack = {back_bound:?}"
    );

    // The kill was real: connections hashed to the victim failed while the
    // checker had not yet taken it out...
    let failed: Vec<&Attempt> = attempts.iter().filter(|a| a.result.is_err()).collect();
    assert!(
        failed.iter().any(|a| a.start >= killed),
        "no connection failed after the kill: was the backend really stopped?"
    );
    // ...and from the moment rivorad reported it down, none failed.
    let late: Vec<&&Attempt> = failed.iter().filter(|a| a.start >= seen_down).collect();
    assert!(
        late.is_empty(),
        "{} new connection(s) failed after {vname} was reported down: {:?}",
        late.len(),
        late.iter().take(3).map(|a| &a.result).collect::<Vec<_>>()
    );
    // Out means out: nothing reached it until it was restored.
    let leaked = attempts
        .iter()
        .filter(|a| a.start >= seen_down && a.start < restored)
        .filter(|a| a.result.as_deref() == Ok(vname.as_str()))
        .count();
    assert_eq!(leaked, 0, "{vname} got new connections while down");
    // Back means back: a fair share of the connections after it.
    let after: Vec<&Attempt> = attempts.iter().filter(|a| a.start >= seen_up).collect();
    let to_victim = after
        .iter()
        .filter(|a| a.result.as_deref() == Ok(vname.as_str()))
        .count();
    assert!(
        after.len() >= 30 && to_victim * 10 >= after.len(),
        "{vname} got {to_victim} of the {} connections after it came back",
        after.len()
    );
}

// ---------------------------------------------------------------------
// 3. Drain: a long-lived connection keeps flowing, new ones go elsewhere
// ---------------------------------------------------------------------

/// A connection that exchanges a line every 20 ms until `stop`, recording
/// who answered; it gives up (recording why) at the first error.
struct LongLived {
    first: String,
    exchanges: Arc<AtomicUsize>,
    handle: JoinHandle<Result<Vec<String>, String>>,
}

fn long_lived(topo: &Topology, vip: SocketAddr, stop: Arc<AtomicBool>) -> LongLived {
    let exchanges = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<String>();
    let count = exchanges.clone();
    let handle = spawn_in(&topo.client, move || {
        let s = TcpStream::connect_timeout(&vip, STEP).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(STEP))
            .map_err(|e| format!("timeout: {e}"))?;
        let mut w = s.try_clone().map_err(|e| format!("clone: {e}"))?;
        let mut r = BufReader::new(s);
        let mut seen = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            w.write_all(b"ping\n")
                .map_err(|e| format!("write after {} exchanges: {e}", seen.len()))?;
            let mut line = String::new();
            r.read_line(&mut line)
                .map_err(|e| format!("read after {} exchanges: {e}", seen.len()))?;
            let name = line.split('|').next().unwrap_or("").to_string();
            if line.is_empty() {
                return Err(format!("closed after {} exchanges", seen.len()));
            }
            if seen.is_empty() {
                let _ = tx.send(name.clone());
            }
            seen.push(name);
            count.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(seen)
    });
    let first = rx
        .recv_timeout(STEP * 2)
        .expect("the long-lived connection got no first answer");
    LongLived {
        first,
        exchanges,
        handle,
    }
}

#[test]
fn drain_keeps_long_lived_connection() {
    require_root();
    let topo = Lab::topology(Mode::Nat);
    let servers = Servers::start(&topo, false);
    let dir = WorkDir::new();
    let conf = Conf::new(&topo, &dir);
    let rd = Rivorad::start(&topo.node, dir, &conf.yaml(), &[]);
    let vip = vip4(&topo);
    let all = [0, 1, 2];

    let stop = Arc::new(AtomicBool::new(false));
    let ll = long_lived(&topo, vip, stop.clone());
    let x = topo
        .backends
        .iter()
        .position(|b| b.name == ll.first)
        .expect("the long-lived connection's backend");
    let others: Vec<usize> = all.iter().copied().filter(|i| *i != x).collect();
    let xt = target(&topo, x).to_string();
    // The long-lived connection keeps exchanging through each phase: at
    // least 5 more exchanges (20 ms apart) before the phase ends.
    let progress = |phase: &str, before: usize| {
        let now = wait_for(Duration::from_secs(3), Duration::from_millis(10), || {
            let now = ll.exchanges.load(Ordering::Relaxed);
            (now >= before + 5).then_some(now)
        });
        now.unwrap_or_else(|| {
            panic!(
                "{phase}: the long-lived connection stalled after {} exchanges",
                ll.exchanges.load(Ordering::Relaxed) - before
            )
        })
    };

    let mut n = ll.exchanges.load(Ordering::Relaxed);
    assert_spread(&topo, "before the drain", vip, Proto::Tcp, &all);
    n = progress("before the drain", n);

    // Drained everywhere: the datapath marks it draining.
    rd.ctl_ok(&["drain", &xt]);
    assert_eq!(rd.health_of(target(&topo, x)), "draining");
    assert_spread(&topo, "drained", vip, Proto::Tcp, &others);
    n = progress("drained", n);
    // An operator drain outlives a reload.
    rd.sighup();
    let g = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "SIGHUP reload while drained");
    assert_eq!(rd.health_of(target(&topo, x)), "draining", "after a reload");
    assert_spread(&topo, "drained, reloaded", vip, Proto::Tcp, &others);
    n = progress("drained, reloaded", n);
    rd.ctl_ok(&["undrain", &xt]);
    assert_eq!(rd.health_of(target(&topo, x)), "healthy");
    assert_spread(&topo, "undrained", vip, Proto::Tcp, &all);
    n = progress("undrained", n);

    // Drained for this VIP only (weight 0 in its Maglev slice).
    let vn = vip_name("tcp", vip);
    rd.ctl_ok(&["drain", &xt, "--vip", &vn]);
    let shown = rd.ctl_json(&["vip", "show", &vn]);
    let drained: Vec<&Value> = shown["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter(|b| b["drained"] == true)
        .collect();
    assert_eq!(drained.len(), 1, "one backend drained for {vn}: {shown}");
    assert_eq!(drained[0]["target"], xt.as_str());
    assert_spread(&topo, "drained for the VIP", vip, Proto::Tcp, &others);
    n = progress("drained for the VIP", n);
    rd.ctl_ok(&["undrain", &xt, "--vip", &vn]);
    assert_spread(&topo, "undrained for the VIP", vip, Proto::Tcp, &all);
    progress("undrained for the VIP", n);

    stop.store(true, Ordering::Relaxed);
    let seen = ll
        .handle
        .join()
        .expect("long-lived thread")
        .unwrap_or_else(|e| panic!("the long-lived connection broke: {e}"));
    assert!(
        seen.iter().all(|b| *b == ll.first),
        "the long-lived connection moved between backends"
    );
    drop(servers);
}

// ---------------------------------------------------------------------
// 4. Reload: SIGHUP and a file edit apply a changed backend set
// ---------------------------------------------------------------------

#[test]
fn reload_applies_changed_backends() {
    require_root();
    let topo = Lab::topology(Mode::Nat);
    let servers = Servers::start(&topo, false);
    let dir = WorkDir::new();
    let mut conf = Conf::new(&topo, &dir);
    conf.backends = vec![0, 1];
    let rd = Rivorad::start(&topo.node, dir, &conf.yaml(), &[]);
    let vip = vip4(&topo);
    assert_eq!(rd.generation(), 1);
    assert_spread(&topo, "initial b1 b2", vip, Proto::Tcp, &[0, 1]);

    // b1 out, b3 in, by SIGHUP alone: the watcher cannot see this rewrite.
    conf.backends = vec![1, 2];
    rd.write_config_unseen(&conf.yaml());
    rd.sighup();
    let g = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "SIGHUP reload");
    assert_spread(&topo, "after SIGHUP: b2 b3", vip, Proto::Tcp, &[1, 2]);
    let st = rd.status();
    assert_eq!(st["last_reload"]["ok"], true, "{st}");
    // The datapath's load-time capacities, as loaded (defaults here).
    assert_eq!(st["maglev_size"], 65_537, "{st}");
    assert_eq!(st["flow_table_size"], 131_072, "{st}");
    let per_cpu = st["flow_table_per_cpu"].as_u64().unwrap_or(0);
    assert!(
        per_cpu > 0 && per_cpu <= 131_072 && 131_072 % per_cpu == 0,
        "each CPU keeps an equal share: {st}"
    );

    // b2 out, b1 back, by editing the file (no signal).
    conf.backends = vec![0, 2];
    rd.write_config(&conf.yaml());
    let g = wait_for(Duration::from_secs(4), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 3).then_some(g)
    });
    assert_eq!(g, Some(3), "file-change reload");
    assert_spread(&topo, "after the edit: b1 b3", vip, Proto::Tcp, &[0, 2]);
    // The SIGHUP rewrite was never picked up by the watcher as well.
    assert_eq!(rd.generation(), 3, "one reload per change");
    drop(servers);
}

// ---------------------------------------------------------------------
// 5. An invalid reload keeps the running state, shows and counts it
// ---------------------------------------------------------------------

/// GET `path` over HTTP/1.1 from inside `ns`; (status, headers + body).
fn http_get(ns: &Netns, addr: SocketAddr, path: &str, auth: Option<&str>) -> (u16, String) {
    http(ns, addr, "GET", path, auth)
}

fn http(
    ns: &Netns,
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
) -> (u16, String) {
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, STEP)
            .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        s.set_read_timeout(Some(STEP)).expect("timeout");
        s.write_all(req.as_bytes()).expect("writing the request");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("reading the response");
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        (code, text)
    })
}

/// `rivora_config_reloads_total{result="…"}` from the metrics endpoint.
fn reloads_metric(ns: &Netns, addr: SocketAddr, result: &str) -> u64 {
    let (code, text) = http_get(ns, addr, "/metrics", None);
    assert_eq!(code, 200, "GET /metrics: {text}");
    let prefix = format!("rivora_config_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix:?} in the metrics:\n{text}"))
}

#[test]
fn invalid_reload_keeps_forwarding() {
    require_root();
    let topo = Lab::topology(Mode::Nat);
    let servers = Servers::start(&topo, false);
    let dir = WorkDir::new();
    let mut conf = Conf::new(&topo, &dir);
    let metrics: SocketAddr = "127.0.0.1:9440".parse().expect("literal");
    conf.extra = format!("metrics:\n  listen: {metrics}\n");
    let good = conf.yaml();
    let rd = Rivorad::start(&topo.node, dir, &good, &[]);
    let vip = vip4(&topo);
    let all = [0, 1, 2];
    let cfg = rd.config.display().to_string();
    assert_spread(&topo, "valid config", vip, Proto::Tcp, &all);
    assert_eq!(reloads_metric(&topo.node, metrics, "failure"), 0);

    // A type error (a parse failure) on b2's line, seen by SIGHUP only.
    let b2 = topo.backends[1].v4.to_string();
    let b2_entry = conf.backend_entry(1, false);
    // Same length as the good file (the padding gives way).
    let bad1 = pad_like(
        &good.replacen(&b2_entry, &b2_entry.replace(" }", ", weight: heavy }"), 1),
        good.len(),
    );
    let line1 = line_of(&bad1, &format!("address: {b2}"));
    rd.write_config_unseen(&bad1);
    rd.sighup();
    let st = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        let st = rd.status();
        (st["last_reload"]["ok"] == false).then_some(st)
    })
    .expect("status never showed the failed reload");
    let err = st["last_reload"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        err.contains(&format!("{cfg}:{line1}")),
        "the reload error names {cfg}:{line1}: {err:?}"
    );
    assert_eq!(st["config_generation"], 1, "nothing applied: {st}");
    assert_eq!(reloads_metric(&topo.node, metrics, "failure"), 1);
    assert_spread(&topo, "after a failed SIGHUP reload", vip, Proto::Tcp, &all);

    // A validation error (weight over the maximum) on b3's line, by edit:
    // the watcher's reload fails the same way.
    let b3 = topo.backends[2].v4.to_string();
    let b3_entry = conf.backend_entry(2, false);
    let bad2 = good.replacen(&b3_entry, &b3_entry.replace(" }", ", weight: 5000000 }"), 1);
    let line2 = line_of(&bad2, &format!("address: {b3}"));
    rd.write_config(&bad2);
    let failures = wait_for(Duration::from_secs(4), Duration::from_millis(100), || {
        let n = reloads_metric(&topo.node, metrics, "failure");
        (n >= 2).then_some(n)
    });
    assert_eq!(failures, Some(2), "failed reloads counted after the edit");
    let st = rd.status();
    let err = st["last_reload"]["error"].as_str().unwrap_or_default();
    assert_eq!(st["last_reload"]["ok"], false, "{st}");
    assert!(
        err.contains(&format!("{cfg}:{line2}")) && err.contains("weight"),
        "the reload error names {cfg}:{line2} and the field: {err:?}"
    );
    assert_spread(&topo, "after a failed edit reload", vip, Proto::Tcp, &all);

    // Through the API as well: rivoractl reload fails, naming the file.
    let out = rd.ctl(&["reload"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "rivoractl reload of an invalid file"
    );
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains(&format!("{cfg}:{line2}")),
        "rivoractl reload: {msg}"
    );
    assert_eq!(reloads_metric(&topo.node, metrics, "failure"), 3);
    assert_eq!(reloads_metric(&topo.node, metrics, "success"), 0);
    assert_eq!(rd.generation(), 1);

    // A valid file again (b2 removed) applies.
    conf.backends = vec![0, 2];
    rd.write_config(&conf.yaml());
    let g = wait_for(Duration::from_secs(4), Duration::from_millis(50), || {
        let g = rd.generation();
        (g >= 2).then_some(g)
    });
    assert_eq!(g, Some(2), "a valid file after failures applies");
    assert_eq!(rd.status()["last_reload"]["ok"], true);
    assert_eq!(reloads_metric(&topo.node, metrics, "success"), 1);
    assert_spread(&topo, "valid again: b1 b3", vip, Proto::Tcp, &[0, 2]);
    drop(servers);
}

/// `text` with its padding dots trimmed or extended to `len` bytes.
fn pad_like(text: &str, len: usize) -> String {
    let (head, pad) = text.split_once("# padding").expect("a padded config");
    let comment = pad.trim_end_matches(['.', '\n']);
    let mut out = format!("{head}# padding{comment}");
    assert!(out.len() < len, "no room in the padding");
    while out.len() < len - 1 {
        out.push('.');
    }
    out.push('\n');
    out
}

// ---------------------------------------------------------------------
// 6. The API refuses callers without permission or token
// ---------------------------------------------------------------------

/// A namespace with one veth pair (`v0` up): enough for rivorad to attach.
fn small_ns(prefix: &str) -> Netns {
    let ns = Netns::new(&unique(prefix));
    ns.exec("ip link add v0 type veth peer name v1 && ip link set v1 up && ip link set v0 up");
    ns
}

const NOBODY: u32 = 65534;

/// Connect to the Unix socket at `path` from a child that dropped to uid
/// and gid 65534 first. Returns 0 if it connected, else the errno of
/// connect; 101-104 mean the child could not even try (setup).
fn connect_as_nobody(path: &Path) -> i32 {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: an all-zero sockaddr_un is valid; the path fits (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let cpath = CString::new(bytes).expect("no NUL in the path");
    // SAFETY: fork in a threaded process; the child only makes
    // async-signal-safe calls (setgroups, setgid, setuid, stat, socket,
    // connect, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
                || libc::geteuid() != NOBODY
            {
                libc::_exit(101);
            }
            // The path itself is reachable: a refusal is the socket's mode.
            let mut st: libc::stat = std::mem::zeroed();
            if libc::stat(cpath.as_ptr(), &mut st) != 0 {
                libc::_exit(102);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                libc::_exit(103);
            }
            let rc = libc::connect(
                fd,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            if rc == 0 {
                libc::_exit(0);
            }
            let e = *libc::__errno_location();
            libc::_exit(if (1..100).contains(&e) { e } else { 104 });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status),
        "the uid-65534 child did not exit normally"
    );
    libc::WEXITSTATUS(status)
}

#[test]
fn api_refuses_unauthorised_callers() {
    require_root();
    let ns = small_ns("rvd-api-");
    let dir = WorkDir::new();
    let token = "s3cret-token-of-the-test";
    let token_file = dir.0.join("token");
    fs::write(&token_file, format!("{token}\n")).expect("writing the token");
    fs::set_permissions(&token_file, fs::Permissions::from_mode(0o600)).expect("chmod token");
    let listen: SocketAddr = "127.0.0.1:9441".parse().expect("literal");
    let yaml = format!(
        "interfaces:\n  - name: v0\napi:\n  socket: {}\n  listen: {listen}\n  tokenFile: {}\nvips: []\n",
        dir.socket().display(),
        token_file.display()
    );
    let mut rd = Rivorad::start(&ns, dir, &yaml, &[]);
    let (x, t) = attached(&ns, "v0");
    assert!(x != 0 && t == 1, "attached: XDP id {x}, TCX {t}");

    // The Unix socket: root gets in, uid 65534 is refused by its mode.
    let st = rd.status();
    assert_eq!(st["config_generation"], 1, "{st}");
    assert_eq!(
        connect_as_nobody(&rd.socket),
        libc::EACCES,
        "connect as uid 65534 (0: it got in; 101-104: the child could not try)"
    );
    let mode = fs::metadata(&rd.socket)
        .expect("socket metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");

    // The TCP listener: 401 without a token or with a wrong one, for reads
    // and writes alike; the right token gets in.
    let (code, text) = http_get(&ns, listen, "/v1/status", None);
    assert_eq!(code, 401, "no token: {text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "401 names the scheme: {text}"
    );
    let (code, text) = http_get(&ns, listen, "/v1/status", Some("Bearer wrong-token"));
    assert_eq!(code, 401, "wrong token: {text}");
    let (code, text) = http_get(&ns, listen, "/v1/status", Some(token));
    assert_eq!(code, 401, "token without the Bearer scheme: {text}");
    let (code, text) = http(
        &ns,
        listen,
        "POST",
        "/v1/reload",
        Some("Bearer wrong-token"),
    );
    assert_eq!(code, 401, "a write with a wrong token: {text}");
    assert_eq!(rd.generation(), 1, "the refused reload did not run");
    let (code, text) = http_get(&ns, listen, "/v1/status", Some(&format!("Bearer {token}")));
    assert_eq!(code, 200, "right token: {text}");
    assert!(
        text.contains("\"config_generation\":1"),
        "status body: {text}"
    );

    // A clean stop detaches from v0.
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st}");
    assert_eq!(attached(&ns, "v0"), (0, 0), "still attached after exit");
}

// ---------------------------------------------------------------------
// 7. An invalid file at start: non-zero exit naming it, nothing changed
// ---------------------------------------------------------------------

#[test]
fn invalid_config_at_start_changes_nothing() {
    require_root();
    let ns = small_ns("rvd-bad-");
    let dir = WorkDir::new();
    let base = format!(
        "interfaces:\n  - name: v0\napi:\n  socket: {}\nvips:\n  - name: web\n    address: 10.9.0.1\n    \
         port: 80\n    protocol: tcp\n    mode: nat\n    backends:\n      - {{ address: 10.9.1.1, port: 8080 }}\n",
        dir.socket().display()
    );
    let cases = [
        // A parse error: an unknown mode.
        (
            "mode: bogus",
            base.replace("mode: nat", "mode: bogus"),
            "mode: bogus",
        ),
        // A validation error: a weight over the maximum.
        (
            "weight 5000000",
            base.replace("port: 8080 }", "port: 8080, weight: 5000000 }"),
            "address: 10.9.1.1",
        ),
    ];
    for (i, (what, yaml, needle)) in cases.into_iter().enumerate() {
        let config = dir.config();
        fs::write(&config, &yaml).expect("writing the config");
        let line = line_of(&yaml, needle);
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/{}", unique("rivorad-e2e-bad-")));
        let log = dir.0.join(format!("rivorad-{i}.log"));
        let mut child = spawn_rivorad(&ns.name, &config, &pin_dir, &log, &[]);
        let status = wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
            child.try_wait().expect("waiting for rivorad")
        });
        let status = status.unwrap_or_else(|| {
            let st = terminate(&mut child);
            let _ = rivora::daemon::cleanup(&pin_dir);
            panic!("{what}: rivorad still running after 10 s ({st})");
        });
        let text = fs::read_to_string(&log).unwrap_or_default();
        let created = pin_dir.exists();
        let _ = rivora::daemon::cleanup(&pin_dir);
        let _ = fs::remove_dir_all(&pin_dir);
        assert!(
            !status.success(),
            "{what}: rivorad exited {status}:\n{text}"
        );
        let at = format!("{}:{line}", config.display());
        assert!(text.contains(&at), "{what}: the error names {at}:\n{text}");
        assert!(!created, "{what}: rivorad created its pin directory");
        assert!(!dir.socket().exists(), "{what}: rivorad created its socket");
        assert_eq!(
            attached(&ns, "v0"),
            (0, 0),
            "{what}: something attached to v0"
        );
    }
}

// ---------------------------------------------------------------------
// 8. Restart: -persist-datapath forwards while rivorad is down; the next
//    start adopts (IDs kept) and removes what the file no longer lists
// ---------------------------------------------------------------------

/// Service id of each VIP rivorad reports, by VIP name.
fn service_ids(rd: &Rivorad) -> BTreeMap<String, u64> {
    rd.ctl_json(&["vip", "list"])
        .as_array()
        .expect("vip list is an array")
        .iter()
        .map(|v| {
            (
                v["vip"].as_str().expect("vip name").to_string(),
                v["service_id"].as_u64().expect("service_id"),
            )
        })
        .collect()
}

#[test]
fn restart_persists_and_adopts() {
    require_root();
    let topo = Lab::topology(Mode::Nat);
    let servers = Servers::start(&topo, true);
    let dir = WorkDir::new();
    let mut conf = Conf::new(&topo, &dir);
    conf.vips = vec![(false, "tcp"), (true, "tcp")];
    let persist = ["-persist-datapath"];
    let mut rd = Rivorad::start(&topo.node, dir, &conf.yaml(), &persist);
    let all = [0, 1, 2];
    let (tcp4, tcp6, udp4) = (
        vip_name("tcp", vip4(&topo)),
        vip_name("tcp", vip6(&topo)),
        vip_name("udp", vip4(&topo)),
    );
    let before = service_ids(&rd);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        [&tcp4, &tcp6],
        "VIPs at the first start"
    );

    // Down, with its links pinned: the datapath still forwards.
    let st = rd.stop();
    assert!(st.success(), "rivorad exited with {st}");
    let (x, t) = attached(&topo.node, "n0");
    assert!(
        x != 0 && t == 1,
        "pinned links stay attached: XDP {x}, TCX {t}"
    );
    assert_spread(&topo, "rivorad down", vip4(&topo), Proto::Tcp, &all);
    assert_spread(&topo, "rivorad down", vip6(&topo), Proto::Tcp, &all);

    // Started again on a changed file: the IPv6 VIP is gone, a UDP VIP new.
    conf.vips = vec![(false, "tcp"), (false, "udp")];
    fs::write(&rd.config, conf.yaml()).expect("rewriting the config");
    rd.restart(&persist);
    assert!(
        rd.log_text()
            .contains("took over the pinned link: program swapped in place"),
        "the restart swapped the programs behind the pinned links"
    );
    let after = service_ids(&rd);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        [&tcp4, &udp4],
        "VIPs after the restart"
    );
    assert_eq!(after[&tcp4], before[&tcp4], "the adopted VIP kept its id");
    assert_spread(&topo, "restarted", vip4(&topo), Proto::Tcp, &all);
    assert_spread(&topo, "restarted", vip4(&topo), Proto::Udp, &all);
    // The VIP the file dropped no longer reaches any backend.
    let gone = exchanges(&topo, vip6(&topo), Proto::Tcp, 1);
    assert!(
        gone.iter().all(|r| r.is_err()),
        "the removed IPv6 VIP still answers: {gone:?}"
    );
    drop(servers);
}
