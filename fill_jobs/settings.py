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
from typing import Literal

from pydantic import Field, ValidationError
from ttsfleet.fill_jobs import registry

from ttsfleet.config import WireModel
from ttsfleet.errors import UserError, validation_text

#: The stage vocabulary lives in :mod:`ttsfleet.fill_jobs.registry` (the one place a stage is
#: registered); these are its built-in defaults, for callers that want a constant.
DEFAULT_STAGES = registry.default_stages()
#: Real but fast work for scheduler tests: decode, resample, exact-duplicate hash, FLAC output.
FAST_STAGES = ("decode", "hash")


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
    feature_device: str = Field(default="auto", pattern="^(auto|cpu|cuda(:[0-9]+)?)$",
                                description="device of the batch stages (features, codec)")
    codec: str | None = Field(default=None, description="the codec stage's codec: a codec.pth "
                              "(or its folder), or a random-weight preset (tiny, s2-pro) for tests")
    codec_batch_seconds: float = Field(default=240.0, gt=0, le=3600,
                                       description="padded audio per codec forward pass")
    codec_precision: Literal["float32", "tf32", "bf16"] = Field(
        default="float32",
        description="arithmetic of the codec stage's encoder. float32 (TF32 off) is the default "
                    "because every code is an argmin over distances to the codebook entries: "
                    "lower precision moves the distances and flips the near-ties, so the codes "
                    "differ from float32's (and a flip in one codebook changes the residual the "
                    "next ones quantize). tf32: TF32 allowed in cuDNN convolutions and matmuls of "
                    "the encoder (CUDA only; on the CPU it is float32). bf16: encoder weights and "
                    "activations in bf16. In both, the resampler and the quantizer's residual "
                    "codebooks (projections and the nearest-code search) stay float32. Measure "
                    "the agreement with float32 before using them "
                    "(benchmarks/fill_jobs/bench_codec_precision.py)")
    codec_layout: Literal["ncl", "channels-last"] = Field(
        default="ncl",
        description="memory layout of the codec stage's encoder convs. ncl (the default, the "
                    "reference's 1-D convs); channels-last: 2-D convs of height 1 on NHWC tensors, "
                    "the decoder's faster cuDNN path (issue #25). The same arithmetic in another "
                    "order: codes can differ from ncl's at near-ties, as across GPUs. Off the "
                    "bit-exact default (channels-last or a fast codecPrecision) a CUDA encode runs "
                    "cuDNN's autotuner with bucketed batch shapes, and fast precisions the fused "
                    "Snake kernel (benchmarks/fill_jobs/bench_codec_precision.py measures each)")
    batch_items: int = Field(default=32, ge=1, le=4096,
                             description="items per group of the batch stages; with a batch stage "
                                         "commits fall on group boundaries, so a restart forms the "
                                         "same groups")
    workers: int = Field(default=-1, ge=-1, le=512,
                         description="CPU worker processes for the item stages (-1: one per usable "
                                     "CPU but one; 0: in the job's own process)")
    prefetch_items: int = Field(default=0, ge=0, description="items prepared ahead of the job "
                                "(0: 4 per worker); bounds the memory the prefetch holds")

    def digest(self) -> str:
        """Stable hash of the settings that change outputs (device and parallelism do not)."""
        exclude = {"feature_device", "feature_batch_size", "workers", "prefetch_items"}
        if self.codec_precision == "float32":  # added later: the default keeps older digests
            exclude.add("codec_precision")
        if self.codec_layout == "ncl":  # likewise
            exclude.add("codec_layout")
        data = self.model_dump(exclude=exclude)
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
        raise UserError(f"config {path}: {validation_text(exc, 1)}") from None


def parse_stages(text: str | None) -> tuple[str, ...]:
    """Parse ``--stages`` (comma separated; ``default``/``fast``/``all`` are shorthands) into run
    order; an unknown name is a one-line :class:`~ttsfleet.fill_jobs.registry.UnknownStage`."""
    if not text or text.strip() == "default":
        return registry.default_stages()
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["fast"]:
        return FAST_STAGES
    if names == ["all"]:
        return registry.names()
    return registry.validate(names)
