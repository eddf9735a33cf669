//! The few HTTP/2 framing facts the relay needs (RFC 9113 §4, §6), and the
//! HPACK encoding of what it writes itself: its own answer, and the header
//! blocks it must re-encode.

use bytes::{BufMut, Bytes, BytesMut};

/// What every client sends first.
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub(super) const HEAD_LEN: usize = 9;

pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const SETTINGS: u8 = 0x4;
pub(super) const PUSH_PROMISE: u8 = 0x5;
pub(super) const PING: u8 = 0x6;
pub(super) const GOAWAY: u8 = 0x7;
pub(super) const WINDOW_UPDATE: u8 = 0x8;
pub(super) const CONTINUATION: u8 = 0x9;

pub(super) const END_STREAM: u8 = 0x1;
pub(super) const ACK: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;

pub(super) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(super) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(super) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// Defaults until a SETTINGS frame says otherwise.
pub(super) const DEFAULT_WINDOW: i64 = 65_535;
pub(super) const DEFAULT_MAX_FRAME: usize = 16_384;
/// The largest SETTINGS_MAX_FRAME_SIZE allowed (2^24 - 1).
pub(super) const MAX_FRAME_LIMIT: usize = (1 << 24) - 1;

/// Error codes (RFC 9113 §7), as GOAWAY and RST_STREAM carry them.
pub(super) const NO_ERROR: u32 = 0x0;
pub(super) const PROTOCOL_ERROR: u32 = 0x1;
pub(super) const FRAME_SIZE_ERROR: u32 = 0x6;
pub(super) const REFUSED_STREAM: u32 = 0x7;
pub(super) const COMPRESSION_ERROR: u32 = 0x9;

/// The largest stream ID (GOAWAY's "every stream may be processed").
pub(super) const MAX_STREAM: u32 = u32::MAX >> 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum FrameError {
    #[error("frame of type {kind:#x} on stream {stream} is malformed")]
    Malformed { kind: u8, stream: u32 },
}

/// A frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    /// The header at the start of `buf`, if nine bytes are there.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let b: &[u8; HEAD_LEN] = buf.get(..HEAD_LEN)?.try_into().ok()?;
        Some(Self {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        })
    }

    pub fn encode(&self, out: &mut BytesMut) {
        let len = u32::try_from(self.len).unwrap_or(u32::MAX).to_be_bytes();
        out.extend_from_slice(&len[1..]);
        out.put_u8(self.kind);
        out.put_u8(self.flags);
        out.put_u32(self.stream);
    }

    fn malformed(&self) -> FrameError {
        FrameError::Malformed {
            kind: self.kind,
            stream: self.stream,
        }
    }

    /// Where a DATA frame's data lies in its payload (padding excluded).
    pub fn data(&self, payload: &[u8]) -> Result<std::ops::Range<usize>, FrameError> {
        let data = self.unpadded(payload)?;
        let start = usize::from(self.flags & PADDED != 0);
        Ok(start..start + data.len())
    }

    /// The header block fragment of a HEADERS or CONTINUATION frame.
    pub fn fragment<'a>(&self, payload: &'a [u8]) -> Result<&'a [u8], FrameError> {
        if self.kind == CONTINUATION {
            return Ok(payload);
        }
        let unpadded = self.unpadded(payload)?;
        if self.flags & PRIORITY != 0 {
            // Stream dependency (4) and weight (1).
            return unpadded.get(5..).ok_or_else(|| self.malformed());
        }
        Ok(unpadded)
    }

    fn unpadded<'a>(&self, payload: &'a [u8]) -> Result<&'a [u8], FrameError> {
        if self.flags & PADDED == 0 {
            return Ok(payload);
        }
        let (&pad, rest) = payload.split_first().ok_or_else(|| self.malformed())?;
        rest.len()
            .checked_sub(usize::from(pad))
            .map(|end| &rest[..end])
            .ok_or_else(|| self.malformed())
    }

    /// The settings in a SETTINGS frame's payload, as (identifier, value).
    pub fn settings<'a>(
        &self,
        payload: &'a [u8],
    ) -> Result<impl Iterator<Item = (u16, u32)> + 'a, FrameError> {
        if payload.len() % 6 != 0 {
            return Err(self.malformed());
        }
        Ok(payload.chunks_exact(6).map(|s| {
            (
                u16::from_be_bytes([s[0], s[1]]),
                u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
            )
        }))
    }

    /// A WINDOW_UPDATE frame's increment.
    pub fn increment(&self, payload: &[u8]) -> Result<u32, FrameError> {
        let b: &[u8; 4] = payload.try_into().map_err(|_| self.malformed())?;
        Ok(u32::from_be_bytes(*b) & 0x7fff_ffff)
    }
}

