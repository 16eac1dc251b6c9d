//! tc per-packet service NAT: DNAT of client packets to a backend with conntrack, and
//! reverse NAT of backend replies, for traffic the socket hooks did not translate.
//!
//! One program serves both directions (attach it on ingress and egress): a packet addressed
//! to a frontend gets its destination rewritten to a backend; otherwise a packet matching a
//! REPLY conntrack entry gets its source restored to the frontend (and, for a NodePort flow
//! SNATed here, its destination to the client, forwarded through the FIB); otherwise a
//! packet to a NodePort of this node's address is DNATed (SNATed and forwarded for remote
//! backends, or wrapped in IPIP to the backend's node in DSR mode, which unwraps it on
//! ingress): the tc fallback on interfaces where XDP cannot attach. Everything else passes
//! untouched.

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_F_ADJ_ROOM_DECAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_INGRESS,
        BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_OK, TC_ACT_SHOT, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
        bpf_redir_neigh, bpf_redir_neigh__bindgen_ty_1,
    },
    helpers::{bpf_redirect, bpf_redirect_neigh, bpf_skb_adjust_room, bpf_skb_change_tail},
    macros::classifier,
    programs::TcContext,
};
use skiff_ebpf_common::{
    PROTO_TCP, PROTO_UDP, ServiceValue, ct_flags, drop_reason, flow_path, svc_flags,
};

use crate::{
    ct,
    maps::{
        count_drop, count_traffic, dsr_on, from_outside_cluster, lookup_frontend, node_ip_be,
        serves_node_ports, source_allowed,
    },
    packet::{
        Flow, IP_DST_OFF, IP_SRC_OFF, IPIP_LEN, Ipv4Hdr, L3_OFF, Parsed, csum_replace2,
        csum_replace4, dsr_outer, dsr_outer_header, fib_route, parse, ptr_at, redirect_to_next_hop,
    },
    reject,
};

// The bindings' integer type for these differs between targets.
#[allow(clippy::unnecessary_cast)]
const ACT_OK: i32 = TC_ACT_OK as i32;
#[allow(clippy::unnecessary_cast)]
const ACT_SHOT: i32 = TC_ACT_SHOT as i32;

/// Ethernet (14) + IPv4 with maximal options (60) + TCP without options (20).
const MAX_HEADERS: usize = 94;

/// tc entry point for ingress hooks. Inlined into the wrapper the macro generates (a
/// program body big enough makes LLVM keep it a BPF-to-BPF call otherwise).
#[classifier]
#[inline(always)]
pub fn skiff_tc_ingress(ctx: TcContext) -> i32 {
    entry(&ctx, false)
}

/// tc entry point for egress hooks (differs only in where a reject is sent).
#[classifier]
#[inline(always)]
pub fn skiff_tc_egress(ctx: TcContext) -> i32 {
    entry(&ctx, true)
}

#[inline(always)]
fn entry(ctx: &TcContext, egress: bool) -> i32 {
    match try_tc(ctx, egress) {
        Ok(verdict) => verdict,
        Err(reason) => {
            count_drop(reason);
            ACT_SHOT
        }
    }
}

