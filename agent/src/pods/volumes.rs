//! Pod volumes materialised on the node, under `<root>/pods/<uid>/volumes/<plugin>/<name>`
//! (the kubelet's layout): emptyDir, configMap, secret, downwardAPI, projected (of those),
//! and hostPath (used in place), and PersistentVolumeClaims bound to hostPath or local
//! volumes (their path used in place, once the volume's node affinity admits this node).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, HostPathVolumeSource, KeyToPath, Pod, Volume,
};
use kube::ResourceExt;
use skiff_core::labels::terms_match;
use skiff_core::volumes::required_terms;

use super::containers::{ConfigError, EnvSources, field_value};
use crate::config::AgentConfig;

const DEFAULT_MODE: i32 = 0o644;

fn io_err(what: &str, path: &Path, e: std::io::Error) -> ConfigError {
    ConfigError(format!("{what} {}: {e}", path.display()))
}

/// Writes `files` (relative path → content) into `dir`, replacing what was there.
fn write_files(dir: &Path, files: &BTreeMap<String, (Vec<u8>, i32)>) -> Result<(), ConfigError> {
    std::fs::create_dir_all(dir).map_err(|e| io_err("creating", dir, e))?;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !files.keys().any(|k| k.split('/').next() == Some(name.as_str())) {
                let p = entry.path();
                let _ =
                    if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            }
        }
    }
    for (rel, (content, mode)) in files {
        if rel.split('/').any(|p| p == ".." || p.is_empty()) {
            return Err(ConfigError(format!("invalid volume path {rel}")));
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_err("creating", parent, e))?;
        }
        let tmp = path.with_extension("skiff-tmp");
        std::fs::write(&tmp, content).map_err(|e| io_err("writing", &tmp, e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(*mode as u32 & 0o777))
            .map_err(|e| io_err("chmod", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io_err("renaming", &path, e))?;
    }
    Ok(())
}

fn keyed(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: i32,
    what: &str,
) -> Result<BTreeMap<String, (Vec<u8>, i32)>, ConfigError> {
    let mut out = BTreeMap::new();
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                let v = data
                    .get(&it.key)
                    .ok_or_else(|| ConfigError(format!("{what}: no key {}", it.key)))?;
                out.insert(it.path.clone(), (v.clone(), it.mode.unwrap_or(default_mode)));
            }
        }
        _ => {
            for (k, v) in data {
                out.insert(k, (v, default_mode));
            }
        }
    }
    Ok(out)
}

fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    pod_ip: &str,
    host_ip: &str,
) -> Result<BTreeMap<String, (Vec<u8>, i32)>, ConfigError> {
    let mut out = BTreeMap::new();
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            field_value(pod, &f.field_path, pod_ip, host_ip)
                .ok_or_else(|| ConfigError(format!("unsupported fieldRef {}", f.field_path)))?
        } else if let Some(r) = &it.resource_field_ref {
            let c = pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .find(|c| Some(&c.name) == r.container_name.as_ref());
            c.and_then(|c| super::containers::resource_value(c, &r.resource)).unwrap_or_default()
        } else {
            String::new()
        };
        out.insert(it.path.clone(), (value.into_bytes(), it.mode.unwrap_or(default_mode)));
    }
    Ok(out)
}

