"""``ttsfleet bench engine``: the decode engine under closed-loop load, in process, plus a step breakdown.

Why in process (``bench serve`` measures over HTTP): the question here is what one GPU's decode
path delivers — aggregate and per-request frames/s, time to first audio — without a client, a
network or an event loop in the numbers, for a model of the real shape with random weights (no
checkpoint can be downloaded). Every request has the same prompt length and decodes exactly
``frames`` frames (``ignore_eos``), so levels are comparable. Time to first audio is submit → first
audio chunk out of the codec (with ``codec none``: first codes chunk out of the engine).

The breakdown replays CUDA graphs of the decode step and of its parts (slow step, fast
codebooks) at each batch size on a cache filled to ``prompt_tokens + frames / 2`` positions, so
the report says where a step's time goes. The JSON's ``points`` are what
:meth:`ttsfleet.catalog.GpuCatalog.with_measured_file` reads; :func:`regressions` compares a
result with a frozen baseline (the performance gate).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .bench import Level, Sample, capacity, machine, points, summarize_runs
from .graph_capture import capture_after_warmup

DEFAULT_LEVELS = [1, 2, 4, 8, 16, 32, 64]


@dataclass
class EngineBenchConfig:
    checkpoint: str = "s2-pro"
    codec: str = "s2-pro"  # a codec preset/path, or "none" (codes-only engine)
    device: str = "cuda"
    quantize: str = "auto"
    levels: list[int] = field(default_factory=lambda: list(DEFAULT_LEVELS))
    prompt_tokens: int = 512
    frames: int = 128
    requests: int = 0  # per level; 0 = per_client x c (at least 4)
    #: Closed-loop requests per client when ``requests`` is 0 (>= 3 leaves a steady window; 10 gives
    #: the gate a c=64 spread small enough to see a 10 % slowdown: bench_window's docstring).
    per_client: int = 10
    max_running_requests: int = 64
    prefill_chunk_tokens: int = 0  # 0 = whole prompts
    prefill_token_budget: int = 2048  # prompt tokens per engine iteration, in one batched prefill call
    breakdown: bool = True
    seed: int = 0
    repeats: int = 1  # runs per level (median frames/s and spread)
    pipeline_depth: int = 1
    #: Test hook for the gate: slow every decode step down by this fraction (0.1 = 10 % fewer frames/s)
    #: with a GPU spin kernel (a host sleep would hide behind the pipelined GPU queue).
    plant_slowdown: float = 0.0
    #: Request i decodes ``frames * (1 + frames_spread * u_i)`` frames, ``u_i`` uniform in [-1, 1]
    #: (seeded): lengths vary as real requests do, so the closed loop does not march in lock-step waves.
    frames_spread: float = 0.0
    #: After the levels, run them again as a re-run and once more with a planted 10 % slowdown, and
    #: check both against the first pass with the gate (in the same process: no second set-up).
    gate: bool = False
    #: The codec in its fast mode (bf16, fused Snake, bucketed CUDA graphs): ``load_codec(fast=True)``.
    #: On by default, as ``ttsfleet serve`` runs it (CUDA only; the CPU keeps float32).
    codec_fast: bool = True
    #: The prefill's per-row work from CUDA graphs (CUDA only), as ``ttsfleet serve`` runs it. Off,
    #: the bench measured an engine the server does not run: on 2026-12-03 (H200, c=64, 512-token
    #: prompts) eager prefill calls took 21.5 s of a 33.8 s run (benchmarks/inference_h200/2026-12-03b).
    prefill_graphs: bool = True
    #: ``torch.compile`` mode of the batched codec decode (None: eager): ``EngineConfig.codec_compile``.
    codec_compile: str | None = None
    #: Decode audio in a child process (``EngineConfig.codec_process``), as ``serve --codec-process``.
    codec_process: bool = False

    def requests_at(self, c: int) -> int:
        return self.requests or max(self.per_client * c, 4)


# ----------------------------------------------------------------------------- set-up
def build_engine(cfg: EngineBenchConfig) -> Any:
    import torch

    from ttsfleet.catalog import cuda_graph_max_bs

    from .codec import load_codec
    from .codec_process import CodecSource
    from .engine import Engine, EngineConfig
    from .loader import load_model

    cuda = cfg.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    seq = cfg.prompt_tokens + max_frames(cfg) + 8
    model = load_model(cfg.checkpoint, device=cfg.device, dtype=dtype, quantize=cfg.quantize, seed=cfg.seed,
                       max_seq_len=seq)
    codec = None if cfg.codec == "none" else load_codec(cfg.codec, device=cfg.device, dtype=torch.float32,
                                                        fast=cuda and cfg.codec_fast)
    ecfg = EngineConfig(max_running_requests=cfg.max_running_requests, max_queue=4 * cfg.max_running_requests,
                        cuda_graph_max_bs=cuda_graph_max_bs(cfg.max_running_requests), max_seq_len=seq,
                        prefill_token_budget=cfg.prefill_token_budget,
                        prefill_chunk_tokens=cfg.prefill_chunk_tokens, pipeline_depth=cfg.pipeline_depth,
                        device=cfg.device, pad_to_buckets=cuda, cuda_graphs=cuda,
                        codec_graphs=cuda and cfg.codec_fast, codec_compile=cfg.codec_compile,
                        prefill_graphs=cuda and cfg.prefill_graphs,
                        codec_process=CodecSource(cfg.codec, cfg.device, cuda and cfg.codec_fast)
                        if cfg.codec_process and codec is not None else None)
    engine = Engine(model, codec, ecfg, model_label=cfg.checkpoint)
    if cfg.plant_slowdown > 0:
        _plant_slowdown(engine, cfg.plant_slowdown)
    return engine


def _plant_slowdown(engine: Any, fraction: float) -> None:
    """Make each engine iteration take ``1 / (1 - fraction)`` times as long (the gate's planted regression).

    Before each step's launch, spend ``fraction`` of the running average interval between launches
    (which holds the step, any prefill call, the host's own work and this delay itself, so the
    interval settles at ``1 / (1 - fraction)`` of the unslowed one) on the host
    (a sleep) and, on CUDA, as much again on the GPU (a ``torch.cuda._sleep`` kernel on the engine's
    stream). Why both: a GPU spin alone hides in the GPU's idle time when the host is the bottleneck
    (H200, 2026-12-03, c=64 with eager prefill: the planted runs came out 0.5 % slower, not 10 %), and a
    host sleep alone hides behind the pipelined GPU queue when the GPU is; whichever side sets the
    pace is slowed by the fraction (where both do, by up to twice it).
    """
    import torch

    launch = engine._launch_step
    state = {"last": 0.0, "avg": 0.0}
    cuda = engine.device.type == "cuda"
    hz = 1e3 * torch.cuda.clock_rate(engine.device) * 1e3 if cuda else 0.0  # SM clock (kHz -> Hz)

    def slowed() -> None:
        now = time.perf_counter()
        if state["last"]:
            gap = min(now - state["last"], 0.2)
            state["avg"] = gap if not state["avg"] else 0.9 * state["avg"] + 0.1 * gap
        state["last"] = now
        delay = fraction * state["avg"]
        if delay > 0:
            if cuda:
                torch.cuda._sleep(int(delay * hz))
            time.sleep(delay)
        launch()

    engine._launch_step = slowed


def max_frames(cfg: EngineBenchConfig) -> int:
    return int(round(cfg.frames * (1 + cfg.frames_spread)))


def request_frames(cfg: EngineBenchConfig, i: int) -> int:
    """Frames request ``i`` decodes (deterministic per seed and index; the served bench's rule)."""
    from ttsfleet.inference.bench import spread_frames

    return spread_frames(cfg.frames, cfg.frames_spread, cfg.seed, i)


def _prompt(model: Any, n: int, seed: int) -> Any:
    """A text-only prompt ``[1 + ncb, n]`` of random non-audio token ids."""
    import torch

    c = model.config
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(c.semantic_begin_id, c.im_end_id), (n,), generator=g)
    return torch.cat([ids[None], torch.zeros(c.num_codebooks, n, dtype=torch.int64)])


# ----------------------------------------------------------------------------- closed loop
async def _request(engine: Any, cfg: EngineBenchConfig, i: int, tag: int, worker: int = 0,
                   wave: int = 0) -> Sample:
    """Request ``i`` of a level (its length depends on ``i`` only, so repeated runs do the same work);
    ``tag`` seeds its prompt and sampling."""
    from .engine import GenerationRequest
    from .sampling import SamplingParams

    req = GenerationRequest(prompt=_prompt(engine.model, cfg.prompt_tokens, cfg.seed * 100_003 + tag),
                            sampling=SamplingParams(seed=cfg.seed + tag),
                            max_new_tokens=request_frames(cfg, i), ignore_eos=True)
    t0 = time.perf_counter()
    handle = engine.submit(req, asyncio.get_running_loop())
    first, frames, ok = None, 0, True
    while True:
        ev = await handle.next()
        if ev.kind == "audio":
            frames += ev.frames
            if first is None and (ev.frames or (ev.audio is not None and ev.audio.size)):
                first = time.perf_counter()
        elif ev.kind in ("done", "error"):
            ok = ev.kind == "done"
            break
    end = time.perf_counter()
    return Sample(ok, 200 if ok else 500, (first or end) - t0, end - t0, float(frames),
                  frames / FRAMES_PER_AUDIO_S, start_s=t0, client=worker, wave=wave)


#: S2's codec: 44,100 Hz / 2,048 samples per frame.
FRAMES_PER_AUDIO_S = 44100 / 2048

#: Engine counters whose per-level difference says where the engine thread's time went.
PHASES = ("prefill_s", "decode_s", "wait_s", "codec_s", "steps", "prefill_calls", "prefill_tokens",
          "codec_calls", "codec_frames", "codec_rounds", "spare_rows")


async def _run(engine: Any, cfg: EngineBenchConfig, c: int, n: int,
               run: int) -> tuple[list[Sample], float, float]:
    samples: list[Sample] = []
    counter = iter(range(n))

    async def worker(k: int) -> None:
        for wave, i in enumerate(counter):  # the level's shared counter: each worker's draws
            samples.append(await _request(engine, cfg, i, (run * 100 + c) * 1000 + i, k, wave))

    f0 = engine.stats.frames
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(c)))
    wall = time.perf_counter() - t0
    return samples, wall, float(engine.stats.frames - f0)


