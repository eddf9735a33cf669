//! The fake API server behaves as the real one where the agent depends on
//! it: checked through the same kube client the agent uses.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use crr_proxy::crr::{ContainerRecreateRequest, ContainerRecreateRequestStatus, Phase};
use futures_util::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::apiserver::{FakeApiServer, Resource, Selector};
use support::cluster::Cluster;

/// Where a rule is checked: the fake API server, or a namespace of a real
/// kube-apiserver v1.37 (support::cluster) with crr-proxy's CRD, which
/// `the_rules_hold_on_the_real_api_server` runs the same scenarios on.
struct Target {
    client: kube::Client,
    /// A client that does not retry 429, 503 and 504.
    raw: kube::Client,
    ns: String,
    _fake: Option<FakeApiServer>,
}

impl Target {
    async fn fake() -> Self {
        let server = FakeApiServer::start().await;
        Self {
            client: server.client(),
            raw: server.client_without_retries(),
            ns: "default".into(),
            _fake: Some(server),
        }
    }

    /// A fresh namespace `ns` of the real cluster.
    async fn real(cluster: &mut Cluster, ns: &str) -> Self {
        tokio::task::block_in_place(|| cluster.namespace(ns)).unwrap();
        let client = cluster.client().await.unwrap();
        Self {
            client: client.clone(),
            raw: client,
            ns: ns.into(),
            _fake: None,
        }
    }
}

/// The scenarios above that use nothing but the API, on a real
/// kube-apiserver: the fake must agree with it. (The list across all
/// namespaces in the first one sees the CRRs of the ones before it, so it
/// runs first.)
#[tokio::test(flavor = "multi_thread")]
async fn the_rules_hold_on_the_real_api_server() {
    let mut cluster = tokio::task::block_in_place(|| {
        let cluster = Cluster::start().unwrap();
        cluster.install("crd/crd.yaml").unwrap();
        cluster
    });
    create_get_list_with_selectors_and_status_subresource_on(
        &Target::real(&mut cluster, "lists").await,
    )
    .await;
    a_stale_resource_version_is_a_conflict_on(&Target::real(&mut cluster, "conflicts").await).await;
    selectors_follow_the_real_servers_rules_on(&Target::real(&mut cluster, "selectors").await)
        .await;
    a_json_patch_applies_only_when_its_tests_hold_on(&Target::real(&mut cluster, "patches").await)
        .await;
    unknown_fields_are_pruned_or_refused_on(&Target::real(&mut cluster, "pruning").await).await;
}

fn crr(name: &str, labels: serde_json::Value) -> ContainerRecreateRequest {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "ContainerRecreateRequest",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podName": "web-0", "containers": [{"name": "app"}]},
        "status": {"phase": "Completed"}
    }))
    .unwrap()
}

#[tokio::test]
async fn create_get_list_with_selectors_and_status_subresource() {
    create_get_list_with_selectors_and_status_subresource_on(&Target::fake().await).await;
}

