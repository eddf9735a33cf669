//! crr-proxy on a real Kubernetes: Kubernetes' own etcd, kube-apiserver,
//! kube-controller-manager, kubelet and kubectl (v1.37, built from their Go
//! modules by scripts/lib/kube.sh), each kubelet in front of crr-proxy and
//! a private containerd (`Node::start`). Each test names the real parts
//! it uses.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

#[path = "../support/mod.rs"]
mod support;

mod fakes;
mod images;
mod kruise;
mod relay;
mod restart;
mod rules;
mod standalone;
mod streaming;

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};
use support::cluster::Cluster;
use support::images::BUSYBOX_IMAGE;
use support::metrics::{cri_calls, cri_calls_by_code};

const CRR_PROXY: &str = env!("CARGO_BIN_EXE_crr-proxy");

fn crr_proxy() -> &'static Path {
    Path::new(CRR_PROXY)
}

/// A Pod on `node` whose container `app` serves HTTP on 8080 (busybox's
/// httpd, beside a shell that ends at once on SIGTERM), logs a line a
/// second, and is probed by
/// kubelet over the Pod network (readiness) and by exec (liveness).
fn web_pod(namespace: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo started; mkdir -p /www; echo ok >/www/index.html; httpd -f -p 8080 -h /www & trap 'exit 0' TERM; while true; do echo tick; sleep 1; done"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 2}
            }]
        }
    })
}

/// Waits until Pod `name` is Ready; returns it.
fn wait_pod_ready(cluster: &mut Cluster, namespace: &str, name: &str) -> Result<Value> {
    cluster.wait(
        &format!("Pod {namespace}/{name} to be Ready"),
        Duration::from_secs(90),
        |c| {
            let pod = c.get(&["pod", name, "-n", namespace])?;
            let ready = pod["status"]["conditions"].as_array().is_some_and(|all| {
                all.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            Ok(ready.then_some(pod))
        },
    )
}

/// The restart count of container `container` in a Pod.
fn restart_count(pod: &Value, container: &str) -> i64 {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == container))
        .and_then(|s| s["restartCount"].as_i64())
        .unwrap_or(-1)
}

/// Creates a v1alpha1 CRR for `containers` of Pod `pod`.
fn create_crr(cluster: &Cluster, namespace: &str, name: &str, pod: &str, containers: &[&str]) {
    let containers: Vec<Value> = containers.iter().map(|c| json!({"name": c})).collect();
    cluster
        .apply(
            &json!({
                "apiVersion": "apps.kruise.io/v1alpha1",
                "kind": "ContainerRecreateRequest",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"podName": pod, "containers": containers, "strategy": {"minStartedSeconds": 1}}
            })
            .to_string(),
        )
        .unwrap();
}

/// CRRs as v1alpha1 shows them (kubectl's plain `containerrecreaterequests`
/// is the preferred version, v1beta1, whose schema defaults `isKilled`).
const CRR_V1ALPHA1: &str = "containerrecreaterequests.v1alpha1.apps.kruise.io";

/// Waits (90 s) for a CRR to be Completed, as v1alpha1; returns it.
fn wait_crr_completed(cluster: &mut Cluster, namespace: &str, name: &str) -> Value {
    cluster
        .wait(
            &format!("CRR {namespace}/{name} to complete"),
            Duration::from_secs(90),
            |c| {
                let crr = c.get(&[CRR_V1ALPHA1, name, "-n", namespace])?;
                Ok((crr["status"]["phase"] == "Completed").then_some(crr))
            },
        )
        .unwrap()
}

/// Recreates `app` of `pod` in `namespace` through a new CRR and checks that
/// the real kubelet started it again, its `restarts`th time.
fn recreate(cluster: &mut Cluster, namespace: &str, crr: &str, pod: &str, restarts: i64) {
    create_crr(cluster, namespace, crr, pod, &["app"]);
    let done = wait_crr_completed(cluster, namespace, crr);
    assert_eq!(
        done["status"]["containerRecreateStates"],
        json!([{"name": "app", "phase": "Succeeded", "isKilled": true}]),
        "{done:#}"
    );
    let after = wait_pod_ready(cluster, namespace, pod).unwrap();
    assert_eq!(restart_count(&after, "app"), restarts, "{after:#}");
}
