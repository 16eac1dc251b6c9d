//! A real node for tests (feature `testing`): its own network namespace, containerd, CNI
//! (skiff-cni) and the test images, all torn down by RAII.
//!
//! [`NodeRig::start`] creates a uniquely named namespace `/run/netns/skr<pid>-<n>` (loopback
//! up, the node address on `lo` as a /32), a directory `/run/skiff-test-<pid>-<n>/` for
//! everything else (containerd root/state/runc root/config/log, CNI bin and conf dirs,
//! skiff-cni's IPAM store, pod logs), installs skiff-cni, writes the conflist with the
//! node's pod CIDR, starts containerd inside the namespace (nsenter) and imports
//! `skiff.test/pause:1` and `skiff.test/tools:1`.
//!
//! Several nodes share an L2 segment through a [`Lab`] (a bridge in a namespace of its own,
//! [`NodeRigConfig::lab`]); the node address then sits on the node's `lab0`.
//!
//! Dropping the rig (also while unwinding from a panic) stops and removes every pod through
//! CRI, stops containerd, kills whatever is left in the rig's cgroup parent and its shims,
//! unmounts what containerd mounted under its directories, removes the cgroup parent in
//! every hierarchy, deletes the namespace and removes the directory. Nothing is routed off
//! the machine: the namespace has no link but `lo` and the pods' veths.

pub mod streaming;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use ipnetwork::Ipv4Network;

