//! `meta.k8s.io` Table responses with the columns upstream's printers use for each kind
//! (what `kubectl get` shows; priority > 0 columns appear with `-o wide`).

use serde_json::{Value, json};

use super::negotiate::partial_metadata;
use super::registry::{ResourceType, str_at};
use skiff_core::json::ValueAt;
use skiff_core::quantity::Quantity;

struct Col {
    name: &'static str,
    ty: &'static str,
    format: &'static str,
    priority: u8,
    description: &'static str,
}

const fn col(name: &'static str, ty: &'static str, priority: u8, description: &'static str) -> Col {
    let format = if matches!(name.as_bytes(), b"Name") { "name" } else { "" };
    Col { name, ty, format, priority, description }
}

const NAME: Col = col("Name", "string", 0, "Name must be unique within a namespace.");
const AGE: Col = col(
    "Age",
    "string",
    0,
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
);

fn columns(kind: &str) -> Vec<Col> {
    match kind {
        "Pod" => vec![
            NAME,
            col(
                "Ready",
                "string",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            col("Status", "string", 0, "The aggregate status of the containers in this pod."),
            col(
                "Restarts",
                "string",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            AGE,
            col(
                "IP",
                "string",
                1,
                "IP address allocated to the pod. Routable at least within the cluster.",
            ),
            col("Node", "string", 1, "Name of the Node this pod is scheduled on."),
            col("Nominated Node", "string", 1, "Name of the node nominated for this pod."),
            col(
                "Readiness Gates",
                "string",
                1,
                "If specified, all readiness gates will be evaluated for pod readiness.",
            ),
        ],
        "Namespace" => vec![NAME, col("Status", "string", 0, "The status of the namespace"), AGE],
        "Node" => vec![
            NAME,
            col("Status", "string", 0, "The status of the node"),
            col("Roles", "string", 0, "The roles of the node"),
            AGE,
            col("Version", "string", 0, "Kubelet Version reported by the node."),
            col("Internal-IP", "string", 1, "List of internal IPs."),
            col("External-IP", "string", 1, "List of external IPs."),
            col("OS-Image", "string", 1, "OS Image reported by the node."),
            col("Kernel-Version", "string", 1, "Kernel Version reported by the node."),
            col(
                "Container-Runtime",
                "string",
                1,
                "Container Runtime Version reported by the node.",
            ),
        ],
        "Service" => vec![
            NAME,
            col("Type", "string", 0, "The type of service."),
            col("Cluster-IP", "string", 0, "The cluster IP of the service."),
            col("External-IP", "string", 0, "The external IPs of the service."),
            col("Port(s)", "string", 0, "The ports of the service."),
            AGE,
            col("Selector", "string", 1, "The selector of the service."),
        ],
        "Endpoints" => vec![NAME, col("Endpoints", "string", 0, "Endpoints of the service."), AGE],
        "ConfigMap" => vec![NAME, col("Data", "string", 0, "Number of data entries."), AGE],
        "Secret" => vec![
            NAME,
            col("Type", "string", 0, "The type of the secret."),
            col("Data", "string", 0, "The number of data entries."),
            AGE,
        ],
        "ServiceAccount" => vec![NAME, col("Secrets", "string", 0, "Number of secrets."), AGE],
        "Event" => vec![
            col("Last Seen", "string", 0, "The last time this event was observed."),
            col("Type", "string", 0, "The type of this event."),
            col("Reason", "string", 0, "The reason for this event."),
            col("Object", "string", 0, "The object this event is about."),
            col("Subobject", "string", 1, "The subobject this event is about."),
            col("Source", "string", 1, "The component reporting this event."),
            col(
                "Message",
                "string",
                0,
                "A human-readable description of the status of this operation.",
            ),
            col("First Seen", "string", 1, "The first time this event was observed."),
            col("Count", "string", 1, "The number of times this event has occurred."),
            col("Name", "string", 1, "The name of the event."),
        ],
        "Deployment" => vec![
            NAME,
            col("Ready", "string", 0, "Number of the pod with ready state"),
            col(
                "Up-to-date",
                "string",
                0,
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
            ),
            col(
                "Available",
                "string",
                0,
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
            ),
            AGE,
            col("Containers", "string", 1, "Names of each container in the template."),
            col("Images", "string", 1, "Images referenced by each container in the template."),
            col("Selector", "string", 1, "Label selector for pods."),
        ],
        "ReplicaSet" => vec![
            NAME,
            col("Desired", "integer", 0, "Replicas is the number of desired replicas."),
            col(
                "Current",
                "integer",
                0,
                "Replicas is the most recently observed number of replicas.",
            ),
            col("Ready", "integer", 0, "The number of ready replicas for this replica set."),
            AGE,
            col("Containers", "string", 1, "Names of each container in the template."),
            col("Images", "string", 1, "Images referenced by each container in the template."),
            col(
                "Selector",
                "string",
                1,
                "Selector is a label query over pods that should match the replica count.",
            ),
        ],
        "DaemonSet" => vec![
            NAME,
            col(
                "Desired",
                "integer",
                0,
                "The total number of nodes that should be running the daemon pod.",
            ),
            col(
                "Current",
                "integer",
                0,
                "The number of nodes that are running at least 1 daemon pod.",
            ),
            col(
                "Ready",
                "integer",
                0,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
            ),
            col(
                "Up-to-date",
                "integer",
                0,
                "The total number of nodes that are running updated daemon pod",
            ),
            col(
                "Available",
                "integer",
                0,
                "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available.",
            ),
            col(
                "Node Selector",
                "string",
                0,
                "NodeSelector is a selector which must be true for the pod to fit on a node.",
            ),
            AGE,
            col("Containers", "string", 1, "Names of each container in the template."),
            col("Images", "string", 1, "Images referenced by each container in the template."),
            col(
                "Selector",
                "string",
                1,
                "A label query over pods that are managed by the daemon set.",
            ),
        ],
        "StatefulSet" => vec![
            NAME,
            col("Ready", "string", 0, "Number of the pod with ready state"),
            AGE,
            col("Containers", "string", 1, "Names of each container in the template."),
            col("Images", "string", 1, "Images referenced by each container in the template."),
        ],
        "Job" => vec![
            NAME,
            col("Status", "string", 0, "Status of the job."),
            col("Completions", "string", 0, "The completion status of the job."),
            col("Duration", "string", 0, "Time required to complete the job."),
            AGE,
            col("Containers", "string", 1, "Names of each container in the template."),
            col("Images", "string", 1, "Images referenced by each container in the template."),
            col(
                "Selector",
                "string",
                1,
                "A label query over pods that should match the pod count.",
            ),
        ],
        "CronJob" => vec![
            NAME,
            col(
                "Schedule",
                "string",
                0,
                "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
            ),
            col(
                "Timezone",
                "string",
                0,
                "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones",
            ),
            col(
                "Suspend",
                "boolean",
                0,
                "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
            ),
            col("Active", "integer", 0, "A list of pointers to currently running jobs."),
            col(
                "Last Schedule",
                "string",
                0,
                "Information when was the last time the job was successfully scheduled.",
            ),
            AGE,
            col("Containers", "string", 1, "Names of each container in the template."),
            col("Images", "string", 1, "Images referenced by each container in the template."),
            col(
                "Selector",
                "string",
                1,
                "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
            ),
        ],
        "EndpointSlice" => vec![
            NAME,
            col("AddressType", "string", 0, "The IP protocol for this slice."),
            col("Ports", "string", 0, "The ports of this slice."),
            col("Endpoints", "string", 0, "The endpoints of this slice."),
            AGE,
        ],
        "LimitRange" => vec![
            NAME,
            col(
                "Created At",
                "date",
                0,
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
            ),
        ],
        "ResourceQuota" => vec![
            NAME,
            AGE,
            col(
                "Request",
                "string",
                0,
                "Request represents a minimum amount of cpu/memory that a container may consume.",
            ),
            col(
                "Limit",
                "string",
                0,
                "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
            ),
        ],
        "HorizontalPodAutoscaler" => vec![
            NAME,
            col(
                "Reference",
                "string",
                0,
                "scaleTargetRef points to the target resource to scale, and is used to the pods for which metrics should be collected, as well as to actually change the replica count.",
            ),
            col(
                "Targets",
                "string",
                0,
                "metrics contains the specifications for which to use to calculate the desired replica count (the maximum replica count across all metrics will be used).",
            ),
            col(
                "MinPods",
                "string",
                0,
                "minReplicas is the lower limit for the number of replicas to which the autoscaler can scale down.",
            ),
            col(
                "MaxPods",
                "string",
                0,
                "maxReplicas is the upper limit for the number of replicas to which the autoscaler can scale up.",
            ),
            col(
                "Replicas",
                "string",
                0,
                "currentReplicas is current number of replicas of pods managed by this autoscaler, as last seen by the autoscaler.",
            ),
            AGE,
        ],
        "NodeMetrics" | "PodMetrics" => vec![
            NAME,
            col(
                "CPU",
                "string",
                0,
                "CPU usage of the node or pod (its containers' sum) over the window.",
            ),
            col(
                "Memory",
                "string",
                0,
                "Working set of the node or pod (its containers' sum) at the end of the window.",
            ),
            col("Window", "string", 0, "The interval the CPU usage was measured over."),
        ],
        "ComponentStatus" => vec![
            NAME,
            col("Status", "string", 0, "Status of the component conditions"),
            col("Message", "string", 0, "Message of the component conditions"),
            col("Error", "string", 0, "Error of the component conditions"),
        ],
        "Lease" => vec![NAME, col("Holder", "string", 0, "The holder of the lease."), AGE],
        "PodDisruptionBudget" => vec![
            NAME,
            col("Min Available", "string", 0, "The minimum number of pods that must be available."),
            col(
                "Max Unavailable",
                "string",
                0,
                "The maximum number of pods that may be unavailable.",
            ),
            col(
                "Allowed Disruptions",
                "integer",
                0,
                "Calculated number of pods that may be disrupted at this time.",
            ),
            AGE,
        ],
        // Upstream's Scale Name column has no "name" format.
        "Scale" => vec![
            Col { format: "", ..NAME },
            col(
                "Desired",
                "integer",
                0,
                "replicas is the desired number of instances for the scaled object.",
            ),
            col(
                "Available",
                "integer",
                0,
                "replicas is the actual number of observed instances of the scaled object.",
            ),
            AGE,
        ],
        "ControllerRevision" => vec![
            NAME,
            col("Controller", "string", 0, "Controller of the object"),
            col(
                "Revision",
                "string",
                0,
                "Revision indicates the revision of the state represented by Data.",
            ),
            AGE,
        ],
        "Role" | "ClusterRole" => {
            vec![NAME, col("Created At", "date", 0, "Time at which this role was created.")]
        }
        "RoleBinding" | "ClusterRoleBinding" => vec![
            NAME,
            col("Role", "string", 0, "The role referenced by this binding."),
            AGE,
            col("Users", "string", 1, "Users in the binding."),
            col("Groups", "string", 1, "Groups in the binding."),
            col("ServiceAccounts", "string", 1, "ServiceAccounts in the binding."),
        ],
        // Upstream's CRD table: the name and when it was created (a timestamp, not an age).
        "CustomResourceDefinition" => vec![
            NAME,
            col(
                "Created At",
                "date",
                0,
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
            ),
        ],
        "CertificateSigningRequest" => vec![
            NAME,
            AGE,
            col("SignerName", "string", 0, "The signer the request is addressed to."),
            col("Requestor", "string", 0, "The user who created the request."),
            col("RequestedDuration", "string", 0, "The lifetime the request asked for."),
            col("Condition", "string", 0, "Approved, Denied or Pending, and Failed or Issued."),
        ],
        // Upstream's APIService printer: where it is served from, and whether it is.
        "APIService" => vec![
            NAME,
            col(
                "Service",
                "string",
                0,
                "The reference to the service that hosts this API endpoint.",
            ),
            col("Available", "string", 0, "Whether this service is available."),
            AGE,
        ],
        "PriorityClass" => vec![
            NAME,
            col(
                "Value",
                "integer",
                0,
                "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
            ),
            col(
                "Global-Default",
                "boolean",
                0,
                "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.",
            ),
            AGE,
            col(
                "PreemptionPolicy",
                "string",
                0,
                "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.",
            ),
        ],
        "PersistentVolume" => vec![
            NAME,
            col(
                "Capacity",
                "string",
                0,
                "capacity is the description of the persistent volume's resources and capacity. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#capacity",
            ),
            col(
                "Access Modes",
                "string",
                0,
                "accessModes contains all ways the volume can be mounted. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes",
            ),
            col(
                "Reclaim Policy",
                "string",
                0,
                "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim. Valid options are Retain (default for manually created PersistentVolumes), Delete (default for dynamically provisioned PersistentVolumes), and Recycle (deprecated). Recycle must be supported by the volume plugin underlying this PersistentVolume. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#reclaiming",
            ),
            col(
                "Status",
                "string",
                0,
                "phase indicates if a volume is available, bound to a claim, or released by a claim. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#phase",
            ),
            col(
                "Claim",
                "string",
                0,
                "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim. Expected to be non-nil when bound. claim.VolumeName is the authoritative bind between PV and PVC. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#binding",
            ),
            col("StorageClass", "string", 0, "StorageClass of the pv"),
            col("VolumeAttributesClass", "string", 0, "VolumeAttributesClass of the pv"),
            col(
                "Reason",
                "string",
                0,
                "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI.",
            ),
            AGE,
            col(
                "VolumeMode",
                "string",
                1,
                "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state. Value of Filesystem is implied when not included in spec.",
            ),
        ],
        "PersistentVolumeClaim" => vec![
            NAME,
            col(
                "Status",
                "string",
                0,
                "phase represents the current phase of PersistentVolumeClaim.",
            ),
            col(
                "Volume",
                "string",
                0,
                "volumeName is the binding reference to the PersistentVolume backing this claim.",
            ),
            col(
                "Capacity",
                "string",
                0,
                "capacity represents the actual resources of the underlying volume.",
            ),
            col(
                "Access Modes",
                "string",
                0,
                "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1",
            ),
            col("StorageClass", "string", 0, "StorageClass of the pvc"),
            col("VolumeAttributesClass", "string", 0, "VolumeAttributesClass of the pvc"),
            AGE,
            col(
                "VolumeMode",
                "string",
                1,
                "volumeMode defines what type of volume is required by the claim. Value of Filesystem is implied when not included in claim spec.",
            ),
        ],
        "ReplicationController" => vec![
            NAME,
            col(
                "Desired",
                "integer",
                0,
                "Replicas is the number of desired replicas. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller",
            ),
            col(
                "Current",
                "integer",
                0,
                "Replicas is the most recently observed number of replicas. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller#what-is-a-replicationcontroller",
            ),
            col(
                "Ready",
                "integer",
                0,
                "The number of ready replicas for this replication controller.",
            ),
            AGE,
            col("Containers", "string", 1, "Names of each container in the template."),
            col("Images", "string", 1, "Images referenced by each container in the template."),
            col(
                "Selector",
                "string",
                1,
                "Selector is a label query over pods that should match the Replicas count. If Selector is empty, it is defaulted to the labels present on the Pod template. Label keys and values that must match in order to be controlled by this replication controller, if empty defaulted to labels on Pod template. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
            ),
        ],
        "Ingress" => vec![
            NAME,
            col(
                "Class",
                "string",
                0,
                "The name of the IngressClass resource that should be used for additional configuration",
            ),
            col(
                "Hosts",
                "string",
                0,
                "Hosts that incoming requests are matched against before the ingress rule",
            ),
            col(
                "Address",
                "string",
                0,
                "Address is a list containing ingress points for the load-balancer",
            ),
            col("Ports", "string", 0, "Ports of TLS configurations that open"),
            AGE,
        ],
        "IngressClass" => vec![
            NAME,
            col(
                "Controller",
                "string",
                0,
                "Controller that is responsible for handling this class",
            ),
            col("Parameters", "string", 0, "A reference to a resource with additional parameters"),
            AGE,
        ],
        "StorageClass" => vec![
            NAME,
            col("Provisioner", "string", 0, "provisioner indicates the type of the provisioner."),
            col(
                "ReclaimPolicy",
                "string",
                0,
                "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class. Defaults to Delete.",
            ),
            col(
                "VolumeBindingMode",
                "string",
                0,
                "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.  When unset, VolumeBindingImmediate is used. This field is only honored by servers that enable the VolumeScheduling feature.",
            ),
            col(
                "AllowVolumeExpansion",
                "string",
                0,
                "allowVolumeExpansion shows whether the storage class allow volume expand.",
            ),
            AGE,
        ],
        "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => vec![
            NAME,
            col(
                "Webhooks",
                "integer",
                0,
                "Webhooks indicates the number of webhooks registered in this configuration",
            ),
            AGE,
        ],
        _ => vec![NAME, AGE],
    }
}

/// A Table of `objects`. `include_columns` is false for watch events after the first.
pub fn table(
    rt: &ResourceType,
    objects: &[Value],
    version: &str,
    rv: Option<&str>,
    include_columns: bool,
) -> Value {
    match &rt.custom {
        Some(info) => custom_table(&info.columns, objects, version, rv, include_columns),
        None => table_of(rt.kind(), objects, version, rv, include_columns),
    }
}

/// A custom resource's Table: Name, then its CRD's `additionalPrinterColumns` (upstream's
/// default when it has none: Age), each cell the column's JSONPath evaluated on the
/// object (null when it finds nothing or a value of another type; a `date` as an age).
fn custom_table(
    columns: &[Value],
    objects: &[Value],
    version: &str,
    rv: Option<&str>,
    include_columns: bool,
) -> Value {
    let default_age =
        [json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
        "description": AGE.description})];
    let columns = if columns.is_empty() { &default_age[..] } else { columns };
    let defs: Vec<Value> = if include_columns {
        let mut defs = vec![json!({"name": NAME.name, "type": "string", "format": "name",
            "description": NAME.description, "priority": 0})];
        defs.extend(columns.iter().map(|c| {
            json!({
                "name": c["name"],
                // A date is rendered as an age: a string column to the client.
                "type": if c["type"] == "date" { json!("date") } else { c["type"].clone() },
                "format": c.get("format").cloned().unwrap_or(json!("")),
                "description": c.get("description").cloned().unwrap_or(json!("")),
                "priority": c.get("priority").cloned().unwrap_or(json!(0)),
            })
        }));
        defs
    } else {
        Vec::new()
    };
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![json!(str_at(o, &["metadata", "name"]))];
            cells.extend(columns.iter().map(|c| custom_cell(c, o, now)));
            json!({"cells": cells, "object": partial_metadata(o, version)})
        })
        .collect();
    table_json(defs, rows, version, rv)
}

