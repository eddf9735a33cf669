//! crr-proxy's agent beside the peer operators run today, OpenKruise's
//! kruise-daemon, on one real cluster in one run (`scripts/bench.sh`, or
//! `cargo bench --bench beside_kruise` as root with `CRR_TEST_KUBE` and
//! `CRR_TEST_KRUISE` set, as scripts/test.sh sets them).
//!
//! Real parts: etcd, kube-apiserver, kube-controller-manager, two kubelets
//! (v1.37.2), kruise-manager and kruise-daemon (v1.9.0), containerd, runc.
//! node-a runs kruise-daemon as a Pod (crr-proxy there relays only, agent
//! off); node-b runs crr-proxy's kruise agent. Each node has the same Pods
//! (one container, no probes, ends at once on SIGTERM); each Pod gets one
//! CRR, so that kubelet's restart back-off (which grows with each restart
//! of a container) never enters a figure. The CRRs alternate between the
//! nodes, one at a time, so drift of the machine falls on both alike.
//!
//! For each daemon: the time from creating a CRR to its container's exit
//! (`finished_at`, as containerd records it: the daemon's own reaction,
//! preStop-less), to the container running again (the Pod's status, as a
//! watch sees it: kubelet's part, whose PLEG looks once a second; each CRR
//! waits a random part of a second first, so that no node's PLEG phase
//! locks onto the pace) and to the CRR `Completed` (p50, p99); the API requests it made per CRR, by verb and resource, and
//! the watch events it was sent per CRR, counted by a front proxy before
//! the API server (support::front: each daemon reaches the API server
//! through one, as itself); its CPU seconds per CRR and its RSS. crr-proxy's
//! CPU includes relaying kubelet's CRI calls: node-a's crr-proxy, which only
//! relays, gives that share.
//!
//! `CRR_BENCH_SIDE` sets the CRRs per daemon (default 100).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use crr_proxy::crr::{ContainerRecreateRequest, Phase};
use crr_proxy::proxy::Endpoint;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use support::cluster::{Cluster, client_for};
use support::front::{FrontProxy, Tally};
use support::kruise::{KruiseManager, daemon_pod};
use support::node::{Agent, Node, idle_pod};
use support::procfs::{cpu_seconds, rss_mib, status_mib};

const NAMESPACE: &str = "bench";
const KRUISE_NODE: &str = "node-a";
const PROXY_NODE: &str = "node-b";

