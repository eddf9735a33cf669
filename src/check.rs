//! `crr-proxy check`: verifies, before or after installing, that everything
//! crr-proxy depends on is in place, and prints a pass/fail table.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};

use crate::agent::{self, Mode};
use crate::config::{AgentSettings, RunConfig};
use crate::cri::Endpoint;
use crate::cri::v1::VersionRequest;
use crate::crr::ContainerRecreateRequest;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The per-node identity scripts/node-identity.sh issues:
/// `crr-proxy:node:<node>` in the group `crr-proxy:nodes`.
const NODE_USER_PREFIX: &str = "crr-proxy:node:";
const NODE_GROUP: &str = "crr-proxy:nodes";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail,
    /// Could not be checked from here (not a failure).
    Skip,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub check: String,
    pub outcome: Outcome,
    pub detail: String,
}

/// The checks, in order.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    fn add(&mut self, check: &str, result: Result<String, Verdict>) {
        let (outcome, detail) = match result {
            Ok(detail) => (Outcome::Pass, detail),
            Err(Verdict::Fail(detail)) => (Outcome::Fail, detail),
            Err(Verdict::Skip(detail)) => (Outcome::Skip, detail),
        };
        self.rows.push(Row {
            check: check.to_owned(),
            outcome,
            detail,
        });
    }

    pub fn failed(&self) -> bool {
        self.rows.iter().any(|r| r.outcome == Outcome::Fail)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .rows
            .iter()
            .map(|r| r.check.len())
            .max()
            .unwrap_or(5)
            .max(5);
        writeln!(f, "{:width$}  RESULT  DETAIL", "CHECK")?;
        for row in &self.rows {
            let outcome = match row.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            writeln!(f, "{:width$}  {outcome:6}  {}", row.check, row.detail)?;
        }
        Ok(())
    }
}

enum Verdict {
    Fail(String),
    Skip(String),
}

fn fail(detail: impl fmt::Display) -> Verdict {
    Verdict::Fail(detail.to_string())
}

/// Runs every check that applies to `config`.
pub async fn run(config: &RunConfig, kubelet_config: &Path) -> Report {
    let mut report = Report::default();
    report.add("runtime endpoint", runtime(&config.routes.runtime).await);
    if let Some(image) = &config.routes.image {
        report.add("image endpoint", reachable(image).await);
    }
    report.add("listen path", listen_path(&config.listen));
    report.add("kubelet endpoints", kubelet(kubelet_config, &config.listen));
    if let Some(settings) = &config.agent {
        kubernetes(settings, &mut report).await;
    }
    report
}

async fn runtime(endpoint: &Endpoint) -> Result<String, Verdict> {
    let mut cri = crate::cri::runtime_client(crate::cri::channel(endpoint));
    let version = tokio::time::timeout(TIMEOUT, cri.version(VersionRequest::default()))
        .await
        .map_err(|_| fail(format!("{endpoint}: no answer in {TIMEOUT:?}")))?
        .map_err(|status| fail(format!("{endpoint}: {}", status.message())))?
        .into_inner();
    Ok(format!(
        "{} {} (CRI {}) at {endpoint}",
        version.runtime_name, version.runtime_version, version.runtime_api_version
    ))
}

async fn reachable(endpoint: &Endpoint) -> Result<String, Verdict> {
    tokio::net::UnixStream::connect(endpoint.path())
        .await
        .map(|_| format!("{endpoint} accepts connections"))
        .map_err(|e| fail(format!("{endpoint}: {e}")))
}

fn listen_path(path: &Path) -> Result<String, Verdict> {
    if std::env::var_os("LISTEN_FDS").is_some() {
        return Ok("inherited from systemd (socket activation)".into());
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    if let Ok(meta) = std::fs::metadata(dir) {
        if meta.permissions().mode() & 0o002 != 0 {
            return Err(fail(format!(
                "{} is world-writable: anyone could replace the socket",
                dir.display()
            )));
        }
    }
    match std::fs::symlink_metadata(path) {
        Err(_) => Ok(format!(
            "{} is free; crr-proxy will create it (mode 0660)",
            path.display()
        )),
        Ok(meta) if !meta.file_type().is_socket() => Err(fail(format!(
            "{} exists and is not a socket",
            path.display()
        ))),
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => Ok(format!("{} is served (mode {mode:o})", path.display())),
                Err(_) => Ok(format!(
                    "{} is a stale socket; crr-proxy will replace it",
                    path.display()
                )),
            }
        }
    }
}

/// kubelet's configured endpoints, when its configuration is readable.
fn kubelet(config: &Path, listen: &Path) -> Result<String, Verdict> {
    let Ok(text) = std::fs::read_to_string(config) else {
        return Err(Verdict::Skip(format!(
            "{} is not readable here",
            config.display()
        )));
    };
    let parsed: serde_json::Value =
        serde_saphyr::from_str(&text).map_err(|e| fail(format!("{}: {e}", config.display())))?;
    let want = Endpoint::from_path(listen).to_string();
    let mut wrong = Vec::new();
    for key in ["containerRuntimeEndpoint", "imageServiceEndpoint"] {
        let value = parsed[key].as_str().unwrap_or("");
        // kubelet uses the runtime endpoint for images when unset.
        let effective = if value.is_empty() && key == "imageServiceEndpoint" {
            parsed["containerRuntimeEndpoint"].as_str().unwrap_or("")
        } else {
            value
        };
        if effective != want {
            wrong.push(format!("{key} is {effective:?}"));
        }
    }
    if wrong.is_empty() {
        Ok(format!("kubelet uses {want}"))
    } else {
        Err(fail(format!("{} (want {want})", wrong.join(", "))))
    }
}

