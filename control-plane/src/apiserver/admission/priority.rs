//! Priority: a pod's `priorityClassName` (or the cluster's globalDefault class) becomes its
//! `priority` and `preemptionPolicy` from scheduling.k8s.io PriorityClass objects (upstream
//! `plugin/pkg/admission/priority`). The two system classes resolve without objects.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource, ValidatingPlugin};
use crate::apiserver::ApiServer;
use crate::apiserver::status::ApiResult;
use crate::machinery::ValueAt;

pub struct Priority;

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

    async fn admit(&self, server: &ApiServer, req: &mut AdmissionRequest) -> ApiResult<()> {
        // Eventually consistent, as upstream's lister; a named class not seen yet is looked
        // up again once the cache holds every committed write.
        let mut classes = priority_classes(server, false).await?;
        let named = req
            .object
            .as_ref()
            .and_then(|p| p.at(&["spec", "priorityClassName"]))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty() && system_class(n).is_none())
            .map(str::to_string);
        if let Some(n) = named
            && !classes
                .iter()
                .any(|c| c.at(&["metadata", "name"]).and_then(Value::as_str) == Some(&n))
        {
            classes = priority_classes(server, true).await?;
        }
        let Some(spec) = req.object.as_ref().and_then(|p| p.get("spec")) else { return Ok(()) };
        let class_name = spec.get("priorityClassName").and_then(Value::as_str).unwrap_or_default();
        let (name, value, policy) = if class_name.is_empty() {
            match classes
                .iter()
                .find(|c| c.get("globalDefault").and_then(Value::as_bool) == Some(true))
            {
                Some(c) => class_parts(c),
                // No default class: priority 0 (the pod strategy sets it).
                None => return Ok(()),
            }
        } else if let Some(v) = system_class(class_name) {
            (class_name.to_string(), v, None)
        } else {
            match classes
                .iter()
                .find(|c| c.at(&["metadata", "name"]).and_then(Value::as_str) == Some(class_name))
            {
                Some(c) => class_parts(c),
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

    async fn validate(&self, server: &ApiServer, req: &AdmissionRequest) -> ApiResult<()> {
        let Some(class) = req.object.as_ref() else { return Ok(()) };
        let (name, _, _) = class_parts(class);
        if class.get("globalDefault").and_then(Value::as_bool) == Some(true)
            && let Some(other) = priority_classes(server, true).await?.iter().find(|c| {
                c.get("globalDefault").and_then(Value::as_bool) == Some(true)
                    && c.at(&["metadata", "name"]).and_then(Value::as_str) != Some(name.as_str())
            })
        {
            let other = other.at(&["metadata", "name"]).and_then(Value::as_str).unwrap_or_default();
            return Err(req.forbidden(format!(
                "PriorityClass {other} is already marked as default. Only one default can exist"
            )));
        }
        Ok(())
    }
}

fn class_parts(c: &Value) -> (String, i64, Option<String>) {
    (
        c.at(&["metadata", "name"]).and_then(Value::as_str).unwrap_or_default().to_string(),
        c.get("value").and_then(Value::as_i64).unwrap_or(0),
        c.get("preemptionPolicy").and_then(Value::as_str).map(str::to_string),
    )
}

/// The PriorityClasses from the watch cache (`fresh`: once it holds every committed write).
async fn priority_classes(server: &ApiServer, fresh: bool) -> ApiResult<Vec<Value>> {
    let Some(rt) = server.registry.find("scheduling.k8s.io", "v1", "priorityclasses") else {
        return Ok(Vec::new());
    };
    if fresh {
        let current = server.store.current_revision().await?;
        server.cache.wait_for(current, std::time::Duration::from_secs(3)).await;
    }
    Ok(server.cache.resource(rt).list(&rt.prefix(), None).iter().map(|o| o.value()).collect())
}
