# containerd 2.x for a second run of the containerd tests, beside Debian
# bookworm's containerd 1.6. Sourced by scripts/test.sh.
#
# Bookworm has no containerd 2, but Debian's sid does, and its package needs
# only runc and libc6 >= 2.34, so its binaries run here. It is downloaded
# with a private apt source list, lists and cache (the system's apt sources,
# lists and installed packages stay as they are) and unpacked with dpkg-deb
# into a cache folder outside the git tree, kept between runs on one machine.
# Nothing is installed: the tests take the binaries from that folder when
# CRR_TEST_CONTAINERD names it (tests/support/containerd.rs).

# Where unpacked containerd versions are kept, one folder per Debian version.
CRR_TEST_CACHE="${CRR_TEST_CACHE:-/var/cache/crr-proxy-test}"

# The Debian archive this machine's apt already uses: the URI of the first
# source (deb822 `.sources` or one-line `.list`) that serves its release's
# main suite. A machine set up for a mirror fetches sid from that mirror;
# CRR_TEST_DEBIAN_MIRROR overrides it. $1: apt's folder (/etc/apt), $2: the
# release's codename (this machine's).
_debian_mirror() {
  local apt="${1:-/etc/apt}" codename="${2:-}" files=()
  [[ -n $codename ]] || codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  [[ -f $apt/sources.list ]] && files+=("$apt/sources.list")
  shopt -s nullglob
  files+=("$apt"/sources.list.d/*.list "$apt"/sources.list.d/*.sources)
  shopt -u nullglob
  ((${#files[@]})) || return 1
  awk -v want="$codename" '
    function pick(uri) { sub(/\/+$/, "", uri); print uri; found = 1; exit }
    # One-line style: deb [options] URI suite components...
    /^[[:space:]]*deb[[:space:]]/ {
      n = 2
      if ($2 ~ /^\[/) { while (n <= NF && $n !~ /\]$/) n++; n++ }
      if ($(n + 1) == want) pick($n)
      next
    }
    # deb822 style: stanzas separated by blank lines.
    /^[[:space:]]*$/ { if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " want " ") && uri != "") pick(uri); types = suites = uri = ""; next }
    /^Types:/ { types = $0; sub(/^Types:[[:space:]]*/, "", types) }
    /^URIs:/ { uri = $2 }
    /^Suites:/ { suites = $0; sub(/^Suites:[[:space:]]*/, "", suites) }
    END { if (!found && types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " want " ") && uri != "") print uri }
  ' "${files[@]}"
}

# True when $1/usr/bin holds a containerd 2.x with its shim and ctr.
_containerd2_ok() {
  local bin="$1/usr/bin" version
  [[ -x $bin/containerd && -x $bin/containerd-shim-runc-v2 && -x $bin/ctr ]] || return 1
  # "containerd github.com/containerd/containerd/v2 2.1.9+unknown "
  version="$("$bin/containerd" --version 2>/dev/null | awk '{ print $3 }')" || return 1
  [[ $version == 2.* ]]
}

# Downloads sid's containerd and unpacks it into $CRR_TEST_CACHE; prints the
# new folder. In a subshell, so its temp dir goes away on every exit.
_containerd2_download() (
  set -euo pipefail
  # A subshell: its variables stay here, and its trap runs when it ends.
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # apt drops to the _apt user to download, which must reach these folders.
  chmod 755 "$tmp"
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/parts" "$tmp/deb"
  if getent passwd _apt >/dev/null; then chown _apt "$tmp/deb"; fi
  # target=Packages: only the package list, not the translations or DEP-11
  # metadata that the system's apt.conf.d may ask for.
  mirror="${CRR_TEST_DEBIAN_MIRROR:-$(_debian_mirror)}"
  [[ -n $mirror ]] || { echo "containerd2: no Debian source in this machine's apt sources (set CRR_TEST_DEBIAN_MIRROR)" >&2; exit 1; }
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg target=Packages] $mirror sid main" \
    >"$tmp/sources.list"
  apt=(
    -qq
    -o "Dir::Etc::SourceList=$tmp/sources.list"
    -o "Dir::Etc::SourceParts=$tmp/parts"
    -o "Dir::State::Lists=$tmp/lists"
    -o "Dir::Cache=$tmp/cache"
  )
  apt-get "${apt[@]}" update >&2
  version="$(apt-cache "${apt[@]}" show --no-all-versions containerd/sid | awk '/^Version:/ { print $2; exit }')"
  [[ -n $version ]] || { echo "containerd2: sid has no containerd package" >&2; exit 1; }
  dest="$CRR_TEST_CACHE/containerd-$version"
  echo "downloading containerd $version from Debian sid into $dest" >&2
  (cd "$tmp/deb" && apt-get "${apt[@]}" download "containerd=$version" >&2)
  mkdir -p "$CRR_TEST_CACHE"
  # Unpack beside the destination and rename, so a run that stops half-way
  # never leaves a folder that looks complete.
  part="$(mktemp -d "$CRR_TEST_CACHE/.containerd-$version.XXXXXX")"
  dpkg-deb -x "$tmp"/deb/containerd_*.deb "$part"
  chmod 755 "$part"
  if ! _containerd2_ok "$part"; then
    rm -rf "$part"
    echo "containerd2: the containerd $version from sid is not a working containerd 2.x" >&2
    exit 1
  fi
  rm -rf "$dest"
  mv -T "$part" "$dest"
  echo "$dest"
)

# Exports CRR_TEST_CONTAINERD2: the folder with containerd 2.x's containerd,
# containerd-shim-runc-v2 and ctr. Uses the newest unpacked version in the
# cache without touching the network; downloads only when there is none.
ensure_containerd2() {
  local dir="" candidate
  while read -r candidate; do
    if _containerd2_ok "$candidate"; then
      dir="$candidate"
    fi
  done < <(find "$CRR_TEST_CACHE" -mindepth 1 -maxdepth 1 -type d -name 'containerd-2.*' 2>/dev/null | sort -V)
  if [[ -z $dir ]]; then
    dir="$(_containerd2_download)"
  fi
  _containerd2_ok "$dir" || { echo "containerd2: no containerd 2.x in $dir" >&2; return 1; }
  export CRR_TEST_CONTAINERD2="$dir/usr/bin"
}
