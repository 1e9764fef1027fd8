//! Rivora: an eBPF layer-4 load balancer. XDP in, TCX out, weighted
//! Maglev, NAT / DSR / L3 DSR.

pub mod abi;
pub mod bgp;
pub mod bpf;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub mod healthcheck;
pub mod l2;
pub mod metrics;
pub mod netlink;
pub mod nexthop;
pub mod reconciler;
pub mod sources;

// The libbpf-free crates, under the paths they always had.
pub use rivora_api as api;
pub use rivora_model::{config, desired, maglev, model, source_range};
