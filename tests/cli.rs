//! The `crr-proxy` binary as an operator runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::peers::GrpcPeer;
use support::raw;
use support::upstream::{self, FakeUpstream};

fn crr_proxy() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_crr-proxy"));
    // Only what each test sets: no CRR_PROXY_* from the environment running the tests.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CRR_PROXY_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

#[test]
fn version_and_help_name_every_flag() {
    let version = crr_proxy().arg("--version").output().unwrap();
    assert!(version.status.success());
    // The commit too, so that an operator can tell what each node runs.
    let head = Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short=12",
            "HEAD",
        ])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("crr-proxy {} (commit {head})", env!("CARGO_PKG_VERSION"))
    );
    let help = crr_proxy().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--listen",
        "--runtime-endpoint",
        "--image-endpoint",
        "--agent",
        "--node-name",
        "--kubeconfig",
        "--metrics-addr",
        "--log-format",
        "CRR_PROXY_LISTEN",
        "/run/crr-proxy/crr-proxy.sock",
        "unix:///run/containerd/containerd.sock",
    ] {
        assert!(
            help.contains(flag),
            "--help does not mention {flag}:\n{help}"
        );
    }
}

/// Nothing of the agent's stops the relay (issue 45): with its kubeconfig
/// missing, crr-proxy serves kubelet at once, is alive but not ready, and
/// its agent starts once the file is there (kubelet's, written by `kubeadm
/// join` after crr-proxy started). An unknown mode is still a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_kubeconfig_never_stops_the_relay() {
    let api = support::apiserver::FakeApiServer::start().await;
    let upstream = FakeUpstream::start();
    for (how, mode) in [("flag", "kruise"), ("env", "standalone")] {
        let listen = support::temp_socket("no-kubeconfig");
        let kubeconfig = listen.with_file_name("later/kubeconfig");
        let addr = free_addr();
        let mut cmd = crr_proxy();
        cmd.args(["run", "--listen", listen.to_str().unwrap()])
            .args(["--runtime-endpoint", &upstream.endpoint().to_string()])
            .args(["--node-name", "node-a", "--metrics-addr", &addr])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stderr(Stdio::piped());
        match how {
            "flag" => cmd.args(["--agent", mode]),
            _ => cmd.env("CRR_PROXY_AGENT", mode),
        };
        let mut child = cmd.spawn().unwrap();
        support::wait_for_path(&listen);
        assert_proxies(&listen).await;
        assert_eq!(probe(&addr, "/healthz").await, 200, "{mode}");
        assert_eq!(probe(&addr, "/readyz").await, 503, "{mode}");
        assert!(child.try_wait().unwrap().is_none(), "{mode}: it exited");

        std::fs::create_dir_all(kubeconfig.parent().unwrap()).unwrap();
        support::write_kubeconfig(&kubeconfig, &api.url);
        let mut ready = 0;
        for _ in 0..300 {
            ready = probe(&addr, "/readyz").await;
            if ready == 200 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(ready, 200, "{mode}: the agent never started");
        assert_proxies(&listen).await;
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{mode}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("the agent cannot build its Kubernetes client")
                && stderr.contains(&kubeconfig.display().to_string()),
            "{mode}: {stderr}"
        );
        support::remove_socket_dir(&listen);
    }
    let out = crr_proxy()
        .args(["run", "--agent", "bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// GET `path` on `addr` and return the status code.
/// Waits (up to 5 s) for /readyz to answer 200.
async fn wait_until_ready(addr: &str) {
    let mut ready = 0;
    for _ in 0..100 {
        ready = probe(addr, "/readyz").await;
        if ready == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(ready, 200, "/readyz never became ready");
}

async fn probe(addr: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// `crr-proxy run --agent kruise` in front of `upstream`, with probes on `addr`.
fn run_with_agent(
    listen: &std::path::Path,
    upstream: &FakeUpstream,
    kubeconfig: &std::path::Path,
    addr: &str,
) -> std::process::Child {
    let child = agent_command(listen, upstream, kubeconfig, addr)
        .spawn()
        .unwrap();
    support::wait_for_path(listen);
    child
}

/// `crr-proxy run --agent kruise` for node-a, in front of `upstream`.
fn agent_command(
    listen: &std::path::Path,
    upstream: &FakeUpstream,
    kubeconfig: &std::path::Path,
    addr: &str,
) -> Command {
    let mut command = crr_proxy();
    command
        .arg("run")
        .args(["--listen", listen.to_str().unwrap()])
        .args(["--runtime-endpoint", &upstream.endpoint().to_string()])
        .args([
            "--agent",
            "kruise",
            "--node-name",
            "node-a",
            "--metrics-addr",
            addr,
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig);
    command
}

/// One call through the proxy on `listen` reaches the fake upstream.
async fn assert_proxies(listen: &std::path::Path) {
    let response = raw::open(listen, upstream::FIXED).await;
    assert_eq!(
        raw::record(response).await.unwrap().data,
        upstream::fixed_body()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_api_server_the_proxy_serves_but_is_not_ready() {
    let upstream = FakeUpstream::start();
    let listen = support::temp_socket("no-api");
    let kubeconfig = listen.with_file_name("kubeconfig");
    // Nobody listens there.
    support::write_kubeconfig(&kubeconfig, &format!("http://{}", free_addr()));
    let addr = free_addr();
    let mut child = run_with_agent(&listen, &upstream, &kubeconfig, &addr);
    assert_proxies(&listen).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // Alive, but not ready: the CRR watch cannot sync.
    assert_eq!(probe(&addr, "/healthz").await, 200);
    assert_eq!(probe(&addr, "/readyz").await, 503);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
    support::remove_socket_dir(&listen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_mode_serves_probes_once_the_crr_watch_has_synced_and_names_itself() {
    let api = support::apiserver::FakeApiServer::start().await;
    let upstream = FakeUpstream::start();
    let listen = support::temp_socket("agent");
    let kubeconfig = listen.with_file_name("kubeconfig");
    support::write_kubeconfig(&kubeconfig, &api.url);
    let addr = free_addr();
    let mut child = run_with_agent(&listen, &upstream, &kubeconfig, &addr);
    wait_until_ready(&addr).await;
    assert_eq!(probe(&addr, "/healthz").await, 200);
    assert_eq!(probe(&addr, "/metrics").await, 200);
    // The proxy serves alongside.
    assert_proxies(&listen).await;
    // Its requests say who sent them, for the API server's logs.
    let named = format!(
        "crr-proxy/{} (agent; commit {})",
        crr_proxy::version::VERSION,
        crr_proxy::version::COMMIT
    );
    assert_eq!(api.user_agents(), [named].into());
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
    support::remove_socket_dir(&listen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_from_environment_settings_and_exits_cleanly_on_sigterm() {
    let upstream = FakeUpstream::start();
    let listen = support::temp_socket("cli");
    let mut child = crr_proxy()
        .arg("run")
        .env("CRR_PROXY_LISTEN", &listen)
        .env(
            "CRR_PROXY_RUNTIME_ENDPOINT",
            upstream.endpoint().to_string(),
        )
        .env("CRR_PROXY_LOG_FORMAT", "json")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_for_path(&listen);

    assert_proxies(&listen).await;

    // A second instance must not take over the live socket.
    let second = crr_proxy()
        .arg("run")
        .args(["--listen", listen.to_str().unwrap()])
        .args(["--runtime-endpoint", &upstream.endpoint().to_string()])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("already listening"), "{stderr}");

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(!listen.exists(), "socket file left behind");
    let mut logs = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut logs).unwrap();
    assert!(
        logs.lines().all(|l| l.starts_with('{')),
        "not JSON logs:\n{logs}"
    );
    support::remove_socket_dir(&listen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_in_use_is_reported_and_taken_once_free() {
    let upstream = FakeUpstream::start();
    let listen = support::temp_socket("metrics-busy");
    // Another program holds the address when crr-proxy starts.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let notify_path = listen.with_file_name("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_millis(100)))
        .unwrap();
    let child = crr_proxy()
        .args(["run", "--listen", listen.to_str().unwrap()])
        .args(["--runtime-endpoint", &upstream.endpoint().to_string()])
        .args(["--metrics-addr", &addr])
        .env("NOTIFY_SOCKET", &notify_path)
        .env("CRR_PROXY_LOG", "warn")
        .spawn()
        .unwrap();
    // Killed if an assertion fails first, so that no crr-proxy outlives it.
    let mut child = support::Daemon(child);
    // What crr-proxy told systemd, until `until` says enough.
    let told = |until: &dyn Fn(&[String]) -> bool| {
        let mut states = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let mut buf = [0u8; 4096];
        while std::time::Instant::now() < deadline && !until(&states) {
            if let Ok(n) = notify.recv(&mut buf) {
                states.extend(String::from_utf8_lossy(&buf[..n]).lines().map(String::from));
            }
        }
        states
    };
    let states = told(&|s: &[String]| s.iter().any(|l| l == "READY=1"));
    assert!(states.iter().any(|l| l == "READY=1"), "{states:?}");
    // kubelet's path does not wait on the port, and `systemctl status` says
    // what is missing.
    assert_proxies(&listen).await;
    assert!(
        states
            .iter()
            .any(|l| l.starts_with("STATUS=") && l.contains(&addr) && l.contains("in use")),
        "systemd was not told: {states:?}"
    );
    // The other program accepts and never answers: no crr-proxy there.
    let answer =
        tokio::time::timeout(std::time::Duration::from_secs(1), probe(&addr, "/healthz")).await;
    assert!(!matches!(answer, Ok(200)), "{answer:?}");

    // Once the other program lets it go, crr-proxy serves there.
    drop(busy);
    let states = told(&|s: &[String]| {
        s.iter()
            .any(|l| l.starts_with("STATUS=") && l.contains("serving"))
    });
    assert!(
        states
            .iter()
            .any(|l| l.starts_with("STATUS=") && l.contains("serving")),
        "{states:?}"
    );
    assert_eq!(probe(&addr, "/healthz").await, 200);
    assert_eq!(probe(&addr, "/metrics").await, 200);
    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.0.wait().unwrap().success());
    support::remove_socket_dir(&listen);
}

/// Starts crr-proxy the way systemd does with socket activation: the
/// listening socket is fd 3, LISTEN_FDS=1, LISTEN_PID is crr-proxy's own PID.
const ACTIVATE: &str = r#"
import os, socket, sys
path, binary = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
# Listening before the path appears: a client that sees it can connect.
s.bind(path + ".new")
s.listen(128)
os.rename(path + ".new", path)
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
os.environ["LISTEN_FDS"] = "1"
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(binary, [binary] + sys.argv[3:])
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_socket_passed_by_systemd() {
    let upstream = FakeUpstream::start();
    let activated = support::temp_socket("activated");
    // --listen names another path: with socket activation it is not bound.
    let unused = activated.with_file_name("unused.sock");
    let mut child = Command::new("python3")
        .args(["-c", ACTIVATE])
        .arg(&activated)
        .arg(env!("CARGO_BIN_EXE_crr-proxy"))
        .args(["run", "--listen", unused.to_str().unwrap()])
        .args(["--runtime-endpoint", &upstream.endpoint().to_string()])
        .spawn()
        .unwrap();
    support::wait_for_path(&activated);
    // The socket exists before crr-proxy runs; connections wait in the backlog.
    let mut sender = raw::connect(&activated).await.unwrap();
    let response = raw::send(&mut sender, raw::grpc_request(upstream::FIXED, &[], vec![]))
        .await
        .unwrap();
    assert_eq!(
        raw::record(response).await.unwrap().data,
        upstream::fixed_body()
    );
    assert!(!unused.exists(), "bound --listen despite socket activation");

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
    // systemd owns the activated socket file: crr-proxy must leave it alone.
    assert!(activated.exists(), "removed the socket systemd owns");
    support::remove_socket_dir(&activated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_under_load_lose_no_call_with_socket_activation() {
    const RESTARTS: usize = 6;
    let upstream = FakeUpstream::start();
    let listen = support::temp_socket("restart");
    let notify_path = listen.with_file_name("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    // Read as they come: a datagram socket's queue is short (10 by default).
    let done = Arc::new(AtomicBool::new(false));
    let states = std::thread::spawn({
        let done = done.clone();
        move || {
            let (mut states, mut buf) = (Vec::new(), [0u8; 64]);
            loop {
                match notify.recv(&mut buf) {
                    Ok(n) => states.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                    Err(_) if done.load(Ordering::SeqCst) => return states,
                    Err(_) => {}
                }
            }
        }
    });
    let mut supervisor = support::activation::supervised(
        &listen,
        std::time::Duration::ZERO,
        std::path::Path::new(env!("CARGO_BIN_EXE_crr-proxy")),
    )
    .args([
        "run",
        "--runtime-endpoint",
        &upstream.endpoint().to_string(),
    ])
    .env("NOTIFY_SOCKET", &notify_path)
    .env("CRR_PROXY_LOG", "warn")
    .spawn()
    .unwrap();
    support::wait_for_path(&listen);

    // Continuous load, retrying nothing: a new connection per call (our own
    // client, as a client reconnecting would), and grpcio on one channel
    // for the whole run, as kubelet keeps one.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let load = tokio::spawn({
        let listen = listen.clone();
        async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while std::time::Instant::now() < until {
                let call = async {
                    let mut sender = raw::connect(&listen).await?;
                    let response =
                        raw::send(&mut sender, raw::grpc_request(upstream::FIXED, &[], vec![]))
                            .await?;
                    raw::record(response).await
                };
                match call.await {
                    Ok(r) if r.data == upstream::fixed_body() => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
            }
            (ok, failed)
        }
    });
    let grpcio = tokio::task::spawn_blocking({
        // hyper, which serves the in-test upstream, refuses C-core's
        // percent-encoded socket path as :authority.
        let mut peer = GrpcPeer::start_with(&listen, &["--authority", "localhost"]);
        move || {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while std::time::Instant::now() < until {
                // The in-test upstream does not implement it: UNIMPLEMENTED
                // is its own answer, so the call went through.
                let answer = peer.call_blocking("/runtime.v1.RuntimeService/Version", 5);
                match answer["code"].as_str() {
                    Some("UNIMPLEMENTED") => ok += 1,
                    _ => failed.push(answer.to_string()),
                }
            }
            (ok, failed)
        }
    });
    let supervisor_pid = Pid::from_raw(supervisor.id() as i32);
    for _ in 0..RESTARTS {
        tokio::time::sleep(std::time::Duration::from_millis(550)).await;
        kill(supervisor_pid, Signal::SIGHUP).unwrap();
    }
    let (ok, failed) = load.await.unwrap();
    let (grpcio_ok, grpcio_failed) = grpcio.await.unwrap();
    kill(supervisor_pid, Signal::SIGTERM).unwrap();
    assert!(supervisor.wait().unwrap().success());
    done.store(true, Ordering::SeqCst);
    let states = states.join().unwrap();
    eprintln!(
        "restart under load: {ok} calls ok, {} failed; grpcio on one channel: {grpcio_ok} ok, \
         {} failed; notified {states:?}",
        failed.len(),
        grpcio_failed.len()
    );
    let first = |all: &[String]| all.iter().take(3).cloned().collect::<Vec<_>>();
    assert!(
        failed.is_empty(),
        "calls lost across restarts: {:?}",
        first(&failed)
    );
    assert!(
        grpcio_failed.is_empty(),
        "grpcio calls lost: {:?}",
        first(&grpcio_failed)
    );
    assert!(ok > 100, "too little load to mean anything: {ok} calls");
    assert!(grpcio_ok > 100, "too little grpcio load: {grpcio_ok} calls");
    assert_eq!(
        states.iter().filter(|s| *s == "READY=1").count(),
        RESTARTS + 1,
        "{states:?}"
    );
    assert_eq!(
        states.iter().filter(|s| *s == "STOPPING=1").count(),
        RESTARTS + 1,
        "{states:?}"
    );
    support::remove_socket_dir(&listen);
}

#[test]
fn settings_come_from_flags_then_environment_then_the_settings_file() {
    let dir = support::temp_socket("settings");
    let file = dir.with_file_name("config.toml");
    std::fs::write(
        &file,
        "runtime-endpoint = \"unix:///from-file.sock\"\nlisten = \"/nonexistent/from-file.sock\"\n\
         image-endpoint = \"unix:///image-from-file.sock\"\n",
    )
    .unwrap();
    let out = crr_proxy()
        .args(["check", "--kubelet-config", "/nonexistent/kubelet.yaml"])
        .args(["--image-endpoint", "unix:///image-from-flag.sock"])
        .env("CRR_PROXY_CONFIG", &file)
        .env("CRR_PROXY_RUNTIME_ENDPOINT", "unix:///from-env.sock")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or("")
            .to_owned()
    };
    assert!(
        row("runtime endpoint").contains("unix:///from-env.sock"),
        "env over file:\n{table}"
    );
    assert!(
        row("image endpoint").contains("unix:///image-from-flag.sock"),
        "flag over file:\n{table}"
    );
    assert!(
        row("listen path").contains("/nonexistent/from-file.sock"),
        "file over default:\n{table}"
    );

    std::fs::write(&file, "runtime-endpoint = [1]\n").unwrap();
    let out = crr_proxy()
        .args(["run", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("runtime-endpoint: expected a string"));
    support::remove_socket_dir(&dir);
}

/// The part of CRI's PullImageRequest that carries registry credentials
/// (crr-proxy's own proto leaves the image service's messages out).
#[derive(Clone, PartialEq, prost::Message)]
struct PullImageRequest {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageSpec>,
    #[prost(message, optional, tag = "2")]
    auth: Option<AuthConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ImageSpec {
    #[prost(string, tag = "1")]
    image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct AuthConfig {
    #[prost(string, tag = "1")]
    username: String,
    #[prost(string, tag = "2")]
    password: String,
}

/// A PullImage with registry credentials and a CreateContainer with an
/// environment value from a Secret, as kubelet sends them: gRPC bodies.
fn calls_carrying_secrets(password: &str, env_value: &str) -> Vec<(&'static str, Vec<u8>)> {
    use crr_proxy::cri::v1;
    use prost::Message as _;
    let pull = PullImageRequest {
        image: Some(ImageSpec {
            image: "registry.example/app:1".into(),
        }),
        auth: Some(AuthConfig {
            username: "robot".into(),
            password: password.into(),
        }),
    };
    let create = v1::CreateContainerRequest {
        pod_sandbox_id: "sandbox".into(),
        config: Some(v1::ContainerConfig {
            envs: vec![v1::KeyValue {
                key: "DB_PASSWORD".into(),
                value: env_value.into(),
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    vec![
        (
            "/runtime.v1.ImageService/PullImage",
            raw::grpc_frame(&pull.encode_to_vec()),
        ),
        (
            "/runtime.v1.RuntimeService/CreateContainer",
            raw::grpc_frame(&create.encode_to_vec()),
        ),
    ]
}

/// Neither the agent's bearer token nor what kubelet's CRI calls carry
/// (registry credentials, a Secret's value in a container's environment)
/// reaches crr-proxy's log at `trace`, or its metrics; the runtime gets
/// those calls byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_runtime_and_credentials_never_reach_the_logs() {
    const TOKEN: &str = "s3cr3t-bearer-token-9f1c";
    const PASSWORD: &str = "s3cr3t-registry-password-41d7";
    const ENV_VALUE: &str = "s3cr3t-env-from-a-secret-c0a2";
    let api = support::apiserver::FakeApiServer::start().await;
    api.add_user(TOKEN, support::policy::UserInfo::node("node-a"));
    let upstream = FakeUpstream::start();
    let listen = support::temp_socket("secret");
    let kubeconfig = listen.with_file_name("kubeconfig");
    support::write_kubeconfig_as(&kubeconfig, &api.url, Some(TOKEN));
    let addr = free_addr();
    let mut child = agent_command(&listen, &upstream, &kubeconfig, &addr)
        .env("CRR_PROXY_LOG", "trace")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_for_path(&listen);
    wait_until_ready(&addr).await;
    let calls = calls_carrying_secrets(PASSWORD, ENV_VALUE);
    for (path, body) in &calls {
        let mut sender = raw::connect(&listen).await.unwrap();
        let request = raw::grpc_request(path, &[], body.clone());
        raw::record(raw::send(&mut sender, request).await.unwrap())
            .await
            .unwrap();
    }
    let seen = upstream.seen();
    for (path, body) in &calls {
        assert!(
            seen.iter().any(|s| s.path == *path && s.body == *body),
            "{path} did not reach the runtime as sent"
        );
    }
    let metrics = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || support::metrics::scrape(&addr)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(metrics.contains("method=\"PullImage\""), "{metrics}");
    assert!(!metrics.contains("s3cr3t"), "a secret is in the metrics");
    // The runtime goes away: not ready, but still alive and serving.
    let socket = upstream.socket.clone();
    drop(upstream);
    assert!(!socket.exists());
    assert_eq!(probe(&addr, "/readyz").await, 503);
    assert_eq!(probe(&addr, "/healthz").await, 200);

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
    let mut logs = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut logs).unwrap();
    assert!(
        logs.contains("watching ContainerRecreateRequests"),
        "{logs}"
    );
    assert!(logs.lines().count() > 20, "trace logs expected:\n{logs}");
    assert!(!logs.contains(TOKEN), "the bearer token was logged");
    assert!(!logs.contains(PASSWORD), "the registry password was logged");
    assert!(
        !logs.contains(ENV_VALUE),
        "the environment value was logged"
    );
    assert!(!logs.contains("s3cr3t"), "part of a secret was logged");
    support::remove_socket_dir(&listen);
}

/// The TCP sockets `pid` listens on, as `address:port` (from /proc: the
/// socket inodes among its fds, matched against LISTEN entries).
fn tcp_listeners(pid: u32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // local_address st ... inode
            if cols.len() > 9 && cols[3] == "0A" && inodes.iter().any(|i| i == cols[9]) {
                let (addr, port) = cols[1].split_once(':').unwrap();
                let port = u16::from_str_radix(port, 16).unwrap();
                let ip = if addr.len() == 8 {
                    let n = u32::from_str_radix(addr, 16).unwrap();
                    std::net::Ipv4Addr::from(n.swap_bytes()).to_string()
                } else {
                    addr.to_owned()
                };
                found.push(format!("{ip}:{port}"));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_only_tcp_listener_is_metrics_on_loopback_and_the_socket_is_root_0660() {
    use std::os::unix::fs::MetadataExt;
    let upstream = FakeUpstream::start();
    let addr = free_addr();
    for (metrics, expected) in [(addr.as_str(), vec![addr.clone()]), ("off", vec![])] {
        let listen = support::temp_socket("listeners");
        let mut child = crr_proxy()
            .arg("run")
            .args(["--listen", listen.to_str().unwrap()])
            .args(["--runtime-endpoint", &upstream.endpoint().to_string()])
            .args(["--metrics-addr", metrics])
            .spawn()
            .unwrap();
        support::wait_for_path(&listen);
        assert_proxies(&listen).await;
        assert_eq!(
            tcp_listeners(child.id()),
            expected,
            "--metrics-addr {metrics}"
        );
        let meta = std::fs::metadata(&listen).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o660);
        assert_eq!(
            (meta.uid(), meta.gid()),
            (0, 0),
            "the socket belongs to root"
        );
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        assert!(child.wait().unwrap().success());
        support::remove_socket_dir(&listen);
    }
}

/// Under systemd's watchdog (WATCHDOG_USEC, as systemd sets it for
/// `WatchdogSec=`), crr-proxy pings (`WATCHDOG=1`) while its socket answers
/// a CRI call, a runtime that is down included (its UNAVAILABLE is an
/// answer: restarting crr-proxy would not bring the runtime back), and no
/// longer once the socket does not answer.
#[test]
fn the_watchdog_is_pinged_while_the_socket_answers_and_only_then() {
    let listen = support::temp_socket("watchdog");
    let notify_path = listen.with_file_name("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_millis(50)))
        .unwrap();
    let down = listen.with_file_name("no-runtime.sock");
    let child = crr_proxy()
        .args(["run", "--listen", listen.to_str().unwrap()])
        .args(["--runtime-endpoint", &format!("unix://{}", down.display())])
        .env("NOTIFY_SOCKET", &notify_path)
        // A period of 0.6 s: a probe every 0.2 s.
        .env("WATCHDOG_USEC", "600000")
        .env("CRR_PROXY_LOG", "warn")
        .spawn()
        .unwrap();
    let mut child = support::Daemon(child);
    // The pings systemd got within `within`.
    let pings = |within: std::time::Duration| {
        let deadline = std::time::Instant::now() + within;
        let mut buf = [0u8; 4096];
        let mut pings = 0;
        while std::time::Instant::now() < deadline {
            if let Ok(n) = notify.recv(&mut buf) {
                pings += String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .filter(|l| *l == "WATCHDOG=1")
                    .count();
            }
        }
        pings
    };
    let answered = pings(std::time::Duration::from_secs(2));
    assert!(
        answered >= 5,
        "{answered} pings in 2 s with the runtime down"
    );
    // The socket gone (as if its accept loop were stuck): no answer, so no
    // ping, though the process runs on.
    std::fs::remove_file(&listen).unwrap();
    pings(std::time::Duration::from_millis(300));
    let unanswered = pings(std::time::Duration::from_secs(2));
    assert_eq!(unanswered, 0, "pinged without an answer on the socket");
    assert!(child.0.try_wait().unwrap().is_none(), "crr-proxy exited");
    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.0.wait().unwrap().success());
    support::remove_socket_dir(&listen);
}
