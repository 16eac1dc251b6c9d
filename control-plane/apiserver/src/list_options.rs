//! List and watch options: which of resourceVersion, resourceVersionMatch, continue and
//! sendInitialEvents a request may combine, continue tokens, and the selectors (`Filter`) that
//! both the list handler and the watch read.

use base64::Engine;
use serde_json::{Value, json};

use crate::cache::CachedObject;
use crate::registry::ResourceType;
use crate::request::Query;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::invalid_of;
use crate::status::{ApiError, ApiResult};
use skiff_machinery::admission::{self};
use skiff_store::Revision;

/// Upstream's answer to a continue token whose revision has left the history (`Expired`,
/// with a token for the rest of the list at the latest revision).
pub(crate) const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// Upstream's `ValidateListOptions`: which of resourceVersion, resourceVersionMatch,
/// continue and sendInitialEvents a list (or a watch) may combine. A 422 on
/// `ListOptions.meta.k8s.io`.
pub fn validate_list_options(query: &Query, watch: bool) -> ApiResult<()> {
    let path = admission::Path::root("resourceVersionMatch");
    let forbidden = |detail: &str| admission::FieldError::forbidden(&path, detail);
    let matched = query.get("resourceVersionMatch");
    let continued = query.get("continue").is_some();
    let send_initial = query.has("sendInitialEvents");
    let mut errs = Vec::new();
    if watch {
        if send_initial && matched != Some("NotOlderThan") {
            errs.push(forbidden(
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if let Some(m) = matched {
            if !send_initial {
                errs.push(forbidden(
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if m != "NotOlderThan" {
                errs.push(admission::FieldError::not_supported(&path, m, &["NotOlderThan"]));
            }
            if continued {
                errs.push(forbidden("resourceVersionMatch is forbidden when continue is provided"));
            }
        }
    } else {
        if let Some(m) = matched {
            let rv = query.get("resourceVersion");
            if rv.is_none() {
                errs.push(forbidden(
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if continued {
                errs.push(forbidden("resourceVersionMatch is forbidden when continue is provided"));
            }
            if m != "Exact" && m != "NotOlderThan" {
                errs.push(admission::FieldError::not_supported(
                    &path,
                    m,
                    &["Exact", "NotOlderThan", ""],
                ));
            }
            if m == "Exact" && rv == Some("0") {
                errs.push(forbidden(
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if send_initial {
            errs.push(admission::FieldError::forbidden(
                &admission::Path::root("sendInitialEvents"),
                "sendInitialEvents is forbidden for list",
            ));
        }
    }
    if errs.is_empty() {
        return Ok(());
    }
    Err(invalid_of("ListOptions", "meta.k8s.io", "", errs))
}

/// A continue token: the list's revision and the last key returned.
pub(crate) fn encode_continue(rv: Revision, key: &str) -> String {
    let raw = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": key});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw.to_string())
}

pub(crate) fn decode_continue(token: &str) -> ApiResult<(Revision, String)> {
    let bad = || ApiError::bad_request("continue key is not valid: ".to_string() + token);
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_i64().ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?.to_string();
    Ok((rv, start))
}

/// The selectors of a list or watch request.
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub namespace: Option<String>,
    /// A custom resource type whose `selectableFields` the field selector uses: the watch
    /// cache indexes custom objects by name and namespace only (a CRD's fields differ by
    /// version and change with it), so those are read from each object as it is matched.
    selectable: Option<&'static [&'static str]>,
}

impl Filter {
    pub fn from_query(rt: &ResourceType, ns: Option<&str>, query: &Query) -> ApiResult<Filter> {
        let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))?;
        let fields = FieldSelector::parse(
            query.get("fieldSelector").unwrap_or(""),
            |f| rt.supports_field(f),
            rt.plural(),
        )?;
        let selectable = (rt.custom.is_some() && fields.uses_any(rt.fields)).then_some(rt.fields);
        Ok(Filter { labels, fields, namespace: ns.map(str::to_string), selectable })
    }

    pub fn matches(&self, obj: &CachedObject) -> bool {
        if !self.labels.matches(&obj.labels) {
            return false;
        }
        match &self.selectable {
            Some(fields) => {
                self.fields.matches(&crate::registry::field_values(fields, true, &obj.value()))
            }
            None => self.fields.matches(&obj.fields),
        }
    }

    /// The narrowest key prefix: a namespace, or one object by metadata.name.
    pub fn prefix(&self, rt: &ResourceType) -> String {
        let ns = self.namespace.as_deref().or_else(|| self.fields.required("metadata.namespace"));
        rt.namespace_prefix(ns)
    }
}
