//! BPF_PROG_TEST_RUN on crafted packets: the tc and XDP programs' verdicts, rewritten
//! addresses and ports, checksums, conntrack/counter map state, and malformed input.

mod common;

use std::net::Ipv4Addr;

use common::*;
use skiff_ebpf_common::{PROTO_TCP, PROTO_UDP, ct_dir, drop_reason, svc_flags};
use skiff_proxy::loader::{Dataplane, LoadOptions, NodePortMode};
use skiff_proxy::maps::ServiceMaps;

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 5);
const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);

struct Rig {
    dp: Dataplane,
    maps: ServiceMaps,
    _bpffs: BpffsDir,
}

fn rig() -> Rig {
    rig_with(&LoadOptions::default())
}

fn rig_with(options: &LoadOptions) -> Rig {
    let bpffs = BpffsDir::new();
    let dp = Dataplane::load_with(&bpffs.path(), NODE, options).expect("load the eBPF object");
    let maps = ServiceMaps::open_pinned(&bpffs.path()).expect("open pinned maps");
    Rig { dp, maps, _bpffs: bpffs }
}

impl Rig {
    fn tc(&mut self, pkt: &[u8]) -> (u32, Vec<u8>) {
        test_run(self.dp.tc_program().expect("tc program loads (verifier)"), "tc", pkt)
    }

    fn xdp(&mut self, pkt: &[u8]) -> (u32, Vec<u8>) {
        test_run(self.dp.xdp_program().expect("xdp program loads (verifier)"), "xdp", pkt)
    }

    /// The backend's SYN-ACK (carrying `payload`) to `CLIENT:client_port` through tc on its
    /// way out: passed, and the packet as rewritten.
    fn tc_reply(&mut self, client_port: u16, payload: Vec<u8>) -> Parsed {
        let mut reply = Pkt::tcp(BACKEND, 8080, CLIENT, client_port);
        reply.tcp_flags = 0x12;
        reply.payload = payload;
        let (rc, out) = self.tc(&reply.build());
        assert_eq!(rc, TC_ACT_OK);
        parse_and_verify(&out)
    }

    fn drops(&self, reason: u32) -> u64 {
        self.maps.drop_count(reason).unwrap()
    }

    fn one_service(&mut self, proto: u8) {
        put_service(&mut self.maps, VIP, 80, proto, CLUSTER_IP, 7, &[(11, BACKEND, 8080, false)]);
    }
}

#[test]
fn tc_dnat_tcp_rewrites_destination_and_records_conntrack() {
    let mut r = rig();
    r.one_service(PROTO_TCP);
    let (rc, out) = r.tc(&Pkt::tcp(CLIENT, 40000, VIP, 80).build());
    assert_eq!(rc, TC_ACT_OK);
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport), (CLIENT, 40000), "source untouched");
    assert_eq!((p.dst, p.dport), (BACKEND, 8080), "destination DNATed to the backend");
    let ct = r.maps.conntrack().unwrap();
    assert_eq!(ct.len(), 2, "forward and reply entries: {ct:?}");
    let fwd = ct.iter().find(|(k, _)| k.dir == ct_dir::FORWARD).expect("forward entry");
    assert_eq!(fwd.1.backend_id, 11);
    let rep = ct.iter().find(|(k, _)| k.dir == ct_dir::REPLY).expect("reply entry");
    assert_eq!(rep.0.saddr_be, be32(BACKEND));
    assert_eq!(rep.0.daddr_be, be32(CLIENT));
    assert_eq!(rep.1.nat_addr_be, be32(VIP));
    let mut flows = skiff_proxy::maps::FlowReader::open_pinned(&r._bpffs.path()).unwrap();
    let ev = flows.next_event().expect("a new-flow event");
    assert_eq!(
        (ev.client_addr_be, ev.frontend_addr_be, ev.backend_addr_be),
        (be32(CLIENT), be32(VIP), be32(BACKEND))
    );
    assert_eq!((u16::from_be(ev.frontend_port_be), u16::from_be(ev.backend_port_be)), (80, 8080));
    assert_eq!((ev.backend_id, ev.rev_nat_id, ev.path), (11, 7, skiff_ebpf_common::flow_path::TC));
    assert!(flows.next_event().is_none(), "one event per new flow");
    let stats = r.maps.service_stats().unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].0, stats[0].1.packets, stats[0].1.new_conns), (7, 1, 1));
    let be = r.maps.backend_stats().unwrap();
    assert_eq!((be[0].0, be[0].1.new_conns), (11, 1));

    // The second packet of the flow follows conntrack (not a new connection).
    let mut ack = Pkt::tcp(CLIENT, 40000, VIP, 80);
    ack.tcp_flags = 0x10;
    ack.payload = b"GET / HTTP/1.0\r\n\r\n".to_vec();
    let (rc, out) = r.tc(&ack.build());
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(parse_and_verify(&out).dst, BACKEND);
    let stats = r.maps.service_stats().unwrap();
    assert_eq!((stats[0].1.packets, stats[0].1.new_conns), (2, 1));
    assert!(flows.next_event().is_none(), "no event for an established flow");
}

