//! Generator of [`super::fields`]: reads k8s-pb's prost sources (located with `cargo
//! metadata`), takes every message that is a component of [`Schemas::builtin`], and maps each
//! prost field (`#[prost(..., tag = "N")] pub field_name`) to the component's JSON property.
//! Run as a test: it fails when the committed table differs, and rewrites it when
//! `SKIFF_REGENERATE_PB_FIELDS=1` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::schema::Schemas;

/// Components decoded by hand-written code in `protobuf.rs`, not through the table.
const SPECIAL: &[&str] = &[
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime",
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
    "io.k8s.apimachinery.pkg.runtime.RawExtension",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
];

/// The host's target triple (`rustc -vV`).
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(rustc).arg("-vV").output().expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

fn k8s_pb_src() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    // Offline and for the host only: a fresh machine's registry holds only the packages
    // built here, not the other platforms' dependencies (android_system_properties, ...).
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform"])
        .arg(host_triple())
        .args(["--manifest-path", manifest])
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let pkg = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "k8s-pb")
        .expect("k8s-pb is a dependency");
    Path::new(pkg["manifest_path"].as_str().expect("manifest_path"))
        .parent()
        .expect("k8s-pb dir")
        .join("src")
}

/// (OpenAPI package prefix, k8s-pb module dir) pairs: `io.k8s.api.apps.v1` ↔ `api/apps/v1`.
fn package_dir(component: &str) -> Option<(String, String)> {
    let (package, message) = component.rsplit_once('.')?;
    let dir = package.strip_prefix("io.k8s.")?.replace('.', "/").replace('-', "_");
    Some((dir, message.to_string()))
}

/// One prost field: tag, rust name, and the message type it holds (last path segment).
struct PbField {
    tag: u32,
    name: String,
    message_type: Option<String>,
}

/// prost fields of each struct in one k8s-pb module file, keyed by normalized struct name.
fn parse_module(text: &str) -> BTreeMap<String, Vec<PbField>> {
    let mut out: BTreeMap<String, Vec<PbField>> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut pending: Option<(u32, bool)> = None;
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix("pub struct ") {
            // Keyed by the normalized name: prost camel-cases acronyms (`HttpGetAction`).
            current = rest.split([' ', '{']).next().map(normalize);
            if let Some(c) = &current {
                out.entry(c.clone()).or_default();
            }
            continue;
        }
        if line == "}" {
            current = None;
            continue;
        }
        if line.starts_with("#[prost(") {
            let tag = line
                .split("tag = \"")
                .nth(1)
                .and_then(|t| t.split('"').next())
                .and_then(|t| t.parse().ok());
            pending = tag.map(|t| (t, line.starts_with("#[prost(message, optional")));
            continue;
        }
        if let (Some(c), Some((tag, is_message)), Some(rest)) =
            (&current, pending, line.strip_prefix("pub "))
        {
            let (name, ty) = rest.split_once(':').unwrap_or((rest, ""));
            let mut ty = ty.trim().to_string();
            while !ty.ends_with(',') {
                match lines.next() {
                    Some(more) => ty.push_str(more),
                    None => break,
                }
            }
            let message_type = is_message.then(|| {
                let inner = ty.trim_end_matches(',').trim_end_matches('>');
                inner.rsplit([':', '<']).next().unwrap_or_default().to_string()
            });
            out.get_mut(c).expect("struct entry").push(PbField {
                tag,
                name: name.trim().trim_start_matches("r#").to_string(),
                message_type,
            });
            pending = None;
        }
    }
    out
}

fn normalize(name: &str) -> String {
    name.chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect()
}

