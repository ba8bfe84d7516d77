#!/usr/bin/env bash
# Record a CPU run of `ttsfleet bench serve` against the embedded tiny model.
# Usage: benchmarks/inference_serve/run_cpu.sh [OUT_DIR]   (default: this folder/cpu-tiny)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/cpu-tiny}"
port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
ttsfleet serve --host 127.0.0.1 --port "$port" --checkpoint tiny --device cpu \
  --max-running-requests 64 --max-queue 256 --log-level warning &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.2
done
ttsfleet bench serve --url "http://127.0.0.1:$port" --concurrency 1,4,16,64 --requests 0 \
  --max-new-tokens 48 --out "$out"
