//! The real kube-apiserver and etcd of the test lab
//! (crates/rivora-testlab), under the path the tests name it by.

pub use rivora_testlab::apiserver::*;
