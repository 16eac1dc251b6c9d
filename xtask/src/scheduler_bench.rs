//! `cargo xtask bench scheduler`: `dist` builds (fat LTO) of skiff-server and skiff-bench, then
//! `skiff-bench scheduler` (1,000 nodes; 10,000 and 50,000 pods; the skiff scheduler against
//! a trivial round-robin binder in the same run). `SKIFF_BENCH_PODS=2000,5000` overrides the
//! pod counts for a quick run.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::process::run;

pub fn bench(root: &Path) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo).current_dir(root).args([
        "build",
        "--profile",
        "dist",
        "-p",
        "skiff-control-plane",
        "-p",
        "skiff-tests",
        "--bin",
        "skiff-server",
        "--bin",
        "skiff-bench",
    ]))?;
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), Into::into);
    let release = target.join("dist");
    run(Command::new(release.join("skiff-bench"))
        .arg("scheduler")
        .arg(release.join("skiff-server"))
        .arg(root.join("target/bench")))
}
