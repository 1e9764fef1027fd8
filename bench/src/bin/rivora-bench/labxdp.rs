//! `rivora-bench lab-xdp IFACE pass|decap [VIP...]`: what scripts/lab-bench.sh
//! needs on the lab's veths and cannot do from a shell (Debian's iproute2
//! cannot attach an object embedded in a binary). Attaches `xdp_pass` (a
//! veth whose peer sends with XDP_TX or XDP_REDIRECT delivers only when it
//! runs XDP itself) or the backend-side decapsulator for L3 DSR to IFACE in
//! the caller's network namespace (run it under `nsenter --net=...`), prints
//! `attached`, and holds the link until it is killed: the link is not
//! pinned, so it goes with the process.

use std::io::Write;
use std::net::IpAddr;

use anyhow::{bail, Context, Result};
use rivora::dataplane::attach::ifindex;
use rivora::decap::Decap;

pub fn run(args: &[String]) -> Result<()> {
    let (iface, what, vips) = match args {
        [iface, what, vips @ ..] => (iface, what.as_str(), vips),
        _ => bail!("usage: rivora-bench lab-xdp IFACE pass|decap [VIP...]"),
    };
    let idx = ifindex(iface).with_context(|| format!("interface {iface}"))?;
    let decap = Decap::load().context("loading the decap object")?;
    let _link = match what {
        "pass" => {
            if !vips.is_empty() {
                bail!("xdp_pass takes no VIPs");
            }
            decap.attach_pass(idx)
        }
        "decap" => {
            if vips.is_empty() {
                bail!("decap needs at least one VIP");
            }
            for v in vips {
                let vip: IpAddr = v.parse().with_context(|| format!("VIP {v:?}"))?;
                decap
                    .add_vip(vip)
                    .with_context(|| format!("adding VIP {vip}"))?;
            }
            decap.attach(idx)
        }
        other => bail!("unknown program {other:?}: pass or decap"),
    }
    .with_context(|| format!("attaching {what} to {iface}"))?;
    println!("attached");
    std::io::stdout().flush().ok();
    loop {
        std::thread::park();
    }
}
