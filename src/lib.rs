//! Rivora: an eBPF layer-4 load balancer. XDP in, TCX out, weighted
//! Maglev, NAT / DSR / L3 DSR.

pub mod abi;
pub mod api;
pub mod bpf;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub mod healthcheck;
pub mod maglev;
pub mod metrics;
pub mod model;
pub mod netlink;
