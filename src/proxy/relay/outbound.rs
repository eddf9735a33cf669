//! One direction's bytes on their way out, and the rules that keep the
//! connection well-formed:
//! - while a header block relayed from the peer is open (its HEADERS went
//!   without END_HEADERS), no other frame may go out on that connection
//!   (RFC 9113 §6.10), so the relay's own frames wait until the block's
//!   last CONTINUATION has gone;
//! - towards the client, the server's connection preface (the runtime's
//!   SETTINGS) comes first (RFC 9113 §3.4), so the relay's own frames wait
//!   for it, or the relay sends a preface of its own when the runtime never
//!   will (`preface`);
//! - towards the client, a header block goes out only once it is complete:
//!   whatever ends the connection, a block never ended (a runtime that died
//!   or stalled mid-block) can then be dropped whole, and the GOAWAY that
//!   tells the client why still goes after the answers before it. Towards
//!   the runtime blocks go frame by frame: when the client is gone, so is
//!   the runtime connection, and nothing need follow.

use bytes::{Buf, BytesMut};

use super::super::frame::{self, Head};

#[derive(Debug)]
pub(super) struct Outbound {
    /// Ready to write, in order.
    ready: BytesMut,
    /// The relay's own frames, waiting for the open block to end or for
    /// the preface.
    own: BytesMut,
    block: Block,
    /// The first frame has been queued: the relay's own may follow.
    opened: bool,
    /// A header block is written only once it is complete.
    whole_blocks: bool,
}

/// The relayed header block that is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Closed,
    /// It begins `at` bytes into `ready`: nothing of it has been written.
    Open {
        at: usize,
    },
    /// Some of it has been written: it can only be completed (never
    /// towards the client, which gets whole blocks).
    Torn,
}

impl Outbound {
    /// Towards the runtime: the relay writes the client's preface itself.
    pub fn to_runtime() -> Self {
        Self::new(true, false)
    }

    /// Towards the client: nothing of the relay's own goes before the
    /// runtime's SETTINGS (or the relay's `preface`), and header blocks go
    /// whole.
    pub fn to_client() -> Self {
        Self::new(false, true)
    }

    fn new(opened: bool, whole_blocks: bool) -> Self {
        Self {
            ready: BytesMut::new(),
            own: BytesMut::new(),
            block: Block::Closed,
            opened,
            whole_blocks,
        }
    }

    /// Passes a frame from the peer on, in the order it came.
    pub fn relay(&mut self, head: Head, frame: &[u8]) {
        let at = self.ready.len();
        self.ready.extend_from_slice(frame);
        match head.kind {
            frame::HEADERS | frame::PUSH_PROMISE | frame::CONTINUATION => {
                let ends = head.flags & frame::END_HEADERS != 0;
                self.block = match (self.block, ends) {
                    (_, true) => Block::Closed,
                    (Block::Closed, false) => Block::Open { at },
                    (open, false) => open,
                };
            }
            _ => {}
        }
        self.opened = true;
        self.release();
    }

    /// Writes frames of the relay's own (whole frames, or whole header
    /// blocks): now, or as soon as they may go.
    pub fn own(&mut self, write: impl FnOnce(&mut BytesMut)) {
        match self.held_back() {
            true => write(&mut self.own),
            false => write(&mut self.ready),
        }
    }

    /// The runtime will send no preface: an empty SETTINGS of the relay's
    /// own opens the connection, so its own frames can go.
    pub fn preface(&mut self) {
        if !self.opened {
            frame::settings(0, &[], &mut self.ready);
            self.opened = true;
            self.release();
        }
    }

    /// The open block will never be completed (its sender is gone): if none
    /// of it was written, it is dropped and the relay's own frames may go;
    /// false if some of it was, and nothing more may go.
    pub fn abandon_block(&mut self) -> bool {
        match self.block {
            Block::Closed => true,
            Block::Open { at } => {
                self.ready.truncate(at);
                self.block = Block::Closed;
                self.release();
                true
            }
            Block::Torn => false,
        }
    }

