//! `crr-proxy check`: verifies, before or after installing, that everything
//! crr-proxy depends on is in place, and prints a pass/fail table.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    FieldSelectorAttributes, ResourceAttributes, SelfSubjectAccessReview,
    SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};

use crate::RunConfig;
use crate::agent::AgentSettings;
use crate::agent::{self, LeaseSettings, Mode};
use crate::cri::Endpoint;
use crate::cri::v1::{VersionRequest, VersionResponse};
use crate::crr::client::ApiVersion;
use crate::manifests::{Identity, ManifestError};

mod kubelet;
use kubelet::{Flags, Layered};

const TIMEOUT: Duration = Duration::from_secs(5);

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

#[derive(Clone)]
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
    let reported = match &config.agent {
        Some(settings) => kubernetes(settings, &mut report).await,
        None => None,
    };
    let local = local_kubelet(kubelet_config, Path::new("/proc"));
    let want = Endpoint::from_path(&config.listen).to_string();
    report.add(
        "kubelet endpoints",
        kubelet_endpoints(reported.as_ref(), local.as_ref(), &want),
    );
    let known = match (&reported, &local) {
        (Some(Ok(reported)), _) => Ok(&reported.config),
        (_, Ok(local)) => Ok(&local.layered.config),
        (_, Err(verdict)) => Err(verdict.clone()),
    };
    report.add("restart back-off", known.and_then(crash_loop_backoff));
    report
}

/// What install.sh checks before it points kubelet at crr-proxy: the
/// runtime kubelet uses now answers CRI `Version`, and crr-proxy's socket
/// answers for that same runtime. kubelet's endpoints and the agent are not
/// checked: kubelet does not dial crr-proxy yet, and the agent never stands
/// between kubelet and its runtime.
pub async fn before_switch(config: &RunConfig) -> Report {
    let mut report = Report::default();
    let direct = version(&config.routes.runtime).await;
    let listen = Endpoint::from_path(&config.listen);
    let relayed = match &direct {
        Ok(direct) => through(&listen, direct).await,
        Err(_) => Err(Verdict::Skip(
            "the runtime itself does not answer".to_owned(),
        )),
    };
    report.add(
        "runtime endpoint",
        direct.map(|v| describe(&v, &config.routes.runtime)),
    );
    if let Some(image) = &config.routes.image {
        report.add("image endpoint", reachable(image).await);
    }
    report.add("through crr-proxy", relayed);
    report
}

async fn version(endpoint: &Endpoint) -> Result<VersionResponse, Verdict> {
    let mut cri = crate::cri::runtime_client(crate::cri::channel(endpoint));
    Ok(
        tokio::time::timeout(TIMEOUT, cri.version(VersionRequest::default()))
            .await
            .map_err(|_| fail(format!("{endpoint}: no answer in {TIMEOUT:?}")))?
            .map_err(|status| fail(format!("{endpoint}: {}", status.message())))?
            .into_inner(),
    )
}

fn describe(version: &VersionResponse, endpoint: &Endpoint) -> String {
    format!(
        "{} {} (CRI {}) at {endpoint}",
        version.runtime_name, version.runtime_version, version.runtime_api_version
    )
}

async fn runtime(endpoint: &Endpoint) -> Result<String, Verdict> {
    version(endpoint).await.map(|v| describe(&v, endpoint))
}

