//! A small, deterministic gRPC upstream for what containerd cannot show:
//! exact bytes (containerd encodes maps in random order), streaming, and
//! arbitrary headers and trailers. It answers by path and records every
//! request it receives.

use std::convert::Infallible;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use super::raw::grpc_frame;

/// `/test.Fixed/Unary`: fixed headers, bytes and trailers (status 3).
pub const FIXED: &str = "/test.Fixed/Unary";
/// `/test.Big/Blob`: one [`BLOB`]-byte message, for flow-control tests.
pub const BIG: &str = "/test.Big/Blob";
pub const BLOB: usize = 16 << 20;
/// `/test.Stream/Ticks`: [`TICKS`] messages, [`TICK_GAP`] apart, then trailers.
pub const STREAM: &str = "/test.Stream/Ticks";
pub const TICKS: usize = 4;
pub const TICK_GAP: Duration = Duration::from_millis(200);

/// What the upstream saw of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: http::Method,
    pub path: String,
    pub authority: Option<String>,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

pub struct FakeUpstream {
    pub socket: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    cancelled: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeUpstream {
    pub fn start() -> Self {
        Self::start_at(super::temp_socket("upstream"))
    }

    pub fn start_at(socket: PathBuf) -> Self {
        let listener = UnixListener::bind(&socket).expect("bind fake upstream");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let cancelled = Arc::new(AtomicUsize::new(0));
        let recorder = Arc::clone(&seen);
        let cancels = Arc::clone(&cancelled);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let recorder = Arc::clone(&recorder);
                let cancels = Arc::clone(&cancels);
                let service =
                    service_fn(move |req| answer(req, Arc::clone(&recorder), Arc::clone(&cancels)));
                tokio::spawn(async move {
                    let mut server = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    server.auto_date_header(false);
                    let _ = server.serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Self {
            socket,
            seen,
            cancelled,
            task,
        }
    }

    pub fn endpoint(&self) -> crr_proxy::proxy::Endpoint {
        crr_proxy::proxy::Endpoint::from_path(&self.socket)
    }

    /// Streams whose client went away before the last message was sent.
    pub fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
        super::remove_socket_dir(&self.socket);
    }
}

/// The bytes [`FIXED`] answers with: two messages, one of them not valid
/// protobuf, to show the proxy never looks inside.
pub fn fixed_body() -> Vec<u8> {
    let mut body = grpc_frame(&[0x0a, 0x03, b'a', b'b', b'c', 0x10, 0x96, 0x01]);
    body.extend(grpc_frame(&[0xff, 0x00, 0xfe, 0x7f]));
    body
}

pub fn fixed_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("3"));
    trailers.insert(
        "grpc-message",
        HeaderValue::from_static("bad%20input%3A%20%F0%9F%90%9B"),
    );
    trailers.insert(
        "grpc-status-details-bin",
        HeaderValue::from_static("CAMSBWJhZCBpbnB1dA"),
    );
    trailers.insert("x-upstream-trailer", HeaderValue::from_static("t1"));
    trailers
}

/// The payload of tick `i` of [`STREAM`].
pub fn tick(i: usize) -> Vec<u8> {
    grpc_frame(format!("tick-{i}").as_bytes())
}

async fn answer(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    cancelled: Arc<AtomicUsize>,
) -> Result<Response<Reply>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    if let Ok(mut seen) = seen.lock() {
        seen.push(Seen {
            method: parts.method.clone(),
            path: path.clone(),
            authority: parts.uri.authority().map(|a| a.to_string()),
            headers: parts.headers.clone(),
            body,
        });
    }
    let (tx, rx) = mpsc::channel(8);
    match path.as_str() {
        FIXED => {
            let _ = tx.send(Frame::data(Bytes::from(fixed_body()))).await;
            let _ = tx.send(Frame::trailers(fixed_trailers())).await;
        }
        BIG => {
            tokio::spawn(async move {
                let blob = Bytes::from(grpc_frame(&vec![0x42; BLOB]));
                // In 1 MiB pieces, so that flow control paces the sender.
                for piece in blob.chunks(1 << 20) {
                    if tx.send(Frame::data(blob.slice_ref(piece))).await.is_err() {
                        return;
                    }
                }
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                let _ = tx.send(Frame::trailers(trailers)).await;
            });
        }
        STREAM => {
            tokio::spawn(async move {
                for i in 0..TICKS {
                    if i > 0 {
                        tokio::time::sleep(TICK_GAP).await;
                    }
                    if tx.send(Frame::data(Bytes::from(tick(i)))).await.is_err() {
                        cancelled.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                trailers.insert("x-ticks", HeaderValue::from(TICKS));
                let _ = tx.send(Frame::trailers(trailers)).await;
            });
        }
        _ => {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("12"));
            trailers.insert(
                "grpc-message",
                HeaderValue::from_static("unknown method in fake upstream"),
            );
            let _ = tx.send(Frame::trailers(trailers)).await;
        }
    }
    let response = Response::builder()
        .header("content-type", "application/grpc")
        .header("x-upstream-header", "h1")
        .header("x-upstream-bin", "AAECAw")
        .body(Reply::from(rx))
        .unwrap_or_default();
    Ok(response)
}

/// A response body fed frame by frame from a channel.
#[derive(Default)]
pub struct Reply(Option<mpsc::Receiver<Frame<Bytes>>>);

impl From<mpsc::Receiver<Frame<Bytes>>> for Reply {
    fn from(rx: mpsc::Receiver<Frame<Bytes>>) -> Self {
        Self(Some(rx))
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.0.as_mut() {
            Some(rx) => rx.poll_recv(cx).map(|f| f.map(Ok)),
            None => Poll::Ready(None),
        }
    }
}