def _level(engine: Any, cfg: EngineBenchConfig, c: int, n: int) -> tuple[Level, dict[str, float]]:
    """``cfg.repeats`` closed-loop runs at ``c``; the level, and the engine's phase totals per run."""
    before = engine.stats.snapshot()
    runs = [asyncio.run(_run(engine, cfg, c, n, r)) for r in range(max(cfg.repeats, 1))]
    after = engine.stats.snapshot()
    wall = sum(w for _, w, _ in runs)
    phases = {k: round((after[k] - before[k]) / len(runs), 4) for k in PHASES}
    phases["wall_s"] = round(wall / len(runs), 4)
    for reason, count in after["admission_waits"].items():
        waited = count - before["admission_waits"][reason]
        phases[f"admission_waits_{reason}"] = round(waited / len(runs), 1)
    return summarize_runs(c, n, runs), phases


# ----------------------------------------------------------------------------- step breakdown
def capture_graph(fn: Any) -> Any:
    """``fn`` captured into a CUDA graph, after two warm-up calls on a side stream (as capture wants:
    lazy allocations and autotuning happen outside the graph)."""
    from ttsfleet.kernels.workspaces import new_owner, workspace_scope

    with workspace_scope(new_owner("bench-engine")):  # the warm-ups make the workspaces it bakes
        graph, _ = capture_after_warmup(fn)
    return graph


