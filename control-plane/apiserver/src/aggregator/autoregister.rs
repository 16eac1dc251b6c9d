//! The local APIServices: one for every group/version this apiserver serves itself, as
//! upstream's autoregister controller creates them. The built-in ones are registered at
//! start (label `kube-aggregator.kubernetes.io/automanaged: onstart`: created when
//! missing then, left alone afterwards); those of the CRDs' served versions are kept in
//! step with the CRDs (`automanaged: true`: created, and deleted with their version or
//! CRD), as upstream's CRD registration controller does. An APIService someone else
//! created under the same name (an extension taking over a group/version) is never
//! touched.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{APIService, APIServiceSpec};
use serde_json::Value;

use super::{api_services, on_changes};
use crate::server::ApiServer;
use crate::state::State;

/// The label marking an APIService as the aggregator's own, and its two values.
pub const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";
const ON_START: &str = "onstart";
const KEPT: &str = "true";

/// How often the CRDs' APIServices are compared with the CRDs besides on changes.
const RESYNC: Duration = Duration::from_secs(30);

/// A local APIService the aggregator wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub group: String,
    pub version: String,
    pub group_priority_minimum: i32,
    pub version_priority: i32,
    /// `onstart` (built-in) or `true` (a CRD's).
    pub managed: &'static str,
}

impl Local {
    /// `<version>.<group>` (`v1.` for the legacy group).
    pub fn name(&self) -> String {
        format!("{}.{}", self.version, self.group)
    }

    fn object(&self) -> APIService {
        APIService {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(self.name()),
                labels: Some(BTreeMap::from([(AUTOMANAGED.to_string(), self.managed.to_string())])),
                ..Default::default()
            },
            spec: Some(APIServiceSpec {
                group: Some(self.group.clone()),
                version: Some(self.version.clone()),
                group_priority_minimum: self.group_priority_minimum,
                version_priority: self.version_priority,
                ..Default::default()
            }),
            status: None,
        }
    }
}

/// Upstream's priorities of the built-in group/versions (kube-apiserver's
/// `apiVersionPriorities`): the order of groups in discovery. Groups not listed (skiff's
/// `metrics.k8s.io`, served here rather than by metrics-server) get a low one.
fn builtin_priority(group: &str, version: &str) -> (i32, i32) {
    match (group, version) {
        ("", "v1") => (18000, 1),
        ("apiregistration.k8s.io", _) => (18000, 15),
        ("apps", _) => (17800, 15),
        ("events.k8s.io", _) => (17750, 15),
        ("authentication.k8s.io", _) => (17700, 15),
        ("authorization.k8s.io", _) => (17600, 15),
        ("autoscaling", "v2") => (17500, 30),
        ("autoscaling", _) => (17500, 15),
        ("batch", _) => (17400, 15),
        ("certificates.k8s.io", _) => (17300, 15),
        ("networking.k8s.io", _) => (17200, 15),
        ("policy", _) => (17100, 15),
        ("rbac.authorization.k8s.io", _) => (17000, 15),
        ("storage.k8s.io", _) => (16800, 15),
        ("apiextensions.k8s.io", _) => (16700, 15),
        ("admissionregistration.k8s.io", _) => (16700, 15),
        ("scheduling.k8s.io", _) => (16600, 15),
        ("coordination.k8s.io", _) => (16500, 15),
        ("node.k8s.io", _) => (16300, 15),
        ("discovery.k8s.io", _) => (16200, 15),
        ("flowcontrol.apiserver.k8s.io", _) => (16100, 21),
        _ => (100, 15),
    }
}

/// The local APIServices wanted now: the built-in group/versions, then every served
/// version of every CRD whose group is not a built-in one (upstream gives those group
/// priority 1000 and version priority 100, ordering CRD versions by their names).
pub fn wanted(state: &State) -> Vec<Local> {
    let mut out: Vec<Local> = state
        .registry
        .group_versions()
        .into_iter()
        .map(|(group, version)| {
            let (g, v) = builtin_priority(group, version);
            Local {
                group: group.to_string(),
                version: version.to_string(),
                group_priority_minimum: g,
                version_priority: v,
                managed: ON_START,
            }
        })
        .collect();
    let Some(crds) = state.registry.find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return out;
    };
    for crd in state.cache.resource(crds).list(&crds.prefix(), None) {
        let crd = crd.value();
        let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
        if group.is_empty() || state.registry.is_builtin_group(group) {
            continue;
        }
        let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
        for v in versions.into_iter().flatten().filter(|v| v["served"] == true) {
            let version = v["name"].as_str().unwrap_or_default().to_string();
            let local = Local {
                group: group.to_string(),
                version,
                group_priority_minimum: 1000,
                version_priority: 100,
                managed: KEPT,
            };
            if !out.contains(&local) {
                out.push(local);
            }
        }
    }
    out
}

/// Register the built-in APIServices, then keep the CRDs' in step until the server goes.
pub async fn run(server: Weak<ApiServer>) {
    let wake = {
        let Some(s) = server.upgrade() else { return };
        on_changes(
            &s.state,
            &[("apiextensions.k8s.io", "customresourcedefinitions"), (super::GROUP, "apiservices")],
        )
    };
    let mut first = true;
    loop {
        {
            let Some(s) = server.upgrade() else { return };
            match sync(&s, first).await {
                Ok(()) => first = false,
                Err(e) => tracing::warn!(error = %e, "registering the local APIServices"),
            }
        }
        let _ = tokio::time::timeout(
            if first { Duration::from_secs(1) } else { RESYNC },
            wake.notified(),
        )
        .await;
    }
}

/// One pass: create what is wanted and missing (built-in ones on the first pass only),
/// delete the CRD APIServices whose version is no longer served.
async fn sync(server: &Arc<ApiServer>, first: bool) -> Result<(), kube::Error> {
    let Some(rt) = api_services(server) else { return Ok(()) };
    let wanted = wanted(server);
    let existing: BTreeMap<String, Value> = server
        .cache
        .resource(rt)
        .list(&rt.prefix(), None)
        .iter()
        .map(|o| (o.name.clone(), o.value()))
        .collect();
    let api = client(server);
    for local in &wanted {
        if existing.contains_key(&local.name()) || (local.managed == ON_START && !first) {
            continue;
        }
        match api.create(&Default::default(), &local.object()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    for (name, obj) in &existing {
        let managed = obj.pointer("/metadata/labels").and_then(|l| l.get(AUTOMANAGED));
        if managed.and_then(Value::as_str) != Some(KEPT) || wanted.iter().any(|l| l.name() == *name)
        {
            continue;
        }
        match api.delete(name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The aggregator's writes go through the API in memory, as `kube-aggregator`.
pub(crate) fn client(server: &Arc<ApiServer>) -> kube::Api<APIService> {
    kube::Api::all(server.client_as("kube-aggregator"))
}
