#!/usr/bin/env bash
# One call on the lent H200 (see benchmarks/kernels/README.md). Usage: device_run.sh STAGES...
# stages: smoke pytest check sweep bench. Everything lands in $OUT (and is printed).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
export TRITON_CACHE_DIR=/tmp/triton_cache
# compile caches travel between calls as one tarball (carry .devcache; see README)
if [ -f .devcache/caches.tgz ]; then tar -xzf .devcache/caches.tgz -C /tmp && echo "caches restored"; fi
# ttsfleet is not installed there: in this throwaway copy, link ttsfleet/kernels -> kernels/
[ -e ttsfleet/kernels ] || ln -s ../kernels ttsfleet/kernels
# python -c, -m and -m pytest put the repo root (cwd) on sys.path; PYTHONPATH would shadow stdlib operator
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/run.log"
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    smoke) timeout 60 python3 -c "from ttsfleet.kernels.check import run_checks, format_table as f; print(f(run_checks('cuda', quick=True)))" 2>&1 | tee "$OUT/smoke.txt" ;;
    pytest) timeout 150 python3 -m pytest tests/kernels -q --maxfail=15 --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib 2>&1 | tee "$OUT/gpu_pytest.txt" ;;
    quick) timeout 120 python3 -m pytest tests/kernels/test_gpu.py -q --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib -k "public or battery or graph or prequant or strides" 2>&1 | tee "$OUT/gpu_pytest_tuned.txt" ;;
    check) timeout 120 python3 -c "from ttsfleet.kernels.check import run_checks, format_table as f; print(f(run_checks('cuda')))" 2>&1 | tee "$OUT/check.txt" ;;
    sweep) timeout 200 python3 -m ttsfleet.kernels.bench --sweep-only --out "$OUT" 2>&1 | tee "$OUT/sweep.txt"; cp "$OUT/tuned_h200.json" kernels/tuned_h200.json ;;
    bench) timeout 230 python3 -m ttsfleet.kernels.bench --out "$OUT" 2>&1 | tee "$OUT/bench.txt" ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
done
# at most 8 files come back: keep the compile caches only when asked (KEEP_CACHES=1)
[ "${KEEP_CACHES:-0}" = 1 ] && tar -czf "$OUT/caches.tgz" -C /tmp triton_cache inductor 2>/dev/null
rm -f "$OUT/bench_partial.json"; ls -la "$OUT"
