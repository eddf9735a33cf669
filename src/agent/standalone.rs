//! Standalone mode: for the CRRs of Pods on this node, crr-proxy also does
//! what OpenKruise's webhook and kruise-manager would (crr-semantics.md
//! §1.6–§2.2): accepts and labels new CRRs, flips the KruisePodReady
//! readiness gate, enforces activeDeadlineSeconds, completes CRRs whose Pod
//! has gone, releases what it held at the end, and deletes after the TTL.
//!
//! New CRRs carry no node label. One node at a time, the holder of the
//! standalone Lease (`lease`), watches them cluster-wide and claims each
//! for the node that runs its Pod (`claim`), so that the API server sends a
//! new CRR to one node rather than to every node. Everything else here uses
//! the label path (`node-name=<node>`) and a `spec.nodeName=<node>` Pod
//! watch, as kubelet's own: a CRR claimed for this node and not yet
//! accepted arrives on the watch of its inactive CRRs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use super::context::{self, Completion, Context};
use super::error::AgentError;
use super::queue::{Next, PodKey, Step};
use super::watches::{SyncGate, Wakes, Watched, follow};
use crate::crr::client::{ApiVersion, CrrClient};
use crate::crr::{ContainerRecreateRequest, Phase, SyncContainerStatus, annotations, labels};
use crate::crr::{PRE_RECREATE_GRACE, pre_recreate_grace};
use crate::crr::{admission, lists};
use crate::metrics::CrrOutcome;
use crate::restart_rules;
use crate::telemetry::Chain;

/// The readiness gate kruise's Pods carry.
pub const KRUISE_POD_READY: &str = "KruisePodReady";
/// Held while this CRR keeps its Pod not ready, so that readiness is given
/// back even if the CRR is deleted.
pub const UNREADY_FINALIZER: &str = "crr.apps.kruise.io/unready-acquired";

/// The stores standalone mode reads.
pub(crate) struct Parts {
    /// activeDeadlineSeconds timers, per CRR uid. They run apart from the
    /// Pod's queue: a kill in progress (a long preStop) holds the queue, and
    /// the deadline must not wait for it.
    deadlines: Mutex<HashMap<String, JoinHandle<()>>>,
    pods: Store<Pod>,
    /// This node's CRRs without the active label: claimed for it and not
    /// yet accepted, or finished (the label removed).
    inactive: Store<ContainerRecreateRequest>,
    node: String,
}

/// Standalone mode's watch streams, to be followed.
pub(crate) struct Streams {
    pods: BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>,
    inactive: BoxStream<'static, Result<watcher::Event<ContainerRecreateRequest>, watcher::Error>>,
}

impl Watched for Pod {
    fn pod_key(&self) -> Option<PodKey> {
        Some(PodKey {
            namespace: self.namespace()?,
            pod: self.name_any(),
        })
    }
}

pub(crate) fn watches(client: &kube::Client, crrs: &CrrClient, node: &str) -> (Parts, Streams) {
    let (pods, pod_writer) = reflector::store();
    let (inactive, inactive_writer) = reflector::store();
    let streams = Streams {
        pods: watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.nodeName={node}")),
        )
        .reflect(pod_writer)
        .boxed(),
        inactive: crrs
            .watch(watcher::Config::default().labels(&format!(
                "{}={node},!{}",
                labels::NODE_NAME,
                labels::ACTIVE
            )))
            .reflect(inactive_writer)
            .boxed(),
    };
    let parts = Parts {
        deadlines: Mutex::new(HashMap::new()),
        pods,
        inactive,
        node: node.to_owned(),
    };
    (parts, streams)
}

impl Streams {
    /// How many watches `spawn` follows.
    pub(crate) const COUNT: usize = 2;

    pub(crate) fn spawn(self, agent: &Arc<dyn Wakes>, gate: &Arc<SyncGate>) -> Vec<JoinHandle<()>> {
        vec![
            tokio::spawn(follow(
                self.pods,
                "node Pods",
                Arc::clone(agent),
                Arc::clone(gate),
            )),
            tokio::spawn(follow(
                self.inactive,
                "claimed and finished CRRs",
                Arc::clone(agent),
                Arc::clone(gate),
            )),
        ]
    }
}

