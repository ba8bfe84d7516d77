"""What a fill job is asked to do: the stage list and the cleaning thresholds.

:class:`CleaningConfig` is a pydantic model with camelCase aliases like the core's config models
(``ttsfleet fill run --config clean.yaml`` reads it). Its digest and the stage list are stored in
the checkpoint: resuming a shard with different settings would mix two cleaning policies in one
output, so it is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import Field, ValidationError

from ttsfleet.config import WireModel
from ttsfleet.errors import UserError

#: Every stage, in the order it runs. ``decode`` always runs (every other stage needs audio).
STAGE_ORDER = ("decode", "hash", "vad", "quality", "dedup", "loudness", "features")
DEFAULT_STAGES = ("decode", "hash", "vad", "quality", "dedup", "loudness")
#: Real but fast work for scheduler tests: decode, resample, exact-duplicate hash, FLAC output.
FAST_STAGES = ("decode", "hash")
STAGE_HELP = {
    "decode": "read wav/flac/mp3/ogg/opus (ffmpeg fallback), mono, resample to targetRate",
    "hash": "exact duplicates: content hash of the decoded audio",
    "vad": "silero-vad: trim leading/trailing silence, split long recordings at pauses",
    "quality": "reject clipping, too short/long, silence-only, low SNR, implausible speech rate",
    "dedup": "near duplicates: compact spectral fingerprint",
    "loudness": "normalize to targetLufs (pyloudnorm), limit peaks to peakDbfs",
    "features": "batched log-mel features (torch; CUDA when present), saved as .npy",
}


class CleaningConfig(WireModel):
    """Thresholds of the cleaning stages (camelCase in files, snake_case in Python)."""

    target_rate: int = Field(default=24000, ge=8000, le=192000, description="output sample rate (Hz)")
    output_subtype: str = Field(default="PCM_16", pattern="^PCM_(16|24)$", description="FLAC sample format")
    max_item_seconds: float = Field(default=60.0, gt=0, description="reject longer inputs unread")
    max_segment_seconds: float = Field(default=15.0, gt=0,
                                       description="split speech longer than this at pauses")
    min_seconds: float = Field(default=1.0, ge=0, description="reject shorter speech")
    vad_threshold: float = Field(default=0.5, gt=0, lt=1, description="silero speech probability")
    vad_min_silence_ms: int = Field(default=100, ge=10, description="shortest pause that ends speech")
    trim_pad_ms: float = Field(default=20.0, ge=0, description="silence kept around trimmed speech")
    clip_level: float = Field(default=0.99, gt=0, le=1, description="|sample| counted as clipped")
    max_clip_ratio: float = Field(default=0.01, ge=0, le=1, description="reject above this ratio")
    min_snr_db: float = Field(default=15.0, description="reject below this estimated SNR")
    min_chars_per_second: float = Field(default=4.0, ge=0)
    max_chars_per_second: float = Field(default=30.0, gt=0)
    near_duplicate_max_distance: float = Field(
        default=0.2, ge=0, le=1, description="fingerprint bit-error rate at or below which two "
                                             "items are near duplicates")
    near_duplicate_duration_tolerance: float = Field(default=0.15, ge=0, le=1)
    target_lufs: float = Field(default=-23.0, le=0)
    peak_dbfs: float = Field(default=-1.0, le=0)
    n_mels: int = Field(default=80, ge=8, le=256)
    n_fft: int = Field(default=1024, ge=64)
    hop_length: int = Field(default=256, ge=16)
    feature_batch_size: int = Field(default=16, ge=1)
    feature_device: str = Field(default="auto", pattern="^(auto|cpu|cuda(:[0-9]+)?)$")

    def digest(self) -> str:
        """Stable hash of the settings that change outputs (device choice does not)."""
        data = self.model_dump(exclude={"feature_device", "feature_batch_size"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def load_config(path: Path | None) -> CleaningConfig:
    """Read a YAML or JSON config file (``None``: defaults)."""
    if path is None:
        return CleaningConfig()
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"config {path}: expected a mapping of settings")
    try:
        return CleaningConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"config {path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def parse_stages(text: str | None) -> tuple[str, ...]:
    """Parse ``--stages`` (comma separated; ``default``/``fast`` are shorthands) into run order."""
    if not text or text.strip() == "default":
        return DEFAULT_STAGES
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["fast"]:
        return FAST_STAGES
    if names == ["all"]:
        return STAGE_ORDER
    unknown = [n for n in names if n not in STAGE_ORDER]
    if unknown:
        raise UserError(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGE_ORDER)}")
    chosen = set(names) | {"decode"}
    return tuple(s for s in STAGE_ORDER if s in chosen)
