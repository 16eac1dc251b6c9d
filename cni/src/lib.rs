//! skiff-cni: the CNI plugin that wires pods (routed veth + IPAM) and the library the agent
//! uses for node routes and masquerade.
//!
//! # Pod network layout: routed veth
//!
//! Every pod gets a veth pair. The pod end is renamed to the requested ifname (usually
//! `eth0`) and holds the pod address as a `/32`, a link route to the gateway
//! [`pod::GATEWAY`] (`169.254.1.1`, as Calico) and a default route through it. The pod
//! resolves the gateway through a permanent neighbour entry pointing at the host end's MAC,
//! so no ARP (and no proxy ARP) is involved on the way out. The host end (`sk` + 12 hex of a
//! hash of container id and ifname, see [`pod::host_ifname`]) carries no address; the node
//! reaches the pod through a `/32` host route on it, and forwards between pods with
//! `net.ipv4.ip_forward=1`.
//!
//! Why routed veth instead of a bridge: skiff's eBPF data plane attaches its tc programs per
//! pod on the host-side veth (the Cilium layout). With a bridge, pod-to-pod traffic on one
//! node is switched inside the bridge and never crosses the host-side veth's ingress as an
//! L3 hop, and per-pod policy would need bridge netfilter. Routed, every packet a pod sends
//! leaves through its own host veth into the node's routing table, so the tc ingress hook
//! on that veth sees all of a pod's egress (same node or not), and its egress hook sees all
//! traffic towards the pod. Cross-node routes ([`routes`]) then only need the per-node
//! podCIDR, and nothing is bridged.
//!
//! # Modules
//! - [`config`]: the network configuration on stdin and its validation;
//! - [`ipam`]: the pure allocator and its on-disk, `flock`ed store;
//! - [`netns`]: running work inside a network namespace on a dedicated thread;
//! - [`pod`]: the veth/address/route setup of one attachment (ADD/CHECK/DEL/GC);
//! - [`plugin`]: the CNI protocol (env, commands, results, error codes);
//! - [`routes`]: node-to-node routes (host-gw / VXLAN) and `unreachable` guards;
//! - [`masquerade`]: source NAT for traffic leaving the cluster CIDR (nftables).

pub mod config;
pub mod ipam;
pub mod masquerade;
pub mod netns;
pub mod plugin;
pub mod pod;
pub mod routes;
