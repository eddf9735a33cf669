//! Serving a client while the runtime is unreachable.
//!
//! The relay has no runtime connection to pass frames to, so it plays the
//! server's part of HTTP/2 itself, just enough for gRPC: its own SETTINGS,
//! the ACKs, connection credit for what the client sends, and to every call
//! a trailers-only `UNAVAILABLE` naming the endpoint. Any `:authority` is
//! fine: it is never parsed. Once the runtime answers again, the client is
//! told to go (GOAWAY) and its next connection is relayed; a call that
//! arrives when the runtime is already back is refused (REFUSED_STREAM),
//! which gRPC clients retry on their new connection.

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::sync::watch;
use tracing::debug;

use super::RelayError;
use super::closing::Closing;
use super::codec::{Block, Blocks};
use super::frames::{each_frame, take_preface};
use super::outbound::Outbound;
use crate::cri::Method;
use crate::metrics::Metrics;
use crate::proxy::Endpoint;
use crate::proxy::call::{Call, UNAVAILABLE, unavailable_message};
use crate::proxy::frame::{self, HEAD_LEN, Head};
use crate::proxy::hpack;
use crate::proxy::socket::{Inbox, Socket};
use crate::telemetry::Chain;

/// How often the runtime is looked for while nothing happens.
const PROBE: Duration = Duration::from_millis(500);

/// How long one look for the runtime may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Serves `client` until it goes, or the runtime is back and it was told to
/// go, or shutdown.
pub(in crate::proxy) async fn serve(
    client: UnixStream,
    endpoint: Endpoint,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut socket = Socket::new(client)?;
    let mut standin = Standin::new(endpoint, metrics);
    let mut probe = tokio::time::interval(PROBE);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = false;
    loop {
        let step = tokio::select! {
            step = poll_fn(|cx| standin.poll(&mut socket, cx)) => step,
            _ = probe.tick(), if !standin.going => Step::Probe,
            _ = shutdown.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                standin.go(b"shutting down");
                continue;
            }
        };
        match step {
            Step::Finished => {
                socket.close(standin.client_eof).await;
                return Ok(());
            }
            // Calls came in: are they refused, or unavailable?
            Step::Calls => {
                let back = reachable(&standin.endpoint).await;
                standin.answer(back);
            }
            Step::Probe => {
                if reachable(&standin.endpoint).await {
                    standin.go(b"the runtime is back");
                }
            }
        }
    }
}

/// The runtime accepts connections again.
async fn reachable(endpoint: &Endpoint) -> bool {
    let connect = UnixStream::connect(endpoint.path());
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, connect).await,
        Ok(Ok(_))
    )
}

/// Why `Standin::poll` returned.
enum Step {
    Finished,
    Calls,
    /// Time to look for the runtime.
    Probe,
}

struct Standin {
    endpoint: Endpoint,
    metrics: Arc<Metrics>,
    from_client: Inbox,
    to_client: Outbound,
    preface_seen: bool,
    client_eof: bool,
    requests: Blocks,
    /// Calls received and not yet answered.
    calls: Vec<Block>,
    /// The streams the client opened, and the GOAWAY it is sent.
    closing: Closing,
    /// The highest stream answered (GOAWAY's last processed one).
    answered: u32,
    /// The client was sent GOAWAY: once it has it, the connection ends.
    going: bool,
}

impl Standin {
    fn new(endpoint: Endpoint, metrics: Arc<Metrics>) -> Self {
        let mut to_client = Outbound::to_client();
        // The server's preface: SETTINGS, all defaults.
        to_client.preface();
        Self {
            endpoint,
            metrics,
            from_client: Inbox::default(),
            to_client,
            preface_seen: false,
            client_eof: false,
            requests: Blocks::new(hpack::Decoder::new()),
            calls: Vec::new(),
            closing: Closing::default(),
            answered: 0,
            going: false,
        }
    }

