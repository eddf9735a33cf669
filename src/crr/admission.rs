//! What OpenKruise's CRR webhook does on CREATE (crr-semantics.md §2.1),
//! for standalone mode, where crr-proxy accepts the CRRs of its own node.
//!
//! One difference: `statusContext` comes from the runtime (the container's
//! CRI ID and restart count) rather than from the Pod's status, so that no
//! clock on another machine is ever compared with the node's (kruise #895).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::state::PodContainers;
use super::{
    ContainerRecreateRequest, ContainerRecreateRequestContainerContext,
    ContainerRecreateRequestSpec, ContainerRecreateRequestStrategy, FailurePolicy, ProbeHandler,
    labels,
};
use crate::restart_rules;

/// kruise's `minDeadlineSeconds`.
const MIN_DEADLINE_SECONDS: i64 = 3;

/// An accepted CRR: its labels and its defaulted, completed spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Accepted {
    pub labels: BTreeMap<String, String>,
    pub spec: ContainerRecreateRequestSpec,
}

/// Where a new CRR goes, judged by what the webhook checks before it needs
/// the node: its spec, then whether its Pod exists, is active and is
/// scheduled. `Ok` names the node that runs the Pod (which judges the rest
/// itself); `Err` is the webhook's message for a CRR no node can take.
pub fn placement(crr: &ContainerRecreateRequest, pod: Option<&Pod>) -> Result<String, String> {
    check_spec(crr)?;
    let pod = pod.ok_or_else(|| format!("no found Pod named {}", crr.spec.pod_name))?;
    check_pod(pod)
}

/// Validates and defaults `crr` for `pod` (which runs on this node), with
/// the webhook's messages. `containers` are the Pod's runtime containers.
pub fn admit(
    crr: &ContainerRecreateRequest,
    pod: &Pod,
    containers: &PodContainers,
) -> Result<Accepted, String> {
    let mut spec = check_spec(crr)?;
    let node = check_pod(pod)?;
    let strategy = spec
        .strategy
        .get_or_insert_with(ContainerRecreateRequestStrategy::default);
    let pod_spec = pod.spec.clone().unwrap_or_default();
    let pod_status = pod.status.clone().unwrap_or_default();
    if strategy.termination_grace_period_seconds.is_none() {
        strategy.termination_grace_period_seconds = pod_spec.termination_grace_period_seconds;
    }

    let mut seen: Vec<&str> = Vec::new();
    let mut accepted = Vec::with_capacity(spec.containers.len());
    for container in &crr.spec.containers {
        let name = container.name.as_str();
        if seen.contains(&name) {
            return Err(format!("can not recreate {name} multi times"));
        }
        seen.push(name);
        if container.pre_stop.is_some()
            || !container.ports.is_empty()
            || container.status_context.is_some()
        {
            return Err("preStop, ports, statusContext in container are ready-only fields".into());
        }
        let in_spec = pod_spec
            .init_containers
            .iter()
            .flatten()
            .chain(pod_spec.containers.iter())
            .find(|c| c.name == name)
            .ok_or_else(|| format!("container {name} not found in Pod"))?;
        // Only containers that run beside the others can be recreated: the
        // regular ones, and unlike kruise's webhook, native sidecars (init
        // containers with restartPolicy Always, reported with the init
        // containers). Other init containers have ended.
        let sidecar = restart_rules::is_sidecar(in_spec)
            && pod_spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == name);
        let statuses = if sidecar {
            &pod_status.init_container_statuses
        } else {
            &pod_status.container_statuses
        };
        let listed = statuses.iter().flatten().any(|s| s.name == name);
        if !listed {
            return Err(format!("not found {name} containerStatus in Pod Status"));
        }
        let runtime = containers.newest(name).ok_or_else(|| {
            format!("no containerID in {name} containerStatus, maybe the container has not been initialized")
        })?;
        let mut next = container.clone();
        if let Some(pre_stop) = in_spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
            next.pre_stop = Some(ProbeHandler {
                exec: pre_stop.exec.clone(),
                http_get: pre_stop.http_get.clone(),
                tcp_socket: pre_stop.tcp_socket.clone(),
            });
            if pre_stop.http_get.is_some() {
                next.ports = in_spec.ports.clone().unwrap_or_default();
            }
        }
        next.status_context = Some(ContainerRecreateRequestContainerContext {
            container_id: runtime.id.clone(),
            restart_count: runtime.restart_count,
        });
        accepted.push(next);
    }
    spec.containers = accepted;

    let mut labels = crr.metadata.labels.clone().unwrap_or_default();
    labels.insert(labels::ACTIVE.into(), "true".into());
    labels.insert(labels::NODE_NAME.into(), node);
    labels.insert(
        labels::POD_UID.into(),
        pod.metadata.uid.clone().unwrap_or_default(),
    );
    Ok(Accepted { labels, spec })
}

