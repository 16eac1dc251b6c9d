//! Leader election over coordination.k8s.io/v1 Leases with client-go's semantics: a
//! candidate takes the Lease when it is free or when the holder's record has not changed
//! for `lease_duration` by the candidate's own clock; the leader renews every
//! `retry_period` and gives up (stops its work) when it could not renew for
//! `renew_deadline`. Several skiff-servers thus run one active scheduler/controller set.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tracing::{info, warn};

/// Timings; defaults are client-go's (and kube-scheduler's/kube-controller-manager's flags).
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// How long a non-leader waits after the last observed change before taking over (15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a renewal before giving up leadership (10 s).
    pub renew_deadline: Duration,
    /// Interval between acquire/renew attempts (2 s).
    pub retry_period: Duration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Failures of one acquire/renew attempt (retried, never fatal).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading lease {lease}")]
    Get {
        lease: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating lease {lease}")]
    Create {
        lease: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating lease {lease}")]
    Update {
        lease: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One candidate for one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    lease: String,
    identity: String,
    config: LeaderElectionConfig,
    /// The last record seen and when (by our clock) it was first seen.
    observed: Option<LeaseSpec>,
    observed_at: Instant,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        lease: &str,
        identity: &str,
        config: LeaderElectionConfig,
    ) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            lease: lease.to_string(),
            identity: identity.to_string(),
            config,
            observed: None,
            observed_at: Instant::now(),
        }
    }

    fn spec(&self, acquire_time: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
            acquire_time: acquire_time.or_else(|| Some(now())),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// client-go `tryAcquireOrRenew`: whether we hold the lease after this attempt.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let current = self
            .api
            .get_opt(&self.lease)
            .await
            .map_err(|source| Error::Get { lease: self.lease.clone(), source })?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.lease.clone()), ..Default::default() },
                spec: Some(self.spec(None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = created.spec;
                    self.observed_at = Instant::now();
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(source) => Err(Error::Create { lease: self.lease.clone(), source }),
            };
        };
        let record = lease.spec.clone().unwrap_or_default();
        if self.observed.as_ref() != Some(&record) {
            self.observed = Some(record.clone());
            self.observed_at = Instant::now();
        }
        let holder = record.holder_identity.as_deref().unwrap_or_default();
        let held_by_us = holder == self.identity;
        let duration = record
            .lease_duration_seconds
            .map_or(self.config.lease_duration, |s| Duration::from_secs(s.max(0) as u64));
        if !holder.is_empty() && !held_by_us && self.observed_at + duration > Instant::now() {
            return Ok(false);
        }
        let transitions = record.lease_transitions.unwrap_or(0);
        lease.spec = Some(if held_by_us {
            self.spec(record.acquire_time.clone(), transitions)
        } else {
            self.spec(None, transitions + 1)
        });
        // Optimistic concurrency: the resourceVersion we read is sent back.
        match self.api.replace(&self.lease, &PostParams::default(), &lease).await {
            Ok(updated) => {
                self.observed = updated.spec;
                self.observed_at = Instant::now();
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(source) => Err(Error::Update { lease: self.lease.clone(), source }),
        }
    }

    /// Give the lease up (client-go ReleaseOnCancel): empty holder, so others take it at once.
    pub async fn release(&mut self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.lease)
            .await
            .map_err(|source| Error::Get { lease: self.lease.clone(), source })?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        self.api
            .replace(&self.lease, &PostParams::default(), &lease)
            .await
            .map(|_| ())
            .map_err(|source| Error::Update { lease: self.lease.clone(), source })
    }

    async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => warn!(error = %e, lease = %self.lease, "leader election"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renew every retry period; return when a renewal did not succeed within the renew
    /// deadline (leadership lost).
    async fn renew_until_lost(&mut self) {
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let deadline = Instant::now() + self.config.renew_deadline;
            loop {
                match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                    Ok(Ok(true)) => break,
                    Ok(Ok(false)) => return,
                    Ok(Err(e)) => warn!(error = %e, lease = %self.lease, "renewing the lease"),
                    Err(_) => return,
                }
                if Instant::now() + self.config.retry_period >= deadline {
                    return;
                }
                tokio::time::sleep(self.config.retry_period).await;
            }
        }
    }
}

