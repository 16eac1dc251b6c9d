//! The agent process: wires node registration, pod sync, streaming, DNS and network glue.
