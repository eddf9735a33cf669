#!/usr/bin/env bash
# Installs crr-proxy on a node: the binary, the systemd units, the settings
# file, and kubelet's runtime and image endpoints pointed at the proxy
# socket. Safe to run again (kubelet is restarted only when its
# configuration changed); `--uninstall` undoes it: kubelet's endpoints as
# they were before, in its configuration as it is now.
#
#   scripts/install.sh [--binary PATH] [--kubelet-config PATH] [--kubeconfig FILE]
#                      [--kubelet-only] [--uninstall]
#
#   --binary PATH          crr-proxy to install (default: target/release/crr-proxy
#                          in a checkout, bin/crr-proxy in a release tarball)
#   --kubelet-only         only switch kubelet (or, with --uninstall, only put it
#                          back): crr-proxy itself came from the .deb
#   --kubelet-config PATH  KubeletConfiguration file (default: /var/lib/kubelet/config.yaml)
#   --kubeconfig FILE      the node's identity (scripts/node-identity.sh), installed
#                          as /etc/crr-proxy/kubeconfig (0600) and named in crr-proxy.env
#   DESTDIR=/some/root     install under another root (packaging, tests); then
#                          nothing is started or restarted
set -euo pipefail
cd "$(dirname "$0")/.."

binary=target/release/crr-proxy
# A release tarball carries the binary in bin/ and has no target/.
[[ -e "$binary" || ! -e bin/crr-proxy ]] || binary=bin/crr-proxy
kubelet_only=false
kubelet_config=/var/lib/kubelet/config.yaml
kubeconfig=""
uninstall=false
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --kubelet-config) kubelet_config="$2"; shift 2 ;;
    --kubeconfig) kubeconfig="$2"; shift 2 ;;
    --uninstall) uninstall=true; shift ;;
    --kubelet-only) kubelet_only=true; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

root="${DESTDIR:-}"
socket=unix:///run/crr-proxy/crr-proxy.sock
bin_path="$root/usr/local/bin/crr-proxy"
unit_dir="$root/etc/systemd/system"
conf_dir="$root/etc/crr-proxy"
source scripts/lib/kubelet-endpoint.sh

live_systemd() { [[ -z "$root" && -d /run/systemd/system ]] && command -v systemctl >/dev/null; }

if $uninstall && $kubelet_only; then
  restore_kubelet
  if live_systemd && $kubelet_touched; then systemctl restart kubelet.service || true; fi
  echo "kubelet no longer uses crr-proxy; crr-proxy itself is still installed"
  exit 0
fi

if $uninstall; then
  if live_systemd; then
    systemctl disable --now crr-proxy.service crr-proxy.socket || true
  fi
  restore_kubelet
  rm -f "$bin_path" "$unit_dir/crr-proxy.socket" "$unit_dir/crr-proxy.service" \
    "$conf_dir/crr-proxy.env" "$conf_dir/kubeconfig"
  rmdir "$conf_dir" 2>/dev/null || true
  if live_systemd; then
    systemctl daemon-reload
    if $kubelet_touched; then systemctl restart kubelet.service || true; fi
  fi
  echo "crr-proxy uninstalled"
  exit 0
fi

if $kubelet_only; then
  # kubelet goes NotReady on a socket nothing listens on.
  if live_systemd && ! systemctl is-active --quiet crr-proxy.socket; then
    echo "install.sh: crr-proxy.socket is not active; start it first: systemctl enable --now crr-proxy.socket" >&2
    exit 1
  fi
  switch_kubelet
  if $kubelet_unswitched; then
    echo "install.sh: kubelet is not switched (see above)" >&2
    exit 1
  elif ! $kubelet_touched; then
    echo "kubelet already points at $socket; kubelet is not restarted"
  elif live_systemd; then
    systemctl restart kubelet.service
  fi
  echo "kubelet switched to $socket"
  exit 0
fi

[[ -x "$binary" ]] || { echo "install.sh: $binary not found; build it with: cargo build --release" >&2; exit 1; }
install -D -m 0755 "$binary" "$bin_path"
install -D -m 0644 systemd/crr-proxy.socket "$unit_dir/crr-proxy.socket"
install -D -m 0644 systemd/crr-proxy.service "$unit_dir/crr-proxy.service"
install -d -m 0750 "$conf_dir"
# The operator's settings survive re-installs and upgrades.
[[ -e "$conf_dir/crr-proxy.env" ]] || install -m 0640 systemd/crr-proxy.env "$conf_dir/crr-proxy.env"
if [[ -n "$kubeconfig" ]]; then
  [[ -f "$kubeconfig" ]] || { echo "install.sh: $kubeconfig not found" >&2; exit 1; }
  install -m 0600 "$kubeconfig" "$conf_dir/kubeconfig"
  # Named in the settings unless the operator already names one.
  grep -q '^CRR_PROXY_KUBECONFIG=' "$conf_dir/crr-proxy.env" ||
    echo "CRR_PROXY_KUBECONFIG=/etc/crr-proxy/kubeconfig" >>"$conf_dir/crr-proxy.env"
fi

switch_kubelet
if ! $kubelet_touched && ! $kubelet_unswitched; then
  echo "kubelet already points at $socket; kubelet is not restarted"
fi

if live_systemd; then
  systemctl daemon-reload
  systemctl enable --now crr-proxy.socket crr-proxy.service
  if $kubelet_touched; then systemctl restart kubelet.service; fi
fi
echo "crr-proxy installed"
