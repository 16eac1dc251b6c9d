//! The default ClusterRoles and ClusterRoleBindings created at start (upstream's bootstrap
//! policy, trimmed to the resources skiff serves): cluster-admin, admin, edit and view
//! (aggregated from the `system:aggregate-to-*` roles, as upstream), the discovery roles, and the roles of the scheduler, controller manager, proxy, nodes and
//! bootstrappers. The apiserver creates those missing at start; existing objects are left as
//! they are (an administrator's edits win).

use serde_json::{Value, json};

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] =
    &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn urls(paths: &[&str], verbs: &[&str]) -> Value {
    json!({"nonResourceURLs": paths, "verbs": verbs})
}

fn role(name: &str, rules: Vec<Value>) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                     "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
        "rules": rules,
    })
}

fn binding(name: &str, role: &str, subjects: &[(&str, &str)]) -> Value {
    let subjects: Vec<Value> = subjects
        .iter()
        .map(|(kind, n)| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": n}))
        .collect();
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                     "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

/// Namespaced resources a viewer may read (not secrets, as upstream's `view`).
const VIEW_CORE: &[&str] = &[
    "pods",
    "pods/log",
    "pods/status",
    "services",
    "services/status",
    "endpoints",
    "configmaps",
    "persistentvolumeclaims",
    "persistentvolumeclaims/status",
    "replicationcontrollers",
    "replicationcontrollers/scale",
    "replicationcontrollers/status",
    "serviceaccounts",
    "events",
    "limitranges",
    "resourcequotas",
    "resourcequotas/status",
    "bindings",
    "namespaces",
    "namespaces/status",
];
const VIEW_APPS: &[&str] = &[
    "deployments",
    "deployments/scale",
    "deployments/status",
    "replicasets",
    "replicasets/scale",
    "replicasets/status",
    "statefulsets",
    "statefulsets/scale",
    "statefulsets/status",
    "daemonsets",
    "daemonsets/status",
    "controllerrevisions",
];
const VIEW_BATCH: &[&str] = &["jobs", "jobs/status", "cronjobs", "cronjobs/status"];

fn view_rules() -> Vec<Value> {
    vec![
        rule(&[""], VIEW_CORE, READ),
        rule(&["apps"], VIEW_APPS, READ),
        rule(&["batch"], VIEW_BATCH, READ),
        rule(&["discovery.k8s.io"], &["endpointslices"], READ),
        rule(
            &["autoscaling"],
            &["horizontalpodautoscalers", "horizontalpodautoscalers/status"],
            READ,
        ),
        rule(&["networking.k8s.io"], &["ingresses", "ingresses/status", "networkpolicies"], READ),
        rule(&["policy"], &["poddisruptionbudgets", "poddisruptionbudgets/status"], READ),
        // metrics-server's `system:aggregated-metrics-reader`, which aggregates into view,
        // edit and admin.
        rule(&["metrics.k8s.io"], &["pods", "nodes"], READ),
    ]
}

/// What edit adds to view.
fn edit_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
                "pods/eviction",
                "services",
                "services/proxy",
                "endpoints",
                "configmaps",
                "secrets",
                "persistentvolumeclaims",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "events",
            ],
            WRITE,
        ),
        rule(&[""], &["serviceaccounts/token"], &["create"]),
        rule(
            &["apps"],
            &[
                "deployments",
                "deployments/scale",
                "deployments/rollback",
                "replicasets",
                "replicasets/scale",
                "statefulsets",
                "statefulsets/scale",
                "daemonsets",
            ],
            WRITE,
        ),
        rule(&["batch"], &["jobs", "cronjobs"], WRITE),
        rule(&["discovery.k8s.io"], &["endpointslices"], WRITE),
        rule(&["autoscaling"], &["horizontalpodautoscalers"], WRITE),
        rule(&["networking.k8s.io"], &["ingresses", "networkpolicies"], WRITE),
        rule(&["policy"], &["poddisruptionbudgets"], WRITE),
        rule(&["coordination.k8s.io"], &["leases"], WRITE),
    ]
}

/// What admin adds to edit.
fn admin_rules() -> Vec<Value> {
    vec![
        rule(&["rbac.authorization.k8s.io"], &["roles", "rolebindings"], WRITE),
        rule(&["authorization.k8s.io"], &["localsubjectaccessreviews"], &["create"]),
    ]
}

const AGGREGATE_TO: &str = "rbac.authorization.k8s.io/aggregate-to-";

/// A ClusterRole labelled to aggregate into `into` (`aggregate-to-<into>: "true"`).
fn labelled(mut role: Value, into: &str) -> Value {
    role["metadata"]["labels"][format!("{AGGREGATE_TO}{into}")] = json!("true");
    role
}

/// A ClusterRole whose rules are those of the roles labelled `aggregate-to-<name>`.
fn aggregated(name: &str) -> Value {
    let mut r = role(name, Vec::new());
    r["aggregationRule"] = json!({"clusterRoleSelectors": [
        {"matchLabels": {format!("{AGGREGATE_TO}{name}"): "true"}}
    ]});
    r
}

