//! The data plane installed as users install it: a 2-node lab whose agents, joined as their
//! nodes, run without the in-process proxy (`cargo xtask up --proxy daemonset --join`),
//! `deploy/proxy` applied with real kubectl 1.33 (`apply -k`) from the skiff/proxy image
//! built from the binaries under test.
//! Services, NodePorts and DNS work; then, under continuous requests to a ClusterIP (from a
//! pod) and to a NodePort (from outside the nodes), with long-lived connections open through
//! both, the proxy DaemonSet is restarted (`kubectl rollout restart`), one proxy pod is
//! deleted, and the DaemonSet is upgraded to a new image tag: no request fails, no
//! connection is cut, because forwarding runs from the pinned maps and links in the kernel
//! while no proxy runs, and the next proxy pod adopts them.
//!
//! Needs root, containerd, runc, busybox-static, kubectl 1.33 and the workspace binaries
//! (`cargo build --workspace --bins`): a missing one fails the test with its name.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skiff_agent::images;
use skiff_agent::lab::{LabConfig, ProxyMode, proxy};
use skiff_tests::Kubectl;
use skiff_tests::lab::{self, Lab, PodInfo, bin_dir, wait_for};

const NS: &str = "pd";
const LAB_SUBNET: &str = "10.254.0.0/24";
/// Lines each long-lived connection receives, one every half second (40 s in all).
const STREAM_LINES: usize = 80;
/// How long each disruption's request loops run.
const LOAD_SECS: u32 = 45;

fn workload() -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 2
      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
          labelSelector: {{matchLabels: {{app: web}}}}}}
      containers:
      - name: httpd
        image: skiff.test/tools:1
        imagePullPolicy: Never
        command: ["sh", "-c", "echo $HOSTNAME > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"]
        ports: [{{containerPort: 8080}}]
        readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NS}}}
spec:
  type: NodePort
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080, nodePort: 30080}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: stream, namespace: {NS}, labels: {{app: stream}}}}
spec:
  nodeName: node-2
  terminationGracePeriodSeconds: 1
  containers:
  - name: nc
    image: skiff.test/tools:1
    imagePullPolicy: Never
    # Every connection gets {STREAM_LINES} lines, one each half second, then is closed.
    command: ["sh", "-c", "printf '#!/bin/sh\ni=0; while [ $i -lt {STREAM_LINES} ]; do echo line$i; i=$((i+1)); sleep 0.5; done\n' > /tmp/s.sh; chmod +x /tmp/s.sh; exec nc -ll -p 9000 -e /tmp/s.sh"]
    ports: [{{containerPort: 9000}}]
    readinessProbe: {{tcpSocket: {{port: 9000}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: stream, namespace: {NS}}}
spec:
  type: NodePort
  selector: {{app: stream}}
  ports: [{{port: 9000, targetPort: 9000, nodePort: 30090}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {NS}, labels: {{app: client}}}}
spec:
  nodeName: node-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: sh
    image: skiff.test/tools:1
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
"#
    )
}

fn proxies(k: &Kubectl) -> Vec<PodInfo> {
    lab::pods(k, proxy::NAMESPACE, "k8s-app=skiff-proxy")
}

