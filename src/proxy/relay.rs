//! The fast path: one client connection relayed frame by frame onto one
//! runtime connection of its own.
//!
//! Nothing is re-encoded. The connection preface, SETTINGS, PINGs, stream
//! IDs, HPACK blocks and DATA frames go through as they came, so the two
//! ends negotiate with each other and the relay costs about what a byte
//! splice costs. The relay still reads every frame header and decodes every
//! header block (HPACK is stateful; a skipped block would desynchronise its
//! table), which is what it needs for three jobs:
//! - counting calls: the method from a request's `:path`, the code from the
//!   response's `grpc-status`;
//! - answering `UNAVAILABLE` on the calls in flight when the runtime goes away;
//! - editing the status answers of recreated containers (`reason`). An edit
//!   changes the length of a response, so for those streams the relay takes
//!   over flow control: it credits the runtime for what it received, sends
//!   the client no more than the client's windows allow, and keeps the
//!   client's connection-level credits for the extra bytes to itself.
//!
//! Frames the relay writes itself never touch either HPACK table: the status
//! answers use only literals without indexing and a static-table entry.

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tracing::debug;

use super::body::{Call, UNAVAILABLE, UNKNOWN, unavailable_message};
use super::frame::{self, FrameError, HEAD_LEN, Head};
use super::hpack;
use super::socket::{Inbox, Socket};
use super::{Endpoint, editor_for};
use crate::metrics::Metrics;
use crate::reason::{Editor, Recreated};
use codec::{Block, Blocks, CodecError};

mod codec;

/// How much the relay buffers towards one side before it stops reading
/// from the other: the far end's own flow control keeps it well below this.
const HIGH_WATER: usize = 256 << 10;

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
    #[error("reading from the client: {0}")]
    Client(#[source] io::Error),
}

