#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine: installs containerd, runc
# and busybox-static when missing, fetches containerd 2.1 (Debian sid),
# kustomize and promtool into private folders, a Debian root with systemd
# (debootstrap) for the systemd test, and the Python test peers into a private virtualenv,
# then builds containerd 2.3 and 2.4, Kubernetes v1.37.2 (and a kubelet
# v1.35.4), OpenKruise v1.9.0 and cri-tools v1.37.0 (critest, crictl) from
# their Go modules (containerd_go.sh, kube.sh, kruise.sh, critools.sh;
# cached by version), then checks formatting and lints,
# and runs every test (unit, integration against a private real containerd,
# and on a private real Kubernetes) on containerd 1.6, the containerd tests
# once more on 2.3, and the relay's own ones (critest and crictl among
# them) on 2.1 and 2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deps.sh
source scripts/lib/containerd2.sh
source scripts/lib/containerd_go.sh
source scripts/lib/peers.sh
source scripts/lib/kustomize.sh
source scripts/lib/nspawn.sh
source scripts/lib/kube.sh
source scripts/lib/kruise.sh
source scripts/lib/critools.sh
source scripts/lib/promtool.sh
ensure_root
ensure_packages
ensure_containerd2
ensure_containerd_go
ensure_kustomize
ensure_promtool
ensure_nspawn_root
ensure_peers
ensure_kubernetes
ensure_older_kubelet
ensure_kruise
ensure_critools
go_caches_drop
# Disk is the one resource the suite can run out of without saying so
# (containers, clusters and the build all write): the free space, before
# and after, is in CI's log.
echo "== free disk: $(df -h --output=avail . | tail -1 | tr -d ' ')"
# One build, never rebuilt in place: incremental state would only add to
# target (3.9 GB in a clean build).
export CARGO_INCREMENTAL=0

cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
# Doc tests: none yet. Examples and benches are compiled by clippy above.
# Four tests at a time in each test binary (cargo's default here is two, one
# per core): they mostly wait on containerd, kubelet or a grace period.
# tests/agent took 425 s with two, using 0.43 cores; 226 s with four, 0.83.
export RUST_TEST_THREADS=4
# Every test binary runs even when one fails (--no-fail-fast): a failure does
# not hide what the binaries after it would say.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
echo "== the suite, containerd $(containerd --version | awk '{ print $3 }')"
cargo test --locked --no-fail-fast --lib --bins --tests 2>&1 | tee "$log" || status=$?
# The test binaries that start a containerd, again on 2.3.
containerd_tests=()
# (A test of several files is a folder with main.rs, as tests/agent/; a
# real node, support::node, starts a containerd of its own.)
for file in tests/*.rs tests/*/main.rs; do
  sources=("$file")
  [[ $file == */main.rs ]] && sources=("${file%main.rs}"*.rs)
  if grep -qE 'Containerd::start|Node::start' "${sources[@]}"; then
    name="${file#tests/}"
    name="${name%/main.rs}"
    containerd_tests+=(--test "${name%.rs}")
  fi
done
echo "== the containerd tests, containerd $("$CRR_TEST_CONTAINERD_LTS/containerd" --version | awk '{ print $3 }')"
# The agent scenarios on a v1beta1 cluster differ from the v1.9 ones in the
# API server only; the v1.9 ones cover containerd 2.3. Every test on a real
# Kubernetes runs on both.
CRR_TEST_CONTAINERD="$CRR_TEST_CONTAINERD_LTS" cargo test --locked --no-fail-fast "${containerd_tests[@]}" -- \
  --skip kruise_master:: --skip standalone_v1beta1:: 2>&1 |
  tee -a "$log" || status=$?
# The relay's own tests that start a containerd (the CRI through crr-proxy
# as directly, by three clients, critest and crictl; a runtime that goes
# away; the newest CRI) on Debian sid's 2.1 and on 2.4, the newest line:
# the whole suite on 2.1 as well would take CI past its time, and 2.3 is
# the line nodes run.
for dir in "$CRR_TEST_CONTAINERD2" "$CRR_TEST_CONTAINERD_NEWEST"; do
  echo "== the relay's containerd tests, containerd $("$dir/containerd" --version | awk '{ print $3 }')"
  CRR_TEST_CONTAINERD="$dir" cargo test --locked --no-fail-fast \
    --test containerd --test crash --test cri_newest --test peers \
    --test critest --test crictl 2>&1 |
    tee -a "$log" || status=$?
done
# kubelet's streaming lists (its alpha gate CRIListStreaming) on the line
# that serves them; on 1.6 and 2.3 the same test sees kubelet fall back.
echo "== kubelet's streaming lists, containerd $("$CRR_TEST_CONTAINERD_NEWEST/containerd" --version | awk '{ print $3 }')"
CRR_TEST_CONTAINERD="$CRR_TEST_CONTAINERD_NEWEST" cargo test --locked --no-fail-fast --test real streaming:: 2>&1 |
  tee -a "$log" || status=$?
echo "== free disk: $(df -h --output=avail . | tail -1 | tr -d ' ')"
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
