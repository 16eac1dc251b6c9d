//! Pods and pod templates: defaulting (`SetDefaults_Pod/PodSpec/Container/Probe/Volume`,
//! the ServiceAccount, Priority and DefaultTolerationSeconds admission plugins, the pod
//! strategy's phase and QoS class) and validation (`ValidatePodSpec`, `ValidatePodUpdate`,
//! `ValidatePodStatusUpdate`, `ValidatePodTemplateSpec`).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, Pod, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::field::{ErrorList, FieldError, Path, Raw, go_string_list, json_value};
use super::kind::{Gvk, typed, validate_meta};
use super::meta::{self, NEGATIVE, nonnegative};
use super::names;
use super::scheduling;
use super::storage::HOST_PATH_TYPES;
use super::value::{self, Obj, default, default_ptr, each, ensure};
use skiff_core::quantity::{self, QUANTITY_FORMAT_ERROR, Quantity};

const POD: Gvk<'static> = Gvk::new("", "v1", "Pod");

// ---------------------------------------------------------------------------------------
// Defaulting
// ---------------------------------------------------------------------------------------

/// `SetDefaults_Pod` and everything below it.
pub fn default_pod(o: &mut Obj) {
    let Some(spec) = ensure(o, "spec") else {
        return;
    };
    default_pod_spec(spec, true);
}

/// `SetDefaults_PodSpec` and the container, probe, port and volume defaults. `is_pod` adds
/// what upstream does only for Pods, not templates (requests from limits, service links).
pub fn default_pod_spec(spec: &mut Obj, is_pod: bool) {
    default(spec, "dnsPolicy", "ClusterFirst");
    default(spec, "restartPolicy", "Always");
    default_ptr(spec, "securityContext", json!({}));
    default_ptr(spec, "terminationGracePeriodSeconds", 30);
    default(spec, "schedulerName", "default-scheduler");
    if is_pod {
        default_ptr(spec, "enableServiceLinks", true);
        // The pod strategy turns a negative grace period into 1.
        if spec.get("terminationGracePeriodSeconds").and_then(Value::as_i64).is_some_and(|g| g < 0)
        {
            spec.insert("terminationGracePeriodSeconds".into(), json!(1));
        }
    }
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        for c in each(spec, key) {
            default_container(c, is_pod, host_network);
        }
    }
    for v in each(spec, "volumes") {
        default_volume(v);
        quantity::canonicalize(value::child(v, "emptyDir").and_then(|e| e.get_mut("sizeLimit")));
    }
    quantity::canonicalize_list(spec.get_mut("overhead"));
    if let Some(r) = value::child(spec, "resources") {
        quantity::canonicalize_list(r.get_mut("requests"));
        quantity::canonicalize_list(r.get_mut("limits"));
    }
}

fn default_container(c: &mut Obj, is_pod: bool, host_network: bool) {
    if value::str_of(c, "imagePullPolicy").is_empty() {
        let policy =
            if image_tag_is_latest(value::str_of(c, "image")) { "Always" } else { "IfNotPresent" };
        c.insert("imagePullPolicy".into(), policy.into());
    }
    default(c, "terminationMessagePath", "/dev/termination-log");
    // `resources` is a struct, not a pointer, upstream: it always serializes.
    default_ptr(c, "resources", json!({}));
    default(c, "terminationMessagePolicy", "File");
    for p in each(c, "ports") {
        default(p, "protocol", "TCP");
        // Pods only: for templates this is behind DefaultHostNetworkHostPortsInPodTemplates,
        // off in 1.33.
        if is_pod
            && host_network
            && p.get("hostPort").and_then(Value::as_i64).unwrap_or(0) == 0
            && let Some(cp) = p.get("containerPort").cloned()
        {
            p.insert("hostPort".into(), cp);
        }
    }
    for e in each(c, "env") {
        if let Some(fr) = value::child(e, "valueFrom").and_then(|vf| value::child(vf, "fieldRef")) {
            default(fr, "apiVersion", "v1");
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = value::child(c, probe) {
            default_ptr(p, "timeoutSeconds", 1);
            default_ptr(p, "periodSeconds", 10);
            default_ptr(p, "successThreshold", 1);
            default_ptr(p, "failureThreshold", 3);
            default_handler(p);
        }
    }
    if let Some(lc) = value::child(c, "lifecycle") {
        for h in ["postStart", "preStop"] {
            if let Some(h) = value::child(lc, h) {
                default_handler(h);
            }
        }
    }
    if let Some(res) = value::child(c, "resources") {
        quantity::canonicalize_list(res.get_mut("requests"));
        quantity::canonicalize_list(res.get_mut("limits"));
    }
    if is_pod && let Some(res) = value::child(c, "resources") {
        // Requests default to limits (SetDefaults_Pod only, not templates).
        if let Some(limits) = res.get("limits").and_then(Value::as_object).cloned()
            && let Some(req) = ensure(res, "requests")
        {
            for (k, v) in limits {
                req.entry(k).or_insert(v);
            }
        }
    }
}

fn default_handler(h: &mut Obj) {
    if let Some(g) = value::child(h, "httpGet") {
        default(g, "path", "/");
        default(g, "scheme", "HTTP");
    }
}

fn default_volume(v: &mut Obj) {
    if !v.keys().any(|k| k != "name" && value::is_set(v, k)) {
        v.insert("emptyDir".into(), json!({}));
    }
    for key in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(src) = value::child(v, key) {
            default_ptr(src, "defaultMode", 420);
        }
    }
    if let Some(hp) = value::child(v, "hostPath") {
        default_ptr(hp, "type", "");
    }
}

/// Whether the image reference has the tag `latest` (explicit, or implied by having
/// neither tag nor digest), as `parsers.ParseImageName` decides.
fn image_tag_is_latest(image: &str) -> bool {
    if image.contains('@') {
        // A digest: the tag, if any, sits before the '@'.
        let before = image.split('@').next().unwrap_or_default();
        return tag_of(before) == Some("latest");
    }
    match tag_of(image) {
        None => true,
        Some(t) => t == "latest",
    }
}