/// The webhook's checks of the spec alone, with its defaults applied.
fn check_spec(crr: &ContainerRecreateRequest) -> Result<ContainerRecreateRequestSpec, String> {
    let mut spec = crr.spec.clone();
    if spec.pod_name.is_empty() {
        return Err("podName can not be empty".into());
    }
    let strategy = spec
        .strategy
        .get_or_insert_with(ContainerRecreateRequestStrategy::default);
    if spec.containers.is_empty() {
        return Err("containers list can not be null".into());
    }
    if spec
        .active_deadline_seconds
        .is_some_and(|d| d < MIN_DEADLINE_SECONDS)
    {
        return Err("activeDeadlineSeconds can not be less than 3s".into());
    }
    if strategy
        .termination_grace_period_seconds
        .is_some_and(|v| v < 0)
    {
        return Err("terminationGracePeriodSeconds must be non-negative integer".into());
    }
    if strategy.unready_grace_period_seconds.is_some_and(|v| v < 0) {
        return Err("unreadyGracePeriodSeconds must be non-negative integer".into());
    }
    match &strategy.failure_policy {
        None => strategy.failure_policy = Some(FailurePolicy::Fail),
        Some(FailurePolicy::Other(other)) if other.is_empty() => {
            strategy.failure_policy = Some(FailurePolicy::Fail)
        }
        Some(FailurePolicy::Other(other)) => return Err(format!("unknown failurePolicy {other}")),
        Some(FailurePolicy::Fail | FailurePolicy::Ignore) => {}
    }
    Ok(spec)
}

