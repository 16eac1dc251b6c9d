//! Socket LB: ClusterIP (and ExternalIP/LB IP) translation at connect()/sendmsg() time in
//! the cgroup sock_addr hooks, so in-cluster TCP and UDP need no per-packet NAT; recvmsg and
//! getpeername restore the frontend so applications only ever see the service address.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_ktime_get_coarse_ns, bpf_set_retval,
    },
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use skiff_ebpf_common::{
    FlowEvent, PROTO_TCP, PROTO_UDP, RevNat, SockRevKey, flow_path, svc_flags,
};

use crate::maps::{
    SOCK_REV, count_drop, count_traffic, emit_flow, lookup_frontend, select_backend,
};

const AF_INET: u32 = 2;
const ECONNREFUSED: i32 = 111;
/// Frontends the socket hooks translate (NodePort keys have no address of their own).
const SOCK_LB_FLAGS: u16 =
    svc_flags::CLUSTER_IP | svc_flags::EXTERNAL_IP | svc_flags::LOAD_BALANCER;

/// Verdicts of cgroup sock_addr programs.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;

/// connect(): TCP and connected UDP.
#[cgroup_sock_addr(connect4)]
pub fn skiff_connect4(ctx: SockAddrContext) -> i32 {
    verdict(&ctx, try_translate(&ctx))
}

/// sendmsg(): unconnected UDP.
#[cgroup_sock_addr(sendmsg4)]
pub fn skiff_sendmsg4(ctx: SockAddrContext) -> i32 {
    verdict(&ctx, try_translate(&ctx))
}

/// recvmsg(): UDP replies appear to come from the frontend.
#[cgroup_sock_addr(recvmsg4)]
pub fn skiff_recvmsg4(ctx: SockAddrContext) -> i32 {
    restore_frontend(&ctx);
    ALLOW
}

/// getpeername(): the peer is the frontend, not the backend.
#[cgroup_sock_addr(getpeername4)]
pub fn skiff_getpeername4(ctx: SockAddrContext) -> i32 {
    restore_frontend(&ctx);
    ALLOW
}

/// Turns a translation result into the hook's verdict. A frontend without backends is
/// refused with ECONNREFUSED (never black-holed); every refusal is counted.
#[inline(always)]
fn verdict(_ctx: &SockAddrContext, r: Result<(), u32>) -> i32 {
    match r {
        Ok(()) => ALLOW,
        Err(reason) => {
            count_drop(reason);
            // SAFETY: helper without pointer arguments; sets the syscall's error code.
            unsafe { bpf_set_retval(-ECONNREFUSED) };
            REJECT
        }
    }
}

#[inline(always)]
fn try_translate(ctx: &SockAddrContext) -> Result<(), u32> {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel hands a valid bpf_sock_addr to this program type.
    let (family, proto, vip_be, port_be) =
        unsafe { ((*sa).user_family, (*sa).protocol, (*sa).user_ip4, (*sa).user_port as u16) };
    if family != AF_INET {
        return Ok(());
    }
    let proto = match proto {
        p if p == PROTO_TCP as u32 => PROTO_TCP,
        p if p == PROTO_UDP as u32 => PROTO_UDP,
        _ => return Ok(()),
    };
    let Some(frontend) = lookup_frontend(vip_be, port_be, proto) else {
        return Ok(());
    };
    if frontend.flags & SOCK_LB_FLAGS == 0 {
        return Ok(());
    }
    // The source address is not chosen yet at connect(): the network namespace (the pod)
    // stands for the client under sessionAffinity.
    // SAFETY: helper on this program's own context.
    let client_id = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let (backend_id, backend) =
        select_backend(vip_be, port_be, proto, &frontend, client_id, client_id as u32)?;
    // SAFETY: as above; the kernel allows 4-byte writes of user_ip4 and user_port.
    unsafe {
        (*sa).user_ip4 = backend.ip_be;
        (*sa).user_port = backend.port_be as u32;
    }
    // SAFETY: helper on this program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevKey {
        cookie,
        backend_ip_be: backend.ip_be,
        backend_port_be: backend.port_be,
        _pad: 0,
    };
    // An unconnected UDP socket goes through here on every sendmsg(): only its first
    // datagram to a backend is a new flow (counted as a connection, one flow event).
    // SAFETY: the value is only tested for presence.
    let known = unsafe { SOCK_REV.get(key).is_some() };
    if known {
        count_traffic(frontend.rev_nat_id, backend_id, 0, false);
        return Ok(());
    }
    let value = RevNat { vip_be, port_be, _pad: 0 };
    // An LRU map: a failed insert only loses the reverse translation of one socket.
    let _ = SOCK_REV.insert(key, value, 0);
    count_traffic(frontend.rev_nat_id, backend_id, 0, true);
    emit_flow(FlowEvent {
        // SAFETY: helper without arguments.
        ts_ns: unsafe { bpf_ktime_get_coarse_ns() },
        client_addr_be: 0,
        frontend_addr_be: vip_be,
        backend_addr_be: backend.ip_be,
        rev_nat_id: frontend.rev_nat_id,
        backend_id,
        client_port_be: 0,
        frontend_port_be: port_be,
        backend_port_be: backend.port_be,
        proto,
        path: flow_path::SOCKET,
        _pad: 0,
    });
    Ok(())
}

#[inline(always)]
fn restore_frontend(ctx: &SockAddrContext) {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel hands a valid bpf_sock_addr to this program type.
    let (family, ip_be, port_be) =
        unsafe { ((*sa).user_family, (*sa).user_ip4, (*sa).user_port as u16) };
    if family != AF_INET {
        return;
    }
    // SAFETY: helper on this program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevKey { cookie, backend_ip_be: ip_be, backend_port_be: port_be, _pad: 0 };
    // SAFETY: the value is copied out at once.
    if let Some(front) = unsafe { SOCK_REV.get(key).copied() } {
        // SAFETY: as above; 4-byte writes of user_ip4/user_port are allowed in these hooks.
        unsafe {
            (*sa).user_ip4 = front.vip_be;
            (*sa).user_port = front.port_be as u32;
        }
    }
}
