//! The CRI client against a real containerd: each test starts a node (its own network
//! namespace, containerd, skiff-cni, the busybox test images) with the testing rig.
//! Needs root, containerd, runc, ctr, busybox-static and a built skiff-cni (cargo build
//! -p skiff-cni; `cargo xtask test` builds every binary first). A missing piece fails the
//! test with the reason, it never skips.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use skiff_agent::cgroups::cgroup_mounts;
use skiff_agent::images::{PAUSE_IMAGE, TOOLS_IMAGE};
use skiff_agent::runtime::cri::CriRuntime;
use skiff_agent::runtime::{CONTAINER_NAME_LABEL, Runtime, api};
use skiff_agent::testing::{NodeRig, NodeRigConfig};

async fn rig(octet: u8) -> NodeRig {
    let cfg = NodeRigConfig::default()
        .pod_cidr(format!("10.244.{octet}.0/24").parse().unwrap())
        .node_ip(Ipv4Addr::new(10, 250, octet, 1));
    NodeRig::start(cfg).await.unwrap_or_else(|e| panic!("starting the node rig: {e:#?}"))
}

fn container(name: &str, command: &[&str]) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: TOOLS_IMAGE.into(), ..Default::default() }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}/0.log"),
        labels: HashMap::from([(CONTAINER_NAME_LABEL.to_string(), name.to_string())]),
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

