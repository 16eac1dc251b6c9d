//! Desired state → diff against what the maps hold → an ordered list of map operations →
//! applied incrementally. Order keeps the data path consistent at every step: backends are
//! written before the service slots that name them, slots before the frontend's count, and
//! removals go in reverse (frontend, slots, rev-nat, then flows and backends).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use skiff_ebpf_common::{
    Backend, MAX_BACKENDS, MAX_REV_NAT, MaglevTable, RevNat, ServiceKey, ServiceValue,
    backend_flags, backend_state, svc_flags,
};

use crate::desired::{BackendAddr, BackendSpec, DesiredState, Frontend, FrontendSpec};
use crate::maps::{self, ServiceMaps};

/// One map write, in the order it must happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    PutBackend(u32, Backend),
    PutRevNat(u32, RevNat),
    PutService(ServiceKey, ServiceValue),
    /// A frontend's Maglev table (written before its slot 0 points traffic at it).
    PutMaglev(u32, Box<MaglevTable>),
    RemoveMaglev(u32),
    /// A loadBalancerSourceRanges entry (rev-nat id, address, prefix length).
    PutSourceRange(u32, Ipv4Addr, u8),
    RemoveSourceRange(u32, Ipv4Addr, u8),
    RemoveService(ServiceKey),
    RemoveRevNat(u32),
    /// Conntrack purge of (rev-nat, backend) pairs and of whole backends.
    PurgeFlows {
        pairs: Vec<(u32, u32)>,
        backend_ids: Vec<u32>,
        removed: Vec<Backend>,
    },
    RemoveBackend(u32),
}

/// A frontend as programmed in the maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Programmed {
    rev_nat_id: u32,
    flags: u16,
    affinity_timeout_s: u32,
    source_ranges: Vec<(Ipv4Addr, u8)>,
    /// The backends it was programmed with (compared with the desired ones).
    backends: Vec<BackendSpec>,
    /// Backend id of slot i+1 (may be longer than `backends` after a resume).
    slots: Vec<u32>,
}

/// A backend in the map and how many frontend slots name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BackendEntry {
    id: u32,
    value: Backend,
    refs: u32,
}

/// What the maps hold (mirrored in memory), and the id allocators.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceMapSync {
    frontends: BTreeMap<Frontend, Programmed>,
    backends: HashMap<BackendAddr, BackendEntry>,
    /// Backends found in the maps that no frontend names (removed by the next plan).
    orphans: Vec<BackendAddr>,
    /// Ids of `backends` (entries of the backends array in use).
    backend_ids: BTreeSet<u32>,
    /// Where the search for a free backend id starts: ids are handed out in increasing
    /// order and wrap around at `MAX_BACKENDS`, so a freed id is reused as late as possible.
    next_backend_id: u32,
    /// Rev-nat ids of `frontends` (entries of the rev-nat array in use).
    rev_nat_ids: BTreeSet<u32>,
    /// Where the search for a free rev-nat id starts (as `next_backend_id`, wrapping at
    /// `MAX_REV_NAT`).
    next_rev_nat_id: u32,
    /// Rev-nat entries of resumed frontends missing from the map (recreated empty by an
    /// upgrade that changed its definition): written by the next plan.
    rev_nat_repairs: Vec<(u32, RevNat)>,
}

/// The state change a plan leads to, committed once its operations succeeded.
#[derive(Clone, Debug, Default)]
struct Delta {
    frontends: Vec<(Frontend, Option<Programmed>)>,
    backends: Vec<(BackendAddr, Option<BackendEntry>)>,
    next_backend_id: u32,
    next_rev_nat_id: u32,
}

/// A computed change: the operations, in order, and the state they lead to.
#[derive(Clone, Debug)]
pub struct Plan {
    pub ops: Vec<MapOp>,
    delta: Delta,
}

