//! `crr-proxy restart POD -c app[,sidecar]`, also `kubectl crr restart`
//! when the binary is on PATH as `kubectl-crr`: creates a CRR for the Pod
//! and, with `--wait`, follows it to its end. It only writes a CRR, so it
//! works with either agent mode and with OpenKruise's own kruise-daemon.
//!
//! - `request`: the flags as a CRR, checked against the Pod first;
//! - `follow`: what changed between two reads, and the outcome;
//! - `target`: a Pod or `KIND/NAME`;
//! - `workload`: a workload's Pods in waves, `waves` the pure decisions of
//!   it, `seen` the cluster as its watches show it, `screen` its progress.

pub mod follow;
mod output;
pub mod request;
mod screen;
mod seen;
pub mod target;
pub mod waves;
mod workload;

use std::io::Write;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};

use crate::crr::ContainerRecreateRequest;
use crate::crr::client::{ApiVersion, CrrClient};
use follow::{Outcome, Tracker};
use output::print;
use request::{Request, RequestError};
use target::{Kind, Target};
use waves::MaxUnavailable;

pub use output::Output;

/// Where the tool finds the cluster, as kubectl does.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub kubeconfig: Option<std::path::PathBuf>,
    pub context: Option<String>,
    /// `None`: the context's namespace.
    pub namespace: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DryRun {
    None,
    /// Print what would be created; send nothing.
    Client,
    /// Have the API server judge it (admission included) without storing it.
    Server,
}

/// One run of `restart`.
#[derive(Clone, Debug)]
pub struct Options {
    pub target: Target,
    /// What to ask of each Pod (its `pod` is set per Pod).
    pub request: Request,
    pub waves: WaveOptions,
    /// Whether progress goes to a terminal (a live status line), or to a
    /// file or pipe (plain lines).
    pub live: bool,
    pub cluster: Cluster,
    pub wait: bool,
    /// How long to follow before giving up (`--timeout`): a failure.
    pub timeout: Option<Duration>,
    pub output: Option<Output>,
    pub dry_run: DryRun,
}

