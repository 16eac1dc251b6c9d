//! skiff control plane: the Kubernetes-compatible apiserver, its store, and (later) the
//! scheduler and controllers, all of which talk only through the API.

pub mod controllers;
pub mod leader;
pub mod server;
