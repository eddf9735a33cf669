//! What is refused or left alone: bad and hostile CRRs with the webhook's
//! outcomes, CRRs of other nodes, and kruise mode standing aside for
//! kruise-daemon.

use super::*;

/// Kruise mode on a node where kruise-daemon turns up: the agent sees its
/// Pod and stands aside, so a CRR is done once, by kruise-daemon (one kill,
/// no write or Killing Event of crr-proxy's), and `/metrics` says so; once
/// kruise-daemon is kept off the node the agent does its CRRs again.
pub(super) async fn kruise_stands_aside_while_kruise_daemon_runs_on_the_node() {
    let cluster = Cluster::new(Mode::Kruise).await;
    cluster
        .kubelet
        .run_pod(PodSpec::new("web", vec![ContainerSpec::graceful("app")]))
        .await;
    assert_eq!(cluster.metric("crr_proxy_kruise_daemon_on_node"), 0.0);
    let kruise_daemon = roles::KruiseDaemon::start(&cluster.api, cluster.cri.clone(), NODE);
    wait_for(Duration::from_secs(10), || {
        (cluster.metric("crr_proxy_kruise_daemon_on_node") == 1.0).then_some(())
    })
    .await
    .expect("the agent saw kruise-daemon");
    cluster.create("by-kruise-daemon", "web", &["app"], Value::Null, json!({}));
    cluster
        .completed("by-kruise-daemon", Duration::from_secs(30))
        .await;
    let pod = wait_for(Duration::from_secs(30), || {
        Some(cluster.pod("web")).filter(|p| container_status(p, "app")["restartCount"] == 1)
    })
    .await
    .expect("restarted once");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(kruise_daemon.kills(), 1);
    assert_eq!(
        container_status(&cluster.pod("web"), "app")["restartCount"],
        1,
        "{pod}"
    );
    let ours = |reason: &str| {
        cluster
            .api
            .list(Resource::Event, Some(NAMESPACE), &Default::default())
            .into_iter()
            .filter(|e| e["reason"] == reason && e["reportingController"] == agent::REPORTER)
            .count()
    };
    assert_eq!(ours("Killing"), 0);
    let node_writes = cluster
        .api
        .writes()
        .into_iter()
        .filter(|w| {
            w.path.contains("/containerrecreaterequests/")
                && w.user.as_deref() == Some(&*format!("crr-proxy:node:{NODE}"))
        })
        .count();
    assert_eq!(node_writes, 0);

    // kruise-daemon kept off the node: the agent takes up its CRRs again.
    drop(kruise_daemon);
    wait_for(Duration::from_secs(10), || {
        (cluster.metric("crr_proxy_kruise_daemon_on_node") == 0.0).then_some(())
    })
    .await
    .expect("the agent saw kruise-daemon go");
    cluster.kubelet.wait_ready("web").await;
    cluster.create("by-crr-proxy", "web", &["app"], Value::Null, json!({}));
    let done = cluster
        .completed("by-crr-proxy", Duration::from_secs(60))
        .await;
    assert_eq!(
        states(&done),
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
    );
    assert_eq!(ours("Killing"), 1);
}

