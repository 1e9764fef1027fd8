//! Gateway API: which Gateways are Rivora's, their listeners as VIPs, the
//! attachment of TCPRoutes and UDPRoutes, and the status every object
//! should carry.

pub mod api;
