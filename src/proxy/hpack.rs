//! HPACK decoding (RFC 7541), as much of it as the relay needs: every
//! header block of a connection goes through one `Decoder`, which keeps that
//! direction's dynamic table in step with the peer's encoder and reports
//! each field. Re-encoding, where the relay must, is the caller's (literals
//! only, so it never needs this table).
//!
//! Decoding costs O(bytes received), whatever the block says, because a
//! hostile client writes the blocks:
//! - table entries are shared (`Bytes`), so a one-byte reference to a 4 KB
//!   entry costs a reference count, not a copy;
//! - a block is decoded as its fragments arrive, so only the start of one
//!   incomplete field is ever buffered, and it is parsed again only once
//!   enough bytes are there to finish it;
//! - a string too long to matter to the relay (over [`KEEP`] and too large
//!   for the table) streams past without being buffered;
//! - past [`MAX_LIST`] of decoded size (grpc-go's default header list
//!   limit), a block's fields still update the table but are not reported.

use std::collections::VecDeque;
use std::sync::OnceLock;

use bytes::Bytes;

/// The dynamic table size every decoder starts with (SETTINGS_HEADER_TABLE_SIZE).
pub(super) const DEFAULT_TABLE: usize = 4_096;
/// RFC 7541 §4.1: each entry costs its name, its value and 32 bytes.
const ENTRY_OVERHEAD: usize = 32;
/// grpc-go's default SETTINGS_MAX_HEADER_LIST_SIZE (containerd keeps it):
/// fields past this much of a block are not reported.
pub(super) const MAX_LIST: usize = 16 << 20;
/// Strings up to this long are kept and reported: far above any method
/// path or status the relay reads.
const KEEP: usize = 16 << 10;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum HpackError {
    #[error("header block ends mid-field")]
    Truncated,
    #[error("integer too large")]
    Overflow,
    #[error("no table entry {0}")]
    Index(usize),
    #[error("invalid Huffman string")]
    Huffman,
    #[error("table size update to {0} exceeds the allowed size or comes too late")]
    TableSize(usize),
}

/// One direction's HPACK decoding state.
#[derive(Debug)]
pub(super) struct Decoder {
    /// Newest first: dynamic index 62 is `table[0]`.
    table: VecDeque<(Bytes, Bytes)>,
    size: usize,
    max_size: usize,
    /// The largest table the decoding peer has allowed (its SETTINGS).
    limit: usize,
    /// Strings up to this long are reported (longer ones too if they fit
    /// the table).
    keep: usize,
    /// Counts the changes made to the table (entries, evictions, size
    /// updates): a block that changed it cannot be replaced by one that
    /// does not.
    changes: u64,
    block: Progress,
}

/// How far the decoder is into the current header block.
#[derive(Debug, Default)]
struct Progress {
    /// The start of a field whose bytes have not all arrived.
    tail: Vec<u8>,
    /// How long `tail` must be before parsing it again can finish the field.
    need: usize,
    /// A string too long to keep, streaming past.
    skip: Option<Skip>,
    /// A literal whose name was skipped: its value comes next.
    literal: Option<Literal>,
    /// A field was seen: table size updates are no longer allowed.
    started: bool,
    /// The block's header list size so far (name + value + 32 per field).
    list: usize,
}

#[derive(Debug)]
struct Skip {
    left: usize,
    then: Skipped,
}

/// What a skipped string was.
#[derive(Debug)]
enum Skipped {
    /// A literal's name (`len` bytes); its value follows.
    Name { indexing: bool, len: usize },
    /// A literal's value (`len` bytes): the field is complete.
    Value { literal: Literal, len: usize },
}

#[derive(Debug)]
struct Literal {
    /// The name, or the length of a name too long to keep.
    name: Result<Bytes, usize>,
    /// With incremental indexing: the field enters the table.
    indexing: bool,
}

/// What parsing one field from the front of a buffer came to.
enum Step<'a> {
    /// The field is done; the rest of the buffer follows.
    Done(&'a [u8]),
    /// The field needs this many bytes (from the buffer's start) to finish.
    Need(usize),
}

/// A string literal at the front of a buffer.
enum Str<'a> {
    Kept(Bytes, &'a [u8]),
    /// Too long to keep: `len` bytes of it start `at` bytes in.
    Skip {
        at: usize,
        len: usize,
    },
    Need(usize),
}

