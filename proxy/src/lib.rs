//! skiff-proxy: the eBPF service proxy (kube-proxy replacement). Watches Services and
//! EndpointSlices, computes the desired frontends and backends, diffs them against the pinned
//! BPF maps and applies incremental updates; loads and attaches the eBPF programs.

pub mod batch;
pub mod daemon;
pub mod desired;
pub mod http;
pub mod kbtf;
pub mod loader;
pub mod maglev;
pub mod maps;
pub mod sync;
