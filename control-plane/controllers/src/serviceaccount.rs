//! The ServiceAccount controller: a `default` ServiceAccount in every active namespace,
//! recreated when deleted (upstream serviceaccounts-controller), and the `kube-root-ca.crt`
//! ConfigMap with the cluster CA next to it (upstream root-ca-cert-publisher), which the
//! projected `kube-api-access-*` volume of every pod reads.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use super::informer::{Change, informer, run_applier};
use crate::context::Context;

pub const DEFAULT_NAME: &str = "default";
/// The ConfigMap holding the cluster CA (`ca.crt`) in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating the default ServiceAccount in {namespace}")]
    Create {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("publishing {ROOT_CA_CONFIGMAP} in {namespace}")]
    PublishRootCa {
        namespace: String,
        #[source]
        source: kube::Error,
    },
}

/// Run the ServiceAccount controller until dropped.
pub async fn run(ctx: Arc<Context>) {
    let (tx, rx) = mpsc::unbounded_channel::<ObjectRef<Namespace>>();
    let namespaces = informer(&ctx.informers.all::<Namespace>(), tx.clone(), |c| match c {
        Change::Applied(ns) => vec![ObjectRef::from_obj(ns)],
        Change::Deleted(_) => Vec::new(),
    })
    .await;
    // A deleted default ServiceAccount is made again (the shared informer has every one).
    let _sas = informer(&ctx.informers.all::<ServiceAccount>(), tx, |c| match c {
        Change::Deleted(sa) if sa.name_any() == DEFAULT_NAME => {
            sa.namespace().map(|ns| vec![ObjectRef::new(&ns)]).unwrap_or_default()
        }
        Change::Deleted(_) | Change::Applied(_) => Vec::new(),
    })
    .await;
    run_applier("serviceaccount", namespaces, rx, ctx, |ns, ctx| async move {
        reconcile(&ns, &ctx).await
    })
    .await;
}

async fn reconcile(ns: &Namespace, ctx: &Context) -> Result<Action, Error> {
    let terminating = ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    if terminating {
        return Ok(Action::await_change());
    }
    let name = ns.name_any();
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &name);
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some(DEFAULT_NAME.into()), ..Default::default() },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        // Exists already, or the namespace is going away.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 403 || e.code == 404 => {}
        Err(source) => return Err(Error::Create { namespace: name, source }),
    }
    if let Some(ca) = &ctx.config.root_ca_pem {
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &name);
        let cm = ConfigMap {
            metadata: ObjectMeta { name: Some(ROOT_CA_CONFIGMAP.into()), ..Default::default() },
            data: Some([("ca.crt".to_string(), ca.clone())].into()),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 403 || e.code == 404 => {}
            Err(source) => return Err(Error::PublishRootCa { namespace: name, source }),
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use kube::api::DeleteParams;
    use serde_json::json;

    use super::*;
    use crate::context::ControllerConfig;
    use crate::testutil::{api, wait_for};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_namespace_gets_a_default_service_account() {
        let (_s, client) = api().await;
        let ctx = Context::new(client.clone(), ControllerConfig::default());
        let ctl = tokio::spawn(run(ctx));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "team-a"}})).expect("ns");
        namespaces.create(&PostParams::default(), &ns).await.expect("ns");
        for n in ["default", "kube-system", "team-a"] {
            let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), n);
            wait_for(&format!("default SA in {n}"), || async {
                sas.get_opt(DEFAULT_NAME).await.expect("get").is_some()
            })
            .await;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "team-a");
        sas.delete(DEFAULT_NAME, &DeleteParams::default()).await.expect("delete");
        wait_for("recreated", || async { sas.get_opt(DEFAULT_NAME).await.expect("get").is_some() })
            .await;
        ctl.abort();
    }
}
