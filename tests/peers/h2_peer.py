#!/usr/bin/env python3
"""Raw HTTP/2 test peers for crr-proxy's relay, run by the Rust integration
tests with $CRR_TEST_PYTHON (scripts/lib/peers.sh: ensure_peers).

Each client scenario connects to the proxy's unix socket, plays one exchange
that a relay defect breaks, and
- exits 0 and prints ONE line of JSON with its figures on stdout when the
  proxy behaved correctly;
- exits 1 with ONE line on stderr saying what went wrong otherwise
  (2: bad usage or an internal error; 3: the overall --timeout ran out).

`runtime-server` is the other side: a scripted CRI runtime (HTTP/2 server,
h2) on a unix socket, which prints `ready` once it listens.

The clients speak HTTP/2 by hand (frames built here, header blocks from
`hpack`), because several scenarios need frames a conforming library will
not produce; they keep their own strict account of the flow-control windows
they granted, so a peer that overruns one fails the scenario.
"""

import argparse
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

import hpack

# --- HTTP/2 wire ----------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
FRAME_NAMES = ["DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS",
               "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE", "CONTINUATION"]

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

ERROR_NAMES = ["NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
               "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM",
               "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM",
               "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"]
NO_ERROR, PROTOCOL_ERROR, CANCEL = 0, 1, 8

DEFAULT_WINDOW = 65535
MAX_FRAME = 16384


def error_name(code):
    return ERROR_NAMES[code] if 0 <= code < len(ERROR_NAMES) else f"0x{code:x}"


def frame_name(kind):
    return FRAME_NAMES[kind] if 0 <= kind < len(FRAME_NAMES) else f"type 0x{kind:x}"


def frame(kind, flags, stream, payload=b""):
    return (struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
            + struct.pack(">I", stream & 0x7FFFFFFF) + bytes(payload))


def settings_frame(values):
    payload = b"".join(struct.pack(">HI", k, v) for k, v in values.items())
    return frame(SETTINGS, 0, 0, payload)


def window_update_frame(stream, increment):
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def goaway_frame(last_stream, code, debug=b""):
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code) + debug)


def parse_frames(buf):
    """Whole frames at the front of `buf`: ([(kind, flags, stream, payload)], rest)."""
    out = []
    at = 0
    while len(buf) - at >= 9:
        length = int.from_bytes(buf[at:at + 3], "big")
        if len(buf) - at < 9 + length:
            break
        kind, flags = buf[at + 3], buf[at + 4]
        stream = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7FFFFFFF
        out.append((kind, flags, stream, bytes(buf[at + 9:at + 9 + length])))
        at += 9 + length
    return out, buf[at:]


def strip_padding(flags, payload, priority_allowed):
    """The fragment or data of a HEADERS/DATA payload, without padding and priority."""
    pad = 0
    if flags & PADDED:
        if not payload:
            raise Fail("peer sent a PADDED frame with no pad length")
        pad = payload[0]
        payload = payload[1:]
    if priority_allowed and flags & PRIORITY_FLAG:
        payload = payload[5:]
    if pad > len(payload):
        raise Fail("peer sent more padding than payload")
    return payload[:len(payload) - pad]


# --- HPACK, by hand where the scenario needs exact bytes ------------------