async fn config_map_data(
    sources: &mut EnvSources<'_>,
    name: &str,
    optional: bool,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, ConfigError> {
    match sources.config_map(name).await? {
        Some(cm) => {
            let mut data: BTreeMap<String, Vec<u8>> = cm
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                .collect();
            for (k, v) in cm.binary_data.iter().flatten() {
                data.insert(k.clone(), v.0.clone());
            }
            Ok(Some(data))
        }
        None if optional => Ok(None),
        None => Err(ConfigError(format!("configmap \"{name}\" not found"))),
    }
}

async fn secret_data(
    sources: &mut EnvSources<'_>,
    name: &str,
    optional: bool,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, ConfigError> {
    match sources.secret(name).await? {
        Some(s) => {
            Ok(Some(s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect()))
        }
        None if optional => Ok(None),
        None => Err(ConfigError(format!("secret \"{name}\" not found"))),
    }
}

/// The host directory of a volume (plugin directory names as the kubelet's).
pub fn volume_dir(config: &AgentConfig, uid: &str, plugin: &str, name: &str) -> PathBuf {
    config.pod_dir(uid).join("volumes").join(plugin).join(name)
}

/// Materialises every volume of `pod`; returns volume name → host path.
pub async fn materialize(
    sources: &mut EnvSources<'_>,
    config: &AgentConfig,
    pod: &Pod,
    pod_ip: &str,
    host_ip: &str,
) -> Result<HashMap<String, PathBuf>, ConfigError> {
    let uid = pod.uid().unwrap_or_default();
    let mut paths = HashMap::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let path = materialize_one(sources, config, pod, &uid, v, pod_ip, host_ip).await?;
        paths.insert(v.name.clone(), path);
    }
    Ok(paths)
}

/// A hostPath, used in place: created for DirectoryOrCreate, checked for Directory and File.
fn host_path(h: &HostPathVolumeSource) -> Result<PathBuf, ConfigError> {
    let path = PathBuf::from(&h.path);
    match h.type_.as_deref() {
        Some("DirectoryOrCreate") => {
            std::fs::create_dir_all(&path).map_err(|e| io_err("creating", &path, e))?
        }
        Some("Directory") if !path.is_dir() => {
            return Err(ConfigError(format!("hostPath {} is not a directory", h.path)));
        }
        Some("File") if !path.is_file() => {
            return Err(ConfigError(format!("hostPath {} is not a file", h.path)));
        }
        _ => {}
    }
    Ok(path)
}

/// The claim volumes of `pod` with `readOnly: true`: every mount of them is read-only (the
/// kubelet's volume-spec `readOnly`).
pub fn read_only_volumes(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.read_only == Some(true)))
        .map(|v| v.name.clone())
        .collect()
}

