//! A SYN flood from many spoofed sources at a NAT VIP with its own SYN
//! limit, while established connections carry echoed messages: the
//! limiter drops the flood and the connections lose nothing. The bench
//! area `synflood` (bench/src/bin/rivora-bench/synflood.rs) run small: the real
//! rivorad in namespaces, its figures read back.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::require;

#[test]
fn established_connections_lose_nothing_under_a_syn_flood() {
    require::root_and_tools("e2e_synflood");
    let out = tempfile::tempdir().expect("a temp dir");
    let run = Command::new(common::rivorad::bins::rivora_bench())
        .arg("synflood")
        .env("RIVORA_BENCH_OUT", out.path())
        .env("RIVORA_SYNFLOOD_SECS", "2")
        .env("RIVORA_SYNFLOOD_CONNS", "4")
        .output()
        .expect("running rivora-bench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.status.success(),
        "rivora-bench synflood failed:\n{text}"
    );
    let json = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let r: BTreeMap<String, f64> = serde_json::from_str(&json).expect("results as JSON");
    let get = |k: &str| {
        *r.get(k)
            .unwrap_or_else(|| panic!("no {k} in the results:\n{text}"))
    };
    assert_eq!(
        get("synflood_established_loss_pct"),
        0.0,
        "established connections lost messages:\n{text}"
    );
    // The flood must have been one: at least a few thousand SYNs a second,
    // most of them dropped by the limiter (10/s and a burst of 20 per
    // source, 256 sources: about 10,000 in two seconds may pass).
    let pps = get("synflood_flood_pps");
    assert!(
        pps > 5_000.0,
        "a flood of {pps:.0} SYN/s is no flood:\n{text}"
    );
    let limited = get("synflood_rate_limited");
    assert!(
        limited > pps * 2.0 * 0.5,
        "only {limited} SYNs rate_limited of about {:.0}:\n{text}",
        pps * 2.0
    );
}
