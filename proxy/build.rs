//! Builds the eBPF object with the same code as `cargo xtask build-ebpf` and hands it to
//! the crate as `$OUT_DIR/skiff-ebpf.o` (embedded by `loader.rs`).
//!
//! `SKIFF_EBPF_STUB=1` writes an empty object instead, for `cargo check`/clippy on machines
//! without bpf-linker; loading a stub fails with a clear error, so tests and binaries built
//! that way cannot pass by accident.

#[allow(dead_code)]
#[path = "../xtask/src/ebpf.rs"]
mod ebpf;

use std::path::{Path, PathBuf};

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("skiff-ebpf.o");
    println!("cargo:rerun-if-env-changed=SKIFF_EBPF_STUB");
    if std::env::var("SKIFF_EBPF_STUB").is_ok_and(|v| v == "1") {
        println!("cargo:warning=SKIFF_EBPF_STUB=1: embedding an empty eBPF object");
        std::fs::write(&out, [])?;
        return Ok(());
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent().map(Path::to_path_buf).unwrap_or(manifest);
    for dir in ["ebpf/src", "ebpf/common/src", "ebpf/Cargo.toml", "ebpf/common/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("xtask/src/ebpf.rs").display());
    let obj = ebpf::build_ebpf(&root, true)?;
    std::fs::copy(&obj, &out)?;
    Ok(())
}
