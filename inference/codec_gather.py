"""When the codec decodes a stream's waiting codes: at once, or after gathering more streams into
the push (``serve --codec-gather-ms``, off by default).

Why: the engine hands the codec a stream's codes in chunks (8 frames after a ramp from the first
2), and streams are out of step, so decoding whatever waits the moment it arrives makes many small
pushes — and the codec's GPU time per frame falls steeply with the push's size (H200, bf16, CUDA
graphs, 2026-12-03: 1 stream x 1 frame 2,360 us a frame, 16 x 4 116 us, 64 x 4 78 us), while at
c=64 the codec holds ~45 % of the GPU beside the decode steps (2026-12-05c).

Two kinds of round, so that one stream that cannot wait does not flush everyone's codes:

* **urgent** — a stream whose codes cannot wait without being heard: its first audio (time to first
  audio), or a listener whose audio runs out within ``guard_s``. Such a round decodes only the
  urgent streams.
* **gathered** — once any stream's codes have waited ``window_s``, the round decodes *every* stream
  with codes waiting: the push is as large as the window allowed.

A stream's last chunk waits like any other (its listener still has audio buffered; the request ends
at most a window later). Why the rule changed (2026-12-05, twelfth session): the first rule made any
stream within twice the window of running dry — and every last chunk — due at once and flushed every
stream with it; at c=64 such streams came every ~9 ms, so a 100 ms window never expired and pushes
stayed at ~38 frames (35.7 without it; ``benchmarks/inference_h200/2026-12-05d/call2-*``).

The rule is pure: the codec thread and the codec process ask it the same questions and sleep until
:func:`wake_in`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: How close to running dry a listener may come before its codes go at once (seconds of audio left):
#: a gathered push of 64 streams x 8 frames beside the decode steps takes ~20-30 ms on an H100
#: (2026-12-05c: a 64 x 4 push 11 ms alone, 8 ms for ~36 frames beside the steps), so 50 ms covers a
#: push already running plus the urgent one after it.
DRY_GUARD_S = 0.05


@dataclass(frozen=True)
class GatherRule:
    """``window_s``: the longest a chunk waits for company (0: never); ``frame_s``: seconds of audio
    per frame (the codec's ``frame_length / sample_rate``); ``guard_s``: see :data:`DRY_GUARD_S`."""

    window_s: float = 0.0
    frame_s: float = 0.0
    guard_s: float = DRY_GUARD_S

    def __post_init__(self) -> None:
        if min(self.window_s, self.frame_s, self.guard_s) < 0:
            raise ValueError(f"codec gather window {self.window_s} s / frame {self.frame_s} s / guard "
                             f"{self.guard_s} s: must be >= 0")


@dataclass
class StreamTiming:
    """What the rule needs of one stream: when its waiting codes began to wait (None: none wait),
    when its first audio was decoded (None: not yet) and how many frames it has been sent."""

    waiting_since: float | None = None
    started_at: float | None = None
    sent_frames: int = 0


def urgent_at(rule: GatherRule, s: StreamTiming) -> float | None:
    """From when ``s``'s waiting codes cannot wait without being heard (-inf: now, whatever the time;
    None: nothing waits). Without a window, every waiting chunk is urgent."""
    if s.waiting_since is None:
        return None
    if rule.window_s <= 0 or s.started_at is None:
        return float("-inf")
    return s.started_at + s.sent_frames * rule.frame_s - rule.guard_s  # the listener's audio ends then


def expires_at(rule: GatherRule, s: StreamTiming) -> float | None:
    """When ``s``'s codes have waited the whole window (None: nothing waits)."""
    return None if s.waiting_since is None else s.waiting_since + rule.window_s


def due_at(rule: GatherRule, s: StreamTiming) -> float | None:
    """The first time from which ``s`` makes a round happen (urgent, or its window over)."""
    times = [t for t in (urgent_at(rule, s), expires_at(rule, s)) if t is not None]
    return min(times) if times else None


def due(rule: GatherRule, s: StreamTiming, now: float) -> bool:
    at = due_at(rule, s)
    return at is not None and at <= now


def select(rule: GatherRule, streams: dict[int, StreamTiming], now: float) -> list[int]:
    """The keys of the streams a round decodes now: every waiting one once any window is over, else
    the urgent ones (empty: no round)."""
    waiting = [k for k, s in streams.items() if s.waiting_since is not None]
    if any(expires_at(rule, streams[k]) <= now for k in waiting):
        return waiting
    return [k for k in waiting if urgent_at(rule, streams[k]) <= now]


def wake_in(rule: GatherRule, streams: Iterable[StreamTiming], now: float) -> float | None:
    """Seconds until the first waiting stream falls due (0: one is due; None: nothing waits): how long
    the codec may sleep when no new codes come."""
    times = [t for t in (due_at(rule, s) for s in streams) if t is not None]
    return max(0.0, min(times) - now) if times else None
