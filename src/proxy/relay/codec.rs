//! Header blocks as the relay sees them: reassembled across HEADERS and
//! CONTINUATION frames and decoded as they arrive (HPACK is stateful: a
//! skipped block would desynchronise the table), keeping the two fields
//! the relay reads, or, for a block the relay must re-encode, all of them.

use bytes::Bytes;

use super::super::frame::{self, FrameError, Head};
use super::super::hpack::{self, HpackError};
use super::MAX_HELD_BLOCK;

#[derive(Debug, thiserror::Error)]
pub(in crate::proxy) enum CodecError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("a header block interrupted by a frame of type {0:#x}")]
    Interleaved(u8),
    #[error("HPACK")]
    Hpack(#[from] HpackError),
    /// A block the relay re-encodes is bounded like any it holds, on the
    /// wire and decoded.
    #[error("a header block to re-encode is over {MAX_HELD_BLOCK} bytes")]
    TooLarge,
}

/// What a header block says that the relay cares about.
#[derive(Debug, Default)]
pub(super) struct Fields {
    /// The first `:path` (a request has one; more make it malformed, which
    /// the runtime answers).
    pub path: Option<Bytes>,
    pub grpc_status: Option<u32>,
    /// Every field in order, for a block captured to be re-encoded.
    pub all: Option<Vec<(Bytes, Bytes)>>,
}

/// A complete header block.
#[derive(Debug)]
pub(super) struct Block {
    pub stream: u32,
    pub end_stream: bool,
    pub fields: Fields,
    /// Wire bytes so far, counted for a captured block.
    wire: usize,
    /// `changes()` of the decoder when the block began.
    changes: u64,
}

/// One direction's header blocks.
///
/// A block the relay holds back is re-encoded when it goes (literals only):
/// by then other blocks may have changed the peer's table, so its own
/// references would be wrong. If the held block itself changed the table,
/// the peer's table no longer follows the sender's from there on, and every
/// later block is re-encoded too (`diverged`). Held blocks are rare (an
/// answer waiting for the client's window), and most refer to the table
/// without changing it.
#[derive(Debug)]
pub(super) struct Blocks {
    decoder: hpack::Decoder,
    /// The block under way: its stream, END_STREAM and fields so far.
    open: Option<Block>,
    /// A re-encoded block changed the table the sender encodes against,
    /// and the peer's did not follow.
    diverged: bool,
}

impl Blocks {
    pub fn new(decoder: hpack::Decoder) -> Self {
        Self {
            decoder,
            open: None,
            diverged: false,
        }
    }

    pub fn allow_table(&mut self, size: u32) {
        self.decoder
            .allow(usize::try_from(size).unwrap_or(usize::MAX));
    }

    /// The block under way is captured, to be re-encoded.
    pub fn capturing(&self) -> bool {
        self.open.as_ref().is_some_and(|b| b.fields.all.is_some())
    }

    /// The stream whose header block is under way.
    pub fn open_stream(&self) -> Option<u32> {
        self.open.as_ref().map(|block| block.stream)
    }

    /// Checks that `head` may come now: nothing but the block's own
    /// CONTINUATION while a block is open, and no CONTINUATION otherwise.
    pub fn check(&self, head: Head) -> Result<(), CodecError> {
        let fits = match (self.open.as_ref(), head.kind) {
            (Some(block), frame::CONTINUATION) => block.stream == head.stream,
            (Some(_), _) => false,
            (None, kind) => kind != frame::CONTINUATION,
        };
        match fits {
            true => Ok(()),
            false => Err(CodecError::Interleaved(head.kind)),
        }
    }

