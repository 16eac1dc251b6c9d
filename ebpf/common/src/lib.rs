//! Map keys and values shared by the eBPF programs (`ebpf/`) and the proxy (`proxy/`).
//!
//! Every type is `#[repr(C)]`, `Copy`, with explicit `_pad` fields and its size asserted, so
//! the kernel side and the user side agree byte for byte. Byte order is named in the field:
//! `*_be` fields hold network byte order exactly as they appear in packets and in
//! `bpf_sock_addr`; everything else is host order.
#![no_std]

use core::mem::size_of;

/// IP protocol numbers used as `proto` in keys.
pub const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// Names of the maps in the object, shared so the loader and the programs cannot drift.
pub mod map_names {
    /// `ServiceKey` → `ServiceValue` (slot 0 = frontend, slots 1..=count = backends).
    pub const SERVICES: &str = "SKIFF_SERVICES";
    /// Array indexed by backend id (`1..MAX_BACKENDS`) of `Backend`; a free id holds an
    /// all-zero entry (`Backend::is_free`). An array, not a hash: a write needs no allocation
    /// and no hashing, which is most of what a full sync of many endpoints costs.
    pub const BACKENDS: &str = "SKIFF_BACKENDS";
    /// Array indexed by rev-nat id (`1..MAX_REV_NAT`) of `RevNat` (the frontend a backend
    /// reply must appear to come from); a free id holds zeroes (`RevNat::is_free`).
    /// Preallocated like `BACKENDS`: writes need no allocation and no hashing.
    pub const REV_NAT: &str = "SKIFF_REV_NAT";
    /// `CtKey` → `CtValue`, LRU: per-packet NAT connection tracking (tc and XDP paths).
    pub const CONNTRACK: &str = "SKIFF_CT";
    /// `SockRevKey` → `RevNat`, LRU: socket-LB reverse translation for recvmsg/getpeername.
    pub const SOCK_REV: &str = "SKIFF_SOCK_REV";
    /// Per-CPU array indexed by `drop_reason::*` of `u64` counts.
    pub const DROPS: &str = "SKIFF_DROPS";
    /// Array of `Counters` (per-service traffic) in one region per possible CPU: entry
    /// `cpu * ids + rev_nat_id`. The loader sizes it (`ids` per CPU from the CPU count
    /// within a memory budget) and tells the programs `ids` (global `SKIFF_SVC_STATS_IDS`);
    /// ids beyond it spill into `STATS`.
    pub const SVC_STATS: &str = "SKIFF_SVC_STATS";
    /// Array of `Counters` (per-backend traffic), entry `cpu * ids + backend_id`, sized
    /// as `SVC_STATS` (global `SKIFF_BE_STATS_IDS`).
    pub const BE_STATS: &str = "SKIFF_BE_STATS";
    /// Per-CPU hash `StatsKey` → `Counters` for ids beyond the stats arrays: a service's
    /// under `{rev_nat_id, STATS_ANY}`, a backend's under `{STATS_ANY, backend_id}`.
    pub const STATS: &str = "SKIFF_STATS";
    /// Array of one `Config`.
    pub const CONFIG: &str = "SKIFF_CONFIG";
    /// Ring buffer of `FlowEvent`s, one per new connection / flow.
    pub const FLOWS: &str = "SKIFF_FLOWS";
    /// `u32` rev-nat id → `MaglevTable`: consistent hashing for external frontends.
    pub const MAGLEV: &str = "SKIFF_MAGLEV";
    /// LPM trie `SourceRangeKey` (prefix 32 + CIDR length) → `u32` 1: loadBalancerSourceRanges.
    pub const SOURCE_RANGES: &str = "SKIFF_SRC_RANGES";
    /// `AffinityKey` → `AffinityValue`, LRU: sessionAffinity ClientIP.
    pub const AFFINITY: &str = "SKIFF_AFFINITY";
    /// `u32` address (network order) → `u32` 1: this node's further addresses that serve
    /// NodePorts (`--nodeport-addresses`), besides `Config::node_ip_be`.
    pub const NODE_ADDRS: &str = "SKIFF_NODE_ADDRS";
    /// Array of one `u32`: the conntrack generation, bumped by the proxy after each batch
    /// of conntrack deletions so the programs' flow caches stop using what they copied
    /// (see `FlowCacheEntry`). Its own map, not a `Config` field: the proxy is its only
    /// writer, and a read-modify-write of `Config` (`skiff-proxy debug`) cannot undo a bump.
    pub const CT_GENERATION: &str = "SKIFF_CT_GEN";
    /// Per-CPU array of `FLOW_CACHE_SLOTS` `FlowCacheEntry`s. Not pinned: a loaded
    /// program set starts with an empty cache.
    pub const FLOW_CACHE: &str = "SKIFF_FLOW_CACHE";
}

