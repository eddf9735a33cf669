//! Frames from the runtime, on their way to the client (what a stream
//! holds meanwhile, and the credit for it, is `answers`'s).

use bytes::{Bytes, BytesMut};

use super::frames::each_frame;
use super::streams::Data;
use super::{MAX_HELD_BLOCK, RelayError, State};
use crate::proxy::body::{UNAVAILABLE, UNKNOWN, unavailable_message};
use crate::proxy::frame::{self, HEAD_LEN, Head};
use crate::proxy::socket::Inbox;

impl State {
    pub(super) fn upstream_frames(&mut self) -> Result<(), RelayError> {
        let mut inbox = std::mem::take(&mut self.from_upstream);
        let handled = self.upstream_frames_in(&mut inbox);
        self.from_upstream = inbox;
        handled
    }

    fn upstream_frames_in(&mut self, inbox: &mut Inbox) -> Result<(), RelayError> {
        // The client's limit; a runtime frame above it would be an error
        // at the client anyway, and this bounds what the relay buffers.
        let limit = self.answers.client_max_frame();
        each_frame(inbox, limit, |head, frame| self.upstream_frame(head, frame))
    }

    fn upstream_frame(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        self.responses.check(head)?;
        match head.kind {
            frame::DATA => return self.upstream_data(head, frame),
            frame::HEADERS | frame::CONTINUATION => return self.response_block(head, frame),
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
                match self.answers.streams.get_mut(head.stream) {
                    // A complete answer still held: the reset (grpc-go's
                    // NO_ERROR after the trailers) must not overtake it.
                    Some(stream) if stream.ended && stream.holds() => {
                        let frame = Bytes::copy_from_slice(frame);
                        self.answers.streams.hold_frames(head.stream, frame);
                    }
                    _ => {
                        self.to_client.relay(head, frame);
                        self.drop_stream(head.stream);
                    }
                }
                return Ok(());
            }
            frame::GOAWAY => return self.upstream_goaway(head, frame),
            frame::PUSH_PROMISE => return Err(RelayError::Push),
            _ => {}
        }
        self.to_client.relay(head, frame);
        Ok(())
    }

    /// The runtime's GOAWAY goes on, with a last-stream ID no higher than
    /// any the client was already sent.
    fn upstream_goaway(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        let payload = &frame[HEAD_LEN..];
        let [a, b, c, d, e, f, g, h, debug @ ..] = payload else {
            return Err(frame::FrameError::Malformed {
                kind: head.kind,
                stream: head.stream,
            }
            .into());
        };
        let last = u32::from_be_bytes([*a, *b, *c, *d]) & frame::MAX_STREAM;
        match self.closing.upstream_goaway(last) {
            sent if sent == last => self.to_client.relay(head, frame),
            sent => {
                let code = u32::from_be_bytes([*e, *f, *g, *h]);
                self.to_client
                    .own(|out| frame::goaway(sent, code, debug, out));
            }
        }
        Ok(())
    }

    /// A HEADERS or CONTINUATION frame. A stream's trailers wait behind
    /// the data it holds, and go re-encoded; every other block goes on at
    /// once, as it came unless the codec says it must be re-encoded too.
    fn response_block(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        let id = head.stream;
        let held = match head.kind {
            frame::HEADERS => {
                if head.flags & frame::END_STREAM != 0 {
                    // What the editor still holds goes before the trailers.
                    let rest = self
                        .answers
                        .streams
                        .get_mut(id)
                        .and_then(|s| s.edit.as_mut())
                        .and_then(|e| e.editor.finish());
                    if let Some(rest) = rest {
                        self.send(id, rest, false, 0);
                    }
                }
                let held = self.answers.streams.get_mut(id).is_some_and(|s| s.holds());
                if held {
                    self.answers.streams.begin_block(id);
                }
                held
            }
            // A CONTINUATION belongs to the block under way.
            _ => false,
        };
        let decoded = self.responses.frame(head, &frame[HEAD_LEN..], held)?;
        let captured = match &decoded {
            Some(block) => block.fields.all.is_some(),
            None => self.responses.capturing(),
        };
        if !captured {
            self.to_client.relay(head, frame);
            if self.to_client.held_block() > MAX_HELD_BLOCK {
                return Err(RelayError::BlockTooLarge);
            }
        }
        let Some(block) = decoded else {
            return Ok(());
        };
        if let Some(fields) = &block.fields.all {
            let frames = frame::header_block(
                block.stream,
                block.end_stream,
                fields,
                self.answers.client_max_frame(),
            );
            match self.answers.streams.get_mut(block.stream) {
                Some(stream) if stream.collecting() => stream.end_block(frames.freeze()),
                _ => self.to_client.own(|out| out.extend_from_slice(&frames)),
            }
        }
        if let Some(stream) = self.answers.streams.get_mut(block.stream) {
            // Only now: a block cut short never reaches the client.
            stream.responded = true;
        }
        if block.end_stream {
            let code = block.fields.grpc_status.unwrap_or(UNKNOWN);
            self.answers.end_call(block.stream, code);
        }
        self.flush_stream(block.stream);
        Ok(())
    }

    fn upstream_data(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        let id = head.stream;
        let end_stream = head.flags & frame::END_STREAM != 0;
        let Some(stream) = self.answers.streams.get_mut(id) else {
            // A stream the client reset (or never opened): the client
            // discards its DATA, but counts it against the connection.
            let passed = self.answers.pass(head, frame, &mut self.to_client);
            if !passed && let Ok(len @ 1..) = u32::try_from(head.len) {
                // No room: dropped here, and the runtime gets its credit.
                self.to_upstream
                    .own(|out| frame::window_update(0, len, out));
            }
            return Ok(());
        };
        let range = head.data(&frame[HEAD_LEN..])?;
        match stream.edit.as_mut() {
            None => {
                // The common case: the frame goes on as it came.
                let passed = !stream.holds() && self.answers.pass(head, frame, &mut self.to_client);
                if !passed {
                    let padding = head.len - range.len();
                    let data = Bytes::copy_from_slice(&frame[HEAD_LEN..][range]);
                    self.send(id, data, end_stream, padding);
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
                self.send(id, out, end_stream, 0);
                self.answers
                    .credit_edited(id, head.len, end_stream, &mut self.to_upstream);
            }
        }
        if end_stream {
            // A response without trailers is no complete gRPC answer.
            self.answers.end_call(id, UNKNOWN);
        }
        Ok(())
    }

    /// Queues DATA for the client on stream `id` (`padding`: what the
    /// runtime counted besides), and sends what the windows let go.
    fn send(&mut self, id: u32, data: Bytes, end_stream: bool, padding: usize) {
        let data = Data {
            data,
            end_stream,
            padding,
        };
        let (to_client, to_upstream) = (&mut self.to_client, &mut self.to_upstream);
        self.answers.send(id, data, to_client, to_upstream);
    }

    fn flush_stream(&mut self, id: u32) {
        let (to_client, to_upstream) = (&mut self.to_client, &mut self.to_upstream);
        self.answers.flush_stream(id, to_client, to_upstream);
    }

    /// The runtime connection closed: every call still open ends with
    /// `UNAVAILABLE` naming the endpoint (after what its stream holds),
    /// then the client is told to go. Whatever the runtime sent complete
    /// still goes first.
    pub(super) fn upstream_gone(&mut self) {
        if self.ends.upstream_eof {
            return;
        }
        self.ends.upstream_eof = true;
        if !self.to_client.abandon_block() {
            // Some of a header block has gone to the client, and its end
            // never will: nothing can follow it cleanly, so the client
            // loses the connection (everything before it has gone).
            self.to_client.clear();
            self.answers.streams = Default::default();
            return;
        }
        // A runtime that closed before its SETTINGS.
        self.to_client.preface();
        let message = unavailable_message(&self.endpoint, &"the connection closed");
        let processed = self.closing.processed_upstream();
        for id in self.answers.streams.ids() {
            let Some(stream) = self.answers.streams.get_mut(id) else {
                continue;
            };
            if stream.ended {
                continue;
            }
            if id > processed {
                // Never processed: the client may retry it elsewhere.
                self.answers.streams.remove(id);
                continue;
            }
            let answer = frame::grpc_status_frame(id, stream.responded, UNAVAILABLE, &message);
            stream.call.finish(UNAVAILABLE);
            stream.abandon_block();
            if stream.holds() {
                stream.ended = true;
                self.answers.streams.hold_frames(id, answer.freeze());
            } else {
                self.to_client.own(|out| out.extend_from_slice(&answer));
                self.answers.streams.remove(id);
            }
        }
        let last = self.closing.last_client_stream();
        self.closing
            .goaway(&mut self.to_client, last, frame::NO_ERROR, b"");
    }
}
