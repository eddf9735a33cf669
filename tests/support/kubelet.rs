//! kubelet, for the Pods of one node, on the real containerd: it runs them
//! with kubelet's labels and annotations, reports their status to the fake
//! API server as kubelet's status manager does (running, waiting in
//! CrashLoopBackOff, terminated, lastState, the Pod IP), and restarts a
//! container that exited (attempt + 1) as its restartPolicy says, held back
//! by kubelet's CrashLoopBackOff. A Pod deleted gracefully has its
//! containers stopped before the object goes. Every second it also sends the PLEG
//! relist's CRI calls (GetPodStatus's for a Pod whose containers changed),
//! and once a minute it removes dead containers as kubelet's garbage
//! collection does; these reach the runtime through crr-proxy when the
//! role is given crr-proxy's socket.
//!
//! Faster than kubelet in one respect only: an exit is seen within 100 ms
//! (kubelet's relist sees it within about a second).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crr_proxy::cri::RuntimeClient;
use crr_proxy::cri::v1::{
    ContainerFilter, ContainerState, ContainerStatusRequest, ListContainersRequest,
    ListPodSandboxRequest, PodSandboxConfig, PodSandboxFilter, PodSandboxStatusRequest,
    RemoveContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use crr_proxy::kill::keys;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::apiserver::{FakeApiServer, Resource, now};
use super::pods;
use super::roles::{KRUISE_POD_READY, NAMESPACE, condition, wait_for};

/// kubelet's CrashLoopBackOff: the first restart is at once; each later
/// exit waits `initial`, doubling up to `max`; an exit more than 2 × `max`
/// after the last restart starts over (client-go's flowcontrol.Backoff).
#[derive(Clone, Copy, Debug)]
pub struct CrashLoopBackOff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for CrashLoopBackOff {
    /// kubelet's defaults (`initialCrashLoopBackOff`, `MaxContainerBackOff`).
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

/// The Pod's `restartPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }
}

/// What kubelet does with an exited regular container.
#[derive(Debug, PartialEq, Eq)]
enum AfterExit {
    Restart,
    StayDown,
    /// A `RestartAllContainers` rule matched (KEP-5532).
    RestartAll,
}

/// kubelet's decision for an exited regular container, written apart from
/// crr-proxy's: `ShouldContainerBeRestarted` (pkg/kubelet/container/
/// helpers.go) which, with feature gate ContainerRestartRules on, is
/// `ContainerShouldRestart` (pkg/api/v1/pod/util.go): the container's first
/// matching rule if its action is Restart, else the container's policy,
/// and without one the Pod's; a matching RestartAllContainers rule resets
/// the whole Pod (kuberuntime_manager.go, computePodActions).
fn after_exit(
    pod_policy: RestartPolicy,
    container: &Value,
    exit_code: i32,
    rules_gate: bool,
) -> AfterExit {
    let by_policy = |policy: &str| match policy {
        "Always" => true,
        "OnFailure" => exit_code != 0,
        _ => false,
    };
    let restart = match container["restartPolicy"].as_str() {
        Some(own) if rules_gate => {
            let matched = container["restartPolicyRules"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|rule| {
                    let codes = &rule["exitCodes"];
                    let listed = codes["values"].as_array().is_some_and(|v| {
                        v.iter().any(|c| c.as_i64() == Some(i64::from(exit_code)))
                    });
                    match codes["operator"].as_str() {
                        Some("In") => listed,
                        Some("NotIn") => !listed,
                        _ => false,
                    }
                });
            match matched.and_then(|rule| rule["action"].as_str()) {
                Some("RestartAllContainers") => return AfterExit::RestartAll,
                Some("Restart") => true,
                _ => by_policy(own),
            }
        }
        _ => by_policy(pod_policy.as_str()),
    };
    if restart {
        AfterExit::Restart
    } else {
        AfterExit::StayDown
    }
}

/// The node's address, and so the address of its host-network Pods.
pub const NODE_IP: &str = "127.0.0.1";

/// One container of a test Pod.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub name: String,
    pub command: Vec<String>,
    /// The Pod spec's `lifecycle.preStop` (JSON LifecycleHandler).
    pub pre_stop: Option<Value>,
    /// How long a postStart hook keeps the container from being ready.
    pub post_start: Duration,
    /// A host directory mounted at `/shared` (hooks leave traces there).
    pub shared: Option<PathBuf>,
    /// The container's own `restartPolicy` and `restartPolicyRules`
    /// (Kubernetes 1.34+), merged into its spec.
    pub restart: Value,
    /// A native sidecar: an init container with `restartPolicy: Always`.
    pub sidecar: bool,
}

