//! kubelet's streaming lists (KEP-5825, its alpha gate CRIListStreaming)
//! through crr-proxy, on whichever containerd the test command's pass runs.

use support::containerd::serves_streaming_lists;
use support::node::{Agent, Node, idle_pod};

use super::*;

/// Real parts: kubelet v1.37.2 with CRIListStreaming on (and etcd,
/// kube-apiserver, kube-controller-manager, kubectl), containerd (1.6 and
/// 2.3 in the test command's passes, which answer UNIMPLEMENTED; 2.4, which
/// serves the streams), runc. kubelet lists through crr-proxy with the
/// streams where containerd serves them, and falls back to the unary lists
/// on the UNIMPLEMENTED crr-proxy relays where it does not; either way the
/// node is Ready, a Pod runs and a CRR recreates its container.
#[test]
fn kubelet_lists_with_streams_through_crr_proxy_as_far_as_the_runtime_serves_them() {
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace("streaming").unwrap();
    let mut node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap();
    node.set_kubelet_setting("featureGates", r#"{"CRIListStreaming": true}"#);
    node.restart_kubelet(&mut cluster).unwrap();
    let before = cri_calls_by_code(&node.proxy_metrics().unwrap());

    cluster
        .apply(&idle_pod("streaming", "idle", "node-a").to_string())
        .unwrap();
    wait_pod_ready(&mut cluster, "streaming", "idle").unwrap();
    recreate(&mut cluster, "streaming", "again", "idle", 1);

    let after = cri_calls_by_code(&node.proxy_metrics().unwrap());
    let grew = |method: &str, code: &str| {
        let key = (format!("RuntimeService/{method}"), code.to_owned());
        after.get(&key).copied().unwrap_or_default() > before.get(&key).copied().unwrap_or_default()
    };
    if serves_streaming_lists().unwrap() {
        for method in ["StreamContainers", "StreamPodSandboxes"] {
            assert!(grew(method, "OK"), "{method}: {after:#?}");
        }
    } else {
        // kubelet asks once (its runtime client remembers the answer for
        // every list), and gets the runtime's UNIMPLEMENTED, never an OK.
        let streamed = |code: &str| {
            after
                .iter()
                .filter(|((method, c), _)| method.starts_with("RuntimeService/Stream") && c == code)
                .map(|(_, n)| n)
                .sum::<u64>()
        };
        assert!(streamed("UNIMPLEMENTED") >= 1, "{after:#?}");
        assert_eq!(streamed("OK"), 0, "{after:#?}");
        for method in ["ListContainers", "ListPodSandbox"] {
            assert!(grew(method, "OK"), "{method}: {after:#?}");
        }
    }
}
