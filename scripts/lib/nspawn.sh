# A minimal Debian root with systemd, for tests/systemd.rs, which boots it
# with systemd-nspawn and installs crr-proxy's release there. Made with
# debootstrap from the mirror this machine's apt already uses (sid.sh's
# _debian_mirror), kept in the test cache between runs. Sourced by
# scripts/test.sh; `ensure_nspawn_root` exports CRR_TEST_NSPAWN_ROOT.

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"

# What the root holds beyond minbase: systemd as PID 1 and the bus its
# tools talk over.
CRR_NSPAWN_PACKAGES="systemd,systemd-sysv,dbus"

# True when $1 is a root made with these packages.
_nspawn_root_ok() {
  [[ -x $1/usr/lib/systemd/systemd && -f $1/.crr-root-stamp &&
    "$(cat "$1/.crr-root-stamp")" == "$CRR_NSPAWN_PACKAGES" ]]
}

ensure_nspawn_root() {
  local codename dest part mirror
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  dest="$CRR_TEST_CACHE/nspawn-$codename"
  if ! _nspawn_root_ok "$dest"; then
    command -v debootstrap >/dev/null && command -v systemd-nspawn >/dev/null || {
      echo "nspawn: installing debootstrap and systemd-container" >&2
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        debootstrap systemd-container >/dev/null
    }
    mirror="${CRR_TEST_DEBIAN_MIRROR:-$(_debian_mirror)}"
    [[ -n $mirror ]] || { echo "nspawn: no Debian source in this machine's apt sources (set CRR_TEST_DEBIAN_MIRROR)" >&2; return 1; }
    echo "nspawn: debootstrap $codename ($CRR_NSPAWN_PACKAGES) into $dest" >&2
    mkdir -p "$CRR_TEST_CACHE"
    # Made beside the destination and renamed, so a run that stops half-way
    # never leaves a root that looks complete.
    part="$(mktemp -d "$CRR_TEST_CACHE/.nspawn-$codename.XXXXXX")"
    debootstrap --variant=minbase --include="$CRR_NSPAWN_PACKAGES" \
      "$codename" "$part" "$mirror" >"$part.log" 2>&1 || {
      tail -20 "$part.log" >&2
      rm -rf "$part" "$part.log"
      echo "nspawn: debootstrap failed" >&2
      return 1
    }
    rm -f "$part.log"
    printf '%s' "$CRR_NSPAWN_PACKAGES" >"$part/.crr-root-stamp"
    chmod 755 "$part"
    rm -rf "$dest"
    mv -T "$part" "$dest"
  fi
  export CRR_TEST_NSPAWN_ROOT="$dest"
}
