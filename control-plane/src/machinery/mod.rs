//! API machinery shared by the apiserver's handlers: OpenAPI schemas and documents,
//! protobuf request bodies, strategic merge patch, server-side apply and managed fields,
//! and admission (defaulting and validation) for the built-in kinds.

pub mod admission;
pub mod apply;
pub mod cron;
pub mod jsonpatch;
pub mod openapi;
pub mod protobuf;
pub mod quota;
pub mod rbac;
pub mod resource_metrics;
pub mod schema;
pub mod strategic;

/// `value.at(&["metadata", "labels"])`: the member at a path of object member names.
/// What `Value::pointer("/metadata/labels")` finds, without parsing and unescaping the
/// pointer into a `String` per segment (four allocations for a two-segment pointer), which
/// mattered on paths every create takes.
pub trait ValueAt {
    fn at(&self, path: &[&str]) -> Option<&serde_json::Value>;
}

impl ValueAt for serde_json::Value {
    fn at(&self, path: &[&str]) -> Option<&serde_json::Value> {
        path.iter().try_fold(self, |v, member| v.as_object()?.get(*member))
    }
}

/// A served resource, as the OpenAPI documents and discovery describe it. The apiserver's
/// registry builds one per resource (not per subresource).
#[derive(Debug, Clone)]
pub struct ResourceDesc {
    /// API group ("" for core).
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Plural resource name used in URLs ("deployments").
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    /// Verbs of the main resource, as discovery lists them
    /// ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch").
    pub verbs: &'static [&'static str],
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub subresources: &'static [SubresourceDesc],
}

#[derive(Debug, Clone)]
pub struct SubresourceDesc {
    /// "status", "scale", "binding", "log", "exec", ...
    pub name: &'static str,
    /// Kind of the subresource's body: the parent kind for status, "Scale" (autoscaling/v1)
    /// for scale, "Binding" (core/v1) for binding, "" for streaming subresources.
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub verbs: &'static [&'static str],
}

impl ResourceDesc {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// A JSON object member's name, borrowed from the input unless it had escapes (for
/// visitors that look at member names without allocating them).
pub enum MemberName<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl MemberName<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            MemberName::Borrowed(s) => s,
            MemberName::Owned(s) => s,
        }
    }
}

impl<'de> serde::Deserialize<'de> for MemberName<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> serde::de::Visitor<'de> for NameVisitor {
            type Value = MemberName<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<MemberName<'de>, E> {
                Ok(MemberName::Borrowed(s))
            }

            fn visit_str<E>(self, s: &str) -> Result<MemberName<'de>, E> {
                Ok(MemberName::Owned(s.to_string()))
            }
        }
        d.deserialize_str(NameVisitor)
    }
}
