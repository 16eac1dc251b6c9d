//! Shared test helpers: a per-test bpffs pin directory, packet builders and checksum checks,
//! BPF_PROG_TEST_RUN of a program, and the Service/EndpointSlice objects of the sync tests.
#![allow(dead_code)]

pub mod netns;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use aya::{TestRun, TestRunOptions, TestRunResult};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use skiff_ebpf_common::{
    Backend, PROTO_TCP, PROTO_UDP, RevNat, ServiceKey, ServiceValue, backend_flags, svc_flags,
};
use skiff_proxy::desired::SERVICE_NAME_LABEL;
use skiff_proxy::maps::ServiceMaps;

/// A bpffs mounted on a fresh temp dir; unmounted and removed on drop.
pub struct BpffsDir {
    dir: tempfile::TempDir,
}

impl BpffsDir {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(dir.path())
            .status()
            .expect("running mount (tests need root)");
        assert!(
            st.success(),
            "mounting bpffs on {} failed (tests need root)",
            dir.path().display()
        );
        Self { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("skiff")
    }
}

impl Drop for BpffsDir {
    fn drop(&mut self) {
        // A busy mount (programs still being released) gets retried, then lazily detached:
        // the temp dir must never stay mounted.
        for _ in 0..10 {
            if Command::new("umount").arg(self.dir.path()).status().is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

pub fn be32(a: Ipv4Addr) -> u32 {
    u32::from(a).to_be()
}

/// Writes one ClusterIP-style frontend with the given backends (ids from 1) through the map API.
pub fn put_service(
    maps: &mut ServiceMaps,
    vip: Ipv4Addr,
    port: u16,
    proto: u8,
    flags: u16,
    rev_nat_id: u32,
    backends: &[(u32, Ipv4Addr, u16, bool)],
) {
    for (i, (id, ip, bport, local)) in backends.iter().enumerate() {
        maps.put_backend(
            *id,
            Backend {
                ip_be: be32(*ip),
                port_be: bport.to_be(),
                proto,
                state: 0,
                flags: if *local { backend_flags::LOCAL } else { 0 },
                _pad: [0; 3],
            },
        )
        .unwrap();
        maps.put_service(
            ServiceKey::new(be32(vip), port.to_be(), proto, i as u16 + 1),
            ServiceValue { backend_id: *id, count: 0, flags: 0, rev_nat_id },
        )
        .unwrap();
    }
    maps.put_rev_nat(rev_nat_id, RevNat { vip_be: be32(vip), port_be: port.to_be(), _pad: 0 })
        .unwrap();
    maps.put_service(
        ServiceKey::new(be32(vip), port.to_be(), proto, 0),
        ServiceValue { backend_id: 0, count: backends.len() as u16, flags, rev_nat_id },
    )
    .unwrap();
}

pub const CLUSTER_IP: u16 = svc_flags::CLUSTER_IP;

/// Turns on sessionAffinity ClientIP (timeout in seconds) for a frontend written by
/// `put_service`.
pub fn set_affinity(maps: &mut ServiceMaps, vip: Ipv4Addr, port: u16, proto: u8, timeout_s: u32) {
    let k = ServiceKey::new(be32(vip), port.to_be(), proto, 0);
    let (_, mut v) =
        maps.services().unwrap().into_iter().find(|(key, _)| *key == k).expect("frontend written");
    v.flags |= svc_flags::AFFINITY;
    v.backend_id = timeout_s;
    maps.put_service(k, v).unwrap();
}

/// Options of a crafted packet.
#[derive(Clone)]
pub struct Pkt {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub payload: Vec<u8>,
    pub tcp_flags: u8,
    pub ip_options: usize,
    pub frag: u16,
    pub udp_zero_csum: bool,
}

impl Pkt {
    pub fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto: PROTO_TCP,
            payload: Vec::new(),
            tcp_flags: 0x02,
            ip_options: 0,
            frag: 0,
            udp_zero_csum: false,
        }
    }

    pub fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            proto: PROTO_UDP,
            payload: b"hello".to_vec(),
            tcp_flags: 0,
            ..Self::tcp(src, sport, dst, dport)
        }
    }

    /// Ethernet + IPv4 + TCP/UDP with correct checksums.
    pub fn build(&self) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        p.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&0x0800u16.to_be_bytes());
        let ihl = 20 + self.ip_options;
        let l4_len = if self.proto == PROTO_TCP { 20 } else { 8 } + self.payload.len();
        let tot = (ihl + l4_len) as u16;
        let mut ip = vec![0u8; ihl];
        ip[0] = 0x40 | (ihl / 4) as u8;
        ip[2..4].copy_from_slice(&tot.to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6..8].copy_from_slice(&self.frag.to_be_bytes());
        ip[8] = 64;
        ip[9] = self.proto;
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&self.dst.octets());
        for b in ip.iter_mut().skip(20) {
            *b = 1; // NOP options
        }
        let c = checksum(&ip, 0);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut l4 = vec![0u8; l4_len - self.payload.len()];
        l4[0..2].copy_from_slice(&self.sport.to_be_bytes());
        l4[2..4].copy_from_slice(&self.dport.to_be_bytes());
        if self.proto == PROTO_TCP {
            l4[4..8].copy_from_slice(&1000u32.to_be_bytes());
            l4[12] = 5 << 4;
            l4[13] = self.tcp_flags;
            l4[14..16].copy_from_slice(&65535u16.to_be_bytes());
        } else {
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        l4.extend_from_slice(&self.payload);
        if !(self.proto == PROTO_UDP && self.udp_zero_csum) {
            let c = l4_checksum(self.src, self.dst, self.proto, &l4);
            let off = if self.proto == PROTO_TCP { 16 } else { 6 };
            l4[off..off + 2].copy_from_slice(&c.to_be_bytes());
        }
        p.extend_from_slice(&ip);
        p.extend_from_slice(&l4);
        p
    }
}

