use std::path::Path;

use super::*;
use crate::lease::LeaseTimings;

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
            "\"10.0.0.300\" is not an IP address",
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
    assert_eq!(e.field.as_deref(), Some("vips[0].healthCheck.timeout"));
    assert_eq!(e.line, Some(8));
    assert!(
        e.message.starts_with("2s must be less than interval (1s)"),
        "{e}"
    );
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

#[test]
fn source_ranges_restrict_and_an_empty_list_does_not() {
    let text = GOOD.replacen(
        "    mode: nat\n",
        "    mode: nat\n    sourceRanges: [192.0.2.0/24, \"fd00::/64\"]\n",
        1,
    );
    let c = parse_str(&text).expect("valid");
    let got: Vec<String> = c.desired.vips[0]
        .source_ranges
        .iter()
        .flatten()
        .map(ToString::to_string)
        .collect();
    assert_eq!(got, ["192.0.2.0/24", "fd00::/64"]);
    let open = GOOD.replacen(
        "    mode: nat\n",
        "    mode: nat\n    sourceRanges: []\n",
        1,
    );
    let c = parse_str(&open).expect("valid");
    assert_eq!(
        c.desired.vips[0].source_ranges, None,
        "as Kubernetes reads []"
    );
    assert_eq!(parse_str(GOOD).unwrap().desired.vips[0].source_ranges, None);
}

/// `GOOD` with `from` replaced by `to` (once; the edit must apply).
fn edit(from: &str, to: &str) -> String {
    let text = GOOD.replacen(from, to, 1);
    assert_ne!(text, GOOD, "{from:?} is not in GOOD");
    text
}

