//! The OpenAPI documents the apiserver serves, generated once at startup from the built-in
//! schemas ([`Schemas::builtin`]) and the registry's [`ResourceDesc`]s:
//! - `/openapi/v3`: the root listing one `serverRelativeURL` (with a content hash) per
//!   group-version, and the per group-version OpenAPI 3.0 documents (every verb of every
//!   resource and subresource, plus the component schemas reachable from them);
//! - `/openapi/v2`: one Swagger 2.0 document for everything, as JSON and as the gnostic
//!   protobuf kubectl 1.27/1.28 ask for ([`gnostic`]).
//!
//! Operations follow upstream's naming (`patchAppsV1NamespacedDeployment`), carry the
//! single-object `x-kubernetes-group-version-kind` and `x-kubernetes-action`, and the query
//! parameters kubectl probes for (`fieldValidation` on PATCH decides server-side validation).

mod custom;
pub mod gnostic;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::schema::{REF_PREFIX, Schemas};
use super::{ResourceDesc, SubresourceDesc};

pub use self::custom::{CustomResource, definition_name};

/// Content-Type of the gnostic protobuf OpenAPI v2 response. Clients ask with either media
/// type of [`V2_PROTOBUF_ACCEPT`] (kubectl 1.27 sends the `@` form), but Go's
/// `mime.ParseMediaType` rejects the `@` in a response, so upstream answers with this one.
pub const V2_PROTOBUF_CONTENT_TYPE: &str =
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// `Accept` media types that select the protobuf v2 document.
pub const V2_PROTOBUF_ACCEPT: &[&str] = &[
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
];
/// Version reported in `info.version`.
const INFO_VERSION: &str = "v1.33.0";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no schema for {group}/{version} {kind} (resource {resource})")]
    MissingSchema { group: String, version: String, kind: String, resource: String },
    #[error("serializing the OpenAPI document for {document}")]
    Serialize {
        document: String,
        #[source]
        source: serde_json::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One OpenAPI v3 group-version document and its content hash.
#[derive(Debug, Clone)]
pub struct GroupVersionDoc {
    /// Uppercase hex SHA-512 of `body`, as upstream puts in `?hash=`.
    pub hash: String,
    pub body: Bytes,
}

/// Every OpenAPI document, serialized once.
#[derive(Debug, Clone)]
pub struct OpenApiDocs {
    root: Bytes,
    group_versions: HashMap<String, GroupVersionDoc>,
    v2_json: Bytes,
    v2_protobuf: Bytes,
    v2_hash: String,
    /// The built-in documents, which [`OpenApiDocs::with_custom`] adds custom resources to.
    base: Arc<Base>,
}

/// What the built-in documents are made of, kept to build on.
#[derive(Debug)]
struct Base {
    group_versions: HashMap<String, GroupVersionDoc>,
    /// The v2 document as JSON (its `paths` and `definitions` are merged with the custom
    /// resources' when serialized, never copied).
    v2: Value,
    /// The v2 document as gnostic protobuf: a protobuf message followed by another one
    /// decodes as their merge, so the custom resources' paths and definitions are appended.
    v2_protobuf: Bytes,
}

impl OpenApiDocs {
    pub fn build(resources: &[ResourceDesc]) -> Result<OpenApiDocs> {
        let schemas = Schemas::builtin();
        let names = |g: &str, v: &str, k: &str| component_name(schemas, g, v, k);
        let lookup = |name: &str| schemas.component(name);
        let mut by_gv: BTreeMap<String, Vec<Operation>> = BTreeMap::new();
        for r in resources {
            let prefix = gv_path(r.group, r.version);
            let ops =
                by_gv.entry(prefix).or_insert_with(|| vec![api_resources_op(r.group, r.version)]);
            ops.extend(operations(&names, r, PATCH_TYPES)?);
        }

        let mut group_versions = HashMap::new();
        let mut all_ops = Vec::new();
        for (gv, ops) in by_gv {
            let doc = group_version_doc(&gv, &v3_document(&lookup, &ops))?;
            group_versions.insert(gv, doc);
            all_ops.extend(ops);
        }
        let root = v3_root(&group_versions)?;

        let (paths, roots) = v2_paths(&all_ops);
        let definitions: Map<String, Value> = reachable(&lookup, roots)
            .into_iter()
            .map(|(name, s)| {
                let converted = v2_schema(Some(&name), &s);
                (name, converted)
            })
            .collect();
        let v2 = v2_document(paths, definitions);
        let v2_json = serde_json::to_vec(&v2)
            .map_err(|source| Error::Serialize { document: "/openapi/v2".into(), source })?;
        let v2_hash = sha512_hex(&v2_json);
        let v2_protobuf = Bytes::from(gnostic::encode_document(&v2));
        let base = Arc::new(Base {
            group_versions: group_versions.clone(),
            v2,
            v2_protobuf: v2_protobuf.clone(),
        });
        Ok(OpenApiDocs {
            root,
            group_versions,
            v2_json: Bytes::from(v2_json),
            v2_protobuf,
            v2_hash,
            base,
        })
    }

    /// `GET /openapi/v3`.
    pub fn v3_root(&self) -> &Bytes {
        &self.root
    }

    /// `GET /openapi/v3/<path>` for `path` = "api/v1", "apis/apps/v1", ...
    pub fn v3_group_version(&self, path: &str) -> Option<&GroupVersionDoc> {
        self.group_versions.get(path.trim_matches('/'))
    }

    /// The group-version paths served ("api/v1", "apis/apps/v1", ...).
    pub fn v3_paths(&self) -> impl Iterator<Item = &str> {
        self.group_versions.keys().map(String::as_str)
    }

    /// `GET /openapi/v2` as JSON.
    pub fn v2_json(&self) -> &Bytes {
        &self.v2_json
    }

    /// `GET /openapi/v2` with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`.
    pub fn v2_protobuf(&self) -> &Bytes {
        &self.v2_protobuf
    }

    /// Uppercase hex SHA-512 of the v2 JSON document (an ETag for both encodings).
    pub fn v2_hash(&self) -> &str {
        &self.v2_hash
    }
}

fn sha512_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA512, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}

/// A group-version document, serialized, with its hash.
fn group_version_doc(gv: &str, doc: &Value) -> Result<GroupVersionDoc> {
    let body = serde_json::to_vec(doc)
        .map_err(|source| Error::Serialize { document: gv.to_string(), source })?;
    let hash = sha512_hex(&body);
    Ok(GroupVersionDoc { hash, body: Bytes::from(body) })
}

/// `/openapi/v3`: every group-version's URL with its content hash.
fn v3_root(group_versions: &HashMap<String, GroupVersionDoc>) -> Result<Bytes> {
    let paths: Map<String, Value> = group_versions
        .iter()
        .map(|(gv, doc)| {
            let url = format!("/openapi/v3/{gv}?hash={}", doc.hash);
            (gv.clone(), json!({ "serverRelativeURL": url }))
        })
        .collect();
    let root = serde_json::to_vec(&json!({ "paths": paths }))
        .map_err(|source| Error::Serialize { document: "/openapi/v3".into(), source })?;
    Ok(Bytes::from(root))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// "rbac.authorization.k8s.io" → "RbacAuthorization", "example.com" → "ExampleCom",
/// "" → "Core" (upstream's `ToValidOperationID`: what is not alphanumeric is dropped and
/// the letter after it capitalized).
fn group_camel(group: &str) -> String {
    if group.is_empty() {
        return "Core".into();
    }
    group
        .trim_end_matches(".k8s.io")
        .split(|c: char| !c.is_ascii_alphanumeric())
        .map(capitalize)
        .collect()
}

/// The tag upstream puts on operations: "apps_v1", "core_v1", "rbacAuthorization_v1".
fn tag(group: &str, version: &str) -> String {
    let camel = group_camel(group);
    let mut chars = camel.chars();
    let lower: String =
        chars.next().map(|c| c.to_ascii_lowercase()).into_iter().chain(chars).collect();
    format!("{lower}_{version}")
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map(|c| c.to_ascii_uppercase()).into_iter().chain(chars).collect()
}

/// What an operation sends and returns, independent of the OpenAPI version.
#[derive(Debug, Clone)]
struct Operation {
    path: String,
    method: &'static str,
    action: &'static str,
    operation_id: String,
    description: String,
    tag: String,
    gvk: Option<(String, String, String)>,
    /// Request body component (create/update/delete) or the Patch type (patch).
    body: Option<String>,
    /// Response component, or None for a plain string (logs, connect).
    response: Option<String>,
    query: &'static [&'static str],
    path_params: Vec<&'static str>,
    /// The request media types of a patch.
    patch_types: &'static [&'static str],
}

