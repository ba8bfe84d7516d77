"""GPU class catalog: what each GPU class is, how it serves TTS, and how much it can carry.

Everything that differs between GPU classes lives here, so adding a class is one entry (one YAML
file passed with ``--catalog``, merged over the built-in classes). What reads it:

* quantization: a class's ``quantization`` is what ``auto`` means on it (operator, server);
* kernel dispatch: :meth:`GpuCatalog.dispatch_for_capability` maps a device's compute capability
  to the scheme and kernel backend of the classes with that ``arch`` (loader, kernels);
* placement: :meth:`GpuClass.node_selector` / :meth:`GpuCatalog.class_for_node_label` are the one
  node label (:data:`NODE_LABEL_KEY` = ``node_label``) inference pods, fill pods and the GPU
  inventory agree on;
* descriptions: :meth:`GpuCatalog.names_text` and :meth:`GpuCatalog.quantization_text` feed help
  texts and schema descriptions, so prose lists of classes are generated, not typed;
* capacity: the policy and the simulator read the capacity curves.

Capacity curves are piecewise-linear in concurrency (requests decoding at once on one replica).
Seed figures come from the source write-up (H200 bsgemm FP8 8,006 frames/s at c=64, ~52x
scaling from c=1, time to first audio 73 ms at c=1 and 110 ms at c=64; RTX 5090 mxfp8 5,869
frames/s at c=64). They are replaced by measured curves with :func:`GpuCatalog.with_measured`.

Provenance: a curve says where it comes from in its ``source``; a class's other figures (memory,
load time, cost, ...) in :attr:`GpuClass.sources`, one line per field, starting with its kind
(:data:`SOURCE_KINDS`: measured, spec, estimate, borrowed or assumed).
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ttsfleet.errors import UserError, one_line, validation_text
from ttsfleet.quantization import BF16, SCHEME_LAYOUTS, QuantScheme, QuantSchemeField

__all__ = ["NAMED_CURVES", "NODE_LABEL_KEY", "SOURCE_KINDS", "CapacityCurve", "CapacityPoint",
           "DeviceDispatch", "GpuCatalog", "GpuClass", "KernelBackend", "QuantScheme", "ServingDefaults",
           "UnknownGpuClass", "compute_capability", "cuda_graph_max_bs", "default_classes"]

#: The node label key whose value (a class's ``node_label``) says which GPU class a node has.
NODE_LABEL_KEY = "ttsfleet.io/gpu-class"

#: How a figure of the catalog is known, the first word of its provenance line (``GpuClass.sources``,
#: ``CapacityCurve.source``): ``measured`` (a run of ours: file, date, machine), ``spec`` (the
#: vendor's data sheet), ``estimate`` (derived, and how), ``borrowed`` (the source write-up or
#: another outside figure), ``assumed`` (a placeholder no run or document backs).
SOURCE_KINDS = ("measured", "spec", "estimate", "borrowed", "assumed")

#: Which GEMM/attention kernels a class runs: the Triton FP8 kernels, or the torch reference.
KernelBackend = Literal["triton", "reference"]
#: Which library runs the GEMMs of prefill-size row counts: the class's ``kernel_backend`` too
#: ("triton"), or cuBLAS's block-scaled FP8 GEMM (same 1x128 / 128x128 contract, sm_90).
PrefillGemm = Literal["triton", "cublas_blockwise"]


def compute_capability(arch: str) -> tuple[int, int]:
    """``sm_90a`` -> (9, 0), ``sm_100a`` -> (10, 0), ``sm_120a`` -> (12, 0): CUDA's numbering."""
    m = re.fullmatch(r"sm_(\d+)(\d)[a-z]?", arch)
    if m is None:
        raise ValueError(f"arch {arch!r} is not a CUDA arch like sm_90a")
    return int(m.group(1)), int(m.group(2))