/// Errors of syncing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the pinned maps to resume from them")]
    Resume(#[source] maps::Error),
    #[error("applying {op}")]
    Apply {
        op: String,
        #[source]
        source: maps::Error,
    },
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn be32(ip: Ipv4Addr) -> u32 {
    u32::from(ip).to_be()
}

fn key(f: &Frontend, slot: u16) -> ServiceKey {
    ServiceKey::new(be32(f.ip), f.port.to_be(), f.proto, slot)
}

fn backend_value(b: &BackendSpec) -> Backend {
    Backend {
        ip_be: be32(b.addr.ip),
        port_be: b.addr.port.to_be(),
        proto: b.addr.proto,
        state: if b.terminating { backend_state::TERMINATING } else { backend_state::ACTIVE },
        flags: if b.local { backend_flags::LOCAL } else { 0 },
        _pad: [0; 3],
    }
}

fn backend_spec(b: &Backend) -> BackendSpec {
    BackendSpec {
        addr: BackendAddr {
            ip: Ipv4Addr::from(u32::from_be(b.ip_be)),
            port: u16::from_be(b.port_be),
            proto: b.proto,
        },
        terminating: b.state == backend_state::TERMINATING,
        local: b.flags & backend_flags::LOCAL != 0,
    }
}

/// The next id not in `in_use` at or after `*cursor` (wrapping from `max - 1` to 1), and
/// moves the cursor past it: ids are handed out in increasing order, so a freed id is reused
/// as late as possible. Ids allocated earlier in the same plan (`*allocated` of them) lie
/// between the plan's start and the cursor, so they are skipped as long as a plan allocates
/// fewer than `max - 1` ids. With every id in use it returns `max`, which the array
/// rejects: that sync fails (E2BIG) until entries go away.
fn free_id(in_use: &BTreeSet<u32>, max: u32, cursor: &mut u32, allocated: &mut u32) -> u32 {
    let ids = max - 1;
    while *allocated + (in_use.len() as u32) < ids {
        let id = if *cursor == 0 || *cursor >= max { 1 } else { *cursor };
        *cursor = id + 1;
        if !in_use.contains(&id) {
            *allocated += 1;
            return id;
        }
    }
    max
}

impl ServiceMapSync {
    /// An empty state (fresh maps).
    pub fn new() -> Self {
        Self { next_backend_id: 1, next_rev_nat_id: 1, ..Default::default() }
    }

    /// Rebuilds the mirror from maps pinned by a previous run, so the first sync after a
    /// restart reconciles them in place instead of flushing them.
    pub fn resume(maps: &ServiceMaps) -> Result<Self> {
        let mut s = Self::new();
        let mut by_id: HashMap<u32, Backend> = HashMap::new();
        for (id, b) in maps.backends().map_err(Error::Resume)? {
            by_id.insert(id, b);
            s.backend_ids.insert(id);
            s.next_backend_id = s.next_backend_id.max(id + 1);
        }
        for (k, v) in maps.services().map_err(Error::Resume)? {
            let f = Frontend {
                ip: Ipv4Addr::from(u32::from_be(k.vip_be)),
                port: u16::from_be(k.port_be),
                proto: k.proto,
            };
            let p = s.frontends.entry(f).or_default();
            p.rev_nat_id = v.rev_nat_id;
            if k.slot == 0 {
                p.flags = v.flags;
                p.affinity_timeout_s = v.backend_id;
                if p.slots.len() < v.count as usize {
                    p.slots.resize(v.count as usize, 0);
                }
            } else {
                let i = k.slot as usize - 1;
                if p.slots.len() <= i {
                    p.slots.resize(i + 1, 0);
                }
                p.slots[i] = v.backend_id;
            }
            s.rev_nat_ids.insert(v.rev_nat_id);
            s.next_rev_nat_id = s.next_rev_nat_id.max(v.rev_nat_id + 1);
        }
        let mut refs: HashMap<u32, u32> = HashMap::new();
        for p in s.frontends.values_mut() {
            for id in &p.slots {
                if let Some(b) = by_id.get(id) {
                    p.backends.push(backend_spec(b));
                    *refs.entry(*id).or_default() += 1;
                }
            }
        }
        for (id, value) in by_id {
            let addr = backend_spec(&value).addr;
            let refs = refs.get(&id).copied().unwrap_or(0);
            if refs == 0 {
                s.orphans.push(addr);
            }
            s.backends.insert(addr, BackendEntry { id, value, refs });
        }
        s.orphans.sort_unstable();
        let present: BTreeSet<u32> =
            maps.rev_nats().map_err(Error::Resume)?.into_iter().map(|(id, _)| id).collect();
        for (f, p) in &s.frontends {
            if !present.contains(&p.rev_nat_id) {
                let v = RevNat { vip_be: be32(f.ip), port_be: f.port.to_be(), _pad: 0 };
                s.rev_nat_repairs.push((p.rev_nat_id, v));
            }
        }
        Ok(s)
    }

    /// Number of frontends programmed.
    pub fn frontend_count(&self) -> usize {
        self.frontends.len()
    }

    /// Computes the operations turning the current maps into `desired`. Pure. Work is
    /// proportional to the frontends that changed (plus one comparison per frontend).
    pub fn plan(&self, desired: &DesiredState) -> Plan {
        let mut changed: Vec<(&Frontend, &FrontendSpec, Option<&Programmed>)> = Vec::new();
        for (f, spec) in &desired.frontends {
            match self.frontends.get(f) {
                Some(p)
                    if p.flags == spec.flags
                        && p.affinity_timeout_s == spec.affinity_timeout_s
                        && p.source_ranges == spec.source_ranges
                        && p.backends == spec.backends => {}
                old => changed.push((f, spec, old)),
            }
        }
        let removed: Vec<(&Frontend, &Programmed)> =
            self.frontends.iter().filter(|(f, _)| !desired.frontends.contains_key(f)).collect();

        let mut next_backend_id = self.next_backend_id.max(1);
        let mut allocated = 0u32;
        let mut next_rev_nat_id = self.next_rev_nat_id.max(1);
        let mut allocated_rev_nat = 0u32;
        let mut ops: Vec<MapOp> =
            self.rev_nat_repairs.iter().map(|(id, v)| MapOp::PutRevNat(*id, *v)).collect();
        // Backends touched by this plan: their final entry.
        let mut touched: BTreeMap<BackendAddr, BackendEntry> = BTreeMap::new();

        // 1. New references first: new or changed backends are written before any slot.
        for (_, spec, _) in &changed {
            for b in &spec.backends {
                let value = backend_value(b);
                let e = touched.entry(b.addr).or_insert_with(|| match self.backends.get(&b.addr) {
                    Some(e) => *e,
                    None => {
                        let id = self.free_backend_id(&mut next_backend_id, &mut allocated);
                        BackendEntry { id, value: Backend::default(), refs: 0 }
                    }
                });
                if e.value != value {
                    e.value = value;
                    ops.push(MapOp::PutBackend(e.id, value));
                }
                e.refs += 1;
            }
        }

        // 2. Changed frontends: slots, then slot 0, then surplus slots.
        let mut pairs_gone = Vec::new();
        let mut fdelta = Vec::new();
        for (f, spec, old) in &changed {
            let rev_nat_id = match old {
                Some(o) => o.rev_nat_id,
                None => {
                    let id = free_id(
                        &self.rev_nat_ids,
                        MAX_REV_NAT,
                        &mut next_rev_nat_id,
                        &mut allocated_rev_nat,
                    );
                    ops.push(MapOp::PutRevNat(
                        id,
                        RevNat { vip_be: be32(f.ip), port_be: f.port.to_be(), _pad: 0 },
                    ));
                    id
                }
            };
            // Every backend of a changed frontend was entered in `touched` in step 1.
            let slots: Vec<u32> = spec.backends.iter().map(|b| touched[&b.addr].id).collect();
            let old_slots = old.map(|o| o.slots.as_slice()).unwrap_or(&[]);
            for (i, id) in slots.iter().enumerate() {
                if old_slots.get(i) != Some(id) {
                    ops.push(MapOp::PutService(
                        key(f, i as u16 + 1),
                        ServiceValue { backend_id: *id, count: 0, flags: 0, rev_nat_id },
                    ));
                }
            }
            let old_ranges = old.map(|o| o.source_ranges.as_slice()).unwrap_or(&[]);
            for (a, l) in spec.source_ranges.iter().filter(|r| !old_ranges.contains(r)) {
                ops.push(MapOp::PutSourceRange(rev_nat_id, *a, *l));
            }
            if spec.flags & svc_flags::MAGLEV != 0 {
                let named: Vec<(String, u32)> = spec
                    .backends
                    .iter()
                    .zip(&slots)
                    .map(|(b, id)| (format!("{}:{}", b.addr.ip, b.addr.port), *id))
                    .collect();
                ops.push(MapOp::PutMaglev(rev_nat_id, Box::new(crate::maglev::table(&named))));
            }
            if old.is_none_or(|o| {
                o.flags != spec.flags
                    || o.affinity_timeout_s != spec.affinity_timeout_s
                    || o.slots.len() != slots.len()
            }) {
                ops.push(MapOp::PutService(
                    key(f, 0),
                    ServiceValue {
                        backend_id: spec.affinity_timeout_s,
                        count: slots.len() as u16,
                        flags: spec.flags,
                        rev_nat_id,
                    },
                ));
            }
            for i in slots.len()..old_slots.len() {
                ops.push(MapOp::RemoveService(key(f, i as u16 + 1)));
            }
            if old.is_some_and(|o| o.flags & svc_flags::MAGLEV != 0)
                && spec.flags & svc_flags::MAGLEV == 0
            {
                ops.push(MapOp::RemoveMaglev(rev_nat_id));
            }
            for (a, l) in old_ranges.iter().filter(|r| !spec.source_ranges.contains(r)) {
                ops.push(MapOp::RemoveSourceRange(rev_nat_id, *a, *l));
            }
            let kept: BTreeSet<u32> = slots.iter().copied().collect();
            for id in old_slots.iter().filter(|id| **id != 0 && !kept.contains(id)) {
                pairs_gone.push((rev_nat_id, *id));
            }
            let p = Programmed {
                rev_nat_id,
                flags: spec.flags,
                affinity_timeout_s: spec.affinity_timeout_s,
                source_ranges: spec.source_ranges.clone(),
                backends: spec.backends.clone(),
                slots,
            };
            fdelta.push((**f, Some(p)));
        }

        // 3. Removed frontends: slot 0 first (stops new selections), then slots, rev-nat.
        for (f, old) in &removed {
            ops.push(MapOp::RemoveService(key(f, 0)));
            for i in 0..old.slots.len() {
                ops.push(MapOp::RemoveService(key(f, i as u16 + 1)));
            }
            if old.flags & svc_flags::MAGLEV != 0 {
                ops.push(MapOp::RemoveMaglev(old.rev_nat_id));
            }
            for (a, l) in &old.source_ranges {
                ops.push(MapOp::RemoveSourceRange(old.rev_nat_id, *a, *l));
            }
            ops.push(MapOp::RemoveRevNat(old.rev_nat_id));
            for id in old.slots.iter().filter(|id| **id != 0) {
                pairs_gone.push((old.rev_nat_id, *id));
            }
            fdelta.push((**f, None));
        }

        // 4. Dropped references; backends nobody names any more go, after their flows.
        let old_refs = changed
            .iter()
            .filter_map(|(_, _, old)| *old)
            .chain(removed.iter().map(|(_, p)| *p))
            .flat_map(|p| p.backends.iter());
        // (Every old reference and orphan is in `self.backends` by construction; a missing
        // one has nothing left to remove.)
        for b in old_refs {
            if let Some(e) = touched.get_mut(&b.addr) {
                e.refs = e.refs.saturating_sub(1);
            } else if let Some(e) = self.backends.get(&b.addr) {
                touched.insert(b.addr, BackendEntry { refs: e.refs.saturating_sub(1), ..*e });
            }
        }
        for addr in &self.orphans {
            if let (false, Some(e)) = (touched.contains_key(addr), self.backends.get(addr)) {
                touched.insert(*addr, *e);
            }
        }
        let gone: Vec<(BackendAddr, BackendEntry)> =
            touched.iter().filter(|(_, e)| e.refs == 0).map(|(a, e)| (*a, *e)).collect();
        if !pairs_gone.is_empty() || !gone.is_empty() {
            pairs_gone.sort_unstable();
            pairs_gone.dedup();
            ops.push(MapOp::PurgeFlows {
                pairs: pairs_gone,
                backend_ids: gone.iter().map(|(_, e)| e.id).collect(),
                removed: gone.iter().map(|(_, e)| e.value).collect(),
            });
        }
        for (_, e) in &gone {
            ops.push(MapOp::RemoveBackend(e.id));
        }
        let bdelta = touched.into_iter().map(|(a, e)| (a, (e.refs > 0).then_some(e))).collect();
        Plan {
            ops,
            delta: Delta { frontends: fdelta, backends: bdelta, next_backend_id, next_rev_nat_id },
        }
    }

    /// The next free backend id (see `free_id`).
    fn free_backend_id(&self, cursor: &mut u32, allocated: &mut u32) -> u32 {
        free_id(&self.backend_ids, MAX_BACKENDS, cursor, allocated)
    }

    fn commit(&mut self, delta: Delta) {
        for (f, p) in delta.frontends {
            match p {
                Some(p) => {
                    self.rev_nat_ids.insert(p.rev_nat_id);
                    self.frontends.insert(f, p);
                }
                None => {
                    if let Some(old) = self.frontends.remove(&f) {
                        self.rev_nat_ids.remove(&old.rev_nat_id);
                    }
                }
            }
        }
        for (a, e) in delta.backends {
            match e {
                Some(e) => {
                    self.backend_ids.insert(e.id);
                    self.backends.insert(a, e);
                }
                None => {
                    if let Some(old) = self.backends.remove(&a) {
                        self.backend_ids.remove(&old.id);
                    }
                }
            }
        }
        self.orphans.clear();
        self.rev_nat_repairs.clear();
        self.next_backend_id = delta.next_backend_id;
        self.next_rev_nat_id = delta.next_rev_nat_id;
    }

    /// Applies a plan to the maps; on success the mirror becomes the plan's state. On error
    /// the mirror is left as it was: the next (level-triggered) sync redoes the rest.
    ///
    /// Consecutive writes are batched (one `BPF_MAP_UPDATE_BATCH` per map instead of one
    /// syscall per element). Within a run of writes, maps are flushed referenced-first
    /// (backends, rev-nat, Maglev, source ranges, then service slots in plan order, slot 0
    /// after its slots), so every step still only names entries already written; a removal
    /// flushes the pending writes before it runs.
    pub fn apply(&mut self, maps: &mut ServiceMaps, plan: Plan) -> Result<usize> {
        let n = plan.ops.len();
        let mut pending = PendingWrites::default();
        for op in &plan.ops {
            match op {
                MapOp::PutBackend(id, b) => pending.backends.push((*id, *b)),
                MapOp::PutRevNat(id, v) => pending.rev_nats.push((*id, *v)),
                MapOp::PutService(k, v) => pending.services.push((*k, *v)),
                MapOp::PutMaglev(id, t) => pending.maglev.push((*id, t)),
                MapOp::PutSourceRange(id, a, l) => pending.ranges.push((*id, *a, *l)),
                other => {
                    pending.flush(maps)?;
                    apply_one(maps, other)
                        .map_err(|source| Error::Apply { op: format!("{other:?}"), source })?;
                }
            }
        }
        pending.flush(maps)?;
        self.commit(plan.delta);
        Ok(n)
    }

    /// Plans and applies in one step; returns the number of map operations.
    pub fn sync(&mut self, maps: &mut ServiceMaps, desired: &DesiredState) -> Result<usize> {
        let plan = self.plan(desired);
        self.apply(maps, plan)
    }
}

/// Writes collected from a run of consecutive put operations.
#[derive(Default)]
struct PendingWrites<'a> {
    backends: Vec<(u32, Backend)>,
    rev_nats: Vec<(u32, RevNat)>,
    maglev: Vec<(u32, &'a MaglevTable)>,
    ranges: Vec<(u32, Ipv4Addr, u8)>,
    services: Vec<(ServiceKey, ServiceValue)>,
}

impl PendingWrites<'_> {
    /// Writes everything pending, referenced maps first, and empties the lists.
    fn flush(&mut self, maps: &mut ServiceMaps) -> Result<()> {
        let fail = |op: String| move |source| Error::Apply { op, source };
        if !self.backends.is_empty() {
            maps.put_backends(&self.backends)
                .map_err(fail(format!("PutBackend x{}", self.backends.len())))?;
        }
        if !self.rev_nats.is_empty() {
            maps.put_rev_nats(&self.rev_nats)
                .map_err(fail(format!("PutRevNat x{}", self.rev_nats.len())))?;
        }
        for (id, t) in &self.maglev {
            maps.put_maglev(*id, t).map_err(fail(format!("PutMaglev({id})")))?;
        }
        for (id, a, l) in &self.ranges {
            maps.put_source_range(*id, *a, *l)
                .map_err(fail(format!("PutSourceRange({id}, {a}, {l})")))?;
        }
        if !self.services.is_empty() {
            maps.put_services(&self.services)
                .map_err(fail(format!("PutService x{}", self.services.len())))?;
        }
        *self = Self::default();
        Ok(())
    }
}

