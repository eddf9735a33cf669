# OpenKruise for the tests: kruise-manager (with its webhook) and
# kruise-daemon, built from the github.com/openkruise/kruise module at one
# release, with its CRDs, kept in the test cache by version (as kube.sh
# keeps Kubernetes). Sourced by scripts/test.sh; `ensure_kruise` exports
# CRR_TEST_KRUISE: a folder with kruise-manager, kruise-daemon, crd/ (the
# module's config/crd/bases) and webhook.yaml (its config/webhook).
#
# As for Kubernetes, `go install` is refused (kruise's go.mod replaces
# modules), so the build is a throwaway module of ours that requires kruise
# at the release and repeats its replace lines, which name published
# versions.

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"
source "$(dirname "${BASH_SOURCE[0]}")/go.sh"

: "${CRR_TEST_KRUISE_VERSION:=v1.9.0}"

# True when $1 holds both binaries, the CRDs and the webhook configurations.
_kruise_ok() {
  [[ -x $1/kruise-manager && -x $1/kruise-daemon && -f $1/webhook.yaml &&
    -f $1/crd/apps.kruise.io_containerrecreaterequests.yaml ]]
}

_kruise_build() (
  set -euo pipefail
  version="$1"
  dest="$CRR_TEST_CACHE/openkruise-$version"
  mkdir -p "$CRR_TEST_CACHE"
  tmp="$(mktemp -d)"
  part="$(mktemp -d "$CRR_TEST_CACHE/.openkruise-$version.XXXXXX")"
  trap 'rm -rf "$tmp" "$part"' EXIT
  go_env "OpenKruise $version"
  started=$SECONDS
  echo "building OpenKruise $version (kruise-manager, kruise-daemon) into $dest" >&2
  cd "$tmp"
  go mod init crr-proxy-test/openkruise >/dev/null 2>&1
  info="$(go mod download -json "github.com/openkruise/kruise@$version")"
  gomod="$(awk -F'"' '/"GoMod"/ { print $4 }' <<<"$info")"
  src="$(awk -F'"' '/"Dir"/ { print $4 }' <<<"$info")"
  [[ -f $gomod && -d $src ]] || { echo "kruise: no module github.com/openkruise/kruise@$version" >&2; exit 1; }
  # kruise's replace block, line by line ("a => b v"), as our own.
  awk '
    /^replace \(/ { inside = 1; next }
    inside && /^\)/ { inside = 0; next }
    inside && $2 == "=>" { printf "replace %s => %s %s\n", $1, $3, $4 }
    /^replace [^(]/ && $3 == "=>" { printf "replace %s => %s %s\n", $2, $4, $5 }
  ' "$gomod" >>go.mod
  go get "github.com/openkruise/kruise@$version" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$part/kruise-manager" github.com/openkruise/kruise >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$part/kruise-daemon" github.com/openkruise/kruise/cmd/daemon >&2
  mkdir -p "$part/crd"
  cp "$src"/config/crd/bases/*.yaml "$part/crd/"
  cp "$src"/config/webhook/manifests.yaml "$part/webhook.yaml"
  chmod -R u+w,go+rX "$part"
  _kruise_ok "$part" || { echo "kruise: the $version build is incomplete" >&2; exit 1; }
  rm -rf "$dest"
  mv -T "$part" "$dest"
  echo "kruise: OpenKruise $version built in $((SECONDS - started)) s" >&2
  echo "$dest"
)

ensure_kruise() {
  local dir="$CRR_TEST_CACHE/openkruise-$CRR_TEST_KRUISE_VERSION"
  if ! _kruise_ok "$dir"; then
    dir="$(_kruise_build "$CRR_TEST_KRUISE_VERSION")" || return 1
  fi
  export CRR_TEST_KRUISE="$dir"
}
