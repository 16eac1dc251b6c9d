//! `skiff-cni install --bin-dir DIR [--conf-dir DIR ...]`: puts this very binary into the
//! node's CNI plugin directory and writes the node's conflist, as the init container of a
//! DaemonSet does (Cilium's and flannel's `install-cni` step), so the node gets the plugin
//! from the image it runs.
//!
//! The conflist an init container writes cannot know the node's pod CIDR (it is not in the
//! downward API and may not be assigned yet): it names the node file instead
//! ([`crate::config::NODE_CONFIG_FIELD`]), which the node agent writes once the Node has
//! one, and which the plugin reads at each call (flannel's `subnet.env`). Until then ADD
//! answers CNI code 11 and the runtime retries the sandbox.
//!
//! The copy is written beside its destination and renamed over it, so a runtime calling the
//! plugin during an upgrade runs either the old binary or the new one, never half of one;
//! the same bytes again are left alone.

use std::path::{Path, PathBuf};

/// The plugin's file name in the bin dir (the conflist's `type`).
pub const PLUGIN_NAME: &str = "skiff-cni";

/// The conflist's file name in the conf dir (one file: skiff's containerd reads one).
pub const CONFLIST_NAME: &str = "10-skiff.conflist";

/// The CNI spec version of the conflist: containerd 1.6's libcni knows versions up to
/// 1.0.0 (skiff-cni speaks 0.4.0, 1.0.0 and 1.1.0).
pub const CNI_VERSION: &str = "1.0.0";

/// Usage of `skiff-cni install`.
pub const USAGE: &str = "usage: skiff-cni install --bin-dir DIR [--conf-dir DIR [--node-config FILE] [--data-dir DIR] [--mtu N] [--network NAME]]";

/// The node's conflist: one skiff-cni entry, with its pod CIDR inline or read from the
/// node file at each call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflist {
    /// The network name (names the IPAM store directory). Default `skiff`.
    pub network_name: String,
    /// Where the pod CIDR comes from.
    pub pod_cidr: PodCidrSource,
    /// IPAM state directory (`None`: the plugin's default).
    pub data_dir: Option<PathBuf>,
    /// MTU of the pod veths (`None`: the node file's, else 1500).
    pub mtu: Option<u32>,
}

/// Where a conflist takes the node's pod CIDR from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodCidrSource {
    /// Written into the conflist (the agent's own conflist, once it knows it).
    Inline(String),
    /// Read from the node file at each call (a conflist written before the node had one).
    NodeFile(PathBuf),
}

impl Conflist {
    pub fn new(pod_cidr: PodCidrSource) -> Self {
        Conflist { network_name: "skiff".into(), pod_cidr, data_dir: None, mtu: None }
    }

    /// The conflist JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let mut plugin = serde_json::json!({"type": PLUGIN_NAME});
        match &self.pod_cidr {
            PodCidrSource::Inline(cidr) => plugin["podCIDR"] = cidr.clone().into(),
            PodCidrSource::NodeFile(path) => {
                plugin[crate::config::NODE_CONFIG_FIELD] = path.to_string_lossy().into()
            }
        }
        if let Some(dir) = &self.data_dir {
            plugin["dataDir"] = dir.to_string_lossy().into();
        }
        if let Some(mtu) = self.mtu {
            plugin["mtu"] = mtu.into();
        }
        serde_json::json!({
            "cniVersion": CNI_VERSION,
            "name": self.network_name,
            "plugins": [plugin],
        })
    }

    /// Writes [`CONFLIST_NAME`] into `conf_dir` (created if missing), atomically; returns
    /// the file's path and whether it changed.
    pub fn write(&self, conf_dir: &Path) -> Result<(PathBuf, bool), Error> {
        std::fs::create_dir_all(conf_dir)
            .map_err(|source| Error::Write { path: conf_dir.to_path_buf(), source })?;
        let body = serde_json::to_vec_pretty(&self.to_json()).unwrap_or_default();
        let dest = conf_dir.join(CONFLIST_NAME);
        let changed = write_atomically(&dest, &body, 0o644)?;
        Ok((dest, changed))
    }
}

