//! Compiles every `bpf/*.bpf.c` with clang into a libbpf-rs skeleton, so
//! that map keys and values are Rust types generated from the same BTF the
//! kernel sees (`include/rivora/abi.h` is their one definition).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let manifest =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bpf_dir = manifest.join("bpf");
    let include = manifest.join("include");

    // libbpf-cargo does not know which headers a program includes, so
    // every file under bpf/ and include/ reruns the build.
    for dir in [&bpf_dir, &include] {
        rerun_for_tree(dir);
    }

    let mut sources: Vec<PathBuf> = fs::read_dir(&bpf_dir)
        .expect("bpf/ is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();

    let extra_cflags = env::var("RIVORA_BPF_CFLAGS").unwrap_or_default();
    println!("cargo:rerun-if-env-changed=RIVORA_BPF_CFLAGS");
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    let clang = env::var("BPF_CLANG").unwrap_or_else(|_| "clang".to_string());

    for src in sources {
        let file = src
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 file name");
        let stem = file.trim_end_matches(".bpf.c");
        let skel = out.join(format!("{stem}.skel.rs"));
        let mut args = vec![
            "-O2".to_string(),
            "-g".to_string(),
            "-mcpu=v3".to_string(),
            "-Wall".to_string(),
            "-Werror".to_string(),
            // The kernel is built this way too: BPF code reads headers through
            // more than one pointer type (a struct, then its 16-bit words).
            "-fno-strict-aliasing".to_string(),
            format!("-I{}", include.display()),
            format!("-I{}", bpf_dir.display()),
        ];
        args.extend(extra_cflags.split_whitespace().map(str::to_string));
        SkeletonBuilder::new()
            .source(&src)
            .clang(&clang)
            .clang_args(args)
            .build_and_generate(&skel)
            .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
    }
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
