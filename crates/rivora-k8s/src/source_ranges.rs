//! Which clients a VIP admits, from Kubernetes: a Service's
//! `spec.loadBalancerSourceRanges` (or, when that is empty, the older
//! `service.beta.kubernetes.io/load-balancer-source-ranges` annotation, as
//! cloud providers read it), else its ServicePolicy's `sourceRanges`; a
//! Gateway listener's from its ServicePolicy. Host bits are cleared as
//! kube-proxy clears them. An entry that is no prefix admits nobody and
//! is named in a Warning; the rest of the list still restricts the VIP:
//! a restriction never fails open.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use rivora_model::source_range::SourceRange;

use crate::policy::ServicePolicy;
use crate::translate::Warning;

pub const SOURCE_RANGES_ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
pub const WARN_INVALID_SOURCE_RANGE: &str = "InvalidSourceRange";

/// The ranges `entries` name (None when there are none: every client is
/// admitted), and a Warning for each entry that is not a prefix.
fn read<'a>(
    field: &str,
    entries: impl IntoIterator<Item = &'a str>,
    warnings: &mut Vec<Warning>,
) -> Option<Vec<SourceRange>> {
    let mut out = Vec::new();
    let mut any = false;
    for (i, e) in entries.into_iter().enumerate() {
        any = true;
        match SourceRange::parse_lenient(e) {
            Ok(r) if !out.contains(&r) => out.push(r),
            Ok(_) => {}
            Err(err) => warnings.push(Warning {
                reason: WARN_INVALID_SOURCE_RANGE,
                message: format!("{field}[{i}]: {err}: it admits no client"),
            }),
        }
    }
    any.then_some(out)
}

/// A ServicePolicy's ranges, whether the rest of it applies or not.
pub fn policy_ranges(p: &ServicePolicy, warnings: &mut Vec<Warning>) -> Option<Vec<SourceRange>> {
    read(
        &format!("ServicePolicy {} sourceRanges", p.name_any()),
        p.spec.source_ranges.iter().map(String::as_str),
        warnings,
    )
}

/// A Service's ranges: its own, else its policy's.
pub fn service_ranges(
    svc: &Service,
    policy: Option<&ServicePolicy>,
    warnings: &mut Vec<Warning>,
) -> Option<Vec<SourceRange>> {
    let spec = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.as_deref())
        .unwrap_or(&[]);
    let own = if !spec.is_empty() {
        read(
            "spec.loadBalancerSourceRanges",
            spec.iter().map(String::as_str),
            warnings,
        )
    } else {
        svc.annotations()
            .get(SOURCE_RANGES_ANNOTATION)
            .and_then(|a| {
                read(
                    &format!("annotation {SOURCE_RANGES_ANNOTATION}"),
                    a.split(',').map(str::trim).filter(|s| !s.is_empty()),
                    warnings,
                )
            })
    };
    let from_policy = policy.and_then(|p| policy_ranges(p, warnings));
    match (own, from_policy, policy) {
        (Some(own), Some(_), Some(p)) => {
            warnings.push(Warning {
                reason: WARN_INVALID_SOURCE_RANGE,
                message: format!(
                    "ServicePolicy {}'s sourceRanges are not used: the Service's own loadBalancerSourceRanges win",
                    p.name_any()
                ),
            });
            Some(own)
        }
        (Some(own), _, _) => Some(own),
        (None, theirs, _) => theirs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ServicePolicySpec;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use std::collections::BTreeMap;

    fn svc(ranges: &[&str], annotation: Option<&str>) -> Service {
        let mut s = Service {
            spec: Some(ServiceSpec {
                load_balancer_source_ranges: (!ranges.is_empty())
                    .then(|| ranges.iter().map(|r| r.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        s.metadata.name = Some("web".into());
        if let Some(a) = annotation {
            s.metadata.annotations = Some(BTreeMap::from([(
                SOURCE_RANGES_ANNOTATION.to_string(),
                a.to_string(),
            )]));
        }
        s
    }

    fn policy(ranges: &[&str]) -> ServicePolicy {
        let mut spec: ServicePolicySpec =
            serde_json::from_value(serde_json::json!({"services": ["web"]})).unwrap();
        spec.source_ranges = ranges.iter().map(|r| r.to_string()).collect();
        ServicePolicy::new("pol", spec)
    }

    fn strs(r: Option<Vec<SourceRange>>) -> Option<Vec<String>> {
        r.map(|v| v.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn none_listed_admits_everyone() {
        let mut w = Vec::new();
        assert_eq!(service_ranges(&svc(&[], None), None, &mut w), None);
        assert_eq!(
            service_ranges(&svc(&[], Some(" , ")), Some(&policy(&[])), &mut w),
            None
        );
        assert!(w.is_empty());
    }

    #[test]
    fn the_spec_wins_then_the_annotation_then_the_policy() {
        let mut w = Vec::new();
        let s = svc(&["10.1.2.3/16", "fd00::/64"], Some("192.0.2.0/24"));
        assert_eq!(
            strs(service_ranges(&s, None, &mut w)),
            Some(vec!["10.1.0.0/16".into(), "fd00::/64".into()])
        );
        let s = svc(&[], Some("192.0.2.0/24, 198.51.100.0/24"));
        assert_eq!(
            strs(service_ranges(&s, Some(&policy(&["10.0.0.0/8"])), &mut w)),
            Some(vec!["192.0.2.0/24".into(), "198.51.100.0/24".into()])
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].message.contains("not used"), "{w:?}");
        let mut w = Vec::new();
        assert_eq!(
            strs(service_ranges(
                &svc(&[], None),
                Some(&policy(&["10.0.0.0/8"])),
                &mut w
            )),
            Some(vec!["10.0.0.0/8".into()])
        );
        assert!(w.is_empty());
    }

    #[test]
    fn a_bad_entry_is_named_and_never_opens_the_vip() {
        let mut w = Vec::new();
        let s = svc(&[], Some("10.0.0.0/8,nonsense"));
        assert_eq!(
            strs(service_ranges(&s, None, &mut w)),
            Some(vec!["10.0.0.0/8".into()])
        );
        assert_eq!(w.len(), 1);
        assert!(
            w[0].message.contains("[1]") && w[0].message.contains("nonsense"),
            "{}",
            w[0].message
        );
        // Every entry bad: restricted to nobody, not open.
        let mut w = Vec::new();
        assert_eq!(
            strs(service_ranges(&svc(&[], Some("x/8")), None, &mut w)),
            Some(vec![])
        );
        assert_eq!(w.len(), 1);
    }
}