/// One client connection and its runtime connection.
pub(super) struct Relay {
    client: Socket,
    upstream: Socket,
    state: State,
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
        })
    }

    /// Relays until either side goes away; once `shutdown` turns true, asks
    /// the client to go elsewhere and finishes the calls in flight.
    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        self.state.metrics.upstream_connected();
        let ended = tokio::select! {
            ended = poll_fn(|cx| self.poll(cx)) => Some(ended),
            _ = shutdown.wait_for(|stop| *stop) => None,
        };
        let ended = match ended {
            Some(ended) => ended,
            None => {
                self.state.drain();
                poll_fn(|cx| self.poll(cx)).await
            }
        };
        if let Err(error) = ended {
            // Only this client's connection ends.
            debug!(%error, "client connection ended with an error");
        }
        self.state.metrics.upstream_disconnected();
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), RelayError>> {
        let Self {
            client,
            upstream,
            state,
        } = self;
        loop {
            let mut progress = false;
            if state.upstream_broken {
                state.to_upstream.clear();
            } else if !state.to_upstream.is_empty() {
                match upstream.poll_write(cx, &state.to_upstream) {
                    Poll::Ready(Ok(n)) => {
                        state.to_upstream.advance(n);
                        if state.to_upstream.is_empty() && upstream.drained().is_err() {
                            state.upstream_broken = true;
                        }
                        progress = true;
                    }
                    // The runtime closed: what it sent before still reaches
                    // the client, and its end is seen by the reader.
                    Poll::Ready(Err(_)) => {
                        state.upstream_broken = true;
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            } else if state.client_eof && !state.upstream_shut {
                // The client finished: let the runtime see it too.
                state.upstream_shut = true;
                upstream.shutdown_write();
            }
            if !state.to_client.is_empty() {
                match client.poll_write(cx, &state.to_client) {
                    Poll::Ready(Ok(n)) => {
                        state.to_client.advance(n);
                        if state.to_client.is_empty() && client.drained().is_err() {
                            return Poll::Ready(Ok(()));
                        }
                        progress = true;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                    Poll::Pending => {}
                }
            }
            if state.finished() {
                return Poll::Ready(Ok(()));
            }
            if !state.client_eof && state.to_upstream.len() < HIGH_WATER {
                match client.poll_read(cx, &mut state.from_client) {
                    Poll::Ready(Ok(0)) => {
                        state.client_eof = true;
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => {
                        state.client_frames()?;
                        progress = true;
                    }
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(RelayError::Client(error))),
                    Poll::Pending => {}
                }
            }
            if !state.upstream_eof && state.to_client.len() + state.held_bytes < HIGH_WATER {
                match upstream.poll_read(cx, &mut state.from_upstream) {
                    Poll::Ready(Ok(0) | Err(_)) => {
                        state.upstream_gone();
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => {
                        state.upstream_frames()?;
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

/// A frame on its way to the client, held until the client's flow-control
/// windows have room for it. Everything after a held frame waits behind it:
/// header blocks must reach the client in the order the runtime encoded them.
enum Held {
    Frame(Bytes),
    Data(Data),
    /// The stream is over once everything before this has gone.
    Forget(u32),
}

/// DATA for the client, sent in as many frames as its windows require.
struct Data {
    stream: u32,
    data: Bytes,
    end_stream: bool,
    /// Padding the runtime sent (and counted) with it.
    padding: usize,
    /// The relay runs this stream's flow control (see `Edit`).
    edited: bool,
}

impl Data {
    fn edited(stream: u32, data: Bytes, end_stream: bool) -> Self {
        Self {
            stream,
            data,
            end_stream,
            padding: 0,
            edited: true,
        }
    }
}

struct Stream {
    call: Call,
    /// The runtime has sent the response headers.
    responded: bool,
    edit: Option<Edit>,
}

/// A stream whose response the relay edits, and so whose flow control it
/// runs itself.
struct Edit {
    editor: Editor,
    recreated: Arc<Recreated>,
    /// The client's window for this stream.
    window: i64,
    /// Received from the runtime on this stream, not yet credited back.
    uncredited: u32,
}

enum Drain {
    No,
    /// GOAWAY is due once the runtime's header block in progress ends.
    Due,
    Sent,
}

struct State {
    endpoint: Endpoint,
    metrics: Arc<Metrics>,
    recreated: Option<Arc<Recreated>>,
    from_client: Inbox,
    from_upstream: Inbox,
    to_upstream: BytesMut,
    to_client: BytesMut,
    preface_seen: bool,
    client_eof: bool,
    upstream_eof: bool,
    upstream_shut: bool,
    /// Writing to the runtime failed; what would go there is dropped.
    upstream_broken: bool,
    requests: Blocks,
    responses: Blocks,
    streams: HashMap<u32, Stream>,
    held: VecDeque<Held>,
    held_bytes: usize,
    /// The client's connection window, as the relay has spent it.
    client_window: i64,
    /// Connection-level credit the client will return for edited bytes the
    /// runtime never sent; kept back from the runtime.
    owed: i64,
    client_initial_window: i64,
    client_max_frame: usize,
    /// The largest frame the runtime accepts (what the client may send).
    upstream_max_frame: usize,
    last_client_stream: u32,
    /// The last stream the runtime said it would process (its GOAWAY).
    upstream_goaway: Option<u32>,
    /// Received from the runtime on edited streams, not yet credited back on
    /// the connection. Kept apart from the streams' own counts, which go
    /// with the stream when it ends.
    uncredited: u32,
    drain: Drain,
}

impl State {
    fn new(endpoint: Endpoint, metrics: Arc<Metrics>, recreated: Option<Arc<Recreated>>) -> Self {
        Self {
            endpoint,
            metrics,
            recreated,
            from_client: Inbox::default(),
            from_upstream: Inbox::default(),
            to_upstream: BytesMut::new(),
            to_client: BytesMut::new(),
            preface_seen: false,
            client_eof: false,
            upstream_eof: false,
            upstream_shut: false,
            upstream_broken: false,
            requests: Blocks::new(hpack::Decoder::new()),
            responses: Blocks::new(hpack::Decoder::new()),
            streams: HashMap::new(),
            held: VecDeque::new(),
            held_bytes: 0,
            client_window: frame::DEFAULT_WINDOW,
            owed: 0,
            client_initial_window: frame::DEFAULT_WINDOW,
            client_max_frame: frame::DEFAULT_MAX_FRAME,
            upstream_max_frame: frame::DEFAULT_MAX_FRAME,
            last_client_stream: 0,
            upstream_goaway: None,
            uncredited: 0,
            drain: Drain::No,
        }
    }

    /// Nothing more to do: the runtime is gone (or, draining, every call has
    /// finished) and the client has everything it will get.
    fn finished(&self) -> bool {
        let settled = self.upstream_eof
            || (matches!(self.drain, Drain::Sent) && self.streams.is_empty())
            || (self.client_eof && self.to_upstream.is_empty() && self.streams.is_empty());
        settled && self.to_client.is_empty() && self.held.is_empty()
    }

    // --- client to runtime ---

    fn client_frames(&mut self) -> Result<(), RelayError> {
        // Taken out while its frames are handled, which need `self`.
        let mut inbox = std::mem::take(&mut self.from_client);
        let handled = self.client_frames_in(&mut inbox);
        self.from_client = inbox;
        handled
    }

    fn client_frames_in(&mut self, inbox: &mut Inbox) -> Result<(), RelayError> {
        if !self.preface_seen {
            let n = inbox.len().min(frame::PREFACE.len());
            if inbox.data()[..n] != frame::PREFACE[..n] {
                return Err(RelayError::Preface);
            }
            if n < frame::PREFACE.len() {
                return Ok(());
            }
            self.to_upstream.extend_from_slice(frame::PREFACE);
            inbox.consume(n);
            self.preface_seen = true;
        }
        while let Some(head) = Head::parse(inbox.data()) {
            if head.len > self.upstream_max_frame {
                return Err(RelayError::FrameTooLarge {
                    len: head.len,
                    limit: self.upstream_max_frame,
                });
            }
            let Some(frame) = inbox.data().get(..HEAD_LEN + head.len) else {
                break;
            };
            self.client_frame(head, frame)?;
            inbox.consume(HEAD_LEN + head.len);
        }
        Ok(())
    }

    fn client_frame(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        let payload = &frame[HEAD_LEN..];
        self.requests.check(head)?;
        match head.kind {
            frame::HEADERS | frame::CONTINUATION => {
                if let Some(block) = self.requests.frame(head, payload)? {
                    self.request(block);
                }
            }
            frame::SETTINGS if head.flags & frame::ACK == 0 => {
                for (id, value) in head.settings(payload)? {
                    self.client_setting(id, value);
                }
            }
            frame::WINDOW_UPDATE => return self.client_window_update(head, payload, frame),
            frame::RST_STREAM => {
                // The call's metrics say CANCELLED as it drops.
                self.streams.remove(&head.stream);
            }
            _ => {}
        }
        self.to_upstream.extend_from_slice(frame);
        Ok(())
    }

    fn request(&mut self, block: Block) {
        if block.stream <= self.last_client_stream {
            // Trailers from the client, or a stream the runtime will refuse.
            return;
        }
        self.last_client_stream = block.stream;
        let path = block.fields.path.unwrap_or_default();
        let path = std::str::from_utf8(&path).unwrap_or_default();
        let edit = editor_for(path, self.recreated.as_ref()).map(|(editor, recreated)| Edit {
            editor,
            recreated,
            window: self.client_initial_window,
            uncredited: 0,
        });
        let call = Call::start(&self.metrics, path);
        self.streams.insert(
            block.stream,
            Stream {
                call,
                responded: false,
                edit,
            },
        );
    }

    fn client_setting(&mut self, id: u16, value: u32) {
        match id {
            frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                let delta = i64::from(value) - self.client_initial_window;
                self.client_initial_window = i64::from(value);
                for edit in self.streams.values_mut().filter_map(|s| s.edit.as_mut()) {
                    edit.window += delta;
                }
            }
            frame::SETTINGS_MAX_FRAME_SIZE => {
                // RFC 9113 §6.5.2's range: a zero here would leave edited
                // answers waiting for room that never comes.
                let value = usize::try_from(value).unwrap_or(frame::DEFAULT_MAX_FRAME);
                self.client_max_frame =
                    value.clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_FRAME_LIMIT);
            }
            frame::SETTINGS_HEADER_TABLE_SIZE => self.responses.allow_table(value),
            _ => {}
        }
    }

    fn client_window_update(
        &mut self,
        head: Head,
        payload: &[u8],
        frame: &[u8],
    ) -> Result<(), RelayError> {
        let increment = head.increment(payload)?;
        if head.stream == 0 {
            self.client_window += i64::from(increment);
            let repaid = self.owed.min(i64::from(increment));
            self.owed -= repaid;
            let forward = i64::from(increment) - repaid;
            if repaid == 0 {
                self.to_upstream.extend_from_slice(frame);
            } else if let Ok(forward @ 1..) = u32::try_from(forward) {
                frame::window_update(0, forward, &mut self.to_upstream);
            }
        } else {
            match self
                .streams
                .get_mut(&head.stream)
                .and_then(|s| s.edit.as_mut())
            {
                // The relay credits the runtime for this stream itself.
                Some(edit) => edit.window += i64::from(increment),
                None => self.to_upstream.extend_from_slice(frame),
            }
        }
        if !self.held.is_empty() {
            self.flush_held();
        }
        Ok(())
    }

    // --- runtime to client ---

    fn upstream_frames(&mut self) -> Result<(), RelayError> {
        let mut inbox = std::mem::take(&mut self.from_upstream);
        let handled = self.upstream_frames_in(&mut inbox);
        self.from_upstream = inbox;
        handled
    }

    fn upstream_frames_in(&mut self, inbox: &mut Inbox) -> Result<(), RelayError> {
        // The client's limit; a runtime frame above it would be an error
        // at the client anyway, and this bounds what the relay buffers.
        let limit = self.client_max_frame.max(frame::DEFAULT_MAX_FRAME);
        while let Some(head) = Head::parse(inbox.data()) {
            if head.len > limit {
                return Err(RelayError::FrameTooLarge {
                    len: head.len,
                    limit,
                });
            }
            let Some(frame) = inbox.data().get(..HEAD_LEN + head.len) else {
                break;
            };
            self.upstream_frame(head, frame)?;
            inbox.consume(HEAD_LEN + head.len);
            if matches!(self.drain, Drain::Due) && self.responses.open().is_none() {
                self.send_goaway();
            }
        }
        Ok(())
    }

    fn upstream_frame(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        self.responses.check(head)?;
        match head.kind {
            frame::DATA => return self.upstream_data(head, frame),
            frame::HEADERS | frame::CONTINUATION => {
                let decoded = self.responses.frame(head, &frame[HEAD_LEN..])?;
                if head.kind == frame::HEADERS {
                    self.response_headers(head);
                }
                self.send_frame(frame);
                if let Some(block) = decoded.filter(|b| b.end_stream) {
                    self.end_call(block.stream, block.fields.grpc_status.unwrap_or(UNKNOWN));
                }
                return Ok(());
            }
            frame::SETTINGS if head.flags & frame::ACK == 0 => {
                for (id, value) in head.settings(&frame[HEAD_LEN..])? {
                    match id {
                        frame::SETTINGS_HEADER_TABLE_SIZE => self.requests.allow_table(value),
                        frame::SETTINGS_MAX_FRAME_SIZE => {
                            let value = usize::try_from(value).unwrap_or(frame::DEFAULT_MAX_FRAME);
                            self.upstream_max_frame = self.upstream_max_frame.max(value);
                        }
                        _ => {}
                    }
                }
            }
            frame::RST_STREAM => {
                self.send_frame(frame);
                self.forget(head.stream);
                return Ok(());
            }
            frame::GOAWAY => {
                let last = frame
                    .get(HEAD_LEN..HEAD_LEN + 4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff);
                self.upstream_goaway = last.or(Some(0));
            }
            frame::PUSH_PROMISE => return Err(RelayError::Push),
            _ => {}
        }
        self.send_frame(frame);
        Ok(())
    }

    /// Before a response's headers (or its trailers) go on: what the editor
    /// still holds goes first.
    fn response_headers(&mut self, head: Head) {
        let Some(stream) = self.streams.get_mut(&head.stream) else {
            return;
        };
        stream.responded = true;
        if head.flags & frame::END_STREAM == 0 {
            return;
        }
        if let Some(rest) = stream.edit.as_mut().and_then(|e| e.editor.finish()) {
            self.send_data(Data::edited(head.stream, rest, false));
        }
    }

    fn upstream_data(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        let end_stream = head.flags & frame::END_STREAM != 0;
        let edit = self
            .streams
            .get_mut(&head.stream)
            .and_then(|s| s.edit.as_mut());
        let Some(edit) = edit else {
            if self.held.is_empty() && self.room(head.stream, false) >= head.len {
                // The common case: the frame goes on as it came.
                self.spend(head.len, head.stream, false);
                self.to_client.extend_from_slice(frame);
            } else {
                let range = head.data(&frame[HEAD_LEN..])?;
                self.send_data(Data {
                    stream: head.stream,
                    padding: head.len - range.len(),
                    data: Bytes::copy_from_slice(&frame[HEAD_LEN..][range]),
                    end_stream,
                    edited: false,
                });
            }
            if end_stream {
                // A response without trailers is no complete gRPC answer.
                self.end_call(head.stream, UNKNOWN);
            }
            return Ok(());
        };
        let range = head.data(&frame[HEAD_LEN..])?;
        let data = Bytes::copy_from_slice(&frame[HEAD_LEN..][range]);
        let mut out = edit
            .editor
            .push(data, edit.recreated.as_ref())
            .unwrap_or_default();
        if end_stream {
            if let Some(rest) = edit.editor.finish() {
                let mut joined = BytesMut::from(&out[..]);
                joined.extend_from_slice(&rest);
                out = joined.freeze();
            }
        }
        let received = u32::try_from(head.len).unwrap_or(u32::MAX);
        if self.held.is_empty() {
            credit(&mut self.to_upstream, head.stream, received, !end_stream);
        } else {
            // Credit waits until the client has taken what waits before it,
            // so the runtime cannot run further ahead of the client.
            self.uncredited = self.uncredited.saturating_add(received);
            if !end_stream {
                edit.uncredited = edit.uncredited.saturating_add(received);
            }
        }
        self.send_data(Data::edited(head.stream, out, end_stream));
        if end_stream {
            self.end_call(head.stream, UNKNOWN);
        }
        Ok(())
    }

    fn end_call(&mut self, stream: u32, code: u32) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.call.finish(code);
        }
        self.forget(stream);
    }

    fn forget(&mut self, stream: u32) {
        if self.held.is_empty() {
            self.streams.remove(&stream);
        } else {
            self.held.push_back(Held::Forget(stream));
        }
    }

    fn send_frame(&mut self, frame: &[u8]) {
        if self.held.is_empty() {
            self.to_client.extend_from_slice(frame);
        } else {
            self.held_bytes += frame.len();
            self.held
                .push_back(Held::Frame(Bytes::copy_from_slice(frame)));
        }
    }

    /// Sends `data` now as far as the client's windows allow; the rest
    /// waits in `held`.
    fn send_data(&mut self, mut data: Data) {
        if self.held.is_empty() && self.send_some(&mut data) {
            return;
        }
        self.held_bytes += data.data.len();
        self.held.push_back(Held::Data(data));
    }

    /// Sends what fits of `d` as DATA frames; true once all of it is sent.
    fn send_some(&mut self, d: &mut Data) -> bool {
        loop {
            let n = self
                .room(d.stream, d.edited)
                .min(d.data.len())
                .min(self.client_max_frame);
            if n == 0 && !d.data.is_empty() {
                return false;
            }
            let piece = d.data.split_to(n);
            let last = d.data.is_empty();
            if n > 0 || d.end_stream {
                let flags = match last && d.end_stream {
                    true => frame::END_STREAM,
                    false => 0,
                };
                Head {
                    len: n,
                    kind: frame::DATA,
                    flags,
                    stream: d.stream,
                }
                .encode(&mut self.to_client);
                self.to_client.extend_from_slice(&piece);
                self.spend(n, d.stream, d.edited);
            }
            if last {
                // Padding the runtime counted and the client never sees:
                // the relay gives that credit back itself.
                if let Ok(padding @ 1..) = u32::try_from(d.padding) {
                    credit(
                        &mut self.to_upstream,
                        d.stream,
                        padding,
                        !d.end_stream && !d.edited,
                    );
                }
                return true;
            }
        }
    }

    /// How many DATA bytes the client accepts now on `stream`.
    fn room(&self, stream: u32, edited: bool) -> usize {
        let mut room = self.client_window;
        if edited {
            // The runtime keeps within the client's window for streams the
            // relay does not edit; for edited ones the relay must.
            if let Some(edit) = self.streams.get(&stream).and_then(|s| s.edit.as_ref()) {
                room = room.min(edit.window);
            }
        }
        usize::try_from(room).unwrap_or(0)
    }

    fn spend(&mut self, len: usize, stream: u32, edited: bool) {
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        self.client_window -= len;
        if edited {
            self.owed += len;
            if let Some(edit) = self.streams.get_mut(&stream).and_then(|s| s.edit.as_mut()) {
                edit.window -= len;
            }
        }
    }

    /// Sends what the client's windows now have room for, in order.
    fn flush_held(&mut self) {
        while let Some(front) = self.held.pop_front() {
            match front {
                Held::Frame(frame) => {
                    self.held_bytes -= frame.len();
                    self.to_client.extend_from_slice(&frame);
                }
                Held::Forget(stream) => {
                    self.streams.remove(&stream);
                }
                Held::Data(mut data) => {
                    let before = data.data.len();
                    let done = self.send_some(&mut data);
                    self.held_bytes -= before - data.data.len();
                    if !done {
                        self.held.push_front(Held::Data(data));
                        break;
                    }
                }
            }
        }
        if self.held.is_empty() && self.uncredited > 0 {
            frame::window_update(0, self.uncredited, &mut self.to_upstream);
            self.uncredited = 0;
            for (&id, stream) in &mut self.streams {
                if let Some(edit) = stream.edit.as_mut().filter(|e| e.uncredited > 0) {
                    frame::window_update(id, edit.uncredited, &mut self.to_upstream);
                    edit.uncredited = 0;
                }
            }
        }
    }

    /// The runtime connection closed: every call still open ends with
    /// `UNAVAILABLE` naming the endpoint, then the client is told to go.
    fn upstream_gone(&mut self) {
        if self.upstream_eof {
            return;
        }
        self.upstream_eof = true;
        if self.responses.open().is_some() || !self.held.is_empty() {
            // Nothing can be added cleanly: the client loses the connection.
            self.held.clear();
            self.held_bytes = 0;
            return;
        }
        let message = unavailable_message(&self.endpoint, &"the connection closed");
        let processed = self.upstream_goaway.unwrap_or(u32::MAX >> 1);
        let mut open: Vec<u32> = self
            .streams
            .keys()
            .copied()
            .filter(|&id| id <= processed)
            .collect();
        open.sort_unstable();
        for id in open {
            if let Some(mut stream) = self.streams.remove(&id) {
                let answer = frame::grpc_status_frame(id, stream.responded, UNAVAILABLE, &message);
                self.to_client.extend_from_slice(&answer);
                stream.call.finish(UNAVAILABLE);
            }
        }
        frame::goaway(
            self.last_client_stream,
            frame::NO_ERROR,
            &mut self.to_client,
        );
    }

    /// Shutdown: tell the client to open no more streams here (RFC 9113
    /// §6.8: the largest stream ID first), and let the calls in flight end.
    fn drain(&mut self) {
        self.drain = Drain::Due;
        if self.responses.open().is_none() {
            self.send_goaway();
        }
    }

    fn send_goaway(&mut self) {
        self.drain = Drain::Sent;
        let mut out = BytesMut::new();
        frame::goaway(u32::MAX >> 1, frame::NO_ERROR, &mut out);
        self.send_frame(&out);
    }
}

/// Returns `received` bytes of credit to the runtime, on the connection and
/// (while it is open) on the stream.
fn credit(out: &mut BytesMut, stream: u32, received: u32, stream_open: bool) {
    if received == 0 {
        return;
    }
    frame::window_update(0, received, out);
    if stream_open {
        frame::window_update(stream, received, out);
    }
}

/// The fuzz target `relay_frames` (see `fuzzing`): both sides' bytes, as
/// records of a direction bit and a 15-bit length, fed to one relay whose
/// record says container `abc` was recreated. Whatever comes in, the relay
/// writes whole frames or gives up on the connection; it never panics.
pub(crate) fn fuzz(data: &[u8]) {
    let _ = feed(data);
}

/// What a relay writes to the client and to the runtime for `data` (see
/// `fuzz`), the runtime's end included; `None` if it gave up.
fn feed(data: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let recreated = Arc::new(Recreated::in_memory());
    recreated.record("abc", "fuzz/crr").ok()?;
    let endpoint = Endpoint::from_path("/fuzz.sock");
    let mut state = State::new(endpoint, Arc::default(), Some(recreated));
    state.from_client.extend(frame::PREFACE);
    let (mut to_client, mut to_upstream) = (Vec::new(), Vec::new());
    let mut rest = data;
    while let [high, low, tail @ ..] = rest {
        let len = (usize::from(high & 0x7f) << 8 | usize::from(*low)).min(tail.len());
        let (chunk, tail) = tail.split_at(len);
        rest = tail;
        let fed = match high & 0x80 {
            0 => {
                state.from_client.extend(chunk);
                state.client_frames()
            }
            _ => {
                state.from_upstream.extend(chunk);
                state.upstream_frames()
            }
        };
        fed.ok()?;
        to_client.extend_from_slice(&state.to_client.split());
        to_upstream.extend_from_slice(&state.to_upstream.split());
    }
    state.upstream_gone();
    to_client.extend_from_slice(&state.to_client.split());
    let upstream = to_upstream
        .strip_prefix(frame::PREFACE)
        .unwrap_or(&to_upstream);
    assert!(whole_frames(upstream), "partial frame to the runtime");
    assert!(whole_frames(&to_client), "partial frame to the client");
    Some((to_client, to_upstream))
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
        let (to_client, to_upstream) = feed(&seed("unary_edit")).unwrap();
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

    fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        Head {
            len: payload.len(),
            kind,
            flags,
            stream,
        }
        .encode(&mut out);
        out.extend_from_slice(payload);
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

    /// Every byte the runtime sends on an edited stream comes back to it as
    /// connection credit, also when it arrives while earlier edited bytes wait
    /// for the client's window and the stream ends before they go.
    #[test]
    fn edited_bytes_received_while_others_wait_are_credited_back() {
        let message = &std::fs::read(format!(
            "{}/fuzz/corpus/wire_edit/container_status",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()[1..];
        let mut grpc = vec![0];
        grpc.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        grpc.extend_from_slice(message);
        let path = b"/runtime.v1.RuntimeService/ContainerStatus";
        let mut block = vec![0x83, 0x86, 0x44, u8::try_from(path.len()).unwrap()];
        block.extend_from_slice(path);
        // A 10-byte stream window, then the call.
        let mut client = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]);
        client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &block));
        // Two messages: the first fills the window and waits; the second
        // arrives while it waits; then the trailers.
        let mut upstream = frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]);
        upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
        upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
        let trailers = [
            0, 11, b'g', b'r', b'p', b'c', b'-', b's', b't', b'a', b't', b'u', b's', 1, b'0',
        ];
        let flags = frame::END_HEADERS | frame::END_STREAM;
        upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &trailers));
        // The client reads it all: stream credit only (the connection
        // window is large enough).
        let more = frame_bytes(frame::WINDOW_UPDATE, 0, 1, &100_000u32.to_be_bytes());
        let input = [
            record(false, &client),
            record(true, &upstream),
            record(false, &more),
        ]
        .concat();

        let (to_client, to_upstream) = feed(&input).unwrap();
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

    /// With a 10-byte stream window, the edited answer reaches the client
    /// in pieces that each fit, split and padded input notwithstanding.
    #[test]
    fn a_tight_window_gets_the_answer_in_pieces() {
        let (to_client, _) = feed(&seed("tight_window")).unwrap();
        let data: Vec<_> = frames(&to_client)
            .into_iter()
            .filter(|(h, _)| h.kind == frame::DATA)
            .collect();
        assert!(data.len() > 10);
        assert!(data.iter().all(|(h, _)| h.len <= 16));
        let body: Vec<u8> = data.into_iter().flat_map(|(_, p)| p).collect();
        assert!(contains(&body, crate::reason::REASON.as_bytes()));
    }

    /// The runtime going away answers the open call UNAVAILABLE and tells
    /// the client to go.
    #[test]
    fn the_runtime_going_away_ends_open_calls_unavailable() {
        let (to_client, _) = feed(&seed("reset_then_gone")).unwrap();
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
