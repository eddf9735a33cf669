//! Label and field selectors as kube-apiserver parses and matches them, for
//! the fake API server's lists and watches.

use serde_json::Value;

use super::apiserver::Resource;

/// Label and field selectors, as in `?labelSelector=` and `?fieldSelector=`,
/// parsed by kube-apiserver's rules (see `parse_labels` and
/// `selectable_fields`): a selector the real server refuses is refused here.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

#[derive(Clone, Debug)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Selector {
    /// A request's selectors for `resource`; `Err` is the message of the
    /// real server's 400 BadRequest.
    pub fn parse(
        resource: Resource,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Self, String> {
        Ok(Self {
            labels: labels.map(parse_labels).transpose()?.unwrap_or_default(),
            fields: fields
                .map(|f| parse_fields(resource, f))
                .transpose()?
                .unwrap_or_default(),
        })
    }

    /// A label selector the tests write themselves.
    pub fn labels(labels: &str) -> Self {
        Self {
            labels: parse_labels(labels).expect("a valid label selector"),
            fields: Vec::new(),
        }
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let label = |key: &str| {
            obj.pointer("/metadata/labels")
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        // A field the object lacks selects as "" (the real server's
        // fields.Set holds every selectable field, empty or not).
        let field = |key: &str| {
            let pointer = format!("/{}", key.replace('.', "/"));
            let value = match obj.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                _ => String::new(),
            };
            Some(value)
        };
        self.labels.iter().all(|r| r.matches(label)) && self.fields.iter().all(|r| r.matches(field))
    }
}

impl Requirement {
    fn matches(&self, value: impl Fn(&str) -> Option<String>) -> bool {
        match self {
            Requirement::Equals(k, v) => value(k).as_deref() == Some(v.as_str()),
            Requirement::NotEquals(k, v) => value(k).as_deref() != Some(v.as_str()),
            Requirement::In(k, vs) => value(k).is_some_and(|v| vs.contains(&v)),
            Requirement::NotIn(k, vs) => value(k).is_none_or(|v| !vs.contains(&v)),
            Requirement::Exists(k) => value(k).is_some(),
            Requirement::NotExists(k) => value(k).is_none(),
        }
    }
}

/// Splits at the commas between requirements, not those inside `( )`.
fn requirements(text: &str) -> Vec<&str> {
    let (mut out, mut depth, mut from) = (Vec::new(), 0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(text[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(text[from..].trim());
    out.into_iter().filter(|r| !r.is_empty()).collect()
}

/// A label key as apimachinery's validation takes it: an optional DNS
/// subdomain prefix and a name of at most 63 characters.
fn valid_key(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(_, name)| name);
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(ok)
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn valid_value(value: &str) -> bool {
    value.is_empty() || valid_key(value) && !value.contains('/')
}

/// A label selector by apimachinery's parser
/// (staging/src/k8s.io/apimachinery/pkg/labels/selector.go, `Parse`):
/// equality (`=`, `==`, `!=`), set-based (`in`, `notin`), existence (`key`,
/// `!key`); its errors start as the real ones do.
fn parse_labels(text: &str) -> Result<Vec<Requirement>, String> {
    let invalid = |what: &str| format!("unable to parse requirement: {what}");
    requirements(text)
        .into_iter()
        .map(|r| {
            let set = |op: &str| -> Option<(String, Result<Vec<String>, String>)> {
                let (key, rest) = r.split_once(op)?;
                let rest = rest.trim();
                let values = rest
                    .strip_prefix('(')
                    .and_then(|v| v.strip_suffix(')'))
                    .map(|v| v.split(',').map(|v| v.trim().to_owned()).collect::<Vec<_>>())
                    .ok_or_else(|| invalid(&format!("found '{rest}', expected: '('")));
                Some((key.trim().to_owned(), values))
            };
            let requirement = if let Some((key, values)) = set(" notin ") {
                Requirement::NotIn(key, values?)
            } else if let Some((key, values)) = set(" in ") {
                Requirement::In(key, values?)
            } else if let Some((k, v)) = r.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some(k) = r.strip_prefix('!') {
                Requirement::NotExists(k.trim().into())
            } else {
                Requirement::Exists(r.into())
            };
            let (key, values): (&str, Vec<&str>) = match &requirement {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, vec![v]),
                // `()` is the set of the empty value, not an empty set: a
                // real kube-apiserver v1.37 answers `node in ()` with the
                // objects whose label is empty (tests/apiserver.rs).
                Requirement::In(k, vs) | Requirement::NotIn(k, vs) => {
                    (k, vs.iter().map(String::as_str).collect())
                }
                Requirement::Exists(k) | Requirement::NotExists(k) => (k, vec![]),
            };
            if !valid_key(key) {
                return Err(invalid(&format!("key: Invalid value: {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.'")));
            }
            if let Some(bad) = values.iter().find(|v| !valid_value(v)) {
                return Err(invalid(&format!("values[0][{key}]: Invalid value: {bad:?}")));
            }
            Ok(requirement)
        })
        .collect()
}

/// The fields kube-apiserver lets a selector name, beyond `metadata.name`
/// and `metadata.namespace` (generic.ObjectMetaFieldsSet, which every kind
/// has):
/// - Pods: pkg/registry/core/pod/strategy.go, `ToSelectableFields`;
/// - Nodes: pkg/registry/core/node/strategy.go, `NodeToSelectableFields`;
/// - core Events: pkg/registry/core/event/strategy.go, `ToSelectableFields`;
/// - events.k8s.io Events: pkg/apis/events/v1/conversion.go, which maps
///   `regarding.*` and `reportingController` onto the core fields;
/// - ReplicaSets: pkg/registry/apps/replicaset/strategy.go, `ReplicaSetToSelectableFields`;
/// - custom resources (CRRs, Kruise's workloads): only the two, since their
///   CRDs declare no `selectableFields`
///   (staging/src/k8s.io/apiextensions-apiserver/pkg/registry/customresource/strategy.go, `GetAttrs`);
/// - the rest (Leases, Deployments, StatefulSets, DaemonSets, PDBs): only the two.
fn selectable_fields(resource: Resource) -> &'static [&'static str] {
    match resource {
        Resource::Pod => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ],
        Resource::Node => &["spec.unschedulable"],
        Resource::CoreEvent => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        Resource::Event => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
        Resource::ReplicaSet => &["status.replicas"],
        _ => &[],
    }
}

/// A field selector by staging/src/k8s.io/apimachinery/pkg/fields/selector.go
/// (`ParseSelector`: `=`, `==`, `!=` only), each field one the kind lets a
/// selector name; else the real server's message.
fn parse_fields(resource: Resource, text: &str) -> Result<Vec<Requirement>, String> {
    requirements(text)
        .into_iter()
        .map(|r| {
            let (key, value, equal) = if let Some((k, v)) = r.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
                (k, v, true)
            } else {
                return Err(format!("invalid selector: '{r}'; can't understand '{r}'"));
            };
            let (key, value) = (key.trim().to_owned(), value.trim().to_owned());
            let known = ["metadata.name", "metadata.namespace"].contains(&key.as_str())
                || selectable_fields(resource).contains(&key.as_str());
            if !known {
                return Err(format!("field label not supported: {key}"));
            }
            let requirement = match equal {
                true => Requirement::Equals(key, value),
                false => Requirement::NotEquals(key, value),
            };
            Ok(requirement)
        })
        .collect()
}