async fn create_get_list_with_selectors_and_status_subresource_on(t: &Target) {
    let api: Api<ContainerRecreateRequest> = Api::namespaced(t.client.clone(), &t.ns);
    let created = api
        .create(&PostParams::default(), &crr("a", json!({"node": "n1"})))
        .await
        .unwrap();
    // Status is not set on create; uid, creationTimestamp and resourceVersion are.
    assert!(created.status.is_none());
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    api.create(&PostParams::default(), &crr("b", json!({"node": "n2"})))
        .await
        .unwrap();

    let listed = api
        .list(&ListParams::default().labels("node=n1"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.name.as_deref(), Some("a"));
    let all: Api<ContainerRecreateRequest> = Api::all(t.client.clone());
    assert_eq!(
        all.list(&ListParams::default().labels("node!=n1"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // The status subresource changes status only; the main resource never does.
    let mut fresh = api.get("a").await.unwrap();
    fresh.status = Some(ContainerRecreateRequestStatus {
        phase: Phase::Recreating,
        ..Default::default()
    });
    fresh.spec.pod_name = "ignored".into();
    fresh.metadata.labels = Some([("ignored".to_owned(), "too".to_owned())].into());
    let updated = api
        .replace_status("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_eq!(updated.status.unwrap().phase, Phase::Recreating);
    assert_eq!(updated.spec.pod_name, "web-0");
    assert!(!updated.metadata.labels.unwrap().contains_key("ignored"));
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node": null, "x": "y"}}, "status": {"phase": "Completed"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase, Phase::Recreating);
    assert_eq!(
        patched
            .metadata
            .labels
            .unwrap()
            .get("x")
            .map(String::as_str),
        Some("y")
    );
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    a_stale_resource_version_is_a_conflict_on(&Target::fake().await).await;
}

async fn a_stale_resource_version_is_a_conflict_on(t: &Target) {
    let api: Api<ContainerRecreateRequest> = Api::namespaced(t.client.clone(), &t.ns);
    let first = api
        .create(&PostParams::default(), &crr("a", json!({})))
        .await
        .unwrap();
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Pending"}})),
    )
    .await
    .unwrap();
    let mut stale = first.clone();
    stale.status = Some(ContainerRecreateRequestStatus::default());
    let error = api
        .replace_status("a", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    match error {
        kube::Error::Api(status) => assert_eq!(status.code, 409),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn watches_resume_see_objects_leave_a_selector_and_relist_after_410() {
    let server = FakeApiServer::start().await;
    let api: Api<ContainerRecreateRequest> = Api::all(server.client());
    let ns: Api<ContainerRecreateRequest> = Api::namespaced(server.client(), "default");
    ns.create(&PostParams::default(), &crr("a", json!({"active": "true"})))
        .await
        .unwrap();
    let mut events = watcher(api, watcher::Config::default().labels("active=true")).boxed();
    async fn next(
        events: &mut futures_util::stream::BoxStream<
            'static,
            watcher::Result<watcher::Event<ContainerRecreateRequest>>,
        >,
    ) -> watcher::Event<ContainerRecreateRequest> {
        tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("watch event in time")
            .unwrap()
            .unwrap()
    }
    assert!(matches!(next(&mut events).await, watcher::Event::Init));
    match next(&mut events).await {
        watcher::Event::InitApply(obj) => assert_eq!(obj.metadata.name.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(next(&mut events).await, watcher::Event::InitDone));

    ns.create(&PostParams::default(), &crr("b", json!({"active": "true"})))
        .await
        .unwrap();
    match next(&mut events).await {
        watcher::Event::Apply(obj) => assert_eq!(obj.metadata.name.as_deref(), Some("b")),
        other => panic!("{other:?}"),
    }
    // Removing the label takes it out of the watch, as a deletion.
    ns.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"active": null}}})),
    )
    .await
    .unwrap();
    match next(&mut events).await {
        watcher::Event::Delete(obj) => assert_eq!(obj.metadata.name.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }

    // Compaction ends the watch; resuming gets 410 Gone and the watcher relists.
    server.compact();
    ns.create(&PostParams::default(), &crr("c", json!({"active": "true"})))
        .await
        .unwrap();
    let mut relisted = Vec::new();
    let mut saw_gone = false;
    loop {
        let item = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .unwrap()
            .unwrap();
        match item {
            Err(watcher::Error::WatchError(status)) if status.code == 410 => saw_gone = true,
            Err(other) => panic!("{other:?}"),
            Ok(watcher::Event::InitApply(obj)) => relisted.push(obj.metadata.name.unwrap()),
            Ok(watcher::Event::InitDone) => break,
            Ok(_) => {}
        }
    }
    assert!(saw_gone, "no 410 Gone before the relist");
    relisted.sort();
    assert_eq!(relisted, ["b", "c"]);
}

#[tokio::test]
async fn finalizers_delay_deletion_and_events_are_stored() {
    let server = FakeApiServer::start().await;
    let api: Api<ContainerRecreateRequest> = Api::namespaced(server.client(), "default");
    let mut obj = crr("a", json!({}));
    obj.metadata.finalizers = Some(vec!["x/y".into()]);
    api.create(&PostParams::default(), &obj).await.unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    let deleting = api.get("a").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("a").await.unwrap().is_none());

    let recorder = kube::runtime::events::Recorder::new(server.client(), "crr-proxy".into());
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        kind: Some("Pod".into()),
        api_version: Some("v1".into()),
        namespace: Some("default".into()),
        name: Some("web-0".into()),
        ..Default::default()
    };
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "Killing".into(),
        note: Some("Stopping container app".into()),
        action: "Killing".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let stored = server.list(Resource::Event, Some("default"), &Selector::default());
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["reason"], "Killing");
    assert_eq!(stored[0]["series"]["count"], 2);
}

