//! skiff-proxy: eBPF service proxy (kube-proxy replacement)
