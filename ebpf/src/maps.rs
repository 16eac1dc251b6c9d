//! The maps every program shares, pinned by name (the loader gives the pin directory) so a
//! restarted proxy reuses them; plus the counter helpers that write to them.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    bpf_printk,
    macros::map,
    maps::{
        Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, lpm_trie::Key,
    },
};
use skiff_ebpf_common::{
    AffinityKey, AffinityValue, Backend, CLUSTER_OUTSIDE, Config, Counters, CtKey, CtValue,
    FlowEvent, MAGLEV_M, MAX_BACKENDS, MAX_NODE_ADDRS, MAX_REV_NAT, MaglevTable, RevNat, STATS_ANY,
    ServiceKey, ServiceValue, SockRevKey, SourceRangeKey, StatsKey, drop_reason, nodeport_mode,
    svc_flags,
};

/// Service frontends and their backend slots. Preallocated: an insert then takes a free
/// element instead of allocating one, which halved the apply of a full sync (10k services x
/// 10 endpoints: ~200 -> ~100 ms). 524,288 slots (frontends + backend slots: 30k services x
/// 10 endpoints fit) x ~72 bytes (element header 48 + key 8 + value 16) = ~36 MiB of kernel
/// memory, reserved at load.
#[map(name = "SKIFF_SERVICES")]
pub static SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(524_288, 0);

/// Backends by id: an array (see `map_names::BACKENDS`), free ids hold zeroes.
#[map(name = "SKIFF_BACKENDS")]
pub static BACKENDS: Array<Backend> = Array::pinned(MAX_BACKENDS, 0);

/// Frontend of each rev-nat id: an array (see `map_names::REV_NAT`), free ids hold zeroes.
#[map(name = "SKIFF_REV_NAT")]
pub static REV_NAT: Array<RevNat> = Array::pinned(MAX_REV_NAT, 0);

/// Per-packet NAT connection tracking.
#[map(name = "SKIFF_CT")]
pub static CONNTRACK: LruHashMap<CtKey, CtValue> = LruHashMap::pinned(65_536, 0);

/// The conntrack generation (see `map_names::CT_GENERATION`), read by the flow cache.
#[map(name = "SKIFF_CT_GEN")]
pub static CT_GENERATION: Array<u32> = Array::pinned(1, 0);

/// Socket-LB reverse translation (socket cookie + backend → frontend).
#[map(name = "SKIFF_SOCK_REV")]
pub static SOCK_REV: LruHashMap<SockRevKey, RevNat> = LruHashMap::pinned(65_536, 0);

/// Drops by reason.
#[map(name = "SKIFF_DROPS")]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::pinned(drop_reason::COUNT, 0);

/// Traffic counters per service: a plain array in one region per CPU, entry
/// `cpu * SKIFF_SVC_STATS_IDS + rev_nat_id`, so each CPU writes only its own counters (no
/// atomics) and the verifier inlines the lookup (no call: a hash lookup is a call into the
/// kernel, ~25 ns per packet on these machines). One allocation, where a per-CPU array
/// would make one per entry (~0.7 s to create at these sizes). The loader sizes it from
/// the CPU count (see `map_names::SVC_STATS`); ids beyond it spill into `STATS_SPILL`.
#[map(name = "SKIFF_SVC_STATS")]
pub static SVC_STATS: Array<Counters> = Array::pinned(1, 0);

/// Traffic counters per backend, entry `cpu * SKIFF_BE_STATS_IDS + backend_id` (as
/// `SVC_STATS`).
#[map(name = "SKIFF_BE_STATS")]
pub static BE_STATS: Array<Counters> = Array::pinned(1, 0);

/// Ids per CPU region of `SVC_STATS` and `BE_STATS`, set by the loader before
/// verification (read-only globals: constants to the verifier).
#[unsafe(no_mangle)]
static SKIFF_SVC_STATS_IDS: u32 = 0;
#[unsafe(no_mangle)]
static SKIFF_BE_STATS_IDS: u32 = 0;