pub(super) fn window_update(stream: u32, increment: u32, out: &mut BytesMut) {
    Head {
        len: 4,
        kind: WINDOW_UPDATE,
        flags: 0,
        stream,
    }
    .encode(out);
    out.put_u32(increment);
}

/// Whether `buf` starts with the client's whole connection preface
/// (`Some(true)`), with the start of it (`Some(false)`), or with something
/// else (`None`).
pub(super) fn preface(buf: &[u8]) -> Option<bool> {
    let n = buf.len().min(PREFACE.len());
    (buf[..n] == PREFACE[..n]).then_some(n == PREFACE.len())
}

/// The whole frame at the front of `buf` (its head, and all its bytes),
/// `None` until it has all arrived; `Err` with the length of a frame longer
/// than `limit`.
pub(super) fn next(buf: &[u8], limit: usize) -> Result<Option<(Head, &[u8])>, usize> {
    let Some(head) = Head::parse(buf) else {
        return Ok(None);
    };
    if head.len > limit {
        return Err(head.len);
    }
    Ok(buf.get(..HEAD_LEN + head.len).map(|frame| (head, frame)))
}

/// A frame of `kind` carrying `payload`.
pub(super) fn put(out: &mut BytesMut, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    Head {
        len: payload.len(),
        kind,
        flags,
        stream,
    }
    .encode(out);
    out.extend_from_slice(payload);
}

/// GOAWAY, with `debug` as its additional debug data.
pub(super) fn goaway(last_stream: u32, code: u32, debug: &[u8], out: &mut BytesMut) {
    Head {
        len: 8 + debug.len(),
        kind: GOAWAY,
        flags: 0,
        stream: 0,
    }
    .encode(out);
    out.put_u32(last_stream);
    out.put_u32(code);
    out.extend_from_slice(debug);
}

pub(super) fn rst_stream(stream: u32, code: u32, out: &mut BytesMut) {
    Head {
        len: 4,
        kind: RST_STREAM,
        flags: 0,
        stream,
    }
    .encode(out);
    out.put_u32(code);
}

/// A SETTINGS frame (`ACK` in `flags`, or the `settings` it carries).
pub(super) fn settings(flags: u8, settings: &[(u16, u32)], out: &mut BytesMut) {
    Head {
        len: 6 * settings.len(),
        kind: SETTINGS,
        flags,
        stream: 0,
    }
    .encode(out);
    for &(id, value) in settings {
        out.put_u16(id);
        out.put_u32(value);
    }
}

/// The gRPC status a stream ends with when the runtime went away under it:
/// trailers after a response's headers, or a whole trailers-only answer.
///
/// Every field is a literal that is not indexed (or a static-table index),
/// so the client's HPACK table is left exactly as the runtime's encoder
/// believes it to be.
pub(super) fn grpc_status_frame(
    stream: u32,
    headers_sent: bool,
    code: u32,
    message: &str,
) -> BytesMut {
    let mut block = BytesMut::new();
    if !headers_sent {
        // Static table index 8 is `:status: 200`.
        block.put_u8(0x80 | 8);
        literal(&mut block, b"content-type", b"application/grpc");
    }
    literal(&mut block, b"grpc-status", code.to_string().as_bytes());
    literal(
        &mut block,
        b"grpc-message",
        percent_encode(message).as_bytes(),
    );
    let mut out = BytesMut::with_capacity(HEAD_LEN + block.len());
    Head {
        len: block.len(),
        kind: HEADERS,
        flags: END_STREAM | END_HEADERS,
        stream,
    }
    .encode(&mut out);
    out.extend_from_slice(&block);
    out
}

