"""Quality measurements behind the reject reasons: clipping, silence, SNR, speech rate.

Pure numpy functions of the decoded audio; the thresholds live in
:class:`~ttsfleet.fill_jobs.settings.CleaningConfig` and the decisions in the pipeline.
"""

from __future__ import annotations

import numpy as np

_FRAME_S = 0.02


def clipping_ratio(x: np.ndarray, level: float = 0.99) -> float:
    """Fraction of samples at or above ``level`` of full scale (measured before resampling)."""
    return float(np.count_nonzero(np.abs(x) >= level)) / max(len(x), 1)


def is_silent(x: np.ndarray, floor_dbfs: float = -60.0) -> bool:
    """True when the RMS level is below ``floor_dbfs`` (used when VAD is not enabled)."""
    rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) if len(x) else 0.0
    return 20 * np.log10(rms + 1e-12) < floor_dbfs


def _frame_power(x: np.ndarray, frame: int) -> np.ndarray:
    n = len(x) // frame
    return np.mean(x[: n * frame].reshape(n, frame).astype(np.float64) ** 2, axis=1) if n else np.zeros(0)


def estimate_snr_db(x: np.ndarray, rate: int, speech: list[tuple[int, int]] | None) -> float:
    """Estimated SNR in dB (clamped to [-20, 100]).

    Noise power: the 10th percentile of 20 ms frame powers (pauses between words hold noise
    only), or the median power of the frames outside speech regions when that is lower; signal
    power: the mean frame power inside speech regions (above the median frame without VAD) minus
    the noise power.
    """
    frame = max(1, int(_FRAME_S * rate))
    p = _frame_power(x, frame)
    if p.size == 0:
        return -20.0
    noise = float(np.percentile(p, 10))
    if speech:
        mask = np.zeros(p.size, bool)
        for a, b in speech:
            mask[a // frame: max(a // frame + 1, b // frame)] = True
        sig = p[mask] if mask.any() else p
        if np.count_nonzero(~mask) >= 5:
            noise = min(noise, float(np.median(p[~mask])))
    else:
        sig = p[p >= np.median(p)]
    signal = max(float(np.mean(sig)) - noise, 1e-12)
    return float(np.clip(10 * np.log10(signal / max(noise, 1e-12)), -20.0, 100.0))


def chars_per_second(text: str, seconds: float) -> float:
    """Transcript letters and digits per second of speech."""
    n = sum(ch.isalnum() for ch in text)
    return n / seconds if seconds > 0 else float("inf")
