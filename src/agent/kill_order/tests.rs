use std::time::Duration;

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::json;

use super::*;
use crate::kill::{GraceSource, HookKind, HookReport};

/// A CRR for Pod `web` as the webhook writes it: container `app` with an
/// exec preStop and a named port, `log` with the `{}` of a sleep-only one.
fn crr() -> ContainerRecreateRequest {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "ContainerRecreateRequest",
        "metadata": {"name": "again", "namespace": "shop", "labels": {labels::POD_UID: "u-1"}},
        "spec": {
            "podName": "web",
            "containers": [
                {"name": "app", "preStop": {"exec": {"command": ["drain"]}},
                 "ports": [{"name": "http", "containerPort": 8080}]},
                {"name": "log", "preStop": {}},
            ],
            "strategy": {"terminationGracePeriodSeconds": 7},
        },
    }))
    .unwrap()
}

/// A Pod whose `log` is a native sidecar.
fn pod_with_sidecar() -> PodSpec {
    serde_json::from_value(json!({
        "initContainers": [{"name": "log", "image": "i", "restartPolicy": "Always"}],
        "containers": [{"name": "app", "image": "i"}],
    }))
    .unwrap()
}

#[test]
fn the_request_carries_the_webhooks_prestop_ports_and_grace() {
    let order = kill_order(&crr(), "app", None, false);
    let request = &order.request;
    let exec = request.pre_stop.as_ref().and_then(|h| h.exec.as_ref());
    assert_eq!(
        exec.and_then(|e| e.command.clone()),
        Some(vec!["drain".to_owned()])
    );
    assert_eq!(request.ports.as_ref().map(Vec::len), Some(1));
    assert_eq!(request.grace_period, Some(7));
    assert!(!request.skip_pre_stop);
    assert!(request.on_stopping.is_none());
    assert_eq!(
        order.message,
        "Stopping container app by ContainerRecreateRequest again"
    );
    assert_eq!(request.message.as_deref(), Some(order.message.as_str()));
}

#[test]
fn a_sleep_only_prestop_copied_as_empty_is_none_and_a_resumed_kill_skips_it() {
    let order = kill_order(&crr(), "log", None, true);
    assert!(order.request.pre_stop.is_none(), "{order:?}");
    assert!(order.request.ports.is_none());
    assert!(order.request.skip_pre_stop);
}

#[test]
fn events_name_a_sidecar_by_its_place_among_the_init_containers() {
    let pod = pod_with_sidecar();
    let sidecar = kill_order(&crr(), "log", Some(&pod), false).reference;
    assert_eq!(
        sidecar.field_path.as_deref(),
        Some("spec.initContainers{log}")
    );
    let regular = kill_order(&crr(), "app", Some(&pod), false).reference;
    assert_eq!(regular.field_path.as_deref(), Some("spec.containers{app}"));
    assert_eq!(regular.kind.as_deref(), Some("Pod"));
    assert_eq!(regular.name.as_deref(), Some("web"));
    assert_eq!(regular.namespace.as_deref(), Some("shop"));
    assert_eq!(regular.uid.as_deref(), Some("u-1"));
    // Without the Pod's spec, a name is taken as a regular container's.
    let unread = kill_order(&crr(), "log", None, false).reference;
    assert_eq!(unread.field_path.as_deref(), Some("spec.containers{log}"));
}

#[test]
fn runtime_ids_are_read_from_the_status_form() {
    assert_eq!(runtime_id("containerd://abc"), Some("abc"));
    assert_eq!(runtime_id("abc"), None);
    assert_eq!(runtime_id("containerd://"), Some(""));
}

fn outcome(hook: Option<HookResult>, fallback: bool, exit_code: i32) -> KillOutcome {
    KillOutcome {
        container_id: "abc".into(),
        target: None,
        message: String::new(),
        grace_period: 7,
        grace_source: GraceSource::Request,
        hook: hook.map(|result| HookReport {
            kind: HookKind::Exec,
            result,
            seconds: 1,
            took: Duration::from_secs(1),
            http_fallback: fallback,
        }),
        stop_timeout: Some(6),
        after: StateAfter::Exited {
            exit_code,
            reason: "Error".into(),
            finished_at: 0,
        },
    }
}

#[test]
fn after_the_kill_events_tell_a_failed_hook_by_name_a_fallback_and_a_reported_code() {
    let failed = HookResult::Failed("exec in abc: exit 1".into());
    let told = told_after(&outcome(Some(failed), true, 0), "abc", "app", None);
    assert_eq!(
        told,
        vec![
            Told {
                kind: EventType::Warning,
                reason: "FailedPreStopHook",
                note: "exec in app: exit 1".into(),
            },
            Told {
                kind: EventType::Warning,
                reason: "LifecycleHTTPFallback",
                note: "HTTP lifecycle hook for preStop fell back to HTTP: the server answered HTTPS in plain HTTP".into(),
            },
        ]
    );
    // No code restarts it, and 0 is reported for 137.
    let rewrite = Rewrite::from_word(&format!("0:{}", "0".repeat(64))).unwrap();
    let told = told_after(
        &outcome(Some(HookResult::Succeeded), false, 137),
        "abc",
        "app",
        Some(rewrite),
    );
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].reason, "ExitCodeReported");
    assert_eq!(
        told[0].note,
        "Container app exited with code 137, which its restart policy does not restart; kubelet is told 0"
    );
    // The code already reported, or no hook and no rule: nothing to tell.
    assert!(told_after(&outcome(None, false, 0), "abc", "app", Some(rewrite)).is_empty());
    assert!(told_after(&outcome(None, false, 137), "abc", "app", None).is_empty());
}
