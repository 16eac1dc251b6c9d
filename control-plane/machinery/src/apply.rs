//! Managed fields and server-side apply (sigs.k8s.io/structured-merge-diff and the
//! apiserver's `fieldmanager`): `metadata.managedFields` kept up to date on every write
//! ([`track_update`]) and `application/apply-patch+yaml` requests merged with ownership,
//! pruning and conflicts ([`server_side_apply`]).

mod fieldpath;
#[cfg(test)]
pub(crate) mod test_schemas;
mod typed;

use serde_json::{Map, Value};

pub use fieldpath::{FieldSet, path_string};
use typed::Filter;

use super::schema::FieldSchema;

/// The annotation kubectl's client-side apply keeps its last configuration in.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Manager that owns the fields of an object without managed fields on its first apply
/// (upstream `skipNonAppliedManager`).
pub const BEFORE_FIRST_APPLY_MANAGER: &str = "before-first-apply";
/// Manager the oldest update entries are folded into past [`MAX_UPDATE_MANAGERS`].
pub const ANCIENT_CHANGES_MANAGER: &str = "ancient-changes";
/// Upstream `DefaultMaxUpdateManagers`.
pub const MAX_UPDATE_MANAGERS: usize = 10;
/// The manager whose applies upgrade client-side apply ownership (upstream
/// `lastAppliedManager`/`lastAppliedUpdater`).
const KUBECTL_SSA_MANAGER: &str = "kubectl";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedFieldsEntry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: Option<String>,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl ManagedFieldsEntry {
    /// Upstream `BuildManagerIdentifier`: manager, operation, subresource, and the API
    /// version for updates only.
    fn is(
        &self,
        manager: &str,
        operation: Operation,
        api_version: &str,
        subresource: Option<&str>,
    ) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
            && (operation == Operation::Apply || self.api_version == api_version)
    }

    fn same_identity(&self, other: &ManagedFieldsEntry) -> bool {
        self.is(&other.manager, other.operation, &other.api_version, other.subresource.as_deref())
    }

    fn from_value(v: &Value) -> Option<Self> {
        let m = v.as_object()?;
        let operation = match m.get("operation")?.as_str()? {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return None,
        };
        if let Some(t) = m.get("fieldsType")
            && t.as_str() != Some("FieldsV1")
        {
            return None;
        }
        let fields = match m.get("fieldsV1") {
            Some(f) => FieldSet::from_fields_v1(f.clone())?,
            None => FieldSet::new(),
        };
        Some(ManagedFieldsEntry {
            manager: m.get("manager").and_then(Value::as_str).unwrap_or_default().to_string(),
            operation,
            api_version: m
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            time: m.get("time").and_then(Value::as_str).map(str::to_string),
            subresource: m
                .get("subresource")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            fields,
        })
    }

    fn into_value(self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), Value::String(self.manager));
        m.insert("operation".into(), Value::String(self.operation.as_str().into()));
        m.insert("apiVersion".into(), Value::String(self.api_version));
        if let Some(t) = self.time {
            m.insert("time".into(), Value::String(t));
        }
        m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
        m.insert("fieldsV1".into(), self.fields.into_fields_v1());
        if let Some(s) = self.subresource {
            m.insert("subresource".into(), Value::String(s));
        }
        Value::Object(m)
    }

    /// How conflicts name this manager (upstream `printManager`, without time).
    pub fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            s.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == Operation::Update {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }
}

/// Decode `metadata.managedFields`; `None` when any entry is malformed.
pub fn decode_managed_fields(v: &Value) -> Option<Vec<ManagedFieldsEntry>> {
    v.as_array()?.iter().map(ManagedFieldsEntry::from_value).collect()
}

/// Encode entries sorted as upstream (`sortEncodedManagedFields`): operation (Apply
/// first), time, manager, API version, subresource.
pub fn encode_managed_fields(mut entries: Vec<ManagedFieldsEntry>) -> Value {
    entries.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then_with(|| p.time.as_deref().unwrap_or("").cmp(q.time.as_deref().unwrap_or("")))
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
    Value::Array(entries.into_iter().map(ManagedFieldsEntry::into_value).collect())
}

fn managed_fields_of(obj: &Value) -> Option<&Value> {
    obj.get("metadata")?.get("managedFields").filter(|v| !v.is_null())
}

fn write_managed_fields(obj: &mut Value, entries: Vec<ManagedFieldsEntry>) {
    let Value::Object(root) = obj else { return };
    let meta = root.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(meta) = meta else { return };
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), encode_managed_fields(entries));
    }
}

/// Upstream `isResetManagedFields`: `[]` or `[{}]` in a request clears managed fields.
fn is_reset(v: &Value) -> bool {
    match v.as_array().map(Vec::as_slice) {
        Some([]) => true,
        Some([one]) => one.as_object().is_some_and(Map::is_empty),
        _ => false,
    }
}

