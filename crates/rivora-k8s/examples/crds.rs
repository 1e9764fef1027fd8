//! Prints the CRDs: `cargo run -p rivora-k8s --example crds > helm/crds/servicepolicies.rivora.io.yaml`.
fn main() {
    print!("{}", rivora_k8s::crds_yaml());
}
