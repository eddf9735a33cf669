//! OpenKruise's v1alpha1 e2e scenarios (crr-semantics.md §4): minStartedSeconds and
//! TTL, ordered and unordered recreation, preStop, the active deadline, the
//! unready grace, forceRecreate.

use super::*;

pub(super) async fn e2e_1a_simple_container_with_min_started_seconds_and_ttl(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    let pod = cluster.kubelet.run_pod(app_and_sidecar("pod0")).await;
    cluster.create(
        "crr-1a",
        "pod0",
        &["app"],
        json!({"minStartedSeconds": 5}),
        json!({"ttlSecondsAfterFinished": 3}),
    );
    // The webhook's (or in standalone mode crr-proxy's) labels, defaults and
    // snapshot.
    let created = cluster.accepted("crr-1a").await;
    let labels = &created["metadata"]["labels"];
    assert_eq!(labels["crr.apps.kruise.io/pod-uid"], pod["metadata"]["uid"]);
    assert_eq!(labels["crr.apps.kruise.io/node-name"], NODE);
    assert_eq!(labels["crr.apps.kruise.io/active"], "true");
    assert_eq!(created["spec"]["strategy"]["failurePolicy"], "Fail");
    assert_eq!(
        created["spec"]["containers"][0]["statusContext"]["containerID"],
        container_status(&pod, "app")["containerID"]
    );

    let done = cluster.completed("crr-1a", Duration::from_secs(70)).await;
    cluster.active_removed("crr-1a").await;
    let pod = cluster.kubelet.wait_ready("pod0").await;
    assert_eq!(
        states(&done),
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
    );
    let app = container_status(&pod, "app");
    assert_eq!(app["restartCount"], 1);
    assert_ne!(
        app["containerID"],
        done["spec"]["containers"][0]["statusContext"]["containerID"]
    );
    assert_eq!(
        container_status(&pod, "sidecar")["restartCount"],
        0,
        "the sidecar was not asked for"
    );
    let waited =
        seconds(&done["status"]["completionTime"]) - seconds(&app["state"]["running"]["startedAt"]);
    assert!(
        waited > 4,
        "completed {waited}s after the new container started (minStartedSeconds 5)"
    );
    wait_for(Duration::from_secs(6), || {
        cluster.crr("crr-1a").is_none().then_some(())
    })
    .await
    .expect("deleted by ttlSecondsAfterFinished");
    // Events on the Pod, from crr-proxy.
    let killing = cluster.event("Killing").expect("a Killing event");
    assert_eq!(
        killing["note"],
        "Stopping container app by ContainerRecreateRequest crr-1a"
    );
    assert_eq!(killing["regarding"]["fieldPath"], "spec.containers{app}");
    assert_eq!(killing["reportingController"], agent::REPORTER);
}

pub(super) async fn e2e_1b_two_containers_without_strategy(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(app_and_sidecar("pod1")).await;
    cluster.create(
        "crr-1b",
        "pod1",
        &["app", "sidecar"],
        Value::Null,
        json!({}),
    );
    let done = cluster.completed("crr-1b", Duration::from_secs(60)).await;
    cluster.active_removed("crr-1b").await;
    let pod = cluster.kubelet.wait_ready("pod1").await;
    assert_recreated(&done, &pod, &["app", "sidecar"]);
}

/// A Pod with two graceful containers, `app` and `sidecar`.
pub(super) fn app_and_sidecar(name: &str) -> PodSpec {
    PodSpec::new(
        name,
        vec![
            ContainerSpec::graceful("app"),
            ContainerSpec::graceful("sidecar"),
        ],
    )
}

pub(super) fn post_start_pod(name: &str) -> PodSpec {
    let mut app = ContainerSpec::graceful("app");
    app.post_start = Duration::from_secs(5);
    PodSpec::new(name, vec![app, ContainerSpec::graceful("sidecar")])
}

