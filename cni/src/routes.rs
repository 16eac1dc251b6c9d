//! Node-to-node pod routes.
