//! crr-proxy stopped in the middle of a CRR: killed (SIGKILL) after the
//! container was stopped but before the status write that records the kill,
//! or during the preStop hook; or asked to stop (SIGTERM) during the hook.
//! The next crr-proxy completes the CRR without stopping the container or
//! running its hook a second time. Runs the crr-proxy binary against a real
//! containerd, the fake API server (under deploy/base/node-policy.yaml) and the
//! kubelet role, in both agent modes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use support::Daemon;
use support::apiserver::{FakeApiServer, Resource, Watches};
use support::containerd::Containerd;
use support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use support::roles::{KruiseManager, NAMESPACE, wait_for};

const NODE: &str = "node-a";

/// The CRR's grace period. It bounds how long a stop may wait for the exit:
/// when crr-proxy is killed while containerd is still starting the hook's
/// exec, containerd 2.4's runc shim holds the container's exit until that
/// exec's start returns, which is only once the stop's SIGKILL lands at the
/// end of the grace period (seen in CI; the container had exited on SIGTERM).
const GRACE_SECONDS: u64 = 10;

/// The status write that records a kill (`isKilled: true`).
fn records_a_kill(method: &http::Method, path: &str, body: &Value) -> bool {
    method == http::Method::PATCH
        && path.ends_with("/status")
        && body
            .pointer("/status/containerRecreateStates")
            .and_then(Value::as_array)
            .is_some_and(|states| states.iter().any(|s| s["isKilled"] == true))
}

/// A node of one Pod (`web-0`, its container `app` with a preStop hook
/// running `hook` after it leaves a line in `hooks`), the fake API server,
/// the kubelet role and, in kruise mode, the kruise-manager role.
struct Node {
    mode: &'static str,
    ctrd: Containerd,
    api: FakeApiServer,
    listen: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    kubelet: Option<Kubelet>,
    _manager: Option<KruiseManager>,
    /// One line per run of the hook.
    hooks: std::path::PathBuf,
}

impl Node {
    async fn new(mode: &'static str, hook: &str) -> Self {
        support::init_logging();
        let ctrd = tokio::task::spawn_blocking(Containerd::start)
            .await
            .unwrap()
            .unwrap();
        let api = FakeApiServer::start_for_node(NODE, "node-a-token").await;
        api.set_watches(Watches::unkind());
        let listen = support::temp_socket("crash");
        let kubeconfig = listen.with_file_name("kubeconfig");
        support::write_kubeconfig_as(&kubeconfig, &api.url, Some("node-a-token"));
        let cri = support::client(&ctrd.endpoint());
        let kubelet = Kubelet::start(&api, cri, NODE, ctrd.scratch("logs")).await;
        let manager = (mode == "kruise").then(|| KruiseManager::start(&api));
        let shared = ctrd.scratch("shared");
        std::fs::create_dir_all(&shared).unwrap();
        let mut app = ContainerSpec::graceful("app");
        let command = format!("echo run >> /shared/hooks; {hook}");
        app.pre_stop = Some(json!({"exec": {"command": ["sh", "-c", command]}}));
        app.shared = Some(shared.clone());
        kubelet.run_pod(PodSpec::new("web-0", vec![app])).await;
        Self {
            mode,
            ctrd,
            api,
            listen,
            kubeconfig,
            kubelet: Some(kubelet),
            _manager: manager,
            hooks: shared.join("hooks"),
        }
    }

    fn crr_proxy(&self, log: &str) -> Daemon {
        let log = self.listen.with_file_name(log);
        let runtime = self.ctrd.endpoint();
        support::daemon(
            env!("CARGO_BIN_EXE_crr-proxy"),
            self.mode,
            NODE,
            &self.listen,
            &runtime,
            &self.kubeconfig,
            &log,
        )
    }

    fn create_crr(&self) {
        self.api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": "restart-app"}, "spec": {
                    "podName": "web-0",
                    "containers": [{"name": "app"}],
                    "strategy": {"terminationGracePeriodSeconds": GRACE_SECONDS},
                }}),
            )
            .unwrap();
    }

    fn hooks(&self) -> String {
        std::fs::read_to_string(&self.hooks).unwrap_or_default()
    }

    async fn hook_began(&self) {
        wait_for(Duration::from_secs(30), || {
            (self.hooks() == "run\n").then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("the preStop hook did not begin: {}", self.logs()));
    }

    async fn completed(&self) -> Value {
        // A stop may take the whole grace period (see GRACE_SECONDS).
        let done = wait_for(Duration::from_secs(GRACE_SECONDS + 30), || {
            self.api
                .get(Resource::Crr, NAMESPACE, "restart-app")
                .filter(|c| c["status"]["phase"] == "Completed")
        })
        .await;
        done.unwrap_or_else(|| {
            panic!(
                "the CRR did not complete after the restart: {}",
                self.logs()
            )
        })
    }

    /// The CRR, both crr-proxies' logs and containerd's, for a failure.
    fn logs(&self) -> String {
        let log = |name: &str| {
            std::fs::read_to_string(self.listen.with_file_name(name)).unwrap_or_default()
        };
        format!(
            "{:?}\n--- first.log\n{}\n--- second.log\n{}\n--- containerd\n{}",
            self.api.get(Resource::Crr, NAMESPACE, "restart-app"),
            log("first.log"),
            log("second.log"),
            self.ctrd.log_tail()
        )
    }

    /// The CRR stopped the app exactly once, counted where it happens: the
    /// StopContainer calls containerd logged (nothing else in these tests
    /// stops a container). The restart count could not show a second stop:
    /// the kubelet role's back-off holds a second restart back for 10 s.
    /// Then kubelet restarted it.
    async fn stopped_once(&self) {
        // Give a late second stop every chance to show before counting.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stops = self.ctrd.stop_calls();
        assert_eq!(
            stops.len(),
            1,
            "the container was stopped exactly once: {stops:#?}"
        );
        let restarted = wait_for(Duration::from_secs(30), || {
            let pod = self.api.get(Resource::Pod, NAMESPACE, "web-0")?;
            (pod["status"]["containerStatuses"][0]["restartCount"] == 1).then_some(())
        })
        .await;
        assert!(
            restarted.is_some(),
            "kubelet did not restart the app once: {}",
            self.logs()
        );
    }

    /// The app's container ID now.
    fn app_id(&self) -> String {
        let pod = self.api.get(Resource::Pod, NAMESPACE, "web-0").unwrap();
        pod["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap()
            .trim_start_matches("containerd://")
            .to_owned()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.kubelet.take());
        support::remove_socket_dir(&self.listen);
    }
}