class CapacityPoint(BaseModel):
    """One measured point of a replica's throughput/latency curve."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(ge=1)
    frames_per_s: float = Field(gt=0, description="aggregate decode frames/s of one replica")
    ttfa_s: float = Field(gt=0, description="time to first audio at this concurrency, seconds")
    gpu_busy: float | None = Field(default=None, gt=0, le=1,
                                   description="GPU busy fraction (NVML utilization) at this "
                                               "concurrency, where the benchmark sampled it")


class CapacityCurve(BaseModel):
    """Throughput and time to first audio of one replica as a function of concurrency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: tuple[CapacityPoint, ...] = Field(min_length=1)
    source: str = "seed"
    slo_concurrency: int | None = Field(
        default=None, ge=0, description="largest measured concurrency whose RTF p99 <= 0.5 and first "
                                        "audio p99 <= 250 ms (ttsfleet bench serve's capacity); None: "
                                        "not measured")

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

    def gpu_busy(self, concurrency: float) -> float | None:
        """Measured GPU busy fraction at ``concurrency`` (None unless every point carries one)."""
        if any(p.gpu_busy is None for p in self.points):
            return None
        return self._interp(concurrency, "gpu_busy")

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
    #: Decode audio in a child process under CUDA's MPS (``serve --codec-process``, ``--mps``):
    #: on where a side-by-side run on the class measured it faster than the codec thread.
    codec_process: bool = False
    #: The codec decoder's convolution layout on the class's GPU (``serve --codec-layout``):
    #: ``channels-last`` where a side-by-side served run on the class measured it faster.
    codec_layout: Literal["ncl", "channels-last"] = "ncl"
    #: How long a chunk of codes may wait for other streams' chunks on the class's GPU (``serve
    #: --codec-gather-ms``, :mod:`ttsfleet.inference.codec_gather`): above 0 only where a side-by-side
    #: served run on the class measured it faster with first audio and underruns no worse. 0
    #: everywhere: on an H100 (2026-12-06, the rule of 2026-12-05) 100 ms took the codec's pushes
    #: -43 % but served fewer frames (c=64 -2 %, c=128 -10 %) with first audio p99 twice as long
    #: (benchmarks/inference_h200/2026-12-06/call1-h100-chunk-ramp-gather100).
    codec_gather_ms: float = Field(default=0.0, ge=0)

    @property
    def cuda_graph_max_bs(self) -> int:
        """Largest captured decode batch: every batch the pool admits (``max_running_requests``).

        The source write-up measured a throughput cliff where graphs stopped at 24 on 32 GB cards,
        and ours at 64 (c=128 ran eager: 674 frames/s against 1,486 at c=64, 2026-12-01).
        """
        return cuda_graph_max_bs(self.max_running_requests)


def cuda_graph_max_bs(max_running_requests: int) -> int:
    """The decode batch sizes captured in CUDA graphs go up to this bound: every admitted batch."""
    if max_running_requests < 1:
        raise ValueError("max_running_requests must be >= 1")
    return max_running_requests


