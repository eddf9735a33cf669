use super::frames::{each_frame, take_preface};
use super::*;
use bytes::BytesMut;

fn seed(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/fuzz/corpus/relay_frames/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).unwrap()
}

fn frames(mut buf: &[u8]) -> Vec<(Head, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(head) = Head::parse(buf) {
        out.push((head, buf[HEAD_LEN..HEAD_LEN + head.len].to_vec()));
        buf = &buf[HEAD_LEN + head.len..];
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A ContainerStatus answer about a recreated container: the client
/// gets the edited status, and the runtime gets its credit back from the
/// relay (the client's own stream credit is not forwarded).
#[test]
fn an_edited_answer_is_rewritten_and_credited() {
    let (to_client, to_upstream) = feed(&seed("unary_edit"));
    assert!(contains(&to_client, crate::reason::REASON.as_bytes()));
    assert!(!contains(&to_client, b"Error"));
    let updates: Vec<(u32, u32)> = frames(to_upstream.strip_prefix(frame::PREFACE).unwrap())
        .into_iter()
        .filter(|(h, _)| h.kind == frame::WINDOW_UPDATE)
        .map(|(h, p)| (h.stream, h.increment(&p).unwrap()))
        .collect();
    // The relay credits the runtime for the DATA frame it received, on
    // the connection and the stream. The client's connection credit
    // covers the edited bytes it got, which the relay already paid for,
    // so only the rest goes on; its credit for the stream, over by then,
    // passes as it came.
    let data_len = frames(&to_client)
        .iter()
        .filter(|(h, _)| h.kind == frame::DATA)
        .map(|(h, _)| h.len as u32)
        .sum::<u32>();
    assert_eq!(updates.len(), 4, "{updates:?}");
    assert_eq!(updates[..2], [(0, updates[0].1), (1, updates[0].1)]);
    assert!(data_len > updates[0].1, "the edit made the answer longer");
    assert_eq!(updates[2], (0, 1000 - data_len));
    assert_eq!(updates[3], (1, 1000));
}

#[test]
fn the_preface_is_taken_whole_or_refused() {
    let mut inbox = Inbox::default();
    inbox.extend(&frame::PREFACE[..10]);
    assert!(!take_preface(&mut inbox).unwrap());
    assert_eq!(inbox.data().len(), 10, "nothing consumed yet");
    inbox.extend(&frame::PREFACE[10..]);
    inbox.extend(b"rest");
    assert!(take_preface(&mut inbox).unwrap());
    assert_eq!(inbox.data(), b"rest");
    let mut other = Inbox::default();
    other.extend(b"GET / HTTP/1.1\r\n");
    assert!(matches!(take_preface(&mut other), Err(RelayError::Preface)));
}

#[test]
fn frames_are_handed_over_whole_in_order_and_only_once_handled() {
    let first = frame_bytes(frame::PING, 0, 0, &[1; 8]);
    let second = frame_bytes(frame::DATA, 0, 1, b"hello");
    let third = frame_bytes(frame::DATA, 0, 3, b"coming");
    let mut inbox = Inbox::default();
    inbox.extend(&first);
    inbox.extend(&second);
    inbox.extend(&third[..HEAD_LEN + 2]);
    let mut seen = Vec::new();
    each_frame(&mut inbox, frame::DEFAULT_MAX_FRAME, |head, whole| {
        seen.push((head.kind, head.stream, whole.len()));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        seen,
        [
            (frame::PING, 0, first.len()),
            (frame::DATA, 1, second.len())
        ]
    );
    assert_eq!(
        inbox.data(),
        &third[..HEAD_LEN + 2],
        "the frame still coming stays"
    );
    // A frame that fails stays unconsumed; one over the limit is refused.
    inbox.extend(&third[HEAD_LEN + 2..]);
    let failed = each_frame(&mut inbox, frame::DEFAULT_MAX_FRAME, |_, _| {
        Err(RelayError::Preface)
    });
    assert!(failed.is_err());
    assert_eq!(inbox.data(), third.as_slice());
    let large = each_frame(&mut inbox, 4, |_, _| Ok(()));
    assert!(matches!(
        large,
        Err(RelayError::FrameTooLarge { len: 6, limit: 4 })
    ));
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    frame::put(&mut out, kind, flags, stream, payload);
    out.to_vec()
}

fn record(upstream: bool, bytes: &[u8]) -> Vec<u8> {
    let len = u16::try_from(bytes.len()).unwrap();
    let mut out = (len | if upstream { 0x8000 } else { 0 })
        .to_be_bytes()
        .to_vec();
    out.extend_from_slice(bytes);
    out
}

/// The client's frames, then the runtime's, then the client's credit
/// of 100 000 bytes on stream 1 (enough for any held answer), through
/// the relay.
fn feed_then_credit(client: &[u8], upstream: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let more = frame_bytes(frame::WINDOW_UPDATE, 0, 1, &100_000u32.to_be_bytes());
    let input = [
        record(false, client),
        record(true, upstream),
        record(false, &more),
    ]
    .concat();
    feed(&input)
}

/// A ContainerStatus answer (the wire_edit seed) as one gRPC message.
fn container_status_message() -> Vec<u8> {
    let message = &std::fs::read(format!(
        "{}/fuzz/corpus/wire_edit/container_status",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()[1..];
    let mut grpc = vec![0];
    grpc.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    grpc.extend_from_slice(message);
    grpc
}

/// A request header block for `path`: literals, never indexed.
fn request_block(path: &[u8]) -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0x04, u8::try_from(path.len()).unwrap()];
    block.extend_from_slice(path);
    block
}

/// `grpc-status: 0` trailers, a literal never indexed.
const OK_TRAILERS: [u8; 15] = [
    0, 11, b'g', b'r', b'p', b'c', b'-', b's', b't', b'a', b't', b'u', b's', 1, b'0',
];

const CONTAINER_STATUS: &[u8] = b"/runtime.v1.RuntimeService/ContainerStatus";

/// Every byte the runtime sends on an edited stream comes back to it as
/// connection credit, also when it arrives while earlier edited bytes wait
/// for the client's window and the stream ends before they go.
#[test]
fn edited_bytes_received_while_others_wait_are_credited_back() {
    let grpc = container_status_message();
    // A 10-byte stream window, then the call.
    let mut client = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]);
    let block = request_block(CONTAINER_STATUS);
    client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &block));
    // Two messages: the first fills the window and waits; the second
    // arrives while it waits; then the trailers.
    let mut upstream = frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]);
    upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
    upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
    let flags = frame::END_HEADERS | frame::END_STREAM;
    upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &OK_TRAILERS));
    // The client reads it all: stream credit only (the connection
    // window is large enough).
    let (to_client, to_upstream) = feed_then_credit(&client, &upstream);
    let body: usize = frames(&to_client)
        .iter()
        .filter(|(h, _)| h.kind == frame::DATA)
        .map(|(h, _)| h.len)
        .sum();
    assert!(body > 2 * grpc.len(), "both messages arrive, edited");
    let credited: u32 = frames(to_upstream.strip_prefix(frame::PREFACE).unwrap())
        .iter()
        .filter(|(h, _)| h.kind == frame::WINDOW_UPDATE && h.stream == 0)
        .map(|(h, p)| h.increment(p).unwrap())
        .sum();
    assert_eq!(credited, 2 * u32::try_from(grpc.len()).unwrap());
}

