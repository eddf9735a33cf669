//! ValidatingAdmissionPolicies for the fake API server, evaluated with a real
//! CEL interpreter, so that the policies in `deploy/` are tested as written.
//!
//! It follows the API server's order: match constraints (group, resource
//! with subresource, operation), then matchConditions (all must hold), then
//! variables (each may use the earlier ones), then validations; with
//! `failurePolicy: Fail`, an expression that errors denies the request; the
//! first validation that fails is reported, with its messageExpression when
//! that evaluates to a string, else its message. A
//! policy acts only when a binding with `validationActions: [Deny]` names it.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::apiserver::ApiError;

/// Who sends a request, as the authenticator tells the API server.
#[derive(Clone, Debug, Serialize)]
pub struct UserInfo {
    pub username: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The identity `scripts/node-identity.sh` issues for `node`.
    pub fn node(node: &str) -> Self {
        Self {
            username: format!("crr-proxy:node:{node}"),
            groups: vec!["crr-proxy:nodes".into(), "system:authenticated".into()],
        }
    }

    /// kubelet's identity on `node` (its client certificate's subject).
    #[allow(dead_code)] // each test binary uses a different part
    pub fn kubelet(node: &str) -> Self {
        Self {
            username: format!("system:node:{node}"),
            groups: vec!["system:nodes".into(), "system:authenticated".into()],
        }
    }
}

/// The admission attributes of one write.
pub struct Attributes<'a> {
    /// CREATE, UPDATE or DELETE.
    pub operation: &'static str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    pub user: &'a UserInfo,
    /// A policy's parameter object: by kind, namespace and name.
    pub params: &'a dyn Fn(&str, &str, &str) -> Option<Value>,
}

/// A binding's `paramRef`, for a policy with a `paramKind`.
struct ParamRef {
    kind: String,
    namespace: String,
    name: String,
    /// `parameterNotFoundAction: Deny` (else Allow: the policy is skipped).
    deny_if_missing: bool,
}

struct Rule {
    groups: Vec<String>,
    operations: Vec<String>,
    resources: Vec<String>,
}

struct Validation {
    program: cel::Program,
    message: String,
    /// Evaluated for the message when set; `message` if it fails.
    message_expression: Option<cel::Program>,
    reason: String,
}

pub struct Policy {
    name: String,
    binding: String,
    params: Option<ParamRef>,
    rules: Vec<Rule>,
    conditions: Vec<cel::Program>,
    variables: Vec<(String, cel::Program)>,
    validations: Vec<Validation>,
}

/// Loads the bound policies of a multi-document manifest. Panics on a
/// manifest the API server would refuse (an expression that does not
/// compile, a policy without a Deny binding), as that is a defect.
pub fn load(manifest: &str) -> Vec<Policy> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(manifest).expect("policy manifest is YAML");
    let bindings: HashMap<&str, &Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .filter(|d| {
            d["spec"]["validationActions"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "Deny"))
        })
        .filter_map(|d| Some((d["spec"]["policyName"].as_str()?, d)))
        .collect();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let compile = |source: &str| {
        cel::Program::compile(source).unwrap_or_else(|e| panic!("CEL {source:?}: {e}"))
    };
    docs.iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .map(|d| {
            let name = d["metadata"]["name"]
                .as_str()
                .expect("policy name")
                .to_owned();
            let binding = bindings
                .get(name.as_str())
                .unwrap_or_else(|| panic!("policy {name} has no Deny binding"));
            assert_eq!(d["spec"]["failurePolicy"], "Fail", "policy {name}");
            let spec = &d["spec"];
            let param_ref = &binding["spec"]["paramRef"];
            let params = spec["paramKind"]["kind"].as_str().map(|kind| {
                let text = |field: &str| {
                    param_ref[field]
                        .as_str()
                        .unwrap_or_else(|| panic!("policy {name}: paramRef.{field}"))
                        .to_owned()
                };
                ParamRef {
                    kind: kind.to_owned(),
                    namespace: text("namespace"),
                    name: text("name"),
                    deny_if_missing: text("parameterNotFoundAction") == "Deny",
                }
            });
            let binding = binding["metadata"]["name"]
                .as_str()
                .expect("binding name")
                .to_owned();
            Policy {
                params,
                rules: spec["matchConstraints"]["resourceRules"]
                    .as_array()
                    .expect("resourceRules")
                    .iter()
                    .map(|r| Rule {
                        groups: strings(&r["apiGroups"]),
                        operations: strings(&r["operations"]),
                        resources: strings(&r["resources"]),
                    })
                    .collect(),
                conditions: spec["matchConditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| compile(c["expression"].as_str().expect("matchCondition expression")))
                    .collect(),
                variables: spec["variables"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| {
                        let name = v["name"].as_str().expect("variable name").to_owned();
                        (
                            name,
                            compile(v["expression"].as_str().expect("variable expression")),
                        )
                    })
                    .collect(),
                validations: spec["validations"]
                    .as_array()
                    .expect("validations")
                    .iter()
                    .map(|v| Validation {
                        program: compile(v["expression"].as_str().expect("validation expression")),
                        message: v["message"]
                            .as_str()
                            .unwrap_or("failed expression")
                            .to_owned(),
                        message_expression: v["messageExpression"].as_str().map(compile),
                        reason: v["reason"].as_str().unwrap_or("Invalid").to_owned(),
                    })
                    .collect(),
                name,
                binding,
            }
        })
        .collect()
}

