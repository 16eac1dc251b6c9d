//! skiff-proxy: the eBPF service proxy (kube-proxy replacement). Watches Services and
//! EndpointSlices, computes the desired frontends and backends, diffs them against the pinned
//! BPF maps and applies incremental updates; loads and attaches the eBPF programs.
//!
//! It builds on the core crate and kube-rs, and may not import anything of the control plane
//! above the core crate (store, machinery, apiserver, scheduler, controllers) nor the agent:
//! the agent hosts it, and it also runs alone on any Kubernetes cluster.

pub mod batch;
pub mod config;
pub mod daemon;
pub mod desired;
pub mod http;
pub mod kbtf;
pub mod loader;
pub mod maglev;
pub mod maps;
pub mod netaddrs;
pub mod status;
pub mod sync;