async fn materialize_one(
    sources: &mut EnvSources<'_>,
    config: &AgentConfig,
    pod: &Pod,
    uid: &str,
    v: &Volume,
    pod_ip: &str,
    host_ip: &str,
) -> Result<PathBuf, ConfigError> {
    if v.empty_dir.is_some() {
        let dir = volume_dir(config, uid, "kubernetes.io~empty-dir", &v.name);
        std::fs::create_dir_all(&dir).map_err(|e| io_err("creating", &dir, e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| io_err("chmod", &dir, e))?;
        return Ok(dir);
    }
    if let Some(h) = &v.host_path {
        return host_path(h);
    }
    if let Some(c) = &v.persistent_volume_claim {
        let pv = sources.claimed_volume(&c.claim_name).await?;
        // The kubelet's CheckNodeAffinity: a volume pinned to other nodes is not mounted
        // here (a local directory of that name would be an empty stand-in).
        let terms = required_terms(&pv);
        if !terms.is_empty() {
            let node = sources.node(&config.node_name).await?;
            if !terms_match(terms, &node) {
                return Err(ConfigError(format!(
                    "MountVolume.NodeAffinity check failed for volume \"{}\" : no matching NodeSelectorTerms",
                    pv.metadata.name.as_deref().unwrap_or_default()
                )));
            }
        }
        let spec = pv.spec.unwrap_or_default();
        if let Some(h) = &spec.host_path {
            return host_path(h);
        }
        if let Some(l) = &spec.local {
            return Ok(PathBuf::from(&l.path));
        }
        return Err(ConfigError(format!(
            "persistentvolume \"{}\" is neither a hostPath nor a local volume",
            pv.metadata.name.unwrap_or_default()
        )));
    }
    if let Some(cm) = &v.config_map {
        let dir = volume_dir(config, uid, "kubernetes.io~configmap", &v.name);
        let mode = cm.default_mode.unwrap_or(DEFAULT_MODE);
        let data = config_map_data(sources, &cm.name, cm.optional == Some(true)).await?;
        let files = keyed(data.unwrap_or_default(), cm.items.as_ref(), mode, "configmap")?;
        write_files(&dir, &files)?;
        return Ok(dir);
    }
    if let Some(s) = &v.secret {
        let dir = volume_dir(config, uid, "kubernetes.io~secret", &v.name);
        let mode = s.default_mode.unwrap_or(DEFAULT_MODE);
        let name = s.secret_name.clone().unwrap_or_default();
        let data = secret_data(sources, &name, s.optional == Some(true)).await?;
        let files = keyed(data.unwrap_or_default(), s.items.as_ref(), mode, "secret")?;
        write_files(&dir, &files)?;
        return Ok(dir);
    }
    if let Some(d) = &v.downward_api {
        let dir = volume_dir(config, uid, "kubernetes.io~downward-api", &v.name);
        let mode = d.default_mode.unwrap_or(DEFAULT_MODE);
        let files =
            downward_files(pod, d.items.as_deref().unwrap_or_default(), mode, pod_ip, host_ip)?;
        write_files(&dir, &files)?;
        return Ok(dir);
    }
    if let Some(p) = &v.projected {
        let dir = volume_dir(config, uid, "kubernetes.io~projected", &v.name);
        let mode = p.default_mode.unwrap_or(DEFAULT_MODE);
        let mut files = BTreeMap::new();
        for src in p.sources.iter().flatten() {
            if let Some(cm) = &src.config_map {
                let data = config_map_data(sources, &cm.name, cm.optional == Some(true)).await?;
                files.extend(keyed(
                    data.unwrap_or_default(),
                    cm.items.as_ref(),
                    mode,
                    "configmap",
                )?);
            }
            if let Some(s) = &src.secret {
                let data = secret_data(sources, &s.name, s.optional == Some(true)).await?;
                files.extend(keyed(data.unwrap_or_default(), s.items.as_ref(), mode, "secret")?);
            }
            if let Some(d) = &src.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                files.extend(downward_files(pod, items, mode, pod_ip, host_ip)?);
            }
            if let Some(t) = &src.service_account_token {
                // Minted whenever the volume is written; [`refresh_tokens`] writes it again
                // before the token expires (EnvSources::token_refresh_at says when).
                let token = sources.service_account_token(pod, t).await?;
                files.insert(t.path.clone(), (token.into_bytes(), mode));
            }
        }
        write_files(&dir, &files)?;
        return Ok(dir);
    }
    Err(ConfigError(format!("volume \"{}\": unsupported volume type", v.name)))
}

/// Whether `v` is a projected volume with a ServiceAccount token.
pub fn has_token(v: &Volume) -> bool {
    v.projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .any(|s| s.service_account_token.is_some())
}

/// Writes every projected volume of `pod` holding a ServiceAccount token again, with fresh
/// tokens (the files are replaced by rename: a reader sees the old or the new token);
/// `sources.token_refresh_at` then says when to do it next. Returns how many volumes.
pub async fn refresh_tokens(
    sources: &mut EnvSources<'_>,
    config: &AgentConfig,
    pod: &Pod,
    pod_ip: &str,
    host_ip: &str,
) -> Result<usize, ConfigError> {
    let uid = pod.uid().unwrap_or_default();
    let mut n = 0;
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).filter(|v| has_token(v)) {
        materialize_one(sources, config, pod, &uid, v, pod_ip, host_ip).await?;
        n += 1;
    }
    Ok(n)
}

