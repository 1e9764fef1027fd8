//! ServicePolicy status (`Accepted`, `Conflicted`), written by the
//! controller alone: with a writer on every node, nodes that disagree (an
//! `externalTrafficPolicy: Local` Service, whose endpoints differ from
//! node to node, under a mode one node's endpoints cannot take) would
//! write over each other for ever.
//!
//! The answer is the cluster's, not a node's: a policy is refused for a
//! Service when the translation refuses it for any node that has one of
//! its endpoints, or for a node with none (the same rules every rivorad
//! forwards by, [`rivora_k8s::service_vips`]); for a Gateway listener,
//! when the Gateway rules refuse it (node-independent already). An
//! installation answers for the policies that govern one of its own
//! Services or Gateways (its class); a policy that names nothing that
//! exists is the default installation's (one that serves Services of no
//! class too).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use rivora_k8s::gateway::ListenerRef;
use rivora_k8s::policy::{
    choose_policies, merge_condition, policy_conditions, PolicyChoice, PolicyIssue,
};
use rivora_k8s::translate::{is_ours, PolicyUse, SERVICE_NAME_LABEL};
use rivora_k8s::{service_vips, ServicePolicy, ServicePolicyStatus, TranslateOptions};
use rivora_k8s_client::{key_of, Change, Key, Listed};

/// The ServicePolicies and the EndpointSlices their Services' answers
/// read.
#[derive(Default)]
pub struct Policies {
    pub policies: Listed<ServicePolicy>,
    pub slices: Listed<EndpointSlice>,
    /// Service -> its slices.
    slices_of: HashMap<Key, BTreeSet<Key>>,
    /// Which policy applies to what, recomputed when a policy changes.
    pub choice: PolicyChoice,
}

/// The Service an EndpointSlice belongs to.
fn service_of(slice: &EndpointSlice) -> Option<Key> {
    let name = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some(Key::new(
        slice.namespace().unwrap_or_default(),
        name.clone(),
    ))
}

impl Policies {
    pub fn listed(&self) -> bool {
        self.policies.synced && self.slices.synced
    }

    /// A ServicePolicy watch's change applied.
    pub fn policies_changed(&mut self) {
        self.choice = choose_policies(self.policies.items.values().map(|p| &**p));
    }

    /// Keep the Service -> slices index after a slice watch's change.
    pub fn slices_changed(&mut self, change: Change<EndpointSlice>) {
        match change {
            Change::None => {}
            Change::One(old, new) => {
                for (s, present) in [(old, false), (new, true)] {
                    let Some(s) = s else { continue };
                    let Some(svc) = service_of(&s) else { continue };
                    let set = self.slices_of.entry(svc.clone()).or_default();
                    if present {
                        set.insert(key_of(&*s));
                    } else {
                        set.remove(&key_of(&*s));
                        if set.is_empty() {
                            self.slices_of.remove(&svc);
                        }
                    }
                }
            }
            Change::All(_) => {
                self.slices_of.clear();
                for (key, s) in &self.slices.items {
                    if let Some(svc) = service_of(s) {
                        self.slices_of.entry(svc).or_default().insert(key.clone());
                    }
                }
            }
        }
    }

    pub fn slices_for(&self, service: &Key) -> Vec<&EndpointSlice> {
        self.slices_of
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k).map(|s| &**s))
            .collect()
    }

    /// Why the policy that governs `svc` is refused in the cluster, if it
    /// is: by the rules, for any node with one of its endpoints or for a
    /// node with none. The nodes are tried in name order, so the answer
    /// (and its message) is the same whatever the watches' order.
    fn service_issue(
        &self,
        key: &Key,
        svc: &Service,
        opts: &TranslateOptions,
    ) -> Option<PolicyIssue> {
        let policy = self.policies.get(self.choice.policy_for(key)?)?;
        let slices = self.slices_for(key);
        let nodes: BTreeSet<&str> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter_map(|e| e.node_name.as_deref())
            .chain([""])
            .collect();
        nodes.into_iter().find_map(|node| {
            match service_vips(svc, &slices, Some(policy), node, opts).policy {
                PolicyUse::Rejected(issue) => Some(issue),
                _ => None,
            }
        })
    }

    /// The status each policy this installation answers for should have,
    /// where it differs from what the object says: (policy, the version
    /// it was read at, the status). `listeners` are the Gateway rules'
    /// answers for the listeners of this installation's Gateways.
    pub fn updates(
        &self,
        services: &Listed<Service>,
        listeners: &BTreeMap<ListenerRef, PolicyUse>,
        opts: &TranslateOptions,
        now: &Time,
    ) -> Vec<(Key, String, ServicePolicyStatus)> {
        let mut issues: BTreeMap<&Key, PolicyIssue> = BTreeMap::new();
        // Policies that govern one of this installation's objects.
        let mut ours: BTreeSet<&Key> = BTreeSet::new();
        // Policies that name an object that exists (any installation's).
        let mut named: BTreeSet<Key> = BTreeSet::new();
        for (key, svc) in &services.items {
            let Some(p) = self.choice.policy_for(key) else {
                continue;
            };
            named.insert(p.clone());
            if !is_ours(svc, opts) {
                continue;
            }
            ours.insert(p);
            if let Some(issue) = self.service_issue(key, svc, opts) {
                issues.entry(p).or_insert(issue);
            }
        }
        for (l, used) in listeners {
            let Some(p) = self.choice.policy_for_listener(l) else {
                continue;
            };
            named.insert(p.clone());
            ours.insert(p);
            if let PolicyUse::Rejected(issue) = used {
                issues.entry(p).or_insert_with(|| issue.clone());
            }
        }
        let mut out = Vec::new();
        for (key, p) in &self.policies.items {
            let answers = ours.contains(key) || (!named.contains(key) && opts.accept_unset_class);
            if !answers {
                continue;
            }
            let checked = rivora_k8s::policy::check_policy(&p.spec).err();
            let issue = checked.as_ref().or_else(|| issues.get(key));
            let mut conditions = p
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            for c in policy_conditions(p, &self.choice, issue, now) {
                merge_condition(&mut conditions, c);
            }
            let wanted = ServicePolicyStatus { conditions };
            if p.status.as_ref() != Some(&wanted) {
                let rv = p.metadata.resource_version.clone().unwrap_or_default();
                out.push((key.clone(), rv, wanted));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests;
