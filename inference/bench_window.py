"""The steady part of a closed-loop benchmark run: when every client is decoding, and nobody has left.

Why: a closed-loop level starts with a burst (``c`` requests arrive at once, so their prefill queues
and sets the first wave's time to first audio) and ends with a drain (clients run out of requests
one by one, the batch shrinks). Neither is the steady state a served pool lives in, and with few
requests per client they dominate the run: on the H200 (2026-12-01) a c=64 level of 2 requests per
client reported first-audio p50 888 ms and 1,660 frames/s, one of 10 per client 431 ms and 1,486
frames/s, and the gate could not see a planted 10 % slowdown through its 12.5 % run-to-run spread.

The window is ``[t_a, t_b]``: ``t_a`` = the moment the last request of the first wave (each
client's first) got its first audio — every client decoding from then on —, ``t_b`` = the moment
the first client finished its last request (in flight falls below ``c`` after it). Frames count
in the window pro rata of each request's audio span (first audio .. end); latencies of the
requests that *started* inside it are the steady ones, the first wave's are reported apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Timed(Protocol):
    """What a benchmark sample must carry (``ttsfleet.inference.bench.Sample`` does)."""

    ok: bool
    start_s: float  # submit time (any clock shared by the run's samples)
    ttfa_s: float  # start -> first audio
    duration_s: float  # start -> end
    frames: float
    client: int
    wave: int  # 0 = the client's first request


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def steady_window(samples: Sequence[Timed]) -> Window | None:
    """The steady window of one closed-loop run, or None where it is empty (e.g. one wave only)."""
    if not samples:
        return None
    first_wave = [s for s in samples if s.wave == 0]
    if not first_wave:
        return None
    t_a = max(s.start_s + s.ttfa_s for s in first_wave)
    last_end: dict[int, float] = {}
    for s in samples:
        last_end[s.client] = max(last_end.get(s.client, s.start_s), s.start_s + s.duration_s)
    t_b = min(last_end.values())
    if t_b <= t_a or not any(s.wave > 0 and t_a <= s.start_s <= t_b for s in samples):
        return None  # no request after the first wave runs in it: nothing steady to measure
    return Window(t_a, t_b)


def frames_in(samples: Sequence[Timed], w: Window) -> float:
    """Frames delivered inside ``w``, each request's frames spread evenly over first audio .. end."""
    total = 0.0
    for s in samples:
        if not s.ok or s.frames <= 0:
            continue
        a, b = s.start_s + s.ttfa_s, s.start_s + s.duration_s
        if b <= a:
            total += s.frames if w.start <= b <= w.end else 0.0
            continue
        overlap = max(0.0, min(b, w.end) - max(a, w.start))
        total += s.frames * overlap / (b - a)
    return total


def started_in(samples: Sequence[Timed], w: Window) -> list[Timed]:
    """The successful requests after the first wave that started inside ``w``."""
    return [s for s in samples if s.ok and s.wave > 0 and w.start <= s.start_s <= w.end]