const LIST_QUERY: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];
const WRITE_QUERY: &[&str] = &["dryRun", "fieldManager", "fieldValidation"];
const PATCH_QUERY: &[&str] = &["dryRun", "fieldManager", "fieldValidation", "force"];
const DELETE_QUERY: &[&str] =
    &["dryRun", "gracePeriodSeconds", "orphanDependents", "propagationPolicy"];
const DELETE_COLLECTION_QUERY: &[&str] = &[
    "continue",
    "dryRun",
    "fieldSelector",
    "gracePeriodSeconds",
    "labelSelector",
    "limit",
    "orphanDependents",
    "propagationPolicy",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
];
const LOG_QUERY: &[&str] = &[
    "container",
    "follow",
    "insecureSkipTLSVerifyBackend",
    "limitBytes",
    "previous",
    "sinceSeconds",
    "tailLines",
    "timestamps",
];

fn query_param(name: &str) -> (&'static str, &'static str) {
    match name {
        "allowWatchBookmarks" => {
            ("boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\".")
        }
        "continue" => (
            "string",
            "The continue option should be set when retrieving more results from the server.",
        ),
        "fieldSelector" => (
            "string",
            "A selector to restrict the list of returned objects by their fields. Defaults to everything.",
        ),
        "labelSelector" => (
            "string",
            "A selector to restrict the list of returned objects by their labels. Defaults to everything.",
        ),
        "limit" => ("integer", "limit is a maximum number of responses to return for a list call."),
        "resourceVersion" => (
            "string",
            "resourceVersion sets a constraint on what resource versions a request may be served from.",
        ),
        "resourceVersionMatch" => (
            "string",
            "resourceVersionMatch determines how resourceVersion is applied to list calls.",
        ),
        "sendInitialEvents" => (
            "boolean",
            "`sendInitialEvents=true` may be set together with `watch=true`: the watch stream begins with synthetic events for the current state, then a bookmark.",
        ),
        "timeoutSeconds" => ("integer", "Timeout for the list/watch call."),
        "watch" => (
            "boolean",
            "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications. Specify resourceVersion.",
        ),
        "dryRun" => (
            "string",
            "When present, indicates that modifications should not be persisted. Valid values are: - All: all dry run stages will be processed",
        ),
        "fieldManager" => (
            "string",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        "fieldValidation" => (
            "string",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: - Ignore - Warn - Strict",
        ),
        "force" => (
            "boolean",
            "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.",
        ),
        "gracePeriodSeconds" => {
            ("integer", "The duration in seconds before the object should be deleted.")
        }
        "orphanDependents" => ("boolean", "Deprecated: please use the PropagationPolicy."),
        "propagationPolicy" => (
            "string",
            "Whether and how garbage collection will be performed: 'Orphan', 'Background' or 'Foreground'.",
        ),
        "container" => (
            "string",
            "The container for which to stream logs. Defaults to only container if there is one container in the pod.",
        ),
        "follow" => ("boolean", "Follow the log stream of the pod. Defaults to false."),
        "insecureSkipTLSVerifyBackend" => (
            "boolean",
            "insecureSkipTLSVerifyBackend indicates that the apiserver should not confirm the validity of the serving certificate of the backend it is connecting to.",
        ),
        "limitBytes" => (
            "integer",
            "If set, the number of bytes to read from the server before terminating the log output.",
        ),
        "previous" => ("boolean", "Return previous terminated container logs. Defaults to false."),
        "sinceSeconds" => (
            "integer",
            "A relative time in seconds before the current time from which to show logs.",
        ),
        "tailLines" => ("integer", "If set, the number of lines from the end of the logs to show."),
        "timestamps" => (
            "boolean",
            "If true, add an RFC3339 timestamp at the beginning of every line of log output. Defaults to false.",
        ),
        _ => ("string", ""),
    }
}

fn path_param(name: &str) -> &'static str {
    match name {
        "namespace" => "object name and auth scope, such as for teams and projects",
        "name" => "name of the resource",
        _ => "",
    }
}

const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
const API_RESOURCE_LIST: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList";

fn api_resources_op(group: &str, version: &str) -> Operation {
    Operation {
        path: format!("/{}/", gv_path(group, version)),
        method: "get",
        action: "",
        operation_id: format!("get{}{}APIResources", group_camel(group), capitalize(version)),
        description: "get available resources".into(),
        tag: tag(group, version),
        gvk: None,
        body: None,
        response: Some(API_RESOURCE_LIST.into()),
        query: &[],
        path_params: vec![],
        patch_types: PATCH_TYPES,
    }
}

/// The component name of a (group, version, kind).
type Names<'a> = dyn Fn(&str, &str, &str) -> Option<String> + 'a;
/// A component schema by name.
type Lookup<'a> = dyn Fn(&str) -> Option<&'a Value> + 'a;

fn component_name(schemas: &Schemas, group: &str, version: &str, kind: &str) -> Option<String> {
    schemas.component_name_for_kind(group, version, kind).map(str::to_string)
}

