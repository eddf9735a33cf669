//! crr-proxy killed with SIGKILL in the middle of a CRR: after the
//! container was stopped, before the status write that records the kill.
//! The next crr-proxy completes the CRR without stopping the container or
//! running its hook a second time. Runs the crr-proxy binary against a real
//! containerd, the fake API server (under deploy/node-policy.yaml) and the
//! kubelet role, in both agent modes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Resource};
use support::containerd::Containerd;
use support::roles::{ContainerSpec, KruiseManager, Kubelet, NAMESPACE, PodSpec, wait_for};

const NODE: &str = "node-a";

/// The crr-proxy process; killed if the test fails first.
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `log`: where its JSON logs go.
fn crr_proxy(mode: &str, listen: &Path, ctrd: &Containerd, kubeconfig: &Path, log: &Path) -> Proxy {
    let child = Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
        .arg("run")
        .args(["--listen", listen.to_str().unwrap()])
        .args(["--runtime-endpoint", &ctrd.endpoint().to_string()])
        .args(["--agent", mode, "--node-name", NODE])
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args([
            "--state-dir",
            kubeconfig.with_file_name("state").to_str().unwrap(),
        ])
        .args(["--log-format", "json", "--metrics-addr", "off"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    Proxy(child)
}

/// The status write that records a kill (`isKilled: true`).
fn records_a_kill(method: &http::Method, path: &str, body: &Value) -> bool {
    method == http::Method::PATCH
        && path.ends_with("/status")
        && body
            .pointer("/status/containerRecreateStates")
            .and_then(Value::as_array)
            .is_some_and(|states| states.iter().any(|s| s["isKilled"] == true))
}

async fn killed_between_the_stop_and_its_record(mode: &str) {
    support::init_logging();
    let ctrd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .unwrap()
        .unwrap();
    let api = FakeApiServer::start_for_node(NODE, "node-a-token").await;
    let listen = support::temp_socket("crash");
    let kubeconfig = listen.with_file_name("kubeconfig");
    support::write_kubeconfig_as(&kubeconfig, &api.url, Some("node-a-token"));
    let cri = support::client(&ctrd.endpoint());
    let kubelet = Kubelet::start(&api, cri, NODE, ctrd.scratch("logs")).await;
    let _manager = (mode == "kruise").then(|| KruiseManager::start(&api));

    // The hook leaves one line per run in a host directory.
    let shared = ctrd.scratch("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let mut app = ContainerSpec::graceful("app");
    app.pre_stop = Some(json!({"exec": {"command": ["sh", "-c", "echo run >> /shared/hooks"]}}));
    app.shared = Some(shared.clone());
    kubelet.run_pod(PodSpec::new("web-0", vec![app])).await;

    let hit = api.stall_writes(Arc::new(records_a_kill));
    let first_log = listen.with_file_name("first.log");
    let mut first = crr_proxy(mode, &listen, &ctrd, &kubeconfig, &first_log);
    api.create(
        Resource::Crr,
        NAMESPACE,
        json!({"metadata": {"name": "restart-app"}, "spec": {"podName": "web-0", "containers": [{"name": "app"}]}}),
    )
    .unwrap();
    tokio::time::timeout(Duration::from_secs(30), hit.notified())
        .await
        .expect("crr-proxy stopped the container and went to record it");
    kill(Pid::from_raw(first.0.id() as i32), Signal::SIGKILL).unwrap();
    first.0.wait().unwrap();
    let hooks = std::fs::read_to_string(shared.join("hooks")).unwrap();
    assert_eq!(hooks, "run\n", "the hook ran once before the crash");
    // Its logs of the kill are in the CRR's span: namespace, name, Pod.
    let logs = std::fs::read_to_string(&first_log).unwrap();
    let killed: Value = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["fields"]["message"] == "container killed")
        .unwrap_or_else(|| panic!("no kill logged:\n{logs}"));
    let span = &killed["span"];
    assert_eq!(span["name"], "crr", "{killed}");
    assert_eq!(span["namespace"], NAMESPACE, "{killed}");
    assert_eq!(span["crr"], "restart-app", "{killed}");
    assert_eq!(span["pod"], "web-0", "{killed}");
    let crr = api.get(Resource::Crr, NAMESPACE, "restart-app").unwrap();
    assert_ne!(crr["status"]["phase"], "Completed");

    // A new crr-proxy (systemd's restart) takes the CRR over.
    api.clear_stall();
    let mut second = crr_proxy(
        mode,
        &listen,
        &ctrd,
        &kubeconfig,
        &listen.with_file_name("second.log"),
    );
    let done = wait_for(Duration::from_secs(30), || {
        api.get(Resource::Crr, NAMESPACE, "restart-app")
            .filter(|c| c["status"]["phase"] == "Completed")
    })
    .await
    .expect("the CRR completed after the restart");
    // The lost record is rebuilt from the runtime. If kubelet restarted the
    // container first, the new agent sees a new container (Succeeded); if
    // not, it finds the old one already exited, which counts as killed
    // without a second stop (Succeeded, isKilled).
    let states = &done["status"]["containerRecreateStates"];
    assert!(
        *states == json!([{"name": "app", "phase": "Succeeded"}])
            || *states == json!([{"name": "app", "phase": "Succeeded", "isKilled": true}]),
        "{states}"
    );
    // Give a second kill every chance to show before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pod = api.get(Resource::Pod, NAMESPACE, "web-0").unwrap();
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 1,
        "the container was stopped exactly once: {pod}"
    );
    assert_eq!(
        std::fs::read_to_string(shared.join("hooks")).unwrap(),
        "run\n",
        "the hook ran exactly once"
    );
    kill(Pid::from_raw(second.0.id() as i32), Signal::SIGTERM).unwrap();
    assert!(second.0.wait().unwrap().success());
    drop(kubelet);
    support::remove_socket_dir(&listen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_mode_sigkill_after_the_stop_stops_once() {
    killed_between_the_stop_and_its_record("kruise").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mode_sigkill_after_the_stop_stops_once() {
    killed_between_the_stop_and_its_record("standalone").await;
}
