//! rivora-doctor on this machine: each check passes on a node set up
//! right, and sees each fault that can be made here, with the verdict,
//! the modes it blocks and the fix. The real binary, in a network
//! namespace of the test's own (`nsenter --net`, which keeps bpffs in
//! view); faults made for real: bpffs unmounted and BTF hidden in a mount
//! namespace of their own, another XDP program attached to the veth,
//! rp_filter strict, forwarding off, a capability dropped from the
//! bounding set, a small MTU, an interface without native XDP, a
//! kube-ipvs0 interface (what kube-proxy's IPVS mode creates), a memory
//! cgroup too small for the maps, an interface that does not exist, an
//! ephemeral port range over full NAT's ports, accept_local reset under a
//! running rivorad, /proc/sys read-only (as in a container).
//!
//! What cannot be made here without disturbing the machine (the kernel
//! version, the clock source, the BPF JIT, a running kube-proxy's
//! metrics port) is judged by the same code from fixtures:
//! crates/rivora-doctor/src/checks.rs's tests.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::netns::Netns;
use common::rivorad::{bins, Home, Rivorad};
use common::unique;
use rivora_doctor::{Check, Mode, Report, Verdict};

/// A node namespace with one veth end (`v0`) set up as rivorad wants it:
/// forwarding on, rp_filter off, an MTU with room for L3 DSR's outer
/// header and within what native single-buffer XDP takes.
fn node() -> Netns {
    let ns = Netns::new(&unique("doc-"));
    ns.exec("ip link add v0 type veth peer name v1 && ip link set v0 mtu 3000 up && ip link set v1 mtu 3000 up");
    ns.sysctls(&[
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.v0.rp_filter", "0"),
    ]);
    ns
}

/// Run the doctor in `ns` behind `wrapper` (a command that execs what
/// follows), `-o json`; its exit code and report.
fn doctor_with(ns: &Netns, wrapper: &[&str], args: &[&str]) -> (i32, Report) {
    let mut cmd = Command::new(wrapper.first().copied().unwrap_or("nsenter"));
    let rest: Vec<String> = if wrapper.is_empty() {
        vec![format!("--net={}", ns.path())]
    } else {
        wrapper[1..].iter().map(|s| s.to_string()).collect()
    };
    cmd.args(&rest);
    if !wrapper.is_empty() {
        cmd.arg("nsenter").arg(format!("--net={}", ns.path()));
    }
    cmd.arg(bins::rivora_doctor())
        .args(["-o", "json"])
        .args(args);
    let out = cmd.output().expect("running rivora-doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    let report: Report = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "rivora-doctor {args:?} printed no report ({e}):\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

fn doctor(ns: &Netns, args: &[&str]) -> (i32, Report) {
    doctor_with(ns, &[], args)
}

fn find<'a>(r: &'a Report, id: &str) -> &'a Check {
    r.checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no check {id} in {r:#?}"))
}

/// `id` failed, blocking exactly `blocks`, with a fix that says `fix`;
/// every other check passed.
fn only_failure(r: &Report, id: &str, blocks: &[Mode], fix: &str) {
    let c = find(r, id);
    assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
    assert_eq!(c.blocks, blocks, "{c:#?}");
    let f = c.fix.as_deref().unwrap_or("");
    assert!(f.contains(fix), "{id}: the fix {f:?} does not say {fix:?}");
    assert!(!c.why.is_empty());
    for o in r.checks.iter().filter(|o| o.id != id) {
        assert_eq!(o.verdict, Verdict::Pass, "besides {id}: {o:#?}");
    }
}

const ALL: &[&str] = &["-i", "v0", "--mode", "nat,dsr,l3dsr,fullnat"];

#[test]
fn a_ready_node_passes_every_check() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    let (code, r) = doctor(&ns, ALL);
    for c in &r.checks {
        assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
    }
    assert_eq!(code, 0, "{r:#?}");
    assert!(!r.blocking);
    // Every check ran, the interface's too.
    for id in [
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
        "clocksource",
    ] {
        find(&r, id);
    }
    assert!(
        find(&r, "xdp-driver").found.contains("native XDP"),
        "veth has native XDP"
    );
    // And the table: one line per check, then the verdict.
    let out = Command::new("nsenter")
        .arg(format!("--net={}", ns.path()))
        .arg(bins::rivora_doctor())
        .args(ALL)
        .output()
        .expect("rivora-doctor, table");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("CHECK"), "{table}");
    assert!(
        table.contains("modes: nat, dsr, l3dsr, fullnat: ready"),
        "{table}"
    );
}