/// Every message names the field as written (camelCase, with indices),
/// its own line, and the value as written.
#[test]
fn messages_name_field_line_and_value() {
    const VIP: &str = "    mode: nat\n";
    const B1: &str = "      - address: 10.1.0.2\n";
    let cases: Vec<(&str, String, usize, &str, &str)> = vec![
        // (what, file, line, field, message contains)
        (
            "VIP address",
            edit("address: 10.0.0.100", "address: 10.0.0.300"),
            4,
            "vips[0].address",
            "\"10.0.0.300\" is not an IP address",
        ),
        (
            "backend address",
            edit(B1, "      - address: 10.1.0.two\n"),
            11,
            "vips[0].backends[1].address",
            "\"10.1.0.two\" is not an IP address",
        ),
        (
            "port of the wrong type",
            edit("    port: 80\n", "    port: {first: 80}\n"),
            5,
            "vips[0].port",
            "invalid type: map, expected a port (1-65535) or a range like \"8000-8100\"",
        ),
        (
            "port as a word",
            edit("    port: 80\n", "    port: http\n"),
            5,
            "vips[0].port",
            "\"http\" is not a port (1-65535) or a range",
        ),
        (
            "port too large",
            edit("    port: 80\n", "    port: 70000\n"),
            5,
            "vips[0].port",
            "70000 is not a port (1-65535)",
        ),
        (
            "range end too large",
            edit("    port: 80\n", "    port: 8000-70000\n"),
            5,
            "vips[0].port",
            "70000 is not a port",
        ),
        (
            "healthCheck of the wrong type",
            edit(VIP, "    mode: nat\n    healthCheck: 5\n"),
            8,
            "vips[0].healthCheck",
            "invalid type: integer `5`, expected true, false, or a mapping of health-check settings",
        ),
        (
            "healthCheck as a list",
            edit(VIP, "    mode: nat\n    healthCheck: [tcp]\n"),
            8,
            "vips[0].healthCheck",
            "invalid type: sequence, expected true, false, or a mapping",
        ),
        (
            "a bad field inside a healthCheck override",
            edit(B1, "      - address: 10.1.0.2\n        healthCheck:\n          rise: many\n"),
            13,
            "vips[0].backends[1].healthCheck.rise",
            "invalid type: string \"many\", expected u32",
        ),
        (
            "duplicate key",
            edit("    port: 80\n", "    port: 80\n    port: 81\n"),
            6,
            "vips[0].port",
            "duplicate key \"port\"",
        ),
        (
            "duplicate top-level key",
            format!("{GOOD}interfaces:\n  - name: eth1\n"),
            12,
            "interfaces",
            "duplicate key \"interfaces\"",
        ),
        (
            "duplicate key in a flow mapping",
            edit(B1, "      - {address: 10.1.0.2, weight: 1, weight: 2}\n"),
            11,
            "vips[0].backends[1].weight",
            "duplicate key \"weight\"",
        ),
        (
            "duplicate key in a healthCheck override",
            edit(VIP, "    mode: nat\n    healthCheck:\n      rise: 1\n      rise: 2\n"),
            10,
            "vips[0].healthCheck.rise",
            "duplicate key \"rise\"",
        ),
        (
            "sub-second affinity timeout",
            edit(VIP, "    mode: nat\n    affinity: {type: clientIP, timeout: 500ms}\n"),
            8,
            "vips[0].affinity.timeout",
            "\"500ms\": the affinity timeout takes whole seconds",
        ),
        (
            "affinity timeout too long",
            edit(VIP, "    mode: nat\n    affinity:\n      type: clientIP\n      timeout: 2d\n"),
            10,
            "vips[0].affinity.timeout",
            "\"2days\" is out of range: the affinity timeout is 1s to 1day (86400s)",
        ),
        (
            "affinity timeout on type none",
            edit(VIP, "    mode: nat\n    affinity: {type: none, timeout: 1h}\n"),
            8,
            "vips[0].affinity",
            "timeout only applies to `type: clientIP`",
        ),
        (
            "weight as a word",
            edit(B1, "      - address: 10.1.0.2\n        weight: heavy\n"),
            12,
            "vips[0].backends[1].weight",
            "\"heavy\" is not a number (want a whole number from 0 to 1000000)",
        ),
        (
            "weight too large",
            edit(B1, "      - address: 10.1.0.2\n        weight: 2000000\n"),
            12,
            "vips[0].backends[1].weight",
            "2000000 is out of range 0..=1000000",
        ),
        (
            "negative weight",
            edit(B1, "      - {address: 10.1.0.2, weight: -1}\n"),
            11,
            "vips[0].backends[1].weight",
            "-1 is out of range 0..=1000000",
        ),
        (
            "fractional weight",
            edit(B1, "      - {address: 10.1.0.2, weight: 1.5}\n"),
            11,
            "vips[0].backends[1].weight",
            "1.5 is not a whole number",
        ),
        (
            "backend port too large",
            edit("        port: 8080\n", "        port: 80800\n"),
            10,
            "vips[0].backends[0].port",
            "80800 is out of range 0..=65535",
        ),
        (
            "zero rate",
            format!("node:\n  synRateLimit: {{ratePerSec: 0, burst: 10}}\n{GOOD}"),
            2,
            "node.synRateLimit.ratePerSec",
            "0 is out of range 1..=10000000",
        ),
        (
            "burst as a word",
            edit(VIP, "    mode: nat\n    synRateLimit:\n      ratePerSec: 10\n      burst: lots\n"),
            10,
            "vips[0].synRateLimit.burst",
            "\"lots\" is not a number",
        ),
        (
            "interface name with a slash",
            edit("  - name: eth0\n", "  - name: eth0/1\n"),
            2,
            "interfaces[0].name",
            "\"eth0/1\" is not an interface name",
        ),
        (
            "interface name too long",
            edit("  - name: eth0\n", "  - name: averyveryverylongname\n"),
            2,
            "interfaces[0].name",
            "\"averyveryverylongname\" is not an interface name",
        ),
        (
            "interface listed twice",
            edit("  - name: eth0\n", "  - name: eth0\n  - name: eth0\n"),
            3,
            "interfaces[1].name",
            "interface \"eth0\" is listed twice (first as interfaces[0])",
        ),
        (
            "MAC",
            edit(B1, "      - address: 10.1.0.2\n        mac: zz:00\n"),
            12,
            "vips[0].backends[1].mac",
            "\"zz:00\" is not a MAC address like 02:00:5e:10:00:01",
        ),
        (
            "tunnel source of the wrong family",
            format!("node:\n  tunnelSource:\n    ipv4: \"fd00::1\"\n{GOOD}"),
            3,
            "node.tunnelSource.ipv4",
            "\"fd00::1\" is not an IPv4 address",
        ),
        (
            "metrics listener without a port",
            format!("metrics: {{listen: localhost}}\n{GOOD}"),
            1,
            "metrics.listen",
            "\"localhost\" is not an address and port",
        ),
        (
            "health-check interval",
            format!("healthCheck:\n  interval: 2x\n{GOOD}"),
            2,
            "healthCheck.interval",
            "invalid value: string \"2x\", expected a duration like \"500ms\"",
        ),
        (
            "health-check timeout not below the interval, both in the override",
            edit(VIP, "    mode: nat\n    healthCheck:\n      interval: 1s\n      timeout: 3s\n"),
            10,
            "vips[0].healthCheck.timeout",
            "3s must be less than interval (1s)",
        ),
        (
            "health-check timeout inherited from the defaults",
            format!("healthCheck: {{interval: 10s, timeout: 5s}}\n{}", edit(VIP, "    mode: nat\n    healthCheck: {interval: 3s}\n")),
            9,
            "vips[0].healthCheck",
            "timeout: 5s must be less than interval (3s)",
        ),
        (
            "a bad status code entry",
            edit(
                VIP,
                "    mode: nat\n    healthCheck: {type: http, expectedStatus: [200, \"2x\"]}\n",
            ),
            8,
            "vips[0].healthCheck.expectedStatus[1]",
            "\"2x\" is not a status code, a range \"200-299\" or a class \"2xx\"",
        ),
        (
            "health-check port 0 (checked after deserialising)",
            edit(VIP, "    mode: nat\n    healthCheck:\n      port: 0\n"),
            9,
            "vips[0].healthCheck.port",
            "must be 1-65535, not 0",
        ),
        (
            "unknown key",
            edit(VIP, "    moed: nat\n"),
            7,
            "vips[0].moed",
            "unknown field `moed`, expected one of",
        ),
        (
            "missing key",
            edit("    protocol: tcp\n", ""),
            4,
            "vips[0]",
            "missing field `protocol`",
        ),
        (
            "backend of the other family (checked after deserialising)",
            edit(B1, "      - address: fd00::2\n"),
            11,
            "vips[0].backends[1].address",
            "address family",
        ),
        (
            "VIP listed twice",
            format!("{GOOD}  - address: 10.0.0.100\n    port: 80\n    protocol: tcp\n    mode: nat\n"),
            12,
            "vips[1]",
            "is listed twice (first as vips[0])",
        ),
        (
            "overlapping port ranges",
            format!(
                "{}  - address: 10.0.0.100\n    port: 8050-8200\n    protocol: tcp\n    mode: nat\n",
                edit("    port: 80\n", "    port: 8000-8100\n").replacen("        port: 8080\n", "", 1)
            ),
            12,
            "vips[1].port",
            "VIP tcp/10.0.0.100:8050-8200: port range overlaps VIP tcp/10.0.0.100:8000-8100 (vips[0])",
        ),
        (
            "L3 DSR without a tunnel source",
            edit("    mode: nat\n", "    mode: l3dsr\n").replacen("        port: 8080\n", "", 1),
            7,
            "vips[0].mode",
            "VIP tcp/10.0.0.100:80: mode l3dsr needs the node's IPv4 tunnel source (node.tunnelSource.ipv4)",
        ),
        (
            "a source range with host bits",
            edit(VIP, "    mode: nat\n    sourceRanges: [192.0.2.0/24, 10.1.2.3/8]\n"),
            8,
            "vips[0].sourceRanges[1]",
            "\"10.1.2.3/8\" has host bits set: did you mean 10.0.0.0/8?",
        ),
        (
            "a source range that is no prefix",
            edit(VIP, "    mode: nat\n    sourceRanges:\n      - 192.0.2.7\n"),
            9,
            "vips[0].sourceRanges[0]",
            "\"192.0.2.7\" is not a prefix",
        ),
        (
            "TCP API without a token",
            format!("api:\n  socket: /run/x.sock\n  listen: 127.0.0.1:9000\n{GOOD}"),
            3,
            "api.listen",
            "needs api.tokenFile",
        ),
    ];
    for (what, text, line, field, msg) in &cases {
        let e = parse_str(text).expect_err(what);
        let shown = e.to_string();
        assert_eq!(e.field.as_deref(), Some(*field), "{what}: {shown}");
        assert_eq!(e.line, Some(*line), "{what}: {shown}");
        assert!(e.message.contains(msg), "{what}: {shown:?} lacks {msg:?}");
        assert!(
            shown.starts_with(&format!("rivora.yaml:{line}: {field}: ")),
            "{what}: {shown}"
        );
        // The path is said once, in front, not again in the message.
        assert!(!e.message.contains(&format!("{field}:")), "{what}: {shown}");
        assert!(!e.message.contains(" at line "), "{what}: {shown}");
    }
}

