//! Crash-loop and image-pull back-off: 10 s doubling to 5 min (the kubelet's
//! `backOffPeriod`/`MaxContainerBackOff`), and the restart policy decision.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::BackoffConfig;

/// The back-off of one key (a container name, or an image).
#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    /// The delay the next failure waits; doubles per failure up to the cap.
    next_delay: Duration,
    /// Earliest time the next attempt may start.
    not_before: Option<Instant>,
    /// The delay currently being waited (shown in CrashLoopBackOff messages).
    current: Duration,
}

impl Backoff {
    pub fn new(config: BackoffConfig) -> Self {
        Backoff { config, next_delay: config.initial, not_before: None, current: Duration::ZERO }
    }

    /// Records a failure at `at`: the next attempt waits the current delay, which then
    /// doubles (capped).
    pub fn failed(&mut self, at: Instant) {
        self.current = self.next_delay;
        self.not_before = Some(at + self.next_delay);
        self.next_delay = (self.next_delay * 2).min(self.config.max);
    }

    /// A run lasting `ran` resets the back-off when it is long enough.
    pub fn ran_for(&mut self, ran: Duration) {
        if ran >= self.config.reset_after {
            *self = Backoff::new(self.config);
        }
    }

    /// How long to wait from `now` (zero when an attempt may start).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.not_before.map(|t| t.saturating_duration_since(now)).unwrap_or_default()
    }

    pub fn in_backoff(&self, now: Instant) -> bool {
        !self.remaining(now).is_zero()
    }

    /// The delay of the current wait.
    pub fn current(&self) -> Duration {
        self.current
    }
}

/// Whether a container that exited with `exit_code` is started again (restartPolicy).
pub fn should_restart(restart_policy: Option<&str>, exit_code: i32) -> bool {
    match restart_policy.unwrap_or("Always") {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn delays_double_from_10s_to_5min() {
        let mut b = Backoff::new(BackoffConfig::default());
        let mut seen = Vec::new();
        for _ in 0..8 {
            let now = Instant::now();
            assert!(!b.in_backoff(now));
            b.failed(now);
            let wait = b.remaining(Instant::now());
            seen.push(wait.as_secs());
            tokio::time::sleep(wait - Duration::from_millis(1)).await;
            assert!(b.in_backoff(Instant::now()), "still backing off just before the delay");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(seen, vec![10, 20, 40, 80, 160, 300, 300, 300]);
        b.ran_for(Duration::from_secs(600));
        b.failed(Instant::now());
        assert_eq!(b.current(), Duration::from_secs(10), "a long run resets the back-off");
    }

    #[test]
    fn restart_policy() {
        assert!(should_restart(None, 0));
        assert!(should_restart(Some("Always"), 0));
        assert!(should_restart(Some("OnFailure"), 1));
        assert!(!should_restart(Some("OnFailure"), 0));
        assert!(!should_restart(Some("Never"), 1));
    }
}
