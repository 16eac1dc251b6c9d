//! Real TCP and UDP through a ClusterIP in a client/node/backend namespace rig: via the
//! socket-LB hooks (client process in a test cgroup) and via the tc per-packet path.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream, UdpSocket};
use std::time::Duration;

use aya::programs::TcAttachType;
use common::netns::*;
use common::*;
use skiff_ebpf_common::{PROTO_TCP, PROTO_UDP, ct_dir, ct_flags, drop_reason};
use skiff_proxy::daemon::ProxyConfig;
use skiff_proxy::loader::{
    Dataplane, LoadOptions, NodePortMode, TcAttachment, XdpAttachment, cgroup2_root,
};
use skiff_proxy::maps::ServiceMaps;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);

/// Connections made to show that a random backend choice reaches both backends: all of them
/// landing on one of two has odds of 2^-(SPREAD-1) (12 gave 2^-11, and CI met them once).
const SPREAD: usize = 40;

fn services(maps: &mut ServiceMaps) {
    let backends: Vec<_> = BACKEND_IPS
        .iter()
        .enumerate()
        .map(|(i, ip)| (i as u32 + 1, *ip, BACKEND_PORT, false))
        .collect();
    put_service(maps, VIP, 80, PROTO_TCP, CLUSTER_IP, 1, &backends);
    let udp: Vec<_> = backends.iter().map(|(id, ip, p, l)| (id + 10, *ip, *p, *l)).collect();
    put_service(maps, VIP, 80, PROTO_UDP, CLUSTER_IP, 2, &udp);
    put_service(maps, EMPTY_VIP, 80, PROTO_TCP, CLUSTER_IP, 3, &[]);
    put_service(maps, EMPTY_VIP, 80, PROTO_UDP, CLUSTER_IP, 4, &[]);
}