/// What `skiff-cni install` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallArgs {
    pub bin_dir: PathBuf,
    /// Write the conflist here (`None`: the plugin only).
    pub conf_dir: Option<PathBuf>,
    pub conflist: Conflist,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{USAGE} (got {0:?})")]
    Usage(Vec<String>),
    #[error("{0} is not a directory: mount the node's CNI bin dir there (hostPath /opt/cni/bin)")]
    NoBinDir(PathBuf),
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `install`'s arguments (those after `install`): `--flag value` or `--flag=value`.
pub fn parse_args(args: &[String]) -> Result<InstallArgs, Error> {
    let usage = || Error::Usage(args.to_vec());
    let (mut bin_dir, mut conf_dir, mut node_config, mut data_dir, mut mtu, mut network) =
        (None, None, None, None, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, value) = match arg.split_once('=') {
            Some((f, v)) => (f, v.to_owned()),
            None => (arg.as_str(), it.next().ok_or_else(usage)?.clone()),
        };
        let slot = match flag {
            "--bin-dir" => &mut bin_dir,
            "--conf-dir" => &mut conf_dir,
            "--node-config" => &mut node_config,
            "--data-dir" => &mut data_dir,
            "--mtu" => &mut mtu,
            "--network" => &mut network,
            _ => return Err(usage()),
        };
        if slot.replace(value).is_some() || flag.is_empty() {
            return Err(usage());
        }
    }
    let bin_dir = PathBuf::from(bin_dir.ok_or_else(usage)?);
    if conf_dir.is_none() && (node_config.is_some() || data_dir.is_some() || mtu.is_some()) {
        return Err(usage());
    }
    let mtu = match mtu {
        Some(m) => match m.parse::<u32>() {
            Ok(m) if (576..=65535).contains(&m) => Some(m),
            _ => return Err(usage()),
        },
        None => None,
    };
    let node_config = node_config.unwrap_or_else(|| crate::config::DEFAULT_NODE_CONFIG.to_owned());
    let mut conflist = Conflist::new(PodCidrSource::NodeFile(node_config.into()));
    conflist.data_dir = data_dir.map(PathBuf::from);
    conflist.mtu = mtu;
    if let Some(n) = network {
        conflist.network_name = n;
    }
    Ok(InstallArgs { bin_dir, conf_dir: conf_dir.map(PathBuf::from), conflist })
}

/// Writes `data` to `dest` through a temporary beside it, synced and renamed over it; the
/// same bytes again are left alone. Returns whether the file changed.
fn write_atomically(dest: &Path, data: &[u8], mode: u32) -> Result<bool, Error> {
    if std::fs::read(dest).is_ok_and(|old| old == data) {
        return Ok(false);
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A name of this install's own (in a container the pid is often 1 for every
    // installer), created exclusively, synced before it is renamed into place.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{nanos}", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dest)
    };
    write().map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Write { path: dest.to_path_buf(), source }
    })?;
    Ok(true)
}

/// Runs `skiff-cni install`: the plugin copied from `source` (the running binary), then
/// the conflist if asked. Returns what changed, for the log line.
pub fn run(source: &Path, args: &InstallArgs) -> Result<Vec<String>, Error> {
    let mut done = Vec::new();
    let changed = install(source, &args.bin_dir)?;
    done.push(format!(
        "{} {}",
        if changed { "installed" } else { "already installed" },
        args.bin_dir.join(PLUGIN_NAME).display()
    ));
    if let Some(conf_dir) = &args.conf_dir {
        let (path, changed) = args.conflist.write(conf_dir)?;
        done.push(format!("{} {}", if changed { "wrote" } else { "kept" }, path.display()));
    }
    Ok(done)
}

