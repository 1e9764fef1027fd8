//! The safety argument of the election, tested with the election's own
//! functions ([`decide`], [`Observed::update`], [`Record::of`] of a Lease
//! as [`spec_for`] and [`annotate`] write it, [`fence_after`]):
//!
//! - for every legal setting on a grid (milliseconds and seconds
//!   precision), the holder's quiet deadline comes before the first
//!   instant another replica may take the Lease over, by the margin, even
//!   when the other reads the renewal the instant it was sent;
//! - in simulated runs with random request and watch delays, lost and
//!   timed-out writes and a holder that dies, the replica that takes over
//!   never acts before the old holder's last fence plus the margin, and
//!   it does take over once the holder has died.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ObjectMeta;
use proptest::prelude::*;
use rivora_model::lease::{Precision, MIN_MARGIN};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn settings(d: Duration, rd: Duration, rp: Duration, precise: bool) -> LeaseSettings {
    LeaseSettings {
        duration: d,
        renew_deadline: rd,
        retry_period: rp,
        precise,
        ..LeaseSettings::new("ns", "rivora-l2-pool", "holder")
    }
}

/// The Lease exactly as the holder's write leaves it (what a reader
/// then sees), at version `rv`.
fn written(s: &LeaseSettings, rv: u64) -> Lease {
    let mut metadata = ObjectMeta {
        name: Some(s.name.clone()),
        resource_version: Some(rv.to_string()),
        ..Default::default()
    };
    annotate(s, &mut metadata);
    Lease {
        metadata,
        spec: Some(spec_for(s, true, 0)),
    }
}

/// Every legal setting on a grid: milliseconds precision in 50 ms steps
/// up to a 3 s duration, seconds precision in 500 ms steps up to 20 s,
/// plus the defaults and the longest duration.
fn legal_grid() -> Vec<LeaseSettings> {
    let mut out = Vec::new();
    for d in (150..=3_000).step_by(50) {
        for rd in (50..d).step_by(50) {
            for rp in (50..rd).step_by(50) {
                out.push(settings(ms(d), ms(rd), ms(rp), true));
            }
        }
    }
    for d in (1_000..=20_000).step_by(1_000) {
        for rd in (500..d).step_by(500) {
            for rp in (500..rd).step_by(500) {
                out.push(settings(ms(d), ms(rd), ms(rp), false));
            }
        }
    }
    let l2 = rivora_model::lease::LeaseTimings::L2;
    out.push(settings(
        l2.duration,
        l2.renew_deadline,
        l2.retry_period,
        true,
    ));
    out.push(settings(ms(15_000), ms(10_000), ms(2_000), false));
    out.push(settings(
        Duration::from_secs(3_600),
        Duration::from_secs(3_599),
        Duration::from_secs(1),
        true,
    ));
    out.retain(|s| s.check().is_ok());
    out
}

#[test]
fn for_every_legal_setting_the_holder_is_quiet_before_anyone_may_take_over() {
    let grid = legal_grid();
    assert!(
        grid.len() > 20_000,
        "the grid holds {} settings",
        grid.len()
    );
    let t0 = Instant::now();
    for s in &grid {
        // The worst case for safety: the renewal is written and read the
        // instant it is sent.
        let sent = t0;
        let fence = fence_after(sent, s.renew_deadline);
        let lease = written(s, 7);
        let record = Record::of(&lease);
        assert_eq!(
            record.duration,
            s.duration,
            "{:?}: a reader waits the holder's own duration",
            s.timings()
        );
        // A client-go reader of the seconds alone waits at least as long.
        let secs = lease.spec.as_ref().and_then(|l| l.lease_duration_seconds);
        assert!(
            Duration::from_secs(secs.unwrap_or(0) as u64) >= s.duration,
            "{:?}: leaseDurationSeconds {secs:?}",
            s.timings()
        );
        let seen = Observed::update(None, record, sent);
        // Until the fence, and a margin past it, the other only waits.
        match decide("other", Some(&seen), fence) {
            Step::Wait(expires) => {
                let gap = expires - fence;
                assert_eq!(gap, s.timings().margin(), "{:?}", s.timings());
                assert!(gap > Duration::ZERO, "{:?}", s.timings());
                if s.precise {
                    assert!(gap >= MIN_MARGIN, "{:?}", s.timings());
                }
                assert_eq!(
                    decide("other", Some(&seen), expires - Duration::from_nanos(1)),
                    Step::Wait(expires)
                );
                assert_eq!(decide("other", Some(&seen), expires), Step::Acquire);
            }
            other => panic!("{:?}: {other:?} at the holder's fence", s.timings()),
        }
    }
}

