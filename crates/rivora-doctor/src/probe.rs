//! What the host says, gathered once into [`Facts`]: plain data that
//! [`crate::checks`] judges. A fact that cannot be read is recorded as
//! such (with the error), never guessed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::ports::{self, PortRange};
use crate::{bpf, genl, links};

/// `statfs(2)`'s f_type of a bpf filesystem (linux/magic.h).
pub const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where the facts are read from: the real host's paths, overridable so
/// that a test can point one at a fixture.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The bpffs mount rivorad pins under (its `-pin-dir`'s parent).
    pub bpffs: PathBuf,
    /// rivorad's `-pin-dir` (pinned links identify Rivora's programs).
    pub pin_dir: PathBuf,
    pub btf: PathBuf,
    pub proc_sys: PathBuf,
    pub clocksource: PathBuf,
    /// kube-proxy's metrics endpoint, which answers `GET /proxyMode`.
    pub kube_proxy: SocketAddr,
}

impl Default for Sources {
    fn default() -> Self {
        Self {
            bpffs: "/sys/fs/bpf".into(),
            pin_dir: "/sys/fs/bpf/rivora-lb".into(),
            btf: "/sys/kernel/btf/vmlinux".into(),
            proc_sys: "/proc/sys".into(),
            clocksource: "/sys/devices/system/clocksource/clocksource0/current_clocksource".into(),
            kube_proxy: SocketAddr::from(([127, 0, 0, 1], 10249)),
        }
    }
}

/// A program attached to an interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Prog {
    pub id: u32,
    /// Its name, when the kernel would say (opening a program by id needs
    /// CAP_SYS_ADMIN).
    pub name: Option<String>,
    /// `xdp native`, `xdp generic`, `xdp offload`, `tcx ingress`, `tcx egress`.
    pub hook: String,
    /// The program behind the link rivorad pinned for this hook and
    /// interface under the pin directory: Rivora's, kept by
    /// -persist-datapath, which the next rivorad takes over.
    pub pinned_by_rivora: bool,
}

impl Prog {
    pub fn describe(&self) -> String {
        match &self.name {
            Some(n) => format!("{n} (id {}, {})", self.id, self.hook),
            None => format!(
                "id {} ({}; name unreadable without CAP_SYS_ADMIN)",
                self.id, self.hook
            ),
        }
    }
}

/// One interface rivorad would attach to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Iface {
    pub name: String,
    /// None: no such interface in this network namespace.
    pub ifindex: Option<u32>,
    pub mtu: Option<u32>,
    /// NETDEV_XDP_ACT_* bits of its driver; None when the kernel cannot say.
    pub xdp_features: Option<u64>,
    pub xdp: Vec<Prog>,
    pub tcx: Vec<Prog>,
    /// Why the TCX query failed, if it did.
    pub tcx_error: Option<String>,
    /// net.ipv4.conf.<name>.rp_filter.
    pub rp_filter: Option<u32>,
    /// net.ipv4.conf.<name>.accept_local.
    pub accept_local: Option<u32>,
    /// Whether this process may write net.ipv4.conf.<name>.accept_local,
    /// as rivorad (with the same rights and mounts) would: why not, if
    /// not (a container's read-only /proc/sys).
    pub accept_local_writable: Result<(), String>,
}

impl Iface {
    /// Rivora's xdp_ingress is attached: this pin directory's, or another
    /// rivorad's.
    pub fn rivora_attached(&self) -> bool {
        self.xdp
            .iter()
            .any(|p| p.pinned_by_rivora || p.name.as_deref() == Some("xdp_ingress"))
    }
}

/// kube-proxy on this node, as far as it can be seen from here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KubeProxy {
    NotFound,
    /// Its mode (`iptables`, `ipvs`, `nftables`) and how it was learned.
    Running {
        mode: String,
        seen: String,
    },
}

