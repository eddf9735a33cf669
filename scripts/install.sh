#!/usr/bin/env bash
# Installs crr-proxy on a node: the binary, the systemd units, the settings
# file, and kubelet's runtime and image endpoints pointed at the proxy
# socket. Safe to run again (kubelet is restarted only when its
# configuration changed); `--uninstall` undoes it: kubelet's endpoints as
# they were before, in its configuration as it is now.
#
#   scripts/install.sh [--binary PATH] [--kubelet-config PATH]
#                      [--kubeconfig FILE | --identity kubelet]
#                      [--kubelet-only] [--uninstall] [--bypass]
#                      [--kubelet-unit NAME]
#
#   --binary PATH          crr-proxy to install (default: target/release/crr-proxy
#                          in a checkout, bin/crr-proxy in a release tarball)
#   --kubelet-only         only switch kubelet (or, with --uninstall, only put it
#                          back), and set the identity if one is given: crr-proxy
#                          itself came from the .deb, or was bypassed
#   --bypass               the emergency bypass: kubelet straight back at its
#                          runtime, everything else kept (crr-proxy keeps running
#                          with its settings); --kubelet-only undoes it
#   --kubelet-config PATH  KubeletConfiguration file (default: /var/lib/kubelet/config.yaml)
#   --kubelet-unit NAME    kubelet's systemd unit, whose files are read and which is
#                          restarted (default: the unit of the running kubelet
#                          process, else kubelet.service)
#   --kubeconfig FILE      the node's identity (scripts/node-identity.sh), installed
#                          as /etc/crr-proxy/kubeconfig (0600) and named in crr-proxy.env
#   --identity kubelet     kruise mode under kubelet's own identity instead:
#                          crr-proxy.env names /etc/kubernetes/kubelet.conf, and a
#                          drop-in lets the service read it and kubelet's client
#                          certificate (apply crr-proxy manifests --agent kruise
#                          --identity kubelet to the cluster)
#   DESTDIR=/some/root     install under another root (packaging, tests); then
#                          nothing is started or restarted
#
# The binary goes to /usr/local/bin, or to /opt/bin where /usr is read-only
# (Flatcar); the installed crr-proxy.service names it.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=target/release/crr-proxy
# A release tarball carries the binary in bin/ and has no target/.
[[ -e "$binary" || ! -e bin/crr-proxy ]] || binary=bin/crr-proxy
kubelet_only=false
kubelet_config=/var/lib/kubelet/config.yaml
kubeconfig=""
identity=""
kubelet_unit=""
uninstall=false
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --kubelet-config) kubelet_config="$2"; shift 2 ;;
    --kubeconfig) kubeconfig="$2"; shift 2 ;;
    --uninstall) uninstall=true; shift ;;
    --kubelet-only) kubelet_only=true; shift ;;
    --bypass) uninstall=true; kubelet_only=true; shift ;;
    --identity) identity="$2"; shift 2 ;;
    --kubelet-unit) kubelet_unit="$2"; shift 2 ;;
    # The comment block at the top, whatever its length.
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

case "$identity" in
  "" | kubelet) ;;
  *) echo "install.sh: --identity takes kubelet (crr-proxy's own identity is --kubeconfig FILE)" >&2; exit 2 ;;
esac
if [[ -n "$identity" && -n "$kubeconfig" ]]; then
  echo "install.sh: --kubeconfig and --identity kubelet name two identities; give one" >&2
  exit 2
fi

root="${DESTDIR:-}"
socket=unix:///run/crr-proxy/crr-proxy.sock
unit_dir="$root/etc/systemd/system"
conf_dir="$root/etc/crr-proxy"

live_systemd() { [[ -z "$root" && -d /run/systemd/system ]] && command -v systemctl >/dev/null; }