fn tag_of(reference: &str) -> Option<&str> {
    let last_segment = reference.rsplit('/').next().unwrap_or(reference);
    last_segment.rsplit_once(':').map(|(_, t)| t)
}

/// What a Pod create gets from the ServiceAccount, Priority and DefaultTolerationSeconds
/// admission plugins and from the pod strategy (phase Pending, QoS class).
pub fn prepare_pod_create(o: &mut Obj) {
    if let Some(spec) = ensure(o, "spec") {
        default(spec, "serviceAccountName", "default");
        let sa = value::str_of(spec, "serviceAccountName").to_string();
        spec.insert("serviceAccount".into(), sa.into());
        let priority = match value::str_of(spec, "priorityClassName") {
            "system-node-critical" => Some(2_000_001_000),
            "system-cluster-critical" => Some(2_000_000_000),
            "" => Some(0),
            // Other classes are looked up by the apiserver (PriorityClass objects).
            _ => None,
        };
        if let Some(p) = priority {
            default_ptr(spec, "priority", p);
        }
        default_ptr(spec, "preemptionPolicy", "PreemptLowerPriority");
        add_default_tolerations(spec);
    }
    let qos = o.get("spec").and_then(Value::as_object).map(qos_class);
    o.insert("status".into(), json!({"phase": "Pending", "qosClass": qos.unwrap_or("BestEffort")}));
}

fn add_default_tolerations(spec: &mut Obj) {
    let (mut not_ready, mut unreachable) = (false, false);
    if let Some(ts) = spec.get("tolerations").and_then(Value::as_array) {
        for t in ts {
            let key = t.get("key").and_then(Value::as_str).unwrap_or_default();
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or_default();
            let no_exec = effect.is_empty() || effect == "NoExecute";
            not_ready |= no_exec && (key.is_empty() || key == "node.kubernetes.io/not-ready");
            unreachable |= no_exec && (key.is_empty() || key == "node.kubernetes.io/unreachable");
        }
    }
    let list = spec.entry("tolerations").or_insert_with(|| Value::Array(Vec::new()));
    if list.is_null() {
        *list = Value::Array(Vec::new());
    }
    let Some(list) = list.as_array_mut() else {
        return;
    };
    for (has, key) in [
        (not_ready, "node.kubernetes.io/not-ready"),
        (unreachable, "node.kubernetes.io/unreachable"),
    ] {
        if !has {
            list.push(json!({
                "key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300
            }));
        }
    }
}

/// The pod status strategy keeps the QoS class when a status write drops it.
pub fn backfill_qos_class(n: &mut Obj, o: &Obj) {
    let old = o
        .get("status")
        .and_then(|s| s.get("qosClass"))
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .map(str::to_string);
    if let Some(q) = old
        && let Some(st) = ensure(n, "status")
    {
        default(st, "qosClass", q);
    }
}

/// Upstream `qos.GetPodQOS` over containers and init containers (cpu and memory only).
pub fn qos_class(spec: &Obj) -> &'static str {
    let mut requests: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut limits: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut guaranteed = true;
    let containers = ["containers", "initContainers"]
        .into_iter()
        .filter_map(|k| spec.get(k).and_then(Value::as_array))
        .flatten();
    for c in containers {
        let res = c.get("resources");
        let list = |key: &str| res.and_then(|r| r.get(key)).and_then(Value::as_object);
        for (name, q) in list("requests").into_iter().flatten() {
            if let Some(q) = qos_quantity(name, q) {
                let e = requests.entry(qos_name(name)).or_insert(Quantity::ZERO);
                *e = e.saturating_add(q);
            }
        }
        let mut found = (false, false);
        for (name, q) in list("limits").into_iter().flatten() {
            if let Some(q) = qos_quantity(name, q) {
                if name == "cpu" {
                    found.0 = true;
                } else {
                    found.1 = true;
                }
                let e = limits.entry(qos_name(name)).or_insert(Quantity::ZERO);
                *e = e.saturating_add(q);
            }
        }
        if found != (true, true) {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed {
        guaranteed = requests.iter().all(|(k, r)| limits.get(k) == Some(r));
    }
    if guaranteed && requests.len() == limits.len() { "Guaranteed" } else { "Burstable" }
}

fn qos_name(name: &str) -> &'static str {
    if name == "cpu" { "cpu" } else { "memory" }
}

