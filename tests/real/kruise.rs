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

    // The fake API server prunes CRRs by crr-proxy's CRD, less what
    // kruise's lacks on a v1alpha1-only cluster
    // (tests/support/apiserver/pruning.rs): it declares every field kruise's
    // does, in each version, and those few besides.
    let theirs = cluster
        .get(&["crd", "containerrecreaterequests.apps.kruise.io"])
        .unwrap();
    let ours = serde_json::to_value(crr_proxy::crr::crd().unwrap()).unwrap();
    for version in ["v1alpha1", "v1beta1"] {
        let fields = |crd: &Value| {
            let schema = crd["spec"]["versions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == version)
                .map(|v| v["schema"]["openAPIV3Schema"].clone())
                .unwrap_or_else(|| panic!("no {version} in {crd}"));
            let mut fields = std::collections::BTreeSet::new();
            declared(&schema, "", &mut fields);
            fields
        };
        let (ours, theirs) = (fields(&ours), fields(&theirs));
        let lacks: std::collections::BTreeSet<String> = ours.difference(&theirs).cloned().collect();
        let beyond: Vec<&String> = theirs.difference(&ours).collect();
        assert!(
            beyond.is_empty(),
            "{version}: kruise declares {beyond:?} besides"
        );
        assert_eq!(
            lacks,
            support::apiserver::KRUISE_V1_9_LACKS
                .iter()
                .map(|f| f.to_string())
                .collect(),
            "{version}"
        );
    }

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

/// Every field path `schema` declares under `at` (apiVersion, kind and
/// metadata aside: kube-apiserver keeps those whatever the schema says).
fn declared(schema: &Value, at: &str, fields: &mut std::collections::BTreeSet<String>) {
    if let Some(properties) = schema["properties"].as_object() {
        for (name, field) in properties {
            if at.is_empty() && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            let path = format!("{at}.{name}");
            fields.insert(path.clone());
            declared(field, &path, fields);
        }
    }
    if schema["items"].is_object() {
        declared(&schema["items"], &format!("{at}[]"), fields);
    }
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

/// Real parts: OpenKruise's kruise-daemon v1.9.0 running as its DaemonSet
/// runs it, a Pod on the real node (kruise-system, `control-plane: daemon`,
/// host network, the runtime's socket under `/hostvarrun`), kruise-manager
/// v1.9.0 and its webhook, etcd, kube-apiserver, kube-controller-manager,
/// kubelet, kubectl, containerd, runc. While kruise-daemon runs on the node
/// it does the node's CRRs and crr-proxy's agent stops nothing; once its Pod
/// is deleted crr-proxy does them, and no container is stopped twice.
#[test]
fn beside_the_real_kruise_daemon_crr_proxy_stands_aside_and_takes_over_when_it_goes() {
    let mut cluster = Cluster::start().unwrap();
    let mut manager = KruiseManager::start(&mut cluster).unwrap();
    cluster.install("kruise").unwrap();
    cluster.namespace("shop").unwrap();
    let node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Kruise).unwrap();
    cluster
        .apply(&web_pod("shop", "web-0", "node-a").to_string())
        .unwrap();
    wait_pod_ready(&mut cluster, "shop", "web-0").unwrap();

    let daemon = support::kruise::daemon_pod(&mut cluster, &node, None).unwrap();
    let daemon_name = daemon["metadata"]["name"].as_str().unwrap().to_owned();
    cluster.apply(&daemon.to_string()).unwrap();
    wait_pod_ready(&mut cluster, "kruise-system", &daemon_name).unwrap();
    wait_proxy_log(&mut cluster, &node, "crr-proxy's agent stands aside");

    recreate(&mut cluster, "shop", "by-kruise-daemon", "web-0", 1);
    wait_killers(&mut cluster, "web-0", &["kruise-daemon-crr"]);
    let log = std::fs::read_to_string(node.proxy_log()).unwrap();
    assert!(!log.contains("killing container"), "{log}");

    cluster
        .kubectl(&["delete", "pod", &daemon_name, "-n", "kruise-system"])
        .unwrap();
    wait_proxy_log(&mut cluster, &node, "taking up its CRRs");
    // The CRR kruise-daemon ended is not done again.
    std::thread::sleep(Duration::from_secs(3));
    let pod = cluster.get(&["pod", "web-0", "-n", "shop"]).unwrap();
    assert_eq!(restart_count(&pod, "app"), 1, "{pod:#}");

    recreate(&mut cluster, "shop", "by-crr-proxy", "web-0", 2);
    wait_killers(&mut cluster, "web-0", &["crr-proxy", "kruise-daemon-crr"]);
    manager.check().unwrap();
}

/// Waits (60 s) until crr-proxy's log on `node` says `text`.
fn wait_proxy_log(cluster: &mut Cluster, node: &Node, text: &str) {
    cluster
        .wait(
            &format!("crr-proxy on {} to log {text:?}", node.name),
            Duration::from_secs(60),
            |_| {
                Ok(std::fs::read_to_string(node.proxy_log())?
                    .contains(text)
                    .then_some(()))
            },
        )
        .unwrap();
}

/// Waits (30 s) until the `Killing` Events of Pod `pod` in shop are those
/// of `reporters` (sorted), one Event each, then holds for two seconds: a
/// second stop of the same container would add one.
fn wait_killers(cluster: &mut Cluster, pod: &str, reporters: &[&str]) {
    let killers = |c: &mut Cluster| -> Result<Vec<String>> {
        let events = c.get(&["events", "-n", "shop"])?;
        let mut found: Vec<String> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reason"] == "Killing" && e["involvedObject"]["name"] == pod)
            .map(|e| {
                let reporter = e["reportingComponent"].as_str().unwrap_or_default();
                if reporter.is_empty() {
                    e["source"]["component"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                } else {
                    reporter.to_owned()
                }
            })
            .collect();
        found.sort();
        Ok(found)
    };
    cluster
        .wait(
            &format!("Killing events from {reporters:?}"),
            Duration::from_secs(30),
            |c| Ok((killers(c)? == reporters).then_some(())),
        )
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(killers(cluster).unwrap(), reporters);
}

/// A Pod for OpenKruise's e2e scenarios (`test/e2e/apps/v1alpha1/
/// containerrecreate.go`): `app` serves HTTP, is probed for readiness,
/// waits 3 s in postStart and 4 s in preStop (kruise's e2e: 5 and 8);
/// `sidecar` idles. Both end at once on SIGTERM.
fn e2e_pod(name: &str) -> Value {
    let mut pod = web_pod("shop", name, "node-a");
    let app = &mut pod["spec"]["containers"][0];
    app["lifecycle"] = json!({
        "postStart": {"exec": {"command": ["sleep", "3"]}},
        "preStop": {"exec": {"command": ["sleep", "4"]}}
    });
    pod["spec"]["terminationGracePeriodSeconds"] = json!(30);
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "name": "sidecar", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
        }));
    pod
}