impl Decoder {
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_TABLE)
    }

    /// A decoder whose peer may use a table of at most `limit` bytes, from
    /// the first block on.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
            keep: KEEP,
            changes: 0,
            block: Progress::default(),
        }
    }

    /// Reports every value up to `keep` bytes long (not only those that
    /// matter to the relay): for a caller that re-encodes the fields.
    pub fn keeping(mut self, keep: usize) -> Self {
        self.keep = keep;
        self
    }

    /// How many changes the table has seen; compared before and after a
    /// block, it tells whether the block changed the table.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.table.len()
    }

    /// The decoding peer allows a table of `size` bytes. The encoder may
    /// use a new limit as soon as it sees it, so the largest one counts.
    pub fn allow(&mut self, size: usize) {
        self.limit = self.limit.max(size);
    }

    /// Decodes one complete header block, calling `field` with each name
    /// and value in order (`None`: a value too long to keep).
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<(), HpackError> {
        self.feed(block, &mut field)?;
        self.end().map(drop)
    }

    /// Decodes the next fragment of the current header block, calling
    /// `field` with each field it completes.
    pub fn feed(
        &mut self,
        fragment: &[u8],
        field: &mut impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<(), HpackError> {
        let mut tail = std::mem::take(&mut self.block.tail);
        let fed = if tail.is_empty() {
            self.consume(fragment, field)
                .map(|rest| tail.extend_from_slice(rest))
        } else {
            tail.extend_from_slice(fragment);
            if tail.len() < self.block.need {
                Ok(())
            } else {
                self.consume(&tail, field)
                    .map(|rest| rest.len())
                    .map(|left| {
                        let done = tail.len() - left;
                        tail.drain(..done);
                    })
            }
        };
        self.block.tail = tail;
        if fed.is_err() {
            // The block is lost (the connection ends with it); a caller that
            // goes on starts the next one afresh.
            self.block = Progress::default();
        }
        fed
    }

    /// The header block is complete: nothing of it may be left over.
    /// Gives back its header list size (fields past [`MAX_LIST`] of it were
    /// not reported).
    pub fn end(&mut self) -> Result<usize, HpackError> {
        let block = std::mem::take(&mut self.block);
        match block.tail.is_empty() && block.skip.is_none() && block.literal.is_none() {
            true => Ok(block.list),
            false => Err(HpackError::Truncated),
        }
    }

    /// Decodes every field `buf` completes; gives back the incomplete rest.
    fn consume<'a>(
        &mut self,
        mut buf: &'a [u8],
        field: &mut impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<&'a [u8], HpackError> {
        self.block.need = 0;
        loop {
            if let Some(skip) = &mut self.block.skip {
                let n = skip.left.min(buf.len());
                skip.left -= n;
                buf = &buf[n..];
                if skip.left > 0 {
                    return Ok(buf);
                }
                if let Some(skip) = self.block.skip.take() {
                    self.skipped(skip.then, field);
                }
                continue;
            }
            if buf.is_empty() {
                return Ok(buf);
            }
            match self.field(buf, field)? {
                Step::Done(rest) => buf = rest,
                Step::Need(need) => {
                    self.block.need = need;
                    return Ok(buf);
                }
            }
        }
    }

    /// One field (or table size update) from the front of `buf`.
    fn field<'a>(
        &mut self,
        buf: &'a [u8],
        field: &mut impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<Step<'a>, HpackError> {
        if let Some(literal) = self.block.literal.take() {
            // The name went by skipped; this is the value.
            return self.value(buf, 0, literal, field);
        }
        let first = buf[0];
        if first & 0x80 != 0 {
            let Some((index, rest)) = integer(buf, 7)? else {
                return Ok(Step::Need(buf.len() + 1));
            };
            let (name, value) = self.get(index)?;
            self.report(&Ok(name), Some(&value), value.len(), field);
            return Ok(Step::Done(rest));
        }
        if first & 0x40 != 0 {
            return self.literal(buf, 6, true, field);
        }
        if first & 0x20 != 0 {
            let Some((size, rest)) = integer(buf, 5)? else {
                return Ok(Step::Need(buf.len() + 1));
            };
            if self.block.started || size > self.limit {
                return Err(HpackError::TableSize(size));
            }
            self.max_size = size;
            self.changes += 1;
            self.evict(0);
            return Ok(Step::Done(rest));
        }
        // Without indexing (0000) or never indexed (0001): the table is
        // untouched.
        self.literal(buf, 4, false, field)
    }

    fn literal<'a>(
        &mut self,
        buf: &'a [u8],
        prefix: u8,
        indexing: bool,
        field: &mut impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<Step<'a>, HpackError> {
        let Some((index, rest)) = integer(buf, prefix)? else {
            return Ok(Step::Need(buf.len() + 1));
        };
        let at = buf.len() - rest.len();
        let (name, at) = match index {
            0 => match self.string(rest)? {
                Str::Need(n) => return Ok(Step::Need(at + n)),
                Str::Kept(name, rest) => (name, buf.len() - rest.len()),
                Str::Skip { at: start, len } => {
                    let skip = Skip {
                        left: len,
                        then: Skipped::Name { indexing, len },
                    };
                    return Ok(self.start_skip(&rest[start..], skip));
                }
            },
            _ => (self.get(index)?.0, at),
        };
        let literal = Literal {
            name: Ok(name),
            indexing,
        };
        self.value(buf, at, literal, field)
    }

    /// The value of `literal`, starting `at` bytes into `buf`.
    fn value<'a>(
        &mut self,
        buf: &'a [u8],
        at: usize,
        literal: Literal,
        field: &mut impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<Step<'a>, HpackError> {
        match self.string(&buf[at..])? {
            Str::Need(n) => {
                if let Err(_skipped) = literal.name {
                    // The buffer starts at the value: resumed from there.
                    self.block.literal = Some(literal);
                }
                Ok(Step::Need(at + n))
            }
            Str::Kept(value, rest) => {
                self.complete(literal, Some(value), field);
                Ok(Step::Done(rest))
            }
            Str::Skip { at: start, len } => {
                let skip = Skip {
                    left: len,
                    then: Skipped::Value { literal, len },
                };
                Ok(self.start_skip(&buf[at + start..], skip))
            }
        }
    }

    /// Starts skipping at the front of `rest`.
    fn start_skip<'a>(&mut self, rest: &'a [u8], mut skip: Skip) -> Step<'a> {
        let n = skip.left.min(rest.len());
        skip.left -= n;
        self.block.skip = Some(skip);
        Step::Done(&rest[n..])
    }

    /// A skipped string has gone by.
    fn skipped(&mut self, then: Skipped, field: &mut impl FnMut(&[u8], Option<&[u8]>)) {
        match then {
            Skipped::Name { indexing, len } => {
                self.block.literal = Some(Literal {
                    name: Err(len),
                    indexing,
                });
            }
            Skipped::Value { literal, len } => {
                self.block.list = self.block.list.saturating_add(len);
                self.complete(literal, None, field);
            }
        }
    }

    /// A literal field is complete: reported, and indexed if it says so.
    fn complete(
        &mut self,
        literal: Literal,
        value: Option<Bytes>,
        field: &mut impl FnMut(&[u8], Option<&[u8]>),
    ) {
        let value_len = value.as_ref().map_or(0, Bytes::len);
        self.report(&literal.name, value.as_deref(), value_len, field);
        if !literal.indexing {
            return;
        }
        match (literal.name, value) {
            (Ok(name), Some(value)) => self.insert(name, value),
            // RFC 7541 §4.4: an entry larger than the table empties it,
            // and a string too long to keep is larger than the table.
            _ => {
                self.changes += 1;
                self.table.clear();
                self.size = 0;
            }
        }
    }

    fn report(
        &mut self,
        name: &Result<Bytes, usize>,
        value: Option<&[u8]>,
        value_len: usize,
        field: &mut impl FnMut(&[u8], Option<&[u8]>),
    ) {
        self.block.started = true;
        let name_len = match name {
            Ok(name) => name.len(),
            Err(len) => *len,
        };
        let before = self.block.list;
        self.block.list = before.saturating_add(name_len + value_len + ENTRY_OVERHEAD);
        if let (Ok(name), true) = (name, self.block.list <= MAX_LIST) {
            field(name, value);
        }
    }

    /// A string literal (RFC 7541 §5.2) at the front of `buf`, Huffman-decoded
    /// when so marked; skipped when too long to matter.
    fn string<'a>(&self, buf: &'a [u8]) -> Result<Str<'a>, HpackError> {
        let Some(&first) = buf.first() else {
            return Ok(Str::Need(1));
        };
        let huffman = first & 0x80 != 0;
        let Some((len, rest)) = integer(buf, 7)? else {
            return Ok(Str::Need(buf.len() + 1));
        };
        let at = buf.len() - rest.len();
        // Longer than this, a string cannot fit the table (a Huffman code
        // is at most 30 bits a byte), so only its length matters.
        let keep = match huffman {
            true => self.keep.max(self.max_size.saturating_mul(30) / 8),
            false => self.keep.max(self.max_size),
        };
        if len > keep {
            return Ok(Str::Skip { at, len });
        }
        if rest.len() < len {
            return Ok(Str::Need(at + len));
        }
        let (raw, rest) = rest.split_at(len);
        let decoded = match huffman {
            true => Bytes::from(huffman_decode(raw)?),
            false => Bytes::copy_from_slice(raw),
        };
        Ok(Str::Kept(decoded, rest))
    }

    fn get(&self, index: usize) -> Result<(Bytes, Bytes), HpackError> {
        match index {
            1..=61 => {
                let (name, value) = STATIC[index - 1];
                Ok((
                    Bytes::from_static(name.as_bytes()),
                    Bytes::from_static(value.as_bytes()),
                ))
            }
            _ => self
                .table
                .get(index.wrapping_sub(STATIC.len() + 1))
                .cloned()
                .ok_or(HpackError::Index(index)),
        }
    }

    fn insert(&mut self, name: Bytes, value: Bytes) {
        self.changes += 1;
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size > self.max_size {
            // RFC 7541 §4.4: an entry larger than the table empties it.
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.size += size;
        self.table.push_front((name, value));
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some((name, value)) = self.table.pop_back() else {
                break;
            };
            self.size -= name.len() + value.len() + ENTRY_OVERHEAD;
        }
    }
}