# True when files can be made at $1, or at its nearest existing parent
# (access(2): false on a read-only file system, even for root).
writable() {
  local dir="$1"
  while [[ ! -e $dir ]]; do dir="$(dirname "$dir")"; done
  [[ -w $dir ]]
}
# Where the binary is: the one the installed unit runs, else /usr/local/bin,
# else (a read-only /usr, as on Flatcar) /opt/bin, where such nodes keep
# their own binaries.
installed_bin="$(sed -n -E 's/^ExecStart=([^[:space:]]+) run$/\1/p' "$unit_dir/crr-proxy.service" 2>/dev/null || true)"
if [[ -n $installed_bin ]]; then
  bin_path="$root$installed_bin"
elif writable "$root/usr/local/bin"; then
  bin_path="$root/usr/local/bin/crr-proxy"
else
  bin_path="$root/opt/bin/crr-proxy"
fi

# kubelet's unit: as given, else the unit whose cgroup holds the running
# kubelet (a kubelet in another unit, as snaps or custom images name it),
# else kubelet.service.
running_kubelet_unit() {
  local comm unit
  for comm in /proc/[0-9]*/comm; do
    [[ "$(cat "$comm" 2>/dev/null)" == kubelet ]] || continue
    unit="$(grep -o -m1 -E '[^/]+\.service' "${comm%comm}cgroup" 2>/dev/null | tail -n1 || true)"
    if [[ -n $unit ]]; then
      printf '%s\n' "$unit"
      return
    fi
  done
}
if [[ -z $kubelet_unit ]] && live_systemd; then kubelet_unit="$(running_kubelet_unit)"; fi
kubelet_unit="${kubelet_unit:-kubelet.service}"
source scripts/lib/kubelet-endpoint.sh

dropin_dir="$unit_dir/crr-proxy.service.d"
kubelet_kubeconfig=/etc/kubernetes/kubelet.conf
# The identity's settings: the env file's kubeconfig line and the drop-in.
# Sets identity_changed when either changed in a running install (the
# service then restarts; a new one starts with them).
identity_changed=false
identity_sum() {
  # The drop-in is often absent: its cat fails, the checksum is still taken.
  { cat "$conf_dir/crr-proxy.env" "$dropin_dir/kubelet-identity.conf" 2>/dev/null || true; } | sha256sum
}
set_identity() {
  local env="$conf_dir/crr-proxy.env" before
  before=$(identity_sum)
  if [[ "$identity" == kubelet ]]; then
    [[ -e "$root$kubelet_kubeconfig" ]] ||
      echo "install.sh: note: $kubelet_kubeconfig does not exist on this node yet" >&2
    install -D -m 0644 systemd/kubelet-identity.conf "$dropin_dir/kubelet-identity.conf"
    if ! grep -qx "CRR_PROXY_KUBECONFIG=$kubelet_kubeconfig" "$env"; then
      sed -i '/^CRR_PROXY_KUBECONFIG=/d' "$env"
      echo "CRR_PROXY_KUBECONFIG=$kubelet_kubeconfig" >>"$env"
    fi
  elif [[ -n "$kubeconfig" ]]; then
    [[ -f "$kubeconfig" ]] || { echo "install.sh: $kubeconfig not found" >&2; exit 1; }
    install -m 0600 "$kubeconfig" "$conf_dir/kubeconfig"
    rm -f "$dropin_dir/kubelet-identity.conf"
    rmdir "$dropin_dir" 2>/dev/null || true
    # Named in the settings unless the operator already names one (but not
    # kubelet's, which was the identity until now).
    sed -E -i "\|^CRR_PROXY_KUBECONFIG=[\"']?$kubelet_kubeconfig[\"']?\$|d" "$env"
    grep -q '^CRR_PROXY_KUBECONFIG=' "$env" ||
      echo "CRR_PROXY_KUBECONFIG=/etc/crr-proxy/kubeconfig" >>"$env"
  fi
  [[ "$before" == "$(identity_sum)" ]] || identity_changed=true
}

