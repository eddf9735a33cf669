//! The node agent's decision rules, as kruise-daemon applies them (see
//! `shared/research/crr-semantics.md` §2.3): which CRR of a Pod runs, what
//! state each of its containers is in, and what one pass does next.
//!
//! Everything here is pure except the kill, which the caller passes in, so
//! every branch is tested with its exact output.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use super::{
    ContainerRecreateRequestSpec, ContainerRecreateRequestStrategy, ContainerRecreateState,
    FailurePolicy, Phase, SyncContainerStatus,
};
use crate::cri::v1::ContainerState;

pub const NOT_FOUND_ON_NODE: &str = "not found container on Node";

/// A container of the Pod as the runtime reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// `<runtime>://<id>`, as kubelet writes it in the Pod status.
    pub id: String,
    pub name: String,
    pub restart_count: i32,
    pub state: ContainerState,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
    /// Nanoseconds since the epoch; `None` while CREATED.
    pub started_at: Option<i64>,
}

/// The Pod's containers, newest first, so that a lookup by name finds the
/// current instance (as kubelet's GetPodStatus sorts them).
#[derive(Clone, Debug, Default)]
pub struct PodContainers(Vec<RuntimeContainer>);

impl PodContainers {
    pub fn new(mut containers: Vec<RuntimeContainer>) -> Self {
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        Self(containers)
    }

    /// The newest container with this name.
    pub fn newest(&self, name: &str) -> Option<&RuntimeContainer> {
        self.0.iter().find(|c| c.name == name)
    }
}

/// Step D: the state of every container of `spec`, in spec order.
///
/// `now` is in nanoseconds since the epoch, on the node's clock, as are
/// the runtime's `started_at` values it is compared with.
pub fn current_states(
    spec: &ContainerRecreateRequestSpec,
    previous: &[ContainerRecreateState],
    containers: &PodContainers,
    sync: &HashMap<String, SyncContainerStatus>,
    now: i64,
) -> Vec<ContainerRecreateState> {
    let strategy = spec.strategy.clone().unwrap_or_default();
    let min_started_ns = i64::from(strategy.min_started_seconds).saturating_mul(1_000_000_000);
    spec.containers
        .iter()
        .map(|c| {
            let prev = previous.iter().find(|p| p.name == c.name);
            let was_killed = prev.is_some_and(|p| p.is_killed);
            let state = |phase, message: &str, is_killed| ContainerRecreateState {
                name: c.name.clone(),
                phase,
                message: message.to_owned(),
                is_killed,
            };
            // 1. Terminal states stay as they are.
            if let Some(prev) = prev.filter(|p| matches!(p.phase, Phase::Failed | Phase::Succeeded))
            {
                return prev.clone();
            }
            // 2. Nothing of that name on the node.
            let Some(newest) = containers.newest(&c.name) else {
                return state(Phase::Pending, NOT_FOUND_ON_NODE, was_killed);
            };
            // 3. Stopped: kubelet will start it again.
            if newest.state == ContainerState::ContainerExited {
                return state(Phase::Recreating, "", was_killed);
            }
            // 4. forceRecreate kills it again unless this CRR already did.
            if strategy.force_recreate && !was_killed {
                return state(Phase::Pending, "", false);
            }
            // 5. A new container, or the old one restarted: recreated. It has
            //    succeeded once kruise-manager reports it ready under that ID
            //    and it has run longer than minStartedSeconds.
            if let Some(context) = &c.status_context {
                if newest.id != context.container_id || newest.restart_count > context.restart_count
                {
                    let synced = sync
                        .get(&c.name)
                        .is_some_and(|s| s.container_id == newest.id && s.ready);
                    // No start time counts as long ago, as Go's zero time does.
                    let started_long_enough = newest
                        .started_at
                        .is_none_or(|at| now.saturating_sub(at) > min_started_ns);
                    let phase = if synced && started_long_enough {
                        Phase::Succeeded
                    } else {
                        Phase::Recreating
                    };
                    return state(phase, "", was_killed);
                }
            }
            // 6. The container from creation time, still there.
            state(Phase::Pending, "", was_killed)
        })
        .collect()
}

