//! The route library between two "nodes" (network namespaces on a lab bridge): pods on one
//! reach pods on the other in host-gw and in VXLAN mode; stale routes go away; the
//! `unreachable` guards answer for what is not routed. Needs root, iproute2, busybox.

mod common;

use std::net::Ipv4Addr;

use common::*;
use skiff_cni::netns::netlink_in;
use skiff_cni::routes::{self, Mode, NodeRoute, RouteConfig, RoutePlan};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn apply(node: &Netns, plan: &RoutePlan) -> routes::ApplyReport {
    rt().block_on(async {
        let h = netlink_in(&node.open()).unwrap();
        routes::apply(&h, plan).await.unwrap()
    })
}

fn remove_all(node: &Netns) {
    rt().block_on(async {
        let h = netlink_in(&node.open()).unwrap();
        routes::remove_all(&h, &routes::VxlanConfig::default()).await.unwrap()
    })
}

fn node_route(name: &str, cidr: &str, ip: &str) -> NodeRoute {
    NodeRoute {
        name: name.into(),
        pod_cidr: cidr.parse().unwrap(),
        internal_ip: ip.parse().unwrap(),
    }
}

fn config(local: &str, mode: Mode) -> RouteConfig {
    RouteConfig::new(local)
        .cluster_cidr("10.244.0.0/16".parse().unwrap())
        .service_cidr("10.96.0.0/12".parse().unwrap())
        .mode(mode)
}

fn cross_node(mode: Mode) {
    let mut lab = Lab::new();
    let n1 = Node::bare("10.244.21.0/24");
    let n2 = Node::bare("10.244.22.0/24");
    lab.plug(&n1.ns, "10.251.0.1/24");
    lab.plug(&n2.ns, "10.251.0.2/24");
    let nodes = vec![
        node_route("n1", "10.244.21.0/24", "10.251.0.1"),
        node_route("n2", "10.244.22.0/24", "10.251.0.2"),
    ];
    let (a, b) = (Netns::new("p"), Netns::new("p"));
    let ip_a = result_ip(n1.plugin().add("1.1.0", "xa", &a).ok());
    let ip_b = result_ip(n2.plugin().add("1.1.0", "xb", &b).ok());

    let plan1 = routes::desired_routes(&config("n1", mode.clone()), &nodes);
    let plan2 = routes::desired_routes(&config("n2", mode.clone()), &nodes);
    assert_eq!(apply(&n1.ns, &plan1).installed, 3);
    // n2 goes through `sync` (plan + apply in one call), as the agent does.
    let report = rt().block_on(async {
        let h = netlink_in(&n2.ns.open()).unwrap();
        routes::sync(&h, &config("n2", mode.clone()), &nodes).await.unwrap()
    });
    assert_eq!(report.installed, plan2.routes.len());
    let r1 = n1.ns.routes();
    match mode {
        Mode::HostGw => assert!(
            r1.iter().any(|r| r.starts_with("10.244.22.0/24 via 10.251.0.2 dev lab0")),
            "{r1:?}"
        ),
        _ => {
            assert!(
                r1.iter().any(|r| r.starts_with("10.244.22.0/24 via 10.244.22.0 dev skiff.vxlan")),
                "{r1:?}"
            );
            let link = n1.ns.exec(&["ip", "-d", "link", "show", "skiff.vxlan"]);
            assert!(link.contains("vxlan id 1") && link.contains("local 10.251.0.1"), "{link}");
        }
    }
    assert!(r1.iter().any(|r| r.starts_with("unreachable 10.244.0.0/16")), "{r1:?}");
    assert!(r1.iter().any(|r| r.starts_with("unreachable 10.96.0.0/12")), "{r1:?}");

    assert!(a.ping(ip_b), "pod a -> pod b across nodes ({mode:?})");
    assert!(b.ping(ip_a), "pod b -> pod a across nodes ({mode:?})");
    assert!(n1.ns.ping(ip_b), "node 1 -> pod b ({mode:?})");
    tcp_roundtrip(&b.open(), ip_b, &a.open()).expect("TCP a -> b across nodes");

    // Applying the same plan again changes nothing.
    let again = apply(&n1.ns, &plan1);
    assert!(again.removed.is_empty());
    assert_eq!(n1.ns.routes(), r1);

    // n2 leaves: its route (and VTEP entries) go, the guard answers for its CIDR.
    let report = apply(&n1.ns, &routes::desired_routes(&config("n1", mode.clone()), &nodes[..1]));
    assert_eq!(report.removed, vec!["10.244.22.0/24".parse().unwrap()]);
    assert!(!n1.ns.routes().iter().any(|r| r.starts_with("10.244.22.0/24")));
    let get = n1.ns.command(&["ip", "route", "get", "10.244.22.9"]).output().unwrap();
    assert!(!get.status.success() || String::from_utf8_lossy(&get.stdout).contains("unreachable"));
    assert!(!a.ping(ip_b), "pod b still reachable after its node left");
    assert!(!n1.ns.exists_link("skiff.vxlan"), "the VXLAN device outlived its last user");
    // The service CIDR never leaves the node either.
    assert!(!a.ping(Ipv4Addr::new(10, 96, 0, 10)));

    remove_all(&n1.ns);
    remove_all(&n2.ns);
    assert!(
        !n1.ns.routes().iter().any(|r| r.contains("unreachable") || r.starts_with("10.244.22."))
    );
    assert!(!n2.ns.exists_link("skiff.vxlan"));
    n1.plugin().del("1.1.0", "xa", None).ok();
    n2.plugin().del("1.1.0", "xb", None).ok();
}

#[test]
fn pods_reach_across_nodes_host_gw() {
    cross_node(Mode::HostGw);
}

#[test]
fn pods_reach_across_nodes_vxlan() {
    cross_node(Mode::Vxlan);
}

#[test]
fn auto_mode_on_one_segment_is_host_gw() {
    let nodes = vec![
        node_route("n1", "10.244.21.0/24", "10.251.0.1"),
        node_route("n2", "10.244.22.0/24", "10.251.0.2"),
    ];
    let plan = routes::desired_routes(
        &config("n1", Mode::Auto { node_subnet: "10.251.0.0/24".parse().unwrap() }),
        &nodes,
    );
    assert!(plan.vxlan.is_none());
    assert!(matches!(plan.routes[0].kind, routes::RouteKind::Via { .. }));
}