/// crr-proxy's socket answers `Version` as the runtime itself does; another
/// answer means it forwards to another runtime than the one checked.
async fn through(listen: &Endpoint, direct: &VersionResponse) -> Result<String, Verdict> {
    let relayed = version(listen).await?;
    if &relayed == direct {
        Ok(format!(
            "{listen} answers for the same runtime ({} {})",
            relayed.runtime_name, relayed.runtime_version
        ))
    } else {
        Err(fail(format!(
            "{listen} answers for {}, not for the runtime checked above: crr-proxy forwards elsewhere (restart it after changing its settings)",
            describe(&relayed, listen)
        )))
    }
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

/// kubelet's configuration as this node's files give it.
struct Local {
    layered: Layered,
    /// Where it was learnt, for the report.
    origin: String,
    /// Files that set an endpoint and changed after kubelet started.
    unread: Vec<std::path::PathBuf>,
}

/// The running kubelet's command line and the files it names; where no
/// kubelet runs here, the `kubelet_config` file alone.
fn local_kubelet(kubelet_config: &Path, proc: &Path) -> Result<Local, Verdict> {
    if let Some(process) = kubelet::running(proc) {
        let flags = Flags::parse(process.args.get(1..).unwrap_or_default());
        let config = flags.config.as_ref().map(|c| process.cwd.join(c));
        let layered = kubelet::layer(config.as_deref(), &flags, &process.cwd).map_err(fail)?;
        let unread = process
            .started
            .map(|started| kubelet::changed_since(&layered, started))
            .unwrap_or_default();
        return Ok(Local {
            layered,
            origin: format!("kubelet pid {}'s command line and files", process.pid),
            unread,
        });
    }
    if std::fs::metadata(kubelet_config).is_err() {
        return Err(Verdict::Skip(format!(
            "no kubelet runs here and {} is not readable",
            kubelet_config.display()
        )));
    }
    let layered =
        kubelet::layer(Some(kubelet_config), &Flags::default(), Path::new("/")).map_err(fail)?;
    Ok(Local {
        layered,
        origin: format!("{} (no kubelet runs here)", kubelet_config.display()),
        unread: Vec::new(),
    })
}

/// Whether kubelet dials `want`: by its own report where there is one, else
/// by its command line and files; and whether the two disagree (kubelet's
/// next restart would change its endpoints).
fn kubelet_endpoints(
    reported: Option<&Result<Layered, String>>,
    local: Result<&Local, &Verdict>,
    want: &str,
) -> Result<String, Verdict> {
    let (uses, origin) = match (reported, local) {
        (Some(Ok(reported)), _) => (
            reported,
            "kubelet's /configz through the API server".to_owned(),
        ),
        (_, Ok(local)) => (&local.layered, local.origin.clone()),
        (_, Err(verdict)) => return Err(verdict.clone()),
    };
    let unreported = match reported {
        Some(Err(why)) => format!("; /configz: {why}"),
        _ => String::new(),
    };
    let pairs = |l: &Layered| {
        [
            ("containerRuntimeEndpoint", l.runtime.clone()),
            ("imageServiceEndpoint", l.image.clone()),
        ]
    };
    let mut wrong = Vec::new();
    for (key, endpoint) in pairs(uses) {
        if endpoint.value != want {
            wrong.push(format!(
                "{key} is {:?} ({})",
                endpoint.value, endpoint.source
            ));
        }
    }
    if let (Some(Ok(_)), Ok(local)) = (reported, local) {
        for ((key, running), (_, on_disk)) in pairs(uses).into_iter().zip(pairs(&local.layered)) {
            if running.value != on_disk.value {
                wrong.push(format!(
                    "kubelet runs with {key} {:?}, but {} now gives {:?} ({}): its next restart changes it",
                    running.value, local.origin, on_disk.value, on_disk.source
                ));
            }
        }
    }
    if let Ok(local) = local {
        for path in &local.unread {
            wrong.push(format!(
                "{} changed after kubelet started, so kubelet has not read it: restart kubelet",
                path.display()
            ));
        }
    }
    if wrong.is_empty() {
        Ok(format!("kubelet uses {want} (from {origin}){unreported}"))
    } else {
        Err(fail(format!(
            "{} (want {want}; from {origin}){unreported}",
            wrong.join(", ")
        )))
    }
}

/// kubelet's own configuration, from its `/configz` through the API
/// server's node proxy. That takes `get nodes/proxy`, which reaches every
/// kubelet API (exec included): crr-proxy's RBAC does not grant it, so with
/// the node's identity this answers why not, and the files speak instead.
async fn configz(client: &kube::Client, node: &str) -> Result<Layered, String> {
    let request = http::Request::get(format!("/api/v1/nodes/{node}/proxy/configz"))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let answer = tokio::time::timeout(TIMEOUT, client.request::<serde_json::Value>(request))
        .await
        .map_err(|_| format!("no answer in {TIMEOUT:?}"))?;
    match answer {
        Ok(answer) => kubelet::from_configz(&answer)
            .ok_or_else(|| "the answer has no kubeletconfig".to_owned()),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            Err("these credentials may not get nodes/proxy (nor need to)".to_owned())
        }
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(error) => Err(error.to_string()),
    }
}

