#!/usr/bin/env python3
"""A grpcio (C-core) client for crr-proxy's tests, driven line by line, so a
test can interleave its calls with what it does to the runtime.

One channel for the whole life of the process: the point is that the same
channel recovers when the runtime comes back.

stdin, one command a line:
  call <full method path> <hex request bytes, or - for none> [<timeout seconds, default 10>]
      -> one JSON line: {"code": "OK"|"UNAVAILABLE"|..., "details": "...",
                         "response": "<hex>", "ms": <float>}
  stream <full method path> <hex request bytes, or -> [<timeout seconds>]
      a server-streaming call: one JSON line {"message": "<hex>"} as each
      response arrives, then one like call's (without "response")
  quit
An unreadable command answers {"code": "BAD_COMMAND", "details": "..."}.
On EOF of stdin the process exits 0.

The target is `unix:<--socket>`; the authority is left to C-core (which then
sends the percent-encoded socket path as :authority) unless --authority is
given. --target passes a raw target string instead of --socket.
"""

import argparse
import json
import sys
import time

import grpc


def channel_option(text):
    name, _, value = text.partition("=")
    if not name or not _:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name, int(value)
    except ValueError:
        return name, value


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", help="unix socket path (target unix:PATH)")
    where.add_argument("--target", help="a raw gRPC target string")
    p.add_argument("--authority", help="grpc.default_authority")
    p.add_argument("--option", action="append", type=channel_option, default=[],
                   metavar="NAME=VALUE", help="another channel argument (repeatable)")
    args = p.parse_args()

    target = args.target if args.target is not None else f"unix:{args.socket}"
    options = list(args.option)
    if args.authority is not None:
        options.append(("grpc.default_authority", args.authority))
    channel = grpc.insecure_channel(target, options=options)
    calls = {}

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] not in ("call", "stream") or len(words) not in (3, 4):
            answer({"code": "BAD_COMMAND", "details": f"cannot read {line.strip()!r}",
                    "response": "", "ms": 0.0})
            continue
        path = words[1]
        try:
            request = bytes.fromhex(words[2]) if words[2] != "-" else b""
            timeout = float(words[3]) if len(words) == 4 else 10.0
        except ValueError as e:
            answer({"code": "BAD_COMMAND", "details": str(e), "response": "", "ms": 0.0})
            continue
        call = calls.get((words[0], path))
        if call is None:
            # Identity serialisers: requests and responses are bytes.
            kind = channel.unary_unary if words[0] == "call" else channel.unary_stream
            call = kind(path, request_serializer=None, response_deserializer=None)
            calls[(words[0], path)] = call
        t0 = time.monotonic()
        try:
            if words[0] == "call":
                response = call(request, timeout=timeout)
                result = {"code": "OK", "details": "", "response": bytes(response).hex()}
            else:
                for message in call(request, timeout=timeout):
                    answer({"message": bytes(message).hex()})
                result = {"code": "OK", "details": ""}
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            result = {"code": code.name if code is not None else "UNKNOWN",
                      "details": (e.details() if hasattr(e, "details") else str(e)) or ""}
            if words[0] == "call":
                result["response"] = ""
        result["ms"] = round((time.monotonic() - t0) * 1000, 3)
        answer(result)
    channel.close()


if __name__ == "__main__":
    main()
