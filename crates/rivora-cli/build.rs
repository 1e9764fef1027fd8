//! Embeds the Helm chart (`helm/` at the workspace's root) in the binary:
//! one version, the binary's. Every file Helm would load, symlinks
//! followed (the Gateway API subcharts' crds/ point into
//! helm/gateway-api-crds/), without what .helmignore leaves out.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

fn ignored(helmignore: &[String], rel: &str, is_dir: bool) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    helmignore.iter().any(|p| {
        if let Some(dir) = p.strip_suffix('/') {
            is_dir && rel == dir
        } else if let Some(suffix) = p.strip_prefix('*') {
            name.ends_with(suffix)
        } else {
            rel == p
        }
    })
}

fn walk(root: &Path, dir: &Path, helmignore: &[String], out: &mut Vec<(String, PathBuf)>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let rel = p
            .strip_prefix(root)
            .expect("under the chart")
            .to_string_lossy()
            .into_owned();
        // metadata follows symlinks.
        let meta = fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if ignored(helmignore, &rel, meta.is_dir()) {
            continue;
        }
        println!("cargo:rerun-if-changed={}", p.display());
        if meta.is_dir() {
            walk(root, &p, helmignore, out);
        } else {
            out.push((rel, fs::canonicalize(&p).expect("a real path")));
        }
    }
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let chart = manifest.join("../../helm");
    let chart = fs::canonicalize(&chart).expect("helm/ beside crates/");
    println!("cargo:rerun-if-changed={}", chart.display());
    let helmignore: Vec<String> = fs::read_to_string(chart.join(".helmignore"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let mut files = Vec::new();
    walk(&chart, &chart, &helmignore, &mut files);
    let mut code = String::from("/// The chart's files: (path inside the chart, contents).\npub static FILES: &[(&str, &[u8])] = &[\n");
    for (rel, abs) in &files {
        code += &format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            abs.display().to_string()
        );
    }
    code += "];\n";
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("chart_files.rs");
    fs::write(&out, code).expect("writing chart_files.rs");
}
