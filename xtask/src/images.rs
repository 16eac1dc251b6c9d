//! `cargo xtask images`: skiff's own images (skiff/proxy, skiff/cni, skiff/agent,
//! skiff/server, tagged with the workspace version) and the busybox test images
//! (skiff.test/pause:1, skiff.test/tools:1), as OCI archives under `<target>/images/`.
//!
//! The archive builder lives in skiff-agent's testing side (`skiff_agent::images`, behind
//! `skiff-lab images build|components`); xtask runs that binary instead of linking the
//! library, so xtask itself keeps building without protoc and the agent's dependency tree
//! (it is what installs protoc on a fresh machine).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use crate::process::run;

/// Builds the binaries (release profile unless `release` is false), then the archives into
/// `out` (default `<target dir>/images`); returns the directory.
pub fn build(
    root: &Path,
    out: Option<PathBuf>,
    release: bool,
    components: &[String],
) -> Result<PathBuf> {
    crate::setup::all(root)?;
    let bin = crate::cluster::build(root, release)?;
    let out = out.unwrap_or_else(|| bin.parent().unwrap_or(&bin).join("images"));
    let lab = bin.join("skiff-lab");
    run(Command::new(&lab).args(["images", "build"]).arg(&out))?;
    let mut cmd = Command::new(&lab);
    cmd.args(["images", "components"]).arg(&out).arg("--bin-dir").arg(&bin);
    for c in components {
        cmd.args(["--component", c]);
    }
    run(&mut cmd)?;
    Ok(out)
}
