//! One holder at a time (rivora-controller's leader, the L2 speaker's
//! owner) through a `coordination.k8s.io` Lease, in the way client-go's
//! leader election works: every write of the Lease is a replace
//! conditioned on the `resourceVersion` last read, and every replica
//! judges expiry by its own monotonic clock, never by the `renewTime`
//! another wrote.
//!
//! - A replica that holds the Lease renews it every retry period. It may
//!   write (it *leads*) until the renew deadline has passed since it sent
//!   the last renewal the API server confirmed: the fence.
//! - A replica that does not hold it takes it over only when the record
//!   has not changed for the Lease's duration as this replica saw it
//!   (from when it first read that version), or when it was released.
//!
//! Since another replica first sees a renewal after it was sent, it waits
//! at least the duration from the send, and the holder stopped at the
//! renew deadline from the send: the difference is the margin, and no
//! clocks need to agree. A request that was held up and lands late cannot
//! undo a newer holder's record: its `resourceVersion` no longer matches.
//!
//! Two additions for Leases only rivorad contends for (the L2 speaker's),
//! where a failover must take under a second:
//! - [`LeaseSettings::precise`]: the durations in whole milliseconds,
//!   carried in the annotation [`DURATION_MS_ANNOTATION`] beside
//!   `leaseDurationSeconds` (rounded up, for humans). Readers honour the
//!   annotation of the version they judge, so each holder's own duration
//!   is what the others wait.
//! - [`LeaseFeed`]: one watch of a namespace's Leases (by label) that
//!   elections read instead of polling, so a replica learns of a release
//!   or a renewal as it is written. A version is still timed from when
//!   this replica read it, which a watch only makes later than the write
//!   that made it: the argument above is unchanged.
//! - Annotations of the holder's own ([`Election::start_with`],
//!   [`Election::set_annotations`]): what it says to the others rides on
//!   the renewals it writes anyway (the L2 speaker's holder lists the
//!   addresses it leaves to others). A change is written at once, as an
//!   early renewal, rather than at the next retry period.
//!
//! kube-lease-manager, tried first, renews and releases with
//! unconditional patches whose `renewTime` is stamped before the request
//! leaves: a renewal delayed past a takeover rewound the new holder's
//! `renewTime` (both replicas stopped writing for seconds), and a delayed
//! release would clear the new holder's Lease.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use rivora_model::lease::{LeaseTimings, Precision};

mod feed;
pub use feed::{LeaseFeed, Seen};
pub use rivora_model::lease;

/// Where a precise holder writes its lease duration, in whole
/// milliseconds (`leaseDurationSeconds` holds it rounded up).
pub const DURATION_MS_ANNOTATION: &str = "rivora.io/lease-duration-ms";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// How long the others wait, from a renewal they saw, before they
    /// take the Lease over (`leaseDurationSeconds`).
    pub duration: Duration,
    /// How long the holder keeps writing after it sent the last renewal
    /// that succeeded. Below the duration: the difference is the margin.
    pub renew_deadline: Duration,
    /// How often the holder renews and the others look.
    pub retry_period: Duration,
    /// Durations in whole milliseconds, carried in
    /// [`DURATION_MS_ANNOTATION`]: only for a Lease that no client-go
    /// replica contends for (they would read the rounded-up seconds).
    pub precise: bool,
    /// Labels the Lease is created with (a [`LeaseFeed`] selects by them).
    pub labels: BTreeMap<String, String>,
}

