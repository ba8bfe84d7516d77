#!/usr/bin/env bash
# The next device calls, in the order benchmarks/inference_h200/README.md gives them ("The next device
# calls"), one `run` each, so a session with a flaky device spends its few starts on exactly these:
#   run(command="bash benchmarks/inference_h200/next_calls.sh 1", carry=[".whl", "benchmarks/inference_serve/live_ref.wav"])
# (make .whl first: bash benchmarks/inference_h200/device_wheels.sh). Each stage runs speed_run.sh under
# its own limit, so a call ends inside the device's 600 s. What comes back (the device returns at most 8
# files): $OUT/callN.tgz (every stage's folder and log) and $OUT/summary.txt (each stage's last lines).
set -u
S=${SPEED_RUN:-benchmarks/inference_h200/speed_run.sh}
O=${OUT:-/tmp/out}
mkdir -p "$O"
stage() {  # stage NAME LIMIT_S [VAR=value ...] STAGE: one speed_run.sh stage, its output under $O/NAME
  local name=$1 limit=$2; shift 2
  local what=${*: -1} vars=("${@:1:$#-1}")
  echo "== $name (limit ${limit} s) at $(date +%T)" | tee -a "$O/summary.txt"
  env OUT="$O/$name" "${vars[@]}" timeout -k 5 "$limit" bash "$S" "$what" > "$O/$name.log" 2>&1
  echo "== $name rc $? at $(date +%T)" | tee -a "$O/summary.txt"; tail -25 "$O/$name.log" | tee -a "$O/summary.txt"
}
server_log() {  # server_log NAME: the server.log of stage NAME, from the served.tgz speed_run.sh bundled it into
  tar -xzOf "$O/$1/served.tgz" --wildcards '*server.log' 2>/dev/null
}
first_error() {  # first_error NAME: how many device asserts stage NAME's server met, its first engine check
  echo "== $1: $(server_log "$1" | grep -c 'device-side assert') asserts" | tee -a "$O/summary.txt"
  server_log "$1" | grep -m1 EngineStateError | cut -c1-3000 | tee -a "$O/summary.txt"
}
bundle() {  # every stage's folder and log into $O/callN.tgz, beside summary.txt
  tar -czf "/tmp/call$1.tgz" -C "$O" --exclude=summary.txt --exclude='call*.tgz' --exclude='kernel_cache.tgz*' . \
    && find "$O" -mindepth 1 ! -name summary.txt ! -name 'call*.tgz' ! -name 'kernel_cache.tgz*' -delete \
    && mv "/tmp/call$1.tgz" "$O/call$1.tgz"
}
case ${1:-} in
  1) # the chunk ramp off beside on (the listener's underruns both ways, frames/s), then the reworked gather
     # rule at 100 ms (urgent streams alone, everyone once a window is over); the GPU tests of the codec
     # gather, the encode graphs and the window attention
     stage ab 300 SERVE_ARGS_A="TTSFLEET_CHUNK_RAMP=off" SERVE_ARGS_B="" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     stage gather100 150 SERVE_ARGS="--codec-gather-ms 100" LEVELS="64:640 128:1280" serve
     stage quicktests 130 QT_TIMEOUT=120 QUICKTESTS="tests/fill_jobs/test_encode_graphs.py \
tests/inference_model/test_codec_window_attention.py tests/inference_server/test_codec_gather.py" quicktests ;;
  1s) # call 1's first stage alone, for a budget that cannot hold all of call 1 (~300 s + the start): the
      # chunk ramp off beside on, the one default of 2026-12-05d no GPU has measured
     stage ab 300 SERVE_ARGS_A="TTSFLEET_CHUNK_RAMP=off" SERVE_ARGS_B="" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab ;;
  1g) # call 1's second stage alone (~150 s), e.g. on a machine still warm after 1s
     stage gather100 150 SERVE_ARGS="--codec-gather-ms 100" LEVELS="64:640 128:1280" serve ;;
  2) # the gather window at 50 ms beside 200 ms (call 1 gives 100 ms and none): the H200's default is the
     # largest that keeps first audio p99 <= 250 ms and no more underruns than none
     stage ab 400 SERVE_ARGS_A="--codec-gather-ms 50" SERVE_ARGS_B="--codec-gather-ms 200" \
       LEVELS="64:640 128:1280" AB_ROUNDS=1 ab ;;
  3) # the served path on an H200 on today's defaults (B) beside the ones before 2026-12-05c (A: the window
     # attention on torch's choice, no GEMM prefetch), c=64 and c=128: the H200 figure of record
     stage ab 570 SERVE_ARGS_A="TTSFLEET_CODEC_WINDOW_ATTENTION=auto TTSFLEET_GEMM_PREFETCH=off" SERVE_ARGS_B="" \
       LEVELS="64:640 128:1280" AB_ROUNDS=1 ab ;;
  4) # the served curve with prompts at the real model's length beside the byte prompts of every record
     stage ab 570 SERVE_ARGS_A="--preset-text bytes" SERVE_ARGS_B="--preset-text qwen-bpe" \
       LEVELS="64:640 128:1280" AB_ROUNDS=1 ab ;;
  5) # the fused codec convs' tiles swept per shape on an H200, then the push with the swept table beside the
     # heuristic's tiles, and the window attention on torch's choice beside the default (efficient)
     stage codectiles 390 CT_TIMEOUT=380 CT_BUDGET=330 codectiles
     stage codeccompile 190 CC_TIMEOUT=180 CC_ARGS="--variants graphs,fused-units,fused-units@table,\
fused-units+window-auto --shapes 16x4,64x4,128x4 --tile-table $O/codectiles/tuned_codec_conv.json" codeccompile ;;
  6) # the decode GEMMs re-swept on an H200 and the step on the new table; the GEMM prefetch off / at 4 beside
     # the default 2
     stage sweep 400 sweep
     stage levers 170 LEVER_ROUNDS=2 LEVER_VARIANTS=default,prefetch@off,prefetch@4 LEVERS_TIMEOUT=160 levers ;;
  7) # on an H200: the fill job's encode channels-last (eager: graphs gained 1-2 % on an H100), the live
     # route, the GPU tests
     stage encode 150 ENC_PRECISIONS=tf32,bf16 ENC_LAYOUTS=channels-last ENC_SNAKES=fused,fused-units \
       ENC_TIMEOUT=140 encode
     stage live 150 LIVE_TIMEOUT=140 LIVE_SIDES=reuse LIVE_SESSIONS=320 LIVE_C=64 LIVE_ROUNDS=1 \
       SERVE_ARGS="--preset-text qwen-bpe" live
     stage tests 280 TESTS_TIMEOUT=270 tests ;;
  8) # Inductor on today's codec at the small pushes the served path makes (~34 frames: 9 x 4) and at
     # 64 x 4: on 2026-12-06 (H100) compiled 1.84x the fused units' graphs at 1 x 1, 1.50x at 16 x 4,
     # but 90 + 138 s of compile; two compiles now serve every shape (one stream padded, no duck shaping);
     # then the compiled one again in a new process on the warm Inductor / Triton caches (a pod's restart
     # with serving.kernelCache)
     stage codeccompile 380 CC_TIMEOUT=370 CC_ARGS="--variants fused-units,compiled --shapes 1x1,16x4,64x4" \
       codeccompile
     stage codeccompile-warm 190 CC_TIMEOUT=180 CC_ARGS="--variants compiled --shapes 1x1,16x4,64x4" codeccompile ;;
  8s) # call 8 at the two small pushes alone (~360 s), for a budget that cannot hold all of it
     stage codeccompile 360 CC_TIMEOUT=350 CC_ARGS="--variants fused-units,compiled --shapes 1x1,16x4" codeccompile ;;
  8b) # the compiled codec at 16 x 4 and 64 x 4 beside the fused units' graphs (~200 s): one compile for both
     stage codeccompile 270 CC_TIMEOUT=260 CC_ARGS="--variants fused-units,compiled --shapes 16x4,64x4" codeccompile ;;
  9) # the prefill target (16 x 512 >= 80,000 tokens/s): 79k on 2026-12-02, before the prefill graphs, the
     # native GQA and the one-piece attention; re-measured on today's tree, the split on and off
     stage prefill 210 prefill ;;
  10) # the served path with the codec compiled by Inductor (over cuDNN's units: codec_batch.residual_units)
      # (B) beside today's default (A: the fused units' graphs), c=64 and c=128. Cold, B's start-up outran
      # the call (2026-12-06b: still compiling after 396 s): run 10w first and carry its cache (.kcache)
     stage ab 580 READY_S=300 SERVE_ARGS_A="" SERVE_ARGS_B="--codec-compile default" \
       LEVELS="64:640 128:1280" AB_ROUNDS=1 ab ;;
  10w) # the served compiled codec's start-up alone, its Triton / Inductor caches packed for call 10 (2026-12-06b:
       # its server was still compiling after 396 s, so call 10's B never served): $O/kernel_cache.tgz.part00, ...
       # come back (15 MiB parts: 2026-12-06c's one 41 MiB file did not); put them in .kcache/ and carry .kcache
       # with call 10, whose servers then start warm (or run 10 right after 10w on the same warm machine:
       # /tmp/kcache stays there between calls, as it did on 2026-12-06c: compiles 112 + 146 s -> 27 + 33 s)
     stage warm 540 READY_S=510 SERVE_ARGS="--codec-compile default" LEVELS="1:4" serve
     stage cacheout 30 KCACHE_OUT="$O/kernel_cache.tgz" cacheout ;;
  11) # the chunk ramp as it is (A: 1, 2, 4) beside repeat-first (B: 1, 1, 2, 4: the slack after the first
      # chunk 11 -> 28.5 ms at c=64), c=64 and c=128: the listener's underruns and where they start
     # (2026-12-06b, one round in 300 s: B's c=128 was cut; underruns 46.5 -> 24.0 %, frames/s -5.7 %)
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_CHUNK_RAMP=repeat-first" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  12) # the codec process held to 40 % of the GPU's threads under MPS (B: TTSFLEET_CODEC_SM_PERCENT=40, CUDA's
      # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in the codec process alone) beside no limit (A, the default), c=64
      # and c=128: its small pushes cannot fill the GPU, the decode step's weight reads want every SM
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_CODEC_SM_PERCENT=40" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  13) # the codec process below normal priority among MPS clients (B: TTSFLEET_CODEC_MPS_PRIORITY=below-normal,
      # CUDA's CUDA_MPS_CLIENT_PRIORITY=1) beside the default (A), c=64 and c=128: the step's work first, every
      # SM still open to the codec (call 12's 40 % cap, 2026-12-06c: +6.1 % frames/s at c=64, first audio
      # p99 234 -> 303 ms at c=64 and 331 -> 1,414 ms at c=128); the engine line now gives the step's GPU
      # time in situ beside its interval
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_CODEC_MPS_PRIORITY=below-normal" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  14) # the codec process at 70 % of the GPU's threads (B) beside no limit (A): call 12's 40 % bought frames/s
      # with first audio; a milder cap, c=64 and c=128
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_CODEC_SM_PERCENT=70" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  15) # prompts held up to 20 ms so later arrivals share a prefill call (B: --prefill-coalesce-ms 20) beside
      # none (A, the default), c=64 and c=128: a prefill call from graphs is done in 10.9 ms for one
      # prompt, 14.6 for two, 24.7 for four (H200, 2026-12-02-graphs run6), and at c=128 about one prompt
      # arrives a step; off
      # since 2026-12-02 (+7.4 % frames/s for first audio then, before the prefill graphs and the
      # codec process); the engine line's GPU spans say what a step's prefill costs the GPU
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="--prefill-coalesce-ms 20" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  16) # one-piece prefill calls from whole-call graphs, attention inside (B: TTSFLEET_PREFILL_WHOLE_GRAPHS=on)
      # beside the piecewise graphs (A), c=64 and c=128: a one-prompt call is host-bound there (done in
      # 10.9 ms, host 10.7 ms: H200, 2026-12-02-graphs run6); the engine line's prefill phase and its GPU
      # span say what the whole graphs save; the GPU tests' test_prefill_graphs.py checks their capture.
      # Round 1 (2026-12-06d, their attention on SDPA's math kernel): -6.9 % c=64; round 2 after the fix
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_PREFILL_WHOLE_GRAPHS=on" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  17) # one prefill call eager, from the piecewise graphs and from the whole-call graphs, each call's host, done
      # and GPU time apart (the GPU's own: the call queued behind a sleep), 1-8 prompts and one prompt of
      # ~100 / ~350 / ~480 tokens, and the kernels by GPU time: served, the whole graphs cut the prefill
      # phase's host time in half and still slowed the step (call 16, 2026-12-06d: their GPU span 5.5 ->
      # 6.8 ms a step; their attention, always masked, ran on SDPA's math kernel: masked calls now expand the
      # K/V heads for the memory-efficient kernel); first the GPU test that a masked GQA call finds that kernel
     stage quicktests 100 QT_TIMEOUT=90 QUICKTESTS="tests/inference_model/test_prompt_gqa.py \
tests/inference_model/test_chunked_prefill.py" quicktests
     stage prefillgraphs 310 prefillgraphs ;;
  18) # prefill calls on a CUDA stream of their own (B: TTSFLEET_PREFILL_STREAM=on) beside inline on the engine's
      # stream (A), c=64 and c=128: a prompt held the engine's stream ~30 % of the time at c=64 (2026-12-06d),
      # every decode step queued behind it; first the GPU test that the side stream gives the inline codes
     stage quicktests 100 QT_TIMEOUT=90 QUICKTESTS="tests/inference_server/test_prefill_stream.py" quicktests
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_PREFILL_STREAM=on" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  19) # both prefill levers together (B: whole-call graphs and the side stream) beside neither (A), c=64 and
      # c=128: on its own stream a prompt's call still costs the engine thread its launches (the prefill
      # phase, ~4.8 ms a step at c=64), which the whole graphs halve; the pair is what 16 and 18 point at
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_PREFILL_WHOLE_GRAPHS=on TTSFLEET_PREFILL_STREAM=on" \
       LEVELS="64:640 128:1280" AB_ROUNDS=1 ab ;;
  20) # the served curve with prompts at the real model's length (qwen-bpe) on today's defaults: call 4
      # (2026-12-06e) died at c=128 of a device-side assert; found with the engine's checks (calls 22, 23)
      # and mended (graph-owned split-K workspaces, 2026-12-06f); the stage's asserts and first engine
      # check are counted into the summary (0 and none since the mend)
     stage shortprompts 250 SERVE_ARGS="--preset-text qwen-bpe" LEVELS="64:640 128:1280" serve
     first_error shortprompts ;;
  21) # side-stream prompts joining at the next step, the engine's stream waiting on the GPU for their call
      # (B: TTSFLEET_PREFILL_JOIN=next-step) beside joining once the call is done (A, the default), c=64
      # and c=128: the side stream cost first audio +29 ms at p50 (2026-12-06e call 18: two decode steps);
      # a one-step join should give back about half of it, and frames/s should not fall (a wait is felt
      # only where a call outlasts the step it runs beside); the GPU test of both joins first
     stage quicktests 100 QT_TIMEOUT=90 QUICKTESTS="tests/inference_server/test_prefill_stream.py" quicktests
     stage ab 380 SERVE_ARGS_A="" SERVE_ARGS_B="TTSFLEET_PREFILL_JOIN=next-step" LEVELS="64:640 128:1280" \
       AB_ROUNDS=1 ab ;;
  22) # call 20's diagnosis alone: the dead c=128 level with the engine's checks on, then the side stream off
     stage shortprompts-checked 200 SERVE_ARGS="TTSFLEET_ENGINE_CHECKS=on --preset-text qwen-bpe" \
       LEVELS="128:1280" serve
     server_log shortprompts-checked | grep -B2 -A30 "engine loop died\|EngineStateError" | head -60 \
       | tee -a "$O/summary.txt"
     stage shortprompts-inline 200 SERVE_ARGS="TTSFLEET_PREFILL_STREAM=off --preset-text qwen-bpe" \
       LEVELS="128:1280" serve
     server_log shortprompts-inline | grep -c "device-side assert" | sed 's/^/inline side: asserts /' \
       | tee -a "$O/summary.txt" ;;
  23) # where call 22's whole batch went non-finite in one step (c=128, short prompts, every slot's K/V
      # finite): the checks' rerun report (the step's slow half again, fused outside a graph and plain
      # with a hook per module: transient or repeatable, which module first), then the same level with
      # programmatic dependent launch off, then without any CUDA graph (each stage's first error, or none)
     stage checked 175 SERVE_ARGS="TTSFLEET_ENGINE_CHECKS=on --preset-text qwen-bpe" LEVELS="128:640" serve
     first_error checked
     stage nopdl 175 SERVE_ARGS="TTSFLEET_ENGINE_CHECKS=on TTSFLEET_PDL=off --preset-text qwen-bpe" \
       LEVELS="128:640" serve
     first_error nopdl
     stage nographs 175 SERVE_ARGS="TTSFLEET_ENGINE_CHECKS=on TTSFLEET_CUDA_GRAPHS=0 --preset-text qwen-bpe" \
       LEVELS="128:640" serve
     first_error nographs ;;
  24) # call 23's fault with the workspaces mended (kernels/workspaces.py: graph families own theirs,
      # made by their warm-ups; outgrown ones kept): the GPU test of the rules, then call 23's level with
      # the engine's checks on (it went non-finite at step 267 in every run before the mend)
     stage quicktests 70 QT_TIMEOUT=60 QUICKTESTS="tests/kernels/test_workspaces.py" quicktests
     stage mended 175 SERVE_ARGS="TTSFLEET_ENGINE_CHECKS=on --preset-text qwen-bpe" LEVELS="128:640" serve
     first_error mended ;;
  25) # mixed steps (B: TTSFLEET_MIXED_STEPS=on: prompts arriving while others decode ride in the decode
      # step, one pass of the slow model for both) beside separate prefill calls on the side stream (A,
      # the default), prompts at the real tokenizer's length, c=64 and c=128; the GPU test first (the
      # one-pass form against the step then the call, its prefill graphs captured)
     stage quicktests 110 QT_TIMEOUT=100 QUICKTESTS="tests/inference_model/test_mixed_step.py \
tests/inference_server/test_mixed_steps_engine.py" quicktests
     stage ab 440 SERVE_ARGS_A="--preset-text qwen-bpe" SERVE_ARGS_B="TTSFLEET_MIXED_STEPS=on --preset-text \
qwen-bpe" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  25s) # call 25's side by side alone, for a budget that cannot hold its GPU test too (a crash on the B
       # side shows in its errors and the first engine error counted below)
     stage ab 440 SERVE_ARGS_A="--preset-text qwen-bpe" SERVE_ARGS_B="TTSFLEET_MIXED_STEPS=on --preset-text \
qwen-bpe" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  25c) # call 25's side by side at c=128 alone (where prefill is the larger part of the step: 8.4 of
       # 24 ms on 2026-12-06f), for a budget that cannot hold both levels
     stage ab 330 SERVE_ARGS_A="--preset-text qwen-bpe" SERVE_ARGS_B="TTSFLEET_MIXED_STEPS=on --preset-text \
qwen-bpe" LEVELS="128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  25t) # call 25's GPU tests alone (the one-pass form against the step then the call, graphs captured;
       # the engine with first halves captured and riders through the prefill graphs)
     stage quicktests 110 QT_TIMEOUT=100 QUICKTESTS="tests/inference_model/test_mixed_step.py \
tests/inference_server/test_mixed_steps_engine.py" quicktests ;;
  26) # mixed steps (on by default since 2026-12-06h, B) beside separate prefill calls (A:
      # TTSFLEET_MIXED_STEPS=off) with the byte prompts of every figure of record (~355 tokens: pieces of up
      # to 256 rows ride, each prompt row attending over its slot inside the graphs), c=64 and c=128; 25 and
      # 25s measured the short prompts only
     stage ab 440 SERVE_ARGS_A="TTSFLEET_MIXED_STEPS=off" SERVE_ARGS_B="" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  27) # where the host's time goes at c=128 on today's defaults (mixed steps on): py-spy over every thread
      # of the server for 20 s of the level (the engine thread's launch 7.1 + other 12.2 ms of a 21.3 ms
      # step on 2026-12-06h: its bookkeeping, or its waits for the interpreter beside the event loop)
     stage pyspy 250 SERVE_ARGS="--preset-text qwen-bpe" LEVELS="128:1280" PYSPY_AT=128 serve ;;
  28) # the attending pass as one graph per row bucket (was one replay per segment, 37 a mixed step): its GPU
      # tests (the pass against the step then the prefill call, graphs captured; the engine's riders),
      # then call 27's py-spy at c=128 (the launch phase was 7.1 ms a step on 2026-12-06h)
     stage quicktests 110 QT_TIMEOUT=100 QUICKTESTS="tests/inference_model/test_mixed_step.py \
tests/inference_server/test_mixed_steps_engine.py" quicktests
     stage pyspy 250 SERVE_ARGS="--preset-text qwen-bpe" LEVELS="128:1280" PYSPY_AT=128 serve ;;
  29) # the server's event loop and HTTP parser in C (B, the default since 2026-12-07: uvloop + httptools)
      # beside asyncio's loop and uvicorn's h11 (A), the short prompts of 2026-12-06h, c=64 and c=128: the
      # engine thread waited 0.39 ms for the GIL after each release at c=128 there
     stage ab 440 SERVE_ARGS_A="TTSFLEET_EVENT_LOOP=asyncio TTSFLEET_HTTP_PARSER=h11 --preset-text qwen-bpe" \
       SERVE_ARGS_B="--preset-text qwen-bpe" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  30) # the whole mixed step in one graph per row bucket (B: TTSFLEET_MIXED_GRAPH=step, opt-in: the host packs
      # one array, three torch calls and a replay) beside the attending pass alone in a graph with its
      # set-up and hand-off eager (A: TTSFLEET_MIXED_GRAPH=pass), short prompts, c=64 and c=128; the GPU
      # tests first (both forms against the step then the prefill call, graphs captured)
     stage quicktests 110 QT_TIMEOUT=100 QUICKTESTS="tests/inference_model/test_mixed_step.py \
tests/inference_server/test_mixed_steps_engine.py" quicktests
     stage ab 440 SERVE_ARGS_A="TTSFLEET_MIXED_GRAPH=pass --preset-text qwen-bpe" \
       SERVE_ARGS_B="TTSFLEET_MIXED_GRAPH=step --preset-text qwen-bpe" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  30s) # call 30's side by side alone (round 2): its first round's B side served c=128 at batch 85 with a
       # first-audio p99 of 6.5 s, where the same code in call 29 gave batch 123 and 729 ms (B named: its
       # first run, 2026-12-07b, left B to the default, by then the pass -- an A/A run)
     stage ab 440 SERVE_ARGS_A="TTSFLEET_MIXED_GRAPH=pass --preset-text qwen-bpe" \
       SERVE_ARGS_B="TTSFLEET_MIXED_GRAPH=step --preset-text qwen-bpe" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  31) # the engine's cache bookkeeping by fill_ (2026-12-07: one-element assignments from the host drained
      # the stream at every join and retire) served on today's defaults, c=64 and c=128, beside call 27's
      # c=128 (5,904 frames/s; other 13.7 ms of a 20.7 ms step): first the three assignment forms timed
      # with work queued, then the GPU test of the bookkeeping under torch's sync debug mode
     python3 -P benchmarks/inference_h200/setitem_sync.py 2>&1 | tee -a "$O/summary.txt"
     stage quicktests 80 QT_TIMEOUT=70 QUICKTESTS="tests/inference_model/test_no_host_sync.py" quicktests
     stage serve 330 SERVE_ARGS="--preset-text qwen-bpe" LEVELS="64:640 128:1280" serve
     first_error serve ;;
  32) # issue #26: the W8A16 decode GEMM prototype (FP8 block-scaled weights widened to bf16 in the tile, bf16
      # activations, MMAs accumulating in place: no per-128-K rescale between them) -- its GPU tests, then
      # each S2 Pro shape at M = 1, 16, 64 beside today's FP8 kernel (codes in; bf16 in with the quantize
      # launch) and bf16 cuBLAS, with the accuracy of both against the bf16-operand linear; then the whole
      # decode step with it (TTSFLEET_DECODE_GEMM=a16) beside the default at batch 1, 16, 64, 128. Run on
      # 2026-12-07c (H100): slower at every shape and M, the step 1.20-1.45x -- rejected, its served A/B dropped
     stage quicktests 110 QT_TIMEOUT=100 QUICKTESTS="tests/kernels/test_w8a16.py \
tests/inference_model/test_decode_gemm_a16.py tests/inference_model/test_gpu_s2pro_gate.py::test_w8a16_decode_greedy_equals_bf16" \
       quicktests
     stage w8a16 200 W8A16_TIMEOUT=190 W8A16_DEADLINE_S=150 w8a16
     stage levers 170 LEVER_ROUNDS=2 LEVER_BATCHES=1,16,64,128 LEVER_VARIANTS=default,a16 LEVERS_TIMEOUT=160 levers ;;
  33) # issue #26: DeepGEMM (the block-scaled FP8 GEMMs fish-scales-ops runs on sm_90) built on the device from
      # the carried .ext/deepgemm.tgz (deepgemm_bundle.sh), beside ours at each S2 Pro decode shape x M = 1, 16,
      # 64, 128 -- whether a kernel of our contract streams the weights faster here -- then the decode step
      # with it (TTSFLEET_DECODE_GEMM=deepgemm) beside the default (carry .whl and .ext)
     stage deepgemm 330 DG_BUILD_TIMEOUT=150 DG_TIMEOUT=170 DG_DEADLINE_S=140 deepgemm
     # then (if it built) its GPU test against the same-codes reference, and the whole decode step with it
     stage quicktests 60 QT_TIMEOUT=50 QUICKTESTS="tests/kernels/test_deepgemm_backend.py" quicktests
     stage levers 190 LEVER_ROUNDS=2 LEVER_BATCHES=1,16,64,128 LEVER_VARIANTS=default,deepgemm LEVERS_TIMEOUT=180 \
       levers ;;
  33t) # call 33's first stage alone, where the budget leaves no room for its step: DeepGEMM built, timed
       # beside ours and cuBLAS at each decode shape x M, and the step estimated from the GEMMs (best_fp8)
     stage deepgemm 330 DG_BUILD_TIMEOUT=150 DG_TIMEOUT=170 DG_DEADLINE_S=140 deepgemm ;;
  34) # issue #26 -> #25: the served path with DeepGEMM's decode GEMMs (B: TTSFLEET_DECODE_GEMM=deepgemm) beside
      # ours (A, the default), short prompts, c=64 and c=128 -- run where call 33's step with it won. DeepGEMM
      # is built first unless the machine kept call 33's build (warm: /tmp/dgsrc); B's start JIT-compiles its
      # kernels in the graphs' eager warm-ups (NVCC, ~2 s each; DG_JIT_CACHE_DIR beside Triton's cache).
      # DG_ROWS=LO-HI (TTSFLEET_DEEPGEMM_ROWS; default 1-128) keeps the other batch sizes on ours, where
      # call 33's step lost with DeepGEMM at some of them: `DG_ROWS=16-128 bash next_calls.sh 34`; DG_SHAPES=NxK,...
      # (TTSFLEET_DEEPGEMM_SHAPES; default all) likewise keeps the weight shapes where ours won on it
     stage dgbuild 160 DG_BUILD_TIMEOUT=150 deepgemmbuild
     stage ab 420 SERVE_ARGS_A="--preset-text qwen-bpe" SERVE_ARGS_B="TTSFLEET_DECODE_GEMM=deepgemm \
TTSFLEET_DEEPGEMM_ROWS=${DG_ROWS:-1-128} TTSFLEET_DEEPGEMM_SHAPES=${DG_SHAPES:-all} --preset-text qwen-bpe" \
       LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  35) # issue #25: the codec process's start-up (40-48 s of a server's 60-71 s ready on 2026-12-07c, the
      # critical path of every served call's two starts) with cuDNN's autotuner on today's codec: limit 3
      # (the default), off, and 1 candidate. On 2026-12-04, before the fused units, off captured in 25 s
      # but picked a 20x slower kernel at 64 x 4; most of the codec's convs are Triton's now -- if off keeps
      # the pushes, the autotuner goes and each served start loses ~30 s
     stage codeccapture 300 CAP_TIMEOUT=290 CAP_BUDGET=220 CAP_CONFIGS="cl,cl:benchmark=0,cl:limit=1" codeccapture ;;
  36) # issue #25: the server's garbage collections (inference/gc_pauses.py): start-up's heap frozen after the
      # warm-up (B, --gc-freeze, the default since 2026-12-07d) beside every full pass walking it (A,
      # --no-gc-freeze), short prompts, c=64 and c=128. On the CPU a full pass over the unfrozen tiny server
      # stopped it for 97-99 ms (benchmarks/inference_serve, gc-pauses-2026-12-07); the engine line and
      # ab_table's engine cell give each side's full passes (gc2) over the steady window beside the event
      # loop's lateness and the server's whole first audio: whether they hold the c=128 first-audio tail
     stage ab 440 SERVE_ARGS_A="--no-gc-freeze --preset-text qwen-bpe" SERVE_ARGS_B="--gc-freeze --preset-text qwen-bpe" \
       LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  37) # issue #25: the served path on today's defaults alone, short prompts, c=64 and c=128, the bench's listeners
      # on connections of their own (2026-12-07e: the one shared httpx pool held requests for up to 0.6 s at
      # c=64 and 5.5 s at c=128 before they were written, counted as first audio): the first-audio tails and
      # c=128's frames/s without it; the server's first audio now from its app's receipt (stage intake), the
      # client's part traced (until written, new connections, the slowest requests in bench.json)
     stage serve 330 SERVE_ARGS="--preset-text qwen-bpe" LEVELS="64:640 128:1280" serve
     first_error serve ;;
  38) # issue #26: the decode step at batch 96 took 14.93 ms beside 12.90 at 128 on an H100 (2026-12-07e), with
      # one tuned GEMM entry for 65-128 rows: the step split into parts and kernel families at 64, 96 and 128
      # (profiles at ${STEP_PROFILE:-64,96}: since 2026-12-07f rows 65+ run cuBLAS, counted as its own family)
     stage step 320 STEP_TIMEOUT=310 STEP_BATCHES=64,96,128 STEP_PROFILE="${STEP_PROFILE:-64,96}" step ;;
  39) # issue #26 -> #25: DeepGEMM's programs on fewer SMs than the GPU's (B: TTSFLEET_DEEPGEMM_SMS=${DG_SMS:-116})
      # beside all of them (A), both on decode rows ${DG_ROWS:-33-128}: its step was 13-15 % shorter than ours at
      # batch 40-64 alone yet served c=64 ran 1.7 % slower with it (2026-12-07e) -- one persistent program per SM,
      # while the codec process's kernels hold some SMs under MPS
     stage dgbuild 160 DG_BUILD_TIMEOUT=150 deepgemmbuild
     stage ab 420 SERVE_ARGS_A="TTSFLEET_DECODE_GEMM=deepgemm TTSFLEET_DEEPGEMM_ROWS=${DG_ROWS:-33-128} \
--preset-text qwen-bpe" SERVE_ARGS_B="TTSFLEET_DECODE_GEMM=deepgemm TTSFLEET_DEEPGEMM_ROWS=${DG_ROWS:-33-128} \
TTSFLEET_DEEPGEMM_SMS=${DG_SMS:-116} --preset-text qwen-bpe" LEVELS="64:640 128:1280" AB_ROUNDS=1 ab
     first_error ab ;;
  40) # issue #25: the served curve on an H200's defaults (since 2026-12-07f decode batches of 65+ rows on
      # cuBLAS: c=128 met both capacity bounds in two rounds), c=1 / 64 / 128 in one server, prompts at the
      # real tokenizer's length: the catalog's H200 capacity curve (tests/served_runs.py SERVED_RUN) and
      # its slo_concurrency come from one such run; the one of record is still 2026-12-04's run15
     stage serve 330 SERVE_ARGS="--preset-text qwen-bpe" LEVELS="1:8 64:640 128:1280" serve
     first_error serve ;;
  41) # issue #26: our decode GEMMs with one 128-row token tile at 65-128 rows (benchmarks/inference_h200/
      # tuned_h200_bm128.json: the shipped 128-row picks with bm 128 and 8 warps; interpreter-checked) beside
      # cuBLAS (the default there since 2026-12-07f) and ours on 64-row tiles (which read every weight twice
      # there): cublas@129 keeps rows 65-128 on ours; the step at 64 (unchanged) to 128
     stage levers 200 LEVERS_TIMEOUT=190 LEVER_ROUNDS=2 LEVER_BATCHES=64,72,96,120,128 \
       LEVER_VARIANTS="default,cublas@129,cublas@129+table@benchmarks/inference_h200/tuned_h200_bm128.json" levers ;;
  42) # issue #26: DeepGEMM (flat in M: 0.85x ours at 40-64 rows and 0.69x at 96 on an H100, 2026-12-07e) on
      # the H200 beside today's split (ours to 64 rows, cuBLAS from 65): on rows 33-64 (ours keeps 1-32, cuBLAS
      # 65+), on 33-128 and on 65-128 alone; the step at 32 to 128 -- which rows each library should take
     stage dgbuild 160 DG_BUILD_TIMEOUT=150 deepgemmbuild
     stage levers 300 LEVERS_TIMEOUT=290 LEVER_ROUNDS=2 LEVER_BATCHES=32,48,64,80,96,128 \
       LEVER_VARIANTS="default,deepgemm@33-64,deepgemm@33-128,deepgemm@65-128" levers ;;
  43) # issue #25: the live route's first-audio tail at c=64 (p99 313 ms on an H100, 2026-12-07c, beside the
      # server's stage p99s of 25-90 ms): the bench client's ~190 threads in one interpreter (A: LIVE_PROCS=1)
      # beside 4 client processes of 16 sessions' threads (B), each with its lag probe (client_thread_lag):
      # a tail that shrinks in B was the client's
     stage live1 150 LIVE_TIMEOUT=140 LIVE_SIDES=reuse LIVE_SESSIONS=320 LIVE_C=64 LIVE_ROUNDS=1 LIVE_PROCS=1 \
       SERVE_ARGS="--preset-text qwen-bpe" live
     stage live4 150 LIVE_TIMEOUT=140 LIVE_SIDES=reuse LIVE_SESSIONS=320 LIVE_C=64 LIVE_ROUNDS=1 LIVE_PROCS=4 \
       SERVE_ARGS="--preset-text qwen-bpe" live ;;
  44) # issue #26: the RMSNorm's and attention's FP8 scales in cuBLAS's order where cuBLAS reads them (B: scalesdirect,
      # TTSFLEET_CUBLAS_SCALES=direct) beside the copies cuBLAS's GEMMs make of them (A: default): 2026-12-08 on an
      # H100 those copies were 228 launches, 333 us of the 11.5 ms step at batch 96 (call38's profile); the step
      # at 64 (unchanged: ours) to 128, then the S2 Pro greedy gate with it on
     stage levers 200 LEVERS_TIMEOUT=190 LEVER_ROUNDS=3 LEVER_BATCHES=64,72,96,128 \
       LEVER_VARIANTS="default,scalesdirect" levers
     stage gate 300 GATE_TIMEOUT=290 TTSFLEET_CUBLAS_SCALES=direct gate ;;
  *) echo "usage: next_calls.sh 1|1s|1g|2|3|4|5|6|7|8|8s|8b|9|10|10w|11|12|13|14|15|16|17|18|19|20|21|22|23|24|25|25s|25c|25t|26|27|28|29|30|30s|31|32|33|33t|34|35|36|37|38|39|40|41|42|43|44 (see benchmarks/inference_h200/README.md)" >&2
     exit 2 ;;
esac
bundle "$1"
ls -la "$O"