#[test]
fn tc_reverse_nat_restores_the_frontend_on_replies() {
    let mut r = rig();
    r.one_service(PROTO_TCP);
    let (rc, _) = r.tc(&Pkt::tcp(CLIENT, 40001, VIP, 80).build());
    assert_eq!(rc, TC_ACT_OK);
    let p = r.tc_reply(40001, vec![7; 33]);
    assert_eq!((p.src, p.sport), (VIP, 80), "reply source restored to the VIP");
    assert_eq!((p.dst, p.dport), (CLIENT, 40001));
}

#[test]
fn tc_dnat_udp_with_and_without_checksum() {
    let mut r = rig();
    r.one_service(PROTO_UDP);
    let (rc, out) = r.tc(&Pkt::udp(CLIENT, 5353, VIP, 80).build());
    assert_eq!(rc, TC_ACT_OK);
    let p = parse_and_verify(&out);
    assert_eq!((p.dst, p.dport, p.proto), (BACKEND, 8080, PROTO_UDP));

    let mut zero = Pkt::udp(CLIENT, 5354, VIP, 80);
    zero.udp_zero_csum = true;
    let (rc, out) = r.tc(&zero.build());
    assert_eq!(rc, TC_ACT_OK);
    let p = parse_and_verify(&out);
    assert_eq!((p.dst, p.dport), (BACKEND, 8080));
    assert_eq!(&out[14 + 20 + 6..14 + 20 + 8], &[0, 0], "a zero UDP checksum stays zero");
}

/// The tc program updates L4 checksums itself when the loader found `sk_buff.ip_summed` in
/// the kernel's BTF (test_run skbs are CHECKSUM_NONE: full checksums); the result must be
/// byte for byte what the kernel helpers produce, both directions, TCP and UDP (with and
/// without a checksum).
#[test]
fn tc_direct_checksums_equal_the_kernel_helpers() {
    let packets = |proto: u8, sport: u16| -> (Vec<u8>, Vec<u8>) {
        let (mut fwd, mut rep) = if proto == PROTO_TCP {
            (Pkt::tcp(CLIENT, sport, VIP, 80), Pkt::tcp(BACKEND, 8080, CLIENT, sport))
        } else {
            (Pkt::udp(CLIENT, sport, VIP, 80), Pkt::udp(BACKEND, 8080, CLIENT, sport))
        };
        fwd.payload = b"odd-length payload!".to_vec();
        rep.payload = vec![0xa5; 33];
        (fwd.build(), rep.build())
    };
    let mut direct = rig();
    let mut helpers = rig_with(&LoadOptions::default().checksum_helpers_only(true));
    for (proto, sport, zero_udp) in
        [(PROTO_TCP, 41000, false), (PROTO_UDP, 41001, false), (PROTO_UDP, 41002, true)]
    {
        direct.one_service(proto);
        helpers.one_service(proto);
        let (mut fwd, rep) = packets(proto, sport);
        if zero_udp {
            fwd[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
        }
        let (rc_d, out_d) = direct.tc(&fwd);
        let (rc_h, out_h) = helpers.tc(&fwd);
        assert_eq!((rc_d, rc_h), (TC_ACT_OK, TC_ACT_OK));
        assert_eq!(out_d, out_h, "forward {proto}/{sport}: direct and helper rewrites differ");
        let p = parse_and_verify(&out_d);
        assert_eq!((p.dst, p.dport), (BACKEND, 8080));
        if zero_udp {
            assert_eq!(&out_d[14 + 20 + 6..14 + 20 + 8], &[0, 0], "no UDP checksum stays none");
        }
        let (_, rep_d) = direct.tc(&rep);
        let (_, rep_h) = helpers.tc(&rep);
        assert_eq!(rep_d, rep_h, "reply {proto}/{sport}: direct and helper rewrites differ");
        let p = parse_and_verify(&rep_d);
        assert_eq!((p.src, p.sport), (VIP, 80));
    }
}

/// Counters of ids beyond the per-CPU arrays spill into the hash map and still add up per
/// service and per backend; removing a frontend or backend clears its counters (the id is
/// reused later), in the arrays and in the spill map.
#[test]
fn counters_spill_beyond_the_arrays_and_removal_clears_them() {
    // Arrays of 4 entries: rev-nat 7 and backend 11 spill, rev-nat 2 and backend 3 do not.
    let mut r = rig_with(&LoadOptions::default().stats_entries(4, 4));
    r.one_service(PROTO_TCP);
    let vip2 = Ipv4Addr::new(10, 96, 0, 11);
    let be2 = Ipv4Addr::new(10, 0, 1, 6);
    put_service(&mut r.maps, vip2, 80, PROTO_TCP, CLUSTER_IP, 2, &[(3, be2, 8080, false)]);
    for (vip, sport) in [(VIP, 42000), (VIP, 42000), (vip2, 42001), (vip2, 42001), (vip2, 42001)] {
        let (rc, _) = r.tc(&Pkt::tcp(CLIENT, sport, vip, 80).build());
        assert_eq!(rc, TC_ACT_OK);
    }
    let svc = r.maps.service_stats().unwrap();
    let pkts: Vec<(u32, u64, u64)> =
        svc.iter().map(|(i, c)| (*i, c.packets, c.new_conns)).collect();
    assert_eq!(pkts, vec![(2, 3, 1), (7, 2, 1)], "per-service counters");
    let be = r.maps.backend_stats().unwrap();
    let pkts: Vec<(u32, u64, u64)> = be.iter().map(|(i, c)| (*i, c.packets, c.new_conns)).collect();
    assert_eq!(pkts, vec![(3, 3, 1), (11, 2, 1)], "per-backend counters");

    r.maps.remove_rev_nat(7).unwrap();
    r.maps.remove_backend(11).unwrap();
    r.maps.remove_rev_nat(2).unwrap();
    assert!(r.maps.service_stats().unwrap().is_empty(), "frontend counters cleared");
    let be: Vec<u32> = r.maps.backend_stats().unwrap().iter().map(|(i, _)| *i).collect();
    assert_eq!(be, vec![3], "only the removed backend's counters cleared");
    r.maps.remove_backend(3).unwrap();
    assert!(r.maps.backend_stats().unwrap().is_empty());
}

#[test]
fn tc_passes_traffic_that_is_not_for_a_service() {
    let mut r = rig();
    r.one_service(PROTO_TCP);
    let pkt = Pkt::tcp(CLIENT, 40000, Ipv4Addr::new(10, 0, 9, 9), 80).build();
    let (rc, out) = r.tc(&pkt);
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(out, pkt, "unrelated packet unchanged");
    // Same VIP, other port: not a frontend.
    let pkt = Pkt::tcp(CLIENT, 40000, VIP, 81).build();
    assert_eq!(r.tc(&pkt), (TC_ACT_OK, pkt));
    assert!(r.maps.conntrack().unwrap().is_empty());
}

#[test]
fn tc_service_without_backends_rejects_tcp_with_rst_and_udp_with_icmp() {
    let mut r = rig();
    put_service(&mut r.maps, VIP, 80, PROTO_TCP, CLUSTER_IP, 7, &[]);
    let mut syn = Pkt::tcp(CLIENT, 40000, VIP, 80);
    syn.payload = vec![9; 5];
    let (rc, out) = r.tc(&syn.build());
    assert_eq!(rc, TC_ACT_REDIRECT, "RST sent back out of the interface");
    assert_eq!(out.len(), 14 + 40);
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (VIP, 80, CLIENT, 40000));
    assert_eq!(p.tcp_flags, 0x14, "RST|ACK");
    assert_eq!(p.ack, 1000 + 5 + 1);
    assert_eq!(&out[0..6], &[0x02, 0, 0, 0, 0, 1], "MACs swapped");
    assert_eq!(r.drops(drop_reason::NO_BACKEND), 1);

    put_service(&mut r.maps, VIP, 53, PROTO_UDP, CLUSTER_IP, 8, &[]);
    let mut dgram = Pkt::udp(CLIENT, 5000, VIP, 53);
    dgram.payload = vec![7; 100];
    let (rc, out) = r.tc(&dgram.build());
    assert_eq!(rc, TC_ACT_REDIRECT, "ICMP sent back out of the interface");
    assert_icmp_port_unreachable(&out, VIP, CLIENT, 5000, 53);
    assert_eq!(r.drops(drop_reason::NO_BACKEND), 2);
}

