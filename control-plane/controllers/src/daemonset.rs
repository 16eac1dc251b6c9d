//! The DaemonSet controller: one pod per eligible node (nodeSelector, required node affinity,
//! NoSchedule/NoExecute taints against the pod's tolerations plus the default daemon
//! tolerations), rolling update bounded by maxUnavailable or maxSurge, and status.
//!
//! Pods are created as upstream does since 1.12: unbound, with a required node affinity
//! `matchFields metadata.name In [<node>]` replacing the template's required terms, so the
//! scheduler binds them (and accounts their resources). The pods' `controller-revision-hash`
//! label is the template's hash (`hash::compute_hash`), and each template is recorded as
//! the ControllerRevision `<ds>-<hash>` ([`history`]). With `maxSurge` (and maxUnavailable
//! 0), as upstream: up to maxSurge nodes at a time get their new pod beside the old one,
//! which is deleted once the new one is available; an old pod that is not available is
//! replaced at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodTemplateSpec, Toleration,
};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::deployment::scaled_value;
use super::hash::{self, CONTROLLER_REVISION_HASH};
use super::history;
use super::informer::{WorkloadCtx as Ctx, controller, run_controller};
use super::pods::{self, PodName};
use crate::context::Context;
use skiff_core::events::EventType;
use skiff_core::labels;

/// Errors of one DaemonSet reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing nodes")]
    ListNodes {
        #[source]
        source: kube::Error,
    },
    #[error("managing the pods of daemonset {ds}")]
    Pods {
        ds: String,
        #[source]
        source: pods::Error,
    },
    #[error("recording the revisions of daemonset {ds}")]
    History {
        ds: String,
        #[source]
        source: history::Error,
    },
    #[error("updating the status of daemonset {ds}")]
    Status {
        ds: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the DaemonSet controller until the future is dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let controller = controller(&ctx.informers.all::<DaemonSet>()).await;
    let store = controller.store();
    let cctx = Ctx::new(client.clone(), "daemonset-controller");
    let controller = controller
        .owns_stream(ctx.informers.all::<Pod>().touched())
        // Any node change may change which nodes should run which daemons.
        .watches_stream(ctx.informers.all::<Node>().touched(), move |_node: Node| {
            store.state().iter().map(|ds| ObjectRef::from_obj(ds.as_ref())).collect::<Vec<_>>()
        });
    run_controller(controller, cctx, reconcile).await;
}

/// The tolerations every daemon pod gets (`AddOrUpdateDaemonPodTolerations`).
pub fn default_tolerations(host_network: bool) -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    };
    let mut v = vec![
        t("node.kubernetes.io/not-ready", "NoExecute"),
        t("node.kubernetes.io/unreachable", "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        v.push(t("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    v
}

/// `NodeShouldRunDaemonPod`: selector, required affinity and taints.
pub fn should_run(template: &PodTemplateSpec, node: &Node) -> bool {
    let Some(spec) = template.spec.as_ref() else {
        return false;
    };
    if let Some(sel) = &spec.node_selector
        && sel.iter().any(|(k, v)| node.labels().get(k) != Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(req) = required
        && !labels::terms_match(&req.node_selector_terms, node)
    {
        return false;
    }
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    tolerations.extend(default_tolerations(spec.host_network == Some(true)));
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| labels::tolerated(&tolerations, taint))
}

/// The node a daemon pod is for: its nodeName, or the node its affinity pins it to.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|f| {
        (f.key == "metadata.name" && f.operator == "In")
            .then(|| f.values.as_ref()?.first().cloned())
            .flatten()
    })
}

/// The template for `node`: required node affinity replaced by `metadata.name In [node]`,
/// default daemon tolerations added.
fn template_for_node(template: &PodTemplateSpec, node: &str) -> PodTemplateSpec {
    let mut t = template.clone();
    let spec = t.spec.get_or_insert_with(Default::default);
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let na = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    na.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.to_string()]),
            }]),
        }],
    });
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    for d in default_tolerations(spec.host_network == Some(true)) {
        if !tolerations.iter().any(|t| t.key == d.key && t.effect == d.effect) {
            tolerations.push(d);
        }
    }
    spec.tolerations = Some(tolerations);
    t
}