/// One non-batched operation.
fn apply_one(maps: &mut ServiceMaps, op: &MapOp) -> Result<(), maps::Error> {
    match op {
        MapOp::PutBackend(id, b) => maps.put_backend(*id, *b),
        MapOp::PutRevNat(id, v) => maps.put_rev_nat(*id, *v),
        MapOp::PutService(k, v) => maps.put_service(*k, *v),
        MapOp::RemoveService(k) => maps.remove_service(*k),
        MapOp::RemoveRevNat(id) => maps.remove_rev_nat(*id),
        MapOp::PutMaglev(id, t) => maps.put_maglev(*id, t),
        MapOp::RemoveMaglev(id) => maps.remove_maglev(*id),
        MapOp::PutSourceRange(id, a, l) => maps.put_source_range(*id, *a, *l),
        MapOp::RemoveSourceRange(id, a, l) => maps.remove_source_range(*id, *a, *l),
        MapOp::PurgeFlows { pairs, backend_ids, removed } => {
            maps.purge_flows(pairs, backend_ids, removed).map(|_| ())
        }
        MapOp::RemoveBackend(id) => maps.remove_backend(*id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{service, slice};
    use crate::desired::{NodeContext, compute};

    const R: Option<bool> = Some(true);
    const N: Option<bool> = Some(false);

    fn desired(eps: &[&str]) -> DesiredState {
        let svc = service("web", "10.96.0.10", &[("", 80, "TCP")]);
        let e: Vec<_> = eps.iter().map(|a| (*a, R, R, N, "")).collect();
        let sl = slice("web", "web-1", &[("", 8080, "TCP")], &e);
        compute([&svc], [&sl], &NodeContext::default())
    }

    fn kinds(ops: &[MapOp]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                MapOp::PutBackend(id, _) => format!("+be{id}"),
                MapOp::PutRevNat(id, _) => format!("+rev{id}"),
                MapOp::PutService(k, v) if k.slot == 0 => format!("+svc0(n={})", v.count),
                MapOp::PutService(k, v) => format!("+slot{}=be{}", k.slot, v.backend_id),
                MapOp::RemoveService(k) => format!("-slot{}", k.slot),
                MapOp::RemoveRevNat(id) => format!("-rev{id}"),
                MapOp::PutMaglev(id, _) => format!("+maglev{id}"),
                MapOp::RemoveMaglev(id) => format!("-maglev{id}"),
                MapOp::PutSourceRange(id, a, l) => format!("+range{id}:{a}/{l}"),
                MapOp::RemoveSourceRange(id, a, l) => format!("-range{id}:{a}/{l}"),
                MapOp::PurgeFlows { pairs, backend_ids, .. } => {
                    format!("purge{pairs:?}{backend_ids:?}")
                }
                MapOp::RemoveBackend(id) => format!("-be{id}"),
            })
            .collect()
    }

    #[test]
    fn first_sync_writes_backends_before_slots_before_frontend() {
        let s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1", "10.0.1.2"]));
        assert_eq!(
            kinds(&plan.ops),
            ["+be1", "+be2", "+rev1", "+slot1=be1", "+slot2=be2", "+svc0(n=2)"]
        );
    }

    #[test]
    fn unchanged_state_plans_nothing() {
        let mut s = ServiceMapSync::new();
        let d = desired(&["10.0.1.1", "10.0.1.2"]);
        let plan = s.plan(&d);
        s.commit(plan.delta);
        assert!(s.plan(&d).ops.is_empty());
    }

    #[test]
    fn adding_an_endpoint_is_incremental() {
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1"]));
        s.commit(plan.delta);
        let plan = s.plan(&desired(&["10.0.1.1", "10.0.1.2"]));
        assert_eq!(kinds(&plan.ops), ["+be2", "+slot2=be2", "+svc0(n=2)"]);
    }

    #[test]
    fn removing_an_endpoint_shrinks_first_then_purges_and_removes_the_backend() {
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1", "10.0.1.2"]));
        s.commit(plan.delta);
        let plan = s.plan(&desired(&["10.0.1.2"]));
        assert_eq!(
            kinds(&plan.ops),
            ["+slot1=be2", "+svc0(n=1)", "-slot2", "purge[(1, 1)][1]", "-be1"]
        );
    }

    #[test]
    fn removing_a_service_goes_in_reverse_order() {
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1"]));
        s.commit(plan.delta);
        let plan = s.plan(&DesiredState::default());
        assert_eq!(kinds(&plan.ops), ["-slot0", "-slot1", "-rev1", "purge[(1, 1)][1]", "-be1"]);
    }

    #[test]
    fn ids_are_not_reused_within_a_run() {
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1"]));
        s.commit(plan.delta);
        let plan = s.plan(&DesiredState::default());
        s.commit(plan.delta);
        let plan = s.plan(&desired(&["10.0.1.9"]));
        assert_eq!(kinds(&plan.ops), ["+be2", "+rev2", "+slot1=be2", "+svc0(n=1)"]);
    }

    #[test]
    fn backend_ids_wrap_around_and_skip_ids_in_use() {
        let mut s = ServiceMapSync::new();
        s.next_backend_id = MAX_BACKENDS - 1;
        let plan = s.plan(&desired(&["10.0.1.1", "10.0.1.2"]));
        assert_eq!(kinds(&plan.ops)[..2], [format!("+be{}", MAX_BACKENDS - 1), "+be1".into()]);
        s.commit(plan.delta);
        // The last id is free again, 1 still in use: the next ids are 2 (cursor) and then 3.
        let plan = s.plan(&desired(&["10.0.1.2", "10.0.1.3", "10.0.1.4"]));
        assert_eq!(kinds(&plan.ops)[..2], ["+be2", "+be3"]);
        s.commit(plan.delta);
        assert!(s.backend_ids.contains(&1) && !s.backend_ids.contains(&(MAX_BACKENDS - 1)));
        assert_eq!(s.backend_ids.len(), 3);
    }

    #[test]
    fn rev_nat_ids_wrap_around_and_a_freed_id_is_reused_late() {
        let frontends = |ips: &[&str]| {
            let mut d = DesiredState::default();
            for ip in ips {
                d.frontends.insert(
                    Frontend { ip: ip.parse().unwrap(), port: 80, proto: 6 },
                    FrontendSpec {
                        service: format!("default/{ip}:http"),
                        flags: svc_flags::CLUSTER_IP,
                        affinity_timeout_s: 0,
                        source_ranges: Vec::new(),
                        backends: Vec::new(),
                    },
                );
            }
            d
        };
        let revs = |ops: &[MapOp]| -> Vec<String> {
            kinds(ops).into_iter().filter(|k| k.contains("rev")).collect()
        };
        let mut s = ServiceMapSync::new();
        s.next_rev_nat_id = MAX_REV_NAT - 1;
        let plan = s.plan(&frontends(&["10.96.0.1", "10.96.0.2"]));
        assert_eq!(revs(&plan.ops), [format!("+rev{}", MAX_REV_NAT - 1), "+rev1".into()]);
        s.commit(plan.delta);
        // 10.96.0.1 goes (its id freed), 10.96.0.3 comes: it gets the cursor's id 2, not the
        // one just freed.
        let plan = s.plan(&frontends(&["10.96.0.2", "10.96.0.3"]));
        assert_eq!(revs(&plan.ops), ["+rev2".to_string(), format!("-rev{}", MAX_REV_NAT - 1)]);
        s.commit(plan.delta);
        assert_eq!(s.rev_nat_ids.iter().copied().collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_backend_shared_by_two_services_stays_until_both_drop_it() {
        let two = |a: &[&str], b: &[&str]| {
            let s1 = service("a", "10.96.0.1", &[("", 80, "TCP")]);
            let s2 = service("b", "10.96.0.2", &[("", 80, "TCP")]);
            let ea: Vec<_> = a.iter().map(|x| (*x, R, R, N, "")).collect();
            let eb: Vec<_> = b.iter().map(|x| (*x, R, R, N, "")).collect();
            let sa = slice("a", "a-1", &[("", 8080, "TCP")], &ea);
            let sb = slice("b", "b-1", &[("", 8080, "TCP")], &eb);
            compute([&s1, &s2], [&sa, &sb], &NodeContext::default())
        };
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&two(&["10.0.1.1"], &["10.0.1.1"]));
        assert_eq!(kinds(&plan.ops).iter().filter(|k| k.starts_with("+be")).count(), 1);
        s.commit(plan.delta);
        let plan = s.plan(&two(&["10.0.1.1"], &[]));
        assert!(
            !kinds(&plan.ops).contains(&"-be1".to_string()),
            "still used by a: {:?}",
            kinds(&plan.ops)
        );
        s.commit(plan.delta);
        let plan = s.plan(&two(&[], &[]));
        assert!(kinds(&plan.ops).contains(&"-be1".to_string()));
    }
}