#[test]
fn illegal_settings_are_refused_before_an_election_runs() {
    // The rules the argument needs, each refused: a deadline at or past
    // the duration (no margin), and in milliseconds a margin under the
    // floor.
    for s in [
        settings(ms(800), ms(800), ms(200), true),
        settings(ms(800), ms(900), ms(200), true),
        settings(ms(800), ms(750), ms(200), true),
        settings(ms(2_000), ms(2_000), ms(500), false),
    ] {
        assert!(s.check().is_err(), "{:?} accepted", s.timings());
    }
    assert_eq!(
        settings(ms(800), ms(500), ms(200), false).precision(),
        Precision::Seconds
    );
    assert!(settings(ms(800), ms(500), ms(200), false).check().is_err());
}

#[test]
fn a_lease_written_by_a_seconds_holder_reads_in_seconds() {
    let s = settings(ms(15_000), ms(10_000), ms(2_000), false);
    let mut lease = written(&s, 1);
    // A precise holder's annotation left on the object by the previous
    // holder is removed by this one's write.
    lease
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(DURATION_MS_ANNOTATION.into(), "800".into());
    annotate(&s, &mut lease.metadata);
    assert_eq!(Record::of(&lease).duration, ms(15_000));
    // Nonsense in the annotation falls back to the seconds.
    for bad in ["", "0", "-5", "soon"] {
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(DURATION_MS_ANNOTATION.into(), bad.into());
        assert_eq!(Record::of(&lease).duration, ms(15_000), "{bad:?}");
    }
    assert_eq!(duration_seconds(ms(800)), 1);
    assert_eq!(duration_seconds(ms(1_000)), 1);
    assert_eq!(duration_seconds(ms(1_001)), 2);
}

// ---------------------------------------------------------------------
// Simulated runs
// ---------------------------------------------------------------------

/// One write of the holder: lost (never applied), or applied after
/// `apply` ms and answered `answer` ms later.
#[derive(Debug, Clone)]
struct Write {
    lost: bool,
    apply: u64,
    answer: u64,
}

#[derive(Debug, Clone)]
struct Run {
    s: LeaseSettings,
    holder: Vec<Write>,
    /// The holder dies after this many writes.
    dies_after: usize,
    /// How late the observer's feed shows each version, ms.
    watch_delay: Vec<u64>,
    /// The observer's own writes: applied after, answered after, ms.
    takeover: (u64, u64),
}

/// A version on the simulated API server.
#[derive(Debug, Clone, Copy)]
struct Version {
    rv: u64,
    holder_is_a: bool,
}

/// What happened: the holder's last fence, when the observer sent its
/// successful takeover, and when the server last applied a holder write.
#[derive(Debug)]
struct Outcome {
    a_last_fence: Option<u64>,
    b_took_over_at: Option<u64>,
    a_last_write_applied: Option<u64>,
}

/// A holder write in flight: sent, applied (unless lost), answered.
#[derive(Debug, Clone, Copy)]
struct Flight {
    send: u64,
    apply: u64,
    answer: u64,
    lost: bool,
    /// Set when applied: the version it made.
    made: Option<u64>,
}

