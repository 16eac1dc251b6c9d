//! `cargo xtask bench <name>`: benchmarks print a table and write JSON under target/bench/.

use std::path::Path;

use anyhow::{Result, bail};

pub fn run(_root: &Path, name: &str) -> Result<()> {
    bail!("unknown benchmark {name:?}")
}
