//! Map writer figures (issue: the map writer). Maglev's own are in
//! `maglev.rs`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use rivora::abi;
use rivora::dataplane::{Datapath, LoadOptions, Writer};
use rivora::model::{Affinity, Backend, DesiredState, Mode, Ports, Protocol, Vip};

use crate::{median, Results};

/// A temporary pin directory, removed on drop (also on error).
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = Datapath::unpin_all(&self.0);
    }
}

fn vip(addr: Ipv4Addr, backends: Vec<Backend>) -> Vip {
    Vip {
        addr: IpAddr::V4(addr),
        ports: Ports::One(80),
        proto: Protocol::Tcp,
        mode: Mode::Nat,
        affinity: Affinity::None,
        rate_limit: None,
        source_ranges: None,
        backends,
    }
}

fn backend(a: Ipv4Addr) -> Backend {
    Backend::new(IpAddr::V4(a), 8080)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

pub fn run(results: &mut Results) -> Result<()> {
    // Full scale in real maps: 4,096 VIPs of 2 backends (8,192).
    let pins = PinDir(PathBuf::from(format!(
        "/sys/fs/bpf/rivora-bench-writer-{}",
        std::process::id()
    )));
    let _dp = Datapath::load(&LoadOptions {
        pin_dir: pins.0.clone(),
        ..Default::default()
    })
    .context("loading the datapath (root and bpffs needed)")?;
    let n_vips = abi::MAX_VIPS;
    let desired = DesiredState {
        node: Default::default(),
        vips: (0..n_vips)
            .map(|i| {
                let hi = (i >> 8) as u8;
                let lo = i as u8;
                vip(
                    Ipv4Addr::new(10, 0, hi, lo),
                    vec![
                        backend(Ipv4Addr::new(10, 1, hi, lo)),
                        backend(Ipv4Addr::new(10, 2, hi, lo)),
                    ],
                )
            })
            .collect(),
    };
    let mut w = Writer::open_pinned(&pins.0).context("opening the writer")?;
    let t = Instant::now();
    let report = w.reconcile(&desired).context("full-scale reconcile")?;
    results.set("apply_full_scale_ms", ms(t));
    anyhow::ensure!(
        report.failed.is_empty() && report.created == n_vips as usize,
        "full scale: {} created, failed: {:?}",
        report.created,
        report.failed.first()
    );
    results.note(format!(
        "apply_full_scale_ms: {n_vips} VIPs x 2 backends (the ABI's maximum: ids start at 1), {} of 65,537 slots free after",
        w.free_slots()
    ));
    drop(w);

    let mut samples = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let w = Writer::open_pinned(&pins.0).context("adopting")?;
        samples.push(ms(t));
        anyhow::ensure!(
            w.vips().len() == n_vips as usize,
            "adopted {}",
            w.vips().len()
        );
    }
    results.set("adopt_full_scale_ms", median(samples));

    // One backend added to a VIP of 100 (on otherwise empty maps).
    let mut w = Writer::open_pinned(&pins.0)?;
    w.reconcile(&DesiredState::default())?;
    let hundred: Vec<Backend> = (0..100u8)
        .map(|i| backend(Ipv4Addr::new(10, 5, 0, i)))
        .collect();
    let base = vip(Ipv4Addr::new(10, 9, 0, 1), hundred.clone());
    let mut more = base.clone();
    more.backends.push(backend(Ipv4Addr::new(10, 5, 1, 0)));
    w.upsert_vip(&base)?;
    let mut samples = Vec::new();
    for _ in 0..15 {
        w.reclaim()?;
        let t = Instant::now();
        w.upsert_vip(&more)?;
        samples.push(ms(t));
        w.upsert_vip(&base)?;
    }
    results.set("update_one_backend_ms", median(samples));
    w.reconcile(&DesiredState::default())?;
    Ok(())
}
