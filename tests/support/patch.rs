//! The patch types the fake API server takes: JSON merge patch (RFC 7386)
//! and JSON patch (RFC 6902, with `test`). Strategic merge patch is taken
//! as a merge patch on built-in kinds and refused on custom resources (see
//! the PATCH handler).
//!
//! kube-apiserver answers a JSON patch that does not decode `400 BadRequest`
//! and one whose operations fail (a `test` that does not hold, a path that
//! is not there) `422` (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go,
//! `jsonPatcher.applyJSPatch`).

use serde_json::Value;

use super::apiserver::ApiError;

/// A PATCH body by its content type.
pub enum Patch {
    Merge(Value),
    Json(Value),
}

impl Patch {
    /// `target` with the patch applied (the json-patch crate's RFC 7386 and
    /// RFC 6902).
    pub fn apply(&self, target: &Value) -> Result<Value, ApiError> {
        let mut patched = target.clone();
        match self {
            Self::Merge(patch) => json_patch::merge(&mut patched, patch),
            Self::Json(ops) => {
                let ops: json_patch::Patch = serde_json::from_value(ops.clone())
                    .map_err(|error| ApiError::new(400, "BadRequest", error.to_string()))?;
                json_patch::patch(&mut patched, &ops)
                    .map_err(|error| ApiError::new(422, "Invalid", error.to_string()))?;
            }
        }
        Ok(patched)
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}
