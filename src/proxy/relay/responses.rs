//! Frames from the runtime, on their way to the client (what a stream
//! holds meanwhile, and the credit for it, is `answers`'s).

use super::frames::each_frame;
use super::{MAX_HELD_BLOCK, RelayError, State};
use crate::proxy::call::{UNKNOWN, unavailable_message};
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
                if !self.answers.hold_reset(head.stream, frame) {
                    self.to_client.relay(head, frame);
                    self.drop_stream(head.stream);
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
                    let (to_client, to_upstream) = (&mut self.to_client, &mut self.to_upstream);
                    self.answers.finish_edit(id, to_client, to_upstream);
                }
                self.answers.hold_block(id)
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
        let frames = block.fields.all.as_ref().map(|fields| {
            let max_frame = self.answers.client_max_frame();
            frame::header_block(block.stream, block.end_stream, fields, max_frame).freeze()
        });
        self.answers
            .block_ended(block.stream, frames, &mut self.to_client);
        if block.end_stream {
            let code = block.fields.grpc_status.unwrap_or(UNKNOWN);
            self.answers.end_call(block.stream, code);
        }
        self.flush_stream(block.stream);
        Ok(())
    }

    fn upstream_data(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        let (to_client, to_upstream) = (&mut self.to_client, &mut self.to_upstream);
        Ok(self.answers.data(head, frame, to_client, to_upstream)?)
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
            self.answers.forget_all();
            return;
        }
        // A runtime that closed before its SETTINGS.
        self.to_client.preface();
        let message = unavailable_message(&self.endpoint, &"the connection closed");
        let processed = self.closing.processed_upstream();
        self.answers
            .runtime_gone(processed, &message, &mut self.to_client);
        let last = self.closing.last_client_stream();
        self.closing
            .goaway(&mut self.to_client, last, frame::NO_ERROR, b"");
    }
}