/// BTF id placeholder of the kfunc call the tc program emits by hand (`bpf_cast_to_kern_ctx`):
/// the loader finds the instruction `call` with src_reg 2 and this immediate in the object
/// and writes the kfunc's id in the running kernel's BTF in its place.
pub const KFUNC_PLACEHOLDER: u32 = 0x7fca_5eed;

/// Program names in the object (the Rust function names of the entry points).
pub mod prog_names {
    /// cgroup/connect4: socket-LB at connect() time (TCP and connected UDP).
    pub const CONNECT4: &str = "skiff_connect4";
    /// cgroup/sendmsg4: socket-LB for unconnected UDP sends.
    pub const SENDMSG4: &str = "skiff_sendmsg4";
    /// cgroup/recvmsg4: reverse translation of UDP reply sources.
    pub const RECVMSG4: &str = "skiff_recvmsg4";
    /// cgroup/getpeername4: the VIP, not the backend, as the peer.
    pub const GETPEERNAME4: &str = "skiff_getpeername4";
    /// tc ingress: per-packet DNAT of client packets to a backend and reverse NAT of replies
    /// (one program does both directions; a reject goes back out of the interface).
    pub const TC_INGRESS: &str = "skiff_tc_ingress";
    /// tc egress: the same, with rejects delivered up the local stack.
    pub const TC_EGRESS: &str = "skiff_tc_egress";
    /// XDP: NodePort / ExternalIP / LoadBalancer ingress on node-facing interfaces.
    pub const XDP_NODEPORT: &str = "skiff_xdp_nodeport";
}

/// Why a packet or a connect() was refused. Indices into the `DROPS` per-CPU array.
pub mod drop_reason {
    /// Packet shorter than the headers it claims (Ethernet, IPv4, TCP/UDP).
    pub const TRUNCATED: u32 = 0;
    /// IPv4 header with options (IHL != 5): not handled by the fast path.
    pub const IP_OPTIONS: u32 = 1;
    /// IPv4 fragment addressed to a service (ports not in every fragment).
    pub const FRAGMENT: u32 = 2;
    /// IPv4 total length inconsistent with the buffer or the header length.
    pub const BAD_LENGTH: u32 = 3;
    /// The service exists but has no backend: rejected (RST/ICMP/ECONNREFUSED).
    pub const NO_BACKEND: u32 = 4;
    /// The service points at a backend id missing from the backend map.
    pub const BACKEND_MISSING: u32 = 5;
    /// Conntrack insert failed.
    pub const CT_FULL: u32 = 6;
    /// A checksum or header rewrite helper failed.
    pub const REWRITE_FAILED: u32 = 7;
    /// Not IPv4 on a path that only carries IPv4 service traffic (counted, passed).
    pub const NON_IPV4: u32 = 8;
    /// Not an IPv4 version-4 header (version field wrong).
    pub const BAD_VERSION: u32 = 9;
    /// Source outside the frontend's loadBalancerSourceRanges.
    pub const SOURCE_RANGE: u32 = 10;
    /// No route towards a remote backend (DSR forwarding).
    pub const NO_ROUTE: u32 = 11;
    /// Number of reasons (size of the DROPS array).
    pub const COUNT: u32 = 16;

