//! install, upgrade, uninstall: helm for the release, the Kubernetes API
//! for what Helm leaves undone (it never updates nor removes CRDs, does
//! not delete the namespace it created, and knows nothing of the Leases
//! Rivora's components create at run time).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ApiResource;
use kube::Client;
use serde_json::{json, Value};

use crate::chart::{self, Channel};
use crate::helm::{Helm, HelmError};
use crate::names;
use crate::status::{self, Status};

/// Where and as whom: the user's kubeconfig and context, the release.
pub struct Cluster {
    pub client: Client,
    pub namespace: String,
    pub release: String,
}

/// A client from `kubeconfig` (else `$KUBECONFIG`, else ~/.kube/config)
/// and `context` (else its current context); with neither given, also
/// the in-cluster service account.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client> {
    let opts = KubeConfigOptions {
        context: context.map(String::from),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(p) => {
            let kc = Kubeconfig::read_from(p)
                .with_context(|| format!("reading the kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("the kubeconfig {}", p.display()))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&opts)
            .await
            .context("the kubeconfig ($KUBECONFIG or ~/.kube/config)")?,
        None => kube::Config::infer()
            .await
            .context("no Kubernetes credentials: pass --kubeconfig FILE or set $KUBECONFIG")?,
    };
    Client::try_from(config).context("building the Kubernetes client")
}

/// What install and upgrade pass to helm, in helm's order: value files,
/// then each `--set`, then what the flags say.
#[derive(Debug, Default, Clone)]
pub struct Values {
    pub files: Vec<PathBuf>,
    pub sets: Vec<String>,
    /// `--mode`: announce.mode.
    pub mode: Option<String>,
    /// `--gateway-api-crds`.
    pub gateway_api: Option<Channel>,
}

impl Values {
    fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        for f in &self.files {
            a.push("--values".into());
            a.push(f.clone().into());
        }
        for s in &self.sets {
            a.push("--set".into());
            a.push(s.into());
        }
        if let Some(m) = &self.mode {
            a.push("--set".into());
            a.push(format!("announce.mode={m}").into());
        }
        if let Some(c) = self.gateway_api {
            a.push("--set".into());
            a.push(format!("gatewayAPI.crds.{}=true", c.as_str()).into());
        }
        a
    }
}

/// The chart, written out for one helm command.
fn chart_dir() -> Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("rivora-chart-")
        .tempdir()
        .context("a temporary directory for the chart")?;
    chart::write_to(dir.path()).context("writing the embedded chart")?;
    Ok(dir)
}

fn owner(c: &Cluster) -> String {
    format!("{}/{}", c.namespace, c.release)
}

fn crd_value(yaml: &str) -> Result<Value> {
    serde_yaml_ng::from_str(yaml).context("an embedded CRD")
}

/// The chart's CRDs for this install: Rivora's, and the Gateway API
/// channel's if one is asked for. (name, YAML)
fn chart_crds(gateway_api: Option<Channel>) -> Vec<(String, &'static str)> {
    let mut files = chart::rivora_crd_files();
    if let Some(ch) = gateway_api {
        files.extend(chart::gateway_api_crd_files(ch));
    }
    files
        .into_iter()
        .map(|(_, y)| (chart::crd_name(y), y))
        .collect()
}

/// Every Gateway API CRD name the chart knows (both channels name the
/// same five).
pub fn gateway_api_crd_names() -> Vec<String> {
    chart::gateway_api_crd_files(Channel::Standard)
        .into_iter()
        .map(|(_, y)| chart::crd_name(y))
        .collect()
}

pub fn rivora_crd_names() -> Vec<String> {
    chart::rivora_crd_files()
        .into_iter()
        .map(|(_, y)| chart::crd_name(y))
        .collect()
}

async fn existing_crds(client: &Client, names: &[String]) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut out = Vec::new();
    for n in names {
        if api
            .get_opt(n)
            .await
            .with_context(|| format!("reading CRD {n}"))?
            .is_some()
        {
            out.push(n.clone());
        }
    }
    Ok(out)
}

