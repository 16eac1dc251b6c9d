//! NamespaceLifecycle: nothing is created in a namespace that does not exist or is being
//! terminated (upstream `plugin/pkg/admission/namespace/lifecycle`).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::{AdmissionRequest, MutatingPlugin, Operation, Resource};
use crate::apiserver::ApiServer;
use crate::apiserver::cache::set_resource_version;
use crate::apiserver::status::{ApiError, ApiResult};

/// How long a create waits for the watch cache to hold every committed write.
const CACHE_WAIT: Duration = Duration::from_secs(3);

pub struct NamespaceLifecycle;

#[async_trait]
impl MutatingPlugin for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        "NamespaceLifecycle"
    }

    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool {
        operation == Operation::Create && resource.subresource.is_none()
    }

    async fn admit(&self, server: &ApiServer, req: &mut AdmissionRequest) -> ApiResult<()> {
        let Some(ns) = req.namespace.as_deref().filter(|_| req.namespaced) else { return Ok(()) };
        let nsr = server.registry.namespaces();
        let key = nsr.key(None, ns);
        // Read your writes through the cache: wait until it holds every committed write (a
        // namespace deleted a moment ago must already count), then look there; a store read
        // per create would cost a blocking-pool round trip.
        let current = server.store.current_revision().await?;
        let obj = if server.cache.wait_for(current, CACHE_WAIT).await {
            server.cache.resource(nsr).get(&key).map(|o| o.value())
        } else {
            match server.store.get(&key).await? {
                Some(kv) => {
                    let mut v: Value = serde_json::from_slice(&kv.value).map_err(|e| {
                        ApiError::internal(format!("decoding stored object {}: {e}", kv.key))
                    })?;
                    set_resource_version(&mut v, kv.mod_revision);
                    Some(v)
                }
                None => None,
            }
        };
        let meta = |o: &Value, f: &str| {
            o.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        match obj {
            None => Err(ApiError::not_found("namespaces", ns).with_details("", "namespaces", ns)),
            Some(o)
                if o.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating")
                    || meta(&o, "deletionTimestamp").is_some() =>
            {
                let qualified = if req.group.is_empty() {
                    req.resource.to_string()
                } else {
                    format!("{}.{}", req.resource, req.group)
                };
                Err(ApiError::forbidden(format!(
                    "{qualified} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    meta(&o, "name").unwrap_or_else(|| ns.to_string())
                )))
            }
            Some(_) => Ok(()),
        }
    }
}
