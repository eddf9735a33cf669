//! The transparent CRI data path.
//!
//! Every client connection is relayed frame by frame onto a runtime
//! connection of its own (`relay`): headers, every DATA frame and the
//! trailers pass through as they are, so methods, services and fields
//! crr-proxy has never heard of reach the runtime unchanged. Nothing here
//! adds a deadline or limits message sizes. The one exception to "unchanged"
//! is `reason`: once the agent has recreated a container, the status answers
//! about it say so (two string fields, edited at the wire level).
//!
//! While the runtime is unreachable, the relay answers every call itself
//! (`relay::standin`) with UNAVAILABLE naming the endpoint, and sends the
//! client to a new, relayed connection once the runtime is back. Only when
//! image calls go to an endpoint of their own is a connection served by
//! hyper instead, which routes each call to its endpoint (`transcode`
//! re-encodes the client's header blocks for it).

mod body;
mod call;
mod frame;
pub(crate) mod hpack;
mod listener;
pub(crate) mod relay;
mod socket;
mod transcode;
mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::DuplexStream;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::cri::Method;
use crate::metrics::Metrics;
use crate::reason::Recreated;
use crate::telemetry::Chain;

pub use crate::cri::{Endpoint, EndpointError};
pub use body::ProxyBody;
use call::{Call, editor_for};
pub use listener::{ListenError, Listener};
use relay::Relay;
use upstream::Upstream;

/// How long in-flight calls may run after shutdown is requested (within
/// systemd's `TimeoutStopSec=15`).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where each call goes.
#[derive(Clone, Debug)]
pub struct Routes {
    /// The runtime service endpoint (containerd's socket).
    pub runtime: Endpoint,
    /// ImageService calls go here when set; otherwise to `runtime`.
    pub image: Option<Endpoint>,
}

/// The proxy: a listener plus the routes its calls are forwarded along.
#[derive(Debug)]
pub struct Proxy {
    routes: Arc<Routes>,
    metrics: Arc<Metrics>,
    recreated: Option<Arc<Recreated>>,
    server: hyper::server::conn::http2::Builder<TokioExecutor>,
    drain_timeout: Duration,
}

// === impl Proxy ===

impl Proxy {
    pub fn new(routes: Routes) -> Self {
        let mut server = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        server
            // Several streams' worth per connection, so that one slow reader
            // does not stall its neighbours; the connection window is also
            // what one client that never reads can make the proxy hold.
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            // kubelet opens one connection per service and multiplexes on it;
            // well above its needs, well below what would let one client pin memory.
            .max_concurrent_streams(1024)
            // gRPC metadata is headers: what the relay passes (grpc-go's
            // 16 MiB, which the runtime enforces itself) passes here too.
            // One block is decoded at a time per connection.
            .max_header_list_size(u32::try_from(hpack::MAX_LIST).unwrap_or(u32::MAX))
            // The response headers are the runtime's; hyper would add `date`.
            .auto_date_header(false);
        Self {
            routes: Arc::new(routes),
            metrics: Arc::default(),
            recreated: None,
            server,
            drain_timeout: DRAIN_TIMEOUT,
        }
    }

