//! The try-out (`scripts/try.sh`, examples/try_out.rs), and its test: the
//! whole loop on one machine. Real: containerd and runc, and the crr-proxy
//! binary serving the CRI socket with `--agent standalone`. Emulated: the
//! cluster around them, which is this test support's API server (with the
//! node policy and the restart ClusterRole enforced), its kubelet role
//! (talking CRI through crr-proxy's socket) and its disruption controller.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::apiserver::{FakeApiServer, Resource};
use super::containerd::Containerd;
use super::kubelet::{ContainerSpec, Kubelet, PodSpec};
use super::roles::{NAMESPACE, wait_for};
use super::workloads::{self, DisruptionController};

pub const NODE: &str = "try-node";
const NODE_TOKEN: &str = "try-node-token";
const OPERATOR_TOKEN: &str = "try-operator-token";

pub struct Demo {
    pub kubeconfig: PathBuf,
    pub socket: PathBuf,
    pub api_url: String,
    pub ctrd_endpoint: String,
    pub log: PathBuf,
    bin: PathBuf,
    daemon: Child,
    kubelet: Kubelet,
    api: FakeApiServer,
    _disruption: DisruptionController,
    _ctrd: Containerd,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.daemon.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.daemon.wait();
    }
}

/// One container's status, for before and after.
#[derive(Debug, Default)]
struct Status {
    id: String,
    restarts: i64,
    last_reason: String,
}

fn statuses(pod: &Value) -> Vec<(String, Status)> {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let id = c["containerID"].as_str().unwrap_or_default();
            let id = id.rsplit("://").next().unwrap_or(id);
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                Status {
                    id: id.chars().take(13).collect(),
                    restarts: c["restartCount"].as_i64().unwrap_or(0),
                    last_reason: c["lastState"]["terminated"]["reason"]
                        .as_str()
                        .unwrap_or("-")
                        .to_owned(),
                },
            )
        })
        .collect()
}

impl Demo {
    /// Starts containerd, the emulated cluster and `bin` (crr-proxy) as
    /// the node's daemon, with everything under `dir`.
    pub async fn start(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let ctrd = tokio::task::spawn_blocking(Containerd::start).await??;
        let api = FakeApiServer::start_for_node(NODE, NODE_TOKEN).await;
        let disruption = DisruptionController::start(&api);
        let node_kubeconfig = dir.join("node.kubeconfig");
        super::write_kubeconfig_as(&node_kubeconfig, &api.url, Some(NODE_TOKEN));
        let socket = dir.join("crr-proxy.sock");
        let _ = std::fs::remove_file(&socket);
        let log = dir.join("crr-proxy.log");
        // Its settings are the flags alone (not a node's settings file).
        let settings = dir.join("config.toml");
        std::fs::write(&settings, "")?;
        let daemon = Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(&settings)
            .arg("--listen")
            .arg(&socket)
            .args(["--runtime-endpoint", &ctrd.endpoint().to_string()])
            .args(["--agent", "standalone", "--node-name", NODE])
            .arg("--kubeconfig")
            .arg(&node_kubeconfig)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--metrics-addr", "off"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        super::wait_for_path(&socket);
        let endpoint = crr_proxy::proxy::Endpoint::from_path(&socket);
        let kubelet =
            Kubelet::start(&api, super::client(&endpoint), NODE, ctrd.scratch("logs")).await;
        // The agent is at work once it holds the standalone Lease.
        wait_for(Duration::from_secs(30), || {
            api.get(Resource::Lease, "crr-proxy-system", "crr-proxy-claimer")
                .filter(|l| l["spec"]["holderIdentity"] == NODE)
        })
        .await
        .ok_or_else(|| {
            anyhow::anyhow!("crr-proxy did not take the Lease; see {}", log.display())
        })?;
        // The operator: exactly what deploy/base/rbac-restart.yaml grants.
        api.add_user(
            OPERATOR_TOKEN,
            super::policy::UserInfo {
                username: "operator".into(),
                groups: vec!["system:authenticated".into()],
            },
        );
        let role: Value =
            serde_saphyr::from_str(include_str!("../../deploy/base/rbac-restart.yaml"))?;
        api.grant("operator", &role["rules"]);
        let kubeconfig = dir.join("kubeconfig");
        super::write_kubeconfig_as(&kubeconfig, &api.url, Some(OPERATOR_TOKEN));
        Ok(Self {
            kubeconfig,
            socket,
            api_url: api.url.clone(),
            ctrd_endpoint: ctrd.endpoint().to_string(),
            log,
            bin: bin.to_owned(),
            daemon,
            kubelet,
            api,
            _disruption: disruption,
            _ctrd: ctrd,
        })
    }

