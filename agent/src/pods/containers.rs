//! Container configs: command/args with `$(VAR)` expansion, env (incl. valueFrom fieldRef,
//! resourceFieldRef, configMapKeyRef, secretKeyRef, and envFrom), ports, resources as Linux
//! cgroup limits, mounts, labels and the log path.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
};
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::admit::{bytes, cpu_millis};
use super::sandbox::pod_labels;
use crate::runtime::{CONTAINER_NAME_LABEL, api};

/// A container that cannot be configured (the kubelet's CreateContainerConfigError).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

/// The value of a downward API field path (`metadata.name`, `metadata.labels['k']`, ...).
pub fn field_value(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Option<String> {
    let keyed = |prefix: &str, map: &BTreeMap<String, String>| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['").and_then(|r| r.strip_suffix("']")))
            .map(|k| map.get(k).cloned().unwrap_or_default())
    };
    let spec = pod.spec.as_ref();
    match path {
        "metadata.name" => Some(pod.name_any()),
        "metadata.namespace" => Some(pod.namespace().unwrap_or_default()),
        "metadata.uid" => Some(pod.uid().unwrap_or_default()),
        "metadata.labels" => Some(format_map(pod.labels())),
        "metadata.annotations" => Some(format_map(pod.annotations())),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => {
            Some(spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default())
        }
        "status.hostIP" | "status.hostIPs" => Some(host_ip.to_string()),
        "status.podIP" | "status.podIPs" => Some(pod_ip.to_string()),
        _ => keyed("metadata.labels", pod.labels())
            .or_else(|| keyed("metadata.annotations", pod.annotations())),
    }
}

fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect::<Vec<_>>().join("\n")
}

/// The value of a resourceFieldRef (`limits.cpu`, `requests.memory`, ...), with divisor 1.
pub fn resource_value(c: &Container, resource: &str) -> Option<String> {
    let (kind, name) = resource.split_once('.')?;
    let r = c.resources.as_ref();
    let q = match kind {
        "limits" => r.and_then(|r| r.limits.as_ref()),
        _ => r.and_then(|r| r.requests.as_ref()),
    }
    .and_then(|m| m.get(name));
    Some(match (name, q) {
        ("cpu", Some(q)) => cpu_millis(q).map(|m| m.div_ceil(1000)).unwrap_or(0).to_string(),
        ("cpu", None) => "0".into(),
        (_, Some(q)) => bytes(q).unwrap_or(0).to_string(),
        (_, None) => "0".into(),
    })
}

