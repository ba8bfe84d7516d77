"""One item through the enabled cleaning stages, in the fixed order of ``settings.STAGE_ORDER``.

:class:`Pipeline` owns the per-process resources (the silero model, the duplicate index) and turns
a manifest entry into an :class:`ItemResult`: the output manifest row (per-item metrics, status,
reject reason) plus the encoded FLAC files still to be committed. It does no file I/O besides
reading the input; committing is :mod:`ttsfleet.fill_jobs.outputs`' job. Every stage is
deterministic, so reprocessing an item after a crash produces the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ttsfleet.fill_jobs import reasons
from ttsfleet.fill_jobs.audio_io import AudioRejected, decode, encode_flac, resample
from ttsfleet.fill_jobs.dedup import DedupIndex, fingerprint
from ttsfleet.fill_jobs.manifest import Entry
from ttsfleet.fill_jobs.settings import CleaningConfig


class Abandoned(Exception):
    """A stop was requested while the item was in flight; it will be redone after restart."""


def _r(x: float | None, nd: int = 4) -> float | None:
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


@dataclass
class ItemResult:
    """What one item contributes to the output."""

    key: str
    row: dict
    files: list[tuple[str, bytes]]  # (relative output path, FLAC bytes)
    clips: list[np.ndarray]  # the cleaned audio of each output (for the features stage)
    rate: int
    audio_seconds: float
    stage_seconds: dict[str, float]

    @property
    def accepted(self) -> bool:
        return self.row["status"] == "accepted"

    @property
    def reason(self) -> str | None:
        return self.row.get("reason")


def audio_name(key: str, piece: int, n_pieces: int, ext: str = "flac") -> str:
    """Output file of piece ``piece`` of item ``key``: ``audio/<2 hex>/<key>[.pNN].flac``.

    The two-hex-digit folder (from the key's hash) keeps folders small at a million items.
    """
    bucket = hashlib.blake2b(key.encode(), digest_size=1).hexdigest()
    folder = "audio" if ext == "flac" else "features"
    suffix = f".p{piece:02d}" if n_pieces > 1 else ""
    return f"{folder}/{bucket}/{key}{suffix}.{ext}"


class Pipeline:
    """Runs the enabled stages on one item at a time."""

    def __init__(self, stages: tuple[str, ...], config: CleaningConfig,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
        self.stages = stages
        self.config = config
        self.should_stop = should_stop
        self.index = DedupIndex(config.near_duplicate_max_distance,
                                config.near_duplicate_duration_tolerance)
        self._vad = None
        if "vad" in stages:
            from ttsfleet.fill_jobs.vad import SileroVad

            self._vad = SileroVad(config)
        if "loudness" in stages:
            import pyloudnorm  # noqa: F401  (loaded now, before "started", not in the first item)
        self._steps: dict[str, Callable[[ItemWork], None]] = {
            "decode": self._decode, "hash": self._hash, "vad": self._vad_step,
            "quality": self._quality, "dedup": self._dedup, "loudness": self._loudness,
        }

    # --- stages -------------------------------------------------------------------------------
    def _decode(self, w: ItemWork) -> None:
        w.native, w.native_rate = decode(w.source, self.config.max_item_seconds)
        w.rate = self.config.target_rate
        w.audio = resample(w.native, w.native_rate, w.rate)
        w.metrics["input_seconds"] = _r(len(w.native) / w.native_rate)
        w.metrics["input_rate"] = w.native_rate

    def _hash(self, w: ItemWork) -> None:
        assert w.native is not None
        h = hashlib.sha256(w.native_rate.to_bytes(4, "little"))
        h.update(w.native.tobytes())
        w.content_hash = h.hexdigest()[:32]
        w.metrics["content_hash"] = w.content_hash
        first = self.index.exact(w.content_hash)
        if first is not None:
            w.duplicate_of = first
            raise AudioRejected(reasons.DUPLICATE, f"same audio as {first}")

    def _vad_step(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs.vad import split_at_pauses, trim_bounds

        assert self._vad is not None and w.audio is not None
        w.speech = self._vad.speech_regions(w.audio, w.rate)
        w.metrics["speech_regions"] = len(w.speech)
        if not w.speech:
            raise AudioRejected(reasons.SILENCE_ONLY, "no speech detected")
        w.span = trim_bounds(w.audio, w.rate, w.speech, self.config.trim_pad_ms)
        w.metrics["trim_start"] = _r(w.span[0] / w.rate)
        w.metrics["trim_end"] = _r(w.span[1] / w.rate)
        pieces = split_at_pauses(w.span, w.speech, int(self.config.max_segment_seconds * w.rate))
        if pieces is None:
            raise AudioRejected(reasons.TOO_LONG, "speech runs longer than maxSegmentSeconds "
                                                  "without a pause")
        w.segments = pieces

    def _quality(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs import quality

        assert w.audio is not None and w.native is not None
        cfg = self.config
        if w.speech is None and quality.is_silent(w.audio):
            raise AudioRejected(reasons.SILENCE_ONLY, "signal below -60 dBFS")
        seconds = w.span_seconds
        w.metrics["speech_seconds"] = _r(seconds)
        if seconds < cfg.min_seconds:
            raise AudioRejected(reasons.TOO_SHORT, f"{seconds:.2f} s < {cfg.min_seconds:g} s")
        clip_ratio = quality.clipping_ratio(w.native, cfg.clip_level)
        w.metrics["clip_ratio"] = _r(clip_ratio, 6)
        if clip_ratio > cfg.max_clip_ratio:
            raise AudioRejected(reasons.CLIPPING, f"{clip_ratio:.2%} of samples at full scale")
        snr = quality.estimate_snr_db(w.audio, w.rate, w.speech)
        w.metrics["snr_db"] = _r(snr, 2)
        if snr < cfg.min_snr_db:
            raise AudioRejected(reasons.LOW_SNR, f"estimated SNR {snr:.1f} dB < {cfg.min_snr_db:g} dB")
        cps = quality.chars_per_second(w.entry.item.text, seconds)
        w.metrics["chars_per_second"] = _r(cps, 2)
        if not cfg.min_chars_per_second <= cps <= cfg.max_chars_per_second:
            raise AudioRejected(reasons.SPEECH_RATE,
                                f"{cps:.1f} transcript characters per second of speech")

    def _dedup(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs.vad import energy_bounds

        assert w.audio is not None
        s = w.span or energy_bounds(w.audio, w.rate)
        w.fingerprint = fingerprint(w.audio[s[0]:s[1]], w.rate)
        w.metrics["fingerprint"] = w.fingerprint.tobytes().hex()
        w.metrics["fingerprint_seconds"] = _r((s[1] - s[0]) / w.rate)
        first = self.index.near(w.fingerprint, float(w.metrics["fingerprint_seconds"]))
        if first is not None:
            w.duplicate_of = first
            raise AudioRejected(reasons.NEAR_DUPLICATE, f"sounds like {first}")

    def _loudness(self, w: ItemWork) -> None:
        from ttsfleet.fill_jobs.loudness import normalize

        assert w.audio is not None
        s = w.span or (0, len(w.audio))
        y, before, after = normalize(w.audio[s[0]:s[1]], w.rate, self.config.target_lufs,
                                     self.config.peak_dbfs)
        w.audio = np.concatenate([w.audio[:s[0]], y, w.audio[s[1]:]])
        w.metrics["loudness_in_lufs"] = _r(before, 2)
        w.metrics["loudness_out_lufs"] = _r(after, 2)
        w.metrics["peak_dbfs"] = _r(20 * np.log10(max(float(np.max(np.abs(y))), 1e-9)), 2)

    # --- driver -------------------------------------------------------------------------------
    def process(self, entry: Entry, source: str) -> ItemResult:
        """Clean one item. Raises :class:`Abandoned` if a stop is requested mid-item."""
        w = ItemWork(entry, source)
        timings: dict[str, float] = {}
        rejected: AudioRejected | None = None
        for name in self.stages:
            step = self._steps.get(name)
            if step is None:  # batched stages (features) run at commit time
                continue
            if self.should_stop():
                raise Abandoned(entry.key)
            t0 = time.perf_counter()
            try:
                step(w)
            except AudioRejected as exc:
                rejected = exc
            except Exception as exc:  # one bad item must not crash-loop the whole shard
                rejected = AudioRejected(reasons.STAGE_ERROR, f"{name}: {type(exc).__name__}: {exc}"[:300])
            finally:
                timings[name] = time.perf_counter() - t0
            if rejected is not None:
                break
        return self._result(w, rejected, timings)

    def _result(self, w: ItemWork, rejected: AudioRejected | None,
                timings: dict[str, float]) -> ItemResult:
        item = w.entry.item
        row: dict = {"position": w.entry.position, "id": w.entry.key, "source": item.audio,
                     "text": item.text, "speaker": item.speaker, "language": item.language,
                     "status": "rejected" if rejected else "accepted",
                     "reason": rejected.reason if rejected else None,
                     "detail": rejected.detail if rejected else None,
                     "duplicate_of": w.duplicate_of, "metrics": w.metrics, "outputs": []}
        files: list[tuple[str, bytes]] = []
        clips: list[np.ndarray] = []
        if rejected is None and w.audio is not None:
            pieces = w.segments or [w.span or (0, len(w.audio))]
            for i, (a, b) in enumerate(pieces, start=1):
                name = audio_name(w.entry.key, i, len(pieces))
                clip = w.audio[a:b]
                files.append((name, encode_flac(clip, w.rate, self.config.output_subtype)))
                clips.append(clip)
                row["outputs"].append({"audio": name, "start": _r(a / w.rate), "end": _r(b / w.rate),
                                       "seconds": _r((b - a) / w.rate)})
            self.index.add(w.entry.key, w.content_hash, w.fingerprint,
                           float(w.metrics.get("fingerprint_seconds") or 0.0))
        seconds = len(w.native) / w.native_rate if w.native is not None else 0.0
        return ItemResult(w.entry.key, row, files, clips, w.rate, seconds, timings)