class GpuClass(BaseModel):
    """One GPU class of the fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    display_name: str
    arch: str = Field(pattern=r"^sm_\d+[a-z]?$",
                      description="CUDA arch the kernels target, e.g. sm_90a; gives the compute "
                                  "capability a device of this class reports")
    memory_gb: float = Field(gt=0)
    quantization: QuantSchemeField = Field(description="the scheme 'auto' means on this class")
    kernel_backend: KernelBackend = Field(
        default="reference", description="triton: the FP8 Triton kernels (validated on sm_90a); "
                                         "reference: the torch path, same numerics")
    activation_block: tuple[int, int] = Field(
        description="activation scale block (rows, cols); defaults to the scheme's")
    weight_block: tuple[int, int] = Field(description="weight scale block (rows, cols); defaults "
                                                      "to the scheme's")
    scale_format: Literal["fp32", "ue8m0"] = Field(description="defaults to the scheme's")
    prefill_gemm: PrefillGemm = Field(
        default="triton", description="library for GEMMs of at least prefill_gemm_min_rows rows "
                                      "(prefill); smaller ones (decode) run kernel_backend")
    prefill_gemm_min_rows: int = Field(default=256, ge=2, description="rows from which prefill_gemm runs")
    serving: ServingDefaults = ServingDefaults()
    capacity: CapacityCurve
    model_load_s: float = Field(gt=0, description="pod start to ready: image, weights, graph capture")
    relative_cost: float = Field(gt=0, description="cost per GPU-hour relative to an H200")
    node_label: str = Field(default="", pattern=r"^$|^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                            description=f"value of the node label {NODE_LABEL_KEY}; defaults to "
                                        "the name")
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="provenance: for a field of this class (memory_gb, model_load_s, relative_cost, "
                    "...), where its value comes from, starting with its kind: "
                    + ", ".join(f"'{k}:'" for k in SOURCE_KINDS)
                    + " (e.g. 'spec: NVIDIA data sheet, 141 GB HBM3e'); the capacity curve carries "
                      "its own (capacity.source). Optional: a field without an entry states none")

    @field_validator("sources")
    @classmethod
    def _provenance(cls, sources: dict[str, str]) -> dict[str, str]:
        """Keys are fields of the class; values name their kind (:data:`SOURCE_KINDS`) and say more."""
        fields = sorted(set(cls.model_fields) - {"sources", "capacity"})
        for key, text in sources.items():
            if key == "capacity":
                raise ValueError("'capacity' carries its own provenance: set capacity.source, not "
                                 "sources.capacity")
            if key not in fields:
                raise ValueError(f"{key!r} is not a field of a GPU class (one of: {', '.join(fields)})")
            kind, colon, rest = text.partition(":")
            if not colon or kind.strip() not in SOURCE_KINDS or not rest.strip():
                raise ValueError(f"{key}: {text!r} must start with its kind, one of "
                                 f"{', '.join(k + ':' for k in SOURCE_KINDS)}, and say where it "
                                 "comes from")
        return sources

    @model_validator(mode="before")
    @classmethod
    def _scheme_defaults(cls, data: Any) -> Any:
        """Block layout and node label default to what the scheme and the name imply."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        layout = SCHEME_LAYOUTS.get(str(data.get("quantization", "")).strip().lower())
        if layout is not None:
            data.setdefault("activation_block", layout.activation_block)
            data.setdefault("weight_block", layout.weight_block)
            data.setdefault("scale_format", layout.scale_format)
        elif data.get("quantization") is not None:  # bf16: no scales; the fields are inert
            data.setdefault("activation_block", (1, 1))
            data.setdefault("weight_block", (1, 1))
            data.setdefault("scale_format", "fp32")
        if not data.get("node_label") and data.get("name"):
            data["node_label"] = data["name"]
        return data

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) a device of this class reports, from ``arch``."""
        return compute_capability(self.arch)

    def node_selector(self) -> dict[str, str]:
        """The node selector that places a pod (inference or fill) on this class's nodes."""
        return {NODE_LABEL_KEY: self.node_label}


@dataclass(frozen=True)
class DeviceDispatch:
    """What a device of one compute capability runs, as the catalog says."""

    capability: tuple[int, int] | None  # None: not a CUDA device (CPU)
    gpu_classes: tuple[str, ...]  # the catalog classes with this arch (empty: unknown device)
    quantization: QuantScheme  # what ``auto`` resolves to (bf16 on an unknown device)
    kernel_backend: KernelBackend
    prefill_gemm: PrefillGemm = "triton"
    prefill_gemm_min_rows: int = 256


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


#: Our served H200 curve: ``ttsfleet bench serve`` against ``ttsfleet serve --checkpoint s2-pro
#: --gpu-class h200`` with the H200 defaults below (128 slots, FP8, split-KV decode attention below a
#: wave of rows, the codec process under MPS, channels-last codec convs with the conv bias fused into
#: the Snake, cuDNN timing 3 candidates per conv; streaming pcm over HTTP, 128 +- 50 % frames, a
#: 290-character text, the steady window), one H200, one server, all three levels in one run,
#: 2026-12-04: benchmarks/inference_h200/2026-12-04/run15-served-curve-final-defaults
#: (serve/served_c{1,64,128}/bench.json): frames/s, first audio p50 and the NVML busy mean over the
#: middle 80 % of each level (sampled every 0.2 s). First audio p99 was 26 / 186 / 247 ms and RTF p99
#: 0.114 / 0.445 / 0.754 at c=1 / 64 / 128: c=1 and c=64 meet the capacity bound (first audio p99 <=
#: 250 ms and RTF p99 <= 0.5), hence ``slo_concurrency`` 64. The c=64 first-audio p99 is the noisiest
#: figure here: 181-350 ms over five served runs of nearly these defaults on four machines (run8,
#: run10, run11, run12, run15), three of them above 250 ms; c=64 frames/s 3,422-3,574 over the same.
_SERVED_H200 = ((1, 193.366, 0.02537, 0.8558), (64, 3453.643, 0.08932, 0.9615),
                (128, 4058.945, 0.11677, 0.9252))
