//! `BGPPeer` (rivora.io/v1alpha1, cluster-scoped): a BGP session that the
//! nodes its selector picks open to a router; and `BGPNodeStatus`
//! (cluster-scoped, one per node, named after it): the sessions that
//! node's rivorad runs, written by that rivorad alone.
//!
//! Why a node status object rather than the BGPPeer's status: a BGPPeer
//! selects many nodes; with the sessions in its status every node would
//! write the same object (conflicting updates, each write fanned out to
//! every watcher of BGPPeers). One object per node has one writer, shows
//! a node's sessions together (`kubectl get bgpnodestatus NODE -o yaml`),
//! and goes with the node's name.
//!
//! The peer fields are the static file's `bgp.peers[]` keys, spelled
//! alike and checked by the same validator
//! ([`rivora_model::config::bgp::validate`]), so a peer means the same in
//! a file and in the cluster. The node's own AS and router ID are node
//! settings (the node file's `bgp` section); a password comes from a
//! Secret rather than a file.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use kube::{CustomResource, KubeSchema};
use rivora_model::config::bgp::{self as model, BgpConf, PeerConf, PeerSettings};
use schemars::transform::RecursiveTransform;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// A BGP session each selected node opens to a router.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rivora.io",
    version = "v1alpha1",
    kind = "BGPPeer",
    root = "BgpPeer",
    plural = "bgppeers",
    shortname = "bgppeer",
    category = "rivora",
    doc = "A BGP session that every node the selector picks opens to a router, to announce the VIPs it can serve.",
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"ASN","type":"integer","jsonPath":".spec.asn"}"#,
    printcolumn = r#"{"name":"BFD","type":"boolean","jsonPath":".spec.bfd.enabled","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = RecursiveTransform(kubernetes_shapes))]
pub struct BgpPeerSpec {
    /// The router's address (IPv4 or IPv6).
    #[schemars(length(min = 2, max = 45))]
    pub address: String,
    /// The router's AS (4-byte ASNs welcome; not 0 or 23456).
    #[schemars(range(min = 1, max = 4_294_967_295u64))]
    pub asn: u64,
    /// The nodes (by their labels) that open this session. Absent or
    /// empty: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// The router's port (179).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u64>,
    /// Wait for the router to connect.
    #[serde(default, skip_serializing_if = "is_false")]
    pub passive: bool,
    /// Hold time offered: `0s` or `3s` to `65535s` (default 90s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_time: Option<DurationString>,
    /// Connect retry (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_retry: Option<DurationString>,
    /// The TCP MD5 password (RFC 2385), from a Secret's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    /// `ipv4`, `ipv6`; default: the address's family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2))]
    pub families: Option<Vec<String>>,
    /// Next hop of IPv6 routes over an IPv4 session (and the reverse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_ipv4: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_ipv6: Option<String>,
    /// Graceful restart (RFC 4724; default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_restart: Option<bool>,
    /// Single-hop BFD (RFC 5880/5881) on this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<BfdSpec>,
    /// Communities on every route to this router (`65000:100`,
    /// `no-export`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub communities: Vec<String>,
    /// Large communities (`4200000001:1:2`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub large_communities: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4_294_967_295u64))]
    pub local_pref: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4_294_967_295u64))]
    pub med: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A duration as the file writes it: `9s`, `300ms`, `1m`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(transparent)]
pub struct DurationString(pub String);

impl JsonSchema for DurationString {
    fn schema_name() -> Cow<'static, str> {
        "DurationString".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A duration: 9s, 300ms, 1m.",
            "maxLength": 32,
            "pattern": r"^([0-9]+(ns|us|ms|s|m|h) ?)+$",
        })
    }
}

/// A key of a Secret: its value is the password.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Default `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl SecretKeyRef {
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or("password")
    }
}

/// BFD on the session: on with 300 ms x 3 unless the intervals are given.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BfdSpec {
    /// Default true when the block is present.
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rx: Option<DurationString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tx: Option<DurationString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 255))]
    pub multiplier: Option<u64>,
}

