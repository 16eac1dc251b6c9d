//! The scheduling queue, after upstream's PriorityQueue: an active heap (higher priority
//! first, then first come), a backoff heap for pods whose attempt failed (1 s doubling to
//! 10 s by default), and an unschedulable set parked until a cluster event (node added or
//! updated, pod deleted) may make them fit. A pod is in at most one place, and never
//! handed out twice at once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::cache::{PodInfo, PodKey};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    Active,
    Backoff,
    Unschedulable,
    /// Handed out by `pop`, not yet `done`/`requeue`d.
    InFlight,
}

#[derive(Debug)]
struct Entry {
    info: Arc<PodInfo>,
    attempts: u32,
    at: Where,
    /// Generation of the entry, so stale heap items are skipped.
    seq: u64,
    backoff_until: Instant,
    /// An event arrived while the pod was in flight: retry at once on failure.
    moved_in_flight: bool,
}

/// Pending pods of this scheduler.
#[derive(Debug)]
pub struct SchedulingQueue {
    initial_backoff: Duration,
    max_backoff: Duration,
    pods: HashMap<PodKey, Entry>,
    active: BinaryHeap<(i32, Reverse<u64>, PodKey)>,
    backoff: BinaryHeap<Reverse<(Instant, u64, PodKey)>>,
    seq: u64,
}

