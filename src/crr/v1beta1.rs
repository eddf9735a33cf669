//! `apps.kruise.io/v1beta1`, OpenKruise master's storage version
//! (crr-v1beta1.md §1–§2), as it differs from v1alpha1: said once, here.
//!
//! Its objects are v1alpha1's JSON with two typed status fields,
//! `containerStatusSnapshot` and `conditions`, in place of v1alpha1's two
//! annotations. crr-proxy reads both versions into the one set of types of
//! [`super`], whose status carries the two fields (kept out of v1alpha1's
//! schema). Its spec's minimums and enums are on those types, and judge
//! both versions (see [`super::crd`]). What is left differs in the schema
//! only, and is made here from v1alpha1's: the phases as enums, `isKilled`
//! defaulted, and the two fields.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion;
use serde_json::{Value, json};

pub const VERSION: &str = "v1beta1";

const PHASES: [&str; 5] = ["Pending", "Recreating", "Succeeded", "Failed", "Completed"];

/// v1beta1's version of the CRD, from v1alpha1's: served and stored.
pub(super) fn version(
    alpha: &CustomResourceDefinitionVersion,
) -> Result<CustomResourceDefinitionVersion, serde_json::Error> {
    let mut version = serde_json::to_value(alpha)?;
    version["name"] = json!(VERSION);
    version["storage"] = json!(true);
    let status = &mut version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    status["phase"] = json!({"type": "string", "enum": PHASES});
    let state = &mut status["containerRecreateStates"]["items"]["properties"];
    state["phase"] = json!({"type": "string", "enum": PHASES});
    state["isKilled"] = json!({"type": "boolean", "default": false});
    status["containerStatusSnapshot"] = json!({
        "description": "What kruise-manager last saw of the CRR's containers in the Pod (the\nv1alpha1 annotation `crr.apps.kruise.io/sync-container-statuses`).",
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name", "ready", "restartCount"],
            "properties": {
                "name": {"type": "string"},
                "ready": {"type": "boolean"},
                "restartCount": {"type": "integer", "format": "int32"},
                "containerID": {"type": "string", "nullable": true}
            }
        }
    });
    status["conditions"] = conditions();
    serde_json::from_value(version)
}

/// `PreRecreateGrace` and the like: metav1.Condition as controller-gen
/// writes it, listed by type.
fn conditions() -> Value {
    json!({
        "description": "`PreRecreateGrace` (True) holds the time the Pod was made not ready\n(the v1alpha1 annotation `crr.apps.kruise.io/unready-acquired`).",
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
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0.0},
                "reason": {"type": "string", "maxLength": 1024, "minLength": 1,
                           "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "type": {"type": "string", "maxLength": 316,
                         "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"}
            }
        }
    })
}
