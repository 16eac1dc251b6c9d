use serde_json::{Value, json};

use super::*;

const JOB: Gvk<'static> = Gvk::new("batch", "v1", "Job");

fn job() -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "pi", "namespace": "default", "uid": "0b1c"},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "pi", "image": "perl:5.34"}]
        }}}
    })
}

#[test]
fn job_defaults_and_generated_selector() {
    let j = admitted(JOB, job());
    let spec = &j["spec"];
    assert_eq!(spec["completions"], 1);
    assert_eq!(spec["parallelism"], 1);
    assert_eq!(spec["backoffLimit"], 6);
    assert_eq!(spec["completionMode"], "NonIndexed");
    assert_eq!(spec["suspend"], false);
    assert_eq!(spec["podReplacementPolicy"], "TerminatingOrFailed");
    assert_eq!(spec["manualSelector"], false);
    assert_eq!(
        spec["selector"],
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "0b1c"}})
    );
    let labels = json!({
        "batch.kubernetes.io/controller-uid": "0b1c", "batch.kubernetes.io/job-name": "pi",
        "controller-uid": "0b1c", "job-name": "pi"
    });
    assert_eq!(spec["template"]["metadata"]["labels"], labels);
    assert_eq!(j["metadata"]["labels"], labels, "a job without labels takes its template's");
    assert_eq!(j["metadata"]["generation"], 1);
    // Only parallelism set: completions stay unset.
    let mut p = job();
    p["spec"]["parallelism"] = json!(3);
    let j = admitted(JOB, p);
    assert!(j["spec"].get("completions").is_none());
}

