//! crr-proxy's cost on kubelet's path, and the agent's reaction time, in one
//! run (`scripts/bench.sh`, or `cargo bench --bench latency` as root).
//!
//! The data path: CRI calls against a private containerd with one pod of
//! 100 containers, direct vs through the release crr-proxy binary vs a
//! socat byte splice (`UNIX-LISTEN,fork` to `UNIX-CONNECT`, the floor for
//! any proxy). Version, ContainerStatus and ListContainers, at concurrency 1
//! (one client, one call at a time) and 64 (64 calls in flight on one
//! connection, as kubelet multiplexes). Rounds of the three targets are
//! interleaved, so machine drift cancels out of the ratios. Then crr-proxy's
//! RSS, and its CPU seconds per 100 000 calls and socat's. With
//! `CRR_BENCH_PYTHON` (a Python with grpcio, as `scripts/bench.sh` sets up),
//! `benches/grpc_client.py` measures the same targets from a second,
//! independent client.
//!
//! The agent: crr-proxy `--agent kruise` against the tests' fake API server
//! and kubelet role. The time from creating a CRR (no preStop) to its
//! container's exit, as containerd records it (`finished_at`): an upper
//! bound of "CRR visible to StopContainer issued" that adds SIGTERM delivery,
//! and to containerd logging StopContainer. Twice: back to back (the next CRR
//! as soon as the last one's container has exited) and on a quiet node (once
//! the last one has completed and its Pod is Ready again).
//! Then the agent's RSS with 1 000 CRRs in its cache.
//!
//! First, `crr-proxy restart deployment/web` over Pods that exist only in
//! the fake API server and whose CRRs complete at once: the command's API
//! requests per Pod, peak RSS and time per Pod, at 100 and 1 000 Pods.
//!
//! `CRR_BENCH_CALLS` sets the calls per target and method at concurrency 1
//! (default 5000; 4× that at concurrency 64; 0 skips the data path);
//! `CRR_BENCH_CRRS` the CRRs timed (default 200; 0 skips the agent);
//! `CRR_BENCH_RESTART` the restart command's Pod counts (default
//! `100,1000`; `0` skips it). `CRR_BENCH_EACH` prints a line per CRR (its
//! creation, stop and exit times and its Pod's containers in the runtime).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crr_proxy::cri::RuntimeClient;
use crr_proxy::cri::v1::{ContainerStatusRequest, ListContainersRequest, VersionRequest};
use crr_proxy::proxy::Endpoint;
use serde_json::json;
use support::apiserver::{FakeApiServer, Resource};
use support::containerd::Containerd;
use support::kubelet::{ContainerSpec, CrashLoopBackOff, Kubelet, PodSpec};
use support::procfs::{cpu_seconds, rss_mib, status_mib};
use support::roles::{KruiseManager, NAMESPACE, wait_for};

const ROUNDS: usize = 10;
const CONTAINERS: usize = 100;
const CONCURRENCY: usize = 64;
const PODS: usize = 20;
const CACHED_CRRS: usize = 1000;

