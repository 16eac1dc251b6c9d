//! Pods as the scheduler watches them: decoded without `metadata.managedFields`, which the
//! scheduler never reads and which made up most of a watched pod's decode (a FieldsV1 tree
//! of JSON values per manager, built and dropped for every event), and with only the
//! PersistentVolumeClaim members of `spec.volumes`, the one volume source a filter reads
//! (the service-account token volume that admission adds to every pod was about half of
//! what remained).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodStatus, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::de::value::{BorrowedStrDeserializer, MapAccessDeserializer, StringDeserializer};
use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use skiff_core::json::MemberName;

/// A [`Pod`] whose managed fields and volumes other than claims were skipped while
/// decoding (the rest is as sent).
#[derive(Clone, Debug)]
pub struct WatchedPod(pub Pod);

impl Resource for WatchedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// `ObjectMeta` less `managedFields` (an unknown field to serde: skipped, not built).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

#[derive(Deserialize)]
struct Slim {
    #[serde(default)]
    metadata: Option<Meta>,
    spec: Option<SpecWithoutVolumes>,
    status: Option<PodStatus>,
}

/// A [`PodSpec`] decoded with only the claim volumes of its `volumes` member built (the
/// others checked as JSON).
struct SpecWithoutVolumes(PodSpec);

/// A volume as far as the scheduler reads it: its name and claim (other sources skipped).
#[derive(Deserialize)]
struct ClaimVolume {
    name: String,
    #[serde(rename = "persistentVolumeClaim")]
    claim: Option<PersistentVolumeClaimVolumeSource>,
}

impl<'de> Deserialize<'de> for SpecWithoutVolumes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpecVisitor;
        impl<'de> Visitor<'de> for SpecVisitor {
            type Value = SpecWithoutVolumes;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a PodSpec object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SpecWithoutVolumes, A::Error> {
                let mut claims = Vec::new();
                let mut spec = PodSpec::deserialize(MapAccessDeserializer::new(SkipVolumes {
                    map,
                    claims: &mut claims,
                }))?;
                spec.volumes = (!claims.is_empty()).then_some(claims);
                Ok(SpecWithoutVolumes(spec))
            }
        }
        deserializer.deserialize_map(SpecVisitor)
    }
}

/// The members of a map less `volumes`, whose claim volumes go to `claims`.
struct SkipVolumes<'c, A> {
    map: A,
    claims: &'c mut Vec<Volume>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipVolumes<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        loop {
            match self.map.next_key::<MemberName<'de>>()? {
                None => return Ok(None),
                Some(name) if name.as_str() == "volumes" => {
                    let volumes = self.map.next_value::<Option<Vec<ClaimVolume>>>()?;
                    self.claims.extend(volumes.into_iter().flatten().filter_map(|v| {
                        v.claim.map(|c| Volume {
                            name: v.name,
                            persistent_volume_claim: Some(c),
                            ..Default::default()
                        })
                    }));
                }
                Some(MemberName::Borrowed(k)) => {
                    return seed.deserialize(BorrowedStrDeserializer::new(k)).map(Some);
                }
                Some(MemberName::Owned(k)) => {
                    return seed.deserialize(StringDeserializer::new(k)).map(Some);
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Slim { metadata, spec, status } = Slim::deserialize(deserializer)?;
        let metadata = metadata.map_or_else(ObjectMeta::default, |m| ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        });
        Ok(WatchedPod(Pod { metadata, spec: spec.map(|s| s.0), status }))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Everything but the managed fields and non-claim volumes decodes as the typed Pod does.
    #[test]
    fn decodes_as_pod_without_managed_fields() {
        let raw = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "a"}, "annotations": {"k": "v"}, "finalizers": ["f"],
                "generateName": "p-", "generation": 2, "selfLink": "/x",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "u2", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}],
                "volumes": [{"name": "v", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}],
                "priority": 7},
            "status": {"phase": "Pending"}
        });
        // From bytes, as the watch decodes them (member names borrowed from the input).
        let watched: WatchedPod = serde_json::from_slice(raw.to_string().as_bytes()).unwrap();
        let mut typed: Pod = serde_json::from_value(raw.clone()).unwrap();
        assert!(typed.metadata.managed_fields.take().is_some_and(|m| m.len() == 1));
        // Of the volumes only the claim is kept.
        let spec = typed.spec.as_mut().unwrap();
        let volumes = spec.volumes.as_mut().unwrap();
        assert_eq!(volumes.len(), 2);
        volumes.remove(0);
        assert_eq!(watched.0, typed);
        // From a Value (owned member names), and a malformed spec is still an error.
        let watched: WatchedPod = serde_json::from_value(raw).unwrap();
        assert_eq!(watched.0, typed);
        let bad = json!({"spec": {"volumes": [], "priority": "high"}});
        assert!(serde_json::from_value::<WatchedPod>(bad).is_err());
        let empty: WatchedPod = serde_json::from_value(json!({})).unwrap();
        assert_eq!(empty.0, Pod::default());
    }
}