/// `(tag, "json")` entries of one message against the properties `props`; an embedded Go
/// struct (a singular message field whose own fields are all properties of the parent)
/// becomes `(tag, ">Message")` and is pushed on `inline`. Fields k8s-pb has but the served
/// schema (k8s-openapi v1_33) lacks are newer API fields: they are skipped, as JSON
/// decoding would drop them, and listed in `skipped`.
fn table_entries(
    component: &str,
    props: &serde_json::Map<String, serde_json::Value>,
    fields: &[PbField],
    module: &BTreeMap<String, Vec<PbField>>,
    inline: &mut Vec<String>,
    skipped: &mut Vec<String>,
) -> String {
    let has_prop = |name: &str| props.keys().find(|k| normalize(k) == normalize(name));
    let mut entries = Vec::new();
    for f in fields {
        if let Some(json_name) = has_prop(&f.name) {
            entries.push(format!("({}, \"{json_name}\")", f.tag));
            continue;
        }
        let embedded = f.message_type.as_ref().and_then(|t| Some((t, module.get(&normalize(t))?)));
        match embedded {
            Some((t, inner)) if inner.iter().any(|g| has_prop(&g.name).is_some()) => {
                entries.push(format!("({}, \">{t}\")", f.tag));
                inline.push(t.clone());
            }
            _ => skipped.push(format!("{component}.{} (tag {})", f.name, f.tag)),
        }
    }
    entries.join(", ")
}

fn render() -> String {
    let src = k8s_pb_src();
    let schemas = Schemas::builtin();
    let mut modules: BTreeMap<String, BTreeMap<String, Vec<PbField>>> = BTreeMap::new();
    let mut text = String::from(
        "//! GENERATED by `protobuf::generate` from k8s-pb's prost sources: do not edit.\n\
         //! Protobuf field numbers of every served message: (component, [(tag, JSON property)]).\n\
         //! Regenerate: `SKIFF_REGENERATE_PB_FIELDS=1 cargo test -p skiff-machinery --lib field_table_is_current`.\n\n\
         pub(super) static FIELDS: &[(&str, &[(u32, &str)])] = &[\n",
    );
    let mut skipped = Vec::new();
    for (component, schema) in schemas.components() {
        if SPECIAL.contains(&component.as_str()) {
            continue;
        }
        let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else { continue };
        let Some((dir, message)) = package_dir(component) else { continue };
        let module = modules.entry(dir.clone()).or_insert_with(|| {
            let path = src.join(&dir).join("mod.rs");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            parse_module(&text)
        });
        let Some(fields) = module.get(&normalize(&message)) else {
            // Synthesized or JSON-only schemas (e.g. meta/v1 WatchEvent is generic in k8s-pb
            // too) that have no protobuf message of this name.
            assert!(
                message.ends_with("List") || message == "WatchEvent" || message == "Patch",
                "no k8s-pb message {dir}/{message} for component {component}"
            );
            continue;
        };
        let mut inline = Vec::new();
        let entries = table_entries(component, props, fields, module, &mut inline, &mut skipped);
        text.push_str(&format!("    (\"{component}\", &[{entries}]),\n"));
        // Go-embedded structs (`json:",inline"`): their proto fields resolve against the
        // parent's properties, under the key "<parent>><EmbeddedMessage>".
        while let Some(message_type) = inline.pop() {
            let fields =
                module.get(&normalize(&message_type)).expect("inline message in the same package");
            let entries =
                table_entries(component, props, fields, module, &mut inline, &mut skipped);
            text.push_str(&format!("    (\"{component}>{message_type}\", &[{entries}]),\n"));
        }
    }
    text.push_str("];\n");
    if !skipped.is_empty() {
        text.push_str(
            "\n// k8s-pb fields absent from the served schema (newer API fields), skipped:\n",
        );
        for s in &skipped {
            text.push_str(&format!("// - {s}\n"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn field_table_is_current() {
        let rendered = super::render();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/protobuf/fields.rs");
        if std::env::var_os("SKIFF_REGENERATE_PB_FIELDS").is_some() {
            std::fs::write(path, &rendered).expect("write fields.rs");
            return;
        }
        let committed = std::fs::read_to_string(path).expect("read fields.rs");
        assert!(
            committed == rendered,
            "protobuf/fields.rs is stale: run SKIFF_REGENERATE_PB_FIELDS=1 cargo test -p skiff-machinery --lib field_table_is_current"
        );
    }
}
