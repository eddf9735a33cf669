//! Standalone mode on a real Kubernetes: deploy/standalone applied with the
//! real kubectl (its kustomize), the real API server's RBAC and admission
//! policies judging crr-proxy's writes, and the real kubelet restarting
//! what crr-proxy stopped.

use support::node::{Agent, Node};

use super::*;

/// Real parts: etcd, kube-apiserver (Node,RBAC, ValidatingAdmissionPolicy),
/// kube-controller-manager, kubelet, kubectl, containerd, runc.
#[test]
fn a_crr_restarts_a_container_that_the_real_kubelet_starts_again() {
    let mut cluster = Cluster::start().unwrap();
    install_standalone(&mut cluster);
    cluster.namespace("shop").unwrap();
    let _node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap();
    cluster
        .apply(&web_pod("shop", "web-0", "node-a").to_string())
        .unwrap();
    let before = wait_pod_ready(&mut cluster, "shop", "web-0").unwrap();
    assert_eq!(restart_count(&before, "app"), 0);

    create_crr(&cluster, "shop", "restart-app", "web-0", &["app"]);
    let crr = wait_crr_completed(&mut cluster, "shop", "restart-app");
    assert_eq!(
        crr["status"]["containerRecreateStates"],
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}]),
        "{crr:#}"
    );
    let after = wait_pod_ready(&mut cluster, "shop", "web-0").unwrap();
    assert_eq!(restart_count(&after, "app"), 1, "{after:#}");
    let status = &after["status"]["containerStatuses"][0];
    assert_eq!(
        status["lastState"]["terminated"]["exitCode"], 0,
        "{after:#}"
    );
}