/// The webhook's checks of the Pod itself: active, and scheduled (its node).
fn check_pod(pod: &Pod) -> Result<String, String> {
    let terminal = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    if terminal || pod.metadata.deletion_timestamp.is_some() {
        return Err("not allowed to recreate containers in an inactive Pod".into());
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    if node.is_empty() {
        return Err("not allowed to recreate containers in a pending Pod".into());
    }
    Ok(node)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, ContainerStatus, Lifecycle, LifecycleHandler, PodSpec, PodStatus,
    };
    use serde_json::json;

    use super::*;
    use crate::cri::v1::ContainerState;
    use crate::crr::state::RuntimeContainer;

    fn pod() -> Pod {
        let container = |name: &str| Container {
            name: name.into(),
            ..Default::default()
        };
        let mut app = container("app");
        app.lifecycle = Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                http_get: serde_json::from_value(json!({"path": "/quit", "port": "http"})).ok(),
                ..Default::default()
            }),
            ..Default::default()
        });
        app.ports = serde_json::from_value(json!([{"name": "http", "containerPort": 8080}])).ok();
        let status = |name: &str| ContainerStatus {
            name: name.into(),
            container_id: Some(format!("containerd://{name}-1")),
            ..Default::default()
        };
        Pod {
            metadata: serde_json::from_value(
                json!({"name": "web-0", "namespace": "shop", "uid": "u-1"}),
            )
            .unwrap(),
            spec: Some(PodSpec {
                node_name: Some("node-a".into()),
                termination_grace_period_seconds: Some(45),
                init_containers: Some(vec![container("init"), {
                    let mut proxy = container("proxy");
                    proxy.restart_policy = Some("Always".into());
                    proxy
                }]),
                containers: vec![app, container("side")],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                container_statuses: Some(vec![status("app"), status("side")]),
                init_container_statuses: Some(vec![status("init"), status("proxy")]),
                ..Default::default()
            }),
        }
    }

    fn runtime() -> PodContainers {
        let c = |name: &str, id: &str, restart_count| RuntimeContainer {
            id: format!("containerd://{id}"),
            name: name.into(),
            restart_count,
            state: ContainerState::ContainerRunning,
            created_at: 1,
            started_at: Some(1),
        };
        PodContainers::new(vec![
            c("app", "app-cri", 2),
            c("side", "side-cri", 0),
            c("proxy", "proxy-cri", 1),
        ])
    }

    fn crr(spec: serde_json::Value) -> ContainerRecreateRequest {
        serde_json::from_value(
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "r", "namespace": "shop"}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn accepts_with_the_webhooks_defaults_and_a_runtime_status_context() {
        let accepted = admit(
            &crr(json!({"podName": "web-0", "containers": [{"name": "app"}]})),
            &pod(),
            &runtime(),
        )
        .unwrap();
        assert_eq!(accepted.labels[labels::ACTIVE], "true");
        assert_eq!(accepted.labels[labels::NODE_NAME], "node-a");
        assert_eq!(accepted.labels[labels::POD_UID], "u-1");
        let strategy = accepted.spec.strategy.unwrap();
        assert_eq!(strategy.failure_policy, Some(FailurePolicy::Fail));
        assert_eq!(strategy.termination_grace_period_seconds, Some(45));
        let app = &accepted.spec.containers[0];
        let context = app.status_context.as_ref().unwrap();
        assert_eq!(
            (context.container_id.as_str(), context.restart_count),
            ("containerd://app-cri", 2)
        );
        assert!(app.pre_stop.as_ref().unwrap().http_get.is_some());
        assert_eq!(app.ports[0].container_port, 8080);
    }

    #[test]
    fn refuses_with_the_webhooks_messages() {
        let cases = [
            (
                json!({"podName": "", "containers": [{"name": "app"}]}),
                "podName can not be empty",
            ),
            (
                json!({"podName": "web-0", "containers": []}),
                "containers list can not be null",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "app"}], "activeDeadlineSeconds": 2}),
                "activeDeadlineSeconds can not be less than 3s",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "app"}], "strategy": {"terminationGracePeriodSeconds": -1}}),
                "terminationGracePeriodSeconds must be non-negative integer",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "app"}], "strategy": {"unreadyGracePeriodSeconds": -1}}),
                "unreadyGracePeriodSeconds must be non-negative integer",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "app"}], "strategy": {"failurePolicy": "Maybe"}}),
                "unknown failurePolicy Maybe",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "app"}, {"name": "app"}]}),
                "can not recreate app multi times",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "app", "statusContext": {"containerID": "x", "restartCount": 0}}]}),
                "preStop, ports, statusContext in container are ready-only fields",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "nope"}]}),
                "container nope not found in Pod",
            ),
            (
                json!({"podName": "web-0", "containers": [{"name": "init"}]}),
                "not found init containerStatus in Pod Status",
            ),
        ];
        for (spec, message) in cases {
            assert_eq!(
                admit(&crr(spec), &pod(), &runtime()),
                Err(message.to_owned())
            );
        }
    }

    #[test]
    fn accepts_native_sidecars_with_their_runtime_context() {
        let accepted = admit(
            &crr(json!({"podName": "web-0", "containers": [{"name": "proxy"}, {"name": "app"}]})),
            &pod(),
            &runtime(),
        )
        .unwrap();
        let proxy = accepted.spec.containers[0].status_context.as_ref().unwrap();
        assert_eq!(
            (proxy.container_id.as_str(), proxy.restart_count),
            ("containerd://proxy-cri", 1)
        );
    }

    #[test]
    fn refuses_inactive_pods_and_containers_not_started_yet() {
        let request = crr(json!({"podName": "web-0", "containers": [{"name": "app"}]}));
        let mut done = pod();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(
            admit(&request, &done, &runtime()),
            Err("not allowed to recreate containers in an inactive Pod".into())
        );
        assert_eq!(
            admit(&request, &pod(), &PodContainers::new(vec![])),
            Err("no containerID in app containerStatus, maybe the container has not been initialized".into())
        );
    }
}
