//! Rivora's BGP speaker, announce-only: one session per peer that
//! advertises the VIPs a node can serve as /32 and /128 routes.
//!
//! - [`wire`]: messages through `netgauze-bgp-pkt` (encode and decode,
//!   capabilities, MP-BGP, communities), with RFC 4271's header checks
//!   and NOTIFICATIONs in front of the parser.
//! - [`fsm`]: the RFC 4271 state machine, pure.
//! - [`session`]: one peer's driver: TCP (active or passive, TCP MD5),
//!   timers, connect-retry with backoff, the Adj-RIB-Out and its UPDATEs,
//!   graceful restart (RFC 4724), BFD.
//! - [`bfd`]: single-hop BFD (RFC 5880, RFC 5881).
//! - [`speaker`]: the peers, the listener and the routes, behind a handle.
//!
//! No libbpf: the daemon glue (what to announce, from the dataplane's
//! status) lives in rivorad.

pub mod bfd;
pub mod fsm;
pub mod md5;
pub mod session;
pub mod speaker;

pub use fsm::{Notification, State};
pub use speaker::{PeerConfig, PeerStatus, Route, Speaker, SpeakerConfig, SpeakerError};
pub use wire::{Family, RouteAttrs};
pub mod wire;
