//! The node's cgroups as the pod sync cleans them: every hierarchy's mount point, and the
//! removal of pod cgroup directories containerd never removes.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading /proc/self/mountinfo")]
    MountInfo(#[source] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Mount points of every cgroup (v1 and v2) hierarchy, from `/proc/self/mountinfo`.
pub fn cgroup_mounts() -> Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(Error::MountInfo)?;
    let mut out = Vec::new();
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let fstype = fields.iter().skip_while(|f| **f != "-").nth(1).copied().unwrap_or("");
        if (fstype == "cgroup" || fstype == "cgroup2")
            && let Some(point) = fields.get(4)
        {
            let p = PathBuf::from(unescape_mountinfo(point));
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Removes the cgroup directory `parent` (and everything under it, deepest first) from
/// every cgroup hierarchy. Directories still holding processes stay (rmdir fails: EBUSY);
/// returns how many directories were removed.
pub fn remove_cgroup_dirs(parent: &str) -> Result<usize> {
    let mut removed = 0;
    for m in cgroup_mounts()? {
        let dir = m.join(parent.trim_start_matches('/'));
        if dir == m {
            continue;
        }
        removed += rmdir_tree(&dir);
    }
    Ok(removed)
}

fn rmdir_tree(dir: &Path) -> usize {
    let mut n = 0;
    if let Ok(children) = std::fs::read_dir(dir) {
        for c in children.flatten() {
            if c.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                n += rmdir_tree(&c.path());
            }
        }
    }
    if std::fs::remove_dir(dir).is_ok() {
        n += 1;
    }
    n
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(crate) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
