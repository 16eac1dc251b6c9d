//! Map keys and values shared by the eBPF programs (`ebpf/`) and the proxy (`proxy/`).
#![no_std]