    /// Runs `crr-proxy restart args…` as the operator, its output copied
    /// to `out` as it comes; the exit status.
    fn restart(&self, args: &[&str], out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
        use std::io::Read;
        writeln!(out, "$ crr-proxy restart {}", args.join(" "))?;
        let mut child = Command::new(&self.bin)
            .arg("restart")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut buffer = [0u8; 4096];
        loop {
            let n = stdout.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            out.write_all(&buffer[..n])?;
            out.flush()?;
        }
        let mut stderr = String::new();
        if let Some(mut err) = child.stderr.take() {
            err.read_to_string(&mut stderr)?;
        }
        out.write_all(stderr.as_bytes())?;
        let code = child.wait()?.code().unwrap_or(-1);
        writeln!(out, "(exit status {code})")?;
        Ok(code)
    }

    /// The demo: a Pod's container restarted and what happened to it, then
    /// a Deployment restarted in waves under a PodDisruptionBudget.
    pub async fn show(&self, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
        let mut app = ContainerSpec::graceful("app");
        app.pre_stop = Some(json!({"exec": {"command": ["sh", "-c", "echo draining"]}}));
        let pod = self
            .kubelet
            .run_pod(PodSpec::new(
                "demo",
                vec![app, ContainerSpec::graceful("sidecar")],
            ))
            .await;
        let before = statuses(&pod);
        writeln!(
            out,
            "\n== 1. One Pod: restart the app container of Pod demo =="
        )?;
        let started = Instant::now();
        let code =
            tokio::task::block_in_place(|| self.restart(&["demo", "-c", "app", "--wait"], out))?;
        let took = started.elapsed();
        let after = self
            .api
            .get(Resource::Pod, NAMESPACE, "demo")
            .map(|p| statuses(&p))
            .unwrap_or_default();
        writeln!(
            out,
            "\nWhat happened to Pod demo (read back from the API server), {:.1}s in all:",
            took.as_secs_f64()
        )?;
        writeln!(
            out,
            "  {:<8} {:<13}    {:<13} {:>8}  last state",
            "container", "ID before", "ID after", "restarts"
        )?;
        for (name, now) in &after {
            let was = before.iter().find(|(n, _)| n == name).map(|(_, s)| s);
            let was = was.map_or(("?".to_owned(), 0), |s| (s.id.clone(), s.restarts));
            writeln!(
                out,
                "  {name:<8} {:<13} -> {:<13} {:>3} -> {}  {}",
                was.0, now.id, was.1, now.restarts, now.last_reason
            )?;
        }
        let crr_states = self
            .api
            .list(
                Resource::Crr,
                Some(NAMESPACE),
                &super::apiserver::Selector::default(),
            )
            .into_iter()
            .flat_map(|c| {
                c["status"]["containerRecreateStates"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|s| {
                format!(
                    "{}: {}",
                    s["name"].as_str().unwrap_or("?"),
                    s["phase"].as_str().unwrap_or("?")
                )
            })
            .collect::<Vec<_>>();
        writeln!(out, "  CRR per-container states: {}", crr_states.join(", "))?;
        if code != 0 {
            anyhow::bail!("the restart of Pod demo failed (exit status {code})");
        }

        writeln!(
            out,
            "\n== 2. A workload: Deployment web (3 Pods), PodDisruptionBudget maxUnavailable 1 =="
        )?;
        let mut ready_later = ContainerSpec::graceful("app");
        ready_later.post_start = Duration::from_secs(1);
        workloads::create(
            &self.api,
            &self.kubelet,
            Resource::Deployment,
            "web",
            3,
            |name| PodSpec::new(name, vec![ready_later.clone()]),
        )
        .await;
        self.api
            .create(
                Resource::PodDisruptionBudget,
                NAMESPACE,
                json!({"metadata": {"name": "web"},
                       "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}),
            )
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        wait_for(Duration::from_secs(5), || {
            self.api
                .get(Resource::PodDisruptionBudget, NAMESPACE, "web")
                .filter(|b| b["status"]["disruptionsAllowed"] == 1)
        })
        .await;
        let code = tokio::task::block_in_place(|| {
            self.restart(
                &["deployment/web", "-c", "app", "--max-unavailable", "2"],
                out,
            )
        })?;
        if code != 0 {
            anyhow::bail!("the restart of deployment/web failed (exit status {code})");
        }
        Ok(())
    }
}
