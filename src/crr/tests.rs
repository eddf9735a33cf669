use super::*;
use serde_json::json;

#[test]
fn committed_crd_is_the_generated_one() {
    let committed = include_str!("../../deploy/crd/crd.yaml");
    assert!(
        committed == crd_manifest().unwrap(),
        "deploy/crd/crd.yaml is stale: run `cargo run -- crd > deploy/crd/crd.yaml`"
    );
}

#[test]
fn crd_matches_kruises_identity_with_both_versions() {
    let crd = crd().unwrap();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("containerrecreaterequests.apps.kruise.io")
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["crr".to_owned()]));
    assert_eq!(crd.spec.names.plural, PLURAL);
    assert!(crd.spec.conversion.is_none(), "no conversion webhook");
    let served: Vec<_> = crd
        .spec
        .versions
        .iter()
        .map(|v| (v.name.as_str(), v.served, v.storage))
        .collect();
    assert_eq!(
        served,
        [(VERSION, true, false), (v1beta1::VERSION, true, true)]
    );
    for version in &crd.spec.versions {
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("PHASE", ".status.phase"),
                ("POD", ".spec.podName"),
                (
                    "NODE",
                    ".metadata.labels.crr\\.apps\\.kruise\\.io/node-name"
                ),
                ("AGE", ".metadata.creationTimestamp"),
            ]
        );
        assert!(version.subresources.as_ref().unwrap().status.is_some());
    }
}

/// The schema of `version`, as JSON, for pointers.
fn schema(version: &str) -> serde_json::Value {
    let crd = crd().unwrap();
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == version)
        .unwrap();
    serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap()
}

/// crr-proxy's CRD judges a v1alpha1 spec as v1beta1's, so that what
/// v1beta1 refuses is refused at create in either version (kruise's
/// v1alpha1 schema has none of these checks); the status schemas keep
/// their versions' differences.
#[test]
fn v1beta1s_schema_adds_minimums_enums_and_the_two_status_fields() {
    let beta = schema(v1beta1::VERSION);
    let alpha = schema(VERSION);
    let spec = "/properties/spec/properties";
    let status = "/properties/status/properties";
    for field in [
        "/activeDeadlineSeconds",
        "/ttlSecondsAfterFinished",
        "/strategy/properties/terminationGracePeriodSeconds",
        "/strategy/properties/unreadyGracePeriodSeconds",
        "/strategy/properties/minStartedSeconds",
    ] {
        let pointer = format!("{spec}{field}/minimum");
        assert!(
            beta.pointer(&pointer)
                .is_some_and(|m| m.as_f64() == Some(0.0)),
            "{field}: {:?}",
            beta.pointer(&format!("{spec}{field}"))
        );
        assert_eq!(alpha.pointer(&pointer), beta.pointer(&pointer), "{field}");
    }
    for version in [&beta, &alpha] {
        assert_eq!(
            version.pointer(&format!("{spec}/strategy/properties/failurePolicy/enum")),
            Some(&json!(["Fail", "Ignore"]))
        );
    }
    assert!(alpha.pointer(&format!("{status}/phase/enum")).is_none());
    assert!(alpha.pointer(&format!("{status}/conditions")).is_none());
    let phases = json!(["Pending", "Recreating", "Succeeded", "Failed", "Completed"]);
    assert_eq!(beta.pointer(&format!("{status}/phase/enum")), Some(&phases));
    assert_eq!(
        beta.pointer(&format!(
            "{status}/containerRecreateStates/items/properties/phase/enum"
        )),
        Some(&phases)
    );
    assert_eq!(
        beta.pointer(&format!("{status}/conditions/x-kubernetes-list-map-keys")),
        Some(&json!(["type"]))
    );
    assert_eq!(
        beta.pointer(&format!("{status}/containerStatusSnapshot/items/required")),
        Some(&json!(["name", "ready", "restartCount"]))
    );
    for field in ["conditions", "containerStatusSnapshot"] {
        assert!(
            alpha.pointer(&format!("{status}/{field}")).is_none(),
            "{field}"
        );
    }
    assert!(alpha.pointer(&format!("{status}/phase/enum")).is_none());
}

#[test]
fn one_status_type_reads_v1beta1s_fields() {
    let status: ContainerRecreateRequestStatus = serde_json::from_value(json!({
        "phase": "Recreating",
        "containerStatusSnapshot": [{"name": "app", "ready": true, "restartCount": 1, "containerID": "containerd://b"}],
        "conditions": [{"type": "PreRecreateGrace", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "reason": "PreRecreateGrace", "message": "Pod has been forced to not-ready for unreadyGracePeriodSeconds drain"}]
    }))
    .unwrap();
    assert_eq!(
        status.container_status_snapshot[0].container_id,
        "containerd://b"
    );
    assert_eq!(status.conditions[0].type_, "PreRecreateGrace");
    assert_eq!(
        serde_json::to_value(&status).unwrap()["containerStatusSnapshot"][0]["restartCount"],
        1
    );
}