#[test]
fn tc_malformed_packets_are_dropped_with_counted_reasons() {
    let mut r = rig();
    r.one_service(PROTO_TCP);
    let good = Pkt::tcp(CLIENT, 40000, VIP, 80);

    // (A buffer shorter than an IPv4 header is refused by the kernel's skb test_run itself;
    // the XDP test covers the TRUNCATED reason.)
    let pkt = good.build();

    // Truncated TCP header (IP total length still claims it).
    let mut short = pkt.clone();
    short.truncate(14 + 20 + 10);
    assert_eq!(r.tc(&short).0, TC_ACT_SHOT);
    assert_eq!(r.drops(drop_reason::BAD_LENGTH), 1, "total length beyond the buffer");

    // IP options on service traffic.
    let mut opts = good.clone();
    opts.ip_options = 4;
    assert_eq!(r.tc(&opts.build()).0, TC_ACT_SHOT);
    assert_eq!(r.drops(drop_reason::IP_OPTIONS), 1);

    // First fragment (MF set) of service traffic.
    let mut frag = good.clone();
    frag.frag = 0x2000;
    assert_eq!(r.tc(&frag.build()).0, TC_ACT_SHOT);
    assert_eq!(r.drops(drop_reason::FRAGMENT), 1);

    // Total length smaller than the headers.
    let mut bad = pkt.clone();
    bad[14 + 2..14 + 4].copy_from_slice(&10u16.to_be_bytes());
    assert_eq!(r.tc(&bad).0, TC_ACT_SHOT);
    assert_eq!(r.drops(drop_reason::BAD_LENGTH), 2);

    // IPv4 ethertype with a version-6 header.
    let mut v6 = pkt.clone();
    v6[14] = 0x65;
    assert_eq!(r.tc(&v6).0, TC_ACT_SHOT);
    assert_eq!(r.drops(drop_reason::BAD_VERSION), 1);

    // Not IPv4 at all (ARP): passed untouched, counted.
    let mut arp = pkt.clone();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(r.tc(&arp), (TC_ACT_OK, arp.clone()));
    assert_eq!(r.drops(drop_reason::NON_IPV4), 1);

    assert!(r.maps.conntrack().unwrap().is_empty(), "no malformed packet created a flow");
}

fn nodeport(r: &mut Rig, local: bool) {
    put_service(
        &mut r.maps,
        Ipv4Addr::UNSPECIFIED,
        30080,
        PROTO_TCP,
        svc_flags::NODE_PORT,
        9,
        &[(21, BACKEND, 8080, local)],
    );
}

