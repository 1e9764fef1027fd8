//! A lab for the real rivorad binary: the namespaces of `common::lab`
//! (client, switch, node, three backends on one bridge) but no datapath
//! of the test's own: rivorad, run inside the node namespace, loads,
//! pins and attaches it. IPv4 only; NAT and DSR VIPs side by side.
//!
//! Backends serve NAT (their own address, port 8080) and DSR (the DSR VIP
//! on `lo`, port 80) at once, so their replies must leave two ways: NAT
//! replies through the node (whose tc_nat restores the VIP), DSR replies
//! straight to the client. A source-address rule does it: replies from
//! the DSR VIP use a table where the client subnet is on-link.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rivora::dataplane::attach::ifindex;
use rivora::dataplane::AttachedLink;
use rivora::decap::Decap;

use super::netns::Netns;
use super::unique;

pub struct RBackend {
    pub name: String,
    pub ns: Netns,
    pub v4: Ipv4Addr,
    pub mac: String,
}

/// Field order is drop order: the rivorad processes are the caller's and
/// must go first; here the XDP pass program, then the pins, then the
/// namespaces (which take the veths, and so any link left, with them).
pub struct RLab {
    _pass_link: AttachedLink,
    _pass: Decap,
    pub pins: PinGuard,
    pub work: TempDir,
    pub backends: Vec<RBackend>,
    pub client: Netns,
    pub node: Netns,
    pub switch: Netns,
    pub n: u32,
    pub client_v4: Ipv4Addr,
    pub node_v4: Ipv4Addr,
}

/// Everything under a pin directory, removed on drop: links detached
/// first (a pinned link outlives its interface's namespace otherwise).
pub struct PinGuard(pub PathBuf);

impl Drop for PinGuard {
    fn drop(&mut self) {
        let _ = rivora::daemon::cleanup(&self.0);
    }
}

pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn sysctls(ns: &Netns, settings: &[(&str, &str)]) {
    let cmd: Vec<String> = settings
        .iter()
        .map(|(k, v)| format!("echo {v} > /proc/sys/{}", k.replace('.', "/")))
        .collect();
    ns.exec(&cmd.join(" && "));
}

impl RLab {
    pub fn new() -> Self {
        // Only for reading addresses in a dump: the namespaces already
        // keep labs apart.
        let n = (std::process::id() + LABS.fetch_add(1, Ordering::Relaxed)) % 200 + 20;
        let node_c4: Ipv4Addr = format!("10.{n}.1.1").parse().expect("addr");
        let node_v4: Ipv4Addr = format!("10.{n}.2.1").parse().expect("addr");
        let client_v4: Ipv4Addr = format!("10.{n}.1.2").parse().expect("addr");
        let work = TempDir(std::env::temp_dir().join(unique("rivora-restart-")));
        fs::create_dir_all(&work.0).expect("work dir");
        let pins = PinGuard(PathBuf::from(format!(
            "/sys/fs/bpf/{}",
            unique("rivora-restart-")
        )));

        let switch = Netns::new(&unique("rvr-sw-"));
        let node = Netns::new(&unique("rvr-node-"));
        let client = Netns::new(&unique("rvr-cl-"));
        let bns: Vec<Netns> = (1..=3)
            .map(|i| Netns::new(&unique(&format!("rvr-b{i}-"))))
            .collect();
        for ns in [&switch, &node, &client].into_iter().chain(bns.iter()) {
            sysctls(
                ns,
                &[
                    ("net.ipv4.conf.all.accept_redirects", "0"),
                    ("net.ipv4.conf.default.accept_redirects", "0"),
                ],
            );
        }
        switch
            .exec("ip link add br0 type bridge stp_state 0 mcast_snooping 0 && ip link set br0 up");
        let plug = |port: &str, ns: &Netns, dev: &str| {
            switch.exec(&format!(
                "ip link add {port} type veth peer name {dev} netns {peer} && \
                 ip link set {port} master br0 && ip link set {port} up",
                peer = ns.name
            ));
            ns.exec(&format!("ip link set {dev} up"));
        };
        plug("pn", &node, "n0");
        plug("pc", &client, "c0");
        for (i, ns) in bns.iter().enumerate() {
            plug(&format!("pb{}", i + 1), ns, "b0");
        }
        sysctls(
            &node,
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv4.conf.all.send_redirects", "0"),
                ("net.ipv4.conf.default.send_redirects", "0"),
                ("net.ipv4.conf.n0.send_redirects", "0"),
            ],
        );
        node.exec(&format!(
            "ip addr add {node_c4}/24 dev n0 && ip addr add {node_v4}/24 dev n0"
        ));
        // VIPs are 10.n.100.0/24. The client's TX checksum offload is off:
        // a partial checksum does not survive the node's XDP_TX.
        client.exec(&format!(
            "ip addr add {client_v4}/24 dev c0 && \
             ip route add 10.{n}.100.0/24 via {node_c4} && \
             ip route add 10.{n}.2.0/24 via {node_c4} && \
             ethtool -K c0 tx off >/dev/null"
        ));
        let dsr_vip = format!("10.{n}.100.2");
        let mut backends = Vec::new();
        for (i, ns) in bns.into_iter().enumerate() {
            let v4: Ipv4Addr = format!("10.{n}.2.{}", 11 + i).parse().expect("addr");
            ns.exec(&format!(
                "ip addr add {v4}/24 dev b0 && \
                 echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore && \
                 echo 2 > /proc/sys/net/ipv4/conf/all/arp_announce && \
                 ip addr add {dsr_vip}/32 dev lo && \
                 ip route add 10.{n}.1.0/24 via {node_v4} && \
                 ip route add 10.{n}.1.0/24 dev b0 table 100 && \
                 ip rule add from {dsr_vip} lookup 100"
            ));
            let out = ns.exec("ip -o link show dev b0");
            let mac = out
                .split_whitespace()
                .skip_while(|w| *w != "link/ether")
                .nth(1)
                .unwrap_or_else(|| panic!("no link/ether in `{out}`"))
                .to_string();
            backends.push(RBackend {
                name: format!("b{}", i + 1),
                ns,
                v4,
                mac,
            });
        }
        // XDP_TX out of n0 lands on its peer, which must run XDP itself.
        let pass = Decap::load().expect("loading the decap object");
        let progs = pass.progs().expect("decap program fds");
        let pass_link = switch.run(move || {
            progs
                .attach_pass(ifindex("pn").expect("pn in the switch"))
                .expect("xdp_pass on pn")
        });
        RLab {
            _pass_link: pass_link,
            _pass: pass,
            pins,
            work,
            backends,
            client,
            node,
            switch,
            n,
            client_v4,
            node_v4,
        }
    }

    pub fn vip(&self, last: u8) -> Ipv4Addr {
        format!("10.{}.100.{last}", self.n).parse().expect("addr")
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pins.0
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.work.0.join(name)
    }

    pub fn socket(&self) -> PathBuf {
        self.path("rivorad.sock")
    }
}

