//! What routing and discovery read of the APIServices: the group/versions proxied to an
//! extension apiserver (a snapshot rebuilt from the watch cache whenever an APIService
//! changes), and the discovery document each one answered its last availability check
//! with. Below the rest of the aggregator, so that `State` can hold it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

/// `spec.service` of an APIService.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

/// An APIService served by an extension apiserver.
#[derive(Debug, Clone)]
pub struct Remote {
    /// `<version>.<group>`.
    pub name: String,
    pub group: String,
    pub version: String,
    pub service: ServiceRef,
    /// `spec.caBundle` (PEM), trusted for the extension's serving certificate.
    pub ca_bundle: Vec<u8>,
    pub insecure_skip_tls_verify: bool,
    pub group_priority_minimum: i64,
    pub version_priority: i64,
    /// The `Available` condition is True: requests are proxied, else answered 503.
    pub available: bool,
}

impl Remote {
    /// The proxied part of an APIService object (`None` for a local one).
    pub fn of(obj: &Value) -> Option<Remote> {
        let spec = obj.get("spec")?;
        let service = spec.get("service").filter(|s| s.is_object())?;
        let s =
            |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let ca_bundle = spec
            .get("caBundle")
            .and_then(Value::as_str)
            .and_then(|b| {
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b).ok()
            })
            .unwrap_or_default();
        let available = obj
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        Some(Remote {
            name: s(obj.get("metadata")?, "name"),
            group: s(spec, "group"),
            version: s(spec, "version"),
            service: ServiceRef {
                namespace: s(service, "namespace"),
                name: s(service, "name"),
                port: service.get("port").and_then(Value::as_u64).unwrap_or(443) as u16,
            },
            ca_bundle,
            insecure_skip_tls_verify: spec["insecureSkipTLSVerify"].as_bool().unwrap_or(false),
            group_priority_minimum: spec["groupPriorityMinimum"].as_i64().unwrap_or(0),
            version_priority: spec["versionPriority"].as_i64().unwrap_or(0),
            available,
        })
    }
}

/// The proxied APIServices and their last discovery documents.
#[derive(Default)]
pub struct Remotes {
    proxied: RwLock<Arc<Vec<Arc<Remote>>>>,
    /// `APIResourceList` by APIService name, from the last successful discovery check.
    discovery: RwLock<HashMap<String, Value>>,
}

impl Remotes {
    /// The APIService proxying `group`/`version`, if any. Most requests find none: the
    /// snapshot is usually empty or short.
    pub fn find(&self, group: &str, version: &str) -> Option<Arc<Remote>> {
        let proxied = self.proxied.read().unwrap_or_else(|e| e.into_inner()).clone();
        proxied.iter().find(|r| r.version == version && r.group == group).cloned()
    }

    /// The APIService proxying a request path (`/apis/<group>/<version>[/...]`).
    pub fn for_path(&self, path: &str) -> Option<Arc<Remote>> {
        let rest = path.strip_prefix("/apis/")?;
        let proxied = self.proxied.read().unwrap_or_else(|e| e.into_inner()).clone();
        if proxied.is_empty() {
            return None;
        }
        let mut parts = rest.split('/');
        let (group, version) = (parts.next()?, parts.next().filter(|v| !v.is_empty())?);
        proxied.iter().find(|r| r.version == version && r.group == group).cloned()
    }

    /// Every proxied APIService, highest group priority first, then by group and by
    /// version priority (upstream's order of groups and versions in discovery).
    pub fn all(&self) -> Arc<Vec<Arc<Remote>>> {
        self.proxied.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replace the snapshot; discovery documents of APIServices gone are dropped.
    pub fn set(&self, mut remotes: Vec<Arc<Remote>>) {
        remotes.sort_by(|a, b| {
            b.group_priority_minimum
                .cmp(&a.group_priority_minimum)
                .then_with(|| a.group.cmp(&b.group))
                .then_with(|| b.version_priority.cmp(&a.version_priority))
                .then_with(|| {
                    crate::registry::version_priority(&b.version)
                        .cmp(&crate::registry::version_priority(&a.version))
                })
        });
        let mut discovery = self.discovery.write().unwrap_or_else(|e| e.into_inner());
        discovery.retain(|name, _| remotes.iter().any(|r| r.name == *name));
        *self.proxied.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(remotes);
    }

    /// The document an extension answered its discovery check with.
    pub fn set_discovery(&self, name: &str, doc: Value) {
        let mut discovery = self.discovery.write().unwrap_or_else(|e| e.into_inner());
        if self.find_name(name) {
            discovery.insert(name.to_string(), doc);
        }
    }

    /// The last discovery document of an APIService.
    pub fn discovery(&self, name: &str) -> Option<Value> {
        self.discovery.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }

    fn find_name(&self, name: &str) -> bool {
        self.all().iter().any(|r| r.name == name)
    }
}
