//! containerd for a node: its config file (per-instance root/state/socket/runc Root, CRI and CNI settings) and its process.