    /// Human name of a reason for `skiff-proxy maps stats`.
    pub fn name(reason: u32) -> &'static str {
        match reason {
            TRUNCATED => "truncated",
            IP_OPTIONS => "ip-options",
            FRAGMENT => "fragment",
            BAD_LENGTH => "bad-length",
            NO_BACKEND => "no-backend",
            BACKEND_MISSING => "backend-missing",
            CT_FULL => "conntrack-full",
            REWRITE_FAILED => "rewrite-failed",
            NON_IPV4 => "non-ipv4",
            BAD_VERSION => "bad-ip-version",
            SOURCE_RANGE => "source-range",
            NO_ROUTE => "no-route",
            _ => "unknown",
        }
    }
}

/// `ServiceValue::flags` bits.
pub mod svc_flags {
    /// A ClusterIP frontend (socket LB and tc path).
    pub const CLUSTER_IP: u16 = 1 << 0;
    /// A NodePort frontend (key `vip_be` = 0: any node address).
    pub const NODE_PORT: u16 = 1 << 1;
    /// An ExternalIP frontend.
    pub const EXTERNAL_IP: u16 = 1 << 2;
    /// A LoadBalancer ingress IP frontend.
    pub const LOAD_BALANCER: u16 = 1 << 3;
    /// externalTrafficPolicy: Local (only local backends in the slots).
    pub const ETP_LOCAL: u16 = 1 << 4;
    /// sessionAffinity: ClientIP; slot 0's `backend_id` holds the timeout in seconds.
    pub const AFFINITY: u16 = 1 << 5;
    /// Backends of external traffic chosen by the frontend's Maglev table (same choice on
    /// every node for a given flow).
    pub const MAGLEV: u16 = 1 << 6;
    /// Only sources in the frontend's `SOURCE_RANGES` entries may use it.
    pub const SOURCE_RANGES: u16 = 1 << 7;
}

/// `Backend::state` values.
pub mod backend_state {
    /// Ready endpoint.
    pub const ACTIVE: u8 = 0;
    /// Terminating endpoint used because no ready one exists.
    pub const TERMINATING: u8 = 1;
}

/// `Backend::flags` bits.
pub mod backend_flags {
    /// The backend runs on this node (XDP delivers locally instead of forwarding).
    pub const LOCAL: u8 = 1 << 0;
}

/// Service map key (after Cilium `lb4_key`). Slot 0 is the frontend; slots `1..=count`
/// name the backends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Frontend address (ClusterIP, ExternalIP, LB IP; 0 for NodePort), network order.
    pub vip_be: u32,
    /// Frontend port, network order.
    pub port_be: u16,
    /// Backend slot: 0 = frontend, 1..=count = backend.
    pub slot: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// Reserved for scopes (external/internal traffic policy); 0 today.
    pub scope: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<ServiceKey>() == 12);

impl ServiceKey {
    /// Key of `slot` for a frontend.
    pub const fn new(vip_be: u32, port_be: u16, proto: u8, slot: u16) -> Self {
        Self { vip_be, port_be, slot, proto, scope: 0, _pad: [0; 2] }
    }
}

/// Service map value. For slot 0: `count` backends, `rev_nat_id`, `flags`. For slot N:
/// `backend_id` of the N-th backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceValue {
    /// Backend id (slots >= 1); in slot 0 the affinity timeout in seconds (with `AFFINITY`).
    pub backend_id: u32,
    /// Number of backend slots (slot 0 only).
    pub count: u16,
    /// `svc_flags::*` (slot 0 only).
    pub flags: u16,
    /// Reverse-NAT id of this frontend (all slots, so a slot alone identifies it).
    pub rev_nat_id: u32,
}
const _: () = assert!(size_of::<ServiceValue>() == 12);

/// Backend map value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend {
    /// Backend (pod) address, network order.
    pub ip_be: u32,
    /// Backend (target) port, network order.
    pub port_be: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// `backend_state::*`.
    pub state: u8,
    /// `backend_flags::*`.
    pub flags: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<Backend>() == 12);

/// Entries of the backends array (ids `1..MAX_BACKENDS`; id 0 is never allocated):
/// 524,288 x 12 bytes = 6 MiB of kernel memory, preallocated (30k services x 10 distinct
/// endpoints fit).
pub const MAX_BACKENDS: u32 = 524_288;

impl Backend {
    /// Whether this array entry is a free id (every real backend has a protocol).
    #[inline(always)]
    pub const fn is_free(&self) -> bool {
        self.proto == 0
    }
}