/// Sends a datagram on a connected UDP socket and returns the error the receive gets.
fn udp_refused(ns: &Netns, ip: Ipv4Addr, port: u16) -> std::io::ErrorKind {
    in_netns(ns, || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.connect(sockaddr(ip, port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.send(b"anyone?").unwrap();
        let mut buf = [0u8; 64];
        match s.recv(&mut buf) {
            Ok(n) => panic!("unexpected reply of {n} bytes"),
            Err(e) => e.kind(),
        }
    })
}

fn lines(out: &str) -> (String, String) {
    let peer = out.lines().find_map(|l| l.strip_prefix("peer ")).unwrap_or_default().to_string();
    let data = out.lines().find_map(|l| l.strip_prefix("data ")).unwrap_or_default().to_string();
    (peer, data)
}

/// The backend that answered: the first field of an echo reply.
fn backend_of(data: &str) -> String {
    data.split('|').next().unwrap_or_default().to_string()
}

/// `count` TCP exchanges of the python client in `ns`, inside the socket-LB cgroup, with
/// `vip`:80, sending `{tag}{i}`: the `peer` and `data` lines of each.
fn socket_lb_tcp(
    ns: &Netns,
    cg: &TestCgroup,
    vip: &str,
    tag: &str,
    count: usize,
) -> Vec<(String, String)> {
    (0..count)
        .map(|i| {
            lines(&run_client_in(
                ns,
                &cg.path,
                CLIENT_PY,
                &["tcp", vip, "80", &format!("{tag}{i}")],
            ))
        })
        .collect()
}

/// What every test here starts from: the client — node — backend rig, echo servers in the
/// backend namespace and a bpffs for the data plane. Fields drop in this order: the bpffs,
/// then the servers, then the namespaces.
struct Lab {
    bpffs: BpffsDir,
    _servers: EchoServers,
    rig: Rig,
}

impl Lab {
    fn new() -> Self {
        let rig = Rig::new();
        let _servers = EchoServers::start(&rig.backend);
        Self { bpffs: BpffsDir::new(), _servers, rig }
    }

    /// Loads the data plane with the node's address as the client sees it (NodePort
    /// frontends and the SNAT source) and opens its pinned maps.
    fn load(&self) -> (Dataplane, ServiceMaps) {
        let dp = Dataplane::load(&self.bpffs.path(), NODE_CLIENT_SIDE).expect("load");
        let maps = ServiceMaps::open_pinned(&self.bpffs.path()).unwrap();
        (dp, maps)
    }

    /// The proxy's configuration on the node, without the socket LB.
    fn proxy_config(&self) -> ProxyConfig {
        ProxyConfig {
            node_ip: NODE_CLIENT_SIDE,
            pin_dir: self.bpffs.path(),
            socket_lb: false,
            ..Default::default()
        }
    }
}

/// XDP on the node's interfaces; the veth peers get it too (TX checksum offload off) so that
/// frames redirected into them are accepted (native XDP on veth). tc egress on n0
/// reverse-translates the replies of the local backend.
fn attach_nodeport_xdp(dp: &mut Dataplane, rig: &Rig) -> (Vec<XdpAttachment>, TcAttachment) {
    let (x0, x1, tc) = in_netns(&rig.node, || {
        (
            dp.attach_xdp("n0").expect("xdp n0"),
            dp.attach_xdp("n1").expect("xdp n1"),
            dp.attach_tc("n0", TcAttachType::Egress).expect("tc egress n0"),
        )
    });
    let xc = in_netns(&rig.client, || {
        disable_tx_csum("c0");
        dp.attach_xdp("c0").expect("xdp c0")
    });
    let xb = in_netns(&rig.backend, || {
        disable_tx_csum("b0");
        dp.attach_xdp("b0").expect("xdp b0")
    });
    (vec![x0, x1, xc, xb], tc)
}

/// NodePort services 30080 (a local backend, 10.201.1.2), 30081 (a remote one, .3) and
/// 30082 (no endpoints), ids 1 to 3.
fn put_nodeport_services(maps: &mut ServiceMaps) {
    let any = Ipv4Addr::UNSPECIFIED;
    let np = skiff_ebpf_common::svc_flags::NODE_PORT;
    put_service(maps, any, 30080, PROTO_TCP, np, 1, &[(1, BACKEND_IPS[0], BACKEND_PORT, true)]);
    put_service(maps, any, 30081, PROTO_TCP, np, 2, &[(2, BACKEND_IPS[1], BACKEND_PORT, false)]);
    put_service(maps, any, 30082, PROTO_TCP, np, 3, &[]);
}

/// Through the services of `put_nodeport_services`: the local backend sees the client's
/// address, the remote one the node's (SNAT, replies translated back), the one without
/// endpoints refuses; three new connections counted for each of the first two.
fn assert_nodeport_local_and_remote(rig: &Rig, maps: &ServiceMaps) {
    for i in 0..3 {
        let data = talk(&rig.client, NODE_CLIENT_SIDE, 30080, &format!("l{i}"))
            .expect("nodeport to a local backend");
        assert_eq!(data, format!("10.201.1.2|10.201.0.2|l{i}"), "client address kept");
    }
    for i in 0..3 {
        let data =
            talk(&rig.client, NODE_CLIENT_SIDE, 30081, &format!("r{i}")).unwrap_or_else(|e| {
                dump_state(rig, maps);
                panic!("nodeport to a remote backend: {e:?}")
            });
        assert_eq!(data, format!("10.201.1.3|10.201.0.1|r{i}"), "backend sees the node address");
    }
    assert_eq!(
        talk(&rig.client, NODE_CLIENT_SIDE, 30082, "x"),
        Err(std::io::ErrorKind::ConnectionRefused),
        "no endpoints: refused by a RST"
    );
    let stats = maps.service_stats().unwrap();
    for id in [1, 2] {
        let s = stats.iter().find(|(i, _)| *i == id).expect("counted");
        assert_eq!(s.1.new_conns, 3, "service {id}");
    }
}

/// Prints the rig's kernel counters, neighbours and the data plane's drops and conntrack,
/// for a failing exchange.
fn dump_state(rig: &Rig, maps: &ServiceMaps) {
    for ns in [&rig.client, &rig.node, &rig.backend] {
        let o = std::process::Command::new("nsenter")
            .arg(format!("--net={}", ns.path().display()))
            .args(["sh", "-c", "nstat -az | grep -v ' 0 '; ip neigh; sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.n1.accept_local net.ipv4.conf.n0.accept_local 2>&1"])
            .output()
            .unwrap();
        eprintln!("== {}\n{}", ns.name, String::from_utf8_lossy(&o.stdout));
    }
    eprintln!("drops {:?}\nct {:?}", maps.drops().unwrap(), maps.conntrack().unwrap());
}

/// A TCP exchange from `ns`: connect to `ip`:`port`, send `msg`, read the echo reply.
fn talk(ns: &Netns, ip: Ipv4Addr, port: u16, msg: &str) -> Result<String, std::io::ErrorKind> {
    let msg = msg.to_string();
    in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&sockaddr(ip, port), Duration::from_secs(5))
            .map_err(|e| e.kind())?;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(msg.as_bytes()).map_err(|e| e.kind())?;
        s.shutdown(std::net::Shutdown::Write).map_err(|e| e.kind())?;
        let mut data = String::new();
        s.read_to_string(&mut data).map_err(|e| e.kind())?;
        Ok(data)
    })
}