/// An integer with an N-bit prefix (RFC 7541 §5.1) and what follows it;
/// `None` if it has not all arrived.
fn integer(block: &[u8], prefix: u8) -> Result<Option<(usize, &[u8])>, HpackError> {
    let Some((&first, mut rest)) = block.split_first() else {
        return Ok(None);
    };
    let mask = (1u8 << prefix) - 1;
    let mut value = usize::from(first & mask);
    if value < usize::from(mask) {
        return Ok(Some((value, rest)));
    }
    // Four continuation bytes reach 2^28, far beyond any sane length.
    for shift in [0, 7, 14, 21] {
        let Some((&b, next)) = rest.split_first() else {
            return Ok(None);
        };
        rest = next;
        value += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(Some((value, rest)));
        }
    }
    Err(HpackError::Overflow)
}

/// The static table (RFC 7541 Appendix A).
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The length in bits of each symbol's Huffman code (RFC 7541 Appendix B),
/// symbols 0–255 and then EOS. The code is canonical: codes are assigned
/// in order of (length, symbol), so these lengths are the whole table.
#[rustfmt::skip]
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,  // 0x00..=0x0f
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,  // 0x10..=0x1f
     6, 10, 10, 12, 13,  6,  8, 11, 10, 10,  8, 11,  8,  6,  6,  6,  // 0x20..=0x2f
     5,  5,  5,  6,  6,  6,  6,  6,  6,  6,  7,  8, 15,  6, 12, 10,  // 0x30..=0x3f
    13,  6,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  // 0x40..=0x4f
     7,  7,  7,  7,  7,  7,  7,  7,  8,  7,  8, 13, 19, 13, 14,  6,  // 0x50..=0x5f
    15,  5,  6,  5,  6,  5,  6,  6,  6,  5,  7,  7,  6,  6,  6,  5,  // 0x60..=0x6f
     6,  7,  6,  5,  5,  6,  7,  7,  7,  7,  7, 15, 11, 14, 13, 28,  // 0x70..=0x7f
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,  // 0x80..=0x8f
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,  // 0x90..=0x9f
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,  // 0xa0..=0xaf
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,  // 0xb0..=0xbf
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,  // 0xc0..=0xcf
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,  // 0xd0..=0xdf
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,  // 0xe0..=0xef
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,  // 0xf0..=0xff
    30,  // EOS
];

