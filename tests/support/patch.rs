//! The patch types the fake API server takes: JSON merge patch (RFC 7386)
//! and JSON patch (RFC 6902, with `test`). Strategic merge patch is taken
//! as a merge patch on built-in kinds and refused on custom resources (see
//! the PATCH handler).
//!
//! kube-apiserver answers a JSON patch that does not decode `400 BadRequest`
//! and one whose operations fail (a `test` that does not hold, a path that
//! is not there) `422` (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go,
//! `jsonPatcher.applyJSPatch`).

use serde_json::{Value, json};

use super::apiserver::ApiError;

/// A PATCH body by its content type.
pub enum Patch {
    Merge(Value),
    Json(Value),
}

impl Patch {
    /// `target` with the patch applied.
    pub fn apply(&self, target: &Value) -> Result<Value, ApiError> {
        let mut patched = target.clone();
        match self {
            Self::Merge(patch) => merge_patch(&mut patched, patch),
            Self::Json(ops) => {
                let ops = ops.as_array().ok_or_else(|| {
                    ApiError::new(400, "BadRequest", "a JSON patch is an array of operations")
                })?;
                for op in ops {
                    json_patch_op(&mut patched, op)?;
                }
            }
        }
        Ok(patched)
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn json_patch_op(target: &mut Value, op: &Value) -> Result<(), ApiError> {
    let field = |name: &str| {
        op[name].as_str().ok_or_else(|| {
            ApiError::new(400, "BadRequest", format!("operation lacks {name:?}: {op}"))
        })
    };
    let failed = |message: String| ApiError::new(422, "Invalid", message);
    let path = field("path")?;
    let value = || {
        op.get("value").cloned().ok_or_else(|| {
            ApiError::new(
                400,
                "BadRequest",
                format!("operation lacks \"value\": {op}"),
            )
        })
    };
    match field("op")? {
        "test" => {
            let found = target.pointer(path);
            if found != Some(&value()?) {
                return Err(failed(format!("testing value {path} failed")));
            }
        }
        "add" => add(target, path, value()?).map_err(failed)?,
        "remove" => {
            remove(target, path).map_err(failed)?;
        }
        "replace" => {
            remove(target, path).map_err(failed)?;
            add(target, path, value()?).map_err(failed)?;
        }
        "move" => {
            let moved = remove(target, field("from")?).map_err(failed)?;
            add(target, path, moved).map_err(failed)?;
        }
        "copy" => {
            let from = field("from")?;
            let copied = target
                .pointer(from)
                .cloned()
                .ok_or_else(|| failed(format!("copy from {from}: no such path")))?;
            add(target, path, copied).map_err(failed)?;
        }
        other => {
            return Err(ApiError::new(
                400,
                "BadRequest",
                format!("unexpected operation {other:?}"),
            ));
        }
    }
    Ok(())
}

/// The parent's pointer and the last token, unescaped (RFC 6901).
fn split(path: &str) -> Result<(&str, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("{path:?} is not a JSON pointer"))?;
    Ok((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn add(target: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = value;
        return Ok(());
    }
    let (parent, last) = split(path)?;
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(last, value);
            Ok(())
        }
        Some(Value::Array(items)) => {
            let at = if last == "-" {
                items.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|&i| i <= items.len())
                    .ok_or_else(|| format!("add at {path}: index out of range"))?
            };
            items.insert(at, value);
            Ok(())
        }
        _ => Err(format!("add at {path}: the parent is missing")),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split(path)?;
    let gone = || format!("remove at {path}: no such path");
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => map.remove(&last).ok_or_else(gone),
        Some(Value::Array(items)) => match last.parse::<usize>() {
            Ok(i) if i < items.len() => Ok(items.remove(i)),
            _ => Err(gone()),
        },
        _ => Err(gone()),
    }
}
