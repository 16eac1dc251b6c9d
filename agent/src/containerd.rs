//! containerd for a node: its config file (per-instance root/state/socket/runc Root, CRI and
//! CNI settings) and its process.
//!
//! [`ContainerdConfig::render`] writes a config version 2 TOML with every setting this
//! kind of machine needs (see `shared/reference/containerd.md`): per-instance `root`,
//! `state`, sockets, `opt` path and runc `Root` (so several instances run side by side);
//! cgroupfs (`SystemdCgroup = false`: PID 1 is not systemd); `restrict_oom_score_adj`
//! (without CAP_SYS_RESOURCE the pause container fails otherwise); network namespace mounts
//! under the state dir; the CRI streaming server on loopback with an ephemeral port; one
//! CNI config (skiff-cni's conflist).
//!
//! [`Containerd::start`] runs `containerd --config FILE`, inside a node network namespace
//! through `nsenter --net=/run/netns/NAME` when asked (never `ip netns exec`: it remounts
//! /sys and hides the cgroup mounts), and returns once CRI answers `Version`. Dropping the
//! handle (or [`Containerd::stop`]) stops containerd; running pods survive, as they do a
//! containerd restart. [`cleanup`] removes what an instance leaves behind for good: pod
//! processes and shims, mounts, state, and the pod cgroup-parent directories containerd
//! never removes.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cgroups::{cgroup_mounts, remove_cgroup_dirs, unescape_mountinfo};
use crate::runtime::Runtime;
use crate::runtime::cri::CriRuntime;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening containerd's log {path}")]
    OpenLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing containerd's config {path}")]
    WriteConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spawning {program} (is containerd installed? apt-get install containerd runc)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("containerd exited during startup ({status}); log:\n{log}")]
    Exited { status: std::process::ExitStatus, log: String },
    #[error("containerd's CRI did not answer within {timeout:?}: {last}; log:\n{log}")]
    NotReady { timeout: Duration, last: String, log: String },
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading /proc/self/mountinfo")]
    MountInfo(#[source] std::io::Error),
    #[error("cleaning the pods' cgroups")]
    Cgroups(#[from] crate::cgroups::Error),
}

/// One containerd instance's settings. Paths are per instance so that several containerds
/// (test nodes) run side by side on one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdConfig {
    /// Where the config file is written.
    pub config_file: PathBuf,
    /// Where containerd's stdout/stderr go.
    pub log_file: PathBuf,
    /// Persistent state (content store, snapshots, metadata).
    pub root: PathBuf,
    /// Runtime state (sockets, pod network namespaces, task bundles).
    pub state: PathBuf,
    /// The gRPC (CRI) socket; the ttrpc socket is `<socket>.ttrpc`.
    pub socket: PathBuf,
    /// runc's `--root` (the default `/run/containerd/runc/k8s.io` is shared between
    /// instances).
    pub runc_root: PathBuf,
    /// The `opt` plugin's directory.
    pub opt_path: PathBuf,
    /// Where the CNI plugins (skiff-cni, loopback) are.
    pub cni_bin_dir: PathBuf,
    /// Where the conflist is (exactly one: `max_conf_num = 1`).
    pub cni_conf_dir: PathBuf,
    /// The pod sandbox image, imported locally (never pulled).
    pub sandbox_image: String,
    /// Address of CRI's exec/attach streaming server (loopback: the agent proxies it).
    pub stream_server_address: String,
    /// Its port; 0 picks a free one.
    pub stream_server_port: u16,
    /// The cgroup parent the agent puts pods under (`LinuxPodSandboxConfig.cgroup_parent`).
    /// Not a containerd setting: [`cleanup`] removes it, as containerd never does.
    pub cgroup_parent: String,
}

impl Default for ContainerdConfig {
    /// A node's system instance: sockets under `/run/skiff/containerd` (the agent's
    /// `--containerd-socket` default), state under `/var/lib/skiff`, configs under
    /// `/etc/skiff`; the agent's own, never a host containerd's paths.
    fn default() -> Self {
        ContainerdConfig {
            config_file: "/etc/skiff/containerd/config.toml".into(),
            log_file: "/var/log/skiff/containerd.log".into(),
            root: "/var/lib/skiff/containerd".into(),
            state: "/run/skiff/containerd".into(),
            socket: "/run/skiff/containerd/containerd.sock".into(),
            runc_root: "/run/skiff/runc".into(),
            opt_path: "/var/lib/skiff/containerd-opt".into(),
            cni_bin_dir: "/var/lib/skiff/cni/bin".into(),
            cni_conf_dir: "/etc/skiff/cni/net.d".into(),
            sandbox_image: crate::images::PAUSE_IMAGE.into(),
            stream_server_address: "127.0.0.1".into(),
            stream_server_port: 0,
            cgroup_parent: "/skiff".into(),
        }
    }
}

