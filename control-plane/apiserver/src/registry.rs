//! The served resources: one entry per kind with its URL names, store prefix, the typed
//! round-trip that prunes unknown fields, and its selectable fields.

use k8s_openapi::api::{
    admissionregistration, apps, autoscaling, batch, certificates, coordination, core, discovery,
    networking, policy, rbac, scheduling, storage,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::{Arc, RwLock};

use skiff_core::json::ValueAt;
use skiff_machinery::{ResourceDesc, SubresourceDesc};

/// A served kind and what the generic handlers need to know about it.
pub struct ResourceType {
    pub desc: ResourceDesc,
    /// Decode into the typed struct and encode again: prunes unknown fields and rejects
    /// wrongly typed values, as upstream's decoder does.
    pub normalize: Normalizer,
    /// Selectable fields besides metadata.name / metadata.namespace.
    pub fields: &'static [&'static str],
    /// metadata.generation is kept and bumped on spec changes.
    pub tracks_generation: bool,
    /// The resource has a status subresource (writes to the main resource keep status).
    pub has_status: bool,
    /// What a CustomResourceDefinition says of a custom resource (`None`: built-in).
    pub custom: Option<Arc<crate::custom::CustomInfo>>,
}

impl ResourceType {
    pub fn group(&self) -> &'static str {
        self.desc.group
    }

    pub fn kind(&self) -> &'static str {
        self.desc.kind
    }

    pub fn plural(&self) -> &'static str {
        self.desc.plural
    }

    /// "deployments.apps", "pods": how upstream names the resource in messages.
    pub fn qualified(&self) -> String {
        if self.desc.group.is_empty() {
            self.desc.plural.to_string()
        } else {
            format!("{}.{}", self.desc.plural, self.desc.group)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.desc.kind)
    }

    /// Store key prefix of every object of this resource: `/registry/<group>/<plural>/`.
    pub fn prefix(&self) -> String {
        self.key_with(&[])
    }

    /// `/registry/<group>/<plural>/<namespace>/<name>` (no namespace for cluster-scoped
    /// resources). Built by pushing the parts (a create asks for about three keys, and two
    /// `format!` calls each were 1.5k instructions).
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.desc.namespaced => self.key_with(&[ns, "/", name]),
            _ => self.key_with(&[name]),
        }
    }

    pub fn namespace_prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.desc.namespaced => self.key_with(&[ns, "/"]),
            _ => self.prefix(),
        }
    }

    /// The prefix followed by `rest`.
    fn key_with(&self, rest: &[&str]) -> String {
        let group = if self.desc.group.is_empty() { "core" } else { self.desc.group };
        let parts = ["/registry/", group, "/", self.desc.plural, "/"];
        let len = parts.iter().chain(rest).map(|p| p.len()).sum();
        let mut key = String::with_capacity(len);
        for part in parts.iter().chain(rest) {
            key.push_str(part);
        }
        key
    }

    pub fn has_subresource(&self, name: &str) -> bool {
        self.desc.subresources.iter().any(|s| s.name == name)
    }

    pub fn supports_field(&self, field: &str) -> bool {
        matches!(field, "metadata.name" | "metadata.namespace") || self.fields.contains(&field)
    }

    /// The selectable field values of an object.
    pub fn field_values(&self, obj: &Value) -> Vec<(&'static str, String)> {
        field_values(self.fields, self.custom.is_some(), obj)
    }
}

/// `metadata.name`, `metadata.namespace` and `fields` of an object. A CRD's
/// selectableFields (`custom`) name their paths, and unset is "" (upstream's custom
/// resource strategy); a built-in kind's are as [`selectable_field`] says.
pub(crate) fn field_values(
    fields: &[&'static str],
    custom: bool,
    obj: &Value,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::with_capacity(2 + fields.len());
    out.push(("metadata.name", str_at(obj, &["metadata", "name"])));
    out.push(("metadata.namespace", str_at(obj, &["metadata", "namespace"])));
    for &f in fields {
        let (path, unset) = if custom { (f, "") } else { selectable_field(f) };
        let v = match path.split('.').try_fold(obj, |v, p| v.get(p)) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => unset.to_string(),
        };
        out.push((f, v));
    }
    out
}

