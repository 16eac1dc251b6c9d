//! Update (PUT) and the read-modify-write every write shares (upstream's GuaranteedUpdate):
//! from the watch cache's copy first, the store's when that copy is stale, with admission,
//! validation and managed fields.

use http::StatusCode;
use serde_json::Value;

use super::admit as plugins;
use super::decode::{decode_for, kind_schema, manager};
use super::quota;
use super::read::get_object;
use super::verb::Target;
use super::verb::{
    Answer, MAX_RETRIES, Written, check_name, encode, ensure_namespace, gvk, invalid, meta_mut,
    meta_str, release_on_delete, store_error, written,
};
use crate::cache::set_resource_version;
use crate::negotiate::{self};
use crate::registry::ResourceType;
use crate::request::Input;
use crate::server::ApiServer;
use crate::status::{ApiError, ApiResult};
use skiff_core::json::ValueAt;
use skiff_machinery::admission::{self, Operation};
use skiff_machinery::apply;
use skiff_store::{self as store, Revision, StoreExt};

/// Who writes and how: the field manager, the subresource, whether managed fields are
/// tracked here (an apply computed its own), whether admission runs (not for the server's
/// own writes: a binding, an eviction's) and dry run.
#[derive(Clone, Copy)]
pub(super) struct Writer<'a> {
    pub(super) manager: &'a str,
    pub(super) sub: Option<&'a str>,
    pub(super) track: bool,
    pub(super) admit: bool,
    pub(super) dry_run: bool,
}

/// The outcome of computing an update from the current object.
pub(super) enum Change {
    /// Write this object (compare-and-swap on the revision it was computed from).
    Write(Value),
    /// Remove the object (last finalizer gone from a terminating object).
    Remove,
}

pub(super) async fn update(
    t: Target<'_>,
    name: &str,
    sub: Option<&str>,
    input: Input<'_>,
    answer: Answer,
) -> ApiResult<(Written, StatusCode, Vec<String>)> {
    let Input { query, headers, body } = input;
    let Target { rt, ns, .. } = t;
    let mut warnings = Vec::new();
    let body_type = negotiate::body_type(headers)?;
    let mut new = decode_for(rt, body_type, body, query.field_validation()?, &mut warnings)?;
    ensure_namespace(ns, &mut new)?;
    check_name(&new, name, ns)?;
    let manager = manager(query, headers, "UpdateOptions")?;
    let precondition = meta_str(&new, "resourceVersion").map(str::to_string);
    let written = guaranteed_write(
        t,
        name,
        Writer { manager: &manager, sub, track: true, admit: true, dry_run: query.dry_run()? },
        precondition,
        |_| Ok(new.clone()),
        answer,
    )
    .await?;
    Ok((written, StatusCode::OK, warnings))
}

/// The watch cache's copy of an object, decoded, with its revision: the first guess of a
/// read-modify-write (it may lag the store, never lead it).
pub(super) fn cached_current(
    server: &ApiServer,
    rt: &ResourceType,
    key: &str,
) -> Option<(Value, Revision)> {
    let cached = server.cache.resource(rt).get(key)?;
    let value = serde_json::from_slice(&cached.json).ok()?;
    Some((value, cached.rv))
}

/// Read-modify-write with retries on revision conflicts (upstream's GuaranteedUpdate).
/// `transform` computes the desired object from the current one.
///
/// As upstream's cacher does, the first attempt starts from the watch cache's copy rather
/// than a store read. That copy may be stale: the compare-and-swap on its revision then
/// fails and the next attempt reads the store. Whatever a stale copy would decide without
/// a write (a failed precondition, an error from the transform or admission, no change at
/// all) is decided again on the store's current object before it is answered.
pub(super) async fn guaranteed_update(
    t: Target<'_>,
    name: &str,
    w: Writer<'_>,
    precondition: Option<String>,
    transform: impl Fn(&Value) -> ApiResult<Value>,
) -> ApiResult<Value> {
    guaranteed_write(t, name, w, precondition, transform, Answer::Object).await.map(Written::object)
}