#[test]
fn bpffs_unmounted_and_btf_hidden_in_a_mount_namespace() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    // Every bpffs mount at /sys/fs/bpf goes, in this mount namespace only.
    let unmount = "while [ \"$(stat -f -c %t /sys/fs/bpf)\" = cafe4a11 ]; do umount /sys/fs/bpf || exit 9; done; exec \"$@\"";
    let (code, r) = doctor_with(
        &ns,
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            unmount,
            "sh",
        ],
        ALL,
    );
    only_failure(
        &r,
        "bpffs",
        &Mode::FORWARDING,
        "mount -t bpf bpf /sys/fs/bpf",
    );
    assert!(
        find(&r, "bpffs").found.contains("not a bpf filesystem"),
        "{r:#?}"
    );
    assert_eq!(code, 1);
    let hide = "mount -t tmpfs none /sys/kernel/btf && exec \"$@\"";
    let (code, r) = doctor_with(
        &ns,
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            hide,
            "sh",
        ],
        ALL,
    );
    only_failure(&r, "btf", &Mode::FORWARDING, "CONFIG_DEBUG_INFO_BTF");
    assert_eq!(code, 1);
}

#[test]
fn another_xdp_program_on_the_interface() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    let decap = rivora::decap::Decap::load().expect("loading the decap object (xdp_pass)");
    let progs = decap.progs().expect("program fds");
    let link = ns.run(move || {
        progs
            .attach_pass(rivora::dataplane::attach::ifindex("v0").expect("v0"))
            .expect("xdp_pass on v0")
    });
    let (code, r) = doctor(&ns, ALL);
    only_failure(
        &r,
        "xdp-programs",
        &Mode::FORWARDING,
        "ip link set dev v0 xdp off",
    );
    let found = &find(&r, "xdp-programs").found;
    assert!(
        found.contains("xdp_pass") && found.contains("xdp native"),
        "{found}"
    );
    assert_eq!(code, 1);
    drop(link);
    let (code, r) = doctor(&ns, ALL);
    assert_eq!(find(&r, "xdp-programs").verdict, Verdict::Pass);
    assert_eq!(code, 0, "{r:#?}");
}

#[test]
fn strict_rp_filter_blocks_dsr_only() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    ns.sysctls(&[("net.ipv4.conf.v0.rp_filter", "1")]);
    let (code, r) = doctor(&ns, ALL);
    only_failure(
        &r,
        "rp-filter",
        &[Mode::Dsr, Mode::L3dsr, Mode::Fullnat],
        "net.ipv4.conf.v0.rp_filter=2",
    );
    assert_eq!(code, 1);
    // A NAT-only node is not held back by it.
    let (code, r) = doctor(&ns, &["-i", "v0", "--mode", "nat"]);
    assert_eq!(find(&r, "rp-filter").verdict, Verdict::Fail);
    assert!(!r.blocking);
    assert_eq!(code, 0);
    // `all` strict is strict whatever the interface says.
    ns.sysctls(&[
        ("net.ipv4.conf.v0.rp_filter", "0"),
        ("net.ipv4.conf.all.rp_filter", "1"),
    ]);
    let (code, r) = doctor(&ns, &["-i", "v0", "--mode", "dsr"]);
    assert!(find(&r, "rp-filter").found.contains("all 1"), "{r:#?}");
    assert_eq!(code, 1);
}

#[test]
fn forwarding_off_blocks_nat_and_l3dsr() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    ns.sysctls(&[("net.ipv4.ip_forward", "0")]);
    let (code, r) = doctor(&ns, ALL);
    only_failure(
        &r,
        "ip-forward",
        &[Mode::Nat, Mode::L3dsr, Mode::Fullnat],
        "net.ipv4.ip_forward=1",
    );
    assert_eq!(code, 1);
    let (code, _) = doctor(&ns, &["-i", "v0", "--mode", "dsr"]);
    assert_eq!(code, 0, "DSR forwards in XDP alone");
}