/// This CPU's counters of `id` in a counters array with `ids` ids per CPU region.
#[inline(always)]
fn counters_slot(map: &Array<Counters>, ids: u32, id: u32) -> Option<*mut Counters> {
    if id >= ids {
        return None;
    }
    // SAFETY: helper without arguments (inlined by the verifier on x86-64).
    let cpu = unsafe { aya_ebpf::helpers::bpf_get_smp_processor_id() };
    map.get_ptr_mut(cpu.wrapping_mul(ids).wrapping_add(id))
}

/// Counters of ids beyond the arrays' sizes: key `{rev_nat_id, STATS_ANY}` for a service,
/// `{STATS_ANY, backend_id}` for a backend.
#[map(name = "SKIFF_STATS")]
pub static STATS_SPILL: PerCpuHashMap<StatsKey, Counters> =
    PerCpuHashMap::pinned(1_048_576, BPF_F_NO_PREALLOC);

/// Node configuration (one entry).
#[map(name = "SKIFF_CONFIG")]
pub static CONFIG: Array<Config> = Array::pinned(1, 0);

/// sessionAffinity ClientIP: client → backend per frontend.
#[map(name = "SKIFF_AFFINITY")]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(65_536, 0);

/// Maglev tables of external frontends, by rev-nat id.
#[map(name = "SKIFF_MAGLEV")]
pub static MAGLEV: HashMap<u32, MaglevTable> = HashMap::pinned(16_384, BPF_F_NO_PREALLOC);

/// The backend the frontend's Maglev table assigns to flow hash `hash`.
#[inline(always)]
pub fn maglev_backend(rev_nat_id: u32, hash: u32) -> Result<(u32, Backend), u32> {
    let table = MAGLEV.get_ptr(rev_nat_id).ok_or(drop_reason::BACKEND_MISSING)?;
    let idx = (hash % MAGLEV_M as u32) as usize;
    // LLVM knows idx < M and would drop the check the verifier needs: hide the value.
    // SAFETY: volatile read of a local.
    let idx = unsafe { core::ptr::read_volatile(&idx) };
    if idx >= MAGLEV_M {
        return Err(drop_reason::BACKEND_MISSING);
    }
    // SAFETY: map value pointer, idx < MAGLEV_M checked just above.
    let id = unsafe { (*table).backend_ids[idx] };
    let backend = lookup_backend(id).ok_or(drop_reason::BACKEND_MISSING)?;
    Ok((id, backend))
}

/// loadBalancerSourceRanges of frontends.
#[map(name = "SKIFF_SRC_RANGES")]
pub static SOURCE_RANGES: LpmTrie<SourceRangeKey, u32> = LpmTrie::pinned(65_536, 0);

/// Whether `saddr_be` may use the frontend (always, unless it has source ranges).
#[inline(always)]
pub fn source_allowed(frontend: &ServiceValue, saddr_be: u32) -> bool {
    if frontend.flags & svc_flags::SOURCE_RANGES == 0 {
        return true;
    }
    let key = Key::new(
        64,
        SourceRangeKey { rev_nat_id_be: frontend.rev_nat_id.to_be(), addr_be: saddr_be },
    );
    SOURCE_RANGES.get(key).is_some()
}

/// Whether a new flow from `saddr_be` comes from outside the cluster's pod ranges
/// (`--cluster-cidr`, see [`CLUSTER_OUTSIDE`]): false when none are set.
#[inline(always)]
pub fn from_outside_cluster(saddr_be: u32) -> bool {
    let key = Key::new(64, SourceRangeKey { rev_nat_id_be: 0, addr_be: saddr_be });
    SOURCE_RANGES.get(key).is_some_and(|v| *v == CLUSTER_OUTSIDE)
}

