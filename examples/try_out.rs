//! Try crr-proxy out on one machine (scripts/try.sh): a private containerd,
//! the crr-proxy binary in front of it with `--agent standalone`, and an
//! emulated cluster around them (the test support's API server, kubelet and
//! disruption controller). It restarts a container of a demo Pod with
//! `crr-proxy restart`, then a Deployment in waves, prints what happened,
//! and keeps everything up until Ctrl-C.
// The emulated cluster is the test support, which fails loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;

use anyhow::Context;
use support::demo::Demo;

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::var_os("CRR_PROXY_TRY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/crr-proxy-try"));
    // target/release/examples/try_out -> target/release/crr-proxy
    let bin = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|release| release.join("crr-proxy"))
        .context("where is the crr-proxy binary?")?;
    anyhow::ensure!(
        bin.is_file(),
        "build it first: cargo build --release ({} missing)",
        bin.display()
    );
    let demo = Demo::start(&bin, &dir).await?;
    println!("Real on this machine:");
    println!("  containerd + runc (private)   {}", demo.ctrd_endpoint);
    println!(
        "  crr-proxy run --agent standalone, serving CRI on unix://{}",
        demo.socket.display()
    );
    println!("    (its log: {})", demo.log.display());
    println!("Emulated (crr-proxy's test support, not a real Kubernetes):");
    println!(
        "  API server {}  with kubelet (CRI through crr-proxy), disruption controller",
        demo.api_url
    );
    println!(
        "  kubeconfig {}  (user operator: exactly deploy/base/rbac-restart.yaml)",
        demo.kubeconfig.display()
    );
    demo.show(&mut std::io::stdout()).await?;
    println!("\nEverything stays up until Ctrl-C. Try, for example:");
    println!("  export KUBECONFIG={}", demo.kubeconfig.display());
    println!("  {} restart demo -c sidecar --wait", bin.display());
    println!(
        "  {} restart deployment/web -c app --max-unavailable 50%",
        bin.display()
    );
    println!("(linked onto PATH as kubectl-crr, the same binary is `kubectl crr restart`)");
    tokio::signal::ctrl_c().await?;
    tokio::task::spawn_blocking(move || drop(demo)).await?;
    Ok(())
}