fn main() -> Result<()> {
    let crrs: usize = std::env::var("CRR_BENCH_SIDE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let crr_proxy = Path::new(env!("CARGO_BIN_EXE_crr-proxy"));
    let mut cluster = Cluster::start()?;
    let mut manager = KruiseManager::start(&mut cluster)?;
    cluster.install("kruise")?;
    cluster.namespace(NAMESPACE)?;
    let kruise_front = FrontProxy::start(&cluster, "kruise-daemon", &["system:masters"])?;
    let proxy_front = FrontProxy::start(
        &cluster,
        &format!("crr-proxy:node:{PROXY_NODE}"),
        &["crr-proxy:nodes"],
    )?;
    let relay_only = Node::start(&mut cluster, KRUISE_NODE, crr_proxy, Agent::Off)?;
    let mut agent = Node::start(&mut cluster, PROXY_NODE, crr_proxy, Agent::Kruise)?;
    agent.agent_through(&proxy_front.url)?;
    let daemon = daemon_pod(&mut cluster, &relay_only, Some(&kruise_front.url))?;
    cluster.apply(&daemon.to_string())?;
    let daemon_name = daemon["metadata"]["name"].as_str().unwrap_or_default();
    cluster.wait("kruise-daemon to be Ready", Duration::from_secs(120), |c| {
        let pod = c.get(&["pod", daemon_name, "-n", "kruise-system"])?;
        Ok(ready(&pod).then_some(()))
    })?;

    eprintln!("starting {crrs} Pods on each node");
    let items: Vec<_> = (0..crrs)
        .flat_map(|i| {
            [KRUISE_NODE, PROXY_NODE].map(|node| idle_pod(NAMESPACE, &format!("{node}-{i}"), node))
        })
        .collect();
    cluster.kubectl_in(
        &["apply", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
    )?;
    cluster.wait("every Pod to run", Duration::from_secs(600), |c| {
        let pods = c.get(&["pods", "-n", NAMESPACE])?;
        let running = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| ready(p))
            .count();
        Ok((running == 2 * crrs).then_some(()))
    })?;
    // Let the start-up settle before counting.
    std::thread::sleep(Duration::from_secs(10));

    let pids = [
        (
            "kruise-daemon",
            support::procfs::find("kruise-daemon").context("kruise-daemon's process")?,
        ),
        (
            "crr-proxy (agent)",
            agent.proxy_pid().context("crr-proxy's process")?,
        ),
        (
            "crr-proxy (relay only)",
            relay_only.proxy_pid().context("crr-proxy's process")?,
        ),
    ];
    let cpu_before: Vec<f64> = pids
        .iter()
        .map(|(_, pid)| cpu_seconds(*pid, false))
        .collect();
    let tallies_before = [kruise_front.tally(), proxy_front.tally()];

    let runtime = tokio::runtime::Runtime::new()?;
    let runtimes = HashMap::from([
        (KRUISE_NODE, relay_only.containerd.endpoint()),
        (PROXY_NODE, agent.containerd.endpoint()),
    ]);
    let times = runtime.block_on(run(cluster.admin_kubeconfig(), &runtimes, crrs))?;
    manager.check()?;

    let tallies = [
        kruise_front.tally().since(&tallies_before[0]),
        proxy_front.tally().since(&tallies_before[1]),
    ];
    println!("\n{crrs} CRRs per daemon, one at a time, alternating between the nodes");
    println!(
        "| daemon | to the container's exit p50 / p99 | to running again p50 / p99 | to Completed p50 / p99 |"
    );
    println!("| --- | --- | --- | --- |");
    for (name, node) in [("kruise-daemon", KRUISE_NODE), ("crr-proxy", PROXY_NODE)] {
        let column = |pick: fn(&Times) -> Duration| {
            let mut all: Vec<Duration> = times[node].iter().map(pick).collect();
            percentiles(&mut all)
        };
        println!(
            "| {name} | {} | {} | {} |",
            column(|t| t.exited),
            column(|t| t.running_again),
            column(|t| t.completed)
        );
    }
    println!("\n| daemon | API requests per CRR | watch events per CRR |");
    println!("| --- | --- | --- |");
    for (name, tally) in ["kruise-daemon", "crr-proxy"].iter().zip(&tallies) {
        println!(
            "| {name} | {:.2} | {:.2} |",
            tally.total_requests() as f64 / crrs as f64,
            tally.watch_events as f64 / crrs as f64
        );
    }
    for (name, tally) in ["kruise-daemon", "crr-proxy"].iter().zip(&tallies) {
        println!("{name}'s requests: {}", by_request(tally, crrs));
    }
    println!("\n| process | CPU ms per CRR | RSS MiB (peak) |");
    println!("| --- | --- | --- |");
    for ((name, pid), before) in pids.iter().zip(cpu_before) {
        println!(
            "| {name} | {:.1} | {:.1} ({:.1}) |",
            (cpu_seconds(*pid, false) - before) * 1000.0 / crrs as f64,
            rss_mib(*pid),
            status_mib(*pid, "VmHWM:")
        );
    }
    drop(agent);
    drop(relay_only);
    Ok(())
}

fn ready(pod: &serde_json::Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|all| {
        all.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// What the watches saw first: a Pod's container running again, a CRR
/// Completed.
#[derive(Default)]
struct Seen {
    running_again: HashMap<String, Instant>,
    completed: HashMap<String, Instant>,
}

/// One CRR's times from its creation.
struct Times {
    exited: Duration,
    running_again: Duration,
    completed: Duration,
}

/// Creates the CRRs, one at a time, alternating between the nodes; per
/// node, each CRR's times. `runtimes` are the nodes' containerd sockets.
async fn run(
    admin: &Path,
    runtimes: &HashMap<&'static str, Endpoint>,
    crrs: usize,
) -> Result<HashMap<&'static str, Vec<Times>>> {
    let client = client_for(admin).await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let requests: Api<ContainerRecreateRequest> = Api::namespaced(client, NAMESPACE);
    let pod_watch = {
        let seen = seen.clone();
        watcher(pods, watcher::Config::default())
            .applied_objects()
            .for_each(move |pod| {
                if let Ok(pod) = pod {
                    let restarted = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.container_statuses.as_ref())
                        .and_then(|all| all.first())
                        .is_some_and(|c| {
                            c.restart_count >= 1
                                && c.state.as_ref().is_some_and(|s| s.running.is_some())
                        });
                    if restarted {
                        let name = pod.metadata.name.unwrap_or_default();
                        lock(&seen)
                            .running_again
                            .entry(name)
                            .or_insert_with(Instant::now);
                    }
                }
                async {}
            })
    };
    let crr_watch = {
        let seen = seen.clone();
        watcher(requests.clone(), watcher::Config::default())
            .applied_objects()
            .for_each(move |crr| {
                if let Ok(crr) = crr
                    && crr
                        .status
                        .as_ref()
                        .is_some_and(|s| s.phase == Phase::Completed)
                {
                    let name = crr.metadata.name.unwrap_or_default();
                    lock(&seen)
                        .completed
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
                async {}
            })
    };
    tokio::spawn(pod_watch);
    tokio::spawn(crr_watch);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut times: HashMap<&'static str, Vec<Times>> = HashMap::new();
    for i in 0..crrs {
        for node in [KRUISE_NODE, PROXY_NODE] {
            let pod = format!("{node}-{i}");
            let crr: ContainerRecreateRequest = serde_json::from_value(json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                "metadata": {"name": pod, "namespace": NAMESPACE},
                "spec": {"podName": pod, "containers": [{"name": "app"}]}
            }))?;
            tokio::time::sleep(jitter()).await;
            let created = Instant::now();
            let wall = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as i64;
            let crr = requests.create(&PostParams::default(), &crr).await?;
            // kruise's webhook names the container this CRR stops.
            let old = crr.spec.containers[0]
                .status_context
                .as_ref()
                .map(|c| {
                    c.container_id
                        .trim_start_matches("containerd://")
                        .to_owned()
                })
                .context("the webhook gave no statusContext")?;
            // Asked at once: kubelet may remove the stopped container soon
            // after it has started the new one.
            let mut runtime = support::client(&runtimes[node]);
            let finished_at =
                support::containerd::exited_at(&mut runtime, &old, Duration::from_secs(120))
                    .await?;
            let (running, completed) = loop {
                {
                    let seen = lock(&seen);
                    if let (Some(r), Some(c)) =
                        (seen.running_again.get(&pod), seen.completed.get(&pod))
                    {
                        break (*r - created, *c - created);
                    }
                }
                if created.elapsed() > Duration::from_secs(120) {
                    bail!("CRR {pod} did not complete with its container running again");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            times.entry(node).or_default().push(Times {
                exited: Duration::from_nanos((finished_at - wall).max(0) as u64),
                running_again: running,
                completed,
            });
        }
        if (i + 1) % 10 == 0 {
            eprintln!("{} CRRs per daemon done", i + 1);
        }
    }
    Ok(times)
}

/// Up to a second, from the clock's nanoseconds.
fn jitter() -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(u64::from(nanos % 1000))
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|p| p.into_inner())
}

/// `p50 / p99` in milliseconds.
fn percentiles(values: &mut [Duration]) -> String {
    values.sort();
    let at = |q: f64| {
        let i = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1;
        values[i].as_secs_f64() * 1000.0
    };
    format!("{:.0} / {:.0} ms", at(0.50), at(0.99))
}

/// Each kind of request per CRR, the most frequent first.
fn by_request(tally: &Tally, crrs: usize) -> String {
    let mut all: Vec<_> = tally.requests.iter().collect();
    all.sort_by(|a, b| b.1.cmp(a.1));
    all.iter()
        .map(|(what, n)| format!("{what} {:.2}", **n as f64 / crrs as f64))
        .collect::<Vec<_>>()
        .join(", ")
}