#[test]
fn clusterip_tcp_and_udp_through_socket_lb() {
    let lab = Lab::new();
    let rig = &lab.rig;
    let (mut dp, mut maps) = lab.load();
    services(&mut maps);
    let cg = TestCgroup::new(&cgroup2_root().expect("cgroup2 root"));
    let _attached = dp.attach_sock_lb(&cg.path).expect("attach socket LB");

    let mut seen = BTreeSet::new();
    for (i, (peer, data)) in
        socket_lb_tcp(&rig.client, &cg, "10.96.0.10", "t", SPREAD).iter().enumerate()
    {
        assert_eq!(peer, "10.96.0.10 80", "getpeername shows the VIP: {data}");
        let parts: Vec<&str> = data.split('|').collect();
        assert_eq!(parts.len(), 3, "echo reply: {data}");
        assert_eq!(parts[1], "10.201.0.2", "client address preserved (no SNAT)");
        assert_eq!(parts[2], format!("t{i}"));
        seen.insert(parts[0].to_string());
    }
    assert_eq!(seen.len(), 2, "both backends chosen over {SPREAD} connections: {seen:?}");

    let out = run_client_in(&rig.client, &cg.path, CLIENT_PY, &["udp", "10.96.0.10", "80", "u1"]);
    let (peer, data) = lines(&out);
    assert_eq!(peer, "10.96.0.10 80", "recvmsg shows the VIP as the source: {out}");
    assert!(data.ends_with("|10.201.0.2|u1"), "udp echo: {out}");

    // sessionAffinity ClientIP: every connection of this client (its netns) to one backend.
    let sticky_vip = Ipv4Addr::new(10, 96, 0, 12);
    let backends: Vec<_> = BACKEND_IPS
        .iter()
        .enumerate()
        .map(|(i, ip)| (i as u32 + 21, *ip, BACKEND_PORT, false))
        .collect();
    put_service(&mut maps, sticky_vip, 80, PROTO_TCP, CLUSTER_IP, 5, &backends);
    set_affinity(&mut maps, sticky_vip, 80, PROTO_TCP, 60);
    let sticky: BTreeSet<_> = socket_lb_tcp(&rig.client, &cg, "10.96.0.12", "a", 8)
        .iter()
        .map(|(_, data)| backend_of(data))
        .collect();
    assert_eq!(sticky.len(), 1, "affinity keeps the client on one backend: {sticky:?}");

    // Hairpin: a backend reaching its own service lands on a backend (itself included)
    // through the socket LB, with no NAT to undo.
    let mut hairpin = BTreeSet::new();
    for (peer, data) in socket_lb_tcp(&rig.backend, &cg, "10.96.0.10", "h", 8) {
        assert_eq!(peer, "10.96.0.10 80", "{data}");
        hairpin.insert(backend_of(&data));
    }
    assert!(hairpin.contains("10.201.1.2") || hairpin.contains("10.201.1.3"), "{hairpin:?}");

    // No endpoints: connect() and sendto() are refused at once, counted.
    let out = run_client_in(&rig.client, &cg.path, CLIENT_PY, &["tcp", "10.96.0.11", "80", "x"]);
    assert_eq!(out.trim(), "refused");
    let out = run_client_in(&rig.client, &cg.path, CLIENT_PY, &["udp", "10.96.0.11", "80", "x"]);
    assert_eq!(out.trim(), "refused", "sendto() to a backend-less UDP service is refused");
    assert_eq!(maps.drop_count(drop_reason::NO_BACKEND).unwrap(), 2);

    // Socket LB does no per-packet NAT: no conntrack entries; counters per service.
    assert!(maps.conntrack().unwrap().is_empty());
    let stats = maps.service_stats().unwrap();
    let tcp = stats.iter().find(|(id, _)| *id == 1).expect("tcp service counted");
    assert_eq!(tcp.1.new_conns, SPREAD as u64 + 8, "client and hairpin connections");
}

