//! Static pods: manifests in a directory (kubelet `staticPodPath`) become pods of this node,
//! mirrored into the API. The mirror pod (annotation `kubernetes.io/config.mirror`, named
//! `<name>-<node>`, bound to this node) is what the pod sync runs; the directory is
//! re-read every 20 s (kubelet `fileCheckFrequency`): new or changed manifests (re)create
//! their mirror pod, removed ones delete it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};

use super::{Error, Result};
use crate::config::AgentConfig;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
const CHECK_EVERY: Duration = Duration::from_secs(20);

fn hash(bytes: &[u8]) -> String {
    format!(
        "{:016x}",
        bytes
            .iter()
            .fold(0xcbf29ce484222325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100000001b3))
    )
}

/// Reads the manifests of `dir` (`*.yaml`, `*.yml`, `*.json`) as the mirror pods to run.
pub fn read_manifests(dir: &Path, node: &str) -> Result<BTreeMap<(String, String), Pod>> {
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(Error::StaticManifest {
                path: dir.display().to_string(),
                source: Box::new(e),
            });
        }
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
        if !matches!(ext, "yaml" | "yml" | "json") {
            continue;
        }
        let err = |source: Box<dyn std::error::Error + Send + Sync>| Error::StaticManifest {
            path: path.display().to_string(),
            source,
        };
        let bytes = std::fs::read(&path).map_err(|e| err(Box::new(e)))?;
        let mut pod: Pod = serde_yaml_ng::from_slice(&bytes).map_err(|e| err(Box::new(e)))?;
        let name = format!("{}-{node}", pod.name_any());
        let ns = pod.namespace().unwrap_or_else(|| "default".into());
        pod.metadata.name = Some(name.clone());
        pod.metadata.namespace = Some(ns.clone());
        pod.metadata.uid = None;
        pod.metadata.resource_version = None;
        let ann = pod.metadata.annotations.get_or_insert_with(Default::default);
        ann.insert(MIRROR_ANNOTATION.into(), hash(&bytes));
        ann.insert(SOURCE_ANNOTATION.into(), "file".into());
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = Some(node.into());
        }
        pod.status = None;
        out.insert((ns, name), pod);
    }
    Ok(out)
}

/// Keeps the mirror pods in the API equal to the manifests, until dropped.
pub async fn run(client: Client, config: Arc<AgentConfig>, dir: PathBuf) {
    loop {
        if let Err(e) = sync_once(&client, &config.node_name, &dir).await {
            tracing::warn!(dir = %dir.display(), error = %e, "static pods");
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

/// One pass of the static pod sync.
pub async fn sync_once(client: &Client, node: &str, dir: &Path) -> Result<()> {
    let want = read_manifests(dir, node)?;
    let all: Api<Pod> = Api::all(client.clone());
    let have =
        all.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await.map_err(
            |e| Error::StaticManifest { path: dir.display().to_string(), source: Box::new(e) },
        )?;
    let mirror = |p: &Pod| p.annotations().get(MIRROR_ANNOTATION).cloned();
    for p in &have.items {
        let Some(h) = mirror(p) else { continue };
        let k = (p.namespace().unwrap_or_default(), p.name_any());
        let stale = want.get(&k).is_none_or(|w| mirror(w) != Some(h));
        if stale && p.metadata.deletion_timestamp.is_none() {
            let api: Api<Pod> = Api::namespaced(client.clone(), &k.0);
            let _ = api.delete(&k.1, &DeleteParams::default()).await;
        }
    }
    for ((ns, name), pod) in want {
        let exists = have
            .items
            .iter()
            .any(|p| p.namespace().as_deref() == Some(&ns) && p.name_any() == name);
        if !exists {
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "mirror pod created"),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "creating a mirror pod")
                }
            }
        }
    }
    Ok(())
}
