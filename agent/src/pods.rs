//! Pod sync: each pod bound to this node is a state machine driven over a runtime.