fn main() -> anyhow::Result<()> {
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let calls = env("CRR_BENCH_CALLS", 5000);
    let crrs = env("CRR_BENCH_CRRS", 200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let restart_pods = std::env::var("CRR_BENCH_RESTART").unwrap_or_else(|_| "100,1000".into());
    let restart_pods: Vec<usize> = restart_pods
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .filter(|&n| n > 0)
        .collect();
    if !restart_pods.is_empty() {
        println!("# restart deployment/web (Pods on paper, one at a time)");
        for pods in restart_pods {
            runtime.block_on(restart_at_scale(pods))?;
        }
    }
    if calls == 0 {
        // The agent alone.
        if crrs > 0 {
            let ctrd = Containerd::start()?;
            println!("# agent (kruise mode)");
            runtime.block_on(agent(&ctrd, crrs))?;
        }
        return Ok(());
    }
    let ctrd = Containerd::start()?;
    let some_container = runtime.block_on(setup_pod(&ctrd))?;

    let proxy_socket = support::temp_socket("bench-proxy");
    let proxy = Spawned::new(
        Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .arg("run")
            .args(["--listen", proxy_socket.to_str().unwrap()])
            .args(["--runtime-endpoint", &ctrd.endpoint().to_string()])
            .args(["--metrics-addr", "off"]),
    )?;
    let socat_socket = support::temp_socket("bench-socat");
    let socat = Spawned::new(
        Command::new("socat")
            .arg(format!("UNIX-LISTEN:{},fork", socat_socket.display()))
            .arg(format!("UNIX-CONNECT:{}", ctrd.socket().display())),
    )
    .map_err(|e| anyhow::anyhow!("socat is needed (apt-get install socat): {e}"))?;
    support::wait_for_path(&proxy_socket);
    support::wait_for_path(&socat_socket);
    let targets = [
        ("direct", ctrd.endpoint()),
        ("crr-proxy", Endpoint::from_path(&proxy_socket)),
        ("socat", Endpoint::from_path(&socat_socket)),
    ];

    println!("# data path: {CONTAINERS} containers; interleaved rounds of {ROUNDS}");
    let mut proxied = 0;
    for concurrency in [1, CONCURRENCY] {
        let per_target = if concurrency == 1 { calls } else { calls * 4 };
        println!("## concurrency {concurrency}, {per_target} calls per target and method");
        let cpu_before = [
            cpu_seconds(proxy.id(), false),
            cpu_seconds(socat.id(), true),
        ];
        for method in [
            Method::Version,
            Method::ContainerStatus(some_container.clone()),
            Method::ListContainers,
        ] {
            let results = runtime.block_on(measure(&targets, &method, concurrency, per_target));
            report(&method, &results);
            proxied += per_target;
        }
        // socat forks a child per connection; the parent counts the CPU of
        // the children it has reaped, once their clients have gone.
        std::thread::sleep(Duration::from_millis(500));
        let per_100k = |cpu: f64| cpu / (per_target * 3) as f64 * 100_000.0;
        println!(
            "CPU per 100 000 calls at concurrency {concurrency}: crr-proxy {:.2} s, socat {:.2} s",
            per_100k(cpu_seconds(proxy.id(), false) - cpu_before[0]),
            per_100k(cpu_seconds(socat.id(), true) - cpu_before[1]),
        );
    }
    println!(
        "crr-proxy: RSS {:.1} MiB after {proxied} calls",
        rss_mib(proxy.id())
    );
    if let Some(python) = std::env::var_os("CRR_BENCH_PYTHON") {
        println!("# the same targets, one call at a time, from a Python grpcio client");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/grpc_client.py");
        let status = Command::new(python)
            .arg(script)
            .arg(calls.to_string())
            .arg(&some_container)
            .args(
                targets
                    .iter()
                    .map(|(name, endpoint)| format!("{name}={}", endpoint.path().display())),
            )
            .status()?;
        anyhow::ensure!(status.success(), "the grpcio client failed: {status}");
    }
    drop(proxy);
    runtime.block_on(runtime_down(calls.min(1000)))?;

    if crrs > 0 {
        println!("# agent (kruise mode)");
        runtime.block_on(agent(&ctrd, crrs))?;
    }
    support::remove_socket_dir(&proxy_socket);
    support::remove_socket_dir(&socat_socket);
    Ok(())
}

/// A runtime that is not there: how long a call takes to fail, through
/// crr-proxy (UNAVAILABLE, on kubelet's one connection), through socat and
/// directly (the dial fails). tests/containerd.rs and tests/passthrough.rs
/// only bound it at 5 s ("at once": no connect retries, no dial timeout);
/// the figure is here.
async fn runtime_down(calls: usize) -> anyhow::Result<()> {
    let gone = support::temp_socket("bench-gone");
    let proxy_socket = support::temp_socket("bench-down");
    let _proxy = Spawned::new(
        Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .arg("run")
            .args(["--listen", proxy_socket.to_str().unwrap_or_default()])
            .args(["--runtime-endpoint", &format!("unix://{}", gone.display())])
            .args(["--metrics-addr", "off"]),
    )?;
    let socat_socket = support::temp_socket("bench-down-socat");
    let _socat = Spawned::new(
        Command::new("socat")
            .arg(format!("UNIX-LISTEN:{},fork", socat_socket.display()))
            .arg(format!("UNIX-CONNECT:{}", gone.display())),
    )?;
    support::wait_for_path(&proxy_socket);
    support::wait_for_path(&socat_socket);
    println!("# the runtime down: {calls} Version calls per target, each until it fails");
    for (name, endpoint) in [
        ("direct", Endpoint::from_path(&gone)),
        ("crr-proxy", Endpoint::from_path(&proxy_socket)),
        ("socat", Endpoint::from_path(&socat_socket)),
    ] {
        let mut client = support::client(&endpoint);
        let mut took = Vec::with_capacity(calls);
        let mut codes = std::collections::BTreeSet::new();
        for _ in 0..calls {
            let start = Instant::now();
            let answer = client.version(VersionRequest::default()).await;
            took.push(start.elapsed());
            match answer {
                Ok(_) => anyhow::bail!("{name}: Version answered with no runtime"),
                Err(status) => codes.insert(format!("{:?}", status.code())),
            };
        }
        took.sort();
        let p = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
        println!(
            "{name:>9}: p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}  codes {codes:?}",
            p(0.50),
            p(0.99),
            took[took.len() - 1]
        );
    }
    support::remove_socket_dir(&gone);
    support::remove_socket_dir(&proxy_socket);
    support::remove_socket_dir(&socat_socket);
    Ok(())
}

/// One pod of `CONTAINERS` sleeping containers; returns one container's ID.
async fn setup_pod(ctrd: &Containerd) -> anyhow::Result<String> {
    let mut direct = support::client(&ctrd.endpoint());
    let (pod_id, pod) = support::pods::run_pod(&mut direct, "bench", &ctrd.scratch("logs")).await?;
    let mut first = String::new();
    for i in 0..CONTAINERS {
        let id = support::pods::start_container(
            &mut direct,
            &pod_id,
            &pod,
            &format!("c{i}"),
            &["sleep", "86400"],
        )
        .await?;
        if first.is_empty() {
            first = id;
        }
    }
    Ok(first)
}

#[derive(Clone, Debug)]
enum Method {
    Version,
    ContainerStatus(String),
    ListContainers,
}

impl Method {
    fn name(&self) -> &'static str {
        match self {
            Method::Version => "Version",
            Method::ContainerStatus(_) => "ContainerStatus",
            Method::ListContainers => "ListContainers",
        }
    }

    async fn call(&self, client: &mut RuntimeClient) {
        match self {
            Method::Version => {
                client.version(VersionRequest::default()).await.unwrap();
            }
            Method::ContainerStatus(id) => {
                let status = client
                    .container_status(ContainerStatusRequest {
                        container_id: id.clone(),
                        verbose: false,
                    })
                    .await
                    .unwrap();
                assert!(status.into_inner().status.is_some());
            }
            Method::ListContainers => {
                let listed = client
                    .list_containers(ListContainersRequest::default())
                    .await
                    .unwrap();
                assert_eq!(listed.into_inner().containers.len(), CONTAINERS);
            }
        }
    }
}

