# Installs what crr-proxy's tests and try-out need on Debian, when missing.
# Sourced by scripts/test.sh and scripts/try.sh.

ensure_root() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "$0: must run as root: containerd and runc need it" >&2
    exit 1
  fi
}

# containerd + runc run the containers; busybox-static fills the test images
# (no registry needed); python3 plays systemd in the socket-activation tests;
# systemd provides systemd-analyze, which checks the units; openssl plays
# the cluster's signer in the node-identity test and the real cluster's CA;
# containernetworking-plugins gives the real kubelet's Pods their network
# (bridge, host-local, loopback in /usr/lib/cni); docker-registry and skopeo
# serve the suite's images from a registry on loopback, for kubelet's pulls.
ensure_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing+=(busybox-static)
  command -v python3 >/dev/null || missing+=(python3)
  command -v systemd-analyze >/dev/null || missing+=(systemd)
  command -v openssl >/dev/null || missing+=(openssl)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  command -v docker-registry >/dev/null || missing+=(docker-registry)
  command -v skopeo >/dev/null || missing+=(skopeo)
  if ((${#missing[@]})); then
    echo "installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}
