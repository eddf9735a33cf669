//! The client-bound side of the streams: what each stream holds while the
//! client's windows are short, those windows, and the runtime's credit for
//! edited answers.
//!
//! Credit for an edited answer: the runtime gets stream credit for what it
//! sent once the client has taken it (so it never runs more than a window
//! ahead of the client on that stream), and connection credit at once,
//! since the bytes are out of the connection window's way in the relay;
//! only while the relay holds more than `flow::HELD_LIMIT` in all does
//! connection credit wait too (`flow::RuntimeCredit`), which bounds what a
//! client that never reads can make the relay hold.
//!
//! Every method writes the frames it decides on into the two queues it is
//! handed: `to_client` (DATA and held frames) and `to_upstream` (credit).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::flow::{ClientFlow, RuntimeCredit, Window};
use super::outbound::Outbound;
use super::streams::{Data, Edit, Piece, Stream, Streams};
use crate::proxy::call::{Call, UNAVAILABLE, UNKNOWN};
use crate::proxy::frame::{self, FrameError, HEAD_LEN, Head};
use crate::reason::{Editor, Recreated};

pub(super) struct Answers {
    streams: Streams,
    flow: ClientFlow,
    /// The largest frame the client accepts.
    client_max_frame: usize,
    /// The runtime's connection credit for edited bytes.
    runtime_credit: RuntimeCredit,
}

impl Default for Answers {
    fn default() -> Self {
        Self {
            streams: Streams::default(),
            flow: ClientFlow::default(),
            client_max_frame: frame::DEFAULT_MAX_FRAME,
            runtime_credit: RuntimeCredit::default(),
        }
    }
}

impl Answers {
    // --- what the client says ---

    /// The largest frame the client accepts (for re-encoded blocks too).
    pub(super) fn client_max_frame(&self) -> usize {
        self.client_max_frame
    }

