//! Pod template hashes: `pod-template-hash` (Deployment → ReplicaSet) and
//! `controller-revision-hash` (DaemonSet, StatefulSet), computed as upstream's
//! `controller.ComputeHash`: FNV-1a 32 over the template (plus the collision count, little
//! endian), rendered with `rand.SafeEncodeString` of its decimal form.
//!
//! Upstream hashes the Go struct as printed by `spew`; we hash the template's canonical JSON
//! (keys sorted, as serde_json's map is ordered), so values differ from upstream's while
//! keeping its properties: stable for one template, changing with any field.

use k8s_openapi::api::core::v1::PodTemplateSpec;

/// The label Deployments put on their ReplicaSets and pods.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The label DaemonSets and StatefulSets put on their pods.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;
/// `rand.SafeEncodeString`'s alphabet: no vowels (no words) and no look-alikes (0/o, 1/l, 3/e).
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn fnv32a(h: u32, data: &[u8]) -> u32 {
    data.iter().fold(h, |h, b| (h ^ u32::from(*b)).wrapping_mul(FNV_PRIME))
}

/// `rand.SafeEncodeString`.
pub fn safe_encode(s: &str) -> String {
    s.bytes().map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char).collect()
}

/// `controller.ComputeHash(template, collisionCount)`. The template is hashed without any
/// `pod-template-hash` label.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut t = template.clone();
    if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(POD_TEMPLATE_HASH);
    }
    // Through `Value` so object keys are sorted (serde_json's default map is a BTreeMap).
    let canonical =
        serde_json::to_value(&t).and_then(|v| serde_json::to_vec(&v)).unwrap_or_default();
    let mut h = fnv32a(FNV_OFFSET, &canonical);
    if let Some(c) = collision_count {
        h = fnv32a(h, &(c as u32).to_le_bytes());
    }
    safe_encode(&h.to_string())
}

/// Whether two templates are equal ignoring the `pod-template-hash` label
/// (`EqualIgnoreHash`).
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |t: &PodTemplateSpec| {
        let mut t = t.clone();
        let meta = t.metadata.get_or_insert_with(Default::default);
        if let Some(l) = meta.labels.as_mut() {
            l.remove(POD_TEMPLATE_HASH);
            if l.is_empty() {
                meta.labels = None;
            }
        }
        serde_json::to_value(t).unwrap_or_default()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv32a(FNV_OFFSET, b""), 0x811c9dc5);
        assert_eq!(fnv32a(FNV_OFFSET, b"a"), 0xe40c292c);
        assert_eq!(fnv32a(FNV_OFFSET, b"foobar"), 0xbf9cf968);
    }

    #[test]
    fn safe_encode_like_upstream() {
        // '0' is 48: 48 % 27 = 21 → '4'; '9' is 57: 57 % 27 = 3 → 'f'.
        assert_eq!(safe_encode("09"), "4f");
    }

    #[test]
    fn hash_ignores_its_own_label_and_uses_collision_count() {
        let t = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "x".to_string())].into()),
                ..Default::default()
            }),
            spec: None,
        };
        let mut labelled = t.clone();
        if let Some(l) = labelled.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            l.insert(POD_TEMPLATE_HASH.into(), "abc".into());
        }
        assert_eq!(compute_hash(&t, None), compute_hash(&labelled, None));
        assert!(equal_ignore_hash(&t, &labelled));
        assert_ne!(compute_hash(&t, None), compute_hash(&t, Some(1)));
        assert!(compute_hash(&t, None).bytes().all(|b| ALPHANUMS.contains(&b)));
    }
}