/// New-flow events for `skiff-proxy flows` (256 KiB).
#[map(name = "SKIFF_FLOWS")]
pub static FLOWS: RingBuf = RingBuf::pinned(256 * 1024, 0);

/// Emits a new-flow event (only ever for a new flow, never per packet); a full ring buffer
/// loses the event, never the packet. With debug output on, also prints it.
#[inline(always)]
pub fn emit_flow(ev: FlowEvent) {
    let _ = FLOWS.output::<FlowEvent>(&ev, 0);
    if debug_on() {
        let (c, f, b) = (ev.client_addr_be, ev.frontend_addr_be, ev.backend_addr_be);
        // SAFETY: the pointers name locals that outlive the call; %pI4 reads 4 bytes.
        unsafe {
            bpf_printk!(
                c"skiff: new flow path=%u proto=%u %pI4 -> %pI4 -> backend %pI4",
                ev.path,
                ev.proto,
                &c as *const u32,
                &f as *const u32,
                &b as *const u32
            )
        };
    }
}

/// Counts one drop of `reason` (per CPU, no atomics needed); with debug output on, also
/// prints it.
#[inline(always)]
pub fn count_drop(reason: u32) {
    if let Some(slot) = DROPS.get_ptr_mut(reason) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe { *slot += 1 };
    }
    if debug_on() {
        // SAFETY: a constant format and one integer argument.
        unsafe { bpf_printk!(c"skiff: drop reason=%u", reason) };
    }
}

/// Adds one packet of `bytes` (and a new connection if `new_conn`) to the counters of the
/// frontend and of the backend.
#[inline(always)]
pub fn count_traffic(rev_nat_id: u32, backend_id: u32, bytes: u64, new_conn: bool) {
    let add = Counters { packets: 1, bytes, new_conns: new_conn as u64 };
    // SAFETY: volatile reads of read-only globals the loader sets before verification.
    let (svc_ids, be_ids) = unsafe {
        (
            core::ptr::read_volatile(&SKIFF_SVC_STATS_IDS),
            core::ptr::read_volatile(&SKIFF_BE_STATS_IDS),
        )
    };
    match counters_slot(&SVC_STATS, svc_ids, rev_nat_id) {
        Some(c) => add_counters(c, &add),
        None => spill(StatsKey { rev_nat_id, backend_id: STATS_ANY }, &add),
    }
    match counters_slot(&BE_STATS, be_ids, backend_id) {
        Some(c) => add_counters(c, &add),
        None => spill(StatsKey { rev_nat_id: STATS_ANY, backend_id }, &add),
    }
}

#[inline(always)]
fn add_counters(c: *mut Counters, add: &Counters) {
    // SAFETY: a per-CPU map value, only this CPU writes it while the program runs.
    unsafe {
        (*c).packets += add.packets;
        (*c).bytes += add.bytes;
        (*c).new_conns += add.new_conns;
    }
}

#[inline(always)]
fn spill(key: StatsKey, add: &Counters) {
    match STATS_SPILL.get_ptr_mut(key) {
        Some(c) => add_counters(c, add),
        None => {
            let _ = STATS_SPILL.insert(key, *add, 0);
        }
    }
}

/// This node's address (network order), 0 when unset.
#[inline(always)]
pub fn node_ip_be() -> u32 {
    CONFIG.get(0).map(|c| c.node_ip_be).unwrap_or(0)
}

/// Further addresses of this node that serve NodePorts (`--nodeport-addresses`).
#[map(name = "SKIFF_NODE_ADDRS")]
pub static NODE_ADDRS: HashMap<u32, u32> = HashMap::pinned(MAX_NODE_ADDRS, 0);

/// Whether NodePorts are served on `daddr_be`: the node's address (`node_ip_be`, 0 when
/// unset) or one of [`NODE_ADDRS`].
#[inline(always)]
pub fn serves_node_ports(daddr_be: u32, node_ip_be: u32) -> bool {
    if node_ip_be != 0 && daddr_be == node_ip_be {
        return true;
    }
    // SAFETY: only whether the key exists is read.
    unsafe { NODE_ADDRS.get(daddr_be) }.is_some()
}

