//! core/v1 Service: `SetDefaults_Service`, the strategy's clusterIP(s) normalization and
//! allocated-value carry-over on update, and `ValidateService`/`ValidateServiceUpdate`.
//! (ClusterIP and NodePort allocation itself belongs to the apiserver.)

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::field::{ErrorList, FieldError, Path, Raw, go_string_list};
use super::kind::{Gvk, typed, validate_meta};
use super::meta;
use super::names;
use super::pod::{validate_port_num_or_name, validate_protocol};
use super::value::{self, Obj, default, default_ptr, each, ensure};

const SERVICE: Gvk<'static> = Gvk::new("", "v1", "Service");
/// Upstream `MaxClientIPServiceAffinitySeconds`.
const MAX_CLIENT_IP_AFFINITY: i32 = 86400;
/// The default `--service-node-port-range`.
pub const NODE_PORT_RANGE: (i32, i32) = (30000, 32767);

pub fn default_service(o: &mut Obj) {
    let Some(spec) = ensure(o, "spec") else {
        return;
    };
    default(spec, "sessionAffinity", "None");
    match value::str_of(spec, "sessionAffinity") {
        "None" => {
            spec.remove("sessionAffinityConfig");
        }
        "ClientIP" => {
            let has_timeout = spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.get("clientIP"))
                .and_then(|c| c.get("timeoutSeconds"))
                .is_some_and(|t| !t.is_null());
            if !has_timeout {
                spec.insert(
                    "sessionAffinityConfig".into(),
                    json!({"clientIP": {"timeoutSeconds": 10800}}),
                );
            }
        }
        _ => {}
    }
    default(spec, "type", "ClusterIP");
    for p in each(spec, "ports") {
        default(p, "protocol", "TCP");
        let unset = match p.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => n.as_i64() == Some(0),
            Some(Value::String(s)) => s.is_empty(),
            _ => false,
        };
        if unset && let Some(port) = p.get("port").cloned() {
            p.insert("targetPort".into(), port);
        }
    }
    let ty = value::str_of(spec, "type").to_string();
    let has_external_ips =
        spec.get("externalIPs").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    let externally_accessible =
        ty == "LoadBalancer" || ty == "NodePort" || (ty == "ClusterIP" && has_external_ips);
    if externally_accessible {
        default(spec, "externalTrafficPolicy", "Cluster");
    }
    if matches!(ty.as_str(), "NodePort" | "LoadBalancer" | "ClusterIP") {
        default_ptr(spec, "internalTrafficPolicy", "Cluster");
    }
    if ty == "LoadBalancer" {
        default_ptr(spec, "allocateLoadBalancerNodePorts", true);
    }
    // A load balancer address without a mode is a VIP (upstream's LoadBalancerIPMode).
    if let Some(lb) = o.get_mut("status").and_then(|s| s.get_mut("loadBalancer"))
        && let Some(Value::Array(ingress)) = lb.get_mut("ingress")
    {
        for ing in ingress.iter_mut().filter_map(Value::as_object_mut) {
            let has_ip = ing.get("ip").and_then(Value::as_str).is_some_and(|ip| !ip.is_empty());
            if has_ip && ing.get("ipMode").is_none_or(Value::is_null) {
                ing.insert("ipMode".into(), json!("VIP"));
            }
        }
    }
}

/// Upstream's `ValidateLoadBalancerStatus` (with `ingress_ok` false: only a LoadBalancer
/// Service may have load balancer addresses) and, for Ingresses,
/// `ValidateIngressLoadBalancerStatus` (no ipMode): addresses are IPs, hostnames DNS names.
pub fn validate_lb_ingress(
    ingress: &[LbIngress<'_>],
    path: &Path,
    service_type: Option<&str>,
    errs: &mut ErrorList,
) {
    let ip_path = path.child("ingress");
    if service_type.is_some_and(|t| t != "LoadBalancer") && !ingress.is_empty() {
        errs.push(FieldError::forbidden(
            &ip_path,
            "may only be used when `spec.type` is 'LoadBalancer'",
        ));
        return;
    }
    for (i, ing) in ingress.iter().enumerate() {
        let at = ip_path.index(i);
        if !ing.ip.is_empty() && names::parse_ip(ing.ip).is_none() {
            errs.push(FieldError::invalid(&at.child("ip"), ing.ip, names::IP_ERROR));
        }
        if service_type.is_some() {
            match ing.ip_mode {
                Some(_) if ing.ip.is_empty() => errs.push(FieldError::forbidden(
                    &at.child("ipMode"),
                    "may not be specified when `ip` is not set",
                )),
                Some(m) if !matches!(m, "Proxy" | "VIP") => {
                    errs.push(FieldError::not_supported(&at.child("ipMode"), m, &["Proxy", "VIP"]))
                }
                None if !ing.ip.is_empty() => errs.push(FieldError::required(
                    &at.child("ipMode"),
                    "must be specified when `ip` is set",
                )),
                _ => {}
            }
        }
        if !ing.hostname.is_empty() {
            for msg in names::is_dns1123_subdomain(ing.hostname) {
                errs.push(FieldError::invalid(&at.child("hostname"), ing.hostname, msg));
            }
            if names::parse_ip(ing.hostname).is_some() {
                errs.push(FieldError::invalid(
                    &at.child("hostname"),
                    ing.hostname,
                    "must be a DNS name, not an IP address",
                ));
            }
        }
    }
}

/// One load balancer address, of a Service or an Ingress.
pub struct LbIngress<'a> {
    pub ip: &'a str,
    pub hostname: &'a str,
    pub ip_mode: Option<&'a str>,
}

