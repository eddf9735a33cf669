//! Pruning, as kube-apiserver does it for custom resources: a field the
//! CRD's structural schema does not declare is dropped from the write (the
//! default, `fieldValidation=Warn`, and `Ignore`) or refuses it
//! (`fieldValidation=Strict`). apiextensions-apiserver's
//! `pkg/apiserver/schema/pruning`: apiVersion, kind and metadata are kept
//! at the root, `x-kubernetes-preserve-unknown-fields` keeps what is under
//! it, and arrays are pruned item by item. The fake prunes CRRs only: the
//! agent writes every other kind through typed structs.
//!
//! The schema is crr-proxy's CRD (`crr_proxy::crr::crd`), and for
//! OpenKruise v1.9's CRD (a v1alpha1-only cluster) the same less the fields
//! that one lacks: tests/real/kruise.rs holds both to kruise's CRD as a real
//! kube-apiserver serves it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;

use super::ApiError;

/// What a request's `fieldValidation` asks for unknown fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them (Ignore and Warn; the fake sends no warnings).
    Drop,
    /// Refuse the write.
    Strict,
}

impl FieldValidation {
    pub fn from_query(value: Option<&str>) -> Self {
        match value {
            Some("Strict") => FieldValidation::Strict,
            _ => FieldValidation::Drop,
        }
    }
}

/// The fields crr-proxy's CRD declares and OpenKruise v1.9's does not, in
/// every version (k8s-openapi's HTTPGetAction is newer than the one kruise
/// generated its CRD from).
pub const KRUISE_V1_9_LACKS: &[&str] = &[".spec.containers[].preStop.httpGet.protocol"];

/// Whose CRD the cluster has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crd {
    /// crr-proxy's, or OpenKruise master's.
    Ours,
    /// OpenKruise v1.9's.
    KruiseV1_9,
}

/// The openAPIV3Schema of each CRR version in `crd`.
fn schemas(crd: Crd) -> &'static BTreeMap<String, Value> {
    static OURS: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    static KRUISE: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    let ours = || {
        let crd = crr_proxy::crr::crd().expect("crr-proxy's CRD");
        crd.spec
            .versions
            .into_iter()
            .map(|v| {
                let schema = v
                    .schema
                    .and_then(|s| s.open_api_v3_schema)
                    .map(|s| serde_json::to_value(s).expect("a schema is JSON"))
                    .unwrap_or(Value::Null);
                (v.name, schema)
            })
            .collect::<BTreeMap<_, _>>()
    };
    match crd {
        Crd::Ours => OURS.get_or_init(ours),
        Crd::KruiseV1_9 => KRUISE.get_or_init(|| {
            let mut schemas = ours();
            for schema in schemas.values_mut() {
                for path in KRUISE_V1_9_LACKS {
                    undeclare(schema, path);
                }
            }
            schemas
        }),
    }
}

/// Removes the field at `path` (`.a.b[].c`) from `schema`.
fn undeclare(schema: &mut Value, path: &str) {
    let mut at = schema;
    let mut steps = path.trim_start_matches('.').split('.').peekable();
    while let Some(step) = steps.next() {
        let (name, items) = match step.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (step, false),
        };
        let Some(properties) = at.get_mut("properties").and_then(Value::as_object_mut) else {
            return;
        };
        if steps.peek().is_none() {
            properties.remove(name);
            return;
        }
        let Some(next) = properties.get_mut(name) else {
            return;
        };
        at = if items {
            match next.get_mut("items") {
                Some(items) => items,
                None => return,
            }
        } else {
            next
        };
    }
}

/// How a write carries the object, which decides how kube-apiserver words
/// a strict refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// A body that is the object (create, update).
    Object,
    /// A patch, decoded once applied.
    Patch,
}

/// Prunes the CRR `obj`, written as `version`, by that version's schema in `crd`;
/// under Strict, refuses it instead when anything would go, in the words
/// kube-apiserver v1.37 used in tests/apiserver.rs: a body that does not
/// decode is a 400, a patch that does not is an invalid (422) patch.
pub fn prune_crr(
    obj: &mut Value,
    crd: Crd,
    version: &str,
    validation: FieldValidation,
    write: Write,
) -> Result<(), ApiError> {
    let Some(schema) = schemas(crd).get(version) else {
        return Ok(());
    };
    // Only a strict refusal of a patch quotes the object as written.
    let written = (validation == FieldValidation::Strict).then(|| obj.clone());
    let Some(fields) = obj.as_object_mut() else {
        return Ok(());
    };
    let mut unknown = Vec::new();
    let properties = schema.get("properties").and_then(Value::as_object);
    fields.retain(|key, value| {
        if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            return true;
        }
        match properties.and_then(|p| p.get(key)) {
            Some(field) => {
                prune(value, field, key, &mut unknown);
                true
            }
            None => {
                unknown.push(key.clone());
                false
            }
        }
    });
    if validation == FieldValidation::Drop || unknown.is_empty() {
        return Ok(());
    }
    let fields: Vec<String> = unknown
        .iter()
        .map(|path| format!("unknown field \"{path}\""))
        .collect();
    let error = format!("strict decoding error: {}", fields.join(", "));
    Err(match write {
        Write::Object => ApiError::new(
            400,
            "BadRequest",
            format!(
                "ContainerRecreateRequest in version \"{version}\" cannot be handled as a \
                 ContainerRecreateRequest: {error}"
            ),
        ),
        Write::Patch => {
            let written = written.unwrap_or_default().to_string();
            let quoted = serde_json::to_string(&written).unwrap_or_default();
            ApiError::new(
                422,
                "Invalid",
                format!(" \"\" is invalid: patch: Invalid value: {quoted}: {error}"),
            )
        }
    })
}

/// Drops from `value` what `schema` does not declare, noting each dropped
/// field's path under `path`.
fn prune(value: &mut Value, schema: &Value, path: &str, unknown: &mut Vec<String>) {
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            fields.retain(|key, field| {
                let at = format!("{path}.{key}");
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(declared), _) | (None, Some(declared)) => {
                        prune(field, declared, &at, unknown);
                        true
                    }
                    (None, None) if preserve => true,
                    (None, None) => {
                        unknown.push(at);
                        false
                    }
                }
            });
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (i, value) in items.iter_mut().enumerate() {
                    prune(value, item, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}