/// Every duration in the file reads the same syntax, and refuses the same
/// bad values with the field named.
#[test]
fn durations_have_one_syntax_everywhere() {
    // (field, file with {} for the duration, a second value that keeps
    // the file valid around it)
    let fields: &[(&str, String)] = &[
        (
            "healthCheck.interval",
            format!("healthCheck: {{interval: {{}}, timeout: 1s}}\n{GOOD}"),
        ),
        (
            "healthCheck.timeout",
            format!("healthCheck: {{interval: 24h, timeout: {{}}}}\n{GOOD}"),
        ),
        (
            "vips[0].healthCheck.interval",
            edit(
                "    mode: nat\n",
                "    mode: nat\n    healthCheck: {interval: {}, timeout: 1s}\n",
            ),
        ),
        (
            "vips[0].backends[0].healthCheck.timeout",
            edit(
                "        port: 8080\n",
                "        port: 8080\n        healthCheck: {interval: 24h, timeout: {}}\n",
            ),
        ),
        (
            "vips[0].affinity.timeout",
            edit(
                "    mode: nat\n",
                "    mode: nat\n    affinity: {type: clientIP, timeout: {}}\n",
            ),
        ),
    ];
    let good = [
        ("90s", 90),
        ("2m", 120),
        ("1m30s", 90),
        ("1h 30m", 5400),
        ("3h", 10_800),
        ("2hours", 7200),
    ];
    for (field, template) in fields {
        for (text, secs) in good {
            let file = template.replacen("{}", &format!("\"{text}\""), 1);
            let c = parse_str(&file).unwrap_or_else(|e| panic!("{field} = {text}: {e}"));
            let want = Duration::from_secs(secs);
            let got = if field.contains("affinity") {
                match c.desired.vips[0].affinity {
                    Affinity::ClientIp { timeout_s } => Duration::from_secs(timeout_s.into()),
                    Affinity::None => panic!("{field}: no affinity"),
                }
            } else {
                let spec = c.health.values().next().cloned().flatten().expect("probed");
                let spec = if field.contains("backends") {
                    c.health
                        .iter()
                        .find(|((_, t), _)| t.port() == 8080)
                        .and_then(|(_, s)| s.clone())
                        .expect("backend 0 probed")
                } else {
                    spec
                };
                if field.ends_with("interval") {
                    spec.interval
                } else {
                    spec.timeout
                }
            };
            assert_eq!(got, want, "{field} = {text}");
        }
        for bad in ["2x", "5", "-1s", "soon"] {
            let file = template.replacen("{}", &format!("\"{bad}\""), 1);
            let e = parse_str(&file).expect_err(bad);
            assert_eq!(e.field.as_deref(), Some(*field), "{bad}: {e}");
            assert!(e.message.contains(&format!("{bad:?}")), "{bad}: {e}");
            assert!(e.message.contains("expected a duration"), "{bad}: {e}");
            assert!(e.line.is_some(), "{e}");
        }
    }
    // Sub-second values: fine for a probe, refused where the datapath
    // counts whole seconds.
    let probe = format!("healthCheck: {{interval: 1500ms, timeout: 250ms}}\n{GOOD}");
    let c = parse_str(&probe).expect("sub-second probe durations");
    let spec = c.health.values().next().cloned().flatten().expect("probed");
    assert_eq!(
        (spec.interval, spec.timeout),
        (Duration::from_millis(1500), Duration::from_millis(250))
    );
    let e = parse_str(&fields[4].1.replacen("{}", "1500ms", 1)).expect_err("1.5 s affinity");
    assert!(e.message.contains("whole seconds"), "{e}");
}

/// Pathological inputs are refused before the parser sees them, quickly.
#[test]
fn huge_and_deep_inputs_are_refused_before_parsing() {
    let started = std::time::Instant::now();
    let cases: Vec<(&str, String, &str)> = vec![
        ("100,000 [", "[".repeat(100_000), "nested deeper than 64"),
        (
            "100,000 {",
            format!("a: {}", "{b: ".repeat(100_000)),
            "nested deeper than 64",
        ),
        (
            "120 KB of block nesting",
            (0..490)
                .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
                .collect::<String>(),
            "nested deeper than 64",
        ),
        (
            "compact sequences",
            format!("vips:\n{}x\n", "- ".repeat(100)),
            "nested deeper than 64",
        ),
        (
            "over 1 MiB",
            format!("{GOOD}{}", "# padding\n".repeat(110_000)),
            "over the limit of 1048576",
        ),
    ];
    for (what, text, want) in &cases {
        let e = parse_str(text).expect_err(what);
        assert!(e.message.contains(want), "{what}: {e}");
    }
    // Each is refused by a scan, not after a parse (which took 38 s for the
    // first): a generous bound for a slow, shared machine.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    // Just under the limit parses (and fails on what it is, not on depth).
    let ok_depth = format!("x: {}{}", "[".repeat(60), "]".repeat(60));
    let e = parse_str(&ok_depth).expect_err("not a config");
    assert!(!e.message.contains("nested"), "{e}");
}

/// Brackets in quoted strings, comments and block scalars are text, not
/// nesting.
#[test]
fn depth_scan_ignores_text() {
    let deep = "[".repeat(100);
    let file = edit(
        "    mode: nat\n",
        &format!(
            "    mode: nat   # {deep}\n    name: \"{deep}\"\n    healthCheck:\n      type: http\n      path: '/{deep}'\n"
        ),
    );
    let c = parse_str(&file).expect("brackets in text");
    assert_eq!(
        c.names.values().next().map(String::as_str),
        Some(deep.as_str())
    );
    assert_eq!(
        yaml::too_deep(&format!("a: |\n  {deep}\n  {{{{\nb: 1\n"), MAX_DEPTH),
        None
    );
    assert_eq!(yaml::too_deep(GOOD, 5), None, "GOOD is 5 deep at most");
    assert_eq!(yaml::too_deep(GOOD, 2), Some(2));
    for f in ["nat.yaml", "dsr.yaml", "l3dsr.yaml"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(f);
        let text = std::fs::read_to_string(&p).expect("example");
        assert_eq!(yaml::too_deep(&text, 8), None, "{f}");
    }
}

/// `load` refuses what is not a regular file without opening it for a
/// blocking read, and files over the limit without reading them whole.
#[test]
fn load_refuses_fifos_directories_and_huge_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("rivora.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("running mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    // In a thread: a regression would block in open() until a writer came.
    let (tx, rx) = std::sync::mpsc::channel();
    let p = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(load(&p).map(|_| ()));
    });
    let e = match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(r) => r.expect_err("a FIFO"),
        Err(_) => {
            // Unblock the reader so the test process can end.
            let _ = std::fs::write(&fifo, "");
            panic!("load blocked on a FIFO");
        }
    };
    assert!(
        e.message.contains("it is a FIFO, not a regular file"),
        "{e}"
    );
    assert_eq!(e.file, fifo);

    let e = load(dir.path()).expect_err("a directory");
    assert!(e.message.contains("it is a directory"), "{e}");

    let big = dir.path().join("big.yaml");
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(50 << 20).expect("a sparse 50 MiB file");
    let e = load(&big).expect_err("50 MiB");
    assert_eq!(
        e.message,
        "the file is 52428800 bytes, over the limit of 1048576 (1 MiB)"
    );

    let ok = dir.path().join("ok.yaml");
    std::fs::write(&ok, GOOD).expect("write");
    load(&ok).expect("a regular file loads");
}

#[test]
fn node_settings_are_apart_from_the_vips() {
    let c = parse_str(&format!("metrics: {{listen: \"[::1]:9440\"}}\n{GOOD}")).expect("valid");
    let n = c.node_settings();
    assert_eq!(n.interfaces.len(), 1);
    assert_eq!(
        n.metrics.listen,
        Some("[::1]:9440".parse().expect("literal"))
    );
    assert_eq!(n.api.socket, Path::new(DEFAULT_SOCKET));
    let other = parse_str(&edit("    port: 80\n", "    port: 81\n")).expect("valid");
    assert_ne!(other.node_settings(), n, "metrics differ");
    assert_eq!(
        other.node_settings().interfaces,
        n.interfaces,
        "a VIP change leaves the node settings"
    );
}

/// Empty values are the same as leaving the key out.
#[test]
fn null_optional_values_are_absent() {
    let c = parse_str(&format!(
        "metrics:\n  listen:\nnode:\n  tunnelSource: {{ipv4: ~}}\n{GOOD}"
    ))
    .expect("valid");
    assert_eq!(c.file.metrics.listen, None);
    assert_eq!(c.file.node.tunnel_source.ipv4, None);
    let c = parse_str(&edit("        port: 8080\n", "        port:\n")).expect("valid");
    assert_eq!(c.desired.vips[0].backends[0].port, 0, "the VIP's port");
}

