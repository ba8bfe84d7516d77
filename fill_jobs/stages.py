"""The built-in per-item cleaning stages (registered in :mod:`ttsfleet.fill_jobs.registry`).

Each stage is built once per process as ``Stage(config)``; ``run(work)`` is a pure function of
the item (it runs in a CPU worker process, :mod:`ttsfleet.fill_jobs.prefetch`), and ``admit(work,
index)``, where present, makes the one decision that depends on earlier items — is this a
duplicate of something already accepted? — in the job's main process, in shard order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from ttsfleet.fill_jobs import reasons
from ttsfleet.fill_jobs.audio_io import AudioRejected, decode, resample
from ttsfleet.fill_jobs.dedup import DedupIndex, fingerprint
from ttsfleet.fill_jobs.manifest import Entry
from ttsfleet.fill_jobs.settings import CleaningConfig


def rounded(x: float | None, nd: int = 4) -> float | None:
    """Round for the manifest (deterministic, compact); keeps None and maps inf/nan to None."""
    if x is None or not np.isfinite(x):
        return None
    return round(float(x), nd)


@dataclass
class ItemWork:
    """An item's state between stages."""

    entry: Entry
    source: str
    native: np.ndarray | None = None
    native_rate: int = 0
    audio: np.ndarray | None = None
    rate: int = 0
    speech: list[tuple[int, int]] | None = None  # speech regions (target-rate samples)
    span: tuple[int, int] | None = None  # trimmed item bounds
    segments: list[tuple[int, int]] = field(default_factory=list)  # output pieces
    content_hash: str | None = None
    fingerprint: np.ndarray | None = None
    metrics: dict[str, object] = field(default_factory=dict)
    duplicate_of: str | None = None

    @property
    def span_seconds(self) -> float:
        s = self.span or (0, len(self.audio) if self.audio is not None else 0)
        return (s[1] - s[0]) / self.rate if self.rate else 0.0


class Decode:
    def __init__(self, config: CleaningConfig) -> None:
        self.config = config

    def run(self, w: ItemWork) -> None:
        w.native, w.native_rate = decode(w.source, self.config.max_item_seconds)
        w.rate = self.config.target_rate
        w.audio = resample(w.native, w.native_rate, w.rate)
        w.metrics["input_seconds"] = rounded(len(w.native) / w.native_rate)
        w.metrics["input_rate"] = w.native_rate


class Hash:
    def __init__(self, config: CleaningConfig) -> None:
        self.config = config

    def run(self, w: ItemWork) -> None:
        assert w.native is not None
        h = hashlib.sha256(w.native_rate.to_bytes(4, "little"))
        h.update(w.native.tobytes())
        w.content_hash = h.hexdigest()[:32]
        w.metrics["content_hash"] = w.content_hash

    def admit(self, w: ItemWork, index: DedupIndex) -> None:
        first = index.exact(w.content_hash) if w.content_hash else None
        if first is not None:
            w.duplicate_of = first
            raise AudioRejected(reasons.DUPLICATE, f"same audio as {first}")


class Vad:
    def __init__(self, config: CleaningConfig) -> None:
        from ttsfleet.fill_jobs.vad import SileroVad

        self.config = config
        self.model = SileroVad(config)

    def run(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs.vad import split_at_pauses, trim_bounds

        assert w.audio is not None
        w.speech = self.model.speech_regions(w.audio, w.rate)
        w.metrics["speech_regions"] = len(w.speech)
        if not w.speech:
            raise AudioRejected(reasons.SILENCE_ONLY, "no speech detected")
        w.span = trim_bounds(w.audio, w.rate, w.speech, self.config.trim_pad_ms)
        w.metrics["trim_start"] = rounded(w.span[0] / w.rate)
        w.metrics["trim_end"] = rounded(w.span[1] / w.rate)
        pieces = split_at_pauses(w.span, w.speech, int(self.config.max_segment_seconds * w.rate))
        if pieces is None:
            raise AudioRejected(reasons.TOO_LONG, "speech runs longer than maxSegmentSeconds "
                                                  "without a pause")
        w.segments = pieces


class Quality:
    def __init__(self, config: CleaningConfig) -> None:
        self.config = config

    def run(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs import quality

        assert w.audio is not None and w.native is not None
        cfg = self.config
        if w.speech is None and quality.is_silent(w.audio):
            raise AudioRejected(reasons.SILENCE_ONLY, "signal below -60 dBFS")
        seconds = w.span_seconds
        w.metrics["speech_seconds"] = rounded(seconds)
        if seconds < cfg.min_seconds:
            raise AudioRejected(reasons.TOO_SHORT, f"{seconds:.2f} s < {cfg.min_seconds:g} s")
        clip_ratio = quality.clipping_ratio(w.native, cfg.clip_level)
        w.metrics["clip_ratio"] = rounded(clip_ratio, 6)
        if clip_ratio > cfg.max_clip_ratio:
            raise AudioRejected(reasons.CLIPPING, f"{clip_ratio:.2%} of samples at full scale")
        snr = quality.estimate_snr_db(w.audio, w.rate, w.speech)
        w.metrics["snr_db"] = rounded(snr, 2)
        if snr < cfg.min_snr_db:
            raise AudioRejected(reasons.LOW_SNR, f"estimated SNR {snr:.1f} dB < {cfg.min_snr_db:g} dB")
        cps = quality.chars_per_second(w.entry.item.text, seconds)
        w.metrics["chars_per_second"] = rounded(cps, 2)
        if not cfg.min_chars_per_second <= cps <= cfg.max_chars_per_second:
            raise AudioRejected(reasons.SPEECH_RATE,
                                f"{cps:.1f} transcript characters per second of speech")


class Dedup:
    def __init__(self, config: CleaningConfig) -> None:
        self.config = config

    def run(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs.vad import energy_bounds

        assert w.audio is not None
        s = w.span or energy_bounds(w.audio, w.rate)
        w.fingerprint = fingerprint(w.audio[s[0]:s[1]], w.rate)
        w.metrics["fingerprint"] = w.fingerprint.tobytes().hex()
        w.metrics["fingerprint_seconds"] = rounded((s[1] - s[0]) / w.rate)

    def admit(self, w: ItemWork, index: DedupIndex) -> None:
        assert w.fingerprint is not None
        first = index.near(w.fingerprint, float(w.metrics["fingerprint_seconds"]))
        if first is not None:
            w.duplicate_of = first
            raise AudioRejected(reasons.NEAR_DUPLICATE, f"sounds like {first}")


class Loudness:
    def __init__(self, config: CleaningConfig) -> None:
        import pyloudnorm  # noqa: F401  (loaded now, before "started", not in the first item)

        self.config = config

    def run(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs.loudness import normalize

        assert w.audio is not None
        s = w.span or (0, len(w.audio))
        y, before, after = normalize(w.audio[s[0]:s[1]], w.rate, self.config.target_lufs,
                                     self.config.peak_dbfs)
        w.audio = np.concatenate([w.audio[:s[0]], y, w.audio[s[1]:]])
        w.metrics["loudness_in_lufs"] = rounded(before, 2)
        w.metrics["loudness_out_lufs"] = rounded(after, 2)
        w.metrics["peak_dbfs"] = rounded(20 * np.log10(max(float(np.max(np.abs(y))), 1e-9)), 2)
