//! deploy/standalone/standalone-checks.yaml, as written, judged by a CEL interpreter in
//! the fake API server: without OpenKruise's webhook, `kubectl apply` still
//! refuses the CRRs the webhook refuses without a look at the Pod, with the
//! webhook's own messages (those `crr::admission` gives, which its unit
//! tests hold to kruise's).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use crr_proxy::crr::ContainerRecreateRequest;
use crr_proxy::crr::admission::admit;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::apiserver::{Conversion, CrrVersions, FakeApiServer};
use support::cluster::Cluster;
use support::policy::UserInfo;

fn crr(spec: Value) -> ContainerRecreateRequest {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
        "metadata": {"name": "restart", "namespace": "default"}, "spec": spec}))
    .unwrap()
}

/// What crr-proxy's own admission (the webhook's rules) says of `crr` on a
/// running Pod with containers `app` and `sidecar`.
fn webhook_says(crr: &ContainerRecreateRequest) -> Result<(), String> {
    let (pod, containers) = support::pods::running_web_pod("default");
    admit(crr, &pod, &containers).map(|_| ())
}

#[tokio::test]
async fn bad_crrs_are_refused_at_create_with_the_webhooks_messages() {
    let server = FakeApiServer::start().await;
    server.set_crr_versions(CrrVersions::Both(Conversion::None));
    server.add_policies(include_str!("../deploy/standalone/standalone-checks.yaml"));
    server.add_user(
        "jane",
        UserInfo {
            username: "jane".into(),
            groups: vec!["system:authenticated".into()],
        },
    );
    let api = Api::<ContainerRecreateRequest>::namespaced(server.client_as("jane"), "default");
    bad_crrs_are_refused(&api).await;
}

/// The same on a real kube-apiserver (v1.37, support::cluster) with
/// deploy/standalone applied by the real kubectl: its CEL evaluates the
/// policy as written.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_api_server_refuses_them_alike() {
    let cluster = tokio::task::block_in_place(|| {
        let cluster = Cluster::start().unwrap();
        cluster.install("standalone").unwrap();
        cluster
    });
    let api =
        Api::<ContainerRecreateRequest>::namespaced(cluster.client().await.unwrap(), "default");
    // A new policy takes the API server a moment to load.
    let probe = crr(json!({"podName": "", "containers": [{"name": "app"}]}));
    for _ in 0..100 {
        if api.create(&PostParams::default(), &probe).await.is_err() {
            break;
        }
        api.delete("restart", &Default::default()).await.ok();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    bad_crrs_are_refused(&api).await;
}

async fn bad_crrs_are_refused(api: &Api<ContainerRecreateRequest>) {
    let app = json!([{"name": "app"}]);
    // What crr-proxy's CRD (deploy/crd, which deploy/standalone installs)
    // refuses is refused by its schema before any policy runs, with the API
    // server's message (met on a real kube-apiserver v1.37).
    let schema = |field: &str, value: i64| {
        format!(
            "ContainerRecreateRequest.apps.kruise.io \"restart\" is invalid: spec.strategy.{field}: \
             Invalid value: {value}: spec.strategy.{field} in body should be greater than or equal to 0"
        )
    };
    let cases = [
        (json!({"podName": "", "containers": app}), None),
        (json!({"podName": "web-0", "containers": []}), None),
        (json!({"podName": "web-0", "containers": app, "activeDeadlineSeconds": 2}), None),
        (
            json!({"podName": "web-0", "containers": app, "strategy": {"terminationGracePeriodSeconds": -1}}),
            Some(schema("terminationGracePeriodSeconds", -1)),
        ),
        (
            json!({"podName": "web-0", "containers": app, "strategy": {"unreadyGracePeriodSeconds": -5}}),
            Some(schema("unreadyGracePeriodSeconds", -5)),
        ),
        (
            json!({"podName": "web-0", "containers": app, "strategy": {"failurePolicy": "Maybe"}}),
            Some(
                "ContainerRecreateRequest.apps.kruise.io \"restart\" is invalid: spec.strategy.failurePolicy: \
                 Unsupported value: \"Maybe\": supported values: \"Fail\", \"Ignore\""
                    .to_owned(),
            ),
        ),
        (json!({"podName": "web-0", "containers": [{"name": "app"}, {"name": "sidecar"}, {"name": "app"}]}), None),
        (
            json!({"podName": "web-0", "containers": [{"name": "app", "statusContext": {"containerID": "containerd://x", "restartCount": 0}}]}),
            None,
        ),
        (json!({"podName": "web-0", "containers": [{"name": "app", "ports": [{"containerPort": 80}]}]}), None),
        (
            json!({"podName": "web-0", "containers": [{"name": "app", "preStop": {"exec": {"command": ["true"]}}}]}),
            None,
        ),
    ];
    for (spec, schema_says) in cases {
        let bad = crr(spec.clone());
        let expected = webhook_says(&bad).expect_err("the webhook refuses it");
        let refused = api.create(&PostParams::default(), &bad).await;
        let Err(kube::Error::Api(status)) = refused else {
            panic!("{spec}: created ({refused:?}); the webhook says {expected:?}");
        };
        assert_eq!(status.code, 422, "{spec}: {status:?}");
        match schema_says {
            Some(message) => assert_eq!(status.message, message, "{spec}"),
            None => assert!(
                status
                    .message
                    .ends_with(&format!("denied request: {expected}")),
                "{spec}: {:?}, the webhook says {expected:?}",
                status.message
            ),
        }
    }
    // What passes the webhook passes the policy.
    for spec in [
        json!({"podName": "web-0", "containers": app}),
        json!({"podName": "web-0", "containers": [{"name": "app"}, {"name": "sidecar"}], "activeDeadlineSeconds": 3,
               "strategy": {"failurePolicy": "Ignore", "terminationGracePeriodSeconds": 0,
                            "unreadyGracePeriodSeconds": 0, "orderedRecreate": true}}),
    ] {
        let good = crr(spec.clone());
        webhook_says(&good).unwrap();
        api.delete("restart", &Default::default()).await.ok();
        api.create(&PostParams::default(), &good)
            .await
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
    }
}