/// [`guaranteed_update`] answering as asked: with [`Answer::Json`], the objects are dropped
/// once the write is encoded, and a stored write answers with its JSON.
pub(super) async fn guaranteed_write(
    t: Target<'_>,
    name: &str,
    w: Writer<'_>,
    precondition: Option<String>,
    transform: impl Fn(&Value) -> ApiResult<Value>,
    answer: Answer,
) -> ApiResult<Written> {
    let Target { server, rt, ns } = t;
    let dry_run = w.dry_run;
    let key = rt.key(ns, name);
    // A dry run reads the store, as upstream's dry-run storage does.
    let mut guess = if dry_run { None } else { cached_current(server, rt, &key) };
    let admitted = w.admit;
    let mut attempt = 0;
    while attempt < MAX_RETRIES {
        let (mut current, rev, fresh) = match guess.take() {
            Some((current, rev)) => (current, rev, false),
            None => {
                attempt += 1;
                let (current, rev) = get_object(t, name).await?;
                (current, rev, true)
            }
        };
        // The write works at the request's version (a custom resource's may not be the
        // storage version); it is stored at the storage version again.
        crate::conversion::for_request(&server.state, rt, &mut current).await?;
        let decided = async {
            if let Some(want) = &precondition
                && want != &rev.to_string()
            {
                return Err(ApiError::modified(&rt.qualified(), name).with_details(
                    rt.group(),
                    rt.plural(),
                    name,
                ));
            }
            let mut desired = transform(&current)?;
            if admitted {
                desired =
                    plugins::admit_update(t, name, w.sub, desired, &mut current, dry_run).await?;
            }
            prepare_update(server, rt, name, w, desired, &current)
        }
        .await;
        // What a stale copy decides without writing is decided again on a store read.
        let change = match decided {
            Err(_) | Ok(None) if !fresh => continue,
            Err(e) => return Err(e),
            Ok(change) => change,
        };
        let unwritten = |obj| Ok(Written::Object(obj));
        match change {
            None => return unwritten(current),
            Some((Change::Remove, _)) => {
                if dry_run {
                    return unwritten(current);
                }
                match server.store.delete(&key, Some(rev)).await {
                    Ok(_) => {
                        release_on_delete(server, rt, &current);
                        return unwritten(current);
                    }
                    Err(store::Error::Conflict { .. }) => continue,
                    Err(e) => return Err(store_error(rt, name, e)),
                }
            }
            Some((Change::Write(mut obj), reservation)) => {
                let admission = if admitted {
                    async {
                        plugins::validate_update(t, name, w.sub, &mut obj, &mut current, dry_run)
                            .await?;
                        // The quota last, as on create; only the main resource changes usage.
                        // (Boxed: charging writes the quota through this function.)
                        if w.sub.is_none() {
                            Box::pin(charge_update(t, &current, &obj, dry_run)).await?;
                        }
                        Ok::<(), ApiError>(())
                    }
                    .await
                } else {
                    Ok(())
                };
                if let Err(e) = admission {
                    if let Some(r) = &reservation {
                        server.alloc.release(r);
                    }
                    if !fresh {
                        continue;
                    }
                    return Err(e);
                }
                if dry_run {
                    if let Some(r) = &reservation {
                        server.alloc.release(r);
                    }
                    // Upstream's dry-run storage answers with the revision it read.
                    set_resource_version(&mut obj, rev);
                    return unwritten(obj);
                }
                crate::conversion::for_storage(&server.state, rt, &mut obj).await?;
                let stored = encode(&obj);
                let cache = server.cache.resource(rt);
                cache.expect(rt, &key, &stored, &obj);
                // Only a Service's write needs the objects afterwards (its allocations).
                let service = rt.kind() == "Service" && rt.group().is_empty();
                let before = service.then_some(current);
                let kept = (service || answer == Answer::Object).then_some(obj);
                let result = server.store.update(&key, stored.clone(), rev).await;
                if result.is_err() {
                    cache.unexpect(&stored);
                }
                match result {
                    Ok(kv) => {
                        if let (Some(current), Some(obj)) = (&before, &kept) {
                            server.alloc.release_service(current, Some(obj));
                        }
                        let kept = kept.filter(|_| answer == Answer::Object);
                        return written(kept, &stored, kv.mod_revision);
                    }
                    Err(store::Error::Conflict { .. } | store::Error::NotFound { .. })
                        if !fresh =>
                    {
                        // The cached copy was stale (or the object is gone): read the store.
                        if let Some(r) = &reservation {
                            server.alloc.release(r);
                        }
                        continue;
                    }
                    Err(store::Error::Conflict { .. }) => {
                        if let Some(r) = &reservation {
                            server.alloc.release(r);
                        }
                        if precondition.is_some() {
                            return Err(ApiError::modified(&rt.qualified(), name).with_details(
                                rt.group(),
                                rt.plural(),
                                name,
                            ));
                        }
                        continue;
                    }
                    Err(e) => {
                        if let Some(r) = &reservation {
                            server.alloc.release(r);
                        }
                        return Err(store_error(rt, name, e));
                    }
                }
            }
        }
    }
    Err(ApiError::conflict(&rt.qualified(), name, "too many concurrent writes; please retry"))
}

