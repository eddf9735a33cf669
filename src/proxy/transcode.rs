//! The client's side of a connection that hyper serves (`--image-endpoint`):
//! request header blocks re-encoded on their way to hyper, everything else
//! as it came.
//!
//! hyper (h2) parses `:authority` as a URI authority and resets any stream
//! whose value is not one, though a client may lawfully send other values:
//! grpc C-core sends the percent-encoded socket path. So each request header
//! block is decoded here and encoded again as literals that hyper's table
//! never keeps, with an `:authority` hyper would refuse replaced by
//! `localhost` (what grpc-go sends for a unix socket; no runtime reads it).
//! Every other frame, and everything hyper writes back, passes unchanged.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;
use tracing::debug;

use super::frame::{self, FrameError, HEAD_LEN, Head};
use super::hpack::{self, HpackError};
use super::socket::Inbox;
use crate::telemetry::Chain;

/// What is buffered towards hyper, as a duplex pipe's capacity.
const PIPE: usize = 256 << 10;

/// The largest frame hyper takes: the default SETTINGS_MAX_FRAME_SIZE,
/// which it keeps and announces. A larger one ends the connection here, as
/// hyper would end it, before any of it is buffered.
const MAX_FRAME: usize = frame::DEFAULT_MAX_FRAME;

/// The largest header-block fragment written to hyper in one frame.
const FRAGMENT: usize = MAX_FRAME;

#[derive(Debug, thiserror::Error)]
pub(super) enum TranscodeError {
    #[error("the client did not open with the HTTP/2 connection preface")]
    Preface,
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("a {0}-byte frame is larger than the server allows")]
    FrameTooLarge(usize),
    #[error("a header block interrupted by a frame of type {0:#x}")]
    Interleaved(u8),
    #[error("HPACK")]
    Hpack(#[from] HpackError),
}

/// Starts relaying `client` through a transcoder; gives back the end hyper
/// serves.
pub(super) fn serve(client: UnixStream) -> DuplexStream {
    let (ours, hypers) = tokio::io::duplex(PIPE);
    tokio::spawn(pump(client, ours));
    hypers
}

