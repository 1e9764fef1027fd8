//! Binaries of other workspace packages. Cargo gives an integration test
//! only its own package's binaries (`CARGO_BIN_EXE_*`), and rivoractl and
//! rivora-controller are packages of their own so that they build without
//! libbpf: the tests find them beside their own executable, where
//! `make test` (and `cargo build --workspace`) put them.
#![allow(dead_code)]

use std::path::PathBuf;

/// `target/<profile>/NAME`, built by `cargo build --workspace` before the
/// tests.
pub fn sibling(name: &str) -> PathBuf {
    // A test runs as target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test runs from target/<profile>/deps");
    let bin = profile_dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it first (`cargo build --workspace --bins`, which `make test` does)",
        bin.display()
    );
    bin
}

pub fn rivoractl() -> PathBuf {
    sibling("rivoractl")
}

pub fn rivora_controller() -> PathBuf {
    sibling("rivora-controller")
}

pub fn rivora_doctor() -> PathBuf {
    sibling("rivora-doctor")
}

pub fn rivora() -> PathBuf {
    sibling("rivora")
}

/// The benchmarks (bench/), whose areas some end-to-end tests run small.
pub fn rivora_bench() -> PathBuf {
    sibling("rivora-bench")
}