impl ContainerSpec {
    /// A container that exits 0 on SIGTERM.
    pub fn graceful(name: &str) -> Self {
        Self {
            name: name.into(),
            command: [
                "sh",
                "-c",
                "trap 'exit 0' TERM; while :; do sleep 0.1; done",
            ]
            .map(String::from)
            .to_vec(),
            pre_stop: None,
            post_start: Duration::ZERO,
            shared: None,
            restart: json!({}),
            sidecar: false,
        }
    }

    /// A native sidecar that exits 0 on SIGTERM.
    pub fn sidecar(name: &str) -> Self {
        let mut spec = Self::graceful(name);
        spec.sidecar = true;
        spec.restart = json!({"restartPolicy": "Always"});
        spec
    }

    /// A container that exits with `code` on SIGTERM.
    pub fn exiting_with(name: &str, code: u8) -> Self {
        let mut spec = Self::graceful(name);
        spec.command[2] = format!("trap 'exit {code}' TERM; while :; do sleep 0.1; done");
        spec
    }
}

#[derive(Clone, Debug)]
pub struct PodSpec {
    pub name: String,
    pub containers: Vec<ContainerSpec>,
    pub termination_grace_period: i64,
    /// Has the `KruisePodReady` readiness gate (as Kruise workloads' Pods do).
    pub readiness_gate: bool,
    pub restart_policy: RestartPolicy,
    /// More metadata for the Pod object (labels, ownerReferences), merged in.
    pub metadata: Value,
}

impl PodSpec {
    pub fn new(name: &str, containers: Vec<ContainerSpec>) -> Self {
        Self {
            name: name.into(),
            containers,
            termination_grace_period: 30,
            readiness_gate: true,
            restart_policy: RestartPolicy::Always,
            metadata: json!({}),
        }
    }
}

struct ContainerRun {
    spec: ContainerSpec,
    /// Runtime ID of the current instance.
    id: String,
    attempt: u32,
    started_at: String,
    ready_at: tokio::time::Instant,
    last_terminated: Option<Value>,
    /// The instance before this one, while the runtime still has it.
    previous_id: Option<String>,
    /// This instance has exited and is not restarted (yet): its
    /// `state.terminated`, and while CrashLoopBackOff holds it, the
    /// waiting message.
    exited: Option<Value>,
    waiting: Option<String>,
    /// The CrashLoopBackOff entry of this container (it outlives instances):
    /// the current delay and when it was last moved on, in Unix nanoseconds.
    backoff: Option<(Duration, i64)>,
}

struct PodRun {
    spec: PodSpec,
    uid: String,
    sandbox_id: String,
    sandbox: PodSandboxConfig,
    containers: Vec<ContainerRun>,
}

/// kubelet, for the Pods of one node.
pub struct Kubelet {
    pub node: String,
    api: FakeApiServer,
    cri: RuntimeClient,
    log_dir: PathBuf,
    pods: Arc<tokio::sync::Mutex<Vec<PodRun>>>,
    backoff: Arc<std::sync::Mutex<CrashLoopBackOff>>,
    rules: Arc<RestartRules>,
    task: JoinHandle<()>,
}

/// How this kubelet reads restart rules.
struct RestartRules {
    /// Feature gate ContainerRestartRules (on by default since 1.35).
    gate: bool,
    restarted_all: AtomicUsize,
}

