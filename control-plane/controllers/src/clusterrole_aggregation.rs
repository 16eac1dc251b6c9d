//! The ClusterRole aggregation controller (upstream `clusterrole-aggregation`): the rules
//! of a ClusterRole with an `aggregationRule` are kept equal to the rules of the
//! ClusterRoles it selects ([`skiff_core::rbac::aggregated_rules`]). Any ClusterRole
//! change re-queues every aggregated one, since a label or a rule anywhere may change what
//! they gather, and aggregated roles may select each other.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;

use super::informer::{Change, informer_with_store, run_applier};
use crate::context::Context;

/// The field manager of the rules it writes (upstream's name).
const MANAGER: &str = "clusterrole-aggregation-controller";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the aggregated rules of ClusterRole {name}")]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the controller until dropped.
pub async fn run(ctx: Arc<Context>) {
    let (tx, rx) = mpsc::unbounded_channel::<ObjectRef<ClusterRole>>();
    let store = informer_with_store(
        &ctx.informers.all::<ClusterRole>(),
        tx,
        // Every change may alter what any aggregated role gathers. During the first list
        // the store is filled only at its end: each aggregated role listed is queued itself.
        |change, store: &Store<ClusterRole>| {
            let mut refs: Vec<ObjectRef<ClusterRole>> = store
                .state()
                .iter()
                .filter(|r| r.aggregation_rule.is_some())
                .map(|r| ObjectRef::from_obj(r.as_ref()))
                .collect();
            if let Change::Applied(role) = change
                && role.aggregation_rule.is_some()
            {
                refs.push(ObjectRef::from_obj(role));
            }
            refs
        },
    )
    .await;
    let reader = store.clone();
    run_applier("clusterrole-aggregation", store, rx, ctx, move |role, ctx| {
        let all: Vec<ClusterRole> = reader.state().iter().map(|r| r.as_ref().clone()).collect();
        async move { reconcile(&role, &all, &ctx).await }
    })
    .await;
}

async fn reconcile(
    role: &ClusterRole,
    all: &[ClusterRole],
    ctx: &Context,
) -> Result<Action, Error> {
    let Some(rules) = skiff_core::rbac::aggregated_rules(role, all) else {
        return Ok(Action::await_change());
    };
    if role.rules.as_deref().unwrap_or_default() == rules.as_slice() {
        return Ok(Action::await_change());
    }
    let name = role.name_any();
    let api: Api<ClusterRole> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({"rules": rules});
    let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    api.patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Write { name: name.clone(), source })?;
    tracing::info!(clusterrole = %name, rules = rules.len(), "aggregated rules updated");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use kube::api::PostParams;
    use serde_json::json;

    use super::*;
    use crate::context::ControllerConfig;
    use crate::testutil::{api, wait_for};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_labelled_role_extends_edit_and_admin() {
        let (_s, client) = api().await;
        let ctx = Context::new(client.clone(), ControllerConfig::default());
        let ctl = tokio::spawn(run(ctx));
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let extra: ClusterRole = serde_json::from_value(json!({
            "metadata": {"name": "widgets-edit",
                         "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
            "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["*"]}],
        }))
        .expect("role");
        roles.create(&PostParams::default(), &extra).await.expect("create");
        let grants = |r: &ClusterRole| {
            r.rules
                .iter()
                .flatten()
                .any(|r| r.resources.as_deref() == Some(&["widgets".to_string()][..]))
        };
        for name in ["edit", "admin"] {
            wait_for(&format!("{name} gathers widgets"), || async {
                grants(&roles.get(name).await.expect("get"))
            })
            .await;
        }
        assert!(!grants(&roles.get("view").await.expect("get")), "view selects only to-view");
        roles.delete("widgets-edit", &Default::default()).await.expect("delete");
        wait_for("admin drops widgets", || async {
            !grants(&roles.get("admin").await.expect("get"))
        })
        .await;
        ctl.abort();
    }
}
