//! The verdicts: [`Facts`] to [`Check`]s, purely. Every check says what
//! it found, why it matters and the fix; a failure names the modes it
//! blocks.

use crate::ports::{self, PortRange};
use crate::probe::{Facts, Iface, KubeProxy, Prog};
use crate::{Check, Mode, Report, Verdict};

/// What the checks are asked about.
#[derive(Debug, Clone)]
pub struct Options {
    /// The modes the node must serve: forwarding modes and the
    /// announcement mode, if any.
    pub modes: Vec<Mode>,
    /// rivorad's -flow-table-size (the maps' memory).
    pub flow_table_size: u64,
    /// rivorad runs with -kubernetes, where the L2 speaker always runs (it
    /// serves the AddressPools that ask for L2, whatever the mode).
    pub kubernetes: bool,
    /// The BGP listener's port (rivorad's bgp.listenPort; 0: none): below
    /// 1024 it needs NET_BIND_SERVICE.
    pub bgp_listen_port: u16,
    /// Full NAT's source ports (node.snat.ports), and where they were
    /// read (a file, or "the default").
    pub snat_ports: PortRange,
    pub snat_ports_from: String,
    /// A VIP of rivorad's configuration for which rivorad sets
    /// accept_local (L3 DSR or full NAT), described; None: none known.
    pub local_source_vip: Option<String>,
}

impl Options {
    /// The modes a full-NAT fault blocks: fullnat, and with Kubernetes nat
    /// too, since rivorad -kubernetes reaches a NAT VIP's endpoints on
    /// other nodes by full NAT.
    fn fullnat_modes(&self) -> Vec<Mode> {
        let mut m = vec![Mode::Fullnat];
        if self.kubernetes {
            m.push(Mode::Nat);
        }
        sorted(m)
    }

    /// The modes that hand the kernel packets with this node's own address
    /// as source (what XDP cannot send yet): L3 DSR's outer header and
    /// full NAT's rewritten source.
    fn local_source_modes(&self) -> Vec<Mode> {
        let mut m = self.fullnat_modes();
        m.push(Mode::L3dsr);
        sorted(m)
    }
}

/// Modes in their order (nat, dsr, l3dsr, fullnat, l2, bgp), once each.
fn sorted(mut m: Vec<Mode>) -> Vec<Mode> {
    m.sort();
    m.dedup();
    m
}

/// TCX (tc_nat's attachment) is Linux 6.6's.
pub const MIN_KERNEL: (u32, u32) = (6, 6);
/// Memory cgroups charge BPF maps since 5.11; RLIMIT_MEMLOCK did before.
const MEMCG_ACCOUNTING: (u32, u32) = (5, 11);
/// Bytes per unit of -flow-table-size over the six flow tables (docs/datapath.md,
/// "Maps": 96 + 96 + 112 + 128 + 152 + 176, `bpftool map show` memlock on
/// 6.18).
const FLOW_BYTES_PER_ENTRY: u64 = 760;
/// Beyond the flow tables: the other maps (the Maglev table, 4,096 VIPs,
/// 8,192 backends, fragments, counters) and rivorad itself (45 MiB
/// resident with 1,000 Services: BENCHMARKS.md, k8s_rivorad_rss_mib_n1000).
const MEMORY_BESIDE_FLOWS: u64 = 96 << 20;

const ALL_FORWARDING: &[Mode] = &Mode::FORWARDING;

/// A capability: its number (linux/capability.h) and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u32, pub &'static str);

pub const CAP_NET_BIND_SERVICE: Cap = Cap(10, "NET_BIND_SERVICE");
pub const CAP_NET_ADMIN: Cap = Cap(12, "NET_ADMIN");
pub const CAP_NET_RAW: Cap = Cap(13, "NET_RAW");
pub const CAP_PERFMON: Cap = Cap(38, "PERFMON");
pub const CAP_BPF: Cap = Cap(39, "BPF");

/// What rivorad needs for the datapath, as measured: the chart grants
/// these and no more (tests/e2e_capabilities.rs). RLIMIT_MEMLOCK, which
/// SYS_RESOURCE would raise, no longer applies to maps since 5.11.
pub const DATAPATH_CAPS: &[Cap] = &[CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON];

/// What an announcement mode adds, measured (tests/e2e_capabilities.rs).
pub fn mode_caps(m: Mode, bgp_listen_port: u16) -> &'static [Cap] {
    match m {
        Mode::Nat | Mode::Dsr | Mode::L3dsr | Mode::Fullnat => &[],
        // AF_PACKET sockets for ARP and NDP.
        Mode::L2 => &[CAP_NET_RAW],
        // The listener on a port below 1024 (179); TCP MD5 and BFD's
        // TTL-255 sockets need none.
        Mode::Bgp if (1..1024).contains(&bgp_listen_port) => &[CAP_NET_BIND_SERVICE],
        Mode::Bgp => &[],
    }
}

fn check(id: &str, subject: Option<&str>, verdict: Verdict, found: String, why: &str) -> Check {
    Check {
        id: id.to_string(),
        subject: subject.map(str::to_string),
        verdict,
        found,
        why: why.to_string(),
        fix: None,
        blocks: Vec::new(),
    }
}

impl Check {
    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    fn blocking(mut self, modes: &[Mode]) -> Self {
        self.blocks = modes.to_vec();
        self
    }
}

/// "6.18.0-1-amd64" -> (6, 18).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

pub fn kernel(f: &Facts) -> Check {
    const WHY: &str = "tc_nat attaches with TCX (Linux 6.6), and the programs use helpers and verifier features of that kernel";
    match kernel_version(&f.kernel_release) {
        Some(v) if v >= MIN_KERNEL => check(
            "kernel",
            None,
            Verdict::Pass,
            format!("Linux {} (6.6 or newer)", f.kernel_release),
            WHY,
        ),
        Some(_) => check(
            "kernel",
            None,
            Verdict::Fail,
            format!("Linux {}, older than 6.6", f.kernel_release),
            WHY,
        )
        .fix("run the node on Linux 6.6 or newer")
        .blocking(ALL_FORWARDING),
        None => check(
            "kernel",
            None,
            Verdict::Fail,
            format!("an unreadable kernel release {:?}", f.kernel_release),
            WHY,
        )
        .fix("run the node on Linux 6.6 or newer")
        .blocking(ALL_FORWARDING),
    }
}

pub fn btf(f: &Facts) -> Check {
    const WHY: &str = "the programs are compiled once (CO-RE) and relocated against the running kernel's types at load: without BTF they cannot load";
    match &f.btf {
        Ok(size) => check(
            "btf",
            None,
            Verdict::Pass,
            format!("/sys/kernel/btf/vmlinux ({} KiB)", size / 1024),
            WHY,
        ),
        Err(e) => check("btf", None, Verdict::Fail, format!("no kernel BTF: {e}"), WHY)
            .fix("a kernel built with CONFIG_DEBUG_INFO_BTF=y (every mainstream distribution's since 2021)")
            .blocking(ALL_FORWARDING),
    }
}

