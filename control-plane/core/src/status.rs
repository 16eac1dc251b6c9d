//! Status fields as upstream's Go types serialize them: the integer counts left out when
//! zero, which the apiserver strips and the controllers write as null.

/// The status fields of these kinds that upstream's Go types serialize with `omitempty`
/// from a plain integer: a zero is never stored or served.
pub const OMITTED_ZERO_STATUS: &[(&str, &str, &[&str])] = &[
    (
        "apps",
        "Deployment",
        &[
            "observedGeneration",
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
        ],
    ),
    (
        "apps",
        "ReplicaSet",
        &["fullyLabeledReplicas", "readyReplicas", "availableReplicas", "observedGeneration"],
    ),
    (
        "apps",
        "StatefulSet",
        &["observedGeneration", "readyReplicas", "currentReplicas", "updatedReplicas"],
    ),
    (
        "apps",
        "DaemonSet",
        &["observedGeneration", "updatedNumberScheduled", "numberAvailable", "numberUnavailable"],
    ),
    ("batch", "Job", &["active", "succeeded", "failed"]),
    ("policy", "PodDisruptionBudget", &["observedGeneration"]),
    (
        "",
        "ReplicationController",
        &["fullyLabeledReplicas", "readyReplicas", "availableReplicas", "observedGeneration"],
    ),
];

/// The status counts of `group`/`kind` in [`OMITTED_ZERO_STATUS`].
pub fn omitted_zero_status(group: &str, kind: &str) -> &'static [&'static str] {
    OMITTED_ZERO_STATUS
        .iter()
        .find(|(g, k, _)| *g == group && *k == kind)
        .map_or(&[], |(_, _, fields)| fields)
}
