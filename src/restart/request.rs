//! What `restart` asks for, checked against the Pod before anything is
//! created: bad input gets a clear error and no CRR.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::crr::{
    ContainerRecreateRequestContainer, ContainerRecreateRequestSpec,
    ContainerRecreateRequestStrategy, FailurePolicy,
};

/// The label on every CRR the tool creates, so that it can find its own.
pub const CREATED_BY: &str = "crr-proxy.io/created-by";
pub const TOOL: &str = "kubectl-crr";

/// One Pod's restart, as the command line gives it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    pub pod: String,
    pub containers: Vec<String>,
    pub ordered: bool,
    pub force: bool,
    pub min_started: Option<Duration>,
    pub unready_grace: Option<Duration>,
    pub deadline: Option<Duration>,
    pub ttl: Option<Duration>,
    pub failure_policy: Option<FailurePolicy>,
}

/// `len` characters of the API server's `generateName` alphabet (no
/// vowels, no look-alikes), from `seed`.
pub fn suffix(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let base = ALPHABET.len() as u64;
    let mut n = seed;
    (0..len)
        .map(|_| {
            let c = ALPHABET[usize::try_from(n % base).unwrap_or(0)] as char;
            n /= base;
            c
        })
        .collect()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("name at least one container (-c app[,sidecar])")]
    NoContainer,
    #[error("container {0} is named twice")]
    Twice(String),
    #[error("--{flag} must be whole seconds, got {given:?}")]
    NotWholeSeconds { flag: &'static str, given: Duration },
    #[error("--deadline must be at least 3s (as OpenKruise's webhook requires)")]
    DeadlineTooShort,
    #[error("pod {pod} has no container {container} (it has: {has})")]
    NoSuchContainer {
        pod: String,
        container: String,
        has: String,
    },
    #[error("pod {0} is finished or being deleted: there is nothing to restart")]
    Inactive(String),
    #[error("pod {0} is not scheduled to a node yet")]
    Pending(String),
}

impl Request {
    /// The CRR to create for `pod` (read just before), named `name`.
    pub fn crr(&self, pod: &Pod, api_version: &str, name: &str) -> Result<Value, RequestError> {
        let spec = self.spec()?;
        self.check_pod(pod)?;
        Ok(json!({
            "apiVersion": api_version,
            "kind": "ContainerRecreateRequest",
            "metadata": {"name": name, "labels": {CREATED_BY: TOOL}},
            "spec": spec,
        }))
    }

    /// `<pod>-restart-` and five characters of the API server's own
    /// `generateName` alphabet. The tool names the CRR itself so that it can
    /// watch it before it exists and miss none of its changes.
    pub fn name(&self, seed: u64) -> String {
        format!("{}-restart-{}", self.pod, suffix(seed, 5))
    }

    fn spec(&self) -> Result<ContainerRecreateRequestSpec, RequestError> {
        if self.containers.is_empty() {
            return Err(RequestError::NoContainer);
        }
        for (i, name) in self.containers.iter().enumerate() {
            if self.containers[..i].contains(name) {
                return Err(RequestError::Twice(name.clone()));
            }
        }
        let deadline = seconds("deadline", self.deadline)?;
        if deadline.is_some_and(|d| d < 3) {
            return Err(RequestError::DeadlineTooShort);
        }
        let min_started = seconds("min-started", self.min_started)?.unwrap_or(0);
        Ok(ContainerRecreateRequestSpec {
            pod_name: self.pod.clone(),
            containers: self
                .containers
                .iter()
                .map(|name| ContainerRecreateRequestContainer {
                    name: name.clone(),
                    ..Default::default()
                })
                .collect(),
            strategy: Some(ContainerRecreateRequestStrategy {
                failure_policy: self.failure_policy.clone(),
                ordered_recreate: self.ordered,
                force_recreate: self.force,
                unready_grace_period_seconds: seconds("unready-grace", self.unready_grace)?,
                min_started_seconds: i32::try_from(min_started).unwrap_or(i32::MAX),
                ..Default::default()
            }),
            active_deadline_seconds: deadline,
            ttl_seconds_after_finished: seconds("ttl", self.ttl)?
                .map(|t| i32::try_from(t).unwrap_or(i32::MAX)),
        })
    }

