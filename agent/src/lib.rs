//! skiff-agent: the node agent. It registers its Node and heartbeats a Lease ([`node`]),
//! runs the pods bound to it through CRI ([`pods`] over a [`runtime::Runtime`]), reports
//! their status, serves logs and exec ([`streaming`]), answers cluster DNS ([`dns`]), and
//! keeps the node's network glue: skiff-cni's config, cross-node routes, the eBPF proxy
//! ([`network`]).
//!
//! The data flow is the one of DESIGN.md: the agent only watches and writes through the
//! apiserver; the runtime and the kernel are its only other partners.
//!
//! It builds on the core crate, the proxy and the CNI plugin's library, and may not import
//! the store, the API machinery, the apiserver, the scheduler or the controllers, nor a
//! storage engine or an HTTP server framework of the control plane (redb, etcd-client,
//! axum): only the `testing` feature (the lab and the test rig, never shipped) links the
//! in-memory apiserver.

pub mod agent;
pub mod cgroups;
pub mod config;
pub mod credentials;
pub mod dns;
pub mod metrics;
pub mod network;
pub mod node;
pub mod pods;
pub mod runtime;
pub mod streaming;

// Test and lab tooling, never in a shipped build: containerd instances of their own, the
// busybox test images, the one-machine lab (`skiff-lab`), simulated nodes, the node rig.
#[cfg(feature = "testing")]
pub mod containerd;
#[cfg(feature = "testing")]
pub mod images;
#[cfg(feature = "testing")]
pub mod lab;
#[cfg(feature = "testing")]
pub mod simulate;
#[cfg(feature = "testing")]
pub mod testing;