/// Expands `$(VAR)` references from `env` (`$$` escapes; unknown references stay as written).
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 1..];
        if let Some(t) = tail.strip_prefix('$') {
            out.push('$');
            rest = t;
        } else if let Some(t) = tail.strip_prefix('(')
            && let Some(end) = t.find(')')
        {
            let name = &t[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &t[end + 1..];
        } else {
            out.push('$');
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// Fetches ConfigMaps and Secrets a container's env refers to (cached per sync).
/// When a token with lifetime `ttl` is refreshed: at 80% of it, and after 24 h at most
/// (the kubelet's token manager).
pub fn token_refresh_after(ttl: std::time::Duration) -> std::time::Duration {
    (ttl * 4 / 5).min(std::time::Duration::from_secs(24 * 3600))
}

pub struct EnvSources<'a> {
    client: &'a Client,
    namespace: String,
    config_maps: HashMap<String, Option<ConfigMap>>,
    secrets: HashMap<String, Option<Secret>>,
    node: Option<Node>,
    /// When the earliest ServiceAccount token minted through these sources must be
    /// refreshed (80% of its lifetime, at most 24 h: the kubelet's token manager).
    pub token_refresh_at: Option<tokio::time::Instant>,
}

impl<'a> EnvSources<'a> {
    pub fn new(client: &'a Client, namespace: &str) -> Self {
        EnvSources {
            client,
            namespace: namespace.into(),
            config_maps: HashMap::new(),
            secrets: HashMap::new(),
            node: None,
            token_refresh_at: None,
        }
    }

    pub async fn config_map(&mut self, name: &str) -> Result<Option<&ConfigMap>, ConfigError> {
        if !self.config_maps.contains_key(name) {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
            let cm = api
                .get_opt(name)
                .await
                .map_err(|e| ConfigError(format!("getting configmap {name}: {e}")))?;
            self.config_maps.insert(name.into(), cm);
        }
        Ok(self.config_maps.get(name).and_then(|c| c.as_ref()))
    }

    /// The PersistentVolume the claim `claim` is bound to, checked as the kubelet checks it
    /// (`getPVCExtractPV`): the claim is Bound and not being deleted, and the volume's
    /// claimRef names the claim's uid. Anything else is an error the pod's sync retries.
    pub async fn claimed_volume(&self, claim: &str) -> Result<PersistentVolume, ConfigError> {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let pvc = claims
            .get_opt(claim)
            .await
            .map_err(|e| ConfigError(format!("getting persistentvolumeclaim {claim}: {e}")))?
            .ok_or_else(|| ConfigError(format!("persistentvolumeclaim \"{claim}\" not found")))?;
        let ns = &self.namespace;
        if pvc.metadata.deletion_timestamp.is_some() {
            return Err(ConfigError(format!(
                "can't start pod because PVC {ns}/{claim} is being deleted"
            )));
        }
        let phase = pvc.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
        if phase != "Bound" || volume.is_empty() {
            return Err(ConfigError(format!(
                "PVC {ns}/{claim} has non-bound phase (\"{phase}\") or empty pvc.Spec.VolumeName (\"{volume}\")"
            )));
        }
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let pv = volumes
            .get(&volume)
            .await
            .map_err(|e| ConfigError(format!("getting persistentvolume {volume}: {e}")))?;
        let ref_uid =
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.clone());
        let uid = pvc.metadata.uid.clone();
        if ref_uid.is_none() || ref_uid != uid {
            return Err(ConfigError(format!(
                "entry in PV {volume} ClaimRef UID {} does not match PVC {ns}/{claim} UID {}",
                ref_uid.unwrap_or_default(),
                uid.unwrap_or_default()
            )));
        }
        Ok(pv)
    }

    /// This node's Node object (read once per set of sources).
    pub async fn node(&mut self, name: &str) -> Result<Node, ConfigError> {
        if let Some(n) = &self.node {
            return Ok(n.clone());
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node =
            nodes.get(name).await.map_err(|e| ConfigError(format!("getting node {name}: {e}")))?;
        self.node = Some(node.clone());
        Ok(node)
    }

    /// A ServiceAccount token bound to `pod`, minted through TokenRequest (the projected
    /// `serviceAccountToken` volume source).
    pub async fn service_account_token(
        &mut self,
        pod: &k8s_openapi::api::core::v1::Pod,
        source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
    ) -> Result<String, ConfigError> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::api::core::v1::ServiceAccount;
        let sa_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: source.audience.clone().into_iter().collect(),
                expiration_seconds: Some(source.expiration_seconds.unwrap_or(3607)),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace);
        let answer =
            api.create_token_request(&sa_name, &Default::default(), &request).await.map_err(
                |e| ConfigError(format!("requesting a token of serviceaccount {sa_name}: {e}")),
            )?;
        let status = answer.status.filter(|s| !s.token.is_empty());
        let Some(status) = status else {
            return Err(ConfigError(format!("serviceaccount {sa_name}: empty token")));
        };
        // The lifetime the apiserver granted (it may differ from the one asked for).
        let asked = request.spec.expiration_seconds.unwrap_or(3607).max(1) as u64;
        let granted = (status.expiration_timestamp.0.as_second()
            - k8s_openapi::jiff::Timestamp::now().as_second())
        .max(0) as u64;
        let ttl = std::time::Duration::from_secs(if granted > 0 { granted } else { asked });
        let refresh = tokio::time::Instant::now() + token_refresh_after(ttl);
        self.token_refresh_at = Some(self.token_refresh_at.map_or(refresh, |t| t.min(refresh)));
        Ok(status.token)
    }

    pub async fn secret(&mut self, name: &str) -> Result<Option<&Secret>, ConfigError> {
        if !self.secrets.contains_key(name) {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
            let s = api
                .get_opt(name)
                .await
                .map_err(|e| ConfigError(format!("getting secret {name}: {e}")))?;
            self.secrets.insert(name.into(), s);
        }
        Ok(self.secrets.get(name).and_then(|c| c.as_ref()))
    }
}

fn config_map_value(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get(key).cloned()).or_else(|| {
        cm.binary_data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    })
}

fn secret_value(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .or_else(|| s.string_data.as_ref().and_then(|d| d.get(key).cloned()))
}

