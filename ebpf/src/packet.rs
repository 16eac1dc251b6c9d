//! Packet access and parsing shared by the tc and XDP programs: bounds-checked `ptr_at`,
//! Ethernet/IPv4/TCP/UDP parsing into a `Flow`, and incremental checksum arithmetic.

use core::ffi::c_void;
use core::mem::{size_of, zeroed};

use aya_ebpf::bindings::bpf_fib_lookup;
use aya_ebpf::helpers::{bpf_fib_lookup as fib_lookup, bpf_redirect};
use aya_ebpf::programs::{TcContext, XdpContext};
use skiff_ebpf_common::{PROTO_IPIP, PROTO_TCP, PROTO_UDP, drop_reason};

/// Ethernet header length.
pub const ETH_LEN: usize = 14;
/// Offset of the IPv4 header (right after Ethernet).
pub const L3_OFF: usize = ETH_LEN;
/// Offset of the IPv4 source address.
pub const IP_SRC_OFF: usize = L3_OFF + 12;
/// Offset of the IPv4 destination address.
pub const IP_DST_OFF: usize = L3_OFF + 16;
const ETH_P_IP: u16 = 0x0800;

/// Ethernet header.
#[repr(C)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub proto_be: u16,
}

/// IPv4 header without options.
#[repr(C)]
pub struct Ipv4Hdr {
    pub version_ihl: u8,
    pub tos: u8,
    pub tot_len_be: u16,
    pub id_be: u16,
    pub frag_be: u16,
    pub ttl: u8,
    pub proto: u8,
    pub csum: u16,
    pub saddr_be: u32,
    pub daddr_be: u32,
}

/// The first four bytes of TCP and UDP.
#[repr(C)]
pub struct Ports {
    pub sport_be: u16,
    pub dport_be: u16,
}

/// A packet buffer with direct access (tc or XDP).
pub trait Packet {
    /// First byte of the directly accessible (linear) data.
    fn start(&self) -> usize;
    /// End of the directly accessible data.
    fn end(&self) -> usize;
    /// Length of the whole packet on the wire (for tc, including non-linear parts).
    fn wire_len(&self) -> usize;
}

impl Packet for TcContext {
    #[inline(always)]
    fn start(&self) -> usize {
        self.data()
    }
    #[inline(always)]
    fn end(&self) -> usize {
        self.data_end()
    }
    #[inline(always)]
    fn wire_len(&self) -> usize {
        self.len() as usize
    }
}

impl Packet for XdpContext {
    #[inline(always)]
    fn start(&self) -> usize {
        self.data()
    }
    #[inline(always)]
    fn end(&self) -> usize {
        self.data_end()
    }
    #[inline(always)]
    fn wire_len(&self) -> usize {
        self.data_end() - self.data()
    }
}

/// A pointer to a `T` at `off`, or `TRUNCATED` when the packet is too short.
#[inline(always)]
pub fn ptr_at<T>(p: &impl Packet, off: usize) -> Result<*mut T, u32> {
    let start = p.start();
    if start + off + size_of::<T>() > p.end() {
        return Err(drop_reason::TRUNCATED);
    }
    Ok((start + off) as *mut T)
}

/// A TCP or UDP IPv4 flow as parsed from a packet.
#[derive(Clone, Copy)]
pub struct Flow {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// Offset of the L4 header.
    pub l4_off: usize,
    /// Offset of the L4 checksum.
    pub csum_off: usize,
    /// 0, or the drop reason to apply if this packet turns out to be service traffic
    /// (IP options, first fragment): such packets are never translated.
    pub irregular: u32,
    /// IPv4 total length.
    pub ip_len: u16,
}

/// What the parser found.
pub enum Parsed {
    /// Not an IPv4 frame (ARP, IPv6): passed untouched, counted.
    NotIpv4,
    /// IPv4 but no ports to translate (other protocols, non-first fragments).
    NoPorts,
    /// A TCP/UDP flow.
    Flow(Flow),
}

