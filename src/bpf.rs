//! The generated skeletons. Map keys and values come from BTF, so their
//! one definition stays `include/rivora/abi.h`.

#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unused
)]
pub mod xdp_ingress {
    include!(concat!(env!("OUT_DIR"), "/xdp_ingress.skel.rs"));
}

#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unused
)]
pub mod tc_nat {
    include!(concat!(env!("OUT_DIR"), "/tc_nat.skel.rs"));
}

/// xdp_ingress as of the baseline commit (build.rs), for rivora-bench's
/// before/after figures only: never loaded by rivorad.
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

/// Benchmark wrappers (restore the packet, tail-call the program under
/// test); used by `rivora-bench` only.
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

/// The backend-side L3 DSR decapsulator and the trivial xdp_pass program
/// (see `crate::decap`). Its maps are its own and are not pinned.
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unused
)]
pub mod decap {
    include!(concat!(env!("OUT_DIR"), "/decap.skel.rs"));
}

/// The lab's XDP traffic generator (see `crate::xdpgen`); used by
/// `rivora-bench` and its test only.
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
