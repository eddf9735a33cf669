#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine: installs containerd, runc
# and busybox-static when missing, then checks formatting and lints and runs
# every test (unit, and integration against a private real containerd).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
ensure_root
ensure_packages

cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked
