//! ServiceAccount: a pod runs as a service account (`default` unless it names one) and gets
//! the projected `kube-api-access-*` volume the agent fills with a bound token from
//! TokenRequest, the cluster CA (`kube-root-ca.crt`) and its namespace, mounted at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every container (upstream
//! `plugin/pkg/admission/serviceaccount`).
//!
//! Unlike upstream, a pod whose service account does not exist (yet) is admitted: skiff
//! runs without the service-account controller in bare-apiserver mode, and the agent's
//! TokenRequest fails for a missing account anyway.

use std::sync::LazyLock;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource};
use crate::state::State;
use crate::status::ApiResult;
use skiff_core::json::ValueAt;

/// Where the token volume is mounted (upstream `DefaultAPITokenMountPath`).
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Prefix of the projected volume's name.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The token's lifetime the kubelet asks for (upstream: 1 h + 7 s).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// Pods the kubelet made from static manifests carry this annotation.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

pub struct ServiceAccount;

#[async_trait]
impl MutatingPlugin for ServiceAccount {
    fn name(&self) -> &'static str {
        "ServiceAccount"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        operation == Operation::Create && resource.is_core("pods") && resource.subresource.is_none()
    }

    async fn admit(&self, state: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        let ns = req.namespace.clone().unwrap_or_default();
        let Some(pod) = req.object.as_mut() else { return Ok(()) };
        if pod.at(&["metadata", "annotations", MIRROR_POD_ANNOTATION]).is_some() {
            return Ok(());
        }
        let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return Ok(()) };
        let sa_name = match spec.get("serviceAccountName").and_then(Value::as_str) {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => {
                spec.insert("serviceAccountName".into(), json!("default"));
                "default".to_string()
            }
        };
        let automount = match spec.get("automountServiceAccountToken").and_then(Value::as_bool) {
            Some(b) => b,
            None => account_automounts(state, &ns, &sa_name).unwrap_or(true),
        };
        if automount {
            mount_token(spec, &random_suffix());
        }
        Ok(())
    }
}

/// The service account's `automountServiceAccountToken`, if it exists and says.
fn account_automounts(state: &State, ns: &str, name: &str) -> Option<bool> {
    /// The one member read; the rest of the account is skipped, not built.
    #[derive(serde::Deserialize)]
    struct Account {
        #[serde(rename = "automountServiceAccountToken")]
        automount: Option<bool>,
    }
    let rt = state.registry.find("", "v1", "serviceaccounts")?;
    let account = state.cache.resource(rt).get(&rt.key(Some(ns), name))?;
    serde_json::from_slice::<Account>(&account.json).ok()?.automount
}

/// The projected volume of a service-account token (upstream `TokenVolumeSource`).
pub fn token_volume(name: &str) -> Value {
    // Built once and cloned, which is cheaper than building it through `json!` for each pod.
    static VOLUME: LazyLock<Value> = LazyLock::new(token_volume_template);
    let mut volume = VOLUME.clone();
    volume["name"] = Value::String(name.to_string());
    volume
}

fn token_volume_template() -> Value {
    json!({
        "name": "",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
            "defaultMode": 420,
        },
    })
}

/// Add the token volume (unless a container already mounts something at the token path,
/// whose volume is then reused) and mount it into every container and init container
/// that has nothing at the token path.
pub(crate) fn mount_token(spec: &mut serde_json::Map<String, Value>, suffix: &str) {
    let mounted_at_path = |c: &Value| {
        c.get("volumeMounts").and_then(Value::as_array).and_then(|ms| {
            ms.iter()
                .find(|m| m.get("mountPath").and_then(Value::as_str) == Some(TOKEN_MOUNT_PATH))
                .and_then(|m| m.get("name").and_then(Value::as_str).map(str::to_string))
        })
    };
    let existing = ["initContainers", "containers"]
        .iter()
        .filter_map(|k| spec.get(*k).and_then(Value::as_array))
        .flatten()
        .find_map(mounted_at_path);
    let volume_name = existing.clone().unwrap_or_else(|| format!("{VOLUME_PREFIX}{suffix}"));
    if existing.is_none() {
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        if let Some(vs) = volumes.as_array_mut() {
            vs.push(token_volume(&volume_name));
        }
    }
    for key in ["initContainers", "containers"] {
        let Some(containers) = spec.get_mut(key).and_then(Value::as_array_mut) else { continue };
        for c in containers {
            if mounted_at_path(c).is_some() {
                continue;
            }
            let Some(c) = c.as_object_mut() else { continue };
            let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
            if let Some(ms) = mounts.as_array_mut() {
                let mut mount = serde_json::Map::new();
                mount.insert("mountPath".into(), Value::String(TOKEN_MOUNT_PATH.into()));
                mount.insert("name".into(), Value::String(volume_name.clone()));
                mount.insert("readOnly".into(), Value::Bool(true));
                ms.push(Value::Object(mount));
            }
        }
    }
}

/// Five characters from upstream's `utilrand.String` alphabet.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let u = uuid::Uuid::new_v4();
    u.as_bytes().iter().take(5).map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}
