//! End-to-end: a 3-node lab (`skiff_agent::lab`, the code behind `cargo xtask up`), its agents
//! joined with their own bootstrap tokens and running as their nodes (`--join`), driven by
//! real kubectl 1.33. One cluster, the issue's scenarios in sequence (the destructive ones
//! last): a Deployment + Service spread over the nodes, ClusterIP from a pod on another node
//! spreading over every backend, NodePort from an outside namespace on every node, scale-up
//! with the network programming latency measured, the proxy's maps and counters, an agent
//! restart under load, a rolling update under load, a server kill -9 mid-rollout, node loss,
//! namespace deletion. The lab is taken down (processes, namespaces, links, pins, cgroups,
//! state) when the test ends, also on failure.
//!
//! Needs root, containerd, runc, busybox-static, kubectl 1.33 and the workspace binaries
//! (`cargo build --workspace --bins`): a missing one fails the test with its name.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

use skiff_agent::lab::{self as agent_lab, LabConfig, LabState};
use skiff_tests::Kubectl;
use skiff_tests::lab::{self, Lab, PodInfo, bin_dir, wait_for};

const NS: &str = "e2e";
/// The lab segment; the host (skiff-server, and the test's upstream resolver) takes `.1`.
const LAB_SUBNET: &str = "10.253.0.0/24";
const LAB_HOST: Ipv4Addr = Ipv4Addr::new(10, 253, 0, 1);
/// What the test's upstream resolver answers for every name under `upstream.test.` (an
/// address of the lab segment no one uses: nothing is sent to it).
const UPSTREAM_ANSWER: Ipv4Addr = Ipv4Addr::new(10, 253, 0, 200);

/// An upstream resolver for the nodes' cluster DNS, on the host's lab address (UDP port 53):
/// `*.upstream.test.` has one A record, anything else is NXDOMAIN. Counts its queries; stops
/// on drop.
struct Upstream {
    queries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    fn start(ip: Ipv4Addr) -> Upstream {
        let socket = UdpSocket::bind((ip, 53)).expect("upstream resolver on the lab address");
        socket.set_read_timeout(Some(Duration::from_millis(100))).expect("read timeout");
        let (queries, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (counter, stopping) = (queries.clone(), stop.clone());
        let zone = Name::from_ascii("upstream.test.").expect("zone");
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !stopping.load(Ordering::SeqCst) {
                let Ok((len, peer)) = socket.recv_from(&mut buf) else { continue };
                let Ok(query) = Message::from_vec(&buf[..len]) else { continue };
                let Some(q) = query.queries.first() else { continue };
                counter.fetch_add(1, Ordering::SeqCst);
                let mut resp = Message::response(query.metadata.id, OpCode::Query);
                resp.metadata.recursion_desired = query.metadata.recursion_desired;
                resp.metadata.recursion_available = true;
                resp.add_query(q.clone());
                if !zone.zone_of(q.name()) {
                    resp.metadata.response_code = ResponseCode::NXDomain;
                } else if q.query_type() == RecordType::A {
                    let a = RData::A(A(UPSTREAM_ANSWER));
                    resp.add_answer(Record::from_rdata(q.name().clone(), 30, a));
                }
                if let Ok(bytes) = resp.to_vec() {
                    let _ = socket.send_to(&bytes, peer);
                }
            }
        });
        Upstream { queries, stop, thread: Some(thread) }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The e2e lab (`/run/skiff-e<pid>`), taken down on drop.
type Cluster = Lab;

fn start_cluster(nodes: usize) -> Cluster {
    Lab::start(
        "e",
        LabConfig {
            nodes,
            subnet: LAB_SUBNET.parse().expect("subnet"),
            dns_upstreams: vec![LAB_HOST],
            ready_timeout: Duration::from_secs(120),
            log_filter: "info".into(),
            // `kubectl top` answers after two scrapes.
            metric_resolution: Some(Duration::from_secs(2)),
            // As on real machines: each agent joins with its own token and runs as its node.
            join: true,
            ..Default::default()
        },
    )
}

/// What the e2e scenarios read off a node's pinned maps.
trait NodeMaps {
    fn reload(&mut self);
    fn proxy_maps(&self, node: &str, what: &str) -> String;
    /// Backend addresses of `frontend` (`IP:PORT`) in a node's maps.
    fn programmed(&self, node: &str, frontend: &str) -> BTreeSet<String>;
}

impl NodeMaps for Lab {
    fn reload(&mut self) {
        self.state = LabState::load(&self.dir).expect("lab state").expect("lab exists");
    }

