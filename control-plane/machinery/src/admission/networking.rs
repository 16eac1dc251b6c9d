//! networking.k8s.io/v1 Ingress and IngressClass: upstream's
//! `pkg/apis/networking/validation` (rules, paths, backends, TLS hosts, the class's
//! controller).

use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, Ingress, IngressBackend, IngressClass, IngressSpec,
};
use serde_json::Value;

use super::field::{ErrorList, FieldError, Path, Raw};
use super::kind::{Gvk, typed_pair, validate_meta};
use super::meta::FIELD_IMMUTABLE;
use super::names;
use super::service::{LbIngress, validate_lb_ingress};

const PATH_TYPES: &[&str] = &["Exact", "ImplementationSpecific", "Prefix"];
/// What an `Exact` or `Prefix` path may not contain (upstream's `invalidPathSequences`)
/// or end with (`invalidPathSuffixes`).
const INVALID_PATH_SEQUENCES: &[&str] = &["//", "/./", "/../", "%2f", "%2F"];
const INVALID_PATH_SUFFIXES: &[&str] = &["/..", "/."];
const MAX_CONTROLLER_LEN: usize = 250;

/// `ValidateIngressCreate` / `ValidateIngressUpdate` (the same spec rules; status writes
/// check metadata only).
pub fn validate_ingress(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("networking.k8s.io", "v1", "Ingress");
    let (n, o) = match typed_pair::<Ingress>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    if sub == Some("status") {
        let lb = n.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        let listed = lb.and_then(|l| l.ingress.as_ref()).into_iter().flatten();
        let ingress: Vec<LbIngress<'_>> =
            listed.map(|i| LbIngress::new(&i.ip, &i.hostname, None)).collect();
        let path = Path::root("status").child("loadBalancer");
        validate_lb_ingress(&ingress, &path, None, &mut errs);
        return errs;
    }
    validate_ingress_spec(&n.spec.unwrap_or_default(), &Path::root("spec"), &mut errs);
    errs
}

fn validate_ingress_spec(spec: &IngressSpec, sp: &Path, errs: &mut ErrorList) {
    let rules = spec.rules.as_deref().unwrap_or_default();
    if rules.is_empty() && spec.default_backend.is_none() {
        // Upstream prints the Go value of the empty rules (`%#v`).
        let rules = if spec.rules.is_some() {
            "[]networking.IngressRule{}"
        } else {
            "[]networking.IngressRule(nil)"
        };
        errs.push(FieldError::invalid(
            sp,
            Raw(rules.into()),
            "either `defaultBackend` or `rules` must be specified",
        ));
    }
    if let Some(b) = &spec.default_backend {
        validate_backend(b, &sp.child("defaultBackend"), errs);
    }
    for (i, rule) in rules.iter().enumerate() {
        let rp = sp.child("rules").index(i);
        if let Some(host) = rule.host.as_deref().filter(|h| !h.is_empty()) {
            validate_host(host, &rp.child("host"), errs);
        }
        let Some(http) = &rule.http else { continue };
        let pp = rp.child("http").child("paths");
        if http.paths.is_empty() {
            errs.push(FieldError::required(&pp, ""));
        }
        for (j, path) in http.paths.iter().enumerate() {
            validate_http_path(path, &pp.index(j), errs);
        }
    }
    // TLS hosts may be IP addresses (only rule hosts may not); upstream reports them all
    // at `tls[i].hosts`.
    for (i, tls) in spec.tls.iter().flatten().enumerate() {
        let tp = sp.child("tls").index(i);
        for host in tls.hosts.iter().flatten() {
            validate_dns_host(host, &tp.child("hosts"), errs);
        }
        if let Some(secret) = tls.secret_name.as_deref().filter(|s| !s.is_empty()) {
            for m in names::is_dns1123_subdomain(secret) {
                errs.push(FieldError::invalid(&tp.child("secretName"), secret, m));
            }
        }
    }
    if let Some(class) = spec.ingress_class_name.as_deref() {
        for m in names::is_dns1123_subdomain(class) {
            errs.push(FieldError::invalid(&sp.child("ingressClassName"), class, m));
        }
    }
}

const WILDCARD_ERROR: &str = "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. '*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// A rule's host: never an IP address, else as [`validate_dns_host`].
fn validate_host(host: &str, path: &Path, errs: &mut ErrorList) {
    if names::parse_ip(host).is_some() {
        errs.push(FieldError::invalid(path, host, "must be a DNS name, not an IP address"));
    }
    validate_dns_host(host, path, errs);
}

/// A DNS subdomain, or with a `*` a wildcard one (`*.` and a subdomain).
fn validate_dns_host(host: &str, path: &Path, errs: &mut ErrorList) {
    if host.contains('*') {
        let valid = host
            .strip_prefix("*.")
            .is_some_and(|rest| names::is_dns1123_subdomain(rest).is_empty());
        if !valid {
            errs.push(FieldError::invalid(path, host, WILDCARD_ERROR));
        }
        return;
    }
    for m in names::is_dns1123_subdomain(host) {
        errs.push(FieldError::invalid(path, host, m));
    }
}

