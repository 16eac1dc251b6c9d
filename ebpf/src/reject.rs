//! Rejecting a connection to a frontend without backends, never a silent drop: a TCP segment
//! is turned, in place, into a RST from the frontend back to the client; a UDP datagram into
//! an ICMP port-unreachable quoting it.

use skiff_ebpf_common::PROTO_TCP;

use crate::packet::{EthHdr, Flow, Ipv4Hdr, L3_OFF, Packet, ptr_at};

/// Ethernet + IPv4 (no options) + TCP (no options).
pub const RST_FRAME_LEN: usize = 14 + 40;

/// TCP header.
#[repr(C)]
struct TcpHdr {
    sport_be: u16,
    dport_be: u16,
    seq_be: u32,
    ack_be: u32,
    off_flags_be: u16,
    window_be: u16,
    csum: u16,
    urg_be: u16,
}

const TCP_FIN: u16 = 0x01;
const TCP_SYN: u16 = 0x02;
const TCP_RST: u16 = 0x04;
const TCP_ACK: u16 = 0x10;

/// Sequence numbers and flags of the RST answering the segment.
pub struct Rst {
    seq: u32,
    ack: u32,
    flags: u16,
}

/// What the RST must carry (RFC 793 reset generation); `None` for a segment that is itself
/// a RST (never answered).
#[inline(always)]
pub fn rst_numbers(p: &impl Packet, flow: &Flow) -> Result<Option<Rst>, u32> {
    let tcp: *mut TcpHdr = ptr_at(p, flow.l4_off)?;
    // SAFETY: bounds-checked by ptr_at; plain integer fields.
    let (seq, ack, off_flags) = unsafe {
        (
            u32::from_be((*tcp).seq_be),
            u32::from_be((*tcp).ack_be),
            u16::from_be((*tcp).off_flags_be),
        )
    };
    let flags = off_flags & 0x3f;
    if flags & TCP_RST != 0 {
        return Ok(None);
    }
    let doff = ((off_flags >> 12) as u32) * 4;
    let payload = (flow.ip_len as u32).saturating_sub(20 + doff);
    let consumed = payload + (flags & TCP_SYN != 0) as u32 + (flags & TCP_FIN != 0) as u32;
    Ok(Some(if flags & TCP_ACK != 0 {
        Rst { seq: ack, ack: 0, flags: TCP_RST }
    } else {
        Rst { seq: 0, ack: seq.wrapping_add(consumed), flags: TCP_RST | TCP_ACK }
    }))
}

/// Rewrites a buffer already trimmed to `RST_FRAME_LEN` into the RST (addresses, ports and
/// MACs swapped, both checksums computed in full).
#[inline(always)]
pub fn write_rst(p: &impl Packet, flow: &Flow, rst: &Rst) -> Result<(), u32> {
    let eth: *mut EthHdr = ptr_at(p, 0)?;
    let ip: *mut Ipv4Hdr = ptr_at(p, L3_OFF)?;
    let tcp: *mut TcpHdr = ptr_at(p, L3_OFF + 20)?;
    let ip_words: *mut [u16; 10] = ptr_at(p, L3_OFF)?;
    let tcp_words: *mut [u16; 10] = ptr_at(p, L3_OFF + 20)?;
    // SAFETY: all pointers bounds-checked above.
    unsafe {
        core::mem::swap(&mut (*eth).dst, &mut (*eth).src);
        (*ip).version_ihl = 0x45;
        (*ip).saddr_be = flow.daddr_be;
        (*ip).daddr_be = flow.saddr_be;
        (*ip).tot_len_be = 40u16.to_be();
        (*ip).ttl = 64;
        (*ip).frag_be = 0;
        (*ip).csum = 0;
        (*tcp).sport_be = flow.dport_be;
        (*tcp).dport_be = flow.sport_be;
        (*tcp).seq_be = rst.seq.to_be();
        (*tcp).ack_be = rst.ack.to_be();
        (*tcp).off_flags_be = ((5u16 << 12) | rst.flags).to_be();
        (*tcp).window_be = 0;
        (*tcp).urg_be = 0;
        (*tcp).csum = 0;
        let mut s: u32 = 0;
        for w in (*ip_words).iter() {
            s += *w as u32;
        }
        (*ip).csum = !fold(s);
        // Pseudo header: saddr, daddr, zero+proto, TCP length (20).
        let sa = flow.daddr_be;
        let da = flow.saddr_be;
        let mut t: u32 = (sa & 0xffff) + (sa >> 16) + (da & 0xffff) + (da >> 16);
        t += (PROTO_TCP as u16).to_be() as u32 + 20u16.to_be() as u32;
        for w in (*tcp_words).iter() {
            t += *w as u32;
        }
        (*tcp).csum = !fold(t);
    }
    Ok(())
}

/// Ethernet + IPv4 + ICMP (8) + quoted IPv4 header (20) + quoted 8 bytes of L4.
pub const ICMP_FRAME_LEN: usize = 14 + 20 + 8 + 20 + 8;
/// Bytes to insert between Ethernet and the original IPv4 header for the ICMP reply.
pub const ICMP_ROOM: usize = 28;

/// Writes an ICMP port-unreachable into a buffer laid out as
/// `[Ethernet 14][room 28][original IPv4 20][original L4 >= 8]` and trimmed to
/// `ICMP_FRAME_LEN`: the new IPv4 and ICMP headers fill the room, the original headers
/// stay as the quote.
#[inline(always)]
pub fn write_icmp_unreachable(p: &impl Packet, flow: &Flow) -> Result<(), u32> {
    let eth: *mut EthHdr = ptr_at(p, 0)?;
    let ip: *mut Ipv4Hdr = ptr_at(p, L3_OFF)?;
    let icmp: *mut [u16; 4] = ptr_at(p, L3_OFF + 20)?;
    let ip_words: *mut [u16; 10] = ptr_at(p, L3_OFF)?;
    let icmp_words: *mut [u16; 18] = ptr_at(p, L3_OFF + 20)?;
    // SAFETY: all pointers bounds-checked above.
    unsafe {
        core::mem::swap(&mut (*eth).dst, &mut (*eth).src);
        (*eth).proto_be = 0x0800u16.to_be();
        (*ip).version_ihl = 0x45;
        (*ip).tos = 0;
        (*ip).tot_len_be = ((ICMP_FRAME_LEN - 14) as u16).to_be();
        (*ip).id_be = 0;
        (*ip).frag_be = 0;
        (*ip).ttl = 64;
        (*ip).proto = 1;
        (*ip).csum = 0;
        (*ip).saddr_be = flow.daddr_be;
        (*ip).daddr_be = flow.saddr_be;
        // type 3 (destination unreachable), code 3 (port unreachable), checksum, unused.
        (*icmp) = [u16::from_ne_bytes([3, 3]), 0, 0, 0];
        let mut s: u32 = 0;
        for w in (*ip_words).iter() {
            s += *w as u32;
        }
        (*ip).csum = !fold(s);
        let mut t: u32 = 0;
        for w in (*icmp_words).iter() {
            t += *w as u32;
        }
        (*icmp)[1] = !fold(t);
    }
    Ok(())
}

#[inline(always)]
fn fold(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}
