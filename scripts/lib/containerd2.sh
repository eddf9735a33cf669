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

source "$(dirname "${BASH_SOURCE[0]}")/sid.sh"

# True when $1/usr/bin holds a containerd 2.x with its shim and ctr.
_containerd2_ok() {
  local bin="$1/usr/bin" version
  [[ -x $bin/containerd && -x $bin/containerd-shim-runc-v2 && -x $bin/ctr ]] || return 1
  # "containerd github.com/containerd/containerd/v2 2.1.9+unknown "
  version="$("$bin/containerd" --version 2>/dev/null | awk '{ print $3 }')" || return 1
  [[ $version == 2.* ]]
}

# Exports CRR_TEST_CONTAINERD2: the folder with containerd 2.x's containerd,
# containerd-shim-runc-v2 and ctr. Uses the newest unpacked version in the
# cache without touching the network; downloads only when there is none.
ensure_containerd2() {
  local dir
  dir="$(sid_cached containerd 'containerd-2.*' _containerd2_ok)" || return 1
  export CRR_TEST_CONTAINERD2="$dir/usr/bin"
}
