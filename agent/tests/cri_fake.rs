//! The CRI client against the fake CRI server over the in-memory runtime: every RPC of the
//! sandbox/container lifecycle crosses a real gRPC socket and comes back with the state the
//! in-memory runtime holds, errors included (NotFound stays NotFound).

use std::collections::HashMap;

use skiff_agent::runtime::api;
use skiff_agent::runtime::cri::CriRuntime;
use skiff_agent::runtime::fake_cri;
use skiff_agent::runtime::memory::{Behavior, MemoryRuntime};
use skiff_agent::runtime::{POD_UID_LABEL, Runtime};

fn sandbox_config(uid: &str) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "web".into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "web".into(),
        labels: HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
        command: vec!["sh".into()],
        labels: HashMap::from([("io.kubernetes.container.name".to_string(), name.to_string())]),
        ..Default::default()
    }
}

#[tokio::test]
async fn cri_client_round_trips_the_whole_lifecycle_through_the_fake_server() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let memory = MemoryRuntime::new();
    memory.add_image("skiff.test/tools:1");
    memory.add_pullable("skiff.test/pullable:1");
    memory.set_behavior(|cfg| {
        if cfg.command.first().map(String::as_str) == Some("/nonexistent") {
            Behavior::FailStart("exec: \"/nonexistent\": no such file or directory".into())
        } else {
            Behavior::Run
        }
    });
    memory.set_exec(|_, cmd| api::ExecSyncResponse {
        stdout: cmd.join(" ").into_bytes(),
        stderr: Vec::new(),
        exit_code: 3,
    });
    let server = fake_cri::serve(memory.clone(), &socket).await.unwrap();
    let cri = CriRuntime::connect(server.socket()).await.unwrap();
    assert_eq!(cri.endpoint(), socket.display().to_string());

    let v = cri.version().await.unwrap();
    assert_eq!(v.runtime_name, "skiff-memory");

    // Images: present, absent, pullable, not pullable.
    let img = cri.image_status("skiff.test/tools:1").await.unwrap().expect("tools present");
    assert_eq!(img.repo_tags, vec!["skiff.test/tools:1".to_string()]);
    assert!(cri.image_status("skiff.test/absent:1").await.unwrap().is_none());
    let pulled = cri.pull_image("skiff.test/pullable:1", None, None).await.unwrap();
    assert!(pulled.starts_with("sha256:"), "{pulled}");
    let err = cri.pull_image("skiff.test/absent:1", None, None).await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
    assert_eq!(cri.list_images().await.unwrap().len(), 2);

    // Sandbox.
    let sb_config = sandbox_config("uid-1");
    let sb = cri.run_pod_sandbox(sb_config.clone()).await.unwrap();
    let status = cri.pod_sandbox_status(&sb).await.unwrap();
    assert_eq!(status.state, api::PodSandboxState::SandboxReady as i32);
    assert!(!status.network.unwrap().ip.is_empty());
    let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), "uid-1".to_string())]);
    let listed = cri.list_pod_sandboxes(&by_uid).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sb);
    let other = HashMap::from([(POD_UID_LABEL.to_string(), "uid-2".to_string())]);
    assert!(cri.list_pod_sandboxes(&other).await.unwrap().is_empty());

    // Container: create, start, status, list, exec, stop, remove.
    let ct = cri
        .create_container(&sb, container_config("app", "skiff.test/tools:1"), &sb_config)
        .await
        .unwrap();
    assert_eq!(
        cri.container_status(&ct).await.unwrap().state,
        api::ContainerState::ContainerCreated as i32
    );
    cri.start_container(&ct).await.unwrap();
    let st = cri.container_status(&ct).await.unwrap();
    assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
    assert_eq!(st.metadata.unwrap().name, "app");
    let containers = cri.list_containers(&HashMap::new()).await.unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].pod_sandbox_id, sb);
    let exec = cri.exec_sync(&ct, vec!["echo".into(), "hi".into()], 5).await.unwrap();
    assert_eq!((exec.stdout.as_slice(), exec.exit_code), (b"echo hi".as_slice(), 3));
    let err = cri.exec(api::ExecRequest { container_id: ct.clone(), ..Default::default() }).await;
    assert!(err.unwrap_err().to_string().contains("no streaming server"));

    // A container whose start fails: the reason crosses the wire, the status records it.
    let mut bad = container_config("bad", "skiff.test/tools:1");
    bad.command = vec!["/nonexistent".into()];
    let bad_id = cri.create_container(&sb, bad, &sb_config).await.unwrap();
    let err = cri.start_container(&bad_id).await.unwrap_err();
    assert!(err.to_string().contains("no such file"), "{err}");
    let st = cri.container_status(&bad_id).await.unwrap();
    assert_eq!(st.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(st.reason, "StartError");

    // A container from an absent image is refused.
    assert!(
        cri.create_container(&sb, container_config("x", "skiff.test/absent:1"), &sb_config)
            .await
            .is_err()
    );

    cri.stop_container(&ct, 10).await.unwrap();
    let st = cri.container_status(&ct).await.unwrap();
    assert_eq!(st.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(st.exit_code, 143);
    cri.remove_container(&ct).await.unwrap();
    let err = cri.container_status(&ct).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");

    cri.stop_pod_sandbox(&sb).await.unwrap();
    assert_eq!(
        cri.pod_sandbox_status(&sb).await.unwrap().state,
        api::PodSandboxState::SandboxNotready as i32
    );
    cri.remove_pod_sandbox(&sb).await.unwrap();
    assert!(cri.pod_sandbox_status(&sb).await.unwrap_err().is_not_found());
    assert!(cri.list_pod_sandboxes(&HashMap::new()).await.unwrap().is_empty());
    assert!(cri.list_containers(&HashMap::new()).await.unwrap().is_empty());

    // The memory runtime saw the calls the client made, in order.
    let calls = memory.calls();
    let first_run = calls.iter().position(|c| c.starts_with("RunPodSandbox")).unwrap();
    let first_start = calls.iter().position(|c| c.starts_with("StartContainer")).unwrap();
    assert!(first_run < first_start, "{calls:?}");

    // Stopping the server stops answering.
    server.shutdown().await;
    assert!(cri.version().await.is_err());
}

#[tokio::test]
async fn connect_fails_when_nothing_listens() {
    let dir = tempfile::tempdir().unwrap();
    let err = CriRuntime::connect(&dir.path().join("nothing.sock")).await.unwrap_err();
    assert!(matches!(err, skiff_agent::runtime::Error::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn unimplemented_rpcs_answer_unimplemented() {
    // The agent has no client for Status; the bindings crate the fake is built on does.
    use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let server = fake_cri::serve(MemoryRuntime::new(), &dir.path().join("cri.sock")).await.unwrap();
    let socket = server.socket().to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .unwrap();
    let err = RuntimeServiceClient::new(channel)
        .status(k8s_cri::v1::StatusRequest { verbose: false })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
}
