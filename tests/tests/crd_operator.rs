//! A kube-rs operator against skiff, as one is written for Kubernetes: a
//! `#[derive(CustomResource)]` type, its generated CRD applied server-side, and a
//! kube-runtime `Controller` reconciling the custom objects and writing their status
//! through the status subresource.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::{CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use skiff_tests::TestServer;

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "ops.example.com",
    version = "v1",
    kind = "Echo",
    plural = "echoes",
    namespaced,
    status = "EchoStatus",
    shortname = "ec",
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".spec.message"}"#
)]
struct EchoSpec {
    message: String,
    #[serde(default)]
    replicas: Option<u32>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
struct EchoStatus {
    echoed: String,
    observed_generation: Option<i64>,
}

#[derive(Debug)]
struct ReconcileError(kube::Error);

impl std::fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ReconcileError {}

impl From<kube::Error> for ReconcileError {
    fn from(e: kube::Error) -> Self {
        ReconcileError(e)
    }
}

/// The operator: each Echo gets a ConfigMap holding its message (owned by it), and its
/// status says what was echoed at which generation.
async fn reconcile(echo: Arc<Echo>, client: Arc<kube::Client>) -> Result<Action, ReconcileError> {
    let ns = echo.namespace().unwrap_or_default();
    let name = echo.name_any();
    let owner = echo.controller_owner_ref(&()).expect("owner ref");
    let cms: Api<ConfigMap> = Api::namespaced((*client).clone(), &ns);
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{name}-echo"), "ownerReferences": [owner]},
        "data": {"message": echo.spec.message},
    });
    let pp = PatchParams::apply("echo-operator").force();
    cms.patch(&format!("{name}-echo"), &pp, &Patch::Apply(&cm)).await?;
    let echoes: Api<Echo> = Api::namespaced((*client).clone(), &ns);
    let status = serde_json::json!({"status": {
        "echoed": echo.spec.message,
        "observed_generation": echo.meta().generation,
    }});
    echoes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_kube_rs_operator_reconciles_custom_resources() {
    let server = TestServer::start_with_controllers();
    let kubeconfig = server.kubeconfig.clone();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let client = skiff_tests::client_from(&kubeconfig).await;

        // The generated CRD, applied as operators install theirs.
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let crd = Echo::crd();
        crds.patch(&crd.name_any(), &PatchParams::apply("echo-operator"), &Patch::Apply(&crd))
            .await
            .expect("the generated CRD is valid");
        eventually("the CRD Established", || async {
            crds.get("echoes.ops.example.com").await.ok().and_then(|c| c.status).is_some_and(|s| {
                s.conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
        })
        .await;
        let echoes: Api<Echo> = Api::namespaced(client.clone(), "default");
        eventually("echoes served", || async { echoes.list(&Default::default()).await.is_ok() })
            .await;

        let shared = Arc::new(client.clone());
        let controller = tokio::spawn(
            Controller::new(echoes.clone(), Default::default())
                .owns(Api::<ConfigMap>::namespaced(client.clone(), "default"), Default::default())
                .run(reconcile, |_, _, _| Action::requeue(Duration::from_secs(1)), shared)
                .for_each(|_| async {}),
        );

        let hello = Echo::new("hello", EchoSpec { message: "hi".into(), replicas: Some(2) });
        echoes.create(&PostParams::default(), &hello).await.expect("create");
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        eventually("the status echoed", || async {
            echoes.get("hello").await.ok().and_then(|e| e.status).is_some_and(|s| s.echoed == "hi")
        })
        .await;
        let cm = cms.get("hello-echo").await.expect("the operator's ConfigMap");
        assert_eq!(cm.data.unwrap()["message"], "hi");
        // A spec change: a new generation, reconciled.
        let patch = serde_json::json!({"spec": {"message": "hello again"}});
        echoes.patch("hello", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
        eventually("the new message echoed at generation 2", || async {
            echoes
                .get("hello")
                .await
                .ok()
                .and_then(|e| e.status)
                .is_some_and(|s| s.echoed == "hello again" && s.observed_generation == Some(2))
        })
        .await;
        assert_eq!(
            echoes.get("hello").await.unwrap().metadata.generation,
            Some(2),
            "status writes keep the generation"
        );
        // Deleting the Echo collects its ConfigMap (owner reference to a custom kind).
        echoes.delete("hello", &DeleteParams::default()).await.expect("delete");
        eventually("the ConfigMap collected", || async {
            matches!(cms.get_opt("hello-echo").await, Ok(None))
        })
        .await;
        controller.abort();
    });
}