#[test]
fn job_rejections() {
    let base = job();
    let cases: &[Case] = &[
        (
            "restart always",
            &|j| {
                j["spec"]["template"]["spec"].as_object_mut().unwrap().remove("restartPolicy");
            },
            "spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\"",
            "FieldValueRequired",
        ),
        (
            "restart policy value",
            &|j| {
                j["spec"]["template"]["spec"]["restartPolicy"] = json!("Sometimes");
            },
            "spec.template.spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"OnFailure\", \"Never\"",
            "FieldValueNotSupported",
        ),
        (
            "wrong uid label",
            &|j| {
                j["spec"]["template"]["metadata"] = json!({"labels": {"controller-uid": "other"}});
            },
            "spec.template.metadata.labels[controller-uid]: Invalid value: map[string]string{\"batch.kubernetes.io/controller-uid\":\"0b1c\", \"batch.kubernetes.io/job-name\":\"pi\", \"controller-uid\":\"other\", \"job-name\":\"pi\"}: must be '0b1c'",
            "FieldValueInvalid",
        ),
        (
            "per index without indexed",
            &|j| {
                j["spec"]["backoffLimitPerIndex"] = json!(1);
            },
            "spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode",
            "FieldValueInvalid",
        ),
        (
            "parallelism",
            &|j| {
                j["spec"]["parallelism"] = json!(-1);
            },
            "spec.parallelism: Invalid value: -1: must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
        (
            "completions",
            &|j| {
                j["spec"]["completions"] = json!(-1);
            },
            "spec.completions: Invalid value: -1: must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
        (
            "backoff",
            &|j| {
                j["spec"]["backoffLimit"] = json!(-1);
            },
            "spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0",
            "FieldValueInvalid",
        ),
        (
            "completion mode",
            &|j| {
                j["spec"]["completionMode"] = json!("Sometimes");
            },
            "spec.completionMode: Unsupported value: \"Sometimes\": supported values: \"NonIndexed\", \"Indexed\"",
            "FieldValueNotSupported",
        ),
        (
            "selector without manual",
            &|j| {
                j["spec"]["selector"] = json!({"matchLabels": {"a": "b"}});
            },
            "spec.selector: Invalid value: {\"matchLabels\":{\"a\":\"b\",\"batch.kubernetes.io/controller-uid\":\"0b1c\"}}: `selector` not auto-generated",
            "FieldValueInvalid",
        ),
        (
            "manual mismatch",
            &|j| {
                j["spec"]["manualSelector"] = json!(true);
                j["spec"]["selector"] = json!({"matchLabels": {"a": "b"}});
            },
            "spec.template.metadata.labels: Invalid value: map[string]string(nil): `selector` does not match template `labels`",
            "FieldValueInvalid",
        ),
        (
            "manual without selector",
            &|j| {
                j["spec"]["manualSelector"] = json!(true);
            },
            "spec.selector: Required value",
            "FieldValueRequired",
        ),
        (
            "failure policy action",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"action": "Retry", "onExitCodes": {"operator": "In", "values": [1]}}]});
            },
            "spec.podFailurePolicy.rules[0].action: Unsupported value: \"Retry\": supported values: \"Count\", \"FailIndex\", \"FailJob\", \"Ignore\"",
            "FieldValueNotSupported",
        ),
        (
            "failure policy without action",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"onExitCodes": {"operator": "In", "values": [1]}}]});
            },
            "spec.podFailurePolicy.rules[0].action: Required value: valid values: [\"Count\" \"FailIndex\" \"FailJob\" \"Ignore\"]",
            "FieldValueRequired",
        ),
        (
            "failure policy FailIndex",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}]});
            },
            "spec.podFailurePolicy.rules[0].action: Invalid value: \"FailIndex\": requires the backoffLimitPerIndex to be set",
            "FieldValueInvalid",
        ),
        (
            "failure policy container",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [1]}}]});
            },
            "spec.podFailurePolicy.rules[0].onExitCodes.containerName: Invalid value: \"main\": must be one of the container or initContainer names in the pod template",
            "FieldValueInvalid",
        ),
        (
            "failure policy zero",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0, 2]}}]});
            },
            "spec.podFailurePolicy.rules[0].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator",
            "FieldValueInvalid",
        ),
        (
            "failure policy order",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [3, 2]}}]});
            },
            "spec.podFailurePolicy.rules[0].onExitCodes.values: Invalid value: []int32{3, 2}: must be ordered",
            "FieldValueInvalid",
        ),
        (
            "failure policy empty rule",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "Ignore"}]});
            },
            "spec.podFailurePolicy.rules[0]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
            "FieldValueInvalid",
        ),
        (
            "failure policy condition status",
            &|j| {
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "Maybe"}]}]});
            },
            "spec.podFailurePolicy.rules[0].onPodConditions[0].status: Unsupported value: \"Maybe\": supported values: \"False\", \"True\", \"Unknown\"",
            "FieldValueNotSupported",
        ),
        (
            "failure policy with OnFailure",
            &|j| {
                j["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
                j["spec"]["podFailurePolicy"] = json!({"rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]});
            },
            "spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified",
            "FieldValueInvalid",
        ),
        (
            "maxFailedIndexes above completions",
            &|j| {
                indexed(j, 3);
                j["spec"]["backoffLimitPerIndex"] = json!(1);
                j["spec"]["maxFailedIndexes"] = json!(4);
            },
            "spec.maxFailedIndexes: Invalid value: 4: must be less than or equal to completions",
            "FieldValueInvalid",
        ),
        (
            "successPolicy without Indexed",
            &|j| {
                j["spec"]["successPolicy"] = json!({"rules": [{"succeededCount": 1}]});
            },
            "spec.successPolicy: Invalid value: {\"rules\":[{\"succeededCount\":1}]}: requires indexed completion mode",
            "FieldValueInvalid",
        ),
        (
            "successPolicy without rules",
            &|j| {
                indexed(j, 3);
                j["spec"]["successPolicy"] = json!({"rules": []});
            },
            "spec.successPolicy.rules: Required value: at least one rules must be specified when the successPolicy is specified",
            "FieldValueRequired",
        ),
        (
            "successPolicy empty rule",
            &|j| {
                indexed(j, 3);
                j["spec"]["successPolicy"] = json!({"rules": [{}]});
            },
            "spec.successPolicy.rules[0]: Required value: at least one of succeededCount or succeededIndexes must be specified",
            "FieldValueRequired",
        ),
        (
            "succeededIndexes out of order",
            &|j| {
                indexed(j, 10);
                j["spec"]["successPolicy"] = json!({"rules": [{"succeededIndexes": "0-3,2"}]});
            },
            "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"0-3,2\": error parsing succeededIndexes: non-increasing order, previous: 3, current: 2",
            "FieldValueInvalid",
        ),
        (
            "succeededIndexes too large",
            &|j| {
                indexed(j, 3);
                j["spec"]["successPolicy"] = json!({"rules": [{"succeededIndexes": "1-3"}]});
            },
            "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"1-3\": error parsing succeededIndexes: too large index: \"3\"",
            "FieldValueInvalid",
        ),
        (
            "succeededCount above the listed indexes",
            &|j| {
                indexed(j, 5);
                j["spec"]["successPolicy"] =
                    json!({"rules": [{"succeededIndexes": "0,2", "succeededCount": 3}]});
            },
            "spec.successPolicy.rules[0].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of indexes in the specified succeededIndexes field)",
            "FieldValueInvalid",
        ),
        (
            "succeededCount above completions",
            &|j| {
                indexed(j, 2);
                j["spec"]["successPolicy"] = json!({"rules": [{"succeededCount": 3}]});
            },
            "spec.successPolicy.rules[0].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of specified completions)",
            "FieldValueInvalid",
        ),
    ];
    rejects(JOB, &base, cases);
}

fn indexed(j: &mut Value, completions: i32) {
    j["spec"]["completionMode"] = json!("Indexed");
    j["spec"]["completions"] = json!(completions);
}

#[test]
fn indexed_job_policies_are_accepted_and_immutable() {
    let mut j = job();
    indexed(&mut j, 4);
    j["spec"]["backoffLimitPerIndex"] = json!(1);
    j["spec"]["maxFailedIndexes"] = json!(2);
    j["spec"]["successPolicy"] =
        json!({"rules": [{"succeededIndexes": "0,2-3", "succeededCount": 3}]});
    let old = admitted(JOB, j);
    assert_eq!(old["spec"]["backoffLimit"], 2147483647, "defaulted with backoffLimitPerIndex");
    let mut new = old.clone();
    new["spec"]["maxFailedIndexes"] = json!(3);
    let (_, errs, _) = update(JOB, None, &old, new.clone());
    assert!(errs.is_empty(), "maxFailedIndexes may change: {:?}", strings(&errs));
    new["spec"]["backoffLimitPerIndex"] = json!(2);
    new["spec"]["successPolicy"] = json!({"rules": [{"succeededCount": 1}]});
    let (_, errs, _) = update(JOB, None, &old, new);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["spec.backoffLimitPerIndex", "spec.successPolicy"], "{:?}", strings(&errs));
}