    /// The client's SETTINGS_MAX_FRAME_SIZE, within RFC 9113 §6.5.2's
    /// range: a zero here would leave edited answers waiting for room that
    /// never comes.
    pub(super) fn set_client_max_frame(&mut self, value: u32) {
        let value = usize::try_from(value).unwrap_or(frame::DEFAULT_MAX_FRAME);
        self.client_max_frame = value.clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_FRAME_LIMIT);
    }

    /// The client's SETTINGS_INITIAL_WINDOW_SIZE, for every stream's window.
    pub(super) fn set_initial_window(&mut self, value: u32) {
        let delta = self.flow.initial_window(value);
        for edit in self.streams.edits_mut() {
            edit.window.grow(delta);
        }
    }

    /// The client's connection credit: what of it the runtime is to get
    /// (the rest paid back what the relay sent of its own).
    pub(super) fn connection_credit(&mut self, increment: u32) -> u32 {
        self.flow.credit(increment)
    }

    /// The client's credit for stream `id`: true when the relay runs that
    /// stream's flow control (an edited answer) and keeps it.
    pub(super) fn stream_credit(&mut self, id: u32, increment: u32) -> bool {
        match self.streams.get_mut(id).and_then(|s| s.edit.as_mut()) {
            Some(edit) => {
                edit.window.grow(i64::from(increment));
                true
            }
            None => false,
        }
    }

    /// A call opens; an edited one gets a window of the client's.
    pub(super) fn open(&mut self, id: u32, call: Call, edit: Option<Editing>) {
        let edit = edit.map(|(editor, recreated)| Edit {
            editor,
            recreated,
            window: self.flow.open(),
            uncredited: 0,
        });
        self.streams.insert(id, Stream::new(call, edit));
    }

    // --- what the runtime sends ---

    /// A DATA frame of the runtime's: on a stream the client reset (or
    /// never opened) it is dropped, counted against the connection; else
    /// it goes on as it came when it can, or held, or edited. It ends the
    /// call when it ends the stream (a response without trailers is no
    /// complete gRPC answer).
    pub(super) fn data(
        &mut self,
        head: Head,
        frame: &[u8],
        to_client: &mut Outbound,
        to_upstream: &mut Outbound,
    ) -> Result<(), FrameError> {
        let id = head.stream;
        let end_stream = head.flags & frame::END_STREAM != 0;
        let Some(stream) = self.streams.get_mut(id) else {
            let passed = self.pass(head, frame, to_client);
            if !passed && let Ok(len @ 1..) = u32::try_from(head.len) {
                // No room: dropped here, and the runtime gets its credit.
                to_upstream.own(|out| frame::window_update(0, len, out));
            }
            return Ok(());
        };
        let range = head.data(&frame[HEAD_LEN..])?;
        match stream.edit.as_mut() {
            None => {
                // The common case: the frame goes on as it came.
                let holds = stream.holds();
                let passed = !holds && self.pass(head, frame, to_client);
                if !passed {
                    let data = Data {
                        padding: head.len - range.len(),
                        data: Bytes::copy_from_slice(&frame[HEAD_LEN..][range]),
                        end_stream,
                    };
                    self.send(id, data, to_client, to_upstream);
                }
            }
            Some(edit) => {
                let data = Bytes::copy_from_slice(&frame[HEAD_LEN..][range]);
                let mut out = edit
                    .editor
                    .push(data, edit.recreated.as_ref())
                    .unwrap_or_default();
                if end_stream && let Some(rest) = edit.editor.finish() {
                    let mut joined = BytesMut::from(&out[..]);
                    joined.extend_from_slice(&rest);
                    out = joined.freeze();
                }
                let data = Data {
                    data: out,
                    end_stream,
                    padding: 0,
                };
                self.send(id, data, to_client, to_upstream);
                self.credit_edited(id, head.len, end_stream, to_upstream);
            }
        }
        if end_stream {
            self.end_call(id, UNKNOWN);
        }
        Ok(())
    }

    /// The runtime's trailers begin on stream `id`: what its editor still
    /// holds goes before them.
    pub(super) fn finish_edit(
        &mut self,
        id: u32,
        to_client: &mut Outbound,
        to_upstream: &mut Outbound,
    ) {
        let rest = self
            .streams
            .get_mut(id)
            .and_then(|s| s.edit.as_mut())
            .and_then(|e| e.editor.finish());
        if let Some(data) = rest {
            let data = Data {
                data,
                end_stream: false,
                padding: 0,
            };
            self.send(id, data, to_client, to_upstream);
        }
    }

    /// A header block of the runtime's begins on stream `id`: true when it
    /// is to wait behind what the stream holds (re-encoded once complete).
    pub(super) fn hold_block(&mut self, id: u32) -> bool {
        let held = self.streams.get_mut(id).is_some_and(|s| s.holds());
        if held {
            self.streams.begin_block(id);
        }
        held
    }

    /// A header block of stream `id` is complete, re-encoded as `frames`
    /// when the codec kept its fields: they take their place behind what
    /// the stream holds, or go now. Either way the stream has its response
    /// headers only now: a block cut short never reaches the client.
    pub(super) fn block_ended(&mut self, id: u32, frames: Option<Bytes>, to_client: &mut Outbound) {
        let stream = self.streams.get_mut(id);
        if let Some(frames) = frames {
            match stream {
                Some(stream) if stream.collecting() => stream.end_block(frames),
                _ => to_client.own(|out| out.extend_from_slice(&frames)),
            }
        }
        if let Some(stream) = self.streams.get_mut(id) {
            stream.responded = true;
        }
    }

    /// The runtime's RST_STREAM for `id`: true when it waits behind a
    /// complete answer the stream still holds (grpc-go's NO_ERROR after the
    /// trailers must not overtake them); false when it goes now.
    pub(super) fn hold_reset(&mut self, id: u32, frame: &[u8]) -> bool {
        match self.streams.get_mut(id) {
            Some(stream) if stream.ended && stream.holds() => {
                self.streams.hold_frames(id, Bytes::copy_from_slice(frame));
                true
            }
            _ => false,
        }
    }

    /// Passes a DATA frame on as it came when the client's connection
    /// window has room for it; false when it does not.
    pub(super) fn pass(&mut self, head: Head, frame: &[u8], to_client: &mut Outbound) -> bool {
        if self.flow.room(None) < head.len {
            return false;
        }
        self.flow.spend(head.len, None);
        to_client.relay(head, frame);
        true
    }

    /// Queues DATA for the client on stream `id`, and sends what the
    /// client's windows have room for.
    pub(super) fn send(
        &mut self,
        id: u32,
        data: Data,
        to_client: &mut Outbound,
        to_upstream: &mut Outbound,
    ) {
        self.streams.hold(id, data);
        self.flush_stream(id, to_client, to_upstream);
    }

    /// Returns the credit for `received` bytes of an edited stream (see the
    /// module docs).
    pub(super) fn credit_edited(
        &mut self,
        id: u32,
        received: usize,
        end_stream: bool,
        to_upstream: &mut Outbound,
    ) {
        let Ok(received @ 1..) = u32::try_from(received) else {
            return;
        };
        let held = self.streams.held_bytes();
        if let Some(now) = self.runtime_credit.received(received, held) {
            to_upstream.own(|out| frame::window_update(0, now, out));
        }
        let Some(stream) = self.streams.get_mut(id) else {
            return;
        };
        let holds = stream.holds();
        let Some(edit) = stream.edit.as_mut().filter(|_| !end_stream) else {
            return;
        };
        if holds {
            edit.uncredited = edit.uncredited.saturating_add(received);
        } else {
            to_upstream.own(|out| frame::window_update(id, received, out));
        }
    }

    /// The call on stream `id` ended with `code`: the stream is forgotten
    /// once what it holds has gone.
    pub(super) fn end_call(&mut self, id: u32, code: u32) {
        if let Some(stream) = self.streams.get_mut(id) {
            stream.call.finish(code);
            stream.ended = true;
            if !stream.holds() {
                self.streams.remove(id);
            }
        }
    }

    /// Stream `id` was reset: what it held is dropped, and the runtime gets
    /// back the connection credit for unedited bytes the client will never
    /// see (the relay credited edited ones itself).
    pub(super) fn drop_stream(&mut self, id: u32, to_upstream: &mut Outbound) {
        let Some(stream) = self.streams.remove(id) else {
            return;
        };
        if let Ok(dropped @ 1..) = u32::try_from(stream.held_unedited()) {
            to_upstream.own(|out| frame::window_update(0, dropped, out));
        }
        self.release_credit(to_upstream);
    }

    // --- the connection's end ---

    /// No stream is open or holds anything.
    pub(super) fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// Some stream holds frames for the client.
    pub(super) fn any_waiting(&self) -> bool {
        self.streams.any_waiting()
    }

    /// The client failed: the answers that will never be complete are
    /// dropped; complete ones still go, as its windows allow.
    pub(super) fn drop_unfinished(&mut self) {
        for id in self.streams.ids() {
            if self.streams.get_mut(id).is_some_and(|s| !s.ended) {
                self.streams.remove(id);
            }
        }
    }

    /// Everything is dropped: the client loses the connection.
    pub(super) fn forget_all(&mut self) {
        self.streams = Streams::default();
    }

    /// The runtime went away: each call it processed (up to `processed`)
    /// and did not end is ended with `UNAVAILABLE` and `message`, after
    /// what its stream holds; the others are forgotten, for the client may
    /// retry them elsewhere.
    pub(super) fn runtime_gone(&mut self, processed: u32, message: &str, to_client: &mut Outbound) {
        for id in self.streams.ids() {
            let Some(stream) = self.streams.get_mut(id) else {
                continue;
            };
            if stream.ended {
                continue;
            }
            if id > processed {
                self.streams.remove(id);
                continue;
            }
            let answer = frame::grpc_status_frame(id, stream.responded, UNAVAILABLE, message);
            stream.call.finish(UNAVAILABLE);
            stream.abandon_block();
            if stream.holds() {
                stream.ended = true;
                self.streams.hold_frames(id, answer.freeze());
            } else {
                to_client.own(|out| out.extend_from_slice(&answer));
                self.streams.remove(id);
            }
        }
    }

    // --- what the windows let go ---

    /// Sends what the client's windows now have room for, stream by stream.
    pub(super) fn flush(&mut self, to_client: &mut Outbound, to_upstream: &mut Outbound) {
        if !self.streams.any_waiting() {
            return;
        }
        for id in self.streams.waiting() {
            self.flush_stream(id, to_client, to_upstream);
        }
        self.release_credit(to_upstream);
    }

    /// Sends what stream `id` holds, as far as the windows allow; once it
    /// holds nothing, it stops waiting (and, ended, is forgotten).
    pub(super) fn flush_stream(
        &mut self,
        id: u32,
        to_client: &mut Outbound,
        to_upstream: &mut Outbound,
    ) {
        let max_frame = self.client_max_frame();
        let Self { streams, flow, .. } = self;
        let Some(stream) = streams.get_mut(id) else {
            return;
        };
        let edited = stream.edit.is_some();
        loop {
            let (piece, window) = stream.front_and_window();
            let Some(piece) = piece else { break };
            match piece {
                Piece::Frames(frames) => {
                    let frames = frames.clone();
                    to_client.own(|out| out.extend_from_slice(&frames));
                }
                Piece::Data(data) => {
                    let (sent, done) = send_some(flow, to_client, max_frame, id, data, window);
                    let padding = data.padding;
                    let end_stream = data.end_stream;
                    stream.sent(sent);
                    if !done {
                        break;
                    }
                    if let Ok(padding @ 1..) = u32::try_from(padding) {
                        // Padding the runtime counted and the client never
                        // sees: the relay gives that credit back itself.
                        to_upstream.own(|out| {
                            frame::window_update(0, padding, out);
                            if !end_stream && !edited {
                                frame::window_update(id, padding, out);
                            }
                        });
                    }
                }
            }
            stream.pop();
        }
        if stream.holds() {
            return;
        }
        if let Some(edit) = stream.edit.as_mut().filter(|e| e.uncredited > 0) {
            let credit = std::mem::take(&mut edit.uncredited);
            if !stream.ended {
                to_upstream.own(|out| frame::window_update(id, credit, out));
            }
        }
        let ended = stream.ended;
        streams.settle(id);
        if ended {
            streams.remove(id);
        }
    }

    /// Connection credit kept back while the relay held too much goes once
    /// it holds less.
    fn release_credit(&mut self, to_upstream: &mut Outbound) {
        if let Some(credit) = self.runtime_credit.release(self.streams.held_bytes()) {
            to_upstream.own(|out| frame::window_update(0, credit, out));
        }
    }
}

