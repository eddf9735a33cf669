//! v1alpha1 and v1beta1: both served, the CRD upgraded under stored CRRs,
//! OpenKruise upgraded under the agent, and v1alpha1 readers of v1beta1.

use super::*;

/// The API client for CRRs in `version` (a person's kubectl, or a
/// controller built against that version).
pub(super) fn crrs_as(cluster: &Cluster, version: ApiVersion) -> Api<DynamicObject> {
    Api::namespaced_with(cluster.api.client(), NAMESPACE, &version.api_resource())
}

pub(super) async fn create_as(cluster: &Cluster, version: ApiVersion, name: &str, spec: Value) {
    let obj = json!({"apiVersion": format!("apps.kruise.io/{}", version.as_str()),
                     "kind": "ContainerRecreateRequest", "metadata": {"name": name}, "spec": spec});
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    crrs_as(cluster, version)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {name} as {version:?}: {e}"));
}

/// Standalone on crr-proxy's own CRD (v1beta1 stored, no conversion): what
/// v1beta1's schema refuses is refused at create through either version,
/// with the API server's message. CRRs stored under an older, laxer CRD are
/// ended with the webhook's message on an API server that ratchets
/// validation; on one that does not, every write to them is refused (422),
/// so each gets one Event saying why and is never written again.
pub(super) async fn standalone_v1beta1_invalid_crrs_are_refused_at_create_or_ended_once() {
    let cluster = Cluster::new(Setup {
        mode: Mode::Standalone,
        versions: CrrVersions::Both(Conversion::None),
    })
    .await;
    cluster
        .kubelet
        .run_pod(PodSpec::new("victim", vec![ContainerSpec::graceful("app")]))
        .await;
    let bad = [
        (
            "grace",
            json!({"strategy": {"terminationGracePeriodSeconds": -5}}),
            "spec.strategy.terminationGracePeriodSeconds: Invalid value: -5: spec.strategy.terminationGracePeriodSeconds in body should be greater than or equal to 0",
            "terminationGracePeriodSeconds must be non-negative integer",
        ),
        (
            "unready",
            json!({"strategy": {"unreadyGracePeriodSeconds": -1}}),
            "spec.strategy.unreadyGracePeriodSeconds: Invalid value: -1: spec.strategy.unreadyGracePeriodSeconds in body should be greater than or equal to 0",
            "unreadyGracePeriodSeconds must be non-negative integer",
        ),
        (
            "policy",
            json!({"strategy": {"failurePolicy": "Sometimes"}}),
            "spec.strategy.failurePolicy: Unsupported value: \"Sometimes\": supported values: \"Fail\", \"Ignore\"",
            "unknown failurePolicy Sometimes",
        ),
    ];
    let spec = |extra: &Value| {
        let mut spec = json!({"podName": "victim", "containers": [{"name": "app"}]});
        support::patch::merge_patch(&mut spec, extra);
        spec
    };
    for version in [ApiVersion::V1alpha1, ApiVersion::V1beta1] {
        for (name, extra, schema_says, _) in &bad {
            let obj = json!({"apiVersion": format!("apps.kruise.io/{}", version.as_str()),
                             "kind": "ContainerRecreateRequest", "metadata": {"name": name}, "spec": spec(extra)});
            let obj: DynamicObject = serde_json::from_value(obj).unwrap();
            match crrs_as(&cluster, version)
                .create(&PostParams::default(), &obj)
                .await
            {
                Err(kube::Error::Api(status)) => {
                    assert_eq!(
                        (status.code, status.message.as_str()),
                        (
                            422,
                            format!("ContainerRecreateRequest.apps.kruise.io {name:?} is invalid: {schema_says}")
                                .as_str()
                        ),
                        "{version:?}"
                    );
                }
                other => panic!("{name} through {version:?}: {other:?}"),
            }
        }
    }

    // Stored as they are, past the schema: as under an older, laxer CRD.
    let store_all = |prefix: &str| {
        for (name, extra, _, _) in &bad {
            cluster
                .api
                .create_unchecked(
                    Resource::Crr,
                    NAMESPACE,
                    json!({"metadata": {"name": format!("{prefix}-{name}")}, "spec": spec(extra)}),
                )
                .unwrap();
        }
    };
    // Stored before the CRD checked them, on a server without ratcheting.
    store_all("old");
    for (name, _, schema_says, webhook_says) in &bad {
        let crr = format!("old-{name}");
        let event = wait_for(Duration::from_secs(10), || {
            cluster
                .api
                .list(Resource::Event, Some(NAMESPACE), &Default::default())
                .into_iter()
                .find(|e| e["reason"] == "Unwritable" && e["regarding"]["name"] == crr.as_str())
        })
        .await
        .unwrap_or_else(|| panic!("no Event on {crr}"));
        assert_eq!(
            event["note"],
            format!(
                "not placed: {webhook_says}; the API server refuses every write to this ContainerRecreateRequest: \
                 ContainerRecreateRequest.apps.kruise.io {crr:?} is invalid: {schema_says}"
            )
        );
        assert_eq!(event["type"], "Warning");
    }
    let writes_to = |prefix: &str| {
        cluster
            .api
            .writes()
            .into_iter()
            .filter(|w| {
                w.path
                    .contains(&format!("/containerrecreaterequests/{prefix}"))
            })
            .count()
    };
    let made = writes_to("old-");
    assert_eq!(made, bad.len(), "one write each");
    // None is tried again: meanwhile the claimer takes a valid CRR through
    // to its end, and at least 2 s pass, in which a key that had failed
    // would have been retried twice (the agent's queue retries after
    // 500 ms, then 1 s).
    let quiet = tokio::time::Instant::now() + Duration::from_secs(2);
    cluster.create("valid", "victim", &["app"], Value::Null, json!({}));
    cluster.completed("valid", Duration::from_secs(30)).await;
    tokio::time::sleep_until(quiet).await;
    assert_eq!(
        writes_to("old-"),
        made,
        "none written again: {:?}",
        cluster
            .api
            .writes()
            .iter()
            .filter(|w| w.path.contains("/old-"))
            .map(|w| format!("{} {} {:?} {}", w.method, w.path, w.code, w.body))
            .collect::<Vec<_>>()
    );

    // With ratcheting (Kubernetes 1.30 and later) they end as the webhook says.
    cluster.api.set_ratcheting(true);
    store_all("kept");
    for (name, _, _, webhook_says) in &bad {
        let done = cluster
            .completed(&format!("kept-{name}"), Duration::from_secs(10))
            .await;
        assert_eq!(done["status"]["message"], *webhook_says);
    }
}