/// Resolves a container's environment, in order (envFrom first, then env, each value
/// expanded against what came before).
pub async fn resolve_env(
    sources: &mut EnvSources<'_>,
    pod: &Pod,
    c: &Container,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(x, _)| *x != k);
        env.push((k, v));
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            match sources.config_map(&r.name).await? {
                Some(cm) => {
                    let mut pairs: Vec<(String, String)> =
                        cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
                    pairs.sort();
                    for (k, v) in pairs {
                        set(&mut env, format!("{prefix}{k}"), v);
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(ConfigError(format!("configmap \"{}\" not found", r.name))),
            }
        }
        if let Some(r) = &from.secret_ref {
            match sources.secret(&r.name).await? {
                Some(s) => {
                    for (k, v) in s.data.iter().flatten() {
                        set(&mut env, format!("{prefix}{k}"), String::from_utf8_lossy(&v.0).into());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(ConfigError(format!("secret \"{}\" not found", r.name))),
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = match &e.value_from {
            None => expand(e.value.as_deref().unwrap_or_default(), &env),
            Some(from) => {
                if let Some(f) = &from.field_ref {
                    field_value(pod, &f.field_path, pod_ip, host_ip).ok_or_else(|| {
                        ConfigError(format!("unsupported fieldRef {}", f.field_path))
                    })?
                } else if let Some(r) = &from.resource_field_ref {
                    resource_value(c, &r.resource).unwrap_or_default()
                } else if let Some(k) = &from.config_map_key_ref {
                    let optional = k.optional == Some(true);
                    match sources.config_map(&k.name).await? {
                        Some(cm) => match config_map_value(cm, &k.key) {
                            Some(v) => v,
                            None if optional => continue,
                            None => {
                                return Err(ConfigError(format!(
                                    "couldn't find key {} in ConfigMap {}/{}",
                                    k.key,
                                    pod.namespace().unwrap_or_default(),
                                    k.name
                                )));
                            }
                        },
                        None if optional => continue,
                        None => {
                            return Err(ConfigError(format!("configmap \"{}\" not found", k.name)));
                        }
                    }
                } else if let Some(k) = &from.secret_key_ref {
                    let optional = k.optional == Some(true);
                    match sources.secret(&k.name).await? {
                        Some(s) => match secret_value(s, &k.key) {
                            Some(v) => v,
                            None if optional => continue,
                            None => {
                                return Err(ConfigError(format!(
                                    "couldn't find key {} in Secret {}/{}",
                                    k.key,
                                    pod.namespace().unwrap_or_default(),
                                    k.name
                                )));
                            }
                        },
                        None if optional => continue,
                        None => {
                            return Err(ConfigError(format!("secret \"{}\" not found", k.name)));
                        }
                    }
                } else {
                    String::new()
                }
            }
        };
        set(&mut env, e.name.clone(), value);
    }
    Ok(env)
}

/// cgroup limits from the container's resources (the kubelet's conversions: shares from the
/// request, quota from the limit over a 100 ms period, memory limit).
pub fn linux_resources(c: &Container) -> api::LinuxContainerResources {
    let r = c.resources.as_ref();
    let get = |kind: &str, name: &str| {
        r.and_then(|r| if kind == "limits" { r.limits.as_ref() } else { r.requests.as_ref() })
            .and_then(|m| m.get(name))
            .cloned()
    };
    let cpu_limit = get("limits", "cpu").and_then(|q| cpu_millis(&q));
    let cpu_request = get("requests", "cpu").and_then(|q| cpu_millis(&q)).or(cpu_limit);
    let mut res = api::LinuxContainerResources {
        cpu_shares: cpu_request.map(|m| (m * 1024 / 1000).max(2) as i64).unwrap_or(2),
        ..Default::default()
    };
    if let Some(limit) = cpu_limit {
        res.cpu_period = 100_000;
        res.cpu_quota = (limit as i64 * 100_000 / 1000).max(1000);
    }
    if let Some(mem) = get("limits", "memory").and_then(|q| bytes(&q)) {
        res.memory_limit_in_bytes = mem as i64;
    }
    res
}

/// Mounts of a container: each volumeMount onto the host directory of its volume
/// (`volume_paths`: volume name → host path), with subPath and readOnly.
pub fn mounts(
    c: &Container,
    volume_paths: &HashMap<String, PathBuf>,
) -> Result<Vec<api::Mount>, ConfigError> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let base = volume_paths.get(&m.name).ok_or_else(|| {
                ConfigError(format!("cannot find volume \"{}\" to mount into container", m.name))
            })?;
            let host = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) if sub.split('/').any(|p| p == "..") || sub.starts_with('/') => {
                    return Err(ConfigError(format!("invalid subPath {sub}")));
                }
                Some(sub) => base.join(sub),
                None => base.clone(),
            };
            // The kubelet's mapping (the API refuses Bidirectional for unprivileged
            // containers, as upstream's does).
            let propagation = match m.mount_propagation.as_deref() {
                Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
                Some("Bidirectional") => api::MountPropagation::PropagationBidirectional,
                _ => api::MountPropagation::PropagationPrivate,
            };
            Ok(api::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: m.read_only.unwrap_or(false),
                propagation: propagation as i32,
                ..Default::default()
            })
        })
        .collect()
}

