//! Request routing: a URL path and method become a [`RequestInfo`] (upstream's
//! RequestInfoFactory), and query parameters become typed options.

use std::collections::HashMap;

use http::Method;

use super::status::{ApiError, ApiResult};

/// What a write request brings besides its target: the query, the headers and the body.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    pub query: &'a Query,
    pub headers: &'a http::HeaderMap,
    pub body: &'a [u8],
}

/// What a resource request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    /// Plural resource name ("pods").
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    pub verb: Verb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

/// The non-resource paths and the resource paths, as the router sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/api/v1/...`, `/apis/<group>/<version>/...` naming a resource.
    Resource(RequestInfo),
    /// `/api`
    LegacyRoot,
    /// `/apis`
    GroupsRoot,
    /// `/api/v1`, `/apis/<group>/<version>`
    GroupVersion { group: String, version: String },
    /// `/apis/<group>`
    Group { group: String },
}

/// Parse `/api/...` and `/apis/...` paths. `None` when the path is not an API path.
pub fn parse(method: &Method, path: &str, watch_param: bool) -> ApiResult<Option<Route>> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api"] => return Ok(Some(Route::LegacyRoot)),
        ["apis"] => return Ok(Some(Route::GroupsRoot)),
        ["api", version, rest @ ..] => (String::new(), version.to_string(), rest),
        ["apis", group] => return Ok(Some(Route::Group { group: group.to_string() })),
        ["apis", group, version, rest @ ..] => (group.to_string(), version.to_string(), rest),
        _ => return Ok(None),
    };
    if rest.is_empty() {
        return Ok(Some(Route::GroupVersion { group, version }));
    }
    // Legacy `/watch/` prefix: /api/v1/watch/namespaces/ns/pods
    let (rest, legacy_watch) = match rest {
        ["watch", tail @ ..] => (tail, true),
        other => (other, false),
    };
    let (namespace, rest) = match rest {
        // The namespace's own subresources, as upstream's RequestInfoFactory special-cases.
        ["namespaces", _, "status" | "finalize"] => (None, rest),
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        other => (None, other),
    };
    let (resource, name, subresource) = match rest {
        [resource] => (resource.to_string(), None, None),
        [resource, name] => (resource.to_string(), Some(name.to_string()), None),
        [resource, name, sub] => {
            (resource.to_string(), Some(name.to_string()), Some(sub.to_string()))
        }
        _ => return Err(ApiError::path_not_found()),
    };
    // `/api/v1/namespaces/foo` is the namespace object itself.
    let verb = match (method, name.is_some()) {
        (&Method::GET, _) if legacy_watch || watch_param => Verb::Watch,
        (&Method::GET, true) => Verb::Get,
        (&Method::GET, false) => Verb::List,
        (&Method::POST, _) => Verb::Create,
        (&Method::PUT, _) => Verb::Update,
        (&Method::PATCH, _) => Verb::Patch,
        (&Method::DELETE, true) => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed(method.as_str())),
    };
    Ok(Some(Route::Resource(RequestInfo {
        group,
        version,
        namespace,
        resource,
        name,
        subresource,
        verb,
    })))
}

/// Query parameters of list/watch/get/write requests.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub raw: HashMap<String, String>,
}

impl Query {
    pub fn parse(query: Option<&str>) -> Self {
        let mut raw = HashMap::new();
        if let Some(q) = query {
            for pair in q.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                raw.insert(decode(k), decode(v));
            }
        }
        Query { raw }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.raw.get(key).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// Whether the parameter was given at all, even empty.
    pub fn has(&self, key: &str) -> bool {
        self.raw.contains_key(key)
    }

    /// A boolean parameter, parsed like Go's strconv.ParseBool ("1", "t", "True", ...).
    pub fn flag(&self, key: &str) -> bool {
        matches!(
            self.raw.get(key).map(String::as_str),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True" | "")
        )
    }

    pub fn int(&self, key: &str) -> ApiResult<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid value for {key}: {v:?}"))),
        }
    }

    pub fn dry_run(&self) -> ApiResult<bool> {
        match self.get("dryRun") {
            None => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "Invalid dry run value: {other:?}: supported values: \"All\""
            ))),
        }
    }

    pub fn field_validation(&self) -> ApiResult<FieldValidation> {
        match self.get("fieldValidation") {
            None => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// Percent-decoding of query components (`+` is a space, as Go's url.ParseQuery does).
pub fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, path: &str) -> RequestInfo {
        match parse(&method, path, false).unwrap().unwrap() {
            Route::Resource(i) => i,
            other => panic!("{path}: expected a resource route, got {other:?}"),
        }
    }

    #[test]
    fn parses_resource_paths() {
        let i = info(Method::GET, "/api/v1/namespaces/default/pods/web-1/status");
        assert_eq!(
            (i.group.as_str(), i.namespace.as_deref(), i.resource.as_str()),
            ("", Some("default"), "pods")
        );
        assert_eq!(
            (i.name.as_deref(), i.subresource.as_deref(), i.verb),
            (Some("web-1"), Some("status"), Verb::Get)
        );

        let i = info(Method::GET, "/api/v1/namespaces/kube-system");
        assert_eq!(
            (i.resource.as_str(), i.name.as_deref(), i.namespace),
            ("namespaces", Some("kube-system"), None)
        );

        let i = info(Method::GET, "/apis/apps/v1/deployments");
        assert_eq!((i.group.as_str(), i.verb, i.namespace), ("apps", Verb::List, None));

        let i = info(Method::DELETE, "/apis/apps/v1/namespaces/x/deployments");
        assert_eq!(i.verb, Verb::DeleteCollection);

        let i = info(Method::GET, "/api/v1/watch/namespaces/x/pods");
        assert_eq!(i.verb, Verb::Watch);
        assert_eq!(parse(&Method::GET, "/apis", false).unwrap(), Some(Route::GroupsRoot));
        assert_eq!(parse(&Method::GET, "/healthz", false).unwrap(), None);
    }

    #[test]
    fn decodes_query() {
        let q = Query::parse(Some(
            "fieldSelector=involvedObject.name%3Dweb-1%2Cx%3Dy&limit=500&watch=1",
        ));
        assert_eq!(q.get("fieldSelector"), Some("involvedObject.name=web-1,x=y"));
        assert_eq!(q.int("limit").unwrap(), Some(500));
        assert!(q.flag("watch"));
        assert!(!q.flag("allowWatchBookmarks"));
    }
}