impl<'a> LbIngress<'a> {
    pub fn new(
        ip: &'a Option<String>,
        hostname: &'a Option<String>,
        ip_mode: Option<&'a str>,
    ) -> Self {
        let ip = ip.as_deref().unwrap_or_default();
        LbIngress { ip, hostname: hostname.as_deref().unwrap_or_default(), ip_mode }
    }
}

fn cluster_ip(spec: &Obj) -> &str {
    value::str_of(spec, "clusterIP")
}

fn cluster_ips(spec: &Obj) -> &[Value] {
    spec.get("clusterIPs").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// `normalizeClusterIPs` on create: an old client's `clusterIP` alone initializes
/// `clusterIPs`.
pub fn normalize_cluster_ips_create(o: &mut Obj) {
    let Some(spec) = value::child(o, "spec") else {
        return;
    };
    let ip = cluster_ip(spec).to_string();
    if !ip.is_empty() && cluster_ips(spec).is_empty() {
        spec.insert("clusterIPs".into(), json!([ip]));
    }
}

/// `normalizeClusterIPs` on update: keep `clusterIP` and `clusterIPs` linked the way an
/// old (singular-only) or new client meant them.
fn normalize_cluster_ips_update(ns: &mut Obj, os: &Obj) {
    let same_ips = cluster_ips(ns) == cluster_ips(os);
    if cluster_ips(ns).is_empty()
        && cluster_ip(os) == cluster_ip(ns)
        && let Some(v) =
            os.get("clusterIPs").filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
    {
        ns.insert("clusterIPs".into(), v.clone());
    }
    if cluster_ip(os) != cluster_ip(ns) {
        if !cluster_ip(os).is_empty() && cluster_ip(ns).is_empty() {
            if same_ips {
                ns.remove("clusterIPs");
            }
        } else if same_ips {
            let ip = cluster_ip(ns).to_string();
            ns.insert("clusterIPs".into(), json!([ip]));
        }
    }
}

fn needs_cluster_ip(spec: &Obj) -> bool {
    value::str_of(spec, "type") != "ExternalName"
}

fn needs_node_port(spec: &Obj) -> bool {
    match value::str_of(spec, "type") {
        "NodePort" => true,
        "LoadBalancer" => {
            spec.get("allocateLoadBalancerNodePorts").and_then(Value::as_bool).unwrap_or(true)
        }
        _ => false,
    }
}

/// The service update path upstream runs before validation: `patchAllocatedValues` (an
/// update that omits the allocated clusterIP(s), IP families, nodePorts or
/// healthCheckNodePort keeps the old ones), `normalizeClusterIPs`, and
/// `dropTypeDependentFields` (a type change drops what the new type cannot carry, when the
/// client left it as it was).
pub fn prepare_service_update(n: &mut Obj, o: &Obj) {
    let (Some(ns), Some(os)) = (value::child(n, "spec"), o.get("spec").and_then(Value::as_object))
    else {
        return;
    };
    patch_allocated_values(ns, os);
    normalize_cluster_ips_update(ns, os);
    drop_type_dependent_fields(ns, os);
    if value::str_of(ns, "type") != "LoadBalancer"
        && let Some(st) = ensure(n, "status")
    {
        st.insert("loadBalancer".into(), json!({}));
    }
}

fn node_ports(spec: &Obj) -> Vec<i64> {
    spec.get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| p.get("nodePort").and_then(Value::as_i64).unwrap_or(0))
        .collect()
}