/// A meta.k8s.io Table of these columns and rows.
fn table_json(defs: Vec<Value>, rows: Vec<Value>, version: &str, rv: Option<&str>) -> Value {
    let mut t = json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": {},
        "columnDefinitions": defs,
        "rows": rows,
    });
    if let Some(rv) = rv {
        t["metadata"]["resourceVersion"] = json!(rv);
    }
    t
}

fn custom_cell(column: &Value, obj: &Value, now: jiff::Timestamp) -> Value {
    let path = column["jsonPath"].as_str().unwrap_or_default();
    let found = jsonpath(obj, path);
    let Some(first) = found.first() else { return Value::Null };
    let typed = |v: &Value| -> Option<Value> {
        match column["type"].as_str().unwrap_or("string") {
            "integer" => v.as_i64().map(Value::from),
            "number" => v.as_f64().map(Value::from),
            "boolean" => v.as_bool().map(Value::from),
            "date" => v.as_str().map(|ts| json!(since(ts, now))),
            _ => Some(match v {
                Value::String(s) => json!(s),
                other => json!(other.to_string()),
            }),
        }
    };
    if found.len() == 1 {
        return typed(first).unwrap_or(Value::Null);
    }
    let parts: Vec<String> = found
        .iter()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    json!(parts.join(","))
}

