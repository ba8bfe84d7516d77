"""Traffic traces for the simulator: the embedded diurnal generator and CSV loading.

A trace is a request arrival rate per second (1 s resolution) plus the mean audio length of the
requests arriving in that second (in decoded frames; 21.53 frames = 1 s of audio). The generator
is deterministic for a seed, so the same trace always gives the same report.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ttsfleet.catalog import GpuCatalog
from ttsfleet.errors import UserError

DAY_S = 86400

#: Typical read-speech rate: ~15 characters of text per second of audio.
SPEECH_CHARS_PER_S = 15.0
#: Decoded frames per second of audio: the codec's 44.1 kHz at 2048 samples per frame
#: (``inference/codec.py``); traces count audio in frames.
FRAMES_PER_AUDIO_SECOND = 44100 / 2048
FRAMES_PER_CHAR = FRAMES_PER_AUDIO_SECOND / SPEECH_CHARS_PER_S

#: The embedded trace of ``ttsfleet simulate`` (and of the benchmark's default case).
EMBEDDED_DAYS = 3.0
#: Peak demand of the embedded trace as a share of the fleet's peak decode capacity (each GPU's
#: curve peak, summed: since 2026-12-04 the H200's at c=128, the RTX classes' at their 64 slots): a
#: property of the trace, not a measurement. Solved, not chosen
#: (:mod:`ttsfleet.sim.calibrate`, benchmarks/simulate/calibrate_load.py): the share at which the
#: default fleet's inference-only run of the embedded 3-day trace reads 50% GPU-busy, the ~50% the
#: source write-up starts from, on the catalog's served curves and the scenario's sizing (40 in
#: flight): 0.459, 49.7% (benchmarks/simulate/load-calibration-2026-12-04c.json, on run15's H200 curve,
#: the final defaults). Before: 0.486 on run10's curve (channels-last codec;
#: load-calibration-2026-12-04b.json), 0.455 on run5's (load-calibration-2026-12-04.json), 0.534 on
#: 2026-12-03's curve (64 slots, busy not measured; load-calibration-2026-12-03.json), 0.3 chosen by
#: hand on 2026-12-01 (16 in flight on that day's curve: 34.3% on today's curve and sizing).
#: tests/core/test_sim_calibration.py fails when the curves, the sizing or the trace move under it.
EMBEDDED_PEAK_LOAD = 0.459
EMBEDDED_MEAN_FRAMES = 220.0
EMBEDDED_SEED = 7


@dataclass(frozen=True)
class Trace:
    """Arrival rate (requests/s) and mean frames per request, one entry per second."""

    rate: np.ndarray  # float64 [seconds]
    mean_frames: np.ndarray  # float64 [seconds]
    name: str = "trace"
    #: Requests per second to replay exactly (a request-level trace, :mod:`ttsfleet.sim.tracefiles`);
    #: None: arrivals are drawn as Poisson counts of ``rate``.
    counts: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.rate.shape != self.mean_frames.shape or self.rate.ndim != 1:
            raise ValueError("rate and mean_frames must be 1-D arrays of equal length")
        if self.counts is not None and self.counts.shape != self.rate.shape:
            raise ValueError("counts must have the shape of rate")
        if len(self.rate) == 0:
            raise UserError(f"{self.name}: trace is empty")
        if np.any(self.rate < 0) or np.any(~np.isfinite(self.rate)):
            raise UserError(f"{self.name}: arrival rates must be finite and >= 0")
        if np.any(self.mean_frames <= 0):
            raise UserError(f"{self.name}: mean frames per request must be > 0")

    @property
    def seconds(self) -> int:
        return int(len(self.rate))

    def arrivals(self, seed: int) -> np.ndarray:
        """Arrivals per second: the replayed counts, else Poisson counts (deterministic for the seed)."""
        if self.counts is not None:
            return self.counts.astype(np.float64)
        rng = np.random.default_rng(seed)
        return rng.poisson(self.rate).astype(np.float64)

    def scaled(self, factor: float) -> Trace:
        """The same trace at ``factor`` times the request rate (``--trace-scale``)."""
        if not (math.isfinite(factor) and factor > 0):
            raise UserError(f"trace scale must be > 0, got {factor}")
        if factor == 1.0:
            return self
        counts = None if self.counts is None else self.counts * factor
        return Trace(self.rate * factor, self.mean_frames, self.name, counts)

    def window(self, start_s: float = 0.0, duration_s: float | None = None) -> Trace:
        """The part of the trace from ``start_s`` lasting ``duration_s`` (to the end if None)."""
        if start_s < 0 or (duration_s is not None and duration_s <= 0):
            raise UserError("the trace window needs start >= 0 and duration > 0")
        lo = int(start_s)
        hi = self.seconds if duration_s is None else min(self.seconds, lo + int(math.ceil(duration_s)))
        if lo >= hi:
            raise UserError(f"{self.name}: the window starting at {start_s:g} s is past its end "
                            f"({self.seconds} s)")
        if lo == 0 and hi == self.seconds:
            return self
        counts = None if self.counts is None else self.counts[lo:hi]
        return Trace(self.rate[lo:hi], self.mean_frames[lo:hi], self.name, counts)

    def concat(self, other: Trace) -> Trace:
        """This trace followed by ``other``."""
        counts = (None if self.counts is None or other.counts is None
                  else np.concatenate([self.counts, other.counts]))
        return Trace(np.concatenate([self.rate, other.rate]),
                     np.concatenate([self.mean_frames, other.mean_frames]), self.name, counts)

    def peak_frames_per_s(self, window_s: int = 60) -> float:
        """The highest mean demand over ``window_s`` windows, in decoded frames per second."""
        demand = self.rate * self.mean_frames
        n = self.seconds // window_s * window_s
        if n == 0:
            return float(demand.mean())
        return float(demand[:n].reshape(-1, window_s).mean(axis=1).max())

    def with_peak_load(self, share: float, catalog: GpuCatalog, fleet: Mapping[str, int]) -> Trace:
        """Scaled so its peak minute loads ``fleet`` to ``share`` of its peak decode capacity, the
        way the embedded trace is sized (:func:`peak_rps_for`)."""
        if share <= 0:
            raise UserError(f"peak load must be > 0, got {share}")
        capacity = sum(n * catalog.get(c).capacity.peak_frames_per_s for c, n in fleet.items())
        peak = self.peak_frames_per_s()
        if peak <= 0:
            raise UserError(f"{self.name}: the trace has no requests to scale")
        return self.scaled(share * capacity / peak)


def peak_rps_for(load_share: float, catalog: GpuCatalog, fleet: Mapping[str, int],
                 mean_frames: float = EMBEDDED_MEAN_FRAMES) -> float:
    """The peak request rate at which ``fleet`` is loaded to ``load_share`` of its peak decode
    capacity (requests of ``mean_frames`` frames each)."""
    if load_share <= 0:
        raise UserError(f"peak load must be > 0, got {load_share}")
    frames = sum(n * catalog.get(name).capacity.peak_frames_per_s for name, n in fleet.items())
    return load_share * frames / mean_frames


def diurnal(days: float = EMBEDDED_DAYS, *, peak_rps: float, trough_ratio: float = 0.12,
            weekend_factor: float = 0.8, burst_per_day: float = 6.0, burst_gain: tuple[float, float] =
            (1.15, 1.45), burst_minutes: tuple[float, float] = (3.0, 20.0),
            mean_frames: float = EMBEDDED_MEAN_FRAMES, peak_hour: float = 15.0, noise: float = 0.04,
            seed: int = EMBEDDED_SEED, name: str = "diurnal") -> Trace:
    """A multi-day diurnal trace with weekday/weekend levels and random bursts.

    Shape: a raised cosine with its peak at ``peak_hour`` and its trough at
    ``trough_ratio × peak``, a slow random walk (``noise``), weekend days scaled by
    ``weekend_factor``, and Poisson-distributed bursts that multiply the rate by a random gain
    for a few minutes. Request length varies with the hour (longer texts at night).
    """
    if days <= 0:
        raise UserError("days must be > 0")
    if peak_rps <= 0:
        raise UserError("peak rate must be > 0")
    rng = np.random.default_rng(seed)
    n = int(days * DAY_S)
    t = np.arange(n, dtype=np.float64)
    hour = (t / 3600.0) % 24.0
    phase = 2 * math.pi * (hour - peak_hour) / 24.0
    shape = trough_ratio + (1 - trough_ratio) * (0.5 + 0.5 * np.cos(phase)) ** 1.6
    day_idx = (t // DAY_S).astype(int)
    weekend = np.isin(day_idx % 7, (5, 6))
    level = np.where(weekend, weekend_factor, 1.0)
    # Slow multiplicative wander, 10-minute knots, so no two days are identical.
    knots = int(n // 600) + 2
    walk = np.exp(np.cumsum(rng.normal(0, noise, knots)) * 0.25)
    walk /= walk.mean()
    wander = np.interp(t, np.arange(knots) * 600.0, walk)
    rate = peak_rps * shape * level * wander
    n_bursts = rng.poisson(burst_per_day * days)
    for _ in range(n_bursts):
        start = int(rng.uniform(0, n))
        length = int(rng.uniform(*burst_minutes) * 60)
        gain = rng.uniform(*burst_gain)
        ramp = min(60, max(length // 4, 1))
        env = np.ones(length)
        env[:ramp] = np.linspace(0, 1, ramp)
        env[-ramp:] = np.minimum(env[-ramp:], np.linspace(1, 0, ramp))
        end = min(n, start + length)
        rate[start:end] *= 1 + (gain - 1) * env[: end - start]
    frames = mean_frames * (1.0 + 0.25 * np.cos(2 * math.pi * (hour - 3.0) / 24.0))
    return Trace(rate=rate, mean_frames=frames, name=name)


def load_csv(path: str | Path, *, default_mean_frames: float = 220.0) -> Trace:
    """Load a trace CSV.

    Columns: ``t`` (seconds from the start, ascending) and either ``rate`` (requests/s from
    this row until the next) or ``arrivals`` (requests in that second); optional
    ``mean_frames`` (decoded frames per request) or ``text_chars`` (characters per request,
    converted at ``FRAMES_PER_CHAR``: ~15 characters per second of audio).
    Rows may be at any resolution; values hold until the next row.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"trace file not found: {p}")
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise UserError(f"cannot read trace {p}: {exc.strerror}") from None
    with fh:
        reader = csv.DictReader(fh)
        cols = set(reader.fieldnames or [])
        if "t" not in cols or not ({"rate", "arrivals"} & cols):
            raise UserError(f"{p}: header must have 't' and 'rate' or 'arrivals' columns, "
                            f"got {sorted(cols) or 'nothing'}")
        ts: list[float] = []
        rates: list[float] = []
        frames: list[float] = []
        for lineno, row in enumerate(reader, start=2):
            try:
                t = float(row["t"])
                if "rate" in cols and row.get("rate") not in (None, ""):
                    r = float(row["rate"])
                else:
                    r = float(row["arrivals"])
                if "mean_frames" in cols and row.get("mean_frames"):
                    f = float(row["mean_frames"])
                elif "text_chars" in cols and row.get("text_chars"):
                    f = float(row["text_chars"]) * FRAMES_PER_CHAR
                else:
                    f = default_mean_frames
            except (TypeError, ValueError):
                raise UserError(f"{p}:{lineno}: malformed row {dict(row)!r}") from None
            if not (math.isfinite(t) and math.isfinite(r) and math.isfinite(f)):
                raise UserError(f"{p}:{lineno}: values must be finite")
            if r < 0:
                raise UserError(f"{p}:{lineno}: negative arrival rate {r}")
            if f <= 0:
                raise UserError(f"{p}:{lineno}: frames per request must be > 0")
            if ts and t <= ts[-1]:
                raise UserError(f"{p}:{lineno}: t must increase (got {t} after {ts[-1]})")
            if t < 0:
                raise UserError(f"{p}:{lineno}: t must be >= 0")
            ts.append(t)
            rates.append(r)
            frames.append(f)
    if not ts:
        raise UserError(f"{p}: no data rows")
    step = (ts[-1] - ts[-2]) if len(ts) > 1 else 1.0
    n = int(math.ceil(ts[-1] + step))
    idx = np.searchsorted(np.asarray(ts), np.arange(n, dtype=np.float64), side="right") - 1
    idx = np.clip(idx, 0, len(ts) - 1)
    rate = np.asarray(rates)[idx]
    rate[np.arange(n) < ts[0]] = 0.0
    return Trace(rate=rate, mean_frames=np.asarray(frames)[idx], name=p.name)