/// Where a field selector's value is read from, and its value when the object leaves that
/// path unset. Upstream's `*ToSelectableFields` format typed fields: an unset bool is
/// "false" and an unset count "0" (`strconv.Itoa`), and two selectors name another path.
pub(crate) fn selectable_field(selector: &str) -> (&str, &'static str) {
    match selector {
        // Jobs: `strconv.Itoa(int(job.Status.Succeeded))`.
        "status.successful" => ("status.succeeded", "0"),
        // Events: `event.Source.Component`.
        "source" => ("source.component", ""),
        "spec.unschedulable" | "spec.hostNetwork" => (selector, "false"),
        "status.replicas" => (selector, "0"),
        _ => (selector, ""),
    }
}

pub fn str_at(obj: &Value, path: &[&str]) -> String {
    obj.at(path).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// A kind's typed round trip, consuming the value or reading a borrowed one.
#[derive(Clone, Copy)]
pub struct Normalizer {
    pub owned: fn(Value) -> Result<Value, serde_json::Error>,
    pub borrowed: fn(&Value) -> Result<Value, serde_json::Error>,
    /// The round trip straight from a JSON body, without building the body's own `Value`
    /// first: `None` unless the body decodes into the type with no error and no unknown
    /// field (what the borrowed round trip of the parsed body would then also give). Only
    /// the kinds written most often have it (see [`normalize_in_one_pass`]); for the others
    /// it is always `None`.
    pub clean_json: fn(&[u8]) -> Option<Value>,
}

const fn normalize<K: Serialize + DeserializeOwned>() -> Normalizer {
    fn owned<K: Serialize + DeserializeOwned>(v: Value) -> Result<Value, serde_json::Error> {
        serde_json::to_value(serde_json::from_value::<K>(v)?)
    }
    fn borrowed<K: Serialize + DeserializeOwned>(v: &Value) -> Result<Value, serde_json::Error> {
        serde_json::to_value(K::deserialize(v)?)
    }
    Normalizer { owned: owned::<K>, borrowed: borrowed::<K>, clean_json: |_| None }
}

/// [`normalize`] with the one-pass decode of clean JSON bodies. It is code generated per
/// kind (a decoder that reports skipped fields, about 170 KB of machine code each), so only
/// the kinds written far more often than the rest have it.
const fn normalize_in_one_pass<K: Serialize + DeserializeOwned>() -> Normalizer {
    fn clean_json<K: Serialize + DeserializeOwned>(body: &[u8]) -> Option<Value> {
        let mut unknown = false;
        let mut de = serde_json::Deserializer::from_slice(body);
        let typed: K = serde_ignored::deserialize(&mut de, |_| unknown = true).ok()?;
        de.end().ok()?;
        if unknown {
            return None;
        }
        serde_json::to_value(typed).ok()
    }
    Normalizer { clean_json: clean_json::<K>, ..normalize::<K>() }
}

pub(crate) const RW: &[&str] =
    &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
pub(crate) const STATUS: SubresourceDesc = SubresourceDesc {
    name: "status",
    kind: "",
    group: "",
    version: "",
    verbs: &["get", "patch", "update"],
};
/// certificatesigningrequests/approval: the Approved and Denied conditions only.
const APPROVAL: SubresourceDesc = SubresourceDesc {
    name: "approval",
    kind: "",
    group: "",
    version: "",
    verbs: &["get", "patch", "update"],
};
/// namespaces/finalize: the only way to change a Namespace's `spec.finalizers`.
const FINALIZE: SubresourceDesc =
    SubresourceDesc { name: "finalize", kind: "", group: "", version: "", verbs: &["update"] };
pub(crate) const SCALE: SubresourceDesc = SubresourceDesc {
    name: "scale",
    kind: "Scale",
    group: "autoscaling",
    version: "v1",
    verbs: &["get", "patch", "update"],
};
const BINDING: SubresourceDesc = SubresourceDesc {
    name: "binding",
    kind: "Binding",
    group: "",
    version: "v1",
    verbs: &["create"],
};

const EVICTION: SubresourceDesc = SubresourceDesc {
    name: "eviction",
    kind: "Eviction",
    group: "policy",
    version: "v1",
    verbs: &["create"],
};

/// A read-write resource without short names, categories or subresources (the
/// `with_*` methods add them).
const fn desc(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
) -> ResourceDesc {
    ResourceDesc {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        verbs: RW,
        short_names: &[],
        categories: &[],
        subresources: &[],
    }
}

/// Every served resource.
pub fn builtin() -> Vec<ResourceType> {
    let all: &[&str] = &["all"];
    vec![
        ResourceType {
            desc: ResourceDesc {
                verbs: &["create", "delete", "get", "list", "patch", "update", "watch"],
                ..desc("", "v1", "Namespace", "namespaces", "namespace", false)
                    .with_short_names(&["ns"])
                    .with_subresources(&[STATUS, FINALIZE])
            },
            normalize: normalize::<core::v1::Namespace>(),
            fields: &["status.phase"],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "Node", "nodes", "node", false)
                .with_short_names(&["no"])
                .with_subresources(&[STATUS]),
            normalize: normalize::<core::v1::Node>(),
            fields: &["spec.unschedulable"],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "Pod", "pods", "pod", true)
                .with_short_names(&["po"])
                .with_categories(all)
                .with_subresources(&[STATUS, BINDING, EVICTION]),
            normalize: normalize_in_one_pass::<core::v1::Pod>(),
            fields: &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "Service", "services", "service", true)
                .with_short_names(&["svc"])
                .with_categories(all)
                .with_subresources(&[STATUS]),
            normalize: normalize::<core::v1::Service>(),
            fields: &[],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "Endpoints", "endpoints", "endpoints", true)
                .with_short_names(&["ep"]),
            normalize: normalize::<core::v1::Endpoints>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "ConfigMap", "configmaps", "configmap", true)
                .with_short_names(&["cm"]),
            normalize: normalize::<core::v1::ConfigMap>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "Secret", "secrets", "secret", true),
            normalize: normalize::<core::v1::Secret>(),
            fields: &["type"],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "ServiceAccount", "serviceaccounts", "serviceaccount", true)
                .with_short_names(&["sa"]),
            normalize: normalize::<core::v1::ServiceAccount>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "ResourceQuota", "resourcequotas", "resourcequota", true)
                .with_short_names(&["quota"])
                .with_subresources(&[STATUS]),
            normalize: normalize::<core::v1::ResourceQuota>(),
            fields: &[],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "LimitRange", "limitranges", "limitrange", true)
                .with_short_names(&["limits"]),
            normalize: normalize::<core::v1::LimitRange>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        // Read-only and not stored: each read reports the control plane's health now
        // (apiserver::componentstatus).
        ResourceType {
            desc: ResourceDesc {
                verbs: &["get", "list"],
                ..desc("", "v1", "ComponentStatus", "componentstatuses", "componentstatus", false)
                    .with_short_names(&["cs"])
            },
            normalize: normalize::<core::v1::ComponentStatus>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "autoscaling",
                "v2",
                "HorizontalPodAutoscaler",
                "horizontalpodautoscalers",
                "horizontalpodautoscaler",
                true,
            )
            .with_short_names(&["hpa"])
            .with_categories(&["all"])
            .with_subresources(&[STATUS]),
            normalize: normalize::<autoscaling::v2::HorizontalPodAutoscaler>(),
            fields: &[],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        // Read-only and not stored: the nodes' and pods' use now, scraped from the agents
        // (apiserver::metrics_api; upstream serves these from metrics-server).
        ResourceType {
            desc: ResourceDesc {
                verbs: &["get", "list"],
                ..desc("metrics.k8s.io", "v1beta1", "NodeMetrics", "nodes", "nodemetrics", false)
            },
            normalize: normalize::<Value>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: ResourceDesc {
                verbs: &["get", "list"],
                ..desc("metrics.k8s.io", "v1beta1", "PodMetrics", "pods", "podmetrics", true)
            },
            normalize: normalize::<Value>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc("", "v1", "Event", "events", "event", true).with_short_names(&["ev"]),
            normalize: normalize::<core::v1::Event>(),
            fields: &[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "",
                "v1",
                "PersistentVolume",
                "persistentvolumes",
                "persistentvolume",
                false,
            )
            .with_short_names(&["pv"])
            .with_subresources(&[STATUS]),
            normalize: normalize::<core::v1::PersistentVolume>(),
            fields: &[],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "",
                "v1",
                "PersistentVolumeClaim",
                "persistentvolumeclaims",
                "persistentvolumeclaim",
                true,
            )
            .with_short_names(&["pvc"])
            .with_subresources(&[STATUS]),
            normalize: normalize::<core::v1::PersistentVolumeClaim>(),
            fields: &[],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "",
                "v1",
                "ReplicationController",
                "replicationcontrollers",
                "replicationcontroller",
                true,
            )
            .with_short_names(&["rc"])
            .with_categories(all)
            .with_subresources(&[STATUS, SCALE]),
            normalize: normalize::<core::v1::ReplicationController>(),
            fields: &["status.replicas"],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("apps", "v1", "Deployment", "deployments", "deployment", true)
                .with_short_names(&["deploy"])
                .with_categories(all)
                .with_subresources(&[STATUS, SCALE]),
            normalize: normalize::<apps::v1::Deployment>(),
            fields: &[],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("apps", "v1", "ReplicaSet", "replicasets", "replicaset", true)
                .with_short_names(&["rs"])
                .with_categories(all)
                .with_subresources(&[STATUS, SCALE]),
            normalize: normalize::<apps::v1::ReplicaSet>(),
            fields: &["status.replicas"],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("apps", "v1", "DaemonSet", "daemonsets", "daemonset", true)
                .with_short_names(&["ds"])
                .with_categories(all)
                .with_subresources(&[STATUS]),
            normalize: normalize::<apps::v1::DaemonSet>(),
            fields: &[],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("apps", "v1", "StatefulSet", "statefulsets", "statefulset", true)
                .with_short_names(&["sts"])
                .with_categories(all)
                .with_subresources(&[STATUS, SCALE]),
            normalize: normalize::<apps::v1::StatefulSet>(),
            fields: &[],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "apps",
                "v1",
                "ControllerRevision",
                "controllerrevisions",
                "controllerrevision",
                true,
            ),
            normalize: normalize::<apps::v1::ControllerRevision>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc("batch", "v1", "Job", "jobs", "job", true)
                .with_categories(all)
                .with_subresources(&[STATUS]),
            normalize: normalize::<batch::v1::Job>(),
            fields: &["status.successful"],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("batch", "v1", "CronJob", "cronjobs", "cronjob", true)
                .with_short_names(&["cj"])
                .with_categories(all)
                .with_subresources(&[STATUS]),
            normalize: normalize::<batch::v1::CronJob>(),
            fields: &[],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "policy",
                "v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
                "poddisruptionbudget",
                true,
            )
            .with_short_names(&["pdb"])
            .with_subresources(&[STATUS]),
            normalize: normalize::<policy::v1::PodDisruptionBudget>(),
            fields: &[],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("networking.k8s.io", "v1", "Ingress", "ingresses", "ingress", true)
                .with_short_names(&["ing"])
                .with_subresources(&[STATUS]),
            normalize: normalize::<networking::v1::Ingress>(),
            fields: &[],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "networking.k8s.io",
                "v1",
                "IngressClass",
                "ingressclasses",
                "ingressclass",
                false,
            ),
            normalize: normalize::<networking::v1::IngressClass>(),
            fields: &[],
            tracks_generation: true,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "storage.k8s.io",
                "v1",
                "StorageClass",
                "storageclasses",
                "storageclass",
                false,
            )
            .with_short_names(&["sc"]),
            normalize: normalize::<storage::v1::StorageClass>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "discovery.k8s.io",
                "v1",
                "EndpointSlice",
                "endpointslices",
                "endpointslice",
                true,
            ),
            normalize: normalize::<discovery::v1::EndpointSlice>(),
            fields: &["addressType"],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc("coordination.k8s.io", "v1", "Lease", "leases", "lease", true),
            normalize: normalize::<coordination::v1::Lease>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "certificates.k8s.io",
                "v1",
                "CertificateSigningRequest",
                "certificatesigningrequests",
                "certificatesigningrequest",
                false,
            )
            .with_short_names(&["csr"])
            .with_subresources(&[STATUS, APPROVAL]),
            normalize: normalize::<certificates::v1::CertificateSigningRequest>(),
            fields: &["spec.signerName"],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
                "customresourcedefinition",
                false,
            )
            .with_short_names(&["crd", "crds"])
            .with_categories(&["api-extensions"])
            .with_subresources(&[STATUS]),
            normalize: normalize::<
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
            >(),
            fields: &[],
            tracks_generation: true,
            has_status: true,
            custom: None,
        },
        // Cluster-scoped, with /status (the availability controller's); `spec.service`
        // set means the group/version is proxied to that Service (`aggregator`).
        ResourceType {
            desc: desc(
                "apiregistration.k8s.io",
                "v1",
                "APIService",
                "apiservices",
                "apiservice",
                false,
            )
            .with_categories(&["api-extensions"])
            .with_subresources(&[STATUS]),
            normalize: normalize::<
                k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService,
            >(),
            fields: &[],
            tracks_generation: false,
            has_status: true,
            custom: None,
        },
        ResourceType {
            desc: desc("rbac.authorization.k8s.io", "v1", "Role", "roles", "role", true),
            normalize: normalize::<rbac::v1::Role>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRole",
                "clusterroles",
                "clusterrole",
                false,
            ),
            normalize: normalize::<rbac::v1::ClusterRole>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "rbac.authorization.k8s.io",
                "v1",
                "RoleBinding",
                "rolebindings",
                "rolebinding",
                true,
            ),
            normalize: normalize::<rbac::v1::RoleBinding>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRoleBinding",
                "clusterrolebindings",
                "clusterrolebinding",
                false,
            ),
            normalize: normalize::<rbac::v1::ClusterRoleBinding>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "admissionregistration.k8s.io",
                "v1",
                "MutatingWebhookConfiguration",
                "mutatingwebhookconfigurations",
                "mutatingwebhookconfiguration",
                false,
            )
            .with_categories(&["api-extensions"]),
            normalize: normalize::<admissionregistration::v1::MutatingWebhookConfiguration>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
                "validatingwebhookconfiguration",
                false,
            )
            .with_categories(&["api-extensions"]),
            normalize: normalize::<admissionregistration::v1::ValidatingWebhookConfiguration>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
        ResourceType {
            desc: desc(
                "scheduling.k8s.io",
                "v1",
                "PriorityClass",
                "priorityclasses",
                "priorityclass",
                false,
            )
            .with_short_names(&["pc"]),
            normalize: normalize::<scheduling::v1::PriorityClass>(),
            fields: &[],
            tracks_generation: false,
            has_status: false,
            custom: None,
        },
    ]
}

