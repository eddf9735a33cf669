//! A real Kubernetes for tests: etcd, kube-apiserver and
//! kube-controller-manager on loopback (this module), and real nodes, each a
//! kubelet in front of its own crr-proxy and private containerd
//! ([`node`](super::node)). The binaries are Kubernetes' own, built from
//! their Go modules by the test command (scripts/lib/kube.sh) into the
//! folder `CRR_TEST_KUBE` names.
//!
//! The API server runs as kubeadm sets it up: `Node,RBAC` authorization,
//! NodeRestriction beside the default admission plugins, service-account
//! tokens signed with the harness' key, clients known by certificates of
//! the harness' CA. The controller manager runs every default controller
//! with per-controller service-account credentials (garbage collection,
//! Deployments, the disruption controller, CSR signing and approval, node
//! lifecycle). There is no scheduler: test Pods name their node
//! (`spec.nodeName`).
//!
//! One cluster at a time per test binary (a lock held by [`Cluster`]): the
//! machine has two cores, and nodes share its cgroups.

use std::fs;
use std::io::Write;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::pki::{KeyPair, Pki};

/// Names the folder with etcd, kube-apiserver, kube-controller-manager,
/// kubelet and kubectl.
const BINARIES_ENV: &str = "CRR_TEST_KUBE";
/// The Service range; the API server's Service takes its first address.
const SERVICE_RANGE: &str = "10.96.0.0/16";
const SERVICE_IP: &str = "10.96.0.1";
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The path of a Kubernetes binary of the test build.
pub fn binary(name: &str) -> Result<PathBuf> {
    let dir = std::env::var_os(BINARIES_ENV).with_context(|| {
        format!("{BINARIES_ENV} is not set: run the test command (scripts/test.sh), which builds Kubernetes")
    })?;
    let path = Path::new(&dir).join(name);
    if !path.is_file() {
        bail!("{name} is not in {BINARIES_ENV}={}", path.display());
    }
    Ok(path)
}

/// Names a kubelet binary of an older minor (scripts/lib/kube.sh,
/// `ensure_older_kubelet`).
const OLDER_KUBELET_ENV: &str = "CRR_TEST_KUBELET_OLDER";

/// The older kubelet's path.
pub fn older_kubelet() -> Result<PathBuf> {
    let path = std::env::var_os(OLDER_KUBELET_ENV).map(PathBuf::from).with_context(|| {
        format!("{OLDER_KUBELET_ENV} is not set: run the test command (scripts/test.sh), which builds it")
    })?;
    if !path.is_file() {
        bail!("{OLDER_KUBELET_ENV}={} is not a file", path.display());
    }
    Ok(path)
}

/// A free TCP port on `ip`, for a server that must be told its port.
pub fn free_port(ip: &str) -> Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// This machine's address on its default route: kubelet will not take a
/// loopback address as its node's, and the API server reaches kubelets
/// there. (A UDP connect picks the route and sends nothing.)
pub fn host_ip() -> Result<String> {
    let socket = UdpSocket::bind("0.0.0.0:0")?;
    socket
        .connect("198.51.100.1:9")
        .context("no default route: a real node needs a non-loopback address")?;
    Ok(socket.local_addr()?.ip().to_string())
}

