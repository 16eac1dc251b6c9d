//! Node network glue: skiff-cni install and conflist, cross-node and unreachable routes from
//! the Node watch, the in-process eBPF proxy.
//!
//! - [`write_cni_config`] writes the one conflist containerd reads (`max_conf_num = 1`):
//!   skiff-cni with this node's pod CIDR (the configuration `skiff_cni::config` parses),
//!   and [`write_node_config`] the node file a conflist written by the proxy DaemonSet's
//!   init container reads the pod CIDR from (`skiff_cni::install`).
//! - [`install_cni`] copies skiff-cni and a `loopback` plugin (containerd's CRI brings up
//!   each pod's `lo` through it) into containerd's CNI `bin_dir`.
//! - [`run_routes`] keeps skiff-cni's route library ([`skiff_cni::routes::sync`]) in step
//!   with the Node watch: level-triggered, the whole node list on every event, plus a
//!   periodic resync that repairs routes someone else removed.
//! - The eBPF proxy runs in process through `skiff_proxy::daemon::run_with` (the agent calls
//!   it directly, over the same shared informers).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use ipnetwork::Ipv4Network;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use skiff_cni::routes::{NodeRoute, RouteConfig};
use skiff_core::informers::{Informer, Informers};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("copying {from} to {to}")]
    Copy {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "skiff-cni binary not found (looked in {looked:?}); build it: cargo build -p skiff-cni"
    )]
    CniBinaryMissing { looked: Vec<PathBuf> },
    #[error("opening a netlink connection for routes")]
    Netlink(#[source] skiff_cni::netns::Error),
    #[error("the Node watch ended")]
    WatchEnded,
}

pub use skiff_cni::install::{CNI_VERSION, CONFLIST_NAME};

/// What the node's conflist says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniSettings {
    /// The network name (names skiff-cni's IPAM store directory). Default `skiff`.
    pub network_name: String,
    /// This node's pod CIDR (`Node.spec.podCIDR`).
    pub pod_cidr: Ipv4Network,
    /// skiff-cni's IPAM state directory (default `/var/lib/cni/skiff`, skiff-cni's own).
    pub data_dir: PathBuf,
    /// MTU of the pod veths: 1500 host-gw, 1450 over VXLAN.
    pub mtu: u32,
}

impl CniSettings {
    pub fn new(pod_cidr: Ipv4Network) -> Self {
        CniSettings {
            network_name: "skiff".into(),
            pod_cidr,
            data_dir: skiff_cni::config::DEFAULT_DATA_DIR.into(),
            mtu: skiff_cni::config::DEFAULT_MTU,
        }
    }

    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = dir.into();
        self
    }

    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = mtu;
        self
    }

    fn list(&self) -> skiff_cni::install::Conflist {
        use skiff_cni::install::{Conflist, PodCidrSource};
        let mut list = Conflist::new(PodCidrSource::Inline(self.pod_cidr.to_string()));
        list.network_name = self.network_name.clone();
        list.data_dir = Some(self.data_dir.clone());
        list.mtu = Some(self.mtu);
        list
    }

    /// The conflist JSON (skiff-cni's own shape, the pod CIDR inline).
    pub fn conflist(&self) -> serde_json::Value {
        self.list().to_json()
    }

    /// The node file: the pod CIDR and MTU, for a conflist that names it.
    pub fn node_config(&self) -> skiff_cni::config::NodeConfig {
        skiff_cni::config::NodeConfig { pod_cidr: self.pod_cidr.to_string(), mtu: Some(self.mtu) }
    }
}

/// Writes [`CONFLIST_NAME`] into `conf_dir` (created if missing), atomically.
pub fn write_cni_config(conf_dir: &Path, settings: &CniSettings) -> Result<PathBuf> {
    settings.list().write(conf_dir).map(|(path, _)| path).map_err(|e| match e {
        skiff_cni::install::Error::Write { path, source } => Error::Write { path, source },
        e => Error::Write { path: conf_dir.to_path_buf(), source: std::io::Error::other(e) },
    })
}

/// Writes the node file at `path` (its directory created if missing), atomically.
pub fn write_node_config(path: &Path, settings: &CniSettings) -> Result<()> {
    settings.node_config().write(path).map_err(|source| Error::Write { path: path.into(), source })
}

