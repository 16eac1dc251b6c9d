//! `cargo xtask images`: the busybox test images (skiff.test/pause:1, skiff.test/tools:1) as
//! OCI archives under `<target>/images/`.
//!
//! The archive builder lives in skiff-agent's testing side (`skiff_agent::images`, behind
//! `skiff-lab images build`); xtask runs that binary instead of linking the library,
//! so xtask itself keeps building without protoc and the agent's dependency tree (it is
//! what installs protoc on a fresh machine).

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::process::{cargo, run};

/// Builds the archives into `out` (default `<target dir>/images`) and returns the directory.
pub fn build(root: &Path, out: Option<PathBuf>) -> Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let out = out.unwrap_or_else(|| target.join("images"));
    run(cargo()
        .current_dir(root)
        .args(["run", "-q", "-p", "skiff-agent", "--features", "testing", "--bin", "skiff-lab"])
        .args(["--", "images", "build"])
        .arg(&out))?;
    Ok(out)
}