    /// Takes a HEADERS or CONTINUATION frame (already `check`ed); gives
    /// back the block once it is complete. A block begun with `hold` (or
    /// any, once diverged) keeps all of its fields in `Fields::all`, and
    /// the caller sends it re-encoded.
    pub fn frame(
        &mut self,
        head: Head,
        payload: &[u8],
        hold: bool,
    ) -> Result<Option<Block>, CodecError> {
        let fragment = head.fragment(payload)?;
        let mut block = match self.open.take() {
            Some(block) => block,
            None => Block {
                stream: head.stream,
                end_stream: head.flags & frame::END_STREAM != 0,
                fields: Fields {
                    all: (hold || self.diverged).then(Vec::new),
                    ..Fields::default()
                },
                wire: 0,
                changes: self.decoder.changes(),
            },
        };
        let captured = block.fields.all.is_some();
        if captured {
            block.wire += fragment.len();
            if block.wire > MAX_HELD_BLOCK {
                return Err(CodecError::TooLarge);
            }
        }
        let fields = &mut block.fields;
        let mut lost = false;
        self.decoder.feed(fragment, &mut |name, value| {
            match (name, value) {
                (b":path", Some(value)) if fields.path.is_none() => {
                    fields.path = Some(Bytes::copy_from_slice(value));
                }
                (b"grpc-status", Some(value)) => {
                    fields.grpc_status =
                        std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                }
                _ => {}
            }
            if let Some(all) = fields.all.as_mut() {
                match value {
                    Some(value) => {
                        all.push((Bytes::copy_from_slice(name), Bytes::copy_from_slice(value)))
                    }
                    None => lost = true,
                }
            }
        })?;
        if lost {
            return Err(CodecError::TooLarge);
        }
        if head.flags & frame::END_HEADERS == 0 {
            self.open = Some(block);
            return Ok(None);
        }
        let list = self.decoder.end()?;
        if captured && list > MAX_HELD_BLOCK {
            return Err(CodecError::TooLarge);
        }
        let changed_table = self.decoder.changes() != block.changes;
        self.diverged |= captured && changed_table;
        Ok(Some(block))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(kind: u8, flags: u8, len: usize) -> Head {
        Head {
            len,
            kind,
            flags,
            stream: 1,
        }
    }

    /// A held block is bounded on the wire even when it decodes to nothing
    /// (table size updates, one byte each, over and over).
    #[test]
    fn a_captured_block_is_bounded_on_the_wire() {
        let mut blocks = Blocks::new(hpack::Decoder::new().keeping(hpack::MAX_LIST));
        let piece = vec![0x20; frame::DEFAULT_MAX_FRAME];
        let first = blocks.frame(head(frame::HEADERS, 0, piece.len()), &piece, true);
        assert!(matches!(first, Ok(None)));
        assert!(blocks.capturing());
        let mut result = Ok(None);
        for _ in 0..=MAX_HELD_BLOCK / piece.len() {
            result = blocks.frame(head(frame::CONTINUATION, 0, piece.len()), &piece, false);
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(CodecError::TooLarge)), "{result:?}");
    }

    /// Only a captured block that changed the table makes every later
    /// block captured; one that only refers to it does not.
    #[test]
    fn a_held_block_that_changes_the_table_diverges_the_rest() {
        let mut blocks = Blocks::new(hpack::Decoder::new().keeping(hpack::MAX_LIST));
        let complete = |blocks: &mut Blocks, payload: &[u8], hold: bool| {
            let head = head(frame::HEADERS, frame::END_HEADERS, payload.len());
            blocks.frame(head, payload, hold).unwrap().unwrap()
        };
        // `:status: 200` indexed, then a literal with indexing.
        assert!(complete(&mut blocks, &[0x88], true).fields.all.is_some());
        assert!(complete(&mut blocks, &[0x88], false).fields.all.is_none());
        let adds = [0x40, 1, b'x', 1, b'y'];
        assert!(complete(&mut blocks, &adds, false).fields.all.is_none());
        let held = complete(&mut blocks, &[0x80 | 62], true);
        let all = held.fields.all.unwrap();
        assert_eq!(all, [(Bytes::from_static(b"x"), Bytes::from_static(b"y"))]);
        assert!(complete(&mut blocks, &[0x88], false).fields.all.is_none());
        complete(&mut blocks, &adds, true);
        assert!(complete(&mut blocks, &[0x88], false).fields.all.is_some());
    }
}