/// What is not a configuration at all still gets a line or a sentence.
#[test]
fn not_a_configuration() {
    for (text, want) in [
        ("", "at least one interface"),
        ("- a\n- b\n", "invalid type: sequence, expected struct File"),
        ("interfaces: [\n", "did not find expected"),
        ("interfaces: []\n---\nvips: []\n", "more than one document"),
    ] {
        let e = parse_str(text).expect_err(text);
        assert!(e.message.contains(want), "{text:?}: {e}");
    }
}

/// `GOOD` with one more VIP (no backends) at line 12.
fn plus_vip(address: &str, port: &str) -> String {
    format!(
        "{GOOD}  - address: \"{address}\"\n    port: {port}\n    protocol: tcp\n    mode: nat\n"
    )
}

/// Addresses that cannot work and ports two VIPs would share were
/// accepted without a word (issue 12, finding 9): each is refused with
/// its field, its line and the value.
#[test]
fn unusable_addresses_and_shared_ports_are_refused() {
    const B1: &str = "      - address: 10.1.0.2\n";
    let ranged =
        || edit("    port: 80\n", "    port: 8000-8100\n").replacen("        port: 8080\n", "", 1);
    let cases: Vec<(&str, String, usize, &str, &str)> = vec![
        // (what, file, line, field, message contains)
        (
            "a backend whose address is the VIP's",
            edit(B1, "      - address: 10.0.0.100\n"),
            11,
            "vips[0].backends[1].address",
            "VIP tcp/10.0.0.100:80: backend 10.0.0.100 is the VIP's own address: the VIP would forward to itself",
        ),
        (
            "a broadcast VIP",
            edit("address: 10.0.0.100", "address: 255.255.255.255"),
            4,
            "vips[0].address",
            "255.255.255.255 is the broadcast address; VIPs and backends are unicast",
        ),
        (
            "an unspecified VIP",
            edit("address: 10.0.0.100", "address: 0.0.0.0"),
            4,
            "vips[0].address",
            "0.0.0.0 is the unspecified address, which no client can connect to",
        ),
        (
            "an unspecified IPv6 VIP",
            plus_vip("::", "80"),
            12,
            "vips[1].address",
            ":: is the unspecified address",
        ),
        (
            "a multicast VIP",
            edit("address: 10.0.0.100", "address: 239.1.1.1"),
            4,
            "vips[0].address",
            "239.1.1.1 is a multicast address",
        ),
        (
            "a multicast IPv6 VIP",
            plus_vip("ff02::1", "80"),
            12,
            "vips[1].address",
            "ff02::1 is a multicast address",
        ),
        (
            "a loopback VIP",
            edit("address: 10.0.0.100", "address: 127.0.0.53"),
            4,
            "vips[0].address",
            "127.0.0.53 is a loopback address, which never arrives from another host",
        ),
        (
            "a loopback IPv6 VIP",
            plus_vip("::1", "80"),
            12,
            "vips[1].address",
            "::1 is a loopback address",
        ),
        (
            "an IPv4-mapped IPv6 VIP",
            plus_vip("::ffff:10.0.0.7", "80"),
            12,
            "vips[1].address",
            "::ffff:10.0.0.7 is an IPv4-mapped IPv6 address, which no packet carries; write the IPv4 address 10.0.0.7",
        ),
        (
            "a broadcast backend",
            edit(B1, "      - address: 255.255.255.255\n"),
            11,
            "vips[0].backends[1].address",
            "255.255.255.255 is the broadcast address",
        ),
        (
            "an unspecified backend",
            edit(B1, "      - address: 0.0.0.0\n"),
            11,
            "vips[0].backends[1].address",
            "0.0.0.0 is the unspecified address",
        ),
        (
            "a multicast backend",
            edit(B1, "      - address: 224.0.0.9\n"),
            11,
            "vips[0].backends[1].address",
            "224.0.0.9 is a multicast address",
        ),
        (
            "a loopback backend",
            edit(B1, "      - address: 127.0.0.1\n"),
            11,
            "vips[0].backends[1].address",
            "VIP tcp/10.0.0.100:80: backend 127.0.0.1 is a loopback address, which the datapath cannot forward to",
        ),
        (
            "a broadcast tunnel source",
            format!("node:\n  tunnelSource: {{ipv4: 255.255.255.255}}\n{GOOD}"),
            2,
            "node.tunnelSource.ipv4",
            "255.255.255.255 is the broadcast address",
        ),
        (
            "a range taking a single-port VIP's port",
            plus_vip("10.0.0.100", "70-90"),
            13,
            "vips[1].port",
            "VIP tcp/10.0.0.100:70-90: the range holds port 80, which VIP tcp/10.0.0.100:80 (vips[0]) has; \
             a port belongs to one VIP: split the range around it (70-79 and 81-90) or remove one",
        ),
        (
            "a single port inside a range VIP",
            format!("{}  - address: 10.0.0.100\n    port: 8100\n    protocol: tcp\n    mode: nat\n", ranged()),
            12,
            "vips[1].port",
            "VIP tcp/10.0.0.100:8100: port 8100 is also inside the range of VIP tcp/10.0.0.100:8000-8100 (vips[0]); \
             a port belongs to one VIP: split the range around it (8000-8099) or remove one",
        ),
        (
            "a one-port range over a single port",
            plus_vip("10.0.0.100", "80-80"),
            13,
            "vips[1].port",
            "the range holds port 80, which VIP tcp/10.0.0.100:80 (vips[0]) has; a port belongs to one VIP: remove one of them",
        ),
    ];
    for (what, text, line, field, msg) in &cases {
        let e = parse_str(text).expect_err(what);
        let shown = e.to_string();
        assert_eq!(e.field.as_deref(), Some(*field), "{what}: {shown}");
        assert_eq!(e.line, Some(*line), "{what}: {shown}");
        assert!(e.message.contains(msg), "{what}: {shown:?} lacks {msg:?}");
        assert!(
            shown.starts_with(&format!("rivora.yaml:{line}: {field}: ")),
            "{what}: {shown}"
        );
    }
    // What stays valid: the same port on another protocol or address, a
    // range beside (not over) a single port, a link-local address.
    for (what, text) in [
        ("another protocol", format!("{GOOD}  - address: 10.0.0.100\n    port: 70-90\n    protocol: udp\n    mode: nat\n")),
        ("another address", plus_vip("10.0.0.101", "70-90")),
        ("a range beside the port", plus_vip("10.0.0.100", "81-90")),
        ("a link-local VIP", plus_vip("169.254.10.1", "80")),
    ] {
        parse_str(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// A file of `n` VIPs (10.0.x.y:80), each listing `backends`.
fn many_vips(n: usize, backends: &str) -> String {
    let mut s = String::from("interfaces: [{name: eth0}]\nvips:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  - {{address: 10.0.{}.{}, port: 80, protocol: tcp, mode: nat, backends: {backends}}}\n",
            i / 256,
            i % 256
        ));
    }
    s
}

/// `n` backends from 10.1.0.0 on, as a flow sequence (k = first..first+n).
fn backend_list(first: usize, n: usize) -> String {
    let items: Vec<String> = (first..first + n)
        .map(|k| format!("{{address: 10.1.{}.{}}}", k / 256, k % 256))
        .collect();
    format!("[{}]", items.join(", "))
}

/// (what, file, capacity, line, field, what the message says)
type CapacityCase<'a> = (&'a str, String, Capacity, usize, &'a str, &'a [&'a str]);

/// Every capacity of the datapath is checked by the validator, so that
/// `rivorad -check`, `rivoractl config validate` and a reload agree (issue
/// 12, finding 1: 5,000 VIPs passed and a reload applied 4,096 of them).
/// Each error names the limit, the count and the first entry past it, in
/// a short message.
#[test]
fn capacities_are_checked_with_short_messages() {
    let two = backend_list(0, 2);
    // VIPs of two backends take at least 12 slots each, and the table
    // keeps room to rebuild the largest: 84 fit in 1,021 slots, the 85th
    // does not.
    let two_small = many_vips(85, &two);
    let ids = |extra: usize| {
        format!(
            "interfaces: [{{name: eth0}}]\nvips:\n  - address: 10.0.0.1\n    port: 80\n    protocol: tcp\n    mode: nat\n    backends: {}\n  - address: 10.0.0.2\n    port: 80\n    protocol: tcp\n    mode: nat\n    backends: {}\n",
            backend_list(0, 5000),
            {
                let a = backend_list(0, 100);
                let b = backend_list(5000, 3192 + extra);
                format!("{}, {}", &a[..a.len() - 1], &b[1..])
            }
        )
    };
    let interfaces = |n: usize| {
        let names: Vec<String> = (0..n).map(|i| format!("{{name: e{i}}}")).collect();
        format!("interfaces: [{}]\n", names.join(", "))
    };
    let default = Capacity::default();
    let small = Capacity {
        maglev_size: 1021,
        ..Capacity::default()
    };
    let cases: Vec<CapacityCase> = vec![
        // (what, file, capacity, line, field, the message says)
        (
            "5,000 VIPs",
            many_vips(5000, "[]"),
            default,
            4099,
            "vips[4096]",
            &[
                "5000 VIPs",
                "limit of 4096",
                "the first past it is VIP tcp/10.0.16.0:80",
            ],
        ),
        (
            "8,193 distinct backends",
            ids(1),
            default,
            12,
            "vips[1].backends[3292]",
            &[
                "8193 distinct backends",
                "limit of 8192",
                "backend 10.1.32.0 of VIP tcp/10.0.0.2:80",
            ],
        ),
        (
            "more Maglev slots than the table has",
            two_small.clone(),
            small,
            87,
            "vips[84]",
            &[
                "need at least 1032 Maglev slots",
                "the table's 1021",
                "VIP tcp/10.0.0.84:80",
                "2 weighted backend(s) take at least 12 slots",
            ],
        ),
        (
            "a slice bigger than a small table",
            edit(
                "      - address: 10.1.0.2\n",
                &format!(
                    "      - address: 10.1.0.2\n{}",
                    (3..=400)
                        .map(|k| format!("      - address: 10.1.{}.{}\n", 1 + k / 256, k % 256))
                        .collect::<String>()
                ),
            ),
            small,
            4,
            "vips[0]",
            &[
                "need at least 1536 Maglev slots",
                "the table's 1021",
                "400 weighted backend(s) take at least 768 slots",
            ],
        ),
        (
            "257 interfaces",
            format!(
                "{}{}",
                interfaces(257),
                &GOOD["interfaces:\n  - name: eth0\n".len()..]
            ),
            default,
            1,
            "interfaces[256]",
            &["257 interfaces", "limit of 256"],
        ),
    ];
    for (what, text, cap, line, field, says) in &cases {
        let e = parse_with(Path::new("rivora.yaml"), text, cap).expect_err(what);
        let shown = e.to_string();
        assert_eq!(e.field.as_deref(), Some(*field), "{what}: {shown}");
        assert_eq!(e.line, Some(*line), "{what}: {shown}");
        for s in *says {
            assert!(e.message.contains(s), "{what}: {shown:?} lacks {s:?}");
        }
        assert!(
            shown.starts_with(&format!("rivora.yaml:{line}: {field}: ")),
            "{what}: {shown}"
        );
        assert!(shown.len() < 300, "{what}: {} bytes: {shown}", shown.len());
    }
    // At the limits, each fits.
    let full = parse_str(&many_vips(4096, &two)).expect("4,096 VIPs of two backends");
    assert_eq!(full.desired.vips.len(), 4096);
    parse_str(&ids(0)).expect("8,192 distinct backends");
    let just = parse_with(
        Path::new("rivora.yaml"),
        &two_small,
        &Capacity {
            maglev_size: 1032,
            ..Capacity::default()
        },
    )
    .expect("a table just big enough");
    assert!(
        just.warnings.is_empty(),
        "two backends of weight 1 need no more than 12 slots: {:?}",
        just.warnings
    );
    parse_str(&format!(
        "{}{}",
        interfaces(256),
        &GOOD["interfaces:\n  - name: eth0\n".len()..]
    ))
    .expect("256 interfaces");
    assert_eq!(
        full.capacity,
        Capacity::default(),
        "what it was checked against"
    );
}

/// A table too small for every VIP's weights but big enough for their
/// smallest slices: accepted, with a warning that names the VIPs that
/// will run below their precision (`rivorad -check`, `rivoractl config
/// validate` and a reload say the same).
#[test]
fn precision_warnings_when_the_table_is_short() {
    let canary = "[{address: 10.1.0.1, weight: 1}, {address: 10.1.0.2, weight: 999}]";
    // 1:999 needs 768 slots: 84 such VIPs and room to rebuild one fit the
    // default table, not 85.
    let fits = parse_str(&many_vips(84, canary)).expect("fits");
    assert!(fits.warnings.is_empty(), "{:?}", fits.warnings);
    let short = parse_str(&many_vips(85, canary)).expect("fits at the minimum");
    assert_eq!(short.warnings.len(), 1, "{:?}", short.warnings);
    let w = &short.warnings[0];
    for s in [
        "the Maglev table (65537 slots, rivorad -maglev-size)",
        "85 VIP(s) will run with reduced precision",
        "vips[0] (tcp/10.0.0.0:80) gets 384 of the 768 slots its weights need",
        "and 82 more",
    ] {
        assert!(w.contains(s), "{w:?} lacks {s:?}");
    }
    // A bigger table takes them all.
    let big = parse_with(
        Path::new("rivora.yaml"),
        &many_vips(85, canary),
        &Capacity {
            maglev_size: 131_071,
            ..Capacity::default()
        },
    )
    .expect("fits");
    assert!(big.warnings.is_empty());
}

/// A value or key of any length gives a message of bounded length that
/// still reads as a sentence.
#[test]
fn long_values_give_short_messages() {
    let long = "a".repeat(100_000);
    let cases: Vec<(&str, String, &str, &[&str])> = vec![
        (
            "a long VIP address",
            edit("address: 10.0.0.100", &format!("address: {long}")),
            "vips[0].address",
            &["\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…\" (100000 characters) is not an IP address"],
        ),
        (
            "a long port",
            edit("    port: 80\n", &format!("    port: \"{long}\"\n")),
            "vips[0].port",
            &["(100000 characters) is not a port"],
        ),
        (
            "a long string where a number goes",
            edit("    mode: nat\n", &format!("    mode: nat\n    healthCheck: {{rise: \"{long}\"}}\n")),
            "vips[0].healthCheck.rise",
            &["invalid type: string \"aaa", "…", "\", expected u32"],
        ),
    ];
    for (what, text, field, says) in &cases {
        let e = parse_str(text).expect_err(what);
        let shown = e.to_string();
        assert_eq!(e.field.as_deref(), Some(*field), "{what}: {shown}");
        for s in *says {
            assert!(e.message.contains(s), "{what}: {shown:?} lacks {s:?}");
        }
        assert!(shown.len() < 600, "{what}: {} bytes", shown.len());
    }
    // An unknown key as long as YAML allows (1,024 characters): the
    // field and message are bounded.
    let key = "a".repeat(1000);
    let e = parse_str(&edit(
        "    mode: nat\n",
        &format!("    mode: nat\n    {key}: 1\n"),
    ))
    .expect_err("unknown key");
    let shown = e.to_string();
    assert!(shown.len() < 600, "{} bytes: {shown}", shown.len());
    assert!(e.message.starts_with("unknown field `aaa"), "{shown}");
    assert!(e.message.ends_with("`healthCheck`, `backends`"), "{shown}");
    assert!(
        e.field
            .as_deref()
            .is_some_and(|f| f.starts_with("vips[0].aaa")),
        "{shown}"
    );
    assert_eq!(e.line, Some(8), "{shown}");
}

const L2_BASE: &str = "\
interfaces:
  - name: eth0
  - name: eth1
node:
  announce: l2
";

#[test]
fn l2_settings_default_and_read() {
    let c = parse_str(GOOD).expect("valid");
    let n = c.node_settings();
    assert_eq!(n.announce, Announce::None, "nothing announced unless asked");
    assert_eq!(n.l2, L2Conf::default());
    assert_eq!(n.l2.gratuitous_interval, Duration::from_secs(30));
    assert_eq!(n.l2.lease.timings(), LeaseTimings::L2);

    let text = format!(
        "{L2_BASE}  l2:\n    interfaces: [eth1]\n    gratuitousInterval: 5s\n    \
         nodeSelector: {{ rivora.io/l2: \"yes\" }}\n    \
         lease: {{ namespace: lb, duration: 2s, renewDeadline: 1500ms, retryPeriod: 250ms }}\n"
    );
    let n = parse_str(&text).expect("valid").node_settings();
    assert_eq!(n.announce, Announce::L2);
    assert_eq!(n.l2.interfaces, vec![L2Interface("eth1".into())]);
    assert_eq!(n.l2.gratuitous_interval, Duration::from_secs(5));
    assert_eq!(n.l2.node_selector["rivora.io/l2"], "yes");
    assert_eq!(n.l2.lease.namespace.as_deref(), Some("lb"));
    assert_eq!(n.l2.lease.duration, Duration::from_secs(2));
    assert_eq!(n.l2.lease.renew_deadline, Duration::from_millis(1500));
    assert_eq!(n.l2.lease.retry_period, Duration::from_millis(250));
}

#[test]
fn bad_l2_settings_are_named() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "  l2:\n    interfaces: [eth9]\n",
            "node.l2.interfaces[0]",
            "not one of `interfaces`",
        ),
        (
            "  l2:\n    interfaces: [\"a/b\"]\n",
            "node.l2.interfaces[0]",
            "not an interface name",
        ),
        (
            "  l2:\n    gratuitousInterval: 500ms\n",
            "node.l2.gratuitousInterval",
            "between 1s and 1h",
        ),
        (
            "  l2:\n    gratuitousInterval: 2h\n",
            "node.l2.gratuitousInterval",
            "between 1s and 1h",
        ),
        (
            "  l2:\n    nodeSelector: { \"bad key!\": x }\n",
            "node.l2.nodeSelector",
            "not a Kubernetes label",
        ),
        (
            "  l2:\n    lease: { namespace: Rivora }\n",
            "node.l2.lease.namespace",
            "not a namespace name",
        ),
        (
            "  l2:\n    lease: { duration: 800ms, renewDeadline: 750ms }\n",
            "node.l2.lease",
            "at least 100ms",
        ),
        (
            "  l2:\n    lease: { duration: 800ms, renewDeadline: 900ms }\n",
            "node.l2.lease",
            "renew deadline must be below",
        ),
        (
            "  l2:\n    lease: { retryPeriod: 10ms }\n",
            "node.l2.lease",
            "at least 50ms",
        ),
        ("  l2:\n    leases: {}\n", "node.l2", "unknown field"),
    ];
    for (extra, field, words) in cases {
        let text = format!("{L2_BASE}{extra}");
        let e = parse_str(&text).expect_err(extra);
        assert!(
            e.field.as_deref().is_some_and(|f| f.starts_with(field)) && e.message.contains(words),
            "{extra:?}: {e}"
        );
        assert!(e.line.is_some(), "{extra:?}: {e}");
    }
    let e = parse_str("interfaces:\n  - name: eth0\nnode:\n  announce: bgp\n").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("node.announce"), "{e}");
    assert!(e.message.contains("unknown variant"), "{e}");
}

