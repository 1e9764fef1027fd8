//! Active health checks: TCP connect and HTTP GET probes of backends, with
//! rise/fall hysteresis, reported as health changes.
//!
//! - [`spec`] (`rivora_model::health`, re-exported): the configuration
//!   ([`HealthCheckSpec`], per-backend [`HealthCheckOverride`],
//!   [`resolve`]) and its validation.
//! - [`state`]: the rise/fall state machine ([`RiseFall`]), pure.
//! - [`probe`]: one probe ([`Prober`]).
//! - [`checker`]: [`HealthChecker`], one tokio task per target on a
//!   runtime the caller owns, a diffing [`HealthChecker::set_targets`], and
//!   [`HealthEvent`]s on an mpsc channel. The dataplane's reconciler owns
//!   the checker and turns events into `backend_health_map` writes.
//!   Each target is probed at a fixed phase of its interval, derived from
//!   its key and rounded to [`PROBE_SLOT`]: spread over the interval, yet
//!   batched into shared timer wakeups (most of the checker's CPU at scale
//!   is wakeups, not probes).
//!
//! # Initial state: healthy
//!
//! A target new to the checker is `Healthy` until `fall` consecutive probes
//! fail (unless the caller passes another [`ProbeTarget::initial`]). The
//! alternative, starting down (or unknown and excluded) until `rise`
//! probes pass, would make every config apply, every new VIP and every
//! daemon restart drop all of a VIP's traffic for `rise x interval` (4 s
//! with the defaults), which is the outage the health checker exists to
//! prevent. The cost of the optimistic choice is bounded: a backend that
//! is dead when added gets new flows for at most `fall x interval +
//! timeout`, the same window as a backend that dies later. Kubernetes
//! endpoints have already passed their readiness probes when they arrive,
//! which makes optimism the right prior there too.
//!
//! The caller can do better where it knows more: after a restart the
//! dataplane adopts `backend_health_map`, and a backend that was down
//! there should be added with `initial: Down`, so a restart does not put a
//! dead backend back into rotation. No event is sent for the initial
//! state: the caller chose it; events are changes only.

pub mod checker;
pub mod probe;
// The spec is plain data (the YAML and Kubernetes policies name it), so it
// lives in the libbpf-free model crate.
pub use rivora_model::health as spec;
pub mod state;

pub use checker::{
    first_probe_at, probe_phase, CheckerError, HealthChecker, HealthEvent, Observer, ProbeLoad,
    ProbeTarget, TargetDiff, TargetKey, TargetStatus, PROBE_SLOT,
};
pub use probe::{Observation, ProbeError, ProbeOk, ProbeResult, Prober, Verdict};
pub use spec::{
    format_duration, parse_duration, resolve, DurationError, HealthCheckOverride, HealthCheckSpec,
    ProbeKind, SpecError, StatusRange, StatusRangeError,
};
pub use state::{HealthState, RiseFall};