pub fn bpffs(f: &Facts) -> Check {
    const WHY: &str = "rivorad pins its maps (and with -persist-datapath its links) on the bpf filesystem so that forwarding state outlives restarts and upgrades";
    let path = &f.bpffs_path;
    match &f.bpffs_type {
        Ok(t) if *t == crate::probe::BPF_FS_MAGIC => check(
            "bpffs",
            None,
            Verdict::Pass,
            format!("{path} is a bpf filesystem"),
            WHY,
        ),
        Ok(t) => check(
            "bpffs",
            None,
            Verdict::Fail,
            format!("{path} is not a bpf filesystem (type {t:#x})"),
            WHY,
        )
        .fix(format!(
            "mount -t bpf bpf {path} on the host (and in /etc/fstab: `bpf {path} bpf defaults 0 0`); in a pod, the host's {path} must be mounted before the pod starts"
        ))
        .blocking(ALL_FORWARDING),
        Err(e) => check("bpffs", None, Verdict::Fail, e.clone(), WHY)
            .fix(format!("mount -t bpf bpf {path}"))
            .blocking(ALL_FORWARDING),
    }
}

pub fn capabilities(f: &Facts, modes: &[Mode], kubernetes: bool, bgp_listen_port: u16) -> Check {
    const WHY: &str = "loading programs and maps needs BPF, the programs' pointer arithmetic PERFMON, loading and attaching XDP and TCX programs NET_ADMIN; the L2 speaker's ARP and NDP sockets NET_RAW (with Kubernetes it always runs), BGP's listener on a port below 1024 (179) NET_BIND_SERVICE";
    let eff = match &f.capabilities {
        Ok(e) => *e,
        Err(e) => {
            return check("capabilities", None, Verdict::Fail, e.clone(), WHY)
                .fix("run rivora-doctor as rivorad runs")
                .blocking(modes)
        }
    };
    let has = |c: &Cap| eff & (1u64 << c.0) != 0;
    let mut missing_for: Vec<(Cap, Vec<Mode>)> = Vec::new();
    let base: Vec<Cap> = DATAPATH_CAPS
        .iter()
        .copied()
        .chain(kubernetes.then_some(CAP_NET_RAW))
        .collect();
    for c in &base {
        if !has(c) {
            missing_for.push((*c, ALL_FORWARDING.to_vec()));
        }
    }
    for m in [Mode::L2, Mode::Bgp] {
        for c in mode_caps(m, bgp_listen_port) {
            if !has(c) && modes.contains(&m) && !base.contains(c) {
                missing_for.push((*c, vec![m]));
            }
        }
    }
    if missing_for.is_empty() {
        let mut names: Vec<&str> = base.iter().map(|c| c.1).collect();
        for c in modes.iter().flat_map(|m| mode_caps(*m, bgp_listen_port)) {
            if !names.contains(&c.1) {
                names.push(c.1);
            }
        }
        return check(
            "capabilities",
            None,
            Verdict::Pass,
            format!("effective: {}", names.join(", ")),
            WHY,
        );
    }
    let names: Vec<&str> = missing_for.iter().map(|(c, _)| c.1).collect();
    let mut blocks: Vec<Mode> = missing_for.iter().flat_map(|(_, m)| m.clone()).collect();
    blocks.sort();
    blocks.dedup();
    check(
        "capabilities",
        None,
        Verdict::Fail,
        format!("missing: {} (CapEff {eff:#018x})", names.join(", ")),
        WHY,
    )
    .fix(format!(
        "run as root, or grant CAP_{} (the chart's securityContext does)",
        names.join(", CAP_")
    ))
    .blocking(&blocks)
}

fn rivora_prog(p: &Prog) -> bool {
    matches!(p.name.as_deref(), Some("xdp_ingress" | "tc_nat"))
}

/// Per interface: it exists, its driver's XDP, what is attached, its
/// rp_filter, accept_local and MTU.
pub fn interface(f: &Facts, i: &Iface, opts: &Options) -> Vec<Check> {
    let s = Some(i.name.as_str());
    let Some(ifindex) = i.ifindex else {
        return vec![check(
            "interface",
            s,
            Verdict::Fail,
            format!("no interface {} in this network namespace", i.name),
            "rivorad attaches to every interface its configuration names and refuses to start without one",
        )
        .fix("name this node's interfaces in rivorad.interfaces (the chart) or the configuration file; the names must exist on every node")
        .blocking(ALL_FORWARDING)];
    };
    vec![
        xdp_driver(i, ifindex),
        xdp_programs(i),
        tcx_programs(i),
        rp_filter(f, i, opts),
        accept_local(f, i, opts),
        mtu(i),
    ]
}

fn xdp_driver(i: &Iface, ifindex: u32) -> Check {
    use crate::genl::{XDP_ACT_BASIC, XDP_ACT_NDO_XMIT, XDP_ACT_REDIRECT};
    const WHY: &str = "native XDP runs in the driver before the kernel allocates anything; generic XDP runs after the kernel has built a socket buffer for every packet, which costs what XDP exists to save";
    let s = Some(i.name.as_str());
    match i.xdp_features {
        Some(bits) if bits & XDP_ACT_BASIC != 0 => {
            let mut acts = vec!["basic"];
            if bits & XDP_ACT_REDIRECT != 0 {
                acts.push("redirect");
            }
            if bits & XDP_ACT_NDO_XMIT != 0 {
                acts.push("ndo_xmit");
            }
            check(
                "xdp-driver",
                s,
                Verdict::Pass,
                format!("native XDP ({}), ifindex {ifindex}", acts.join(", ")),
                WHY,
            )
        }
        Some(_) => check(
            "xdp-driver",
            s,
            Verdict::Warn,
            format!("the driver has no native XDP: rivorad attaches generic XDP (ifindex {ifindex})"),
            WHY,
        )
        .fix("forward on a NIC whose driver supports native XDP (most 10G+ drivers, virtio_net, veth); generic works, slower"),
        None => check(
            "xdp-driver",
            s,
            Verdict::Warn,
            "the kernel does not say what XDP the driver supports (no netdev netlink family)".into(),
            WHY,
        )
        .fix("rivorad's xdpMode: auto tries native first and says which it got (rivoractl status)"),
    }
}

fn xdp_programs(i: &Iface) -> Check {
    const WHY: &str = "an interface runs one XDP program: rivorad cannot attach beside another one (Cilium's XDP acceleration, another load balancer, another rivorad)";
    let s = Some(i.name.as_str());
    let (ours, other): (Vec<&Prog>, Vec<&Prog>) = i.xdp.iter().partition(|p| p.pinned_by_rivora);
    if other.is_empty() {
        let found = match ours.first() {
            Some(p) => format!(
                "Rivora's own {}, kept by -persist-datapath: the next rivorad takes it over",
                p.describe()
            ),
            None => "no XDP program attached".into(),
        };
        return check("xdp-programs", s, Verdict::Pass, found, WHY);
    }
    let list: Vec<String> = other.iter().map(|p| p.describe()).collect();
    let (found, fix) = if other.iter().all(|p| rivora_prog(p)) {
        (
            format!(
                "another Rivora's {} (not the one pinned under this pin directory)",
                list.join(", ")
            ),
            format!(
                "stop the other rivorad (a systemd unit: systemctl stop rivorad; then rivorad -cleanup -pin-dir ITS_DIR), or run one rivorad per node; `ip link set dev {} xdp off` detaches it now",
                i.name
            ),
        )
    } else {
        (
            format!("another XDP program: {}", list.join(", ")),
            format!(
                "detach it: `ip link set dev {0} xdp off` (or `xdpgeneric off`); a program a BPF link holds (`bpftool link show`) goes when its owner stops, or with `bpftool link detach id ID`; if it is Cilium's (cil_xdp_entry), turn its XDP acceleration off (loadBalancer.acceleration=disabled)",
                i.name
            ),
        )
    };
    check("xdp-programs", s, Verdict::Fail, found, WHY)
        .fix(fix)
        .blocking(ALL_FORWARDING)
}