/// The verbs each agent mode needs, as in deploy/rbac-*.yaml.
fn needed(mode: Mode) -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    let mut verbs = vec![
        ("apps.kruise.io", "containerrecreaterequests", "", "get"),
        ("apps.kruise.io", "containerrecreaterequests", "", "list"),
        ("apps.kruise.io", "containerrecreaterequests", "", "watch"),
        (
            "apps.kruise.io",
            "containerrecreaterequests",
            "status",
            "get",
        ),
        (
            "apps.kruise.io",
            "containerrecreaterequests",
            "status",
            "update",
        ),
        (
            "apps.kruise.io",
            "containerrecreaterequests",
            "status",
            "patch",
        ),
        ("events.k8s.io", "events", "", "create"),
        ("events.k8s.io", "events", "", "patch"),
    ];
    if mode == Mode::Standalone {
        verbs.extend([
            ("apps.kruise.io", "containerrecreaterequests", "", "patch"),
            ("apps.kruise.io", "containerrecreaterequests", "", "delete"),
            ("", "pods", "", "get"),
            ("", "pods", "", "list"),
            ("", "pods", "", "watch"),
            ("", "pods", "status", "patch"),
        ]);
    }
    verbs
}

/// One SelfSubjectAccessReview per verb the mode needs.
async fn rbac(client: &kube::Client, mode: Mode) -> Result<String, Verdict> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut denied = Vec::new();
    for (group, resource, subresource, verb) in needed(mode) {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    subresource: (!subresource.is_empty()).then(|| subresource.into()),
                    verb: Some(verb.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| fail(format!("SelfSubjectAccessReview: {e}")))?;
        if !answer.status.is_some_and(|s| s.allowed) {
            let sub = if subresource.is_empty() {
                String::new()
            } else {
                format!("/{subresource}")
            };
            denied.push(format!("{verb} {resource}{sub}"));
        }
    }
    if denied.is_empty() {
        Ok(format!("every verb {mode:?} mode uses is allowed"))
    } else {
        Err(fail(format!(
            "denied: {} (see deploy/rbac-*.yaml)",
            denied.join(", ")
        )))
    }
}

/// Who the credentials are (SelfSubjectReview), against the per-node
/// identity deploy/node-policy.yaml expects for `node`.
async fn identity(client: &kube::Client, node: &str) -> Result<String, Verdict> {
    let review = SelfSubjectReview::default();
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await;
    let user = match answer {
        Ok(review) => review.status.and_then(|s| s.user_info).unwrap_or_default(),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(Verdict::Skip(
                "the API server has no SelfSubjectReview (before 1.28)".into(),
            ));
        }
        Err(error) => return Err(fail(error)),
    };
    let name = user.username.unwrap_or_default();
    let expected = format!("{NODE_USER_PREFIX}{node}");
    let is_node_identity = user
        .groups
        .unwrap_or_default()
        .iter()
        .any(|g| g == NODE_GROUP);
    if name == expected {
        Ok(format!(
            "{name}, confined to node {node:?} by deploy/node-policy.yaml"
        ))
    } else if is_node_identity || name.starts_with(NODE_USER_PREFIX) {
        Err(fail(format!(
            "{name} is another node's identity: with --node-name {node:?}, deploy/node-policy.yaml refuses every write (want {expected})"
        )))
    } else {
        Err(Verdict::Skip(format!(
            "{name}: not a per-node identity, so deploy/node-policy.yaml does not confine it (scripts/node-identity.sh)"
        )))
    }
}

async fn kubernetes(settings: &AgentSettings, report: &mut Report) {
    let config = match agent::kube_config(settings).await {
        Ok(config) => {
            report.add(
                "kubeconfig",
                Ok(format!("API server {}", config.cluster_url)),
            );
            config
        }
        Err(error) => return report.add("kubeconfig", Err(fail(error))),
    };
    let client = match kube::Client::try_from(config) {
        Ok(client) => client,
        Err(error) => return report.add("API server", Err(fail(error))),
    };
    let version = tokio::time::timeout(TIMEOUT, client.apiserver_version()).await;
    match version {
        Ok(Ok(info)) => report.add("API server", Ok(format!("reachable, {}", info.git_version))),
        Ok(Err(error)) => return report.add("API server", Err(fail(error))),
        Err(_) => return report.add("API server", Err(fail(format!("no answer in {TIMEOUT:?}")))),
    }

    report.add("identity", identity(&client, &settings.node_name).await);
    report.add("RBAC", rbac(&client, settings.mode).await);

    let crrs: Api<ContainerRecreateRequest> = Api::all(client.clone());
    let crd = match crrs.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok("apps.kruise.io/v1alpha1 ContainerRecreateRequest is served".to_owned()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(fail(
            "the CRD is not installed (kubectl apply -f deploy/crd.yaml)",
        )),
        Err(error) => Err(fail(error)),
    };
    report.add("CRD", crd);

    let nodes: Api<Node> = Api::all(client);
    let node = match nodes.get_opt(&settings.node_name).await {
        Ok(Some(_)) => Ok(format!("Node {:?} exists", settings.node_name)),
        Ok(None) => Err(fail(format!(
            "no Node named {:?}: set --node-name",
            settings.node_name
        ))),
        Err(kube::Error::Api(status)) if status.code == 403 => Err(Verdict::Skip(format!(
            "{:?}: these credentials may not read Nodes",
            settings.node_name
        ))),
        Err(error) => Err(fail(error)),
    };
    report.add("node name", node);
}
