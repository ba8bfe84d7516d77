#!/usr/bin/env bash
# One device call for issue #14: GPU checks of batched prefill / codec / graphs, the codes-only engine
# bench (repeated levels + step breakdown), the engine with the S2-size codec, and the served path
# (`ttsfleet serve --checkpoint s2-pro` over real HTTP, streaming pcm), all from one run.
# Usage (from the repo root on the device): benchmarks/inference_h200/served_run.sh STAGES...
# stages: tests, codecpush (batched codec ms per push, eager vs graphs), engine (codes-only), codec
# (engine + codec), serve (HTTP), gate (re-run + planted 10 %).
# Env: LEVELS (1,8,64), REPEATS (3), SERVE_LEVELS (1,16,64), FRAMES (128), PROMPT (512), SPREAD (0.5:
# request lengths FRAMES x (1 +- 0.5)), GATE (set: the engine stage also runs the in-process gate passes),
# WHL (../../.whl).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
WHL=${WHL:-../../.whl}
if ls "$WHL"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHL"/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# ttsfleet is not installed there: link the component folders under ttsfleet/ (the pyproject mapping)
for c in operator inference kernels fill_jobs slurm; do [ -e "ttsfleet/$c" ] || ln -s "../$c" "ttsfleet/$c"; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/run.log"
PYTEST=(python3 -m pytest -q --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib)
LEVELS=${LEVELS:-1,8,64}; REPEATS=${REPEATS:-3}; FRAMES=${FRAMES:-128}; PROMPT=${PROMPT:-512}
engine() {  # engine DIR EXTRA_ARGS...
  local dir=$1; shift
  timeout 200 python3 -m ttsfleet.cli bench engine --checkpoint s2-pro --frames "$FRAMES" \
    --prompt-tokens "$PROMPT" --out "$OUT/$dir" "$@" 2>&1 | tee "$OUT/$dir.txt"
}
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    tests) timeout 150 "${PYTEST[@]}" tests/inference_model/test_chunked_prefill.py \
             tests/inference_server/test_engine.py tests/inference_model/test_codec.py -k "not golden" \
             2>&1 | tee "$OUT/gpu_tests.txt" ;;
    codecpush) timeout 120 python3 -m benchmarks.inference_h200.codec_push "$OUT/codec_push.json" 2>&1 \
                 | tee "$OUT/codec_push.txt" ;;
    engine) engine engine_nocodec --codec none --concurrency "$LEVELS" --repeats "$REPEATS" \
              --frames-spread "${SPREAD:-0.5}" ${GATE:+--gate} ;;
    codec) engine engine_codec --codec s2-pro --concurrency "${CODEC_LEVELS:-1,64}" --no-breakdown ;;
    gate)  # a re-run of the same commit, then the same with a planted 10 % slowdown, each checked
      engine gate_rerun --codec none --concurrency "$LEVELS" --repeats "$REPEATS" --no-breakdown
      engine gate_planted --codec none --concurrency "$LEVELS" --repeats "$REPEATS" --no-breakdown \
        --plant-slowdown 0.10
      for r in gate_rerun gate_planted; do
        python3 -m ttsfleet.cli bench check "$OUT/engine_nocodec/bench.json" "$OUT/$r/bench.json"
        echo "gate $r exit $?"
      done 2>&1 | tee "$OUT/gate.txt" ;;
    serve)
      port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
      python3 -m ttsfleet.cli serve --host 127.0.0.1 --port "$port" --checkpoint s2-pro --device cuda \
        --max-running-requests 64 --max-queue 512 --max-new-tokens "$FRAMES" --prefill-chunk-tokens 512 \
        --log-level warning > "$OUT/server.log" 2>&1 &
      pid=$!
      for _ in $(seq 1 900); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
      echo "server ready after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
      text=$(python3 -c 'print(("The quick brown fox jumps over the lazy dog, " * 7)[:290])')
      timeout 200 python3 -m ttsfleet.cli bench serve --url "http://127.0.0.1:$port" \
        --concurrency "${SERVE_LEVELS:-1,16,64}" --repeats "${SERVE_REPEATS:-1}" --max-new-tokens "$FRAMES" \
        --frames-spread "${SPREAD:-0.5}" \
        --text "$text" --out "$OUT/served" 2>&1 | tee "$OUT/served.txt"
      curl -s "http://127.0.0.1:$port/metrics" > "$OUT/served/metrics.txt"
      kill -TERM "$pid"; wait "$pid"; echo "server exit $?" ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
done
# at most 8 files come back: pack the result directories into one tarball
cd "$OUT" && dirs=$(ls -d */ 2>/dev/null) && [ -n "$dirs" ] && tar -czf results.tgz $dirs && rm -rf $dirs
ls -la "$OUT"
