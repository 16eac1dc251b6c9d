//! ControllerRevisions: the template history of DaemonSets and StatefulSets (upstream's
//! `controller/history`), which `kubectl rollout history` and `rollout undo` read.
//! - One revision per distinct pod template, named `<owner>-<hash>` with the template's
//!   `controller-revision-hash`, labelled with the template's labels and that hash, carrying
//!   the owner's annotations (`kubernetes.io/change-cause` among them).
//! - Its `data` is the strategic merge patch that restores the template:
//!   `{"spec":{"template":{"$patch":"replace",...}}}`, in the shape upstream's `getPatch`
//!   gives it (a Go struct marshalled through a map: keys sorted, and the template's
//!   `metadata.creationTimestamp: null`). kubectl compares it byte for byte with what it
//!   computes from the owner to tell that `rollout undo --to-revision` is a no-op.
//! - `revision` counts up in the order templates became current. Going back to an older
//!   template renumbers its revision as the newest, as upstream does.
//! - Past `revisionHistoryLimit` the oldest revisions that no pod uses are deleted.
//!
//! Revisions belong to their owner through a controller ownerReference, so the garbage
//! collector deletes them with it. Orphaned revisions the owner's selector matches are
//! adopted (after `kubectl delete --cascade=orphan` and a re-create), as upstream's
//! `ClaimControllerRevisions`. Unlike upstream, a hash collision (another template under
//! the same name) is an error rather than a bump of `collisionCount`.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::hash::CONTROLLER_REVISION_HASH;
use super::pods::{controller_ref, is_not_found, owner_ref, selector_matches};

/// Upstream's default `revisionHistoryLimit` for DaemonSets and StatefulSets.
pub const DEFAULT_LIMIT: i32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing the controller revisions of {owner}")]
    List {
        owner: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing controller revision {name}")]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("controller revision {name} holds another template (hash collision)")]
    Collision { name: String },
}

/// The strategic merge patch that restores `template` (upstream's `getPatch`).
pub fn patch_data(template: &PodTemplateSpec) -> Value {
    let mut template = serde_json::to_value(template).unwrap_or_default();
    if let Value::Object(fields) = &mut template {
        fields.insert("$patch".into(), "replace".into());
        // Go marshals the zero metav1.Time of a template as null.
        let meta = fields.entry("metadata").or_insert_with(|| json!({}));
        if let Value::Object(meta) = meta {
            meta.entry("creationTimestamp").or_insert(Value::Null);
        }
    }
    json!({"spec": {"template": template}})
}

/// A template with its metadata present (the data always has it: Go marshals the struct).
fn with_metadata(mut t: PodTemplateSpec) -> PodTemplateSpec {
    t.metadata.get_or_insert_with(Default::default);
    t
}

/// The template a revision restores.
pub fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut template = revision.data.as_ref()?.0.get("spec")?.get("template")?.clone();
    template.as_object_mut()?.remove("$patch");
    serde_json::from_value(template).ok()
}

/// Make an orphaned revision the owner's (a controller ownerReference added, on the
/// revision's resourceVersion).
async fn adopt<K: Resource<DynamicType = ()>>(
    api: &Api<ControllerRevision>,
    owner: &K,
    revision: &ControllerRevision,
) -> Result<ControllerRevision, Error> {
    let mut refs = revision.metadata.owner_references.clone().unwrap_or_default();
    refs.push(owner_ref(owner));
    let patch = json!({"metadata": {
        "resourceVersion": revision.resource_version(),
        "ownerReferences": refs,
    }});
    let name = revision.name_any();
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Write { name, source })
}

/// The owner's revisions, orphans its selector matches adopted, oldest first.
async fn owned<K: Resource<DynamicType = ()>>(
    api: &Api<ControllerRevision>,
    owner: &K,
    selector: &LabelSelector,
) -> Result<Vec<ControllerRevision>, Error> {
    let uid = owner.meta().uid.clone().unwrap_or_default();
    // The selector's matchLabels narrow the list on the server; matchExpressions are
    // checked here.
    let labels: Vec<String> =
        selector.match_labels.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
    let list = api
        .list(&ListParams::default().labels(&labels.join(",")))
        .await
        .map_err(|source| Error::List { owner: owner.name_any(), source })?;
    let mut revisions = Vec::new();
    for r in list.items {
        match controller_ref(&r.metadata) {
            Some(o) if o.uid == uid => revisions.push(r),
            Some(_) => {}
            None if r.metadata.deletion_timestamp.is_none()
                && selector_matches(
                    Some(selector),
                    r.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                ) =>
            {
                revisions.push(adopt(api, owner, &r).await?);
            }
            None => {}
        }
    }
    revisions.sort_by_key(|r| (r.revision, r.name_any()));
    Ok(revisions)
}

