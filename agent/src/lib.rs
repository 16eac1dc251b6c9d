//! skiff-agent: node registration, pod sync over CRI, CNI/route glue, hosts the proxy
