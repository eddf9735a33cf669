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

/// kustomize from the test cache (scripts/lib/kustomize.sh).
fn kustomize() -> std::path::PathBuf {
    let path = std::env::var_os("CRR_TEST_KUSTOMIZE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            "/var/cache/crr-proxy-test/kustomize-5.8.1+ds-1/usr/bin/kustomize".into()
        });
    assert!(
        path.exists(),
        "{} is missing: scripts/test.sh fetches kustomize (ensure_kustomize)",
        path.display()
    );
    path
}

fn output(command: &mut std::process::Command) -> String {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Numbers as floats: kustomize writes the CRD's `minimum: 0.0` as `0`.
fn numbers_as_floats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) => {
            if let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                *n = f;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(numbers_as_floats),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(numbers_as_floats),
        _ => {}
    }
}

/// The objects of a YAML stream, by kind, namespace and name.
fn objects(stream: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    stream
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .map(|mut doc| {
            numbers_as_floats(&mut doc);
            let key = format!(
                "{}/{}/{}",
                doc["kind"].as_str().unwrap(),
                doc["metadata"]["namespace"].as_str().unwrap_or_default(),
                doc["metadata"]["name"].as_str().unwrap()
            );
            (key, doc)
        })
        .collect()
}

/// Kubernetes' schemas, through kubernetes-validate (the peers' venv):
/// the lines it printed, and whether every object passed.
fn validate(stream: &str, version: &str) -> (bool, String) {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file =
        std::env::temp_dir().join(format!("crr-manifests-{}-{call}.yaml", std::process::id()));
    std::fs::write(&file, stream).unwrap();
    let out = std::process::Command::new(support::peers::python())
        .args(["-m", "kubernetes_validate", "--strict", "-k", version])
        .arg(&file)
        .output();
    std::fs::remove_file(&file).unwrap();
    let out = out.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `kubectl apply -k deploy/kruise` and `deploy/standalone` apply exactly
/// what `crr-proxy manifests --agent MODE` prints, every object valid
/// against Kubernetes' own schemas at 1.30 (the first with
/// ValidatingAdmissionPolicy GA) and 1.35, strictly (no unknown field).
#[test]
fn every_overlay_renders_to_what_manifests_prints_and_to_valid_objects() {
    let root = env!("CARGO_MANIFEST_DIR");
    for (overlay, count) in [("kruise", 15), ("standalone", 18)] {
        let built = output(
            std::process::Command::new(kustomize())
                .arg("build")
                .arg(format!("{root}/deploy/{overlay}")),
        );
        let printed = output(
            std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
                .args(["manifests", "--agent", overlay])
                .env_remove("CRR_PROXY_LEASE_NAME")
                .env_remove("CRR_PROXY_LEASE_NAMESPACE"),
        );
        let (built_objects, printed_objects) = (objects(&built), objects(&printed));
        assert_eq!(
            built_objects.keys().collect::<Vec<_>>(),
            printed_objects.keys().collect::<Vec<_>>(),
            "{overlay}"
        );
        assert_eq!(built_objects, printed_objects, "{overlay}");
        assert_eq!(
            built_objects.len(),
            count,
            "{overlay}: {:?}",
            built_objects.keys()
        );
        for version in ["1.30.0", "1.35.0"] {
            let (valid, report) = validate(&built, version);
            assert!(valid, "{overlay} at {version}:\n{report}");
            assert_eq!(
                report.matches(" passed for resource ").count(),
                count,
                "{report}"
            );
        }
    }
    // The standalone overlay brings the CRD and the Lease's namespace.
    let standalone = objects(&output(
        std::process::Command::new(kustomize())
            .arg("build")
            .arg(format!("{root}/deploy/standalone")),
    ));
    assert!(standalone.contains_key("Namespace//crr-proxy-system"));
    assert!(standalone.contains_key("Role/crr-proxy-system/crr-proxy-standalone-lease"));
    assert!(
        standalone
            .contains_key("CustomResourceDefinition//containerrecreaterequests.apps.kruise.io")
    );
}

/// Rendered for kubelet's identity, kruise mode's objects are valid too;
/// standalone mode is refused with the reason, as a usage error.
#[test]
fn kubelets_identity_renders_valid_objects_for_kruise_only() {
    let manifests = |agent: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .args(["manifests", "--agent", agent, "--identity", "kubelet"])
            .env_remove("CRR_PROXY_LEASE_NAME")
            .env_remove("CRR_PROXY_LEASE_NAMESPACE")
            .output()
            .unwrap()
    };
    let kruise = manifests("kruise");
    assert!(kruise.status.success());
    let printed = String::from_utf8(kruise.stdout).unwrap();
    let keys: Vec<String> = objects(&printed).into_keys().collect();
    assert_eq!(
        keys,
        [
            "ClusterRole//crr-proxy-kruise",
            "ClusterRole//crr-restart",
            "ClusterRoleBinding//crr-proxy-kruise",
            // The Lease-holder policy's parameter, held by no node.
            "Lease/crr-proxy-system/crr-proxy-claimer",
            "Namespace//crr-proxy-system",
            "ValidatingAdmissionPolicy//crr-proxy-lease-holder-claims",
            "ValidatingAdmissionPolicy//crr-proxy-own-node-crrs",
            "ValidatingAdmissionPolicyBinding//crr-proxy-lease-holder-claims",
            "ValidatingAdmissionPolicyBinding//crr-proxy-own-node-crrs",
        ]
    );
    for version in ["1.30.0", "1.35.0"] {
        let (valid, report) = validate(&printed, version);
        assert!(valid, "at {version}:\n{report}");
        assert_eq!(
            report.matches(" passed for resource ").count(),
            9,
            "{report}"
        );
    }
    let standalone = manifests("standalone");
    assert_eq!(standalone.status.code(), Some(2));
    let error = String::from_utf8_lossy(&standalone.stderr);
    assert!(
        error.contains("kubelet's identity serves --agent kruise only"),
        "{error}"
    );
}

/// The schema check refuses what it should, so that its passing means
/// something: a misspelt field, a missing required one.
#[test]
fn the_schema_check_refuses_a_misspelt_field_and_a_missing_one() {
    let rules = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: x\nrules:\n  - apiGroups: [\"\"]\n    resources: [pods]\n";
    let (valid, report) = validate(&format!("{rules}    verbs: [get]\n"), "1.35.0");
    assert!(valid, "{report}");
    let (valid, report) = validate(&format!("{rules}    verb: [get]\n"), "1.35.0");
    assert!(!valid, "{report}");
    assert!(
        report.contains("'verbs' is a required property"),
        "{report}"
    );
    let (valid, report) = validate(
        &format!("{rules}    verbs: [get]\n    verbz: [list]\n"),
        "1.35.0",
    );
    assert!(!valid, "{report}");
}
