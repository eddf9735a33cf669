//! One direction's bytes on their way out, and the rule that keeps header
//! blocks whole: while a header block relayed from the peer is open (its
//! HEADERS went without END_HEADERS), no other frame may go out on that
//! connection (RFC 9113 §6.10), so the relay's own frames wait until the
//! block's last CONTINUATION has gone.

use bytes::{Buf, BytesMut};

use super::super::frame::{self, Head};

#[derive(Debug, Default)]
pub(super) struct Outbound {
    /// Ready to write, in order.
    ready: BytesMut,
    /// The relay's own frames, waiting for the open block to end.
    own: BytesMut,
    /// A relayed header block has not ended.
    block_open: bool,
}

impl Outbound {
    /// Passes a frame from the peer on, in the order it came.
    pub fn relay(&mut self, head: Head, frame: &[u8]) {
        self.ready.extend_from_slice(frame);
        match head.kind {
            frame::HEADERS | frame::PUSH_PROMISE | frame::CONTINUATION => {
                self.block_open = head.flags & frame::END_HEADERS == 0;
                if !self.block_open && !self.own.is_empty() {
                    let own = self.own.split();
                    self.ready.unsplit(own);
                }
            }
            _ => {}
        }
    }

    /// Writes frames of the relay's own (whole frames, or whole header
    /// blocks): now, or as soon as the open block ends.
    pub fn own(&mut self, write: impl FnOnce(&mut BytesMut)) {
        match self.block_open {
            true => write(&mut self.own),
            false => write(&mut self.ready),
        }
    }

    /// A relayed header block is open.
    pub fn block_open(&self) -> bool {
        self.block_open
    }

    /// What is ready to write.
    pub fn data(&self) -> &[u8] {
        &self.ready
    }

    /// `n` bytes were written.
    pub fn advance(&mut self, n: usize) {
        self.ready.advance(n);
    }

    /// Bytes ready or waiting.
    pub fn len(&self) -> usize {
        self.ready.len() + self.own.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.own.is_empty()
    }

    /// Everything goes: the far end is gone.
    pub fn clear(&mut self) {
        self.ready.clear();
        self.own.clear();
        self.block_open = false;
    }

    /// Takes what is ready (fuzzing and tests read the relay's output so).
    pub fn take(&mut self) -> BytesMut {
        self.ready.split()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(kind: u8, flags: u8) -> Head {
        Head {
            len: 0,
            kind,
            flags,
            stream: 1,
        }
    }

    #[test]
    fn own_frames_wait_for_an_open_block_to_end() {
        let mut out = Outbound::default();
        out.own(|b| b.extend_from_slice(b"a"));
        out.relay(head(frame::HEADERS, 0), b"H");
        out.own(|b| b.extend_from_slice(b"b"));
        assert!(out.block_open());
        out.relay(head(frame::CONTINUATION, 0), b"C");
        assert_eq!(out.data(), b"aHC");
        out.relay(head(frame::CONTINUATION, frame::END_HEADERS), b"E");
        assert_eq!(out.data(), b"aHCEb");
        out.relay(head(frame::HEADERS, frame::END_HEADERS), b"h");
        out.own(|b| b.extend_from_slice(b"c"));
        assert_eq!(out.data(), b"aHCEbhc");
        assert_eq!(out.len(), 7);
    }
}