async fn wait_state(
    cri: &CriRuntime,
    id: &str,
    state: api::ContainerState,
) -> api::ContainerStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = cri.container_status(id).await.unwrap();
        if s.state == state as i32 {
            return s;
        }
        assert!(Instant::now() < deadline, "container {id} never reached {state:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET from inside the node namespace (busybox wget, bounded by coreutils timeout: this
/// busybox's `wget -T` segfaults), retried while the server starts.
fn fetch(rig: &NodeRig, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rig.exec(&["timeout", "5", "busybox", "wget", "-q", "-O", "-", url]) {
            Ok(body) => return body,
            Err(e) => {
                assert!(Instant::now() < deadline, "GET {url} from the node failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_serves_http_on_its_pod_ip_execs_and_survives_a_containerd_restart() {
    let mut rig = rig(201).await;
    let cri = rig.runtime().await.unwrap();
    assert!(cri.image_status(PAUSE_IMAGE).await.unwrap().is_some(), "pause image not imported");
    assert!(cri.image_status(TOOLS_IMAGE).await.unwrap().is_some(), "tools image not imported");

    let sb_config = rig.sandbox_config("default", "web", "uid-web");
    let sb = cri
        .run_pod_sandbox(sb_config.clone())
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}\n{}", rig.containerd_log()));
    let ip: Ipv4Addr = cri
        .pod_sandbox_status(&sb)
        .await
        .unwrap()
        .network
        .expect("sandbox network status")
        .ip
        .parse()
        .expect("an IPv4 pod address");
    assert!(rig.cni_settings().pod_cidr.contains(ip), "{ip} outside the node's pod CIDR");

    let ct = cri
        .create_container(
            &sb,
            container(
                "web",
                &[
                    "sh",
                    "-c",
                    "echo started; mkdir -p /www && echo hello-from-pod > /www/index.html && exec httpd -f -p 8080 -h /www",
                ],
            ),
            &sb_config,
        )
        .await
        .unwrap();
    cri.start_container(&ct).await.unwrap();
    let before = wait_state(&cri, &ct, api::ContainerState::ContainerRunning).await;
    let url = format!("http://{ip}:8080/");
    assert_eq!(fetch(&rig, &url), "hello-from-pod\n");

    // The container's output lands in CRI log format at <log_directory>/<log_path>.
    let log = rig.dir().join("pods/default_web_uid-web/web/0.log");
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let line = text.lines().next().unwrap_or_default();
    assert!(line.ends_with(" stdout F started"), "{line:?}");
    assert!(line.split(' ').next().unwrap().ends_with('Z'), "{line:?}");

    // ExecSync: output and exit codes cross the wire.
    let r = cri.exec_sync(&ct, vec!["cat".into(), "/www/index.html".into()], 10).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_slice()), (0, b"hello-from-pod\n".as_slice()));
    let r = cri
        .exec_sync(&ct, vec!["sh".into(), "-c".into(), "echo oops >&2; exit 3".into()], 10)
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stderr.as_slice()), (3, b"oops\n".as_slice()));

    // Its own PID namespace: PID 1 is the container's command, not the pause process.
    let r = cri.exec_sync(&ct, vec!["cat".into(), "/proc/1/cmdline".into()], 10).await.unwrap();
    assert!(String::from_utf8_lossy(&r.stdout).starts_with("httpd"), "{r:?}");

    // Listing by the pod's labels finds it (what adoption after an agent restart does).
    let by_uid = HashMap::from([(skiff_agent::runtime::POD_UID_LABEL.into(), "uid-web".into())]);
    assert_eq!(cri.list_pod_sandboxes(&by_uid).await.unwrap().len(), 1);
    assert_eq!(cri.list_containers(&by_uid).await.unwrap().len(), 0, "labels are per object");
    assert_eq!(cri.list_containers(&HashMap::new()).await.unwrap().len(), 1);

    // A containerd restart keeps the container running, untouched.
    let containerd = rig.containerd().expect("containerd runs");
    let old_pid = containerd.pid();
    containerd.restart().await.unwrap();
    assert_ne!(containerd.pid(), old_pid);
    let after =
        wait_state(&rig.runtime().await.unwrap(), &ct, api::ContainerState::ContainerRunning).await;
    assert_eq!(after.started_at, before.started_at, "the container was restarted");
    assert_eq!(fetch(&rig, &url), "hello-from-pod\n");
    // The client made before the restart reconnects by itself.
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = cri.version().await {
        assert!(Instant::now() < deadline, "old client never reconnected: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Stop, remove; the container is gone (NotFound stays NotFound through CRI).
    cri.stop_container(&ct, 2).await.unwrap();
    let stopped = cri.container_status(&ct).await.unwrap();
    assert_eq!(stopped.state, api::ContainerState::ContainerExited as i32);
    cri.remove_container(&ct).await.unwrap();
    let err = cri.container_status(&ct).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");

    // Leave the sandbox running: the rig's drop must clean it up.
    let netns = rig.netns_path();
    let dir = rig.dir().to_path_buf();
    let parent = rig.cgroup_parent().to_string();
    drop(rig);
    assert_clean(&netns, &dir, &parent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_image_and_an_invalid_command_fail_cleanly() {
    let rig = rig(202).await;
    let cri = rig.runtime().await.unwrap();

    // Absent image: ImageStatus says so; PullImage fails fast (no registry reachable from
    // the node namespace), it does not hang.
    let absent = "skiff.test/absent:1";
    assert!(cri.image_status(absent).await.unwrap().is_none());
    let started = Instant::now();
    let pulled = tokio::time::timeout(Duration::from_secs(30), cri.pull_image(absent, None, None))
        .await
        .expect("PullImage of an unreachable registry hung");
    let err = pulled.expect_err("PullImage of an absent image succeeded");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(err.to_string().contains(absent), "{err}");

    // Invalid command: CreateContainer works, StartContainer fails with the reason, the
    // status tells it too.
    let sb_config = rig.sandbox_config("default", "bad", "uid-bad");
    let sb = cri.run_pod_sandbox(sb_config.clone()).await.unwrap();
    let ct = cri
        .create_container(&sb, container("bad", &["/no/such/binary"]), &sb_config)
        .await
        .unwrap();
    let err = cri.start_container(&ct).await.expect_err("starting a missing binary succeeded");
    assert!(err.to_string().contains("no such file"), "{err}");
    let st = cri.container_status(&ct).await.unwrap();
    assert_eq!(st.state, api::ContainerState::ContainerExited as i32, "{st:?}");
    assert!(!st.reason.is_empty() && st.message.contains("no such file"), "{st:?}");

    // A container from an image that is not there is refused at create.
    let mut cfg = container("ghost", &["sh"]);
    cfg.image = Some(api::ImageSpec { image: absent.into(), ..Default::default() });
    assert!(cri.create_container(&sb, cfg, &sb_config).await.is_err());

    // The rig removes pods through CRI on request, too.
    rig.remove_all_pods().await.unwrap();
    assert!(cri.list_pod_sandboxes(&HashMap::new()).await.unwrap().is_empty());
    let netns = rig.netns_path();
    let dir = rig.dir().to_path_buf();
    let parent = rig.cgroup_parent().to_string();
    drop(rig);
    assert_clean(&netns, &dir, &parent);
}

fn assert_clean(netns: &Path, dir: &Path, cgroup_parent: &str) {
    assert!(!netns.exists(), "{} left behind", netns.display());
    assert!(!dir.exists(), "{} left behind", dir.display());
    for m in cgroup_mounts().unwrap() {
        let d = m.join(cgroup_parent.trim_start_matches('/'));
        assert!(!d.exists(), "cgroup {} left behind", d.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let needle = dir.to_string_lossy();
    assert!(!mounts.contains(needle.as_ref()), "mounts under {needle} left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_picks_up_a_conflist_written_after_it_started() {
    let cfg = NodeRigConfig::default()
        .pod_cidr("10.244.203.0/24".parse().unwrap())
        .node_ip(Ipv4Addr::new(10, 250, 203, 1))
        .without_cni_config();
    let rig = NodeRig::start(cfg).await.unwrap();
    let cri = rig.runtime().await.unwrap();
    let sb_config = rig.sandbox_config("default", "early", "uid-early");
    let err = cri.run_pod_sandbox(sb_config.clone()).await.expect_err("a pod without CNI ran");
    assert!(err.to_string().contains("cni"), "{err}");

    // What the agent does once it knows its podCIDR.
    skiff_agent::network::write_cni_config(
        &rig.containerd_config().cni_conf_dir,
        rig.cni_settings(),
    )
    .unwrap();
    // Each retry is a new attempt, as the kubelet does (the failed attempt's name stays
    // reserved).
    let mut sb_config = sb_config;
    let deadline = Instant::now() + Duration::from_secs(10);
    let sb = loop {
        sb_config.metadata.as_mut().unwrap().attempt += 1;
        match cri.run_pod_sandbox(sb_config.clone()).await {
            Ok(sb) => break sb,
            Err(e) => assert!(Instant::now() < deadline, "conflist never picked up: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ip: Ipv4Addr =
        cri.pod_sandbox_status(&sb).await.unwrap().network.unwrap().ip.parse().unwrap();
    assert!(rig.cni_settings().pod_cidr.contains(ip));
}

#[tokio::test]
async fn a_containerd_that_cannot_start_fails_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = skiff_agent::containerd::ContainerdConfig::under(&dir.path().join("c"));
    // A socket path longer than sun_path (108 bytes): containerd cannot listen and exits.
    config.socket = dir.path().join("s".repeat(120)).join("containerd.sock");
    let err = match skiff_agent::containerd::Containerd::start(&config, None).await {
        Ok(_) => panic!("containerd started on an impossible socket path"),
        Err(e) => e,
    };
    match &err {
        skiff_agent::containerd::Error::Exited { log, .. } => {
            assert!(log.contains("containerd"), "log missing from the error: {log}")
        }
        other => panic!("expected Exited, got {other:?}"),
    }
    skiff_agent::containerd::cleanup(&config).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn importing_something_that_is_not_an_image_fails_with_ctrs_reason() {
    let rig = NodeRig::start(
        NodeRigConfig::default()
            .pod_cidr("10.244.204.0/24".parse().unwrap())
            .node_ip(Ipv4Addr::new(10, 250, 204, 1)),
    )
    .await
    .unwrap();
    let junk = rig.dir().join("junk.tar");
    std::fs::write(&junk, b"this is not a tar").unwrap();
    let err = skiff_agent::images::import(rig.socket(), &junk).await.unwrap_err();
    assert!(matches!(err, skiff_agent::images::Error::Import { .. }), "{err}");
    assert!(err.to_string().contains("junk.tar"), "{err}");
}
