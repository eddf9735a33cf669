//! The response body handed back to the client.

use std::convert::Infallible;
use std::fmt::Display;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::Endpoint;

/// The runtime's response body, frame by frame, or nothing (for answers the
/// proxy makes itself).
///
/// If the runtime connection breaks mid-response, the stream ends with
/// `grpc-status: 14` trailers rather than a bare reset, so the client sees a
/// retryable `UNAVAILABLE` that names the endpoint.
#[derive(Debug, Default)]
pub struct ProxyBody {
    inner: Option<(Incoming, Endpoint)>,
}

// === impl ProxyBody ===

impl ProxyBody {
    pub(super) fn upstream(body: Incoming, endpoint: Endpoint) -> Self {
        Self {
            inner: Some((body, endpoint)),
        }
    }

    /// A trailers-only `UNAVAILABLE` answer.
    pub(super) fn unavailable(endpoint: &Endpoint, cause: &dyn Display) -> Response<Self> {
        tonic::Status::unavailable(unavailable_message(endpoint, cause)).into_http()
    }
}

fn unavailable_message(endpoint: &Endpoint, cause: &dyn Display) -> String {
    format!("runtime endpoint {endpoint} is unavailable: {cause}")
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some((body, endpoint)) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(Err(error))) => {
                let answer = Self::unavailable(endpoint, &error);
                self.inner = None;
                // Reuse tonic's encoding of grpc-status / grpc-message.
                let mut trailers = answer.into_parts().0.headers;
                trailers.remove(http::header::CONTENT_TYPE);
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|(body, _)| body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some((body, _)) => body.size_hint(),
            None => SizeHint::with_exact(0),
        }
    }
}
