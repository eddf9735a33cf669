#!/usr/bin/env bash
# Try crr-proxy out: starts a private containerd (its own temp dir and socket,
# local images, a demo pod) and serves crr-proxy in front of it until Ctrl-C.
# Installs containerd, runc and busybox-static when missing.
#
#   CRR_PROXY_LISTEN   proxy socket (default /tmp/crr-proxy-try/crr-proxy.sock)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
ensure_root
ensure_packages
exec cargo run --release --locked --example try_out
