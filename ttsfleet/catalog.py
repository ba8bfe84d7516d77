"""GPU class catalog: what each GPU class is, how it serves TTS, and how much it can carry.

Everything that differs between GPU classes lives here, so adding a class is one entry. The
operator reads serving defaults from it, the policy and the simulator read capacity curves from
it, and the inference server reads its quantization scheme from it.

Capacity curves are piecewise-linear in concurrency (requests decoding at once on one replica).
Seed figures come from the source write-up (H200 bsgemm FP8 8,006 frames/s at c=64, ~52x
scaling from c=1, time to first audio 73 ms at c=1 and 110 ms at c=64; RTX 5090 mxfp8 5,869
frames/s at c=64). They are replaced by measured curves with :func:`GpuCatalog.with_measured`.
"""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

QuantScheme = Literal["bsgemm_fp8", "mxfp8", "bf16"]

#: 21.53 decoded frames are one second of 44.1 kHz audio (2048 samples per frame).
FRAMES_PER_AUDIO_SECOND = 44100 / 2048


class CapacityPoint(BaseModel):
    """One measured point of a replica's throughput/latency curve."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(ge=1)
    frames_per_s: float = Field(gt=0, description="aggregate decode frames/s of one replica")
    ttfa_s: float = Field(gt=0, description="time to first audio at this concurrency, seconds")


class CapacityCurve(BaseModel):
    """Throughput and time to first audio of one replica as a function of concurrency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: tuple[CapacityPoint, ...] = Field(min_length=1)
    source: str = "seed"

    @field_validator("points")
    @classmethod
    def _sorted_unique(cls, pts: tuple[CapacityPoint, ...]) -> tuple[CapacityPoint, ...]:
        pts = tuple(sorted(pts, key=lambda p: p.concurrency))
        cs = [p.concurrency for p in pts]
        if len(set(cs)) != len(cs):
            raise ValueError("capacity curve has duplicate concurrency points")
        return pts

    @property
    def max_concurrency(self) -> int:
        return self.points[-1].concurrency

    def _interp(self, c: float, attr: str) -> float:
        pts = self.points
        if c <= pts[0].concurrency:
            # Below the first point throughput scales linearly with concurrency.
            first = getattr(pts[0], attr)
            if attr == "frames_per_s":
                return first * max(c, 0.0) / pts[0].concurrency
            return first
        if c >= pts[-1].concurrency:
            return getattr(pts[-1], attr)
        xs = [p.concurrency for p in pts]
        i = bisect.bisect_right(xs, c)
        lo, hi = pts[i - 1], pts[i]
        w = (c - lo.concurrency) / (hi.concurrency - lo.concurrency)
        return getattr(lo, attr) * (1 - w) + getattr(hi, attr) * w

    def frames_per_s(self, concurrency: float) -> float:
        """Aggregate frames/s of one replica running ``concurrency`` requests."""
        return self._interp(concurrency, "frames_per_s")

    def ttfa_s(self, concurrency: float) -> float:
        """Time to first audio (seconds) when ``concurrency`` requests share a replica."""
        return self._interp(concurrency, "ttfa_s")

    @property
    def peak_frames_per_s(self) -> float:
        return max(p.frames_per_s for p in self.points)

    def scaling(self) -> float:
        """Throughput ratio between the highest and the lowest measured concurrency."""
        return self.points[-1].frames_per_s / self.points[0].frames_per_s


class ServingDefaults(BaseModel):
    """Per-class defaults for the inference server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_running_requests: int = Field(default=64, ge=1)
    mem_fraction_static: float = Field(default=0.85, gt=0, le=1)

    @property
    def cuda_graph_max_bs(self) -> int:
        """Largest captured decode batch: ``min(max_running_requests, 64)``.

        The source write-up measured a throughput cliff with a hard cap of 24 on 32 GB cards;
        tying the cap to max_running_requests (bounded at 64) removes it.
        """
        return cuda_graph_max_bs(self.max_running_requests)


def cuda_graph_max_bs(max_running_requests: int) -> int:
    """The decode batch sizes captured in CUDA graphs go up to this bound."""
    if max_running_requests < 1:
        raise ValueError("max_running_requests must be >= 1")
    return min(max_running_requests, 64)


class GpuClass(BaseModel):
    """One GPU class of the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    display_name: str
    arch: str = Field(description="CUDA arch the kernels target, e.g. sm_90a")
    memory_gb: float = Field(gt=0)
    quantization: QuantScheme
    activation_block: tuple[int, int] = Field(description="activation scale block (rows, cols)")
    weight_block: tuple[int, int] = Field(description="weight scale block (rows, cols)")
    scale_format: Literal["fp32", "ue8m0"]
    serving: ServingDefaults = ServingDefaults()
    capacity: CapacityCurve
    model_load_s: float = Field(gt=0, description="pod start to ready: image, weights, graph capture")
    relative_cost: float = Field(gt=0, description="cost per GPU-hour relative to an H200")
    node_label: str = Field(description="value of the node label ttsfleet.io/gpu-class")


