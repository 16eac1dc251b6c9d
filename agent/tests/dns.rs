//! Cluster DNS end to end in process: a running `DnsServer` over the in-memory apiserver,
//! queried with hickory's client over UDP and TCP; forwarding to an upstream resolver this
//! test runs itself on 127.0.0.x (never the machine's resolvers); malformed packets,
//! floods and the TCP connection bound.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::tcp::TcpClientStream;
use hickory_net::udp::UdpClientStream;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skiff_agent::dns::{self, DnsConfig, DnsServer};
use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

type DnsClient = Client<TokioRuntimeProvider>;

fn n(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

struct Rig {
    _api: Arc<ApiServer>,
    client: kube::Client,
    server: DnsServer,
}

impl Rig {
    async fn start(config: DnsConfig) -> Rig {
        let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default())
            .await
            .expect("in-process apiserver");
        let client = api.client();
        let server = dns::serve(client.clone(), config).await.expect("DNS server starts");
        tokio::time::timeout(Duration::from_secs(20), server.wait_synced())
            .await
            .expect("DNS cache synced within 20 s");
        Rig { _api: api, client, server }
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addrs()[0]
    }

    async fn create<K>(&self, ns: Option<&str>, obj: serde_json::Value) -> K
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
        K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns.unwrap_or("default"));
        let obj: K = serde_json::from_value(obj).expect("valid object");
        api.create(&PostParams::default(), &obj).await.expect("create")
    }
}

fn config_on(ip: &str) -> DnsConfig {
    DnsConfig::default().with_listen([format!("{ip}:0").parse().unwrap()]).with_upstreams([])
}

async fn udp_client(addr: SocketAddr) -> DnsClient {
    let conn = UdpClientStream::builder(addr, TokioRuntimeProvider::default())
        .with_timeout(Some(Duration::from_secs(3)))
        .build();
    let (client, bg) = DnsClient::from_sender(conn);
    tokio::spawn(bg);
    client
}

async fn tcp_client(addr: SocketAddr) -> DnsClient {
    let (stream, sender) =
        TcpClientStream::new(addr, None, Some(Duration::from_secs(3)), TokioRuntimeProvider::new());
    let (client, bg) = DnsClient::new(stream.await.expect("TCP connect"), sender);
    tokio::spawn(bg);
    client
}

async fn ask(client: &mut DnsClient, name: &str, qtype: RecordType) -> Message {
    let resp = client.query(n(name), DNSClass::IN, qtype).await;
    resp.unwrap_or_else(|e| panic!("query {name} {qtype}: {e}")).into_message()
}

