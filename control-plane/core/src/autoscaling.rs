//! HorizontalPodAutoscaler behaviour defaults (upstream's `GenerateHPAScaleUpRules` and
//! `GenerateHPAScaleDownRules`): what defaulting writes and what the controller assumes
//! when a behaviour is absent.

use serde_json::{Value, json};

/// The scale-up rules upstream fills in (`GenerateHPAScaleUpRules`): no stabilization,
/// the larger of 4 pods or 100% per 15 s.
pub fn default_scale_up() -> Value {
    json!({
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15},
        ],
    })
}

/// The scale-down rules upstream fills in (`GenerateHPAScaleDownRules`): up to 100% per
/// 15 s. The stabilization window is left unset: the controller's
/// `--horizontal-pod-autoscaler-downscale-stabilization` (5 minutes) applies.
pub fn default_scale_down() -> Value {
    json!({
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    })
}
