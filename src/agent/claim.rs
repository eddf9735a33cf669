//! The Lease holder's duty in standalone mode: every new CRR (no node
//! label yet) is claimed for the node that runs its Pod, or, when no node
//! can take it, ended with the message kruise's webhook would have refused
//! it with. Only the holder watches these CRRs, so each new CRR costs the
//! API server the same whatever the number of nodes.
//!
//! A claim is a merge patch of the node label conditional on the CRR's
//! resourceVersion, and deploy/base/node-policy.yaml lets only the current
//! holder make it: a CRR is never claimed twice, nor by a node that lost
//! the Lease. The node the CRR is claimed for accepts it (the rest of the
//! webhook's checks, which need its runtime) as before.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{debug, info, warn};

use super::backoff::WatchBackoff;
use super::context::{self, Completion};
use super::error::AgentError;
use super::events;
use super::lease::Leadership;
use super::queue::{Next, Queue};
use crate::crr::client::CrrClient;
use crate::crr::{ContainerRecreateRequest, Phase, UNANSWERED, admission, labels};
use crate::listing::Listing;
use crate::metrics::Metrics;
use crate::telemetry::Chain;

/// Claims in flight at once: each is a Pod GET and one write.
const CONCURRENCY: usize = 16;

type Key = ObjectRef<ContainerRecreateRequest>;

/// The CRRs the API server refused a write to as invalid (422), by uid,
/// with the resourceVersion refused. Every write to such a CRR is refused
/// alike until it changes, so a relist judges it again only once it has:
/// one write and one Event per version, not one per relist.
#[derive(Default)]
struct Unwritable(Mutex<HashMap<String, String>>);

impl Unwritable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn holds(&self, crr: &ContainerRecreateRequest) -> bool {
        let (uid, version) = stamp(crr);
        self.lock().get(&uid) == Some(&version)
    }

    fn note(&self, crr: &ContainerRecreateRequest) {
        let (uid, version) = stamp(crr);
        self.lock().insert(uid, version);
    }

    fn forget(&self, crr: &ContainerRecreateRequest) {
        self.lock().remove(&stamp(crr).0);
    }
}

fn stamp(crr: &ContainerRecreateRequest) -> (String, String) {
    (
        crr.uid().unwrap_or_default(),
        crr.resource_version().unwrap_or_default(),
    )
}

pub(crate) struct Claimer {
    pub(crate) client: kube::Client,
    pub(crate) crrs: CrrClient,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) leadership: Leadership,
    /// How long one CRR's judgement may take (the Lease's renew period): a
    /// claim that cannot land while the Lease is surely held is abandoned
    /// and tried again, by whoever holds it then.
    pub(crate) timeout: Duration,
    /// How long a claimed CRR may go unanswered by its node.
    pub(crate) unanswered: Duration,
    /// For the Events on CRRs the API server refuses to let it write.
    pub(crate) recorder: Recorder,
}

impl Claimer {
    /// Claims while this node holds the Lease, for as long as it runs.
    pub(crate) async fn run(mut self) {
        loop {
            self.leadership.gained().await;
            info!("holding the standalone Lease: claiming new CRRs for the nodes of their Pods");
            let mut leadership = self.leadership.clone();
            tokio::select! {
                // The watch ended (it should not): start over.
                () = self.claim() => {}
                () = leadership.lost() => {
                    info!("no longer holding the standalone Lease: leaving new CRRs to its holder");
                }
            }
        }
    }

