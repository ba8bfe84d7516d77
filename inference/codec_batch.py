"""The codec's batched streaming decode rounds, wherever they run: the engine's codec thread or the
codec process (:mod:`ttsfleet.inference.codec_process`).

Why a module of its own: the same bookkeeping — which request's codes wait, which decoder slot holds
its stream state, how a round groups streams into one call per frame count — runs in two places, and
its owner differs only in how an event reaches the request (a handle's asyncio queue in process, a
message over a pipe from the child). So it takes the handle-like object, the counters and a cancel
callback instead of an engine.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from ttsfleet.inference.codec_gather import GatherRule, StreamTiming, due, select, wake_in
from ttsfleet.inference.engine_messages import CodesChunk, DropStream, Event, StopCodec

from ttsfleet.switches import ProcessSwitch, one_of

log = logging.getLogger("ttsfleet.inference.codec_batch")


class EventSink(Protocol):
    """What a stream's events go to: a :class:`~ttsfleet.inference.engine_messages.RequestHandle` in process,
    a forwarding stand-in in the codec process."""

    rid: int

    def post(self, ev: Any) -> None: ...


class CodecCounters(Protocol):
    codec_calls: int
    codec_frames: int
    codec_s: float  # wall seconds in decode rounds
    codec_rounds: int  # rounds that decoded: one or more calls each (:mod:`.codec_gather`)


#: The codec's counts and the contract counter (:mod:`ttsfleet.metrics`) each is exported as.
CODEC_METRICS = {"codec_calls": "inference_codec_pushes", "codec_frames": "inference_codec_frames",
                 "codec_s": "inference_codec_busy_seconds", "codec_rounds": "inference_codec_rounds"}


class _Exported:
    """A :class:`CodecMeter` field: its value lives in the meter's stats; each increase is exported."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.metric = name, CODEC_METRICS[name]

    def __get__(self, meter: Any, owner: type | None = None) -> Any:
        return self if meter is None else getattr(meter.stats, self.name)

    def __set__(self, meter: Any, value: float) -> None:
        grown = value - getattr(meter.stats, self.name)
        setattr(meter.stats, self.name, value)
        if grown > 0:  # the counts only grow; a counter must never go back
            meter.export(self.metric, grown)


class CodecMeter:
    """The :class:`CodecCounters` both codec modes write: kept in ``stats`` (the engine's, what ``bench
    engine`` reads), and every increase handed to ``export(metric, amount)`` (the engine's Prometheus
    counters, :data:`CODEC_METRICS`).

    Why one object: the counts change in two places — :class:`BatchedCodec` adds to them in the codec
    thread, the codec process's receiver assigns the child's running totals — and both write through
    here, so turning a change into a counter increment is written once and holds for both modes."""

    codec_calls = _Exported()
    codec_frames = _Exported()
    codec_s = _Exported()
    codec_rounds = _Exported()

    def __init__(self, stats: CodecCounters, export: Callable[[str, float], None]) -> None:
        self.stats, self.export = stats, export