/// One's complement checksum of `data` starting from `init`.
pub fn checksum(data: &[u8], init: u32) -> u16 {
    let mut s = init;
    for ch in data.chunks(2) {
        let w = if ch.len() == 2 {
            u16::from_be_bytes([ch[0], ch[1]])
        } else {
            u16::from_be_bytes([ch[0], 0])
        };
        s += w as u32;
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn l4_checksum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.push(0);
    pseudo.push(proto);
    pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    let mut s = 0u32;
    for ch in pseudo.chunks(2) {
        s += u16::from_be_bytes([ch[0], ch[1]]) as u32;
    }
    let c = checksum(l4, s);
    if proto == PROTO_UDP && c == 0 { 0xffff } else { c }
}

/// A parsed view of an output packet, with checksums verified.
#[derive(Debug)]
pub struct Parsed {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub tcp_flags: u8,
    pub seq: u32,
    pub ack: u32,
    pub ip_len: usize,
}

/// Parses an Ethernet/IPv4/TCP|UDP packet and asserts that both checksums verify.
pub fn parse_and_verify(p: &[u8]) -> Parsed {
    assert!(p.len() >= 34, "output too short: {}", p.len());
    let ip = &p[14..];
    let ihl = ((ip[0] & 0xf) as usize) * 4;
    let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    assert_eq!(checksum(&ip[..ihl], 0), 0, "IPv4 header checksum does not verify");
    let proto = ip[9];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let l4 = &ip[ihl..tot];
    let csum_off = if proto == PROTO_TCP { 16 } else { 6 };
    let stored = u16::from_be_bytes([l4[csum_off], l4[csum_off + 1]]);
    if !(proto == PROTO_UDP && stored == 0) {
        let mut pseudo = 0u32;
        for w in [&src.octets()[..2], &src.octets()[2..], &dst.octets()[..2], &dst.octets()[2..]] {
            pseudo += u16::from_be_bytes([w[0], w[1]]) as u32;
        }
        pseudo += proto as u32 + l4.len() as u32;
        assert_eq!(checksum(l4, pseudo), 0, "L4 checksum does not verify");
    }
    Parsed {
        src,
        dst,
        sport: u16::from_be_bytes([l4[0], l4[1]]),
        dport: u16::from_be_bytes([l4[2], l4[3]]),
        proto,
        tcp_flags: if proto == PROTO_TCP { l4[13] } else { 0 },
        seq: if proto == PROTO_TCP { u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]) } else { 0 },
        ack: if proto == PROTO_TCP {
            u32::from_be_bytes([l4[8], l4[9], l4[10], l4[11]])
        } else {
            0
        },
        ip_len: tot,
    }
}