#[inline(always)]
fn try_tc(ctx: &TcContext, egress: bool) -> Result<i32, u32> {
    // Headers may sit partly in non-linear fragments: pull the most they can span
    // (Ethernet + IPv4 with options + TCP) into the linear area first.
    let want = (ctx.len() as usize).min(MAX_HEADERS);
    if ctx.data_end() - ctx.data() < want {
        ctx.pull_data(want as u32).map_err(|_| drop_reason::TRUNCATED)?;
    }
    let flow = match parse(ctx)? {
        Parsed::Flow(flow) => flow,
        Parsed::NotIpv4 => {
            count_drop(drop_reason::NON_IPV4);
            return Ok(ACT_OK);
        }
        Parsed::NoPorts if !egress => return decap_dsr(ctx),
        Parsed::NoPorts => return Ok(ACT_OK),
    };
    // An established flow first (the common case): its conntrack entry alone says where
    // it goes. Then a new flow to a frontend; then a reply.
    if let Some(fwd) = ct::established(&flow) {
        if flow.irregular != 0 {
            return Err(flow.irregular);
        }
        return deliver(ctx, &flow, fwd);
    }
    if let Some(frontend) = lookup_frontend(flow.daddr_be, flow.dport_be, flow.proto) {
        // From outside the pod ranges (`--cluster-cidr`): SNAT for a remote backend, so its
        // replies come back through this node (kube-proxy's masquerade).
        let snat = if from_outside_cluster(flow.saddr_be) { node_ip_be() } else { 0 };
        return to_frontend(ctx, &flow, flow.daddr_be, &frontend, snat, egress);
    }
    if let Some(reply) = ct::lookup_reply(&flow) {
        if flow.irregular != 0 {
            return Err(flow.irregular);
        }
        let mode = csum_mode(ctx);
        rewrite(ctx, &flow, Field::Src, reply.nat_addr_be, reply.nat_port_be, mode)?;
        count_traffic(reply.rev_nat_id, reply.backend_id, ctx.len() as u64, false);
        if reply.flags & ct_flags::SNAT == 0 {
            return Ok(ACT_OK);
        }
        // A remote backend's reply to a NodePort flow this node SNATed (the tc fallback of
        // XDP): back to the client, out of the interface the FIB names.
        rewrite(ctx, &flow, Field::Dst, reply.client_addr_be, reply.client_port_be, mode)?;
        return forward_out(ctx, reply.client_addr_be, reply.nat_addr_be);
    }
    // NodePort on this node's address: the tc fallback where XDP could not attach (and pods
    // reaching a NodePort of their own node).
    let node_ip = node_ip_be();
    if node_ip != 0
        && serves_node_ports(flow.daddr_be, node_ip)
        && let Some(frontend) = lookup_frontend(0, flow.dport_be, flow.proto)
        && frontend.flags & svc_flags::NODE_PORT != 0
    {
        return to_frontend(ctx, &flow, 0, &frontend, node_ip, egress);
    }
    Ok(ACT_OK)
}

/// DNAT of a new flow's packet to a frontend (key address `vip_be`, 0 for NodePort); with
/// `snat_addr_be` != 0 a flow to a backend on another node is also SNATed to that address
/// and sent out through the FIB.
#[inline(always)]
fn to_frontend(
    ctx: &TcContext,
    flow: &Flow,
    vip_be: u32,
    frontend: &ServiceValue,
    snat_addr_be: u32,
    egress: bool,
) -> Result<i32, u32> {
    if flow.irregular != 0 {
        return Err(flow.irregular);
    }
    if !source_allowed(frontend, flow.saddr_be) {
        return Err(drop_reason::SOURCE_RANGE);
    }
    if frontend.count == 0 {
        count_drop(drop_reason::NO_BACKEND);
        if flow.proto == PROTO_TCP {
            return reject_tcp(ctx, flow, egress);
        }
        return reject_udp(ctx, flow, egress);
    }
    // DSR applies where this node would otherwise SNAT (the NodePort fallback of XDP).
    let dsr = snat_addr_be != 0 && dsr_on();
    let fwd = ct::open(flow, vip_be, frontend, snat_addr_be, dsr, flow_path::TC)?;
    deliver(ctx, flow, fwd)
}

/// Rewrites a forward packet to its backend (and the node address, for SNATed flows),
/// counts it, and lets it go.
#[inline(always)]
fn deliver(ctx: &TcContext, flow: &Flow, fwd: ct::Forward) -> Result<i32, u32> {
    let mode = csum_mode(ctx);
    rewrite(ctx, flow, Field::Dst, fwd.backend.ip_be, fwd.backend.port_be, mode)?;
    count_traffic(fwd.rev_nat_id, fwd.backend_id, ctx.len() as u64, fwd.new_conn);
    if fwd.dsr {
        return encap_dsr(ctx, flow, fwd.backend.ip_be);
    }
    if fwd.snat_addr_be == 0 {
        return Ok(ACT_OK);
    }
    rewrite(ctx, flow, Field::Src, fwd.snat_addr_be, flow.sport_be, mode)?;
    forward_out(ctx, fwd.backend.ip_be, fwd.snat_addr_be)
}