def graph_replay_ms(fn: Any, reps: int = 20) -> float:
    """Median GPU time of one ``fn()`` replayed from a CUDA graph (launch gaps excluded)."""
    return replay_ms(capture_graph(fn), reps)


def call_ms(fn: Any, device: Any) -> float:
    """Milliseconds of one call of ``fn``: CUDA events around it on a GPU (its GPU time, waited for),
    the wall clock elsewhere (the CPU runs it synchronously)."""
    import torch

    if torch.device(device).type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def replay_ms(graph: Any, reps: int = 20) -> float:
    """Median GPU time of ``reps`` replays of a captured CUDA graph (CUDA events around each)."""
    return statistics.median(call_ms(graph.replay, "cuda") for _ in range(reps))


def decode_inputs(model: Any, bs: int) -> tuple[Any, Any, Any]:
    """A decode step's per-row inputs for ``bs`` rows: slots ``0..bs-1``, seeded sampling
    parameters, a random 16-frame codes window (the repetition penalty's)."""
    import torch

    from .sampling import SamplingBatch, SamplingParams

    c, dev = model.config, model.device
    slots = torch.arange(bs, device=dev)
    batch = SamplingBatch.from_params([SamplingParams(seed=i) for i in range(bs)], dev)
    window = torch.randint(0, c.codebook_size, (bs, 16, c.num_codebooks), device=dev, dtype=torch.int32)
    return slots, batch, window