/// Per target: every call's latency, and the wall time all calls took.
struct Measured {
    latencies: Vec<Duration>,
    wall: Duration,
}

async fn measure(
    targets: &[(&str, Endpoint)],
    method: &Method,
    concurrency: usize,
    per_target: usize,
) -> Vec<Measured> {
    // One client (one HTTP/2 connection) per target, as kubelet has.
    let clients: Vec<RuntimeClient> = targets.iter().map(|(_, e)| support::client(e)).collect();
    let mut results: Vec<Measured> = targets
        .iter()
        .map(|_| Measured {
            latencies: Vec::with_capacity(per_target),
            wall: Duration::ZERO,
        })
        .collect();
    for client in &clients {
        for _ in 0..concurrency.min(8) {
            method.call(&mut client.clone()).await; // connect and warm up
        }
    }
    let per_round = per_target / ROUNDS;
    for _ in 0..ROUNDS {
        for (client, result) in clients.iter().zip(results.iter_mut()) {
            let started = Instant::now();
            let workers: Vec<_> = (0..concurrency)
                .map(|w| {
                    let mut client = client.clone();
                    let method = method.clone();
                    let share = per_round / concurrency + usize::from(w < per_round % concurrency);
                    tokio::spawn(async move {
                        let mut latencies = Vec::with_capacity(share);
                        for _ in 0..share {
                            let call = Instant::now();
                            method.call(&mut client).await;
                            latencies.push(call.elapsed());
                        }
                        latencies
                    })
                })
                .collect();
            for worker in workers {
                result.latencies.extend(worker.await.unwrap());
            }
            result.wall += started.elapsed();
        }
    }
    results
}

