#!/usr/bin/env bash
# Quick start 1: speculative decoding on the default model (SmolLM2-135M-Instruct), plain
# decoding vs drafters side by side. Extra arguments go to `specdec demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/specdec demo "$@"
