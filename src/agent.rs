//! The ContainerRecreateRequest node agent (`--agent kruise`): a drop-in for
//! the CRR part of OpenKruise's kruise-daemon, next to the unmodified
//! kruise-manager and webhook. It watches the active CRRs of its node,
//! serialises the work per Pod, and recreates containers through the kill
//! engine; kubelet restarts them.

mod backoff;
mod queue;
mod standalone;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{LifecycleHandler, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::config::AgentSettings;
use crate::cri::Endpoint;
use crate::cri::RuntimeClient;
use crate::cri::v1::{
    ContainerFilter, ContainerState, ContainerStatusRequest, ListContainersRequest, VersionRequest,
};
use crate::crr::state::{self, Candidate, PassEnd, PodContainers, RuntimeContainer};
use crate::crr::{
    ContainerRecreateRequest, ContainerRecreateRequestStatus, ContainerRecreateState, Phase,
    SyncContainerStatus, annotations, labels,
};
use crate::kill::{self, HookResult, KillRequest, Killer};
use crate::metrics::{CrrOutcome, Metrics};
use crate::reason::Recreated;
use crate::records::Records;
use crate::telemetry::Chain;
use backoff::WatchBackoff;
use queue::{Next, Queue};

/// kruise-daemon runs 32 workers.
const WORKERS: usize = 32;
/// How long a lagging cache may hold back a Pod's work (kruise's
/// `maxExpectationWaitDuration`).
const EXPECTATION_WAIT: Duration = Duration::from_secs(10);
/// The Event source, as `kruise-daemon-crr` is for kruise.
pub const REPORTER: &str = "crr-proxy";

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("kubernetes API")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    KubeConfig(String),
    #[error("start the agent thread")]
    Thread(#[source] std::io::Error),
    #[error("runtime {call}")]
    Runtime {
        call: &'static str,
        #[source]
        status: tonic::Status,
    },
}

/// What the agent needs from its surroundings.
pub struct AgentConfig {
    pub client: kube::Client,
    pub cri: RuntimeClient,
    pub killer: Killer,
    pub node_name: String,
    pub mode: Mode,
    /// Where the containers stopped for CRRs are recorded (`reason`).
    pub recreated: Arc<Recreated>,
    /// Which container's kill began for which CRR (by uid), so that its
    /// preStop hook runs at most once across restarts and crashes.
    pub kills: Arc<Records>,
    pub metrics: Arc<Metrics>,
}

/// Who else handles CRRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Next to OpenKruise's webhook and kruise-manager.
    Kruise,
    /// Alone: crr-proxy also does the webhook's and the manager's part for
    /// the CRRs of its node.
    Standalone,
}

/// The work key: one Pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PodKey {
    namespace: String,
    pod: String,
}

struct Agent {
    client: kube::Client,
    cri: RuntimeClient,
    killer: Killer,
    store: Store<ContainerRecreateRequest>,
    recorder: Recorder,
    queue: Queue<PodKey>,
    /// Per CRR uid: the resourceVersion of our last write and when.
    expectations: Mutex<HashMap<String, (u64, Instant)>>,
    runtime_name: tokio::sync::OnceCell<String>,
    /// Standalone mode's extra watches.
    standalone: Option<standalone::Parts>,
    recreated: Arc<Recreated>,
    kills: Arc<Records>,
    metrics: Arc<Metrics>,
    /// When the agent first saw each CRR (by uid), for seen-to-stopped.
    first_seen: Mutex<HashMap<String, Instant>>,
}

/// The Kubernetes client configuration: `--kubeconfig`, else `$KUBECONFIG`
/// or `~/.kube/config`, else the in-cluster service account.
pub async fn kube_config(settings: &AgentSettings) -> Result<kube::Config, AgentError> {
    match &settings.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| AgentError::KubeConfig(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| AgentError::KubeConfig(format!("{}: {e}", path.display())))
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| AgentError::KubeConfig(e.to_string())),
    }
}

/// The agent's thread, as the daemon sees it.
pub struct AgentHandle {
    stop: watch::Sender<bool>,
    stopped: tokio::sync::oneshot::Receiver<()>,
}

impl AgentHandle {
    /// Stops the agent: no new work starts, and this returns once the work
    /// in flight (a kill with its preStop hook, and its status write) is
    /// over. The caller bounds the wait.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.stopped.await;
    }
}

