//! kubelet's own restart rules (v1.37: the Pod's restartPolicy, a
//! container's restartPolicy and restartPolicyRules, RestartAllContainers)
//! against what crr-proxy decides and reports, the scenario
//! `restart_policies_decide_what_a_crr_does` plays against the kubelet test
//! role (tests/agent/kubelet.rs), here with the real kubelet reading the exit
//! codes through crr-proxy.

use std::time::Duration;

use support::node::{Agent, Node};

use super::*;

/// A container that ends with `code` on SIGTERM.
fn ending_with(name: &str, code: i32, restart: Value) -> Value {
    let mut container = json!({
        "name": name,
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", format!("trap 'exit {code}' TERM; while true; do sleep 1; done")],
    });
    if let (Some(container), Some(restart)) = (container.as_object_mut(), restart.as_object()) {
        container.extend(restart.clone());
    }
    container
}

fn pod(name: &str, policy: &str, app: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "rules"},
        "spec": {
            "nodeName": "node-a",
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [app, ending_with("sidecar", 0, Value::Null)]
        }
    })
}

fn container_status<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == name))
        .unwrap_or(&Value::Null)
}

/// Real parts: etcd, kube-apiserver, kube-controller-manager, kubelet
/// (restart policies and rules, its default feature gates), kubectl,
/// containerd, runc.
#[test]
fn the_real_kubelet_restarts_what_crr_proxy_says_it_will() {
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace("rules").unwrap();
    let _node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap();
    let rule = |action: &str, code: i32| json!([{"action": action, "exitCodes": {"operator": "In", "values": [code]}}]);
    let pods = [
        pod("never", "Never", ending_with("app", 0, Value::Null)),
        pod("once", "OnFailure", ending_with("app", 0, Value::Null)),
        pod(
            "on-42",
            "Never",
            ending_with(
                "app",
                0,
                json!({"restartPolicy": "Never", "restartPolicyRules": rule("Restart", 42)}),
            ),
        ),
        pod(
            "resets",
            "Always",
            ending_with(
                "app",
                143,
                json!({"restartPolicy": "OnFailure", "restartPolicyRules": rule("RestartAllContainers", 143)}),
            ),
        ),
    ];
    for pod in &pods {
        cluster.apply(&pod.to_string()).unwrap();
    }
    for name in ["never", "once", "on-42", "resets"] {
        wait_pod_ready(&mut cluster, "rules", name).unwrap();
    }
    let before = cluster.get(&["pod", "never", "-n", "rules"]).unwrap();
    for name in ["never", "once", "on-42", "resets"] {
        create_crr(&cluster, "rules", &format!("crr-{name}"), name, &["app"]);
    }

    let refused = wait_crr_completed(&mut cluster, "rules", "crr-never");
    assert_eq!(
        refused["status"]["containerRecreateStates"],
        // (isKilled: crr-proxy's CRD defaults it, and the real API server
        // applies that on every read.)
        json!([{"name": "app", "phase": "Failed", "isKilled": false,
                "message": "not recreated: app would not be started again: the Pod's restartPolicy is Never"}]),
        "{refused:#}"
    );
    let after = cluster.get(&["pod", "never", "-n", "rules"]).unwrap();
    assert_eq!(
        container_status(&after, "app")["containerID"],
        container_status(&before, "app")["containerID"]
    );
    assert_eq!(container_status(&after, "app")["restartCount"], 0);

    for (name, reported, real) in [("once", 143, 0), ("on-42", 42, 0), ("resets", 137, 143)] {
        let crr = format!("crr-{name}");
        let done = wait_crr_completed(&mut cluster, "rules", &crr);
        assert_eq!(
            done["status"]["containerRecreateStates"],
            json!([{"name": "app", "phase": "Succeeded", "isKilled": true}]),
            "{name}: {done:#}"
        );
        let pod = wait_pod_ready(&mut cluster, "rules", name).unwrap();
        let app = container_status(&pod, "app");
        assert_eq!(app["restartCount"], 1, "{name}: {app}");
        // What the real kubelet wrote from the ContainerStatus crr-proxy
        // relayed.
        let last = &app["lastState"]["terminated"];
        assert_eq!(last["exitCode"], reported, "{name}: {last}");
        assert_eq!(last["reason"], "ContainerRecreateRequest", "{name}: {last}");
        assert_eq!(
            last["message"],
            format!(
                "recreated by ContainerRecreateRequest rules/{crr} (exit code {real}, reported as {reported} so that kubelet starts it again)"
            ),
            "{name}"
        );
        // No Pod reset: the other container kept running.
        assert_eq!(
            container_status(&pod, "sidecar")["restartCount"],
            0,
            "{name}: {pod:#}"
        );
    }
    // Nothing restarted on its own meanwhile: the restart counts are the
    // same a while later.
    std::thread::sleep(Duration::from_secs(5));
    let pod = cluster.get(&["pod", "once", "-n", "rules"]).unwrap();
    assert_eq!(container_status(&pod, "app")["restartCount"], 1, "{pod:#}");
}

