//! The scheduler and the node agent reach the same exact values for every quantity form
//! upstream's `resource.Quantity` parses (decimal and binary suffixes, exponents, fractions
//! that round up): a pod that fits a node exactly is neither refused by the node after the
//! scheduler placed it, nor placed where it cannot fit.

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// (quantity, upstream's MilliValue, upstream's Value).
const CASES: &[(&str, i64, i64)] = &[
    ("0", 0, 0),
    ("0m", 0, 0),
    ("0Ki", 0, 0),
    ("1", 1000, 1),
    ("100m", 100, 1),
    ("0.1", 100, 1),
    ("1.5", 1500, 2),
    ("2.007", 2007, 3),
    ("0.0001", 1, 1),
    ("1.0001", 1001, 2),
    ("1.001m", 2, 1),
    ("9n", 1, 1),
    ("9u", 1, 1),
    ("1k", 1_000_000, 1000),
    ("1Ki", 1_024_000, 1024),
    ("1.5Ki", 1_536_000, 1536),
    ("128Mi", 134_217_728_000, 134_217_728),
    ("1G", 1_000_000_000_000, 1_000_000_000),
    ("1Gi", 1_073_741_824_000, 1_073_741_824),
    ("1e3", 1_000_000, 1000),
    ("1E3", 1_000_000, 1000),
    ("1.5e3", 1_500_000, 1500),
    ("2e-3", 2, 1),
    ("+3", 3000, 3),
    ("12E", i64::MAX, i64::MAX),
    ("12Ei", i64::MAX, i64::MAX),
];

fn pod(q: &str) -> Pod {
    serde_json::from_value(json!({"spec": {"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"cpu": q, "memory": q}}}]}}))
    .expect("pod")
}

#[test]
fn the_scheduler_and_the_node_agree_on_every_quantity() {
    for (q, milli, value) in CASES {
        let p = pod(q);
        let (scheduler, _) = skiff_scheduler::resources::pod_requests(&p);
        let container = &p.spec.as_ref().expect("spec").containers[0];
        let (node_cpu, node_memory) = skiff_agent::pods::admit::container_requests(container);
        assert_eq!(scheduler.milli_cpu, *milli, "scheduler cpu of {q}");
        assert_eq!(scheduler.memory, *value, "scheduler memory of {q}");
        assert_eq!(node_cpu, *milli as u64, "node cpu of {q}");
        assert_eq!(node_memory, *value as u64, "node memory of {q}");
    }
}
