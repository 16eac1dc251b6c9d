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
    assert_eq!(desired_taints(Some("True")), vec![]);
    assert_eq!(desired_taints(Some("False"))[1], (TAINT_NOT_READY, "NoExecute"));
    assert_eq!(desired_taints(Some("Unknown"))[0], (TAINT_UNREACHABLE, "NoSchedule"));
}
