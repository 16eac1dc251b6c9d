//! Legacy core/v1 Endpoints of Services with selectors (subsets of ready and not-ready
//! addresses per port set, `endpoints.kubernetes.io/last-change-trigger-time`), and the
//! Endpoints and EndpointSlice of the `kubernetes` Service naming the apiserver itself.
//! Driven by the EndpointSlice controller's reconcile (same watches, same queue).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use super::shared::{
    CONTROLLER_NAME, Error, MANAGED_BY_LABEL, Result, SERVICE_NAME_LABEL, TRIGGER_TIME_ANNOTATION,
    now_rfc3339, pod_in_endpoints, pod_ports, pod_ready,
};

/// The subsets upstream's endpoints controller computes: one per distinct port set,
/// addresses sorted by IP.
pub fn desired_subsets(svc: &Service, pods: &[Arc<Pod>]) -> Vec<EndpointSubset> {
    let publish_not_ready =
        svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses).unwrap_or(false);
    let mut subsets: Vec<EndpointSubset> = Vec::new();
    for pod in pods {
        if !pod_in_endpoints(pod, publish_not_ready) {
            continue;
        }
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else { continue };
        let ports: Vec<EndpointPort> = pod_ports(svc, pod)
            .into_iter()
            .map(|p| EndpointPort {
                name: p.name.filter(|n| !n.is_empty()),
                port: p.port.unwrap_or_default(),
                protocol: p.protocol,
                app_protocol: p.app_protocol,
            })
            .collect();
        if ports.is_empty()
            && svc.spec.as_ref().and_then(|s| s.ports.as_ref()).is_some_and(|p| !p.is_empty())
        {
            continue;
        }
        let addr = EndpointAddress {
            ip,
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: pod.namespace(),
                name: Some(pod.name_any()),
                uid: pod.uid(),
                ..Default::default()
            }),
            hostname: None,
        };
        let ready = publish_not_ready || pod_ready(pod);
        let idx = match subsets.iter().position(|s| s.ports.as_ref() == Some(&ports)) {
            Some(i) => i,
            None => {
                subsets.push(EndpointSubset { ports: Some(ports), ..Default::default() });
                subsets.len() - 1
            }
        };
        let list = if ready {
            subsets[idx].addresses.get_or_insert_with(Vec::new)
        } else {
            subsets[idx].not_ready_addresses.get_or_insert_with(Vec::new)
        };
        list.push(addr);
    }
    for s in &mut subsets {
        for l in [&mut s.addresses, &mut s.not_ready_addresses].into_iter().flatten() {
            l.sort_by(|a, b| a.ip.cmp(&b.ip));
        }
    }
    subsets
}

fn endpoints_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels = svc.labels().clone();
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    labels
}

/// Write the Service's Endpoints when they differ from the desired ones.
pub async fn reconcile_endpoints(client: &Client, svc: &Service, pods: &[Arc<Pod>]) -> Result<()> {
    let subsets = desired_subsets(svc, pods);
    let labels = endpoints_labels(svc);
    write_endpoints(client, svc, subsets, labels).await
}

async fn write_endpoints(
    client: &Client,
    svc: &Service,
    subsets: Vec<EndpointSubset>,
    labels: BTreeMap<String, String>,
) -> Result<()> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let api: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
    let err = |source| Error::WriteEndpoints { name: format!("{ns}/{name}"), source };
    let current = api.get_opt(&name).await.map_err(err)?;
    let subsets = if subsets.is_empty() { None } else { Some(subsets) };
    let mut annotations = BTreeMap::new();
    annotations.insert(TRIGGER_TIME_ANNOTATION.to_string(), now_rfc3339());
    match current {
        Some(mut cur) => {
            let cur_subsets = cur.subsets.clone().filter(|s| !s.is_empty());
            if cur_subsets == subsets && cur.metadata.labels.clone().unwrap_or_default() == labels {
                return Ok(());
            }
            cur.subsets = subsets;
            cur.metadata.labels = Some(labels);
            cur.metadata.annotations.get_or_insert_with(BTreeMap::new).extend(annotations);
            match api.replace(&name, &PostParams::default(), &cur).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(err(e)),
            }
        }
        None => {
            let ep = Endpoints {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                subsets,
            };
            match api.create(&PostParams::default(), &ep).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(err(e)),
            }
        }
    }
}

/// The `kubernetes` Service: Endpoints and an EndpointSlice naming the apiserver's own
/// address (upstream the apiserver's endpoint reconciler writes them).
pub async fn reconcile_apiserver(
    client: &Client,
    svc: &Service,
    ip: &str,
    port: u16,
) -> Result<()> {
    let port = i32::from(port);
    // The Service's https port targets the port the apiserver serves on (upstream's
    // master service reconciler keeps it so).
    let https = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.iter().find(|p| p.name.as_deref() == Some("https")));
    if let Some(https) = https
        && https.target_port != Some(IntOrString::Int(port))
    {
        let mut ports = svc.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
        for p in ports.iter_mut().filter(|p| p.name.as_deref() == Some("https")) {
            p.target_port = Some(IntOrString::Int(port));
        }
        let patch = serde_json::json!({"spec": {"ports": ports}});
        let api: Api<Service> = Api::namespaced(client.clone(), "default");
        api.patch("kubernetes", &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(
            |source| Error::WriteEndpoints { name: "default/kubernetes".into(), source },
        )?;
    }
    let subsets = vec![EndpointSubset {
        addresses: Some(vec![EndpointAddress { ip: ip.to_string(), ..Default::default() }]),
        ports: Some(vec![EndpointPort {
            name: Some("https".into()),
            port,
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]),
        not_ready_addresses: None,
    }];
    let mut labels = BTreeMap::new();
    labels.insert("endpointslice.kubernetes.io/skip-mirror".to_string(), "true".to_string());
    write_endpoints(client, svc, subsets, labels).await?;
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let mut slice_labels = BTreeMap::new();
    slice_labels.insert(SERVICE_NAME_LABEL.to_string(), "kubernetes".to_string());
    slice_labels.insert(MANAGED_BY_LABEL.to_string(), CONTROLLER_NAME.to_string());
    let endpoints = vec![Endpoint {
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        ..Default::default()
    }];
    let ports = Some(vec![k8s_openapi::api::discovery::v1::EndpointPort {
        name: Some("https".into()),
        port: Some(port),
        protocol: Some("TCP".into()),
        app_protocol: None,
    }]);
    let err = |source| Error::WriteSlice { name: "default/kubernetes".into(), source };
    match api.get_opt("kubernetes").await.map_err(err)? {
        Some(mut cur) => {
            if cur.endpoints == endpoints && cur.ports == ports {
                return Ok(());
            }
            cur.endpoints = endpoints;
            cur.ports = ports;
            api.replace("kubernetes", &PostParams::default(), &cur).await.map_err(err)?;
        }
        None => {
            let slice = EndpointSlice {
                metadata: ObjectMeta {
                    name: Some("kubernetes".into()),
                    namespace: Some("default".into()),
                    labels: Some(slice_labels),
                    ..Default::default()
                },
                address_type: "IPv4".into(),
                endpoints,
                ports,
            };
            match api.create(&PostParams::default(), &slice).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(err(e)),
            }
        }
    }
    Ok(())
}
