//! The cluster objects crr-proxy needs, as `deploy/` holds them for
//! `kubectl apply -k`, rendered for the Lease a cluster is configured with.
//!
//! The files in `deploy/` are the rendering for the default Lease: they are
//! the source, embedded here, and another Lease's name and namespace take
//! the place of the defaults wherever they appear as a whole name. The
//! defaults are names nothing else in those files uses, and a unit test
//! holds the rendering to changing exactly the Lease's fields.

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
const BASE: [File; 2] = [
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
const STANDALONE: [File; 3] = [
    File {
        path: "standalone/namespace.yaml",
        text: include_str!("../deploy/standalone/namespace.yaml"),
    },
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
}

/// An overlay's objects for `lease`, as one YAML stream for
/// `kubectl apply -f -`.
pub fn render(overlay: Overlay, lease: &LeaseRef) -> String {
    let mut out = String::new();
    for file in files(overlay) {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&format!("# deploy/{}\n", file.path));
        let text = replace_name(file.text, DEFAULT_LEASE_NAMESPACE, &lease.namespace);
        out.push_str(&replace_name(&text, DEFAULT_LEASE_NAME, &lease.name));
        if !out.ends_with('\n') {
            out.push('\n');
        }
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
            let before = documents(&render(overlay, &LeaseRef::default()));
            let after = documents(&render(overlay, &other));
            assert_eq!(before.len(), after.len());
            for (a, b) in before.iter().zip(&after) {
                let name = format!("{}/{}", a["kind"].as_str().unwrap(), a["metadata"]["name"]);
                differences(name, a, b, &mut changed);
            }
        }
        changed.sort();
        changed.dedup();
        let expected = [
            // The Lease's own namespace and the Role and binding in it.
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
        let rendered = render(Overlay::Standalone, &other);
        assert!(rendered.contains("request.name == 'claim.example' && request.namespace == 'ops'"));
        assert!(!rendered.contains(DEFAULT_LEASE_NAME));
    }

    #[test]
    fn the_default_rendering_is_the_committed_files() {
        let rendered = render(Overlay::Standalone, &LeaseRef::default());
        for file in files(Overlay::Standalone) {
            assert!(rendered.contains(file.text), "{}", file.path);
        }
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
