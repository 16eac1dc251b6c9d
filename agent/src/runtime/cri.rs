//! [`Runtime`](super::Runtime) over containerd's CRI gRPC socket (tonic, `k8s-cri`).