fn report(method: &Method, results: &[Measured]) {
    let mut rows = Vec::new();
    for (name, result) in ["direct", "crr-proxy", "socat"].iter().zip(results) {
        let mut sorted = result.latencies.clone();
        sorted.sort();
        let p = |q: f64| sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)];
        let rate = sorted.len() as f64 / result.wall.as_secs_f64();
        println!(
            "{:<16}{name:>10}: p50 {:8.1} µs  p99 {:8.1} µs  {:8.0} calls/s",
            method.name(),
            p(0.50).as_secs_f64() * 1e6,
            p(0.99).as_secs_f64() * 1e6,
            rate
        );
        rows.push((p(0.50).as_secs_f64(), rate));
    }
    let [
        (direct, direct_rate),
        (proxy, proxy_rate),
        (socat, socat_rate),
    ] = [rows[0], rows[1], rows[2]];
    println!(
        "{:<16}     ratio: p50 crr-proxy/direct {:.3}, crr-proxy/socat {:.3} (socat/direct {:.3}); \
         added p50 crr-proxy {:+.1} µs, socat {:+.1} µs; throughput crr-proxy/direct {:.3}, socat/direct {:.3}",
        method.name(),
        proxy / direct,
        proxy / socat,
        socat / direct,
        (proxy - direct) * 1e6,
        (socat - direct) * 1e6,
        proxy_rate / direct_rate,
        socat_rate / direct_rate,
    );
}

