//! The node-local DNS address on its dummy link, in a network namespace this test creates:
//! `ensure_listen_address` (idempotent), the server on the default 169.254.20.10:53
//! answering there (also from a "pod" namespace routed through the node), `remove_listen_address`. Needs root (CI is root): fails, not skips,
//! without it.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::udp::UdpClientStream;
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use skiff_agent::dns::{self, DEFAULT_DNS_ADDRESS, DNS_LINK, DnsConfig};
use skiff_apiserver::ApiServer;
use skiff_cni::netns::{NetNs, run_in};
use skiff_store::memory::MemoryStore;

/// A named network namespace, deleted on drop (with everything in it).
struct TestNetns {
    name: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip(8)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl TestNetns {
    fn create(prefix: &str) -> TestNetns {
        let name = format!("{prefix}{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = TestNetns { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip").arg("-n").arg(&self.name).args(args).output().expect("ip(8)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

#[test]
fn listen_address_on_the_dummy_link_serves_port_53() {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1));
    assert_eq!(euid, Some("0"), "this test needs root (CAP_NET_ADMIN, port 53); CI runs as root");
    // The node's namespace, and a "pod" namespace wired to it by a veth pair with a route
    // to the DNS address through the node, as skiff-cni wires pods.
    let netns = TestNetns::create("skiff-dns-n");
    let pod = TestNetns::create("skiff-dns-p");
    ip(&[
        "-n",
        &netns.name,
        "link",
        "add",
        "veth0",
        "type",
        "veth",
        "peer",
        "name",
        "veth1",
        "netns",
        &pod.name,
    ]);
    ip(&["-n", &netns.name, "addr", "add", "10.99.0.1/30", "dev", "veth0"]);
    ip(&["-n", &netns.name, "link", "set", "veth0", "up"]);
    ip(&["-n", &pod.name, "addr", "add", "10.99.0.2/30", "dev", "veth1"]);
    ip(&["-n", &pod.name, "link", "set", "veth1", "up"]);
    ip(&["-n", &pod.name, "route", "add", "169.254.20.10/32", "via", "10.99.0.1"]);
    let ns = NetNs::open(format!("/run/netns/{}", netns.name)).expect("open netns");
    let pod_ns = NetNs::open(format!("/run/netns/{}", pod.name)).expect("open pod netns");
    let pod_sock = run_in(&pod_ns, || std::net::UdpSocket::bind("10.99.0.2:0"))
        .expect("pod netns thread")
        .expect("UDP socket in the pod netns");
    pod_sock.set_nonblocking(true).unwrap();
    let answers = run_in(&ns, || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            dns::ensure_listen_address(DEFAULT_DNS_ADDRESS).await.expect("ensure address");
            dns::ensure_listen_address(DEFAULT_DNS_ADDRESS).await.expect("ensure is idempotent");
            let api =
                ApiServer::start(Arc::new(MemoryStore::new()), Default::default()).await.unwrap();
            let server = dns::serve(api.client(), DnsConfig::default())
                .await
                .expect("serve on 169.254.20.10:53");
            assert_eq!(server.local_addrs(), &["169.254.20.10:53".parse().unwrap()]);
            tokio::time::timeout(Duration::from_secs(20), server.wait_synced())
                .await
                .expect("synced");
            let conn =
                UdpClientStream::builder(server.local_addrs()[0], TokioRuntimeProvider::default())
                    .build();
            let (mut client, bg) = Client::<TokioRuntimeProvider>::from_sender(conn);
            tokio::spawn(bg);
            let name = Name::from_ascii("kubernetes.default.svc.cluster.local.").unwrap();
            let msg = client
                .query(name.clone(), DNSClass::IN, RecordType::A)
                .await
                .expect("answer")
                .into_message();
            // From the pod's namespace, through the veth and the node's routing.
            let pod_sock = tokio::net::UdpSocket::from_std(pod_sock).unwrap();
            let mut query = Message::query();
            query.add_query(Query::query(name, RecordType::A));
            pod_sock.send_to(&query.to_vec().unwrap(), "169.254.20.10:53").await.unwrap();
            let mut buf = vec![0u8; 1500];
            let (len, from) =
                tokio::time::timeout(Duration::from_secs(5), pod_sock.recv_from(&mut buf))
                    .await
                    .expect("answer reaches the pod within 5 s")
                    .unwrap();
            assert_eq!(from, "169.254.20.10:53".parse().unwrap());
            let from_pod = Message::from_vec(&buf[..len]).unwrap();
            assert_eq!(from_pod.answers.len(), 1, "{from_pod:?}");
            server.shutdown().await;
            let link =
                Command::new("ip").args(["-o", "addr", "show", "dev", DNS_LINK]).output().unwrap();
            let link = String::from_utf8_lossy(&link.stdout).into_owned();
            assert!(dns::remove_listen_address().await.expect("remove"), "link existed");
            assert!(
                !dns::remove_listen_address().await.expect("remove again"),
                "removal is idempotent"
            );
            (msg.answers.len(), link)
        })
    })
    .expect("netns thread");
    assert_eq!(answers.0, 1, "kubernetes.default answered on 169.254.20.10:53");
    assert!(answers.1.contains("169.254.20.10/32"), "address on {DNS_LINK}: {}", answers.1);
    let links = netns.ip(&["-o", "link"]);
    assert!(!links.contains(&format!(": {DNS_LINK}:")), "link removed: {links}");
}
