//! rivorad: the per-node daemon. Thin: flags, logging, signals; the work is
//! in `rivora::daemon`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use clap::Parser;
use rivora::abi;
use rivora::api::{serve_api, serve_metrics, ApiConfig, TcpApiConfig};
use rivora::daemon::api::DaemonApi;
use rivora::daemon::{self, Daemon, Options};
use rivora::dataplane::{
    check_flow_table_size, Maps, DEFAULT_PIN_DIR, FLOW_TABLE_MAX_SIZE, FLOW_TABLE_MIN_SIZE,
};
use rivora::l2::{KubeSide, Speaker, SpeakerConfig, SpeakerMetrics};
use rivora::metrics::Metrics;
use rivora::sources::kubernetes::{self, KubeOptions, KubeOutputs};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

#[derive(Parser, Debug)]
#[command(
    name = "rivorad",
    version,
    about = "Rivora's per-node load-balancer daemon"
)]
struct Args {
    /// The static configuration file (YAML). Default: /etc/rivora/rivora.yaml
    /// (what `make install` writes).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where maps (and, with -persist-datapath, links) are pinned.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
    /// Pin the XDP and TCX links: the datapath keeps forwarding while
    /// rivorad is down, and the next start swaps the programs in place.
    #[arg(long)]
    persist_datapath: bool,
    /// Where rivorad keeps state the maps cannot hold (operator drains).
    #[arg(long, value_name = "DIR", default_value = daemon::state::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Detach and remove everything Rivora pinned, then exit.
    #[arg(long)]
    cleanup: bool,
    /// Validate the configuration file and exit (0: valid).
    #[arg(long)]
    check: bool,
    /// Log format.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Slots in the shared Maglev table (must match the pinned table).
    #[arg(long, default_value_t = abi::MAGLEV_DEFAULT_SIZE)]
    maglev_size: u32,
    /// Entries in each per-flow table (connection_affinity_map{,6},
    /// nat_reverse_map{,6}), 4096 to 16777216; each CPU keeps an equal
    /// share. Must match the pinned tables: changing it means
    /// `rivorad -cleanup` (resets every flow), then start.
    #[arg(
        long,
        value_name = "N",
        default_value_t = abi::FLOW_TABLE_DEFAULT_SIZE,
        value_parser = parse_flow_table_size
    )]
    flow_table_size: u32,
    /// Health probes a second this node may send in all, 1 or more; 0:
    /// no bound. When the VIPs' health checks ask for more (a tenant's
    /// ServicePolicy probes every endpoint from every node), every
    /// interval is stretched by the same factor
    /// (`rivora_health_probe_interval_stretch`).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PROBE_BUDGET, value_parser = parse_probe_budget)]
    health_probe_budget: f64,
    /// Take VIPs from Kubernetes: LoadBalancer Services, their
    /// EndpointSlices and ServicePolicies. The -config file then holds
    /// only the node's settings.
    #[arg(long)]
    kubernetes: bool,
    /// The kubeconfig for -kubernetes. Default: in-cluster credentials,
    /// then $KUBECONFIG, then ~/.kube/config.
    #[arg(long, value_name = "FILE", requires = "kubernetes")]
    kubeconfig: Option<PathBuf>,
    /// This node's name, for externalTrafficPolicy: Local. Default:
    /// $NODE_NAME, then the hostname.
    #[arg(long, value_name = "NAME", requires = "kubernetes")]
    node_name: Option<String>,
    /// The spec.loadBalancerClass this node serves.
    #[arg(long, value_name = "CLASS", default_value = rivora_k8s::translate::RIVORA_LB_CLASS)]
    load_balancer_class: String,
    /// Serve only Services that name -load-balancer-class, not those
    /// without a class (for clusters with another load balancer).
    #[arg(long)]
    require_class: bool,
    /// Where /metrics, /healthz and /readyz listen, ADDRESS:PORT, over the
    /// file's metrics.listen: the chart passes the node's own address, so
    /// that a pod on the host's network does not listen on every address
    /// the node has. An IPv6 address may go without brackets.
    #[arg(long, value_name = "ADDRESS:PORT", value_parser = parse_listen)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The DaemonSet this rivorad runs in, NAMESPACE/NAME (the chart sets
    /// it). With -persist-datapath, a stop keeps the datapath for the
    /// DaemonSet's next pod, unless the DaemonSet is gone or no longer
    /// selects this node: then it is removed, as with -cleanup.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "kubernetes", value_parser = parse_owner)]
    owner_daemonset: Option<String>,
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Print the CustomResourceDefinitions Rivora defines (what
    /// helm/crds/ holds) and exit.
    Crds,
}