impl ContainerdConfig {
    /// Every path of the instance under one directory (tests, side-by-side nodes); the
    /// cgroup parent is `/skiff-<dir's name>`.
    pub fn under(dir: &Path) -> Self {
        let tag = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        ContainerdConfig {
            config_file: dir.join("config.toml"),
            log_file: dir.join("containerd.log"),
            root: dir.join("root"),
            state: dir.join("state"),
            socket: dir.join("containerd.sock"),
            runc_root: dir.join("runc"),
            opt_path: dir.join("opt"),
            cni_bin_dir: dir.join("cni/bin"),
            cni_conf_dir: dir.join("cni/net.d"),
            cgroup_parent: format!("/skiff-{tag}"),
            ..ContainerdConfig::default()
        }
    }

    pub fn sandbox_image(mut self, image: impl Into<String>) -> Self {
        self.sandbox_image = image.into();
        self
    }

    /// containerd's config file (version 2).
    pub fn render(&self) -> String {
        let q = |p: &Path| toml_string(&p.to_string_lossy());
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        format!(
            r#"# Written by skiff-agent: one containerd instance of a skiff node.
version = 2
root = {root}
state = {state}

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[{cri}]
  sandbox_image = {sandbox_image}
  # Without CAP_SYS_RESOURCE the pause container fails otherwise.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = {stream_address}
  stream_server_port = "{stream_port}"
  enable_selinux = false

  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        # cgroupfs: PID 1 is not systemd here.
        SystemdCgroup = false
        Root = {runc_root}

  [{cri}.cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
    max_conf_num = 1
"#,
            root = q(&self.root),
            state = q(&self.state),
            socket = q(&self.socket),
            ttrpc = q(&self.ttrpc_socket()),
            opt = q(&self.opt_path),
            sandbox_image = toml_string(&self.sandbox_image),
            stream_address = toml_string(&self.stream_server_address),
            stream_port = self.stream_server_port,
            runc_root = q(&self.runc_root),
            cni_bin = q(&self.cni_bin_dir),
            cni_conf = q(&self.cni_conf_dir),
        )
    }

    /// containerd's ttrpc socket (shims talk to it).
    pub fn ttrpc_socket(&self) -> PathBuf {
        let mut s = self.socket.clone().into_os_string();
        s.push(".ttrpc");
        s.into()
    }

    /// Creates the directories the instance needs and writes the config file.
    pub fn write(&self) -> Result<()> {
        let parents = [&self.config_file, &self.log_file, &self.socket]
            .into_iter()
            .filter_map(|f| f.parent());
        let dirs = [
            &self.root,
            &self.state,
            &self.runc_root,
            &self.opt_path,
            &self.cni_bin_dir,
            &self.cni_conf_dir,
        ]
        .into_iter()
        .map(PathBuf::as_path)
        .chain(parents);
        for dir in dirs {
            std::fs::create_dir_all(dir)
                .map_err(|source| Error::CreateDir { path: dir.to_path_buf(), source })?;
        }
        std::fs::write(&self.config_file, self.render())
            .map_err(|source| Error::WriteConfig { path: self.config_file.clone(), source })
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// How long [`Containerd::start`] waits for CRI to answer (it boots in ~50 ms here).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Containerd::stop`] waits after SIGTERM before SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running containerd. Dropping it stops containerd (pods keep running).
#[derive(Debug)]
pub struct Containerd {
    config: ContainerdConfig,
    netns: Option<String>,
    child: Option<Child>,
}

impl Containerd {
    /// Writes the config, starts `containerd --config FILE` (in `/run/netns/<netns>` when
    /// given) and waits until its CRI answers `Version`.
    pub async fn start(config: &ContainerdConfig, netns: Option<&str>) -> Result<Containerd> {
        config.write()?;
        let mut c =
            Containerd { config: config.clone(), netns: netns.map(str::to_string), child: None };
        c.spawn().await?;
        Ok(c)
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.config.log_file)
            .map_err(|source| Error::OpenLog { path: self.config.log_file.clone(), source })?;
        let log2 = log
            .try_clone()
            .map_err(|source| Error::OpenLog { path: self.config.log_file.clone(), source })?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = match &self.netns {
            Some(ns) => {
                // nsenter execs containerd in place: the child's pid is containerd's.
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg("containerd");
                c
            }
            None => Command::new("containerd"),
        };
        cmd.arg("--config")
            .arg(&self.config.config_file)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        let program = if self.netns.is_some() { "nsenter" } else { "containerd" };
        let child =
            cmd.spawn().map_err(|source| Error::Spawn { program: program.into(), source })?;
        tracing::info!(pid = child.id(), socket = %self.config.socket.display(), netns = ?self.netns, "containerd started");
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("socket absent");
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(Error::Exited { status, log: self.log_since(log_start) });
            }
            if self.config.socket.exists() {
                match CriRuntime::connect(&self.config.socket).await {
                    Ok(cri) => match cri.version().await {
                        Ok(_) => return Ok(()),
                        Err(e) => last = e.to_string(),
                    },
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() > deadline {
                let log = self.log_since(log_start);
                self.kill();
                return Err(Error::NotReady { timeout: START_TIMEOUT, last, log });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The CRI socket.
    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    pub fn config(&self) -> &ContainerdConfig {
        &self.config
    }

    /// containerd's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The whole containerd log of this instance.
    pub fn log(&self) -> String {
        self.log_since(0)
    }

    fn log_since(&self, offset: u64) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.config.log_file) {
            let _ = f.seek(SeekFrom::Start(offset));
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Stops containerd (SIGTERM, SIGKILL after [`STOP_TIMEOUT`]) and waits for it.
    /// Running pods keep running. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops containerd and starts it again with the same config and namespace.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn().await
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes everything a stopped containerd instance leaves behind: processes of its pods
/// (found through the cgroup parent) and its shims (found by its socket on their command
/// line), mounts under its root and state, the pod cgroup-parent directories in every
/// cgroup hierarchy, and its directories (root, state, runc root, opt). Best effort on
/// processes and mounts; an error names the first directory it could not remove.
/// Call it only after [`Containerd::stop`] and only for an instance whose pods must go.
pub fn cleanup(config: &ContainerdConfig) -> Result<()> {
    let mounts = cgroup_mounts()?;
    // Pod processes first (SIGKILL through the cgroup), then the shims that reap them.
    if !config.cgroup_parent.is_empty() && config.cgroup_parent != "/" {
        for m in &mounts {
            let dir = m.join(config.cgroup_parent.trim_start_matches('/'));
            kill_cgroup_tree(&dir);
        }
    }
    kill_shims(&config.socket);
    std::thread::sleep(Duration::from_millis(100));
    if !config.cgroup_parent.is_empty() && config.cgroup_parent != "/" {
        remove_cgroup_dirs(&config.cgroup_parent)?;
    }
    unmount_under(&[&config.root, &config.state, &config.runc_root])?;
    for dir in [&config.state, &config.root, &config.runc_root, &config.opt_path] {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Remove { path: dir.clone(), source }),
        }
    }
    let _ = std::fs::remove_file(&config.socket);
    let _ = std::fs::remove_file(config.ttrpc_socket());
    Ok(())
}

fn kill_cgroup_tree(dir: &Path) {
    if let Ok(children) = std::fs::read_dir(dir) {
        for c in children.flatten() {
            if c.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                kill_cgroup_tree(&c.path());
            }
        }
    }
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        let pids: Vec<&str> = procs.split_whitespace().collect();
        if !pids.is_empty() {
            let _ = Command::new("kill").arg("-KILL").args(&pids).stderr(Stdio::null()).status();
        }
    }
}

/// SIGKILLs the `containerd-shim*` processes started by the containerd at `socket`.
fn kill_shims(socket: &Path) {
    let needle = socket.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let is_shim = args.first().is_some_and(|a| a.contains("containerd-shim"));
        if is_shim && args.iter().any(|a| a == &needle || a.ends_with(&needle)) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Lazily unmounts every mount point under any of `dirs`, deepest first.
fn unmount_under(dirs: &[&PathBuf]) -> Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(Error::MountInfo)?;
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| dirs.iter().any(|d| p.starts_with(d)))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points.dedup();
    for p in points {
        let _ = Command::new("umount").arg("-l").arg(&p).stderr(Stdio::null()).status();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_needed_setting() {
        let c = ContainerdConfig::under(Path::new("/tmp/node-a"));
        let toml = c.render();
        for needle in [
            "version = 2",
            r#"root = "/tmp/node-a/root""#,
            r#"state = "/tmp/node-a/state""#,
            r#"address = "/tmp/node-a/containerd.sock""#,
            r#"address = "/tmp/node-a/containerd.sock.ttrpc""#,
            r#"path = "/tmp/node-a/opt""#,
            r#"sandbox_image = "skiff.test/pause:1""#,
            "restrict_oom_score_adj = true",
            "netns_mounts_under_state_dir = true",
            r#"stream_server_address = "127.0.0.1""#,
            r#"stream_server_port = "0""#,
            r#"snapshotter = "overlayfs""#,
            r#"default_runtime_name = "runc""#,
            r#"runtime_type = "io.containerd.runc.v2""#,
            "SystemdCgroup = false",
            r#"Root = "/tmp/node-a/runc""#,
            r#"bin_dir = "/tmp/node-a/cni/bin""#,
            r#"conf_dir = "/tmp/node-a/cni/net.d""#,
            "max_conf_num = 1",
        ] {
            assert!(toml.contains(needle), "{needle} missing from\n{toml}");
        }
        assert_eq!(c.cgroup_parent, "/skiff-node-a");
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn mountinfo_unescapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
    }

    #[test]
    fn finds_cgroup_mounts() {
        let mounts = cgroup_mounts().unwrap();
        assert!(!mounts.is_empty(), "no cgroup mount in /proc/self/mountinfo");
        assert!(mounts.iter().all(|m| m.is_absolute()));
    }
}