/// Recreates `app` and `sidecar` of a post-start Pod with `strategy`, checks
/// both were recreated, and returns how many seconds after the app the
/// sidecar was stopped.
pub(super) async fn sidecar_lag(mode: Setup, pod: &str, strategy: Value) -> i64 {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(post_start_pod(pod)).await;
    let crr = format!("crr-{pod}");
    cluster.create(&crr, pod, &["app", "sidecar"], strategy, json!({}));
    let done = cluster.completed(&crr, Duration::from_secs(60)).await;
    let pod = cluster.kubelet.wait_ready(pod).await;
    assert_recreated(&done, &pod, &["app", "sidecar"]);
    finished_at(&pod, "sidecar") - finished_at(&pod, "app")
}

pub(super) async fn e2e_2a_unordered_does_not_wait_for_readiness(mode: Setup) {
    let gap = sidecar_lag(mode, "pod2a", Value::Null).await;
    assert!(gap < 3, "the sidecar waited {gap}s for the app");
}

pub(super) async fn e2e_2b_ordered_waits_for_the_previous_container(mode: Setup) {
    let gap = sidecar_lag(mode, "pod2b", json!({"orderedRecreate": true})).await;
    assert!(
        gap >= 5,
        "the sidecar was killed {gap}s after the app, before it was ready"
    );
}

pub(super) fn pre_stop_pod(name: &str) -> PodSpec {
    let mut app = ContainerSpec::graceful("app");
    app.pre_stop = Some(json!({"exec": {"command": ["sleep", "8"]}}));
    PodSpec::new(name, vec![app, ContainerSpec::graceful("sidecar")])
}

pub(super) async fn e2e_3a_pre_stop_runs_fully_and_kills_are_sequential(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(pre_stop_pod("pod3a")).await;
    cluster.create(
        "crr-3a",
        "pod3a",
        &["app", "sidecar"],
        Value::Null,
        json!({}),
    );
    let created = cluster.accepted("crr-3a").await;
    assert_eq!(
        created["spec"]["containers"][0]["preStop"],
        json!({"exec": {"command": ["sleep", "8"]}})
    );
    let done = cluster.completed("crr-3a", Duration::from_secs(60)).await;
    let pod = cluster.kubelet.wait_ready("pod3a").await;
    assert_recreated(&done, &pod, &["app", "sidecar"]);
    let after = finished_at(&pod, "sidecar") - seconds(&created["metadata"]["creationTimestamp"]);
    assert!(
        after >= 8,
        "the sidecar stopped {after}s after creation, before the app's preStop ended"
    );
    // The app's 8 s hook, counted once and not as a failure.
    assert_eq!(
        cluster.metric("crr_proxy_prestop_hook_duration_seconds_count"),
        1.0
    );
    assert!(cluster.metric("crr_proxy_prestop_hook_duration_seconds_sum") >= 8.0);
    assert_eq!(cluster.metric("crr_proxy_prestop_hook_failures_total"), 0.0);
    cluster
        .metric_reaches("crr_proxy_crr_seen_to_stopped_seconds_count", 2.0)
        .await;
}

pub(super) async fn e2e_3b_active_deadline_completes_while_the_kill_goes_on(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(pre_stop_pod("pod3b")).await;
    cluster.create(
        "crr-3b",
        "pod3b",
        &["app", "sidecar"],
        Value::Null,
        json!({"activeDeadlineSeconds": 3}),
    );
    let done = cluster.completed("crr-3b", Duration::from_secs(5)).await;
    assert_eq!(
        done["status"]["message"],
        "recreating has exceeded the activeDeadlineSeconds"
    );
    assert_eq!(
        states(&done),
        json!([{"name": "app", "phase": "Pending"}, {"name": "sidecar", "phase": "Pending"}])
    );
    cluster.active_removed("crr-3b").await;
    // The kill in progress finishes: the app is recreated; the sidecar never is.
    wait_for(Duration::from_secs(60), || {
        (container_status(&cluster.pod("pod3b"), "app")["restartCount"] == 1).then_some(())
    })
    .await
    .expect("the app was recreated");
    cluster.kubelet.wait_ready("pod3b").await;
    let last = wait_for(Duration::from_secs(10), || {
        cluster
            .crr("crr-3b")
            .filter(|c| states(c) == json!([{"name": "app", "phase": "Recreating", "isKilled": true}, {"name": "sidecar", "phase": "Pending"}]))
    })
    .await;
    assert!(
        last.is_some(),
        "final states: {:?}",
        cluster.crr("crr-3b").map(|c| states(&c))
    );
    assert_eq!(
        container_status(&cluster.pod("pod3b"), "sidecar")["restartCount"],
        0
    );
}

