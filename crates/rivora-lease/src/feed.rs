//! One watch of a namespace's Leases, selected by label, shared by every
//! election of a process (the L2 speaker runs one per announced group) and
//! by whoever wants to show who holds what. Each Lease is offered as a
//! `watch` channel of what was last seen of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

/// What the feed last saw of one Lease.
#[derive(Debug, Clone, Default)]
pub enum Seen {
    /// The watch has not listed yet (or never could): ask the API server.
    #[default]
    Unknown,
    /// Listed, and no such Lease.
    Absent,
    Present(Arc<Lease>),
}

#[derive(Default)]
struct Inner {
    /// Every Lease a subscriber asked for or the watch showed.
    leases: HashMap<String, watch::Sender<Seen>>,
    /// Whether the watch has finished a list (a name asked for later
    /// starts Absent rather than Unknown).
    listed: bool,
    /// The watch's last error, for status.
    last_error: Option<String>,
}

impl Inner {
    fn sender(&mut self, name: &str) -> &watch::Sender<Seen> {
        let listed = self.listed;
        self.leases
            .entry(name.to_string())
            .or_insert_with(|| watch::channel(if listed { Seen::Absent } else { Seen::Unknown }).0)
    }
}

/// The watch and its channels; the watch stops when the last clone is
/// dropped.
#[derive(Clone)]
pub struct LeaseFeed {
    inner: Arc<Mutex<Inner>>,
    /// Bumped after every change the watch brings (a list included).
    changes: watch::Receiver<u64>,
    _task: Arc<AbortOnDrop>,
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    // Every update leaves the map whole: a panic elsewhere cannot leave
    // it half written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LeaseFeed {
    /// Watch the Leases of `namespace` that carry `labels`.
    pub fn start(client: Client, namespace: &str, labels: &BTreeMap<String, String>) -> Self {
        let selector = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (changes_tx, changes) = watch::channel(0);
        let task = tokio::spawn(run(api, selector, inner.clone(), changes_tx));
        Self {
            inner,
            changes,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    /// Changes as they come, for a reader of [`LeaseFeed::current`] that
    /// must look again after each (the L2 speaker, which reads what other
    /// nodes' holders publish).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// What the feed sees of Lease `name`, from now on.
    pub fn subscribe(&self, name: &str) -> watch::Receiver<Seen> {
        lock(&self.inner).sender(name).subscribe()
    }

    /// Every Lease it sees now, by name.
    pub fn current(&self) -> BTreeMap<String, Arc<Lease>> {
        lock(&self.inner)
            .leases
            .iter()
            .filter_map(|(n, tx)| match &*tx.borrow() {
                Seen::Present(l) => Some((n.clone(), l.clone())),
                _ => None,
            })
            .collect()
    }

    /// Whether it has listed at least once, and its last error.
    pub fn state(&self) -> (bool, Option<String>) {
        let i = lock(&self.inner);
        (i.listed, i.last_error.clone())
    }
}

async fn run(
    api: Api<Lease>,
    selector: String,
    inner: Arc<Mutex<Inner>>,
    changes: watch::Sender<u64>,
) {
    let mut config = watcher::Config::default();
    if !selector.is_empty() {
        config = config.labels(&selector);
    }
    let mut events = watcher(api, config)
        .default_backoff()
        .modify(|l: &mut Lease| l.managed_fields_mut().clear())
        .boxed();
    let mut relist: Option<HashMap<String, Arc<Lease>>> = None;
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                warn!(error = %e, "watching Leases; retrying");
                lock(&inner).last_error = Some(e.to_string());
                continue;
            }
        };
        let mut i = lock(&inner);
        match ev {
            Event::Apply(l) => {
                let name = l.name_any();
                i.sender(&name).send_replace(Seen::Present(Arc::new(l)));
            }
            Event::Delete(l) => {
                let name = l.name_any();
                i.sender(&name).send_replace(Seen::Absent);
            }
            Event::Init => relist = Some(HashMap::new()),
            Event::InitApply(l) => {
                relist
                    .get_or_insert_with(HashMap::new)
                    .insert(l.name_any(), Arc::new(l));
            }
            Event::InitDone => {
                let mut listed = relist.take().unwrap_or_default();
                i.listed = true;
                let names: Vec<String> = i.leases.keys().cloned().collect();
                for name in names {
                    let seen = listed.remove(&name).map_or(Seen::Absent, Seen::Present);
                    i.sender(&name).send_replace(seen);
                }
                for (name, l) in listed {
                    i.sender(&name).send_replace(Seen::Present(l));
                }
                debug!(leases = i.leases.len(), "Leases listed");
            }
        }
        // After the lock: a reader woken by this sees the change.
        drop(i);
        changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}
