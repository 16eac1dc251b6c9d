//! Connection tracking for the per-packet paths: a FORWARD entry pins a client flow to its
//! backend, a REPLY entry tells the reverse path which frontend (and client) to restore.

use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use skiff_ebpf_common::{
    Backend, CtKey, CtValue, FlowCacheEntry, FlowEvent, ServiceValue, backend_flags, ct_dir,
    ct_flags, drop_reason, flow_hash,
};

use crate::{
    flow_cache,
    maps::{CONNTRACK, emit_flow, node_ip_be, select_backend},
    packet::Flow,
};

/// The key of `flow` as seen on the wire in direction `dir`.
#[inline(always)]
pub fn key(flow: &Flow, dir: u8) -> CtKey {
    CtKey {
        saddr_be: flow.saddr_be,
        daddr_be: flow.daddr_be,
        sport_be: flow.sport_be,
        dport_be: flow.dport_be,
        proto: flow.proto,
        dir,
        _pad: [0; 2],
    }
}

/// CLOCK_MONOTONIC at tick resolution: cheaper than `bpf_ktime_get_ns` and plenty for
/// conntrack ages.
#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// The REPLY entry matching `flow` if any (read only: see `CtValue::opened_ns`).
#[inline(always)]
pub fn lookup_reply(flow: &Flow) -> Option<CtValue> {
    // SAFETY: copied out at once; a concurrent update can at worst give a stale value.
    unsafe { CONNTRACK.get(key(flow, ct_dir::REPLY)).copied() }
}

/// Where a forward packet goes: the backend and whether this packet opened the flow.
pub struct Forward {
    pub backend_id: u32,
    /// The frontend's rev-nat id.
    pub rev_nat_id: u32,
    pub backend: Backend,
    pub new_conn: bool,
    /// Non-zero: also rewrite the source to this address (remote NodePort backend).
    pub snat_addr_be: u32,
    /// Forward inside an IPIP header to the backend's node (DSR, remote backend).
    pub dsr: bool,
}

/// The backend of an established flow, from its FORWARD entry alone: the entry carries the
/// backend's address and the frontend's id (the proxy purges entries of removed backends
/// and frontends), so an established flow needs no service or backend lookup. Served from
/// this CPU's flow cache when it holds a current copy of the entry.
#[inline(always)]
pub fn established(flow: &Flow) -> Option<Forward> {
    let fkey = key(flow, ct_dir::FORWARD);
    let slot = flow_cache::slot(&fkey);
    if let Some(e) = slot.as_ref().and_then(flow_cache::Slot::hit) {
        return Some(forward(flow, &e));
    }
    // SAFETY: copied out at once; a concurrent update can at worst give a stale value.
    let Some(v) = (unsafe { CONNTRACK.get(fkey).copied() }) else {
        if let Some(slot) = &slot {
            slot.forget();
        }
        return None;
    };
    let e = match &slot {
        Some(slot) => slot.fill(&v),
        None => flow_cache::entry_of(&v),
    };
    Some(forward(flow, &e))
}

/// Where the FORWARD entry (as cached) sends a packet of `flow`.
#[inline(always)]
fn forward(flow: &Flow, e: &FlowCacheEntry) -> Forward {
    let backend = Backend {
        ip_be: e.nat_addr_be,
        port_be: e.nat_port_be,
        proto: flow.proto,
        ..Backend::default()
    };
    let snat_addr_be = if e.flags & ct_flags::SNAT != 0 { node_ip_be() } else { 0 };
    Forward {
        backend_id: e.backend_id,
        rev_nat_id: e.rev_nat_id,
        backend,
        new_conn: false,
        snat_addr_be,
        dsr: e.flags & ct_flags::DSR != 0,
    }
}

