//! HPACK decoding (RFC 7541), as much of it as the relay needs: every
//! header block of a connection goes through one `Decoder`, which keeps that
//! direction's dynamic table in step with the peer's encoder and reports
//! each field. Nothing is ever re-encoded.

use std::collections::VecDeque;
use std::sync::OnceLock;

/// The dynamic table size every decoder starts with (SETTINGS_HEADER_TABLE_SIZE).
pub(super) const DEFAULT_TABLE: usize = 4_096;
/// RFC 7541 §4.1: each entry costs its name, its value and 32 bytes.
const ENTRY_OVERHEAD: usize = 32;

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

/// A header field: name and value, decoded.
type Field = (Box<[u8]>, Box<[u8]>);

/// One direction's HPACK decoding state.
#[derive(Debug)]
pub(super) struct Decoder {
    /// Newest first: dynamic index 62 is `table[0]`.
    table: VecDeque<Field>,
    size: usize,
    max_size: usize,
    /// The largest table the decoding peer has allowed (its SETTINGS).
    limit: usize,
}

impl Decoder {
    pub fn new() -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: DEFAULT_TABLE,
            limit: DEFAULT_TABLE,
        }
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
    /// and value in order.
    pub fn decode(
        &mut self,
        mut block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut at_start = true;
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let (index, rest) = integer(block, 7)?;
                block = rest;
                let (name, value) = self.get(index)?;
                field(name, value);
            } else if first & 0x40 != 0 {
                let ((name, value), rest) = self.literal(block, 6)?;
                block = rest;
                field(&name, &value);
                self.insert(name, value);
            } else if first & 0x20 != 0 {
                let (size, rest) = integer(block, 5)?;
                if !at_start || size > self.limit {
                    return Err(HpackError::TableSize(size));
                }
                block = rest;
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                // Without indexing (0000) or never indexed (0001): the
                // table is untouched.
                let ((name, value), rest) = self.literal(block, 4)?;
                block = rest;
                field(&name, &value);
            }
            at_start = false;
        }
        Ok(())
    }

    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            1..=61 => {
                let (name, value) = STATIC[index - 1];
                Ok((name.as_bytes(), value.as_bytes()))
            }
            _ => self
                .table
                .get(index.wrapping_sub(STATIC.len() + 1))
                .map(|(n, v)| (&n[..], &v[..]))
                .ok_or(HpackError::Index(index)),
        }
    }

    fn literal<'a>(&self, block: &'a [u8], prefix: u8) -> Result<(Field, &'a [u8]), HpackError> {
        let (index, rest) = integer(block, prefix)?;
        let (name, rest) = match index {
            0 => string(rest)?,
            _ => (self.get(index)?.0.into(), rest),
        };
        let (value, rest) = string(rest)?;
        Ok(((name, value), rest))
    }

    fn insert(&mut self, name: Box<[u8]>, value: Box<[u8]>) {
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

/// An integer with an N-bit prefix (RFC 7541 §5.1) and what follows it.
fn integer(block: &[u8], prefix: u8) -> Result<(usize, &[u8]), HpackError> {
    let (&first, mut rest) = block.split_first().ok_or(HpackError::Truncated)?;
    let mask = (1u8 << prefix) - 1;
    let mut value = usize::from(first & mask);
    if value < usize::from(mask) {
        return Ok((value, rest));
    }
    // Four continuation bytes reach 2^28, far beyond any sane length.
    for shift in [0, 7, 14, 21] {
        let (&b, next) = rest.split_first().ok_or(HpackError::Truncated)?;
        rest = next;
        value += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok((value, rest));
        }
    }
    Err(HpackError::Overflow)
}

