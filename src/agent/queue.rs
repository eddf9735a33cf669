//! A work queue keyed per Pod: one sync per key at a time, delayed
//! requeues, and exponential back-off per key after errors.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use kube::ResourceExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::crr::ContainerRecreateRequest;

/// kruise-daemon's back-off: 500 ms doubling up to 50 s.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(50);

/// The work key: one Pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub pod: String,
}

impl PodKey {
    /// The Pod a CRR is for.
    pub fn of(crr: &ContainerRecreateRequest) -> Self {
        Self {
            namespace: crr.namespace().unwrap_or_default(),
            pod: crr.spec.pod_name.clone(),
        }
    }
}

pub struct Queue<K> {
    state: Mutex<State<K>>,
    wake: Notify,
}

struct State<K> {
    due: HashMap<K, Instant>,
    running: HashSet<K>,
    /// Enqueued while running: run again right after.
    dirty: HashSet<K>,
    failures: HashMap<K, u32>,
}

/// What a sync asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Done,
    After(Duration),
    Failed,
}

impl Next {
    /// The more urgent of two: a failure, else the earlier time.
    pub fn sooner(self, other: Next) -> Next {
        match (self, other) {
            (Next::Failed, _) | (_, Next::Failed) => Next::Failed,
            (Next::After(a), Next::After(b)) => Next::After(a.min(b)),
            (Next::After(a), Next::Done) | (Next::Done, Next::After(a)) => Next::After(a),
            (Next::Done, Next::Done) => Next::Done,
        }
    }
}

/// How the first part of a pass over a Pod (the manager's) ended.
pub(crate) enum Step {
    /// Something was written: its watch event brings the Pod back.
    Wrote,
    /// Nothing to write; carry on with the daemon's part, and come back by then.
    Continue(Next),
}

impl<K: Clone + Eq + Hash> Default for Queue<K> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                due: HashMap::new(),
                running: HashSet::new(),
                dirty: HashSet::new(),
                failures: HashMap::new(),
            }),
            wake: Notify::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Queue<K> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `key` as soon as possible.
    pub fn add(&self, key: K) {
        self.add_at(key, Instant::now());
    }

    /// Runs `key` at `at`, or earlier if it is already due earlier.
    pub fn add_at(&self, key: K, at: Instant) {
        let mut state = self.state();
        if state.running.contains(&key) && at <= Instant::now() {
            state.dirty.insert(key);
            return;
        }
        let due = state.due.entry(key).or_insert(at);
        *due = (*due).min(at);
        drop(state);
        self.wake.notify_one();
    }

    /// Takes the keys that are due (and not running), marking them running;
    /// also returns when the next key falls due.
    pub fn take_due(&self) -> (Vec<K>, Option<Instant>) {
        let now = Instant::now();
        let mut state = self.state();
        let ready: Vec<K> = state
            .due
            .iter()
            .filter(|(key, at)| **at <= now && !state.running.contains(*key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &ready {
            state.due.remove(key);
            state.running.insert(key.clone());
        }
        let next = state
            .due
            .iter()
            .filter(|(key, _)| !state.running.contains(*key))
            .map(|(_, at)| *at)
            .min();
        (ready, next)
    }

    /// Records how the sync of `key` ended.
    pub fn done(&self, key: K, next: Next) {
        let mut state = self.state();
        state.running.remove(&key);
        let at = match next {
            Next::Failed => {
                let failures = state.failures.entry(key.clone()).or_insert(0);
                let delay = BACKOFF_BASE
                    .saturating_mul(1 << (*failures).min(16))
                    .min(BACKOFF_CAP);
                *failures += 1;
                Some(Instant::now() + delay)
            }
            Next::After(delay) => {
                state.failures.remove(&key);
                Some(Instant::now() + delay)
            }
            Next::Done => {
                state.failures.remove(&key);
                None
            }
        };
        let rerun = state.dirty.remove(&key);
        // A change seen while running wins over a back-off: it may fix it.
        let at = if rerun { Some(Instant::now()) } else { at };
        if let Some(at) = at {
            let due = state.due.entry(key).or_insert(at);
            *due = (*due).min(at);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Waits until something may be due.
    pub async fn wait(&self, next: Option<Instant>) {
        match next {
            Some(at) => {
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => self.wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_run_per_key_and_changes_while_running_rerun() {
        let queue = Queue::default();
        queue.add("pod-a");
        queue.add("pod-a");
        queue.add("pod-b");
        let (mut ready, _) = queue.take_due();
        ready.sort();
        assert_eq!(ready, ["pod-a", "pod-b"]);
        // While pod-a runs, a new event for it waits for the run to end.
        queue.add("pod-a");
        assert!(queue.take_due().0.is_empty());
        queue.done("pod-a", Next::Done);
        assert_eq!(queue.take_due().0, ["pod-a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_and_success_resets() {
        let queue = Queue::default();
        queue.add("k");
        for expected in [500, 1000, 2000, 4000] {
            let (ready, _) = queue.take_due();
            assert_eq!(ready, ["k"]);
            queue.done("k", Next::Failed);
            let (ready, next) = queue.take_due();
            assert!(ready.is_empty());
            assert_eq!(
                next.unwrap() - Instant::now(),
                Duration::from_millis(expected)
            );
            tokio::time::advance(Duration::from_millis(expected)).await;
        }
        let (ready, _) = queue.take_due();
        queue.done(ready[0], Next::After(Duration::from_secs(3)));
        let (_, next) = queue.take_due();
        assert_eq!(next.unwrap() - Instant::now(), Duration::from_secs(3));
    }

    #[test]
    fn sooner_prefers_failures_then_the_earlier_time() {
        let (one, two) = (Duration::from_secs(1), Duration::from_secs(2));
        assert_eq!(Next::After(two).sooner(Next::After(one)), Next::After(one));
        assert_eq!(Next::Done.sooner(Next::After(two)), Next::After(two));
        assert_eq!(Next::After(one).sooner(Next::Failed), Next::Failed);
        assert_eq!(Next::Done.sooner(Next::Done), Next::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn back_off_is_capped() {
        let queue = Queue::default();
        queue.add("k");
        for _ in 0..20 {
            tokio::time::advance(BACKOFF_CAP).await;
            let (ready, _) = queue.take_due();
            assert_eq!(ready, ["k"]);
            queue.done("k", Next::Failed);
        }
        let (_, next) = queue.take_due();
        assert_eq!(next.unwrap() - Instant::now(), BACKOFF_CAP);
    }
}