/// Admission for an update: keep system-owned metadata, apply the strategy, default,
/// validate, track managed fields. `None` when nothing would change.
pub(super) fn prepare_update(
    server: &ApiServer,
    rt: &ResourceType,
    name: &str,
    w: Writer<'_>,
    mut new: Value,
    old: &Value,
) -> ApiResult<Option<(Change, Option<crate::alloc::Reservation>)>> {
    let Writer { manager, sub, track, .. } = w;
    if sub == Some("finalize") {
        // namespaces/finalize changes `spec.finalizers` and nothing else.
        let finalizers = new.at(&["spec", "finalizers"]).cloned();
        new = old.clone();
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            match finalizers {
                Some(f) => spec.insert("finalizers".into(), f),
                None => spec.remove("finalizers"),
            };
        }
    }
    {
        let empty = serde_json::Map::new();
        let old_meta = old.get("metadata").and_then(Value::as_object).unwrap_or(&empty);
        let meta = meta_mut(&mut new);
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
        ] {
            match old_meta.get(field) {
                Some(v) => {
                    meta.insert(field.into(), v.clone());
                }
                None => {
                    meta.remove(field);
                }
            }
        }
        // Managed fields are the server's, unless the client explicitly rewrites them.
        if !meta.contains_key("managedFields")
            && let Some(mf) = old_meta.get("managedFields")
        {
            meta.insert("managedFields".into(), mf.clone());
        }
        meta.remove("resourceVersion");
        match old_meta.get("generation") {
            Some(g) => meta.insert("generation".into(), g.clone()),
            None => meta.remove("generation"),
        };
        // A status write may change labels, annotations, finalizers and owners as well, as
        // the status strategies of these kinds allow upstream (they do not reset the metadata
        // with `ResetObjectMetaForStatus`); the kind's own restorations are in
        // `prepare_for_update`. The Deployment controller stamps its revision this way.
    }
    let g = gvk(rt);
    // pods/binding is a system write of spec.nodeName and the PodScheduled condition: no
    // pod-update validation (upstream forbids that change through a pod update).
    let binding = sub == Some("binding");
    if !binding {
        admission::default_object(g, &mut new).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if matches!(sub, Some("status") | Some("approval")) {
            match old.get("spec") {
                Some(spec) => new["spec"] = spec.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("spec");
                    }
                }
            }
        } else if rt.has_status {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        // Sets metadata.generation (old + 1 when the spec changed).
        admission::prepare_for_update(g, sub, &mut new, old);
        admission::drop_omitted_empties(g, &mut new);
        if rt.custom.is_some() {
            admission::apiextensions::bump_custom_generation(rt.has_status, &mut new, old);
        }
    }
    let reservation = if rt.kind() == "Service" && rt.group().is_empty() && sub.is_none() {
        Some(server.alloc.allocate_update(&mut new, old)?)
    } else {
        None
    };
    let release = |r: &Option<crate::alloc::Reservation>| {
        if let Some(r) = r {
            server.alloc.release(r);
        }
    };
    let errs = if binding {
        Vec::new()
    } else if let Some(info) = &rt.custom {
        let mut errs =
            admission::apiextensions::validate_custom_meta(rt.desc.namespaced, &new, Some(old));
        if let Some(schema) = &info.structural {
            errs.extend(admission::apiextensions::validate_custom(schema, &new, Some(old)));
        }
        errs
    } else {
        admission::validate(g, Operation::Update, sub, &new, Some(old))
    };
    if !errs.is_empty() {
        release(&reservation);
        return Err(invalid(rt, name, errs));
    }
    // Terminating and no finalizers left: the object goes away.
    let finalizers_empty = new.at(&["metadata", "finalizers"]).and_then(Value::as_array).is_none_or(|f| f.is_empty())
            // A Namespace also waits for its `spec.finalizers` (removed through /finalize).
            && (rt.kind() != "Namespace"
                || new.at(&["spec", "finalizers"]).and_then(Value::as_array).is_none_or(|f| f.is_empty()));
    let grace_pending = rt.kind() == "Pod"
        && rt.group().is_empty()
        && new.at(&["metadata", "deletionGracePeriodSeconds"]).and_then(Value::as_i64).unwrap_or(0)
            > 0;
    if meta_str(&new, "deletionTimestamp").is_some() && finalizers_empty && !grace_pending {
        release(&reservation);
        return Ok(Some((Change::Remove, None)));
    }
    let ts = skiff_core::time::now_rfc3339();
    if track {
        apply::track_update(
            Some(old),
            &mut new,
            manager,
            sub,
            &rt.desc.api_version(),
            kind_schema(rt),
            &ts,
        );
    }
    if same_object(&new, old) {
        release(&reservation);
        return Ok(None);
    }
    Ok(Some((Change::Write(new), reservation)))
}

