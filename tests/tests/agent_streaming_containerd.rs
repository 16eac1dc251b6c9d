//! `kubectl exec` and `kubectl logs` against a container in a real containerd: kubectl
//! (1.27: SPDY/3.1; 1.33: WebSocket v5) → skiff-server → the agent's streaming endpoint →
//! containerd's stream server in the node's namespace. Needs root, containerd, runc, ctr,
//! busybox-static and a built skiff-cni (`cargo build -p skiff-cni`); a missing piece fails.

use std::collections::HashMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_agent::images::TOOLS_IMAGE;
use skiff_agent::runtime::{CONTAINER_NAME_LABEL, Runtime, api};
use skiff_agent::streaming::{self, StreamingConfig};
use skiff_agent::testing::{NodeRig, NodeRigConfig};
use skiff_apiserver::pki::Pki;
use skiff_control_plane::server::ServerConfig;
use skiff_tests::{Kubectl, TestServer};

fn container(
    name: &str,
    command: &[&str],
    labels: &HashMap<String, String>,
) -> api::ContainerConfig {
    let mut labels = labels.clone();
    labels.insert(CONTAINER_NAME_LABEL.to_string(), name.to_string());
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: TOOLS_IMAGE.into(), ..Default::default() }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}/0.log"),
        labels,
        linux: Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    pid: api::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Run kubectl off the async workers; returns (exit code, stdout, stderr).
