# promtool, Prometheus's own checker of rule files (tests/monitoring.rs:
# `promtool check rules`, `promtool test rules`). Debian packages it on
# its own, beside prometheus; sid's is unpacked into the test cache
# (sid.sh), and nothing of it is installed or started. Sourced by scripts/test.sh;
# `ensure_promtool` exports CRR_TEST_PROMTOOL.

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"

# True when $1/usr/bin/promtool runs.
_promtool_ok() {
  [[ -x $1/usr/bin/promtool ]] && "$1/usr/bin/promtool" --version >/dev/null 2>&1
}

ensure_promtool() {
  local dir
  dir="$(sid_cached promtool 'promtool-[0-9]*' _promtool_ok)" || return 1
  export CRR_TEST_PROMTOOL="$dir/usr/bin/promtool"
}
