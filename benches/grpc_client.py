"""A second, independent client for the data-path benchmark (grpcio).

benches/latency.rs runs it, when CRR_BENCH_PYTHON names a Python with
grpcio (scripts/bench.sh sets one up), against the same three targets it
measures itself: direct containerd, crr-proxy and socat. Calls are one at a
time; rounds of the targets are interleaved so that drift cancels out of the
ratios. Messages are sent as raw bytes: no generated code is needed.

    grpc_client.py CALLS CONTAINER_ID name=/path.sock ...
"""

import statistics
import sys
import time

import grpc

ROUNDS = 10


def container_status_request(container_id):
    # ContainerStatusRequest { container_id (1): string }
    raw = container_id.encode()
    return b"\x0a" + bytes([len(raw)]) + raw


def main():
    calls = int(sys.argv[1])
    container_id = sys.argv[2]
    targets = [arg.split("=", 1) for arg in sys.argv[3:]]
    methods = [
        ("Version", "/runtime.v1.RuntimeService/Version", b""),
        (
            "ContainerStatus",
            "/runtime.v1.RuntimeService/ContainerStatus",
            container_status_request(container_id),
        ),
    ]
    channels = {name: grpc.insecure_channel(f"unix://{path}") for name, path in targets}
    for method_name, path, request in methods:
        stubs = {
            name: channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            for name, channel in channels.items()
        }
        for stub in stubs.values():
            for _ in range(50):
                stub(request)
        latencies = {name: [] for name in stubs}
        for _ in range(ROUNDS):
            for name, stub in stubs.items():
                for _ in range(calls // ROUNDS):
                    started = time.perf_counter()
                    stub(request)
                    latencies[name].append(time.perf_counter() - started)
        p50 = {name: statistics.median(values) * 1e6 for name, values in latencies.items()}
        for name, value in p50.items():
            print(f"{method_name:<16} {name:>10}: p50 {value:8.1f} µs  (grpcio)")
        direct, proxy, socat = p50["direct"], p50["crr-proxy"], p50["socat"]
        print(
            f"{method_name:<16}      ratio: p50 crr-proxy/direct {proxy / direct:.3f}, "
            f"socat/direct {socat / direct:.3f}; added p50 crr-proxy {proxy - direct:+.1f} µs, "
            f"socat {socat - direct:+.1f} µs  (grpcio)"
        )
    for channel in channels.values():
        channel.close()


if __name__ == "__main__":
    main()