    fn held_back(&self) -> bool {
        !self.opened || self.block != Block::Closed
    }

    /// Moves the relay's waiting frames into line once they may go.
    fn release(&mut self) {
        if !self.held_back() && !self.own.is_empty() {
            let own = self.own.split();
            self.ready.unsplit(own);
        }
    }

    /// A relayed header block has not ended.
    pub fn block_open(&self) -> bool {
        self.block != Block::Closed
    }

    /// The bytes of an unfinished block held back until it is complete.
    pub fn held_block(&self) -> usize {
        match (self.whole_blocks, self.block) {
            (true, Block::Open { at }) => self.ready.len() - at,
            _ => 0,
        }
    }

    /// What may be written now.
    pub fn data(&self) -> &[u8] {
        let writable = self.ready.len() - self.held_block();
        &self.ready[..writable]
    }

    /// `n` bytes were written.
    pub fn advance(&mut self, n: usize) {
        self.ready.advance(n);
        self.written(n);
    }

    fn written(&mut self, n: usize) {
        if let Block::Open { at } = self.block {
            self.block = match at.checked_sub(n) {
                Some(at) => Block::Open { at },
                None => Block::Torn,
            };
        }
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
        self.block = Block::Closed;
    }

    /// Takes what may be written (fuzzing and tests read the relay's
    /// output so).
    pub fn take(&mut self) -> BytesMut {
        let n = self.data().len();
        let taken = self.ready.split_to(n);
        self.written(n);
        taken
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
        let mut out = Outbound::to_runtime();
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

    #[test]
    fn own_frames_towards_the_client_wait_for_the_runtimes_settings() {
        let mut out = Outbound::to_client();
        out.own(|b| b.extend_from_slice(b"g"));
        assert_eq!(out.data(), b"");
        out.relay(head(frame::SETTINGS, 0), b"S");
        assert_eq!(out.data(), b"Sg");

        let mut out = Outbound::to_client();
        out.own(|b| b.extend_from_slice(b"g"));
        out.preface();
        let (settings, rest) = out.data().split_at(frame::HEAD_LEN);
        assert_eq!(settings[3], frame::SETTINGS);
        assert_eq!(rest, b"g");
    }

    /// A block whose sender went away is dropped, with what followed it,
    /// unless it has begun to go out.
    #[test]
    fn an_abandoned_block_is_dropped_unless_it_began_to_go() {
        let mut out = Outbound::to_runtime();
        out.relay(head(frame::DATA, 0), b"d1");
        out.relay(head(frame::HEADERS, 0), b"H");
        out.relay(head(frame::CONTINUATION, 0), b"C");
        out.own(|b| b.extend_from_slice(b"g"));
        out.advance(2);
        assert!(out.abandon_block());
        assert_eq!(out.data(), b"g");

        out.relay(head(frame::HEADERS, 0), b"H");
        out.advance(2);
        out.own(|b| b.extend_from_slice(b"x"));
        assert!(!out.abandon_block());
        assert!(out.block_open());
    }

    /// Towards the client nothing of a block goes before its end, so it can
    /// always be dropped, and the relay's own frames go after what preceded
    /// it.
    #[test]
    fn the_client_gets_a_block_only_once_it_is_complete() {
        let mut out = Outbound::to_client();
        out.relay(head(frame::SETTINGS, 0), b"S");
        out.relay(head(frame::HEADERS, 0), b"H");
        out.relay(head(frame::CONTINUATION, 0), b"C");
        assert_eq!(out.data(), b"S");
        assert_eq!(out.held_block(), 2);
        out.advance(1);
        out.relay(head(frame::CONTINUATION, frame::END_HEADERS), b"E");
        assert_eq!(out.data(), b"HCE");
        assert_eq!(out.held_block(), 0);
        out.advance(3);

        out.relay(head(frame::DATA, 0), b"d");
        out.relay(head(frame::HEADERS, 0), b"H");
        assert_eq!(&out.take()[..], b"d");
        out.own(|b| b.extend_from_slice(b"g"));
        assert!(out.abandon_block());
        assert_eq!(out.data(), b"g");
    }
}
