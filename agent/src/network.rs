//! Node network glue: skiff-cni install and conflist, cross-node and unreachable routes from the Node watch, the in-process eBPF proxy.
