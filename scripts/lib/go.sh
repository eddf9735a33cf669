# Go's caches for building the real parts (containerd_go.sh, kube.sh,
# kruise.sh, critools.sh): one build cache and one module cache under the
# test cache, shared by one run's builds (containerd 2.3 and 2.4 share most
# of their packages) and removed by go_caches_drop once they are done. The
# built versions are cached themselves, so Go's caches would serve only a
# build of a version not built yet; left in ~/.cache and ~/go, a cold run's
# took 11 GB beside the tests. (CRR_TEST_CACHE: sid.sh.)

# Sets Go up for a build of $1 (for the message when Go is missing).
go_env() {
  command -v go >/dev/null || {
    echo "$0: Go 1.26 or later is needed to build $1" >&2
    return 1
  }
  export GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
    GOCACHE="$CRR_TEST_CACHE/.go/build" GOMODCACHE="$CRR_TEST_CACHE/.go/mod"
}

go_caches_drop() {
  rm -rf "$CRR_TEST_CACHE/.go"
}