/// Sends a rewritten packet towards `daddr_be` through the FIB (new MACs, redirect to the
/// egress interface); leaves it to the stack when the FIB cannot resolve the next hop yet.
#[inline(always)]
fn forward_out(ctx: &TcContext, daddr_be: u32, saddr_be: u32) -> Result<i32, u32> {
    let (rc, params) = fib_route(
        ctx.as_ptr(),
        // SAFETY: reads a field of this program's own skb.
        unsafe { (*ctx.skb.skb).ifindex },
        saddr_be,
        daddr_be,
    );
    if rc == BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
        // The next hop is not resolved yet: the kernel resolves it and sends the packet. The
        // stack would not: the packet's source is now this node's own address, which it
        // drops as martian on ingress (the first SNATed packet to a new neighbour).
        const AF_INET: u32 = 2;
        let mut nh = bpf_redir_neigh {
            nh_family: AF_INET,
            // SAFETY: the lookup wrote the next hop (the gateway, or the destination).
            __bindgen_anon_1: bpf_redir_neigh__bindgen_ty_1 {
                ipv4_nh: unsafe { params.__bindgen_anon_4.ipv4_dst },
            },
        };
        let len = core::mem::size_of::<bpf_redir_neigh>() as i32;
        // SAFETY: helper with a pointer to this stack variable and its size.
        return Ok(unsafe { bpf_redirect_neigh(params.ifindex, &mut nh, len, 0) } as i32);
    }
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 {
        return Ok(ACT_OK);
    }
    Ok(redirect_to_next_hop(ctx, &params)? as i32)
}

/// DSR on the tc fallback, frontend's node: wraps the (already DNATed) packet in IPIP to
/// the FIB's next hop towards the backend (as the XDP program does) and sends it there; the
/// stack forwards it when the neighbour is not resolved yet.
#[inline(always)]
fn encap_dsr(ctx: &TcContext, flow: &Flow, backend_be: u32) -> Result<i32, u32> {
    let (rc, params) = fib_route(
        ctx.as_ptr(),
        // SAFETY: reads a field of this program's own skb.
        unsafe { (*ctx.skb.skb).ifindex },
        flow.daddr_be,
        backend_be,
    );
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
    // Room for the outer header between Ethernet and the inner IPv4 header; the kernel
    // marks the skb as IPv4-in-IPv4 encapsulated (for GSO and checksum offload).
    // SAFETY: helper on this program's own skb.
    let flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 as u64;
    if unsafe { bpf_skb_adjust_room(ctx.skb.skb, IPIP_LEN as i32, BPF_ADJ_ROOM_MAC, flags) } != 0 {
        return Err(drop_reason::REWRITE_FAILED);
    }
    let outer: *mut Ipv4Hdr = ptr_at(ctx, L3_OFF)?;
    // SAFETY: bounds-checked just above.
    unsafe { *outer = dsr_outer_header(flow, tos, tot_len, frag, next_hop) };
    if !resolved {
        return Ok(ACT_OK);
    }
    Ok(redirect_to_next_hop(ctx, &params)? as i32)
}

/// DSR on the tc fallback, backend's node (ingress): an IPIP packet addressed to this node
/// in DSR mode is unwrapped, its frontend recorded for the backend's replies, and the inner
/// packet goes on to the backend. Anything else without ports passes untouched.
#[inline(always)]
fn decap_dsr(ctx: &TcContext) -> Result<i32, u32> {
    if !dsr_on() {
        return Ok(ACT_OK);
    }
    let Some((frontend_be, port_be)) = dsr_outer(ctx, node_ip_be())? else {
        return Ok(ACT_OK);
    };
    let flags = BPF_F_ADJ_ROOM_DECAP_L3_IPV4 as u64;
    // SAFETY: helper on this program's own skb; removes the outer header.
    if unsafe { bpf_skb_adjust_room(ctx.skb.skb, -(IPIP_LEN as i32), BPF_ADJ_ROOM_MAC, flags) } != 0
    {
        return Err(drop_reason::REWRITE_FAILED);
    }
    let flow = match parse(ctx)? {
        Parsed::Flow(flow) => flow,
        Parsed::NoPorts | Parsed::NotIpv4 => return Ok(ACT_OK),
    };
    if flow.irregular != 0 {
        return Err(flow.irregular);
    }
    ct::open_dsr_reply(&flow, frontend_be, port_be)?;
    Ok(ACT_OK)
}

/// Which end of the flow a rewrite changes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Src,
    Dst,
}

/// Where `sk_buff::ip_summed` lives in this kernel, set by the loader from the kernel's BTF
/// before the program is verified (a read-only global: the verifier sees a constant):
/// `IP_SUMMED_KNOWN | byte offset << 8 | bit shift`, or 0 when unknown (then every L4
/// checksum update goes through the kernel helper, which reads it itself).
#[unsafe(no_mangle)]
static SKIFF_SKB_IP_SUMMED: u32 = 0;

