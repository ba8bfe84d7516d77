#!/usr/bin/env bash
# One call on the lent H200 (see benchmarks/kernels/README.md). Usage: device_run.sh STAGES...
# stages: smoke quick pytest gates check sweep bench step. Everything lands in $OUT (and is printed).
# Env: SWEEP_MS (M values swept, default 1,64; other buckets take the nearest), BENCH_MS (1,8,32,64),
# BENCH_FLAGS (e.g. --no-compiled), STEP_BATCHES (1,8,32,64), KEEP_CACHES=1 (tar the Triton cache).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
export TRITON_CACHE_DIR=/tmp/triton_cache
# compile caches travel between calls as one tarball (carry .devcache; see README)
if [ -f .devcache/caches.tgz ]; then tar -xzf .devcache/caches.tgz -C /tmp && echo "caches restored"; fi
# ttsfleet is not installed there: in this throwaway copy, link the component folders under ttsfleet/
for c in operator inference kernels fill_jobs slurm; do [ -e "ttsfleet/$c" ] || ln -s "../$c" "ttsfleet/$c"; done
# wheels the image lacks (pydantic, ...): WHEELS=dir of py3.12 wheels
if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site
fi
# python -c, -m and -m pytest put the repo root (cwd) on sys.path
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/run.log"
PYTEST=(python3 -m pytest -q --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib)
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    smoke) timeout 60 python3 -c "from ttsfleet.kernels.check import run_checks, format_table as f; print(f(run_checks('cuda', quick=True)))" 2>&1 | tee -a "$OUT/run.log" ;;
    quick) timeout 120 "${PYTEST[@]}" --maxfail=10 tests/kernels/test_gpu.py -k "configs or public or swiglu_fused or graph" 2>&1 | tee -a "$OUT/run.log" ;;
    pytest) timeout 200 "${PYTEST[@]}" --maxfail=15 tests/kernels 2>&1 | tee -a "$OUT/run.log" ;;
    gates) timeout ${GATES_TIMEOUT:-240} "${PYTEST[@]}" ${GATE_TESTS:-tests/inference_model/test_gpu_s2pro_gate.py \
             tests/inference_model/test_fused_decode.py tests/inference_model/test_decode_attention.py \
             tests/kernels/test_gpu.py} 2>&1 | tee -a "$OUT/run.log" ;;
    check) timeout 120 python3 -c "from ttsfleet.kernels.check import run_checks, format_table as f; print(f(run_checks('cuda')))" 2>&1 | tee -a "$OUT/run.log" ;;
    sweep) timeout ${SWEEP_TIMEOUT:-200} python3 -m ttsfleet.kernels.bench --sweep-only --ms 1,8,16,32,64,128 --sweep-ms "${SWEEP_MS:-1,64}" --out "$OUT" 2>&1 | tee -a "$OUT/run.log"
           cp "$OUT/tuned_h200.json" kernels/tuned_h200.json ;;
    bench) timeout ${BENCH_TIMEOUT:-240} python3 -m ttsfleet.kernels.bench --ms "${BENCH_MS:-1,8,32,64}" ${BENCH_FLAGS:-} --out "$OUT" 2>&1 | tee -a "$OUT/run.log" ;;
    step) timeout ${STEP_TIMEOUT:-200} python3 -m benchmarks.inference_h200.step_bench 2>&1 | tee -a "$OUT/run.log" ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
done
# at most 8 files come back: keep the compile caches only when asked (KEEP_CACHES=1)
[ "${KEEP_CACHES:-0}" = 1 ] && tar -czf "$OUT/caches.tgz" -C /tmp triton_cache inductor 2>/dev/null
rm -f "$OUT"/*.md "$OUT"/*.png; ls -la "$OUT"  # md/png: regenerate from the JSON
