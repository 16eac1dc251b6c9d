//! [`ApiServer`]: the [`State`] and the parts of the request path built over it, the
//! authenticators and authorizers, the admission chain, the OpenAPI documents, the request
//! metrics and the audit log. The gate, the verbs and the health endpoints take it; the
//! layers below take the `State` it derefs to. Starting it, bootstrapping the system objects
//! and routing live in the crate root, over everything.

use std::sync::Arc;

use crate::admission;
use crate::audit;
use crate::authn;
use crate::metrics;
use crate::metrics_api;
use crate::state::State;
use skiff_machinery::openapi::OpenApiDocs;

/// Shared state of every request handler.
pub struct ApiServer {
    pub state: Arc<State>,
    /// The OpenAPI documents of the built-in resources.
    pub openapi: OpenApiDocs,
    /// Those with the custom resources served now, built when first asked for after a
    /// change (`openapi_custom::docs`).
    pub openapi_custom: crate::openapi_custom::CustomOpenApi,
    pub metrics: metrics::Metrics,
    /// The nodes' and containers' latest readings, for `metrics.k8s.io`.
    pub resource_metrics: metrics_api::ResourceMetrics,
    /// The admission chain every write passes.
    pub admission: admission::chain::Chain,
    /// The audit log, when configured.
    pub audit: Option<audit::AuditLog>,
    pub auth: authn::Auth,
    /// Permits for requests with large bodies (see `HEAVY_BODY` in the crate root).
    pub heavy: tokio::sync::Semaphore,
}

impl std::ops::Deref for ApiServer {
    type Target = State;

    fn deref(&self) -> &State {
        &self.state
    }
}
