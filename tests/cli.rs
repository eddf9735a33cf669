//! The `crr-proxy` binary as an operator runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::process::{Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
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
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("crr-proxy {}", env!("CARGO_PKG_VERSION"))
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

#[test]
fn agent_modes_not_built_yet_fail_with_a_clear_message() {
    for (how, mode) in [("flag", "kruise"), ("env", "standalone")] {
        let mut cmd = crr_proxy();
        cmd.arg("run")
            .args(["--listen", "/nonexistent/never-bound.sock"]);
        match how {
            "flag" => cmd.args(["--agent", mode]),
            _ => cmd.env("CRR_PROXY_AGENT", mode),
        };
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{how}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("--agent {mode} is not available")),
            "{stderr}"
        );
        assert!(stderr.contains("--agent off"), "{stderr}");
    }
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

    let mut sender = raw::connect(&listen).await.unwrap();
    let response = raw::send(&mut sender, raw::grpc_request(upstream::FIXED, &[], vec![]))
        .await
        .unwrap();
    assert_eq!(
        raw::record(response).await.unwrap().data,
        upstream::fixed_body()
    );
    drop(sender);

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

/// Starts crr-proxy the way systemd does with socket activation: the
/// listening socket is fd 3, LISTEN_FDS=1, LISTEN_PID is crr-proxy's own PID.
const ACTIVATE: &str = r#"
import os, socket, sys
path, binary = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(128)
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
