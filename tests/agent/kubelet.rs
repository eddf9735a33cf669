//! What kubelet does around a CRR: its restart back-off, restart policies,
//! native sidecars, preStop hooks, and the reason it is told.

use super::*;

/// kubelet counts a recreation as a crash: a second CRR on the same
/// container within its CrashLoopBackOff window is held by kubelet for the
/// back-off (10 s here), with the Pod saying so, and then completes.
pub(super) async fn a_second_crr_within_kubelets_back_off_waits_for_it(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(app_and_sidecar("loop")).await;
    cluster.create("first", "loop", &["app"], Value::Null, json!({}));
    cluster.completed("first", Duration::from_secs(30)).await;
    cluster.create("second", "loop", &["app"], Value::Null, json!({}));
    let created = Instant::now();
    // kubelet reads the dead instance on every sync: the reason crr-proxy
    // records just after StopContainer returns shows from the next one.
    let waiting = wait_for(Duration::from_secs(10), || {
        let app = container_status(&cluster.pod("loop"), "app");
        (app["state"]["waiting"]["reason"] == "CrashLoopBackOff"
            && app["lastState"]["terminated"]["reason"] == "ContainerRecreateRequest")
            .then_some(app)
    })
    .await
    .expect("the Pod shows CrashLoopBackOff while kubelet holds the restart");
    let message = waiting["state"]["waiting"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("back-off 10s restarting failed container=app pod=loop_default("),
        "{message}"
    );
    let done = cluster.completed("second", Duration::from_secs(40)).await;
    assert!(
        created.elapsed() >= Duration::from_secs(10),
        "{:?}",
        created.elapsed()
    );
    assert_eq!(
        states(&done),
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
    );
    let app = container_status(&cluster.pod("loop"), "app");
    assert_eq!(app["restartCount"], 2);
    assert!(app["state"]["running"].is_object(), "{app}");
}

/// kubelet's restart rules decide what a CRR does: under the Pod's `Never`
/// nothing is stopped and the container fails at once, saying why; where
/// only some exit codes restart it (`OnFailure` and a clean exit, a rule on
/// one code), kubelet is told one of them and the container comes back; a
/// code that would reset the whole Pod (RestartAllContainers) is never the
/// one kubelet reads.
pub(super) async fn restart_policies_decide_what_a_crr_does(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    let pod = |name: &str, policy: RestartPolicy, app: ContainerSpec| {
        let mut pod = PodSpec::new(name, vec![app, ContainerSpec::graceful("sidecar")]);
        pod.restart_policy = policy;
        pod
    };
    let rule = |action: &str, code: i32| json!([{"action": action, "exitCodes": {"operator": "In", "values": [code]}}]);
    let mut on_42 = ContainerSpec::graceful("app");
    on_42.restart = json!({"restartPolicy": "Never", "restartPolicyRules": rule("Restart", 42)});
    let mut resets = ContainerSpec::exiting_with("app", 143);
    resets.restart = json!({"restartPolicy": "OnFailure", "restartPolicyRules": rule("RestartAllContainers", 143)});
    let pods = [
        pod(
            "never",
            RestartPolicy::Never,
            ContainerSpec::graceful("app"),
        ),
        pod(
            "once",
            RestartPolicy::OnFailure,
            ContainerSpec::graceful("app"),
        ),
        pod("on-42", RestartPolicy::Never, on_42),
        pod("resets", RestartPolicy::Always, resets),
    ];
    for spec in pods {
        cluster.kubelet.run_pod(spec).await;
    }
    let before = container_status(&cluster.pod("never"), "app");
    for name in ["never", "once", "on-42", "resets"] {
        cluster.create(
            &format!("crr-{name}"),
            name,
            &["app"],
            Value::Null,
            json!({}),
        );
    }

    let refused = cluster
        .completed("crr-never", Duration::from_secs(20))
        .await;
    assert_eq!(
        states(&refused),
        json!([{"name": "app", "phase": "Failed",
                "message": "not recreated: app would not be started again: the Pod's restartPolicy is Never"}])
    );
    let after = container_status(&cluster.pod("never"), "app");
    assert_eq!(after["containerID"], before["containerID"]);
    assert_eq!(after["restartCount"], 0);
    assert!(after["state"]["running"].is_object(), "{after}");

    for (name, reported, real) in [("once", 143, 0), ("on-42", 42, 0), ("resets", 137, 143)] {
        let crr = format!("crr-{name}");
        let done = cluster.completed(&crr, Duration::from_secs(60)).await;
        let pod = cluster.kubelet.wait_ready(name).await;
        assert_eq!(
            states(&done),
            json!([{"name": "app", "phase": "Succeeded", "isKilled": true}]),
            "{name}"
        );
        let app = container_status(&pod, "app");
        assert_eq!(app["restartCount"], 1, "{name}: {app}");
        let last = &app["lastState"]["terminated"];
        assert_eq!(last["exitCode"], reported, "{name}: {last}");
        assert_eq!(last["reason"], "ContainerRecreateRequest");
        assert_eq!(
            last["message"],
            format!(
                "recreated by ContainerRecreateRequest {NAMESPACE}/{crr} (exit code {real}, reported as {reported} so that kubelet starts it again)"
            )
        );
        assert_eq!(
            container_status(&pod, "sidecar")["restartCount"],
            0,
            "{name}"
        );
    }
    assert_eq!(cluster.kubelet.pods_restarted_whole(), 0);
    let noted = cluster
        .api
        .list(Resource::Event, Some(NAMESPACE), &Default::default())
        .into_iter()
        .filter(|e| e["reason"] == "ExitCodeReported")
        .count();
    assert_eq!(noted, 3);
    let event = cluster.event("ExitCodeReported").unwrap();
    assert!(
        event["note"]
            .as_str()
            .is_some_and(|n| n.starts_with("Container app exited with code ")),
        "{event}"
    );
}

