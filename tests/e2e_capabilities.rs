//! The capabilities the chart grants rivorad are what it needs, measured:
//! the list is read from the rendered chart (the DaemonSet's rivorad
//! container, which drops every other), and the real rivorad, run with
//! exactly that bounding set (`setpriv`) and its L2 speaker on (as with
//! Kubernetes, where it always runs), loads, attaches, opens the
//! speaker's sockets, forwards NAT traffic with -persist-datapath and
//! answers /readyz; without any one of them it does not start. The doctor, with the same list (its init
//! container's), passes its capability check, and after that rivorad has
//! stopped, it sees the persisted programs as Rivora's own. Mode bgp adds
//! NET_BIND_SERVICE only, which its listener on port 179 needs: with the
//! chart's list a real BIRD peer connects with TCP MD5 and BFD, without it
//! rivorad does not start.

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

/// Mode bgp adds NET_BIND_SERVICE (rivorad's listener on port 179) and
/// nothing else: rivorad with exactly the chart's mode-bgp capabilities
/// comes up with BGP on, a real peer (BIRD) connects to its listener with
/// TCP MD5, BFD (TTL 255 both ways) comes Up and the VIP's route reaches
/// the peer; without NET_BIND_SERVICE, rivorad does not start (its
/// listener cannot bind), and the doctor says so for mode bgp. On a port
/// above 1023 the chart adds nothing.
#[test]
fn bgp_mode_adds_net_bind_service_and_needs_no_other() {
    use common::bgp::{Kind, Router};
    use common::traffic::wait_until;
    use std::os::unix::fs::PermissionsExt;
    common::require::root_and_tools("e2e_capabilities");
    common::require::tools("e2e_capabilities", &["bird", "birdc", "setpriv"]);
    let base = rivorad_capabilities(&render(&[]), "rivorad");
    let objects = render(&[
        "--set",
        "announce.mode=bgp",
        "--set",
        "announce.bgp.asn=65001",
    ]);
    let caps = rivorad_capabilities(&objects, "rivorad");
    assert_eq!(rivorad_capabilities(&objects, "doctor"), caps);
    let added: Vec<&String> = caps.iter().filter(|c| !base.contains(c)).collect();
    assert_eq!(added, ["NET_BIND_SERVICE"], "mode bgp adds {added:?}");
    assert!(base.iter().all(|c| caps.contains(c)));
    let high = render(&[
        "--set",
        "announce.mode=bgp",
        "--set",
        "announce.bgp.asn=65001",
        "--set",
        "announce.bgp.listenPort=1179",
    ]);
    assert_eq!(
        rivorad_capabilities(&high, "rivorad"),
        base,
        "a listener above 1023 needs no capability"
    );

    let topo = Topology::new(Mode::Nat);
    let _servers = Servers::for_topology(&topo, false);
    let mut router = Router::new(Kind::Bird, &topo.node, topo.n, 41);
    let node_v4 = router.node_v4.clone();
    router.start(&[(&node_v4, 65001, Some("chart-md5"), true)]);
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port(&topo)));
    // Passive: the session comes in through the listener on port 179
    // (MD5 set on it for the peer); BFD sends and checks TTL 255.
    let bgp_config = |home: &Home| {
        let pw = home.path("peer.key");
        std::fs::write(&pw, "chart-md5\n").expect("password file");
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        format!(
            "{}bgp:\n  asn: 65001\n  peers:\n    - {{address: {}, asn: 65000, passive: true, passwordFile: {}, bfd: true}}\n",
            config(&topo, home, metrics),
            router.v4,
            pw.display()
        )
    };
    let wrapper_for = |caps: &[String]| bounding_set(caps);

    // Without NET_BIND_SERVICE: no start, and the log says why.
    let fewer: Vec<String> = caps
        .iter()
        .filter(|c| *c != "NET_BIND_SERVICE")
        .cloned()
        .collect();
    let b = wrapper_for(&fewer);
    let weak_wrapper = [
        "setpriv",
        "--bounding-set",
        b.as_str(),
        "--inh-caps=-all",
        "--",
    ];
    let mut weak = Rivorad::new(&topo.node, Home::new()).with_wrapper(&weak_wrapper);
    std::fs::write(weak.home.config(), bgp_config(&weak.home)).expect("config");
    weak.spawn(&common::rivorad::rivorad_bin(), &[]);
    let st = weak.wait_exit(Duration::from_secs(60));
    assert!(
        !st.success(),
        "rivorad started BGP without CAP_NET_BIND_SERVICE: {}",
        weak.log_text()
    );
    assert!(
        weak.log_text()
            .contains("listening for BGP on 0.0.0.0:179: Permission denied"),
        "{}",
        weak.log_text()
    );
    eprintln!(
        "BGP without CAP_NET_BIND_SERVICE: {st}, as expected: {}",
        weak.log_text()
            .lines()
            .find(|l| l.contains("listening for BGP"))
            .unwrap_or("")
    );
    let r = doctor(
        &topo,
        &weak_wrapper,
        &[
            "--kubernetes",
            "--announce",
            "bgp",
            "--bgp-listen-port",
            "179",
        ],
    );
    let c = r
        .checks
        .iter()
        .find(|c| c.id == "capabilities")
        .expect("capabilities");
    assert_eq!(c.verdict, Verdict::Fail, "{c:#?}");
    assert!(c.found.contains("missing: NET_BIND_SERVICE"), "{c:#?}");
    assert_eq!(c.blocks, vec![rivora_doctor::Mode::Bgp]);

    // With exactly the chart's: up, the peer in through the listener with
    // MD5, BFD Up, the route at the peer.
    let b = wrapper_for(&caps);
    let wrapper = [
        "setpriv",
        "--bounding-set",
        b.as_str(),
        "--inh-caps=-all",
        "--",
    ];
    let mut rd = Rivorad::new(&topo.node, Home::new()).with_wrapper(&wrapper);
    std::fs::write(rd.home.config(), bgp_config(&rd.home)).expect("config");
    rd.restart(&[]);
    let want: u64 = caps.iter().map(|c| 1u64 << cap_number(c)).sum();
    assert_eq!(
        cap_eff(rd.pid()),
        want,
        "rivorad runs with exactly {caps:?}"
    );
    let vip = format!("{}/32", topo.vip4);
    wait_until(
        "BIRD Established with rivorad",
        Duration::from_secs(60),
        || router.established(&node_v4),
    );
    wait_until("BFD Up at BIRD", Duration::from_secs(30), || {
        router.bfd_up(&node_v4)
    });
    wait_until("the VIP route at BIRD", Duration::from_secs(30), || {
        router.rib().contains(&vip)
    });
    let p = rd.ctl_json(&["bgp", "peers"]);
    let p = &p[0];
    assert_eq!(p["state"], "Established", "{p:#}");
    let r = doctor(
        &topo,
        &wrapper,
        &[
            "--kubernetes",
            "--announce",
            "bgp",
            "--bgp-listen-port",
            "179",
        ],
    );
    let c = r
        .checks
        .iter()
        .find(|c| c.id == "capabilities")
        .expect("capabilities");
    assert_eq!(c.verdict, Verdict::Pass, "{c:#?}");
    let st = rd.stop();
    assert!(st.success(), "{st}");
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

