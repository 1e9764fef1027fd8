//! What a stopping rivorad does with its datapath under Kubernetes. With
//! `-persist-datapath` the links stay pinned, so that the next pod of the
//! DaemonSet takes over without dropping a packet: right for an upgrade or
//! a restart. But when the DaemonSet is gone (`helm uninstall`,
//! `rivora uninstall`) or no longer selects this node, no next pod is
//! coming, and a datapath left behind would forward old VIPs to pod
//! addresses that get reused, someone else's pods. Asked of the API server
//! at SIGTERM; when it cannot answer, the datapath stays (dropping every
//! connection on a guess is worse) and the log says how to remove it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

/// What becomes of the datapath, and why (for the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leaving {
    /// Another rivorad of the DaemonSet comes: the links stay.
    Keep(String),
    /// None comes: detach and unpin everything, as `rivorad -cleanup`.
    Remove(String),
}

/// The DaemonSet as `namespace/name` (`-owner-daemonset`).
pub fn parse_owner(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!(
            "{s:?} is not NAMESPACE/NAME (the DaemonSet rivorad runs in)"
        )),
    }
}

/// The rule, from what the API server said: the DaemonSet (None: not
/// found) and this node's labels (None: the node is gone).
pub fn decide(
    owner: &str,
    ds: Option<&DaemonSet>,
    node: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Leaving {
    let Some(ds) = ds else {
        return Leaving::Remove(format!("DaemonSet {owner} is gone: uninstalled"));
    };
    if ds.metadata.deletion_timestamp.is_some() {
        return Leaving::Remove(format!("DaemonSet {owner} is being deleted: uninstalled"));
    }
    let Some(labels) = labels else {
        return Leaving::Remove(format!("node {node} is gone"));
    };
    let selector = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.node_selector.as_ref());
    if let Some((k, v)) = selector
        .into_iter()
        .flatten()
        .find(|(k, v)| labels.get(*k) != Some(*v))
    {
        return Leaving::Remove(format!(
            "DaemonSet {owner} no longer selects node {node} (nodeSelector {k}={v})"
        ));
    }
    Leaving::Keep(format!(
        "DaemonSet {owner} still runs on node {node}: its next rivorad takes the datapath over"
    ))
}

/// Ask the API server, within `wait`.
pub async fn ask(client: Client, owner: &str, node: &str, wait: Duration) -> Leaving {
    let Ok((ns, name)) = parse_owner(owner) else {
        return Leaving::Keep(format!("-owner-daemonset {owner:?} is no DaemonSet"));
    };
    let asked = async {
        let ds = Api::<DaemonSet>::namespaced(client.clone(), &ns)
            .get_opt(&name)
            .await?;
        let node = Api::<Node>::all(client).get_opt(node).await?;
        Ok::<_, kube::Error>((ds, node.map(|n| n.metadata.labels.unwrap_or_default())))
    };
    match tokio::time::timeout(wait, asked).await {
        Ok(Ok((ds, labels))) => decide(owner, ds.as_ref(), node, labels.as_ref()),
        Ok(Err(e)) => Leaving::Keep(format!(
            "the API server did not say whether DaemonSet {owner} goes on ({e}): keeping the datapath; `rivorad -cleanup` removes it"
        )),
        Err(_) => Leaving::Keep(format!(
            "the API server did not answer within {wait:?} whether DaemonSet {owner} goes on: keeping the datapath; `rivorad -cleanup` removes it"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(selector: &[(&str, &str)]) -> DaemonSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "rivora-rivorad", "namespace": "rivora-system"},
            "spec": {
                "selector": {"matchLabels": {"app": "x"}},
                "template": {"spec": {
                    "containers": [],
                    "nodeSelector": selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
                }},
            },
        }))
        .unwrap()
    }

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_a_daemonset_that_goes_on_here_keeps_the_datapath() {
        let o = "rivora-system/rivora-rivorad";
        let lb = [("lb", "yes")];
        assert!(matches!(
            decide(
                o,
                Some(&ds(&lb)),
                "n1",
                Some(&labels(&[("lb", "yes"), ("x", "y")]))
            ),
            Leaving::Keep(_)
        ));
        assert!(matches!(
            decide(o, Some(&ds(&[])), "n1", Some(&labels(&[]))),
            Leaving::Keep(_)
        ));
        let gone = decide(o, None, "n1", Some(&labels(&[])));
        assert_eq!(
            gone,
            Leaving::Remove("DaemonSet rivora-system/rivora-rivorad is gone: uninstalled".into())
        );
        let mut deleting = ds(&[]);
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert!(matches!(
            decide(o, Some(&deleting), "n1", Some(&labels(&[]))),
            Leaving::Remove(m) if m.contains("being deleted")
        ));
        match decide(o, Some(&ds(&lb)), "n1", Some(&labels(&[("lb", "no")]))) {
            Leaving::Remove(m) => assert!(
                m.contains("no longer selects node n1 (nodeSelector lb=yes)"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decide(o, Some(&ds(&[])), "n1", None),
            Leaving::Remove(_)
        ));
    }

    #[test]
    fn the_owner_is_namespace_slash_name() {
        assert_eq!(parse_owner("a/b"), Ok(("a".into(), "b".into())));
        for bad in ["a", "/b", "a/", "a/b/c", ""] {
            assert!(parse_owner(bad).is_err(), "{bad}");
        }
    }
}
