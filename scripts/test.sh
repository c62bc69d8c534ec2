#!/usr/bin/env bash
# Quick start 2: install, then lint (ruff), type-check (mypy --strict) and run the test suite.
# Extra arguments go to pytest (e.g. `-m "not slow"` to skip the default-model tests).
# A compiled extension that does not build fails its tests with the compiler's message; on a
# machine without a C++ compiler, SPECDEC_ALLOW_NO_COMPILER=1 turns those failures into skips.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/ruff check specdec tests benchmarks conftest.py scripts
.venv/bin/mypy --strict specdec
# The pytest-benchmark suite in smoke mode: each benchmark runs once, untimed, so a broken one fails CI.
.venv/bin/python -m pytest benchmarks --benchmark-disable -o addopts=-ra -q -p no:cacheprovider
exec .venv/bin/python -m pytest "$@"
