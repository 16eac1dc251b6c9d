//! The EndpointSlice controller: for every Service with a selector, discovery.k8s.io/v1
//! EndpointSlices listing its pods (ready / serving / terminating conditions as upstream,
//! named target ports resolved per pod, nodeName and zone, at most 100 endpoints per slice,
//! updated in place for minimal churn), and the legacy core/v1 Endpoints beside them
//! (see [`super::endpoints`]). Also keeps the `kubernetes` Service pointing at the apiserver.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;

pub mod endpoints;
mod shared;

pub use self::shared::{
    CONTROLLER_NAME, Error, MANAGED_BY_LABEL, Result, SERVICE_NAME_LABEL, TRIGGER_TIME_ANNOTATION,
    pod_ports, resolve_target_port,
};
use self::shared::{now_rfc3339, pod_in_endpoints, pod_ready};
use super::informer::{Change, informer, run_applier};
use crate::context::Context;

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// `--max-endpoints-per-slice` (upstream 100).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// (namespace, pod) → the Services that selected the pod when last seen.
type PodServices = HashMap<(String, String), Vec<ObjectRef<Service>>>;

struct SliceCtx {
    ctx: Arc<Context>,
    pods: Store<Pod>,
    nodes: Store<Node>,
}

/// Run the EndpointSlice and Endpoints controller until dropped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::unbounded_channel::<ObjectRef<Service>>();
    let cleanup_client = client.clone();
    let services = informer(&ctx.informers.all::<Service>(), tx.clone(), move |c| {
        match c {
            Change::Applied(s) => vec![ObjectRef::from_obj(s)],
            Change::Deleted(s) => {
                // Legacy Endpoints are not owned by the Service: remove them here (slices
                // are owned and also collected by the garbage collector).
                let client = cleanup_client.clone();
                let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
                if s.spec.as_ref().and_then(|sp| sp.selector.as_ref()).is_some() {
                    tokio::spawn(async move { delete_service_endpoints(client, &ns, &name).await });
                }
                Vec::new()
            }
        }
    })
    .await;
    let svc_store = services.clone();
    // Which services each pod last mapped to, so a relabelled pod also triggers the old ones.
    let last: Arc<Mutex<PodServices>> = Default::default();
    let pods = informer(&ctx.informers.all::<Pod>(), tx.clone(), {
        move |c| {
            let (pod, deleted) = match c {
                Change::Applied(p) => (p, false),
                Change::Deleted(p) => (p, true),
            };
            let key = (pod.namespace().unwrap_or_default(), pod.name_any());
            let now: Vec<ObjectRef<Service>> = svc_store
                .state()
                .iter()
                .filter(|s| s.namespace().as_deref() == Some(key.0.as_str()) && selects(s, pod))
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect();
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            let mut out = if deleted { last.remove(&key) } else { last.insert(key, now.clone()) }
                .unwrap_or_default();
            for r in now {
                if !out.contains(&r) {
                    out.push(r);
                }
            }
            out
        }
    })
    .await;
    let nodes =
        informer(&ctx.informers.all::<Node>(), tx.clone(), |_| Vec::<ObjectRef<Service>>::new())
            .await;
    // The slices this controller manages (the shared informer has every slice).
    let _slices = informer(&ctx.informers.all::<EndpointSlice>(), tx.clone(), |c| {
        let s = match c {
            Change::Applied(s) | Change::Deleted(s) => s,
        };
        if s.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(CONTROLLER_NAME) {
            return Vec::new();
        }
        let owner = s.labels().get(SERVICE_NAME_LABEL).cloned();
        owner
            .map(|name| vec![ObjectRef::new(&name).within(&s.namespace().unwrap_or_default())])
            .unwrap_or_default()
    })
    .await;
    let _ = pods.wait_until_ready().await;
    let _ = nodes.wait_until_ready().await;
    let sctx = Arc::new(SliceCtx { ctx, pods, nodes });
    run_applier(
        "endpointslice",
        services,
        rx,
        sctx,
        |svc, c| async move { reconcile(&svc, &c).await },
    )
    .await;
}

