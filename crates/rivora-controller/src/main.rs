//! rivora-controller: flags, logging, signals; the work is in
//! `rivora_controller::run`.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use rivora_controller::leader::LeaseSettings;
use rivora_controller::metrics::{self, Metrics};
use rivora_controller::run::{self, Options};
use rivora_k8s::TranslateOptions;
use tokio::signal::unix::{signal, SignalKind};
use tracing::info;

#[derive(Parser, Debug)]
#[command(
    name = "rivora-controller",
    version,
    about = "Rivora's cluster controller: AddressPool IPAM and the one writer of status, one leader among its replicas"
)]
struct Args {
    /// The kubeconfig. Default: in-cluster credentials, then $KUBECONFIG,
    /// then ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Where the Lease lives (the release's namespace). Default:
    /// $POD_NAMESPACE, then rivora-system.
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// This replica's name in the Lease. Default: $POD_NAME, then the
    /// hostname.
    #[arg(long, value_name = "NAME")]
    identity: Option<String>,
    #[arg(long, value_name = "NAME", default_value = "rivora-controller")]
    lease_name: String,
    /// How long the other replicas wait, after the last renewal they saw,
    /// before they take the Lease over.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = duration)]
    lease_duration: Duration,
    /// How long the leader keeps writing after the last renewal that
    /// succeeded; below the lease duration.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    lease_renew_deadline: Duration,
    /// How often the leader renews and the others look.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    lease_retry_period: Duration,
    /// The spec.loadBalancerClass Rivora serves.
    #[arg(long, value_name = "CLASS", default_value = rivora_k8s::translate::RIVORA_LB_CLASS)]
    load_balancer_class: String,
    /// Serve only Services that name -load-balancer-class, not those
    /// without a class (for clusters with another load balancer).
    #[arg(long)]
    require_class: bool,
    /// Use only the AddressPools whose labels match this selector
    /// (`key=value,...`), e.g. to run a second controller beside the
    /// first on pools of its own. Default: every pool.
    #[arg(long, value_name = "SELECTOR")]
    pool_selector: Option<String>,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9442")]
    metrics_addr: SocketAddr,
    /// Log format.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 15s: {e}"))
}

fn env_or(var: &str, given: Option<String>) -> Option<String> {
    given
        .filter(|v| !v.is_empty())
        .or_else(|| std::env::var(var).ok().filter(|v| !v.is_empty()))
}

fn hostname() -> Result<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the hostname for -identity")?;
    Ok(h.trim().to_string())
}

fn settings(args: &Args) -> Result<LeaseSettings> {
    let namespace =
        env_or("POD_NAMESPACE", args.namespace.clone()).unwrap_or_else(|| "rivora-system".into());
    let identity = match env_or("POD_NAME", args.identity.clone()) {
        Some(i) => i,
        None => hostname()?,
    };
    let s = LeaseSettings {
        duration: args.lease_duration,
        renew_deadline: args.lease_renew_deadline,
        retry_period: args.lease_retry_period,
        ..LeaseSettings::new(namespace, &args.lease_name, identity)
    };
    s.check()?;
    Ok(s)
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
    let lease = settings(&args)?;
    let opts = Options {
        // A write lands within the Lease's margin, or counts as failed.
        write_timeout: (lease.duration - lease.renew_deadline).min(Duration::from_secs(5)),
        pool_selector: args.pool_selector.clone(),
        lease,
        translate: TranslateOptions {
            class: args.load_balancer_class.clone(),
            accept_unset_class: !args.require_class,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let client = rivora_k8s_client::client(args.kubeconfig.as_deref())
            .await
            .context("the Kubernetes client")?;
        let m = Metrics::new();
        let server = metrics::serve(args.metrics_addr, m.clone())
            .await
            .with_context(|| format!("serving metrics on {}", args.metrics_addr))?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM"),
                _ = int.recv() => info!("SIGINT"),
            }
        };
        info!(
            identity = %opts.lease.identity,
            namespace = %opts.lease.namespace,
            lease = %opts.lease.name,
            "rivora-controller starting"
        );
        run::run(client, opts, m, shutdown).await?;
        server.shutdown().await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(rivora_model::cli::go_style_flags(
            std::iter::once("rivora-controller")
                .chain(a.iter().copied())
                .map(String::from),
        ))
    }

    #[test]
    fn lease_flags_are_durations_and_checked_together() {
        let a = parse(&[
            "-identity",
            "r1",
            "-namespace",
            "ns",
            "-lease-duration",
            "4s",
            "-lease-renew-deadline",
            "3s",
            "-lease-retry-period",
            "500ms",
        ])
        .expect("flags");
        let s = settings(&a).expect("settings");
        assert_eq!(s.identity, "r1");
        assert_eq!(s.namespace, "ns");
        assert_eq!(s.retry_period, Duration::from_millis(500));
        let a = parse(&["-identity", "r1", "-lease-renew-deadline", "20s"]).expect("flags");
        let e = settings(&a).unwrap_err().to_string();
        assert!(e.contains("renew deadline"), "{e}");
        let e = parse(&["-lease-duration", "soon"]).unwrap_err().to_string();
        assert!(e.contains("not a duration"), "{e}");
    }
}
