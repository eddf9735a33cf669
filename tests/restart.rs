//! `crr-proxy restart` (and `kubectl-crr restart`), run as the binary an
//! operator runs, against the fake API server with real containerd, the
//! kubelet role, and crr-proxy's agent in standalone mode as node-a.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crr_proxy::agent::{self, AgentConfig, LeaseSettings, Mode};
use crr_proxy::kill::Killer;
use crr_proxy::metrics::Metrics;
use crr_proxy::proxy::{Proxy, Routes};
use crr_proxy::reason::Recreated;
use crr_proxy::records::Records;
use serde_json::{Value, json};
use support::ProxyUnderTest;
use support::apiserver::{FakeApiServer, Resource, Selector};
use support::containerd::Containerd;
use support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use support::workloads::{self, DisruptionController, Workload};

const NODE: &str = "node-a";
const OPERATOR_TOKEN: &str = "operator-token";

/// The rules of deploy/base/rbac-restart.yaml's ClusterRole.
fn restart_role() -> Value {
    let manifest = include_str!("../deploy/base/rbac-restart.yaml");
    let role: Value = serde_saphyr::from_str(manifest).unwrap();
    assert_eq!(role["kind"], "ClusterRole");
    role["rules"].clone()
}

/// One node in standalone mode, and a kubeconfig for the operator.
struct Node {
    api: FakeApiServer,
    kubelet: Kubelet,
    kubeconfig: PathBuf,
    agent: tokio::task::JoinHandle<()>,
    recreated: Arc<Recreated>,
    _disruption: DisruptionController,
    _proxy: ProxyUnderTest,
    ctrd: Containerd,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.agent.abort();
    }
}