/// Whether NodePort/ExternalIP/LB traffic to remote backends uses direct server return.
#[inline(always)]
pub fn dsr_on() -> bool {
    CONFIG.get(0).is_some_and(|c| c.nodeport_mode == nodeport_mode::DSR)
}

/// Whether debug output is switched on (`Config::debug`, written at run time).
#[inline(always)]
pub fn debug_on() -> bool {
    CONFIG.get(0).is_some_and(|c| c.debug != 0)
}

/// Looks up the frontend (slot 0) of `vip:port/proto`.
#[inline(always)]
pub fn lookup_frontend(vip_be: u32, port_be: u16, proto: u8) -> Option<ServiceValue> {
    // SAFETY: the value is copied out at once; a concurrent update can at worst give a stale
    // frontend, which the slot lookup below tolerates (missing slot = BACKEND_MISSING).
    unsafe { SERVICES.get(ServiceKey::new(vip_be, port_be, proto, 0)).copied() }
}

/// Picks a backend of a frontend with `count > 0` and returns `(id, backend)`: the client's
/// previous one under sessionAffinity (within the timeout), else the Maglev choice for
/// `flow_hash` (external frontends), else a random one.
#[inline(always)]
pub fn select_backend(
    vip_be: u32,
    port_be: u16,
    proto: u8,
    frontend: &ServiceValue,
    client_id: u64,
    flow_hash: u32,
) -> Result<(u32, Backend), u32> {
    if frontend.count == 0 {
        return Err(drop_reason::NO_BACKEND);
    }
    let affinity = frontend.flags & svc_flags::AFFINITY != 0;
    let akey = AffinityKey { client_id, rev_nat_id: frontend.rev_nat_id, _pad: 0 };
    // SAFETY: helper without arguments.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    if affinity {
        // SAFETY: copied out at once.
        if let Some(a) = unsafe { AFFINITY.get(akey).copied() } {
            let timeout_ns = frontend.backend_id as u64 * 1_000_000_000;
            if now.saturating_sub(a.last_used_ns) < timeout_ns
                && let Some(b) = lookup_backend(a.backend_id)
            {
                let v = AffinityValue { backend_id: a.backend_id, _pad: 0, last_used_ns: now };
                let _ = AFFINITY.insert(akey, v, 0);
                return Ok((a.backend_id, b));
            }
        }
    }
    let (backend_id, backend) = if frontend.flags & svc_flags::MAGLEV != 0 {
        maglev_backend(frontend.rev_nat_id, flow_hash)?
    } else {
        // SAFETY: helper without pointer arguments.
        let rnd = unsafe { aya_ebpf::helpers::bpf_get_prandom_u32() };
        let slot = (rnd % frontend.count as u32) as u16 + 1;
        // SAFETY: copied out at once, see lookup_frontend.
        let slot_val =
            unsafe { SERVICES.get(ServiceKey::new(vip_be, port_be, proto, slot)).copied() }
                .ok_or(drop_reason::BACKEND_MISSING)?;
        let backend = lookup_backend(slot_val.backend_id).ok_or(drop_reason::BACKEND_MISSING)?;
        (slot_val.backend_id, backend)
    };
    if affinity {
        let v = AffinityValue { backend_id, _pad: 0, last_used_ns: now };
        // An LRU map: losing an entry only loses stickiness for one client.
        let _ = AFFINITY.insert(akey, v, 0);
    }
    Ok((backend_id, backend))
}

/// Looks up a backend by id (`None` for an out-of-range or free id).
#[inline(always)]
pub fn lookup_backend(id: u32) -> Option<Backend> {
    BACKENDS.get(id).copied().filter(|b| !b.is_free())
}