/// What an edited call's answer is edited with.
pub(super) type Editing = (Editor, Arc<Recreated>);

/// Sends what fits of `data` on stream `id` as DATA frames; gives back the
/// bytes sent, and whether that was all.
fn send_some(
    flow: &mut ClientFlow,
    out: &mut Outbound,
    max_frame: usize,
    id: u32,
    data: &mut Data,
    mut window: Option<&mut Window>,
) -> (usize, bool) {
    let mut sent = 0;
    loop {
        let room = flow.room(window.as_deref().copied());
        let n = room.min(data.data.len()).min(max_frame);
        if n == 0 && !data.data.is_empty() {
            return (sent, false);
        }
        let piece = data.data.split_to(n);
        let last = data.data.is_empty();
        let flags = match last && data.end_stream {
            true => frame::END_STREAM,
            false => 0,
        };
        if n > 0 || flags != 0 {
            out.own(|out| frame::put(out, frame::DATA, flags, id, &piece));
            flow.spend(n, window.as_deref_mut());
            sent += n;
        }
        if last {
            return (sent, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::metrics::Metrics;
    use crate::proxy::frame::HEAD_LEN;

    /// The DATA bytes per stream in `out`, and the connection credit.
    fn sent(out: &Outbound) -> (usize, u32) {
        let (mut buf, mut data, mut credit) = (out.data(), 0, 0);
        while let Ok(Some((head, frame))) = frame::next(buf, frame::MAX_FRAME_LIMIT) {
            match head.kind {
                frame::DATA => data += head.len,
                frame::WINDOW_UPDATE if head.stream == 0 => {
                    credit += head.increment(&frame[HEAD_LEN..]).unwrap_or(0);
                }
                _ => {}
            }
            buf = &buf[frame.len()..];
        }
        (data, credit)
    }

    #[test]
    fn an_answer_beyond_the_clients_window_waits_for_its_credit_and_a_reset_gives_it_back() {
        let metrics = Arc::new(Metrics::default());
        let mut answers = Answers::default();
        let (mut to_client, mut to_upstream) = (Outbound::to_runtime(), Outbound::to_runtime());
        answers.open(1, Call::start(&metrics, None), None);
        let answer = Data {
            data: Bytes::from(vec![7; 70_000]),
            end_stream: false,
            padding: 0,
        };
        answers.send(1, answer, &mut to_client, &mut to_upstream);
        // The client's connection window: 65 535 bytes, in frames of at
        // most 16 384.
        assert_eq!(sent(&to_client), (65_535, 0));
        assert!(answers.streams.any_waiting());
        assert_eq!(answers.connection_credit(1_000), 1_000);
        answers.flush(&mut to_client, &mut to_upstream);
        assert_eq!(sent(&to_client), (66_535, 0));
        assert!(answers.streams.any_waiting());
        // Reset: the runtime gets back the connection credit for what the
        // client will never see.
        answers.drop_stream(1, &mut to_upstream);
        assert_eq!(sent(&to_upstream), (0, 70_000 - 66_535));
        assert!(answers.streams.is_empty());
    }

    #[test]
    fn the_clients_largest_frame_stays_in_range() {
        let mut answers = Answers::default();
        answers.set_client_max_frame(0);
        assert_eq!(answers.client_max_frame(), frame::DEFAULT_MAX_FRAME);
        answers.set_client_max_frame(u32::MAX);
        assert_eq!(answers.client_max_frame(), frame::MAX_FRAME_LIMIT);
        answers.set_client_max_frame(65_536);
        assert_eq!(answers.client_max_frame(), 65_536);
    }
}
