//! apiregistration.k8s.io/v1 APIService: the defaults of the v1 API (a service's port is
//! 443) and the aggregator's validation, with upstream's field errors: the name is
//! `<version>.<group>`, the priorities are in range, and a local APIService (no service)
//! carries no TLS settings while a proxied one names its Service and trusts either a
//! `caBundle` or nothing at all (`insecureSkipTLSVerify`), never both.

use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde_json::Value;

use super::field::{ErrorList, FieldError, Path, Raw};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::names;
use super::value::{Obj, default_ptr};

pub const GROUP: &str = "apiregistration.k8s.io";

/// The kind as the validation dispatch names it.
const GVK: Gvk<'static> = Gvk::new(GROUP, "v1", "APIService");

/// `SetDefaults_ServiceReference`: a service reference without a port means 443.
pub fn default_api_service(o: &mut Obj) {
    if let Some(service) =
        o.get_mut("spec").and_then(|s| s.get_mut("service")).and_then(Value::as_object_mut)
    {
        default_ptr(service, "port", 443);
    }
}

/// `ValidateAPIService` (create), with `ValidateAPIServiceUpdate`'s ObjectMeta checks, or
/// `ValidateAPIServiceStatusUpdate` for `/status`.
pub fn validate(subresource: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let (svc, old) = match typed_pair::<APIService>(new, old) {
        Ok(pair) => pair,
        Err(errs) => return errs,
    };
    let mut errs = validate_meta(GVK, &svc.metadata, old.as_ref().map(|o| &o.metadata));
    if subresource == Some("status") {
        errs.extend(validate_status(&svc));
        return errs;
    }
    errs.extend(validate_spec(&svc));
    errs
}

/// The spec rules of `ValidateAPIService` (the name is checked here as well: it must be
/// the spec's `<version>.<group>`).
fn validate_spec(svc: &APIService) -> ErrorList {
    let mut errs = ErrorList::new();
    let spec = svc.spec.clone().unwrap_or_default();
    let group = spec.group.as_deref().unwrap_or_default();
    let version = spec.version.as_deref().unwrap_or_default();
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let required = format!("{version}.{group}");
    if !name.is_empty() && names::is_valid_path_segment_name(name).is_empty() && name != required {
        errs.push(FieldError::invalid(
            &Path::root("metadata").child("name"),
            name,
            format!("must be `spec.version+\".\"+spec.group`: {required:?}"),
        ));
    }
    let spec_path = Path::root("spec");
    // Only the legacy group may be empty, and only at v1.
    if group.is_empty() && version != "v1" {
        errs.push(FieldError::required(
            &spec_path.child("group"),
            "only v1 may have an empty group and it better be legacy kube",
        ));
    }
    if !group.is_empty() {
        for msg in names::is_dns1123_subdomain(group) {
            errs.push(FieldError::invalid(&spec_path.child("group"), group, msg));
        }
    }
    for msg in names::is_dns1035_label(version) {
        errs.push(FieldError::invalid(&spec_path.child("version"), version, msg));
    }
    if !(1..=20000).contains(&spec.group_priority_minimum) {
        errs.push(FieldError::invalid(
            &spec_path.child("groupPriorityMinimum"),
            Raw(spec.group_priority_minimum.to_string()),
            "must be positive and less than 20000",
        ));
    }
    if !(1..=1000).contains(&spec.version_priority) {
        errs.push(FieldError::invalid(
            &spec_path.child("versionPriority"),
            Raw(spec.version_priority.to_string()),
            "must be positive and less than 1000",
        ));
    }
    let ca_len = spec.ca_bundle.as_ref().map_or(0, |b| b.0.len());
    let insecure = spec.insecure_skip_tls_verify.unwrap_or(false);
    let Some(service) = spec.service.as_ref() else {
        // A local APIService is served by this apiserver: there is nothing to dial.
        if ca_len > 0 {
            errs.push(FieldError::invalid(
                &spec_path.child("caBundle"),
                format!("{ca_len} bytes"),
                "local APIServices may not have a caBundle",
            ));
        }
        if insecure {
            errs.push(FieldError::invalid(
                &spec_path.child("insecureSkipTLSVerify"),
                Raw("true".into()),
                "local APIServices may not have insecureSkipTLSVerify",
            ));
        }
        return errs;
    };
    let service_path = spec_path.child("service");
    if service.namespace.as_deref().unwrap_or_default().is_empty() {
        errs.push(FieldError::required(&service_path.child("namespace"), ""));
    }
    if service.name.as_deref().unwrap_or_default().is_empty() {
        errs.push(FieldError::required(&service_path.child("name"), ""));
    }
    let port = service.port.unwrap_or(443);
    let port_errs = names::is_valid_port_num(i64::from(port));
    if !port_errs.is_empty() {
        errs.push(FieldError::invalid(
            &service_path.child("port"),
            Raw(port.to_string()),
            format!("port is not valid: {}", port_errs.join(", ")),
        ));
    }
    if insecure && ca_len > 0 {
        errs.push(FieldError::invalid(
            &spec_path.child("insecureSkipTLSVerify"),
            Raw("true".into()),
            "may not be true if caBundle is present",
        ));
    }
    errs
}

