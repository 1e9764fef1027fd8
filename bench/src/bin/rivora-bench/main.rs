//! `make bench`: measures, prints a table, writes target/bench/results.json
//! (one flat object of "metric_key": number). Each area adds its keys in its
//! own module.

mod bgp;
mod controller;
mod daemon;
mod health;
mod k8s;
mod l2;
mod labxdp;
mod maglev;
mod restart;
mod synflood;
mod writer;
mod xdp;
mod xdpgen;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};

/// Metric key to value, printed and written in key order.
#[derive(Default)]
pub struct Results {
    values: BTreeMap<String, f64>,
    notes: Vec<String>,
}

impl Results {
    pub fn set(&mut self, key: &str, value: f64) {
        println!("  {key:<40} {value:>12.3}");
        self.values.insert(key.to_string(), value);
    }

    /// A line printed with the table (not in the JSON): what a figure means.
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }
}

/// Median of a non-empty sample.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Send `sig` to a child of ours. Best effort, as kill(2) was before: a
/// child that has already exited is reaped by the caller's wait.
pub fn signal_child(child: &std::process::Child, sig: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// Where results.json (and what an area keeps beside it) goes.
/// RIVORA_BENCH_OUT: somewhere else than target/bench (the e2e test that
/// runs an area small must not touch the real figures).
pub fn out_dir() -> PathBuf {
    std::env::var_os("RIVORA_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/bench"))
}

fn main() -> Result<()> {
    // The health bench re-executes this binary as its backend servers, so
    // that the servers' CPU is not charged to the checker.
    if std::env::var_os(health::SERVER_ENV).is_some() {
        return health::serve_child();
    }
    let only: Vec<String> = std::env::args().skip(1).collect();
    if only.first().map(String::as_str) == Some("lab-xdp") {
        return labxdp::run(&only[1..]);
    }
    if only.first().map(String::as_str) == Some("xdpgen") {
        return xdpgen::run(&only[1..]);
    }
    let want = |area: &str| only.is_empty() || only.iter().any(|a| a == area);
    let out_dir = out_dir();
    fs::create_dir_all(&out_dir).context("creating target/bench")?;
    let path = out_dir.join("results.json");
    // Areas run one by one; keys from an earlier run of an area not run now
    // are kept, so `rivora-bench xdp` refreshes only its own figures.
    let mut results = Results::default();
    if let Ok(old) = fs::read_to_string(&path) {
        if let Ok(map) = serde_json::from_str::<BTreeMap<String, f64>>(&old) {
            results.values = map;
        }
    }

    if want("xdp") {
        println!("xdp_ingress / tc_nat per-packet cost (BPF_PROG_TEST_RUN)");
        xdp::run(&mut results).context("xdp bench")?;
    }
    if want("maglev") {
        println!("Maglev population and slice sizes");
        maglev::run(&mut results).context("maglev bench")?;
    }
    if want("writer") {
        println!("map writer and Maglev");
        writer::run(&mut results).context("writer bench")?;
    }
    if want("health") {
        println!("health checker");
        health::run(&mut results).context("health bench")?;
    }
    if want("daemon") {
        println!("rivorad at full scale");
        daemon::run(&mut results).context("daemon bench")?;
    }

    if want("restart") {
        println!("restarts: hot swap and adoption (real rivorad in namespaces)");
        restart::run(&mut results).context("restart bench")?;
    }

    if want("synflood") {
        println!("SYN flood at a VIP beside established connections (real rivorad in namespaces)");
        synflood::run(&mut results).context("synflood bench")?;
    }

    if want("k8s") {
        println!("rivorad -kubernetes: 1,000 Services against a real API server (real rivorad in a namespace)");
        k8s::run(&mut results).context("k8s bench")?;
    }

    if want("l2") {
        println!("the L2 speaker: three rivorad -kubernetes, failovers and forced handovers under a 10 ms ping");
        l2::run(&mut results).context("l2 bench")?;
    }

    if want("controller") {
        println!("rivora-controller: 1,000 Services and leader failover against a real API server");
        controller::run(&mut results).context("controller bench")?;
    }

    if want("bgp") {
        println!(
            "BGP: withdraw, graceful restart and BFD against FRR (real rivorad in namespaces)"
        );
        bgp::run(&mut results).context("bgp bench")?;
    }

    for n in &results.notes {
        println!("{n}");
    }
    let json = serde_json::to_string_pretty(&results.values).context("encoding results")?;
    fs::write(&path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
