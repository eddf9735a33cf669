//! One container's kill for a CRR, decided from the CRR and its Pod alone:
//! what the kill engine is asked, which object its Events name, and what
//! the Events after it say. `daemon` does the I/O around these decisions
//! (the Pod's spec, the kill record, the kill, the writes).

use k8s_openapi::api::core::v1::{LifecycleHandler, ObjectReference, PodSpec};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::crr::{ContainerRecreateRequest, labels};
use crate::kill::{HookResult, KillOutcome, KillRequest, StateAfter};
use crate::restart_rules::{self, Rewrite};

/// What the kill of container `name` asks, and the object its Events name.
#[derive(Debug)]
pub(crate) struct KillOrder {
    /// The request, without its `on_stopping` record (the caller's I/O).
    pub(crate) request: KillRequest,
    /// The `Killing` Event's note (the request's message).
    pub(crate) message: String,
    /// The container's place in its Pod, as kubelet's Events name it.
    pub(crate) reference: ObjectReference,
}

/// The runtime's ID in a Pod status's `containerID` (`containerd://ID`).
pub(crate) fn runtime_id(container_id: &str) -> Option<&str> {
    container_id.split_once("://").map(|(_, id)| id)
}

/// The kill of container `name` of `crr`'s Pod, whose spec is `pod` when
/// it could be read; `resumed` when its kill began before a restart of
/// crr-proxy (the preStop hook runs at most once).
pub(crate) fn kill_order(
    crr: &ContainerRecreateRequest,
    name: &str,
    pod: Option<&PodSpec>,
    resumed: bool,
) -> KillOrder {
    let message = format!(
        "Stopping container {name} by ContainerRecreateRequest {}",
        crr.name_any()
    );
    let spec = crr.spec.containers.iter().find(|c| c.name == name);
    // kubelet's Events name a sidecar by its place in the spec.
    let sidecar = pod
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .any(|c| c.name == name && restart_rules::is_sidecar(c));
    let list = if sidecar {
        "initContainers"
    } else {
        "containers"
    };
    let reference = ObjectReference {
        kind: Some("Pod".into()),
        api_version: Some("v1".into()),
        namespace: crr.namespace(),
        name: Some(crr.spec.pod_name.clone()),
        uid: crr.labels().get(labels::POD_UID).cloned(),
        field_path: Some(format!("spec.{list}{{{name}}}")),
        ..Default::default()
    };
    let request = KillRequest {
        skip_pre_stop: resumed,
        grace_period: crr
            .spec
            .strategy
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds),
        // The webhook's copy of the Pod's preStop; without one, the
        // container's own annotation (which may hold `sleep`). The webhook
        // copies a sleep-only preStop as `{}`: that is none.
        pre_stop: spec
            .and_then(|c| c.pre_stop.as_ref())
            .filter(|p| p.exec.is_some() || p.http_get.is_some() || p.tcp_socket.is_some())
            .map(|p| LifecycleHandler {
                exec: p.exec.clone(),
                http_get: p.http_get.clone(),
                tcp_socket: p.tcp_socket.clone(),
                ..Default::default()
            }),
        ports: spec.map(|c| c.ports.clone()).filter(|p| !p.is_empty()),
        message: Some(message.clone()),
        on_stopping: None,
    };
    KillOrder {
        request,
        message,
        reference,
    }
}

/// An Event to write about a kill that is over: its type, reason and note.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Told {
    pub(crate) kind: EventType,
    pub(crate) reason: &'static str,
    pub(crate) note: String,
}

/// The Events kubelet would write after the kill of container `name`
/// (runtime ID `id`): a preStop hook that failed, or fell back to HTTP, and
/// an exit code that the restart rules' `rewrite` reports as another.
pub(crate) fn told_after(
    outcome: &KillOutcome,
    id: &str,
    name: &str,
    rewrite: Option<Rewrite>,
) -> Vec<Told> {
    let mut told = Vec::new();
    if let Some(hook) = &outcome.hook {
        if let HookResult::Failed(text) = &hook.result {
            told.push(Told {
                kind: EventType::Warning,
                reason: "FailedPreStopHook",
                note: text.replace(id, name),
            });
        }
        if hook.http_fallback {
            told.push(Told {
                kind: EventType::Warning,
                reason: "LifecycleHTTPFallback",
                note: "HTTP lifecycle hook for preStop fell back to HTTP: the server answered HTTPS in plain HTTP".into(),
            });
        }
    }
    if let (Some(rewrite), StateAfter::Exited { exit_code, .. }) = (rewrite, &outcome.after)
        && let Some(reported) = rewrite.code_for(*exit_code)
    {
        told.push(Told {
            kind: EventType::Normal,
            reason: "ExitCodeReported",
            note: format!(
                "Container {name} exited with code {exit_code}, which its restart policy does not restart; kubelet is told {reported}"
            ),
        });
    }
    told
}

#[cfg(test)]
mod tests;