/// kube-runtime's Recorder, against the fake's events.k8s.io validation: a
/// first Event is created, a repeat is patched with its series (count 2),
/// and the Events the real server refuses are refused.
#[tokio::test]
async fn events_are_validated_on_create_and_on_their_series_patch() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let server = FakeApiServer::start().await;
    let reporter = Reporter {
        controller: "crr-proxy".into(),
        instance: Some("node-a".into()),
    };
    let recorder = Recorder::new(server.client(), reporter);
    let pod = ObjectReference {
        kind: Some("Pod".into()),
        api_version: Some("v1".into()),
        namespace: Some("default".into()),
        name: Some("web-0".into()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "Killing".into(),
        note: Some("Stopping container app".into()),
        action: "Killing".into(),
        secondary: None,
    };
    recorder.publish(&event, &pod).await.unwrap();
    recorder.publish(&event, &pod).await.unwrap();
    let stored = server.list(Resource::Event, Some("default"), &Selector::default());
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["series"]["count"], 2, "{}", stored[0]);

    let base = json!({"metadata": {"name": "e1"}, "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "crr-proxy", "reportingInstance": "node-a", "action": "Killing",
        "reason": "Killing", "type": "Normal", "note": "n"});
    let refused = |change: serde_json::Value| {
        let mut event = base.clone();
        support::patch::merge_patch(&mut event, &change);
        server
            .create(Resource::Event, "default", event)
            .expect_err("refused")
            .message
    };
    assert!(refused(json!({"note": "x".repeat(1025)})).starts_with("note: Too long"));
    assert!(refused(json!({"reportingInstance": null})).starts_with("reportingInstance: Required"));
    assert!(refused(json!({"eventTime": null})).starts_with("eventTime: Required"));
    assert!(refused(json!({"type": "Loud"})).starts_with("type: Unsupported value"));
    assert!(
        refused(json!({"series": {"count": 1, "lastObservedTime": "2026-01-01T00:00:00.000000Z"}}))
            .starts_with("series.count")
    );
    server
        .create(Resource::Event, "default", base.clone())
        .unwrap();
}