async fn pump(client: UnixStream, ours: DuplexStream) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_hyper, mut to_hyper) = tokio::io::split(ours);
    let answers = async {
        let _ = tokio::io::copy(&mut from_hyper, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    let requests = async {
        let mut transcoder = Transcoder::default();
        let mut buf = vec![0; 64 << 10];
        let mut out = BytesMut::new();
        loop {
            let n = match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Err(error) = transcoder.feed(&buf[..n], &mut out) {
                // hyper sees the connection end; only this client's goes.
                debug!(error = %Chain(&error), "client connection ended");
                break;
            }
            if to_hyper.write_all(&out.split()).await.is_err() {
                break;
            }
        }
        let _ = to_hyper.shutdown().await;
    };
    tokio::join!(answers, requests);
}

/// The client-to-hyper direction: frames in, frames out.
#[derive(Default)]
struct Transcoder {
    preface_seen: bool,
    /// Bytes of a frame not yet complete (at most one frame: hyper's
    /// largest, so every byte is copied a bounded number of times).
    pending: Inbox,
    decoder: Option<hpack::Decoder>,
    /// The header block under way.
    open: Option<Request>,
}

/// A request header block being decoded.
struct Request {
    stream: u32,
    end_stream: bool,
    fields: Vec<(Bytes, Bytes)>,
    /// Values over 16 MiB (and fields past 16 MiB of header list) are left
    /// out: hyper, whose limit is 1 MiB, refuses the block all the same.
    skipped: usize,
}

impl Transcoder {
    fn decoder(&mut self) -> &mut hpack::Decoder {
        // Every value counts here: the block is encoded again.
        self.decoder
            .get_or_insert_with(|| hpack::Decoder::new().keeping(hpack::MAX_LIST))
    }

    fn feed(&mut self, bytes: &[u8], out: &mut BytesMut) -> Result<(), TranscodeError> {
        // Taken out while its frames are handled, which need `self`.
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend(bytes);
        let mut rest = pending.data();
        let fed = self.frames(&mut rest, out);
        let used = pending.data().len() - rest.len();
        pending.consume(used);
        self.pending = pending;
        fed
    }

    fn frames(&mut self, rest: &mut &[u8], out: &mut BytesMut) -> Result<(), TranscodeError> {
        if !self.preface_seen {
            match frame::preface(rest) {
                None => return Err(TranscodeError::Preface),
                Some(false) => return Ok(()),
                Some(true) => {}
            }
            out.extend_from_slice(frame::PREFACE);
            *rest = &rest[frame::PREFACE.len()..];
            self.preface_seen = true;
        }
        while let Some((head, whole)) =
            frame::next(rest, MAX_FRAME).map_err(TranscodeError::FrameTooLarge)?
        {
            self.frame(head, whole, out)?;
            *rest = &rest[whole.len()..];
        }
        Ok(())
    }

    fn frame(
        &mut self,
        head: Head,
        whole: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), TranscodeError> {
        let in_block = self.open.as_ref().map(|r| r.stream);
        match (in_block, head.kind) {
            (None, frame::HEADERS) => {
                self.open = Some(Request {
                    stream: head.stream,
                    end_stream: head.flags & frame::END_STREAM != 0,
                    fields: Vec::new(),
                    skipped: 0,
                });
            }
            (Some(stream), frame::CONTINUATION) if stream == head.stream => {}
            (None, frame::CONTINUATION) | (Some(_), _) => {
                return Err(TranscodeError::Interleaved(head.kind));
            }
            (None, _) => {
                out.extend_from_slice(whole);
                return Ok(());
            }
        }
        let fragment = head.fragment(&whole[HEAD_LEN..])?;
        let mut fields = Vec::new();
        let mut skipped = 0;
        self.decoder()
            .feed(fragment, &mut |name, value| match value {
                Some(value) => {
                    fields.push((Bytes::copy_from_slice(name), Bytes::copy_from_slice(value)))
                }
                None => skipped += 1,
            })?;
        if let Some(request) = self.open.as_mut() {
            request.fields.append(&mut fields);
            request.skipped += skipped;
        }
        if head.flags & frame::END_HEADERS == 0 {
            return Ok(());
        }
        self.decoder().end()?;
        if let Some(request) = self.open.take() {
            if request.skipped > 0 {
                debug!(skipped = request.skipped, "header values too long to pass");
            }
            encode(&request, out);
        }
        Ok(())
    }
}

/// The request's header block as literals without indexing (RFC 7541
/// §6.2.2), in HEADERS and CONTINUATION frames of at most `FRAGMENT`.
fn encode(request: &Request, out: &mut BytesMut) {
    let mut block = BytesMut::new();
    for (name, value) in &request.fields {
        let value = match &name[..] {
            b":authority" if http::uri::Authority::try_from(&value[..]).is_err() => {
                &b"localhost"[..]
            }
            _ => &value[..],
        };
        frame::literal(&mut block, name, value);
    }
    let mut kind = frame::HEADERS;
    let mut flags = match request.end_stream {
        true => frame::END_STREAM,
        false => 0,
    };
    loop {
        let piece = block.split_to(block.len().min(FRAGMENT));
        if block.is_empty() {
            flags |= frame::END_HEADERS;
        }
        frame::put(out, kind, flags, request.stream, &piece);
        if block.is_empty() {
            return;
        }
        kind = frame::CONTINUATION;
        flags = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    /// The header blocks in `buf`, by stream, decoded.
    fn decode(mut buf: &[u8]) -> Vec<(u32, Fields)> {
        let mut decoder = hpack::Decoder::new().keeping(hpack::MAX_LIST);
        let mut blocks = Vec::new();
        let mut fields = Vec::new();
        while let Some(head) = Head::parse(buf) {
            let payload = &buf[HEAD_LEN..HEAD_LEN + head.len];
            if matches!(head.kind, frame::HEADERS | frame::CONTINUATION) {
                decoder
                    .feed(head.fragment(payload).unwrap(), &mut |n, v| {
                        fields.push((n.to_vec(), v.unwrap().to_vec()))
                    })
                    .unwrap();
                if head.flags & frame::END_HEADERS != 0 {
                    decoder.end().unwrap();
                    blocks.push((head.stream, std::mem::take(&mut fields)));
                }
            }
            buf = &buf[HEAD_LEN + head.len..];
        }
        assert_eq!(decoder.entries(), 0, "nothing enters hyper's table");
        blocks
    }

    /// Two requests, the second referring to the first's indexed fields,
    /// one with a 40 KB value: hyper gets both whole, as literals, with the
    /// percent-encoded authority replaced and everything else as sent.
    #[test]
    fn request_blocks_are_reencoded_with_an_authority_hyper_takes() {
        let authority = b"run%2Fcrr-proxy%2Fcrr-proxy.sock";
        let mut first = vec![0x83, 0x86, 0x41, authority.len() as u8];
        first.extend_from_slice(authority);
        first.extend_from_slice(&[0x44, 5]);
        first.extend_from_slice(b"/a/bc");
        let big = vec![b'x'; 40_000];
        let mut second = vec![0x83, 0x86, 0xbf, 0xbe];
        // A literal with incremental indexing (0x40): too large for the
        // table, it empties it.
        let mut indexed = BytesMut::new();
        frame::literal(&mut indexed, b"x-b", &big);
        indexed[0] = 0x40;
        second.extend_from_slice(&indexed);
        let mut input = frame::PREFACE.to_vec();
        let mut put = |kind, flags, stream, payload: &[u8]| {
            let mut b = BytesMut::new();
            frame::put(&mut b, kind, flags, stream, payload);
            input.extend_from_slice(&b);
        };
        put(frame::SETTINGS, 0, 0, &[]);
        put(frame::HEADERS, frame::END_HEADERS, 1, &first);
        put(frame::DATA, frame::END_STREAM, 1, b"\0\0\0\0\0");
        // Frames no larger than hyper takes.
        let (a, rest) = second.split_at(10_000);
        put(frame::HEADERS, frame::END_STREAM, 3, a);
        let (b, c) = rest.split_at(MAX_FRAME);
        put(frame::CONTINUATION, 0, 3, b);
        put(frame::CONTINUATION, frame::END_HEADERS, 3, c);

        let mut transcoder = Transcoder::default();
        let mut out = BytesMut::new();
        // In pieces, as reads come.
        for piece in input.chunks(777) {
            transcoder.feed(piece, &mut out).unwrap();
        }
        let out = out.strip_prefix(frame::PREFACE).unwrap().to_vec();
        let blocks = decode(&out);
        let field = |n: &str, v: &[u8]| (n.as_bytes().to_vec(), v.to_vec());
        let one = vec![
            field(":method", b"POST"),
            field(":scheme", b"http"),
            field(":authority", b"localhost"),
            field(":path", b"/a/bc"),
        ];
        assert_eq!(blocks[0], (1, one));
        let two = vec![
            field(":method", b"POST"),
            field(":scheme", b"http"),
            field(":authority", b"localhost"),
            field(":path", b"/a/bc"),
            field("x-b", &big),
        ];
        assert_eq!(blocks[1], (3, two));
        // The DATA frame and SETTINGS pass as they came.
        assert!(out.windows(5).any(|w| w == b"\0\0\0\0\0"));
        assert_eq!(&out[..HEAD_LEN], &[0, 0, 0, frame::SETTINGS, 0, 0, 0, 0, 0]);
    }

    /// A frame larger than hyper takes ends the connection as soon as its
    /// header is read; a header block of many frames, 2 MiB in all, goes
    /// through frame by frame.
    #[test]
    fn frames_are_bounded_and_header_blocks_pass_frame_by_frame() {
        let mut transcoder = Transcoder::default();
        let mut out = BytesMut::new();
        let mut input = frame::PREFACE.to_vec();
        input.extend_from_slice(&[0xff, 0xff, 0xff, frame::DATA, 0, 0, 0, 0, 1]);
        let error = transcoder.feed(&input, &mut out).unwrap_err();
        assert!(matches!(error, TranscodeError::FrameTooLarge(_)), "{error}");

        let mut transcoder = Transcoder::default();
        let mut out = BytesMut::new();
        let mut block = BytesMut::new();
        frame::literal(&mut block, b":path", b"/a");
        frame::literal(&mut block, b"x-big", &vec![b'v'; 2 << 20]);
        let mut input = frame::PREFACE.to_vec();
        let pieces: Vec<_> = block.chunks(MAX_FRAME).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let kind = if i == 0 {
                frame::HEADERS
            } else {
                frame::CONTINUATION
            };
            let flags = if i + 1 == pieces.len() {
                frame::END_HEADERS
            } else {
                0
            };
            let mut b = BytesMut::new();
            frame::put(&mut b, kind, flags, 1, piece);
            input.extend_from_slice(&b);
        }
        for piece in input.chunks(64 << 10) {
            transcoder.feed(piece, &mut out).unwrap();
            assert!(transcoder.pending.data().len() < MAX_FRAME + HEAD_LEN);
        }
        let out = out.strip_prefix(frame::PREFACE).unwrap().to_vec();
        let blocks = decode(&out);
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].1[1].1.len(), 2 << 20);
    }

    #[test]
    fn an_authority_hyper_takes_passes_unchanged() {
        let mut request = Request {
            stream: 1,
            end_stream: true,
            fields: vec![(
                Bytes::from_static(b":authority"),
                Bytes::from_static(b"localhost:80"),
            )],
            skipped: 0,
        };
        let mut out = BytesMut::new();
        encode(&request, &mut out);
        assert!(out.windows(12).any(|w| w == b"localhost:80"));
        request.fields[0].1 = Bytes::from_static(b"a b");
        let mut out = BytesMut::new();
        encode(&request, &mut out);
        assert!(out.ends_with(b"localhost"));
    }
}
