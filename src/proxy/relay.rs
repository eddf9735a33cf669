//! The fast path: one client connection relayed frame by frame onto one
//! runtime connection of its own.
//!
//! Nearly nothing is re-encoded. The connection preface, PINGs, stream IDs,
//! HPACK blocks and DATA frames go through as they came, so the two ends
//! negotiate with each other and the relay costs about what a byte splice
//! costs. The relay still reads every frame header and decodes every header
//! block (HPACK is stateful; a skipped block would desynchronise its
//! table), which is what it needs for three jobs:
//! - counting calls: the method from a request's `:path`, the code from the
//!   response's `grpc-status`;
//! - answering `UNAVAILABLE` when the runtime is unreachable or goes away;
//! - editing the status answers of recreated containers (`reason`). An edit
//!   changes the length of a response, so for those streams the relay runs
//!   flow control itself (`flow`), and an answer that waits for the client's
//!   window is held by its stream alone (`streams`).
//!
//! Besides the edits, what passes changes in one case: a header block that waits
//! behind its stream's held data (the trailers of an answer waiting for the
//! client's window) is overtaken by other streams' blocks, so it goes
//! re-encoded as literals, which neither need nor change the client's HPACK
//! table. If the held block changed the runtime's table, the client's table
//! never will, and every later block of the connection goes re-encoded too
//! (`codec`). Frames the relay writes itself never touch either HPACK table,
//! and never split a header block (`outbound`).
//!
//! Parts: `codec` reassembles and decodes header blocks; `flow` is the
//! windows arithmetic; `streams` owns each stream's held frames, and
//! `answers` what they send as the client's windows allow and the credit
//! the runtime gets for it; `outbound` is each direction's queue; `closing`
//! the GOAWAYs, shutdown's drain and the client's failure; `requests` and
//! `responses` route the two directions' frames to those owners; `standin`
//! answers while the runtime is unreachable; this file owns the sockets.

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::sync::watch;
use tracing::debug;

use super::Endpoint;
use super::frame::{self, FrameError, HEAD_LEN, Head};
use super::hpack;
use super::socket::{Inbox, Socket};
use crate::metrics::Metrics;
use crate::reason::Recreated;
use crate::telemetry::Chain;
use answers::Answers;
use closing::Closing;
use codec::{Blocks, CodecError};
use outbound::Outbound;

mod answers;
mod closing;
mod codec;
mod flow;
mod frames;
mod outbound;
mod requests;
mod responses;
pub(super) mod standin;
mod streams;

/// How much the relay buffers towards one side before it stops reading
/// from the other: the far end's own flow control keeps it well below this.
const HIGH_WATER: usize = 256 << 10;

/// The most of one header block of the runtime's held until it ends
/// (grpc-go's header list limit, which containerd keeps): the client gets
/// blocks whole (see `outbound`).
const MAX_HELD_BLOCK: usize = hpack::MAX_LIST;

/// How long a connection that is ending (its runtime gone, or the client
/// broke the protocol) may take to hand the client what is queued for it.
const LINGER: Duration = Duration::from_secs(5);

/// How long a draining connection waits for the client to acknowledge the
/// drain's PING before it sends the final GOAWAY anyway.
const DRAIN_PING_WAIT: Duration = Duration::from_secs(2);

/// How long a connection that has opened no stream yet may, once shutdown
/// begins, wait for its first before it is drained. Such a connection was
/// accepted in shutdown's last moment and its client has a call to make:
/// h2-based clients (hyper) fail a call they had not sent yet when a GOAWAY
/// comes first, instead of retrying it elsewhere as grpc-go does.
const FIRST_STREAM_WAIT: Duration = Duration::from_millis(500);

/// How often a connection waiting for its first stream looks again.
const FIRST_STREAM_POLL: Duration = Duration::from_millis(5);

#[derive(Debug, thiserror::Error)]
pub(super) enum RelayError {
    #[error("the client did not open with the HTTP/2 connection preface")]
    Preface,
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("a {len}-byte frame exceeds the {limit}-byte limit its receiver set")]
    FrameTooLarge { len: usize, limit: usize },
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("the runtime sent PUSH_PROMISE, which gRPC never uses")]
    Push,
    #[error("stream {0} was opened after the final GOAWAY")]
    AfterGoaway(u32),
    #[error("a header block of more than {MAX_HELD_BLOCK} bytes")]
    BlockTooLarge,
    #[error("reading from the client")]
    Client(#[source] io::Error),
}

