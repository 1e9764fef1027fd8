//! Namespaces and commands, from the test lab (crates/rivora-testlab),
//! under the path the tests name them by.

pub use rivora_testlab::netns::*;
pub use rivora_testlab::sh;
