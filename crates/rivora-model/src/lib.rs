//! Rivora's desired state, free of libbpf: what a VIP is and how it is
//! validated ([`model`]), weighted Maglev ([`maglev`]), the static YAML
//! file ([`config`]), health-check specs ([`health`]) and the rules of
//! a Lease's timings ([`lease`]). rivorad,
//! rivoractl and the cluster controllers share it; only the dataplane
//! crate turns it into map entries.

pub mod cli;
pub mod config;
pub mod desired;
pub mod health;
pub mod lease;
pub mod maglev;
pub mod model;
pub mod source_range;