/// CRR versions as a real API server serves them with each CRD
/// (tests/support/versions.rs): discovery, the v1alpha1 view of v1beta1
/// storage with and without kruise's conversion webhook (crr-v1beta1.md §3,
/// its lossy cases included), and v1beta1's enums and minimums.
#[tokio::test]
async fn crr_versions_convert_as_kruises_webhook_and_none_do() {
    use kube::api::{ApiResource, DynamicObject};
    use support::apiserver::{Conversion, CrrVersions};
    let resource = |version: &str| ApiResource {
        group: "apps.kruise.io".into(),
        version: version.into(),
        api_version: format!("apps.kruise.io/{version}"),
        kind: "ContainerRecreateRequest".into(),
        plural: "containerrecreaterequests".into(),
    };
    let lists = |list: k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList| {
        list.resources
            .iter()
            .any(|r| r.name == "containerrecreaterequests")
    };
    for conversion in [Conversion::Webhook, Conversion::None] {
        let server = FakeApiServer::start().await;
        let client = server.client();
        assert!(!lists(
            client
                .list_api_group_resources("apps.kruise.io/v1beta1")
                .await
                .unwrap()
        ));
        server.set_crr_versions(CrrVersions::Both(conversion));
        assert!(lists(
            client
                .list_api_group_resources("apps.kruise.io/v1beta1")
                .await
                .unwrap()
        ));
        assert!(lists(
            client
                .list_api_group_resources("apps.kruise.io/v1alpha1")
                .await
                .unwrap()
        ));
        let beta =
            Api::<DynamicObject>::namespaced_with(client.clone(), "default", &resource("v1beta1"));
        let alpha =
            Api::<DynamicObject>::namespaced_with(client.clone(), "default", &resource("v1alpha1"));
        let created: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "c"}, "spec": {"podName": "web-0", "containers": [{"name": "app"}]}}))
        .unwrap();
        beta.create(&PostParams::default(), &created).await.unwrap();
        let status = json!({"status": {"phase": "Recreating",
            "containerStatusSnapshot": [{"name": "app", "ready": true, "restartCount": 3, "containerID": "containerd://abc"}],
            "conditions": [
                {"type": "PreRecreateGrace", "status": "True", "lastTransitionTime": "2026-06-01T10:00:00Z",
                 "reason": "PreRecreateGrace", "message": "m"},
                {"type": "Other", "status": "False", "lastTransitionTime": "2026-06-01T10:00:00Z",
                 "reason": "Other", "message": "kept only in v1beta1"}]}});
        beta.patch_status("c", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();

        let seen = alpha.get("c").await.unwrap();
        let annotations = seen.metadata.annotations.clone().unwrap_or_default();
        assert!(
            seen.data["status"]["conditions"].is_null()
                && seen.data["status"]["containerStatusSnapshot"].is_null()
        );
        match conversion {
            Conversion::Webhook => {
                assert_eq!(
                    annotations["crr.apps.kruise.io/sync-container-statuses"],
                    r#"[{"name":"app","ready":true,"restartCount":3,"containerID":"containerd://abc"}]"#
                );
                assert_eq!(
                    annotations["crr.apps.kruise.io/unready-acquired"],
                    "2026-06-01T10:00:00Z"
                );
            }
            Conversion::None => assert!(annotations.is_empty(), "{annotations:?}"),
        }
        // A v1alpha1 status write stores what v1alpha1 showed.
        let states = json!({"status": {"containerRecreateStates": [{"name": "app", "phase": "Recreating"}]}});
        alpha
            .patch_status("c", &PatchParams::default(), &Patch::Merge(&states))
            .await
            .unwrap();
        // crr-proxy's CRD defaults a state's isKilled, which a real API
        // server applies on every read from storage, through either version
        // (tests/real/rules.rs met it); kruise's CRD declares no default.
        for api in [&alpha, &beta] {
            let read = api.get("c").await.unwrap();
            let state = &read.data["status"]["containerRecreateStates"][0];
            match conversion {
                Conversion::None => assert_eq!(state["isKilled"], false, "{state}"),
                Conversion::Webhook => assert!(state.get("isKilled").is_none(), "{state}"),
            }
        }
        let stored = server.get(Resource::Crr, "default", "c").unwrap();
        assert_eq!(stored["apiVersion"], "apps.kruise.io/v1beta1");
        match conversion {
            Conversion::Webhook => {
                // The annotations leak into storage; the typed fields are
                // parsed back from them, and the other condition is lost.
                assert!(
                    stored["metadata"]["annotations"]["crr.apps.kruise.io/unready-acquired"]
                        .is_string()
                );
                assert_eq!(
                    stored["status"]["containerStatusSnapshot"][0]["restartCount"],
                    3
                );
                let types: Vec<&serde_json::Value> = stored["status"]["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| &c["type"])
                    .collect();
                assert_eq!(types, [&json!("PreRecreateGrace")], "{stored}");
            }
            Conversion::None => {
                assert!(
                    stored["status"]["containerStatusSnapshot"].is_null(),
                    "{stored}"
                );
                assert!(stored["status"]["conditions"].is_null(), "{stored}");
            }
        }
        // v1beta1 refuses what only v1alpha1's schema lets through.
        let refused = beta
            .patch_status(
                "c",
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": ""}})),
            )
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("Unsupported value"),
            "{refused}"
        );
        let negative = json!({"spec": {"ttlSecondsAfterFinished": -1}});
        let refused = beta
            .patch("c", &PatchParams::default(), &Patch::Merge(&negative))
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("greater than or equal to 0"),
            "{refused}"
        );
        alpha
            .patch_status(
                "c",
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": ""}})),
            )
            .await
            .unwrap();
    }
}

