"""``bench serve``'s reading of the engine loop: decode steps a second and each step's interval by phase.

The server exports its engine thread's busy seconds by phase (``inference_engine_seconds``,
:mod:`.engine_phases`) and a sample per decode step (``inference_batch_size``, whose count is the
steps and whose sum the rows decoded); two reads of /metrics give a span's growth, and this turns it
into what a step costs the loop. Why: the served c=64 step interval (~19 ms on an H100) is twice a
step's graph replay, and only the split says whether the GPU (``gpu_wait``) or the host (the rest)
holds the loop back.
"""

from __future__ import annotations

import math
from typing import Any

from .engine_phases import ENGINE_PHASES

#: Where a phase goes in the line: the GPU wait first (whether the GPU holds the loop back), then the
#: host's phases, the remainder (``other``) last; a phase :data:`ENGINE_PHASES` gains without a rank
#: here comes before ``other``.
_DISPLAY_RANK = {"gpu_wait": 0, "launch": 1, "prefill": 2, "other": 9}
assert set(_DISPLAY_RANK) <= set(ENGINE_PHASES), "a ranked phase the engine no longer exports"

#: The server's ``ENGINE_PHASES`` in the order the line gives them (any other phase a newer server
#: exports is listed after them).
PHASE_ORDER = tuple(sorted(ENGINE_PHASES, key=lambda phase: _DISPLAY_RANK.get(phase, 5)))


#: Prefix of :func:`engine_totals`' keys for the engine's GPU work in situ (``inference_engine_gpu_seconds``).
GPU_KEY = "gpu:"
#: :func:`engine_totals`' keys for the GIL probe's sum and count (``inference_engine_gil_wait_seconds``).
GIL_SUM, GIL_COUNT = "gil:sum", "gil:count"
#: :func:`engine_totals`' key for the prompt tokens prefilled (``inference_prefill_tokens``).
PREFILL_TOKENS = "prefill_tokens"
#: Prefix of :func:`engine_totals`' keys for the server's event-loop lag
#: (``inference_event_loop_lag_seconds``: ``loop:sum``, ``loop:count``, a ``loop:le:BOUND`` per bucket).
LOOP_KEY = "loop:"
#: Prefix of :func:`engine_totals`' keys for the server's full (generation-2) garbage collections
#: (``inference_gc_pause_seconds{generation="2"}``: ``gc2:sum``, ``gc2:count``, ``gc2:le:BOUND``).
GC2_KEY = "gc2:"
#: Keys of :func:`engine_totals` that are not phases of the loop's time (nor GPU work: :data:`GPU_KEY`).
_NOT_PHASES = ("steps", "rows", GIL_SUM, GIL_COUNT, PREFILL_TOKENS)


def _is_phase(key: str) -> bool:
    """Whether an :func:`engine_totals` key is a phase of the loop's time (an ``inference_engine_seconds``
    label), not a count, the GIL probe, GPU work, the event loop's lag or the collector's pauses."""
    return key not in _NOT_PHASES and not key.startswith((GPU_KEY, LOOP_KEY, GC2_KEY))


def _hist_key(smp: Any, name: str, prefix: str) -> str | None:
    """``prefix`` + ``le:BOUND`` / ``sum`` / ``count`` for one sample of the histogram ``name`` (or None)."""
    if smp.name == name + "_bucket":
        return f"{prefix}le:{float(smp.labels['le'])}"
    if smp.name in (name + "_sum", name + "_count"):
        return prefix + smp.name.rsplit("_", 1)[1]
    return None


def _histogram_key(smp: Any, lag: str, gc_pause: str, generation: str) -> str | None:
    """The key of a sample of the event-loop lag histogram (:data:`LOOP_KEY`) or of the full garbage
    collections' pauses (:data:`GC2_KEY`; the younger generations' are left out; ``generation``: the
    label naming them), else None."""
    if smp.labels.get(generation) == "2":
        return _hist_key(smp, gc_pause, GC2_KEY)
    return _hist_key(smp, lag, LOOP_KEY)


def bucket_of_longest(buckets: list[tuple[float, float]], count: float) -> float:
    """The upper bound of the bucket that holds the longest of ``count`` observations, from cumulative
    ``(le, count)`` buckets sorted by ``le`` (``inf`` past the last finite bound)."""
    return next((le for le, n in buckets if n >= count), math.inf)


def _buckets(grown: dict[str, float], prefix: str) -> list[tuple[float, float]]:
    """The cumulative ``(le, count)`` buckets kept under ``prefix`` + ``le:``, sorted by ``le``."""
    head = prefix + "le:"
    return sorted((float(k.removeprefix(head)), v) for k, v in grown.items() if k.startswith(head))


