//! kruise-daemon's part for one Pod (crr-semantics.md §2.3): pick the CRR
//! to work on, move it to Recreating, wait out the unready grace, publish
//! the per-container states, kill one container per pass, complete. The
//! decisions are `crr::state`'s; this is their I/O.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use super::context::{Completion, Context};
use super::error::AgentError;
use super::expectations::EXPECTATION_WAIT;
use super::kill_order::{self, KillOrder};
use super::manager::Manager;
use super::queue::Next;
use super::queue::PodKey;
use super::restarts;
use crate::crr::lists;
use crate::crr::state::{self, Candidate, NotKilled, PassEnd};
use crate::crr::{ContainerRecreateRequest, ContainerRecreateState, Phase, labels};
use crate::kill::{HookResult, KillError, OnStopping};
use crate::telemetry::Chain;

/// Why a container of a CRR could not be killed; its text goes into the
/// container's state, after kruise's `kill container error: `.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KillFailure {
    #[error("no runtime container for {0}")]
    NoContainer(String),
    /// The kill engine's error, the runtime's container ID replaced by the
    /// container's name (its text is the whole message: no source).
    #[error("{}", .error.to_string().replace(.id.as_str(), .name.as_str()))]
    Kill {
        id: String,
        name: String,
        error: KillError,
    },
}

/// The daemon's view: the CRRs of this node, and who does the manager's part.
pub(crate) struct Daemon<'a> {
    pub(crate) ctx: &'a Context,
    pub(crate) manager: &'a Manager,
    pub(crate) store: &'a Store<ContainerRecreateRequest>,
}