async fn mark_installed_by(client: &Client, name: &str, owner: &str) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch = json!({ "metadata": { "annotations": { names::INSTALLED_BY: owner } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating CRD {name}"))?;
    Ok(())
}

async fn wait_established(client: &Client, name: &str, timeout: Duration) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(c) = api.get_opt(name).await? {
            if status::crd(name, Some(&c)).ready {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("CRD {name} not established within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Create or update the chart's CRDs that this release owns (or that do
/// not exist yet, which it then owns), server-side, as field manager
/// `rivora`. Helm installs crds/ only when absent and never updates them:
/// this is what makes a new chart version's schema reach the cluster.
/// A CRD someone else installed (no `installed-by` of this release) is
/// left as it is.
async fn apply_crds(
    c: &Cluster,
    crds: &[(String, &str)],
    timeout: Duration,
) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let me = owner(c);
    let mut done = Vec::new();
    for (name, yaml) in crds {
        let current = api.get_opt(name).await?;
        let ours = match &current {
            None => true,
            Some(crd) => crd
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::INSTALLED_BY))
                .is_some_and(|o| *o == me),
        };
        if !ours {
            continue;
        }
        let mut v = crd_value(yaml)?;
        v["metadata"]["annotations"][names::INSTALLED_BY] = json!(me);
        api.patch(
            name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(&v),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
        wait_established(&c.client, name, timeout).await?;
        done.push(name.clone());
    }
    Ok(done)
}

pub struct InstallOptions {
    pub values: Values,
    pub wait: bool,
    pub timeout: Duration,
}

/// `rivora install`: the namespace (created, and marked, if absent), the
/// release, then the CRDs Helm created marked as this release's.
pub async fn install(c: &Cluster, helm: &Helm, o: &InstallOptions) -> Result<String> {
    let dir = chart_dir()?;
    check_values(c, helm, dir.path(), &o.values).await?;
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    let created_ns = if namespaces.get_opt(&c.namespace).await?.is_none() {
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {
                "name": c.namespace,
                "labels": {
                    names::CREATED_BY: c.release,
                    // hostNetwork and hostPath: the privileged level.
                    "pod-security.kubernetes.io/enforce": "privileged",
                },
            },
        }))?;
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {}", c.namespace))?;
        true
    } else {
        false
    };
    let crds = chart_crds(o.values.gateway_api);
    let names: Vec<String> = crds.iter().map(|(n, _)| n.clone()).collect();
    let before = existing_crds(&c.client, &names).await?;
    let mut args: Vec<OsString> = vec![
        "install".into(),
        c.release.clone().into(),
        dir.path().into(),
    ];
    args.extend(o.values.args());
    let out = match helm.run(&args) {
        Ok(out) => out,
        Err(e) => {
            // Leave nothing of a failed install: Helm may have created
            // CRDs before it failed, and does not take them back.
            let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
            for n in existing_crds(&c.client, &names).await.unwrap_or_default() {
                if !before.contains(&n) {
                    let _ = api.delete(&n, &DeleteParams::default()).await;
                }
            }
            if created_ns {
                let _ = namespaces
                    .delete(&c.namespace, &DeleteParams::default())
                    .await;
            }
            return Err(match e {
                HelmError::Failed { stderr, .. } if stderr.contains("cannot re-use a name") => {
                    anyhow!(
                    "release {} is already installed in {}: `rivora upgrade` changes it ({stderr})",
                    c.release,
                    c.namespace
                )
                }
                e => e.into(),
            });
        }
    };
    let after = existing_crds(&c.client, &names).await?;
    for n in after.iter().filter(|n| !before.contains(n)) {
        mark_installed_by(&c.client, n, &owner(c)).await?;
    }
    let mut report = out;
    if o.wait {
        let st = wait_ready(c, o.timeout).await?;
        report += "\n";
        report += &status::table(&st);
        if !st.ready {
            bail!("{report}\nnot ready within {:?}", o.timeout);
        }
    }
    Ok(report)
}

