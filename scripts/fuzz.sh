#!/usr/bin/env bash
# Runs every fuzz target for a bounded time with cargo-fuzz (libFuzzer).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60, all targets)
#
# The targets (fuzz/fuzz_targets/) call crr_proxy::fuzzing, where each
# parser of untrusted bytes has an entry point: HPACK, the frame relay, the
# CRI wire editor, the streaming editor, kubelet's container annotations,
# and CRR JSON. Inputs
# found are kept in fuzz/work/ (not committed); the committed seeds are in
# fuzz/corpus/. A crash stops the run with exit 1 and leaves its input in
# fuzz/artifacts/<target>/: copy it to fuzz/regressions/<target>/, where the
# unit tests replay it on every run, and fix the bug.
#
# cargo-fuzz needs nightly Rust's sanitizer flags. With no nightly
# toolchain, the stable one is used with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a number" >&2; exit 2; }

command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
else
  export RUSTC_BOOTSTRAP=1
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cd fuzz && cargo "${toolchain[@]}" fuzz list)
fi
for target in "${targets[@]}"; do
  mkdir -p "fuzz/work/$target"
  echo "== $target: ${seconds}s"
  cargo "${toolchain[@]}" fuzz run --fuzz-dir fuzz "$target" "fuzz/work/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=1024 -print_final_stats=1 2>&1 |
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY|Done)|panicked|artifact' || true
  # cargo fuzz exits non-zero on a crash; pipefail is defeated by grep above,
  # so look for the artifact instead.
  if compgen -G "fuzz/artifacts/$target/crash-*" >/dev/null; then
    echo "fuzz.sh: $target crashed; inputs in fuzz/artifacts/$target/" >&2
    exit 1
  fi
done
echo "fuzz.sh: no crash in ${#targets[@]} target(s), ${seconds}s each"