/// A container's status in a Pod.
fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == name))
        .unwrap_or(&Value::Null)
}

/// Seconds between two RFC 3339 stamps (`later - earlier`).
fn seconds_between(earlier: &Value, later: &Value) -> i64 {
    let at = |v: &Value| {
        v.as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .unwrap_or_else(|| panic!("not a time: {v}"))
            .as_second()
    };
    at(later) - at(earlier)
}

/// Real parts: kruise-manager v1.9.0 and its webhook, etcd,
/// kube-apiserver, kube-controller-manager, kubelet, kubectl, containerd,
/// runc; crr-proxy's kruise agent in kruise-daemon's place. Three of
/// OpenKruise's own CRR e2e scenarios, with their checks (times shortened
/// with the hooks): 1a (one container, `minStartedSeconds`, the TTL), 3a
/// (the app's preStop runs whole and the kills are one after the other),
/// 2b (`orderedRecreate`: the sidecar is stopped only once the app is
/// running again and ready).
#[test]
fn openkruises_own_crr_scenarios_hold_on_the_real_manager() {
    let mut cluster = Cluster::start().unwrap();
    let mut manager = KruiseManager::start(&mut cluster).unwrap();
    cluster.install("kruise").unwrap();
    cluster.namespace("shop").unwrap();
    let _node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Kruise).unwrap();
    // A Pod each: a container restarted again would wait for kubelet's
    // back-off.
    for name in ["e2e-1a", "e2e-3a", "e2e-2b"] {
        cluster.apply(&e2e_pod(name).to_string()).unwrap();
    }
    let pods: Vec<Value> = ["e2e-1a", "e2e-3a", "e2e-2b"]
        .iter()
        .map(|name| wait_pod_ready(&mut cluster, "shop", name).unwrap())
        .collect();

    // 1a.
    let created = cluster
        .kubectl_in(
            &["create", "-o", "json", "-f", "-"],
            &json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                "metadata": {"name": "e2e-1a", "namespace": "shop"},
                "spec": {"podName": "e2e-1a", "containers": [{"name": "app"}],
                         "strategy": {"minStartedSeconds": 5}, "ttlSecondsAfterFinished": 3}
            })
            .to_string(),
        )
        .unwrap();
    let created: Value = serde_json::from_str(&created).unwrap();
    let labels = &created["metadata"]["labels"];
    assert_eq!(
        labels["crr.apps.kruise.io/pod-uid"],
        pods[0]["metadata"]["uid"]
    );
    assert_eq!(labels["crr.apps.kruise.io/node-name"], "node-a");
    assert_eq!(labels["crr.apps.kruise.io/active"], "true");
    assert_eq!(created["spec"]["strategy"]["failurePolicy"], "Fail");
    let old_app = container(&pods[0], "app")["containerID"].clone();
    assert_eq!(
        created["spec"]["containers"][0]["statusContext"]["containerID"],
        old_app
    );
    let done = wait_crr_completed(&mut cluster, "shop", "e2e-1a");
    assert!(done["status"]["completionTime"].is_string(), "{done:#}");
    // kruise-manager drops the active label once it sees the completion
    // (and only then counts the TTL): a moment after the daemon's write.
    cluster
        .wait(
            "kruise-manager to drop the active label",
            Duration::from_secs(6),
            |c| {
                let crr = c.get(&[CRR_V1ALPHA1, "e2e-1a", "-n", "shop"])?;
                Ok(crr["metadata"]["labels"]["crr.apps.kruise.io/active"]
                    .is_null()
                    .then_some(()))
            },
        )
        .unwrap();
    assert_eq!(
        done["status"]["containerRecreateStates"],
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
    );
    let pod = wait_pod_ready(&mut cluster, "shop", "e2e-1a").unwrap();
    let app = container(&pod, "app");
    assert_ne!(app["containerID"], old_app);
    assert_eq!(app["restartCount"], 1);
    assert!(
        seconds_between(
            &app["state"]["running"]["startedAt"],
            &done["status"]["completionTime"]
        ) > 4,
        "minStartedSeconds: {pod:#}\n{done:#}"
    );
    cluster
        .wait("the TTL to delete the CRR", Duration::from_secs(6), |c| {
            Ok(c.kubectl(&["get", CRR_V1ALPHA1, "e2e-1a", "-n", "shop"])
                .is_err()
                .then_some(()))
        })
        .unwrap();

    // 3a and 2b, at once.
    for (name, ordered) in [("e2e-3a", false), ("e2e-2b", true)] {
        cluster
            .apply(
                &json!({
                    "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                    "metadata": {"name": name, "namespace": "shop"},
                    "spec": {"podName": name, "containers": [{"name": "app"}, {"name": "sidecar"}],
                             "strategy": {"orderedRecreate": ordered}}
                })
                .to_string(),
            )
            .unwrap();
    }
    for (i, name) in [(1, "e2e-3a"), (2, "e2e-2b")] {
        let done = wait_crr_completed(&mut cluster, "shop", name);
        assert_eq!(
            done["status"]["containerRecreateStates"],
            json!([{"name": "app", "phase": "Succeeded", "isKilled": true},
                   {"name": "sidecar", "phase": "Succeeded", "isKilled": true}]),
            "{name}: {done:#}"
        );
        let pod = wait_pod_ready(&mut cluster, "shop", name).unwrap();
        for c in ["app", "sidecar"] {
            assert_ne!(
                container(&pod, c)["containerID"],
                container(&pods[i], c)["containerID"],
                "{name}: {c}"
            );
            assert_eq!(container(&pod, c)["restartCount"], 1, "{name}: {c}");
        }
        let finished =
            |c: &str| container(&pod, c)["lastState"]["terminated"]["finishedAt"].clone();
        if name == "e2e-3a" {
            // The app's preStop (4 s) ran whole before the sidecar's stop.
            assert!(
                seconds_between(&done["metadata"]["creationTimestamp"], &finished("sidecar")) >= 4,
                "{pod:#}\n{done:#}"
            );
        } else {
            // The sidecar waited for the app to run again past its
            // postStart (3 s) and be ready.
            assert!(
                seconds_between(&finished("app"), &finished("sidecar")) >= 3,
                "{pod:#}"
            );
        }
    }
    manager.check().unwrap();
}
