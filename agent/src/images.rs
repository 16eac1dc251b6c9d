//! Test images as OCI archives (built from busybox-static) and their import into containerd.
//!
//! No registry is involved anywhere: [`build_test_images`] writes two OCI image-layout
//! archives from Debian's static busybox, and [`import`] loads an archive into containerd's
//! `k8s.io` namespace (the one CRI uses) with `ctr images import`.
//!
//! Archives are reproducible: the layer tar is written here (ustar, sorted names, uid/gid 0,
//! mtime 0), so the same busybox binary always yields the same digests. Layout of the
//! archive: `oci-layout`, `index.json` (one manifest, annotated with
//! `io.containerd.image.name` and the platform), `blobs/sha256/<digest>` for the layer,
//! the config and the manifest.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The pod sandbox image (containerd's `sandbox_image`): a shell that sleeps until SIGTERM
/// or SIGINT, and then exits 0.
pub const PAUSE_IMAGE: &str = "skiff.test/pause:1";
/// The test tools image: busybox with every applet linked in `/bin` (sh, httpd, nc, wget,
/// nslookup, sleep, ...); runs `sh` by default.
pub const TOOLS_IMAGE: &str = "skiff.test/tools:1";
/// Where Debian's busybox-static installs the binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// The pause image's command. PID 1 ignores signals it has no handler for, hence the trap;
/// `sleep & wait` so the trap runs at once instead of after the sleep.
const PAUSE_CMD: &[&str] =
    &["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"];