/// `StatsKey` half that is not set: the key counts only the other id.
pub const STATS_ANY: u32 = u32::MAX;

/// How many further node addresses serve NodePorts (`map_names::NODE_ADDRS`).
pub const MAX_NODE_ADDRS: u32 = 64;

/// Rev-nat ids are `1..MAX_REV_NAT` (frontends of one node; id 0 is never allocated).
pub const MAX_REV_NAT: u32 = 65_536;

/// Reverse-NAT value: the frontend a backend's reply must appear to come from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RevNat {
    /// Frontend address, network order.
    pub vip_be: u32,
    /// Frontend port, network order.
    pub port_be: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
const _: () = assert!(size_of::<RevNat>() == 8);

impl RevNat {
    /// Whether this array entry is a free id (every frontend has a port).
    #[inline(always)]
    pub const fn is_free(&self) -> bool {
        self.port_be == 0
    }
}

/// `CtKey::dir` values.
pub mod ct_dir {
    /// Client → frontend (value: chosen backend).
    pub const FORWARD: u8 = 0;
    /// Backend → client (value: frontend to restore as the source).
    pub const REPLY: u8 = 1;
}

/// Conntrack key: the tuple as seen on the wire in the given direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    /// Source address, network order.
    pub saddr_be: u32,
    /// Destination address, network order.
    pub daddr_be: u32,
    /// Source port, network order.
    pub sport_be: u16,
    /// Destination port, network order.
    pub dport_be: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// `ct_dir::*`.
    pub dir: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<CtKey>() == 16);

/// `CtValue::flags` bits.
pub mod ct_flags {
    /// The forward path also rewrote the source to the node address (remote NodePort).
    pub const SNAT: u16 = 1 << 0;
    /// Direct server return. On a FORWARD entry: the node forwards the DNATed packets to
    /// the backend's node inside an IPIP header (no SNAT). On a REPLY entry: written by the
    /// backend's node when it decapsulates such a packet; the backend's replies leave that
    /// node with the frontend as their source, straight to the client.
    pub const DSR: u16 = 1 << 1;
}

/// Conntrack value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtValue {
    /// Chosen backend (both directions, so the proxy can purge flows of a removed backend).
    pub backend_id: u32,
    /// Frontend's rev-nat id.
    pub rev_nat_id: u32,
    /// FORWARD: backend address; REPLY: frontend address to restore. Network order.
    pub nat_addr_be: u32,
    /// FORWARD: backend port; REPLY: frontend port to restore. Network order.
    pub nat_port_be: u16,
    /// `ct_flags::*`.
    pub flags: u16,
    /// The original client address (restored as the destination of SNATed replies).
    pub client_addr_be: u32,
    /// The original client port, network order.
    pub client_port_be: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
    /// When the flow was opened, CLOCK_MONOTONIC (`bpf_ktime_get_coarse_ns`). Packets of
    /// an established flow only read their entry (no clock read, no write: the LRU map
    /// keeps recency for eviction itself, from the lookups; one packet in
    /// `FLOW_CACHE_REFRESH` per CPU once the flow is in the flow cache).
    pub opened_ns: u64,
}
const _: () = assert!(size_of::<CtValue>() == 32);

/// Slots of the per-CPU flow cache (a power of two: the slot is the top bits of a hash).
pub const FLOW_CACHE_SLOTS: u32 = 1 << FLOW_CACHE_BITS;
/// log2 of `FLOW_CACHE_SLOTS`.
pub const FLOW_CACHE_BITS: u32 = 12;

/// One slot of the per-CPU flow cache in front of the conntrack lookup of an established
/// flow: a copy of a FORWARD entry's fields the forward path needs, valid while the
/// conntrack generation it was copied under is current. Every `FLOW_CACHE_REFRESH`-th
/// packet goes to the conntrack map instead (keeping the entry's LRU recency, noticing an
/// entry gone without a generation bump).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowCacheEntry {
    /// The FORWARD key (`CtKey::words`); all zero in an empty slot (no flow has proto 0).
    pub key: [u64; 2],
    /// The conntrack generation (`map_names::CT_GENERATION`) read before the copy.
    pub generation: u32,
    /// Packets served from the copy since it was made.
    pub hits: u32,
    /// `CtValue::backend_id`.
    pub backend_id: u32,
    /// `CtValue::rev_nat_id`.
    pub rev_nat_id: u32,
    /// `CtValue::nat_addr_be`: the backend address, network order.
    pub nat_addr_be: u32,
    /// `CtValue::nat_port_be`: the backend port, network order.
    pub nat_port_be: u16,
    /// `CtValue::flags` (`ct_flags::*`).
    pub flags: u16,
}
const _: () = assert!(size_of::<FlowCacheEntry>() == 40);