/// A string literal (RFC 7541 §5.2), Huffman-decoded when so marked.
fn string(block: &[u8]) -> Result<(Box<[u8]>, &[u8]), HpackError> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let (len, rest) = integer(block, 7)?;
    if rest.len() < len {
        return Err(HpackError::Truncated);
    }
    let (raw, rest) = rest.split_at(len);
    let decoded = match huffman {
        true => huffman_decode(raw)?.into_boxed_slice(),
        false => raw.into(),
    };
    Ok((decoded, rest))
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
/// through one decoder. Errors are fine; panics and a table over its size
/// are not.
pub(crate) fn fuzz(data: &[u8]) {
    let Some((&size, blocks)) = data.split_first() else {
        return;
    };
    let mut decoder = Decoder::new();
    decoder.allow(usize::from(size) * 64);
    for block in blocks.chunks(usize::from(size.max(1))) {
        let _ = decoder.decode(block, |_, _| {});
        let used: usize = decoder
            .table
            .iter()
            .map(|(n, v)| n.len() + v.len() + ENTRY_OVERHEAD)
            .sum();
        assert_eq!(used, decoder.size);
        assert!(decoder.size <= decoder.max_size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn fields(decoder: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
        let mut out = Vec::new();
        decoder.decode(block, |n, v| {
            out.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ));
        })?;
        Ok(out)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// RFC 7541 C.4: three requests on one connection, Huffman-coded, the
    /// later ones leaning on the dynamic table the earlier ones filled.
    #[test]
    fn the_rfc_huffman_request_examples_decode() {
        let mut decoder = Decoder::new();
        let first = fields(
            &mut decoder,
            &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        )
        .unwrap();
        assert_eq!(
            first,
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        let second = fields(&mut decoder, &hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(second[3], (":authority".into(), "www.example.com".into()));
        assert_eq!(second[4], ("cache-control".into(), "no-cache".into()));
        let third = fields(
            &mut decoder,
            &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
        )
        .unwrap();
        assert_eq!(
            third,
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        // 3 entries: custom-key (54), cache-control (53), :authority (57).
        assert_eq!(decoder.table.len(), 3);
        assert_eq!(decoder.size, 164);
    }

    /// RFC 7541 C.3.1, the same first request without Huffman coding.
    #[test]
    fn plain_literals_decode() {
        let mut decoder = Decoder::new();
        let block = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
        assert_eq!(
            fields(&mut decoder, &block).unwrap()[3].1,
            "www.example.com"
        );
    }

    #[test]
    fn a_small_table_evicts_and_size_updates_are_checked() {
        let mut decoder = Decoder::new();
        // Shrink to 60 bytes: one "custom-key: custom-value" (54) fits.
        let mut block = vec![0x3f, 0x1d]; // size update to 31 + 29 = 60
        block.extend(hex("4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"));
        fields(&mut decoder, &block).unwrap();
        assert_eq!(decoder.table.len(), 1);
        // A second entry evicts the first.
        fields(
            &mut decoder,
            &hex("4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
        )
        .unwrap();
        assert_eq!((decoder.table.len(), decoder.size), (1, 54));
        // Over the allowed size, or after a field: refused.
        assert_eq!(
            fields(&mut decoder, &[0x3f, 0xe2, 0x1f]),
            Err(HpackError::TableSize(4097))
        );
        assert!(matches!(
            fields(&mut decoder, &[0x82, 0x20]),
            Err(HpackError::TableSize(0))
        ));
        decoder.allow(8192);
        fields(&mut decoder, &[0x3f, 0xe2, 0x1f]).unwrap();
    }

    #[test]
    fn malformed_blocks_are_errors_not_panics() {
        let mut decoder = Decoder::new();
        for block in [
            &[0x80][..],                                     // index 0
            &[0xbe][..],                                     // dynamic entry that does not exist
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],       // integer overflow
            &[0x40, 0x05, b'a'][..],                         // string shorter than announced
            &[0x40, 0x81, 0x00, 0x00][..],                   // Huffman: zeros are not padding
            &[0x40, 0x84, 0xff, 0xff, 0xff, 0xff, 0x00][..], // EOS inside
            &[0x40, 0x82, 0x1f, 0xff, 0x00][..],             // padding longer than 7 bits
            &[0x7f][..],                                     // truncated integer
        ] {
            assert!(fields(&mut decoder, block).is_err(), "{block:02x?}");
        }
    }

    #[test]
    fn every_symbol_round_trips_through_the_canonical_code() {
        let table = canonical();
        // Encode each byte with the canonical code, then decode it back.
        let code_of = |symbol: u16| -> (u32, u32) {
            let len = u32::from(CODE_LENGTHS[usize::from(symbol)]);
            let l = len as usize;
            let rank = table.symbols[table.offset[l]..table.offset[l] + table.count[l] as usize]
                .iter()
                .position(|&s| s == symbol)
                .unwrap();
            (table.first[l] + rank as u32, len)
        };
        assert_eq!(code_of(u16::from(b'0')), (0b00000, 5));
        assert_eq!(code_of(EOS), (0x3fff_ffff, 30));
        let input: Vec<u8> = (0..=255).collect();
        let (mut acc, mut n, mut raw) = (0u128, 0u32, Vec::new());
        for &b in &input {
            let (code, len) = code_of(u16::from(b));
            acc = (acc << len) | u128::from(code);
            n += len;
            while n >= 8 {
                raw.push((acc >> (n - 8)) as u8);
                n -= 8;
            }
        }
        if n > 0 {
            raw.push(((acc << (8 - n)) as u8) | ((1u8 << (8 - n)) - 1));
        }
        assert_eq!(huffman_decode(&raw).unwrap(), input);
    }
}
