//! OpenKruise's ContainerRecreateRequest (`apps.kruise.io/v1alpha1`): the
//! API types, with exactly the upstream JSON, and the node agent's
//! decision rules.

pub mod state;

use k8s_openapi::api::core::v1::{ContainerPort, ExecAction, HTTPGetAction, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "apps.kruise.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "ContainerRecreateRequest";
pub const PLURAL: &str = "containerrecreaterequests";

/// Labels the webhook (or crr-proxy in standalone mode) puts on a CRR.
pub mod labels {
    pub const POD_UID: &str = "crr.apps.kruise.io/pod-uid";
    pub const NODE_NAME: &str = "crr.apps.kruise.io/node-name";
    pub const ACTIVE: &str = "crr.apps.kruise.io/active";
}

/// Annotations kruise-manager writes for the node agent.
pub mod annotations {
    /// JSON list of [`super::SyncContainerStatus`].
    pub const SYNC_CONTAINER_STATUSES: &str = "crr.apps.kruise.io/sync-container-statuses";
    /// RFC 3339 time at which the Pod was made not-ready.
    pub const UNREADY_ACQUIRED: &str = "crr.apps.kruise.io/unready-acquired";
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestSpec {
    pub pod_name: String,
    /// Processed in this order.
    #[serde(default)]
    pub containers: Vec<ContainerRecreateRequestContainer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<ContainerRecreateRequestStrategy>,
    /// Counted from the CRR's creationTimestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    /// Counted from status.completionTime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestContainer {
    pub name: String,
    /// Copied from the Pod by the webhook (exec, httpGet, tcpSocket only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<ProbeHandler>,
    /// Copied with an httpGet preStop, to resolve named ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
    /// The container as it was when the CRR was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_context: Option<ContainerRecreateRequestContainerContext>,
}

/// kruise's own handler type: a LifecycleHandler without `sleep`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeHandler {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HTTPGetAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TCPSocketAction>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestContainerContext {
    /// `<runtime>://<id>`, as in the Pod's containerStatuses.
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub restart_count: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub ordered_recreate: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub force_recreate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unready_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_started_seconds: i32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailurePolicy {
    /// Complete the CRR as soon as one container fails.
    #[default]
    Fail,
    /// Carry on with the other containers.
    Ignore,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestStatus {
    /// Always written (the schema requires it), even when empty.
    #[serde(default)]
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_recreate_states: Vec<ContainerRecreateState>,
}

/// Phases of a CRR (`""`, Pending, Recreating, Completed) and of each of its
/// containers (Pending, Recreating, Succeeded, Failed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    #[default]
    #[serde(rename = "")]
    New,
    Pending,
    Recreating,
    Succeeded,
    Failed,
    Completed,
    /// A phase this version does not know; kept so that reading never fails.
    #[serde(untagged)]
    Other(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateState {
    pub name: String,
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Sticky: once crr-proxy (or kruise-daemon) killed the container.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_killed: bool,
}

/// One entry of the `sync-container-statuses` annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncContainerStatus {
    pub name: String,
    pub ready: bool,
    pub restart_count: i32,
    #[serde(
        rename = "containerID",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub container_id: String,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &i32) -> bool {
    *value == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_reads_a_webhook_mutated_crr() {
        let spec: ContainerRecreateRequestSpec = serde_json::from_str(
            r#"{
              "podName": "web-0",
              "containers": [{
                "name": "app",
                "preStop": {"httpGet": {"path": "/quit", "port": "http"}},
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "statusContext": {"containerID": "containerd://abc", "restartCount": 2}
              }],
              "strategy": {"failurePolicy": "Ignore", "orderedRecreate": true, "minStartedSeconds": 5,
                           "terminationGracePeriodSeconds": 30},
              "activeDeadlineSeconds": 300,
              "ttlSecondsAfterFinished": 60
            }"#,
        )
        .unwrap();
        let container = &spec.containers[0];
        assert_eq!(
            container.status_context.as_ref().unwrap().container_id,
            "containerd://abc"
        );
        assert_eq!(container.ports[0].container_port, 8080);
        let strategy = spec.strategy.unwrap();
        assert_eq!(strategy.failure_policy, Some(FailurePolicy::Ignore));
        assert!(strategy.ordered_recreate && !strategy.force_recreate);
        assert_eq!(strategy.min_started_seconds, 5);
    }

    #[test]
    fn status_json_matches_kruise_omitempty_rules() {
        let status = ContainerRecreateRequestStatus {
            phase: Phase::Recreating,
            container_recreate_states: vec![
                ContainerRecreateState {
                    name: "app".into(),
                    phase: Phase::Recreating,
                    message: String::new(),
                    is_killed: true,
                },
                ContainerRecreateState {
                    name: "sidecar".into(),
                    phase: Phase::Pending,
                    message: "not found container on Node".into(),
                    is_killed: false,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&status).unwrap(),
            r#"{"phase":"Recreating","containerRecreateStates":[{"name":"app","phase":"Recreating","isKilled":true},{"name":"sidecar","phase":"Pending","message":"not found container on Node"}]}"#
        );
        // A new CRR's status still carries the (empty) phase.
        assert_eq!(
            serde_json::to_string(&ContainerRecreateRequestStatus::default()).unwrap(),
            r#"{"phase":""}"#
        );
    }

    #[test]
    fn phases_round_trip_and_unknown_ones_are_kept() {
        for (phase, json) in [
            (Phase::New, r#""""#),
            (Phase::Pending, r#""Pending""#),
            (Phase::Completed, r#""Completed""#),
            (Phase::Other("Paused".into()), r#""Paused""#),
        ] {
            assert_eq!(serde_json::to_string(&phase).unwrap(), json);
            assert_eq!(serde_json::from_str::<Phase>(json).unwrap(), phase);
        }
    }

    #[test]
    fn sync_statuses_parse_as_the_manager_writes_them() {
        let parsed: Vec<SyncContainerStatus> = serde_json::from_str(
            r#"[{"name":"app","ready":true,"restartCount":1,"containerID":"containerd://def"},{"name":"b","ready":false,"restartCount":0}]"#,
        )
        .unwrap();
        assert_eq!(parsed[0].container_id, "containerd://def");
        assert!(parsed[0].ready);
        assert_eq!(parsed[1].container_id, "");
        assert_eq!(
            serde_json::to_string(&parsed[1]).unwrap(),
            r#"{"name":"b","ready":false,"restartCount":0}"#
        );
    }
}
