//! rivora-controller against a real kube-apiserver (the k8s area's, a
//! server of its own), two replicas with the default Lease settings
//! (15 s duration, 10 s renew deadline, 2 s retry period):
//!
//! - `controller_assign_p99_ms_n1000`: 1,000 LoadBalancer Services
//!   created 50 at a time; per Service, from the API server's answer to
//!   its create to its `status.loadBalancer.ingress` seen by a watch of
//!   the bench's own; the p99 (target ≤ 100).
//! - `controller_failover_ms`: SIGKILL of the leader, then a Service
//!   created at once: from the kill to that Service's ingress seen (the
//!   new leader's first write), median of 3 (target ≤ 2 × the renew
//!   deadline, 20 s). The killed replica is started again between rounds,
//!   so two replicas run at every kill.

use std::collections::HashMap;
use std::fs::{self, File};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::Client;
use nix::sys::signal::Signal;

use crate::k8s::{client, install_crd, runtime, start_api_server};
use crate::{median, signal_child, Results};

const NS: &str = "bench-ctl";
const SERVICES: usize = 1000;
const AT_ONCE: usize = 50;
const ROUNDS: usize = 3;
const LEASE: &str = "rivora-controller";
const RENEW_DEADLINE: Duration = Duration::from_secs(10);

fn controller_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating rivora-bench")?;
    let bin = exe.with_file_name("rivora-controller");
    ensure!(
        bin.exists(),
        "{} not found: build it (make bench builds every binary)",
        bin.display()
    );
    Ok(bin)
}

/// One replica, SIGKILLed on drop (a bench leaves nothing running).
struct Replica {
    child: Child,
    identity: String,
}

impl Replica {
    fn start(bin: &Path, kubeconfig: &Path, dir: &Path, identity: &str) -> Result<Self> {
        let log = File::create(dir.join(format!("{identity}.log")))?;
        let child = Command::new(bin)
            .arg("-kubeconfig")
            .arg(kubeconfig)
            .args(["-namespace", NS, "-identity", identity])
            .args(["-metrics-addr", "127.0.0.1:0", "-log-format", "json"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting rivora-controller")?;
        Ok(Self {
            child,
            identity: identity.into(),
        })
    }

    fn kill(&mut self) {
        signal_child(&self.child, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// When each Service's ingress was first seen, by a watch of the bench.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

async fn watch_ingress(client: Client, seen: Seen) {
    let api: Api<Service> = Api::namespaced(client, NS);
    let mut w = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = w.next().await {
        let svc = match ev {
            Ok(Event::Apply(s) | Event::InitApply(s)) => s,
            _ => continue,
        };
        let has = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .is_some_and(|i| i.iter().any(|i| i.ip.is_some()));
        if has {
            let name = svc.metadata.name.unwrap_or_default();
            if let Ok(mut s) = seen.lock() {
                s.entry(name).or_insert_with(Instant::now);
            }
        }
    }
}

fn lb(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": rivora_k8s::translate::RIVORA_LB_CLASS,
            "allocateLoadBalancerNodePorts": false,
            "ports": [{ "port": 80, "protocol": "TCP" }],
        },
    }))?)
}

