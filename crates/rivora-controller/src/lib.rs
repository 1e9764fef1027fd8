//! rivora-controller: the cluster half of the Kubernetes path. Built so
//! far: leader election with a write fence (re-exported from
//! rivora-lease as [`leader`]). To come (issue 14): AddressPool IPAM and
//! the status writers, which write only while
//! [`leader::Leadership::leads`].

pub use rivora_lease as leader;
