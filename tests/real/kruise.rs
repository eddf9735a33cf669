//! kruise mode beside OpenKruise's real kruise-manager v1.9.0 (its webhook
//! registered by URL, its CRDs from its module): the webhook labels and
//! checks each CRR, crr-proxy's kruise agent recreates the container, the
//! real kubelet starts it again.

use crr_proxy::crr::ContainerRecreateRequest;
use crr_proxy::crr::admission::admit;
use support::kruise::KruiseManager;
use support::node::{Agent, Node};

use super::*;

/// Real parts: kruise-manager v1.9.0 and its webhook, etcd, kube-apiserver
/// (with deploy/kruise's policies), kube-controller-manager, kubelet,
/// kubectl, containerd, runc.
#[test]
fn the_real_kruise_webhook_admits_and_crr_proxy_recreates() {
    let mut cluster = Cluster::start().unwrap();
    let mut manager = KruiseManager::start(&mut cluster).unwrap();
    cluster.install("kruise").unwrap();
    cluster.namespace("shop").unwrap();
    let _node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Kruise).unwrap();
    cluster
        .apply(&web_pod("shop", "web-0", "node-a").to_string())
        .unwrap();
    let pod = wait_pod_ready(&mut cluster, "shop", "web-0").unwrap();

    // What the webhook refuses, with crr-proxy's own admission's words.
    let (model_pod, model_containers) = support::pods::running_web_pod("shop");
    for (name, containers) in [
        ("none", json!([])),
        ("twice", json!([{"name": "app"}, {"name": "app"}])),
        ("unknown", json!([{"name": "nope"}])),
    ] {
        let crr = json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"podName": "web-0", "containers": containers}
        });
        let typed: ContainerRecreateRequest = serde_json::from_value(crr.clone()).unwrap();
        let expected = admit(&typed, &model_pod, &model_containers).expect_err(name);
        let refused = cluster.apply(&crr.to_string()).expect_err(name);
        assert!(
            format!("{refused:#}").contains(&expected),
            "{name}: kruise says {refused:#}; crr-proxy's admission says {expected:?}"
        );
    }

    recreate(&mut cluster, "shop", "restart-app", "web-0", 1);
    manager.check().unwrap();
    // Labelled by kruise's webhook: crr-proxy's kruise agent labels nothing.
    let done = cluster
        .get(&[CRR_V1ALPHA1, "restart-app", "-n", "shop"])
        .unwrap();
    let labels = &done["metadata"]["labels"];
    assert_eq!(labels["crr.apps.kruise.io/node-name"], "node-a", "{done:#}");
    assert_eq!(
        labels["crr.apps.kruise.io/pod-uid"], pod["metadata"]["uid"],
        "{done:#}"
    );
}

/// Real parts: kube-apiserver's Node authorizer and NodeRestriction judging
/// crr-proxy under kubelet's own client certificate, with the objects
/// `crr-proxy manifests --agent kruise --identity kubelet` renders, across
/// a real rotation of that certificate: kubelet's from the cluster's CSR
/// signer (2 minutes), renewed by kubelet itself through a CSR the
/// controller manager approves and signs; kruise-manager v1.9.0 (and its
/// rule for a CRR no daemon took up), two kubelets, containerd.
#[test]
fn under_kubelets_rotating_identity_the_agent_works_and_the_managers_minute_holds() {
    let mut cluster = Cluster::start().unwrap();
    let _manager = KruiseManager::start(&mut cluster).unwrap();
    let rendered = std::process::Command::new(CRR_PROXY)
        .args(["manifests", "--agent", "kruise", "--identity", "kubelet"])
        .output()
        .unwrap();
    assert!(rendered.status.success());
    cluster
        .kubectl_in(
            &["apply", "-f", "-"],
            &String::from_utf8(rendered.stdout).unwrap(),
        )
        .unwrap();
    // What kubeadm binds so that kubelets renew their own certificates.
    for (binding, role) in [
        ("node-csrs", "system:node-bootstrapper"),
        (
            "node-autoapprove-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        ),
    ] {
        cluster
            .kubectl(&[
                "create",
                "clusterrolebinding",
                binding,
                "--clusterrole",
                role,
                "--group",
                "system:nodes",
            ])
            .unwrap();
    }
    cluster.namespace("shop").unwrap();
    let node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::KruiseAsKubelet).unwrap();
    // Meanwhile, kruise-manager's own rule: node-b's crr-proxy runs with the
    // agent off, so no daemon takes up its CRR, and a minute after its
    // creation the manager ends it with its message.
    let _b = Node::start(&mut cluster, "node-b", crr_proxy(), Agent::Off).unwrap();
    cluster
        .apply(&web_pod("shop", "web-b", "node-b").to_string())
        .unwrap();
    wait_pod_ready(&mut cluster, "shop", "web-b").unwrap();
    create_crr(&cluster, "shop", "unanswered", "web-b", &["app"]);
    cluster
        .apply(&web_pod("shop", "web-0", "node-a").to_string())
        .unwrap();
    wait_pod_ready(&mut cluster, "shop", "web-0").unwrap();
    recreate(&mut cluster, "shop", "first", "web-0", 1);

    // kubelet renews its certificate, and the first one expires: the agent
    // must have moved to the new one.
    let current = node
        .kubelet_certificates()
        .join("kubelet-client-current.pem");
    let first = std::fs::read_link(&current).unwrap();
    cluster
        .wait(
            "kubelet to renew its certificate",
            Duration::from_secs(240),
            |_| Ok((std::fs::read_link(&current)? != first).then_some(())),
        )
        .unwrap();
    let old = cluster.dir.join("first.kubeconfig");
    support::cluster::write_kubeconfig(
        &old,
        &cluster.server,
        &cluster.pki.ca().cert,
        &support::pki::KeyPair {
            cert: first.clone(),
            key: first,
        },
    )
    .unwrap();
    cluster
        .wait(
            "the first certificate to expire",
            Duration::from_secs(240),
            |_| {
                let refused =
                    support::cluster::kubectl_as(&old, &["get", "--raw", "/version"], None)
                        .err()
                        .is_some_and(|e| format!("{e:#}").contains("Unauthorized"));
                Ok(refused.then_some(()))
            },
        )
        .unwrap();
    recreate(&mut cluster, "shop", "after-renewal", "web-0", 2);
    let ended = cluster
        .wait("the manager's minute", Duration::from_secs(120), |c| {
            let crr = c.get(&[CRR_V1ALPHA1, "unanswered", "-n", "shop"])?;
            Ok((crr["status"]["phase"] == "Completed").then_some(crr))
        })
        .unwrap();
    assert_eq!(
        ended["status"]["message"], "daemon has not responded for a long time",
        "{ended:#}"
    );
    let b = cluster.get(&["pod", "web-b", "-n", "shop"]).unwrap();
    assert_eq!(restart_count(&b, "app"), 0, "{b:#}");
    // Nothing the agent asked was refused.
    let log = std::fs::read_to_string(node.proxy_log()).unwrap();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
}
