//! How the fake API server serves the CRR's versions, as a real one does
//! with the CRD installed:
//!
//! - `V1alpha1Only`: OpenKruise v1.9's CRD (and crr-proxy's before v1beta1).
//! - `Both(None)`: v1alpha1 and v1beta1 served, v1beta1 stored, no
//!   conversion webhook: a v1alpha1 request sees the stored object with its
//!   apiVersion rewritten and the fields its schema lacks pruned
//!   (`containerStatusSnapshot`, `conditions`), and a v1alpha1 write stores
//!   what it saw, so those fields are lost.
//! - `Both(Webhook)`: OpenKruise master, whose kruise-manager converts by
//!   crr-v1beta1.md §3: a v1alpha1 request sees the typed fields as the two
//!   legacy annotations, and a v1alpha1 write stores the annotations it saw
//!   as well as the typed fields parsed back from them (the leak master's
//!   e2e cases 6 and 8 catch).
//!
//! Objects are kept in the storage version; every HTTP request sees them
//! through the version it names (`View`).

use serde_json::{Value, json};

use super::apiserver::ApiError;

pub const GROUP: &str = "apps.kruise.io";
const SYNC_ANNOTATION: &str = "crr.apps.kruise.io/sync-container-statuses";
const UNREADY_ANNOTATION: &str = "crr.apps.kruise.io/unready-acquired";
const PRE_RECREATE_GRACE: &str = "PreRecreateGrace";
const GRACE_MESSAGE: &str = "Pod has been forced to not-ready for unreadyGracePeriodSeconds drain";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CrrVersions {
    #[default]
    V1alpha1Only,
    Both(Conversion),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    None,
    Webhook,
}

/// How one request sees the stored CRRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// In the storage version.
    Stored,
    /// v1alpha1 over v1beta1 storage.
    Alpha(Conversion),
}

impl CrrVersions {
    pub fn storage(self) -> &'static str {
        match self {
            CrrVersions::V1alpha1Only => "v1alpha1",
            CrrVersions::Both(_) => "v1beta1",
        }
    }

    pub fn served(self) -> &'static [&'static str] {
        match self {
            CrrVersions::V1alpha1Only => &["v1alpha1"],
            CrrVersions::Both(_) => &["v1alpha1", "v1beta1"],
        }
    }

    /// The defaults of crr-proxy's own CRD (deploy/crd, the `Both(None)`
    /// case), which a real API server applies to every CRR it decodes from
    /// storage (v1beta1), whichever version the request then shows: a
    /// present `strategy` gets `forceRecreate` and `orderedRecreate` false
    /// and `minStartedSeconds` 0, every state `isKilled` false. (Seen on a
    /// real kube-apiserver v1.37, tests/real/rules.rs.) kruise's CRDs
    /// declare none that a CRR uses.
    pub fn apply_defaults(self, obj: &mut Value) {
        if self != CrrVersions::Both(Conversion::None) {
            return;
        }
        let fill = |object: Option<&mut Value>, defaults: &[(&str, Value)]| {
            if let Some(object) = object.and_then(Value::as_object_mut) {
                for (key, value) in defaults {
                    object.entry(*key).or_insert_with(|| value.clone());
                }
            }
        };
        fill(
            obj.pointer_mut("/spec/strategy"),
            &[
                ("forceRecreate", json!(false)),
                ("orderedRecreate", json!(false)),
                ("minStartedSeconds", json!(0)),
            ],
        );
        if let Some(states) = obj
            .pointer_mut("/status/containerRecreateStates")
            .and_then(Value::as_array_mut)
        {
            for state in states {
                fill(Some(state), &[("isKilled", json!(false))]);
            }
        }
    }

    /// The view of a request for `version`; `None` if it is not served.
    pub fn view(self, version: &str) -> Option<View> {
        if !self.served().contains(&version) {
            return None;
        }
        Some(match self {
            CrrVersions::Both(conversion) if version == "v1alpha1" => View::Alpha(conversion),
            _ => View::Stored,
        })
    }
}

impl View {
    /// The stored object as this view shows it.
    pub fn present(self, stored: &Value) -> Value {
        let mut obj = stored.clone();
        let View::Alpha(conversion) = self else {
            return obj;
        };
        obj["apiVersion"] = json!(format!("{GROUP}/v1alpha1"));
        let status = obj.get_mut("status").and_then(Value::as_object_mut);
        let (snapshot, conditions) = match status {
            Some(status) => (
                status.remove("containerStatusSnapshot"),
                status.remove("conditions"),
            ),
            None => (None, None),
        };
        if conversion == Conversion::None {
            return obj;
        }
        // ConvertFrom: the typed fields become the legacy annotations.
        if let Some(snapshot) = snapshot.filter(|s| !s.is_null()) {
            annotate(&mut obj, SYNC_ANNOTATION, &compact_snapshot(&snapshot));
        }
        let grace = conditions
            .as_ref()
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c["type"] == PRE_RECREATE_GRACE && c["status"] == "True");
        if let Some(at) = grace.and_then(|c| c["lastTransitionTime"].as_str()) {
            annotate(&mut obj, UNREADY_ANNOTATION, &utc(at));
        }
        obj
    }

    /// What a write through this view stores.
    pub fn store(self, written: &Value) -> Value {
        let mut obj = written.clone();
        let View::Alpha(conversion) = self else {
            return obj;
        };
        obj["apiVersion"] = json!(format!("{GROUP}/v1beta1"));
        if conversion == Conversion::None {
            return obj;
        }
        // ConvertTo: the annotations, kept as they are, also fill the typed
        // fields; what does not parse is lost.
        let annotation = |key: &str| {
            obj.pointer(&format!("/metadata/annotations/{}", key.replace('/', "~1")))
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let snapshot = annotation(SYNC_ANNOTATION)
            .and_then(|raw| serde_json::from_str::<Value>(&raw).ok())
            .filter(|s| s.as_array().is_some_and(|a| !a.is_empty()));
        let grace = annotation(UNREADY_ANNOTATION)
            .filter(|at| at.parse::<k8s_openapi::jiff::Timestamp>().is_ok())
            .map(|at| {
                json!([{"type": PRE_RECREATE_GRACE, "status": "True", "lastTransitionTime": utc(&at),
                        "reason": PRE_RECREATE_GRACE, "message": GRACE_MESSAGE}])
            });
        if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
            match snapshot {
                Some(snapshot) => status.insert("containerStatusSnapshot".into(), snapshot),
                None => status.remove("containerStatusSnapshot"),
            };
            match grace {
                Some(grace) => status.insert("conditions".into(), grace),
                None => status.remove("conditions"),
            };
        }
        obj
    }
}