/// Parses Ethernet + IPv4 + the L4 ports; malformed headers are errors (drop reasons).
#[inline(always)]
pub fn parse(p: &impl Packet) -> Result<Parsed, u32> {
    let eth: *mut EthHdr = ptr_at(p, 0)?;
    // SAFETY: ptr_at checked the bounds.
    if u16::from_be(unsafe { (*eth).proto_be }) != ETH_P_IP {
        return Ok(Parsed::NotIpv4);
    }
    let ip: *mut Ipv4Hdr = ptr_at(p, L3_OFF)?;
    // SAFETY: ptr_at checked the bounds.
    let (vihl, tot_len, frag, proto, saddr_be, daddr_be) = unsafe {
        (
            (*ip).version_ihl,
            u16::from_be((*ip).tot_len_be),
            u16::from_be((*ip).frag_be),
            (*ip).proto,
            (*ip).saddr_be,
            (*ip).daddr_be,
        )
    };
    if vihl >> 4 != 4 {
        return Err(drop_reason::BAD_VERSION);
    }
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if ihl < size_of::<Ipv4Hdr>() {
        return Err(drop_reason::BAD_LENGTH);
    }
    let wire_len = p.wire_len().saturating_sub(L3_OFF);
    if (tot_len as usize) < ihl || tot_len as usize > wire_len {
        return Err(drop_reason::BAD_LENGTH);
    }
    let (l4_len, csum_in_l4) = match proto {
        PROTO_TCP => (20usize, 16usize),
        PROTO_UDP => (8usize, 6usize),
        _ => return Ok(Parsed::NoPorts),
    };
    if frag & 0x1fff != 0 {
        return Ok(Parsed::NoPorts);
    }
    let mut irregular = 0;
    if frag & 0x2000 != 0 {
        irregular = drop_reason::FRAGMENT;
    }
    if ihl != size_of::<Ipv4Hdr>() {
        irregular = drop_reason::IP_OPTIONS;
    }
    let l4_off = L3_OFF + ihl;
    if (tot_len as usize) < ihl + l4_len {
        return Err(drop_reason::BAD_LENGTH);
    }
    // The whole fixed L4 header must be present (ports and checksum).
    let _: *mut [u8; 8] = ptr_at(p, l4_off)?;
    if proto == PROTO_TCP {
        let _: *mut [u8; 20] = ptr_at(p, l4_off)?;
    }
    let ports: *mut Ports = ptr_at(p, l4_off)?;
    // SAFETY: ptr_at checked the bounds.
    let (sport_be, dport_be) = unsafe { ((*ports).sport_be, (*ports).dport_be) };
    Ok(Parsed::Flow(Flow {
        saddr_be,
        daddr_be,
        sport_be,
        dport_be,
        proto,
        l4_off,
        csum_off: l4_off + csum_in_l4,
        irregular,
        ip_len: tot_len,
    }))
}

