//! The local HTTP endpoint (`--metrics-addr`): `/metrics` in Prometheus
//! text format, `/healthz` (the process serves: it answers from the
//! proxy's own runtime, so a wedged proxy fails it) and `/readyz` (the
//! runtime socket accepts connections, and the agent's CRR watches have
//! synced when an agent runs).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::cri::Endpoint;
use crate::metrics::Metrics;
use crate::notify;
use crate::telemetry::Chain;

#[derive(Debug, thiserror::Error)]
#[error("bind {addr}")]
pub struct AdminError {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// How often an address that could not be bound is tried again.
const BIND_RETRY: Duration = Duration::from_secs(2);

/// Serves the probes on `addr` in the background, as [`serve`] does. An
/// address that cannot be bound (another program holds it, or a crr-proxy
/// that has not yet gone) does not hold up kubelet's path: the error is
/// logged, systemd's status line (`systemctl status crr-proxy`) says what
/// is not served and why, and the address is tried again until it binds.
pub async fn spawn(
    addr: SocketAddr,
    ready: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    runtime: Endpoint,
) {
    let serving = format!("STATUS=serving CRI calls; /metrics, /healthz and /readyz on {addr}");
    let bind = move || serve(addr, ready.clone(), Arc::clone(&metrics), runtime.clone());
    let Err(error) = bind().await else {
        status(&serving);
        return;
    };
    error!(error = %Chain(&error), "serving without /metrics, /healthz and /readyz until the address is free");
    status(&format!(
        "STATUS=degraded: /metrics, /healthz and /readyz not served: {}; retrying every {} s",
        Chain(&error),
        BIND_RETRY.as_secs()
    ));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(BIND_RETRY).await;
            if bind().await.is_ok() {
                status(&serving);
                return;
            }
        }
    });
}

fn status(state: &str) {
    if let Err(error) = notify::notify(state) {
        warn!(%error, "could not notify systemd");
    }
}

/// Binds `addr` and serves the probes in the background. `runtime` is the
/// endpoint whose reachability /readyz reports.
pub async fn serve(
    addr: SocketAddr,
    ready: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    runtime: Endpoint,
) -> Result<(), AdminError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError { addr, source })?;
    info!(%addr, "serving /metrics, /healthz and /readyz");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ready = ready.clone();
            let metrics = Arc::clone(&metrics);
            let runtime = runtime.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let synced = *ready.borrow();
                    let metrics = Arc::clone(&metrics);
                    let runtime = runtime.clone();
                    async move {
                        let response = match req.uri().path() {
                            "/metrics" => text(StatusCode::OK, metrics.render()),
                            "/readyz" => {
                                let reachable = UnixStream::connect(runtime.path())
                                    .await
                                    .map(drop)
                                    .map_err(|e| {
                                        format!("runtime endpoint {runtime} is unreachable: {e}")
                                    });
                                readiness(reachable, synced, metrics.kruise_daemon())
                            }
                            path => answer(path),
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                if let Err(error) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(error = %crate::telemetry::Chain(&error), "probe connection ended");
                }
            });
        }
    });
    Ok(())
}

fn answer(path: &str) -> Response<Full<Bytes>> {
    match path {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// 200 when the runtime is reachable and the CRR watches have synced; 503
/// with every reason why not.
fn readiness(
    reachable: Result<(), String>,
    synced: bool,
    kruise_daemon: Option<String>,
) -> Response<Full<Bytes>> {
    let mut problems = Vec::new();
    if let Err(problem) = reachable {
        problems.push(problem);
    }
    if !synced {
        problems.push("the CRR watch has not synced yet".to_owned());
    }
    // The node is set up wrong: two agents for its CRRs. Not ready, so
    // that the operator's checks see it.
    if let Some(pod) = kruise_daemon {
        problems.push(format!(
            "kruise-daemon Pod {pod} runs on this node: its CRR controller does this node's CRRs, and crr-proxy's agent stands aside"
        ));
    }
    if problems.is_empty() {
        text(StatusCode::OK, "ok\n".into())
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, problems.join("\n") + "\n")
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_answers_while_readyz_follows_the_runtime_and_the_watch() {
        assert_eq!(answer("/healthz").status(), StatusCode::OK);
        assert_eq!(answer("/other").status(), StatusCode::NOT_FOUND);
        assert_eq!(readiness(Ok(()), true, None).status(), StatusCode::OK);
        for (reachable, synced) in [(Ok(()), false), (Err("down".to_owned()), true)] {
            assert_eq!(
                readiness(reachable, synced, None).status(),
                StatusCode::SERVICE_UNAVAILABLE
            );
        }
        let aside = readiness(Ok(()), true, Some("kruise-system/kruise-daemon-x".into()));
        assert_eq!(aside.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = format!("{:?}", aside.into_body());
        assert!(
            body.contains("kruise-daemon Pod kruise-system/kruise-daemon-x runs on this node"),
            "{body}"
        );
    }
}
