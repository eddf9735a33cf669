//! What kubelet wrote on a container, read back from CRI ContainerStatus.

use k8s_openapi::api::core::v1::{ContainerPort, LifecycleHandler};
use tracing::warn;

use crate::cri::v1::{ContainerState, ContainerStatus};

/// CRI label and annotation keys kubelet writes on every container.
pub mod keys {
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    pub const DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
    pub const TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
    pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
    pub const PORTS: &str = "io.kubernetes.container.ports";
}

/// One container as the runtime reports it, with kubelet's metadata parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub id: String,
    pub name: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub restart_count: u32,
    pub deletion_grace_period: Option<i64>,
    pub termination_grace_period: Option<i64>,
    pub pre_stop: Option<LifecycleHandler>,
    pub ports: Vec<ContainerPort>,
    pub state: ContainerState,
}

// === impl Target ===

impl Target {
    /// Reads labels and annotations the way kubelet restores a container
    /// spec: a malformed annotation is logged and treated as absent.
    pub fn from_status(status: &ContainerStatus) -> Self {
        let label = |key: &str| status.labels.get(key).cloned().unwrap_or_default();
        let annotation = |key: &str| status.annotations.get(key).map(String::as_str);
        let name = match label(keys::CONTAINER_NAME) {
            name if name.is_empty() => status
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            name => name,
        };
        let id = status.id.clone();
        let parse_int = |key: &str| -> Option<i64> {
            let raw = annotation(key)?;
            match raw.trim().parse() {
                Ok(value) => Some(value),
                Err(_) => {
                    warn!(container = %id, key, value = raw, "ignoring a malformed annotation");
                    None
                }
            }
        };
        let restart_count = parse_int(keys::RESTART_COUNT)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        let pre_stop = annotation(keys::PRE_STOP_HANDLER).and_then(|raw| {
            serde_json::from_str::<LifecycleHandler>(raw)
                .inspect_err(|error| warn!(container = %id, %error, "ignoring a malformed preStopHandler annotation"))
                .ok()
        });
        let ports = annotation(keys::PORTS)
            .and_then(|raw| {
                serde_json::from_str::<Vec<ContainerPort>>(raw)
                    .inspect_err(|error| warn!(container = %id, %error, "ignoring a malformed ports annotation"))
                    .ok()
            })
            .unwrap_or_default();
        Self {
            id: status.id.clone(),
            name,
            pod_name: label(keys::POD_NAME),
            pod_namespace: label(keys::POD_NAMESPACE),
            pod_uid: label(keys::POD_UID),
            restart_count,
            deletion_grace_period: parse_int(keys::DELETION_GRACE_PERIOD),
            termination_grace_period: parse_int(keys::TERMINATION_GRACE_PERIOD),
            pre_stop,
            ports,
            state: status.state(),
        }
    }

    /// The Pod as kubelet names it in messages: `name_namespace(uid)`.
    pub fn pod_display(&self) -> String {
        format!("{}_{}({})", self.pod_name, self.pod_namespace, self.pod_uid)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use crate::cri::v1::ContainerMetadata;

    fn status(annotations: &[(&str, &str)]) -> ContainerStatus {
        ContainerStatus {
            id: "abc".into(),
            metadata: Some(ContainerMetadata {
                name: "meta-name".into(),
                attempt: 3,
            }),
            state: ContainerState::ContainerRunning as i32,
            labels: HashMap::from([
                (keys::POD_NAME.into(), "web-0".into()),
                (keys::POD_NAMESPACE.into(), "shop".into()),
                (keys::POD_UID.into(), "u1".into()),
                (keys::CONTAINER_NAME.into(), "app".into()),
            ]),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn reads_kubelets_labels_and_annotations() {
        let target = Target::from_status(&status(&[
            (keys::RESTART_COUNT, "3"),
            (keys::TERMINATION_GRACE_PERIOD, "45"),
            (keys::DELETION_GRACE_PERIOD, "5"),
            (
                keys::PRE_STOP_HANDLER,
                r#"{"httpGet":{"path":"/quit","port":"http","scheme":"HTTP"}}"#,
            ),
            (
                keys::PORTS,
                r#"[{"name":"http","containerPort":8080,"protocol":"TCP"}]"#,
            ),
        ]));
        assert_eq!(target.name, "app");
        assert_eq!(target.pod_display(), "web-0_shop(u1)");
        assert_eq!(target.restart_count, 3);
        assert_eq!(target.termination_grace_period, Some(45));
        assert_eq!(target.deletion_grace_period, Some(5));
        let http = target.pre_stop.unwrap().http_get.unwrap();
        assert_eq!(http.port, IntOrString::String("http".into()));
        assert_eq!(target.ports[0].container_port, 8080);
        assert_eq!(target.state, ContainerState::ContainerRunning);
    }

    #[test]
    fn malformed_annotations_count_as_absent() {
        let target = Target::from_status(&status(&[
            (keys::RESTART_COUNT, "-1"),
            (keys::TERMINATION_GRACE_PERIOD, "thirty"),
            (keys::PRE_STOP_HANDLER, "{not json"),
            (keys::PORTS, r#"{"name":"x"}"#),
        ]));
        assert_eq!(target.restart_count, 0);
        assert_eq!(target.termination_grace_period, None);
        assert_eq!(target.pre_stop, None);
        assert!(target.ports.is_empty());
    }

    #[test]
    fn sleep_handlers_are_kept() {
        let target = Target::from_status(&status(&[(
            keys::PRE_STOP_HANDLER,
            r#"{"sleep":{"seconds":7}}"#,
        )]));
        assert_eq!(target.pre_stop.unwrap().sleep.unwrap().seconds, 7);
    }

    #[test]
    fn falls_back_to_metadata_name_without_the_label() {
        let mut s = status(&[]);
        s.labels.remove(keys::CONTAINER_NAME);
        assert_eq!(Target::from_status(&s).name, "meta-name");
    }
}
