"""When the codec decodes a stream's waiting codes: at once, or after gathering more streams into
the push (``serve --codec-gather-ms``, off by default).

Why: the engine hands the codec a stream's codes in chunks (8 frames after the first 2), and
streams are out of step, so decoding whatever waits the moment it arrives makes many small pushes
— and the codec's GPU time per frame falls steeply with the push's size (H200, bf16, CUDA graphs,
2026-12-03: 1 stream x 1 frame 2,360 us a frame, 16 x 4 116 us, 64 x 4 78 us), while at c=64 the
GPU is busy 98 % of the time with the codec beside the decode steps (2026-12-04). Holding a chunk for
a few milliseconds lets the chunks of other streams join its push; once anything is due, the round
decodes *every* stream with codes waiting, so a push is as large as the wait allowed.

A stream's codes never wait when waiting could be heard: its first audio goes at once (time to first
audio), and so does a stream whose listener would run out of audio within twice the window (the
audio sent so far, against the time since its first audio); its last chunk goes at once too, so a
request ends when its audio does. The rule is pure: the codec thread and the codec process ask it
the same question and sleep until :func:`wake_in`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GatherRule:
    """``window_s``: the longest a chunk waits for company (0: never); ``frame_s``: seconds of audio
    per frame (the codec's ``frame_length / sample_rate``)."""

    window_s: float = 0.0
    frame_s: float = 0.0

    def __post_init__(self) -> None:
        if self.window_s < 0 or self.frame_s < 0:
            raise ValueError(f"codec gather window {self.window_s} s / frame {self.frame_s} s: must be >= 0")


@dataclass
class StreamTiming:
    """What the rule needs of one stream: when its waiting codes began to wait (None: none wait),
    when its first audio was decoded (None: not yet), how many frames it has been sent, and whether
    its last chunk is among those waiting."""

    waiting_since: float | None = None
    started_at: float | None = None
    sent_frames: int = 0
    final: bool = False


def due_at(rule: GatherRule, s: StreamTiming) -> float | None:
    """The time from which ``s``'s waiting codes are due (-inf: now, whatever the time; None: nothing
    waits)."""
    if s.waiting_since is None:
        return None
    if rule.window_s <= 0 or s.started_at is None or s.final:
        return float("-inf")
    runs_out = s.started_at + s.sent_frames * rule.frame_s  # the listener's audio ends then
    return min(s.waiting_since + rule.window_s, runs_out - 2 * rule.window_s)


def due(rule: GatherRule, s: StreamTiming, now: float) -> bool:
    at = due_at(rule, s)
    return at is not None and at <= now


def wake_in(rule: GatherRule, streams: Iterable[StreamTiming], now: float) -> float | None:
    """Seconds until the first waiting stream falls due (0: one is due; None: nothing waits): how long
    the codec may sleep when no new codes come."""
    times = [t for t in (due_at(rule, s) for s in streams) if t is not None]
    return max(0.0, min(times) - now) if times else None