impl Parts {
    /// Completes `crr` when its deadline passes, whatever its Pod's queue is
    /// doing then.
    fn arm_deadline(
        &self,
        ctx: &Context,
        store: &Store<ContainerRecreateRequest>,
        crr: &ContainerRecreateRequest,
        left: Duration,
    ) {
        let (Some(uid), Ok(mut deadlines)) = (crr.uid(), self.deadlines.lock()) else {
            return;
        };
        deadlines.retain(|_, timer| !timer.is_finished());
        if deadlines.contains_key(&uid) {
            return;
        }
        let store = store.clone();
        let pods = self.pods.clone();
        let client = ctx.client.clone();
        let crrs = ctx.crrs.clone();
        let metrics = Arc::clone(&ctx.metrics);
        let target = ObjectRef::from_obj(crr);
        let timer = tokio::spawn(async move {
            tokio::time::sleep(left).await;
            // The latest copy; a conflict means it just changed: look again.
            for _ in 0..5 {
                let Some(latest) = store.get(&target) else {
                    return;
                };
                if latest.is_finished() {
                    return;
                }
                let mut next = (*latest).clone();
                context::mark_completed(
                    &mut next,
                    &Completion::DeadlineExceeded,
                    Time(Timestamp::now()),
                );
                match crrs.replace_status(&next).await {
                    Err(kube::Error::Api(status)) if status.code == 409 => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(error) => {
                        warn!(error = %Chain(&error), "could not complete a CRR past its deadline; its Pod's next pass will");
                        return;
                    }
                    Ok(written) => {
                        metrics.crr_completed(CrrOutcome::DeadlineExceeded);
                        // Give back what the CRR held now, too: its Pod's
                        // queue may be busy with the kill for a while.
                        let key = PodKey::of(&written);
                        let pod = pods.get(&ObjectRef::new(&key.pod).within(&key.namespace));
                        if let Err(error) = release(&client, &crrs, &written, pod.as_deref()).await
                        {
                            warn!(error = %Chain(&error), "could not release a CRR past its deadline; its Pod's next pass will");
                        }
                        return;
                    }
                }
            }
        });
        deadlines.insert(uid, timer);
    }

    fn pod(&self, key: &PodKey) -> Option<Arc<Pod>> {
        self.pods
            .get(&ObjectRef::new(&key.pod).within(&key.namespace))
    }

    pub(crate) fn pod_spec(&self, key: &PodKey) -> Option<k8s_openapi::api::core::v1::PodSpec> {
        self.pod(key)?.spec.clone()
    }

    fn of_pod(
        store: &Store<ContainerRecreateRequest>,
        key: &PodKey,
    ) -> Vec<Arc<ContainerRecreateRequest>> {
        store
            .state()
            .into_iter()
            .filter(|c| {
                c.namespace().as_deref() == Some(key.namespace.as_str())
                    && c.spec.pod_name == key.pod
            })
            .collect()
    }

    /// §1.7, from the Pod itself: the CRR's containers that are running,
    /// with their IDs, readiness and restart counts. No creation-time filter
    /// (kruise's clock-skew bug #895): step D already requires the ID of the
    /// container the runtime reports now.
    pub(crate) fn sync_statuses(&self, key: &PodKey) -> HashMap<String, SyncContainerStatus> {
        let Some(pod) = self.pod(key) else {
            return HashMap::new();
        };
        pod.status
            .iter()
            .flat_map(restart_rules::container_statuses)
            .filter(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()))
            .map(|s| {
                let entry = SyncContainerStatus {
                    name: s.name.clone(),
                    ready: s.ready,
                    restart_count: s.restart_count,
                    container_id: s.container_id.clone().unwrap_or_default(),
                };
                (s.name.clone(), entry)
            })
            .collect()
    }
}