# k3s and RKE2 run kubelet inside their own binary, beside a containerd of
# their own that they turn off once container-runtime-endpoint is set: no
# switch can keep that runtime. Refused before anything changes.
if ! $uninstall; then
  for distro in k3s rke2; do
    if [[ -d $root/etc/rancher/$distro || -d $root/var/lib/rancher/$distro ]]; then
      echo "install.sh: this node runs $distro, whose kubelet is built into $distro and whose own containerd stops once container-runtime-endpoint points elsewhere: crr-proxy cannot be put in between, and nothing was changed" >&2
      exit 1
    fi
  done
fi

# The .deb owns the binary, the units and /etc/crr-proxy: its removal is
# apt's, and a purge is what deletes the settings.
from_deb=false
[[ ! -e $root/var/lib/dpkg/info/crr-proxy.list ]] || from_deb=true
if $uninstall && ! $kubelet_only && $from_deb; then
  echo "install.sh: crr-proxy is installed from its .deb: only kubelet is put back here; then remove the package with apt remove crr-proxy (apt purge crr-proxy also deletes /etc/crr-proxy)" >&2
  kubelet_only=true
fi

if $uninstall; then
  # kubelet first, while the socket still answers: its calls never meet
  # a closed socket.
  restore_kubelet
  if live_systemd && $kubelet_touched; then systemctl restart "$kubelet_unit" || true; fi
  if $kubelet_only; then
    echo "kubelet no longer uses crr-proxy: it dials its runtime directly; crr-proxy is still installed, with its settings (install.sh --kubelet-only points kubelet at it again)"
    exit 0
  fi
  if live_systemd; then
    systemctl disable --now crr-proxy.service crr-proxy.socket || true
  fi
  rm -f "$bin_path" "$unit_dir/crr-proxy.socket" "$unit_dir/crr-proxy.service" \
    "$conf_dir/crr-proxy.env" "$conf_dir/kubeconfig" "$dropin_dir/kubelet-identity.conf"
  rmdir "$conf_dir" "$dropin_dir" 2>/dev/null || true
  if live_systemd; then systemctl daemon-reload; fi
  echo "crr-proxy uninstalled"
  exit 0
fi

# crr-proxy forwards to the runtime kubelet uses now, whatever it is: its
# settings get kubelet's endpoints before kubelet is pointed at it. Sets
# settings_changed. Once kubelet dials crr-proxy the settings already hold
# them (an operator's later change is kept).
settings_changed=false
carry_endpoints() {
  local runtime image
  [[ -f $conf_dir/crr-proxy.env ]] || return 0
  runtime="$(current_endpoint containerRuntimeEndpoint)"
  [[ $runtime != "$socket" ]] || return 0
  image="$(current_endpoint imageServiceEndpoint)"
  [[ $image != "$socket" ]] || image=$runtime
  set_setting CRR_PROXY_RUNTIME_ENDPOINT "$runtime"
  if [[ $image == "$runtime" ]]; then
    set_setting CRR_PROXY_IMAGE_ENDPOINT ""
  else
    set_setting CRR_PROXY_IMAGE_ENDPOINT "$image"
  fi
}

# Sets NAME=VALUE in the settings file, in place where it is set (no line
# when VALUE is empty).
set_setting() {
  local env="$conf_dir/crr-proxy.env" name="$1" value="$2" cur
  cur="$(grep -m1 "^$name=" "$env" | sed -E "s/^$name=//; s/^[\"'](.*)[\"']\$/\1/" || true)"
  [[ $cur != "$value" ]] || return 0
  if [[ -z $value ]]; then
    sed -i "/^$name=/d" "$env"
    echo "removed $name=$cur from $conf_dir/crr-proxy.env: kubelet uses one endpoint for both services"
  elif grep -q "^$name=" "$env"; then
    sed -i "s|^$name=.*|$name=$value|" "$env"
    echo "crr-proxy forwards to $value, where kubelet goes now ($name was ${cur:-unset})"
  else
    echo "$name=$value" >>"$env"
    echo "crr-proxy forwards to $value, where kubelet goes now ($name)"
  fi
  settings_changed=true
}

