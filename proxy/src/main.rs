//! `skiff-proxy`: the eBPF service proxy daemon and its map inspection commands.

fn main() {}
