//! `skiff-cni install --bin-dir DIR`: puts this very binary into the node's CNI plugin
//! directory, as the init container of a DaemonSet does (Cilium's and flannel's
//! `install-cni` step), so the node gets the plugin from the image it runs.
//!
//! The copy is written beside its destination and renamed over it, so a runtime calling the
//! plugin during an upgrade runs either the old binary or the new one, never half of one;
//! the same bytes again are left alone.

use std::path::{Path, PathBuf};

/// The plugin's file name in the bin dir (the conflist's `type`).
pub const PLUGIN_NAME: &str = "skiff-cni";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("usage: skiff-cni install --bin-dir DIR (got {0:?})")]
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

/// The bin dir from `install`'s arguments (those after `install`).
pub fn parse_args(args: &[String]) -> Result<PathBuf, Error> {
    match args {
        [flag, dir] if flag == "--bin-dir" => Ok(PathBuf::from(dir)),
        [flag] if flag.starts_with("--bin-dir=") => Ok(PathBuf::from(&flag["--bin-dir=".len()..])),
        _ => Err(Error::Usage(args.to_vec())),
    }
}

/// Copies `source` (the running binary) to `<bin_dir>/skiff-cni`; returns whether the file
/// changed.
pub fn install(source: &Path, bin_dir: &Path) -> Result<bool, Error> {
    if !bin_dir.is_dir() {
        return Err(Error::NoBinDir(bin_dir.to_path_buf()));
    }
    let data =
        std::fs::read(source).map_err(|e| Error::Read { path: source.to_path_buf(), source: e })?;
    let dest = bin_dir.join(PLUGIN_NAME);
    if std::fs::read(&dest).is_ok_and(|old| old == data) {
        return Ok(false);
    }
    // A name of this install's own (in a container the pid is often 1 for every
    // installer), created exclusively, synced before it is renamed into place.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let tmp = bin_dir.join(format!(".{PLUGIN_NAME}.{}.{nanos}", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &dest)
    };
    write().map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Write { path: dest.clone(), source }
    })?;
    Ok(true)
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
        let err = parse_args(&["--bin".into()]).unwrap_err();
        assert!(err.to_string().contains("usage: skiff-cni install --bin-dir DIR"), "{err}");
        assert_eq!(parse_args(&["--bin-dir=/x".into()]).unwrap(), PathBuf::from("/x"));
        let dir = tempfile::tempdir().unwrap();
        let err = install(Path::new("/bin/true"), &dir.path().join("nope")).unwrap_err();
        assert!(err.to_string().contains("hostPath /opt/cni/bin"), "{err}");
    }
}