/// Which CRR versions the cluster serves, and the one the agent will use
/// (v1beta1 where served); a list through it proves the CRD is usable.
async fn crd_versions(client: &kube::Client) -> Result<String, Verdict> {
    let version = match ApiVersion::discover(client).await {
        Ok(version) => version,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(fail(
                "the CRD is not installed (kubectl apply -f deploy/crd/crd.yaml)",
            ));
        }
        Err(error) => return Err(fail(error)),
    };
    let api = Api::<kube::api::DynamicObject>::all_with(client.clone(), &version.api_resource());
    api.list(&ListParams::default().limit(1))
        .await
        .map_err(fail)?;
    let served = if version == ApiVersion::V1beta1 {
        // v1alpha1 is served beside it by every CRD that has v1beta1.
        let alpha = client
            .list_api_group_resources(&format!("{}/{}", crate::crr::GROUP, crate::crr::VERSION))
            .await
            .is_ok_and(|list| list.resources.iter().any(|r| r.name == crate::crr::PLURAL));
        if alpha {
            "v1alpha1, v1beta1"
        } else {
            "v1beta1"
        }
    } else {
        "v1alpha1"
    };
    Ok(format!(
        "apps.kruise.io ContainerRecreateRequest served as {served}; the agent uses {}",
        version.as_str()
    ))
}

/// How soon kubelet restarts a container crr-proxy stops again within its
/// CrashLoopBackOff window: every recreation counts as a crash for kubelet
/// (the first restart is at once). Informational: it never fails.
fn crash_loop_backoff(parsed: &serde_json::Value) -> Result<String, Verdict> {
    let gates = &parsed["featureGates"];
    let (mut initial, mut max, mut source) = if gates["ReduceDefaultCrashLoopBackOffDecay"] == true
    {
        (
            1,
            60,
            "feature gate ReduceDefaultCrashLoopBackOffDecay".to_owned(),
        )
    } else {
        (10, 300, "kubelet's default".to_owned())
    };
    let configured = &parsed["crashLoopBackOff"]["maxContainerRestartPeriod"];
    if let Some(text) = configured.as_str() {
        let seconds = go_seconds(text).ok_or_else(|| {
            fail(format!(
                "crashLoopBackOff.maxContainerRestartPeriod {text:?} is no duration"
            ))
        })?;
        if gates["KubeletCrashLoopBackOffMax"] == false {
            source = format!(
                "{source}; crashLoopBackOff.maxContainerRestartPeriod {text} is ignored: feature gate KubeletCrashLoopBackOffMax is off"
            );
        } else {
            max = seconds.clamp(1, 300);
            initial = initial.min(max);
            source = format!(
                "crashLoopBackOff.maxContainerRestartPeriod {text} (Kubernetes 1.35 and later; 1.32 to 1.34 with feature gate KubeletCrashLoopBackOffMax)"
            );
        }
    }
    Ok(format!(
        "a container recreated again within {}s waits {initial}s, doubling to {max}s ({source})",
        2 * max
    ))
}

/// Whole seconds of a Go duration such as `90s`, `1m30s` or `500ms`
/// (rounded up; `None` for anything else).
fn go_seconds(text: &str) -> Option<u64> {
    use k8s_openapi::jiff::fmt::friendly::SpanParser;
    static PARSER: SpanParser = SpanParser::new();
    let duration = PARSER.parse_unsigned_duration(text.trim()).ok()?;
    Some(duration.as_secs() + u64::from(duration.subsec_nanos() > 0))
}

