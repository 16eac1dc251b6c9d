//! What the layers of the apiserver share: the served resources, the store, the watch cache,
//! the Service allocators, the settings and the health of the components running beside it.
//! Authentication, authorization, admission, watches, discovery and the streaming proxy take
//! a `&State`; the verbs take the whole [`crate::server::ApiServer`], which holds a `State` and
//! derefs to it.

use std::sync::Arc;

use crate::alloc::Allocators;
use crate::cache::WatchCache;
use crate::config::ApiConfig;
use crate::registry::Registry;
use skiff_core::supervisor::ComponentHealth;
use skiff_store::DynStore;

pub struct State {
    pub registry: Arc<Registry>,
    pub store: DynStore,
    pub cache: Arc<WatchCache>,
    pub alloc: Allocators,
    pub config: ApiConfig,
    /// The supervised components running beside the apiserver (controllers, scheduler):
    /// their failures show in /healthz, /readyz and /metrics.
    pub components: Arc<ComponentHealth>,
    /// The APIServices proxied to extension apiservers, for routing and discovery.
    pub remotes: crate::aggregator::remotes::Remotes,
}
