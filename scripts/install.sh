#!/usr/bin/env bash
# Installs crr-proxy on a node: the binary, the systemd units, the settings
# file, and kubelet's runtime and image endpoints pointed at the proxy
# socket. Safe to run again (kubelet is restarted only when its
# configuration changed); `--uninstall` undoes it: kubelet's endpoints as
# they were before, in its configuration as it is now.
#
#   scripts/install.sh [--binary PATH] [--kubelet-config PATH] [--kubeconfig FILE] [--uninstall]
#
#   --binary PATH          crr-proxy to install (default: target/release/crr-proxy)
#   --kubelet-config PATH  KubeletConfiguration file (default: /var/lib/kubelet/config.yaml)
#   --kubeconfig FILE      the node's identity (scripts/node-identity.sh), installed
#                          as /etc/crr-proxy/kubeconfig (0600) and named in crr-proxy.env
#   DESTDIR=/some/root     install under another root (packaging, tests); then
#                          nothing is started or restarted
set -euo pipefail
cd "$(dirname "$0")/.."

binary=target/release/crr-proxy
kubelet_config=/var/lib/kubelet/config.yaml
kubeconfig=""
uninstall=false
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --kubelet-config) kubelet_config="$2"; shift 2 ;;
    --kubeconfig) kubeconfig="$2"; shift 2 ;;
    --uninstall) uninstall=true; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

root="${DESTDIR:-}"
socket=unix:///run/crr-proxy/crr-proxy.sock
bin_path="$root/usr/local/bin/crr-proxy"
unit_dir="$root/etc/systemd/system"
conf_dir="$root/etc/crr-proxy"
backup="$conf_dir/kubelet-config.orig"
# Which kubelet configuration the install edited (so that a plain
# --uninstall restores that one, whatever --kubelet-config it is given).
edited="$conf_dir/kubelet-config.path"
endpoint_keys=(containerRuntimeEndpoint imageServiceEndpoint)

live_systemd() { [[ -z "$root" && -d /run/systemd/system ]] && command -v systemctl >/dev/null; }
checksum() { if [[ -f $1 ]]; then cksum <"$1"; fi; }

# Puts back, in the kubelet configuration as it is now, each endpoint line
# the install wrote: the backup's line, or none where the backup had none.
# A line someone changed since is left as they made it.
restore_endpoints() {
  local file="$1" key orig cur
  for key in "${endpoint_keys[@]}"; do
    orig="$(grep -m1 "^$key:" "$backup" || true)"
    cur="$(grep -m1 "^$key:" "$file" || true)"
    if [[ $cur != "$key: $socket" ]]; then
      [[ $cur == "$orig" ]] || echo "left $key as it is now (${cur:-not set}): it was changed after the install" >&2
      continue
    fi
    # Written through cat, so that the file keeps its owner and mode.
    awk -v key="$key:" -v line="$orig" '
      !done && index($0, key) == 1 { done = 1; if (line != "") print line; next }
      { print }' "$file" >"$file.crr-proxy.tmp"
    cat "$file.crr-proxy.tmp" >"$file"
    rm -f "$file.crr-proxy.tmp"
  done
  # The newline the install added after a last line without one.
  if [[ -n "$(tail -c1 "$backup")" ]] && [[ "$(tail -c1 "$file")" == "" ]] &&
    cmp -s <(head -c -1 "$file") "$backup"; then
    truncate -s -1 "$file"
  fi
}

if $uninstall; then
  if live_systemd; then
    systemctl disable --now crr-proxy.service crr-proxy.socket || true
  fi
  kubelet_changed=false
  if [[ -f "$backup" ]]; then
    # Installs before the path was recorded edited --kubelet-config's file.
    [[ -f $edited ]] && kubelet_config="$(cat "$edited")"
    kubelet_file="$root$kubelet_config"
    if [[ -f "$kubelet_file" ]]; then
      before="$(checksum "$kubelet_file")"
      restore_endpoints "$kubelet_file"
      [[ "$(checksum "$kubelet_file")" == "$before" ]] || kubelet_changed=true
      echo "restored kubelet's endpoints in $kubelet_config"
    else
      echo "no $kubelet_config: nothing to restore (its original is kept in $backup)" >&2
      backup=""
    fi
  fi
  rm -f "$bin_path" "$unit_dir/crr-proxy.socket" "$unit_dir/crr-proxy.service" \
    ${backup:+"$backup"} "$edited" "$conf_dir/crr-proxy.env" "$conf_dir/kubeconfig"
  rmdir "$conf_dir" 2>/dev/null || true
  if live_systemd; then
    systemctl daemon-reload
    if $kubelet_changed; then systemctl restart kubelet.service || true; fi
  fi
  echo "crr-proxy uninstalled"
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

kubelet_file="$root$kubelet_config"
kubelet_changed=false
if [[ -f $edited && "$(cat "$edited")" != "$kubelet_config" ]]; then
  echo "install.sh: crr-proxy already switched $(cat "$edited"); run --uninstall first" >&2
  exit 1
fi
if [[ -f "$kubelet_file" ]]; then
  before="$(checksum "$kubelet_file")"
  # Keep the first original only: a second run must not back up our edit.
  [[ -e "$backup" ]] || cp -p "$kubelet_file" "$backup"
  printf '%s\n' "$kubelet_config" >"$edited"
  # A last line without its newline would run into the lines appended.
  if [[ -n "$(tail -c1 "$kubelet_file")" ]]; then echo >>"$kubelet_file"; fi
  for key in "${endpoint_keys[@]}"; do
    if grep -q "^$key:" "$kubelet_file"; then
      sed -i "s|^$key:.*|$key: $socket|" "$kubelet_file"
    else
      echo "$key: $socket" >>"$kubelet_file"
    fi
  done
  if [[ "$(checksum "$kubelet_file")" == "$before" ]]; then
    echo "kubelet ($kubelet_config) already points at $socket; kubelet is not restarted"
  else
    kubelet_changed=true
    echo "pointed kubelet ($kubelet_config) at $socket"
  fi
else
  echo "no $kubelet_config: set kubelet's containerRuntimeEndpoint and imageServiceEndpoint to $socket" >&2
fi

if live_systemd; then
  systemctl daemon-reload
  systemctl enable --now crr-proxy.socket crr-proxy.service
  if $kubelet_changed; then systemctl restart kubelet.service; fi
fi
echo "crr-proxy installed"