#[test]
fn xdp_nodeport_to_local_backend_is_dnated_and_passed() {
    let mut r = rig();
    nodeport(&mut r, true);
    let (rc, out) = r.xdp(&Pkt::tcp(CLIENT, 50000, NODE, 30080).build());
    assert_eq!(rc, XDP_PASS, "drops: {:?}", r.maps.drops().unwrap());
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport), (CLIENT, 50000), "client IP kept for local backends");
    assert_eq!((p.dst, p.dport), (BACKEND, 8080));
    // The reply (seen by tc on the way out) is reverse-translated to node:nodeport.
    let p = r.tc_reply(50000, Vec::new());
    assert_eq!((p.src, p.sport), (NODE, 30080));
}

#[test]
fn xdp_nodeport_to_remote_backend_is_snated_to_the_node() {
    let mut r = rig();
    nodeport(&mut r, false);
    let (rc, out) = r.xdp(&Pkt::tcp(CLIENT, 50001, NODE, 30080).build());
    assert!(rc == XDP_PASS || rc == XDP_REDIRECT, "forwarded, got {rc}");
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport), (NODE, 50001), "SNAT to the node address");
    assert_eq!((p.dst, p.dport), (BACKEND, 8080));
    // The backend's reply arrives at the node and goes back to the client from node:nodeport.
    let mut reply = Pkt::tcp(BACKEND, 8080, NODE, 50001);
    reply.tcp_flags = 0x12;
    let (rc, out) = r.xdp(&reply.build());
    assert!(rc == XDP_PASS || rc == XDP_REDIRECT, "forwarded, got {rc}");
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport), (NODE, 30080));
    assert_eq!((p.dst, p.dport), (CLIENT, 50001));
}