/// Everything the checks judge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Facts {
    /// `uname -r`.
    pub kernel_release: String,
    /// The size of the kernel's BTF, or why it cannot be read.
    pub btf: Result<u64, String>,
    pub bpffs_path: String,
    /// statfs f_type of the bpffs path, or why statfs failed.
    pub bpffs_type: Result<i64, String>,
    /// CapEff of this process.
    pub capabilities: Result<u64, String>,
    pub interfaces: Vec<Iface>,
    /// Why the interfaces could not be listed, if they could not.
    pub interfaces_error: Option<String>,
    pub ip_forward: Option<bool>,
    /// None also when IPv6 is disabled in the kernel.
    pub ipv6_forwarding: Option<bool>,
    /// net.ipv4.conf.all.rp_filter.
    pub rp_filter_all: Option<u32>,
    /// net.ipv4.conf.all.accept_local.
    pub accept_local_all: Option<u32>,
    /// net.ipv4.ip_local_port_range: the node's own connections' source
    /// ports (IPv6's too).
    pub ephemeral_ports: Result<PortRange, String>,
    /// net.ipv4.ip_local_reserved_ports: ports the ephemeral range skips
    /// (IPv6's too), merged.
    pub reserved_ports: Result<Vec<PortRange>, String>,
    pub kube_proxy: KubeProxy,
    /// RLIMIT_MEMLOCK (soft), bytes; None: unlimited.
    pub memlock: Option<u64>,
    /// memory.max of this process's cgroup (v2), bytes; None: unlimited or
    /// no cgroup v2.
    pub memory_max: Option<u64>,
    pub clocksource: Option<String>,
    /// net.core.bpf_jit_enable.
    pub bpf_jit: Option<u32>,
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A sysctl's file. Interface names may hold dots: only the prefix's
/// dots are separators.
fn sysctl_path(src: &Sources, key: &str) -> PathBuf {
    match key.strip_prefix("net.ipv4.conf.") {
        Some(rest) => {
            let (ifname, leaf) = rest.rsplit_once('.').unwrap_or((rest, ""));
            src.proc_sys.join("net/ipv4/conf").join(ifname).join(leaf)
        }
        None => src.proc_sys.join(key.replace('.', "/")),
    }
}

fn sysctl(src: &Sources, key: &str) -> Option<String> {
    read_trim(&sysctl_path(src, key))
}

/// A sysctl's text, or why it cannot be read.
fn sysctl_text(src: &Sources, key: &str) -> Result<String, String> {
    let p = sysctl_path(src, key);
    std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Whether this process may write `p` (access(2): the mount's read-only
/// flag and the sysctl's permissions both count), or why not.
fn writable(p: &Path) -> Result<(), String> {
    nix::unistd::access(p, nix::unistd::AccessFlags::W_OK)
        .map_err(|e| format!("{}: {}", p.display(), std::io::Error::from(e)))
}

fn sysctl_u32(src: &Sources, key: &str) -> Option<u32> {
    sysctl(src, key)?.parse().ok()
}

/// CapEff from /proc/self/status.
fn capabilities() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("reading /proc/self/status: {e}"))?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or("no CapEff line in /proc/self/status")?;
    u64::from_str_radix(hex.trim(), 16).map_err(|e| format!("CapEff {:?}: {e}", hex.trim()))
}

fn statfs_type(p: &Path) -> Result<i64, String> {
    nix::sys::statfs::statfs(p)
        .map(|s| s.filesystem_type().0)
        .map_err(|e| format!("statfs {}: {e}", p.display()))
}

/// The memory limit of this process's cgroup: cgroup v1's memory
/// controller (`memory.limit_in_bytes`) when it is mounted, else cgroup
/// v2's `memory.max`. None: unlimited, or no memory cgroup.
fn memory_max() -> Option<u64> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_limit_from(&cg, Path::new("/sys/fs/cgroup"))
}

/// [`memory_max`] over a /proc/self/cgroup text and a cgroup root.
pub fn memory_limit_from(proc_cgroup: &str, root: &Path) -> Option<u64> {
    // v1 (or hybrid): "4:memory:/path".
    let v1 = proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls.split(',').any(|c| c == "memory").then_some(path)
    });
    let file = match v1 {
        Some(path) => root
            .join("memory")
            .join(path.trim_start_matches('/'))
            .join("memory.limit_in_bytes"),
        None => {
            let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
            root.join(path.trim_start_matches('/')).join("memory.max")
        }
    };
    let v: u64 = read_trim(&file)?.parse().ok()?;
    // v1 says "unlimited" as the largest page-aligned value.
    (v < (1u64 << 62)).then_some(v)
}

