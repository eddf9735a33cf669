# The Python test peers (tests/peers/*.py): a virtualenv outside the git
# tree with pinned grpcio, h2, hpack and kubernetes-validate from PyPI. Sourced by scripts/test.sh;
# `ensure_peers` exports CRR_TEST_PYTHON, which the Rust tests run the peers
# with.
#
# Idempotent: a stamp file in the venv names the interpreter and the pins;
# when it matches, nothing is run but one `cat`.

# Overridable for a machine that wants the venv elsewhere.
: "${CRR_PEERS_VENV:=/var/cache/crr-proxy-test/peers-venv}"
: "${CRR_PEERS_BASE_PYTHON:=python3}"

# Wheels for CPython 3.11 on x86_64 exist for every pin (grpcio ships
# manylinux wheels; the rest are pure Python).
CRR_PEERS_PINS=(
  grpcio==1.85.3
  typing-extensions==4.16.0
  h2==4.4.1
  hpack==4.2.0
  hyperframe==6.1.0
  # kubernetes-validate: Kubernetes' own OpenAPI schemas (1.30 to 1.37),
  # which tests/manifests.rs checks deploy/'s rendered objects against; and
  # what it needs.
  kubernetes-validate==1.37.0
  attrs==26.1.0
  importlib-resources==7.1.0
  jsonschema==4.26.0
  jsonschema-specifications==2025.9.1
  packaging==26.4
  PyYAML==6.0.4
  referencing==0.37.0
  rpds-py==2026.9.1
)

ensure_peers() {
  local venv="$CRR_PEERS_VENV"
  local base
  base="$(command -v "$CRR_PEERS_BASE_PYTHON")" || {
    echo "ensure_peers: $CRR_PEERS_BASE_PYTHON not found" >&2
    return 1
  }
  local want
  want="$("$base" -c 'import sys; print(sys.executable, sys.version.split()[0])') ${CRR_PEERS_PINS[*]}"
  if [[ -x "$venv/bin/python" && -f "$venv/.peers-stamp" && "$(cat "$venv/.peers-stamp")" == "$want" ]]; then
    export CRR_TEST_PYTHON="$venv/bin/python"
    return 0
  fi

  echo "ensure_peers: building $venv (${CRR_PEERS_PINS[*]})" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! "$base" -m venv "$venv" 2>/dev/null; then
    # Debian splits venv/ensurepip out of python3.
    rm -rf "$venv"
    echo "ensure_peers: installing python3-venv" >&2
    apt-get update -qq
    local minor
    minor="$("$base" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3-venv "python$minor-venv" >/dev/null 2>&1 ||
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3-venv >/dev/null
    "$base" -m venv "$venv" || {
      echo "ensure_peers: $base -m venv $venv failed" >&2
      return 1
    }
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-input --only-binary=:all: "${CRR_PEERS_PINS[@]}" || {
    echo "ensure_peers: pip install failed" >&2
    return 1
  }
  "$venv/bin/python" -c 'import grpc, h2.connection, hpack, hyperframe, kubernetes_validate' || {
    echo "ensure_peers: the peers' modules do not import" >&2
    return 1
  }
  printf '%s' "$want" >"$venv/.peers-stamp"
  export CRR_TEST_PYTHON="$venv/bin/python"
}
