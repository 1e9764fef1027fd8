//! The three durations of a Lease election and the rules between them,
//! said once: rivora-lease checks its settings with them, and the
//! configuration file checks the L2 speaker's (`node.l2.lease`) with the
//! same, so `rivorad -check` refuses what the election would.
//!
//! Why the rules make the election safe (rivora-lease's argument): the
//! holder answers only until `renew_deadline` has passed since it *sent*
//! the last renewal the API server confirmed; another replica takes over
//! only when the record it read has not changed for `duration` since it
//! first *read* it, which is after the renewal was sent. So the holder is
//! quiet at least `duration - renew_deadline` (the margin) before anyone
//! else can act, with no clocks compared.

use std::fmt;
use std::time::Duration;

/// How finely the durations are carried in the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// `leaseDurationSeconds` alone, as client-go writes it: whole
    /// seconds (rivora-controller's Lease, which other tools may read).
    Seconds,
    /// Whole milliseconds, carried in an annotation beside
    /// `leaseDurationSeconds` (rounded up, for humans): for Leases only
    /// rivorad contends for (the L2 speaker's), so failover can be under
    /// a second.
    Milliseconds,
}

/// The smallest margin (`duration - renew_deadline`) in millisecond
/// precision. The argument above holds for any positive margin; this one
/// covers what lies outside it: the moment between the holder's last
/// check of its deadline and its frame leaving the interface (a scheduler
/// preemption on a loaded node), and the drift between two monotonic
/// clocks over one lease duration (parts per million).
pub const MIN_MARGIN: Duration = Duration::from_millis(100);
/// The shortest retry period in millisecond precision: each renewal is a
/// write the API server fans out to every watcher.
pub const MIN_RETRY: Duration = Duration::from_millis(50);
/// The longest lease duration either way (an hour: a longer one is a
/// typo, and a failover that slow is no failover).
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// How long the others wait, from a renewal they saw, before they
    /// take the Lease over.
    pub duration: Duration,
    /// How long the holder keeps acting after it sent the last renewal
    /// that succeeded. Below the duration: the difference is the margin.
    pub renew_deadline: Duration,
    /// How often the holder renews and the others look.
    pub retry_period: Duration,
}

/// A broken rule: the sentence says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why} (lease duration {duration:?}, renew deadline {renew_deadline:?}, retry period {retry_period:?})")]
pub struct TimingError {
    pub why: String,
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseTimings {
    /// client-go's defaults (kube-controller-manager's `--leader-elect-*`):
    /// 15 s, 10 s, 2 s.
    pub const CLIENT_GO: LeaseTimings = LeaseTimings {
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    /// The L2 speaker's defaults: another node answers within about
    /// 0.8 s of the owner's death (less the part of a retry period since
    /// its last renewal), and the owner goes quiet 300 ms before that.
    /// Five renewals a second per Lease.
    pub const L2: LeaseTimings = LeaseTimings {
        duration: Duration::from_millis(800),
        renew_deadline: Duration::from_millis(500),
        retry_period: Duration::from_millis(200),
    };

    pub fn margin(&self) -> Duration {
        self.duration.saturating_sub(self.renew_deadline)
    }

    /// The rules, for a Lease carried at `precision`.
    pub fn check(&self, precision: Precision) -> Result<(), TimingError> {
        let bad = |why: &str| {
            Err(TimingError {
                why: why.to_string(),
                duration: self.duration,
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            })
        };
        let whole_ms = |d: Duration| d.subsec_nanos() % 1_000_000 == 0;
        match precision {
            Precision::Seconds => {
                if self.duration.as_secs() == 0 || self.duration.subsec_nanos() != 0 {
                    return bad("the lease duration must be whole seconds, at least 1s");
                }
            }
            Precision::Milliseconds => {
                if ![self.duration, self.renew_deadline, self.retry_period]
                    .into_iter()
                    .all(whole_ms)
                {
                    return bad("the lease timings must be whole milliseconds");
                }
            }
        }
        if self.duration > MAX_DURATION {
            return bad("the lease duration must be at most 1h");
        }
        if self.renew_deadline >= self.duration {
            return bad("the renew deadline must be below the lease duration");
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return bad("the retry period must be above zero and below the renew deadline");
        }
        if precision == Precision::Milliseconds {
            if self.margin() < MIN_MARGIN {
                return bad("the lease duration must exceed the renew deadline by at least 100ms");
            }
            if self.retry_period < MIN_RETRY {
                return bad("the retry period must be at least 50ms");
            }
        }
        Ok(())
    }
}

impl fmt::Display for LeaseTimings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "duration {:?}, renew deadline {:?}, retry period {:?}",
            self.duration, self.renew_deadline, self.retry_period
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(d: u64, rd: u64, rp: u64) -> LeaseTimings {
        LeaseTimings {
            duration: Duration::from_millis(d),
            renew_deadline: Duration::from_millis(rd),
            retry_period: Duration::from_millis(rp),
        }
    }

    #[test]
    fn the_defaults_are_legal() {
        LeaseTimings::CLIENT_GO.check(Precision::Seconds).unwrap();
        LeaseTimings::CLIENT_GO
            .check(Precision::Milliseconds)
            .unwrap();
        LeaseTimings::L2.check(Precision::Milliseconds).unwrap();
        // Not in whole seconds: only a Lease that carries milliseconds.
        let e = LeaseTimings::L2.check(Precision::Seconds).unwrap_err();
        assert!(e.to_string().contains("whole seconds"), "{e}");
    }

    #[test]
    fn each_rule_names_itself() {
        for (timings, precision, word) in [
            (t(4_000, 4_000, 1_000), Precision::Seconds, "renew deadline"),
            (t(4_000, 3_000, 3_000), Precision::Seconds, "retry period"),
            (t(4_000, 3_000, 0), Precision::Seconds, "retry period"),
            (t(0, 0, 0), Precision::Seconds, "whole seconds"),
            (t(4_500, 3_000, 1_000), Precision::Seconds, "whole seconds"),
            (t(800, 750, 200), Precision::Milliseconds, "at least 100ms"),
            (t(800, 500, 20), Precision::Milliseconds, "at least 50ms"),
            (t(800, 900, 200), Precision::Milliseconds, "renew deadline"),
            (
                t(3_600_001, 3_000_000, 1_000),
                Precision::Milliseconds,
                "at most 1h",
            ),
        ] {
            let e = timings.check(precision).unwrap_err().to_string();
            assert!(e.contains(word), "{timings}: {e}");
        }
        let sub_ms = LeaseTimings {
            duration: Duration::from_micros(800_500),
            ..LeaseTimings::L2
        };
        let e = sub_ms.check(Precision::Milliseconds).unwrap_err();
        assert!(e.to_string().contains("whole milliseconds"), "{e}");
    }
}
