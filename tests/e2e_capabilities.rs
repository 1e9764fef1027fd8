//! The capabilities the chart grants rivorad are what it needs, measured:
//! the list is read from the rendered chart (the DaemonSet's rivorad
//! container, which drops every other), and the real rivorad, run with
//! exactly that bounding set (`setpriv`) and its L2 speaker on (as with
//! Kubernetes, where it always runs), loads, attaches, opens the
//! speaker's sockets, forwards NAT traffic with -persist-datapath and
//! answers /readyz; without any one of them it does not start. The doctor, with the same list (its init
//! container's), passes its capability check, and after that rivorad has
//! stopped, it sees the persisted programs as Rivora's own.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::chart::{render, rivorad_capabilities};
use common::rivorad::{bins, Home, Rivorad};
use common::topology::{Mode, Topology, NAT_BACKEND_PORT, VIP_PORT};
use common::traffic::{tcp_once, Servers};
use rivora_doctor::{Report, Verdict};

/// linux/capability.h, for the ones the chart may grant.
fn cap_number(name: &str) -> u32 {
    match name {
        "NET_BIND_SERVICE" => 10,
        "NET_ADMIN" => 12,
        "NET_RAW" => 13,
        "SYS_ADMIN" => 21,
        "SYS_RESOURCE" => 24,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("the chart grants {other}: add it here"),
    }
}

fn bounding_set(caps: &[String]) -> String {
    let mut s = String::from("-all");
    for c in caps {
        s += &format!(",+{}", c.to_lowercase());
    }
    s
}

fn config(topo: &Topology, home: &Home, metrics: SocketAddr) -> String {
    let mut y = format!(
        "interfaces:\n  - name: n0\n    xdpMode: native\n\
         node:\n  announce: l2\n  tunnelSource: {{ ipv4: {}, ipv6: \"{}\" }}\n\
         api:\n  socket: {}\nmetrics:\n  listen: {metrics}\nvips:\n\
         \x20 - address: {}\n    port: {VIP_PORT}\n    protocol: tcp\n    mode: nat\n    healthCheck: false\n    backends:\n",
        topo.node_v4,
        topo.node_v6,
        home.socket().display(),
        topo.vip4,
    );
    for b in &topo.backends {
        y += &format!(
            "      - {{ address: {}, port: {NAT_BACKEND_PORT} }}\n",
            b.v4
        );
    }
    y
}

/// A free port on 127.0.0.1 in the node's namespace.
fn free_port(topo: &Topology) -> u16 {
    topo.node.run(|| {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    })
}

/// GET `path` on `addr` in the node's namespace: (status code, body).
fn http_get(topo: &Topology, addr: SocketAddr, path: &'static str) -> (u16, String) {
    topo.node.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").expect("request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("answer");
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out
            .split_once("\r\n\r\n")
            .map(|x| x.1)
            .unwrap_or("")
            .to_string();
        (code, body)
    })
}

fn cap_eff(pid: i32) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let hex = st
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff");
    u64::from_str_radix(hex.trim(), 16).expect("hex")
}