/// Where the reference CNI plugins live on Debian (containernetworking-plugins).
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";

/// Installs skiff-cni (found beside the running executable, see [`find_skiff_cni`]) and a
/// `loopback` plugin into `bin_dir`.
pub fn install_cni(bin_dir: &Path) -> Result<()> {
    install_cni_from(bin_dir, &find_skiff_cni()?)
}

/// Installs the given skiff-cni binary and a `loopback` plugin into `bin_dir`: the
/// reference plugin from [`REFERENCE_PLUGIN_DIR`] when installed, otherwise a small
/// shell plugin that brings `lo` up (all containerd asks of it).
pub fn install_cni_from(bin_dir: &Path, skiff_cni: &Path) -> Result<()> {
    std::fs::create_dir_all(bin_dir)
        .map_err(|source| Error::Write { path: bin_dir.to_path_buf(), source })?;
    copy_executable(skiff_cni, &bin_dir.join("skiff-cni"))?;
    install_loopback(bin_dir)
}

/// Installs only the `loopback` plugin containerd calls for every sandbox (where skiff-cni
/// comes from elsewhere: the proxy DaemonSet's init container).
pub fn install_loopback(bin_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(bin_dir)
        .map_err(|source| Error::Write { path: bin_dir.to_path_buf(), source })?;
    let reference = Path::new(REFERENCE_PLUGIN_DIR).join("loopback");
    if reference.is_file() {
        copy_executable(&reference, &bin_dir.join("loopback"))
    } else {
        write_executable(&bin_dir.join("loopback"), LOOPBACK_SH.as_bytes())
    }
}

/// A minimal `loopback` CNI plugin (ADD brings `lo` up in CNI_NETNS; DEL/CHECK succeed;
/// VERSION lists the versions libcni asks for).
const LOOPBACK_SH: &str = r#"#!/bin/sh
# loopback CNI plugin written by skiff-agent (containernetworking-plugins is not installed).
case "$CNI_COMMAND" in
ADD)
    nsenter --net="$CNI_NETNS" ip link set lo up || exit 1
    printf '{"cniVersion":"0.3.1","interfaces":[{"name":"lo","mac":"00:00:00:00:00:00","sandbox":"%s"}],"ips":[{"version":"4","interface":0,"address":"127.0.0.1/8"}],"dns":{}}' "$CNI_NETNS"
    ;;
DEL|CHECK) ;;
VERSION)
    printf '{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}'
    ;;
*)
    printf '{"cniVersion":"0.3.1","code":4,"msg":"unknown CNI_COMMAND %s"}' "$CNI_COMMAND"
    exit 1
    ;;
esac
"#;

/// The skiff-cni binary: `$SKIFF_CNI_BIN`, else beside the running executable (or one
/// directory up, for test binaries under `target/<profile>/deps`), else in `$PATH`.
pub fn find_skiff_cni() -> Result<PathBuf> {
    let mut looked = Vec::new();
    if let Some(p) = std::env::var_os("SKIFF_CNI_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("skiff-cni");
            if p.is_file() {
                return Ok(p);
            }
            looked.push(p);
        }
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("skiff-cni");
        if p.is_file() {
            return Ok(p);
        }
    }
    looked.push("$PATH".into());
    Err(Error::CniBinaryMissing { looked })
}

/// Copies through a temporary name and renames: replacing a plugin that is running (text
/// file busy) or being read by containerd is safe.
fn copy_executable(from: &Path, to: &Path) -> Result<()> {
    let tmp = to.with_extension("skiff-tmp");
    std::fs::copy(from, &tmp).map_err(|source| Error::Copy {
        from: from.into(),
        to: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, to).map_err(|source| Error::Copy {
        from: tmp.clone(),
        to: to.into(),
        source,
    })
}

fn write_executable(path: &Path, body: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("skiff-tmp");
    std::fs::write(&tmp, body).map_err(|source| Error::Write { path: tmp.clone(), source })?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|source| Error::Write { path: tmp.clone(), source })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Write { path: path.into(), source })
}

/// How often [`run_routes`] re-applies the routes without a Node event.
pub const ROUTE_RESYNC: Duration = Duration::from_secs(30);

/// Keeps this node's routes in step with the Node list (in the calling thread's network
/// namespace). Runs until the watch ends; sync failures are logged and retried on the
/// next event or resync.
pub async fn run_routes(client: kube::Client, node_name: &str, config: RouteConfig) -> Result<()> {
    run_routes_in(client, node_name, config, None).await
}