/// Discovery from the root (`/api`, `/apis`, each group-version), as
/// kubectl and kube-rs's `Discovery` walk it: what `kubectl get crr` and
/// the try-out's emulated cluster need. OpenKruise's workloads appear once
/// served.
#[tokio::test]
async fn discovery_from_the_root_lists_what_is_served() {
    let server = FakeApiServer::start().await;
    let find = |discovery: &kube::discovery::Discovery, group: &str, plural: &str| {
        discovery.groups().any(|g| {
            g.name() == group
                && g.recommended_resources()
                    .iter()
                    .any(|(r, _)| r.plural == plural)
        })
    };
    let discovery = kube::discovery::Discovery::new(server.client())
        .run()
        .await
        .unwrap();
    for (group, plural) in [
        ("", "pods"),
        ("", "nodes"),
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("apps", "statefulsets"),
        ("apps", "daemonsets"),
        ("policy", "poddisruptionbudgets"),
        ("apps.kruise.io", "containerrecreaterequests"),
        ("events.k8s.io", "events"),
        ("coordination.k8s.io", "leases"),
    ] {
        assert!(
            find(&discovery, group, plural),
            "{group}/{plural} not discovered"
        );
    }
    assert!(!find(&discovery, "apps.kruise.io", "clonesets"));
    server.serve_kruise_workloads();
    let discovery = kube::discovery::Discovery::new(server.client())
        .run()
        .await
        .unwrap();
    assert!(find(&discovery, "apps.kruise.io", "clonesets"));
}

/// Selectors as kube-apiserver parses them: set-based label selectors
/// select, a malformed one is a 400, and a field selector may name only the
/// fields the kind registers (a custom resource: its name and namespace).
#[tokio::test]
async fn selectors_follow_the_real_servers_rules() {
    selectors_follow_the_real_servers_rules_on(&Target::fake().await).await;
}

async fn selectors_follow_the_real_servers_rules_on(t: &Target) {
    let api: Api<ContainerRecreateRequest> = Api::namespaced(t.client.clone(), &t.ns);
    for (name, node) in [("a", "n1"), ("b", "n2"), ("c", "n3")] {
        api.create(&PostParams::default(), &crr(name, json!({"node": node})))
            .await
            .unwrap();
    }
    let names = |selector: &str| {
        let api = api.clone();
        let selector = selector.to_owned();
        async move {
            let list = api.list(&ListParams::default().labels(&selector)).await?;
            let mut names: Vec<String> = list
                .items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect();
            names.sort();
            Ok::<_, kube::Error>(names)
        }
    };
    assert_eq!(names("node in (n1, n3)").await.unwrap(), ["a", "c"]);
    assert_eq!(names("node notin (n1)").await.unwrap(), ["b", "c"]);
    assert_eq!(names("!node").await.unwrap(), Vec::<String>::new());
    assert_eq!(names("node,node!=n2").await.unwrap(), ["a", "c"]);
    // `()` is the set of the empty value.
    assert_eq!(names("node in ()").await.unwrap(), Vec::<String>::new());
    for bad in ["node in n1", "-bad=x", "node=a/b"] {
        match names(bad).await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 400, "{bad}: {status:?}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    let by_name = ListParams::default().fields("metadata.name=b");
    assert_eq!(api.list(&by_name).await.unwrap().items.len(), 1);
    let by_spec = ListParams::default().fields("spec.podName=web-0");
    match api.list(&by_spec).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 400);
            assert_eq!(status.message, "field label not supported: spec.podName");
        }
        other => panic!("{other:?}"),
    }
    // Pods register spec.nodeName; Leases nothing beyond the name.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(t.client.clone(), &t.ns);
    assert!(
        pods.list(&ListParams::default().fields("spec.nodeName=n1"))
            .await
            .is_ok()
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(t.client.clone(), &t.ns);
    assert!(
        leases
            .list(&ListParams::default().fields("spec.holderIdentity=x"))
            .await
            .is_err()
    );
    // A custom resource takes no strategic merge patch.
    let patch = json!({"metadata": {"labels": {"x": "y"}}});
    match api
        .patch("a", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 415),
        other => panic!("{other:?}"),
    }
    api.patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The names and resourceVersion of a raw CRR list with `query`, or the
