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
# Doc tests: none yet. Examples and benches are compiled by clippy above.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked --lib --bins --tests 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