async fn reconcile(ds: Arc<DaemonSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    let perr = |source| Error::Pods { ds: name.clone(), source };
    let spec = ds.spec.clone().unwrap_or_default();
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::ListNodes { source })?
        .items;
    let all = pods::list_pods(&pod_api, &ns).await.map_err(perr)?;
    let owned =
        pods::claim(&pod_api, ds.as_ref(), Some(&spec.selector), all).await.map_err(perr)?;
    let collision = ds.status.as_ref().and_then(|s| s.collision_count);
    let hash = hash::compute_hash(&spec.template, collision);
    let herr = |source| Error::History { ds: name.clone(), source };
    let revisions = if ds.metadata.deletion_timestamp.is_none() {
        history::record(&ctx.client, ds.as_ref(), &spec.selector, &spec.template, &hash)
            .await
            .map_err(herr)?
    } else {
        Vec::new()
    };
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let now = pods::now();

    // node → its pods (terminating ones apart: they are on their way out).
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    let mut to_delete: Vec<&Pod> = Vec::new();
    for p in &owned {
        if pods::is_terminating(p) {
            continue;
        }
        match target_node(p) {
            Some(n) => by_node.entry(n).or_default().push(p),
            None => to_delete.push(p),
        }
    }
    let mut to_create: Vec<String> = Vec::new();
    let mut status = DaemonSetStatus {
        observed_generation: ds.metadata.generation,
        collision_count: collision,
        conditions: ds.status.as_ref().and_then(|s| s.conditions.clone()),
        ..Default::default()
    };
    let rolling =
        spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate")
            == "RollingUpdate";
    let ru = spec.update_strategy.as_ref().and_then(|s| s.rolling_update.as_ref());
    let eligible = i32::try_from(nodes.iter().filter(|n| should_run(&spec.template, n)).count())
        .unwrap_or(i32::MAX);
    // maxSurge (upstream's rolling update with surge, only with maxUnavailable 0): a node's
    // new pod starts beside its old one, which goes once the new one is available.
    let max_surge = if rolling {
        scaled_value(ru.and_then(|r| r.max_surge.as_ref()), eligible, true, "0")
    } else {
        0
    };
    let surge = max_surge > 0 && ds.metadata.deletion_timestamp.is_none();
    let mut surging = 0;
    let mut surge_candidates: Vec<String> = Vec::new();
    let (mut available, mut updated, mut ready) = (0, 0, 0);
    let mut old_available: Vec<&Pod> = Vec::new();
    let mut unavailable = 0;
    for node in &nodes {
        let node_name = node.name_any();
        let mut here = by_node.remove(&node_name).unwrap_or_default();
        if !should_run(&spec.template, node) {
            if !here.is_empty() {
                status.number_misscheduled += 1;
            }
            to_delete.extend(here);
            continue;
        }
        status.desired_number_scheduled += 1;
        // Failed pods are replaced; of several, the oldest stays.
        let (failed, mut active): (Vec<&Pod>, Vec<&Pod>) =
            here.drain(..).partition(|p| pods::phase(p) == "Failed");
        to_delete.extend(failed);
        active.sort_by_key(|p| (p.metadata.creation_timestamp.as_ref().map(|t| t.0), p.name_any()));
        if surge {
            // The oldest new pod and the oldest old one may stand side by side.
            let (mut new, mut old): (Vec<&Pod>, Vec<&Pod>) = active
                .drain(..)
                .partition(|p| p.labels().get(CONTROLLER_REVISION_HASH) == Some(&hash));
            to_delete.extend(new.split_off(new.len().min(1)));
            to_delete.extend(old.split_off(old.len().min(1)));
            match (new.first(), old.first()) {
                (Some(n), Some(o)) => {
                    if pods::is_available(n, min_ready, now) {
                        to_delete.push(o);
                    } else {
                        surging += 1;
                    }
                }
                (None, Some(o)) => {
                    if pods::is_available(o, min_ready, now) {
                        surge_candidates.push(node_name.clone());
                    } else {
                        // Out of date and not available anyway: replaced at once.
                        to_create.push(node_name.clone());
                    }
                }
                _ => {}
            }
            // The node's status is its new pod's, else its old one's.
            active = new.into_iter().chain(old).take(1).collect();
        }
        if active.len() > 1 {
            to_delete.extend(active.split_off(1));
        }
        let Some(pod) = active.first() else {
            to_create.push(node_name);
            unavailable += 1;
            continue;
        };
        status.current_number_scheduled += 1;
        let is_new = pod.labels().get(CONTROLLER_REVISION_HASH) == Some(&hash);
        let is_available = pods::is_available(pod, min_ready, now);
        ready += i32::from(pods::is_ready(pod));
        available += i32::from(is_available);
        updated += i32::from(is_new);
        if !is_available {
            unavailable += 1;
        }
        if !is_new && !surge {
            if is_available {
                old_available.push(pod);
            } else {
                // An old pod that is not available anyway goes at once.
                to_delete.push(pod);
            }
        }
    }
    // Pods for nodes that no longer exist.
    to_delete.extend(by_node.into_values().flatten());

    if surge {
        let room = usize::try_from((max_surge - surging).max(0)).unwrap_or(0);
        to_create.extend(surge_candidates.into_iter().take(room));
    } else if rolling && ds.metadata.deletion_timestamp.is_none() {
        let max_unavailable = scaled_value(
            ru.and_then(|r| r.max_unavailable.as_ref()),
            status.desired_number_scheduled,
            true,
            "1",
        )
        .max(1);
        for pod in old_available {
            if unavailable >= max_unavailable {
                break;
            }
            to_delete.push(pod);
            unavailable += 1;
        }
    }

    if ds.metadata.deletion_timestamp.is_none() {
        for pod in &to_delete {
            pods::delete_pod(&pod_api, pod).await.map_err(perr)?;
            let msg = format!("Deleted pod: {}", pod.name_any());
            ctx.recorder.record(ds.as_ref(), EventType::Normal, "SuccessfulDelete", &msg).await;
        }
        let generation = ds.metadata.generation.unwrap_or(0).to_string();
        for node in &to_create {
            let template = template_for_node(&spec.template, node);
            let labels = [
                (CONTROLLER_REVISION_HASH, hash.as_str()),
                ("pod-template-generation", generation.as_str()),
            ];
            let pod = pods::pod_from_template(
                ds.as_ref(),
                &template,
                PodName::Generate(&format!("{name}-")),
                &labels,
            );
            if let Some(p) = pods::create_pod(&pod_api, &name, &pod).await.map_err(perr)? {
                let msg = format!("Created pod: {}", p.name_any());
                ctx.recorder.record(ds.as_ref(), EventType::Normal, "SuccessfulCreate", &msg).await;
            }
        }
    }

    // Revisions in use: the current one and those of pods still running.
    let keep: std::collections::HashSet<String> = owned
        .iter()
        .filter(|p| !pods::is_terminating(p))
        .filter_map(|p| p.labels().get(CONTROLLER_REVISION_HASH))
        .chain([&hash])
        .map(|h| format!("{name}-{h}"))
        .collect();
    let limit = spec.revision_history_limit.unwrap_or(history::DEFAULT_LIMIT);
    history::truncate(&ctx.client, &ns, &revisions, &keep, limit).await.map_err(herr)?;

    status.number_ready = ready;
    status.number_available = crate::context::omit_zero(available);
    status.number_unavailable =
        crate::context::omit_zero((status.desired_number_scheduled - available).max(0));
    status.updated_number_scheduled = crate::context::omit_zero(updated);
    if ds.status.as_ref() != Some(&status) {
        let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = crate::context::status_patch(&status, "apps", "DaemonSet");
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if pods::is_not_found(&e) => return Ok(Action::await_change()),
            Err(source) => return Err(Error::Status { ds: name, source }),
        }
    }
    let next = owned.iter().filter_map(|p| pods::until_available(p, min_ready, now)).min();
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}),
        )
        .unwrap()
    }

    fn template(spec: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(json!({"spec": spec})).unwrap()
    }

    #[test]
    fn eligibility_follows_selector_affinity_and_taints() {
        let base = json!({"containers": [{"name": "c"}]});
        let plain = node("a", json!({"disk": "ssd"}), json!([]));
        let tainted = node(
            "b",
            json!({}),
            json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
        );
        let not_ready = node(
            "c",
            json!({}),
            json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]),
        );
        let soft = node("d", json!({}), json!([{"key": "k", "effect": "PreferNoSchedule"}]));
        let t = template(base.clone());
        assert!(should_run(&t, &plain));
        assert!(!should_run(&t, &tainted));
        assert!(should_run(&t, &not_ready), "default tolerations cover not-ready");
        assert!(should_run(&t, &soft), "PreferNoSchedule does not prevent daemons");
        let tol = template(
            json!({"containers": [{"name": "c"}], "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x"}]}),
        );
        assert!(should_run(&tol, &tainted));
        let sel = template(json!({"containers": [{"name": "c"}], "nodeSelector": {"disk": "ssd"}}));
        assert!(should_run(&sel, &plain));
        assert!(!should_run(&sel, &not_ready));
        let aff = template(
            json!({"containers": [{"name": "c"}], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}]}}}}),
        );
        assert!(!should_run(&aff, &plain));
        assert!(should_run(&aff, &soft));
    }

    #[test]
    fn pods_are_pinned_by_affinity() {
        let t = template(json!({"containers": [{"name": "c"}]}));
        let pinned = template_for_node(&t, "n7");
        let pod = Pod { spec: pinned.spec, ..Default::default() };
        assert_eq!(target_node(&pod).as_deref(), Some("n7"));
        assert!(pod.spec.as_ref().unwrap().node_name.is_none(), "the scheduler binds daemon pods");
    }
}