/// Loads the Kubernetes client configuration (a bad kubeconfig fails here,
/// at start-up) and runs the agent on a thread and runtime of its own.
/// Reaching the API server is the agent's business alone: the proxy starts
/// and serves whether or not it answers.
pub async fn spawn(
    settings: &AgentSettings,
    runtime: &Endpoint,
    synced: watch::Sender<bool>,
    recreated: Arc<Recreated>,
    metrics: Arc<Metrics>,
) -> Result<AgentHandle, AgentError> {
    let config = kube_config(settings).await?;
    let kills = Records::open(&settings.kills_file).unwrap_or_else(|error| {
        warn!(error = %Chain(&error), "a preStop hook cut short by a restart will run again");
        Records::in_memory()
    });
    let kills = Arc::new(kills);
    let node_name = settings.node_name.clone();
    let mode = settings.mode;
    let endpoint = runtime.clone();
    let (stop, mut stopping) = watch::channel(false);
    let (stopped, stopped_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("crr-agent".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("crr-agent")
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    error!(%error, "cannot start the agent's runtime; the proxy goes on without it");
                    return;
                }
            };
            runtime.block_on(async move {
                let client = match kube::Client::try_from(config) {
                    Ok(client) => client,
                    Err(error) => {
                        error!(%error, "cannot build the Kubernetes client; the proxy goes on without the agent");
                        return;
                    }
                };
                let cri = crate::cri::runtime_client(crate::cri::channel(&endpoint));
                let killer = Killer::new(cri.clone(), None);
                let config = AgentConfig {
                    client,
                    cri,
                    killer,
                    node_name,
                    mode,
                    recreated,
                    kills,
                    metrics,
                };
                let shutdown = async move {
                    let _ = stopping.wait_for(|stop| *stop).await;
                };
                run(config, synced, shutdown).await;
                let _ = stopped.send(());
            });
        })
        .map_err(AgentError::Thread)?;
    Ok(AgentHandle {
        stop,
        stopped: stopped_rx,
    })
}

/// Runs the agent until `shutdown` resolves. `synced` turns true once
/// every watch has listed everything (readiness).
pub async fn run(
    config: AgentConfig,
    synced: watch::Sender<bool>,
    shutdown: impl Future<Output = ()>,
) {
    let AgentConfig {
        client,
        cri,
        killer,
        node_name,
        mode,
        recreated,
        kills,
        metrics,
    } = config;
    let selector = format!("{}={node_name},{}=true", labels::NODE_NAME, labels::ACTIVE);
    let (store, writer) = reflector::store();
    let active = watcher(
        Api::<ContainerRecreateRequest>::all(client.clone()),
        watcher::Config::default().labels(&selector),
    )
    .reflect(writer);
    let reporter = Reporter {
        controller: REPORTER.into(),
        instance: Some(truncated(node_name.clone(), INSTANCE_LIMIT, "")),
    };
    let (standalone, streams) = match mode {
        Mode::Kruise => (None, None),
        Mode::Standalone => {
            let (parts, streams) = standalone::watches(&client, &node_name);
            (Some(parts), Some(streams))
        }
    };
    let agent = Arc::new(Agent {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        cri,
        killer,
        store,
        queue: Queue::default(),
        expectations: Mutex::new(HashMap::new()),
        runtime_name: tokio::sync::OnceCell::new(),
        standalone,
        recreated,
        kills,
        metrics,
        first_seen: Mutex::new(HashMap::new()),
    });
    info!(node = %node_name, %selector, ?mode, "watching ContainerRecreateRequests");
    let gate = Arc::new(SyncGate::new(if streams.is_some() { 4 } else { 1 }, synced));
    let (stop, stopping) = watch::channel(false);
    let dispatcher = tokio::spawn(Arc::clone(&agent).dispatch(Arc::clone(&gate), stopping));
    let mut followers = vec![tokio::spawn(follow(
        active,
        "active CRRs",
        Arc::clone(&agent),
        Arc::clone(&gate),
    ))];
    if let Some(streams) = streams {
        followers.extend(streams.spawn(&agent, &gate));
    }
    shutdown.await;
    info!("agent stopping: no new work; waiting for the work in flight");
    let _ = stop.send(true);
    let _ = dispatcher.await;
    for follower in followers {
        follower.abort();
    }
    info!("agent stopped");
}

/// Turns true once every watch has synced once.
struct SyncGate {
    waiting: Mutex<usize>,
    synced: watch::Sender<bool>,
}

impl SyncGate {
    fn new(watches: usize, synced: watch::Sender<bool>) -> Self {
        Self {
            waiting: Mutex::new(watches),
            synced,
        }
    }

    /// Returns once every watch has synced once.
    async fn wait(&self) {
        let mut synced = self.synced.subscribe();
        let _ = synced.wait_for(|synced| *synced).await;
    }

