//! XDP on node-facing interfaces: NodePort, ExternalIP and LoadBalancer-ingress frontends
//! are DNATed to a backend. A local backend is delivered through the stack (XDP_PASS; its
//! replies are reverse-translated by the tc program on the way out); a remote backend also
//! gets its source rewritten to the node address (SNAT) and is forwarded, and its replies,
//! arriving here, are translated back and returned to the client. A TCP connection to a
//! frontend without backends is answered with a RST (XDP_TX), never black-holed.
//!
//! In DSR mode (`Config::nodeport_mode`) a remote backend's packets are not SNATed but
//! wrapped in IPIP to the backend's node (the FIB's next hop towards the backend), with the
//! frontend's address as outer source and its port as outer IP id; that node's XDP
//! program (or its tc fallback) unwraps them, records the frontend for the replies (which its tc program then
//! rewrites), and passes the inner packet on. See `nodeport_mode::DSR`.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, xdp_action},
    helpers::{bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    macros::xdp,
    programs::XdpContext,
};
use skiff_ebpf_common::{
    PROTO_TCP, PROTO_UDP, ServiceValue, ct_flags, drop_reason, flow_path, svc_flags,
};

use crate::{
    ct,
    maps::{
        count_drop, count_traffic, dsr_on, lookup_frontend, node_ip_be, serves_node_ports,
        source_allowed,
    },
    packet::{
        Flow, IP_DST_OFF, IP_SRC_OFF, IPIP_LEN, Ipv4Hdr, L3_OFF, Parsed, csum_replace2,
        csum_replace4, dsr_outer, dsr_outer_header, fib_route, parse, ptr_at, redirect_to_next_hop,
    },
    reject,
};

/// XDP entry point (inlined into the macro's wrapper, as the tc ones).
#[xdp]
#[inline(always)]
pub fn skiff_xdp_nodeport(ctx: XdpContext) -> u32 {
    match try_xdp(&ctx) {
        Ok(action) => action,
        Err(reason) => {
            count_drop(reason);
            xdp_action::XDP_DROP
        }
    }
}

#[inline(always)]
fn try_xdp(ctx: &XdpContext) -> Result<u32, u32> {
    let flow = match parse(ctx)? {
        Parsed::Flow(flow) => flow,
        Parsed::NotIpv4 => {
            count_drop(drop_reason::NON_IPV4);
            return Ok(xdp_action::XDP_PASS);
        }
        Parsed::NoPorts => return decap_dsr(ctx),
    };
    // An established flow first: its conntrack entry alone says where it goes.
    if let Some(fwd) = ct::established(&flow) {
        if flow.irregular != 0 {
            return Err(flow.irregular);
        }
        return deliver(ctx, &flow, fwd);
    }
    let node_ip = node_ip_be();
    let to_node = node_ip != 0 && flow.daddr_be == node_ip;
    // A reply of a remote backend to a SNATed NodePort flow: addressed to the node (the SNAT
    // address), so nothing else needs the conntrack lookup.
    if to_node && let Some(reply) = ct::lookup_reply(&flow) {
        if reply.flags & ct_flags::SNAT == 0 {
            return Ok(xdp_action::XDP_PASS);
        }
        if flow.irregular != 0 {
            return Err(flow.irregular);
        }
        rewrite(
            ctx,
            &flow,
            IP_SRC_OFF,
            flow.saddr_be,
            reply.nat_addr_be,
            0,
            flow.sport_be,
            reply.nat_port_be,
        )?;
        rewrite(
            ctx,
            &flow,
            IP_DST_OFF,
            flow.daddr_be,
            reply.client_addr_be,
            2,
            flow.dport_be,
            reply.client_port_be,
        )?;
        count_traffic(reply.rev_nat_id, reply.backend_id, packet_len(ctx), false);
        return forward_out(ctx, reply.client_addr_be, reply.nat_addr_be);
    }
    let nodeport = to_node || serves_node_ports(flow.daddr_be, 0);
    let Some((vip_be, frontend)) = external_frontend(&flow, nodeport) else {
        return Ok(xdp_action::XDP_PASS);
    };
    if flow.irregular != 0 {
        return Err(flow.irregular);
    }
    if !source_allowed(&frontend, flow.saddr_be) {
        return Err(drop_reason::SOURCE_RANGE);
    }
    if frontend.count == 0 {
        count_drop(drop_reason::NO_BACKEND);
        if flow.proto == PROTO_TCP {
            return reject_tcp(ctx, &flow);
        }
        return reject_udp(ctx, &flow);
    }
    let fwd = ct::open(&flow, vip_be, &frontend, node_ip, dsr_on(), flow_path::XDP)?;
    deliver(ctx, &flow, fwd)
}

