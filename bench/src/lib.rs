//! What the benchmarks share with their tests: the BPF objects only the
//! bench loads ([`bpf`]), and the lab's XDP traffic generator
//! ([`xdpgen`]). None of it is in the `rivora` crate, which is what a
//! node runs.

pub mod bpf;
pub mod xdpgen;
