//! What rivorad's Kubernetes sources and rivora-controller share of
//! kube's runtime: the client ([`client`]), a full copy of a watched list
//! that stays whole while it is listed again ([`Listed`]), and Warning
//! Events repeated at most once per period, and published once for the
//! cluster however many nodes find them ([`Warner`], [`publish_once`]),
//! and watches of
//! the Gateway API kinds at whichever version the cluster serves
//! ([`versioned`]).

pub mod versioned;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::Reporter;
use kube::runtime::watcher::{self, watcher, Event};
use kube::{Client, Resource, ResourceExt};
use tracing::debug;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("reading the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(
        "no Kubernetes credentials: not running in a cluster ({incluster}), and no kubeconfig ({kubeconfig}); pass -kubeconfig FILE"
    )]
    NoConfig {
        incluster: kube::config::InClusterError,
        kubeconfig: kube::config::KubeconfigError,
    },
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// The client: `kubeconfig` when given, else in-cluster (the pod's
/// service account), else `$KUBECONFIG`, else `~/.kube/config`. Builds no
/// connection: an API server that cannot be reached shows as watch
/// errors, never as a failed start.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeError> {
    Client::try_from(config(kubeconfig).await?).map_err(KubeError::Client)
}

/// The configuration [`client`] builds its client from, for a caller
/// that sets timeouts first.
pub async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config, KubeError> {
    match kubeconfig {
        Some(path) => {
            let err = |source| KubeError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kc = Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(err)
        }
        None => match kube::Config::incluster() {
            Ok(c) => Ok(c),
            Err(incluster) => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(|kubeconfig| KubeError::NoConfig {
                    incluster,
                    kubeconfig,
                }),
        },
    }
}

/// What the watches key objects by: namespace (empty for a
/// cluster-scoped object) and name.
pub use rivora_k8s::policy::ObjectRef as Key;

/// An object's key.
pub fn key_of<K: Resource>(o: &K) -> Key {
    Key::new(
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    )
}

/// A resource list with the buffer of a list in progress: the copy in
/// use stays whole until the new list is complete.
pub struct Listed<K> {
    pub items: HashMap<Key, Arc<K>>,
    relisting: Option<HashMap<Key, Arc<K>>>,
    /// Has finished a first full list.
    pub synced: bool,
}

impl<K> Default for Listed<K> {
    fn default() -> Self {
        Self {
            items: HashMap::new(),
            relisting: None,
            synced: false,
        }
    }
}

/// What one event changed.
pub enum Change<K> {
    None,
    /// One object: before and after.
    One(Option<Arc<K>>, Option<Arc<K>>),
    /// A whole new list replaced the old one (the old one given).
    All(HashMap<Key, Arc<K>>),
}

impl<K: Resource> Listed<K> {
    pub fn apply(&mut self, ev: Event<K>) -> Change<K> {
        match ev {
            Event::Apply(o) => {
                let o = Arc::new(o);
                let old = self.items.insert(key_of(&*o), o.clone());
                Change::One(old, Some(o))
            }
            Event::Delete(o) => Change::One(self.items.remove(&key_of(&o)), None),
            Event::Init => {
                self.relisting = Some(HashMap::new());
                Change::None
            }
            Event::InitApply(o) => {
                let o = Arc::new(o);
                self.relisting
                    .get_or_insert_with(HashMap::new)
                    .insert(key_of(&*o), o);
                Change::None
            }
            Event::InitDone => {
                self.synced = true;
                let new = self.relisting.take().unwrap_or_default();
                Change::All(std::mem::replace(&mut self.items, new))
            }
        }
    }

    pub fn get(&self, key: &Key) -> Option<&Arc<K>> {
        self.items.get(key)
    }
}

impl<K> Change<K> {
    /// The keys it touched: the object's, or every key of the old and the
    /// new list.
    pub fn keys<'a>(&'a self, now: &'a Listed<K>) -> Vec<Key>
    where
        K: Resource,
    {
        match self {
            Change::None => Vec::new(),
            Change::One(old, new) => old
                .as_ref()
                .or(new.as_ref())
                .map(|o| vec![key_of(&**o)])
                .unwrap_or_default(),
            Change::All(old) => {
                let mut k: Vec<Key> = old.keys().chain(now.items.keys()).cloned().collect();
                k.sort();
                k.dedup();
                k
            }
        }
    }
}

