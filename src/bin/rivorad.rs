//! rivorad: the per-node daemon. Thin: flags, logging, signals; the work is
//! in `rivora::daemon`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Parser;
use rivora::abi;
use rivora::api::{serve_api, serve_metrics, ApiConfig, TcpApiConfig};
use rivora::daemon::api::{DaemonApi, ProbeHistograms};
use rivora::daemon::{self, Daemon, Options};
use rivora::dataplane::{Maps, DEFAULT_PIN_DIR};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

#[derive(Parser, Debug)]
#[command(
    name = "rivorad",
    version,
    about = "Rivora's per-node load-balancer daemon"
)]
struct Args {
    /// The static configuration file (YAML).
    #[arg(long, value_name = "FILE", required_unless_present = "cleanup")]
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
}

/// Go-style single-dash long flags (`-config rivora.yaml`, as the design
/// card writes them) are accepted beside `--config`.
fn normalise(args: impl Iterator<Item = String>) -> Vec<String> {
    args.enumerate()
        .map(|(i, a)| {
            if i > 0 && a.starts_with('-') && !a.starts_with("--") && a.len() > 2 {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

fn main() -> Result<()> {
    let args = Args::parse_from(normalise(std::env::args()));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
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

    if args.cleanup {
        let detached = daemon::cleanup(&args.pin_dir)
            .with_context(|| format!("removing {}", args.pin_dir.display()))?;
        for l in &detached {
            info!(link = %l.display(), "detached");
        }
        info!(pin_dir = %args.pin_dir.display(), "removed everything rivora pinned");
        return Ok(());
    }
    let config = args.config.context("-config is required")?;
    if args.check {
        let c = rivora::config::load(&config)?;
        println!("{}", rivora::config::summary(&c));
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let opts = Options {
        config: config.clone(),
        pin_dir: args.pin_dir.clone(),
        persist_datapath: args.persist_datapath,
        maglev_size: args.maglev_size,
        state_dir: args.state_dir.clone(),
    };
    let probes = Arc::new(Mutex::new(ProbeHistograms::default()));
    let observer: rivora::healthcheck::Observer<daemon::ProbeKey> = {
        let probes = probes.clone();
        Arc::new(move |_key, obs| {
            if let Ok(mut h) = probes.lock() {
                if obs.success() {
                    h.success.observe(obs.latency_secs());
                } else {
                    h.failure.observe(obs.latency_secs());
                }
            }
        })
    };
    let (d, mut events) = Daemon::start(opts, runtime.handle().clone(), observer)
        .with_context(|| format!("starting with {}", config.display()))?;
    let api_conf = d.config.file.api.clone();
    let metrics_addr = d.config.file.metrics.listen;
    let d = Arc::new(Mutex::new(d));
    let state = Arc::new(DaemonApi {
        daemon: d.clone(),
        maps: Maps::open(&args.pin_dir).context("opening the pinned maps for the API")?,
        probes,
    });
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
    info!(socket = %api_conf.socket.display(), metrics = ?metrics_addr, "ready");

    let main_ref = d.clone();
    runtime.block_on(async move {
        let d = main_ref;
        let health = {
            let d = d.clone();
            tokio::spawn(async move {
                while let Some(ev) = events.recv().await {
                    let mut g = d.lock().expect("daemon lock");
                    if let Err(e) = g.on_health(&ev) {
                        error!(error = %e, "applying a health change");
                    }
                }
            })
        };
        // Reload when the file changes (checked every second), as on SIGHUP.
        let watcher = {
            let d = d.clone();
            let path = config.clone();
            tokio::spawn(async move {
                let stamp = |p: &PathBuf| -> Option<(SystemTime, u64)> {
                    let m = std::fs::metadata(p).ok()?;
                    Some((m.modified().ok()?, m.len()))
                };
                let mut last = stamp(&path);
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let now = stamp(&path);
                    if now.is_some() && now != last {
                        last = now;
                        info!(file = %path.display(), "configuration file changed");
                        let _ = d.lock().expect("daemon lock").reload();
                    }
                }
            })
        };
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    info!("SIGHUP: reloading");
                    let _ = d.lock().expect("daemon lock").reload();
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        health.abort();
        watcher.abort();
        api.shutdown().await;
        if let Some(m) = metrics {
            m.shutdown().await;
        }
        anyhow::Ok(())
    })?;
    drop(state);
    // The tasks held references; the runtime going away drops them.
    drop(runtime);
    let d = Arc::try_unwrap(d).map_err(|_| anyhow::anyhow!("daemon still shared at exit"))?;
    let d = d
        .into_inner()
        .map_err(|_| anyhow::anyhow!("daemon lock poisoned"))?;
    d.shutdown();
    info!("stopped");
    Ok(())
}