/// Applets the tools image must have (checked against `busybox --list`).
const REQUIRED_APPLETS: &[&str] = &[
    "sh", "httpd", "nc", "wget", "nslookup", "sleep", "cat", "echo", "ls", "ps", "kill", "env",
    "true", "false", "rm",
];

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const IMPORT_TIMEOUT: Duration = Duration::from_secs(60);

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} not found: install Debian's busybox-static (apt-get install busybox-static)")]
    BusyboxMissing(PathBuf),
    #[error("listing busybox applets ({path})")]
    ListApplets {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("busybox {path} lacks the applets {missing:?}")]
    MissingApplets { path: PathBuf, missing: Vec<String> },
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
    #[error("{0} not found: build the binaries first (cargo build --release --bins)")]
    BinaryMissing(PathBuf),
    #[error("no image of {0:?} (the components are proxy, cni, agent, server)")]
    UnknownComponent(String),
    #[error("{path} links libraries this machine lacks: {missing:?}")]
    LibraryMissing { path: PathBuf, missing: Vec<String> },
    #[error("running ldd on {path}")]
    Ldd {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tar entry name {0:?} longer than 100 bytes")]
    LongName(String),
    #[error("running ctr to import {archive} (is containerd's ctr installed?)")]
    SpawnCtr {
        archive: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ctr images import {archive} failed: {stderr}")]
    Import { archive: PathBuf, stderr: String },
    #[error("ctr images import {archive} did not finish within {timeout:?}")]
    ImportTimeout { archive: PathBuf, timeout: Duration },
}

/// `skiff-lab images ...`
#[derive(Debug, clap::Subcommand)]
pub enum ImagesCommand {
    /// Imports an OCI archive into containerd's k8s.io namespace.
    Import {
        /// The OCI archive (a tar with index.json and oci-layout).
        file: PathBuf,
        /// containerd's socket.
        #[arg(long, default_value = "/run/skiff/containerd/containerd.sock")]
        containerd_socket: PathBuf,
    },
    /// Builds the test images (skiff.test/pause:1, skiff.test/tools:1) from /bin/busybox
    /// into a directory, printing the archives' paths.
    Build {
        /// Output directory (created if missing).
        out_dir: PathBuf,
    },
    /// Builds skiff's own images (skiff/proxy, skiff/cni, skiff/agent, skiff/server, tagged
    /// with the version) from built binaries into a directory, printing the archives' paths.
    Components {
        /// Output directory (created if missing).
        out_dir: PathBuf,
        /// Where the binaries are (target/release).
        #[arg(long)]
        bin_dir: PathBuf,
        /// The images' tag.
        #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
        version: String,
        /// Only these components (default: all).
        #[arg(long = "component")]
        components: Vec<String>,
    },
}

/// Runs an `images` subcommand.
pub async fn run_command(command: ImagesCommand) -> anyhow::Result<()> {
    match command {
        ImagesCommand::Import { file, containerd_socket } => {
            import(&containerd_socket, &file).await?;
            println!("imported {}", file.display());
        }
        ImagesCommand::Build { out_dir } => {
            for archive in build_test_images(&out_dir)? {
                println!("{}", archive.display());
            }
        }
        ImagesCommand::Components { out_dir, bin_dir, version, components } => {
            for archive in build_component_images(&bin_dir, &out_dir, &version, &components)? {
                println!("{}", archive.display());
            }
        }
    }
    Ok(())
}

/// Builds `pause.tar` ([`PAUSE_IMAGE`]) and `tools.tar` ([`TOOLS_IMAGE`]) in `out_dir`
/// from [`BUSYBOX`]; returns their paths in that order.
pub fn build_test_images(out_dir: &Path) -> Result<Vec<PathBuf>> {
    build_test_images_from(Path::new(BUSYBOX), out_dir)
}

/// [`build_test_images`] with another busybox binary.
pub fn build_test_images_from(busybox: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    if !busybox.is_file() {
        return Err(Error::BusyboxMissing(busybox.to_path_buf()));
    }
    std::fs::create_dir_all(out_dir)
        .map_err(|source| Error::Write { path: out_dir.to_path_buf(), source })?;
    let layer = busybox_layer(busybox)?;
    let mut archives = Vec::new();
    for (file, name, cmd) in
        [("pause.tar", PAUSE_IMAGE, PAUSE_CMD), ("tools.tar", TOOLS_IMAGE, &["sh"][..])]
    {
        archives.push(write_archive(out_dir, file, &oci_archive(name, &layer, cmd)?)?);
    }
    Ok(archives)
}

/// Writes `bytes` to `<out_dir>/<file>` through a temporary file renamed over it: a
/// concurrent reader never sees half an archive.
fn write_archive(out_dir: &Path, file: &str, bytes: &[u8]) -> Result<PathBuf> {
    let path = out_dir.join(file);
    let tmp = out_dir.join(format!(".{file}.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|source| Error::Write { path: tmp.clone(), source })?;
    std::fs::rename(&tmp, &path).map_err(|source| Error::Write { path: path.clone(), source })?;
    Ok(path)
}

/// skiff's own images: `skiff/<component>:<version>` (`docker.io/skiff/...` once
/// normalised), each on a minimal base: the component's binaries in `/usr/bin`, the shared
/// libraries they link (glibc's, found with `ldd`) at their paths, `/etc/passwd`, `/tmp`.
/// Nothing else: no shell, no package manager.
pub struct Component {
    /// The image's name under `skiff/` and the archive's file name (`<name>.tar`).
    pub name: &'static str,
    /// Binaries copied into `/usr/bin` (the first is the entrypoint).
    pub binaries: &'static [&'static str],
}

/// The components with an image: the proxy (with skiff-cni, which its DaemonSet's init
/// container installs on the node, as Cilium's image carries its CNI plugin), the CNI plugin
/// alone, the agent (with skiff-cni) and the server.
pub const COMPONENTS: &[Component] = &[
    Component { name: "proxy", binaries: &["skiff-proxy", "skiff-cni"] },
    Component { name: "cni", binaries: &["skiff-cni"] },
    Component { name: "agent", binaries: &["skiff-agent", "skiff-cni"] },
    Component { name: "server", binaries: &["skiff-server"] },
];

/// The reference manifests use for `component` at `version` (`skiff/proxy:0.1.0`).
pub fn component_reference(component: &str, version: &str) -> String {
    format!("skiff/{component}:{version}")
}

/// The fully qualified name containerd records (`docker.io/skiff/proxy:0.1.0`), which is
/// what CRI resolves `skiff/proxy:0.1.0` to.
pub fn component_image(component: &str, version: &str) -> String {
    format!("docker.io/{}", component_reference(component, version))
}

/// Builds the images of `components` (names from [`COMPONENTS`]; empty: all) from the
/// binaries in `bin_dir` into `out_dir` as `<component>.tar`; returns the archives' paths.
/// Debug information is stripped from the copies (`strip --strip-debug`, when binutils is
/// there) so that images of dev-profile binaries stay small.
pub fn build_component_images(
    bin_dir: &Path,
    out_dir: &Path,
    version: &str,
    components: &[String],
) -> Result<Vec<PathBuf>> {
    let wanted: Vec<&Component> = if components.is_empty() {
        COMPONENTS.iter().collect()
    } else {
        let mut v = Vec::new();
        for c in components {
            match COMPONENTS.iter().find(|k| k.name == c) {
                Some(k) => v.push(k),
                None => return Err(Error::UnknownComponent(c.clone())),
            }
        }
        v
    };
    std::fs::create_dir_all(out_dir)
        .map_err(|source| Error::Write { path: out_dir.to_path_buf(), source })?;
    let mut archives = Vec::new();
    for c in wanted {
        let layer = component_layer(bin_dir, out_dir, c)?;
        let entrypoint = format!("/usr/bin/{}", c.binaries[0]);
        let config = serde_json::json!({
            "Env": [PATH_ENV],
            "Entrypoint": [entrypoint],
            "WorkingDir": "/",
            "Labels": {
                "org.opencontainers.image.title": c.binaries[0],
                "org.opencontainers.image.version": version,
            },
        });
        let name = component_image(c.name, version);
        let bytes = oci_archive_with(&name, &layer, config, "cargo xtask images")?;
        archives.push(write_archive(out_dir, &format!("{}.tar", c.name), &bytes)?);
    }
    Ok(archives)
}

/// The one layer of a component image.
fn component_layer(bin_dir: &Path, out_dir: &Path, c: &Component) -> Result<Vec<u8>> {
    let mut files: std::collections::BTreeMap<String, Entry> = Default::default();
    for dir in ["dev/", "etc/", "proc/", "root/", "run/", "sys/", "usr/", "usr/bin/", "var/"] {
        files.insert(dir.to_string(), Entry::Dir(0o755));
    }
    files.insert("tmp/".to_string(), Entry::Dir(0o1777));
    files.insert(
        "etc/passwd".into(),
        Entry::File(
            0o644,
            b"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n"
                .to_vec(),
        ),
    );
    files.insert("etc/group".into(), Entry::File(0o644, b"root:x:0:\nnobody:x:65534:\n".to_vec()));
    files.insert("etc/nsswitch.conf".into(), Entry::File(0o644, b"hosts: files dns\n".to_vec()));
    let mut libs = std::collections::BTreeSet::new();
    for b in c.binaries {
        let path = bin_dir.join(b);
        if !path.is_file() {
            return Err(Error::BinaryMissing(path));
        }
        files.insert(format!("usr/bin/{b}"), Entry::File(0o755, stripped(&path, out_dir)?));
        libs.extend(shared_libraries(&path)?);
    }
    for lib in libs {
        let data =
            std::fs::read(&lib).map_err(|source| Error::Read { path: lib.clone(), source })?;
        let rel = lib.to_string_lossy().trim_start_matches('/').to_string();
        files.insert(rel, Entry::File(0o755, data));
    }
    // Every parent directory of every entry, as tar readers expect.
    let names: Vec<String> = files.keys().cloned().collect();
    for name in names {
        let mut dir = name.trim_end_matches('/');
        while let Some((parent, _)) = dir.rsplit_once('/') {
            files.entry(format!("{parent}/")).or_insert(Entry::Dir(0o755));
            dir = parent;
        }
    }
    let entries: Vec<(String, Entry)> = files.into_iter().collect();
    tar(&entries)
}

/// `path`'s bytes without debug sections (a stripped copy in a private temporary directory
/// under `scratch`), or as they are when `strip` is not installed.
fn stripped(path: &Path, scratch: &Path) -> Result<Vec<u8>> {
    let dir = tempfile::Builder::new()
        .prefix(".strip-")
        .tempdir_in(scratch)
        .map_err(|source| Error::Write { path: scratch.to_path_buf(), source })?;
    let tmp = dir.path().join("binary");
    let ok = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&tmp)
        .arg(path)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let from = if ok { tmp.as_path() } else { path };
    std::fs::read(from).map_err(|source| Error::Read { path: from.into(), source })
}

/// The shared libraries (and the dynamic loader) `binary` needs, from `ldd`; none for a
/// static binary. A library ldd cannot find is an error: the image would not run.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| Error::Ldd { path: binary.to_path_buf(), source })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<String> =
        text.lines().filter(|l| l.contains("=> not found")).map(|l| l.trim().to_string()).collect();
    if !missing.is_empty() {
        return Err(Error::LibraryMissing { path: binary.to_path_buf(), missing });
    }
    // ldd exits non-zero for a static binary ("not a dynamic executable"): no libraries.
    Ok(parse_ldd(&text))
}