/// kube-proxy's mode: its metrics endpoint's `/proxyMode`, else a
/// `kube-ipvs0` interface (IPVS mode creates it), else a kube-proxy
/// process and its `--proxy-mode` flag.
fn kube_proxy(src: &Sources, links: &[links::Link]) -> KubeProxy {
    if let Some(mode) = proxy_mode_endpoint(src.kube_proxy) {
        return KubeProxy::Running {
            mode,
            seen: format!("http://{}/proxyMode", src.kube_proxy),
        };
    }
    if links.iter().any(|l| l.name == "kube-ipvs0") {
        return KubeProxy::Running {
            mode: "ipvs".into(),
            seen: "the kube-ipvs0 interface".into(),
        };
    }
    if let Some((pid, cmdline)) = kube_proxy_process() {
        let mode = cmdline
            .iter()
            .find_map(|a| a.strip_prefix("--proxy-mode=").map(str::to_string))
            .unwrap_or_else(|| "iptables".into());
        return KubeProxy::Running {
            mode,
            seen: format!("process {pid}"),
        };
    }
    KubeProxy::NotFound
}

fn proxy_mode_endpoint(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(b"GET /proxyMode HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.take(4096).read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.") || !head.split_whitespace().nth(1)?.starts_with('2') {
        return None;
    }
    let mode = body.trim();
    (!mode.is_empty() && mode.len() < 32).then(|| mode.to_string())
}

fn kube_proxy_process() -> Option<(u32, Vec<String>)> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if read_trim(&e.path().join("comm")).as_deref() != Some("kube-proxy") {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        return Some((pid, args));
    }
    None
}

/// What rivorad's configuration file says that the checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    pub path: PathBuf,
    pub interfaces: Vec<String>,
    /// node.snat.ports, or its default.
    pub snat_ports: PortRange,
    /// A VIP for which rivorad sets accept_local (L3 DSR or full NAT, its
    /// own mode or a backend's), described.
    pub local_source_vip: Option<String>,
}

/// rivorad's configuration: `config`, else /etc/rivora/rivora.yaml if it
/// exists; None without either. A file rivorad would refuse is an error.
pub fn node_config(config: Option<&Path>) -> Result<Option<NodeConfig>, String> {
    let default = Path::new("/etc/rivora/rivora.yaml");
    let Some(path) = config.or(default.exists().then_some(default)) else {
        return Ok(None);
    };
    let cfg = rivora_model::config::load(path).map_err(|e| e.to_string())?;
    let fullnat = &cfg.desired.node.fullnat;
    let snat_ports = PortRange::new(fullnat.port_min, fullnat.port_max).ok_or_else(|| {
        format!(
            "{}: node.snat.ports {}-{}",
            path.display(),
            fullnat.port_min,
            fullnat.port_max
        )
    })?;
    let local = |m: rivora_model::model::Mode| {
        matches!(
            m,
            rivora_model::model::Mode::L3Dsr | rivora_model::model::Mode::FullNat
        )
    };
    // The reconciler's rule for calling prepare_local_source.
    let local_source_vip = cfg.desired.vips.iter().find_map(|v| {
        let key = v.key();
        let name = cfg
            .names
            .get(&key)
            .cloned()
            .unwrap_or_else(|| key.to_string());
        if local(v.mode) {
            return Some(format!("VIP {name} is {}", v.mode));
        }
        v.backends
            .iter()
            .find_map(|b| b.mode.filter(|m| local(*m)))
            .map(|m| format!("VIP {name} has a {m} backend"))
    });
    Ok(Some(NodeConfig {
        path: path.to_path_buf(),
        interfaces: cfg.file.interfaces.iter().map(|i| i.name.clone()).collect(),
        snat_ports,
        local_source_vip,
    }))
}

/// The interfaces to look at when none is named: those of rivorad's
/// configuration file, else every interface that is up, not loopback and
/// backed by a device (a NIC, not a bridge or a veth).
pub fn default_interfaces(config: Option<&NodeConfig>) -> Result<Vec<String>, String> {
    if let Some(c) = config {
        return Ok(c.interfaces.clone());
    }
    let links = links::dump().map_err(|e| format!("listing interfaces: {e}"))?;
    Ok(links
        .into_iter()
        .filter(|l| {
            l.up && !l.loopback
                && Path::new("/sys/class/net")
                    .join(&l.name)
                    .join("device")
                    .exists()
        })
        .map(|l| l.name)
        .collect())
}

/// The program's name, if the kernel says.
fn name_of(id: u32) -> Option<String> {
    bpf::prog_name(id).ok()
}

