//! The per-CPU flow cache in front of the conntrack lookup of an established flow: a
//! direct-mapped array whose lookup the verifier inlines (no helper call, no jhash: the
//! LRU hash lookup it saves is ~25 ns per packet on these machines).
//!
//! An accelerator only: a cold or wrong-generation slot falls through to `CONNTRACK`, and
//! behaviour is the same with or without it. Entries copied under an older conntrack
//! generation (the proxy bumps it after deleting conntrack entries) are misses; every
//! `FLOW_CACHE_REFRESH`-th packet of a cached flow is a miss too, so the conntrack entry of an
//! active flow keeps its LRU recency and one gone without a bump (LRU eviction) stops being
//! served within that many packets: the bound on any stale copy, races with a purge included.
//! Per CPU, so no atomics: a program runs to completion on its CPU, and tc and XDP do not
//! nest there.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use skiff_ebpf_common::{CtKey, CtValue, FLOW_CACHE_REFRESH, FLOW_CACHE_SLOTS, FlowCacheEntry};

use crate::maps::CT_GENERATION;

#[map(name = "SKIFF_FLOW_CACHE")]
static FLOW_CACHE: PerCpuArray<FlowCacheEntry> = PerCpuArray::with_max_entries(FLOW_CACHE_SLOTS, 0);

/// This CPU's slot for one FORWARD key, with the conntrack generation read before the
/// conntrack lookup it stands in for (so a copy made from an entry the proxy deletes
/// meanwhile carries the old generation).
pub struct Slot {
    entry: *mut FlowCacheEntry,
    key: [u64; 2],
    generation: u32,
}

/// The slot of `key` on this CPU (`None` only if a map lookup fails, which the verifier
/// requires handling).
#[inline(always)]
pub fn slot(key: &CtKey) -> Option<Slot> {
    // SAFETY: volatile read of a map value: read once, before the conntrack lookup.
    let generation = unsafe { core::ptr::read_volatile(CT_GENERATION.get_ptr(0)?) };
    let entry = FLOW_CACHE.get_ptr_mut(key.flow_cache_slot())?;
    Some(Slot { entry, key: key.words(), generation })
}

impl Slot {
    /// The cached copy of the flow's FORWARD entry, unless the slot holds another flow, an
    /// older generation, or the copy is due for a conntrack lookup.
    #[inline(always)]
    pub fn hit(&self) -> Option<FlowCacheEntry> {
        // SAFETY: this CPU's map value; only this CPU touches it while the program runs.
        let e = unsafe { &mut *self.entry };
        if e.key[0] != self.key[0] || e.key[1] != self.key[1] || e.generation != self.generation {
            return None;
        }
        if e.hits >= FLOW_CACHE_REFRESH - 1 {
            return None;
        }
        e.hits += 1;
        Some(*e)
    }

    /// Copies the flow's FORWARD entry `v` (just looked up) into the slot, and returns it.
    #[inline(always)]
    pub fn fill(&self, v: &CtValue) -> FlowCacheEntry {
        let e = FlowCacheEntry { key: self.key, generation: self.generation, ..entry_of(v) };
        // SAFETY: as in `hit`.
        unsafe { *self.entry = e };
        e
    }

    /// The flow has no FORWARD entry: empties the slot if it holds the flow.
    #[inline(always)]
    pub fn forget(&self) {
        // SAFETY: as in `hit`.
        let e = unsafe { &mut *self.entry };
        if e.key[0] == self.key[0] && e.key[1] == self.key[1] {
            // Proto 0 in the key: no flow matches it.
            e.key[1] = 0;
        }
    }
}

/// The fields of FORWARD entry `v` the forward path needs (key and generation left zero).
#[inline(always)]
pub fn entry_of(v: &CtValue) -> FlowCacheEntry {
    FlowCacheEntry {
        key: [0; 2],
        generation: 0,
        hits: 0,
        backend_id: v.backend_id,
        rev_nat_id: v.rev_nat_id,
        nat_addr_be: v.nat_addr_be,
        nat_port_be: v.nat_port_be,
        flags: v.flags,
    }
}
