//! BGPPeer objects as a source of this node's BGP peers, and this node's
//! `BGPNodeStatus` (with `-kubernetes` and a `bgp` section in the node's
//! file, which gives the node's AS and router ID).
//!
//! Two watches: every BGPPeer, and this node's Node object (its labels,
//! for the peers' node selectors). Once both have listed, every BGPPeer
//! that selects the node is checked by the file's validator, its password
//! read from its Secret (a `get`, again on every change and every
//! [`RESYNC`]: a rotated password applies within that), and the result
//! replaces the speaker's Kubernetes peers; a session whose settings
//! changed restarts, the others are untouched. A BGPPeer that cannot be
//! used (a bad field, a missing Secret) is left out and named in the
//! node status and the watch's last error.
//!
//! The node status is written by this node alone, for its own sessions
//! (the file's and the BGPPeers'), whenever what it would say changes
//! (checked every [`STATUS_EVERY`]; uptime is not in it, so an idle node
//! writes nothing).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use rivora_k8s::bgp::{
    password_of, BgpNodeStatus, BgpNodeStatusStatus, BgpPeer, BgpSessionStatus, RefusedPeer,
};
use rivora_model::config::bgp::PeerSettings;
use tokio::sync::watch;
use tracing::{info, warn};

use super::Bgp;
use crate::sources::WatchState;

/// Secrets are read again this often (they are not watched: a node would
/// need to watch every Secret of the cluster).
pub const RESYNC: Duration = Duration::from_secs(60);
/// How often the sessions are compared with what the status says.
pub const STATUS_EVERY: Duration = Duration::from_secs(2);
/// The field manager of the node status.
const MANAGER: &str = "rivorad";

/// The watches this task adds to `rivoractl status`, after the
/// Kubernetes source's.
pub const RESOURCES: [&str; 2] = ["bgppeers", "nodes"];

#[allow(clippy::large_enum_variant)]
enum Msg {
    Peer(watcher::Result<Event<BgpPeer>>),
    Node(watcher::Result<Event<Node>>),
}

struct State {
    peers: HashMap<String, BgpPeer>,
    relisting: Option<HashMap<String, BgpPeer>>,
    peers_synced: bool,
    labels: Option<BTreeMap<String, String>>,
    nodes_synced: bool,
    watches: [WatchState; 2],
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 404,
        _ => false,
    }
}

impl State {
    fn failed(&mut self, i: usize, e: String) {
        let w = &mut self.watches[i];
        w.errors += 1;
        warn!(resource = w.resource, error = %e, "watch failed; retrying");
        w.last_error = Some(e);
        w.last_error_at = now_secs();
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Peer(Err(e)) if not_found(&e) => {
                // No CRD: no peers from the cluster, and say so once.
                if !self.peers_synced {
                    self.peers_synced = true;
                    self.failed(
                        0,
                        "the BGPPeer CRD (bgppeers.rivora.io) is not installed: no peers from Kubernetes"
                            .into(),
                    );
                }
            }
            Msg::Peer(Err(e)) => self.failed(0, e.to_string()),
            Msg::Node(Err(e)) => self.failed(1, e.to_string()),
            Msg::Peer(Ok(ev)) => match ev {
                Event::Apply(p) => {
                    self.peers.insert(p.name_any(), p);
                }
                Event::Delete(p) => {
                    self.peers.remove(&p.name_any());
                }
                Event::Init => self.relisting = Some(HashMap::new()),
                Event::InitApply(p) => {
                    self.relisting
                        .get_or_insert_with(HashMap::new)
                        .insert(p.name_any(), p);
                }
                Event::InitDone => {
                    self.peers = self.relisting.take().unwrap_or_default();
                    self.peers_synced = true;
                }
            },
            Msg::Node(Ok(ev)) => match ev {
                Event::Apply(n) | Event::InitApply(n) => self.labels = Some(n.labels().clone()),
                Event::Delete(_) => self.labels = Some(BTreeMap::new()),
                Event::Init => {}
                Event::InitDone => self.nodes_synced = true,
            },
        }
        self.watches[0].objects = self.peers.len();
        self.watches[0].synced = self.peers_synced;
        self.watches[1].objects = usize::from(self.labels.is_some());
        self.watches[1].synced = self.nodes_synced;
    }
}

/// The peers the BGPPeers give a node with `labels`, and those that
/// select it but cannot be used. `secret` reads a Secret's data.
pub async fn resolve<F, Fut>(
    peers: &HashMap<String, BgpPeer>,
    labels: &BTreeMap<String, String>,
    local_asn: u32,
    secret: F,
) -> (Vec<PeerSettings>, Vec<RefusedPeer>)
where
    F: Fn(String, String) -> Fut,
    Fut: std::future::Future<Output = Result<BTreeMap<String, Vec<u8>>, String>>,
{
    let mut names: Vec<&String> = peers.keys().collect();
    names.sort();
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for name in names {
        let p = &peers[name];
        let refuse = |reason: String| RefusedPeer {
            name: name.clone(),
            reason,
        };
        match p.spec.selects(labels) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                refused.push(refuse(e.to_string()));
                continue;
            }
        }
        let password = match &p.spec.password_secret_ref {
            None => None,
            Some(r) => match secret(r.namespace.clone(), r.name.clone()).await {
                Ok(data) => match password_of(r, &data) {
                    Ok(pw) => Some(pw),
                    Err(e) => {
                        refused.push(refuse(e.to_string()));
                        continue;
                    }
                },
                Err(e) => {
                    refused.push(refuse(format!(
                        "reading the password Secret {}/{}: {e}",
                        r.namespace, r.name
                    )));
                    continue;
                }
            },
        };
        match p.spec.settings(name, local_asn, password.as_deref()) {
            Ok(s) => ok.push(s),
            Err(e) => refused.push(refuse(e.to_string())),
        }
    }
    (ok, refused)
}