impl Daemon<'_> {
    /// kruise-daemon's `sync` for one Pod.
    pub(crate) async fn sync(&self, key: &PodKey) -> Result<Next, AgentError> {
        let crrs: Vec<Arc<ContainerRecreateRequest>> = self
            .store
            .state()
            .into_iter()
            .filter(|c| PodKey::of(c) == *key)
            .collect();
        if crrs.is_empty() {
            return Ok(Next::Done);
        }
        let candidates: Vec<Candidate> = crrs
            .iter()
            .map(|c| Candidate {
                name: c.name_any(),
                phase: c.phase(),
                created: c
                    .meta()
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_second()),
                finished: c.is_finished(),
            })
            .collect();
        for crr in crrs.iter().filter(|c| c.is_finished()) {
            self.ctx.expectations.forget(crr);
        }
        let by_name = |name: &str| crrs.iter().find(|c| c.name_any() == name);
        let picked = state::pick(&candidates, |name| {
            by_name(name).is_none_or(|c| self.ctx.expectations.is_current(c))
        });
        for name in &picked.set_pending {
            if let Some(crr) = by_name(name) {
                self.ctx.set_phase(crr, Phase::Pending).await?;
            }
        }
        let Some(crr) = picked.picked.as_deref().and_then(by_name) else {
            // Held back by a lagging cache: its watch event brings us back;
            // if it never comes, the expectation lapses.
            return Ok(Next::After(EXPECTATION_WAIT));
        };
        let span = info_span!(
            "crr",
            namespace = %crr.namespace().unwrap_or_default(),
            crr = %crr.name_any(),
            pod = %crr.spec.pod_name,
        );
        self.work_on(crr).instrument(span).await
    }

    /// The picked CRR: Recreating, the unready grace, then steps A to I.
    ///
    /// Each of the pass's own writes answers with the CRR as written, and
    /// the pass goes on from that answer instead of waiting for the watch
    /// to bring it back (a round trip per write, the most of a CRR's time
    /// to its kill). The expectation each write leaves still holds back a
    /// later pass that reads an older copy from a lagging cache.
    async fn work_on(&self, crr: &ContainerRecreateRequest) -> Result<Next, AgentError> {
        let crr = if crr.phase() == Phase::Recreating {
            Cow::Borrowed(crr)
        } else {
            match self.ctx.set_phase(crr, Phase::Recreating).await? {
                Some(written) => Cow::Owned(written),
                None => return Ok(Next::Done),
            }
        };
        let crr = crr.as_ref();
        if let Some(grace) = crr
            .spec
            .strategy
            .as_ref()
            .and_then(|s| s.unready_grace_period_seconds)
        {
            let acquired = match crr.unready_since() {
                Some(Ok(at)) => at,
                // Not yet: the manager's write brings the CRR back.
                None => {
                    self.manager.make_unready(self.ctx, crr).await?;
                    return Ok(Next::Done);
                }
                Some(Err(message)) => {
                    self.ctx.complete(crr, Completion::Refused(message)).await?;
                    return Ok(Next::Done);
                }
            };
            let waited = Timestamp::now().as_millisecond() - acquired.as_millisecond();
            let left = grace.saturating_mul(1000).saturating_sub(waited);
            if left > 0 {
                let left = Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
                return Ok(Next::After(left + Duration::from_millis(100)));
            }
        }
        self.recreate(crr).await
    }

    /// Steps A to I for the picked CRR.
    async fn recreate(&self, crr: &ContainerRecreateRequest) -> Result<Next, AgentError> {
        let runtime = self.ctx.runtime.name().await?;
        if let Err(reason) = check_runtime(crr, runtime) {
            let message = format!("failed to find runtime service: {reason}");
            self.ctx.complete(crr, Completion::Refused(message)).await?;
            return Ok(Next::Done);
        }
        let pod_uid = crr
            .labels()
            .get(labels::POD_UID)
            .cloned()
            .unwrap_or_default();
        let containers = self.ctx.runtime.pod_containers(&pod_uid, runtime).await?;
        // With `pass begins` and `read the Pod`, splits a pass's time.
        debug!("read the runtime's containers");
        let sync = self.manager.container_statuses(crr);
        let now = now_nanos();
        let mut crr = Cow::Borrowed(crr);
        let mut previous = recreate_states(&crr);
        let mut states = state::current_states(&crr.spec, &previous, &containers, &sync, now);
        if states != previous {
            // Publish the states before any kill; decided again from what
            // another writer made of them, should one have come between.
            let decide = |previous: &[_]| {
                let states = state::current_states(&crr.spec, previous, &containers, &sync, now);
                (states != previous).then_some(states)
            };
            let Some(written) = self.ctx.write_list(&crr, &lists::STATES, decide).await? else {
                return Ok(Next::Done);
            };
            crr = Cow::Owned(written);
            previous = recreate_states(&crr);
            states = state::current_states(&crr.spec, &previous, &containers, &sync, now);
            if states != previous {
                // Not what this pass decided: another writer's answer came
                // between, and the next pass decides from it.
                return Ok(Next::Done);
            }
        }
        let crr = crr.as_ref();
        let strategy = crr.spec.strategy.clone().unwrap_or_default();
        let end = state::kill_pass(&states, &strategy, &containers, |name| {
            self.kill(crr, containers.newest(&name).map(|c| c.id.clone()), name)
        })
        .await;
        Ok(match end {
            PassEnd::Patch(states) => {
                // What this pass did (its kills) carried onto whatever
                // another writer made of the other entries.
                let decide = |theirs: &[_]| {
                    let next = lists::rebase(&previous, &states, theirs, lists::STATES.key);
                    (next != theirs).then_some(next)
                };
                self.ctx.write_list(crr, &lists::STATES, decide).await?;
                Next::Done
            }
            PassEnd::Complete => {
                self.ctx.complete(crr, Completion::Recreated).await?;
                Next::Done
            }
            PassEnd::Requeue(after) => Next::After(after),
            PassEnd::Wait => Next::Done,
        })
    }

    /// Kills one container of `crr` (synchronously: preStop, then stop):
    /// the request and the Events are `kill_order`'s; this is their I/O.
    fn kill(
        &self,
        crr: &ContainerRecreateRequest,
        runtime_id: Option<String>,
        name: String,
    ) -> impl Future<Output = Result<(), NotKilled<KillFailure>>> + use<'_> {
        let (ctx, manager) = (self.ctx, self.manager);
        let pod_key = PodKey::of(crr);
        let crr_key = format!("{}/{}", crr.namespace().unwrap_or_default(), crr.name_any());
        let crr_uid = crr.uid();
        let seen = ctx.expectations.first_seen(crr);
        let crr = crr.clone();
        async move {
            let id = runtime_id
                .as_deref()
                .and_then(kill_order::runtime_id)
                .map(str::to_owned)
                .ok_or_else(|| NotKilled::Failed(KillFailure::NoContainer(name.clone())))?;
            // Only a container kubelet will start again is stopped; where
            // only some exit codes restart it, the proxy reports one.
            let pod = manager.pod_spec(ctx, &pod_key).await;
            let rewrite =
                restarts::decide(&ctx.kubelet, pod.as_ref(), &name).map_err(NotKilled::Refused)?;
            // A kill that began before a restart (its hook perhaps cut short)
            // goes straight to StopContainer: the hook runs at most once.
            let kills = &ctx.records.kills;
            let resumed = crr_uid
                .as_deref()
                .is_some_and(|uid| kills.get(&id).as_deref() == Some(uid));
            if let (false, Some(uid)) = (resumed, crr_uid.as_deref()) {
                if let Err(error) = kills.insert(&id, uid) {
                    warn!(error = %Chain(&error), "a restart during this kill would run its preStop hook again");
                }
            }
            let KillOrder {
                mut request,
                message,
                reference,
            } = kill_order::kill_order(&crr, &name, pod.as_ref(), resumed);
            // Recorded before the preStop hook and the stop, not after:
            // kubelet may ask about the exited container before
            // StopContainer has even returned.
            request.on_stopping = Some(OnStopping({
                let (recreated, id) = (Arc::clone(&ctx.records.recreated), id.clone());
                Arc::new(move || {
                    if let Err(error) = recreated.record(&id, &crr_key, rewrite) {
                        warn!(error = %Chain(&error), "the restart reason will not survive a restart");
                    }
                })
            }));
            // The Event is written while the container stops, as kubelet's
            // recorder writes its own beside the kill: the stop never waits
            // on the API server. Both are done before the kill's state is.
            let (outcome, ()) = tokio::join!(
                ctx.killer.kill(&id, request),
                ctx.events
                    .record(&reference, EventType::Normal, "Killing", message)
            );
            let outcome = outcome.map_err(|error| {
                NotKilled::Failed(KillFailure::Kill {
                    id: id.clone(),
                    name: name.clone(),
                    error,
                })
            })?;
            // Counted before the Events after the kill are written: their
            // writes are no part of the time to the stop.
            if let Some(hook) = &outcome.hook {
                let failed = !matches!(hook.result, HookResult::Succeeded);
                ctx.metrics.pre_stop_finished(hook.took, failed);
            }
            if outcome.stop_timeout.is_some()
                && let Some(seen) = seen
            {
                ctx.metrics.container_stopped(seen.elapsed());
            }
            for told in kill_order::told_after(&outcome, &id, &name, rewrite) {
                ctx.events
                    .record(&reference, told.kind, told.reason, told.note)
                    .await;
            }
            info!(container = %name, after = ?outcome.after, "container killed");
            Ok(())
        }
    }
}