/// Upstream's user-facing roles: `admin`, `edit` and `view` aggregate the
/// `system:aggregate-to-*` roles and each other (edit into admin, view into edit), so a
/// ClusterRole labelled `rbac.authorization.k8s.io/aggregate-to-edit` (an operator's, for
/// its custom resources) extends edit and admin. Their rules are computed here too, so a
/// server without the aggregation controller still grants them.
fn user_facing_roles() -> Vec<Value> {
    let mut roles = vec![
        aggregated("admin"),
        labelled(aggregated("edit"), "admin"),
        labelled(aggregated("view"), "edit"),
        labelled(role("system:aggregate-to-admin", admin_rules()), "admin"),
        labelled(role("system:aggregate-to-edit", edit_rules()), "edit"),
        labelled(role("system:aggregate-to-view", view_rules()), "view"),
    ];
    let mut typed: Vec<k8s_openapi::api::rbac::v1::ClusterRole> =
        roles.iter().filter_map(|r| serde_json::from_value(r.clone()).ok()).collect();
    skiff_core::rbac::aggregate_all(&mut typed);
    for (value, typed) in roles.iter_mut().zip(&typed) {
        value["rules"] = json!(typed.rules.clone().unwrap_or_default());
    }
    roles
}

/// The default ClusterRoles and ClusterRoleBindings.
pub fn objects() -> Vec<Value> {
    let discovery_paths = &[
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
        "/healthz",
        "/livez",
        "/readyz",
        "/version",
        "/version/",
        "/openapi",
        "/openapi/*",
    ];
    let public_paths = &["/healthz", "/livez", "/readyz", "/version", "/version/"];
    let mut objects = vec![
        role("cluster-admin", vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])]),
        binding("cluster-admin", "cluster-admin", &[("Group", "system:masters")]),
    ];
    objects.extend(user_facing_roles());
    objects.extend([
        role("system:discovery", vec![urls(discovery_paths, &["get"])]),
        binding("system:discovery", "system:discovery", &[("Group", "system:authenticated")]),
        role(
            "system:basic-user",
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
                rule(&["authentication.k8s.io"], &["selfsubjectreviews"], &["create"]),
            ],
        ),
        binding("system:basic-user", "system:basic-user", &[("Group", "system:authenticated")]),
        role("system:public-info-viewer", vec![urls(public_paths, &["get"])]),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[("Group", "system:authenticated"), ("Group", "system:unauthenticated")],
        ),
        role(
            "system:node-proxier",
            vec![
                rule(&[""], &["services", "endpoints", "nodes"], READ),
                rule(&["discovery.k8s.io"], &["endpointslices"], READ),
                rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
            ],
        ),
        binding("system:node-proxier", "system:node-proxier", &[("User", "system:kube-proxy")]),
        role(
            "system:kube-scheduler",
            vec![
                rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
                rule(
                    &["certificates.k8s.io"],
                    &["certificatesigningrequests"],
                    &["create", "get", "list", "watch"],
                ),
                rule(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["create", "get", "list", "watch", "update"],
                ),
                rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
                rule(&[""], &["bindings", "pods/binding"], &["create"]),
                rule(&[""], &["pods/status"], &["patch", "update"]),
                rule(
                    &[""],
                    &[
                        "nodes",
                        "namespaces",
                        "services",
                        "persistentvolumeclaims",
                        "persistentvolumes",
                        "replicationcontrollers",
                        "configmaps",
                    ],
                    READ,
                ),
                rule(&["apps"], &["replicasets", "statefulsets"], READ),
                rule(&["policy"], &["poddisruptionbudgets"], READ),
                rule(
                    &["storage.k8s.io"],
                    &["storageclasses", "csinodes", "csidrivers", "csistoragecapacities"],
                    READ,
                ),
            ],
        ),
        binding(
            "system:kube-scheduler",
            "system:kube-scheduler",
            &[("User", "system:kube-scheduler")],
        ),
        // skiff's controllers run in process as system:apiserver; an out-of-process
        // controller manager gets the powers its controllers need: all objects.
        role("system:kube-controller-manager", vec![rule(&["*"], &["*"], WRITE)]),
        binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            &[("User", "system:kube-controller-manager")],
        ),
        // Nodes are authorized by the Node authorizer; the role is kept for parity and its
        // binding has no subjects, as upstream's.
        role(
            "system:node",
            vec![
                rule(&[""], &["nodes"], &["create", "get", "list", "watch", "patch", "update"]),
                rule(&[""], &["nodes/status"], &["patch", "update"]),
                rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
                rule(&[""], &["pods/status"], &["patch", "update"]),
                rule(&[""], &["services", "endpoints"], READ),
                rule(&[""], &["secrets", "configmaps", "persistentvolumeclaims"], &["get"]),
                rule(&[""], &["persistentvolumes"], &["get"]),
                rule(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
                rule(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["create", "delete", "get", "patch", "update"],
                ),
            ],
        ),
        binding("system:node", "system:node", &[]),
        role(
            "system:node-bootstrapper",
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
                &["create", "get", "list", "watch"],
            )],
        ),
        binding(
            "system:node-bootstrapper",
            "system:node-bootstrapper",
            &[("Group", "system:bootstrappers")],
        ),
        // What the approving controller asks (a SubjectAccessReview of the requester): who
        // may have node client certificates approved automatically, as kubeadm binds them.
        role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/nodeclient"],
                &["create"],
            )],
        ),
        binding(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[("Group", "system:bootstrappers")],
        ),
        role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/selfnodeclient"],
                &["create"],
            )],
        ),
        binding(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[("Group", "system:nodes")],
        ),
    ]);
    objects
}
