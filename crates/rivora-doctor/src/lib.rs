//! rivora-doctor: whether a node can run Rivora, check by check.
//!
//! Two halves, so every verdict is testable without the machine it
//! describes: [`probe`] gathers [`Facts`] from the host (sysfs, procfs,
//! statfs, rtnetlink, the `netdev` generic netlink family, bpf(2)), and
//! [`checks::evaluate`] turns facts into [`Check`]s, purely. Each check
//! says what it found, why that matters and how to fix it, and which modes
//! a failure blocks; [`Report::blocking`] is what the exit code follows.

pub mod checks;
pub mod ports;
pub mod probe;
pub mod render;

mod bpf;
mod genl;
mod links;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use checks::{evaluate, Options};
pub use ports::PortRange;
pub use probe::{Facts, Iface, KubeProxy, Prog};

/// What a node may be asked to serve: the forwarding modes of its VIPs and
/// the way VIPs are announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Nat,
    Dsr,
    L3dsr,
    Fullnat,
    L2,
    Bgp,
}

impl Mode {
    pub const FORWARDING: [Mode; 4] = [Mode::Nat, Mode::Dsr, Mode::L3dsr, Mode::Fullnat];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Nat => "nat",
            Mode::Dsr => "dsr",
            Mode::L3dsr => "l3dsr",
            Mode::Fullnat => "fullnat",
            Mode::L2 => "l2",
            Mode::Bgp => "bgp",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nat" => Ok(Mode::Nat),
            "dsr" => Ok(Mode::Dsr),
            "l3dsr" => Ok(Mode::L3dsr),
            "fullnat" => Ok(Mode::Fullnat),
            "l2" => Ok(Mode::L2),
            "bgp" => Ok(Mode::Bgp),
            _ => Err(format!(
                "{s:?} is not a mode: nat, dsr, l3dsr, fullnat, l2 or bgp"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// `kernel`, `btf`, `bpffs`, `capabilities`, `interface`,
    /// `xdp-driver`, `xdp-programs`, `tcx-programs`, `ip-forward`,
    /// `rp-filter`, `accept-local`, `mtu`, `snat-ports`, `kube-proxy`,
    /// `memory`, `clocksource`, `bpf-jit`.
    pub id: String,
    /// The interface a per-interface check is about.
    pub subject: Option<String>,
    pub verdict: Verdict,
    /// What was seen, with the values.
    pub found: String,
    /// Why it matters to Rivora.
    pub why: String,
    /// What to do; none when it passes.
    pub fix: Option<String>,
    /// The modes a failure makes impossible (empty unless it fails).
    pub blocks: Vec<Mode>,
}

impl Check {
    /// Whether this check fails a mode in `chosen`.
    pub fn blocks_any(&self, chosen: &[Mode]) -> bool {
        self.verdict == Verdict::Fail && self.blocks.iter().any(|m| chosen.contains(m))
    }
}

/// Every check, for the modes asked about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub version: String,
    /// The modes the node must serve (forwarding and announcement).
    pub modes: Vec<Mode>,
    pub checks: Vec<Check>,
    /// Whether a failed check blocks one of `modes`: the exit code is 1.
    pub blocking: bool,
}

impl Report {
    pub fn new(modes: Vec<Mode>, checks: Vec<Check>) -> Self {
        let blocking = checks.iter().any(|c| c.blocks_any(&modes));
        Self {
            version: env!("CARGO_PKG_VERSION").to_string(),
            modes,
            checks,
            blocking,
        }
    }
}