const EOS: u16 = 256;

/// The canonical code, arranged for decoding: for each length, the first
/// code and where its symbols start in `symbols`.
struct Canonical {
    /// Codes of length `l` are `first[l] .. first[l] + count[l]`.
    first: [u32; 31],
    count: [u32; 31],
    offset: [usize; 31],
    /// Symbols ordered by (length, symbol).
    symbols: [u16; 257],
}

fn canonical() -> &'static Canonical {
    static TABLE: OnceLock<Canonical> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut symbols: [u16; 257] = std::array::from_fn(|s| s as u16);
        symbols.sort_by_key(|&s| (CODE_LENGTHS[usize::from(s)], s));
        let mut table = Canonical {
            first: [0; 31],
            count: [0; 31],
            offset: [0; 31],
            symbols,
        };
        for &len in &CODE_LENGTHS {
            table.count[usize::from(len)] += 1;
        }
        let (mut code, mut offset) = (0u32, 0usize);
        for len in 1..31 {
            table.first[len] = code;
            table.offset[len] = offset;
            code = (code + table.count[len]) << 1;
            offset += table.count[len] as usize;
        }
        table
    })
}

/// Decodes a Huffman-coded string: at most seven bits of padding, all ones
/// (a prefix of EOS), and no EOS symbol.
fn huffman_decode(raw: &[u8]) -> Result<Vec<u8>, HpackError> {
    let table = canonical();
    let mut out = Vec::with_capacity(raw.len() * 8 / 5);
    let (mut bits, mut held) = (0u64, 0u32);
    let mut input = raw.iter();
    loop {
        while held <= 56 {
            match input.next() {
                Some(&b) => {
                    bits |= u64::from(b) << (56 - held);
                    held += 8;
                }
                None => break,
            }
        }
        if held == 0 {
            return Ok(out);
        }
        let mut decoded = None;
        for len in 5..=30u32 {
            let code = (bits >> (64 - len)) as u32;
            let l = len as usize;
            if code < table.first[l] + table.count[l] {
                let symbol = table.symbols[table.offset[l] + (code - table.first[l]) as usize];
                decoded = Some((symbol, len));
                break;
            }
        }
        let Some((symbol, len)) = decoded.filter(|&(_, len)| len <= held) else {
            // What is left must be padding: under a byte, all ones.
            return match held < 8 && bits >> (64 - held) == (1u64 << held) - 1 {
                true => Ok(out),
                false => Err(HpackError::Huffman),
            };
        };
        if symbol == EOS {
            return Err(HpackError::Huffman);
        }
        out.push(symbol as u8);
        bits <<= len;
        held -= len;
    }
}