use crate::containerd::{self, Containerd, ContainerdConfig};
use crate::network::{self, CniSettings};
use crate::runtime::cri::CriRuntime;
use crate::runtime::{self, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL, Runtime, api};
use crate::{images, lab};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command failed to start or exited unsuccessfully (`lab::Error::Command` or
    /// `lab::Error::Spawn`, shown as they are).
    #[error(transparent)]
    Command(#[from] lab::Error),
    #[error("creating the node directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building the test images")]
    Images(#[from] images::Error),
    #[error("CNI setup")]
    Network(#[from] network::Error),
    #[error("starting containerd")]
    Containerd(#[from] containerd::Error),
    #[error("CRI")]
    Runtime(#[from] runtime::Error),
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// What kind of node to start.
#[derive(Debug, Clone)]
pub struct NodeRigConfig {
    /// The node's pod CIDR (written into the conflist).
    pub pod_cidr: Ipv4Network,
    /// The node's own address, put on `lo` in the namespace.
    pub node_ip: Ipv4Addr,
    /// The skiff-cni binary; default [`network::find_skiff_cni`] (beside the test binary's
    /// target dir, `$SKIFF_CNI_BIN`, or `$PATH`).
    pub skiff_cni: Option<PathBuf>,
    /// Import the test images (default true).
    pub import_images: bool,
    /// Write the conflist at start (default true). Off for a node whose agent writes it
    /// once it learns its podCIDR (containerd picks the file up when it appears; until
    /// then RunPodSandbox fails with "cni config uninitialized").
    pub write_cni_config: bool,
    /// Plug the node into a [`Lab`] segment (its namespace name and prefix length): the
    /// node address goes on the node's `lab0` with that prefix instead of on `lo`.
    pub lab: Option<(String, u8)>,
}

impl Default for NodeRigConfig {
    fn default() -> Self {
        NodeRigConfig {
            pod_cidr: Ipv4Network::new(Ipv4Addr::new(10, 244, 200, 0), 24)
                .unwrap_or_else(|_| unreachable!("a /24 is a valid prefix")),
            node_ip: Ipv4Addr::new(10, 250, 200, 1),
            skiff_cni: None,
            import_images: true,
            write_cni_config: true,
            lab: None,
        }
    }
}

impl NodeRigConfig {
    pub fn pod_cidr(mut self, cidr: Ipv4Network) -> Self {
        self.pod_cidr = cidr;
        self
    }

    pub fn node_ip(mut self, ip: Ipv4Addr) -> Self {
        self.node_ip = ip;
        self
    }

    /// Leaves the conflist to the node's agent (see [`NodeRigConfig::write_cni_config`]).
    pub fn without_cni_config(mut self) -> Self {
        self.write_cni_config = false;
        self
    }

    /// Plugs the node into `lab` (its address must be inside the lab's subnet).
    pub fn lab(mut self, lab: &Lab) -> Self {
        self.lab = Some((lab.netns.clone(), lab.subnet.prefix()));
        self
    }
}

/// A lab L2 segment: a bridge `br0` in a namespace of its own, connected to nothing but the
/// nodes plugged into it (never to the host's interfaces). Deleted on drop, with the node
/// ends of its veths.
#[derive(Debug)]
pub struct Lab {
    netns: String,
    subnet: Ipv4Network,
    /// Host ends of [`Lab::connect_host`] links, deleted on drop (a namespace's links go
    /// asynchronously after `ip netns del`).
    host_links: std::sync::Mutex<Vec<String>>,
}

impl Lab {
    pub fn new(subnet: Ipv4Network) -> Result<Lab> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let netns = format!("skl{}-{n}", std::process::id() % 100_000);
        run(Command::new("ip").args(["netns", "add", &netns]))?;
        let lab = Lab { netns, subnet, host_links: Default::default() };
        lab::add_bridge(&lab.netns)?;
        Ok(lab)
    }

    /// Connects the host's own network namespace to the segment: a veth whose host end
    /// (named `skh<pid>-<n>`) holds `host_ip` with the lab's prefix, so nodes reach
    /// processes on the host (an apiserver) at `host_ip`. Only the lab subnet is routed
    /// there; nothing is bridged to the host's other interfaces. Removed with the lab.
    pub fn connect_host(&self, host_ip: Ipv4Addr) -> Result<String> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let host_end = format!("skh{}-{n}", std::process::id() % 100_000);
        let lab_end = format!("h{n}");
        let host_addr = format!("{host_ip}/{}", self.subnet.prefix());
        lab::connect_host(&self.netns, &host_end, &lab_end, &host_addr, || {
            self.host_links.lock().unwrap_or_else(|e| e.into_inner()).push(host_end.clone());
            Ok(())
        })?;
        Ok(host_end)
    }

    /// The lab namespace's name.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    pub fn subnet(&self) -> Ipv4Network {
        self.subnet
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for link in self.host_links.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = Command::new("ip").args(["link", "del", &link]).stderr(Stdio::null()).status();
        }
        let _ =
            Command::new("ip").args(["netns", "del", &self.netns]).stderr(Stdio::null()).status();
    }
}

/// A real node: namespace + containerd + CNI + images. See the module docs.
#[derive(Debug)]
pub struct NodeRig {
    netns: String,
    dir: PathBuf,
    config: ContainerdConfig,
    cni: CniSettings,
    node_ip: Ipv4Addr,
    // Option so Drop can stop it before cleaning up.
    containerd: Option<Containerd>,
    netns_created: bool,
}

/// Rigs alive in this process, and the machine-wide directories containerd's shims and
/// libcni create that did not exist before the first of them: the last rig to go removes
/// them (when empty: another process may use them too).
static LIVE_RIGS: std::sync::Mutex<(usize, Vec<&'static str>)> =
    std::sync::Mutex::new((0, Vec::new()));

/// Directories outside the instance that containerd 1.6 (shim sockets) and libcni (its
/// result cache) always use; deepest first.
const SHARED_DIRS: [&str; 4] =
    ["/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni"];

impl NodeRig {
    /// Starts a node (needs root, containerd, runc, ctr, nsenter, ip, busybox-static and a
    /// built skiff-cni).
    pub async fn start(cfg: NodeRigConfig) -> Result<NodeRig> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let netns = format!("skr{}-{n}", pid % 100_000);
        let dir = PathBuf::from(format!("/run/skiff-test-{pid}-{n}"));
        let config = ContainerdConfig::under(&dir);
        let cni = CniSettings::new(cfg.pod_cidr).data_dir(dir.join("ipam"));
        // The guard exists from here on: a failure below cleans up what was made.
        let mut rig = NodeRig {
            netns,
            dir,
            config,
            cni,
            node_ip: cfg.node_ip,
            containerd: None,
            netns_created: false,
        };
        {
            let mut live = LIVE_RIGS.lock().unwrap_or_else(|e| e.into_inner());
            if live.0 == 0 {
                live.1 = SHARED_DIRS.into_iter().filter(|d| !Path::new(d).exists()).collect();
            }
            live.0 += 1;
        }
        std::fs::create_dir_all(&rig.dir)
            .map_err(|source| Error::Dir { path: rig.dir.clone(), source })?;
        run(Command::new("ip").args(["netns", "add", &rig.netns]))?;
        rig.netns_created = true;
        run(&mut rig.command(&["ip", "link", "set", "lo", "up"]))?;
        match &cfg.lab {
            None => {
                run(&mut rig.command(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/32", cfg.node_ip),
                    "dev",
                    "lo",
                ]))?;
            }
            Some((lab_netns, prefix)) => {
                // The veth is made in the lab namespace (unique names there), its node end
                // moved into the node and renamed lab0.
                let (port, peer) = (format!("p{n}"), format!("q{n}"));
                lab::add_bridge_port(lab_netns, &port, &peer, &rig.netns)?;
                run(&mut rig.command(&["ip", "link", "set", &peer, "name", "lab0"]))?;
                run(&mut rig.command(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("{}/{prefix}", cfg.node_ip),
                    "dev",
                    "lab0",
                ]))?;
                run(&mut rig.command(&["ip", "link", "set", "lab0", "up"]))?;
            }
        }

        let skiff_cni = match cfg.skiff_cni {
            Some(p) => p,
            None => network::find_skiff_cni()?,
        };
        network::install_cni_from(&rig.config.cni_bin_dir, &skiff_cni)?;
        if cfg.write_cni_config {
            network::write_cni_config(&rig.config.cni_conf_dir, &rig.cni)?;
        } else {
            std::fs::create_dir_all(&rig.config.cni_conf_dir)
                .map_err(|source| Error::Dir { path: rig.config.cni_conf_dir.clone(), source })?;
        }
        rig.containerd = Some(Containerd::start(&rig.config, Some(&rig.netns)).await?);
        if cfg.import_images {
            let archives = images::build_test_images(&rig.dir.join("images"))?;
            for a in &archives {
                images::import(&rig.config.socket, a).await?;
            }
        }
        Ok(rig)
    }

    /// The namespace's name (`/run/netns/<name>`).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.netns))
    }

    /// The rig's directory (everything but the namespace and cgroups lives under it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's CRI socket.
    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    pub fn containerd_config(&self) -> &ContainerdConfig {
        &self.config
    }

    pub fn cni_settings(&self) -> &CniSettings {
        &self.cni
    }

    pub fn node_ip(&self) -> Ipv4Addr {
        self.node_ip
    }

    /// The cgroup parent pods of this node must use (removed on drop).
    pub fn cgroup_parent(&self) -> &str {
        &self.config.cgroup_parent
    }

    /// The running containerd (to restart or stop it).
    pub fn containerd(&mut self) -> Option<&mut Containerd> {
        self.containerd.as_mut()
    }

    /// containerd's log so far (for assertion messages).
    pub fn containerd_log(&self) -> String {
        std::fs::read_to_string(&self.config.log_file).unwrap_or_default()
    }

    /// A fresh CRI client.
    pub async fn runtime(&self) -> Result<CriRuntime> {
        Ok(CriRuntime::connect(&self.config.socket).await?)
    }

    /// A command run inside the node namespace (`nsenter --net=...`, host mount namespace).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.netns)).args(args);
        c
    }

    /// Runs a command in the node namespace; its stdout, or an error with its stderr.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        run(&mut self.command(args))
    }

    /// A sandbox config fit for this node: metadata and the pod labels, hostname, the
    /// node's cgroup parent, a log directory under the rig's directory, a PID namespace
    /// per container (containers should ask for the same in their own
    /// `linux.security_context.namespace_options`).
    pub fn sandbox_config(&self, namespace: &str, name: &str, uid: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self
                .dir
                .join("pods")
                .join(format!("{namespace}_{name}_{uid}"))
                .to_string_lossy()
                .into_owned(),
            labels: HashMap::from([
                (POD_UID_LABEL.to_string(), uid.to_string()),
                (POD_NAME_LABEL.to_string(), name.to_string()),
                (POD_NAMESPACE_LABEL.to_string(), namespace.to_string()),
            ]),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: self.config.cgroup_parent.clone(),
                // CRI's default (0) is NamespaceMode::POD for every namespace, a shared PID
                // namespace included; the kubelet asks for per-container PIDs.
                security_context: Some(api::LinuxSandboxSecurityContext {
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

    /// Stops and removes every sandbox (and so every container) through CRI.
    pub async fn remove_all_pods(&self) -> Result<()> {
        let cri = self.runtime().await?;
        for sb in cri.list_pod_sandboxes(&HashMap::new()).await? {
            cri.stop_pod_sandbox(&sb.id).await?;
            cri.remove_pod_sandbox(&sb.id).await?;
        }
        Ok(())
    }
}

impl Drop for NodeRig {
    fn drop(&mut self) {
        // Pods through CRI first (their network goes through CNI DEL), on a thread of its
        // own: Drop may run inside a tokio runtime, which cannot be blocked on.
        if self.containerd.as_ref().is_some_and(|c| c.pid().is_some()) {
            let socket = self.config.socket.clone();
            let result = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                rt.block_on(async move {
                    let cri = CriRuntime::connect(&socket)
                        .await
                        .map_err(|e| std::io::Error::other(e.to_string()))?
                        .with_request_timeout(std::time::Duration::from_secs(20));
                    let sandboxes = cri
                        .list_pod_sandboxes(&HashMap::new())
                        .await
                        .map_err(|e| std::io::Error::other(e.to_string()))?;
                    for sb in sandboxes {
                        let _ = cri.stop_pod_sandbox(&sb.id).await;
                        let _ = cri.remove_pod_sandbox(&sb.id).await;
                    }
                    Ok::<_, std::io::Error>(())
                })
            })
            .join();
            if let Ok(Err(e)) = result {
                tracing::warn!(error = %e, "rig: removing pods through CRI");
            }
        }
        if let Some(mut c) = self.containerd.take() {
            c.stop();
        }
        if let Err(e) = containerd::cleanup(&self.config) {
            tracing::warn!(error = %e, "rig: containerd cleanup");
        }
        if self.netns_created {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.netns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let mut live = LIVE_RIGS.lock().unwrap_or_else(|e| e.into_inner());
        live.0 = live.0.saturating_sub(1);
        if live.0 == 0 {
            // Shims remove their sockets as they exit, a moment after the pods went.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            for d in std::mem::take(&mut live.1) {
                while std::fs::remove_dir(d).is_err()
                    && Path::new(d).exists()
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
    }
}

fn run(cmd: &mut Command) -> Result<String> {
    Ok(lab::run(cmd)?)
}

/// What the control plane's ServiceAccount controller gives a namespace, for tests over an
/// in-process apiserver that runs without controllers: the `default` ServiceAccount and the
/// `kube-root-ca.crt` ConfigMap, which the admission-injected `kube-api-access-*` volume of
/// every pod reads. Existing objects are left alone.
pub async fn seed_namespace(client: &kube::Client, namespace: &str) {
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    use kube::api::{Api, PostParams};
    let sa = ServiceAccount {
        metadata: kube::api::ObjectMeta { name: Some("default".into()), ..Default::default() },
        ..Default::default()
    };
    if let Err(e) = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
    {
        tracing::debug!(error = %e, "seeding the default ServiceAccount");
    }
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("kube-root-ca.crt".into()),
            ..Default::default()
        },
        data: Some([("ca.crt".to_string(), "test CA\n".to_string())].into()),
        ..Default::default()
    };
    if let Err(e) = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
    {
        tracing::debug!(error = %e, "seeding kube-root-ca.crt");
    }
}

/// An in-process apiserver over the in-memory store, and a client of it, with the `default`
/// namespace seeded ([`seed_namespace`]): what the pod sync tests run the agent against.
pub async fn apiserver() -> (std::sync::Arc<skiff_apiserver::ApiServer>, kube::Client) {
    use skiff_apiserver::ApiServer;
    use skiff_store::memory::MemoryStore;
    let api = ApiServer::start(std::sync::Arc::new(MemoryStore::new()), Default::default())
        .await
        .expect("apiserver");
    let client = api.client();
    seed_namespace(&client, "default").await;
    (api, client)
}