#[inline(always)]
fn fold(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// RFC 1624 incremental update of a checksum for a 32-bit field change. All values are the
/// raw memory representation (network order read as native), consistently.
#[inline(always)]
pub fn csum_replace4(csum: u16, old: u32, new: u32) -> u16 {
    let mut s = (!csum) as u32;
    s += (!old & 0xffff) + (!old >> 16);
    s += (new & 0xffff) + (new >> 16);
    !fold(s)
}

/// RFC 1624 incremental update for a 16-bit field change.
#[inline(always)]
pub fn csum_replace2(csum: u16, old: u16, new: u16) -> u16 {
    let s = (!csum) as u32 + (!old) as u32 + new as u32;
    !fold(s)
}

/// Length of the outer IPv4 header of the DSR encapsulation.
pub const IPIP_LEN: usize = 20;

/// The outer IPv4 header wrapping a DSR flow's (already DNATed) packet for the backend's
/// node `next_hop_be`: source = the frontend address (`flow`'s original destination), id =
/// the frontend port; the inner packet's TOS and don't-fragment bit (`tos`, `frag_be`)
/// and its total length `inner_len`.
#[inline(always)]
pub fn dsr_outer_header(
    flow: &Flow,
    tos: u8,
    inner_len: u16,
    frag_be: u16,
    next_hop_be: u32,
) -> Ipv4Hdr {
    let mut hdr = Ipv4Hdr {
        version_ihl: 0x45,
        tos,
        tot_len_be: (inner_len + IPIP_LEN as u16).to_be(),
        id_be: flow.dport_be,
        frag_be: frag_be & 0x4000u16.to_be(),
        ttl: 64,
        proto: PROTO_IPIP,
        csum: 0,
        saddr_be: flow.daddr_be,
        daddr_be: next_hop_be,
    };
    hdr.csum = ipv4_csum(&hdr);
    hdr
}

/// The header checksum of an IPv4 header without options (its `csum` field zero).
#[inline(always)]
fn ipv4_csum(h: &Ipv4Hdr) -> u16 {
    // SAFETY: Ipv4Hdr is 20 bytes of plain integers, read as ten u16 words.
    let words: &[u16; 10] = unsafe { &*(h as *const Ipv4Hdr as *const [u16; 10]) };
    let mut s: u32 = 0;
    for w in words {
        s += *w as u32;
    }
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// The frontend a DSR outer header names, if the IPv4 header at `L3_OFF` is one addressed
/// to `node_ip_be`: `(frontend address, frontend port)`, both network order.
#[inline(always)]
pub fn dsr_outer(p: &impl Packet, node_ip_be: u32) -> Result<Option<(u32, u16)>, u32> {
    let outer: *mut Ipv4Hdr = ptr_at(p, L3_OFF)?;
    // SAFETY: bounds-checked just above.
    let (vihl, proto, saddr_be, id_be, daddr_be) = unsafe {
        ((*outer).version_ihl, (*outer).proto, (*outer).saddr_be, (*outer).id_be, (*outer).daddr_be)
    };
    if proto != PROTO_IPIP || vihl != 0x45 || node_ip_be == 0 || daddr_be != node_ip_be {
        return Ok(None);
    }
    Ok(Some((saddr_be, id_be)))
}

const AF_INET: u8 = 2;

/// The FIB's route for `src_be → dst_be` arriving on `ifindex`: the helper's return code
/// and the parameter block it filled in (next hop, MACs, egress interface).
#[inline(always)]
pub fn fib_route(
    ctx: *mut c_void,
    ifindex: u32,
    src_be: u32,
    dst_be: u32,
) -> (i64, bpf_fib_lookup) {
    // SAFETY: an all-zero bpf_fib_lookup is a valid (empty) parameter block.
    let mut params: bpf_fib_lookup = unsafe { zeroed() };
    params.family = AF_INET;
    params.__bindgen_anon_3.ipv4_src = src_be;
    params.__bindgen_anon_4.ipv4_dst = dst_be;
    params.ifindex = ifindex;
    // SAFETY: params lives on the stack for the call and its size is passed.
    let rc = unsafe {
        fib_lookup(ctx, &mut params as *mut bpf_fib_lookup, size_of::<bpf_fib_lookup>() as i32, 0)
    };
    (rc, params)
}

/// Sets the Ethernet addresses the FIB resolved and redirects to its egress interface.
#[inline(always)]
pub fn redirect_to_next_hop(p: &impl Packet, params: &bpf_fib_lookup) -> Result<i64, u32> {
    let eth: *mut EthHdr = ptr_at(p, 0)?;
    // SAFETY: bounds-checked above.
    unsafe {
        (*eth).dst = params.dmac;
        (*eth).src = params.smac;
    }
    // SAFETY: helper without pointer arguments.
    Ok(unsafe { bpf_redirect(params.ifindex, 0) })
}