/// `GOOD` with a `node.snat` section holding `body` (its lines indented
/// under `snat:`); the body starts at line 14.
fn with_snat(body: &str) -> String {
    format!("{GOOD}node:\n  snat:\n{body}")
}

/// Full NAT's settings as the model documents their defaults.
const SNAT_DEFAULTS: FullNatSettings = FullNatSettings {
    src4: None,
    src6: None,
    port_min: 1024,
    port_max: 32767,
    tcp_timeout_ms: 6 * 3_600_000,
    tcp_closing_timeout_ms: 10_000,
    udp_timeout_ms: 60_000,
};

/// `node.snat`: every field read into the node's full-NAT settings, each
/// one left out (or empty) taking its default, the bounds accepted in any
/// of humantime's spellings.
#[test]
fn snat_settings_default_and_read() {
    assert_eq!(FullNatSettings::default(), SNAT_DEFAULTS);
    for (what, text) in [
        ("no node section", GOOD.to_string()),
        (
            "no snat section",
            format!("{GOOD}node:\n  announce: none\n"),
        ),
        ("an empty one", format!("{GOOD}node:\n  snat: {{}}\n")),
        (
            "every value empty",
            with_snat(
                "    ipv4: ~\n    ipv6:\n    ports: ~\n    tcpTimeout: ~\n    \
                 tcpClosingTimeout:\n    udpTimeout: ~\n",
            ),
        ),
    ] {
        let c = parse_str(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(c.desired.node.fullnat, SNAT_DEFAULTS, "{what}");
        assert!(c.warnings.is_empty(), "{what}: {:?}", c.warnings);
    }

    let c = parse_str(&with_snat(
        "    ipv4: 192.0.2.10\n    ipv6: \"2001:db8::10\"\n    ports: \"2000-60000\"\n    \
         tcpTimeout: 1h 30m\n    tcpClosingTimeout: 5s\n    udpTimeout: 2m\n",
    ))
    .expect("valid");
    assert_eq!(
        c.desired.node.fullnat,
        FullNatSettings {
            src4: Some("192.0.2.10".parse().unwrap()),
            src6: Some("2001:db8::10".parse().unwrap()),
            port_min: 2000,
            port_max: 60000,
            tcp_timeout_ms: 5_400_000,
            tcp_closing_timeout_ms: 5_000,
            udp_timeout_ms: 120_000,
        }
    );

    // One field at a time: the others keep their defaults.
    type Set = fn(&mut FullNatSettings);
    let one: Vec<(&str, Set)> = vec![
        ("    ipv4: 10.9.0.1\n", |f| {
            f.src4 = Some("10.9.0.1".parse().unwrap())
        }),
        ("    ipv6: \"fd00:9::1\"\n", |f| {
            f.src6 = Some("fd00:9::1".parse().unwrap())
        }),
        ("    ports: \"1-65535\"\n", |f| {
            (f.port_min, f.port_max) = (1, 65535)
        }),
        ("    ports: 40000-50000\n", |f| {
            (f.port_min, f.port_max) = (40000, 50000)
        }),
        // The smallest timeouts: 2s, however written.
        ("    tcpTimeout: 2s\n", |f| f.tcp_timeout_ms = 2_000),
        ("    tcpClosingTimeout: 2000ms\n", |f| {
            f.tcp_closing_timeout_ms = 2_000
        }),
        ("    udpTimeout: 2s 1ms\n", |f| f.udp_timeout_ms = 2_001),
        // The largest: 30 days.
        ("    tcpTimeout: 30days\n", |f| {
            f.tcp_timeout_ms = 2_592_000_000
        }),
        ("    udpTimeout: 720h\n", |f| {
            f.udp_timeout_ms = 2_592_000_000
        }),
    ];
    for (body, set) in one {
        let c = parse_str(&with_snat(body)).unwrap_or_else(|e| panic!("{body:?}: {e}"));
        let mut want = SNAT_DEFAULTS;
        set(&mut want);
        assert_eq!(c.desired.node.fullnat, want, "{body:?}");
    }
}

/// Every bad `node.snat` value is refused with its field path as the
/// file writes it, its own line, and the value as written.
#[test]
fn bad_snat_settings_are_named() {
    let cases: &[(&str, &str, usize, &str, &str)] = &[
        // (what, body, line, field, the message says)
        (
            "an IPv6 address as the IPv4 source",
            "    ipv4: \"fd00::1\"\n",
            14,
            "node.snat.ipv4",
            "\"fd00::1\" is not an IPv4 address",
        ),
        (
            "an IPv4 address as the IPv6 source",
            "    ipv6: 10.0.0.1\n",
            14,
            "node.snat.ipv6",
            "\"10.0.0.1\" is not an IPv6 address",
        ),
        (
            "a name as the source",
            "    ipv4: lb.example\n",
            14,
            "node.snat.ipv4",
            "\"lb.example\" is not an IPv4 address",
        ),
        (
            "the unspecified address",
            "    ipv4: 0.0.0.0\n",
            14,
            "node.snat.ipv4",
            "0.0.0.0 is the unspecified address",
        ),
        (
            "a multicast source",
            "    ipv4: 10.9.0.1\n    ipv6: \"ff02::1\"\n",
            15,
            "node.snat.ipv6",
            "ff02::1 is a multicast address",
        ),
        (
            "a loopback IPv4 source",
            "    ipv4: 127.0.0.1\n",
            14,
            "node.snat.ipv4",
            "127.0.0.1 is a loopback address, which never arrives from another host",
        ),
        (
            "a loopback IPv6 source",
            "    ipv6: \"::1\"\n",
            14,
            "node.snat.ipv6",
            "::1 is a loopback address",
        ),
        (
            "an IPv4-mapped IPv6 source",
            "    ipv6: \"::ffff:10.9.0.1\"\n",
            14,
            "node.snat.ipv6",
            "an IPv4-mapped IPv6 address, which no packet carries; write the IPv4 address 10.9.0.1",
        ),
        (
            "ports reversed",
            "    ports: \"2000-1000\"\n",
            14,
            "node.snat.ports",
            "\"2000-1000\" is an empty port range (the first port is after the last)",
        ),
        (
            "a range from port 0",
            "    ports: \"0-100\"\n",
            14,
            "node.snat.ports",
            "port 0 is not a port",
        ),
        (
            "port 0",
            "    ports: 0\n",
            14,
            "node.snat.ports",
            "port 0 is not a port",
        ),
        (
            "a range past 65535",
            "    ports: \"1024-70000\"\n",
            14,
            "node.snat.ports",
            "70000 is not a port (1-65535)",
        ),
        (
            "a port past 65535",
            "    ports: 65536\n",
            14,
            "node.snat.ports",
            "65536 is not a port (1-65535)",
        ),
        (
            "a negative port",
            "    ports: -5\n",
            14,
            "node.snat.ports",
            "-5 is not a port (1-65535)",
        ),
        (
            "a range without its end",
            "    ports: \"1024-\"\n",
            14,
            "node.snat.ports",
            "\"1024-\" is not a port",
        ),
        (
            "a range with a colon",
            "    ports: \"1024:2000\"\n",
            14,
            "node.snat.ports",
            "\"1024:2000\" is not a port",
        ),
        (
            "three ports",
            "    ports: 1024-2000-3000\n",
            14,
            "node.snat.ports",
            "\"1024-2000-3000\" is not a port",
        ),
        (
            "ports as a word",
            "    ports: ephemeral\n",
            14,
            "node.snat.ports",
            "\"ephemeral\" is not a port",
        ),
        (
            "ports as a list",
            "    ports: [1024, 2000]\n",
            14,
            "node.snat.ports",
            "invalid type: sequence, expected a port (1-65535) or a range",
        ),
        (
            "a TCP timeout below the minimum",
            "    tcpTimeout: 1s\n",
            14,
            "node.snat.tcpTimeout",
            "\"1s\" is out of range: 2s to 30days (a flow's port is checked once a second",
        ),
        (
            "a closing timeout just below the minimum",
            "    tcpTimeout: 1h\n    tcpClosingTimeout: 1999ms\n",
            15,
            "node.snat.tcpClosingTimeout",
            "\"1s 999ms\" is out of range: 2s to 30days",
        ),
        (
            "a UDP timeout of zero",
            "    udpTimeout: 0s\n",
            14,
            "node.snat.udpTimeout",
            "\"0s\" is out of range: 2s to 30days",
        ),
        (
            "a TCP timeout above the maximum",
            "    tcpTimeout: 31days\n",
            14,
            "node.snat.tcpTimeout",
            "\"1month 13h 26m 24s\" is out of range: 2s to 30days",
        ),
        (
            "a timeout finer than a millisecond",
            "    udpTimeout: 2s 500us\n",
            14,
            "node.snat.udpTimeout",
            "\"2s 500us\": full NAT's timeouts take whole milliseconds",
        ),
        (
            "a timeout as a word",
            "    tcpTimeout: forever\n",
            14,
            "node.snat.tcpTimeout",
            "\"forever\", expected a duration like \"500ms\"",
        ),
        (
            "a timeout without a unit",
            "    udpTimeout: 60\n",
            14,
            "node.snat.udpTimeout",
            "\"60\", expected a duration like \"500ms\"",
        ),
        (
            "an unknown key",
            "    port: 2000\n",
            14,
            "node.snat.port",
            "unknown field `port`, expected one of `ipv4`, `ipv6`, `ports`, `tcpTimeout`, \
             `tcpClosingTimeout`, `udpTimeout`",
        ),
        (
            "a key in snake case",
            "    ports: \"2000-3000\"\n    tcp_timeout: 1h\n",
            15,
            "node.snat.tcp_timeout",
            "unknown field `tcp_timeout`, expected one of",
        ),
    ];
    for (what, body, line, field, msg) in cases {
        let text = with_snat(body);
        let e = parse_str(&text).expect_err(what);
        let shown = e.to_string();
        assert_eq!(e.field.as_deref(), Some(*field), "{what}: {shown}");
        assert_eq!(e.line, Some(*line), "{what}: {shown}");
        assert!(e.message.contains(msg), "{what}: {shown:?} lacks {msg:?}");
        assert!(
            shown.starts_with(&format!("rivora.yaml:{line}: {field}: ")),
            "{what}: {shown}"
        );
        assert!(!e.message.contains(&format!("{field}:")), "{what}: {shown}");
    }
    // Not a mapping at all.
    let e = parse_str(&format!("{GOOD}node:\n  snat: 2000-3000\n")).expect_err("snat: ports");
    assert_eq!(
        (e.field.as_deref(), e.line),
        (Some("node.snat"), Some(13)),
        "{e}"
    );
    assert!(e.message.contains("invalid type"), "{e}");
    // A source out of the window's bounds above does not say "sooner".
    let e = parse_str(&with_snat("    tcpTimeout: 31days\n")).expect_err("too long");
    assert!(!e.message.contains("sooner"), "{e}");
}

/// A port range under a sixteenth of the flow table is accepted with a
/// warning naming both figures (and the flag that sets the table): the
/// range is how many full-NAT flows a backend takes from one source.
#[test]
fn a_snat_port_range_small_for_the_flow_table_is_warned_about() {
    let warnings = |body: &str, flow_table_size: u32| {
        parse_with(
            Path::new("rivora.yaml"),
            &with_snat(body),
            &Capacity {
                flow_table_size,
                ..Capacity::default()
            },
        )
        .unwrap_or_else(|e| panic!("{body:?}: a warning, not an error: {e}"))
        .warnings
    };
    let default = Capacity::default().flow_table_size;
    assert_eq!(default, 131_072);
    // 131072 / 16 = 8192 ports: that many is enough, one fewer is not.
    assert!(warnings("    ports: \"2000-10191\"\n", default).is_empty());
    let w = warnings("    ports: \"2000-10190\"\n", default);
    assert_eq!(w.len(), 1, "{w:?}");
    for s in [
        "node.snat.ports 2000-10190 holds 8191 ports",
        "under a sixteenth of the 131072 flows",
        "rivorad -flow-table-size",
        "at most 8191 full-NAT flows from one source address",
        "fullnat_ports_exhausted",
    ] {
        assert!(w[0].contains(s), "{:?} lacks {s:?}", w[0]);
    }
    // One port.
    let w = warnings("    ports: 5000\n", default);
    assert!(
        w.len() == 1 && w[0].contains("5000-5000 holds 1 ports"),
        "{w:?}"
    );
    // A larger table makes the default range small: the warning comes
    // without the file saying anything of full NAT.
    let big = 1 << 20;
    let w = parse_with(
        Path::new("rivora.yaml"),
        GOOD,
        &Capacity {
            flow_table_size: big,
            ..Capacity::default()
        },
    )
    .expect("valid")
    .warnings;
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("node.snat.ports 1024-32767 holds 31744 ports")
            && w[0].contains("of the 1048576 flows"),
        "{w:?}"
    );
    // A smaller one takes a smaller range: 4096 / 16 = 256.
    assert!(warnings("    ports: \"2000-2255\"\n", 4096).is_empty());
    let w = warnings("    ports: \"2000-2254\"\n", 4096);
    assert!(
        w.len() == 1 && w[0].contains("holds 255 ports") && w[0].contains("of the 4096 flows"),
        "{w:?}"
    );
}