impl RelayError {
    /// The error code of the GOAWAY that tells the peer (RFC 9113 §7).
    fn code(&self) -> u32 {
        match self {
            Self::FrameTooLarge { .. } => frame::FRAME_SIZE_ERROR,
            Self::Codec(CodecError::Hpack(_)) => frame::COMPRESSION_ERROR,
            _ => frame::PROTOCOL_ERROR,
        }
    }

    /// The client's frames can still be told apart after this error, so
    /// the relay may go on reading its credit for what is held.
    fn framing_intact(&self) -> bool {
        matches!(
            self,
            Self::Codec(CodecError::Interleaved(_) | CodecError::Hpack(_)) | Self::AfterGoaway(_)
        )
    }
}

/// One client connection and its runtime connection.
pub(super) struct Relay {
    client: Socket,
    upstream: Socket,
    state: State,
    /// The connection began to end, and the caller knows (`Step::Ending`).
    ending: bool,
}

/// Why `Relay::poll` returned.
enum Step {
    Finished,
    /// The connection is ending: what is queued for the client still goes,
    /// for at most `LINGER`.
    Ending,
}

impl Relay {
    pub(super) fn new(
        client: UnixStream,
        upstream: UnixStream,
        endpoint: Endpoint,
        metrics: Arc<Metrics>,
        recreated: Option<Arc<Recreated>>,
    ) -> io::Result<Self> {
        Ok(Self {
            client: Socket::new(client)?,
            upstream: Socket::new(upstream)?,
            state: State::new(endpoint, metrics, recreated),
            ending: false,
        })
    }