/// Equal apart from resourceVersion and the timestamps of managed fields (compared in place:
/// every update asks, and most differ early).
pub(super) fn same_object(a: &Value, b: &Value) -> bool {
    fn same_map(
        a: &serde_json::Map<String, Value>,
        b: &serde_json::Map<String, Value>,
        skip: Option<&str>,
        inner: impl Fn(&str, &Value, &Value) -> bool,
    ) -> bool {
        let mut a = a.iter().filter(|(k, _)| Some(k.as_str()) != skip);
        let mut b = b.iter().filter(|(k, _)| Some(k.as_str()) != skip);
        loop {
            match (a.next(), b.next()) {
                (None, None) => return true,
                (Some((ka, va)), Some((kb, vb))) if ka == kb && inner(ka, va, vb) => {}
                _ => return false,
            }
        }
    }
    let entry = |a: &Value, b: &Value| match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => same_map(a, b, Some("time"), |_, a, b| a == b),
        _ => a == b,
    };
    let managed_fields = |a: &Value, b: &Value| match (a.as_array(), b.as_array()) {
        (Some(a), Some(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| entry(a, b)),
        _ => a == b,
    };
    let metadata = |a: &Value, b: &Value| match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => same_map(a, b, Some("resourceVersion"), |k, a, b| {
            if k == "managedFields" { managed_fields(a, b) } else { a == b }
        }),
        _ => a == b,
    };
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            same_map(a, b, None, |k, a, b| if k == "metadata" { metadata(a, b) } else { a == b })
        }
        _ => a == b,
    }
}

// ---------------------------------------------------------------------------------------
// quota charges: the write path checks and charges the ResourceQuotas of the namespace

/// Check and charge the quotas of `ns` for creating `obj`.
pub(super) async fn charge(t: Target<'_>, obj: &Value, dry_run: bool) -> ApiResult<()> {
    charge_usage(t, obj, |usage| usage, dry_run).await
}

/// Check and charge the quotas of `ns` for updating `old` to `new`: what the update adds
/// (upstream's evaluators handle updates of Services, whose type may now take node ports
/// or a load balancer, and of claims, which may grow). Less usage is given back by the
/// controller's next recount.
pub(super) async fn charge_update(
    t: Target<'_>,
    old: &Value,
    new: &Value,
    dry_run: bool,
) -> ApiResult<()> {
    let Target { rt, .. } = t;
    if !(rt.group().is_empty() && matches!(rt.plural(), "services" | "persistentvolumeclaims")) {
        return Ok(());
    }
    let before =
        skiff_core::quota::usage(rt.group(), rt.plural(), old, &skiff_core::time::now_rfc3339());
    let added = |after: skiff_core::quota::Usage| -> skiff_core::quota::Usage {
        after
            .into_iter()
            .filter_map(|(name, q)| {
                let delta =
                    skiff_core::quantity::Quantity(q.0 - before.get(&name).map_or(0, |b| b.0));
                (delta.0 > 0).then_some((name, delta))
            })
            .collect()
    };
    charge_usage(t, new, added, dry_run).await
}