/// A namespace whose FIB routes the backends (10.0.1.0/24) via 10.99.0.2 on a veth, with a
/// permanent neighbour entry: XDP test runs inside it get a deterministic next hop (nothing
/// is sent: BPF_PROG_TEST_RUN only returns the verdict).
fn dsr_fib_netns() -> common::netns::Netns {
    let ns = common::netns::Netns::new(format!("skf-dsr-{}", std::process::id()));
    ns.ip(&["link", "set", "lo", "up"]);
    ns.ip(&["link", "add", "v0", "address", "02:00:00:00:00:10", "type", "veth", "peer", "v1"]);
    ns.ip(&["addr", "add", "10.99.0.1/24", "dev", "v0"]);
    ns.ip(&["link", "set", "v0", "up"]);
    ns.ip(&["link", "set", "v1", "up"]);
    ns.ip(&["route", "add", "10.0.1.0/24", "via", "10.99.0.2"]);
    ns.ip(&[
        "neigh",
        "add",
        "10.99.0.2",
        "lladdr",
        "02:00:00:00:00:99",
        "dev",
        "v0",
        "nud",
        "permanent",
    ]);
    ns.nsenter(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
    ns
}

/// Asserts that `out` is `inner` (Ethernet + IPv4 frame of `inner_len` IPv4 bytes from
/// CLIENT:sport, DNATed to BACKEND:8080) wrapped for DSR to 10.99.0.2 from NODE:30080.
fn assert_dsr_wrapped(out: &[u8], inner_len: usize, sport: u16) {
    assert_eq!(out.len(), 14 + 20 + inner_len, "20 bytes of outer header");
    assert_eq!(&out[0..6], &[2, 0, 0, 0, 0, 0x99], "next hop's MAC");
    assert_eq!(&out[6..12], &[2, 0, 0, 0, 0, 0x10], "egress interface's MAC");
    let outer = &out[14..34];
    assert_eq!(checksum(outer, 0), 0, "outer IPv4 checksum");
    assert_eq!(outer[9], 4, "IPIP");
    assert_eq!(u16::from_be_bytes([outer[2], outer[3]]) as usize, 20 + inner_len);
    assert_eq!(&outer[12..16], &NODE.octets(), "outer source: the frontend address");
    assert_eq!(&outer[16..20], &[10, 99, 0, 2], "outer destination: the backend's node");
    assert_eq!(u16::from_be_bytes([outer[4], outer[5]]), 30080, "outer id: frontend port");
    let mut inner = out[..14].to_vec();
    inner.extend_from_slice(&out[34..]);
    let p = parse_and_verify(&inner);
    assert_eq!((p.src, p.sport), (CLIENT, sport), "no SNAT: the client address is kept");
    assert_eq!((p.dst, p.dport), (BACKEND, 8080));
}

/// DSR on the frontend's node: a NodePort flow to a remote backend is DNATed (client
/// address kept) and wrapped in IPIP to the backend's node (the FIB's next hop), outer
/// source = the frontend address, outer id = the frontend port; no REPLY entry here. By
/// XDP and by the tc fallback alike.
#[test]
fn dsr_wraps_remote_backend_flows_in_ipip_to_the_next_hop() {
    let ns = dsr_fib_netns();
    for xdp in [true, false] {
        let mut r = rig_with(&LoadOptions::default().nodeport_mode(NodePortMode::Dsr));
        nodeport(&mut r, false);
        let sport = if xdp { 50010 } else { 50011 };
        let mut syn = Pkt::tcp(CLIENT, sport, NODE, 30080);
        syn.payload = b"dsr!".to_vec();
        let inner_len = syn.build().len() - 14;
        for round in 0..2 {
            let (rc, out) = common::netns::in_netns(&ns, || {
                if xdp { r.xdp(&syn.build()) } else { r.tc(&syn.build()) }
            });
            let want = if xdp { XDP_REDIRECT } else { TC_ACT_REDIRECT };
            assert_eq!(rc, want, "xdp={xdp} round {round}: drops {:?}", r.maps.drops().unwrap());
            assert_dsr_wrapped(&out, inner_len, sport);
        }
        let ct = r.maps.conntrack().unwrap();
        assert_eq!(ct.len(), 1, "only the FORWARD entry: replies do not come back: {ct:?}");
        assert_eq!(ct[0].0.dir, ct_dir::FORWARD);
        assert_eq!(ct[0].1.flags, skiff_ebpf_common::ct_flags::DSR);
        let stats = r.maps.service_stats().unwrap();
        assert_eq!((stats[0].0, stats[0].1.packets, stats[0].1.new_conns), (9, 2, 1));
    }
}

/// DSR on the backend's node: the IPIP packet addressed to it is unwrapped and passed on;
/// the backend's reply then leaves with the frontend (outer source:id) as its source. Not
/// in DSR mode, or not addressed to this node, an IPIP packet passes untouched.
#[test]
fn dsr_unwraps_on_the_backends_node_and_tc_rewrites_the_reply() {
    let frontend = Ipv4Addr::new(192, 168, 77, 9);
    let wrap = |outer_dst: Ipv4Addr| -> Vec<u8> {
        let mut inner = Pkt::tcp(CLIENT, 50020, BACKEND, 8080);
        inner.payload = b"hello backend".to_vec();
        let inner = inner.build();
        let mut outer = vec![0u8; 20];
        outer[0] = 0x45;
        let tot = (20 + inner.len() - 14) as u16;
        outer[2..4].copy_from_slice(&tot.to_be_bytes());
        outer[4..6].copy_from_slice(&30080u16.to_be_bytes());
        outer[8] = 64;
        outer[9] = 4;
        outer[12..16].copy_from_slice(&frontend.octets());
        outer[16..20].copy_from_slice(&outer_dst.octets());
        let c = checksum(&outer, 0);
        outer[10..12].copy_from_slice(&c.to_be_bytes());
        let mut p = inner[..14].to_vec();
        p.extend_from_slice(&outer);
        p.extend_from_slice(&inner[14..]);
        p
    };
    // Not in DSR mode: untouched.
    let mut snat = rig();
    let pkt = wrap(NODE);
    assert_eq!(snat.xdp(&pkt), (XDP_PASS, pkt.clone()));
    assert_eq!(snat.tc(&pkt), (TC_ACT_OK, pkt.clone()));
    assert!(snat.maps.conntrack().unwrap().is_empty());

    // The tc fallback (ingress) unwraps the same way.
    let mut tc = rig_with(&LoadOptions::default().nodeport_mode(NodePortMode::Dsr));
    let (rc, out) = tc.tc(&pkt);
    assert_eq!(rc, TC_ACT_OK, "drops {:?}", tc.maps.drops().unwrap());
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (CLIENT, 50020, BACKEND, 8080));
    let ct = tc.maps.conntrack().unwrap();
    assert_eq!(ct.len(), 1, "{ct:?}");
    assert_eq!((ct[0].1.nat_addr_be, u16::from_be(ct[0].1.nat_port_be)), (be32(frontend), 30080));

    let mut r = rig_with(&LoadOptions::default().nodeport_mode(NodePortMode::Dsr));
    // Addressed to another node: untouched.
    let other = wrap(Ipv4Addr::new(192, 168, 77, 200));
    assert_eq!(r.xdp(&other), (XDP_PASS, other.clone()));
    let (rc, out) = r.xdp(&pkt);
    assert_eq!(rc, XDP_PASS, "drops {:?}", r.maps.drops().unwrap());
    assert_eq!(out.len(), pkt.len() - 20, "outer header removed");
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (CLIENT, 50020, BACKEND, 8080));
    let ct = r.maps.conntrack().unwrap();
    assert_eq!(ct.len(), 1, "{ct:?}");
    let (k, v) = ct[0];
    assert_eq!((k.dir, k.saddr_be, k.daddr_be), (ct_dir::REPLY, be32(BACKEND), be32(CLIENT)));
    assert_eq!((v.nat_addr_be, u16::from_be(v.nat_port_be)), (be32(frontend), 30080));
    // A second packet of the flow finds the entry.
    assert_eq!(r.xdp(&pkt).0, XDP_PASS);
    assert_eq!(r.maps.conntrack().unwrap().len(), 1);

    // The backend's reply leaves with the frontend as source (tc on the way out).
    let p = r.tc_reply(50020, Vec::new());
    assert_eq!((p.src, p.sport), (frontend, 30080), "reply from the frontend address");
    assert_eq!((p.dst, p.dport), (CLIENT, 50020));
}