    /// Watches the unclaimed CRRs and judges each as it comes.
    async fn claim(&self) {
        let (store, writer) = reflector::store();
        let mut events = self
            .crrs
            .watch(watcher::Config::default().labels(&format!("!{}", labels::NODE_NAME)))
            .reflect(writer)
            .boxed();
        let queue: Queue<Key> = Queue::default();
        let unwritable = Unwritable::default();
        // The claims awaiting their node's answer, by when it is due; a new
        // holder takes up those of its predecessor.
        let answers: Queue<Key> = Queue::default();
        let taken_over = async {
            let claimed = format!("{},!{}", labels::NODE_NAME, labels::ACTIVE);
            match self.crrs.list(&claimed).await {
                Ok(crrs) => {
                    for crr in crrs.iter().filter(|c| awaits_answer(c)) {
                        answers.add_at(ObjectRef::from_obj(crr), self.answer_due());
                    }
                }
                Err(error) => {
                    warn!(error = %Chain(&error), "cannot list the claims awaiting their node; only this holder's own are watched");
                }
            }
        };
        let feed = async {
            let mut backoff = WatchBackoff::default();
            // The store shows a (re)list only once it is done.
            let mut listing = Listing::default();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(crr)) => {
                        backoff.reset();
                        queue.add(ObjectRef::from_obj(&crr));
                    }
                    Ok(watcher::Event::Init) => {
                        backoff.reset();
                        listing.begin();
                    }
                    Ok(watcher::Event::InitApply(crr)) => listing.add(ObjectRef::from_obj(&crr)),
                    Ok(watcher::Event::InitDone) => {
                        backoff.reset();
                        for key in listing.done() {
                            queue.add(key);
                        }
                    }
                    Ok(watcher::Event::Delete(crr)) => {
                        backoff.reset();
                        unwritable.forget(&crr);
                    }
                    Err(error) => {
                        let delay = backoff.after(&error);
                        warn!(%error, ?delay, "watch of new CRRs failed; retrying");
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        };
        let (store, answers, unwritable) = (&store, &answers, &unwritable);
        let work = self.drain(&queue, "place a new CRR", |key| async move {
            match store.get(&key) {
                Some(crr) => self.judge(&crr, answers, unwritable).await,
                None => Ok(Next::Done),
            }
        });
        let answering = async {
            taken_over.await;
            self.drain(answers, "check a claim's answer", |key| async move {
                self.end_unanswered(&key).await
            })
            .await;
        };
        tokio::select! {
            () = feed => warn!("watch of new CRRs ended"),
            () = work => {}
            () = answering => {}
        }
    }

    /// Works through `queue` for as long as it runs: up to [`CONCURRENCY`]
    /// due keys at once, each run while this node holds the Lease and
    /// bounded by the renew period, each key then done as its run says.
    async fn drain<F, R>(&self, queue: &Queue<Key>, what: &str, run: F)
    where
        F: Fn(Key) -> R,
        R: Future<Output = Result<Next, AgentError>>,
    {
        loop {
            let (ready, next) = queue.take_due();
            futures_util::stream::iter(ready)
                .for_each_concurrent(CONCURRENCY, |key| async {
                    let next = if self.leadership.holds() {
                        tokio::time::timeout(self.timeout, run(key.clone())).await
                    } else {
                        Ok(Ok(Next::Done))
                    };
                    let next = match next {
                        Ok(Ok(next)) => next,
                        Ok(Err(error)) => {
                            warn!(error = %Chain(&error), crr = %key.name, "could not {what}; backing off");
                            Next::Failed
                        }
                        Err(_) => {
                            warn!(crr = %key.name, timeout = ?self.timeout, "the API server did not answer in time (to {what}); backing off");
                            Next::Failed
                        }
                    };
                    queue.done(key, next);
                })
                .await;
            queue.wait(next).await;
        }
    }

    /// When a CRR claimed (or found waiting) now is due to have been taken
    /// up by its node. kruise-manager counts from the CRR's creation, which
    /// its webhook labels at once; here the claim is a step of its own, and
    /// a CRR created while the API server was away is claimed only once it
    /// is back, when its node (cut off too) has had no time yet. Counted
    /// from the claim, an outage only delays such a CRR. A holder that takes
    /// over cannot know when its predecessor claimed, and counts from then.
    fn answer_due(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.unanswered
    }

    /// Ends a claimed CRR its node has not taken up in time, from a fresh
    /// read: a node that answered meanwhile (a phase set) keeps it.
    async fn end_unanswered(&self, key: &Key) -> Result<Next, AgentError> {
        let namespace = key.namespace.clone().unwrap_or_default();
        let Some(crr) = self.crrs.get(&namespace, &key.name).await? else {
            return Ok(Next::Done);
        };
        if !awaits_answer(&crr) {
            return Ok(Next::Done);
        }
        let node = crr
            .labels()
            .get(labels::NODE_NAME)
            .cloned()
            .unwrap_or_default();
        let mut ended = crr.clone();
        let why = Completion::Refused(UNANSWERED.into());
        context::mark_completed(&mut ended, &why, Time(Timestamp::now()));
        match self.crrs.replace_status(&ended).await {
            Ok(_) => {
                warn!(crr = %key.name, %namespace, %node, "ended: its node did not take it up in time");
                self.metrics.crr_unanswered();
                Ok(Next::Done)
            }
            // Changed since the read (its node answered, perhaps): again.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Next::After(Duration::ZERO)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Next::Done),
            Err(error) => Err(error.into()),
        }
    }

