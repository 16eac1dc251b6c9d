//! skiff's core, what every component may use (kube-core's role in kube-rs): exact
//! resource quantities, label and node selectors, well-known names, CIDRs, saturating time
//! arithmetic, the supervision of long-running components, the event recorder, quota
//! arithmetic, the shared informers, ClusterRole aggregation, cron schedules, the
//! resource-metrics format, the streaming upgrade plumbing and the node join client.
//!
//! It holds types and rules, not servers: it may not import the store, the API machinery,
//! the apiserver, the scheduler, the controllers or the agent, nor an HTTP server framework
//! or a storage engine (axum, redb, etcd-client). Everything else builds on it: the
//! control plane's crates, the node agent, the proxy.

pub mod autoscaling;
pub mod certificates;
pub mod cidr;
pub mod cron;
pub mod events;
pub mod informers;
pub mod join;
pub mod json;
pub mod labels;
pub mod logging;
pub mod names;
pub mod quantity;
pub mod quota;
pub mod rbac;
pub mod resource_metrics;
pub mod status;
pub mod streaming;
pub mod supervisor;
pub mod time;
pub mod volumes;