/// Check and charge the quotas of `ns` for `obj`, with what `charged` makes of its usage.
async fn charge_usage(
    t: Target<'_>,
    obj: &Value,
    charged: impl FnOnce(skiff_core::quota::Usage) -> skiff_core::quota::Usage,
    dry_run: bool,
) -> ApiResult<()> {
    let Target { server, rt, ns } = t;
    let Some(ns) = ns else { return Ok(()) };
    let Some(quota_rt) = server.registry.find("", "v1", "resourcequotas") else { return Ok(()) };
    let quotas = server.cache.resource(quota_rt).list(&quota_rt.namespace_prefix(Some(ns)), None);
    if quotas.is_empty() {
        return Ok(());
    }
    let usage = charged(skiff_core::quota::usage(
        rt.group(),
        rt.plural(),
        obj,
        &skiff_core::time::now_rfc3339(),
    ));
    if usage.is_empty() {
        return Ok(());
    }
    let subject = quota::Subject {
        group: rt.group(),
        resource: rt.plural(),
        name: obj.at(&["metadata", "name"]).and_then(Value::as_str).unwrap_or_default(),
        obj,
        usage: &usage,
    };
    // Every quota is checked before any is charged, as upstream does: a refusal by one
    // leaves the others untouched.
    let mut charged = Vec::new();
    for cached in quotas {
        let quota = cached.value();
        if subject.charged(&quota)?.is_some() {
            charged.push(quota);
        }
    }
    if dry_run {
        return Ok(());
    }
    for quota in charged {
        let name = quota.at(&["metadata", "name"]).and_then(Value::as_str).unwrap_or_default();
        let w = Writer {
            manager: quota::MANAGER,
            sub: Some("status"),
            track: false,
            admit: false,
            dry_run,
        };
        let written = guaranteed_update(
            Target { server, rt: quota_rt, ns: Some(ns) },
            name,
            w,
            None,
            |current| Ok(subject.charged(current)?.unwrap_or_else(|| current.clone())),
        )
        .await;
        match written {
            // Deleted meanwhile: nothing to charge.
            Err(e) if e.code == http::StatusCode::NOT_FOUND => {}
            other => {
                other?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::same_object;

    #[test]
    fn same_object_ignores_only_resource_version_and_managed_field_times() {
        let pod = |rv: &str, time: &str, label: &str, manager: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "resourceVersion": rv, "labels": {"app": label},
                    "managedFields": [{"manager": manager, "operation": "Update", "time": time,
                        "fieldsV1": {"f:metadata": {}}}]},
                "spec": {"nodeName": "n1"}})
        };
        let base = pod("1", "2026-01-01T00:00:00Z", "a", "kubectl");
        assert!(same_object(&base, &pod("2", "2026-01-02T00:00:00Z", "a", "kubectl")));
        assert!(!same_object(&base, &pod("1", "2026-01-01T00:00:00Z", "b", "kubectl")));
        assert!(!same_object(&base, &pod("1", "2026-01-01T00:00:00Z", "a", "skiff")));
        let mut extra = base.clone();
        extra["spec"]["hostname"] = json!("h");
        assert!(!same_object(&base, &extra));
        let mut no_rv = base.clone();
        no_rv["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        assert!(same_object(&base, &no_rv) && same_object(&no_rv, &base));
        let mut two_managers = base.clone();
        two_managers["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(json!({"manager": "x", "operation": "Update"}));
        assert!(!same_object(&base, &two_managers));
        // Only the named keys are skipped, an empty one included.
        let (mut x, mut y) = (base.clone(), base.clone());
        x[""] = json!(1);
        y[""] = json!(2);
        assert!(!same_object(&x, &y));
    }

    /// A store that counts its single-key reads.
    struct CountingGets {
        inner: skiff_store::memory::MemoryStore,
        gets: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl skiff_store::Store for CountingGets {
        async fn get(&self, key: &str) -> skiff_store::Result<Option<skiff_store::KeyValue>> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.get(key).await
        }
        async fn list(&self, prefix: &str) -> skiff_store::Result<skiff_store::ListResult> {
            self.inner.list(prefix).await
        }
        async fn txn(
            &self,
            ops: Vec<skiff_store::TxnOp>,
        ) -> skiff_store::Result<Vec<skiff_store::TxnResult>> {
            self.inner.txn(ops).await
        }
        async fn current_revision(&self) -> skiff_store::Result<skiff_store::Revision> {
            self.inner.current_revision().await
        }
        async fn watch(
            &self,
            prefix: &str,
            after: skiff_store::Revision,
        ) -> skiff_store::Result<
            futures::stream::BoxStream<'static, skiff_store::Result<skiff_store::Event>>,
        > {
            self.inner.watch(prefix, after).await
        }
        async fn compact(&self, revision: skiff_store::Revision) -> skiff_store::Result<()> {
            self.inner.compact(revision).await
        }
        async fn compacted_revision(&self) -> skiff_store::Result<skiff_store::Revision> {
            self.inner.compacted_revision().await
        }
    }

    /// Updates start from the watch cache's copy: with the cache caught up, an update reads
    /// nothing from the store. Made stale on purpose (a write straight to the store the cache
    /// has not seen yet, on this single-threaded runtime), the copy must neither lose that
    /// write nor decide a precondition.
    #[tokio::test]
    async fn updates_from_a_stale_cached_copy_see_the_store() {
        use std::sync::Arc;
        use std::time::Duration;

        use http::{Method, StatusCode};
        use serde_json::Value;

        use crate::server::ApiServer;
        use crate::testing;
        use skiff_store::StoreExt;
        use skiff_store::memory::MemoryStore;

        let store = Arc::new(CountingGets { inner: MemoryStore::new(), gets: Default::default() });
        let gets = || store.gets.load(std::sync::atomic::Ordering::SeqCst);
        let api = ApiServer::start(store.clone(), Default::default()).await.expect("apiserver");
        let call = |method: Method, uri: &str, ct: &str, body: Value| {
            let api = api.clone();
            let uri = uri.to_string();
            let ct = ct.to_string();
            async move { testing::call(&api, None, method, &uri, &ct, body).await }
        };
        let uri = "/api/v1/namespaces/default/configmaps";
        let (s, created) = call(
            Method::POST,
            uri,
            "application/json",
            json!({"metadata": {"name": "cm"}, "data": {"a": "1"}}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{created}");
        let rt = api.registry.find("", "v1", "configmaps").expect("configmaps");
        let key = rt.key(Some("default"), "cm");
        assert!(
            api.cache
                .wait_for(api.store.current_revision().await.unwrap(), Duration::from_secs(5))
                .await
        );

        // A current copy: the update is computed from it, without a store read.
        let before = gets();
        let (s, body) = call(
            Method::PATCH,
            &format!("{uri}/cm"),
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"l": "1"}}}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(gets(), before, "an update from a current cached copy read the store");
        let created = body;
        assert!(
            api.cache
                .wait_for(api.store.current_revision().await.unwrap(), Duration::from_secs(5))
                .await
        );

        // Behind the cache's back: data.b, at a revision the cache does not hold yet.
        let stale_rv = api.cache.resource(rt).get(&key).expect("cached").rv;
        let mut behind = created.clone();
        behind["data"]["b"] = json!("2");
        behind["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        let fresh = api
            .store
            .update(&key, serde_json::to_vec(&behind).unwrap().into(), stale_rv)
            .await
            .expect("direct write");
        assert_eq!(
            api.cache.resource(rt).get(&key).expect("cached").rv,
            stale_rv,
            "cache already caught up"
        );

        // A precondition on the store's revision holds although the cache has another one.
        let mut put = behind.clone();
        put["metadata"]["resourceVersion"] = json!(fresh.mod_revision.to_string());
        put["data"]["c"] = json!("3");
        let before = gets();
        let (s, body) = call(Method::PUT, &format!("{uri}/cm"), "application/json", put).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(body["data"], json!({"a": "1", "b": "2", "c": "3"}));
        assert!(gets() > before, "the stale copy's precondition was not decided on a store read");

        // A merge patch keeps every earlier write; the cached revision is now a conflict.
        let (s, body) = call(
            Method::PATCH,
            &format!("{uri}/cm"),
            "application/merge-patch+json",
            json!({"data": {"d": "4"}}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(body["data"], json!({"a": "1", "b": "2", "c": "3", "d": "4"}));
        let mut stale = created.clone();
        stale["metadata"]["resourceVersion"] = json!(stale_rv.to_string());
        let (s, body) = call(Method::PUT, &format!("{uri}/cm"), "application/json", stale).await;
        assert_eq!(s, StatusCode::CONFLICT, "{body}");
    }
}
