"""Reference voices: named (codec codes, transcript) pairs a request can clone, and how audio becomes one.

Stored in memory and, with a references directory, on disk as ``<id>.npz`` so they survive a restart.
Upload audio is decoded and validated here; anything unusable is a 400, never a 500.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
from ttsfleet.inference.api import REFERENCE_ID_RE, ApiError

log = logging.getLogger("ttsfleet.inference.references")


class ReferenceStore:
    """Named reference voices (codec codes + transcript + a little metadata), in memory and, with a
    directory, on disk as ``<id>.npz`` (codes, text) and ``<id>.json`` (title, tags, … for Fish's
    voice API)."""

    def __init__(self, directory: str = ""):
        self.dir = Path(directory) if directory else None
        self._items: dict[str, tuple[np.ndarray, str]] = {}
        self._meta: dict[str, dict[str, Any]] = {}
        if self.dir is not None:
            for f in sorted(self.dir.glob("*.npz")):
                try:
                    with np.load(f, allow_pickle=False) as z:
                        self._items[f.stem] = (z["codes"], str(z["text"]))
                    meta = f.with_suffix(".json")
                    self._meta[f.stem] = json.loads(meta.read_text()) if meta.exists() else {}
                except Exception:  # a broken file must not stop the server
                    log.warning("skipping unreadable reference %s", f)

    def ids(self) -> list[str]:
        return sorted(self._items)

    def has(self, rid: str) -> bool:
        return rid in self._items

    def get(self, rid: str) -> tuple[np.ndarray, str]:
        try:
            return self._items[rid]
        except KeyError:
            raise ApiError(404, f"reference_id {rid!r} not found", "reference_not_found") from None

    def meta(self, rid: str) -> dict[str, Any]:
        self.get(rid)
        return dict(self._meta.get(rid, {}))

    def add(self, rid: str, codes: np.ndarray, text: str, meta: dict[str, Any] | None = None) -> None:
        if rid in self._items:
            raise ApiError(409, f"reference_id {rid!r} already exists", "reference_exists")
        self._items[rid] = (codes, text)
        self._meta[rid] = {"created_at": _now(), **(meta or {})}
        if self.dir is not None:
            np.savez(self.dir / f"{rid}.npz", codes=codes, text=np.array(text))
            self._save_meta(rid)

    def update_meta(self, rid: str, **fields: Any) -> None:
        self.get(rid)
        self._meta.setdefault(rid, {}).update(fields, updated_at=_now())
        if self.dir is not None:
            self._save_meta(rid)

    def delete(self, rid: str) -> None:
        self.get(rid)
        del self._items[rid]
        self._meta.pop(rid, None)
        if self.dir is not None:
            (self.dir / f"{rid}.npz").unlink(missing_ok=True)
            (self.dir / f"{rid}.json").unlink(missing_ok=True)

    def rename(self, old: str, new: str) -> None:
        codes, text = self.get(old)
        if not REFERENCE_ID_RE.match(new):
            raise ApiError(400, "new_reference_id must be 1-255 letters, digits, '_', '-', '.' or spaces",
                           "invalid_request")
        if old == new:
            raise ApiError(400, "new_reference_id must differ from old_reference_id", "invalid_request")
        meta = self.meta(old)
        self.add(new, codes, text, meta)
        self.delete(old)

    def _save_meta(self, rid: str) -> None:
        assert self.dir is not None
        (self.dir / f"{rid}.json").write_text(json.dumps(self._meta.get(rid, {})))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


#: Lowest sample rate a reference voice may have: below telephone rate there is no voice to clone
#: (and a 1 Hz "WAV" of a few samples would pass every length check as minutes of audio).
MIN_REFERENCE_RATE = 8000


def check_reference_wave(wave: np.ndarray, sample_rate: int) -> None:
    """400 unless the decoded reference is usable: a real sample rate and finite samples.

    Silence, many channels, very high rates and truncated files are fine (they decode to a valid
    wave); NaN or infinite samples would poison the codec's encoding and every clone made from it."""
    if sample_rate < MIN_REFERENCE_RATE:
        raise ApiError(400, f"reference audio is sampled at {sample_rate} Hz; at least "
                       f"{MIN_REFERENCE_RATE} Hz is needed", "bad_reference_audio")
    if not np.isfinite(wave).all():
        raise ApiError(400, "reference audio holds NaN or infinite samples", "bad_reference_audio")


def encode_reference(codec: Any, lock: threading.Lock, audio: bytes) -> Any:
    """Uploaded audio (any format ffmpeg reads) → codec codes ``LongTensor[num_codebooks, T]``."""
    import torch
    from ttsfleet.inference.audio_io import decode_audio

    try:
        wave, sr = decode_audio(audio)
    except ValueError as exc:
        raise ApiError(400, f"reference audio: {exc}", "bad_reference_audio") from None
    check_reference_wave(wave, sr)
    if wave.size < sr // 10:
        raise ApiError(400, "reference audio is shorter than 0.1 s", "bad_reference_audio")
    if wave.size > sr * 120:
        raise ApiError(400, "reference audio is longer than 120 s", "bad_reference_audio")
    with lock, torch.no_grad():
        codes = codec.encode(wave, sr)
    return torch.as_tensor(codes).long()