/// A process of the cluster, its output in a log file; killed when dropped.
pub struct Process {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Process {
    pub fn spawn(name: &str, command: &mut Command, log: &Path) -> Result<Self> {
        let file = fs::OpenOptions::new().create(true).append(true).open(log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("spawn {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fails, with the log's tail, when the process has exited.
    pub fn check(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                bail!("{} exited ({status}):\n{}", self.name, tail(&self.log, 40));
            }
        }
        Ok(())
    }

    /// Waits up to `limit` until `addr` accepts a TCP connection; fails,
    /// with the log's tail, when the process exits first or the time runs out.
    pub fn wait_listening(&mut self, addr: &str, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        while std::net::TcpStream::connect(addr).is_err() {
            self.check()?;
            if Instant::now() > deadline {
                bail!(
                    "{} did not listen on {addr} within {limit:?}:\n{}",
                    self.name,
                    tail(&self.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + grace;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes a kubeconfig for `server`, trusting `ca`, as the holder of `pair`.
/// Files are named, not embedded, as kubelet's own kubeconfig names its
/// rotated certificate.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, pair: &KeyPair) -> Result<()> {
    fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: test, cluster: {{server: \"{server}\", certificate-authority: \"{ca}\"}}}}]\n\
             users: [{{name: u, user: {{client-certificate: \"{cert}\", client-key: \"{key}\"}}}}]\n\
             contexts: [{{name: c, context: {{cluster: test, user: u}}}}]\n\
             current-context: c\n",
            ca = ca.display(),
            cert = pair.cert.display(),
            key = pair.key.display(),
        ),
    )?;
    Ok(())
}

pub struct Cluster {
    pub dir: PathBuf,
    pub pki: Pki,
    pub server: String,
    pub host_ip: String,
    admin: PathBuf,
    etcd: Process,
    apiserver: Process,
    /// To start it again after an outage.
    apiserver_args: Vec<std::ffi::OsString>,
    /// Started once the API server is ready: it would only log its
    /// retries until then.
    controllers: Option<Process>,
    _slot: Slot,
}

/// How many clusters of one test binary run at once. A real test mostly
/// waits (kubelet's sync, a container's grace): one cluster used under half
/// of one core of this 2-core machine (tests/real on containerd 1.6), so
/// two at a time take half the time.
const CLUSTERS_AT_ONCE: usize = 2;

/// One of [`CLUSTERS_AT_ONCE`] places, held while a cluster runs.
struct Slot;

static SLOTS: Mutex<usize> = Mutex::new(0);
static SLOT_FREED: Condvar = Condvar::new();

impl Slot {
    fn take() -> Self {
        let mut taken = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        while *taken >= CLUSTERS_AT_ONCE {
            taken = SLOT_FREED.wait(taken).unwrap_or_else(|p| p.into_inner());
        }
        *taken += 1;
        Self
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *SLOTS.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        SLOT_FREED.notify_one();
    }
}

impl Cluster {
    /// Starts etcd, kube-apiserver and kube-controller-manager, and waits
    /// for the API server to be ready and the default namespace's service
    /// account to exist.
    pub fn start() -> Result<Self> {
        let slot = Slot::take();
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kubectl",
        ] {
            binary(name)?;
        }
        let dir = super::fresh_dir("crr-kube")?;
        let host_ip = host_ip()?;
        let pki = Pki::create(&dir.join("pki"))?;
        let serving = pki.server(
            "apiserver",
            &["127.0.0.1", SERVICE_IP, &host_ip],
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
        )?;
        let admin_pair = pki.client("admin", "kubernetes-admin", &["system:masters"])?;
        let to_kubelets = pki.client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        )?;
        let controllers_pair =
            pki.client("controller-manager", "system:kube-controller-manager", &[])?;

        let etcd_port = free_port("127.0.0.1")?;
        let peer_port = free_port("127.0.0.1")?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Process::spawn(
            "etcd",
            Command::new(binary("etcd")?)
                .arg("--data-dir")
                .arg(dir.join("etcd"))
                .args([
                    "--name",
                    "default",
                    "--log-level",
                    "warn",
                    "--unsafe-no-fsync",
                ])
                .args([
                    "--listen-client-urls",
                    &etcd_url,
                    "--advertise-client-urls",
                    &etcd_url,
                ])
                .args([
                    "--listen-peer-urls",
                    &peer_url,
                    "--initial-advertise-peer-urls",
                    &peer_url,
                ])
                .args(["--initial-cluster", &format!("default={peer_url}")]),
            &dir.join("etcd.log"),
        )?;

        let port = free_port("127.0.0.1")?;
        let server = format!("https://127.0.0.1:{port}");
        let admin = dir.join("admin.kubeconfig");
        write_kubeconfig(&admin, &server, &pki.ca().cert, &admin_pair)?;
        let mut apiserver_command = Command::new(binary("kube-apiserver")?);
        apiserver_command
            .args(["--etcd-servers", &etcd_url])
            .args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &port.to_string(),
            ])
            .args(["--advertise-address", &host_ip])
            .arg("--tls-cert-file")
            .arg(&serving.cert)
            .arg("--tls-private-key-file")
            .arg(&serving.key)
            .arg("--client-ca-file")
            .arg(&pki.ca().cert)
            // A front proxy may name the user (support::front), as
            // kube-aggregator does.
            .arg("--requestheader-client-ca-file")
            .arg(&pki.ca().cert)
            .args([
                "--requestheader-allowed-names",
                super::front::FRONT_PROXY_NAME,
            ])
            .args(["--requestheader-username-headers", "X-Remote-User"])
            .args(["--requestheader-group-headers", "X-Remote-Group"])
            .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"])
            .arg("--service-account-key-file")
            .arg(pki.service_account_public())
            .arg("--service-account-signing-key-file")
            .arg(pki.service_account_key())
            .args(["--service-account-issuer", "https://kubernetes.default.svc"])
            .args(["--service-cluster-ip-range", SERVICE_RANGE])
            .args(["--authorization-mode", "Node,RBAC"])
            .args(["--enable-admission-plugins", "NodeRestriction"])
            .arg("--allow-privileged=true")
            .arg("--kubelet-client-certificate")
            .arg(&to_kubelets.cert)
            .arg("--kubelet-client-key")
            .arg(&to_kubelets.key)
            .args(["--kubelet-preferred-address-types", "InternalIP"])
            .arg("--enable-bootstrap-token-auth=true")
            .args(["--endpoint-reconciler-type", "none"])
            .args(["--profiling=false", "--v=1"]);
        let apiserver_args = apiserver_command
            .get_args()
            .map(ToOwned::to_owned)
            .collect();
        let apiserver = Process::spawn(
            "kube-apiserver",
            &mut apiserver_command,
            &dir.join("kube-apiserver.log"),
        )?;

        let controllers_config = dir.join("controller-manager.kubeconfig");
        write_kubeconfig(
            &controllers_config,
            &server,
            &pki.ca().cert,
            &controllers_pair,
        )?;
        let mut this = Self {
            dir: dir.clone(),
            pki,
            server,
            host_ip,
            admin,
            etcd,
            apiserver,
            apiserver_args,
            controllers: None,
            _slot: slot,
        };
        this.wait("the API server to be ready", READY_TIMEOUT, |cluster| {
            Ok(cluster.kubectl(&["get", "--raw", "/readyz"]).ok())
        })?;
        this.controllers = Some(Process::spawn(
            "kube-controller-manager",
            Command::new(binary("kube-controller-manager")?)
                .arg("--kubeconfig")
                .arg(&controllers_config)
                .arg("--authentication-kubeconfig")
                .arg(&controllers_config)
                .arg("--authorization-kubeconfig")
                .arg(&controllers_config)
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &free_port("127.0.0.1")?.to_string()])
                .arg("--use-service-account-credentials=true")
                .arg("--service-account-private-key-file")
                .arg(this.pki.service_account_key())
                .arg("--root-ca-file")
                .arg(&this.pki.ca().cert)
                .arg("--cluster-signing-cert-file")
                .arg(&this.pki.ca().cert)
                .arg("--cluster-signing-key-file")
                .arg(&this.pki.ca().key)
                // Short-lived certificates from CSRs, so that a kubelet
                // renews its own within a minute and a half (at 70 to 90%
                // of a life that starts 5 minutes back).
                .arg("--cluster-signing-duration=2m")
                .args(["--leader-elect=false", "--v=1"]),
            &dir.join("kube-controller-manager.log"),
        )?);
        this.wait_for_service_account("default")?;
        Ok(this)
    }