/// Mode bgp's values become rivorad's `bgp:` section, which rivorad's own
/// parser accepts as given (4-byte ASNs and 32-bit attributes, which Helm
/// holds as float64s, written as integers); its rights and the doctor's
/// port follow; modes l2 and none carry none of it (wrong values:
/// crates/rivora-cli/tests/chart.rs).
#[test]
fn bgp_values_render_what_rivorad_accepts() {
    use rivora_model::config::bgp::parse_community;
    let file =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/chart-values-bgp.yaml");
    let objects = render(&["-f", file.to_str().unwrap()]);
    let cm = common::chart::object(&objects, "ConfigMap", "rivorad-config");
    let text = cm["data"]["rivora.yaml"].as_str().expect("rivora.yaml");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rivora.yaml");
    std::fs::write(&path, text).unwrap();
    let cfg = rivora_model::config::load(&path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let bgp = cfg.bgp.expect("the bgp section");
    assert_eq!(bgp.asn, 4_200_000_001);
    assert_eq!(bgp.router_id, Some("10.0.0.2".parse().unwrap()));
    assert_eq!((bgp.listen_port, bgp.restart_time), (1179, 300));
    assert_eq!(bgp.peers.len(), 2);
    let (p, q) = (&bgp.peers[0], &bgp.peers[1]);
    assert_eq!(
        (p.name.as_str(), p.asn, p.port, p.hold_time),
        ("tor1", 4_200_000_000, 1179, 9)
    );
    assert_eq!(p.bfd.map(|b| b.multiplier), Some(5));
    assert_eq!(
        p.policy.communities,
        vec![parse_community("65000:100").unwrap(), 0xFFFF_FF01]
    );
    assert_eq!(p.policy.large_communities, vec![(4_200_000_001, 1, 2)]);
    assert_eq!(p.policy.med, Some(4_000_000_000));
    assert!(q.passive && q.bfd.is_some() && q.ipv6);
    assert_eq!(q.policy.local_pref, Some(4_294_967_295));
    assert_eq!(bgp.advertisements[0].prefixes.len(), 3);
    assert_eq!(bgp.advertisements[0].policy.local_pref, Some(200));
    // The doctor checks the listener's port: 1179 needs no capability.
    let ds = common::chart::object(&objects, "DaemonSet", "rivorad");
    let dargs = ds["spec"]["template"]["spec"]["initContainers"][0]["args"].to_string();
    assert!(
        dargs.contains(r#""--announce","bgp","--bgp-listen-port","1179""#),
        "{dargs}"
    );

    // The other modes: no bgp section, no BGP rights, whatever
    // announce.bgp holds.
    for mode in ["l2", "none"] {
        let set = format!("announce.mode={mode}");
        let objects = render(&["-f", file.to_str().unwrap(), "--set", &set]);
        let cm = common::chart::object(&objects, "ConfigMap", "rivorad-config");
        let text = cm["data"]["rivora.yaml"].as_str().unwrap();
        assert!(!text.contains("bgp"), "{mode}: {text}");
        let all = serde_json::to_string(&objects).unwrap();
        for r in [
            "bgppeers",
            "bgpnodestatuses",
            "secrets",
            "NET_BIND_SERVICE",
            "bgp-listen-port",
        ] {
            assert!(!all.contains(r), "mode {mode} renders {r}");
        }
    }
}
