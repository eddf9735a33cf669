//! The fake's answers that are no object of the store: the version,
//! access and self reviews, a node's proxy (kubelet's `/configz`) and
//! discovery. None is authorized or logged, as in the fake so far.

use super::*;

impl FakeApiServer {
    /// The answer of an endpoint of the cluster itself at `path`; `None`
    /// for an object request.
    pub(super) fn cluster_endpoint(
        &self,
        method: &Method,
        path: &[&str],
        body: &Bytes,
    ) -> Option<Result<Response<BoxBody<Bytes, Infallible>>, ApiError>> {
        let review =
            |group: &str, kind: &str| method == Method::POST && path == ["apis", group, "v1", kind];
        Some(match path {
            ["version"] => Ok(respond(200, &version())),
            _ if review("authorization.k8s.io", "selfsubjectaccessreviews") => {
                self.access_review(body)
            }
            _ if review("authentication.k8s.io", "selfsubjectreviews") => Ok(self_review()),
            ["api", "v1", "nodes", node, "proxy", rest @ ..] => self.node_proxy(method, node, rest),
            ["api"] => Ok(self.root_discovery(true)),
            ["apis"] => Ok(self.root_discovery(false)),
            ["api", "v1"] => self.discovery("v1"),
            ["apis", group, version] => self.discovery(&format!("{group}/{version}")),
            _ => return None,
        })
    }

    /// A SelfSubjectAccessReview, answered by the same authorizers as the
    /// request it describes would be, and the rules a test denied.
    fn access_review(
        &self,
        body: &Bytes,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let mut review: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))?;
        let attributes = &review["spec"]["resourceAttributes"];
        let mut rule = format!(
            "{} {}",
            attributes["verb"].as_str().unwrap_or(""),
            attributes["resource"].as_str().unwrap_or("")
        );
        if let Some(sub) = attributes["subresource"].as_str().filter(|s| !s.is_empty()) {
            rule = format!("{rule}/{sub}");
        }
        // Answered by the same authorizers as the request would be.
        let group = attributes["group"].as_str().unwrap_or("");
        let group_version = if group.is_empty() {
            "v1".to_owned()
        } else {
            format!("{group}/v1")
        };
        let as_request = self
            .authorize(&Access {
                verb: attributes["verb"].as_str().unwrap_or(""),
                group_version: &group_version,
                plural: attributes["resource"].as_str().unwrap_or(""),
                subresource: attributes["subresource"].as_str().filter(|s| !s.is_empty()),
                name: attributes["name"].as_str().filter(|s| !s.is_empty()),
                namespace: attributes["namespace"].as_str().filter(|s| !s.is_empty()),
                field_selector: attributes["fieldSelector"]["rawSelector"].as_str(),
            })
            .is_ok();
        let allowed = as_request && !lock(&self.inner.denied).contains(&rule);
        review["status"] = json!({"allowed": allowed});
        Ok(respond(201, &review))
    }
}

fn version() -> Value {
    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "fake",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64"})
}

/// A SelfSubjectReview: the caller, or the admin for a caller without a
/// token.
fn self_review() -> Response<BoxBody<Bytes, Infallible>> {
    let user = CALLER
        .try_with(Clone::clone)
        .ok()
        .flatten()
        .unwrap_or(UserInfo {
            username: "kubernetes-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        });
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                        "metadata": {"creationTimestamp": null}, "status": {"userInfo": user}});
    respond(201, &review)
}
