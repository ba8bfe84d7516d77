"""The ``codec`` batch stage: every kept segment encoded into the model's codebook tokens.

The next DualAR training run reads ``[num_codebooks, frames]`` codes per segment, made by the
site's own codec (``codec: /models/codec.pth`` in the cleaning config; the random-weight presets
``tiny`` and ``s2-pro`` of :func:`ttsfleet.inference.codec.load_codec` in tests and benchmarks).
The codec's own ``encode`` takes one clip and resamples on the CPU with scipy; here a group's
clips are resampled to the codec's rate on the device (:class:`PolyphaseResampler`, the same
filter as ``scipy.signal.resample_poly``), zero-padded to one width and encoded in batches of
at most ``codecBatchSeconds`` of padded audio. The codec is causal end to end, so the padding
after a clip changes none of its frames: a clip's codes do not depend on its batch neighbours
(tests/fill_jobs/test_tokenize.py checks it against ``Codec.encode`` clip by clip).

Precision (``codecPrecision``): ``float32`` (TF32 off, the default) or, for speed, ``tf32`` / ``bf16``
for the encoder's trunk (the encoder, the quantizer's downsampling and its window transformer);
the resampler and the residual codebooks (projections and nearest-code search) stay float32
(:func:`encode_split`). Codes are argmins over distances, so a lower precision flips near-ties:
:func:`code_agreement` / :func:`precision_agreement` measure the share of codes that stay equal to
float32's (``benchmarks/fill_jobs/bench_codec_precision.py``).

Speed (``codecLayout``, issue #25): ``ncl`` (default) runs the encoder's convs as the reference's
1-D convs; ``channels-last`` as 2-D convs of height 1 on NHWC tensors, the decoder's faster cuDNN
path (:meth:`~ttsfleet.inference.codec.Codec.use_encoder_channels_last`). With a fast precision on
CUDA the Snakes run fused (one Triton pass, the preceding conv's bias added in it); off the bit-exact
default path (a fast precision or channels-last, on CUDA) cuDNN's autotuner picks each conv's
kernel, with batch shapes bucketed so it times a bounded set of shapes (:class:`BatchEncoder`). A
bf16 channels-last encode on CUDA also runs its narrow residual units as the decoder's fused Triton
convs (``units``; the Snake and the residual add in the conv epilogues), as ``TTSFLEET_CODEC_UNITS``
says (default ``fused``, ``cudnn`` keeps cuDNN's convs).

Output per segment: ``codes/<2 hex>/<id>[.pNN].npy`` (int16, ``[num_codebooks, frames]``), named
in the row's output entry as ``codes`` with ``code_frames``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import gcd
from typing import TYPE_CHECKING

import numpy as np

from ttsfleet.errors import UserError

if TYPE_CHECKING:
    import torch
    from ttsfleet.fill_jobs.settings import CleaningConfig
    from ttsfleet.inference.codec import Codec

#: ``codecPrecision`` values (:class:`~ttsfleet.fill_jobs.settings.CleaningConfig`).
PRECISIONS = ("float32", "tf32", "bf16")
#: ``codecLayout`` values: the encoder's conv stack as 1-D convs on ``[B, C, T]`` (the reference's)
#: or as 2-D convs of height 1 on channels-last ``[B, C, 1, T]`` tensors.
LAYOUTS = ("ncl", "channels-last")


class PolyphaseResampler:
    """``scipy.signal.resample_poly(x, up, down)`` (Kaiser-windowed sinc, zero-extended ends) as
    one strided ``conv1d`` with a filter per output phase, on any torch device, batched."""

    def __init__(self, rate_in: int, rate_out: int, device: torch.device | str = "cpu") -> None:
        import torch
        from scipy.signal import firwin

        g = gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        up, down = self.up, self.down
        max_rate = max(up, down)
        half_len = 10 * max_rate
        h = firwin(2 * half_len + 1, 1.0 / max_rate, window=("kaiser", 5.0)) * up
        pre_pad = down - half_len % down
        hh = np.concatenate([np.zeros(pre_pad), h])
        remove = (half_len + pre_pad) // down
        taps = [(r + remove) * down for r in range(up)]  # out[q*up + r] reads hh[t_r - s*up]
        lo = min(-((len(hh) - 1 - t) // up) for t in taps)
        hi = max(t // up for t in taps)
        weight = np.zeros((up, 1, hi - lo + 1))
        for r, t in enumerate(taps):
            for k, s in enumerate(range(lo, hi + 1)):
                if 0 <= t - s * up < len(hh):
                    weight[r, 0, k] = hh[t - s * up]
        self.left = -lo  # input samples needed before x[0] (zeros)
        self.weight = torch.from_numpy(weight.astype(np.float32)).to(device)

    def out_length(self, n_in: int) -> int:
        return -(-n_in * self.up // self.down)

    def __call__(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """``x``: ``[B, N]`` zero-padded clips of ``lengths`` → ``[B, max out]``, zero past each end."""
        import torch
        import torch.nn.functional as F

        n_out = [self.out_length(n) for n in lengths]
        q = -(-max(n_out) // self.up)
        k = self.weight.shape[-1]
        need = (q - 1) * self.down + k
        xp = F.pad(x, (self.left, 0)) if self.left >= 0 else x[:, -self.left:]
        xp = F.pad(xp, (0, need - xp.shape[-1])) if xp.shape[-1] < need else xp[:, :need]
        y = F.conv1d(xp[:, None, :], self.weight, stride=self.down)  # [B, up, q]
        y = y.transpose(1, 2).reshape(x.shape[0], -1)[:, : max(n_out)]
        ends = torch.tensor(n_out, device=y.device)[:, None]
        return y * (torch.arange(y.shape[1], device=y.device)[None, :] < ends)


def pack(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of clips grouped into batches whose padded size (count x longest) fits ``budget``;
    longest first, deterministic for the same lengths."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@contextlib.contextmanager
def _tf32(device: torch.device, on: bool) -> Iterator[None]:
    """TF32 in cuDNN and CUDA matmuls for the block (CUDA only), the previous flags after it."""
    import torch

    if device.type != "cuda":
        yield
        return
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


@contextlib.contextmanager
def _autotuner(device: torch.device, on: bool) -> Iterator[None]:
    """cuDNN's autotuner (:func:`~ttsfleet.inference.codec_batch.use_conv_autotuner`, as the serving
    codec's) for the block where ``on`` (CUDA only), the previous settings after it."""
    import torch

    if device.type != "cuda" or not on:
        yield
        return
    from ttsfleet.inference.codec_batch import use_conv_autotuner

    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark, cudnn.benchmark_limit
    use_conv_autotuner()
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.benchmark_limit = saved