/// A watch of every `K` that `config` selects, with kube's backoff, and
/// each object's managed fields dropped (nobody reads them; they are most
/// of a copy's size).
pub fn watch_all<K>(
    client: &Client,
    config: watcher::Config,
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    use kube::runtime::WatchStreamExt;
    watcher(kube::Api::<K>::all(client.clone()), config)
        .default_backoff()
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .boxed()
}

/// Whether a watch failed because its resource does not exist (a CRD not
/// installed).
pub fn is_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 404,
        _ => false,
    }
}

/// Where a warning goes once it passed the rate limit: an Event on the
/// object (a test collects them instead).
pub type WarnSink<K> = Arc<dyn Fn(Arc<K>, &'static str, String) + Send + Sync>;

type Warned = HashMap<(Key, &'static str, String), Instant>;

/// Warnings on objects, each (object, reason, message) at most once per
/// `repeat`. Cheap to clone; clones share what was warned.
pub struct Warner<K> {
    sink: WarnSink<K>,
    repeat: Duration,
    warned: Arc<Mutex<Warned>>,
}

impl<K> Clone for Warner<K> {
    fn clone(&self) -> Self {
        Self {
            sink: self.sink.clone(),
            repeat: self.repeat,
            warned: self.warned.clone(),
        }
    }
}

impl<K: Resource + Send + Sync + 'static> Warner<K>
where
    K::DynamicType: Default,
{
    pub fn new(sink: WarnSink<K>, repeat: Duration) -> Self {
        Self {
            sink,
            repeat,
            warned: Arc::default(),
        }
    }

    /// Warning Events published as `reporter` (`action` is the Event's
    /// action), off the caller's task, once per cluster and period
    /// ([`publish_once`]): every node that finds the same thing to say
    /// says it in one Event.
    pub fn events(
        client: Client,
        reporter: Reporter,
        action: &'static str,
        repeat: Duration,
    ) -> Self {
        Self::new(
            Arc::new(move |o: Arc<K>, reason: &'static str, message: String| {
                let (client, reporter) = (client.clone(), reporter.clone());
                tokio::spawn(async move {
                    let obj = o.object_ref(&Default::default());
                    let ev = OnceEvent {
                        reason,
                        note: &message,
                        action,
                        reporter: &reporter,
                        period: repeat,
                    };
                    if let Err(e) = publish_once(&client, &obj, &ev, SystemTime::now()).await {
                        debug!(error = %e, object = %o.name_any(), "publishing an Event");
                    }
                });
            }),
            repeat,
        )
    }

    /// Publish unless this (object, reason, message) was published within
    /// the repeat period.
    pub fn warn(&self, o: &Arc<K>, reason: &'static str, message: String) {
        let now = Instant::now();
        {
            let Ok(mut warned) = self.warned.lock() else {
                return;
            };
            let repeat = self.repeat;
            warned.retain(|_, at| now.duration_since(*at) < repeat);
            let key = (key_of(&**o), reason, message.clone());
            if warned.contains_key(&key) {
                return;
            }
            warned.insert(key, now);
        }
        (self.sink)(o.clone(), reason, message);
    }

    /// Forget what was warned about an object (deleted, or fixed), so the
    /// next warning is published at once.
    pub fn forget(&self, key: &Key) {
        if let Ok(mut w) = self.warned.lock() {
            w.retain(|(k, _, _), _| k != key);
        }
    }
}

/// A Warning Event as [`publish_once`] writes it.
pub struct OnceEvent<'a> {
    pub reason: &'a str,
    pub note: &'a str,
    pub action: &'a str,
    pub reporter: &'a Reporter,
    /// It is published at most once per this period, cluster-wide.
    pub period: Duration,
}

/// The name of the Event that says `reason: note` about `obj` in the
/// period holding `at`: the same from every node, so the first create
/// wins and the others are refused (409). FNV-1a, stable across builds,
/// so nodes of two versions agree.
pub fn event_name(
    obj: &ObjectReference,
    reason: &str,
    note: &str,
    period: Duration,
    at: SystemTime,
) -> String {
    let n = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / period.as_secs().max(1))
        .to_string();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let parts = [
        obj.kind.as_deref().unwrap_or(""),
        obj.namespace.as_deref().unwrap_or(""),
        obj.name.as_deref().unwrap_or(""),
        obj.uid.as_deref().unwrap_or(""),
        reason,
        note,
        &n,
    ];
    for part in parts {
        for b in part.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // The object's name leads, as kubectl's Events do (253 at most).
    let name: String = obj
        .name
        .as_deref()
        .unwrap_or("object")
        .chars()
        .take(200)
        .collect();
    format!("{name}.rivora.{h:016x}")
}