/// A header block the relay re-encodes (`relay::codec`): every field a
/// "literal never indexed, new name" (RFC 7541 §6.2.3), so the block leaves
/// the client's table as it was wherever it arrives, and a field the runtime
/// marked never to be indexed stays so (the relay does not track which
/// were). HEADERS, then CONTINUATIONs of at most `max_frame` bytes each.
pub(super) fn header_block(
    stream: u32,
    end_stream: bool,
    fields: &[(Bytes, Bytes)],
    max_frame: usize,
) -> BytesMut {
    let mut block = BytesMut::new();
    for (name, value) in fields {
        block.put_u8(0x10);
        string(&mut block, name);
        string(&mut block, value);
    }
    let max_frame = max_frame.max(1);
    let pieces = block.len().div_ceil(max_frame).max(1);
    let mut out = BytesMut::with_capacity(block.len() + pieces * HEAD_LEN);
    let mut rest = &block[..];
    let mut kind = HEADERS;
    let mut flags = match end_stream {
        true => END_STREAM,
        false => 0,
    };
    loop {
        let (piece, after) = rest.split_at(rest.len().min(max_frame));
        rest = after;
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        put(&mut out, kind, flags, stream, piece);
        if rest.is_empty() {
            return out;
        }
        (kind, flags) = (CONTINUATION, 0);
    }
}

/// A "literal header field without indexing, new name" (RFC 7541 §6.2.2),
/// without Huffman coding.
pub(super) fn literal(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_u8(0);
    string(out, name);
    string(out, value);
}