    /// What can be told from the Pod alone: each container exists, and
    /// the Pod runs.
    fn check_pod(&self, pod: &Pod) -> Result<(), RequestError> {
        let spec = pod.spec.clone().unwrap_or_default();
        // Regular containers and native sidecars; other init containers
        // have ended.
        let sidecars = spec.init_containers.iter().flatten();
        let names: Vec<&str> = sidecars
            .filter(|c| crate::restart_rules::is_sidecar(c))
            .chain(&spec.containers)
            .map(|c| c.name.as_str())
            .collect();
        for container in &self.containers {
            if !names.contains(&container.as_str()) {
                return Err(RequestError::NoSuchContainer {
                    pod: self.pod.clone(),
                    container: container.clone(),
                    has: names.join(", "),
                });
            }
        }
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if finished || pod.metadata.deletion_timestamp.is_some() {
            return Err(RequestError::Inactive(self.pod.clone()));
        }
        if spec.node_name.as_deref().unwrap_or_default().is_empty() {
            return Err(RequestError::Pending(self.pod.clone()));
        }
        Ok(())
    }
}

/// `given` in whole seconds.
fn seconds(flag: &'static str, given: Option<Duration>) -> Result<Option<i64>, RequestError> {
    match given {
        None => Ok(None),
        Some(d) if d.subsec_nanos() != 0 => Err(RequestError::NotWholeSeconds { flag, given: d }),
        Some(d) => Ok(Some(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "app"}, {"name": "sidecar"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    fn request(containers: &[&str]) -> Request {
        Request {
            pod: "web-0".into(),
            containers: containers.iter().map(|c| (*c).to_owned()).collect(),
            ..Request::default()
        }
    }

    #[test]
    fn flags_become_the_crr_spec() {
        let request = Request {
            ordered: true,
            force: true,
            min_started: Some(Duration::from_secs(5)),
            unready_grace: Some(Duration::from_secs(3)),
            deadline: Some(Duration::from_secs(300)),
            ttl: Some(Duration::from_secs(600)),
            failure_policy: Some(FailurePolicy::Ignore),
            ..request(&["app", "sidecar"])
        };
        let crr = request
            .crr(&pod(), "apps.kruise.io/v1beta1", "web-0-restart-b2x4z")
            .unwrap();
        assert_eq!(
            crr,
            json!({
                "apiVersion": "apps.kruise.io/v1beta1",
                "kind": "ContainerRecreateRequest",
                "metadata": {"name": "web-0-restart-b2x4z", "labels": {CREATED_BY: TOOL}},
                "spec": {
                    "podName": "web-0",
                    "containers": [{"name": "app"}, {"name": "sidecar"}],
                    "strategy": {
                        "failurePolicy": "Ignore",
                        "orderedRecreate": true,
                        "forceRecreate": true,
                        "unreadyGracePeriodSeconds": 3,
                        "minStartedSeconds": 5,
                    },
                    "activeDeadlineSeconds": 300,
                    "ttlSecondsAfterFinished": 600,
                },
            })
        );
    }

    #[test]
    fn names_are_the_pods_with_five_characters_that_vary() {
        let request = request(&["app"]);
        let a = request.name(0);
        assert_eq!(a, "web-0-restart-bbbbb");
        assert_ne!(request.name(1), a);
        assert_ne!(request.name(27), request.name(0));
        assert_eq!(request.name(u64::MAX).len(), a.len());
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_created() {
        let pod = pod();
        let refused = |request: Request| request.crr(&pod, "v", "n").unwrap_err().to_string();
        assert_eq!(
            refused(request(&[])),
            "name at least one container (-c app[,sidecar])"
        );
        assert_eq!(
            refused(request(&["app", "app"])),
            "container app is named twice"
        );
        assert_eq!(
            refused(request(&["db"])),
            "pod web-0 has no container db (it has: app, sidecar)"
        );
        assert_eq!(
            refused(Request {
                deadline: Some(Duration::from_secs(2)),
                ..request(&["app"])
            }),
            "--deadline must be at least 3s (as OpenKruise's webhook requires)"
        );
        assert!(
            refused(Request {
                min_started: Some(Duration::from_millis(1500)),
                ..request(&["app"])
            })
            .starts_with("--min-started must be whole seconds")
        );
        let mut pending = pod.clone();
        pending.spec.as_mut().unwrap().node_name = None;
        assert_eq!(
            request(&["app"]).crr(&pending, "v", "n").unwrap_err(),
            RequestError::Pending("web-0".into())
        );
        let mut done = pod.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(
            request(&["app"]).crr(&done, "v", "n").unwrap_err(),
            RequestError::Inactive("web-0".into())
        );
    }
}