/// On a cluster that stores v1beta1, a CRR created through v1alpha1 and one
/// created through v1beta1 both complete (master's e2e cases 5 and 8,
/// crr-v1beta1.md §6): the stored objects carry the v1beta1 snapshot (with
/// the new containers' IDs) and, with an unready grace, PreRecreateGrace
/// True, and neither legacy annotation: crr-proxy writes v1beta1, so no
/// conversion puts them there.
pub(super) async fn both_versions_complete_with_typed_fields_and_no_legacy_annotations(
    mode: Setup,
) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(app_and_sidecar("alpha")).await;
    cluster.kubelet.run_pod(app_and_sidecar("beta")).await;
    let spec = |pod: &str| {
        json!({"podName": pod, "containers": [{"name": "app"}, {"name": "sidecar"}],
               "strategy": {"unreadyGracePeriodSeconds": 1}})
    };
    create_as(&cluster, ApiVersion::V1alpha1, "crr-alpha", spec("alpha")).await;
    create_as(&cluster, ApiVersion::V1beta1, "crr-beta", spec("beta")).await;
    for (name, pod) in [("crr-alpha", "alpha"), ("crr-beta", "beta")] {
        let done = cluster.completed(name, Duration::from_secs(60)).await;
        assert_eq!(done["apiVersion"], "apps.kruise.io/v1beta1", "{done}");
        assert!(done["status"]["message"].is_null(), "{done}");
        let pod = cluster.kubelet.wait_ready(pod).await;
        assert_recreated(&done, &pod, &["app", "sidecar"]);
        let snapshot = done["status"]["containerStatusSnapshot"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for container in ["app", "sidecar"] {
            let entry = snapshot
                .iter()
                .find(|s| s["name"] == container)
                .unwrap_or_else(|| panic!("{name}: no snapshot of {container}: {done}"));
            let old = done["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == container)
                .unwrap()["statusContext"]["containerID"]
                .clone();
            assert!(
                entry["containerID"].is_string() && entry["containerID"] != old,
                "{name}: {entry}"
            );
        }
        let grace = done["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PreRecreateGrace");
        assert_eq!(
            grace.map(|c| c["status"].clone()),
            Some(json!("True")),
            "{name}: {done}"
        );
        for annotation in [
            "crr.apps.kruise.io/sync-container-statuses",
            "crr.apps.kruise.io/unready-acquired",
        ] {
            let value = &done["metadata"]["annotations"][annotation];
            assert!(
                value.is_null() || value == "",
                "{name}: {annotation} is {value}"
            );
        }
    }
}

/// Upgrading a standalone cluster from the v1alpha1-only CRD: a CRR stored
/// as v1alpha1, stamped by the crr-proxy before (the unready-acquired
/// annotation), completes under crr-proxy's new CRD with the agent on
/// v1beta1, and keeps the stamp it had.
pub(super) async fn a_crr_stored_before_the_crd_upgrade_completes() {
    let mut cluster = Cluster::without_agent(Mode::Standalone).await;
    cluster.kubelet.run_pod(app_and_sidecar("old")).await;
    let stamp = support::apiserver::now();
    let crr = json!({
        "metadata": {"name": "crr-old", "annotations": {"crr.apps.kruise.io/unready-acquired": stamp}},
        "spec": {"podName": "old", "containers": [{"name": "app"}],
                 "strategy": {"unreadyGracePeriodSeconds": 1}},
    });
    cluster.api.create(Resource::Crr, NAMESPACE, crr).unwrap();
    assert_eq!(
        cluster.crr("crr-old").unwrap()["apiVersion"],
        "apps.kruise.io/v1alpha1"
    );
    // kubectl apply -f deploy/crd/crd.yaml, then crr-proxy restarted.
    cluster
        .api
        .set_crr_versions(CrrVersions::Both(Conversion::None));
    cluster.start_agent().await;
    let done = cluster.completed("crr-old", Duration::from_secs(30)).await;
    assert!(done["status"]["message"].is_null(), "{done}");
    assert_eq!(
        done["metadata"]["annotations"]["crr.apps.kruise.io/unready-acquired"],
        stamp
    );
    // The old stamp was honoured: no second grace, no new condition.
    assert!(done["status"]["conditions"].is_null(), "{done}");
    let pod = cluster.kubelet.wait_ready("old").await;
    assert_recreated(&done, &pod, &["app"]);
}

/// OpenKruise upgraded from v1.9 to master while crr-proxy runs: once its
/// watches list again (the API server restarted, every watch answered 410),
/// the agent finds v1beta1 served and starts over with it, so a CRR created
/// after the upgrade completes with the typed fields and no legacy
/// annotations.
pub(super) async fn an_openkruise_upgrade_moves_the_agent_to_v1beta1() {
    let mut cluster = Cluster::new(Mode::Kruise).await;
    cluster.kubelet.run_pod(app_and_sidecar("upgraded")).await;
    cluster
        .api
        .set_crr_versions(CrrVersions::Both(Conversion::Webhook));
    cluster._manager = None;
    cluster._manager = Some(KruiseManager::start(&cluster.api));
    // The agent watches its node's CRRs (the manager role, all of them).
    let agents = || {
        cluster
            .api
            .crr_watches("v1beta1", "crr.apps.kruise.io/node-name")
    };
    let watched = agents();
    cluster.api.compact();
    // The relist finds v1beta1 served, and the agent watches through it.
    assert!(
        wait_for(Duration::from_secs(10), || (agents() > watched)
            .then_some(()))
        .await
        .is_some(),
        "the agent never watched its CRRs through v1beta1 (through v1alpha1: {})",
        cluster
            .api
            .crr_watches("v1alpha1", "crr.apps.kruise.io/node-name")
    );
    let spec = json!({"podName": "upgraded", "containers": [{"name": "app"}],
                      "strategy": {"unreadyGracePeriodSeconds": 1}});
    create_as(&cluster, ApiVersion::V1beta1, "crr-upgraded", spec).await;
    let done = cluster
        .completed("crr-upgraded", Duration::from_secs(30))
        .await;
    assert!(done["status"]["message"].is_null(), "{done}");
    for annotation in [
        "crr.apps.kruise.io/sync-container-statuses",
        "crr.apps.kruise.io/unready-acquired",
    ] {
        let value = &done["metadata"]["annotations"][annotation];
        assert!(value.is_null() || value == "", "{annotation} is {value}");
    }
    assert!(
        done["status"]["containerStatusSnapshot"].is_array(),
        "{done}"
    );
}

/// master's e2e case 9: through the conversion webhook, a v1alpha1 reader
/// sees a v1beta1 CRR's PreRecreateGrace as the unready-acquired annotation.
pub(super) async fn v1alpha1_readers_see_the_grace_as_its_annotation() {
    let versions = CrrVersions::Both(Conversion::Webhook);
    let cluster = Cluster::new(Setup {
        mode: Mode::Kruise,
        versions,
    })
    .await;
    cluster.kubelet.run_pod(app_and_sidecar("graced")).await;
    let spec = json!({"podName": "graced", "containers": [{"name": "app"}],
                      "strategy": {"unreadyGracePeriodSeconds": 1}});
    create_as(&cluster, ApiVersion::V1beta1, "crr-graced", spec).await;
    let alpha = crrs_as(&cluster, ApiVersion::V1alpha1);
    let mut seen = None;
    for _ in 0..60 {
        let obj = alpha.get("crr-graced").await.unwrap();
        let stamp = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("crr.apps.kruise.io/unready-acquired"))
            .cloned();
        if let Some(stamp) = stamp.filter(|s| !s.is_empty()) {
            seen = Some((stamp, obj.data["status"].clone()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (stamp, status) = seen.expect("a v1alpha1 GET shows unready-acquired");
    assert!(stamp.ends_with('Z'), "{stamp}");
    assert!(
        status["conditions"].is_null(),
        "v1alpha1 shows no conditions: {status}"
    );
    cluster
        .completed("crr-graced", Duration::from_secs(30))
        .await;
}