fn recreate_states(crr: &ContainerRecreateRequest) -> Vec<ContainerRecreateState> {
    crr.status
        .as_ref()
        .map(|s| s.container_recreate_states.clone())
        .unwrap_or_default()
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Step A: every container must name this node's runtime in its
/// statusContext's containerID (`<runtime>://<id>`).
fn check_runtime(crr: &ContainerRecreateRequest, runtime: &str) -> Result<(), String> {
    let mut found: Option<&str> = None;
    for container in &crr.spec.containers {
        let id = container
            .status_context
            .as_ref()
            .map(|c| c.container_id.as_str())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                format!(
                    "no statusContext or empty containerID in {} container",
                    container.name
                )
            })?;
        let parts: Vec<&str> = id.split("://").collect();
        let [kind, _] = parts.as_slice() else {
            return Err(format!(
                "failed to parse containerID {id} in {} container",
                container.name
            ));
        };
        match found {
            Some(seen) if seen != *kind => {
                return Err(format!("has different runtime types {seen}, {kind} in Pod"));
            }
            _ => found = Some(kind),
        }
    }
    match found {
        None => Err("no runtime type found in Pod".into()),
        Some(kind) if kind != runtime => {
            Err(format!("not found runtime service for {kind} in daemon"))
        }
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crr::{ContainerRecreateRequestContainer, ContainerRecreateRequestContainerContext};

    fn crr(ids: &[(&str, Option<&str>)]) -> ContainerRecreateRequest {
        let mut crr = ContainerRecreateRequest::new("c", Default::default());
        crr.spec.containers = ids
            .iter()
            .map(|(name, id)| ContainerRecreateRequestContainer {
                name: (*name).into(),
                status_context: id.map(|id| ContainerRecreateRequestContainerContext {
                    container_id: id.into(),
                    restart_count: 0,
                }),
                ..Default::default()
            })
            .collect();
        crr
    }

    #[test]
    fn runtime_checks_use_kruises_messages() {
        let ok = crr(&[("a", Some("containerd://1")), ("b", Some("containerd://2"))]);
        assert_eq!(check_runtime(&ok, "containerd"), Ok(()));
        let cases = [
            (
                crr(&[("a", None)]),
                "no statusContext or empty containerID in a container",
            ),
            (
                crr(&[("a", Some(""))]),
                "no statusContext or empty containerID in a container",
            ),
            (
                crr(&[("a", Some("abc"))]),
                "failed to parse containerID abc in a container",
            ),
            (
                crr(&[("a", Some("containerd://1")), ("b", Some("docker://2"))]),
                "has different runtime types containerd, docker in Pod",
            ),
            (crr(&[]), "no runtime type found in Pod"),
            (
                crr(&[("a", Some("cri-o://1"))]),
                "not found runtime service for cri-o in daemon",
            ),
        ];
        for (crr, message) in cases {
            assert_eq!(check_runtime(&crr, "containerd"), Err(message.to_owned()));
        }
    }
}