    fn one_synced(&self) {
        if let Ok(mut waiting) = self.waiting.lock() {
            *waiting = waiting.saturating_sub(1);
            if *waiting == 0 {
                let _ = self.synced.send(true);
            }
        }
    }
}

/// Something the agent watches: which Pod an object's change concerns.
trait Watched {
    fn pod_key(&self) -> Option<PodKey>;
    /// Note the object's arrival.
    fn seen(&self, _agent: &Agent) {}
    /// Drop what the agent remembers of a deleted object.
    fn forget(&self, _agent: &Agent) {}
}

impl Watched for ContainerRecreateRequest {
    fn pod_key(&self) -> Option<PodKey> {
        Some(pod_key(self))
    }

    fn seen(&self, agent: &Agent) {
        if let (Some(uid), Ok(mut seen)) = (self.uid(), agent.first_seen.lock()) {
            if !is_finished(self) {
                seen.entry(uid).or_insert_with(Instant::now);
            }
        }
    }

    fn forget(&self, agent: &Agent) {
        agent.forget(self);
    }
}

/// Feeds one watch into the queue. Every change, deletions and finished CRRs
/// included, wakes its Pod: kruise ignores those, which leaves the Pod's
/// next CRR Pending until something else touches it (#1626, #2474).
///
/// A listing (at start, and the relist after a 410) reaches the reflector's
/// store only whole, at `InitDone`: a sync started by an `InitApply` would
/// read the store from before. So the Pods of a listing are queued at its
/// `InitDone`, together with the Pods of the listing before (a CRR of theirs
/// may have gone meanwhile).
async fn follow<K, S>(events: S, what: &'static str, agent: Arc<Agent>, gate: Arc<SyncGate>)
where
    K: Watched,
    S: futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut events = std::pin::pin!(events);
    let mut backoff = WatchBackoff::default();
    let mut synced = false;
    // The Pods of the listing under way, and of the last one (and since).
    let mut listing = HashSet::new();
    let mut listed = HashSet::new();
    while let Some(event) = events.next().await {
        if event.is_ok() {
            backoff.reset();
        }
        match event {
            Ok(watcher::Event::InitApply(obj)) => {
                obj.seen(&agent);
                listing.extend(obj.pod_key());
            }
            Ok(watcher::Event::Apply(obj)) => {
                obj.seen(&agent);
                if let Some(key) = obj.pod_key() {
                    listed.insert(key.clone());
                    agent.queue.add(key);
                }
            }
            Ok(watcher::Event::Delete(obj)) => {
                obj.forget(&agent);
                if let Some(key) = obj.pod_key() {
                    agent.queue.add(key);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let fresh = std::mem::take(&mut listing);
                for key in listed.drain().chain(fresh.iter().cloned()) {
                    agent.queue.add(key);
                }
                listed = fresh;
                if !synced {
                    synced = true;
                    gate.one_synced();
                }
            }
            Ok(watcher::Event::Init) => listing.clear(),
            // The watcher re-lists (410 Gone) or watches again once polled;
            // the reflector keeps the last state meanwhile.
            Err(error) => {
                let delay = backoff.after(&error);
                warn!(%error, what, ?delay, "watch failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
    warn!(what, "watch ended");
}

fn pod_key(crr: &ContainerRecreateRequest) -> PodKey {
    PodKey {
        namespace: crr.namespace().unwrap_or_default(),
        pod: crr.spec.pod_name.clone(),
    }
}

/// How a completion counts in `crr_proxy_crr_recreations_total`.
fn outcome(crr: &ContainerRecreateRequest, message: &str) -> CrrOutcome {
    match message {
        "" if crr.status.as_ref().is_some_and(|s| {
            s.container_recreate_states
                .iter()
                .any(|c| c.phase == Phase::Failed)
        }) =>
        {
            CrrOutcome::Failed
        }
        "" => CrrOutcome::Succeeded,
        "pod has gone" => CrrOutcome::PodGone,
        standalone::DEADLINE_EXCEEDED => CrrOutcome::DeadlineExceeded,
        _ => CrrOutcome::Refused,
    }
}

fn is_finished(crr: &ContainerRecreateRequest) -> bool {
    crr.meta().deletion_timestamp.is_some()
        || crr
            .status
            .as_ref()
            .is_some_and(|s| s.completion_time.is_some())
}

fn phase(crr: &ContainerRecreateRequest) -> Phase {
    crr.status
        .as_ref()
        .map(|s| s.phase.clone())
        .unwrap_or_default()
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

// === impl Agent ===

impl Agent {
    /// Runs the syncs of due Pods, once every watch has listed: a sync
    /// reads several stores, and one not yet listed would make a Pod or a
    /// CRR look absent.
    /// Once `stop` turns true, it starts nothing more and returns when the
    /// syncs under way are over: a kill is not abandoned half-way.
    async fn dispatch(self: Arc<Self>, gate: Arc<SyncGate>, mut stop: watch::Receiver<bool>) {
        let workers = Arc::new(Semaphore::new(WORKERS));
        tokio::select! {
            () = gate.wait() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        loop {
            let (ready, next) = self.queue.take_due();
            for key in ready {
                let permit = tokio::select! {
                    permit = Arc::clone(&workers).acquire_owned() => permit,
                    _ = stop.wait_for(|stop| *stop) => break,
                };
                let Ok(permit) = permit else {
                    return;
                };
                let agent = Arc::clone(&self);
                let span = info_span!("pod", namespace = %key.namespace, pod = %key.pod);
                tokio::spawn(
                    async move {
                        let next = match agent.sync(&key).await {
                            Ok(next) => next,
                            Err(error) => {
                                warn!(error = %Chain(&error), "sync failed; backing off");
                                Next::Failed
                            }
                        };
                        agent.queue.done(key, next);
                        drop(permit);
                    }
                    .instrument(span),
                );
            }
            tokio::select! {
                () = self.queue.wait(next) => {}
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        let _ = workers.acquire_many(WORKERS as u32).await;
    }

    /// One pass over the CRRs of one Pod: in standalone mode the manager's
    /// part first, then the daemon's.
    async fn sync(&self, key: &PodKey) -> Result<Next, AgentError> {
        self.metrics.crr_reconciled();
        self.metrics.set_active_crrs(
            self.store
                .state()
                .iter()
                .filter(|c| !is_finished(c))
                .count(),
        );
        let mut hint = Next::Done;
        if let Some(parts) = &self.standalone {
            match standalone::manage_pod(self, parts, key).await? {
                standalone::Outcome::Wrote => return Ok(Next::Done),
                standalone::Outcome::Continue(next) => hint = next,
            }
        }
        Ok(self.daemon_sync(key).await?.sooner(hint))
    }

    /// kruise-daemon's `sync` for one Pod.
    async fn daemon_sync(&self, key: &PodKey) -> Result<Next, AgentError> {
        let crrs: Vec<Arc<ContainerRecreateRequest>> = self
            .store
            .state()
            .into_iter()
            .filter(|c| {
                c.namespace().as_deref() == Some(key.namespace.as_str())
                    && c.spec.pod_name == key.pod
            })
            .collect();
        if crrs.is_empty() {
            return Ok(Next::Done);
        }
        let candidates: Vec<Candidate> = crrs
            .iter()
            .map(|c| Candidate {
                name: c.name_any(),
                phase: phase(c),
                created: c
                    .meta()
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_second()),
                finished: is_finished(c),
            })
            .collect();
        for crr in crrs.iter().filter(|c| is_finished(c)) {
            self.forget(crr);
        }
        let by_name = |name: &str| crrs.iter().find(|c| c.name_any() == name);
        let picked = state::pick(&candidates, |name| {
            by_name(name).is_none_or(|c| self.is_current(c))
        });
        for name in &picked.set_pending {
            if let Some(crr) = by_name(name) {
                self.set_phase(crr, Phase::Pending).await?;
            }
        }
        let Some(crr) = picked.picked.as_deref().and_then(by_name) else {
            // Held back by a lagging cache: its watch event brings us back;
            // if it never comes, the expectation lapses.
            return Ok(Next::After(EXPECTATION_WAIT));
        };
        let span = info_span!(
            "crr",
            namespace = %crr.namespace().unwrap_or_default(),
            crr = %crr.name_any(),
            pod = %crr.spec.pod_name,
        );
        async {
            if phase(crr) != Phase::Recreating {
                self.set_phase(crr, Phase::Recreating).await?;
                return Ok(Next::Done);
            }
            if let Some(grace) = crr
                .spec
                .strategy
                .as_ref()
                .and_then(|s| s.unready_grace_period_seconds)
            {
                // An empty stamp is none (kruise waits for it, too).
                let stamp = crr
                    .annotations()
                    .get(annotations::UNREADY_ACQUIRED)
                    .filter(|stamp| !stamp.is_empty());
                let Some(stamp) = stamp else {
                    match &self.standalone {
                        Some(parts) => standalone::acquire_unready(self, parts, crr).await?,
                        None => debug!("waiting for kruise-manager to make the Pod not ready"),
                    }
                    return Ok(Next::Done);
                };
                let acquired = match stamp.parse::<Timestamp>() {
                    Ok(at) => at,
                    Err(error) => {
                        self.complete(
                            crr,
                            &format!("failed to parse unready time {stamp}: {error}"),
                        )
                        .await?;
                        return Ok(Next::Done);
                    }
                };
                let waited = Timestamp::now().as_millisecond() - acquired.as_millisecond();
                let left = grace.saturating_mul(1000).saturating_sub(waited);
                if left > 0 {
                    let left = Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
                    return Ok(Next::After(left + Duration::from_millis(100)));
                }
            }
            self.manage(crr).await
        }
        .instrument(span)
        .await
    }

    /// Steps A to I for the picked CRR.
    async fn manage(&self, crr: &ContainerRecreateRequest) -> Result<Next, AgentError> {
        let runtime = self.runtime_name().await?;
        if let Err(reason) = check_runtime(crr, runtime) {
            self.complete(crr, &format!("failed to find runtime service: {reason}"))
                .await?;
            return Ok(Next::Done);
        }
        let pod_uid = crr
            .labels()
            .get(labels::POD_UID)
            .cloned()
            .unwrap_or_default();
        let containers = self.pod_containers(&pod_uid, runtime).await?;
        // What kruise-manager reports of the Pod; in standalone mode, the
        // Pod's own status.
        let sync: HashMap<String, SyncContainerStatus> = match &self.standalone {
            Some(parts) => parts.sync_statuses(&pod_key(crr)),
            None => crr
                .annotations()
                .get(annotations::SYNC_CONTAINER_STATUSES)
                .and_then(|raw| serde_json::from_str::<Vec<SyncContainerStatus>>(raw).ok())
                .unwrap_or_default()
                .into_iter()
                .map(|s| (s.name.clone(), s))
                .collect(),
        };
        let previous = crr
            .status
            .as_ref()
            .map(|s| s.container_recreate_states.clone())
            .unwrap_or_default();
        let states = state::current_states(&crr.spec, &previous, &containers, &sync, now_nanos());
        if states != previous {
            // Publish the states before any kill.
            self.patch_states(crr, &states).await?;
            return Ok(Next::Done);
        }
        let strategy = crr.spec.strategy.clone().unwrap_or_default();
        let end = state::kill_pass(&states, &strategy, &containers, |name| {
            self.kill(crr, containers.newest(&name).map(|c| c.id.clone()), name)
        })
        .await;
        Ok(match end {
            PassEnd::Patch(states) => {
                self.patch_states(crr, &states).await?;
                Next::Done
            }
            PassEnd::Complete => {
                self.complete(crr, "").await?;
                Next::Done
            }
            PassEnd::Requeue(after) => Next::After(after),
            PassEnd::Wait => Next::Done,
        })
    }

    /// Kills one container of `crr` (synchronously: preStop, then stop).
    fn kill(
        &self,
        crr: &ContainerRecreateRequest,
        runtime_id: Option<String>,
        name: String,
    ) -> impl Future<Output = Result<(), String>> + use<'_> {
        let (crr_namespace, crr_name) = (crr.namespace().unwrap_or_default(), crr.name_any());
        let crr_uid = crr.uid();
        let message = format!("Stopping container {name} by ContainerRecreateRequest {crr_name}");
        let spec = crr.spec.containers.iter().find(|c| c.name == name).cloned();
        let grace_period = crr
            .spec
            .strategy
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds);
        let reference = ObjectReference {
            kind: Some("Pod".into()),
            api_version: Some("v1".into()),
            namespace: crr.namespace(),
            name: Some(crr.spec.pod_name.clone()),
            uid: crr.labels().get(labels::POD_UID).cloned(),
            field_path: Some(format!("spec.containers{{{name}}}")),
            ..Default::default()
        };
        async move {
            let id = runtime_id
                .as_deref()
                .and_then(|id| id.split_once("://").map(|(_, id)| id.to_owned()))
                .ok_or_else(|| format!("no runtime container for {name}"))?;
            // A kill that began before a restart (its hook perhaps cut short)
            // goes straight to StopContainer: the hook runs at most once.
            let resumed = crr_uid
                .as_deref()
                .is_some_and(|uid| self.kills.get(&id).as_deref() == Some(uid));
            if let (false, Some(uid)) = (resumed, crr_uid.as_deref()) {
                if let Err(error) = self.kills.insert(&id, uid) {
                    warn!(error = %Chain(&error), "a restart during this kill would run its preStop hook again");
                }
            }
            let request = KillRequest {
                skip_pre_stop: resumed,
                grace_period,
                // The webhook's copy of the Pod's preStop; without one, the
                // container's own annotation (which may hold `sleep`). The
                // webhook copies a sleep-only preStop as `{}`: that is none.
                pre_stop: spec
                    .as_ref()
                    .and_then(|c| c.pre_stop.as_ref())
                    .filter(|p| p.exec.is_some() || p.http_get.is_some() || p.tcp_socket.is_some())
                    .map(|p| LifecycleHandler {
                        exec: p.exec.clone(),
                        http_get: p.http_get.clone(),
                        tcp_socket: p.tcp_socket.clone(),
                        ..Default::default()
                    }),
                ports: spec
                    .as_ref()
                    .map(|c| c.ports.clone())
                    .filter(|p| !p.is_empty()),
                message: Some(message.clone()),
            };
            self.event(&reference, EventType::Normal, "Killing", message)
                .await;
            let outcome = self
                .killer
                .kill(&id, request)
                .await
                .map_err(|e| e.to_string().replace(&id, &name))?;
            if let Some(hook) = &outcome.hook {
                if let HookResult::Failed(text) = &hook.result {
                    self.event(
                        &reference,
                        EventType::Warning,
                        "FailedPreStopHook",
                        text.replace(&id, &name),
                    )
                    .await;
                }
                if hook.http_fallback {
                    let note = "HTTP lifecycle hook for preStop fell back to HTTP: the server answered HTTPS in plain HTTP";
                    self.event(
                        &reference,
                        EventType::Warning,
                        "LifecycleHTTPFallback",
                        note.into(),
                    )
                    .await;
                }
            }
            if let Some(hook) = &outcome.hook {
                let failed = !matches!(hook.result, HookResult::Succeeded);
                self.metrics.pre_stop_finished(hook.took, failed);
            }
            if outcome.stop_timeout.is_some() {
                let seen = crr_uid
                    .as_ref()
                    .and_then(|uid| self.first_seen.lock().ok()?.get(uid).copied());
                if let Some(seen) = seen {
                    self.metrics.container_stopped(seen.elapsed());
                }
                // StopContainer went out: from now on kubelet is told why.
                let crr_key = format!("{}/{}", crr_namespace, crr_name);
                if let Err(error) = self.recreated.record(&id, &crr_key) {
                    warn!(error = %Chain(&error), "the restart reason will not survive a restart");
                }
            }
            info!(container = %name, after = ?outcome.after, "container killed");
            Ok(())
        }
    }

    async fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let note = truncated(note, NOTE_LIMIT, " ...");
        let event = || Event {
            type_,
            reason: reason.into(),
            note: Some(note.clone()),
            action: reason.into(),
            secondary: None,
        };
        let Err(error) = self.recorder.publish(&event(), reference).await else {
            return;
        };
        // kube's client retries 429 and 503 by itself; other failures (a 500
        // from an API server under load) are retried here, in the background
        // so that the kill goes on, a few times as client-go's broadcaster does.
        debug!(%error, reason, "could not record an Event; retrying");
        let (recorder, reference, event) = (self.recorder.clone(), reference.clone(), event());
        tokio::spawn(async move {
            let mut last = error;
            for delay in EVENT_RETRIES {
                tokio::time::sleep(delay).await;
                match recorder.publish(&event, &reference).await {
                    Ok(()) => return,
                    Err(error) => last = error,
                }
            }
            warn!(error = %last, reason = %event.reason, "could not record an Event");
        });
    }

    /// The runtime's name (`containerd`), as in containerIDs' prefix.
    async fn runtime_name(&self) -> Result<&str, AgentError> {
        let name = self
            .runtime_name
            .get_or_try_init(|| async {
                let version = self
                    .cri
                    .clone()
                    .version(VersionRequest::default())
                    .await
                    .map_err(|status| AgentError::Runtime {
                        call: "Version",
                        status,
                    })?;
                Ok::<_, AgentError>(version.into_inner().runtime_name)
            })
            .await?;
        Ok(name.as_str())
    }

    /// The Pod's containers on this node (all states), as kubelet's
    /// GetPodStatus reads them.
    async fn pod_containers(
        &self,
        pod_uid: &str,
        runtime: &str,
    ) -> Result<PodContainers, AgentError> {
        let mut cri = self.cri.clone();
        let listed = cri
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    label_selector: HashMap::from([(
                        kill::keys::POD_UID.to_owned(),
                        pod_uid.to_owned(),
                    )]),
                    ..Default::default()
                }),
            })
            .await
            .map_err(|status| AgentError::Runtime {
                call: "ListContainers",
                status,
            })?
            .into_inner()
            .containers;
        let mut containers = Vec::with_capacity(listed.len());
        for container in listed {
            let status = cri
                .container_status(ContainerStatusRequest {
                    container_id: container.id.clone(),
                    verbose: false,
                })
                .await
                .map_err(|status| AgentError::Runtime {
                    call: "ContainerStatus",
                    status,
                })?
                .into_inner()
                .status
                .unwrap_or_default();
            let state = status.state();
            containers.push(RuntimeContainer {
                id: format!("{runtime}://{}", status.id),
                name: status
                    .labels
                    .get(kill::keys::CONTAINER_NAME)
                    .cloned()
                    .unwrap_or_default(),
                restart_count: status
                    .annotations
                    .get(kill::keys::RESTART_COUNT)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
                state,
                created_at: status.created_at,
                started_at: (state != ContainerState::ContainerCreated)
                    .then_some(status.started_at),
            });
        }
        Ok(PodContainers::new(containers))
    }

    // --- status writes (§2.3.4) ---

    /// A full status update from the cached object: a conflict means the
    /// cache is behind, and the back-off retries with a fresher copy.
    async fn set_phase(
        &self,
        crr: &ContainerRecreateRequest,
        phase: Phase,
    ) -> Result<(), AgentError> {
        let mut next = crr.clone();
        next.status
            .get_or_insert_with(ContainerRecreateRequestStatus::default)
            .phase = phase.clone();
        debug!(crr = %crr.name_any(), ?phase, "setting phase");
        let written = self
            .api(crr)
            .replace_status(&crr.name_any(), &PostParams::default(), &next)
            .await?;
        self.expect(&written);
        Ok(())
    }

    async fn complete(
        &self,
        crr: &ContainerRecreateRequest,
        message: &str,
    ) -> Result<(), AgentError> {
        let written = complete(&self.api(crr), crr, message).await?;
        // The expectation stays until the cache shows the completion: a
        // sync that reads the copy from before leaves the CRR alone.
        self.expect(&written);
        self.metrics.crr_completed(outcome(crr, message));
        if let (Some(uid), Ok(mut seen)) = (crr.uid(), self.first_seen.lock()) {
            seen.remove(&uid);
        }
        Ok(())
    }

    /// A merge patch of the whole state list; nothing else is touched.
    async fn patch_states(
        &self,
        crr: &ContainerRecreateRequest,
        states: &[ContainerRecreateState],
    ) -> Result<(), AgentError> {
        let patch = json!({"status": {"containerRecreateStates": states}});
        let written = self
            .api(crr)
            .patch_status(
                &crr.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.expect(&written);
        Ok(())
    }

    fn api(&self, crr: &ContainerRecreateRequest) -> Api<ContainerRecreateRequest> {
        Api::namespaced(self.client.clone(), &crr.namespace().unwrap_or_default())
    }

    // --- resourceVersion expectations ---

    fn expect(&self, written: &ContainerRecreateRequest) {
        if let (Some(uid), Some(rv)) = (written.uid(), resource_version(written)) {
            if let Ok(mut expectations) = self.expectations.lock() {
                expectations.insert(uid, (rv, Instant::now()));
            }
        }
    }

    fn forget(&self, crr: &ContainerRecreateRequest) {
        if let (Some(uid), Ok(mut expectations)) = (crr.uid(), self.expectations.lock()) {
            expectations.remove(&uid);
        }
        if let (Some(uid), Ok(mut seen)) = (crr.uid(), self.first_seen.lock()) {
            seen.remove(&uid);
        }
    }

    /// False while the cached copy is older than our last write to it.
    fn is_current(&self, crr: &ContainerRecreateRequest) -> bool {
        let (Some(uid), Ok(mut expectations)) = (crr.uid(), self.expectations.lock()) else {
            return true;
        };
        let Some((expected, since)) = expectations.get(&uid).copied() else {
            return true;
        };
        let caught_up = resource_version(crr).is_some_and(|rv| rv >= expected);
        if caught_up || since.elapsed() > EXPECTATION_WAIT {
            expectations.remove(&uid);
            return true;
        }
        false
    }
}

/// A CRR's completion: a full status update (phase, completionTime,
/// message) from `crr`, as kruise writes it.
async fn complete(
    api: &Api<ContainerRecreateRequest>,
    crr: &ContainerRecreateRequest,
    message: &str,
) -> Result<ContainerRecreateRequest, kube::Error> {
    let mut next = crr.clone();
    let status = next
        .status
        .get_or_insert_with(ContainerRecreateRequestStatus::default);
    status.phase = Phase::Completed;
    status.completion_time = Some(Time(Timestamp::now()));
    status.message = message.to_owned();
    info!(crr = %crr.name_any(), message, "completing");
    api.replace_status(&crr.name_any(), &PostParams::default(), &next)
        .await
}

fn resource_version(crr: &ContainerRecreateRequest) -> Option<u64> {
    crr.resource_version().and_then(|rv| rv.parse().ok())
}

/// Step A: every container must name this node's runtime in its
/// statusContext's containerID (`<runtime>://<id>`).
fn check_runtime(crr: &ContainerRecreateRequest, runtime: &str) -> Result<(), String> {
    let mut found: Option<&str> = None;
    for container in &crr.spec.containers {
        let id = container
            .status_context
            .as_ref()
            .map(|c| c.container_id.as_str())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                format!(
                    "no statusContext or empty containerID in {} container",
                    container.name
                )
            })?;
        let parts: Vec<&str> = id.split("://").collect();
        let [kind, _] = parts.as_slice() else {
            return Err(format!(
                "failed to parse containerID {id} in {} container",
                container.name
            ));
        };
        match found {
            Some(seen) if seen != *kind => {
                return Err(format!("has different runtime types {seen}, {kind} in Pod"));
            }
            _ => found = Some(kind),
        }
    }
    match found {
        None => Err("no runtime type found in Pod".into()),
        Some(kind) if kind != runtime => {
            Err(format!("not found runtime service for {kind} in daemon"))
        }
        Some(_) => Ok(()),
    }
}

