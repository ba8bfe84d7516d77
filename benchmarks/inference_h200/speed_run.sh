#!/usr/bin/env bash
# Device calls for issue #25 (2026-12-01, session 3): GPU tests of the new paths, the prefill GEMM
# split, the bf16 + graphs codec, and the served path at c=1 / 64 / 128 with NVML busy sampled.
# Usage (repo root on the device, carry .whl): benchmarks/inference_h200/speed_run.sh STAGES...
# stages: quicktests, tests, prefill, codec, serve. Env: SERVE_ARGS (extra `ttsfleet serve` flags),
# LEVELS ("1:8 64:640 128:1280" = concurrency:requests), FRAMES (128).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
# no PYTHONSAFEPATH, no repo root on PYTHONPATH: `python3 -m` from the root imports ttsfleet (the
# stdlib operator module is loaded by site before the root joins sys.path)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
for c in operator inference kernels fill_jobs slurm devtools; do [ -e "ttsfleet/$c" ] || ln -s "../$c" "ttsfleet/$c"; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/run.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/run.log"
PYTEST=(python3 -m pytest -q --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib)
FRAMES=${FRAMES:-128}
serve_level() {  # serve_level PORT C REQUESTS
  local port=$1 c=$2 n=$3
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$OUT/nvml_c$c.txt" &
  local npid=$!
  timeout 240 python3 -m ttsfleet.cli bench serve --url "http://127.0.0.1:$port" --concurrency "$c" \
    --requests "$n" --max-new-tokens "$FRAMES" --frames-spread 0.5 --text "$TEXT" --out "$OUT/served_c$c" \
    > "$OUT/served_c$c.txt" 2>&1
  kill $npid
  tail -6 "$OUT/served_c$c.txt"
  python3 -c "import sys,statistics as s; v=[float(x) for x in open(sys.argv[1]) if x.strip()]; \
v=v[len(v)//10:len(v)-len(v)//10] or v; print(f'c=$c NVML busy (middle 80% of the run): mean {s.mean(v):.1f}% p10 {sorted(v)[len(v)//10]:.0f}% n={len(v)}')" \
    "$OUT/nvml_c$c.txt" | tee -a "$OUT/run.log"
}
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    quicktests) timeout 200 "${PYTEST[@]}" tests/kernels/test_prefill_gemm.py tests/kernels/test_snake.py \
                  tests/inference_model/test_codec.py -k "not golden" 2>&1 | tee "$OUT/gpu_quicktests.txt" | tail -15 ;;
    tests) timeout 300 "${PYTEST[@]}" tests/inference_model/test_fused_decode.py tests/inference_model/test_gpu_s2pro_gate.py \
             tests/inference_model/test_chunked_prefill.py tests/inference_server/test_engine.py \
             tests/kernels/test_gpu.py -k "not sweep" 2>&1 | tee "$OUT/gpu_tests.txt" | tail -15 ;;
    prefill) timeout 200 python3 -m benchmarks.inference_h200.prefill_dispatch "$OUT/prefill_dispatch.json" 2>&1 \
               | tee "$OUT/prefill_dispatch.txt" | tail -60 ;;
    codec) timeout 200 python3 -m benchmarks.inference_h200.codec_speed "$OUT/codec_speed.json" 2>&1 \
             | tee "$OUT/codec_speed.txt" | tail -30 ;;
    serve)
      port=18123
      python3 -m ttsfleet.cli serve --host 127.0.0.1 --port $port --checkpoint s2-pro --device cuda \
        --gpu-class h200 --max-queue 2048 --max-new-tokens "$FRAMES" --prefill-chunk-tokens 512 \
        --log-level info ${SERVE_ARGS:-} > "$OUT/server.log" 2>&1 &
      pid=$!
      for _ in $(seq 1 1500); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
        kill -0 $pid 2>/dev/null || { tail -30 "$OUT/server.log"; break; }; sleep 0.2; done
      echo "server ready after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
      grep -E "captured|warm-up" "$OUT/server.log" | tee -a "$OUT/run.log"
      TEXT=$(python3 -c 'print(("The quick brown fox jumps over the lazy dog, " * 7)[:290])')
      for lv in ${LEVELS:-1:8 64:640 128:1280}; do serve_level $port "${lv%%:*}" "${lv##*:}"; done
      curl -s "http://127.0.0.1:$port/metrics" > "$OUT/metrics.txt"
      kill -TERM $pid; wait $pid; echo "server exit $?" ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
done
cd "$OUT" && dirs=$(ls -d */ 2>/dev/null) && [ -n "$dirs" ] && tar -czf served.tgz $dirs && rm -rf $dirs
cd "$OUT" && ls nvml_*.txt >/dev/null 2>&1 && tar -czf nvml.tgz nvml_*.txt && rm -f nvml_*.txt
ls -la "$OUT"