fn doctor(topo: &Topology, wrapper: &[&str], args: &[&str]) -> Report {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", topo.node.path()))
        .args(wrapper)
        .arg(bins::rivora_doctor())
        .args(["-o", "json", "-i", "n0"])
        .args(args)
        .output()
        .expect("rivora-doctor");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "rivora-doctor: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn rivorad_runs_with_the_charts_capabilities_and_no_fewer() {
    common::require::root_and_tools("e2e_capabilities");
    // The default mode's list; every mode grants the L2 speaker's (it runs
    // whatever the mode), which the static path with `announce: l2` opens.
    let objects = render(&[]);
    let caps = rivorad_capabilities(&objects, "rivorad");
    assert_eq!(
        rivorad_capabilities(&objects, "doctor"),
        caps,
        "the doctor runs with rivorad's rights"
    );
    assert!(!caps.is_empty());
    let want: u64 = caps.iter().map(|c| 1u64 << cap_number(c)).sum();

    let topo = Topology::new(Mode::Nat);
    let _servers = Servers::for_topology(&topo, false);
    let home = Home::new();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port(&topo)));
    std::fs::write(home.config(), config(&topo, &home, metrics)).expect("the config");
    let bounding = bounding_set(&caps);
    let wrapper = [
        "setpriv",
        "--bounding-set",
        bounding.as_str(),
        "--inh-caps=-all",
        "--",
    ];
    let mut rd = Rivorad::new(&topo.node, home).with_wrapper(&wrapper);

    // Without any one of them, no start (and nothing attached).
    for drop in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != drop).cloned().collect();
        let b = bounding_set(&fewer);
        let mut weak = Rivorad::new(&topo.node, Home::new()).with_wrapper(&[
            "setpriv",
            "--bounding-set",
            b.as_str(),
            "--inh-caps=-all",
            "--",
        ]);
        std::fs::write(weak.home.config(), config(&topo, &weak.home, metrics)).expect("config");
        weak.spawn(&common::rivorad::rivorad_bin(), &["-persist-datapath"]);
        let st = weak.wait_exit(Duration::from_secs(60));
        assert!(
            !st.success(),
            "rivorad started without CAP_{drop}: {}",
            weak.log_text()
        );
        assert!(
            !weak.log_text().contains(r#""message":"ready""#),
            "without CAP_{drop}: {}",
            weak.log_text()
        );
        eprintln!("without CAP_{drop}: {st}, as expected");
    }

    rd.restart(&["-persist-datapath"]);
    assert_eq!(
        cap_eff(rd.pid()),
        want,
        "rivorad runs with exactly {caps:?}"
    );
    let vip = SocketAddr::new(IpAddr::V4(topo.vip4), VIP_PORT);
    let hits: Vec<String> = (0..12)
        .map(|_| {
            topo.client
                .run(move || tcp_once(vip, Duration::from_secs(2)))
                .expect("a connection through the NAT VIP")
                .backend
        })
        .collect();
    assert_eq!(hits.len(), 12);
    let (code, body) = http_get(&topo, metrics, "/readyz");
    assert_eq!((code, body.as_str()), (200, "ok\n"), "/readyz");
    let (code, _) = http_get(&topo, metrics, "/healthz");
    assert_eq!(code, 200);

    // The doctor with the same rights, as the init container runs it:
    // capabilities pass.
    let r = doctor(&topo, &wrapper, &["--kubernetes"]);
    let c = r
        .checks
        .iter()
        .find(|c| c.id == "capabilities")
        .expect("capabilities");
    assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
    // Stopped with -persist-datapath, its programs stay attached behind
    // the pinned links: Rivora's own, which the next rivorad takes over.
    let st = rd.stop();
    assert!(st.success(), "{st}");
    let r = doctor(
        &topo,
        &[],
        &["--pin-dir", &rd.home.pin_dir().display().to_string()],
    );
    for id in ["xdp-programs", "tcx-programs"] {
        let c = r.checks.iter().find(|c| c.id == id).expect(id);
        assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
        assert!(
            c.found.contains("xdp_ingress") || c.found.contains("tc_nat"),
            "{c:#?}"
        );
    }
    // Another pin directory: the same programs are another Rivora's.
    let r = doctor(
        &topo,
        &[],
        &["--pin-dir", "/sys/fs/bpf/rivora-lb-not-this-one"],
    );
    let c = r
        .checks
        .iter()
        .find(|c| c.id == "xdp-programs")
        .expect("xdp-programs");
    assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
    assert!(c.found.contains("another Rivora"), "{c:#?}");
}

/// The doctor's memory check reads its own cgroup: the init container
/// must have rivorad's limit, or it would judge an unlimited one.
#[test]
fn the_doctor_runs_with_rivorads_resources() {
    for sets in [&[][..], &["--set", "rivorad.resources.limits.memory=300Mi"]] {
        let objects = render(sets);
        let ds = common::chart::object(&objects, "DaemonSet", "rivorad");
        let spec = &ds["spec"]["template"]["spec"];
        assert_eq!(
            spec["initContainers"][0]["resources"], spec["containers"][0]["resources"],
            "{sets:?}"
        );
    }
}