/// The values a printer column's JSONPath finds: Kubernetes' JSONPath as CRDs use it
/// (`.a.b`, `.a[0]`, `.a[*].b`, `.a[?(@.type=="Ready")].status`, `.a['b.c']`, with or
/// without `{}`).
pub fn jsonpath<'v>(obj: &'v Value, path: &str) -> Vec<&'v Value> {
    let path = path.trim();
    let path = path.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(path);
    let path = path.strip_prefix('$').unwrap_or(path);
    let mut current: Vec<&Value> = vec![obj];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("..") {
            // Recursive descent is not used by printer columns; nothing matches.
            let _ = r;
            return Vec::new();
        }
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            rest = &r[end..];
            if field.is_empty() {
                continue;
            }
            current = current.into_iter().filter_map(|v| v.get(field)).collect();
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else { return Vec::new() };
            // A filter's closing bracket comes after its parenthesis.
            let end = if r.starts_with("?(") {
                match r.find(")]") {
                    Some(e) => e + 1,
                    None => return Vec::new(),
                }
            } else {
                end
            };
            let sel = &r[..end];
            rest = &r[end + 1..];
            current = select(current, sel);
        } else {
            return Vec::new();
        }
    }
    current
}

fn select<'v>(current: Vec<&'v Value>, sel: &str) -> Vec<&'v Value> {
    let quoted = |s: &str| {
        s.strip_prefix('\'')
            .and_then(|s| s.strip_suffix('\''))
            .or_else(|| s.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
            .map(str::to_string)
    };
    if sel == "*" {
        return current
            .into_iter()
            .flat_map(|v| match v {
                Value::Array(a) => a.iter().collect::<Vec<_>>(),
                Value::Object(m) => m.values().collect(),
                _ => Vec::new(),
            })
            .collect();
    }
    if let Some(key) = quoted(sel) {
        return current.into_iter().filter_map(|v| v.get(key.as_str())).collect();
    }
    if let Ok(i) = sel.parse::<i64>() {
        return current
            .into_iter()
            .filter_map(|v| {
                let a = v.as_array()?;
                let idx = if i < 0 { a.len() as i64 + i } else { i };
                a.get(usize::try_from(idx).ok()?)
            })
            .collect();
    }
    if let Some(expr) = sel.strip_prefix("?(").and_then(|e| e.strip_suffix(')')) {
        // `@.path == value` or `@.path != value`, or `@.path` (exists).
        let (lhs, op, rhs) = if let Some((l, r)) = expr.split_once("==") {
            (l.trim(), Some(true), Some(r.trim()))
        } else if let Some((l, r)) = expr.split_once("!=") {
            (l.trim(), Some(false), Some(r.trim()))
        } else {
            (expr.trim(), None, None)
        };
        let Some(lpath) = lhs.strip_prefix('@') else { return Vec::new() };
        let want: Option<Value> = rhs.map(|r| match quoted(r) {
            Some(s) => Value::String(s),
            None => serde_json::from_str(r).unwrap_or(Value::String(r.to_string())),
        });
        return current
            .into_iter()
            .flat_map(|v| v.as_array().map(|a| a.iter().collect::<Vec<_>>()).unwrap_or_default())
            .filter(|item| {
                let got = jsonpath(item, lpath);
                match (op, &want) {
                    (Some(eq), Some(w)) => got.first().is_some_and(|g| *g == w) == eq,
                    _ => !got.is_empty(),
                }
            })
            .collect();
    }
    Vec::new()
}