def _curve(c64_fps: float, c1_fps: float, ttfa1: float, ttfa64: float, source: str) -> CapacityCurve:
    """Seed curve through c=1 and c=64 with a concave middle (batching saturates gently)."""
    pts = []
    for c in (1, 2, 4, 8, 16, 32, 64):
        # log-interpolate throughput between the two measured ends; ttfa linear in c.
        w = math.log(c) / math.log(64)
        fps = c1_fps * (c64_fps / c1_fps) ** w
        ttfa = ttfa1 + (ttfa64 - ttfa1) * (c - 1) / 63
        pts.append(CapacityPoint(concurrency=c, frames_per_s=round(fps, 1), ttfa_s=round(ttfa, 4)))
    return CapacityCurve(points=tuple(pts), source=source)


def default_classes() -> dict[str, GpuClass]:
    """The built-in catalog: H200 (bsgemm FP8), RTX 5090 and RTX 6000 PRO (mxfp8)."""
    h200 = GpuClass(
        name="h200",
        display_name="NVIDIA H200 SXM 141GB",
        arch="sm_90a",
        memory_gb=141,
        quantization="bsgemm_fp8",
        activation_block=(1, 128),
        weight_block=(128, 128),
        scale_format="fp32",
        capacity=_curve(8006, 8006 / 52, 0.073, 0.110, "seed: source write-up, H200 bsgemm FP8"),
        model_load_s=90,
        relative_cost=1.0,
        node_label="h200",
    )
    rtx5090 = GpuClass(
        name="rtx5090",
        display_name="NVIDIA GeForce RTX 5090 32GB",
        arch="sm_120a",
        memory_gb=32,
        quantization="mxfp8",
        activation_block=(1, 32),
        weight_block=(1, 32),
        scale_format="ue8m0",
        capacity=_curve(5869, 5869 / 45, 0.080, 0.135, "seed: source write-up, RTX 5090 mxfp8"),
        model_load_s=75,
        relative_cost=0.25,
        node_label="rtx5090",
    )
    rtx6000pro = GpuClass(
        name="rtx6000pro",
        display_name="NVIDIA RTX PRO 6000 Blackwell 96GB",
        arch="sm_120a",
        memory_gb=96,
        quantization="mxfp8",
        activation_block=(1, 32),
        weight_block=(1, 32),
        scale_format="ue8m0",
        capacity=_curve(6300, 6300 / 47, 0.078, 0.128, "estimate: scaled from RTX 5090 by bandwidth"),
        model_load_s=80,
        relative_cost=0.45,
        node_label="rtx6000pro",
    )
    return {c.name: c for c in (h200, rtx5090, rtx6000pro)}


class UnknownGpuClass(ValueError):
    """Raised for a GPU class name that is not in the catalog."""


class GpuCatalog(BaseModel):
    """The set of GPU classes a fleet may use, overridable by config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: dict[str, GpuClass]

    @model_validator(mode="after")
    def _names_match_keys(self) -> GpuCatalog:
        for key, cls in self.classes.items():
            if key != cls.name:
                raise ValueError(f"catalog key {key!r} does not match class name {cls.name!r}")
        return self

    @classmethod
    def default(cls) -> GpuCatalog:
        return cls(classes=default_classes())

    @classmethod
    def from_file(cls, path: str | Path) -> GpuCatalog:
        """Load overrides (JSON or YAML: ``{classes: {name: {...}}}``) merged over the defaults."""
        import yaml

        raw = yaml.safe_load(Path(path).read_text())
        if not isinstance(raw, dict) or not isinstance(raw.get("classes"), dict):
            raise ValueError(f"{path}: expected a mapping with a 'classes' mapping")
        merged = {k: v.model_dump() for k, v in default_classes().items()}
        for name, override in raw["classes"].items():
            base = merged.get(name, {"name": name})
            base.update(override)
            merged[name] = base
        return cls(classes={k: GpuClass.model_validate(v) for k, v in merged.items()})

    def get(self, name: str) -> GpuClass:
        try:
            return self.classes[name]
        except KeyError:
            known = ", ".join(sorted(self.classes))
            raise UnknownGpuClass(f"unknown GPU class {name!r} (known: {known})") from None

    def names(self) -> list[str]:
        return sorted(self.classes)

    def with_measured(self, name: str, curve: CapacityCurve) -> GpuCatalog:
        """A copy whose ``name`` class carries a measured capacity curve (e.g. from a benchmark)."""
        cls = self.get(name)
        classes = dict(self.classes)
        classes[name] = cls.model_copy(update={"capacity": curve})
        return GpuCatalog(classes=classes)

    def with_measured_file(self, name: str, path: str | Path) -> GpuCatalog:
        """Load a benchmark JSON (``{"points": [{concurrency, frames_per_s, ttfa_s}, ...]}``)."""
        data = json.loads(Path(path).read_text())
        curve = CapacityCurve(points=tuple(CapacityPoint(**p) for p in data["points"]),
                              source=data.get("source", str(path)))
        return self.with_measured(name, curve)