/// The manager's part for one Pod, before the daemon's.
pub(crate) async fn manage_pod(
    ctx: &Context,
    store: &Store<ContainerRecreateRequest>,
    parts: &Parts,
    key: &PodKey,
) -> Result<Step, AgentError> {
    // Acting on a half-listed cache would take a Pod for gone: syncs start
    // only once every store has listed (`Agent::dispatch`). Waiting here on
    // each store's `wait_until_ready` instead left syncs waiting for good:
    // of three Pods listed together, only one sync went on.
    let pod = parts.pod(key);
    let mut wrote = false;
    let mut next = Next::Done;

    for crr in Parts::of_pod(&parts.inactive, key) {
        if !crr.is_finished() {
            // Claimed for this node by the Lease holder (or a refusal cut
            // short between its label and its status): judged on the Pod as
            // the API server has it now, as the webhook does, since the Pod
            // watch may not have caught up with this CRR yet.
            match fresh_pod(ctx, key).await? {
                Some(fresh) if on_node(&fresh, &parts.node) => {
                    let span = info_span!(
                        "crr",
                        namespace = %key.namespace,
                        crr = %crr.name_any(),
                        pod = %key.pod,
                    );
                    accept(ctx, &crr, &fresh).instrument(span).await?;
                }
                // Gone, or another Pod of that name on another node since.
                _ => ctx.complete(&crr, Completion::PodGone).await?,
            }
            wrote = true;
            continue;
        }
        let Some(left) = crr.ttl_left(k8s_openapi::jiff::Timestamp::now().as_second()) else {
            continue;
        };
        if left <= 0 {
            info!(crr = %crr.name_any(), "deleting after ttlSecondsAfterFinished");
            ctx.crrs.delete(&crr).await?;
            wrote = true;
        } else {
            next = next.sooner(Next::After(Duration::from_secs(left.unsigned_abs())));
        }
    }

    let gone = |pod: Option<&Pod>, crr: &ContainerRecreateRequest| match pod {
        None => true,
        Some(pod) => {
            pod.metadata.deletion_timestamp.is_some()
                || pod.metadata.uid.as_ref() != crr.labels().get(labels::POD_UID)
        }
    };
    let mut confirmed: Option<Option<Pod>> = None;
    for crr in store.state().into_iter().filter(|c| PodKey::of(c) == *key) {
        if crr.is_finished() {
            wrote |= release(&ctx.client, &ctx.crrs, &crr, pod.as_deref()).await?;
            continue;
        }
        // The cache may lag: "gone" is confirmed with the API server first.
        let mut is_gone = gone(pod.as_deref(), &crr);
        if is_gone {
            if confirmed.is_none() {
                confirmed = Some(fresh_pod(ctx, key).await?);
            }
            is_gone = gone(confirmed.as_ref().and_then(Option::as_ref), &crr);
        }
        if is_gone {
            ctx.complete(&crr, Completion::PodGone).await?;
            wrote = true;
            continue;
        }
        if ctx.crrs.version() == ApiVersion::V1beta1 && crr.phase() == Phase::Recreating {
            wrote |= write_snapshot(ctx, parts, &crr, key).await?;
        }
        if let Some(deadline) = crr.spec.active_deadline_seconds {
            let created = crr
                .meta()
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second());
            let left = deadline - (Timestamp::now().as_second() - created);
            if left <= 0 {
                ctx.complete(&crr, Completion::DeadlineExceeded).await?;
                wrote = true;
            } else {
                let left = Duration::from_secs(left.unsigned_abs());
                parts.arm_deadline(ctx, store, &crr, left);
            }
        }
    }
    Ok(if wrote {
        Step::Wrote
    } else {
        Step::Continue(next)
    })
}

/// v1beta1's `containerStatusSnapshot`, as kruise-manager keeps it: the
/// CRR's containers that run in the Pod, written when it changes, never
/// emptied. crr-proxy itself reads the Pod; this is for v1beta1 readers.
async fn write_snapshot(
    ctx: &Context,
    parts: &Parts,
    crr: &ContainerRecreateRequest,
    key: &PodKey,
) -> Result<bool, AgentError> {
    let running = parts.sync_statuses(key);
    let snapshot: Vec<&SyncContainerStatus> = crr
        .spec
        .containers
        .iter()
        .filter_map(|c| running.get(&c.name))
        .collect();
    let current = crr
        .status
        .as_ref()
        .map(|s| s.container_status_snapshot.iter().collect::<Vec<_>>())
        .unwrap_or_default();
    if snapshot.is_empty() || snapshot == current {
        return Ok(false);
    }
    let snapshot: Vec<SyncContainerStatus> = snapshot.into_iter().cloned().collect();
    let decide = |current: &[SyncContainerStatus]| (current != snapshot).then(|| snapshot.clone());
    ctx.write_list(crr, &lists::SNAPSHOT, decide).await?;
    Ok(true)
}

fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// The Pod as the API server has it now; `None` when it does not exist.
async fn fresh_pod(ctx: &Context, key: &PodKey) -> Result<Option<Pod>, AgentError> {
    Ok(Api::<Pod>::namespaced(ctx.client.clone(), &key.namespace)
        .get_opt(&key.pod)
        .await?)
}

/// The webhook's CREATE: labels and a completed spec, or the CRR ends
/// Completed with the webhook's message (and is labelled with its node, so
/// that `kubectl get crr` shows it and its TTL applies).
async fn accept(
    ctx: &Context,
    crr: &ContainerRecreateRequest,
    pod: &Pod,
) -> Result<(), AgentError> {
    let runtime = ctx.runtime.name().await?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let containers = ctx.runtime.pod_containers(&uid, runtime).await?;
    match admission::admit(crr, pod, &containers) {
        Ok(accepted) => {
            let patch = json!({
                "metadata": {"labels": accepted.labels, "resourceVersion": crr.resource_version()},
                "spec": accepted.spec,
            });
            match ctx.crrs.patch(crr, &patch).await {
                // The CRR changed since this copy (most often: this node's
                // own acceptance, not yet out of the watch of its inactive CRRs).
                // Its watch event brings the newer copy to judge.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    debug!(crr = %crr.name_any(), "changed meanwhile; judged again on its next event");
                }
                written => {
                    written?;
                    info!(crr = %crr.name_any(), pod = %pod.name_any(), "accepted");
                }
            }
        }
        Err(message) => {
            info!(crr = %crr.name_any(), %message, "refusing");
            // Labelled first: the node policy lets a node write only CRRs
            // that carry its name. Should crr-proxy stop in between, the
            // finished watch sees a labelled, inactive, incomplete CRR and
            // the refusal is judged again.
            let mut node_labels = BTreeMap::new();
            node_labels.insert(
                labels::NODE_NAME.to_owned(),
                pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            );
            node_labels.insert(labels::POD_UID.to_owned(), Some(uid));
            let patch = json!({"metadata": {"labels": node_labels}});
            let labelled = ctx.crrs.patch(crr, &patch).await?;
            // A lagging cache may bring a refusal back once it is done.
            if !labelled.is_finished() {
                ctx.complete(&labelled, Completion::Refused(message))
                    .await?;
            }
        }
    }
    Ok(())
}

/// Before a Recreating CRR with `unreadyGracePeriodSeconds` waits: takes the
/// Pod out of service through its KruisePodReady gate (when it has one),
/// holding a finalizer until it is given back, then stamps the time.
pub(crate) async fn acquire_unready(
    ctx: &Context,
    parts: &Parts,
    crr: &ContainerRecreateRequest,
) -> Result<(), AgentError> {
    let key = PodKey::of(crr);
    let Some(pod) = parts.pod(&key) else {
        return Ok(());
    };
    if has_gate(&pod) {
        let mut finalizers = crr.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == UNREADY_FINALIZER) {
            finalizers.push(UNREADY_FINALIZER.into());
            let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": crr.resource_version()}});
            ctx.crrs.patch(crr, &patch).await?;
        }
        set_not_ready_key(
            &ctx.client,
            &pod,
            &format!("{}/{}", key.namespace, crr.name_any()),
            true,
        )
        .await?;
    }
    // v1beta1 keeps the time in a condition, v1alpha1 in an annotation.
    if ctx.crrs.version() == ApiVersion::V1beta1 {
        let now = Timestamp::now();
        // Every other condition stays as it is (kruise-manager's); one
        // already True keeps its time, as meta.SetStatusCondition does.
        let decide = |current: &[Condition]| {
            let granted = current
                .iter()
                .any(|c| c.type_ == PRE_RECREATE_GRACE && c.status == "True");
            let others = current.iter().filter(|c| c.type_ != PRE_RECREATE_GRACE);
            let mut conditions: Vec<Condition> = others.cloned().collect();
            conditions.push(pre_recreate_grace(now));
            (!granted).then_some(conditions)
        };
        ctx.write_list(crr, &lists::CONDITIONS, decide).await?;
    } else {
        let stamp = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let patch = json!({"metadata": {"annotations": {annotations::UNREADY_ACQUIRED: stamp}}});
        ctx.crrs.patch(crr, &patch).await?;
    }
    Ok(())
}

