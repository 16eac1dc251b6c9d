//! What every pod worker shares ([`PodContext`]: the client, the runtime, the node's
//! settings, the event recorder and the runtime cache) and the pod helpers they all use.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::error::{Error, Result};
use super::{events, relist};
use crate::config::AgentConfig;
use crate::runtime::Runtime;

/// What every pod worker shares.
pub struct PodContext<R> {
    pub client: Client,
    pub runtime: R,
    pub config: Arc<AgentConfig>,
    /// The node's IP (pods' hostIP).
    pub host_ip: String,
    /// The runtime's name, the scheme of container IDs (`containerd://...`).
    pub runtime_name: String,
    /// Events about pods (`kubectl describe`).
    pub events: events::Events,
    /// The node-wide runtime cache ([`relist`]), shared by the pod workers.
    pub cache: relist::RuntimeCache,
}

impl<R: Runtime> PodContext<R> {
    /// Writes `status` through the status subresource (a merge patch; lists are replaced).
    pub async fn write_status(
        &self,
        pod: &Pod,
        status: &k8s_openapi::api::core::v1::PodStatus,
    ) -> Result<()> {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch = serde_json::json!({"status": status});
        match api
            .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(Error::WriteStatus { pod: key(pod), source }),
        }
    }
}

/// `namespace/name` of a pod (logs and errors).
pub fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

pub fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}
