//! rivoractl: the CLI over rivorad's API. Argument parsing and output
//! selection only; requests, tables and validation live in the library.
//!
//! Exit codes: 0 success, 1 the request failed (rivorad's error message is
//! printed), 2 usage error (clap's).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use serde::de::DeserializeOwned;

use rivora_api::client::{vip_path, Client};
use rivora_api::{render, DrainRequest, Drops, Status, VipInfo, DEFAULT_SOCKET_PATH};

#[derive(Debug, Parser)]
#[command(
    name = "rivoractl",
    version,
    about = "Inspect and steer rivorad over its API"
)]
struct Cli {
    /// rivorad's Unix socket.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "address")]
    socket: Option<PathBuf>,
    /// rivorad's TCP API listener instead of the socket; needs --token-file.
    #[arg(long, global = true, value_name = "HOST:PORT", requires = "token_file")]
    address: Option<String>,
    /// File holding the bearer token for --address.
    #[arg(long, global = true, value_name = "FILE", requires = "address")]
    token_file: Option<PathBuf>,
    /// Seconds to wait for rivorad to answer each request.
    #[arg(long, global = true, value_name = "S", default_value = "30", value_parser = parse_interval)]
    timeout: Duration,
    /// Output format: aligned tables, or the API's JSON for scripts.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Version, attach modes, config generation and the last reload.
    Status,
    /// VIPs and their counters.
    #[command(subcommand)]
    Vip(VipCommand),
    /// Backends with health, probe and drain state.
    #[command(subcommand)]
    Backend(BackendCommand),
    /// Stop sending new flows to a backend; established flows continue.
    Drain(DrainArgs),
    /// Clear an operator drain.
    Undrain(DrainArgs),
    /// Packets and bytes per VIP, drops by reason.
    Stats {
        /// Repeat every --interval seconds, with rates.
        #[arg(long)]
        watch: bool,
        /// Seconds between samples with --watch.
        #[arg(long, value_name = "S", default_value = "2", value_parser = parse_interval, requires = "watch")]
        interval: Duration,
    },
    /// Configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Make rivorad re-read its configuration file.
    Reload,
    /// The BGP speaker: sessions and announced routes.
    #[command(subcommand)]
    Bgp(BgpCommand),
    /// Print a shell completion script.
    Completions { shell: clap_complete::Shell },
}

#[derive(Debug, Subcommand)]
enum VipCommand {
    /// Every VIP.
    List,
    /// One VIP and its backends, e.g. `tcp/10.0.0.1:80`.
    Show { vip: String },
}

#[derive(Debug, Subcommand)]
enum BgpCommand {
    /// Each peer's session: state, uptime, flaps, updates, BFD.
    Peers,
    /// The routes this node announces, and to which peers.
    Routes,
}

#[derive(Debug, Subcommand)]
enum BackendCommand {
    /// Every backend.
    List,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Check a configuration file offline with rivorad's own validator.
    Validate {
        file: PathBuf,
        /// Slots in the Maglev table the file must fit: rivorad's
        /// -maglev-size, if it was given one.
        #[arg(long, value_name = "SLOTS", default_value_t = rivora_model::model::MAGLEV_DEFAULT_SIZE)]
        maglev_size: u32,
        /// Entries in each flow table: rivorad's -flow-table-size, if it
        /// was given one (full NAT's port range is weighed against it).
        #[arg(long, value_name = "ENTRIES", default_value_t = rivora_model::model::FLOW_TABLE_DEFAULT_SIZE)]
        flow_table_size: u32,
    },
}