impl LeaseSettings {
    /// client-go's defaults (kube-controller-manager's
    /// `--leader-elect-*` flags): 15 s, 10 s, 2 s.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration: LeaseTimings::CLIENT_GO.duration,
            renew_deadline: LeaseTimings::CLIENT_GO.renew_deadline,
            retry_period: LeaseTimings::CLIENT_GO.retry_period,
            precise: false,
            labels: BTreeMap::new(),
        }
    }

    pub fn timings(&self) -> LeaseTimings {
        LeaseTimings {
            duration: self.duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }

    pub fn precision(&self) -> Precision {
        if self.precise {
            Precision::Milliseconds
        } else {
            Precision::Seconds
        }
    }

    /// The rules between the three durations
    /// ([`rivora_model::lease::LeaseTimings::check`]), said before
    /// anything runs.
    pub fn check(&self) -> Result<(), ElectionError> {
        self.timings()
            .check(self.precision())
            .map_err(|e| ElectionError::Settings(e.to_string()))?;
        if self.identity.is_empty() {
            return Err(ElectionError::Settings(
                "the identity in the Lease must not be empty".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error("leader election settings: {0}")]
    Settings(String),
}

/// The part of a Lease the election reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `None` when released (or never held).
    pub holder: Option<String>,
    pub duration: Duration,
    pub transitions: i32,
    pub resource_version: Option<String>,
}

impl Record {
    /// The duration is the holder's [`DURATION_MS_ANNOTATION`] when it
    /// wrote one that reads as a positive number, else
    /// `leaseDurationSeconds`.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        let precise = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DURATION_MS_ANNOTATION))
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis);
        Self {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            duration: precise.unwrap_or_else(|| {
                spec.and_then(|s| s.lease_duration_seconds)
                    .and_then(|d| u64::try_from(d).ok())
                    .map_or(Duration::ZERO, Duration::from_secs)
            }),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }
}

/// A version of the record and when this replica first read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: Record,
    pub since: Instant,
}

impl Observed {
    /// The holder as a replica that does not hold the Lease must judge it
    /// at `now`: none once released, or once this version has gone
    /// unchanged for its duration (anyone may take it then, and the
    /// holder went quiet the margin before). The same rule as [`decide`],
    /// for a replica that only watches a Lease it does not stand for.
    pub fn holder_at(&self, now: Instant) -> Option<&str> {
        self.record
            .holder
            .as_deref()
            .filter(|_| now < self.since + self.record.duration)
    }

    /// When [`Observed::holder_at`] turns to none if nothing changes.
    pub fn expires(&self) -> Option<Instant> {
        self.record
            .holder
            .as_ref()
            .map(|_| self.since + self.record.duration)
    }

    /// What a read at `now` makes of the previous observation: the same
    /// version keeps the time it was first seen.
    pub fn update(prev: Option<Observed>, record: Record, now: Instant) -> Observed {
        match prev {
            Some(p) if p.record == record => p,
            _ => Observed { record, since: now },
        }
    }
}

/// What the election does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// No Lease: create one naming this replica.
    Create,
    /// This replica holds it: renew.
    Renew,
    /// Free (released) or expired: take it.
    Acquire,
    /// Another holds it: look again, at the latest at this instant (when
    /// it would expire if nothing changes).
    Wait(Instant),
}

pub fn decide(me: &str, seen: Option<&Observed>, now: Instant) -> Step {
    let Some(seen) = seen else {
        return Step::Create;
    };
    match seen.record.holder.as_deref() {
        Some(h) if h == me => Step::Renew,
        None => Step::Acquire,
        Some(_) => {
            let expires = seen.since + seen.record.duration;
            if now >= expires {
                Step::Acquire
            } else {
                Step::Wait(expires)
            }
        }
    }
}

/// When the holder must be quiet: its last confirmed renewal's send time
/// plus the renew deadline. Pure, for the timing tests.
pub fn fence_after(sent: Instant, renew_deadline: Duration) -> Instant {
    sent + renew_deadline
}

/// The fenced leadership, for writers to check before every write.
#[derive(Clone)]
pub struct Leadership {
    leads: watch::Receiver<bool>,
    fence: watch::Receiver<Option<Instant>>,
}

impl Leadership {
    /// Whether this replica may write now.
    pub fn leads(&self) -> bool {
        *self.leads.borrow()
    }

    /// Wait until it leads (or the election ends: false).
    pub async fn until_leading(&mut self) -> bool {
        self.leads.wait_for(|l| *l).await.is_ok()
    }

    /// Wait until it no longer leads.
    pub async fn until_lost(&mut self) {
        let _ = self.leads.wait_for(|l| !*l).await;
    }

    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.leads.clone()
    }

    /// The instant this replica must be quiet by (None: it does not
    /// hold the Lease). `leads` flips at this instant from a timer, which
    /// a loaded runtime may run late; a writer whose act must not outlive
    /// the fence by even that (the L2 speaker's frames) compares the
    /// clock with this right before it acts.
    pub fn fence(&self) -> watch::Receiver<Option<Instant>> {
        self.fence.clone()
    }

    /// Whether this replica may act at `now`, by the fence itself.
    pub fn valid_at(&self, now: Instant) -> bool {
        self.fence.borrow().is_some_and(|until| now < until)
    }
}

