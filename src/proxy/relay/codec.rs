//! Header blocks as the relay sees them: reassembled across HEADERS and
//! CONTINUATION frames and decoded as they arrive (HPACK is stateful: a
//! skipped block would desynchronise the table), keeping only the two
//! fields the relay reads.

use bytes::Bytes;

use super::super::frame::{self, FrameError, Head};
use super::super::hpack::{self, HpackError};

#[derive(Debug, thiserror::Error)]
pub(in crate::proxy) enum CodecError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("a header block interrupted by a frame of type {0:#x}")]
    Interleaved(u8),
    #[error("HPACK")]
    Hpack(#[from] HpackError),
}

/// What a header block says that the relay cares about.
#[derive(Debug, Default)]
pub(super) struct Fields {
    /// The first `:path` (a request has one; more make it malformed, which
    /// the runtime answers).
    pub path: Option<Bytes>,
    pub grpc_status: Option<u32>,
}

/// A complete header block.
#[derive(Debug)]
pub(super) struct Block {
    pub stream: u32,
    pub end_stream: bool,
    pub fields: Fields,
}

/// One direction's header blocks.
#[derive(Debug)]
pub(super) struct Blocks {
    decoder: hpack::Decoder,
    /// The block under way: its stream, END_STREAM and fields so far.
    open: Option<Block>,
}

impl Blocks {
    pub fn new(decoder: hpack::Decoder) -> Self {
        Self {
            decoder,
            open: None,
        }
    }

    pub fn allow_table(&mut self, size: u32) {
        self.decoder
            .allow(usize::try_from(size).unwrap_or(usize::MAX));
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
    /// back the block once it is complete.
    pub fn frame(&mut self, head: Head, payload: &[u8]) -> Result<Option<Block>, CodecError> {
        let fragment = head.fragment(payload)?;
        let mut block = match self.open.take() {
            Some(block) => block,
            None => Block {
                stream: head.stream,
                end_stream: head.flags & frame::END_STREAM != 0,
                fields: Fields::default(),
            },
        };
        let fields = &mut block.fields;
        self.decoder
            .feed(fragment, &mut |name, value| match (name, value) {
                (b":path", Some(value)) if fields.path.is_none() => {
                    fields.path = Some(Bytes::copy_from_slice(value));
                }
                (b"grpc-status", Some(value)) => {
                    fields.grpc_status =
                        std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                }
                _ => {}
            })?;
        if head.flags & frame::END_HEADERS == 0 {
            self.open = Some(block);
            return Ok(None);
        }
        self.decoder.end()?;
        Ok(Some(block))
    }
}