fn needs_hc_node_port(spec: &Obj) -> bool {
    value::str_of(spec, "type") == "LoadBalancer"
        && value::str_of(spec, "externalTrafficPolicy") == "Local"
}

fn externally_accessible(spec: &Obj) -> bool {
    match value::str_of(spec, "type") {
        "LoadBalancer" | "NodePort" => true,
        "ClusterIP" => {
            spec.get("externalIPs").and_then(Value::as_array).is_some_and(|a| !a.is_empty())
        }
        _ => false,
    }
}

fn drop_type_dependent_fields(ns: &mut Obj, os: &Obj) {
    let same = |ns: &Obj, key: &str| ns.get(key) == os.get(key);
    if needs_cluster_ip(os) && !needs_cluster_ip(ns) {
        if same(ns, "clusterIPs") {
            ns.remove("clusterIP");
            ns.remove("clusterIPs");
        }
        for key in ["ipFamilies", "ipFamilyPolicy"] {
            if same(ns, key) {
                ns.remove(key);
            }
        }
    }
    if needs_node_port(os) && !needs_node_port(ns) && node_ports(ns) == node_ports(os) {
        for p in each(ns, "ports") {
            p.remove("nodePort");
        }
    }
    if needs_hc_node_port(os) && !needs_hc_node_port(ns) && same(ns, "healthCheckNodePort") {
        ns.remove("healthCheckNodePort");
    }
    if value::str_of(os, "type") == "LoadBalancer" && value::str_of(ns, "type") != "LoadBalancer" {
        for key in ["allocateLoadBalancerNodePorts", "loadBalancerClass"] {
            if value::is_set(ns, key) && same(ns, key) {
                ns.remove(key);
            }
        }
    }
    if externally_accessible(os) && !externally_accessible(ns) && same(ns, "externalTrafficPolicy")
    {
        ns.remove("externalTrafficPolicy");
    }
}

fn patch_allocated_values(ns: &mut Obj, os: &Obj) {
    if needs_cluster_ip(ns) && needs_cluster_ip(os) {
        for key in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            let missing = match ns.get(key) {
                None | Some(Value::Null) => true,
                Some(Value::String(s)) => s.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                _ => false,
            };
            if missing && let Some(v) = os.get(key) {
                ns.insert(key.into(), v.clone());
            }
        }
    }
    if needs_node_port(ns) && needs_node_port(os) {
        let port_key = |p: &Value| {
            (
                p.get("port").and_then(Value::as_i64).unwrap_or(0),
                p.get("protocol").and_then(Value::as_str).unwrap_or("TCP").to_string(),
            )
        };
        let old_ports: Vec<((i64, String), i64)> = os
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| (port_key(p), p.get("nodePort").and_then(Value::as_i64).unwrap_or(0)))
            .collect();
        let used: HashSet<i64> = ns
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("nodePort").and_then(Value::as_i64))
            .filter(|np| *np != 0)
            .collect();
        for p in each(ns, "ports") {
            if p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0 {
                continue;
            }
            let key = port_key(&Value::Object(p.clone()));
            if let Some((_, np)) = old_ports.iter().find(|(k, _)| *k == key)
                && *np != 0
                && !used.contains(np)
            {
                p.insert("nodePort".into(), json!(np));
            }
        }
    }
    let hc = |s: &Obj| {
        value::str_of(s, "type") == "LoadBalancer"
            && value::str_of(s, "externalTrafficPolicy") == "Local"
    };
    if hc(ns)
        && hc(os)
        && ns.get("healthCheckNodePort").and_then(Value::as_i64).unwrap_or(0) == 0
        && let Some(v) = os.get("healthCheckNodePort")
    {
        ns.insert("healthCheckNodePort".into(), v.clone());
    }
}

pub fn validate_service(sub: Option<&str>, new: &Value, old: Option<&Value>) -> ErrorList {
    let svc: Service = match typed(new) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let old_svc: Option<Service> = match old.map(typed).transpose() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut errs = validate_meta(SERVICE, &svc.metadata, old_svc.as_ref().map(|s| &s.metadata));
    let spec = svc.spec.clone().unwrap_or_default();
    if sub == Some("status") {
        let lb = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        let listed = lb.and_then(|l| l.ingress.as_ref()).into_iter().flatten();
        let ingress: Vec<LbIngress<'_>> =
            listed.map(|i| LbIngress::new(&i.ip, &i.hostname, i.ip_mode.as_deref())).collect();
        let path = Path::root("status").child("loadBalancer");
        let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
        validate_lb_ingress(&ingress, &path, Some(ty), &mut errs);
        return errs;
    }
    if let Some(old_spec) = old_svc.as_ref().and_then(|s| s.spec.as_ref()) {
        validate_cluster_ips_update(&spec, old_spec, &mut errs);
    }
    validate_spec(&spec, &mut errs);
    errs
}

