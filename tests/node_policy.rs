//! deploy/base/node-policy.yaml, as written, judged by a CEL interpreter in the
//! fake API server: each node's crr-proxy identity may write only the CRRs
//! and Pods of its own node. (The agent tests run every scenario under the
//! same policy, as node-a.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use crr_proxy::crr::ContainerRecreateRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Resource};
use support::policy::UserInfo;

const NODE_LABEL: &str = "crr.apps.kruise.io/node-name";

async fn server() -> FakeApiServer {
    server_with(support::apiserver::BASE_POLICIES).await
}

/// The fake API server with `manifests` applied (their policies, and the
/// Lease they ship), its users and a few CRRs and Pods.
async fn server_with(manifests: &str) -> FakeApiServer {
    let server = FakeApiServer::start().await;
    server.add_policies(manifests);
    for namespace in [crr_proxy::manifests::DEFAULT_LEASE_NAMESPACE, "ops"] {
        server.add_namespace(namespace);
    }

    server.add_user("a", UserInfo::node("node-a"));
    server.add_user("b", UserInfo::node("node-b"));
    // A user outside crr-proxy:nodes (kruise-manager, a person).
    server.add_user(
        "manager",
        UserInfo {
            username: "system:serviceaccount:kruise-system:kruise-manager".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
        },
    );
    for (name, node) in [
        ("of-a", Some("node-a")),
        ("of-b", Some("node-b")),
        ("new", None),
    ] {
        let labels = match node {
            Some(node) => json!({NODE_LABEL: node, "crr.apps.kruise.io/active": "true"}),
            None => json!({}),
        };
        server
            .create_unchecked(
                Resource::Crr,
                "default",
                json!({"metadata": {"name": name, "labels": labels},
                       "spec": {"podName": "web-0", "containers": [{"name": "app"}]}}),
            )
            .unwrap();
    }
    for (name, node) in [("pod-a", "node-a"), ("pod-b", "node-b")] {
        server
            .create_unchecked(
                Resource::Pod,
                "default",
                json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "app"}]}}),
            )
            .unwrap();
    }
    server
}

/// The HTTP status of a write (200 when it went through) and the message.
fn code<T>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(other) => panic!("unexpected error {other}"),
    }
}

async fn patch_crr(
    server: &FakeApiServer,
    token: &str,
    name: &str,
    patch: Value,
    status: bool,
) -> (u16, String) {
    let api: Api<ContainerRecreateRequest> = Api::namespaced(server.client_as(token), "default");
    let params = PatchParams::default();
    let patch = Patch::Merge(&patch);
    code(if status {
        api.patch_status(name, &params, &patch).await
    } else {
        api.patch(name, &params, &patch).await
    })
}

#[tokio::test]
async fn a_node_writes_only_its_own_crrs() {
    let server = server().await;
    let states = json!({"status": {"phase": "Recreating"}});

    // Its own CRR: status and metadata writes go through.
    assert_eq!(
        patch_crr(&server, "a", "of-a", states.clone(), true)
            .await
            .0,
        200
    );
    let release = json!({"metadata": {"labels": {"crr.apps.kruise.io/active": null}}});
    assert_eq!(
        patch_crr(&server, "a", "of-a", release.clone(), false)
            .await
            .0,
        200
    );

    // Another node's CRR: refused, whatever the write, and left as it was.
    let (status, message) = patch_crr(&server, "a", "of-b", states.clone(), true).await;
    assert_eq!(status, 403, "{message}");
    assert_eq!(
        message,
        "containerrecreaterequests.apps.kruise.io \"of-b\" is forbidden: ValidatingAdmissionPolicy \
         'crr-proxy-own-node-crrs' with binding 'crr-proxy-own-node-crrs' denied request: \
         this ContainerRecreateRequest belongs to another node"
    );
    assert_eq!(patch_crr(&server, "a", "of-b", release, false).await.0, 403);
    let take = json!({"metadata": {"labels": {NODE_LABEL: "node-a"}}});
    assert_eq!(patch_crr(&server, "a", "of-b", take, false).await.0, 403);
    let of_b = server.get(Resource::Crr, "default", "of-b").unwrap();
    assert_eq!(of_b["metadata"]["labels"][NODE_LABEL], "node-b");
    assert_eq!(
        of_b["metadata"]["labels"]["crr.apps.kruise.io/active"],
        "true"
    );
    assert!(of_b["status"].is_null());

    // Its own CRR cannot be handed to another node or unlabelled.
    let hand_over = json!({"metadata": {"labels": {NODE_LABEL: "node-b"}}});
    let (status, message) = patch_crr(&server, "a", "of-a", hand_over, false).await;
    assert_eq!(status, 403);
    assert!(message.ends_with("with its own name"), "{message}");
    let unlabel = json!({"metadata": {"labels": {NODE_LABEL: null}}});
    assert_eq!(patch_crr(&server, "a", "of-a", unlabel, false).await.0, 403);
}

