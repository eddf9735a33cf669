//! What every part of the agent works through: the API client with the
//! CRR status writes and their expectations, the runtime, the kill engine
//! and its records, the Event recorder and the metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::json;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::error::AgentError;
use super::restarts::KubeletSettings;
use crate::cri::RuntimeClient;
use crate::cri::v1::{
    Container, ContainerFilter, ContainerState, ContainerStatusRequest, ListContainersRequest,
    VersionRequest,
};
use crate::crr::client::{ApiVersion, CrrClient};
use crate::crr::lists::StatusList;
use crate::crr::state::{PodContainers, RuntimeContainer};
use crate::crr::{ContainerRecreateRequest, ContainerRecreateRequestStatus, Phase};
use crate::kill::{self, Killer};
use crate::metrics::{CrrOutcome, Metrics};
use crate::reason::Recreated;
use crate::records::Records;

/// How long a lagging cache may hold back a Pod's work (kruise's
/// `maxExpectationWaitDuration`).
pub(crate) const EXPECTATION_WAIT: Duration = Duration::from_secs(10);

/// How long to wait before each further try of an Event write that failed.
const EVENT_RETRIES: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// events.k8s.io refuses a note over 1 024 bytes and a reportingInstance
/// over 128 (an Event that breaks either is lost).
pub(crate) const NOTE_LIMIT: usize = 1024;
pub(crate) const INSTANCE_LIMIT: usize = 128;

/// kruise's message when a CRR outlives its `activeDeadlineSeconds`.
pub(crate) const DEADLINE_EXCEEDED: &str = "recreating has exceeded the activeDeadlineSeconds";

/// Why a CRR ends: its message, and how it counts in
/// `crr_proxy_crr_recreations_total`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    /// Every container is done; it counts as failed if one of them failed.
    Recreated,
    /// The Pod was deleted, or replaced by another of its name.
    PodGone,
    DeadlineExceeded,
    /// Refused or impossible, with kruise's message.
    Refused(String),
}

impl Completion {
    pub(crate) fn message(&self) -> &str {
        match self {
            Completion::Recreated => "",
            Completion::PodGone => "pod has gone",
            Completion::DeadlineExceeded => DEADLINE_EXCEEDED,
            Completion::Refused(message) => message,
        }
    }

    fn outcome(&self, crr: &ContainerRecreateRequest) -> CrrOutcome {
        match self {
            Completion::Recreated => {
                let failed = crr.status.as_ref().is_some_and(|s| {
                    s.container_recreate_states
                        .iter()
                        .any(|c| c.phase == Phase::Failed)
                });
                if failed {
                    CrrOutcome::Failed
                } else {
                    CrrOutcome::Succeeded
                }
            }
            Completion::PodGone => CrrOutcome::PodGone,
            Completion::DeadlineExceeded => CrrOutcome::DeadlineExceeded,
            Completion::Refused(_) => CrrOutcome::Refused,
        }
    }
}

/// What a kill keeps on the node's disk.
pub(crate) struct KillRecords {
    /// The containers stopped for CRRs (`reason`).
    pub(crate) recreated: Arc<Recreated>,
    /// Which container's kill began for which CRR (by uid), so that its
    /// preStop hook runs at most once across restarts and crashes.
    pub(crate) kills: Arc<Records>,
}

pub(crate) struct Context {
    pub(crate) client: kube::Client,
    /// The CRRs, in the version the cluster serves.
    pub(crate) crrs: CrrClient,
    cri: RuntimeClient,
    runtime_name: tokio::sync::OnceCell<String>,
    pub(crate) killer: Killer,
    pub(crate) records: KillRecords,
    recorder: Recorder,
    pub(crate) metrics: Arc<Metrics>,
    /// Per CRR uid: the resourceVersion of our last write and when.
    expectations: Mutex<HashMap<String, (u64, Instant)>>,
    /// When the agent first saw each CRR, for seen-to-stopped.
    sightings: Sightings,
    /// What kubelet makes of a stopped container.
    pub(crate) kubelet: KubeletSettings,
}