/// The agent's reaction time over `crrs` CRRs, then its RSS with
/// `CACHED_CRRS` CRRs cached.
async fn agent(ctrd: &Containerd, crrs: usize) -> anyhow::Result<()> {
    let api = FakeApiServer::start().await;
    let kubelet = Kubelet::start(
        &api,
        support::client(&ctrd.endpoint()),
        "bench-node",
        ctrd.scratch("kubelet"),
    )
    .await;
    // Each Pod is recreated again and again, which kubelet's CrashLoopBackOff
    // would hold up to 5 min; this measures the agent, so restarts are at once.
    kubelet.set_crash_loop_backoff(CrashLoopBackOff {
        initial: Duration::ZERO,
        max: Duration::ZERO,
    });
    let manager = KruiseManager::start(&api);
    let socket = support::temp_socket("bench-agent");
    let kubeconfig = socket.with_file_name("kubeconfig");
    support::write_kubeconfig(&kubeconfig, &api.url);
    let (agent, metrics) = spawn_agent(ctrd, &socket, &kubeconfig)?;
    // A container that exits at once on SIGTERM: `wait` is interrupted.
    let mut app = ContainerSpec::graceful("app");
    app.command = ["sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"]
        .map(String::from)
        .to_vec();
    for i in 0..PODS {
        kubelet
            .run_pod(PodSpec::new(&format!("p{i}"), vec![app.clone()]))
            .await;
    }
    wait_ready(&metrics).await;

    let mut timed = 0;
    for pace in [Pace::BackToBack, Pace::Quiet] {
        timed += time_crrs(ctrd, &api, &kubelet, crrs, pace, timed).await?;
    }
    println!(
        "crr-proxy with the agent: RSS {:.1} MiB after {} CRRs",
        rss_mib(agent.id()),
        timed
    );
    drop(agent);
    // From here on nobody completes or releases CRRs.
    drop(manager);

    // 1 000 CRRs of this node in the cache: completed, still labelled
    // active (as kruise-manager leaves them until it catches up), each
    // with two containers and their states.
    for i in 0..CACHED_CRRS {
        let mut crr = json!({"metadata": {"name": format!("cached-{i}"), "labels": {
                "crr.apps.kruise.io/node-name": "bench-node", "crr.apps.kruise.io/active": "true",
                "crr.apps.kruise.io/pod-uid": format!("uid-{i}")}},
            "spec": {"podName": format!("gone-{i}"), "containers": [
                {"name": "app", "statusContext": {"containerID": format!("containerd://{i:064x}"), "restartCount": 1}},
                {"name": "sidecar", "statusContext": {"containerID": format!("containerd://{:064x}", i + 1), "restartCount": 0}}],
                "strategy": {"failurePolicy": "Fail", "minStartedSeconds": 10}, "ttlSecondsAfterFinished": 3600}});
        let created = api
            .create_unchecked(Resource::Crr, NAMESPACE, crr.take())
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let mut with_status = created.clone();
        with_status["status"] = json!({"phase": "Completed", "completionTime": support::apiserver::now(),
            "containerRecreateStates": [{"name": "app", "phase": "Succeeded", "isKilled": true}, {"name": "sidecar", "phase": "Succeeded", "isKilled": true}]});
        api.update(
            Resource::Crr,
            NAMESPACE,
            &format!("cached-{i}"),
            with_status,
            true,
        )
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    let socket = support::temp_socket("bench-cache");
    let (cached, metrics) = spawn_agent(ctrd, &socket, &kubeconfig)?;
    wait_ready(&metrics).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "crr-proxy with the agent and {} CRRs cached: RSS {:.1} MiB",
        api.list(
            Resource::Crr,
            Some(NAMESPACE),
            &support::apiserver::Selector::labels("crr.apps.kruise.io/active=true")
        )
        .len(),
        rss_mib(cached.id())
    );
    drop(cached);
    drop(kubelet);
    support::remove_socket_dir(&socket);
    Ok(())
}