/// Every operation of one resource and its subresources, their bodies and responses named
/// by `names`; patches accept `patch_types`.
fn operations(
    names: &Names<'_>,
    r: &ResourceDesc,
    patch_types: &'static [&'static str],
) -> Result<Vec<Operation>> {
    let missing = |kind: &str| Error::MissingSchema {
        group: r.group.into(),
        version: r.version.into(),
        kind: kind.into(),
        resource: r.plural.into(),
    };
    let kind_schema = names(r.group, r.version, r.kind).ok_or_else(|| missing(r.kind))?;
    let list_kind = format!("{}List", r.kind);
    let list_schema = names(r.group, r.version, &list_kind);
    let base = format!("/{}", gv_path(r.group, r.version));
    let gc = group_camel(r.group);
    let v = capitalize(r.version);
    let ns = if r.namespaced { "Namespaced" } else { "" };
    let collection = if r.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("{base}/{}", r.plural)
    };
    let item = format!("{collection}/{{name}}");
    let ns_params: Vec<&'static str> = if r.namespaced { vec!["namespace"] } else { vec![] };
    let item_params: Vec<&'static str> = ns_params.iter().copied().chain(["name"]).collect();
    let gvk = Some((r.group.to_string(), r.version.to_string(), r.kind.to_string()));
    let tag = tag(r.group, r.version);
    let op = |path: &str,
              method,
              action,
              id: String,
              description: String,
              body: Option<String>,
              response: Option<String>,
              query,
              params: &Vec<&'static str>| Operation {
        path: path.to_string(),
        method,
        action,
        operation_id: id,
        description,
        tag: tag.clone(),
        gvk: gvk.clone(),
        body,
        response,
        query,
        path_params: params.clone(),
        patch_types,
    };
    let k = r.kind;
    let has = |verb: &str| r.verbs.contains(&verb);
    let mut ops = Vec::new();
    if has("list") {
        let list_schema = list_schema.clone().ok_or_else(|| missing(&list_kind))?;
        ops.push(op(
            &collection,
            "get",
            "list",
            format!("list{gc}{v}{ns}{k}"),
            format!("list or watch objects of kind {k}"),
            None,
            Some(list_schema.clone()),
            LIST_QUERY,
            &ns_params,
        ));
        if r.namespaced {
            ops.push(op(
                &format!("{base}/{}", r.plural),
                "get",
                "list",
                format!("list{gc}{v}{k}ForAllNamespaces"),
                format!("list or watch objects of kind {k}"),
                None,
                Some(list_schema),
                LIST_QUERY,
                &vec![],
            ));
        }
    }
    if has("create") {
        ops.push(op(
            &collection,
            "post",
            "post",
            format!("create{gc}{v}{ns}{k}"),
            format!("create a {k}"),
            Some(kind_schema.clone()),
            Some(kind_schema.clone()),
            WRITE_QUERY,
            &ns_params,
        ));
    }
    if has("deletecollection") {
        ops.push(op(
            &collection,
            "delete",
            "deletecollection",
            format!("delete{gc}{v}Collection{ns}{k}"),
            format!("delete collection of {k}"),
            Some(DELETE_OPTIONS.into()),
            Some(STATUS.into()),
            DELETE_COLLECTION_QUERY,
            &ns_params,
        ));
    }
    if has("get") {
        ops.push(op(
            &item,
            "get",
            "get",
            format!("read{gc}{v}{ns}{k}"),
            format!("read the specified {k}"),
            None,
            Some(kind_schema.clone()),
            &[],
            &item_params,
        ));
    }
    if has("update") {
        ops.push(op(
            &item,
            "put",
            "put",
            format!("replace{gc}{v}{ns}{k}"),
            format!("replace the specified {k}"),
            Some(kind_schema.clone()),
            Some(kind_schema.clone()),
            WRITE_QUERY,
            &item_params,
        ));
    }
    if has("patch") {
        ops.push(op(
            &item,
            "patch",
            "patch",
            format!("patch{gc}{v}{ns}{k}"),
            format!("partially update the specified {k}"),
            Some(PATCH.into()),
            Some(kind_schema.clone()),
            PATCH_QUERY,
            &item_params,
        ));
    }
    if has("delete") {
        ops.push(op(
            &item,
            "delete",
            "delete",
            format!("delete{gc}{v}{ns}{k}"),
            format!("delete a {k}"),
            Some(DELETE_OPTIONS.into()),
            Some(STATUS.into()),
            DELETE_QUERY,
            &item_params,
        ));
    }
    if has("watch") {
        let watch_base = format!("{base}/watch");
        let watch_collection = if r.namespaced {
            format!("{watch_base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{watch_base}/{}", r.plural)
        };
        ops.push(op(&watch_collection, "get", "watchlist", format!("watch{gc}{v}{ns}{k}List"), format!("watch individual changes to a list of {k}. deprecated: use the 'watch' parameter with a list operation instead."), None, Some(WATCH_EVENT.into()), LIST_QUERY, &ns_params));
        ops.push(op(&format!("{watch_collection}/{{name}}"), "get", "watch", format!("watch{gc}{v}{ns}{k}"), format!("watch changes to an object of kind {k}. deprecated: use the 'watch' parameter with a list operation instead, filtered to a single item with the 'fieldSelector' parameter."), None, Some(WATCH_EVENT.into()), LIST_QUERY, &item_params));
        if r.namespaced {
            ops.push(op(&format!("{watch_base}/{}", r.plural), "get", "watchlist", format!("watch{gc}{v}{k}ListForAllNamespaces"), format!("watch individual changes to a list of {k}. deprecated: use the 'watch' parameter with a list operation instead."), None, Some(WATCH_EVENT.into()), LIST_QUERY, &vec![]));
        }
    }
    for sub in r.subresources {
        ops.extend(subresource_operations(names, r, sub, &item, &item_params, &tag, patch_types)?);
    }
    Ok(ops)
}

/// Subresources whose body is the parent kind when their description names no kind.
const PARENT_KIND_SUBRESOURCES: &[&str] = &["status", "approval", "finalize"];

fn subresource_operations(
    names: &Names<'_>,
    r: &ResourceDesc,
    sub: &SubresourceDesc,
    item: &str,
    item_params: &[&'static str],
    tag: &str,
    patch_types: &'static [&'static str],
) -> Result<Vec<Operation>> {
    let path = format!("{item}/{}", sub.name);
    let gc = group_camel(r.group);
    let v = capitalize(r.version);
    let ns = if r.namespaced { "Namespaced" } else { "" };
    let k = r.kind;
    let s = capitalize(sub.name);
    let mut ops = Vec::new();
    let (sub_group, sub_version, sub_kind) =
        if sub.kind.is_empty() && PARENT_KIND_SUBRESOURCES.contains(&sub.name) {
            (r.group, r.version, r.kind)
        } else {
            (sub.group, sub.version, sub.kind)
        };
    if sub_kind.is_empty() {
        // Streaming subresources: logs are read, exec/attach/portforward are "connect".
        for verb in sub.verbs {
            let (method, prefix, action) = match (sub.name, *verb) {
                ("log", "get") => ("get", "read", "get"),
                (_, "get") => ("get", "connectGet", "connect"),
                (_, "create") => ("post", "connectPost", "connect"),
                _ => continue,
            };
            ops.push(Operation {
                path: path.clone(),
                method,
                action,
                operation_id: format!("{prefix}{gc}{v}{ns}{k}{s}"),
                description: format!(
                    "{} {} of {k}",
                    if action == "get" { "read" } else { "connect" },
                    sub.name
                ),
                tag: tag.into(),
                gvk: None,
                body: None,
                response: None,
                query: if sub.name == "log" { LOG_QUERY } else { &[] },
                path_params: item_params.to_vec(),
                patch_types,
            });
        }
        return Ok(ops);
    }
    let schema = names(sub_group, sub_version, sub_kind).ok_or_else(|| Error::MissingSchema {
        group: sub_group.into(),
        version: sub_version.into(),
        kind: sub_kind.into(),
        resource: format!("{}/{}", r.plural, sub.name),
    })?;
    let gvk = Some((sub_group.to_string(), sub_version.to_string(), sub_kind.to_string()));
    for verb in sub.verbs {
        let (method, action, id, description, body, query): (
            _,
            _,
            _,
            _,
            _,
            &'static [&'static str],
        ) = match *verb {
            "get" => (
                "get",
                "get",
                format!("read{gc}{v}{ns}{k}{s}"),
                format!("read {} of the specified {k}", sub.name),
                None,
                &[],
            ),
            "update" => (
                "put",
                "put",
                format!("replace{gc}{v}{ns}{k}{s}"),
                format!("replace {} of the specified {k}", sub.name),
                Some(schema.clone()),
                WRITE_QUERY,
            ),
            "patch" => (
                "patch",
                "patch",
                format!("patch{gc}{v}{ns}{k}{s}"),
                format!("partially update {} of the specified {k}", sub.name),
                Some(PATCH.to_string()),
                PATCH_QUERY,
            ),
            "create" => (
                "post",
                "post",
                format!("create{gc}{v}{ns}{k}{s}"),
                format!("create {} of a {k}", sub.name),
                Some(schema.clone()),
                WRITE_QUERY,
            ),
            _ => continue,
        };
        ops.push(Operation {
            path: path.clone(),
            method,
            action,
            operation_id: id,
            description,
            tag: tag.into(),
            gvk: gvk.clone(),
            body,
            response: Some(schema.clone()),
            query,
            path_params: item_params.to_vec(),
            patch_types,
        });
    }
    Ok(ops)
}