/// The node status the speaker's sessions call for.
pub fn node_status(bgp: &Bgp, refused: &[RefusedPeer]) -> BgpNodeStatusStatus {
    let sessions: Vec<BgpSessionStatus> = bgp
        .speaker
        .status()
        .iter()
        .map(|p| BgpSessionStatus {
            name: p.name.clone(),
            address: p.address.to_string(),
            asn: u64::from(p.asn),
            state: p.state.to_string(),
            established_since: p.established_since.map(|t| {
                k8s_openapi::jiff::Timestamp::try_from(t)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            }),
            flaps: p.flaps,
            advertised: p.advertised.len() as u64,
            bfd_state: p.bfd.map(|b| b.state.as_str().to_string()),
            last_error: p.last_error.clone(),
        })
        .collect();
    BgpNodeStatusStatus {
        session_count: sessions.len() as u64,
        established_count: sessions.iter().filter(|s| s.state == "Established").count() as u64,
        sessions,
        refused: refused.to_vec(),
    }
}

/// Watch BGPPeers and this node, feed the speaker, write the node status;
/// runs until the runtime stops.
pub async fn run(
    client: Client,
    node_name: String,
    bgp: Bgp,
    watches: Arc<watch::Sender<Vec<WatchState>>>,
) {
    let local_asn = bgp.started.asn;
    let base = watches.borrow().len();
    watches.send_modify(|w| {
        for r in RESOURCES {
            w.push(WatchState {
                resource: r,
                ..Default::default()
            });
        }
    });
    let peers = watcher(
        Api::<BgpPeer>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .map(Msg::Peer)
    .boxed();
    let nodes = watcher(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
    )
    .default_backoff()
    .map(Msg::Node)
    .boxed();
    let mut events = futures::stream::select_all([peers, nodes]);
    let mut st = State {
        peers: HashMap::new(),
        relisting: None,
        peers_synced: false,
        labels: None,
        nodes_synced: false,
        watches: RESOURCES.map(|r| WatchState {
            resource: r,
            ..Default::default()
        }),
    };
    // The object, then its status: two tasks that end with the runtime.
    tokio::spawn(create_status(client.clone(), node_name.clone()));
    let refused_tx = watch::Sender::new(Vec::<RefusedPeer>::new());
    tokio::spawn(status_loop(
        client.clone(),
        node_name.clone(),
        bgp.clone(),
        refused_tx.subscribe(),
    ));
    info!(node = %node_name, "watching BGPPeers");
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            m = events.next() => match m {
                Some(m) => st.handle(m),
                None => return,
            },
            _ = resync.tick() => {}
        }
        // Everything that is ready, then one pass.
        while let Some(Some(m)) = futures::FutureExt::now_or_never(events.next()) {
            st.handle(m);
        }
        if st.peers_synced && st.nodes_synced {
            let labels = st.labels.clone().unwrap_or_default();
            let secrets = |ns: String, name: String| {
                let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
                async move {
                    let s = api.get(&name).await.map_err(|e| e.to_string())?;
                    Ok(s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect())
                }
            };
            let (ok, refused) = resolve(&st.peers, &labels, local_asn, secrets).await;
            for r in &refused {
                warn!(bgppeer = %r.name, reason = %r.reason, "BGPPeer not used");
            }
            if let Some(r) = refused.first() {
                let w = &mut st.watches[0];
                w.last_error = Some(format!("BGPPeer {}: {}", r.name, r.reason));
                w.last_error_at = now_secs();
            }
            if let Err(e) = bgp.set_kubernetes_peers(ok) {
                warn!(error = %e, "applying the BGPPeers");
            }
            refused_tx.send_replace(refused);
        }
        watches.send_modify(|w| {
            for (i, s) in st.watches.iter().enumerate() {
                if let Some(slot) = w.get_mut(base + i) {
                    *slot = s.clone();
                }
            }
        });
    }
}

/// Create this node's BGPNodeStatus (server-side apply of its spec),
/// retrying until it exists.
async fn create_status(client: Client, node_name: String) {
    let api: Api<BgpNodeStatus> = Api::all(client);
    let obj = serde_json::json!({
        "apiVersion": "rivora.io/v1alpha1",
        "kind": "BGPNodeStatus",
        "metadata": { "name": node_name },
        "spec": { "nodeName": node_name },
    });
    let mut wait = Duration::from_secs(1);
    loop {
        match api
            .patch(
                &node_name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
        {
            Ok(_) => return,
            Err(e) => {
                warn!(error = %e, "creating this node's BGPNodeStatus; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Write the status whenever it would say something new.
async fn status_loop(
    client: Client,
    node_name: String,
    bgp: Bgp,
    refused: watch::Receiver<Vec<RefusedPeer>>,
) {
    let api: Api<BgpNodeStatus> = Api::all(client);
    let mut written: Option<BgpNodeStatusStatus> = None;
    let mut tick = tokio::time::interval(STATUS_EVERY);
    loop {
        tick.tick().await;
        let want = node_status(&bgp, &refused.borrow());
        if written.as_ref() == Some(&want) {
            continue;
        }
        let body = serde_json::json!({
            "apiVersion": "rivora.io/v1alpha1",
            "kind": "BGPNodeStatus",
            "metadata": { "name": node_name },
            "status": want,
        });
        match api
            .patch_status(
                &node_name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(_) => written = Some(want),
            // Not created yet (the first apply retries), or the API server
            // is away: the next tick tries again.
            Err(e) => warn!(error = %e, "writing this node's BGPNodeStatus"),
        }
    }
}