/// Lookup of served resources by (group, version, plural): the built-in kinds, fixed for
/// the process, and the custom resources of the Established CustomResourceDefinitions, a
/// snapshot replaced whenever a CRD changes (a request holds the `Arc` it looked up).
pub struct Registry {
    types: Vec<ResourceType>,
    custom: RwLock<Arc<crate::custom::CustomTypes>>,
}

/// A resource a request found: a built-in one borrowed from the registry, or a custom one
/// from the snapshot of the moment.
pub enum Served<'a> {
    Builtin(&'a ResourceType),
    Custom(Arc<ResourceType>),
}

impl std::ops::Deref for Served<'_> {
    type Target = ResourceType;

    fn deref(&self) -> &ResourceType {
        match self {
            Served::Builtin(rt) => rt,
            Served::Custom(rt) => rt,
        }
    }
}

impl Registry {
    pub fn new() -> Self {
        Registry { types: builtin(), custom: RwLock::default() }
    }

    /// The custom resources served now.
    pub fn custom(&self) -> Arc<crate::custom::CustomTypes> {
        self.custom.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the custom resources (from the CRDs in the watch cache).
    pub fn set_custom(&self, types: crate::custom::CustomTypes) {
        *self.custom.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(types);
    }

    /// A built-in or custom resource by (group, version, plural).
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Served<'_>> {
        match self.find(group, version, plural) {
            Some(rt) => Some(Served::Builtin(rt)),
            None => self.custom().find(group, version, plural).map(Served::Custom),
        }
    }