def decode_step_fn(model: Any, cache: Any, context: int, inputs: tuple[Any, Any, Any]) -> Any:
    """One whole decode step on ``inputs`` (:func:`decode_inputs`) with every slot at ``context``
    positions (reset first, so the function can be replayed from a graph again and again)."""
    slots, batch, window = inputs

    def whole() -> None:
        cache.lengths.fill_(context)
        model.decode_step(cache, slots, batch, window)

    return whole


def _time_parts(model: Any, cache: Any, bs: int, context: int) -> dict[str, float]:
    """GPU ms of one decode step at ``bs`` rows and of its slow / fast / main-sampling parts."""
    import torch

    from . import fused

    c, dev = model.config, model.device
    inputs = decode_inputs(model, bs)
    slots, batch, window = inputs
    frame = torch.cat([torch.full((bs, 1), c.semantic_begin_id, device=dev),
                       torch.randint(0, c.codebook_size, (bs, c.num_codebooks), device=dev)], 1)
    step = torch.zeros(bs, dtype=torch.int64, device=dev)
    hidden = cache.pending_hidden[:bs].clone()

    whole = decode_step_fn(model, cache, context, inputs)

    def slow() -> None:
        cache.lengths.fill_(context)
        fused.slow_step(model, cache, slots, frame)

    def fast() -> None:
        fused.fast_decode(model, hidden, frame[:, 1], batch, window, step)

    def main() -> None:
        fused.sample_main_fused(cache.pending_logits[slots], batch, step, window[:, :, 0], c.num_semantic)

    parts = {name: graph_replay_ms(fn) for name, fn in (("step", whole), ("slow", slow), ("fast", fast),
                                                  ("main_sample", main))}
    parts["other"] = parts["step"] - parts["slow"] - parts["fast"] - parts["main_sample"]
    return parts


def step_breakdown(model: Any, batch_sizes: list[int], context: int) -> list[dict[str, float]]:
    """Per batch size: ms per decode step and per part, each replayed from its own CUDA graph."""
    import torch

    rows = []
    top = max(batch_sizes)
    cache = model.new_cache(top, context + 4)
    g = torch.Generator(device=model.device).manual_seed(0)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    cache.pending_logits.normal_(generator=g)
    cache.pending_hidden.normal_(generator=g)
    for bs in batch_sizes:
        parts = _time_parts(model, cache, bs, context)
        rows.append({"batch": bs, **{f"{k}_ms": round(v, 4) for k, v in parts.items()},
                     "frames_per_s": round(bs / parts["step"] * 1000, 1)})
    return rows


def prefill_breakdown(model: Any, tokens: int, batches: tuple[int, ...]) -> list[dict[str, float]]:
    """GPU ms of one batched prefill of ``n`` fresh ``tokens``-token prompts (median of 3, eager)."""

    from .model import PrefillPiece

    rows = []
    cache = model.new_cache(max(batches), tokens + 8)
    for n in batches:
        pieces = [PrefillPiece(i, _prompt(model, tokens, i), 0) for i in range(n)]
        times = [call_ms(lambda pieces=pieces: model.prefill_batch(cache, pieces), "cuda") for _ in range(4)]
        ms = statistics.median(times[1:])
        rows.append({"prompts": n, "tokens": n * tokens, "ms": round(ms, 3),
                     "tokens_per_s": round(n * tokens / ms * 1000, 1)})
    return rows