/// `ValidateAPIServiceStatus`: each condition's status is True, False or Unknown.
fn validate_status(svc: &APIService) -> ErrorList {
    let mut errs = ErrorList::new();
    let conditions = svc.status.as_ref().and_then(|s| s.conditions.as_ref());
    let path = Path::root("status").child("conditions");
    for (i, c) in conditions.into_iter().flatten().enumerate() {
        if !matches!(c.status.as_str(), "True" | "False" | "Unknown") {
            errs.push(FieldError::not_supported(
                &path.index(i).child("status"),
                c.status.as_str(),
                &["False", "True", "Unknown"],
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn api_service(name: &str, spec: Value) -> Value {
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": name}, "spec": spec})
    }

    fn messages(v: &Value) -> Vec<String> {
        validate(None, v, None).iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
    }

    #[test]
    fn a_proxied_and_a_local_api_service_are_valid() {
        let remote = api_service(
            "v1beta1.metrics.test.example",
            json!({"group": "metrics.test.example", "version": "v1beta1",
                "service": {"namespace": "kube-system", "name": "m", "port": 443},
                "insecureSkipTLSVerify": true, "groupPriorityMinimum": 100, "versionPriority": 100}),
        );
        assert_eq!(messages(&remote), Vec::<String>::new());
        let local = api_service(
            "v1.",
            json!({"version": "v1", "groupPriorityMinimum": 18000, "versionPriority": 1}),
        );
        assert_eq!(messages(&local), Vec::<String>::new());
    }

    #[test]
    fn upstream_rules_give_upstream_messages() {
        let wrong = api_service(
            "v1.other",
            json!({"group": "g.example", "version": "v1", "caBundle": "YWJj",
                "groupPriorityMinimum": 0, "versionPriority": 1001}),
        );
        assert_eq!(
            messages(&wrong),
            [
                "metadata.name: Invalid value: \"v1.other\": must be `spec.version+\".\"+spec.group`: \"v1.g.example\"",
                "spec.groupPriorityMinimum: Invalid value: 0: must be positive and less than 20000",
                "spec.versionPriority: Invalid value: 1001: must be positive and less than 1000",
                "spec.caBundle: Invalid value: \"3 bytes\": local APIServices may not have a caBundle",
            ]
        );
        let both = api_service(
            "v1.g.example",
            json!({"group": "g.example", "version": "v1", "caBundle": "YWJj",
                "insecureSkipTLSVerify": true, "service": {"namespace": "", "name": "s", "port": 0},
                "groupPriorityMinimum": 1, "versionPriority": 1}),
        );
        assert_eq!(
            messages(&both),
            [
                "spec.service.namespace: Required value",
                "spec.service.port: Invalid value: 0: port is not valid: must be between 1 and 65535, inclusive",
                "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present",
            ]
        );
        let legacy = api_service(
            "v2.",
            json!({"version": "v2", "groupPriorityMinimum": 1, "versionPriority": 1}),
        );
        assert_eq!(
            messages(&legacy),
            [
                "spec.group: Required value: only v1 may have an empty group and it better be legacy kube"
            ]
        );
    }

    #[test]
    fn a_service_without_a_port_defaults_to_443() {
        let mut v = api_service(
            "v1.g.example",
            json!({"group": "g.example", "version": "v1", "service": {"namespace": "n", "name": "s"}}),
        );
        default_api_service(v.as_object_mut().unwrap());
        assert_eq!(v["spec"]["service"]["port"], 443);
    }
}