fn addrs(msg: &Message) -> BTreeSet<IpAddr> {
    msg.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn set(ips: &[&str]) -> BTreeSet<IpAddr> {
    ips.iter().map(|s| s.parse().unwrap()).collect()
}

/// Polls `name` until `done` holds for the answer, at most `within`.
async fn until(
    client: &mut DnsClient,
    name: &str,
    qtype: RecordType,
    within: Duration,
    done: impl Fn(&Message) -> bool,
) -> Message {
    let deadline = Instant::now() + within;
    loop {
        let msg = ask(client, name, qtype).await;
        if done(&msg) {
            return msg;
        }
        assert!(Instant::now() < deadline, "{name} {qtype}: still {msg:?} after {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cluster_objects(rig: &Rig) -> IpAddr {
    let _: Namespace = {
        let api: Api<Namespace> = Api::all(rig.client.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap();
        api.create(&PostParams::default(), &ns).await.expect("namespace")
    };
    let web: Service = rig
        .create(
            Some("shop"),
            json!({"metadata": {"name": "web"}, "spec": {"ports": [
                {"name": "http", "port": 80, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"}]}}),
        )
        .await;
    let _: Service = rig
        .create(
            Some("shop"),
            json!({"metadata": {"name": "db"}, "spec": {"clusterIP": "None",
                   "ports": [{"name": "pg", "port": 5432}]}}),
        )
        .await;
    let _: Service = rig
        .create(
            Some("shop"),
            json!({"metadata": {"name": "ext"}, "spec": {"type": "ExternalName",
                   "externalName": "db.example.test"}}),
        )
        .await;
    let _: EndpointSlice = rig
        .create(
            Some("shop"),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "db-abc", "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4",
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "db-0"}},
                {"addresses": ["10.244.1.6"], "hostname": "replica", "conditions": {"ready": true}},
                {"addresses": ["10.244.1.7"], "conditions": {"ready": false}}
            ]}),
        )
        .await;
    let _: Pod = rig
        .create(
            Some("shop"),
            json!({"metadata": {"name": "db-0"}, "spec": {"hostname": "primary", "subdomain": "db",
                   "containers": [{"name": "pg", "image": "skiff.test/tools:1"}]}}),
        )
        .await;
    let pods: Api<Pod> = Api::namespaced(rig.client.clone(), "shop");
    pods.patch_status(
        "db-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}]}})),
    )
    .await
    .expect("pod status");
    web.spec.unwrap().cluster_ip.unwrap().parse().unwrap()
}

async fn check_cluster_records(client: &mut DnsClient, web_ip: IpAddr, transport: &str) {
    let t = transport;
    // A for a ClusterIP service, authoritative, default TTL 5 s.
    let msg = ask(client, "web.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError, "{t}: {msg:?}");
    assert!(msg.metadata.authoritative, "{t}: cluster answers are authoritative");
    assert_eq!(addrs(&msg), BTreeSet::from([web_ip]), "{t}: {msg:?}");
    assert!(msg.answers.iter().all(|r| r.ttl == 5), "{t}: TTL 5: {msg:?}");
    // Names are case-insensitive.
    let msg = ask(client, "WEB.Shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addrs(&msg), BTreeSet::from([web_ip]), "{t}: {msg:?}");
    // SRV for named ports, with the protocol.
    for (port_name, proto, port) in [("http", "tcp", 80), ("dns", "udp", 53)] {
        let msg = ask(
            client,
            &format!("_{port_name}._{proto}.web.shop.svc.cluster.local."),
            RecordType::SRV,
        )
        .await;
        let srv: Vec<_> = msg
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::SRV(s) => Some((s.port, s.target.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(srv, vec![(port, n("web.shop.svc.cluster.local."))], "{t}: {msg:?}");
        assert_eq!(
            msg.additionals.iter().filter(|r| matches!(r.data, RData::A(_))).count(),
            1,
            "{t}: SRV target address in additional section: {msg:?}"
        );
    }
    // Headless: each ready endpoint; not the unready one.
    let msg = ask(client, "db.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addrs(&msg), set(&["10.244.1.5", "10.244.1.6"]), "{t}: {msg:?}");
    // Per-endpoint names: the pod's hostname/subdomain, and the endpoint hostname.
    let msg = ask(client, "primary.db.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addrs(&msg), set(&["10.244.1.5"]), "{t}: {msg:?}");
    let msg = ask(client, "replica.db.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addrs(&msg), set(&["10.244.1.6"]), "{t}: {msg:?}");
    // Headless SRV: one target per ready endpoint, at the endpoint port.
    let msg = ask(client, "_pg._tcp.db.shop.svc.cluster.local.", RecordType::SRV).await;
    let targets: BTreeSet<_> = msg
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some((s.port, s.target.to_ascii())),
            _ => None,
        })
        .collect();
    assert_eq!(
        targets,
        BTreeSet::from([
            (5432, "primary.db.shop.svc.cluster.local.".to_string()),
            (5432, "replica.db.shop.svc.cluster.local.".to_string())
        ]),
        "{t}: {msg:?}"
    );
    // PTR for the service IP and for a pod IP.
    let IpAddr::V4(v4) = web_ip else { panic!("IPv4 service CIDR expected") };
    let o = v4.octets();
    let rev = format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0]);
    let msg = ask(client, &rev, RecordType::PTR).await;
    let ptrs: Vec<_> = msg
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::PTR(p) => Some(p.0.to_ascii()),
            _ => None,
        })
        .collect();
    assert_eq!(ptrs, vec!["web.shop.svc.cluster.local."], "{t}: {msg:?}");
    let msg = ask(client, "5.1.244.10.in-addr.arpa.", RecordType::PTR).await;
    let ptrs: Vec<_> = msg
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::PTR(p) => Some(p.0.to_ascii()),
            _ => None,
        })
        .collect();
    assert_eq!(ptrs, vec!["primary.db.shop.svc.cluster.local."], "{t}: {msg:?}");
    // Pod A record by dashed IP.
    let msg = ask(client, "10-244-1-5.shop.pod.cluster.local.", RecordType::A).await;
    assert_eq!(addrs(&msg), set(&["10.244.1.5"]), "{t}: {msg:?}");
    // Unknown cluster names: NXDOMAIN with the zone's SOA (negative TTL 5 s).
    let msg = ask(client, "nope.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain, "{t}: {msg:?}");
    assert!(
        msg.authorities.iter().any(|r| matches!(&r.data, RData::SOA(s) if s.minimum == 5)),
        "{t}: SOA in authority: {msg:?}"
    );
    // An existing name without that type: NODATA, not NXDOMAIN.
    let msg = ask(client, "web.shop.svc.cluster.local.", RecordType::AAAA).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError, "{t}: {msg:?}");
    assert!(msg.answers.is_empty(), "{t}: {msg:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_records_over_udp_and_tcp_follow_the_watch() {
    let rig = Rig::start(config_on("127.0.0.21")).await;
    let web_ip = cluster_objects(&rig).await;
    let mut udp = udp_client(rig.addr()).await;
    // The objects reach the cache through the watches.
    until(
        &mut udp,
        "primary.db.shop.svc.cluster.local.",
        RecordType::A,
        Duration::from_secs(10),
        |m| !m.answers.is_empty(),
    )
    .await;
    check_cluster_records(&mut udp, web_ip, "UDP").await;
    let mut tcp = tcp_client(rig.addr()).await;
    check_cluster_records(&mut tcp, web_ip, "TCP").await;

    // A deleted service is NXDOMAIN within 1 s.
    let services: Api<Service> = Api::namespaced(rig.client.clone(), "shop");
    services.delete("web", &DeleteParams::default()).await.expect("delete web");
    let deleted = Instant::now();
    until(&mut udp, "web.shop.svc.cluster.local.", RecordType::A, Duration::from_secs(1), |m| {
        m.metadata.response_code == ResponseCode::NXDomain
    })
    .await;
    eprintln!("deleted service NXDOMAIN after {:?}", deleted.elapsed());
    let msg = ask(&mut udp, "_http._tcp.web.shop.svc.cluster.local.", RecordType::SRV).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain, "{msg:?}");

    // An endpoint change shows too: the replica goes unready.
    let slices: Api<EndpointSlice> = Api::namespaced(rig.client.clone(), "shop");
    slices
        .patch(
            "db-abc",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "shop", "name": "db-0"}}]})),
        )
        .await
        .expect("patch slice");
    until(&mut udp, "db.shop.svc.cluster.local.", RecordType::A, Duration::from_secs(1), |m| {
        addrs(m) == set(&["10.244.1.5"])
    })
    .await;
    let msg = ask(&mut udp, "replica.db.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain, "{msg:?}");
    rig.server.shutdown().await;
}

