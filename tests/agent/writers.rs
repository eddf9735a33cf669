//! Many writers: a lagging cache, a pass that goes on from its own writes,
//! and another writer's status lists, conditions and completion kept.

use super::*;

/// The agent's cache lags a second behind the API server: after it
/// completes a CRR, the syncs that still read the copy from before (woken
/// by the Pod's changes) leave it alone, as kruise's expectations do,
/// instead of completing it a second time (a 409).
pub(super) async fn a_lagging_cache_does_not_complete_a_crr_twice(mode: Setup) {
    let mut cluster = Cluster::without_agent(mode).await;
    cluster.api.set_watches(Watches {
        lag: [(Resource::Crr, Duration::from_secs(1))].into(),
        ..Watches::default()
    });
    cluster.start_agent().await;
    cluster.kubelet.run_pod(app_and_sidecar("lag")).await;
    cluster.create("crr-lag", "lag", &["app"], Value::Null, json!({}));
    cluster.completed("crr-lag", Duration::from_secs(30)).await;
    // Someone touches the Pod before the cache has the completion (in
    // standalone mode a Pod's change wakes its CRRs).
    let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
    cluster
        .api
        .patch(Resource::Pod, NAMESPACE, "lag", &touch, false)
        .unwrap();
    // Long enough for the lagging cache to catch up, twice over.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let completing: Vec<_> = cluster
        .api
        .writes()
        .into_iter()
        .filter(|w| {
            w.path
                .ends_with("/containerrecreaterequests/crr-lag/status")
                && w.body["status"]["completionTime"].is_string()
        })
        .collect();
    assert_eq!(completing.len(), 1, "{completing:#?}");
}

/// The CRR watch lags 3 s. The pass that moves a CRR to Recreating goes
/// on from its write's answer: it publishes the states and kills in the
/// same pass, instead of waiting a lag for each of its own writes to come
/// back (which put the kill two lags after the Recreating write).
pub(super) async fn a_pass_goes_on_from_its_own_writes(mode: Setup) {
    let lag = Duration::from_secs(3);
    let mut cluster = Cluster::without_agent(mode).await;
    cluster.api.set_watches(Watches {
        lag: [(Resource::Crr, lag)].into(),
        ..Watches::default()
    });
    cluster.start_agent().await;
    cluster.kubelet.run_pod(app_and_sidecar("onward")).await;
    cluster.create("crr-onward", "onward", &["app"], Value::Null, json!({}));
    let done = cluster
        .completed("crr-onward", Duration::from_secs(60))
        .await;
    assert_eq!(
        states(&done),
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
    );
    let writes: Vec<_> = cluster
        .api
        .writes()
        .into_iter()
        .filter(|w| {
            w.path
                .ends_with("/containerrecreaterequests/crr-onward/status")
                && w.code == Some(200)
        })
        .collect();
    let first = |what: &str, matches: &dyn Fn(&Value) -> bool| {
        writes
            .iter()
            .find(|w| matches(&w.body["status"]))
            .unwrap_or_else(|| panic!("no write of {what}: {writes:#?}"))
            .at
    };
    let recreating = first("the phase", &|s| s["phase"] == "Recreating");
    let killed = first("the kill", &|s| {
        s["containerRecreateStates"]
            .as_array()
            .is_some_and(|states| states.iter().any(|c| c["isKilled"] == true))
    });
    let took = killed - recreating;
    assert!(
        took < lag,
        "the kill came {took:?} after the Recreating write"
    );
}

/// On v1beta1 a status write reads the CRR afresh and tries up to four
/// times on conflict, as master's daemon does (crr-v1beta1.md §4). Each
/// race below is real: another writer updates the CRR just before the PUT.
/// Three lost races are absorbed within one pass (the fourth try carries
/// the fresh resourceVersion); four exhaust the pass, which fails once and
/// completes on the next.
pub(super) async fn v1beta1_status_writes_read_afresh_and_try_four_times(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    for (pod, races, failures) in [("race3", 3, 0.0), ("race4", 4, 1.0)] {
        cluster
            .kubelet
            .run_pod(PodSpec::new(pod, vec![ContainerSpec::graceful("app")]))
            .await;
        let crr = format!("crr-{pod}");
        cluster.api.race_status_updates(races);
        cluster.create(&crr, pod, &["app"], Value::Null, json!({}));
        let done = cluster.completed(&crr, Duration::from_secs(30)).await;
        assert_eq!(cluster.api.races_left(), 0);
        assert_eq!(
            done["metadata"]["annotations"]["test.crr-proxy/concurrent-write"], "1",
            "the last race's write is kept"
        );
        assert_eq!(
            states(&done),
            json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
        );
        assert_eq!(
            cluster.metric("crr_proxy_crr_reconcile_failures_total"),
            failures,
            "after {races} lost races"
        );
    }
}

