//! The bench's BPF objects: `bench/bpf/*.bpf.c` (the test-run wrapper and
//! the lab's traffic generator), built against the datapath's headers;
//! and, when `RIVORA_BENCH_BASE` names a git revision (`make
//! bench-compare BASE=REV`), that revision's `xdp_ingress`, for
//! before/after figures. Without it nothing is taken from git: a plain
//! build compiles only this tree.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .expect("bench/ sits in the workspace")
        .to_path_buf();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bench_bpf = manifest.join("bpf");
    let (bpf, include) = (root.join("bpf"), root.join("include"));
    for dir in [&bench_bpf, &bpf.join("lib"), &include] {
        rerun_for_tree(dir);
    }
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-env-changed=RIVORA_BENCH_BASE");
    let clang = env::var("BPF_CLANG").unwrap_or_else(|_| "clang".to_string());
    let cflags = |inc: &Path, bpf: &Path, strict: bool| {
        let mut a = vec!["-O2".to_string(), "-g".to_string(), "-mcpu=v3".to_string()];
        if strict {
            a.extend(["-Wall".to_string(), "-Werror".to_string()]);
        }
        // As the kernel is built: headers are read through more than one
        // pointer type.
        a.push("-fno-strict-aliasing".to_string());
        a.push(format!("-I{}", inc.display()));
        a.push(format!("-I{}", bpf.display()));
        a
    };
    for stem in ["bench", "xdpgen"] {
        let src = bench_bpf.join(format!("{stem}.bpf.c"));
        SkeletonBuilder::new()
            .source(&src)
            .clang(&clang)
            .clang_args(cflags(&include, &bpf, true))
            .build_and_generate(out.join(format!("{stem}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
    }

    println!("cargo::rustc-check-cfg=cfg(rivora_baseline)");
    let Some(rev) = env::var("RIVORA_BENCH_BASE").ok().filter(|r| !r.is_empty()) else {
        return;
    };
    let base = out.join("baseline");
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(&base).expect("the baseline's directory");
    let extracted = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "git -C '{}' archive --format=tar '{rev}' bpf include | tar -x -C '{}'",
            root.display(),
            base.display()
        ))
        .status()
        .is_ok_and(|s| s.success())
        && base.join("bpf/xdp_ingress.bpf.c").exists();
    assert!(
        extracted,
        "RIVORA_BENCH_BASE={rev}: no bpf/xdp_ingress.bpf.c at that revision in git"
    );
    SkeletonBuilder::new()
        .source(base.join("bpf/xdp_ingress.bpf.c"))
        .clang(&clang)
        .clang_args(cflags(&base.join("include"), &base.join("bpf"), false))
        .build_and_generate(out.join("xdp_ingress_base.skel.rs"))
        .unwrap_or_else(|e| panic!("building xdp_ingress of {rev}: {e:#}"));
    println!("cargo:rustc-cfg=rivora_baseline");
}

fn rerun_for_tree(dir: &Path) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rerun_for_tree(&path);
        } else {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
