//! The list, map and patch metadata upstream attaches to fields of the served kinds, which
//! k8s-openapi's schemas do not carry: Go struct tags `patchStrategy`/`patchMergeKey`
//! (strategic merge patch) and the `+listType`, `+listMapKey`, `+mapType`, `+structType`
//! markers (server-side apply), as upstream's `api/openapi-spec/v3` renders them.
//!
//! Atomic lists are the default and are not listed. Keys are component names (the OpenAPI
//! definition name) and JSON property names.

/// Extensions of one property.
pub(crate) struct FieldMeta {
    pub component: &'static str,
    pub field: &'static str,
    /// `x-kubernetes-list-type`: "map" or "set" (None: atomic / not a list).
    pub list_type: Option<&'static str>,
    pub list_map_keys: Option<&'static [&'static str]>,
    pub merge_key: Option<&'static str>,
    /// `x-kubernetes-patch-strategy`: "merge", "merge,retainKeys", "retainKeys", "replace".
    pub strategy: Option<&'static str>,
    /// `x-kubernetes-map-type` on a map-valued property.
    pub map_type: Option<&'static str>,
}

/// `+listType=map` keyed by `keys`, merged by strategic merge patch on `merge_key`.
const fn map_list(
    component: &'static str,
    field: &'static str,
    keys: &'static [&'static str],
    merge_key: &'static str,
    strategy: &'static str,
) -> FieldMeta {
    FieldMeta {
        component,
        field,
        list_type: Some("map"),
        list_map_keys: Some(keys),
        merge_key: Some(merge_key),
        strategy: Some(strategy),
        map_type: None,
    }
}

/// A list merged by strategic merge patch but atomic for server-side apply.
const fn merge_atomic(
    component: &'static str,
    field: &'static str,
    merge_key: &'static str,
) -> FieldMeta {
    FieldMeta {
        component,
        field,
        list_type: Some("atomic"),
        list_map_keys: None,
        merge_key: Some(merge_key),
        strategy: Some("merge"),
        map_type: None,
    }
}

/// `+listType=set`, optionally merged (`patchStrategy:"merge"`) by strategic merge patch.
const fn set(component: &'static str, field: &'static str, merge: bool) -> FieldMeta {
    FieldMeta {
        component,
        field,
        list_type: Some("set"),
        list_map_keys: None,
        merge_key: None,
        strategy: if merge { Some("merge") } else { None },
        map_type: None,
    }
}

/// A struct field with a patch strategy only (`retainKeys` on DeploymentSpec.strategy).
const fn strategy(
    component: &'static str,
    field: &'static str,
    strategy: &'static str,
) -> FieldMeta {
    FieldMeta {
        component,
        field,
        list_type: None,
        list_map_keys: None,
        merge_key: None,
        strategy: Some(strategy),
        map_type: None,
    }
}

/// A string map replaced as a whole (`+mapType=atomic`).
const fn atomic_map(component: &'static str, field: &'static str) -> FieldMeta {
    FieldMeta {
        component,
        field,
        list_type: None,
        list_map_keys: None,
        merge_key: None,
        strategy: None,
        map_type: Some("atomic"),
    }
}

macro_rules! c {
    ($pkg:literal, $name:literal) => {
        concat!("io.k8s.api.", $pkg, ".", $name)
    };
}