/// An edited answer held by its 10-byte stream window delays only its
/// stream: a Version answer on stream 3 and a PING ACK pass it. Its
/// trailers, and the runtime's RST_STREAM(NO_ERROR) after them, wait
/// for its data and follow it once the client credits the stream.
#[test]
fn a_held_answer_delays_only_its_stream_and_keeps_its_order() {
    let grpc = container_status_message();
    let mut client = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]);
    let edited = request_block(CONTAINER_STATUS);
    client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &edited));
    let version = request_block(b"/runtime.v1.RuntimeService/Version");
    client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &version));
    let flags = frame::END_HEADERS | frame::END_STREAM;
    let mut upstream = frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]);
    upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
    upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &OK_TRAILERS));
    upstream.extend(frame_bytes(frame::RST_STREAM, 0, 1, &[0; 4]));
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &[0x88]));
    upstream.extend(frame_bytes(frame::DATA, 0, 3, &[0, 0, 0, 0, 2, 10, 0]));
    upstream.extend(frame_bytes(frame::HEADERS, flags, 3, &OK_TRAILERS));
    upstream.extend(frame_bytes(frame::PING, frame::ACK, 0, &[7; 8]));
    let before = [record(false, &client), record(true, &upstream)].concat();
    let (held, _) = feed(&before);
    let held = frames(&held);
    let kinds = |stream: u32| -> Vec<u8> {
        held.iter()
            .filter(|(h, _)| h.stream == stream)
            .map(|(h, _)| h.kind)
            .collect()
    };
    // Stream 1: its headers and 10 bytes; stream 3 complete; the ACK.
    assert_eq!(kinds(1), [frame::HEADERS, frame::DATA], "{held:?}");
    assert_eq!(kinds(3), [frame::HEADERS, frame::DATA, frame::HEADERS]);
    assert!(held.iter().any(|(h, _)| h.kind == frame::PING));

    let (to_client, _) = feed_then_credit(&client, &upstream);
    let stream1: Vec<_> = frames(&to_client)
        .into_iter()
        .filter(|(h, _)| h.stream == 1)
        .collect();
    let (last, rest) = stream1.split_last().unwrap();
    assert_eq!(last.0.kind, frame::RST_STREAM, "the reset comes last");
    let (trailers, data) = rest.split_last().unwrap();
    assert_eq!(trailers.0.kind, frame::HEADERS);
    // Re-encoded: the same field, never to be indexed.
    assert_eq!(trailers.1[0], 0x10);
    assert_eq!(trailers.1[1..], OK_TRAILERS[1..]);
    let body: Vec<u8> = data[1..].iter().flat_map(|(_, p)| p.clone()).collect();
    assert!(contains(&body, crate::reason::REASON.as_bytes()));
}

