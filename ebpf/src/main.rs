//! skiff's eBPF programs: socket-LB (cgroup sock_addr), per-packet tc NAT and XDP NodePort.
//!
//! Built for `bpfel-unknown-none` by `cargo xtask build-ebpf` (or the proxy's build script).
//! On the host the same code compiles into an inert binary so clippy checks it too.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// Inline assembly emits the one kfunc call aya 0.14 cannot relocate (tc.rs `kern_skb`);
// enabled on the pinned stable toolchain like -Z build-std (RUSTC_BOOTSTRAP=1).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]
#![allow(clippy::missing_safety_doc)]

mod ct;
mod flow_cache;
mod maps;
mod packet;
mod reject;
mod sock;
mod tc;
mod xdp;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program whose panic path is reachable; this never runs.
    unsafe { core::hint::unreachable_unchecked() }
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual BSD/GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {}