#[test]
fn xdp_nodeport_without_backends_answers_tcp_with_rst() {
    let mut r = rig();
    put_service(&mut r.maps, Ipv4Addr::UNSPECIFIED, 30080, PROTO_TCP, svc_flags::NODE_PORT, 9, &[]);
    let mut syn = Pkt::tcp(CLIENT, 50002, NODE, 30080);
    syn.payload = vec![1; 10];
    let (rc, out) = r.xdp(&syn.build());
    assert_eq!(rc, XDP_TX);
    assert_eq!(out.len(), 14 + 40, "RST trimmed to headers");
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (NODE, 30080, CLIENT, 50002));
    assert_eq!(p.tcp_flags, 0x14, "RST|ACK");
    assert_eq!(p.ack, 1000 + 10 + 1, "acks the SYN and its payload");
    assert_eq!(r.drops(drop_reason::NO_BACKEND), 1);

    // UDP to a backend-less NodePort: ICMP port unreachable, counted.
    put_service(
        &mut r.maps,
        Ipv4Addr::UNSPECIFIED,
        30053,
        PROTO_UDP,
        svc_flags::NODE_PORT,
        10,
        &[],
    );
    let (rc, out) = r.xdp(&Pkt::udp(CLIENT, 5000, NODE, 30053).build());
    assert_eq!(rc, XDP_TX, "ICMP port unreachable bounced back");
    assert_icmp_port_unreachable(&out, NODE, CLIENT, 5000, 30053);
    assert_eq!(r.drops(drop_reason::NO_BACKEND), 2);
}

#[test]
fn xdp_malformed_and_foreign_packets() {
    let mut r = rig();
    nodeport(&mut r, true);
    let pkt = Pkt::tcp(CLIENT, 50000, NODE, 30080).build();
    assert_eq!(r.xdp(&pkt[..20]).0, XDP_DROP, "truncated IPv4");
    assert_eq!(r.drops(drop_reason::TRUNCATED), 1);
    let mut opts = Pkt::tcp(CLIENT, 50000, NODE, 30080);
    opts.ip_options = 8;
    assert_eq!(r.xdp(&opts.build()).0, XDP_DROP);
    assert_eq!(r.drops(drop_reason::IP_OPTIONS), 1);
    // Other node ports and other addresses pass untouched.
    let other = Pkt::tcp(CLIENT, 50000, NODE, 22).build();
    assert_eq!(r.xdp(&other), (XDP_PASS, other.clone()));
    let other = Pkt::tcp(CLIENT, 50000, Ipv4Addr::new(192, 168, 77, 2), 30080).build();
    assert_eq!(r.xdp(&other), (XDP_PASS, other.clone()));
}

#[test]
fn tc_session_affinity_keeps_a_client_on_one_backend() {
    let mut r = rig();
    let backends: Vec<_> =
        (1..=4).map(|i| (i as u32, Ipv4Addr::new(10, 0, 1, i), 8080, false)).collect();
    put_service(&mut r.maps, VIP, 80, PROTO_TCP, CLUSTER_IP, 7, &backends);
    let mut spread = std::collections::BTreeSet::new();
    for port in 41000..41020 {
        spread.insert(parse_and_verify(&r.tc(&Pkt::tcp(CLIENT, port, VIP, 80).build()).1).dst);
    }
    assert!(spread.len() > 1, "without affinity new flows spread: {spread:?}");

    set_affinity(&mut r.maps, VIP, 80, PROTO_TCP, 60);
    let mut sticky = std::collections::BTreeSet::new();
    for port in 42000..42020 {
        sticky.insert(parse_and_verify(&r.tc(&Pkt::tcp(CLIENT, port, VIP, 80).build()).1).dst);
    }
    assert_eq!(sticky.len(), 1, "one client, one backend under ClientIP affinity: {sticky:?}");
}

#[test]
fn tc_fallback_serves_nodeport_to_local_and_remote_backends() {
    // Where XDP cannot attach, the tc program on the node-facing interface does its job.
    let mut r = rig();
    nodeport(&mut r, true);
    put_service(
        &mut r.maps,
        Ipv4Addr::UNSPECIFIED,
        30081,
        PROTO_TCP,
        svc_flags::NODE_PORT,
        10,
        &[(22, BACKEND, 8081, false)],
    );
    // Local backend: DNAT only (client address kept), up the stack.
    let (rc, out) = r.tc(&Pkt::tcp(CLIENT, 50010, NODE, 30080).build());
    assert_eq!(rc, TC_ACT_OK, "drops: {:?}", r.maps.drops().unwrap());
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (CLIENT, 50010, BACKEND, 8080));
    let p = r.tc_reply(50010, Vec::new());
    assert_eq!((p.src, p.sport, p.dst, p.dport), (NODE, 30080, CLIENT, 50010));
    // Remote backend: DNAT + SNAT to the node, forwarded (FIB redirect, or the stack).
    let (rc, out) = r.tc(&Pkt::tcp(CLIENT, 50011, NODE, 30081).build());
    assert!(rc == TC_ACT_OK || rc == TC_ACT_REDIRECT, "forwarded, got {rc}");
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (NODE, 50011, BACKEND, 8081));
    // Its reply arrives at the node and goes back to the client from node:nodeport.
    let mut reply = Pkt::tcp(BACKEND, 8081, NODE, 50011);
    reply.tcp_flags = 0x12;
    let (rc, out) = r.tc(&reply.build());
    assert!(rc == TC_ACT_OK || rc == TC_ACT_REDIRECT, "forwarded, got {rc}");
    let p = parse_and_verify(&out);
    assert_eq!((p.src, p.sport, p.dst, p.dport), (NODE, 30081, CLIENT, 50011));
    // A NodePort on another address is not this node's: passed untouched.
    let other = Ipv4Addr::new(192, 168, 77, 9);
    let (rc, out) = r.tc(&Pkt::tcp(CLIENT, 50012, other, 30080).build());
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(parse_and_verify(&out).dst, other);
    let stats = r.maps.service_stats().unwrap();
    let new_conns: Vec<(u32, u64)> = stats.iter().map(|(id, c)| (*id, c.new_conns)).collect();
    assert_eq!(new_conns, [(9, 1), (10, 1)]);
}

