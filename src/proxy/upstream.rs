//! One lazily (re)connected HTTP/2 connection to the runtime socket.

use std::io;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;
use tokio::sync::Mutex;
use tracing::debug;

use super::{Endpoint, ProxyBody};
use crate::metrics::Metrics;
use crate::telemetry::Chain;

#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    #[error("connect")]
    Connect(#[source] io::Error),
    #[error("http/2 handshake")]
    Handshake(#[source] hyper::Error),
    #[error(transparent)]
    Call(hyper::Error),
}

pub(super) struct Upstream {
    endpoint: Endpoint,
    sender: Mutex<Option<SendRequest<Incoming>>>,
    metrics: Arc<Metrics>,
}

// === impl Upstream ===

impl Upstream {
    pub(super) fn new(endpoint: Endpoint, metrics: Arc<Metrics>) -> Self {
        Self {
            endpoint,
            sender: Mutex::new(None),
            metrics,
        }
    }

    /// Forwards one call. Failures to reach the runtime become a gRPC
    /// `UNAVAILABLE` answer naming the endpoint, so the caller can retry.
    pub(super) async fn forward(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        match self.send(req).await {
            Ok(response) => response.map(|body| ProxyBody::upstream(body, self.endpoint.clone())),
            Err(error) => {
                debug!(endpoint = %self.endpoint, error = %Chain(&error), "runtime unavailable");
                ProxyBody::unavailable(&self.endpoint, &error)
            }
        }
    }

    async fn send(&self, req: Request<Incoming>) -> Result<Response<Incoming>, UpstreamError> {
        let mut sender = self.sender(false).await?;
        match sender.try_send_request(req).await {
            Ok(response) => Ok(response),
            Err(mut error) => match error.take_message() {
                // The connection closed before the request left (for example the
                // runtime restarted and sent GOAWAY): nothing reached the
                // runtime, so one more try on a fresh connection is safe.
                Some(req) => {
                    let mut sender = self.sender(true).await?;
                    sender.send_request(req).await.map_err(UpstreamError::Call)
                }
                None => Err(UpstreamError::Call(error.into_error())),
            },
        }
    }

    async fn sender(&self, fresh: bool) -> Result<SendRequest<Incoming>, UpstreamError> {
        let mut slot = self.sender.lock().await;
        if !fresh {
            if let Some(sender) = slot.as_ref().filter(|s| !s.is_closed()) {
                return Ok(sender.clone());
            }
        }
        let sender = self.connect().await?;
        *slot = Some(sender.clone());
        Ok(sender)
    }

    async fn connect(&self) -> Result<SendRequest<Incoming>, UpstreamError> {
        // A missing socket or one nobody listens on fails here at once
        // (ENOENT, ECONNREFUSED): no retry loop, the caller gets UNAVAILABLE.
        let stream = UnixStream::connect(self.endpoint.path())
            .await
            .map_err(UpstreamError::Connect)?;
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            // The runtime is trusted; grpc-go allows up to 16 MiB of metadata.
            .max_header_list_size(16 << 20)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::Handshake)?;
        let endpoint = self.endpoint.clone();
        let metrics = Arc::clone(&self.metrics);
        metrics.upstream_connected();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%endpoint, error = %Chain(&error), "runtime connection ended");
            }
            metrics.upstream_disconnected();
        });
        debug!(endpoint = %self.endpoint, "connected to runtime");
        Ok(sender)
    }
}