fn tcx_programs(i: &Iface) -> Check {
    const WHY: &str = "tc_nat turns NAT replies back into the VIP's on TCX egress; another program there runs in the same chain and can redirect or drop a reply before tc_nat sees it";
    let s = Some(i.name.as_str());
    if let Some(e) = &i.tcx_error {
        return check("tcx-programs", s, Verdict::Warn, e.clone(), WHY)
            .fix("run rivora-doctor with CAP_NET_ADMIN (as rivorad runs)");
    }
    let other: Vec<&Prog> = i
        .tcx
        .iter()
        .filter(|p| !(p.pinned_by_rivora || p.hook == "tcx egress" && rivora_prog(p)))
        .collect();
    if other.is_empty() {
        let ours = i.tcx.iter().find(|p| p.pinned_by_rivora || rivora_prog(p));
        let found = match ours {
            Some(p) => format!("only Rivora's {}", p.describe()),
            None => "no TCX program attached".into(),
        };
        return check("tcx-programs", s, Verdict::Pass, found, WHY);
    }
    let list: Vec<String> = other.iter().map(|p| p.describe()).collect();
    check(
        "tcx-programs",
        s,
        Verdict::Warn,
        format!("other TCX programs: {}", list.join(", ")),
        WHY,
    )
    .fix("make sure they pass NAT replies on (TC_NEXT): a CNI's egress program (Cilium's cil_to_netdev) usually does")
}

fn rp_filter(f: &Facts, i: &Iface, opts: &Options) -> Check {
    const WHY: &str = "strict reverse-path filtering (1) drops a packet whose source this node would not route out of the interface it came in on: client traffic of DSR and L3 DSR VIPs reaches backends over paths the replies do not take, and packets Rivora hands to the kernel are checked too (L3 DSR's and full NAT's carry this node's own address as source)";
    let s = Some(i.name.as_str());
    let (Some(all), Some(own)) = (f.rp_filter_all, i.rp_filter) else {
        return check(
            "rp-filter",
            s,
            Verdict::Warn,
            "net.ipv4.conf rp_filter unreadable".into(),
            WHY,
        );
    };
    // The kernel applies the larger of `all` and the interface's own.
    let eff = all.max(own);
    let found = format!("rp_filter {eff} (all {all}, {} {own})", i.name);
    if eff == 1 {
        check("rp-filter", s, Verdict::Fail, format!("{found}: strict"), WHY)
            .fix(format!(
                "loose mode: sysctl -w net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.{}.rp_filter=2 (and in /etc/sysctl.d/)",
                i.name
            ))
            .blocking(&sorted(
                [opts.local_source_modes(), vec![Mode::Dsr]].concat(),
            ))
    } else {
        check(
            "rp-filter",
            s,
            Verdict::Pass,
            format!("{found}: not strict"),
            WHY,
        )
    }
}

fn accept_local(f: &Facts, i: &Iface, opts: &Options) -> Check {
    const WHY: &str = "L3 DSR and full NAT hand the kernel a packet XDP cannot send yet (a neighbour not resolved, an egress rivorad is not attached to) with this node's own address as source: without accept_local the kernel drops it as a martian. rivorad sets net.ipv4.conf.IF.accept_local=1 on its interfaces whenever it applies an L3 DSR or full-NAT VIP (or backend)";
    let s = Some(i.name.as_str());
    let (Some(all), Some(own)) = (f.accept_local_all, i.accept_local) else {
        return check(
            "accept-local",
            s,
            Verdict::Warn,
            "net.ipv4.conf accept_local unreadable".into(),
            WHY,
        );
    };
    // The kernel takes either (IN_DEV_ORCONF).
    let found = format!(
        "accept_local {} (all {all}, {} {own})",
        all.max(own),
        i.name
    );
    let set = format!("sysctl -w net.ipv4.conf.{}.accept_local=1", i.name);
    let reset = "find what reset it: a file under /etc/sysctl.d/ or /usr/lib/sysctl.d/ that sets accept_local to 0, or a network manager applying the interface's settings again";
    if all.max(own) >= 1 {
        return check("accept-local", s, Verdict::Pass, found, WHY);
    }
    if let Err(e) = &i.accept_local_writable {
        // With the same rights and mounts (the chart's init container has
        // rivorad's), rivorad's write fails the same way.
        return check(
            "accept-local",
            s,
            Verdict::Fail,
            format!("{found}, and it cannot be written here ({e}): rivorad, run the same way, cannot set it either"),
            WHY,
        )
        .fix(format!("set it on the host: {set} (and in /etc/sysctl.d/); a container's /proc/sys is read-only unless it is privileged"))
        .blocking(&opts.local_source_modes());
    }
    if !i.rivora_attached() {
        return check(
            "accept-local",
            s,
            Verdict::Pass,
            format!("{found}: rivorad sets it to 1 when it applies an L3 DSR or full-NAT VIP"),
            WHY,
        );
    }
    match &opts.local_source_vip {
        Some(vip) => check(
            "accept-local",
            s,
            Verdict::Fail,
            format!("{found} while Rivora's xdp_ingress is attached and {vip}: rivorad set it to 1, and something reset it"),
            WHY,
        )
        .fix(format!("{set} (rivorad sets it again on its next apply), and {reset}"))
        .blocking(&opts.local_source_modes()),
        None => check(
            "accept-local",
            s,
            Verdict::Warn,
            format!("{found} while Rivora's xdp_ingress is attached: rivorad has applied no L3 DSR or full-NAT VIP yet, or it did and something reset it"),
            WHY,
        )
        .fix(format!("if this node serves L3 DSR or full-NAT VIPs (rivoractl status): {set}, and {reset}")),
    }
}

