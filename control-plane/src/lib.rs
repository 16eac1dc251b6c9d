//! skiff-server's wiring: it opens the store, starts the apiserver and serves it over
//! HTTPS, and runs the scheduler and the controllers (each under leader election) over the
//! apiserver's in-memory client. The layers themselves are crates of their own, from the
//! bottom: `skiff-core`, `skiff-store`, `skiff-machinery`, `skiff-apiserver`, and beside it
//! `skiff-scheduler` and `skiff-controllers`, which reach it only through the API.

pub mod leader;
pub mod server;
