//! Desired state → diff against what the maps hold → an ordered list of map operations →
//! applied incrementally. Order keeps the data path consistent at every step: backends are
//! written before the service slots that name them, slots before the frontend's count, and
//! removals go in reverse (frontend, slots, rev-nat, then flows and backends).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use skiff_ebpf_common::{Backend, RevNat, ServiceKey, ServiceValue, backend_flags, backend_state};

use crate::desired::{BackendAddr, BackendSpec, DesiredState, Frontend};
use crate::maps::{self, ServiceMaps};

/// One map write, in the order it must happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    PutBackend(u32, Backend),
    PutRevNat(u32, RevNat),
    PutService(ServiceKey, ServiceValue),
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
    /// Backend id of slot i+1.
    slots: Vec<u32>,
}

/// What the maps hold (mirrored in memory), and the id allocators.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceMapSync {
    frontends: BTreeMap<Frontend, Programmed>,
    backends: BTreeMap<BackendAddr, (u32, Backend)>,
    next_backend_id: u32,
    next_rev_nat_id: u32,
}

/// A computed change: the operations and the state they lead to.
#[derive(Clone, Debug)]
pub struct Plan {
    pub ops: Vec<MapOp>,
    next: ServiceMapSync,
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

impl ServiceMapSync {
    /// An empty state (fresh maps).
    pub fn new() -> Self {
        Self { next_backend_id: 1, next_rev_nat_id: 1, ..Default::default() }
    }

    /// Rebuilds the mirror from maps pinned by a previous run, so the first sync after a
    /// restart reconciles them in place instead of flushing them.
    pub fn resume(maps: &ServiceMaps) -> Result<Self> {
        let mut s = Self::new();
        for (id, b) in maps.backends().map_err(Error::Resume)? {
            let addr = BackendAddr {
                ip: Ipv4Addr::from(u32::from_be(b.ip_be)),
                port: u16::from_be(b.port_be),
                proto: b.proto,
            };
            s.backends.insert(addr, (id, b));
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
            s.next_rev_nat_id = s.next_rev_nat_id.max(v.rev_nat_id + 1);
        }
        Ok(s)
    }

    /// Number of frontends programmed.
    pub fn frontend_count(&self) -> usize {
        self.frontends.len()
    }

    /// Computes the operations turning the current maps into `desired`. Pure.
    pub fn plan(&self, desired: &DesiredState) -> Plan {
        let mut next = Self {
            frontends: BTreeMap::new(),
            backends: BTreeMap::new(),
            next_backend_id: self.next_backend_id.max(1),
            next_rev_nat_id: self.next_rev_nat_id.max(1),
        };
        let mut ops = Vec::new();

        // 1. Backends (new or changed) first.
        for spec in desired.frontends.values() {
            for b in &spec.backends {
                if next.backends.contains_key(&b.addr) {
                    continue;
                }
                let value = backend_value(b);
                let id = match self.backends.get(&b.addr) {
                    Some((id, old)) => {
                        if *old != value {
                            ops.push(MapOp::PutBackend(*id, value));
                        }
                        *id
                    }
                    None => {
                        let id = next.next_backend_id;
                        next.next_backend_id += 1;
                        ops.push(MapOp::PutBackend(id, value));
                        id
                    }
                };
                next.backends.insert(b.addr, (id, value));
            }
        }

        // 2. Frontends: slots, then slot 0, then surplus slots.
        let mut pairs_gone = Vec::new();
        for (f, spec) in &desired.frontends {
            let old = self.frontends.get(f);
            let rev_nat_id = match old {
                Some(o) => o.rev_nat_id,
                None => {
                    let id = next.next_rev_nat_id;
                    next.next_rev_nat_id += 1;
                    ops.push(MapOp::PutRevNat(
                        id,
                        RevNat { vip_be: be32(f.ip), port_be: f.port.to_be(), _pad: 0 },
                    ));
                    id
                }
            };
            let slots: Vec<u32> = spec.backends.iter().map(|b| next.backends[&b.addr].0).collect();
            let old_slots = old.map(|o| o.slots.as_slice()).unwrap_or(&[]);
            for (i, id) in slots.iter().enumerate() {
                if old_slots.get(i) != Some(id) {
                    ops.push(MapOp::PutService(
                        key(f, i as u16 + 1),
                        ServiceValue { backend_id: *id, count: 0, flags: 0, rev_nat_id },
                    ));
                }
            }
            let changed_front =
                old.is_none_or(|o| o.flags != spec.flags || o.slots.len() != slots.len());
            if changed_front {
                ops.push(MapOp::PutService(
                    key(f, 0),
                    ServiceValue {
                        backend_id: 0,
                        count: slots.len() as u16,
                        flags: spec.flags,
                        rev_nat_id,
                    },
                ));
            }
            for i in slots.len()..old_slots.len() {
                ops.push(MapOp::RemoveService(key(f, i as u16 + 1)));
            }
            let kept: BTreeSet<u32> = slots.iter().copied().collect();
            for id in old_slots.iter().filter(|id| !kept.contains(id)) {
                pairs_gone.push((rev_nat_id, *id));
            }
            next.frontends.insert(*f, Programmed { rev_nat_id, flags: spec.flags, slots });
        }

        // 3. Removed frontends: slot 0 first (stops new selections), then slots, rev-nat.
        for (f, old) in &self.frontends {
            if desired.frontends.contains_key(f) {
                continue;
            }
            ops.push(MapOp::RemoveService(key(f, 0)));
            for i in 0..old.slots.len() {
                ops.push(MapOp::RemoveService(key(f, i as u16 + 1)));
            }
            ops.push(MapOp::RemoveRevNat(old.rev_nat_id));
            for id in &old.slots {
                pairs_gone.push((old.rev_nat_id, *id));
            }
        }

        // 4. Flows of removed pairs/backends, then the backends themselves.
        let removed: Vec<(u32, Backend)> = self
            .backends
            .iter()
            .filter(|(addr, _)| !next.backends.contains_key(addr))
            .map(|(_, v)| *v)
            .collect();
        if !pairs_gone.is_empty() || !removed.is_empty() {
            pairs_gone.sort_unstable();
            pairs_gone.dedup();
            ops.push(MapOp::PurgeFlows {
                pairs: pairs_gone,
                backend_ids: removed.iter().map(|(id, _)| *id).collect(),
                removed: removed.iter().map(|(_, b)| *b).collect(),
            });
        }
        for (id, _) in &removed {
            ops.push(MapOp::RemoveBackend(*id));
        }
        Plan { ops, next }
    }

