#!/usr/bin/env bash
# Builds a release's artifacts from a clean checkout, into dist/:
#   crr-proxy_VERSION_ARCH.deb          the binary, the systemd units and the
#                                       default settings; installing it starts
#                                       the socket but does not switch kubelet
#   crr-proxy-VERSION-linux-ARCH.tar.gz the binary, the units, deploy/ and
#                                       scripts/install.sh, which installs from
#                                       it with no checkout and no toolchain
#   SHA256SUMS                          both, for `sha256sum -c`
#   crr.yaml                            krew's plugin manifest for `kubectl crr`,
#                                       naming the tarball and its sum
#
#   scripts/release.sh [--out DIR] [--url BASE] [--binary PATH] [--allow-dirty]
#
#   --out DIR       where the artifacts go (default: dist)
#   --url BASE      where the release's files will be downloaded from, for
#                   crr.yaml (default: file:// of --out, for a local
#                   `kubectl krew install --manifest dist/crr.yaml`)
#   --binary PATH   package this binary instead of building one with
#                   `cargo build --release --locked` (the test suite's way)
#   --allow-dirty   build from a checkout with uncommitted changes
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
url=""
binary=""
allow_dirty=false
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --url) url="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --allow-dirty) allow_dirty=true; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# A release names the commit it was built from (crr-proxy --version): a
# change that is not committed would be in no commit.
if ! $allow_dirty && [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
  echo "release.sh: the checkout has uncommitted changes (commit them, or --allow-dirty)" >&2
  exit 1
fi
for tool in dpkg-deb objcopy objdump sha256sum tar; do
  command -v "$tool" >/dev/null || { echo "release.sh: $tool is needed" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
if [[ -z "$binary" ]]; then
  cargo build --release --locked
  binary=target/release/crr-proxy
fi
[[ -x "$binary" ]] || { echo "release.sh: $binary is not an executable" >&2; exit 1; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Debug information is for developers; the symbols stay, for backtraces.
objcopy --strip-debug "$binary" "$work/crr-proxy"
binary="$work/crr-proxy"

# The .deb, laid out as Debian lays out a service: /usr/bin, the units in
# /usr/lib/systemd/system (the operator's overrides stay in /etc), the
# settings a conffile that upgrades never overwrite.
pkg="$work/deb"
install -D -m 0755 "$binary" "$pkg/usr/bin/crr-proxy"
install -d "$pkg/usr/lib/systemd/system"
install -m 0644 systemd/crr-proxy.socket "$pkg/usr/lib/systemd/system/"
sed 's|^ExecStart=/usr/local/bin/crr-proxy|ExecStart=/usr/bin/crr-proxy|' systemd/crr-proxy.service \
  >"$pkg/usr/lib/systemd/system/crr-proxy.service"
install -D -m 0640 systemd/crr-proxy.env "$pkg/etc/crr-proxy/crr-proxy.env"
share="$pkg/usr/share/crr-proxy"
install -D -m 0755 scripts/install.sh "$share/scripts/install.sh"
install -D -m 0644 scripts/lib/kubelet-endpoint.sh "$share/scripts/lib/kubelet-endpoint.sh"
install -D -m 0644 systemd/kubelet-identity.conf "$share/systemd/kubelet-identity.conf"
cp -r deploy "$share/deploy"
install -D -m 0644 LICENSE "$pkg/usr/share/doc/crr-proxy/copyright"
install -m 0644 CHANGELOG.md README.md "$pkg/usr/share/doc/crr-proxy/"
# glibc is the one library the binary links; it needs the newest symbol
# version it references.
glibc=$(objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)
install -d "$pkg/DEBIAN"
cat >"$pkg/DEBIAN/control" <<EOF
Package: crr-proxy
Version: $version
Architecture: $arch
Maintainer: crr-proxy developers
Depends: libc6 (>= $glibc)
Section: admin
Priority: optional
Description: CRI proxy and ContainerRecreateRequest agent for Kubernetes nodes
 Relays kubelet's CRI calls to containerd unchanged and recreates the
 containers a ContainerRecreateRequest names. Installing the package starts
 crr-proxy's socket; kubelet is switched to it only by
 /usr/share/crr-proxy/scripts/install.sh --kubelet-only.
EOF
echo /etc/crr-proxy/crr-proxy.env >"$pkg/DEBIAN/conffiles"
# Maintainer scripts touch the running systemd only when there is one and
# the package is not being installed into another root (DPKG_ROOT).
cat >"$pkg/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable --now crr-proxy.socket
  # An upgrade: the running service takes the new binary.
  systemctl try-restart crr-proxy.service
fi
EOF
# Removing crr-proxy while kubelet dials its socket would make the node
# NotReady: refuse, and say what to run first.
cat >"$pkg/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -e "${DPKG_ROOT:-}/etc/crr-proxy/kubelet-switch" ]; then
  echo "crr-proxy: kubelet still uses crr-proxy's socket; first point it back at its runtime:" >&2
  echo "  /usr/share/crr-proxy/scripts/install.sh --bypass" >&2
  exit 1
fi
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl disable --now crr-proxy.service crr-proxy.socket || true
fi
EOF
cat >"$pkg/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
  rm -rf "${DPKG_ROOT:-}/etc/crr-proxy"
  # install.sh --identity kubelet's drop-in goes with the settings.
  rm -f "${DPKG_ROOT:-}/etc/systemd/system/crr-proxy.service.d/kubelet-identity.conf"
  rmdir "${DPKG_ROOT:-}/etc/systemd/system/crr-proxy.service.d" 2>/dev/null || true
fi
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
EOF
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postrm"
deb="crr-proxy_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$out/$deb" >/dev/null

# The tarball: the checkout's layout, with the binary where install.sh
# looks for it when there is no target/.
name="crr-proxy-$version-linux-$arch"
tree="$work/$name"
install -D -m 0755 "$binary" "$tree/bin/crr-proxy"
install -D -m 0755 scripts/install.sh "$tree/scripts/install.sh"
install -D -m 0644 scripts/lib/kubelet-endpoint.sh "$tree/scripts/lib/kubelet-endpoint.sh"
cp -r systemd deploy "$tree/"
cp LICENSE README.md CHANGELOG.md "$tree/"
tarball="$name.tar.gz"
tar -C "$work" --owner=0 --group=0 --numeric-owner -czf "$out/$tarball" "$name"

(cd "$out" && sha256sum "$deb" "$tarball" >SHA256SUMS)

# krew installs `kubectl crr` from the tarball: the binary, renamed as
# kubectl looks for plugins.
url="${url:-file://$out}"
sum=$(sha256sum "$out/$tarball" | cut -d' ' -f1)
cat >"$out/crr.yaml" <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: crr
spec:
  version: v$version
  shortDescription: Restart containers of Pods in place, with ContainerRecreateRequests
  description: |
    kubectl crr restart POD -c CONTAINER creates an OpenKruise
    ContainerRecreateRequest for the Pod and follows it to its end; with
    KIND/NAME it restarts a workload's Pods in waves, within its
    PodDisruptionBudgets. The nodes need OpenKruise's kruise-daemon or
    crr-proxy's agent to carry the requests out.
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: $arch
      uri: ${url%/}/$tarball
      sha256: $sum
      files:
        - from: $name/bin/crr-proxy
          to: kubectl-crr
        - from: $name/LICENSE
          to: .
      bin: kubectl-crr
EOF
echo "release $version ($arch) in $out:"
(cd "$out" && cat SHA256SUMS && echo "crr.yaml (krew) names ${url%/}/$tarball")
