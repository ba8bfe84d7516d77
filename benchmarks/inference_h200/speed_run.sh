#!/usr/bin/env bash
# Device calls for issue #25 (2026-12-01, session 3): GPU tests of the new paths, the prefill GEMM
# split, the bf16 + graphs codec, and the served path at c=1 / 64 / 128 with NVML busy sampled.
# Usage (repo root on the device, carry .whl): benchmarks/inference_h200/speed_run.sh STAGES...
# encode: `OUT=... speed_run.sh encode` (bench_codec_precision.py, the fill job's codec encode, s2-pro random weights:
# {float32,tf32,bf16} x {ncl,channels-last} x Snake {unfused,fused}, audio-s/s + codes' agreement with
# float32 NCL; ENC_PRECISIONS, ENC_LAYOUTS, ENC_SNAKES, ENC_GRAPHS (off | on | off,on), ENC_AUTOTUNE (auto | on | off | auto,off),
# ENC_CLIPS, ENC_CLIP_S, ENC_REPEATS, ENC_CODEC, ENC_CORPUS, ENC_TIMEOUT (200)).
# stages: step (step_bench.py: STEP_BATCHES, STEP_PROFILE), quicktests (QUICKTESTS: other test files), tests (`TTSFLEET_GEMM_PREFETCH=auto TTSFLEET_ATTN_PREFETCH=auto
# TTSFLEET_ROPE_ATTENTION=fused TTSFLEET_HEAD_GEMM=bf16 speed_run.sh tests`: the same set, the S2 Pro gate
# included, with the levers on), gate (GATE_K: pytest -k), levers (decode_levers.py: cuBLAS decode rows,
# top-k kernel, FP8 KV side by side), onelaunch (one_launch.py: the MLP and the fast attention half in one launch
# vs their launches: ONE_MS, ONE_EXTRA_MS, ONE_ROUNDS, ONE_PARTS; ~25 kernel compiles, ONE_TIMEOUT 420), gemmproto (gemm_proto.py), engineab (bench engine c=64, eager
# prefill vs graphs: ENGINE_LEVELS; enginespy: bench engine with the codec under py-spy; ENGINE_SIDES="b:--prefill-graphs" runs one side; ENGINE_CODEC=s2-pro puts the serving codec in the loop), benchgate (bench engine --gate: GATE_LEVELS,
# GATE_PER_CLIENT, GATE_CODEC), prefill, prefillhost, prefillgraphs, codec, sweep (the decode GEMM configs re-swept, then the step on the new table beside the old; SWEEP_MS), codecstages (codec_stages.py: a push stage by stage vs each stage's floor; CS_ARGS), codecunits (codec_units.py: one residual unit per decoder width, cuDNN vs the fused Triton convs and tiles; CU_ARGS), codectiles (codec_tiles.py: the fused convs' tiles swept per shape, the tuned table; CT_ARGS, CT_BUDGET), encodestages (encode_stages.py: the fill job's encode stage by stage, fused units vs cuDNN's; ES_ARGS), codeclayout (codec_layout.py: NCL vs channels-last pushes; CL_ARGS adds its flags), codeccapture (codec_capture.py: start-up graph capture per cuDNN setting; CAP_CONFIGS, CAP_BUDGET), codeccompile (CC_ARGS), cacheout (the Triton / Inductor caches packed for the next call: KCACHE_OUT), live (real-time mode on/off side by side: LIVE_C, LIVE_SESSIONS, LIVE_ROUNDS, LIVE_PROCS (client processes); needs the fish-audio-sdk wheels and the reference voice made here first, the device has no espeak-ng: `python3 -P benchmarks/inference_serve/live_prefix.py x --reference-wav benchmarks/inference_serve/live_ref.wav --write-reference`, untracked, travels with the tree), serve, ab. Env: SERVE_ARGS (extra `ttsfleet serve` flags;
# ab: SERVE_ARGS_A / SERVE_ARGS_B alternated AB_ROUNDS times in one call),
# deepgemm (DeepGEMM built from the carried .ext/deepgemm.tgz, beside our decode GEMMs: deepgemm_gemm.py),
# deepgemmbuild (the build alone, skipped where this machine built it already: DG_REBUILD=1 builds again),
# serve runs with --gpu-class h200, whose catalog default since 2026-12-03d is the codec process under
# MPS (the server starts the daemon itself; `--no-codec-process` in SERVE_ARGS is the codec thread),
# SERVE_ARGS="--preset-text qwen-bpe": prompts at S2 Pro's real length (Qwen's BPE: the 290-character
# text 85 tokens instead of 355 as bytes; needs the dashscope wheel device_wheels.sh fetches),
# LEVELS ("1:8 64:640 128:1280" = concurrency:requests), FRAMES (128), READY_S (300: how long a server may
# take to start, e.g. longer with --codec-compile), PYSPY_AT (a concurrency:
# py-spy samples the server's threads during that level).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Triton's and Inductor's caches in one folder, so a call can hand them to the next (a compile paid once
# per cache, as `serving.kernelCache` gives pods): KERNEL_CACHE_IN (default .kcache/kernel_cache.tgz, an
# ignored path the call carries; or its parts, KERNEL_CACHE_IN.part00, .part01, ... as `cacheout` cuts
# them) is unpacked here first; the `cacheout` stage packs it again
KCACHE=/tmp/kcache; mkdir -p "$KCACHE"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$KCACHE/triton TORCHINDUCTOR_CACHE_DIR=$KCACHE/inductor
KCACHE_IN=${KERNEL_CACHE_IN:-.kcache/kernel_cache.tgz}
if [ -f "$KCACHE_IN" ] || [ -f "$KCACHE_IN.part00" ]; then
  { if [ -f "$KCACHE_IN" ]; then cat "$KCACHE_IN"; else cat "$KCACHE_IN".part*; fi; } | tar -xz -C "$KCACHE" \
    && echo "kernel cache in: $(du -sh "$KCACHE" | cut -f1), $(find "$KCACHE" -type f | wc -l) files" | tee -a "$OUT/run.log"
