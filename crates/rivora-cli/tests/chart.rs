//! The chart's values schema and the CLI's refusals, offline: every wrong
//! value fails `helm template` (what `helm install` and `rivora install`
//! run first) with the value's path and what is wrong; `rivora` without a
//! helm says what to install. Needs the pinned helm (`scripts/chart.sh
//! tools`, which `make test` runs).

use std::path::{Path, PathBuf};
use std::process::Command;

fn helm() -> PathBuf {
    let p = std::env::var_os("RIVORA_HELM")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/bin/helm")
        });
    assert!(
        p.is_file(),
        "{} is missing: `scripts/chart.sh tools` (make test runs it) installs the pinned helm",
        p.display()
    );
    p
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../helm")
}

/// `helm template` with `sets`: Ok(rendered) or Err(stderr).
fn template(sets: &[&str]) -> Result<String, String> {
    let mut c = Command::new(helm());
    c.args(["template", "rivora"]).arg(chart());
    for s in sets {
        c.args(["--set", s]);
    }
    let out = c.output().expect("running helm");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn wrong_values_fail_with_their_path_and_reason() {
    let cases: &[(&str, &str)] = &[
        (
            "announce.mode=ospf",
            "at '/announce/mode': value must be one of 'l2', 'bgp', 'none'",
        ),
        (
            "annouce.mode=l2",
            "additional properties 'annouce' not allowed",
        ),
        (
            "rivorad.interfaces[0].name=eth0/1",
            "at '/rivorad/interfaces/0/name'",
        ),
        (
            "rivorad.interfaces[0].xdpMode=fast",
            "at '/rivorad/interfaces/0/xdpMode': value must be one of 'native', 'generic', 'auto'",
        ),
        (
            "rivorad.flowTableSize=10",
            "at '/rivorad/flowTableSize': minimum: got 10, want 4,096",
        ),
        (
            "rivorad.flowTableSize=99999999",
            "at '/rivorad/flowTableSize': maximum",
        ),
        (
            "rivorad.persistDatapath=maybe",
            "at '/rivorad/persistDatapath': got string, want boolean",
        ),
        (
            "rivorad.metrics.port=70000",
            "at '/rivorad/metrics/port': maximum",
        ),
        (
            "rivorad.metrics.bindAddress=localhost",
            "'localhost' is not valid ipv4",
        ),
        (
            "rivorad.node.tunnelSource.ipv4=10.0.0.300",
            "at '/rivorad/node/tunnelSource/ipv4'",
        ),
        (
            "rivorad.node.synRateLimit.ratePerSec=100",
            "missing property 'burst'",
        ),
        ("rivorad.maxUnavailable=0", "at '/rivorad/maxUnavailable'"),
        (
            "controller.replicas=two",
            "at '/controller/replicas': got string, want integer",
        ),
        (
            "controller.lease.duration=15",
            "at '/controller/lease/duration'",
        ),
        (
            "controller.antiAffinity=strict",
            "at '/controller/antiAffinity': value must be one of 'soft', 'hard'",
        ),
        ("controller.poolSelector=a", "at '/controller/poolSelector'"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("image.digest=latest", "at '/image/digest'"),
        (
            "doctor.forwardingModes={nat,ipvs}",
            "at '/doctor/forwardingModes/1'",
        ),
        ("loadBalancerClass=not a class", "at '/loadBalancerClass'"),
        (
            "gatewayAPI.crds.standard=true,gatewayAPI.crds.experimental=true",
            "at '/gatewayAPI/crds/experimental': value must be false",
        ),
        (
            "serviceMonitor.interval=often",
            "at '/serviceMonitor/interval'",
        ),
        // Mode bgp: an AS is required, and announce.bgp is rivorad's bgp
        // section's shape (values rivorad would refuse at start are refused
        // here; AS_TRANS and a 0.0.0.0 router ID by the templates).
        ("announce.mode=bgp", "at '/announce/bgp': missing property 'asn'"),
        (
            "announce.mode=bgp,announce.bgp.asn=0",
            "at '/announce/bgp/asn': minimum: got 0, want 1",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=4294967296",
            "at '/announce/bgp/asn': maximum",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=23456",
            "announce.bgp.asn: 23456 is AS_TRANS (RFC 6793), not an AS of its own",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.routerId=0.0.0.0",
            "announce.bgp.routerId: 0.0.0.0 is not a router ID",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.listenPort=70000",
            "at '/announce/bgp/listenPort': maximum",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.peers[0].address=10.0.0.1",
            "at '/announce/bgp/peers/0': missing property 'asn'",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.peers[0].address=10.0.0.1,announce.bgp.peers[0].asn=23456",
            "announce.bgp.peers[0].asn: 23456 is AS_TRANS",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.peers[0].address=10.0.0.1,announce.bgp.peers[0].asn=1,announce.bgp.peers[0].holdTime=2s",
            "at '/announce/bgp/peers/0/holdTime'",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.peers[0].address=10.0.0.1,announce.bgp.peers[0].asn=1,announce.bgp.peers[0].passwordFile=/x",
            "at '/announce/bgp/peers/0': additional properties 'passwordFile' not allowed",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.advertisements[0].prefixes[0]=10.0.0.0/24,announce.bgp.advertisements[0].communities[0]=1:70000x",
            "at '/announce/bgp/advertisements/0/communities/0'",
        ),
        (
            "announce.mode=bgp,announce.bgp.asn=65001,announce.bgp.holdTime=9s",
            "at '/announce/bgp': additional properties 'holdTime' not allowed",
        ),
    ];
    for (set, want) in cases {
        match template(&[set]) {
            Ok(_) => panic!("--set {set} was accepted"),
            Err(e) => assert!(e.contains(want), "--set {set}: {e:?} does not say {want:?}"),
        }
    }
}

#[test]
fn every_mode_and_option_renders() {
    for sets in [
        &[][..],
        &["announce.mode=l2"],
        &["announce.mode=bgp", "announce.bgp.asn=65001"],
        &["announce.mode=none"],
        &[
            "gatewayAPI.crds.experimental=true",
            "serviceMonitor.enabled=true",
        ],
        &[
            "controller.replicas=1",
            "controller.antiAffinity=hard",
            "doctor.enabled=false",
        ],
        &[
            "rivorad.persistDatapath=false",
            "requireClass=true",
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ],
    ] {
        let out = template(sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
        assert!(out.contains("kind: DaemonSet"), "{sets:?}");
    }
    // One replica: no disruption budget to deadlock a drain.
    let one = template(&["controller.replicas=1"]).unwrap();
    assert!(!one.contains("kind: PodDisruptionBudget"));
    let off = template(&["rivorad.persistDatapath=false"]).unwrap();
    assert!(!off.contains("-persist-datapath"));
    assert!(
        template(&[]).unwrap().contains("- -persist-datapath"),
        "on by default"
    );
}

#[test]
fn rivora_without_helm_says_what_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rivora"))
        .arg("install")
        .env("PATH", dir.path())
        .env_remove("RIVORA_HELM")
        .output()
        .expect("running rivora");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("there is no `helm` executable on PATH: install Helm 3.14 or newer"),
        "{err}"
    );
    // A helm too old to keep values across upgrades.
    let fake = dir.path().join("helm");
    std::fs::write(&fake, "#!/bin/sh\necho v3.9.4\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rivora"))
        .args(["--helm"])
        .arg(&fake)
        .arg("install")
        .output()
        .expect("running rivora");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is Helm v3.9.4: rivora needs 3.14 or newer"),
        "{err}"
    );
}