/// error's code.
async fn list_crrs(server: &FakeApiServer, query: &str) -> Result<(u64, Vec<String>), u16> {
    let uri = format!(
        "/apis/apps.kruise.io/v1alpha1/namespaces/default/containerrecreaterequests?{query}"
    );
    let request = http::Request::get(uri).body(Vec::new()).unwrap();
    let list: serde_json::Value = match server.client_without_retries().request(request).await {
        Ok(list) => list,
        Err(kube::Error::Api(status)) => return Err(status.code),
        Err(other) => panic!("{query}: {other}"),
    };
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    Ok((rv, names))
}

#[test]
fn list_options_are_validated_as_the_real_server_validates_them() {
    use support::reads::Read;
    assert_eq!(Read::parse(None, None, false), Ok(Read::Latest));
    assert_eq!(Read::parse(Some("0"), None, false), Ok(Read::Cached));
    assert_eq!(
        Read::parse(Some("0"), Some("NotOlderThan"), false),
        Ok(Read::Cached)
    );
    assert_eq!(
        Read::parse(Some("7"), None, false),
        Ok(Read::NotOlderThan(7))
    );
    assert_eq!(
        Read::parse(Some("7"), Some("Exact"), false),
        Ok(Read::Exact(7))
    );
    assert_eq!(Read::parse(Some("0"), None, true), Ok(Read::Cached));
    let code = |rv, matching, continued| Read::parse(rv, matching, continued).map_err(|e| e.code);
    assert_eq!(code(None, Some("Exact"), false), Err(422));
    assert_eq!(code(Some("7"), Some("Exact"), true), Err(422));
    assert_eq!(code(Some("7"), Some("Newest"), false), Err(422));
    assert_eq!(code(Some("0"), Some("Exact"), false), Err(422));
    assert_eq!(code(Some("7"), None, true), Err(400));
    assert_eq!(code(Some("x"), None, false), Err(400));
}

