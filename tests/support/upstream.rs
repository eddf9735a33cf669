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

/// PodSandboxStatus: [`sandbox_status`] with [`stopped_status`] among the
/// containers, in two DATA frames split mid-message.
pub const SANDBOX_STATUS: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";
/// GetContainerEvents: [`EVENTS`] events with [`stopped_status`], split
/// across DATA frames at odd places, then trailers.
pub const CONTAINER_EVENTS: &str = "/runtime.v1.RuntimeService/GetContainerEvents";
pub const EVENTS: usize = 3;
/// ContainerStatus: a ContainerStatusResponse around [`stopped_status`]
/// with an `info` entry.
pub const CONTAINER_STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";
/// The container the tests' record says crr-proxy stopped.
pub const STOPPED_ID: &str = "stopped-id";

/// Fields no CRI version defines: 99 (varint), 100 (bytes), 101 (fixed32).
const UNKNOWN_FIELDS: &[u8] = &[
    0x98, 0x06, 0x2a, 0xa2, 0x06, 0x03, b'x', b'y', b'z', 0xad, 0x06, 1, 2, 3, 4,
];

fn put_len(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
}

/// `ContainerStatus.stop_signal` (field 19) = `SIGTERM` (23): a field of
/// cri-api that crr-proxy's proto and its editor do not declare.
const STOP_SIGNAL: &[u8] = &[0x98, 0x01, 0x17];

/// An exited container's status as the runtime sends it (`Error`, no
/// message, then fields our proto does not know); with `edited`, as
/// crr-proxy should pass it on: that reason in place, the message after.
pub fn stopped_status(id: &str, edited: Option<(&str, &str)>) -> Vec<u8> {
    use crr_proxy::cri::v1::{ContainerMetadata, ContainerState, ContainerStatus, ImageSpec};
    use prost::Message;
    let mut bytes = ContainerStatus {
        id: id.into(),
        metadata: Some(ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        state: ContainerState::ContainerExited as i32,
        created_at: 1_700_000_000_000_000_000,
        finished_at: 1_700_000_001_000_000_000,
        exit_code: 143,
        image: Some(ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        image_ref: "sha256:0123".into(),
        reason: edited.map_or("Error", |(reason, _)| reason).into(),
        log_path: "app/0.log".into(),
        ..Default::default()
    }
    .encode_to_vec();
    bytes.extend_from_slice(STOP_SIGNAL);
    bytes.extend_from_slice(UNKNOWN_FIELDS);
    if let Some((_, message)) = edited {
        put_len(&mut bytes, 0x5a, message.as_bytes());
    }
    bytes
}

/// A PodSandboxStatusResponse around `stopped` (and another exited
/// container, and a top-level field no CRI version defines).
pub fn sandbox_status(stopped: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sandbox = b"\x0a\x02sb".to_vec();
    sandbox.extend_from_slice(UNKNOWN_FIELDS);
    put_len(&mut out, 0x0a, &sandbox);
    put_len(&mut out, 0x1a, stopped);
    put_len(&mut out, 0x1a, &stopped_status("other-id", None));
    out.extend_from_slice(&[0x20, 0x96, 0x01, 0x80, 0x7d, 0x01]);
    out
}

/// A verbose ContainerStatusResponse around `stopped`.
pub fn container_status(stopped: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_len(&mut out, 0x0a, stopped);
    let mut info = Vec::new();
    put_len(&mut info, 0x0a, b"info");
    put_len(&mut info, 0x12, br#"{"pid":42}"#);
    put_len(&mut out, 0x12, &info);
    out
}

/// ContainerEventResponse `i`, with `stopped` among its statuses.
pub fn container_event(i: usize, stopped: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_len(&mut out, 0x0a, format!("event-{i}").as_bytes());
    out.extend_from_slice(&[0x10, 0x02]);
    put_len(&mut out, 0x2a, &stopped_status("other-id", None));
    put_len(&mut out, 0x2a, stopped);
    out.extend_from_slice(UNKNOWN_FIELDS);
    out
}

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
        SANDBOX_STATUS => {
            let body = grpc_frame(&sandbox_status(&stopped_status(STOPPED_ID, None)));
            let (first, second) = body.split_at(body.len() / 2);
            let _ = tx.send(Frame::data(Bytes::copy_from_slice(first))).await;
            let _ = tx.send(Frame::data(Bytes::copy_from_slice(second))).await;
            let _ = tx.send(Frame::trailers(ok_trailers())).await;
        }
        CONTAINER_STATUS => {
            let body = grpc_frame(&container_status(&stopped_status(STOPPED_ID, None)));
            let _ = tx.send(Frame::data(Bytes::from(body))).await;
            let _ = tx.send(Frame::trailers(ok_trailers())).await;
        }
        CONTAINER_EVENTS => {
            tokio::spawn(async move {
                let mut stream = Vec::new();
                for i in 0..EVENTS {
                    stream.extend(grpc_frame(&container_event(
                        i,
                        &stopped_status(STOPPED_ID, None),
                    )));
                }
                // 3 bytes, then 7, then the rest of a message and a half, ...
                for piece in stream
                    .chunks(stream.len() / 5)
                    .flat_map(|c| {
                        let (a, b) = c.split_at(c.len().min(3));
                        [a.to_vec(), b.to_vec()]
                    })
                    .filter(|piece| !piece.is_empty())
                {
                    if tx.send(Frame::data(Bytes::from(piece))).await.is_err() {
                        return;
                    }
                }
                let _ = tx.send(Frame::trailers(ok_trailers())).await;
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

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers
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