pub fn snat_ports(f: &Facts, opts: &Options) -> Check {
    const WHY: &str = "full NAT gives each flow a source port of node.snat.ports on this node's address, and the node's own connections take theirs from the ephemeral range (net.ipv4.ip_local_port_range, for IPv6 too) but for net.ipv4.ip_local_reserved_ports: a port in both can be a full-NAT flow's and a local connection's to the same backend at once (kubelet's probes of pods are such connections), so the backend sees one connection for two, and the local connection's replies are turned into the client's";
    let snat = opts.snat_ports;
    let from = &opts.snat_ports_from;
    let eph = match &f.ephemeral_ports {
        Ok(r) => *r,
        Err(e) => {
            return check(
                "snat-ports",
                None,
                Verdict::Warn,
                format!("node.snat.ports {snat} ({from}); the ephemeral range is unreadable: {e}"),
                WHY,
            )
        }
    };
    let Some(overlap) = snat.intersect(eph) else {
        return check(
            "snat-ports",
            None,
            Verdict::Pass,
            format!("node.snat.ports {snat} ({from}) is outside the ephemeral range {eph}"),
            WHY,
        );
    };
    let (reserved, unread) = match &f.reserved_ports {
        Ok(r) => (r.clone(), None),
        Err(e) => (Vec::new(), Some(e.clone())),
    };
    let open = ports::uncovered(overlap, &reserved);
    let reserved_text = match &unread {
        Some(e) => format!("unreadable: {e}"),
        None => ports::list(&reserved),
    };
    if open.is_empty() {
        return check(
            "snat-ports",
            None,
            Verdict::Pass,
            format!("node.snat.ports {snat} ({from}) overlaps the ephemeral range {eph} in {overlap}, all of it in ip_local_reserved_ports ({reserved_text})"),
            WHY,
        );
    }
    let count: u32 = open.iter().map(|r| r.count()).sum();
    let mut want = reserved.clone();
    want.extend(open.iter().copied());
    let want = ports::list(&ports::merge(want));
    check(
        "snat-ports",
        None,
        Verdict::Fail,
        format!(
            "node.snat.ports {snat} ({from}) overlaps the ephemeral range {eph} (net.ipv4.ip_local_port_range) in {overlap}; {count} of those ports ({}) are not in net.ipv4.ip_local_reserved_ports ({reserved_text})",
            ports::list(&open)
        ),
        WHY,
    )
    .fix(format!(
        "move node.snat.ports out of {eph} (the default, 1024-32767, is below Linux's default range), or reserve the overlap for full NAT: sysctl -w net.ipv4.ip_local_reserved_ports={want} (and in /etc/sysctl.d/; it covers IPv6 too)"
    ))
    .blocking(&opts.fullnat_modes())
}

/// The largest MTU for which drivers accept a single-buffer XDP program
/// natively: veth's with 4 KiB pages (4096 - 256 bytes of XDP headroom -
/// 320 of skb_shared_info - 14 of Ethernet header), about what most NIC
/// drivers allow. Rivora's programs are single-buffer; above it the
/// attach is refused (ERANGE on veth, seen here).
pub const XDP_SINGLE_BUFFER_MTU: u32 = 3506;

fn mtu(i: &Iface) -> Check {
    const WHY: &str = "L3 DSR adds an outer header (20 bytes IPv4, 40 IPv6): a full-size client packet no longer fits a 1500-byte path, the kernel refuses it (DF), and its 'fragmentation needed' goes to this node, the outer source, not to the client. And drivers take a single-buffer XDP program, which Rivora's are, only up to an MTU of about 3,500 bytes";
    let s = Some(i.name.as_str());
    let Some(m) = i.mtu else {
        return check("mtu", s, Verdict::Warn, "MTU unknown".into(), WHY);
    };
    if m > XDP_SINGLE_BUFFER_MTU {
        check(
            "mtu",
            s,
            Verdict::Warn,
            format!(
                "MTU {m}: above {XDP_SINGLE_BUFFER_MTU}, drivers refuse a single-buffer XDP program natively (xdpMode native fails, auto falls back to generic)"
            ),
            WHY,
        )
        .fix(format!(
            "an MTU of at most {XDP_SINGLE_BUFFER_MTU} on the interfaces rivorad attaches to (1540 or more leaves room for L3 DSR)"
        ))
    } else if m >= 1540 {
        check(
            "mtu",
            s,
            Verdict::Pass,
            format!("MTU {m}: room for a 1500-byte packet and L3 DSR's 40, and native XDP"),
            WHY,
        )
    } else {
        check(
            "mtu",
            s,
            Verdict::Warn,
            format!(
                "MTU {m}: an L3 DSR packet fits only if the client's is at most {} (IPv4) or {} (IPv6) bytes",
                m.saturating_sub(20),
                m.saturating_sub(40)
            ),
            WHY,
        )
        .fix(format!(
            "an MTU of at least 1540 from this node to the backends, or have backends advertise a smaller MSS (`ip route change ... advmss {}` on each), or use NAT/DSR for large flows",
            m.saturating_sub(80)
        ))
    }
}

pub fn ip_forward(f: &Facts) -> Check {
    const WHY: &str = "NAT replies are forwarded by the kernel (tc_nat rewrites them on the way out), and NAT, L3 DSR and full NAT hand the kernel what XDP cannot send itself (a neighbour not yet resolved, another egress)";
    match (f.ip_forward, f.ipv6_forwarding) {
        (Some(true), Some(true)) => check(
            "ip-forward",
            None,
            Verdict::Pass,
            "net.ipv4.ip_forward 1, net.ipv6.conf.all.forwarding 1".into(),
            WHY,
        ),
        (Some(true), None) => check(
            "ip-forward",
            None,
            Verdict::Pass,
            "net.ipv4.ip_forward 1 (IPv6 disabled)".into(),
            WHY,
        ),
        (Some(true), Some(false)) => check(
            "ip-forward",
            None,
            Verdict::Warn,
            "net.ipv4.ip_forward 1, net.ipv6.conf.all.forwarding 0: IPv6 NAT and L3 DSR VIPs will not forward".into(),
            WHY,
        )
        .fix("sysctl -w net.ipv6.conf.all.forwarding=1 (and in /etc/sysctl.d/)"),
        (v4, _) => check(
            "ip-forward",
            None,
            Verdict::Fail,
            match v4 {
                Some(false) => "net.ipv4.ip_forward 0".into(),
                _ => "net.ipv4.ip_forward unreadable".into(),
            },
            WHY,
        )
        .fix("sysctl -w net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 (and in /etc/sysctl.d/)")
        .blocking(&[Mode::Nat, Mode::L3dsr, Mode::Fullnat]),
    }
}

pub fn kube_proxy(f: &Facts) -> Check {
    const WHY: &str = "kube-proxy programs every LoadBalancer Service's ingress address too: traffic from pods and nodes to a VIP is sent straight to an endpoint by kube-proxy, never through Rivora; in IPVS mode every VIP is a local address of kube-ipvs0, and without strictARP every node answers ARP for it";
    match &f.kube_proxy {
        KubeProxy::NotFound => check(
            "kube-proxy",
            None,
            Verdict::Pass,
            "no kube-proxy (nothing on its metrics port, no kube-ipvs0, no process)".into(),
            WHY,
        ),
        KubeProxy::Running { mode, seen } if mode == "ipvs" => check(
            "kube-proxy",
            None,
            Verdict::Fail,
            format!("kube-proxy in ipvs mode ({seen})"),
            WHY,
        )
        .fix("set strictARP: true in kube-proxy's configuration (kubectl -n kube-system edit configmap kube-proxy, ipvs.strictARP), as MetalLB requires, then restart kube-proxy")
        .blocking(&[Mode::L2]),
        KubeProxy::Running { mode, seen } => check(
            "kube-proxy",
            None,
            Verdict::Warn,
            format!("kube-proxy in {mode} mode ({seen}): in-cluster clients of a VIP bypass Rivora"),
            WHY,
        )
        .fix("nothing, if in-cluster clients may bypass Rivora's policies; otherwise run a cluster without kube-proxy's Service handling"),
    }
}

