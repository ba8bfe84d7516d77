#!/usr/bin/env bash
# Device probe (2026-12-01 session 3; as run, from the repo root with the carried .whl): codec kernel profile, then the served path at steady c=64 with
# py-spy sampling the server's threads and NVML busy sampled, to see what the host path waits on.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
# no PYTHONSAFEPATH and no repo root on PYTHONPATH: `python3 -m` from the root imports ttsfleet, and the
# stdlib operator is already loaded by site before the root joins sys.path
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
for c in operator inference kernels fill_jobs slurm; do [ -e "ttsfleet/$c" ] || ln -s "../$c" "ttsfleet/$c"; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/run.log"
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    codec) timeout 150 python3 -m benchmarks.inference_h200.codec_profile "$OUT" 2>&1 | tee "$OUT/codec.txt" | tail -60 ;;
    serve)
      port=18123
      python3 -m ttsfleet.cli serve --host 127.0.0.1 --port $port --checkpoint s2-pro --device cuda \
        --max-running-requests 64 --max-queue 1024 --max-new-tokens 128 --prefill-chunk-tokens 512 \
        --log-level warning > "$OUT/server.log" 2>&1 &
      pid=$!
      for _ in $(seq 1 900); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; kill -0 $pid 2>/dev/null || { tail -30 "$OUT/server.log"; break; }; sleep 0.2; done
      echo "server ready after $(( $(date +%s) - t0 )) s"
      text=$(python3 -c 'print(("The quick brown fox jumps over the lazy dog, " * 7)[:290])')
      (timeout 150 python3 -m ttsfleet.cli bench serve --url "http://127.0.0.1:$port" --concurrency 64 \
        --requests 640 --max-new-tokens 128 --frames-spread 0.5 --text "$text" --out "$OUT/served" > "$OUT/served.txt" 2>&1) &
      bpid=$!
      sleep 25
      nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$OUT/nvml.txt" &
      npid=$!
      timeout 40 py-spy record -p $pid -d 20 -r 200 --threads --format raw -o "$OUT/pyspy_raw.txt" > /dev/null 2>&1
      timeout 20 py-spy dump -p $pid > "$OUT/pyspy_dump.txt" 2>&1
      top -b -n 1 -H -p $pid | head -30 > "$OUT/top.txt"
      kill $npid
      wait $bpid; tail -25 "$OUT/served.txt"
      kill -TERM $pid; wait $pid
      python3 - "$OUT/nvml.txt" <<'PY'
import sys, statistics as s
v=[float(x) for x in open(sys.argv[1]) if x.strip()]
print(f"NVML busy during py-spy window: mean {s.mean(v):.1f} % p10 {sorted(v)[len(v)//10]:.0f} n={len(v)}")
PY
      ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 )) s"
done
cd "$OUT" && [ -d served ] && tar -czf served.tgz served && rm -rf served
ls -la "$OUT"
