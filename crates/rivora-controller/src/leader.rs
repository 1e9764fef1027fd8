//! One leader among the controller's replicas, through a
//! `coordination.k8s.io` Lease, with a fence: the leader writes only while
//! a renewal it has seen stored is still valid, minus the grace period.
//!
//! kube-lease-manager takes and renews the Lease. Its own view stays
//! "leader" while renewals fail (it retries without saying so), which is
//! not enough for a writer: once the API server is out of reach, another
//! replica takes the Lease when it expires, and the old leader must have
//! stopped before then. So the Lease object is also watched, and the
//! fence is `renewTime + leaseDurationSeconds - grace` of the last
//! version this replica saw holding it. `renewTime` is this replica's own
//! clock, read before the renewal was sent; the grace is what covers the
//! clock difference with the replica that would take over.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// How long a renewal holds the Lease.
    pub duration: Duration,
    /// How long before expiry the holder renews; also the margin the
    /// fence keeps for clock differences.
    pub grace: Duration,
}

impl LeaseSettings {
    /// The settings' rule, said before the Lease manager panics on it.
    pub fn check(&self) -> Result<(), String> {
        let (d, g) = (self.duration.as_secs(), self.grace.as_secs());
        if g == 0 || d <= g {
            return Err(format!(
                "the lease grace ({g}s) must be at least 1s and below the lease duration ({d}s)"
            ));
        }
        Ok(())
    }
}

/// What this replica last saw of the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub holder: Option<String>,
    pub renewed: Option<SystemTime>,
    pub duration: Option<Duration>,
}

impl Seen {
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renewed: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| SystemTime::from(t.0)),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|d| u64::try_from(d).ok())
                .map(Duration::from_secs),
        }
    }
}

/// Until when this replica may write: None when it may not. The manager
/// must say it leads, and the Lease as last seen must name it with a
/// renewal whose validity, less the grace, is still ahead.
pub fn fence(
    manager_leads: bool,
    seen: Option<&Seen>,
    me: &str,
    grace: Duration,
    now: SystemTime,
) -> Option<SystemTime> {
    if !manager_leads {
        return None;
    }
    let seen = seen?;
    if seen.holder.as_deref() != Some(me) {
        return None;
    }
    let until = seen
        .renewed?
        .checked_add(seen.duration?)?
        .checked_sub(grace)?;
    (now < until).then_some(until)
}

/// The fenced leadership, for writers to check before every write.
#[derive(Clone)]
pub struct Leadership {
    leads: watch::Receiver<bool>,
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
}

/// The running election: [`Election::stop`] releases the Lease.
pub struct Election {
    manager: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    manager_rx: watch::Receiver<bool>,
    fence: JoinHandle<()>,
    leads_tx: watch::Sender<bool>,
}

impl Election {
    pub async fn start(
        client: Client,
        s: &LeaseSettings,
    ) -> Result<(Self, Leadership), LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client.clone(), &s.name)
            .with_namespace(&s.namespace)
            .with_identity(&s.identity)
            .with_duration(s.duration.as_secs())
            .with_grace(s.grace.as_secs())
            .build()
            .await?;
        let (manager_rx, manager) = manager.watch().await;
        let (leads_tx, leads) = watch::channel(false);
        let fence = tokio::spawn(run_fence(
            Api::namespaced(client, &s.namespace),
            s.clone(),
            manager_rx.clone(),
            leads_tx.clone(),
        ));
        Ok((
            Self {
                manager,
                manager_rx,
                fence,
                leads_tx,
            },
            Leadership { leads },
        ))
    }

    /// Stop writing, then release the Lease (dropping the manager's
    /// channel is what makes it release) and wait until it has.
    pub async fn stop(self) {
        self.fence.abort();
        self.leads_tx.send_replace(false);
        drop(self.manager_rx);
        match tokio::time::timeout(Duration::from_secs(5), self.manager).await {
            Ok(Ok(Ok(_))) => info!("released the Lease"),
            Ok(Ok(Err(e))) => warn!(error = %e, "releasing the Lease"),
            Ok(Err(e)) => warn!(error = %e, "the Lease manager ended abnormally"),
            Err(_) => warn!("the Lease was not released within 5s: it expires on its own"),
        }
    }
}

async fn run_fence(
    api: Api<Lease>,
    s: LeaseSettings,
    mut manager: watch::Receiver<bool>,
    leads: watch::Sender<bool>,
) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", s.name));
    let mut lease = watcher(api, cfg).default_backoff().boxed();
    let mut seen: Option<Seen> = None;
    loop {
        let now = SystemTime::now();
        let until = fence(*manager.borrow(), seen.as_ref(), &s.identity, s.grace, now);
        let was = leads.send_replace(until.is_some());
        if was != until.is_some() {
            info!(leads = until.is_some(), identity = %s.identity, "leadership changed");
        }
        // Wake at the fence, so that a leader cut off from the API server
        // stops on time even when nothing else happens.
        let wake = until
            .and_then(|u| u.duration_since(now).ok())
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            ev = lease.next() => match ev {
                Some(Ok(Event::Apply(l) | Event::InitApply(l))) => seen = Some(Seen::of(&l)),
                Some(Ok(Event::Delete(_))) => seen = None,
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(e)) => warn!(error = %e, "watching the Lease"),
                None => return,
            },
            r = manager.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(wake) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(holder: &str, renewed: SystemTime, d: u64) -> Seen {
        Seen {
            holder: Some(holder.into()),
            renewed: Some(renewed),
            duration: Some(Duration::from_secs(d)),
        }
    }

    #[test]
    fn the_fence_needs_the_manager_the_lease_and_time_left() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let g = Duration::from_secs(5);
        let s = seen("a", t0, 15);
        // Renewed at t0 for 15 s, grace 5 s: writes until t0 + 10 s.
        assert_eq!(
            fence(true, Some(&s), "a", g, t0),
            Some(t0 + Duration::from_secs(10))
        );
        assert_eq!(
            fence(true, Some(&s), "a", g, t0 + Duration::from_millis(9_999)),
            Some(t0 + Duration::from_secs(10))
        );
        assert_eq!(
            fence(true, Some(&s), "a", g, t0 + Duration::from_secs(10)),
            None
        );
        // The manager has not (or no longer) said it leads.
        assert_eq!(fence(false, Some(&s), "a", g, t0), None);
        // Someone else holds it, or nothing seen yet.
        assert_eq!(fence(true, Some(&s), "b", g, t0), None);
        assert_eq!(fence(true, None, "a", g, t0), None);
        // A Lease without renewal or duration is no basis for writing.
        let mut partial = s.clone();
        partial.renewed = None;
        assert_eq!(fence(true, Some(&partial), "a", g, t0), None);
        let mut partial = s;
        partial.duration = None;
        assert_eq!(fence(true, Some(&partial), "a", g, t0), None);
    }

    #[test]
    fn settings_refuse_a_grace_not_below_the_duration() {
        let s = |d, g| LeaseSettings {
            namespace: "n".into(),
            name: "l".into(),
            identity: "i".into(),
            duration: Duration::from_secs(d),
            grace: Duration::from_secs(g),
        };
        assert!(s(15, 5).check().is_ok());
        for (d, g) in [(5, 5), (5, 6), (5, 0)] {
            let e = s(d, g).check().unwrap_err();
            assert!(e.contains("grace") && e.contains("duration"), "{e}");
        }
    }
}
