//! Who may do what: the bearer tokens and who they authenticate, RBAC
//! grants, and for kubelet's identity the Node authorizer and the
//! NodeRestriction admission plugin, as kube-apiserver's
//! `--authorization-mode=Node,RBAC` with NodeRestriction decides.

use super::*;

impl FakeApiServer {
    /// From now on `user` may do only what `rules` (a ClusterRole's
    /// `rules`, bound cluster-wide) allow; discovery stays open to all, as
    /// `system:discovery` keeps it. Users never granted anything are not
    /// checked (the tests' own clients act as cluster admins).
    pub fn grant(&self, user: &str, rules: &Value) {
        let rules = rules.as_array().cloned().unwrap_or_default();
        lock(&self.inner.grants).insert(user.to_owned(), rules);
    }

    /// Authorization as kube-apiserver's `--authorization-mode=Node,RBAC`
    /// does it (the union: the first authorizer with an opinion decides,
    /// `staging/src/k8s.io/apiserver/pkg/authorization/union/union.go`),
    /// then, for a kubelet's writes, the NodeRestriction admission plugin:
    /// 403 with the API server's message unless allowed.
    pub(super) fn authorize(&self, access: &Access<'_>) -> Result<(), ApiError> {
        let Ok(Some(user)) = CALLER.try_with(Clone::clone) else {
            return Ok(());
        };
        let node = user
            .username
            .strip_prefix("system:node:")
            .filter(|_| user.groups.iter().any(|g| g == "system:nodes"));
        if let Some(node) = node {
            self.node_restriction(node, access)?;
            if self.node_authorizer(node, access) {
                return Ok(());
            }
        }
        let grants = lock(&self.inner.grants);
        let Some(rules) = grants.get(&user.username) else {
            return Ok(());
        };
        let group = access.group();
        let resource = access.resource();
        let verb = access.verb;
        let has = |rule: &Value, field: &str, want: &str| {
            rule[field]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == want || v == "*"))
        };
        if rules.iter().any(|r| {
            has(r, "apiGroups", group) && has(r, "resources", &resource) && has(r, "verbs", verb)
        }) {
            return Ok(());
        }
        let qualified = if group.is_empty() {
            resource.clone()
        } else {
            format!("{resource}.{group}")
        };
        let object = access.name.map(|n| format!(" {n:?}")).unwrap_or_default();
        let scope = match access.namespace {
            Some(ns) => format!(" in the namespace {ns:?}"),
            None => " at the cluster scope".to_owned(),
        };
        Err(ApiError::new(
            403,
            "Forbidden",
            format!(
                "{qualified}{object} is forbidden: User {:?} cannot {verb} resource {:?} in API group {group:?}{scope}",
                user.username, resource
            ),
        ))
    }

    /// The Node authorizer's allowances for kubelet `node`, of those a
    /// crr-proxy under kubelet's identity meets
    /// (`plugin/pkg/auth/authorizer/node/node_authorizer.go`,
    /// `NodeAuthorizer.Authorize`; the static rules are `NodeRules` in
    /// `plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`). `false`
    /// is its NoOpinion: RBAC decides.
    fn node_authorizer(&self, node: &str, access: &Access<'_>) -> bool {
        let verb = access.verb;
        match (access.group(), access.resource().as_str()) {
            // authorizePod: a get only of a Pod bound to the node; a list
            // or watch only with fieldSelector spec.nodeName=<node>
            // (AuthorizeNodeWithSelectors, on by default since 1.32).
            ("", "pods") => match verb {
                "get" => self.pod_bound_to(node, access) == Some(true),
                "list" | "watch" => {
                    access.field_selector == Some(format!("spec.nodeName={node}").as_str())
                }
                _ => false,
            },
            // NodeRules; NodeRestriction narrows it to the node's own Pods.
            ("", "pods/status") => matches!(verb, "update" | "patch"),
            // NodeRules: core Events only, not events.k8s.io's.
            ("", "events") => matches!(verb, "create" | "update" | "patch"),
            // authorizeLease: the node's own Lease in kube-node-lease.
            ("coordination.k8s.io", "leases") => {
                access.namespace == Some("kube-node-lease")
                    && (verb == "create" || access.name == Some(node))
            }
            // authorizeNode: its own Node object.
            ("", "nodes") => matches!(verb, "get" | "list" | "watch") && access.name == Some(node),
            _ => false,
        }
    }

    /// Whether the Pod `access` names is bound to `node`; `None` when there
    /// is no such Pod.
    fn pod_bound_to(&self, node: &str, access: &Access<'_>) -> Option<bool> {
        let pod = self.get(Resource::Pod, access.namespace.unwrap_or(""), access.name?)?;
        Some(pod["spec"]["nodeName"] == node)
    }

    /// The NodeRestriction admission plugin, for the writes a crr-proxy
    /// under kubelet's identity could try
    /// (`plugin/pkg/admission/noderestriction/admission.go`, `Admit`):
    /// the status only of the node's own Pods (`admitPodStatus`), Leases
    /// only in kube-node-lease and only its own (`admitLease`).
    fn node_restriction(&self, node: &str, access: &Access<'_>) -> Result<(), ApiError> {
        if matches!(access.verb, "get" | "list" | "watch") {
            return Ok(());
        }
        let forbidden = |message: String| Err(ApiError::new(403, "Forbidden", message));
        match (access.group(), access.resource().as_str()) {
            ("", "pods/status") => {
                if self.pod_bound_to(node, access) == Some(false) {
                    return forbidden(format!(
                        "node {node:?} can only update pod status for pods with their spec.nodeName set to itself"
                    ));
                }
                Ok(())
            }
            ("coordination.k8s.io", "leases") => {
                if access.namespace != Some("kube-node-lease") {
                    return forbidden(format!(
                        "can only access leases in the \"kube-node-lease\" namespace, not {:?}",
                        access.namespace.unwrap_or("")
                    ));
                }
                if access.verb != "create" && access.name != Some(node) {
                    return forbidden(
                        "can only access node lease with the same name as the requesting node"
                            .into(),
                    );
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Makes SelfSubjectAccessReviews deny `rule` ("verb resource[/sub]").
    pub fn deny(&self, rule: &str) {
        lock(&self.inner.denied).push(rule.to_owned());
    }

    /// Authenticates `token` as `user`.
    pub fn add_user(&self, token: &str, user: UserInfo) {
        lock(&self.inner.users).insert(token.to_owned(), user);
    }

    /// `token` authenticates no one from now on (a revoked credential, an
    /// expired certificate): 401.
    #[allow(dead_code)] // each test binary uses a different part
    pub fn remove_user(&self, token: &str) {
        lock(&self.inner.users).remove(token);
    }
}

/// What a request asks to do, as an authorizer sees it.
pub(in crate::support) struct Access<'a> {
    pub verb: &'a str,
    pub group_version: &'a str,
    pub plural: &'a str,
    pub subresource: Option<&'a str>,
    pub name: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub field_selector: Option<&'a str>,
}

impl Access<'_> {
    fn group(&self) -> &str {
        self.group_version.rsplit_once('/').map_or("", |(g, _)| g)
    }

    /// `plural`, or `plural/subresource`.
    fn resource(&self) -> String {
        match self.subresource {
            Some(sub) => format!("{}/{sub}", self.plural),
            None => self.plural.to_owned(),
        }
    }
}
