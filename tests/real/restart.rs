//! `kubectl crr restart` as the real kubectl (v1.37) finds and runs it (a
//! plugin on PATH), on a real Deployment whose Pods the real controllers
//! make, under a PodDisruptionBudget whose status the real disruption
//! controller keeps.

use std::process::Command;

use support::cluster::binary;
use support::node::{Agent, Node};

use super::*;

/// Real parts: kubectl (plugin discovery), kube-apiserver, the Deployment,
/// ReplicaSet and disruption controllers of kube-controller-manager,
/// kubelet, containerd, runc; crr-proxy's agent in standalone mode.
#[test]
fn kubectl_crr_restarts_a_real_deployment_in_waves_its_budget_allows() {
    let mut cluster = Cluster::start().unwrap();
    cluster.install("standalone").unwrap();
    cluster.namespace("shop").unwrap();
    let _node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Standalone).unwrap();
    let mut template = web_pod("shop", "web", "node-a");
    template["metadata"] = json!({"labels": {"app": "web"}});
    cluster
        .apply(
            &json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                         "template": {"metadata": template["metadata"], "spec": template["spec"]}}
            })
            .to_string(),
        )
        .unwrap();
    cluster
        .apply(
            &json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}
            })
            .to_string(),
        )
        .unwrap();
    cluster
        .wait(
            "3 available Pods and a budget of 1",
            Duration::from_secs(120),
            |c| {
                let deployment = c.get(&["deployment", "web", "-n", "shop"])?;
                let budget = c.get(&["pdb", "web", "-n", "shop"])?;
                Ok((deployment["status"]["availableReplicas"] == 3
                    && budget["status"]["disruptionsAllowed"] == 1)
                    .then_some(()))
            },
        )
        .unwrap();

    // kubectl finds `kubectl-crr` on PATH; the plugin reads KUBECONFIG.
    let bin = cluster.dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(CRR_PROXY, bin.join("kubectl-crr")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = Command::new(binary("kubectl").unwrap())
        .args([
            "crr",
            "restart",
            "deployment/web",
            "-n",
            "shop",
            "-c",
            "app",
        ])
        .args(["--max-unavailable", "2", "--wait", "--timeout", "300s"])
        .env("PATH", path)
        .env("KUBECONFIG", cluster.admin_kubeconfig())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "{said}");
    assert!(
        said.contains("deployment/web: 3 restarted, 0 skipped, 0 failed"),
        "{said}"
    );
    // The budget, not --max-unavailable, set the pace: three waves of one.
    assert!(said.contains("wave 3: "), "{said}");
    assert!(!said.contains("wave 4: "), "{said}");
    let pods = cluster
        .get(&["pods", "-n", "shop", "-l", "app=web"])
        .unwrap();
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 3);
    for pod in pods {
        assert_eq!(restart_count(pod, "app"), 1, "{pod:#}");
    }
}