fn string(out: &mut BytesMut, s: &[u8]) {
    // A 7-bit prefix integer (RFC 7541 §5.1) with the Huffman bit clear.
    let mut n = s.len();
    if n < 127 {
        out.put_u8(n as u8);
    } else {
        out.put_u8(127);
        n -= 127;
        while n >= 128 {
            out.put_u8((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.put_u8(n as u8);
    }
    out.extend_from_slice(s);
}

/// gRPC's percent-encoding of `grpc-message`: printable ASCII but `%` as is.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of `block`, checking that it left the table empty.
    fn decode(block: &[u8]) -> Vec<(String, String)> {
        let mut decoder = super::super::hpack::Decoder::new();
        let mut out = Vec::new();
        decoder
            .decode(block, |n, v| {
                out.push((
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v.unwrap()).into_owned(),
                ));
            })
            .unwrap();
        assert_eq!(decoder.entries(), 0);
        out
    }

    #[test]
    fn heads_round_trip() {
        let head = Head {
            len: 0x01_02_03,
            kind: HEADERS,
            flags: END_HEADERS | END_STREAM,
            stream: 0x7fff_fffd,
        };
        let mut out = BytesMut::new();
        head.encode(&mut out);
        assert_eq!(out.len(), HEAD_LEN);
        assert_eq!(Head::parse(&out), Some(head));
        assert_eq!(Head::parse(&out[..8]), None);
        // The reserved bit is ignored on receipt.
        out[5] |= 0x80;
        assert_eq!(Head::parse(&out).unwrap().stream, 0x7fff_fffd);
    }

    #[test]
    fn padding_and_priority_are_stripped_and_checked() {
        let padded = Head {
            len: 6,
            kind: HEADERS,
            flags: PADDED | PRIORITY | END_HEADERS,
            stream: 1,
        };
        // Pad length 2, priority (5 bytes) ... too short for both.
        assert!(padded.fragment(&[2, 0, 0, 0, 0, 0]).is_err());
        let payload = [1, 0, 0, 0, 3, 16, 0x82, 0];
        assert_eq!(padded.fragment(&payload).unwrap(), &[0x82]);
        let data = Head {
            len: 4,
            kind: DATA,
            flags: PADDED,
            stream: 1,
        };
        assert_eq!(data.data(&[2, 7, 0, 0]).unwrap(), 1..2);
        assert!(data.data(&[9, 7]).is_err());
        assert!(data.data(&[]).is_err());
    }

    /// A re-encoded block too long for one frame goes as HEADERS and
    /// CONTINUATIONs within the limit, END_STREAM on the first and
    /// END_HEADERS on the last, and decodes to the same fields, leaving
    /// the table alone.
    #[test]
    fn a_re_encoded_block_splits_at_the_frame_limit() {
        let long = Bytes::from(vec![b'x'; 10_000]);
        let mut fields = vec![(Bytes::from_static(b"grpc-status"), Bytes::from_static(b"0"))];
        fields.extend((0..4).map(|_| (Bytes::from_static(b"x-long"), long.clone())));
        let out = header_block(7, true, &fields, DEFAULT_MAX_FRAME);
        let mut rest = &out[..];
        let mut heads = Vec::new();
        let mut block = Vec::new();
        while let Some(head) = Head::parse(rest) {
            block.extend_from_slice(&rest[HEAD_LEN..HEAD_LEN + head.len]);
            rest = &rest[HEAD_LEN + head.len..];
            heads.push(head);
        }
        assert!(rest.is_empty());
        let kinds: Vec<_> = heads.iter().map(|h| (h.kind, h.flags)).collect();
        assert_eq!(
            kinds,
            [
                (HEADERS, END_STREAM),
                (CONTINUATION, 0),
                (CONTINUATION, END_HEADERS)
            ]
        );
        assert!(
            heads
                .iter()
                .all(|h| h.len <= DEFAULT_MAX_FRAME && h.stream == 7)
        );
        assert_eq!(block[0], 0x10, "never indexed");
        let decoded = decode(&block);
        assert_eq!(decoded[0], ("grpc-status".into(), "0".into()));
        assert_eq!(decoded.len(), 5);
        assert!(decoded[1..].iter().all(|(_, v)| v.len() == long.len()));
        let empty = header_block(9, false, &[], DEFAULT_MAX_FRAME);
        assert_eq!(Head::parse(&empty).unwrap().flags, END_HEADERS);
    }

    #[test]
    fn settings_and_window_updates_parse() {
        let head = Head {
            len: 12,
            kind: SETTINGS,
            flags: 0,
            stream: 0,
        };
        let payload = [0, 4, 0, 1, 0, 0, 0, 5, 0, 0, 64, 0];
        let settings: Vec<_> = head.settings(&payload).unwrap().collect();
        assert_eq!(settings, [(4, 65_536), (5, 16_384)]);
        assert!(head.settings(&payload[..7]).is_err());
        let mut out = BytesMut::new();
        window_update(3, 1000, &mut out);
        let parsed = Head::parse(&out).unwrap();
        assert_eq!(parsed.increment(&out[HEAD_LEN..]), Ok(1000));
        assert!(parsed.increment(&out[HEAD_LEN..12]).is_err());
    }

    #[test]
    fn the_status_answer_decodes_and_leaves_the_table_alone() {
        let long = "x".repeat(300);
        let frame = grpc_status_frame(7, false, 14, &format!("gone 100% {long}\n"));
        let head = Head::parse(&frame).unwrap();
        assert_eq!(head.flags, END_STREAM | END_HEADERS);
        let fields = decode(&frame[HEAD_LEN..]);
        assert_eq!(fields[0], (":status".into(), "200".into()));
        assert_eq!(
            fields[1],
            ("content-type".into(), "application/grpc".into())
        );
        assert_eq!(fields[2], ("grpc-status".into(), "14".into()));
        assert_eq!(fields[3].1, format!("gone 100%25 {long}%0A"));
        let trailers = grpc_status_frame(7, true, 14, "gone");
        assert_eq!(decode(&trailers[HEAD_LEN..]).len(), 2);
    }
}
