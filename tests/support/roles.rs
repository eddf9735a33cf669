//! The two roles the agent works with, written once for every test:
//!
//! - [`Kubelet`] (in `kubelet.rs`): runs Pods on the real containerd, as
//!   kubelet does.
//! - [`KruiseManager`]: kruise's CRR webhook (labels, statusContext,
//!   defaults, refusals) and controller (sync-container-statuses, the
//!   unready stamp and KruisePodReady, deadline, "pod has gone", completion
//!   cleanup: readiness, finalizer, active label, TTL), as
//!   `shared/research/crr-semantics.md` §2.1–§2.2 describe them; on a
//!   cluster that stores v1beta1, master's (crr-v1beta1.md §5: the status
//!   snapshot and the PreRecreateGrace condition, merge-patched status). The
//!   controller reads through a cache that trails the API server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crr_proxy::cri::RuntimeClient;
use crr_proxy::cri::v1::{ContainerFilter, ContainerState, ListContainersRequest};
use crr_proxy::kill::keys;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::apiserver::{
    ApiError, ChangeKind, CrrVersions, FakeApiServer, Operation, Resource, Selector, now,
};

pub const NAMESPACE: &str = "default";
pub const KRUISE_POD_READY: &str = "KruisePodReady";
const UNREADY_FINALIZER: &str = "crr.apps.kruise.io/unready-acquired";
const LABEL_POD_UID: &str = "crr.apps.kruise.io/pod-uid";
const LABEL_NODE: &str = "crr.apps.kruise.io/node-name";
const LABEL_ACTIVE: &str = "crr.apps.kruise.io/active";
const SYNC_ANNOTATION: &str = "crr.apps.kruise.io/sync-container-statuses";
const UNREADY_ANNOTATION: &str = "crr.apps.kruise.io/unready-acquired";

/// The status of a Pod condition.
pub fn condition(pod: &Value, kind: &str) -> Option<String> {
    pod.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
        .map(str::to_owned)
}

/// Polls `check` every 50 ms until it returns something or `limit` passes.
pub async fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A CRI container of a Pod by name, newest instance (for assertions).
pub async fn runtime_containers(
    cri: &RuntimeClient,
    pod_uid: &str,
) -> Vec<(String, u32, ContainerState)> {
    let mut cri = cri.clone();
    let listed = cri
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                label_selector: HashMap::from([(keys::POD_UID.to_owned(), pod_uid.to_owned())]),
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    listed
        .into_iter()
        .map(|c| {
            let state = c.state();
            let meta = c.metadata.unwrap_or_default();
            (meta.name, meta.attempt, state)
        })
        .collect()
}

// === kruise-manager ===

/// kruise-manager's CRR webhook and controller. The controller reads, as
/// kruise's does, through an informer cache: a copy of the CRRs and Pods
/// that trails the API server by [`CACHE_LAG`]; it writes to the server.
pub struct KruiseManager {
    api: FakeApiServer,
    tasks: Vec<JoinHandle<()>>,
}

/// How far the manager's cache trails the API server (real informers trail
/// by milliseconds, by seconds under load).
pub const CACHE_LAG: Duration = Duration::from_millis(300);

impl KruiseManager {
    pub fn start(api: &FakeApiServer) -> Self {
        Self::start_with_lag(api, CACHE_LAG)
    }