/// Record a non-apply write (create, update, patch, subresource write) in `new`'s
/// `metadata.managedFields`: the fields that changed from `old` (all of them on create,
/// `old` = `None`) become owned by `manager` (operation `Update`, `api_version`, with
/// `subresource`) and are taken from every other manager; removed fields leave every set;
/// empty entries are dropped; the entry's time is set to `now` when it took fields.
///
/// Managed fields sent in the request are honoured like upstream (main resource only):
/// `[]` or `[{}]` clears them, a valid non-empty list replaces the live ones, anything
/// else keeps the live ones. An existing object without managed fields (or one whose
/// request cleared them) is not tracked, as upstream: tracking starts at creation or at
/// the first server-side apply. For the scale subresource pass the parent's `api_version`.
pub fn track_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    api_version: &str,
    schema: FieldSchema,
    now: &str,
) {
    let live_entries =
        || old.and_then(managed_fields_of).and_then(decode_managed_fields).unwrap_or_default();
    let mut entries = match (subresource, managed_fields_of(new)) {
        (None, Some(requested)) if is_reset(requested) => Vec::new(),
        (None, Some(requested)) => match decode_managed_fields(requested) {
            Some(e) if !e.is_empty() => e,
            _ => live_entries(),
        },
        _ => live_entries(),
    };
    if old.is_some() && entries.is_empty() {
        // Upstream (`probabilisticSkipNonAppliedManager`) tracks objects from their
        // creation only: an untracked (or reset) object stays untracked until an apply.
        write_managed_fields(new, entries);
        return;
    }
    let cmp = typed::compare(old, new, Some(schema), Filter::root(subresource));
    // On create nothing is modified: the added set is taken whole, not copied into an empty one.
    let taken = if cmp.modified.is_empty() {
        cmp.added
    } else {
        let mut taken = cmp.modified;
        taken.union(&cmp.added);
        taken
    };
    for e in entries.iter_mut() {
        e.fields.difference(&taken);
        e.fields.difference(&cmp.removed);
    }
    if !taken.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.is(manager, Operation::Update, api_version, subresource))
        {
            Some(e) => {
                e.fields.union(&taken);
                e.time = Some(now.to_string());
            }
            None => entries.push(ManagedFieldsEntry {
                manager: manager.to_string(),
                operation: Operation::Update,
                api_version: api_version.to_string(),
                time: Some(now.to_string()),
                subresource: subresource.map(str::to_string),
                fields: taken,
            }),
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    cap_update_managers(&mut entries);
    write_managed_fields(new, entries);
}

/// Fold the oldest update entries into `ancient-changes` entries (one per API version)
/// until at most [`MAX_UPDATE_MANAGERS`] update entries remain.
fn cap_update_managers(entries: &mut Vec<ManagedFieldsEntry>) {
    loop {
        let mut updaters: Vec<usize> =
            (0..entries.len()).filter(|&i| entries[i].operation == Operation::Update).collect();
        if updaters.len() <= MAX_UPDATE_MANAGERS {
            return;
        }
        updaters.sort_by(|&a, &b| {
            let (p, q) = (&entries[a], &entries[b]);
            p.time.cmp(&q.time).then_with(|| p.manager.cmp(&q.manager))
        });
        let oldest = updaters[0];
        let version = entries[oldest].api_version.clone();
        let bucket = updaters.iter().copied().find(|&i| {
            i != oldest
                && entries[i].manager == ANCIENT_CHANGES_MANAGER
                && entries[i].api_version == version
                && entries[i].subresource.is_none()
        });
        let partner = bucket.or_else(|| {
            updaters.iter().copied().find(|&i| i != oldest && entries[i].api_version == version)
        });
        let Some(partner) = partner else { return };
        let folded = entries[oldest].fields.clone();
        let time = std::cmp::max(entries[oldest].time.clone(), entries[partner].time.clone());
        let target = &mut entries[partner];
        target.fields.union(&folded);
        target.time = time;
        target.manager = ANCIENT_CHANGES_MANAGER.to_string();
        target.subresource = None;
        entries.remove(oldest);
    }
}

/// A field another manager owns and an apply would change.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub subresource: Option<String>,
    /// The field as upstream prints it: `.spec.replicas`,
    /// `.spec.template.spec.containers[name="nginx"].image`.
    pub field_path: String,
}

impl Conflict {
    fn describe_manager(&self) -> String {
        ManagedFieldsEntry {
            manager: self.manager.clone(),
            operation: self.operation,
            api_version: self.api_version.clone(),
            time: None,
            subresource: self.subresource.clone(),
            fields: FieldSet::new(),
        }
        .describe()
    }

    /// The message of this conflict's `FieldManagerConflict` cause
    /// (`conflict with "kubectl" with subresource "scale" using apps/v1`); the cause's
    /// field is [`Conflict::field_path`].
    pub fn cause_message(&self) -> String {
        format!("conflict with {}", self.describe_manager())
    }
}

fn conflicts_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!("Apply failed with 1 conflict: {}: {}", c.cause_message(), c.field_path);
    }
    let mut managers: Vec<String> = conflicts.iter().map(Conflict::describe_manager).collect();
    managers.sort();
    managers.dedup();
    let mut lines = Vec::new();
    for m in &managers {
        lines.push(format!("conflicts with {m}:"));
        for c in conflicts.iter().filter(|c| &c.describe_manager() == m) {
            lines.push(format!("- {}", c.field_path));
        }
    }
    format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
}

