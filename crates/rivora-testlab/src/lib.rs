//! The test lab: what the end-to-end tests, the packet tests and the
//! benchmarks (bench/) build their labs from, said once.
//!
//! - [`cmd`]: shell commands whose failure carries their output.
//! - [`netns`]: named network namespaces removed on drop, a thread in one
//!   ([`netns::InNetns`], [`netns::spawn_in`]).
//! - [`apiserver`]: a real kube-apiserver and etcd on loopback
//!   (`scripts/apiserver.sh`), stopped on drop.
//! - [`paced`]: senders paced against the clock, sends that retry.
//! - [`require`]: what a test needs from the machine, or a failure that
//!   says what to install.
//!
//! Every guard cleans up in `Drop`, so a failing test or bench leaves no
//! namespace, link or server behind. The panicking forms are for tests;
//! the `try_` forms return errors, for the bench. Dev-only: no product
//! crate depends on this one.

pub mod apiserver;
pub mod cmd;
pub mod netns;
pub mod paced;
pub mod require;

use std::sync::atomic::{AtomicU32, Ordering};

pub use cmd::{sh, try_sh, CmdError};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique name for a test's namespaces, links, pins and directories:
/// pid plus a per-process counter, so parallel tests and parallel runs
/// never collide. Kept short: interface names have 15 bytes.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
