//! The cluster objects crr-proxy needs, as `deploy/` holds them for
//! `kubectl apply -k`, rendered for the Lease a cluster is configured with.
//!
//! The files in `deploy/` are the rendering for the default Lease: they are
//! the source, embedded here, and another Lease's name and namespace take
//! the place of the defaults wherever they appear as a whole name. The
//! defaults are names nothing else in those files uses, and a unit test
//! holds the rendering to changing exactly the Lease's fields.
//!
//! Rendered for kubelet's identity (`--identity kubelet`), the same objects
//! name kubelet's user and group instead of crr-proxy's own, and leave out
//! what Node authorization and the NodeRestriction admission plugin already
//! do for a kubelet: reads of its own Pods, and the writes of its Pods'
//! status.

/// The standalone Lease's name unless `--lease-name` says otherwise.
pub const DEFAULT_LEASE_NAME: &str = "crr-proxy-claimer";

/// The standalone Lease's namespace unless `--lease-namespace` says
/// otherwise: one of crr-proxy's own, so that a node's right to create a
/// Lease there reaches nothing another component reads.
pub const DEFAULT_LEASE_NAMESPACE: &str = "crr-proxy-system";

/// Which agent mode's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlay {
    /// `--agent kruise`: next to OpenKruise, which brings the CRD.
    Kruise,
    /// `--agent standalone`: the CRD, the Lease's namespace and the
    /// standalone checks too.
    Standalone,
}

/// Whose credentials each node's crr-proxy presents to the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Identity {
    /// Its own per-node identity, which `scripts/node-identity.sh` issues:
    /// user `crr-proxy:node:<node>`, group `crr-proxy:nodes`.
    #[default]
    Own,
    /// kubelet's (kubeadm's `/etc/kubernetes/kubelet.conf` and the client
    /// certificate kubelet rotates): user `system:node:<node>`, group
    /// `system:nodes`. Kruise mode only.
    Kubelet,
}

impl Identity {
    /// The group every node's identity is in.
    pub fn group(self) -> &'static str {
        match self {
            Self::Own => "crr-proxy:nodes",
            Self::Kubelet => "system:nodes",
        }
    }

    /// A node's user name is this followed by the node's name.
    pub fn user_prefix(self) -> &'static str {
        match self {
            Self::Own => "crr-proxy:node:",
            Self::Kubelet => "system:node:",
        }
    }
}

/// The objects a kubelet's identity does without, as (kind, name): Node
/// authorization lets a node get its own Pods and list and watch them with
/// `fieldSelector=spec.nodeName=<node>` (`plugin/pkg/auth/authorizer/node/
/// node_authorizer.go`, `authorizePod`), so binding `crr-proxy-kruise-pods`
/// to `system:nodes` would only let every kubelet read every Pod;
/// NodeRestriction lets a node write the status of its own Pods only
/// (`plugin/pkg/admission/noderestriction/admission.go`, `admitPodStatus`);
/// and a policy on Lease writes by `system:nodes` would stand in the way of
/// every kubelet's heartbeat in kube-node-lease.
const KUBELET_HAS: [(&str, &str); 6] = [
    ("ClusterRole", "crr-proxy-kruise-pods"),
    ("ClusterRoleBinding", "crr-proxy-kruise-pods"),
    ("ValidatingAdmissionPolicy", "crr-proxy-own-node-pods"),
    (
        "ValidatingAdmissionPolicyBinding",
        "crr-proxy-own-node-pods",
    ),
    ("ValidatingAdmissionPolicy", "crr-proxy-lease-writes"),
    ("ValidatingAdmissionPolicyBinding", "crr-proxy-lease-writes"),
];

/// One file of `deploy/`.
#[derive(Debug)]
pub struct File {
    /// Its path under `deploy/`.
    pub path: &'static str,
    pub text: &'static str,
}