    fn proxy_maps(&self, node: &str, what: &str) -> String {
        let n = self.state.node(node).expect("node");
        let out = Command::new(bin_dir().join("skiff-proxy"))
            .arg("--pin-dir")
            .arg(&n.pin_dir)
            .args(["maps", what])
            .output()
            .expect("skiff-proxy maps");
        assert!(out.status.success(), "skiff-proxy maps: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn programmed(&self, node: &str, frontend: &str) -> BTreeSet<String> {
        let backends: BTreeMap<String, String> = self
            .proxy_maps(node, "backends")
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?.to_string(), f.next()?.to_string()))
            })
            .collect();
        self.proxy_maps(node, "services")
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&frontend) && f.get(2) != Some(&"0"))
                    .then(|| f.get(3).and_then(|id| backends.get(*id).cloned()))
                    .flatten()
            })
            .collect()
    }
}

fn pods(k: &Kubectl, selector: &str) -> Vec<PodInfo> {
    lab::pods(k, NS, selector)
}

fn ready_pods(k: &Kubectl, selector: &str, n: usize) -> Vec<PodInfo> {
    lab::ready_pods(k, NS, selector, n)
}

fn exec(k: &Kubectl, pod: &str, script: &str) -> String {
    lab::exec(k, NS, pod, script)
}

fn hits(k: &Kubectl, pod: &str, url: &str, n: usize) -> Vec<String> {
    lab::hits(k, NS, pod, url, n)
}

fn load(k: &Kubectl, pod: &str, url: &str, secs: u32) -> std::thread::JoinHandle<(u64, u64)> {
    lab::load(k, NS, pod, url, secs)
}

fn web_manifest(replicas: u32, version: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxUnavailable: 0, maxSurge: 1}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 5
      tolerations:
      - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}}
      - {{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 5}}
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        nodeTaintsPolicy: Honor
        labelSelector: {{matchLabels: {{app: web}}}}
      containers:
      - name: httpd
        image: skiff.test/tools:1
        imagePullPolicy: Never
        env: [{{name: VERSION, value: "{version}"}}]
        command: ["sh", "-c", "echo $HOSTNAME > /tmp/index.html; echo serving $VERSION; exec httpd -f -p 8080 -h /tmp"]
        ports: [{{containerPort: 8080}}]
        lifecycle:
          preStop: {{exec: {{command: ["sleep", "2"]}}}}
        readinessProbe:
          tcpSocket: {{port: 8080}}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NS}}}
spec:
  type: NodePort
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080, nodePort: 30080}}]
"#
    )
}

fn client_manifest(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NS}, labels: {{app: client}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: sh
    image: skiff.test/tools:1
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
"#
    )
}

/// The claim `notes` (no class: the default) and a pod `name` that mounts it on /data,
/// runs `script` and stays up.
fn notes_manifest(name: &str, script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: notes, namespace: {NS}}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 64Mi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NS}, labels: {{app: notes}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: sh
    image: skiff.test/tools:1
    imagePullPolicy: Never
    command: ["sh", "-c", "{script}trap 'exit 0' TERM; while :; do sleep 1; done"]
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: notes}}}}]
"#
    )
}

