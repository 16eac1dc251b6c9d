//! Node IPAM: gives every Node a `spec.podCIDR` (and `podCIDRs`) from `--cluster-cidr`,
//! one `/node_cidr_mask` block each (upstream range allocator). The allocation is rebuilt
//! from the existing Nodes at start and a block is released when its Node is deleted.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tokio::sync::mpsc;

use super::informer::{Change, informer};
use crate::context::Context;
use skiff_core::cidr::Cidr;
use skiff_core::events::{EventRecorder, EventType};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("node CIDR mask /{mask} does not fit in cluster CIDR {cluster}")]
    BadMask { cluster: Cidr, mask: u8 },
    #[error("setting the podCIDR of node {node}")]
    Patch {
        node: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The pure allocator: blocks of `/mask` inside `cluster`, numbered from 0.
#[derive(Debug)]
pub struct CidrSet {
    cluster: Cidr,
    mask: u8,
    used: BTreeSet<u64>,
    next: u64,
}

impl CidrSet {
    pub fn new(cluster: Cidr, mask: u8) -> Result<CidrSet> {
        if mask < cluster.prefix() || mask > 32 {
            return Err(Error::BadMask { cluster, mask });
        }
        Ok(CidrSet { cluster, mask, used: BTreeSet::new(), next: 0 })
    }

    fn blocks(&self) -> u64 {
        1u64 << (self.mask - self.cluster.prefix())
    }

    fn index_of(&self, cidr: &str) -> Option<u64> {
        let c = Cidr::parse(cidr)?;
        if c.prefix() != self.mask || !self.cluster.contains(c.base()) {
            return None;
        }
        Some(u64::from(u32::from(c.base()) - u32::from(self.cluster.base())) >> (32 - self.mask))
    }

    /// Mark a block in use (a Node that already has it); false if outside the range.
    pub fn occupy(&mut self, cidr: &str) -> bool {
        match self.index_of(cidr) {
            Some(i) => {
                self.used.insert(i);
                true
            }
            None => false,
        }
    }

    pub fn release(&mut self, cidr: &str) {
        if let Some(i) = self.index_of(cidr) {
            self.used.remove(&i);
        }
    }

    /// The next free block (round robin from the last allocation, as upstream).
    pub fn allocate(&mut self) -> Option<String> {
        let n = self.blocks();
        for k in 0..n {
            let i = (self.next + k) % n;
            if !self.used.contains(&i) {
                self.used.insert(i);
                self.next = (i + 1) % n;
                let base = u32::from(self.cluster.base()) + ((i as u32) << (32 - self.mask));
                return Some(format!("{}/{}", Ipv4Addr::from(base), self.mask));
            }
        }
        None
    }
}

fn pod_cidr(node: &Node) -> Option<String> {
    node.spec.as_ref()?.pod_cidr.clone().filter(|c| !c.is_empty())
}

/// Run the node IPAM controller until dropped (returns at once when disabled).
pub async fn run(ctx: Arc<Context>) -> Result<()> {
    let Some(cluster) = ctx.config.cluster_cidr else { return Ok(()) };
    let mut set = CidrSet::new(cluster, ctx.config.node_cidr_mask)?;
    let (tx, mut rx) = mpsc::unbounded_channel::<ObjectRef<Node>>();
    let (del_tx, mut del_rx) = mpsc::unbounded_channel::<String>();
    let nodes = informer(&ctx.informers.all::<Node>(), tx, move |c| match c {
        Change::Applied(n) => vec![ObjectRef::from_obj(n)],
        Change::Deleted(n) => {
            if let Some(c) = pod_cidr(n) {
                let _ = del_tx.send(c);
            }
            Vec::new()
        }
    })
    .await;
    let _ = nodes.wait_until_ready().await;
    for n in nodes.state() {
        if let Some(c) = pod_cidr(&n) {
            set.occupy(&c);
        }
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let recorder = EventRecorder::new(ctx.client.clone(), "node-ipam-controller");
    loop {
        tokio::select! {
            Some(c) = del_rx.recv() => set.release(&c),
            Some(r) = rx.recv() => {
                let Some(node) = nodes.get(&r) else { continue };
                if let Some(c) = pod_cidr(&node) {
                    set.occupy(&c);
                    continue;
                }
                let Some(cidr) = set.allocate() else {
                    recorder.record(node.as_ref(), EventType::Warning, "CIDRNotAvailable",
                        &format!("Node {} status is now: CIDRNotAvailable", node.name_any())).await;
                    continue;
                };
                let patch = json!({"metadata": {"resourceVersion": node.resource_version()},
                                   "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                match api.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {}
                    Err(e) => {
                        // Conflict or gone: free the block; the next event retries.
                        set.release(&cidr);
                        tracing::debug!(node = %node.name_any(), error = %e, "setting podCIDR");
                    }
                }
            }
            else => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_releases_and_rebuilds() {
        let cluster = Cidr::parse("10.244.0.0/22").expect("cidr");
        let mut s = CidrSet::new(cluster, 24).expect("set");
        assert!(s.occupy("10.244.1.0/24"));
        assert!(!s.occupy("10.99.0.0/24"), "outside the cluster CIDR");
        assert_eq!(s.allocate().as_deref(), Some("10.244.0.0/24"));
        assert_eq!(s.allocate().as_deref(), Some("10.244.2.0/24"));
        assert_eq!(s.allocate().as_deref(), Some("10.244.3.0/24"));
        assert_eq!(s.allocate(), None, "exhausted");
        s.release("10.244.2.0/24");
        assert_eq!(s.allocate().as_deref(), Some("10.244.2.0/24"));
        assert!(CidrSet::new(cluster, 20).is_err());
    }
}