/// Millisecond by millisecond: the holder's writes (each conditioned on
/// the version it knows it wrote last), the observer's looks (woken by
/// its feed, which shows each version late, and by its timer), both
/// against one server.
fn simulate(run: &Run) -> Outcome {
    let s = &run.s;
    let rd = s.renew_deadline.as_millis() as u64;
    let rp = s.retry_period.as_millis() as u64;
    let timeout = if s.precise { rd } else { rp };
    let t0 = Instant::now();
    let at = |t: u64| t0 + ms(t);

    // The holder sends a write a retry period after the previous one was
    // sent, or when its answer came (or timed out), whichever is later.
    let mut flights: Vec<Flight> = Vec::new();
    let mut t = 0u64;
    for w in run.holder.iter().take(run.dies_after) {
        flights.push(Flight {
            send: t,
            apply: t + w.apply,
            answer: t + w.apply + w.answer,
            lost: w.lost,
            made: None,
        });
        let answered = if w.lost {
            t + timeout
        } else {
            (t + w.apply + w.answer).min(t + timeout)
        };
        t = (t + rp).max(answered);
    }

    let mut versions: Vec<Version> = Vec::new();
    // When the observer's feed shows each version.
    let mut shown_at: Vec<u64> = Vec::new();
    let mut a_rv: Option<u64> = None;
    let mut a_fence: Option<u64> = None;
    let mut a_last_write_applied = None;
    let mut seen: Option<Observed> = None;
    let mut next_look = 0u64;
    let mut fresh_read = false;
    // The observer's takeover in flight: (sent, applies at, version judged).
    let mut b_write: Option<(u64, u64, u64)> = None;
    let mut b_took_over_at = None;
    let horizon = t + 4 * s.duration.as_millis() as u64 + 10_000;
    for now in 0..=horizon {
        // The holder's writes that land now, in the order sent.
        for f in flights.iter_mut().filter(|f| f.apply == now && !f.lost) {
            let current = versions.last().copied();
            let ok = match (current, a_rv) {
                (None, None) => true,
                (Some(c), Some(mine)) => c.rv == mine && c.holder_is_a,
                _ => false,
            };
            if ok {
                let rv = current.map_or(1, |c| c.rv + 1);
                versions.push(Version {
                    rv,
                    holder_is_a: true,
                });
                let delay = run.watch_delay[versions.len() % run.watch_delay.len()];
                let shown = (now + delay).max(shown_at.last().copied().unwrap_or(0));
                shown_at.push(shown);
                f.made = Some(rv);
                a_last_write_applied = Some(now);
            }
        }
        // Then the observer's, conditioned on the version it judged.
        if let Some((sent, apply, judged)) = b_write {
            if apply <= now {
                b_write = None;
                let current = versions.last().copied();
                if current.is_some_and(|c| c.rv == judged) {
                    b_took_over_at = Some(sent);
                    break;
                }
                fresh_read = true;
                next_look = now + run.takeover.1;
            }
        }
        // The holder's answers: a confirmed write moves the fence from
        // when it was sent; a refused or timed-out one makes it read the
        // server again (and go on from there if it still holds).
        for f in flights.iter().filter(|f| {
            let answered = if f.lost {
                f.send + timeout
            } else {
                f.answer.min(f.send + timeout)
            };
            answered == now
        }) {
            let confirmed = !f.lost && f.answer - f.send <= timeout;
            match (confirmed, f.made) {
                (true, Some(rv)) => {
                    a_rv = Some(rv);
                    let fence = fence_after(at(f.send), s.renew_deadline) - t0;
                    a_fence = Some(a_fence.unwrap_or(0).max(fence.as_millis() as u64));
                }
                _ => {
                    a_rv = versions.last().filter(|v| v.holder_is_a).map(|v| v.rv);
                }
            }
        }
        // The observer looks when its feed shows something new or its
        // timer fires (and not while its own write is in flight).
        if b_write.is_some() {
            continue;
        }
        let feed_changed = shown_at.contains(&now);
        if now < next_look && !feed_changed {
            continue;
        }
        let view = if fresh_read {
            fresh_read = false;
            versions.last().copied()
        } else {
            versions
                .iter()
                .zip(&shown_at)
                .rev()
                .find(|(_, shown)| **shown <= now)
                .map(|(v, _)| *v)
        };
        let Some(v) = view else {
            next_look = now + rp;
            continue;
        };
        let record = Record {
            holder: Some(if v.holder_is_a { "a" } else { "b" }.into()),
            duration: s.duration,
            transitions: 0,
            resource_version: Some(v.rv.to_string()),
        };
        seen = Some(Observed::update(seen.take(), record, at(now)));
        match decide("b", seen.as_ref(), at(now)) {
            Step::Wait(expires) => {
                let e = (expires - t0).as_millis() as u64;
                next_look = (now + rp).min(e.max(now + 1));
            }
            Step::Acquire => b_write = Some((now, now + run.takeover.0, v.rv)),
            other => panic!("the observer decided {other:?}"),
        }
    }
    Outcome {
        a_last_fence: a_fence,
        b_took_over_at,
        a_last_write_applied,
    }
}

