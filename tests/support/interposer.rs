//! A runtime that fails where containerd will not on demand: every call is
//! forwarded to a real runtime (containerd), except that once a
//! StopContainer has gone through, ContainerStatus answers UNAVAILABLE, as
//! a runtime under load or restarting does.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Empty, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{UnixListener, UnixStream};

const STOP: &str = "/runtime.v1.RuntimeService/StopContainer";
const STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";

pub struct StatusFailsAfterStop {
    pub socket: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

type Body = BoxBody<Bytes, hyper::Error>;

impl StatusFailsAfterStop {
    /// In front of the runtime at `runtime`.
    pub fn start(runtime: PathBuf) -> Self {
        let socket = super::temp_socket("interposer");
        let listener = UnixListener::bind(&socket).expect("bind the interposer");
        let stopped = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let runtime = runtime.clone();
                let stopped = Arc::clone(&stopped);
                tokio::spawn(async move {
                    let Ok(upstream) = UnixStream::connect(&runtime).await else {
                        return;
                    };
                    let Ok((sender, conn)) = hyper::client::conn::http2::handshake(
                        TokioExecutor::new(),
                        TokioIo::new(upstream),
                    )
                    .await
                    else {
                        return;
                    };
                    tokio::spawn(conn);
                    let service = service_fn(move |req: Request<Incoming>| {
                        let mut sender = sender.clone();
                        let stopped = Arc::clone(&stopped);
                        async move {
                            let path = req.uri().path().to_owned();
                            if path == STATUS && stopped.load(Ordering::SeqCst) {
                                return Ok::<_, hyper::Error>(unavailable());
                            }
                            let response = sender.send_request(req).await?;
                            if path == STOP {
                                stopped.store(true, Ordering::SeqCst);
                            }
                            Ok(response.map(BodyExt::boxed))
                        }
                    });
                    let server = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    let _ = server.serve_connection(TokioIo::new(client), service).await;
                });
            }
        });
        Self { socket, task }
    }

    pub fn endpoint(&self) -> crr_proxy::cri::Endpoint {
        crr_proxy::cri::Endpoint::from_path(&self.socket)
    }
}

/// A trailers-only UNAVAILABLE answer.
fn unavailable() -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static("14"));
    headers.insert(
        "grpc-message",
        HeaderValue::from_static("the runtime is busy"),
    );
    response
}

impl Drop for StatusFailsAfterStop {
    fn drop(&mut self) {
        self.task.abort();
        super::remove_socket_dir(&self.socket);
    }
}