/// Render the chart with `values` locally (`helm template`): a value the
/// schema refuses, or a template that fails, stops here, before anything
/// in the cluster is touched (`helm install` creates the CRDs first).
/// The cluster's Kubernetes version is given to helm: its own default
/// is the version it was built against, which the chart's `kubeVersion`
/// may refuse when the cluster would not.
async fn check_values(c: &Cluster, helm: &Helm, dir: &Path, values: &Values) -> Result<()> {
    let mut args: Vec<OsString> = vec!["template".into(), c.release.clone().into(), dir.into()];
    let version = c
        .client
        .apiserver_version()
        .await
        .context("asking the API server its version")?;
    args.push("--kube-version".into());
    args.push(version.git_version.into());
    args.extend(values.args());
    match helm.run(&args) {
        Ok(_) => Ok(()),
        Err(HelmError::Failed { stderr, .. }) => bail!("the chart refuses these values: {stderr}"),
        Err(e) => Err(e.into()),
    }
}

pub struct UpgradeOptions {
    pub values: Values,
    /// Start from the chart's defaults instead of the values given before.
    pub reset_values: bool,
    pub wait: bool,
    pub timeout: Duration,
}

/// `rivora upgrade`: the CRDs this release owns updated to the embedded
/// chart's (and any it asks for created), then `helm upgrade` keeping the
/// values given before unless `--reset-values`.
pub async fn upgrade(c: &Cluster, helm: &Helm, o: &UpgradeOptions) -> Result<String> {
    let dir = chart_dir()?;
    helm.run(&["status".into(), c.release.clone().into()])
        .map_err(|e| {
            anyhow!(
                "no release {} in namespace {} ({e}): `rivora install` first",
                c.release,
                c.namespace
            )
        })?;
    // The new values alone (those kept from before were checked then).
    check_values(c, helm, dir.path(), &o.values).await?;
    let mut crds = chart_crds(o.values.gateway_api);
    // Gateway API CRDs an earlier install created, at their channel.
    let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let me = owner(c);
    for n in gateway_api_crd_names() {
        if crds.iter().any(|(x, _)| *x == n) {
            continue;
        }
        if let Some(crd) = api.get_opt(&n).await? {
            let ann = crd.metadata.annotations.unwrap_or_default();
            if ann.get(names::INSTALLED_BY) != Some(&me) {
                continue;
            }
            let ch = match ann
                .get("gateway.networking.k8s.io/channel")
                .map(String::as_str)
            {
                Some("experimental") => Channel::Experimental,
                _ => Channel::Standard,
            };
            if let Some((_, y)) = chart::gateway_api_crd_files(ch)
                .into_iter()
                .find(|(_, y)| chart::crd_name(y) == n)
            {
                crds.push((n, y));
            }
        }
    }
    let applied = apply_crds(c, &crds, o.timeout).await?;
    let mut args: Vec<OsString> = vec![
        "upgrade".into(),
        c.release.clone().into(),
        dir.path().into(),
    ];
    args.push(if o.reset_values {
        "--reset-values".into()
    } else {
        "--reset-then-reuse-values".into()
    });
    args.extend(o.values.args());
    let mut report = format!("CRDs applied: {}\n", applied.join(", "));
    report += &helm.run(&args)?;
    if o.wait {
        let st = wait_ready(c, o.timeout).await?;
        report += "\n";
        report += &status::table(&st);
        if !st.ready {
            bail!("{report}\nnot ready within {:?}", o.timeout);
        }
    }
    Ok(report)
}

pub struct UninstallOptions {
    pub keep_crds: bool,
    pub timeout: Duration,
}

