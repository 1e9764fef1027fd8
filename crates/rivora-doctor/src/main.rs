//! rivora-doctor: flags, then `rivora_doctor`'s probe, checks and output.
//! Exit codes: 0 ready, 1 a failed check blocks a chosen mode, 2 usage.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rivora_doctor::probe::{self, Sources};
use rivora_doctor::{checks, render, Mode, PortRange};
use rivora_model::model::FullNatSettings;

#[derive(Parser, Debug)]
#[command(
    name = "rivora-doctor",
    version,
    about = "Whether this node can run Rivora: kernel, BTF, bpffs, capabilities, XDP and TCX, sysctls, MTU, full NAT's ports, kube-proxy, memory, clock source",
    after_help = "Exit status: 0 when nothing blocks the chosen modes, 1 when a failed check does, 2 on a usage error."
)]
struct Args {
    /// Forwarding modes the node must serve (nat, dsr, l3dsr, fullnat),
    /// comma-separated.
    #[arg(
        long,
        value_name = "MODES",
        value_delimiter = ',',
        default_value = "nat,dsr,l3dsr,fullnat"
    )]
    mode: Vec<Mode>,
    /// How VIPs are announced: l2, bgp or none.
    #[arg(long, value_name = "MODE", default_value = "none", value_parser = ["l2", "bgp", "none"])]
    announce: String,
    /// An interface rivorad attaches to (repeat for several). Default:
    /// those of --config, else every NIC that is up.
    #[arg(long = "interface", short = 'i', value_name = "NAME")]
    interfaces: Vec<String>,
    /// rivorad's configuration file, for its interfaces (unless -i),
    /// node.snat.ports and whether its VIPs use L3 DSR or full NAT.
    /// Default: /etc/rivora/rivora.yaml when it exists.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// rivorad's -pin-dir (its pinned links mark Rivora's own programs).
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/bpf/rivora-lb")]
    pin_dir: PathBuf,
    /// rivorad runs with -kubernetes (the chart's): the L2 speaker then
    /// always runs, and its sockets need NET_RAW.
    #[arg(long)]
    kubernetes: bool,
    /// rivorad's bgp.listenPort (with --announce bgp): below 1024 the
    /// listener needs NET_BIND_SERVICE; 0 (no listener) or above: no
    /// capability.
    #[arg(long, value_name = "PORT", default_value_t = 179)]
    bgp_listen_port: u16,
    /// rivorad's -flow-table-size, for the memory the maps need.
    #[arg(long, value_name = "N", default_value_t = 131_072)]
    flow_table_size: u64,
    /// Output: a table, or JSON.
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "table", value_parser = ["table", "json"])]
    output: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut modes: Vec<Mode> = Vec::new();
    for m in &args.mode {
        if !Mode::FORWARDING.contains(m) {
            eprintln!("rivora-doctor: --mode {m}: a forwarding mode is nat, dsr, l3dsr or fullnat (l2 and bgp go with --announce)");
            return ExitCode::from(2);
        }
        if !modes.contains(m) {
            modes.push(*m);
        }
    }
    match args.announce.as_str() {
        "l2" => modes.push(Mode::L2),
        "bgp" => modes.push(Mode::Bgp),
        _ => {}
    }
    let config = match probe::node_config(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rivora-doctor: {e}");
            return ExitCode::from(2);
        }
    };
    let interfaces = if args.interfaces.is_empty() {
        match probe::default_interfaces(config.as_ref()) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("rivora-doctor: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        args.interfaces.clone()
    };
    let bpffs = args
        .pin_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/fs/bpf"));
    let src = Sources {
        bpffs,
        pin_dir: args.pin_dir.clone(),
        ..Sources::default()
    };
    let facts = probe::gather(&src, &interfaces);
    let default_snat = FullNatSettings::default();
    let (snat_ports, snat_ports_from) = match &config {
        Some(c) => (c.snat_ports, c.path.display().to_string()),
        None => (
            PortRange {
                first: default_snat.port_min,
                last: default_snat.port_max,
            },
            "the default".to_string(),
        ),
    };
    let report = checks::evaluate(
        &facts,
        &checks::Options {
            modes,
            flow_table_size: args.flow_table_size,
            kubernetes: args.kubernetes,
            bgp_listen_port: args.bgp_listen_port,
            snat_ports,
            snat_ports_from,
            local_source_vip: config.and_then(|c| c.local_source_vip),
        },
    );
    if args.output == "json" {
        println!("{}", render::json(&report));
    } else {
        print!("{}", render::table(&report));
    }
    if report.blocking {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