const CRD: File = File {
    path: "crd/crd.yaml",
    text: include_str!("../deploy/crd/crd.yaml"),
};
const BASE: [File; 3] = [
    File {
        path: "base/claimer.yaml",
        text: include_str!("../deploy/base/claimer.yaml"),
    },
    File {
        path: "base/node-policy.yaml",
        text: include_str!("../deploy/base/node-policy.yaml"),
    },
    File {
        path: "base/rbac-restart.yaml",
        text: include_str!("../deploy/base/rbac-restart.yaml"),
    },
];
const KRUISE: [File; 1] = [File {
    path: "kruise/rbac.yaml",
    text: include_str!("../deploy/kruise/rbac.yaml"),
}];
const STANDALONE: [File; 2] = [
    File {
        path: "standalone/rbac.yaml",
        text: include_str!("../deploy/standalone/rbac.yaml"),
    },
    File {
        path: "standalone/standalone-checks.yaml",
        text: include_str!("../deploy/standalone/standalone-checks.yaml"),
    },
];

/// The files an overlay applies, in its kustomization's order.
pub fn files(overlay: Overlay) -> Vec<&'static File> {
    match overlay {
        Overlay::Kruise => BASE.iter().chain(&KRUISE).collect(),
        Overlay::Standalone => std::iter::once(&CRD)
            .chain(&BASE)
            .chain(&STANDALONE)
            .collect(),
    }
}

/// The standalone Lease a cluster's nodes elect their claimer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    name: String,
    namespace: String,
}