#[test]
fn clusterip_tcp_and_udp_through_tc() {
    let lab = Lab::new();
    let rig = &lab.rig;
    let (mut dp, mut maps) = lab.load();
    services(&mut maps);
    // Attach inside the node namespace (interface names resolve there).
    let (_ingress, _egress) = in_netns(&rig.node, || {
        let i = dp.attach_tc("n0", TcAttachType::Ingress).expect("attach tc ingress");
        let e = dp.attach_tc("n0", TcAttachType::Egress).expect("attach tc egress");
        (i, e)
    });

    let mut seen = BTreeSet::new();
    for i in 0..SPREAD {
        let (peer, data) = in_netns(&rig.client, || {
            let mut s = TcpStream::connect_timeout(&sockaddr(VIP, 80), Duration::from_secs(5))
                .expect("connect through tc DNAT");
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let peer = s.peer_addr().unwrap();
            s.write_all(format!("t{i}").as_bytes()).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut data = String::new();
            if let Err(e) = s.read_to_string(&mut data) {
                data = format!("ERR {e}");
            }
            (peer, data)
        });
        if data.starts_with("ERR") {
            dump_state(rig, &maps);
            panic!("{data}");
        }
        assert_eq!(peer, sockaddr(VIP, 80));
        let parts: Vec<&str> = data.split('|').collect();
        assert_eq!(parts.len(), 3, "echo reply {data}");
        assert_eq!(parts[1], "10.201.0.2", "client address preserved");
        seen.insert(parts[0].to_string());
    }
    assert_eq!(seen.len(), 2, "both backends chosen over {SPREAD} connections: {seen:?}");

    let (from, data) = in_netns(&rig.client, || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.send_to(b"u1", sockaddr(VIP, 80)).unwrap();
        let mut buf = [0u8; 512];
        let (n, from) = s.recv_from(&mut buf).expect("udp reply through tc revNAT");
        (from, String::from_utf8_lossy(&buf[..n]).into_owned())
    });
    assert_eq!(from, sockaddr(VIP, 80), "UDP reply comes from the VIP");
    assert!(data.ends_with("|10.201.0.2|u1"), "{data}");

    // No endpoints: the tc path answers the SYN with a RST (refused at once, not a timeout).
    let refused = in_netns(&rig.client, || {
        TcpStream::connect_timeout(&sockaddr(EMPTY_VIP, 80), Duration::from_secs(5))
            .map(|_| ())
            .map_err(|e| e.kind())
    });
    assert_eq!(refused, Err(std::io::ErrorKind::ConnectionRefused));
    assert_eq!(maps.drop_count(drop_reason::NO_BACKEND).unwrap(), 1);
    // ... and a UDP datagram with an ICMP port unreachable (a connected socket sees it).
    assert_eq!(udp_refused(&rig.client, EMPTY_VIP, 80), std::io::ErrorKind::ConnectionRefused);
    assert_eq!(maps.drop_count(drop_reason::NO_BACKEND).unwrap(), 2);

    assert!(!maps.conntrack().unwrap().is_empty(), "per-packet path keeps conntrack");
    let stats = maps.service_stats().unwrap();
    let tcp = stats.iter().find(|(id, _)| *id == 1).expect("tcp service counted");
    assert_eq!(tcp.1.new_conns, SPREAD as u64);
}

#[test]
fn nodeport_through_xdp_to_local_and_remote_backends() {
    let lab = Lab::new();
    let rig = &lab.rig;
    let (mut dp, mut maps) = lab.load();
    put_nodeport_services(&mut maps);
    let any = Ipv4Addr::UNSPECIFIED;
    let np = skiff_ebpf_common::svc_flags::NODE_PORT;
    put_service(&mut maps, any, 30083, PROTO_UDP, np, 4, &[]);
    let _attached = attach_nodeport_xdp(&mut dp, rig);

    assert_nodeport_local_and_remote(rig, &maps);
    assert_eq!(maps.drop_count(drop_reason::NO_BACKEND).unwrap(), 1, "the RST from XDP");
    assert_eq!(
        udp_refused(&rig.client, NODE_CLIENT_SIDE, 30083),
        std::io::ErrorKind::ConnectionRefused,
        "ICMP port unreachable from XDP"
    );
    assert_eq!(maps.drop_count(drop_reason::NO_BACKEND).unwrap(), 2);
}

#[test]
fn daemon_dataplane_pins_tc_links_that_outlive_it() {
    let lab = Lab::new();
    let rig = &lab.rig;
    let config = ProxyConfig { tc_interfaces: vec!["n0".into()], ..lab.proxy_config() };
    let started = in_netns(&rig.node, || {
        skiff_proxy::daemon::start_dataplane(&config).map(|mut r| {
            services(&mut r.maps);
            r.dataplane.pin_dir().to_path_buf()
        })
    });
    let pin = started.expect("start the data plane");
    // The RunningDataplane is gone (the proxy exited): pinned tc links keep serving.
    let data = talk(&rig.client, VIP, 80, "pinned").expect("pinned tc links serve");
    assert!(data.ends_with("|10.201.0.2|pinned"), "{data}");
    // A second start finds the links pinned and attaches nothing twice.
    let again = in_netns(&rig.node, || skiff_proxy::daemon::start_dataplane(&config).map(|_| ()));
    again.expect("restart");
    assert_eq!(skiff_proxy::loader::unpin_links(&pin.join("links")).unwrap(), 2);
}

#[test]
fn nodeport_through_the_tc_fallback_where_xdp_cannot_attach() {
    let lab = Lab::new();
    let rig = &lab.rig;
    // Another XDP program already holds n0 and n1 (native and generic XDP cannot coexist,
    // and a link-attached program cannot be replaced): skiff's XDP attach fails there.
    let blocker_fs = BpffsDir::new();
    let mut blocker = Dataplane::load(&blocker_fs.path(), NODE_CLIENT_SIDE).expect("load");
    let _blocked = in_netns(&rig.node, || {
        (blocker.attach_xdp("n0").expect("xdp n0"), blocker.attach_xdp("n1").expect("xdp n1"))
    });
    let config = ProxyConfig {
        xdp_interfaces: vec!["n0".into(), "n1".into()],
        metrics_addr: None,
        ..lab.proxy_config()
    };
    let mut running = in_netns(&rig.node, || {
        skiff_proxy::daemon::start_dataplane(&config).expect("the tc fallback attaches")
    });
    let links = lab.bpffs.path().join("links");
    for iface in ["n0", "n1"] {
        assert!(!links.join(format!("xdp-{iface}")).exists(), "no XDP link on {iface}");
        for dir in ["ingress", "egress"] {
            let pin = links.join(format!("tc-{iface}-{dir}"));
            assert!(skiff_proxy::loader::link_pinned(&pin), "{} pinned", pin.display());
        }
    }
    put_nodeport_services(&mut running.maps);
    assert_nodeport_local_and_remote(rig, &running.maps);
}