/// Acquire `namespace/lease_name` as `identity`, run `f()` while leading, stop it (drop the
/// future) when leadership is lost and campaign again. Returns when `f()` itself returns,
/// after releasing the lease.
pub async fn run_leading<F, Fut>(
    client: Client,
    namespace: &str,
    lease_name: &str,
    identity: &str,
    config: LeaderElectionConfig,
    mut f: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut elector = LeaderElector::new(client, namespace, lease_name, identity, config);
    loop {
        elector.acquire().await;
        info!(lease = lease_name, identity, "became leader");
        let work = pin!(f());
        let finished = {
            let lost = pin!(elector.renew_until_lost());
            tokio::select! {
                _ = work => true,
                _ = lost => false,
            }
        };
        if finished {
            if let Err(e) = elector.release().await {
                warn!(error = %e, "releasing the lease");
            }
            return;
        }
        warn!(lease = lease_name, identity, "leadership lost");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use skiff_apiserver::ApiServer;
    use skiff_store::memory::MemoryStore;

    async fn api() -> Arc<ApiServer> {
        ApiServer::start(Arc::new(MemoryStore::new()), Default::default()).await.unwrap()
    }

    /// Spawns a candidate whose work counts itself in `leading` while it runs.
    fn candidate(
        client: Client,
        id: &'static str,
        leading: Arc<[AtomicUsize; 2]>,
        slot: usize,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            run_leading(
                client,
                "kube-system",
                "skiff-scheduler",
                id,
                LeaderElectionConfig::default(),
                move || {
                    let leading = leading.clone();
                    async move {
                        struct Guard(Arc<[AtomicUsize; 2]>, usize);
                        impl Drop for Guard {
                            fn drop(&mut self) {
                                self.0[self.1].fetch_sub(1, Ordering::SeqCst);
                            }
                        }
                        leading[slot].fetch_add(1, Ordering::SeqCst);
                        let _g = Guard(leading.clone(), slot);
                        futures::future::pending::<()>().await;
                    }
                },
            )
            .await
        })
    }

    #[tokio::test(start_paused = true)]
    async fn one_leader_and_failover_within_lease_duration() {
        let api = api().await;
        let leading = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let a = candidate(api.client(), "a", leading.clone(), 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let b = candidate(api.client(), "b", leading.clone(), 1);
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(leading[0].load(Ordering::SeqCst), 1, "a leads");
            assert_eq!(leading[1].load(Ordering::SeqCst), 0, "b waits");
        }
        let lease: Lease =
            Api::namespaced(api.client(), "kube-system").get("skiff-scheduler").await.unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("a"));

        // Kill the leader: b takes over once the record went unchanged for leaseDuration.
        a.abort();
        let killed = Instant::now();
        while leading[1].load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                killed.elapsed() <= Duration::from_secs(15) + Duration::from_secs(2),
                "no failover after {:?}",
                killed.elapsed()
            );
        }
        let took = killed.elapsed();
        assert!(
            took >= Duration::from_secs(13),
            "b must wait for the lease to expire, took {took:?}"
        );
        let lease: Lease =
            Api::namespaced(api.client(), "kube-system").get("skiff-scheduler").await.unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        b.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn leader_that_cannot_renew_stops_its_work() {
        let api = api().await;
        let leading = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let a = candidate(api.client(), "a", leading.clone(), 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(leading[0].load(Ordering::SeqCst), 1);
        // Someone else overwrites the lease (as after a partition): a sees another holder
        // on its next renewal and stops.
        let leases: Api<Lease> = Api::namespaced(api.client(), "kube-system");
        let mut lease = leases.get("skiff-scheduler").await.unwrap();
        lease.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
        leases.replace("skiff-scheduler", &PostParams::default(), &lease).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(leading[0].load(Ordering::SeqCst), 0, "work stopped when leadership was lost");
        // The intruder never renews: a takes the lease back after it expires.
        tokio::time::sleep(Duration::from_secs(18)).await;
        assert_eq!(leading[0].load(Ordering::SeqCst), 1, "a leads again");
        a.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn finished_work_releases_the_lease() {
        let api = api().await;
        let client = api.client();
        run_leading(
            client.clone(),
            "default",
            "l",
            "a",
            LeaderElectionConfig::default(),
            || async {},
        )
        .await;
        let lease: Lease = Api::namespaced(client.clone(), "default").get("l").await.unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity, None);
        // Released: b acquires at once.
        let mut b =
            LeaderElector::new(client, "default", "l", "b", LeaderElectionConfig::default());
        assert!(b.try_acquire_or_renew().await.unwrap());
    }
}
