//! Test fixture: a small subset of the upstream OpenAPI v3 component schemas (Deployment,
//! Pod template, Service) in upstream's shape, with the `x-kubernetes-*` extensions the
//! real documents carry, for strategic merge patch and server-side apply tests.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::schema::{FieldSchema, Schemas};

fn r(name: &str) -> Value {
    json!({ "allOf": [{ "$ref": format!("#/components/schemas/{name}") }], "default": {} })
}

fn map_of_strings() -> Value {
    json!({ "type": "object", "additionalProperties": { "type": "string", "default": "" } })
}

fn list_map(item: &str, keys: &[&str], merge_key: &str, strategy: &str) -> Value {
    json!({
        "type": "array",
        "items": { "allOf": [{ "$ref": format!("#/components/schemas/{item}") }], "default": {} },
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": keys,
        "x-kubernetes-patch-merge-key": merge_key,
        "x-kubernetes-patch-strategy": strategy,
    })
}

fn strings() -> Value {
    json!({ "type": "array", "items": { "type": "string", "default": "" } })
}

pub fn schemas() -> Schemas {
    let mut c = BTreeMap::new();
    let mut add = |name: &str, v: Value| {
        c.insert(name.to_string(), v);
    };
    add(
        "io.k8s.api.apps.v1.Deployment",
        json!({
            "type": "object",
            "properties": {
                "apiVersion": { "type": "string" },
                "kind": { "type": "string" },
                "metadata": r("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
                "spec": r("io.k8s.api.apps.v1.DeploymentSpec"),
                "status": r("io.k8s.api.apps.v1.DeploymentStatus"),
            },
            "x-kubernetes-group-version-kind": [{ "group": "apps", "kind": "Deployment", "version": "v1" }],
        }),
    );
    add(
        "io.k8s.api.apps.v1.DeploymentSpec",
        json!({
            "type": "object",
            "required": ["selector", "template"],
            "properties": {
                "replicas": { "type": "integer", "format": "int32" },
                "selector": r("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"),
                "template": r("io.k8s.api.core.v1.PodTemplateSpec"),
                "strategy": {
                    "allOf": [{ "$ref": "#/components/schemas/io.k8s.api.apps.v1.DeploymentStrategy" }],
                    "default": {},
                    "x-kubernetes-patch-strategy": "retainKeys",
                },
                "minReadySeconds": { "type": "integer", "format": "int32" },
                "revisionHistoryLimit": { "type": "integer", "format": "int32" },
                "progressDeadlineSeconds": { "type": "integer", "format": "int32" },
                "paused": { "type": "boolean" },
            },
        }),
    );
    add(
        "io.k8s.api.apps.v1.DeploymentStatus",
        json!({
            "type": "object",
            "properties": {
                "replicas": { "type": "integer", "format": "int32" },
                "readyReplicas": { "type": "integer", "format": "int32" },
                "observedGeneration": { "type": "integer", "format": "int64" },
            },
        }),
    );
    add(
        "io.k8s.api.apps.v1.DeploymentStrategy",
        json!({
            "type": "object",
            "properties": {
                "type": { "type": "string" },
                "rollingUpdate": { "$ref": "#/components/schemas/io.k8s.api.apps.v1.RollingUpdateDeployment" },
            },
        }),
    );
    add(
        "io.k8s.api.apps.v1.RollingUpdateDeployment",
        json!({
            "type": "object",
            "properties": {
                "maxSurge": r("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
                "maxUnavailable": r("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
            },
        }),
    );
    add(
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
        json!({ "type": "string", "format": "int-or-string" }),
    );
    add(
        "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
        json!({
            "type": "object",
            "properties": {
                "matchLabels": map_of_strings(),
                "matchExpressions": {
                    "type": "array",
                    "items": r("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement"),
                    "x-kubernetes-list-type": "atomic",
                },
            },
            "x-kubernetes-map-type": "atomic",
        }),
    );
    add(
        "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement",
        json!({
            "type": "object",
            "properties": {
                "key": { "type": "string" },
                "operator": { "type": "string" },
                "values": { "type": "array", "items": { "type": "string" }, "x-kubernetes-list-type": "atomic" },
            },
        }),
    );
    add(
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        json!({
            "type": "object",
            "properties": {
                "name": { "type": "string" },
                "namespace": { "type": "string" },
                "uid": { "type": "string" },
                "resourceVersion": { "type": "string" },
                "generation": { "type": "integer", "format": "int64" },
                "creationTimestamp": r("io.k8s.apimachinery.pkg.apis.meta.v1.Time"),
                "labels": map_of_strings(),
                "annotations": map_of_strings(),
                "finalizers": {
                    "type": "array",
                    "items": { "type": "string", "default": "" },
                    "x-kubernetes-list-type": "set",
                    "x-kubernetes-patch-strategy": "merge",
                },
                "ownerReferences": list_map(
                    "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference", &["uid"], "uid", "merge"),
                "managedFields": {
                    "type": "array",
                    "items": r("io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry"),
                    "x-kubernetes-list-type": "atomic",
                },
            },
        }),
    );
    add(
        "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
        json!({ "type": "string", "format": "date-time" }),
    );
    add(
        "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry",
        json!({
            "type": "object",
            "properties": {
                "manager": { "type": "string" },
                "operation": { "type": "string" },
                "apiVersion": { "type": "string" },
                "time": r("io.k8s.apimachinery.pkg.apis.meta.v1.Time"),
                "fieldsType": { "type": "string" },
                "fieldsV1": { "type": "object" },
                "subresource": { "type": "string" },
            },
        }),
    );
    add(
        "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
        json!({
            "type": "object",
            "required": ["apiVersion", "kind", "name", "uid"],
            "properties": {
                "apiVersion": { "type": "string", "default": "" },
                "kind": { "type": "string", "default": "" },
                "name": { "type": "string", "default": "" },
                "uid": { "type": "string", "default": "" },
                "controller": { "type": "boolean" },
                "blockOwnerDeletion": { "type": "boolean" },
            },
            "x-kubernetes-map-type": "atomic",
        }),
    );
    add(
        "io.k8s.api.core.v1.PodTemplateSpec",
        json!({
            "type": "object",
            "properties": {
                "metadata": r("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
                "spec": r("io.k8s.api.core.v1.PodSpec"),
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.PodSpec",
        json!({
            "type": "object",
            "required": ["containers"],
            "properties": {
                "containers": list_map("io.k8s.api.core.v1.Container", &["name"], "name", "merge"),
                "initContainers": list_map("io.k8s.api.core.v1.Container", &["name"], "name", "merge"),
                "volumes": list_map("io.k8s.api.core.v1.Volume", &["name"], "name", "merge,retainKeys"),
                "nodeSelector": {
                    "type": "object",
                    "additionalProperties": { "type": "string", "default": "" },
                    "x-kubernetes-map-type": "atomic",
                },
                "restartPolicy": { "type": "string" },
                "dnsPolicy": { "type": "string" },
                "schedulerName": { "type": "string" },
                "terminationGracePeriodSeconds": { "type": "integer", "format": "int64" },
                "securityContext": { "$ref": "#/components/schemas/io.k8s.api.core.v1.PodSecurityContext" },
                "tolerations": {
                    "type": "array",
                    "items": r("io.k8s.api.core.v1.Toleration"),
                    "x-kubernetes-list-type": "atomic",
                },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.PodSecurityContext",
        json!({
            "type": "object",
            "properties": {
                "runAsUser": { "type": "integer", "format": "int64" },
                "runAsNonRoot": { "type": "boolean" },
                "fsGroup": { "type": "integer", "format": "int64" },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.Toleration",
        json!({
            "type": "object",
            "properties": {
                "key": { "type": "string" },
                "operator": { "type": "string" },
                "effect": { "type": "string" },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.Container",
        json!({
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": { "type": "string", "default": "" },
                "image": { "type": "string" },
                "imagePullPolicy": { "type": "string" },
                "command": { "type": "array", "items": { "type": "string", "default": "" }, "x-kubernetes-list-type": "atomic" },
                "args": { "type": "array", "items": { "type": "string", "default": "" }, "x-kubernetes-list-type": "atomic" },
                "ports": list_map("io.k8s.api.core.v1.ContainerPort", &["containerPort", "protocol"], "containerPort", "merge"),
                "env": list_map("io.k8s.api.core.v1.EnvVar", &["name"], "name", "merge"),
                "volumeMounts": list_map("io.k8s.api.core.v1.VolumeMount", &["mountPath"], "mountPath", "merge"),
                "resources": r("io.k8s.api.core.v1.ResourceRequirements"),
                "readinessProbe": { "$ref": "#/components/schemas/io.k8s.api.core.v1.Probe" },
                "terminationMessagePath": { "type": "string" },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.ContainerPort",
        json!({
            "type": "object",
            "required": ["containerPort"],
            "properties": {
                "containerPort": { "type": "integer", "format": "int32", "default": 0 },
                "name": { "type": "string" },
                "hostPort": { "type": "integer", "format": "int32" },
                "protocol": { "type": "string", "default": "TCP" },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.EnvVar",
        json!({
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": { "type": "string", "default": "" },
                "value": { "type": "string" },
                "valueFrom": { "$ref": "#/components/schemas/io.k8s.api.core.v1.EnvVarSource" },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.EnvVarSource",
        json!({
            "type": "object",
            "properties": {
                "fieldRef": { "type": "object", "properties": { "fieldPath": { "type": "string" } }, "x-kubernetes-map-type": "atomic" },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.VolumeMount",
        json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "default": "" },
                "mountPath": { "type": "string", "default": "" },
                "readOnly": { "type": "boolean" },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.Volume",
        json!({
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": { "type": "string", "default": "" },
                "emptyDir": { "type": "object", "properties": { "medium": { "type": "string" } } },
                "configMap": { "type": "object", "properties": { "name": { "type": "string" } } },
                "secret": { "type": "object", "properties": { "secretName": { "type": "string" } } },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.ResourceRequirements",
        json!({
            "type": "object",
            "properties": {
                "limits": { "type": "object", "additionalProperties": r("io.k8s.apimachinery.pkg.api.resource.Quantity") },
                "requests": { "type": "object", "additionalProperties": r("io.k8s.apimachinery.pkg.api.resource.Quantity") },
            },
        }),
    );
    add("io.k8s.apimachinery.pkg.api.resource.Quantity", json!({ "type": "string" }));
    add(
        "io.k8s.api.core.v1.Probe",
        json!({
            "type": "object",
            "properties": {
                "periodSeconds": { "type": "integer" },
                "httpGet": {
                    "type": "object",
                    "properties": { "path": { "type": "string" }, "port": r("io.k8s.apimachinery.pkg.util.intstr.IntOrString") },
                },
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.Service",
        json!({
            "type": "object",
            "properties": {
                "apiVersion": { "type": "string" },
                "kind": { "type": "string" },
                "metadata": r("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
                "spec": r("io.k8s.api.core.v1.ServiceSpec"),
                "status": { "type": "object", "properties": { "loadBalancer": { "type": "object" } } },
            },
            "x-kubernetes-group-version-kind": [{ "group": "", "kind": "Service", "version": "v1" }],
        }),
    );
    add(
        "io.k8s.api.core.v1.ServiceSpec",
        json!({
            "type": "object",
            "properties": {
                "ports": list_map("io.k8s.api.core.v1.ServicePort", &["port", "protocol"], "port", "merge"),
                "selector": {
                    "type": "object",
                    "additionalProperties": { "type": "string", "default": "" },
                    "x-kubernetes-map-type": "atomic",
                },
                "type": { "type": "string" },
                "clusterIP": { "type": "string" },
                "clusterIPs": { "type": "array", "items": { "type": "string" }, "x-kubernetes-list-type": "atomic" },
                "externalIPs": strings(),
            },
        }),
    );
    add(
        "io.k8s.api.core.v1.ServicePort",
        json!({
            "type": "object",
            "required": ["port"],
            "properties": {
                "name": { "type": "string" },
                "protocol": { "type": "string", "default": "TCP" },
                "port": { "type": "integer", "format": "int32", "default": 0 },
                "targetPort": r("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
                "nodePort": { "type": "integer", "format": "int32" },
            },
        }),
    );
    Schemas::from_components(c)
}

/// The schema of a kind in `schemas`, as a navigable root.
pub fn kind<'a>(schemas: &'a Schemas, group: &str, kind: &str) -> FieldSchema<'a> {
    let raw = schemas.for_kind(group, "v1", kind).expect("fixture has the kind");
    schemas.field(raw)
}