/// The CRI config of one container of `pod` (pure: env and mounts already resolved).
pub fn container_config(
    pod: &Pod,
    c: &Container,
    attempt: u32,
    env: &[(String, String)],
    mounts: Vec<api::Mount>,
) -> api::ContainerConfig {
    let mut labels = pod_labels(pod);
    labels.insert(CONTAINER_NAME_LABEL.to_string(), c.name.clone());
    let mut annotations = HashMap::new();
    annotations.insert("io.kubernetes.container.restartCount".to_string(), attempt.to_string());
    if let Some(ports) = &c.ports {
        annotations.insert(
            "io.kubernetes.container.ports".to_string(),
            serde_json::to_string(ports).unwrap_or_default(),
        );
    }
    let sc = c.security_context.as_ref();
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let run_as_user = sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user));
    let run_as_group = sc.and_then(|s| s.run_as_group).or(pod_sc.and_then(|s| s.run_as_group));
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: c.name.clone(), attempt }),
        image: Some(api::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: c.command.iter().flatten().map(|s| expand(s, env)).collect(),
        args: c.args.iter().flatten().map(|s| expand(s, env)).collect(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: env.iter().map(|(k, v)| api::KeyValue { key: k.clone(), value: v.clone() }).collect(),
        mounts,
        labels,
        annotations,
        log_path: format!("{}/{attempt}.log", c.name),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(linux_resources(c)),
            security_context: Some(api::LinuxContainerSecurityContext {
                privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
                run_as_user: run_as_user.map(|value| api::Int64Value { value }),
                run_as_group: run_as_group.map(|value| api::Int64Value { value }),
                no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
                ..Default::default()
            }),
        }),
        cdi_devices: Vec::new(),
        devices: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1",
                         "labels": {"app": "web"}, "annotations": {"team": "a"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": [{
                "name": "c", "image": "busybox:1",
                "command": ["sh", "-c"], "args": ["echo $(GREETING) $$(HOME) $(NOPE)"],
                "env": [{"name": "GREETING", "value": "hi"}],
                "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                              "limits": {"cpu": "500m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true},
                                 {"name": "data", "mountPath": "/sub", "subPath": "x/y"}]}]}
        }))
        .expect("pod")
    }

    #[test]
    fn downward_fields() {
        let p = pod();
        assert_eq!(field_value(&p, "metadata.name", "", "").as_deref(), Some("web"));
        assert_eq!(field_value(&p, "metadata.labels['app']", "", "").as_deref(), Some("web"));
        assert_eq!(field_value(&p, "metadata.annotations['team']", "", "").as_deref(), Some("a"));
        assert_eq!(field_value(&p, "spec.nodeName", "", "").as_deref(), Some("n1"));
        assert_eq!(field_value(&p, "status.podIP", "10.0.0.5", "").as_deref(), Some("10.0.0.5"));
        assert_eq!(
            field_value(&p, "status.hostIP", "", "192.168.1.1").as_deref(),
            Some("192.168.1.1")
        );
        assert_eq!(field_value(&p, "spec.bogus", "", ""), None);
        let c = &p.spec.as_ref().expect("spec").containers[0];
        assert_eq!(resource_value(c, "limits.memory").as_deref(), Some("134217728"));
        assert_eq!(resource_value(c, "requests.cpu").as_deref(), Some("1"));
    }

    #[test]
    fn expansion() {
        let env = vec![("A".to_string(), "1".to_string())];
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &env), "1-$(B)-$(A)-$");
    }

    #[test]
    fn config_has_resources_mounts_labels_and_log_path() {
        let p = pod();
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let env = vec![("GREETING".to_string(), "hi".to_string())];
        let vols = HashMap::from([("data".to_string(), PathBuf::from("/v/data"))]);
        let m = mounts(c, &vols).expect("mounts");
        assert_eq!(m[0].host_path, "/v/data");
        assert!(m[0].readonly);
        assert_eq!(m[1].host_path, "/v/data/x/y");
        let cfg = container_config(&p, c, 3, &env, m);
        assert_eq!(cfg.args, vec!["echo hi $(HOME) $(NOPE)"]);
        assert_eq!(cfg.log_path, "c/3.log");
        assert_eq!(cfg.labels[CONTAINER_NAME_LABEL], "c");
        assert_eq!(cfg.labels[crate::runtime::POD_UID_LABEL], "u-1");
        let r = cfg.linux.and_then(|l| l.resources).expect("resources");
        assert_eq!(r.cpu_shares, 256);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
        assert!(mounts(c, &HashMap::new()).is_err(), "a missing volume is a config error");
    }
}
