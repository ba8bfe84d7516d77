"""Decoding any common audio format to mono float, resampling (libsoxr), FLAC encoding.

soundfile (libsndfile) reads wav, flac, ogg/vorbis, ogg/opus and mp3; anything it refuses goes
through ``ffmpeg`` as a fallback. Failures become :class:`AudioRejected` with a reject reason
from :mod:`ttsfleet.fill_jobs.reasons`, so a bad file is a rejected item, never a crashed job.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from fractions import Fraction

import numpy as np
from ttsfleet.fill_jobs import reasons


class AudioRejected(Exception):
    """An item cannot be used; ``reason`` is one of :mod:`ttsfleet.fill_jobs.reasons`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple:  # travels from worker processes intact
        return (type(self), (self.reason, self.detail))


def _fetch(url: str) -> bytes:
    import httpx

    try:
        resp = httpx.get(url, timeout=60.0, follow_redirects=True)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise AudioRejected(reasons.FETCH_ERROR, str(exc)[:200]) from None
    return resp.content


def _ffmpeg_decode(source: str | bytes) -> tuple[np.ndarray, int]:
    """Decode with ffmpeg to 32-bit float WAV at the file's own rate."""
    if shutil.which("ffmpeg") is None:
        raise AudioRejected(reasons.UNREADABLE, "soundfile cannot read it and ffmpeg is missing")
    inp = "pipe:0" if isinstance(source, bytes) else source
    extra = {"input": source} if isinstance(source, bytes) else {"stdin": subprocess.DEVNULL}
    probe = subprocess.run(["ffmpeg", "-v", "error", "-i", inp, "-f", "wav", "-acodec", "pcm_f32le",
                            "pipe:1"], capture_output=True, timeout=600, **extra)
    if probe.returncode != 0 or not probe.stdout:
        msg = probe.stderr.decode(errors="replace").strip().splitlines()
        raise AudioRejected(reasons.UNREADABLE, (msg[-1] if msg else "ffmpeg failed")[:200])
    import soundfile as sf

    x, rate = sf.read(io.BytesIO(probe.stdout), dtype="float32", always_2d=True)
    return x, rate


def decode(source: str, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Read ``source`` (a local path or an http(s) URL) as mono float32 and its sample rate."""
    import soundfile as sf

    remote = source.startswith(("http://", "https://"))
    if not remote and not os.path.exists(source):
        raise AudioRejected(reasons.MISSING_FILE, source)
    payload: str | bytes = _fetch(source) if remote else source
    opened = io.BytesIO(payload) if isinstance(payload, bytes) else payload
    try:
        info = sf.info(opened)
        if max_seconds is not None and info.duration > max_seconds:
            raise AudioRejected(reasons.TOO_LONG, f"{info.duration:.1f} s > {max_seconds:g} s")
        if isinstance(opened, io.BytesIO):
            opened.seek(0)
        x, rate = sf.read(opened, dtype="float32", always_2d=True)
    except AudioRejected:
        raise
    except (sf.LibsndfileError, RuntimeError, ValueError, OSError):
        x, rate = _ffmpeg_decode(payload)
        if max_seconds is not None and len(x) / rate > max_seconds:
            raise AudioRejected(reasons.TOO_LONG, f"{len(x) / rate:.1f} s > {max_seconds:g} s") from None
    if len(x) == 0:
        raise AudioRejected(reasons.UNREADABLE, "no audio frames")
    mono = x.mean(axis=1, dtype=np.float32) if x.shape[1] > 1 else x[:, 0]
    return np.nan_to_num(np.ascontiguousarray(mono, dtype=np.float32)), int(rate)


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample with libsoxr (high quality, deterministic); scipy's polyphase filter without it."""
    if rate_in == rate_out:
        return x.astype(np.float32, copy=False)
    try:
        import soxr
    except ImportError:  # pragma: no cover - soxr is a listed dependency
        from scipy.signal import resample_poly

        ratio = Fraction(rate_out, rate_in)
        return resample_poly(x, ratio.numerator, ratio.denominator).astype(np.float32)
    return soxr.resample(np.ascontiguousarray(x, np.float32), rate_in, rate_out, quality="HQ")


def encode_flac(x: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    """FLAC bytes of ``x`` (clipped to full scale first: libsndfile wraps, it does not clip)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(x, -1.0, 32767 / 32768), rate, format="FLAC", subtype=subtype)
    return buf.getvalue()