/// `crr-proxy restart deployment/web` over `pods` Pods that exist only in
/// the fake API server, completed at once by `PaperNode`: the command's
/// own cost (API requests per Pod, peak RSS, time per Pod) without any
/// container's.
async fn restart_at_scale(pods: usize) -> anyhow::Result<()> {
    let api = FakeApiServer::start().await;
    support::workloads::on_paper(&api, "web", pods);
    let _node = support::workloads::PaperNode::start(&api);
    let socket = support::temp_socket("bench-restart");
    let kubeconfig = socket.with_file_name("kubeconfig");
    support::write_kubeconfig(&kubeconfig, &api.url);
    let out = std::fs::File::create(socket.with_file_name("restart.out"))?;
    let before = api.requests();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
        .args(["restart", "deployment/web", "-c", "app", "-n", NAMESPACE])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("CRR_PROXY_LOG")
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    // VmHWM only grows: the last reading before the exit is the peak, to
    // within one poll.
    let mut peak = 0.0f64;
    let status = loop {
        peak = peak.max(status_mib(child.id(), "VmHWM:"));
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    if !status.success() {
        let said =
            std::fs::read_to_string(socket.with_file_name("restart.out")).unwrap_or_default();
        anyhow::bail!("restart over {pods} Pods: {status}\n{said}");
    }
    let after = api.requests();
    let count = |method: &str| {
        after.get(method).copied().unwrap_or_default()
            - before.get(method).copied().unwrap_or_default()
    };
    let total = after.values().sum::<u64>() - before.values().sum::<u64>();
    let crrs = api
        .list(Resource::Crr, Some(NAMESPACE), &Default::default())
        .len();
    anyhow::ensure!(crrs == pods, "{crrs} CRRs for {pods} Pods");
    println!(
        "{pods:>5} Pods: {took:.1?} ({:.1} ms per Pod); API requests {total} ({:.2} per Pod: GET {}, POST {}, WATCH {}); peak RSS {peak:.1} MiB",
        took.as_secs_f64() * 1000.0 / pods as f64,
        total as f64 / pods as f64,
        count("GET"),
        count("POST"),
        count("WATCH"),
    );
    support::remove_socket_dir(&socket);
    Ok(())
}

/// crr-proxy `--agent kruise` on `socket`; returns it and its metrics address.
fn spawn_agent(
    ctrd: &Containerd,
    socket: &Path,
    kubeconfig: &Path,
) -> std::io::Result<(Spawned, String)> {
    let metrics = format!("127.0.0.1:{}", free_port());
    let agent = Spawned::new(
        Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .arg("run")
            .args(["--listen", &socket.display().to_string()])
            .args(["--runtime-endpoint", &ctrd.endpoint().to_string()])
            .args(["--agent", "kruise", "--node-name", "bench-node"])
            .args(["--kubeconfig", &kubeconfig.display().to_string()])
            .args(["--metrics-addr", &metrics])
            .args([
                "--state-dir",
                &socket.with_file_name("state").display().to_string(),
            ]),
    )?;
    Ok((agent, metrics))
}

fn report_agent(what: &str, latencies: &mut [Duration]) {
    latencies.sort();
    let p = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "{what} (no preStop), {} CRRs one at a time over {PODS} Pods: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        p(0.50).as_secs_f64() * 1e3,
        p(0.99).as_secs_f64() * 1e3,
        p(1.0).as_secs_f64() * 1e3,
    );
}

/// When the next CRR is created.
#[derive(Clone, Copy, PartialEq)]
enum Pace {
    /// Once the last CRR's container has exited: its completion and the
    /// container's restart (runc, on these 2 cores) overlap the next CRR.
    BackToBack,
    /// Once the last CRR has completed, its Pod is Ready again and 100 ms
    /// have passed: the agent's reaction on a node doing nothing else.
    Quiet,
}

/// Times `crrs` CRRs created one at a time, round-robin over the Pods, and
/// reports them; their names start at `first`. Returns how many it timed.
async fn time_crrs(
    ctrd: &Containerd,
    api: &FakeApiServer,
    kubelet: &Kubelet,
    crrs: usize,
    pace: Pace,
    first: usize,
) -> anyhow::Result<usize> {
    let mut latencies = Vec::new();
    let mut direct = support::client(&ctrd.endpoint());
    // A Pod gets its next CRR once its last one has completed.
    let mut last: Vec<Option<String>> = vec![None; PODS];
    let each = std::env::var_os("CRR_BENCH_EACH").is_some();
    let mut to_stop = Vec::new();
    for n in first..first + crrs {
        let i = n % PODS;
        if let Some(previous) = last[i].take() {
            settled(api, kubelet, &previous, i).await?;
        }
        let name = format!("crr-{n}");
        let at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as i64;
        let crr = api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": name},
                    "spec": {"podName": format!("p{i}"), "containers": [{"name": "app"}]}}),
            )
            .map_err(|e| anyhow::anyhow!("create {name}: {e:?}"))?;
        let old = crr["spec"]["containers"][0]["statusContext"]["containerID"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches("containerd://")
            .to_owned();
        let finished_at =
            support::containerd::exited_at(&mut direct, &old, Duration::from_secs(40)).await?;
        latencies.push(Duration::from_nanos((finished_at - at).max(0) as u64));
        let stopped = stop_received(&ctrd.log_path(), &old)
            .ok_or_else(|| anyhow::anyhow!("{name}: no StopContainer in containerd's log"))?;
        to_stop.push(Duration::from_nanos((stopped - at).max(0) as u64));
        if each {
            // Creation time (ns since the epoch) beside the agent's log
            // lines, to split a CRR's time into its steps.
            println!(
                "each {name} created {at} stopped {stopped} exited {finished_at} containers {}",
                list_count(&mut direct, &crr).await?
            );
        }
        if pace == Pace::Quiet {
            settled(api, kubelet, &name, i).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        last[i] = Some(name);
    }
    // Every CRR ends and every Pod is Ready before the next run begins.
    for (i, previous) in last.iter().enumerate() {
        if let Some(previous) = previous {
            settled(api, kubelet, previous, i).await?;
        }
    }
    let pace = match pace {
        Pace::BackToBack => "back to back",
        Pace::Quiet => "on a quiet node",
    };
    report_agent(
        &format!("CRR created -> StopContainer received by containerd, {pace}"),
        &mut to_stop,
    );
    report_agent(
        &format!("CRR created -> container exited, {pace}"),
        &mut latencies,
    );
    Ok(crrs)
}

