//! Frames from the client, on their way to the runtime.

use super::closing::DRAIN_PING;
use super::codec::Block;
use super::frames::{each_frame, take_preface};
use super::{RelayError, State};
use crate::cri::Method;
use crate::proxy::call::{Call, editor_for};
use crate::proxy::frame::{self, HEAD_LEN, Head};
use crate::proxy::socket::Inbox;

impl State {
    pub(super) fn client_frames(&mut self) -> Result<(), RelayError> {
        // Taken out while its frames are handled, which need `self`.
        let mut inbox = std::mem::take(&mut self.from_client);
        let handled = self.client_frames_in(&mut inbox);
        self.from_client = inbox;
        handled
    }

    fn client_frames_in(&mut self, inbox: &mut Inbox) -> Result<(), RelayError> {
        if !self.ends.preface_seen {
            if !take_preface(inbox)? {
                return Ok(());
            }
            self.to_upstream
                .own(|out| out.extend_from_slice(frame::PREFACE));
            self.ends.preface_seen = true;
        }
        let limit = self.upstream_max_frame;
        each_frame(inbox, limit, |head, frame| self.client_frame(head, frame))
    }

    fn client_frame(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        let payload = &frame[HEAD_LEN..];
        self.requests.check(head)?;
        match head.kind {
            frame::HEADERS => {
                self.closing.admits(head.stream)?;
                if let Some(block) = self.requests.frame(head, payload, false)? {
                    self.request(block);
                }
            }
            frame::CONTINUATION => {
                if let Some(block) = self.requests.frame(head, payload, false)? {
                    self.request(block);
                }
            }
            frame::SETTINGS if head.flags & frame::ACK == 0 => {
                return self.client_settings(head, frame);
            }
            frame::WINDOW_UPDATE => return self.client_window_update(head, payload, frame),
            frame::PING if head.flags & frame::ACK != 0 && payload == DRAIN_PING => {
                // The ACK of the relay's own PING: the runtime never sent it.
                self.drain_acked();
                return Ok(());
            }
            frame::RST_STREAM => {
                // The call's metrics say CANCELLED as it drops.
                self.drop_stream(head.stream);
            }
            _ => {}
        }
        self.to_upstream.relay(head, frame);
        Ok(())
    }

    /// After a failure: the client's frames are read for the credit and
    /// settings that let held answers go; everything else is dropped. A
    /// frame that cannot be read ends the reading.
    pub(super) fn credit_after_failure(&mut self) {
        let mut inbox = std::mem::take(&mut self.from_client);
        let limit = self.upstream_max_frame;
        loop {
            let read = match frame::next(inbox.data(), limit) {
                Ok(Some((head, frame))) => {
                    let payload = &frame[HEAD_LEN..];
                    let read = match head.kind {
                        frame::WINDOW_UPDATE => self.client_window_update(head, payload, frame),
                        frame::SETTINGS if head.flags & frame::ACK == 0 => {
                            self.client_settings(head, frame)
                        }
                        _ => Ok(()),
                    };
                    inbox.consume(frame.len());
                    read.is_ok()
                }
                Ok(None) => break,
                Err(_) => false,
            };
            if !read {
                self.closing.unreadable();
                break;
            }
        }
        self.from_client = inbox;
        self.settle_failure();
    }

    fn request(&mut self, block: Block) {
        if !self.closing.opens(block.stream) {
            // Trailers from the client, or a stream the runtime will refuse.
            return;
        }
        let path = block.fields.path.unwrap_or_default();
        let method = std::str::from_utf8(&path).ok().and_then(Method::parse);
        let edit = editor_for(method, self.recreated.as_ref());
        let call = Call::start(&self.metrics, method);
        self.answers.open(block.stream, call, edit);
    }

    /// Applies the client's settings, and passes them on as they came.
    fn client_settings(&mut self, head: Head, frame: &[u8]) -> Result<(), RelayError> {
        for (id, value) in head.settings(&frame[HEAD_LEN..])? {
            match id {
                // The runtime's encoder may use this much table from now on.
                frame::SETTINGS_HEADER_TABLE_SIZE => self.responses.allow_table(value),
                frame::SETTINGS_INITIAL_WINDOW_SIZE => self.answers.set_initial_window(value),
                frame::SETTINGS_MAX_FRAME_SIZE => self.answers.set_client_max_frame(value),
                _ => {}
            }
        }
        self.to_upstream.relay(head, frame);
        self.flush();
        Ok(())
    }

    fn client_window_update(
        &mut self,
        head: Head,
        payload: &[u8],
        frame: &[u8],
    ) -> Result<(), RelayError> {
        let increment = head.increment(payload)?;
        if head.stream == 0 {
            match self.answers.connection_credit(increment) {
                forward if forward == increment => self.to_upstream.relay(head, frame),
                0 => {}
                forward => self
                    .to_upstream
                    .own(|out| frame::window_update(0, forward, out)),
            }
        } else if !self.answers.stream_credit(head.stream, increment) {
            // The relay runs the flow control of edited streams only.
            self.to_upstream.relay(head, frame);
        }
        self.flush();
        Ok(())
    }
}