fn yes() -> bool {
    true
}

/// The sessions of one node, written by that node's rivorad.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "rivora.io",
    version = "v1alpha1",
    kind = "BGPNodeStatus",
    root = "BgpNodeStatus",
    plural = "bgpnodestatuses",
    shortname = "bgpnode",
    category = "rivora",
    status = "BgpNodeStatusStatus",
    doc = "The BGP sessions of one node (named after it), written by that node's rivorad only.",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"Sessions","type":"integer","jsonPath":".status.sessionCount"}"#,
    printcolumn = r#"{"name":"Established","type":"integer","jsonPath":".status.establishedCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = RecursiveTransform(kubernetes_shapes))]
pub struct BgpNodeStatusSpec {
    /// The node whose sessions these are (also the object's name).
    pub node_name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = RecursiveTransform(kubernetes_shapes))]
pub struct BgpNodeStatusStatus {
    pub session_count: u64,
    pub established_count: u64,
    #[serde(default)]
    pub sessions: Vec<BgpSessionStatus>,
    /// BGPPeers that select this node but could not be used (a bad
    /// field, a missing Secret), with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedPeer>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpSessionStatus {
    /// The BGPPeer's name, or the file's peer name.
    pub name: String,
    pub address: String,
    pub asn: u64,
    /// `Idle`, `Connect`, `Active`, `OpenSent`, `OpenConfirm`,
    /// `Established`.
    pub state: String,
    /// RFC 3339, when it last became Established.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub established_since: Option<String>,
    pub flaps: u64,
    /// Routes the peer holds from this node.
    pub advertised: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefusedPeer {
    pub name: String,
    pub reason: String,
}

/// Integer formats the API server knows (schemars writes `uint64`).
fn kubernetes_shapes(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(serde_json::Value::String(f)) = obj.get("format") {
        if f.starts_with("uint") {
            obj.insert("format".into(), serde_json::Value::String("int64".into()));
        }
    }
}

/// Why a BGPPeer that selects a node cannot be used there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error("nodeSelector: {0}")]
    Selector(String),
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    #[error("the password Secret {namespace}/{name} has no key {key:?}")]
    NoSecretKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("the password in Secret {namespace}/{name} key {key:?} is empty or over 80 bytes")]
    BadPassword {
        namespace: String,
        name: String,
        key: String,
    },
}

impl BgpPeerSpec {
    /// Whether a node with `labels` opens this session.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> Result<bool, PeerError> {
        match &self.node_selector {
            None => Ok(true),
            Some(sel) => {
                let s: Selector =
                    sel.clone()
                        .try_into()
                        .map_err(|e: kube::core::ParseExpressionError| {
                            PeerError::Selector(e.to_string())
                        })?;
                Ok(s.matches(labels))
            }
        }
    }

    /// The peer as the speaker takes it: the file's validator run on the
    /// same fields (`local_asn` is the node's, which the check of an
    /// iBGP-only field needs), then the Secret's password.
    pub fn settings(
        &self,
        name: &str,
        local_asn: u32,
        password: Option<&[u8]>,
    ) -> Result<PeerSettings, PeerError> {
        let mut v = serde_json::to_value(self).map_err(|e| PeerError::Field {
            field: "spec".into(),
            message: e.to_string(),
        })?;
        if let Some(o) = v.as_object_mut() {
            o.remove("nodeSelector");
            o.remove("passwordSecretRef");
            if let Some(bfd) = o.remove("bfd") {
                let enabled = bfd.get("enabled").and_then(|e| e.as_bool()).unwrap_or(true);
                if enabled {
                    let mut b = bfd.clone();
                    if let Some(bo) = b.as_object_mut() {
                        bo.remove("enabled");
                    }
                    o.insert("bfd".into(), b);
                }
            }
            o.insert("name".into(), serde_json::Value::String(name.to_string()));
        }
        let peer: PeerConf = serde_json::from_value(v).map_err(|e| PeerError::Field {
            field: "spec".into(),
            message: e.to_string(),
        })?;
        let conf = BgpConf {
            asn: u64::from(local_asn),
            router_id: None,
            listen_port: None,
            restart_time: None,
            peers: vec![peer],
            advertisements: Vec::new(),
        };
        let mut s = model::validate(&conf).map_err(|(field, message)| PeerError::Field {
            field: field.replace("bgp.peers[0]", "spec"),
            message,
        })?;
        let mut p = s.peers.remove(0);
        p.password = password.map(<[u8]>::to_vec);
        Ok(p)
    }
}