/// The verbs each agent mode needs, as in deploy/*/rbac.yaml.
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
        // The Pod's restart policy, before each kill; and in kruise mode
        // the watch for a kruise-daemon on the node.
        ("", "pods", "", "get"),
        ("", "pods", "", "list"),
        ("", "pods", "", "watch"),
    ];
    if mode == Mode::Standalone {
        verbs.extend([
            ("apps.kruise.io", "containerrecreaterequests", "", "patch"),
            ("apps.kruise.io", "containerrecreaterequests", "", "delete"),
            ("", "pods", "status", "patch"),
        ]);
    }
    verbs
}

/// One SelfSubjectAccessReview per verb the mode needs. Under kubelet's
/// identity (`kubelet`: its node), Node authorization answers for the
/// node's own Pods: a list or watch is asked with the field selector the
/// agent sends, and a get, which it allows only by a Pod's name, is not
/// asked.
async fn rbac(client: &kube::Client, mode: Mode, kubelet: Option<&str>) -> Result<String, Verdict> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut denied = Vec::new();
    for (group, resource, subresource, verb) in needed(mode) {
        let pods = group.is_empty() && resource == "pods" && subresource.is_empty();
        let field_selector = match kubelet {
            Some(_) if pods && verb == "get" => continue,
            Some(node) if pods => Some(FieldSelectorAttributes {
                raw_selector: Some(format!("spec.nodeName={node}")),
                requirements: None,
            }),
            _ => None,
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    subresource: (!subresource.is_empty()).then(|| subresource.into()),
                    verb: Some(verb.into()),
                    field_selector,
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
            "denied: {} (see deploy/*/rbac.yaml)",
            denied.join(", ")
        )))
    }
}

/// No Lease yet: whether this node could make it, asked of the API server
/// with a dry run, which goes through admission (the namespace must exist;
/// node-policy.yaml must allow this Lease and this holder) and stores
/// nothing.
async fn first_lease(leases: &Api<Lease>, settings: &AgentSettings) -> Result<String, Verdict> {
    let LeaseSettings {
        name, namespace, ..
    } = &settings.lease;
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(settings.node_name.clone()),
            ..Default::default()
        }),
    };
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match leases.create(&dry_run, &lease).await {
        Ok(_) => Ok(format!(
            "{namespace}/{name} does not exist: the first standalone node to look makes it; \
             until then deploy/base/node-policy.yaml refuses every update and delete of a CRR, by anyone \
             (deploy/base/claimer.yaml ships it)"
        )),
        // Another node made it since the read: it exists.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            Ok(format!("{namespace}/{name} was just made by another node"))
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Err(fail(format!(
            "namespace {namespace} does not exist, so no node can make Lease {name} there (kubectl apply -k deploy/standalone makes it)"
        ))),
        Err(kube::Error::Api(status)) => Err(fail(format!(
            "this node may not make Lease {namespace}/{name}: {} (crr-proxy manifests renders the policies for the Lease it runs with)",
            status.message
        ))),
        Err(error) => Err(fail(format!("Lease {namespace}/{name}: {error}"))),
    }
}

