"""Loudness normalization (ITU-R BS.1770 via pyloudnorm) and a look-ahead peak limiter."""

from __future__ import annotations

import numpy as np

_LOOKAHEAD_S = 0.005


def measure_lufs(x: np.ndarray, rate: int) -> float:
    """Integrated loudness in LUFS (-inf for silence or audio shorter than one 400 ms block)."""
    import pyloudnorm

    if len(x) < int(0.4 * rate) + 1:
        return float("-inf")
    return float(pyloudnorm.Meter(rate).integrated_loudness(x.astype(np.float64)))


def limit_peaks(x: np.ndarray, rate: int, ceiling_dbfs: float) -> np.ndarray:
    """Keep every sample within ``ceiling_dbfs`` with a smooth gain curve (5 ms look-ahead)."""
    from scipy.ndimage import minimum_filter1d, uniform_filter1d

    ceiling = 10 ** (ceiling_dbfs / 20)
    need = np.minimum(1.0, ceiling / np.maximum(np.abs(x), 1e-12))
    if need.min() >= 1.0:
        return x
    look = max(1, int(_LOOKAHEAD_S * rate))
    gain = uniform_filter1d(minimum_filter1d(need, 2 * look + 1), look)
    return (x * np.minimum(gain, need)).astype(np.float32)


def normalize(x: np.ndarray, rate: int, target_lufs: float,
              ceiling_dbfs: float) -> tuple[np.ndarray, float, float]:
    """Gain ``x`` to ``target_lufs`` and limit peaks; returns (audio, LUFS before, LUFS after).

    When the limiter takes loudness away, the gain is raised and the limiter rerun (at most four
    rounds), so loud targets are met too as long as the limiting stays moderate.
    """
    before = measure_lufs(x, rate)
    if not np.isfinite(before):
        return limit_peaks(x, rate, ceiling_dbfs), before, before
    gain_db = target_lufs - before
    x64 = x.astype(np.float64)
    for _ in range(4):
        y = limit_peaks((x64 * 10 ** (gain_db / 20)).astype(np.float32), rate, ceiling_dbfs)
        after = measure_lufs(y, rate)
        if not np.isfinite(after) or abs(after - target_lufs) <= 0.1:
            break
        gain_db += target_lufs - after
    return y, before, after