/// A password as a Secret holds it: trimmed, 1 to 80 bytes.
pub fn password_of(
    r: &SecretKeyRef,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<u8>, PeerError> {
    let raw = data.get(r.key()).ok_or_else(|| PeerError::NoSecretKey {
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        key: r.key().to_string(),
    })?;
    let key = raw.trim_ascii().to_vec();
    if key.is_empty() || key.len() > model::MAX_PASSWORD {
        return Err(PeerError::BadPassword {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            key: r.key().to_string(),
        });
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> BgpPeerSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_peer_means_what_the_file_says() {
        let s = spec(serde_json::json!({
            "address": "10.0.0.1", "asn": 65000, "holdTime": "9s",
            "bfd": {"minRx": "100ms", "minTx": "100ms", "multiplier": 3},
            "communities": ["65000:100"], "families": ["ipv4", "ipv6"],
            "nextHopIpv6": "fd00::2",
        }));
        let p = s.settings("tor1", 65001, Some(b"pw")).unwrap();
        assert_eq!(p.name, "tor1");
        assert_eq!(p.asn, 65000);
        assert_eq!(p.hold_time, 9);
        assert!(p.ipv4 && p.ipv6);
        assert_eq!(p.bfd.unwrap().min_rx, std::time::Duration::from_millis(100));
        assert_eq!(p.policy.communities, vec![(65000 << 16) | 100]);
        assert_eq!(p.password.as_deref(), Some(&b"pw"[..]));
        // BFD off when said so.
        let off = spec(
            serde_json::json!({"address": "10.0.0.1", "asn": 65000, "bfd": {"enabled": false}}),
        );
        assert!(off.settings("x", 65001, None).unwrap().bfd.is_none());
    }

    #[test]
    fn a_bad_field_is_named_as_the_object_spells_it() {
        let s = spec(serde_json::json!({"address": "10.0.0.1", "asn": 65000, "holdTime": "2s"}));
        let e = s.settings("x", 65001, None).unwrap_err().to_string();
        assert!(e.starts_with("spec.holdTime:"), "{e}");
        let s = spec(serde_json::json!({"address": "nope", "asn": 65000}));
        assert!(s
            .settings("x", 65001, None)
            .unwrap_err()
            .to_string()
            .starts_with("spec.address:"));
    }

    #[test]
    fn the_selector_picks_nodes_by_label() {
        let s = spec(serde_json::json!({"address": "10.0.0.1", "asn": 65000,
            "nodeSelector": {"matchLabels": {"rack": "r1"}}}));
        let mut labels = BTreeMap::new();
        assert!(!s.selects(&labels).unwrap());
        labels.insert("rack".to_string(), "r1".to_string());
        assert!(s.selects(&labels).unwrap());
        let all = spec(serde_json::json!({"address": "10.0.0.1", "asn": 65000}));
        assert!(all.selects(&BTreeMap::new()).unwrap());
    }

    #[test]
    fn passwords_come_trimmed_from_the_secret_key() {
        let r = SecretKeyRef {
            name: "s".into(),
            namespace: "n".into(),
            key: None,
        };
        let mut data = BTreeMap::new();
        assert!(password_of(&r, &data).is_err());
        data.insert("password".to_string(), b" pw\n".to_vec());
        assert_eq!(password_of(&r, &data).unwrap(), b"pw");
        data.insert("password".to_string(), vec![b'x'; 81]);
        assert!(password_of(&r, &data).is_err());
    }
}
