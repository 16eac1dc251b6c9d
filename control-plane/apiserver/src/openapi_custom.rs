//! The OpenAPI documents with the custom resources served now: the built-in documents
//! ([`ApiServer::openapi`]) plus the Established CRDs' served versions
//! ([`OpenApiDocs::with_custom`]), built on the first OpenAPI request after the registry's
//! custom resource snapshot changes (the snapshot is replaced, never changed in place, so
//! its `Arc` pointer says whether the documents are still current) and kept until the next
//! change. Requests in the meantime wait for the build rather than start their own.

use std::ops::Deref;
use std::sync::Arc;

use skiff_machinery::openapi::{CustomResource, OpenApiDocs};

use crate::custom::CustomTypes;
use crate::server::ApiServer;

/// The documents built for the last custom resource snapshot asked about.
#[derive(Default)]
pub struct CustomOpenApi {
    current: tokio::sync::Mutex<Option<Built>>,
}

struct Built {
    types: Arc<CustomTypes>,
    /// None when building failed (logged): the built-in documents are served.
    docs: Option<Arc<OpenApiDocs>>,
}

/// The documents to serve.
pub enum Docs<'a> {
    Builtin(&'a OpenApiDocs),
    Custom(Arc<OpenApiDocs>),
}

impl Deref for Docs<'_> {
    type Target = OpenApiDocs;

    fn deref(&self) -> &OpenApiDocs {
        match self {
            Docs::Builtin(d) => d,
            Docs::Custom(d) => d,
        }
    }
}

/// The documents of the built-in and the custom resources served now.
pub async fn docs(server: &ApiServer) -> Docs<'_> {
    let types = server.registry.custom();
    if types.all().is_empty() {
        return Docs::Builtin(&server.openapi);
    }
    let mut current = server.openapi_custom.current.lock().await;
    if let Some(built) = current.as_ref().filter(|b| Arc::ptr_eq(&b.types, &types)) {
        return served(server, &built.docs);
    }
    let builtin = server.openapi.clone();
    let snapshot = types.clone();
    // Seconds of CPU at worst for many large CRDs: off the request workers.
    let built = tokio::task::spawn_blocking(move || build(&builtin, &snapshot)).await;
    let docs = match built {
        Ok(Ok(docs)) => Some(Arc::new(docs)),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "building the OpenAPI documents of the custom resources");
            None
        }
        Err(e) => {
            tracing::error!(error = %e, "building the OpenAPI documents of the custom resources");
            None
        }
    };
    let out = served(server, &docs);
    *current = Some(Built { types, docs });
    out
}

fn served<'a>(server: &'a ApiServer, docs: &Option<Arc<OpenApiDocs>>) -> Docs<'a> {
    match docs {
        Some(d) => Docs::Custom(d.clone()),
        None => Docs::Builtin(&server.openapi),
    }
}

fn build(
    builtin: &OpenApiDocs,
    types: &CustomTypes,
) -> Result<OpenApiDocs, skiff_machinery::openapi::Error> {
    let custom: Vec<CustomResource<'_>> = types
        .all()
        .iter()
        .map(|t| CustomResource {
            desc: &t.desc,
            schema: t.custom.as_ref().and_then(|c| c.schema.as_ref()),
        })
        .collect();
    let started = std::time::Instant::now();
    let docs = builtin.with_custom(&custom)?;
    tracing::debug!(
        resources = custom.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "built the OpenAPI documents of the custom resources"
    );
    Ok(docs)
}
