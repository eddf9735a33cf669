//! Stops one container the way kubelet's KillContainer does: the preStop
//! hook within the grace period, then CRI StopContainer. kubelet sees the
//! exit and restarts the container.

mod hook;
pub mod http;
mod target;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerPort, LifecycleHandler};
use tokio::sync::watch;
use tracing::{debug, info, warn};

pub use hook::{HookKind, HookReport, HookResult};
pub use target::{Target, keys};

use crate::cri::RuntimeClient;
use crate::cri::v1::{
    ContainerState, ContainerStatus, ContainerStatusRequest, StopContainerRequest,
};

/// kubelet's `minimumGracePeriodInSeconds`: a container always gets at least
/// this long between SIGTERM and SIGKILL.
pub const MIN_STOP_TIMEOUT: i64 = 2;
/// The API server's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_PERIOD: i64 = 30;
/// Larger values would overflow the runtime's nanosecond durations (a
/// huge StopContainer timeout would turn into an immediate SIGKILL).
pub const MAX_GRACE_PERIOD: i64 = i32::MAX as i64;
/// Time allowed past the stop timeout for the runtime to see the exit.
const STOP_DEADLINE_MARGIN: Duration = Duration::from_secs(15);

/// What the caller (a CRR) asks for; every field is optional.
#[derive(Clone, Debug, Default)]
pub struct KillRequest {
    pub grace_period: Option<i64>,
    pub pre_stop: Option<LifecycleHandler>,
    /// Named ports for an httpGet hook; the container's own when unset.
    pub ports: Option<Vec<ContainerPort>>,
    /// The `Killing` message; `Stopping container <name>` when unset.
    pub message: Option<String>,
    /// The preStop hook already began once (before crr-proxy restarted):
    /// straight to StopContainer, with the whole grace period.
    pub skip_pre_stop: bool,
    /// Called once the container is known to be running and about to be
    /// stopped (before its preStop hook): from then on, an exit is this
    /// kill's doing, however soon kubelet sees it.
    pub on_stopping: Option<OnStopping>,
}

/// The `on_stopping` callback.
#[derive(Clone)]
pub struct OnStopping(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnStopping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnStopping")
    }
}

/// Where the grace period came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraceSource {
    Request,
    DeletionGracePeriod,
    TerminationGracePeriod,
    Default,
}

/// The container's state once the kill is over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateAfter {
    Exited {
        exit_code: i32,
        reason: String,
        /// Nanoseconds since the epoch.
        finished_at: i64,
    },
    /// Removed (or never existed): nothing left to stop.
    Gone,
    /// Anything else the runtime reports (it should not happen after a stop).
    Other(ContainerState),
    /// The stop succeeded, and reading the state after it failed.
    Unknown,
}

/// What one kill did, for the CRR status, Events and metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct KillOutcome {
    pub container_id: String,
    /// The container as read before the kill; `None` when it was gone.
    pub target: Option<Target>,
    pub message: String,
    pub grace_period: i64,
    pub grace_source: GraceSource,
    /// `None` when no hook ran: no handler, grace 0, or nothing to stop.
    pub hook: Option<HookReport>,
    /// The StopContainer timeout used; `None` when the container had
    /// already exited or was gone.
    pub stop_timeout: Option<i64>,
    pub after: StateAfter,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KillError {
    #[error("{call} {container_id}: rpc error: code = {code:?} desc = {message}")]
    Runtime {
        call: &'static str,
        container_id: String,
        code: tonic::Code,
        message: String,
    },
    #[error("the kill of {0} ended without a result")]
    Aborted(String),
}

type Shared = Option<Result<KillOutcome, KillError>>;

/// The kill engine. Cheap to clone; clones share in-flight kills.
#[derive(Clone)]
pub struct Killer {
    inner: Arc<Inner>,
}

struct Inner {
    cri: RuntimeClient,
    http: http::HookClient,
    node_address: IpAddr,
    inflight: Mutex<HashMap<String, watch::Receiver<Shared>>>,
}

/// The grace period, by kubelet's precedence: the request's value, else the
/// Pod's deletion grace period, else its termination grace period, else 30;
/// negative values count as 0 and values past [`MAX_GRACE_PERIOD`] are capped.
pub fn grace_period(requested: Option<i64>, target: &Target) -> (i64, GraceSource) {
    let (value, source) = if let Some(value) = requested {
        (value, GraceSource::Request)
    } else if let Some(value) = target.deletion_grace_period {
        (value, GraceSource::DeletionGracePeriod)
    } else if let Some(value) = target.termination_grace_period {
        (value, GraceSource::TerminationGracePeriod)
    } else {
        (DEFAULT_GRACE_PERIOD, GraceSource::Default)
    };
    (value.clamp(0, MAX_GRACE_PERIOD), source)
}

