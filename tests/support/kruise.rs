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

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::cluster::{Cluster, Process, free_port};

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
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            this.process.check()?;
            if started.elapsed() > Duration::from_secs(60) {
                bail!("kruise-manager's webhook does not listen on {port}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(this)
    }

    /// Fails, with the log's tail, when the manager has exited.
    pub fn check(&mut self) -> Result<()> {
        self.process.check()
    }
}