const POD_SPEC: &str = "io.k8s.api.core.v1.PodSpec";
const CONTAINER: &str = "io.k8s.api.core.v1.Container";
const EPHEMERAL: &str = "io.k8s.api.core.v1.EphemeralContainer";
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Every non-atomic list, patch strategy and atomic map of the served kinds.
pub(crate) const FIELD_META: &[FieldMeta] = &[
    // meta/v1
    set(OBJECT_META, "finalizers", true),
    map_list(OBJECT_META, "ownerReferences", &["uid"], "uid", "merge"),
    // core/v1 PodSpec
    map_list(POD_SPEC, "containers", &["name"], "name", "merge"),
    map_list(POD_SPEC, "initContainers", &["name"], "name", "merge"),
    map_list(POD_SPEC, "ephemeralContainers", &["name"], "name", "merge"),
    map_list(POD_SPEC, "volumes", &["name"], "name", "merge,retainKeys"),
    map_list(POD_SPEC, "imagePullSecrets", &["name"], "name", "merge"),
    map_list(POD_SPEC, "hostAliases", &["ip"], "ip", "merge"),
    map_list(
        POD_SPEC,
        "topologySpreadConstraints",
        &["topologyKey", "whenUnsatisfiable"],
        "topologyKey",
        "merge",
    ),
    map_list(POD_SPEC, "resourceClaims", &["name"], "name", "merge,retainKeys"),
    map_list(POD_SPEC, "schedulingGates", &["name"], "name", "merge"),
    atomic_map(POD_SPEC, "nodeSelector"),
    // Container and EphemeralContainer
    map_list(CONTAINER, "ports", &["containerPort", "protocol"], "containerPort", "merge"),
    map_list(CONTAINER, "env", &["name"], "name", "merge"),
    map_list(CONTAINER, "volumeMounts", &["mountPath"], "mountPath", "merge"),
    map_list(CONTAINER, "volumeDevices", &["devicePath"], "devicePath", "merge"),
    map_list(EPHEMERAL, "ports", &["containerPort", "protocol"], "containerPort", "merge"),
    map_list(EPHEMERAL, "env", &["name"], "name", "merge"),
    map_list(EPHEMERAL, "volumeMounts", &["mountPath"], "mountPath", "merge"),
    map_list(EPHEMERAL, "volumeDevices", &["devicePath"], "devicePath", "merge"),
    map_list(
        c!("core.v1", "ContainerStatus"),
        "volumeMounts",
        &["mountPath"],
        "mountPath",
        "merge",
    ),
    map_list(
        c!("core.v1", "ContainerStatus"),
        "allocatedResourcesStatus",
        &["name"],
        "name",
        "merge",
    ),
    FieldMeta {
        component: c!("core.v1", "ResourceStatus"),
        field: "resources",
        list_type: Some("map"),
        list_map_keys: Some(&["resourceID"]),
        merge_key: None,
        strategy: None,
        map_type: None,
    },
    // PodStatus
    map_list(c!("core.v1", "PodStatus"), "conditions", &["type"], "type", "merge"),
    map_list(c!("core.v1", "PodStatus"), "podIPs", &["ip"], "ip", "merge"),
    map_list(c!("core.v1", "PodStatus"), "hostIPs", &["ip"], "ip", "merge"),
    map_list(
        c!("core.v1", "PodStatus"),
        "resourceClaimStatuses",
        &["name"],
        "name",
        "merge,retainKeys",
    ),
    // Node
    set(c!("core.v1", "NodeSpec"), "podCIDRs", true),
    map_list(c!("core.v1", "NodeStatus"), "conditions", &["type"], "type", "merge"),
    merge_atomic(c!("core.v1", "NodeStatus"), "addresses", "type"),
    // Service, ServiceAccount, Namespace
    map_list(c!("core.v1", "ServiceSpec"), "ports", &["port", "protocol"], "port", "merge"),
    atomic_map(c!("core.v1", "ServiceSpec"), "selector"),
    map_list(c!("core.v1", "ServiceStatus"), "conditions", &["type"], "type", "merge"),
    map_list(c!("core.v1", "ServiceAccount"), "secrets", &["name"], "name", "merge"),
    map_list(c!("core.v1", "NamespaceStatus"), "conditions", &["type"], "type", "merge"),
    // PersistentVolumeClaim, ReplicationController
    map_list(
        c!("core.v1", "PersistentVolumeClaimStatus"),
        "conditions",
        &["type"],
        "type",
        "merge",
    ),
    map_list(
        c!("core.v1", "ReplicationControllerStatus"),
        "conditions",
        &["type"],
        "type",
        "merge",
    ),
    atomic_map(c!("core.v1", "ReplicationControllerSpec"), "selector"),
    // apps/v1
    map_list(c!("apps.v1", "DeploymentStatus"), "conditions", &["type"], "type", "merge"),
    strategy(c!("apps.v1", "DeploymentSpec"), "strategy", "retainKeys"),
    map_list(c!("apps.v1", "ReplicaSetStatus"), "conditions", &["type"], "type", "merge"),
    map_list(c!("apps.v1", "DaemonSetStatus"), "conditions", &["type"], "type", "merge"),
    map_list(c!("apps.v1", "StatefulSetStatus"), "conditions", &["type"], "type", "merge"),
    // batch/v1
    merge_atomic(c!("batch.v1", "JobStatus"), "conditions", "type"),
    set(c!("batch.v1", "PodFailurePolicyOnExitCodesRequirement"), "values", false),
    set(c!("batch.v1", "UncountedTerminatedPods"), "succeeded", false),
    set(c!("batch.v1", "UncountedTerminatedPods"), "failed", false),
    // discovery.k8s.io/v1
    set(c!("discovery.v1", "Endpoint"), "addresses", false),
    // autoscaling/v1 Scale: none. coordination.k8s.io/v1 Lease: none. rbac: all atomic.
];

/// Struct types replaced as a whole by server-side apply (`+structType=atomic` /
/// `+mapType=atomic` on the type).
pub(crate) const STRUCT_ATOMIC: &[&str] = &[
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
    "io.k8s.api.core.v1.ObjectReference",
    "io.k8s.api.core.v1.LocalObjectReference",
    "io.k8s.api.core.v1.ConfigMapKeySelector",
    "io.k8s.api.core.v1.SecretKeySelector",
    "io.k8s.api.core.v1.ObjectFieldSelector",
    "io.k8s.api.core.v1.ResourceFieldSelector",
    "io.k8s.api.core.v1.NodeSelector",
    "io.k8s.api.core.v1.NodeSelectorTerm",
    "io.k8s.api.core.v1.TypedLocalObjectReference",
    "io.k8s.api.rbac.v1.RoleRef",
    "io.k8s.api.rbac.v1.Subject",
];