/// Selects a backend for a new flow and records the FORWARD and REPLY entries (and a flow
/// event). `frontend_vip_be` is the frontend's key address (0 for NodePort). Flows to
/// backends not on this node are, with `dsr`, sent to the backend's node in IPIP (no REPLY
/// entry here: the replies do not come back through this node); else, with `snat_addr_be`
/// != 0, SNATed to it (their replies are then addressed to that address).
#[inline(always)]
pub fn open(
    flow: &Flow,
    frontend_vip_be: u32,
    frontend: &ServiceValue,
    snat_addr_be: u32,
    dsr: bool,
    path: u8,
) -> Result<Forward, u32> {
    let fkey = key(flow, ct_dir::FORWARD);
    let (backend_id, backend) = select_backend(
        frontend_vip_be,
        flow.dport_be,
        flow.proto,
        frontend,
        flow.saddr_be as u64,
        flow_hash(flow.saddr_be, flow.daddr_be, flow.sport_be, flow.dport_be, flow.proto),
    )?;
    let remote = backend.flags & backend_flags::LOCAL == 0;
    let dsr = dsr && remote;
    let snat_addr_be = if remote && !dsr { snat_addr_be } else { 0 };
    let t = now();
    let flags = if dsr {
        ct_flags::DSR
    } else if snat_addr_be != 0 {
        ct_flags::SNAT
    } else {
        0
    };
    let fwd = CtValue {
        backend_id,
        rev_nat_id: frontend.rev_nat_id,
        nat_addr_be: backend.ip_be,
        nat_port_be: backend.port_be,
        flags,
        client_addr_be: flow.saddr_be,
        client_port_be: flow.sport_be,
        _pad: 0,
        opened_ns: t,
    };
    CONNTRACK.insert(fkey, fwd, 0).map_err(|_| drop_reason::CT_FULL)?;
    if !dsr {
        open_reply(flow, frontend, backend_id, &backend, snat_addr_be, &fwd)?;
    }
    emit_flow(FlowEvent {
        ts_ns: t,
        client_addr_be: flow.saddr_be,
        frontend_addr_be: flow.daddr_be,
        backend_addr_be: backend.ip_be,
        rev_nat_id: frontend.rev_nat_id,
        backend_id,
        client_port_be: flow.sport_be,
        frontend_port_be: flow.dport_be,
        backend_port_be: backend.port_be,
        proto: flow.proto,
        path,
        _pad: 0,
    });
    Ok(Forward {
        backend_id,
        rev_nat_id: frontend.rev_nat_id,
        backend,
        new_conn: true,
        snat_addr_be,
        dsr,
    })
}

/// Records the REPLY entry of a flow just opened: the backend's replies (to the client, or
/// to `snat_addr_be` when SNATed) get the frontend back as their source.
#[inline(always)]
fn open_reply(
    flow: &Flow,
    frontend: &ServiceValue,
    backend_id: u32,
    backend: &Backend,
    snat_addr_be: u32,
    fwd: &CtValue,
) -> Result<(), u32> {
    let reply_daddr = if snat_addr_be != 0 { snat_addr_be } else { flow.saddr_be };
    let rkey = CtKey {
        saddr_be: backend.ip_be,
        daddr_be: reply_daddr,
        sport_be: backend.port_be,
        dport_be: flow.sport_be,
        proto: flow.proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    };
    let rev = CtValue {
        backend_id,
        rev_nat_id: frontend.rev_nat_id,
        nat_addr_be: flow.daddr_be,
        nat_port_be: flow.dport_be,
        flags: fwd.flags,
        client_addr_be: flow.saddr_be,
        client_port_be: flow.sport_be,
        _pad: 0,
        opened_ns: fwd.opened_ns,
    };
    CONNTRACK.insert(rkey, rev, 0).map_err(|_| drop_reason::CT_FULL)?;
    Ok(())
}

/// On the backend's node, for a packet of a DSR flow just decapsulated (`flow`: client →
/// backend): records, if missing, the REPLY entry that gives the backend's replies the
/// frontend (`frontend_addr_be:frontend_port_be`, carried in the outer header) as their
/// source. The ids of the frontend and backend are the other node's: 0 here.
#[inline(always)]
pub fn open_dsr_reply(
    flow: &Flow,
    frontend_addr_be: u32,
    frontend_port_be: u16,
) -> Result<(), u32> {
    let rkey = CtKey {
        saddr_be: flow.daddr_be,
        daddr_be: flow.saddr_be,
        sport_be: flow.dport_be,
        dport_be: flow.sport_be,
        proto: flow.proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    };
    // SAFETY: copied out at once.
    if let Some(v) = unsafe { CONNTRACK.get(rkey).copied() }
        && v.nat_addr_be == frontend_addr_be
        && v.nat_port_be == frontend_port_be
    {
        return Ok(());
    }
    let rev = CtValue {
        backend_id: 0,
        rev_nat_id: 0,
        nat_addr_be: frontend_addr_be,
        nat_port_be: frontend_port_be,
        flags: ct_flags::DSR,
        client_addr_be: flow.saddr_be,
        client_port_be: flow.sport_be,
        _pad: 0,
        opened_ns: now(),
    };
    CONNTRACK.insert(rkey, rev, 0).map_err(|_| drop_reason::CT_FULL)
}
