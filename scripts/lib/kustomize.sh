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
  local dir="" candidate
  while read -r candidate; do
    if _kustomize_ok "$candidate"; then
      dir="$candidate"
    fi
  done < <(find "$CRR_TEST_CACHE" -mindepth 1 -maxdepth 1 -type d -name 'kustomize-5.*' 2>/dev/null | sort -V)
  if [[ -z $dir ]]; then
    dir="$(sid_unpack kustomize _kustomize_ok)"
  fi
  _kustomize_ok "$dir" || { echo "kustomize: no working kustomize in $dir" >&2; return 1; }
  export CRR_TEST_KUSTOMIZE="$dir/usr/bin/kustomize"
}
