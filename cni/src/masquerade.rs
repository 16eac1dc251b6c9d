//! Masquerade.
