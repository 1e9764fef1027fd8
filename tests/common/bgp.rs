//! Real BGP peers for the end-to-end tests, each in a namespace of its
//! own joined to the node by a veth: BIRD 2 (`bird`, read with `birdc`),
//! FRR (`zebra` + `bgpd` with `-N`, read with `vtysh -N ... json`) and
//! GoBGP (`gobgpd`, read with `gobgp ... -j`). Every daemon is stopped
//! and its files removed on drop.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use super::netns::{sh, Netns};
use super::unique;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bird,
    Frr,
    Gobgp,
}

/// One router: its namespace, its addresses on the link to the node
/// (`.1`) and the node's (`.2`), its daemons.
pub struct Router {
    pub kind: Kind,
    pub ns: Netns,
    pub v4: String,
    pub v6: String,
    pub node_v4: String,
    pub node_v6: String,
    /// The node's end of the link.
    pub node_dev: String,
    dir: PathBuf,
    children: Vec<Child>,
    pids: Vec<PathBuf>,
    frr_name: Option<String>,
}

impl Router {
    /// A router namespace linked to `node` on subnet `10.N.S.0/24`,
    /// `fd00:N:S::/64`; no daemon yet.
    pub fn new(kind: Kind, node: &Netns, n: u32, s: u32) -> Self {
        let n6 = format!("{n:x}");
        let (v4, v6) = (format!("10.{n}.{s}.1"), format!("fd00:{n6}:{s}::1"));
        let (node_v4, node_v6) = (format!("10.{n}.{s}.2"), format!("fd00:{n6}:{s}::2"));
        let node_dev = format!("bg{s}");
        let r = Self::bare(kind, &v4, &v6, &node_v4, &node_v6, &node_dev);
        sh(&format!(
            "ip link add {node_dev} netns {} type veth peer name r0 netns {}",
            node.name, r.ns.name
        ));
        r.ns.exec(&format!(
            "ip link set r0 up && ip addr add {v4}/24 dev r0 && ip addr add {v6}/64 dev r0 nodad"
        ));
        node.exec(&format!(
            "ip link set {node_dev} up && ip addr add {node_v4}/24 dev {node_dev} && ip addr add {node_v6}/64 dev {node_dev} nodad"
        ));
        r
    }

    /// The namespace and the work directory, no link: the caller wires
    /// the router (its address `v4`/`v6`; the node's, for reading).
    pub fn bare(
        kind: Kind,
        v4: &str,
        v6: &str,
        node_v4: &str,
        node_v6: &str,
        node_dev: &str,
    ) -> Self {
        let ns = Netns::new(&unique("rvbgp-r-"));
        ns.exec(
            "echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad; echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad",
        );
        let dir = std::env::temp_dir().join(unique("rvbgp-"));
        fs::create_dir_all(&dir).expect("router dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        Self {
            kind,
            ns,
            v4: v4.to_string(),
            v6: v6.to_string(),
            node_v4: node_v4.to_string(),
            node_v6: node_v6.to_string(),
            node_dev: node_dev.to_string(),
            dir,
            children: Vec::new(),
            pids: Vec::new(),
            frr_name: None,
        }
    }

