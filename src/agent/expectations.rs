//! What the agent remembers of each CRR between passes: the
//! resourceVersion of its last write (kruise's expectations: a cached copy
//! older than that is not acted on), and when it first saw the CRR (for
//! the seen-to-stopped metric).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::ResourceExt;
use tokio::time::Instant;

use crate::crr::ContainerRecreateRequest;

/// How long a lagging cache may hold back a Pod's work (kruise's
/// `maxExpectationWaitDuration`).
pub(crate) const EXPECTATION_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Expectations {
    /// Per CRR uid: the resourceVersion of our last write and when.
    written: Mutex<HashMap<String, (u64, Instant)>>,
    /// When the agent first saw each CRR, for seen-to-stopped.
    sightings: Sightings,
}

impl Expectations {
    /// Our write of `written`: a cached copy older than it is not acted
    /// on, for up to `EXPECTATION_WAIT`.
    pub(crate) fn expect(&self, written: &ContainerRecreateRequest) {
        if let (Some(uid), Some(rv)) = (written.uid(), resource_version(written)) {
            if let Ok(mut expectations) = self.written.lock() {
                expectations.insert(uid, (rv, Instant::now()));
            }
        }
    }

    /// Notes a CRR's arrival (for seen-to-stopped).
    pub(crate) fn seen(&self, crr: &ContainerRecreateRequest) {
        self.sightings.note(crr);
    }

    /// When the agent first saw `crr`, while it is active (see `Sightings`).
    pub(crate) fn first_seen(&self, crr: &ContainerRecreateRequest) -> Option<Instant> {
        self.sightings.first(crr)
    }

    /// Drops what the agent remembers of a deleted or finished CRR.
    pub(crate) fn forget(&self, crr: &ContainerRecreateRequest) {
        if let (Some(uid), Ok(mut expectations)) = (crr.uid(), self.written.lock()) {
            expectations.remove(&uid);
        }
        self.sightings.forget(crr);
    }

    /// False while the cached copy is older than our last write to it.
    pub(crate) fn is_current(&self, crr: &ContainerRecreateRequest) -> bool {
        let (Some(uid), Ok(mut expectations)) = (crr.uid(), self.written.lock()) else {
            return true;
        };
        let Some((expected, since)) = expectations.get(&uid).copied() else {
            return true;
        };
        let caught_up = resource_version(crr).is_some_and(|rv| rv >= expected);
        if caught_up || since.elapsed() > EXPECTATION_WAIT {
            expectations.remove(&uid);
            return true;
        }
        false
    }

    /// A CRR completed: its time from first sight is counted.
    pub(crate) fn completed(&self, crr: &ContainerRecreateRequest) {
        self.sightings.forget(crr);
    }
}

fn resource_version(crr: &ContainerRecreateRequest) -> Option<u64> {
    crr.resource_version().and_then(|rv| rv.parse().ok())
}

/// When the agent first saw each active CRR (by uid).
#[derive(Default)]
struct Sightings(Mutex<HashMap<String, Instant>>);

impl Sightings {
    fn note(&self, crr: &ContainerRecreateRequest) {
        if let (Some(uid), Ok(mut seen)) = (crr.uid(), self.0.lock())
            && !crr.is_finished()
        {
            seen.entry(uid).or_insert_with(Instant::now);
        }
    }

    /// A pass that reads the CRR counts as a sight: the reflector writes its
    /// store before the watch's follower notes the event, so a pass woken by
    /// the Pod's own change can find the CRR in between (its kill went
    /// uncounted).
    fn first(&self, crr: &ContainerRecreateRequest) -> Option<Instant> {
        self.note(crr);
        self.0.lock().ok()?.get(&crr.uid()?).copied()
    }

    fn forget(&self, crr: &ContainerRecreateRequest) {
        if let (Some(uid), Ok(mut seen)) = (crr.uid(), self.0.lock()) {
            seen.remove(&uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn a_crr_a_pass_reads_first_counts_as_seen_then() {
        let crr = |uid: &str, status: Value| -> ContainerRecreateRequest {
            serde_json::from_value(json!({
                "metadata": {"name": "c", "uid": uid},
                "spec": {"podName": "p", "containers": [{"name": "app"}]},
                "status": status}))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let sightings = Sightings::default();
        let early = crr("a", json!({"phase": "Pending"}));
        sightings.note(&early);
        let first = sightings.first(&early);
        assert!(first.is_some());
        // Seen again later: still the first time.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(sightings.first(&early), first);
        // Read by a pass before its watch event was noted.
        assert!(
            sightings
                .first(&crr("b", json!({"phase": "Recreating"})))
                .is_some()
        );
        let done = json!({"phase": "Completed", "completionTime": "2026-12-04T00:00:00Z"});
        assert_eq!(sightings.first(&crr("c", done)), None);
        sightings.forget(&early);
        assert!(sightings.first(&early) > first);
    }
}
