# containerd lines built from their Go module (github.com/containerd/containerd/v2)
# and kept in the test cache by version, like sid's packages: 2.3, the first
# long-term-support line, and 2.4, the newest. Sourced by scripts/test.sh;
# `ensure_containerd_go` exports CRR_TEST_CONTAINERD_LTS and
# CRR_TEST_CONTAINERD_NEWEST: folders with containerd,
# containerd-shim-runc-v2 and ctr. runc stays Debian's.
#
# containerd's go.mod replaces nothing, so `go install module/cmd@version`
# builds each command as containerd's own Makefile does, without C: the
# shim static (no cgo, no gRPC), and containerd without the btrfs
# snapshotter and seccomp, which need C headers (neither is used here).

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"
source "$(dirname "${BASH_SOURCE[0]}")/go.sh"

: "${CRR_TEST_CONTAINERD_LTS_VERSION:=v2.3.7}"
: "${CRR_TEST_CONTAINERD_NEWEST_VERSION:=v2.4.2}"

# True when $1 holds containerd, its shim and ctr, containerd saying it is $2.
_containerd_go_ok() {
  local dir="$1" version="$2"
  [[ -x $dir/containerd && -x $dir/containerd-shim-runc-v2 && -x $dir/ctr ]] || return 1
  # "containerd github.com/containerd/containerd/v2 v2.3.7 "
  [[ "$("$dir/containerd" --version 2>/dev/null | awk '{ print $3 }')" == "$version" ]]
}

# Builds containerd $1 into a new folder beside the cache's and renames it
# into place; prints the folder. In a subshell, so its part goes on every
# exit.
_containerd_go_build() (
  set -euo pipefail
  version="$1"
  module=github.com/containerd/containerd/v2
  dest="$CRR_TEST_CACHE/containerd-$version"
  mkdir -p "$CRR_TEST_CACHE"
  part="$(mktemp -d "$CRR_TEST_CACHE/.containerd-$version.XXXXXX")"
  trap 'rm -rf "$part"' EXIT
  go_env "containerd $version"
  export GOBIN="$part"
  started=$SECONDS
  echo "building containerd $version (containerd, containerd-shim-runc-v2, ctr) into $dest" >&2
  ldflags="-s -w -X $module/version.Version=$version -X $module/version.Package=$module"
  CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" -tags "urfave_cli_no_docs no_btrfs" \
    "$module/cmd/containerd@$version" "$module/cmd/ctr@$version" >&2
  CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" -tags "urfave_cli_no_docs no_grpc" \
    "$module/cmd/containerd-shim-runc-v2@$version" >&2
  chmod 755 "$part"
  if ! _containerd_go_ok "$part" "$version"; then
    echo "containerd: the $version build does not run here" >&2
    exit 1
  fi
  rm -rf "$dest"
  mv -T "$part" "$dest"
  echo "containerd: $version built in $((SECONDS - started)) s" >&2
  echo "$dest"
)

# Prints the folder of containerd $1: the cached build, without touching
# the network, or a new one.
_containerd_go() {
  local dir="$CRR_TEST_CACHE/containerd-$1"
  if ! _containerd_go_ok "$dir" "$1"; then
    dir="$(_containerd_go_build "$1")" || return 1
  fi
  echo "$dir"
}

# Exports CRR_TEST_CONTAINERD_LTS and CRR_TEST_CONTAINERD_NEWEST.
ensure_containerd_go() {
  local lts newest
  lts="$(_containerd_go "$CRR_TEST_CONTAINERD_LTS_VERSION")" || return 1
  newest="$(_containerd_go "$CRR_TEST_CONTAINERD_NEWEST_VERSION")" || return 1
  export CRR_TEST_CONTAINERD_LTS="$lts" CRR_TEST_CONTAINERD_NEWEST="$newest"
}
