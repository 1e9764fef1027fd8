//! The L2 speaker's parts that need no libbpf (rivorad's `src/speaker/`
//! is the glue): ARP and NDP frames ([`frames`]), which node answers for
//! which VIP ([`plan`]), and the responder on AF_PACKET sockets
//! ([`responder`]). [`pcap`] reads captures back, for the tests.

pub mod frames;
pub mod pcap;
