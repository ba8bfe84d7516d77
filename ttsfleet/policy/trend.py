"""The least-squares load trend both forecasts read: fill head-room and the autoscaler's.

One fit, two uses. :func:`ttsfleet.policy.demand.demand_trend` extrapolates the inference GPUs a
class holds (fill keeps them empty ahead of need); :func:`ttsfleet.policy.decide_replicas`
extrapolates the requests a deployment carries to the moment a replica ordered now is ready.
Only growth is extrapolated anywhere: a falling trend never releases capacity early. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple


class Trend(NamedTuple):
    """A least-squares line through samples: its value at the newest sample's time, and slope."""

    t: float  # the newest sample's time
    value: float  # the line's value at ``t``
    slope: float  # per second
    last: float  # the newest sample's value
    slope_stderr: float = float("inf")  # standard error of the slope (inf: under 3 samples)

    def at(self, horizon_s: float) -> float:
        """The line's value ``horizon_s`` after :attr:`t`, extrapolating growth only."""
        return self.value + max(self.slope, 0.0) * horizon_s


def fit_trend(history: Sequence[tuple[float, float]], now: float, window_s: float) -> Trend | None:
    """The least-squares line through the samples of ``(now - window_s, now]`` (and one at
    ``now - window_s`` exactly); None without samples, a flat line through a single one."""
    pts = [(t, v) for (t, v) in history if now - window_s <= t <= now]
    if not pts:
        return None
    t_last, last = pts[-1]
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    if n < 2 or var <= 0:
        return Trend(t_last, last, 0.0, last)
    slope = sum((t - mt) * (v - mv) for t, v in pts) / var
    stderr = float("inf")
    if n > 2:
        resid = sum((v - mv - slope * (t - mt)) ** 2 for t, v in pts)
        stderr = math.sqrt(resid / (n - 2) / var)
    return Trend(t_last, mv + slope * (t_last - mt), slope, last, stderr)
