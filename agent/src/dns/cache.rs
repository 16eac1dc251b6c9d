//! The watch-fed index: the process's shared Service and EndpointSlice informers and a
//! watch of every Pod, reduced to what DNS needs, and the [`Zone`] kept in step with them.
//! Each event marks the owners it touches dirty; only those owners' records are synthesized
//! again, so an update costs the size of one Service, not of the cluster.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use skiff_core::informers::Informers;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::records::{self, PodInfo, ServiceInfo, SliceInfo};
use super::zone::{Owner, Zone};

type Key = (String, String);

/// One decoded watch event of any of the three kinds.
enum Change {
    Service(watcher::Event<(Key, Option<ServiceInfo>)>),
    Slice(watcher::Event<(Key, Option<SliceInfo>)>),
    Pod(watcher::Event<(Key, Option<PodInfo>)>),
}

/// Objects of one kind by (namespace, name), with the relist buffer of its watcher.
struct Objects<T> {
    live: HashMap<Key, T>,
    relist: Option<HashMap<Key, T>>,
    synced: bool,
}

impl<T> Default for Objects<T> {
    fn default() -> Self {
        Objects { live: HashMap::new(), relist: None, synced: false }
    }
}

/// What one event did to a kind's objects: the old and new values of the changed keys.
type Delta<T> = Vec<(Option<T>, Option<T>)>;

impl<T: Clone> Objects<T> {
    fn apply(&mut self, event: watcher::Event<(Key, Option<T>)>) -> Delta<T> {
        match event {
            watcher::Event::Apply((key, Some(obj))) => {
                let old = self.live.insert(key, obj.clone());
                vec![(old, Some(obj))]
            }
            // An object DNS has no use for (anymore) is as good as deleted.
            watcher::Event::Apply((key, None)) | watcher::Event::Delete((key, _)) => {
                vec![(self.live.remove(&key), None)]
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply((key, obj)) => {
                if let (Some(buf), Some(obj)) = (self.relist.as_mut(), obj) {
                    buf.insert(key, obj);
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                self.synced = true;
                let fresh = self.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.live, fresh);
                let mut delta: Delta<T> = old.into_values().map(|o| (Some(o), None)).collect();
                delta.extend(self.live.values().map(|n| (None, Some(n.clone()))));
                delta
            }
        }
    }
}

/// The three kinds, indexed for record synthesis.
#[derive(Default)]
pub(crate) struct ClusterIndex {
    services: Objects<ServiceInfo>,
    slices: Objects<SliceInfo>,
    /// (namespace, service) → names of its slices.
    slices_by_service: HashMap<Key, BTreeSet<String>>,
    pods: Objects<PodInfo>,
}

fn svc_key(s: &ServiceInfo) -> Key {
    (s.namespace.clone(), s.name.clone())
}
fn svc_owner((namespace, name): Key) -> Owner {
    Owner::Service { namespace, name }
}

impl ClusterIndex {
    /// Whether every kind has been listed once.
    pub(crate) fn synced(&self) -> bool {
        self.services.synced && self.slices.synced && self.pods.synced
    }

    /// Applies one event; adds the owners whose records may have changed to `dirty`.
    fn apply(&mut self, change: Change, dirty: &mut HashSet<Owner>) {
        match change {
            Change::Service(ev) => {
                for (old, new) in self.services.apply(ev) {
                    for s in old.iter().chain(new.iter()) {
                        dirty.insert(svc_owner(svc_key(s)));
                    }
                }
            }
            Change::Slice(ev) => {
                for (old, new) in self.slices.apply(ev) {
                    if let Some(o) = &old {
                        let k = (o.namespace.clone(), o.service.clone());
                        if let Some(set) = self.slices_by_service.get_mut(&k) {
                            set.remove(&o.name);
                            if set.is_empty() {
                                self.slices_by_service.remove(&k);
                            }
                        }
                        dirty.insert(svc_owner(k));
                    }
                    if let Some(n) = &new {
                        let k = (n.namespace.clone(), n.service.clone());
                        self.slices_by_service.entry(k.clone()).or_default().insert(n.name.clone());
                        dirty.insert(svc_owner(k));
                    }
                }
            }
            Change::Pod(ev) => {
                for (old, new) in self.pods.apply(ev) {
                    for p in old.iter().chain(new.iter()) {
                        dirty.insert(Owner::Pod {
                            namespace: p.namespace.clone(),
                            name: p.name.clone(),
                        });
                        // Its hostname may name an endpoint of the headless service `subdomain`.
                        if let Some(sub) = &p.subdomain {
                            dirty.insert(svc_owner((p.namespace.clone(), sub.clone())));
                        }
                    }
                }
            }
        }
    }

