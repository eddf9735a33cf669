//! Pods and containers made the way kubelet makes them (host network, the
//! labels and annotations kubelet writes), for tests on a real containerd.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use crr_proxy::cri::RuntimeClient;
use crr_proxy::cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerStatus, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RunPodSandboxRequest, StartContainerRequest,
};

use super::images::BUSYBOX_IMAGE;

/// A pod sandbox that runs in the node's network namespace (no CNI here).
pub fn sandbox_config(name: &str, log_dir: &Path) -> PodSandboxConfig {
    let uid = format!("uid-{name}");
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
        (
            "io.kubernetes.pod.namespace".to_owned(),
            "default".to_owned(),
        ),
        ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
    ]);
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid,
            namespace: "default".to_owned(),
            attempt: 0,
        }),
        // Host-network pods share the node's UTS namespace: no hostname of their own.
        hostname: String::new(),
        log_directory: log_dir.display().to_string(),
        labels,
        annotations: HashMap::new(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: String::new(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    target_id: String::new(),
                }),
                privileged: false,
            }),
        }),
    }
}

/// A busybox container with kubelet's four labels and its usual annotations.
pub fn container_config(
    pod: &PodSandboxConfig,
    name: &str,
    attempt: u32,
    command: &[&str],
) -> ContainerConfig {
    let meta = pod.metadata.clone().unwrap_or_default();
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_owned(), meta.name.clone()),
        (
            "io.kubernetes.pod.namespace".to_owned(),
            meta.namespace.clone(),
        ),
        ("io.kubernetes.pod.uid".to_owned(), meta.uid.clone()),
        ("io.kubernetes.container.name".to_owned(), name.to_owned()),
    ]);
    let annotations = HashMap::from([
        (
            "io.kubernetes.container.restartCount".to_owned(),
            attempt.to_string(),
        ),
        (
            "io.kubernetes.pod.terminationGracePeriod".to_owned(),
            "30".to_owned(),
        ),
    ]);
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.to_owned(),
            attempt,
        }),
        image: Some(ImageSpec {
            image: BUSYBOX_IMAGE.to_owned(),
            ..Default::default()
        }),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        labels,
        annotations,
        log_path: format!("{name}/{attempt}.log"),
        ..Default::default()
    }
}

/// RunPodSandbox; returns the sandbox ID and its config.
pub async fn run_pod(
    client: &mut RuntimeClient,
    name: &str,
    log_dir: &Path,
) -> Result<(String, PodSandboxConfig)> {
    let config = sandbox_config(name, log_dir);
    let id = client
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .context("RunPodSandbox")?
        .into_inner()
        .pod_sandbox_id;
    Ok((id, config))
}

/// CreateContainer + StartContainer; returns the container ID.
pub async fn start_container(
    client: &mut RuntimeClient,
    sandbox_id: &str,
    pod: &PodSandboxConfig,
    name: &str,
    command: &[&str],
) -> Result<String> {
    start(
        client,
        sandbox_id,
        pod,
        container_config(pod, name, 0, command),
    )
    .await
}

/// Gives the container its own PID namespace, so its process is PID 1 and
/// ignores signals it has no handler for (as in most application images).
pub fn own_pid_namespace(config: &mut ContainerConfig) {
    config.linux = Some(LinuxContainerConfig {
        security_context: Some(LinuxContainerSecurityContext {
            privileged: false,
            namespace_options: Some(NamespaceOption {
                network: NamespaceMode::Node as i32,
                pid: NamespaceMode::Container as i32,
                ipc: NamespaceMode::Pod as i32,
                target_id: String::new(),
            }),
        }),
    });
}

/// Bind-mounts a host directory into the container.
pub fn mount(config: &mut ContainerConfig, host: &Path, container: &str) {
    config.mounts.push(Mount {
        container_path: container.to_owned(),
        host_path: host.display().to_string(),
        readonly: false,
    });
}

/// CreateContainer + StartContainer with a prepared config.
pub async fn start(
    client: &mut RuntimeClient,
    sandbox_id: &str,
    pod: &PodSandboxConfig,
    config: ContainerConfig,
) -> Result<String> {
    let id = client
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(pod.clone()),
        })
        .await
        .context("CreateContainer")?
        .into_inner()
        .container_id;
    client
        .start_container(StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .context("StartContainer")?;
    Ok(id)
}

/// The container's CRI status; panics when the runtime has no such container.
pub async fn container_status(client: &mut RuntimeClient, id: &str) -> ContainerStatus {
    client
        .container_status(ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        })
        .await
        .expect("ContainerStatus")
        .into_inner()
        .status
        .expect("a status")
}

/// The Pod `web-0` in `namespace` on node-a, running `app` and `sidecar`,
/// and its containers as the runtime reports them: what the webhook's
/// rules (`crr::admission::admit`) judge a CRR against.
pub fn running_web_pod(
    namespace: &str,
) -> (
    k8s_openapi::api::core::v1::Pod,
    crr_proxy::crr::state::PodContainers,
) {
    use crr_proxy::crr::state::{PodContainers, RuntimeContainer};
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": namespace, "uid": "u-1"},
        "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "app"}, {"name": "sidecar"}]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "app", "containerID": "containerd://a", "ready": true, "restartCount": 0, "image": "i", "imageID": ""},
            {"name": "sidecar", "containerID": "containerd://s", "ready": true, "restartCount": 0, "image": "i", "imageID": ""}]}
    }))
    .expect("a Pod");
    let containers = PodContainers::new(
        ["app", "sidecar"]
            .map(|name| RuntimeContainer {
                id: format!("containerd://{name}"),
                name: name.into(),
                restart_count: 0,
                state: crr_proxy::cri::v1::ContainerState::ContainerRunning,
                created_at: 1,
                started_at: Some(1),
            })
            .to_vec(),
    );
    (pod, containers)
}