_SERVED_SLO_CONCURRENCY = 64
_SERVED_SOURCE = ("measured: ttsfleet serve --gpu-class h200 (the H200 defaults: 128 slots, split-KV "
                  "decode attention, codec process, channels-last codec), S2 Pro shape FP8, audio over "
                  "HTTP, one H200, 2026-12-04 "
                  "(benchmarks/inference_h200/2026-12-04/run15-served-curve-final-defaults)")


def _served(scale: float, source: str, max_concurrency: int = 128) -> CapacityCurve:
    """Our served H200 curve, throughput scaled by ``scale`` (1.0: the measurement itself), up to the
    concurrency the class admits (an estimate for a class of 64 slots stops at c=64). The H200's
    NVML busy is kept on the measurement only: another GPU's busy is not measured here."""
    measured = scale == 1.0
    return CapacityCurve(points=tuple(CapacityPoint(concurrency=c, frames_per_s=round(f * scale, 1),
                                                    ttfa_s=t, gpu_busy=b if measured else None)
                                      for c, f, t, b in _SERVED_H200 if c <= max_concurrency),
                         source=source, slo_concurrency=_SERVED_SLO_CONCURRENCY if measured else None)


#: The source write-up's RTX 5090 / H200 throughput ratio at c=64 (5,869 / 8,006): borrowed, and
#: used only to estimate an RTX 5090 curve from our H200 measurement (no RTX 5090 here).
_WRITEUP_5090_PER_H200 = 5869 / 8006

#: RTX PRO 6000 Blackwell / RTX 5090 memory bandwidth: 1.0. Both are 1,792 GB/s by NVIDIA's spec
#: sheets (512-bit GDDR7 at 28 Gbps), so a bandwidth-scaled estimate of the RTX PRO 6000 is the RTX
#: 5090's. (An earlier ratio 6,300 / 5,869 had no source.)
_RTX6000PRO_PER_5090_BANDWIDTH = 1792 / 1792

#: Provenance of the RTX classes' load time and cost (no RTX GPU here).
_RTX_LOAD_ASSUMED = ("assumed: not measured (no {gpu} here), a placeholder with no recorded origin; "
                     "measure pod start to ready on the card and replace it")
_RTX_COST_ASSUMED = ("assumed: {cost} x an H200's GPU-hour, from no price list; informational for site "
                     "operators: no ttsfleet code reads relative_cost (the policy and the simulator "
                     "count GPU-hours)")