pub(super) async fn e2e_3c_unready_grace_and_a_short_termination_grace(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(pre_stop_pod("pod3c")).await;
    let created = cluster.create(
        "crr-3c",
        "pod3c",
        &["app", "sidecar"],
        json!({"terminationGracePeriodSeconds": 3, "unreadyGracePeriodSeconds": 1}),
        json!({}),
    );
    // A bound on a wait, not a figure: the claim, the acceptance and the
    // Pod's status write share 2 cores with containerd and the other
    // scenarios (it took more than 2 s once, on containerd 2.x in the full
    // suite).
    let not_ready = wait_for(Duration::from_secs(10), || {
        let pod = cluster.pod("pod3c");
        let condition = pod["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == roles::KRUISE_POD_READY)?
            .clone();
        (condition["status"] == "False").then_some(condition)
    })
    .await
    .expect("KruisePodReady False within 10 s");
    assert_eq!(
        not_ready["message"],
        format!(r#"[{{"userAgent":"ContainerRecreateRequest","key":"{NAMESPACE}/crr-3c"}}]"#)
    );
    let done = cluster.completed("crr-3c", Duration::from_secs(60)).await;
    wait_for(Duration::from_secs(3), || {
        (roles::condition(&cluster.pod("pod3c"), roles::KRUISE_POD_READY).as_deref()
            == Some("True"))
        .then_some(())
    })
    .await
    .expect("KruisePodReady True again within 3 s");
    let pod = cluster.kubelet.wait_ready("pod3c").await;
    assert_recreated(&done, &pod, &["app", "sidecar"]);
    let after = finished_at(&pod, "app") - seconds(&created["metadata"]["creationTimestamp"]);
    assert!(
        after < 8,
        "the app's 8 s preStop was not cut by the 3 s grace: {after}s"
    );
}

pub(super) async fn e2e_4a_and_4b_force_recreate(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(post_start_pod("pod4a")).await;
    cluster.kubelet.run_pod(post_start_pod("pod4b")).await;
    cluster.create(
        "crr-4a",
        "pod4a",
        &["app", "sidecar"],
        json!({"forceRecreate": true}),
        json!({}),
    );
    cluster.create(
        "crr-4b",
        "pod4b",
        &["app", "sidecar"],
        json!({"forceRecreate": true, "orderedRecreate": true}),
        json!({}),
    );
    let done_a = cluster.completed("crr-4a", Duration::from_secs(60)).await;
    let done_b = cluster.completed("crr-4b", Duration::from_secs(60)).await;
    let pod_a = cluster.kubelet.wait_ready("pod4a").await;
    let pod_b = cluster.kubelet.wait_ready("pod4b").await;
    assert_recreated(&done_a, &pod_a, &["app", "sidecar"]);
    assert_recreated(&done_b, &pod_b, &["app", "sidecar"]);
    let gap_a = finished_at(&pod_a, "sidecar") - finished_at(&pod_a, "app");
    let gap_b = finished_at(&pod_b, "sidecar") - finished_at(&pod_b, "app");
    assert!(gap_a < 3, "unordered force waited {gap_a}s");
    assert!(gap_b >= 5, "ordered force waited only {gap_b}s");
}