/// How a workload is walked through.
#[derive(Clone, Debug, Default)]
pub struct WaveOptions {
    /// `None`: one Pod at a time.
    pub max_unavailable: Option<MaxUnavailable>,
    pub continue_on_failure: bool,
    /// Resume this run: Pods it restarted already are skipped.
    pub run_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("kubernetes API")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("pod {pod} not found in namespace {namespace}")]
    NoPod { pod: String, namespace: String },
    #[error("containerrecreaterequest {0} was deleted while followed")]
    Deleted(String),
    #[error("cannot watch the CRR, its Pod and its Events")]
    Unwatchable,
    #[error("{kind} {name} not found in namespace {namespace}")]
    NoWorkload {
        kind: Kind,
        name: String,
        namespace: String,
    },
    #[error("{0} is not served by this cluster (is OpenKruise installed?)")]
    NotServed(Kind),
    #[error("{0} has no Pods to restart")]
    NoPods(String),
    #[error("run {run} restarted Pods of another workload, not {target}")]
    OtherRun { run: String, target: String },
    #[error("{0}")]
    Usage(&'static str),
    #[error("the workload's label selector: {0}")]
    Selector(String),
    #[error("write the output")]
    Output(#[source] std::io::Error),
    #[error("render the object")]
    Render(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// How a run ended, for the exit status.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Created (and, if followed, completed with every container recreated).
    Done,
    /// Followed to an end that is not a success: the reason.
    Failed(String),
    /// Ctrl-C: the follower stopped, the restart goes on.
    Interrupted,
}

/// Runs `restart`: progress goes to `progress`, the object (with `-o`) to
/// `out`.
pub async fn run(
    options: &Options,
    out: &mut (dyn Write + Send),
    progress: &mut (dyn Write + Send),
) -> Result<Ended, RestartError> {
    let (client, namespace) = connect(&options.cluster).await?;
    let version = ApiVersion::discover(&client).await?;
    let at = Place {
        crrs: CrrClient::new(client.clone(), version),
        client,
        namespace,
    };
    let run = async {
        match &options.target {
            Target::Pod(pod) => one_pod(options, &at, pod, out, progress).await,
            Target::Workload(..) | Target::Selector(_) => {
                workload::run(options, &at, &options.target, out, progress).await
            }
        }
    };
    let Some(limit) = options.timeout else {
        return run.await;
    };
    // Only the following ends: what was created goes on in the cluster.
    match tokio::time::timeout(limit, run).await {
        Ok(ended) => ended,
        Err(_) => {
            let why = format!(
                "timed out after {}s; what was created goes on: kubectl get containerrecreaterequests -n {}",
                limit.as_secs(),
                at.namespace
            );
            writeln!(progress, "{why}").map_err(RestartError::Output)?;
            Ok(Ended::Failed(why))
        }
    }
}

/// Where a run writes: the cluster, and the namespace.
struct Place {
    client: kube::Client,
    crrs: CrrClient,
    namespace: String,
}

async fn one_pod(
    options: &Options,
    at: &Place,
    pod_name: &str,
    out: &mut (dyn Write + Send),
    progress: &mut (dyn Write + Send),
) -> Result<Ended, RestartError> {
    let waves = &options.waves;
    if waves.max_unavailable.is_some() || waves.continue_on_failure || waves.run_id.is_some() {
        return Err(RestartError::Usage(
            "--max-unavailable, --continue-on-failure and --run-id apply to a workload (KIND/NAME) or a selector (-l) only",
        ));
    }
    let (client, namespace, crrs) = (&at.client, &at.namespace, &at.crrs);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut request = options.request.clone();
    request.pod = pod_name.to_owned();
    let pod = pods
        .get_opt(pod_name)
        .await?
        .ok_or_else(|| RestartError::NoPod {
            pod: pod_name.to_owned(),
            namespace: namespace.clone(),
        })?;
    let name = request.name(request::seed());
    let api_version = crrs.version().api_resource().api_version;
    let mut body = request.crr(&pod, &api_version, &name)?;
    body["metadata"]["namespace"] = namespace.clone().into();
    let say = |progress: &mut (dyn Write + Send), text: &str| {
        writeln!(progress, "{text}").map_err(RestartError::Output)
    };
    if let Some(notice) = request.defaulted_notice(&pod) {
        say(progress, &notice)?;
    }
    if options.dry_run == DryRun::Client {
        say(
            progress,
            &format!(
                "containerrecreaterequest/{name} would be created in {namespace} (client dry run)"
            ),
        )?;
        return print(out, options.output.unwrap_or(Output::Yaml), &body).map(|()| Ended::Done);
    }
    let server_dry_run = options.dry_run == DryRun::Server;
    let follow = options.wait && !server_dry_run;
    // Watching before the CRR exists: none of its changes is missed, however
    // fast the node is.
    let mut changes = if follow {
        Some(Changes::of_one(crrs, client, namespace, &name, pod_name).await?)
    } else {
        None
    };
    let created = crrs.create(namespace, &body, server_dry_run).await?;
    let dry = if server_dry_run {
        " (server dry run)"
    } else {
        ""
    };
    say(
        progress,
        &format!("containerrecreaterequest/{name} created in {namespace}{dry}"),
    )?;
    let Some(changes) = changes.as_mut() else {
        if let Some(output) = options.output {
            print(out, output, &to_value(&created)?)?;
        }
        return Ok(Ended::Done);
    };
    let interrupted = tokio::signal::ctrl_c();
    let (last, ended) = tokio::select! {
        followed = follow_to_end(changes, &created, progress) => followed?,
        _ = interrupted => {
            say(progress, &format!(
                "stopped following; the restart goes on: kubectl get containerrecreaterequest -n {namespace} {name}"
            ))?;
            return Ok(Ended::Interrupted);
        }
    };
    if let Some(output) = options.output {
        print(out, output, &to_value(&last)?)?;
    }
    Ok(ended)
}

/// One change seen by the watches of the CRRs, Pods, Events and budgets.
enum Change {
    Crr(Box<watcher::Event<ContainerRecreateRequest>>),
    Pod(Box<watcher::Event<Pod>>),
    Event(Box<watcher::Event<Event>>),
    Budget(Box<watcher::Event<PodDisruptionBudget>>),
}

type WatchStream<K> =
    futures_util::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// Watches, each forwarded into one channel by a task of its own.
struct Changes {
    rx: tokio::sync::mpsc::UnboundedReceiver<Change>,
    tx: tokio::sync::mpsc::UnboundedSender<Change>,
    listed: tokio::sync::mpsc::UnboundedSender<()>,
    ready: tokio::sync::mpsc::UnboundedReceiver<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Changes {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Changes {
    fn new() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (listed, ready) = tokio::sync::mpsc::unbounded_channel();
        Self {
            rx,
            tx,
            listed,
            ready,
            tasks: Vec::new(),
        }
    }

    /// Forwards `stream`'s events, wrapped by `wrap`.
    fn add<K: Send + 'static>(
        &mut self,
        stream: WatchStream<K>,
        wrap: fn(watcher::Event<K>) -> Change,
    ) {
        let (tx, listed) = (self.tx.clone(), self.listed.clone());
        self.tasks.push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream.default_backoff());
            while let Some(event) = stream.next().await {
                let Ok(event) = event else {
                    continue;
                };
                let done = matches!(event, watcher::Event::InitDone);
                if tx.send(wrap(event)).is_err() {
                    return;
                }
                // After the list's last event is queued: who waits for the
                // lists finds every listed object in the channel.
                if done {
                    let _ = listed.send(());
                }
            }
        }));
    }

    /// Returns once every watch has listed.
    async fn listed(&mut self) -> Result<(), RestartError> {
        for _ in 0..self.tasks.len() {
            match tokio::time::timeout(Duration::from_secs(30), self.ready.recv()).await {
                Ok(Some(())) => {}
                _ => return Err(RestartError::Unwatchable),
            }
        }
        Ok(())
    }

    /// The watches of one CRR, its Pod and the Pod's Events, listed.
    async fn of_one(
        crrs: &CrrClient,
        client: &kube::Client,
        namespace: &str,
        name: &str,
        pod: &str,
    ) -> Result<Self, RestartError> {
        let by_name = |n: &str| watcher::Config::default().fields(&format!("metadata.name={n}"));
        let mut changes = Self::new();
        changes.add(crrs.watch_in(namespace, by_name(name)).boxed(), |e| {
            Change::Crr(Box::new(e))
        });
        changes.add(
            watcher(
                Api::<Pod>::namespaced(client.clone(), namespace),
                by_name(pod),
            )
            .boxed(),
            |e| Change::Pod(Box::new(e)),
        );
        changes.add(
            watcher(
                Api::<Event>::namespaced(client.clone(), namespace),
                watcher::Config::default().fields(&format!("regarding.name={pod}")),
            )
            .boxed(),
            |e| Change::Event(Box::new(e)),
        );
        changes.listed().await?;
        Ok(changes)
    }
}

