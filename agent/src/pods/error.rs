//! The errors of pod sync.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("runtime call {call} for pod {pod}")]
    Runtime {
        call: &'static str,
        pod: String,
        #[source]
        source: crate::runtime::Error,
    },
    #[error("writing the status of pod {pod}")]
    WriteStatus {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting pod {pod}")]
    DeletePod {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading static pod manifest {path}")]
    StaticManifest {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the pod watch ended")]
    WatchEnded,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
