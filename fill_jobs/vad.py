"""Voice activity detection with silero-vad: trimming and splitting at pauses.

silero-vad's model ships inside its pip package (no download). It runs on a 16 kHz copy of the
audio; its region edges (32 ms resolution) are then refined on the full-rate signal to the first
and last 5 ms frame within 40 dB of the loudest one, and padded by ``trimPadMs``. Recordings
longer than ``maxSegmentSeconds`` are cut in the middle of pauses between speech regions.
"""

from __future__ import annotations

import warnings

import numpy as np
from ttsfleet.fill_jobs.audio_io import resample
from ttsfleet.fill_jobs.settings import CleaningConfig

VAD_RATE = 16000
_REFINE_S = 0.12  # how far around silero's edge the energy refinement looks
_FRAME_S = 0.005
_RANGE_DB = 40.0


class SileroVad:
    """The silero model, loaded once per process (CPU, one thread: deterministic)."""

    def __init__(self, config: CleaningConfig) -> None:
        import torch
        from silero_vad import load_silero_vad

        torch.set_num_threads(1)
        self.config = config
        with warnings.catch_warnings():  # silero loads a TorchScript model; torch calls that deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            self.model = load_silero_vad()

    def speech_regions(self, x: np.ndarray, rate: int) -> list[tuple[int, int]]:
        """Speech regions of ``x`` as ``(start, end)`` sample indices at ``rate``."""
        import torch
        from silero_vad import get_speech_timestamps

        x16 = resample(x, rate, VAD_RATE)
        with torch.no_grad():
            stamps = get_speech_timestamps(
                torch.from_numpy(np.ascontiguousarray(x16)), self.model, sampling_rate=VAD_RATE,
                threshold=self.config.vad_threshold, min_silence_duration_ms=self.config.vad_min_silence_ms,
                speech_pad_ms=0)
        self.model.reset_states()
        scale = rate / VAD_RATE
        return [(int(s["start"] * scale), min(int(s["end"] * scale), len(x))) for s in stamps]


def _frame_db(x: np.ndarray, frame: int) -> np.ndarray:
    n = len(x) // frame
    if n == 0:
        return np.full(1, -120.0)
    e = np.mean(x[: n * frame].reshape(n, frame).astype(np.float64) ** 2, axis=1)
    return 10 * np.log10(e + 1e-12)


def energy_bounds(x: np.ndarray, rate: int) -> tuple[int, int]:
    """First and last 5 ms frame within 40 dB of the loudest (a VAD-free trim, used by ``dedup``
    when the ``vad`` stage is off)."""
    frame = max(1, int(_FRAME_S * rate))
    db = _frame_db(x, frame)
    loud = np.flatnonzero(db > float(db.max()) - _RANGE_DB)
    if loud.size == 0:
        return 0, len(x)
    return int(loud[0] * frame), min(len(x), int((loud[-1] + 1) * frame))


def trim_bounds(x: np.ndarray, rate: int, regions: list[tuple[int, int]], pad_ms: float) -> tuple[int, int]:
    """Start and end of the speech in ``x``: silero's outer edges refined on energy, padded."""
    frame = max(1, int(_FRAME_S * rate))
    db = _frame_db(x, frame)
    floor = float(db.max()) - _RANGE_DB
    loud = np.flatnonzero(db > floor)
    start, end = regions[0][0], regions[-1][1]
    win = int(_REFINE_S * rate)
    near_start = loud[(loud * frame >= start - win) & (loud * frame <= start + win)]
    if near_start.size:
        start = int(near_start[0] * frame)
    near_end = loud[((loud + 1) * frame >= end - win) & ((loud + 1) * frame <= end + win)]
    if near_end.size:
        end = int((near_end[-1] + 1) * frame)
    pad = int(pad_ms / 1000 * rate)
    return max(0, start - pad), min(len(x), end + pad)


def split_at_pauses(span: tuple[int, int], regions: list[tuple[int, int]],
                    max_len: int) -> list[tuple[int, int]] | None:
    """Cut ``span`` into pieces of at most ``max_len`` samples in the middle of pauses.

    Returns ``[span]`` when it is short enough, and ``None`` when some stretch of speech longer
    than ``max_len`` has no pause to cut at.
    """
    start, end = span
    if end - start <= max_len:
        return [span]
    cuts = [(a_end + b_start) // 2 for (_, a_end), (b_start, _) in zip(regions, regions[1:], strict=False)]
    cuts = [c for c in cuts if start < c < end]
    pieces: list[tuple[int, int]] = []
    piece_start = start
    last_ok: int | None = None
    for c in cuts + [end]:
        if c - piece_start <= max_len:
            last_ok = c
            continue
        if last_ok is None or last_ok == piece_start:
            return None
        pieces.append((piece_start, last_ok))
        piece_start = last_ok
        if c - piece_start > max_len:
            return None
        last_ok = c
    if end - piece_start > max_len:
        return None
    pieces.append((piece_start, end))
    return pieces