pub(super) async fn bad_crrs_get_their_documented_outcome_and_delay_no_one() {
    let cluster = Cluster::new(Mode::Kruise).await;
    let pod = cluster.kubelet.run_pod(app_and_sidecar("pod6")).await;
    // The baseline, in this run: a good CRR of the same Pod on its own.
    let alone = Instant::now();
    cluster.create("baseline", "pod6", &["sidecar"], Value::Null, json!({}));
    cluster.completed("baseline", Duration::from_secs(60)).await;
    let alone = alone.elapsed();
    // The webhook refuses these at creation, with kruise's messages.
    let refused = |containers: Value, message: &str| {
        let error = cluster
            .api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": "bad"}, "spec": {"podName": "pod6", "containers": containers}}),
            )
            .unwrap_err();
        assert_eq!((error.code, error.message.as_str()), (400, message));
    };
    refused(json!([{"name": "nope"}]), "container nope not found in Pod");
    refused(
        json!([{"name": "app"}, {"name": "app"}]),
        "can not recreate app multi times",
    );

    // Written past the webhook (say, before it was installed), with the labels
    // by hand: the agent completes them with kruise's messages.
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let raw = |name: &str, status_context: Value| {
        let labels = json!({"crr.apps.kruise.io/node-name": NODE, "crr.apps.kruise.io/active": "true",
                            "crr.apps.kruise.io/pod-uid": uid});
        let mut container = json!({"name": "app"});
        if !status_context.is_null() {
            container["statusContext"] = status_context;
        }
        json!({"metadata": {"name": name, "labels": labels},
               "spec": {"podName": "pod6", "containers": [container], "strategy": {"failurePolicy": "Fail"}}})
    };
    let bad = [
        (
            "no-context",
            Value::Null,
            "failed to find runtime service: no statusContext or empty containerID in app container",
        ),
        (
            "foreign",
            json!({"containerID": "docker://abc", "restartCount": 0}),
            "failed to find runtime service: not found runtime service for docker in daemon",
        ),
    ];
    for (name, context, _) in &bad {
        cluster
            .api
            .create_unchecked(Resource::Crr, NAMESPACE, raw(name, context.clone()))
            .unwrap();
    }
    // A CRR for a Pod on another node is not ours: it is never touched.
    let on_b = cluster
        .api
        .create(
            Resource::Pod,
            NAMESPACE,
            json!({"metadata": {"name": "pod-on-b"}, "spec": {"nodeName": "node-b"}}),
        )
        .unwrap();
    let other = json!({"metadata": {"name": "elsewhere", "labels": {"crr.apps.kruise.io/node-name": "node-b",
                        "crr.apps.kruise.io/active": "true", "crr.apps.kruise.io/pod-uid": on_b["metadata"]["uid"]}},
                       "spec": {"podName": "pod-on-b", "containers": [{"name": "app",
                        "statusContext": {"containerID": "containerd://x", "restartCount": 0}}]}});
    cluster
        .api
        .create_unchecked(Resource::Crr, NAMESPACE, other)
        .unwrap();
    // Among them, a good CRR of this node takes no longer than the
    // baseline did alone (with room for a busy machine).
    let among = Instant::now();
    cluster.create("good", "pod6", &["app"], Value::Null, json!({}));
    cluster.completed("good", Duration::from_secs(60)).await;
    let among = among.elapsed();
    eprintln!("a good CRR alone: {alone:?}; among bad ones: {among:?}");
    assert!(
        among <= alone * 2 + Duration::from_secs(3),
        "the bad CRRs delayed the good one: {among:?}, against {alone:?} alone"
    );
    for (name, _, message) in bad {
        let done = cluster.completed(name, Duration::from_secs(10)).await;
        assert_eq!(done["status"]["message"], message);
    }
    assert!(
        cluster.crr("elsewhere").unwrap()["status"].is_null(),
        "a CRR of another node was touched"
    );
}

/// Creates a Pod object on `node` with no running containers.
pub(super) fn bare_pod(cluster: &Cluster, name: &str, node: &str) -> Value {
    let spec = json!({"nodeName": node, "containers": [{"name": "app", "image": "x"}]});
    cluster
        .api
        .create(
            Resource::Pod,
            NAMESPACE,
            json!({"metadata": {"name": name}, "spec": spec}),
        )
        .unwrap()
}

pub(super) async fn standalone_refusals_complete_with_the_webhooks_messages() {
    let cluster = Cluster::new(Mode::Standalone).await;
    cluster.kubelet.run_pod(app_and_sidecar("pod8")).await;
    let cases = [
        (
            "unknown",
            json!([{"name": "nope"}]),
            json!({}),
            "container nope not found in Pod",
        ),
        (
            "twice",
            json!([{"name": "app"}, {"name": "app"}]),
            json!({}),
            "can not recreate app multi times",
        ),
        (
            "policy",
            json!([{"name": "app"}]),
            json!({"failurePolicy": "Maybe"}),
            "unknown failurePolicy Maybe",
        ),
        (
            "preset",
            json!([{"name": "app", "statusContext": {"containerID": "containerd://x", "restartCount": 0}}]),
            json!({}),
            "preStop, ports, statusContext in container are ready-only fields",
        ),
    ];
    for (name, containers, strategy, _) in &cases {
        let spec = json!({"podName": "pod8", "containers": containers, "strategy": strategy});
        cluster
            .api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": name}, "spec": spec}),
            )
            .unwrap();
    }
    // A CRR for a Pod of another node: not this node's to accept.
    bare_pod(&cluster, "pod-on-b", "node-b");
    cluster.create("elsewhere", "pod-on-b", &["app"], Value::Null, json!({}));
    // A good one goes on meanwhile.
    cluster.create("good", "pod8", &["app"], Value::Null, json!({}));
    for (name, _, _, message) in &cases {
        let done = cluster.completed(name, Duration::from_secs(10)).await;
        assert_eq!(done["status"]["message"], *message, "{name}");
        // Never half-applied: the spec is as written, and the CRR is not active.
        assert!(
            done["spec"]["containers"][0]["statusContext"].is_null() || *name == "preset",
            "{name}"
        );
        let labels = &done["metadata"]["labels"];
        // What the webhook checks before it reads the Pod (here the
        // failurePolicy) is refused by the Lease holder, before any claim;
        // the containers' checks come after the Pod, on the Pod's node,
        // which labels the CRR.
        let node = if *name == "policy" {
            Value::Null
        } else {
            json!(NODE)
        };
        assert_eq!(labels["crr.apps.kruise.io/node-name"], node, "{name}");
        assert!(labels["crr.apps.kruise.io/active"].is_null(), "{name}");
    }
    let good = cluster.completed("good", Duration::from_secs(60)).await;
    assert_eq!(
        states(&good),
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
    );
    // Claimed for node-b by the Lease holder; node-b runs no crr-proxy here.
    let elsewhere = cluster.crr("elsewhere").unwrap();
    assert!(elsewhere["status"].is_null(), "{elsewhere:#}");
    assert_eq!(
        elsewhere["metadata"]["labels"],
        json!({"crr.apps.kruise.io/node-name": "node-b"}),
        "{elsewhere:#}"
    );
}