async fn holder(client: &Client) -> Result<Option<String>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    Ok(api
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

async fn wait_seen(seen: &Seen, name: &str, within: Duration) -> Result<Instant> {
    let t0 = Instant::now();
    loop {
        if let Some(t) = seen.lock().ok().and_then(|s| s.get(name).copied()) {
            return Ok(t);
        }
        if t0.elapsed() > within {
            bail!("Service {name} got no address within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn run(results: &mut Results) -> Result<()> {
    let bin = controller_bin()?;
    let api = start_api_server().context("starting the API server")?;
    // The replicas' logs, kept beside results.json.
    let dir = crate::out_dir().join("controller-logs");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).context("creating the log directory")?;
    let rt = runtime()?;
    let client = rt.block_on(client(&api.kubeconfig))?;
    rt.block_on(async {
        install_crd(
            &client,
            <rivora_k8s::AddressPool as kube::CustomResourceExt>::crd(),
        )
        .await?;
        let nss: Api<Namespace> = Api::all(client.clone());
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({ "metadata": { "name": NS } }))?,
        )
        .await
        .context("creating the namespace")?;
        let pools: Api<rivora_k8s::AddressPool> = Api::all(client.clone());
        pools
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": { "name": "bench" },
                    "spec": { "addresses": ["10.128.0.0/20"] },
                }))?,
            )
            .await
            .context("creating the AddressPool")?;
        anyhow::Ok(())
    })?;
    let mut replicas = vec![
        Replica::start(&bin, &api.kubeconfig, &dir, "r0")?,
        Replica::start(&bin, &api.kubeconfig, &dir, "r1")?,
    ];
    let seen: Seen = Arc::default();
    rt.spawn(watch_ingress(client.clone(), seen.clone()));
    let svcs: Api<Service> = Api::namespaced(client.clone(), NS);

    // Assignment latency.
    let created: Vec<(String, Instant)> = rt.block_on(async {
        let t0 = Instant::now();
        while holder(&client).await?.is_none() {
            ensure!(
                t0.elapsed() < Duration::from_secs(60),
                "no leader within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stream::iter(0..SERVICES)
            .map(|i| {
                let svcs = svcs.clone();
                async move {
                    let name = format!("s{i:04}");
                    svcs.create(&PostParams::default(), &lb(&name)?)
                        .await
                        .with_context(|| format!("creating Service {name}"))?;
                    anyhow::Ok((name, Instant::now()))
                }
            })
            .buffer_unordered(AT_ONCE)
            .try_collect()
            .await
    })?;
    let mut lat = Vec::with_capacity(SERVICES);
    for (name, at) in &created {
        let t = rt.block_on(wait_seen(&seen, name, Duration::from_secs(60)))?;
        lat.push(t.saturating_duration_since(*at).as_secs_f64() * 1e3);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| lat[((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1];
    let (p50, p99, max) = (p(0.5), p(0.99), lat[lat.len() - 1]);
    results.set("controller_assign_p99_ms_n1000", p99);

    // Distinct addresses: what the bench saw agrees with the allocator's
    // first rule.
    let addrs: Vec<IpAddr> = rt.block_on(async {
        let list = svcs.list(&Default::default()).await?;
        anyhow::Ok(
            list.items
                .iter()
                .filter_map(|s| {
                    s.status
                        .as_ref()?
                        .load_balancer
                        .as_ref()?
                        .ingress
                        .as_ref()?[0]
                        .ip
                        .as_deref()?
                        .parse()
                        .ok()
                })
                .collect(),
        )
    })?;
    let distinct: std::collections::BTreeSet<&IpAddr> = addrs.iter().collect();
    ensure!(
        addrs.len() == SERVICES && distinct.len() == SERVICES,
        "{} Services with an address, {} distinct",
        addrs.len(),
        distinct.len()
    );

    // Failover.
    let mut failover = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let lead = rt
            .block_on(holder(&client))?
            .context("no leader before the kill")?;
        let i = replicas
            .iter()
            .position(|r| r.identity == lead)
            .with_context(|| format!("the leader {lead} is none of ours"))?;
        let killed = Instant::now();
        replicas[i].kill();
        let name = format!("after-kill-{round}");
        rt.block_on(svcs.create(&PostParams::default(), &lb(&name)?))
            .with_context(|| format!("creating Service {name}"))?;
        let t = rt.block_on(wait_seen(&seen, &name, 4 * RENEW_DEADLINE))?;
        failover.push(t.saturating_duration_since(killed).as_secs_f64() * 1e3);
        // Two replicas again, the new one watching before the next kill.
        let id = format!("r{}", round + 2);
        replicas[i] = Replica::start(&bin, &api.kubeconfig, &dir, &id)?;
        std::thread::sleep(Duration::from_secs(3));
    }
    let f = median(failover.clone());
    results.set("controller_failover_ms", f);
    results.note(format!(
        "controller_assign_p99_ms_n1000: {SERVICES} Services created {AT_ONCE} at a time, create answered -> ingress seen by a watch: p50 {p50:.1}, p99 {p99:.1}, max {max:.1} ms, {SERVICES} distinct addresses; target <= 100"
    ));
    results.note(format!(
        "controller_failover_ms: SIGKILL of the leader -> the new leader's first write (a Service created at the kill gets its address), rounds {:?} ms, median {f:.0}; Lease 15 s, renew deadline 10 s, retry 2 s: target <= 2 x renew deadline = 20000",
        failover.iter().map(|v| v.round()).collect::<Vec<_>>()
    ));
    drop(replicas);
    Ok(())
}
