//! rivora-controller: the cluster half of the Kubernetes path. One
//! replica leads through a Lease ([`leader`], from rivora-lease); the
//! leader assigns addresses from AddressPools to LoadBalancer Services
//! ([`ipam`]) and is the only writer of their status ([`run`]), of the
//! Gateway API's, and of the ServicePolicies' ([`policies`]). Every
//! replica watches, so a follower takes over with warm copies.

pub mod gateways;
pub mod ipam;
pub mod metrics;
pub mod policies;
pub mod run;

pub use rivora_lease as leader;