/// tracefs mounted on a temp dir (the kernel trace buffer, where `bpf_printk` writes);
/// unmounted on drop.
struct Tracefs(tempfile::TempDir);

impl Tracefs {
    fn mount() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = std::process::Command::new("mount")
            .args(["-t", "tracefs", "nodev"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(st.success(), "mounting tracefs on {} (tests need root)", dir.path().display());
        Self(dir)
    }

    fn clear(&self) {
        std::fs::write(self.0.path().join("trace"), "").expect("clearing the trace buffer");
    }

    fn text(&self) -> String {
        std::fs::read_to_string(self.0.path().join("trace")).expect("reading the trace buffer")
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn debug_output_is_off_by_default_and_switches_at_run_time() {
    let mut r = rig();
    r.one_service(PROTO_TCP);
    let trace = Tracefs::mount();
    let pin = r._bpffs.path();
    // path 2 = tc, proto 6 = TCP; addresses printed by %pI4.
    let flow_line = "skiff: new flow path=2 proto=6 10.0.0.2 -> 10.96.0.10 -> backend 10.0.1.5";
    assert!(!skiff_proxy::maps::debug_enabled(&pin).unwrap(), "off by default");
    trace.clear();
    assert_eq!(r.tc(&Pkt::tcp(CLIENT, 40100, VIP, 80).build()).0, TC_ACT_OK);
    assert!(!trace.text().contains("skiff:"), "nothing printed while off:\n{}", trace.text());

    skiff_proxy::maps::set_debug(&pin, true).unwrap();
    assert!(skiff_proxy::maps::debug_enabled(&pin).unwrap());
    assert_eq!(r.tc(&Pkt::tcp(CLIENT, 40101, VIP, 80).build()).0, TC_ACT_OK);
    let mut bad = Pkt::tcp(CLIENT, 40102, VIP, 80).build();
    bad[14] = 0x65; // IPv6 version nibble in an IPv4 frame
    assert_eq!(r.tc(&bad).0, TC_ACT_SHOT);
    let text = trace.text();
    assert!(text.contains(flow_line), "new flow printed:\n{text}");
    assert!(
        text.contains(&format!("skiff: drop reason={}", drop_reason::BAD_VERSION)),
        "drop printed:\n{text}"
    );

    skiff_proxy::maps::set_debug(&pin, false).unwrap();
    trace.clear();
    assert_eq!(r.tc(&Pkt::tcp(CLIENT, 40103, VIP, 80).build()).0, TC_ACT_OK);
    assert!(!trace.text().contains("skiff:"), "nothing printed once off again");
}

/// The FORWARD conntrack key of a flow from `CLIENT:sport` to `VIP:80`.
fn forward_key(sport: u16, proto: u8) -> skiff_ebpf_common::CtKey {
    skiff_ebpf_common::CtKey {
        saddr_be: be32(CLIENT),
        daddr_be: be32(VIP),
        sport_be: sport.to_be(),
        dport_be: 80u16.to_be(),
        proto,
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    }
}

/// Sends a flow's packet three times through `send` (which checks each: the first opens the
/// flow, the second fills this CPU's flow cache from conntrack, the third hits the cache),
/// then deletes the flow's FORWARD conntrack entry behind the proxy's back.
fn fill_flow_cache_then_evict(r: &mut Rig, sport: u16, proto: u8, mut send: impl FnMut(&mut Rig)) {
    for _ in 0..3 {
        send(r);
    }
    evict_conntrack_entry(&r._bpffs.path(), &forward_key(sport, proto));
}

/// After `fill_flow_cache_then_evict` and one more packet served from the cache: the flow
/// was not reopened, and the backend (id 11) counts four packets of one connection.
fn assert_cache_hit_kept_the_flow(r: &Rig) {
    let fwd = r.maps.conntrack().unwrap().into_iter().filter(|(k, _)| k.dir == ct_dir::FORWARD);
    assert_eq!(fwd.count(), 0, "a cache hit did not reopen the flow");
    let be = r.maps.backend_stats().unwrap();
    assert_eq!((be[0].0, be[0].1.packets, be[0].1.new_conns), (11, 4, 1));
}

/// Packets of an established flow after the second come from this CPU's flow cache (shown
/// by deleting the conntrack entry behind the proxy's back: the next packet still reaches the
/// backend without reopening the flow) with the same rewrite, checksums and counters as
/// from conntrack.
#[test]
fn tc_established_flow_is_served_from_the_flow_cache() {
    pin_to_this_cpu();
    let mut r = rig();
    r.one_service(PROTO_TCP);
    let mut pkt = Pkt::tcp(CLIENT, 40100, VIP, 80);
    pkt.tcp_flags = 0x10;
    pkt.payload = vec![5; 21];
    fill_flow_cache_then_evict(&mut r, 40100, PROTO_TCP, |r| {
        let (rc, out) = r.tc(&pkt.build());
        assert_eq!(rc, TC_ACT_OK);
        let p = parse_and_verify(&out);
        assert_eq!((p.src, p.sport, p.dst, p.dport), (CLIENT, 40100, BACKEND, 8080));
    });
    let (rc, out) = r.tc(&pkt.build());
    assert_eq!(rc, TC_ACT_OK);
    let p = parse_and_verify(&out);
    assert_eq!((p.dst, p.dport), (BACKEND, 8080), "served from the cache");
    assert_cache_hit_kept_the_flow(&r);
    let stats = r.maps.service_stats().unwrap();
    assert_eq!((stats[0].0, stats[0].1.packets, stats[0].1.new_conns), (7, 4, 1));
    assert_eq!(stats[0].1.bytes, 4 * pkt.build().len() as u64);
}

/// The cache goes back to conntrack every `FLOW_CACHE_REFRESH` hits of an entry (what keeps
/// an active flow's LRU entry recent): a flow whose entry vanished without a generation
/// bump (an LRU eviction) is reopened from conntrack within that many packets.
#[test]
fn tc_flow_cache_rechecks_conntrack_within_the_refresh_interval() {
    use skiff_ebpf_common::FLOW_CACHE_REFRESH;
    pin_to_this_cpu();
    let mut r = rig();
    r.one_service(PROTO_UDP);
    let pkt = Pkt::udp(CLIENT, 5400, VIP, 80).build();
    fill_flow_cache_then_evict(&mut r, 5400, PROTO_UDP, |r| assert_eq!(r.tc(&pkt).0, TC_ACT_OK));
    let mut sent = 0;
    while !r.maps.conntrack().unwrap().iter().any(|(k, _)| k.dir == ct_dir::FORWARD) {
        assert!(sent < FLOW_CACHE_REFRESH, "still served from the cache after {sent} packets");
        let (rc, out) = r.tc(&pkt);
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(parse_and_verify(&out).dst, BACKEND);
        sent += 1;
    }
    assert!(sent > 1, "the first packet after the eviction was a cache hit ({sent} sent)");
    let stats = r.maps.service_stats().unwrap();
    assert_eq!((stats[0].1.packets, stats[0].1.new_conns), (3 + sent as u64, 2), "reopened once");
}

/// The XDP path shares the cache: an established ExternalIP flow keeps its rewrite when
/// served from it.
#[test]
fn xdp_established_flow_is_served_from_the_flow_cache() {
    pin_to_this_cpu();
    let mut r = rig();
    put_service(
        &mut r.maps,
        VIP,
        80,
        PROTO_TCP,
        svc_flags::EXTERNAL_IP,
        7,
        &[(11, BACKEND, 8080, true)],
    );
    let pkt = Pkt::tcp(CLIENT, 40200, VIP, 80).build();
    fill_flow_cache_then_evict(&mut r, 40200, PROTO_TCP, |r| {
        let (rc, out) = r.xdp(&pkt);
        assert_eq!(rc, XDP_PASS);
        let p = parse_and_verify(&out);
        assert_eq!((p.dst, p.dport), (BACKEND, 8080));
    });
    let (rc, out) = r.xdp(&pkt);
    assert_eq!(rc, XDP_PASS);
    assert_eq!(parse_and_verify(&out).dst, BACKEND, "served from the cache");
    assert_cache_hit_kept_the_flow(&r);
}

/// Two flows to different services whose keys share a flow cache slot: interleaved, each
/// keeps reaching its own backend (the cache compares whole keys, and a slot taken over by
/// the other flow is a miss that goes back to conntrack).
#[test]
fn tc_flows_sharing_a_flow_cache_slot_keep_their_own_backends() {
    pin_to_this_cpu();
    let mut r = rig();
    let (vip2, backend2) = (Ipv4Addr::new(10, 96, 0, 11), Ipv4Addr::new(10, 0, 1, 6));
    r.one_service(PROTO_TCP);
    put_service(&mut r.maps, vip2, 80, PROTO_TCP, CLUSTER_IP, 8, &[(12, backend2, 8080, false)]);
    let mut key2 = forward_key(0, PROTO_TCP);
    key2.daddr_be = be32(vip2);
    let slot1 = forward_key(41000, PROTO_TCP).flow_cache_slot();
    let sport2 = (1..=u16::MAX)
        .find(|p| {
            key2.sport_be = p.to_be();
            key2.flow_cache_slot() == slot1
        })
        .expect("a colliding source port");
    for round in 0..40 {
        let (_, out) = r.tc(&Pkt::tcp(CLIENT, 41000, VIP, 80).build());
        assert_eq!(parse_and_verify(&out).dst, BACKEND, "flow 1, round {round}");
        let (_, out) = r.tc(&Pkt::tcp(CLIENT, sport2, vip2, 80).build());
        assert_eq!(parse_and_verify(&out).dst, backend2, "flow 2, round {round}");
    }
    let stats = r.maps.service_stats().unwrap();
    let counts: Vec<_> = stats.iter().map(|(id, c)| (*id, c.packets, c.new_conns)).collect();
    assert_eq!(counts, [(7, 40, 1), (8, 40, 1)]);
}