/// The absolute paths in `ldd` output (`libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6
/// (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`); the vDSO has none.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Imports an OCI archive into containerd's `k8s.io` namespace through
/// `ctr -a SOCKET -n k8s.io images import FILE` (bounded by a timeout).
pub async fn import(socket: &Path, archive: &Path) -> Result<()> {
    let mut cmd = tokio::process::Command::new("ctr");
    cmd.arg("-a")
        .arg(socket)
        .args(["-n", "k8s.io", "images", "import"])
        .arg(archive)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(IMPORT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| Error::ImportTimeout {
            archive: archive.to_path_buf(),
            timeout: IMPORT_TIMEOUT,
        })?
        .map_err(|source| Error::SpawnCtr { archive: archive.to_path_buf(), source })?;
    if !output.status.success() {
        return Err(Error::Import {
            archive: archive.to_path_buf(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// The single layer both images share: `/bin/busybox`, a symlink per applet, and the
/// directories a container expects.
fn busybox_layer(busybox: &Path) -> Result<Vec<u8>> {
    let binary = std::fs::read(busybox)
        .map_err(|source| Error::Read { path: busybox.to_path_buf(), source })?;
    let list = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|source| Error::ListApplets { path: busybox.to_path_buf(), source })?;
    let mut applets: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
        .map(str::to_string)
        .collect();
    applets.sort();
    applets.dedup();
    let missing: Vec<String> = REQUIRED_APPLETS
        .iter()
        .filter(|r| !applets.iter().any(|a| a == *r))
        .map(|r| r.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(Error::MissingApplets { path: busybox.to_path_buf(), missing });
    }

    let mut entries: Vec<(String, Entry)> = Vec::new();
    for dir in ["bin/", "dev/", "etc/", "proc/", "root/", "sys/", "usr/", "usr/bin/", "var/"] {
        entries.push((dir.to_string(), Entry::Dir(0o755)));
    }
    entries.push(("tmp/".to_string(), Entry::Dir(0o1777)));
    entries.push(("bin/busybox".to_string(), Entry::File(0o755, binary)));
    for a in &applets {
        entries.push((format!("bin/{a}"), Entry::Symlink("busybox".to_string())));
    }
    entries.push((
        "etc/passwd".into(),
        Entry::File(
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
        ),
    ));
    entries
        .push(("etc/group".into(), Entry::File(0o644, b"root:x:0:\nnobody:x:65534:\n".to_vec())));
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    tar(&entries)
}

/// The OCI image-layout archive of one image over `layer`.
fn oci_archive(name: &str, layer: &[u8], cmd: &[&str]) -> Result<Vec<u8>> {
    let config = serde_json::json!({"Env": [PATH_ENV], "Cmd": cmd, "WorkingDir": "/"});
    oci_archive_with(name, layer, config, "skiff-lab images build (busybox-static)")
}

/// The OCI image-layout archive of one image over `layer` with the image config's
/// `config` object (Env, Entrypoint, Cmd, Labels, ...).
fn oci_archive_with(
    name: &str,
    layer: &[u8],
    image_config: serde_json::Value,
    created_by: &str,
) -> Result<Vec<u8>> {
    let arch = oci_arch();
    let layer_digest = sha256_hex(layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        "history": [{"created_by": created_by}],
    }))
    .unwrap_or_default();
    let config_digest = sha256_hex(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer.len(),
        }],
    }))
    .unwrap_or_default();
    let manifest_digest = sha256_hex(&manifest);
    let tag = name.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
            "platform": {"architecture": arch, "os": "linux"},
        }],
    }))
    .unwrap_or_default();
    let mut entries = vec![
        ("blobs/".to_string(), Entry::Dir(0o755)),
        ("blobs/sha256/".to_string(), Entry::Dir(0o755)),
        (format!("blobs/sha256/{layer_digest}"), Entry::File(0o644, layer.to_vec())),
        (format!("blobs/sha256/{config_digest}"), Entry::File(0o644, config)),
        (format!("blobs/sha256/{manifest_digest}"), Entry::File(0o644, manifest)),
        ("index.json".to_string(), Entry::File(0o644, index)),
        (
            "oci-layout".to_string(),
            Entry::File(0o644, br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ),
    ];
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    tar(&entries)
}

