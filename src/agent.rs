//! The ContainerRecreateRequest node agent: a drop-in for the CRR part of
//! OpenKruise's kruise-daemon (`--agent kruise`, next to the unmodified
//! kruise-manager and webhook), or all of OpenKruise's CRR handling for the
//! CRRs of its node (`--agent standalone`). It watches the active CRRs of
//! its node, serialises the work per Pod, and recreates containers through
//! the kill engine; kubelet restarts them.
//!
//! This file starts and stops it; the parts are its children, which take
//! its types but call none of its functions:
//!
//! - `work`: the dispatcher of due Pods to the workers, and one Pod's pass;
//! - `context`: what every part works through, a part per job: the status
//!   writes, `expectations`, `runtime` (its reads), `events`, the kill
//!   engine and its records, the metrics;
//! - `daemon`: kruise-daemon's sync of one Pod; `kill_order`: what one
//!   container's kill asks and tells, decided apart from its I/O;
//! - `manager`: the webhook's and kruise-manager's duties, kruise's or
//!   `standalone`'s;
//! - `lease`, `claim`: in standalone mode, the election of the one node
//!   that claims new CRRs for the nodes of their Pods, and its claims;
//! - `watches`, `queue`, `backoff`: the watches, the per-Pod queue and its
//!   key, and the watch back-off;
//! - `credentials`: the kubeconfig, and the client that follows its
//!   credentials;
//! - `restarts`: whether kubelet will start a container again, before a kill;
//! - `kruise_daemon`: in kruise mode, standing aside for a kruise-daemon on
//!   the same node.
//!
//! Why not kube-runtime's `Controller`: it reconciles one object at a time
//! and re-runs on a timer, while kruise's daemon works per Pod (one CRR of
//! a Pod at a time, chosen among all of the Pod's), wakes the Pod for any of
//! its objects in up to four watches (the active CRRs, and in standalone
//! mode the node's Pods, new and finished CRRs), holds a Pod back while the
//! cache lags a write (resourceVersion expectations), and must not start
//! before every watch has listed. Mapping objects to a Pod key fits
//! `Controller::watches`, but the per-key sync over several stores, the
//! expectations and the start gate would each be built around it; the queue
//! here (`queue`, 200 lines with its tests) is the smaller thing to own.

mod backoff;
mod claim;
mod context;
mod credentials;
mod daemon;
mod error;
mod events;
mod expectations;
mod kill_order;
pub mod kruise_daemon;
mod lease;
mod manager;
mod queue;
mod restarts;
mod runtime;
mod standalone;
mod watches;
mod work;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::cri::Endpoint;
use crate::cri::RuntimeClient;
use crate::crr::client::{ApiVersion, CrrClient};
use crate::crr::labels;
use crate::kill::Killer;
use crate::metrics::Metrics;
use crate::reason::Recreated;
use crate::records::Records;
use crate::telemetry::Chain;
use context::{Context, KillRecords};
use events::{Events, INSTANCE_LIMIT, truncated};
use expectations::Expectations;
use manager::Manager;
use queue::Queue;
use runtime::Runtime;
use watches::{SyncGate, Wakes, follow};
use work::Agent;

pub use credentials::kube_config;
pub use error::AgentError;
pub use lease::{LeaseSettings, WallClock};
pub use manager::Mode;
pub use restarts::KubeletSettings;

/// The Event source, as `kruise-daemon-crr` is for kruise.
pub const REPORTER: &str = "crr-proxy";

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
    /// Standalone mode's election (`lease`); unused in kruise mode.
    pub lease: LeaseSettings,
    /// What the agent reads of kubelet's restart decisions (`restarts`).
    pub kubelet: KubeletSettings,
}

/// What the CRR agent needs to start.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub node_name: String,
    /// `None`: `$KUBECONFIG` or `~/.kube/config`, else the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    pub mode: Mode,
    /// The file of containers whose kill began (their preStop runs at most
    /// once, across restarts).
    pub kills_file: PathBuf,
    /// Standalone mode's election.
    pub lease: LeaseSettings,
    /// What the agent reads of kubelet's restart decisions.
    pub kubelet: KubeletSettings,
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

