//! Latency of CRI calls direct to containerd vs through crr-proxy (and vs a
//! socat byte splice, the floor for any proxy, when socat is installed).
//!
//! `cargo bench --bench latency` starts its own private containerd (as root)
//! with one pod of 20 containers, runs the crr-proxy binary, and
//! interleaves rounds of each target so that machine drift cancels out.
//! `CRR_BENCH_CALLS` sets the calls per target and method (default 5000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crr_proxy::cri::RuntimeClient;
use crr_proxy::cri::v1::{ListContainersRequest, VersionRequest};
use crr_proxy::proxy::Endpoint;
use support::containerd::Containerd;

const ROUNDS: usize = 10;
const CONTAINERS: usize = 20;

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes --bench; nothing else to parse.
    let calls: usize = std::env::var("CRR_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let ctrd = Containerd::start()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut direct = support::client(&ctrd.endpoint());
        let (pod_id, pod) =
            support::pods::run_pod(&mut direct, "bench", &ctrd.scratch("logs")).await?;
        for i in 0..CONTAINERS {
            support::pods::start_container(
                &mut direct,
                &pod_id,
                &pod,
                &format!("c{i}"),
                &["sleep", "86400"],
            )
            .await?;
        }
        anyhow::Ok(())
    })?;

    let proxy_socket = support::temp_socket("bench-proxy");
    let mut proxy = Spawned(
        Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .arg("run")
            .arg("--listen")
            .arg(&proxy_socket)
            .arg("--runtime-endpoint")
            .arg(ctrd.endpoint().to_string())
            .env("CRR_PROXY_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()?,
    );
    let socat_socket = support::temp_socket("bench-socat");
    let socat = Command::new("socat")
        .arg(format!("UNIX-LISTEN:{},fork", socat_socket.display()))
        .arg(format!("UNIX-CONNECT:{}", ctrd.socket().display()))
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .map(Spawned);
    support::wait_for_path(&proxy_socket);
    if socat.is_some() {
        support::wait_for_path(&socat_socket);
    }

    let mut targets = vec![
        ("direct", ctrd.endpoint()),
        ("crr-proxy", Endpoint::from_path(&proxy_socket)),
    ];
    if socat.is_some() {
        targets.push(("socat", Endpoint::from_path(&socat_socket)));
    }
    println!("{calls} calls per target and method, {ROUNDS} interleaved rounds, concurrency 1");
    runtime.block_on(async {
        let mut clients: Vec<RuntimeClient> =
            targets.iter().map(|(_, e)| support::client(e)).collect();
        for method in [Method::Version, Method::ListContainers] {
            let mut samples = vec![Vec::with_capacity(calls); targets.len()];
            for client in &mut clients {
                method.call(client).await; // connect and warm up
            }
            for _ in 0..ROUNDS {
                for (client, samples) in clients.iter_mut().zip(samples.iter_mut()) {
                    for _ in 0..calls / ROUNDS {
                        let started = Instant::now();
                        method.call(client).await;
                        samples.push(started.elapsed());
                    }
                }
            }
            report(method, &targets, &mut samples);
        }
    });
    proxy.0.kill()?;
    let rss = rss_kib(proxy.0.id());
    if let Some(kib) = rss {
        println!(
            "crr-proxy RSS after the run: {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
    drop(socat);
    support::remove_socket_dir(&proxy_socket);
    support::remove_socket_dir(&socat_socket);
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Method {
    Version,
    ListContainers,
}

impl Method {
    async fn call(self, client: &mut RuntimeClient) {
        match self {
            Method::Version => {
                client.version(VersionRequest::default()).await.unwrap();
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

fn report(method: Method, targets: &[(&str, Endpoint)], samples: &mut [Vec<Duration>]) {
    let mut p50s = Vec::new();
    for ((name, _), samples) in targets.iter().zip(samples.iter_mut()) {
        samples.sort();
        let p = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        let (p50, p99) = (p(0.50), p(0.99));
        let total: Duration = samples.iter().sum();
        println!(
            "{method:?} {name:>10}: p50 {:7.1} µs  p99 {:7.1} µs  {:8.0} calls/s",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            samples.len() as f64 / total.as_secs_f64()
        );
        p50s.push((name, p50));
    }
    let direct = p50s[0].1.as_secs_f64();
    let proxy = p50s[1].1.as_secs_f64();
    print!(
        "{method:?} p50 ratio crr-proxy/direct {:.3}",
        proxy / direct
    );
    if let Some((_, socat)) = p50s.get(2) {
        let socat = socat.as_secs_f64();
        print!(
            ", socat/direct {:.3}; added latency crr-proxy {:.1} µs vs socat {:.1} µs",
            socat / direct,
            (proxy - direct) * 1e6,
            (socat - direct) * 1e6
        );
    }
    println!();
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A child process killed when dropped.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
