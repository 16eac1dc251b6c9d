//! Masquerade in a lab: a pod reaches an "outside" host beyond its node only with the
//! masquerade rule set, and the outside sees the node's address; pod-to-pod traffic across
//! nodes keeps the pod's address. Needs root, iproute2, nftables (`nft`), busybox.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use common::*;
use skiff_cni::masquerade::Masquerade;
use skiff_cni::netns::{netlink_in, run_in};
use skiff_cni::routes::{self, NodeRoute, RouteConfig};

fn nft_present() {
    let ok =
        Command::new("nft").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(ok, "the nft binary is required (apt-get install nftables)");
}

#[test]
fn pods_reach_outside_the_cluster_masqueraded_and_pods_stay_unmasqueraded() {
    nft_present();
    let mut lab = Lab::new();
    let n1 = Node::bare("10.244.31.0/24");
    let n2 = Node::bare("10.244.32.0/24");
    let outside = Netns::new("o");
    lab.plug(&n1.ns, "10.252.0.1/24");
    lab.plug(&n2.ns, "10.252.0.2/24");
    lab.plug(&outside, "10.252.0.9/24");
    let outside_ip = Ipv4Addr::new(10, 252, 0, 9);
    let (a, b) = (Netns::new("p"), Netns::new("p"));
    let ip_a = result_ip(n1.plugin().add("1.1.0", "ma", &a).ok());
    let ip_b = result_ip(n2.plugin().add("1.1.0", "mb", &b).ok());
    let nodes = vec![
        NodeRoute {
            name: "n1".into(),
            pod_cidr: "10.244.31.0/24".parse().unwrap(),
            internal_ip: "10.252.0.1".parse().unwrap(),
        },
        NodeRoute {
            name: "n2".into(),
            pod_cidr: "10.244.32.0/24".parse().unwrap(),
            internal_ip: "10.252.0.2".parse().unwrap(),
        },
    ];
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for (ns, name) in [(&n1.ns, "n1"), (&n2.ns, "n2")] {
        let plan = routes::desired_routes(&RouteConfig::new(name), &nodes);
        rt.block_on(async {
            routes::apply(&netlink_in(&ns.open()).unwrap(), &plan).await.unwrap()
        });
    }

    // Without masquerade the outside host has no route back to the pod.
    assert!(
        !a.ping(outside_ip),
        "reply without masquerade: the outside host must not know pod routes"
    );

    let masq = Masquerade::new("10.244.0.0/16".parse().unwrap());
    let n1ns = n1.ns.open();
    run_in(&n1ns, || masq.apply()).unwrap().unwrap();
    run_in(&n1ns, || masq.apply()).unwrap().unwrap(); // idempotent
    let rules = n1.ns.exec(&["nft", "list", "table", "ip", "skiff"]);
    assert_eq!(rules.matches("masquerade").count(), 1, "{rules}");

    assert!(a.ping(outside_ip), "pod -> outside with masquerade");
    let peer = tcp_roundtrip(&outside.open(), outside_ip, &a.open()).expect("TCP pod -> outside");
    assert_eq!(
        peer.ip(),
        IpAddr::V4(Ipv4Addr::new(10, 252, 0, 1)),
        "outside must see the node address"
    );
    // Pod to pod across nodes keeps the pod address.
    let peer = tcp_roundtrip(&b.open(), ip_b, &a.open()).expect("TCP pod a -> pod b");
    assert_eq!(peer.ip(), IpAddr::V4(ip_a), "pod-to-pod must not be masqueraded");

    run_in(&n1ns, || masq.remove()).unwrap().unwrap();
    run_in(&n1ns, || masq.remove()).unwrap().unwrap(); // removing twice is fine
    assert!(!n1.ns.exec(&["nft", "list", "tables"]).contains("skiff"));
    assert!(!a.ping(outside_ip), "masquerade removed but traffic still translated");

    n1.plugin().del("1.1.0", "ma", None).ok();
    n2.plugin().del("1.1.0", "mb", None).ok();
}