pub fn memory(f: &Facts, flow_table_size: u64) -> Check {
    const WHY: &str = "BPF maps are preallocated kernel memory: charged to the memory cgroup of the process that creates them (5.11+), or to RLIMIT_MEMLOCK before";
    let need = flow_table_size * FLOW_BYTES_PER_ENTRY + MEMORY_BESIDE_FLOWS;
    let mib = |b: u64| b >> 20;
    let memcg = kernel_version(&f.kernel_release).is_none_or(|v| v >= MEMCG_ACCOUNTING);
    let limit = if memcg { f.memory_max } else { f.memlock };
    let what = if memcg {
        "the memory cgroup's limit"
    } else {
        "RLIMIT_MEMLOCK"
    };
    let found = match limit {
        None => format!(
            "{what}: unlimited; the maps and rivorad need about {} MiB at -flow-table-size {flow_table_size}",
            mib(need)
        ),
        Some(l) => format!(
            "{what}: {} MiB; the maps and rivorad need about {} MiB at -flow-table-size {flow_table_size}",
            mib(l),
            mib(need)
        ),
    };
    match limit {
        Some(l) if l < need => check("memory", None, Verdict::Fail, found, WHY)
            .fix(if memcg {
                format!(
                    "raise the pod's memory limit (rivorad.resources.limits.memory) to at least {} Mi, or lower rivorad.flowTableSize",
                    mib(need)
                )
            } else {
                "ulimit -l unlimited (LimitMEMLOCK=infinity in the unit)".into()
            })
            .blocking(ALL_FORWARDING),
        _ => check("memory", None, Verdict::Pass, found, WHY),
    }
}

pub fn clocksource(f: &Facts) -> Check {
    const WHY: &str = "the SYN rate limiter reads the clock (bpf_ktime_get_ns) for every SYN to a limited VIP: a clock source read through an I/O port costs microseconds per read, and a SYN flood is when it matters";
    const FAST: &[&str] = &[
        "tsc",
        "kvm-clock",
        "arch_sys_counter",
        "hyperv_clocksource_tsc_page",
        "timebase",
        "riscv_clocksource",
    ];
    const SLOW: &[&str] = &["hpet", "acpi_pm", "jiffies", "refined-jiffies", "pit"];
    match f.clocksource.as_deref() {
        Some(c) if FAST.contains(&c) => check(
            "clocksource",
            None,
            Verdict::Pass,
            format!("{c}: read without a trap"),
            WHY,
        ),
        Some(c) if SLOW.contains(&c) => check(
            "clocksource",
            None,
            Verdict::Warn,
            format!("{c}: slow to read"),
            WHY,
        )
        .fix("use the TSC: `echo tsc > /sys/devices/system/clocksource/clocksource0/current_clocksource` (and clocksource=tsc on the kernel command line); the kernel falls back to hpet when it finds the TSC unstable"),
        Some(c) => check(
            "clocksource",
            None,
            Verdict::Pass,
            format!("{c}: not known to be slow"),
            WHY,
        ),
        None => check(
            "clocksource",
            None,
            Verdict::Warn,
            "current_clocksource unreadable".into(),
            WHY,
        ),
    }
}

pub fn bpf_jit(f: &Facts) -> Check {
    const WHY: &str = "without the JIT every program runs in the kernel's BPF interpreter, several times slower per packet";
    match f.bpf_jit {
        Some(0) => check(
            "bpf-jit",
            None,
            Verdict::Warn,
            "net.core.bpf_jit_enable 0: interpreted".into(),
            WHY,
        )
        .fix("sysctl -w net.core.bpf_jit_enable=1"),
        Some(v) => check(
            "bpf-jit",
            None,
            Verdict::Pass,
            format!("net.core.bpf_jit_enable {v}"),
            WHY,
        ),
        None => check(
            "bpf-jit",
            None,
            Verdict::Pass,
            "no bpf_jit_enable: a JIT-only kernel".into(),
            WHY,
        ),
    }
}

