//! Standalone mode on a real Kubernetes: deploy/standalone applied with the
//! real kubectl (its kustomize), the real API server's RBAC and admission
//! policies judging crr-proxy's writes, and the real kubelet restarting
//! what crr-proxy stopped.

use std::time::Duration;

use support::cluster::Cluster;
use support::node::{Agent, Node};

use super::*;

/// Real parts: etcd, kube-apiserver (Node,RBAC, ValidatingAdmissionPolicy),
/// kube-controller-manager, kubelet, kubectl, containerd, runc.
#[test]
fn a_crr_restarts_a_container_that_the_real_kubelet_starts_again() {
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace("shop").unwrap();
    let _node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap();
    cluster
        .apply(&web_pod("shop", "web-0", "node-a").to_string())
        .unwrap();
    let before = wait_pod_ready(&mut cluster, "shop", "web-0").unwrap();
    assert_eq!(restart_count(&before, "app"), 0);

    recreate(&mut cluster, "shop", "restart-app", "web-0", 1);
    // The app exits 0 on SIGTERM, and restartPolicy Always restarts any
    // code: nothing to report but the real one.
    let after = cluster.get(&["pod", "web-0", "-n", "shop"]).unwrap();
    let status = &after["status"]["containerStatuses"][0];
    assert_eq!(
        status["lastState"]["terminated"]["exitCode"], 0,
        "{after:#}"
    );
}

/// The holder of the standalone Lease, once one holds it.
fn lease_holder(cluster: &mut Cluster) -> String {
    cluster
        .wait("a node to hold the Lease", Duration::from_secs(60), |c| {
            let lease = c.get(&["lease", "crr-proxy-claimer", "-n", "crr-proxy-system"])?;
            Ok(lease["spec"]["holderIdentity"]
                .as_str()
                .filter(|h| !h.is_empty())
                .map(str::to_owned))
        })
        .unwrap()
}

/// Real parts: two real nodes on this machine (two kubelets, each with its
/// crr-proxy and containerd), etcd, kube-apiserver (its policies judging
/// each node's Lease and CRR writes), kube-controller-manager, kubectl.
#[test]
fn two_real_nodes_elect_one_claimer_and_ride_out_a_holder_loss_and_an_api_server_restart() {
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace("shop").unwrap();
    let mut nodes = [
        Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap(),
        Node::start(&mut cluster, "node-b", crr_proxy(), Agent::Standalone).unwrap(),
    ];
    for (pod, node) in [("web-a", "node-a"), ("web-b", "node-b")] {
        cluster
            .apply(&web_pod("shop", pod, node).to_string())
            .unwrap();
    }
    for pod in ["web-a", "web-b"] {
        wait_pod_ready(&mut cluster, "shop", pod).unwrap();
    }
    // One claimer for both nodes: each CRR is done by its Pod's node.
    recreate(&mut cluster, "shop", "first-a", "web-a", 1);
    recreate(&mut cluster, "shop", "first-b", "web-b", 1);

    // The holder's crr-proxy dies: the other node takes the Lease once it
    // has expired (15 s) and claims the next CRR for its own Pod.
    let holder = lease_holder(&mut cluster);
    let (gone, other, pod) = if holder == "node-a" {
        (0, "node-b", "web-b")
    } else {
        (1, "node-a", "web-a")
    };
    nodes[gone].kill_proxy().unwrap();
    recreate(&mut cluster, "shop", "after-loss", pod, 2);
    assert_eq!(lease_holder(&mut cluster), other);
    nodes[gone].start_proxy().unwrap();
    let node = nodes[gone].name.clone();
    nodes[gone]
        .wait_ready(&mut cluster)
        .unwrap_or_else(|e| panic!("{node}: {e:#}"));

    // kube-apiserver down for 5 s and back: both agents go on.
    cluster.restart_apiserver(Duration::from_secs(5)).unwrap();
    recreate(
        &mut cluster,
        "shop",
        "after-outage-a",
        "web-a",
        if gone == 0 { 2 } else { 3 },
    );
    recreate(
        &mut cluster,
        "shop",
        "after-outage-b",
        "web-b",
        if gone == 0 { 3 } else { 2 },
    );
    for node in &mut nodes {
        node.wait_ready(&mut cluster).unwrap();
    }
}
