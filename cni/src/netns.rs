//! Running work inside a network namespace: on a dedicated OS thread (namespaces are per
//! thread), with a guard that restores the thread's original namespace.
//!
//! Sockets keep the namespace they were created in, so the usual pattern is to create a
//! netlink connection (or a listening socket) inside the namespace with [`run_in`] and use
//! it from anywhere afterwards ([`netlink_in`]).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening network namespace {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("entering network namespace {path}")]
    Enter {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("spawning the namespace thread")]
    Spawn(#[source] io::Error),
    #[error("the namespace thread panicked")]
    Panicked,
    #[error("opening a netlink socket in {path}")]
    Netlink {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// An open network namespace handle (keeps the namespace alive while held).
#[derive(Debug)]
pub struct NetNs {
    path: PathBuf,
    file: File,
}

impl NetNs {
    /// Opens the namespace at `path` (`/run/netns/NAME`, `/proc/PID/ns/net`, ...).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file =
            File::open(&path).map_err(|source| Error::Open { path: path.clone(), source })?;
        Ok(Self { path, file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the namespace file is missing (DEL and GC treat that as nothing to do).
    pub fn is_missing(err: &Error) -> bool {
        matches!(err, Error::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Restores the thread's original namespace on drop.
struct RestoreGuard {
    original: File,
}

impl Drop for RestoreGuard {
    fn drop(&mut self) {
        // SAFETY: setns on a namespace fd we own; no memory is passed.
        let rc = unsafe { libc::setns(self.original.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            // The thread is about to end anyway (run_in owns it); nothing else runs on it.
            eprintln!("skiff-cni: restoring the original network namespace failed");
        }
    }
}

/// Runs `f` inside `ns` on a fresh OS thread and returns its value.
pub fn run_in<T, F>(ns: &NetNs, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("skiff-netns".into())
            .spawn_scoped(scope, || -> Result<T> {
                let original = File::open("/proc/thread-self/ns/net").map_err(|source| {
                    Error::Open { path: "/proc/thread-self/ns/net".into(), source }
                })?;
                // SAFETY: setns on a namespace fd that `ns` keeps open; affects only this
                // thread, which the guard below switches back before it ends.
                let rc = unsafe { libc::setns(ns.file.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    return Err(Error::Enter {
                        path: ns.path.clone(),
                        source: io::Error::last_os_error(),
                    });
                }
                let _restore = RestoreGuard { original };
                Ok(f())
            })
            .map_err(Error::Spawn)?;
        handle.join().map_err(|_| Error::Panicked)?
    })
}

/// Opens an rtnetlink connection bound to `ns` (the socket is created on a thread inside
/// `ns`, then used from anywhere). Must be called inside a tokio runtime; the connection
/// task is spawned on it.
pub fn netlink_in(ns: &NetNs) -> Result<rtnetlink::Handle> {
    let rt = tokio::runtime::Handle::current();
    let (conn, handle) = run_in(ns, move || {
        let _enter = rt.enter();
        rtnetlink::new_connection().map(|(conn, handle, _)| (conn, handle))
    })?
    .map_err(|source| Error::Netlink { path: ns.path.clone(), source })?;
    tokio::spawn(conn);
    Ok(handle)
}

/// An rtnetlink connection in the calling thread's own namespace.
pub fn netlink_here() -> Result<rtnetlink::Handle> {
    let (conn, handle, _) = rtnetlink::new_connection()
        .map_err(|source| Error::Netlink { path: "/proc/thread-self/ns/net".into(), source })?;
    tokio::spawn(conn);
    Ok(handle)
}