/// One packet of a flow in this many (per CPU) is looked up in conntrack even when cached:
/// the lookup keeps the entry's LRU recency and refreshes or drops the copy. (One hash
/// lookup in 32 packets: < 1 ns per packet.)
pub const FLOW_CACHE_REFRESH: u32 = 32;

impl CtKey {
    /// The key as two words (an injective packing: the padding is always zero), compared
    /// whole by the flow cache.
    #[inline(always)]
    pub const fn words(&self) -> [u64; 2] {
        [
            self.saddr_be as u64 | (self.daddr_be as u64) << 32,
            self.sport_be as u64
                | (self.dport_be as u64) << 16
                | (self.proto as u64) << 32
                | (self.dir as u64) << 40,
        ]
    }

    /// The key's slot in the flow cache (`0..FLOW_CACHE_SLOTS`): the top bits of a
    /// multiplicative hash of its words. Flows sharing a slot evict each other, never
    /// read each other's entry (the whole key is compared).
    #[inline(always)]
    pub const fn flow_cache_slot(&self) -> u32 {
        let [a, b] = self.words();
        ((a ^ b).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - FLOW_CACHE_BITS)) as u32
    }
}

/// Session-affinity key: a client (IPv4 address on the packet paths; network-namespace
/// cookie on the socket path, where the source address is not known yet) and a frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// Client address (network order, zero-extended) or netns cookie.
    pub client_id: u64,
    /// The frontend's rev-nat id.
    pub rev_nat_id: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<AffinityKey>() == 16);

/// Session-affinity value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityValue {
    /// The backend this client sticks to.
    pub backend_id: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
    /// Last use, `bpf_ktime_get_ns`.
    pub last_used_ns: u64,
}
const _: () = assert!(size_of::<AffinityValue>() == 16);

/// `FlowEvent::path` values: which program translated the flow.
pub mod flow_path {
    /// cgroup connect4/sendmsg4 (socket LB; the client address is not known yet: 0).
    pub const SOCKET: u8 = 1;
    /// tc per-packet path.
    pub const TC: u8 = 2;
    /// XDP NodePort/ExternalIP path.
    pub const XDP: u8 = 3;
}

/// A new flow, sent on the `FLOWS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowEvent {
    /// CLOCK_MONOTONIC at translation (`bpf_ktime_get_coarse_ns`).
    pub ts_ns: u64,
    /// Client address (0 on the socket path), network order.
    pub client_addr_be: u32,
    /// Frontend address, network order.
    pub frontend_addr_be: u32,
    /// Chosen backend address, network order.
    pub backend_addr_be: u32,
    /// Frontend's rev-nat id.
    pub rev_nat_id: u32,
    /// Chosen backend id.
    pub backend_id: u32,
    /// Client port (0 on the socket path), network order.
    pub client_port_be: u16,
    /// Frontend port, network order.
    pub frontend_port_be: u16,
    /// Backend port, network order.
    pub backend_port_be: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// `flow_path::*`.
    pub path: u8,
    /// Explicit padding, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<FlowEvent>() == 40);

/// Data of the source-range LPM key: the frontend (all 32 bits always matched) then the
/// client address (matched to the CIDR length).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceRangeKey {
    /// The frontend's rev-nat id, big-endian so the trie matches it bytewise.
    pub rev_nat_id_be: u32,
    /// Client address, network order.
    pub addr_be: u32,
}
const _: () = assert!(size_of::<SourceRangeKey>() == 8);