def engine_totals(samples: list[Any]) -> dict[str, float]:
    """The server's engine counters in one /metrics read: ``{phase: seconds, ..., "gpu:decode":
    seconds, "gpu:prefill": seconds, "steps": n, "rows": n}`` (no ``gpu:`` keys from a server on the
    CPU or an older one; {} from a server without the phase counter: an older one, or another)."""
    from ttsfleet.metrics import L_GENERATION, spec

    phases = spec("inference_engine_seconds").exposed_names[0]
    gpu = spec("inference_engine_gpu_seconds").exposed_names[0]
    gil = spec("inference_engine_gil_wait_seconds").name
    batch = spec("inference_batch_size").name
    tokens = spec("inference_prefill_tokens").exposed_names[0]
    lag = spec("inference_event_loop_lag_seconds").name
    gc_pause = spec("inference_gc_pause_seconds").name
    out: dict[str, float] = {}
    for smp in samples:
        if (hist_key := _histogram_key(smp, lag, gc_pause, L_GENERATION)) is not None:
            key = hist_key
        elif smp.name == phases:
            key = smp.labels.get("phase", "?")
        elif smp.name == gpu:
            key = GPU_KEY + smp.labels.get("work", "?")
        elif smp.name in (gil + "_sum", gil + "_count"):
            key = GIL_SUM if smp.name.endswith("_sum") else GIL_COUNT
        elif smp.name in (batch + "_count", batch + "_sum"):
            key = "steps" if smp.name.endswith("_count") else "rows"
        elif smp.name == tokens:
            key = PREFILL_TOKENS
        else:
            continue
        out[key] = out.get(key, 0.0) + smp.value
    return out if any(_is_phase(k) for k in out) else {}


def engine_use(grown: dict[str, float], wall_s: float) -> dict[str, Any]:
    """A span's engine figures from how much :func:`engine_totals` grew over ``wall_s`` seconds:
    steps a second, mean batch, the busy share of the span, each phase's ms per step and, from a
    server on a GPU, its GPU work's ms per step in situ (``gpu_ms``: decode, prefill), and the GIL
    probe's mean wait in ms (``gil_wait_ms``, with its probe count), the event loop's lateness
    (:func:`_loop_use`) and the full garbage collections (:func:`_gc_use`) ({} when the server has no
    phase counter or made no step)."""
    steps = grown.get("steps", 0.0)
    phases = {k: v for k, v in grown.items() if _is_phase(k)}
    gpu = {k.removeprefix(GPU_KEY): v for k, v in grown.items() if k.startswith(GPU_KEY)}
    if steps <= 0 or wall_s <= 0 or not phases:
        return {}
    ordered = [p for p in PHASE_ORDER if p in phases] + sorted(p for p in phases if p not in PHASE_ORDER)
    busy = sum(phases.values())
    return {"steps_per_s": round(steps / wall_s, 2), "mean_batch": round(grown.get("rows", 0.0) / steps, 2),
            "busy_share": round(busy / wall_s, 4), "step_ms": round(1000 * busy / steps, 3),
            "per_step_ms": {p: round(1000 * phases[p] / steps, 3) for p in ordered},
            **({"gpu_ms": {w: round(1000 * gpu[w] / steps, 3) for w in sorted(gpu)}} if gpu else {}),
            **_prefill_use(grown, steps), **_gil_use(grown), **_loop_use(grown),
            **_gc_use(grown)}


def _prefill_use(grown: dict[str, float], steps: float) -> dict[str, Any]:
    """Prompt tokens prefilled a step and, from a server on a GPU, the prefill's GPU span per 1,000 of
    them: its in-situ cost whatever the prompts' length (the 16 x 512 call alone: ~12.8 ms per 1,000
    tokens on an H100, 2026-12-06c call 9)."""
    tokens = grown.get(PREFILL_TOKENS, 0.0)
    if tokens <= 0:
        return {}
    out: dict[str, Any] = {"prefill_tokens_per_step": round(tokens / steps, 1)}
    if GPU_KEY + "prefill" in grown:
        out["prefill_gpu_ms_per_1k_tokens"] = round(1e6 * grown[GPU_KEY + "prefill"] / tokens, 2)
    return out


def _gil_use(grown: dict[str, float]) -> dict[str, Any]:
    probes = grown.get(GIL_COUNT, 0.0)
    if probes <= 0:
        return {}
    return {"gil_wait_ms": round(1000 * grown.get(GIL_SUM, 0.0) / probes, 3), "gil_probes": int(probes)}


