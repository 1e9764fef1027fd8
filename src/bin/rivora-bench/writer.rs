//! Map writer and Maglev figures (issue: the map writer).

use anyhow::Result;

use crate::Results;

pub fn run(_results: &mut Results) -> Result<()> {
    Ok(())
}
