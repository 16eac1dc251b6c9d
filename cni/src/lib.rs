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
//! # Network configuration
//!
//! The agent writes one conflist entry per node (unknown fields are ignored):
//!
//! ```json
//! {
//!   "cniVersion": "1.1.0",
//!   "name": "skiff",
//!   "plugins": [{
//!     "type": "skiff-cni",
//!     "podCIDR": "10.244.1.0/24",
//!     "dataDir": "/var/lib/cni/skiff",
//!     "mtu": 1500
//!   }]
//! }
//! ```
//!
//! - `podCIDR`: this node's pod range; pods get its addresses except the network and
//!   broadcast ones, as `/32`s. Without it, `nodeConfig` names a file holding
//!   `{"podCIDR": ..., "mtu": ...}` ([`config::NodeConfig`]), read at each call: the shape
//!   `skiff-cni install --conf-dir` writes from a DaemonSet's init container before the node
//!   has a pod CIDR ([`install`]); until the agent wrote that file ADD answers code 11,
//!   STATUS 50, and DEL succeeds.
//! - `dataDir` (default [`config::DEFAULT_DATA_DIR`]): IPAM state, under
//!   `<dataDir>/networks/<name>/`.
//! - `mtu` (default 1500): both veth ends; 1450 with VXLAN.
//!
//! Spec versions 0.4.0, 1.0.0 and 1.1.0; STATUS and GC need a 1.1.0 configuration (error
//! code 1 otherwise, as libcni's skel). Error codes: 1 incompatible version, 4 invalid
//! environment (CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS), 5 IPAM store I/O,
//! 6 undecodable JSON, 7 invalid configuration (missing or unparsable `podCIDR` or node file, wrong
//! `type`, bad `mtu`, CHECK without `prevResult`, GC without valid attachments), 11 address
//! pool exhausted (addresses free up as pods go: try again later), 50 from STATUS when no
//! ADD could succeed (pool exhausted or store unusable), 999 any other failure.
//!
//! # What the agent calls
//! - [`routes::sync`] (= [`routes::desired_routes`] + [`routes::apply`]) on every Node
//!   watch event (whole list, level-triggered), [`routes::NodeRoute::from_node`] to adapt `Node` objects, and
//!   [`routes::remove_all`] on teardown;
//! - [`masquerade::Masquerade::apply`] at start (and [`masquerade::Masquerade::remove`] on
//!   teardown);
//! - both act in the calling thread's network namespace: a node agent in the host
//!   namespace calls them directly; tests enter a node namespace with [`netns::run_in`] /
//!   [`netns::netlink_in`].
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
pub mod install;
pub mod ipam;
pub mod masquerade;
pub mod netns;
pub mod plugin;
pub mod pod;
pub mod routes;