def _gate_passes(engine: Any, cfg: EngineBenchConfig, first: list[Level]) -> dict[str, Any]:
    """Each level again, unchanged and with a planted 10 % slowdown run by run in turn (A B, B A, ...).

    Why interleaved and paired: on the H200 (2026-12-02) the first pass at c=64 ran at 2,070 frames/s
    and a re-run at 2,754 (a cold first pass, then a drifting machine); a planted slowdown at 2,452,
    gated on the first pass, passed. Gating the planted runs on unchanged runs made in the same
    minutes, in alternating order, takes the drift out; the re-run is still gated on the first pass
    (is the bench reproducible?). See :func:`paired_gate`.
    """
    launch = engine._launch_step
    unchanged, planted = [], []
    try:
        for c in cfg.levels:
            n, runs = cfg.requests_at(c), {False: [], True: []}
            for r in range(max(cfg.repeats, 1)):
                for slow in ((False, True) if r % 2 == 0 else (True, False)):
                    if slow:
                        _plant_slowdown(engine, 0.10)
                    runs[slow].append(asyncio.run(_run(engine, cfg, c, n, 10 + 2 * r + slow)))
                    engine._launch_step = launch
            unchanged.append(summarize_runs(c, n, runs[False]))
            planted.append(summarize_runs(c, n, runs[True]))
    finally:
        engine._launch_step = launch
    return paired_gate(first, unchanged, planted)


def paired_gate(first: list[Level], unchanged: list[Level], planted: list[Level]) -> dict[str, Any]:
    """The gate's two verdicts: ``rerun_regressions`` (the unchanged runs against the first pass) and
    ``planted_regressions`` (the planted runs against the unchanged runs interleaved with them: it
    must name every level), plus ``planted_vs_first_regressions`` for the record, and ``noisy``: the
    levels whose unchanged runs spread wider than the gate's cap (no verdict there is worth much)."""
    def report(levels: list[Level]) -> dict[str, Any]:
        return {"levels": [asdict(lv) for lv in levels], "points": points(levels)}

    base, rerun, slow = report(first), report(unchanged), report(planted)
    out: dict[str, Any] = {"rerun": rerun, "planted": slow, "noisy": noisy_levels(rerun)}
    for name, reference, result in (("rerun", base, rerun), ("planted", rerun, slow),
                                    ("planted_vs_first", base, slow)):
        try:
            out[f"{name}_regressions"] = regressions(reference, result)
        except ValueError as exc:
            out[f"{name}_regressions"] = [f"gate refused: {exc}"]
    return out


def codec_push_ms(codec: Any, batches: tuple[int, ...] = (1, 16, 64), frames: tuple[int, ...] = (1, 4),
                  reps: int = 10) -> list[dict[str, float]]:
    """Wall ms of one batched streaming push (``B`` streams x ``T`` frames), eager and graph-replayed.

    What the codec thread pays per round: with the batched decoder a round is one push per frame
    count for every stream, so ms per push / (B x T) is the codec's cost per frame."""
    import torch

    g = torch.Generator().manual_seed(0)
    cuda = codec.device.type == "cuda"
    rows = []
    for graphs in ((False, True) if cuda else (False,)):
        dec = codec.slot_decoder(max(batches), graphs=graphs)
        for b in batches:
            for t in frames:
                codes = torch.randint(0, 1024, (b, codec.num_codebooks, t), generator=g)
                times = []
                for _ in range(reps + 2):
                    t0 = time.perf_counter()
                    dec.push(list(range(b)), codes).cpu()
                    times.append((time.perf_counter() - t0) * 1000)
                ms = statistics.median(times[2:])
                rows.append({"graphs": graphs, "streams": b, "frames": t, "ms": round(ms, 3),
                             "frames_per_s": round(b * t / ms * 1000, 1)})
    return rows