    pub fn start_with_lag(api: &FakeApiServer, lag: Duration) -> Self {
        api.add_admission(Arc::new(webhook));
        let (cache, feeder) = Cache::follow(api, lag);
        // On a cluster that stores v1beta1, the manager is master's.
        let master = api.crr_versions() != CrrVersions::V1alpha1Only;
        let server = api.clone();
        let api = api.clone();
        let task = tokio::spawn(async move {
            loop {
                for crr in cache.list(Resource::Crr) {
                    reconcile(&api, &cache, &crr, master);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self {
            api: server,
            tasks: vec![feeder, task],
        }
    }
}

impl Drop for KruiseManager {
    /// The manager and its webhook go away together.
    fn drop(&mut self) {
        self.api.clear_admission();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// OpenKruise's kruise-daemon on one node, as far as CRRs go: its Pod (as
/// OpenKruise's chart runs it) and its CRR controller, which takes up every
/// active CRR of the node, stops each named container through the CRI
/// (StopContainer with the CRR's grace, no preStop hook here) and completes
/// the CRR. It counts its kills, so that a test can tell one kill from two.
pub struct KruiseDaemon {
    api: FakeApiServer,
    pod: String,
    kills: Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl KruiseDaemon {
    pub const NAMESPACE: &'static str = "kruise-system";

    pub fn start(api: &FakeApiServer, cri: RuntimeClient, node: &str) -> Self {
        let pod = format!("kruise-daemon-{node}");
        api.create_unchecked(
            Resource::Pod,
            Self::NAMESPACE,
            json!({"metadata": {"name": pod, "labels": {"control-plane": "daemon"}},
                   "spec": {"nodeName": node, "serviceAccountName": "kruise-daemon", "hostNetwork": true,
                            "containers": [{"name": "daemon", "command": ["/kruise-daemon"], "args": ["--v=4"]}]},
                   "status": {"phase": "Running"}}),
        )
        .expect("create the kruise-daemon Pod");
        let kills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (server, counted, node) = (api.clone(), Arc::clone(&kills), node.to_owned());
        let task = tokio::spawn(async move {
            let selector = Selector::labels(&format!(
                "crr.apps.kruise.io/node-name={node},crr.apps.kruise.io/active=true"
            ));
            loop {
                for crr in server.list(Resource::Crr, None, &selector) {
                    let done = crr["status"]["completionTime"].is_string();
                    if done || !crr["status"]["phase"].as_str().unwrap_or("").is_empty() {
                        continue;
                    }
                    let grace = crr["spec"]["strategy"]["terminationGracePeriodSeconds"]
                        .as_i64()
                        .unwrap_or(30);
                    let mut states = Vec::new();
                    for container in crr["spec"]["containers"].as_array().into_iter().flatten() {
                        let id = container["statusContext"]["containerID"]
                            .as_str()
                            .and_then(|id| id.split_once("://"))
                            .map(|(_, id)| id.to_owned())
                            .unwrap_or_default();
                        let mut cri = cri.clone();
                        let stopped = cri
                            .stop_container(crr_proxy::cri::v1::StopContainerRequest {
                                container_id: id,
                                timeout: grace,
                            })
                            .await;
                        if stopped.is_ok() {
                            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        states.push(json!({"name": container["name"], "phase": "Succeeded", "isKilled": true}));
                    }
                    let namespace = crr["metadata"]["namespace"].as_str().unwrap_or_default();
                    let name = crr["metadata"]["name"].as_str().unwrap_or_default();
                    let status = json!({"status": {"phase": "Completed", "completionTime": now(),
                                                   "containerRecreateStates": states}});
                    let _ = server.patch(Resource::Crr, namespace, name, &status, true);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self {
            api: api.clone(),
            pod,
            kills,
            task,
        }
    }

    /// The containers it stopped so far.
    pub fn kills(&self) -> usize {
        self.kills.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for KruiseDaemon {
    /// Kept off the node: its controller stops and its Pod goes.
    fn drop(&mut self) {
        self.task.abort();
        let _ = self
            .api
            .delete_with_grace(Resource::Pod, Self::NAMESPACE, &self.pod, Some(0));
    }
}

type CacheKey = (Resource, String, String);

/// An informer's copy of the CRRs and Pods: every change reaches it `lag`
/// after its commit.
#[derive(Clone, Default)]
struct Cache {
    objects: Arc<std::sync::Mutex<HashMap<CacheKey, Value>>>,
}

impl Cache {
    fn follow(api: &FakeApiServer, lag: Duration) -> (Self, JoinHandle<()>) {
        let cache = Self::default();
        // Subscribe before listing, so that nothing falls between.
        let mut changes = api.subscribe();
        let listed = api.store().rv();
        for resource in [Resource::Crr, Resource::Pod] {
            for obj in api.list(resource, None, &Selector::default()) {
                cache.put(resource, obj);
            }
        }
        let feeder = tokio::spawn({
            let cache = cache.clone();
            async move {
                while let Ok(change) = changes.recv().await {
                    if change.rv <= listed
                        || !matches!(change.resource, Resource::Crr | Resource::Pod)
                    {
                        continue;
                    }
                    tokio::time::sleep_until(change.at + lag).await;
                    match change.kind {
                        ChangeKind::Deleted => cache.remove(change.resource, &change.new),
                        _ => cache.put(change.resource, change.new),
                    }
                }
            }
        });
        (cache, feeder)
    }

    fn key(resource: Resource, obj: &Value) -> CacheKey {
        let meta = &obj["metadata"];
        let text = |field: &str| meta[field].as_str().unwrap_or_default().to_owned();
        (resource, text("namespace"), text("name"))
    }

    fn put(&self, resource: Resource, obj: Value) {
        let key = Self::key(resource, &obj);
        self.lock().insert(key, obj);
    }

    fn remove(&self, resource: Resource, obj: &Value) {
        let key = Self::key(resource, obj);
        self.lock().remove(&key);
    }

    fn list(&self, resource: Resource) -> Vec<Value> {
        self.lock()
            .iter()
            .filter(|((r, _, _), _)| *r == resource)
            .map(|(_, obj)| obj.clone())
            .collect()
    }

    fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .get(&(resource, namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Value>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "BadRequest", message)
}

fn forbidden(message: impl Into<String>) -> ApiError {
    ApiError::new(403, "Forbidden", message)
}

/// The mutating webhook (§2.1).
fn webhook(
    operation: Operation,
    resource: Resource,
    crr: &mut Value,
    old: Option<&Value>,
    store: &super::apiserver::Store,
) -> Result<(), ApiError> {
    if resource != Resource::Crr {
        return Ok(());
    }
    if operation == Operation::Update {
        let old = old.cloned().unwrap_or_default();
        if crr["spec"] != old["spec"] {
            return Err(forbidden("spec of ContainerRecreateRequest is immutable"));
        }
        for key in [LABEL_POD_UID, LABEL_NODE] {
            if crr["metadata"]["labels"][key] != old["metadata"]["labels"][key] {
                return Err(forbidden(format!(
                    "not allowed to update immutable label {key}"
                )));
            }
        }
        let stamp = old["metadata"]["annotations"][UNREADY_ANNOTATION]
            .as_str()
            .unwrap_or("");
        if !stamp.is_empty()
            && crr["metadata"]["annotations"][UNREADY_ANNOTATION]
                != old["metadata"]["annotations"][UNREADY_ANNOTATION]
        {
            return Err(forbidden(format!(
                "not allowed to update immutable annotation {UNREADY_ANNOTATION}"
            )));
        }
        return Ok(());
    }
    if !crr["metadata"]["labels"].is_object() {
        crr["metadata"]["labels"] = json!({});
    }
    let pod_name = crr["spec"]["podName"].as_str().unwrap_or("").to_owned();
    if pod_name.is_empty() {
        return Err(bad_request("podName can not be empty"));
    }
    if crr["spec"]["strategy"].is_null() {
        crr["spec"]["strategy"] = json!({});
    }
    crr["metadata"]["labels"][LABEL_ACTIVE] = json!("true");
    let containers = crr["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if containers.is_empty() {
        return Err(bad_request("containers list can not be null"));
    }
    if crr["spec"]["activeDeadlineSeconds"]
        .as_i64()
        .is_some_and(|d| d < 3)
    {
        return Err(bad_request("activeDeadlineSeconds can not be less than 3s"));
    }
    let strategy = &crr["spec"]["strategy"];
    if strategy["terminationGracePeriodSeconds"]
        .as_i64()
        .is_some_and(|v| v < 0)
    {
        return Err(bad_request(
            "terminationGracePeriodSeconds must be non-negative integer",
        ));
    }
    if strategy["unreadyGracePeriodSeconds"]
        .as_i64()
        .is_some_and(|v| v < 0)
    {
        return Err(bad_request(
            "unreadyGracePeriodSeconds must be non-negative integer",
        ));
    }
    match strategy["failurePolicy"].as_str().unwrap_or("") {
        "" => crr["spec"]["strategy"]["failurePolicy"] = json!("Fail"),
        "Fail" | "Ignore" => {}
        other => return Err(bad_request(format!("unknown failurePolicy {other}"))),
    }
    let namespace = crr["metadata"]["namespace"]
        .as_str()
        .unwrap_or(NAMESPACE)
        .to_owned();
    let pod = store
        .get(Resource::Pod, &namespace, &pod_name)
        .cloned()
        .ok_or_else(|| bad_request(format!("no found Pod named {pod_name}")))?;
    let phase = pod["status"]["phase"].as_str().unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") || pod["metadata"]["deletionTimestamp"].is_string() {
        return Err(bad_request(
            "not allowed to recreate containers in an inactive Pod",
        ));
    }
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_owned();
    if node.is_empty() {
        return Err(bad_request(
            "not allowed to recreate containers in a pending Pod",
        ));
    }
    if store.get(Resource::Node, "", &node).is_none() {
        return Err(bad_request(format!("failed to get Node {node}")));
    }
    crr["metadata"]["labels"][LABEL_NODE] = json!(node);
    crr["metadata"]["labels"][LABEL_POD_UID] = pod["metadata"]["uid"].clone();
    if crr["spec"]["strategy"]["terminationGracePeriodSeconds"].is_null() {
        crr["spec"]["strategy"]["terminationGracePeriodSeconds"] =
            pod["spec"]["terminationGracePeriodSeconds"].clone();
    }
    let mut seen = Vec::new();
    let mut mutated = Vec::new();
    for mut container in containers {
        let name = container["name"].as_str().unwrap_or("").to_owned();
        if seen.contains(&name) {
            return Err(bad_request(format!("can not recreate {name} multi times")));
        }
        seen.push(name.clone());
        if !container["preStop"].is_null()
            || !container["ports"].is_null()
            || !container["statusContext"].is_null()
        {
            return Err(bad_request(
                "preStop, ports, statusContext in container are ready-only fields",
            ));
        }
        let find = |list: &str| {
            pod["spec"][list]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["name"] == name.as_str()).cloned())
        };
        let spec = find("initContainers")
            .or_else(|| find("containers"))
            .ok_or_else(|| bad_request(format!("container {name} not found in Pod")))?;
        let status = pod["status"]["containerStatuses"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name.as_str()).cloned())
            .ok_or_else(|| {
                bad_request(format!("not found {name} containerStatus in Pod Status"))
            })?;
        let id = status["containerID"].as_str().unwrap_or("");
        if id.is_empty() {
            return Err(bad_request(format!(
                "no containerID in {name} containerStatus, maybe the container has not been initialized"
            )));
        }
        let pre_stop = &spec["lifecycle"]["preStop"];
        if pre_stop.is_object() {
            let mut copied = json!({});
            for action in ["exec", "httpGet", "tcpSocket"] {
                if !pre_stop[action].is_null() {
                    copied[action] = pre_stop[action].clone();
                }
            }
            if copied.as_object().is_some_and(|c| !c.is_empty()) || pre_stop["sleep"].is_object() {
                container["preStop"] = copied;
            }
            if !pre_stop["httpGet"].is_null() && !spec["ports"].is_null() {
                container["ports"] = spec["ports"].clone();
            }
        }
        container["statusContext"] =
            json!({"containerID": id, "restartCount": status["restartCount"]});
        mutated.push(container);
    }
    crr["spec"]["containers"] = json!(mutated);
    Ok(())
}

fn crr_key(crr: &Value) -> (String, String) {
    (
        crr["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        crr["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn seconds_since(stamp: &Value) -> i64 {
    let Some(at) = stamp
        .as_str()
        .and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
    else {
        return 0;
    };
    k8s_openapi::jiff::Timestamp::now().as_second() - at.as_second()
}

/// v1.9 updates the status from its cached copy (a conflict on a stale
/// copy); master merge-patches it, with no resourceVersion.
fn complete(api: &FakeApiServer, crr: &Value, message: &str, master: bool) {
    let (ns, name) = crr_key(crr);
    if master {
        let mut status = json!({"phase": "Completed", "completionTime": now()});
        if !message.is_empty() {
            status["message"] = json!(message);
        }
        let _ = api.patch(Resource::Crr, &ns, &name, &json!({"status": status}), true);
        return;
    }
    let mut next = crr.clone();
    next["status"]["phase"] = json!("Completed");
    next["status"]["completionTime"] = json!(now());
    next["status"]["message"] = json!(message);
    let _ = api.update(Resource::Crr, &ns, &name, next, true);
}

/// The manager's reconcile of one CRR (§2.2).
fn reconcile(api: &FakeApiServer, cache: &Cache, crr: &Value, master: bool) {
    let (ns, name) = crr_key(crr);
    let pod_name = crr["spec"]["podName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let pod = cache.get(Resource::Pod, &ns, &pod_name);
    let finished = crr["metadata"]["deletionTimestamp"].is_string()
        || crr["status"]["completionTime"].is_string();
    if finished {
        let finalizers = crr["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if finalizers.iter().any(|f| f == UNREADY_FINALIZER) {
            if let Some(pod) = pod
                .as_ref()
                .filter(|p| !p["metadata"]["deletionTimestamp"].is_string())
            {
                set_not_ready_key(api, pod, &format!("{ns}/{name}"), false);
            }
            let rest: Vec<Value> = finalizers
                .into_iter()
                .filter(|f| f != UNREADY_FINALIZER)
                .collect();
            let _ = api.patch(
                Resource::Crr,
                &ns,
                &name,
                &json!({"metadata": {"finalizers": rest}}),
                false,
            );
            return;
        }
        if crr["metadata"]["deletionTimestamp"].is_string() {
            return;
        }
        if crr["metadata"]["labels"][LABEL_ACTIVE].is_string() {
            let patch = json!({"metadata": {"labels": {LABEL_ACTIVE: null}}});
            let _ = api.patch(Resource::Crr, &ns, &name, &patch, false);
            return;
        }
        if let Some(ttl) = crr["spec"]["ttlSecondsAfterFinished"].as_i64() {
            if seconds_since(&crr["status"]["completionTime"]) >= ttl {
                let _ = api.delete(Resource::Crr, &ns, &name);
            }
        }
        return;
    }
    let pod_gone = match &pod {
        None => true,
        Some(pod) => {
            pod["metadata"]["deletionTimestamp"].is_string()
                || pod["metadata"]["uid"] != crr["metadata"]["labels"][LABEL_POD_UID]
        }
    };
    if pod_gone {
        complete(api, crr, "pod has gone", master);
        return;
    }
    let Some(pod) = pod else { return };
    let phase = crr["status"]["phase"].as_str().unwrap_or("");
    let age = seconds_since(&crr["metadata"]["creationTimestamp"]);
    if phase.is_empty() && age > 60 {
        complete(api, crr, "daemon has not responded for a long time", master);
        return;
    }
    if let Some(deadline) = crr["spec"]["activeDeadlineSeconds"].as_i64() {
        if age >= deadline {
            complete(
                api,
                crr,
                "recreating has exceeded the activeDeadlineSeconds",
                master,
            );
            return;
        }
    }
    if phase != "Recreating" {
        return;
    }
    sync_container_statuses(api, crr, &pod, master);
    let unready = &crr["spec"]["strategy"]["unreadyGracePeriodSeconds"];
    let stamped = if master {
        grace_condition(crr).is_some()
    } else {
        crr["metadata"]["annotations"][UNREADY_ANNOTATION]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    };
    if !unready.is_null() && !stamped {
        let gated = pod["spec"]["readinessGates"]
            .as_array()
            .is_some_and(|gates| gates.iter().any(|g| g["conditionType"] == KRUISE_POD_READY));
        if gated {
            let mut finalizers = crr["metadata"]["finalizers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !finalizers.iter().any(|f| f == UNREADY_FINALIZER) {
                finalizers.push(json!(UNREADY_FINALIZER));
                let patch = json!({"metadata": {"finalizers": finalizers}});
                if api.patch(Resource::Crr, &ns, &name, &patch, false).is_err() {
                    return;
                }
            }
            set_not_ready_key(api, &pod, &format!("{ns}/{name}"), true);
        }
        if master {
            // meta.SetStatusCondition, then the whole list merge-patched.
            let mut conditions: Vec<Value> = crr["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c["type"] != "PreRecreateGrace")
                .collect();
            conditions.push(json!({"type": "PreRecreateGrace", "status": "True",
                "lastTransitionTime": now(), "reason": "PreRecreateGrace",
                "message": "Pod has been forced to not-ready for unreadyGracePeriodSeconds drain"}));
            let patch = json!({"status": {"conditions": conditions}});
            let _ = api.patch(Resource::Crr, &ns, &name, &patch, true);
        } else {
            let patch = json!({"metadata": {"annotations": {UNREADY_ANNOTATION: now()}}});
            let _ = api.patch(Resource::Crr, &ns, &name, &patch, false);
        }
    }
}

/// Master's PreRecreateGrace condition, when True.
fn grace_condition(crr: &Value) -> Option<&Value> {
    crr["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "PreRecreateGrace" && c["status"] == "True")
}

/// §1.7: the CRR's containers that run in the Pod since the CRR was created.
fn sync_container_statuses(api: &FakeApiServer, crr: &Value, pod: &Value, master: bool) {
    let (ns, name) = crr_key(crr);
    let created = seconds_since(&crr["metadata"]["creationTimestamp"]);
    let wanted: Vec<&str> = crr["spec"]["containers"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let mut synced = Vec::new();
    for status in pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(name) = status["name"].as_str().filter(|n| wanted.contains(n)) else {
            continue;
        };
        let started = &status["state"]["running"]["startedAt"];
        // Started at or after the CRR's creation (whole seconds, one clock here).
        if !started.is_string() || seconds_since(started) > created {
            continue;
        }
        let mut entry =
            json!({"name": name, "ready": status["ready"], "restartCount": status["restartCount"]});
        if let Some(id) = status["containerID"].as_str().filter(|id| !id.is_empty()) {
            entry["containerID"] = json!(id);
        }
        synced.push(entry);
    }
    if master {
        // status.containerStatusSnapshot: never emptied, never rewritten as is.
        let current = crr["status"]["containerStatusSnapshot"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if (synced.is_empty() && !current.is_empty()) || synced == current {
            return;
        }
        let patch = json!({"status": {"containerStatusSnapshot": synced}});
        let _ = api.patch(Resource::Crr, &ns, &name, &patch, true);
        return;
    }
    let text = Value::Array(synced).to_string();
    if crr["metadata"]["annotations"][SYNC_ANNOTATION].as_str() != Some(text.as_str()) {
        let patch = json!({"metadata": {"annotations": {SYNC_ANNOTATION: text}}});
        let _ = api.patch(Resource::Crr, &ns, &name, &patch, false);
    }
}

/// §1.8: adds or removes this CRR's key in the KruisePodReady condition.
fn set_not_ready_key(api: &FakeApiServer, pod: &Value, key: &str, add: bool) {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
    let mut conditions = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let index = conditions
        .iter()
        .position(|c| c["type"] == KRUISE_POD_READY);
    let mut keys: Vec<Value> = index
        .and_then(|i| conditions[i]["message"].as_str().map(str::to_owned))
        .and_then(|m| serde_json::from_str(&m).ok())
        .unwrap_or_default();
    keys.retain(|k| k["key"] != key);
    if add {
        keys.push(json!({"userAgent": "ContainerRecreateRequest", "key": key}));
    }
    keys.sort_by_key(|k| (k["userAgent"].to_string(), k["key"].to_string()));
    let status = if keys.is_empty() { "True" } else { "False" };
    // Go's field order (userAgent, key), which a JSON map would not keep.
    let entries: Vec<String> = keys
        .iter()
        .map(|k| format!(r#"{{"userAgent":{},"key":{}}}"#, k["userAgent"], k["key"]))
        .collect();
    let message = format!("[{}]", entries.join(","));
    let condition = json!({"type": KRUISE_POD_READY, "status": status,
                           "message": message, "lastTransitionTime": now()});
    match index {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
    if !add {
        // With no keys left the message is dropped.
        if let Some(i) = conditions
            .iter()
            .position(|c| c["type"] == KRUISE_POD_READY)
        {
            if conditions[i]["status"] == "True" {
                conditions[i]["message"] = json!("");
            }
        }
    }
    let patch = json!({"status": {"conditions": conditions}});
    let _ = api.patch(Resource::Pod, ns, name, &patch, true);
}