    /// The records `owner` has now (empty when the object is gone).
    pub(crate) fn records_of(&self, zone: &Name, owner: &Owner) -> Vec<records::Rr> {
        match owner {
            Owner::Service { namespace, name } => {
                let key = (namespace.clone(), name.clone());
                let Some(svc) = self.services.live.get(&key) else { return Vec::new() };
                let slices: Vec<&SliceInfo> = self
                    .slices_by_service
                    .get(&key)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| self.slices.live.get(&(namespace.clone(), s.clone())))
                    .collect();
                let pod = |pod: &str| self.pods.live.get(&(namespace.clone(), pod.to_string()));
                records::service_records(zone, svc, &slices, &pod)
            }
            Owner::Pod { namespace, name } => {
                match self.pods.live.get(&(namespace.clone(), name.clone())) {
                    Some(p) => records::pod_records(zone, p),
                    None => Vec::new(),
                }
            }
        }
    }

    /// Synthesizes the dirty owners' records and swaps them into `zone` (the write lock is
    /// held only for the swap).
    pub(crate) fn publish(&self, zone: &RwLock<Zone>, apex: &Name, dirty: HashSet<Owner>) {
        let updates: Vec<(Owner, Vec<records::Rr>)> = dirty
            .into_iter()
            .map(|o| {
                let r = self.records_of(apex, &o);
                (o, r)
            })
            .collect();
        let mut z = zone.write().unwrap_or_else(|e| e.into_inner());
        for (owner, rrs) in updates {
            z.replace(owner, rrs);
        }
    }
}

