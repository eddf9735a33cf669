//! Kruise mode on a node where OpenKruise's kruise-daemon runs too. Its CRR
//! controller cannot be turned off (`pkg/daemon/daemon.go` always adds it),
//! so both would run each preStop hook and stop each container. The agent
//! watches for a kruise-daemon Pod on its node and, while one is there,
//! leaves the node's CRRs to it: no pass acts on them, and the log,
//! `/metrics`, `/readyz` and `crr-proxy check` say why. Once the Pod is gone
//! every CRR of the node is looked at again.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use super::backoff::WatchBackoff;
use super::watches::SyncGate;
use super::watches::Wakes;
use crate::metrics::Metrics;

/// The label OpenKruise's chart puts on kruise-daemon's Pods.
pub const LABEL: &str = "control-plane=daemon";

/// Whether `pod` is kruise-daemon and has not finished: OpenKruise's chart
/// runs it as service account `kruise-daemon`, command `/kruise-daemon`.
pub fn is_kruise_daemon(pod: &Pod) -> bool {
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let by_account = spec.service_account_name.as_deref() == Some("kruise-daemon");
    let by_command = spec.containers.iter().any(|c| {
        c.command
            .iter()
            .flatten()
            .next()
            .is_some_and(|program| program.rsplit('/').next() == Some("kruise-daemon"))
    });
    !finished && (by_account || by_command)
}

/// The first kruise-daemon Pod among `pods`, as `namespace/name`.
pub fn found<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Option<String> {
    pods.into_iter()
        .find(|p| is_kruise_daemon(p))
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
}

/// Whether a kruise-daemon Pod runs on this node, as last seen.
#[derive(Debug, Default)]
pub(crate) struct Neighbour {
    pod: Mutex<Option<String>>,
}

impl Neighbour {
    /// The kruise-daemon Pod the agent stands aside for.
    pub(crate) fn present(&self) -> Option<String> {
        self.pod.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records what the watch shows now; true when it changed.
    fn set(&self, now: Option<String>) -> bool {
        let mut pod = self.pod.lock().unwrap_or_else(|p| p.into_inner());
        let changed = *pod != now;
        *pod = now;
        changed
    }
}

/// Watches this node's Pods labelled as kruise-daemon's, for as long as the
/// agent runs; counts as synced once listed.
pub(super) async fn watch(
    client: kube::Client,
    node: String,
    neighbour: Arc<Neighbour>,
    metrics: Arc<Metrics>,
    agent: Arc<dyn Wakes>,
    gate: Arc<SyncGate>,
) {
    let (store, writer): (Store<Pod>, _) = reflector::store();
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(LABEL);
    let mut events = watcher(Api::<Pod>::all(client), config)
        .reflect(writer)
        .boxed();
    let mut backoff = WatchBackoff::default();
    let mut synced = false;
    while let Some(event) = events.next().await {
        match event {
            // A listing reaches the store whole, at its end.
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => backoff.reset(),
            Err(error) => {
                let delay = backoff.after(&error);
                warn!(%error, ?delay, "watch of kruise-daemon Pods failed; retrying");
                tokio::time::sleep(delay).await;
                continue;
            }
        }
        let pods = store.state();
        let now = found(pods.iter().map(|p| &**p));
        if neighbour.set(now.clone()) {
            metrics.set_kruise_daemon(now.clone());
            match &now {
                Some(pod) => warn!(
                    %pod,
                    "kruise-daemon runs on this node: its CRR controller does this node's CRRs; crr-proxy's agent stands aside (keep kruise-daemon off crr-proxy's nodes: deploy/kruise-daemon-affinity.yaml)"
                ),
                None => {
                    info!("no kruise-daemon on this node any more: taking up its CRRs");
                    agent.wake_all();
                }
            }
        }
        if !synced {
            synced = true;
            gate.one_synced();
        }
    }
    warn!("watch of kruise-daemon Pods ended");
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "kruise-daemon-x", "namespace": "kruise-system"},
            "spec": spec, "status": {"phase": phase}}),
        )
        .unwrap()
    }

    #[test]
    fn kruise_daemon_is_told_by_its_account_or_command_until_it_ends() {
        let by_account = pod(
            json!({"serviceAccountName": "kruise-daemon", "containers": [{"name": "daemon"}]}),
            "Running",
        );
        let by_command = pod(
            json!({"containers": [{"name": "daemon", "command": ["/kruise-daemon"]}]}),
            "Pending",
        );
        let other = pod(
            json!({"serviceAccountName": "node-exporter", "containers": [{"name": "daemon", "command": ["/bin/exporter"]}]}),
            "Running",
        );
        let ended = pod(
            json!({"serviceAccountName": "kruise-daemon", "containers": [{"name": "daemon"}]}),
            "Failed",
        );
        assert!(is_kruise_daemon(&by_account) && is_kruise_daemon(&by_command));
        assert!(!is_kruise_daemon(&other) && !is_kruise_daemon(&ended));
        assert_eq!(
            found([&other, &by_account]),
            Some("kruise-system/kruise-daemon-x".into())
        );
        assert_eq!(found([&other, &ended]), None);
        let neighbour = Neighbour::default();
        assert!(neighbour.set(Some("a/b".into())));
        assert!(!neighbour.set(Some("a/b".into())));
        assert_eq!(neighbour.present().as_deref(), Some("a/b"));
    }
}
