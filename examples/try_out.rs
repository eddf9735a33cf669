//! Try crr-proxy out without a node: a private containerd with a demo pod,
//! and crr-proxy serving in front of it until Ctrl-C (see scripts/try.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;

use anyhow::Context;
use crr_proxy::config::{LogFormat, RunConfig};
use crr_proxy::cri::v1::{ListContainersRequest, VersionRequest};
use crr_proxy::proxy::{Endpoint, Routes};
use support::containerd::Containerd;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    crr_proxy::telemetry::init(LogFormat::Text);
    let listen = std::env::var_os("CRR_PROXY_LISTEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/crr-proxy-try/crr-proxy.sock"));
    let ctrd = tokio::task::spawn_blocking(Containerd::start)
        .await?
        .context("start a private containerd")?;

    let config = RunConfig {
        listen: listen.clone(),
        routes: Routes {
            runtime: ctrd.endpoint(),
            image: None,
        },
        agent: None,
        metrics_addr: None,
        recreated_file: None,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(crr_proxy::run(config, async {
        let _ = stopped.await;
    }));
    while !listen.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // A demo pod, created through the proxy as kubelet would.
    let endpoint = Endpoint::from_path(&listen);
    let mut cri = support::client(&endpoint);
    let (pod_id, pod) = support::pods::run_pod(&mut cri, "try-out", &ctrd.scratch("logs")).await?;
    support::pods::start_container(&mut cri, &pod_id, &pod, "app", &["sleep", "86400"]).await?;
    let version = cri.version(VersionRequest::default()).await?.into_inner();
    let containers = cri
        .list_containers(ListContainersRequest::default())
        .await?
        .into_inner();

    println!();
    println!("containerd (private):  {}", ctrd.endpoint());
    println!("crr-proxy serving:     {endpoint}");
    println!(
        "through the proxy:     Version -> {} {} (CRI {}), {} container(s) in pod try-out",
        version.runtime_name,
        version.runtime_version,
        version.runtime_api_version,
        containers.containers.len()
    );
    println!("Point a CRI client at {endpoint}. Ctrl-C stops crr-proxy and containerd.");

    tokio::signal::ctrl_c().await?;
    let _ = stop.send(());
    proxy.await??;
    tokio::task::spawn_blocking(move || drop(ctrd)).await?;
    Ok(())
}