# ----------------------------------------------------------------------------- run + gate
def run_engine_bench(cfg: EngineBenchConfig, progress: Any = None) -> dict[str, Any]:
    """Build the engine, run each level (closed loop), then the step breakdown; returns the report."""
    import torch

    t0 = time.perf_counter()
    engine = build_engine(cfg)
    engine.start()
    try:
        asyncio.run(_run(engine, EngineBenchConfig(**{**asdict(cfg), "frames": 4}), 1, 1, 0))  # warm-up
        setup_s = time.perf_counter() - t0
        levels, phases = [], []
        for c in cfg.levels:
            lv, ph = _level(engine, cfg, c, cfg.requests_at(c))
            levels.append(lv)
            phases.append({"concurrency": c, **ph})
            if progress is not None:
                progress(levels[-1])
        gate = _gate_passes(engine, cfg, levels) if cfg.gate else None
    finally:
        engine.stop()
    model = engine.model
    codec_ms = codec_push_ms(engine.codec) if engine.codec is not None else []
    breakdown, prefill = [], []
    if cfg.breakdown and str(cfg.device).startswith("cuda"):
        del engine
        torch.cuda.empty_cache()
        breakdown = step_breakdown(model, sorted(set(cfg.levels)), cfg.prompt_tokens + cfg.frames // 2)
        prefill = prefill_breakdown(model, cfg.prompt_tokens, (1, 4, 16))
    base = levels[0].frames_per_s
    dev = torch.device(cfg.device)
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "quantization": model.quantization,
        "config": asdict(cfg),
        "setup_s": round(setup_s, 1),
        "levels": [asdict(lv) for lv in levels],
        "scaling": (levels[-1].frames_per_s / base) if base > 0 else None,
        "engine_phases": phases,
        "breakdown": breakdown,
        "prefill": prefill,
        "gate": gate,
        "codec_push_ms": codec_ms,  # not "codec": bench serve's per-level codec use (its table lines)
        "points": points(levels),
        "capacity": capacity(levels),
        "source": f"ttsfleet bench engine --checkpoint {cfg.checkpoint} --codec {cfg.codec}",
    }


#: The gate's derived tolerance at one concurrency: the baseline's run-to-run spread, clamped to
#: [GATE_FLOOR, GATE_CAP] (a level noisier than the cap is gated at the cap and reported as noisy).
GATE_FLOOR, GATE_CAP, GATE_MIN_REPEATS = 0.03, 0.08, 3


def gate_tolerance(level: dict[str, Any] | None) -> float:
    """Allowed drop of the median below a baseline level: its measured spread, clamped to [3 %, 8 %].

    Why the spread: two runs of unchanged code differ by what the machine's noise does to a level
    of that length; a fixed 5 % fails on that noise at some levels and is blind at others. The spread
    is the (max - min) / median of the baseline's >= 3 runs, a pessimistic bound on how far a
    re-run's *median* lands from the baseline's. The floor keeps very quiet levels from failing on
    rounding-level jitter; the cap keeps a noisy level able to catch a 10 % slowdown (the H200
    record: c=64 runs spread 10.6 %, a re-run's median came within 1.6 %, a planted 10 % slowdown
    fell 13.2 %).
    """
    if level is None or int(level.get("repeats", 1)) < GATE_MIN_REPEATS:
        raise ValueError(f"the baseline needs >= {GATE_MIN_REPEATS} repetitions per level to derive a "
                         "tolerance (re-record it with --repeats 3, or pass --tolerance)")
    return min(max(GATE_FLOOR, float(level.get("frames_per_s_spread", 0.0))), GATE_CAP)


def noisy_levels(baseline: dict[str, Any]) -> list[str]:
    """Baseline levels whose spread exceeds the cap: gated at the cap, worth re-recording longer."""
    return [f"c={lv['concurrency']}: baseline runs spread {lv['frames_per_s_spread']:.1%} (> {GATE_CAP:.0%})"
            for lv in baseline.get("levels", []) if float(lv.get("frames_per_s_spread", 0.0)) > GATE_CAP]