/// Rewrites a forward packet to its backend: a local one gets it through the stack, a
/// remote one also gets the node address as source and is sent out through the FIB.
#[inline(always)]
fn deliver(ctx: &XdpContext, flow: &Flow, fwd: ct::Forward) -> Result<u32, u32> {
    rewrite(
        ctx,
        flow,
        IP_DST_OFF,
        flow.daddr_be,
        fwd.backend.ip_be,
        2,
        flow.dport_be,
        fwd.backend.port_be,
    )?;
    count_traffic(fwd.rev_nat_id, fwd.backend_id, packet_len(ctx), fwd.new_conn);
    if fwd.dsr {
        return encap_dsr(ctx, flow, fwd.backend.ip_be);
    }
    if fwd.snat_addr_be == 0 {
        return Ok(xdp_action::XDP_PASS);
    }
    let node_ip = fwd.snat_addr_be;
    rewrite(ctx, flow, IP_SRC_OFF, flow.saddr_be, node_ip, 0, flow.sport_be, flow.sport_be)?;
    forward_out(ctx, fwd.backend.ip_be, node_ip)
}

#[inline(always)]
fn packet_len(ctx: &XdpContext) -> u64 {
    (ctx.data_end() - ctx.data()) as u64
}

/// The frontend an external packet addresses: a NodePort when it is addressed to this
/// node (`nodeport`: its address or one of `--nodeport-addresses`), else an ExternalIP/LB
/// IP by address; with the frontend's key address.
#[inline(always)]
fn external_frontend(flow: &Flow, nodeport: bool) -> Option<(u32, ServiceValue)> {
    const EXTERNAL: u16 = svc_flags::EXTERNAL_IP | svc_flags::LOAD_BALANCER;
    if nodeport
        && let Some(f) = lookup_frontend(0, flow.dport_be, flow.proto)
        && f.flags & svc_flags::NODE_PORT != 0
    {
        return Some((0, f));
    }
    if let Some(f) = lookup_frontend(flow.daddr_be, flow.dport_be, flow.proto)
        && f.flags & EXTERNAL != 0
    {
        return Some((flow.daddr_be, f));
    }
    None
}

/// Rewrites one address (at `addr_off`) and its port (at L4 + `port_in_l4`), updating the
/// IPv4 and L4 checksums incrementally (a zero UDP checksum stays "none").
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rewrite(
    ctx: &XdpContext,
    flow: &Flow,
    addr_off: usize,
    old_addr: u32,
    new_addr: u32,
    port_in_l4: usize,
    old_port: u16,
    new_port: u16,
) -> Result<(), u32> {
    let ip: *mut Ipv4Hdr = ptr_at(ctx, L3_OFF)?;
    let addr: *mut u32 = ptr_at(ctx, addr_off)?;
    let port: *mut u16 = ptr_at(ctx, flow.l4_off + port_in_l4)?;
    let l4_csum: *mut u16 = ptr_at(ctx, flow.csum_off)?;
    // SAFETY: all four pointers were bounds-checked by ptr_at just above.
    unsafe {
        (*ip).csum = csum_replace4((*ip).csum, old_addr, new_addr);
        *addr = new_addr;
        *port = new_port;
        let c = *l4_csum;
        if !(flow.proto == PROTO_UDP && c == 0) {
            let mut c = csum_replace4(c, old_addr, new_addr);
            c = csum_replace2(c, old_port, new_port);
            if flow.proto == PROTO_UDP && c == 0 {
                c = 0xffff;
            }
            *l4_csum = c;
        }
    }
    Ok(())
}

/// Sends the rewritten packet towards `daddr_be` through the FIB (new MACs, redirect);
/// falls back to the stack when the FIB cannot resolve the next hop yet.
#[inline(always)]
fn forward_out(ctx: &XdpContext, daddr_be: u32, saddr_be: u32) -> Result<u32, u32> {
    let (rc, params) = fib_route(ctx.as_ptr(), ctx.ingress_ifindex() as u32, saddr_be, daddr_be);
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 {
        return Ok(xdp_action::XDP_PASS);
    }
    Ok(redirect_to_next_hop(ctx, &params)? as u32)
}

/// Answers a TCP segment to a backend-less frontend with a RST from the frontend, in place,
/// and bounces it out of the receiving interface.
#[inline(always)]
fn reject_tcp(ctx: &XdpContext, flow: &Flow) -> Result<u32, u32> {
    let Some(rst) = reject::rst_numbers(ctx, flow)? else {
        return Ok(xdp_action::XDP_DROP);
    };
    let len = ctx.data_end() - ctx.data();
    if len > reject::RST_FRAME_LEN {
        // SAFETY: helper on this program's own context; shrinking only.
        let rc = unsafe {
            bpf_xdp_adjust_tail(ctx.as_ptr() as *mut _, -((len - reject::RST_FRAME_LEN) as i32))
        };
        if rc != 0 {
            return Err(drop_reason::REWRITE_FAILED);
        }
    }
    reject::write_rst(ctx, flow, &rst)?;
    Ok(xdp_action::XDP_TX)
}