/// Standalone mode's Lease: who holds it, and whether this node may take it.
async fn lease(client: &kube::Client, settings: &AgentSettings) -> Result<String, Verdict> {
    let LeaseSettings {
        name, namespace, ..
    } = &settings.lease;
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("coordination.k8s.io".into()),
                resource: Some("leases".into()),
                verb: Some("update".into()),
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let allowed = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| fail(format!("SelfSubjectAccessReview: {e}")))?
        .status
        .is_some_and(|s| s.allowed);
    if !allowed {
        return Err(fail(format!(
            "this node may not update Lease {namespace}/{name}, so it can never claim new CRRs (see deploy/standalone/rbac.yaml)"
        )));
    }
    let leases = Api::<Lease>::namespaced(client.clone(), namespace);
    let lease = leases
        .get_opt(name)
        .await
        .map_err(|e| fail(format!("Lease {namespace}/{name}: {e}")))?;
    let Some(lease) = lease else {
        return first_lease(&leases, settings).await;
    };
    let spec = lease.spec.unwrap_or_default();
    let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
        return Ok(format!(
            "{namespace}/{name} has no holder: the first standalone node to look takes it"
        ));
    };
    let me = if holder == settings.node_name {
        " (this node)"
    } else {
        ""
    };
    let renewed = spec
        .renew_time
        .map(|t| (Timestamp::now() - t.0).get_seconds());
    let lasts = spec.lease_duration_seconds.unwrap_or(0);
    Ok(match renewed {
        Some(ago) if ago <= i64::from(lasts) => {
            format!("{namespace}/{name} held by {holder}{me}, renewed {ago}s ago, lasts {lasts}s")
        }
        Some(ago) => format!(
            "{namespace}/{name} held by {holder}{me} but not renewed for {ago}s (lasts {lasts}s): the next node to look takes it"
        ),
        None => format!("{namespace}/{name} held by {holder}{me}, never renewed"),
    })
}

/// Who the credentials are (SelfSubjectReview), against the per-node
/// Kruise mode: no kruise-daemon on this node, or the agent stands aside.
async fn kruise_daemon(client: &kube::Client, node: &str) -> Result<String, Verdict> {
    let params = kube::api::ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(agent::kruise_daemon::LABEL);
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::all(client.clone())
        .list(&params)
        .await
        .map_err(fail)?;
    match agent::kruise_daemon::found(&pods.items) {
        None => Ok(format!("none on node {node:?}")),
        Some(pod) => Err(fail(format!(
            "kruise-daemon Pod {pod} runs on this node: its CRR controller does this node's CRRs and crr-proxy's agent stands aside (keep kruise-daemon off this node: deploy/kruise-daemon-affinity.yaml)"
        ))),
    }
}

/// identity deploy/base/node-policy.yaml expects for `node`, or kubelet's
/// own (kruise mode only); and which of the two it is.
async fn identity(
    client: &kube::Client,
    node: &str,
    mode: Mode,
) -> (Result<String, Verdict>, Option<Identity>) {
    let review = SelfSubjectReview::default();
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await;
    let user = match answer {
        Ok(review) => review.status.and_then(|s| s.user_info).unwrap_or_default(),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let skip = "the API server has no SelfSubjectReview (before 1.28)";
            return (Err(Verdict::Skip(skip.into())), None);
        }
        Err(error) => return (Err(fail(error)), None),
    };
    let name = user.username.unwrap_or_default();
    let groups = user.groups.unwrap_or_default();
    let Some(identity) = [Identity::Own, Identity::Kubelet]
        .into_iter()
        .find(|i| groups.iter().any(|g| g == i.group()) || name.starts_with(i.user_prefix()))
    else {
        return (
            Err(Verdict::Skip(format!(
                "{name}: not a per-node identity, so deploy/base/node-policy.yaml does not confine it (scripts/node-identity.sh)"
            ))),
            None,
        );
    };
    let expected = format!("{}{node}", identity.user_prefix());
    let verdict = if name != expected {
        Err(fail(format!(
            "{name} is another node's identity: with --node-name {node:?}, deploy/base/node-policy.yaml refuses every write (want {expected})"
        )))
    } else if identity == Identity::Own {
        Ok(format!(
            "{name}, confined to node {node:?} by deploy/base/node-policy.yaml"
        ))
    } else if mode == Mode::Standalone {
        Err(fail(ManifestError::KubeletStandalone))
    } else {
        Ok(format!(
            "{name} (kubelet's), confined to node {node:?} by Node authorization and crr-proxy manifests --agent kruise --identity kubelet"
        ))
    };
    (verdict, Some(identity))
}