#[test]
fn pod_failure_policy_defaults() {
    let mut j = job();
    j["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}, {"type": "Ready", "status": "False"}]},
        {"action": "Ignore", "onPodConditions": [{"type": "Evicted", "status": ""}]}]});
    let j = admitted(JOB, j);
    assert_eq!(
        j["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"],
        json!([{"type": "DisruptionTarget", "status": "True"}, {"type": "Ready", "status": "False"}])
    );
    assert_eq!(j["spec"]["podFailurePolicy"]["rules"][1]["onPodConditions"][0]["status"], "True");
    assert_eq!(j["spec"]["podReplacementPolicy"], "Failed");
}

#[test]
fn job_template_is_immutable() {
    let old = admitted(JOB, job());
    let mut new = old.clone();
    new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("perl:5.36");
    let (_, errs, _) = update(JOB, None, &old, new);
    assert_eq!(errs.len(), 1, "{:?}", strings(&errs));
    assert_eq!(errs[0].field, "spec.template");
    assert!(errs[0].to_string().ends_with(": field is immutable"));
    // Suspending is allowed and counts as a spec change.
    let mut new = old.clone();
    new["spec"]["suspend"] = json!(true);
    let (obj, errs, prepared) = update(JOB, None, &old, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert!(prepared.spec_changed);
    assert_eq!(obj["metadata"]["generation"], 2);
}
