#!/usr/bin/env bash
# One call on the lent H200 for issue #16: the fill GPU tests, bench_codec_precision.py run (issue
# #25), then bench_fill_gpu.py run (CODEC_PRECISION=float32|tf32|bf16 for the job's codecPrecision).
# Run from a copy of the tree (cd .gpu/fill) with the carried wheels in ../../.whl and the seed
# utterances in seeds/ (made here with `ttsfleet fill corpus seeds -n 40`).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  ../../.whl/*.whl 2>&1 | tail -2
# ttsfleet is not installed there: link the component folders under ttsfleet/ (the pyproject
# mapping) and put only ttsfleet on the path (the repo root would shadow the stdlib's operator)
for c in operator inference kernels fill_jobs slurm; do [ -e "ttsfleet/$c" ] || ln -s "../$c" "ttsfleet/$c"; done
mkdir -p /tmp/pkg && ln -sfn "$PWD/ttsfleet" /tmp/pkg/ttsfleet
export PYTHONPATH=/tmp/site:/tmp/pkg
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/run.log"
command -v espeak-ng >/dev/null && echo "espeak-ng: present" || echo "espeak-ng: absent" | tee -a "$OUT/run.log"
t0=$(date +%s)
timeout 60 python3 -P -m pytest -q --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib \
  -s -m gpu tests/fill_jobs/test_tokenize.py tests/fill_jobs/test_features.py 2>&1 | tee "$OUT/gpu_tests.txt"
echo "== gpu tests took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
# codecPrecision: speed and agreement with float32 per precision (issue #25); CODEC=/models/codec.pth
# for the real codec's agreement (random weights say nothing about it)
timeout ${PRECISION_TIMEOUT:-150} python3 -P benchmarks/fill_jobs/bench_codec_precision.py run --device cuda \
  --codec ${CODEC:-s2-pro} --corpus seeds --clips 16 --clip-seconds 10 --layouts ncl --snakes unfused \
  --autotune off --out "$OUT/codec_precision.json" \
  2>&1 | tee "$OUT/codec_precision.txt"
timeout ${BENCH_TIMEOUT:-215} python3 benchmarks/fill_jobs/bench_fill_gpu.py run --seeds seeds --out /tmp/fillbench \
  --items ${ITEMS:-8000} --seconds ${SECONDS_PER_PHASE:-70,35} --codec-precision ${CODEC_PRECISION:-float32} \
  2>&1 | tee "$OUT/bench.txt"
cp /tmp/fillbench/fill_gpu.json "$OUT/" 2>/dev/null
echo "== all took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
ls -la "$OUT"
