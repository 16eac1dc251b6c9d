//! API aggregation (upstream's kube-aggregator): `apiregistration.k8s.io/v1` APIServices
//! say which apiserver serves each group/version. A local one (`spec.service: null`) is
//! served here; one naming a Service is proxied to that extension apiserver
//! ([`proxy`], at an endpoint address of the Service: [`resolve`]).
//!
//! What runs beside the request path, each loop on its own task:
//! - the snapshot of proxied APIServices that routing and discovery read ([`remotes`]),
//!   rebuilt from the watch cache whenever an APIService changes;
//! - [`autoregister`]: a local APIService for every built-in group/version and for every
//!   served version of every CRD, as upstream's autoregister and CRD registration
//!   controllers keep them;
//! - [`availability`]: the `Available` condition of every APIService, checked on changes
//!   of APIServices, Services, Endpoints and EndpointSlices and every
//!   `apiservice_check_interval`;
//! - the `kube-system/extension-apiserver-authentication` ConfigMap, which tells extension
//!   apiservers which CA signs the front proxy's client certificate and which headers name
//!   the user (upstream's ClientCARegistrationHook), written once at start.
//!
//! The loops write through the apiserver's in-memory client, so their writes are admitted
//! and validated like anyone's.

pub mod autoregister;
pub mod availability;
pub mod proxy;
pub mod remotes;
pub mod resolve;

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{Value, json};

use crate::registry::ResourceType;
use crate::server::ApiServer;
use crate::state::State;
use remotes::Remote;

pub const GROUP: &str = "apiregistration.k8s.io";

/// The namespace and name of the ConfigMap extension apiservers read their
/// authentication settings from.
pub const AUTHENTICATION_CONFIGMAP: (&str, &str) =
    ("kube-system", "extension-apiserver-authentication");

/// Start the aggregator's loops (they end when the server is dropped).
pub fn spawn(server: &Arc<ApiServer>) {
    tokio::spawn(follow_api_services(server.state.clone()));
    tokio::spawn(autoregister::run(Arc::downgrade(server)));
    tokio::spawn(availability::run(Arc::downgrade(server)));
    tokio::spawn(publish_authentication(Arc::downgrade(server)));
}

/// The APIService resource.
pub(crate) fn api_services(state: &State) -> Option<&ResourceType> {
    state.registry.find(GROUP, "v1", "apiservices")
}

/// Keep [`State::remotes`] equal to the proxied APIServices in the watch cache.
async fn follow_api_services(state: Arc<State>) {
    let Some(rt) = api_services(&state) else { return };
    let cache = state.cache.resource(rt);
    loop {
        let sub = cache.subscribe(Some(state.cache.revision()), &rt.prefix());
        let remotes: Vec<Arc<Remote>> = cache
            .list(&rt.prefix(), None)
            .iter()
            .filter_map(|o| Remote::of(&o.value()))
            .map(Arc::new)
            .collect();
        state.remotes.set(remotes);
        let Ok(mut sub) = sub else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if sub.backlog.is_empty() {
            match sub.rx.recv().await {
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
        while sub.rx.try_recv().is_ok() {}
    }
}

/// A [`tokio::sync::Notify`] woken whenever an object of one of `resources` changes.
pub(crate) fn on_changes(
    state: &Arc<State>,
    resources: &[(&'static str, &'static str)],
) -> Arc<tokio::sync::Notify> {
    let notify = Arc::new(tokio::sync::Notify::new());
    for &(group, plural) in resources {
        let Some(rt) = state.registry.find(group, "v1", plural) else { continue };
        let (state, notify) = (Arc::downgrade(state), notify.clone());
        let prefix = rt.prefix();
        tokio::spawn(async move {
            loop {
                let sub = {
                    let Some(s) = state.upgrade() else { return };
                    let Some(rt) = s.registry.find(group, "v1", plural) else { return };
                    s.cache.resource(rt).subscribe(Some(s.cache.revision()), &prefix)
                };
                let Ok(mut sub) = sub else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                loop {
                    match sub.rx.recv().await {
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            notify.notify_one()
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
        });
    }
    notify
}

/// The data of `kube-system/extension-apiserver-authentication`, as upstream writes it:
/// the client CA, the request-header CA, and the request-header names as JSON lists.
pub fn authentication_data(state: &State) -> serde_json::Map<String, Value> {
    let mut data = serde_json::Map::new();
    if !state.config.auth.ca_cert_pem.is_empty() {
        data.insert("client-ca-file".into(), json!(state.config.auth.ca_cert_pem));
    }
    if let Some(fp) = &state.config.front_proxy {
        let list = |v: &[&str]| json!(serde_json::to_string(v).unwrap_or_default());
        data.insert("requestheader-client-ca-file".into(), json!(fp.ca_cert_pem));
        data.insert(
            "requestheader-allowed-names".into(),
            list(&[crate::pki::FRONT_PROXY_CLIENT_CN]),
        );
        data.insert("requestheader-username-headers".into(), list(&[proxy::USER_HEADER]));
        data.insert("requestheader-group-headers".into(), list(&[proxy::GROUP_HEADER]));
        data.insert("requestheader-extra-headers-prefix".into(), list(&[proxy::EXTRA_PREFIX]));
    }
    data
}

/// Write the authentication ConfigMap when it is missing or differs, retrying until the
/// write goes through (at start the namespace may still be on its way).
async fn publish_authentication(server: Weak<ApiServer>) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (ns, name) = AUTHENTICATION_CONFIGMAP;
    loop {
        let Some(s) = server.upgrade() else { return };
        let data = authentication_data(&s);
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(s.client_as("kube-apiserver"), ns);
        drop(s);
        let result = async {
            let current = api.get_opt(name).await?;
            let wanted = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns}, "data": data});
            match current {
                None => {
                    let cm: ConfigMap =
                        serde_json::from_value(wanted).map_err(kube::Error::SerdeError)?;
                    api.create(&Default::default(), &cm).await?;
                }
                Some(cm)
                    if serde_json::to_value(&cm.data).ok() != Some(Value::Object(data.clone())) =>
                {
                    let patch = json!({"data": data});
                    api.patch(name, &Default::default(), &kube::api::Patch::Merge(patch)).await?;
                }
                Some(_) => {}
            }
            Ok::<(), kube::Error>(())
        }
        .await;
        match result {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "publishing {ns}/{name}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