/// A literal with incremental indexing, new name (RFC 7541 §6.2.1): it
/// enters the table, as grpc-go's encoder does with most fields.
fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x40, u8::try_from(name.len()).unwrap()];
    out.extend_from_slice(name);
    out.push(u8::try_from(value.len()).unwrap());
    out.extend_from_slice(value);
    out
}

/// The client's view: every header block it got, decoded in order
/// against one table, as (stream, fields).
fn client_blocks(to_client: &[u8]) -> Vec<(u32, Vec<(String, String)>)> {
    let mut decoder = hpack::Decoder::new();
    let mut blocks = Vec::new();
    let mut open: Option<(u32, Vec<(String, String)>)> = None;
    for (head, payload) in frames(to_client) {
        if head.kind != frame::HEADERS && head.kind != frame::CONTINUATION {
            continue;
        }
        let (stream, mut fields) = open.take().unwrap_or((head.stream, Vec::new()));
        decoder
            .feed(head.fragment(&payload).unwrap(), &mut |n, v| {
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                fields.push((text(n), text(v.unwrap())));
            })
            .unwrap_or_else(|e| panic!("stream {stream}: {e}"));
        match head.flags & frame::END_HEADERS {
            0 => open = Some((stream, fields)),
            _ => {
                decoder.end().unwrap();
                blocks.push((stream, fields));
            }
        }
    }
    blocks
}

