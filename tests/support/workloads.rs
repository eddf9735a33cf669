//! Workloads as their controllers leave them in the API server (the object,
//! a Deployment's ReplicaSet, Pods with controller ownerReferences, run by
//! the kubelet role), and the disruption controller, which keeps each
//! PodDisruptionBudget's status as kube-controller-manager's does.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::apiserver::{FakeApiServer, Resource, Selector};
use super::kubelet::{Kubelet, PodSpec};
use super::roles::{NAMESPACE, condition};

/// A workload and the Pods its controller made.
pub struct Workload {
    pub uid: String,
    pub pods: Vec<String>,
}

fn owner(kind: &str, api_version: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": true, "blockOwnerDeletion": true}])
}

/// Creates the workload object of `resource` named `name` with `replicas`
/// Pods labelled `app: name`; `pod` gives each Pod's spec by name. A
/// Deployment owns a ReplicaSet that owns the Pods, as its controller
/// leaves them.
pub async fn create(
    api: &FakeApiServer,
    kubelet: &Kubelet,
    resource: Resource,
    name: &str,
    replicas: usize,
    pod: impl Fn(&str) -> PodSpec,
) -> Workload {
    let (uid, owner, prefix) = create_owners(api, resource, name, replicas);
    let mut pods = Vec::new();
    for i in 0..replicas {
        // StatefulSets name Pods by ordinal; the others by a random suffix.
        let pod_name = match resource {
            Resource::StatefulSet | Resource::AdvancedStatefulSet => format!("{prefix}-{i}"),
            _ => format!(
                "{prefix}-{}",
                [
                    "bx7k2", "c9q4m", "dz5wp", "fh2ls", "gk8rt", "jn3vd", "kq6xb", "lr4zc"
                ][i % 8]
            ),
        };
        let mut spec = pod(&pod_name);
        spec.metadata = json!({"labels": {"app": name}, "ownerReferences": owner.clone()});
        kubelet.run_pod(spec).await;
        pods.push(pod_name);
    }
    Workload { uid, pods }
}

/// The workload object, a Deployment's ReplicaSet, and the Pods' owner
/// references and name prefix.
fn create_owners(
    api: &FakeApiServer,
    resource: Resource,
    name: &str,
    replicas: usize,
) -> (String, Value, String) {
    let selector = json!({"matchLabels": {"app": name}});
    let (kind, api_version) = (resource.kind(), resource.api_version());
    let object = api
        .create(
            resource,
            NAMESPACE,
            json!({"apiVersion": api_version, "metadata": {"name": name},
                   "spec": {"replicas": replicas, "selector": selector,
                            "template": {"metadata": {"labels": {"app": name}}}}}),
        )
        .expect("create the workload");
    let uid = object["metadata"]["uid"].as_str().unwrap().to_owned();
    if resource != Resource::Deployment {
        return (
            uid.clone(),
            owner(kind, api_version, name, &uid),
            name.to_owned(),
        );
    }
    let rs_name = format!("{name}-7d4b9c");
    let rs = api
        .create(
            Resource::ReplicaSet,
            NAMESPACE,
            json!({"metadata": {"name": rs_name, "ownerReferences": owner(kind, api_version, name, &uid),
                                "labels": {"app": name, "pod-template-hash": "7d4b9c"}},
                   "spec": {"replicas": replicas,
                            "selector": {"matchLabels": {"app": name, "pod-template-hash": "7d4b9c"}}}}),
        )
        .expect("create the ReplicaSet");
    let rs_uid = rs["metadata"]["uid"].as_str().unwrap().to_owned();
    (
        uid,
        owner("ReplicaSet", "apps/v1", &rs_name, &rs_uid),
        rs_name,
    )
}

/// A Deployment of `replicas` one-container (`app`) Pods that exist only in
/// the API server, Running and Ready on node `paper`: for measuring the
/// restart command at a scale no real containerd here could run.
pub fn on_paper(api: &FakeApiServer, name: &str, replicas: usize) -> Workload {
    let (uid, owner, prefix) = create_owners(api, Resource::Deployment, name, replicas);
    let pods = (0..replicas)
        .map(|i| {
            let pod_name = format!("{prefix}-{i:05}");
            api.create(
                Resource::Pod,
                NAMESPACE,
                json!({"metadata": {"name": pod_name, "labels": {"app": name}, "ownerReferences": owner},
                       "spec": {"nodeName": "paper", "containers": [{"name": "app", "image": "app:1"}]}}),
            )
            .expect("create a Pod");
            let status = paper_status(&pod_name, 0);
            api.patch(Resource::Pod, NAMESPACE, &pod_name, &json!({"status": status}), true)
                .expect("the Pod's status");
            pod_name
        })
        .collect();
    Workload { uid, pods }
}