/// Answers a UDP datagram to a backend-less frontend with an ICMP port-unreachable (XDP_TX).
#[inline(always)]
fn reject_udp(ctx: &XdpContext, flow: &Flow) -> Result<u32, u32> {
    // Grow at the front, move Ethernet there: [eth][room 28][orig IPv4][orig UDP...].
    // SAFETY: helper on this program's own context.
    if unsafe { bpf_xdp_adjust_head(ctx.as_ptr() as *mut _, -(reject::ICMP_ROOM as i32)) } != 0 {
        return Err(drop_reason::REWRITE_FAILED);
    }
    let new_eth: *mut [u8; 14] = ptr_at(ctx, 0)?;
    let old_eth: *mut [u8; 14] = ptr_at(ctx, reject::ICMP_ROOM)?;
    // SAFETY: both bounds-checked; non-overlapping (28 bytes apart, 14 long).
    unsafe { *new_eth = *old_eth };
    let len = ctx.data_end() - ctx.data();
    if len > reject::ICMP_FRAME_LEN {
        // SAFETY: helper on this program's own context; shrinking only.
        let rc = unsafe {
            bpf_xdp_adjust_tail(ctx.as_ptr() as *mut _, -((len - reject::ICMP_FRAME_LEN) as i32))
        };
        if rc != 0 {
            return Err(drop_reason::REWRITE_FAILED);
        }
    }
    reject::write_icmp_unreachable(ctx, flow)?;
    Ok(xdp_action::XDP_TX)
}

/// DSR, on the frontend's node: wraps the (already DNATed) packet in IPIP to the next hop
/// towards the backend (its node), outer source = the frontend address (the packet's
/// original destination), outer id = the frontend port; sends it there. When the FIB has
/// no neighbour entry yet the wrapped packet goes up the stack, which forwards it and
/// resolves the neighbour for the next ones.
#[inline(always)]
fn encap_dsr(ctx: &XdpContext, flow: &Flow, backend_be: u32) -> Result<u32, u32> {
    let (rc, params) =
        fib_route(ctx.as_ptr(), ctx.ingress_ifindex() as u32, flow.daddr_be, backend_be);
    let resolved = rc == BPF_FIB_LKUP_RET_SUCCESS as i64;
    if !resolved && rc != BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
        return Err(drop_reason::NO_ROUTE);
    }
    // SAFETY: the lookup wrote the next hop (the gateway, or the destination itself).
    let next_hop = unsafe { params.__bindgen_anon_4.ipv4_dst };
    let inner: *mut Ipv4Hdr = ptr_at(ctx, L3_OFF)?;
    // SAFETY: bounds-checked just above.
    let (tos, tot_len, frag) =
        unsafe { ((*inner).tos, u16::from_be((*inner).tot_len_be), (*inner).frag_be) };
    // Room in front, then the Ethernet header moves there: [eth][outer IPv4][inner ...].
    // SAFETY: helper on this program's own context.
    if unsafe { bpf_xdp_adjust_head(ctx.as_ptr() as *mut _, -(IPIP_LEN as i32)) } != 0 {
        return Err(drop_reason::REWRITE_FAILED);
    }
    let new_eth: *mut [u8; 14] = ptr_at(ctx, 0)?;
    let old_eth: *mut [u8; 14] = ptr_at(ctx, IPIP_LEN)?;
    // SAFETY: both bounds-checked; 20 bytes apart and 14 long: no overlap.
    unsafe { *new_eth = *old_eth };
    let outer: *mut Ipv4Hdr = ptr_at(ctx, L3_OFF)?;
    // SAFETY: bounds-checked just above.
    unsafe { *outer = dsr_outer_header(flow, tos, tot_len, frag, next_hop) };
    if !resolved {
        return Ok(xdp_action::XDP_PASS);
    }
    Ok(redirect_to_next_hop(ctx, &params)? as u32)
}

/// DSR, on the backend's node: an IPIP packet addressed to this node (in DSR mode) is
/// unwrapped; the frontend it was sent to (outer source and id) is recorded for the
/// backend's replies, and the inner packet goes up the stack to the backend. Anything else
/// without ports passes untouched.
#[inline(always)]
fn decap_dsr(ctx: &XdpContext) -> Result<u32, u32> {
    if !dsr_on() {
        return Ok(xdp_action::XDP_PASS);
    }
    let Some((frontend_be, port_be)) = dsr_outer(ctx, node_ip_be())? else {
        return Ok(xdp_action::XDP_PASS);
    };
    let old_eth: *mut [u8; 14] = ptr_at(ctx, 0)?;
    let new_eth: *mut [u8; 14] = ptr_at(ctx, IPIP_LEN)?;
    // SAFETY: both bounds-checked; 20 bytes apart and 14 long: no overlap.
    unsafe { *new_eth = *old_eth };
    // SAFETY: helper on this program's own context; shrinks the front.
    if unsafe { bpf_xdp_adjust_head(ctx.as_ptr() as *mut _, IPIP_LEN as i32) } != 0 {
        return Err(drop_reason::REWRITE_FAILED);
    }
    let flow = match parse(ctx)? {
        Parsed::Flow(flow) => flow,
        // Only TCP/UDP flows are wrapped by skiff; anything else unwrapped goes on as is.
        Parsed::NoPorts | Parsed::NotIpv4 => return Ok(xdp_action::XDP_PASS),
    };
    if flow.irregular != 0 {
        return Err(flow.irregular);
    }
    ct::open_dsr_reply(&flow, frontend_be, port_be)?;
    Ok(xdp_action::XDP_PASS)
}
