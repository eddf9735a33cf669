//! The duties OpenKruise's webhook and kruise-manager have next to
//! kruise-daemon: with OpenKruise installed (`Mode::Kruise`) they are theirs,
//! and the daemon reads what they write; alone (`Mode::Standalone`),
//! crr-proxy does them for the CRRs of its node (`standalone`). The daemon
//! asks this type, never the mode.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::Api;
use kube::runtime::reflector::Store;
use tracing::{debug, warn};

use super::context::Context;
use super::error::AgentError;
use super::queue::PodKey;
use super::queue::{Next, Step};
use super::standalone;
use crate::crr::client::CrrClient;
use crate::crr::{ContainerRecreateRequest, SyncContainerStatus};
use crate::telemetry::Chain;

/// How long a kill waits for its Pod's spec in kruise mode.
const POD_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Who else handles CRRs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Next to OpenKruise's webhook and kruise-manager.
    Kruise,
    /// Alone: crr-proxy also does the webhook's and the manager's part for
    /// the CRRs of its node.
    Standalone,
}

pub(crate) enum Manager {
    /// kruise-manager and its webhook do it.
    Kruise,
    /// crr-proxy does it, from the stores of its extra watches.
    Standalone(standalone::Parts),
}

impl Manager {
    /// The manager for `mode`, and in standalone mode the watches that feed
    /// its stores.
    pub(crate) fn new(
        mode: Mode,
        client: &kube::Client,
        crrs: &CrrClient,
        node: &str,
    ) -> (Self, Option<standalone::Streams>) {
        match mode {
            Mode::Kruise => (Manager::Kruise, None),
            Mode::Standalone => {
                let (parts, streams) = standalone::watches(client, crrs, node);
                (Manager::Standalone(parts), Some(streams))
            }
        }
    }

    /// The manager's part of a pass over one Pod, before the daemon's:
    /// accepting new CRRs, "pod has gone", deadlines, releasing what a
    /// finished CRR held, the TTL.
    pub(crate) async fn pass(
        &self,
        ctx: &Context,
        store: &Store<ContainerRecreateRequest>,
        key: &PodKey,
    ) -> Result<Step, AgentError> {
        match self {
            Manager::Kruise => Ok(Step::Continue(Next::Done)),
            Manager::Standalone(parts) => standalone::manage_pod(ctx, store, parts, key).await,
        }
    }

    /// A Recreating CRR with `unreadyGracePeriodSeconds` and no stamp yet:
    /// take the Pod out of service and stamp the time.
    pub(crate) async fn make_unready(
        &self,
        ctx: &Context,
        crr: &ContainerRecreateRequest,
    ) -> Result<(), AgentError> {
        match self {
            Manager::Kruise => {
                debug!("waiting for kruise-manager to make the Pod not ready");
                Ok(())
            }
            Manager::Standalone(parts) => standalone::acquire_unready(ctx, parts, crr).await,
        }
    }

    /// What is known of the CRR's containers in the Pod (§1.7): what
    /// kruise-manager keeps on the CRR (v1beta1's snapshot, v1alpha1's
    /// annotation), or in standalone mode the Pod's own status.
    pub(crate) fn container_statuses(
        &self,
        crr: &ContainerRecreateRequest,
    ) -> HashMap<String, SyncContainerStatus> {
        match self {
            Manager::Kruise => crr
                .container_snapshot()
                .into_iter()
                .map(|s| (s.name.clone(), s))
                .collect(),
            Manager::Standalone(parts) => parts.sync_statuses(&PodKey::of(crr)),
        }
    }

    /// The Pod's spec, for its restart rules: from standalone's cache, or
    /// in kruise mode read once per kill (kruise-daemon watches no Pods).
    /// `None` when it cannot be read: the kill goes ahead as before.
    pub(crate) async fn pod_spec(&self, ctx: &Context, key: &PodKey) -> Option<PodSpec> {
        match self {
            Manager::Standalone(parts) => parts.pod_spec(key),
            Manager::Kruise => {
                let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
                // Bounded: a slow API server delays the kill, never holds it.
                let read = tokio::time::timeout(POD_READ_LIMIT, pods.get_opt(&key.pod)).await;
                debug!(pod = %key.pod, "read the Pod");
                match read {
                    Ok(Ok(pod)) => pod.and_then(|p| p.spec),
                    Ok(Err(error)) => {
                        warn!(error = %Chain(&error), pod = %key.pod, "cannot read the Pod's restart policy; stopping its container regardless");
                        None
                    }
                    Err(_) => {
                        warn!(pod = %key.pod, limit = ?POD_READ_LIMIT, "no answer about the Pod's restart policy; stopping its container regardless");
                        None
                    }
                }
            }
        }
    }
}
