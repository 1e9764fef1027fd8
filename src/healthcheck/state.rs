//! Rise/fall counting: the pure part of health checking, with no I/O, so
//! every edge can be tested without sockets or clocks.

use serde::{Deserialize, Serialize};

/// A backend's health as the checker reports it. Draining is not here: it
/// is an operator's or Kubernetes' decision, merged with this by the
/// dataplane (where a down verdict wins over a drain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthState {
    Healthy,
    Down,
}

/// Consecutive-result counter with hysteresis: a healthy backend goes down
/// after `fall` failures in a row, a down one comes back after `rise`
/// successes in a row. A result that agrees with the current state resets
/// the opposite streak, so one lucky probe of a flapping backend does not
/// accumulate towards `rise` across failures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RiseFall {
    state: HealthState,
    rise: u32,
    fall: u32,
    /// Consecutive results against the current state.
    streak: u32,
}

impl RiseFall {
    /// `rise` and `fall` below 1 are treated as 1 (validation rejects them
    /// before they get here; this keeps the type total anyway).
    pub fn new(initial: HealthState, rise: u32, fall: u32) -> Self {
        Self {
            state: initial,
            rise: rise.max(1),
            fall: fall.max(1),
            streak: 0,
        }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    /// Consecutive results so far that contradict the current state.
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// Feeds one probe result; returns the new state if it changed.
    pub fn observe(&mut self, success: bool) -> Option<HealthState> {
        let (against, needed, next) = match self.state {
            HealthState::Healthy => (!success, self.fall, HealthState::Down),
            HealthState::Down => (success, self.rise, HealthState::Healthy),
        };
        if !against {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak < needed {
            return None;
        }
        self.state = next;
        self.streak = 0;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::HealthState::{Down, Healthy};
    use super::*;

    /// Feeds a sequence ('+' success, '-' failure); returns the state after
    /// each step and where transitions happened.
    fn run(sm: &mut RiseFall, seq: &str) -> Vec<(usize, HealthState)> {
        seq.chars()
            .enumerate()
            .filter_map(|(i, c)| sm.observe(c == '+').map(|s| (i, s)))
            .collect()
    }

    #[test]
    fn healthy_goes_down_after_fall_consecutive_failures() {
        let mut sm = RiseFall::new(Healthy, 2, 3);
        assert_eq!(run(&mut sm, "--"), vec![]);
        assert_eq!(sm.streak(), 2);
        assert_eq!(run(&mut sm, "-"), vec![(0, Down)]);
        assert_eq!(sm.state(), Down);
        assert_eq!(sm.streak(), 0);
    }

    #[test]
    fn a_success_resets_the_failure_streak() {
        let mut sm = RiseFall::new(Healthy, 2, 3);
        assert_eq!(run(&mut sm, "--+--+--+"), vec![]);
        assert_eq!(sm.state(), Healthy);
        assert_eq!(run(&mut sm, "---"), vec![(2, Down)]);
    }

    #[test]
    fn down_comes_back_after_rise_consecutive_successes() {
        let mut sm = RiseFall::new(Down, 2, 3);
        assert_eq!(run(&mut sm, "+-+-+-"), vec![], "alternating never rises");
        assert_eq!(run(&mut sm, "++"), vec![(1, Healthy)]);
        assert_eq!(sm.state(), Healthy);
    }

    #[test]
    fn full_cycle_reports_each_change_once() {
        let mut sm = RiseFall::new(Healthy, 2, 2);
        assert_eq!(run(&mut sm, "++--"), vec![(3, Down)]);
        assert_eq!(run(&mut sm, "---++++"), vec![(4, Healthy)]);
        assert_eq!(run(&mut sm, "--"), vec![(1, Down)]);
    }

    #[test]
    fn rise_and_fall_of_one_flip_immediately() {
        let mut sm = RiseFall::new(Healthy, 1, 1);
        assert_eq!(
            run(&mut sm, "-+-+"),
            vec![(0, Down), (1, Healthy), (2, Down), (3, Healthy)]
        );
    }

    #[test]
    fn zero_thresholds_are_clamped_to_one() {
        let mut sm = RiseFall::new(Healthy, 0, 0);
        assert_eq!(sm.observe(false), Some(Down));
        assert_eq!(sm.observe(true), Some(Healthy));
    }

    #[test]
    fn results_agreeing_with_the_state_change_nothing() {
        let mut sm = RiseFall::new(Down, 3, 3);
        assert_eq!(run(&mut sm, &"-".repeat(100)), vec![]);
        assert_eq!(sm.state(), Down);
        let mut sm = RiseFall::new(Healthy, 3, 3);
        assert_eq!(run(&mut sm, &"+".repeat(100)), vec![]);
        assert_eq!(sm.state(), Healthy);
    }
}