fn validate_http_path(p: &HTTPIngressPath, path: &Path, errs: &mut ErrorList) {
    let value = p.path.as_deref().unwrap_or_default();
    if p.path_type.is_empty() {
        errs.push(FieldError::required(&path.child("pathType"), "pathType must be specified"));
    } else if !PATH_TYPES.contains(&p.path_type.as_str()) {
        errs.push(FieldError::not_supported(
            &path.child("pathType"),
            p.path_type.as_str(),
            PATH_TYPES,
        ));
    } else if p.path_type != "ImplementationSpecific" {
        let pp = path.child("path");
        if !value.starts_with('/') {
            errs.push(FieldError::invalid(&pp, value, "must be an absolute path"));
        }
        if let Some(seq) = INVALID_PATH_SEQUENCES.iter().find(|s| value.contains(**s)) {
            errs.push(FieldError::invalid(&pp, value, format!("must not contain '{seq}'")));
        }
        if let Some(suffix) = INVALID_PATH_SUFFIXES.iter().find(|s| value.ends_with(**s)) {
            errs.push(FieldError::invalid(&pp, value, format!("cannot end with '{suffix}'")));
        }
    } else if !value.is_empty() && !value.starts_with('/') {
        errs.push(FieldError::invalid(&path.child("path"), value, "must be an absolute path"));
    }
    validate_backend(&p.backend, &path.child("backend"), errs);
}

/// `validateIngressBackend`: a service (name and one of port name or number) or a typed
/// resource reference, not both.
fn validate_backend(b: &IngressBackend, path: &Path, errs: &mut ErrorList) {
    match (&b.service, &b.resource) {
        (Some(_), Some(_)) => {
            errs.push(FieldError::invalid(
                path,
                "",
                "cannot set both resource and service backends",
            ));
        }
        (None, Some(r)) => {
            if r.kind.is_empty() {
                errs.push(FieldError::required(
                    &path.child("resource").child("kind"),
                    "kind is required",
                ));
            }
            if r.name.is_empty() {
                errs.push(FieldError::required(
                    &path.child("resource").child("name"),
                    "name is required",
                ));
            }
        }
        (Some(s), None) => {
            let sp = path.child("service");
            if s.name.is_empty() {
                errs.push(FieldError::required(&sp.child("name"), ""));
            } else {
                for m in names::is_dns1035_label(&s.name) {
                    errs.push(FieldError::invalid(&sp.child("name"), s.name.as_str(), m));
                }
            }
            let port = s.port.clone().unwrap_or_default();
            let name = port.name.as_deref().unwrap_or_default();
            let number = port.number.unwrap_or(0);
            match (name.is_empty(), number == 0) {
                (false, false) => errs.push(FieldError::invalid(
                    path,
                    "",
                    "cannot set both port name & port number",
                )),
                (false, true) => {
                    for m in names::is_valid_port_name(name) {
                        errs.push(FieldError::invalid(&sp.child("port").child("name"), name, m));
                    }
                }
                (true, false) => {
                    for m in names::is_valid_port_num(i64::from(number)) {
                        errs.push(FieldError::invalid(
                            &sp.child("port").child("number"),
                            number,
                            m,
                        ));
                    }
                }
                (true, true) => {
                    errs.push(FieldError::required(path, "port name or number is required"));
                }
            }
        }
        (None, None) => {
            errs.push(FieldError::invalid(path, "", "resource or service backend is required"));
        }
    }
}

