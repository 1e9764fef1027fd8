//! The packet suites, one test binary: the real BPF objects, crafted
//! packets through BPF_PROG_TEST_RUN, assertions on the verdict, every
//! output byte and checksum, and the maps after. One binary so that the
//! shared scaffolding (`tests/common`) compiles and links once; each
//! module says what it covers. Needs root and bpffs (`scripts/bpffs.sh`).

#[path = "../common/mod.rs"]
mod common;

mod abi_upgrade;
mod config_to_packets;
mod decap;
mod frag_icmp;
mod fullnat;
mod icmp_reply;
mod lb;
mod load_smoke;
mod modes;
mod shapes;
mod smoke;
mod tunnel;
mod writer_maps;