#[test]
fn traffic_policies_local_end_to_end() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use skiff_proxy::desired::{NodeContext, compute};
    use skiff_proxy::sync::ServiceMapSync;

    let lab = Lab::new();
    let rig = &lab.rig;
    let (mut dp, mut maps) = lab.load();
    // web: NodePort with both traffic policies Local; any: the same without policies. Each
    // has one endpoint on this node (10.201.1.2, node-a) and one elsewhere (.3, node-b).
    let svc = |name: &str, ip: &str, node_port: u16, local: bool| -> Service {
        let policy = if local { "Local" } else { "Cluster" };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "type": "NodePort", "clusterIP": ip,
                "externalTrafficPolicy": policy, "internalTrafficPolicy": policy,
                "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                           "nodePort": node_port, "protocol": "TCP"}]
            }
        }))
        .expect("a valid Service")
    };
    let slice = |svc: &str, eps: &[(&str, &str)]| -> EndpointSlice {
        let eps: Vec<_> = eps
            .iter()
            .map(|(ip, node)| {
                serde_json::json!({"addresses": [ip], "nodeName": node,
                                   "conditions": {"ready": true}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{svc}-1"), "namespace": "default",
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "endpoints": eps,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .expect("a valid EndpointSlice")
    };
    let both = [("10.201.1.2", "node-a"), ("10.201.1.3", "node-b")];
    let services = [svc("web", "10.96.0.20", 30090, true), svc("any", "10.96.0.21", 30091, false)];
    let node = NodeContext { node_name: "node-a".into() };
    let mut sync = ServiceMapSync::new();
    let d = compute(&services, &[slice("web", &both), slice("any", &both)], &node);
    sync.sync(&mut maps, &d).expect("sync");

    let _xdp = attach_nodeport_xdp(&mut dp, rig);
    let cg = TestCgroup::new(&cgroup2_root().expect("cgroup2 root"));
    let _sock = dp.attach_sock_lb(&cg.path).expect("attach socket LB");

    // externalTrafficPolicy Local: only the local endpoint, client address kept.
    for i in 0..8 {
        let data = talk(&rig.client, NODE_CLIENT_SIDE, 30090, &format!("e{i}")).expect("eTP Local");
        assert_eq!(data, format!("10.201.1.2|10.201.0.2|e{i}"));
    }
    // internalTrafficPolicy Local: a client on this node (in the socket-LB cgroup) only ever
    // reaches the local endpoint through the ClusterIP.
    let seen: BTreeSet<_> = socket_lb_tcp(&rig.client, &cg, "10.96.0.20", "i", 8)
        .iter()
        .map(|(_, data)| backend_of(data))
        .collect();
    assert_eq!(seen, BTreeSet::from(["10.201.1.2".to_string()]), "iTP Local");
    // Without the policies both endpoints serve (Cluster).
    let seen: BTreeSet<_> = socket_lb_tcp(&rig.client, &cg, "10.96.0.21", "c", SPREAD)
        .iter()
        .map(|(_, data)| backend_of(data))
        .collect();
    assert_eq!(seen.len(), 2, "Cluster policy spreads over both endpoints: {seen:?}");

    // The local endpoint goes away: eTP Local has nothing left on this node and refuses
    // (never forwards to the remote endpoint, which would lose the client address).
    let remote_only = [("10.201.1.3", "node-b")];
    let d = compute(&services, &[slice("web", &remote_only), slice("any", &both)], &node);
    sync.sync(&mut maps, &d).expect("sync");
    assert_eq!(
        talk(&rig.client, NODE_CLIENT_SIDE, 30090, "gone"),
        Err(std::io::ErrorKind::ConnectionRefused),
        "eTP Local without a local endpoint"
    );
    let data =
        talk(&rig.client, NODE_CLIENT_SIDE, 30091, "still").expect("eTP Cluster still serves");
    assert!(data.ends_with("|still"), "{data}");
}

/// One counter of `/proc/net/dev` (`field`: 0 = rx bytes, 1 = rx packets, 8 = tx bytes,
/// 9 = tx packets) of `iface` in `ns`.
fn dev_counter(ns: &Netns, iface: &str, field: usize) -> u64 {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", ns.path().display()))
        .args(["cat", "/proc/net/dev"])
        .output()
        .expect("nsenter cat /proc/net/dev");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{iface}:")))
        .unwrap_or_else(|| panic!("{iface} in /proc/net/dev of {}: {text}", ns.name));
    let fields: Vec<u64> =
        line.split(':').nth(1).unwrap().split_whitespace().map(|f| f.parse().unwrap()).collect();
    fields[field]
}

/// DSR end to end: client — lab bridge — node A (frontend) and node B (backend's node,
/// backend behind it). The backend sees the client's address; its replies leave node B
/// with node A's address and NodePort as source and go to the client directly: node A
/// receives only the client's segments.
#[test]
fn nodeport_dsr_replies_go_straight_from_the_backends_node() {
    dsr_end_to_end(false);
}

/// The same through the tc fallback on both nodes (where XDP cannot attach): the ingress
/// program wraps on node A and unwraps on node B.
#[test]
fn nodeport_dsr_through_the_tc_fallback() {
    dsr_end_to_end(true);
}

/// The DSR lab: client, node A and node B on a lab bridge (10.210.0.0/24, not connected to
/// the host), the backends' pod behind node B (10.201.1.0/24, routed there by node A). Fields
/// drop in reverse order of creation.
struct DsrRig {
    pod: Netns,
    node_b: Netns,
    node_a: Netns,
    client: Netns,
    lab: Netns,
}

impl DsrRig {
    fn new(tag: &str) -> Self {
        let lab = Netns::new(format!("skf-l-{tag}"));
        let client = Netns::new(format!("skf-c-{tag}"));
        let node_a = Netns::new(format!("skf-a-{tag}"));
        let node_b = Netns::new(format!("skf-b-{tag}"));
        let pod = Netns::new(format!("skf-p-{tag}"));
        lab.ip(&["link", "add", "br0", "type", "bridge"]);
        for (ns, inside, outside) in
            [(&client, "c0", "lc"), (&node_a, "a0", "la"), (&node_b, "b0", "lb")]
        {
            lab.add_veth(outside, inside, ns);
            lab.ip(&["link", "set", outside, "master", "br0", "up"]);
            ns.ip(&["link", "set", "lo", "up"]);
            ns.ip(&["link", "set", inside, "up"]);
        }
        lab.ip(&["link", "set", "br0", "up"]);
        client.ip(&["addr", "add", "10.210.0.10/24", "dev", "c0"]);
        node_a.ip(&["addr", "add", "10.210.0.1/24", "dev", "a0"]);
        node_b.ip(&["addr", "add", "10.210.0.2/24", "dev", "b0"]);
        // The backend's subnet lives behind node B.
        node_b.add_veth("bp0", "p0", &pod);
        node_b.ip(&["addr", "add", "10.201.1.1/24", "dev", "bp0"]);
        node_b.ip(&["link", "set", "bp0", "up"]);
        pod.ip(&["link", "set", "lo", "up"]);
        for a in BACKEND_IPS {
            pod.ip(&["addr", "add", &format!("{a}/24"), "dev", "p0"]);
        }
        pod.ip(&["link", "set", "p0", "up"]);
        pod.ip(&["route", "add", "default", "via", "10.201.1.1"]);
        node_a.ip(&["route", "add", "10.201.1.0/24", "via", "10.210.0.2"]);
        for n in [&node_a, &node_b] {
            n.nsenter(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]);
        }
        Self { pod, node_b, node_a, client, lab }
    }
}

fn dsr_end_to_end(tc_fallback: bool) {
    let tag = format!("{}-dsr{}", std::process::id(), u8::from(tc_fallback));
    let rig = DsrRig::new(&tag);
    let DsrRig { pod, node_b, node_a, client, lab } = &rig;
    let _servers = EchoServers::start(pod);

    let node_a_ip = Ipv4Addr::new(10, 210, 0, 1);
    let dsr = LoadOptions::default().nodeport_mode(NodePortMode::Dsr);
    let (bpffs_a, bpffs_b) = (BpffsDir::new(), BpffsDir::new());
    let mut dp_a = Dataplane::load_with(&bpffs_a.path(), node_a_ip, &dsr).expect("load A");
    let mut dp_b =
        Dataplane::load_with(&bpffs_b.path(), Ipv4Addr::new(10, 210, 0, 2), &dsr).expect("load B");
    let mut maps_a = ServiceMaps::open_pinned(&bpffs_a.path()).unwrap();
    let maps_b = ServiceMaps::open_pinned(&bpffs_b.path()).unwrap();
    let np = skiff_ebpf_common::svc_flags::NODE_PORT;
    let any = Ipv4Addr::UNSPECIFIED;
    put_service(
        &mut maps_a,
        any,
        30090,
        PROTO_TCP,
        np,
        1,
        &[(1, BACKEND_IPS[0], BACKEND_PORT, false)],
    );
    let udp_backend = [(2, BACKEND_IPS[0], BACKEND_PORT, false)];
    put_service(&mut maps_a, any, 30091, PROTO_UDP, np, 2, &udp_backend);
    // Node A: XDP on its interface (and on the bridge-side peer, so the frames it sends back
    // out of the same veth are accepted). Node B: XDP unwraps, tc egress rewrites replies.
    // Or the tc fallback on both (ingress wraps / unwraps, egress rewrites).
    let mut attached: Vec<Box<dyn Send>> = Vec::new();
    if tc_fallback {
        let (i, e) = in_netns(node_a, || dp_a.attach_tc_nodeport("a0").expect("tc a0"));
        attached.push(Box::new(i));
        attached.push(Box::new(e));
        let (i, e) = in_netns(node_b, || dp_b.attach_tc_nodeport("b0").expect("tc b0"));
        attached.push(Box::new(i));
        attached.push(Box::new(e));
    } else {
        attached.push(Box::new(in_netns(node_a, || dp_a.attach_xdp("a0").expect("xdp a0"))));
        attached.push(Box::new(in_netns(lab, || dp_a.attach_xdp("la").expect("xdp la"))));
        let (x, t) = in_netns(node_b, || {
            (
                dp_b.attach_xdp("b0").expect("xdp b0"),
                dp_b.attach_tc("b0", TcAttachType::Egress).expect("tc egress b0"),
            )
        });
        attached.push(Box::new(x));
        attached.push(Box::new(t));
    }
    in_netns(client, || disable_tx_csum("c0"));

    let a_rx_before = dev_counter(node_a, "a0", 1);
    let c_rx_before = dev_counter(client, "c0", 1);
    let c_tx_before = dev_counter(client, "c0", 9);
    for i in 0..3 {
        let msg = format!("dsr{i}");
        let data = talk(client, node_a_ip, 30090, &msg).unwrap_or_else(|e| {
            panic!(
                "DSR NodePort: {e:?}; drops A {:?} B {:?}; ct A {:?} B {:?}",
                maps_a.drops().unwrap(),
                maps_b.drops().unwrap(),
                maps_a.conntrack().unwrap(),
                maps_b.conntrack().unwrap()
            )
        });
        // The TCP connection to node A's address completed: its SYN-ACK and data came
        // from 10.210.0.1:30090. The backend saw the client's own address.
        assert_eq!(data, format!("10.201.1.2|10.210.0.10|dsr{i}"));
    }
    let a_rx = dev_counter(node_a, "a0", 1) - a_rx_before;
    let c_rx = dev_counter(client, "c0", 1) - c_rx_before;
    let c_tx = dev_counter(client, "c0", 9) - c_tx_before;
    // Node A received the client's frames (and ARP), never the replies: a handful more
    // frames than the client sent at most, far fewer than client sent + client received.
    eprintln!("frames: node A received {a_rx}, client sent {c_tx}, client received {c_rx}");
    assert!(c_rx >= 9, "the client got SYN-ACKs, data and FINs: {c_rx}");
    assert!(a_rx <= c_tx + 4, "node A received {a_rx} frames; the client sent {c_tx}");
    // UDP the same way: the datagram's answer comes from node A's address and NodePort
    // (the socket is connected to it: anything else would not be received).
    let answer = in_netns(client, || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.connect(sockaddr(node_a_ip, 30091)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 256];
        for _ in 0..3 {
            s.send(b"dsr-udp").unwrap();
            if let Ok(n) = s.recv(&mut buf) {
                return String::from_utf8_lossy(&buf[..n]).to_string();
            }
        }
        panic!("no UDP answer through DSR");
    });
    assert_eq!(answer, "10.201.1.2|10.210.0.10|dsr-udp");
    let ct_a = maps_a.conntrack().unwrap();
    assert!(
        ct_a.iter().all(|(k, v)| k.dir == ct_dir::FORWARD && v.flags == ct_flags::DSR),
        "{ct_a:?}"
    );
    assert_eq!(ct_a.len(), 4, "one DSR flow per connection (and the UDP flow) on node A");
    let ct_b = maps_b.conntrack().unwrap();
    assert!(
        ct_b.iter().all(|(k, v)| k.dir == ct_dir::REPLY && v.flags == ct_flags::DSR),
        "{ct_b:?}"
    );
    assert_eq!(ct_b.len(), 4, "node B remembers each flow's frontend");
    assert!(ct_b.iter().all(|(_, v)| v.nat_addr_be == u32::from(node_a_ip).to_be()));
    let stats = maps_a.service_stats().unwrap();
    assert_eq!(stats.iter().find(|(i, _)| *i == 1).expect("counted").1.new_conns, 3);
    // (ARP is counted as non-IPv4 and passed, not dropped.)
    let dropped = |m: &ServiceMaps| -> Vec<(u32, u64)> {
        m.drops()
            .unwrap()
            .into_iter()
            .filter(|(r, n)| *n > 0 && *r != drop_reason::NON_IPV4)
            .collect()
    };
    assert_eq!(dropped(&maps_a), vec![], "no drops on A");
    assert_eq!(dropped(&maps_b), vec![], "no drops on B");
}

/// `--nodeport-addresses`: the node's further addresses in the CIDRs serve NodePorts as its
/// address does (local backend with the client's address kept, remote backend SNATed to
/// the node address and translated back); addresses outside them, and every address once
/// the setting is gone, do not (the kernel refuses: nothing listens there).
#[test]
fn nodeport_on_the_addresses_nodeport_addresses_selects() {
    let lab = Lab::new();
    let rig = &lab.rig;
    let extra = Ipv4Addr::new(10, 201, 0, 9);
    rig.node.ip(&["addr", "add", "10.201.0.9/24", "dev", "n0"]);
    // The daemon picks the node's addresses in the CIDRs: not the node address (it always
    // serves NodePorts), not 10.201.1.1 (outside), not loopback.
    let config = ProxyConfig {
        metrics_addr: None,
        nodeport_addresses: vec![skiff_core::cidr::Cidr::parse("10.201.0.0/24").unwrap()],
        ..lab.proxy_config()
    };
    let running =
        in_netns(&rig.node, || skiff_proxy::daemon::start_dataplane(&config).expect("start"));
    assert_eq!(running.maps.node_addresses().unwrap(), vec![extra]);
    drop(running);
    let (mut dp, maps) = lab.load();
    let _attached = attach_nodeport_xdp(&mut dp, rig);
    assert_eq!(maps.node_addresses().unwrap(), vec![extra], "kept in the pinned map");
    let mut running = skiff_proxy::daemon::RunningDataplane { dataplane: dp, maps };
    put_nodeport_services(&mut running.maps);
    for i in 0..3 {
        let data = talk(&rig.client, extra, 30080, &format!("l{i}")).expect("local backend");
        assert_eq!(data, format!("10.201.1.2|10.201.0.2|l{i}"));
        let data = talk(&rig.client, extra, 30081, &format!("r{i}")).unwrap_or_else(|e| {
            dump_state(rig, &running.maps);
            panic!("remote backend through {extra}: {e:?}")
        });
        assert_eq!(data, format!("10.201.1.3|10.201.0.1|r{i}"), "SNAT to the node address");
    }
    assert_eq!(
        talk(&rig.client, NODE_CLIENT_SIDE, 30080, "n").expect("node address"),
        "10.201.1.2|10.201.0.2|n"
    );
    running.maps.set_node_addresses(&[]).unwrap();
    assert_eq!(
        talk(&rig.client, extra, 30080, "gone"),
        Err(std::io::ErrorKind::ConnectionRefused),
        "no NodePort on an address the setting does not name"
    );
}

/// `--cluster-cidr`: a new flow to a ClusterIP through the tc path from outside the pod
/// ranges is SNATed to the node for its remote backend, and the reply is translated back
/// (kube-proxy's masquerade of off-cluster traffic); from inside them, or with no ranges
/// set, the backend sees the client's address.
#[test]
fn clusterip_from_outside_the_cluster_cidr_is_masqueraded() {
    let lab = Lab::new();
    let rig = &lab.rig;
    let (mut dp, mut maps) = lab.load();
    services(&mut maps);
    let _attached = in_netns(&rig.node, || {
        ["n0", "n1"].map(|i| {
            (
                dp.attach_tc(i, TcAttachType::Ingress).expect("tc ingress"),
                dp.attach_tc(i, TcAttachType::Egress).expect("tc egress"),
            )
        })
    });
    let source_of = |maps: &ServiceMaps, tag: &str| {
        let data = talk(&rig.client, VIP, 80, tag).unwrap_or_else(|e| {
            dump_state(rig, maps);
            panic!("{tag}: {e:?}")
        });
        let parts: Vec<&str> = data.split('|').collect();
        assert_eq!(parts.len(), 3, "{data}");
        assert_eq!(parts[2], tag);
        parts[1].to_string()
    };
    // The pod range does not hold the client (10.201.0.2).
    maps.set_cluster_cidrs(&[(Ipv4Addr::new(10, 244, 0, 0), 16)]).unwrap();
    for i in 0..3 {
        assert_eq!(source_of(&maps, &format!("o{i}")), "10.201.0.1", "SNATed to the node address");
    }
    // A pod range holding it: no SNAT.
    maps.set_cluster_cidrs(&[
        (Ipv4Addr::new(10, 244, 0, 0), 16),
        (Ipv4Addr::new(10, 201, 0, 0), 24),
    ])
    .unwrap();
    assert_eq!(source_of(&maps, "in"), "10.201.0.2");
    // None set: sources are left alone.
    maps.set_cluster_cidrs(&[]).unwrap();
    assert_eq!(source_of(&maps, "none"), "10.201.0.2");
}