    /// Relays until either side goes away; once `shutdown` turns true, asks
    /// the client to go elsewhere and finishes the calls in flight.
    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        self.state.metrics.upstream_connected();
        let mut draining = false;
        let linger = tokio::time::sleep(Duration::MAX);
        let ping_wait = tokio::time::sleep(Duration::MAX);
        // Set while shutdown waits for the connection's first stream.
        let mut first_stream_by = None;
        let first_stream = tokio::time::sleep(Duration::MAX);
        tokio::pin!(linger, ping_wait, first_stream);
        loop {
            tokio::select! {
                step = poll_fn(|cx| self.poll(cx)) => match step {
                    Step::Finished => break,
                    Step::Ending => {
                        let deadline = tokio::time::Instant::now() + LINGER;
                        linger.as_mut().reset(deadline);
                    }
                },
                _ = shutdown.wait_for(|stop| *stop), if !draining => {
                    draining = true;
                    first_stream_by = Some(tokio::time::Instant::now() + FIRST_STREAM_WAIT);
                    first_stream.as_mut().reset(tokio::time::Instant::now());
                }
                () = &mut first_stream, if first_stream_by.is_some() => {
                    let now = tokio::time::Instant::now();
                    let waited = first_stream_by.is_some_and(|by| now >= by);
                    if self.state.closing.last_client_stream() > 0 || waited {
                        first_stream_by = None;
                        self.state.drain();
                        ping_wait.as_mut().reset(now + DRAIN_PING_WAIT);
                    } else {
                        first_stream.as_mut().reset(now + FIRST_STREAM_POLL);
                    }
                }
                () = &mut ping_wait, if self.state.closing.pinged() => {
                    debug!("the client did not acknowledge the drain's PING in time");
                    self.state.drain_acked();
                }
                () = &mut linger => {
                    debug!("the client did not take what was queued for it in time");
                    break;
                }
            }
        }
        self.state.metrics.upstream_disconnected();
        self.client.close(self.state.ends.client_eof).await;
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        let Self {
            client,
            upstream,
            state,
            ending,
        } = self;
        loop {
            let mut progress = false;
            let ends = &mut state.ends;
            if ends.upstream_broken || ends.failed {
                state.to_upstream.clear();
            } else if !state.to_upstream.data().is_empty() {
                match upstream.poll_write(cx, state.to_upstream.data()) {
                    Poll::Ready(Ok(n)) => {
                        state.to_upstream.advance(n);
                        if state.to_upstream.data().is_empty() && upstream.drained().is_err() {
                            ends.upstream_broken = true;
                        }
                        progress = true;
                    }
                    // The runtime closed: what it sent before still reaches
                    // the client, and its end is seen by the reader.
                    Poll::Ready(Err(_)) => {
                        ends.upstream_broken = true;
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            } else if ends.client_eof && !ends.upstream_shut && state.to_upstream.is_empty() {
                // The client finished: let the runtime see it too.
                ends.upstream_shut = true;
                upstream.shutdown_write();
            }
            if !state.to_client.data().is_empty() {
                match client.poll_write(cx, state.to_client.data()) {
                    Poll::Ready(Ok(n)) => {
                        state.to_client.advance(n);
                        if state.to_client.data().is_empty() && client.drained().is_err() {
                            return Poll::Ready(Step::Finished);
                        }
                        progress = true;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Step::Finished),
                    Poll::Pending => {}
                }
            }
            if state.finished() {
                return Poll::Ready(Step::Finished);
            }
            if state.ending() && !*ending {
                *ending = true;
                return Poll::Ready(Step::Ending);
            }
            if state.reads_client() {
                match client.poll_read(cx, &mut state.from_client) {
                    Poll::Ready(Ok(0)) => {
                        state.ends.client_eof = true;
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => {
                        match state.closing.failed() {
                            true => state.credit_after_failure(),
                            false => {
                                if let Err(error) = state.client_frames() {
                                    state.fail(&error);
                                }
                            }
                        }
                        progress = true;
                    }
                    Poll::Ready(Err(error)) => {
                        // Only this client's connection ends.
                        debug!(error = %Chain(&RelayError::Client(error)), "client connection ended");
                        return Poll::Ready(Step::Finished);
                    }
                    Poll::Pending => {}
                }
            }
            // Held answers do not count here: they wait for their own
            // stream's window, and must not stop the others; nor does a
            // block that waits for its own end.
            let queued = state.to_client.len() - state.to_client.held_block();
            if !state.ends.failed && !state.ends.upstream_eof && queued < HIGH_WATER {
                match upstream.poll_read(cx, &mut state.from_upstream) {
                    Poll::Ready(Ok(0) | Err(_)) => {
                        state.upstream_gone();
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => {
                        if let Err(error) = state.upstream_frames() {
                            debug!(error = %Chain(&error), "the runtime broke the protocol");
                            state.ends.upstream_broken = true;
                            state.upstream_gone();
                        }
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }
}

/// How far each side has got.
#[derive(Debug, Default)]
struct Ends {
    preface_seen: bool,
    client_eof: bool,
    upstream_eof: bool,
    upstream_shut: bool,
    /// Writing to the runtime failed; what would go there is dropped.
    upstream_broken: bool,
    /// The client broke the protocol, or the relay gave up on the
    /// connection: only what is queued for the client still goes.
    failed: bool,
}

/// One relayed connection, apart from its sockets.
struct State {
    endpoint: Endpoint,
    metrics: Arc<Metrics>,
    recreated: Option<Arc<Recreated>>,
    from_client: Inbox,
    from_upstream: Inbox,
    to_upstream: Outbound,
    to_client: Outbound,
    ends: Ends,
    requests: Blocks,
    responses: Blocks,
    /// The streams, what they hold for the client, and its windows.
    answers: Answers,
    /// The largest frame the runtime accepts (what the client may send).
    upstream_max_frame: usize,
    closing: Closing,
}

impl State {
    fn new(endpoint: Endpoint, metrics: Arc<Metrics>, recreated: Option<Arc<Recreated>>) -> Self {
        Self {
            endpoint,
            metrics,
            recreated,
            from_client: Inbox::default(),
            from_upstream: Inbox::default(),
            to_upstream: Outbound::to_runtime(),
            to_client: Outbound::to_client(),
            ends: Ends::default(),
            requests: Blocks::new(hpack::Decoder::new()),
            // Every field is kept: a block may have to be re-encoded.
            responses: Blocks::new(hpack::Decoder::new().keeping(hpack::MAX_LIST)),
            answers: Answers::default(),
            upstream_max_frame: frame::DEFAULT_MAX_FRAME,
            closing: Closing::default(),
        }
    }

    /// Nothing more to do: the client has everything it will get, and the
    /// runtime is gone (or, draining, every call has finished).
    fn finished(&self) -> bool {
        if self.closing.failed() {
            // Once the GOAWAY is queued, or if a torn header block keeps
            // everything else back, only what is ready can still go.
            let stuck = self.to_client.block_open();
            return (self.closing.told() || stuck) && self.to_client.data().is_empty();
        }
        let settled = self.ends.upstream_eof
            || (self.closing.is_final() && self.answers.is_empty())
            || (self.ends.client_eof && self.to_upstream.is_empty() && self.answers.is_empty());
        settled && self.to_client.is_empty() && !self.answers.any_waiting()
    }

    /// Only what is queued for the client is left to do.
    fn ending(&self) -> bool {
        self.ends.failed || self.ends.upstream_eof
    }

    /// The client's bytes are read: normally while the runtime keeps up
    /// with them; after a failure only for the credit held answers need.
    fn reads_client(&self) -> bool {
        if self.ends.client_eof || self.to_upstream.len() >= HIGH_WATER {
            return false;
        }
        match self.closing.failed() {
            false => !self.ends.failed,
            true => self.closing.reads_after_failure(),
        }
    }

    /// The client broke the protocol: the runtime connection ends, and the
    /// client is told why (RFC 9113 §5.4.1) once the complete answers the
    /// relay holds for it have gone, as its windows allow, within `LINGER`.
    fn fail(&mut self, error: &RelayError) {
        debug!(error = %Chain(error), "client connection failed");
        self.ends.failed = true;
        self.to_upstream.clear();
        // A header block of the runtime's that will never end keeps
        // nothing back, unless some of it has gone already.
        self.to_client.abandon_block();
        self.to_client.preface();
        self.answers.drop_unfinished();
        match self.closing.fail(error) {
            // What the client sent after the bad frame may be credit.
            true => self.credit_after_failure(),
            false => self.settle_failure(),
        }
    }

    /// After a failure, the GOAWAY goes once nothing is held any more.
    fn settle_failure(&mut self) {
        let held = self.answers.any_waiting();
        self.closing.settle(&mut self.to_client, held);
    }

    /// Shutdown begins: the drain's GOAWAY and PING (`closing`).
    fn drain(&mut self) {
        self.closing.drain(&mut self.to_client);
    }

    /// The drain's PING was acknowledged, or not in time: the final GOAWAY.
    fn drain_acked(&mut self) {
        let opening = self.requests.open_stream();
        self.closing.drain_acked(&mut self.to_client, opening);
    }

    /// Sends what the client's windows now have room for.
    fn flush(&mut self) {
        let (to_client, to_upstream) = (&mut self.to_client, &mut self.to_upstream);
        self.answers.flush(to_client, to_upstream);
    }

    /// Stream `id` was reset: what it held is dropped (`answers`).
    fn drop_stream(&mut self, id: u32) {
        self.answers.drop_stream(id, &mut self.to_upstream);
    }
}

/// The fuzz target `relay_frames` (see `fuzzing`): both sides' bytes, as
/// records of a direction bit and a 15-bit length, fed to one relay whose
/// record says container `abc` was recreated. Whatever comes in, the relay
/// writes whole frames, and ends a connection it gives up on with GOAWAY;
/// it never panics.
pub(crate) fn fuzz(data: &[u8]) {
    feed(data);
}

/// What a relay writes to the client and to the runtime for `data` (see
/// `fuzz`), the runtime's end included.
fn feed(data: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let recreated = Arc::new(Recreated::in_memory());
    if let Err(error) = recreated.record("abc", "fuzz/crr", None) {
        unreachable!("an in-memory record cannot fail: {error}");
    }
    let endpoint = Endpoint::from_path("/fuzz.sock");
    let mut state = State::new(endpoint, Arc::default(), Some(recreated));
    state.from_client.extend(frame::PREFACE);
    let (mut to_client, mut to_upstream) = (Vec::new(), Vec::new());
    let mut rest = data;
    while let [high, low, tail @ ..] = rest {
        let len = (usize::from(high & 0x7f) << 8 | usize::from(*low)).min(tail.len());
        let (chunk, tail) = tail.split_at(len);
        rest = tail;
        match high & 0x80 {
            0 => {
                state.from_client.extend(chunk);
                if let Err(error) = state.client_frames() {
                    state.fail(&error);
                }
            }
            _ => {
                state.from_upstream.extend(chunk);
                if state.upstream_frames().is_err() {
                    state.ends.upstream_broken = true;
                    state.upstream_gone();
                }
            }
        }
        to_client.extend_from_slice(&state.to_client.take());
        to_upstream.extend_from_slice(&state.to_upstream.take());
        if state.ending() {
            break;
        }
    }
    state.upstream_gone();
    to_client.extend_from_slice(&state.to_client.take());
    let upstream = to_upstream
        .strip_prefix(frame::PREFACE)
        .unwrap_or(&to_upstream);
    assert!(whole_frames(upstream), "partial frame to the runtime");
    assert!(whole_frames(&to_client), "partial frame to the client");
    (to_client, to_upstream)
}

fn whole_frames(mut buf: &[u8]) -> bool {
    while let Some(head) = Head::parse(buf) {
        match buf.get(HEAD_LEN + head.len..) {
            Some(rest) => buf = rest,
            None => return false,
        }
    }
    buf.is_empty()
}

#[cfg(test)]
mod tests;