/// A native sidecar (an init container with `restartPolicy: Always`),
/// recreated like any container: the real kubelet starts it again, and the
/// Pod's app goes on.
#[test]
fn the_real_kubelet_starts_a_recreated_native_sidecar_again() {
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace("rules").unwrap();
    let _node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap();
    let mut meshed = pod("meshed", "Always", ending_with("app", 0, Value::Null));
    meshed["spec"]["containers"] = json!([ending_with("app", 0, Value::Null)]);
    meshed["spec"]["initContainers"] =
        json!([ending_with("mesh", 0, json!({"restartPolicy": "Always"}))]);
    cluster.apply(&meshed.to_string()).unwrap();
    wait_pod_ready(&mut cluster, "rules", "meshed").unwrap();
    create_crr(&cluster, "rules", "crr-mesh", "meshed", &["mesh"]);
    let done = wait_crr_completed(&mut cluster, "rules", "crr-mesh");
    assert_eq!(
        done["status"]["containerRecreateStates"],
        json!([{"name": "mesh", "phase": "Succeeded", "isKilled": true}]),
        "{done:#}"
    );
    let pod = wait_pod_ready(&mut cluster, "rules", "meshed").unwrap();
    let mesh = pod["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == "mesh"))
        .unwrap_or_else(|| panic!("{pod:#}"));
    assert_eq!(mesh["restartCount"], 1, "{pod:#}");
    assert!(mesh["state"]["running"].is_object(), "{pod:#}");
    assert_eq!(container_status(&pod, "app")["restartCount"], 0, "{pod:#}");
}

/// Real parts: kubelet v1.35.4 (RestartAllContainersOnContainerExits is
/// alpha there and off by default; its other gates as 1.37's), beside
/// etcd, kube-apiserver, kube-controller-manager and kubectl v1.37.2,
/// containerd, runc. Where kubelet 1.35 differs: a code that matches a
/// `RestartAllContainers` rule restarts the container alone, by its own
/// policy.
/// - A code such a rule names is still never reported: the real 143 goes
///   to kubelet as 137, which 1.35 restarts as 1.37 does.
/// - A container every exit of which matches such a rule is refused while
///   kubelet's configuration file leaves the gate unset (crr-proxy takes
///   it as on, and says so); with the gate set off there, crr-proxy
///   recreates it, and kubelet 1.35 starts it again alone.
#[test]
fn on_kubelet_1_35_restart_all_rules_give_way_to_the_containers_policy() {
    let older = support::cluster::older_kubelet().unwrap();
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace("rules").unwrap();
    let mut node = Node::start_with_kubelet(
        &mut cluster,
        "node-a",
        crr_proxy(),
        Agent::Standalone,
        &older,
    )
    .unwrap();
    let kubelet = cluster.get(&["node", "node-a"]).unwrap();
    assert_eq!(
        kubelet["status"]["nodeInfo"]["kubeletVersion"], "v1.35.4",
        "{kubelet:#}"
    );
    let every_exit = json!([{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": []}}]);
    let pods = [
        pod(
            "resets",
            "Always",
            ending_with(
                "app",
                143,
                json!({"restartPolicy": "OnFailure", "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [143]}}]}),
            ),
        ),
        pod(
            "every-exit",
            "Always",
            ending_with(
                "app",
                143,
                json!({"restartPolicy": "Always", "restartPolicyRules": every_exit}),
            ),
        ),
    ];
    for pod in &pods {
        cluster.apply(&pod.to_string()).unwrap();
    }
    for name in ["resets", "every-exit"] {
        wait_pod_ready(&mut cluster, "rules", name).unwrap();
    }
    create_crr(&cluster, "rules", "crr-resets", "resets", &["app"]);
    create_crr(&cluster, "rules", "crr-every-exit", "every-exit", &["app"]);

    let refused = wait_crr_completed(&mut cluster, "rules", "crr-every-exit");
    let message = refused["status"]["containerRecreateStates"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("matches a RestartAllContainers rule")
            && message.contains("RestartAllContainersOnContainerExits off"),
        "{refused:#}"
    );
    // The CRR `crr` completed, and kubelet started `name`'s app again,
    // told `reported`.
    let recreated = |cluster: &mut Cluster, crr: &str, name: &str, reported: i64| {
        let done = wait_crr_completed(cluster, "rules", crr);
        assert_eq!(
            done["status"]["containerRecreateStates"],
            json!([{"name": "app", "phase": "Succeeded", "isKilled": true}]),
            "{done:#}"
        );
        let pod = wait_pod_ready(cluster, "rules", name).unwrap();
        let app = container_status(&pod, "app");
        assert_eq!(app["restartCount"], 1, "{name}: {pod:#}");
        assert_eq!(
            app["lastState"]["terminated"]["exitCode"], reported,
            "{name}: {app}"
        );
        // kubelet 1.35 restarted the container alone.
        assert_eq!(
            container_status(&pod, "sidecar")["restartCount"],
            0,
            "{name}: {pod:#}"
        );
    };
    recreated(&mut cluster, "crr-resets", "resets", 137);

    // The gate set off in kubelet's file: crr-proxy reads it before the
    // kill, and the real 143 goes to kubelet as it is.
    node.set_kubelet_setting(
        "featureGates",
        r#"{"RestartAllContainersOnContainerExits": false}"#,
    );
    node.restart_kubelet(&mut cluster).unwrap();
    create_crr(
        &cluster,
        "rules",
        "crr-every-exit-2",
        "every-exit",
        &["app"],
    );
    recreated(&mut cluster, "crr-every-exit-2", "every-exit", 143);
}