/// Reduces a watch event's object to what DNS keeps (the full object is dropped here).
fn reduce<K: ResourceExt, T>(
    ev: watcher::Event<K>,
    f: impl Fn(&K) -> Option<T>,
) -> watcher::Event<(Key, Option<T>)> {
    let keyed = |o: K| ((o.namespace().unwrap_or_default(), o.name_any()), f(&o));
    match ev {
        watcher::Event::Apply(o) => watcher::Event::Apply(keyed(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(keyed(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(keyed(o)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Events applied per batch before the zone is updated (bounds a batch's write lock).
const MAX_BATCH: usize = 4096;

/// Watches the three kinds and keeps `zone` in step until the task is dropped. `synced` turns
/// true once every kind has been listed (answers for cluster names before then would be
/// wrong NXDOMAINs that clients cache).
pub(crate) async fn run(
    informers: Arc<Informers>,
    zone: Arc<RwLock<Zone>>,
    apex: Name,
    synced: watch::Sender<bool>,
) {
    // Services and EndpointSlices from the shared informers (the proxy reads them too);
    // every pod of the cluster straight from a watch of its own, reduced as it arrives
    // (nothing else here needs all pods, and a store of them would be the cluster's size).
    let services = informers
        .all::<Service>()
        .subscribe()
        .map(|r| r.map(|ev| Change::Service(reduce(ev, ServiceInfo::from_service))));
    let slices = informers
        .all::<EndpointSlice>()
        .subscribe()
        .map(|r| r.map(|ev| Change::Slice(reduce(ev, SliceInfo::from_slice))));
    let pods = watcher(Api::<Pod>::all(informers.client().clone()), watcher::Config::default())
        .default_backoff()
        .map(|r| r.map(|ev| Change::Pod(reduce(ev, PodInfo::from_pod))));
    let mut events: SelectAll<BoxStream<'static, Result<Change, watcher::Error>>> =
        futures::stream::select_all([services.boxed(), slices.boxed(), pods.boxed()]);
    let mut index = ClusterIndex::default();
    while let Some(first) = events.next().await {
        let mut dirty = HashSet::new();
        let mut handle = |ev: Result<Change, watcher::Error>, dirty: &mut HashSet<Owner>| match ev {
            Ok(change) => index.apply(change, dirty),
            Err(e) => warn!(error = %e, "DNS watch error (retrying with backoff)"),
        };
        handle(first, &mut dirty);
        for _ in 0..MAX_BATCH {
            match events.next().now_or_never() {
                Some(Some(ev)) => handle(ev, &mut dirty),
                _ => break,
            }
        }
        if !dirty.is_empty() {
            debug!(owners = dirty.len(), "DNS records updated");
            index.publish(&zone, &apex, dirty);
        }
        if !*synced.borrow() && index.synced() {
            info!(
                services = index.services.live.len(),
                pods = index.pods.live.len(),
                "DNS cache synced"
            );
            synced.send_replace(true);
        }
    }
    warn!("DNS watch streams ended");
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::RecordType;

    use crate::dns::records::{EndpointInfo, PortInfo};
    use crate::dns::zone::Lookup;

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn headless() -> ServiceInfo {
        ServiceInfo {
            namespace: "shop".into(),
            name: "db".into(),
            cluster_ips: vec![],
            headless: true,
            external_name: None,
            ports: vec![],
        }
    }

    fn slice(name: &str, ip: &str, pod: &str) -> SliceInfo {
        SliceInfo {
            namespace: "shop".into(),
            name: name.into(),
            service: "db".into(),
            ports: vec![PortInfo { name: "pg".into(), protocol: "tcp".into(), port: 5432 }],
            endpoints: vec![EndpointInfo {
                addresses: vec![ip.parse().unwrap()],
                hostname: None,
                ready: true,
                pod: Some(pod.into()),
            }],
        }
    }

    fn pod(name: &str, ip: &str, hostname: &str) -> PodInfo {
        PodInfo {
            namespace: "shop".into(),
            name: name.into(),
            hostname: Some(hostname.into()),
            subdomain: Some("db".into()),
            ips: vec![ip.parse().unwrap()],
        }
    }

    fn keyed_svc(s: ServiceInfo) -> (Key, Option<ServiceInfo>) {
        ((s.namespace.clone(), s.name.clone()), Some(s))
    }
    fn keyed_slice(s: SliceInfo) -> (Key, Option<SliceInfo>) {
        ((s.namespace.clone(), s.name.clone()), Some(s))
    }
    fn keyed_pod(p: PodInfo) -> (Key, Option<PodInfo>) {
        ((p.namespace.clone(), p.name.clone()), Some(p))
    }

    /// A synthetic event stream: initial lists, then changes, each reflected in the zone.
    #[test]
    fn events_keep_the_zone_in_step() {
        let apex = n("cluster.local.");
        let zone = RwLock::new(Zone::new(apex.clone()));
        let mut index = ClusterIndex::default();
        let mut step = |changes: Vec<Change>| {
            let mut dirty = HashSet::new();
            for c in changes {
                index.apply(c, &mut dirty);
            }
            index.publish(&zone, &apex, dirty);
            index.synced()
        };
        let lookup =
            |zone: &RwLock<Zone>, name: &str| zone.read().unwrap().lookup(&n(name), RecordType::A);
        let synced = step(vec![
            Change::Service(watcher::Event::Init),
            Change::Service(watcher::Event::InitApply(keyed_svc(headless()))),
            Change::Service(watcher::Event::InitDone),
            Change::Slice(watcher::Event::Init),
            Change::Slice(watcher::Event::InitApply(keyed_slice(slice(
                "db-1",
                "10.244.0.7",
                "db-0",
            )))),
            Change::Slice(watcher::Event::InitDone),
        ]);
        assert!(!synced, "pods not listed yet");
        assert!(matches!(
            lookup(&zone, "10-244-0-7.db.shop.svc.cluster.local."),
            Lookup::Records(_)
        ));
        // The pod arrives: its hostname replaces the dashed name.
        assert!(step(vec![
            Change::Pod(watcher::Event::Init),
            Change::Pod(watcher::Event::InitApply(keyed_pod(pod("db-0", "10.244.0.7", "primary")))),
            Change::Pod(watcher::Event::InitDone),
        ]));
        assert!(matches!(lookup(&zone, "primary.db.shop.svc.cluster.local."), Lookup::Records(_)));
        assert_eq!(lookup(&zone, "10-244-0-7.db.shop.svc.cluster.local."), Lookup::NxDomain);
        assert!(matches!(lookup(&zone, "10-244-0-7.shop.pod.cluster.local."), Lookup::Records(_)));
        // A second slice adds an address; deleting the first removes its.
        step(vec![Change::Slice(watcher::Event::Apply(keyed_slice(slice(
            "db-2",
            "10.244.0.8",
            "db-1",
        ))))]);
        match lookup(&zone, "db.shop.svc.cluster.local.") {
            Lookup::Records(r) => assert_eq!(r.len(), 2, "{r:?}"),
            other => panic!("{other:?}"),
        }
        step(vec![Change::Slice(watcher::Event::Delete(keyed_slice(slice(
            "db-1",
            "10.244.0.7",
            "db-0",
        ))))]);
        match lookup(&zone, "db.shop.svc.cluster.local.") {
            Lookup::Records(r) => assert_eq!(r.len(), 1, "{r:?}"),
            other => panic!("{other:?}"),
        }
        // A relist without the service removes its names.
        step(vec![
            Change::Service(watcher::Event::Init),
            Change::Service(watcher::Event::InitDone),
        ]);
        assert_eq!(lookup(&zone, "db.shop.svc.cluster.local."), Lookup::NxDomain);
    }
}