/// kubelet's stop timeout: the grace left after the hook, at least 2 s.
pub fn stop_timeout(grace: i64, hook_seconds: u64) -> i64 {
    let spent = i64::try_from(hook_seconds).unwrap_or(i64::MAX);
    grace.saturating_sub(spent).max(MIN_STOP_TIMEOUT)
}

// === impl Killer ===

impl Killer {
    /// `node_address` is what an httpGet hook without a host reaches for
    /// host-network Pods (their Pod IP is the node's).
    pub fn new(cri: RuntimeClient, node_address: Option<IpAddr>) -> Self {
        Self {
            inner: Arc::new(Inner {
                cri,
                http: http::HookClient::new(),
                node_address: node_address.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                inflight: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Kills `container_id`. A kill of a container that is already being
    /// killed joins it and returns the same outcome: one hook, one stop.
    /// The kill runs to the end even if the caller stops waiting.
    pub async fn kill(
        &self,
        container_id: &str,
        request: KillRequest,
    ) -> Result<KillOutcome, KillError> {
        let mut result = self.start_or_join(container_id, request);
        match result.wait_for(Option::is_some).await {
            Ok(done) => done
                .clone()
                .unwrap_or_else(|| Err(KillError::Aborted(container_id.to_owned()))),
            Err(_) => Err(KillError::Aborted(container_id.to_owned())),
        }
    }

    fn start_or_join(&self, container_id: &str, request: KillRequest) -> watch::Receiver<Shared> {
        let mut inflight = match self.inner.inflight.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(running) = inflight.get(container_id) {
            debug!(
                container = container_id,
                "joining the kill already in progress"
            );
            return running.clone();
        }
        let (done, result) = watch::channel(None);
        inflight.insert(container_id.to_owned(), result.clone());
        let this = self.clone();
        let id = container_id.to_owned();
        tokio::spawn(async move {
            let outcome = this.kill_once(&id, request).await;
            if let Ok(mut inflight) = this.inner.inflight.lock() {
                inflight.remove(&id);
            }
            let _ = done.send(Some(outcome));
        });
        result
    }

    async fn kill_once(&self, id: &str, request: KillRequest) -> Result<KillOutcome, KillError> {
        let Some(status) = self.status(id).await? else {
            return Ok(KillOutcome::nothing_to_stop(
                id,
                None,
                &request,
                StateAfter::Gone,
            ));
        };
        let target = Target::from_status(&status);
        if target.state == ContainerState::ContainerExited {
            let after = state_after(Some(status));
            return Ok(KillOutcome::nothing_to_stop(
                id,
                Some(target),
                &request,
                after,
            ));
        }
        let (grace, grace_source) = grace_period(request.grace_period, &target);
        let message = request
            .message
            .clone()
            .unwrap_or_else(|| format!("Stopping container {}", target.name));
        info!(container = id, name = %target.name, pod = %target.pod_display(), grace, "killing container");

        if let Some(OnStopping(stopping)) = &request.on_stopping {
            stopping();
        }
        let handler = request.pre_stop.as_ref().or(target.pre_stop.as_ref());
        if handler.is_some() && request.skip_pre_stop {
            info!(
                container = id,
                "its preStop hook began before a restart; stopping without it"
            );
        }
        let hook = match handler.filter(|_| !request.skip_pre_stop) {
            Some(handler) if grace > 0 => {
                Some(self.pre_stop(handler, &target, &request, grace).await)
            }
            _ => None,
        };
        let timeout = stop_timeout(grace, hook.as_ref().map_or(0, |h| h.seconds));
        let stopped = self
            .inner
            .cri
            .clone()
            .stop_container(with_deadline(
                StopContainerRequest {
                    container_id: id.to_owned(),
                    timeout,
                },
                Duration::from_secs(u64::try_from(timeout).unwrap_or(0)) + STOP_DEADLINE_MARGIN,
            ))
            .await;
        match stopped {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(runtime_error("StopContainer", id, &status)),
        }
        // The stop's own answer decides the outcome (kruise reads nothing
        // after it): a status read that fails now only leaves it unknown.
        let after = match self.status(id).await {
            Ok(status) => state_after(status),
            Err(error) => {
                warn!(container = id, %error, "stopped; its state afterwards is unknown");
                StateAfter::Unknown
            }
        };
        info!(
            container = id,
            ?after,
            stop_timeout = timeout,
            "container stopped"
        );
        Ok(KillOutcome {
            container_id: id.to_owned(),
            target: Some(target),
            message,
            grace_period: grace,
            grace_source,
            hook,
            stop_timeout: Some(timeout),
            after,
        })
    }

    async fn pre_stop(
        &self,
        handler: &LifecycleHandler,
        target: &Target,
        request: &KillRequest,
        grace: i64,
    ) -> HookReport {
        let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let kind = hook::kind(handler);
        let ctx = hook::HookContext {
            cri: self.inner.cri.clone(),
            http: &self.inner.http,
            target,
            ports: request.ports.as_deref().unwrap_or(&target.ports),
            node_address: self.inner.node_address,
            grace,
        };
        let started = Instant::now();
        // kubelet waits for the hook at most the grace period. Dropping the
        // hook here also cancels its ExecSync, which ends the exec process.
        let (result, http_fallback) =
            match tokio::time::timeout(grace, hook::run(handler, ctx)).await {
                Ok((None, fell_back)) => (HookResult::Succeeded, fell_back),
                Ok((Some(message), fell_back)) => (HookResult::Failed(message), fell_back),
                Err(_) => (HookResult::TimedOut, false),
            };
        let took = started.elapsed();
        let seconds = took.as_secs();
        match &result {
            HookResult::Failed(message) => {
                warn!(container = %target.id, %message, "preStop hook failed")
            }
            HookResult::TimedOut => {
                warn!(container = %target.id, ?grace, "preStop hook not finished within the grace period")
            }
            HookResult::Succeeded => debug!(container = %target.id, seconds, "preStop hook done"),
        }
        HookReport {
            kind,
            result,
            seconds,
            took,
            http_fallback,
        }
    }

    /// ContainerStatus, or `None` when the container does not exist.
    async fn status(&self, id: &str) -> Result<Option<ContainerStatus>, KillError> {
        let response = self
            .inner
            .cri
            .clone()
            .container_status(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await;
        match response {
            Ok(response) => Ok(response.into_inner().status),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(runtime_error("ContainerStatus", id, &status)),
        }
    }
}

// === impl KillOutcome ===

impl KillOutcome {
    fn nothing_to_stop(
        id: &str,
        target: Option<Target>,
        request: &KillRequest,
        after: StateAfter,
    ) -> Self {
        let (grace_period, grace_source) = match &target {
            Some(target) => grace_period(request.grace_period, target),
            None => (
                request
                    .grace_period
                    .unwrap_or(DEFAULT_GRACE_PERIOD)
                    .clamp(0, MAX_GRACE_PERIOD),
                GraceSource::Request,
            ),
        };
        let name = target.as_ref().map_or(id, |t| t.name.as_str());
        Self {
            container_id: id.to_owned(),
            message: request
                .message
                .clone()
                .unwrap_or_else(|| format!("Stopping container {name}")),
            target,
            grace_period,
            grace_source,
            hook: None,
            stop_timeout: None,
            after,
        }
    }
}

fn state_after(status: Option<ContainerStatus>) -> StateAfter {
    match status {
        None => StateAfter::Gone,
        Some(status) if status.state() == ContainerState::ContainerExited => StateAfter::Exited {
            exit_code: status.exit_code,
            reason: status.reason,
            finished_at: status.finished_at,
        },
        Some(status) => StateAfter::Other(status.state()),
    }
}

fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

fn runtime_error(call: &'static str, id: &str, status: &tonic::Status) -> KillError {
    KillError::Runtime {
        call,
        container_id: id.to_owned(),
        code: status.code(),
        message: status.message().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(deletion: Option<i64>, termination: Option<i64>) -> Target {
        Target {
            id: "c".into(),
            name: "app".into(),
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            restart_count: 0,
            deletion_grace_period: deletion,
            termination_grace_period: termination,
            pre_stop: None,
            ports: vec![],
            state: ContainerState::ContainerRunning,
        }
    }

    #[test]
    fn grace_period_precedence() {
        assert_eq!(
            grace_period(Some(5), &target(Some(7), Some(9))),
            (5, GraceSource::Request)
        );
        assert_eq!(
            grace_period(None, &target(Some(7), Some(9))),
            (7, GraceSource::DeletionGracePeriod)
        );
        assert_eq!(
            grace_period(None, &target(None, Some(9))),
            (9, GraceSource::TerminationGracePeriod)
        );
        assert_eq!(
            grace_period(None, &target(None, None)),
            (30, GraceSource::Default)
        );
        assert_eq!(
            grace_period(Some(0), &target(None, Some(9))),
            (0, GraceSource::Request)
        );
    }

    #[test]
    fn grace_period_is_clamped() {
        assert_eq!(grace_period(Some(-4), &target(None, None)).0, 0);
        assert_eq!(
            grace_period(Some(i64::MAX), &target(None, None)).0,
            MAX_GRACE_PERIOD
        );
    }

    #[test]
    fn stop_timeout_is_what_is_left_but_at_least_two_seconds() {
        assert_eq!(stop_timeout(30, 8), 22);
        assert_eq!(stop_timeout(3, 3), 2);
        assert_eq!(stop_timeout(0, 0), 2);
        assert_eq!(stop_timeout(10, 9), 2);
        assert_eq!(stop_timeout(10, u64::MAX), 2);
    }
}
