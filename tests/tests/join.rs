//! Nodes as on real machines: a 2-node lab whose agents each join with their own bootstrap
//! token (`skiff-agent --server https://<lab address>:6443 --token T`, `cargo xtask up
//! --join`), each in its own network namespace reaching skiff-server only by its lab
//! address, trusting its CA through cluster-info's signature. They run as their nodes
//! (`system:node:<name>`, Node authorizer and NodeRestriction): pods, a Service, logs and
//! exec work. The server signs for 90 s (`--cluster-signing-duration`), so within the test
//! each agent renews its certificate through a stored CertificateSigningRequest that the
//! approving and signing controllers answer; after the first certificate expired a
//! restarted agent works with the renewed one. Bad input: the expired certificate put back
//! is refused at start with what to do, a wrong token and an unreachable server end the
//! agent with a clear error.
//!
//! Needs root, containerd, runc, busybox-static, kubectl 1.33 and the workspace binaries
//! (`cargo build --workspace --bins`): a missing one fails the test with its name.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use skiff_agent::lab::LabConfig;
use skiff_core::certificates as certs;
use skiff_tests::Kubectl;
use skiff_tests::lab::{self, Lab, wait_for};

const NS: &str = "jn";
const LAB_SUBNET: &str = "10.252.0.0/24";
/// The server's signing duration: short enough to see every node rotate in the test.
const SIGNING: Duration = Duration::from_secs(90);

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
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
          labelSelector: {{matchLabels: {{app: web}}}}}}
      containers:
      - name: httpd
        image: skiff.test/tools:1
        imagePullPolicy: Never
        command: ["sh", "-c", "echo $HOSTNAME > /tmp/index.html; echo serving; exec httpd -f -p 8080 -h /tmp"]
        readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NS}}}
spec:
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {NS}, labels: {{app: client}}}}
spec:
  nodeName: node-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: skiff.test/tools:1
    imagePullPolicy: Never
    command: ["sleep", "3600"]
"#
    )
}

/// The node's kubeconfig, written by its agent at join under its root dir.
fn node_kubeconfig(lab: &Lab, node: &str) -> std::path::PathBuf {
    let n = lab.state.nodes.iter().find(|n| n.name == node).expect("node");
    n.dir.join("agent/pki/kubelet.kubeconfig")
}

/// The client certificate (PEM) a kubeconfig holds.
fn certificate(kubeconfig: &std::path::Path) -> String {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let data = kc.auth_infos[0]
        .auth_info
        .as_ref()
        .and_then(|a| a.client_certificate_data.clone())
        .expect("an embedded client certificate");
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data).expect("base64"))
        .expect("PEM")
}

/// The status of a node's Ready condition, as kubectl reads it.
fn node_ready(k: &Kubectl, node: &str) -> String {
    k.ok(&[
        "get",
        "node",
        node,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
    ])
}