impl Node {
    async fn start() -> Self {
        support::init_logging();
        let ctrd = tokio::task::spawn_blocking(Containerd::start)
            .await
            .unwrap()
            .unwrap();
        let api = FakeApiServer::start_for_node(NODE, "node-a-token").await;
        let recreated = Arc::new(Recreated::in_memory());
        let proxy = ProxyUnderTest::serve(
            Proxy::new(Routes {
                runtime: ctrd.endpoint(),
                image: None,
            })
            .with_reasons(Arc::clone(&recreated)),
        );
        let kubelet = Kubelet::start(&api, proxy.client(), NODE, ctrd.scratch("logs")).await;
        let cri = support::client(&ctrd.endpoint());
        let (synced, mut ready) = tokio::sync::watch::channel(false);
        let config = AgentConfig {
            client: api.client_as("node-a-token"),
            cri: cri.clone(),
            killer: Killer::new(cri, None),
            node_name: NODE.into(),
            mode: Mode::Standalone,
            recreated: Arc::clone(&recreated),
            kills: Arc::new(Records::in_memory()),
            metrics: Arc::new(Metrics::default()),
            lease: LeaseSettings::default(),
            kubelet: agent::KubeletSettings {
                config: None,
                reads_rewrites: true,
            },
        };
        let agent = tokio::spawn(agent::run(config, synced, std::future::pending()));
        tokio::time::timeout(Duration::from_secs(10), ready.wait_for(|r| *r))
            .await
            .unwrap()
            .unwrap();
        let kubeconfig = ctrd.scratch("operator").join("kubeconfig");
        // The operator's: two contexts, the current one without a namespace.
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]\n\
                 users: [{{name: operator, user: {{token: {OPERATOR_TOKEN}}}}}]\n\
                 contexts: [{{name: plain, context: {{cluster: fake, user: operator}}}},\n\
                 {{name: shop, context: {{cluster: fake, user: operator, namespace: shop}}}}]\n\
                 current-context: plain\n",
                api.url
            ),
        )
        .unwrap();
        // The operator may do what deploy/base/rbac-restart.yaml grants, no more.
        api.add_user(
            OPERATOR_TOKEN,
            support::policy::UserInfo {
                username: "operator".into(),
                groups: vec!["system:authenticated".into()],
            },
        );
        api.grant("operator", &restart_role());
        Self {
            recreated,
            _disruption: DisruptionController::start(&api),
            api,
            kubelet,
            kubeconfig,
            agent,
            _proxy: proxy,
            ctrd,
        }
    }

    /// Runs the binary as `program` (argv[0]) with `args`.
    async fn run_as(&self, program: &Path, args: &[&str]) -> Run {
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("CRR_PROXY_LOG");
        let output = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    async fn restart(&self, args: &[&str]) -> Run {
        let mut all = vec!["restart"];
        all.extend_from_slice(args);
        self.run_as(Path::new(env!("CARGO_BIN_EXE_crr-proxy")), &all)
            .await
    }

    fn crrs(&self, namespace: &str) -> Vec<Value> {
        self.api
            .list(Resource::Crr, Some(namespace), &Selector::default())
    }

    fn pod(&self, name: &str) -> Value {
        self.api.get(Resource::Pod, "default", name).unwrap()
    }
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn restarts(pod: &Value, container: &str) -> i64 {
    pod["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == container)
        .unwrap()["restartCount"]
        .as_i64()
        .unwrap()
}

fn two_containers(name: &str) -> PodSpec {
    PodSpec::new(
        name,
        vec![
            ContainerSpec::graceful("app"),
            ContainerSpec::graceful("sidecar"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_pod_is_restarted_and_followed_to_the_end() {
    let node = Node::start().await;
    node.kubelet.run_pod(two_containers("web")).await;
    let run = node.restart(&["web", "-c", "app", "--wait"]).await;
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, 0, "{run:?}");
    let out = &run.stdout;
    assert!(
        out.starts_with("containerrecreaterequest/web-restart-"),
        "{out}"
    );
    assert!(out.contains(" created in default\n"), "{out}");
    for line in [
        "CRR Recreating",
        "app: Succeeded, killed",
        "event Killing: Stopping container app by ContainerRecreateRequest web-restart-",
        "app: restarted (1 restarts, last ended: ContainerRecreateRequest)",
        ": succeeded in ",
        ", restarts 0 -> 1, last ended: ContainerRecreateRequest",
        "steps: ",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    assert!(
        !out.contains("sidecar"),
        "only the app was asked for:\n{out}"
    );
    let pod = node.pod("web");
    assert_eq!(restarts(&pod, "app"), 1);
    assert_eq!(restarts(&pod, "sidecar"), 0);
    let crrs = node.crrs("default");
    assert_eq!(crrs.len(), 1);
    assert_eq!(
        crrs[0]["metadata"]["labels"]["crr-proxy.io/created-by"],
        "kubectl-crr"
    );
    assert_eq!(crrs[0]["status"]["phase"], "Completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_pre_stop_is_shown_and_the_exit_status_is_not_zero() {
    let node = Node::start().await;
    let mut app = ContainerSpec::graceful("app");
    app.pre_stop = Some(json!({"exec": {"command": ["sh", "-c", "echo no clean stop; exit 3"]}}));
    node.kubelet.run_pod(PodSpec::new("web", vec![app])).await;
    let run = node.restart(&["web", "-c", "app", "--wait"]).await;
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, 1, "{run:?}");
    let out = &run.stdout;
    assert!(out.contains("event FailedPreStopHook: "), "{out}");
    assert!(out.contains("no clean stop"), "{out}");
    assert!(out.contains(": FAILED after "), "{out}");
    assert!(out.contains("preStop hook failed: "), "{out}");
    // The container was still recreated, as kubelet would.
    assert!(out.contains("app: Succeeded, killed"), "{out}");

    // Again, with a restart already behind the container: a failure too.
    node.kubelet.set_crash_loop_backoff(quick_backoff());
    let again = node.restart(&["web", "-c", "app", "--wait"]).await;
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.stdout.contains("preStop hook failed: "), "{again:?}");
    assert_eq!(restarts(&node.pod("web"), "app"), 2);
}

/// kubelet's CrashLoopBackOff, short: a second restart within minutes
/// would otherwise wait 10 s.
fn quick_backoff() -> support::kubelet::CrashLoopBackOff {
    support::kubelet::CrashLoopBackOff {
        initial: Duration::from_millis(200),
        max: Duration::from_secs(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gives_a_clear_error_and_creates_nothing() {
    let node = Node::start().await;
    node.kubelet.run_pod(two_containers("web")).await;
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["nosuch", "-c", "app"],
            1,
            "error: pod nosuch not found in namespace default",
        ),
        (
            &["web", "-c", "db"],
            1,
            "error: pod web has no container db (it has: app, sidecar)",
        ),
        (
            &["web", "-c", "app,app"],
            1,
            "error: container app is named twice",
        ),
        (
            &["web", "-c", "app", "--deadline", "1s"],
            1,
            "--deadline must be at least 3s",
        ),
        // A duration kubectl would take, but the CRR's field is whole seconds.
        (
            &["web", "-c", "app", "--ttl", "1.5s"],
            1,
            "error: --ttl must be whole seconds, got 1.5s",
        ),
        (
            &["web", "-c", "app", "--ttl", "1.5x"],
            2,
            "invalid value '1.5x' for '--ttl",
        ),
        (&[], 2, "required arguments were not provided"),
        (
            &["web"],
            1,
            "error: pod web has containers app, sidecar and no kubectl.kubernetes.io/default-container",
        ),
        (&["web", "-l", "app=web"], 2, "cannot be used with"),
        (&["-l", " ", "-c", "app"], 1, "error: -l needs a selector"),
        (
            &["web", "-c", "app", "--max-unavailable", "2"],
            1,
            "error: --max-unavailable, --continue-on-failure and --run-id apply to a workload (KIND/NAME) or a selector (-l) only",
        ),
        (
            &["pod/web", "-c", "app", "--run-id", "r1"],
            1,
            "apply to a workload (KIND/NAME) or a selector (-l) only",
        ),
        (
            &["web", "-c", "app", "-n", "shop"],
            1,
            "error: pod web not found in namespace shop",
        ),
        (
            &["web", "-c", "app", "--context", "shop"],
            1,
            "error: pod web not found in namespace shop",
        ),
        (
            &["web", "-c", "app", "--context", "nowhere"],
            1,
            "error: kubeconfig: ",
        ),
    ];
    for (args, code, message) in cases {
        let run = node.restart(args).await;
        assert_eq!(run.code, *code, "{args:?}: {run:?}");
        assert!(run.stderr.contains(message), "{args:?}: {run:?}");
    }
    assert!(node.crrs("default").is_empty());
    assert!(node.crrs("shop").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dry_runs_create_nothing_and_output_is_the_object() {
    let node = Node::start().await;
    node.kubelet.run_pod(two_containers("web")).await;
    let client = node
        .restart(&[
            "web",
            "-c",
            "app,sidecar",
            "--ordered",
            "--min-started",
            "5s",
            "--dry-run=client",
            "-o",
            "json",
        ])
        .await;
    assert_eq!(client.code, 0, "{client:?}");
    let object: Value = serde_json::from_str(&client.stdout).unwrap();
    assert!(
        object["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("web-restart-")
    );
    assert_eq!(
        object["spec"]["strategy"],
        json!({"orderedRecreate": true, "minStartedSeconds": 5})
    );
    assert!(
        client
            .stderr
            .contains("would be created in default (client dry run)"),
        "{client:?}"
    );

    let server = node
        .restart(&["web", "-c", "app", "--dry-run=server"])
        .await;
    assert_eq!(server.code, 0, "{server:?}");
    assert!(
        server
            .stdout
            .contains("created in default (server dry run)"),
        "{server:?}"
    );
    assert!(node.crrs("default").is_empty(), "a dry run stores nothing");

    // Not followed: the created object, as YAML, and the restart goes on.
    let created = node
        .restart(&["web", "-c", "app", "--no-wait", "-o", "yaml"])
        .await;
    assert_eq!(created.code, 0, "{created:?}");
    let object: Value = serde_saphyr::from_str(&created.stdout).unwrap();
    let name = object["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("web-restart-"), "{name}");
    assert!(
        created
            .stderr
            .contains(&format!("containerrecreaterequest/{name} created"))
    );
    support::roles::wait_for(Duration::from_secs(30), || {
        let crr = node.api.get(Resource::Crr, "default", &name)?;
        (crr["status"]["phase"] == "Completed").then_some(())
    })
    .await
    .expect("the restart went on without the tool");
}

/// On PATH as `kubectl-crr`, kubectl runs it for `kubectl crr ...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn as_a_kubectl_plugin_it_is_the_same_tool() {
    let node = Node::start().await;
    node.kubelet.run_pod(two_containers("web")).await;
    let plugin = node.ctrd.scratch("bin").join("kubectl-crr");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_crr-proxy"), &plugin).unwrap();
    let help = node.run_as(&plugin, &["restart", "--help"]).await;
    assert_eq!(help.code, 0, "{help:?}");
    assert!(
        help.stdout.contains("Usage: kubectl crr restart"),
        "{help:?}"
    );
    // kubectl crr speaks as itself and shows its user only `restart`; the
    // node's commands are not its business (they still parse).
    let top = node.run_as(&plugin, &["--help"]).await;
    assert!(
        top.stdout.contains("Usage: kubectl crr <COMMAND>"),
        "{top:?}"
    );
    assert!(top.stdout.contains("  restart "), "{top:?}");
    for hidden in ["  run ", "  check ", "  crd "] {
        assert!(
            !top.stdout.contains(hidden),
            "{hidden:?} shown:\n{}",
            top.stdout
        );
    }
    let run = node
        .run_as(&plugin, &["restart", "web", "-c", "sidecar", "--wait"])
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("sidecar: Succeeded, killed"), "{run:?}");
    assert_eq!(restarts(&node.pod("web"), "sidecar"), 1);
    // kubectl's spellings: --wait=false and -o name.
    let named = node
        .run_as(
            &plugin,
            &[
                "restart",
                "web",
                "-c",
                "sidecar",
                "--wait=false",
                "-o",
                "name",
            ],
        )
        .await;
    assert_eq!(named.code, 0, "{named:?}");
    let name = named
        .stdout
        .strip_prefix("containerrecreaterequest.apps.kruise.io/")
        .and_then(|rest| rest.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("{named:?}"));
    assert!(
        name.starts_with("web-restart-") && !name.contains('\n'),
        "{named:?}"
    );
    assert!(node.api.get(Resource::Crr, "default", name).is_some());
}

/// Ctrl-C stops following, never the restart: exit 130, and the CRR
/// completes without the tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ctrl_c_stops_following_and_the_restart_goes_on() {
    use std::io::BufRead;
    let node = Node::start().await;
    let mut app = ContainerSpec::graceful("app");
    app.pre_stop = Some(json!({"exec": {"command": ["sleep", "3"]}}));
    node.kubelet.run_pod(PodSpec::new("web", vec![app])).await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
        .args(["restart", "web", "-c", "app", "--wait"])
        .env("KUBECONFIG", &node.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (name, rest) = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().unwrap().unwrap();
        let name = first
            .strip_prefix("containerrecreaterequest/")
            .and_then(|l| l.split(' ').next())
            .unwrap()
            .to_owned();
        // Following now (the preStop takes 3 s).
        loop {
            let line = lines.next().unwrap().unwrap();
            if line.contains("event Killing") {
                break;
            }
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130));
        (name, rest)
    })
    .await
    .unwrap();
    assert!(
        rest.iter().any(|l| l.starts_with("stopped following; the restart goes on: kubectl get containerrecreaterequest -n default ")),
        "{rest:?}"
    );
    support::roles::wait_for(Duration::from_secs(30), || {
        let crr = node.api.get(Resource::Crr, "default", &name)?;
        (crr["status"]["phase"] == "Completed").then_some(())
    })
    .await
    .expect("the restart went on");
    assert_eq!(restarts(&node.pod("web"), "app"), 1);
}

/// A native sidecar is restarted like any container, and the tool shows
/// its restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_native_sidecar_is_restarted() {
    let node = Node::start().await;
    let pod = PodSpec::new(
        "web",
        vec![
            ContainerSpec::sidecar("proxy"),
            ContainerSpec::graceful("app"),
        ],
    );
    node.kubelet.run_pod(pod).await;
    let run = node.restart(&["web", "-c", "proxy", "--wait"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("proxy: restarted (1 restarts, last ended: ContainerRecreateRequest)"),
        "{run:?}"
    );
    let pod = node.pod("web");
    assert_eq!(pod["status"]["initContainerStatuses"][0]["name"], "proxy");
    assert_eq!(pod["status"]["initContainerStatuses"][0]["restartCount"], 1);
    assert_eq!(restarts(&pod, "app"), 0);
}

/// `--timeout` ends the following as a failure (exit 1) that says so; the
/// restart goes on in the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeout_ends_the_following_as_a_failure() {
    let node = Node::start().await;
    let mut app = ContainerSpec::graceful("app");
    app.pre_stop = Some(json!({"exec": {"command": ["sleep", "4"]}}));
    node.kubelet.run_pod(PodSpec::new("web", vec![app])).await;
    let started = std::time::Instant::now();
    let run = node
        .restart(&["web", "-c", "app", "--wait", "--timeout", "1s"])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(
        run.stdout
            .lines()
            .chain(run.stderr.lines())
            .any(|l| l == "timed out after 1s; what was created goes on: kubectl get containerrecreaterequests -n default"),
        "{run:?}"
    );
    support::roles::wait_for(Duration::from_secs(30), || {
        let crr = node.crrs("default").into_iter().next()?;
        (crr["status"]["phase"] == "Completed").then_some(())
    })
    .await
    .expect("the restart went on");
    assert_eq!(restarts(&node.pod("web"), "app"), 1);
}

// ---- A workload, in waves ----

/// A Pod of a workload: one container that is Ready 1 s after each start,
/// so that every restart leaves the Pod unready for a while.
fn slow_ready(name: &str) -> PodSpec {
    let mut app = ContainerSpec::graceful("app");
    app.post_start = Duration::from_secs(1);
    PodSpec::new(name, vec![app])
}

/// Counts, every 20 ms, the workload's Pods that are restarting (a CRR not
/// yet completed) or unready, and keeps the most seen at once.
struct Sampler {
    most: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(node: &Node, pods: &[String]) -> Self {
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (api, pods, seen) = (node.api.clone(), pods.to_vec(), Arc::clone(&most));
        let task = tokio::spawn(async move {
            loop {
                let crrs = api.list(Resource::Crr, Some("default"), &Selector::default());
                let down = pods
                    .iter()
                    .filter(|name| {
                        let restarting = crrs.iter().any(|c| {
                            c["spec"]["podName"] == name.as_str()
                                && c["status"]["phase"] != "Completed"
                        });
                        let ready = api
                            .get(Resource::Pod, "default", name)
                            .and_then(|p| support::roles::condition(&p, "Ready"))
                            .is_some_and(|r| r == "True");
                        restarting || !ready
                    })
                    .count();
                seen.fetch_max(down, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Self { most, task }
    }

    fn most(&self) -> usize {
        self.task.abort();
        self.most.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Node {
    async fn deployment(
        &self,
        name: &str,
        replicas: usize,
        pod: impl Fn(&str) -> PodSpec,
    ) -> Workload {
        workloads::create(
            &self.api,
            &self.kubelet,
            Resource::Deployment,
            name,
            replicas,
            pod,
        )
        .await
    }

    /// A PodDisruptionBudget `web` over the Pods labelled `app=web`, once
    /// the disruption controller has judged it as `judged` says.
    async fn web_budget(&self, max_unavailable: u32, judged: impl Fn(&Value) -> bool) {
        self.api
            .create(
                Resource::PodDisruptionBudget,
                "default",
                json!({"metadata": {"name": "web"},
                       "spec": {"maxUnavailable": max_unavailable,
                                "selector": {"matchLabels": {"app": "web"}}}}),
            )
            .unwrap();
        support::roles::wait_for(Duration::from_secs(5), || {
            self.api
                .get(Resource::PodDisruptionBudget, "default", "web")
                .filter(|b| judged(b))
        })
        .await
        .expect("the disruption controller judged the budget");
    }

    fn set_web_budget(&self, max_unavailable: u32) {
        let patch = json!({"spec": {"maxUnavailable": max_unavailable}});
        self.api
            .patch(
                Resource::PodDisruptionBudget,
                "default",
                "web",
                &patch,
                false,
            )
            .unwrap();
    }

    fn restart_counts(&self, pods: &[String]) -> Vec<i64> {
        pods.iter().map(|p| restarts(&self.pod(p), "app")).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_is_restarted_in_waves_of_at_most_max_unavailable() {
    let node = Node::start().await;
    let web = node.deployment("web", 6, slow_ready).await;
    let sampler = Sampler::start(&node, &web.pods);
    let run = node
        .restart(&["deployment/web", "-c", "app", "--max-unavailable", "2"])
        .await;
    let most = sampler.most();
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        most, 2,
        "at most 2 Pods down at once, and 2 did go together"
    );
    assert_eq!(node.restart_counts(&web.pods), vec![1; 6]);
    let out = &run.stdout;
    assert!(
        out.contains("restarting app in 6 Pods of deployment/web, at most 2 at a time"),
        "{out}"
    );
    assert!(
        out.contains(&format!("wave 1: {}, {}\n", web.pods[0], web.pods[1])),
        "{out}"
    );
    assert!(out.contains("wave 3: "), "{out}");
    assert!(!out.contains("wave 4: "), "{out}");
    assert!(
        out.contains(&format!("{}: restarted in ", web.pods[5])),
        "{out}"
    );
    assert!(out.contains("progress: Pods 6/6 done"), "{out}");
    assert!(
        out.contains("deployment/web: 6 restarted, 0 skipped, 0 failed in "),
        "{out}"
    );
    let crrs = node.crrs("default");
    assert_eq!(crrs.len(), 6);
    let run_id = crrs[0]["metadata"]["labels"]["crr-proxy.io/run"].clone();
    for crr in &crrs {
        assert_eq!(crr["metadata"]["labels"]["crr-proxy.io/run"], run_id);
        assert_eq!(
            crr["metadata"]["labels"]["crr-proxy.io/workload-uid"],
            web.uid.as_str()
        );
    }
}

/// A PodDisruptionBudget over the Pods has the last word: while it allows
/// no disruption the run waits, saying why; at `maxUnavailable: 1` it goes
/// one Pod at a time, whatever `--max-unavailable` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disruption_budget_holds_the_run_and_lowers_its_waves() {
    let node = Node::start().await;
    let web = node.deployment("web", 4, slow_ready).await;
    node.web_budget(0, |b| b["status"]["currentHealthy"] == 4)
        .await;
    let sampler = Sampler::start(&node, &web.pods);
    let run = {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"));
        command
            .args([
                "restart",
                "deploy/web",
                "-c",
                "app",
                "--max-unavailable",
                "50%",
            ])
            .env("KUBECONFIG", &node.kubeconfig);
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        node.crrs("default").is_empty(),
        "nothing while the budget allows nothing"
    );
    node.set_web_budget(1);
    let output = run.await.unwrap();
    let most = sampler.most();
    let out = String::from_utf8_lossy(&output.stdout);
    eprintln!("{out}");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(out.contains("at most 2 at a time"), "{out}");
    assert!(
        out.contains("waiting: PodDisruptionBudget web allows no disruption now\n"),
        "{out}"
    );
    assert_eq!(most, 1, "the budget allows one Pod down");
    assert!(out.contains("wave 4: "), "{out}");
    assert_eq!(node.restart_counts(&web.pods), vec![1; 4]);
}

/// The run's watch of the budgets lags 10 s behind (a slow watch cache).
/// While the first Pod restarts, the budget is lowered to allow nothing:
/// the run reads the budgets afresh before its second wave and waits,
/// instead of trusting its stale copy, until the budget allows one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_wave_reads_the_budgets_afresh() {
    let node = Node::start().await;
    let web = node.deployment("web", 2, slow_ready).await;
    node.web_budget(1, |b| b["status"]["disruptionsAllowed"] == 1)
        .await;
    node.api.set_watches(support::apiserver::Watches {
        lag: [(Resource::PodDisruptionBudget, Duration::from_secs(10))].into(),
        ..Default::default()
    });
    let run = {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"));
        command
            .args([
                "restart",
                "deploy/web",
                "-c",
                "app",
                "--max-unavailable",
                "1",
            ])
            .env("KUBECONFIG", &node.kubeconfig);
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    support::roles::wait_for(Duration::from_secs(10), || {
        (node.crrs("default").len() == 1).then_some(())
    })
    .await
    .expect("the first wave");
    node.set_web_budget(0);
    // Long enough for the first Pod to be back and Ready, well within the lag.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        node.crrs("default").len(),
        1,
        "a second wave while the budget allows nothing"
    );
    node.set_web_budget(1);
    let output = run.await.unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        out.contains("waiting: PodDisruptionBudget web allows no disruption now\n"),
        "{out}"
    );
    assert_eq!(node.restart_counts(&web.pods), vec![1; 2]);
}

fn second_fails(name: &str) -> PodSpec {
    let mut spec = slow_ready(name);
    if name.ends_with("c9q4m") {
        spec.containers[0].pre_stop =
            Some(json!({"exec": {"command": ["sh", "-c", "echo cannot drain; exit 3"]}}));
    }
    spec
}

/// The first failed restart stops the run; `--continue-on-failure` (here
/// resuming the same run) goes past it and still exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_restart_stops_the_run_unless_told_to_go_on() {
    let node = Node::start().await;
    let web = node.deployment("web", 4, second_fails).await;
    node.kubelet.set_crash_loop_backoff(quick_backoff());
    let run = node.restart(&["deployment/web", "-c", "app"]).await;
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, 1, "{run:?}");
    let out = &run.stdout;
    assert!(
        out.contains(&format!("{}: FAILED after ", web.pods[1])),
        "{out}"
    );
    assert!(out.contains("preStop hook failed: "), "{out}");
    assert!(
        out.contains("deployment/web: 1 restarted, 0 skipped, 1 failed, 2 not restarted"),
        "{out}"
    );
    assert!(out.contains("stopped at the first failed restart"), "{out}");
    assert_eq!(node.crrs("default").len(), 2, "no CRR after the failure");
    assert_eq!(node.restart_counts(&web.pods), vec![1, 1, 0, 0]);
    let run_id = out
        .split("Resume: the same command with --run-id ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap()
        .to_owned();

    let again = node
        .restart(&[
            "deployment/web",
            "-c",
            "app",
            "--run-id",
            &run_id,
            "--continue-on-failure",
        ])
        .await;
    eprintln!("{}", again.stdout);
    assert_eq!(again.code, 1, "{again:?}");
    let out = &again.stdout;
    assert!(out.contains("(1 restarted by this run already)"), "{out}");
    assert!(
        out.contains("deployment/web: 2 restarted, 1 skipped, 1 failed in "),
        "{out}"
    );
    // The first Pod is not restarted twice; the failed one is tried again.
    assert_eq!(node.restart_counts(&web.pods), vec![1, 2, 1, 1]);
}

/// Ctrl-C stops the tool, not the run's restarts under way; the same
/// command with `--run-id` finishes the run and restarts no Pod twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interrupted_run_resumes_without_restarting_a_pod_twice() {
    use std::io::BufRead;
    let node = Node::start().await;
    let web = node.deployment("web", 4, slow_ready).await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
        .args(["restart", "deployment/web", "-c", "app"])
        .env("KUBECONFIG", &node.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        // Interrupted in the second wave, its restart under way.
        for line in lines.by_ref() {
            let line = line.unwrap();
            let second = line.starts_with("wave 2: ");
            seen.push(line);
            if second {
                break;
            }
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        seen.extend(lines.map_while(Result::ok));
        assert_eq!(child.wait().unwrap().code(), Some(130));
        seen
    })
    .await
    .unwrap();
    let out = lines.join("\n");
    eprintln!("{out}");
    let resume = lines
        .iter()
        .find_map(|l| l.split("Resume: the same command with --run-id ").nth(1))
        .unwrap_or_else(|| panic!("no resume hint in\n{out}"));
    assert!(out.contains("1 restart(s) under way go on"), "{out}");
    let again = node
        .restart(&["deployment/web", "-c", "app", "--run-id", resume])
        .await;
    eprintln!("{}", again.stdout);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stdout.contains("deployment/web: "), "{again:?}");
    assert_eq!(node.restart_counts(&web.pods), vec![1; 4], "each Pod once");
    assert_eq!(node.crrs("default").len(), 4, "one CRR a Pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_workload_input_gives_a_clear_error_and_creates_nothing() {
    let node = Node::start().await;
    node.deployment("web", 2, slow_ready).await;
    // A selector operator the API does not know (stored past validation):
    // refused, never read as something else (it once became `!canary`).
    node.api
        .create(
            Resource::Deployment,
            "default",
            json!({"metadata": {"name": "odd"},
                   "spec": {"replicas": 1, "selector": {"matchExpressions": [
                       {"key": "canary", "operator": "Gt", "values": ["1"]}]}}}),
        )
        .unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["deployment/odd", "-c", "app"],
            1,
            "error: the workload's label selector: Invalid expression operator",
        ),
        (
            &["job/backup", "-c", "app"],
            2,
            "unknown workload kind \"job\": restart a pod, deployment, statefulset",
        ),
        (
            &["deployment/web", "-c", "app", "--max-unavailable", "0"],
            2,
            "invalid value '0' for '--max-unavailable <N|P%>': must be at least 1",
        ),
        (
            &["deployment/web", "-c", "app", "--max-unavailable", "many"],
            2,
            "is neither a number of Pods (2) nor a percentage (25%)",
        ),
        (
            &["deployment/nosuch", "-c", "app"],
            1,
            "error: deployment nosuch not found in namespace default",
        ),
        (
            &["deployment/web", "-c", "db"],
            1,
            "has no container db (it has: app)",
        ),
        (
            &["cloneset/shop", "-c", "app"],
            1,
            "error: cloneset is not served by this cluster (is OpenKruise installed?)",
        ),
        (
            &["statefulset/web", "-c", "app"],
            1,
            "error: statefulset web not found in namespace default",
        ),
        (
            &["deployment/web", "-c", "app", "--no-wait"],
            1,
            "--no-wait applies to one Pod only",
        ),
    ];
    for (args, code, message) in cases {
        let run = node.restart(args).await;
        assert_eq!(run.code, *code, "{args:?}: {run:?}");
        assert!(run.stderr.contains(message), "{args:?}: {run:?}");
    }
    // The fake API server enforces the role: without `get` on Deployments
    // the tool is refused, and says so.
    let mut role = restart_role();
    for rule in role.as_array_mut().unwrap() {
        if rule["apiGroups"][0] == "apps" {
            rule["verbs"] = json!(["list"]);
        }
    }
    // A run id of another workload is not resumed.
    node.api
        .create(
            Resource::Crr,
            "default",
            json!({"metadata": {"name": "other-restart-b2x4z",
                                "labels": {"crr-proxy.io/run": "r1", "crr-proxy.io/workload-uid": "uid-of-another"}},
                   "spec": {"podName": "other", "containers": [{"name": "app"}]}}),
        )
        .unwrap();
    let run = node
        .restart(&["deployment/web", "-c", "app", "--run-id", "r1"])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr
            .contains("error: run r1 restarted Pods of another workload, not deployment/web"),
        "{run:?}"
    );
    assert_eq!(node.crrs("default").len(), 1, "nothing created");
    node.api.grant("operator", &role);
    let run = node.restart(&["deployment/web", "-c", "app"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains(
            "deployments.apps \"web\" is forbidden: User \"operator\" cannot get resource \"deployments\" in API group \"apps\" in the namespace \"default\""
        ),
        "{run:?}"
    );
    assert_eq!(node.crrs("default").len(), 1);
}

/// OpenKruise's CloneSet once its CRD is served; a dry run of a workload
/// lists the CRRs it would create and stores none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clone_set_is_restarted_once_served_and_dry_runs_store_nothing() {
    let node = Node::start().await;
    node.api.serve_kruise_workloads();
    let shop = workloads::create(
        &node.api,
        &node.kubelet,
        Resource::CloneSet,
        "shop",
        2,
        slow_ready,
    )
    .await;
    let dry = node
        .restart(&[
            "cloneset/shop",
            "-c",
            "app",
            "--dry-run=client",
            "-o",
            "json",
        ])
        .await;
    assert_eq!(dry.code, 0, "{dry:?}");
    let list: Value = serde_json::from_str(&dry.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert_eq!(list["items"][0]["spec"]["podName"], shop.pods[0].as_str());
    assert!(
        dry.stderr
            .contains("2 containerrecreaterequests would be created in default for cloneset/shop"),
        "{dry:?}"
    );
    let server = node
        .restart(&["clone/shop", "-c", "app", "--dry-run=server"])
        .await;
    assert_eq!(server.code, 0, "{server:?}");
    assert!(node.crrs("default").is_empty(), "a dry run stores nothing");

    let run = node
        .restart(&["clone/shop", "-c", "app", "-o", "yaml"])
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("cloneset/shop: 2 restarted"), "{run:?}");
    let list: Value = serde_saphyr::from_str(&run.stdout).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert_eq!(node.restart_counts(&shop.pods), vec![1, 1]);
}

/// On a terminal the progress is one status line, redrawn in place, with
/// the lines that stay printed above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_terminal_progress_is_one_line_redrawn() {
    use clap::Parser;
    let node = Node::start().await;
    let web = node.deployment("web", 2, slow_ready).await;
    let cli = crr_proxy::config::Cli::parse_from([
        "crr-proxy",
        "restart",
        "deployment/web",
        "-c",
        "app",
        "--kubeconfig",
        node.kubeconfig.to_str().unwrap(),
    ]);
    let crr_proxy::config::Command::Restart(args) = cli.command else {
        panic!("not restart");
    };
    let options = args.options(true, true);
    let (mut out, mut progress) = (Vec::new(), Vec::new());
    let ended = crr_proxy::restart::run(&options, &mut out, &mut progress)
        .await
        .unwrap();
    let shown = String::from_utf8(progress).unwrap();
    assert_eq!(ended, crr_proxy::restart::Ended::Done, "{shown:?}");
    eprintln!("{shown:?}");
    const REDRAW: &str = "\r\x1b[2K";
    assert!(
        shown.contains(&format!("{REDRAW}Pods 0/2 done, wave 1 (1 Pod), ")),
        "{shown:?}"
    );
    assert!(
        shown.contains(&format!("{REDRAW}wave 2: {}\n", web.pods[1])),
        "{shown:?}"
    );
    assert!(
        shown.contains(&format!("{REDRAW}Pods 2/2 done, wave 2 (1 Pod), ")),
        "{shown:?}"
    );
    assert!(
        !shown.contains("progress: "),
        "no plain progress lines: {shown:?}"
    );
    assert!(out.is_empty());
}

/// Every kind the tool knows is found, its Pods by their controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_workload_kind_is_found_and_its_pods_restarted() {
    let node = Node::start().await;
    node.api.serve_kruise_workloads();
    for (resource, name, target) in [
        (Resource::StatefulSet, "db", "sts/db"),
        (Resource::DaemonSet, "agent", "daemonset/agent"),
        (Resource::ReplicaSet, "cache", "rs/cache"),
        (Resource::AdvancedStatefulSet, "store", "asts/store"),
    ] {
        let workload = workloads::create(&node.api, &node.kubelet, resource, name, 1, |n| {
            PodSpec::new(n, vec![ContainerSpec::graceful("app")])
        })
        .await;
        let run = node.restart(&[target, "-c", "app"]).await;
        assert_eq!(run.code, 0, "{target}: {run:?}");
        assert!(
            run.stdout.contains(" 1 restarted, 0 skipped, 0 failed"),
            "{target}: {run:?}"
        );
        assert_eq!(node.restart_counts(&workload.pods), vec![1], "{target}");
    }
    // A StatefulSet's Pods are named by ordinal.
    assert_eq!(node.pod("db-0")["metadata"]["name"], "db-0");
}

/// The reason is recorded before the container is stopped, not after
/// StopContainer returns: kubelet may read the exited container's status in
/// between, and would then keep the runtime's own reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_restart_reason_is_recorded_before_the_container_stops() {
    let node = Node::start().await;
    // Ignores SIGTERM: StopContainer lasts the whole 3 s grace period.
    let mut app = ContainerSpec::graceful("app");
    app.command = ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"]
        .map(String::from)
        .to_vec();
    let mut spec = PodSpec::new("web", vec![app]);
    spec.termination_grace_period = 3;
    let pod = node.kubelet.run_pod(spec).await;
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .rsplit("://")
        .next()
        .unwrap()
        .to_owned();
    let run = tokio::spawn({
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_crr-proxy"));
        command
            .args(["restart", "web", "-c", "app", "--wait"])
            .env("KUBECONFIG", &node.kubeconfig);
        async move {
            tokio::task::spawn_blocking(move || command.output().unwrap())
                .await
                .unwrap()
        }
    });
    let recorded =
        support::roles::wait_for(Duration::from_secs(10), || node.recreated.stopped(&id)).await;
    assert!(recorded.is_some(), "no record");
    let mut cri = support::client(&node.ctrd.endpoint());
    let state = support::pods::container_status(&mut cri, &id).await.state;
    assert_eq!(
        state,
        crr_proxy::cri::v1::ContainerState::ContainerRunning as i32,
        "recorded while the old container still runs (it ignores SIGTERM for 3 s)"
    );
    let output = run.await.unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let pod = node.pod("web");
    assert_eq!(
        pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"],
        "ContainerRecreateRequest"
    );
}