/// Make `<owner>-<hash>` the revision of `template` and the newest one; returns the owner's
/// revisions, oldest first (the current one last).
pub async fn record<K: Resource<DynamicType = ()>>(
    client: &Client,
    owner: &K,
    selector: &LabelSelector,
    template: &PodTemplateSpec,
    hash: &str,
) -> Result<Vec<ControllerRevision>, Error> {
    let ns = owner.namespace().unwrap_or_default();
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let mut revisions = owned(&api, owner, selector).await?;
    let name = format!("{}-{hash}", owner.name_any());
    let data = patch_data(template);
    let newest = revisions.last().map_or(0, |r| r.revision);
    let write = |source| Error::Write { name: name.clone(), source };
    if let Some(i) = revisions.iter().position(|r| r.metadata.name.as_deref() == Some(&name)) {
        // By template, not bytes: revisions recorded before the data took upstream's exact
        // shape hold the same template.
        if template_of(&revisions[i]).map(with_metadata) != Some(with_metadata(template.clone())) {
            return Err(Error::Collision { name });
        }
        if i + 1 < revisions.len() {
            // An older template is current again: it becomes the newest revision.
            let patch = json!({
                "metadata": {"resourceVersion": revisions[i].resource_version()},
                "revision": newest + 1,
            });
            let renumbered = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(write)?;
            revisions.remove(i);
            revisions.push(renumbered);
        }
        return Ok(revisions);
    }
    let mut labels: BTreeMap<String, String> =
        template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    labels.insert(CONTROLLER_REVISION_HASH.into(), hash.into());
    let revision = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: owner.meta().annotations.clone(),
            owner_references: Some(vec![owner_ref(owner)]),
            ..Default::default()
        },
        data: Some(RawExtension(data)),
        revision: newest + 1,
    };
    let created = api.create(&PostParams::default(), &revision).await.map_err(write)?;
    revisions.push(created);
    Ok(revisions)
}

/// Delete the oldest revisions beyond `limit` that are not in `keep` (the names of the
/// revisions current pods use, and the current and update revisions).
pub async fn truncate(
    client: &Client,
    ns: &str,
    revisions: &[ControllerRevision],
    keep: &HashSet<String>,
    limit: i32,
) -> Result<(), Error> {
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    let unused: Vec<&ControllerRevision> =
        revisions.iter().filter(|r| !keep.contains(&r.name_any())).collect();
    let excess = unused.len().saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
    for r in unused.into_iter().take(excess) {
        let name = r.name_any();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(source) => return Err(Error::Write { name, source }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_replaces_the_template_and_gives_it_back() {
        let template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "busybox:2"}]},
        }))
        .unwrap();
        let data = patch_data(&template);
        assert_eq!(
            serde_json::to_string(&data).unwrap(),
            r#"{"spec":{"template":{"$patch":"replace","metadata":{"creationTimestamp":null,"labels":{"app":"x"}},"spec":{"containers":[{"image":"busybox:2","name":"c"}]}}}}"#,
            "upstream's bytes: keys sorted, the zero creationTimestamp as null"
        );
        let revision = ControllerRevision { data: Some(RawExtension(data)), ..Default::default() };
        assert_eq!(template_of(&revision), Some(template));
        let bare: PodTemplateSpec =
            serde_json::from_value(json!({"spec": {"containers": []}})).unwrap();
        assert_eq!(
            serde_json::to_string(&patch_data(&bare)).unwrap(),
            r#"{"spec":{"template":{"$patch":"replace","metadata":{"creationTimestamp":null},"spec":{"containers":[]}}}}"#
        );
        let revision = ControllerRevision {
            data: Some(RawExtension(patch_data(&bare))),
            ..Default::default()
        };
        assert_eq!(template_of(&revision).map(with_metadata), Some(with_metadata(bare)));
    }
}