const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

fn responses_for(op: &Operation) -> Vec<(&'static str, &'static str)> {
    match op.action {
        "post" => vec![("200", "OK"), ("201", "Created"), ("202", "Accepted")],
        "put" | "patch" => vec![("200", "OK"), ("201", "Created")],
        "delete" => vec![("200", "OK"), ("202", "Accepted")],
        _ => vec![("200", "OK")],
    }
}

fn gvk_value(gvk: &(String, String, String)) -> Value {
    json!({"group": gvk.0, "kind": gvk.2, "version": gvk.1})
}

fn v3_document(lookup: &Lookup<'_>, ops: &[Operation]) -> Value {
    let mut paths: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut roots = BTreeSet::new();
    for op in ops {
        let schema_ref = |name: &str| json!({"$ref": format!("{REF_PREFIX}{name}")});
        let mut o = Map::new();
        o.insert("description".into(), json!(op.description));
        o.insert("operationId".into(), json!(op.operation_id));
        let params: Vec<Value> = op
            .query
            .iter()
            .map(|q| {
                let (ty, description) = query_param(q);
                json!({"description": description, "in": "query", "name": q, "schema": {"type": ty, "uniqueItems": true}})
            })
            .collect();
        if !params.is_empty() {
            o.insert("parameters".into(), Value::Array(params));
        }
        if let Some(body) = &op.body {
            roots.insert(body.clone());
            let content: Map<String, Value> = if op.action == "patch" {
                op.patch_types
                    .iter()
                    .map(|t| (t.to_string(), json!({"schema": schema_ref(body)})))
                    .collect()
            } else {
                [("*/*".to_string(), json!({"schema": schema_ref(body)}))].into_iter().collect()
            };
            o.insert("requestBody".into(), json!({"content": content, "required": op.action != "delete" && op.action != "deletecollection"}));
        }
        let response_content = match &op.response {
            Some(name) => {
                roots.insert(name.clone());
                let mut c = Map::new();
                c.insert("application/json".into(), json!({"schema": schema_ref(name)}));
                if op.response.as_deref() == Some(WATCH_EVENT) || op.action == "list" {
                    c.insert(
                        "application/json;stream=watch".into(),
                        json!({"schema": schema_ref(name)}),
                    );
                }
                c
            }
            None => {
                [("*/*".to_string(), json!({"schema": {"type": "string"}}))].into_iter().collect()
            }
        };
        let mut responses: Map<String, Value> = responses_for(op)
            .into_iter()
            .map(|(code, d)| {
                (code.to_string(), json!({"content": response_content, "description": d}))
            })
            .collect();
        responses.insert("401".into(), json!({"description": "Unauthorized"}));
        o.insert("responses".into(), Value::Object(responses));
        o.insert("tags".into(), json!([op.tag]));
        if !op.action.is_empty() {
            o.insert("x-kubernetes-action".into(), json!(op.action));
        }
        if let Some(gvk) = &op.gvk {
            o.insert("x-kubernetes-group-version-kind".into(), gvk_value(gvk));
        }
        let item = paths.entry(op.path.clone()).or_default();
        item.insert(op.method.into(), Value::Object(o));
        let path_params: Vec<Value> = op
            .path_params
            .iter()
            .map(|p| json!({"description": path_param(p), "in": "path", "name": p, "required": true, "schema": {"type": "string", "uniqueItems": true}}))
            .chain(std::iter::once(json!({"description": "If 'true', then the output is pretty printed.", "in": "query", "name": "pretty", "schema": {"type": "string", "uniqueItems": true}})))
            .collect();
        item.insert("parameters".into(), Value::Array(path_params));
    }
    let components = reachable(lookup, roots);
    json!({
        "components": {
            "schemas": components,
            "securitySchemes": {"BearerToken": {"description": "Bearer Token authentication", "in": "header", "name": "authorization", "type": "apiKey"}}
        },
        "info": {"title": "Kubernetes", "version": INFO_VERSION},
        "openapi": "3.0.0",
        "paths": paths,
        "security": [{"BearerToken": []}]
    })
}

/// The components named in `roots` and every component they reference, transitively.
fn reachable(lookup: &Lookup<'_>, roots: BTreeSet<String>) -> Map<String, Value> {
    let mut out = Map::new();
    let mut stack: Vec<String> = roots.into_iter().collect();
    while let Some(name) = stack.pop() {
        if out.contains_key(&name) {
            continue;
        }
        let Some(schema) = lookup(&name) else { continue };
        collect_refs(schema, &mut stack);
        out.insert(name, schema.clone());
    }
    out
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, child) in o {
                if k == "$ref" {
                    if let Some(name) = child.as_str().and_then(|r| r.strip_prefix(REF_PREFIX)) {
                        out.push(name.to_string());
                    }
                } else {
                    collect_refs(child, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| collect_refs(c, out)),
        _ => {}
    }
}

const V2_REF_PREFIX: &str = "#/definitions/";

