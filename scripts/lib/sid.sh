# One package of Debian's sid, unpacked into a cache folder for the tests:
# containerd 2.x (containerd2.sh) and kustomize (kustomize.sh), which
# bookworm does not have. Their packages need only libc6 >= 2.34 (and, for
# containerd, runc), so the binaries run here. Downloaded with a private apt
# source list, lists and cache, from the mirror this machine's apt already
# uses (the system's sources, lists and installed packages stay as they
# are), unpacked with dpkg-deb outside the git tree and kept between runs.
# Nothing is installed.

# Where unpacked packages are kept, one folder per package and version.
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

# Downloads sid's package $1 and unpacks it into
# $CRR_TEST_CACHE/$1-VERSION; prints that folder. $2: a function that is
# true when a folder holds a working unpacked package. In a subshell, so
# its temp dir goes away on every exit.
sid_unpack() (
  set -euo pipefail
  package="$1" works="$2"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # apt drops to the _apt user to download, which must reach these folders.
  chmod 755 "$tmp"
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/parts" "$tmp/deb"
  if getent passwd _apt >/dev/null; then chown _apt "$tmp/deb"; fi
  # target=Packages: only the package list, not the translations or DEP-11
  # metadata that the system's apt.conf.d may ask for.
  mirror="${CRR_TEST_DEBIAN_MIRROR:-$(_debian_mirror)}"
  [[ -n $mirror ]] || { echo "sid: no Debian source in this machine's apt sources (set CRR_TEST_DEBIAN_MIRROR)" >&2; exit 1; }
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
  version="$(apt-cache "${apt[@]}" show --no-all-versions "$package/sid" | awk '/^Version:/ { print $2; exit }')"
  [[ -n $version ]] || { echo "sid: sid has no $package package" >&2; exit 1; }
  dest="$CRR_TEST_CACHE/$package-$version"
  echo "downloading $package $version from Debian sid into $dest" >&2
  (cd "$tmp/deb" && apt-get "${apt[@]}" download "$package=$version" >&2)
  mkdir -p "$CRR_TEST_CACHE"
  # Unpack beside the destination and rename, so a run that stops half-way
  # never leaves a folder that looks complete.
  part="$(mktemp -d "$CRR_TEST_CACHE/.$package-$version.XXXXXX")"
  dpkg-deb -x "$tmp"/deb/"$package"_*.deb "$part"
  chmod 755 "$part"
  if ! "$works" "$part"; then
    rm -rf "$part"
    echo "sid: the $package $version from sid does not work here" >&2
    exit 1
  fi
  rm -rf "$dest"
  mv -T "$part" "$dest"
  echo "$dest"
)

# Prints the newest folder $CRR_TEST_CACHE/$2 (a glob) that $3 (as for
# sid_unpack) finds working, without touching the network; downloads and
# unpacks sid's package $1 only when there is none.
sid_cached() {
  local package="$1" glob="$2" works="$3" dir="" candidate
  while read -r candidate; do
    if "$works" "$candidate"; then
      dir="$candidate"
    fi
  done < <(find "$CRR_TEST_CACHE" -mindepth 1 -maxdepth 1 -type d -name "$glob" 2>/dev/null | sort -V)
  if [[ -z $dir ]]; then
    dir="$(sid_unpack "$package" "$works")" || return 1
  fi
  "$works" "$dir" || { echo "sid: no working $package in $dir" >&2; return 1; }
  echo "$dir"
}