/// Follows `created` through `changes` until it is completed.
async fn follow_to_end(
    changes: &mut Changes,
    created: &ContainerRecreateRequest,
    progress: &mut (dyn Write + Send),
) -> Result<(ContainerRecreateRequest, Ended), RestartError> {
    let name = created.name_any();
    let since = created.creation_timestamp().map(|t| t.0.as_second());
    let started = Instant::now();
    let mut tracker = Tracker::default();
    let mut crr = created.clone();
    let mut pod: Option<Pod> = None;
    let mut events: Vec<Event> = Vec::new();
    while let Some(change) = changes.rx.recv().await {
        match change {
            Change::Crr(c) => match *c {
                watcher::Event::Apply(c) | watcher::Event::InitApply(c) => crr = c,
                watcher::Event::Delete(_) => return Err(RestartError::Deleted(name)),
                _ => continue,
            },
            Change::Pod(p) => match *p {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => pod = Some(p),
                watcher::Event::Delete(_) => pod = None,
                _ => continue,
            },
            Change::Event(e) => match *e {
                watcher::Event::Apply(e) | watcher::Event::InitApply(e) => {
                    // The Pod's Events since this CRR, in the order they came.
                    let at = follow::last_seen(&e);
                    if at.zip(since).is_some_and(|(at, since)| at >= since) {
                        events.push(e);
                    }
                }
                _ => continue,
            },
            Change::Budget(_) => continue,
        }
        for line in tracker.observe(started.elapsed(), &crr, pod.as_ref(), &events) {
            writeln!(progress, "{line}").map_err(RestartError::Output)?;
        }
        if let Some(outcome) = tracker.outcome(&crr) {
            let took = started.elapsed().as_secs_f64();
            let (verdict, ended) = match outcome {
                Outcome::Succeeded => (format!("succeeded in {took:.1}s"), Ended::Done),
                Outcome::Failed(why) => (
                    format!("FAILED after {took:.1}s: {why}"),
                    Ended::Failed(why),
                ),
            };
            writeln!(progress, "{name}: {verdict}").map_err(RestartError::Output)?;
            for line in tracker.summary() {
                writeln!(progress, "  {line}").map_err(RestartError::Output)?;
            }
            return Ok((crr, ended));
        }
    }
    Err(RestartError::Unwatchable)
}

/// The client and namespace: `--kubeconfig` (else `$KUBECONFIG` or
/// `~/.kube/config`, else in-cluster), `--context`, and `-n` or the
/// context's namespace.
async fn connect(cluster: &Cluster) -> Result<(kube::Client, String), RestartError> {
    let options = KubeConfigOptions {
        context: cluster.context.clone(),
        ..KubeConfigOptions::default()
    };
    let failed = |e: &dyn std::fmt::Display| RestartError::Kubeconfig(e.to_string());
    let mut config = match &cluster.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| RestartError::Kubeconfig(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| failed(&e))?
        }
        None => match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(_) if cluster.context.is_none() => {
                kube::Config::infer().await.map_err(|e| failed(&e))?
            }
            Err(error) => return Err(failed(&error)),
        },
    };
    let namespace = cluster
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    crate::version::identify(&mut config, "restart");
    let client = kube::Client::try_from(config)?;
    Ok((client, namespace))
}

fn to_value(crr: &ContainerRecreateRequest) -> Result<serde_json::Value, RestartError> {
    serde_json::to_value(crr).map_err(|e| RestartError::Render(Box::new(e)))
}