async fn delete_service_endpoints(client: kube::Client, ns: &str, name: &str) {
    let eps: Api<k8s_openapi::api::core::v1::Endpoints> = Api::namespaced(client.clone(), ns);
    let _ = eps.delete(name, &DeleteParams::default()).await;
    let slices: Api<EndpointSlice> = Api::namespaced(client, ns);
    let lp = ListParams::default()
        .labels(&format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={CONTROLLER_NAME}"));
    let _ = slices.delete_collection(&DeleteParams::default(), &lp).await;
}

/// Whether the Service's selector selects the pod (a nil selector selects nothing).
pub fn selects(svc: &Service, pod: &Pod) -> bool {
    let Some(sel) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else { return false };
    let labels = pod.labels();
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

async fn reconcile(svc: &Service, c: &SliceCtx) -> Result<Action> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    if ns == "default" && name == "kubernetes" {
        if let Some((ip, port)) = &c.ctx.config.apiserver_endpoint {
            endpoints::reconcile_apiserver(&c.ctx.client, svc, ip, *port).await?;
        }
        return Ok(Action::await_change());
    }
    let has_selector = svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_some();
    let slices_api: Api<EndpointSlice> = Api::namespaced(c.ctx.client.clone(), &ns);
    let lp = ListParams::default()
        .labels(&format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={CONTROLLER_NAME}"));
    let existing = slices_api
        .list(&lp)
        .await
        .map_err(|source| Error::ListSlices { service: format!("{ns}/{name}"), source })?
        .items;
    if !has_selector {
        for s in existing {
            delete_slice(&slices_api, &s.name_any()).await?;
        }
        return Ok(Action::await_change());
    }
    let pods: Vec<Arc<Pod>> = c
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()) && selects(svc, p))
        .collect();
    let zone_of = |node: &str| {
        c.nodes.get(&ObjectRef::new(node)).and_then(|n| n.labels().get(ZONE_LABEL).cloned())
    };
    let groups = desired_endpoints(svc, &pods, &zone_of);
    let plan = plan_slices(svc, existing, groups, MAX_ENDPOINTS_PER_SLICE);
    let trigger = now_rfc3339();
    for mut s in plan.create {
        set_trigger(&mut s.metadata, &trigger);
        let name = s.metadata.generate_name.clone().unwrap_or_default();
        slices_api
            .create(&PostParams::default(), &s)
            .await
            .map_err(|source| Error::WriteSlice { name, source })?;
    }
    for mut s in plan.update {
        set_trigger(&mut s.metadata, &trigger);
        let n = s.name_any();
        match slices_api.replace(&n, &PostParams::default(), &s).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => return Err(Error::WriteSlice { name: n, source }),
        }
    }
    for n in plan.delete {
        delete_slice(&slices_api, &n).await?;
    }
    endpoints::reconcile_endpoints(&c.ctx.client, svc, &pods).await?;
    Ok(Action::await_change())
}

async fn delete_slice(api: &Api<EndpointSlice>, name: &str) -> Result<()> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::DeleteSlice { name: name.to_string(), source }),
    }
}

fn set_trigger(meta: &mut ObjectMeta, when: &str) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TRIGGER_TIME_ANNOTATION.into(), when.into());
}

/// Desired endpoints grouped by their port set (pods whose named ports resolve
/// differently land in different slices, as upstream).
pub fn desired_endpoints(
    svc: &Service,
    pods: &[Arc<Pod>],
    zone_of: &dyn Fn(&str) -> Option<String>,
) -> Vec<(Vec<EndpointPort>, Vec<Endpoint>)> {
    let publish_not_ready =
        svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses).unwrap_or(false);
    let mut groups: Vec<(Vec<EndpointPort>, Vec<Endpoint>)> = Vec::new();
    let mut seen = HashSet::new();
    for pod in pods {
        if !pod_in_endpoints(pod, true) {
            continue;
        }
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else { continue };
        if !seen.insert(ip.clone()) {
            continue;
        }
        let ports = pod_ports(svc, pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let serving = publish_not_ready || pod_ready(pod);
        let ready = publish_not_ready || (serving && !terminating);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let ep = Endpoint {
            addresses: vec![ip],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(serving),
                terminating: Some(terminating),
            }),
            node_name: node.clone(),
            zone: node.as_deref().and_then(zone_of),
            target_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Pod".into()),
                namespace: pod.namespace(),
                name: Some(pod.name_any()),
                uid: pod.uid(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match groups.iter_mut().find(|(p, _)| *p == ports) {
            Some((_, eps)) => eps.push(ep),
            None => groups.push((ports, vec![ep])),
        }
    }
    groups
}

/// What to write to converge the slices of one Service.
#[derive(Debug, Default)]
pub struct SlicePlan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<String>,
}