/// How long to wait before each further try of an Event write that failed.
const EVENT_RETRIES: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// events.k8s.io refuses a note over 1 024 bytes and a reportingInstance
/// over 128 (an Event that breaks either is lost).
const NOTE_LIMIT: usize = 1024;
const INSTANCE_LIMIT: usize = 128;

/// `text` cut to at most `limit` bytes, ending in `suffix` when cut, as the
/// scheduler cuts its Event notes (here on a character boundary).
fn truncated(mut text: String, limit: usize, suffix: &str) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit.saturating_sub(suffix.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(suffix);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_and_instances_are_cut_to_what_the_api_server_takes() {
        let long = "é".repeat(700);
        let note = truncated(long.clone(), NOTE_LIMIT, " ...");
        assert!(
            note.len() <= NOTE_LIMIT && note.ends_with(" ..."),
            "{}",
            note.len()
        );
        assert!(long.starts_with(note.trim_end_matches(" ...")));
        assert_eq!(truncated("short".into(), NOTE_LIMIT, " ..."), "short");
        let node = truncated("n".repeat(253), INSTANCE_LIMIT, "");
        assert_eq!(node.len(), INSTANCE_LIMIT);
    }
    use crate::crr::{ContainerRecreateRequestContainer, ContainerRecreateRequestContainerContext};

    fn crr(ids: &[(&str, Option<&str>)]) -> ContainerRecreateRequest {
        let mut crr = ContainerRecreateRequest::new("c", Default::default());
        crr.spec.containers = ids
            .iter()
            .map(|(name, id)| ContainerRecreateRequestContainer {
                name: (*name).into(),
                status_context: id.map(|id| ContainerRecreateRequestContainerContext {
                    container_id: id.into(),
                    restart_count: 0,
                }),
                ..Default::default()
            })
            .collect();
        crr
    }

    #[test]
    fn runtime_checks_use_kruises_messages() {
        let ok = crr(&[("a", Some("containerd://1")), ("b", Some("containerd://2"))]);
        assert_eq!(check_runtime(&ok, "containerd"), Ok(()));
        let cases = [
            (
                crr(&[("a", None)]),
                "no statusContext or empty containerID in a container",
            ),
            (
                crr(&[("a", Some(""))]),
                "no statusContext or empty containerID in a container",
            ),
            (
                crr(&[("a", Some("abc"))]),
                "failed to parse containerID abc in a container",
            ),
            (
                crr(&[("a", Some("containerd://1")), ("b", Some("docker://2"))]),
                "has different runtime types containerd, docker in Pod",
            ),
            (crr(&[]), "no runtime type found in Pod"),
            (
                crr(&[("a", Some("cri-o://1"))]),
                "not found runtime service for cri-o in daemon",
            ),
        ];
        for (crr, message) in cases {
            assert_eq!(check_runtime(&crr, "containerd"), Err(message.to_owned()));
        }
    }
}