/// [`table`] of objects of `kind` (a subresource's, such as `Scale`).
pub fn table_of(
    kind: &str,
    objects: &[Value],
    version: &str,
    rv: Option<&str>,
    include_columns: bool,
) -> Value {
    let cols = columns(kind);
    let defs: Vec<Value> = if include_columns {
        cols.iter()
            .map(|c| {
                json!({"name": c.name, "type": c.ty, "format": c.format, "description": c.description, "priority": c.priority})
            })
            .collect()
    } else {
        Vec::new()
    };
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| json!({"cells": cells(kind, o, now), "object": partial_metadata(o, version)}))
        .collect();
    table_json(defs, rows, version, rv)
}

/// upstream's duration.HumanDuration
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn since(ts: &str, now: jiff::Timestamp) -> String {
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration(now.as_second() - t.as_second()),
        Err(_) => "<unknown>".into(),
    }
}

fn arr<'a>(o: &'a Value, path: &[&str]) -> &'a [Value] {
    o.at(path).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

fn int(o: &Value, path: &[&str]) -> i64 {
    o.at(path).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(s: String) -> String {
    if s.is_empty() { "<none>".into() } else { s }
}

fn selector_string(sel: Option<&Value>) -> String {
    let Some(sel) = sel else { return "<none>".into() };
    let mut parts: Vec<String> = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect())
        .unwrap_or_default();
    for e in sel.get("matchExpressions").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
    {
        let key = e["key"].as_str().unwrap_or_default();
        let vals: Vec<&str> = e["values"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match e["operator"].as_str().unwrap_or_default() {
            "In" => parts.push(format!("{key} in ({})", vals.join(","))),
            "NotIn" => parts.push(format!("{key} notin ({})", vals.join(","))),
            "Exists" => parts.push(key.to_string()),
            "DoesNotExist" => parts.push(format!("!{key}")),
            _ => {}
        }
    }
    or_none(parts.join(","))
}

fn map_string(m: Option<&Value>) -> String {
    or_none(
        m.and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default(),
    )
}

fn or_unset(s: String) -> String {
    if s.is_empty() { "<unset>".into() } else { s }
}

/// A quantity as upstream's `Quantity.String()` prints it (canonical form; "0" unset).
fn quantity_cell(q: Option<&Value>) -> String {
    let q = q.and_then(Value::as_str).unwrap_or("0");
    skiff_core::quantity::canonical(q).unwrap_or_else(|| q.to_string())
}

/// `GetAccessModesAsString`: the short names in a fixed order, each once.
fn access_modes(modes: &[Value]) -> String {
    let has = |m: &str| modes.iter().any(|v| v == m);
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(long, _)| has(long))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

/// A volume's or claim's phase; "Terminating" once deleted.
fn storage_phase(o: &Value) -> String {
    if o.at(&["metadata", "deletionTimestamp"]).is_some() {
        "Terminating".into()
    } else {
        str_at(o, &["status", "phase"])
    }
}

/// `GetPersistentVolume(Claim)Class`: the beta annotation, else `spec.storageClassName`.
fn storage_class(o: &Value) -> String {
    o.at(&["metadata", "annotations", "volume.beta.kubernetes.io/storage-class"])
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| str_at(o, &["spec", "storageClassName"]))
}

/// upstream's printIngress: class, the first three hosts ("*" for none), the load
/// balancer's addresses, "80" or "80, 443" with TLS.
fn ingress_cells(o: &Value, name: String, age: String) -> Vec<Value> {
    const MAX_HOSTS: usize = 3;
    let class = o.at(&["spec", "ingressClassName"]).and_then(Value::as_str).unwrap_or("<none>");
    let rules = arr(o, &["spec", "rules"]);
    let (mut hosts, mut more) = (Vec::new(), false);
    for rule in rules {
        if hosts.len() == MAX_HOSTS {
            more = true;
            break;
        }
        if let Some(h) = rule["host"].as_str().filter(|h| !h.is_empty()) {
            hosts.push(h);
        }
    }
    let mut hosts_cell = if hosts.is_empty() { "*".to_string() } else { hosts.join(",") };
    if more {
        hosts_cell = format!("{hosts_cell} + {} more...", rules.len() - MAX_HOSTS);
    }
    let mut addresses: Vec<&str> = arr(o, &["status", "loadBalancer", "ingress"])
        .iter()
        .filter_map(|i| {
            i["ip"]
                .as_str()
                .filter(|s| !s.is_empty())
                .or_else(|| i["hostname"].as_str().filter(|s| !s.is_empty()))
        })
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    // Server-side Tables are generated wide: the addresses are never clipped.
    let address = addresses.join(",");
    let ports = if arr(o, &["spec", "tls"]).is_empty() { "80" } else { "80, 443" };
    vec![json!(name), json!(class), json!(hosts_cell), json!(address), json!(ports), json!(age)]
}

fn containers_images(o: &Value) -> (String, String) {
    let cs = arr(o, &["spec", "template", "spec", "containers"]);
    let names: Vec<&str> = cs.iter().filter_map(|c| c["name"].as_str()).collect();
    let images: Vec<&str> = cs.iter().filter_map(|c| c["image"].as_str()).collect();
    (names.join(","), images.join(","))
}

