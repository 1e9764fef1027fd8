use std::path::Path;

use super::*;

fn parse_str(text: &str) -> Result<Config, ConfigError> {
    parse(Path::new("rivora.yaml"), text)
}

const GOOD: &str = "\
interfaces:
  - name: eth0
vips:
  - address: 10.0.0.100
    port: 80
    protocol: tcp
    mode: nat
    backends:
      - address: 10.1.0.1
        port: 8080
      - address: 10.1.0.2
";

#[test]
fn a_good_file_becomes_desired_state() {
    let c = parse_str(GOOD).expect("valid");
    assert_eq!(c.desired.vips.len(), 1);
    let v = &c.desired.vips[0];
    assert_eq!(v.ports, Ports::One(80));
    assert_eq!(v.backends[0].port, 8080);
    assert_eq!(v.backends[1].port, 0, "no port: the VIP's");
    assert_eq!(v.backends[1].weight, 1);
    // Default health check: TCP on the backend's port (the VIP's for the second).
    let hc: Vec<_> = c
        .health
        .iter()
        .map(|((_, t), s)| (t.port(), s.is_some()))
        .collect();
    assert_eq!(hc, vec![(8080, true), (80, true)]);
}

#[test]
fn the_examples_are_valid() {
    // The examples live at the repository's top, two levels up.
    for f in ["nat.yaml", "dsr.yaml", "l3dsr.yaml"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(f);
        load(&p).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Each broken field gives its own message, naming line and field.
#[test]
fn each_invalid_field_is_named_with_its_line() {
    let cases: &[(&str, &str, usize, &str, &str)] = &[
        (
            "weight out of range",
            "      - address: 10.1.0.2\n",
            11,
            "vips[0].backends[1].weight",
            "out of range",
        ),
        (
            "family mismatch",
            "      - address: 10.1.0.2\n",
            11,
            "vips[0].backends[1].address",
            "address family",
        ),
        ("port zero", "    port: 80\n", 4, "vips[0].port", "port 0"),
        ("empty range", "    port: 80\n", 4, "vips[0].port", "empty"),
        (
            "unknown key",
            "    mode: nat\n",
            6,
            "vips[0]",
            "unknown field `moed`",
        ),
        (
            "bad mode",
            "    mode: nat\n",
            6,
            "vips[0].mode",
            "unknown variant `bridge`",
        ),
        (
            "bad address",
            "  - address: 10.0.0.100\n",
            3,
            "vips[0].address",
            "invalid IP address",
        ),
        (
            "bad mac",
            "      - address: 10.1.0.2\n",
            12,
            "vips[0].backends[1]",
            "not a MAC address",
        ),
        (
            "no interfaces",
            "interfaces:\n  - name: eth0\n",
            1,
            "",
            "at least one interface",
        ),
    ];
    let replacements: &[&str] = &[
        "      - address: 10.1.0.2\n        weight: 2000000\n",
        "      - address: fd00::2\n",
        "    port: 0\n",
        "    port: \"90-80\"\n",
        "    moed: nat\n",
        "    mode: bridge\n",
        "  - address: 10.0.0.300\n",
        "      - address: 10.1.0.2\n        mac: zz:00\n",
        "interfaces: []\n",
    ];
    for ((name, from, line, field, msg), to) in cases.iter().zip(replacements) {
        let text = GOOD.replacen(from, to, 1);
        assert_ne!(text, GOOD, "{name}: the case edits the file");
        let e = parse_str(&text).expect_err(name);
        let shown = e.to_string();
        assert!(shown.starts_with("rivora.yaml:"), "{name}: {shown}");
        assert!(shown.contains(msg), "{name}: {shown:?} lacks {msg:?}");
        if !field.is_empty() {
            assert!(
                shown.contains(field),
                "{name}: {shown:?} lacks field {field:?}"
            );
        }
        let got = e
            .line
            .unwrap_or_else(|| panic!("{name}: no line in {shown}"));
        assert!(
            got.abs_diff(*line) <= 1,
            "{name}: line {got}, want about {line}: {shown}"
        );
    }
}

#[test]
fn health_check_overrides_and_off() {
    let text = "\
interfaces: [{name: eth0}]
healthCheck: {interval: 5s, timeout: 1s}
vips:
  - address: 10.0.0.1
    port: 80
    protocol: tcp
    mode: nat
    healthCheck: {type: http, path: /ready}
    backends:
      - {address: 10.1.0.1}
      - {address: 10.1.0.2, healthCheck: {port: 9000}}
      - {address: 10.1.0.3, healthCheck: false}
  - address: 10.0.0.1
    port: 53
    protocol: udp
    mode: nat
    healthCheck: false
    backends: [{address: 10.1.0.1}]
";
    let c = parse_str(text).expect("valid");
    let spec = |port: u16, backend: &str| {
        let (_, s) = c
            .health
            .iter()
            .find(|((k, t), _)| k.ports == Ports::One(port) && t.ip().to_string() == backend)
            .expect("a health entry");
        s.clone()
    };
    let http = spec(80, "10.1.0.1").expect("probed");
    assert_eq!(http.path.as_deref(), Some("/ready"));
    assert_eq!(
        http.interval,
        Duration::from_secs(5),
        "the file's default interval"
    );
    assert_eq!(spec(80, "10.1.0.2").and_then(|s| s.port), Some(9000));
    assert!(
        spec(80, "10.1.0.3").is_none(),
        "backend with healthCheck: false"
    );
    assert!(
        spec(53, "10.1.0.1").is_none(),
        "VIP with healthCheck: false"
    );
}

#[test]
fn bad_health_check_is_named() {
    let text = GOOD.replacen(
        "    mode: nat\n",
        "    mode: nat\n    healthCheck: {interval: 1s, timeout: 2s}\n",
        1,
    );
    let e = parse_str(&text).expect_err("timeout above interval");
    assert_eq!(e.field.as_deref(), Some("vips[0].healthCheck"));
    assert_eq!(e.line, Some(8));
}

#[test]
fn duplicate_vips_and_tcp_listener_without_token() {
    let dup =
        format!("{GOOD}  - address: 10.0.0.100\n    port: 80\n    protocol: tcp\n    mode: nat\n");
    let e = parse_str(&dup).expect_err("duplicate");
    assert_eq!(e.field.as_deref(), Some("vips[1]"));
    assert_eq!(e.line, Some(12));
    let e = parse_str(&format!("api: {{listen: 127.0.0.1:9000}}\n{GOOD}")).expect_err("no token");
    assert_eq!(e.field.as_deref(), Some("api.listen"));
}

#[test]
fn port_ranges_and_affinity() {
    let text = GOOD.replacen(
        "    port: 80\n",
        "    port: \"8000-8100\"\n    affinity: {type: clientIP, timeout: 1h}\n",
        1,
    );
    let text = text.replacen("        port: 8080\n", "", 1);
    let c = parse_str(&text).expect("valid");
    let v = &c.desired.vips[0];
    assert_eq!(
        v.ports,
        Ports::Range {
            first: 8000,
            last: 8100
        }
    );
    assert_eq!(v.affinity, Affinity::ClientIp { timeout_s: 3600 });
}