/// Why a server-side apply was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Other managers own fields the apply would change (409, reason `Conflict`, one
    /// `FieldManagerConflict` cause per conflict).
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    #[error("metadata.managedFields must be nil")]
    ManagedFieldsInConfig,
    #[error(
        "Incorrect version specified in apply patch. Specified patch version: {specified}, expected: {expected}"
    )]
    VersionMismatch { specified: String, expected: String },
    #[error("apply configuration must be an object")]
    NotAnObject,
    /// The configuration does not fit the schema (list-map items without key fields,
    /// duplicate keys, set items that are not scalars).
    #[error("failed to create typed patch object: {0}")]
    InvalidConfig(String),
}

impl ApplyError {
    /// The HTTP status code the apiserver answers with.
    pub fn status_code(&self) -> u16 {
        match self {
            ApplyError::Conflicts(_) => 409,
            ApplyError::InvalidConfig(_) => 422,
            _ => 400,
        }
    }
}

/// What one server-side apply request asks for.
#[derive(Debug, Clone, Copy)]
pub struct ApplyOptions<'a> {
    /// The `fieldManager` query parameter (required for apply).
    pub manager: &'a str,
    /// The `force` query parameter.
    pub force: bool,
    /// The group-version of the resource; the configuration must name it.
    pub api_version: &'a str,
    /// `Some("status")` for an apply to the status subresource (the entry records it and
    /// only status fields are tracked); `None` for the main resource.
    pub subresource: Option<&'a str>,
    /// RFC 3339 time stamped on the manager's entry.
    pub now: &'a str,
}

/// Server-side apply of `applied` (the request body, as JSON) by `manager` to `live`
/// (`None`: the object is created). Returns the new object with its managed fields.
///
/// The configuration is merged into the live object by the schema's structure, fields
/// this manager applied before and no longer applies are removed unless another manager
/// owns them, and the manager's `Apply` entry becomes exactly the configuration's fields.
/// Fields owned by other managers whose value would change are conflicts unless `force`
/// (then ownership moves). Like upstream, `kubectl`'s applies may take over fields whose
/// live values still match the client-side apply annotation, and keep that annotation in
/// step with the applied configuration.
///
/// Status in a main-resource apply (and spec in a status apply) is merged here like any
/// field; resetting it is the resource strategy's job, as upstream.
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    schema: FieldSchema,
    now: &str,
) -> Result<Value, ApplyError> {
    let options = ApplyOptions { manager, force, api_version, subresource: None, now };
    server_side_apply_with(live, applied, &options, schema)
}

/// [`server_side_apply`] with every option, including the subresource.
pub fn server_side_apply_with(
    live: Option<&Value>,
    applied: &Value,
    options: &ApplyOptions,
    schema: FieldSchema,
) -> Result<Value, ApplyError> {
    let Value::Object(config) = applied else { return Err(ApplyError::NotAnObject) };
    if managed_fields_of(applied).is_some() {
        return Err(ApplyError::ManagedFieldsInConfig);
    }
    let api_version = options.api_version;
    let specified = config.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    if specified != api_version {
        return Err(ApplyError::VersionMismatch {
            specified: specified.to_string(),
            expected: api_version.to_string(),
        });
    }
    let kubectl = options.manager == KUBECTL_SSA_MANAGER && options.subresource.is_none();
    let result = apply_once(live, applied, options, schema);
    let result = match result {
        Err(ApplyError::Conflicts(conflicts)) if kubectl && !options.force => {
            let remaining = match live.map(|l| allowed_by_last_applied(l, api_version, schema)) {
                Some(Some(allowed)) => {
                    conflicts.into_iter().filter(|c| !allowed.contains(&c.field_path)).collect()
                }
                _ => conflicts,
            };
            if remaining.is_empty() {
                apply_once(live, applied, &ApplyOptions { force: true, ..*options }, schema)
            } else {
                Err(ApplyError::Conflicts(remaining))
            }
        }
        other => other,
    };
    let mut merged = result?;
    if kubectl {
        sync_last_applied(&mut merged, applied);
    }
    Ok(merged)
}