fn cells(kind: &str, o: &Value, now: jiff::Timestamp) -> Vec<Value> {
    let name = str_at(o, &["metadata", "name"]);
    let age = since(&str_at(o, &["metadata", "creationTimestamp"]), now);
    match kind {
        "Pod" => pod_cells(o, name, age, now),
        "Namespace" => {
            let phase = str_at(o, &["status", "phase"]);
            vec![
                json!(name),
                json!(if phase.is_empty() { "Active".into() } else { phase }),
                json!(age),
            ]
        }
        "Node" => node_cells(o, name, age),
        "Service" => service_cells(o, name, age),
        "PersistentVolume" => {
            let claim = match o.at(&["spec", "claimRef"]) {
                Some(r) => format!(
                    "{}/{}",
                    r["namespace"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default()
                ),
                None => String::new(),
            };
            vec![
                json!(name),
                json!(quantity_cell(o.at(&["spec", "capacity", "storage"]))),
                json!(access_modes(arr(o, &["spec", "accessModes"]))),
                json!(str_at(o, &["spec", "persistentVolumeReclaimPolicy"])),
                json!(storage_phase(o)),
                json!(claim),
                json!(storage_class(o)),
                json!(or_unset(str_at(o, &["spec", "volumeAttributesClassName"]))),
                json!(str_at(o, &["status", "reason"])),
                json!(age),
                json!(or_unset(str_at(o, &["spec", "volumeMode"]))),
            ]
        }
        "PersistentVolumeClaim" => {
            // Capacity and modes are the bound volume's; an unbound claim shows neither.
            let volume = str_at(o, &["spec", "volumeName"]);
            let (capacity, modes) = if volume.is_empty() {
                (String::new(), String::new())
            } else {
                (
                    quantity_cell(o.at(&["status", "capacity", "storage"])),
                    access_modes(arr(o, &["status", "accessModes"])),
                )
            };
            vec![
                json!(name),
                json!(storage_phase(o)),
                json!(volume),
                json!(capacity),
                json!(modes),
                json!(storage_class(o)),
                json!(or_unset(str_at(o, &["spec", "volumeAttributesClassName"]))),
                json!(age),
                json!(or_unset(str_at(o, &["spec", "volumeMode"]))),
            ]
        }
        "ReplicationController" => {
            let (c, i) = containers_images(o);
            vec![
                json!(name),
                json!(int(o, &["spec", "replicas"])),
                json!(int(o, &["status", "replicas"])),
                json!(int(o, &["status", "readyReplicas"])),
                json!(age),
                json!(c),
                json!(i),
                json!(map_string(o.at(&["spec", "selector"]))),
            ]
        }
        "Ingress" => ingress_cells(o, name, age),
        "IngressClass" => {
            let parameters = match o.at(&["spec", "parameters"]) {
                Some(p) => {
                    let mut s = p["kind"].as_str().unwrap_or_default().to_string();
                    if let Some(g) = p["apiGroup"].as_str() {
                        s = format!("{s}.{g}");
                    }
                    format!("{s}/{}", p["name"].as_str().unwrap_or_default())
                }
                None => "<none>".into(),
            };
            vec![
                json!(name),
                json!(str_at(o, &["spec", "controller"])),
                json!(parameters),
                json!(age),
            ]
        }
        "StorageClass" => {
            let default = o.at(&["metadata", "annotations"]).is_some_and(|a| {
                a["storageclass.kubernetes.io/is-default-class"] == "true"
                    || a["storageclass.beta.kubernetes.io/is-default-class"] == "true"
            });
            let or = |field: &str, dflt: &str| {
                o.get(field).and_then(Value::as_str).unwrap_or(dflt).to_string()
            };
            vec![
                json!(if default { format!("{name} (default)") } else { name }),
                json!(str_at(o, &["provisioner"])),
                json!(or("reclaimPolicy", "Delete")),
                json!(or("volumeBindingMode", "Immediate")),
                json!(o.get("allowVolumeExpansion").and_then(Value::as_bool).unwrap_or(false)),
                json!(age),
            ]
        }
        "Endpoints" => {
            let mut eps = Vec::new();
            for subset in arr(o, &["subsets"]) {
                let ports = arr(subset, &["ports"]);
                for a in arr(subset, &["addresses"]) {
                    let ip = a["ip"].as_str().unwrap_or_default();
                    if ports.is_empty() {
                        eps.push(ip.to_string());
                    }
                    for p in ports {
                        eps.push(format!("{ip}:{}", p["port"]));
                    }
                }
            }
            let shown = if eps.len() > 3 {
                format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
            } else {
                or_none(eps.join(","))
            };
            vec![json!(name), json!(shown), json!(age)]
        }
        "ConfigMap" => {
            let n = o.get("data").and_then(Value::as_object).map_or(0, |m| m.len())
                + o.get("binaryData").and_then(Value::as_object).map_or(0, |m| m.len());
            vec![json!(name), json!(n), json!(age)]
        }
        "Secret" => {
            let n = o.get("data").and_then(Value::as_object).map_or(0, |m| m.len());
            vec![json!(name), json!(str_at(o, &["type"])), json!(n), json!(age)]
        }
        "ServiceAccount" => vec![json!(name), json!(arr(o, &["secrets"]).len()), json!(age)],
        "Event" => event_cells(o, name, now),
        "Deployment" => {
            let (c, i) = containers_images(o);
            vec![
                json!(name),
                json!(format!(
                    "{}/{}",
                    int(o, &["status", "readyReplicas"]),
                    int(o, &["spec", "replicas"])
                )),
                json!(int(o, &["status", "updatedReplicas"])),
                json!(int(o, &["status", "availableReplicas"])),
                json!(age),
                json!(c),
                json!(i),
                json!(selector_string(o.at(&["spec", "selector"]))),
            ]
        }
        "ReplicaSet" => {
            let (c, i) = containers_images(o);
            vec![
                json!(name),
                json!(int(o, &["spec", "replicas"])),
                json!(int(o, &["status", "replicas"])),
                json!(int(o, &["status", "readyReplicas"])),
                json!(age),
                json!(c),
                json!(i),
                json!(selector_string(o.at(&["spec", "selector"]))),
            ]
        }
        "DaemonSet" => {
            let (c, i) = containers_images(o);
            vec![
                json!(name),
                json!(int(o, &["status", "desiredNumberScheduled"])),
                json!(int(o, &["status", "currentNumberScheduled"])),
                json!(int(o, &["status", "numberReady"])),
                json!(int(o, &["status", "updatedNumberScheduled"])),
                json!(int(o, &["status", "numberAvailable"])),
                json!(map_string(o.at(&["spec", "template", "spec", "nodeSelector"]))),
                json!(age),
                json!(c),
                json!(i),
                json!(selector_string(o.at(&["spec", "selector"]))),
            ]
        }
        "StatefulSet" => {
            let (c, i) = containers_images(o);
            vec![
                json!(name),
                json!(format!(
                    "{}/{}",
                    int(o, &["status", "readyReplicas"]),
                    int(o, &["spec", "replicas"])
                )),
                json!(age),
                json!(c),
                json!(i),
            ]
        }
        "Job" => job_cells(o, name, age, now),
        "CronJob" => {
            let template = o.at(&["spec", "jobTemplate"]).cloned().unwrap_or_default();
            let (c, i) = containers_images(&template);
            let last = match str_at(o, &["status", "lastScheduleTime"]) {
                t if t.is_empty() => "<none>".to_string(),
                t => since(&t, now),
            };
            vec![
                json!(name),
                json!(str_at(o, &["spec", "schedule"])),
                json!(or_none(str_at(o, &["spec", "timeZone"]))),
                // `printBoolPtr`: a string cell.
                json!(match o.at(&["spec", "suspend"]).and_then(Value::as_bool) {
                    Some(true) => "True",
                    Some(false) => "False",
                    None => "<unset>",
                }),
                json!(arr(o, &["status", "active"]).len()),
                json!(last),
                json!(age),
                json!(c),
                json!(i),
                json!(selector_string(template.at(&["spec", "selector"]))),
            ]
        }
        "EndpointSlice" => {
            let ports: Vec<String> =
                arr(o, &["ports"]).iter().map(|p| p["port"].to_string()).collect();
            let addrs: Vec<String> = arr(o, &["endpoints"])
                .iter()
                .flat_map(|e| {
                    arr(e, &["addresses"]).iter().filter_map(|a| a.as_str().map(str::to_string))
                })
                .collect();
            let shown = if addrs.len() > 3 {
                format!("{} + {} more...", addrs[..3].join(","), addrs.len() - 3)
            } else if addrs.is_empty() {
                "<unset>".into()
            } else {
                addrs.join(",")
            };
            vec![
                json!(name),
                json!(str_at(o, &["addressType"])),
                json!(if ports.is_empty() { "<unset>".into() } else { ports.join(",") }),
                json!(shown),
                json!(age),
            ]
        }
        "LimitRange" => {
            vec![json!(name), json!(str_at(o, &["metadata", "creationTimestamp"]))]
        }
        "ResourceQuota" => {
            // Upstream's printResourceQuota: `<resource>: <used>/<hard>` for each resource of
            // status.hard in name order, limits.* in the Limit column.
            let hard = o.at(&["status", "hard"]).and_then(Value::as_object);
            let used = o.at(&["status", "used"]).and_then(Value::as_object);
            let (mut request, mut limit) = (Vec::new(), Vec::new());
            for (resource, h) in hard.into_iter().flatten() {
                let u = used.and_then(|u| u.get(resource)).and_then(Value::as_str).unwrap_or("0");
                let cell = format!("{resource}: {u}/{}", h.as_str().unwrap_or_default());
                if resource.split('.').next() == Some("limits") && resource.contains('.') {
                    limit.push(cell);
                } else {
                    request.push(cell);
                }
            }
            vec![json!(name), json!(age), json!(request.join(", ")), json!(limit.join(", "))]
        }
        "HorizontalPodAutoscaler" => {
            let reference = format!(
                "{}/{}",
                str_at(o, &["spec", "scaleTargetRef", "kind"]),
                str_at(o, &["spec", "scaleTargetRef", "name"])
            );
            let min = o
                .at(&["spec", "minReplicas"])
                .and_then(Value::as_i64)
                .map_or("<unset>".to_string(), |n| n.to_string());
            let max = o.at(&["spec", "maxReplicas"]).and_then(Value::as_i64).unwrap_or(0);
            let replicas =
                o.at(&["status", "currentReplicas"]).and_then(Value::as_i64).unwrap_or(0);
            vec![
                json!(name),
                json!(reference),
                json!(hpa_targets(o)),
                json!(min),
                json!(max),
                json!(replicas),
                json!(age),
            ]
        }
        "NodeMetrics" | "PodMetrics" => {
            let (cpu, memory) = match o.get("usage") {
                Some(u) => (str_at(u, &["cpu"]), str_at(u, &["memory"])),
                None => {
                    // A pod: its containers' sums.
                    let sum = |r: &str| {
                        o.get("containers").and_then(Value::as_array).map_or(0, |cs| {
                            cs.iter()
                                .filter_map(|c| {
                                    Quantity::parse(&str_at(c, &["usage", r])).map(|q| q.0)
                                })
                                .sum::<i128>()
                        })
                    };
                    let cpu = u64::try_from(sum("cpu")).unwrap_or(0);
                    let memory = u64::try_from(sum("memory") / 1_000_000_000).unwrap_or(0);
                    (
                        skiff_core::quantity::from_nanocores(cpu),
                        skiff_core::quantity::from_bytes(memory),
                    )
                }
            };
            vec![json!(name), json!(cpu), json!(memory), json!(str_at(o, &["window"]))]
        }
        "ComponentStatus" => {
            // Upstream's printComponentStatus: the first Healthy condition, else Unknown.
            let healthy = o
                .get("conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c.get("type") == Some(&json!("Healthy"))));
            let (status, message, error) = match healthy {
                Some(c) => (
                    if c.get("status") == Some(&json!("True")) { "Healthy" } else { "Unhealthy" },
                    str_at(c, &["message"]),
                    str_at(c, &["error"]),
                ),
                None => ("Unknown", String::new(), String::new()),
            };
            vec![json!(name), json!(status), json!(message), json!(error)]
        }
        "Lease" => vec![json!(name), json!(str_at(o, &["spec", "holderIdentity"])), json!(age)],
        "PodDisruptionBudget" => {
            // An int-or-string as `IntOrString.String()` prints it; unset: "N/A".
            let bound = |field: &str| match o.at(&["spec", field]) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(s)) => s.clone(),
                _ => "N/A".to_string(),
            };
            vec![
                json!(name),
                json!(bound("minAvailable")),
                json!(bound("maxUnavailable")),
                json!(int(o, &["status", "disruptionsAllowed"])),
                json!(age),
            ]
        }
        "Scale" => vec![
            json!(name),
            json!(o.at(&["spec", "replicas"]).and_then(Value::as_i64).unwrap_or(0)),
            json!(o.at(&["status", "replicas"]).and_then(Value::as_i64).unwrap_or(0)),
            json!(age),
        ],
        "ControllerRevision" => {
            // `<kind>.<group>/<name>` of the controller, as `formatResourceName` prints it.
            let controller = arr(o, &["metadata", "ownerReferences"])
                .iter()
                .find(|r| r["controller"] == true)
                .map_or_else(
                    || "<none>".to_string(),
                    |r| {
                        let kind = r["kind"].as_str().unwrap_or_default().to_lowercase();
                        let api_version = r["apiVersion"].as_str().unwrap_or_default();
                        let name = r["name"].as_str().unwrap_or_default();
                        match api_version.rsplit_once('/') {
                            Some((group, _)) => format!("{kind}.{group}/{name}"),
                            None => format!("{kind}/{name}"),
                        }
                    },
                );
            vec![
                json!(name),
                json!(controller),
                json!(o["revision"].as_i64().unwrap_or(0)),
                json!(age),
            ]
        }
        "Role" | "ClusterRole" => {
            vec![json!(name), json!(str_at(o, &["metadata", "creationTimestamp"]))]
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let subjects = arr(o, &["subjects"]);
            let of = |k: &str| -> String {
                subjects
                    .iter()
                    .filter(|s| s["kind"] == k)
                    .map(|s| match (k, s["namespace"].as_str()) {
                        ("ServiceAccount", Some(ns)) => {
                            format!("{ns}/{}", s["name"].as_str().unwrap_or_default())
                        }
                        _ => s["name"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                json!(name),
                json!(format!(
                    "{}/{}",
                    str_at(o, &["roleRef", "kind"]),
                    str_at(o, &["roleRef", "name"])
                )),
                json!(age),
                json!(of("User")),
                json!(of("Group")),
                json!(of("ServiceAccount")),
            ]
        }
        "CustomResourceDefinition" => {
            vec![json!(name), json!(str_at(o, &["metadata", "creationTimestamp"]))]
        }
        "CertificateSigningRequest" => {
            let has = |ty: &str| {
                arr(o, &["status", "conditions"])
                    .iter()
                    .any(|c| c["type"] == ty && c["status"] == "True")
            };
            let mut condition = if has("Denied") {
                "Denied".to_string()
            } else if has("Approved") {
                "Approved".to_string()
            } else {
                "Pending".to_string()
            };
            if has("Failed") {
                condition.push_str(",Failed");
            }
            if !str_at(o, &["status", "certificate"]).is_empty() {
                condition.push_str(",Issued");
            }
            let duration = o
                .pointer("/spec/expirationSeconds")
                .and_then(Value::as_i64)
                .map_or_else(|| "<none>".to_string(), human_duration);
            vec![
                json!(name),
                json!(age),
                json!(str_at(o, &["spec", "signerName"])),
                json!(str_at(o, &["spec", "username"])),
                json!(duration),
                json!(condition),
            ]
        }
        "APIService" => {
            let service = match o.at(&["spec", "service"]).filter(|s| s.is_object()) {
                Some(s) => format!(
                    "{}/{}",
                    s["namespace"].as_str().unwrap_or_default(),
                    s["name"].as_str().unwrap_or_default()
                ),
                None => "Local".to_string(),
            };
            let available = arr(o, &["status", "conditions"])
                .iter()
                .find(|c| c["type"] == "Available")
                .map_or_else(
                    || "Unknown".to_string(),
                    |c| match c["status"].as_str().unwrap_or("Unknown") {
                        "True" => "True".to_string(),
                        status => format!("{status} ({})", c["reason"].as_str().unwrap_or("")),
                    },
                );
            vec![json!(name), json!(service), json!(available), json!(age)]
        }
        "PriorityClass" => vec![
            json!(name),
            json!(o["value"].as_i64().unwrap_or(0)),
            json!(o["globalDefault"].as_bool().unwrap_or(false)),
            json!(age),
            json!(str_at(o, &["preemptionPolicy"])),
        ],
        "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => {
            vec![json!(name), json!(arr(o, &["webhooks"]).len()), json!(age)]
        }
        _ => vec![json!(name), json!(age)],
    }
}

fn pod_cells(o: &Value, name: String, age: String, now: jiff::Timestamp) -> Vec<Value> {
    let containers = arr(o, &["spec", "containers"]);
    let statuses = arr(o, &["status", "containerStatuses"]);
    let ready = statuses.iter().filter(|s| s["ready"].as_bool() == Some(true)).count();
    let restarts: i64 = statuses.iter().map(|s| s["restartCount"].as_i64().unwrap_or(0)).sum();
    let mut reason = str_at(o, &["status", "reason"]);
    if reason.is_empty() {
        reason = str_at(o, &["status", "phase"]);
    }
    for s in statuses {
        if let Some(r) =
            s.pointer("/state/waiting/reason").and_then(Value::as_str).filter(|r| !r.is_empty())
        {
            reason = r.to_string();
        } else if let Some(r) =
            s.pointer("/state/terminated/reason").and_then(Value::as_str).filter(|r| !r.is_empty())
        {
            reason = r.to_string();
        }
    }
    if o.pointer("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null()) {
        reason = "Terminating".into();
    }
    let last_restart = statuses
        .iter()
        .filter_map(|s| s.pointer("/lastState/terminated/finishedAt").and_then(Value::as_str))
        .max()
        .map(|t| format!(" ({} ago)", since(t, now)))
        .unwrap_or_default();
    let ips = str_at(o, &["status", "podIP"]);
    let gates = arr(o, &["spec", "readinessGates"]);
    vec![
        json!(name),
        json!(format!("{ready}/{}", containers.len())),
        json!(reason),
        json!(format!("{restarts}{}", if restarts > 0 { last_restart } else { String::new() })),
        json!(age),
        json!(or_none(ips)),
        json!(or_none(str_at(o, &["spec", "nodeName"]))),
        json!(or_none(str_at(o, &["status", "nominatedNodeName"]))),
        json!(if gates.is_empty() { "<none>".to_string() } else { format!("0/{}", gates.len()) }),
    ]
}

fn node_cells(o: &Value, name: String, age: String) -> Vec<Value> {
    let ready = arr(o, &["status", "conditions"]).iter().find(|c| c["type"] == "Ready");
    let mut status = match ready.and_then(|c| c["status"].as_str()) {
        Some("True") => "Ready".to_string(),
        _ => "NotReady".to_string(),
    };
    if o.at(&["spec", "unschedulable"]).and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<String> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/").map(str::to_string))
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let addr = |t: &str| {
        or_none(
            arr(o, &["status", "addresses"])
                .iter()
                .filter(|a| a["type"] == t)
                .filter_map(|a| a["address"].as_str())
                .collect::<Vec<_>>()
                .join(","),
        )
    };
    vec![
        json!(name),
        json!(status),
        json!(or_none(roles.join(","))),
        json!(age),
        json!(str_at(o, &["status", "nodeInfo", "kubeletVersion"])),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
        json!(str_at(o, &["status", "nodeInfo", "osImage"])),
        json!(str_at(o, &["status", "nodeInfo", "kernelVersion"])),
        json!(str_at(o, &["status", "nodeInfo", "containerRuntimeVersion"])),
    ]
}

fn service_cells(o: &Value, name: String, age: String) -> Vec<Value> {
    let ty = str_at(o, &["spec", "type"]);
    let cluster_ip = or_none(str_at(o, &["spec", "clusterIP"]));
    let mut external: Vec<String> = arr(o, &["spec", "externalIPs"])
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let lb: Vec<String> = arr(o, &["status", "loadBalancer", "ingress"])
        .iter()
        .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()).map(str::to_string))
        .collect();
    let ext = match ty.as_str() {
        "ExternalName" => str_at(o, &["spec", "externalName"]),
        "LoadBalancer" => {
            external.extend(lb);
            if external.is_empty() { "<pending>".into() } else { external.join(",") }
        }
        _ => or_none(external.join(",")),
    };
    let ports: Vec<String> = arr(o, &["spec", "ports"])
        .iter()
        .map(|p| {
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64() {
                Some(np) if np > 0 => format!("{}:{np}/{proto}", p["port"]),
                _ => format!("{}/{proto}", p["port"]),
            }
        })
        .collect();
    vec![
        json!(name),
        json!(ty),
        json!(cluster_ip),
        json!(ext),
        json!(or_none(ports.join(","))),
        json!(age),
        json!(map_string(o.at(&["spec", "selector"]))),
    ]
}