/// A tiny authoritative upstream for `example.test.` on UDP and TCP: `big.` has 100 A
/// records (too big for UDP: answered truncated there), `*.` one A record with TTL 60,
/// anything else NXDOMAIN with a SOA.
struct Upstream {
    addr: SocketAddr,
    udp_queries: Arc<AtomicUsize>,
    tcp_queries: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn upstream_answer(query: &Message) -> Message {
    let mut resp = Message::response(query.metadata.id, OpCode::Query);
    resp.metadata.recursion_desired = query.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    let Some(q) = query.queries.first() else {
        resp.metadata.response_code = ResponseCode::FormErr;
        return resp;
    };
    resp.add_query(q.clone());
    let name = q.name().to_lowercase();
    let zone = n("example.test.");
    if name == n("big.example.test.") && q.query_type() == RecordType::A {
        for i in 0..100u8 {
            resp.add_answer(Record::from_rdata(name.clone(), 60, RData::A(A::new(192, 0, 2, i))));
        }
    } else if zone.zone_of(&name) && name.num_labels() == 3 && name != n("missing.example.test.") {
        if q.query_type() == RecordType::A {
            resp.add_answer(Record::from_rdata(name.clone(), 60, RData::A(A::new(192, 0, 2, 1))));
        }
    } else {
        resp.metadata.response_code = ResponseCode::NXDomain;
        let soa = SOA::new(n("ns.example.test."), n("admin.example.test."), 1, 60, 60, 60, 60);
        resp.add_authority(Record::from_rdata(zone, 60, RData::SOA(soa)));
    }
    resp
}

async fn start_upstream(ip: &str) -> Upstream {
    let udp = UdpSocket::bind(format!("{ip}:0")).await.expect("upstream UDP");
    let addr = udp.local_addr().unwrap();
    let tcp = TcpListener::bind(addr).await.expect("upstream TCP on the same port");
    let (udp_queries, tcp_queries) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let counter = udp_queries.clone();
    let udp_task = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((len, peer)) = udp.recv_from(&mut buf).await else { continue };
            let Ok(query) = Message::from_vec(&buf[..len]) else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let resp = upstream_answer(&query);
            let mut bytes = resp.to_vec().unwrap();
            if bytes.len() > usize::from(query.max_payload()) {
                bytes = resp.truncate().to_vec().unwrap();
            }
            let _ = udp.send_to(&bytes, peer).await;
        }
    });
    let counter = tcp_queries.clone();
    let tcp_task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = tcp.accept().await else { continue };
            let counter = counter.clone();
            tokio::spawn(async move {
                while let Ok(len) = stream.read_u16().await {
                    let mut buf = vec![0u8; usize::from(len)];
                    if stream.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    let Ok(query) = Message::from_vec(&buf) else { return };
                    counter.fetch_add(1, Ordering::SeqCst);
                    let bytes = upstream_answer(&query).to_vec().unwrap();
                    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&bytes);
                    if stream.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Upstream { addr, udp_queries, tcp_queries, tasks: vec![udp_task, tcp_task] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_names_are_forwarded_to_the_upstream_with_a_cache() {
    let upstream = start_upstream("127.0.0.22").await;
    let rig = Rig::start(config_on("127.0.0.23").with_upstreams([upstream.addr])).await;
    cluster_objects(&rig).await;
    let mut udp = udp_client(rig.addr()).await;

    let msg = ask(&mut udp, "www.example.test.", RecordType::A).await;
    assert_eq!(addrs(&msg), set(&["192.0.2.1"]), "{msg:?}");
    assert!(!msg.metadata.authoritative, "forwarded answers are not ours: {msg:?}");
    assert!(msg.metadata.recursion_available);
    assert_eq!(upstream.udp_queries.load(Ordering::SeqCst), 1);
    // Cached: the upstream is not asked again; the TTL counts down from the upstream's.
    let again = ask(&mut udp, "WWW.example.test.", RecordType::A).await;
    assert_eq!(addrs(&again), set(&["192.0.2.1"]), "{again:?}");
    assert_eq!(upstream.udp_queries.load(Ordering::SeqCst), 1, "second answer from the cache");
    assert!(again.answers[0].ttl <= 60);
    assert_eq!(rig.server.forward_cache_len(), 1);

    // NXDOMAIN is relayed.
    let msg = ask(&mut udp, "missing.example.test.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain, "{msg:?}");

    // Too big for UDP upstream: the forwarder retries over TCP; our UDP answer is then
    // truncated (TC) and the TCP answer complete.
    let msg = ask(&mut udp, "big.example.test.", RecordType::A).await;
    assert!(upstream.tcp_queries.load(Ordering::SeqCst) >= 1, "upstream asked over TCP");
    assert!(msg.metadata.truncation, "UDP answer over 1232 bytes is truncated: {msg:?}");
    let mut tcp = tcp_client(rig.addr()).await;
    let msg = ask(&mut tcp, "big.example.test.", RecordType::A).await;
    assert_eq!(addrs(&msg).len(), 100, "{msg:?}");

    // An ExternalName service: the CNAME, then the upstream's answer for its target.
    until(&mut udp, "ext.shop.svc.cluster.local.", RecordType::A, Duration::from_secs(10), |m| {
        !m.answers.is_empty()
    })
    .await;
    let msg = ask(&mut udp, "ext.shop.svc.cluster.local.", RecordType::A).await;
    assert!(
        matches!(&msg.answers[0].data, RData::CNAME(c) if c.0 == n("db.example.test.")),
        "{msg:?}"
    );
    assert_eq!(addrs(&msg), set(&["192.0.2.1"]), "{msg:?}");
    rig.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_or_missing_upstreams_fail_fast() {
    // An upstream that never answers (a bound socket nobody reads).
    let silent = UdpSocket::bind("127.0.0.24:0").await.unwrap();
    let mut config = config_on("127.0.0.25").with_upstreams([silent.local_addr().unwrap()]);
    config.upstream_timeout = Duration::from_millis(300);
    let rig = Rig::start(config).await;
    let mut udp = udp_client(rig.addr()).await;
    let t = Instant::now();
    let msg = ask(&mut udp, "www.example.test.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail, "{msg:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "failed after {:?}", t.elapsed());
    drop(rig);

    // No upstream at all: REFUSED.
    let rig = Rig::start(config_on("127.0.0.25")).await;
    let mut udp = udp_client(rig.addr()).await;
    let msg = ask(&mut udp, "www.example.test.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::Refused, "{msg:?}");
    // Cluster names still answer.
    let msg = ask(&mut udp, "kubernetes.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addrs(&msg).len(), 1, "{msg:?}");
}

async fn raw_exchange(sock: &UdpSocket, server: SocketAddr, packet: &[u8]) -> Option<Message> {
    sock.send_to(packet, server).await.unwrap();
    let mut buf = vec![0u8; 4096];
    match tokio::time::timeout(Duration::from_secs(1), sock.recv_from(&mut buf)).await {
        Ok(Ok((len, _))) => Some(Message::from_vec(&buf[..len]).expect("server answers parse")),
        _ => None,
    }
}

fn query_bytes(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    msg.add_query(Query::query(n(name), qtype));
    msg.set_edns(Edns::new());
    msg.to_vec().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_queries_get_formerr_or_are_dropped_and_floods_stay_bounded() {
    let silent = UdpSocket::bind("127.0.0.26:0").await.unwrap();
    let mut config = config_on("127.0.0.27").with_upstreams([silent.local_addr().unwrap()]);
    config.max_inflight = 4;
    config.max_tcp_connections = 2;
    // Longer than the flood lasts: the 4 forwards admitted first hold their permits.
    config.upstream_timeout = Duration::from_secs(20);
    let rig = Rig::start(config).await;
    let server = rig.addr();
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();

    // Shorter than a header: dropped.
    assert!(raw_exchange(&sock, server, &[1, 2, 3, 4, 5]).await.is_none());
    // A header announcing a question that is not there: FORMERR with the query's ID.
    let mut broken = query_bytes(0x1234, "web.shop.svc.cluster.local.", RecordType::A);
    broken.truncate(20);
    let msg = raw_exchange(&sock, server, &broken).await.expect("FORMERR answer");
    assert_eq!((msg.metadata.id, msg.metadata.response_code), (0x1234, ResponseCode::FormErr));
    // Two questions: FORMERR.
    let mut two = Message::new(7, MessageType::Query, OpCode::Query);
    two.add_query(Query::query(n("a.cluster.local."), RecordType::A));
    two.add_query(Query::query(n("b.cluster.local."), RecordType::A));
    let msg = raw_exchange(&sock, server, &two.to_vec().unwrap()).await.expect("answer");
    assert_eq!(msg.metadata.response_code, ResponseCode::FormErr);
    // A response sent to us: dropped (no reflection).
    let mut resp = Message::new(9, MessageType::Response, OpCode::Query);
    resp.add_query(Query::query(n("a.cluster.local."), RecordType::A));
    assert!(raw_exchange(&sock, server, &resp.to_vec().unwrap()).await.is_none());
    // Another opcode: NOTIMP.
    let mut notify = Message::new(11, MessageType::Query, OpCode::Notify);
    notify.add_query(Query::query(n("cluster.local."), RecordType::SOA));
    let msg = raw_exchange(&sock, server, &notify.to_vec().unwrap()).await.expect("answer");
    assert_eq!(msg.metadata.response_code, ResponseCode::NotImp);

    // A flood: garbage and forwarded names (to an upstream that never answers) far beyond
    // the in-flight bound; the server drops the excess and keeps answering cluster names.
    let flood = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for i in 0..5000u16 {
        let packet = if i % 2 == 0 {
            vec![0xff; usize::from(i % 40)]
        } else {
            query_bytes(i, &format!("n{i}.example.test."), RecordType::A)
        };
        flood.send_to(&packet, server).await.unwrap();
    }
    // The socket buffer may still hold (or drop) the flood: a client retries, as stubs do.
    let deadline = Instant::now() + Duration::from_secs(10);
    let msg = loop {
        let q = query_bytes(77, "kubernetes.default.svc.cluster.local.", RecordType::A);
        if let Some(msg) = raw_exchange(&sock, server, &q).await {
            break msg;
        }
        assert!(Instant::now() < deadline, "cluster name not answered within 10 s of the flood");
    };
    assert_eq!((msg.metadata.id, msg.answers.len()), (77, 1), "{msg:?}");
    let stats = rig.server.stats();
    assert!(stats.overloaded > 0, "forwards beyond the bound were dropped: {stats:?}");
    assert!(stats.forwarded - stats.overloaded <= 4, "at most 4 forwards in flight: {stats:?}");
    assert!(stats.dropped > 0 && stats.formerr > 0, "{stats:?}");

    // TCP: garbage gets FORMERR or a close; connections beyond the bound are closed.
    let mut garbage = TcpStream::connect(server).await.unwrap();
    garbage.write_all(&[0, 14, 1, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 9, 9]).await.unwrap();
    let len = garbage.read_u16().await.expect("FORMERR over TCP");
    let mut buf = vec![0u8; usize::from(len)];
    garbage.read_exact(&mut buf).await.unwrap();
    let msg = Message::from_vec(&buf).unwrap();
    assert_eq!((msg.metadata.id, msg.metadata.response_code), (0x0102, ResponseCode::FormErr));
    let _second = TcpStream::connect(server).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(server).await.unwrap();
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(2), third.read(&mut byte)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "a third connection over the bound of 2 is closed: {closed:?}"
    );
    assert!(rig.server.stats().tcp_refused >= 1);
    drop(garbage);
    // With a slot free again, TCP answers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut tcp = tcp_client(server).await;
    let msg = ask(&mut tcp, "kubernetes.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(msg.answers.len(), 1, "{msg:?}");
}