/// The fuzz target `hpack` (see `fuzzing`): blocks of `data[0]` bytes each,
/// through one decoder whole and through another in pieces of one to seven
/// bytes. Errors are fine; panics, a table over its size, and the two
/// decoders disagreeing are not.
pub(crate) fn fuzz(data: &[u8]) {
    let Some((&size, blocks)) = data.split_first() else {
        return;
    };
    let (mut whole, mut pieces) = (Decoder::new(), Decoder::new());
    whole.allow(usize::from(size) * 64);
    pieces.allow(usize::from(size) * 64);
    for block in blocks.chunks(usize::from(size.max(1))) {
        let mut fields = Vec::new();
        let at_once = whole.decode(block, |n, v| {
            fields.push((n.to_vec(), v.map(<[u8]>::to_vec)))
        });
        let mut split = Vec::new();
        let mut report =
            |n: &[u8], v: Option<&[u8]>| split.push((n.to_vec(), v.map(<[u8]>::to_vec)));
        let mut fed = Ok(());
        for piece in block.chunks(usize::from(size % 7) + 1) {
            fed = pieces.feed(piece, &mut report);
            if fed.is_err() {
                break;
            }
        }
        let in_pieces = fed.and_then(|()| pieces.end());
        if at_once.is_err() || in_pieces.is_err() {
            // The decoders may fail at different fields; both are spent.
            return;
        }
        assert_eq!(fields, split);
        assert_eq!(whole.table, pieces.table);
        for decoder in [&whole, &pieces] {
            let used: usize = decoder
                .table
                .iter()
                .map(|(n, v)| n.len() + v.len() + ENTRY_OVERHEAD)
                .sum();
            assert_eq!(used, decoder.size);
            assert!(decoder.size <= decoder.max_size);
        }
    }
}

#[cfg(test)]
mod tests;