fn kubectl_ok(k: &Kubectl, args: &[&str], stdin: Option<&str>) -> String {
    let out = k.run(args, stdin);
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Requests and connections running while a disruption happens.
struct Traffic {
    cluster_ip: std::thread::JoinHandle<(u64, u64)>,
    node_port: std::thread::JoinHandle<(u64, u64)>,
    streams: Vec<(&'static str, std::thread::JoinHandle<String>)>,
}

impl Traffic {
    fn start(lab: &Lab, k: &Kubectl, web_ip: &str, stream_ip: &str) -> Traffic {
        let cluster_ip = lab::load(k, NS, "client", &format!("http://{web_ip}/"), LOAD_SECS);
        // From outside the nodes, alternating between the two nodes' NodePorts.
        let urls: Vec<String> =
            lab.state.nodes.iter().map(|n| format!("http://{}:30080/", n.ip)).collect();
        let mut cmds: Vec<Command> = urls
            .iter()
            .map(|u| {
                let mut c = lab.state.outside_command(&[
                    "timeout",
                    "3",
                    "/bin/busybox",
                    "wget",
                    "-q",
                    "-O",
                    "/dev/null",
                    u,
                ]);
                c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
                c
            })
            .collect();
        let node_port = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(LOAD_SECS as u64);
            let (mut ok, mut fail) = (0, 0);
            let mut i = 0;
            while Instant::now() < end {
                let n = cmds.len();
                match cmds[i % n].status() {
                    Ok(s) if s.success() => ok += 1,
                    _ => fail += 1,
                }
                i += 1;
            }
            (ok, fail)
        });
        // A connection through the ClusterIP from the client pod (socket LB), and one
        // through node-1's NodePort from outside (XDP/tc NAT, to the backend on node-2).
        let mut in_pod = Command::new("timeout");
        in_pod
            .arg("120")
            .arg(&k.bin)
            .arg("--kubeconfig")
            .arg(&k.kubeconfig)
            .args(["-n", NS, "exec", "client", "--", "sh", "-c"])
            .arg(format!("nc {stream_ip} 9000 </dev/null"))
            .stdin(Stdio::null());
        let node1 = lab.state.nodes[0].ip.to_string();
        let mut outside =
            lab.state.outside_command(&["timeout", "120", "/bin/busybox", "nc", &node1, "30090"]);
        outside.stdin(Stdio::null());
        let run = |mut c: Command| {
            std::thread::spawn(move || {
                let out = c.output().expect("nc");
                String::from_utf8_lossy(&out.stdout).into_owned()
            })
        };
        let streams = vec![("ClusterIP", run(in_pod)), ("NodePort", run(outside))];
        // The connections are open before anything is disrupted.
        std::thread::sleep(Duration::from_secs(2));
        Traffic { cluster_ip, node_port, streams }
    }

    /// Joins everything: (ok, failed) through the ClusterIP and the NodePort, and the lines
    /// each held connection got (by the way it went).
    fn finish(self) -> TrafficResult {
        let cluster_ip = self.cluster_ip.join().expect("ClusterIP load");
        let node_port = self.node_port.join().expect("NodePort load");
        let streams = self
            .streams
            .into_iter()
            .map(|(via, t)| {
                let text = t.join().expect("stream");
                let complete = text.lines().count() == STREAM_LINES
                    && text.lines().last() == Some(format!("line{}", STREAM_LINES - 1).as_str());
                (via, text.lines().count(), complete)
            })
            .collect();
        TrafficResult { cluster_ip, node_port, streams }
    }

    /// Joins everything and asserts nothing failed.
    fn check(self, what: &str) {
        let r = self.finish();
        let (ok, fail) = r.cluster_ip;
        eprintln!("pd: {what}: ClusterIP {ok} ok, {fail} failed");
        assert!(ok > 0 && fail == 0, "{what}: ClusterIP requests failed: {ok} ok, {fail} failed");
        let (ok, fail) = r.node_port;
        eprintln!("pd: {what}: NodePort {ok} ok, {fail} failed");
        assert!(ok > 0 && fail == 0, "{what}: NodePort requests failed: {ok} ok, {fail} failed");
        for (via, lines, complete) in r.streams {
            assert!(
                complete,
                "{what}: the connection through the {via} was cut after {lines} lines"
            );
        }
    }
}

