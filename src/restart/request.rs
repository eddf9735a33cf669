//! What `restart` asks for, checked against the Pod before anything is
//! created: bad input gets a clear error and no CRR.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::crr::{
    ContainerRecreateRequestContainer, ContainerRecreateRequestSpec,
    ContainerRecreateRequestStrategy, FailurePolicy,
};

/// The Pod annotation that names the container a command means when it
/// names none (kubectl's, KEP-2227).
pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

/// The label on every CRR the tool creates, so that it can find its own.
pub const CREATED_BY: &str = "crr-proxy.io/created-by";
pub const TOOL: &str = "kubectl-crr";

/// One Pod's restart, as the command line gives it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Request {
    pub pod: String,
    /// Empty: the Pod's default container (see [`Request::containers_for`]).
    pub containers: Vec<String>,
    pub ordered: bool,
    pub force: bool,
    pub min_started: Option<Duration>,
    pub unready_grace: Option<Duration>,
    pub deadline: Option<Duration>,
    pub ttl: Option<Duration>,
    pub failure_policy: Option<FailurePolicy>,
}

/// A changing seed for the CRR's name: the clock and the process.
pub fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    u64::try_from(nanos % u128::from(u64::MAX)).unwrap_or(0) ^ u64::from(std::process::id()) << 32
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
    #[error(
        "pod {pod} has containers {has} and no {DEFAULT_CONTAINER} annotation: name the ones to restart with -c"
    )]
    NoDefaultContainer { pod: String, has: String },
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
        let containers = self.containers_for(pod)?;
        let spec = self.spec(&containers)?;
        self.check_pod(pod, &containers)?;
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

    /// The containers named, or else the Pod's default container, as kubectl
    /// picks it: the one its `kubectl.kubernetes.io/default-container`
    /// annotation names, or its only regular container. Where kubectl would take the
    /// first of several and say so, a restart is refused instead: it stops a
    /// container, and a guess is no way to choose which.
    pub fn containers_for(&self, pod: &Pod) -> Result<Vec<String>, RequestError> {
        if !self.containers.is_empty() {
            return Ok(self.containers.clone());
        }
        let names = restartable(pod);
        if let Some(name) = annotated_default(pod, &names) {
            return Ok(vec![name.to_owned()]);
        }
        let regular = pod
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or_default();
        // Native sidecars do not count: a Pod of one container and its
        // sidecars defaults to that container, as kubectl's does.
        match regular {
            [only] => Ok(vec![only.name.clone()]),
            _ => Err(RequestError::NoDefaultContainer {
                pod: self.pod.clone(),
                has: names.join(", "),
            }),
        }
    }

    /// kubectl's notice when it defaulted to one container of several (here:
    /// the only regular container beside native sidecars); as kubectl's,
    /// none when the annotation chose.
    pub fn defaulted_notice(&self, pod: &Pod) -> Option<String> {
        let names = restartable(pod);
        let chosen = self.containers_for(pod).ok()?;
        let guessed = self.containers.is_empty() && annotated_default(pod, &names).is_none();
        (guessed && names.len() > 1).then(|| {
            format!(
                "Defaulted container {:?} out of: {}",
                chosen.join(","),
                names.join(", ")
            )
        })
    }

    fn spec(&self, containers: &[String]) -> Result<ContainerRecreateRequestSpec, RequestError> {
        for (i, name) in containers.iter().enumerate() {
            if containers[..i].contains(name) {
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
            containers: containers
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
    fn check_pod(&self, pod: &Pod, containers: &[String]) -> Result<(), RequestError> {
        let names = restartable(pod);
        for container in containers {
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
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if node.unwrap_or_default().is_empty() {
            return Err(RequestError::Pending(self.pod.clone()));
        }
        Ok(())
    }
}

/// The container the Pod's default-container annotation names, if it is
/// one of `names`.
fn annotated_default<'p>(pod: &'p Pod, names: &[&str]) -> Option<&'p str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(DEFAULT_CONTAINER)
        .map(String::as_str)
        .filter(|name| names.contains(name))
}

/// The names of the containers a CRR can restart: native sidecars and
/// regular containers (other init containers have ended).
fn restartable(pod: &Pod) -> Vec<&str> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec.init_containers.iter().flatten();
    sidecars
        .filter(|c| crate::restart_rules::is_sidecar(c))
        .chain(&spec.containers)
        .map(|c| c.name.as_str())
        .collect()
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
            "pod web-0 has containers app, sidecar and no \
             kubectl.kubernetes.io/default-container annotation: name the ones to restart with -c"
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

    /// A Pod of the given regular containers, native sidecars and
    /// default-container annotation.
    fn pod_of(containers: &[&str], sidecars: &[&str], default: Option<&str>) -> Pod {
        let named = |n: &&str| json!({"name": n});
        let sidecar = |n: &&str| json!({"name": n, "restartPolicy": "Always"});
        let mut pod = json!({
            "metadata": {"name": "web-0"},
            "spec": {"nodeName": "node-a",
                     "containers": containers.iter().map(named).collect::<Vec<_>>(),
                     "initContainers": sidecars.iter().map(sidecar).chain([json!({"name": "setup"})])
                         .collect::<Vec<_>>()},
            "status": {"phase": "Running"},
        });
        if let Some(default) = default {
            pod["metadata"]["annotations"] = json!({DEFAULT_CONTAINER: default});
        }
        serde_json::from_value(pod).unwrap()
    }

    fn defaulted(pod: &Pod) -> Result<Vec<String>, RequestError> {
        let crr = request(&[]).crr(pod, "v", "n")?;
        Ok(crr["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect())
    }

    #[test]
    fn without_a_container_named_the_pods_default_container_is_restarted() {
        // The only container, with or without native sidecars beside it.
        assert_eq!(defaulted(&pod_of(&["app"], &[], None)).unwrap(), ["app"]);
        assert_eq!(
            defaulted(&pod_of(&["app"], &["mesh"], None)).unwrap(),
            ["app"]
        );
        // The annotation wins, and may name a sidecar.
        assert_eq!(
            defaulted(&pod_of(&["app", "log"], &[], Some("log"))).unwrap(),
            ["log"]
        );
        assert_eq!(
            defaulted(&pod_of(&["app"], &["mesh"], Some("mesh"))).unwrap(),
            ["mesh"]
        );
        // Several and no annotation (or one naming no such container, or
        // an ended init container): refused, not guessed.
        for pod in [
            pod_of(&["app", "log"], &[], None),
            pod_of(&["app", "log"], &[], Some("gone")),
            pod_of(&["app", "log"], &[], Some("setup")),
        ] {
            assert_eq!(
                defaulted(&pod).unwrap_err(),
                RequestError::NoDefaultContainer {
                    pod: "web-0".into(),
                    has: "app, log".into()
                }
            );
        }
        assert_eq!(
            request(&[])
                .defaulted_notice(&pod_of(&["app"], &["mesh"], None))
                .unwrap(),
            "Defaulted container \"app\" out of: mesh, app"
        );
        assert_eq!(
            request(&[]).defaulted_notice(&pod_of(&["app"], &[], None)),
            None
        );
        assert_eq!(
            request(&[]).defaulted_notice(&pod_of(&["app", "log"], &[], Some("log"))),
            None
        );
        assert_eq!(
            request(&["app"]).defaulted_notice(&pod_of(&["app"], &["mesh"], None)),
            None
        );
        // Named containers are taken as named, annotation or not.
        let named = request(&["app"]).crr(&pod_of(&["app", "log"], &[], Some("log")), "v", "n");
        assert_eq!(named.unwrap()["spec"]["containers"][0]["name"], "app");
    }
}
