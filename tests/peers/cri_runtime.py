#!/usr/bin/env python3
"""A scripted CRI runtime for crr-proxy's tests: a grpcio (C-core) server
that speaks the parts of `runtime.v1` that kubelet 1.37 adds or changes, as
k8s.io/cri-api declares them, with bytes built here by hand.

- The streaming lists (KEP-5825): StreamContainers, StreamPodSandboxes,
  StreamImages, StreamContainerStats, StreamPodSandboxStats and
  StreamPodSandboxMetrics each answer --messages responses of --items items.
  After the first response the stream waits until the file
  <--release-dir>/<method name> exists (and removes it), so a client can only
  finish if the first response reached it while the stream still ran: a relay
  that holds a stream back until its end deadlocks here.
- The long calls (CheckpointContainer, CheckpointPod, RestorePod) wait
  --hold seconds, then answer an empty message.
- CreateContainer answers container_id "created"; Version answers "0.1.0".
- Every other method is UNIMPLEMENTED, grpcio's own answer.

stdout: `ready` once listening, then one JSON line per call when it ends:
  {"method": "<path>", "request": "<hex>", "deadline_left": <seconds or null>,
   "sent": ["<hex of each response>", ...], "code": "OK"|...}
"""

import argparse
import json
import os
import sys
import threading
import time
from concurrent import futures

import grpc

# The protobuf wire helpers of the raw HTTP/2 peer beside this file.
from h2_peer import pb_string as field_bytes

RUNTIME = "/runtime.v1.RuntimeService/"
IMAGES = "/runtime.v1.ImageService/"

# Method -> how one item of its response is shaped: "flat" items carry their
# id in field 1 (Container, PodSandbox, Image, PodSandboxMetrics); "nested"
# ones in field 1 of their attributes, field 1 (ContainerStats,
# PodSandboxStats). Every response keeps its items in field 1.
LISTS = {
    RUNTIME + "StreamContainers": "flat",
    RUNTIME + "StreamPodSandboxes": "flat",
    IMAGES + "StreamImages": "flat",
    RUNTIME + "StreamContainerStats": "nested",
    RUNTIME + "StreamPodSandboxStats": "nested",
    RUNTIME + "StreamPodSandboxMetrics": "flat",
}
LONG_CALLS = {RUNTIME + "CheckpointContainer", RUNTIME + "CheckpointPod",
              RUNTIME + "RestorePod"}
RELEASE_WAIT = 20.0

OUT = threading.Lock()


def report(obj):
    with OUT:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def item(shape, name, padding):
    # Field 99 is one no CRI version defines: the relay must pass it on.
    flat = field_bytes(1, name.encode()) + field_bytes(99, b"p" * padding)
    return field_bytes(1, flat) if shape == "nested" else flat


def list_response(shape, method, index, items, padding):
    name = method.rsplit("/", 1)[1]
    out = b"".join(field_bytes(1, item(shape, f"{name}-{index}-{i}", padding))
                   for i in range(items))
    return out + field_bytes(100, f"response {index}".encode())


def deadline_left(context):
    left = context.time_remaining()
    # grpcio reports a call without a deadline as a very large number.
    return None if left is None or left > 10 ** 8 else round(left, 3)


class Runtime(grpc.GenericRpcHandler):
    def __init__(self, args):
        self.args = args

    def service(self, details):
        method = details.method
        if method in LISTS:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: self.stream_list(method, request, context))
        if method in LONG_CALLS:
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: self.long_call(method, request, context))
        if method == RUNTIME + "CreateContainer":
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: self.answer(method, request, context,
                                                     field_bytes(1, b"created")))
        if method == RUNTIME + "Version":
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: self.answer(method, request, context,
                                                     field_bytes(1, b"0.1.0")))
        return None

    def answer(self, method, request, context, response):
        report({"method": method, "request": request.hex(),
                "deadline_left": deadline_left(context), "sent": [response.hex()],
                "code": "OK"})
        return response

    def long_call(self, method, request, context):
        left = deadline_left(context)
        time.sleep(self.args.hold)
        report({"method": method, "request": request.hex(), "deadline_left": left,
                "sent": [""], "code": "OK"})
        return b""

    def stream_list(self, method, request, context):
        shape = LISTS[method]
        sent = []
        record = {"method": method, "request": request.hex(),
                  "deadline_left": deadline_left(context), "sent": sent, "code": "OK"}
        try:
            for index in range(self.args.messages):
                message = list_response(shape, method, index, self.args.items,
                                        self.args.padding)
                sent.append(message.hex())
                yield message
                if index == 0 and not self.released(method, context):
                    record["code"] = "NOT_RELEASED"
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  "the client never confirmed the first response")
        finally:
            report(record)

    def released(self, method, context):
        flag = os.path.join(self.args.release_dir, method.rsplit("/", 1)[1])
        deadline = time.monotonic() + RELEASE_WAIT
        while time.monotonic() < deadline and context.is_active():
            try:
                os.remove(flag)
                return True
            except FileNotFoundError:
                time.sleep(0.01)
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="unix socket path to listen on")
    p.add_argument("--release-dir", required=True)
    p.add_argument("--messages", type=int, default=40, help="responses per list stream")
    p.add_argument("--items", type=int, default=3, help="items per response")
    p.add_argument("--padding", type=int, default=1200, help="bytes of field 99 per item")
    p.add_argument("--hold", type=float, default=0.0, help="seconds a long call takes")
    args = p.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         handlers=[Runtime(args)])
    if server.add_insecure_port(f"unix:{args.socket}") == 0:
        sys.stderr.write(f"cri_runtime: cannot listen on {args.socket}\n")
        sys.exit(2)
    server.start()
    with OUT:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