def bucket_frames(frames: int) -> int:
    """``frames`` rounded up to ``m x 2^k`` with ``m`` in 8..15: at most 1/8 of padding, and a few
    shapes per octave (a job's batch lengths vary continuously; cuDNN's autotuner times each new one)."""
    if frames <= 8:
        return frames
    step = 1 << (frames.bit_length() - 4)
    return -(-frames // step) * step


def pow2_parts(batch: list[int]) -> list[list[int]]:
    """``batch`` split into runs of power-of-two sizes, largest first (13 -> 8, 4, 1): with
    :func:`bucket_frames`, a bounded set of batch shapes."""
    parts, i, n = [], 0, len(batch)
    while i < n:
        size = 1 << ((n - i).bit_length() - 1)
        parts.append(batch[i: i + size])
        i += size
    return parts


def encode_split(codec: Codec, x: torch.Tensor, dtype: torch.dtype, tf32: bool = False) -> torch.Tensor:
    """``codec.quantizer.encode(codec.encoder(x))`` with its trunk (encoder, downsampling, window
    transformer) in ``dtype`` (and TF32 where ``tf32``, on CUDA) and its residual codebooks in
    float32 without TF32: the projections into each codebook and the distances of the
    nearest-code search (``VQ.quantize`` computes in its input's dtype) are float32 whatever the
    trunk ran in. The trunk's modules must hold ``dtype`` weights, the codebooks' float32. In
    float32 without TF32 the codes equal the codec's own (tests/fill_jobs/test_tokenize.py);
    the steps mirror ``Quantizer.encode``."""
    return search_codes(codec, encode_trunk(codec, x, dtype, tf32))


def encode_trunk(codec: Codec, x: torch.Tensor, dtype: torch.dtype, tf32: bool = False) -> torch.Tensor:
    """:func:`encode_split`'s first half: the encoder, the quantizer's downsampling and its window
    transformer in ``dtype`` (TF32 where ``tf32``, on CUDA); the latent the codebooks search, float32."""
    q = codec.quantizer
    with _tf32(x.device, tf32):
        z = codec.encoder(x.to(dtype))
        for conv, nx in q.downsample:
            z = nx(conv(z))
        z = q.pre_module(z)
    return z.float()


def search_codes(codec: Codec, z: torch.Tensor) -> torch.Tensor:
    """:func:`encode_split`'s second half: every codebook's nearest code for the float32 latent ``z``,
    TF32 off (codes are argmins over distances), the semantic codebook first."""
    import torch

    q = codec.quantizer
    with _tf32(z.device, False):
        sem_z, sem_codes = q.semantic_quantizer.quantize(z)
        _, codes = q.quantizer.quantize(z - sem_z)
    return torch.cat([sem_codes, codes], dim=1)


def check_layout(layout: str) -> None:
    """A :class:`UserError` naming the choices for a layout that is not one of :data:`LAYOUTS`
    (checked before the codec loads, so a typo costs no load, and again on each reconfigure)."""
    if layout not in LAYOUTS:
        raise UserError(f"codec layout {layout!r} is not one of {', '.join(LAYOUTS)}")


def default_autotune(device: torch.device, precision: str, layout: str) -> bool:
    """Whether an encode runs cuDNN's autotuner by default: on CUDA, off the bit-exact default path
    (a fast precision, or channels-last), see :class:`BatchEncoder`."""
    return device.type == "cuda" and (precision != "float32" or layout != "ncl")


def default_units(device: torch.device, precision: str, layout: str, fused_snakes: bool) -> str:
    """``fused`` where the decoder's measured rule carries over: bf16 on CUDA, channels-last, the
    Snakes fused, and ``TTSFLEET_CODEC_UNITS`` at ``fused`` (its default). Why only there: the fused
    convs address channels-last rows; in float32 (and tf32) their dots are IEEE float32 (no tensor
    cores), where cuDNN's TF32 / float32 convs are the faster path; the decoder's units gained
    1.14-1.40x at widths 96 and 192 on an H100 (2026-12-05b call1), the encoder's 64-256 are as
    narrow, with more rows (its own speed: ``bench_codec_precision.py --snakes fused-units``)."""
    from ttsfleet.inference.codec_batch import CODEC_UNITS_SWITCH

    try:
        switch = CODEC_UNITS_SWITCH.get()
    except ValueError as e:  # a bad variable: the job's one-line error, not a traceback
        raise UserError(str(e)) from None
    on = device.type == "cuda" and precision == "bf16" and layout == "channels-last" and fused_snakes
    return "fused" if on and switch == "fused" else "cudnn"


class BatchEncoder:
    """A codec plus its resampler on one device: many clips at ``rate`` → codes per clip.

    ``precision`` (``codecPrecision``): ``float32`` runs the codec's own ``quantizer.encode(
    encoder(x))`` with TF32 off, as before the setting existed; ``tf32`` and ``bf16`` go through
    :func:`encode_split` (``tf32`` on the CPU is float32). ``layout`` (``codecLayout``): the
    encoder's conv stack NCL or channels-last (:meth:`~ttsfleet.inference.codec.Codec.
    use_encoder_channels_last`). ``fused`` (None: on for a fast precision on CUDA): every Snake
    through :func:`ttsfleet.kernels.snake.snake` (the Triton kernel where the kernel dispatch runs
    Triton), the preceding conv's bias added in the same pass; off by default in float32, whose
    codes stay those of the unfused expression. ``autotune`` (None: on CUDA, on whenever the job is
    off the bit-exact default, i.e. a fast precision or channels-last): cuDNN's autotuner for the
    encode; the serving decoder found cuDNN's heuristics picking channels-last kernels 20x slower
    than the autotuner's (``CUDNN_CANDIDATES``). It times every new input shape, and a job's batches
    would each have a new one, so with it the batch shapes are bucketed (``bucket_shapes``): each
    batch padded to :func:`bucket_frames` and run in power-of-two parts (:func:`pow2_parts`). The
    codec is causal and clips are independent in a batch, so neither changes a clip's codes (beyond
    a conv algorithm's rounding). ``units`` (``fused`` / ``cudnn``, ``CODEC_UNITS``; None:
    :func:`default_units`): the
    encoder's residual units through the fused conv kernels
    (:meth:`~ttsfleet.inference.codec.Codec.use_encoder_fused_units`) or cuDNN's convs. ``graphs``
    (None: off; 0.6-1.9 % on an H100, 2026-12-05d): each bucketed batch shape's encode replayed from a
    CUDA graph (:class:`~ttsfleet.fill_jobs.encode_graphs.ShapeGraphs`), taken on CUDA with bucketed
    shapes only (unbucketed, every batch would be a new capture)."""

    def __init__(self, codec_name: str, rate: int, device: str, batch_seconds: float,
                 precision: str = "float32", layout: str = "ncl", fused: bool | None = None,
                 autotune: bool | None = None, units: str | None = None, graphs: bool | None = None) -> None:
        import torch
        from ttsfleet.inference.codec import load_codec

        if precision not in PRECISIONS:
            raise UserError(f"codec precision {precision!r} is not one of {', '.join(PRECISIONS)}")
        check_layout(layout)
        self.device = torch.device(device)
        if self.device.type == "cuda":  # full fp32 (no TF32): codes are argmins over distances
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        self.precision = precision
        self.codec = load_codec(codec_name, device=self.device)
        self.trunk_dtype = torch.float32
        if precision == "bf16":  # the trunk as load_codec(dtype=bf16) has it; the codebooks float32
            self.trunk_dtype = torch.bfloat16
            q = self.codec.quantizer
            for m in (self.codec.encoder, q.downsample, q.pre_module):
                m.to(torch.bfloat16)
        self.split = precision == "bf16" or (precision == "tf32" and self.device.type == "cuda")
        self.rate = rate
        self.resampler = PolyphaseResampler(rate, self.codec.sample_rate, self.device)
        self.budget = int(batch_seconds * rate)
        self.gpu_seconds = 0.0  # device time of the encode batches (CUDA events), GPU only
        self.configure(layout, fused, autotune, units, graphs)

    def configure(self, layout: str = "ncl", fused: bool | None = None, autotune: bool | None = None,
                  units: str | None = None, graphs: bool | None = None) -> None:
        """Set the encoder's layout, Snake kernel, autotuner, residual units and graphs (the defaults
        as in the class doc): the benchmark's A/B on one loaded codec. Graphs captured before are
        dropped (they replay the old configuration's kernels)."""
        check_layout(layout)
        cuda, fast = self.device.type == "cuda", self.precision != "float32"
        self.layout = layout
        self.codec.use_encoder_channels_last(layout == "channels-last")  # after the dtype cast
        self.fused = (fast and cuda) if fused is None else fused
        self.codec.use_fused_kernels(self.fused)
        self.autotune = autotune if autotune is not None else default_autotune(self.device, self.precision,
                                                                               layout)
        self.bucket_shapes = self.autotune
        from ttsfleet.inference.codec_batch import CODEC_UNITS

        if units is None:
            units = default_units(self.device, self.precision, layout, self.fused)
        if units not in CODEC_UNITS:
            raise UserError(f"codec units {units!r} is not one of {', '.join(CODEC_UNITS)}")
        self.units = units
        self.codec.use_encoder_fused_units(self.units == "fused")  # after the dtype cast: caches weights
        self._graphs = None
        if graphs and cuda and self.bucket_shapes:
            from ttsfleet.fill_jobs.encode_graphs import ShapeGraphs

            self._graphs = ShapeGraphs(self._codes)

    @property
    def graphs_backend(self) -> str:
        """``graphs`` where batches replay CUDA graphs (asked for, on CUDA, bucketed), else ``eager``."""
        return "eager" if self._graphs is None else "graphs"

    @property
    def snake_backend(self) -> str:
        """Which Snake runs: ``expression`` (unfused, the reference's five ops), else the fused
        function's backend here (``triton``, or ``reference``: one torch expression)."""
        if not self.fused:
            return "expression"
        from ttsfleet.kernels import dispatch

        return dispatch.plan(self.device).backend

    @property
    def units_backend(self) -> str:
        """Which convs the residual units run: ``fused`` (the Triton kernels: ``units`` fused and the
        kernel dispatch running Triton here), else ``cudnn`` (torch's convs)."""
        from ttsfleet.kernels import dispatch

        triton = dispatch.plan(self.device).backend == "triton"
        return "fused" if self.units == "fused" and triton else "cudnn"

    def _frames(self, n: int) -> int:
        """Codec frames of a clip of ``n`` samples at ``rate``."""
        return -(-self.resampler.out_length(n) // self.codec.frame_length)

    def _packed_length(self, n: int) -> int:
        """A clip's share of the batch budget: its length, or its bucketed length (``bucket_shapes``)."""
        if not self.bucket_shapes:
            return n
        samples = bucket_frames(self._frames(n)) * self.codec.frame_length
        return -(-samples * self.resampler.down // self.resampler.up)

    def encode(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """int16 ``[num_codebooks, ceil(len_at_codec_rate / frame_length)]`` per clip."""
        out: list[np.ndarray | None] = [None] * len(clips)
        for batch in pack([self._packed_length(len(c)) for c in clips], self.budget):
            for part in pow2_parts(batch) if self.bucket_shapes else [batch]:
                codes = self._encode_batch([clips[i] for i in part])
                for i, c in zip(part, codes, strict=True):
                    out[i] = c
        return out  # type: ignore[return-value]

    def _codes(self, x: torch.Tensor) -> torch.Tensor:
        """The codes of a resampled, padded batch ``[B, 1, T]``: the codec's own encode in float32,
        else :func:`encode_split` (what a graph captures)."""
        if self.split:
            return encode_split(self.codec, x, self.trunk_dtype, self.precision == "tf32")
        return self.codec.quantizer.encode(self.codec.encoder(x))

    def _encode_batch(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        import torch
        import torch.nn.functional as F

        lengths = [len(c) for c in clips]
        host = torch.zeros(len(clips), max(lengths), dtype=torch.float32)
        for j, c in enumerate(clips):
            host[j, : len(c)] = torch.from_numpy(c)
        frame = self.codec.frame_length
        width = max(self._frames(n) for n in lengths)
        if self.bucket_shapes:
            width = bucket_frames(width)
        timed = self.device.type == "cuda"
        if timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        with torch.inference_mode(), _autotuner(self.device, self.autotune):
            x = self.resampler(host.to(self.device, non_blocking=True), lengths)
            x = F.pad(x, (0, width * frame - x.shape[-1]))[:, None, :]
            codes = (self._graphs or self._codes)(x).to(torch.int16)  # a copy: a graph's output is reused
        if timed:
            end.record()
        host_codes = codes.cpu().numpy()
        if timed:
            self.gpu_seconds += start.elapsed_time(end) / 1000
        frames = [self._frames(n) for n in lengths]
        return [np.ascontiguousarray(host_codes[j, :, :t]) for j, t in enumerate(frames)]


@dataclass(frozen=True)
class CodeAgreement:
    """How many codes two encodings of the same clips share: ``per_codebook[k]`` is the share of
    frames whose codebook-``k`` code is identical (``k`` = 0: the semantic codebook), ``overall``
    the share of all codes, ``frames`` the share of frames identical in every codebook."""

    per_codebook: tuple[float, ...]
    overall: float
    frames: float
    codes: int  # code entries compared

    def as_dict(self) -> dict:
        return {"per_codebook": list(self.per_codebook), "overall": self.overall,
                "frames": self.frames, "codes": self.codes}


def code_agreement(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> CodeAgreement:
    """Agreement of two lists of ``[num_codebooks, frames]`` codes of the same clips (same shapes)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same non-zero number of clips, got {len(a)} and {len(b)}")
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.ndim != 2 or x.shape != y.shape:
            raise ValueError(f"clip {i}: codes of shapes {x.shape} and {y.shape} cannot be compared")
    same = np.concatenate([np.asarray(x) == np.asarray(y) for x, y in zip(a, b, strict=True)], axis=1)
    if same.shape[1] == 0:
        raise ValueError("no frames to compare")
    return CodeAgreement(per_codebook=tuple(float(v) for v in same.mean(axis=1)),
                         overall=float(same.mean()), frames=float(same.all(axis=0).mean()),
                         codes=int(same.size))


def precision_agreement(clips: list[np.ndarray], rate: int, codec: str = "tiny", device: str = "cpu",
                        precision: str = "bf16", reference: str = "float32",
                        batch_seconds: float = 240.0) -> CodeAgreement:
    """Encode ``clips`` (mono float32 at ``rate``) at ``reference`` and at ``precision`` (the same
    codec loaded twice) and compare the codes (:func:`code_agreement`)."""
    ref = BatchEncoder(codec, rate, device, batch_seconds, reference).encode(clips)
    got = BatchEncoder(codec, rate, device, batch_seconds, precision).encode(clips)
    return code_agreement(ref, got)


class CodecStage:
    """The ``codec`` batch stage (built by the registry as ``CodecStage(config, device)``)."""

    def __init__(self, config: CleaningConfig, device: str | None = None) -> None:
        from ttsfleet.fill_jobs.features import pick_device

        if not config.codec:
            raise UserError("the codec stage needs a codec: set codec: /path/to/codec.pth in "
                            "--config (or a preset: tiny, s2-pro)")
        self.encoder = BatchEncoder(config.codec, config.target_rate,
                                    device or pick_device(config.feature_device),
                                    config.codec_batch_seconds, config.codec_precision,
                                    config.codec_layout)

    @property
    def gpu_seconds(self) -> float:
        return self.encoder.gpu_seconds

    def process(self, results: list) -> None:
        from ttsfleet.fill_jobs.pipeline import audio_name

        todo = [(r, k) for r in results if r.accepted for k in range(len(r.clips))]
        if not todo:
            return
        codes = self.encoder.encode([r.clips[k] for r, k in todo])
        for (r, k), c in zip(todo, codes, strict=True):
            name = audio_name(r.key, k + 1, len(r.clips), ext="npy", folder="codes")
            buf = io.BytesIO()
            np.save(buf, c)
            r.files.append((name, buf.getvalue()))
            r.row["outputs"][k]["codes"] = name
            r.row["outputs"][k]["code_frames"] = int(c.shape[1])
