"""Co-location: inference beside fill on one GPU, and when the trade pays.

Replicas kept warm for bursts (burst head-room, the scale-down window) decode at low batch and
leave their GPU mostly idle, while a fill job evicted to make room for them throws its start-up
away. With co-location a new inference replica is bound beside a fill job instead of evicting it
(:attr:`~ttsfleet.policy.FillPlan.share`): the job goes on as the replica's co-tenant at the
lowest priority and gets the GPU back, without a restart, when the replica leaves. It costs the
replica (:class:`~ttsfleet.config.ColocationConfig`): beside a running co-tenant the replica keeps
``inference_throughput`` of its frames/s and its time to first audio and real-time factor grow
by ``inference_latency``; the co-tenant does ``fill_throughput`` of an exclusive job's work. The
defaults are the one measurement (two plain processes on one H200, no priorities, no MPS).

The trade pays while the replica has concurrency to spare. :func:`colocation_limit` is the
highest requests-in-flight per replica at which a co-tenant may run: the co-located replica's
TTFA (the class curve's, times the latency cost) within ``max_ttfa_s`` (default: the curve's TTFA
at the pool's in-flight target, so no request waits longer than at the autoscaler's sizing point)
and its real-time factor within ``max_rtf``. Above it the co-tenant yields (pauses; it neither
slows the replica nor works). A limit below one request means co-location never pays on that
curve, and fill is evicted for inference as before. Pure and deterministic.
"""

from __future__ import annotations

from typing import NamedTuple

from ttsfleet.catalog import CapacityCurve
from ttsfleet.config import ColocationConfig

#: Decoded frames per second of audio (the codec's 44.1 kHz at 2048 samples per frame): a
#: replica's real-time factor is concurrency x this / its frames/s.
FRAMES_PER_AUDIO_S = 44100 / 2048
#: Concurrency resolution of the limit (requests in flight per replica).
STEP = 0.25


class ColocationLimit(NamedTuple):
    """Requests in flight per replica up to which a co-tenant runs beside it (0: never)."""

    concurrency: float
    reason: str

    @property
    def allowed(self) -> bool:
        return self.concurrency >= 1.0


def colocated_rtf(curve: CapacityCurve, concurrency: float, latency: float) -> float:
    """A co-located replica's real-time factor at ``concurrency`` (decode time per audio second)."""
    c = max(concurrency, 1.0)
    return latency * c * FRAMES_PER_AUDIO_S / max(curve.frames_per_s(c), 1e-9)


def _why_not(config: ColocationConfig, curve: CapacityCurve, c: float, ttfa_limit: float) -> str | None:
    ttfa = curve.ttfa_s(c) * config.inference_latency
    if ttfa > ttfa_limit + 1e-9:
        return f"TTFA {ttfa * 1000:.0f} ms beside fill > {ttfa_limit * 1000:.0f} ms"
    rtf = colocated_rtf(curve, c, config.inference_latency)
    if rtf > config.max_rtf + 1e-9:
        return f"RTF {rtf:.2f} beside fill > {config.max_rtf:g}"
    return None


def colocation_limit(config: ColocationConfig, curve: CapacityCurve, target: float) -> ColocationLimit:
    """The highest in-flight requests per replica at which a fill co-tenant may run beside a
    replica of ``curve`` whose pool targets ``target`` in flight per replica (see module doc)."""
    if not config.enabled:
        return ColocationLimit(0.0, "co-location off")
    ttfa_limit = config.max_ttfa_s if config.max_ttfa_s is not None else curve.ttfa_s(max(target, 1.0))
    why = _why_not(config, curve, 1.0, ttfa_limit)
    if why is not None:
        return ColocationLimit(0.0, f"never pays: at one request {why}")
    c, top = 1.0, float(curve.max_concurrency)
    while c + STEP <= top + 1e-9:
        why = _why_not(config, curve, c + STEP, ttfa_limit)
        if why is not None:
            return ColocationLimit(c, f"up to {c:g} in flight per replica; above it {why}")
        c += STEP
    return ColocationLimit(c, f"up to {c:g} in flight per replica (the curve's end)")