    /// Applies a plan to the maps; on success the mirror becomes the plan's state. On error
    /// the mirror is left as it was: the next (level-triggered) sync redoes the rest.
    pub fn apply(&mut self, maps: &mut ServiceMaps, plan: Plan) -> Result<usize> {
        let n = plan.ops.len();
        for op in &plan.ops {
            let r = match op {
                MapOp::PutBackend(id, b) => maps.put_backend(*id, *b),
                MapOp::PutRevNat(id, v) => maps.put_rev_nat(*id, *v),
                MapOp::PutService(k, v) => maps.put_service(*k, *v),
                MapOp::RemoveService(k) => maps.remove_service(*k),
                MapOp::RemoveRevNat(id) => maps.remove_rev_nat(*id),
                MapOp::PurgeFlows { pairs, backend_ids, removed } => {
                    maps.purge_flows(pairs, backend_ids, removed).map(|_| ())
                }
                MapOp::RemoveBackend(id) => maps.remove_backend(*id),
            };
            r.map_err(|source| Error::Apply { op: format!("{op:?}"), source })?;
        }
        *self = plan.next;
        Ok(n)
    }

    /// Plans and applies in one step; returns the number of map operations.
    pub fn sync(&mut self, maps: &mut ServiceMaps, desired: &DesiredState) -> Result<usize> {
        let plan = self.plan(desired);
        self.apply(maps, plan)
    }

    /// Marks a plan as applied without touching maps (unit tests of the diff logic).
    #[cfg(test)]
    fn commit(&mut self, plan: Plan) {
        *self = plan.next;
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
        s.commit(plan);
        assert!(s.plan(&d).ops.is_empty());
    }

    #[test]
    fn adding_an_endpoint_is_incremental() {
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1"]));
        s.commit(plan);
        let plan = s.plan(&desired(&["10.0.1.1", "10.0.1.2"]));
        assert_eq!(kinds(&plan.ops), ["+be2", "+slot2=be2", "+svc0(n=2)"]);
    }

    #[test]
    fn removing_an_endpoint_shrinks_first_then_purges_and_removes_the_backend() {
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1", "10.0.1.2"]));
        s.commit(plan);
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
        s.commit(plan);
        let plan = s.plan(&DesiredState::default());
        assert_eq!(kinds(&plan.ops), ["-slot0", "-slot1", "-rev1", "purge[(1, 1)][1]", "-be1"]);
    }

    #[test]
    fn ids_are_not_reused_within_a_run() {
        let mut s = ServiceMapSync::new();
        let plan = s.plan(&desired(&["10.0.1.1"]));
        s.commit(plan);
        let plan = s.plan(&DesiredState::default());
        s.commit(plan);
        let plan = s.plan(&desired(&["10.0.1.9"]));
        assert_eq!(kinds(&plan.ops), ["+be2", "+rev2", "+slot1=be2", "+svc0(n=1)"]);
    }
}