impl SchedulingQueue {
    pub fn new(initial_backoff: Duration, max_backoff: Duration) -> Self {
        SchedulingQueue {
            initial_backoff,
            max_backoff,
            pods: HashMap::new(),
            active: BinaryHeap::new(),
            backoff: BinaryHeap::new(),
            seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn push_active(&mut self, key: &PodKey) {
        let seq = self.next_seq();
        if let Some(e) = self.pods.get_mut(key) {
            e.at = Where::Active;
            e.seq = seq;
            self.active.push((e.info.priority, Reverse(seq), key.clone()));
        }
    }

    fn push_backoff(&mut self, key: &PodKey) {
        let seq = self.next_seq();
        if let Some(e) = self.pods.get_mut(key) {
            e.at = Where::Backoff;
            e.seq = seq;
            self.backoff.push(Reverse((e.backoff_until, seq, key.clone())));
        }
    }

    /// A pending pod was added or updated by the watch.
    pub fn add(&mut self, info: Arc<PodInfo>) {
        let key = info.key.clone();
        match self.pods.get_mut(&key) {
            None => {
                self.pods.insert(
                    key.clone(),
                    Entry {
                        info,
                        attempts: 0,
                        at: Where::Active,
                        seq: 0,
                        backoff_until: Instant::now(),
                        moved_in_flight: false,
                    },
                );
                self.push_active(&key);
            }
            Some(e) => {
                // Only a change of what scheduling looks at moves an unschedulable pod
                // (our own status writes come back as updates too).
                let changed = e.info.pod.spec != info.pod.spec
                    || e.info.pod.metadata.labels != info.pod.metadata.labels;
                e.info = info;
                if changed {
                    match e.at {
                        Where::Unschedulable => {
                            if e.backoff_until > Instant::now() {
                                self.push_backoff(&key);
                            } else {
                                self.push_active(&key);
                            }
                        }
                        Where::InFlight => e.moved_in_flight = true,
                        Where::Active | Where::Backoff => {}
                    }
                }
            }
        }
    }

    /// The pod was bound or deleted: forget it.
    pub fn remove(&mut self, key: &str) {
        self.pods.remove(key);
    }

    /// Move expired backoff entries to the active heap.
    fn flush_backoff(&mut self, now: Instant) {
        while let Some(Reverse((until, seq, key))) = self.backoff.peek().cloned() {
            if until > now {
                break;
            }
            self.backoff.pop();
            if self.pods.get(&key).is_some_and(|e| e.seq == seq && e.at == Where::Backoff) {
                self.push_active(&key);
            }
        }
    }

    /// The next pod to schedule, or the instant the next backoff expires.
    pub fn pop(&mut self) -> Result<Arc<PodInfo>, Option<Instant>> {
        self.flush_backoff(Instant::now());
        while let Some((_, Reverse(seq), key)) = self.active.pop() {
            if let Some(e) = self.pods.get_mut(&key)
                && e.seq == seq
                && e.at == Where::Active
            {
                e.at = Where::InFlight;
                e.moved_in_flight = false;
                return Ok(e.info.clone());
            }
        }
        Err(self.backoff.peek().map(|Reverse((until, _, _))| *until))
    }

    fn backoff_for(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(16);
        (self.initial_backoff * 2u32.pow(exp)).min(self.max_backoff)
    }

    /// The attempt did not fit anywhere: park the pod until an event (or, if one came
    /// during the attempt, back off and retry).
    pub fn unschedulable(&mut self, key: &str) {
        let Some(e) = self.pods.get_mut(key) else { return };
        e.attempts += 1;
        let attempts = e.attempts;
        let moved = e.moved_in_flight;
        let backoff = self.backoff_for(attempts);
        let Some(e) = self.pods.get_mut(key) else { return };
        e.backoff_until = Instant::now() + backoff;
        let key = key.to_string();
        if moved {
            self.push_backoff(&key);
        } else if let Some(e) = self.pods.get_mut(&key) {
            e.at = Where::Unschedulable;
        }
    }

    /// An error (e.g. the binding failed): retry after the backoff.
    pub fn retry(&mut self, key: &str) {
        let Some(e) = self.pods.get_mut(key) else { return };
        e.attempts += 1;
        let attempts = e.attempts;
        let backoff = self.backoff_for(attempts);
        if let Some(e) = self.pods.get_mut(key) {
            e.backoff_until = Instant::now() + backoff;
        }
        self.push_backoff(&key.to_string());
    }

    /// A cluster event that may make parked pods fit: move them to backoff or active.
    pub fn move_all_unschedulable(&mut self) {
        let now = Instant::now();
        let keys: Vec<PodKey> = self
            .pods
            .iter_mut()
            .filter_map(|(k, e)| {
                if e.at == Where::InFlight {
                    e.moved_in_flight = true;
                }
                (e.at == Where::Unschedulable).then(|| k.clone())
            })
            .collect();
        for key in keys {
            if self.pods.get(&key).is_some_and(|e| e.backoff_until > now) {
                self.push_backoff(&key);
            } else {
                self.push_active(&key);
            }
        }
    }

    /// Pods parked as unschedulable, with their info (for nominated-node accounting).
    pub fn pending(&self) -> impl Iterator<Item = &Arc<PodInfo>> {
        self.pods.values().map(|e| &e.info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::tests::pod;
    use serde_json::json;

    fn info(name: &str, priority: i32) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(pod(name, json!({"spec": {"priority": priority}}))))
    }

    fn q() -> SchedulingQueue {
        SchedulingQueue::new(Duration::from_secs(1), Duration::from_secs(10))
    }

    #[tokio::test(start_paused = true)]
    async fn priority_then_fifo() {
        let mut q = q();
        q.add(info("low", 0));
        q.add(info("high", 100));
        q.add(info("low2", 0));
        assert_eq!(q.pop().unwrap().key, "default/high");
        assert_eq!(q.pop().unwrap().key, "default/low");
        assert_eq!(q.pop().unwrap().key, "default/low2");
        assert!(q.pop().is_err());
        // In flight: a re-add does not hand it out twice.
        q.add(info("low", 0));
        assert!(q.pop().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn unschedulable_waits_for_an_event_then_backs_off() {
        let mut q = q();
        q.add(info("a", 0));
        q.pop().unwrap();
        q.unschedulable("default/a");
        assert_eq!(q.pop().unwrap_err(), None, "parked without an event");
        q.move_all_unschedulable();
        // Still within the 1 s backoff of the first attempt.
        let until = q.pop().unwrap_err().expect("in backoff");
        assert_eq!(until - Instant::now(), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.pop().unwrap().key, "default/a");
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_to_the_maximum() {
        let mut q = q();
        q.add(info("a", 0));
        let mut waits = Vec::new();
        for _ in 0..6 {
            q.pop().unwrap();
            q.retry("default/a");
            let until = q.pop().unwrap_err().unwrap();
            waits.push((until - Instant::now()).as_secs());
            tokio::time::advance(until - Instant::now()).await;
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 10, 10]);
    }

    #[tokio::test(start_paused = true)]
    async fn event_during_attempt_retries() {
        let mut q = q();
        q.add(info("a", 0));
        q.pop().unwrap();
        q.move_all_unschedulable();
        q.unschedulable("default/a");
        assert!(q.pop().unwrap_err().is_some(), "in backoff, not parked");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(q.pop().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn spec_update_unparks_status_update_does_not() {
        let mut q = q();
        q.add(info("a", 0));
        q.pop().unwrap();
        q.unschedulable("default/a");
        tokio::time::advance(Duration::from_secs(2)).await;
        let mut same = pod("a", json!({"spec": {"priority": 0}}));
        same.status = Some(Default::default());
        q.add(Arc::new(PodInfo::new(same)));
        assert_eq!(q.pop().unwrap_err(), None);
        let changed = pod("a", json!({"spec": {"priority": 0, "nodeSelector": {"x": "y"}}}));
        q.add(Arc::new(PodInfo::new(changed)));
        assert!(q.pop().is_ok());
        q.remove("default/a");
        assert!(q.is_empty());
    }
}