pub(super) async fn standalone_a_crr_before_the_containers_started_is_refused() {
    let cluster = Cluster::new(Mode::Standalone).await;
    bare_pod(&cluster, "early", NODE);
    cluster.create("too-early", "early", &["app"], Value::Null, json!({}));
    let done = cluster
        .completed("too-early", Duration::from_secs(10))
        .await;
    assert_eq!(
        done["status"]["message"],
        "not found app containerStatus in Pod Status"
    );
}

/// A hostile CRR: name, Pod, containers, strategy, more spec, and the
/// completion message expected (`None`: recreated).
pub(super) type HostileCase<'a> = (&'a str, &'a str, Value, Value, Value, Option<&'a str>);

/// Hostile CRRs in standalone mode: each gets its documented outcome, no
/// panic, and another Pod's CRR is not held up.
pub(super) async fn standalone_hostile_crrs_get_documented_outcomes() {
    let cluster = Cluster::new(Mode::Standalone).await;
    let pods = ["victim", "bystander"].map(|name| {
        PodSpec::new(
            name,
            vec![
                ContainerSpec::graceful("app"),
                ContainerSpec::graceful("sidecar"),
            ],
        )
    });
    for pod in pods {
        cluster.kubelet.run_pod(pod).await;
    }
    let mut hanger = ContainerSpec::graceful("app");
    hanger.pre_stop = Some(json!({"exec": {"command": ["sleep", "100000"]}}));
    cluster
        .kubelet
        .run_pod(PodSpec::new("hanger", vec![hanger]))
        .await;

    let many: Vec<Value> = (0..500).map(|i| json!({"name": format!("c{i}")})).collect();
    let one = json!([{"name": "app"}]);
    let max = i64::MAX;
    let cases: Vec<HostileCase<'_>> = vec![
        (
            "huge-list",
            "victim",
            json!(many),
            json!({}),
            json!({}),
            Some("container c0 not found in Pod"),
        ),
        (
            "unknown-name",
            "victim",
            json!([{"name": "nope"}]),
            json!({}),
            json!({}),
            Some("container nope not found in Pod"),
        ),
        (
            "unicode-name",
            "victim",
            json!([{"name": "äpp-🚀"}]),
            json!({}),
            json!({}),
            Some("container äpp-🚀 not found in Pod"),
        ),
        (
            "no-containers",
            "victim",
            json!([]),
            json!({}),
            json!({}),
            Some("containers list can not be null"),
        ),
        (
            "twice",
            "victim",
            json!([{"name": "app"}, {"name": "app"}]),
            json!({}),
            json!({}),
            Some("can not recreate app multi times"),
        ),
        (
            "deadline-negative",
            "victim",
            one.clone(),
            json!({}),
            json!({"activeDeadlineSeconds": -1}),
            Some("activeDeadlineSeconds can not be less than 3s"),
        ),
        (
            "deadline-2",
            "victim",
            one.clone(),
            json!({}),
            json!({"activeDeadlineSeconds": 2}),
            Some("activeDeadlineSeconds can not be less than 3s"),
        ),
        (
            "grace-negative",
            "victim",
            one.clone(),
            json!({"terminationGracePeriodSeconds": -3}),
            json!({}),
            Some("terminationGracePeriodSeconds must be non-negative integer"),
        ),
        (
            "unready-negative",
            "victim",
            one.clone(),
            json!({"unreadyGracePeriodSeconds": -1}),
            json!({}),
            Some("unreadyGracePeriodSeconds must be non-negative integer"),
        ),
        (
            "policy",
            "victim",
            one.clone(),
            json!({"failurePolicy": "Sometimes"}),
            json!({}),
            Some("unknown failurePolicy Sometimes"),
        ),
        (
            "preset",
            "victim",
            json!([{"name": "app", "ports": [{"containerPort": 1}]}]),
            json!({}),
            json!({}),
            Some("preStop, ports, statusContext in container are ready-only fields"),
        ),
        (
            "deadline-huge",
            "victim",
            one.clone(),
            json!({}),
            json!({"activeDeadlineSeconds": max}),
            None,
        ),
        (
            "grace-huge",
            "victim",
            one.clone(),
            json!({"terminationGracePeriodSeconds": max}),
            json!({}),
            None,
        ),
        (
            "min-started-negative",
            "victim",
            one.clone(),
            json!({"minStartedSeconds": -5}),
            json!({}),
            None,
        ),
        (
            "ttl-negative",
            "victim",
            one.clone(),
            json!({}),
            json!({"ttlSecondsAfterFinished": -1}),
            None,
        ),
        (
            "min-started-huge",
            "victim",
            one.clone(),
            json!({"minStartedSeconds": i32::MAX}),
            json!({"activeDeadlineSeconds": 4}),
            Some("recreating has exceeded the activeDeadlineSeconds"),
        ),
        (
            "unready-huge",
            "victim",
            one.clone(),
            json!({"unreadyGracePeriodSeconds": max}),
            json!({"activeDeadlineSeconds": 3}),
            Some("recreating has exceeded the activeDeadlineSeconds"),
        ),
        (
            "hook-hangs",
            "hanger",
            one.clone(),
            json!({"terminationGracePeriodSeconds": 2}),
            json!({}),
            None,
        ),
        (
            "no-such-pod",
            "ghost",
            one.clone(),
            json!({}),
            json!({}),
            None,
        ),
        (
            "empty-pod-name",
            "",
            one.clone(),
            json!({}),
            json!({}),
            None,
        ),
    ];
    for (name, pod, containers, strategy, extra, _) in &cases {
        let mut spec = json!({"podName": pod, "containers": containers, "strategy": strategy});
        support::patch::merge_patch(&mut spec, extra);
        cluster
            .api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": name}, "spec": spec}),
            )
            .unwrap();
    }
    // Another Pod's CRR, created last, is not held up by any of them.
    let started = std::time::Instant::now();
    cluster.create(
        "bystander-crr",
        "bystander",
        &["app"],
        Value::Null,
        json!({}),
    );
    cluster
        .completed("bystander-crr", Duration::from_secs(20))
        .await;
    eprintln!("bystander CRR completed in {:?}", started.elapsed());

    for (name, pod, _, _, _, expected) in &cases {
        if ["ghost", ""].contains(pod) {
            // No node can take these: the Lease holder (this node) ends
            // them with the webhook's message, and claims them for no node.
            let done = cluster.completed(name, Duration::from_secs(10)).await;
            let message = if pod.is_empty() {
                "podName can not be empty".to_owned()
            } else {
                format!("no found Pod named {pod}")
            };
            assert_eq!(done["status"]["message"], message, "{name}");
            assert!(done["metadata"]["labels"].is_null(), "{name}: {done:#}");
            continue;
        }
        if *name == "ttl-negative" {
            wait_for(Duration::from_secs(60), || {
                cluster.crr(name).is_none().then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("{name} not deleted"));
            continue;
        }
        let done = cluster.completed(name, Duration::from_secs(90)).await;
        match expected {
            Some(message) => assert_eq!(done["status"]["message"], *message, "{name}"),
            // Succeeded; not necessarily killed by this CRR, since an earlier
            // CRR of the same Pod may have recreated the container already.
            None => {
                let state = &states(&done)[0];
                assert_eq!(
                    (&state["name"], &state["phase"]),
                    (&json!("app"), &json!("Succeeded")),
                    "{name}"
                );
            }
        }
    }
}