#[test]
fn unknown_policies_do_not_break_reading() {
    let strategy: ContainerRecreateRequestStrategy =
        serde_json::from_str(r#"{"failurePolicy":"Sometimes"}"#).unwrap();
    assert_eq!(
        strategy.failure_policy,
        Some(FailurePolicy::Other("Sometimes".into()))
    );
}

#[test]
fn spec_reads_a_webhook_mutated_crr() {
    let spec: ContainerRecreateRequestSpec = serde_json::from_str(
        r#"{
          "podName": "web-0",
          "containers": [{
            "name": "app",
            "preStop": {"httpGet": {"path": "/quit", "port": "http"}},
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
            "statusContext": {"containerID": "containerd://abc", "restartCount": 2}
          }],
          "strategy": {"failurePolicy": "Ignore", "orderedRecreate": true, "minStartedSeconds": 5,
                       "terminationGracePeriodSeconds": 30},
          "activeDeadlineSeconds": 300,
          "ttlSecondsAfterFinished": 60
        }"#,
    )
    .unwrap();
    let container = &spec.containers[0];
    assert_eq!(
        container.status_context.as_ref().unwrap().container_id,
        "containerd://abc"
    );
    assert_eq!(container.ports[0].container_port, 8080);
    let strategy = spec.strategy.unwrap();
    assert_eq!(strategy.failure_policy, Some(FailurePolicy::Ignore));
    assert!(strategy.ordered_recreate && !strategy.force_recreate);
    assert_eq!(strategy.min_started_seconds, 5);
}

#[test]
fn status_json_matches_kruise_omitempty_rules() {
    let status = ContainerRecreateRequestStatus {
        phase: Phase::Recreating,
        container_recreate_states: vec![
            ContainerRecreateState {
                name: "app".into(),
                phase: Phase::Recreating,
                message: String::new(),
                is_killed: true,
            },
            ContainerRecreateState {
                name: "sidecar".into(),
                phase: Phase::Pending,
                message: "not found container on Node".into(),
                is_killed: false,
            },
        ],
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&status).unwrap(),
        r#"{"phase":"Recreating","containerRecreateStates":[{"name":"app","phase":"Recreating","isKilled":true},{"name":"sidecar","phase":"Pending","message":"not found container on Node"}]}"#
    );
    // A new CRR's status still carries the (empty) phase.
    assert_eq!(
        serde_json::to_string(&ContainerRecreateRequestStatus::default()).unwrap(),
        r#"{"phase":""}"#
    );
}

#[test]
fn a_crr_is_finished_once_completed_or_deleted_and_its_ttl_counts_from_completion() {
    let crr = |status: serde_json::Value, deleting: bool| {
        let mut object = serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"podName": "p", "containers": [{"name": "app"}], "ttlSecondsAfterFinished": 60},
        });
        if !status.is_null() {
            object["status"] = status;
        }
        if deleting {
            object["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        serde_json::from_value::<ContainerRecreateRequest>(object).unwrap()
    };
    let fresh = crr(serde_json::Value::Null, false);
    assert!(!fresh.is_finished());
    assert_eq!(fresh.phase(), Phase::New);
    assert_eq!(fresh.ttl_left(0), None);
    let completed = crr(
        serde_json::json!({"phase": "Completed", "completionTime": "2026-01-01T00:00:00Z"}),
        false,
    );
    assert!(completed.is_finished());
    assert_eq!(completed.phase(), Phase::Completed);
    let done_at = 1_767_225_600; // 2026-01-01T00:00:00Z
    assert_eq!(completed.ttl_left(done_at + 45), Some(15));
    assert_eq!(completed.ttl_left(done_at + 90), Some(-30));
    let deleting = crr(serde_json::json!({"phase": "Recreating"}), true);
    assert!(deleting.is_finished());
    assert_eq!(deleting.phase(), Phase::Recreating);
}

#[test]
fn phases_round_trip_and_unknown_ones_are_kept() {
    for (phase, json) in [
        (Phase::New, r#""""#),
        (Phase::Pending, r#""Pending""#),
        (Phase::Completed, r#""Completed""#),
        (Phase::Other("Paused".into()), r#""Paused""#),
    ] {
        assert_eq!(serde_json::to_string(&phase).unwrap(), json);
        assert_eq!(serde_json::from_str::<Phase>(json).unwrap(), phase);
    }
}

#[test]
fn sync_statuses_parse_as_the_manager_writes_them() {
    let parsed: Vec<SyncContainerStatus> = serde_json::from_str(
        r#"[{"name":"app","ready":true,"restartCount":1,"containerID":"containerd://def"},{"name":"b","ready":false,"restartCount":0}]"#,
    )
    .unwrap();
    assert_eq!(parsed[0].container_id, "containerd://def");
    assert!(parsed[0].ready);
    assert_eq!(parsed[1].container_id, "");
    assert_eq!(
        serde_json::to_string(&parsed[1]).unwrap(),
        r#"{"name":"b","ready":false,"restartCount":0}"#
    );
}
