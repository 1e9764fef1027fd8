//! The L2 speaker's parts that need no libbpf (rivorad's `src/l2/`
//! is the glue): ARP and NDP frames ([`frames`]), which node stands for
//! which VIP ([`plan`]), the AF_PACKET sockets ([`socket`]) and the
//! responder of one interface ([`responder`]). [`pcap`] reads captures
//! back and [`audit`] judges them, for the tests and the bench.

pub mod audit;
pub mod frames;
pub mod pcap;
pub mod plan;
pub mod responder;
pub mod socket;