/// After a CRR ends: gives the Pod's readiness back and drops the
/// finalizer, then removes the active label. Says whether it wrote.
async fn release(
    client: &kube::Client,
    crrs: &CrrClient,
    crr: &ContainerRecreateRequest,
    pod: Option<&Pod>,
) -> Result<bool, AgentError> {
    let mut wrote = false;
    let mut current = crr.clone();
    if current.finalizers().iter().any(|f| f == UNREADY_FINALIZER) {
        if let Some(pod) = pod.filter(|p| p.metadata.deletion_timestamp.is_none() && has_gate(p)) {
            let key = format!("{}/{}", crr.namespace().unwrap_or_default(), crr.name_any());
            set_not_ready_key(client, pod, &key, false).await?;
        }
        let rest: Vec<&String> = current
            .finalizers()
            .iter()
            .filter(|f| *f != UNREADY_FINALIZER)
            .collect();
        let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": current.resource_version()}});
        current = crrs.patch(crr, &patch).await?;
        wrote = true;
    }
    if current.meta().deletion_timestamp.is_some() {
        return Ok(wrote);
    }
    if current.labels().contains_key(labels::ACTIVE) {
        let patch = json!({"metadata": {"labels": {labels::ACTIVE: null}}});
        crrs.patch(crr, &patch).await?;
        wrote = true;
    }
    Ok(wrote)
}

fn has_gate(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .any(|g| g.condition_type == KRUISE_POD_READY)
}

/// §1.8: adds or removes `key` in the KruisePodReady condition's message
/// (a JSON list), which is False while any key remains. Adding also marks
/// the Pod not Ready, as kruise does.
async fn set_not_ready_key(
    client: &kube::Client,
    pod: &Pod,
    key: &str,
    add: bool,
) -> Result<(), AgentError> {
    const USER_AGENT: &str = "ContainerRecreateRequest";
    let mut conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let index = conditions.iter().position(|c| c.type_ == KRUISE_POD_READY);
    let mut keys: Vec<(String, String)> = index
        .and_then(|i| conditions[i].message.as_deref())
        .and_then(|m| serde_json::from_str::<Vec<BTreeMap<String, String>>>(m).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|entry| {
            let get = |k: &str| entry.get(k).cloned().unwrap_or_default();
            (get("userAgent"), get("key"))
        })
        .filter(|(agent, k)| !(agent == USER_AGENT && k == key))
        .collect();
    if add {
        keys.push((USER_AGENT.into(), key.into()));
    }
    keys.sort();
    // Go's field order, which a JSON map would not keep.
    let entries: Vec<String> = keys
        .iter()
        .map(|(agent, key)| format!(r#"{{"userAgent":{},"key":{}}}"#, json!(agent), json!(key)))
        .collect();
    let status = if keys.is_empty() { "True" } else { "False" };
    let now = Some(Time(Timestamp::now()));
    let condition = PodCondition {
        type_: KRUISE_POD_READY.into(),
        status: status.into(),
        message: Some(if keys.is_empty() {
            String::new()
        } else {
            format!("[{}]", entries.join(","))
        }),
        last_transition_time: now.clone(),
        ..Default::default()
    };
    match index {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
    if add {
        if let Some(ready) = conditions.iter_mut().find(|c| c.type_ == "Ready") {
            if ready.status != "False" {
                ready.status = "False".into();
                ready.reason = Some("ReadinessGatesNotReady".into());
                ready.last_transition_time = now;
            }
        }
    }
    let patch = json!({"metadata": {"resourceVersion": pod.resource_version()}, "status": {"conditions": conditions}});
    Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default())
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}