/// `SKIFF_SKB_IP_SUMMED` holds a position.
const IP_SUMMED_KNOWN: u32 = 1 << 31;
/// `skb->ip_summed` values (include/linux/skbuff.h).
const CHECKSUM_COMPLETE: u8 = 2;
const CHECKSUM_PARTIAL: u8 = 3;
/// Not a kernel value: `ip_summed` could not be read, use the helpers.
const CHECKSUM_UNKNOWN: u8 = 0xff;

/// `bpf_cast_to_kern_ctx(ctx)`: the kernel's `struct sk_buff` behind the program's
/// context, as a BTF pointer the verifier lets the program read fields of (the call is
/// inlined by the verifier into a register move: no call at run time). A kfunc call
/// (`BPF_PSEUDO_KFUNC_CALL`) aya 0.14 cannot relocate, so it is emitted by hand with the
/// placeholder BTF id `skiff_ebpf_common::KFUNC_PLACEHOLDER`, which the loader replaces
/// with the kfunc's id in the running kernel's BTF before loading.
#[inline(always)]
fn kern_skb(ctx: &TcContext) -> *const u8 {
    #[cfg(target_arch = "bpf")]
    {
        let skb: *const u8;
        // SAFETY: `call` of the kfunc with r1 = the context, r0 = its result; r1-r5 are
        // clobbered as by any call. The encoding is `BPF_JMP | BPF_CALL` (0x85), src_reg
        // BPF_PSEUDO_KFUNC_CALL (2), imm = the placeholder id (little-endian).
        unsafe {
            core::arch::asm!(
                ".byte 0x85, 0x20, 0x00, 0x00, 0xed, 0x5e, 0xca, 0x7f",
                inlateout("r1") ctx.skb.skb => _,
                lateout("r0") skb,
                lateout("r2") _,
                lateout("r3") _,
                lateout("r4") _,
                lateout("r5") _,
                options(nostack, readonly),
            );
        }
        skb
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        ctx.skb.skb as *const u8
    }
}

/// How the L4 checksum of this skb must be updated: its `ip_summed`, read from the kernel's
/// sk_buff (one byte, at the offset the loader found in BTF).
#[inline(always)]
fn csum_mode(ctx: &TcContext) -> u8 {
    // SAFETY: volatile read of a read-only global the loader sets before verification.
    let pos = unsafe { core::ptr::read_volatile(&SKIFF_SKB_IP_SUMMED) };
    if pos & IP_SUMMED_KNOWN == 0 {
        return CHECKSUM_UNKNOWN;
    }
    let byte_off = ((pos >> 8) & 0xffff) as usize;
    let shift = pos & 0x7;
    // SAFETY: a BTF pointer to this program's sk_buff; the offset (a verification-time
    // constant) lies inside it, on the byte holding `ip_summed` (the verifier checks both).
    let b = unsafe { core::ptr::read_volatile(kern_skb(ctx).add(byte_off)) };
    (b >> shift) & 0x3
}