fn validate_cluster_ips_update(new: &ServiceSpec, old: &ServiceSpec, errs: &mut ErrorList) {
    let ext = |s: &ServiceSpec| s.type_.as_deref() == Some("ExternalName");
    if ext(new) || ext(old) {
        return;
    }
    let n = new.cluster_ips.as_deref().unwrap_or_default();
    let o = old.cluster_ips.as_deref().unwrap_or_default();
    if let (Some(nf), Some(of)) = (n.first(), o.first())
        && nf != of
    {
        errs.push(FieldError::invalid(
            &Path::root("spec").child("clusterIPs").index(0),
            go_string_list(n),
            "may not change once set",
        ));
    }
}

fn validate_spec(spec: &ServiceSpec, errs: &mut ErrorList) {
    let sp = Path::root("spec");
    let ty = spec.type_.as_deref().unwrap_or_default();
    let ports = spec.ports.as_deref().unwrap_or_default();
    let cluster_ips = spec.cluster_ips.as_deref().unwrap_or_default();
    let headless = cluster_ips.first().map(String::as_str) == Some("None")
        || spec.cluster_ip.as_deref() == Some("None");
    if ports.is_empty() && !headless && ty != "ExternalName" {
        errs.push(FieldError::required(&sp.child("ports"), ""));
    }
    match ty {
        "LoadBalancer" | "NodePort" => {
            if headless {
                errs.push(FieldError::invalid(
                    &sp.child("clusterIPs").index(0),
                    "None",
                    format!("may not be set to 'None' for {ty} services"),
                ));
            }
            if ty == "LoadBalancer" {
                for (i, p) in ports.iter().enumerate() {
                    if p.port == 10250 {
                        errs.push(FieldError::invalid(
                            &sp.child("ports").index(i),
                            p.port,
                            "may not expose port 10250 externally since it is used by kubelet",
                        ));
                    }
                }
            }
        }
        "ExternalName" => {
            if !cluster_ips.is_empty() {
                errs.push(FieldError::forbidden(
                    &sp.child("clusterIPs"),
                    "may not be set for ExternalName services",
                ));
            }
            if spec.ip_families.as_ref().is_some_and(|f| !f.is_empty()) {
                errs.push(FieldError::forbidden(
                    &sp.child("ipFamilies"),
                    "may not be set for ExternalName services",
                ));
            }
            if spec.ip_family_policy.is_some() {
                errs.push(FieldError::forbidden(
                    &sp.child("ipFamilyPolicy"),
                    "may not be set for ExternalName services",
                ));
            }
            let cname = spec.external_name.as_deref().unwrap_or_default();
            let cname = cname.strip_suffix('.').unwrap_or(cname);
            if cname.is_empty() {
                errs.push(FieldError::required(&sp.child("externalName"), ""));
            } else {
                for m in names::is_dns1123_subdomain(cname) {
                    errs.push(FieldError::invalid(&sp.child("externalName"), cname, m));
                }
            }
        }
        _ => {}
    }
    let mut port_names = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        validate_service_port(
            p,
            ports.len() > 1,
            &mut port_names,
            &sp.child("ports").index(i),
            errs,
        );
    }
    if let Some(sel) = &spec.selector {
        errs.extend(meta::validate_labels(sel, &sp.child("selector")));
    }
    let affinity = spec.session_affinity.as_deref().unwrap_or_default();
    match affinity {
        "" => errs.push(FieldError::required(&sp.child("sessionAffinity"), "")),
        "ClientIP" => {
            let cp = sp.child("sessionAffinityConfig");
            let detail = "when session affinity type is ClientIP";
            match &spec.session_affinity_config {
                None => errs.push(FieldError::required(&cp, detail)),
                Some(c) => match &c.client_ip {
                    None => errs.push(FieldError::required(&cp.child("clientIP"), detail)),
                    Some(ci) => match ci.timeout_seconds {
                        None => errs.push(FieldError::required(
                            &cp.child("clientIP").child("timeoutSeconds"),
                            detail,
                        )),
                        Some(t) if t <= 0 || t > MAX_CLIENT_IP_AFFINITY => {
                            errs.push(FieldError::invalid(
                                &cp.child("clientIP").child("timeoutSeconds"),
                                t,
                                format!(
                                    "must be greater than 0 and less than {MAX_CLIENT_IP_AFFINITY}"
                                ),
                            ))
                        }
                        Some(_) => {}
                    },
                },
            }
        }
        "None" => {
            if spec.session_affinity_config.is_some() {
                errs.push(FieldError::forbidden(
                    &sp.child("sessionAffinityConfig"),
                    "must not be set when session affinity is None",
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            &sp.child("sessionAffinity"),
            other,
            &["ClientIP", "None"],
        )),
    }
    validate_cluster_ips(spec, errs);
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        if names::parse_ip(ip).is_none() {
            errs.push(FieldError::invalid(&sp.child("externalIPs").index(i), ip, names::IP_ERROR));
        }
    }
    match ty {
        "" => errs.push(FieldError::required(&sp.child("type"), "")),
        "ClusterIP" | "ExternalName" | "LoadBalancer" | "NodePort" => {}
        other => errs.push(FieldError::not_supported(
            &sp.child("type"),
            other,
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        )),
    }
    let mut node_ports = HashSet::new();
    let mut port_keys = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let pp = sp.child("ports").index(i);
        let np = p.node_port.unwrap_or(0);
        let proto = p.protocol.as_deref().unwrap_or_default();
        if np != 0 {
            if ty == "ClusterIP" {
                errs.push(FieldError::forbidden(
                    &pp.child("nodePort"),
                    "may not be used when `type` is 'ClusterIP'",
                ));
            } else if !(NODE_PORT_RANGE.0..=NODE_PORT_RANGE.1).contains(&np) {
                errs.push(FieldError::invalid(
                    &pp.child("nodePort"),
                    np,
                    format!(
                        "provided port is not in the valid range. The range of valid ports is {}-{}",
                        NODE_PORT_RANGE.0, NODE_PORT_RANGE.1
                    ),
                ));
            }
            if !node_ports.insert((proto, np)) {
                errs.push(FieldError::duplicate(&pp.child("nodePort"), np));
            }
        }
        if !port_keys.insert((proto, p.port)) {
            errs.push(FieldError::duplicate(
                &pp,
                Raw(format!(
                    "core.ServicePort{{Name:\"\", Protocol:\"{proto}\", AppProtocol:(*string)(nil), Port:{}, TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:\"\"}}, NodePort:0}}",
                    p.port
                )),
            ));
        }
    }
    let externally_accessible = ty == "LoadBalancer"
        || ty == "NodePort"
        || (ty == "ClusterIP" && spec.external_ips.as_ref().is_some_and(|e| !e.is_empty()));
    let etp = spec.external_traffic_policy.as_deref().unwrap_or_default();
    if !externally_accessible {
        if !etp.is_empty() {
            errs.push(FieldError::invalid(
                &sp.child("externalTrafficPolicy"),
                etp,
                "may only be set for externally-accessible services",
            ));
        }
    } else if etp.is_empty() {
        errs.push(FieldError::required(&sp.child("externalTrafficPolicy"), ""));
    } else if !matches!(etp, "Cluster" | "Local") {
        errs.push(FieldError::not_supported(
            &sp.child("externalTrafficPolicy"),
            etp,
            &["Cluster", "Local"],
        ));
    }
    let needs_hc = ty == "LoadBalancer" && etp == "Local";
    if let Some(hc) = spec.health_check_node_port.filter(|h| *h != 0)
        && !needs_hc
    {
        errs.push(FieldError::invalid(
            &sp.child("healthCheckNodePort"),
            hc,
            "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
        ));
    }
    if matches!(ty, "ClusterIP" | "NodePort" | "LoadBalancer") {
        match spec.internal_traffic_policy.as_deref() {
            None => errs.push(FieldError::required(&sp.child("internalTrafficPolicy"), "")),
            Some("Cluster" | "Local") => {}
            Some(other) => errs.push(FieldError::not_supported(
                &sp.child("internalTrafficPolicy"),
                other,
                &["Cluster", "Local"],
            )),
        }
    }
    if ty != "LoadBalancer" && spec.allocate_load_balancer_node_ports.is_some() {
        errs.push(FieldError::forbidden(
            &sp.child("allocateLoadBalancerNodePorts"),
            "may only be used when `type` is 'LoadBalancer'",
        ));
    }
}

