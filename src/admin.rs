//! The local HTTP endpoint (`--metrics-addr`): `/metrics` in Prometheus
//! text format, and `/healthz` and `/readyz`, which answer 200 once the
//! agent's CRR watch has synced (at once when no agent runs), 503 before.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, info};

use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
#[error("bind {addr}: {source}")]
pub struct AdminError {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// Binds `addr` and serves the probes in the background.
pub async fn serve(
    addr: SocketAddr,
    ready: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) -> Result<(), AdminError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError { addr, source })?;
    info!(%addr, "serving /metrics, /healthz and /readyz");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ready = ready.clone();
            let metrics = Arc::clone(&metrics);
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let synced = *ready.borrow();
                    let response = match req.uri().path() {
                        "/metrics" => text(StatusCode::OK, metrics.render()),
                        path => answer(path, synced),
                    };
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(error) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(%error, "probe connection ended");
                }
            });
        }
    });
    Ok(())
}

fn answer(path: &str, synced: bool) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/healthz" | "/readyz" if synced => (StatusCode::OK, "ok\n"),
        "/healthz" | "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the CRR watch has not synced yet\n",
        ),
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    };
    text(status, body.to_owned())
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
    fn probes_follow_the_sync_state() {
        assert_eq!(
            answer("/healthz", false).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            answer("/readyz", false).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(answer("/healthz", true).status(), StatusCode::OK);
        assert_eq!(answer("/readyz", true).status(), StatusCode::OK);
        assert_eq!(answer("/other", true).status(), StatusCode::NOT_FOUND);
    }
}
