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