/// The runtime may use the client's HPACK table. Held trailers that
/// add to it are overtaken by other streams' blocks that refer to what
/// they added (the runtime encoded them after the trailers): the
/// client still decodes every block to what the runtime meant, the held
/// ones included, and so does a block that changes the table after that.
#[test]
fn held_trailers_that_change_the_table_are_overtaken_safely() {
    let grpc = container_status_message();
    let settings = [0, 4, 0, 0, 0, 10, 0, 1, 0, 0, 0x10, 0];
    let mut client = frame_bytes(frame::SETTINGS, 0, 0, &settings);
    let edited = request_block(CONTAINER_STATUS);
    client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &edited));
    let version = request_block(b"/runtime.v1.RuntimeService/Version");
    let flags = frame::END_HEADERS | frame::END_STREAM;
    client.extend(frame_bytes(frame::HEADERS, flags, 3, &version));
    client.extend(frame_bytes(frame::HEADERS, flags, 5, &version));

    let mut upstream = frame_bytes(frame::SETTINGS, 0, 0, &[]);
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]));
    upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
    // Held: its window is 10 bytes. Table: x-trace (62), grpc-status (63).
    let held = [
        indexed_literal(b"grpc-status", b"0"),
        indexed_literal(b"x-trace", b"a"),
    ]
    .concat();
    upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &held));
    // Refers to both, and adds x-more (62, the others move up).
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &[0x88]));
    let trailers3 = [vec![0x80 | 63, 0x80 | 62], indexed_literal(b"x-more", b"b")].concat();
    // Split: the re-encoded block must come whole too.
    let (first, second) = trailers3.split_at(3);
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_STREAM, 3, first));
    upstream.extend(frame_bytes(
        frame::CONTINUATION,
        frame::END_HEADERS,
        3,
        second,
    ));
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 5, &[0x88]));
    upstream.extend(frame_bytes(
        frame::HEADERS,
        flags,
        5,
        &[0x80 | 64, 0x80 | 62],
    ));
    let (to_client, to_upstream) = feed_then_credit(&client, &upstream);
    let sent = frames(to_upstream.strip_prefix(frame::PREFACE).unwrap());
    assert_eq!(
        sent[0].1, settings,
        "the client's SETTINGS pass as they came"
    );
    let pair = |n: &str, v: &str| (n.to_string(), v.to_string());
    let status = pair(":status", "200");
    let blocks = client_blocks(&to_client);
    let order: Vec<u32> = blocks.iter().map(|(s, _)| *s).collect();
    assert_eq!(order, [1, 3, 3, 5, 5, 1], "the held trailers come last");
    let ok = pair("grpc-status", "0");
    let trace = pair("x-trace", "a");
    assert_eq!(blocks[0].1, [status]);
    assert_eq!(
        blocks[2].1,
        [ok.clone(), trace.clone(), pair("x-more", "b")]
    );
    assert_eq!(blocks[4].1, [ok.clone(), pair("x-more", "b")]);
    assert_eq!(blocks[5].1, [ok, trace]);
    let body: Vec<u8> = frames(&to_client)
        .into_iter()
        .filter(|(h, _)| h.kind == frame::DATA && h.stream == 1)
        .flat_map(|(_, p)| p)
        .collect();
    assert!(contains(&body, crate::reason::REASON.as_bytes()));
}

/// Blocks that only refer to the table pass as they came, around held
/// trailers that only refer to it too.
#[test]
fn blocks_that_leave_the_table_alone_pass_as_they_came() {
    let grpc = container_status_message();
    let mut client = frame_bytes(frame::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]);
    let edited = request_block(CONTAINER_STATUS);
    client.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &edited));
    let version = request_block(b"/runtime.v1.RuntimeService/Version");
    let flags = frame::END_HEADERS | frame::END_STREAM;
    client.extend(frame_bytes(frame::HEADERS, flags, 3, &version));
    client.extend(frame_bytes(frame::HEADERS, flags, 5, &version));
    let mut upstream = frame_bytes(frame::SETTINGS, 0, 0, &[]);
    // Stream 3 answers first and fills the table.
    let first = indexed_literal(b"grpc-status", b"0");
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 3, &[0x88]));
    upstream.extend(frame_bytes(frame::HEADERS, flags, 3, &first));
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x88]));
    upstream.extend(frame_bytes(frame::DATA, 0, 1, &grpc));
    upstream.extend(frame_bytes(frame::HEADERS, flags, 1, &[0x80 | 62]));
    upstream.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 5, &[0x88]));
    upstream.extend(frame_bytes(frame::HEADERS, flags, 5, &[0x80 | 62]));
    let (to_client, _) = feed_then_credit(&client, &upstream);
    let headers: Vec<(u32, Vec<u8>)> = frames(&to_client)
        .into_iter()
        .filter(|(h, _)| h.kind == frame::HEADERS)
        .map(|(h, p)| (h.stream, p))
        .collect();
    assert_eq!(headers[2], (1, vec![0x88]));
    assert_eq!(headers[3], (5, vec![0x88]));
    assert_eq!(headers[4], (5, vec![0x80 | 62]), "not re-encoded");
    assert_eq!(headers[5].0, 1, "the held trailers come last");
    let blocks = client_blocks(&to_client);
    let ok = ("grpc-status".to_string(), "0".to_string());
    assert_eq!(blocks[5].1, [ok]);
}