#[test]
fn a_capability_missing() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    // PERFMON out of the bounding set: what the doctor execs lacks it.
    let (code, r) = doctor_with(
        &ns,
        &[
            "setpriv",
            "--bounding-set",
            "-all,+bpf,+net_admin,+sys_admin",
            "--",
        ],
        ALL,
    );
    only_failure(&r, "capabilities", &Mode::FORWARDING, "CAP_PERFMON");
    assert!(find(&r, "capabilities").found.contains("missing: PERFMON"));
    assert_eq!(code, 1);
    // NET_RAW: the L2 speaker's, which always runs with Kubernetes.
    let no_raw = [
        "setpriv",
        "--bounding-set",
        "-all,+bpf,+net_admin,+perfmon,+sys_admin",
        "--",
    ];
    let (code, r) = doctor_with(&ns, &no_raw, ALL);
    assert_eq!(
        find(&r, "capabilities").verdict,
        Verdict::Pass,
        "a static NAT node needs no NET_RAW"
    );
    assert_eq!(code, 0);
    let mut args = ALL.to_vec();
    args.push("--kubernetes");
    let (code, r) = doctor_with(&ns, &no_raw, &args);
    only_failure(&r, "capabilities", &Mode::FORWARDING, "CAP_NET_RAW");
    assert_eq!(code, 1);
}

#[test]
fn small_mtu_warns_for_l3dsr() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    ns.exec("ip link set v0 mtu 1500");
    let (code, r) = doctor(&ns, ALL);
    let c = find(&r, "mtu");
    assert_eq!(c.verdict, Verdict::Warn, "{c:#?}");
    assert!(c.found.contains("MTU 1500"), "{c:#?}");
    assert!(
        c.fix.as_deref().unwrap_or("").contains("advmss 1420"),
        "{c:#?}"
    );
    assert_eq!(code, 0, "a warning blocks nothing");
    // Jumbo frames: veth refuses a single-buffer program natively above
    // 3506 (ERANGE), as the doctor warns.
    ns.exec("ip link set v0 mtu 9000 && ip link set v1 mtu 9000");
    let (code, r) = doctor(&ns, ALL);
    let c = find(&r, "mtu");
    assert_eq!(c.verdict, Verdict::Warn, "{c:#?}");
    assert!(
        c.fix.as_deref().unwrap_or("").contains("at most 3506"),
        "{c:#?}"
    );
    assert_eq!(code, 0);
    let decap = rivora::decap::Decap::load().expect("loading the decap object (xdp_pass)");
    let progs = decap.progs().expect("program fds");
    let refused = ns.run(move || {
        progs
            .attach_pass(rivora::dataplane::attach::ifindex("v0").expect("v0"))
            .err()
            .map(|e| e.to_string())
    });
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("out of range")),
        "native XDP on a 9000-byte veth: {refused:?}"
    );
}

#[test]
fn an_interface_without_native_xdp() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    // A bridge has no driver XDP (no dummy module on this machine).
    ns.exec("ip link add d0 type bridge && ip link set d0 up");
    ns.sysctls(&[("net.ipv4.conf.d0.rp_filter", "0")]);
    let (code, r) = doctor(&ns, &["-i", "d0", "--mode", "nat"]);
    let c = find(&r, "xdp-driver");
    assert_eq!(c.verdict, Verdict::Warn, "{c:#?}");
    assert!(c.found.contains("generic XDP"), "{c:#?}");
    assert_eq!(code, 0);
}

#[test]
fn kube_proxy_in_ipvs_mode_blocks_l2() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    // What kube-proxy's IPVS mode creates to hold every Service address.
    // (A dummy there; a bridge here: no dummy module on this machine.)
    ns.exec("ip link add kube-ipvs0 type bridge");
    let (code, r) = doctor(&ns, &["-i", "v0", "--mode", "nat", "--announce", "l2"]);
    only_failure(&r, "kube-proxy", &[Mode::L2], "strictARP");
    assert!(find(&r, "kube-proxy")
        .found
        .contains("ipvs mode (the kube-ipvs0 interface)"));
    assert_eq!(code, 1);
    let (code, _) = doctor(&ns, &["-i", "v0", "--mode", "nat", "--announce", "bgp"]);
    assert_eq!(code, 0, "BGP does not answer ARP");
}

#[test]
fn a_missing_interface() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    let (code, r) = doctor(&ns, &["-i", "nope0", "--mode", "nat"]);
    only_failure(&r, "interface", &Mode::FORWARDING, "rivorad.interfaces");
    assert_eq!(code, 1);
}