/// Waits until CRR `name` has completed without a message and Pod `p<pod>`
/// is Ready again.
async fn settled(
    api: &FakeApiServer,
    kubelet: &Kubelet,
    name: &str,
    pod: usize,
) -> anyhow::Result<()> {
    let done = wait_for(Duration::from_secs(60), || {
        api.get(Resource::Crr, NAMESPACE, name)
            .filter(|c| c["status"]["phase"] == "Completed")
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("CRR {name} did not complete"))?;
    let message = done["status"]["message"].as_str().unwrap_or_default();
    anyhow::ensure!(message.is_empty(), "{name}: {}", done["status"]);
    kubelet.wait_ready(&format!("p{pod}")).await;
    Ok(())
}

/// How many containers (of every state) the runtime holds for `crr`'s Pod.
async fn list_count(direct: &mut RuntimeClient, crr: &serde_json::Value) -> anyhow::Result<usize> {
    let uid = crr["metadata"]["labels"]["crr.apps.kruise.io/pod-uid"]
        .as_str()
        .unwrap_or_default();
    let request = ListContainersRequest {
        filter: Some(crr_proxy::cri::v1::ContainerFilter {
            label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
            ..Default::default()
        }),
    };
    Ok(direct
        .list_containers(request)
        .await?
        .into_inner()
        .containers
        .len())
}

/// When containerd logged receiving StopContainer for `id`, in ns since the epoch.
fn stop_received(log: &Path, id: &str) -> Option<i64> {
    let text = std::fs::read_to_string(log).ok()?;
    let needle = format!("StopContainer for \\\"{id}\\\" with timeout");
    let line = text.lines().find(|l| l.contains(&needle))?;
    let time = line.strip_prefix("time=\"")?.split('"').next()?;
    let at: k8s_openapi::jiff::Timestamp = time.parse().ok()?;
    i64::try_from(at.as_nanosecond()).ok()
}

async fn wait_ready(addr: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for _ in 0..200 {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
            let request = "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            let mut answer = String::new();
            if stream.write_all(request.as_bytes()).await.is_ok()
                && stream.read_to_string(&mut answer).await.is_ok()
                && answer.starts_with("HTTP/1.1 200")
            {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("crr-proxy at {addr} never became ready");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(10222)
}

/// A child process killed when dropped.
struct Spawned(Child);

impl Spawned {
    /// Quiet, unless `CRR_BENCH_LOG` names a file for the children's debug logs.
    fn new(command: &mut Command) -> std::io::Result<Self> {
        let log = match std::env::var_os("CRR_BENCH_LOG") {
            Some(path) => {
                command.env("CRR_PROXY_LOG", "crr_proxy=debug");
                Stdio::from(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)?,
                )
            }
            None => {
                command.env("CRR_PROXY_LOG", "warn");
                Stdio::null()
            }
        };
        command.stdin(Stdio::null()).stderr(log).spawn().map(Self)
    }

    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
