//! Following one CRR to its end: each read of the CRR, its Pod and the
//! Pod's Events is compared with the one before, and what changed becomes a
//! line; at the end, the outcome and how long each step took. No I/O here.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;

use kube::ResourceExt;

use crate::crr::{ContainerRecreateRequest, Phase, UNANSWERED, labels};

/// A container of the Pod, as its status shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Container {
    id: String,
    restarts: i32,
    ready: bool,
    /// Why the previous instance ended (`lastState.terminated.reason`).
    last_reason: String,
}

/// What one read showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Seen {
    phase: String,
    states: BTreeMap<String, (String, bool, String)>,
    containers: BTreeMap<String, Container>,
    pod_ready: Option<bool>,
}

/// When `event` last happened, in Unix seconds: a repeated Event keeps
/// its first creationTimestamp and counts on in `series`.
pub fn last_seen(event: &Event) -> Option<i64> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0.as_second())
        .or(event.event_time.as_ref().map(|t| t.0.as_second()))
        .or(event
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()))
}

/// How a followed CRR ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Completed, every container recreated.
    Succeeded,
    /// Completed otherwise: the reason.
    Failed(String),
}

/// What the follower has seen so far.
#[derive(Debug, Default)]
pub struct Tracker {
    last: Seen,
    /// The containers as they were at the first read.
    before: BTreeMap<String, Container>,
    events: HashSet<String>,
    /// FailedPreStopHook notes: the container was recreated, but not
    /// gracefully, which the outcome reports.
    hook_failures: Vec<String>,
    /// Each step and when it was first seen.
    steps: Vec<(String, Duration)>,
}

impl Tracker {
    /// The lines for what changed since the last read, `at` after the
    /// start. `events` are the Pod's, those of this CRR only.
    pub fn observe(
        &mut self,
        at: Duration,
        crr: &ContainerRecreateRequest,
        pod: Option<&Pod>,
        events: &[Event],
    ) -> Vec<String> {
        let seen = see(crr, pod);
        if self.before.is_empty() {
            self.before = seen.containers.clone();
        }
        let mut lines = Vec::new();
        let mut say = |tracker: &mut Self, step: Option<String>, text: String| {
            if let Some(step) = step {
                tracker.steps.push((step, at));
            }
            lines.push(format!("{:>7.1}s  {text}", at.as_secs_f64()));
        };
        if seen.phase != self.last.phase && !seen.phase.is_empty() {
            let step = format!("CRR {}", seen.phase);
            say(self, Some(step.clone()), step);
        }
        for (name, (phase, killed, message)) in &seen.states {
            if self.last.states.get(name) == Some(&(phase.clone(), *killed, message.clone())) {
                continue;
            }
            let mut text = format!("{name}: {phase}");
            if *killed {
                text.push_str(", killed");
            }
            if !message.is_empty() {
                text.push_str(&format!(" ({message})"));
            }
            say(self, Some(format!("{name} {phase}")), text);
        }
        for event in events {
            let key = event.metadata.uid.clone().or(event.metadata.name.clone());
            if key.as_ref().is_some_and(|k| !self.events.insert(k.clone())) {
                continue;
            }
            let reason = event.reason.clone().unwrap_or_default();
            let note = event.note.clone().unwrap_or_default();
            if reason == "FailedPreStopHook" {
                self.hook_failures.push(note.clone());
            }
            say(self, None, format!("event {reason}: {note}"));
        }
        for (name, now) in &seen.containers {
            let Some(was) = self.last.containers.get(name) else {
                continue;
            };
            if now.restarts != was.restarts || now.id != was.id {
                let last = if now.last_reason.is_empty() {
                    String::new()
                } else {
                    format!(", last ended: {}", now.last_reason)
                };
                say(
                    self,
                    Some(format!("{name} restarted")),
                    format!("{name}: restarted ({} restarts{last})", now.restarts),
                );
            }
        }
        if seen.pod_ready != self.last.pod_ready
            && let Some(ready) = seen.pod_ready
        {
            let text = if ready {
                "pod: Ready"
            } else {
                "pod: not ready"
            };
            say(self, Some(text.to_owned()), text.to_owned());
        }
        self.last = seen;
        lines
    }