/// Gather every fact about the host and `interfaces`.
pub fn gather(src: &Sources, interfaces: &[String]) -> Facts {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let btf = std::fs::metadata(&src.btf)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", src.btf.display()));
    let (all_links, interfaces_error) = match links::dump() {
        Ok(l) => (l, None),
        Err(e) => (
            Vec::new(),
            Some(format!("listing interfaces over rtnetlink: {e}")),
        ),
    };
    let features: Option<BTreeMap<u32, u64>> = genl::xdp_features().ok().flatten();
    let pinned = |hook: &str, ifname: &str| -> Option<u32> {
        bpf::pinned_link_prog(&src.pin_dir.join("links").join(format!("{hook}_{ifname}"))).ok()
    };
    let ifaces = interfaces
        .iter()
        .map(|name| {
            let link = all_links.iter().find(|l| &l.name == name);
            let rp_filter = sysctl_u32(src, &format!("net.ipv4.conf.{name}.rp_filter"));
            let accept_local = sysctl_u32(src, &format!("net.ipv4.conf.{name}.accept_local"));
            let accept_local_writable = writable(&sysctl_path(
                src,
                &format!("net.ipv4.conf.{name}.accept_local"),
            ));
            let Some(link) = link else {
                return Iface {
                    name: name.clone(),
                    ifindex: None,
                    mtu: None,
                    xdp_features: None,
                    xdp: Vec::new(),
                    tcx: Vec::new(),
                    tcx_error: None,
                    rp_filter,
                    accept_local,
                    accept_local_writable,
                };
            };
            let rivora_xdp = pinned("xdp", name);
            let xdp = link
                .xdp
                .iter()
                .map(|&(id, mode)| Prog {
                    id,
                    name: name_of(id),
                    hook: format!("xdp {mode}"),
                    pinned_by_rivora: rivora_xdp == Some(id),
                })
                .collect();
            let rivora_tcx = pinned("tcx", name);
            let mut tcx = Vec::new();
            let mut tcx_error = None;
            for (hook, at) in [
                ("tcx ingress", bpf::BPF_TCX_INGRESS),
                ("tcx egress", bpf::BPF_TCX_EGRESS),
            ] {
                match bpf::tcx_programs(link.index, at) {
                    Ok(ids) => tcx.extend(ids.into_iter().map(|id| Prog {
                        id,
                        name: name_of(id),
                        hook: hook.to_string(),
                        pinned_by_rivora: rivora_tcx == Some(id),
                    })),
                    Err(e) => tcx_error = Some(format!("BPF_PROG_QUERY {hook}: {e}")),
                }
            }
            Iface {
                name: name.clone(),
                ifindex: Some(link.index),
                mtu: link.mtu,
                xdp_features: features.as_ref().and_then(|f| f.get(&link.index).copied()),
                xdp,
                tcx,
                tcx_error,
                rp_filter,
                accept_local,
                accept_local_writable,
            }
        })
        .collect();
    let memlock = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .ok()
        .and_then(|(soft, _)| (soft != libc::RLIM_INFINITY).then_some(soft));
    Facts {
        kernel_release: release,
        btf,
        bpffs_path: src.bpffs.display().to_string(),
        bpffs_type: statfs_type(&src.bpffs),
        capabilities: capabilities(),
        interfaces: ifaces,
        interfaces_error,
        ip_forward: sysctl(src, "net.ipv4.ip_forward").map(|v| v == "1"),
        ipv6_forwarding: sysctl(src, "net.ipv6.conf.all.forwarding").map(|v| v == "1"),
        rp_filter_all: sysctl_u32(src, "net.ipv4.conf.all.rp_filter"),
        accept_local_all: sysctl_u32(src, "net.ipv4.conf.all.accept_local"),
        ephemeral_ports: sysctl_text(src, "net.ipv4.ip_local_port_range")
            .and_then(|s| ports::parse_port_range(&s)),
        reserved_ports: sysctl_text(src, "net.ipv4.ip_local_reserved_ports")
            .and_then(|s| ports::parse_port_list(&s)),
        kube_proxy: kube_proxy(src, &all_links),
        memlock,
        memory_max: memory_max(),
        clocksource: read_trim(&src.clocksource),
        bpf_jit: sysctl_u32(src, "net.core.bpf_jit_enable"),
    }
}
