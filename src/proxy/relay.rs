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
            || (self.closing.is_final() && self.answers.streams.is_empty())
            || (self.ends.client_eof
                && self.to_upstream.is_empty()
                && self.answers.streams.is_empty());
        settled && self.to_client.is_empty() && !self.answers.streams.any_waiting()
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
        for id in self.answers.streams.ids() {
            if self.answers.streams.get_mut(id).is_some_and(|s| !s.ended) {
                // Its answer will never be complete.
                self.answers.streams.remove(id);
            }
        }
        match self.closing.fail(error) {
            // What the client sent after the bad frame may be credit.
            true => self.credit_after_failure(),
            false => self.settle_failure(),
        }
    }

    /// After a failure, the GOAWAY goes once nothing is held any more.
    fn settle_failure(&mut self) {
        let held = self.answers.streams.any_waiting();
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

/// Takes the client's connection preface from the front of `inbox`:
/// `Ok(true)` once it has come whole (and is consumed), `Ok(false)` while
/// what came may still be its start.
fn take_preface(inbox: &mut Inbox) -> Result<bool, RelayError> {
    match frame::preface(inbox.data()) {
        None => Err(RelayError::Preface),
        Some(false) => Ok(false),
        Some(true) => {
            inbox.consume(frame::PREFACE.len());
            Ok(true)
        }
    }
}

/// Hands each whole frame at the front of `inbox` (head and all its bytes)
/// to `each`, in order, consuming it once handled, up to a frame still
/// coming. A frame longer than `limit` is the peer's error. The relay's
/// two directions and the stand-in read frames this one way.
fn each_frame(
    inbox: &mut Inbox,
    limit: usize,
    mut each: impl FnMut(Head, &[u8]) -> Result<(), RelayError>,
) -> Result<(), RelayError> {
    while let Some((head, frame)) =
        frame::next(inbox.data(), limit).map_err(|len| RelayError::FrameTooLarge { len, limit })?
    {
        each(head, frame)?;
        inbox.consume(frame.len());
    }
    Ok(())
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
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn seed(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/fuzz/corpus/relay_frames/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    fn frames(mut buf: &[u8]) -> Vec<(Head, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(head) = Head::parse(buf) {
            out.push((head, buf[HEAD_LEN..HEAD_LEN + head.len].to_vec()));
            buf = &buf[HEAD_LEN + head.len..];
        }
        out
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    /// A ContainerStatus answer about a recreated container: the client
    /// gets the edited status, and the runtime gets its credit back from the
    /// relay (the client's own stream credit is not forwarded).
    #[test]
    fn an_edited_answer_is_rewritten_and_credited() {
        let (to_client, to_upstream) = feed(&seed("unary_edit"));
        assert!(contains(&to_client, crate::reason::REASON.as_bytes()));
        assert!(!contains(&to_client, b"Error"));
        let updates: Vec<(u32, u32)> = frames(to_upstream.strip_prefix(frame::PREFACE).unwrap())
            .into_iter()
            .filter(|(h, _)| h.kind == frame::WINDOW_UPDATE)
            .map(|(h, p)| (h.stream, h.increment(&p).unwrap()))
            .collect();
        // The relay credits the runtime for the DATA frame it received, on
        // the connection and the stream. The client's connection credit
        // covers the edited bytes it got, which the relay already paid for,
        // so only the rest goes on; its credit for the stream, over by then,
        // passes as it came.
        let data_len = frames(&to_client)
            .iter()
            .filter(|(h, _)| h.kind == frame::DATA)
            .map(|(h, _)| h.len as u32)
            .sum::<u32>();
        assert_eq!(updates.len(), 4, "{updates:?}");
        assert_eq!(updates[..2], [(0, updates[0].1), (1, updates[0].1)]);
        assert!(data_len > updates[0].1, "the edit made the answer longer");
        assert_eq!(updates[2], (0, 1000 - data_len));
        assert_eq!(updates[3], (1, 1000));
    }

    #[test]
    fn the_preface_is_taken_whole_or_refused() {
        let mut inbox = Inbox::default();
        inbox.extend(&frame::PREFACE[..10]);
        assert!(!take_preface(&mut inbox).unwrap());
        assert_eq!(inbox.data().len(), 10, "nothing consumed yet");
        inbox.extend(&frame::PREFACE[10..]);
        inbox.extend(b"rest");
        assert!(take_preface(&mut inbox).unwrap());
        assert_eq!(inbox.data(), b"rest");
        let mut other = Inbox::default();
        other.extend(b"GET / HTTP/1.1\r\n");
        assert!(matches!(take_preface(&mut other), Err(RelayError::Preface)));
    }

    #[test]
    fn frames_are_handed_over_whole_in_order_and_only_once_handled() {
        let first = frame_bytes(frame::PING, 0, 0, &[1; 8]);
        let second = frame_bytes(frame::DATA, 0, 1, b"hello");
        let third = frame_bytes(frame::DATA, 0, 3, b"coming");
        let mut inbox = Inbox::default();
        inbox.extend(&first);
        inbox.extend(&second);
        inbox.extend(&third[..HEAD_LEN + 2]);
        let mut seen = Vec::new();
        each_frame(&mut inbox, frame::DEFAULT_MAX_FRAME, |head, whole| {
            seen.push((head.kind, head.stream, whole.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                (frame::PING, 0, first.len()),
                (frame::DATA, 1, second.len())
            ]
        );
        assert_eq!(
            inbox.data(),
            &third[..HEAD_LEN + 2],
            "the frame still coming stays"
        );
        // A frame that fails stays unconsumed; one over the limit is refused.
        inbox.extend(&third[HEAD_LEN + 2..]);
        let failed = each_frame(&mut inbox, frame::DEFAULT_MAX_FRAME, |_, _| {
            Err(RelayError::Preface)
        });
        assert!(failed.is_err());
        assert_eq!(inbox.data(), third.as_slice());
        let large = each_frame(&mut inbox, 4, |_, _| Ok(()));
        assert!(matches!(
            large,
            Err(RelayError::FrameTooLarge { len: 6, limit: 4 })
        ));
    }

    fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        frame::put(&mut out, kind, flags, stream, payload);
        out.to_vec()
    }

    fn record(upstream: bool, bytes: &[u8]) -> Vec<u8> {
        let len = u16::try_from(bytes.len()).unwrap();
        let mut out = (len | if upstream { 0x8000 } else { 0 })
            .to_be_bytes()
            .to_vec();
        out.extend_from_slice(bytes);
        out
    }

    /// The client's frames, then the runtime's, then the client's credit
    /// of 100 000 bytes on stream 1 (enough for any held answer), through
    /// the relay.
    fn feed_then_credit(client: &[u8], upstream: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let more = frame_bytes(frame::WINDOW_UPDATE, 0, 1, &100_000u32.to_be_bytes());
        let input = [
            record(false, client),
            record(true, upstream),
            record(false, &more),
        ]
        .concat();
        feed(&input)
    }

    /// A ContainerStatus answer (the wire_edit seed) as one gRPC message.
    fn container_status_message() -> Vec<u8> {
        let message = &std::fs::read(format!(
            "{}/fuzz/corpus/wire_edit/container_status",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()[1..];
        let mut grpc = vec![0];
        grpc.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        grpc.extend_from_slice(message);
        grpc
    }

    /// A request header block for `path`: literals, never indexed.
    fn request_block(path: &[u8]) -> Vec<u8> {
        let mut block = vec![0x83, 0x86, 0x04, u8::try_from(path.len()).unwrap()];
        block.extend_from_slice(path);
        block
    }

    /// `grpc-status: 0` trailers, a literal never indexed.
    const OK_TRAILERS: [u8; 15] = [
        0, 11, b'g', b'r', b'p', b'c', b'-', b's', b't', b'a', b't', b'u', b's', 1, b'0',
    ];

    const CONTAINER_STATUS: &[u8] = b"/runtime.v1.RuntimeService/ContainerStatus";

    /// Every byte the runtime sends on an edited stream comes back to it as
    /// connection credit, also when it arrives while earlier edited bytes wait
    /// for the client's window and the stream ends before they go.
    #[test]
    fn edited_bytes_received_while_others_wait_are_credited_back() {
        let grpc = container_status_message();
        // A 10-byte stream window, then the call.
        let mut client = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]);
        let block = request_block(CONTAINER_STATUS);
        client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &block));
        // Two messages: the first fills the window and waits; the second
        // arrives while it waits; then the trailers.
        let mut upstream = frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]);
        upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
        upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
        let flags = frame::END_HEADERS | frame::END_STREAM;
        upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &OK_TRAILERS));
        // The client reads it all: stream credit only (the connection
        // window is large enough).
        let (to_client, to_upstream) = feed_then_credit(&client, &upstream);
        let body: usize = frames(&to_client)
            .iter()
            .filter(|(h, _)| h.kind == frame::DATA)
            .map(|(h, _)| h.len)
            .sum();
        assert!(body > 2 * grpc.len(), "both messages arrive, edited");
        let credited: u32 = frames(to_upstream.strip_prefix(frame::PREFACE).unwrap())
            .iter()
            .filter(|(h, _)| h.kind == frame::WINDOW_UPDATE && h.stream == 0)
            .map(|(h, p)| h.increment(p).unwrap())
            .sum();
        assert_eq!(credited, 2 * u32::try_from(grpc.len()).unwrap());
    }

    /// An edited answer held by its 10-byte stream window delays only its
    /// stream: a Version answer on stream 3 and a PING ACK pass it. Its
    /// trailers, and the runtime's RST_STREAM(NO_ERROR) after them, wait
    /// for its data and follow it once the client credits the stream.
    #[test]
    fn a_held_answer_delays_only_its_stream_and_keeps_its_order() {
        let grpc = container_status_message();
        let mut client = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]);
        let edited = request_block(CONTAINER_STATUS);
        client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &edited));
        let version = request_block(b"/runtime.v1.RuntimeService/Version");
        client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &version));
        let flags = frame::END_HEADERS | frame::END_STREAM;
        let mut upstream = frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]);
        upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
        upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &OK_TRAILERS));
        upstream.extend(frame_bytes(frame::RST_STREAM, 0, 1, &[0; 4]));
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &[0x88]));
        upstream.extend(frame_bytes(frame::DATA, 0, 3, &[0, 0, 0, 0, 2, 10, 0]));
        upstream.extend(frame_bytes(frame::HEADERS, flags, 3, &OK_TRAILERS));
        upstream.extend(frame_bytes(frame::PING, frame::ACK, 0, &[7; 8]));
        let before = [record(false, &client), record(true, &upstream)].concat();
        let (held, _) = feed(&before);
        let held = frames(&held);
        let kinds = |stream: u32| -> Vec<u8> {
            held.iter()
                .filter(|(h, _)| h.stream == stream)
                .map(|(h, _)| h.kind)
                .collect()
        };
        // Stream 1: its headers and 10 bytes; stream 3 complete; the ACK.
        assert_eq!(kinds(1), [frame::HEADERS, frame::DATA], "{held:?}");
        assert_eq!(kinds(3), [frame::HEADERS, frame::DATA, frame::HEADERS]);
        assert!(held.iter().any(|(h, _)| h.kind == frame::PING));

        let (to_client, _) = feed_then_credit(&client, &upstream);
        let stream1: Vec<_> = frames(&to_client)
            .into_iter()
            .filter(|(h, _)| h.stream == 1)
            .collect();
        let (last, rest) = stream1.split_last().unwrap();
        assert_eq!(last.0.kind, frame::RST_STREAM, "the reset comes last");
        let (trailers, data) = rest.split_last().unwrap();
        assert_eq!(trailers.0.kind, frame::HEADERS);
        // Re-encoded: the same field, never to be indexed.
        assert_eq!(trailers.1[0], 0x10);
        assert_eq!(trailers.1[1..], OK_TRAILERS[1..]);
        let body: Vec<u8> = data[1..].iter().flat_map(|(_, p)| p.clone()).collect();
        assert!(contains(&body, crate::reason::REASON.as_bytes()));
    }

    /// A literal with incremental indexing, new name (RFC 7541 §6.2.1): it
    /// enters the table, as grpc-go's encoder does with most fields.
    fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x40, u8::try_from(name.len()).unwrap()];
        out.extend_from_slice(name);
        out.push(u8::try_from(value.len()).unwrap());
        out.extend_from_slice(value);
        out
    }

    /// The client's view: every header block it got, decoded in order
    /// against one table, as (stream, fields).
    fn client_blocks(to_client: &[u8]) -> Vec<(u32, Vec<(String, String)>)> {
        let mut decoder = hpack::Decoder::new();
        let mut blocks = Vec::new();
        let mut open: Option<(u32, Vec<(String, String)>)> = None;
        for (head, payload) in frames(to_client) {
            if head.kind != frame::HEADERS && head.kind != frame::CONTINUATION {
                continue;
            }
            let (stream, mut fields) = open.take().unwrap_or((head.stream, Vec::new()));
            decoder
                .feed(head.fragment(&payload).unwrap(), &mut |n, v| {
                    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                    fields.push((text(n), text(v.unwrap())));
                })
                .unwrap_or_else(|e| panic!("stream {stream}: {e}"));
            match head.flags & frame::END_HEADERS {
                0 => open = Some((stream, fields)),
                _ => {
                    decoder.end().unwrap();
                    blocks.push((stream, fields));
                }
            }
        }
        blocks
    }

    /// The runtime may use the client's HPACK table. Held trailers that
    /// add to it are overtaken by other streams' blocks that refer to what
    /// they added (the runtime encoded them after the trailers): the
    /// client still decodes every block to what the runtime meant, the held
    /// ones included, and so does a block that changes the table after that.
    #[test]
    fn held_trailers_that_change_the_table_are_overtaken_safely() {
        let grpc = container_status_message();
        let settings = [0, 4, 0, 0, 0, 10, 0, 1, 0, 0, 0x10, 0];
        let mut client = frame_bytes(frame::SETTINGS, 0, 0, &settings);
        let edited = request_block(CONTAINER_STATUS);
        client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &edited));
        let version = request_block(b"/runtime.v1.RuntimeService/Version");
        let flags = frame::END_HEADERS | frame::END_STREAM;
        client.extend(frame_bytes(frame::HEADERS, flags, 3, &version));
        client.extend(frame_bytes(frame::HEADERS, flags, 5, &version));

        let mut upstream = frame_bytes(frame::SETTINGS, 0, 0, &[]);
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]));
        upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
        // Held: its window is 10 bytes. Table: x-trace (62), grpc-status (63).
        let held = [
            indexed_literal(b"grpc-status", b"0"),
            indexed_literal(b"x-trace", b"a"),
        ]
        .concat();
        upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &held));
        // Refers to both, and adds x-more (62, the others move up).
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &[0x88]));
        let trailers3 = [vec![0x80 | 63, 0x80 | 62], indexed_literal(b"x-more", b"b")].concat();
        // Split: the re-encoded block must come whole too.
        let (first, second) = trailers3.split_at(3);
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_STREAM, 3, first));
        upstream.extend(frame_bytes(
            frame::CONTINUATION,
            frame::END_HEADERS,
            3,
            second,
        ));
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 5, &[0x88]));
        upstream.extend(frame_bytes(
            frame::HEADERS,
            flags,
            5,
            &[0x80 | 64, 0x80 | 62],
        ));
        let (to_client, to_upstream) = feed_then_credit(&client, &upstream);
        let sent = frames(to_upstream.strip_prefix(frame::PREFACE).unwrap());
        assert_eq!(
            sent[0].1, settings,
            "the client's SETTINGS pass as they came"
        );
        let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
        let status = pair(":status", "200");
        let blocks = client_blocks(&to_client);
        let order: Vec<u32> = blocks.iter().map(|(s, _)| *s).collect();
        assert_eq!(order, [1, 3, 3, 5, 5, 1], "the held trailers come last");
        let ok = pair("grpc-status", "0");
        let trace = pair("x-trace", "a");
        assert_eq!(blocks[0].1, [status]);
        assert_eq!(
            blocks[2].1,
            [ok.clone(), trace.clone(), pair("x-more", "b")]
        );
        assert_eq!(blocks[4].1, [ok.clone(), pair("x-more", "b")]);
        assert_eq!(blocks[5].1, [ok, trace]);
        let body: Vec<u8> = frames(&to_client)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::DATA && h.stream == 1)
            .flat_map(|(_, p)| p)
            .collect();
        assert!(contains(&body, crate::reason::REASON.as_bytes()));
    }

    /// Blocks that only refer to the table pass as they came, around held
    /// trailers that only refer to it too.
    #[test]
    fn blocks_that_leave_the_table_alone_pass_as_they_came() {
        let grpc = container_status_message();
        let mut client = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]);
        let edited = request_block(CONTAINER_STATUS);
        client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &edited));
        let version = request_block(b"/runtime.v1.RuntimeService/Version");
        let flags = frame::END_HEADERS | frame::END_STREAM;
        client.extend(frame_bytes(frame::HEADERS, flags, 3, &version));
        client.extend(frame_bytes(frame::HEADERS, flags, 5, &version));
        let mut upstream = frame_bytes(frame::SETTINGS, 0, 0, &[]);
        // Stream 3 answers first and fills the table.
        let first = indexed_literal(b"grpc-status", b"0");
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &[0x88]));
        upstream.extend(frame_bytes(frame::HEADERS, flags, 3, &first));
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]));
        upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
        upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &[0x80 | 62]));
        upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 5, &[0x88]));
        upstream.extend(frame_bytes(frame::HEADERS, flags, 5, &[0x80 | 62]));
        let (to_client, _) = feed_then_credit(&client, &upstream);
        let headers: Vec<(u32, Vec<u8>)> = frames(&to_client)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::HEADERS)
            .map(|(h, p)| (h.stream, p))
            .collect();
        assert_eq!(headers[2], (1, vec![0x88]));
        assert_eq!(headers[3], (5, vec![0x88]));
        assert_eq!(headers[4], (5, vec![0x80 | 62]), "not re-encoded");
        assert_eq!(headers[5].0, 1, "the held trailers come last");
        let blocks = client_blocks(&to_client);
        let ok = ("grpc-status".to_string(), "0".to_string());
        assert_eq!(blocks[5].1, [ok]);
    }

    /// With a 10-byte stream window, the edited answer reaches the client
    /// in pieces that each fit, split and padded input notwithstanding.
    #[test]
    fn a_tight_window_gets_the_answer_in_pieces() {
        let (to_client, _) = feed(&seed("tight_window"));
        let data: Vec<_> = frames(&to_client)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::DATA)
            .collect();
        assert!(data.len() > 10);
        assert!(data.iter().all(|(h, _)| h.len <= 16));
        let body: Vec<u8> = data.into_iter().flat_map(|(_, p)| p).collect();
        assert!(contains(&body, crate::reason::REASON.as_bytes()));
    }

    /// A runtime's header block reaches the client only once complete;
    /// one past `MAX_HELD_BLOCK` is the runtime's protocol error, and the
    /// client still gets whole frames: its call UNAVAILABLE, then GOAWAY.
    #[test]
    fn a_runtime_block_goes_whole_and_is_bounded() {
        let mut state = State::new(Endpoint::from_path("/t.sock"), Arc::default(), None);
        state.from_client.extend(frame::PREFACE);
        let version = request_block(b"/runtime.v1.RuntimeService/Version");
        let flags = frame::END_HEADERS | frame::END_STREAM;
        state
            .from_client
            .extend(&frame_bytes(frame::HEADERS, flags, 1, &version));
        state.client_frames().unwrap();
        state
            .from_upstream
            .extend(&frame_bytes(frame::SETTINGS, 0, 0, &[]));
        // `:status: 200`, indexed, over and over.
        let piece = vec![0x88; frame::DEFAULT_MAX_FRAME];
        state
            .from_upstream
            .extend(&frame_bytes(frame::HEADERS, 0, 1, &piece));
        state.upstream_frames().unwrap();
        let mut to_client = state.to_client.take().to_vec();
        assert!(
            frames(&to_client)
                .iter()
                .all(|(h, _)| h.kind == frame::SETTINGS),
            "nothing of the open block goes"
        );
        let mut result = Ok(());
        for _ in 0..=MAX_HELD_BLOCK / piece.len() {
            state
                .from_upstream
                .extend(&frame_bytes(frame::CONTINUATION, 0, 1, &piece));
            result = state.upstream_frames();
            if result.is_err() {
                break;
            }
            assert!(state.to_client.take().is_empty());
        }
        assert!(
            matches!(result, Err(RelayError::BlockTooLarge)),
            "{result:?}"
        );
        state.ends.upstream_broken = true;
        state.upstream_gone();
        to_client.extend_from_slice(&state.to_client.take());
        let frames = frames(&to_client);
        assert!(!frames.iter().any(|(h, _)| h.kind == frame::CONTINUATION));
        let status = frames
            .iter()
            .find(|(h, _)| h.kind == frame::HEADERS && h.stream == 1)
            .unwrap();
        assert!(contains(&status.1, b"14"));
        assert_eq!(frames.last().unwrap().0.kind, frame::GOAWAY);
    }

    /// The runtime going away answers the open call UNAVAILABLE and tells
    /// the client to go.
    #[test]
    fn the_runtime_going_away_ends_open_calls_unavailable() {
        let (to_client, _) = feed(&seed("reset_then_gone"));
        let frames = frames(&to_client);
        let last = frames.last().unwrap();
        assert_eq!(last.0.kind, frame::GOAWAY);
        // Stream 1 was reset by the client; stream 3 was still open.
        let status = frames
            .iter()
            .find(|(h, _)| h.kind == frame::HEADERS && h.stream == 3)
            .unwrap();
        assert!(contains(&status.1, b"grpc-status"));
        assert!(contains(&status.1, b"14"));
        assert!(!frames.iter().any(|(h, _)| h.kind == frame::HEADERS
            && h.stream == 1
            && h.flags & frame::END_STREAM != 0));
    }
}
