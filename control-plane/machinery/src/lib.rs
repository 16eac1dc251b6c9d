//! API machinery shared by the apiserver's handlers: OpenAPI schemas and documents,
//! protobuf request bodies, JSON and strategic merge patches, server-side apply and managed
//! fields, and admission (defaulting and validation) for the built-in kinds.
//!
//! Pure functions over objects: it may use the core crate, never the store, the apiserver
//! (requests, responses, authorization) or anything above them.

pub mod admission;
pub mod apply;
pub mod crd;
pub mod jsonpatch;
pub mod openapi;
pub mod protobuf;
pub mod schema;
pub mod strategic;

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
    /// These short names (`kubectl get po`).
    pub const fn with_short_names(mut self, names: &'static [&'static str]) -> Self {
        self.short_names = names;
        self
    }

    /// These categories (`kubectl get all`).
    pub const fn with_categories(mut self, categories: &'static [&'static str]) -> Self {
        self.categories = categories;
        self
    }

    /// These subresources.
    pub const fn with_subresources(mut self, subresources: &'static [SubresourceDesc]) -> Self {
        self.subresources = subresources;
        self
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}