/// The standalone Lease, held by `holder` (`None`: released).
fn hold_lease(server: &FakeApiServer, holder: Option<&str>) {
    let lease = json!({"metadata": {"name": "crr-proxy-claimer"},
                       "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}});
    match server.get(Resource::Lease, "crr-proxy-system", "crr-proxy-claimer") {
        None => {
            server
                .create_unchecked(Resource::Lease, "crr-proxy-system", lease)
                .unwrap();
        }
        Some(_) => {
            server
                .patch(
                    Resource::Lease,
                    "crr-proxy-system",
                    "crr-proxy-claimer",
                    &lease,
                    false,
                )
                .unwrap();
        }
    }
}

#[tokio::test]
async fn unclaimed_crrs_are_written_only_by_the_lease_holder() {
    let server = server().await;
    let refuse = json!({"status": {"phase": "Completed", "message": "refused"}});
    let for_a = json!({"metadata": {"labels": {NODE_LABEL: "node-a"}}});
    let for_b = json!({"metadata": {"labels": {NODE_LABEL: "node-b"}}});
    // The Lease as shipped, held by no node: no node may claim, even for
    // itself.
    let (status, message) = patch_crr(&server, "a", "new", for_a.clone(), false).await;
    assert_eq!(status, 403);
    assert!(
        message.contains("only the holder of the standalone Lease"),
        "{message}"
    );
    assert_eq!(
        patch_crr(&server, "a", "new", refuse.clone(), true).await.0,
        403
    );

    // node-b holds it: node-a still may not claim, for itself or another.
    hold_lease(&server, Some("node-b"));
    let (status, message) = patch_crr(&server, "a", "new", for_a.clone(), false).await;
    assert_eq!(status, 403);
    assert!(
        message.ends_with("only the holder of the standalone Lease may claim or end an unclaimed ContainerRecreateRequest, or end one its node never took up"),
        "{message}"
    );
    assert_eq!(patch_crr(&server, "a", "new", for_b, false).await.0, 403);
    // The holder claims it for the node that runs the Pod.
    assert_eq!(patch_crr(&server, "b", "new", for_a, false).await.0, 200);
    // Then it is node-a's: its status may be written, the holder is locked out.
    assert_eq!(
        patch_crr(&server, "a", "new", refuse.clone(), true).await.0,
        200
    );
    assert_eq!(
        patch_crr(&server, "b", "new", refuse.clone(), true).await.0,
        403
    );
    // The holder cannot take or hand over a claimed CRR either.
    let to_b = json!({"metadata": {"labels": {NODE_LABEL: "node-b"}}});
    assert_eq!(patch_crr(&server, "b", "of-a", to_b, false).await.0, 403);

    // The holder ends a CRR no node can take, leaving it unclaimed.
    server
        .create_unchecked(
            Resource::Crr,
            "default",
            json!({"metadata": {"name": "no-pod"},
                   "spec": {"podName": "gone", "containers": [{"name": "app"}]}}),
        )
        .unwrap();
    assert_eq!(
        patch_crr(&server, "a", "no-pod", refuse.clone(), true)
            .await
            .0,
        403
    );
    assert_eq!(
        patch_crr(&server, "b", "no-pod", refuse.clone(), true)
            .await
            .0,
        200
    );
    // Once it let the Lease go, not even that.
    hold_lease(&server, None);
    assert_eq!(patch_crr(&server, "b", "no-pod", refuse, true).await.0, 403);
}

/// A CRR its node never took up (no phase) may be ended by the Lease holder
/// with kruise-manager's message, and by no one else, in no other way.
#[tokio::test]
async fn the_lease_holder_ends_only_the_claims_their_node_never_took_up() {
    let server = server().await;
    let unanswered = json!({"status": {"phase": "Completed", "message": "daemon has not responded for a long time"}});
    let other = json!({"status": {"phase": "Completed", "message": "refused"}});
    hold_lease(&server, Some("node-b"));
    // node-a's CRR, not taken up: another node that does not hold the
    // Lease may not end it, nor may the holder with another message.
    server.add_user("c", UserInfo::node("node-c"));
    assert_eq!(
        patch_crr(&server, "c", "of-a", unanswered.clone(), true)
            .await
            .0,
        403
    );
    assert_eq!(patch_crr(&server, "b", "of-a", other, true).await.0, 403);
    // The holder may, with that message.
    assert_eq!(
        patch_crr(&server, "b", "of-a", unanswered.clone(), true)
            .await
            .0,
        200
    );
    // A CRR its node took up (a phase set) is the node's alone.
    assert_eq!(
        patch_crr(
            &server,
            "b",
            "of-b",
            json!({"status": {"phase": "Recreating"}}),
            true
        )
        .await
        .0,
        200
    );
    assert_eq!(
        patch_crr(&server, "a", "of-b", unanswered, true).await.0,
        403
    );
    hold_lease(&server, Some("node-a"));
    let unanswered = json!({"status": {"phase": "Completed", "message": "daemon has not responded for a long time"}});
    let (status, message) = patch_crr(&server, "a", "of-b", unanswered, true).await;
    assert_eq!(status, 403, "{message}");
}

#[tokio::test]
async fn a_node_deletes_only_its_own_crrs() {
    let server = server().await;
    let api =
        |token| Api::<ContainerRecreateRequest>::namespaced(server.client_as(token), "default");
    let delete = DeleteParams::default();
    assert_eq!(code(api("a").delete("of-b", &delete).await).0, 403);
    assert_eq!(code(api("a").delete("new", &delete).await).0, 403);
    assert_eq!(code(api("a").delete("of-a", &delete).await).0, 200);
    assert!(server.get(Resource::Crr, "default", "of-a").is_none());
    assert!(server.get(Resource::Crr, "default", "of-b").is_some());
    assert!(server.get(Resource::Crr, "default", "new").is_some());
    // An unclaimed one (a CRR ended for want of a Pod, past its TTL): the
    // Lease holder only.
    hold_lease(&server, Some("node-b"));
    assert_eq!(code(api("a").delete("new", &delete).await).0, 403);
    assert_eq!(code(api("b").delete("of-b", &delete).await).0, 200);
    assert_eq!(code(api("b").delete("new", &delete).await).0, 200);
    assert!(server.get(Resource::Crr, "default", "new").is_none());
}

#[tokio::test]
async fn a_node_writes_the_status_only_of_its_own_pods() {
    let server = server().await;
    let pods = Api::<Pod>::namespaced(server.client_as("a"), "default");
    let gate = json!({"status": {"conditions": [{"type": "KruisePodReady", "status": "False"}]}});
    let params = PatchParams::default();
    assert_eq!(
        code(
            pods.patch_status("pod-a", &params, &Patch::Merge(&gate))
                .await
        )
        .0,
        200
    );
    let (status, message) = code(
        pods.patch_status("pod-b", &params, &Patch::Merge(&gate))
            .await,
    );
    assert_eq!(status, 403);
    assert!(
        message.ends_with("a node may only write the status of its own Pods"),
        "{message}"
    );
    assert!(server.get(Resource::Pod, "default", "pod-b").unwrap()["status"].is_null());
}

#[tokio::test]
async fn other_users_are_not_matched_and_unknown_tokens_are_refused() {
    let server = server().await;
    // kruise-manager (not in crr-proxy:nodes) labels, writes and deletes any CRR.
    let label = json!({"metadata": {"labels": {NODE_LABEL: "node-b"}}});
    assert_eq!(
        patch_crr(&server, "manager", "new", label, false).await.0,
        200
    );
    let done = json!({"status": {"phase": "Completed"}});
    assert_eq!(
        patch_crr(&server, "manager", "of-a", done, true).await.0,
        200
    );
    let api = Api::<ContainerRecreateRequest>::namespaced(server.client_as("manager"), "default");
    assert_eq!(
        code(api.delete("of-b", &DeleteParams::default()).await).0,
        200
    );
    // A token the authenticator does not know.
    let stranger =
        Api::<ContainerRecreateRequest>::namespaced(server.client_as("nobody"), "default");
    assert_eq!(code(stranger.get("of-a").await).0, 401);
}

/// Leases: a node creates none but the standalone Lease, holds it only under
/// its own name, and gives up only its own; a stolen credential can still
/// take it under its own node's name.
#[tokio::test]
async fn a_node_holds_the_lease_only_as_itself() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::PostParams;
    let server = server().await;
    let leases = |token: &str, namespace: &str| -> Api<Lease> {
        Api::namespaced(server.client_as(token), namespace)
    };
    let lease = |name: &str, holder: &str| -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}
        }))
        .unwrap()
    };
    let create =
        |token: &'static str, namespace: &'static str, name: &'static str, holder: &'static str| {
            let api = leases(token, namespace);
            let lease = lease(name, holder);
            async move { code(api.create(&PostParams::default(), &lease).await) }
        };
    let (denied, message) = create("a", "kube-system", "kube-controller-manager", "node-a").await;
    assert_eq!(denied, 403, "{message}");
    assert!(
        message.contains("no Lease but crr-proxy-system/crr-proxy-claimer"),
        "{message}"
    );
    assert_eq!(
        create("a", "default", "crr-proxy-claimer", "node-a")
            .await
            .0,
        403
    );
    assert_eq!(
        create("a", "crr-proxy-system", "crr-proxy-claimer", "node-b")
            .await
            .0,
        403
    );
    // Under its own name it is admitted, and then finds the Lease
    // deploy/base/claimer.yaml ships; it takes that one instead.
    let made = create("a", "crr-proxy-system", "crr-proxy-claimer", "node-a").await;
    assert_eq!(made.0, 409, "{}", made.1);
    let set_holder = |token: &'static str, holder: Value| {
        let api = leases(token, "crr-proxy-system");
        async move {
            let patch = json!({"spec": {"holderIdentity": holder}});
            code(
                api.patch(
                    "crr-proxy-claimer",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await,
            )
        }
    };
    assert_eq!(set_holder("a", json!("node-a")).await.0, 200);
    // node-b can neither hand it to node-a's name nor release node-a's.
    assert_eq!(set_holder("b", json!("node-c")).await.0, 403);
    assert_eq!(set_holder("b", Value::Null).await.0, 403);
    // It can take it under its own name (no clock in CEL: see the policy).
    assert_eq!(set_holder("b", json!("node-b")).await.0, 200);
    // Its holder releases it.
    assert_eq!(set_holder("b", Value::Null).await.0, 200);
    // People and controllers are not matched.
    assert_eq!(set_holder("manager", json!("anyone")).await.0, 200);
}