    /// Stops kube-apiserver (SIGTERM, as its service would), leaves it
    /// down for `down`, starts it again with the same flags and waits until
    /// it is ready.
    pub fn restart_apiserver(&mut self, down: Duration) -> Result<()> {
        self.apiserver.stop(Duration::from_secs(30));
        std::thread::sleep(down);
        self.apiserver = Process::spawn(
            "kube-apiserver",
            Command::new(binary("kube-apiserver")?).args(&self.apiserver_args),
            &self.dir.join("kube-apiserver.log"),
        )?;
        self.wait(
            "the API server to be ready again",
            READY_TIMEOUT,
            |cluster| Ok(cluster.kubectl(&["get", "--raw", "/readyz"]).ok()),
        )
        .map(drop)
    }

    /// `kubectl apply` of one of the repository's `deploy/` paths, as an
    /// operator applies it (a folder with `-k`, a file with `-f`), then
    /// waits until the CRR's CRD is served.
    pub fn install(&self, deploy: &str) -> Result<()> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .join(deploy);
        let how = if path.is_dir() { "-k" } else { "-f" };
        self.kubectl(&["apply", how, path.to_str().context("a non-UTF-8 path")?])?;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/containerrecreaterequests.apps.kruise.io",
        ])
        .map(drop)
    }

    /// A client certificate for kubelet of `node`, from the cluster's
    /// kubelet-client signer through a CertificateSigningRequest approved
    /// here, kept in `dir` as kubelet's certificate store keeps it: key and
    /// certificate in one file, behind the link `kubelet-client-current.pem`,
    /// which kubelet moves when it rotates (and kubeadm's kubelet.conf names).
    pub fn kubelet_client_certificate(&mut self, node: &str, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir)?;
        let name = format!("{node}-first");
        let (key, request) = self
            .pki
            .request(&name, &format!("/O=system:nodes/CN=system:node:{node}"))?;
        let encoded = Command::new("openssl")
            .args(["base64", "-A", "-in"])
            .arg(&request)
            .output()?;
        self.apply(
            &serde_json::json!({
                "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": name},
                "spec": {"request": String::from_utf8_lossy(&encoded.stdout).trim(),
                         "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                         "usages": ["digital signature", "client auth"]}
            })
            .to_string(),
        )?;
        self.kubectl(&["certificate", "approve", &name])?;
        let issued = self.wait("the kubelet certificate to be issued", READY_TIMEOUT, |c| {
            let csr = c.get(&["csr", &name])?;
            Ok(csr["status"]["certificate"].as_str().map(str::to_owned))
        })?;
        let mut decode = Command::new("openssl")
            .args(["base64", "-d", "-A"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = decode.stdin.take() {
            stdin.write_all(issued.as_bytes())?;
        }
        let certificate = decode.wait_with_output()?.stdout;
        let first = dir.join("kubelet-client-first.pem");
        let mut pem = certificate;
        pem.extend(fs::read(&key)?);
        fs::write(&first, pem)?;
        let current = dir.join("kubelet-client-current.pem");
        let _ = fs::remove_file(&current);
        std::os::unix::fs::symlink(&first, &current)?;
        Ok(current)
    }

    /// The admin's kubeconfig (system:masters).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin
    }

    /// A kube client as the admin, as crr-proxy's own are built.
    pub async fn client(&self) -> Result<kube::Client> {
        client_for(&self.admin).await
    }

    /// The control plane's processes, to check that none has died.
    fn check(&mut self) -> Result<()> {
        self.etcd.check()?;
        self.apiserver.check()?;
        self.controllers.as_mut().map_or(Ok(()), Process::check)
    }

    /// kubectl as the admin; stdout, or an error with stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        kubectl_as(&self.admin, args, None)
    }

    /// kubectl as the admin, with `input` on stdin.
    pub fn kubectl_in(&self, args: &[&str], input: &str) -> Result<String> {
        kubectl_as(&self.admin, args, Some(input))
    }

    /// `kubectl apply` of a JSON or YAML document.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        self.kubectl_in(&["apply", "-f", "-"], manifest)
    }

    /// `kubectl get -o json`.
    pub fn get(&self, args: &[&str]) -> Result<Value> {
        let mut all = vec!["get", "-o", "json"];
        all.extend_from_slice(args);
        Ok(serde_json::from_str(&self.kubectl(&all)?)?)
    }

    /// A namespace, once its default service account exists (the
    /// ServiceAccount admission plugin refuses Pods until then).
    pub fn namespace(&mut self, name: &str) -> Result<()> {
        self.apply(&format!(
            r#"{{"apiVersion": "v1", "kind": "Namespace", "metadata": {{"name": "{name}"}}}}"#
        ))?;
        self.wait_for_service_account(name)
    }

    fn wait_for_service_account(&mut self, namespace: &str) -> Result<()> {
        self.wait(
            &format!("the service account {namespace}/default"),
            READY_TIMEOUT,
            |cluster| {
                Ok(cluster
                    .kubectl(&["get", "serviceaccount", "default", "-n", namespace])
                    .ok())
            },
        )
        .map(drop)
    }

    /// Polls `probe` every 200 ms until it gives a value; fails after
    /// `timeout`, or as soon as a control-plane process has died.
    pub fn wait<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut(&mut Self) -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut last_error = String::new();
        loop {
            self.check()?;
            match probe(self) {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => {}
                Err(error) => last_error = format!("{error:#}"),
            }
            if Instant::now() > deadline {
                bail!("waited {timeout:?} for {what}; last error: {last_error}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(controllers) = self.controllers.as_mut() {
            controllers.stop(Duration::from_secs(2));
        }
        self.apiserver.stop(Duration::from_secs(5));
        self.etcd.stop(Duration::from_secs(5));
        if std::env::var_os("CRR_TEST_KEEP").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A kube client from `kubeconfig`.
pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// kubectl with `kubeconfig`; stdout, or an error with stderr.
pub fn kubectl_as(kubeconfig: &Path, args: &[&str], input: Option<&str>) -> Result<String> {
    let mut child = Command::new(binary("kubectl")?)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("run kubectl")?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
