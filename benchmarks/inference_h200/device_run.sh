#!/usr/bin/env bash
# One call on the lent H200 for issue #9: GPU correctness gates, then the engine benchmark.
# Usage (from the repo root, through the device tool): benchmarks/inference_h200/device_run.sh STAGES...
# stages: tests (fused-kernel + S2 Pro FP8 gates + kernel GPU tests), fused (fused-kernel tests only),
# bench (ttsfleet bench engine, codes-only), bench_codec (with the S2-size codec in the loop).
# Env: LEVELS (default 1,2,4,8,16,32,64), CODEC_LEVELS (1,8,64), FRAMES (128), PROMPT (512).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
if [ -f .devcache/caches.tgz ]; then tar -xzf .devcache/caches.tgz -C /tmp && echo "caches restored"; fi
# ttsfleet is not installed there: link the component folders under ttsfleet/ (the pyproject mapping)
for c in operator inference kernels fill_jobs slurm; do [ -e "ttsfleet/$c" ] || ln -s "../$c" "ttsfleet/$c"; done
# the image lacks pydantic/fastapi: carried wheels (build/inference_whl, git-ignored)
if ls build/inference_whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index build/inference_whl/*.whl 2>&1 | tail -2
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/run.log"
PYTEST=(python3 -m pytest -q --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib)
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    tests) timeout 300 "${PYTEST[@]}" tests/inference_model/test_fused_decode.py \
             tests/inference_model/test_gpu_s2pro_gate.py tests/inference_model/test_decode_attention.py \
             tests/kernels/test_gpu.py -k "not sweep" 2>&1 | tee "$OUT/gpu_tests.txt" ;;
    prefill) timeout 200 python3 -m benchmarks.inference_h200.prefill_configs 2>&1 | tee "$OUT/prefill.txt" ;;
    fused) timeout 120 "${PYTEST[@]}" tests/inference_model/test_fused_decode.py 2>&1 | tee "$OUT/gpu_fused_tests.txt" ;;
    bench|bench_codec)  # decode path codes-only (bench), then with the codec in the loop (bench_codec)
      if [ "$stage" = bench ]; then codec=none; levels=${LEVELS:-1,2,4,8,16,32,64}; dir=engine_nocodec
      else codec=s2-pro; levels=${CODEC_LEVELS:-1,8,64}; dir=engine_codec; fi
      timeout 280 python3 -m ttsfleet.cli bench engine --checkpoint s2-pro --codec "$codec" \
        --concurrency "$levels" --frames "${FRAMES:-128}" --prompt-tokens "${PROMPT:-512}" \
        --out "$OUT/$dir" 2>&1 | tee "$OUT/$dir.txt" ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
done
# at most 8 files come back: pack each bench directory into one tarball
for d in "$OUT"/engine_*/; do [ -d "$d" ] && tar -czf "${d%/}.tgz" -C "$OUT" "$(basename "$d")" && rm -rf "$d"; done
[ "${KEEP_CACHES:-0}" = 1 ] && tar -czf "$OUT/caches.tgz" -C /tmp triton_cache 2>/dev/null
ls -la "$OUT"