/// Native sidecars (init containers with `restartPolicy: Always`): in
/// standalone mode they are recreated like any container, in the CRR's
/// order, even in a Pod whose own policy is Never (kubelet starts a sidecar
/// again whatever it says); kruise's webhook refuses them.
pub(super) async fn native_sidecars_are_recreated_like_any_container(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    let mut proxy = ContainerSpec::sidecar("proxy");
    proxy.pre_stop = Some(json!({"exec": {"command": ["sleep", "1"]}}));
    let meshed = PodSpec::new("meshed", vec![proxy, ContainerSpec::graceful("app")]);
    let mut never = PodSpec::new(
        "never",
        vec![
            ContainerSpec::sidecar("proxy"),
            ContainerSpec::graceful("app"),
        ],
    );
    never.restart_policy = RestartPolicy::Never;
    cluster.kubelet.run_pod(meshed).await;
    cluster.kubelet.run_pod(never).await;
    let sidecar = |pod: &Value| {
        pod["status"]["initContainerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|c| c["name"] == "proxy"))
            .cloned()
            .unwrap_or_else(|| panic!("no proxy in {pod}"))
    };
    let before = sidecar(&cluster.pod("meshed"));
    let ordered = json!({"orderedRecreate": true});
    if mode.mode == Mode::Kruise {
        let spec = json!({"podName": "meshed", "containers": [{"name": "proxy"}, {"name": "app"}], "strategy": ordered});
        let refused = cluster
            .api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": "crr-meshed"}, "spec": spec}),
            )
            .unwrap_err();
        assert!(
            refused
                .message
                .contains("not found proxy containerStatus in Pod Status"),
            "{refused:?}"
        );
        assert_eq!(sidecar(&cluster.pod("meshed"))["restartCount"], 0);
        return;
    }
    cluster.create(
        "crr-meshed",
        "meshed",
        &["proxy", "app"],
        ordered,
        json!({}),
    );
    cluster.create("crr-never", "never", &["proxy"], Value::Null, json!({}));
    let done = cluster
        .completed("crr-meshed", Duration::from_secs(60))
        .await;
    assert_eq!(
        states(&done),
        json!([{"name": "proxy", "phase": "Succeeded", "isKilled": true},
               {"name": "app", "phase": "Succeeded", "isKilled": true}])
    );
    let pod = cluster.kubelet.wait_ready("meshed").await;
    let after = sidecar(&pod);
    assert_eq!(after["restartCount"], 1, "{after}");
    assert_ne!(after["containerID"], before["containerID"]);
    assert_eq!(
        after["lastState"]["terminated"]["reason"],
        "ContainerRecreateRequest"
    );
    assert_eq!(container_status(&pod, "app")["restartCount"], 1);
    // In order: the sidecar was back before the app was stopped.
    let sidecar_done = seconds(&after["lastState"]["terminated"]["finishedAt"]);
    assert!(sidecar_done <= finished_at(&pod, "app"));
    let killing = cluster
        .api
        .list(Resource::Event, Some(NAMESPACE), &Default::default())
        .into_iter()
        .find(|e| {
            e["reason"] == "Killing"
                && e["regarding"]["name"] == "meshed"
                && e["note"].as_str().is_some_and(|n| n.contains("proxy"))
        })
        .expect("a Killing Event for the sidecar");
    assert_eq!(
        killing["regarding"]["fieldPath"],
        "spec.initContainers{proxy}"
    );

    let done = cluster
        .completed("crr-never", Duration::from_secs(60))
        .await;
    assert_eq!(
        states(&done),
        json!([{"name": "proxy", "phase": "Succeeded", "isKilled": true}])
    );
    let pod = cluster.kubelet.wait_ready("never").await;
    assert_eq!(sidecar(&pod)["restartCount"], 1);
    assert_eq!(container_status(&pod, "app")["restartCount"], 0);
}