/// A positive cpu/memory quantity (others do not count for QoS).
fn qos_quantity(name: &str, q: &Value) -> Option<Quantity> {
    if name != "cpu" && name != "memory" {
        return None;
    }
    let q = Quantity::parse(q.as_str()?)?;
    (q > Quantity::ZERO).then_some(q)
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

pub fn validate_pod(new: &Value, old: Option<&Value>) -> ErrorList {
    let pod: Pod = match typed(new) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let old_pod: Option<Pod> = match old.map(typed).transpose() {
        Ok(p) => p,
        Err(e) => return e,
    };
    let mut errs = validate_meta(POD, &pod.metadata, old_pod.as_ref().map(|p| &p.metadata));
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let spec_path = Path::root("spec");
    errs.extend(validate_pod_spec(spec, &spec_path));
    if let Some(old_pod) = &old_pod {
        let old_spec = old_pod.spec.as_ref().unwrap_or(&empty);
        errs.extend(validate_pod_spec_update(spec, old_spec, &spec_path));
    }
    errs
}

/// `ValidatePodTemplateSpec`: template labels/annotations and the pod spec.
pub fn validate_pod_template(t: Option<&PodTemplateSpec>, path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    let Some(t) = t else {
        errs.push(FieldError::required(path, ""));
        return errs;
    };
    if let Some(m) = &t.metadata {
        if let Some(l) = &m.labels {
            errs.extend(meta::validate_labels(l, &path.child("labels")));
        }
        if let Some(a) = &m.annotations {
            errs.extend(meta::validate_annotations(a, &path.child("annotations")));
        }
    }
    let empty = PodSpec::default();
    let spec = t.spec.as_ref().unwrap_or(&empty);
    errs.extend(validate_pod_spec(spec, &path.child("spec")));
    if spec.ephemeral_containers.as_ref().is_some_and(|e| !e.is_empty()) {
        errs.push(FieldError::forbidden(
            &path.child("spec").child("ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    errs
}

/// `ValidatePodSpec`.
pub fn validate_pod_spec(spec: &PodSpec, path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    let volumes = validate_volumes(
        spec.volumes.as_deref().unwrap_or_default(),
        &path.child("volumes"),
        &mut errs,
    );
    let containers_path = path.child("containers");
    if spec.containers.is_empty() {
        errs.push(FieldError::required(&containers_path, ""));
    }
    let mut container_names = HashSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let p = containers_path.index(i);
        validate_container_common(c, &volumes, &p, &mut errs);
        if !container_names.insert(c.name.as_str()) {
            errs.push(FieldError::duplicate(&p.child("name"), &c.name));
        }
        validate_probe(c.liveness_probe.as_ref(), &p.child("livenessProbe"), true, &mut errs);
        validate_probe(c.readiness_probe.as_ref(), &p.child("readinessProbe"), false, &mut errs);
        validate_probe(c.startup_probe.as_ref(), &p.child("startupProbe"), true, &mut errs);
        if c.restart_policy.is_some() {
            errs.push(FieldError::forbidden(
                &p.child("restartPolicy"),
                "may not be set for non-init containers",
            ));
        }
    }
    check_host_port_conflicts(&spec.containers, &containers_path, &mut errs);
    let init_path = path.child("initContainers");
    let mut init_names = HashSet::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let p = init_path.index(i);
        if container_names.contains(c.name.as_str()) || !init_names.insert(c.name.as_str()) {
            errs.push(FieldError::duplicate(&p.child("name"), &c.name));
        }
        validate_container_common(c, &volumes, &p, &mut errs);
        match c.restart_policy.as_deref() {
            Some("Always") => {
                validate_probe(
                    c.liveness_probe.as_ref(),
                    &p.child("livenessProbe"),
                    true,
                    &mut errs,
                );
                validate_probe(
                    c.readiness_probe.as_ref(),
                    &p.child("readinessProbe"),
                    false,
                    &mut errs,
                );
                validate_probe(c.startup_probe.as_ref(), &p.child("startupProbe"), true, &mut errs);
            }
            other => {
                if let Some(rp) = other {
                    errs.push(FieldError::not_supported(
                        &p.child("restartPolicy"),
                        rp,
                        &["Always"],
                    ));
                }
                for (set, name) in [
                    (c.lifecycle.is_some(), "lifecycle"),
                    (c.liveness_probe.is_some(), "livenessProbe"),
                    (c.readiness_probe.is_some(), "readinessProbe"),
                    (c.startup_probe.is_some(), "startupProbe"),
                ] {
                    if set {
                        errs.push(FieldError::forbidden(
                            &p.child(name),
                            "may not be set for init containers without restartPolicy=Always",
                        ));
                    }
                }
            }
        }
    }
    match spec.restart_policy.as_deref().unwrap_or_default() {
        "Always" | "OnFailure" | "Never" => {}
        "" => errs.push(FieldError::required(&path.child("restartPolicy"), "")),
        other => errs.push(FieldError::not_supported(
            &path.child("restartPolicy"),
            other,
            &["Always", "OnFailure", "Never"],
        )),
    }
    if let Some(sc) = &spec.security_context {
        let sp = path.child("securityContext");
        id_in_range(sc.run_as_user, &sp.child("runAsUser"), &mut errs);
        id_in_range(sc.run_as_group, &sp.child("runAsGroup"), &mut errs);
        id_in_range(sc.fs_group, &sp.child("fsGroup"), &mut errs);
        for (i, g) in sc.supplemental_groups.iter().flatten().enumerate() {
            id_in_range(Some(*g), &sp.child("supplementalGroups").index(i), &mut errs);
        }
    }
    let dns_policy = spec.dns_policy.as_deref().unwrap_or_default();
    match dns_policy {
        "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None" => {}
        "" => errs.push(FieldError::required(&path.child("dnsPolicy"), "")),
        other => errs.push(FieldError::not_supported(
            &path.child("dnsPolicy"),
            other,
            &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
        )),
    }
    validate_dns_config(spec, dns_policy, &path.child("dnsConfig"), &mut errs);
    if let Some(ns) = &spec.node_selector {
        errs.extend(meta::validate_labels(ns, &path.child("nodeSelector")));
    }
    for (i, s) in spec.image_pull_secrets.iter().flatten().enumerate() {
        if s.name.is_empty() {
            errs.push(FieldError::required(
                &path.child("imagePullSecrets").index(i).child("name"),
                "",
            ));
        }
    }
    let name_checks = [
        (&spec.service_account_name, "serviceAccountName"),
        (&spec.node_name, "nodeName"),
        (&spec.priority_class_name, "priorityClassName"),
    ];
    for (v, name) in name_checks {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            for msg in names::is_dns1123_subdomain(v) {
                errs.push(FieldError::invalid(&path.child(name), v, msg));
            }
        }
    }
    for (v, name) in [(&spec.hostname, "hostname"), (&spec.subdomain, "subdomain")] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            for msg in names::is_dns1123_label(v) {
                errs.push(FieldError::invalid(&path.child(name), v, msg));
            }
        }
    }
    if let Some(ads) = spec.active_deadline_seconds
        && !(1..=i64::from(i32::MAX)).contains(&ads)
    {
        errs.push(FieldError::invalid(
            &path.child("activeDeadlineSeconds"),
            ads,
            names::inclusive_range_error(1, i64::from(i32::MAX)),
        ));
    }
    if let Some(ts) = &spec.tolerations {
        errs.extend(validate_tolerations(ts, &path.child("tolerations")));
    }
    if let Some(a) = &spec.affinity {
        scheduling::validate_affinity(a, &path.child("affinity"), &mut errs);
    }
    if let Some(c) = &spec.topology_spread_constraints {
        scheduling::validate_topology_spread(
            c,
            &path.child("topologySpreadConstraints"),
            &mut errs,
        );
    }
    if spec.host_network == Some(true) {
        for (i, c) in spec.containers.iter().enumerate() {
            for (j, p) in c.ports.iter().flatten().enumerate() {
                let hp = p.host_port.unwrap_or(0);
                // Templates keep hostPort unset (0); pods have it defaulted.
                if hp != 0 && hp != p.container_port {
                    errs.push(FieldError::invalid(
                        &containers_path.index(i).child("ports").index(j).child("hostPort"),
                        hp,
                        "must match `containerPort` when `hostNetwork` is true",
                    ));
                }
            }
        }
    }
    if let Some(pp) = spec.preemption_policy.as_deref()
        && !matches!(pp, "PreemptLowerPriority" | "Never")
    {
        errs.push(FieldError::not_supported(
            &path.child("preemptionPolicy"),
            pp,
            &["Never", "PreemptLowerPriority"],
        ));
    }
    errs
}

