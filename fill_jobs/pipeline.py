"""One item through the enabled per-item stages, then the decisions that depend on earlier items.

Cleaning an item is split in two so the heavy part can run in parallel:

* :meth:`Pipeline.prepare` runs every enabled item stage's ``run`` (decode, VAD, quality,
  fingerprints, loudness ...) and encodes the output FLAC files. It is a pure function of the
  item, so CPU worker processes (:mod:`ttsfleet.fill_jobs.prefetch`) run it ahead of the job.
* :meth:`Pipeline.admit` walks the stages again in the job's main process, in shard order, and
  applies each stage's ``admit`` (is this a duplicate of an earlier accepted item?) at the point
  where the stage ran; a rejection there drops what the later stages produced, so the row is the
  one a strictly sequential run would write.

The result is an :class:`ItemResult`: the output manifest row plus the files still to be
committed; committing is :mod:`ttsfleet.fill_jobs.outputs`' job. Every stage is deterministic,
so reprocessing an item after a crash produces the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ttsfleet.fill_jobs import reasons, registry
from ttsfleet.fill_jobs.audio_io import AudioRejected, encode_flac
from ttsfleet.fill_jobs.dedup import DedupIndex
from ttsfleet.fill_jobs.manifest import Entry
from ttsfleet.fill_jobs.settings import CleaningConfig
from ttsfleet.fill_jobs.stages import ItemWork, rounded

__all__ = ["Abandoned", "ItemResult", "ItemWork", "Pipeline", "Prepared", "audio_name"]


class Abandoned(Exception):
    """A stop was requested while the item was in flight; it will be redone after restart."""


@dataclass
class ItemResult:
    """What one item contributes to the output."""

    key: str
    row: dict
    files: list[tuple[str, bytes]]  # (relative output path, bytes); batch stages append theirs
    clips: list[np.ndarray]  # the cleaned audio of each output (input of the batch stages)
    rate: int
    audio_seconds: float
    stage_seconds: dict[str, float]
    position: int = 0  # index in the shard (groups for the batch stages are cut by it)

    @property
    def accepted(self) -> bool:
        return self.row["status"] == "accepted"

    @property
    def reason(self) -> str | None:
        return self.row.get("reason")


@dataclass
class Prepared:
    """An item after the item stages' ``run``, before :meth:`Pipeline.admit`.

    ``trail``: the stages that ran, each with how many metric keys existed after it (a later
    admission reject cuts the metrics back to that point). The audio arrays are dropped before a
    worker sends this back; only the encoded outputs (and, for batch stages, the clips) travel.
    """

    work: ItemWork
    trail: list[tuple[str, int]]
    rejected: AudioRejected | None
    timings: dict[str, float]
    files: list[tuple[str, bytes]] = field(default_factory=list)
    clips: list[np.ndarray] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    audio_seconds: float = 0.0


def audio_name(key: str, piece: int, n_pieces: int, ext: str = "flac", folder: str | None = None) -> str:
    """Output file of piece ``piece`` of item ``key``: ``audio/<2 hex>/<key>[.pNN].flac``.

    The two-hex-digit folder (from the key's hash) keeps folders small at a million items.
    """
    bucket = hashlib.blake2b(key.encode(), digest_size=1).hexdigest()
    folder = folder or ("audio" if ext == "flac" else "features")
    suffix = f".p{piece:02d}" if n_pieces > 1 else ""
    return f"{folder}/{bucket}/{key}{suffix}.{ext}"


def _stage_error(name: str, exc: Exception) -> AudioRejected:
    """One bad item must not crash-loop the whole shard: an unexpected error rejects it."""
    return AudioRejected(reasons.STAGE_ERROR, f"{name}: {type(exc).__name__}: {exc}"[:300])


class Pipeline:
    """The item stages of one job, built once per process.

    ``admit_only``: build only the stages that have an ``admit`` step (the job's main process
    when worker processes do the ``run`` steps: it then never loads silero or pyloudnorm).
    """

    def __init__(self, stages: tuple[str, ...], config: CleaningConfig,
                 should_stop: Callable[[], bool] = lambda: False, admit_only: bool = False) -> None:
        self.stages = stages
        self.config = config
        self.should_stop = should_stop
        self.index = DedupIndex(config.near_duplicate_max_distance,
                                config.near_duplicate_duration_tolerance)
        self.keep_clips = any(registry.get(n).kind == "batch" for n in stages)
        self._steps: dict[str, Any] = {}
        for name in stages:
            spec = registry.get(name)
            if spec.kind != "item":
                continue
            cls = spec.build()
            if not admit_only or hasattr(cls, "admit"):
                self._steps[name] = cls(config)

    # --- the parallel part --------------------------------------------------------------------
    def prepare(self, entry: Entry, source: str) -> Prepared:
        """Run every item stage on one item. Raises :class:`Abandoned` if a stop is requested."""
        w = ItemWork(entry, source)
        trail: list[tuple[str, int]] = []
        timings: dict[str, float] = {}
        rejected: AudioRejected | None = None
        for name in self.stages:
            step = self._steps.get(name)
            if step is None:
                continue
            if self.should_stop():
                raise Abandoned(entry.key)
            t0 = time.perf_counter()
            try:
                step.run(w)
            except AudioRejected as exc:
                rejected = exc
            except Exception as exc:
                rejected = _stage_error(name, exc)
            finally:
                timings[name] = time.perf_counter() - t0
            trail.append((name, len(w.metrics)))
            if rejected is not None:
                break
        prep = Prepared(w, trail, rejected, timings)
        prep.audio_seconds = len(w.native) / w.native_rate if w.native is not None else 0.0
        if rejected is None and w.audio is not None:
            self._encode_outputs(prep)
        w.native = w.audio = None  # what a worker sends back stays small
        return prep

    def _encode_outputs(self, prep: Prepared) -> None:
        w = prep.work
        assert w.audio is not None
        pieces = w.segments or [w.span or (0, len(w.audio))]
        for i, (a, b) in enumerate(pieces, start=1):
            name = audio_name(w.entry.key, i, len(pieces))
            clip = w.audio[a:b]
            prep.files.append((name, encode_flac(clip, w.rate, self.config.output_subtype)))
            if self.keep_clips:
                prep.clips.append(np.ascontiguousarray(clip, np.float32))
            prep.outputs.append({"audio": name, "start": rounded(a / w.rate),
                                 "end": rounded(b / w.rate), "seconds": rounded((b - a) / w.rate)})

    # --- the ordered part ---------------------------------------------------------------------
    def admit(self, prep: Prepared, position: int = 0) -> ItemResult:
        """Apply the order-dependent decisions to a prepared item and register it if accepted."""
        w, rejected = prep.work, prep.rejected
        for i, (name, n_keys) in enumerate(prep.trail):
            last = i == len(prep.trail) - 1
            step = self._steps.get(name)
            if (last and rejected is not None) or not hasattr(step, "admit"):
                continue
            try:
                step.admit(w, self.index)
            except AudioRejected as exc:
                rejected = exc
            except Exception as exc:
                rejected = _stage_error(name, exc)
            if rejected is not prep.rejected:
                for key in list(w.metrics)[n_keys:]:
                    del w.metrics[key]
                break
        return self._result(prep, rejected, position)

    def _result(self, prep: Prepared, rejected: AudioRejected | None, position: int) -> ItemResult:
        w = prep.work
        item = w.entry.item
        row: dict = {"position": w.entry.position, "id": w.entry.key, "source": item.audio,
                     "text": item.text, "speaker": item.speaker, "language": item.language,
                     "status": "rejected" if rejected else "accepted",
                     "reason": rejected.reason if rejected else None,
                     "detail": rejected.detail if rejected else None,
                     "duplicate_of": w.duplicate_of, "metrics": w.metrics, "outputs": []}
        files: list[tuple[str, bytes]] = []
        clips: list[np.ndarray] = []
        if rejected is None:
            row["outputs"], files, clips = prep.outputs, prep.files, prep.clips
            self.index.add(w.entry.key, w.content_hash, w.fingerprint,
                           float(w.metrics.get("fingerprint_seconds") or 0.0))
        return ItemResult(w.entry.key, row, files, clips, w.rate, prep.audio_seconds, prep.timings,
                          position)

    def process(self, entry: Entry, source: str, position: int = 0) -> ItemResult:
        """Clean one item in this process (prepare, then admit)."""
        return self.admit(self.prepare(entry, source), position)