/// Removes the pod's directory (volumes) once the pod is gone.
pub fn cleanup(config: &AgentConfig, uid: &str) {
    let dir = config.pod_dir(uid);
    if dir.exists()
        && let Err(e) = std::fs::remove_dir_all(&dir)
    {
        tracing::warn!(dir = %dir.display(), error = %e, "removing pod directory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    #[tokio::test]
    async fn volumes_are_materialised() {
        let api = skiff_apiserver::ApiServer::start(
            Arc::new(skiff_store::memory::MemoryStore::new()),
            Default::default(),
        )
        .await
        .expect("apiserver");
        let client = api.client();
        let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client.clone(), "default");
        cms.create(
            &Default::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "cfg"}, "data": {"a": "1", "b": "2"}}),
            )
            .expect("cm"),
        )
        .await
        .expect("create cm");
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(client.clone(), "default");
        secrets
            .create(
                &Default::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": "s"}, "data": {"k": "c2VjcmV0"}}),
                )
                .expect("secret"),
            )
            .await
            .expect("create secret");
        let tmp = tempfile::tempdir().expect("tmp");
        let config = AgentConfig::new("n").with_root_dir(tmp.path());
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1", "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "a", "path": "sub/a.txt"}]}},
                {"name": "sec", "secret": {"secretName": "s", "defaultMode": 256}},
                {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "host", "hostPath": {"path": tmp.path().join("h").to_string_lossy(), "type": "DirectoryOrCreate"}}
            ]}
        }))
        .expect("pod");
        let mut sources = EnvSources::new(&client, "default");
        let paths = materialize(&mut sources, &config, &pod, "10.0.0.1", "192.168.0.1")
            .await
            .expect("materialise");
        assert!(paths["scratch"].ends_with("pods/u1/volumes/kubernetes.io~empty-dir/scratch"));
        assert!(paths["scratch"].is_dir());
        assert_eq!(std::fs::read_to_string(paths["cfg"].join("sub/a.txt")).expect("a"), "1");
        assert!(!paths["cfg"].join("b").exists(), "items select keys");
        let secret = paths["sec"].join("k");
        assert_eq!(std::fs::read_to_string(&secret).expect("k"), "secret");
        let mode = std::fs::metadata(&secret).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        assert_eq!(std::fs::read_to_string(paths["info"].join("labels")).expect("l"), "x=\"y\"");
        assert!(tmp.path().join("h").is_dir());

        let missing: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p2", "namespace": "default", "uid": "u2"},
            "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "cfg", "configMap": {"name": "nope"}}]}
        }))
        .expect("pod");
        let err = materialize(&mut sources, &config, &missing, "", "").await.expect_err("missing");
        assert!(err.0.contains("nope"), "{err:?}");
        cleanup(&config, "u1");
        assert!(!config.pod_dir("u1").exists());
    }

    #[test]
    fn volume_node_affinity_is_checked_against_the_node() {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "disk": "ssd", "gen": "5"}}
        }))
        .unwrap();
        let pv = |terms: serde_json::Value| -> k8s_openapi::api::core::v1::PersistentVolume {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "v"},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": terms}}}
            }))
            .unwrap()
        };
        let check = |terms: serde_json::Value| {
            let v = pv(terms);
            let terms = required_terms(&v);
            terms.is_empty() || terms_match(terms, &node)
        };
        let host = |n: &str| {
            serde_json::json!([{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [n]}]}])
        };
        assert!(check(host("n1")));
        assert!(!check(host("n2")));
        // Terms are ORed, expressions ANDed.
        assert!(check(serde_json::json!([
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]},
            {"matchExpressions": [{"key": "disk", "operator": "Exists"},
                                  {"key": "gen", "operator": "Gt", "values": ["4"]}]}])));
        assert!(!check(serde_json::json!([{"matchExpressions": [
            {"key": "disk", "operator": "Exists"}, {"key": "zone", "operator": "Exists"}]}])));
        assert!(check(serde_json::json!([{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])));
        assert!(!check(serde_json::json!([{"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}])));
        assert!(check(serde_json::json!([])), "no terms: any node");
    }
}
