//! The running agent's work: its per-Pod queue fed by the watches, the
//! dispatcher that runs due Pods on a bounded set of workers, and one
//! Pod's pass (the manager's part, then the daemon's).

use std::sync::Arc;

use kube::runtime::reflector::Store;
use tokio::sync::{Semaphore, watch};
use tracing::{Instrument, debug, info_span, warn};

use super::context::Context;
use super::daemon::Daemon;
use super::error::AgentError;
use super::kruise_daemon::Neighbour;
use super::manager::Manager;
use super::queue::{Next, PodKey, Queue, Step};
use super::watches::{SyncGate, Wakes};
use crate::crr::ContainerRecreateRequest;
use crate::telemetry::Chain;

/// kruise-daemon runs 32 workers.
const WORKERS: usize = 32;

/// The running agent: its context, the cache of this node's active CRRs,
/// the per-Pod queue, and who does the manager's part.
pub(super) struct Agent {
    pub(super) ctx: Context,
    pub(super) store: Store<ContainerRecreateRequest>,
    pub(super) queue: Queue<PodKey>,
    pub(super) manager: Manager,
    /// Kruise mode: a kruise-daemon on this node, which the agent leaves
    /// the node's CRRs to.
    pub(super) neighbour: Arc<Neighbour>,
}

impl Agent {
    /// Runs the syncs of due Pods, once every watch has listed: a sync
    /// reads several stores, and one not yet listed would make a Pod or a
    /// CRR look absent.
    /// Once `stop` turns true, it starts nothing more and returns when the
    /// syncs under way are over: a kill is not abandoned half-way.
    pub(super) async fn dispatch(
        self: Arc<Self>,
        gate: Arc<SyncGate>,
        mut stop: watch::Receiver<bool>,
    ) {
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
                                agent.ctx.metrics.crr_sync_failed();
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

    /// One pass over the CRRs of one Pod: the manager's part first, then
    /// the daemon's.
    async fn sync(&self, key: &PodKey) -> Result<Next, AgentError> {
        // kruise-daemon does this node's CRRs; its Pod's going wakes them.
        if self.neighbour.present().is_some() {
            return Ok(Next::Done);
        }
        // Its time against the kill's tells the agent's own share of a
        // CRR's latency from the watch's and the queue's.
        debug!("pass begins");
        self.ctx.metrics.crr_reconciled();
        self.ctx.metrics.set_active_crrs(
            self.store
                .state()
                .iter()
                .filter(|c| !c.is_finished())
                .count(),
        );
        let hint = match self.manager.pass(&self.ctx, &self.store, key).await? {
            Step::Wrote => return Ok(Next::Done),
            Step::Continue(next) => next,
        };
        let daemon = Daemon {
            ctx: &self.ctx,
            manager: &self.manager,
            store: &self.store,
        };
        Ok(daemon.sync(key).await?.sooner(hint))
    }
}

impl Wakes for Agent {
    fn wake(&self, key: PodKey) {
        self.queue.add(key);
    }

    fn wake_all(&self) {
        for crr in self.store.state() {
            self.queue.add(PodKey::of(&crr));
        }
    }

    fn seen(&self, crr: &ContainerRecreateRequest) {
        self.ctx.expectations.seen(crr);
    }

    fn forget(&self, crr: &ContainerRecreateRequest) {
        self.ctx.expectations.forget(crr);
    }
}
