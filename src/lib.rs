//! crr-proxy: a transparent CRI proxy between kubelet and the container
//! runtime, and a node agent for OpenKruise's ContainerRecreateRequest.
//!
//! - [`proxy`]: the raw HTTP/2 passthrough on a unix socket.
//! - [`agent`]: the CRR node agent (`--agent kruise` or `standalone`).
//! - [`admin`]: `/healthz`, `/readyz` and `/metrics`.
//! - [`check`]: `crr-proxy check`.
//! - [`cri`]: crr-proxy's own CRI client, generated from `proto/`.
//! - [`kill`]: stops a container as kubelet does (preStop, then StopContainer).
//! - [`crr`]: the ContainerRecreateRequest API and the agent's decision rules.
//! - [`config`]: the command line.
//! - [`telemetry`]: logging setup.
//! - [`notify`]: systemd's readiness notification.
//! - [`watchdog`]: systemd's watchdog, pinged while the socket answers.
//! - [`metrics`]: Prometheus metrics of the data path.
//! - [`reason`]: why a container restarted, as kubelet is told.
//! - [`manifests`]: the cluster objects of deploy/, for a configured Lease.
//! - [`listing`]: a watch's listing, taken whole (every watch feed's).
//! - [`records`]: small key-value records that outlive crr-proxy.
//! - [`restart_rules`]: whether kubelet starts a stopped container again.
//! - [`version`]: the version and commit this binary was built from.
//! - [`restart`]: `crr-proxy restart` (`kubectl crr restart`).
//!
//! Who uses whom. `main` and this file are the edges: they parse the command
//! line ([`config`]) and hand each module its own settings ([`RunConfig`],
//! [`agent::AgentSettings`], [`telemetry::LogFormat`]). Below them nothing
//! uses `config`, and no two modules use each other, however indirectly
//! (`tests/repository.rs` checks both).
//! - The data path: `proxy` uses `cri`, `metrics`, `reason` and `telemetry`,
//!   and never the agent.
//! - The agent: `agent` uses `crr`, `kill`, `cri`, `reason`, `records`,
//!   `restart_rules`, `metrics`, `manifests`, `listing` and `telemetry`.
//! - The commands: `check` uses `agent`, `crr`, `cri` and `manifests`;
//!   `restart` uses `crr`, `restart_rules` and `listing`; `admin` uses `cri`, `metrics`, `notify` and
//!   `telemetry`; `watchdog` uses `cri`, `proxy` and `notify`.
//! - Below those: `crr` (CRR types and facts), `kill`, `reason`, `metrics`
//!   and `cri`; and at the bottom `records`, `restart_rules`, `manifests`,
//!   `listing`, `version`, `notify` and `telemetry`, which use no other
//!   module.

pub mod admin;
pub mod agent;
pub mod check;
pub mod config;
pub mod cri;
pub mod crr;
#[doc(hidden)]
pub mod fuzzing;
pub mod kill;
pub mod listing;
pub mod manifests;
pub mod metrics;
pub mod notify;
pub mod proxy;
pub mod reason;
pub mod records;
pub mod restart;
pub mod restart_rules;
pub mod telemetry;
pub mod version;
pub mod watchdog;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use proxy::{ListenError, Listener, Proxy, Routes};

/// A validated `run` configuration: what the daemon serves and runs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub listen: PathBuf,
    pub routes: Routes,
    pub agent: Option<agent::AgentSettings>,
    pub metrics_addr: Option<SocketAddr>,
    /// The file of containers stopped for CRRs; `None`: no reason rewrite.
    pub recreated_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Agent(#[from] agent::AgentError),
}

/// Runs the daemon until `shutdown` resolves: the proxy on this runtime, and
/// the agent (when enabled) on its own thread, so that nothing it does can
/// hold up a CRI call.
pub async fn run(config: RunConfig, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    // The socket first: a second instance started by mistake stops here,
    // before its agent could act on a single CRR.
    let (listener, _socket_file) = Listener::open(&config.listen)?.into_parts();
    let (synced, ready) = tokio::sync::watch::channel(config.agent.is_none());
    let recreated = match &config.recreated_file {
        Some(file) => reason::Recreated::open(file).unwrap_or_else(|error| {
            // The rewrite is a courtesy: never a reason not to serve.
            tracing::warn!(error = %telemetry::Chain(&error), "forgetting earlier recreations");
            reason::Recreated::in_memory()
        }),
        None => reason::Recreated::in_memory(),
    };
    let recreated = Arc::new(recreated);
    let metrics = Arc::new(metrics::Metrics::default());
    let agent = match &config.agent {
        Some(settings) => {
            let (recorded, counted) = (Arc::clone(&recreated), Arc::clone(&metrics));
            Some(agent::spawn(settings, &config.routes.runtime, synced, recorded, counted).await?)
        }
        None => None,
    };
    if let Some(addr) = config.metrics_addr {
        // Probes and metrics are for the operator; kubelet's path never
        // waits on a busy port (admin::spawn keeps trying it).
        let runtime = config.routes.runtime.clone();
        admin::spawn(addr, ready, Arc::clone(&metrics), runtime).await;
    }
    tracing::info!(
        runtime = %config.routes.runtime,
        image = %config.routes.image.as_ref().unwrap_or(&config.routes.runtime),
        "forwarding CRI calls"
    );
    if let Err(error) = notify::notify("READY=1") {
        tracing::warn!(%error, "could not notify systemd");
    }
    if let Some(watchdog) = watchdog::Watchdog::from_env() {
        tracing::info!(period = ?watchdog.period, "pinging systemd's watchdog while the socket answers");
        tokio::spawn(watchdog.run(config.listen.clone()));
    }
    // On shutdown the agent stops taking work and finishes the kills under
    // way while the proxy drains its calls, both within the drain bound;
    // a kill cut short there is taken up by the next start (without its
    // preStop hook again).
    let (stopping, stopped) = tokio::sync::oneshot::channel();
    let shutdown = async {
        shutdown.await;
        let _ = notify::notify("STOPPING=1");
        if let Some(agent) = agent {
            let since = tokio::time::Instant::now();
            let _ = stopping.send((since, tokio::spawn(agent.stop())));
        }
    };
    let mut proxy = Proxy::new(config.routes).with_metrics(metrics);
    if config.recreated_file.is_some() {
        proxy = proxy.with_reasons(recreated);
    }
    proxy.serve(listener, shutdown).await;
    if let Ok((since, agent)) = stopped.await {
        let left = proxy::DRAIN_TIMEOUT.saturating_sub(since.elapsed());
        if tokio::time::timeout(left, agent).await.is_err() {
            tracing::warn!("a kill in flight did not finish in time");
        }
    }
    Ok(())
}
