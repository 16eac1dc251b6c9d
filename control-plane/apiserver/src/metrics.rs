//! Request counters and latency for /metrics, with the stored-object and supervised-component
//! gauges.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use std::time::Duration;

use axum::response::Response;
use http::{HeaderValue, Method, StatusCode};

use crate::state::State;
use crate::status::ApiError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    verb: String,
    code: String,
}

/// Request counters and latency for /metrics (apiserver_request_* as upstream names them).
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::default(),
            latency: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
        }
    }
}

impl Metrics {
    pub fn observe(&self, method: &Method, code: StatusCode, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: method.as_str().to_string(),
                code: code.as_u16().to_string(),
            })
            .inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    pub fn render(&self, state: &State) -> Response {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "apiserver_request",
            "Requests by HTTP verb and code",
            self.requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Request latency",
            self.latency.clone(),
        );
        let objects: Family<Vec<(String, String)>, prometheus_client::metrics::gauge::Gauge> =
            Family::default();
        for rt in state.registry.all() {
            objects
                .get_or_create(&vec![("resource".to_string(), rt.qualified())])
                .set(state.cache.resource(rt).len() as i64);
        }
        registry.register("apiserver_storage_objects", "Objects stored per resource", objects);
        type ByComponent = Family<Vec<(String, String)>, prometheus_client::metrics::gauge::Gauge>;
        let (restarts, panics, failing) =
            (ByComponent::default(), ByComponent::default(), ByComponent::default());
        for c in state.components.statuses() {
            let labels = vec![("component".to_string(), c.name.to_string())];
            restarts.get_or_create(&labels).set(c.restarts as i64);
            panics.get_or_create(&labels).set(c.reconcile_panics as i64);
            failing.get_or_create(&labels).set(i64::from(c.failing.is_some()));
        }
        registry.register(
            "skiff_component_restarts",
            "Restarts of a supervised component (controller, scheduler) after it stopped or panicked",
            restarts,
        );
        registry.register(
            "skiff_component_reconcile_panics",
            "Panics caught in one reconcile of a supervised component",
            panics,
        );
        registry.register(
            "skiff_component_failing",
            "1 while a supervised component counts as failing (as its health check reports)",
            failing,
        );
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            return ApiError::internal("encoding metrics").into_response_inner();
        }
        let mut r = Response::new(axum::body::Body::from(out));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        r
    }
}

impl ApiError {
    fn into_response_inner(self) -> Response {
        axum::response::IntoResponse::into_response(self)
    }
}
