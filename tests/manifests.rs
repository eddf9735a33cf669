//! The manifests in deploy/ are what they claim to be.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use crr_proxy::crr::ContainerRecreateRequest;
use crr_proxy::crr::admission::admit;

fn deploy(path: &str) -> String {
    std::fs::read_to_string(format!("{}/deploy/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn every_example_crr_is_accepted_as_the_webhook_would() {
    let (pod, runtime) = support::pods::running_web_pod("shop");
    let dir = format!("{}/deploy/examples", env!("CARGO_MANIFEST_DIR"));
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let crr: ContainerRecreateRequest = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", entry.path().display()));
        assert_eq!(crr.spec.pod_name, "web-0");
        admit(&crr, &pod, &runtime)
            .unwrap_or_else(|e| panic!("{}: refused: {e}", entry.path().display()));
        seen += 1;
    }
    assert_eq!(seen, 5);
}

#[test]
fn the_kubelet_snippet_points_both_endpoints_at_the_proxy_socket() {
    let config: serde_json::Value = serde_saphyr::from_str(&deploy("kubelet-config.yaml")).unwrap();
    assert_eq!(config["kind"], "KubeletConfiguration");
    for key in ["containerRuntimeEndpoint", "imageServiceEndpoint"] {
        assert_eq!(config[key], "unix:///run/crr-proxy/crr-proxy.sock", "{key}");
    }
}

/// The kruise-daemon patch keeps it off exactly the nodes labelled as its
/// comment says: NotIn matches a node without the label, or with another
/// value.
#[test]
fn the_kruise_daemon_patch_keeps_it_off_labelled_nodes() {
    let text = deploy("kruise-daemon-affinity.yaml");
    assert!(text.contains("kubectl label node NODE crr-proxy.io/agent=kruise"));
    let patch: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let terms = &patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let allowed = |labels: serde_json::Value| {
        terms.as_array().unwrap().iter().any(|term| {
            term["matchExpressions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| {
                    let value = labels[e["key"].as_str().unwrap()].as_str();
                    let listed = value
                        .is_some_and(|v| e["values"].as_array().unwrap().iter().any(|x| x == v));
                    match e["operator"].as_str().unwrap() {
                        "NotIn" => !listed,
                        "In" => listed,
                        other => panic!("operator {other}"),
                    }
                })
        })
    };
    assert!(!allowed(
        serde_json::json!({"crr-proxy.io/agent": "kruise"})
    ));
    assert!(allowed(serde_json::json!({})));
    assert!(allowed(
        serde_json::json!({"crr-proxy.io/agent": "standalone"})
    ));
}