#[tokio::test]
async fn lists_are_served_from_the_state_their_resource_version_names() {
    let server = FakeApiServer::start().await;
    let api: Api<ContainerRecreateRequest> = Api::namespaced(server.client(), "default");
    let lag = Duration::from_millis(1500);
    server.set_watches(support::apiserver::Watches {
        lag: [(Resource::Crr, lag)].into(),
        ..Default::default()
    });
    let rv_of = |c: ContainerRecreateRequest| -> u64 {
        c.metadata.resource_version.unwrap().parse().unwrap()
    };
    api.create(&PostParams::default(), &crr("a", json!({})))
        .await
        .unwrap();
    let b = rv_of(
        api.create(&PostParams::default(), &crr("b", json!({})))
            .await
            .unwrap(),
    );
    tokio::time::sleep(lag + Duration::from_millis(100)).await;
    let c = rv_of(
        api.create(&PostParams::default(), &crr("c", json!({})))
            .await
            .unwrap(),
    );

    // A quorum read is current; `0` is the lagging cache's state.
    assert_eq!(
        list_crrs(&server, "").await,
        Ok((c, vec!["a".into(), "b".into(), "c".into()]))
    );
    assert_eq!(
        list_crrs(&server, "resourceVersion=0").await,
        Ok((b, vec!["a".into(), "b".into()]))
    );
    assert_eq!(
        list_crrs(
            &server,
            &format!("resourceVersion={b}&resourceVersionMatch=Exact")
        )
        .await,
        Ok((b, vec!["a".into(), "b".into()]))
    );
    // Not older than c: the cache is waited for.
    let asked = std::time::Instant::now();
    let fresh = list_crrs(
        &server,
        &format!("resourceVersion={c}&resourceVersionMatch=NotOlderThan"),
    )
    .await;
    assert_eq!(fresh, Ok((c, vec!["a".into(), "b".into(), "c".into()])));
    assert!(
        asked.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        list_crrs(&server, "resourceVersionMatch=Exact").await,
        Err(422)
    );
    assert_eq!(
        list_crrs(&server, &format!("resourceVersion={}", c + 100)).await,
        Err(504)
    );

    // Pages are one snapshot: a deletion between them is not seen.
    server.set_watches(Default::default());
    let first = server
        .client()
        .request::<serde_json::Value>(
            http::Request::get("/apis/apps.kruise.io/v1alpha1/namespaces/default/containerrecreaterequests?limit=2")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    api.delete("c", &Default::default()).await.unwrap();
    let rest = list_crrs(&server, &format!("limit=2&continue={token}")).await;
    assert_eq!(rest, Ok((c, vec!["c".into()])));
    assert_eq!(
        list_crrs(&server, &format!("continue={token}&resourceVersion={c}")).await,
        Err(400)
    );

    // Once compacted, neither an exact version nor a continued list is served.
    server.compact();
    assert_eq!(
        list_crrs(
            &server,
            &format!("resourceVersion={b}&resourceVersionMatch=Exact")
        )
        .await,
        Err(410)
    );
    assert_eq!(
        list_crrs(&server, &format!("limit=2&continue={token}")).await,
        Err(410)
    );
}

#[tokio::test]
async fn a_watch_from_zero_starts_at_the_caches_state_and_bookmarks_come_when_asked() {
    let server = FakeApiServer::start().await;
    let api: Api<ContainerRecreateRequest> = Api::namespaced(server.client(), "default");
    let lag = Duration::from_secs(2);
    server.set_watches(support::apiserver::Watches {
        lag: [(Resource::Crr, lag)].into(),
        bookmarks: Some(Duration::from_millis(100)),
        ..Default::default()
    });
    api.create(&PostParams::default(), &crr("a", json!({})))
        .await
        .unwrap();
    tokio::time::sleep(lag).await;
    api.create(&PostParams::default(), &crr("b", json!({})))
        .await
        .unwrap();
    let seen = |params: kube::api::WatchParams| {
        let api = api.clone();
        async move {
            let mut seen = Vec::new();
            let mut events = api.watch(&params, "0").await.unwrap().boxed();
            let until = tokio::time::sleep(Duration::from_millis(1000));
            tokio::pin!(until);
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(Ok(kube::api::WatchEvent::Added(c))) => seen.push(c.metadata.name.unwrap()),
                        Some(Ok(kube::api::WatchEvent::Bookmark(_))) => seen.push("BOOKMARK".into()),
                        other => panic!("{other:?}"),
                    },
                    () = &mut until => return seen,
                }
            }
        }
    };
    let quiet = || kube::api::WatchParams::default().disable_bookmarks();
    // b is not in the cache yet.
    assert_eq!(seen(quiet()).await, ["a"]);
    server.set_watches(support::apiserver::Watches {
        bookmarks: Some(Duration::from_millis(100)),
        ..Default::default()
    });
    // Bookmarks come only to a watch that asks for them.
    assert_eq!(seen(quiet()).await, ["a", "b"]);
    let asked = seen(kube::api::WatchParams::default()).await;
    assert_eq!(asked[..2], ["a", "b"]);
    assert!(
        asked[2..].iter().all(|e| e == "BOOKMARK") && asked.len() > 3,
        "{asked:?}"
    );
}

#[tokio::test]
async fn a_json_patch_applies_only_when_its_tests_hold() {
    a_json_patch_applies_only_when_its_tests_hold_on(&Target::fake().await).await;
}

async fn a_json_patch_applies_only_when_its_tests_hold_on(t: &Target) {
    let api: Api<ContainerRecreateRequest> = Api::namespaced(t.client.clone(), &t.ns);
    let created = api
        .create(&PostParams::default(), &crr("a", json!({"node": "n1"})))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let json_patch = |ops: serde_json::Value| {
        let client = t.raw.clone();
        async move {
            let request = http::Request::patch(format!(
                "/apis/apps.kruise.io/v1alpha1/namespaces/{}/containerrecreaterequests/a",
                t.ns
            ))
            .header("content-type", "application/json-patch+json")
            .body(serde_json::to_vec(&ops).unwrap())
            .unwrap();
            client.request::<ContainerRecreateRequest>(request).await
        }
    };
    let code = |result: Result<ContainerRecreateRequest, kube::Error>| match result {
        Err(kube::Error::Api(status)) => status.code,
        other => panic!("{other:?}"),
    };
    // A test that fails changes nothing.
    let stale = json_patch(json!([
        {"op": "test", "path": "/metadata/labels/node", "value": "n2"},
        {"op": "replace", "path": "/metadata/labels/node", "value": "n3"},
    ]));
    assert_eq!(code(stale.await), 422);
    assert_eq!(
        code(json_patch(json!([{"op": "remove", "path": "/spec/nope"}])).await),
        422
    );
    let held = json_patch(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "replace", "path": "/metadata/labels/node", "value": "n3"},
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "sidecar"}},
        {"op": "add", "path": "/status", "value": {"phase": "Completed"}},
    ]))
    .await
    .unwrap();
    let labels = held.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("node").map(String::as_str), Some("n3"));
    let names: Vec<&str> = held
        .spec
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["app", "sidecar"]);
    // The main resource keeps the status it had.
    assert!(held.status.is_none());
}

