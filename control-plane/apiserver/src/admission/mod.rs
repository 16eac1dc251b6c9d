//! The admission chain: after decoding and defaulting, every write passes the mutating
//! plugins in order, then (after the kind's own strategy and validation) the validating
//! plugins, as upstream's `admission.Interface` chain does. Built in: NamespaceLifecycle,
//! ServiceAccount, StorageObjectInUseProtection, Priority and the mutating webhooks; NodeRestriction and the validating
//! webhooks. Each plugin is a trait object that says which requests it [`handles`] and
//! admits or validates an [`AdmissionRequest`]; [`chain::Chain`] runs them in order. This
//! file holds what every plugin shares, below them; the chain is above them all.
//!
//! [`handles`]: MutatingPlugin::handles

mod certificates;
pub mod chain;
mod escalation;
mod limitranger;
mod namespace;
mod noderestriction;
mod priority;
mod serviceaccount;
mod storage_protection;
pub mod webhook;

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::registry::ResourceType;
use super::status::ApiResult;
use super::user::UserInfo;
use crate::state::State;
use skiff_core::json::ValueAt;
use skiff_core::names;

tokio::task_local! {
    /// The user of the request being served (set by the dispatcher for the request's task).
    /// Shared: every admission request of a write reads it (a clone of the `UserInfo` was
    /// five allocations, several per create).
    static USER: Arc<UserInfo>;
}

/// Run `f` (one request) as `user`: the admission chain and audit read it.
pub async fn with_user<F: Future>(user: UserInfo, f: F) -> F::Output {
    USER.scope(Arc::new(user), f).await
}

/// The user of the request being served. Without one (authentication not wired, in-process
/// callers, tests) it is the cluster admin: `system:admin` in `system:masters`.
pub fn current_user() -> Arc<UserInfo> {
    USER.try_with(Arc::clone).unwrap_or_else(|_| Arc::new(admin()))
}

/// The identity requests get when authentication put none in the request.
pub fn admin() -> UserInfo {
    UserInfo::new("system:admin", &[names::MASTERS, names::AUTHENTICATED])
}

/// What the request does (upstream `admission.Operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    /// Upstream's spelling ("CREATE", ...), as in AdmissionReview and webhook rules.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// The resource a request addresses: group/version/plural and subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
}

impl Resource<'_> {
    /// A core/v1 resource without subresource?
    pub fn is_core(&self, plural: &str) -> bool {
        self.group.is_empty() && self.resource == plural
    }
}

/// One write as admission sees it (upstream `admission.Attributes`).
#[derive(Debug, Clone)]
pub struct AdmissionRequest {
    /// A unique id of this admission (the AdmissionReview's `request.uid`).
    pub uid: String,
    pub operation: Operation,
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// The plural resource name ("pods").
    pub resource: &'static str,
    pub subresource: Option<String>,
    pub namespaced: bool,
    pub namespace: Option<String>,
    /// Empty on a create with generateName (the name is generated after mutation).
    pub name: String,
    /// The new object (None on delete).
    pub object: Option<Value>,
    /// The current object (update, delete).
    pub old_object: Option<Value>,
    pub user: Arc<UserInfo>,
    pub dry_run: bool,
    /// A webhook patched the object (the apiserver decodes it again, pruning what the
    /// kind does not declare).
    pub patched: bool,
}

impl AdmissionRequest {
    /// A request on `rt` by the current request's user.
    pub fn new(rt: &ResourceType, operation: Operation, namespace: Option<&str>) -> Self {
        AdmissionRequest {
            uid: uuid::Uuid::new_v4().to_string(),
            operation,
            group: rt.desc.group,
            version: rt.desc.version,
            kind: rt.desc.kind,
            resource: rt.desc.plural,
            subresource: None,
            namespaced: rt.desc.namespaced,
            namespace: namespace.map(str::to_string),
            name: String::new(),
            object: None,
            old_object: None,
            user: current_user(),
            dry_run: false,
            patched: false,
        }
    }

    pub fn resource(&self) -> Resource<'_> {
        Resource {
            group: self.group,
            version: self.version,
            resource: self.resource,
            subresource: self.subresource.as_deref(),
        }
    }

    /// The object the request is about: the new one, else (delete) the old one.
    pub fn subject(&self) -> Option<&Value> {
        self.object.as_ref().or(self.old_object.as_ref())
    }

    /// `pods "web" is forbidden: <why>`: upstream's admission denial message shape.
    pub fn forbidden(&self, why: impl std::fmt::Display) -> super::status::ApiError {
        forbidden(self.group, self.resource, &self.name, why)
    }
}

/// Upstream's admission denial of a write to `name` of `resource` in `group`:
/// `pods "web" is forbidden: <why>`, a 403.
pub fn forbidden(
    group: &str,
    resource: &str,
    name: &str,
    why: impl std::fmt::Display,
) -> super::status::ApiError {
    let qualified =
        if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
    super::status::ApiError::forbidden(format!("{qualified} \"{name}\" is forbidden: {why}"))
        .with_details(group, resource, name)
}

/// A plugin of the mutating phase (upstream `admission.MutationInterface`).
#[async_trait]
pub trait MutatingPlugin: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether the plugin looks at this operation on this resource at all.
    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool;
    /// Whether the plugin has anything to do for this user now (no webhook configured, not
    /// a node): lets the apiserver skip building a request nobody looks at.
    fn active(&self, _state: &State, _user: &UserInfo) -> bool {
        true
    }
    /// Change `req.object` or refuse the request.
    async fn admit(&self, state: &State, req: &mut AdmissionRequest) -> ApiResult<()>;
}

/// A plugin of the validating phase (upstream `admission.ValidationInterface`).
#[async_trait]
pub trait ValidatingPlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn handles(&self, operation: Operation, resource: Resource<'_>) -> bool;
    /// See [`MutatingPlugin::active`].
    fn active(&self, _state: &State, _user: &UserInfo) -> bool {
        true
    }
    /// Refuse the request or let it pass; the object is final here.
    async fn validate(&self, state: &State, req: &AdmissionRequest) -> ApiResult<()>;
}

/// The labels of an object's metadata.
pub(crate) fn labels_of(obj: Option<&Value>) -> std::collections::BTreeMap<String, String> {
    obj.and_then(|o| o.at(&["metadata", "labels"]))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
