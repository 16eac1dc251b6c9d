//! skiff's eBPF programs. Built only for `bpfel-unknown-none` by `cargo xtask build-ebpf`;
//! on the host this compiles to an empty binary so workspace-wide checks still pass.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

#[cfg(not(target_arch = "bpf"))]
fn main() {}
