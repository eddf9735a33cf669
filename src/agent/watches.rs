//! Feeding the watches into the per-Pod queue, and knowing when every
//! watch has listed once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use kube::runtime::watcher;
use tokio::sync::{Notify, watch};
use tracing::warn;

use super::backoff::WatchBackoff;
use super::queue::PodKey;
use crate::crr::ContainerRecreateRequest;
use crate::listing::Listing;

/// Turns true once every watch has synced once; and tells who asks when a
/// watch lists again.
pub(crate) struct SyncGate {
    waiting: Mutex<usize>,
    /// This set of watches has synced.
    local: watch::Sender<bool>,
    /// The agent is ready (it stays so across a restart of its watches).
    ready: Arc<watch::Sender<bool>>,
    relisted: Notify,
}

impl SyncGate {
    pub(crate) fn new(watches: usize, ready: Arc<watch::Sender<bool>>) -> Self {
        Self {
            waiting: Mutex::new(watches),
            local: watch::channel(false).0,
            ready,
            relisted: Notify::new(),
        }
    }

    /// Returns once every watch has synced once.
    pub(crate) async fn wait(&self) {
        let mut synced = self.local.subscribe();
        let _ = synced.wait_for(|synced| *synced).await;
    }

    /// Returns when a watch starts listing (again).
    pub(crate) async fn relisted(&self) {
        self.relisted.notified().await;
    }

    pub(crate) fn one_synced(&self) {
        if let Ok(mut waiting) = self.waiting.lock() {
            *waiting = waiting.saturating_sub(1);
            if *waiting == 0 {
                // send_replace: the value must change even while nobody waits
                // (send would drop it then, and a later wait would never end).
                self.local.send_replace(true);
                self.ready.send_replace(true);
            }
        }
    }
}

/// What the watches wake: the agent (`work`), as they see it.
pub(crate) trait Wakes: Send + Sync + 'static {
    /// Queue a Pod's work.
    fn wake(&self, key: PodKey);
    /// Queue the work of every Pod with an active CRR.
    fn wake_all(&self);
    /// A CRR arrived: its first sight starts its seen-to-stopped time.
    fn seen(&self, crr: &ContainerRecreateRequest);
    /// A CRR was deleted: drop what the agent remembers of it.
    fn forget(&self, crr: &ContainerRecreateRequest);
}

/// Something the agent watches: which Pod an object's change concerns.
pub(crate) trait Watched {
    fn pod_key(&self) -> Option<PodKey>;
    /// Note the object's arrival.
    fn seen(&self, _agent: &dyn Wakes) {}
    /// Drop what the agent remembers of a deleted object.
    fn forget(&self, _agent: &dyn Wakes) {}
}

impl Watched for ContainerRecreateRequest {
    fn pod_key(&self) -> Option<PodKey> {
        Some(PodKey::of(self))
    }

    fn seen(&self, agent: &dyn Wakes) {
        agent.seen(self);
    }

    fn forget(&self, agent: &dyn Wakes) {
        agent.forget(self);
    }
}

/// Feeds one watch into the queue. Every change, deletions and finished CRRs
/// included, wakes its Pod: kruise ignores those, which leaves the Pod's
/// next CRR Pending until something else touches it (#1626, #2474).
///
/// A listing (at start, and the relist after a 410) reaches the reflector's
/// store only whole, at `InitDone`: a sync started by an `InitApply` would
/// read the store from before. So the Pods of a listing are queued at its
/// `InitDone`, together with the Pods of the listing before (a CRR of theirs
/// may have gone meanwhile).
pub(crate) async fn follow<K, S>(
    events: S,
    what: &'static str,
    agent: Arc<dyn Wakes>,
    gate: Arc<SyncGate>,
) where
    K: Watched,
    S: futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    let mut backoff = WatchBackoff::default();
    let mut synced = false;
    // The Pods of the listing under way, and of the last one (and since).
    let mut listing = Listing::default();
    let mut listed = HashSet::new();
    while let Some(event) = events.next().await {
        if event.is_ok() {
            backoff.reset();
        }
        match event {
            Ok(watcher::Event::InitApply(obj)) => {
                obj.seen(&*agent);
                if let Some(key) = obj.pod_key() {
                    listing.add(key);
                }
            }
            Ok(watcher::Event::Apply(obj)) => {
                obj.seen(&*agent);
                if let Some(key) = obj.pod_key() {
                    listed.insert(key.clone());
                    agent.wake(key);
                }
            }
            Ok(watcher::Event::Delete(obj)) => {
                obj.forget(&*agent);
                if let Some(key) = obj.pod_key() {
                    agent.wake(key);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let fresh: HashSet<PodKey> = listing.done().into_iter().collect();
                for key in listed.drain().chain(fresh.iter().cloned()) {
                    agent.wake(key);
                }
                listed = fresh;
                if !synced {
                    synced = true;
                    gate.one_synced();
                }
            }
            Ok(watcher::Event::Init) => {
                listing.begin();
                // After a 410 the cluster may serve other versions (an
                // upgrade): whoever waits looks again.
                gate.relisted.notify_one();
            }
            // The watcher re-lists (410 Gone) or watches again once polled;
            // the reflector keeps the last state meanwhile.
            Err(error) => {
                let delay = backoff.after(&error);
                warn!(%error, what, ?delay, "watch failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
    warn!(what, "watch ended");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Every watch may list before the dispatcher first waits (seen as a
    /// start-up hang): the gate must remember it was opened.
    #[tokio::test]
    async fn the_gate_stays_open_for_who_waits_after_the_last_watch_synced() {
        let ready = Arc::new(watch::channel(false).0);
        let gate = SyncGate::new(2, Arc::clone(&ready));
        gate.one_synced();
        assert!(!*ready.borrow(), "one watch of two has synced");
        gate.one_synced();
        assert!(*ready.borrow());
        tokio::time::timeout(Duration::from_secs(1), gate.wait())
            .await
            .expect("wait returns once every watch has synced");
    }
}
