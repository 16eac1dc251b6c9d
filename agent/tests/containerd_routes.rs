//! Two real nodes on one lab segment: `network::run_routes_in` (the Node watch against an
//! in-process apiserver, skiff-cni's route library underneath) installs the cross-node
//! routes, and a pod on one node fetches HTTP from a pod on the other. Needs what
//! tests/containerd.rs needs.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use kube::api::{ObjectMeta, PostParams};
use skiff_agent::images::TOOLS_IMAGE;
use skiff_agent::network;
use skiff_agent::runtime::{Runtime, api};
use skiff_agent::testing::{Lab, NodeRig, NodeRigConfig};
use skiff_apiserver::ApiServer;
use skiff_store::memory::MemoryStore;

fn node(name: &str, cidr: &str, ip: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { pod_cidr: Some(cidr.into()), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
            ..Default::default()
        }),
    }
}

fn pid_ns_per_container() -> Option<api::LinuxContainerConfig> {
    Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            namespace_options: Some(api::NamespaceOption {
                pid: api::NamespaceMode::Container as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Runs a pod with one tools container running `script`; returns (pod IP, container id).
async fn pod(rig: &NodeRig, name: &str, script: &str) -> (Ipv4Addr, String) {
    let cri = rig.runtime().await.unwrap();
    let sb_config = rig.sandbox_config("default", name, &format!("uid-{name}"));
    let sb = cri
        .run_pod_sandbox(sb_config.clone())
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}\n{}", rig.containerd_log()));
    let ip = cri.pod_sandbox_status(&sb).await.unwrap().network.unwrap().ip.parse().unwrap();
    let config = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: TOOLS_IMAGE.into(), ..Default::default() }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        linux: pid_ns_per_container(),
        labels: HashMap::new(),
        ..Default::default()
    };
    let ct = cri.create_container(&sb, config, &sb_config).await.unwrap();
    cri.start_container(&ct).await.unwrap();
    (ip, ct)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_nodes_talk_through_routes_from_the_node_watch() {
    let lab = Lab::new("10.250.210.0/24".parse().unwrap()).unwrap();
    let (a, b) = tokio::join!(
        NodeRig::start(
            NodeRigConfig::default()
                .pod_cidr("10.244.210.0/24".parse().unwrap())
                .node_ip(Ipv4Addr::new(10, 250, 210, 1))
                .lab(&lab)
        ),
        NodeRig::start(
            NodeRigConfig::default()
                .pod_cidr("10.244.211.0/24".parse().unwrap())
                .node_ip(Ipv4Addr::new(10, 250, 210, 2))
                .lab(&lab)
        ),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    // The nodes reach each other on the lab segment, and the host joined to it.
    a.exec(&["busybox", "ping", "-c", "1", "-W", "2", "10.250.210.2"]).expect("lab segment");
    let host_link = lab.connect_host(Ipv4Addr::new(10, 250, 210, 254)).unwrap();
    b.exec(&["busybox", "ping", "-c", "1", "-W", "2", "10.250.210.254"]).expect("host on the lab");

    let api = ApiServer::start(Arc::new(MemoryStore::new()), Default::default()).await.unwrap();
    let client = api.client();
    let nodes = kube::Api::<Node>::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("a", "10.244.210.0/24", "10.250.210.1"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("b", "10.244.211.0/24", "10.250.210.2"))
        .await
        .unwrap();
    let cfg = skiff_cni::routes::RouteConfig::new("ignored");
    let routes_a = tokio::spawn({
        let (client, cfg, ns) = (client.clone(), cfg.clone(), a.netns_path());
        async move { network::run_routes_in(client, "a", cfg, Some(&ns)).await }
    });
    let routes_b = tokio::spawn({
        let (client, cfg, ns) = (client.clone(), cfg.clone(), b.netns_path());
        async move { network::run_routes_in(client, "b", cfg, Some(&ns)).await }
    });

    let (ip_b, _) =
        pod(&b, "server", "echo from-b > /index.html && exec httpd -f -p 8080 -h /").await;
    let (_, ct_a) = pod(&a, "client", "exec sleep 3600").await;
    let cri_a = a.runtime().await.unwrap();
    let url = format!("http://{ip_b}:8080/index.html");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = cri_a
            .exec_sync(
                &ct_a,
                vec!["wget".into(), "-q".into(), "-O".into(), "-".into(), url.clone()],
                5,
            )
            .await
            .unwrap();
        if r.exit_code == 0 {
            assert_eq!(r.stdout, b"from-b\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pod on a cannot reach {url}: {r:?}\nroutes on a: {:?}",
            a.exec(&["ip", "route"])
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let on_a = a.exec(&["ip", "route", "show", "proto", "83"]).unwrap();
    assert!(on_a.contains("10.244.211.0/24 via 10.250.210.2"), "{on_a}");

    // A node leaving the list takes its route along.
    nodes.delete("b", &Default::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.exec(&["ip", "route", "show", "proto", "83"]).unwrap().contains("10.244.211.0/24 via") {
        assert!(Instant::now() < deadline, "route to b's pods outlived node b");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    routes_a.abort();
    routes_b.abort();
    drop((a, b));
    drop(lab);
    let links = std::process::Command::new("ip").args(["-o", "link"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&links.stdout).contains(&host_link),
        "{host_link} outlived the lab"
    );
}