def regressions(baseline: dict[str, Any], result: dict[str, Any],
                tolerance: float | None = None) -> list[str]:
    """One line per concurrency where ``result`` decodes more than the tolerance below ``baseline``.

    Both are bench reports (``points``: concurrency, median frames_per_s; ``levels``: repeats and
    spread). ``tolerance`` None derives it per level from the baseline (:func:`gate_tolerance`).
    A concurrency the baseline has and the result lacks is a regression too (a gate that skips
    what it cannot see passes anything).
    """
    if tolerance is not None and not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    if not baseline.get("points"):
        raise ValueError("the baseline has no points")
    levels = {int(lv["concurrency"]): lv for lv in baseline.get("levels", [])}
    got = {int(p["concurrency"]): float(p["frames_per_s"]) for p in result.get("points", [])}
    how = {int(p["concurrency"]): p.get("method", "whole-run") for p in result.get("points", [])}
    out = []
    for p in baseline["points"]:
        c, want = int(p["concurrency"]), float(p["frames_per_s"])
        tol = tolerance if tolerance is not None else gate_tolerance(levels.get(c))
        if c not in got:
            out.append(f"c={c}: not measured (baseline {want:.1f} frames/s)")
        elif how[c] != (was := p.get("method", "whole-run")):
            out.append(f"c={c}: measured {how[c]}, the baseline {was}: not comparable "
                       "(re-record the baseline with the same requests per client)")
        elif got[c] < want * (1 - tol):
            drop = 1 - got[c] / want
            out.append(f"c={c}: {got[c]:.1f} frames/s is {drop:.1%} below the baseline {want:.1f} "
                       f"(tolerance {tol:.1%})")
    return out


def phase_line(ph: dict[str, float]) -> str:
    """Where one level's wall time went in the engine thread: what showed, on 2026-12-03, that the
    bench was prefill-bound (eager prefill 21.5 of 33.8 s at c=64) when the step looked to blame."""
    wall = ph["wall_s"] or float("nan")
    parts = {"prefill": ph["prefill_s"], "step launches": ph["decode_s"], "waiting on the GPU": ph["wait_s"]}
    parts["other host work"] = max(0.0, wall - sum(parts.values()))
    cells = ", ".join(f"{name} {sec:.1f} s ({sec / wall:.0%})" for name, sec in parts.items())
    codec = f"; codec thread busy {ph['codec_s']:.1f} s ({ph['codec_s'] / wall:.0%})"  # its own thread
    waits = [f"{k.removeprefix('admission_waits_')} {v:.0f}" for k, v in ph.items()
             if k.startswith("admission_waits_") and v]
    held = f"; iterations that left requests waiting: {', '.join(waits)}" if waits else ""
    return f"c={int(ph['concurrency'])} engine thread over {wall:.1f} s: {cells}{codec}{held}"


def print_breakdown(report: dict[str, Any]) -> None:
    if not report.get("breakdown"):
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="decode step, CUDA-graph replay (ms)")
    for col in ("batch", "step", "slow", "fast", "main sample", "other", "frames/s"):
        t.add_column(col, justify="right")
    for r in report["breakdown"]:
        cells = (f"{r[k]:.3f}" for k in ("step_ms", "slow_ms", "fast_ms", "main_sample_ms", "other_ms"))
        t.add_row(str(r["batch"]), *cells, f"{r['frames_per_s']:.0f}")
    Console().print(t)


def write_csv(report: dict[str, Any], out: Any) -> Any:
    """``bench.csv``: one row per level, with the step breakdown of the same batch size when measured."""
    import csv
    from pathlib import Path

    path = Path(out) / "bench.csv"
    steps = {r["batch"]: r for r in report.get("breakdown", [])}
    cols = ["concurrency", "frames_per_s", "frames_per_s_spread", "repeats", "per_request_frames_per_s",
            "ttfa_p50_s", "ttfa_p99_s", "rtf_p50", "rtf_p99", "requests", "errors", "step_ms", "slow_ms",
            "fast_ms", "main_sample_ms", "other_ms"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for lv in report["levels"]:
            w.writerow({**lv, **steps.get(lv["concurrency"], {})})
    return path