fn apply_once(
    live: Option<&Value>,
    applied: &Value,
    options: &ApplyOptions,
    schema: FieldSchema,
) -> Result<Value, ApplyError> {
    let ApplyOptions { manager, force, api_version, subresource, now } = *options;
    let filter = Filter::root(subresource);
    let mut entries =
        live.and_then(managed_fields_of).and_then(decode_managed_fields).unwrap_or_default();
    if let Some(live) = live
        && entries.is_empty()
    {
        let fields = typed::compare(None, live, Some(schema), filter).added;
        if !fields.is_empty() {
            entries.push(ManagedFieldsEntry {
                manager: BEFORE_FIRST_APPLY_MANAGER.to_string(),
                operation: Operation::Update,
                api_version: api_version.to_string(),
                time: Some(now.to_string()),
                subresource: None,
                fields,
            });
        }
    }

    let mut merged = typed::merge(live, applied, Some(schema))
        .map_err(|e| ApplyError::InvalidConfig(e.to_string()))?
        .unwrap_or_else(|| Value::Object(Map::new()));
    let applied_set = typed::to_field_set(applied, Some(schema), filter)
        .map_err(|e| ApplyError::InvalidConfig(e.to_string()))?;

    let me = ManagedFieldsEntry {
        manager: manager.to_string(),
        operation: Operation::Apply,
        api_version: api_version.to_string(),
        time: Some(now.to_string()),
        subresource: subresource.map(str::to_string),
        fields: applied_set,
    };
    let (last, last_time) = match entries.iter().position(|e| e.same_identity(&me)) {
        Some(i) => {
            let previous = std::mem::replace(&mut entries[i], me);
            (Some(previous.fields), previous.time)
        }
        None => {
            entries.push(me);
            (None, None)
        }
    };

    // Prune what this manager applied before, no longer applies and nobody else owns.
    if let Some(mut last) = last.filter(|l| !l.is_empty()) {
        let mut owned = FieldSet::new();
        for e in &entries {
            owned.union(&e.fields);
        }
        owned.ensure_named_fields_are_members();
        last.ensure_named_fields_are_members();
        last.difference(&owned);
        typed::remove_items(&mut merged, &last, Some(schema));
    }

    let cmp = typed::compare(live, &merged, Some(schema), filter);
    let mut changed = cmp.modified;
    changed.union(&cmp.added);
    let mut conflicts = Vec::new();
    for e in entries.iter_mut() {
        if e.is(manager, Operation::Apply, api_version, subresource) {
            continue;
        }
        let clash = e.fields.intersection(&changed);
        if !clash.is_empty() {
            for path in clash.member_paths() {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    operation: e.operation,
                    api_version: e.api_version.clone(),
                    subresource: e.subresource.clone(),
                    field_path: path_string(&path),
                });
            }
            e.fields.difference(&clash);
        }
        e.fields.difference(&cmp.removed);
    }
    if !force && !conflicts.is_empty() {
        conflicts.sort_by(|a, b| {
            a.describe_manager()
                .cmp(&b.describe_manager())
                .then_with(|| a.field_path.cmp(&b.field_path))
        });
        return Err(ApplyError::Conflicts(conflicts));
    }
    // A no-op apply keeps the entry's time (upstream only stamps applies that changed the
    // object), so that re-applying the same configuration writes nothing new.
    if let Some(time) = last_time
        && live == Some(&merged)
        && let Some(e) =
            entries.iter_mut().find(|e| e.is(manager, Operation::Apply, api_version, subresource))
    {
        e.time = Some(time);
    }
    entries.retain(|e| !e.fields.is_empty());
    write_managed_fields(&mut merged, entries);
    Ok(merged)
}

/// The fields (as printed paths) whose values in the client-side apply annotation still
/// match the live object (upstream `allowedConflictsFromLastApplied`).
fn allowed_by_last_applied(
    live: &Value,
    api_version: &str,
    schema: FieldSchema,
) -> Option<Vec<String>> {
    let text = live.get("metadata")?.get("annotations")?.get(LAST_APPLIED_ANNOTATION)?.as_str()?;
    let last: Value = serde_json::from_str(text).ok()?;
    if last.get("apiVersion").and_then(Value::as_str) != Some(api_version) {
        return None;
    }
    let filter = Filter::root(None);
    let mut set = typed::to_field_set(&last, Some(schema), filter).ok()?;
    let cmp = typed::compare(Some(&last), live, Some(schema), filter);
    set.difference(&cmp.modified);
    set.difference(&cmp.added);
    set.difference(&cmp.removed);
    Some(set.member_paths().iter().map(|p| path_string(p)).collect())
}