    /// Claims `crr` for its Pod's node, or ends it when there is none; a
    /// finished one (ended here before) is deleted after its TTL.
    async fn judge(
        &self,
        crr: &ContainerRecreateRequest,
        answers: &Queue<Key>,
        unwritable: &Unwritable,
    ) -> Result<Next, AgentError> {
        if crr.is_finished() {
            return self.expire(crr).await;
        }
        if unwritable.holds(crr) {
            debug!(crr = %crr.name_any(), "refused as invalid before, and unchanged since");
            return Ok(Next::Done);
        }
        let namespace = crr.namespace().unwrap_or_default();
        // No name, no Pod to read (the spec's own check says so first).
        let pod = match crr.spec.pod_name.as_str() {
            "" => None,
            name => {
                Api::<Pod>::namespaced(self.client.clone(), &namespace)
                    .get_opt(name)
                    .await?
            }
        };
        let placement = admission::placement(crr, pod.as_ref());
        let refusal = placement.as_ref().err().cloned();
        let written = match placement {
            Ok(node) => {
                let patch = json!({"metadata": {
                    "labels": {labels::NODE_NAME: node},
                    "resourceVersion": crr.resource_version(),
                }});
                let claimed = self.crrs.patch(crr, &patch).await;
                if claimed.is_ok() {
                    info!(crr = %crr.name_any(), %namespace, %node, "claimed for its Pod's node");
                    self.metrics.crr_claimed();
                    answers.add_at(ObjectRef::from_obj(crr), self.answer_due());
                }
                claimed.map(drop)
            }
            Err(message) => {
                let mut ended = crr.clone();
                let why = Completion::Refused(message);
                context::mark_completed(&mut ended, &why, Time(Timestamp::now()));
                let done = self.crrs.replace_status(&ended).await;
                if done.is_ok() {
                    info!(crr = %crr.name_any(), %namespace, message = why.message(), "ended: no node can take it");
                    self.metrics.crr_unclaimable();
                }
                done.map(drop)
            }
        };
        match written {
            Ok(()) => Ok(Next::Done),
            // Changed since this copy, or gone: a newer copy (if any) comes
            // on the watch and is judged then.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                debug!(crr = %crr.name_any(), code = status.code, "changed meanwhile");
                Ok(Next::Done)
            }
            // The stored object is invalid in this version's schema (stored
            // under an older, laxer CRD, on an API server without validation
            // ratcheting): every write to it is refused alike, so none is
            // tried again, nor after a relist until it changes. The CRR
            // says why in an Event.
            Err(kube::Error::Api(status)) if status.code == 422 => {
                unwritable.note(crr);
                let why = refusal.unwrap_or_else(|| "its node cannot be told".into());
                let note = format!(
                    "not placed: {why}; the API server refuses every write to this ContainerRecreateRequest: {}",
                    status.message
                );
                warn!(crr = %crr.name_any(), %namespace, %note, "a CRR that cannot be written is left as it is");
                self.metrics.crr_unclaimable();
                let event = Event {
                    type_: EventType::Warning,
                    reason: "Unwritable".into(),
                    note: Some(events::truncated(note, events::NOTE_LIMIT, " ...")),
                    action: "Claim".into(),
                    secondary: None,
                };
                let reference = ObjectReference {
                    api_version: Some(self.crrs.version().api_resource().api_version),
                    kind: Some(crate::crr::KIND.into()),
                    namespace: crr.namespace(),
                    name: Some(crr.name_any()),
                    uid: crr.uid(),
                    ..Default::default()
                };
                if let Err(error) = self.recorder.publish(&event, &reference).await {
                    warn!(%error, "could not record an Event");
                }
                Ok(Next::Done)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Deletes a CRR ended here once its `ttlSecondsAfterFinished` passed.
    async fn expire(&self, crr: &ContainerRecreateRequest) -> Result<Next, AgentError> {
        let Some(left) = crr.ttl_left(k8s_openapi::jiff::Timestamp::now().as_second()) else {
            return Ok(Next::Done);
        };
        if crr.metadata.deletion_timestamp.is_some() {
            return Ok(Next::Done);
        }
        if left > 0 {
            return Ok(Next::After(Duration::from_secs(left.unsigned_abs())));
        }
        info!(crr = %crr.name_any(), "deleting after ttlSecondsAfterFinished");
        match self.crrs.delete(crr).await {
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Next::Done),
            done => done.map(|()| Next::Done).map_err(Into::into),
        }
    }
}

/// A claimed CRR its node has not taken up yet (kruise-manager's rule: no
/// phase, and not finished).
fn awaits_answer(crr: &ContainerRecreateRequest) -> bool {
    !crr.is_finished() && crr.phase() == Phase::New
}
