//! kubelet's image service through crr-proxy (`imageServiceEndpoint` is
//! its socket): image pulls from a registry, and what kubelet collects, dead
//! containers, a deleted Pod's sandbox and unused images.

use std::time::{Duration, Instant};

use support::node::{Agent, Node};
use support::registry::Registry;

use super::*;

const NAMESPACE: &str = "images";

/// A Pod on node-a that runs `image`, pulled each time (`Always`).
fn pulled_pod(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": "node-a",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "app", "image": image, "imagePullPolicy": "Always",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 1000000 & wait $!"]
            }]
        }
    })
}

/// containerd's containers of Pod `pod` of this test: `kind` is
/// `sandbox` or `container`.
fn containers_of(node: &Node, pod: &str, kind: &str) -> Vec<String> {
    node.containerd
        .ctr(&[
            "-n",
            "k8s.io",
            "containers",
            "ls",
            "-q",
            &format!(
                "labels.\"io.kubernetes.pod.name\"=={pod},labels.\"io.cri-containerd.kind\"=={kind}"
            ),
        ])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// containerd's image references.
fn images(node: &Node) -> Vec<String> {
    node.containerd
        .ctr(&["-n", "k8s.io", "images", "ls", "-q"])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// How often crr-proxy relayed `method` (`Service/Method`).
fn relayed(node: &Node, method: &str) -> u64 {
    cri_calls(&node.proxy_metrics().unwrap())
        .get(method)
        .copied()
        .unwrap_or_default()
}

/// Waits up to `limit` for `done`, checking the node each second.
fn wait_node(node: &mut Node, what: &str, limit: Duration, mut done: impl FnMut(&Node) -> bool) {
    let deadline = Instant::now() + limit;
    while !done(node) {
        node.check().unwrap();
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Real parts: etcd, kube-apiserver, kube-controller-manager, kubelet
/// (image pulls, its dead-container deleter, container garbage collection,
/// image garbage collection under disk pressure), kubectl, containerd,
/// runc; Debian's docker-registry (distribution 2.8) and skopeo.
/// - A Pod's image is pulled from a registry on loopback through
///   crr-proxy.
/// - Three CRRs leave three dead containers; kubelet removes all but the
///   newest, and still counts three restarts.
/// - A deleted Pod's sandbox is removed by kubelet's container garbage
///   collection (once a minute).
/// - Under disk pressure (an `imagefs.available` threshold above what is
///   free), kubelet removes the unused image, and the node stays Ready.
///   (The test ends there: containerd 1.6 pins no image, so the sandbox
///   image goes too, and this node could start no Pod after.)
#[test]
fn kubelet_pulls_and_collects_through_crr_proxy() {
    let registry = Registry::start().unwrap();
    let image = registry.push_busybox("crr-test/busybox:pulled").unwrap();
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace(NAMESPACE).unwrap();
    let mut node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap();

    // The pull: kubelet's PullImage through crr-proxy, from the registry.
    cluster
        .apply(&pulled_pod("pulled", &image).to_string())
        .unwrap();
    wait_pod_ready(&mut cluster, NAMESPACE, "pulled").unwrap();
    assert!(relayed(&node, "ImageService/PullImage") >= 1);
    assert!(images(&node).contains(&image), "{:?}", images(&node));
    let events = cluster
        .get(&[
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            "involvedObject.name=pulled,reason=Pulled",
        ])
        .unwrap();
    assert!(
        events["items"].as_array().is_some_and(|all| all
            .iter()
            .any(|e| e["message"].as_str().is_some_and(|m| m.contains(&image)))),
        "{events:#}"
    );

    // Three CRRs: kubelet's deleter keeps the newest dead container only.
    for restarts in 1..=3 {
        recreate(
            &mut cluster,
            NAMESPACE,
            &format!("again-{restarts}"),
            "pulled",
            restarts,
        );
    }
    wait_node(
        &mut node,
        "dead containers removed",
        Duration::from_secs(30),
        |node| containers_of(node, "pulled", "container").len() == 2,
    );
    assert!(relayed(&node, "RuntimeService/RemoveContainer") >= 2);
    let pod = cluster.get(&["pod", "pulled", "-n", NAMESPACE]).unwrap();
    assert_eq!(restart_count(&pod, "app"), 3, "{pod:#}");

    // Deleted: its containers go at once, its sandbox with the next
    // garbage collection.
    cluster
        .kubectl(&[
            "delete",
            "pod",
            "pulled",
            "-n",
            NAMESPACE,
            "--wait=true",
            "--timeout=60s",
        ])
        .unwrap();
    wait_node(
        &mut node,
        "the sandbox collected",
        Duration::from_secs(90),
        |node| {
            containers_of(node, "pulled", "sandbox").is_empty()
                && containers_of(node, "pulled", "container").is_empty()
        },
    );
    assert!(relayed(&node, "RuntimeService/RemovePodSandbox") >= 1);

    // Disk pressure: a threshold above what is free. kubelet frees what
    // it can before it evicts anything: unused images, at once
    // (imageMinimumGCAge 1s).
    node.set_kubelet_setting("evictionHard", r#"{"imagefs.available": "99%"}"#);
    node.set_kubelet_setting("evictionPressureTransitionPeriod", "0s");
    // (0s is taken as unset: the default, 2m.)
    node.set_kubelet_setting("imageMinimumGCAge", "1s");
    node.restart_kubelet(&mut cluster).unwrap();
    wait_node(
        &mut node,
        "the unused image removed",
        Duration::from_secs(90),
        |node| !images(node).contains(&image),
    );
    assert!(relayed(&node, "ImageService/RemoveImage") >= 1);
    let conditions = cluster.get(&["node", "node-a"]).unwrap()["status"]["conditions"].clone();
    let status = |kind: &str| {
        conditions
            .as_array()
            .and_then(|all| all.iter().find(|c| c["type"] == kind))
            .map(|c| c["status"].clone())
    };
    assert_eq!(
        status("DiskPressure"),
        Some(json!("True")),
        "{conditions:#}"
    );
    assert_eq!(status("Ready"), Some(json!("True")), "{conditions:#}");
}
