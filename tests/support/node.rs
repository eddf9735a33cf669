//! A real Kubernetes node for tests: Kubernetes' own kubelet, whose
//! `containerRuntimeEndpoint` and `imageServiceEndpoint` are a crr-proxy
//! binary's socket, in front of a private containerd ([`Containerd`]) with
//! a bridge network of its own (Debian's CNI plugins). Joins a
//! [`Cluster`](super::cluster::Cluster) as the node `name`.
//!
//! kubelet runs as an operator would run it on a machine of this kind:
//! cgroupfs, swap allowed, cgroup v1 accepted (`failCgroupV1: false`: these
//! machines mount v1), its own root, Pod-log folder, ports and serving
//! certificate; no QoS cgroups, so that two kubelets on one machine do not
//! share `/kubepods`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::cluster::{Cluster, Process, binary, free_port, tail, write_kubeconfig};
use super::containerd::Containerd;
use super::pki::KeyPair;

/// crr-proxy's agent on a node: `off` (the relay only), `standalone` or
/// `kruise`, with its own identity `crr-proxy:node:<node>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agent {
    Off,
    Standalone,
    Kruise,
    /// Kruise mode under kubelet's identity (`system:node:<node>`): the
    /// agent reads kubelet's own kubeconfig, which names the certificate
    /// kubelet rotates (one from the cluster's CSR signer, as after
    /// kubeadm's TLS bootstrap, `rotateCertificates: true`).
    KruiseAsKubelet,
}

impl Agent {
    fn flag(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Standalone => "standalone",
            Self::Kruise | Self::KruiseAsKubelet => "kruise",
        }
    }
}

/// kubelet's `evictionHard` on a test node: thresholds this machine is
/// always above, so that a fuller disk never evicts a test's Pods.
const EVICTION_HARD: &str = r#"{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"}"#;

/// Fields drop in order: kubelet and crr-proxy are stopped in `drop`,
/// then containerd removes what ran.
pub struct Node {
    pub name: String,
    pub dir: PathBuf,
    crr_proxy: PathBuf,
    agent: Agent,
    proxy: Option<Process>,
    /// crr-proxy runs socket-activated, under support::activation's
    /// supervisor (which `proxy` is then).
    activated: bool,
    /// crr-proxy's `--metrics-addr`, on loopback.
    metrics: String,
    kubelet: Option<Process>,
    /// kubelet's binary: the test build's, or another version's.
    kubelet_binary: PathBuf,
    /// Top-level keys of kubelet's configuration file that a test may set,
    /// as YAML values, for kubelet's next start: `evictionHard` and any key
    /// the fixed part of the file leaves out (kubelet reads the file
    /// strictly, so a key given twice is an error).
    kubelet_settings: BTreeMap<String, String>,
    bridge: String,
    pub containerd: Containerd,
}

impl Node {
    /// Starts containerd, crr-proxy (the `crr_proxy` binary) and kubelet,
    /// and waits until the node is Ready.
    pub fn start(
        cluster: &mut Cluster,
        name: &str,
        crr_proxy: &Path,
        agent: Agent,
    ) -> Result<Self> {
        Self::start_with(cluster, name, crr_proxy, agent, false, None)
    }

    /// As [`Node::start`], with `kubelet` (another version's binary).
    pub fn start_with_kubelet(
        cluster: &mut Cluster,
        name: &str,
        crr_proxy: &Path,
        agent: Agent,
        kubelet: &Path,
    ) -> Result<Self> {
        Self::start_with(cluster, name, crr_proxy, agent, false, Some(kubelet))
    }

    /// As [`Node::start`], with crr-proxy socket-activated: its socket held
    /// by a supervisor, as crr-proxy.socket holds it (support::activation),
    /// so that [`Node::restart_proxy`] keeps it.
    pub fn start_activated(
        cluster: &mut Cluster,
        name: &str,
        crr_proxy: &Path,
        agent: Agent,
    ) -> Result<Self> {
        Self::start_with(cluster, name, crr_proxy, agent, true, None)
    }