/// Without `-c`, the Pod's default container, as kubectl picks it: the
/// only one, or the one `kubectl.kubernetes.io/default-container` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_container_named_the_pods_default_container_is_restarted() {
    let node = Node::start().await;
    node.kubelet
        .run_pod(PodSpec::new("solo", vec![ContainerSpec::graceful("app")]))
        .await;
    let mut annotated = two_containers("web");
    annotated.metadata =
        json!({"annotations": {"kubectl.kubernetes.io/default-container": "sidecar"}});
    node.kubelet.run_pod(annotated).await;
    node.kubelet.run_pod(two_containers("plain")).await;

    let run = node.restart(&["solo", "--wait"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(restarts(&node.pod("solo"), "app"), 1);

    let run = node.restart(&["web", "--wait"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let pod = node.pod("web");
    assert_eq!((restarts(&pod, "app"), restarts(&pod, "sidecar")), (0, 1));

    let run = node.restart(&["plain", "--wait"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains(
            "error: pod plain has containers app, sidecar and no \
             kubectl.kubernetes.io/default-container annotation: name the ones to restart with -c"
        ),
        "{run:?}"
    );
    let for_plain = node
        .crrs("default")
        .into_iter()
        .filter(|c| c["spec"]["podName"] == "plain")
        .count();
    assert_eq!(for_plain, 0, "nothing is created for a guess");
}

/// `-l` walks the Pods a selector matches, whoever owns them, in waves as
/// a workload's; Pods it does not match are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pods_a_selector_matches_are_restarted_in_waves() {
    let node = Node::start().await;
    let web = node.deployment("web", 3, slow_ready).await;
    let mut bare = slow_ready("loose");
    bare.metadata = json!({"labels": {"app": "web", "tier": "edge"}});
    node.kubelet.run_pod(bare).await;
    let mut other = slow_ready("other");
    other.metadata = json!({"labels": {"app": "db"}});
    node.kubelet.run_pod(other).await;

    let run = node
        .restart(&["-l", "app in (web),tier!=core", "--max-unavailable", "2"])
        .await;
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, 0, "{run:?}");
    let out = &run.stdout;
    assert!(
        out.contains(
            "restarting app in 4 Pods of pods -l app in (web),tier!=core, at most 2 at a time"
        ),
        "{out}"
    );
    assert!(
        out.contains("pods -l app in (web),tier!=core: 4 restarted, 0 skipped, 0 failed in "),
        "{out}"
    );
    assert_eq!(node.restart_counts(&web.pods), vec![1; 3]);
    assert_eq!(restarts(&node.pod("loose"), "app"), 1);
    assert_eq!(restarts(&node.pod("other"), "app"), 0);
    let crrs = node.crrs("default");
    assert_eq!(crrs.len(), 4);
    let uid = &crrs[0]["metadata"]["labels"]["crr-proxy.io/workload-uid"];
    assert!(uid.as_str().unwrap().starts_with("selector-"), "{uid}");
    assert!(
        crrs.iter()
            .all(|c| &c["metadata"]["labels"]["crr-proxy.io/workload-uid"] == uid)
    );

    // The same run id with another selector is another set: refused.
    let run_id = crrs[0]["metadata"]["labels"]["crr-proxy.io/run"]
        .as_str()
        .unwrap()
        .to_owned();
    let again = node.restart(&["-l", "app=web", "--run-id", &run_id]).await;
    assert_eq!(again.code, 1, "{again:?}");
    assert!(
        again
            .stderr
            .contains("restarted Pods of another workload, not pods -l app=web"),
        "{again:?}"
    );
    // A bad selector gets the API server's own message; none is refused.
    let bad = node.restart(&["-l", "app in web"]).await;
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(
        bad.stderr.contains("unable to parse requirement"),
        "{bad:?}"
    );
    let none = node.restart(&["-l", "app=nothing"]).await;
    assert_eq!(none.code, 1, "{none:?}");
    assert!(
        none.stderr
            .contains("error: pods -l app=nothing has no Pods to restart"),
        "{none:?}"
    );
    assert_eq!(node.crrs("default").len(), 4, "nothing more was created");
}