fn validate_service_port(
    p: &ServicePort,
    require_name: bool,
    names_seen: &mut HashSet<String>,
    path: &Path,
    errs: &mut ErrorList,
) {
    let name = p.name.as_deref().unwrap_or_default();
    if require_name && name.is_empty() {
        errs.push(FieldError::required(&path.child("name"), ""));
    } else if !name.is_empty() {
        for m in names::is_dns1123_label(name) {
            errs.push(FieldError::invalid(&path.child("name"), name, m));
        }
        if !names_seen.insert(name.to_string()) {
            errs.push(FieldError::duplicate(&path.child("name"), name));
        }
    }
    for m in names::is_valid_port_num(i64::from(p.port)) {
        errs.push(FieldError::invalid(&path.child("port"), p.port, m));
    }
    validate_protocol(p.protocol.as_deref(), &path.child("protocol"), errs);
    let target = p.target_port.clone().unwrap_or(IntOrString::Int(p.port));
    validate_port_num_or_name(&target, &path.child("targetPort"), errs);
}

fn validate_cluster_ips(spec: &ServiceSpec, errs: &mut ErrorList) {
    let sp = Path::root("spec");
    let ips = spec.cluster_ips.as_deref().unwrap_or_default();
    let ip = spec.cluster_ip.as_deref().unwrap_or_default();
    if !ip.is_empty()
        && let Some(first) = ips.first()
        && first != ip
    {
        errs.push(FieldError::invalid(
            &sp.child("clusterIPs"),
            go_string_list(ips),
            "first value must match `clusterIP`",
        ));
    }
    if ips.is_empty() && !ip.is_empty() && ip != "None" && names::parse_ip(ip).is_none() {
        errs.push(FieldError::invalid(&sp.child("clusterIP"), ip, names::IP_ERROR));
    }
    let mut has_invalid = false;
    for (i, c) in ips.iter().enumerate() {
        if i == 0 && c == "None" {
            if ips.len() > 1 {
                has_invalid = true;
                errs.push(FieldError::invalid(
                    &sp.child("clusterIPs"),
                    go_string_list(ips),
                    "'None' must be the first and only value",
                ));
            }
            continue;
        }
        if names::parse_ip(c).is_none() {
            has_invalid = true;
            errs.push(FieldError::invalid(&sp.child("clusterIPs").index(i), c, names::IP_ERROR));
        }
    }
    if ips.len() > 2 {
        errs.push(FieldError::invalid(
            &sp.child("clusterIPs"),
            go_string_list(ips),
            "may only hold up to 2 values",
        ));
    }
    if !has_invalid {
        let v6 = ips.iter().filter_map(|c| names::parse_ip(c)).filter(|ip| ip.is_ipv6()).count();
        if ips.len() > 1 && (v6 == 0 || v6 == ips.len()) {
            errs.push(FieldError::invalid(
                &sp.child("clusterIPs"),
                go_string_list(ips),
                "may specify no more than one IP for each IP family",
            ));
        }
        let headless = ips.len() == 1 && ips[0] == "None";
        let families = spec.ip_families.as_deref().unwrap_or_default();
        if !headless {
            for (i, (c, f)) in ips.iter().zip(families).enumerate() {
                let is_v6 = names::parse_ip(c).is_some_and(|ip| ip.is_ipv6());
                let want = match f.as_str() {
                    "IPv4" if is_v6 => "IPv4",
                    "IPv6" if !is_v6 => "IPv6",
                    _ => continue,
                };
                errs.push(FieldError::invalid(
                    &sp.child("clusterIPs").index(i),
                    c,
                    format!("expected an {want} value as indicated by `ipFamilies[{i}]`"),
                ));
            }
        }
    }
    for (i, f) in spec.ip_families.iter().flatten().enumerate() {
        if !matches!(f.as_str(), "IPv4" | "IPv6") {
            errs.push(FieldError::not_supported(
                &sp.child("ipFamilies").index(i),
                f,
                &["IPv4", "IPv6"],
            ));
        }
    }
    if let Some(p) = spec.ip_family_policy.as_deref()
        && !matches!(p, "SingleStack" | "PreferDualStack" | "RequireDualStack")
    {
        errs.push(FieldError::not_supported(
            &sp.child("ipFamilyPolicy"),
            p,
            &["PreferDualStack", "RequireDualStack", "SingleStack"],
        ));
    }
}
