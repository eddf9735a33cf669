//! crr-proxy: a transparent CRI proxy between kubelet and the container
//! runtime, and (in later versions) a node agent for OpenKruise's
//! ContainerRecreateRequest.
//!
//! - [`proxy`]: the raw HTTP/2 passthrough on a unix socket.
//! - [`cri`]: crr-proxy's own CRI client, generated from `proto/`.
//! - [`kill`]: stops a container as kubelet does (preStop, then StopContainer).
//! - [`crr`]: the ContainerRecreateRequest API and the agent's decision rules.
//! - [`config`]: the command line.
//! - [`telemetry`]: logging setup.

pub mod agent;
pub mod config;
pub mod cri;
pub mod crr;
pub mod kill;
pub mod proxy;
pub mod telemetry;

use std::future::Future;

use proxy::{ListenError, Listener, Proxy};

/// Runs the daemon until `shutdown` resolves.
pub async fn run(
    config: config::RunConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ListenError> {
    let listener = Listener::open(&config.listen)?;
    tracing::info!(
        runtime = %config.routes.runtime,
        image = %config.routes.image.as_ref().unwrap_or(&config.routes.runtime),
        "forwarding CRI calls"
    );
    let (listener, _socket_file) = listener.into_parts();
    Proxy::new(config.routes).serve(listener, shutdown).await;
    Ok(())
}