/// `ValidateIngressClass` / `ValidateIngressClassUpdate`: a controller (a domain-prefixed
/// path, fixed once created) and a complete parameters reference.
pub fn validate_ingress_class(new: &Value, old: Option<&Value>) -> ErrorList {
    let gvk = Gvk::new("networking.k8s.io", "v1", "IngressClass");
    let (n, o) = match typed_pair::<IngressClass>(new, old) {
        Ok(pair) => pair,
        Err(e) => return e,
    };
    let mut errs = validate_meta(gvk, &n.metadata, o.as_ref().map(|o| &o.metadata));
    let spec = n.spec.clone().unwrap_or_default();
    let cp = Path::root("spec").child("controller");
    let controller = spec.controller.as_deref().unwrap_or_default();
    if controller.is_empty() {
        errs.push(FieldError::required(&cp, ""));
    } else {
        if controller.len() > MAX_CONTROLLER_LEN {
            errs.push(FieldError::too_long(&cp, MAX_CONTROLLER_LEN));
        }
        match controller.split_once('/') {
            Some((domain, path)) if !path.is_empty() => {
                for m in names::is_dns1123_subdomain(domain) {
                    errs.push(FieldError::invalid(&cp, controller, m));
                }
            }
            _ => errs.push(FieldError::invalid(
                &cp,
                controller,
                "must be a domain-prefixed path (such as \"acme.io/foo\")",
            )),
        }
    }
    if let Some(p) = &spec.parameters {
        let pp = Path::root("spec").child("parameters");
        if p.kind.is_empty() {
            errs.push(FieldError::required(&pp.child("kind"), "kind is required"));
        }
        if p.name.is_empty() {
            errs.push(FieldError::required(&pp.child("name"), "name is required"));
        }
        match (p.scope.as_deref(), p.namespace.as_deref()) {
            (Some("Namespace"), None) => errs.push(FieldError::required(
                &pp.child("namespace"),
                "`parameters.scope` is set to 'Namespace'",
            )),
            (Some("Cluster"), Some(_)) => errs.push(FieldError::forbidden(
                &pp.child("namespace"),
                "`parameters.scope` is set to 'Cluster'",
            )),
            (Some(s), _) if s != "Namespace" && s != "Cluster" => errs
                .push(FieldError::not_supported(&pp.child("scope"), s, &["Cluster", "Namespace"])),
            _ => {}
        }
    }
    if let Some(o) = &o {
        let old_controller = o.spec.as_ref().and_then(|s| s.controller.as_deref());
        if spec.controller.as_deref() != old_controller {
            errs.push(FieldError::invalid(&cp, controller, FIELD_IMMUTABLE));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(errs: &ErrorList) -> Vec<String> {
        errs.iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
    }

    #[test]
    fn ingress_rules_need_typed_absolute_paths_and_one_backend() {
        let ing = json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {}});
        assert_eq!(
            messages(&validate_ingress(None, &ing, None)),
            [
                "spec: Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified"
            ]
        );
        let ing = json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"rules": [
            {"host": "10.0.0.1", "http": {"paths": [
                {"path": "/a", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                {"path": "b", "pathType": "Exact",
                 "backend": {"service": {"name": "web", "port": {"number": 80, "name": "http"}}}},
                {"path": "/c", "pathType": "Fuzzy",
                 "backend": {"service": {"name": "web"}}}
            ]}},
            {"host": "*.example.com", "http": {"paths": [
                {"path": "/x/../y", "pathType": "Prefix",
                 "backend": {"resource": {"kind": "Bucket", "name": "b"}}}
            ]}}
        ]}});
        assert_eq!(
            messages(&validate_ingress(None, &ing, None)),
            [
                "spec.rules[0].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address",
                "spec.rules[0].http.paths[1].path: Invalid value: \"b\": must be an absolute path",
                "spec.rules[0].http.paths[1].backend: Invalid value: \"\": cannot set both port name & port number",
                "spec.rules[0].http.paths[2].pathType: Unsupported value: \"Fuzzy\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\"",
                "spec.rules[0].http.paths[2].backend: Required value: port name or number is required",
                "spec.rules[1].http.paths[0].path: Invalid value: \"/x/../y\": must not contain '/../'",
            ]
        );
    }

    #[test]
    fn ingress_load_balancer_status_holds_addresses_and_dns_names() {
        let with_status = |lb: serde_json::Value| {
            json!({"metadata": {"name": "web", "namespace": "default", "resourceVersion": "1"},
                   "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}},
                   "status": {"loadBalancer": lb}})
        };
        let old = with_status(json!({}));
        let good =
            with_status(json!({"ingress": [{"ip": "192.0.2.1"}, {"hostname": "lb.example.com"}]}));
        assert!(validate_ingress(Some("status"), &good, Some(&old)).is_empty());
        let bad = with_status(
            json!({"ingress": [{"ip": "lb"}, {"hostname": "192.0.2.1"}, {"hostname": "Bad_Name"}]}),
        );
        let errs = messages(&validate_ingress(Some("status"), &bad, Some(&old)));
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert_eq!(
            errs[0],
            "status.loadBalancer.ingress[0].ip: Invalid value: \"lb\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
        );
        assert_eq!(
            errs[1],
            "status.loadBalancer.ingress[1].hostname: Invalid value: \"192.0.2.1\": must be a DNS name, not an IP address"
        );
        assert!(errs[2].starts_with("status.loadBalancer.ingress[2].hostname: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", errs[2]);
    }

    #[test]
    fn an_ingress_class_names_a_fixed_controller() {
        let class = |c: &str| json!({"metadata": {"name": "nginx", "resourceVersion": "1"}, "spec": {"controller": c}});
        assert!(validate_ingress_class(&class("k8s.io/ingress-nginx"), None).is_empty());
        assert_eq!(
            messages(&validate_ingress_class(&class("nginx"), None)),
            [
                "spec.controller: Invalid value: \"nginx\": must be a domain-prefixed path (such as \"acme.io/foo\")"
            ]
        );
        assert_eq!(
            messages(&validate_ingress_class(
                &class("example.com/other"),
                Some(&class("k8s.io/ingress-nginx"))
            )),
            ["spec.controller: Invalid value: \"example.com/other\": field is immutable"]
        );
    }
}
