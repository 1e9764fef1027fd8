//! Watches of the Gateway API kinds at whichever version the cluster
//! serves, newest first (v1, then TCPRoute/UDPRoute v1alpha2 or
//! ReferenceGrant v1beta1 of Gateway API releases before v1.7), found by
//! discovery and found again when a watch says the version is gone.
//! Without the CRD the watch says so ([`GwEvent::NotInstalled`]) and
//! looks again, quietly: first after [`NOT_INSTALLED_CONFIRM`] (just
//! after an API server starts, discovery can briefly miss CRDs it serves
//! a moment later), then every [`NOT_INSTALLED_RETRY`].
//!
//! An object the types cannot read (a field of a release newer than the
//! types, say) comes as [`Unreadable`]; [`Listed::apply_read`] keeps its
//! last readable copy.

use std::collections::HashMap;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource};
use tracing::debug;

use crate::{Change, Key, Listed};

/// How often discovery is asked again while a CRD is not installed.
pub const NOT_INSTALLED_RETRY: Duration = Duration::from_secs(10);
/// The first second look, soon after the first answer.
pub const NOT_INSTALLED_CONFIRM: Duration = Duration::from_secs(2);

/// One kind, and the versions it is read at, newest first.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    pub group: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub versions: &'static [&'static str],
}

impl Kind {
    /// The resource at `version`, for a [`DynamicObject`] API.
    pub fn at(&self, version: &str) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, version, self.kind),
            self.plural,
        )
    }
}

const GROUP: &str = rivora_k8s::gateway::GROUP;

pub const GATEWAYS: Kind = Kind {
    group: GROUP,
    kind: "Gateway",
    plural: "gateways",
    versions: &["v1", "v1beta1"],
};
pub const GATEWAY_CLASSES: Kind = Kind {
    group: GROUP,
    kind: "GatewayClass",
    plural: "gatewayclasses",
    versions: &["v1", "v1beta1"],
};
pub const TCP_ROUTES: Kind = Kind {
    group: GROUP,
    kind: "TCPRoute",
    plural: "tcproutes",
    versions: &["v1", "v1alpha2"],
};
pub const UDP_ROUTES: Kind = Kind {
    group: GROUP,
    kind: "UDPRoute",
    plural: "udproutes",
    versions: &["v1", "v1alpha2"],
};
pub const REFERENCE_GRANTS: Kind = Kind {
    group: GROUP,
    kind: "ReferenceGrant",
    plural: "referencegrants",
    versions: &["v1", "v1beta1"],
};

/// An object a watch delivered that the types cannot read.
#[derive(Debug, Clone)]
pub struct Unreadable {
    pub key: Key,
    pub error: String,
}

/// What a versioned watch says.
pub enum GwEvent<K> {
    /// The version watched from now on (discovered, or discovered again).
    Serving(&'static str),
    Watch(watcher::Result<Event<Result<K, Unreadable>>>),
    /// Discovery found none of the versions: the CRD is not installed.
    NotInstalled,
    /// Discovery itself failed (the API server unreachable, forbidden).
    Failed(String),
}

/// The version of `kind` the cluster serves, newest first; None when it
/// serves none (the CRD is not installed).
pub async fn served_version(
    client: &Client,
    kind: &Kind,
) -> Result<Option<&'static str>, kube::Error> {
    for v in kind.versions {
        match client
            .list_api_group_resources(&format!("{}/{v}", kind.group))
            .await
        {
            Ok(list) if list.resources.iter().any(|r| r.name == kind.plural) => return Ok(Some(v)),
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// An object as the types read it.
fn read<K: Resource + serde::de::DeserializeOwned>(mut o: DynamicObject) -> Result<K, Unreadable> {
    o.metadata.managed_fields = None;
    let key = Key::new(
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    );
    o.try_parse::<K>().map_err(|e| Unreadable {
        key,
        error: e.to_string(),
    })
}

fn map_event<A, B>(ev: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

/// A watch of `kind` at whichever version the cluster serves, each object
/// read as `K` and wrapped by `wrap`. Runs on a task of its own, which
/// ends when the stream is dropped.
pub fn versioned<K, M>(
    client: Client,
    kind: Kind,
    wrap: fn(GwEvent<K>) -> M,
) -> BoxStream<'static, M>
where
    K: Resource + serde::de::DeserializeOwned + Send + 'static,
    M: Send + 'static,
{
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tokio::spawn(async move {
        let send = |ev: GwEvent<K>| tx.unbounded_send(wrap(ev)).is_ok();
        let mut confirm = true;
        let mut backoff = Duration::from_millis(500);
        loop {
            let version = match served_version(&client, &kind).await {
                Ok(Some(v)) => v,
                Ok(None) => {
                    if !send(GwEvent::NotInstalled) {
                        return;
                    }
                    let wait = if confirm {
                        NOT_INSTALLED_CONFIRM
                    } else {
                        NOT_INSTALLED_RETRY
                    };
                    confirm = false;
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Err(e) => {
                    if !send(GwEvent::Failed(format!(
                        "discovering {} {}: {e}",
                        kind.group, kind.plural
                    ))) {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            backoff = Duration::from_millis(500);
            confirm = true;
            debug!(kind = kind.kind, version, "watching");
            if !send(GwEvent::Serving(version)) {
                return;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.at(version));
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = events.next().await {
                // The version went away (the CRD was replaced or removed):
                // discovery again.
                if matches!(&ev, Err(e) if crate::is_not_found(e)) {
                    break;
                }
                let ev = ev.map(|e| map_event(e, read::<K>));
                if !send(GwEvent::Watch(ev)) {
                    return;
                }
            }
        }
    });
    rx.boxed()
}

impl<K: Resource> Listed<K> {
    /// An event of a versioned watch: as [`Listed::apply`], except that
    /// an object the types cannot read keeps its last readable copy (in
    /// `bad`, for the caller to report).
    pub fn apply_read(
        &mut self,
        ev: Event<Result<K, Unreadable>>,
        bad: &mut Vec<Unreadable>,
    ) -> Change<K> {
        match ev {
            Event::Apply(Ok(o)) => self.apply(Event::Apply(o)),
            Event::Delete(Ok(o)) => self.apply(Event::Delete(o)),
            Event::Delete(Err(u)) => Change::One(self.items.remove(&u.key), None),
            Event::Apply(Err(u)) => {
                bad.push(u);
                Change::None
            }
            Event::Init => self.apply(Event::Init),
            Event::InitApply(Ok(o)) => self.apply(Event::InitApply(o)),
            Event::InitApply(Err(u)) => {
                if let Some(old) = self.items.get(&u.key).cloned() {
                    self.relisting
                        .get_or_insert_with(HashMap::new)
                        .insert(u.key.clone(), old);
                }
                bad.push(u);
                Change::None
            }
            Event::InitDone => self.apply(Event::InitDone),
        }
    }
}
