//! What every part of the agent works through, one part per job: the CRR
//! status writes (here) with the expectations they set (`expectations`),
//! the runtime's reads (`runtime`), the Events (`events`), the kill engine
//! and its records, and the metrics.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::json;
use tracing::{debug, info};

use super::error::AgentError;
use super::events::Events;
use super::expectations::Expectations;
use super::restarts::KubeletSettings;
use super::runtime::Runtime;
use crate::crr::client::{ApiVersion, CrrClient};
use crate::crr::lists::StatusList;
use crate::crr::{ContainerRecreateRequest, ContainerRecreateRequestStatus, Phase};
use crate::kill::Killer;
use crate::metrics::{CrrOutcome, Metrics};
use crate::reason::Recreated;
use crate::records::Records;

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
    /// The API client, for the Pods (and the Events and CRRs below).
    pub(crate) client: kube::Client,
    /// The CRRs, in the version the cluster serves; the status writes.
    pub(crate) crrs: CrrClient,
    /// What the agent remembers of each CRR between passes.
    pub(crate) expectations: Expectations,
    pub(crate) runtime: Runtime,
    pub(crate) events: Events,
    /// The kill engine, its records, and what kubelet makes of a stopped
    /// container.
    pub(crate) killer: Killer,
    pub(crate) records: KillRecords,
    pub(crate) kubelet: KubeletSettings,
    pub(crate) metrics: Arc<Metrics>,
}

impl Context {
    // The status writes (§2.3.4).

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
            self.expectations.expect(written);
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
            self.expectations.expect(&written);
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
                self.expectations.expect(&fresh);
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
        self.expectations.completed(written);
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
                self.expectations.expect(&read);
                return Ok(Some(read));
            };
            let patch = json!({
                "metadata": {"resourceVersion": read.resource_version()},
                "status": {list.field: next},
            });
            match self.crrs.patch_status(&read, &patch).await {
                Ok(written) => {
                    self.expectations.expect(&written);
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

/// The wait before try `tries` after a conflict: client-go's
/// retry.DefaultBackoff (10 ms, ×5; its 0.1 jitter left out).
async fn after_conflict(tries: u32) {
    tokio::time::sleep(Duration::from_millis(
        10 * 5u64.pow(tries.saturating_sub(1)),
    ))
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

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