/// The running election: [`Election::stop`] releases the Lease.
pub struct Election {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    annotations: watch::Sender<BTreeMap<String, String>>,
}

impl Election {
    /// Poll the Lease every retry period (client-go's way).
    pub async fn start(
        client: Client,
        s: &LeaseSettings,
    ) -> Result<(Self, Leadership), ElectionError> {
        Self::start_fed(client, s, None).await
    }

    /// With a [`LeaseFeed`] of the Lease's namespace: the election reads
    /// the Lease from the feed (a GET only before the feed has listed, or
    /// after a write of its own was refused) and a replica that does not
    /// hold it looks again as soon as the feed shows a change.
    pub async fn start_fed(
        client: Client,
        s: &LeaseSettings,
        feed: Option<&LeaseFeed>,
    ) -> Result<(Self, Leadership), ElectionError> {
        Self::start_with(client, s, feed, BTreeMap::new()).await
    }

    /// [`Election::start_fed`], the holder writing `annotations` on the
    /// Lease beside its own duration, from its first write on (so no
    /// version of its holding goes without them).
    pub async fn start_with(
        client: Client,
        s: &LeaseSettings,
        feed: Option<&LeaseFeed>,
        annotations: BTreeMap<String, String>,
    ) -> Result<(Self, Leadership), ElectionError> {
        s.check()?;
        if annotations.contains_key(DURATION_MS_ANNOTATION) {
            return Err(ElectionError::Settings(format!(
                "the annotation {DURATION_MS_ANNOTATION} is the election's own"
            )));
        }
        let (annotations_tx, annotations) = watch::channel(annotations);
        let (fence_tx, fence_rx) = watch::channel(None);
        let (leads_tx, leads) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let fence = tokio::spawn(publish_fence(
            fence_rx.clone(),
            leads_tx,
            s.identity.clone(),
        ));
        let elector = Elector {
            api: Api::namespaced(client, &s.namespace),
            s: s.clone(),
            seen: None,
            fence: fence_tx,
            feed: feed.map(|f| f.subscribe(&s.name)),
            fresh_read: false,
            annotations,
            written_keys: BTreeSet::new(),
        };
        let task = tokio::spawn(async move {
            elector.run(stop_rx).await;
            fence.abort();
        });
        Ok((
            Self {
                stop: Some(stop_tx),
                task,
                annotations: annotations_tx,
            },
            Leadership {
                leads,
                fence: fence_rx,
            },
        ))
    }

    /// Replace the annotations the holder writes (those it wrote before
    /// and are not in `annotations` are removed). While this replica
    /// holds the Lease a change is written at once, as an early renewal;
    /// the same map again writes nothing. Returns whether it changed.
    pub fn set_annotations(&self, annotations: BTreeMap<String, String>) -> bool {
        if annotations.contains_key(DURATION_MS_ANNOTATION) {
            warn!("the election's own annotation is not the caller's to set: ignored");
            return false;
        }
        self.annotations.send_if_modified(|a| {
            if *a == annotations {
                false
            } else {
                *a = annotations;
                true
            }
        })
    }

    /// Stop writing, then release the Lease if this replica holds it, so
    /// that another takes over at its next look rather than at expiry.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .is_err()
        {
            warn!("the election did not end within 10s");
            self.task.abort();
        }
    }
}