fn event_cells(o: &Value, name: String, now: jiff::Timestamp) -> Vec<Value> {
    let last = [
        str_at(o, &["lastTimestamp"]),
        str_at(o, &["eventTime"]),
        str_at(o, &["metadata", "creationTimestamp"]),
    ]
    .into_iter()
    .find(|s| !s.is_empty())
    .unwrap_or_default();
    let first = [str_at(o, &["firstTimestamp"]), str_at(o, &["eventTime"]), last.clone()]
        .into_iter()
        .find(|s| !s.is_empty())
        .unwrap_or_default();
    let obj = format!(
        "{}/{}",
        str_at(o, &["involvedObject", "kind"]).to_lowercase(),
        str_at(o, &["involvedObject", "name"])
    );
    let source = {
        let c = str_at(o, &["source", "component"]);
        let c = if c.is_empty() { str_at(o, &["reportingComponent"]) } else { c };
        let h = str_at(o, &["source", "host"]);
        if h.is_empty() { c } else { format!("{c}, {h}") }
    };
    let count = o.at(&["count"]).and_then(Value::as_i64).unwrap_or(1);
    vec![
        json!(since(&last, now)),
        json!(str_at(o, &["type"])),
        json!(str_at(o, &["reason"])),
        json!(obj),
        json!(str_at(o, &["involvedObject", "fieldPath"])),
        json!(source),
        json!(str_at(o, &["message"]).trim().to_string()),
        json!(since(&first, now)),
        json!(count),
        json!(name),
    ]
}