impl Policy {
    fn matches(&self, attrs: &Attributes<'_>) -> bool {
        let resource = if attrs.subresource.is_empty() {
            attrs.resource.to_owned()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
        self.rules.iter().any(|r| {
            any(&r.groups, attrs.group)
                && any(&r.operations, attrs.operation)
                && any(&r.resources, &resource)
        })
    }

    /// `Err` when the policy denies the request.
    pub fn admit(&self, attrs: &Attributes<'_>) -> Result<(), ApiError> {
        if !self.matches(attrs) {
            return Ok(());
        }
        let mut context = cel::Context::default();
        let request = json!({
            "operation": attrs.operation,
            "userInfo": attrs.user,
            "resource": {"group": attrs.group, "resource": attrs.resource},
            "subResource": attrs.subresource,
            "namespace": attrs.namespace,
            "name": attrs.name,
        });
        let bind = |context: &mut cel::Context<'_, '_>, name: &str, value: &Value| {
            context
                .add_variable(name, value)
                .unwrap_or_else(|e| panic!("bind {name}: {e}"));
        };
        bind(&mut context, "request", &request);
        bind(&mut context, "object", attrs.object.unwrap_or(&Value::Null));
        bind(
            &mut context,
            "oldObject",
            attrs.old_object.unwrap_or(&Value::Null),
        );
        let deny = |reason: &str, message: &str| {
            let what = if attrs.group.is_empty() {
                attrs.resource.to_owned()
            } else {
                format!("{}.{}", attrs.resource, attrs.group)
            };
            let reason: &'static str = if reason == "Forbidden" {
                "Forbidden"
            } else {
                "Invalid"
            };
            Err(ApiError::new(
                if reason == "Forbidden" { 403 } else { 422 },
                reason,
                format!(
                    "{what} {:?} is forbidden: ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {message}",
                    attrs.name, self.name, self.binding
                ),
            ))
        };
        // The binding's parameter first, then the match conditions, as
        // kube-apiserver's dispatcher does: a missing parameter under
        // `Deny` refuses every request the policy matches, whoever sends
        // it (a configuration error, 422, under failurePolicy Fail; seen on
        // a real kube-apiserver v1.37).
        if let Some(param) = &self.params {
            match (attrs.params)(&param.kind, &param.namespace, &param.name) {
                Some(value) => bind(&mut context, "params", &value),
                None if param.deny_if_missing => {
                    return deny(
                        "Invalid",
                        "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction",
                    );
                }
                None => return Ok(()),
            }
        }
        for condition in &self.conditions {
            match condition.execute(&context) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => return Ok(()),
                other => return deny("Forbidden", &format!("matchCondition: {other:?}")),
            }
        }
        let mut variables: HashMap<String, cel::Value> = HashMap::new();
        for (name, program) in &self.variables {
            context.add_variable_from_value("variables", variables.clone());
            match program.execute(&context) {
                Ok(value) => {
                    variables.insert(name.clone(), value);
                }
                Err(e) => return deny("Forbidden", &format!("variables.{name}: {e}")),
            }
        }
        context.add_variable_from_value("variables", variables);
        for validation in &self.validations {
            match validation.program.execute(&context) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => {
                    let message = validation
                        .message_expression
                        .as_ref()
                        .and_then(|m| match m.execute(&context) {
                            Ok(cel::Value::String(text)) => Some(text.to_string()),
                            _ => None,
                        })
                        .unwrap_or_else(|| validation.message.clone());
                    return deny(&validation.reason, &message);
                }
                other => return deny("Forbidden", &format!("expression: {other:?}")),
            }
        }
        Ok(())
    }
}

/// The rules of the ClusterRoles that `manifests` binds to `group`.
#[allow(dead_code)] // each test binary uses a different part
pub fn rules_bound_to(manifests: &str, group: &str) -> Value {
    let docs: Vec<Value> = serde_saphyr::from_multiple(manifests).unwrap();
    let bound: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .filter(|d| {
            d["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["name"] == group)
        })
        .map(|d| d["roleRef"]["name"].as_str().unwrap())
        .collect();
    let rules: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .filter(|d| bound.contains(&d["metadata"]["name"].as_str().unwrap()))
        .flat_map(|d| d["rules"].as_array().unwrap().clone())
        .collect();
    Value::Array(rules)
}
