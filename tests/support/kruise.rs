//! OpenKruise's real kruise-manager (v1.9.0, built from its Go module by
//! scripts/lib/kruise.sh into the folder `CRR_TEST_KRUISE` names), out of
//! cluster against a [`Cluster`]'s API server, as its manager runs its
//! webhook server: `WEBHOOK_HOST=127.0.0.1` makes it register its webhooks
//! by URL with a certificate it makes itself.
//!
//! Installed: every CRD of the module's `config/crd/bases` (the manager
//! indexes some of them at start), the namespace kruise-system, and the two
//! webhook configurations of its `config/webhook`, named as its release
//! names them, keeping only the ContainerRecreateRequest webhook: the
//! others (Pods among them, `failurePolicy: Fail`) would put the manager on
//! the path of every Pod of the test cluster.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::cluster::{Cluster, Process, free_port, write_kubeconfig};
use super::node::Node;
use super::pki::KeyPair;

const BINARIES_ENV: &str = "CRR_TEST_KRUISE";
/// The one webhook kept: kruise's CRR defaulting and checks.
const CRR_WEBHOOK: &str = "mcontainerrecreaterequest.kb.io";

/// The folder with kruise-manager, kruise-daemon, crd/ and webhook.yaml.
pub fn folder() -> Result<PathBuf> {
    let dir = std::env::var_os(BINARIES_ENV).with_context(|| {
        format!("{BINARIES_ENV} is not set: run the test command (scripts/test.sh), which builds OpenKruise")
    })?;
    Ok(PathBuf::from(dir))
}

/// A running kruise-manager; stopped when dropped.
pub struct KruiseManager {
    process: Process,
}

impl KruiseManager {
    /// Installs OpenKruise's CRDs and CRR webhook in `cluster`, starts the
    /// manager as the cluster's admin, and waits until its webhook answers.
    pub fn start(cluster: &mut Cluster) -> Result<Self> {
        let dir = folder()?;
        let crds = dir.join("crd");
        cluster
            .kubectl(&[
                "apply",
                "--server-side",
                "-f",
                crds.to_str().context("path")?,
            ])
            .context("kruise's CRDs")?;
        cluster.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ])?;
        cluster.namespace("kruise-system")?;
        let text = fs::read_to_string(dir.join("webhook.yaml"))?;
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text)?;
        for mut document in documents {
            let name = document["metadata"]["name"].as_str().unwrap_or_default();
            // config/default names them kruise-<name>.
            document["metadata"]["name"] = json!(format!("kruise-{name}"));
            let kept: Vec<Value> = document["webhooks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|w| w["name"] == CRR_WEBHOOK)
                .cloned()
                .collect();
            document["webhooks"] = json!(kept);
            cluster.apply(&document.to_string())?;
        }

        let work = cluster.dir.join("kruise");
        fs::create_dir_all(work.join("log"))?;
        let port = free_port("127.0.0.1")?;
        let mut command = Command::new(dir.join("kruise-manager"));
        command
            .arg("--enable-leader-election=false")
            .arg("--enable-pprof=false")
            .arg(format!(
                "--metrics-addr=127.0.0.1:{}",
                free_port("127.0.0.1")?
            ))
            .arg(format!(
                "--health-probe-addr=127.0.0.1:{}",
                free_port("127.0.0.1")?
            ))
            .arg(format!(
                "--protection-log-path={}",
                work.join("log").display()
            ))
            .arg("--kubeconfig")
            .arg(cluster.admin_kubeconfig())
            .env("POD_NAMESPACE", "kruise-system")
            .env("WEBHOOK_HOST", "127.0.0.1")
            .env("WEBHOOK_PORT", port.to_string())
            .env("WEBHOOK_CERT_DIR", work.join("certs"));
        let mut this = Self {
            process: Process::spawn("kruise-manager", &mut command, &work.join("manager.log"))?,
        };
        let url =
            format!("https://127.0.0.1:{port}/mutate-apps-kruise-io-containerrecreaterequest");
        cluster.wait(
            "kruise-manager's webhook to be registered",
            Duration::from_secs(120),
            |c| {
                this.process.check()?;
                let hooks = c.get(&[
                    "mutatingwebhookconfiguration",
                    "kruise-mutating-webhook-configuration",
                ])?;
                let hook = &hooks["webhooks"][0];
                Ok((hook["clientConfig"]["url"] == url
                    && hook["clientConfig"]["caBundle"].is_string())
                .then_some(()))
            },
        )?;
        // Registered is not serving: wait for its readiness check.
        this.process
            .wait_listening(&format!("127.0.0.1:{port}"), Duration::from_secs(60))?;
        Ok(this)
    }

    /// Fails, with the log's tail, when the manager has exited.
    pub fn check(&mut self) -> Result<()> {
        self.process.check()
    }
}