/// After an apply by `kubectl`, keep an existing client-side apply annotation equal to the
/// applied configuration (upstream `lastAppliedUpdater`).
fn sync_last_applied(merged: &mut Value, applied: &Value) {
    let Some(annotations) = merged
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if !annotations.contains_key(LAST_APPLIED_ANNOTATION) {
        return;
    }
    let mut config = applied.clone();
    if let Some(a) = config
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        a.remove(LAST_APPLIED_ANNOTATION);
        if a.is_empty()
            && let Some(meta) = config.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.remove("annotations");
        }
    }
    annotations.insert(LAST_APPLIED_ANNOTATION.to_string(), Value::String(config.to_string()));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::test_schemas::{kind, schemas};
    use super::*;
    use crate::schema::Schemas;

    const T1: &str = "2026-01-01T00:00:01Z";
    const T2: &str = "2026-01-01T00:00:02Z";
    const T3: &str = "2026-01-01T00:00:03Z";

    fn deploy(s: &Schemas) -> FieldSchema<'_> {
        kind(s, "apps", "Deployment")
    }

    fn config(replicas: i64, containers: Value) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": containers},
                },
            },
        })
    }

    fn nginx(image: &str) -> Value {
        json!({"name": "nginx", "image": image, "ports": [{"containerPort": 80}]})
    }

    fn entries(obj: &Value) -> Vec<ManagedFieldsEntry> {
        decode_managed_fields(&obj["metadata"]["managedFields"]).expect("valid managed fields")
    }

    fn entry<'a>(
        es: &'a [ManagedFieldsEntry],
        manager: &str,
        op: Operation,
    ) -> &'a ManagedFieldsEntry {
        es.iter()
            .find(|e| e.manager == manager && e.operation == op)
            .unwrap_or_else(|| panic!("no {op:?} entry for {manager} in {es:?}"))
    }

    /// What the apiserver does for `kubectl create` / the first client-side apply: the
    /// defaulted object is created and tracked.
    fn created_by_client_side_apply(s: &Schemas) -> Value {
        let mut obj = config(2, json!([nginx("nginx:1.24")]));
        obj["metadata"]["annotations"] =
            json!({LAST_APPLIED_ANNOTATION: config(2, json!([nginx("nginx:1.24")])).to_string()});
        obj["metadata"]["uid"] = json!("u1");
        obj["metadata"]["resourceVersion"] = json!("1");
        obj["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}});
        obj["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = json!("TCP");
        obj["status"] = json!({});
        track_update(None, &mut obj, "kubectl-client-side-apply", None, "apps/v1", deploy(s), T1);
        obj
    }

    #[test]
    fn create_owns_every_field_like_upstream() {
        let s = schemas();
        let obj = created_by_client_side_apply(&s);
        let mf = &obj["metadata"]["managedFields"];
        assert_eq!(mf.as_array().map(Vec::len), Some(1));
        assert_eq!(mf[0]["manager"], "kubectl-client-side-apply");
        assert_eq!(mf[0]["operation"], "Update");
        assert_eq!(mf[0]["apiVersion"], "apps/v1");
        assert_eq!(mf[0]["time"], T1);
        assert_eq!(mf[0]["fieldsType"], "FieldsV1");
        assert_eq!(
            mf[0]["fieldsV1"],
            json!({
                "f:metadata": {
                    "f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                    "f:labels": {".": {}, "f:app": {}},
                },
                "f:spec": {
                    "f:replicas": {},
                    "f:selector": {},
                    "f:strategy": {
                        "f:rollingUpdate": {".": {}, "f:maxSurge": {}, "f:maxUnavailable": {}},
                        "f:type": {},
                    },
                    "f:template": {
                        "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                        "f:spec": {"f:containers": {
                            "k:{\"name\":\"nginx\"}": {
                                ".": {},
                                "f:image": {},
                                "f:name": {},
                                "f:ports": {
                                    ".": {},
                                    "k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                                        ".": {}, "f:containerPort": {}, "f:protocol": {},
                                    },
                                },
                            },
                        }},
                    },
                },
            })
        );
    }

    #[test]
    fn updates_move_ownership_and_drop_empty_entries() {
        let s = schemas();
        let live = created_by_client_side_apply(&s);

        // kubectl scale: a merge patch on deployments/scale, recorded on the parent.
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        track_update(Some(&live), &mut scaled, "kubectl", Some("scale"), "apps/v1", deploy(&s), T2);
        let es = entries(&scaled);
        let scale = entry(&es, "kubectl", Operation::Update);
        assert_eq!(scale.subresource.as_deref(), Some("scale"));
        assert_eq!(scale.fields.clone().into_fields_v1(), json!({"f:spec": {"f:replicas": {}}}));
        let csa = entry(&es, "kubectl-client-side-apply", Operation::Update);
        assert!(!csa.fields.has(&["f:spec", "f:replicas"]));
        assert!(csa.fields.has(&[
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"nginx\"}",
            "f:image"
        ]));
        assert_eq!(csa.time.as_deref(), Some(T1), "an entry that took nothing keeps its time");

        // A no-op write changes nothing.
        let mut same = scaled.clone();
        track_update(Some(&scaled), &mut same, "other", None, "apps/v1", deploy(&s), T3);
        assert_eq!(same, scaled);

        // Removing a label removes it from its owner; status writes do not own spec.
        let mut relabeled = scaled.clone();
        relabeled["metadata"]["labels"] = json!({});
        relabeled["status"] = json!({"replicas": 5});
        track_update(
            Some(&scaled),
            &mut relabeled,
            "kube-controller-manager",
            Some("status"),
            "apps/v1",
            deploy(&s),
            T3,
        );
        let es = entries(&relabeled);
        let csa = entry(&es, "kubectl-client-side-apply", Operation::Update);
        assert!(!csa.fields.has(&["f:metadata", "f:labels", "f:app"]));
        assert!(csa.fields.has(&["f:metadata", "f:labels"]), "the emptied map stays owned");
        let kcm = entry(&es, "kube-controller-manager", Operation::Update);
        assert_eq!(kcm.fields.clone().into_fields_v1(), json!({"f:status": {"f:replicas": {}}}));

        // A scale entry whose only field is taken by another writer disappears.
        let mut rescaled = relabeled.clone();
        rescaled["spec"]["replicas"] = json!(1);
        track_update(Some(&relabeled), &mut rescaled, "hpa", None, "apps/v1", deploy(&s), T3);
        let es = entries(&rescaled);
        assert!(!es.iter().any(|e| e.subresource.as_deref() == Some("scale")), "{es:?}");
        assert_eq!(
            entry(&es, "hpa", Operation::Update).fields.clone().into_fields_v1(),
            json!({"f:spec": {"f:replicas": {}}})
        );
    }

    #[test]
    fn request_managed_fields_reset_or_replace() {
        let s = schemas();
        let live = created_by_client_side_apply(&s);
        let mut reset = live.clone();
        reset["metadata"]["managedFields"] = json!([{}]);
        track_update(Some(&live), &mut reset, "kubectl", None, "apps/v1", deploy(&s), T2);
        assert!(reset["metadata"].get("managedFields").is_none(), "{reset}");

        let mut replaced = live.clone();
        replaced["metadata"]["managedFields"] = json!([{
            "manager": "someone", "operation": "Update", "apiVersion": "apps/v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}},
        }]);
        track_update(Some(&live), &mut replaced, "kubectl", None, "apps/v1", deploy(&s), T2);
        let es = entries(&replaced);
        assert_eq!(es.len(), 1);
        assert_eq!(es[0].manager, "someone");

        // An object without managed fields stays untracked on update.
        let mut untracked = reset.clone();
        untracked["spec"]["replicas"] = json!(9);
        track_update(Some(&reset), &mut untracked, "kubectl", None, "apps/v1", deploy(&s), T3);
        assert!(untracked["metadata"].get("managedFields").is_none(), "{untracked}");

        // Garbage in the request keeps the live entries.
        let mut garbage = live.clone();
        garbage["metadata"]["managedFields"] = json!([{"manager": 1}]);
        track_update(Some(&live), &mut garbage, "kubectl", None, "apps/v1", deploy(&s), T2);
        assert_eq!(garbage["metadata"]["managedFields"], live["metadata"]["managedFields"]);
    }

    #[test]
    fn server_side_apply_create_and_reapply_is_idempotent() {
        let s = schemas();
        let cfg = config(2, json!([nginx("nginx:1.24")]));
        let created = server_side_apply(None, &cfg, "kubectl", false, "apps/v1", deploy(&s), T1)
            .expect("create");
        assert_eq!(created["spec"]["replicas"], 2);
        let es = entries(&created);
        assert_eq!(es.len(), 1);
        assert_eq!(es[0].operation, Operation::Apply);
        assert_eq!(
            es[0].fields.clone().into_fields_v1(),
            json!({
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {
                    "f:replicas": {},
                    "f:selector": {},
                    "f:template": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"nginx\"}": {
                            ".": {},
                            "f:image": {},
                            "f:name": {},
                            "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}},
                        }}},
                    },
                },
            })
        );
        let again =
            server_side_apply(Some(&created), &cfg, "kubectl", false, "apps/v1", deploy(&s), T2)
                .expect("reapply");
        assert_eq!(
            again, created,
            "re-applying the same configuration changes nothing, not even times"
        );
    }

    #[test]
    fn scale_then_apply_conflicts_and_force_takes_ownership() {
        let s = schemas();
        let cfg = config(2, json!([nginx("nginx:1.24")]));
        let created = server_side_apply(None, &cfg, "kubectl", false, "apps/v1", deploy(&s), T1)
            .expect("create");
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(5);
        track_update(
            Some(&created),
            &mut scaled,
            "kubectl",
            Some("scale"),
            "apps/v1",
            deploy(&s),
            T2,
        );

        // Same replicas as the scale: no conflict, shared ownership.
        let shared = server_side_apply(
            Some(&scaled),
            &config(5, json!([nginx("nginx:1.24")])),
            "kubectl",
            false,
            "apps/v1",
            deploy(&s),
            T3,
        )
        .expect("no conflict when the value does not change");
        assert!(entries(&shared).iter().any(|e| e.subresource.as_deref() == Some("scale")));

        let err = server_side_apply(
            Some(&scaled),
            &config(3, json!([nginx("nginx:1.24")])),
            "kubectl",
            false,
            "apps/v1",
            deploy(&s),
            T3,
        )
        .unwrap_err();
        let ApplyError::Conflicts(conflicts) = &err else {
            panic!("expected conflicts, got {err}")
        };
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].field_path, ".spec.replicas");
        assert_eq!(
            conflicts[0].cause_message(),
            r#"conflict with "kubectl" with subresource "scale" using apps/v1"#
        );
        assert_eq!(
            err.to_string(),
            r#"Apply failed with 1 conflict: conflict with "kubectl" with subresource "scale" using apps/v1: .spec.replicas"#
        );
        assert_eq!(err.status_code(), 409);

        let forced = server_side_apply(
            Some(&scaled),
            &config(3, json!([nginx("nginx:1.24")])),
            "kubectl",
            true,
            "apps/v1",
            deploy(&s),
            T3,
        )
        .expect("force");
        assert_eq!(forced["spec"]["replicas"], 3);
        let es = entries(&forced);
        assert_eq!(es.len(), 1, "the scale entry lost its only field: {es:?}");
        assert!(entry(&es, "kubectl", Operation::Apply).fields.has(&["f:spec", "f:replicas"]));
    }

    #[test]
    fn conflicts_with_client_side_apply_name_the_field() {
        let s = schemas();
        let live = created_by_client_side_apply(&s);
        let err = server_side_apply(
            Some(&live),
            &config(2, json!([nginx("nginx:1.25")])),
            "my-tool",
            false,
            "apps/v1",
            deploy(&s),
            T2,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using apps/v1: .spec.template.spec.containers[name="nginx"].image"#
        );

        // Two conflicts are grouped by manager.
        let err = server_side_apply(
            Some(&live),
            &config(4, json!([nginx("nginx:1.25")])),
            "my-tool",
            false,
            "apps/v1",
            deploy(&s),
            T2,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 2 conflicts: conflicts with \"kubectl-client-side-apply\" using apps/v1:\n- .spec.replicas\n- .spec.template.spec.containers[name=\"nginx\"].image"
        );
    }

    #[test]
    fn kubectl_server_side_apply_upgrades_client_side_apply() {
        let s = schemas();
        let live = created_by_client_side_apply(&s);
        // Fields still as last applied: kubectl may take them over without --force.
        let out = server_side_apply(
            Some(&live),
            &config(4, json!([nginx("nginx:1.25")])),
            "kubectl",
            false,
            "apps/v1",
            deploy(&s),
            T2,
        )
        .expect("upgrade from client-side apply");
        assert_eq!(out["spec"]["replicas"], 4);
        let last: Value = serde_json::from_str(
            out["metadata"]["annotations"][LAST_APPLIED_ANNOTATION]
                .as_str()
                .expect("annotation kept"),
        )
        .expect("annotation is JSON");
        assert_eq!(last["spec"]["replicas"], 4, "annotation follows the applied configuration");
    }

    #[test]
    fn dropping_a_container_from_the_config_removes_it() {
        let s = schemas();
        let two = json!([nginx("nginx:1.24"), {"name": "sidecar", "image": "busybox"}]);
        let created =
            server_side_apply(None, &config(2, two), "kubectl", false, "apps/v1", deploy(&s), T1)
                .expect("create");
        assert_eq!(
            created["spec"]["template"]["spec"]["containers"].as_array().map(Vec::len),
            Some(2)
        );
        let one = server_side_apply(
            Some(&created),
            &config(2, json!([nginx("nginx:1.24")])),
            "kubectl",
            false,
            "apps/v1",
            deploy(&s),
            T2,
        )
        .expect("reapply");
        let names: Vec<&str> = one["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["nginx"]);
        assert!(!entries(&one)[0].fields.has(&[
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"sidecar\"}"
        ]));

        // Dropping a label removes it, dropping replicas removes the field.
        let mut cfg = config(2, json!([nginx("nginx:1.24")]));
        cfg["metadata"].as_object_mut().unwrap().remove("labels");
        cfg["spec"].as_object_mut().unwrap().remove("replicas");
        let pruned =
            server_side_apply(Some(&one), &cfg, "kubectl", false, "apps/v1", deploy(&s), T3)
                .expect("reapply");
        assert!(pruned["metadata"].get("labels").is_none(), "{pruned}");
        assert!(pruned["spec"].get("replicas").is_none());
    }

    #[test]
    fn fields_owned_by_others_survive_pruning() {
        let s = schemas();
        let created = server_side_apply(
            None,
            &config(2, json!([nginx("nginx:1.24")])),
            "kubectl",
            false,
            "apps/v1",
            deploy(&s),
            T1,
        )
        .expect("create");
        // Another writer sets replicas to the same value? No: it changes image via update.
        let mut updated = created.clone();
        updated["spec"]["replicas"] = json!(7);
        track_update(Some(&created), &mut updated, "hpa", None, "apps/v1", deploy(&s), T2);
        let mut cfg = config(2, json!([nginx("nginx:1.24")]));
        cfg["spec"].as_object_mut().unwrap().remove("replicas");
        let out =
            server_side_apply(Some(&updated), &cfg, "kubectl", false, "apps/v1", deploy(&s), T3)
                .expect("apply");
        assert_eq!(out["spec"]["replicas"], 7, "owned by hpa, not pruned");
    }

    #[test]
    fn two_appliers_own_different_containers() {
        let s = schemas();
        let a = server_side_apply(
            None,
            &config(1, json!([{"name": "a", "image": "a:1"}])),
            "team-a",
            false,
            "apps/v1",
            deploy(&s),
            T1,
        )
        .expect("a creates");
        let b_cfg = json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"template": {"spec": {"containers": [{"name": "b", "image": "b:1"}]}}},
        });
        let ab = server_side_apply(Some(&a), &b_cfg, "team-b", false, "apps/v1", deploy(&s), T2)
            .expect("b adds");
        let names = |v: &Value| -> Vec<String> {
            v["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names(&ab), ["a", "b"]);
        let again = server_side_apply(
            Some(&ab),
            &config(1, json!([{"name": "a", "image": "a:2"}])),
            "team-a",
            false,
            "apps/v1",
            deploy(&s),
            T3,
        )
        .expect("a updates its container");
        assert_eq!(names(&again), ["a", "b"]);
        assert_eq!(again["spec"]["template"]["spec"]["containers"][0]["image"], "a:2");

        let err = server_side_apply(
            Some(&again),
            &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "stolen"}]}}}}),
            "team-b",
            false,
            "apps/v1",
            deploy(&s),
            T3,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains(
                r#"conflict with "team-a": .spec.template.spec.containers[name="a"].image"#
            ),
            "{err}"
        );

        let b_gone = server_side_apply(
            Some(&again),
            &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}),
            "team-b",
            false,
            "apps/v1",
            deploy(&s),
            T3,
        )
        .expect("b drops its container");
        assert_eq!(names(&b_gone), ["a"]);
        assert!(
            !entries(&b_gone).iter().any(|e| e.manager == "team-b"),
            "empty entries are dropped"
        );
    }

    #[test]
    fn apply_to_an_unmanaged_object_conflicts_with_before_first_apply() {
        let s = schemas();
        let mut live = config(2, json!([nginx("nginx:1.24")]));
        live["metadata"]["uid"] = json!("u");
        let err = server_side_apply(
            Some(&live),
            &config(3, json!([nginx("nginx:1.24")])),
            "tool",
            false,
            "apps/v1",
            deploy(&s),
            T1,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"Apply failed with 1 conflict: conflict with "before-first-apply" using apps/v1: .spec.replicas"#
        );
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        let s = schemas();
        let mut cfg = config(1, json!([nginx("x")]));
        cfg["metadata"]["managedFields"] = json!([]);
        let err = server_side_apply(None, &cfg, "m", false, "apps/v1", deploy(&s), T1).unwrap_err();
        assert!(matches!(err, ApplyError::ManagedFieldsInConfig));
        assert_eq!(err.status_code(), 400);

        let err =
            server_side_apply(None, &config(1, json!([])), "m", false, "apps/v2", deploy(&s), T1)
                .unwrap_err();
        assert!(matches!(err, ApplyError::VersionMismatch { .. }), "{err}");

        // Key fields with a schema default (like upstream's `name: default ""`) take it.
        let ok = server_side_apply(
            None,
            &config(1, json!([{"image": "x"}])),
            "m",
            false,
            "apps/v1",
            deploy(&s),
            T1,
        )
        .expect("defaulted key");
        assert!(entries(&ok)[0].fields.has(&[
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"\"}"
        ]));

        let mut cfg = config(1, json!([nginx("x")]));
        cfg["metadata"]["finalizers"] = json!([{"not": "scalar"}]);
        let err = server_side_apply(None, &cfg, "m", false, "apps/v1", deploy(&s), T1).unwrap_err();
        assert!(matches!(err, ApplyError::InvalidConfig(_)), "{err}");
        assert!(err.to_string().contains(".metadata.finalizers: element 0"), "{err}");
        assert_eq!(err.status_code(), 422);

        let err = server_side_apply(
            None,
            &config(1, json!([nginx("x"), nginx("y")])),
            "m",
            false,
            "apps/v1",
            deploy(&s),
            T1,
        )
        .unwrap_err();
        assert!(err.to_string().contains("duplicate entries"), "{err}");
    }

    #[test]
    fn set_lists_and_service_ports() {
        let s = schemas();
        let svc = kind(&s, "", "Service");
        let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "finalizers": ["x"]},
            "spec": {"ports": [{"port": 80, "targetPort": 8080}], "selector": {"app": "web"}}});
        let created =
            server_side_apply(None, &cfg, "kubectl", false, "v1", svc, T1).expect("create");
        assert_eq!(
            entries(&created)[0].fields.clone().into_fields_v1(),
            json!({
                "f:metadata": {"f:finalizers": {"v:\"x\"": {}}},
                "f:spec": {
                    "f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:port": {}, "f:targetPort": {}}},
                    "f:selector": {},
                },
            })
        );
        let b = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "finalizers": ["y"]}});
        let both = server_side_apply(Some(&created), &b, "other", false, "v1", svc, T2)
            .expect("second applier");
        assert_eq!(both["metadata"]["finalizers"], json!(["x", "y"]));
    }

    #[test]
    fn status_subresource_apply_tracks_status_only() {
        let s = schemas();
        let live = server_side_apply(
            None,
            &config(2, json!([nginx("x")])),
            "kubectl",
            false,
            "apps/v1",
            deploy(&s),
            T1,
        )
        .expect("create");
        let status = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 9}, "status": {"replicas": 2, "readyReplicas": 1}});
        let options = ApplyOptions {
            manager: "deployment-controller",
            force: false,
            api_version: "apps/v1",
            subresource: Some("status"),
            now: T2,
        };
        let out = server_side_apply_with(Some(&live), &status, &options, deploy(&s))
            .expect("status apply");
        assert_eq!(out["status"], json!({"replicas": 2, "readyReplicas": 1}));
        let es = entries(&out);
        let ctrl = entry(&es, "deployment-controller", Operation::Apply);
        assert_eq!(ctrl.subresource.as_deref(), Some("status"));
        assert_eq!(
            ctrl.fields.clone().into_fields_v1(),
            json!({"f:status": {"f:readyReplicas": {}, "f:replicas": {}}})
        );
        // The main-resource applier still owns replicas: spec is not tracked for status.
        assert!(entry(&es, "kubectl", Operation::Apply).fields.has(&["f:spec", "f:replicas"]));

        // Re-applying without readyReplicas prunes it.
        let mut less = status.clone();
        less["status"] = json!({"replicas": 2});
        let out =
            server_side_apply_with(Some(&out), &less, &options, deploy(&s)).expect("status apply");
        assert_eq!(out["status"], json!({"replicas": 2}));
    }

    #[test]
    fn update_managers_are_capped() {
        let s = schemas();
        let mut obj = config(1, json!([]));
        track_update(
            None,
            &mut obj,
            "creator",
            None,
            "apps/v1",
            deploy(&s),
            "2026-01-01T00:00:00Z",
        );
        for i in 0..12 {
            let old = obj.clone();
            obj["metadata"]["labels"][format!("l{i}")] = json!("v");
            let t = format!("2026-01-01T00:01:{i:02}Z");
            track_update(
                Some(&old),
                &mut obj,
                &format!("writer-{i:02}"),
                None,
                "apps/v1",
                deploy(&s),
                &t,
            );
        }
        let es = entries(&obj);
        assert_eq!(
            es.iter().filter(|e| e.operation == Operation::Update).count(),
            MAX_UPDATE_MANAGERS
        );
        let ancient = entry(&es, ANCIENT_CHANGES_MANAGER, Operation::Update);
        assert!(ancient.fields.has(&["f:spec", "f:replicas"]), "{ancient:?}");
        assert!(es.iter().any(|e| e.manager == "writer-11"));
    }
}
