use std::time::Duration;

use serde_json::json;

use super::*;

fn pod_with_tolerations(tolerations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [], "tolerations": tolerations}}))
    .expect("pod")
}

fn taint(key: &str) -> Taint {
    Taint { key: key.into(), effect: "NoExecute".into(), ..Default::default() }
}

#[test]
fn toleration_time_follows_the_taint_manager() {
    let d = Duration::from_secs(300);
    let unreachable = [taint(TAINT_UNREACHABLE)];
    let p = pod_with_tolerations(json!([{"key": TAINT_UNREACHABLE, "operator": "Exists",
        "effect": "NoExecute", "tolerationSeconds": 30}]));
    assert_eq!(toleration_time(&p, &unreachable, d), Some(Some(Duration::from_secs(30))));
    let p = pod_with_tolerations(json!([{"operator": "Exists"}]));
    assert_eq!(toleration_time(&p, &unreachable, d), Some(None), "tolerates everything forever");
    let p = pod_with_tolerations(json!([]));
    assert_eq!(toleration_time(&p, &unreachable, d), Some(Some(d)), "default toleration");
    assert_eq!(toleration_time(&p, &[taint("custom")], d), None, "untolerated: evict now");
}

fn conditions(pairs: &[(&str, &str)]) -> Vec<NodeCondition> {
    pairs
        .iter()
        .map(|(t, s)| NodeCondition {
            type_: t.to_string(),
            status: s.to_string(),
            ..Default::default()
        })
        .collect()
}

#[test]
fn conditions_and_cordons_become_upstreams_taints() {
    let healthy = [
        ("Ready", "True"),
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
        ("NetworkUnavailable", "False"),
    ];
    assert_eq!(desired_taints(&conditions(&healthy), false), vec![]);
    assert_eq!(
        desired_taints(&conditions(&healthy), true),
        vec![(TAINT_UNSCHEDULABLE, "NoSchedule")]
    );
    assert_eq!(
        desired_taints(&conditions(&[("Ready", "False")]), false),
        vec![(TAINT_NOT_READY, "NoSchedule"), (TAINT_NOT_READY, "NoExecute")]
    );
    assert_eq!(
        desired_taints(&conditions(&[("Ready", "Unknown")]), false),
        vec![(TAINT_UNREACHABLE, "NoSchedule"), (TAINT_UNREACHABLE, "NoExecute")]
    );
    let pressed = [
        ("Ready", "True"),
        ("MemoryPressure", "True"),
        ("DiskPressure", "True"),
        ("PIDPressure", "True"),
        ("NetworkUnavailable", "True"),
    ];
    assert_eq!(
        desired_taints(&conditions(&pressed), false),
        vec![
            ("node.kubernetes.io/memory-pressure", "NoSchedule"),
            ("node.kubernetes.io/disk-pressure", "NoSchedule"),
            ("node.kubernetes.io/network-unavailable", "NoSchedule"),
            ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ]
    );
    // Pressure Unknown (a silent node) is no pressure taint; no conditions at all, none.
    let silent = [("Ready", "Unknown"), ("MemoryPressure", "Unknown")];
    assert_eq!(desired_taints(&conditions(&silent), false).len(), 2);
    assert_eq!(desired_taints(&[], false), vec![]);
    // The controller owns only the taints it can ask for.
    let t = |key: &str, effect: &str| Taint {
        key: key.into(),
        effect: effect.into(),
        ..Default::default()
    };
    assert!(managed(&t("node.kubernetes.io/memory-pressure", "NoSchedule")));
    assert!(managed(&t(TAINT_UNSCHEDULABLE, "NoSchedule")));
    assert!(!managed(&t(TAINT_UNSCHEDULABLE, "NoExecute")));
    assert!(!managed(&t("node.kubernetes.io/memory-pressure", "NoExecute")));
    assert!(!managed(&t("example.com/gpu", "NoSchedule")));
}

#[test]
fn a_silent_node_gets_upstreams_unknown_conditions() {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let created: Time = serde_json::from_value(json!("2026-01-02T03:04:05Z")).unwrap();
    let node = |conds: serde_json::Value| -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n", "creationTimestamp": created},
            "status": {"conditions": conds}}))
        .unwrap()
    };
    // Never posted: the four health conditions, NodeStatusNeverUpdated.
    let never = unknown_conditions(&node(json!([])), &now).expect("changed");
    let types: Vec<&str> = never.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, HEALTH_CONDITIONS);
    for c in &never {
        assert_eq!(c.status, "Unknown");
        assert_eq!(c.reason.as_deref(), Some("NodeStatusNeverUpdated"));
        assert_eq!(c.message.as_deref(), Some("Kubelet never posted node status."));
        assert_eq!(c.last_heartbeat_time.as_ref(), Some(&created));
        assert_eq!(c.last_transition_time.as_ref(), Some(&now));
    }
    // Posted, then silent: each health condition flips, NetworkUnavailable stays.
    let was = node(json!([
        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
        {"type": "DiskPressure", "status": "False"},
        {"type": "PIDPressure", "status": "False"},
        {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
    ]));
    let stopped = unknown_conditions(&was, &now).expect("changed");
    assert_eq!(stopped.len(), 5);
    for c in &stopped {
        if c.type_ == "NetworkUnavailable" {
            assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("RouteCreated")));
            assert_eq!(c.last_transition_time, None);
        } else {
            assert_eq!(c.status, "Unknown");
            assert_eq!(c.reason.as_deref(), Some("NodeStatusUnknown"));
            assert_eq!(c.message.as_deref(), Some("Kubelet stopped posting node status."));
            assert_eq!(c.last_transition_time.as_ref(), Some(&now));
        }
    }
    // Already Unknown: nothing to write.
    let again = Node {
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(stopped),
            ..Default::default()
        }),
        ..was
    };
    assert!(unknown_conditions(&again, &now).is_none());
}