/// A sleep-only preStop (issue 15, defect 2). The webhook copies it as
/// `preStop: {}` (kruise's ProbeHandler has no `sleep`), and the container's
/// own hook, which kubelet keeps in its annotation, is honoured: the old
/// container stops no sooner than its 3 s sleep allows.
pub(super) async fn a_sleep_pre_stop_is_honoured(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    let mut app = ContainerSpec::graceful("app");
    app.pre_stop = Some(json!({"sleep": {"seconds": 3}}));
    cluster
        .kubelet
        .run_pod(PodSpec::new("podsleep", vec![app]))
        .await;
    cluster.create("crr-sleep", "podsleep", &["app"], Value::Null, json!({}));
    let created = cluster.accepted("crr-sleep").await;
    assert_eq!(created["spec"]["containers"][0]["preStop"], json!({}));
    let done = cluster
        .completed("crr-sleep", Duration::from_secs(30))
        .await;
    let pod = cluster.kubelet.wait_ready("podsleep").await;
    assert_recreated(&done, &pod, &["app"]);
    let after = finished_at(&pod, "app") - seconds(&created["metadata"]["creationTimestamp"]);
    assert!(
        after >= 3,
        "the app stopped {after}s after the CRR was created: its 3 s sleep was skipped"
    );
}

/// A failing exec preStop that prints 3 000 bytes (issue 15, defect 5): the
/// FailedPreStopHook Event is recorded, its note cut to the 1 024 bytes
/// events.k8s.io takes (the fake API server refuses longer ones, as the real
/// one does), and the container is still recreated.
pub(super) async fn a_failed_hook_with_long_output_is_recorded_cut_to_size(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    let mut app = ContainerSpec::graceful("app");
    let noisy = "head -c 3000 /dev/zero | tr '\\0' x; exit 3";
    app.pre_stop = Some(json!({"exec": {"command": ["sh", "-c", noisy]}}));
    cluster
        .kubelet
        .run_pod(PodSpec::new("podnoisy", vec![app]))
        .await;
    cluster.create("crr-noisy", "podnoisy", &["app"], Value::Null, json!({}));
    let done = cluster
        .completed("crr-noisy", Duration::from_secs(30))
        .await;
    let pod = cluster.kubelet.wait_ready("podnoisy").await;
    assert_recreated(&done, &pod, &["app"]);
    let event = wait_for(Duration::from_secs(5), || {
        cluster.event("FailedPreStopHook")
    })
    .await
    .expect("a FailedPreStopHook Event");
    let note = event["note"].as_str().unwrap();
    assert!(
        note.len() <= 1024 && note.ends_with(" ..."),
        "{} bytes: {note}",
        note.len()
    );
    assert!(
        note.contains("xxxxxxxx"),
        "the hook's output is in the note: {note}"
    );
}