    /// The outcome, once the CRR is completed. A container recreated after
    /// its preStop hook failed counts as a failure: the restart was not the
    /// graceful one asked for.
    pub fn outcome(&self, crr: &ContainerRecreateRequest) -> Option<Outcome> {
        let status = crr.status.as_ref()?;
        if status.phase != Phase::Completed || status.completion_time.is_none() {
            return None;
        }
        if status.message == UNANSWERED {
            let node = crr
                .labels()
                .get(labels::NODE_NAME)
                .map_or("", String::as_str);
            return Some(Outcome::Failed(format!(
                "node {node} never took it up (is crr-proxy running there?): {UNANSWERED}"
            )));
        }
        if !status.message.is_empty() {
            return Some(Outcome::Failed(status.message.clone()));
        }
        let failed: Vec<String> = status
            .container_recreate_states
            .iter()
            .filter(|s| s.phase != Phase::Succeeded)
            .map(|s| {
                let mut text = format!("{} {}", s.name, phase_name(&s.phase));
                if !s.message.is_empty() {
                    text.push_str(&format!(": {}", s.message));
                }
                text
            })
            .chain(
                self.hook_failures
                    .iter()
                    .map(|note| format!("preStop hook failed: {note}")),
            )
            .collect();
        Some(if failed.is_empty() {
            Outcome::Succeeded
        } else {
            Outcome::Failed(failed.join("; "))
        })
    }

    /// The end: each container before and after, and when each step came.
    pub fn summary(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, after) in &self.last.containers {
            let Some(before) = self.before.get(name) else {
                continue;
            };
            if before == after {
                continue;
            }
            lines.push(format!(
                "{name}: {} -> {}, restarts {} -> {}{}",
                short(&before.id),
                short(&after.id),
                before.restarts,
                after.restarts,
                if after.last_reason.is_empty() {
                    String::new()
                } else {
                    format!(", last ended: {}", after.last_reason)
                }
            ));
        }
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|(step, at)| format!("{step} {:.1}s", at.as_secs_f64()))
            .collect();
        if !steps.is_empty() {
            lines.push(format!("steps: {}", steps.join(", ")));
        }
        lines
    }
}

fn see(crr: &ContainerRecreateRequest, pod: Option<&Pod>) -> Seen {
    let status = crr.status.clone().unwrap_or_default();
    let states = status
        .container_recreate_states
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                (phase_name(&s.phase), s.is_killed, s.message.clone()),
            )
        })
        .collect();
    let wanted: Vec<&str> = crr
        .spec
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let pod_status = pod.and_then(|p| p.status.clone()).unwrap_or_default();
    let containers = crate::restart_rules::container_statuses(&pod_status)
        .filter(|c| wanted.contains(&c.name.as_str()))
        .map(|c| {
            let last_reason = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.reason.clone())
                .unwrap_or_default();
            let container = Container {
                id: c.container_id.clone().unwrap_or_default(),
                restarts: c.restart_count,
                ready: c.ready,
                last_reason,
            };
            (c.name.clone(), container)
        })
        .collect();
    let pod_ready = pod.map(|_| {
        pod_status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    });
    Seen {
        phase: phase_name(&status.phase),
        states,
        containers,
        pod_ready,
    }
}

