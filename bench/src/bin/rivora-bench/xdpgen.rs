//! `rivora-bench xdpgen --dev IFACE ...`: the lab's second packet
//! generator (scripts/lab-bench.sh), live XDP frames redirected into IFACE
//! in the caller's network namespace so that IFACE's veth peer receives
//! `xdp_frame`s (see `rivora_bench::xdpgen`). Runs on the first CPU it is allowed
//! (pin it with taskset) and prints `xdpgen_sent=N xdpgen_secs=S`.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use rivora::dataplane::attach::ifindex;
use rivora_bench::xdpgen::{Flows, Frame, Generator};

const USAGE: &str = "usage: rivora-bench xdpgen --dev IFACE --dst-mac MAC --src-mac MAC \
--src IPV4 --dst IPV4 --sport PORT --dport PORT --flows 1|64k|new --seconds S \
[--batch 1-256 (64)] [--chunk FRAMES (262144)] [--seed N]";

pub fn run(args: &[String]) -> Result<()> {
    let mut opts: HashMap<&str, &str> = HashMap::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(name) = flag.strip_prefix("--") else {
            bail!("unexpected argument {flag:?}\n{USAGE}");
        };
        let value = it
            .next()
            .with_context(|| format!("--{name} needs a value\n{USAGE}"))?;
        opts.insert(name, value.as_str());
    }
    let get = |name: &str| {
        opts.get(name)
            .copied()
            .with_context(|| format!("--{name} is missing\n{USAGE}"))
    };
    let num = |name: &str, default: Option<u64>| -> Result<u64> {
        match (opts.get(name), default) {
            (Some(v), _) => v.parse().with_context(|| format!("--{name} {v:?}")),
            (None, Some(d)) => Ok(d),
            (None, None) => bail!("--{name} is missing\n{USAGE}"),
        }
    };
    for name in opts.keys() {
        if ![
            "dev", "dst-mac", "src-mac", "src", "dst", "sport", "dport", "flows", "seconds",
            "batch", "chunk", "seed",
        ]
        .contains(name)
        {
            bail!("unknown option --{name}\n{USAGE}");
        }
    }
    let dev = get("dev")?;
    let frame = Frame {
        dst_mac: mac(get("dst-mac")?)?,
        src_mac: mac(get("src-mac")?)?,
        src: ip(get("src")?)?,
        dst: ip(get("dst")?)?,
        sport: port(num("sport", None)?, "sport")?,
        dport: port(num("dport", None)?, "dport")?,
    };
    let flows: Flows = get("flows")?.parse()?;
    let seconds = num("seconds", None)?;
    let batch = u32::try_from(num("batch", Some(64))?).context("--batch")?;
    let chunk = u32::try_from(num("chunk", Some(1 << 18))?).context("--chunk")?;
    if chunk == 0 {
        bail!("--chunk must be at least 1 frame");
    }
    // A new flow's source port is the counter's high half: start it at 1.
    let seed = u32::try_from(num("seed", Some(1 << 16))?).context("--seed")?;

    // The counter is per CPU: stay on one.
    let allowed = sched_getaffinity(Pid::from_raw(0)).context("reading the CPU affinity")?;
    let cpu = (0..CpuSet::count())
        .find(|&c| allowed.is_set(c).unwrap_or(false))
        .context("no CPU allowed")?;
    let mut one = CpuSet::new();
    one.set(cpu).context("CPU set")?;
    sched_setaffinity(Pid::from_raw(0), &one).with_context(|| format!("pinning to CPU {cpu}"))?;

    let idx = ifindex(dev).with_context(|| format!("interface {dev}"))?;
    let generator = Generator::load(idx, flows, seed, &frame)?;
    let want = Duration::from_secs(seconds);
    let start = Instant::now();
    let mut sent: u64 = 0;
    while start.elapsed() < want {
        generator.send(chunk, batch)?;
        sent += u64::from(chunk);
    }
    println!(
        "xdpgen_sent={sent} xdpgen_secs={:.3}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        bail!("MAC address {s:?}: six hex octets separated by ':'");
    }
    let mut out = [0u8; 6];
    for (o, p) in out.iter_mut().zip(parts) {
        *o = u8::from_str_radix(p, 16).with_context(|| format!("MAC address {s:?}"))?;
    }
    Ok(out)
}

fn ip(s: &str) -> Result<Ipv4Addr> {
    s.parse()
        .with_context(|| format!("IPv4 address {s:?} (the generator sends IPv4 only)"))
}

fn port(v: u64, name: &str) -> Result<u16> {
    u16::try_from(v)
        .ok()
        .filter(|&p| p != 0)
        .with_context(|| format!("--{name} {v}: 1 to 65535"))
}
