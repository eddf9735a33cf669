# kustomize, to render deploy/'s overlays as `kubectl apply -k` does
# (tests/manifests.rs). Bookworm has none; sid's package is unpacked into
# the test cache (sid.sh). Sourced by scripts/test.sh; `ensure_kustomize`
# exports CRR_TEST_KUSTOMIZE.

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"

# True when $1/usr/bin/kustomize runs. (Debian's build calls its version
# "(devel)"; the folder's name carries the package's.)
_kustomize_ok() {
  [[ -x $1/usr/bin/kustomize ]] && "$1/usr/bin/kustomize" version >/dev/null 2>&1
}

# Uses the newest unpacked kustomize in the cache without touching the
# network; downloads only when there is none.
ensure_kustomize() {
  local dir
  dir="$(sid_cached kustomize 'kustomize-5.*' _kustomize_ok)" || return 1
  export CRR_TEST_KUSTOMIZE="$dir/usr/bin/kustomize"
}