/// Runs the agent on a thread and runtime of its own. Nothing the agent
/// needs stops the proxy: a kubeconfig that is missing or bad (kubelet's
/// before `kubeadm join` has written it) is logged and read again, with a
/// back-off up to a minute, until it works; reaching the API server is the
/// agent's business alone. Only a thread that cannot start is an error.
pub async fn spawn(
    settings: &AgentSettings,
    runtime: &Endpoint,
    synced: watch::Sender<bool>,
    recreated: Arc<Recreated>,
    metrics: Arc<Metrics>,
) -> Result<AgentHandle, AgentError> {
    let kills = Records::open(&settings.kills_file).unwrap_or_else(|error| {
        warn!(error = %Chain(&error), "a preStop hook cut short by a restart will run again");
        Records::in_memory()
    });
    let kills = Arc::new(kills);
    let node_name = settings.node_name.clone();
    let mode = settings.mode;
    let lease = settings.lease.clone();
    let kubelet = settings.kubelet.clone();
    let endpoint = runtime.clone();
    let kubeconfig = settings.kubeconfig.clone();
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
                let client = tokio::select! {
                    client = credentials::client_when_configured(kubeconfig.as_deref(), &metrics) => client,
                    _ = stopping.wait_for(|stop| *stop) => {
                        let _ = stopped.send(());
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
                    lease,
                    kubelet,
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
    let ready = Arc::new(synced);
    tokio::pin!(shutdown);
    let election = Election::start(&config);
    let mut version = tokio::select! {
        version = discover(&config.client) => version,
        () = &mut shutdown => {
            election.end().await;
            return;
        }
    };
    loop {
        let mut round = Round::start(&config, version, election.leadership(), &ready);
        let next = tokio::select! {
            () = &mut shutdown => None,
            now = round.version_changed(&config.client) => Some(now),
        };
        round.stop_claiming().await;
        if next.is_none() {
            // The Lease goes to another node at once, while this node's
            // kills in flight finish.
            election.end_now();
        }
        round.finish().await;
        match next {
            Some(now) => {
                info!(
                    from = version.as_str(),
                    to = now.as_str(),
                    "the cluster serves CRRs in another version now; starting over"
                );
                version = now;
            }
            None => break,
        }
    }
    election.end().await;
    info!("agent stopped");
}

/// Standalone mode's election of the claimer. It outlives a change of CRR
/// version, and on shutdown it ends first.
struct Election {
    end: watch::Sender<bool>,
    running: Option<(lease::Leadership, tokio::task::JoinHandle<()>)>,
}

impl Election {
    fn start(config: &AgentConfig) -> Self {
        let (end, ends) = watch::channel(false);
        let running = (config.mode == Mode::Standalone).then(|| {
            let api = kube::Api::namespaced(config.client.clone(), &config.lease.namespace);
            lease::elect(
                api,
                config.lease.clone(),
                config.node_name.clone(),
                Arc::clone(&config.metrics),
                ends,
            )
        });
        Self { end, running }
    }

    fn leadership(&self) -> Option<&lease::Leadership> {
        self.running.as_ref().map(|(leadership, _)| leadership)
    }

    /// Gives the Lease up without waiting.
    fn end_now(&self) {
        let _ = self.end.send(true);
    }

    async fn end(self) {
        self.end_now();
        if let Some((_, task)) = self.running {
            let _ = task.await;
        }
    }
}

/// The agent at one CRR version: its watches, the dispatcher of their
/// work, and (while this node may hold the Lease) the claimer.
struct Round {
    version: ApiVersion,
    gate: Arc<SyncGate>,
    stop: watch::Sender<bool>,
    dispatcher: tokio::task::JoinHandle<()>,
    followers: Vec<tokio::task::JoinHandle<()>>,
    claimer: Option<tokio::task::JoinHandle<()>>,
}

impl Round {
    fn start(
        config: &AgentConfig,
        version: ApiVersion,
        leadership: Option<&lease::Leadership>,
        ready: &Arc<watch::Sender<bool>>,
    ) -> Self {
        let AgentConfig {
            client,
            node_name,
            mode,
            ..
        } = config;
        let selector = format!("{}={node_name},{}=true", labels::NODE_NAME, labels::ACTIVE);
        let crrs = CrrClient::new(client.clone(), version);
        let (store, writer) = reflector::store();
        let active = crrs
            .watch(watcher::Config::default().labels(&selector))
            .reflect(writer);
        let reporter = Reporter {
            controller: REPORTER.into(),
            instance: Some(truncated(node_name.clone(), INSTANCE_LIMIT, "")),
        };
        let (manager, streams) = Manager::new(*mode, client, &crrs, node_name);
        let recorder = Recorder::new(client.clone(), reporter);
        let claim_events = recorder.clone();
        let records = KillRecords {
            recreated: Arc::clone(&config.recreated),
            kills: Arc::clone(&config.kills),
        };
        let ctx = Context {
            client: client.clone(),
            crrs: crrs.clone(),
            expectations: Expectations::default(),
            runtime: Runtime::new(config.cri.clone()),
            events: Events::new(recorder),
            killer: config.killer.clone(),
            records,
            kubelet: config.kubelet.clone(),
            metrics: Arc::clone(&config.metrics),
        };
        let agent = Arc::new(Agent {
            ctx,
            store,
            queue: Queue::default(),
            manager,
            neighbour: Arc::default(),
        });
        let wakes: Arc<dyn Wakes> = agent.clone();
        info!(node = %node_name, %selector, ?mode, version = version.as_str(), "watching ContainerRecreateRequests");
        let beside_kruise_daemon = *mode == Mode::Kruise;
        let watches = 1
            + streams.as_ref().map_or(0, |_| standalone::Streams::COUNT)
            + usize::from(beside_kruise_daemon);
        let gate = Arc::new(SyncGate::new(watches, Arc::clone(ready)));
        let (stop, stopping) = watch::channel(false);
        let dispatcher = tokio::spawn(Arc::clone(&agent).dispatch(Arc::clone(&gate), stopping));
        let mut followers = vec![tokio::spawn(follow(
            active,
            "active CRRs",
            Arc::clone(&wakes),
            Arc::clone(&gate),
        ))];
        if let Some(streams) = streams {
            followers.extend(streams.spawn(&wakes, &gate));
        }
        if beside_kruise_daemon {
            followers.push(tokio::spawn(kruise_daemon::watch(
                client.clone(),
                node_name.clone(),
                Arc::clone(&agent.neighbour),
                Arc::clone(&config.metrics),
                wakes,
                Arc::clone(&gate),
            )));
        }
        let claimer = leadership.map(|leadership| {
            let duty = claim::Claimer {
                client: client.clone(),
                crrs: crrs.clone(),
                metrics: Arc::clone(&config.metrics),
                leadership: leadership.clone(),
                timeout: config.lease.renew_period,
                unanswered: config.lease.unanswered,
                recorder: claim_events,
            };
            tokio::spawn(duty.run())
        });
        Self {
            version,
            gate,
            stop,
            dispatcher,
            followers,
            claimer,
        }
    }

    /// Resolves once the cluster serves CRRs in another version: it is
    /// asked after each relist (OpenKruise upgraded).
    async fn version_changed(&self, client: &kube::Client) -> ApiVersion {
        loop {
            self.gate.relisted().await;
            match ApiVersion::discover(client).await {
                Ok(now) if now != self.version => return now,
                Ok(_) => {}
                Err(error) => debug!(%error, "cannot tell which CRR version is served now"),
            }
        }
    }

    /// Ends the claimer: a claim cut short is a conditional write that
    /// landed or not.
    async fn stop_claiming(&mut self) {
        if let Some(claimer) = self.claimer.take() {
            claimer.abort();
            let _ = claimer.await;
        }
    }

    /// No new work; the work in flight finishes, then the watches end.
    async fn finish(self) {
        info!("agent stopping: no new work; waiting for the work in flight");
        let _ = self.stop.send(true);
        let _ = self.dispatcher.await;
        for follower in self.followers {
            follower.abort();
        }
    }
}

/// The CRR version to use (`ApiVersion::discover`), asked again with the
/// watches' back-off until the API server answers.
async fn discover(client: &kube::Client) -> ApiVersion {
    let mut backoff = backoff::WatchBackoff::default();
    loop {
        match ApiVersion::discover(client).await {
            Ok(version) => return version,
            Err(error) => {
                let delay = backoff.after_failure();
                warn!(%error, ?delay, "cannot tell which CRR version the cluster serves; asking again");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