impl Kubelet {
    pub async fn start(
        api: &FakeApiServer,
        cri: RuntimeClient,
        node: &str,
        log_dir: PathBuf,
    ) -> Self {
        let _ = api.create(
            Resource::Node,
            "",
            json!({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                   "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}}),
        );
        let pods: Arc<tokio::sync::Mutex<Vec<PodRun>>> = Arc::default();
        let backoff = Arc::new(std::sync::Mutex::new(CrashLoopBackOff::default()));
        let rules = Arc::new(RestartRules {
            gate: true,
            restarted_all: AtomicUsize::new(0),
        });
        let task = tokio::spawn({
            let (api, cri, pods) = (api.clone(), cri.clone(), Arc::clone(&pods));
            let backoff = Arc::clone(&backoff);
            let rules = Arc::clone(&rules);
            async move {
                let mut tick = 0u64;
                let mut records = Records::new();
                loop {
                    {
                        let mut pods = pods.lock().await;
                        if tick % 10 == 0 {
                            relist(&cri, &pods, &mut records).await;
                        }
                        if tick % 600 == 599 {
                            collect_dead_containers(&cri, &pods).await;
                        }
                        let backoff = *backoff.lock().unwrap_or_else(|p| p.into_inner());
                        let mut gone = Vec::new();
                        for (i, pod) in pods.iter_mut().enumerate() {
                            if terminate_if_deleted(&api, &cri, pod).await {
                                gone.push(i);
                                continue;
                            }
                            restart_exited(&cri, pod, backoff, &rules).await;
                            report(&api, pod);
                        }
                        for i in gone.into_iter().rev() {
                            pods.remove(i);
                        }
                    }
                    tick += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Self {
            node: node.into(),
            api: api.clone(),
            cri,
            log_dir,
            pods,
            backoff,
            rules,
            task,
        }
    }

    /// How often a RestartAllContainers rule reset a Pod of this node.
    pub fn pods_restarted_whole(&self) -> usize {
        self.rules.restarted_all.load(Ordering::SeqCst)
    }

    /// Sets the node's CrashLoopBackOff (kubelet's defaults until then).
    pub fn set_crash_loop_backoff(&self, backoff: CrashLoopBackOff) {
        *self.backoff.lock().unwrap_or_else(|p| p.into_inner()) = backoff;
    }

    /// Creates the Pod object, runs it, and waits until it is Ready. Its
    /// sidecars are its init containers, started first, in order.
    pub async fn run_pod(&self, mut spec: PodSpec) -> Value {
        spec.containers.sort_by_key(|c| !c.sidecar);
        let as_json = |c: &ContainerSpec| {
            let mut container = json!({"name": c.name, "image": super::images::BUSYBOX_IMAGE, "command": c.command});
            if let Some(pre_stop) = &c.pre_stop {
                container["lifecycle"] = json!({"preStop": pre_stop});
            }
            super::patch::merge_patch(&mut container, &c.restart);
            container
        };
        let (sidecars, containers): (Vec<&ContainerSpec>, Vec<&ContainerSpec>) =
            spec.containers.iter().partition(|c| c.sidecar);
        let mut pod_spec = json!({
            "nodeName": self.node,
            "hostNetwork": true,
            "restartPolicy": spec.restart_policy.as_str(),
            "terminationGracePeriodSeconds": spec.termination_grace_period,
            "containers": containers.into_iter().map(as_json).collect::<Vec<_>>(),
        });
        if !sidecars.is_empty() {
            pod_spec["initContainers"] = sidecars.into_iter().map(as_json).collect();
        }
        if spec.readiness_gate {
            pod_spec["readinessGates"] = json!([{"conditionType": KRUISE_POD_READY}]);
        }
        let mut metadata = spec.metadata.clone();
        metadata["name"] = json!(spec.name);
        let pod = self
            .api
            .create(
                Resource::Pod,
                NAMESPACE,
                json!({"metadata": metadata, "spec": pod_spec}),
            )
            .expect("create Pod");
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if spec.readiness_gate {
            // Kruise's workload controllers start Pods with the gate passed.
            let conditions = json!({"status": {"conditions": [
                {"type": KRUISE_POD_READY, "status": "True", "lastTransitionTime": now()}]}});
            self.api
                .patch(Resource::Pod, NAMESPACE, &spec.name, &conditions, true)
                .expect("set KruisePodReady");
        }

        let mut cri = self.cri.clone();
        let mut sandbox = pods::sandbox_config(&spec.name, &self.log_dir);
        if let Some(meta) = sandbox.metadata.as_mut() {
            meta.uid = uid.clone();
        }
        sandbox.labels.insert(keys::POD_UID.into(), uid.clone());
        let sandbox_id = cri
            .run_pod_sandbox(crr_proxy::cri::v1::RunPodSandboxRequest {
                config: Some(sandbox.clone()),
                runtime_handler: String::new(),
            })
            .await
            .expect("RunPodSandbox")
            .into_inner()
            .pod_sandbox_id;
        // As kubelet's SyncPod does at once after creating a sandbox, for
        // its IPs (`kuberuntime_manager.go`); crr-proxy edits this answer.
        cri.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus");
        let mut run = PodRun {
            spec: spec.clone(),
            uid,
            sandbox_id,
            sandbox,
            containers: Vec::new(),
        };
        for container in &spec.containers {
            let started = start(&self.cri, &run, container, 0)
                .await
                .expect("start container");
            run.containers.push(started);
        }
        report(&self.api, &run);
        self.pods.lock().await.push(run);
        self.wait_ready(&spec.name).await
    }

    pub async fn wait_ready(&self, pod: &str) -> Value {
        wait_for(Duration::from_secs(30), || {
            self.api
                .get(Resource::Pod, NAMESPACE, pod)
                .filter(|p| condition(p, "Ready").as_deref() == Some("True"))
        })
        .await
        .unwrap_or_else(|| panic!("Pod {pod} did not become Ready"))
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts one instance of a container, with kubelet's labels and annotations.
async fn start(
    cri: &RuntimeClient,
    pod: &PodRun,
    spec: &ContainerSpec,
    attempt: u32,
) -> anyhow::Result<ContainerRun> {
    let command: Vec<&str> = spec.command.iter().map(String::as_str).collect();
    let mut config = pods::container_config(&pod.sandbox, &spec.name, attempt, &command);
    config.annotations.insert(
        keys::TERMINATION_GRACE_PERIOD.into(),
        pod.spec.termination_grace_period.to_string(),
    );
    if let Some(pre_stop) = &spec.pre_stop {
        config
            .annotations
            .insert(keys::PRE_STOP_HANDLER.into(), pre_stop.to_string());
    }
    pods::own_pid_namespace(&mut config);
    if let Some(shared) = &spec.shared {
        pods::mount(&mut config, shared, "/shared");
    }
    let mut cri = cri.clone();
    let id = pods::start(&mut cri, &pod.sandbox_id, &pod.sandbox, config).await?;
    let status = cri
        .container_status(crr_proxy::cri::v1::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await?
        .into_inner()
        .status
        .unwrap_or_default();
    Ok(ContainerRun {
        spec: spec.clone(),
        id,
        attempt,
        started_at: rfc3339(status.started_at),
        ready_at: tokio::time::Instant::now() + spec.post_start,
        last_terminated: None,
        previous_id: None,
        exited: None,
        waiting: None,
        backoff: None,
    })
}

/// kubelet's restart: an exited container is started again, attempt + 1,
/// if the restart policy says so and CrashLoopBackOff lets it.
async fn restart_exited(
    cri: &RuntimeClient,
    pod: &mut PodRun,
    backoff: CrashLoopBackOff,
    rules: &RestartRules,
) {
    for i in 0..pod.containers.len() {
        let mut client = cri.clone();
        // Every sync reads the dead instance again, as kubelet's
        // GetPodStatus does: lastState is what the runtime says now.
        if let Some(previous) = pod.containers[i].previous_id.clone() {
            let status = client
                .container_status(ContainerStatusRequest {
                    container_id: previous,
                    verbose: false,
                })
                .await;
            if let Some(status) = status.ok().and_then(|s| s.into_inner().status) {
                pod.containers[i].last_terminated = Some(terminated(&status));
            }
        }
        let Ok(status) = client
            .container_status(ContainerStatusRequest {
                container_id: pod.containers[i].id.clone(),
                verbose: false,
            })
            .await
        else {
            continue;
        };
        let Some(status) = status.into_inner().status else {
            continue;
        };
        if status.state() != ContainerState::ContainerExited {
            continue;
        }
        pod.containers[i].exited = Some(terminated(&status));
        let spec = &pod.containers[i].spec;
        // A sidecar is started again whatever its exit code and the Pod's
        // policy (computeInitContainerActions), with the same back-off.
        let after = if spec.sidecar {
            AfterExit::Restart
        } else {
            after_exit(
                pod.spec.restart_policy,
                &spec.restart,
                status.exit_code,
                rules.gate,
            )
        };
        match after {
            AfterExit::StayDown => continue,
            AfterExit::Restart => {}
            AfterExit::RestartAll => {
                // The whole Pod is reset, without preStop hooks or grace.
                rules.restarted_all.fetch_add(1, Ordering::SeqCst);
                for other in &pod.containers {
                    let _ = client
                        .stop_container(StopContainerRequest {
                            container_id: other.id.clone(),
                            timeout: 0,
                        })
                        .await;
                }
            }
        }
        // doBackOff: held while the delay since the exit has not passed.
        let now = unix_nanos();
        let max = i64::try_from(backoff.max.as_nanos()).unwrap_or(i64::MAX);
        let entry = pod.containers[i]
            .backoff
            .filter(|(_, last)| status.finished_at - last <= 2 * max);
        if let Some((delay, _)) = entry {
            let delay_nanos = i64::try_from(delay.as_nanos()).unwrap_or(i64::MAX);
            if now - status.finished_at < delay_nanos {
                let meta = pod.sandbox.metadata.clone().unwrap_or_default();
                pod.containers[i].waiting = Some(format!(
                    "back-off {} restarting failed container={} pod={}_{}({})",
                    go_duration(delay),
                    pod.containers[i].spec.name,
                    meta.name,
                    meta.namespace,
                    pod.uid
                ));
                continue;
            }
        }
        let next_delay = match entry {
            Some((delay, _)) => (delay * 2).min(backoff.max),
            None => backoff.initial.min(backoff.max),
        };
        let spec = pod.containers[i].spec.clone();
        let attempt = pod.containers[i].attempt + 1;
        // A failed restart (the runtime going away at teardown) is retried
        // on the next pass, as kubelet's sync loop does.
        if let Ok(mut next) = start(cri, pod, &spec, attempt).await {
            next.last_terminated = Some(terminated(&status));
            next.previous_id = Some(status.id.clone());
            next.backoff = Some((next_delay, now));
            pod.containers[i] = next;
        }
    }
}

/// A Pod deleted gracefully (it has a deletionTimestamp): its containers
/// are stopped within `deletionGracePeriodSeconds` and never restarted, its
/// sandbox is stopped, and the Pod object is deleted for good (grace 0), as
/// kubelet does. True once the Pod is gone. (kubelet would run preStop
/// hooks here too; this role does not.)
async fn terminate_if_deleted(api: &FakeApiServer, cri: &RuntimeClient, pod: &PodRun) -> bool {
    let Some(object) = api.get(Resource::Pod, NAMESPACE, &pod.spec.name) else {
        return true;
    };
    if !object["metadata"]["deletionTimestamp"].is_string() {
        return false;
    }
    let grace = object["metadata"]["deletionGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(pod.spec.termination_grace_period);
    let mut cri = cri.clone();
    for container in &pod.containers {
        let _ = cri
            .stop_container(StopContainerRequest {
                container_id: container.id.clone(),
                timeout: grace.max(0),
            })
            .await;
    }
    let _ = cri
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
        })
        .await;
    let _ = api.delete_with_grace(Resource::Pod, NAMESPACE, &pod.spec.name, Some(0));
    api.get(Resource::Pod, NAMESPACE, &pod.spec.name).is_none()
}

/// What the last relist saw: each container's state and Pod UID by id, as
/// generic PLEG's podRecords keep them.
type Records = HashMap<String, (i32, String)>;

/// The generic PLEG's relist, as kubelet sends it every second: both full
/// lists, then GetPodStatus only for a Pod with an event (a container
/// appeared, changed state or went away) since the last relist
/// (`pkg/kubelet/pleg/generic.go`, `(*GenericPLEG).Relist`: "Nothing else
/// needed for this pod"). The answers are not needed here.
async fn relist(cri: &RuntimeClient, pods: &[PodRun], records: &mut Records) {
    let mut cri = cri.clone();
    let _ = cri.list_pod_sandbox(ListPodSandboxRequest::default()).await;
    let Ok(listed) = cri.list_containers(ListContainersRequest::default()).await else {
        return;
    };
    let mut now = Records::new();
    for container in listed.into_inner().containers {
        let uid = container
            .labels
            .get(keys::POD_UID)
            .cloned()
            .unwrap_or_default();
        now.insert(container.id, (container.state, uid));
    }
    // Appeared, changed state, or went away: an event of its Pod.
    let mut changed = std::collections::HashSet::new();
    for (id, (state, uid)) in &now {
        if records.get(id).map(|(old, _)| old) != Some(state) {
            changed.insert(uid.clone());
        }
    }
    for (id, (_, uid)) in records.iter() {
        if !now.contains_key(id) {
            changed.insert(uid.clone());
        }
    }
    *records = now;
    for pod in pods.iter().filter(|p| changed.contains(&p.uid)) {
        get_pod_status(&mut cri, pod).await;
    }
}

/// kubeGenericRuntimeManager.GetPodStatus's calls for one Pod.
async fn get_pod_status(cri: &mut RuntimeClient, pod: &PodRun) {
    let _ = cri
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: by_uid(&pod.uid),
                ..Default::default()
            }),
        })
        .await;
    let _ = cri
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
            verbose: false,
        })
        .await;
    for container in listed(cri, &pod.uid).await {
        let _ = cri
            .container_status(ContainerStatusRequest {
                container_id: container.id,
                verbose: false,
            })
            .await;
    }
}

/// kubelet's label selector for one Pod's sandboxes and containers.
fn by_uid(uid: &str) -> HashMap<String, String> {
    HashMap::from([(keys::POD_UID.to_owned(), uid.to_owned())])
}

/// The Pod's containers of every state (none when the runtime fails).
async fn listed(cri: &mut RuntimeClient, uid: &str) -> Vec<crr_proxy::cri::v1::Container> {
    let request = ListContainersRequest {
        filter: Some(ContainerFilter {
            label_selector: by_uid(uid),
            ..Default::default()
        }),
    };
    cri.list_containers(request)
        .await
        .map(|l| l.into_inner().containers)
        .unwrap_or_default()
}

/// kubelet's container garbage collection, once a minute
/// (`ContainerGCPeriod`, `pkg/kubelet/kubelet.go`) with its default policy
/// (`MinAge` 0, `MaxPerPodContainer` 1, `MaxContainers` -1, from the
/// deprecated flags' defaults in `cmd/kubelet/app/options/options.go`):
/// of each Pod's dead containers of one name, all but the newest are
/// removed (`pkg/kubelet/kuberuntime/kuberuntime_gc.go`,
/// `evictableContainers` and `removeOldestN`). Running ones are never
/// evictable.
async fn collect_dead_containers(cri: &RuntimeClient, pods: &[PodRun]) {
    let mut cri = cri.clone();
    for pod in pods {
        let mut dead: HashMap<String, Vec<(i64, String)>> = HashMap::new();
        for container in listed(&mut cri, &pod.uid).await {
            if container.state() == ContainerState::ContainerRunning {
                continue;
            }
            let name = container
                .labels
                .get(keys::CONTAINER_NAME)
                .cloned()
                .unwrap_or_default();
            dead.entry(name)
                .or_default()
                .push((container.created_at, container.id));
        }
        for mut group in dead.into_values() {
            group.sort_by_key(|c| std::cmp::Reverse(c.0));
            for (_, id) in group.into_iter().skip(1) {
                let _ = cri
                    .remove_container(RemoveContainerRequest { container_id: id })
                    .await;
            }
        }
    }
}

/// A delay as Go's `time.Duration` prints it (`10s`, `1m20s`, `5m0s`).
fn go_duration(delay: Duration) -> String {
    let seconds = delay.as_secs();
    if seconds < 60 {
        format!("{seconds}s")
    } else {
        format!("{}m{}s", seconds / 60, seconds % 60)
    }
}

fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// `lastState.terminated` from the runtime's status of a dead instance.
fn terminated(status: &crr_proxy::cri::v1::ContainerStatus) -> Value {
    let mut terminated = json!({
        "exitCode": status.exit_code,
        "reason": status.reason,
        "startedAt": rfc3339(status.started_at),
        "finishedAt": rfc3339(status.finished_at),
        "containerID": format!("containerd://{}", status.id),
    });
    if !status.message.is_empty() {
        terminated["message"] = json!(status.message);
    }
    terminated
}

/// Writes the Pod's status as kubelet's status manager would.
fn report(api: &FakeApiServer, pod: &PodRun) {
    let Some(current) = api.get(Resource::Pod, NAMESPACE, &pod.spec.name) else {
        return;
    };
    let tick = tokio::time::Instant::now();
    let statuses: Vec<Value> = pod
        .containers
        .iter()
        .map(|c| {
            let running = c.exited.is_none();
            let mut status = json!({
                "name": c.spec.name,
                "containerID": format!("containerd://{}", c.id),
                "image": super::images::BUSYBOX_IMAGE,
                "imageID": "",
                "restartCount": c.attempt,
                "ready": running && tick >= c.ready_at,
                "started": running,
                "state": {"running": {"startedAt": c.started_at}},
            });
            if let Some(terminated) = &c.last_terminated {
                status["lastState"] = json!({"terminated": terminated});
            }
            match (&c.exited, &c.waiting) {
                // Waiting for its restart: the dead instance moves to lastState.
                (Some(exited), Some(message)) => {
                    status["state"] =
                        json!({"waiting": {"reason": "CrashLoopBackOff", "message": message}});
                    status["lastState"] = json!({"terminated": exited});
                }
                (Some(exited), None) => status["state"] = json!({"terminated": exited}),
                (None, _) => {}
            }
            status
        })
        .collect();
    let containers_ready = statuses.iter().all(|s| s["ready"] == json!(true));
    // Sidecars are reported with the init containers, and count for
    // readiness like the others (GenerateContainersReadyCondition).
    let (init_statuses, statuses): (Vec<_>, Vec<_>) = statuses
        .into_iter()
        .zip(&pod.containers)
        .partition(|(_, c)| c.spec.sidecar);
    let init_statuses: Vec<Value> = init_statuses.into_iter().map(|(s, _)| s).collect();
    let statuses: Vec<Value> = statuses.into_iter().map(|(s, _)| s).collect();
    let gates_ready = !pod.spec.readiness_gate
        || condition(&current, KRUISE_POD_READY).as_deref() == Some("True");
    let ready = if containers_ready && gates_ready {
        "True"
    } else {
        "False"
    };
    let mut conditions: Vec<Value> = current
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !matches!(c["type"].as_str(), Some("Ready" | "ContainersReady")))
        .collect();
    let transition = |kind: &str, status: &str| {
        let old = condition(&current, kind);
        let at = if old.as_deref() == Some(status) {
            current
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
                .map(|c| c["lastTransitionTime"].clone())
                .unwrap_or(json!(now()))
        } else {
            json!(now())
        };
        json!({"type": kind, "status": status, "lastTransitionTime": at})
    };
    conditions.push(transition(
        "ContainersReady",
        if containers_ready { "True" } else { "False" },
    ));
    let mut ready_condition = transition("Ready", ready);
    if containers_ready && !gates_ready {
        ready_condition["reason"] = json!("ReadinessGatesNotReady");
    }
    conditions.push(ready_condition);
    // Host network: the Pod's IP is the node's.
    let mut status = json!({"status": {"phase": "Running", "containerStatuses": statuses, "conditions": conditions,
                                   "hostIP": NODE_IP, "podIP": NODE_IP, "podIPs": [{"ip": NODE_IP}]}});
    if !init_statuses.is_empty() {
        status["status"]["initContainerStatuses"] = json!(init_statuses);
    }
    let _ = api.patch(Resource::Pod, NAMESPACE, &pod.spec.name, &status, true);
}

/// CRI nanoseconds to RFC 3339 at whole seconds (metav1.Time).
pub fn rfc3339(nanos: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}
