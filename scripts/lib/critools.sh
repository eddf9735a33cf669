# The CRI's own validation suite (critest) and its command-line client
# (crictl), built from their Go module (sigs.k8s.io/cri-tools) and kept in
# the test cache by version, like the containerd builds, with the ginkgo
# command that runs critest's specs in parallel (`critest --parallel`), at
# the version cri-tools requires. Sourced by scripts/test.sh;
# `ensure_critools` exports CRR_TEST_CRITEST, CRR_TEST_CRICTL and
# CRR_TEST_GINKGO.
#
# crictl is a command (`go install module/cmd@version`). critest is a Go
# test binary (`go test -c`, as cri-tools' Makefile builds it), and go
# builds a test only inside a main module: a small one of our own in a
# temporary folder requires cri-tools at the release.

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"
source "$(dirname "${BASH_SOURCE[0]}")/go.sh"

: "${CRR_TEST_CRITOOLS_VERSION:=v1.37.0}"

# True when $1 holds critest, crictl and ginkgo, crictl saying it is $2.
_critools_ok() {
  local dir="$1" version="$2"
  [[ -x $dir/critest && -x $dir/crictl && -x $dir/ginkgo ]] || return 1
  # "crictl version v1.37.0"
  [[ "$("$dir/crictl" --version 2>/dev/null | awk '{ print $3 }')" == "$version" ]]
}

# Builds cri-tools $1 into a new folder beside the cache's and renames it
# into place; prints the folder. In a subshell, so its part goes on every
# exit.
_critools_build() (
  set -euo pipefail
  version="$1"
  module=sigs.k8s.io/cri-tools
  dest="$CRR_TEST_CACHE/cri-tools-$version"
  mkdir -p "$CRR_TEST_CACHE"
  part="$(mktemp -d "$CRR_TEST_CACHE/.cri-tools-$version.XXXXXX")"
  main="$(mktemp -d)"
  trap 'rm -rf "$part" "$main"' EXIT
  go_env "cri-tools $version"
  export CGO_ENABLED=0
  started=$SECONDS
  echo "building cri-tools $version (critest, crictl, ginkgo) into $dest" >&2
  ldflags="-s -w -X $module/pkg/version.Version=$version"
  GOBIN="$part" go install -trimpath -ldflags "$ldflags" "$module/cmd/crictl@$version" >&2
  (
    cd "$main"
    go mod init crr-proxy-test/critest >/dev/null 2>&1
    go get "$module/cmd/critest@$version" >&2
    go test -c -trimpath -ldflags "$ldflags" -o "$part/critest" "$module/cmd/critest" >&2
    ginkgo="$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)"
    GOBIN="$part" go install -trimpath "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo" >&2
  )
  chmod 755 "$part"
  if ! _critools_ok "$part" "$version"; then
    echo "cri-tools: the $version build does not run here" >&2
    exit 1
  fi
  rm -rf "$dest"
  mv -T "$part" "$dest"
  echo "cri-tools: $version built in $((SECONDS - started)) s" >&2
  echo "$dest"
)

# Exports CRR_TEST_CRITEST, CRR_TEST_CRICTL and CRR_TEST_GINKGO: the cached
# build, without touching the network, or a new one.
ensure_critools() {
  local dir="$CRR_TEST_CACHE/cri-tools-$CRR_TEST_CRITOOLS_VERSION"
  if ! _critools_ok "$dir" "$CRR_TEST_CRITOOLS_VERSION"; then
    dir="$(_critools_build "$CRR_TEST_CRITOOLS_VERSION")" || return 1
  fi
  export CRR_TEST_CRITEST="$dir/critest" CRR_TEST_CRICTL="$dir/crictl" CRR_TEST_GINKGO="$dir/ginkgo"
}