/// `crr-proxy manifests` for another Lease: the policies then let a node
/// write that Lease and no other (the default one included), and read that
/// one to decide who may claim.
#[tokio::test]
async fn the_policies_rendered_for_another_lease_guard_that_lease() {
    use crr_proxy::manifests::{Identity, LeaseRef, Overlay, render};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::PostParams;
    let other = LeaseRef::new("claim", "ops").unwrap();
    let server = server_with(&render(Overlay::Kruise, &other, Identity::Own).unwrap()).await;
    let create = |namespace: &str, name: &str| {
        let api: Api<Lease> = Api::namespaced(server.client_as("a"), namespace);
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 15}
        }))
        .unwrap();
        async move { code(api.create(&PostParams::default(), &lease).await) }
    };
    let (denied, message) = create("crr-proxy-system", "crr-proxy-claimer").await;
    assert_eq!(denied, 403, "{message}");
    assert!(message.contains("no Lease but ops/claim"), "{message}");
    let for_b = json!({"metadata": {"labels": {NODE_LABEL: "node-b"}}});
    // ops/claim as shipped: nobody holds it, so no claim.
    assert_eq!(
        patch_crr(&server, "a", "new", for_b.clone(), false).await.0,
        403
    );
    assert_eq!(create("ops", "claim").await.0, 409);
    let take = json!({"spec": {"holderIdentity": "node-a"}});
    let taken = Api::<Lease>::namespaced(server.client_as("a"), "ops")
        .patch(
            "claim",
            &Default::default(),
            &kube::api::Patch::Merge(&take),
        )
        .await;
    assert!(taken.is_ok(), "{taken:?}");
    // node-a holds ops/claim: it claims the new CRR for node-b.
    assert_eq!(patch_crr(&server, "a", "new", for_b, false).await.0, 200);
}