/// Publish a Warning Event about `obj` unless someone published the same
/// one in this period: Events once per object, not once per node.
/// Ok(true) when this call created it.
pub async fn publish_once(
    client: &Client,
    obj: &ObjectReference,
    ev: &OnceEvent<'_>,
    at: SystemTime,
) -> Result<bool, kube::Error> {
    let ns = obj.namespace.clone().unwrap_or_else(|| "default".into());
    let when = k8s_openapi::jiff::Timestamp::try_from(at)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
    let event = K8sEvent {
        metadata: ObjectMeta {
            name: Some(event_name(obj, ev.reason, ev.note, ev.period, at)),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(when)),
        type_: Some("Warning".into()),
        reason: Some(ev.reason.into()),
        // The API server refuses a note over 1 kB.
        note: Some(ev.note.chars().take(1024).collect()),
        action: Some(ev.action.into()),
        reporting_controller: Some(ev.reporter.controller.clone()),
        reporting_instance: ev
            .reporter
            .instance
            .as_ref()
            .map(|i| i.chars().take(128).collect()),
        regarding: Some(obj.clone()),
        ..Default::default()
    };
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), &ns);
    match api.create(&PostParams::default(), &event).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::ObjectMeta;

    use super::*;

    fn svc(ns: &str, name: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_relist_keeps_the_old_copy_whole_until_it_is_done() {
        let mut l = Listed::<Service>::default();
        l.apply(Event::Init);
        l.apply(Event::InitApply(svc("a", "x")));
        assert!(!l.synced && l.items.is_empty());
        let ch = l.apply(Event::InitDone);
        assert!(l.synced);
        assert_eq!(ch.keys(&l), vec![Key::new("a", "x")]);
        l.apply(Event::Init);
        l.apply(Event::InitApply(svc("a", "y")));
        assert!(
            l.get(&Key::new("a", "x")).is_some(),
            "the old list is in use"
        );
        let ch = l.apply(Event::InitDone);
        assert!(l.get(&Key::new("a", "x")).is_none());
        assert_eq!(ch.keys(&l), vec![Key::new("a", "x"), Key::new("a", "y")]);
        let ch = l.apply(Event::Delete(svc("a", "y")));
        assert!(matches!(ch, Change::One(Some(_), None)));
        assert!(l.items.is_empty());
    }

    #[test]
    fn a_warning_is_repeated_only_after_the_period_or_a_forget() {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s = seen.clone();
        let w = Warner::<Service>::new(
            Arc::new(move |_, reason, msg| {
                s.lock().expect("seen").push(format!("{reason}: {msg}"))
            }),
            Duration::from_secs(600),
        );
        let a = Arc::new(svc("n", "a"));
        w.warn(&a, "R", "m".into());
        w.warn(&a, "R", "m".into());
        w.warn(&a, "R", "other".into());
        w.warn(&Arc::new(svc("n", "b")), "R", "m".into());
        assert_eq!(seen.lock().expect("seen").len(), 3);
        w.forget(&Key::new("n", "a"));
        w.warn(&a, "R", "m".into());
        assert_eq!(seen.lock().expect("seen").len(), 4);
    }

    /// Every node names the same Event alike within a period, whoever it
    /// is; another period, object or message is another Event.
    #[test]
    fn an_events_name_is_the_clusters_not_the_nodes() {
        let obj = |name: &str| ObjectReference {
            kind: Some("Service".into()),
            namespace: Some("n".into()),
            name: Some(name.into()),
            uid: Some("u-1".into()),
            ..Default::default()
        };
        let p = Duration::from_secs(600);
        let t = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let base = event_name(&obj("web"), "R", "m", p, t(6_000));
        assert!(base.starts_with("web.rivora."), "{base}");
        assert_eq!(base, event_name(&obj("web"), "R", "m", p, t(6_599)));
        for other in [
            event_name(&obj("web"), "R", "m", p, t(6_600)),
            event_name(&obj("web"), "R", "m2", p, t(6_000)),
            event_name(&obj("web"), "R2", "m", p, t(6_000)),
            event_name(&obj("db"), "R", "m", p, t(6_000)),
        ] {
            assert_ne!(base, other);
        }
        // A name the API server takes: a DNS subdomain, 253 at most.
        let long = event_name(&obj(&"a".repeat(300)), "R", "m", p, t(0));
        assert!(long.len() <= 253, "{}", long.len());
    }
}