@dataclass
class CodecJob:
    """One request's audio stream: codes waiting to be decoded and its decoder slot."""

    handle: EventSink
    codes: list[np.ndarray]
    final: bool
    reason: str
    generated: int
    slot: int = -1
    timing: StreamTiming = field(default_factory=StreamTiming)

    @property
    def backlog(self) -> int:
        return sum(c.shape[1] for c in self.codes)

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` frames ``[ncb, n]`` (removed from the backlog); ``n`` <= :attr:`backlog`."""
        allc = np.concatenate(self.codes, axis=1) if len(self.codes) != 1 else self.codes[0]
        self.codes = [allc[:, n:]] if allc.shape[1] > n else []
        return allc[:, :n]


class BatchedCodec:
    """Bookkeeping around a :class:`~ttsfleet.inference.codec.SlotCodecStream` (``decoder`` None: a
    codes-only engine, whose "audio" events carry codes and no samples).

    ``cancel(handle)`` stops the engine decoding frames of a stream whose codec call failed."""

    def __init__(self, decoder: Any, max_frames: int, counters: CodecCounters,
                 cancel: Callable[[Any], None], gather_s: float = 0.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.decoder = decoder
        self.max_frames = max_frames
        self.counters = counters
        self.cancel = cancel
        self.clock = clock
        codec = getattr(decoder, "codec", None)
        frame_s = codec.frame_length / codec.sample_rate if codec is not None else 0.0
        self.gather = GatherRule(gather_s if decoder is not None else 0.0, frame_s)  # :mod:`codec_gather`
        self.jobs: dict[int, CodecJob] = {}  # insertion order = arrival order
        self.free: deque[int] = deque(range(decoder.max_slots if decoder is not None else 0))

    def apply(self, msgs: list[Any], handle_of: Callable[[Any], EventSink] = lambda h: h) -> bool:
        """Take the engine's codec messages in order; False at :class:`StopCodec` (the rest is left).
        ``handle_of`` maps a message's handle to the sink its events go to (in the codec process: the
        stand-in for the request's handle in the parent)."""
        for msg in msgs:
            match msg:
                case StopCodec():
                    return False
                case DropStream(handle=h):
                    self.drop(handle_of(h))
                case CodesChunk(handle=h):
                    self.add(handle_of(h), msg.codes, msg.final, msg.reason, msg.generated)
        return True

    def add(self, handle: EventSink, codes: np.ndarray, final: bool, reason: str, generated: int) -> None:
        job = self.jobs.get(handle.rid)
        if job is None:
            job = self.jobs[handle.rid] = CodecJob(handle, [], final, reason, generated)
        if codes.shape[1] and job.timing.waiting_since is None:
            job.timing.waiting_since = self.clock()
        job.codes.append(codes)
        job.final, job.reason, job.generated = final, reason, generated

    def drop(self, handle: EventSink) -> None:
        job = self.jobs.pop(handle.rid, None)
        if job is not None:
            self._release(job)
        handle.post(Event("done", reason="cancelled"))

    def fail_all(self, reason: str) -> None:
        """Every stream in the codec ends in an error (the codec loop died)."""
        for job in self.jobs.values():
            job.handle.post(Event("error", reason=reason))
        self.jobs.clear()

    def _release(self, job: CodecJob) -> None:
        if job.slot >= 0:
            self.decoder.reset(job.slot)
            self.free.append(job.slot)
            job.slot = -1

    def _can_decode(self, job: CodecJob) -> bool:
        return job.slot >= 0 or bool(self.free) or self.decoder is None

    def has_work(self) -> bool:
        """Whether a round would do anything now: a stream ends, or one that has or can get a decoder
        slot is due (:func:`~ttsfleet.inference.codec_gather.due`: then :meth:`_due_jobs` names at
        least it). The loop asks this every pass, so it stops at the first such stream."""
        now = self.clock()
        return any(j.final and not j.backlog for j in self.jobs.values()) or any(
            due(self.gather, j.timing, now) for j in self._decodable())

    def _decodable(self) -> list[CodecJob]:
        """The streams with codes waiting that have or can get a decoder slot."""
        return [j for j in self.jobs.values() if j.backlog and self._can_decode(j)]

    def _due_jobs(self) -> list[CodecJob]:
        """The streams a round decodes now (:func:`~ttsfleet.inference.codec_gather.select`; with no
        gather window, every one with codes waiting), of :meth:`_decodable`."""
        waiting = {j.handle.rid: j.timing for j in self._decodable()}
        return [self.jobs[rid] for rid in select(self.gather, waiting, self.clock())]

    def due_backlogs(self) -> list[int]:
        """The frames waiting in each stream a round would decode now (what a push taking each row's
        own frame count would pad to; :mod:`~ttsfleet.inference.codec_gather_sim` models it)."""
        return [j.backlog for j in self._due_jobs()]

    def wake_in(self) -> float | None:
        """Seconds the owner's loop may wait for new codes before codes already here fall due (None:
        until codes come)."""
        return wake_in(self.gather, (j.timing for j in self._decodable()), self.clock())

    def round(self) -> None:
        """Decode what the due streams have waiting, all of it: one call per frame-count group until
        they are drained, then the endings (its wall time counted in ``codec_s``). The "done" events
        go out after the count, so whoever sees a request end (a scrape of /metrics, the warm-up
        before metrics attach) sees its codec time counted. Nothing while nothing is due
        (:meth:`has_work`)."""
        if not self.has_work():
            return
        t0 = time.perf_counter()
        try:
            if self.decoder is None:
                self._codes_only()
            else:
                self._decode_groups(self._due_jobs())
            ended = self._finish_done()
        finally:
            self.counters.codec_s += time.perf_counter() - t0
        for handle, ev in ended:
            handle.post(ev)

    def _decode_groups(self, jobs: list[CodecJob]) -> None:
        """Drain ``jobs``: each pass groups them by the largest power of two of their backlog (at most
        ``max_frames``), one call per group. Why drain: a remainder left behind would still carry its
        old wait and fall due at once, a round of its own for a few frames."""
        jobs = [job for job in jobs if self._take_slot(job)]
        if jobs:
            self.counters.codec_rounds += 1
        while pending := [job for job in jobs if job.backlog and self.jobs.get(job.handle.rid) is job]:
            groups: dict[int, list[CodecJob]] = {}
            for job in pending:
                size = 1 << (min(job.backlog, self.max_frames).bit_length() - 1)
                groups.setdefault(size, []).append(job)
            for size, group in groups.items():
                self._decode(size, group)

    def _take_slot(self, job: CodecJob) -> bool:
        """Give ``job`` a decoder slot if it has none; False when none is free."""
        if job.slot < 0:
            if not self.free:
                return False
            job.slot = self.free.popleft()
        return True

    def _codes_only(self) -> None:
        for job in list(self.jobs.values()):
            if job.backlog:
                codes = job.take(job.backlog)
                job.timing.waiting_since = None
                job.handle.post(Event("audio", audio=np.zeros(0, np.float32), codes=codes,
                                      frames=codes.shape[1]))

    def _decode(self, size: int, jobs: list[CodecJob]) -> None:
        import torch

        codes = [job.take(size) for job in jobs]
        try:
            wave = self.decoder.push([j.slot for j in jobs], torch.from_numpy(np.stack(codes)))
            audio = wave.float().cpu().numpy()
        except Exception as exc:
            log.exception("codec decode failed")
            for job in jobs:
                self.jobs.pop(job.handle.rid, None)
                self._release(job)
                self.cancel(job.handle)  # stop decoding frames nobody can hear
                job.handle.post(Event("error", reason=f"codec failed: {type(exc).__name__}: {exc}"))
            return
        self.counters.codec_calls += 1
        self.counters.codec_frames += size * len(jobs)
        now = self.clock()
        for i, job in enumerate(jobs):
            t = job.timing
            t.started_at = now if t.started_at is None else t.started_at
            t.sent_frames += size
            if not job.backlog:
                t.waiting_since = None
            job.handle.post(Event("audio", audio=audio[i], codes=codes[i], frames=size))

    def _finish_done(self) -> list[tuple[EventSink, Any]]:
        """Release the streams with nothing left to decode; their "done" events, for :meth:`round`."""
        ended = []
        for rid in [r for r, j in self.jobs.items() if j.final and not j.backlog]:
            job = self.jobs.pop(rid)
            self._release(job)
            ended.append((job.handle, Event("done", frames=job.generated, reason=job.reason)))
        return ended


#: Candidate conv kernels cuDNN's autotuner times per new shape while the codec's graphs are captured
#: (``torch.backends.cudnn.benchmark_limit``; PyTorch's default is 10). Why 3: on an H200 the
#: channels-last capture of 44 graphs took 123.5 s at 10 and 55.4-60.8 s at 2-3, for pushes 1.3 %
#: slower (64 x 4: 14.67 -> 14.85 ms); 1 candidate (or the autotuner off) picks kernels 20x slower
#: (64 x 4: 291 ms) — ``benchmarks/inference_h200/2026-12-04/run13-codec-capture``. Unmeasured on
#: RTX-class GPUs, where the candidate order may differ.
CUDNN_CANDIDATES = 3


def use_conv_autotuner() -> None:
    """Let cuDNN time :data:`CUDNN_CANDIDATES` kernels per conv shape and keep the fastest, once per
    process: the codec thread and the codec process both call it before capturing."""
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.benchmark_limit = CUDNN_CANDIDATES


#: How the decoder's residual units run (issue #25): ``fused`` (default;
#: :meth:`~ttsfleet.inference.codec.Codec.use_fused_units`: Triton convs with the Snake and the
#: residual add in their epilogues, for the narrow units with many rows, channels-last decoders on a
#: Triton backend only) or ``cudnn`` (Snake kernel, cuDNN convs, a residual add). Measured side by
#: side on an H100 (2026-12-05, benchmarks/inference_h200/2026-12-05b/call2-*): a 64 x 4 push 12.35 ->
#: 11.36 ms, 128 x 4 22.62 -> 20.36, 16 x 4 5.01 -> 4.97, audio as close to float32 (20.0 dB); served
#: on an H100 (2026-12-05c call2) equal to cuDNN's units (c=64 3,542 vs 3,554 frames/s, c=128 4,295 vs
#: 4,280), within one round's noise of the ~3 % the push's 7 % would give; the H200 not yet.
CODEC_UNITS_ENV = "TTSFLEET_CODEC_UNITS"
#: The residual units' forms, by name (the switch's and the fill job's ``BatchEncoder(units=...)``).
CODEC_UNITS = ("cudnn", "fused")
CODEC_UNITS_SWITCH: ProcessSwitch[str] = ProcessSwitch(CODEC_UNITS_ENV, "fused",
                                                       one_of(CODEC_UNITS_ENV, CODEC_UNITS, "fused"))

#: The SDPA backend of the decoder's window attention in batched pushes (issue #25), on CUDA only
#: (the CPU has neither cuDNN's nor the memory-efficient kernel): ``efficient`` (default), ``auto``
#: (torch's own pick, cuDNN's on an H100/H200), ``cudnn``, ``flash``, ``math``. A push's 4 queries per
#: stream against ~130 window keys: cuDNN's 64-query tiles cost 0.69 of a 64 x 4 push's 11.4 ms.
#: Measured side by side on an H100 (benchmarks/inference_h200/2026-12-05c/call1-h100-codec-tiles/):
#: pushes 16 x 4 4.88 -> 4.89 ms, 64 x 4 11.41 -> 11.07, 128 x 4 20.38 -> 19.75 (auto -> efficient);
#: SNR vs float32 19.99 dB both; ``math`` slower (13.30 at 64 x 4).
CODEC_WINDOW_ATTENTION_ENV = "TTSFLEET_CODEC_WINDOW_ATTENTION"
#: ``auto`` and :data:`~ttsfleet.inference.codec_layers.SDPA_BACKENDS`' names (spelled out: this module
#: stays importable without torch; a test holds the two lists equal).
CODEC_WINDOW_ATTENTIONS = ("auto", "cudnn", "efficient", "flash", "math")
CODEC_WINDOW_ATTENTION_SWITCH: ProcessSwitch[str] = ProcessSwitch(
    CODEC_WINDOW_ATTENTION_ENV, "efficient",
    one_of(CODEC_WINDOW_ATTENTION_ENV, CODEC_WINDOW_ATTENTIONS, "efficient"))


def window_attention_for(device: Any) -> str:
    """The window attention backend a decoder on ``device`` (a ``torch.device``) pushes with: the
    switch's on CUDA, torch's own choice elsewhere (the switch names GPU kernels)."""
    return CODEC_WINDOW_ATTENTION_SWITCH.get() if device.type == "cuda" else "auto"


def residual_units(compile_mode: str | None) -> str:
    """How a served decoder's residual units run: as :data:`CODEC_UNITS_SWITCH` says, except that a
    compiled decoder (``--codec-compile``) keeps cuDNN's units and lets Inductor fuse their Snake and
    residual adds itself — the compiled form measured (``codec_compile.py``'s ``compiled``: on an H100,
    2026-12-06, 1.84x the fused units' graphs at 1 x 1, 1.50x at 16 x 4); Dynamo tracing through the
    fused units' Triton launches is neither tested nor measured."""
    return "cudnn" if compile_mode is not None else CODEC_UNITS_SWITCH.get()


def build_slot_decoder(codec: Any, plan: Any) -> Any:
    """The batched slot decoder of a :class:`~ttsfleet.inference.codec_process.DecoderPlan`, compiled
    if asked and its graphs captured for every stream bucket x frame count (1, 2, 4, ...
    ``plan.max_frames``): all of it before the first request, never on one. The residual units run
    as :func:`residual_units` says.

    Compiled, the log says so before the captures start, with the compiles to expect (each one then
    logs its own line, :meth:`~ttsfleet.inference.codec.SlotCodecStream._decode`): a cold compile of
    the S2 codec takes minutes, and a server whose codec process logged nothing for 396 s
    (2026-12-06b call10) could not be told from a hung one."""
    t0 = time.perf_counter()
    units = residual_units(plan.compile_mode)
    codec.use_fused_units(units == "fused")
    codec.use_window_attention(window_attention_for(codec.device))
    compile_mode = plan.compile_mode
    decoder = codec.slot_decoder(plan.slots, max_frames=plan.max_seq_len, graphs=plan.graphs,
                                 graph_max_batch=plan.graph_max_batch, compile_mode=compile_mode,
                                 channels_last=plan.channels_last)
    frames = tuple(1 << i for i in range(plan.max_frames.bit_length()))
    if decoder.compiled is not None:
        shapes = len(decoder.buckets) * len(frames)
        captures = (f"{shapes} graph captures (streams {decoder.buckets} x frames {frames})"
                    if decoder.use_graphs else "no graph captures")
        backend = decoder.compile_backend
        log.info("codec decode compile on (%s, %s backend%s): %d compiles expected (one per shape class of "
                 "frames %s: one frame, several), minutes each without a warm kernel cache, then %s",
                 compile_mode, backend if isinstance(backend, str) else type(backend).__name__,
                 _compile_threads(backend), decoder.expected_compiles(frames), frames, captures)
    n = decoder.capture(frames)  # compiled: the compiles happen here, before any capture
    if n:
        log.info("captured %d codec graphs (streams %s x frames %s, %s convs, %s units, %s window attention) "
                 "in %.1f s", n, decoder.buckets, frames, "channels-last" if decoder.channels_last else "NCL",
                 units, window_attention_for(codec.device), time.perf_counter() - t0)
    if compile_mode is not None:
        log.info("codec decode compiled (%s): %s, %d compiles, %.1f s", compile_mode,
                 "on" if decoder.compiled is not None else f"eager ({decoder.compile_error})",
                 decoder.compiles, time.perf_counter() - t0)
    return decoder


def _compile_threads(backend: str | Callable) -> str:
    """``, N Inductor compile workers`` for the start-up log (Inductor's ``compile_threads``: its
    Triton kernels compile in that many worker processes; decided from the CPUs this process may
    run on, the codec process's own as much as the server's), or nothing for another backend."""
    if backend != "inductor":
        return ""
    import torch._inductor.config as inductor_config

    return f", {inductor_config.compile_threads} Inductor compile workers"