/// Turns the fence into `leads`, flipping it off the moment the fence
/// passes even while a request hangs.
async fn publish_fence(
    mut fence: watch::Receiver<Option<Instant>>,
    leads: watch::Sender<bool>,
    identity: String,
) {
    loop {
        let until = *fence.borrow_and_update();
        let now = Instant::now();
        let on = until.is_some_and(|u| now < u);
        if leads.send_replace(on) != on {
            info!(leads = on, %identity, "leadership changed");
        }
        let expiry = async {
            match until.filter(|_| on) {
                Some(u) => tokio::time::sleep_until(u.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = fence.changed() => if r.is_err() {
                leads.send_replace(false);
                return;
            },
            _ = expiry => {}
        }
    }
}

struct Elector {
    api: Api<Lease>,
    s: LeaseSettings,
    seen: Option<Observed>,
    fence: watch::Sender<Option<Instant>>,
    /// The Lease as a [`LeaseFeed`] shows it (None: poll with GETs).
    feed: Option<watch::Receiver<Seen>>,
    /// The next read must be a GET: a write was refused, so the feed may
    /// not show the version that refused it yet.
    fresh_read: bool,
    /// What the caller wants the holder's writes to carry.
    annotations: watch::Receiver<BTreeMap<String, String>>,
    /// The keys of those the last write carried, to remove the ones the
    /// caller dropped since.
    written_keys: BTreeSet<String>,
}

impl Elector {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let mut last: Option<Lease> = None;
        loop {
            // A round is never cut short (its requests are bounded): the
            // release needs the version it wrote.
            let next = self.round(&mut last).await;
            // Stopped, or the Election dropped.
            if !matches!(stop.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
                break;
            }
            // A replica that does not hold the Lease looks again as soon
            // as the feed shows a change (a release, a takeover, a
            // renewal to time from); the holder renews on its schedule,
            // whatever its own renewals make the feed say, and at once
            // when the caller's annotations change (what they say is
            // news to the others; a replica that does not hold the Lease
            // writes them with its next create or takeover).
            let holds = self.holds();
            let (feed, annotations) = (&mut self.feed, &mut self.annotations);
            let changed = async {
                match feed.as_mut() {
                    Some(f) if !holds => {
                        if f.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    _ => std::future::pending().await,
                }
            };
            let said = async {
                if !holds || annotations.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = changed => {}
                _ = said => {}
                _ = &mut stop => break,
            }
        }
        self.fence.send_replace(None);
        self.release(last).await;
    }

    /// The Lease as it is now: from the feed when it has listed and no
    /// write was refused since, else by a GET.
    async fn read(&mut self) -> Result<Option<Lease>, ()> {
        if !self.fresh_read {
            if let Some(f) = self.feed.as_mut() {
                match &*f.borrow_and_update() {
                    Seen::Absent => return Ok(None),
                    Seen::Present(l) => return Ok(Some((**l).clone())),
                    Seen::Unknown => {}
                }
            }
        }
        let l = self.get().await?;
        self.fresh_read = false;
        Ok(l)
    }

    /// One look, and the write it calls for; returns when to look next.
    async fn round(&mut self, last: &mut Option<Lease>) -> Instant {
        let retry = Instant::now() + self.s.retry_period;
        // Renewing needs no read: the last object this replica wrote is
        // the version to replace, and a conflict says someone else wrote.
        let lease = match last.take() {
            Some(l) if self.holds() => Some(l),
            _ => match self.read().await {
                Ok(l) => l,
                Err(()) => return retry,
            },
        };
        let now = Instant::now();
        self.seen = lease
            .as_ref()
            .map(|l| Observed::update(self.seen.take(), Record::of(l), now));
        let step = decide(&self.s.identity, self.seen.as_ref(), now);
        let (sent, wrote) = match step {
            Step::Wait(expires) => return retry.min(expires),
            Step::Create => (Instant::now(), self.create().await),
            Step::Renew | Step::Acquire => {
                let Some(l) = lease else { return retry };
                (Instant::now(), self.replace(l, step == Step::Acquire).await)
            }
        };
        match wrote {
            Ok(l) => {
                if step != Step::Renew {
                    info!(identity = %self.s.identity, lease = %self.s.name, "took the Lease");
                }
                self.fence
                    .send_replace(Some(fence_after(sent, self.s.renew_deadline)));
                self.seen = Some(Observed {
                    record: Record::of(&l),
                    since: Instant::now(),
                });
                *last = Some(l);
                retry
            }
            // Someone else wrote first: read again at once, from the API
            // server itself.
            Err(Conflict) => {
                self.fresh_read = true;
                Instant::now()
            }
        }
    }

    fn holds(&self) -> bool {
        self.seen
            .as_ref()
            .and_then(|o| o.record.holder.as_deref())
            .is_some_and(|h| h == self.s.identity)
    }

    /// Each request's bound. In seconds precision the retry period
    /// (client-go's rhythm); in milliseconds the renew deadline: a
    /// renewal that lands late still moves the fence (from when it was
    /// sent), and with retry periods of a fifth of a second a loaded API
    /// server would otherwise fail renewals that it was about to confirm.
    fn timeout(&self) -> Duration {
        if self.s.precise {
            self.s.renew_deadline
        } else {
            self.s.retry_period
        }
    }

    async fn get(&self) -> Result<Option<Lease>, ()> {
        match tokio::time::timeout(self.timeout(), self.api.get_opt(&self.s.name)).await {
            Ok(Ok(l)) => Ok(l),
            Ok(Err(e)) => {
                warn!(error = %e, lease = %self.s.name, "reading the Lease");
                Err(())
            }
            Err(_) => {
                debug!(lease = %self.s.name, "reading the Lease timed out");
                Err(())
            }
        }
    }

    fn spec_now(&self, acquired: bool, transitions: i32) -> LeaseSpec {
        spec_for(&self.s, acquired, transitions)
    }

    /// The election's own annotation, then the caller's (marked seen:
    /// this write carries them).
    fn annotate(&mut self, meta: &mut ObjectMeta) {
        annotate(&self.s, meta);
        let wanted = self.annotations.borrow_and_update().clone();
        carry_annotations(meta, &mut self.written_keys, wanted);
    }

    async fn create(&mut self) -> Result<Lease, Conflict> {
        let mut metadata = ObjectMeta {
            name: Some(self.s.name.clone()),
            namespace: Some(self.s.namespace.clone()),
            labels: (!self.s.labels.is_empty()).then(|| self.s.labels.clone()),
            ..Default::default()
        };
        self.annotate(&mut metadata);
        let lease = Lease {
            metadata,
            spec: Some(self.spec_now(true, 0)),
        };
        self.write(self.api.create(&PostParams::default(), &lease))
            .await
    }

    async fn replace(&mut self, mut lease: Lease, acquire: bool) -> Result<Lease, Conflict> {
        let old = lease.spec.take().unwrap_or_default();
        let mut spec = if acquire {
            let changed = old.holder_identity.as_deref() != Some(self.s.identity.as_str());
            let t = old.lease_transitions.unwrap_or(0);
            self.spec_now(true, if changed { t.saturating_add(1) } else { t })
        } else {
            let mut s = self.spec_now(false, old.lease_transitions.unwrap_or(0));
            s.acquire_time = old.acquire_time.clone();
            s
        };
        spec.preferred_holder = old.preferred_holder;
        spec.strategy = old.strategy;
        lease.spec = Some(spec);
        lease.metadata.managed_fields = None;
        self.annotate(&mut lease.metadata);
        self.write(
            self.api
                .replace(&self.s.name, &PostParams::default(), &lease),
        )
        .await
    }

    /// A create or replace, bounded. Anything but success counts as a
    /// conflict: read again before the next write.
    async fn write(
        &self,
        req: impl std::future::Future<Output = kube::Result<Lease>>,
    ) -> Result<Lease, Conflict> {
        match tokio::time::timeout(self.timeout(), req).await {
            Ok(Ok(l)) => Ok(l),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                debug!(lease = %self.s.name, "the Lease changed under this write");
                Err(Conflict)
            }
            Ok(Err(e)) => {
                warn!(error = %e, lease = %self.s.name, "writing the Lease");
                Err(Conflict)
            }
            Err(_) => {
                debug!(lease = %self.s.name, "writing the Lease timed out");
                Err(Conflict)
            }
        }
    }

    /// Hand the Lease back (client-go's way: no holder, a 1 s duration),
    /// only from the version this replica wrote last. The caller's
    /// annotations stay: they say what the last holder did until the next
    /// one writes its own, which it does with its takeover.
    async fn release(&self, last: Option<Lease>) {
        let Some(mut lease) = last.filter(|_| self.holds()) else {
            return;
        };
        let old = lease.spec.take().unwrap_or_default();
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: None,
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_transitions: old.lease_transitions,
            preferred_holder: old.preferred_holder,
            strategy: old.strategy,
        });
        lease.metadata.managed_fields = None;
        if let Some(a) = lease.metadata.annotations.as_mut() {
            a.remove(DURATION_MS_ANNOTATION);
        }
        match self
            .write(
                self.api
                    .replace(&self.s.name, &PostParams::default(), &lease),
            )
            .await
        {
            Ok(_) => info!(identity = %self.s.identity, lease = %self.s.name, "released the Lease"),
            Err(Conflict) => {
                warn!(lease = %self.s.name, "the Lease was not released: it expires on its own")
            }
        }
    }
}