    fn start_with(
        cluster: &mut Cluster,
        name: &str,
        crr_proxy: &Path,
        agent: Agent,
        activated: bool,
        kubelet: Option<&Path>,
    ) -> Result<Self> {
        let kubelet_binary = match kubelet {
            Some(kubelet) => kubelet.to_owned(),
            None => binary("kubelet")?,
        };
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = cluster.dir.join("nodes").join(name);
        fs::create_dir_all(&dir)?;
        let containerd = Containerd::start()?;
        // A bridge name is at most 15 bytes; the process id keeps test
        // binaries apart, the counter nodes of one binary.
        let bridge = format!("crr{}n{n}", std::process::id() % 100_000);
        fs::write(
            containerd.cni_conf_dir().join("10-crr-test.conflist"),
            format!(
                r#"{{"cniVersion": "1.0.0", "name": "crr-test", "plugins": [
  {{"type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": false,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.244.{subnet}.0/24"}}]],
              "dataDir": "{ipam}"}}}},
  {{"type": "loopback"}}
]}}"#,
                subnet = n % 250,
                ipam = dir.join("ipam").display(),
            ),
        )?;
        let mut this = Self {
            name: name.to_owned(),
            dir,
            crr_proxy: crr_proxy.to_owned(),
            agent,
            proxy: None,
            activated,
            metrics: format!("127.0.0.1:{}", free_port("127.0.0.1")?),
            kubelet: None,
            kubelet_binary,
            kubelet_settings: BTreeMap::from([(
                "evictionHard".to_owned(),
                EVICTION_HARD.to_owned(),
            )]),
            bridge,
            containerd,
        };
        this.write_kubelet_kubeconfig(cluster)?;
        if matches!(agent, Agent::Standalone | Agent::Kruise) {
            let pair = cluster.pki.client(
                &format!("crr-proxy-{name}"),
                &format!("crr-proxy:node:{name}"),
                &["crr-proxy:nodes"],
            )?;
            write_kubeconfig(
                &this.agent_kubeconfig(),
                &cluster.server,
                &cluster.pki.ca().cert,
                &pair,
            )?;
        }
        this.start_proxy()?;
        this.start_kubelet(cluster)?;
        this.wait_ready(cluster)?;
        Ok(this)
    }

    /// crr-proxy's socket: kubelet's runtime and image endpoint.
    pub fn proxy_socket(&self) -> PathBuf {
        self.dir.join("crr-proxy.sock")
    }

    pub fn proxy_log(&self) -> PathBuf {
        self.dir.join("crr-proxy.log")
    }

    pub fn kubelet_log(&self) -> PathBuf {
        self.dir.join("kubelet.log")
    }

    fn agent_kubeconfig(&self) -> PathBuf {
        match self.agent {
            Agent::KruiseAsKubelet => self.kubelet_kubeconfig(),
            _ => self.dir.join("crr-proxy.kubeconfig"),
        }
    }

    /// Points crr-proxy's agent at `server`, a plain-HTTP front proxy
    /// that names the agent's user itself (support::front), and starts
    /// crr-proxy again.
    pub fn agent_through(&mut self, server: &str) -> Result<()> {
        plain_kubeconfig(&self.agent_kubeconfig(), server)?;
        self.stop_proxy();
        self.start_proxy()
    }

    pub fn kubelet_config(&self) -> PathBuf {
        self.dir.join("kubelet-config.yaml")
    }

    /// kubelet's certificate folder (`--cert-dir`).
    pub fn kubelet_certificates(&self) -> PathBuf {
        self.dir.join("kubelet-pki")
    }

    pub fn kubelet_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubelet.kubeconfig")
    }

    /// kubelet's client certificate (`system:node:<node>` in
    /// `system:nodes`) and its kubeconfig.
    fn write_kubelet_kubeconfig(&self, cluster: &mut Cluster) -> Result<()> {
        let name = &self.name;
        let pair = if self.agent == Agent::KruiseAsKubelet {
            let current = cluster.kubelet_client_certificate(name, &self.kubelet_certificates())?;
            KeyPair {
                cert: current.clone(),
                key: current,
            }
        } else {
            cluster.pki.client(
                &format!("kubelet-{name}"),
                &format!("system:node:{name}"),
                &["system:nodes"],
            )?
        };
        write_kubeconfig(
            &self.kubelet_kubeconfig(),
            &cluster.server,
            &cluster.pki.ca().cert,
            &pair,
        )
    }

    /// Starts crr-proxy on its socket (again, after [`Self::kill_proxy`]),
    /// and waits for the socket.
    pub fn start_proxy(&mut self) -> Result<()> {
        let mut command = if self.activated {
            // crr-proxy.service's RestartSec: how long systemd keeps it
            // down after it exits.
            super::activation::supervised(
                &self.proxy_socket(),
                Duration::from_secs(1),
                &self.crr_proxy,
            )
        } else {
            Command::new(&self.crr_proxy)
        };
        command
            .arg("run")
            .arg("--listen")
            .arg(self.proxy_socket())
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", self.containerd.socket().display()))
            .args(["--agent", self.agent.flag(), "--node-name", &self.name])
            .arg("--state-dir")
            .arg(self.dir.join("crr-proxy-state"))
            // The agent reads kubelet's feature gates there before a kill.
            .arg("--kubelet-config")
            .arg(self.kubelet_config())
            .args(["--log-format", "json", "--metrics-addr", &self.metrics])
            .env("RUST_LOG", "info");
        if self.agent != Agent::Off {
            command.arg("--kubeconfig").arg(self.agent_kubeconfig());
        }
        let _ = fs::remove_file(self.proxy_socket());
        self.proxy = Some(Process::spawn(
            "crr-proxy",
            &mut command,
            &self.proxy_log(),
        )?);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.proxy_socket().exists() {
            if let Some(proxy) = self.proxy.as_mut() {
                proxy.check()?;
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "crr-proxy did not serve its socket:\n{}",
                    tail(&self.proxy_log(), 20)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// crr-proxy's `/metrics` text.
    pub fn proxy_metrics(&self) -> Result<String> {
        super::metrics::scrape(&self.metrics)
    }

    /// crr-proxy's process id, while it runs.
    pub fn proxy_pid(&self) -> Option<u32> {
        self.proxy.as_ref().and_then(Process::pid)
    }

    /// Restarts a socket-activated crr-proxy: stopped (SIGTERM: drain,
    /// then exit) and started again a second later, as long as systemd
    /// keeps the service down after it exits (`RestartSec=1`), while the
    /// supervisor keeps the socket.
    pub fn restart_proxy(&self) -> Result<()> {
        if !self.activated {
            bail!("crr-proxy is not socket-activated on {}", self.name);
        }
        let pid = self
            .proxy_pid()
            .context("crr-proxy's supervisor is not running")?;
        kill(Pid::from_raw(pid as i32), Signal::SIGHUP)?;
        Ok(())
    }

    /// `kill -9` crr-proxy: kubelet's connection breaks mid-stream.
    pub fn kill_proxy(&mut self) -> Result<()> {
        let mut proxy = self.proxy.take().context("crr-proxy is not running")?;
        if let Some(pid) = proxy.pid() {
            kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
        }
        proxy.stop(Duration::from_secs(5));
        Ok(())
    }

    /// Stops crr-proxy as its service would (SIGTERM: drain, then exit).
    pub fn stop_proxy(&mut self) {
        if let Some(mut proxy) = self.proxy.take() {
            proxy.stop(Duration::from_secs(30));
        }
    }

    fn start_kubelet(&mut self, cluster: &Cluster) -> Result<()> {
        let name = &self.name;
        let pki = &cluster.pki;
        let kubeconfig = self.kubelet_kubeconfig();
        let socket = format!("unix://{}", self.proxy_socket().display());
        let config = self.kubelet_config();
        fs::write(
            &config,
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{ip}"
port: {port}
healthzPort: 0
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
protectKernelDefaults: false
containerRuntimeEndpoint: "{socket}"
imageServiceEndpoint: "{socket}"
podLogsDir: "{logs}"
serializeImagePulls: false
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: Webhook}}
rotateCertificates: {rotate}
{settings}"#,
                settings = self
                    .kubelet_settings
                    .iter()
                    .map(|(key, value)| format!("{key}: {value}\n"))
                    .collect::<String>(),
                rotate = self.agent == Agent::KruiseAsKubelet,
                ip = cluster.host_ip,
                port = free_port("0.0.0.0")?,
                logs = self.dir.join("pod-logs").display(),
                ca = pki.ca().cert.display(),
            ),
        )?;
        self.kubelet = Some(Process::spawn(
            "kubelet",
            Command::new(&self.kubelet_binary)
                .arg("--config")
                .arg(&config)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .arg("--root-dir")
                .arg(self.dir.join("kubelet"))
                .arg("--cert-dir")
                .arg(self.kubelet_certificates())
                .args(["--hostname-override", name, "--node-ip", &cluster.host_ip])
                .args(["--v", "2"]),
            &self.kubelet_log(),
        )?);
        Ok(())
    }

    /// Sets `key` of kubelet's configuration file to `value` (YAML) for
    /// kubelet's next start ([`Self::restart_kubelet`]).
    pub fn set_kubelet_setting(&mut self, key: &str, value: &str) {
        self.kubelet_settings
            .insert(key.to_owned(), value.to_owned());
    }

    /// Stops kubelet (SIGTERM, as systemd stops it) and starts it again
    /// with its configuration file written anew; waits until the node is
    /// Ready.
    pub fn restart_kubelet(&mut self, cluster: &mut Cluster) -> Result<()> {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(Duration::from_secs(10));
        }
        self.start_kubelet(cluster)?;
        self.wait_ready(cluster)
    }

    /// Waits until the Node's Ready condition is True.
    pub fn wait_ready(&mut self, cluster: &mut Cluster) -> Result<()> {
        let name = self.name.clone();
        cluster
            .wait(
                &format!("node {name} to be Ready"),
                Duration::from_secs(120),
                |c| {
                    if let Some(kubelet) = self.kubelet.as_mut() {
                        kubelet.check()?;
                    }
                    Ok(node_ready(c, &name)?.then_some(()))
                },
            )
            .with_context(|| format!("kubelet's log:\n{}", tail(&self.kubelet_log(), 30)))
    }

    /// kubelet's process, to check that it still runs.
    pub fn check(&mut self) -> Result<()> {
        if let Some(kubelet) = self.kubelet.as_mut() {
            kubelet.check()?;
        }
        if let Some(proxy) = self.proxy.as_mut() {
            proxy.check()?;
        }
        Ok(())
    }

    /// Stops and removes every Pod sandbox through CRI, as kubelet would,
    /// so that CNI takes back their interfaces, addresses and network
    /// namespaces (containerd's own clean-up only kills the tasks).
    fn remove_sandboxes(&self) {
        use crr_proxy::cri::v1::{
            ListPodSandboxRequest, RemovePodSandboxRequest, StopPodSandboxRequest,
        };
        let endpoint = self.containerd.endpoint();
        // A thread of its own: a test may hold a runtime already.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let mut cri = super::client(&endpoint);
                let Ok(list) = cri.list_pod_sandbox(ListPodSandboxRequest::default()).await else {
                    return;
                };
                for sandbox in list.into_inner().items {
                    let id = sandbox.id;
                    let _ = cri
                        .stop_pod_sandbox(StopPodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await;
                    let _ = cri
                        .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                        .await;
                }
            });
        })
        .join();
    }

    /// Unmounts what kubelet mounted under this node's folder (Pods'
    /// secret and projected volumes are tmpfs mounts).
    fn unmount_all(&self) {
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = self.dir.display().to_string();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| point.starts_with(&prefix))
            .collect();
        points.reverse();
        for point in points {
            let _ = Command::new("umount").args(["-l", point]).status();
        }
    }
}

/// Whether the Node `name` has condition Ready True.
pub fn node_ready(cluster: &Cluster, name: &str) -> Result<bool> {
    let node = cluster.get(&["node", name])?;
    Ok(node["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        }))
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(kubelet) = self.kubelet.as_mut() {
            kubelet.stop(Duration::from_secs(5));
        }
        self.stop_proxy();
        self.remove_sandboxes();
        self.unmount_all();
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

/// A kubeconfig that names `server` (plain HTTP) and no credentials.
pub fn plain_kubeconfig(path: &Path, server: &str) -> Result<()> {
    fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: front, cluster: {{server: \"{server}\"}}}}]\n\
             users: [{{name: u, user: {{}}}}]\n\
             contexts: [{{name: c, context: {{cluster: front, user: u}}}}]\n\
             current-context: c\n"
        ),
    )?;
    Ok(())
}

/// A Pod `namespace/name` on `node` with one container, `app`, that idles
/// and ends at once on SIGTERM; no probes.
pub fn idle_pod(namespace: &str, name: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "app", "image": super::images::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 1000000 & wait $!"]
            }]
        }
    })
}
