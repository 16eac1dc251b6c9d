//! skiff-cni run exactly as libcni runs it (CNI_* variables, config on stdin) against
//! network namespaces the tests create: every command, every spec version, connectivity,
//! parallel ADDs, crashes and invalid input. Needs root, iproute2, nsenter, busybox.

mod common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use common::*;
use serde_json::json;

const VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

#[test]
fn add_check_del_for_every_version() {
    for version in VERSIONS {
        let node = Node::new("10.244.1.0/24", "10.250.0.1");
        let pod = Netns::new("p");
        let p = node.plugin();
        let res = p.add(version, "ctr-a", &pod);
        let result = res.ok().clone();
        assert_eq!(result["cniVersion"], version);
        let ip = result_ip(&result);
        assert!(ip.octets()[..3] == [10, 244, 1], "{ip} not in the podCIDR");
        assert_eq!(result["ips"][0]["gateway"], "169.254.1.1");
        assert_eq!(result["interfaces"][1]["name"], "eth0");
        assert_eq!(result["interfaces"][1]["sandbox"], pod.path().to_str().unwrap());
        assert_eq!(result["ips"][0].get("version").is_some(), version == "0.4.0", "{result}");
        let host_if = result["interfaces"][0]["name"].as_str().unwrap().to_owned();
        assert!(node.ns.links().contains(&host_if));
        assert!(pod.links().contains(&"eth0".to_owned()));
        assert!(pod.exec(&["ip", "-4", "addr", "show", "eth0"]).contains(&format!("{ip}/32")));
        assert!(node.ns.routes().iter().any(|r| r.starts_with(&format!("{ip} dev {host_if}"))));
        assert_eq!(node.allocations(), vec![ip.to_string()]);

        // A repeated ADD returns the same attachment.
        assert_eq!(result_ip(p.add(version, "ctr-a", &pod).ok()), ip);

        assert_eq!(p.check(version, "ctr-a", &pod, &result).ok(), &serde_json::Value::Null);
        assert!(pod.ping(Ipv4Addr::new(10, 250, 0, 1)), "pod cannot reach the node");

        p.del(version, "ctr-a", Some(&pod.path())).ok();
        assert!(!node.ns.links().contains(&host_if), "host veth left after DEL");
        assert!(!pod.links().contains(&"eth0".to_owned()), "pod interface left after DEL");
        assert!(node.allocations().is_empty());
        assert!(!node.ns.routes().iter().any(|r| r.contains(&ip.to_string())));
        // CHECK now fails; DEL again succeeds.
        assert_ne!(p.check(version, "ctr-a", &pod, &result).code, 0);
        p.del(version, "ctr-a", Some(&pod.path())).ok();
    }
}

#[test]
fn mtu_applies_to_both_ends() {
    let node = Node::new("10.244.11.0/24", "10.250.0.1");
    let pod = Netns::new("p");
    let mut cfg = node.config("1.0.0");
    cfg["mtu"] = json!(1400);
    let result = node.plugin().call("ADD", "mtu", "eth0", Some(&pod.path()), &cfg).ok().clone();
    let host_if = result["interfaces"][0]["name"].as_str().unwrap().to_owned();
    assert!(pod.exec(&["ip", "link", "show", "eth0"]).contains("mtu 1400"));
    assert!(node.ns.exec(&["ip", "link", "show", &host_if]).contains("mtu 1400"));
    node.plugin().call("DEL", "mtu", "eth0", Some(&pod.path()), &cfg).ok();
}

#[test]
fn del_tolerates_a_missing_netns_and_missing_everything() {
    for version in VERSIONS {
        let node = Node::new("10.244.2.0/24", "10.250.0.1");
        let pod = Netns::new("p");
        let p = node.plugin();
        p.add(version, "ctr-b", &pod).ok();
        let path = pod.path();
        drop(pod); // the runtime removed the namespace before DEL
        p.del(version, "ctr-b", Some(&path)).ok();
        assert!(node.pod_links().is_empty(), "{:?}", node.pod_links());
        assert!(node.allocations().is_empty());
        p.del(version, "ctr-b", None).ok();
        p.del(version, "never-added", Some(&path)).ok();
    }
}