fn paper_status(pod: &str, restarts: i64) -> Value {
    json!({"phase": "Running",
           "conditions": [{"type": "Ready", "status": "True"}],
           "containerStatuses": [{"name": "app", "ready": true, "restartCount": restarts, "image": "app:1",
                                  "imageID": "", "containerID": format!("containerd://{pod}-{restarts}"),
                                  "state": {"running": {"startedAt": "2026-12-03T00:00:00Z"}}}]})
}

/// The node of `on_paper`'s Pods: each CRR it sees is at once completed,
/// its container restarted (the restart count moves on) and Ready.
pub struct PaperNode {
    task: JoinHandle<()>,
}

impl Drop for PaperNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PaperNode {
    pub fn start(api: &FakeApiServer) -> Self {
        let api = api.clone();
        let mut changes = api.subscribe();
        let task = tokio::spawn(async move {
            loop {
                let change = match changes.recv().await {
                    Ok(change) => change,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                if change.resource != Resource::Crr
                    || change.kind != super::apiserver::ChangeKind::Added
                {
                    continue;
                }
                let crr = &change.new;
                let name = crr["metadata"]["name"].as_str().unwrap_or_default();
                let pod = crr["spec"]["podName"].as_str().unwrap_or_default();
                let Some(current) = api.get(Resource::Pod, NAMESPACE, pod) else {
                    continue;
                };
                let restarts = current["status"]["containerStatuses"][0]["restartCount"]
                    .as_i64()
                    .unwrap_or_default();
                let status = paper_status(pod, restarts + 1);
                let _ = api.patch(
                    Resource::Pod,
                    NAMESPACE,
                    pod,
                    &json!({"status": status}),
                    true,
                );
                let done = json!({"status": {"phase": "Completed", "completionTime": super::apiserver::now(),
                                             "containerRecreateStates": [{"name": "app", "phase": "Succeeded", "isKilled": true}]}});
                let _ = api.patch(Resource::Crr, NAMESPACE, name, &done, true);
            }
        });
        Self { task }
    }
}

/// kube-controller-manager's disruption controller, for every PDB: the
/// Pods it selects, how many are healthy (Ready, not being deleted), how
/// many must be, and so `disruptionsAllowed`, written to the status with
/// the generation it saw. Like the real one it trails the Pods: it looks
/// every `LAG`. (The real one counts the expected Pods from the owning
/// controller's scale; here, the Pods selected, which is the same while
/// none is missing.)
pub struct DisruptionController {
    task: JoinHandle<()>,
}

pub const LAG: Duration = Duration::from_millis(250);

impl Drop for DisruptionController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DisruptionController {
    pub fn start(api: &FakeApiServer) -> Self {
        let api = api.clone();
        let task = tokio::spawn(async move {
            loop {
                for pdb in api.list(Resource::PodDisruptionBudget, None, &Selector::default()) {
                    let status = judge(&api, &pdb);
                    let namespace = pdb["metadata"]["namespace"].as_str().unwrap_or_default();
                    let name = pdb["metadata"]["name"].as_str().unwrap_or_default();
                    if pdb["status"] != status {
                        let _ = api.patch(
                            Resource::PodDisruptionBudget,
                            namespace,
                            name,
                            &json!({"status": status}),
                            true,
                        );
                    }
                }
                tokio::time::sleep(LAG).await;
            }
        });
        Self { task }
    }
}

fn judge(api: &FakeApiServer, pdb: &Value) -> Value {
    let namespace = pdb["metadata"]["namespace"].as_str().unwrap_or_default();
    let labels: Vec<String> = pdb["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let pods = api.list(
        Resource::Pod,
        Some(namespace),
        &Selector::labels(&labels.join(",")),
    );
    let expected = pods.len() as i64;
    let healthy = pods
        .iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && condition(p, "Ready").as_deref() == Some("True")
        })
        .count() as i64;
    // An int, or a percentage of the expected Pods rounded up (as
    // intstr.GetScaledValueFromIntOrPercent with roundUp).
    let scaled = |v: &Value| match v {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map(|p| (p * expected + 99) / 100)
            .unwrap_or(0),
        _ => 0,
    };
    let desired = if let Some(max) = pdb["spec"].get("maxUnavailable") {
        (expected - scaled(max)).max(0)
    } else if let Some(min) = pdb["spec"].get("minAvailable") {
        scaled(min)
    } else {
        expected
    };
    json!({
        "observedGeneration": pdb["metadata"]["generation"],
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": (healthy - desired).max(0),
    })
}