pub fn pin_path(b: &BpffsDir) -> PathBuf {
    b.path()
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// Asserts `p` is an ICMP port-unreachable from `from` to `to` quoting a UDP datagram
/// `to:sport → from:dport`, with valid IPv4 and ICMP checksums.
pub fn assert_icmp_port_unreachable(
    p: &[u8],
    from: Ipv4Addr,
    to: Ipv4Addr,
    sport: u16,
    dport: u16,
) {
    assert_eq!(p.len(), 14 + 20 + 8 + 20 + 8, "ICMP frame length");
    assert_eq!(&p[12..14], &[8, 0], "IPv4 ethertype");
    let ip = &p[14..34];
    assert_eq!(checksum(ip, 0), 0, "outer IPv4 checksum");
    assert_eq!(ip[9], 1, "ICMP");
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 56, "outer total length");
    assert_eq!(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]), from);
    assert_eq!(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]), to);
    let icmp = &p[34..];
    assert_eq!((icmp[0], icmp[1]), (3, 3), "destination/port unreachable");
    assert_eq!(checksum(icmp, 0), 0, "ICMP checksum");
    let quoted = &icmp[8..28];
    assert_eq!(Ipv4Addr::new(quoted[12], quoted[13], quoted[14], quoted[15]), to, "quoted source");
    assert_eq!(
        Ipv4Addr::new(quoted[16], quoted[17], quoted[18], quoted[19]),
        from,
        "quoted destination"
    );
    let l4 = &icmp[28..36];
    assert_eq!(u16::from_be_bytes([l4[0], l4[1]]), sport);
    assert_eq!(u16::from_be_bytes([l4[2], l4[3]]), dport);
}

/// Pins the calling thread to the CPU it runs on, so consecutive test runs of a program see
/// the same per-CPU flow cache. The pin ends with the thread (each test has its own).
pub fn pin_to_this_cpu() {
    // SAFETY: plain syscalls on the calling thread with a cpu_set_t owned here.
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(cpu >= 0, "sched_getcpu: {}", std::io::Error::last_os_error());
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
    }
}

/// Deletes a conntrack entry behind the proxy's back (no generation bump), as an LRU
/// eviction does.
pub fn evict_conntrack_entry(pin_dir: &Path, key: &skiff_ebpf_common::CtKey) {
    use skiff_ebpf_common::{CtKey, CtValue, map_names};
    let data = aya::maps::MapData::from_pin(pin_dir.join(map_names::CONNTRACK)).unwrap();
    let mut ct: aya::maps::HashMap<_, CtKey, CtValue> =
        aya::maps::Map::from_map_data(data).unwrap().try_into().unwrap();
    ct.remove(key).expect("the conntrack entry to evict exists");
}

/// A ClusterIP Service `default/NAME` with one port 80 (`port_name`, `proto`).
pub fn service(name: &str, cluster_ip: &str, port_name: &str, proto: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "clusterIP": cluster_ip,
            "ports": [{"name": port_name, "port": 80, "protocol": proto}]
        }
    }))
    .expect("a valid Service")
}

/// The EndpointSlice `default/SERVICE-abc` of `service`: port 8080 (`port_name`, `proto`),
/// one ready endpoint per address.
pub fn endpoint_slice(
    service: &str,
    port_name: &str,
    proto: &str,
    addrs: &[&str],
) -> EndpointSlice {
    let endpoints: Vec<_> = addrs
        .iter()
        .map(|a| {
            serde_json::json!({"addresses": [a],
                               "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{service}-abc"), "namespace": "default",
                     "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": 8080, "protocol": proto}],
        "endpoints": endpoints
    }))
    .expect("a valid EndpointSlice")
}

/// Runs `prog` (the `hook` program) on `pkt` with BPF_PROG_TEST_RUN: its verdict and the
/// packet as it left.
pub fn test_run<P>(prog: &P, hook: &str, pkt: &[u8]) -> (u32, Vec<u8>)
where
    P: for<'a> TestRun<Opts<'a> = TestRunOptions<'a>, Result = TestRunResult>,
{
    let mut out = vec![0u8; pkt.len() + 256];
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(pkt),
            data_out: Some(&mut out),
            ..Default::default()
        })
        .unwrap_or_else(|e| {
            panic!("BPF_PROG_TEST_RUN {hook} on {} bytes {pkt:02x?}: {e}", pkt.len())
        });
    out.truncate(r.data_size_out as usize);
    (r.return_value, out)
}
