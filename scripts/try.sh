#!/usr/bin/env bash
# Try crr-proxy out on one machine: a private containerd (its own temp dir
# and socket, local images), the crr-proxy binary in front of it with
# --agent standalone, and an emulated cluster around them (the test
# support's API server, kubelet and disruption controller). It restarts a
# container of a demo Pod with `crr-proxy restart`, then a Deployment in
# waves, prints what happened, and keeps everything up until Ctrl-C.
# Installs containerd, runc and busybox-static when missing.
#
#   CRR_PROXY_TRY_DIR   where it keeps its files (default /tmp/crr-proxy-try)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
ensure_root
ensure_packages
cargo build --release --locked --bin crr-proxy --example try_out
exec target/release/examples/try_out
