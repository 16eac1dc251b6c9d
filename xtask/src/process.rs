//! Running the tools xtask drives: each command is echoed, and a failure is an error.

use std::process::Command;

use anyhow::{Context, Result, bail};

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}