    fn poll(&mut self, socket: &mut Socket, cx: &mut Context<'_>) -> Poll<Step> {
        loop {
            let mut progress = false;
            if !self.to_client.is_empty() {
                match socket.poll_write(cx, self.to_client.data()) {
                    Poll::Ready(Ok(n)) => {
                        self.to_client.advance(n);
                        if self.to_client.is_empty() && socket.drained().is_err() {
                            return Poll::Ready(Step::Finished);
                        }
                        progress = true;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Step::Finished),
                    Poll::Pending => {}
                }
            }
            if self.to_client.is_empty() && (self.going || self.client_eof) {
                return Poll::Ready(Step::Finished);
            }
            if !self.calls.is_empty() {
                return Poll::Ready(Step::Calls);
            }
            if !self.going && !self.client_eof {
                match socket.poll_read(cx, &mut self.from_client) {
                    Poll::Ready(Ok(0)) => {
                        self.client_eof = true;
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => {
                        if let Err(error) = self.frames() {
                            debug!(error = %Chain(&error), "client connection failed");
                            let debug = error.to_string();
                            let (last, code) = (self.answered, error.code());
                            self.closing
                                .goaway(&mut self.to_client, last, code, debug.as_bytes());
                            self.going = true;
                        }
                        progress = true;
                    }
                    Poll::Ready(Err(error)) => {
                        debug!(error = %Chain(&error), "client connection ended");
                        return Poll::Ready(Step::Finished);
                    }
                    Poll::Pending => {}
                }
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    fn frames(&mut self) -> Result<(), RelayError> {
        let mut inbox = std::mem::take(&mut self.from_client);
        let handled = self.frames_in(&mut inbox);
        self.from_client = inbox;
        handled
    }

    /// Read as the relay reads the client (`take_preface`, `each_frame`).
    fn frames_in(&mut self, inbox: &mut Inbox) -> Result<(), RelayError> {
        if !self.preface_seen {
            if !take_preface(inbox)? {
                return Ok(());
            }
            self.preface_seen = true;
        }
        // The stand-in's SETTINGS leave SETTINGS_MAX_FRAME_SIZE at its default.
        each_frame(inbox, frame::DEFAULT_MAX_FRAME, |head, whole| {
            self.frame(head, &whole[HEAD_LEN..])
        })
    }

    fn frame(&mut self, head: Head, payload: &[u8]) -> Result<(), RelayError> {
        self.requests.check(head)?;
        let ack = head.flags & frame::ACK != 0;
        match head.kind {
            frame::HEADERS | frame::CONTINUATION => {
                if let Some(block) = self.requests.frame(head, payload, false)?
                    && self.closing.opens(block.stream)
                {
                    self.calls.push(block);
                }
            }
            frame::SETTINGS if !ack => {
                // Checked for form only: the stand-in sends no DATA, and
                // its header blocks use no table, so no value matters.
                let _ = head.settings(payload)?;
                self.to_client
                    .own(|out| frame::settings(frame::ACK, &[], out));
            }
            frame::PING if !ack => {
                if payload.len() != 8 {
                    return Err(frame::FrameError::Malformed {
                        kind: head.kind,
                        stream: head.stream,
                    }
                    .into());
                }
                self.to_client
                    .own(|out| frame::put(out, frame::PING, frame::ACK, 0, payload));
            }
            frame::DATA => {
                // Nothing reads it: the client gets its connection window
                // back at once (its stream is answered, or soon will be).
                if let Ok(len @ 1..) = u32::try_from(head.len) {
                    self.to_client.own(|out| frame::window_update(0, len, out));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Answers the calls received: `UNAVAILABLE`, or, once the runtime is
    /// `back`, REFUSED_STREAM with a GOAWAY that says none was processed.
    fn answer(&mut self, back: bool) {
        let calls = std::mem::take(&mut self.calls);
        if back {
            // GOAWAY first: a client then retries the refused calls on a
            // new connection, not on this one.
            self.go(b"the runtime is back");
            for call in &calls {
                let refuse =
                    |out: &mut _| frame::rst_stream(call.stream, frame::REFUSED_STREAM, out);
                self.to_client.own(refuse);
            }
            return;
        }
        let message = unavailable_message(&self.endpoint, &"it is unreachable");
        for call in calls {
            let path = call.fields.path.as_deref().unwrap_or_default();
            let method = std::str::from_utf8(path).ok().and_then(Method::parse);
            Call::start(&self.metrics, method).finish(UNAVAILABLE);
            self.answered = call.stream;
            let answer = frame::grpc_status_frame(call.stream, false, UNAVAILABLE, &message);
            self.to_client.own(|out| out.extend_from_slice(&answer));
            if !call.end_stream {
                // The rest of the request is not wanted (RFC 9113 §8.1).
                let done = |out: &mut _| frame::rst_stream(call.stream, frame::NO_ERROR, out);
                self.to_client.own(done);
            }
        }
    }

    /// Tells the client to go: no stream after the last answered one was
    /// processed.
    fn go(&mut self, why: &[u8]) {
        if !self.going {
            self.going = true;
            let last = self.answered;
            self.closing
                .goaway(&mut self.to_client, last, frame::NO_ERROR, why);
        }
    }
}