#[derive(Debug, clap::Args)]
struct DrainArgs {
    /// The backend, addr:port ([v6addr]:port).
    target: String,
    /// Only for this VIP (default: every VIP the backend serves).
    #[arg(long)]
    vip: Option<String>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("not a number of seconds: {s}"))?;
    if !(0.1..=86_400.0).contains(&secs) {
        return Err("must be between 0.1 and 86400 seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rivoractl: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn client(cli: &Cli) -> anyhow::Result<Client> {
    let client = match (&cli.address, &cli.token_file) {
        (Some(addr), Some(token)) => Client::tcp_with_token_file(addr.clone(), token)?,
        _ => Client::unix(
            cli.socket
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET_PATH)),
        ),
    };
    Ok(client.with_timeout(cli.timeout))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn print_json(body: &[u8]) -> anyhow::Result<()> {
    let v: serde_json::Value = serde_json::from_slice(body).context("rivorad sent invalid JSON")?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// One request, printed as the API's JSON or rendered as a table.
fn show<T: DeserializeOwned>(
    cli: &Cli,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    table: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    let raw = client(cli)?.call(method, path, body)?;
    match cli.output {
        Output::Json => print_json(&raw),
        Output::Table => {
            let v: T = serde_json::from_slice(&raw).context("decoding rivorad's answer")?;
            print!("{}", table(&v));
            Ok(())
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Status => show(&cli, "GET", "/v1/status", None, |s| {
            render::status(s, unix_now())
        }),
        Command::Vip(VipCommand::List) => match cli.output {
            Output::Json => show(&cli, "GET", "/v1/vips", None, |v: &Vec<VipInfo>| {
                render::vip_list(v)
            }),
            // The VIPs refused (and why) are part of the answer to "what
            // does this node serve".
            Output::Table => {
                let c = client(&cli)?;
                let vips: Vec<VipInfo> = serde_json::from_slice(&c.call("GET", "/v1/vips", None)?)
                    .context("decoding rivorad's answer")?;
                let st: Status = serde_json::from_slice(&c.call("GET", "/v1/status", None)?)
                    .context("decoding rivorad's status")?;
                print!("{}", render::vip_list_and_unapplied(&vips, &st));
                Ok(())
            }
        },
        Command::Vip(VipCommand::Show { vip }) => {
            show(&cli, "GET", &vip_path(vip), None, render::vip_show)
        }
        Command::Backend(BackendCommand::List) => {
            show(&cli, "GET", "/v1/backends", None, |b: &Vec<_>| {
                render::backend_list(b)
            })
        }
        Command::Bgp(BgpCommand::Peers) => {
            show(&cli, "GET", "/v1/bgp/peers", None, |p: &Vec<_>| {
                render::bgp_peers(p)
            })
        }
        Command::Bgp(BgpCommand::Routes) => {
            show(&cli, "GET", "/v1/bgp/routes", None, |r: &Vec<_>| {
                render::bgp_routes(r)
            })
        }
        Command::Drain(args) | Command::Undrain(args) => {
            let (path, verb) = match &cli.command {
                Command::Drain(_) => ("/v1/drain", "drained"),
                _ => ("/v1/undrain", "undrained"),
            };
            let req = serde_json::to_vec(&DrainRequest {
                target: args.target.clone(),
                vip: args.vip.clone(),
            })?;
            show(&cli, "POST", path, Some(&req), |o| {
                render::drain_outcome(verb, o)
            })
        }
        Command::Reload => show(&cli, "POST", "/v1/reload", Some(b""), |r| {
            format!("reload {}\n", render::reload_line(r))
        }),
        Command::Stats { watch, interval } => stats(&cli, *watch, *interval),
        Command::Config(ConfigCommand::Validate {
            file,
            maglev_size,
            flow_table_size,
        }) => {
            // The same validator rivorad runs at start and on reload.
            let capacity = rivora_model::config::Capacity {
                maglev_size: *maglev_size,
                flow_table_size: *flow_table_size,
            };
            let cfg = rivora_model::config::load_with(file, &capacity)?;
            let summary = rivora_model::config::summary(&cfg);
            match cli.output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({
                        "file": file, "valid": true, "summary": summary, "warnings": cfg.warnings,
                    })
                ),
                Output::Table => {
                    println!("{}: valid: {summary}", file.display());
                    for w in &cfg.warnings {
                        println!("  warning: {w}");
                    }
                }
            }
            Ok(())
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "rivoractl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    }
}

fn stats(cli: &Cli, watch: bool, interval: Duration) -> anyhow::Result<()> {
    let client = client(cli)?;
    let mut previous: Option<(Vec<VipInfo>, Instant)> = None;
    loop {
        let vips_raw = client.call("GET", "/v1/vips", None)?;
        let drops_raw = client.call("GET", "/v1/drops", None)?;
        let taken = Instant::now();
        let vips: Vec<VipInfo> = serde_json::from_slice(&vips_raw).context("decoding VIPs")?;
        let drops: Drops = serde_json::from_slice(&drops_raw).context("decoding drops")?;
        match cli.output {
            Output::Json => {
                let v = serde_json::json!({
                    "vips": vips.iter().map(|v| serde_json::json!({
                        "vip": v.vip, "packets": v.packets, "bytes": v.bytes,
                        "rate_limited": v.rate_limited, "no_backend": v.no_backend,
                    })).collect::<Vec<_>>(),
                    "drops": drops,
                });
                // One object per line under --watch, so it can be piped.
                println!("{v}");
            }
            Output::Table => {
                let prev = previous
                    .as_ref()
                    .map(|(p, at)| (p.as_slice(), taken.duration_since(*at)));
                if watch {
                    println!("--- {}", render::fmt_unix_utc(unix_now()));
                }
                print!("{}", render::stats(&vips, &drops, prev));
            }
        }
        std::io::stdout().flush()?;
        if !watch {
            return Ok(());
        }
        previous = Some((vips, taken));
        std::thread::sleep(interval);
    }
}