def hp_int(value, prefix_bits, first=0):
    """RFC 7541 §5.1 integer; `first` carries the representation's flag bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hp_str(raw):
    """A string literal, no Huffman."""
    return hp_int(len(raw), 7) + raw


def hp_indexed(index):
    return hp_int(index, 7, 0x80)


def hp_literal(name, value, indexing=False):
    """Literal with incremental indexing (6-bit prefix, 01) or without
    indexing (4-bit prefix, 0000); `name` is a table index or bytes."""
    prefix, first = (6, 0x40) if indexing else (4, 0x00)
    if isinstance(name, int):
        return hp_int(name, prefix, first) + hp_str(value)
    return bytes([first]) + hp_str(name) + hp_str(value)


# Static table indices (RFC 7541 Appendix A).
IDX_AUTHORITY = 1
IDX_METHOD_POST = 3
IDX_PATH = 4
IDX_SCHEME_HTTP = 6
IDX_CONTENT_TYPE = 31


def plain_prefix_fields():
    """:method POST, :scheme http, :authority localhost, content-type
    application/grpc: static-table references and literals without indexing,
    so they leave both HPACK tables untouched."""
    return (hp_indexed(IDX_METHOD_POST) + hp_indexed(IDX_SCHEME_HTTP)
            + hp_literal(IDX_AUTHORITY, b"localhost")
            + hp_literal(IDX_CONTENT_TYPE, b"application/grpc"))


# --- gRPC and CRI messages ------------------------------------------------

VERSION = "/runtime.v1.RuntimeService/Version"
CONTAINER_STATUS = "/runtime.v1.RuntimeService/ContainerStatus"
REASON = b"ContainerRecreateRequest"


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def pb_string(field, value):
    return varint(field << 3 | 2) + varint(len(value)) + value


def grpc_message(msg):
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def version_request():
    return grpc_message(pb_string(1, b"0.1.0"))


def container_status_request(container_id):
    return grpc_message(pb_string(1, container_id.encode()))


def version_response(size):
    """A VersionResponse-shaped protobuf of exactly `size` bytes: field 1
    (version) holding a string of 'v's."""
    if size < 2:
        return b"\x00" * size  # not a valid message; nobody asked for one that small
    for header in range(2, 12):
        body = size - header
        if body >= 0 and len(varint(10)) + len(varint(body)) == header:
            return varint(10) + varint(body) + b"v" * body
    raise ValueError(size)


def grpc_messages(body):
    """The gRPC messages in a response body; raises Fail on a torn one."""
    out = []
    at = 0
    while at < len(body):
        if len(body) - at < 5:
            raise Fail(f"response body ends in a torn gRPC prefix ({len(body) - at} bytes)")
        n = int.from_bytes(body[at + 1:at + 5], "big")
        if len(body) - at - 5 < n:
            raise Fail(f"response body ends mid-message ({len(body) - at - 5} of {n} bytes)")
        out.append(bytes(body[at + 5:at + 5 + n]))
        at += 5 + n
    return out


# --- scenario plumbing ----------------------------------------------------

class Fail(Exception):
    """The proxy misbehaved (or the scenario could not run): one line."""


STEP = ["starting"]


def step(text):
    STEP[0] = text


def watchdog(name, seconds):
    def fire():
        sys.stderr.write(f"h2_peer {name}: FAIL: overall timeout of {seconds:g} s reached "
                         f"(while: {STEP[0]})\n")
        sys.stderr.flush()
        os._exit(3)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


def ms_since(t0):
    return round((time.monotonic() - t0) * 1000, 1)


class Stream:
    def __init__(self, sid, window, credit):
        self.id = sid
        self.window = window          # what we still allow the peer to send
        self.credit = credit          # give DATA credit back as it comes
        self.blocks = []              # decoded header blocks, [(name, value)]
        self.data = bytearray()
        self.ended = False            # END_STREAM received
        self.rst = None               # RST_STREAM code received
        self.reset_sent = False
        self.data_frames = 0

    def done(self):
        return self.ended or self.rst is not None

    def field(self, name):
        for block in reversed(self.blocks):
            for n, v in block:
                if n == name:
                    return v
        return None

    def grpc_status(self):
        v = self.field(b"grpc-status")
        return None if v is None else int(v)

    def outcome(self):
        status = self.grpc_status()
        if self.rst is not None and not (self.ended and status is not None):
            return f"RST_STREAM {error_name(self.rst)}"
        if status is not None:
            msg = self.field(b"grpc-message")
            text = f"grpc-status {status}"
            if msg:
                msg = msg.decode(errors="replace")
                text += f" ({msg[:100]}{'...' if len(msg) > 100 else ''})"
            if self.rst is not None:
                text += f", then RST_STREAM {error_name(self.rst)}"
            return text
        http = self.field(b":status")
        if http is not None:
            return f"HTTP :status {http.decode(errors='replace')} without grpc-status"
        return "no answer"


class Conn:
    """One raw HTTP/2 client connection."""

    def __init__(self, path, settings=None, connection_window=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(5)
            self.sock.connect(path)
        except OSError as e:
            raise Fail(f"cannot connect to {path}: {e}")
        self.buf = bytearray()
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder(max_header_list_size=64 << 20)
        self.streams = {}
        self.next_stream = 1
        self.initial_window = DEFAULT_WINDOW
        self.conn_window = DEFAULT_WINDOW
        self.block = None             # the peer's header block in progress
        self.goaways = []             # (last_stream_id, code, debug)
        self.pings_acked = set()
        self.answer_pings = True      # ACK the peer's PINGs at once
        self.pings_received = []
        self.settings_acks = 0
        self.peer_settings = {}
        self.eof = False
        self.hold = False             # queue our own frames (mid header block)
        self.queued = []
        self.frames_in = 0
        settings = dict(settings or {})
        settings.setdefault(SETTINGS_ENABLE_PUSH, 0)
        out = PREFACE + settings_frame(settings)
        if SETTINGS_INITIAL_WINDOW_SIZE in settings:
            self.initial_window = settings[SETTINGS_INITIAL_WINDOW_SIZE]
        if connection_window and connection_window > DEFAULT_WINDOW:
            out += window_update_frame(0, connection_window - DEFAULT_WINDOW)
            self.conn_window = connection_window
        self.send(out)

    # sending

    def send(self, data, urgent=False):
        if self.hold and not urgent:
            self.queued.append(bytes(data))
            return
        try:
            self.sock.settimeout(10)
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            self.drain(1.0)
            self.eof = True
            raise Fail(f"{STEP[0]}: the connection closed while we sent "
                       f"({e.__class__.__name__}){self.goaway_note()}")
        except socket.timeout:
            raise Fail("the proxy did not read what we sent for 10 s")

    def release(self):
        """End of our header block: send what waited."""
        self.hold = False
        queued, self.queued = self.queued, []
        if queued:
            self.send(b"".join(queued))

    def settings(self, values):
        """Sends SETTINGS. A larger INITIAL_WINDOW_SIZE counts at once (the
        peer may use it as soon as it has read it, before its ACK)."""
        if SETTINGS_INITIAL_WINDOW_SIZE in values:
            delta = values[SETTINGS_INITIAL_WINDOW_SIZE] - self.initial_window
            self.initial_window = values[SETTINGS_INITIAL_WINDOW_SIZE]
            for st in self.streams.values():
                st.window += delta
        self.send(settings_frame(values))

    def window_update(self, sid, increment):
        if sid == 0:
            self.conn_window += increment
        elif sid in self.streams:
            self.streams[sid].window += increment
        self.send(window_update_frame(sid, increment))

    def ping(self, payload):
        self.send(frame(PING, 0, 0, payload))

    def reset(self, sid, code=CANCEL):
        self.streams[sid].reset_sent = True
        self.send(frame(RST_STREAM, 0, sid, struct.pack(">I", code)))

    def open_stream(self, credit=True):
        sid = self.next_stream
        self.next_stream += 2
        st = Stream(sid, self.initial_window, credit)
        self.streams[sid] = st
        return st

    def request_block(self, path, extra=()):
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path),
                   (":authority", "localhost"), ("content-type", "application/grpc"),
                   ("te", "trailers")] + list(extra)
        return self.enc.encode(headers)

    def send_block(self, sid, block, end_stream=False, piece=MAX_FRAME):
        """HEADERS plus as many CONTINUATIONs as `piece` requires."""
        pieces = [block[i:i + piece] for i in range(0, len(block), piece)] or [b""]
        out = bytearray()
        for i, p in enumerate(pieces):
            flags = END_HEADERS if i == len(pieces) - 1 else 0
            if i == 0:
                out += frame(HEADERS, flags | (END_STREAM if end_stream else 0), sid, p)
            else:
                out += frame(CONTINUATION, flags, sid, p)
        self.send(bytes(out))

    def start_call(self, path, body, credit=True):
        st = self.open_stream(credit)
        self.send(frame(HEADERS, END_HEADERS, st.id, self.request_block(path))
                  + frame(DATA, END_STREAM, st.id, body))
        return st

    def call(self, path, body, timeout, what):
        t0 = time.monotonic()
        st = self.start_call(path, body)
        self.pump(st.done, timeout, what)
        check_ok(st, what)
        return st, ms_since(t0)

    def ping_roundtrip(self, timeout, what, payload=None):
        payload = payload or os.urandom(8)
        t0 = time.monotonic()
        self.ping(payload)
        self.pump(lambda: payload in self.pings_acked, timeout, what)
        return ms_since(t0)

    # receiving

    def goaway_note(self):
        if not self.goaways:
            return ", no GOAWAY"
        notes = []
        for last, code, debug in self.goaways[-3:]:
            note = f"GOAWAY(last_stream_id={last}, {error_name(code)}"
            if debug:
                note += f", {debug[:120].decode(errors='replace')!r}"
            notes.append(note + ")")
        return ", after " + " then ".join(notes)

    def pump(self, until, timeout, what, allow_eof=False):
        """Reads and handles frames until `until()` holds; Fail on timeout or EOF."""
        step(what)
        deadline = time.monotonic() + timeout
        while not until():
            if self.eof:
                if allow_eof:
                    return False
                raise Fail(f"{what}: the connection closed{self.goaway_note()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail(f"{what}: nothing within {timeout:g} s{self.goaway_note_if_any()}")
            if not self.read_some(left):
                continue
        return True

    def idle(self, seconds, what):
        """Handles whatever arrives for `seconds` (a closed connection ends it)."""
        step(what)
        deadline = time.monotonic() + seconds
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.read_some(left)

    def drain(self, seconds):
        """What is left to read before EOF (for a GOAWAY to report), without
        answering anything."""
        self.hold = True
        deadline = time.monotonic() + seconds
        try:
            while not self.eof and time.monotonic() < deadline:
                self.read_some(deadline - time.monotonic())
        except Fail:
            pass

    def goaway_note_if_any(self):
        return self.goaway_note() if self.goaways else ""

    def read_some(self, timeout):
        self.sock.settimeout(max(timeout, 0.001))
        try:
            chunk = self.sock.recv(1 << 16)
        except socket.timeout:
            return False
        except (ConnectionResetError, OSError):
            chunk = b""
        if not chunk:
            self.eof = True
            return True
        self.buf += chunk
        frames, rest = parse_frames(self.buf)
        self.buf = bytearray(rest)
        for f in frames:
            self.on_frame(*f)
        return True

    def on_frame(self, kind, flags, sid, payload):
        self.frames_in += 1
        if self.block is not None and kind != CONTINUATION:
            raise Fail(f"the proxy put a {frame_name(kind)} frame inside a header block "
                       f"on stream {self.block[0]}")
        if kind == DATA:
            self.on_data(flags, sid, payload)
        elif kind == HEADERS:
            self.block = (sid, flags, bytearray(strip_padding(flags, payload, True)))
            if flags & END_HEADERS:
                self.end_block()
        elif kind == CONTINUATION:
            if self.block is None or self.block[0] != sid:
                raise Fail(f"the proxy sent a CONTINUATION on stream {sid} with no header "
                           "block open")
            self.block[2].extend(payload)
            if flags & END_HEADERS:
                self.end_block()
        elif kind == RST_STREAM:
            st = self.streams.get(sid)
            if st is not None and len(payload) >= 4:
                st.rst = int.from_bytes(payload[:4], "big")
        elif kind == SETTINGS:
            if flags & ACK:
                self.settings_acks += 1
            else:
                for i in range(0, len(payload) - 5, 6):
                    k, v = struct.unpack(">HI", payload[i:i + 6])
                    self.peer_settings[k] = v
                self.send(frame(SETTINGS, ACK, 0))
        elif kind == PING:
            if flags & ACK:
                self.pings_acked.add(payload)
            else:
                self.pings_received.append(payload)
                if self.answer_pings:
                    self.send(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            last, code = struct.unpack(">II", payload[:8])
            self.goaways.append((last & 0x7FFFFFFF, code, payload[8:]))
        elif kind == PUSH_PROMISE:
            raise Fail("the proxy sent PUSH_PROMISE though we disabled push")

    def on_data(self, flags, sid, payload):
        n = len(payload)
        self.conn_window -= n
        if self.conn_window < 0:
            raise Fail(f"flow control: a {n}-byte DATA on stream {sid} overran the "
                       f"connection window by {-self.conn_window} bytes")
        st = self.streams.get(sid)
        if st is None:
            raise Fail(f"DATA on stream {sid}, which we never opened")
        st.data_frames += 1
        if not st.reset_sent:
            st.window -= n
            if st.window < 0:
                raise Fail(f"flow control: a {n}-byte DATA on stream {sid} overran the "
                           f"stream window by {-st.window} bytes")
            st.data += strip_padding(flags, payload, False)
            if flags & END_STREAM:
                st.ended = True
        if n and (st.credit or st.reset_sent):
            # Connection credit for what we consumed; stream credit while
            # the stream goes on.
            out = window_update_frame(0, n)
            self.conn_window += n
            if st.credit and not st.done():
                out += window_update_frame(sid, n)
                st.window += n
            self.send(out)

    def end_block(self):
        sid, flags, block = self.block
        self.block = None
        try:
            fields = [(bytes(n), bytes(v)) for n, v in self.dec.decode(bytes(block), raw=True)]
        except Exception as e:  # hpack raises several kinds
            raise Fail(f"the proxy sent a header block we cannot decode on stream {sid}: {e}")
        st = self.streams.get(sid)
        if st is None:
            raise Fail(f"HEADERS on stream {sid}, which we never opened")
        if st.reset_sent:
            return
        st.blocks.append(fields)
        if flags & END_STREAM:
            st.ended = True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def check_ok(st, what):
    """Trailers with grpc-status 0 (a RST_STREAM(NO_ERROR) after them is
    lawful: the server no longer wants the rest of the request)."""
    status = st.grpc_status()
    if st.rst is not None and not (st.ended and st.rst == NO_ERROR):
        raise Fail(f"{what}: stream {st.id} got RST_STREAM {error_name(st.rst)}")
    if status != 0 or not st.ended:
        raise Fail(f"{what}: stream {st.id} ended with {st.outcome()}")
    grpc_messages(st.data)


def no_error_goaway(conn, what):
    for last, code, debug in conn.goaways:
        if code != NO_ERROR:
            raise Fail(f"{what}: the proxy sent GOAWAY(last_stream_id={last}, "
                       f"{error_name(code)}, {debug[:120].decode(errors='replace')!r})")


# --- scenarios ------------------------------------------------------------

def held_stream(args):
    """An edited answer stuck on an exhausted stream window must not hold up
    the rest of the connection, and must go on once the window opens."""
    figures = {"release": args.release}
    problems = []
    conn = Conn(args.socket, {SETTINGS_INITIAL_WINDOW_SIZE: args.window},
                connection_window=16 << 20)
    conn.pump(lambda: conn.settings_acks >= 1, 5, "waiting for the ACK of our SETTINGS")

    t0 = time.monotonic()
    held = conn.start_call(CONTAINER_STATUS, container_status_request(args.container_id),
                           credit=False)
    conn.pump(lambda: held.window == 0 or held.done(), 5,
              f"stream 1 (ContainerStatus) filling its {args.window}-byte window")
    if held.done():
        raise Fail(f"stream 1 ended within its {args.window}-byte window ({held.outcome()}): "
                   "no edited answer to hold")
    figures["stuck_ms"] = ms_since(t0)
    # Let whatever else was coming for stream 1 arrive (nothing may: its
    # window is spent).
    conn.idle(0.2, "stream 1 past its window")

    if not args.release_only:
        try:
            figures["ping_ms"] = conn.ping_roundtrip(2, "PING while stream 1 waits for window")
        except Fail as e:
            problems.append(str(e))
        if conn.eof:
            raise Fail("; ".join(problems) or "connection closed")
        try:
            st, figures["version_ms"] = conn.call(VERSION, version_request(), 5,
                                                  "Version while stream 1 waits for window")
            figures["version_stream"] = st.id
        except Fail as e:
            problems.append(str(e))
    if held.done():
        problems.append(f"stream 1 completed ({held.outcome()}) though its window was "
                        "never opened")
    if problems:
        raise Fail("; ".join(problems))

    t0 = time.monotonic()
    if args.release == "error":
        return held_then_error(conn, held, figures, t0)
    if args.release == "settings":
        conn.settings({SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20})
        conn.pump(held.done, 5, "stream 1 after SETTINGS INITIAL_WINDOW_SIZE=1048576")
        check_ok(held, "stream 1 after the window grew")
        if REASON not in held.data:
            raise Fail(f"stream 1's answer ({len(held.data)} bytes) lacks "
                       f"{REASON.decode()}: was it edited?")
        figures["release_ms"] = ms_since(t0)
        figures["held_body_bytes"] = len(held.data)
        figures["held_data_frames"] = held.data_frames
    else:
        conn.reset(held.id, CANCEL)
        st, figures["after_rst_version_ms"] = conn.call(
            VERSION, version_request(), 5, "Version after RST_STREAM(CANCEL) on stream 1")
        figures["after_rst_ping_ms"] = conn.ping_roundtrip(5, "PING after RST_STREAM on stream 1")
        figures["release_ms"] = ms_since(t0)
    no_error_goaway(conn, "held-stream")
    conn.close()
    return figures


def held_then_error(conn, held, figures, t0):
    """We break the protocol (a PING inside our own header block) while the
    proxy holds stream 1's answer, then open its window: the whole answer
    still comes, then GOAWAY(PROTOCOL_ERROR)."""
    broken = conn.open_stream()
    conn.send(frame(HEADERS, 0, broken.id, conn.request_block(VERSION))
              + frame(PING, 0, 0, b"mid-blk!"))
    conn.settings({SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20})
    conn.pump(lambda: held.done() or conn.eof, 5, "stream 1 after our protocol error")
    check_ok(held, "stream 1, answered before the connection ends")
    if REASON not in held.data:
        raise Fail(f"stream 1's answer ({len(held.data)} bytes) lacks {REASON.decode()}")
    figures["release_ms"] = ms_since(t0)
    figures["held_body_bytes"] = len(held.data)
    conn.idle(5, "waiting for the GOAWAY and the end")
    if not conn.eof:
        raise Fail("the connection stayed open 5 s after our protocol error")
    if not conn.goaways or conn.goaways[-1][1] != PROTOCOL_ERROR:
        raise Fail(f"the connection did not end with GOAWAY(PROTOCOL_ERROR){conn.goaway_note()}")
    figures["last_goaway"] = {"last_stream_id": conn.goaways[-1][0],
                              "error": error_name(conn.goaways[-1][1])}
    return figures


def block_open(args):
    """The proxy must write nothing of its own to the runtime between a
    client's HEADERS and its CONTINUATION."""
    conn = Conn(args.socket)
    rounds = []
    for i in range(args.rounds):
        t0 = time.monotonic()
        edited = conn.open_stream()
        version = conn.open_stream()
        # Encoded in the order they go out: the HPACK table is shared.
        first = conn.request_block(CONTAINER_STATUS)
        block = conn.request_block(VERSION)
        cut = max(1, len(block) // 2)
        conn.send(frame(HEADERS, END_HEADERS, edited.id, first)
                  + frame(DATA, END_STREAM, edited.id, container_status_request(args.container_id))
                  + frame(HEADERS, 0, version.id, block[:cut]))
        # Mid header block now: our own answers (PING/SETTINGS ACKs, credit)
        # wait until it ends.
        conn.hold = True
        conn.idle(args.gap, f"round {i + 1}: between HEADERS and CONTINUATION")
        step(f"round {i + 1}: sending the CONTINUATION")
        conn.send(frame(CONTINUATION, END_HEADERS, version.id, block[cut:])
                  + frame(DATA, END_STREAM, version.id, version_request()), urgent=True)
        conn.release()
        what = f"round {i + 1}"
        conn.pump(lambda: edited.done() and version.done(), 5,
                  f"{what}: streams {edited.id} and {version.id}")
        check_ok(edited, f"{what}: ContainerStatus")
        check_ok(version, f"{what}: Version sent as HEADERS+CONTINUATION")
        if REASON not in edited.data:
            raise Fail(f"{what}: the ContainerStatus answer was not edited (no "
                       f"{REASON.decode()}); start the proxy with a record for the container")
        ping = conn.ping_roundtrip(2, f"{what}: PING")
        no_error_goaway(conn, what)
        rounds.append({"ms": ms_since(t0), "ping_ms": ping})
    conn.close()
    return {"rounds": rounds}


def big_metadata(args):
    """A request with a large (but lawful for the runtime) header block gets
    an answer of its own, and the connection goes on."""
    conn = Conn(args.socket)
    conn.pump(lambda: conn.peer_settings or conn.settings_acks, 5, "the proxy's SETTINGS")
    st = conn.open_stream()
    block = conn.request_block(VERSION) + hp_literal(b"x-big", b"a" * args.size)
    t0 = time.monotonic()
    step("sending the big header block")
    conn.send_block(st.id, block, piece=MAX_FRAME)
    conn.send(frame(DATA, END_STREAM, st.id, version_request()))
    conn.pump(st.done, 5, f"the answer to the {args.size}-byte x-big request")
    answer = st.outcome()
    big_ms = ms_since(t0)
    _, plain_ms = conn.call(VERSION, version_request(), 5,
                            "a plain Version on the same connection after the big one")
    conn.ping_roundtrip(2, "PING after the big request")
    no_error_goaway(conn, "big-metadata")
    conn.close()
    return {"size": args.size, "block_bytes": len(block), "answer": answer,
            "answered_by": "trailers" if st.ended else "rst",
            "big_ms": big_ms, "plain_ms": plain_ms}


def hpack_flood(args):
    """Header blocks that reference one 4 KB table entry over and over."""
    conn = Conn(args.socket)
    conn.pump(lambda: conn.peer_settings or conn.settings_acks, 5, "the proxy's SETTINGS")
    # ":path" (5) + value + 32 <= 4096: the entry fits the default table.
    base = (VERSION + "?").encode()
    path = base + b"x" * (4096 - 32 - 5 - len(base))
    first = conn.open_stream()
    block = (hp_indexed(IDX_METHOD_POST) + hp_indexed(IDX_SCHEME_HTTP)
             + hp_literal(IDX_PATH, path, indexing=True)
             + hp_literal(IDX_AUTHORITY, b"localhost")
             + hp_literal(IDX_CONTENT_TYPE, b"application/grpc")
             + hp_literal(b"te", b"trailers"))
    conn.send_block(first.id, block)
    conn.send(frame(DATA, END_STREAM, first.id, version_request()))
    conn.pump(first.done, 5, "the answer to the request that indexes the 4 KB :path")
    results = []
    t0 = time.monotonic()
    flood = plain_prefix_fields() + bytes([0xBE]) * args.block_bytes  # 0xBE: index 62
    outcome = "done"
    for i in range(args.repeat):
        st = conn.open_stream()
        t1 = time.monotonic()
        try:
            conn.send_block(st.id, flood, piece=MAX_FRAME)
            conn.send(frame(DATA, END_STREAM, st.id, version_request()))
        except Fail:
            pass  # the connection closed: reported below
        seen_goaways = len(conn.goaways)
        step(f"flood request {i + 1}")
        deadline = time.monotonic() + args.answer_timeout
        while not st.done() and not conn.eof and len(conn.goaways) == seen_goaways:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail(f"flood request {i + 1} (stream {st.id}): no answer within "
                           f"{args.answer_timeout:g} s")
            conn.read_some(left)
        entry = {"stream": st.id, "s": round(time.monotonic() - t1, 3)}
        if st.done():
            entry["answer"] = st.outcome()
            results.append(entry)
            continue
        if len(conn.goaways) > seen_goaways:
            last, code, _ = conn.goaways[-1]
            entry["answer"] = f"GOAWAY(last_stream_id={last}, {error_name(code)})"
            results.append(entry)
            outcome = "goaway"
            break
        raise Fail(f"flood request {i + 1} (stream {st.id}): the connection closed "
                   f"without GOAWAY{' or answer' if not st.done() else ''}")
    return {"repeat": args.repeat, "sent": len(results), "block_bytes": len(flood),
            "path_bytes": len(path), "first_answer": first.outcome(), "outcome": outcome,
            "total_s": round(time.monotonic() - t0, 3), "answers": results}


def goaway_order(args):
    """Every GOAWAY's last_stream_id is no higher than the one before (RFC
    9113 §6.8)."""
    conn = Conn(args.socket)
    _, call_ms = conn.call(VERSION, version_request(), 5, "the first Version call")
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write("ready\n")
    deadline = time.monotonic() + args.listen_seconds
    step("listening for GOAWAYs")
    while not conn.eof:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.read_some(left)
    goaways = [{"last_stream_id": last, "error": error_name(code),
                "debug": debug[:120].decode(errors="replace")}
               for last, code, debug in conn.goaways]
    for a, b in zip(conn.goaways, conn.goaways[1:]):
        if b[0] > a[0]:
            raise Fail(f"GOAWAY last_stream_id rose from {a[0]} to {b[0]} (RFC 9113 §6.8); "
                       f"all: {[(g[0], error_name(g[1])) for g in conn.goaways]}")
    return {"call_ms": call_ms, "goaways": goaways, "closed": conn.eof}


def drain(args):
    """The proxy shuts down as RFC 9113 §6.8 says: GOAWAY(2^31-1) and a
    PING; a stream that reaches it before the PING's ACK is answered; then
    a GOAWAY naming the last stream it took, and the end once that stream
    is answered. Without our ACK, the final GOAWAY still comes, in time."""
    conn = Conn(args.socket)
    _, figures_ms = conn.call(VERSION, version_request(), 5, "the first Version call")
    conn.answer_pings = False
    with open(args.ready_file, "w") as f:
        f.write("ready\n")
    conn.pump(lambda: conn.goaways, 10, "waiting for the first GOAWAY")
    first = conn.goaways[0]
    if first[0] != 0x7FFFFFFF or first[1] != NO_ERROR:
        raise Fail(f"the first GOAWAY was not (2^31-1, NO_ERROR){conn.goaway_note()}")
    conn.pump(lambda: conn.pings_received, 2, "waiting for the PING after the first GOAWAY")
    # A call that crossed the GOAWAY on its way: it went before our ACK,
    # so it must be served.
    crossing = conn.start_call(VERSION, version_request())
    t0 = time.monotonic()
    if args.ack:
        conn.send(frame(PING, ACK, 0, conn.pings_received[0]))
    conn.pump(lambda: len(conn.goaways) >= 2, 5, "waiting for the final GOAWAY")
    final_ms = ms_since(t0)
    last, code, _ = conn.goaways[1]
    if code != NO_ERROR or last != crossing.id:
        raise Fail(f"the final GOAWAY should name stream {crossing.id}{conn.goaway_note()}")
    conn.pump(crossing.done, 5, f"stream {crossing.id}, taken before the final GOAWAY")
    check_ok(crossing, f"stream {crossing.id}")
    conn.idle(5, "waiting for the end")
    if not conn.eof:
        raise Fail("the connection stayed open 5 s after its last call")
    return {"first_call_ms": figures_ms, "final_goaway_ms": final_ms,
            "goaways": [(g[0], error_name(g[1])) for g in conn.goaways]}


def runtime_server(args):
    """A scripted runtime: answers every request with one message of
    --answer-bytes, within the client's windows."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    body = grpc_message(version_response(args.answer_bytes))
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(args.socket)
    srv.listen(16)

    def stop(*_):
        try:
            os.unlink(args.socket)
        except OSError:
            pass
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)

    def serve(sock):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None))
        conn.initiate_connection()
        out = bytearray(conn.data_to_send())
        pending = {}   # stream -> [headers sent, bytes left]
        answered = 0
        goaway_after = None
        stalled = set()
        sock.setblocking(False)
        while True:
            # Produce what the windows allow, while little waits unsent.
            for sid in sorted(pending):
                if len(out) > (1 << 20):
                    break
                state = pending.get(sid)
                if state is None:
                    continue
                if not state[0]:
                    conn.send_headers(sid, [(b":status", b"200"),
                                            (b"content-type", b"application/grpc")])
                    state[0] = True
                while state[1] and len(out) <= (1 << 20):
                    n = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size,
                            len(state[1]))
                    if n <= 0:
                        break
                    conn.send_data(sid, state[1][:n])
                    state[1] = state[1][n:]
                    out += conn.data_to_send()
                if not state[1]:
                    conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
                    del pending[sid]
                    answered += 1
                    if args.goaway_then_answer and sid == goaway_after:
                        # A graceful restart: the answer promised by the
                        # GOAWAY goes, then the connection closes.
                        out += conn.data_to_send()
                        sock.setblocking(True)
                        sock.sendall(out)
                        return
                    if args.open_block_after_first and answered == 1:
                        # A header block begun and never ended, on every
                        # other stream's behalf (only one may be open).
                        for other in [s for s in pending if s != sid][:1]:
                            out += conn.data_to_send()
                            out += frame(HEADERS, 0, other, b"\x88")
                            stalled.add(other)
                            del pending[other]
                        if args.close_after_block:
                            # A runtime that dies mid-block.
                            out += conn.data_to_send()
                            sock.setblocking(True)
                            sock.sendall(out)
                            return
                    if args.goaway_after_first and answered == 1:
                        out += conn.data_to_send()
                        out += goaway_frame(sid, NO_ERROR)
                        goaway_after = sid
                        for other in [s for s in pending if s > sid]:
                            del pending[other]
                out += conn.data_to_send()
            rlist, wlist, _ = select.select([sock], [sock] if out else [], [], 1.0)
            if wlist:
                try:
                    n = sock.send(out)
                except BlockingIOError:
                    n = 0
                del out[:n]
            if rlist:
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    return
                try:
                    events = conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    # h2 has queued its GOAWAY: what was due goes first,
                    # whole, then the GOAWAY.
                    out += conn.data_to_send()
                    sock.setblocking(True)
                    sock.settimeout(10)
                    try:
                        sock.sendall(out)
                    except OSError:
                        pass
                    return
                for ev in events:
                    if isinstance(ev, h2.events.DataReceived):
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded):
                        if args.goaway_then_answer and goaway_after is None:
                            # Stream 1 will be answered, nothing after it.
                            out += conn.data_to_send()
                            out += goaway_frame(ev.stream_id, NO_ERROR)
                            goaway_after = ev.stream_id
                        if goaway_after is None or ev.stream_id <= goaway_after:
                            if ev.stream_id not in stalled:
                                pending[ev.stream_id] = [False, body]
                    elif isinstance(ev, h2.events.StreamReset):
                        pending.pop(ev.stream_id, None)
                    elif isinstance(ev, h2.events.ConnectionTerminated):
                        out += conn.data_to_send()
                        sock.setblocking(True)
                        try:
                            sock.sendall(out)
                        except OSError:
                            pass
                        return
                out += conn.data_to_send()

    while True:
        sock, _ = srv.accept()
        try:
            serve(sock)
        except (ConnectionResetError, BrokenPipeError):
            pass
        except Exception as e:  # one connection's trouble; keep serving
            sys.stderr.write(f"h2_peer runtime-server: connection ended: "
                             f"{e.__class__.__name__}: {e}\n")
        finally:
            sock.close()


def slow_reader(args):
    """Several calls at once, then a pause without reading (answers queue
    up in the proxy), then everything to the end: each stream's outcome."""
    window = 16 << 20
    conn = Conn(args.socket, {SETTINGS_INITIAL_WINDOW_SIZE: window}, connection_window=window)
    out = b""
    streams = []
    for _ in range(args.calls):
        st = conn.open_stream()
        streams.append(st)
        out += (frame(HEADERS, END_HEADERS, st.id, conn.request_block(VERSION))
                + frame(DATA, END_STREAM, st.id, version_request()))
    conn.send(out)
    step("not reading, so that the answers queue up in the proxy")
    time.sleep(args.pause)
    conn.pump(lambda: all(st.done() for st in streams), args.read_timeout,
              "every stream's end", allow_eof=True)
    conn.idle(2, "until the connection ends")
    return {"streams": {str(st.id): {"grpc_status": st.grpc_status(),
                                     "message": (st.field(b"grpc-message") or b"").decode(
                                         errors="replace"),
                                     "body_bytes": len(st.data), "ended": st.ended}
                        for st in streams},
            "goaways": [(g[0], error_name(g[1])) for g in conn.goaways],
            "closed": conn.eof}


def error_after_queued(args):
    """A client's protocol error while answers wait for it: the proxy ends
    with whole frames and a GOAWAY(PROTOCOL_ERROR)."""
    window = 16 << 20
    conn = Conn(args.socket, {SETTINGS_INITIAL_WINDOW_SIZE: window}, connection_window=window)
    out = b""
    for _ in range(args.calls):
        st = conn.open_stream()
        out += (frame(HEADERS, END_HEADERS, st.id, conn.request_block(VERSION))
                + frame(DATA, END_STREAM, st.id, version_request()))
    conn.send(out)
    step("not reading, so that the proxy's buffer towards us fills")
    time.sleep(args.pause)
    # A CONTINUATION with no header block open: a connection error
    # (PROTOCOL_ERROR, RFC 9113 §6.10).
    try:
        conn.send(frame(CONTINUATION, END_HEADERS, st.id, b"\x88"))
    except Fail as e:
        raise Fail(f"sending the malformed frame: {e}")
    step("reading until EOF")
    raw = bytearray()
    deadline = time.monotonic() + args.read_timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Fail(f"no EOF within {args.read_timeout:g} s after the malformed frame "
                       f"({len(raw)} bytes read)")
        conn.sock.settimeout(left)
        try:
            chunk = conn.sock.recv(1 << 20)
        except socket.timeout:
            continue
        except (ConnectionResetError, OSError):
            chunk = b""
        if not chunk:
            break
        raw += chunk
    raw = bytes(conn.buf) + bytes(raw)
    frames, rest = parse_frames(raw)
    data_bytes = sum(len(p) for k, _, _, p in frames if k == DATA)
    goaways = [(int.from_bytes(p[:4], "big") & 0x7FFFFFFF, int.from_bytes(p[4:8], "big"))
               for k, _, _, p in frames if k == GOAWAY]
    figures = {"bytes": len(raw), "frames": len(frames), "data_bytes": data_bytes,
               "goaways": [(last, error_name(code)) for last, code in goaways]}
    if rest:
        raise Fail(f"the proxy's last {len(rest)} bytes are a torn frame (after "
                   f"{len(frames)} whole frames, {data_bytes} DATA bytes; "
                   f"GOAWAYs: {figures['goaways']})")
    if not frames or frames[-1][0] != GOAWAY:
        last = frame_name(frames[-1][0]) if frames else "nothing"
        raise Fail(f"the connection ended without GOAWAY (last frame: {last}; "
                   f"{data_bytes} DATA bytes received)")
    code = goaways[-1][1]
    if code != PROTOCOL_ERROR:
        raise Fail(f"the final GOAWAY says {error_name(code)}, not PROTOCOL_ERROR")
    figures["last_goaway"] = {"last_stream_id": goaways[-1][0], "error": error_name(code)}
    return figures


# --- command line ---------------------------------------------------------

def cri_call(args):
    """One CRI call as kubelet makes it, with headers of our choosing; with
    --release-file, the file is written once the first response message is
    in, while the stream still runs (the scripted runtime waits for it)."""
    conn = Conn(args.socket)
    extra = [tuple(h.split("=", 1)) for h in args.header]
    body = bytes.fromhex(args.request)
    st = conn.open_stream()
    t0 = time.monotonic()
    conn.send(frame(HEADERS, END_HEADERS, st.id, conn.request_block(args.path, extra))
              + frame(DATA, END_STREAM, st.id, grpc_message(body)))
    first_ms = None
    if args.release_file:
        def first_in():
            return st.done() or len(st.data) >= 5 and \
                len(st.data) - 5 >= int.from_bytes(st.data[1:5], "big")
        conn.pump(first_in, args.answer_timeout, "waiting for the first response message")
        if st.done():
            raise Fail(f"the stream ended before its first message came alone: {st.outcome()}")
        first_ms = ms_since(t0)
        with open(args.release_file, "w") as f:
            f.write("released\n")
    conn.pump(st.done, args.answer_timeout, "waiting for the end of the call")
    status = st.grpc_status()
    figures = {"status": status, "message": (st.field(b"grpc-message") or b"").decode(errors="replace"),
               "ms": ms_since(t0), "first_ms": first_ms}
    if status == 0:
        check_ok(st, "the call")
        figures["messages"] = [m.hex() for m in grpc_messages(st.data)]
    elif status is None:
        raise Fail(f"the call ended with {st.outcome()}")
    conn.close()
    return figures


SCENARIOS = {
    "cri-call": (cri_call, None),
    "held-stream": (held_stream, 10),
    "block-open": (block_open, 10),
    "big-metadata": (big_metadata, 10),
    "hpack-flood": (hpack_flood, None),
    "goaway-order": (goaway_order, None),
    "runtime-server": (runtime_server, None),
    "drain": (drain, 20),
    "error-after-queued": (error_after_queued, None),
    "slow-reader": (slow_reader, 20),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="scenario", required=True)

    def add(name, help_text):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--socket", required=True, help="unix socket path")
        if name != "runtime-server":
            s.add_argument("--timeout", type=float, default=None,
                           help="overall limit in seconds (a default per scenario)")
        return s

    s = add("held-stream", "an edited answer held by a small stream window")
    s.add_argument("--container-id", required=True)
    s.add_argument("--window", type=int, default=16,
                   help="SETTINGS_INITIAL_WINDOW_SIZE: the runtime's whole unedited answer fits "
                        "one as large as it, so its trailers wait in the proxy")
    s.add_argument("--release", choices=["settings", "rst", "error"], required=True)
    s.add_argument("--release-only", action="store_true",
                   help="skip the PING and Version while stream 1 waits: test the release alone")
    s = add("block-open", "no relay frame between a client's HEADERS and CONTINUATION")
    s.add_argument("--container-id", required=True)
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--gap", type=float, default=0.3,
                   help="seconds between HEADERS and CONTINUATION")
    s = add("big-metadata", "a large header block in CONTINUATIONs")
    s.add_argument("--size", type=int, default=1572864, help="bytes of x-big")
    s = add("hpack-flood", "1 MiB blocks of references to a 4 KB table entry")
    s.add_argument("--repeat", type=int, default=3)
    s.add_argument("--block-bytes", type=int, default=1 << 20,
                   help="how many 0xBE bytes each flood block carries")
    s.add_argument("--answer-timeout", type=float, default=20)
    s = add("goaway-order", "GOAWAY last_stream_id never rises")
    s.add_argument("--listen-seconds", type=float, default=5)
    s.add_argument("--ready-file", help="written once the first call is done")
    s = add("drain", "the proxy's graceful shutdown, PING and final GOAWAY")
    s.add_argument("--ready-file", required=True, help="written once the first call is done")
    s.add_argument("--ack", action=argparse.BooleanOptionalAction, default=True,
                   help="acknowledge the proxy's PING")
    s = add("cri-call", "one CRI call with extra headers; prints its messages")
    s.add_argument("--path", required=True)
    s.add_argument("--request", default="", help="the request message, hex")
    s.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    s.add_argument("--release-file", help="written once the first message is in")
    s.add_argument("--answer-timeout", type=float, default=20)
    s = add("runtime-server", "a scripted CRI runtime on --socket")
    s.add_argument("--answer-bytes", type=int, default=10)
    s.add_argument("--goaway-after-first", action="store_true")
    s.add_argument("--goaway-then-answer", action="store_true",
                   help="GOAWAY(first stream) at its request's end, then its answer, then close")
    s.add_argument("--open-block-after-first", action="store_true",
                   help="after the first answer, begin another stream's header block, never end it")
    s.add_argument("--close-after-block", action="store_true",
                   help="with --open-block-after-first: then close the connection")
    s = add("slow-reader", "calls whose answers queue up in the proxy before we read")
    s.add_argument("--calls", type=int, default=2)
    s.add_argument("--pause", type=float, default=1.0)
    s.add_argument("--read-timeout", type=float, default=10)
    s = add("error-after-queued", "a protocol error while answers are queued")
    s.add_argument("--pause", type=float, default=1.0)
    s.add_argument("--calls", type=int, default=1, help="Version calls sent at once")
    s.add_argument("--read-timeout", type=float, default=10)

    args = p.parse_args()
    run, default_timeout = SCENARIOS[args.scenario]
    if args.scenario != "runtime-server":
        timeout = args.timeout
        if timeout is None:
            if args.scenario == "hpack-flood":
                timeout = 10 + args.repeat * args.answer_timeout
            elif args.scenario == "goaway-order":
                timeout = 10 + args.listen_seconds
            elif args.scenario == "cri-call":
                timeout = 5 + args.answer_timeout * 2
            elif args.scenario == "error-after-queued":
                timeout = 5 + args.pause + args.read_timeout
            else:
                timeout = default_timeout
        watchdog(args.scenario, timeout)
    try:
        figures = run(args)
    except Fail as e:
        sys.stderr.write(f"h2_peer {args.scenario}: FAIL: {e}\n")
        sys.exit(1)
    except Exception as e:
        sys.stderr.write(f"h2_peer {args.scenario}: ERROR: {e.__class__.__name__}: {e} "
                         f"(while: {STEP[0]})\n")
        sys.exit(2)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