/// The spec a write of this replica carries now.
pub fn spec_for(s: &LeaseSettings, acquired: bool, transitions: i32) -> LeaseSpec {
    let now = MicroTime(Timestamp::now());
    LeaseSpec {
        holder_identity: Some(s.identity.clone()),
        lease_duration_seconds: Some(duration_seconds(s.duration)),
        acquire_time: acquired.then(|| now.clone()),
        renew_time: Some(now),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// The annotations a write of this replica carries: its precise
/// duration, or none (a seconds reader must not take a stale one for the
/// holder's). Other annotations are kept.
pub fn annotate(s: &LeaseSettings, meta: &mut ObjectMeta) {
    let mut a = meta.annotations.take().unwrap_or_default();
    if s.precise {
        a.insert(
            DURATION_MS_ANNOTATION.into(),
            s.duration.as_millis().to_string(),
        );
    } else {
        a.remove(DURATION_MS_ANNOTATION);
    }
    meta.annotations = (!a.is_empty()).then_some(a);
}

/// The caller's annotations onto `meta`: `wanted` set, and those of
/// `written` (the keys the last write set) that it no longer has removed;
/// anyone else's kept. `written` becomes `wanted`'s keys.
pub fn carry_annotations(
    meta: &mut ObjectMeta,
    written: &mut BTreeSet<String>,
    wanted: BTreeMap<String, String>,
) {
    let mut a = meta.annotations.take().unwrap_or_default();
    for k in written.iter().filter(|k| !wanted.contains_key(*k)) {
        a.remove(k);
    }
    *written = wanted.keys().cloned().collect();
    a.extend(wanted);
    meta.annotations = (!a.is_empty()).then_some(a);
}

/// `leaseDurationSeconds` for a duration: rounded up, so a reader of the
/// seconds alone waits at least as long as the holder meant.
pub fn duration_seconds(d: Duration) -> i32 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(s.max(1)).unwrap_or(i32::MAX)
}

/// The write did not happen as asked.
struct Conflict;

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, rv: &str) -> Record {
        Record {
            holder: holder.map(Into::into),
            duration: Duration::from_secs(15),
            transitions: 0,
            resource_version: Some(rv.into()),
        }
    }

    #[test]
    fn another_holder_is_waited_for_from_when_its_version_was_first_seen() {
        let t0 = Instant::now();
        let o = Observed::update(None, record(Some("b"), "1"), t0);
        assert_eq!(
            decide("a", Some(&o), t0),
            Step::Wait(t0 + Duration::from_secs(15))
        );
        // The same version read again later keeps its first sighting.
        let later = t0 + Duration::from_secs(10);
        let o = Observed::update(Some(o), record(Some("b"), "1"), later);
        assert_eq!(o.since, t0);
        assert_eq!(
            decide("a", Some(&o), t0 + Duration::from_millis(14_999)),
            Step::Wait(t0 + Duration::from_secs(15))
        );
        assert_eq!(
            decide("a", Some(&o), t0 + Duration::from_secs(15)),
            Step::Acquire
        );
        // A renewal (a new version) starts the wait again.
        let o = Observed::update(Some(o), record(Some("b"), "2"), later);
        assert_eq!(o.since, later);
        assert_eq!(
            decide("a", Some(&o), t0 + Duration::from_secs(15)),
            Step::Wait(later + Duration::from_secs(15))
        );
    }

    #[test]
    fn own_free_and_missing_leases() {
        let t0 = Instant::now();
        assert_eq!(decide("a", None, t0), Step::Create);
        let mine = Observed::update(None, record(Some("a"), "1"), t0);
        assert_eq!(decide("a", Some(&mine), t0), Step::Renew);
        // Even long past its duration: only a conflict on the write says
        // another took it.
        assert_eq!(
            decide("a", Some(&mine), t0 + Duration::from_secs(60)),
            Step::Renew
        );
        let free = Observed::update(None, record(None, "2"), t0);
        assert_eq!(decide("a", Some(&free), t0), Step::Acquire);
    }

    #[test]
    fn a_watcher_judges_another_holder_as_the_election_does() {
        let t0 = Instant::now();
        let o = Observed::update(None, record(Some("b"), "1"), t0);
        let end = t0 + Duration::from_secs(15);
        assert_eq!(o.expires(), Some(end));
        assert_eq!(o.holder_at(end - Duration::from_millis(1)), Some("b"));
        // Exactly when the election would take it over.
        assert_eq!(decide("a", Some(&o), end), Step::Acquire);
        assert_eq!(o.holder_at(end), None);
        let free = Observed::update(None, record(None, "2"), t0);
        assert_eq!((free.holder_at(t0), free.expires()), (None, None));
    }

    #[test]
    fn the_callers_annotations_replace_their_own_and_keep_the_rest() {
        let s = LeaseSettings {
            precise: true,
            ..LeaseSettings::new("n", "l", "i")
        };
        let mut meta = ObjectMeta {
            annotations: Some(BTreeMap::from([
                ("someone/else".to_string(), "x".to_string()),
                ("old/key".to_string(), "y".to_string()),
            ])),
            ..Default::default()
        };
        annotate(&s, &mut meta);
        // "old/key" is not this replica's (nothing written yet): kept.
        let mut written = BTreeSet::new();
        let one = BTreeMap::from([("a/b".to_string(), "1".to_string())]);
        carry_annotations(&mut meta, &mut written, one);
        let keys = |m: &ObjectMeta| -> Vec<String> {
            m.annotations
                .as_ref()
                .map(|a| a.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert_eq!(
            keys(&meta),
            ["a/b", "old/key", DURATION_MS_ANNOTATION, "someone/else"]
        );
        // Dropped by the caller: removed; changed: replaced.
        let two = BTreeMap::from([("c/d".to_string(), String::new())]);
        carry_annotations(&mut meta, &mut written, two);
        assert_eq!(
            keys(&meta),
            ["c/d", "old/key", DURATION_MS_ANNOTATION, "someone/else"]
        );
        assert_eq!(written, BTreeSet::from(["c/d".to_string()]));
    }

    #[test]
    fn an_empty_holder_is_no_holder() {
        let lease = Lease {
            metadata: ObjectMeta {
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                ..Default::default()
            }),
        };
        let r = Record::of(&lease);
        assert_eq!(r.holder, None);
        assert_eq!(r.duration, Duration::from_secs(1));
        assert_eq!(Record::of(&Lease::default()).duration, Duration::ZERO);
    }

    #[test]
    fn settings_need_deadline_below_duration_and_retry_below_deadline() {
        let s = |d: u64, rd: u64, rp: u64| LeaseSettings {
            duration: Duration::from_millis(d),
            renew_deadline: Duration::from_millis(rd),
            retry_period: Duration::from_millis(rp),
            ..LeaseSettings::new("n", "l", "i")
        };
        assert!(LeaseSettings::new("n", "l", "i").check().is_ok());
        assert!(s(4_000, 3_000, 1_000).check().is_ok());
        for (d, rd, rp, word) in [
            (4_000, 4_000, 1_000, "renew deadline"),
            (4_000, 3_000, 3_000, "retry period"),
            (4_000, 3_000, 0, "retry period"),
            (0, 0, 0, "whole seconds"),
            (4_500, 3_000, 1_000, "whole seconds"),
        ] {
            let e = s(d, rd, rp).check().unwrap_err().to_string();
            assert!(e.contains(word), "{e}");
        }
        let e = LeaseSettings::new("n", "l", "").check().unwrap_err();
        assert!(e.to_string().contains("identity"), "{e}");
    }
}

#[cfg(test)]
mod timing_tests;