#: Capacity curves by name and class, selectable with ``ttsfleet simulate --measured CLASS=NAME``
#: (:meth:`GpuCatalog.with_named_curve`). ``served``: ours, the built-in default; ``writeup``: the
#: source write-up's figures (borrowed, kept as a named alternative, out of the defaults).
NAMED_CURVES: dict[str, dict[str, CapacityCurve]] = {
    "served": {
        "h200": _served(1.0, _SERVED_SOURCE),
        "rtx5090": _served(_WRITEUP_5090_PER_H200, "estimate: our served H200 curve x the write-up's "
                                                   "RTX 5090/H200 ratio (no RTX 5090 measured here)",
                           max_concurrency=64),
    },
    "writeup": {
        "h200": _curve(8006, 8006 / 52, 0.073, 0.110, "borrowed: source write-up, H200 bsgemm FP8"),
        "rtx5090": _curve(5869, 5869 / 45, 0.080, 0.135, "borrowed: source write-up, RTX 5090 mxfp8"),
    },
}


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
        kernel_backend="triton",
        # prefill rows through cuBLAS's block-scaled FP8 kernel, same 1x128 / 128x128 scales:
        # 3.0x / 3.8x faster prefill of 4 / 16 x 512 tokens, greedy frames equal to the Triton prefill
        # and to bf16 (H200, 2026-12-02, benchmarks/inference_h200/2026-12-02-ab/)
        prefill_gemm="cublas_blockwise",
        # ... and decode batches of 128 rows too: the S2 Pro step at batch 128 15.51 -> 12.41 ms
        # (0.80x) with every GEMM of >= 128 rows in cuBLAS, while at 32 / 64 rows cuBLAS made it
        # 1.17x / 1.11x slower (CUDA-graph replay, side by side, H200, 2026-12-03,
        # benchmarks/inference_h200/2026-12-03b/run3-levers-gemmproto-benchgate/decode_levers.txt)
        # 2026-12-07f (H200, decode_levers, cublas@33 beside the default, batches 40-128): ours is faster
        # up to 64 rows (cuBLAS 1.03-1.13x the step) and 1.28-1.38x slower from 72 to 120 (13.3-15.2 ms
        # against cuBLAS's 9.8-11.5): decode batches of 65 rows and more go to cuBLAS
        prefill_gemm_min_rows=65,
        # the codec in a child process under MPS: engine bench c=64 3,399 vs 2,790 frames/s with the
        # codec thread (side by side, H200, 2026-12-03); served c=64 3,362 vs 2,480 frames/s, NVML
        # 98.6 vs 81.3 % busy, with the server starting the daemon itself (side by side, 2026-12-04,
        # benchmarks/inference_h200/2026-12-04/). Without MPS the same child lost 12 %.
        # 128 slots: c=128 served 3,848 frames/s against 3,326 at c=64 on the same server (first
        # audio p50 118 vs 99 ms, NVML 96.1 vs 98.1 % busy), where 64 slots queued half of c=128's
        # streams (3,260 frames/s, first audio p50 2,218 ms) (H200, 2026-12-04, run5 and run1 of
        # benchmarks/inference_h200/2026-12-04/).
        # channels-last codec convs: served c=64 3,574 vs 3,372 frames/s, c=128 4,110 vs 3,882 (+6 %),
        # side by side on one H200 (2026-12-04, benchmarks/inference_h200/2026-12-04/run8-*); pushes
        # 1.14-1.17x faster, audio as far from float32 as NCL's (20.5 vs 20.6 dB SNR); its codec graphs
        # took ~50 s longer to capture with cuDNN timing 10 candidates per conv (3 since run13)
        serving=ServingDefaults(max_running_requests=128, codec_process=True, codec_layout="channels-last"),
        capacity=NAMED_CURVES["served"]["h200"],
        # start to ready with these defaults: 96 s on a fresh machine (cold Triton cache), the codec
        # process's 44 channels-last graphs 67.7 s of it with cuDNN timing 3 candidates per conv
        # (2026-12-04 run15; 159-179 s with PyTorch's 10, run10 / run11); random weights from local
        # disk: image pull and a real checkpoint's read are not in it
        model_load_s=96,
        relative_cost=1.0,
        node_label="h200",
        sources={
            "memory_gb": "spec: NVIDIA H200 SXM data sheet, 141 GB HBM3e",
            "model_load_s": "measured: pod start to ready on a fresh H200 with these defaults (cold "
                            "Triton cache, random weights from local disk: no image pull, no checkpoint "
                            "read), 2026-12-04 (benchmarks/inference_h200/2026-12-04/"
                            "run15-served-curve-final-defaults)",
            "relative_cost": "assumed: 1.0 by definition (relative_cost is per GPU-hour relative to "
                             "an H200), not a price",
            "prefill_gemm_min_rows": "measured: the decode step with cuBLAS from 33 rows beside the "
                                     "default, batches 40-128, side by side on an H200, 2026-12-07f "
                                     "(benchmarks/inference_h200/2026-12-07f/cublas-rows-h200/levers/"
                                     "decode_levers.txt): cuBLAS 1.03-1.13x the step up to 64 rows, "
                                     "0.72-0.78x from 72 to 120, so 65 rows and up go to cuBLAS",
        },
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
        capacity=NAMED_CURVES["served"]["rtx5090"],
        model_load_s=75,
        relative_cost=0.25,
        node_label="rtx5090",
        sources={
            "memory_gb": "spec: NVIDIA GeForce RTX 5090 spec sheet, 32 GB GDDR7",
            "model_load_s": _RTX_LOAD_ASSUMED.format(gpu="RTX 5090"),
            "relative_cost": _RTX_COST_ASSUMED.format(cost=0.25),
        },
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
        capacity=_served(_WRITEUP_5090_PER_H200 * _RTX6000PRO_PER_5090_BANDWIDTH,
                         "estimate: the RTX 5090 estimate (our served H200 curve x the write-up's RTX "
                         "5090/H200 ratio) x the memory bandwidth ratio, 1.0: both cards 1,792 GB/s "
                         "by NVIDIA's spec sheets (no RTX PRO 6000 measured here)", max_concurrency=64),
        model_load_s=80,
        relative_cost=0.45,
        node_label="rtx6000pro",
        sources={
            "memory_gb": "spec: NVIDIA RTX PRO 6000 Blackwell data sheet, 96 GB GDDR7",
            "model_load_s": _RTX_LOAD_ASSUMED.format(gpu="RTX PRO 6000"),
            "relative_cost": _RTX_COST_ASSUMED.format(cost=0.45),
        },
    )
    return {c.name: c for c in (h200, rtx5090, rtx6000pro)}


