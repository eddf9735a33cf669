//! The response body handed back to the client.

use std::convert::Infallible;
use std::fmt::Display;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::Endpoint;
use super::call::{Call, UNKNOWN, unavailable_message};
use crate::reason::{Editor, Recreated};

/// The runtime's response body, frame by frame, or nothing (for answers the
/// proxy makes itself).
///
/// If the runtime connection breaks mid-response, the stream ends with
/// `grpc-status: 14` trailers rather than a bare reset, so the client sees a
/// retryable `UNAVAILABLE` that names the endpoint.
#[derive(Debug, Default)]
pub struct ProxyBody {
    inner: Option<(Incoming, Endpoint)>,
    call: Option<Call>,
    /// Rewrites the reason of containers stopped for a CRR (see `reason`).
    editor: Option<(Editor, Arc<Recreated>)>,
    /// A frame held back while the editor's leftover bytes go first.
    held: Option<Frame<Bytes>>,
}

/// The `grpc-status` in a header or trailer map.
pub(super) fn grpc_code(headers: &HeaderMap) -> Option<u32> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

// === impl ProxyBody ===

impl ProxyBody {
    pub(super) fn upstream(body: Incoming, endpoint: Endpoint) -> Self {
        Self {
            inner: Some((body, endpoint)),
            ..Self::default()
        }
    }

    /// Edits the statuses in the messages of this response.
    pub(super) fn edited(mut self, editor: Editor, recreated: Arc<Recreated>) -> Self {
        self.editor = Some((editor, recreated));
        self
    }

    /// Counts the call when its status goes by.
    pub(super) fn counted(mut self, call: Call) -> Self {
        self.call = Some(call);
        self
    }

    /// A trailers-only `UNAVAILABLE` answer.
    pub(super) fn unavailable(endpoint: &Endpoint, cause: &dyn Display) -> Response<Self> {
        tonic::Status::unavailable(unavailable_message(endpoint, cause)).into_http()
    }
}

impl ProxyBody {
    /// The runtime's next frame, through the editor when there is one.
    fn poll_edited(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(frame) = self.held.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some((body, _)) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            let polled = Pin::new(&mut *body).poll_frame(cx);
            let Some((editor, recreated)) = self.editor.as_mut() else {
                return polled;
            };
            return match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => match editor.push(data, recreated.as_ref()) {
                        Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                        // Half a message: read on.
                        None => continue,
                    },
                    // Trailers: whatever the editor still holds goes first.
                    Err(trailers) => match editor.finish() {
                        Some(rest) => {
                            self.held = Some(trailers);
                            Poll::Ready(Some(Ok(Frame::data(rest))))
                        }
                        None => Poll::Ready(Some(Ok(trailers))),
                    },
                },
                Poll::Ready(None) => Poll::Ready(editor.finish().map(|rest| Ok(Frame::data(rest)))),
                other => other,
            };
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let polled = this.poll_edited(cx);
        let (frame, code) = match polled {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Err(error))) => {
                let Some((_, endpoint)) = this.inner.take() else {
                    return Poll::Ready(None);
                };
                let answer = Self::unavailable(&endpoint, &error);
                // Reuse tonic's encoding of grpc-status / grpc-message.
                let mut trailers = answer.into_parts().0.headers;
                trailers.remove(http::header::CONTENT_TYPE);
                let code = grpc_code(&trailers);
                (Some(Frame::trailers(trailers)), code)
            }
            Poll::Ready(Some(Ok(frame))) => {
                let code = frame
                    .trailers_ref()
                    .map(|t| grpc_code(t).unwrap_or(UNKNOWN));
                (Some(frame), code)
            }
            // The end without trailers is not a complete gRPC answer.
            Poll::Ready(None) => (None, Some(UNKNOWN)),
        };
        if let (Some(code), Some(call)) = (code, this.call.as_mut()) {
            call.finish(code);
        }
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none()
            && self
                .inner
                .as_ref()
                .is_none_or(|(body, _)| body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            // Edited messages change length.
            Some(_) if self.editor.is_some() => SizeHint::default(),
            Some((body, _)) => body.size_hint(),
            None => SizeHint::with_exact(0),
        }
    }
}