/// Full NAT's ports against the node's ephemeral range, both the
/// namespace's own sysctls: a widened range fails full NAT until what
/// overlaps is reserved; ports moved by the configuration are judged as
/// configured.
#[test]
fn snat_ports_in_the_ephemeral_range() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    ns.sysctls(&[("net.ipv4.ip_local_port_range", "1024 65000")]);
    let (code, r) = doctor(&ns, ALL);
    only_failure(
        &r,
        "snat-ports",
        &[Mode::Fullnat],
        "sysctl -w net.ipv4.ip_local_reserved_ports=1024-32767 ",
    );
    let found = &find(&r, "snat-ports").found;
    assert!(
        found.contains("node.snat.ports 1024-32767 (the default)")
            && found.contains("ephemeral range 1024-65000"),
        "{found}"
    );
    assert_eq!(code, 1);
    // Not asked for full NAT: reported, not blocking.
    let (code, r) = doctor(&ns, &["-i", "v0", "--mode", "nat,dsr,l3dsr"]);
    assert_eq!(find(&r, "snat-ports").verdict, Verdict::Fail);
    assert_eq!(code, 0, "{r:#?}");
    // With Kubernetes, NAT VIPs reach other nodes' endpoints by full NAT.
    let (code, r) = doctor(&ns, &["-i", "v0", "--mode", "nat", "--kubernetes"]);
    assert_eq!(find(&r, "snat-ports").blocks, [Mode::Nat, Mode::Fullnat]);
    assert_eq!(code, 1);
    // The fix it gave: the overlap reserved.
    ns.sysctls(&[("net.ipv4.ip_local_reserved_ports", "1024-32767")]);
    let (code, r) = doctor(&ns, ALL);
    assert_eq!(find(&r, "snat-ports").verdict, Verdict::Pass, "{r:#?}");
    assert_eq!(code, 0);
    // node.snat.ports from the configuration, partly reserved.
    let dir = std::env::temp_dir().join(unique("rivora-doctor-e2e-"));
    std::fs::create_dir_all(&dir).expect("scratch");
    let cfg = dir.join("rivora.yaml");
    std::fs::write(
        &cfg,
        "interfaces:\n  - name: v0\nnode:\n  snat: { ports: \"30000-40000\" }\n",
    )
    .expect("config");
    let cfg_arg = cfg.display().to_string();
    let (code, r) = doctor(&ns, &[ALL, &["--config", &cfg_arg]].concat());
    let c = find(&r, "snat-ports");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
    assert!(
        c.found
            .contains(&format!("node.snat.ports 30000-40000 ({cfg_arg})"))
            && c.found.contains("(32768-40000)"),
        "{c:#?}"
    );
    assert!(
        c.fix
            .as_deref()
            .unwrap_or("")
            .contains("ip_local_reserved_ports=1024-40000 "),
        "{c:#?}"
    );
    assert_eq!(code, 1);
}

/// rivorad sets accept_local when it applies a full-NAT VIP; reset under
/// it (its datapath attached, kept by -persist-datapath), the doctor
/// names that VIP and fails L3 DSR and full NAT.
#[test]
fn accept_local_reset_under_rivorad() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    ns.exec("ip addr add 10.77.0.1/24 dev v0");
    let home = Home::new();
    let pins = home.pin_dir().display().to_string();
    let yaml = format!(
        "interfaces:\n  - name: v0\n    xdpMode: native\n\
         node:\n  snat: {{ ipv4: 10.77.0.1 }}\n\
         api:\n  socket: {}\n\
         vips:\n  - {{ name: web, address: 10.77.100.1, port: 80, protocol: tcp, mode: fullnat,\n\
         \x20     healthCheck: false, backends: [{{ address: 10.77.0.2 }}] }}\n",
        home.socket().display()
    );
    let rd = Rivorad::start(&ns, home, &yaml, &["-persist-datapath"]);
    let cfg = rd.home.config().display().to_string();
    let args = [ALL, &["--config", &cfg, "--pin-dir", &pins]].concat();
    let (code, r) = doctor(&ns, &args);
    let c = find(&r, "accept-local");
    assert_eq!(c.verdict, Verdict::Pass, "rivorad set it: {c:#?}");
    assert!(c.found.contains("v0 1"), "{c:#?}");
    assert_eq!(
        find(&r, "xdp-programs").verdict,
        Verdict::Pass,
        "rivorad's own, pinned: {r:#?}"
    );
    assert_eq!(code, 0, "{r:#?}");

    ns.sysctls(&[("net.ipv4.conf.v0.accept_local", "0")]);
    let (code, r) = doctor(&ns, &args);
    only_failure(
        &r,
        "accept-local",
        &[Mode::L3dsr, Mode::Fullnat],
        "sysctl -w net.ipv4.conf.v0.accept_local=1",
    );
    assert!(
        find(&r, "accept-local")
            .found
            .contains("VIP web is fullnat: rivorad set it to 1, and something reset it"),
        "{r:#?}"
    );
    assert_eq!(code, 1);
    // Without the configuration, the doctor cannot tell: a warning.
    let (code, r) = doctor(&ns, &[ALL, &["--pin-dir", &pins]].concat());
    assert_eq!(find(&r, "accept-local").verdict, Verdict::Warn, "{r:#?}");
    assert_eq!(code, 0);
    drop(rd);
}