fn validate_dns_config(spec: &PodSpec, policy: &str, path: &Path, errs: &mut ErrorList) {
    let Some(cfg) = &spec.dns_config else {
        if policy == "None" {
            errs.push(FieldError::required(
                path,
                "must provide `dnsConfig` when `dnsPolicy` is None",
            ));
        }
        return;
    };
    let servers = cfg.nameservers.as_deref().unwrap_or_default();
    if policy == "None" && servers.is_empty() {
        errs.push(FieldError::required(
            &path.child("nameservers"),
            "must provide at least one DNS nameserver when `dnsPolicy` is None",
        ));
    }
    if servers.len() > 3 {
        errs.push(FieldError::invalid(
            &path.child("nameservers"),
            go_string_list(servers),
            "must not have more than 3 nameservers",
        ));
    }
    for (i, s) in servers.iter().enumerate() {
        if names::parse_ip(s).is_none() {
            errs.push(FieldError::invalid(&path.child("nameservers").index(i), s, names::IP_ERROR));
        }
    }
}

/// The (name, set) pairs of a volume's sources in upstream's checking order.
fn volume_sources(v: &Volume) -> [(&'static str, bool); 30] {
    [
        ("hostPath", v.host_path.is_some()),
        ("emptyDir", v.empty_dir.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("secret", v.secret.is_some()),
        ("nfs", v.nfs.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("persistentVolumeClaim", v.persistent_volume_claim.is_some()),
        ("rbd", v.rbd.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("cinder", v.cinder.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("flocker", v.flocker.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("fc", v.fc.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("configMap", v.config_map.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("projected", v.projected.is_some()),
        ("storageos", v.storageos.is_some()),
        ("csi", v.csi.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("image", v.image.is_some()),
    ]
}

const FILE_MODE_ERROR: &str = "must be a number between 0 and 0777 (octal), both inclusive";

/// `ValidateVolumes`: returns the names of the valid volumes.
fn validate_volumes<'a>(vols: &'a [Volume], path: &Path, errs: &mut ErrorList) -> HashSet<&'a str> {
    let mut names_ok = HashSet::new();
    for (i, v) in vols.iter().enumerate() {
        let p = path.index(i);
        let mut el = ErrorList::new();
        let set: Vec<&str> =
            volume_sources(v).into_iter().filter_map(|(n, s)| s.then_some(n)).collect();
        match set.as_slice() {
            [] => el.push(FieldError::required(&p, "must specify a volume type")),
            [_] => {}
            [_, second, ..] => el.push(FieldError::forbidden(
                &p.child(second),
                "may not specify more than 1 volume type",
            )),
        }
        if let Some(s) = &v.secret {
            if s.secret_name.as_deref().unwrap_or_default().is_empty() {
                el.push(FieldError::required(&p.child("secret").child("secretName"), ""));
            }
            check_mode(s.default_mode, &p.child("secret").child("defaultMode"), &mut el);
            key_to_path_items(s.items.as_deref(), &p.child("secret").child("items"), &mut el);
        }
        if let Some(c) = &v.config_map {
            if c.name.is_empty() {
                el.push(FieldError::required(&p.child("configMap").child("name"), ""));
            }
            check_mode(c.default_mode, &p.child("configMap").child("defaultMode"), &mut el);
            key_to_path_items(c.items.as_deref(), &p.child("configMap").child("items"), &mut el);
        }
        if let Some(h) = &v.host_path {
            if h.path.is_empty() {
                el.push(FieldError::required(&p.child("hostPath").child("path"), ""));
            }
            let t = h.type_.as_deref().unwrap_or_default();
            if !HOST_PATH_TYPES.contains(&t) {
                el.push(FieldError::not_supported(
                    &p.child("hostPath").child("type"),
                    t,
                    HOST_PATH_TYPES,
                ));
            }
        }
        if let Some(c) = &v.persistent_volume_claim
            && c.claim_name.is_empty()
        {
            el.push(FieldError::required(&p.child("persistentVolumeClaim").child("claimName"), ""));
        }
        if let Some(e) = &v.empty_dir
            && let Some(limit) = &e.size_limit
        {
            match Quantity::parse(&limit.0) {
                None => el.push(FieldError::invalid(
                    &p.child("emptyDir").child("sizeLimit"),
                    &limit.0,
                    QUANTITY_FORMAT_ERROR,
                )),
                Some(q) if q.is_negative() => el.push(FieldError::forbidden(
                    &p.child("emptyDir").child("sizeLimit"),
                    "SizeLimit field must be a valid resource quantity",
                )),
                Some(_) => {}
            }
        }
        let np = p.child("name");
        if v.name.is_empty() {
            el.push(FieldError::required(&np, ""));
        } else {
            for msg in names::is_dns1123_label(&v.name) {
                el.push(FieldError::invalid(&np, &v.name, msg));
            }
        }
        if names_ok.contains(v.name.as_str()) {
            el.push(FieldError::duplicate(&np, &v.name));
        }
        if el.is_empty() {
            names_ok.insert(v.name.as_str());
        } else {
            errs.extend(el);
        }
    }
    names_ok
}

/// Upstream `IsValidUserID`/`IsValidGroupID`: 0..=2147483647.
fn id_in_range(id: Option<i64>, path: &Path, errs: &mut ErrorList) {
    if let Some(id) = id
        && !(0..=i64::from(i32::MAX)).contains(&id)
    {
        errs.push(FieldError::invalid(
            path,
            id,
            names::inclusive_range_error(0, i64::from(i32::MAX)),
        ));
    }
}

/// Upstream `validateKeyToPathItems`.
fn key_to_path_items(
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    path: &Path,
    errs: &mut ErrorList,
) {
    for (i, kp) in items.unwrap_or_default().iter().enumerate() {
        let ip = path.index(i);
        if kp.key.is_empty() {
            errs.push(FieldError::required(&ip.child("key"), ""));
        }
        if kp.path.is_empty() {
            errs.push(FieldError::required(&ip.child("path"), ""));
        }
        validate_local_descending_path(&kp.path, &ip.child("path"), errs);
        if kp.path.starts_with("..") && !kp.path.starts_with("../") {
            errs.push(FieldError::invalid(&ip.child("path"), &kp.path, "must not start with '..'"));
        }
        check_mode(kp.mode, &ip.child("mode"), errs);
    }
}

fn check_mode(mode: Option<i32>, path: &Path, errs: &mut ErrorList) {
    if let Some(m) = mode
        && !(0..=0o777).contains(&m)
    {
        errs.push(FieldError::invalid(path, m, FILE_MODE_ERROR));
    }
}

/// `validateContainerCommon`.
fn validate_container_common(
    c: &Container,
    volumes: &HashSet<&str>,
    p: &Path,
    errs: &mut ErrorList,
) {
    let np = p.child("name");
    if c.name.is_empty() {
        errs.push(FieldError::required(&np, ""));
    } else {
        for msg in names::is_dns1123_label(&c.name) {
            errs.push(FieldError::invalid(&np, &c.name, msg));
        }
    }
    if c.image.as_deref().unwrap_or_default().is_empty() {
        errs.push(FieldError::required(&p.child("image"), ""));
    }
    match c.termination_message_policy.as_deref().unwrap_or_default() {
        "File" | "FallbackToLogsOnError" => {}
        "" => errs.push(FieldError::required(&p.child("terminationMessagePolicy"), "")),
        other => errs.push(FieldError::not_supported(
            &p.child("terminationMessagePolicy"),
            other,
            &["File", "FallbackToLogsOnError"],
        )),
    }
    validate_container_ports(c.ports.as_deref().unwrap_or_default(), &p.child("ports"), errs);
    validate_env(c.env.as_deref().unwrap_or_default(), &p.child("env"), errs);
    validate_volume_mounts(
        c.volume_mounts.as_deref().unwrap_or_default(),
        volumes,
        &p.child("volumeMounts"),
        errs,
    );
    // Upstream: a mount that propagates back to the host is for privileged containers only.
    let privileged = c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if m.mount_propagation.as_deref() == Some("Bidirectional") && !privileged {
            errs.push(FieldError::forbidden(
                &p.child("volumeMounts").index(i).child("mountPropagation"),
                "Bidirectional mount propagation is available only to privileged containers",
            ));
        }
    }
    match c.image_pull_policy.as_deref().unwrap_or_default() {
        "Always" | "IfNotPresent" | "Never" => {}
        "" => errs.push(FieldError::required(&p.child("imagePullPolicy"), "")),
        other => errs.push(FieldError::not_supported(
            &p.child("imagePullPolicy"),
            other,
            &["Always", "IfNotPresent", "Never"],
        )),
    }
    if let Some(r) = &c.resources {
        validate_resources(r, &p.child("resources"), errs);
    }
    if let Some(sc) = &c.security_context {
        let sp = p.child("securityContext");
        id_in_range(sc.run_as_user, &sp.child("runAsUser"), errs);
        id_in_range(sc.run_as_group, &sp.child("runAsGroup"), errs);
        if sc.allow_privilege_escalation == Some(false) {
            if sc.privileged == Some(true) {
                errs.push(FieldError::invalid(
                    &sp,
                    json_value(sc),
                    "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
                ));
            }
            let adds = sc.capabilities.as_ref().and_then(|c| c.add.as_ref());
            if adds.is_some_and(|a| a.iter().any(|c| c == "CAP_SYS_ADMIN")) {
                errs.push(FieldError::invalid(
                    &sp,
                    json_value(sc),
                    "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN",
                ));
            }
        }
    }
    if let Some(lc) = &c.lifecycle {
        let lp = p.child("lifecycle");
        for (h, name) in [(&lc.post_start, "postStart"), (&lc.pre_stop, "preStop")] {
            if let Some(h) = h {
                validate_handler(
                    [
                        ("exec", h.exec.is_some()),
                        ("httpGet", h.http_get.is_some()),
                        ("tcpSocket", h.tcp_socket.is_some()),
                        ("sleep", h.sleep.is_some()),
                    ],
                    h.http_get.as_ref(),
                    h.tcp_socket.as_ref().map(|t| &t.port),
                    &lp.child(name),
                    errs,
                );
            }
        }
    }
}

fn validate_container_ports(ports: &[ContainerPort], path: &Path, errs: &mut ErrorList) {
    let mut seen = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = path.index(i);
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            let msgs = names::is_valid_port_name(name);
            if !msgs.is_empty() {
                for m in msgs {
                    errs.push(FieldError::invalid(&p.child("name"), name, m));
                }
            } else if !seen.insert(name) {
                errs.push(FieldError::duplicate(&p.child("name"), name));
            }
        }
        if port.container_port == 0 {
            errs.push(FieldError::required(&p.child("containerPort"), ""));
        } else {
            for m in names::is_valid_port_num(i64::from(port.container_port)) {
                errs.push(FieldError::invalid(&p.child("containerPort"), port.container_port, m));
            }
        }
        if let Some(hp) = port.host_port.filter(|&h| h != 0) {
            for m in names::is_valid_port_num(i64::from(hp)) {
                errs.push(FieldError::invalid(&p.child("hostPort"), hp, m));
            }
        }
        validate_protocol(port.protocol.as_deref(), &p.child("protocol"), errs);
    }
}

/// Upstream `AccumulateUniqueHostPorts`: a protocol/hostIP/hostPort is used once.
fn check_host_port_conflicts(containers: &[Container], path: &Path, errs: &mut ErrorList) {
    let mut seen = HashSet::new();
    for (ci, c) in containers.iter().enumerate() {
        for (pi, p) in c.ports.iter().flatten().enumerate() {
            let Some(hp) = p.host_port.filter(|h| *h != 0) else {
                continue;
            };
            let key = format!(
                "{}/{}/{hp}",
                p.protocol.as_deref().unwrap_or_default(),
                p.host_ip.as_deref().unwrap_or_default()
            );
            if !seen.insert(key.clone()) {
                errs.push(FieldError::duplicate(
                    &path.index(ci).child("ports").index(pi).child("hostPort"),
                    key,
                ));
            }
        }
    }
}

pub fn validate_protocol(proto: Option<&str>, path: &Path, errs: &mut ErrorList) {
    match proto.unwrap_or_default() {
        "TCP" | "UDP" | "SCTP" => {}
        "" => errs.push(FieldError::required(path, "")),
        other => errs.push(FieldError::not_supported(path, other, &["SCTP", "TCP", "UDP"])),
    }
}

fn validate_env(env: &[EnvVar], path: &Path, errs: &mut ErrorList) {
    for (i, ev) in env.iter().enumerate() {
        let p = path.index(i);
        if ev.name.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        } else {
            for m in names::is_relaxed_env_var_name(&ev.name) {
                errs.push(FieldError::invalid(&p.child("name"), &ev.name, m));
            }
        }
        let Some(vf) = &ev.value_from else { continue };
        let vp = p.child("valueFrom");
        let n = [
            vf.field_ref.is_some(),
            vf.resource_field_ref.is_some(),
            vf.config_map_key_ref.is_some(),
            vf.secret_key_ref.is_some(),
        ]
        .iter()
        .filter(|s| **s)
        .count();
        if n == 0 {
            errs.push(FieldError::invalid(
                &vp,
                "",
                "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
            ));
        } else if ev.value.as_deref().is_some_and(|v| !v.is_empty()) {
            errs.push(FieldError::invalid(
                &vp,
                "",
                "may not be specified when `value` is not empty",
            ));
        } else if n > 1 {
            errs.push(FieldError::invalid(
                &vp,
                "",
                "may not have more than one field specified at a time",
            ));
        }
        let key_refs = [
            ("configMapKeyRef", vf.config_map_key_ref.as_ref().map(|r| (&r.name, &r.key))),
            ("secretKeyRef", vf.secret_key_ref.as_ref().map(|r| (&r.name, &r.key))),
        ];
        for (name, r) in key_refs {
            let Some((ref_name, key)) = r else { continue };
            let rp = vp.child(name);
            if ref_name.is_empty() {
                errs.push(FieldError::required(&rp.child("name"), ""));
            }
            if key.is_empty() {
                errs.push(FieldError::required(&rp.child("key"), ""));
            } else {
                for m in names::is_config_map_key(key) {
                    errs.push(FieldError::invalid(&rp.child("key"), key, m));
                }
            }
        }
        if let Some(fr) = &vf.field_ref
            && fr.field_path.is_empty()
        {
            errs.push(FieldError::required(&vp.child("fieldRef").child("fieldPath"), ""));
        }
    }
}

fn validate_volume_mounts(
    mounts: &[VolumeMount],
    volumes: &HashSet<&str>,
    path: &Path,
    errs: &mut ErrorList,
) {
    let mut points = HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let p = path.index(i);
        if m.name.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        }
        if !volumes.contains(m.name.as_str()) {
            errs.push(FieldError::not_found(&p.child("name"), &m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(FieldError::required(&p.child("mountPath"), ""));
        }
        if !points.insert(m.mount_path.as_str()) {
            errs.push(FieldError::invalid(&p.child("mountPath"), &m.mount_path, "must be unique"));
        }
        if let Some(sp) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            validate_local_descending_path(sp, &path.child("subPath"), errs);
        }
        if let Some(mp) = m.mount_propagation.as_deref()
            && !matches!(mp, "None" | "HostToContainer" | "Bidirectional")
        {
            errs.push(FieldError::not_supported(
                &p.child("mountPropagation"),
                mp,
                &["Bidirectional", "HostToContainer", "None"],
            ));
        }
    }
}

fn validate_local_descending_path(target: &str, path: &Path, errs: &mut ErrorList) {
    if target.starts_with('/') {
        errs.push(FieldError::invalid(path, target, "must be a relative path"));
    }
    if target.split('/').any(|part| part == "..") {
        errs.push(FieldError::invalid(path, target, "must not contain '..'"));
    }
}

fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

fn validate_resources(r: &ResourceRequirements, path: &Path, errs: &mut ErrorList) {
    let lim_path = path.child("limits");
    let req_path = path.child("requests");
    let empty = BTreeMap::new();
    let limits = r.limits.as_ref().unwrap_or(&empty);
    let requests = r.requests.as_ref().unwrap_or(&empty);
    let mut parsed_limits = BTreeMap::new();
    for (name, q) in limits {
        let p = lim_path.key(name);
        validate_resource_name(name, &p, errs);
        if let Some(q) = validate_quantity(&q.0, &p, errs) {
            parsed_limits.insert(name.as_str(), q);
        }
    }
    for (name, q) in requests {
        let p = req_path.key(name);
        validate_resource_name(name, &p, errs);
        let Some(parsed) = validate_quantity(&q.0, &p, errs) else {
            continue;
        };
        let overcommit = is_native_resource(name) && !name.starts_with("hugepages-");
        match parsed_limits.get(name.as_str()) {
            Some(lim) => {
                let lim_str = &limits[name].0;
                if parsed != *lim && !overcommit {
                    errs.push(FieldError::invalid(
                        &req_path,
                        &q.0,
                        format!("must be equal to {name} limit of {lim_str}"),
                    ));
                } else if parsed > *lim {
                    errs.push(FieldError::invalid(
                        &req_path,
                        &q.0,
                        format!("must be less than or equal to {name} limit of {lim_str}"),
                    ));
                }
            }
            None if !overcommit && !limits.contains_key(name) => errs.push(FieldError::required(
                &lim_path,
                "Limit must be set for non overcommitable resources",
            )),
            None => {}
        }
    }
}

fn validate_resource_name(name: &str, path: &Path, errs: &mut ErrorList) {
    for m in names::is_qualified_name(name) {
        errs.push(FieldError::invalid(path, name, m));
    }
    if !name.contains('/') {
        let standard = matches!(name, "cpu" | "memory" | "ephemeral-storage")
            || name.starts_with("hugepages-");
        if !standard {
            errs.push(FieldError::invalid(
                path,
                name,
                "must be a standard resource for containers",
            ));
        }
    }
}

/// Parses a quantity, reporting a malformed or negative one; returns it when usable.
pub fn validate_quantity(s: &str, path: &Path, errs: &mut ErrorList) -> Option<Quantity> {
    match Quantity::parse(s) {
        None => {
            errs.push(FieldError::invalid(path, s, QUANTITY_FORMAT_ERROR));
            None
        }
        Some(q) if q.is_negative() => {
            errs.push(FieldError::invalid(path, s, NEGATIVE));
            None
        }
        Some(q) => Some(q),
    }
}

fn validate_probe(probe: Option<&Probe>, path: &Path, must_be_one: bool, errs: &mut ErrorList) {
    let Some(pr) = probe else { return };
    validate_handler(
        [
            ("exec", pr.exec.is_some()),
            ("httpGet", pr.http_get.is_some()),
            ("tcpSocket", pr.tcp_socket.is_some()),
            ("grpc", pr.grpc.is_some()),
        ],
        pr.http_get.as_ref(),
        pr.tcp_socket.as_ref().map(|t| &t.port),
        path,
        errs,
    );
    for (v, name) in [
        (pr.initial_delay_seconds, "initialDelaySeconds"),
        (pr.timeout_seconds, "timeoutSeconds"),
        (pr.period_seconds, "periodSeconds"),
        (pr.success_threshold, "successThreshold"),
        (pr.failure_threshold, "failureThreshold"),
    ] {
        nonnegative(errs, v.map(i64::from), &path.child(name));
    }
    if let Some(g) = pr.termination_grace_period_seconds {
        if !must_be_one {
            errs.push(FieldError::invalid(
                &path.child("terminationGracePeriodSeconds"),
                g,
                "must not be set for readinessProbes",
            ));
        } else if g <= 0 {
            errs.push(FieldError::invalid(
                &path.child("terminationGracePeriodSeconds"),
                g,
                "must be greater than 0",
            ));
        }
    }
    if must_be_one
        && let Some(s) = pr.success_threshold
        && s != 1
    {
        errs.push(FieldError::invalid(&path.child("successThreshold"), s, "must be 1"));
    }
}

fn validate_handler(
    kinds: [(&str, bool); 4],
    http_get: Option<&k8s_openapi::api::core::v1::HTTPGetAction>,
    tcp_port: Option<&IntOrString>,
    path: &Path,
    errs: &mut ErrorList,
) {
    let set: Vec<&str> = kinds.iter().filter_map(|(n, s)| s.then_some(*n)).collect();
    match set.as_slice() {
        [] => errs.push(FieldError::required(path, "must specify a handler type")),
        [_] => {}
        [_, second, ..] => errs.push(FieldError::forbidden(
            &path.child(second),
            "may not specify more than 1 handler type",
        )),
    }
    if let Some(g) = http_get {
        let gp = path.child("httpGet");
        if g.path.as_deref().unwrap_or_default().is_empty() {
            errs.push(FieldError::required(&gp.child("path"), ""));
        }
        validate_port_num_or_name(&g.port, &gp.child("port"), errs);
        if let Some(s) = g.scheme.as_deref()
            && !matches!(s, "HTTP" | "HTTPS")
        {
            errs.push(FieldError::not_supported(&gp.child("scheme"), s, &["HTTP", "HTTPS"]));
        }
    }
    if let Some(port) = tcp_port {
        validate_port_num_or_name(port, &path.child("tcpSocket").child("port"), errs);
    }
}

pub fn validate_port_num_or_name(port: &IntOrString, path: &Path, errs: &mut ErrorList) {
    match port {
        IntOrString::Int(n) => {
            for m in names::is_valid_port_num(i64::from(*n)) {
                errs.push(FieldError::invalid(path, *n, m));
            }
        }
        IntOrString::String(s) => {
            for m in names::is_valid_port_name(s) {
                errs.push(FieldError::invalid(path, s, m));
            }
        }
    }
}

pub fn validate_tolerations(ts: &[Toleration], path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    for (i, t) in ts.iter().enumerate() {
        let p = path.index(i);
        let key = t.key.as_deref().unwrap_or_default();
        let op = t.operator.as_deref().unwrap_or_default();
        let effect = t.effect.as_deref().unwrap_or_default();
        let value = t.value.as_deref().unwrap_or_default();
        if !key.is_empty() {
            for m in names::is_qualified_name(key) {
                errs.push(FieldError::invalid(&p.child("key"), key, m));
            }
        }
        if key.is_empty() && op != "Exists" {
            errs.push(FieldError::invalid(
                &p.child("operator"),
                op,
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        if t.toleration_seconds.is_some() && effect != "NoExecute" {
            errs.push(FieldError::invalid(
                &p.child("effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        match op {
            "Equal" | "" => {
                let m = names::is_valid_label_value(value);
                if !m.is_empty() {
                    errs.push(FieldError::invalid(&p.child("operator"), value, m.join(";")));
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    errs.push(FieldError::invalid(
                        &p.child("operator"),
                        Raw(serde_json::to_string(t).unwrap_or_default()),
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
            other => errs.push(FieldError::not_supported(
                &p.child("operator"),
                other,
                &["Equal", "Exists"],
            )),
        }
        if !effect.is_empty() {
            validate_taint_effect(effect, &p.child("effect"), &mut errs);
        }
    }
    errs
}

pub fn validate_taint_effect(effect: &str, path: &Path, errs: &mut ErrorList) {
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        errs.push(FieldError::not_supported(
            path,
            effect,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        ));
    }
}

/// `ValidatePodUpdate`'s spec part: only images, activeDeadlineSeconds, added tolerations
/// and a negative grace period turned into 1 may change.
fn validate_pod_spec_update(new: &PodSpec, old: &PodSpec, path: &Path) -> ErrorList {
    let mut errs = ErrorList::new();
    let empty = Vec::new();
    for (n, o, name) in [
        (&new.containers, &old.containers, "containers"),
        (
            new.init_containers.as_ref().unwrap_or(&empty),
            old.init_containers.as_ref().unwrap_or(&empty),
            "initContainers",
        ),
    ] {
        let p = path.child(name);
        if n.len() != o.len() {
            errs.push(FieldError::forbidden(&p, "pod updates may not add or remove containers"));
            return errs;
        }
        for (i, c) in n.iter().enumerate() {
            let image = c.image.as_deref().unwrap_or_default();
            if image.is_empty() {
                errs.push(FieldError::required(&p.index(i).child("image"), ""));
            }
            if image.trim().len() != image.len() {
                errs.push(FieldError::invalid(
                    &p.index(i).child("image"),
                    image,
                    "must not have leading or trailing whitespace",
                ));
            }
        }
    }
    let ads_path = path.child("activeDeadlineSeconds");
    match (new.active_deadline_seconds, old.active_deadline_seconds) {
        (Some(n), _) if !(0..=i64::from(i32::MAX)).contains(&n) => {
            errs.push(FieldError::invalid(
                &ads_path,
                n,
                names::inclusive_range_error(0, i64::from(i32::MAX)),
            ));
            return errs;
        }
        (Some(n), Some(o)) if o < n => {
            errs.push(FieldError::invalid(
                &ads_path,
                n,
                "must be less than or equal to previous value",
            ));
            return errs;
        }
        (None, Some(_)) => errs.push(FieldError::invalid(
            &ads_path,
            Raw("null".into()),
            "must not update from a positive integer to nil value",
        )),
        _ => {}
    }
    let empty_t = Vec::new();
    let new_t = new.tolerations.as_ref().unwrap_or(&empty_t);
    for o in old.tolerations.iter().flatten() {
        let found = new_t.iter().any(|n| {
            n.key == o.key && n.operator == o.operator && n.value == o.value && n.effect == o.effect
        });
        if !found {
            errs.push(FieldError::forbidden(
                &path.child("tolerations"),
                "existing toleration can not be modified except its tolerationSeconds",
            ));
            break;
        }
    }
    if new == old {
        return errs;
    }
    let mut munged = new.clone();
    for (m, o) in munged.containers.iter_mut().zip(&old.containers) {
        m.image.clone_from(&o.image);
    }
    if let (Some(mi), Some(oi)) = (munged.init_containers.as_mut(), old.init_containers.as_ref()) {
        for (m, o) in mi.iter_mut().zip(oi) {
            m.image.clone_from(&o.image);
        }
    }
    munged.active_deadline_seconds = old.active_deadline_seconds;
    munged.scheduling_gates.clone_from(&old.scheduling_gates);
    munged.tolerations.clone_from(&old.tolerations);
    if old.termination_grace_period_seconds.is_some_and(|g| g < 0)
        && munged.termination_grace_period_seconds == Some(1)
    {
        munged.termination_grace_period_seconds = old.termination_grace_period_seconds;
    }
    if munged != *old {
        errs.push(FieldError::forbidden(
            path,
            format!(
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n{}",
                spec_diff(old, &munged)
            ),
        ));
    }
    errs
}

/// A short description of which spec fields differ (upstream prints a `cmp.Diff`).
fn spec_diff(old: &PodSpec, new: &PodSpec) -> String {
    let o = serde_json::to_value(old).unwrap_or_default();
    let n = serde_json::to_value(new).unwrap_or_default();
    let (Some(o), Some(n)) = (o.as_object(), n.as_object()) else {
        return String::new();
    };
    let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = String::from("  core.PodSpec{\n");
    for k in keys {
        if o.get(k) != n.get(k) {
            let show = |v: Option<&Value>| v.map_or_else(|| "nil".to_string(), Value::to_string);
            out.push_str(&format!("-  {k}: {}\n+  {k}: {}\n", show(o.get(k)), show(n.get(k))));
        }
    }
    out.push_str("  }\n");
    out
}

/// `ValidatePodStatusUpdate`: metadata, phase values, no way back from a terminal phase.
pub fn validate_pod_status(new: &Value, old: Option<&Value>) -> ErrorList {
    let pod: Pod = match typed(new) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let old_pod: Option<Pod> = match old.map(typed).transpose() {
        Ok(p) => p,
        Err(e) => return e,
    };
    let mut errs = validate_meta(POD, &pod.metadata, old_pod.as_ref().map(|p| &p.metadata));
    let status = pod.status.unwrap_or_default();
    let phase_path = Path::root("status").child("phase");
    let phase = status.phase.as_deref().unwrap_or_default();
    if !matches!(phase, "" | "Pending" | "Running" | "Succeeded" | "Failed" | "Unknown") {
        errs.push(FieldError::not_supported(
            &phase_path,
            phase,
            &["Failed", "Pending", "Running", "Succeeded", "Unknown"],
        ));
    }
    if let Some(old_phase) =
        old_pod.as_ref().and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref())
        && matches!(old_phase, "Succeeded" | "Failed")
        && phase != old_phase
    {
        errs.push(FieldError::invalid(
            &phase_path,
            phase,
            format!("may not be transitioned to non-terminal state from {old_phase}"),
        ));
    }
    let old_node = old_pod
        .as_ref()
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    if !old_node.is_empty() {
        let new_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default();
        if new_node != old_node {
            errs.push(FieldError::forbidden(
                &Path::root("status").child("nodeName"),
                "may not be changed directly",
            ));
        }
    }
    for (i, ip) in status.pod_ips.iter().flatten().enumerate() {
        if names::parse_ip(&ip.ip).is_none() {
            errs.push(FieldError::invalid(
                &Path::root("status").child("podIPs").index(i).child("ip"),
                &ip.ip,
                names::IP_ERROR,
            ));
        }
    }
    errs
}
