//! The verbs' calls into the admission chain: each builds the [`AdmissionRequest`] of one
//! write only when some plugin looks at it, runs the mutating or validating phase, and
//! decodes a webhook-patched object again as the kind's type.

use serde_json::Value;

use super::verb::Target;
use crate::admission::{AdmissionRequest, Operation, Resource, current_user};
use crate::registry::ResourceType;
use crate::status::{ApiError, ApiResult};
use skiff_core::json::ValueAt;

fn resource<'a>(rt: &'a ResourceType, sub: Option<&'a str>) -> Resource<'a> {
    Resource {
        group: rt.desc.group,
        version: rt.desc.version,
        resource: rt.desc.plural,
        subresource: sub,
    }
}

fn name_of(obj: &Value) -> String {
    obj.at(&["metadata", "name"]).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// Decode a webhook-patched object again as the kind's type (pruning unknown fields).
fn renormalize(rt: &ResourceType, req: &AdmissionRequest, obj: Value) -> ApiResult<Value> {
    if !req.patched {
        return Ok(obj);
    }
    (rt.normalize.owned)(obj).map_err(|e| {
        ApiError::bad_request(format!(
            "error decoding {} {} patched by an admission webhook: {e}",
            rt.kind(),
            rt.desc.api_version()
        ))
    })
}

/// Create, mutating phase (after decoding and defaulting): the admitted object.
pub async fn admit_create(t: Target<'_>, obj: Value, dry_run: bool) -> ApiResult<Value> {
    let Target { server, rt, ns } = t;
    let user = current_user();
    if !server.admission.mutates(server, Operation::Create, resource(rt, None), &user) {
        return Ok(obj);
    }
    let mut req = AdmissionRequest::new(rt, Operation::Create, ns);
    req.name = name_of(&obj);
    req.object = Some(obj);
    req.dry_run = dry_run;
    server.admission.admit(server, &mut req).await?;
    let obj = req.object.take().unwrap_or(Value::Null);
    renormalize(rt, &req, obj)
}

/// Create, validating phase (after the kind's validation, name generated).
pub async fn validate_create(t: Target<'_>, obj: &mut Value, dry_run: bool) -> ApiResult<()> {
    let Target { server, rt, ns } = t;
    let user = current_user();
    if !server.admission.validates(server, Operation::Create, resource(rt, None), &user) {
        return Ok(());
    }
    let mut req = AdmissionRequest::new(rt, Operation::Create, ns);
    req.name = name_of(obj);
    req.object = Some(lend(obj));
    req.dry_run = dry_run;
    let validated = server.admission.validate(server, &req).await;
    give_back(obj, &mut req.object);
    validated
}

/// Lend an object to an admission request (moved, not copied: a copy of a whole pod was a
/// tenth of the server's CPU per create); [`give_back`] restores it, whatever the outcome.
fn lend(obj: &mut Value) -> Value {
    std::mem::take(obj)
}

fn give_back(obj: &mut Value, lent: &mut Option<Value>) {
    *obj = lent.take().unwrap_or(Value::Null);
}

/// Update (main resource or a subresource), mutating phase: the admitted new object.
pub async fn admit_update(
    t: Target<'_>,
    name: &str,
    sub: Option<&str>,
    new: Value,
    old: &mut Value,
    dry_run: bool,
) -> ApiResult<Value> {
    let Target { server, rt, ns } = t;
    let user = current_user();
    if !server.admission.mutates(server, Operation::Update, resource(rt, sub), &user) {
        return Ok(new);
    }
    let mut req = AdmissionRequest::new(rt, Operation::Update, ns);
    req.name = name.to_string();
    req.subresource = sub.map(str::to_string);
    req.object = Some(new);
    req.old_object = Some(lend(old));
    req.dry_run = dry_run;
    let admitted = server.admission.admit(server, &mut req).await;
    give_back(old, &mut req.old_object);
    admitted?;
    let obj = req.object.take().unwrap_or(Value::Null);
    renormalize(rt, &req, obj)
}

/// Update, validating phase.
pub async fn validate_update(
    t: Target<'_>,
    name: &str,
    sub: Option<&str>,
    new: &mut Value,
    old: &mut Value,
    dry_run: bool,
) -> ApiResult<()> {
    let Target { server, rt, ns } = t;
    let user = current_user();
    if !server.admission.validates(server, Operation::Update, resource(rt, sub), &user) {
        return Ok(());
    }
    let mut req = AdmissionRequest::new(rt, Operation::Update, ns);
    req.name = name.to_string();
    req.subresource = sub.map(str::to_string);
    req.object = Some(lend(new));
    req.old_object = Some(lend(old));
    req.dry_run = dry_run;
    let validated = server.admission.validate(server, &req).await;
    give_back(new, &mut req.object);
    give_back(old, &mut req.old_object);
    validated
}

/// A subresource create (pods/binding): both phases over the subresource's body.
pub async fn admit_subresource_create(
    t: Target<'_>,
    name: &str,
    sub: &str,
    body: &Value,
    dry_run: bool,
) -> ApiResult<()> {
    let Target { server, rt, ns } = t;
    let mut req = AdmissionRequest::new(rt, Operation::Create, ns);
    req.name = name.to_string();
    req.subresource = Some(sub.to_string());
    req.object = Some(body.clone());
    req.dry_run = dry_run;
    server.admission.admit(server, &mut req).await?;
    server.admission.validate(server, &req).await
}

/// Delete: both phases with the current object as oldObject.
pub async fn admit_delete(
    t: Target<'_>,
    name: &str,
    current: &Value,
    dry_run: bool,
) -> ApiResult<()> {
    let Target { server, rt, ns } = t;
    let user = current_user();
    let r = resource(rt, None);
    if !server.admission.mutates(server, Operation::Delete, r, &user)
        && !server.admission.validates(server, Operation::Delete, r, &user)
    {
        return Ok(());
    }
    let mut req = AdmissionRequest::new(rt, Operation::Delete, ns);
    req.name = name.to_string();
    req.old_object = Some(current.clone());
    req.dry_run = dry_run;
    server.admission.admit(server, &mut req).await?;
    server.admission.validate(server, &req).await
}