fn parse_owner(s: &str) -> Result<String, String> {
    daemon::leaving::parse_owner(s).map(|_| s.to_string())
}

/// `-node-name`, else `$NODE_NAME`, else the hostname.
fn node_name(given: Option<String>) -> Result<String> {
    if let Some(n) = given.filter(|n| !n.is_empty()) {
        return Ok(n);
    }
    if let Some(n) = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()) {
        return Ok(n);
    }
    let h = nix::unistd::gethostname().context("reading the hostname for -node-name")?;
    h.into_string()
        .map_err(|h| anyhow::anyhow!("the hostname {h:?} is not UTF-8: pass -node-name"))
}

/// Where `make install` puts the configuration, and where rivorad looks
/// without `-config`.
const DEFAULT_CONFIG: &str = "/etc/rivora/rivora.yaml";

/// The file to run: `-config`, else `default` if it exists, else one
/// sentence saying what to do (the first thing a new user may see).
fn config_or_default(given: Option<PathBuf>, default: &Path) -> Result<PathBuf, String> {
    match given {
        Some(c) => Ok(c),
        None if default.exists() => Ok(default.to_path_buf()),
        None => Err(format!(
            "no configuration: {} does not exist; write one (examples/ has one per mode) or pass -config FILE",
            default.display()
        )),
    }
}

/// `-health-probe-budget`'s default: 20 times what 1,000 backends
/// probed every 2 s (the default interval) ask for.
const DEFAULT_PROBE_BUDGET: f64 = 10_000.0;
/// How long a stopping rivorad waits for the API server to say whether
/// its DaemonSet goes on: within the pod's termination grace period.
const LEAVING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// `-health-probe-budget`: 0 (no bound), or 1 probe a second or more.
/// `ADDRESS:PORT`, `[V6]:PORT` or `V6:PORT` (what `$(HOST_IP):PORT`
/// becomes in a pod's args on an IPv6 node).
fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    let bad = || format!("{s:?} is not ADDRESS:PORT");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let addr: std::net::IpAddr = host.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(std::net::SocketAddr::new(addr, port))
}

fn parse_probe_budget(s: &str) -> Result<f64, String> {
    let n: f64 = s
        .trim()
        .parse()
        .map_err(|_| "not a number of probes a second".to_string())?;
    if n == 0.0 || (n.is_finite() && n >= 1.0) {
        Ok(n)
    } else {
        Err(format!(
            "{s} probes a second: it must be 0 (no bound) or 1 or more"
        ))
    }
}

/// `-flow-table-size`: a count within the bounds. Checked while parsing
/// the flags, so a bad value stops rivorad before anything is touched.
fn parse_flow_table_size(s: &str) -> Result<u32, String> {
    let n: u64 = s.trim().parse().map_err(|_| {
        format!(
            "not a number of entries: it must be {FLOW_TABLE_MIN_SIZE} to {FLOW_TABLE_MAX_SIZE}"
        )
    })?;
    check_flow_table_size(n).map_err(|e| e.to_string())
}