/// Every check, in the order a node is brought up.
pub fn evaluate(f: &Facts, opts: &Options) -> Report {
    let mut checks = vec![
        kernel(f),
        btf(f),
        bpffs(f),
        capabilities(f, &opts.modes, opts.kubernetes, opts.bgp_listen_port),
        memory(f, opts.flow_table_size),
        bpf_jit(f),
    ];
    if let Some(e) = &f.interfaces_error {
        checks.push(
            check(
                "interface",
                None,
                Verdict::Fail,
                e.clone(),
                "every interface check needs the list",
            )
            .blocking(ALL_FORWARDING),
        );
    }
    for i in &f.interfaces {
        checks.extend(interface(f, i, opts));
    }
    if f.interfaces.is_empty() && f.interfaces_error.is_none() {
        checks.push(
            check(
                "interface",
                None,
                Verdict::Fail,
                "no interface to attach to".into(),
                "rivorad attaches to the interfaces its configuration names",
            )
            .fix("pass --interface NAME (or --config FILE)")
            .blocking(ALL_FORWARDING),
        );
    }
    checks.push(ip_forward(f));
    checks.push(snat_ports(f, opts));
    checks.push(kube_proxy(f));
    checks.push(clocksource(f));
    Report::new(opts.modes.clone(), checks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::genl::{XDP_ACT_BASIC, XDP_ACT_REDIRECT};
    use crate::probe::BPF_FS_MAGIC;

    const ALL_CAPS: u64 = (1 << 12) | (1 << 38) | (1 << 39) | (1 << 13) | (1 << 10);

    fn iface() -> Iface {
        Iface {
            name: "eth0".into(),
            ifindex: Some(2),
            mtu: Some(3000),
            xdp_features: Some(XDP_ACT_BASIC | XDP_ACT_REDIRECT),
            xdp: Vec::new(),
            tcx: Vec::new(),
            tcx_error: None,
            rp_filter: Some(0),
            // As rivorad leaves it (before it runs, 0 passes too: see
            // accept_local_cases).
            accept_local: Some(1),
            accept_local_writable: Ok(()),
        }
    }

    fn pr(first: u16, last: u16) -> PortRange {
        PortRange::new(first, last).expect("a range")
    }

    /// A node where everything passes.
    fn good() -> Facts {
        Facts {
            kernel_release: "6.18.0-1-amd64".into(),
            btf: Ok(5 << 20),
            bpffs_path: "/sys/fs/bpf".into(),
            bpffs_type: Ok(BPF_FS_MAGIC),
            capabilities: Ok(ALL_CAPS),
            interfaces: vec![iface()],
            interfaces_error: None,
            ip_forward: Some(true),
            ipv6_forwarding: Some(true),
            rp_filter_all: Some(0),
            accept_local_all: Some(0),
            // Linux's defaults.
            ephemeral_ports: Ok(pr(32768, 60999)),
            reserved_ports: Ok(Vec::new()),
            kube_proxy: KubeProxy::NotFound,
            memlock: Some(8 << 20),
            memory_max: None,
            clocksource: Some("tsc".into()),
            bpf_jit: Some(1),
        }
    }

    fn all_modes() -> Options {
        Options {
            modes: vec![
                Mode::Nat,
                Mode::Dsr,
                Mode::L3dsr,
                Mode::Fullnat,
                Mode::L2,
                Mode::Bgp,
            ],
            flow_table_size: 131_072,
            kubernetes: false,
            bgp_listen_port: 179,
            snat_ports: pr(1024, 32767),
            snat_ports_from: "the default".into(),
            local_source_vip: None,
        }
    }

    /// Only the modes differ from [`all_modes`].
    fn modes(m: &[Mode]) -> Options {
        Options {
            modes: m.to_vec(),
            ..all_modes()
        }
    }

    fn find<'a>(r: &'a Report, id: &str) -> &'a Check {
        r.checks
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no check {id} in {r:#?}"))
    }

    #[test]
    fn a_good_node_passes_everything() {
        let r = evaluate(&good(), &all_modes());
        for c in &r.checks {
            assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
            assert!(c.fix.is_none() && c.blocks.is_empty(), "{c:#?}");
        }
        assert!(!r.blocking);
        let ids: Vec<&str> = r.checks.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "kernel",
                "btf",
                "bpffs",
                "capabilities",
                "memory",
                "bpf-jit",
                "xdp-driver",
                "xdp-programs",
                "tcx-programs",
                "rp-filter",
                "accept-local",
                "mtu",
                "ip-forward",
                "snat-ports",
                "kube-proxy",
                "clocksource"
            ]
        );
    }

    /// Each fault: its verdict, what blocks, and a fix that names the remedy.
    #[test]
    fn each_fault_says_what_and_how() {
        type Case = (
            &'static str,
            fn(&mut Facts),
            Verdict,
            &'static [Mode],
            &'static str,
        );
        let cases: &[Case] = &[
            (
                "kernel",
                |f| f.kernel_release = "6.1.0-13-amd64".into(),
                Verdict::Fail,
                &Mode::FORWARDING,
                "6.6 or newer",
            ),
            (
                "kernel",
                |f| f.kernel_release = "weird".into(),
                Verdict::Fail,
                &Mode::FORWARDING,
                "6.6 or newer",
            ),
            (
                "btf",
                |f| f.btf = Err("No such file".into()),
                Verdict::Fail,
                &Mode::FORWARDING,
                "CONFIG_DEBUG_INFO_BTF",
            ),
            (
                "bpffs",
                |f| f.bpffs_type = Ok(0x0102_1994),
                Verdict::Fail,
                &Mode::FORWARDING,
                "mount -t bpf bpf /sys/fs/bpf",
            ),
            (
                "capabilities",
                |f| f.capabilities = Ok(ALL_CAPS & !(1 << 38)),
                Verdict::Fail,
                &Mode::FORWARDING,
                "CAP_PERFMON",
            ),
            (
                "capabilities",
                |f| f.capabilities = Ok(ALL_CAPS & !(1 << 13)),
                Verdict::Fail,
                &[Mode::L2],
                "CAP_NET_RAW",
            ),
            (
                "memory",
                |f| f.memory_max = Some(64 << 20),
                Verdict::Fail,
                &Mode::FORWARDING,
                "rivorad.resources.limits.memory",
            ),
            (
                "bpf-jit",
                |f| f.bpf_jit = Some(0),
                Verdict::Warn,
                &[],
                "bpf_jit_enable=1",
            ),
            (
                "xdp-driver",
                |f| f.interfaces[0].xdp_features = Some(0),
                Verdict::Warn,
                &[],
                "native XDP",
            ),
            (
                "xdp-programs",
                |f| {
                    f.interfaces[0].xdp = vec![Prog {
                        id: 7,
                        name: Some("cil_xdp_entry".into()),
                        hook: "xdp native".into(),
                        pinned_by_rivora: false,
                    }]
                },
                Verdict::Fail,
                &Mode::FORWARDING,
                "xdp off",
            ),
            (
                "xdp-programs",
                |f| {
                    f.interfaces[0].xdp = vec![Prog {
                        id: 7,
                        name: Some("xdp_ingress".into()),
                        hook: "xdp native".into(),
                        pinned_by_rivora: false,
                    }]
                },
                Verdict::Fail,
                &Mode::FORWARDING,
                "stop the other rivorad",
            ),
            (
                "tcx-programs",
                |f| {
                    f.interfaces[0].tcx = vec![Prog {
                        id: 9,
                        name: Some("cil_to_netdev".into()),
                        hook: "tcx egress".into(),
                        pinned_by_rivora: false,
                    }]
                },
                Verdict::Warn,
                &[],
                "TC_NEXT",
            ),
            (
                "rp-filter",
                |f| f.interfaces[0].rp_filter = Some(1),
                Verdict::Fail,
                &[Mode::Dsr, Mode::L3dsr, Mode::Fullnat],
                "rp_filter=2",
            ),
            (
                "rp-filter",
                |f| f.rp_filter_all = Some(1),
                Verdict::Fail,
                &[Mode::Dsr, Mode::L3dsr, Mode::Fullnat],
                "rp_filter=2",
            ),
            (
                "accept-local",
                |f| {
                    f.interfaces[0].accept_local = Some(0);
                    f.interfaces[0].accept_local_writable =
                        Err("/proc/sys/net/ipv4/conf/eth0/accept_local: Read-only file system (os error 30)".into())
                },
                Verdict::Fail,
                &[Mode::L3dsr, Mode::Fullnat],
                "set it on the host: sysctl -w net.ipv4.conf.eth0.accept_local=1",
            ),
            (
                "accept-local",
                |f| {
                    f.interfaces[0].accept_local = Some(0);
                    f.interfaces[0].xdp = vec![Prog {
                        id: 3,
                        name: Some("xdp_ingress".into()),
                        hook: "xdp native".into(),
                        pinned_by_rivora: true,
                    }]
                },
                Verdict::Warn,
                &[],
                "sysctl -w net.ipv4.conf.eth0.accept_local=1",
            ),
            (
                "accept-local",
                |f| f.accept_local_all = None,
                Verdict::Warn,
                &[],
                "",
            ),
            (
                "snat-ports",
                |f| f.ephemeral_ports = Ok(pr(1024, 65535)),
                Verdict::Fail,
                &[Mode::Fullnat],
                "sysctl -w net.ipv4.ip_local_reserved_ports=1024-32767",
            ),
            (
                "snat-ports",
                |f| f.ephemeral_ports = Err("unreadable".into()),
                Verdict::Warn,
                &[],
                "",
            ),
            (
                "mtu",
                |f| f.interfaces[0].mtu = Some(1500),
                Verdict::Warn,
                &[],
                "advmss 1420",
            ),
            (
                "mtu",
                |f| f.interfaces[0].mtu = Some(9000),
                Verdict::Warn,
                &[],
                "at most 3506",
            ),
            (
                "ip-forward",
                |f| f.ip_forward = Some(false),
                Verdict::Fail,
                &[Mode::Nat, Mode::L3dsr, Mode::Fullnat],
                "ip_forward=1",
            ),
            (
                "ip-forward",
                |f| f.ipv6_forwarding = Some(false),
                Verdict::Warn,
                &[],
                "forwarding=1",
            ),
            (
                "kube-proxy",
                |f| {
                    f.kube_proxy = KubeProxy::Running {
                        mode: "ipvs".into(),
                        seen: "x".into(),
                    }
                },
                Verdict::Fail,
                &[Mode::L2],
                "strictARP",
            ),
            (
                "kube-proxy",
                |f| {
                    f.kube_proxy = KubeProxy::Running {
                        mode: "iptables".into(),
                        seen: "x".into(),
                    }
                },
                Verdict::Warn,
                &[],
                "without kube-proxy",
            ),
            (
                "clocksource",
                |f| f.clocksource = Some("hpet".into()),
                Verdict::Warn,
                &[],
                "tsc",
            ),
        ];
        for (id, fault, verdict, blocks, fix) in cases {
            let mut f = good();
            fault(&mut f);
            let r = evaluate(&f, &all_modes());
            let c = find(&r, id);
            assert_eq!(c.verdict, *verdict, "{c:#?}");
            assert_eq!(c.blocks, *blocks, "{c:#?}");
            assert!(
                c.fix.as_deref().unwrap_or("").contains(fix),
                "{id}: fix {:?} lacks {fix:?}",
                c.fix
            );
            assert_eq!(r.blocking, !blocks.is_empty(), "{id}: blocking");
            // Every other check still passes: one fault, one verdict.
            for other in r.checks.iter().filter(|o| !std::ptr::eq(*o, c)) {
                assert_eq!(other.verdict, Verdict::Pass, "{id} changed {other:#?}");
            }
        }
    }

    /// A failure blocks only the modes it names: asked for NAT alone,
    /// strict rp_filter is reported but the node is ready.
    #[test]
    fn blocking_follows_the_chosen_modes() {
        let mut f = good();
        f.interfaces[0].rp_filter = Some(1);
        let nat = modes(&[Mode::Nat]);
        assert!(!evaluate(&f, &nat).blocking);
        let dsr = modes(&[Mode::Dsr]);
        assert!(evaluate(&f, &dsr).blocking);
        // Missing NET_RAW matters only to l2.
        let mut f = good();
        f.capabilities = Ok(ALL_CAPS & !(1 << 13));
        assert!(!evaluate(&f, &nat).blocking);
        let c = find(&evaluate(&f, &nat), "capabilities").clone();
        assert_eq!(
            c.verdict,
            Verdict::Pass,
            "NET_RAW is not asked of a NAT-only node: {c:#?}"
        );
        // With Kubernetes the L2 speaker always runs: NET_RAW blocks all.
        let k8s = Options {
            kubernetes: true,
            ..nat
        };
        let r = evaluate(&f, &k8s);
        assert!(r.blocking);
        assert_eq!(find(&r, "capabilities").blocks, Mode::FORWARDING);
    }

    /// BGP asks NET_BIND_SERVICE only for a listener below 1024.
    #[test]
    fn bgp_needs_net_bind_service_below_1024_only() {
        let mut f = good();
        f.capabilities = Ok(ALL_CAPS & !(1 << CAP_NET_BIND_SERVICE.0));
        let at = |port: u16| Options {
            kubernetes: true,
            bgp_listen_port: port,
            ..modes(&[Mode::Nat, Mode::Bgp])
        };
        let r = evaluate(&f, &at(179));
        let c = find(&r, "capabilities");
        assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
        assert_eq!(c.blocks, vec![Mode::Bgp]);
        assert!(c.found.contains("missing: NET_BIND_SERVICE"), "{c:#?}");
        assert!(r.blocking);
        for port in [0, 1179] {
            let r = evaluate(&f, &at(port));
            let c = find(&r, "capabilities");
            assert_eq!(c.verdict, Verdict::Pass, "port {port}: {c:#?}");
            assert!(!c.found.contains("NET_BIND_SERVICE"), "{c:#?}");
            assert!(!r.blocking);
        }
    }

    #[test]
    fn rivoras_own_programs_pass() {
        let mut f = good();
        f.interfaces[0].xdp = vec![Prog {
            id: 3,
            name: Some("xdp_ingress".into()),
            hook: "xdp native".into(),
            pinned_by_rivora: true,
        }];
        f.interfaces[0].tcx = vec![Prog {
            id: 4,
            name: None,
            hook: "tcx egress".into(),
            pinned_by_rivora: true,
        }];
        let r = evaluate(&f, &all_modes());
        assert_eq!(find(&r, "xdp-programs").verdict, Verdict::Pass);
        assert!(find(&r, "xdp-programs").found.contains("takes it over"));
        assert_eq!(find(&r, "tcx-programs").verdict, Verdict::Pass);
    }

    #[test]
    fn a_missing_interface_fails() {
        let mut f = good();
        f.interfaces[0].ifindex = None;
        let r = evaluate(&f, &all_modes());
        let c = find(&r, "interface");
        assert_eq!(c.verdict, Verdict::Fail);
        assert!(r.blocking);
        assert!(
            !r.checks.iter().any(|c| c.id == "xdp-driver"),
            "no per-interface checks for a missing one"
        );
    }

    /// The full-NAT port check from parsed ranges: node.snat.ports
    /// against the ephemeral range, less the reserved ports.
    #[test]
    fn snat_ports_against_the_ephemeral_range() {
        let judge = |snat: PortRange, eph: PortRange, reserved: Vec<PortRange>| {
            let mut f = good();
            f.ephemeral_ports = Ok(eph);
            f.reserved_ports = Ok(reserved);
            let opts = Options {
                snat_ports: snat,
                snat_ports_from: "/etc/rivora/rivora.yaml".into(),
                ..all_modes()
            };
            snat_ports(&f, &opts)
        };
        // The defaults: below the range.
        let c = judge(pr(1024, 32767), pr(32768, 60999), vec![]);
        assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
        assert!(
            c.found.contains("outside the ephemeral range 32768-60999"),
            "{c:#?}"
        );
        // Above it, and touching neither end.
        assert_eq!(
            judge(pr(61000, 65535), pr(32768, 60999), vec![]).verdict,
            Verdict::Pass
        );
        // A widened ephemeral range takes full NAT's ports.
        let c = judge(pr(1024, 32767), pr(1024, 65535), vec![]);
        assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
        assert_eq!(c.blocks, vec![Mode::Fullnat]);
        assert!(
            c.found
                .contains("node.snat.ports 1024-32767 (/etc/rivora/rivora.yaml)")
                && c.found.contains("ephemeral range 1024-65535")
                && c.found.contains("31744 of those ports (1024-32767)")
                && c.found.contains("ip_local_reserved_ports ((none))"),
            "{c:#?}"
        );
        let fix = c.fix.as_deref().unwrap_or("");
        assert!(
            fix.contains("move node.snat.ports out of 1024-65535"),
            "{fix}"
        );
        assert!(fix.contains("ip_local_reserved_ports=1024-32767 "), "{fix}");
        // Every overlapping port reserved: fine.
        let c = judge(
            pr(30000, 40000),
            pr(32768, 60999),
            vec![pr(8080, 8080), pr(32000, 45000)],
        );
        assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
        assert!(c.found.contains("in 32768-40000, all of it"), "{c:#?}");
        // Part of it reserved: the rest named, and the fix keeps what is
        // reserved already beside it.
        let c = judge(
            pr(30000, 40000),
            pr(32768, 60999),
            vec![pr(8080, 8080), pr(35000, 36000)],
        );
        assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
        assert!(c.found.contains("(32768-34999,36001-40000)"), "{c:#?}");
        assert!(
            c.fix
                .as_deref()
                .unwrap_or("")
                .contains("ip_local_reserved_ports=8080,32768-40000 "),
            "{c:#?}"
        );
        // One port of overlap is an overlap.
        let c = judge(pr(1024, 32768), pr(32768, 60999), vec![]);
        assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
        assert!(c.found.contains("1 of those ports (32768)"), "{c:#?}");
        // Unreadable reserved ports: the overlap is not known to be held
        // back.
        let mut f = good();
        f.ephemeral_ports = Ok(pr(1024, 65535));
        f.reserved_ports = Err("no such file".into());
        let c = snat_ports(&f, &all_modes());
        assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
        assert!(c.found.contains("unreadable: no such file"), "{c:#?}");
    }

    /// With Kubernetes, NAT VIPs reach other nodes' endpoints by full NAT:
    /// the full-NAT checks block nat too.
    #[test]
    fn kubernetes_nat_is_full_nat_too() {
        let mut f = good();
        f.ephemeral_ports = Ok(pr(1024, 65535));
        f.interfaces[0].accept_local = Some(0);
        f.interfaces[0].accept_local_writable = Err("read-only".into());
        let k8s_nat = Options {
            kubernetes: true,
            ..modes(&[Mode::Nat])
        };
        let r = evaluate(&f, &k8s_nat);
        assert_eq!(
            find(&r, "snat-ports").blocks,
            vec![Mode::Nat, Mode::Fullnat]
        );
        assert_eq!(
            find(&r, "accept-local").blocks,
            vec![Mode::Nat, Mode::L3dsr, Mode::Fullnat]
        );
        assert!(r.blocking);
        // A static NAT node does not use full NAT unless asked.
        let r = evaluate(&f, &modes(&[Mode::Nat]));
        assert_eq!(find(&r, "snat-ports").blocks, vec![Mode::Fullnat]);
        assert!(!r.blocking, "{r:#?}");
        let mut f = good();
        f.interfaces[0].rp_filter = Some(1);
        assert_eq!(
            find(&evaluate(&f, &k8s_nat), "rp-filter").blocks,
            vec![Mode::Nat, Mode::Dsr, Mode::L3dsr, Mode::Fullnat]
        );
    }

    /// accept_local: passes at 1 (either `all` or the interface's), and at
    /// 0 before rivorad runs (it sets it); with Rivora's datapath attached
    /// at 0, fails if the configuration has a VIP for which rivorad set it
    /// (something reset it), warns if not; fails whenever rivorad could
    /// not write it.
    #[test]
    fn accept_local_cases() {
        let attached = vec![Prog {
            id: 3,
            name: None,
            hook: "xdp native".into(),
            pinned_by_rivora: true,
        }];
        let with_vip = Options {
            local_source_vip: Some("VIP web is fullnat".into()),
            ..all_modes()
        };
        let judge = |all: u32, own: u32, xdp: &[Prog], opts: &Options| {
            // (good() has it at 1.)
            let mut f = good();
            f.accept_local_all = Some(all);
            f.interfaces[0].accept_local = Some(own);
            f.interfaces[0].xdp = xdp.to_vec();
            accept_local(&f, &f.interfaces[0], opts)
        };
        for (all, own) in [(1, 0), (0, 1), (1, 1)] {
            let c = judge(all, own, &attached, &with_vip);
            assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
            assert!(c.found.starts_with("accept_local 1"), "{c:#?}");
        }
        let c = judge(0, 0, &[], &with_vip);
        assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
        assert!(c.found.contains("rivorad sets it to 1"), "{c:#?}");
        let c = judge(0, 0, &attached, &with_vip);
        assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
        assert_eq!(c.blocks, vec![Mode::L3dsr, Mode::Fullnat]);
        assert!(
            c.found.contains("VIP web is fullnat") && c.found.contains("something reset it"),
            "{c:#?}"
        );
        assert!(
            c.fix.as_deref().unwrap_or("").contains("/etc/sysctl.d/"),
            "{c:#?}"
        );
        // Another rivorad's xdp_ingress counts as attached too.
        let other = vec![Prog {
            id: 4,
            name: Some("xdp_ingress".into()),
            hook: "xdp native".into(),
            pinned_by_rivora: false,
        }];
        assert_eq!(judge(0, 0, &other, &with_vip).verdict, Verdict::Fail);
        let c = judge(0, 0, &attached, &all_modes());
        assert_eq!(c.verdict, Verdict::Warn, "{c:#?}");
        assert!(c.blocks.is_empty());
        // Not writable: rivorad cannot set it, attached or not.
        let mut f = good();
        f.interfaces[0].accept_local = Some(0);
        f.interfaces[0].accept_local_writable = Err("Read-only file system".into());
        let c = accept_local(&f, &f.interfaces[0], &all_modes());
        assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
        assert!(c.found.contains("Read-only file system"), "{c:#?}");
        // ... which does not matter once it is 1.
        f.interfaces[0].accept_local = Some(1);
        let c = accept_local(&f, &f.interfaces[0], &all_modes());
        assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(kernel_version("6.18.44-fc-v1098"), Some((6, 18)));
        assert_eq!(kernel_version("6.6.0"), Some((6, 6)));
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("x"), None);
    }

    /// What the checks take from rivorad's configuration: interfaces,
    /// node.snat.ports (or its default) and a VIP for which rivorad sets
    /// accept_local (the file gives backends no mode of their own).
    #[test]
    fn node_config_from_a_file() {
        let dir = std::env::temp_dir().join(format!("rivora-doctor-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rivora.yaml");
        let read = |yaml: &str| {
            std::fs::write(&file, yaml).unwrap();
            crate::probe::node_config(Some(&file))
                .expect("a valid config")
                .expect("the file given")
        };
        let nat = "interfaces:\n  - name: eth0\n\
                   vips:\n  - { name: web, address: 10.0.0.100, port: 80, protocol: tcp, mode: nat,\n\
                   \x20     backends: [{ address: 10.1.0.11 }] }\n";
        let c = read(nat);
        assert_eq!(c.interfaces, ["eth0"]);
        assert_eq!(c.snat_ports, pr(1024, 32767));
        assert_eq!(c.local_source_vip, None);
        let c = read(&format!(
            "{nat}node:\n  snat: {{ ipv4: 10.0.0.2, ports: \"40000-50000\" }}\n"
        ));
        assert_eq!(c.snat_ports, pr(40000, 50000));
        assert_eq!(c.local_source_vip, None);
        let c = read(&nat.replace("mode: nat", "mode: fullnat"));
        assert_eq!(c.local_source_vip.as_deref(), Some("VIP web is fullnat"));
        let c = read(&format!(
            "{}node:\n  tunnelSource: {{ ipv4: 10.0.0.2 }}\n",
            nat.replace("mode: nat", "mode: l3dsr")
        ));
        assert_eq!(c.local_source_vip.as_deref(), Some("VIP web is l3dsr"));
        std::fs::write(&file, "interfaces: [").unwrap();
        assert!(crate::probe::node_config(Some(&file)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn memory_limits_v1_and_v2() {
        let dir = std::env::temp_dir().join(format!("rivora-doctor-cg-{}", std::process::id()));
        let v1 = dir.join("memory/a/b");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "67108864\n").unwrap();
        assert_eq!(
            crate::probe::memory_limit_from("4:memory:/a/b\n0::/\n", &dir),
            Some(64 << 20)
        );
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(
            crate::probe::memory_limit_from("4:memory:/a/b\n", &dir),
            None
        );
        let v2 = dir.join("c");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(crate::probe::memory_limit_from("0::/c\n", &dir), None);
        std::fs::write(v2.join("memory.max"), "1048576\n").unwrap();
        assert_eq!(
            crate::probe::memory_limit_from("0::/c\n", &dir),
            Some(1 << 20)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
