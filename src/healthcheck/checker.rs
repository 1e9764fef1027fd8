//! The checker: one tokio task per target on a runtime the caller owns, a
//! diffing `set_targets`, and health changes delivered on a channel.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use thiserror::Error;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::probe::{Observation, ProbeResult, Prober, Verdict};
use super::spec::{HealthCheckSpec, SpecError};
use super::state::{HealthState, RiseFall};

/// What identifies a target: the backend address itself, or whatever the
/// caller keys its backends by (a backend ID, a (VIP, backend) pair when one
/// backend is checked differently for two VIPs).
pub trait TargetKey: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static {}
impl<T: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static> TargetKey for T {}

/// One backend to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget<K = SocketAddr> {
    pub key: K,
    /// The backend's own address and port, in every forwarding mode. A DSR
    /// or L3 DSR backend also answers on the VIP, but probing the VIP from
    /// this node would test the node, not the backend.
    pub addr: SocketAddr,
    /// The effective spec (see [`super::resolve`]); its `port`, if set,
    /// replaces `addr`'s port for probing.
    pub spec: HealthCheckSpec,
    /// The state of a target new to the checker, before any probe. Ignored
    /// when the key is already known (its current state is kept). See the
    /// module documentation for why the default is `Healthy`.
    pub initial: HealthState,
}

impl ProbeTarget<SocketAddr> {
    /// A target keyed by its own address, starting healthy.
    pub fn new(addr: SocketAddr, spec: HealthCheckSpec) -> Self {
        Self {
            key: addr,
            addr,
            spec,
            initial: HealthState::Healthy,
        }
    }
}

impl<K> ProbeTarget<K> {
    /// The address probes go to: `addr` with the spec's port override.
    pub fn probe_addr(&self) -> SocketAddr {
        let mut a = self.addr;
        if let Some(p) = self.spec.port {
            a.set_port(p);
        }
        a
    }
}

/// A change of a target's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent<K = SocketAddr> {
    pub key: K,
    /// The address probed.
    pub addr: SocketAddr,
    pub state: HealthState,
    /// The result of the probe that completed the rise or fall streak.
    pub detail: ProbeResult,
}

/// A target's health and probe statistics at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetStatus<K = SocketAddr> {
    pub key: K,
    pub addr: SocketAddr,
    /// The last state reported (or `initial`, before any change).
    pub state: HealthState,
    /// Consecutive results contradicting `state` so far.
    pub streak: u32,
    pub probes: u64,
    pub failures: u64,
    /// Probes this node could not run (its own descriptors, memory or
    /// ports ran out): counted in `probes`, not in `failures`, and never
    /// towards `fall` or `rise`.
    pub unknown: u64,
    pub last: Option<Observation>,
}

/// Called after every probe with its result and latency, e.g. to feed a
/// Prometheus histogram. It runs on the probe task: keep it short and
/// non-blocking.
pub type Observer<K> = Arc<dyn Fn(&K, &Observation) + Send + Sync>;

/// What a `set_targets` call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetDiff {
    pub added: usize,
    pub removed: usize,
    /// Address or spec changed: probing restarted, state kept.
    pub restarted: usize,
    pub unchanged: usize,
}

/// Why `set_targets` refused a target set (nothing is applied then).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CheckerError {
    #[error("health-check target {key}: {source}")]
    InvalidSpec {
        key: String,
        #[source]
        source: SpecError,
    },
    #[error("health-check target {key} is listed more than once")]
    DuplicateKey { key: String },
}

/// Runs health checks for a set of targets.
///
/// Each target is one task on the runtime given to [`HealthChecker::new`]
/// (a task is a few hundred bytes and a timer entry: thousands cost far
/// less than a thread each). Dropping the checker stops every probe.
pub struct HealthChecker<K: TargetKey = SocketAddr> {
    runtime: Handle,
    /// Probes a second this node may spend (None: no bound); see
    /// [`HealthChecker::with_budget`].
    budget: Option<f64>,
    load: ProbeLoad,
    /// Origin of every target's probe phase (see [`first_probe_at`]).
    epoch: Instant,
    events: mpsc::UnboundedSender<HealthEvent<K>>,
    observer: Option<Observer<K>>,
    targets: HashMap<K, Running>,
}