/// The OCI architecture name of the machine we run on (busybox-static is the host's).
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

enum Entry {
    Dir(u32),
    File(u32, Vec<u8>),
    Symlink(String),
}

/// A reproducible ustar archive of `entries` (in the given order): owner 0:0, mtime 0.
fn tar(entries: &[(String, Entry)]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (name, entry) in entries {
        let (mode, size, kind, link) = match entry {
            Entry::Dir(mode) => (*mode, 0, b'5', ""),
            Entry::File(mode, data) => (*mode, data.len(), b'0', ""),
            Entry::Symlink(target) => (0o777, 0, b'2', target.as_str()),
        };
        if name.len() > 100 || link.len() > 100 {
            return Err(Error::LongName(name.clone()));
        }
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        octal(&mut h[100..108], mode as u64);
        octal(&mut h[108..116], 0);
        octal(&mut h[116..124], 0);
        octal(&mut h[124..136], size as u64);
        octal(&mut h[136..148], 0);
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[265..269].copy_from_slice(b"root");
        h[297..301].copy_from_slice(b"root");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| *b as u32).sum();
        let chk = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(chk.as_bytes());
        out.extend_from_slice(&h);
        if let Entry::File(_, data) = entry {
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
    }
    out.resize(out.len() + 1024, 0);
    Ok(out)
}

