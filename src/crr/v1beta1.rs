//! `apps.kruise.io/v1beta1`, OpenKruise master's storage version
//! (crr-v1beta1.md §1–§2): the spec JSON of v1alpha1 with minimums and
//! enums, and two typed status fields, `containerStatusSnapshot` and
//! `conditions`, in place of v1alpha1's two annotations.
//!
//! Only the schema is defined here, for the CRD. crr-proxy reads both
//! versions into the one Rust type of [`super`], whose status carries the
//! two new fields (and keeps them out of the v1alpha1 schema).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::{ContainerRecreateRequestContainer, FailurePolicy, Phase};

pub const VERSION: &str = "v1beta1";

/// Recreate (stop, for kubelet to restart) some containers of one Pod.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "apps.kruise.io",
    version = "v1beta1",
    kind = "ContainerRecreateRequest",
    namespaced,
    status = "ContainerRecreateRequestStatus",
    shortname = "crr",
    doc = "ContainerRecreateRequest is the Schema for the containerrecreaterequests API",
    printcolumn = r#"{"name":"PHASE","type":"string","description":"Phase of this ContainerRecreateRequest.","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"POD","type":"string","description":"Pod name of this ContainerRecreateRequest.","jsonPath":".spec.podName"}"#,
    printcolumn = r#"{"name":"NODE","type":"string","description":"Node name of this ContainerRecreateRequest.","jsonPath":".metadata.labels.crr\\.apps\\.kruise\\.io/node-name"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","description":"CreationTimestamp is a timestamp representing the server time when this object was created.","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestSpec {
    pub pod_name: String,
    /// Processed in this order.
    pub containers: Vec<ContainerRecreateRequestContainer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<ContainerRecreateRequestStrategy>,
    /// Counted from the CRR's creationTimestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub active_deadline_seconds: Option<i64>,
    /// Counted from status.completionTime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "failure_policy")]
    pub failure_policy: Option<FailurePolicy>,
    #[serde(default)]
    pub ordered_recreate: bool,
    #[serde(default)]
    pub force_recreate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub unready_grace_period_seconds: Option<i64>,
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_started_seconds: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestStatus {
    #[schemars(schema_with = "phase")]
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_recreate_states: Vec<ContainerRecreateState>,
    /// What kruise-manager last saw of the CRR's containers in the Pod (the
    /// v1alpha1 annotation `crr.apps.kruise.io/sync-container-statuses`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_status_snapshot: Vec<ContainerRecreateRequestSyncContainerStatus>,
    /// `PreRecreateGrace` (True) holds the time the Pod was made not ready
    /// (the v1alpha1 annotation `crr.apps.kruise.io/unready-acquired`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions")]
    pub conditions: Vec<serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateState {
    pub name: String,
    #[schemars(schema_with = "phase")]
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default)]
    pub is_killed: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestSyncContainerStatus {
    pub name: String,
    pub ready: bool,
    pub restart_count: i32,
    #[serde(
        rename = "containerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
}

fn failure_policy(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "enum": ["Fail", "Ignore"]})
}

fn phase(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string",
                  "enum": ["Pending", "Recreating", "Succeeded", "Failed", "Completed"]})
}

/// metav1.Condition as controller-gen writes it, listed by type.
fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "description": "Condition contains details for one aspect of the current state of this API Resource.",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "message": {"type": "string", "maxLength": 32768},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "reason": {"type": "string", "maxLength": 1024, "minLength": 1,
                           "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {"type": "string", "maxLength": 316,
                         "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"}
            }
        }
    })
}