/// `--cluster-cidr`, kept in `SOURCE_RANGES` under rev-nat id 0 (never a frontend's): the
/// value of `0.0.0.0/0` there ([`CLUSTER_OUTSIDE`]) and of each pod range
/// ([`CLUSTER_INSIDE`]). A new flow to a frontend from a source the longest match calls
/// outside is SNATed to the node for remote backends, as kube-proxy masquerades off-cluster
/// traffic; without entries (no `--cluster-cidr`) nothing is.
pub const CLUSTER_INSIDE: u32 = 1;
pub const CLUSTER_OUTSIDE: u32 = 2;

/// Size of a Maglev lookup table (prime; Maglev wants M >> backends: fine up to ~100).
pub const MAGLEV_M: usize = 1021;

/// A frontend's Maglev lookup table: entry i is the backend id for flow hashes h % M == i.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MaglevTable {
    /// Backend ids.
    pub backend_ids: [u32; MAGLEV_M],
    /// Explicit padding to a multiple of 8 bytes, always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<MaglevTable>() == 4088);

/// The flow hash Maglev indexes with; shared so user space can predict the choice.
#[inline(always)]
pub fn flow_hash(saddr_be: u32, daddr_be: u32, sport_be: u16, dport_be: u16, proto: u8) -> u32 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for v in [
        saddr_be as u64,
        daddr_be as u64,
        ((sport_be as u64) << 16) | dport_be as u64,
        proto as u64,
    ] {
        h ^= v;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    (h ^ (h >> 32)) as u32
}

/// Socket-LB reverse key: which backend a socket was translated to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockRevKey {
    /// Socket cookie (`bpf_get_socket_cookie`).
    pub cookie: u64,
    /// Backend address, network order.
    pub backend_ip_be: u32,
    /// Backend port, network order.
    pub backend_port_be: u16,
    /// Explicit padding, always zero.
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockRevKey>() == 16);

/// Per-service and per-backend counters (per CPU; user space sums them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    /// Packets translated (tc/XDP) or sends translated (socket LB).
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
    /// New connections (connect()s or new conntrack entries).
    pub new_conns: u64,
}
const _: () = assert!(size_of::<Counters>() == 24);

/// Key of the spilled traffic counters (`map_names::STATS`): one of the two ids, the other
/// `STATS_ANY`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatsKey {
    /// The frontend's rev-nat id.
    pub rev_nat_id: u32,
    /// The backend id.
    pub backend_id: u32,
}
const _: () = assert!(size_of::<StatsKey>() == 8);

/// `Config::nodeport_mode` values: how NodePort/ExternalIP/LB traffic reaches a backend on
/// another node.
pub mod nodeport_mode {
    /// DNAT and SNAT to the node address; replies come back through this node (default,
    /// works on any network).
    pub const SNAT: u32 = 0;
    /// Direct server return: DNAT, then IPIP to the backend's node (outer source = the
    /// frontend address, outer IP id = the frontend port), which decapsulates, remembers the
    /// frontend, and sends the backend's replies to the client directly with the frontend
    /// as source. The client address reaches the backend. Every node must run in this mode
    /// (they decapsulate only then), and the path to the backend's node needs 20 bytes of
    /// MTU headroom.
    pub const DSR: u32 = 1;
}

/// The IP protocol number of IPv4-in-IPv4 (the DSR encapsulation).
pub const PROTO_IPIP: u8 = 4;

/// Data-plane configuration (array map of one entry, written by the proxy).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Config {
    /// This node's address used for NodePort and as the SNAT source, network order.
    pub node_ip_be: u32,
    /// Non-zero: the programs print debug lines (new flows, drops) with `bpf_printk` to the
    /// kernel trace buffer (`skiff-proxy debug on|off` flips it at run time; off by default).
    pub debug: u32,
    /// `nodeport_mode::*`.
    pub nodeport_mode: u32,
}
const _: () = assert!(size_of::<Config>() == 12);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type below is #[repr(C)], Copy, has explicit padding (no implicit holes,
    // checked by the size asserts) and is valid for any bit pattern.
    unsafe impl aya::Pod for super::ServiceKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ServiceValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Backend {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RevNat {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CtKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CtValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SockRevKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Counters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FlowEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::MaglevTable {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SourceRangeKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AffinityKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AffinityValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::StatsKey {}
}