    /// A built-in or custom resource by (group, kind): the first version served.
    pub fn lookup_kind(&self, group: &str, kind: &str) -> Option<Served<'_>> {
        match self.find_kind(group, kind) {
            Some(rt) => Some(Served::Builtin(rt)),
            None => self.custom().find_kind(group, kind).map(Served::Custom),
        }
    }

    /// Every served resource's description: the built-in ones, then the custom ones, each
    /// custom group's versions in Kubernetes' version priority (v2 > v1 > v1beta2 >
    /// v1beta1 > v1alpha1 > other names), which makes the first one the preferred version.
    pub fn served_descs(&self) -> Vec<ResourceDesc> {
        let mut out = self.descs();
        let mut custom: Vec<ResourceDesc> =
            self.custom().all().iter().map(|t| t.desc.clone()).collect();
        custom.sort_by(|a, b| {
            a.group
                .cmp(b.group)
                .then_with(|| version_priority(b.version).cmp(&version_priority(a.version)))
                .then_with(|| a.plural.cmp(b.plural))
        });
        out.extend(custom);
        out
    }

    /// Whether a built-in resource lives in `group`.
    pub fn is_builtin_group(&self, group: &str) -> bool {
        self.types.iter().any(|t| t.desc.group == group)
    }

    pub fn all(&self) -> &[ResourceType] {
        &self.types
    }

    pub fn descs(&self) -> Vec<ResourceDesc> {
        self.types.iter().map(|t| t.desc.clone()).collect()
    }

    /// Several times per request (routing, admission): the plural, which tells most types
    /// apart by its length alone, is compared first; most types share a group and version.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.desc.plural == plural && t.desc.group == group && t.desc.version == version)
    }

    pub fn find_kind(&self, group: &str, kind: &str) -> Option<&ResourceType> {
        self.types.iter().find(|t| t.desc.kind == kind && t.desc.group == group)
    }

    pub fn namespaces(&self) -> &ResourceType {
        self.find("", "v1", "namespaces").expect("namespaces are always served")
    }

    /// (group, version) pairs in discovery order.
    pub fn group_versions(&self) -> Vec<(&'static str, &'static str)> {
        let mut out: Vec<(&'static str, &'static str)> = Vec::new();
        for t in &self.types {
            if !out.contains(&(t.desc.group, t.desc.version)) {
                out.push((t.desc.group, t.desc.version));
            }
        }
        out
    }

    /// Which resource does a store key belong to?
    pub fn for_key(&self, key: &str) -> Option<&ResourceType> {
        self.types.iter().find(|t| key.starts_with(&t.prefix()))
    }
}