/// Kruise mode under kubelet's identity, as `crr-proxy manifests --agent
/// kruise --identity kubelet` renders it, with the API server's Node
/// authorizer and NodeRestriction: a node writes only its own CRRs, reads
/// only its own Pods (what the agent needs), and kubelet's own writes (its
/// Pods' status, its heartbeat Lease) meet none of crr-proxy's policies.
#[tokio::test]
async fn kubelets_identity_is_confined_to_its_node_and_kubelet_is_left_alone() {
    use crr_proxy::manifests::{Identity, LeaseRef, Overlay, render};
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{ListParams, PostParams};

    let rendered = render(Overlay::Kruise, &LeaseRef::default(), Identity::Kubelet).unwrap();
    let server = server_with(&rendered).await;
    server.add_namespace("kube-node-lease");
    let rules = support::policy::rules_bound_to(&rendered, "system:nodes");
    for node in ["node-a", "node-b"] {
        server.add_user(&format!("kubelet-{node}"), UserInfo::kubelet(node));
        server.grant(&format!("system:node:{node}"), &rules);
    }
    let a = "kubelet-node-a";

    // Its own CRR's status; not another node's.
    let states = json!({"status": {"phase": "Recreating"}});
    assert_eq!(
        patch_crr(&server, a, "of-a", states.clone(), true).await.0,
        200
    );
    let (status, message) = patch_crr(&server, a, "of-b", states, true).await;
    assert_eq!(status, 403);
    assert!(
        message.ends_with("this ContainerRecreateRequest belongs to another node"),
        "{message}"
    );

    // Pods: what the agent reads of its own node, and nothing more.
    let pods: Api<Pod> = Api::all(server.client_as(a));
    let own = ListParams::default().fields("spec.nodeName=node-a");
    assert_eq!(code(pods.list(&own).await).0, 200);
    let (status, message) = code(pods.list(&ListParams::default()).await);
    assert_eq!(status, 403, "every Pod of the cluster: {message}");
    let in_default: Api<Pod> = Api::namespaced(server.client_as(a), "default");
    assert_eq!(code(in_default.get("pod-a").await).0, 200);
    assert_eq!(code(in_default.get("pod-b").await).0, 403);

    // kubelet's own writes: its Pod's status, and its heartbeat.
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let pp = PatchParams::default();
    assert_eq!(
        code(
            in_default
                .patch_status("pod-a", &pp, &Patch::Merge(&ready))
                .await
        )
        .0,
        200
    );
    assert_eq!(
        code(
            in_default
                .patch_status("pod-b", &pp, &Patch::Merge(&ready))
                .await
        )
        .0,
        403
    );
    let heartbeat: Lease = serde_json::from_value(json!({
        "metadata": {"name": "node-a"},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40}
    }))
    .unwrap();
    let node_leases: Api<Lease> = Api::namespaced(server.client_as(a), "kube-node-lease");
    assert_eq!(
        code(node_leases.create(&PostParams::default(), &heartbeat).await).0,
        200
    );
    let renewed = json!({"spec": {"renewTime": "2026-12-05T12:00:00.000000Z"}});
    assert_eq!(
        code(
            node_leases
                .patch("node-a", &pp, &Patch::Merge(&renewed))
                .await
        )
        .0,
        200
    );

    // Why standalone is not offered: its Lease is out of a kubelet's reach.
    let claimer: Lease = serde_json::from_value(json!({
        "metadata": {"name": "crr-proxy-claimer"},
        "spec": {"holderIdentity": "node-a"}
    }))
    .unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client_as(a), "crr-proxy-system");
    let (status, message) = code(leases.create(&PostParams::default(), &claimer).await);
    assert_eq!(status, 403);
    assert!(message.contains("kube-node-lease"), "{message}");
}

/// Why deploy/base/claimer.yaml ships the Lease: kube-apiserver looks up a
/// binding's parameter before the match conditions, so without the Lease
/// every update and delete of a CRR, by anyone, is refused (met on a real
/// kube-apiserver v1.37, tests/standalone_checks.rs).
#[tokio::test]
async fn without_the_shipped_lease_no_one_could_update_a_crr() {
    let bare = server_with(include_str!("../deploy/base/node-policy.yaml")).await;
    let label = json!({"metadata": {"labels": {"team": "shop"}}});
    let (status, message) = patch_crr(&bare, "manager", "of-a", label.clone(), false).await;
    assert_eq!(status, 422, "{message}");
    assert!(message.ends_with("denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"), "{message}");
    let server = server().await;
    assert_eq!(
        patch_crr(&server, "manager", "of-a", label, false).await.0,
        200
    );
}