#[test]
fn version_command() {
    let node = Node::new("10.244.3.0/24", "10.250.0.1");
    for version in VERSIONS {
        let r = node.plugin().raw(
            "VERSION",
            "",
            "",
            None,
            json!({"cniVersion": version}).to_string().as_bytes(),
        );
        let v = r.ok();
        assert_eq!(v["cniVersion"], version);
        assert_eq!(v["supportedVersions"], json!(["0.4.0", "1.0.0", "1.1.0"]));
    }
}

#[test]
fn status_reports_readiness_and_exhaustion() {
    let node = Node::new("10.244.4.0/30", "10.250.0.1");
    let p = node.plugin();
    assert_eq!(
        p.call("STATUS", "", "", None, &node.config("1.1.0")).ok(),
        &serde_json::Value::Null
    );
    assert_eq!(p.call("STATUS", "", "", None, &node.config("1.0.0")).err_code(), 1);
    assert_eq!(p.call("STATUS", "", "", None, &node.config("0.4.0")).err_code(), 1);
    let pods = [Netns::new("p"), Netns::new("p")];
    for (i, pod) in pods.iter().enumerate() {
        p.add("1.1.0", &format!("c{i}"), pod).ok();
    }
    assert_eq!(p.call("STATUS", "", "", None, &node.config("1.1.0")).err_code(), 50);
    // Exhaustion on ADD: try again later, and nothing changes.
    let extra = Netns::new("p");
    let before = (node.allocations(), node.pod_links());
    assert_eq!(p.add("1.1.0", "c9", &extra).err_code(), 11);
    assert_eq!((node.allocations(), node.pod_links()), before);
    assert!(!extra.links().contains(&"eth0".to_owned()));
    for i in 0..2 {
        p.del("1.1.0", &format!("c{i}"), None).ok();
    }
}

#[test]
fn gc_removes_exactly_the_stale_attachments() {
    let node = Node::new("10.244.5.0/24", "10.250.0.1");
    let p = node.plugin();
    let pods: Vec<Netns> = (0..3).map(|_| Netns::new("p")).collect();
    let results: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, ns)| p.add("1.1.0", &format!("g{i}"), ns).ok().clone())
        .collect();
    assert_eq!(p.gc(&[]).code, 0, "GC with an empty list is valid");
    // ...and removed everything: re-add, then GC with two valid attachments.
    assert!(node.allocations().is_empty() && node.pod_links().is_empty());
    let results: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            let _ = &results;
            p.add("1.1.0", &format!("g{i}"), ns).ok().clone()
        })
        .collect();
    p.gc(&[("g0", "eth0"), ("g2", "eth0")]).ok();
    let left: BTreeSet<String> = node.allocations().into_iter().collect();
    let want: BTreeSet<String> =
        [result_ip(&results[0]).to_string(), result_ip(&results[2]).to_string()].into();
    assert_eq!(left, want);
    assert_eq!(node.pod_links().len(), 2);
    assert!(!pods[1].links().contains(&"eth0".to_owned()));
    p.check("1.1.0", "g0", &pods[0], &results[0]).ok();
    p.check("1.1.0", "g2", &pods[2], &results[2]).ok();
    assert_eq!(p.gc(&[]).code, 0);
    assert!(node.allocations().is_empty() && node.pod_links().is_empty());
}

#[test]
fn two_pods_reach_each_other_and_the_node_reaches_both() {
    let node = Node::new("10.244.6.0/24", "10.250.0.1");
    let p = node.plugin();
    let (a, b) = (Netns::new("p"), Netns::new("p"));
    let ip_a = result_ip(p.add("1.1.0", "pod-a", &a).ok());
    let ip_b = result_ip(p.add("1.1.0", "pod-b", &b).ok());
    assert!(a.ping(ip_b), "a -> b ping");
    assert!(b.ping(ip_a), "b -> a ping");
    assert!(node.ns.ping(ip_a) && node.ns.ping(ip_b), "node -> pods ping");
    tcp_roundtrip(&a.open(), ip_a, &b.open()).expect("TCP b -> a");
    tcp_roundtrip(&b.open(), ip_b, &a.open()).expect("TCP a -> b");
    tcp_roundtrip(&a.open(), ip_a, &node.ns.open()).expect("TCP node -> a");
    p.del("1.1.0", "pod-a", Some(&a.path())).ok();
    p.del("1.1.0", "pod-b", Some(&b.path())).ok();
}