impl LeaseRef {
    /// Refuses what the API server would: a name that is no DNS subdomain,
    /// a namespace that is no DNS label (and so could not reach a YAML
    /// file unquoted either).
    pub fn new(name: &str, namespace: &str) -> Result<Self, ManifestError> {
        if let Err(reason) = dns_name(name, 253, true) {
            return Err(ManifestError::Name {
                what: "Lease name",
                value: name.to_owned(),
                reason,
            });
        }
        if let Err(reason) = dns_name(namespace, 63, false) {
            return Err(ManifestError::Name {
                what: "Lease namespace",
                value: namespace.to_owned(),
                reason,
            });
        }
        Ok(Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

impl Default for LeaseRef {
    fn default() -> Self {
        Self {
            name: DEFAULT_LEASE_NAME.to_owned(),
            namespace: DEFAULT_LEASE_NAMESPACE.to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("{what} {value:?} is not valid: {reason}")]
    Name {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error(
        "kubelet's identity serves --agent kruise only: the standalone claimer reads the Pods of every node and writes a Lease outside kube-node-lease, which Node authorization and NodeRestriction deny a kubelet (use scripts/node-identity.sh)"
    )]
    KubeletStandalone,
}

/// An overlay's objects for `lease` and `identity`, as one YAML stream for
/// `kubectl apply -f -`.
pub fn render(
    overlay: Overlay,
    lease: &LeaseRef,
    identity: Identity,
) -> Result<String, ManifestError> {
    if identity == Identity::Kubelet && overlay == Overlay::Standalone {
        return Err(ManifestError::KubeletStandalone);
    }
    let mut parts = Vec::new();
    for file in files(overlay) {
        let mut text = replace_name(file.text, DEFAULT_LEASE_NAMESPACE, &lease.namespace);
        text = replace_name(&text, DEFAULT_LEASE_NAME, &lease.name);
        if identity == Identity::Kubelet {
            text = without(&text, &KUBELET_HAS);
            if text.trim().is_empty() {
                continue;
            }
            // The group first: the user prefix is a part of it.
            text = replace_name(&text, Identity::Own.group(), Identity::Kubelet.group());
            let own = Identity::Own.user_prefix().trim_end_matches(':');
            let kubelet = Identity::Kubelet.user_prefix().trim_end_matches(':');
            text = replace_name(&text, own, kubelet);
        }
        let mut part = format!("# deploy/{}\n{text}", file.path);
        if !part.ends_with('\n') {
            part.push('\n');
        }
        parts.push(part);
    }
    let header = match identity {
        Identity::Own => "",
        Identity::Kubelet => {
            "# Rendered for kubelet's identity: user system:node:<node>, group system:nodes.\n"
        }
    };
    Ok(format!("{header}{}", parts.join("---\n")))
}

/// `text`, a YAML stream, without the documents that are one of `objects`
/// (kind, metadata.name), each with the comments above it.
fn without(text: &str, objects: &[(&str, &str)]) -> String {
    let mut kept = Vec::new();
    for document in text.split("\n---\n") {
        let kind = document.lines().find_map(|l| l.strip_prefix("kind: "));
        let name = document
            .lines()
            .skip_while(|l| *l != "metadata:")
            .find_map(|l| l.strip_prefix("  name: "));
        let dropped =
            matches!((kind, name), (Some(k), Some(n)) if objects.contains(&(k.trim(), n.trim())));
        if !dropped {
            kept.push(document.trim_end_matches('\n'));
        }
    }
    let mut out = kept.join("\n---\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// `text` with every whole occurrence of the name `from` (not part of a
/// longer name: no name character either side) replaced by `to`.
fn replace_name(text: &str, from: &str, to: &str) -> String {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let (before, after) = (&rest[..at], &rest[at + from.len()..]);
        let whole = !before.ends_with(is_name) && !after.starts_with(is_name);
        out.push_str(before);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// RFC 1123 names as the API server checks them: lower-case letters,
/// digits and `-` (and `.` between labels of a subdomain), beginning and
/// ending with a letter or digit.
fn dns_name(value: &str, max: usize, dots: bool) -> Result<(), &'static str> {
    if value.is_empty() || value.len() > max {
        return Err(if dots {
            "a DNS subdomain has 1 to 253 characters"
        } else {
            "a DNS label has 1 to 63 characters"
        });
    }
    let labels: Vec<&str> = if dots {
        value.split('.').collect()
    } else {
        vec![value]
    };
    for label in labels {
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let fine = !label.is_empty()
            && label.len() <= 63
            && label.starts_with(alnum)
            && label.ends_with(alnum)
            && label.chars().all(|c| alnum(c) || c == '-');
        if !fine {
            return Err(
                "lower-case letters, digits and '-', beginning and ending with a letter or digit",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;
    use serde_json::Value;

    fn documents(text: &str) -> Vec<Value> {
        text.split("\n---\n")
            .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
            .filter(|doc| !doc.is_null())
            .collect()
    }

    /// The JSON paths where two values differ.
    fn differences(path: String, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
                for (key, value) in x {
                    match y.get(key) {
                        Some(other) => differences(format!("{path}.{key}"), value, other, out),
                        None => out.push(format!("{path}.{key}")),
                    }
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (value, other)) in x.iter().zip(y).enumerate() {
                    differences(format!("{path}[{i}]"), value, other, out);
                }
            }
            _ if a == b => {}
            _ => out.push(path),
        }
    }

    #[test]
    fn another_lease_changes_exactly_the_fields_that_name_it() {
        let other = LeaseRef::new("claim.example", "ops").unwrap();
        let mut changed = Vec::new();
        for overlay in [Overlay::Kruise, Overlay::Standalone] {
            let before = documents(&render(overlay, &LeaseRef::default(), Identity::Own).unwrap());
            let after = documents(&render(overlay, &other, Identity::Own).unwrap());
            assert_eq!(before.len(), after.len());
            for (a, b) in before.iter().zip(&after) {
                let name = format!("{}/{}", a["kind"].as_str().unwrap(), a["metadata"]["name"]);
                differences(name, a, b, &mut changed);
            }
        }
        changed.sort();
        changed.dedup();
        let expected = [
            // The Lease itself (shipped held by no node), its own namespace
            // and the Role and binding in it.
            r#"Lease/"crr-proxy-claimer".metadata.name"#,
            r#"Lease/"crr-proxy-claimer".metadata.namespace"#,
            r#"Namespace/"crr-proxy-system".metadata.name"#,
            r#"Role/"crr-proxy-standalone-lease".metadata.namespace"#,
            r#"Role/"crr-proxy-standalone-lease".rules[0].resourceNames[0]"#,
            r#"RoleBinding/"crr-proxy-standalone-lease".metadata.namespace"#,
            // The policies that read the Lease, or allow writing only it.
            r#"ValidatingAdmissionPolicy/"crr-proxy-lease-writes".spec.validations[0].expression"#,
            r#"ValidatingAdmissionPolicy/"crr-proxy-lease-writes".spec.validations[0].message"#,
            r#"ValidatingAdmissionPolicyBinding/"crr-proxy-lease-holder-claims".spec.paramRef.name"#,
            r#"ValidatingAdmissionPolicyBinding/"crr-proxy-lease-holder-claims".spec.paramRef.namespace"#,
        ];
        assert_eq!(changed, expected);
        let rendered = render(Overlay::Standalone, &other, Identity::Own).unwrap();
        assert!(rendered.contains("request.name == 'claim.example' && request.namespace == 'ops'"));
        assert!(!rendered.contains(DEFAULT_LEASE_NAME));
    }

    #[test]
    fn the_default_rendering_is_the_committed_files() {
        let rendered = render(Overlay::Standalone, &LeaseRef::default(), Identity::Own).unwrap();
        for file in files(Overlay::Standalone) {
            assert!(rendered.contains(file.text), "{}", file.path);
        }
    }

    /// (kind, name) of each object, in order.
    fn objects(docs: &[Value]) -> Vec<(String, String)> {
        docs.iter()
            .map(|d| {
                let kind = d["kind"].as_str().unwrap().to_owned();
                (kind, d["metadata"]["name"].as_str().unwrap().to_owned())
            })
            .collect()
    }

    #[test]
    fn kubelets_identity_names_kubelet_and_leaves_out_what_node_authorization_does() {
        let lease = LeaseRef::default();
        let own = render(Overlay::Kruise, &lease, Identity::Own).unwrap();
        let kubelet = render(Overlay::Kruise, &lease, Identity::Kubelet).unwrap();
        let expected: Vec<_> = objects(&documents(&own))
            .into_iter()
            .filter(|(k, n)| !KUBELET_HAS.contains(&(k.as_str(), n.as_str())))
            .collect();
        let docs = documents(&kubelet);
        assert_eq!(objects(&docs), expected);
        // Each of KUBELET_HAS was there to leave out.
        assert_eq!(
            objects(&documents(&own)).len(),
            expected.len() + KUBELET_HAS.len()
        );
        assert!(!kubelet.contains("crr-proxy:node"), "{kubelet}");
        for doc in &docs {
            if let Some(subjects) = doc["subjects"].as_array() {
                assert_eq!(subjects[0]["name"], "system:nodes", "{doc}");
            }
            if doc["kind"] == "ValidatingAdmissionPolicy" {
                let text = doc.to_string();
                assert!(
                    text.contains("'system:nodes' in request.userInfo.groups"),
                    "{text}"
                );
                assert!(text.contains("'system:node:' + "), "{text}");
            }
        }
        // Nothing else differs: the same text once the names are put back.
        let back = kubelet
            .replace("system:nodes", "crr-proxy:nodes")
            .replace("system:node:", "crr-proxy:node:");
        for doc in documents(&back) {
            assert!(documents(&own).contains(&doc), "{doc}");
        }
    }

    #[test]
    fn kubelets_identity_is_refused_for_standalone() {
        let error =
            render(Overlay::Standalone, &LeaseRef::default(), Identity::Kubelet).unwrap_err();
        assert_eq!(error, ManifestError::KubeletStandalone);
        assert!(error.to_string().contains("node-identity.sh"));
    }

    #[test]
    fn a_lease_the_api_server_would_refuse_is_refused() {
        for (name, namespace) in [
            ("Claimer", "ops"),
            ("claimer", "ops.team"),
            ("claimer", "-ops"),
            ("", "ops"),
            ("claimer\n  evil: x", "ops"),
            ("claimer", &"n".repeat(64)),
        ] {
            let error = LeaseRef::new(name, namespace).unwrap_err();
            assert!(error.to_string().contains("is not valid"), "{error}");
        }
        LeaseRef::new("a.b-c.d", "ops-1").unwrap();
    }

    #[test]
    fn a_name_inside_a_longer_one_is_left_alone() {
        assert_eq!(
            replace_name(
                "x crr-proxy-claimer-role crr-proxy-claimer/",
                "crr-proxy-claimer",
                "y"
            ),
            "x crr-proxy-claimer-role y/"
        );
    }
}