fn main() -> Result<()> {
    let args = Args::parse_from(rivora_model::cli::go_style_flags(std::env::args()));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
    });
    if args.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init();
    }

    if let Some(Sub::Crds) = args.command {
        print!("{}", rivora_k8s::crds_yaml());
        return Ok(());
    }
    if args.cleanup {
        let detached = daemon::cleanup(&args.pin_dir)
            .with_context(|| format!("removing {}", args.pin_dir.display()))?;
        for l in &detached {
            info!(link = %l.display(), "detached");
        }
        info!(pin_dir = %args.pin_dir.display(), "removed everything rivora pinned");
        return Ok(());
    }
    let config = match config_or_default(args.config, Path::new(DEFAULT_CONFIG)) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("rivorad: {msg}");
            std::process::exit(2);
        }
    };
    if args.check {
        let capacity = rivora::model::Capacity {
            maglev_size: args.maglev_size,
            flow_table_size: args.flow_table_size,
        };
        let c = rivora::config::load_with(&config, &capacity)?;
        if args.kubernetes {
            rivora::sources::file::check_node_only(&c)?;
        }
        rivora::sources::file::check_host(&c)?;
        println!("{}", rivora::config::summary(&c));
        for w in &c.warnings {
            println!("warning: {w}");
        }
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // The health checker's demand and stretch, which the metrics show.
    let probe_load = rivora::healthcheck::ProbeLoad::default();
    let opts = Options {
        config: config.clone(),
        pin_dir: args.pin_dir.clone(),
        persist_datapath: args.persist_datapath,
        maglev_size: args.maglev_size,
        flow_table_size: args.flow_table_size,
        state_dir: args.state_dir.clone(),
        kubernetes: args.kubernetes,
        probe_budget: Some(args.health_probe_budget).filter(|b| *b > 0.0),
        probe_load: probe_load.clone(),
    };
    let kube = if args.kubernetes {
        let (outputs, watches) = KubeOutputs::new();
        let opts = KubeOptions {
            node_name: node_name(args.node_name.clone())?,
            translate: rivora_k8s::TranslateOptions {
                class: args.load_balancer_class.clone(),
                accept_unset_class: !args.require_class,
            },
        };
        // Credentials are read before anything is touched: a node that
        // cannot have any should not attach.
        let client = runtime
            .block_on(kubernetes::client(args.kubeconfig.as_deref()))
            .context("-kubernetes")?;
        Some((client, opts, outputs, watches))
    } else {
        None
    };
    let mut metrics = Metrics::new();
    metrics.register_probe_load(&probe_load);
    let speaker_metrics = SpeakerMetrics::default();
    speaker_metrics.register(metrics.registry_mut());
    if let Some((_, _, outputs, _)) = &kube {
        metrics.registry_mut().register(
            "rivora_network_programming_seconds",
            "Time from an EndpointSlice change seen by the watcher to its map write",
            outputs.programming.clone(),
        );
    }
    let bgp_metrics = rivora::bgp::metrics::BgpCollector::default();
    metrics
        .registry_mut()
        .register_collector(Box::new(bgp_metrics.clone()));
    let metrics = Arc::new(metrics);
    let observer: rivora::healthcheck::Observer<daemon::ProbeKey> = {
        let metrics = metrics.clone();
        Arc::new(move |_key, obs| metrics.observe_probe(obs.verdict(), obs.latency_secs()))
    };
    let mut d = Daemon::start(opts, runtime.handle().clone(), observer)
        .with_context(|| format!("starting with {}", config.display()))?;
    // The BGP speaker, once the first apply is published: its first
    // table is what the datapath forwards.
    let bgp = match d.bgp.clone() {
        Some(settings) => {
            let _rt = runtime.enter();
            let sp = rivora::bgp::start(settings, d.status(), args.persist_datapath, d.restarted)
                .context("starting the BGP speaker")?;
            let _ = bgp_metrics.speaker.set(sp.speaker.clone());
            let on_reload = sp.clone();
            d.file_source()
                .on_bgp_reload(Box::new(move |s| on_reload.reload(s)));
            Some(sp)
        }
        None => None,
    };
    let api_conf = d.node.api.clone();
    let metrics_addr = args.metrics_listen.or(d.node.metrics.listen);
    let file = d.file_source();
    // The L2 speaker: -kubernetes, or `announce: l2` in the file.
    let speaker = {
        let _in = runtime.enter();
        let cfg = SpeakerConfig {
            announce: d.node.announce,
            l2: d.node.l2.clone(),
            attached: d
                .attached_interfaces()
                .context("the attached interfaces, for the L2 speaker")?,
            kube: kube.as_ref().map(|(client, opts, _, _)| KubeSide {
                client: client.clone(),
                node_name: opts.node_name.clone(),
            }),
        };
        Speaker::start(cfg, d.status(), speaker_metrics).context("starting the L2 speaker")?
    };
    let state = Arc::new(DaemonApi {
        status: d.status(),
        reconciler: Mutex::new(d.sender()),
        file: file.clone(),
        maps: Maps::open(&args.pin_dir).context("opening the pinned maps for the API")?,
        metrics,
        watches: kube.as_ref().map(|(_, _, _, w)| w.clone()),
        bgp: bgp.as_ref().map(|b| b.speaker.clone()),
        l2: speaker.as_ref().map(Speaker::state),
    });
    // Checked and held since before the datapath was touched; the
    // server binds its own listeners on the same addresses.
    d.release_listeners();
    let api = runtime
        .block_on(serve_api(
            ApiConfig {
                socket_path: api_conf.socket.clone(),
                tcp: api_conf
                    .listen
                    .zip(api_conf.token_file.clone())
                    .map(|(addr, token_file)| TcpApiConfig { addr, token_file }),
                ..Default::default()
            },
            state.clone(),
        ))
        .with_context(|| format!("serving the API on {}", api_conf.socket.display()))?;
    let metrics = match metrics_addr {
        Some(addr) => Some(
            runtime
                .block_on(serve_metrics(addr, state.clone()))
                .with_context(|| format!("serving metrics on {addr}"))?,
        ),
        None => None,
    };
    // Who is asked at the stop whether the datapath stays.
    let owner = match (&kube, &args.owner_daemonset) {
        (Some((client, opts, _, _)), Some(ds)) if args.persist_datapath => {
            Some((client.clone(), ds.clone(), opts.node_name.clone()))
        }
        _ => None,
    };
    if let Some((client, opts, outputs, _)) = kube {
        if let Some(b) = &bgp {
            info!(node = %opts.node_name, "taking BGP peers from BGPPeers too");
            runtime.spawn(rivora::bgp::kubernetes::run(
                client.clone(),
                opts.node_name.clone(),
                b.clone(),
                outputs.watches.clone(),
            ));
        }
        info!(node = %opts.node_name, "taking VIPs from Kubernetes");
        runtime.spawn(kubernetes::run(client, opts, d.sender(), outputs));
    }
    info!(socket = %api_conf.socket.display(), metrics = ?metrics_addr, "ready");

    let keep = runtime.block_on(async move {
        // Reload when the file changes, as on SIGHUP.
        let watcher = {
            let file = file.clone();
            tokio::spawn(async move { file.watch().await })
        };
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    info!("SIGHUP: reloading");
                    // The outcome is logged and shown by the status.
                    let _ = file.reload().await;
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        watcher.abort();
        let keep = match owner {
            None => args.persist_datapath,
            Some((client, ds, node)) => {
                match daemon::leaving::ask(client, &ds, &node, LEAVING_WAIT).await {
                    daemon::leaving::Leaving::Keep(why) => {
                        info!(reason = %why, "stopping for an upgrade or a restart: the datapath keeps forwarding");
                        true
                    }
                    daemon::leaving::Leaving::Remove(why) => {
                        warn!(reason = %why, "stopping for good: removing the datapath");
                        false
                    }
                }
            }
        };
        // Peers first: without a pinned datapath the routes are withdrawn
        // before the programs detach; with one, the sessions close for
        // the peers' graceful restart to keep them.
        if let Some(b) = &bgp {
            rivora::bgp::stop(b, keep).await;
        }
        // Quiet, then the Leases released: another node takes over at
        // once rather than when they expire.
        if let Some(s) = speaker {
            s.stop().await;
        }
        api.shutdown().await;
        if let Some(m) = metrics {
            m.shutdown().await;
        }
        anyhow::Ok(keep)
    })?;
    drop(state);
    drop(runtime);
    d.shutdown();
    if !keep && args.persist_datapath {
        let detached = daemon::cleanup(&args.pin_dir)
            .with_context(|| format!("removing {}", args.pin_dir.display()))?;
        info!(links = detached.len(), pin_dir = %args.pin_dir.display(), "datapath removed");
    }
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let argv = ["rivorad", "-config", "rivora.yaml"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string());
        Args::try_parse_from(rivora_model::cli::go_style_flags(argv))
    }

    #[test]
    fn without_config_the_default_file_or_one_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("rivora.yaml");
        let msg = config_or_default(None, &missing).unwrap_err();
        assert!(
            msg.contains(&missing.display().to_string())
                && msg.contains("examples/")
                && msg.contains("-config FILE")
                && !msg.contains('\n'),
            "{msg}"
        );
        std::fs::write(&missing, "").unwrap();
        assert_eq!(config_or_default(None, &missing).unwrap(), missing);
        let given = PathBuf::from("/elsewhere.yaml");
        assert_eq!(
            config_or_default(Some(given.clone()), &missing).unwrap(),
            given
        );
        // No flag is required any more.
        assert!(Args::try_parse_from(["rivorad"]).is_ok());
    }

    #[test]
    fn kubernetes_flags_need_kubernetes_and_crds_is_a_subcommand() {
        let a = parse(&[
            "-kubernetes",
            "-kubeconfig",
            "/k",
            "-node-name",
            "n1",
            "-require-class",
        ])
        .unwrap();
        assert!(a.kubernetes && a.require_class);
        assert_eq!(a.kubeconfig.as_deref(), Some(Path::new("/k")));
        assert_eq!(a.node_name.as_deref(), Some("n1"));
        assert_eq!(a.load_balancer_class, "rivora.io/lb");
        for alone in [["-kubeconfig", "/k"], ["-node-name", "n1"]] {
            let e = parse(&alone).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
            assert!(e.to_string().contains("--kubernetes"), "{e}");
        }
        let c = Args::try_parse_from(rivora_model::cli::go_style_flags(
            ["rivorad", "crds"].iter().map(|s| s.to_string()),
        ))
        .unwrap();
        assert!(matches!(c.command, Some(Sub::Crds)));
    }

    #[test]
    fn metrics_listen_takes_what_a_pod_arg_expands_to() {
        for (given, want) in [
            ("10.0.0.5:9441", "10.0.0.5:9441"),
            ("[fd00::5]:9441", "[fd00::5]:9441"),
            ("fd00::5:9441", "[fd00::5]:9441"),
        ] {
            assert_eq!(parse_listen(given).unwrap().to_string(), want, "{given}");
        }
        for bad in [
            "10.0.0.5",
            ":9441",
            "$(HOST_IP):9441",
            "10.0.0.5:99999",
            "x:1",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn node_name_is_the_flag_then_node_name_then_the_hostname() {
        assert_eq!(node_name(Some("given".into())).unwrap(), "given");
        // $NODE_NAME is read, not set, here: the process may have it.
        let fallback = node_name(None).unwrap();
        match std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()) {
            Some(n) => assert_eq!(fallback, n),
            None => assert_eq!(
                fallback,
                nix::unistd::gethostname().unwrap().into_string().unwrap()
            ),
        }
        assert_eq!(node_name(Some(String::new())).unwrap(), fallback);
    }

    #[test]
    fn probe_budget_is_zero_or_at_least_one() {
        assert_eq!(parse_probe_budget("0"), Ok(0.0));
        assert_eq!(parse_probe_budget("2500"), Ok(2500.0));
        for bad in ["0.5", "-1", "NaN", "inf", "lots"] {
            assert!(parse_probe_budget(bad).is_err(), "{bad}");
        }
        let a = Args::try_parse_from(["rivorad"]).expect("no flags");
        assert_eq!(a.health_probe_budget, DEFAULT_PROBE_BUDGET);
    }

    #[test]
    fn flow_table_size_defaults_to_the_abi_size() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.flow_table_size, abi::FLOW_TABLE_DEFAULT_SIZE);
        assert_eq!(a.flow_table_size, 131_072);
    }

    #[test]
    fn flow_table_size_accepts_single_and_double_dash() {
        assert_eq!(
            parse(&["-flow-table-size", "65536"])
                .unwrap()
                .flow_table_size,
            65_536
        );
        assert_eq!(
            parse(&["--flow-table-size=4096"]).unwrap().flow_table_size,
            4_096
        );
        assert_eq!(
            parse(&["-flow-table-size", "16777216"])
                .unwrap()
                .flow_table_size,
            16_777_216
        );
    }

    #[test]
    fn flow_table_size_refuses_out_of_range_and_non_numbers() {
        for (bad, what) in [
            ("4095", "4095"),
            ("0", "0"),
            ("16777217", "16777217"),
            // Too big for a u32: still the range error, not a parse error.
            ("99999999999", "99999999999"),
            ("128k", "not a number"),
            ("-5", "not a number"),
            ("", "not a number"),
        ] {
            let e = match parse(&[&format!("--flow-table-size={bad}")]) {
                Ok(a) => panic!("{bad:?} accepted as {}", a.flow_table_size),
                Err(e) => e,
            };
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
            let msg = e.to_string();
            assert!(
                msg.contains("--flow-table-size")
                    && msg.contains(what)
                    && msg.contains("4096")
                    && msg.contains("16777216"),
                "{bad:?}: {msg}"
            );
        }
    }
}