/// Kubernetes' version priority (`version.CompareKubeAwareVersionStrings`): GA over beta
/// over alpha, higher numbers first, names that are not Kubernetes versions last (by name,
/// reversed so that the comparison's order is ascending priority).
pub fn version_priority(v: &str) -> (u8, u64, u64, std::cmp::Reverse<String>) {
    let parse = |s: &str| -> Option<(u64, u8, u64)> {
        let rest = s.strip_prefix('v')?;
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let major: u64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((major, 3, 0));
        }
        let (level, n) = if let Some(n) = tail.strip_prefix("beta") {
            (2, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (1, n)
        } else {
            return None;
        };
        Some((major, level, n.parse().ok()?))
    };
    match parse(v) {
        Some((major, level, minor)) => (level, major, minor, std::cmp::Reverse(String::new())),
        None => (0, 0, 0, std::cmp::Reverse(v.to_string())),
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::Registry;

    #[test]
    fn a_clean_json_body_decodes_in_one_pass_as_in_two() {
        let registry = Registry::new();
        let pods = registry.find("", "v1", "pods").expect("pods");
        let deployments = registry.find("apps", "v1", "deployments").expect("deployments");
        let two_passes = |rt: &super::ResourceType, body: &Value| {
            (rt.normalize.borrowed)(body).expect("a clean body normalizes")
        };
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}, "annotations": null},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                "resources": {"limits": {"cpu": "1"}}}], "terminationGracePeriodSeconds": 3}});
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                "template": {"metadata": {"labels": {"a": "b"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let one_pass = (pods.normalize.clean_json)(&serde_json::to_vec(&pod).unwrap());
        assert_eq!(one_pass.expect("a clean body"), two_passes(pods, &pod));
        // Kinds without the one-pass decode always take the full path.
        let bytes = serde_json::to_vec(&deployment).unwrap();
        assert!((deployments.normalize.clean_json)(&bytes).is_none());
        assert_eq!(deployment, two_passes(deployments, &deployment));
        // Without apiVersion and kind (the full path fills them in): the same object.
        let bare = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        let one_pass = (pods.normalize.clean_json)(&serde_json::to_vec(&bare).unwrap());
        assert_eq!(one_pass.expect("a clean body"), two_passes(pods, &bare));
        // A repeated member: the last one, as when the body is parsed first.
        let repeated = br#"{"metadata": {"name": "a", "name": "b"}}"#;
        let parsed: Value = serde_json::from_slice(repeated).unwrap();
        assert_eq!((pods.normalize.clean_json)(repeated), Some(two_passes(pods, &parsed)));
        // Whatever the full path has to report or warn about is left to it.
        for body in [
            r#"{"apiVersion": "v1", "kind": "Pod", "spec": {"containerz": []}}"#,
            r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "extra": 1}}"#,
            r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "p"}}"#,
            r#"{"apiVersion": "v2", "kind": "Pod"}"#,
            r#"{"kind": ""}"#,
            r#"{"metadata": {"name": 5}}"#,
            r#"{"metadata": {}} trailing"#,
            r#"{"metadata": "#,
            "[]",
        ] {
            assert_eq!((pods.normalize.clean_json)(body.as_bytes()), None, "{body}");
        }
    }

    #[test]
    fn keys_name_group_plural_namespace_and_name() {
        let registry = Registry::new();
        let pods = registry.find("", "v1", "pods").expect("pods");
        assert_eq!(pods.prefix(), "/registry/core/pods/");
        assert_eq!(pods.key(Some("ns"), "p"), "/registry/core/pods/ns/p");
        assert_eq!(pods.namespace_prefix(Some("ns")), "/registry/core/pods/ns/");
        assert_eq!(pods.namespace_prefix(None), "/registry/core/pods/");
        let deployments = registry.find("apps", "v1", "deployments").expect("deployments");
        assert_eq!(deployments.key(Some("ns"), "d"), "/registry/apps/deployments/ns/d");
        // A cluster-scoped resource ignores the namespace.
        let nodes = registry.find("", "v1", "nodes").expect("nodes");
        assert_eq!(nodes.key(Some("ns"), "n1"), "/registry/core/nodes/n1");
        assert_eq!(nodes.namespace_prefix(Some("ns")), "/registry/core/nodes/");
        assert_eq!(registry.for_key("/registry/core/nodes/n1").map(|t| t.plural()), Some("nodes"));
    }
}