/// Runs `cmd` to its end (bounded): exit success, and stdout with stderr.
fn run_bounded(mut cmd: Command, timeout: Duration) -> (bool, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return (status.success(), text);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not end within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn agents_join_with_tokens_run_as_their_nodes_and_rotate_their_certificates() {
    let mut lab = Lab::start(
        "jn",
        LabConfig {
            nodes: 2,
            subnet: LAB_SUBNET.parse().expect("subnet"),
            ready_timeout: Duration::from_secs(120),
            join: true,
            server_args: vec![format!("--cluster-signing-duration={}s", SIGNING.as_secs())],
            ..Default::default()
        },
    );
    let k = lab.kubectl();
    let server_url = lab.state.server_url();
    assert!(server_url.starts_with("https://10.252.0.1:"), "{server_url}");

    // 1. Joined: one request per node by its token, approved and issued at once; each
    // agent holds a node identity and reaches the server by its lab address.
    let csrs = k.ok(&["get", "csr", "--no-headers"]);
    let joins: Vec<&str> = csrs.lines().filter(|l| l.contains("system:bootstrap:")).collect();
    assert_eq!(joins.len(), 2, "{csrs}");
    assert!(joins.iter().all(|l| l.contains("Approved,Issued")), "{csrs}");
    let mut first = Vec::new();
    for node in ["node-1", "node-2"] {
        let path = node_kubeconfig(&lab, node);
        let kc = std::fs::read_to_string(&path).expect("the node kubeconfig");
        assert!(kc.contains(&server_url), "{node} talks to the lab address: {kc}");
        let as_node = Kubectl::new(33, &path);
        let who = as_node.ok(&["auth", "whoami", "-o", "jsonpath={.status.userInfo}"]);
        assert!(
            who.contains(&format!("\"username\":\"system:node:{node}\""))
                && who.contains("system:nodes"),
            "{who}"
        );
        // The Node authorizer: its own Node, not the other's.
        let other = if node == "node-1" { "node-2" } else { "node-1" };
        let can = |what: &str| {
            let out = as_node.run(&["auth", "can-i", "patch", what], None);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.split_whitespace().next().unwrap_or_default().to_string()
        };
        assert_eq!(can(&format!("nodes/{node}")), "yes");
        assert_eq!(can(&format!("nodes/{other}")), "no");
        first.push((node, path, certificate(&node_kubeconfig(&lab, node))));
    }

    // 2. Pods on both nodes, a ClusterIP, logs and exec, with node identities.
    k.ok_stdin(&["apply", "-f", "-"], Some(&workload()));
    let web = lab::ready_pods(&k, NS, "app=web", 2);
    let nodes: std::collections::BTreeSet<&str> = web.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(nodes.len(), 2, "{web:?}");
    lab::ready_pods(&k, NS, "app=client", 1);
    let ip = k.ok(&["-n", NS, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let bodies = wait_for("the ClusterIP answering", Duration::from_secs(30), || {
        let b = lab::hits(&k, NS, "client", &format!("http://{ip}/"), 10);
        (!b.iter().any(|l| l == "FAIL")).then_some(b)
    });
    let names: std::collections::BTreeSet<String> = web.iter().map(|p| p.name.clone()).collect();
    assert!(bodies.iter().all(|b| names.contains(b)), "{bodies:?}");
    for p in &web {
        assert!(k.ok(&["-n", NS, "logs", &p.name]).contains("serving"), "logs of {}", p.name);
        assert_eq!(lab::exec(&k, NS, &p.name, "cat /tmp/index.html").trim(), p.name);
    }

    // 3. Rotation: each node asks for a new certificate as itself, the controllers approve
    // (selfnodeclient) and sign it, the agent writes it back and uses it.
    for (node, path, original) in &first {
        let requester = format!("system:node:{node}");
        let row = wait_for(
            &format!("{node} rotating its certificate"),
            SIGNING + Duration::from_secs(60),
            || {
                let csrs = k.ok(&["get", "csr", "--no-headers"]);
                csrs.lines()
                    .find(|l| l.contains(&requester) && l.contains("Approved,Issued"))
                    .map(str::to_string)
            },
        );
        let name = row.split_whitespace().next().unwrap_or_default();
        let reason = k.ok(&["get", "csr", name, "-o", "jsonpath={.status.conditions[0].reason}"]);
        assert_eq!(reason, "AutoApproved", "{row}");
        let renewed =
            wait_for(&format!("{node}'s kubeconfig renewed"), Duration::from_secs(10), || {
                let c = certificate(path);
                (&c != original).then_some(c)
            });
        let (_, old_end) = certs::validity(original).expect("certificate");
        let (_, new_end) = certs::validity(&renewed).expect("certificate");
        assert!(new_end > old_end, "{node}: the renewed certificate lasts longer");
        let who = Kubectl::new(33, path).ok(&[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ]);
        assert_eq!(who, requester);
    }

    // 4. Past the first certificates' expiry, a restarted agent works with the renewed one.
    let expiry = first
        .iter()
        .filter_map(|(_, _, c)| certs::validity(c).map(|(_, end)| end))
        .max()
        .expect("expiry");
    if let Ok(left) = expiry.duration_since(SystemTime::now()) {
        std::thread::sleep(left + Duration::from_secs(2));
    }
    lab.state.stop_agent("node-1", false).expect("stop node-1's agent");
    lab.state.start_agent("node-1").expect("start node-1's agent");
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: after, namespace: {NS}}}\nspec:\n  nodeName: node-1\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: skiff.test/tools:1, imagePullPolicy: Never, command: [sleep, '3600']}}\n"
        )),
    );
    wait_for("a new pod running on the restarted node", Duration::from_secs(60), || {
        let phase = k.ok(&["-n", NS, "get", "pod", "after", "-o", "jsonpath={.status.phase}"]);
        (phase == "Running").then_some(())
    });
    for node in ["node-1", "node-2"] {
        assert_eq!(node_ready(&k, node), "True", "{node}");
    }

    // 5. Bad input. The expired first certificate put back: refused at start, saying so.
    let (_, path2, original2) = &first[1];
    lab.state.stop_agent("node-2", false).expect("stop node-2's agent");
    let renewed_kubeconfig = std::fs::read_to_string(path2).expect("kubeconfig");
    let cert_b64 = |c: &str| base64::engine::general_purpose::STANDARD.encode(c.as_bytes());
    let current2 = certificate(path2);
    std::fs::write(path2, renewed_kubeconfig.replace(&cert_b64(&current2), &cert_b64(original2)))
        .expect("writing the expired certificate back");
    let node2 = lab.state.nodes[1].clone();
    let (ok, out) = run_bounded(lab.state.agent_command(&node2), Duration::from_secs(30));
    assert!(!ok, "an agent with an expired certificate must not run: {out}");
    assert!(out.contains("expired at") && out.contains("Join again with a new token"), "{out}");
    std::fs::write(path2, renewed_kubeconfig).expect("restoring the kubeconfig");
    lab.state.start_agent("node-2").expect("start node-2's agent");

    // A wrong token and an unreachable server: a clear error, a non-zero exit.
    let scratch = tempfile::tempdir().expect("temp dir");
    let agent = |server: &str, token: &str| {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", node2.netns))
            .arg(lab.state.bin_dir.join("skiff-agent"))
            .args(["--server", server, "--token", token, "--node-name", "stranger"])
            .arg("--root-dir")
            .arg(scratch.path());
        run_bounded(c, Duration::from_secs(60))
    };
    let (ok, out) = agent(&server_url, "abcdef.0123456789abcdef");
    assert!(!ok, "{out}");
    assert!(out.contains("no signature for this token"), "{out}");
    let unreachable = server_url.replace(":6443", ":6553");
    let (ok, out) = agent(&unreachable, "abcdef.0123456789abcdef");
    assert!(!ok, "{out}");
    assert!(out.contains("joining") && out.contains("6553"), "{out}");
    assert!(!scratch.path().join("pki/kubelet.kubeconfig").exists());
    wait_for("node-2 Ready again", Duration::from_secs(60), || {
        (node_ready(&k, "node-2") == "True").then_some(())
    });
}