#[test]
fn three_node_cluster_end_to_end() {
    let mut c = start_cluster(3);
    let upstream = Upstream::start(LAB_HOST);
    let k = Kubectl::new(33, &c.state.kubeconfig);
    let nodes: Vec<String> = c.state.nodes.iter().map(|n| n.name.clone()).collect();

    // 1. Deployment + Service: pods Running on different nodes; get/describe/logs/exec.
    eprintln!("e2e: 1. deploy");
    k.ok(&["create", "namespace", NS]);
    k.ok_stdin(&["apply", "-f", "-"], Some(&web_manifest(3, "v1")));
    let web = ready_pods(&k, "app=web", 3);
    let on: BTreeSet<&str> = web.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(on.len(), 3, "one backend per node: {web:?}");
    let wide = k.ok(&["-n", NS, "get", "pods", "-o", "wide"]);
    for p in &web {
        assert!(wide.contains(&p.name) && wide.contains(&p.ip), "get -o wide: {wide}");
    }
    let describe = k.ok(&["-n", NS, "describe", "pod", &web[0].name]);
    assert!(describe.contains(&web[0].node) && describe.contains("Running"), "{describe}");
    let logs = k.ok(&["-n", NS, "logs", &web[0].name]);
    assert!(logs.contains("serving v1"), "kubectl logs: {logs:?}");
    let host = exec(&k, &web[0].name, "cat /tmp/index.html");
    assert_eq!(host.trim(), web[0].name, "kubectl exec reads the pod's file");
    // kubectl top: every node's and backend's use, scraped from the agents (containerd's
    // CRI stats, the kernel's counters).
    let top = wait_for("kubectl top pod lists the backends", Duration::from_secs(30), || {
        let out = k.run(&["-n", NS, "top", "pod", "-l", "app=web", "--no-headers"], None);
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        web.iter().all(|p| out.contains(&p.name)).then_some(out)
    });
    for line in top.lines() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert!(cells.len() == 3 && cells[1].ends_with('m') && cells[2].ends_with("Mi"), "{top}");
    }
    let top = wait_for("kubectl top node lists the nodes", Duration::from_secs(30), || {
        let out = k.run(&["top", "node", "--no-headers"], None);
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        nodes.iter().all(|n| out.contains(n.as_str())).then_some(out)
    });
    assert!(top.lines().all(|l| l.split_whitespace().count() == 5 && l.contains('%')), "{top}");
    let svc: serde_json::Value =
        serde_json::from_str(&k.ok(&["-n", NS, "get", "svc", "web", "-o", "json"])).unwrap();
    let cluster_ip = svc["spec"]["clusterIP"].as_str().expect("clusterIP").to_string();
    let frontend = format!("{cluster_ip}:80");

    // 2. ClusterIP from a client pod on another node spreads over all three backends; the
    // NodePort answers from outside on every node.
    eprintln!("e2e: 2. ClusterIP and NodePort");
    k.ok_stdin(&["apply", "-f", "-"], Some(&client_manifest("client", &nodes[0])));
    let client = ready_pods(&k, "app=client", 1).remove(0);
    assert_eq!(client.node, nodes[0]);
    wait_for("every node programmed with 3 backends", Duration::from_secs(10), || {
        nodes.iter().all(|n| c.programmed(n, &frontend).len() == 3).then_some(())
    });
    let bodies = hits(&k, &client.name, &format!("http://{cluster_ip}/"), 30);
    let seen: BTreeSet<&str> = bodies.iter().map(String::as_str).collect();
    let names: BTreeSet<&str> = web.iter().map(|p| p.name.as_str()).collect();
    assert!(!seen.contains("FAIL"), "failed requests through the ClusterIP: {bodies:?}");
    assert_eq!(seen, names, "30 requests reach all three backends");
    // By name through the node-local cluster DNS: the full name, and the short one through
    // the pod's search domains.
    for url in [format!("http://web.{NS}.svc.cluster.local/"), "http://web/".to_string()] {
        let by_dns = hits(&k, &client.name, &url, 3);
        assert!(
            by_dns.iter().all(|b| names.contains(b.as_str())),
            "{url} through the cluster DNS answered {by_dns:?}"
        );
    }
    // Names outside the cluster domain are forwarded to the node's upstream: here the
    // resolver this test runs on the lab segment.
    let out = exec(&k, &client.name, "nslookup www.upstream.test. 2>&1; true");
    assert!(
        out.contains(&UPSTREAM_ANSWER.to_string()),
        "www.upstream.test through the cluster DNS and the lab upstream: {out}"
    );
    assert!(upstream.queries.load(Ordering::SeqCst) > 0, "the upstream was asked");
    // A service deleted is NXDOMAIN within 1 s: `gone` resolves by its short name; a loop in
    // the client pod asks for its full name until the answer is NXDOMAIN, from before the
    // delete; the time from `kubectl delete` returning to the loop ending bounds the delay.
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: gone, namespace: {NS}}}\n\
             spec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: 8080}}]}}\n"
        )),
    );
    let gone_ip = k.ok(&["-n", NS, "get", "svc", "gone", "-o", "jsonpath={.spec.clusterIP}"]);
    wait_for("`gone` resolving by its short name", Duration::from_secs(10), || {
        exec(&k, &client.name, "nslookup gone 2>&1; true").contains(gone_ip.trim()).then_some(())
    });
    let watching = {
        let mut cmd = Command::new("timeout");
        cmd.arg("30")
            .arg(&k.bin)
            .arg("--kubeconfig")
            .arg(&k.kubeconfig)
            .args(["-n", NS, "exec", &client.name, "--", "sh", "-c"])
            .arg(format!(
                "i=0; until nslookup gone.{NS}.svc.cluster.local. 2>&1 | grep -q NXDOMAIN; \
                 do i=$((i+1)); done; echo $i"
            ))
            .stdin(Stdio::null());
        std::thread::spawn(move || {
            (cmd.output().expect("kubectl exec (nslookup loop)"), Instant::now())
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    assert!(!watching.is_finished(), "NXDOMAIN for `gone` before it was deleted");
    k.ok(&["-n", NS, "delete", "svc", "gone"]);
    let deleted = Instant::now();
    let (out, ended) = watching.join().expect("nslookup loop");
    let lookups: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    assert!(
        out.status.success() && lookups > 0,
        "the nslookup loop: {} {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let delay = ended.saturating_duration_since(deleted);
    eprintln!(
        "e2e: NXDOMAIN {delay:?} after `kubectl delete svc` returned ({lookups} lookups before)"
    );
    assert!(delay < Duration::from_secs(1), "NXDOMAIN {delay:?} after the delete");

    for n in &c.state.nodes {
        let url = format!("http://{}:30080/", n.ip);
        let body = wait_for(&format!("NodePort on {}", n.name), Duration::from_secs(10), || {
            c.outside_get(&url)
        });
        assert!(names.contains(body.as_str()), "NodePort {url} answered {body:?}");
    }

    // 3. Scale to 5: new endpoints take traffic within 1 s of becoming Ready.
    eprintln!("e2e: 3. scale to 5");
    let before: BTreeSet<String> = web.iter().map(|p| p.ip.clone()).collect();
    k.ok(&["-n", NS, "scale", "deployment", "web", "--replicas=5"]);
    let mut ready_at: BTreeMap<String, Instant> = BTreeMap::new();
    let mut programmed_at: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while programmed_at.len() < 2 {
        assert!(Instant::now() < deadline, "scale-up not programmed: ready {ready_at:?}");
        for p in pods(&k, "app=web") {
            if p.ready && !before.contains(&p.ip) && !p.ip.is_empty() {
                ready_at.entry(p.ip.clone()).or_insert_with(Instant::now);
            }
        }
        let sets: Vec<BTreeSet<String>> =
            nodes.iter().map(|n| c.programmed(n, &frontend)).collect();
        for ip in ready_at.keys() {
            let be = format!("{ip}:8080");
            if sets.iter().all(|s| s.contains(&be)) {
                programmed_at.entry(ip.clone()).or_insert_with(Instant::now);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let latencies: Vec<Duration> =
        programmed_at.iter().map(|(ip, t)| t.saturating_duration_since(ready_at[ip])).collect();
    eprintln!(
        "e2e: network programming latency (Ready seen via kubectl -> in every node's maps): {latencies:?}"
    );
    for l in &latencies {
        assert!(*l < Duration::from_secs(1), "programming latency {l:?} >= 1 s");
    }
    let web5 = ready_pods(&k, "app=web", 5);
    let names5: BTreeSet<String> = web5.iter().map(|p| p.name.clone()).collect();
    let mut seen5 = BTreeSet::new();
    for _ in 0..4 {
        seen5.extend(hits(&k, &client.name, &format!("http://{cluster_ip}/"), 25));
        if seen5.is_superset(&names5) {
            break;
        }
    }
    assert!(!seen5.contains("FAIL"), "failed requests after the scale-up: {seen5:?}");
    assert!(seen5.is_superset(&names5), "all 5 backends answer: {seen5:?} vs {names5:?}");

    // 7. The proxy's counters grow with the traffic.
    eprintln!("e2e: 7. maps and counters");
    let stats_before = c.proxy_maps(&nodes[0], "stats");
    hits(&k, &client.name, &format!("http://{cluster_ip}/"), 20);
    let stats_after = c.proxy_maps(&nodes[0], "stats");
    assert_ne!(stats_before, stats_after, "service counters of node 1 moved with the traffic");
    eprintln!("e2e: stats of {}:\n{stats_after}", nodes[0]);

    let url = format!("http://{cluster_ip}/");

    // 4. Rolling update under continuous requests: zero failures.
    eprintln!("e2e: 4. rolling update under load");
    let running = load(&k, &client.name, &url, 40);
    std::thread::sleep(Duration::from_secs(3));
    k.ok_stdin(&["apply", "-f", "-"], Some(&web_manifest(5, "v2")));
    k.ok(&["-n", NS, "rollout", "status", "deployment/web", "--timeout=150s"]);
    let (ok, failed) = running.join().expect("load thread");
    eprintln!("e2e: rolling update: {ok} requests ok, {failed} failed");
    assert!(ok > 20, "too few requests ran: {ok}");
    assert_eq!(failed, 0, "failed requests during the rolling update");

    // 6. Restart an agent under load: no request fails, no pod restarts. The agent of a node
    // with backends but without the client (the client's exec stream runs through its own
    // node's agent).
    eprintln!("e2e: 6. agent restart under load");
    let before: Vec<(String, String, i64)> =
        pods(&k, "app").iter().map(|p| (p.name.clone(), p.uid.clone(), p.restarts)).collect();
    let running = load(&k, &client.name, &url, 20);
    std::thread::sleep(Duration::from_secs(3));
    c.state.stop_agent(&nodes[1], true).expect("kill -9 the agent");
    std::thread::sleep(Duration::from_secs(1));
    c.state.start_agent(&nodes[1]).expect("agent back");
    let (ok, failed) = running.join().expect("load thread");
    eprintln!("e2e: agent restart: {ok} requests ok, {failed} failed");
    assert_eq!(failed, 0, "failed requests across the agent restart");
    std::thread::sleep(Duration::from_secs(3));
    let after: Vec<(String, String, i64)> =
        pods(&k, "app").iter().map(|p| (p.name.clone(), p.uid.clone(), p.restarts)).collect();
    assert_eq!(before, after, "pods (names, uids, restart counts) unchanged by the agent restart");

    // 9. kill -9 skiff-server mid-rollout: the rollout completes after it returns.
    eprintln!("e2e: 9. server kill -9 mid-rollout");
    k.ok_stdin(&["apply", "-f", "-"], Some(&web_manifest(5, "v3")));
    std::thread::sleep(Duration::from_millis(1500));
    c.state.kill_server().expect("kill -9 skiff-server");
    std::thread::sleep(Duration::from_secs(1));
    c.state.start_server().expect("server back");
    wait_for("the apiserver back", Duration::from_secs(30), || {
        k.run(&["get", "nodes"], None).status.success().then_some(())
    });
    k.ok(&["-n", NS, "rollout", "status", "deployment/web", "--timeout=180s"]);
    let web_v3 = ready_pods(&k, "app=web", 5);
    for p in &web_v3 {
        let logs = k.ok(&["-n", NS, "logs", &p.name]);
        assert!(logs.contains("serving v3"), "{} runs v3: {logs:?}", p.name);
    }
    let web5 = web_v3;

    // 5. Node loss: kill the agent and containerd of a node without the client.
    eprintln!("e2e: 5. node loss");
    let lost = nodes[2].clone();
    let lost_ips: BTreeSet<String> =
        web5.iter().filter(|p| p.node == lost).map(|p| format!("{}:8080", p.ip)).collect();
    c.state.stop_agent(&lost, true).expect("kill agent");
    c.state.kill_containerd(&lost).expect("kill containerd");
    wait_for("the lost node NotReady", Duration::from_secs(90), || {
        let out = k.ok(&[
            "get",
            "node",
            &lost,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (out.trim() != "True").then_some(())
    });
    wait_for(
        "the lost node's endpoints gone from the other nodes' maps",
        Duration::from_secs(120),
        || {
            nodes[..2]
                .iter()
                .all(|n| c.programmed(n, &frontend).is_disjoint(&lost_ips))
                .then_some(())
        },
    );
    wait_for("5 ready pods on the remaining nodes", Duration::from_secs(180), || {
        let p = pods(&k, "app=web");
        (p.iter().filter(|p| p.ready && p.node != lost).count() >= 5).then_some(())
    });
    let after_loss = hits(&k, &client.name, &format!("http://{cluster_ip}/"), 20);
    assert!(
        !after_loss.iter().any(|b| b == "FAIL"),
        "service answers after node loss: {after_loss:?}"
    );

    // The node comes back: containerd recovers its pods' shims, the agent adopts them and
    // finishes the evicted pods' deletion.
    eprintln!("e2e: the lost node returns");
    c.rt.block_on(c.state.start_containerd(&lost)).expect("containerd back");
    c.state.start_agent(&lost).expect("agent back");
    c.rt.block_on(agent_lab::wait_ready(&c.state, Duration::from_secs(90)))
        .expect("node Ready again");

    // 10. A claim of the default StorageClass (local-path): provisioned on the node its
    // first pod was scheduled to; what one pod writes the next pod of the claim reads there.
    eprintln!("e2e: 10. a local-path volume");
    k.ok_stdin(&["apply", "-f", "-"], Some(&notes_manifest("writer", "echo kept > /data/note; ")));
    let writer = ready_pods(&k, "app=notes", 1).remove(0);
    let claim: serde_json::Value =
        serde_json::from_str(&k.ok(&["-n", NS, "get", "pvc", "notes", "-o", "json"])).unwrap();
    assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
    assert_eq!(claim["spec"]["storageClassName"], "local-path", "{claim}");
    let pv_name = claim["spec"]["volumeName"].as_str().expect("volumeName").to_string();
    let pv: serde_json::Value =
        serde_json::from_str(&k.ok(&["get", "pv", &pv_name, "-o", "json"])).unwrap();
    let dir = PathBuf::from(pv["spec"]["hostPath"]["path"].as_str().expect("hostPath"));
    assert!(dir.starts_with(c.state.dir.join("storage")), "{}", dir.display());
    assert_eq!(
        std::fs::read_to_string(dir.join("note")).expect("the note on the node").trim(),
        "kept"
    );
    k.ok(&["-n", NS, "delete", "pod", "writer"]);
    k.ok_stdin(&["apply", "-f", "-"], Some(&notes_manifest("reader", "")));
    let reader = ready_pods(&k, "app=notes", 1).remove(0);
    assert_eq!(reader.node, writer.node, "the pod follows its volume");
    assert_eq!(exec(&k, "reader", "cat /data/note").trim(), "kept");

    // 8. Delete the namespace: pods, endpoints, map entries, IPs and routes gone.
    eprintln!("e2e: 8. namespace deletion");
    let all_ips: Vec<String> = pods(&k, "app").iter().map(|p| p.ip.clone()).collect();
    k.ok(&["delete", "namespace", NS, "--wait=false"]);
    wait_for("the namespace's pods gone", Duration::from_secs(120), || {
        let out = k.run(&["-n", NS, "get", "pods", "-o", "name"], None);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    wait_for("the service gone from the maps", Duration::from_secs(30), || {
        nodes.iter().all(|n| !c.proxy_maps(n, "services").contains(&frontend)).then_some(())
    });
    let endpoints = k.run(&["-n", NS, "get", "endpointslices", "-o", "name"], None);
    assert!(String::from_utf8_lossy(&endpoints.stdout).trim().is_empty(), "endpoint slices remain");
    for n in &c.state.nodes {
        // skiff-cni's IPAM store: one file per allocated address (under <dir>/<network>/).
        let mut allocated = Vec::new();
        let mut stack = vec![n.dir.join("ipam")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                } else if e.file_name().to_string_lossy().parse::<Ipv4Addr>().is_ok() {
                    allocated.push(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
        let leaked: Vec<&String> = allocated.iter().filter(|ip| all_ips.contains(ip)).collect();
        assert!(leaked.is_empty(), "pod IPs still allocated on {}: {leaked:?}", n.name);
    }
    for n in &nodes {
        let routes =
            c.state.node_command(n, &["ip", "route"]).expect("node").output().expect("ip route");
        let routes = String::from_utf8_lossy(&routes.stdout);
        for ip in &all_ips {
            let ip: Ipv4Addr = match ip.parse() {
                Ok(ip) => ip,
                Err(_) => continue,
            };
            assert!(
                !routes.lines().any(|l| l.starts_with(&format!("{ip} "))),
                "a pod route of {ip} remains on {n}:\n{routes}"
            );
        }
    }
    // The claim went with the namespace: a helper pod on its node removed the volume's
    // directory, then the volume was deleted.
    wait_for("the local-path volume deleted", Duration::from_secs(60), || {
        let out = k.run(&["get", "pv", &pv_name, "-o", "name"], None);
        (!out.status.success()).then_some(())
    });
    assert!(!dir.exists(), "the volume's directory remains: {}", dir.display());
    wait_for("the teardown helper pod gone", Duration::from_secs(60), || {
        let helper = format!("helper-pod-delete-{pv_name}");
        let out = k.run(&["-n", "kube-system", "get", "pod", &helper, "-o", "name"], None);
        (!out.status.success()).then_some(())
    });
    c.reload();
    assert!(c.state.running(), "every lab process still runs");
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `cargo xtask bench e2e`: network programming latency (an endpoint turning Ready in its
/// EndpointSlice → present in every node's maps) and pod start latency (API create →
/// Running and Ready) in a 3-node lab; a table and `target/bench/e2e.json`.
#[test]
#[ignore = "benchmark: run by `cargo xtask bench e2e`"]
fn bench_e2e() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let c = start_cluster(3);
    let k = Kubectl::new(33, &c.state.kubeconfig);
    let nodes: Vec<String> = c.state.nodes.iter().map(|n| n.name.clone()).collect();
    k.ok(&["create", "namespace", NS]);
    k.ok_stdin(&["apply", "-f", "-"], Some(&web_manifest(3, "v1")));
    ready_pods(&k, "app=web", 3);
    let svc: serde_json::Value =
        serde_json::from_str(&k.ok(&["-n", NS, "get", "svc", "web", "-o", "json"])).unwrap();
    let frontend = format!("{}:80", svc["spec"]["clusterIP"].as_str().expect("clusterIP"));
    let client = c.rt.block_on(agent_lab::client(&c.state.kubeconfig)).expect("client");
    let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(client.clone(), NS);
    let ready_ips = || -> BTreeSet<String> {
        c.rt.block_on(slices.list(&Default::default()))
            .map(|l| {
                l.items
                    .iter()
                    .flat_map(|s| s.endpoints.iter())
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                    .flat_map(|e| e.addresses.iter().cloned())
                    .collect()
            })
            .unwrap_or_default()
    };

    // Network programming: 3 → 6 → 3, three times (9 new endpoints).
    let mut programming = Vec::new();
    for round in 0..3 {
        let base = ready_ips();
        k.ok(&["-n", NS, "scale", "deployment", "web", "--replicas=6"]);
        let mut seen: BTreeMap<String, Instant> = BTreeMap::new();
        let mut done: BTreeMap<String, Instant> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(90);
        while done.len() < 3 {
            assert!(Instant::now() < deadline, "round {round}: not programmed: {seen:?}");
            for ip in ready_ips().difference(&base) {
                seen.entry(ip.clone()).or_insert_with(Instant::now);
            }
            let sets: Vec<BTreeSet<String>> =
                nodes.iter().map(|n| c.programmed(n, &frontend)).collect();
            for ip in seen.keys() {
                if sets.iter().all(|s| s.contains(&format!("{ip}:8080"))) {
                    done.entry(ip.clone()).or_insert_with(Instant::now);
                }
            }
        }
        programming.extend(
            done.iter().map(|(ip, t)| t.saturating_duration_since(seen[ip]).as_secs_f64() * 1e3),
        );
        k.ok(&["-n", NS, "scale", "deployment", "web", "--replicas=3"]);
        ready_pods(&k, "app=web", 3);
    }

    // Pod start: 15 pods created at once, create → Ready.
    let pods_api: kube::Api<Pod> = kube::Api::namespaced(client, NS);
    let mut created = BTreeMap::new();
    for i in 0..15 {
        let name = format!("start-{i}");
        let node = &nodes[i % nodes.len()];
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"app": "start"}},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "sh", "image": "skiff.test/tools:1",
                    "imagePullPolicy": "Never", "command": ["sleep", "3600"]}],
            },
        }))
        .expect("pod");
        c.rt.block_on(pods_api.create(&Default::default(), &pod)).expect("create pod");
        created.insert(name, Instant::now());
    }
    let mut started: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while started.len() < created.len() {
        assert!(Instant::now() < deadline, "pods not started: {started:?}");
        let list = c.rt.block_on(pods_api.list(&Default::default())).expect("list pods");
        for p in list.items {
            let name = p.metadata.name.clone().unwrap_or_default();
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready && created.contains_key(&name) {
                started.entry(name).or_insert_with(Instant::now);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut pod_start: Vec<f64> = started
        .iter()
        .map(|(n, t)| t.saturating_duration_since(created[n]).as_secs_f64() * 1e3)
        .collect();
    programming.sort_by(f64::total_cmp);
    pod_start.sort_by(f64::total_cmp);
    let row = |name: &str, v: &[f64]| {
        println!(
            "{name:<44} {:>8.1} {:>8.1} {:>6}",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.len()
        )
    };
    println!("\n{:<44} {:>8} {:>8} {:>6}", "e2e (3-node lab)", "p50 ms", "p99 ms", "n");
    row("network programming (Ready -> every node)", &programming);
    row("pod start (create -> Ready, local image)", &pod_start);
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    let json = serde_json::json!({
        "nodes": nodes.len(),
        "network_programming_ms": {"p50": percentile(&programming, 0.5),
            "p99": percentile(&programming, 0.99), "samples": programming},
        "pod_start_ms": {"p50": percentile(&pod_start, 0.5),
            "p99": percentile(&pod_start, 0.99), "samples": pod_start},
    });
    std::fs::write(out.join("e2e.json"), serde_json::to_vec_pretty(&json).unwrap())
        .expect("writing e2e.json");
    println!("wrote {}", out.join("e2e.json").display());
}
