//! rivora: flags, then `rivora_cli`'s flows. Exit codes: 0 done (status:
//! ready), 1 failed (status: not ready), 2 a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use rivora_cli::chart::Channel;
use rivora_cli::helm::{self, Helm};
use rivora_cli::lifecycle::{
    self, Cluster, InstallOptions, UninstallOptions, UpgradeOptions, Values,
};
use rivora_cli::{names, status};

#[derive(Parser, Debug)]
#[command(
    name = "rivora",
    version,
    about = "Install, upgrade, check and remove Rivora on a Kubernetes cluster (the Helm chart is embedded: one version, this binary's)"
)]
struct Args {
    /// The kubeconfig. Default: $KUBECONFIG, then ~/.kube/config.
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context. Default: its current context.
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// Rivora's namespace.
    #[arg(short = 'n', long, global = true, value_name = "NS", default_value = names::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The Helm release's name.
    #[arg(long, global = true, value_name = "NAME", default_value = names::DEFAULT_RELEASE)]
    release: String,
    /// The helm executable. Default: $RIVORA_HELM, then helm on PATH.
    #[arg(long, global = true, value_name = "PATH")]
    helm: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args, Debug)]
struct ValueArgs {
    /// A chart value (helm's --set syntax), repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// A values file, repeatable.
    #[arg(short = 'f', long = "values", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// How VIPs are announced (announce.mode). bgp needs the cluster's AS:
    /// --set announce.bgp.asn=N (the chart refuses it without one).
    #[arg(long, value_name = "MODE", value_parser = ["l2", "bgp", "none"])]
    mode: Option<String>,
    /// Install the Gateway API CRDs of this channel with Rivora.
    #[arg(long, value_name = "CHANNEL")]
    gateway_api_crds: Option<Channel>,
}

impl ValueArgs {
    fn values(&self) -> Values {
        Values {
            files: self.files.clone(),
            sets: self.sets.clone(),
            mode: self.mode.clone(),
            gateway_api: self.gateway_api_crds,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Install the chart (creating the namespace if needed).
    Install {
        #[command(flatten)]
        values: ValueArgs,
        /// Wait until everything is ready (as `status --wait`).
        #[arg(long)]
        wait: bool,
        #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = duration)]
        timeout: Duration,
    },
    /// Upgrade to this binary's chart: the CRDs first (Helm never updates
    /// them), then the release, keeping the values given before.
    Upgrade {
        #[command(flatten)]
        values: ValueArgs,
        /// Start from the chart's defaults, not the values given before.
        #[arg(long)]
        reset_values: bool,
        #[arg(long)]
        wait: bool,
        #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = duration)]
        timeout: Duration,
    },
    /// What is ready and what is not, and why.
    Status {
        /// Wait until everything is ready or the timeout passes.
        #[arg(long)]
        wait: bool,
        #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = duration)]
        timeout: Duration,
        #[arg(short = 'o', long, value_name = "FORMAT", default_value = "table", value_parser = ["table", "json"])]
        output: String,
    },
    /// Remove the release, its Leases, the CRDs it installed (with every
    /// object in them) and the namespace `install` created.
    Uninstall {
        /// Keep the CRDs (and the AddressPools, ServicePolicies, ... in them).
        #[arg(long)]
        keep_crds: bool,
        #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = duration)]
        timeout: Duration,
    },
    /// Print the CRDs (for installing them separately, e.g. with GitOps).
    Crds {
        /// Also the Gateway API CRDs of this channel.
        #[arg(long, value_name = "CHANNEL")]
        gateway_api: Option<Channel>,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s or 5m"))?;
    match unit {
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("{s:?} is not a duration like 90s or 5m")),
    }
}

async fn cluster(a: &Args) -> Result<Cluster> {
    Ok(Cluster {
        client: lifecycle::client(a.kubeconfig.as_deref(), a.context.as_deref()).await?,
        namespace: a.namespace.clone(),
        release: a.release.clone(),
    })
}

fn helm_for(a: &Args) -> Result<Helm> {
    let bin = helm::find(a.helm.as_deref())?;
    Ok(Helm::new(
        bin,
        a.kubeconfig.clone(),
        a.context.clone(),
        a.namespace.clone(),
    )?)
}

/// Ok(true): done (or ready).
async fn run(a: Args) -> Result<bool> {
    match &a.command {
        Cmd::Crds { gateway_api } => {
            print!("{}", rivora_cli::chart::crds_stream(*gateway_api));
            Ok(true)
        }
        Cmd::Install {
            values,
            wait,
            timeout,
        } => {
            let helm = helm_for(&a)?;
            let c = cluster(&a).await?;
            let out = lifecycle::install(
                &c,
                &helm,
                &InstallOptions {
                    values: values.values(),
                    wait: *wait,
                    timeout: *timeout,
                },
            )
            .await?;
            print!("{out}");
            Ok(true)
        }
        Cmd::Upgrade {
            values,
            reset_values,
            wait,
            timeout,
        } => {
            let helm = helm_for(&a)?;
            let c = cluster(&a).await?;
            let out = lifecycle::upgrade(
                &c,
                &helm,
                &UpgradeOptions {
                    values: values.values(),
                    reset_values: *reset_values,
                    wait: *wait,
                    timeout: *timeout,
                },
            )
            .await?;
            print!("{out}");
            Ok(true)
        }
        Cmd::Status {
            wait,
            timeout,
            output,
        } => {
            let c = cluster(&a).await?;
            let st = if *wait {
                lifecycle::wait_ready(&c, *timeout).await?
            } else {
                lifecycle::current_status(&c).await?
            };
            if output == "json" {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{}", status::table(&st));
            }
            Ok(st.ready)
        }
        Cmd::Uninstall { keep_crds, timeout } => {
            let helm = helm_for(&a)?;
            let c = cluster(&a).await?;
            let out = lifecycle::uninstall(
                &c,
                &helm,
                &UninstallOptions {
                    keep_crds: *keep_crds,
                    timeout: *timeout,
                },
            )
            .await?;
            print!("{out}");
            Ok(true)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rivora: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("rivora: {e:#}");
            ExitCode::from(1)
        }
    }
}