#[test]
fn hundred_parallel_adds_then_dels_leak_nothing() {
    let node = Node::new("10.244.7.0/24", "10.250.0.1");
    let pods: Vec<Netns> = (0..100).map(|_| Netns::new("q")).collect();
    let routes_before = node.ns.routes();
    let ips: Vec<Ipv4Addr> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let node = &node;
                s.spawn(move || {
                    result_ip(node.plugin().add("1.1.0", &format!("par-{i}"), pod).ok())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let unique: BTreeSet<_> = ips.iter().collect();
    assert_eq!(unique.len(), 100, "duplicate addresses handed out");
    assert_eq!(node.allocations().len(), 100);
    assert_eq!(node.pod_links().len(), 100);
    for ip in &ips {
        assert!(node.ns.ping(*ip), "node cannot reach {ip}");
    }
    assert!(pods[0].ping(ips[99]) && pods[99].ping(ips[0]), "pod to pod");
    std::thread::scope(|s| {
        for (i, pod) in pods.iter().enumerate() {
            let node = &node;
            s.spawn(move || {
                node.plugin().del("1.1.0", &format!("par-{i}"), Some(&pod.path())).ok().clone()
            });
        }
    });
    assert!(node.allocations().is_empty(), "leaked allocations: {:?}", node.allocations());
    assert!(node.pod_links().is_empty(), "leaked links: {:?}", node.pod_links());
    assert_eq!(node.ns.routes(), routes_before, "leaked routes");
    for pod in &pods {
        assert!(!pod.links().contains(&"eth0".to_owned()));
    }
}

#[test]
fn a_plugin_killed_during_add_leaves_nothing_gc_does_not_clean() {
    let node = Node::new("10.244.8.0/24", "10.250.0.1");
    let routes_before = node.ns.routes();
    let pods: Vec<Netns> = (0..12).map(|_| Netns::new("k")).collect();
    for (i, pod) in pods.iter().enumerate() {
        let cfg = node.config("1.1.0").to_string();
        let mut cmd =
            plugin_command(&node.ns, "ADD", &format!("kill-{i}"), "eth0", Some(&pod.path()));
        // Kill at spread-out points: before, during and after the netlink work.
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(cfg.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_micros(500 * (i as u64 * i as u64)));
        let _ = child.kill();
        let _ = child.wait();
    }
    // One killed deterministically half way: after the veth exists, before it is configured.
    let pod = Netns::new("k");
    let mut cmd = plugin_command(&node.ns, "ADD", "kill-hang", "eth0", Some(&pod.path()));
    cmd.env("SKIFF_CNI_TEST_HANG_AFTER", "veth");
    let mut child = cmd.spawn().unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(node.config("1.1.0").to_string().as_bytes()).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !node.pod_links().iter().any(|l| l.starts_with("sk")) {
        assert!(std::time::Instant::now() < deadline, "the plugin never created the veth");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!node.allocations().is_empty(), "the hung ADD should have allocated");

    node.plugin().gc(&[]).ok();
    assert!(node.allocations().is_empty(), "{:?}", node.allocations());
    assert!(node.pod_links().is_empty(), "{:?}", node.pod_links());
    assert_eq!(node.ns.routes(), routes_before);
    for pod in &pods {
        assert!(!pod.links().contains(&"eth0".to_owned()));
    }
}

#[test]
fn invalid_input_returns_the_right_code_and_changes_nothing() {
    let node = Node::new("10.244.9.0/24", "10.250.0.1");
    let pod = Netns::new("p");
    let p = node.plugin();
    let base = node.config("1.0.0");
    let with = |k: &str, v: serde_json::Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    let without = |k: &str| {
        let mut c = base.clone();
        c.as_object_mut().unwrap().remove(k);
        c
    };
    let links_before = node.ns.links();
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("bad JSON", b"{\"cniVersion\": \"1.0.0\", ".to_vec(), 6),
        ("empty stdin", b"".to_vec(), 6),
        ("missing podCIDR", without("podCIDR").to_string().into_bytes(), 7),
        ("unparsable podCIDR", with("podCIDR", json!("10.244.9.0/40")).to_string().into_bytes(), 7),
        ("podCIDR not a CIDR", with("podCIDR", json!("banana")).to_string().into_bytes(), 7),
        ("missing name", without("name").to_string().into_bytes(), 7),
        ("wrong type", with("type", json!("bridge")).to_string().into_bytes(), 7),
        ("bad mtu", with("mtu", json!(12)).to_string().into_bytes(), 7),
        ("unsupported version", with("cniVersion", json!("0.3.1")).to_string().into_bytes(), 1),
        ("future version", with("cniVersion", json!("9.0.0")).to_string().into_bytes(), 1),
    ];
    for (what, stdin, code) in cases {
        for cmd in ["ADD", "DEL", "CHECK"] {
            let r = p.raw(cmd, "inv", "eth0", Some(&pod.path()), &stdin);
            assert_eq!(r.err_code(), code, "{what} / {cmd}: {}", r.json);
            assert!(r.json["msg"].is_string(), "{what}: error without msg");
        }
        assert!(node.allocations().is_empty(), "{what} allocated");
        assert_eq!(node.ns.links(), links_before, "{what} changed links");
        assert_eq!(pod.links(), vec!["lo".to_owned()], "{what} changed the pod");
    }
    // Environment errors are code 4.
    let r = p.call("ADD", "", "eth0", Some(&pod.path()), &base);
    assert_eq!(r.err_code(), 4);
    let r = p.call("ADD", "inv", "eth0", None, &base);
    assert_eq!(r.err_code(), 4);
    let r = p.call("FROB", "inv", "eth0", Some(&pod.path()), &base);
    assert_eq!(r.err_code(), 4);
    // CHECK without prevResult is an invalid config.
    assert_eq!(p.call("CHECK", "inv", "eth0", Some(&pod.path()), &base).err_code(), 7);
    // ADD into a namespace that does not exist fails and leaves nothing.
    let r = p.call(
        "ADD",
        "inv",
        "eth0",
        Some(std::path::Path::new("/run/netns/skc-does-not-exist")),
        &base,
    );
    assert_ne!(r.code, 0);
    assert!(node.allocations().is_empty());
    assert_eq!(node.ns.links(), links_before);
}

#[test]
fn failed_add_rolls_back() {
    // The pod already has an eth0 that is not ours: ADD fails before touching anything.
    let node = Node::new("10.244.10.0/24", "10.250.0.1");
    let pod = Netns::new("p");
    pod.exec(&["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]);
    let r = node.plugin().add("1.0.0", "rb", &pod);
    assert_ne!(r.code, 0);
    assert!(node.allocations().is_empty());
    assert!(node.pod_links().is_empty());

    // Failures injected after each step: the rollback guard removes links and allocation.
    let routes_before = node.ns.routes();
    for step in ["allocate", "veth", "pod"] {
        let pod = Netns::new("p");
        let mut cmd = plugin_command(&node.ns, "ADD", "rb2", "eth0", Some(&pod.path()));
        cmd.env("SKIFF_CNI_TEST_FAIL_AFTER", step);
        let r = finish(cmd.spawn().unwrap(), node.config("1.1.0").to_string().as_bytes());
        assert_eq!(r.code, 1, "{step}: {}", r.json);
        assert!(node.allocations().is_empty(), "{step}: allocation left");
        assert!(node.pod_links().is_empty(), "{step}: links left {:?}", node.pod_links());
        assert_eq!(pod.links(), vec!["lo".to_owned()], "{step}: pod changed");
        assert_eq!(node.ns.routes(), routes_before, "{step}: routes left");
    }
}