#[test]
fn rivora_crds_prints_the_charts_crds() {
    let out = Command::new(env!("CARGO_BIN_EXE_rivora"))
        .args(["crds"])
        .output()
        .expect("running rivora crds");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for f in std::fs::read_dir(chart().join("crds")).unwrap() {
        let body = std::fs::read_to_string(f.unwrap().path()).unwrap();
        assert!(
            text.contains(body.trim_start_matches('\n').trim_end()),
            "every CRD file, whole"
        );
    }
}

/// The image the chart runs holds every command the chart's pods run.
#[test]
fn the_image_has_every_command_the_chart_runs() {
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Dockerfile"))
            .expect("the Dockerfile");
    let copied: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("/src/target/release/"))
        .map(|b| b.trim_end_matches(" \\").trim())
        .collect();
    let out = template(&["serviceMonitor.enabled=false"]).unwrap();
    let mut commands: Vec<String> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("command: ["))
        .map(|c| c.trim_end_matches(']').to_string())
        .collect();
    commands.sort();
    commands.dedup();
    assert_eq!(commands, ["rivora-controller", "rivora-doctor", "rivorad"]);
    for c in &commands {
        assert!(
            copied.contains(&c.as_str()),
            "the Dockerfile does not copy {c}: {copied:?}"
        );
    }
    // The workspace's default members: every binary a node runs, not the
    // benchmarks.
    assert!(
        dockerfile.contains("RUN scripts/deps.sh")
            && dockerfile.contains("RUN cargo build --release --bins --locked")
    );
}