/// Where the kruise-daemon Pod finds its kubeconfig and certificates.
const DAEMON_CONFIG: &str = "/etc/kruise-daemon";

/// OpenKruise's real kruise-daemon as its DaemonSet runs it on `node`: a Pod
/// in kruise-system, labelled `control-plane: daemon`, service account
/// `kruise-daemon`, host network, `NODE_NAME` from the Pod's node, and the
/// runtime's socket at `/hostvarrun/containerd.sock` (the chart mounts the
/// host's `/var/run` there; here the node's private containerd, straight,
/// not through crr-proxy). The image is the suite's busybox with the
/// daemon's binary mounted from the test cache, and it talks to the API
/// server as the cluster's admin (the chart gives it a service account and
/// the daemon's ClusterRole; this cluster runs no kube-proxy for the
/// in-cluster address), or through `front` (a plain-HTTP front proxy,
/// support::front) when given. Apply the manifest returned; its readiness
/// is the daemon's own `/healthz`, which waits for its CRR informer.
pub fn daemon_pod(cluster: &mut Cluster, node: &Node, front: Option<&str>) -> Result<Value> {
    let binaries = folder()?;
    cluster.apply(
        r#"{"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "kruise-daemon", "namespace": "kruise-system"}}"#,
    )?;
    let config = node.dir.join("kruise-daemon");
    fs::create_dir_all(&config)?;
    if let Some(server) = front {
        super::node::plain_kubeconfig(&config.join("kubeconfig"), server)?;
    } else {
        let admin = cluster
            .pki
            .client("kruise-daemon", "kubernetes-admin", &["system:masters"])?;
        fs::copy(cluster.pki.ca().cert, config.join("ca.pem"))?;
        fs::copy(&admin.cert, config.join("cert.pem"))?;
        fs::copy(&admin.key, config.join("key.pem"))?;
        let inside = std::path::Path::new(DAEMON_CONFIG);
        write_kubeconfig(
            &config.join("kubeconfig"),
            &cluster.server,
            &inside.join("ca.pem"),
            &KeyPair {
                cert: inside.join("cert.pem"),
                key: inside.join("key.pem"),
            },
        )?;
    }
    let health = free_port("127.0.0.1")?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("kruise-daemon-{}", node.name),
            "namespace": "kruise-system",
            "labels": {"control-plane": "daemon"}
        },
        "spec": {
            "nodeName": node.name,
            "hostNetwork": true,
            "serviceAccountName": "kruise-daemon",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 10,
            "containers": [{
                "name": "daemon",
                "image": super::images::BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": [
                    "/opt/kruise/kruise-daemon",
                    format!("--kubeconfig={DAEMON_CONFIG}/kubeconfig"),
                    format!("--addr=127.0.0.1:{health}"),
                    "--enable-pprof=false",
                    "--logtostderr=true"
                ],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "readinessProbe": {
                    "httpGet": {"host": "127.0.0.1", "port": health, "path": "/healthz"},
                    "periodSeconds": 1
                },
                "volumeMounts": [
                    {"name": "binaries", "mountPath": "/opt/kruise", "readOnly": true},
                    {"name": "config", "mountPath": DAEMON_CONFIG, "readOnly": true},
                    {"name": "runtime", "mountPath": "/hostvarrun/containerd.sock"}
                ]
            }],
            "volumes": [
                {"name": "binaries", "hostPath": {"path": binaries, "type": "Directory"}},
                {"name": "config", "hostPath": {"path": config, "type": "Directory"}},
                {"name": "runtime", "hostPath": {"path": node.containerd.socket(), "type": "Socket"}}
            ]
        }
    }))
}
