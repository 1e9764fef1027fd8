//! Sources of desired state. A source only says what it wants
//! ([`crate::reconciler::Command::SetDesired`], `Synced`, `SourceFailed`);
//! it never touches the writer or the maps.

pub mod file;
