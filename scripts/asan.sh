#!/usr/bin/env bash
# The compiled extensions (sam, rest_index, the CPU kernels) rebuilt with AddressSanitizer and
# UndefinedBehaviorSanitizer (an overflow, a misaligned or out-of-range pointer, a bad shift halts), then the
# tests that feed them crafted files and random input. An out-of-bounds read that happens to land
# in mapped memory passes the plain suite on one machine and crashes on another (CI, 2026-11-25:
# a damaged file's root transition); under ASan it fails everywhere, naming the line.
# Usage: bash scripts/asan.sh [pytest arguments]   (~7 min; builds land in their own cache folder)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh >/dev/null
export SPECDEC_CACHE_DIR="${SPECDEC_CACHE_DIR:-$HOME/.cache/specdec}/asan"
# libstdc++ is preloaded with libasan so the sanitizer's exception interceptor finds __cxa_throw.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so.6)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
tests=(tests/test_suffix_automaton.py tests/test_rest.py tests/test_datastore_format.py tests/test_fuzz_bad_input.py
       tests/test_cpu_kernels.py tests/test_cpu_kernels_bad_input.py tests/test_shared_store.py
       tests/test_trusted_datastore.py
       "tests/test_runner.py::test_the_one_call_op_refuses_what_does_not_add_up"  # the decoder-layer loop, bad input
       "tests/test_runner.py::test_the_layer_loop_in_one_call_gives_the_loops_bits"  # and good input
       "tests/test_runner.py::test_one_call_against_the_loop_on_random_batches")
# Preloading libstdc++ defeats the static-libstdc++ refusal that test_native checks: left out.
exec .venv/bin/python - "${@:-${tests[@]}}" <<'PY'
import sys

import pytest

import specdec.native as native

build = native.load_extension


def sanitized(name, sources, **options):
    """Every extension under its own name, compiled and linked with -fsanitize=address,undefined."""
    options["extra_cflags"] = (*options.get("extra_cflags", ("-O3",)), "-g", "-fsanitize=address,undefined",
                               "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
                               "-O1")  # last -O wins: at -O3 UBSan's checks in the unrolled kernels take ~30 min to compile
    options["extra_ldflags"] = (*options.get("extra_ldflags", ()), "-fsanitize=address,undefined")
    return build(f"{name}_asan", sources, **options)


native.load_extension = sanitized  # before any extension module imports it
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
PY
