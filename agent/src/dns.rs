//! Cluster DNS served from the agent's watch cache (Services, EndpointSlices, Pods).
