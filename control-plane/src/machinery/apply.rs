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
    fn is(&self, manager: &str, operation: Operation, api_version: &str, subresource: Option<&str>) -> bool {
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
            api_version: m.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string(),
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
/// else keeps the live ones. For the scale subresource pass the parent's `api_version`.
#[allow(clippy::too_many_arguments)]
pub fn track_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    api_version: &str,
    schema: FieldSchema,
    now: &str,
) {
    let live_entries = || {
        old.and_then(managed_fields_of).and_then(decode_managed_fields).unwrap_or_default()
    };
    let mut entries = match (subresource, managed_fields_of(new)) {
        (None, Some(requested)) if is_reset(requested) => Vec::new(),
        (None, Some(requested)) => match decode_managed_fields(requested) {
            Some(e) if !e.is_empty() => e,
            _ => live_entries(),
        },
        _ => live_entries(),
    };
    let cmp = typed::compare(old, new, Some(schema), Filter::root(subresource));
    let mut taken = cmp.modified;
    taken.union(&cmp.added);
    for e in entries.iter_mut() {
        e.fields.difference(&taken);
        e.fields.difference(&cmp.removed);
    }
    if !taken.is_empty() {
        match entries.iter_mut().find(|e| e.is(manager, Operation::Update, api_version, subresource)) {
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
    #[error("Incorrect version specified in apply patch. Specified patch version: {specified}, expected: {expected}")]
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
#[allow(clippy::too_many_arguments)]
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    schema: FieldSchema,
    now: &str,
) -> Result<Value, ApplyError> {
    let Value::Object(config) = applied else { return Err(ApplyError::NotAnObject) };
    if managed_fields_of(applied).is_some() {
        return Err(ApplyError::ManagedFieldsInConfig);
    }
    let specified = config.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    if specified != api_version {
        return Err(ApplyError::VersionMismatch {
            specified: specified.to_string(),
            expected: api_version.to_string(),
        });
    }
    let result = apply_once(live, applied, manager, force, api_version, schema, now);
    let result = match result {
        Err(ApplyError::Conflicts(conflicts)) if manager == KUBECTL_SSA_MANAGER && !force => {
            let remaining = match live.map(|l| allowed_by_last_applied(l, api_version, schema)) {
                Some(Some(allowed)) => conflicts
                    .into_iter()
                    .filter(|c| !allowed.iter().any(|p| *p == c.field_path))
                    .collect(),
                _ => conflicts,
            };
            if remaining.is_empty() {
                apply_once(live, applied, manager, true, api_version, schema, now)
            } else {
                Err(ApplyError::Conflicts(remaining))
            }
        }
        other => other,
    };
    let mut merged = result?;
    if manager == KUBECTL_SSA_MANAGER {
        sync_last_applied(&mut merged, applied);
    }
    Ok(merged)
}

fn apply_once(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    schema: FieldSchema,
    now: &str,
) -> Result<Value, ApplyError> {
    let filter = Filter::root(None);
    let mut entries = live.and_then(managed_fields_of).and_then(decode_managed_fields).unwrap_or_default();
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

    let mut merged = typed::merge(live, applied, Some(schema), "")
        .map_err(ApplyError::InvalidConfig)?
        .unwrap_or_else(|| Value::Object(Map::new()));
    let applied_set =
        typed::to_field_set(applied, Some(schema), filter).map_err(ApplyError::InvalidConfig)?;

    let me = ManagedFieldsEntry {
        manager: manager.to_string(),
        operation: Operation::Apply,
        api_version: api_version.to_string(),
        time: Some(now.to_string()),
        subresource: None,
        fields: applied_set,
    };
    let last = match entries.iter().position(|e| e.same_identity(&me)) {
        Some(i) => Some(std::mem::replace(&mut entries[i], me).fields),
        None => {
            entries.push(me);
            None
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
        if e.manager == manager && e.operation == Operation::Apply && e.subresource.is_none() {
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
            a.describe_manager().cmp(&b.describe_manager()).then_with(|| a.field_path.cmp(&b.field_path))
        });
        return Err(ApplyError::Conflicts(conflicts));
    }
    entries.retain(|e| !e.fields.is_empty());
    write_managed_fields(&mut merged, entries);
    Ok(merged)
}

/// The fields (as printed paths) whose values in the client-side apply annotation still
/// match the live object (upstream `allowedConflictsFromLastApplied`).
fn allowed_by_last_applied(live: &Value, api_version: &str, schema: FieldSchema) -> Option<Vec<String>> {
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
