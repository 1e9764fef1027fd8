//! Binaries of other workspace packages. Cargo gives an integration test
//! only its own package's binaries (`CARGO_BIN_EXE_*`), and rivoractl is
//! its own package so that it builds without libbpf: the tests find it
//! beside their own executable, where `make test` (and `cargo build`)
//! put it.
#![allow(dead_code)]

use std::path::PathBuf;

/// `target/<profile>/rivoractl`, built by `cargo build` before the tests.
pub fn rivoractl() -> PathBuf {
    // A test runs as target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test runs from target/<profile>/deps");
    let bin = profile_dir.join("rivoractl");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (`cargo build -p rivoractl`, which `make test` does)",
        bin.display()
    );
    bin
}
