//! containerd's CRI calling skiff-cni: a containerd (Debian's 1.6, libcni inside) runs in a
//! node namespace with skiff-cni as its only network; RunPodSandbox must get a pod address
//! from skiff-cni that the node reaches, and StopPodSandbox must release it. Needs root,
//! containerd, runc, ctr, busybox-static, GNU tar, sha256sum and the reference `loopback`
//! plugin (containernetworking-plugins; containerd sets up `lo` through it).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

const IMAGE: &str = "docker.io/skiff/cni-test-pause:1";

fn need(bin: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/lib/cni"] {
        let p = Path::new(dir).join(bin);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{bin} is required for this test (apt-get install containerd runc busybox-static containernetworking-plugins)"
    );
}

fn sha256(path: &Path) -> String {
    let out = sh(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_owned()
}

/// An OCI image archive whose only process is `busybox sleep` (our pause container).
fn build_pause_image(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(need("busybox"), root.join("bin/busybox")).unwrap();
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let layer = dir.join("layer.tar");
    sh(Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C"])
        .arg(&root)
        .arg("-cf")
        .arg(&layer)
        .arg("."));
    let put = |path: &Path| -> (String, u64) {
        let digest = sha256(path);
        std::fs::copy(path, blobs.join(&digest)).unwrap();
        (digest, std::fs::metadata(path).unwrap().len())
    };
    let (layer_digest, layer_size) = put(&layer);
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Cmd": ["/bin/busybox", "sleep", "3600"]},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        })
        .to_string(),
    )
    .unwrap();
    let (config_digest, config_size) = put(&config);
    let manifest = dir.join("manifest.json");
    std::fs::write(
        &manifest,
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": format!("sha256:{config_digest}"), "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": format!("sha256:{layer_digest}"), "size": layer_size}],
        })
        .to_string(),
    )
    .unwrap();
    let (manifest_digest, manifest_size) = put(&manifest);
    std::fs::write(
        layout.join("index.json"),
        serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{manifest_digest}"), "size": manifest_size,
                "annotations": {"io.containerd.image.name": IMAGE, "org.opencontainers.image.ref.name": "1"},
                "platform": {"architecture": "amd64", "os": "linux"},
            }],
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let archive = dir.join("image.tar");
    sh(Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&archive).arg("."));
    archive
}

/// A containerd instance in a node namespace, all state under one directory. Drop kills it
/// and its shims (by pid), unmounts what it mounted and removes the directory.
struct Containerd {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    /// Shared directories containerd and libcni create outside `dir` (shim sockets, the
    /// result cache) that did not exist before: removed again if empty.
    created_shared_dirs: Vec<&'static str>,
}

const SHARED_DIRS: [&str; 4] =
    ["/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni"];

impl Containerd {
    fn start(node: &Node, dir: &Path) -> Self {
        let bin_dir = dir.join("cni-bin");
        let conf_dir = dir.join("cni-conf");
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::copy(plugin_bin(), bin_dir.join("skiff-cni")).unwrap();
        std::fs::copy(need("loopback"), bin_dir.join("loopback")).unwrap();
        // containerd 1.6's libcni knows spec versions up to 1.0.0.
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "skiff",
            "plugins": [{
                "type": "skiff-cni",
                "podCIDR": node.pod_cidr,
                "dataDir": node.data_dir.path(),
                "mtu": 1500,
            }],
        });
        std::fs::write(conf_dir.join("10-skiff.conflist"), conflist.to_string()).unwrap();
        let socket = dir.join("containerd.sock");
        let d = dir.display();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni-bin"
    conf_dir = "{d}/cni-conf"
    max_conf_num = 1
"#
        );
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config).unwrap();
        let created_shared_dirs =
            SHARED_DIRS.into_iter().filter(|d| !Path::new(d).exists()).collect();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = node
            .ns
            .command(&[
                need("containerd").to_str().unwrap(),
                "--config",
                config_path.to_str().unwrap(),
            ])
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting containerd");
        let c = Self { child, dir: dir.to_path_buf(), socket, created_shared_dirs };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.socket.exists() {
            assert!(Instant::now() < deadline, "containerd did not start: {}", c.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    fn import(&self, archive: &Path) {
        sh(Command::new(need("ctr"))
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import", "--all-platforms"])
            .arg(archive));
    }

    async fn client(&self) -> RuntimeServiceClient<Channel> {
        let socket = self.socket.clone();
        let channel = Endpoint::try_from("http://[::]:50051")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .expect("connecting to containerd's CRI");
        RuntimeServiceClient::new(channel)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Shims and pause processes started for this instance name its directory.
        let needle = self.dir.to_string_lossy().into_owned();
        if let Ok(procs) = std::fs::read_dir("/proc") {
            for p in procs.flatten() {
                let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else { continue };
                let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains(&needle) {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                }
            }
        }
        // Unmount (deepest first) whatever containerd mounted under its directory.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&needle))
            .collect();
        points.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in points {
            let _ = Command::new("umount").args(["-l", m]).status();
        }
        for d in &self.created_shared_dirs {
            let _ = std::fs::remove_dir(d); // only when empty
        }
    }
}

/// A cgroup parent unique to this test; removed from every hierarchy on drop (containerd
/// never removes cgroup parents). Declared before the containerd guard so it drops after.
struct CgroupParent {
    parent: String,
}

impl CgroupParent {
    fn new() -> Self {
        Self { parent: format!("/skiff-cni-test-{}", std::process::id()) }
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let fstype = fields.iter().skip_while(|f| **f != "-").nth(1).copied().unwrap_or("");
            if fstype == "cgroup" || fstype == "cgroup2" {
                let dir = format!("{}{}", fields[4], self.parent);
                // Children first (a sandbox cgroup runc failed to remove), then the parent.
                if let Ok(children) = std::fs::read_dir(&dir) {
                    for c in children.flatten().filter(|c| c.path().is_dir()) {
                        let _ = std::fs::remove_dir(c.path());
                    }
                }
                let _ = std::fs::remove_dir(&dir);
            }
        }
    }
}

#[test]
fn containerd_runs_a_pod_sandbox_through_skiff_cni() {
    let node = Node::new("10.244.40.0/24", "10.250.0.1");
    let dir = tempfile::tempdir().unwrap();
    let archive = build_pause_image(&dir.path().join("image"));
    let cgroups = CgroupParent::new();
    let containerd = Containerd::start(&node, &dir.path().join("c"));
    containerd.import(&archive);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut cri = containerd.client().await;
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "web".into(),
                uid: "uid-web-1".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: "web".into(),
            log_directory: dir.path().join("logs").to_string_lossy().into_owned(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroups.parent.clone(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = cri
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", containerd.log()))
            .into_inner()
            .pod_sandbox_id;
        let status = cri
            .pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        let ip: std::net::Ipv4Addr =
            status.network.unwrap().ip.parse().expect("sandbox has an IPv4 address");
        assert_eq!(ip.octets()[..3], [10, 244, 40], "{ip} not from the podCIDR");
        assert_eq!(node.allocations(), vec![ip.to_string()]);
        assert_eq!(node.pod_links().len(), 1);
        assert!(node.ns.ping(ip), "node cannot reach the sandbox at {ip}");

        cri.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: id.clone() }).await.unwrap();
        assert!(node.allocations().is_empty(), "StopPodSandbox did not release the address");
        assert!(node.pod_links().is_empty(), "StopPodSandbox left {:?}", node.pod_links());
        cri.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }).await.unwrap();
    });
}