/// Rewrites the address and port of one end. The address, the port and the IPv4 checksum
/// are written directly (tc programs may write packet data; the verifier unclones the skb
/// first). The L4 checksum is updated directly too, as the skb's `ip_summed` (`mode`, from
/// `csum_mode`) requires: a full checksum (NONE/UNNECESSARY) gets the address and port
/// deltas (RFC 1624); a CHECKSUM_PARTIAL one holds only the pseudo-header sum, which gets the
/// address delta alone. CHECKSUM_COMPLETE skbs (whose `skb->csum` must follow) and unknown
/// modes go through the kernel helper, as do all when the position is unknown.
#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    flow: &Flow,
    field: Field,
    new_addr_be: u32,
    new_port_be: u16,
    mode: u8,
) -> Result<(), u32> {
    let (addr_off, old_addr, port_off, old_port) = match field {
        Field::Src => (IP_SRC_OFF, flow.saddr_be, flow.l4_off, flow.sport_be),
        Field::Dst => (IP_DST_OFF, flow.daddr_be, flow.l4_off + 2, flow.dport_be),
    };
    let ip: *mut Ipv4Hdr = ptr_at(ctx, L3_OFF)?;
    let addr: *mut u32 = ptr_at(ctx, addr_off)?;
    let port: *mut u16 = ptr_at(ctx, port_off)?;
    // SAFETY: the three pointers were bounds-checked by ptr_at just above.
    unsafe {
        if old_addr != new_addr_be {
            (*ip).csum = csum_replace4((*ip).csum, old_addr, new_addr_be);
            *addr = new_addr_be;
        }
        *port = new_port_be;
    }
    let udp = flow.proto == PROTO_UDP;
    if mode != CHECKSUM_COMPLETE && mode != CHECKSUM_UNKNOWN {
        let l4_csum: *mut u16 = ptr_at(ctx, flow.csum_off)?;
        // SAFETY: bounds-checked just above.
        unsafe {
            let c = *l4_csum;
            // A zero UDP checksum means "none" and stays so (BPF_F_MARK_MANGLED_0).
            if udp && c == 0 {
                return Ok(());
            }
            let mut c = if mode == CHECKSUM_PARTIAL {
                !csum_replace4(!c, old_addr, new_addr_be)
            } else {
                csum_replace2(csum_replace4(c, old_addr, new_addr_be), old_port, new_port_be)
            };
            if udp && c == 0 {
                c = 0xffff;
            }
            *l4_csum = c;
        }
        return Ok(());
    }
    let l4_flags = if udp { BPF_F_MARK_MANGLED_0 as u64 } else { 0 };
    let fail = |_| drop_reason::REWRITE_FAILED;
    if old_addr != new_addr_be {
        ctx.l4_csum_replace(
            flow.csum_off,
            old_addr as u64,
            new_addr_be as u64,
            BPF_F_PSEUDO_HDR as u64 | l4_flags | 4,
        )
        .map_err(fail)?;
    }
    if old_port != new_port_be {
        ctx.l4_csum_replace(flow.csum_off, old_port as u64, new_port_be as u64, l4_flags | 2)
            .map_err(fail)?;
    }
    Ok(())
}

/// Answers a TCP segment to a backend-less frontend with a RST, sent back where the segment
/// came from: out of the interface on ingress, up the stack on egress.
#[inline(always)]
fn reject_tcp(ctx: &TcContext, flow: &Flow, egress: bool) -> Result<i32, u32> {
    let Some(rst) = reject::rst_numbers(ctx, flow)? else {
        return Ok(ACT_SHOT);
    };
    // SAFETY: helper on this program's own skb.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, reject::RST_FRAME_LEN as u32, 0) } != 0 {
        return Err(drop_reason::REWRITE_FAILED);
    }
    ctx.pull_data(reject::RST_FRAME_LEN as u32).map_err(|_| drop_reason::REWRITE_FAILED)?;
    reject::write_rst(ctx, flow, &rst)?;
    // SAFETY: reads a field of this program's own skb.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let flags = if egress { BPF_F_INGRESS as u64 } else { 0 };
    // SAFETY: helper without pointer arguments.
    Ok(unsafe { bpf_redirect(ifindex, flags) } as i32)
}

/// Answers a UDP datagram to a backend-less frontend with an ICMP port-unreachable, sent
/// back where it came from.
#[inline(always)]
fn reject_udp(ctx: &TcContext, flow: &Flow, egress: bool) -> Result<i32, u32> {
    // Room between Ethernet and IPv4 for the new IPv4 + ICMP headers, then trim the quote.
    // SAFETY: helpers on this program's own skb.
    unsafe {
        if bpf_skb_adjust_room(ctx.skb.skb, reject::ICMP_ROOM as i32, BPF_ADJ_ROOM_MAC, 0) != 0 {
            return Err(drop_reason::REWRITE_FAILED);
        }
        if bpf_skb_change_tail(ctx.skb.skb, reject::ICMP_FRAME_LEN as u32, 0) != 0 {
            return Err(drop_reason::REWRITE_FAILED);
        }
    }
    ctx.pull_data(reject::ICMP_FRAME_LEN as u32).map_err(|_| drop_reason::REWRITE_FAILED)?;
    reject::write_icmp_unreachable(ctx, flow)?;
    // SAFETY: reads a field of this program's own skb.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let flags = if egress { BPF_F_INGRESS as u64 } else { 0 };
    // SAFETY: helper without pointer arguments.
    Ok(unsafe { bpf_redirect(ifindex, flags) } as i32)
}
