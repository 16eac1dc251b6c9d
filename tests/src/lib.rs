//! Shared rig for the end-to-end tests (servers, kubectl, lab namespaces).