/// Another writer (kruise-manager past the deadline, say) completes the
/// CRR just before the agent writes its own completion: the agent's PUT
/// loses the race, and its fresh read shows the CRR completed, which it
/// leaves as it is (crr-v1beta1.md §4 notes this race in kruise's daemon,
/// whose retry would overwrite it).
pub(super) async fn v1beta1_another_writers_completion_is_kept(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster
        .kubelet
        .run_pod(PodSpec::new(
            "podother",
            vec![ContainerSpec::graceful("app")],
        ))
        .await;
    cluster.api.race_status_updates_with(
        1,
        Arc::new(|body| body["status"]["phase"] == "Completed"),
        |_| {
            let theirs = json!({"status": {
                "phase": "Completed",
                "completionTime": "2026-01-01T00:00:00Z",
                "message": "completed by another writer",
            }});
            (theirs, true)
        },
    );
    cluster.create("crr-other", "podother", &["app"], Value::Null, json!({}));
    wait_for(Duration::from_secs(30), || {
        let pod = cluster.pod("podother");
        (container_status(&pod, "app")["restartCount"] == 1).then_some(())
    })
    .await
    .expect("the container is recreated");
    wait_for(Duration::from_secs(10), || {
        (cluster.api.races_left() == 0).then_some(())
    })
    .await
    .expect("the agent wrote its completion");
    // Its passes that follow have had their time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = cluster.crr("crr-other").unwrap();
    assert_eq!(
        kept["status"]["message"], "completed by another writer",
        "{kept:#}"
    );
    assert_eq!(kept["status"]["completionTime"], "2026-01-01T00:00:00Z");
    // Killed once: a second kill shows at the runtime, where kubelet's
    // back-off would hold its restart back.
    let stops = cluster.ctrd.stop_calls();
    assert_eq!(
        stops.len(),
        1,
        "the container was stopped again: {stops:#?}"
    );
    assert_eq!(
        container_status(&cluster.pod("podother"), "app")["restartCount"],
        1
    );
}

/// The body of a status PATCH (a merge patch names no spec) whose list
/// `field` it writes.
pub(super) fn patches_list(field: &'static str) -> Arc<dyn Fn(&Value) -> bool + Send + Sync> {
    Arc::new(move |body: &Value| body.get("spec").is_none() && body["status"][field].is_array())
}

/// Another writer (a second pass of a node agent, say) records `side` as
/// recreated just before the agent first writes the states. A merge patch
/// from the agent's copy would put `side` back to Pending and kill it
/// again; the agent's write names the resourceVersion it read, conflicts,
/// and decides again from the fresh copy: only `app` is recreated.
pub(super) async fn another_writers_states_are_decided_on_not_written_over(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    let containers = vec![
        ContainerSpec::graceful("app"),
        ContainerSpec::graceful("side"),
    ];
    cluster
        .kubelet
        .run_pod(PodSpec::new("podlists", containers))
        .await;
    cluster
        .api
        .race_status_updates_with(1, patches_list("containerRecreateStates"), |_| {
            let theirs = json!({"status": {"containerRecreateStates": [
                {"name": "app", "phase": "Pending"},
                {"name": "side", "phase": "Succeeded", "isKilled": true},
            ]}});
            (theirs, true)
        });
    cluster.create(
        "crr-lists",
        "podlists",
        &["app", "side"],
        Value::Null,
        json!({}),
    );
    let done = cluster
        .completed("crr-lists", Duration::from_secs(30))
        .await;
    assert_eq!(cluster.api.races_left(), 0, "the race happened");
    assert_eq!(
        states(&done),
        json!([
            {"name": "app", "phase": "Succeeded", "isKilled": true},
            {"name": "side", "phase": "Succeeded", "isKilled": true},
        ])
    );
    let pod = cluster.pod("podlists");
    assert_eq!(container_status(&pod, "app")["restartCount"], 1);
    assert_eq!(
        container_status(&pod, "side")["restartCount"],
        0,
        "side was killed again"
    );
}

/// kruise-manager adds a condition of its own just before the agent writes
/// its PreRecreateGrace condition: both are there in the end.
pub(super) async fn v1beta1_another_writers_condition_is_kept(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster
        .kubelet
        .run_pod(PodSpec::new(
            "podcond",
            vec![ContainerSpec::graceful("app")],
        ))
        .await;
    cluster
        .api
        .race_status_updates_with(1, patches_list("conditions"), |_| {
            let theirs = json!({"status": {"conditions": [{
                "type": "ManagerSaw",
                "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "reason": "Test",
                "message": "written by another writer",
            }]}});
            (theirs, true)
        });
    let strategy = json!({"unreadyGracePeriodSeconds": 1});
    cluster.create("crr-cond", "podcond", &["app"], strategy, json!({}));
    let done = cluster.completed("crr-cond", Duration::from_secs(30)).await;
    assert_eq!(cluster.api.races_left(), 0, "the race happened");
    let types: Vec<&str> = done["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(types, ["ManagerSaw", "PreRecreateGrace"], "{done:#}");
}