    fn spawn(&mut self, cmd: &str) {
        let log =
            fs::File::create(self.dir.join(format!("d{}.log", self.children.len()))).expect("log");
        let c = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path()))
            .args(["sh", "-c", &format!("exec {cmd}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning a BGP daemon");
        self.children.push(c);
    }

    /// Start the daemon with sessions to `neighbors` (address, ASN,
    /// password, BFD) from AS 65000.
    pub fn start(&mut self, neighbors: &[(&str, u32, Option<&str>, bool)]) {
        match self.kind {
            Kind::Bird => {
                let mut conf = format!("router id {};\nprotocol device {{}}\n", self.v4);
                let bfd = neighbors.iter().any(|n| n.3);
                if bfd {
                    conf += "protocol bfd { interface \"*\" { min rx interval 300 ms; min tx interval 300 ms; multiplier 3; }; }\n";
                }
                for (i, (addr, asn, pw, bfd)) in neighbors.iter().enumerate() {
                    let v6 = addr.contains(':');
                    let local = if v6 { &self.v6 } else { &self.v4 };
                    let fam = if v6 { "ipv6" } else { "ipv4" };
                    let pw = pw.map(|p| format!("password \"{p}\";")).unwrap_or_default();
                    let bfd = if *bfd { "bfd on;" } else { "" };
                    conf += &format!(
                        "protocol bgp p{i} {{ local {local} as 65000; neighbor {addr} as {asn}; graceful restart on; {pw} {bfd} {fam} {{ import all; export none; }}; }}\n"
                    );
                }
                fs::write(self.dir.join("bird.conf"), conf).expect("bird.conf");
                let (c, s) = (self.dir.join("bird.conf"), self.dir.join("bird.ctl"));
                self.spawn(&format!("bird -f -c {} -s {}", c.display(), s.display()));
            }
            Kind::Gobgp => {
                let mut conf = format!(
                    "[global.config]\n  as = 65000\n  router-id = \"{}\"\n  port = 179\n",
                    self.v4
                );
                for (addr, asn, pw, _) in neighbors {
                    let fam = if addr.contains(':') {
                        "ipv6-unicast"
                    } else {
                        "ipv4-unicast"
                    };
                    let pw = pw
                        .map(|p| format!("    auth-password = \"{p}\"\n"))
                        .unwrap_or_default();
                    conf += &format!(
                        "[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{addr}\"\n    peer-as = {asn}\n{pw}  [neighbors.graceful-restart.config]\n    enabled = true\n  [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"{fam}\"\n"
                    );
                }
                fs::write(self.dir.join("gobgp.toml"), conf).expect("gobgp.toml");
                let c = self.dir.join("gobgp.toml");
                self.spawn(&format!(
                    "gobgpd -f {} --api-hosts 127.0.0.1:50051",
                    c.display()
                ));
            }
            Kind::Frr => {
                let name = unique("rvf");
                let mut conf = format!(
                    "frr defaults traditional\nhostname {name}\nrouter bgp 65000\n bgp router-id {}\n no bgp ebgp-requires-policy\n bgp graceful-restart\n",
                    self.v4
                );
                for (addr, asn, pw, bfd) in neighbors {
                    conf += &format!(
                        " neighbor {addr} remote-as {asn}\n neighbor {addr} timers connect 1\n"
                    );
                    if let Some(p) = pw {
                        conf += &format!(" neighbor {addr} password {p}\n");
                    }
                    if *bfd {
                        conf += &format!(" neighbor {addr} bfd\n");
                    }
                }
                for fam in ["ipv4", "ipv6"] {
                    conf += &format!(" address-family {fam} unicast\n");
                    for (addr, ..) in neighbors {
                        if addr.contains(':') == (fam == "ipv6") {
                            conf += &format!("  neighbor {addr} activate\n");
                        } else {
                            conf += &format!("  no neighbor {addr} activate\n");
                        }
                    }
                    conf += " exit-address-family\n";
                }
                if neighbors.iter().any(|n| n.3) {
                    conf += "bfd\n";
                    for (addr, _, _, bfd) in neighbors {
                        if *bfd {
                            conf += &format!(" peer {addr}\n  receive-interval 300\n  transmit-interval 300\n  detect-multiplier 3\n exit\n");
                        }
                    }
                }
                self.start_frr(&name, &conf, neighbors.iter().any(|n| n.3));
            }
        }
    }

    /// FRR with `conf` (after `frr defaults` and `hostname`, which this
    /// adds): zebra, bgpd and, with `bfd`, bfdd, as instance `name`.
    pub fn start_frr(&mut self, name: &str, conf: &str, bfd: bool) {
        assert_eq!(self.kind, Kind::Frr);
        let run = PathBuf::from(format!("/var/run/frr/{name}"));
        fs::create_dir_all(&run).expect("frr run dir");
        sh(&format!(
            "chown frr:frr {} {}",
            run.display(),
            self.dir.display()
        ));
        let f = self.dir.join("frr.conf");
        let conf = if conf.starts_with("frr defaults") {
            conf.to_string()
        } else {
            format!("frr defaults traditional\nhostname {name}\n{conf}")
        };
        fs::write(&f, conf).expect("frr.conf");
        sh(&format!("chown frr:frr {}", f.display()));
        let mut daemons = vec!["zebra", "bgpd"];
        if bfd {
            daemons.push("bfdd");
        }
        // Known before the daemons start: a panic on the way still
        // stops them on drop.
        self.frr_name = Some(name.to_string());
        for d in daemons {
            let pid = self.dir.join(format!("{d}.pid"));
            self.pids.push(pid.clone());
            self.ns.exec(&format!(
                "/usr/lib/frr/{d} -N {name} -u frr -g frr -d -f {} -i {} >/dev/null 2>&1",
                f.display(),
                pid.display()
            ));
        }
    }

    /// FRR: the paths of `prefix` in the BGP table, as (next hop, stale).
    pub fn bgp_paths(&self, prefix: &str) -> Vec<(String, bool)> {
        let fam = if prefix.contains(':') { "ipv6" } else { "ipv4" };
        let v: serde_json::Value =
            serde_json::from_str(&self.vtysh(&format!("show bgp {fam} unicast {prefix} json")))
                .unwrap_or_default();
        v["paths"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| {
                        let hop = p["nexthops"][0]["ip"].as_str().unwrap_or("").to_string();
                        (hop, p["stale"] == true)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The next hops of `prefix` in this namespace's kernel FIB (what
    /// zebra installed), sorted.
    pub fn fib_nexthops(&self, prefix: &str) -> Vec<String> {
        let fam = if prefix.contains(':') { "-6" } else { "-4" };
        let out = self.run(&format!("ip {fam} route show {prefix}"));
        let mut v: Vec<String> = out
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .map(|w| w[1].to_string())
            .collect();
        v.sort();
        v
    }

    /// The peer's RIB as text (JSON for FRR and GoBGP), both families.
    pub fn rib(&self) -> String {
        let run = |cmd: &str| {
            let out = Command::new("nsenter")
                .arg(format!("--net={}", self.ns.path()))
                .args(["sh", "-c", cmd])
                .output()
                .expect("reading the peer's RIB");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        match self.kind {
            Kind::Bird => run(&format!("birdc -s {} show route all", self.dir.join("bird.ctl").display())),
            Kind::Gobgp => {
                run("gobgp -u 127.0.0.1 -p 50051 global rib -a ipv4 -j; gobgp -u 127.0.0.1 -p 50051 global rib -a ipv6 -j")
            }
            Kind::Frr => {
                let n = self.frr_name.as_deref().unwrap_or("");
                run(&format!(
                    "vtysh -N {n} -c 'show bgp ipv4 unicast json' -c 'show bgp ipv6 unicast json' 2>/dev/null; vtysh -N {n} -c 'show bgp ipv4 unicast 0.0.0.0/0 longer-prefixes json' 2>/dev/null >/dev/null"
                ))
            }
        }
    }

    /// One route's details (FRR: `show bgp ... PREFIX json`).
    pub fn route(&self, prefix: &str) -> String {
        match self.kind {
            Kind::Frr => {
                let n = self.frr_name.as_deref().unwrap_or("");
                let fam = if prefix.contains(':') { "ipv6" } else { "ipv4" };
                let out = Command::new("nsenter")
                    .arg(format!("--net={}", self.ns.path()))
                    .args([
                        "vtysh",
                        "-N",
                        n,
                        "-c",
                        &format!("show bgp {fam} unicast {prefix} json"),
                    ])
                    .output()
                    .expect("vtysh");
                String::from_utf8_lossy(&out.stdout).into_owned()
            }
            _ => self.rib(),
        }
    }

    /// A shell command in the router's namespace; its stdout, whatever
    /// its exit status.
    pub fn run(&self, cmd: &str) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path()))
            .args(["sh", "-c", cmd])
            .output()
            .expect("nsenter");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// FRR only: `vtysh -c CMD` against this router's daemons.
    pub fn vtysh(&self, cmd: &str) -> String {
        assert_eq!(self.kind, Kind::Frr, "vtysh is FRR's");
        let n = self.frr_name.as_deref().unwrap_or("");
        // vtysh complains about its own missing config on stderr.
        self.run(&format!("vtysh -N {n} -c '{cmd}' 2>/dev/null"))
    }

    /// The BFD session with `peer` is up in this router's own view (FRR:
    /// `show bfd peers json`; BIRD: `show bfd sessions`).
    pub fn bfd_up(&self, peer: &str) -> bool {
        match self.kind {
            Kind::Frr => {
                let v: serde_json::Value =
                    serde_json::from_str(&self.vtysh("show bfd peers json")).unwrap_or_default();
                v.as_array()
                    .is_some_and(|a| a.iter().any(|p| p["peer"] == peer && p["status"] == "up"))
            }
            Kind::Bird => self
                .run(&format!(
                    "birdc -s {} show bfd sessions",
                    self.dir.join("bird.ctl").display()
                ))
                .lines()
                .any(|l| l.split_whitespace().next() == Some(peer) && l.contains(" Up ")),
            Kind::Gobgp => false,
        }
    }

    /// The BGP session with `peer` is Established in this router's view.
    pub fn established(&self, peer: &str) -> bool {
        match self.kind {
            Kind::Frr => {
                let v: serde_json::Value =
                    serde_json::from_str(&self.vtysh(&format!("show bgp neighbors {peer} json")))
                        .unwrap_or_default();
                v[peer]["bgpState"] == "Established"
            }
            Kind::Bird => {
                let i = self.bird_protocol(peer);
                self.run(&format!(
                    "birdc -s {} show protocols {i}",
                    self.dir.join("bird.ctl").display()
                ))
                .contains("Established")
            }
            Kind::Gobgp => {
                let v: serde_json::Value = serde_json::from_str(
                    &self.run(&format!("gobgp -u 127.0.0.1 -p 50051 neighbor {peer} -j")),
                )
                .unwrap_or_default();
                v["state"]["session_state"] == 6 || v["state"]["session_state"] == "established"
            }
        }
    }

    fn bird_protocol(&self, peer: &str) -> String {
        let conf = fs::read_to_string(self.dir.join("bird.conf")).unwrap_or_default();
        conf.lines()
            .find(|l| l.contains(&format!("neighbor {peer} as")))
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap_or("none")
            .to_string()
    }

    /// TCP segments this router's kernel dropped for a wrong MD5
    /// signature (`TcpExt: TCPMD5Failure`; an unsigned one, such as a
    /// reset from a port nobody listens on, counts elsewhere).
    pub fn md5_drops(&self) -> u64 {
        md5_drops(&self.run("cat /proc/net/netstat"))
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        for i in 0..self.children.len() {
            s += &fs::read_to_string(self.dir.join(format!("d{i}.log"))).unwrap_or_default();
        }
        s
    }
}

/// `TCPMD5Failure` from a `/proc/net/netstat` text.
pub fn md5_drops(netstat: &str) -> u64 {
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(head), Some(vals)) = (lines.next(), lines.next()) else {
        return 0;
    };
    head.split_whitespace()
        .zip(vals.split_whitespace())
        .filter(|(k, _)| *k == "TCPMD5Failure")
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

impl Drop for Router {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {:?} router log:\n{}\n--- RIB:\n{}",
                self.kind,
                self.log(),
                self.rib()
            );
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for p in &self.pids {
            if let Ok(pid) = fs::read_to_string(p) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    // SAFETY: a signal to a daemon this router started.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        if let Some(n) = &self.frr_name {
            let _ = fs::remove_dir_all(format!("/var/run/frr/{n}"));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