/// Pruning: a field the CRD's schema does not declare, at any depth, is
/// dropped from a create and from a status patch (the default field
/// validation), and refuses a patch under `fieldValidation=Strict`, which
/// then changes nothing. A misspelt field the agent wrote would be lost on a
/// real cluster; here too.
#[tokio::test]
async fn unknown_fields_are_pruned_or_refused() {
    unknown_fields_are_pruned_or_refused_on(&Target::fake().await).await;
}

async fn unknown_fields_are_pruned_or_refused_on(t: &Target) {
    use kube::api::{ApiResource, DynamicObject};
    let resource = ApiResource {
        group: "apps.kruise.io".into(),
        version: "v1alpha1".into(),
        api_version: "apps.kruise.io/v1alpha1".into(),
        kind: "ContainerRecreateRequest".into(),
        plural: "containerrecreaterequests".into(),
    };
    let api = Api::<DynamicObject>::namespaced_with(t.client.clone(), &t.ns, &resource);
    let written: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
        "metadata": {"name": "pruned"},
        "spec": {"podName": "web-0", "podNmae": "typo",
                 "containers": [{"name": "app", "preStopp": {"exec": {}}}],
                 "strategy": {"forceRecreate": true, "forceRecreat": false}},
        "extra": 1}))
    .unwrap();
    api.create(&PostParams::default(), &written).await.unwrap();
    let status = json!({"status": {"phase": "Recreating", "phsae": "x",
        "containerRecreateStates": [{"name": "app", "phase": "Pending", "isKiled": true}]}});
    api.patch_status("pruned", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let read = api.get("pruned").await.unwrap();
    assert_eq!(read.data["spec"]["podName"], "web-0");
    assert_eq!(read.data["spec"]["containers"], json!([{"name": "app"}]));
    assert_eq!(read.data["spec"]["strategy"]["forceRecreate"], true);
    assert_eq!(read.data["status"]["phase"], "Recreating");
    let state = &read.data["status"]["containerRecreateStates"][0];
    assert_eq!(state["phase"], "Pending");
    for (at, field) in [
        (&read.data, "extra"),
        (&read.data["spec"], "podNmae"),
        (&read.data["spec"]["strategy"], "forceRecreat"),
        (&read.data["status"], "phsae"),
        (state, "isKiled"),
    ] {
        assert!(at.get(field).is_none(), "{field} was kept: {}", read.data);
    }
    let strict = PatchParams::default().validation_strict();
    let typo = json!({"spec": {"activeDeadlineSecond": 5}});
    match api.patch("pruned", &strict, &Patch::Merge(&typo)).await {
        Err(kube::Error::Api(status)) => {
            // A patch that does not decode is an invalid patch.
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status
                    .message
                    .contains("unknown field \"spec.activeDeadlineSecond\""),
                "{status:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let after = api.get("pruned").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        read.metadata.resource_version
    );
    // A create under Strict: refused whole, as a body that does not decode.
    let body = json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
        "metadata": {"name": "strict"},
        "spec": {"podName": "web-0", "podNmae": "typo", "containers": [{"name": "app"}]}});
    let create = http::Request::post(format!(
        "/apis/apps.kruise.io/v1alpha1/namespaces/{}/containerrecreaterequests?fieldValidation=Strict",
        t.ns
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).unwrap())
    .unwrap();
    match t.client.request::<DynamicObject>(create).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 400, "{status:?}");
            assert!(
                status.message.contains("unknown field \"spec.podNmae\""),
                "{status:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(api.get_opt("strict").await.unwrap().is_none());
}
