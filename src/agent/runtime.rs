//! The agent's reads of the container runtime (CRI): its name, and a
//! Pod's containers as kubelet's GetPodStatus reads them. Each read is
//! bounded, so that a runtime that does not answer fails the sync instead
//! of holding the Pod's work.

use std::collections::HashMap;
use std::time::Duration;

use super::error::AgentError;
use crate::cri::RuntimeClient;
use crate::cri::v1::{
    Container, ContainerFilter, ContainerState, ContainerStatusRequest, ListContainersRequest,
    VersionRequest,
};
use crate::crr::state::{PodContainers, RuntimeContainer};
use crate::kill;

pub(crate) struct Runtime {
    cri: RuntimeClient,
    name: tokio::sync::OnceCell<String>,
}

impl Runtime {
    pub(crate) fn new(cri: RuntimeClient) -> Self {
        Self {
            cri,
            name: tokio::sync::OnceCell::new(),
        }
    }

    /// The runtime's name (`containerd`), as in containerIDs' prefix.
    pub(crate) async fn name(&self) -> Result<&str, AgentError> {
        let name = self
            .name
            .get_or_try_init(|| async {
                let mut cri = self.cri.clone();
                let version = bounded("Version", cri.version(VersionRequest::default())).await?;
                Ok::<_, AgentError>(version.into_inner().runtime_name)
            })
            .await?;
        Ok(name.as_str())
    }

    /// The newest container of each name of the Pod on this node (any
    /// state), read as kubelet's GetPodStatus reads them.
    pub(crate) async fn pod_containers(
        &self,
        pod_uid: &str,
        runtime: &str,
    ) -> Result<PodContainers, AgentError> {
        let mut cri = self.cri.clone();
        let request = ListContainersRequest {
            filter: Some(ContainerFilter {
                label_selector: HashMap::from([(
                    kill::keys::POD_UID.to_owned(),
                    pod_uid.to_owned(),
                )]),
                ..Default::default()
            }),
        };
        let listed = bounded("ListContainers", cri.list_containers(request))
            .await?
            .into_inner()
            .containers;
        // Only the newest container of each name is ever decided on; the
        // dead ones kubelet has not yet collected (one a minute, and none
        // while it backs off) need no status read. The reads go together.
        let mut newest: HashMap<&str, &Container> = HashMap::new();
        for container in &listed {
            let name = container
                .labels
                .get(kill::keys::CONTAINER_NAME)
                .map_or("", String::as_str);
            let entry = newest.entry(name).or_insert(container);
            if container.created_at > entry.created_at {
                *entry = container;
            }
        }
        let reads = newest.into_values().map(|container| {
            let mut cri = cri.clone();
            let request = ContainerStatusRequest {
                container_id: container.id.clone(),
                verbose: false,
            };
            async move {
                let status = bounded("ContainerStatus", cri.container_status(request))
                    .await?
                    .into_inner()
                    .status
                    .unwrap_or_default();
                let state = status.state();
                Ok::<_, AgentError>(RuntimeContainer {
                    id: format!("{runtime}://{}", status.id),
                    name: status
                        .labels
                        .get(kill::keys::CONTAINER_NAME)
                        .cloned()
                        .unwrap_or_default(),
                    restart_count: status
                        .annotations
                        .get(kill::keys::RESTART_COUNT)
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0),
                    state,
                    created_at: status.created_at,
                    started_at: (state != ContainerState::ContainerCreated)
                        .then_some(status.started_at),
                })
            }
        });
        let containers = futures_util::future::try_join_all(reads).await?;
        Ok(PodContainers::new(containers))
    }
}

/// How long the agent waits for a CRI read; a call that takes longer fails
/// the sync, which is retried with its back-off, instead of holding the
/// Pod's work (and, for Version, every Pod's) for good.
const CRI_TIMEOUT: Duration = Duration::from_secs(10);

/// `call`'s answer within [`CRI_TIMEOUT`].
async fn bounded<T>(
    call: &'static str,
    answer: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, AgentError> {
    match tokio::time::timeout(CRI_TIMEOUT, answer).await {
        Ok(answer) => answer.map_err(|status| AgentError::Runtime { call, status }),
        Err(_) => Err(AgentError::Runtime {
            call,
            status: tonic::Status::deadline_exceeded(format!("no answer in {CRI_TIMEOUT:?}")),
        }),
    }
}
