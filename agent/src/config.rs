//! The agent's configuration (flags, defaults, derived paths).