/// With a 10-byte stream window, the edited answer reaches the client
/// in pieces that each fit, split and padded input notwithstanding.
#[test]
fn a_tight_window_gets_the_answer_in_pieces() {
    let (to_client, _) = feed(&seed("tight_window"));
    let data: Vec<_> = frames(&to_client)
        .into_iter()
        .filter(|(h, _)| h.kind == frame::DATA)
        .collect();
    assert!(data.len() > 10);
    assert!(data.iter().all(|(h, _)| h.len <= 16));
    let body: Vec<u8> = data.into_iter().flat_map(|(_, p)| p).collect();
    assert!(contains(&body, crate::reason::REASON.as_bytes()));
}

/// A runtime's header block reaches the client only once complete;
/// one past `MAX_HELD_BLOCK` is the runtime's protocol error, and the
/// client still gets whole frames: its call UNAVAILABLE, then GOAWAY.
#[test]
fn a_runtime_block_goes_whole_and_is_bounded() {
    let mut state = State::new(Endpoint::from_path("/t.sock"), Arc::default(), None);
    state.from_client.extend(frame::PREFACE);
    let version = request_block(b"/runtime.v1.RuntimeService/Version");
    let flags = frame::END_HEADERS | frame::END_STREAM;
    state
        .from_client
        .extend(&frame_bytes(frame::HEADERS, flags, 1, &version));
    state.client_frames().unwrap();
    state
        .from_upstream
        .extend(&frame_bytes(frame::SETTINGS, 0, 0, &[]));
    // `:status: 200`, indexed, over and over.
    let piece = vec![0x88; frame::DEFAULT_MAX_FRAME];
    state
        .from_upstream
        .extend(&frame_bytes(frame::HEADERS, 0, 1, &piece));
    state.upstream_frames().unwrap();
    let mut to_client = state.to_client.take().to_vec();
    assert!(
        frames(&to_client)
            .iter()
            .all(|(h, _)| h.kind == frame::SETTINGS),
        "nothing of the open block goes"
    );
    let mut result = Ok(());
    for _ in 0..=MAX_HELD_BLOCK / piece.len() {
        state
            .from_upstream
            .extend(&frame_bytes(frame::CONTINUATION, 0, 1, &piece));
        result = state.upstream_frames();
        if result.is_err() {
            break;
        }
        assert!(state.to_client.take().is_empty());
    }
    assert!(
        matches!(result, Err(RelayError::BlockTooLarge)),
        "{result:?}"
    );
    state.ends.upstream_broken = true;
    state.upstream_gone();
    to_client.extend_from_slice(&state.to_client.take());
    let frames = frames(&to_client);
    assert!(!frames.iter().any(|(h, _)| h.kind == frame::CONTINUATION));
    let status = frames
        .iter()
        .find(|(h, _)| h.kind == frame::HEADERS && h.stream == 1)
        .unwrap();
    assert!(contains(&status.1, b"14"));
    assert_eq!(frames.last().unwrap().0.kind, frame::GOAWAY);
}

/// The runtime going away answers the open call UNAVAILABLE and tells
/// the client to go.
#[test]
fn the_runtime_going_away_ends_open_calls_unavailable() {
    let (to_client, _) = feed(&seed("reset_then_gone"));
    let frames = frames(&to_client);
    let last = frames.last().unwrap();
    assert_eq!(last.0.kind, frame::GOAWAY);
    // Stream 1 was reset by the client; stream 3 was still open.
    let status = frames
        .iter()
        .find(|(h, _)| h.kind == frame::HEADERS && h.stream == 3)
        .unwrap();
    assert!(contains(&status.1, b"grpc-status"));
    assert!(contains(&status.1, b"14"));
    assert!(!frames.iter().any(|(h, _)| h.kind == frame::HEADERS
        && h.stream == 1
        && h.flags & frame::END_STREAM != 0));
}