fn stop(proxy: &mut Daemon, signal: Signal) -> std::process::ExitStatus {
    kill(Pid::from_raw(proxy.0.id() as i32), signal).unwrap();
    proxy.0.wait().unwrap()
}

async fn killed_between_the_stop_and_its_record(mode: &'static str) {
    let node = Node::new(mode, "true").await;
    let hit = node.api.stall_writes(Arc::new(records_a_kill));
    let mut first = node.crr_proxy("first.log");
    node.create_crr();
    if tokio::time::timeout(Duration::from_secs(30), hit.notified())
        .await
        .is_err()
    {
        panic!("crr-proxy did not go to record the kill: {}", node.logs());
    }
    stop(&mut first, Signal::SIGKILL);
    assert_eq!(node.hooks(), "run\n", "the hook ran once before the crash");
    // Its logs of the kill are in the CRR's span: namespace, name, Pod.
    let logs = std::fs::read_to_string(node.listen.with_file_name("first.log")).unwrap();
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
    let crr = node
        .api
        .get(Resource::Crr, NAMESPACE, "restart-app")
        .unwrap();
    assert_ne!(crr["status"]["phase"], "Completed");

    // A new crr-proxy (systemd's restart) takes the CRR over.
    node.api.clear_stall();
    let mut second = node.crr_proxy("second.log");
    let done = node.completed().await;
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
    node.stopped_once().await;
    assert_eq!(node.hooks(), "run\n", "the hook ran exactly once");
    assert!(stop(&mut second, Signal::SIGTERM).success());
}

/// SIGKILL while the preStop hook runs: the next crr-proxy stops the
/// container without running the hook again.
async fn killed_during_the_hook(mode: &'static str) {
    let node = Node::new(mode, "sleep 5").await;
    let mut first = node.crr_proxy("first.log");
    node.create_crr();
    node.hook_began().await;
    stop(&mut first, Signal::SIGKILL);
    let mut second = node.crr_proxy("second.log");
    node.completed().await;
    node.stopped_once().await;
    assert_eq!(node.hooks(), "run\n", "the hook ran at most once");
    assert!(stop(&mut second, Signal::SIGTERM).success());
}

/// SIGTERM while the preStop hook runs: crr-proxy lets the kill finish
/// (hook, then StopContainer) before it exits, and the next one completes
/// the CRR without a second hook or stop.
async fn stopped_during_the_hook(mode: &'static str) {
    let node = Node::new(mode, "sleep 2").await;
    let mut first = node.crr_proxy("first.log");
    node.create_crr();
    node.hook_began().await;
    let old = node.app_id();
    assert!(stop(&mut first, Signal::SIGTERM).success());
    let mut cri = support::client(&node.ctrd.endpoint());
    let status = cri
        .container_status(crr_proxy::cri::v1::ContainerStatusRequest {
            container_id: old,
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(
        status.state(),
        crr_proxy::cri::v1::ContainerState::ContainerExited,
        "crr-proxy exited before the kill it had begun was over"
    );
    let mut second = node.crr_proxy("second.log");
    node.completed().await;
    node.stopped_once().await;
    assert_eq!(node.hooks(), "run\n", "the hook ran once");
    assert!(stop(&mut second, Signal::SIGTERM).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_mode_sigkill_after_the_stop_stops_once() {
    killed_between_the_stop_and_its_record("kruise").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mode_sigkill_after_the_stop_stops_once() {
    killed_between_the_stop_and_its_record("standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_mode_sigkill_during_the_hook_runs_it_once() {
    killed_during_the_hook("kruise").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mode_sigkill_during_the_hook_runs_it_once() {
    killed_during_the_hook("standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruise_mode_sigterm_during_the_hook_finishes_the_kill() {
    stopped_during_the_hook("kruise").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mode_sigterm_during_the_hook_finishes_the_kill() {
    stopped_during_the_hook("standalone").await;
}
