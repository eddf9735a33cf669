//! A raw HTTP/2 client for exact, frame-level comparisons: it sends the
//! headers and bytes it is given and records everything that comes back.

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::path::Path;
use tokio::net::UnixStream;

/// Everything a response carried, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub data: Vec<u8>,
    pub trailers: Option<HeaderMap>,
}

pub async fn connect(socket: &Path) -> Result<SendRequest<Full<Bytes>>> {
    connect_with_windows(socket, None, None).await
}

/// A client that gives each stream, and the connection, only so many bytes
/// of credit at a time (h2 enforces them: a peer that sends more is a
/// flow-control error).
pub async fn connect_with_windows(
    socket: &Path,
    stream_window: Option<u32>,
    connection_window: Option<u32>,
) -> Result<SendRequest<Full<Bytes>>> {
    let stream = UnixStream::connect(socket)
        .await
        .with_context(|| format!("connect {}", socket.display()))?;
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    if let Some(window) = stream_window {
        builder.initial_stream_window_size(window);
    }
    if let Some(window) = connection_window {
        builder.initial_connection_window_size(window);
    }
    let (sender, conn) = builder.handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// A gRPC-style POST to `path` with extra `headers` and a raw `body`.
pub fn grpc_request(path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Request<Full<Bytes>> {
    let mut req = Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::from(body)))
        .expect("valid request")
}

pub async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>> {
    sender.ready().await?;
    Ok(sender.send_request(req).await?)
}

/// Starts a call to `path` on a new connection to `socket`, with no
/// metadata and no body, and returns the response as it streams in.
pub async fn open(socket: &Path, path: &str) -> Response<Incoming> {
    let mut sender = connect(socket).await.expect("connect");
    send(&mut sender, grpc_request(path, &[], vec![]))
        .await
        .expect("response headers")
}

/// Reads a whole response.
pub async fn record(response: Response<Incoming>) -> Result<Recorded> {
    let (parts, mut body) = response.into_parts();
    let mut data = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        match frame.into_data() {
            Ok(chunk) => data.extend_from_slice(&chunk),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    Ok(Recorded {
        status: parts.status,
        headers: parts.headers,
        data,
        trailers,
    })
}

/// Frames a protobuf payload as one gRPC message (uncompressed).
pub fn grpc_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(0);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The `grpc-status` of a response: from the trailers, or from the headers
/// of a trailers-only answer.
pub fn grpc_status(recorded: &Recorded) -> Option<String> {
    recorded
        .trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| recorded.headers.get("grpc-status"))
        .map(|v| v.to_str().unwrap_or("?").to_owned())
}
