//! Shared test support: a private containerd, the proxy in-process, a raw
//! HTTP/2 client and a deterministic in-test gRPC upstream.
#![allow(dead_code)] // each test binary uses a different part

pub mod activation;
pub mod apiserver;
pub mod cluster;
pub mod containerd;
pub mod demo;
pub mod front;
pub mod images;
pub mod interposer;
pub mod kruise;
pub mod kubelet;
pub mod metrics;
pub mod node;
pub mod patch;
pub mod peers;
pub mod pki;
pub mod pods;
pub mod policy;
pub mod procfs;
pub mod raw;
pub mod reads;
pub mod registry;
pub mod roles;
pub mod selectors;
pub mod upstream;
pub mod versions;
pub mod workloads;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crr_proxy::cri::{self, RuntimeClient};
use crr_proxy::proxy::{Endpoint, Listener, Proxy, Routes};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A crr-proxy serving a temp socket in this process.
pub struct ProxyUnderTest {
    pub socket: PathBuf,
    pub metrics: std::sync::Arc<crr_proxy::metrics::Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ProxyUnderTest {
    pub fn start(routes: Routes) -> Self {
        Self::serve(Proxy::new(routes))
    }

    /// Serves a proxy built by the test.
    pub fn serve(proxy: Proxy) -> Self {
        let socket = temp_socket("proxy");
        let (listener, file) = Listener::bind(&socket)
            .expect("bind proxy socket")
            .into_parts();
        let (stop, stopped) = oneshot::channel::<()>();
        let metrics = proxy.metrics();
        let task = tokio::spawn(async move {
            let _file = file;
            proxy
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            socket,
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A proxy in front of one runtime endpoint.
    pub fn to(runtime: Endpoint) -> Self {
        Self::start(Routes {
            runtime,
            image: None,
        })
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::from_path(&self.socket)
    }

    pub fn client(&self) -> RuntimeClient {
        client(&self.endpoint())
    }

    /// Stops serving and waits for the drain to end.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ProxyUnderTest {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        remove_socket_dir(&self.socket);
    }
}

pub fn client(endpoint: &Endpoint) -> RuntimeClient {
    cri::runtime_client(cri::channel(endpoint))
}

/// A new, empty temp directory `<prefix>-<process>-<n>`: what a run of
/// this process left there before is removed.
pub fn fresh_dir(prefix: &str) -> std::io::Result<PathBuf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A fresh socket path in a fresh temp directory.
pub fn temp_socket(name: &str) -> PathBuf {
    fresh_dir("crr-test")
        .expect("create temp dir")
        .join(format!("{name}.sock"))
}

pub fn remove_socket_dir(socket: &Path) {
    if let Some(dir) = socket.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Waits (up to 10 s) for `path` to appear, e.g. a socket a server creates.
pub fn wait_for_path(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A `crr-proxy run` process with its agent, killed when dropped.
pub struct Daemon(pub std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The crr-proxy `binary` (a test's `env!("CARGO_BIN_EXE_crr-proxy")`;
/// the example and the bench have none) serving `listen` in front of
/// `runtime`, its agent in `mode` as node `node` with `kubeconfig`, its
/// state beside the kubeconfig, its JSON logs in `log`.
pub fn daemon(
    binary: &str,
    mode: &str,
    node: &str,
    listen: &Path,
    runtime: &Endpoint,
    kubeconfig: &Path,
    log: &Path,
) -> Daemon {
    let child = std::process::Command::new(binary)
        .arg("run")
        .arg("--listen")
        .arg(listen)
        .args(["--runtime-endpoint", &runtime.to_string()])
        .args(["--agent", mode, "--node-name", node])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--state-dir")
        .arg(kubeconfig.with_file_name("state"))
        .args(["--log-format", "json", "--metrics-addr", "off"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("the daemon's log"))
        .spawn()
        .expect("crr-proxy run");
    Daemon(child)
}

/// A kubeconfig for an API server at `server`, without credentials.
pub fn write_kubeconfig(path: &Path, server: &str) {
    write_kubeconfig_as(path, server, None);
}

/// A kubeconfig that authenticates with a bearer token.
pub fn write_kubeconfig_as(path: &Path, server: &str, token: Option<&str>) {
    let user = token.map_or_else(|| "{}".to_owned(), |t| format!("{{token: \"{t}\"}}"));
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{server}\"}}}}]\n\
             users: [{{name: u, user: {user}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u}}}}]\n\
             current-context: c\n"
        ),
    )
    .expect("write kubeconfig");
}

/// Logs to the test output when `CRR_PROXY_LOG` is set.
pub fn init_logging() {
    if std::env::var_os("CRR_PROXY_LOG").is_some() {
        crr_proxy::telemetry::init(crr_proxy::telemetry::LogFormat::Text);
    }
}

/// True if `status` says the server did not process the call: it refused
/// the stream (REFUSED_STREAM), or its GOAWAY's last stream ID is below it.
/// grpc C-core retries such a call on its own (tests/peers.rs shows it);
/// tonic hands it to the caller. The proxy's stand-in answers so the one call that arrives after
/// the runtime is back, as it sends the client to a relayed connection.
///
/// hyper also cancels, with "connection closed", a request still queued in
/// its dispatcher when the connection ends after the GOAWAY: it was never
/// written, so it too is unprocessed (seen once in CI, in
/// `containerd_down_is_unavailable_then_the_same_proxy_recovers`).
pub fn refused(status: &tonic::Status) -> bool {
    let text = format!("{status:?}");
    let never_sent = status.code() == tonic::Code::Cancelled
        && text.contains("Canceled")
        && text.contains("connection closed");
    text.contains("REFUSED_STREAM") || text.contains("GoAway(") || never_sent
}

/// How many unprocessed answers one hand-over can cost a tonic client: the
/// call that meets the GOAWAY, and one that hyper queued on the connection
/// in the moment before its dispatcher saw the GOAWAY (seen 1 run in 30 of
/// `containerd_down_is_unavailable_then_the_same_proxy_recovers`).
pub const HAND_OVER_LOSSES: usize = 2;

/// Makes `call` again while its answer says it was never processed, as
/// grpc-go (kubelet's client) does by itself, at most [`HAND_OVER_LOSSES`]
/// times; the last answer and how many were unprocessed.
pub async fn unprocessed_retried<T, F, Fut>(mut call: F) -> (Result<T, tonic::Status>, usize)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut unprocessed = 0;
    loop {
        match call().await {
            Err(status) if refused(&status) && unprocessed < HAND_OVER_LOSSES => unprocessed += 1,
            answer => return (answer, unprocessed),
        }
    }
}