/// A v3 component schema in Swagger 2.0 form: `#/definitions/` refs, `$ref` with siblings
/// instead of `allOf`, no `default`s and no `oneOf` (IntOrString and Quantity become
/// strings, as upstream's v2 spells them).
fn v2_schema(name: Option<&str>, v: &Value) -> Value {
    match name {
        Some("io.k8s.apimachinery.pkg.util.intstr.IntOrString") => {
            return json!({"description": v.get("description").cloned().unwrap_or_default(), "format": "int-or-string", "type": "string"});
        }
        Some("io.k8s.apimachinery.pkg.api.resource.Quantity") => {
            return json!({"description": v.get("description").cloned().unwrap_or_default(), "type": "string"});
        }
        _ => {}
    }
    match v {
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, child) in o {
                match k.as_str() {
                    "default" => {}
                    "$ref" => {
                        let r =
                            child.as_str().unwrap_or_default().replace(REF_PREFIX, V2_REF_PREFIX);
                        out.insert(k.clone(), Value::String(r));
                    }
                    "allOf" => match child.as_array().map(Vec::as_slice) {
                        Some([one]) if one.get("$ref").is_some() => {
                            let r = one["$ref"]
                                .as_str()
                                .unwrap_or_default()
                                .replace(REF_PREFIX, V2_REF_PREFIX);
                            out.insert("$ref".into(), Value::String(r));
                        }
                        _ => {
                            out.insert(k.clone(), v2_schema(None, child));
                        }
                    },
                    "properties" => {
                        let props: Map<String, Value> = child
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(p, s)| (p.clone(), v2_schema(None, s)))
                            .collect();
                        out.insert(k.clone(), Value::Object(props));
                    }
                    "items" | "additionalProperties" => {
                        out.insert(k.clone(), v2_schema(None, child));
                    }
                    _ => {
                        out.insert(k.clone(), child.clone());
                    }
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The Swagger 2.0 paths of `ops`, and the components they name.
fn v2_paths(ops: &[Operation]) -> (Map<String, Value>, BTreeSet<String>) {
    let mut paths: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    let mut roots = BTreeSet::new();
    for op in ops {
        let schema_ref = |name: &str| json!({"$ref": format!("{V2_REF_PREFIX}{name}")});
        let mut params: Vec<Value> = Vec::new();
        if let Some(body) = &op.body {
            roots.insert(body.clone());
            params.push(json!({"in": "body", "name": "body", "required": op.action != "delete" && op.action != "deletecollection", "schema": schema_ref(body)}));
        }
        for q in op.query {
            let (ty, description) = query_param(q);
            params.push(json!({"description": description, "in": "query", "name": q, "type": ty, "uniqueItems": true}));
        }
        let schema = match &op.response {
            Some(name) => {
                roots.insert(name.clone());
                schema_ref(name)
            }
            None => json!({"type": "string"}),
        };
        let mut responses: Map<String, Value> = responses_for(op)
            .into_iter()
            .map(|(code, d)| (code.to_string(), json!({"description": d, "schema": schema})))
            .collect();
        responses.insert("401".into(), json!({"description": "Unauthorized"}));
        let consumes: Vec<&str> =
            if op.action == "patch" { op.patch_types.to_vec() } else { vec!["*/*"] };
        let produces: Vec<&str> = if op.response.is_none() {
            vec!["*/*"]
        } else if op.action == "list" || op.action.starts_with("watch") {
            vec!["application/json", "application/json;stream=watch"]
        } else {
            vec!["application/json"]
        };
        let mut o = Map::new();
        o.insert("consumes".into(), json!(consumes));
        o.insert("description".into(), json!(op.description));
        o.insert("operationId".into(), json!(op.operation_id));
        if !params.is_empty() {
            o.insert("parameters".into(), Value::Array(params));
        }
        o.insert("produces".into(), json!(produces));
        o.insert("responses".into(), Value::Object(responses));
        o.insert("schemes".into(), json!(["https"]));
        o.insert("tags".into(), json!([op.tag]));
        if !op.action.is_empty() {
            o.insert("x-kubernetes-action".into(), json!(op.action));
        }
        if let Some(gvk) = &op.gvk {
            o.insert("x-kubernetes-group-version-kind".into(), gvk_value(gvk));
        }
        let item = paths.entry(op.path.clone()).or_default();
        item.insert(op.method.into(), Value::Object(o));
        let path_params: Vec<Value> = op
            .path_params
            .iter()
            .map(|p| json!({"description": path_param(p), "in": "path", "name": p, "required": true, "type": "string", "uniqueItems": true}))
            .chain(std::iter::once(json!({"description": "If 'true', then the output is pretty printed.", "in": "query", "name": "pretty", "type": "string", "uniqueItems": true})))
            .collect();
        item.insert("parameters".into(), Value::Array(path_params));
    }
    let paths = paths.into_iter().map(|(p, item)| (p, Value::Object(item))).collect();
    (paths, roots)
}

fn v2_document(paths: Map<String, Value>, definitions: Map<String, Value>) -> Value {
    json!({
        "definitions": definitions,
        "info": {"title": "Kubernetes", "version": INFO_VERSION},
        "paths": paths,
        "security": [{"BearerToken": []}],
        "securityDefinitions": {"BearerToken": {"description": "Bearer Token authentication", "in": "header", "name": "authorization", "type": "apiKey"}},
        "swagger": "2.0"
    })
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    const RW: &[&str] =
        &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
    const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

    fn resources() -> Vec<ResourceDesc> {
        let r = |group, kind, plural, singular, namespaced, subresources| ResourceDesc {
            group,
            version: "v1",
            kind,
            plural,
            singular,
            namespaced,
            verbs: RW,
            short_names: &[],
            categories: &[],
            subresources,
        };
        vec![
            r("", "Namespace", "namespaces", "namespace", false, &[]),
            r(
                "",
                "Pod",
                "pods",
                "pod",
                true,
                &[
                    SubresourceDesc {
                        name: "status",
                        kind: "Pod",
                        group: "",
                        version: "v1",
                        verbs: STATUS_VERBS,
                    },
                    SubresourceDesc {
                        name: "binding",
                        kind: "Binding",
                        group: "",
                        version: "v1",
                        verbs: &["create"],
                    },
                    SubresourceDesc {
                        name: "log",
                        kind: "",
                        group: "",
                        version: "v1",
                        verbs: &["get"],
                    },
                ],
            ),
            r("", "Service", "services", "service", true, &[]),
            r("", "ConfigMap", "configmaps", "configmap", true, &[]),
            r(
                "apps",
                "Deployment",
                "deployments",
                "deployment",
                true,
                &[
                    SubresourceDesc {
                        name: "status",
                        kind: "Deployment",
                        group: "apps",
                        version: "v1",
                        verbs: STATUS_VERBS,
                    },
                    SubresourceDesc {
                        name: "scale",
                        kind: "Scale",
                        group: "autoscaling",
                        version: "v1",
                        verbs: STATUS_VERBS,
                    },
                ],
            ),
            r("batch", "Job", "jobs", "job", true, &[]),
            r(
                "rbac.authorization.k8s.io",
                "ClusterRole",
                "clusterroles",
                "clusterrole",
                false,
                &[],
            ),
        ]
    }

    fn docs() -> OpenApiDocs {
        OpenApiDocs::build(&resources()).expect("build OpenAPI documents")
    }

    fn gv(docs: &OpenApiDocs, path: &str) -> Value {
        serde_json::from_slice(&docs.v3_group_version(path).expect(path).body).unwrap()
    }

    #[test]
    fn root_lists_group_versions_with_hashes() {
        let docs = docs();
        let root: Value = serde_json::from_slice(docs.v3_root()).unwrap();
        let apps = docs.v3_group_version("apis/apps/v1").unwrap();
        assert_eq!(apps.hash.len(), 128);
        assert!(apps.hash.chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
        assert_eq!(
            root["paths"]["apis/apps/v1"]["serverRelativeURL"],
            format!("/openapi/v3/apis/apps/v1?hash={}", apps.hash)
        );
        for p in ["api/v1", "apis/batch/v1", "apis/rbac.authorization.k8s.io/v1"] {
            assert!(root["paths"][p]["serverRelativeURL"].is_string(), "{p} missing from root");
        }
        // Stable: a second build yields the same bytes and hashes.
        let again = OpenApiDocs::build(&resources()).unwrap();
        assert_eq!(again.v3_group_version("apis/apps/v1").unwrap().hash, apps.hash);
        assert_eq!(again.v2_protobuf(), docs.v2_protobuf());
    }

    #[test]
    fn v3_patch_operation_is_what_kubectl_probes() {
        let doc = gv(&docs(), "apis/apps/v1");
        assert_eq!(doc["openapi"], "3.0.0");
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(patch["operationId"], "patchAppsV1NamespacedDeployment");
        assert_eq!(patch["x-kubernetes-action"], "patch");
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "kind": "Deployment", "version": "v1"})
        );
        let names: Vec<&str> = patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["dryRun", "fieldManager", "fieldValidation", "force"]);
        for t in PATCH_TYPES {
            assert!(patch["requestBody"]["content"][t].is_object(), "{t} missing");
        }
        let scale =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"]["patch"];
        assert_eq!(scale["x-kubernetes-group-version-kind"]["kind"], "Scale");
        assert_eq!(scale["operationId"], "patchAppsV1NamespacedDeploymentScale");
        assert!(doc["paths"]["/apis/apps/v1/deployments"]["get"].is_object());
        assert!(
            doc["paths"]["/apis/apps/v1/watch/namespaces/{namespace}/deployments/{name}"]["get"]
                .is_object()
        );
        let schemas = &doc["components"]["schemas"];
        let d = &schemas["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            d["x-kubernetes-group-version-kind"],
            json!([{"group": "apps", "kind": "Deployment", "version": "v1"}])
        );
        assert!(schemas["io.k8s.api.autoscaling.v1.Scale"].is_object());
        assert!(
            schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]["x-kubernetes-patch-merge-key"]
                == "name"
        );
        // Core: cluster-scoped namespaces and pod subresources.
        let core = gv(&docs(), "api/v1");
        assert_eq!(
            core["paths"]["/api/v1/namespaces/{name}"]["patch"]["operationId"],
            "patchCoreV1Namespace"
        );
        assert_eq!(
            core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}/binding"]["post"]["x-kubernetes-group-version-kind"]
                ["kind"],
            "Binding"
        );
        assert_eq!(
            core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}/log"]["get"]["operationId"],
            "readCoreV1NamespacedPodLog"
        );
        let rbac = gv(&docs(), "apis/rbac.authorization.k8s.io/v1");
        assert!(
            rbac["paths"]["/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}"]["patch"]["tags"]
                == json!(["rbacAuthorization_v1"])
        );
    }

    fn assert_refs_resolve(v: &Value, defs: &Value, prefix: &str) {
        let mut refs = Vec::new();
        collect_refs_with(v, prefix, &mut refs);
        for r in refs {
            assert!(defs[&r].is_object(), "dangling reference {r}");
        }
    }

    fn collect_refs_with(v: &Value, prefix: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                for (k, c) in o {
                    if k == "$ref" {
                        out.push(
                            c.as_str()
                                .unwrap()
                                .strip_prefix(prefix)
                                .unwrap_or_else(|| panic!("bad ref {c}"))
                                .to_string(),
                        );
                    } else {
                        collect_refs_with(c, prefix, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|c| collect_refs_with(c, prefix, out)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves_inside_its_document() {
        let docs = docs();
        for path in docs.v3_paths().map(str::to_string).collect::<Vec<_>>() {
            let doc = gv(&docs, &path);
            assert_refs_resolve(&doc, &doc["components"]["schemas"], REF_PREFIX);
        }
        let v2: Value = serde_json::from_slice(docs.v2_json()).unwrap();
        assert_eq!(v2["swagger"], "2.0");
        assert_refs_resolve(&v2, &v2["definitions"], V2_REF_PREFIX);
        let text = String::from_utf8(docs.v2_json().to_vec()).unwrap();
        assert!(
            !text.contains("allOf") && !text.contains("oneOf") && !text.contains("#/components")
        );
        assert_eq!(
            v2["definitions"]["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["format"],
            "int-or-string"
        );
    }

    #[test]
    fn v2_protobuf_decodes_back_with_vendor_extensions() {
        let docs = docs();
        let decoded = gnostic::Document::decode(docs.v2_protobuf().as_ref()).unwrap();
        let v2: Value = serde_json::from_slice(docs.v2_json()).unwrap();
        assert_eq!(decoded, gnostic::document(&v2));
        assert_eq!(decoded.swagger, "2.0");
        let defs = &decoded.definitions.as_ref().unwrap().additional_properties;
        let deployment = defs
            .iter()
            .find(|d| d.name == "io.k8s.api.apps.v1.Deployment")
            .unwrap()
            .value
            .as_ref()
            .unwrap();
        let gvk = deployment
            .vendor_extension
            .iter()
            .find(|e| e.name == "x-kubernetes-group-version-kind")
            .unwrap();
        let yaml: Value = serde_saphyr::from_str(&gvk.value.as_ref().unwrap().yaml).unwrap();
        assert_eq!(yaml, json!([{"group": "apps", "kind": "Deployment", "version": "v1"}]));
        let pod_spec = defs
            .iter()
            .find(|d| d.name == "io.k8s.api.core.v1.PodSpec")
            .unwrap()
            .value
            .as_ref()
            .unwrap();
        let containers = pod_spec
            .properties
            .as_ref()
            .unwrap()
            .additional_properties
            .iter()
            .find(|p| p.name == "containers")
            .unwrap();
        let ext: Vec<(&str, &str)> = containers
            .value
            .as_ref()
            .unwrap()
            .vendor_extension
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_ref().unwrap().yaml.trim()))
            .collect();
        assert!(ext.contains(&("x-kubernetes-patch-merge-key", "name")), "{ext:?}");
        assert!(ext.contains(&("x-kubernetes-patch-strategy", "merge")), "{ext:?}");
        // kubectl's QueryParamVerifier: PATCH of the GVK has a fieldValidation query parameter.
        let paths = &decoded.paths.as_ref().unwrap().path;
        let item = paths
            .iter()
            .find(|p| p.name == "/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
            .unwrap();
        let patch = item.value.as_ref().unwrap().patch.as_ref().unwrap();
        let has_field_validation = patch.parameters.iter().any(|p| {
            matches!(&p.oneof, Some(gnostic::parameters_item::Oneof::Parameter(gnostic::Parameter {
                oneof: Some(gnostic::parameter::Oneof::NonBodyParameter(gnostic::NonBodyParameter {
                    oneof: Some(gnostic::non_body_parameter::Oneof::QueryParameterSubSchema(q)),
                })),
            })) if q.name == "fieldValidation")
        });
        assert!(has_field_validation);
    }

    #[test]
    fn protoc_decodes_the_v2_protobuf() {
        let docs = docs();
        let mut child = std::process::Command::new("protoc")
            .arg("--decode_raw")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("protoc (Debian protobuf-compiler) must be installed");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(docs.v2_protobuf()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "protoc --decode_raw failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("1: \"2.0\""), "{}", &text[..200.min(text.len())]);
        assert!(text.contains("x-kubernetes-group-version-kind"));
    }

    #[test]
    fn document_sizes() {
        let docs = docs();
        let mut sizes: Vec<String> = docs
            .v3_paths()
            .map(|p| format!("{p}: {} bytes", docs.v3_group_version(p).unwrap().body.len()))
            .collect();
        sizes.sort();
        println!("v3 root: {} bytes; {}", docs.v3_root().len(), sizes.join(", "));
        println!(
            "v2 json: {} bytes, v2 protobuf: {} bytes",
            docs.v2_json().len(),
            docs.v2_protobuf().len()
        );
        assert!(docs.v2_protobuf().len() > 100_000);
        let (w, schema) = (widget(), widget_schema());
        let started = std::time::Instant::now();
        let custom = docs.with_custom(&[CustomResource { desc: &w, schema: Some(&schema) }]);
        println!("with_custom (one CRD): {:?}", started.elapsed());
        let started = std::time::Instant::now();
        let _ = OpenApiDocs::build(&resources());
        println!("build (built-ins): {:?}", started.elapsed());
        assert!(custom.unwrap().v2_protobuf().len() > docs.v2_protobuf().len());
    }

    // Custom resources (CRDs).

    const CUSTOM_STATUS: SubresourceDesc =
        SubresourceDesc { name: "status", kind: "", group: "", version: "", verbs: STATUS_VERBS };
    const CUSTOM_SCALE: SubresourceDesc = SubresourceDesc {
        name: "scale",
        kind: "Scale",
        group: "autoscaling",
        version: "v1",
        verbs: STATUS_VERBS,
    };

    fn widget() -> ResourceDesc {
        ResourceDesc {
            group: "example.com",
            version: "v1",
            kind: "Widget",
            plural: "widgets",
            singular: "widget",
            namespaced: true,
            verbs: RW,
            short_names: &[],
            categories: &[],
            subresources: &[CUSTOM_STATUS, CUSTOM_SCALE],
        }
    }

    fn gadget() -> ResourceDesc {
        ResourceDesc {
            group: "stable.example.com",
            version: "v1beta1",
            kind: "Gadget",
            plural: "gadgets",
            singular: "gadget",
            namespaced: false,
            verbs: RW,
            short_names: &[],
            categories: &[],
            subresources: &[],
        }
    }

    fn widget_schema() -> Value {
        json!({
            "type": "object",
            "description": "A widget.",
            "properties": {
                "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}},
                "spec": {
                    "type": "object",
                    "description": "What the widget should be.",
                    "required": ["size", "note"],
                    "example": {"size": 1},
                    "properties": {
                        "size": {"type": "integer", "description": "How big the widget is.", "default": 1, "minimum": 0},
                        "port": {"x-kubernetes-int-or-string": true, "description": "A port."},
                        "note": {"type": "string", "nullable": true, "description": "A note."},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                  "properties": {"known": {"type": "string"}}},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                     "properties": {"spec": {"type": "object", "properties": {"x": {"type": "string"}}}}},
                        "shape": {"type": "string", "anyOf": [{"enum": ["round"]}, {"enum": ["square"]}]},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"}
                    }
                },
                "status": {"type": "object", "properties": {"ready": {"type": "boolean", "description": "Whether it is ready."}}}
            }
        })
    }

    fn custom_docs() -> (OpenApiDocs, OpenApiDocs) {
        let base = docs();
        let (w, g) = (widget(), gadget());
        let schema = widget_schema();
        let gadget_schema = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        let custom = base
            .with_custom(&[
                CustomResource { desc: &w, schema: Some(&schema) },
                CustomResource { desc: &g, schema: Some(&gadget_schema) },
            ])
            .expect("custom documents");
        (base, custom)
    }

    #[test]
    fn custom_kinds_are_named_like_upstream() {
        assert_eq!(definition_name("example.com", "v1", "Widget"), "com.example.v1.Widget");
        assert_eq!(
            definition_name("stable.example.com", "v1beta1", "GadgetList"),
            "com.example.stable.v1beta1.GadgetList"
        );
        assert_eq!(group_camel("my-group.example.com"), "MyGroupExampleCom");
        assert_eq!(tag("stable.example.com", "v1beta1"), "stableExampleCom_v1beta1");
    }

    #[test]
    fn custom_group_versions_join_the_v3_root() {
        let (base, custom) = custom_docs();
        let root: Value = serde_json::from_slice(custom.v3_root()).unwrap();
        for gv in ["apis/example.com/v1", "apis/stable.example.com/v1beta1"] {
            let doc = custom.v3_group_version(gv).expect(gv);
            assert_eq!(
                root["paths"][gv]["serverRelativeURL"],
                format!("/openapi/v3/{gv}?hash={}", doc.hash)
            );
            assert!(base.v3_group_version(gv).is_none());
        }
        // The built-in group-versions are the very same documents.
        let apps = custom.v3_group_version("apis/apps/v1").unwrap();
        assert_eq!(apps.hash, base.v3_group_version("apis/apps/v1").unwrap().hash);
        assert_eq!(
            root["paths"]["api/v1"],
            json!({"serverRelativeURL": format!("/openapi/v3/api/v1?hash={}", base.v3_group_version("api/v1").unwrap().hash)})
        );
        assert_eq!(custom.v3_paths().count(), base.v3_paths().count() + 2);
        // Built again on the custom documents: the built-in ones, plus only the new set.
        let g = gadget();
        let again = custom.with_custom(&[CustomResource { desc: &g, schema: None }]).unwrap();
        assert!(again.v3_group_version("apis/example.com/v1").is_none());
        assert!(again.v3_group_version("apis/stable.example.com/v1beta1").is_some());
        let none = custom.with_custom(&[]).unwrap();
        assert_eq!(none.v3_root(), base.v3_root());
        assert_eq!(none.v2_json(), base.v2_json(), "merging nothing changes no byte");
        assert_eq!(none.v2_hash(), base.v2_hash());
        // Deterministic.
        let (_, twice) = custom_docs();
        assert_eq!(twice.v3_root(), custom.v3_root());
        assert_eq!(twice.v2_json(), custom.v2_json());
    }

    #[test]
    fn custom_v3_document_keeps_the_schema_and_adds_type_and_object_meta() {
        let (_, custom) = custom_docs();
        let doc = gv(&custom, "apis/example.com/v1");
        assert_eq!(doc["openapi"], "3.0.0");
        let schemas = &doc["components"]["schemas"];
        assert_refs_resolve(&doc, schemas, REF_PREFIX);
        let w = &schemas["com.example.v1.Widget"];
        assert_eq!(
            w["x-kubernetes-group-version-kind"],
            json!([{"group": "example.com", "kind": "Widget", "version": "v1"}])
        );
        assert_eq!(w["description"], "A widget.");
        assert_eq!(w["properties"]["apiVersion"]["type"], "string");
        assert_eq!(w["properties"]["kind"]["type"], "string");
        assert_eq!(
            w["properties"]["metadata"]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert!(w["properties"]["metadata"].get("properties").is_none(), "replaced");
        let spec = &w["properties"]["spec"];
        assert_eq!(spec["properties"]["size"]["description"], "How big the widget is.");
        assert_eq!(spec["properties"]["size"]["default"], 1);
        assert_eq!(spec["properties"]["size"]["minimum"], 0);
        assert!(spec.get("example").is_none(), "not kept by a structural schema");
        // v3 keeps nullable, the junctors, preserve-unknown-fields' properties.
        assert_eq!(spec["properties"]["note"]["nullable"], true);
        assert_eq!(spec["required"], json!(["size", "note"]));
        assert_eq!(spec["properties"]["shape"]["anyOf"].as_array().unwrap().len(), 2);
        assert!(spec["properties"]["extra"]["properties"]["known"].is_object());
        assert_eq!(spec["properties"]["tags"]["x-kubernetes-list-type"], "set");
        // Unfolded: int-or-string as anyOf, embedded resources with TypeMeta and ObjectMeta.
        assert_eq!(
            spec["properties"]["port"]["anyOf"],
            json!([{"type": "integer"}, {"type": "string"}])
        );
        let template = &spec["properties"]["template"];
        assert_eq!(template["properties"]["kind"]["type"], "string");
        assert_eq!(
            template["properties"]["metadata"]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert_eq!(template["required"], json!(["kind", "apiVersion"]));
        assert!(template["properties"]["spec"]["properties"]["x"].is_object());

        let list = &schemas["com.example.v1.WidgetList"];
        assert_eq!(
            list["x-kubernetes-group-version-kind"],
            json!([{"group": "example.com", "kind": "WidgetList", "version": "v1"}])
        );
        assert_eq!(list["required"], json!(["items"]));
        assert_eq!(list["properties"]["items"]["type"], "array");
        assert_eq!(
            list["properties"]["items"]["items"]["$ref"],
            "#/components/schemas/com.example.v1.Widget"
        );
        assert_eq!(
            list["properties"]["metadata"]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
        );
        for name in [
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
            "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
            "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
            "io.k8s.api.autoscaling.v1.Scale",
        ] {
            assert!(schemas[name].is_object(), "{name} missing");
        }
        assert!(schemas.get("io.k8s.api.apps.v1.Deployment").is_none(), "only what is reached");
    }

    #[test]
    fn custom_v3_paths_cover_every_verb_and_subresource() {
        let (_, custom) = custom_docs();
        let doc = gv(&custom, "apis/example.com/v1");
        let paths = &doc["paths"];
        let item = "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}";
        let collection = "/apis/example.com/v1/namespaces/{namespace}/widgets";
        let ids = [
            (collection, "get", "listExampleComV1NamespacedWidget"),
            (collection, "post", "createExampleComV1NamespacedWidget"),
            (collection, "delete", "deleteExampleComV1CollectionNamespacedWidget"),
            ("/apis/example.com/v1/widgets", "get", "listExampleComV1WidgetForAllNamespaces"),
            (item, "get", "readExampleComV1NamespacedWidget"),
            (item, "put", "replaceExampleComV1NamespacedWidget"),
            (item, "patch", "patchExampleComV1NamespacedWidget"),
            (item, "delete", "deleteExampleComV1NamespacedWidget"),
            (
                "/apis/example.com/v1/watch/namespaces/{namespace}/widgets",
                "get",
                "watchExampleComV1NamespacedWidgetList",
            ),
            ("/apis/example.com/v1/", "get", "getExampleComV1APIResources"),
        ];
        for (path, method, id) in ids {
            assert_eq!(paths[path][method]["operationId"], id, "{method} {path}");
        }
        let patch = &paths[item]["patch"];
        assert_eq!(patch["tags"], json!(["exampleCom_v1"]));
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "example.com", "kind": "Widget", "version": "v1"})
        );
        let content: Vec<&String> =
            patch["requestBody"]["content"].as_object().unwrap().keys().collect();
        assert_eq!(
            content,
            [
                "application/apply-patch+yaml",
                "application/json-patch+json",
                "application/merge-patch+json"
            ]
        );
        let names: Vec<&str> = patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"fieldValidation"), "{names:?}");
        assert_eq!(
            patch["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/com.example.v1.Widget"
        );
        assert_eq!(
            paths[collection]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/com.example.v1.WidgetList"
        );
        // Status: the Widget itself; scale: autoscaling/v1 Scale.
        let status = &paths[format!("{item}/status")];
        for (method, id) in [
            ("get", "readExampleComV1NamespacedWidgetStatus"),
            ("put", "replaceExampleComV1NamespacedWidgetStatus"),
            ("patch", "patchExampleComV1NamespacedWidgetStatus"),
        ] {
            assert_eq!(status[method]["operationId"], id);
            assert_eq!(status[method]["x-kubernetes-group-version-kind"]["kind"], "Widget");
        }
        let scale = &paths[format!("{item}/scale")];
        assert_eq!(scale["get"]["operationId"], "readExampleComV1NamespacedWidgetScale");
        assert_eq!(
            scale["patch"]["x-kubernetes-group-version-kind"],
            json!({"group": "autoscaling", "kind": "Scale", "version": "v1"})
        );
        // A cluster-scoped kind of a group with several labels.
        let gadgets = gv(&custom, "apis/stable.example.com/v1beta1");
        assert_eq!(
            gadgets["paths"]["/apis/stable.example.com/v1beta1/gadgets/{name}"]["get"]["operationId"],
            "readStableExampleComV1beta1Gadget"
        );
        assert!(
            gadgets["paths"]["/apis/stable.example.com/v1beta1/gadgets/{name}/status"].is_null()
        );
        let g = &gadgets["components"]["schemas"]["com.example.stable.v1beta1.Gadget"];
        assert_eq!(g["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(
            g["properties"]["metadata"]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
    }

    fn find<'a>(v: &'a Value, key: &str) -> Vec<&'a Value> {
        let mut out = Vec::new();
        match v {
            Value::Object(o) => {
                if let Some(found) = o.get(key) {
                    out.push(found);
                }
                o.values().for_each(|c| out.extend(find(c, key)));
            }
            Value::Array(a) => a.iter().for_each(|c| out.extend(find(c, key))),
            _ => {}
        }
        out
    }

    #[test]
    fn custom_v2_definitions_drop_what_v2_cannot_express() {
        let (base, custom) = custom_docs();
        let v2: Value = serde_json::from_slice(custom.v2_json()).unwrap();
        let defs = &v2["definitions"];
        assert_refs_resolve(&v2, defs, V2_REF_PREFIX);
        let w = &defs["com.example.v1.Widget"];
        assert_eq!(
            w["x-kubernetes-group-version-kind"],
            json!([{"group": "example.com", "kind": "Widget", "version": "v1"}])
        );
        assert_eq!(
            w["properties"]["metadata"]["$ref"],
            "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        for junctor in ["anyOf", "allOf", "oneOf", "not", "nullable"] {
            assert!(find(w, junctor).is_empty(), "{junctor} left in {w}");
        }
        let spec = &w["properties"]["spec"];
        assert_eq!(spec["properties"]["size"]["description"], "How big the widget is.");
        // Nullable: untyped, and no longer required.
        assert_eq!(spec["properties"]["note"], json!({"description": "A note."}));
        assert_eq!(spec["required"], json!(["size"]));
        // Preserving unknown fields: no properties, untyped.
        assert_eq!(
            spec["properties"]["extra"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
        assert_eq!(
            spec["properties"]["port"],
            json!({"description": "A port.", "x-kubernetes-int-or-string": true})
        );
        assert_eq!(spec["properties"]["template"]["required"], json!(["kind", "apiVersion"]));
        // A root that keeps unknown fields is a bare object.
        assert_eq!(
            defs["com.example.stable.v1beta1.Gadget"],
            json!({"type": "object", "x-kubernetes-group-version-kind": [{"group": "stable.example.com", "kind": "Gadget", "version": "v1beta1"}]})
        );
        assert_eq!(
            defs["com.example.v1.WidgetList"]["properties"]["items"]["items"]["$ref"],
            "#/definitions/com.example.v1.Widget"
        );
        let patch =
            &v2["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]["patch"];
        assert_eq!(patch["operationId"], "patchExampleComV1NamespacedWidget");
        assert!(
            !patch["consumes"]
                .as_array()
                .unwrap()
                .contains(&json!("application/strategic-merge-patch+json"))
        );
        // Everything built-in is still there.
        let builtin: Value = serde_json::from_slice(base.v2_json()).unwrap();
        for (name, d) in builtin["definitions"].as_object().unwrap() {
            assert_eq!(&defs[name], d, "{name}");
        }
        for (path, item) in builtin["paths"].as_object().unwrap() {
            assert_eq!(&v2["paths"][path], item, "{path}");
        }
        assert_ne!(custom.v2_hash(), base.v2_hash());
        assert_eq!(custom.v2_hash(), sha512_hex(custom.v2_json()));
    }

    #[test]
    fn custom_v2_protobuf_is_the_v2_json() {
        let (_, custom) = custom_docs();
        let decoded = gnostic::Document::decode(custom.v2_protobuf().as_ref()).unwrap();
        let v2: Value = serde_json::from_slice(custom.v2_json()).unwrap();
        let mut expected = gnostic::document(&v2);
        let sort = |d: &mut gnostic::Document| {
            d.paths.as_mut().unwrap().path.sort_by(|a, b| a.name.cmp(&b.name));
            d.definitions
                .as_mut()
                .unwrap()
                .additional_properties
                .sort_by(|a, b| a.name.cmp(&b.name));
        };
        let mut decoded_sorted = decoded.clone();
        sort(&mut decoded_sorted);
        sort(&mut expected);
        assert_eq!(decoded_sorted, expected);
        let widget = decoded
            .definitions
            .as_ref()
            .unwrap()
            .additional_properties
            .iter()
            .find(|d| d.name == "com.example.v1.Widget")
            .and_then(|d| d.value.as_ref())
            .unwrap();
        let spec = widget
            .properties
            .as_ref()
            .unwrap()
            .additional_properties
            .iter()
            .find(|p| p.name == "spec")
            .and_then(|p| p.value.as_ref())
            .unwrap();
        assert_eq!(spec.description, "What the widget should be.");
        assert!(
            widget.vendor_extension.iter().any(|e| e.name == "x-kubernetes-group-version-kind")
        );
    }
}