impl Context {
    pub(crate) fn new(
        client: kube::Client,
        version: ApiVersion,
        cri: RuntimeClient,
        killer: Killer,
        records: KillRecords,
        recorder: Recorder,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            crrs: CrrClient::new(client.clone(), version),
            client,
            cri,
            runtime_name: tokio::sync::OnceCell::new(),
            killer,
            records,
            recorder,
            metrics,
            expectations: Mutex::new(HashMap::new()),
            sightings: Sightings::default(),
            kubelet: KubeletSettings::default(),
        }
    }

    pub(crate) fn with_kubelet(mut self, kubelet: KubeletSettings) -> Self {
        self.kubelet = kubelet;
        self
    }

    // --- the runtime ---

    /// The runtime's name (`containerd`), as in containerIDs' prefix.
    pub(crate) async fn runtime_name(&self) -> Result<&str, AgentError> {
        let name = self
            .runtime_name
            .get_or_try_init(|| async {
                let mut cri = self.cri.clone();
                let version = bounded("Version", cri.version(VersionRequest::default())).await?;
                Ok::<_, AgentError>(version.into_inner().runtime_name)
            })
            .await?;
        Ok(name.as_str())
    }

    /// The newest container of each name of the Pod on this node (any
    /// state), read as kubelet's GetPodStatus reads them.
    pub(crate) async fn pod_containers(
        &self,
        pod_uid: &str,
        runtime: &str,
    ) -> Result<PodContainers, AgentError> {
        let mut cri = self.cri.clone();
        let request = ListContainersRequest {
            filter: Some(ContainerFilter {
                label_selector: HashMap::from([(
                    kill::keys::POD_UID.to_owned(),
                    pod_uid.to_owned(),
                )]),
                ..Default::default()
            }),
        };
        let listed = bounded("ListContainers", cri.list_containers(request))
            .await?
            .into_inner()
            .containers;
        // Only the newest container of each name is ever decided on; the
        // dead ones kubelet has not yet collected (one a minute, and none
        // while it backs off) need no status read. The reads go together.
        let mut newest: HashMap<&str, &Container> = HashMap::new();
        for container in &listed {
            let name = container
                .labels
                .get(kill::keys::CONTAINER_NAME)
                .map_or("", String::as_str);
            let entry = newest.entry(name).or_insert(container);
            if container.created_at > entry.created_at {
                *entry = container;
            }
        }
        let reads = newest.into_values().map(|container| {
            let mut cri = cri.clone();
            let request = ContainerStatusRequest {
                container_id: container.id.clone(),
                verbose: false,
            };
            async move {
                let status = bounded("ContainerStatus", cri.container_status(request))
                    .await?
                    .into_inner()
                    .status
                    .unwrap_or_default();
                let state = status.state();
                Ok::<_, AgentError>(RuntimeContainer {
                    id: format!("{runtime}://{}", status.id),
                    name: status
                        .labels
                        .get(kill::keys::CONTAINER_NAME)
                        .cloned()
                        .unwrap_or_default(),
                    restart_count: status
                        .annotations
                        .get(kill::keys::RESTART_COUNT)
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0),
                    state,
                    created_at: status.created_at,
                    started_at: (state != ContainerState::ContainerCreated)
                        .then_some(status.started_at),
                })
            }
        });
        let containers = futures_util::future::try_join_all(reads).await?;
        Ok(PodContainers::new(containers))
    }

    // --- Events ---

    /// Records an Event on `reference`; a write the API server refuses is
    /// tried again in the background, so that the caller goes on.
    pub(crate) async fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let note = truncated(note, NOTE_LIMIT, " ...");
        let event = || Event {
            type_,
            reason: reason.into(),
            note: Some(note.clone()),
            action: reason.into(),
            secondary: None,
        };
        let Err(error) = self.recorder.publish(&event(), reference).await else {
            return;
        };
        // kube's client retries 429 and 503 by itself; other failures (a 500
        // from an API server under load) are retried here, a few times as
        // client-go's broadcaster does.
        debug!(%error, reason, "could not record an Event; retrying");
        let (recorder, reference, event) = (self.recorder.clone(), reference.clone(), event());
        tokio::spawn(async move {
            let mut last = error;
            for delay in EVENT_RETRIES {
                tokio::time::sleep(delay).await;
                match recorder.publish(&event, &reference).await {
                    Ok(()) => return,
                    Err(error) => last = error,
                }
            }
            warn!(error = %last, reason = %event.reason, "could not record an Event");
        });
    }

    // --- status writes (§2.3.4) ---

    /// A full status update. On v1alpha1, from the cached object, as
    /// kruise v1.9 writes it: a conflict means the cache is behind, and the
    /// back-off retries with a fresher copy. On v1beta1, as master's daemon
    /// writes it: from a fresh read, up to four tries on conflict.
    ///
    /// The CRR as written; `None` when it is gone or another writer
    /// completed it.
    pub(crate) async fn set_phase(
        &self,
        crr: &ContainerRecreateRequest,
        phase: Phase,
    ) -> Result<Option<ContainerRecreateRequest>, AgentError> {
        debug!(crr = %crr.name_any(), ?phase, "setting phase");
        let set = |next: &mut ContainerRecreateRequest| {
            next.status
                .get_or_insert_with(ContainerRecreateRequestStatus::default)
                .phase = phase.clone();
        };
        let written = self.write_status(crr, set).await?;
        if let Some(written) = &written {
            self.expect(written);
        }
        Ok(written)
    }

    pub(crate) async fn complete(
        &self,
        crr: &ContainerRecreateRequest,
        why: Completion,
    ) -> Result<(), AgentError> {
        info!(crr = %crr.name_any(), message = why.message(), "completing");
        let at = Time(Timestamp::now());
        let written = self
            .write_status(crr, |next| mark_completed(next, &why, at.clone()))
            .await?;
        if let Some(written) = written {
            // The expectation stays until the cache shows the completion: a
            // sync that reads the copy from before leaves the CRR alone.
            self.expect(&written);
            self.completed(&written, &why);
        }
        Ok(())
    }

    /// PUTs `crr`'s status as `change` makes it; `None` when there was
    /// nothing to write: the CRR is gone, or (on a fresh read) another
    /// writer completed it first, which is never overwritten.
    async fn write_status(
        &self,
        crr: &ContainerRecreateRequest,
        change: impl Fn(&mut ContainerRecreateRequest),
    ) -> Result<Option<ContainerRecreateRequest>, AgentError> {
        if self.crrs.version() == ApiVersion::V1alpha1 {
            let mut next = crr.clone();
            change(&mut next);
            return Ok(Some(self.crrs.replace_status(&next).await?));
        }
        let (namespace, name) = (crr.namespace().unwrap_or_default(), crr.name_any());
        let mut tries = 0;
        loop {
            let Some(mut fresh) = self.crrs.get(&namespace, &name).await? else {
                return Ok(None);
            };
            if fresh.is_finished() {
                debug!(crr = %name, "already completed by another writer");
                self.expect(&fresh);
                return Ok(None);
            }
            change(&mut fresh);
            match self.crrs.replace_status(&fresh).await {
                Ok(written) => return Ok(Some(written)),
                Err(kube::Error::Api(status)) if status.code == 409 && tries < 3 => {
                    tries += 1;
                    after_conflict(tries).await;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Counts a completion written by `complete` (here or elsewhere).
    pub(crate) fn completed(&self, written: &ContainerRecreateRequest, why: &Completion) {
        self.metrics.crr_completed(why.outcome(written));
        self.sightings.forget(written);
    }

    /// Writes one list of `crr`'s status as `decide` makes it from a copy
    /// of the CRR (`None`: nothing to write), conditional on that copy's
    /// resourceVersion (see `crr::lists`); after a conflict, `decide` runs
    /// again on a fresh read, so that nothing another writer put there is
    /// written over unseen.
    ///
    /// The CRR as the list now stands in it: as written, or as last read
    /// when there was nothing (left) to write; `None` when it is gone.
    pub(crate) async fn write_list<T: serde::Serialize>(
        &self,
        crr: &ContainerRecreateRequest,
        list: &StatusList<T>,
        decide: impl Fn(&[T]) -> Option<Vec<T>>,
    ) -> Result<Option<ContainerRecreateRequest>, AgentError> {
        let empty = ContainerRecreateRequestStatus::default();
        let (namespace, name) = (crr.namespace().unwrap_or_default(), crr.name_any());
        let mut read = crr.clone();
        let mut tries = 0;
        loop {
            let Some(next) = decide((list.get)(read.status.as_ref().unwrap_or(&empty))) else {
                debug!(crr = %name, list = list.field, "nothing (left) to write");
                self.expect(&read);
                return Ok(Some(read));
            };
            let patch = json!({
                "metadata": {"resourceVersion": read.resource_version()},
                "status": {list.field: next},
            });
            match self.crrs.patch_status(&read, &patch).await {
                Ok(written) => {
                    self.expect(&written);
                    return Ok(Some(written));
                }
                Err(kube::Error::Api(status)) if status.code == 409 && tries < 3 => {
                    tries += 1;
                    after_conflict(tries).await;
                }
                Err(error) => return Err(error.into()),
            }
            // A list still goes to a CRR completed meanwhile: it records
            // what happened (a kill that finished after the deadline), and
            // touches no phase.
            match self.crrs.get(&namespace, &name).await? {
                Some(fresh) => read = fresh,
                None => return Ok(None),
            }
        }
    }

    // --- resourceVersion expectations, and first sight ---

    fn expect(&self, written: &ContainerRecreateRequest) {
        if let (Some(uid), Some(rv)) = (written.uid(), resource_version(written)) {
            if let Ok(mut expectations) = self.expectations.lock() {
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
        if let (Some(uid), Ok(mut expectations)) = (crr.uid(), self.expectations.lock()) {
            expectations.remove(&uid);
        }
        self.sightings.forget(crr);
    }

    /// False while the cached copy is older than our last write to it.
    pub(crate) fn is_current(&self, crr: &ContainerRecreateRequest) -> bool {
        let (Some(uid), Ok(mut expectations)) = (crr.uid(), self.expectations.lock()) else {
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
}

/// A CRR's completion as kruise writes it: phase, completionTime, message.
pub(crate) fn mark_completed(crr: &mut ContainerRecreateRequest, why: &Completion, at: Time) {
    let status = crr
        .status
        .get_or_insert_with(ContainerRecreateRequestStatus::default);
    status.phase = Phase::Completed;
    status.completion_time = Some(at);
    status.message = why.message().to_owned();
}

/// How long the agent waits for a CRI read; a call that takes longer fails
/// the sync, which is retried with its back-off, instead of holding the
/// Pod's work (and, for Version, every Pod's) for good.
const CRI_TIMEOUT: Duration = Duration::from_secs(10);

/// `call`'s answer within [`CRI_TIMEOUT`].
async fn bounded<T>(
    call: &'static str,
    answer: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, AgentError> {
    match tokio::time::timeout(CRI_TIMEOUT, answer).await {
        Ok(answer) => answer.map_err(|status| AgentError::Runtime { call, status }),
        Err(_) => Err(AgentError::Runtime {
            call,
            status: tonic::Status::deadline_exceeded(format!("no answer in {CRI_TIMEOUT:?}")),
        }),
    }
}

fn resource_version(crr: &ContainerRecreateRequest) -> Option<u64> {
    crr.resource_version().and_then(|rv| rv.parse().ok())
}

/// `text` cut to at most `limit` bytes, ending in `suffix` when cut, as the
/// scheduler cuts its Event notes (here on a character boundary).
pub(crate) fn truncated(mut text: String, limit: usize, suffix: &str) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit.saturating_sub(suffix.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(suffix);
    text
}

/// The wait before try `tries` after a conflict: client-go's
/// retry.DefaultBackoff (10 ms, ×5; its 0.1 jitter left out).
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

async fn after_conflict(tries: u32) {
    tokio::time::sleep(Duration::from_millis(
        10 * 5u64.pow(tries.saturating_sub(1)),
    ))
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

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

    #[test]
    fn event_notes_and_instances_are_cut_to_what_the_api_server_takes() {
        let long = "é".repeat(700);
        let note = truncated(long.clone(), NOTE_LIMIT, " ...");
        assert!(
            note.len() <= NOTE_LIMIT && note.ends_with(" ..."),
            "{}",
            note.len()
        );
        assert!(long.starts_with(note.trim_end_matches(" ...")));
        assert_eq!(truncated("short".into(), NOTE_LIMIT, " ..."), "short");
        let node = truncated("n".repeat(253), INSTANCE_LIMIT, "");
        assert_eq!(node.len(), INSTANCE_LIMIT);
    }

    #[test]
    fn completions_say_kruises_messages_and_count_by_kind() {
        let crr = |phase: Phase| -> ContainerRecreateRequest {
            serde_json::from_value(json!({
                "metadata": {"name": "c"},
                "spec": {"podName": "p", "containers": [{"name": "app"}]},
                "status": {"phase": "Recreating", "containerRecreateStates": [{"name": "app", "phase": phase}]}}))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let cases = [
            (
                Completion::Recreated,
                Phase::Succeeded,
                "",
                CrrOutcome::Succeeded,
            ),
            (Completion::Recreated, Phase::Failed, "", CrrOutcome::Failed),
            (
                Completion::PodGone,
                Phase::Recreating,
                "pod has gone",
                CrrOutcome::PodGone,
            ),
            (
                Completion::DeadlineExceeded,
                Phase::Recreating,
                DEADLINE_EXCEEDED,
                CrrOutcome::DeadlineExceeded,
            ),
            (
                Completion::Refused("can not recreate app multi times".into()),
                Phase::Pending,
                "can not recreate app multi times",
                CrrOutcome::Refused,
            ),
        ];
        for (why, phase, message, outcome) in cases {
            assert_eq!(why.message(), message);
            assert_eq!(why.outcome(&crr(phase)), outcome, "{why:?}");
        }
    }
}
