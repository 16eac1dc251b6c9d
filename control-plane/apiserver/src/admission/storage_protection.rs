//! StorageObjectInUseProtection: every new PersistentVolumeClaim gets the
//! `kubernetes.io/pvc-protection` finalizer and every new PersistentVolume the
//! `kubernetes.io/pv-protection` one (upstream `plugin/pkg/admission/storage/
//! storageobjectinuseprotection`), so that a claim a pod uses, or a volume bound to a
//! claim, stays (Terminating) until the protection controllers let it go.

use async_trait::async_trait;
use serde_json::Value;

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource};
use crate::state::State;
use crate::status::ApiResult;

use skiff_core::names::{PV_PROTECTION, PVC_PROTECTION};

pub struct StorageObjectInUseProtection;

/// The finalizer a new object of this resource gets, if any.
fn finalizer(resource: Resource<'_>) -> Option<&'static str> {
    if resource.subresource.is_some() {
        return None;
    }
    if resource.is_core("persistentvolumeclaims") {
        Some(PVC_PROTECTION)
    } else if resource.is_core("persistentvolumes") {
        Some(PV_PROTECTION)
    } else {
        None
    }
}

/// Appends `finalizer` to the object's `metadata.finalizers` unless it is there.
fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    let list = meta.entry("finalizers").or_insert_with(|| Value::Array(Vec::new()));
    if let Some(list) = list.as_array_mut()
        && !list.iter().any(|f| f.as_str() == Some(finalizer))
    {
        list.push(Value::String(finalizer.to_string()));
    }
}

#[async_trait]
impl MutatingPlugin for StorageObjectInUseProtection {
    fn name(&self) -> &'static str {
        "StorageObjectInUseProtection"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        operation == Operation::Create && finalizer(resource).is_some()
    }

    async fn admit(&self, _server: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        if let (Some(f), Some(obj)) = (finalizer(req.resource()), req.object.as_mut()) {
            add_finalizer(obj, f);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn core(resource: &'static str, subresource: Option<&'static str>) -> Resource<'static> {
        Resource { group: "", version: "v1", resource, subresource }
    }

    #[test]
    fn claims_and_volumes_get_their_finalizer_once() {
        let plugin = StorageObjectInUseProtection;
        assert!(plugin.handles(Operation::Create, core("persistentvolumeclaims", None)));
        assert!(plugin.handles(Operation::Create, core("persistentvolumes", None)));
        assert!(!plugin.handles(Operation::Update, core("persistentvolumeclaims", None)));
        assert!(!plugin.handles(Operation::Create, core("persistentvolumeclaims", Some("status"))));
        assert!(!plugin.handles(Operation::Create, core("pods", None)));

        let mut pvc = json!({"metadata": {"name": "data"}});
        add_finalizer(&mut pvc, PVC_PROTECTION);
        add_finalizer(&mut pvc, PVC_PROTECTION);
        assert_eq!(pvc["metadata"]["finalizers"], json!([PVC_PROTECTION]));
        let mut pv = json!({"metadata": {"name": "disk", "finalizers": ["example.com/keep"]}});
        add_finalizer(&mut pv, PV_PROTECTION);
        assert_eq!(pv["metadata"]["finalizers"], json!(["example.com/keep", PV_PROTECTION]));
    }
}