/// Copies `source` (the running binary) to `<bin_dir>/skiff-cni`; returns whether the file
/// changed.
pub fn install(source: &Path, bin_dir: &Path) -> Result<bool, Error> {
    if !bin_dir.is_dir() {
        return Err(Error::NoBinDir(bin_dir.to_path_buf()));
    }
    let data =
        std::fs::read(source).map_err(|e| Error::Read { path: source.to_path_buf(), source: e })?;
    write_atomically(&bin_dir.join(PLUGIN_NAME), &data, 0o755)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_once_atomically_and_executable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::write(&src, b"plugin v1").unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        assert!(install(&src, &bin).unwrap());
        assert!(!install(&src, &bin).unwrap(), "the same bytes are left alone");
        let dest = bin.join(PLUGIN_NAME);
        assert_eq!(std::fs::read(&dest).unwrap(), b"plugin v1");
        assert_eq!(std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777, 0o755);
        std::fs::write(&src, b"plugin v2").unwrap();
        assert!(install(&src, &bin).unwrap());
        assert_eq!(std::fs::read(&dest).unwrap(), b"plugin v2");
        let names: Vec<_> =
            std::fs::read_dir(&bin).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(PLUGIN_NAME)], "no temporary left");
    }

    #[test]
    fn bad_arguments_and_a_missing_dir_say_what_to_do() {
        let args = |a: &[&str]| parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let err = args(&["--bin"]).unwrap_err();
        assert!(err.to_string().contains("usage: skiff-cni install --bin-dir DIR"), "{err}");
        assert_eq!(args(&["--bin-dir=/x"]).unwrap().bin_dir, PathBuf::from("/x"));
        assert_eq!(args(&["--bin-dir=/x"]).unwrap().conf_dir, None);
        for bad in [
            &["--bin-dir", "/x", "--bin-dir", "/y"][..],
            &["--bin-dir", "/x", "--node-config", "/n"],
            &["--bin-dir", "/x", "--conf-dir", "/c", "--mtu", "10"],
            &["--bin-dir", "/x", "--conf-dir"],
            &["--conf-dir", "/c"],
            &["--bin-dir", "/x", "--frobnicate", "1"],
        ] {
            assert!(matches!(args(bad), Err(Error::Usage(_))), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let err = install(Path::new("/bin/true"), &dir.path().join("nope")).unwrap_err();
        assert!(err.to_string().contains("hostPath /opt/cni/bin"), "{err}");
    }

    /// The plugin's stdin for the conflist's one entry, as libcni builds it (the list's
    /// name and cniVersion added to the entry).
    fn entry(conflist: &serde_json::Value) -> Vec<u8> {
        let mut e = conflist["plugins"][0].clone();
        e["name"] = conflist["name"].clone();
        e["cniVersion"] = conflist["cniVersion"].clone();
        serde_json::to_vec(&e).unwrap()
    }

    #[test]
    fn the_init_containers_conflist_takes_the_pod_cidr_from_the_node_file() {
        use crate::config::{Error as ConfigError, NodeConfig, PluginConfig};
        let dir = tempfile::tempdir().unwrap();
        let (bin, conf) = (dir.path().join("bin"), dir.path().join("net.d"));
        std::fs::create_dir(&bin).unwrap();
        let node_file = dir.path().join("run/node.json");
        let a: Vec<String> = [
            "--bin-dir",
            bin.to_str().unwrap(),
            "--conf-dir",
            conf.to_str().unwrap(),
            "--node-config",
            node_file.to_str().unwrap(),
            "--data-dir=/var/lib/x",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let args = parse_args(&a).unwrap();
        let src = dir.path().join("plugin");
        std::fs::write(&src, b"plugin").unwrap();
        let done = run(&src, &args).unwrap();
        assert!(done[1].starts_with("wrote"), "{done:?}");
        assert!(run(&src, &args).unwrap()[1].starts_with("kept"), "rewritten only on change");
        let list: serde_json::Value =
            serde_json::from_slice(&std::fs::read(conf.join(CONFLIST_NAME)).unwrap()).unwrap();
        assert_eq!(list["plugins"][0]["nodeConfig"], node_file.to_str().unwrap());
        assert!(list["plugins"][0].get("podCIDR").is_none());

        // Before the agent knows the pod CIDR: ADD is "try again later", DEL still works.
        let err = PluginConfig::parse(&entry(&list)).unwrap_err();
        assert!(matches!(err, ConfigError::NoPodCidrYet(_)), "{err}");
        assert!(err.to_string().contains("skiff-agent writes it"), "{err}");
        let del = PluginConfig::parse_for_del(&entry(&list)).unwrap();
        assert_eq!(del.network_dir(), PathBuf::from("/var/lib/x/networks/skiff"));

        NodeConfig { pod_cidr: "10.244.7.0/24".into(), mtu: Some(1450) }.write(&node_file).unwrap();
        let cfg = PluginConfig::parse(&entry(&list)).unwrap();
        assert_eq!((cfg.pod_cidr.to_string(), cfg.mtu), ("10.244.7.0/24".into(), 1450));
        // The conflist's own MTU wins over the node file's.
        let mut with_mtu = list.clone();
        with_mtu["plugins"][0]["mtu"] = 1400.into();
        assert_eq!(PluginConfig::parse(&entry(&with_mtu)).unwrap().mtu, 1400);
        // A broken node file is an invalid configuration, not a retry.
        std::fs::write(&node_file, b"{").unwrap();
        assert!(matches!(PluginConfig::parse(&entry(&list)), Err(ConfigError::Invalid(_))));
    }
}
