//! The bench's skeletons (bench/build.rs).

/// Benchmark wrappers: restore the packet, tail-call the program under
/// test.
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unused
)]
pub mod bench {
    include!(concat!(env!("OUT_DIR"), "/bench.skel.rs"));
}

/// The lab's XDP traffic generator (see `crate::xdpgen`).
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unused
)]
pub mod xdpgen {
    include!(concat!(env!("OUT_DIR"), "/xdpgen.skel.rs"));
}

/// xdp_ingress as of `RIVORA_BENCH_BASE` (`make bench-compare BASE=REV`),
/// for before/after figures: never loaded by rivorad.
#[cfg(rivora_baseline)]
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unused
)]
pub mod xdp_ingress_base {
    include!(concat!(env!("OUT_DIR"), "/xdp_ingress_base.skel.rs"));
}