struct Running {
    addr: SocketAddr,
    /// As asked for; it runs at this interval times the stretch.
    spec: HealthCheckSpec,
    /// The interval it runs at.
    every: Duration,
    cell: Arc<Mutex<Cell>>,
    task: JoinHandle<()>,
}

/// A target's state, shared by its task and the checker. The generation
/// makes removal and restart exact: a task whose generation is stale stops
/// before touching anything, and because the check and the event send
/// happen under one lock, no event of a removed or replaced task can be
/// sent after `set_targets` returns (aborting a task alone does not
/// guarantee that on a multi-threaded runtime).
struct Cell {
    generation: u64,
    sm: RiseFall,
    probes: u64,
    failures: u64,
    unknown: u64,
    last: Option<Observation>,
}

fn lock(cell: &Mutex<Cell>) -> MutexGuard<'_, Cell> {
    // Every critical section leaves the cell consistent (plain counter and
    // state updates, no early exits), so a poisoned lock is safe to use.
    cell.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: TargetKey> HealthChecker<K> {
    /// A checker spawning its probes on `runtime`, and the receiver of its
    /// health changes.
    ///
    /// The channel is unbounded so that a slow consumer never stalls
    /// probing; its length is bounded in practice because a target changes
    /// state at most once per `min(rise, fall)` probes.
    pub fn new(runtime: Handle) -> (Self, mpsc::UnboundedReceiver<HealthEvent<K>>) {
        Self::build(runtime, None)
    }

    /// As [`HealthChecker::new`], calling `observer` after every probe.
    pub fn with_observer(
        runtime: Handle,
        observer: Observer<K>,
    ) -> (Self, mpsc::UnboundedReceiver<HealthEvent<K>>) {
        Self::build(runtime, Some(observer))
    }

    fn build(
        runtime: Handle,
        observer: Option<Observer<K>>,
    ) -> (Self, mpsc::UnboundedReceiver<HealthEvent<K>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let checker = Self {
            runtime,
            budget: None,
            load: ProbeLoad::default(),
            epoch: Instant::now(),
            events: tx,
            observer,
            targets: HashMap::new(),
        };
        (checker, rx)
    }

    /// At most `per_sec` probes a second in all (None: no bound): when
    /// the targets' own intervals ask for more, every interval is
    /// stretched by the same factor, demand over budget, so each target
    /// keeps its share and the node its CPU and connection table (one
    /// tenant's ServicePolicy probes every endpoint from every node).
    /// `load` reports what was asked and the factor (the metrics read it).
    /// Applies from the next [`HealthChecker::set_targets`].
    pub fn with_budget(mut self, per_sec: Option<f64>, load: ProbeLoad) -> Self {
        self.budget = per_sec.filter(|b| *b > 0.0);
        self.load = load;
        self
    }

    /// Replaces the target set. New keys start probing in their `initial`
    /// state; missing keys stop; a key whose address, spec or stretched
    /// interval changed restarts probing with its current state and fresh
    /// rise/fall counts; unchanged keys are untouched (state, counts and
    /// schedule).
    ///
    /// The whole set is checked first: an invalid spec or a duplicate key
    /// changes nothing.
    pub fn set_targets(
        &mut self,
        targets: Vec<ProbeTarget<K>>,
    ) -> Result<TargetDiff, CheckerError> {
        let mut seen = HashSet::with_capacity(targets.len());
        for t in &targets {
            t.spec
                .validate()
                .map_err(|source| CheckerError::InvalidSpec {
                    key: format!("{:?}", t.key),
                    source,
                })?;
            if !seen.insert(&t.key) {
                return Err(CheckerError::DuplicateKey {
                    key: format!("{:?}", t.key),
                });
            }
        }

        let demand: f64 = targets
            .iter()
            .map(|t| 1.0 / t.spec.interval.as_secs_f64())
            .sum();
        // In eighths, rounded up: the rate stays within the budget, and a
        // Service coming or going moves the factor (and restarts every
        // target's schedule) only when it crosses a step.
        let stretch = match self.budget {
            Some(b) if demand > b => (demand / b * 8.0).ceil() / 8.0,
            _ => 1.0,
        };
        self.load.demand.set(demand);
        self.load.stretch.set(stretch);
        let every = |spec: &HealthCheckSpec| spec.interval.mul_f64(stretch);

        let mut diff = TargetDiff::default();
        let gone: Vec<K> = self
            .targets
            .keys()
            .filter(|k| !seen.contains(k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(r) = self.targets.remove(&k) {
                lock(&r.cell).generation += 1;
                r.task.abort();
                diff.removed += 1;
            }
        }

        for t in targets {
            let interval = every(&t.spec);
            match self.targets.get_mut(&t.key) {
                Some(r) if r.addr == t.addr && r.spec == t.spec && r.every == interval => {
                    diff.unchanged += 1
                }
                Some(r) => {
                    let generation = {
                        let mut c = lock(&r.cell);
                        c.generation += 1;
                        c.sm = RiseFall::new(c.sm.state(), t.spec.rise, t.spec.fall);
                        c.generation
                    };
                    r.task.abort();
                    r.task = spawn_target(
                        &self.runtime,
                        &stretched(&t, interval),
                        self.epoch,
                        Arc::clone(&r.cell),
                        generation,
                        self.events.clone(),
                        self.observer.clone(),
                    );
                    r.addr = t.addr;
                    r.spec = t.spec;
                    r.every = interval;
                    diff.restarted += 1;
                }
                None => {
                    let cell = Arc::new(Mutex::new(Cell {
                        generation: 0,
                        sm: RiseFall::new(t.initial, t.spec.rise, t.spec.fall),
                        probes: 0,
                        failures: 0,
                        unknown: 0,
                        last: None,
                    }));
                    let task = spawn_target(
                        &self.runtime,
                        &stretched(&t, interval),
                        self.epoch,
                        Arc::clone(&cell),
                        0,
                        self.events.clone(),
                        self.observer.clone(),
                    );
                    let running = Running {
                        addr: t.addr,
                        spec: t.spec,
                        every: interval,
                        cell,
                        task,
                    };
                    self.targets.insert(t.key, running);
                    diff.added += 1;
                }
            }
        }
        Ok(diff)
    }

    /// The current state of one target.
    pub fn state(&self, key: &K) -> Option<HealthState> {
        self.targets.get(key).map(|r| lock(&r.cell).sm.state())
    }

    /// A snapshot of every target (no particular order).
    pub fn status(&self) -> Vec<TargetStatus<K>> {
        self.targets
            .iter()
            .map(|(k, r)| {
                let c = lock(&r.cell);
                TargetStatus {
                    key: k.clone(),
                    addr: r.addr,
                    state: c.sm.state(),
                    streak: c.sm.streak(),
                    probes: c.probes,
                    failures: c.failures,
                    unknown: c.unknown,
                    last: c.last.clone(),
                }
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

impl<K: TargetKey> Drop for HealthChecker<K> {
    fn drop(&mut self) {
        for r in self.targets.values() {
            lock(&r.cell).generation += 1;
            r.task.abort();
        }
    }
}

/// `t` probed every `interval` instead of its own.
fn stretched<K: Clone>(t: &ProbeTarget<K>, interval: Duration) -> ProbeTarget<K> {
    ProbeTarget {
        spec: HealthCheckSpec {
            interval,
            ..t.spec.clone()
        },
        ..t.clone()
    }
}

/// What the targets ask of the node: gauges the metrics register
/// (`rivora_health_probe_demand_per_second`,
/// `rivora_health_probe_interval_stretch`) and the checker sets.
#[derive(Debug, Clone, Default)]
pub struct ProbeLoad {
    /// Probes a second the targets' own intervals add up to.
    pub demand: Gauge<f64, AtomicU64>,
    /// The factor every interval runs stretched by: 1 within the budget.
    pub stretch: Gauge<f64, AtomicU64>,
}

/// Granularity of probe phases. Targets whose phases fall in one slot are
/// probed in the same timer wakeup: with 1,000 targets every second that is
/// about 100 wakeups a second instead of 1,000, and the wakeups (context
/// switches), not the probes, were most of the checker's CPU.
pub const PROBE_SLOT: Duration = Duration::from_millis(10);

/// Where in its interval a target is probed: a deterministic slot in
/// `[0, interval)` derived from its key, so that thousands of targets added
/// by one config apply spread over the interval instead of probing in
/// lockstep, and a restarted daemon keeps the same spread.
pub fn probe_phase<K: Hash>(key: &K, interval: Duration) -> Duration {
    // DefaultHasher::new() has fixed keys: stable within one build, which
    // is all the spread needs.
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    let slot = PROBE_SLOT.as_nanos();
    let slots = (interval.as_nanos() / slot).max(1);
    let offset = (u128::from(h.finish()) % slots) * slot;
    // offset < interval (or 0), which fits a Duration's u64 nanoseconds
    // for any interval a spec can hold.
    Duration::from_nanos(u64::try_from(offset).unwrap_or(0))
}

/// The first probe time at or after `now` that lies `phase` into an
/// interval counted from `epoch`. Counting every target from the checker's
/// one epoch keeps targets of equal interval and phase in the same wakeup,
/// including targets added or restarted later.
pub fn first_probe_at(
    epoch: Instant,
    now: Instant,
    interval: Duration,
    phase: Duration,
) -> Instant {
    let iv = interval.as_nanos().max(1);
    let into = now.saturating_duration_since(epoch).as_nanos() % iv;
    let wait = (phase.as_nanos() % iv + iv - into) % iv;
    // wait < interval, which fits a Duration.
    now + Duration::from_nanos(u64::try_from(wait).unwrap_or(0))
}

/// Probe `t` every `t.spec.interval` (the stretched one).
fn spawn_target<K: TargetKey>(
    runtime: &Handle,
    t: &ProbeTarget<K>,
    epoch: Instant,
    cell: Arc<Mutex<Cell>>,
    generation: u64,
    events: mpsc::UnboundedSender<HealthEvent<K>>,
    observer: Option<Observer<K>>,
) -> JoinHandle<()> {
    let prober = Prober::new(t.probe_addr(), t.spec.clone());
    let key = t.key.clone();
    let interval = t.spec.interval;
    let first = first_probe_at(epoch, Instant::now(), interval, probe_phase(&key, interval));
    runtime.spawn(async move {
        let mut ticker = tokio::time::interval_at(first, interval);
        // A probe never outlasts the interval (timeout < interval), but a
        // stalled runtime could still miss ticks: then skip them rather
        // than fire a burst to catch up, and stay on the phase grid.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            ticker.tick().await;
            let obs = prober.probe().await;
            if let Some(f) = &observer {
                f(&key, &obs);
            }
            let mut c = lock(&cell);
            if c.generation != generation {
                return;
            }
            c.probes += 1;
            let success = match obs.verdict() {
                Verdict::Up => true,
                Verdict::Down => {
                    c.failures += 1;
                    false
                }
                Verdict::Unknown => {
                    c.unknown += 1;
                    if let Err(e) = &obs.result {
                        exhaustion_log(&key, prober.addr(), e);
                    }
                    c.last = Some(obs);
                    continue;
                }
            };
            if let Some(state) = c.sm.observe(success) {
                match &obs.result {
                    Ok(_) => tracing::info!(target_key = ?key, addr = %prober.addr(), ?state, "health changed"),
                    Err(e) => tracing::info!(target_key = ?key, addr = %prober.addr(), ?state, error = %e, "health changed"),
                }
                // A closed receiver means nobody consumes changes any more;
                // probing continues so that `status()` stays current.
                let _ = events.send(HealthEvent {
                    key: key.clone(),
                    addr: prober.addr(),
                    state,
                    detail: obs.result.clone(),
                });
            }
            c.last = Some(obs);
        }
    })
}

/// How often at most the checker says that probes could not run: when
/// the node is out of descriptors every target's probe says so, and a
/// line per probe would add to the trouble.
const EXHAUSTION_LOG_EVERY: Duration = Duration::from_secs(10);

/// When the last such line was written, and the probes left unsaid since.
static EXHAUSTION_LOG: Mutex<(Option<std::time::Instant>, u64)> = Mutex::new((None, 0));

fn exhaustion_log<K: fmt::Debug>(key: &K, addr: SocketAddr, e: &super::probe::ProbeError) {
    let mut log = EXHAUSTION_LOG
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let now = std::time::Instant::now();
    if log
        .0
        .is_some_and(|last| now.duration_since(last) < EXHAUSTION_LOG_EVERY)
    {
        log.1 += 1;
        return;
    }
    let unsaid = std::mem::take(&mut log.1);
    log.0 = Some(now);
    tracing::warn!(
        target_key = ?key,
        %addr,
        error = %e,
        unsaid,
        "health probe not run for lack of this node's resources: the result is unknown and the backend keeps its state"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_phases_are_slotted_within_the_interval_and_spread() {
        let iv = Duration::from_secs(1);
        let phases: Vec<Duration> = (0..1000u16)
            .map(|p| probe_phase(&SocketAddr::from(([127, 0, 0, 1], 20000 + p)), iv))
            .collect();
        assert!(phases.iter().all(|d| *d < iv));
        assert!(phases
            .iter()
            .all(|d| d.as_nanos() % PROBE_SLOT.as_nanos() == 0));
        // Deterministic per key.
        let k = SocketAddr::from(([10, 0, 0, 1], 80));
        assert_eq!(probe_phase(&k, iv), probe_phase(&k, iv));
        // Spread: each tenth of the interval gets a fair share (expected
        // 100 of 1000; a lockstep or clustered hash would fail this).
        let mut buckets = [0u32; 10];
        for d in &phases {
            buckets[(d.as_millis() / 100) as usize] += 1;
        }
        assert!(
            buckets.iter().all(|&b| (50..=150).contains(&b)),
            "{buckets:?}"
        );
        // An interval shorter than a slot: every phase is 0.
        assert_eq!(probe_phase(&k, Duration::from_millis(3)), Duration::ZERO);
    }

    #[test]
    fn first_probe_lands_on_the_phase_grid() {
        let ms = Duration::from_millis;
        let epoch = Instant::now();
        let iv = ms(1000);
        // 2.3 s after the epoch, phase 500 ms: next is 2.5 s.
        assert_eq!(
            first_probe_at(epoch, epoch + ms(2300), iv, ms(500)),
            epoch + ms(2500)
        );
        // Phase already passed in this interval: the next one, 3.2 s.
        assert_eq!(
            first_probe_at(epoch, epoch + ms(2300), iv, ms(200)),
            epoch + ms(3200)
        );
        // Exactly on the phase: now.
        assert_eq!(
            first_probe_at(epoch, epoch + ms(2200), iv, ms(200)),
            epoch + ms(2200)
        );
        assert_eq!(first_probe_at(epoch, epoch, iv, ms(0)), epoch);
    }

    #[test]
    fn probe_addr_applies_the_port_override() {
        let mut t = ProbeTarget::new(
            "[2001:db8::1]:443".parse().expect("literal"),
            HealthCheckSpec::default(),
        );
        assert_eq!(t.probe_addr(), t.addr);
        t.spec.port = Some(8081);
        assert_eq!(
            t.probe_addr(),
            "[2001:db8::1]:8081".parse().expect("literal")
        );
    }

    #[test]
    fn invalid_or_duplicate_targets_change_nothing() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (mut hc, _rx) = HealthChecker::new(rt.handle().clone());
        let a: SocketAddr = "127.0.0.1:1".parse().expect("literal");
        let b: SocketAddr = "127.0.0.1:2".parse().expect("literal");
        let ok = HealthCheckSpec::default();
        let bad = HealthCheckSpec {
            rise: 0,
            ..ok.clone()
        };
        let err = hc
            .set_targets(vec![
                ProbeTarget::new(a, ok.clone()),
                ProbeTarget::new(b, bad),
            ])
            .expect_err("invalid spec");
        assert_eq!(
            err,
            CheckerError::InvalidSpec {
                key: "127.0.0.1:2".into(),
                source: SpecError::ZeroRise
            }
        );
        assert_eq!(
            err.to_string(),
            "health-check target 127.0.0.1:2: rise: must be at least 1"
        );
        assert!(hc.is_empty());
        let err = hc
            .set_targets(vec![
                ProbeTarget::new(a, ok.clone()),
                ProbeTarget::new(a, ok),
            ])
            .expect_err("duplicate");
        assert_eq!(
            err,
            CheckerError::DuplicateKey {
                key: "127.0.0.1:1".into()
            }
        );
        assert!(hc.is_empty());
    }
}