/// `mode: fullnat` is a VIP's mode like the others, with NAT's port
/// rules. The file gives a backend no mode of its own (the model's
/// `Backend::mode` is Kubernetes': a Service's endpoints on other nodes by
/// full NAT), so a backend's `mode` is an unknown key.
#[test]
fn fullnat_mode_and_what_is_refused() {
    let c = parse_str(&edit("    mode: nat\n", "    mode: fullnat\n")).expect("valid");
    let v = &c.desired.vips[0];
    assert_eq!(v.mode, Mode::FullNat);
    assert_eq!(
        v.backends
            .iter()
            .map(|b| (b.port, b.mode, b.mode_in(v.mode)))
            .collect::<Vec<_>>(),
        vec![(8080, None, Mode::FullNat), (0, None, Mode::FullNat)],
        "ports translated or kept as in NAT; every backend reached the VIP's way"
    );
    // No tunnel source, MAC or node.snat needed (the source is then the
    // route's); IPv6 too.
    let v6 = edit("    mode: nat\n", "    mode: fullnat\n")
        .replacen("address: 10.0.0.100", "address: \"fd00::100\"", 1)
        .replacen("address: 10.1.0.1", "address: \"fd00:1::1\"", 1)
        .replacen("address: 10.1.0.2", "address: \"fd00:1::2\"", 1);
    let c = parse_str(&format!("{v6}node:\n  snat: {{ipv4: 10.9.0.1}}\n")).expect("valid");
    assert_eq!(c.desired.vips[0].mode, Mode::FullNat);
    assert_eq!(c.desired.node.fullnat.src_for(true), None);
    // Over a port range each port goes to itself, as in NAT.
    let range = edit("    mode: nat\n", "    mode: fullnat\n").replacen(
        "    port: 80\n",
        "    port: 8000-8100\n",
        1,
    );
    let e = parse_str(&range).expect_err("a backend port on a range");
    assert_eq!(
        (e.field.as_deref(), e.line),
        (Some("vips[0].backends[0].port"), Some(10)),
        "{e}"
    );
    assert!(
        e.message
            .contains("backend port 8080 on a NAT or full-NAT port-range VIP"),
        "{e}"
    );
    let c = parse_str(&range.replacen("        port: 8080\n", "", 1)).expect("valid");
    assert_eq!(
        c.desired.vips[0].ports,
        Ports::Range {
            first: 8000,
            last: 8100
        }
    );

    // Other spellings are refused, naming the modes there are.
    for m in ["fullNat", "full-nat", "FULLNAT", "snat"] {
        let e = parse_str(&edit("    mode: nat\n", &format!("    mode: {m}\n"))).expect_err(m);
        assert_eq!(
            (e.field.as_deref(), e.line),
            (Some("vips[0].mode"), Some(7)),
            "{e}"
        );
        assert!(
            e.message.contains(&format!(
                "unknown variant `{m}`, expected one of `nat`, `dsr`, `l3dsr`, `fullnat`"
            )),
            "{e}"
        );
    }
    // A backend's own mode, in any of them.
    for m in ["fullnat", "nat"] {
        let e = parse_str(&edit(
            "        port: 8080\n",
            &format!("        port: 8080\n        mode: {m}\n"),
        ))
        .expect_err(m);
        assert_eq!(
            (e.field.as_deref(), e.line),
            (Some("vips[0].backends[0].mode"), Some(11)),
            "{e}"
        );
        assert!(
            e.message.contains(
                "unknown field `mode`, expected one of `address`, `port`, `weight`, `mac`, \
                 `healthCheck`"
            ),
            "{e}"
        );
    }
}
