//! The streams of one relayed connection, and what each holds back.
//!
//! Held frames belong to their stream: an answer that waits for the
//! client's window delays that stream only, while frames of other streams,
//! their header blocks and connection frames go on at once. A held header
//! block is overtaken by others, so it goes re-encoded (`codec`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use super::flow::Window;
use crate::proxy::call::Call;
use crate::reason::{Editor, Recreated};

/// A stream the relay knows: one call.
pub(super) struct Stream {
    pub call: Call,
    /// The runtime has sent the response headers.
    pub responded: bool,
    /// The runtime has ended the stream: it is forgotten once what it holds
    /// has gone.
    pub ended: bool,
    pub edit: Option<Edit>,
    held: VecDeque<Piece>,
    /// Bytes in `held`.
    held_len: usize,
    /// A header block that will wait behind `held` is still arriving (the
    /// codec keeps its fields; it is re-encoded once complete).
    collecting: bool,
}

/// A stream whose response the relay edits, and so whose flow control it
/// runs itself.
pub(super) struct Edit {
    pub editor: Editor,
    pub recreated: Arc<Recreated>,
    /// The client's window for this stream.
    pub window: Window,
    /// Received from the runtime while the stream held data: the runtime
    /// gets this stream credit once the client has taken what was held, so
    /// that it cannot run further ahead of the client than one window.
    pub uncredited: u32,
}

/// What a stream holds back, in order.
pub(super) enum Piece {
    Data(Data),
    /// Whole frames that go as they are: a header block (the trailers), or
    /// the reset after them.
    Frames(Bytes),
}

/// DATA for the client, sent in as many frames as its windows require.
pub(super) struct Data {
    pub data: Bytes,
    pub end_stream: bool,
    /// Padding the runtime sent (and counted) with it.
    pub padding: usize,
}

impl Stream {
    pub fn new(call: Call, edit: Option<Edit>) -> Self {
        Self {
            call,
            responded: false,
            ended: false,
            edit,
            held: VecDeque::new(),
            held_len: 0,
            collecting: false,
        }
    }

    /// It holds frames (or is collecting a header block to hold).
    pub fn holds(&self) -> bool {
        !self.held.is_empty() || self.collecting
    }

    /// The piece to send next, and the stream's window if the relay runs
    /// its flow control.
    pub fn front_and_window(&mut self) -> (Option<&mut Piece>, Option<&mut Window>) {
        let window = self.edit.as_mut().map(|e| &mut e.window);
        (self.held.front_mut(), window)
    }

    /// `n` bytes of the front piece went to the client.
    pub fn sent(&mut self, n: usize) {
        self.held_len -= n;
    }

    /// The front piece has gone.
    pub fn pop(&mut self) {
        if let Some(Piece::Frames(block)) = self.held.pop_front() {
            self.held_len -= block.len();
        }
    }

    /// A header block that waits behind what the stream holds is arriving.
    pub fn collecting(&self) -> bool {
        self.collecting
    }

    /// Drops a block that will not be completed (the runtime went away).
    pub fn abandon_block(&mut self) {
        self.collecting = false;
    }

    /// The block is complete: its frames, re-encoded, take their place in
    /// the queue.
    pub fn end_block(&mut self, frames: Bytes) {
        if std::mem::take(&mut self.collecting) {
            self.held_len += frames.len();
            self.held.push_back(Piece::Frames(frames));
        }
    }

    /// The unedited DATA bytes it holds: the runtime counted them against
    /// the connection window, and the client will never credit them if
    /// they are dropped.
    pub fn held_unedited(&self) -> usize {
        if self.edit.is_some() {
            return 0;
        }
        self.held
            .iter()
            .map(|piece| match piece {
                Piece::Data(d) => d.data.len() + d.padding,
                Piece::Frames(_) => 0,
            })
            .sum()
    }
}

/// The streams by ID, and those holding frames in the order they began to.
#[derive(Default)]
pub(super) struct Streams {
    by_id: HashMap<u32, Stream>,
    waiting: VecDeque<u32>,
}

impl Streams {
    pub fn insert(&mut self, id: u32, stream: Stream) {
        self.by_id.insert(id, stream);
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut Stream> {
        self.by_id.get_mut(&id)
    }

    pub fn remove(&mut self, id: u32) -> Option<Stream> {
        let stream = self.by_id.remove(&id)?;
        if stream.holds() {
            self.waiting.retain(|&w| w != id);
        }
        Some(stream)
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Some stream holds frames.
    pub fn any_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Bytes held by all streams.
    pub fn held_bytes(&self) -> usize {
        self.waiting
            .iter()
            .filter_map(|id| self.by_id.get(id))
            .map(|s| s.held_len)
            .sum()
    }

    /// Holds DATA at the back of stream `id`'s queue.
    pub fn hold(&mut self, id: u32, data: Data) {
        self.waiting_from(id);
        if let Some(stream) = self.by_id.get_mut(&id) {
            stream.held_len += data.data.len();
            stream.held.push_back(Piece::Data(data));
        }
    }

    /// Holds whole frames at the back of stream `id`'s queue.
    pub fn hold_frames(&mut self, id: u32, block: Bytes) {
        self.waiting_from(id);
        if let Some(stream) = self.by_id.get_mut(&id) {
            stream.held_len += block.len();
            stream.held.push_back(Piece::Frames(block));
        }
    }

    /// Starts stream `id`'s header block that waits behind its held frames.
    pub fn begin_block(&mut self, id: u32) {
        self.waiting_from(id);
        if let Some(stream) = self.by_id.get_mut(&id) {
            stream.collecting = true;
        }
    }

    fn waiting_from(&mut self, id: u32) {
        if self.by_id.get(&id).is_some_and(|s| !s.holds()) {
            self.waiting.push_back(id);
        }
    }

    /// The streams holding frames, oldest first.
    pub fn waiting(&self) -> Vec<u32> {
        self.waiting.iter().copied().collect()
    }

    /// Stream `id` may no longer hold anything: then it stops waiting.
    pub fn settle(&mut self, id: u32) {
        if self.by_id.get(&id).is_none_or(|s| !s.holds()) {
            self.waiting.retain(|&w| w != id);
        }
    }

    /// Every stream ID, lowest first.
    pub fn ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.by_id.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub fn edits_mut(&mut self) -> impl Iterator<Item = &mut Edit> {
        self.by_id.values_mut().filter_map(|s| s.edit.as_mut())
    }
}
