//! What the speaker reads from Kubernetes besides its Leases: the
//! AddressPools (which hold a VIP, and whether they ask for L2) and this
//! node's own labels (for the pools' and the settings' node selectors).
//! Each is a watch kept as one value for the speaker to read whole.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use rivora_k8s::ipam::PoolSet;
use rivora_k8s::AddressPool;
use tokio::sync::watch;
use tracing::warn;

/// The AddressPools as the allocator would use them (overlaps refused).
pub type Pools = Arc<PoolSet>;
pub type Labels = BTreeMap<String, String>;

/// The last error of one of these watches, for status.
#[derive(Debug, Clone, Default)]
pub struct WatchErrors {
    pub pools: Option<String>,
    pub node: Option<String>,
}

/// Watch the AddressPools: the set, replaced whole after each change
/// once the first list is done (before it: empty, so nothing is
/// announced that a pool might not ask for).
pub fn pools(
    client: Client,
    errors: watch::Sender<WatchErrors>,
) -> (watch::Receiver<Pools>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Arc::new(PoolSet::default()));
    let task = tokio::spawn(async move {
        let mut events = watcher(Api::<AddressPool>::all(client), watcher::Config::default())
            .default_backoff()
            .modify(|p: &mut AddressPool| p.managed_fields_mut().clear())
            .boxed();
        let mut items: HashMap<String, AddressPool> = HashMap::new();
        let mut relist: Option<HashMap<String, AddressPool>> = None;
        let mut listed = false;
        while let Some(ev) = events.next().await {
            match ev {
                Err(e) => {
                    warn!(error = %e, "watching AddressPools (for L2 announcements); retrying");
                    errors.send_modify(|w| w.pools = Some(e.to_string()));
                    continue;
                }
                Ok(Event::Apply(p)) => {
                    items.insert(p.name_any(), p);
                }
                Ok(Event::Delete(p)) => {
                    items.remove(&p.name_any());
                }
                Ok(Event::Init) => relist = Some(HashMap::new()),
                Ok(Event::InitApply(p)) => {
                    relist
                        .get_or_insert_with(HashMap::new)
                        .insert(p.name_any(), p);
                }
                Ok(Event::InitDone) => {
                    items = relist.take().unwrap_or_default();
                    listed = true;
                }
            }
            if listed {
                tx.send_replace(Arc::new(PoolSet::new(items.values())));
            }
        }
    });
    (rx, task)
}

/// Watch this node's Node object for its labels (none while it does not
/// exist or cannot be read).
pub fn node_labels(
    client: Client,
    node: &str,
    errors: watch::Sender<WatchErrors>,
) -> (watch::Receiver<Labels>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Labels::new());
    let field = format!("metadata.name={node}");
    let task = tokio::spawn(async move {
        let mut events = watcher(
            Api::<Node>::all(client),
            watcher::Config::default().fields(&field),
        )
        .default_backoff()
        .boxed();
        let mut relist: Option<Labels> = None;
        while let Some(ev) = events.next().await {
            match ev {
                Err(e) => {
                    warn!(error = %e, "watching this node's Node object (for L2 node selectors); retrying");
                    errors.send_modify(|w| w.node = Some(e.to_string()));
                }
                Ok(Event::Apply(n)) => {
                    tx.send_replace(n.labels().clone());
                }
                Ok(Event::Delete(_)) => {
                    tx.send_replace(Labels::new());
                }
                Ok(Event::Init) => relist = Some(Labels::new()),
                Ok(Event::InitApply(n)) => relist = Some(n.labels().clone()),
                Ok(Event::InitDone) => {
                    tx.send_replace(relist.take().unwrap_or_default());
                }
            }
        }
    });
    (rx, task)
}