/// How a pass of the kill loop (step F onwards) ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassEnd {
    /// Write these states (a status merge-patch of the whole list).
    Patch(Vec<ContainerRecreateState>),
    /// Complete the CRR (message empty).
    Complete,
    /// Look again after this long (minStartedSeconds).
    Requeue(Duration),
    /// Nothing to do until the CRR changes.
    Wait,
}

/// Why a container was not killed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotKilled<E> {
    /// The kill failed: kruise's `kill container error: <error>`.
    Failed(E),
    /// Not tried, since the container would not come back: the message.
    Refused(String),
}

/// Steps F to I: walks the states in order, kills at most one container
/// (more only when kills fail under `failurePolicy: Ignore`), and says how
/// the pass ends. `kill` gets the container name and says why it did not
/// kill it.
pub async fn kill_pass<K, F, E>(
    states: &[ContainerRecreateState],
    strategy: &ContainerRecreateRequestStrategy,
    containers: &PodContainers,
    mut kill: K,
) -> PassEnd
where
    K: FnMut(String) -> F,
    F: Future<Output = Result<(), NotKilled<E>>>,
    E: std::fmt::Display,
{
    let ignore = strategy.failure_policy == Some(FailurePolicy::Ignore);
    let mut next = states.to_vec();
    let mut completed = 0;
    for i in 0..next.len() {
        match next[i].phase {
            Phase::Succeeded => completed += 1,
            Phase::Failed => {
                completed += 1;
                if !ignore {
                    return PassEnd::Complete;
                }
            }
            Phase::Recreating => {
                next[i].is_killed = true;
                if strategy.ordered_recreate {
                    break;
                }
            }
            Phase::Pending => {
                if containers.newest(&next[i].name).is_none() {
                    break;
                }
                match kill(next[i].name.clone()).await {
                    Ok(()) => {
                        next[i].is_killed = true;
                        next[i].phase = Phase::Recreating;
                        break;
                    }
                    Err(why) => {
                        next[i].phase = Phase::Failed;
                        next[i].message = match why {
                            NotKilled::Failed(error) => format!("kill container error: {error}"),
                            NotKilled::Refused(message) => message,
                        };
                        if !ignore {
                            return PassEnd::Patch(next);
                        }
                    }
                }
            }
            // Step D never produces these for a container.
            Phase::New | Phase::Completed | Phase::Other(_) => {}
        }
    }
    if next != states {
        return PassEnd::Patch(next);
    }
    if completed == next.len() {
        return PassEnd::Complete;
    }
    match u64::try_from(strategy.min_started_seconds) {
        Ok(seconds) if seconds > 0 => PassEnd::Requeue(Duration::from_secs(seconds)),
        _ => PassEnd::Wait,
    }
}

/// One CRR of a Pod, as the picker sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub phase: Phase,
    /// creationTimestamp, whole seconds.
    pub created: i64,
    /// Being deleted, or already has a completionTime.
    pub finished: bool,
}

/// Which of a Pod's CRRs runs now, and which others must be set Pending.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pick {
    pub picked: Option<String>,
    pub set_pending: Vec<String>,
}

/// Step 2.3.2: one CRR per Pod at a time. Recreating ones first, then
/// Pending, then new ones; oldest first within a phase. The walk stops at a
/// CRR whose cached copy is older than crr-proxy's own last write to it
/// (`current` false): acting on it could undo that write.
pub fn pick(candidates: &[Candidate], current: impl Fn(&str) -> bool) -> Pick {
    let weight = |phase: &Phase| match phase {
        Phase::Completed => 1,
        Phase::Recreating => 2,
        Phase::Pending => 3,
        _ => 4,
    };
    let mut order: Vec<&Candidate> = candidates.iter().filter(|c| !c.finished).collect();
    order.sort_by(|a, b| {
        weight(&a.phase)
            .cmp(&weight(&b.phase))
            .then(a.created.cmp(&b.created))
            .then(a.name.cmp(&b.name))
    });
    let mut pick = Pick::default();
    for candidate in order {
        if !current(&candidate.name) {
            break;
        }
        if pick.picked.is_none() {
            pick.picked = Some(candidate.name.clone());
        } else if candidate.phase == Phase::New {
            pick.set_pending.push(candidate.name.clone());
        }
    }
    pick
}

#[cfg(test)]
mod tests;