/// `rivora uninstall`: the release, the Leases and BGPNodeStatuses Rivora's
/// components created, the CRDs this release installed (and with them every
/// AddressPool, ServicePolicy, ...) unless `keep_crds`, and the namespace
/// if `rivora install` created it. Says what it removed and what it kept.
pub async fn uninstall(c: &Cluster, helm: &Helm, o: &UninstallOptions) -> Result<String> {
    let mut report = String::new();
    match helm.run(&["uninstall".into(), c.release.clone().into()]) {
        Ok(_) => report += &format!("removed release {} from {}\n", c.release, c.namespace),
        Err(HelmError::Failed { stderr, .. }) if stderr.contains("not found") => {
            bail!(
                "no release {} in namespace {}: {stderr}",
                c.release,
                c.namespace
            )
        }
        Err(e) => return Err(e.into()),
    }
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &c.namespace);
    for l in leases.list(&ListParams::default()).await?.items {
        let n = l.metadata.name.unwrap_or_default();
        // The controller's leader Lease and the L2 speaker's.
        if n == names::CONTROLLER || n.starts_with("rivora-l2-") {
            leases.delete(&n, &DeleteParams::default()).await?;
            report += &format!("removed Lease {n}\n");
        }
    }
    // Each node's rivorad writes its BGPNodeStatus (mode bgp): run-time
    // state of the release's, like the Leases, whether the CRD stays or
    // goes. The BGPPeers are the user's.
    let statuses: Api<DynamicObject> = Api::all_with(
        c.client.clone(),
        &ApiResource {
            group: "rivora.io".into(),
            version: "v1alpha1".into(),
            api_version: "rivora.io/v1alpha1".into(),
            kind: "BGPNodeStatus".into(),
            plural: "bgpnodestatuses".into(),
        },
    );
    match statuses.list(&ListParams::default()).await {
        Ok(list) => {
            for o in list.items {
                let n = o.metadata.name.unwrap_or_default();
                statuses.delete(&n, &DeleteParams::default()).await?;
                report += &format!("removed BGPNodeStatus {n}\n");
            }
        }
        // No such CRD: nothing was written.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let me = owner(c);
    let mut ours = Vec::new();
    let chart_crds: Vec<String> = rivora_crd_names()
        .into_iter()
        .chain(gateway_api_crd_names())
        .collect();
    for crd in api.list(&ListParams::default()).await?.items {
        let n = crd.metadata.name.clone().unwrap_or_default();
        let owned = crd
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::INSTALLED_BY))
            .is_some_and(|o| *o == me);
        if owned && !o.keep_crds {
            ours.push(n);
        } else if owned {
            report += &format!("kept CRD {n} (--keep-crds)\n");
        } else if chart_crds.contains(&n) {
            report += &format!("kept CRD {n}: not installed by this release\n");
        }
    }
    for n in &ours {
        api.delete(n, &DeleteParams::default()).await?;
    }
    let deadline = Instant::now() + o.timeout;
    for n in &ours {
        while api.get_opt(n).await?.is_some() {
            if Instant::now() > deadline {
                bail!("{report}CRD {n} still deleting after {:?}", o.timeout);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        report += &format!("removed CRD {n} (and its objects)\n");
    }
    let namespaces: Api<Namespace> = Api::all(c.client.clone());
    if let Some(ns) = namespaces.get_opt(&c.namespace).await? {
        let labels: BTreeMap<String, String> = ns.metadata.labels.unwrap_or_default();
        if labels.get(names::CREATED_BY) == Some(&c.release) {
            namespaces
                .delete(&c.namespace, &DeleteParams::default())
                .await?;
            report += &format!(
                "removed namespace {} (rivora install created it)\n",
                c.namespace
            );
        }
    }
    Ok(report)
}

/// Poll [`status`] until all is ready or `timeout` passes; the last status
/// either way.
pub async fn wait_ready(c: &Cluster, timeout: Duration) -> Result<Status> {
    let deadline = Instant::now() + timeout;
    loop {
        let st = current_status(c).await?;
        if st.ready || Instant::now() >= deadline {
            return Ok(st);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

pub async fn current_status(c: &Cluster) -> Result<Status> {
    let objects = status::gather(
        &c.client,
        &c.namespace,
        &c.release,
        &rivora_crd_names(),
        &gateway_api_crd_names(),
    )
    .await
    .context("reading Rivora's objects")?;
    Ok(status::assess(&c.namespace, &objects, Timestamp::now()))
}