/// [`run_routes`] over the process's shared Node informer.
pub async fn run_routes_shared(
    nodes: &Informer<Node>,
    node_name: &str,
    config: RouteConfig,
) -> Result<()> {
    run_routes_with(nodes, node_name, config, None).await
}

/// [`run_routes`] in the network namespace at `netns` (`/run/netns/NAME`) when given.
pub async fn run_routes_in(
    client: kube::Client,
    node_name: &str,
    config: RouteConfig,
    netns: Option<&Path>,
) -> Result<()> {
    run_routes_with(&Informers::new(client).all::<Node>(), node_name, config, netns).await
}

async fn run_routes_with(
    nodes: &Informer<Node>,
    node_name: &str,
    mut config: RouteConfig,
    netns: Option<&Path>,
) -> Result<()> {
    config.local_node = node_name.to_string();
    let handle = match netns {
        Some(path) => {
            let ns = skiff_cni::netns::NetNs::open(path).map_err(Error::Netlink)?;
            skiff_cni::netns::netlink_in(&ns).map_err(Error::Netlink)?
        }
        None => skiff_cni::netns::netlink_here().map_err(Error::Netlink)?,
    };
    let reader = nodes.ready_store().await;
    let mut events = nodes.subscribe();
    let mut resync = tokio::time::interval(ROUTE_RESYNC);
    let mut ready = false;
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                None => return Err(Error::WatchEnded),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "node watch");
                    continue;
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => continue,
                Some(Ok(_)) => ready = true,
            },
            _ = resync.tick() => {}
        }
        if !ready {
            continue;
        }
        let nodes: Vec<NodeRoute> =
            reader.state().iter().filter_map(|n| NodeRoute::from_node(n)).collect();
        let span = tracing::debug_span!("route sync", node = node_name, nodes = nodes.len());
        let _enter = span.enter();
        match skiff_cni::routes::sync(&handle, &config, &nodes).await {
            Ok(report) => tracing::debug!(
                installed = report.installed,
                removed = report.removed.len(),
                "routes synced"
            ),
            Err(e) => tracing::warn!(error = %e, "route sync failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_is_what_skiff_cni_parses() {
        let s = CniSettings::new("10.244.3.0/24".parse().unwrap()).data_dir("/tmp/ipam").mtu(1450);
        let list = s.conflist();
        assert_eq!(list["cniVersion"], CNI_VERSION);
        // libcni hands each plugin its entry plus cniVersion and name.
        let mut plugin = list["plugins"][0].clone();
        plugin["cniVersion"] = list["cniVersion"].clone();
        plugin["name"] = list["name"].clone();
        let parsed = skiff_cni::config::PluginConfig::parse(plugin.to_string().as_bytes()).unwrap();
        assert_eq!(parsed.pod_cidr.to_string(), "10.244.3.0/24");
        assert_eq!(parsed.mtu, 1450);
        assert_eq!(parsed.data_dir, PathBuf::from("/tmp/ipam"));
        assert_eq!(parsed.name, "skiff");
    }

    #[test]
    fn writes_and_installs() {
        let dir = tempfile::tempdir().unwrap();
        let s = CniSettings::new("10.244.3.0/24".parse().unwrap());
        let path = write_cni_config(&dir.path().join("net.d"), &s).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(v, s.conflist());

        let fake = dir.path().join("fake-skiff-cni");
        std::fs::write(&fake, b"#!/bin/sh\n").unwrap();
        let bin = dir.path().join("bin");
        install_cni_from(&bin, &fake).unwrap();
        assert_eq!(std::fs::read(bin.join("skiff-cni")).unwrap(), b"#!/bin/sh\n");
        assert!(bin.join("loopback").is_file());
        // Installing again over the existing files works.
        install_cni_from(&bin, &fake).unwrap();
    }

    #[test]
    fn the_fallback_loopback_plugin_answers_version() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loopback");
        write_executable(&p, LOOPBACK_SH.as_bytes()).unwrap();
        let out = std::process::Command::new(&p).env("CNI_COMMAND", "VERSION").output().unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["supportedVersions"].as_array().unwrap().iter().any(|x| x == "0.3.1"));
    }
}
