//! `cargo xtask bench <name>`: benchmarks print a table and write JSON under target/bench/.

use std::path::Path;

use anyhow::{Result, bail};

pub fn run(root: &Path, name: &str) -> Result<()> {
    match name {
        // proxy/examples/bench_dataplane.rs: BPF_PROG_TEST_RUN ns/packet and map programming.
        "dataplane" => crate::run(crate::cargo().current_dir(root).args([
            "run",
            "--release",
            "-p",
            "skiff-proxy",
            "--example",
            "bench_dataplane",
        ])),
        _ => bail!("unknown benchmark {name:?}"),
    }
}