fn job_cells(o: &Value, name: String, age: String, now: jiff::Timestamp) -> Vec<Value> {
    let (c, i) = containers_images(o);
    let completions = o.at(&["spec", "completions"]).and_then(Value::as_i64);
    let succeeded = int(o, &["status", "succeeded"]);
    let completions_str = match completions {
        Some(n) => format!("{succeeded}/{n}"),
        None => {
            let p = o.at(&["spec", "parallelism"]).and_then(Value::as_i64).unwrap_or(1);
            if p > 1 { format!("{succeeded}/1 of {p}") } else { format!("{succeeded}/1") }
        }
    };
    let conditions = arr(o, &["status", "conditions"]);
    let has = |t: &str| conditions.iter().any(|c| c["type"] == t && c["status"] == "True");
    let status = if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if has("FailureTarget") {
        "FailureTarget"
    } else if has("SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else if has("Suspended") {
        "Suspended"
    } else {
        "Running"
    };
    let start = str_at(o, &["status", "startTime"]);
    let done = str_at(o, &["status", "completionTime"]);
    let duration = match (start.parse::<jiff::Timestamp>(), done.parse::<jiff::Timestamp>()) {
        (Ok(s), Ok(d)) => human_duration(d.as_second() - s.as_second()),
        (Ok(s), Err(_)) => human_duration(now.as_second() - s.as_second()),
        _ => String::new(),
    };
    vec![
        json!(name),
        json!(status),
        json!(completions_str),
        json!(duration),
        json!(age),
        json!(c),
        json!(i),
        json!(selector_string(o.at(&["spec", "selector"]))),
    ]
}

