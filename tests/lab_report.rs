//! scripts/lab-report.py, which turns the lab bench's RESULT lines into the
//! table, the `lab_*` keys of results.json and the chart: medians over
//! repetitions, failed measures left out, other keys kept, stale lab keys
//! dropped.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rivora-lab-report-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn medians_keys_and_chart() {
    let dir = scratch("medians");
    let runs = dir.join("runs.txt");
    fs::write(
        &runs,
        "lab: noise that is not a result\n\
         RESULT rep=1 path=direct tcp1_gbps=4.0 pps_64k=600 cps=30000 rr_p99_us=40\n\
         RESULT rep=1 path=nft_dnat tcp1_gbps=3.0 pps_64k=400 cps=nan rr_p99_us=50\n\
         RESULT rep=2 path=direct tcp1_gbps=5.0 pps_64k=620 cps=31000 rr_p99_us=42\n\
         RESULT rep=2 path=nft_dnat tcp1_gbps=3.5 pps_64k=410 cps=25000 rr_p99_us=48\n\
         RESULT rep=3 path=direct tcp1_gbps=4.5 pps_64k=610 cps=29000 rr_p99_us=41\n\
         RESULT rep=3 path=nft_dnat failed=1\n",
    )
    .expect("runs");
    let results = dir.join("results.json");
    fs::write(
        &results,
        r#"{"xdp_floor_ns": 12, "lab_cps_haproxy": 17000, "lab_pps_64k_direct": 1}"#,
    )
    .expect("results");
    let chart = dir.join("lab.svg");

    let out = Command::new("python3")
        .arg("scripts/lab-report.py")
        .arg(&runs)
        .args(["--paths", "direct nft_dnat haproxy"])
        .arg("--results")
        .arg(&results)
        .arg("--chart")
        .arg(&chart)
        .output()
        .expect("running python3 scripts/lab-report.py");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lab-report failed: {table}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let got: BTreeMap<String, f64> =
        serde_json::from_str(&fs::read_to_string(&results).expect("results written"))
            .expect("results.json is a flat object of numbers");
    // Medians of three (direct) and of two (nft: its third run failed).
    assert_eq!(got.get("lab_tcp_gbps_direct"), Some(&4.5));
    assert_eq!(got.get("lab_tcp_gbps_nft_dnat"), Some(&3.25));
    assert_eq!(
        got.get("lab_pps_64k_direct"),
        Some(&610.0),
        "old lab key replaced"
    );
    assert_eq!(got.get("lab_pps_64k_nft_dnat"), Some(&405.0));
    assert_eq!(got.get("lab_cps_direct"), Some(&30000.0));
    // A nan is no figure: the median is of the measures that worked.
    assert_eq!(got.get("lab_cps_nft_dnat"), Some(&25000.0));
    assert_eq!(got.get("lab_rr_p99_us_direct"), Some(&41.0));
    assert_eq!(
        got.get("xdp_floor_ns"),
        Some(&12.0),
        "other areas' keys kept"
    );
    assert!(
        !got.contains_key("lab_cps_haproxy"),
        "a lab key this run did not measure must not survive beside new ones"
    );

    // The table carries ratios to direct and to nft_dnat.
    let line = table
        .lines()
        .find(|l| l.starts_with("TCP 1 stream") && l.contains("nft_dnat"))
        .unwrap_or_else(|| panic!("no nft_dnat TCP row in:\n{table}"));
    assert!(
        line.contains("3.25") && line.contains("0.72x") && line.contains("1.00x"),
        "{line}"
    );

    let svg = fs::read_to_string(&chart).expect("chart written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("nft_dnat"));
    assert!(
        svg.contains("4.50"),
        "the direct TCP median is drawn: {svg}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn no_results_is_an_error() {
    let dir = scratch("empty");
    let runs = dir.join("runs.txt");
    fs::write(&runs, "RESULT rep=1 path=direct failed=1\n").expect("runs");
    let out = Command::new("python3")
        .arg("scripts/lab-report.py")
        .arg(&runs)
        .args(["--paths", "direct"])
        .output()
        .expect("running python3 scripts/lab-report.py");
    assert!(!out.status.success(), "a run with no figures must fail");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no results"));
    let _ = fs::remove_dir_all(&dir);
}

/// Issue 19's lab keys: per generator, the node's ns per delivered packet
/// for each Rivora mode and their ratios to DSR, from the medians.
#[test]
fn issue19_generator_keys() {
    let dir = scratch("issue19");
    let runs = dir.join("runs.txt");
    fs::write(
        &runs,
        "RESULT rep=1 path=rivora_dsr node_ns_64k=400 xnode_ns_64k=200 xnode_ns_new=300\n\
         RESULT rep=2 path=rivora_dsr node_ns_64k=420 xnode_ns_64k=220 xnode_ns_new=320\n\
         RESULT rep=1 path=rivora_nat node_ns_64k=500 xnode_ns_64k=230 xnode_ns_new=nan\n\
         RESULT rep=2 path=rivora_nat node_ns_64k=520 xnode_ns_64k=250 xnode_ns_new=390\n\
         RESULT rep=1 path=rivora_l3dsr xnode_ns_64k=280\n",
    )
    .expect("runs");
    let results = dir.join("results.json");
    let out = Command::new("python3")
        .arg("scripts/lab-report.py")
        .arg(&runs)
        .args(["--paths", "rivora_nat rivora_dsr rivora_l3dsr"])
        .arg("--results")
        .arg(&results)
        .output()
        .expect("running python3 scripts/lab-report.py");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "lab-report failed: {table}");
    let got: BTreeMap<String, f64> =
        serde_json::from_str(&fs::read_to_string(&results).expect("results written"))
            .expect("results.json");
    assert_eq!(got.get("lab_xdpgen_ns_per_pkt_dsr"), Some(&210.0));
    assert_eq!(got.get("lab_xdpgen_ns_per_pkt_nat"), Some(&240.0));
    assert_eq!(got.get("lab_xdpgen_ns_per_pkt_l3dsr"), Some(&280.0));
    assert_eq!(got.get("lab_xdpgen_nat_over_dsr"), Some(&1.143));
    assert_eq!(got.get("lab_xdpgen_l3dsr_over_dsr"), Some(&1.333));
    assert_eq!(got.get("lab_xdpgen_newflow_ns_per_pkt_nat"), Some(&390.0));
    assert_eq!(got.get("lab_xdpgen_newflow_nat_over_dsr"), Some(&1.258));
    assert_eq!(got.get("lab_trafgen_nat_over_dsr"), Some(&1.244));
    assert!(
        !got.contains_key("lab_trafgen_l3dsr_over_dsr"),
        "no trafgen L3 DSR figure was given"
    );
    assert!(
        table.contains("xdpgen  l3dsr_over_dsr         1.33 (target <= 1.15: NOT met)"),
        "{table}"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Full NAT's lab key: per generator, the node's ns per packet with 64k
/// flows on rivora_fullnat over rivora_nat's, beside its own ns keys.
#[test]
fn fullnat_over_nat_keys() {
    let dir = scratch("fullnat");
    let runs = dir.join("runs.txt");
    fs::write(
        &runs,
        "RESULT rep=1 path=rivora_nat pps_64k=500 node_ns_64k=2000 xnode_ns_64k=700 xnode_ns_new=1700\n\
         RESULT rep=2 path=rivora_nat pps_64k=520 node_ns_64k=2200 xnode_ns_64k=720 xnode_ns_new=1800\n\
         RESULT rep=1 path=rivora_fullnat pps_64k=480 node_ns_64k=2300 xnode_ns_64k=800 xnode_ns_new=2500\n\
         RESULT rep=2 path=rivora_fullnat pps_64k=470 node_ns_64k=2500 xnode_ns_64k=900 xnode_ns_new=nan\n",
    )
    .expect("runs");
    let results = dir.join("results.json");
    let chart = dir.join("lab.svg");
    let out = Command::new("python3")
        .arg("scripts/lab-report.py")
        .arg(&runs)
        .args(["--paths", "rivora_nat rivora_fullnat"])
        .arg("--results")
        .arg(&results)
        .arg("--chart")
        .arg(&chart)
        .output()
        .expect("running python3 scripts/lab-report.py");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "lab-report failed: {table}");
    let got: BTreeMap<String, f64> =
        serde_json::from_str(&fs::read_to_string(&results).expect("results written"))
            .expect("results.json");
    assert_eq!(got.get("lab_node_ns_pkt_64k_rivora_fullnat"), Some(&2400.0));
    assert_eq!(got.get("lab_trafgen_ns_per_pkt_fullnat"), Some(&2400.0));
    assert_eq!(got.get("lab_xdpgen_ns_per_pkt_fullnat"), Some(&850.0));
    assert_eq!(
        got.get("lab_xdpgen_newflow_ns_per_pkt_fullnat"),
        Some(&2500.0)
    );
    // 2400 / 2100 and 850 / 710.
    assert_eq!(got.get("lab_trafgen_fullnat_over_nat"), Some(&1.143));
    assert_eq!(got.get("lab_xdpgen_fullnat_over_nat"), Some(&1.197));
    assert!(
        table.contains("trafgen fullnat_over_nat       1.14 (target <= 1.15: met)"),
        "{table}"
    );
    assert!(
        table.contains("xdpgen  fullnat_over_nat       1.20 (target <= 1.15: NOT met)"),
        "{table}"
    );
    let svg = fs::read_to_string(&chart).expect("chart written");
    assert!(
        svg.contains(">rivora_fullnat<") && svg.contains("#ff7f0e"),
        "full NAT's bar, in its own colour: {svg}"
    );
    let _ = fs::remove_dir_all(&dir);
}
