"""The codec's gather rule at scale on a clock of our own: many streams' chunks arriving out of step,
the real :class:`~ttsfleet.inference.codec_batch.BatchedCodec` deciding and decoding them (any codec:
the tiny one on a CPU), each round advancing the clock by a push cost of the served codec's form — a
fixed part per call and a part per frame.

Why a simulation: what a gather window buys on a GPU is fewer codec calls (a call's cost is mostly
fixed at the served path's sizes: an H100 push of 16 x 4 frames 4.9 ms, 64 x 4 11.1 ms,
2026-12-05c), and whether it buys them depends on how chunks arrive, which a test can set exactly
and a served run only samples. It counts rounds and calls (real: the codec's own counters) and what
each listener would hear (:mod:`ttsfleet.inference.bench_playback`); the seconds are the model's.
``tests/inference_server/test_codec_gather_streams.py`` holds the rule to it, and
``benchmarks/inference_serve/gather_model.py`` tabulates it.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
from ttsfleet.inference.bench_playback import Playback
from ttsfleet.inference.codec_batch import BatchedCodec
from ttsfleet.inference.engine_messages import Event, GenerationRequest


@dataclass(frozen=True)
class SimConfig:
    """``streams`` of ``frames`` each, decoded by the engine at ``frames_per_s`` a stream (58: c=64 on an
    H100, 2026-12-05d), sent in the engine's chunk ramp from ``first_chunk`` to ``chunk`` frames; a
    codec call costs ``call_s`` + ``frame_s`` per frame; ``max_frames``: the largest call per stream."""

    streams: int = 32
    frames: int = 64
    frames_per_s: float = 58.0
    call_s: float = 0.003
    frame_s: float = 0.00003
    first_chunk: int = 1
    chunk: int = 4
    max_frames: int = 8

    def cost_s(self, calls: int, frames: int) -> float:
        """What ``calls`` codec calls decoding ``frames`` frames in all cost in the model."""
        return self.call_s * calls + self.frame_s * frames


@dataclass(frozen=True)
class SimResult:
    """What one run counted: the codec's own counters (rounds, calls, frames), the underruns every
    listener would hear, and the same rounds as a ragged push would make them."""

    rounds: int
    calls: int
    frames: int
    underruns: int  # summed over every listener
    seconds: float  # the simulated clock at the end
    #: What a ragged push (each row its own frame count, padded to the round's longest) would make of
    #: the same rounds: its calls, and the frames it would compute, padding included.
    ragged_calls: int = 0
    ragged_frames: int = 0

    @property
    def calls_per_round(self) -> float:
        return self.calls / max(self.rounds, 1)

    @property
    def frames_per_call(self) -> float:
        return self.frames / max(self.calls, 1)


class _Listener:
    """A stream's sink: the frames of each audio event, stamped when its round has finished."""

    def __init__(self, rid: int) -> None:
        self.rid, self.fresh, self.heard = rid, [], []

    def post(self, ev: Event) -> None:
        if ev.kind == "audio":
            self.fresh.append(ev.frames)

    def stamp(self, t: float) -> None:
        self.heard += [(t, n) for n in self.fresh]
        self.fresh = []

    def underruns(self, seconds_per_frame: float) -> int:
        play = Playback()
        for t, n in self.heard:
            play.feed(t, n * seconds_per_frame)
        return play.stalls


@dataclass
class _Ragged:
    """A ragged push's count of the rounds: per round, calls of up to ``max_frames`` frames a row until
    the longest backlog is decoded, every row computed to the call's length."""

    calls: int = 0
    frames: int = 0

    def add(self, backlogs: list[int], max_frames: int) -> None:
        if backlogs:
            longest = max(backlogs)
            self.calls += -(-longest // max_frames)
            self.frames += len(backlogs) * longest


def arrivals(cfg: SimConfig) -> list[tuple[float, int, int, bool]]:
    """(time, stream, frames, last) of every chunk: streams staggered across one stream's length, each
    chunk when its last frame is decoded, in the engine's chunk ramp."""
    ramp = GenerationRequest(prompt=None, sampling=None, max_new_tokens=cfg.frames,
                             first_chunk_frames=cfg.first_chunk, chunk_frames=cfg.chunk)
    out = []
    for i in range(cfg.streams):
        start, sent, n = i * cfg.frames / cfg.frames_per_s / cfg.streams, 0, 0
        while sent < cfg.frames:
            k = min(ramp.chunk_frames_after(n), cfg.frames - sent)
            sent, n = sent + k, n + 1
            out.append((start + sent / cfg.frames_per_s, i, k, sent == cfg.frames))
    return sorted(out)


def simulate(codec: object, cfg: SimConfig, window_s: float, seed: int = 0) -> SimResult:
    """Every chunk of ``cfg`` through a :class:`BatchedCodec` of ``codec`` with a ``window_s`` gather
    window; the codec's counters and the listeners' underruns."""
    clock = [0.0]
    counters = types.SimpleNamespace(codec_calls=0, codec_frames=0, codec_s=0.0, codec_rounds=0)
    batched = BatchedCodec(codec.slot_decoder(cfg.streams), cfg.max_frames, counters, cancel=lambda h: None,
                           gather_s=window_s, clock=lambda: clock[0])
    listeners, rng = [_Listener(i) for i in range(cfg.streams)], np.random.default_rng(seed)
    chunks, i, ragged = arrivals(cfg), 0, _Ragged()
    while i < len(chunks) or batched.jobs:
        while i < len(chunks) and chunks[i][0] <= clock[0]:
            _, s, k, last = chunks[i]
            batched.add(listeners[s], rng.integers(0, 100, (codec.num_codebooks, k)), last, "length", 0)
            i += 1
        if batched.has_work():
            ragged.add(batched.due_backlogs(), cfg.max_frames)
            clock[0] += _round_seconds(batched, counters, cfg)
            for listener in listeners:
                listener.stamp(clock[0])
            continue
        due, wait = chunks[i][0] if i < len(chunks) else float("inf"), batched.wake_in()
        clock[0] = due if wait is None else min(due, clock[0] + wait)
    per_frame = codec.frame_length / codec.sample_rate
    return SimResult(counters.codec_rounds, counters.codec_calls, counters.codec_frames,
                     sum(listener.underruns(per_frame) for listener in listeners), clock[0],
                     ragged.calls, ragged.frames)


def _round_seconds(batched: BatchedCodec, counters: types.SimpleNamespace, cfg: SimConfig) -> float:
    """One round of ``batched``; what its calls cost in the model."""
    calls, frames = counters.codec_calls, counters.codec_frames
    batched.round()
    return cfg.cost_s(counters.codec_calls - calls, counters.codec_frames - frames)
