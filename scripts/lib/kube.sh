# A real Kubernetes for the tests: etcd, kube-apiserver,
# kube-controller-manager, kubelet and kubectl, built from their Go modules
# at one release and kept in the test cache by version, like sid's packages
# (sid.sh). Sourced by scripts/test.sh; `ensure_kubernetes` exports
# CRR_TEST_KUBE: the folder holding the five binaries, and
# `ensure_older_kubelet` CRR_TEST_KUBELET_OLDER: a kubelet of an older minor
# (v1.35.4), whose feature gates' defaults differ (RestartAllContainers is
# off before 1.36).
#
# `go install k8s.io/kubernetes/cmd/...@vX` is refused: kubernetes' go.mod
# replaces its staging modules (k8s.io/api, client-go, ...) by folders of its
# own repository. So the build is a throwaway module of our own, made in a
# temp dir, that requires k8s.io/kubernetes at the release and replaces each
# staging module by its published twin (v0.37.2 for v1.37.2), read from
# kubernetes' own go.mod. etcd is the server release kubernetes' go.mod
# names, built in the same module. Nothing here is committed: the binaries
# go to $CRR_TEST_CACHE/kubernetes-VERSION, the modules and build cache to
# Go's own caches.

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"
source "$(dirname "${BASH_SOURCE[0]}")/go.sh"

: "${CRR_TEST_KUBE_VERSION:=v1.37.2}"
: "${CRR_TEST_KUBELET_OLDER_VERSION:=v1.35.4}"

CRR_KUBE_BINARIES=(etcd kube-apiserver kube-controller-manager kubelet kubectl)

# True when $1 holds every binary, kube-apiserver saying it is version $2.
_kube_ok() {
  local dir="$1" version="$2" bin
  for bin in "${CRR_KUBE_BINARIES[@]}"; do
    [[ -x $dir/$bin ]] || return 1
  done
  [[ "$("$dir/kube-apiserver" --version 2>/dev/null)" == "Kubernetes $version" ]] || return 1
  "$dir/etcd" --version >/dev/null 2>&1
}

# True when $1 holds a kubelet that says it is version $2.
_kubelet_ok() {
  [[ "$("$1/kubelet" --version 2>/dev/null)" == "Kubernetes $2" ]]
}

# Builds kubernetes $1 into a new folder beside the cache's and renames it
# into place; prints the folder. With $2 `kubelet`, kubelet alone (into
# kubelet-$1), else the five binaries (into kubernetes-$1). In a subshell,
# so its temp dir goes on every exit.
_kube_build() (
  set -euo pipefail
  version="$1"
  what="${2:-kubernetes}"
  staging="v0.${version#v1.}"
  dest="$CRR_TEST_CACHE/$what-$version"
  mkdir -p "$CRR_TEST_CACHE"
  tmp="$(mktemp -d)"
  part="$(mktemp -d "$CRR_TEST_CACHE/.$what-$version.XXXXXX")"
  # (part is gone once renamed into place.)
  trap 'rm -rf "$tmp" "$part"' EXIT
  go_env "kubernetes $version"
  started=$SECONDS
  commands=(kube-apiserver kube-controller-manager kubelet kubectl)
  [[ $what == kubelet ]] && commands=(kubelet)
  echo "building kubernetes $version (${commands[*]}) into $dest" >&2
  cd "$tmp"
  go mod init crr-proxy-test/kubernetes >/dev/null 2>&1
  gomod="$(go mod download -json "k8s.io/kubernetes@$version" | awk -F'"' '/"GoMod"/ { print $4 }')"
  [[ -f $gomod ]] || { echo "kube: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
  # Each `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x STAGING`.
  awk -v staging="$staging" '
    $2 == "=>" && $3 ~ /^\.\/staging\// { printf "replace %s => %s %s\n", $1, $1, staging }
  ' "$gomod" >>go.mod
  etcd="$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$gomod")"
  [[ -n $etcd ]] || { echo "kube: kubernetes $version names no etcd server" >&2; exit 1; }
  modules=("k8s.io/kubernetes@$version")
  [[ $what == kubelet ]] || modules+=("go.etcd.io/etcd/server/v3@$etcd")
  go get "${modules[@]}" >&2
  # The version the binaries report, as kubernetes' own build stamps it
  # (without it they say v0.0.0-master, and kubelet's and kubectl's skew
  # checks read that).
  minor="${version#v1.}"
  minor="${minor%%.*}"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  # One binary at a time: the machine has two cores and the packages the
  # commands share are built once into Go's build cache.
  for cmd in "${commands[@]}"; do
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$part/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
  done
  [[ $what == kubelet ]] ||
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$part/etcd" "go.etcd.io/etcd/server/v3" >&2
  chmod 755 "$part"
  if [[ $what == kubelet ]]; then ok=_kubelet_ok; else ok=_kube_ok; fi
  if ! "$ok" "$part" "$version"; then
    rm -rf "$part"
    echo "kube: the kubernetes $version build does not run here" >&2
    exit 1
  fi
  rm -rf "$dest"
  mv -T "$part" "$dest"
  echo "kube: kubernetes $version (${commands[*]}) built in $((SECONDS - started)) s" >&2
  echo "$dest"
)

# Exports CRR_TEST_KUBE. Uses the cached build of CRR_TEST_KUBE_VERSION
# without touching the network; builds it only when there is none.
ensure_kubernetes() {
  local dir="$CRR_TEST_CACHE/kubernetes-$CRR_TEST_KUBE_VERSION"
  if ! _kube_ok "$dir" "$CRR_TEST_KUBE_VERSION"; then
    dir="$(_kube_build "$CRR_TEST_KUBE_VERSION")" || return 1
  fi
  export CRR_TEST_KUBE="$dir"
}

# Exports CRR_TEST_KUBELET_OLDER (a kubelet binary), built as above.
ensure_older_kubelet() {
  local version="$CRR_TEST_KUBELET_OLDER_VERSION"
  local dir="$CRR_TEST_CACHE/kubelet-$version"
  if ! _kubelet_ok "$dir" "$version"; then
    dir="$(_kube_build "$version" kubelet)" || return 1
  fi
  export CRR_TEST_KUBELET_OLDER="$dir/kubelet"
}