def _runs(cls: GpuClass) -> tuple[str, str, str, int]:
    """What a device of ``cls``'s arch runs: classes of one arch must agree on all of it."""
    return (cls.quantization, cls.kernel_backend, cls.prefill_gemm, cls.prefill_gemm_min_rows)


class UnknownGpuClass(ValueError):
    """Raised for a GPU class name that is not in the catalog."""


_LAYOUT_FIELDS = ("activation_block", "weight_block", "scale_format")


def _sources_after(sources: Mapping[str, str], change: Mapping[str, Any]) -> Any:
    """A class's ``sources`` once ``change`` replaces some of its fields: the lines of the fields it
    replaces go (their figures are no longer the ones sourced), ``change``'s own ``sources`` add
    to the rest (anything but a mapping is passed on for validation to reject)."""
    new = change.get("sources", {})
    if not isinstance(new, Mapping):
        return new
    return {**{k: v for k, v in sources.items() if k not in change}, **new}


class GpuCatalog(BaseModel):
    """The set of GPU classes a fleet may use, overridable by config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: dict[str, GpuClass]

    @model_validator(mode="after")
    def _consistent(self) -> GpuCatalog:
        for key, cls in self.classes.items():
            if key != cls.name:
                raise ValueError(f"catalog key {key!r} does not match class name {cls.name!r}")
        labels: dict[str, str] = {}
        for cls in self.classes.values():
            if cls.node_label in labels:
                raise ValueError(f"classes {labels[cls.node_label]!r} and {cls.name!r} share node "
                                 f"label {cls.node_label!r}")
            labels[cls.node_label] = cls.name
        # A device only reports its compute capability: classes of one arch must agree on what it
        # runs, or kernel dispatch and ``auto`` quantization would depend on which class was meant.
        by_arch: dict[str, GpuClass] = {}
        for cls in sorted(self.classes.values(), key=lambda c: c.name):
            first = by_arch.setdefault(cls.arch, cls)
            if _runs(first) != _runs(cls):
                raise ValueError(
                    f"classes {first.name!r} and {cls.name!r} share arch {cls.arch} but differ in "
                    f"quantization/kernel_backend/prefill_gemm ({'/'.join(map(str, _runs(first)))} vs "
                    f"{'/'.join(map(str, _runs(cls)))})")
        return self

    @classmethod
    def default(cls) -> GpuCatalog:
        return cls(classes=default_classes())

    @classmethod
    def from_file(cls, path: str | Path) -> GpuCatalog:
        """Load overrides (JSON or YAML: ``{classes: {name: {...}}}``) merged over the defaults.

        A new class is one entry with every field that has no default; an entry for a built-in
        class changes only the fields it names, and a figure it changes drops the built-in's
        ``sources`` line for it (the file's own ``sources`` add to the rest). Raises ``ValueError``
        for a malformed file.
        """
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not YAML/JSON: {one_line(exc)}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("classes"), dict):
            raise ValueError(f"{path}: expected a mapping with a 'classes' mapping")
        merged = {k: v.model_dump() for k, v in default_classes().items()}
        for name, override in raw["classes"].items():
            if not isinstance(override, dict):
                raise ValueError(f"{path}: class {name!r} must be a mapping")
            base = merged.get(name, {"name": name})
            if "quantization" in override:  # a new scheme brings its own block layout
                for key in _LAYOUT_FIELDS:
                    base.pop(key, None)
            base["sources"] = _sources_after(base.get("sources") or {}, override)
            base.update({k: v for k, v in override.items() if k != "sources"})
            merged[name] = base
        classes = {}
        for key, value in merged.items():
            try:
                classes[key] = GpuClass.model_validate(value)
            except ValidationError as exc:
                raise ValueError(f"class {key!r}: {validation_text(exc, root='catalog')}") from None
        return cls(classes=classes)

    @classmethod
    def load(cls, path: str | Path | None) -> GpuCatalog:
        """The run's catalog: the built-in one, or ``path`` merged over it; bad input is a
        :class:`UserError` with one line (CLI exit 2)."""
        if not path:
            return cls.default()
        try:
            return cls.from_file(path)
        except ValidationError as exc:
            raise UserError(f"catalog {path}: {validation_text(exc, root='catalog')}") from None
        except (OSError, ValueError) as exc:
            raise UserError(f"catalog {path}: {one_line(exc)}") from None

    def to_yaml(self) -> str:
        """The whole catalog as a catalog file (every field of every class): what the operator
        hands its server pods, read back by :meth:`load` into an equal catalog."""
        doc = {"classes": {n: self.classes[n].model_dump(mode="json") for n in self.names()}}
        return yaml.safe_dump(doc, sort_keys=False, width=100)

    def get(self, name: str) -> GpuClass:
        try:
            return self.classes[name]
        except KeyError:
            known = ", ".join(sorted(self.classes))
            raise UnknownGpuClass(f"unknown GPU class {name!r} (known: {known})") from None

    def names(self) -> list[str]:
        return sorted(self.classes)

    # ------------------------------------------------------------------ kernel dispatch
    def classes_for_capability(self, major: int, minor: int) -> tuple[GpuClass, ...]:
        """The classes whose ``arch`` is this compute capability (sorted by name)."""
        return tuple(c for c in sorted(self.classes.values(), key=lambda c: c.name)
                     if c.compute_capability == (major, minor))

    def dispatch_for_capability(self, major: int, minor: int) -> DeviceDispatch:
        """Scheme and kernel backend for a device reporting compute capability ``major.minor``.

        A device no class describes runs bf16 on the reference kernels: add a catalog entry with
        its ``arch`` to give it FP8.
        """
        found = self.classes_for_capability(major, minor)
        if not found:
            return DeviceDispatch((major, minor), (), BF16, "reference")
        first = found[0]  # the validator made every class of one arch agree
        return DeviceDispatch((major, minor), tuple(c.name for c in found), first.quantization,
                              first.kernel_backend, first.prefill_gemm, first.prefill_gemm_min_rows)

    def dispatch_for_device(self, capability: tuple[int, int] | None) -> DeviceDispatch:
        """:meth:`dispatch_for_capability`, with ``None`` (CPU) running bf16 on the reference."""
        if capability is None:
            return DeviceDispatch(None, (), BF16, "reference")
        return self.dispatch_for_capability(*capability)

    def scheme_for_capability(self, major: int, minor: int) -> QuantScheme:
        """What ``auto`` quantization means on a device of this compute capability."""
        return self.dispatch_for_capability(major, minor).quantization

    # ------------------------------------------------------------------ placement
    def class_for_node_label(self, value: str | None) -> GpuClass | None:
        """The class whose ``node_label`` is ``value`` (a node's :data:`NODE_LABEL_KEY`)."""
        for cls in self.classes.values():
            if value and cls.node_label == value:
                return cls
        return None

    def class_of_node(self, labels: Mapping[str, str] | None) -> GpuClass | None:
        """The class of a node (or pod) from its labels; None when it carries no known class."""
        return self.class_for_node_label((labels or {}).get(NODE_LABEL_KEY))

    # ------------------------------------------------------------------ capacity
    def relative_throughput(self, name: str) -> float:
        """Peak frames/s of ``name`` over the fastest class's (1.0 for the fastest)."""
        peak = max(c.capacity.peak_frames_per_s for c in self.classes.values())
        return self.get(name).capacity.peak_frames_per_s / peak

    # ------------------------------------------------------------------ descriptions
    def names_text(self, sep: str = " | ") -> str:
        """``h200 | rtx5090 | rtx6000pro``: the class list for help texts and schemas."""
        return sep.join(self.names())

    def quantization_text(self) -> str:
        """What ``auto`` means per class, for help texts and schema descriptions."""
        per = ", ".join(f"{c.name} ({c.arch}): {c.quantization}" for c in
                        sorted(self.classes.values(), key=lambda c: c.name))
        return f"auto = the GPU class's scheme: {per}; other devices: bf16"

    def markdown_table(self) -> str:
        """A Markdown table of the classes (README / docs generation)."""
        rows = ["| class | GPU | arch | memory | quantization | kernels | node label |",
                "|---|---|---|---|---|---|---|"]
        for c in sorted(self.classes.values(), key=lambda c: c.name):
            rows.append(f"| {c.name} | {c.display_name} | {c.arch} | {c.memory_gb:g} GB | "
                        f"{c.quantization} | {c.kernel_backend} | "
                        f"`{NODE_LABEL_KEY}={c.node_label}` |")
        return "\n".join(rows)

    def with_class(self, name: str, **fields: Any) -> GpuCatalog:
        """A copy whose ``name`` class has ``fields`` replaced (a side-by-side run's one change)."""
        classes = dict(self.classes)
        cls = self.get(name)
        fields = {**fields, "sources": _sources_after(cls.sources, fields)}
        classes[name] = cls.model_copy(update=fields)
        return GpuCatalog(classes=classes)

    # ------------------------------------------------------------------ measured curves
    def with_measured(self, name: str, curve: CapacityCurve) -> GpuCatalog:
        """A copy whose ``name`` class carries a measured capacity curve (e.g. from a benchmark)."""
        return self.with_class(name, capacity=curve)

    def with_measured_file(self, name: str, path: str | Path) -> GpuCatalog:
        """Load a benchmark JSON (``{"points": [{concurrency, frames_per_s, ttfa_s[, gpu_busy]},
        ...]}``, as ``ttsfleet bench`` writes it); other keys of a point are the benchmark's own."""
        data = json.loads(Path(path).read_text())
        keys = CapacityPoint.model_fields
        cap = data.get("capacity") or {}
        curve = CapacityCurve(points=tuple(CapacityPoint(**{k: v for k, v in p.items() if k in keys})
                                           for p in data["points"]),
                              source=data.get("source", str(path)), slo_concurrency=cap.get("concurrency"))
        return self.with_measured(name, curve)

    def with_named_curve(self, name: str, curve_name: str) -> GpuCatalog:
        """A copy whose ``name`` class carries the curve :data:`NAMED_CURVES` names."""
        try:
            curve = NAMED_CURVES[curve_name][name]
        except KeyError:
            have = ", ".join(f"{n}={c}" for n, m in NAMED_CURVES.items() for c in m)
            raise KeyError(f"no {curve_name!r} curve for {name!r} (named curves: {have})") from None
        return self.with_measured(name, curve)