fn phase_name(phase: &Phase) -> String {
    match serde_json::to_value(phase) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

/// A container ID without its runtime prefix, cut to 13 characters.
fn short(id: &str) -> String {
    let id = id.split_once("://").map_or(id, |(_, id)| id);
    id.chars().take(13).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn crr(status: serde_json::Value) -> ContainerRecreateRequest {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "web-0-restart-x", "namespace": "shop"},
            "spec": {"podName": "web-0", "containers": [{"name": "app"}]},
            "status": status,
        }))
        .unwrap()
    }

    fn pod(id: &str, restarts: i32, ready: bool, last: Option<&str>) -> Pod {
        let last = last.map_or(
            json!({}),
            |r| json!({"terminated": {"reason": r, "exitCode": 0}}),
        );
        serde_json::from_value(json!({
            "metadata": {"name": "web-0"},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{"name": "app", "containerID": id, "restartCount": restarts,
                    "ready": ready, "image": "i", "imageID": "i", "lastState": last}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn each_change_is_a_line_and_the_end_a_summary() {
        let mut tracker = Tracker::default();
        let s = Duration::from_secs;
        let first = tracker.observe(
            s(0),
            &crr(json!({"phase": ""})),
            Some(&pod("containerd://aaaaaaaaaaaaaaaa", 0, true, None)),
            &[],
        );
        assert_eq!(first, ["    0.0s  pod: Ready"]);
        let killing: Event = serde_json::from_value(json!({
            "metadata": {"name": "e1"}, "eventTime": null, "reason": "Killing",
            "note": "Stopping container app by ContainerRecreateRequest web-0-restart-x",
        }))
        .unwrap();
        let recreating = crr(json!({"phase": "Recreating",
            "containerRecreateStates": [{"name": "app", "phase": "Recreating"}]}));
        let lines = tracker.observe(
            s(1),
            &recreating,
            Some(&pod("containerd://aaaaaaaaaaaaaaaa", 0, true, None)),
            std::slice::from_ref(&killing),
        );
        assert_eq!(
            lines,
            [
                "    1.0s  CRR Recreating",
                "    1.0s  app: Recreating",
                "    1.0s  event Killing: Stopping container app by ContainerRecreateRequest web-0-restart-x",
            ]
        );
        // The same event again is not shown again.
        let done = crr(
            json!({"phase": "Completed", "completionTime": "2026-12-01T00:00:00Z",
            "containerRecreateStates": [{"name": "app", "phase": "Succeeded", "isKilled": true}]}),
        );
        let lines = tracker.observe(
            s(3),
            &done,
            Some(&pod(
                "containerd://bbbbbbbbbbbbbbbb",
                1,
                true,
                Some("ContainerRecreateRequest"),
            )),
            &[killing],
        );
        assert_eq!(
            lines,
            [
                "    3.0s  CRR Completed",
                "    3.0s  app: Succeeded, killed",
                "    3.0s  app: restarted (1 restarts, last ended: ContainerRecreateRequest)",
            ]
        );
        assert_eq!(tracker.outcome(&done), Some(Outcome::Succeeded));
        assert_eq!(
            tracker.summary(),
            [
                "app: aaaaaaaaaaaaa -> bbbbbbbbbbbbb, restarts 0 -> 1, last ended: ContainerRecreateRequest",
                "steps: pod: Ready 0.0s, CRR Recreating 1.0s, app Recreating 1.0s, CRR Completed 3.0s, app Succeeded 3.0s, app restarted 3.0s",
            ]
        );
    }

    #[test]
    fn a_completion_with_a_message_a_failed_container_or_hook_is_a_failure() {
        let tracker = Tracker::default();
        assert_eq!(tracker.outcome(&crr(json!({"phase": "Recreating"}))), None);
        let refused = crr(
            json!({"phase": "Completed", "completionTime": "2026-12-01T00:00:00Z",
            "message": "pod has gone"}),
        );
        assert_eq!(
            tracker.outcome(&refused),
            Some(Outcome::Failed("pod has gone".into()))
        );
        let failed = crr(
            json!({"phase": "Completed", "completionTime": "2026-12-01T00:00:00Z",
            "containerRecreateStates": [{"name": "app", "phase": "Failed", "message": "preStop failed"}]}),
        );
        assert_eq!(
            tracker.outcome(&failed),
            Some(Outcome::Failed("app Failed: preStop failed".into()))
        );
        let mut tracker = Tracker::default();
        let hook: Event = serde_json::from_value(json!({
            "metadata": {"name": "e2"}, "eventTime": null, "reason": "FailedPreStopHook",
            "note": "exit 3",
        }))
        .unwrap();
        let done = crr(
            json!({"phase": "Completed", "completionTime": "2026-12-01T00:00:00Z",
            "containerRecreateStates": [{"name": "app", "phase": "Succeeded", "isKilled": true}]}),
        );
        tracker.observe(Duration::ZERO, &done, None, &[hook]);
        assert_eq!(
            tracker.outcome(&done),
            Some(Outcome::Failed("preStop hook failed: exit 3".into()))
        );
    }

    #[test]
    fn a_crr_no_node_took_up_fails_naming_the_node() {
        let mut unanswered = crr(
            json!({"phase": "Completed", "completionTime": "2026-12-01T00:00:00Z",
            "message": UNANSWERED}),
        );
        unanswered
            .labels_mut()
            .insert(labels::NODE_NAME.into(), "node-7".into());
        assert_eq!(
            Tracker::default().outcome(&unanswered),
            Some(Outcome::Failed(
                "node node-7 never took it up (is crr-proxy running there?): daemon has not responded for a long time".into()
            ))
        );
    }
}