/// /proc/sys read-only, as a container's is unless privileged: rivorad
/// could not set accept_local either, so a 0 there fails L3 DSR and full
/// NAT; a 1 set on the host passes.
#[test]
fn accept_local_unwritable() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    let ro =
        "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$@\"";
    let wrapper = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        ro,
        "sh",
    ];
    let (code, r) = doctor_with(&ns, &wrapper, ALL);
    only_failure(
        &r,
        "accept-local",
        &[Mode::L3dsr, Mode::Fullnat],
        "set it on the host: sysctl -w net.ipv4.conf.v0.accept_local=1",
    );
    assert!(
        find(&r, "accept-local")
            .found
            .contains("Read-only file system"),
        "{r:#?}"
    );
    assert_eq!(code, 1);
    ns.sysctls(&[("net.ipv4.conf.v0.accept_local", "1")]);
    let (code, r) = doctor_with(&ns, &wrapper, ALL);
    assert_eq!(find(&r, "accept-local").verdict, Verdict::Pass, "{r:#?}");
    assert_eq!(code, 0);
}

/// A memory cgroup of its own under this process's (v1's memory
/// controller or v2), removed on drop.
struct MemCgroup {
    dir: PathBuf,
}

impl MemCgroup {
    fn new(limit: u64) -> Self {
        let cg = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let v1 = cg.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        });
        let (dir, file) = match v1 {
            Some(p) => (
                PathBuf::from("/sys/fs/cgroup/memory").join(p.trim_start_matches('/')),
                "memory.limit_in_bytes",
            ),
            None => {
                let p = cg
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .expect("a cgroup v2 line");
                (
                    PathBuf::from("/sys/fs/cgroup").join(p.trim_start_matches('/')),
                    "memory.max",
                )
            }
        };
        let dir = dir.join(unique("rivora-doctor-"));
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("creating the memory cgroup {}: {e}", dir.display()));
        let g = Self { dir };
        std::fs::write(g.dir.join(file), limit.to_string()).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (is the memory controller enabled there?)",
                g.dir.join(file).display()
            )
        });
        g
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_memory_cgroup_too_small_for_the_maps() {
    common::require::root_and_tools("e2e_doctor");
    let ns = node();
    let cg = MemCgroup::new(64 << 20);
    let enter = format!("echo $$ > {}/cgroup.procs && exec \"$@\"", cg.dir.display());
    let (code, r) = doctor_with(&ns, &["sh", "-c", &enter, "sh"], ALL);
    only_failure(
        &r,
        "memory",
        &Mode::FORWARDING,
        "rivorad.resources.limits.memory",
    );
    assert!(find(&r, "memory").found.contains("64 MiB"), "{r:#?}");
    assert_eq!(code, 1);
    drop(cg);
    let cg = MemCgroup::new(1 << 30);
    let enter = format!("echo $$ > {}/cgroup.procs && exec \"$@\"", cg.dir.display());
    let (code, r) = doctor_with(&ns, &["sh", "-c", &enter, "sh"], ALL);
    assert_eq!(find(&r, "memory").verdict, Verdict::Pass, "{r:#?}");
    assert_eq!(code, 0);
}
