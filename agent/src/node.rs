//! The Node object and its Lease: registration, heartbeat, conditions true to the host.
