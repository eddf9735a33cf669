#!/usr/bin/env bash
# The benchmark in one command: installs containerd, runc, busybox-static
# and socat when missing, and grpcio in a virtualenv under target/ (the
# second, independent client), then runs benches/latency.rs (release
# build), which starts its own private containerd: Debian's 1.6, then the
# 2.3 long-term-support line built as the test command builds it
# (CRR_BENCH_LTS=0 skips that run); then builds (or finds
# cached) Kubernetes and OpenKruise as the test command does and runs
# benches/beside_kruise.rs, crr-proxy's agent beside kruise-daemon on a
# private real cluster (CRR_BENCH_SIDE=0 skips it). As root.
#
#   scripts/bench.sh            CRR_BENCH_CALLS=20000 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
source scripts/lib/containerd_go.sh
source scripts/lib/kube.sh
source scripts/lib/kruise.sh
ensure_root
ensure_packages
command -v socat >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends socat >/dev/null
}
venv=target/bench-venv
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import grpc' 2>/dev/null; then
  command -v python3 >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
  }
  python3 -m venv "$venv" || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$venv"
  }
  "$venv/bin/pip" install -q grpcio
fi
CRR_BENCH_PYTHON=$PWD/$venv/bin/python cargo bench --locked --bench latency
if [[ ${CRR_BENCH_LTS:-1} != 0 ]]; then
  ensure_containerd_go
  go_caches_drop
  echo "== containerd $("$CRR_TEST_CONTAINERD_LTS/containerd" --version | awk '{ print $3 }')"
  CRR_TEST_CONTAINERD="$CRR_TEST_CONTAINERD_LTS" CRR_BENCH_PYTHON=$PWD/$venv/bin/python \
    cargo bench --locked --bench latency
fi
if [[ ${CRR_BENCH_SIDE:-100} != 0 ]]; then
  ensure_kubernetes
  ensure_kruise
  go_caches_drop
  cargo bench --locked --bench beside_kruise
fi