fn run_strategy() -> impl Strategy<Value = Run> {
    (150u64..1_500, 0.0f64..1.0, 0.0f64..1.0)
        .prop_map(|(d, x, y)| {
            // A legal setting: margin of at least 100 ms, retry below the
            // deadline and at least 50 ms.
            let rd = 150 + ((d.saturating_sub(250)) as f64 * x) as u64;
            let rd = rd.min(d - 100).max(60);
            let rp = 50 + ((rd - 51) as f64 * y) as u64;
            settings(ms(d), ms(rd), ms(rp.min(rd - 1).max(50)), true)
        })
        .prop_filter("legal", |s| s.check().is_ok())
        .prop_flat_map(|s| {
            let rd = s.renew_deadline.as_millis() as u64;
            (
                Just(s),
                prop::collection::vec(
                    (prop::bool::weighted(0.15), 0..rd, 0..rd).prop_map(|(lost, apply, answer)| {
                        Write {
                            lost,
                            apply,
                            answer,
                        }
                    }),
                    1..25,
                ),
                1usize..25,
                prop::collection::vec(0u64..400, 1..8),
                (0u64..200, 0u64..200),
            )
        })
        .prop_map(|(s, holder, dies_after, watch_delay, takeover)| Run {
            s,
            holder,
            dies_after,
            watch_delay,
            takeover,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the delays, the observer takes over no earlier than the
    /// holder's last fence plus the margin; and once the holder has died
    /// it does take over.
    #[test]
    fn a_takeover_never_overlaps_the_holders_fence(run in run_strategy()) {
        let out = simulate(&run);
        let margin = run.s.timings().margin().as_millis() as u64;
        if let (Some(b), Some(fence)) = (out.b_took_over_at, out.a_last_fence) {
            prop_assert!(
                fence + margin <= b,
                "the holder acts until {fence} ms, the other from {b} ms (margin {margin} ms): {run:?} {out:?}"
            );
        }
        // (A holder whose every write was lost leaves nothing to take
        // over: the observer would create the Lease, not simulated here.)
        prop_assert!(
            out.b_took_over_at.is_some() || out.a_last_write_applied.is_none(),
            "nobody took over after the holder died: {run:?} {out:?}"
        );
        if let (Some(b), Some(last)) = (out.b_took_over_at, out.a_last_write_applied) {
            // From the holder's last write, within the duration plus the
            // feed's delay, a retry period and the observer's own write.
            let bound = last
                + run.s.duration.as_millis() as u64
                + 400
                + run.s.retry_period.as_millis() as u64
                + run.takeover.0
                + run.takeover.1
                + run.s.renew_deadline.as_millis() as u64;
            prop_assert!(b <= bound, "took over at {b} ms, bound {bound} ms: {run:?}");
        }
    }
}