/// Writes `value` as zero-padded octal filling `field` but its last byte (NUL).
fn octal(field: &mut [u8], value: u64) {
    let s = format!("{value:0width$o}\0", width = field.len() - 1);
    field.copy_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tar -xf archive -C dir` with GNU tar.
    fn untar(archive: &Path, dir: &Path) {
        let x = std::process::Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(dir)
            .status()
            .unwrap();
        assert!(x.success(), "tar -xf {}", archive.display());
    }

    #[test]
    fn tar_is_readable_by_gnu_tar() {
        let dir = tempfile::tempdir().unwrap();
        let entries = vec![
            ("a/".to_string(), Entry::Dir(0o755)),
            ("a/f".to_string(), Entry::File(0o644, b"hello".to_vec())),
            ("a/l".to_string(), Entry::Symlink("f".into())),
        ];
        let path = dir.path().join("t.tar");
        std::fs::write(&path, tar(&entries).unwrap()).unwrap();
        let out = std::process::Command::new("tar").arg("-tvf").arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("a/l -> f"), "{listing}");
        assert!(listing.contains("root/root"), "{listing}");
        untar(&path, dir.path());
        assert_eq!(std::fs::read(dir.path().join("a/l")).unwrap(), b"hello");
    }

    #[test]
    fn archives_are_reproducible_and_complete() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let first = build_test_images(a.path()).unwrap();
        let second = build_test_images(b.path()).unwrap();
        assert_eq!(first.len(), 2);
        for (x, y) in first.iter().zip(&second) {
            assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap(), "{x:?}");
        }
        untar(&first[1], a.path());
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(a.path().join("index.json")).unwrap()).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["io.containerd.image.name"], TOOLS_IMAGE);
        let digest = m["digest"].as_str().unwrap().trim_start_matches("sha256:");
        let manifest = std::fs::read(a.path().join("blobs/sha256").join(digest)).unwrap();
        assert_eq!(sha256_hex(&manifest), digest);
        assert!(a.path().join("oci-layout").exists());
    }

    #[test]
    fn ldd_output_gives_the_libraries_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x7f)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\t/lib64/ld-linux-x86-64.so.2 (0x7f)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tnot a dynamic executable\n").is_empty());
    }

    /// A component image holds its binaries, what they link and nothing else, and runs
    /// where nothing but the image is: `chroot` into the unpacked layer.
    #[test]
    fn a_component_image_holds_what_its_binary_needs() {
        let bins = tempfile::tempdir().unwrap();
        // A dynamically linked stand-in for the plugin: coreutils' `true`.
        std::fs::copy("/bin/true", bins.path().join("skiff-cni")).unwrap();
        let out = tempfile::tempdir().unwrap();
        let archives =
            build_component_images(bins.path(), out.path(), "9.9.9", &["cni".to_string()]).unwrap();
        assert_eq!(archives, vec![out.path().join("cni.tar")]);
        let root = tempfile::tempdir().unwrap();
        untar(&archives[0], root.path());
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.path().join("index.json")).unwrap())
                .unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["io.containerd.image.name"], "docker.io/skiff/cni:9.9.9");
        let blob = |d: &serde_json::Value| {
            let d = d.as_str().unwrap().trim_start_matches("sha256:").to_string();
            std::fs::read(root.path().join("blobs/sha256").join(d)).unwrap()
        };
        let manifest: serde_json::Value = serde_json::from_slice(&blob(&m["digest"])).unwrap();
        let config: serde_json::Value =
            serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/skiff-cni");
        assert_eq!(config["config"]["Labels"]["org.opencontainers.image.version"], "9.9.9");
        let rootfs = root.path().join("rootfs");
        std::fs::create_dir(&rootfs).unwrap();
        let layer = root
            .path()
            .join("blobs/sha256")
            .join(manifest["layers"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:"));
        untar(&layer, &rootfs);
        assert!(rootfs.join("usr/bin/skiff-cni").is_file());
        assert!(!rootfs.join("bin/sh").exists(), "no shell in the base");
        // chroot needs root, as the whole suite does.
        let run =
            std::process::Command::new("chroot").arg(&rootfs).arg("/usr/bin/skiff-cni").status();
        assert!(run.unwrap().success(), "the binary runs with the image's libraries alone");
    }

    #[test]
    fn unknown_components_and_missing_binaries_fail_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            build_component_images(dir.path(), dir.path(), "1", &["kubelet".into()]).unwrap_err();
        assert!(err.to_string().contains("proxy, cni, agent, server"), "{err}");
        let err =
            build_component_images(dir.path(), dir.path(), "1", &["server".into()]).unwrap_err();
        assert!(err.to_string().contains("skiff-server not found"), "{err}");
    }

    #[test]
    fn a_missing_busybox_fails_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let err = build_test_images_from(&dir.path().join("nope"), dir.path()).unwrap_err();
        assert!(err.to_string().contains("busybox-static"), "{err}");
    }
}