# The crr-proxy that systemd runs (the .deb's, or this script's).
checker() { if $from_deb; then echo "$root/usr/bin/crr-proxy"; else echo "$bin_path"; fi; }

# Before kubelet is pointed at crr-proxy: the runtime answers, and crr-proxy
# answers for it (crr-proxy check --before-switch); else kubelet is left
# as it is and the install fails. Only on a live node: elsewhere nothing
# runs to check.
check_before_switch() {
  local out
  if ! live_systemd; then
    echo "not checked that crr-proxy reaches the runtime: nothing is started here"
    return 0
  fi
  if ! out="$("$(checker)" check --before-switch --env-file "$conf_dir/crr-proxy.env" 2>&1)"; then
    printf '%s\n' "$out" >&2
    echo "install.sh: kubelet is left as it is: crr-proxy does not reach kubelet's runtime (above). Fix $conf_dir/crr-proxy.env or the runtime, then run this again" >&2
    exit 1
  fi
  printf '%s\n' "$out"
}

if $kubelet_only; then
  # kubelet goes NotReady on a socket nothing listens on.
  if live_systemd && ! systemctl is-active --quiet crr-proxy.socket; then
    echo "install.sh: crr-proxy.socket is not active; start it first: systemctl enable --now crr-proxy.socket" >&2
    exit 1
  fi
  # The .deb's crr-proxy under another identity, if one is given.
  [[ -z "$identity$kubeconfig" ]] || set_identity
  carry_endpoints
  if live_systemd && { $identity_changed || $settings_changed; }; then
    systemctl daemon-reload
    systemctl try-restart crr-proxy.service
  fi
  check_before_switch
  switch_kubelet
  if $kubelet_unswitched; then
    echo "install.sh: kubelet is not switched (see above)" >&2
    exit 1
  elif ! $kubelet_touched; then
    echo "kubelet already points at $socket; kubelet is not restarted"
  elif live_systemd; then
    systemctl restart "$kubelet_unit"
  fi
  echo "kubelet switched to $socket"
  exit 0
fi

[[ -x "$binary" ]] || { echo "install.sh: $binary not found; build it with: cargo build --release" >&2; exit 1; }
# Running already: a change of identity needs a restart (a service that
# starts now reads it anyway).
running=false
if live_systemd && systemctl is-active --quiet crr-proxy.service; then running=true; fi
install -D -m 0755 "$binary" "$bin_path"
install -D -m 0644 systemd/crr-proxy.socket "$unit_dir/crr-proxy.socket"
sed "s|^ExecStart=/usr/local/bin/crr-proxy |ExecStart=${bin_path#"$root"} |" systemd/crr-proxy.service |
  install -D -m 0644 /dev/stdin "$unit_dir/crr-proxy.service"
[[ $bin_path == "$root/usr/local/bin/crr-proxy" ]] ||
  echo "installed crr-proxy as ${bin_path#"$root"} (/usr/local/bin is read-only here)"
install -d -m 0750 "$conf_dir"
# The operator's settings survive re-installs and upgrades.
[[ -e "$conf_dir/crr-proxy.env" ]] || install -m 0640 systemd/crr-proxy.env "$conf_dir/crr-proxy.env"
set_identity
carry_endpoints

if live_systemd; then
  systemctl daemon-reload
  systemctl enable --now crr-proxy.socket crr-proxy.service
  # Other settings or identity: the service reads them, and its mounts, at
  # start.
  if { $identity_changed || $settings_changed; } && $running; then systemctl restart crr-proxy.service; fi
fi
check_before_switch

switch_kubelet
if ! $kubelet_touched && ! $kubelet_unswitched; then
  echo "kubelet already points at $socket; kubelet is not restarted"
fi
if live_systemd && $kubelet_touched; then systemctl restart "$kubelet_unit"; fi
echo "crr-proxy installed"