    /// Counts calls in `metrics` (by default in metrics of its own).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Tells kubelet why the containers in `recreated` stopped (see
    /// `reason`); without it, every byte passes unchanged.
    pub fn with_reasons(mut self, recreated: Arc<Recreated>) -> Self {
        self.recreated = Some(recreated);
        self
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// How long in-flight calls may run after shutdown is requested.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Serves `listener` until `shutdown` resolves, then stops accepting, asks
    /// every client to go away (GOAWAY) and waits (bounded) for in-flight calls.
    pub async fn serve(&self, listener: UnixListener, shutdown: impl Future<Output = ()>) {
        let (stop, stopping) = watch::channel(false);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => self.accept(stream, stopping.clone()),
                    Err(error) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        drop(stopping);
        info!("shutting down: draining in-flight calls");
        let _ = stop.send(true);
        if tokio::time::timeout(self.drain_timeout, stop.closed())
            .await
            .is_err()
        {
            warn!(timeout = ?self.drain_timeout, "in-flight calls did not finish in time");
        }
    }

    /// Serves one client connection: relayed frame by frame onto a runtime
    /// connection of its own, or answered by the relay's stand-in while the
    /// runtime is unreachable; with an image endpoint of its own, through
    /// hyper, which routes each call.
    fn accept(&self, stream: UnixStream, stop: watch::Receiver<bool>) {
        let routes = Arc::clone(&self.routes);
        let metrics = Arc::clone(&self.metrics);
        let recreated = self.recreated.clone();
        let server = self.server.clone();
        tokio::spawn(async move {
            if routes.image.is_some() {
                let conn = Connection::new(&routes, &metrics, recreated);
                let service = service_fn(move |req| {
                    let conn = Arc::clone(&conn);
                    async move { Ok::<_, Infallible>(conn.forward(req).await) }
                });
                let stream = TokioIo::new(transcode::serve(stream));
                serve_terminated(server.serve_connection(stream, service), stop).await;
                return;
            }
            let endpoint = routes.runtime.clone();
            let served = match UnixStream::connect(endpoint.path()).await {
                Ok(upstream) => match Relay::new(stream, upstream, endpoint, metrics, recreated) {
                    Ok(relay) => {
                        relay.run(stop).await;
                        Ok(())
                    }
                    Err(error) => Err(error),
                },
                Err(error) => {
                    debug!(%endpoint, %error, "runtime unreachable");
                    relay::standin::serve(stream, endpoint, metrics, stop).await
                }
            };
            if let Err(error) = served {
                warn!(error = %Chain(&error), "could not register a connection");
            }
        });
    }
}

/// Drives one terminated client connection until it ends; shutdown turns it
/// into a graceful one.
async fn serve_terminated<S>(
    served: hyper::server::conn::http2::Connection<TokioIo<DuplexStream>, S, TokioExecutor>,
    mut stop: watch::Receiver<bool>,
) where
    S: hyper::service::HttpService<Incoming, ResBody = ProxyBody>,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(served);
    let mut going = false;
    loop {
        tokio::select! {
            ended = served.as_mut() => {
                if let Err(error) = ended {
                    // A client that speaks something other than HTTP/2, or
                    // goes away abruptly, only ends its own connection.
                    debug!(error = %Chain(&error), "client connection ended with an error");
                }
                return;
            }
            _ = stop.wait_for(|stop| *stop), if !going => {
                served.as_mut().graceful_shutdown();
                going = true;
            }
        }
    }
}

/// The upstream connections of one client connection.
///
/// Each client connection gets its own upstream connections, so a client that
/// misbehaves (stops reading, floods streams) can only exhaust flow-control
/// windows that nobody else shares.
struct Connection {
    runtime: Upstream,
    image: Option<Upstream>,
    metrics: Arc<Metrics>,
    recreated: Option<Arc<Recreated>>,
}

// === impl Connection ===

impl Connection {
    fn new(
        routes: &Routes,
        metrics: &Arc<Metrics>,
        recreated: Option<Arc<Recreated>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            runtime: Upstream::new(routes.runtime.clone(), Arc::clone(metrics)),
            image: routes
                .image
                .clone()
                .map(|image| Upstream::new(image, Arc::clone(metrics))),
            metrics: Arc::clone(metrics),
            recreated,
        })
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        if req.uri().authority().is_none() {
            // The client sent no `:authority`. h2 refuses to send an HTTP/2
            // request without one, but sends an HTTP/1-versioned request with
            // `:scheme http` and no authority: exactly what arrived.
            *req.version_mut() = http::Version::HTTP_11;
        }
        let method = Method::parse(req.uri().path());
        let upstream = match &self.image {
            Some(image) if method.is_some_and(|m| m.is_image_service()) => image,
            _ => &self.runtime,
        };
        let mut call = Call::start(&self.metrics, method);
        let editor = editor_for(method, self.recreated.as_ref());
        let response = upstream.forward(req).await;
        // A trailers-only answer carries its status in the headers.
        if let Some(code) = body::grpc_code(response.headers()) {
            call.finish(code);
        }
        response.map(|body| {
            let body = body.counted(call);
            match editor {
                Some((editor, recreated)) => body.edited(editor, recreated),
                None => body,
            }
        })
    }
}