fn slice_meta(svc: &Service) -> ObjectMeta {
    let name = svc.name_any();
    let mut labels: BTreeMap<String, String> = svc.labels().clone();
    labels.retain(|k, _| k != MANAGED_BY_LABEL && k != SERVICE_NAME_LABEL);
    labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
    labels.insert(MANAGED_BY_LABEL.into(), CONTROLLER_NAME.into());
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    ObjectMeta {
        generate_name: Some(format!("{name}-")),
        namespace: svc.namespace(),
        labels: Some(labels),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Service".into(),
            name,
            uid: svc.uid().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    }
}

fn new_slice(svc: &Service, ports: Vec<EndpointPort>, endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        metadata: slice_meta(svc),
        address_type: "IPv4".into(),
        endpoints,
        ports: Some(ports),
    }
}

/// Minimal-churn slicing: endpoints stay in the slice that holds them (updated in place),
/// new ones fill slices with room before new slices are created, emptied slices go away;
/// a Service without endpoints keeps one empty placeholder slice.
pub fn plan_slices(
    svc: &Service,
    existing: Vec<EndpointSlice>,
    groups: Vec<(Vec<EndpointPort>, Vec<Endpoint>)>,
    max: usize,
) -> SlicePlan {
    let mut plan = SlicePlan::default();
    let want_meta = slice_meta(svc);
    let mut existing = existing;
    existing.sort_by_key(|s| s.name_any());
    if groups.is_empty() {
        let mut it = existing.into_iter();
        match it.next() {
            Some(mut s) => {
                let changed = !s.endpoints.is_empty()
                    || s.ports.as_ref().is_some_and(|p| !p.is_empty())
                    || meta_differs(&s.metadata, &want_meta);
                if changed {
                    s.endpoints = Vec::new();
                    s.ports = Some(Vec::new());
                    apply_meta(&mut s.metadata, &want_meta);
                    plan.update.push(s);
                }
            }
            None => plan.create.push(new_slice(svc, Vec::new(), Vec::new())),
        }
        plan.delete.extend(it.map(|s| s.name_any()));
        return plan;
    }
    let mut by_ports: Vec<(Vec<EndpointPort>, Vec<EndpointSlice>)> = Vec::new();
    for s in existing {
        let ports = s.ports.clone().unwrap_or_default();
        if !groups.iter().any(|(p, _)| *p == ports) {
            plan.delete.push(s.name_any());
            continue;
        }
        match by_ports.iter_mut().find(|(p, _)| *p == ports) {
            Some((_, v)) => v.push(s),
            None => by_ports.push((ports, vec![s])),
        }
    }
    for (ports, endpoints) in groups {
        let slices = by_ports
            .iter_mut()
            .find(|(p, _)| *p == ports)
            .map(|(_, v)| std::mem::take(v))
            .unwrap_or_default();
        let mut want: HashMap<String, Endpoint> =
            endpoints.iter().map(|e| (e.addresses[0].clone(), e.clone())).collect();
        // Keep endpoints where they are.
        let mut kept: Vec<(EndpointSlice, bool)> = Vec::new();
        for mut s in slices {
            let before = s.endpoints.clone();
            let mut eps = Vec::new();
            for e in &before {
                if let Some(w) = e.addresses.first().and_then(|a| want.remove(a)) {
                    if eps.len() < max {
                        eps.push(w);
                    } else {
                        want.insert(w.addresses[0].clone(), w);
                    }
                }
            }
            let changed = eps != before || meta_differs(&s.metadata, &want_meta);
            s.endpoints = eps;
            apply_meta(&mut s.metadata, &want_meta);
            kept.push((s, changed));
        }
        // New endpoints, in the pods' order, into slices already being written, then
        // others with room, then new slices.
        let mut fresh: Vec<Endpoint> =
            endpoints.into_iter().filter(|e| want.contains_key(&e.addresses[0])).collect();
        kept.sort_by_key(|(_, changed)| !*changed);
        for (s, changed) in kept.iter_mut() {
            while s.endpoints.len() < max && !fresh.is_empty() {
                s.endpoints.push(fresh.remove(0));
                *changed = true;
            }
        }
        for (s, changed) in kept {
            if s.endpoints.is_empty() {
                plan.delete.push(s.name_any());
            } else if changed {
                plan.update.push(s);
            }
        }
        for chunk in fresh.chunks(max) {
            plan.create.push(new_slice(svc, ports.clone(), chunk.to_vec()));
        }
    }
    plan
}

fn meta_differs(have: &ObjectMeta, want: &ObjectMeta) -> bool {
    have.labels != want.labels || have.owner_references != want.owner_references
}

fn apply_meta(have: &mut ObjectMeta, want: &ObjectMeta) {
    have.labels = want.labels.clone();
    have.owner_references = want.owner_references.clone();
}

#[cfg(test)]
mod tests;