static LABS: AtomicU32 = AtomicU32::new(0);

/// A rivorad process in the node namespace, SIGKILLed on drop if still
/// running (a failing test leaves no daemon behind).
pub struct Rivorad {
    pub child: Child,
    pub log: PathBuf,
    pub started: Instant,
}

impl Rivorad {
    /// Start `bin` in `ns` with `args`; stderr goes to `log`.
    pub fn spawn(bin: &Path, ns: &Netns, args: &[String], log: &Path) -> Self {
        let err = File::create(log).expect("log file");
        let started = Instant::now();
        // nsenter execs the binary: the child's pid is rivorad's.
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", ns.name))
            .arg(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawning rivorad");
        Self {
            child,
            log: log.to_path_buf(),
            started,
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for the "ready" line (JSON log format); panics with the log
    /// if rivorad exits or `timeout` passes first. Returns the time from
    /// spawn to ready.
    pub fn wait_ready(&mut self, timeout: Duration) -> Duration {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(f) = File::open(&self.log) {
                for line in BufReader::new(f).lines().map_while(Result::ok) {
                    if line.contains(r#""message":"ready""#) {
                        return self.started.elapsed();
                    }
                }
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("rivorad exited ({st}) before ready:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "rivorad not ready after {timeout:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Signal and wait for the exit (bounded); returns the exit status.
    pub fn stop(&mut self, sig: i32, timeout: Duration) -> std::process::ExitStatus {
        self.signal(sig);
        self.wait_exit(timeout)
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("waiting for rivorad") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "rivorad did not exit within {timeout:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Rivorad {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The program behind a pinned link: (program id, tag as hex).
pub fn link_prog(pin: &Path) -> Option<(u32, String)> {
    let link = AttachedLink::open_pinned(pin, rivora::dataplane::AttachPoint::Xdp, 0).ok()?;
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

/// Programs attached to `dev` in `ns`: (XDP attached?, TCX egress count).
pub fn attached(ns: &Netns, dev: &'static str) -> (bool, u32) {
    ns.run(move || {
        let idx = ifindex(dev).expect("device");
        let xdp = rivora::dataplane::attach::xdp_attached_mode(idx)
            .expect("querying XDP")
            .is_some();
        // SAFETY: zeroed opts with sz set; count only (no id buffer).
        let mut opts: libbpf_sys::bpf_prog_query_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<libbpf_sys::bpf_prog_query_opts>() as _;
        // SAFETY: valid opts.
        let rc = unsafe {
            libbpf_sys::bpf_prog_query_opts(idx as i32, libbpf_sys::BPF_TCX_EGRESS, &mut opts)
        };
        assert_eq!(rc, 0, "querying TCX egress");
        // SAFETY: both union members are the same u32.
        (xdp, unsafe { opts.__bindgen_anon_1.count })
    })
}
