//! CustomResourceDefinition structural schemas, with upstream's semantics
//! (`k8s.io/apiextensions-apiserver` at Kubernetes v1.33, and the kube-openapi schema
//! validator it uses): checking a CRD version's `openAPIV3Schema`
//! ([`check_structural`]), and, on custom resources, pruning unknown fields ([`prune`]),
//! defaulting ([`prune_non_nullable_nulls`], [`apply_defaults`]) and validation
//! ([`validate`]), and the CEL rules of `x-kubernetes-validations` (compiled once with the
//! tree, evaluated by [`validate_rules`]).
//!
//! Pure functions over `serde_json::Value`s. The apiserver runs them on a custom resource
//! in upstream's order: when decoding the request body [`prune`] (its paths are the
//! "unknown field" warnings, or errors with `fieldValidation=Strict`), then
//! [`prune_non_nullable_nulls`] and [`apply_defaults`]; after the ObjectMeta checks,
//! [`validate`] with an empty root path. Reading from storage prunes and defaults again.

mod cel;
mod cel_lib;
#[cfg(test)]
mod cel_tests;
mod formats;
mod gofmt;
mod pruning;
pub mod schema;
mod validation;

#[cfg(test)]
mod tests;

pub use cel::{CompiledRule, Rules, validate_rules};
pub use schema::{
    AdditionalProperties, ListType, MapType, Pattern, Structural, ValueValidation, apply_defaults,
    check_structural, prune, prune_non_nullable_nulls, validate,
};
