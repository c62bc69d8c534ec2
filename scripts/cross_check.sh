#!/usr/bin/env bash
# The portable kernels' contract checks without torch (tests/native/*.cpp), compiled for this machine's
# baseline target, for AVX2+FMA where the CPU has it, and for aarch64 (NEON) run under qemu's user-mode
# emulation: the portable path of a CPU the project has no machine of. Installs the cross compiler and
# qemu from Debian's packages when they are missing and this is root (`--no-install` skips that).
# Also run by tests/test_native_contract.py (aarch64 only where the tools are present). `--install-only`
# installs the tools and runs nothing (CI: the suite's test_native_contract.py then runs the checks).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
install=1
only_install=0
[ "${1:-}" = "--no-install" ] && install=0
[ "${1:-}" = "--install-only" ] && only_install=1
CXX=${CXX:-g++}
FLAGS=(-O3 -std=c++17 -ffp-contract=off)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  if [ "$install" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "cross_check: installing g++-aarch64-linux-gnu and qemu-user (Debian packages)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user) \
      >/dev/null 2>&1 || echo "cross_check: the install failed (no package registry?): aarch64 is skipped below"
  fi
fi
if [ "$only_install" = 1 ]; then
  command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null \
    && echo "cross_check: aarch64-linux-gnu-g++ and qemu-aarch64 are installed" \
    || echo "cross_check: no aarch64 tools: the aarch64 contract checks will be skipped"
  exit 0
fi
for source in tests/native/*.cpp; do
  name=$(basename "$source" .cpp)
  echo "== $name, baseline target ($CXX)"
  "$CXX" "${FLAGS[@]}" "$source" -o "$out/$name-base" -Wno-psabi
  "$out/$name-base"
  if grep -q -w avx2 /proc/cpuinfo && grep -q -w fma /proc/cpuinfo; then
    echo "== $name, AVX2+FMA"
    "$CXX" "${FLAGS[@]}" -mavx2 -mfma "$source" -o "$out/$name-avx2" -Wno-psabi
    "$out/$name-avx2"
  fi
  if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then
    echo "== $name, aarch64 (NEON) under qemu-aarch64"
    aarch64-linux-gnu-g++ "${FLAGS[@]}" -static "$source" -o "$out/$name-aarch64"
    qemu-aarch64 "$out/$name-aarch64"
  else
    echo "== $name, aarch64: skipped (no aarch64-linux-gnu-g++ or qemu-aarch64; run as root to install them)"
  fi
done
