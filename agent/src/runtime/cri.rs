//! [`Runtime`](super::Runtime) over containerd's CRI gRPC socket (tonic, `k8s-cri`).

use std::path::Path;

use super::{Error, Result};

/// A CRI client over a Unix socket. Cheap to clone (one HTTP/2 channel).
#[derive(Debug, Clone)]
pub struct CriRuntime {
    endpoint: String,
}

impl CriRuntime {
    /// Connects to the CRI socket (containerd's `[grpc] address`).
    pub async fn connect(socket: &Path) -> Result<CriRuntime> {
        Err(Error::Failed(format!("CRI client not built yet ({})", socket.display())))
    }

    /// The socket this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}
