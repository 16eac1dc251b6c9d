//! The embedded default backend (to be written): crash-safe, group commit.
