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

use super::error::{Error, Result};
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

/// Reads the manifests of `dir` (`*.yaml`, `*.yml`, `*.json`) as the mirror pods to run;
/// files that do not parse are skipped.
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
        let parsed = std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| {
            serde_saphyr::from_slice::<Pod>(&b).map(|p| (b, p)).map_err(|e| e.to_string())
        });
        // A broken manifest is skipped (and logged); the others still run, as the kubelet.
        let (bytes, mut pod) = match parsed {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "skipping a static pod manifest");
                continue;
            }
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manifests_become_mirror_pods_and_go_away_with_their_file() {
        let api = skiff_apiserver::ApiServer::start(
            Arc::new(skiff_store::memory::MemoryStore::new()),
            Default::default(),
        )
        .await
        .expect("apiserver");
        let client = api.client();
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(
            dir.path().join("web.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: kube-system\nspec:\n  containers:\n  - name: c\n    image: skiff.test/tools:1\n",
        )
        .expect("manifest");
        std::fs::write(dir.path().join("README"), "not a manifest").expect("other file");
        let read = read_manifests(dir.path(), "n1").expect("read");
        assert_eq!(read.len(), 1);
        sync_once(&client, "n1", dir.path()).await.expect("sync");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
        let p = pods.get("web-n1").await.expect("mirror pod");
        assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("n1"));
        assert!(p.annotations().contains_key(MIRROR_ANNOTATION));
        assert_eq!(p.annotations()[SOURCE_ANNOTATION], "file");
        sync_once(&client, "n1", dir.path()).await.expect("idempotent");
        std::fs::remove_file(dir.path().join("web.yaml")).expect("rm");
        sync_once(&client, "n1", dir.path()).await.expect("sync");
        let gone = pods.get_opt("web-n1").await.expect("get");
        assert!(
            gone.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
            "the mirror pod of a removed manifest is deleted"
        );
        std::fs::write(dir.path().join("bad.yaml"), "kind: [").expect("bad");
        std::fs::write(
            dir.path().join("ok.json"),
            r#"{"metadata":{"name":"ok"},"spec":{"containers":[]}}"#,
        )
        .expect("ok");
        let read = read_manifests(dir.path(), "n1").expect("a broken manifest is skipped");
        assert_eq!(read.keys().map(|k| k.1.as_str()).collect::<Vec<_>>(), vec!["ok-n1"]);
    }
}
