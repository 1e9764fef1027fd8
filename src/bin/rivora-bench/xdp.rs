//! Per-packet cost of the BPF programs.

use anyhow::Result;

use crate::Results;

pub fn run(_results: &mut Results) -> Result<()> {
    Ok(())
}
