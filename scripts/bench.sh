#!/usr/bin/env bash
# The benchmark in one command: installs containerd, runc, busybox-static
# and socat when missing, then runs benches/latency.rs (release build),
# which starts its own private containerd. As root.
#
#   scripts/bench.sh            CRR_BENCH_CALLS=20000 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
ensure_root
ensure_packages
command -v socat >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends socat >/dev/null
}
exec cargo bench --locked --bench latency