def _loop_use(grown: dict[str, float]) -> dict[str, Any]:
    """The server's event loop over the span: how late its 10 ms timer woke, mean and p99 in ms (the
    p99 read from the histogram's buckets as Prometheus's ``histogram_quantile`` does)."""
    from ttsfleet.metrics import histogram_quantile

    ticks = grown.get(LOOP_KEY + "count", 0.0)
    if ticks <= 0:
        return {}
    p99 = histogram_quantile(0.99, _buckets(grown, LOOP_KEY))
    return {"loop_lag_mean_ms": round(1000 * grown.get(LOOP_KEY + "sum", 0.0) / ticks, 3),
            "loop_lag_p99_ms": round(1000 * p99, 2) if p99 is not None else None,
            "loop_lag_ticks": int(ticks)}


def _gc_use(grown: dict[str, float]) -> dict[str, Any]:
    """The server's full garbage collections over the span (each stops every thread of the server,
    :mod:`.gc_pauses`): how many, their summed pause, the p99 (as ``histogram_quantile`` reads the
    buckets) and the upper bound of the bucket that holds the longest (``gc2_max_le_ms``; past the last
    finite bound: ``gc2_max_above_ms``), in ms ({} from a server that does not export them; no p99 nor
    bound where none ran)."""
    from ttsfleet.metrics import histogram_quantile

    if GC2_KEY + "count" not in grown:
        return {}
    count = grown[GC2_KEY + "count"]
    out: dict[str, Any] = {"gc2_count": int(count),
                           "gc2_total_ms": round(1000 * grown.get(GC2_KEY + "sum", 0.0), 2)}
    buckets = _buckets(grown, GC2_KEY)
    if count <= 0 or not buckets:
        return out
    p99 = histogram_quantile(0.99, buckets)
    out["gc2_p99_ms"] = round(1000 * p99, 2) if p99 is not None else None
    bound = bucket_of_longest(buckets, count)
    finite = [le for le, _ in buckets if not math.isinf(le)]
    if math.isinf(bound):
        out["gc2_max_above_ms"] = round(1000 * finite[-1], 2) if finite else 0.0
    else:
        out["gc2_max_le_ms"] = round(1000 * bound, 2)
    return out


def engine_line(use: dict[str, Any], span: str) -> str:
    """One level's :func:`engine_use` (with its ``concurrency``) as a line under the table."""
    parts = ", ".join(f"{phase} {ms:.1f}" for phase, ms in use["per_step_ms"].items())
    gpu = ", ".join(f"{work} {ms:.1f}" for work, ms in use.get("gpu_ms", {}).items())
    return (f"c={use['concurrency']} engine, {span}: {use['steps_per_s']:.1f} steps/s at batch "
            f"{use['mean_batch']:.1f}, {use['step_ms']:.1f} ms a step: {parts} (busy "
            f"{use['busy_share']:.0%})" + (f"; its GPU work in situ, ms a step: {gpu}" if gpu else "")
            + _prefill_words(use)
            + (f"; the GIL back after letting go, mean {use['gil_wait_ms']:.2f} ms "
               f"({use['gil_probes']} probes)" if "gil_wait_ms" in use else "") + _loop_words(use)
            + _gc_words(use))


def _loop_words(use: dict[str, Any]) -> str:
    if "loop_lag_ticks" not in use:
        return ""
    p99 = use.get("loop_lag_p99_ms")
    return (f"; the server's event loop late by mean {use['loop_lag_mean_ms']:.2f} ms"
            + (f", p99 {p99:.1f} ms" if p99 is not None else "") + f" ({use['loop_lag_ticks']} ticks)")


def _gc_words(use: dict[str, Any]) -> str:
    if "gc2_count" not in use:
        return ""
    if "gc2_max_le_ms" in use:
        longest = f", the longest <= {use['gc2_max_le_ms']:g} ms"
    elif "gc2_max_above_ms" in use:
        longest = f", the longest > {use['gc2_max_above_ms']:g} ms"
    else:
        longest = ""
    return (f"; its full garbage collections {use['gc2_count']}x, {use['gc2_total_ms']:.0f} ms in all"
            + longest)


def _prefill_words(use: dict[str, Any]) -> str:
    if "prefill_tokens_per_step" not in use:
        return ""
    span = use.get("prefill_gpu_ms_per_1k_tokens")
    return (f"; prefill {use['prefill_tokens_per_step']:.0f} tokens a step"
            + (f", its span {span:.1f} ms per 1,000" if span is not None else ""))
