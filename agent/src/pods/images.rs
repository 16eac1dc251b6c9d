//! The image step of a container start: ImageStatus first, PullImage per imagePullPolicy,
//! ErrImagePull then ImagePullBackOff while the pull backs off.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Container;
use tokio::time::Instant;

use super::backoff::Backoff;
use crate::config::BackoffConfig;
use crate::runtime::{Runtime, api};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// The container's pull policy; unset: Always for `:latest` or untagged images, else
/// IfNotPresent (API defaulting).
pub fn pull_policy(c: &Container) -> PullPolicy {
    match c.image_pull_policy.as_deref() {
        Some("Always") => PullPolicy::Always,
        Some("Never") => PullPolicy::Never,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        _ => {
            let image = c.image.as_deref().unwrap_or_default();
            let name = image.rsplit('/').next().unwrap_or(image);
            if image.contains('@') {
                PullPolicy::IfNotPresent
            } else {
                match name.split_once(':') {
                    Some((_, "latest")) | None => PullPolicy::Always,
                    Some(_) => PullPolicy::IfNotPresent,
                }
            }
        }
    }
}

/// Why an image is not there: the waiting reason and message of the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    pub reason: &'static str,
    pub message: String,
}

/// Per-image pull back-off of one pod.
#[derive(Debug, Default)]
pub struct PullBackoff {
    by_image: HashMap<String, Backoff>,
}

impl PullBackoff {
    /// Time until the next pull of `image` may start (zero when none pending).
    pub fn remaining(&self, image: &str, now: Instant) -> std::time::Duration {
        self.by_image.get(image).map(|b| b.remaining(now)).unwrap_or_default()
    }
}

/// Makes `image` present as the policy says; returns its image ref and whether it was pulled.
pub async fn ensure_image<R: Runtime>(
    runtime: &R,
    image: &str,
    policy: PullPolicy,
    pulls: &mut PullBackoff,
    backoff: BackoffConfig,
    sandbox: Option<&api::PodSandboxConfig>,
) -> Result<(String, bool), ImageError> {
    if image.is_empty() {
        return Err(ImageError { reason: "InvalidImageName", message: "image is empty".into() });
    }
    let present = runtime.image_status(image).await.map_err(|e| ImageError {
        reason: "ErrImageInspect",
        message: format!("Failed to inspect image \"{image}\": {e}"),
    })?;
    match (present, policy) {
        (Some(img), PullPolicy::IfNotPresent | PullPolicy::Never) => return Ok((img.id, false)),
        (None, PullPolicy::Never) => {
            return Err(ImageError {
                reason: "ErrImageNeverPull",
                message: format!(
                    "Container image \"{image}\" is not present with pull policy of Never"
                ),
            });
        }
        _ => {}
    }
    let now = Instant::now();
    if pulls.by_image.get(image).is_some_and(|b| b.in_backoff(now)) {
        return Err(ImageError {
            reason: "ImagePullBackOff",
            message: format!("Back-off pulling image \"{image}\""),
        });
    }
    tracing::info!(image, "pulling image");
    match runtime.pull_image(image, None, sandbox).await {
        Ok(reference) => {
            pulls.by_image.remove(image);
            Ok((reference, true))
        }
        Err(e) => {
            pulls
                .by_image
                .entry(image.to_string())
                .or_insert_with(|| Backoff::new(backoff))
                .failed(now);
            Err(ImageError {
                reason: "ErrImagePull",
                message: format!("Failed to pull image \"{image}\": {e}"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::memory::MemoryRuntime;
    use std::time::Duration;

    fn container(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn default_policies() {
        assert_eq!(pull_policy(&container("busybox", None)), PullPolicy::Always);
        assert_eq!(pull_policy(&container("busybox:latest", None)), PullPolicy::Always);
        assert_eq!(pull_policy(&container("reg:5000/busybox", None)), PullPolicy::Always);
        assert_eq!(pull_policy(&container("reg:5000/busybox:1", None)), PullPolicy::IfNotPresent);
        assert_eq!(pull_policy(&container("busybox:1", Some("Never"))), PullPolicy::Never);
    }

    #[tokio::test(start_paused = true)]
    async fn pulls_per_policy_and_backs_off() {
        let rt = MemoryRuntime::new();
        rt.add_image("local:1");
        rt.add_pullable("remote:1");
        let cfg = BackoffConfig::default();
        let mut pulls = PullBackoff::default();
        ensure_image(&rt, "local:1", PullPolicy::IfNotPresent, &mut pulls, cfg, None)
            .await
            .expect("present");
        assert!(!rt.calls().iter().any(|c| c.starts_with("PullImage")), "ImageStatus first");
        ensure_image(&rt, "remote:1", PullPolicy::IfNotPresent, &mut pulls, cfg, None)
            .await
            .expect("pulled");
        let e = ensure_image(&rt, "absent:1", PullPolicy::Never, &mut pulls, cfg, None)
            .await
            .expect_err("never");
        assert_eq!(e.reason, "ErrImageNeverPull");
        let e = ensure_image(&rt, "absent:1", PullPolicy::IfNotPresent, &mut pulls, cfg, None)
            .await
            .expect_err("absent");
        assert_eq!(e.reason, "ErrImagePull");
        let e = ensure_image(&rt, "absent:1", PullPolicy::IfNotPresent, &mut pulls, cfg, None)
            .await
            .expect_err("backoff");
        assert_eq!(e.reason, "ImagePullBackOff");
        tokio::time::sleep(Duration::from_secs(10)).await;
        let e = ensure_image(&rt, "absent:1", PullPolicy::IfNotPresent, &mut pulls, cfg, None)
            .await
            .expect_err("retried");
        assert_eq!(e.reason, "ErrImagePull");
        let pulls_made = rt.calls().iter().filter(|c| *c == "PullImage absent:1").count();
        assert_eq!(pulls_made, 2, "no pull during the back-off");
    }
}
