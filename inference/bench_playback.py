"""What a listener hears of a streamed reply: its audio played from the first byte on, paused
whenever the next bytes arrive after everything received so far has played out (an underrun).

Why the benchmark counts them: time to first audio and the real-time factor say when audio starts
and how long the whole reply took, not whether it *plays* without gaps. A server can meet both and
still leave its listener silent between chunks — a 1-frame first chunk followed by a 4-frame one
decoded at 58 frames/s a stream (c=64, 2026-12-05) arrives ~69 ms after 46 ms of audio — and a codec
that holds chunks to gather them (:mod:`ttsfleet.inference.codec_gather`) must never do so. The
listener here has no jitter buffer beyond what has arrived: the strictest reading, the one time to
first audio implies; gaps under :data:`MIN_STALL_S` are the client's own read timing and not counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

#: The shortest gap counted as an underrun (seconds): an asyncio read's own timing jitter is ~1 ms.
MIN_STALL_S = 0.002


@dataclass
class Playback:
    """Feed it each read's arrival time and seconds of audio; it keeps the underruns."""

    end: float | None = None  # when the audio received so far finishes playing
    stalls: int = 0
    stall_s: float = 0.0
    received_s: float = 0.0  # seconds of audio fed so far
    #: Seconds of audio that had played when the first underrun began (None: none yet): where in a
    #: reply the listener first runs dry — at the first chunk's end, or later.
    first_stall_at_s: float | None = None

    def feed(self, t: float, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.end is None:
            self.end = t
        gap = t - self.end
        if gap > MIN_STALL_S:
            self.stalls += 1
            self.stall_s += gap
            if self.first_stall_at_s is None:
                self.first_stall_at_s = self.received_s  # all of it has played: the gap is silence
        self.end = max(self.end, t) + seconds
        self.received_s += seconds


def first_stall_p50(first_stalls: Iterable[float | None]) -> float:
    """The median over streams that ran dry of the audio seconds played before their first underrun
    (NaN when none did)."""
    at = [s for s in first_stalls if s is not None]
    return float(np.median(at)) if at else math.nan


def underrun_tail(played: Iterable[tuple[int, float]]) -> tuple[float, float]:
    """Over the streams that played (each its underruns and summed silence in seconds): the share with
    one or more and the p99 of their silence (NaN, NaN without any)."""
    played = list(played)
    if not played:
        return math.nan, math.nan
    return (sum(n > 0 for n, _ in played) / len(played),
            float(np.percentile([silence for _, silence in played], 99)))