/// Which of v1beta1's schema checks a write is judged by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    /// All of them: a v1beta1 write.
    V1beta1,
    /// The spec's: a v1alpha1 write under crr-proxy's own CRD, whose
    /// v1alpha1 spec schema is v1beta1's.
    Spec,
}

/// v1beta1's schema checks the v1alpha1 schema lacks: the phase and
/// failurePolicy enums, and `minimum: 0` (in the API server's words). With
/// `old` (validation ratcheting), a value the old object had already is
/// not judged again.
pub fn validate(obj: &Value, checks: Checks, old: Option<&Value>) -> Result<(), ApiError> {
    // As kube-apiserver words it: the object, then the field's complaint.
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let invalid = |message: String| {
        Err(ApiError::new(
            422,
            "Invalid",
            format!("ContainerRecreateRequest.{GROUP} \"{name}\" is invalid: {message}"),
        ))
    };
    let kept = |pointer: &str| old.is_some_and(|old| old.pointer(pointer) == obj.pointer(pointer));
    let phases = ["Pending", "Recreating", "Succeeded", "Failed", "Completed"];
    let mut phase_fields = vec![("status.phase".to_owned(), "/status/phase".to_owned())];
    for i in 0..obj
        .pointer("/status/containerRecreateStates")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
    {
        phase_fields.push((
            format!("status.containerRecreateStates[{i}].phase"),
            format!("/status/containerRecreateStates/{i}/phase"),
        ));
    }
    if checks == Checks::Spec {
        phase_fields.clear();
    }
    for (field, pointer) in phase_fields {
        if let Some(phase) = obj.pointer(&pointer).and_then(Value::as_str) {
            if !phases.contains(&phase) && !kept(&pointer) {
                return invalid(format!(
                    "{field}: Unsupported value: {phase:?}: supported values: \"Pending\", \"Recreating\", \"Succeeded\", \"Failed\", \"Completed\""
                ));
            }
        }
    }
    let policy = "/spec/strategy/failurePolicy";
    if let Some(value) = obj.pointer(policy).and_then(Value::as_str) {
        if !["Fail", "Ignore"].contains(&value) && !kept(policy) {
            return invalid(format!(
                "spec.strategy.failurePolicy: Unsupported value: {value:?}: supported values: \"Fail\", \"Ignore\""
            ));
        }
    }
    for field in [
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
        "strategy/terminationGracePeriodSeconds",
        "strategy/unreadyGracePeriodSeconds",
        "strategy/minStartedSeconds",
    ] {
        let pointer = format!("/spec/{field}");
        if let Some(value) = obj
            .pointer(&pointer)
            .and_then(Value::as_i64)
            .filter(|v| *v < 0 && !kept(&pointer))
        {
            let field = format!("spec.{}", field.replace('/', "."));
            return invalid(format!(
                "{field}: Invalid value: {value}: {field} in body should be greater than or equal to 0"
            ));
        }
    }
    Ok(())
}

fn annotate(obj: &mut Value, key: &str, value: &str) {
    if !obj["metadata"]["annotations"].is_object() {
        obj["metadata"]["annotations"] = json!({});
    }
    obj["metadata"]["annotations"][key] = json!(value);
}

/// The snapshot as Go's encoding/json writes the annotation (field order
/// name, ready, restartCount, containerID; containerID omitted when empty).
fn compact_snapshot(snapshot: &Value) -> String {
    let entries: Vec<String> = snapshot
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let mut entry = format!(
                r#"{{"name":{},"ready":{},"restartCount":{}"#,
                s["name"], s["ready"], s["restartCount"]
            );
            if let Some(id) = s["containerID"].as_str().filter(|id| !id.is_empty()) {
                entry.push_str(&format!(r#","containerID":{}"#, json!(id)));
            }
            entry.push('}');
            entry
        })
        .collect();
    format!("[{}]", entries.join(","))
}

/// An RFC 3339 time in UTC at whole seconds, as Go's `Time.UTC()` writes.
fn utc(at: &str) -> String {
    at.parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| at.to_owned())
}
