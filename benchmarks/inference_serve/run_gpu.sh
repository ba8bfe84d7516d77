#!/usr/bin/env bash
# GPU smoke + bench of `ttsfleet serve` (tiny model on CUDA: bf16, padded CUDA-graph batch buckets,
# codec on the GPU). Usage: benchmarks/inference_serve/run_gpu.sh OUT_DIR
set -uo pipefail
out="${1:?OUT_DIR}"
mkdir -p "$out"
py="${PYTHON:-python3}"
nvidia-smi -L > "$out/gpu.txt" 2>&1
$py -m ttsfleet.cli serve --host 127.0.0.1 --port 8000 --checkpoint tiny --device cuda \
  --max-running-requests 64 --max-queue 256 --log-level warning > "$out/server.log" 2>&1 &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"' EXIT
for _ in $(seq 1 600); do curl -sf http://127.0.0.1:8000/readyz >/dev/null && break; sleep 0.2; done
curl -s http://127.0.0.1:8000/readyz
curl -s -X POST http://127.0.0.1:8000/v1/tts -H 'content-type: application/json' \
  -d '{"text":"GPU smoke test.","format":"wav","max_new_tokens":64,"seed":1}' -o "$out/smoke.wav"
$py -c "import soundfile as sf,sys; x,sr=sf.read(sys.argv[1]); print('smoke.wav', x.shape, sr)" "$out/smoke.wav"
$py -m ttsfleet.cli bench serve --url http://127.0.0.1:8000 --concurrency "${CONCURRENCY:-1,4,16,64}" \
  --max-new-tokens "${MAX_NEW_TOKENS:-96}" \
  --out "$out"
curl -s http://127.0.0.1:8000/metrics > "$out/metrics.txt"
kill -TERM "$pid"; wait "$pid"; echo "server exit code $?"
trap - EXIT
