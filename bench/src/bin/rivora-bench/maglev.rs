//! Maglev figures: build time, balance, weight precision and
//! disruption of the population rivorad uses, and the candidates it was
//! chosen against, at the slice sizes rivorad gives a VIP when the table
//! has room (`maglev::slice_need(..).want`). Pure computation, no maps.
//!
//! - `maglev_build_ms_n1000`: populating 65,537 slots for 1,000 equal
//!   backends (the paper's figure; rivorad's largest slice is 24,576,
//!   `maglev_build_ms_n1000_slice`). Median of 21, taken in turns with
//!   the paper's population (noted alongside) so load hits both alike.
//! - `maglev_imbalance_n{10,100,1000}`: the largest slots-per-weight over
//!   the mean (1.0 is perfect).
//! - `maglev_weight_error_max`: over fixed weight profiles (1:99, 1:2:7,
//!   5/95/100/100/100/100, 1:999, ...), each at the size its weights need
//!   and at the size it wants, the largest share error in the precision
//!   rule's terms: |slot share - weight share| / weight share (/ 1 % for
//!   shares under 1 %). Target at most 0.05.
//! - `maglev_disruption_n{10,100}`: removing each backend in turn, the
//!   mean share of slots whose backend changes, over the optimum (the
//!   removed backend's share); `_paper`: the paper's population, same
//!   sizes.

use std::time::Instant;

use anyhow::Result;

use rivora::maglev::{self, Entry};

use crate::{median, Results};

fn identities(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut v = vec![4u8, 10, 1, (i >> 8) as u8, i as u8];
            v.extend_from_slice(&8080u16.to_be_bytes());
            v
        })
        .collect()
}

fn entries<'a>(ids: &'a [Vec<u8>], weights: &[u32]) -> Vec<Entry<'a>> {
    ids.iter()
        .zip(weights)
        .enumerate()
        .map(|(i, (id, w))| Entry {
            identity: id,
            weight: *w,
            id: i as u32 + 1,
        })
        .collect()
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