struct TrafficResult {
    cluster_ip: (u64, u64),
    node_port: (u64, u64),
    streams: Vec<(&'static str, usize, bool)>,
}

/// Waits until each of the `nodes` runs one Ready proxy pod, none of them one of `gone`, with
/// `image` when given; returns the pods.
fn replaced(k: &Kubectl, nodes: usize, gone: &[PodInfo], image: Option<&str>) -> Vec<PodInfo> {
    wait_for("the proxy pods replaced and Ready", Duration::from_secs(120), || {
        let now = proxies(k);
        (now.len() == nodes
            && now.iter().all(|p| {
                p.ready
                    && p.phase == "Running"
                    && !gone.iter().any(|o| o.uid == p.uid)
                    && image.is_none_or(|i| p.image == i)
            }))
        .then_some(now)
    })
}

#[test]
fn the_data_plane_as_a_daemonset_survives_restart_delete_and_upgrade() {
    let lab = Lab::start(
        "pd",
        LabConfig {
            nodes: 2,
            subnet: LAB_SUBNET.parse().expect("subnet"),
            ready_timeout: Duration::from_secs(120),
            proxy: ProxyMode::Daemonset,
            // As on real machines: the agents run as their nodes (the proxy pods' tokens,
            // ConfigMap and image through the Node authorizer).
            join: true,
            ..Default::default()
        },
    );
    let k = lab.kubectl();

    // 1. Installed from deploy/: a Ready proxy per node, skiff-cni and its conflist put on
    // each node by the init container (the lab installed only `loopback`), the agents
    // without a proxy.
    let first = lab::ready_pods(&k, proxy::NAMESPACE, "k8s-app=skiff-proxy", 2);
    let version = env!("CARGO_PKG_VERSION");
    for p in &first {
        assert_eq!(p.image, format!("skiff/proxy:{version}"));
        assert_eq!(p.restarts, 0, "{p:?}");
    }
    for n in &lab.state.nodes {
        let cni = n.containerd_dir.join("cni/bin/skiff-cni");
        assert!(cni.is_file(), "{} has no skiff-cni from the init container", n.name);
        // The init container's conflist names the node file (the agent, --no-install-cni,
        // writes no conflist of its own, only the node file with its pod CIDR).
        let conflist = n.containerd_dir.join("cni/net.d/10-skiff.conflist");
        let list: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&conflist).expect("conflist")).expect("json");
        let entry = &list["plugins"][0];
        assert_eq!(entry["nodeConfig"], n.cni_node_config().to_string_lossy().as_ref(), "{list}");
        assert!(entry.get("podCIDR").is_none(), "not the agent's conflist: {list}");
        let node: serde_json::Value =
            serde_json::from_slice(&std::fs::read(n.cni_node_config()).expect("node file"))
                .expect("json");
        assert!(node["podCIDR"].as_str().is_some_and(|c| c.starts_with("10.244.")), "{node}");
    }
    for p in &first {
        // The init container put the plugin there (the agents run --no-install-cni)...
        let init =
            kubectl_ok(&k, &["-n", proxy::NAMESPACE, "logs", &p.name, "-c", "install-cni"], None);
        assert!(init.contains("skiff-cni: installed /host/"), "{}: {init:?}", p.name);
        assert!(init.contains("skiff-cni: wrote /host/"), "{}: {init:?}", p.name);
        // ... and the pod attached the socket-LB hooks itself: nothing ran a proxy before.
        let log =
            kubectl_ok(&k, &["-n", proxy::NAMESPACE, "logs", &p.name, "-c", "skiff-proxy"], None);
        assert!(log.contains("newly_attached=4"), "{}: {log}", p.name);
    }

    // 2. Services, NodePorts and DNS as with the in-process proxy.
    kubectl_ok(&k, &["apply", "-f", "-"], Some(&workload()));
    let web = lab::ready_pods(&k, NS, "app=web", 2);
    lab::ready_pods(&k, NS, "app=stream", 1);
    lab::ready_pods(&k, NS, "app=client", 1);
    let names: std::collections::BTreeSet<String> = web.iter().map(|p| p.name.clone()).collect();
    let web_ip =
        kubectl_ok(&k, &["-n", NS, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"], None);
    let stream_ip = kubectl_ok(
        &k,
        &["-n", NS, "get", "svc", "stream", "-o", "jsonpath={.spec.clusterIP}"],
        None,
    );
    let bodies = wait_for("the ClusterIP answering", Duration::from_secs(20), || {
        let b = lab::hits(&k, NS, "client", &format!("http://{web_ip}/"), 20);
        (!b.iter().any(|l| l == "FAIL")).then_some(b)
    });
    let seen: std::collections::BTreeSet<String> = bodies.into_iter().collect();
    assert_eq!(seen, names, "the ClusterIP spreads over both backends");
    let by_name = lab::hits(&k, NS, "client", &format!("http://web.{NS}.svc.cluster.local/"), 3);
    assert!(by_name.iter().all(|b| names.contains(b)), "by DNS name: {by_name:?}");
    // The agent's own /healthz and /metrics (kubelet names), on the node's loopback.
    let node_get = |node: &str, url: &str| {
        let out = lab
            .state
            .node_command(node, &["timeout", "3", "/bin/busybox", "wget", "-q", "-O-", url])
            .expect("node")
            .stdin(Stdio::null())
            .output()
            .expect("wget on the node");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(node_get("node-1", "http://127.0.0.1:10248/healthz"), "ok");
    let metrics = node_get("node-1", "http://127.0.0.1:10248/metrics");
    let value = |line_start: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{line_start} missing from the agent's metrics:\n{metrics}"))
    };
    assert!(value("kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"}") >= 2.0);
    assert!(
        value(
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"create_container\"}"
        ) >= 2.0
    );
    assert!(
        value("kubelet_pod_start_duration_seconds_count") >= 2.0,
        "web and client started here"
    );
    assert!(value("skiff_dns_requests_total{result=\"local\"}") >= 1.0, "the lookups by name");

    // A process of the node itself (not in a pod) reaches the ClusterIP, as with kube-proxy.
    for n in &lab.state.nodes {
        let out = lab
            .state
            .node_command(&n.name, &["timeout", "3", "/bin/busybox", "wget", "-q", "-O-"])
            .expect("node")
            .arg(format!("http://{web_ip}/"))
            .stdin(Stdio::null())
            .output()
            .expect("wget on the node");
        let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success() && names.contains(&body),
            "{}: a node process to the ClusterIP: {body:?} {}",
            n.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for n in &lab.state.nodes {
        let url = format!("http://{}:30080/", n.ip);
        let body = wait_for(&format!("NodePort on {}", n.name), Duration::from_secs(20), || {
            lab.outside_get(&url)
        });
        assert!(names.contains(&body), "NodePort {url} answered {body:?}");
        // kube-proxy's health endpoint, as a load balancer probes it.
        let health = lab.outside_get(&format!("http://{}:10256/healthz", n.ip)).expect("healthz");
        let health: serde_json::Value = serde_json::from_str(&health).expect("healthz JSON");
        assert_eq!(health["nodeEligible"], true, "{health}");
    }

    // 3. `kubectl rollout restart` under load.
    let traffic = Traffic::start(&lab, &k, &web_ip, &stream_ip);
    kubectl_ok(&k, &["-n", proxy::NAMESPACE, "rollout", "restart", "ds/skiff-proxy"], None);
    let started = Instant::now();
    let restarted = replaced(&k, 2, &first, None);
    eprintln!("pd: rollout restart done in {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(LOAD_SECS as u64 - 5),
        "the rollout outlasted the traffic that was to cross it"
    );
    traffic.check("rollout restart");

    // 4. One proxy pod deleted (the DaemonSet puts another there).
    let traffic = Traffic::start(&lab, &k, &web_ip, &stream_ip);
    let victim = restarted.iter().find(|p| p.node == "node-1").expect("node-1's proxy").clone();
    kubectl_ok(&k, &["-n", proxy::NAMESPACE, "delete", "pod", &victim.name, "--wait=false"], None);
    let after_delete = replaced(&k, 2, std::slice::from_ref(&victim), None);
    traffic.check("proxy pod deleted");

    // 5. An upgrade to a new image tag (the same binaries under another tag, imported on
    // every node as a registry pull would bring it).
    let tag = format!("{version}-upgrade");
    let out = lab.dir.join("images-upgrade");
    let archives = images::build_component_images(&bin_dir(), &out, &tag, &["proxy".into()])
        .expect("building the upgrade image");
    for n in &lab.state.nodes {
        let socket = skiff_agent::containerd::ContainerdConfig::under(&n.containerd_dir).socket;
        lab.rt.block_on(images::import(&socket, &archives[0])).expect("importing the image");
    }
    let traffic = Traffic::start(&lab, &k, &web_ip, &stream_ip);
    let image = format!("skiff/proxy:{tag}");
    kubectl_ok(
        &k,
        &[
            "-n",
            proxy::NAMESPACE,
            "set",
            "image",
            "ds/skiff-proxy",
            &format!("skiff-proxy={image}"),
            &format!("install-cni={image}"),
        ],
        None,
    );
    replaced(&k, 2, &after_delete, Some(&image));
    traffic.check("upgrade");
    kubectl_ok(
        &k,
        &["-n", proxy::NAMESPACE, "rollout", "status", "ds/skiff-proxy", "--timeout=60s"],
        None,
    );
}

/// The median of `v` (sorted here).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A DaemonSet of the proxy's shape that only serves its readiness port: the baseline of
/// `bench_install` (what any host-network DaemonSet costs to roll out here).
fn plain_daemonset() -> String {
    r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: plain, namespace: kube-system}
spec:
  selector: {matchLabels: {app: plain}}
  template:
    metadata: {labels: {app: plain}}
    spec:
      hostNetwork: true
      tolerations: [{operator: Exists}]
      terminationGracePeriodSeconds: 1
      containers:
      - name: httpd
        image: skiff.test/tools:1
        imagePullPolicy: Never
        command: ["sh", "-c", "mkdir -p /tmp/w; echo ok > /tmp/w/readyz; exec httpd -f -p 10257 -h /tmp/w"]
        readinessProbe: {httpGet: {path: /readyz, port: 10257}, periodSeconds: 2}
"#
    .to_string()
}

/// Until the DaemonSet `name` in kube-system has `n` Ready pods (or, `n == 0`, no pods
/// left with `selector`).
fn wait_daemonset(k: &Kubectl, name: &str, selector: &str, n: usize) {
    wait_for(&format!("DaemonSet {name} with {n} ready"), Duration::from_secs(120), || {
        let pods = lab::pods(k, proxy::NAMESPACE, selector);
        let all = {
            let out =
                k.run(&["-n", proxy::NAMESPACE, "get", "pods", "-l", selector, "-o", "name"], None);
            String::from_utf8_lossy(&out.stdout).lines().count()
        };
        let done = if n == 0 {
            all == 0
        } else {
            pods.len() == n && pods.iter().all(|p| p.ready && p.phase == "Running")
        };
        done.then_some(())
    })
}

/// `cargo xtask bench install`: in a 3-node lab, the time from `kubectl apply -k` of
/// deploy/proxy to every node's proxy Ready and a Service programmed in every node's maps
/// (a fresh install: nothing pinned), against a host-network DaemonSet of the same shape that
/// does nothing (same run, same nodes); and requests failed during a rolling update of the
/// proxy DaemonSet under load (target 0). A table and `target/bench/install.json`.
#[test]
#[ignore = "benchmark: run by `cargo xtask bench install`"]
fn bench_install() {
    const ROUNDS: usize = 3;
    let lab = Lab::start(
        "pd",
        LabConfig {
            nodes: 3,
            subnet: LAB_SUBNET.parse().expect("subnet"),
            ready_timeout: Duration::from_secs(120),
            proxy: ProxyMode::Daemonset,
            ..Default::default()
        },
    );
    let k = lab.kubectl();
    kubectl_ok(&k, &["apply", "-f", "-"], Some(&workload()));
    lab::ready_pods(&k, NS, "app=web", 2);
    lab::ready_pods(&k, NS, "app=stream", 1);
    lab::ready_pods(&k, NS, "app=client", 1);
    let web_ip =
        kubectl_ok(&k, &["-n", NS, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"], None);
    let stream_ip = kubectl_ok(
        &k,
        &["-n", NS, "get", "svc", "stream", "-o", "jsonpath={.spec.clusterIP}"],
        None,
    );
    let overlay = lab.dir.join("proxy");
    let frontend = format!("{web_ip}:80");
    let programmed_everywhere = || {
        lab.state.nodes.iter().all(|n| {
            let out = Command::new(bin_dir().join("skiff-proxy"))
                .arg("--pin-dir")
                .arg(&n.pin_dir)
                .args(["maps", "services"])
                .output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&frontend))
        })
    };
    let uninstall = || {
        let out = k.run(&["delete", "-k", &overlay.to_string_lossy(), "--wait=true"], None);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        wait_daemonset(&k, "skiff-proxy", "k8s-app=skiff-proxy", 0);
        for n in &lab.state.nodes {
            let _ = Command::new(bin_dir().join("skiff-proxy"))
                .arg("--pin-dir")
                .arg(&n.pin_dir)
                .arg("unpin")
                .output();
            let _ = std::fs::remove_dir_all(&n.pin_dir);
        }
        assert!(!programmed_everywhere(), "nothing left pinned");
    };

    let (mut ready_ms, mut programmed_ms, mut plain_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        uninstall();
        let t0 = Instant::now();
        proxy::apply(&lab.state, &overlay).expect("kubectl apply -k");
        wait_daemonset(&k, "skiff-proxy", "k8s-app=skiff-proxy", 3);
        ready_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        wait_for("the Service in every node's maps", Duration::from_secs(60), || {
            programmed_everywhere().then_some(())
        });
        programmed_ms.push(t0.elapsed().as_secs_f64() * 1e3);

        let t0 = Instant::now();
        kubectl_ok(&k, &["apply", "-f", "-"], Some(&plain_daemonset()));
        wait_daemonset(&k, "plain", "app=plain", 3);
        plain_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        kubectl_ok(&k, &["-n", proxy::NAMESPACE, "delete", "ds", "plain", "--wait=true"], None);
        wait_daemonset(&k, "plain", "app=plain", 0);
    }

    // A rolling update under load.
    let before = proxies(&k);
    let traffic = Traffic::start(&lab, &k, &web_ip, &stream_ip);
    let t0 = Instant::now();
    kubectl_ok(&k, &["-n", proxy::NAMESPACE, "rollout", "restart", "ds/skiff-proxy"], None);
    replaced(&k, 3, &before, None);
    let rollout_ms = t0.elapsed().as_secs_f64() * 1e3;
    let r = traffic.finish();
    let failed = r.cluster_ip.1 + r.node_port.1;
    let total = failed + r.cluster_ip.0 + r.node_port.0;
    let cut = r.streams.iter().filter(|s| !s.2).count();

    let (ready, programmed, plain) =
        (median(ready_ms.clone()), median(programmed_ms.clone()), median(plain_ms.clone()));
    println!("\n{:<58} {:>10}", "install (3-node lab, median of 3)", "ms");
    println!("{:<58} {ready:>10.0}", "kubectl apply -k deploy/proxy -> every proxy Ready");
    println!("{:<58} {programmed:>10.0}", "  ... -> a Service programmed on every node");
    println!("{:<58} {plain:>10.0}", "baseline: host-network DaemonSet of the same shape -> Ready");
    println!("{:<58} {:>10.2}", "ratio (proxy Ready / baseline)", ready / plain);
    println!("{:<58} {rollout_ms:>10.0}", "rolling update (rollout restart) -> replaced");
    println!(
        "{:<58} {failed:>10}",
        format!("requests failed during the rolling update (of {total}; target 0)")
    );
    println!("{:<58} {cut:>10}", "held connections cut (of 2; target 0)");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    let json = serde_json::json!({
        "nodes": 3,
        "install_ready_ms": {"median": ready, "samples": ready_ms},
        "install_programmed_ms": {"median": programmed, "samples": programmed_ms},
        "baseline_daemonset_ready_ms": {"median": plain, "samples": plain_ms},
        "ratio_ready_to_baseline": ready / plain,
        "rolling_update": {"ms": rollout_ms, "requests": total, "failed": failed,
            "connections_cut": cut},
    });
    std::fs::write(out.join("install.json"), serde_json::to_vec_pretty(&json).unwrap())
        .expect("install.json");
}