/// The checks that need the API server; kubelet's `/configz` answer when
/// the node's name is known there.
async fn kubernetes(
    settings: &AgentSettings,
    report: &mut Report,
) -> Option<Result<Layered, String>> {
    let config = match agent::kube_config(settings.kubeconfig.as_deref()).await {
        Ok(mut config) => {
            crate::version::identify(&mut config, "check");
            report.add(
                "kubeconfig",
                Ok(format!("API server {}", config.cluster_url)),
            );
            config
        }
        Err(error) => {
            report.add("kubeconfig", Err(fail(error)));
            return None;
        }
    };
    // kube's client retries a 503, which is how the API server says a
    // kubelet is out of its reach: /configz takes the first answer.
    let mut once = config.clone();
    once.default_retry = false;
    let client = match kube::Client::try_from(config) {
        Ok(client) => client,
        Err(error) => {
            report.add("API server", Err(fail(error)));
            return None;
        }
    };
    let version = tokio::time::timeout(TIMEOUT, client.apiserver_version()).await;
    match version {
        Ok(Ok(info)) => report.add("API server", Ok(format!("reachable, {}", info.git_version))),
        Ok(Err(error)) => {
            report.add("API server", Err(fail(error)));
            return None;
        }
        Err(_) => {
            report.add("API server", Err(fail(format!("no answer in {TIMEOUT:?}"))));
            return None;
        }
    }

    let (verdict, who) = identity(&client, &settings.node_name, settings.mode).await;
    report.add("identity", verdict);
    let kubelet = (who == Some(Identity::Kubelet)).then_some(settings.node_name.as_str());
    report.add("RBAC", rbac(&client, settings.mode, kubelet).await);

    report.add("CRD", crd_versions(&client).await);
    if settings.mode == Mode::Standalone {
        report.add("Lease", lease(&client, settings).await);
    }
    if settings.mode == Mode::Kruise {
        report.add(
            "kruise-daemon",
            kruise_daemon(&client, &settings.node_name).await,
        );
    }

    let nodes: Api<Node> = Api::all(client.clone());
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
    // A Node these credentials may not read may still answer /configz.
    let known = !matches!(node, Err(Verdict::Fail(_)));
    report.add("node name", node);
    if known {
        let client = kube::Client::try_from(once).ok()?;
        Some(configz(&client, &settings.node_name).await)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_restart_back_off_is_read_from_kubelets_configuration() {
        let said = |config: serde_json::Value| crash_loop_backoff(&config).ok().unwrap_or_default();
        assert!(
            said(json!({})).starts_with("a container recreated again within 600s waits 10s, doubling to 300s (kubelet's default)")
        );
        let capped = said(json!({"crashLoopBackOff": {"maxContainerRestartPeriod": "1m"}}));
        assert!(capped.starts_with("a container recreated again within 120s waits 10s, doubling to 60s (crashLoopBackOff.maxContainerRestartPeriod 1m"), "{capped}");
        let short = said(json!({"crashLoopBackOff": {"maxContainerRestartPeriod": "2s"}}));
        assert!(short.contains("waits 2s, doubling to 2s"), "{short}");
        let gated = said(
            json!({"crashLoopBackOff": {"maxContainerRestartPeriod": "2s"},
                                "featureGates": {"KubeletCrashLoopBackOffMax": false}}),
        );
        assert!(
            gated.contains("waits 10s, doubling to 300s") && gated.contains("is ignored"),
            "{gated}"
        );
        let reduced = said(json!({"featureGates": {"ReduceDefaultCrashLoopBackOffDecay": true}}));
        assert!(reduced.contains("waits 1s, doubling to 60s"), "{reduced}");
        assert!(
            crash_loop_backoff(&json!({"crashLoopBackOff": {"maxContainerRestartPeriod": "soon"}}))
                .is_err()
        );
    }

    #[test]
    fn go_durations_in_whole_seconds() {
        assert_eq!(go_seconds("90s"), Some(90));
        assert_eq!(go_seconds("1m30s"), Some(90));
        assert_eq!(go_seconds("500ms"), Some(1));
        assert_eq!(go_seconds("2.5m"), Some(150));
        assert_eq!(go_seconds(""), None);
        assert_eq!(go_seconds("10"), None);
        assert_eq!(go_seconds("5x"), None);
    }
}