type Populate = fn(&[Entry<'_>], u32) -> Vec<u32>;

/// Mean and worst, over removing each backend of `gone`, of the share of
/// slots that move over the removed backend's share.
fn disruption(e: &[Entry<'_>], size: u32, gone: &[usize], f: Populate) -> (f64, f64) {
    let before = f(e, size);
    let total: f64 = e.iter().map(|x| f64::from(x.weight)).sum();
    let ratios: Vec<f64> = gone
        .iter()
        .map(|g| {
            let rest: Vec<Entry<'_>> = e
                .iter()
                .enumerate()
                .filter(|(i, _)| i != g)
                .map(|(_, x)| *x)
                .collect();
            let after = f(&rest, size);
            maglev::moved_share(&before, &after) / (f64::from(e[*g].weight) / total)
        })
        .collect();
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    (mean, ratios.iter().copied().fold(0.0, f64::max))
}

/// The candidate the issue suggested: quota-constrained assignment by
/// per-slot preference. Every (slot, backend) pair gets a rendezvous
/// score; pairs are taken best first, a slot going to the first backend
/// still under its exact quota (floor or ceiling of its share). Stable
/// matching; slow (sorts slots x backends pairs), so only compared here.
fn per_slot_preference(e: &[Entry<'_>], size: u32) -> Vec<u32> {
    let m = size as usize;
    let total: u64 = e.iter().map(|x| u64::from(x.weight)).sum();
    let mut quota: Vec<u32> = Vec::with_capacity(e.len());
    let mut rem: Vec<(std::cmp::Reverse<u64>, u64, usize)> = Vec::new();
    let mut given = 0u64;
    let hashes: Vec<u64> = e.iter().map(|x| maglev::hash64(7, x.identity)).collect();
    for (i, x) in e.iter().enumerate() {
        let exact = u64::from(size) * u64::from(x.weight);
        quota.push((exact / total) as u32);
        given += exact / total;
        rem.push((std::cmp::Reverse(exact % total), hashes[i], i));
    }
    rem.sort_unstable();
    for (_, _, i) in rem.into_iter().take((u64::from(size) - given) as usize) {
        quota[i] += 1;
    }
    let mut pairs: Vec<(f64, u32, u32)> = Vec::with_capacity(m * e.len());
    for s in 0..m {
        for (i, x) in e.iter().enumerate() {
            let h = maglev::hash64(s as u64, &hashes[i].to_le_bytes());
            let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            pairs.push((f64::from(x.weight) / -u.ln(), s as u32, i as u32));
        }
    }
    pairs.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    let mut table = vec![0u32; m];
    let mut count = vec![0u32; e.len()];
    for (_, s, i) in pairs {
        let (s, i) = (s as usize, i as usize);
        if table[s] == 0 && count[i] < quota[i] {
            table[s] = e[i].id;
            count[i] += 1;
        }
    }
    table
}

/// The weight profiles `maglev_weight_error_max` covers.
fn profiles() -> Vec<(&'static str, Vec<u32>)> {
    vec![
        ("1:99", vec![1, 99]),
        ("1:2:7", vec![1, 2, 7]),
        ("5/95/100/100/100/100", vec![5, 95, 100, 100, 100, 100]),
        ("1:999", vec![1, 999]),
        ("1:3", vec![1, 3]),
        (
            "1000 + 9 x 1",
            std::iter::once(1000).chain([1; 9]).collect(),
        ),
        (
            "100000 + 99 x 1",
            std::iter::once(100_000).chain([1; 99]).collect(),
        ),
        ("1..10", (1..=10).collect()),
        ("10 x 1", vec![1; 10]),
        ("100 x 1", vec![1; 100]),
        ("1000 x 1", vec![1; 1000]),
    ]
}

/// Builds timed per population for `maglev_build_ms_n1000`.
const BUILD_SAMPLES: usize = 21;

pub fn run(results: &mut Results) -> Result<()> {
    let ids = identities(1000);
    let equal = vec![1u32; 1000];
    let e = entries(&ids, &equal);
    // The three builds take turns, so load on a shared machine falls on
    // each alike; medians of the turns.
    let (mut full, mut slice, mut paper) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..BUILD_SAMPLES {
        let t = Instant::now();
        std::hint::black_box(maglev::populate(&e, 65_537));
        full.push(ms(t));
        let t = Instant::now();
        std::hint::black_box(maglev::populate_paper(&e, 65_537));
        paper.push(ms(t));
        let t = Instant::now();
        std::hint::black_box(maglev::populate(&e, maglev::MAX_SLICE));
        slice.push(ms(t));
    }
    results.set("maglev_build_ms_n1000", median(full));
    results.set("maglev_build_ms_n1000_slice", median(slice));
    let samples = paper;
    results.note(format!(
        "maglev_build_ms_n1000: 65,537 slots (the paper's population: {:.2} ms); _slice: {} slots, rivorad's largest",
        median(samples),
        maglev::MAX_SLICE
    ));

    for n in [10usize, 100, 1000] {
        let e = entries(&ids[..n], &equal[..n]);
        let size = maglev::slice_need(&equal[..n]).want;
        let table = maglev::populate(&e, size);
        results.set(
            &format!("maglev_imbalance_n{n}"),
            maglev::imbalance(&e, &table),
        );
    }

    let mut worst = (0.0f64, String::new());
    for (name, w) in profiles() {
        let e = entries(&ids[..w.len()], &w);
        let need = maglev::slice_need(&w);
        for size in [need.need, need.want] {
            let err = maglev::share_error(&e, &maglev::populate(&e, size));
            if err >= worst.0 {
                worst = (err, format!("{name} at {size} slots"));
            }
        }
    }
    results.set("maglev_weight_error_max", worst.0);
    results.note(format!(
        "maglev_weight_error_max: worst is {} (target <= 0.05)",
        worst.1
    ));

    for n in [10usize, 100] {
        let e = entries(&ids[..n], &equal[..n]);
        let size = maglev::slice_need(&equal[..n]).want;
        let all: Vec<usize> = (0..n).collect();
        let (mean, max) = disruption(&e, size, &all, maglev::populate);
        results.set(&format!("maglev_disruption_n{n}"), mean);
        let (paper, _) = disruption(&e, size, &all, maglev::populate_paper);
        results.set(&format!("maglev_disruption_n{n}_paper"), paper);
        results.note(format!(
            "maglev_disruption_n{n}: mean over removing each of {n} backends (worst {max:.2}x), {size}-slot slice; the paper's population: {paper:.2}x"
        ));
    }

    // The candidates at every rung from the size 100 equal backends need
    // to the size they want (and 10 backends at theirs): docs/datapath.md's
    // table. Per-slot preference is slow: 10 removals each.
    for n in [10usize, 100] {
        let e = entries(&ids[..n], &equal[..n]);
        let need = maglev::slice_need(&equal[..n]);
        let some: Vec<usize> = (0..n).step_by((n / 10).max(1)).collect();
        for size in maglev::ladder().filter(|r| *r >= need.need && *r <= need.want) {
            let (ours, _) = disruption(&e, size, &some, maglev::populate);
            let (paper, _) = disruption(&e, size, &some, maglev::populate_paper);
            let (pref, _) = disruption(&e, size, &some, per_slot_preference);
            let imb = maglev::imbalance(&e, &maglev::populate(&e, size));
            results.note(format!(
                "  n={n:>3} {size:>6} slots ({:>6.1}/backend): single tries {ours:.2}x (imbalance {imb:.3}), paper {paper:.2}x, per-slot preference {pref:.2}x",
                f64::from(size) / n as f64
            ));
        }
    }
    Ok(())
}
