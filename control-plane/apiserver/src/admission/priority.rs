//! Priority: a pod's `priorityClassName` (or the cluster's globalDefault class) becomes its
//! `priority` and `preemptionPolicy` from scheduling.k8s.io PriorityClass objects (upstream
//! `plugin/pkg/admission/priority`). The two system classes resolve without objects.

use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource, ValidatingPlugin};
use crate::state::State;
use crate::status::ApiResult;
use skiff_core::json::ValueAt;
use skiff_store::Revision;

/// The plugin, with the PriorityClasses it last read: every pod create consults them, so
/// they are parsed once per change of the kind rather than once per pod.
#[derive(Default)]
pub struct Priority {
    index: RwLock<Option<Arc<Classes>>>,
}

/// What admission reads of a PriorityClass.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Class {
    #[serde(default)]
    metadata: ClassMeta,
    #[serde(default)]
    value: i64,
    #[serde(default)]
    global_default: bool,
    preemption_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ClassMeta {
    #[serde(default)]
    name: String,
}

/// The PriorityClasses of the watch cache as of its `fingerprint` (the kind's last change
/// and object count).
struct Classes {
    fingerprint: (Revision, usize),
    classes: Vec<Class>,
}

impl Class {
    /// What a pod gets from this class: its name, priority and preemption policy.
    fn resolved(&self) -> (String, i64, Option<String>) {
        (self.metadata.name.clone(), self.value, self.preemption_policy.clone())
    }
}

impl Classes {
    fn named(&self, name: &str) -> Option<&Class> {
        self.classes.iter().find(|c| c.metadata.name == name)
    }

    fn global_default(&self) -> Option<&Class> {
        self.classes.iter().find(|c| c.global_default)
    }
}

/// The built-in classes (upstream `scheduling.SystemPriorityClasses`).
fn system_class(name: &str) -> Option<i64> {
    match name {
        "system-node-critical" => Some(2_000_001_000),
        "system-cluster-critical" => Some(2_000_000_000),
        _ => None,
    }
}

#[async_trait]
impl MutatingPlugin for Priority {
    fn name(&self) -> &'static str {
        "Priority"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        operation == Operation::Create && resource.is_core("pods") && resource.subresource.is_none()
    }

    async fn admit(&self, state: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        // Eventually consistent, as upstream's lister; a named class not seen yet is looked
        // up again once the cache holds every committed write.
        let mut classes = self.classes(state, false).await?;
        let named = req
            .object
            .as_ref()
            .and_then(|p| p.at(&["spec", "priorityClassName"]))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty() && system_class(n).is_none());
        if let Some(n) = named
            && classes.named(n).is_none()
        {
            classes = self.classes(state, true).await?;
        }
        let Some(spec) = req.object.as_ref().and_then(|p| p.get("spec")) else { return Ok(()) };
        let class_name = spec.get("priorityClassName").and_then(Value::as_str).unwrap_or_default();
        let (name, value, policy) = if class_name.is_empty() {
            match classes.global_default() {
                Some(c) => c.resolved(),
                // No default class: priority 0 (the pod strategy sets it).
                None => return Ok(()),
            }
        } else if let Some(v) = system_class(class_name) {
            (class_name.to_string(), v, None)
        } else {
            match classes.named(class_name) {
                Some(c) => c.resolved(),
                None => {
                    return Err(
                        req.forbidden(format!("no PriorityClass with name {class_name} was found"))
                    );
                }
            }
        };
        if let Some(given) = spec.get("priority").and_then(Value::as_i64)
            && given != value
        {
            return Err(req.forbidden(format!(
                "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {value} from the given PriorityClass name"
            )));
        }
        let given_policy = spec.get("preemptionPolicy").and_then(Value::as_str).map(str::to_string);
        if let (Some(given), Some(want)) = (&given_policy, &policy)
            && given != want
        {
            return Err(req.forbidden(format!(
                "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {want} from the given PriorityClass name"
            )));
        }
        if let Some(spec) =
            req.object.as_mut().and_then(|p| p.get_mut("spec")).and_then(Value::as_object_mut)
        {
            spec.insert("priorityClassName".into(), json!(name));
            spec.insert("priority".into(), json!(value));
            if let Some(p) = policy {
                spec.insert("preemptionPolicy".into(), json!(p));
            }
        }
        Ok(())
    }
}

/// PriorityClass writes: only one class may be the global default (the reserved `system-`
/// names and the value cap are the kind's validation).
#[async_trait]
impl ValidatingPlugin for Priority {
    fn name(&self) -> &'static str {
        "Priority"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        matches!(operation, Operation::Create | Operation::Update)
            && resource.group == "scheduling.k8s.io"
            && resource.resource == "priorityclasses"
    }

    async fn validate(&self, state: &State, req: &AdmissionRequest) -> ApiResult<()> {
        let Some(class) = req.object.as_ref() else { return Ok(()) };
        let name = class.at(&["metadata", "name"]).and_then(Value::as_str).unwrap_or_default();
        if class.get("globalDefault").and_then(Value::as_bool) == Some(true)
            && let Some(other) = self
                .classes(state, true)
                .await?
                .classes
                .iter()
                .find(|c| c.global_default && c.metadata.name != name)
        {
            return Err(req.forbidden(format!(
                "PriorityClass {} is already marked as default. Only one default can exist",
                other.metadata.name
            )));
        }
        Ok(())
    }
}

impl Priority {
    /// The PriorityClasses from the watch cache (`fresh`: once it holds every committed
    /// write), parsed again only when the kind has changed since the last read.
    async fn classes(&self, state: &State, fresh: bool) -> ApiResult<Arc<Classes>> {
        let Some(rt) = state.registry.find("scheduling.k8s.io", "v1", "priorityclasses") else {
            return Ok(Arc::new(Classes { fingerprint: (0, 0), classes: Vec::new() }));
        };
        if fresh {
            let current = state.store.current_revision().await?;
            state.cache.wait_for(current, std::time::Duration::from_secs(3)).await;
        }
        let cache = state.cache.resource(rt);
        let fingerprint = cache.fingerprint();
        if let Some(index) = self.index.read().unwrap_or_else(|e| e.into_inner()).as_ref()
            && index.fingerprint == fingerprint
        {
            return Ok(index.clone());
        }
        let classes = cache.decode_all(&rt.prefix());
        let index = Arc::new(Classes { fingerprint, classes });
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = Some(index.clone());
        Ok(index)
    }
}
