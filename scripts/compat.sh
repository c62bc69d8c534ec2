#!/usr/bin/env bash
# The fast test subset against every transformers release specdec claims besides the one
# .venv resolves (the newest that pyproject allows, where the whole suite runs): the tiny
# models of every architecture, the dynamic, native and static paths on them, the
# Hugging Face `custom_generate` adapter, and the check that no path specdec drives warns
# (docs/usage.md, "Supported versions"). One virtual environment per version,
# .venv-transformers-<version>, with the pinned CPU torch; a rerun with unchanged pins and
# project dependencies skips the installation. Extra arguments go to pytest.
#
# Environment: SPECDEC_COMPAT_TRANSFORMERS (the versions, space-separated; default below),
# SPECDEC_COMPAT_TESTS (the test files, space-separated; CI runs the two quickest: .ci/run).
# `--install-only` (first argument): make the environments and the C++ extensions ready in each (built, or
# imported where an environment with the same torch built them), and run nothing (CI does that while the suite runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
only_install=0
if [ "${1:-}" = "--install-only" ]; then
  only_install=1
  shift
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_PIN="torch==2.13.0"          # the CPU build that lies on this machine's disk; a looser pin downloads GBs
VERSIONS=${SPECDEC_COMPAT_TRANSFORMERS:-"5.0.0"}   # the oldest release pyproject claims
read -r -a TESTS <<< "${SPECDEC_COMPAT_TESTS:-tests/test_hf.py tests/test_transformers_compat.py \
  tests/test_lossless.py tests/test_stop_rules.py tests/test_runner.py tests/test_static.py}"

pip() {  # quiet pip that keeps its exit status, minus this machine's noise about absent local indexes
  local venv=$1 log status=0
  shift
  log=$(mktemp)
  "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1 || status=$?
  grep -v "is ignored: it is neither" "$log" >&2 || true
  rm -f "$log"
  return "$status"
}

for version in $VERSIONS; do
  venv=.venv-transformers-$version
  stamp_key=$( (cat pyproject.toml scripts/compat.sh; echo "$version") | sha256sum | cut -c1-16)
  if [ ! -f "$venv/.specdec-compat" ] || [ "$(cat "$venv/.specdec-compat")" != "$stamp_key" ]; then
    started=$(date +%s)
    echo "compat: installing transformers==$version into $venv" >&2
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    pip "$venv" install "$TORCH_PIN"
    pip "$venv" install -e ".[test]" "transformers==$version"
    "$venv/bin/python" -c "import transformers, specdec; assert transformers.__version__ == '$version'" \
      || { echo "compat: the installation of transformers $version is incomplete" >&2; exit 1; }
    echo "$stamp_key" > "$venv/.specdec-compat"
    echo "compat: installed in $(( $(date +%s) - started )) s" >&2
  fi
  if [ "$only_install" = 1 ]; then  # the environment ready: the C++ extensions too
    "$venv/bin/python" scripts/build_extensions.py
    continue
  fi
  started=$(date +%s)
  echo "compat: transformers $version, torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')" >&2
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" "${TESTS[@]}" "$@"
  echo "compat: transformers $version passed in $(( $(date +%s) - started )) s" >&2
done