/// An empty unready-acquired stamp is none (issue 15, defect 4): kruise
/// waits for the stamp (standalone writes it itself); the container is
/// recreated, and the CRR does not end with "failed to parse unready time".
pub(super) async fn an_empty_unready_stamp_counts_as_none(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(app_and_sidecar("podstamp")).await;
    let crr = json!({
        "metadata": {
            "name": "crr-stamp",
            "annotations": {"crr.apps.kruise.io/unready-acquired": ""},
        },
        "spec": {
            "podName": "podstamp",
            "containers": [{"name": "app"}],
            "strategy": {"unreadyGracePeriodSeconds": 1},
        },
    });
    cluster
        .api
        .create(Resource::Crr, NAMESPACE, crr)
        .expect("create CRR");
    let done = cluster
        .completed("crr-stamp", Duration::from_secs(30))
        .await;
    assert_eq!(done["status"]["phase"], "Completed", "{done}");
    assert!(done["status"]["message"].is_null(), "{done}");
    let pod = cluster.kubelet.wait_ready("podstamp").await;
    assert_recreated(&done, &pod, &["app"]);
}

/// kubelet, through crr-proxy, learns why the app restarted; containerd's
/// own answer is untouched, and the record outlives the proxy.
pub(super) async fn the_pod_says_why_its_container_restarted(mode: Setup) {
    let cluster = Cluster::new(mode).await;
    cluster.kubelet.run_pod(app_and_sidecar("why")).await;
    cluster.create("crr-why", "why", &["app"], Value::Null, json!({}));
    let done = cluster.completed("crr-why", Duration::from_secs(30)).await;
    let message = format!("recreated by ContainerRecreateRequest {NAMESPACE}/crr-why");
    let pod = wait_for(Duration::from_secs(5), || {
        Some(cluster.pod("why")).filter(|pod| {
            container_status(pod, "app")["lastState"]["terminated"]["reason"]
                == "ContainerRecreateRequest"
        })
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "lastState: {}",
            container_status(&cluster.pod("why"), "app")
        )
    });
    let app = container_status(&pod, "app");
    assert_eq!(app["lastState"]["terminated"]["message"], message);
    // What the agent counted (once its completing write has returned to it).
    let succeeded = r#"crr_proxy_crr_recreations_total{outcome="succeeded"}"#;
    cluster.metric_reaches(succeeded, 1.0).await;
    assert_eq!(
        cluster.metric(r#"crr_proxy_crr_recreations_total{outcome="failed"}"#),
        0.0
    );
    cluster
        .metric_reaches("crr_proxy_crr_seen_to_stopped_seconds_count", 1.0)
        .await;
    let seen_to_stopped = cluster.metric("crr_proxy_crr_seen_to_stopped_seconds_sum");
    assert!(
        seen_to_stopped > 0.0 && seen_to_stopped < 5.0,
        "{seen_to_stopped}"
    );
    assert_eq!(
        cluster.metric("crr_proxy_prestop_hook_duration_seconds_count"),
        0.0
    );
    assert!(cluster.metric("crr_proxy_crr_reconciles_total") >= 2.0);
    assert!(container_status(&pod, "sidecar")["lastState"].is_null());
    // The scenarios run with a 410 every few watch events: this one relisted.
    assert!(cluster.api.watches_expired() > 0);

    let old = done["spec"]["containers"][0]["statusContext"]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let new = app["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let status = |client: crr_proxy::cri::RuntimeClient, id: String| async move {
        let mut client = client;
        client
            .container_status(ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap()
    };
    let direct = || support::client(&cluster.ctrd.endpoint());
    // containerd still says what it saw: a clean exit on SIGTERM.
    let runtime = status(direct(), old.clone()).await;
    assert_eq!(
        (runtime.reason.as_str(), runtime.message.as_str()),
        ("Completed", "")
    );
    let mut proxied = status(cluster.proxy.client(), old.clone()).await;
    assert_eq!(proxied.reason, "ContainerRecreateRequest");
    assert_eq!(proxied.message, message);
    proxied.reason = runtime.reason.clone();
    proxied.message = runtime.message.clone();
    assert_eq!(proxied, runtime, "only reason and message differ");
    assert_eq!(
        status(cluster.proxy.client(), new.clone()).await,
        status(direct(), new).await
    );

    // A new crr-proxy reads the record back; without the record, no rewrite.
    let reopened = Arc::new(Recreated::open(&cluster.recreated_file).unwrap());
    let routes = Routes {
        runtime: cluster.ctrd.endpoint(),
        image: None,
    };
    let restarted = ProxyUnderTest::serve(Proxy::new(routes.clone()).with_reasons(reopened));
    assert_eq!(
        status(restarted.client(), old.clone()).await.message,
        message
    );
    let plain = ProxyUnderTest::serve(Proxy::new(routes));
    assert_eq!(status(plain.client(), old).await.reason, "Completed");
}