/// Upstream's `formatHPAMetrics`: `<current>/<target>` of the first two metrics
/// (`cpu: 42%/80%`), `<unknown>` until the autoscaler has measured.
fn hpa_targets(o: &Value) -> String {
    let specs = o.at(&["spec", "metrics"]).and_then(Value::as_array).cloned().unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses =
        o.at(&["status", "currentMetrics"]).and_then(Value::as_array).cloned().unwrap_or_default();
    let unknown = || "<unknown>".to_string();
    let quantity = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let list: Vec<String> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let status = statuses.get(i);
            let kind = str_at(spec, &["type"]);
            let source = match kind.as_str() {
                "Resource" => "resource",
                "ContainerResource" => "containerResource",
                "Pods" => "pods",
                "Object" => "object",
                "External" => "external",
                _ => return "<unknown type>".to_string(),
            };
            let target = spec.at(&[source, "target"]);
            let current = status.and_then(|s| s.at(&[source, "current"]));
            let average = target.and_then(|t| t.get("averageValue"));
            match source {
                "resource" | "containerResource" => {
                    let name = str_at(spec, &[source, "name"]);
                    let (current, target) = if average.is_some() {
                        (
                            quantity(current.and_then(|c| c.get("averageValue")))
                                .unwrap_or_else(unknown),
                            quantity(average).unwrap_or_default(),
                        )
                    } else {
                        let percent =
                            |v: Option<&Value>| v.and_then(Value::as_i64).map(|p| format!("{p}%"));
                        (
                            percent(current.and_then(|c| c.get("averageUtilization")))
                                .unwrap_or_else(unknown),
                            percent(target.and_then(|t| t.get("averageUtilization")))
                                .unwrap_or_else(|| "<auto>".into()),
                        )
                    };
                    format!("{name}: {current}/{target}")
                }
                _ => {
                    let field = if average.is_some() { "averageValue" } else { "value" };
                    let current =
                        quantity(current.and_then(|c| c.get(field))).unwrap_or_else(unknown);
                    let target = quantity(target.and_then(|t| t.get(field))).unwrap_or_default();
                    // Object and External metrics averaged over the pods say so.
                    if average.is_some() && source != "pods" {
                        format!("{current}/{target} (avg)")
                    } else {
                        format!("{current}/{target}")
                    }
                }
            }
        })
        .collect();
    if list.len() > 2 {
        format!("{} + {} more...", list[..2].join(", "), list.len() - 2)
    } else {
        list.join(", ")
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn printer_column_jsonpaths() {
        let o = serde_json::json!({"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "x"}},
            "spec": {"replicas": 3, "ports": [{"port": 80}, {"port": 443}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}]}});
        let one = |p: &str| super::jsonpath(&o, p).into_iter().cloned().collect::<Vec<_>>();
        assert_eq!(one(".spec.replicas"), vec![serde_json::json!(3)]);
        assert_eq!(one("{.spec.ports[1].port}"), vec![serde_json::json!(443)]);
        assert_eq!(one(".spec.ports[*].port"), vec![serde_json::json!(80), serde_json::json!(443)]);
        assert_eq!(one(".spec.ports[-1].port"), vec![serde_json::json!(443)]);
        assert_eq!(
            one(r#".status.conditions[?(@.type=="Ready")].status"#),
            vec![serde_json::json!("True")]
        );
        assert_eq!(
            one(".status.conditions[?(@.type!='Ready')].type"),
            vec![serde_json::json!("Synced")]
        );
        assert_eq!(one(".metadata.labels['app.kubernetes.io/name']"), vec![serde_json::json!("x")]);
        assert!(one(".spec.missing").is_empty());
        let cols = [
            serde_json::json!({"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}),
            serde_json::json!({"name": "Ready", "type": "string", "jsonPath": r#".status.conditions[?(@.type=="Ready")].status"#}),
            serde_json::json!({"name": "Bad", "type": "integer", "jsonPath": ".metadata.name"}),
        ];
        let t = super::custom_table(&cols, &[o], "v1", None, true);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "Replicas", "Ready", "Bad"]);
        assert_eq!(t["rows"][0]["cells"], serde_json::json!(["a", 3, "True", null]));
        let t = super::custom_table(
            &[],
            &[serde_json::json!({"metadata": {"name": "b"}})],
            "v1",
            None,
            true,
        );
        assert_eq!(t["columnDefinitions"][1]["name"], "Age");
    }
    use super::*;

    #[test]
    fn human_durations_match_upstream() {
        for (s, want) in [
            (5, "5s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (3 * 86400, "3d"),
            (400 * 86400, "400d"),
        ] {
            assert_eq!(human_duration(s), want);
        }
    }

    fn header(kind: &str) -> Vec<(&'static str, &'static str)> {
        columns(kind).iter().map(|c| (c.name, c.ty)).collect()
    }

    #[test]
    fn priority_classes_show_value_default_and_policy() {
        assert_eq!(
            header("PriorityClass"),
            [
                ("Name", "string"),
                ("Value", "integer"),
                ("Global-Default", "boolean"),
                ("Age", "string"),
                ("PreemptionPolicy", "string"),
            ]
        );
        let now = jiff::Timestamp::now();
        let created = skiff_core::time::sub_secs(now, 90).to_string();
        let pc = json!({
            "metadata": {"name": "high", "creationTimestamp": created},
            "value": 1000000, "globalDefault": true, "preemptionPolicy": "Never",
        });
        assert_eq!(
            cells("PriorityClass", &pc, now),
            [json!("high"), json!(1000000), json!(true), json!("90s"), json!("Never")]
        );
        // Unset fields print as upstream's zero values.
        let bare = json!({"metadata": {"name": "low", "creationTimestamp": created}});
        assert_eq!(
            cells("PriorityClass", &bare, now),
            [json!("low"), json!(0), json!(false), json!("90s"), json!("")]
        );
    }

    #[test]
    fn scales_show_desired_and_available() {
        assert_eq!(
            header("Scale"),
            [
                ("Name", "string"),
                ("Desired", "integer"),
                ("Available", "integer"),
                ("Age", "string")
            ]
        );
        assert_eq!(columns("Scale")[0].format, "", "upstream's Scale Name has no format");
        let now = jiff::Timestamp::now();
        let created = skiff_core::time::sub_secs(now, 3).to_string();
        let scale = json!({"metadata": {"name": "web", "creationTimestamp": created},
            "spec": {"replicas": 5}, "status": {"replicas": 2, "selector": "app=web"}});
        assert_eq!(cells("Scale", &scale, now), [json!("web"), json!(5), json!(2), json!("3s")]);
    }

    #[test]
    fn webhook_configurations_count_their_webhooks() {
        for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
            assert_eq!(
                header(kind),
                [("Name", "string"), ("Webhooks", "integer"), ("Age", "string")]
            );
            let now = jiff::Timestamp::now();
            let created = skiff_core::time::sub_secs(now, 5).to_string();
            let wc = json!({
                "metadata": {"name": "hooks", "creationTimestamp": created},
                "webhooks": [{"name": "a.example.com"}, {"name": "b.example.com"}],
            });
            assert_eq!(cells(kind, &wc, now), [json!("hooks"), json!(2), json!("5s")]);
        }
    }
}
