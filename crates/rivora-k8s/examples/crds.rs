//! Prints every CRD as one YAML stream (what `rivorad crds` prints), or,
//! with `--write`, writes each to its file under helm/crds/:
//! `cargo run -p rivora-k8s --example crds -- --write`.
use std::path::Path;

fn main() {
    let write = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--write") => true,
        Some(other) => {
            eprintln!("usage: crds [--write]  (unknown argument {other:?})");
            std::process::exit(2);
        }
    };
    if !write {
        print!("{}", rivora_k8s::crds_yaml());
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for f in rivora_k8s::crd_files() {
        let path = root.join(f.path);
        if let Err(e) = std::fs::write(&path, &f.yaml) {
            eprintln!("writing {}: {e}", path.display());
            std::process::exit(1);
        }
        eprintln!("wrote {}", f.path);
    }
}