async fn run(k: &Arc<Kubectl>, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let k = k.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut c = k.command(&args.iter().map(String::as_str).collect::<Vec<_>>());
        c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawning kubectl");
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(input.as_bytes()).expect("writing stdin");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "kubectl {args:?} did not finish within 30 s: stdout {:?} stderr {:?}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

async fn ok(k: &Arc<Kubectl>, args: &[&str]) -> String {
    let (code, out, err) = run(k, args, None).await;
    assert_eq!(code, 0, "kubectl {args:?}: stdout {out:?} stderr {err:?}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_and_logs_against_containerd() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let rig = NodeRig::start(
        NodeRigConfig::default()
            .pod_cidr("10.244.231.0/24".parse().unwrap())
            .node_ip(Ipv4Addr::new(10, 250, 231, 1)),
    )
    .await
    .unwrap_or_else(|e| panic!("starting the node rig: {e:#?}"));
    // Resource metrics scraped every second, for `kubectl top`.
    let server = tokio::task::spawn_blocking(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Default::default()
        };
        config.api.metric_resolution = Duration::from_secs(1);
        TestServer::start_with(dir, config)
    })
    .await
    .unwrap();
    let pki = Pki::load_or_create(server.dir.path(), &[]).expect("the server's PKI");
    let cri = rig.runtime().await.expect("CRI");

    let mut config = StreamingConfig::new(StreamingConfig::ca_from_pem(&pki.ca_cert_pem).unwrap());
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.root_dir = rig.dir().to_path_buf();
    config.runtime_netns = Some(rig.netns_path());
    let endpoint = streaming::serve(cri.clone(), config).await.expect("streaming endpoint");

    // The API objects: a Node pointing at the endpoint, a Pod bound to it.
    let k33 = Arc::new(server.kubectl(33));
    let k27 = Arc::new(server.kubectl(27));
    let tmp = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.display().to_string()
    };
    ok(
        &k33,
        &["create", "-f", &file("n.yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n")],
    )
    .await;
    let status = format!(
        r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"127.0.0.1"}}],"daemonEndpoints":{{"kubeletEndpoint":{{"Port":{}}}}}}}}}"#,
        endpoint.addr().port()
    );
    ok(&k33, &["patch", "node", "n1", "--subresource=status", "--type=merge", "-p", &status]).await;
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: n1\n  containers:\n  - name: app\n    image: {TOOLS_IMAGE}\n"
    );
    ok(&k33, &["create", "-f", &file("p.yaml", &pod)]).await;
    let uid = ok(&k33, &["get", "pod", "web", "-o", "jsonpath={.metadata.uid}"]).await;

    // The pod in containerd, as the agent's pod sync would run it.
    let sandbox = rig.sandbox_config("default", "web", &uid);
    let sb = cri.run_pod_sandbox(sandbox.clone()).await.expect("RunPodSandbox");
    let cfg = container(
        "app",
        &["sh", "-c", "echo started; sleep 0.3; echo oops >&2; exec sleep 3600"],
        &sandbox.labels,
    );
    let id = cri.create_container(&sb, cfg, &sandbox).await.expect("CreateContainer");
    cri.start_container(&id).await.expect("StartContainer");

    // Logs: what the container wrote, through containerd's log file.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ok(&k33, &["logs", "web"]).await;
        if out == "started\noops\n" {
            break;
        }
        assert!(Instant::now() < deadline, "kubectl logs: {out:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ok(&k27, &["logs", "web", "--tail=1"]).await, "oops\n");

    for (minor, k) in [(27, &k27), (33, &k33)] {
        assert_eq!(ok(k, &["exec", "web", "--", "echo", "hi"]).await, "hi\n", "kubectl 1.{minor}");
        // stderr, and the exit code through the Status on the error stream.
        let (code, out, err) = run(
            k,
            &["exec", "web", "-c", "app", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
            None,
        )
        .await;
        assert_eq!((code, out.as_str()), (3, "out\n"), "kubectl 1.{minor}: stderr {err:?}");
        assert!(err.contains("err"), "kubectl 1.{minor}: {err:?}");
        // stdin to its end (1.33: WebSocket v5's CLOSE of stdin becomes the SPDY stream's FIN).
        let (code, out, err) = run(k, &["exec", "-i", "web", "--", "cat"], Some("a\nb\n")).await;
        assert_eq!((code, out.as_str()), (0, "a\nb\n"), "kubectl 1.{minor}: {err:?}");
        // A terminal (kubectl wants one on its own stdin: util-linux `script` gives it one).
        let kubectl_line = format!(
            "{} --kubeconfig {} exec -it web -- tty",
            k.bin.display(),
            k.kubeconfig.display()
        );
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("script")
                .args(["-q", "-e", "-c", &kubectl_line, "/dev/null"])
                .stdin(Stdio::null())
                .output()
                .expect("running script(1) from util-linux")
        })
        .await
        .unwrap();
        let tty = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && tty.contains("/dev/pts/"),
            "kubectl 1.{minor} -it: {tty:?} {out:?}"
        );
        // A command that does not exist.
        let (code, _, err) = run(k, &["exec", "web", "--", "/no/such/binary"], None).await;
        assert_ne!(code, 0, "kubectl 1.{minor}: {err:?}");
    }

    // kubectl top: containerd's CRI stats, through the agent's /metrics/resource and the
    // apiserver's scrape. A container spinning on a core shows its CPU; the sleeper little.
    let burn = container("burn", &["sh", "-c", "while :; do :; done"], &sandbox.labels);
    let burn = cri.create_container(&sb, burn, &sandbox).await.expect("CreateContainer");
    cri.start_container(&burn).await.expect("StartContainer");
    let millicores = |cell: &str| cell.strip_suffix('m').and_then(|m| m.parse::<u64>().ok());
    let deadline = Instant::now() + Duration::from_secs(30);
    let top = loop {
        let (code, out, err) = run(&k33, &["top", "pod", "web", "--containers"], None).await;
        let cells = |name: &str| {
            out.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|c| c.len() == 4 && c[1] == name)
                .map(|c| (millicores(c[2]), c[3].to_string()))
        };
        if code == 0
            && let (Some((Some(burn), burn_mem)), Some((Some(app), _))) =
                (cells("burn"), cells("app"))
            && burn >= 100
            && app < burn
            && burn_mem.ends_with("Mi")
        {
            break out;
        }
        assert!(Instant::now() < deadline, "kubectl top: {code} {out} {err}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(top.starts_with("POD"), "{top}");
    // The working set, to the byte (a shell's is well under the MiB `kubectl top` shows).
    let raw =
        ok(&k33, &["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web"])
            .await;
    let raw: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let memory = raw["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "burn"))
        .and_then(|c| c["usage"]["memory"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(!memory.is_empty() && memory != "0", "{raw}");
    cri.stop_container(&burn, 0).await.expect("StopContainer");

    endpoint.shutdown().await;
    drop(rig);
}