fi
# no PYTHONSAFEPATH, no repo root on PYTHONPATH: `python3 -m` from the root imports ttsfleet (the
# stdlib operator module is loaded by site before the root joins sys.path)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
# DeepGEMM (`deepgemm` builds it): its build and JIT find the toolkit of the nvcc on PATH and cache their
# kernels with Triton's; once built by an earlier stage of this call, every later stage imports it
# (TTSFLEET_DECODE_GEMM=deepgemm, its GPU test)
# NVCC, not NVRTC: DeepGEMM's headers include <utility>, which NVRTC 13.0 cannot open (its README: NVRTC
# "will be supported later"); NVCC 13.0 compiled its sm_90a FP8 GEMM here in 1.8 s (2026-12-07, CPU)
export DG_JIT_CACHE_DIR=$KCACHE/deep_gemm DG_JIT_USE_NVRTC=${DG_JIT_USE_NVRTC:-0}
command -v nvcc > /dev/null && export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
DGDIR=/tmp/dgsrc
ls "$DGDIR"/DeepGEMM/deep_gemm/_C*.so > /dev/null 2>&1 && export PYTHONPATH=$DGDIR/DeepGEMM:$PYTHONPATH
for c in operator inference kernels fill_jobs slurm devtools; do [ -e "ttsfleet/$c" ] || ln -s "../$c" "ttsfleet/$c"; done
ln -sfn "$PWD/ttsfleet" /tmp/site/ttsfleet  # `python3 -P -m ttsfleet.cli` (the tests' subprocesses) too
# preflight: every module the served path imports, and one WAV through soundfile, before any GPU time
# is spent on servers that would fail every request (2026-12-04: a missing cffi did just that)
python3 -P -c "import io, numpy, soundfile, soxr, fastapi, uvicorn, uvloop, httptools, pydantic, websockets, \
ttsfleet.inference.server; \
soundfile.write(io.BytesIO(), numpy.zeros(480, 'float32'), 24000, format='WAV')" \
  || { echo "preflight failed: the carried .whl lacks a module (benchmarks/inference_h200/device_wheels.sh)"; exit 3; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/run.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/run.log"
PYTEST=(python3 -m pytest -q --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib)
PYTEST_V=(python3 -m pytest -v -rfE --tb=short -p no:cacheprovider -o addopts="" --import-mode=importlib)
FRAMES=${FRAMES:-128}
serve_level() {  # serve_level PORT C REQUESTS DIR
  local port=$1 c=$2 n=$3 dir=$4
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$dir/nvml_c$c.txt" &
  local npid=$! spid=""
  if [ "${PYSPY_AT:-}" = "$c" ]; then  # py-spy every thread of the server, 20 s from 15 s into the level
    (sleep 15; timeout 40 py-spy record -p "$SERVER_PID" -d 20 -r 200 --threads --format raw \
       -o "$dir/pyspy_c$c.txt" > /dev/null 2>&1; echo "py-spy rc $?" >> "$dir/pyspy_c$c.log") & spid=$!
  fi
  timeout 240 python3 -m ttsfleet.cli bench serve --url "http://127.0.0.1:$port" --concurrency "$c" \
    --requests "$n" --max-new-tokens "$FRAMES" --frames-spread 0.5 --text "$TEXT" --out "$dir/served_c$c" \
    > "$dir/served_c$c.txt" 2>&1
  kill $npid; [ -n "$spid" ] && wait "$spid"
  tail -6 "$dir/served_c$c.txt" | grep -E "│|┃" | tee -a "$OUT/run.log"
  [ -f "$dir/pyspy_c$c.txt" ] && python3 benchmarks/inference_h200/pyspy_summary.py "$dir/pyspy_c$c.txt" 0.05 \
    > "$dir/pyspy_c$c.summary.txt" 2>&1
  python3 -c "import sys,statistics as s; v=[float(x) for x in open(sys.argv[1]) if x.strip()]; \
v=v[len(v)//10:len(v)-len(v)//10] or v; print(f'$dir c=$c NVML busy (middle 80% of the run): mean {s.mean(v):.1f}% p10 {sorted(v)[len(v)//10]:.0f}% n={len(v)}')" \
    "$dir/nvml_c$c.txt" | tee -a "$OUT/run.log"
}
live_pyspy() {  # live_pyspy DIR: the first live server's threads under py-spy once sessions run
  local pid  # (its log is at warning level: the voice stored in refs-*/ marks the round's start)
  for _ in $(seq 1 1600); do compgen -G "$1/refs-*/*.json" > /dev/null && break; sleep 0.25; done
  sleep 8; pid=$(pgrep -f "ttsfleet.cli serve" | head -1)
  [ -n "$pid" ] || { echo "live py-spy: no server" >> "$OUT/run.log"; return; }
  timeout 40 py-spy record -p "$pid" -d 20 -r 100 --idle --threads --format raw -o "$OUT/livespy_raw.txt" \
    > /dev/null 2>&1; echo "live py-spy rc $?" >> "$OUT/run.log"
  python3 benchmarks/inference_h200/pyspy_summary.py "$OUT/livespy_raw.txt" 0.03 > "$OUT/livespy_summary.txt" 2>&1
  gzip -f "$OUT/livespy_raw.txt"
}
stop_servers() {  # a live stage cut by its timeout leaves its server behind: stop it before the next
  # stage starts one (2026-12-04: the next side's server started beside a stopping one, ~2x slower)
  pkill -TERM -f "[t]tsfleet.cli serve" || return 0
  for _ in $(seq 1 60); do pgrep -f "[t]tsfleet.cli serve" > /dev/null || return 0; sleep 0.5; done
  pkill -KILL -f "[t]tsfleet.cli serve"; sleep 1
}
build_deepgemm() {  # DeepGEMM from the carried .ext/deepgemm.tgz (deepgemm_bundle.sh: its sources, the
  # CUTLASS / {fmt} commits it pins, the wheel + ninja wheels), built once per machine: a warm machine keeps
  # /tmp/dgsrc between calls (DG_REBUILD=1 builds again); DG_BUILD_TIMEOUT caps the build (one C++ file).
  # With the system's g++ (DG_CXX): built by the device's default /opt/gcc/bin/g++ (a wrapper over g++ 13.3
  # with its own -B paths) every JIT call segfaulted in the std::regex of DeepGEMM's include parser
  # (2026-12-07d, an H100, a SIGSEGV handler's backtrace); /usr/bin/g++ built one that ran fp8_gemm_nt
  if [ -z "${DG_REBUILD:-}" ] && ls "$DGDIR"/DeepGEMM/deep_gemm/_C*.so > /dev/null 2>&1; then
    echo "deepgemm already built in $DGDIR" | tee -a "$OUT/run.log"; return 0; fi
  rm -rf "$DGDIR"; mkdir -p "$DGDIR"
  tar -xzf "${DEEPGEMM_TGZ:-.ext/deepgemm.tgz}" -C "$DGDIR" || { echo "no ${DEEPGEMM_TGZ:-.ext/deepgemm.tgz}"; exit 3; }
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$DGDIR"/wheels/wheel-*.whl \
    "$DGDIR"/wheels/ninja-*.whl 2>&1 | tail -2
  echo "CUDA_HOME=${CUDA_HOME:-unset}; $(nvcc --version 2>&1 | tail -1)" | tee -a "$OUT/run.log"
  (cd "$DGDIR/DeepGEMM" && ln -sfn "$PWD/third-party/cutlass/include/cutlass" deep_gemm/include/cutlass \
    && ln -sfn "$PWD/third-party/cutlass/include/cute" deep_gemm/include/cute \
    && CXX=${DG_CXX:-/usr/bin/g++} CC=${DG_CC:-/usr/bin/gcc} MAX_JOBS=16 timeout "${DG_BUILD_TIMEOUT:-300}" \
       python3 setup.py build > "$OUT/deepgemm_build.log" 2>&1
   echo "deepgemm build rc $? at $(date +%T)"
   so=$(find build -name "_C*.so" | head -1); [ -n "$so" ] && ln -sf "$PWD/$so" deep_gemm/) | tee -a "$OUT/run.log"
  tail -5 "$OUT/deepgemm_build.log"
}
serve_config() {  # serve_config DIR "SERVE FLAGS": start a server, run every level, stop it; words of the
  # form TTSFLEET_*=value among the flags go to the server's environment instead (a process switch per side)
  local dir=$1 flags="" envs=() port=18123 t0 word; t0=$(date +%s)
  for word in $2; do if [[ $word == TTSFLEET_*=* ]]; then envs+=("$word"); else flags="$flags $word"; fi; done
  mkdir -p "$dir"
  # shellcheck disable=SC2086  # the flags are a word list
  env "${envs[@]}" python3 -m ttsfleet.cli serve --host 127.0.0.1 --port $port --checkpoint s2-pro --device cuda \
    --gpu-class h200 --max-queue 2048 --max-new-tokens "$FRAMES" --prefill-chunk-tokens 512 \
    --log-level info $flags > "$dir/server.log" 2>&1 &
  local pid=$! ready=0; SERVER_PID=$pid
  for _ in $(seq 1 $(( ${READY_S:-300} * 5 ))); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && { ready=1; break; }
    kill -0 $pid 2>/dev/null || break; sleep 0.2; done
  [ $ready = 1 ] || { echo "$dir: server not ready"; tail -30 "$dir/server.log"; kill -9 $pid; return 1; }
  echo "$dir [${envs[*]}$flags]: server ready after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
  grep -E "captured|warm-up|graph capture failed|stream of their own" "$dir/server.log" | tee -a "$OUT/run.log"
  TEXT=$(python3 -c 'print(("The quick brown fox jumps over the lazy dog, " * 7)[:290])')
  for lv in ${LEVELS:-1:8 64:640 128:1280}; do serve_level $port "${lv%%:*}" "${lv##*:}" "$dir"; done
  curl -s "http://127.0.0.1:$port/metrics" > "$dir/metrics.txt"
  kill -TERM $pid; wait $pid; echo "server exit $?"
}
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    quicktests) # QUICKTESTS: other test files (the default set took 200 s on 2026-12-04, the Inductor test 64 s of it)
                # shellcheck disable=SC2086  # a word list of paths
                timeout "${QT_TIMEOUT:-300}" "${PYTEST[@]}" ${QUICKTESTS:-tests/inference_server/test_mps.py \
                  tests/kernels/test_prefill_gemm.py tests/kernels/test_snake.py tests/inference_model/test_codec.py \
                  tests/inference_model/test_codec_compile.py tests/inference_model/test_codec_encoder_layout.py} -k "not golden" 2>&1 | tee "$OUT/gpu_quicktests.txt" | tail -15 ;;
    tests) # -v -rfE: a name and result per line as each test ends, so a run cut by the timeout still says which
           # failed (2026-12-05: -q dots cut before the summary left one failure to be found by its position)
           # shellcheck disable=SC2086  # TESTS: a word list of paths (default: the GPU set below)
           timeout "${TESTS_TIMEOUT:-300}" "${PYTEST_V[@]}" ${TESTS:-tests/inference_model/test_fused_decode.py \
             tests/inference_model/test_gpu_s2pro_gate.py tests/inference_model/test_chunked_prefill.py \
             tests/inference_server/test_engine.py tests/inference_model/test_prefill_graphs.py tests/kernels/test_gpu.py \
             tests/kernels/test_attention_split.py tests/kernels/test_prefetch.py tests/kernels/test_rope_attention.py \
             tests/inference_model/test_head_gemm.py tests/kernels/test_mlp_one_launch.py tests/kernels/test_attention_block.py \
             tests/inference_server/test_engine_gpu_spans.py tests/inference_model/test_prompt_gqa.py \
             tests/inference_server/test_prefill_stream.py tests/kernels/test_workspaces.py \
             tests/inference_model/test_mixed_step.py tests/inference_server/test_mixed_steps_engine.py \
             tests/inference_model/test_no_host_sync.py} \
             -k "not sweep" 2>&1 | tee "$OUT/gpu_tests.txt" | tail -15 ;;
    gate) timeout "${GATE_TIMEOUT:-300}" "${PYTEST[@]}" tests/inference_model/test_gpu_s2pro_gate.py -k "${GATE_K:-}" 2>&1 \
            | tee "$OUT/gpu_gate.txt" | tail -15 ;;
    prefillhost) timeout 200 python3 -m benchmarks.inference_h200.prefill_host "$OUT/prefill_host.json" 2>&1 \
                   | tee "$OUT/prefill_host.txt" | tail -45 ;;
    prefillgraphs) timeout 300 python3 -m benchmarks.inference_h200.prefill_graphs_bench "$OUT/prefill_graphs.json" 2>&1 \
                     | tee "$OUT/prefill_graphs.txt" | tail -40 ;;
    prefill) timeout 200 python3 -m benchmarks.inference_h200.prefill_dispatch "$OUT/prefill_dispatch.json" 2>&1 \
               | tee "$OUT/prefill_dispatch.txt" | tail -60 ;;
    cacheout) # the kernel caches packed for the next call, cut in 15 MiB parts (KCACHE_OUT.part00, ...;
              # KCACHE_OUT defaults to $OUT/kernel_cache.tgz): a file over 16 MiB does not come back from
              # the device, and the one piece of 2026-12-06c was 41 MiB
              tar -czf - -C "$KCACHE" . | split -b 15m -d - "${KCACHE_OUT:-$OUT/kernel_cache.tgz}.part" \
                && echo "kernel cache out: $(cat "${KCACHE_OUT:-$OUT/kernel_cache.tgz}".part* | wc -c) bytes packed" \
                  "in $(ls "${KCACHE_OUT:-$OUT/kernel_cache.tgz}".part* | wc -l) parts," \
                  "$(find "$KCACHE" -type f | wc -l) files" | tee -a "$OUT/run.log" ;;
    codeccompile) timeout "${CC_TIMEOUT:-480}" python3 -m benchmarks.inference_h200.codec_compile "$OUT/codec_compile.json" \
                    --profile ${CC_ARGS:-} 2>&1 | tee "$OUT/codec_compile.txt" | tail -30 ;;
    codeclayout) timeout "${CL_TIMEOUT:-150}" python3 -m benchmarks.inference_h200.codec_layout "$OUT/codec_layout.json" \
                   ${CL_ARGS:-} 2>&1 | tee "$OUT/codec_layout.txt" | tail -20 ;;
    codeccapture) timeout "${CAP_TIMEOUT:-540}" python3 -m benchmarks.inference_h200.codec_capture "$OUT/codec_capture.json" \
                    --budget-s "${CAP_BUDGET:-360}" ${CAP_CONFIGS:+--configs "$CAP_CONFIGS"} 2>&1 \
                    | tee "$OUT/codec_capture.txt" | tail -12 ;;
    encode) # the fill job's codec encode (issue #25: >= 1,000 audio-s per GPU-s), one row per configuration
            timeout "${ENC_TIMEOUT:-200}" python3 -P benchmarks/fill_jobs/bench_codec_precision.py run --device cuda \
              --codec "${ENC_CODEC:-s2-pro}" --corpus "${ENC_CORPUS:-synthetic}" --clips "${ENC_CLIPS:-16}" \
              --clip-seconds "${ENC_CLIP_S:-10}" --repeats "${ENC_REPEATS:-5}" \
              --precisions "${ENC_PRECISIONS:-float32,tf32,bf16}" --layouts "${ENC_LAYOUTS:-ncl,channels-last}" \
              --snakes "${ENC_SNAKES:-unfused,fused}" --autotune "${ENC_AUTOTUNE:-auto}" --graphs "${ENC_GRAPHS:-off}" \
              --out "$OUT/codec_encode.json" 2>&1 | tee "$OUT/codec_encode.txt" | tail -18 ;;
    codec) timeout 200 python3 -m benchmarks.inference_h200.codec_speed "$OUT/codec_speed.json" 2>&1 \
             | tee "$OUT/codec_speed.txt" | tail -30 ;;
    sweep) # re-sweep the decode GEMMs' launch configs (kernels/bench.py: each candidate checked, then timed from a
           # CUDA graph; SWEEP_MS, default every decode bucket its own), then the whole step on the new table
           # beside the shipped one (decode_levers table@FILE); copy $OUT/sweep/tuned_h200.json to kernels/ if it wins
           mkdir -p "$OUT/sweep"
           timeout "${SWEEP_TIMEOUT:-300}" python3 -m ttsfleet.kernels.bench --sweep-only --ms 1,8,16,32,64,128 \
             --sweep-ms "${SWEEP_MS:-1,8,16,32,64}" --out "$OUT/sweep" 2>&1 | tee "$OUT/sweep.txt" | grep -E "sweep|WRONG"
           # (the table's path first: a prefix assignment sees the OUT set before it on the same line)
           table="$OUT/sweep/tuned_h200.json"
           [ -f "$table" ] && OUT="$OUT/sweep" LEVER_ROUNDS="${LEVER_ROUNDS:-2}" \
             LEVER_VARIANTS="default,table@$table" timeout "${SWEEP_LEVER_TIMEOUT:-240}" \
             python3 -m benchmarks.inference_h200.decode_levers 2>&1 | tee "$OUT/sweep_levers.txt" | tail -12 ;;
    codecunits) # one residual unit per S2 decoder width: cuDNN + passes vs the fused Triton convs, tiles (CU_ARGS)
                timeout "${CU_TIMEOUT:-200}" python3 -m benchmarks.inference_h200.codec_units "$OUT/codec_units" \
                  ${CU_ARGS:-} 2>&1 | tee "$OUT/codec_units.txt" | tail -12 ;;
    codectiles) # the fused codec convs' tiles swept per conv shape (codec_tiles.py; CT_ARGS, CT_BUDGET): the table
                # kernels/tuned_codec_conv.json is $OUT/codec_tiles/tuned_codec_conv.json of such a run, copied
                # to $OUT/tuned_codec_conv.json, which the bundling below leaves for a later stage to read
                timeout "${CT_TIMEOUT:-420}" python3 -m benchmarks.inference_h200.codec_tiles "$OUT/codec_tiles" \
                  --budget-s "${CT_BUDGET:-360}" ${CT_ARGS:-} 2>&1 | tee "$OUT/codec_tiles.txt" | tail -16
                cp -f "$OUT/codec_tiles/tuned_codec_conv.json" "$OUT/" 2>/dev/null || true ;;
    encodestages) # the fill job's encode stage by stage against each stage's floor, fused units vs cuDNN's (ES_ARGS)
                  timeout "${ES_TIMEOUT:-200}" python3 -m benchmarks.inference_h200.encode_stages "$OUT/encode_stages" \
                    ${ES_ARGS:-} 2>&1 | tee "$OUT/encode_stages.txt" | tail -30 ;;
    codecstages) # the serving codec's push stage by stage against each stage's floor (CS_ARGS: --streams,
                 # --frames, --layout ncl); ~70 s with the S2-size codec's load
                 timeout "${CS_TIMEOUT:-240}" python3 -m benchmarks.inference_h200.codec_stages "$OUT/codec_stages" \
                   ${CS_ARGS:-} 2>&1 | tee "$OUT/codec_stages.txt" | tail -16 ;;
    live) # LIVE_SPREAD: session lengths FRAMES x (1 +- spread) (0: one length, sessions stay in waves);
          # LIVE_PYSPY=1: py-spy of the server's threads for 20 s, 8 s into the sessions
          [ "${LIVE_PYSPY:-0}" = 1 ] && live_pyspy "$OUT/live" &
          timeout "${LIVE_TIMEOUT:-500}" python3 -m benchmarks.inference_serve.live_prefix "$OUT/live" \
            --reference-wav "${LIVE_REF_WAV:-benchmarks/inference_serve/live_ref.wav}" --checkpoint s2-pro --device cuda --rounds "${LIVE_ROUNDS:-2}" --sessions "${LIVE_SESSIONS:-64}" --sides "${LIVE_SIDES:-reuse,whole}" \
            --concurrency "${LIVE_C:-64}" --frames "$FRAMES" --frames-spread "${LIVE_SPREAD:-0.5}" \
            --client-procs "${LIVE_PROCS:-1}" \
            --serve-args "--gpu-class h200 --max-new-tokens $FRAMES ${SERVE_ARGS:-}" \
            2>&1 | tee "$OUT/live.txt" | tail -8
          wait; stop_servers ;;
    benchgate)  # the engine bench's gate (issue #25: catch a planted 10 % slowdown at c=64 too)
      timeout "${GATE_BENCH_TIMEOUT:-480}" python3 -m ttsfleet.cli bench engine --checkpoint s2-pro \
        --codec "${GATE_CODEC:-none}" --device cuda --concurrency "${GATE_LEVELS:-1,64}" --repeats 3 \
        --per-client "${GATE_PER_CLIENT:-10}" --frames "$FRAMES" --frames-spread 0.5 --prompt-tokens 512 \
        --gate --no-breakdown --out "$OUT/benchgate" 2>&1 | tee "$OUT/benchgate.txt" | tail -12 ;;
    step) # the decode step per batch against its floor, split into parts and kernel families (step_bench.py;
          # STEP_BATCHES, STEP_PROFILE: the batches profiled kernel by kernel)
      timeout "${STEP_TIMEOUT:-300}" python3 -m benchmarks.inference_h200.step_bench 2>&1 \
        | tee "$OUT/step_bench.txt" | tail -30 ;;
    levers) timeout "${LEVERS_TIMEOUT:-240}" python3 -m benchmarks.inference_h200.decode_levers 2>&1 \
              | tee "$OUT/decode_levers.txt" | tail -30 ;;
    onelaunch) timeout "${ONE_TIMEOUT:-420}" python3 -m benchmarks.inference_h200.one_launch 2>&1 \
                 | tee "$OUT/one_launch.txt" | tail -12 ;;
    convs) timeout "${CONVS_TIMEOUT:-150}" python3 -m benchmarks.inference_h200.codec_convs 2>&1 \
             | tee "$OUT/codec_convs.txt" | tail -8 ;;
    gemmproto) timeout "${PROTO_TIMEOUT:-200}" python3 -m benchmarks.inference_h200.gemm_proto 2>&1 \
                 | tee "$OUT/gemm_proto.txt" | tail -40 ;;
    deepgemmbuild) build_deepgemm ;;
    deepgemm) # DeepGEMM built (build_deepgemm) then deepgemm_gemm.py beside ours (DG_MS, DG_DEADLINE_S)
      # (2026-12-07d: the table's process printed its header and died unseen: the probe first, loudly)
      build_deepgemm
      PYTHONPATH="$DGDIR/DeepGEMM:$PYTHONPATH" DG_JIT_DEBUG=1 timeout "${DG_PROBE_TIMEOUT:-90}" \
        python3 -X faulthandler benchmarks/inference_h200/deepgemm_probe.py > "$OUT/deepgemm_probe.txt" 2>&1
      echo "deepgemm probe rc $?" | tee -a "$OUT/run.log"; grep -E "^-- |Error|error|Fatal|fault" \
        "$OUT/deepgemm_probe.txt" | head -40 | cut -c1-600 | tee -a "$OUT/run.log"
      PYTHONPATH="$DGDIR/DeepGEMM:$PYTHONPATH" timeout "${DG_TIMEOUT:-240}" \
        python3 -X faulthandler -m benchmarks.inference_h200.deepgemm_gemm "$OUT" 2>&1 | tee "$OUT/deepgemm_gemm.txt" | tail -25
      echo "deepgemm_gemm rc ${PIPESTATUS[0]}" | tee -a "$OUT/run.log" ;;
    w8a16) # the W8A16 decode GEMM prototype beside today's FP8 kernel (w8a16_gemm.py; W8A16_MS, W8A16_DEADLINE_S)
      timeout "${W8A16_TIMEOUT:-200}" python3 -m benchmarks.inference_h200.w8a16_gemm "$OUT" 2>&1 \
        | tee "$OUT/w8a16_gemm.txt" | tail -30 ;;
    engineab)  # the engine bench with eager prefill (a) and with prefill graphs (b, serve's default)
      for side in ${ENGINE_SIDES:-a:--no-prefill-graphs b:--prefill-graphs}; do
        timeout "${ENGINE_TIMEOUT:-200}" python3 -m ttsfleet.cli bench engine --checkpoint s2-pro --codec "${ENGINE_CODEC:-none}" \
          --device cuda --concurrency "${ENGINE_LEVELS:-64}" --per-client 10 --frames "$FRAMES" --frames-spread 0.5 \
          --prompt-tokens 512 --no-breakdown "${side#*:}" --out "$OUT/engine_${side%%:*}" 2>&1 \
          | tee "$OUT/engine_${side%%:*}.txt" | grep -E "│|engine thread" | tail -4 | tee -a "$OUT/run.log"
      done ;;
    enginespy)  # bench engine with the codec in the loop under py-spy (every thread, Python frames;
      # ENGINESPY_ARGS adds py-spy flags: --native ran past 300 s on 2026-12-03c and left no profile)
      timeout "${ENGINE_TIMEOUT:-300}" py-spy record -o "$OUT/enginespy_raw.txt" --format raw --threads -r 100 \
        ${ENGINESPY_ARGS:-} -- python3 -m ttsfleet.cli bench engine --checkpoint s2-pro --codec "${ENGINE_CODEC:-s2-pro}" \
        --device cuda --concurrency "${ENGINE_LEVELS:-64}" --per-client 10 --frames "$FRAMES" --frames-spread 0.5 \
        --prompt-tokens 512 --no-breakdown --out "$OUT/enginespy" 2>&1 | tee "$OUT/enginespy.txt" \
        | grep -E "│|engine thread|py-spy|Error" | tail -6 | tee -a "$OUT/run.log"
      gzip -f "$OUT/enginespy_raw.txt" ;;
    serve) serve_config "$OUT/serve" "${SERVE_ARGS:-}" ;;
    ab)  # side by side in one call: A, B, A, B ... (AB_ROUNDS rounds), same levels
      for r in $(seq 1 "${AB_ROUNDS:-1}"); do
        serve_config "$OUT/a$r" "${SERVE_ARGS_A:-}"; serve_config "$OUT/b$r" "${SERVE_ARGS_B:-}"; done ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/run.log"
done
# everything in the per-config folders as one archive (the device returns at most 8 files); the
# tables are in run.log
cd "$OUT" && find . -mindepth 2 -type f -print0 | tar -czf served.tgz --null -T - --remove-files 2>/dev/null
ls -la "$OUT"
